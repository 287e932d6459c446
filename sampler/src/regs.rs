//! The perf x86-64 register table: indices, masks, ABI values, the 64/32-bit
//! rules for user registers, and the mapping from PEBS GPR order to perf order.
//!
//! The indices follow `arch/x86/include/uapi/asm/perf_regs.h`: bit `n` of a
//! `sample_regs_user` / `sample_regs_intr` mask selects register `n`, and the
//! sampled values appear in ascending bit order.

use serde::{Deserialize, Serialize};

/// A perf x86-64 register index (`PERF_REG_X86_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Reg {
    /// RAX.
    Ax = 0,
    /// RBX.
    Bx = 1,
    /// RCX.
    Cx = 2,
    /// RDX.
    Dx = 3,
    /// RSI.
    Si = 4,
    /// RDI.
    Di = 5,
    /// RBP.
    Bp = 6,
    /// RSP.
    Sp = 7,
    /// RIP.
    Ip = 8,
    /// RFLAGS.
    Flags = 9,
    /// CS selector.
    Cs = 10,
    /// SS selector.
    Ss = 11,
    /// DS selector (refused on x86-64).
    Ds = 12,
    /// ES selector (refused on x86-64).
    Es = 13,
    /// FS selector (refused on x86-64).
    Fs = 14,
    /// GS selector (refused on x86-64).
    Gs = 15,
    /// R8.
    R8 = 16,
    /// R9.
    R9 = 17,
    /// R10.
    R10 = 18,
    /// R11.
    R11 = 19,
    /// R12.
    R12 = 20,
    /// R13.
    R13 = 21,
    /// R14.
    R14 = 22,
    /// R15.
    R15 = 23,
}

/// Number of perf GPR slots (indices 0..=23, including the four refused
/// segment selectors).
pub const NUM_GPR_SLOTS: usize = 24;

/// Every register in index order.
pub const ALL_REGS: [Reg; NUM_GPR_SLOTS] = [
    Reg::Ax,
    Reg::Bx,
    Reg::Cx,
    Reg::Dx,
    Reg::Si,
    Reg::Di,
    Reg::Bp,
    Reg::Sp,
    Reg::Ip,
    Reg::Flags,
    Reg::Cs,
    Reg::Ss,
    Reg::Ds,
    Reg::Es,
    Reg::Fs,
    Reg::Gs,
    Reg::R8,
    Reg::R9,
    Reg::R10,
    Reg::R11,
    Reg::R12,
    Reg::R13,
    Reg::R14,
    Reg::R15,
];

impl Reg {
    /// The register's bit in a sample register mask.
    pub const fn bit(self) -> u64 {
        1 << (self as u8)
    }

    /// The perf index.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The name `perf script` prints for this register.
    pub const fn name(self) -> &'static str {
        match self {
            Reg::Ax => "AX",
            Reg::Bx => "BX",
            Reg::Cx => "CX",
            Reg::Dx => "DX",
            Reg::Si => "SI",
            Reg::Di => "DI",
            Reg::Bp => "BP",
            Reg::Sp => "SP",
            Reg::Ip => "IP",
            Reg::Flags => "FLAGS",
            Reg::Cs => "CS",
            Reg::Ss => "SS",
            Reg::Ds => "DS",
            Reg::Es => "ES",
            Reg::Fs => "FS",
            Reg::Gs => "GS",
            Reg::R8 => "R8",
            Reg::R9 => "R9",
            Reg::R10 => "R10",
            Reg::R11 => "R11",
            Reg::R12 => "R12",
            Reg::R13 => "R13",
            Reg::R14 => "R14",
            Reg::R15 => "R15",
        }
    }

    /// The register with perf index `index`, if there is one.
    pub const fn from_index(index: usize) -> Option<Reg> {
        if index < NUM_GPR_SLOTS {
            Some(ALL_REGS[index])
        } else {
            None
        }
    }
}

/// The DS, ES, FS and GS bits, which Linux refuses on x86-64.
pub const SEGMENT_MASK: u64 = Reg::Ds.bit() | Reg::Es.bit() | Reg::Fs.bit() | Reg::Gs.bit();
/// All 24 GPR slots.
pub const GPR_SLOTS_MASK: u64 = (1 << NUM_GPR_SLOTS) - 1;
/// Every GPR that may be requested on x86-64: `0xff0fff`.
pub const GPR_MASK: u64 = GPR_SLOTS_MASK & !SEGMENT_MASK;
/// R8 to R15, which a compat (32-bit) task reports as 0 (see [`user_regs_value`]).
pub const R8_R15_MASK: u64 = 0xff << 16;
/// XMM0..XMM15: bits 32+2n and 33+2n. Only PEBS can sample them.
pub const XMM_MASK: u64 = 0xffff_ffff << 32;
/// Bits 24..31 name no register.
pub const RESERVED_MASK: u64 = 0xff << 24;
/// Every bit the x86-64 perf layout defines and Linux accepts with PEBS.
pub const VALID_MASK_WITH_XMM: u64 = GPR_MASK | XMM_MASK;

