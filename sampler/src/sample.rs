//! The sample model: one perf_event sample with every field Perch can fill,
//! plus the branch-entry and memory-info types the PEBS/LBR decoders produce.
//! A `Sample` is fixed-size (bounded `heapless` vectors), so it can live in
//! the NMI ring without allocation.

use serde::{Deserialize, Serialize};

use crate::event::{EventConfig, sample_type as st};
use crate::regs::RegsSample;

/// The deepest callchain a sample carries (including context markers).
pub const MAX_CALLCHAIN: usize = 64;
/// The most branch-stack entries a sample carries.
pub const MAX_BRANCHES: usize = 32;

/// `PERF_CONTEXT_KERNEL`: the following callchain entries are kernel IPs.
pub const PERF_CONTEXT_KERNEL: u64 = (-128i64) as u64;
/// `PERF_CONTEXT_USER`: the following callchain entries are user IPs.
pub const PERF_CONTEXT_USER: u64 = (-512i64) as u64;

/// Where the sampled IP ran (`misc` cpumode).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CpuMode {
    /// Ring 3: the appliance task (`PERF_RECORD_MISC_USER`).
    #[default]
    User,
    /// Ring 0: the runtime (`PERF_RECORD_MISC_KERNEL`).
    Kernel,
}

impl CpuMode {
    /// The mode a CS selector's RPL gives.
    pub const fn from_cs(cs: u64) -> CpuMode {
        if cs & 3 == 3 {
            CpuMode::User
        } else {
            CpuMode::Kernel
        }
    }

    /// The perf record header `misc` cpumode value.
    pub const fn perf_misc(self) -> u16 {
        match self {
            CpuMode::User => 2,
            CpuMode::Kernel => 1,
        }
    }
}

/// The branch type field of a branch entry (`PERF_BR_*`, 4 bits).
pub mod branch_kind {
    /// Unknown.
    pub const UNKNOWN: u8 = 0;
    /// Conditional.
    pub const COND: u8 = 1;
    /// Unconditional.
    pub const UNCOND: u8 = 2;
    /// Indirect.
    pub const IND: u8 = 3;
    /// Call.
    pub const CALL: u8 = 4;
    /// Indirect call.
    pub const IND_CALL: u8 = 5;
    /// Return.
    pub const RET: u8 = 6;
    /// System call.
    pub const SYSCALL: u8 = 7;
    /// System call return.
    pub const SYSRET: u8 = 8;
    /// Conditional call.
    pub const COND_CALL: u8 = 9;
    /// Conditional return.
    pub const COND_RET: u8 = 10;
}

/// Flags of one branch entry, as perf packs them in `perf_branch_entry`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BranchFlags {
    /// The branch was mispredicted.
    pub mispred: bool,
    /// The branch was predicted (the hardware knows the prediction).
    pub predicted: bool,
    /// In a transaction.
    pub in_tx: bool,
    /// A transaction abort.
    pub abort: bool,
    /// Cycles since the previous branch (16 bits), 0 if unknown.
    pub cycles: u16,
    /// `PERF_BR_*` type (4 bits), see [`branch_kind`].
    pub kind: u8,
}

impl BranchFlags {
    /// Packs into the perf.data flags word: mispred bit 0, predicted 1,
    /// in_tx 2, abort 3, cycles 4..19, type 20..23.
    pub const fn to_perf(self) -> u64 {
        (self.mispred as u64)
            | (self.predicted as u64) << 1
            | (self.in_tx as u64) << 2
            | (self.abort as u64) << 3
            | (self.cycles as u64) << 4
            | ((self.kind & 0xf) as u64) << 20
    }

    /// Unpacks a perf.data flags word (bits beyond 23 are ignored).
    pub const fn from_perf(w: u64) -> Self {
        BranchFlags {
            mispred: w & 1 != 0,
            predicted: w & 2 != 0,
            in_tx: w & 4 != 0,
            abort: w & 8 != 0,
            cycles: (w >> 4) as u16,
            kind: ((w >> 20) & 0xf) as u8,
        }
    }
}

/// One branch-stack entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BranchEntry {
    /// Branch source.
    pub from: u64,
    /// Branch target.
    pub to: u64,
    /// Flags.
    pub flags: BranchFlags,
}

/// A branch stack, newest entry first, with the optional hardware index.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BranchStack {
    /// `hw_idx` (written when branch_sample_type has HW_INDEX).
    pub hw_idx: u64,
    /// Entries, newest first.
    pub entries: heapless::Vec<BranchEntry, MAX_BRANCHES>,
}

/// Memory-access fields (PEBS load latency / store sampling).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MemInfo {
    /// Data linear address (ADDR).
    pub addr: u64,
    /// Access latency (WEIGHT, or WEIGHT_STRUCT's var1_dw).
    pub weight: u64,
    /// Instruction latency (WEIGHT_STRUCT's var2_w).
    pub ins_lat: u16,
    /// `perf_mem_data_src` word (DATA_SRC).
    pub data_src: u64,
}

impl MemInfo {
    /// The WEIGHT_STRUCT word: var1_dw (weight, low 32 bits) | var2_w
    /// (ins_lat) << 32.
    pub const fn weight_struct(&self) -> u64 {
        (self.weight & 0xffff_ffff) | (self.ins_lat as u64) << 32
    }
}

