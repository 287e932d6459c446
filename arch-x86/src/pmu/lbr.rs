//! Reading and programming the LBR stack: legacy model-specific LBR (TOS
//! walk, INFO MSRs), architectural LBR (entry 0 newest) and AMD LbrExtV2,
//! with branch filters, call-stack mode and freeze on PMI.
//!
//! The driver returns raw MSR values newest first; `sampler::lbr` decodes them.

use crate::cpuid::LbrKind;
use crate::msr::{Msr, addr, debugctl};
use crate::pmu::models::IntelModel;

/// Deepest stack any supported CPU has.
pub const MAX_LBR: usize = 32;

/// One LBR entry as read: FROM, TO, INFO (0 where the format has no INFO).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct RawBranch {
    /// FROM_IP value.
    pub from: u64,
    /// TO_IP value.
    pub to: u64,
    /// INFO value.
    pub info: u64,
}

/// How the raw values are encoded (tells `sampler::lbr` which decoder to use).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LbrRawFormat {
    /// No LBR data.
    None,
    /// Legacy format number (IA32_PERF_CAPABILITIES\[5:0\]).
    Legacy(u8),
    /// Architectural LBR.
    Arch,
    /// AMD LbrExtV2.
    AmdV2,
}

/// Which branches to record (perf's `branch_sample_type` in driver terms).
pub mod filter {
    /// Branches in user mode.
    pub const USER: u32 = 1 << 0;
    /// Branches in kernel mode.
    pub const KERNEL: u32 = 1 << 1;
    /// Conditional branches.
    pub const COND: u32 = 1 << 2;
    /// Direct calls.
    pub const CALL: u32 = 1 << 3;
    /// Indirect calls.
    pub const IND_CALL: u32 = 1 << 4;
    /// Returns.
    pub const RET: u32 = 1 << 5;
    /// Indirect jumps.
    pub const IND_JMP: u32 = 1 << 6;
    /// Direct jumps.
    pub const JMP: u32 = 1 << 7;
    /// Far branches, interrupts, syscalls.
    pub const FAR: u32 = 1 << 8;
    /// Every branch type.
    pub const ANY: u32 = COND | CALL | IND_CALL | RET | IND_JMP | JMP | FAR;
    /// Everything in both modes.
    pub const ALL: u32 = USER | KERNEL | ANY;
}

/// LBR settings for a recording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LbrConfig {
    /// Filter bits from [`filter`].
    pub filter: u32,
    /// Call-stack mode: the stack holds the current call chain (push on call,
    /// pop on return), usable as a callchain source.
    pub call_stack: bool,
}

impl Default for LbrConfig {
    fn default() -> Self {
        LbrConfig {
            filter: filter::ALL,
            call_stack: false,
        }
    }
}

/// Legacy and AMD MSR_LBR_SELECT: each bit SUPPRESSES a class (SDM "Filtering
/// of Last Branch Records"; AMD PPR LbrSelect uses the same bit positions).
pub fn legacy_select(cfg: &LbrConfig) -> u64 {
    let f = cfg.filter;
    let mut sel = 0u64;
    let mut suppress = |bit: u32, keep: bool| {
        if !keep {
            sel |= 1 << bit;
        }
    };
    suppress(0, f & filter::KERNEL != 0); // CPL_EQ_0
    suppress(1, f & filter::USER != 0); // CPL_NEQ_0
    suppress(2, f & filter::COND != 0); // JCC
    suppress(3, f & filter::CALL != 0); // NEAR_REL_CALL
    suppress(4, f & filter::IND_CALL != 0); // NEAR_IND_CALL
    suppress(5, f & filter::RET != 0); // NEAR_RET
    suppress(6, f & filter::IND_JMP != 0); // NEAR_IND_JMP
    suppress(7, f & filter::JMP != 0); // NEAR_REL_JMP
    suppress(8, f & filter::FAR != 0); // FAR_BRANCH
    if cfg.call_stack {
        sel |= 1 << 9; // EN_CALLSTACK (Haswell and later)
    }
    sel
}