/// The sample ABI of a register set (`PERF_SAMPLE_REGS_ABI_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum Abi {
    /// No registers: the sample carries only the ABI word.
    #[default]
    None = 0,
    /// A compat task: 32-bit code, values in the x86-64 layout.
    Bits32 = 1,
    /// A 64-bit task.
    Bits64 = 2,
}

impl Abi {
    /// The value perf.data stores.
    pub const fn perf_value(self) -> u64 {
        self as u64
    }

    /// Parses a perf ABI word.
    pub const fn from_perf_value(v: u64) -> Option<Abi> {
        match v {
            0 => Some(Abi::None),
            1 => Some(Abi::Bits32),
            2 => Some(Abi::Bits64),
            _ => None,
        }
    }
}

/// The code mode a CS selector refers to, taken from the descriptor's L bit
/// (the sampler cannot read the GDT, so the caller says which it is).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CodeMode {
    /// 64-bit mode (L=1).
    #[default]
    Long64,
    /// Compatibility mode (L=0, D=1): a 32-bit task.
    Compat32,
}

impl CodeMode {
    /// The sample ABI of a user frame in this mode.
    pub const fn abi(self) -> Abi {
        match self {
            CodeMode::Long64 => Abi::Bits64,
            CodeMode::Compat32 => Abi::Bits32,
        }
    }
}

/// A full GPR file indexed by perf register index (24 slots; DS..GS are kept
/// for completeness but never requested on x86-64).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RegFile(pub [u64; NUM_GPR_SLOTS]);

impl RegFile {
    /// The value of `reg`.
    pub const fn get(&self, reg: Reg) -> u64 {
        self.0[reg as usize]
    }

    /// Sets `reg` to `value`.
    pub fn set(&mut self, reg: Reg, value: u64) {
        self.0[reg as usize] = value;
    }

    /// Builder form of [`RegFile::set`].
    #[must_use]
    pub fn with(mut self, reg: Reg, value: u64) -> Self {
        self.set(reg, value);
        self
    }
}

/// The value perf reports for `reg` of a task running in `mode`.
///
/// Our rule for compat tasks (the one from the perf_sample_regs_user design
/// discussion): the mask is always the x86-64 layout, the ABI is ABI_32, and
/// R8 to R15, which 32-bit code cannot see, read 0. Values are never dropped
/// from under the mask.
pub const fn user_regs_value(file: &RegFile, reg: Reg, mode: CodeMode) -> u64 {
    match mode {
        CodeMode::Compat32 if reg.bit() & R8_R15_MASK != 0 => 0,
        _ => file.get(reg),
    }
}

/// Registers in the order of the legacy PEBS record (formats 0..3: flags, ip,
/// ax, bx, cx, dx, si, di, bp, sp, r8..r15).
pub const PEBS_LEGACY_GPR_ORDER: [Reg; 18] = [
    Reg::Flags,
    Reg::Ip,
    Reg::Ax,
    Reg::Bx,
    Reg::Cx,
    Reg::Dx,
    Reg::Si,
    Reg::Di,
    Reg::Bp,
    Reg::Sp,
    Reg::R8,
    Reg::R9,
    Reg::R10,
    Reg::R11,
    Reg::R12,
    Reg::R13,
    Reg::R14,
    Reg::R15,
];

/// Registers in the order of the adaptive PEBS GPR group (format 4+: flags,
/// ip, ax, cx, dx, bx, sp, bp, si, di, r8..r15).
pub const PEBS_ADAPTIVE_GPR_ORDER: [Reg; 18] = [
    Reg::Flags,
    Reg::Ip,
    Reg::Ax,
    Reg::Cx,
    Reg::Dx,
    Reg::Bx,
    Reg::Sp,
    Reg::Bp,
    Reg::Si,
    Reg::Di,
    Reg::R8,
    Reg::R9,
    Reg::R10,
    Reg::R11,
    Reg::R12,
    Reg::R13,
    Reg::R14,
    Reg::R15,
];

/// Fills a [`RegFile`] from 18 PEBS GPR words given in `order`
/// ([`PEBS_LEGACY_GPR_ORDER`] or [`PEBS_ADAPTIVE_GPR_ORDER`]). CS, SS and the
/// segment slots are left as they were in `base`.
pub fn regfile_from_pebs(base: RegFile, order: &[Reg; 18], words: &[u64; 18]) -> RegFile {
    let mut out = base;
    for (reg, word) in order.iter().zip(words.iter()) {
        out.set(*reg, *word);
    }
    out
}