/// One sample, with every field Perch can produce. Which fields end up in
/// perf.data is decided by the event's `sample_type`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Sample {
    /// The event's id ([`EventConfig::id`]).
    pub event: u32,
    /// Where the IP ran.
    pub cpumode: CpuMode,
    /// Sampled instruction pointer.
    pub ip: u64,
    /// Process id (the appliance task's id; 0 for the runtime's idle).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Time in nanoseconds since boot.
    pub time: u64,
    /// CPU number.
    pub cpu: u32,
    /// The period this sample stands for.
    pub period: u64,
    /// Callchain: IPs with [`PERF_CONTEXT_KERNEL`] / [`PERF_CONTEXT_USER`]
    /// markers, first entry = sample IP (empty if not sampled).
    pub callchain: heapless::Vec<u64, MAX_CALLCHAIN>,
    /// Branch stack (if sampled).
    pub branches: Option<BranchStack>,
    /// User registers (if sampled).
    pub regs_user: Option<RegsSample>,
    /// Interrupt registers (if sampled).
    pub regs_intr: Option<RegsSample>,
    /// Memory fields (if sampled).
    pub mem: Option<MemInfo>,
}

impl Sample {
    /// An empty sample (what `Default` gives), for constant initialisers.
    pub const EMPTY: Sample = Sample {
        event: 0,
        cpumode: CpuMode::User,
        ip: 0,
        pid: 0,
        tid: 0,
        time: 0,
        cpu: 0,
        period: 0,
        callchain: heapless::Vec::new(),
        branches: None,
        regs_user: None,
        regs_intr: None,
        mem: None,
    };

    /// The bytes this sample takes in perf.data for `event`'s sample_type
    /// (record header included).
    pub fn perf_data_bytes(&self, event: &EventConfig) -> usize {
        let mut n = 8; // perf_event_header
        for bit in [
            st::IDENTIFIER,
            st::IP,
            st::TID,
            st::TIME,
            st::ADDR,
            st::ID,
            st::STREAM_ID,
        ] {
            if event.has(bit) {
                n += 8;
            }
        }
        for bit in [st::CPU, st::PERIOD] {
            if event.has(bit) {
                n += 8;
            }
        }
        if event.has(st::CALLCHAIN) {
            n += 8 + 8 * self.callchain.len();
        }
        if event.has(st::BRANCH_STACK) {
            let hw = if event.branch_sample_type & crate::event::branch_type::HW_INDEX != 0 {
                8
            } else {
                0
            };
            n += 8 + hw + 24 * self.branches.as_ref().map_or(0, |b| b.entries.len());
        }
        if event.has(st::REGS_USER) {
            n += self
                .regs_user
                .as_ref()
                .map_or(8, RegsSample::perf_data_bytes);
        }
        for bit in [st::WEIGHT, st::WEIGHT_STRUCT, st::DATA_SRC] {
            if event.has(bit) {
                n += 8;
            }
        }
        if event.has(st::REGS_INTR) {
            n += self
                .regs_intr
                .as_ref()
                .map_or(8, RegsSample::perf_data_bytes);
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::regs::{CodeMode, GPR_MASK, RegFile};

    #[test]
    fn branch_flags_pack_like_perf() {
        let f = BranchFlags {
            mispred: true,
            predicted: false,
            in_tx: true,
            abort: false,
            cycles: 0xabcd,
            kind: branch_kind::CALL,
        };
        assert_eq!(f.to_perf(), 1 | 4 | (0xabcd << 4) | (4 << 20));
        assert_eq!(BranchFlags::from_perf(f.to_perf()), f);
        let p = BranchFlags {
            predicted: true,
            abort: true,
            ..Default::default()
        };
        assert_eq!(p.to_perf(), 0b1010);
    }

    #[test]
    fn context_markers() {
        assert_eq!(PERF_CONTEXT_KERNEL, 0xffff_ffff_ffff_ff80);
        assert_eq!(PERF_CONTEXT_USER, 0xffff_ffff_ffff_fe00);
        assert_eq!(CpuMode::from_cs(0x2b), CpuMode::User);
        assert_eq!(CpuMode::from_cs(0x08), CpuMode::Kernel);
    }

    #[test]
    fn weight_struct_word() {
        let m = MemInfo {
            weight: 0x1_0000_0123,
            ins_lat: 7,
            ..Default::default()
        };
        assert_eq!(m.weight_struct(), 0x0007_0000_0123);
    }

    #[test]
    fn perf_data_size_of_the_acceptance_sample() {
        let mut e = EventConfig::cpu_clock(0, 4000);
        e.sample_type |= st::REGS_USER;
        e.regs_user = GPR_MASK;
        let s = Sample {
            regs_user: Some(RegsSample::from_file(
                &RegFile::default(),
                GPR_MASK,
                CodeMode::Long64,
            )),
            ..Default::default()
        };
        // header 8 + IDENTIFIER/IP/TID/TIME/PERIOD 40 + abi 8 + 20 regs 160
        assert_eq!(s.perf_data_bytes(&e), 216);
    }
}