/// IA32_LBR_CTL bits (SDM "IA32_LBR_CTL"): each bit ENABLES a class.
pub fn arch_ctl(cfg: &LbrConfig) -> u64 {
    let f = cfg.filter;
    let mut ctl = 1u64; // LBREn
    let mut enable = |bit: u32, on: bool| {
        if on {
            ctl |= 1 << bit;
        }
    };
    enable(1, f & filter::KERNEL != 0); // OS
    enable(2, f & filter::USER != 0); // USR
    enable(3, cfg.call_stack); // CALL_STACK
    enable(16, f & filter::COND != 0); // JCC
    enable(17, f & filter::JMP != 0); // NEAR_REL_JMP
    enable(18, f & filter::IND_JMP != 0); // NEAR_IND_JMP
    enable(19, f & filter::CALL != 0); // NEAR_REL_CALL
    enable(20, f & filter::IND_CALL != 0); // NEAR_IND_CALL
    enable(21, f & filter::RET != 0); // NEAR_RET
    enable(22, f & filter::FAR != 0); // OTHER_BRANCH
    ctl
}

/// AMD DbgExtnCfg.LBRV2EN.
pub const AMD_LBRV2EN: u64 = 1 << 6;

/// The LBR part of a PMU driver.
#[derive(Debug)]
pub struct LbrDriver {
    kind: LbrKind,
    select: bool,
    call_stack: bool,
    cfg: LbrConfig,
    freeze: bool,
    buf: [RawBranch; MAX_LBR],
    len: usize,
}

impl LbrDriver {
    /// A driver for the detected LBR, or `None` when there is none.
    pub fn new(kind: LbrKind) -> Option<Self> {
        if kind == LbrKind::None {
            return None;
        }
        Some(LbrDriver {
            kind,
            select: true,
            // AMD's LbrExtV2 has no call-stack mode; legacy and
            // architectural LBRs learn theirs in `for_model`.
            call_stack: !matches!(kind, LbrKind::AmdV2 { .. }),
            cfg: LbrConfig::default(),
            freeze: false,
            buf: [RawBranch::default(); MAX_LBR],
            len: 0,
        })
    }

    /// Apply a model's legacy-LBR facts: whether MSR_LBR_SELECT exists and
    /// whether it has the call-stack bit (the model table; architectural
    /// and AMD LBR keep their own enumeration).
    pub fn for_model(mut self, row: &IntelModel) -> Self {
        if let LbrKind::Legacy { .. } = self.kind {
            let l = row.legacy_lbr();
            self.select = l.is_some_and(|l| l.select);
            self.call_stack = l.is_some_and(|l| l.call_stack);
        }
        if let LbrKind::Arch { call_stack, .. } = self.kind {
            self.call_stack = call_stack;
        }
        self
    }

    /// Call-stack mode can be programmed.
    pub fn supports_call_stack(&self) -> bool {
        self.call_stack
    }

    /// Number of entries this LBR holds.
    pub fn depth(&self) -> usize {
        let d = match self.kind {
            LbrKind::None => 0,
            LbrKind::Legacy { depth, .. } | LbrKind::AmdV2 { depth, .. } => depth,
            LbrKind::Arch { max_depth, .. } => max_depth,
        };
        usize::from(d).min(MAX_LBR)
    }

    /// The raw format handed to the decoder.
    pub fn raw_format(&self) -> LbrRawFormat {
        match self.kind {
            LbrKind::None => LbrRawFormat::None,
            LbrKind::Legacy { format, .. } => LbrRawFormat::Legacy(format),
            LbrKind::Arch { .. } => LbrRawFormat::Arch,
            LbrKind::AmdV2 { .. } => LbrRawFormat::AmdV2,
        }
    }