/// A sampled register set as perf stores it: ABI, mask, and one value per
/// mask bit in ascending bit order (none when the ABI is [`Abi::None`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RegsSample {
    /// The ABI word.
    pub abi: Abi,
    /// The requested mask (x86-64 layout).
    pub mask: u64,
    /// `popcount(mask)` values, or none for ABI_NONE.
    pub values: heapless::Vec<u64, MAX_SAMPLED_REGS>,
}

/// The most values a register sample can carry (24 GPR slots + 32 XMM halves).
pub const MAX_SAMPLED_REGS: usize = 56;

impl RegsSample {
    /// Whether the mask names only registers perf's x86-64 layout has and
    /// there is one value per mask bit (none for ABI_NONE), as every
    /// reader parses it.
    pub fn well_formed(&self) -> bool {
        let n = if self.abi == Abi::None {
            0
        } else if self.mask == GPR_MASK {
            // The common set, without a (software) population count.
            const { GPR_MASK.count_ones() as usize }
        } else {
            self.mask.count_ones() as usize
        };
        self.mask & !VALID_MASK_WITH_XMM == 0 && self.values.len() == n
    }

    /// An ABI_NONE sample for `mask`: no values.
    pub fn none(mask: u64) -> Self {
        RegsSample {
            abi: Abi::None,
            mask,
            values: heapless::Vec::new(),
        }
    }

    /// Samples the GPRs under `mask` from `file` for a task in `mode`, using
    /// the compat rule of [`user_regs_value`]. XMM bits read 0 here: only a
    /// PEBS record supplies them (see [`RegsSample::set_xmm`]).
    pub fn from_file(file: &RegFile, mask: u64, mode: CodeMode) -> Self {
        let mut values = heapless::Vec::new();
        let mut m = mask & VALID_MASK_WITH_XMM;
        while m != 0 {
            let bit = m.trailing_zeros() as usize;
            m &= m - 1;
            let v = match Reg::from_index(bit) {
                Some(reg) => user_regs_value(file, reg, mode),
                None => 0,
            };
            // Cannot fail: at most 56 bits of VALID_MASK_WITH_XMM are set.
            let _ = values.push(v);
        }
        RegsSample {
            abi: mode.abi(),
            mask: mask & VALID_MASK_WITH_XMM,
            values,
        }
    }

    /// Sets XMM register `n`'s two halves (low, high) if they are in the mask.
    pub fn set_xmm(&mut self, n: usize, low: u64, high: u64) {
        for (bit, v) in [(32 + 2 * n, low), (33 + 2 * n, high)] {
            if bit < 64
                && self.mask & (1 << bit) != 0
                && let Some(pos) = self.position(bit)
            {
                self.values[pos] = v;
            }
        }
    }

    /// The index into `values` of mask bit `bit`, if sampled.
    pub fn position(&self, bit: usize) -> Option<usize> {
        if self.abi == Abi::None || bit >= 64 || self.mask & (1 << bit) == 0 {
            return None;
        }
        Some((self.mask & ((1u64 << bit) - 1)).count_ones() as usize)
    }

    /// The sampled value of `reg`, if present.
    pub fn get(&self, reg: Reg) -> Option<u64> {
        self.position(reg.index()).map(|i| self.values[i])
    }