    /// The stack is frozen by the hardware on a PMI (and must be thawed by the
    /// PMI handler).
    pub fn freezes_on_pmi(&self) -> bool {
        self.freeze
    }

    /// Program the filter and start recording. `freeze` asks for
    /// DEBUGCTL.FREEZE_LBRS_ON_PMI (never in call-stack mode, where the stack
    /// must keep following calls and returns). Without MSR_LBR_SELECT
    /// (Core 2, Bonnell) every branch is recorded; call-stack mode must be
    /// checked with [`LbrDriver::supports_call_stack`] first (its bit is
    /// dropped where the model lacks it).
    pub fn enable(&mut self, msr: &mut impl Msr, cfg: LbrConfig, freeze: bool) {
        self.cfg = cfg;
        self.freeze = freeze && !cfg.call_stack;
        let frz = if self.freeze {
            debugctl::FREEZE_LBRS_ON_PMI
        } else {
            0
        };
        match self.kind {
            LbrKind::None => {}
            LbrKind::Legacy { .. } => {
                if self.select {
                    let mut sel = legacy_select(&cfg);
                    if !self.call_stack {
                        sel &= !(1 << 9);
                    }
                    msr.write(addr::MSR_LBR_SELECT, sel);
                }
                let dc = msr.read(addr::IA32_DEBUGCTL);
                msr.write(addr::IA32_DEBUGCTL, dc | debugctl::LBR | frz);
            }
            LbrKind::Arch { max_depth, .. } => {
                // Writing the depth also clears the stack.
                msr.write(addr::IA32_LBR_DEPTH, u64::from(max_depth));
                let dc = msr.read(addr::IA32_DEBUGCTL);
                msr.write(
                    addr::IA32_DEBUGCTL,
                    (dc & !debugctl::FREEZE_LBRS_ON_PMI) | frz,
                );
                msr.write(addr::IA32_LBR_CTL, arch_ctl(&cfg));
            }
            LbrKind::AmdV2 {
                freeze: can_freeze, ..
            } => {
                if !can_freeze {
                    self.freeze = false;
                }
                msr.write(addr::AMD_LBR_SELECT, legacy_select(&cfg) & 0x1FF);
                if self.freeze {
                    let dc = msr.read(addr::IA32_DEBUGCTL);
                    msr.write(addr::IA32_DEBUGCTL, dc | debugctl::FREEZE_LBRS_ON_PMI);
                }
                let ext = msr.read(addr::AMD_DBG_EXTN_CFG);
                msr.write(addr::AMD_DBG_EXTN_CFG, ext | AMD_LBRV2EN);
            }
        }
    }

    /// Stop recording.
    pub fn disable(&mut self, msr: &mut impl Msr) {
        match self.kind {
            LbrKind::None => {}
            LbrKind::Legacy { .. } => {
                let dc = msr.read(addr::IA32_DEBUGCTL);
                msr.write(
                    addr::IA32_DEBUGCTL,
                    dc & !(debugctl::LBR | debugctl::FREEZE_LBRS_ON_PMI),
                );
            }
            LbrKind::Arch { .. } => msr.write(addr::IA32_LBR_CTL, 0),
            LbrKind::AmdV2 { .. } => {
                let ext = msr.read(addr::AMD_DBG_EXTN_CFG);
                msr.write(addr::AMD_DBG_EXTN_CFG, ext & !AMD_LBRV2EN);
            }
        }
    }

    /// After a PMI on a legacy-freeze CPU (perfmon v1-v3) the hardware cleared
    /// DEBUGCTL.LBR; set it again. (On v4+ the PMU driver clears LBR_FRZ in
    /// GLOBAL_STATUS instead.)
    pub fn thaw_legacy(&mut self, msr: &mut impl Msr) {
        if let LbrKind::Legacy { .. } = self.kind {
            let dc = msr.read(addr::IA32_DEBUGCTL);
            msr.write(addr::IA32_DEBUGCTL, dc | debugctl::LBR);
        }
    }

    /// Read the stack, newest first. AMD's stack keeps recording during the
    /// read unless it froze, so it is stopped around the read.
    pub fn read(&mut self, msr: &mut impl Msr) -> &[RawBranch] {
        let depth = self.depth();
        self.len = 0;
        match self.kind {
            LbrKind::None => {}
            LbrKind::Legacy {
                from,
                to,
                info,
                format,
                ..
            } => {
                let mask = depth as u64 - 1;
                let tos = msr.read(addr::MSR_LASTBRANCH_TOS) & mask;
                for i in 0..depth as u64 {
                    let idx = ((tos.wrapping_sub(i)) & mask) as u32;
                    // Format 0 keeps source and target in the FROM MSR.
                    let e = RawBranch {
                        from: msr.read(from + idx),
                        to: if format == 0 { 0 } else { msr.read(to + idx) },
                        info: if info != 0 { msr.read(info + idx) } else { 0 },
                    };
                    if e.from == 0 && e.to == 0 {
                        break;
                    }
                    self.buf[self.len] = e;
                    self.len += 1;
                }
            }
            LbrKind::Arch { .. } => {
                let depth = (msr.read(addr::IA32_LBR_DEPTH) as usize).min(MAX_LBR);
                for i in 0..depth as u32 {
                    let from = msr.read(addr::IA32_LBR_0_FROM_IP + i);
                    if from == 0 {
                        break;
                    }
                    self.buf[self.len] = RawBranch {
                        from,
                        to: msr.read(addr::IA32_LBR_0_TO_IP + i),
                        info: msr.read(addr::IA32_LBR_0_INFO + i),
                    };
                    self.len += 1;
                }
            }
            LbrKind::AmdV2 { .. } => {
                let ext = msr.read(addr::AMD_DBG_EXTN_CFG);
                if !self.freeze {
                    msr.write(addr::AMD_DBG_EXTN_CFG, ext & !AMD_LBRV2EN);
                }
                for i in 0..depth as u32 {
                    let e = RawBranch {
                        from: msr.read(addr::AMD_SAMP_BR_FROM0 + 2 * i),
                        to: msr.read(addr::AMD_SAMP_BR_FROM0 + 2 * i + 1),
                        info: 0,
                    };
                    self.buf[self.len] = e;
                    self.len += 1;
                }
                if !self.freeze {
                    msr.write(addr::AMD_DBG_EXTN_CFG, ext);
                }
            }
        }
        &self.buf[..self.len]
    }

    /// The entries of the last [`LbrDriver::read`].
    pub fn last(&self) -> &[RawBranch] {
        &self.buf[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn raw_branch_matches_the_arch_lbr_xsave_entry() {
        // XSAVE arch-LBR state entry: FROM, TO, INFO (SDM "Arch LBR state").
        assert_eq!(size_of::<RawBranch>(), 24);
        assert_eq!(offset_of!(RawBranch, to), 8);
        assert_eq!(offset_of!(RawBranch, info), 16);
    }

    #[test]
    fn filters_translate_to_suppress_and_enable_bits() {
        let all = LbrConfig::default();
        assert_eq!(legacy_select(&all), 0);
        assert_eq!(arch_ctl(&all), 0x7F_0007);
        let user_calls = LbrConfig {
            filter: filter::USER | filter::CALL | filter::RET,
            call_stack: true,
        };
        // Suppress CPL0, JCC, IND_CALL, IND_JMP, REL_JMP, FAR; call-stack on.
        assert_eq!(
            legacy_select(&user_calls),
            1 | 1 << 2 | 1 << 4 | 1 << 6 | 1 << 7 | 1 << 8 | 1 << 9
        );
        assert_eq!(
            arch_ctl(&user_calls),
            1 | 1 << 2 | 1 << 3 | 1 << 19 | 1 << 21
        );
    }
}