    /// The bytes perf.data spends on this set: the ABI word plus one word
    /// per value.
    pub fn perf_data_bytes(&self) -> usize {
        8 + 8 * self.values.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_match_the_kernel_uapi() {
        // arch/x86/include/uapi/asm/perf_regs.h
        let expected = [
            ("AX", 0),
            ("BX", 1),
            ("CX", 2),
            ("DX", 3),
            ("SI", 4),
            ("DI", 5),
            ("BP", 6),
            ("SP", 7),
            ("IP", 8),
            ("FLAGS", 9),
            ("CS", 10),
            ("SS", 11),
            ("DS", 12),
            ("ES", 13),
            ("FS", 14),
            ("GS", 15),
            ("R8", 16),
            ("R9", 17),
            ("R10", 18),
            ("R11", 19),
            ("R12", 20),
            ("R13", 21),
            ("R14", 22),
            ("R15", 23),
        ];
        for (i, (name, idx)) in expected.iter().enumerate() {
            let reg = ALL_REGS[i];
            assert_eq!(reg.name(), *name);
            assert_eq!(reg.index(), *idx);
            assert_eq!(Reg::from_index(*idx), Some(reg));
        }
        assert_eq!(Reg::from_index(24), None);
    }

    #[test]
    fn masks() {
        assert_eq!(GPR_MASK, 0xff0fff);
        assert_eq!(SEGMENT_MASK, 0xf000);
        assert_eq!(GPR_MASK.count_ones(), 20);
        assert_eq!(XMM_MASK & GPR_SLOTS_MASK, 0);
        assert_eq!(RESERVED_MASK & (GPR_SLOTS_MASK | XMM_MASK), 0);
        assert_eq!(
            RESERVED_MASK | GPR_SLOTS_MASK | XMM_MASK,
            u64::MAX,
            "every bit is classified"
        );
    }

    #[test]
    fn abi_values() {
        assert_eq!(Abi::None.perf_value(), 0);
        assert_eq!(Abi::Bits32.perf_value(), 1);
        assert_eq!(Abi::Bits64.perf_value(), 2);
        for v in 0..3 {
            assert_eq!(Abi::from_perf_value(v).unwrap().perf_value(), v);
        }
        assert_eq!(Abi::from_perf_value(3), None);
    }

    fn distinct_file() -> RegFile {
        let mut f = RegFile::default();
        for (i, v) in f.0.iter_mut().enumerate() {
            *v = 0x1000 + i as u64;
        }
        f
    }

    #[test]
    fn compat_keeps_the_mask_and_zeroes_r8_to_r15() {
        let f = distinct_file();
        let s = RegsSample::from_file(&f, GPR_MASK, CodeMode::Compat32);
        assert_eq!(s.abi, Abi::Bits32);
        assert_eq!(s.mask, GPR_MASK);
        assert_eq!(
            s.values.len(),
            20,
            "no value is dropped from under the mask"
        );
        for reg in ALL_REGS {
            if reg.bit() & SEGMENT_MASK != 0 {
                assert_eq!(s.get(reg), None);
            } else if reg.bit() & R8_R15_MASK != 0 {
                assert_eq!(s.get(reg), Some(0), "{}", reg.name());
            } else {
                assert_eq!(s.get(reg), Some(0x1000 + reg.index() as u64));
            }
        }
        let s64 = RegsSample::from_file(&f, GPR_MASK, CodeMode::Long64);
        assert_eq!(s64.abi, Abi::Bits64);
        assert_eq!(s64.get(Reg::R15), Some(0x1000 + 23));
    }

    #[test]
    fn values_are_in_ascending_bit_order() {
        let f = distinct_file();
        let mask = Reg::R9.bit() | Reg::Ip.bit() | Reg::Ax.bit();
        let s = RegsSample::from_file(&f, mask, CodeMode::Long64);
        assert_eq!(&s.values[..], &[0x1000, 0x1008, 0x1011]);
        assert_eq!(s.perf_data_bytes(), 8 + 24);
    }

    #[test]
    fn xmm_halves_land_in_their_slots() {
        let f = distinct_file();
        let mask = Reg::Ax.bit() | (0b11 << 34); // AX, XMM1 low/high
        let mut s = RegsSample::from_file(&f, mask, CodeMode::Long64);
        assert_eq!(&s.values[..], &[0x1000, 0, 0]);
        s.set_xmm(1, 7, 9);
        s.set_xmm(0, 1, 1); // not in the mask: ignored
        assert_eq!(&s.values[..], &[0x1000, 7, 9]);
    }

    #[test]
    fn pebs_orders_are_permutations_and_map_correctly() {
        for order in [&PEBS_LEGACY_GPR_ORDER, &PEBS_ADAPTIVE_GPR_ORDER] {
            let mut seen = 0u64;
            for r in order.iter() {
                assert_eq!(seen & r.bit(), 0, "duplicate {}", r.name());
                seen |= r.bit();
            }
            assert_eq!(
                seen,
                GPR_MASK & !(Reg::Cs.bit() | Reg::Ss.bit()),
                "covers every GPR but CS/SS"
            );
        }
        let words: [u64; 18] = core::array::from_fn(|i| 100 + i as u64);
        let base = RegFile::default().with(Reg::Cs, 0x33);
        let legacy = regfile_from_pebs(base, &PEBS_LEGACY_GPR_ORDER, &words);
        assert_eq!(legacy.get(Reg::Flags), 100);
        assert_eq!(legacy.get(Reg::Ip), 101);
        assert_eq!(legacy.get(Reg::Bx), 103);
        assert_eq!(legacy.get(Reg::Sp), 109);
        assert_eq!(legacy.get(Reg::R15), 117);
        assert_eq!(legacy.get(Reg::Cs), 0x33);
        let adaptive = regfile_from_pebs(base, &PEBS_ADAPTIVE_GPR_ORDER, &words);
        assert_eq!(adaptive.get(Reg::Cx), 103);
        assert_eq!(adaptive.get(Reg::Bx), 105);
        assert_eq!(adaptive.get(Reg::Sp), 106);
        assert_eq!(adaptive.get(Reg::Di), 109);
        assert_eq!(adaptive.get(Reg::R8), 110);
    }
}
