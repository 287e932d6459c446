//! Model-specific register access behind a narrow trait, and the checked table of PMU MSR addresses.
//!
//! Drivers only ever talk to [`Msr`]. [`CpuMsr`] reaches the real registers with
//! `rdmsr`/`wrmsr`; the simulated PMU (`pmu::sim`) implements the same trait, so
//! the same driver code runs on hardware, in host tests and under `pmu=sim`.

/// Read and write model-specific registers.
pub trait Msr {
    /// Read the 64-bit value of MSR `addr`.
    fn read(&mut self, addr: u32) -> u64;
    /// Write `value` to MSR `addr`.
    fn write(&mut self, addr: u32, value: u64);
}

/// The processor's own MSRs, through `rdmsr` / `wrmsr`.
///
/// Only the target path constructs one; host code uses the simulator.
#[derive(Debug)]
pub struct CpuMsr {
    _private: (),
}

impl CpuMsr {
    /// Create an accessor for the running CPU's MSRs.
    ///
    /// # Safety
    /// 1. The caller runs at CPL 0 (`rdmsr`/`wrmsr` fault otherwise).
    /// 2. Every address later passed to [`Msr::read`]/[`Msr::write`] names an MSR
    ///    that this CPU implements (detected through CPUID, never by probing),
    ///    and every value written is valid for it; a wrong one raises #GP.
    /// 3. Writes may change processor behaviour (counters, LBRs, DS area): the
    ///    caller owns that state for this CPU.
    pub unsafe fn new() -> Self {
        Self { _private: () }
    }
}

impl Msr for CpuMsr {
    fn read(&mut self, addr: u32) -> u64 {
        let (lo, hi): (u32, u32);
        // SAFETY: `CpuMsr::new`'s contract (obligations 1 and 2) guarantees CPL 0 and
        // that `addr` is implemented; rdmsr touches no memory.
        unsafe {
            core::arch::asm!("rdmsr", in("ecx") addr, out("eax") lo, out("edx") hi,
                options(nostack, preserves_flags));
        }
        (u64::from(hi) << 32) | u64::from(lo)
    }

    fn write(&mut self, addr: u32, value: u64) {
        let lo = value as u32;
        let hi = (value >> 32) as u32;
        // SAFETY: `CpuMsr::new`'s contract (obligations 1-3) guarantees CPL 0, an
        // implemented MSR and a valid value. No `nomem`: the write may make the
        // hardware start writing PEBS records into memory whose address it holds.
        unsafe {
            core::arch::asm!("wrmsr", in("ecx") addr, in("eax") lo, in("edx") hi,
                options(nostack, preserves_flags));
        }
    }
}

/// MSR addresses used by the PMU drivers (Intel SDM vol. 4 "Model-Specific
/// Registers"; AMD PPR "MSRs - MSRC000_0xxx / MSRC001_0xxx").
///
/// Kept here rather than taken from the `x86` crate, which lacks the arch-LBR,
/// FIXED_CTR3 and AMD PMU registers and has wrong values for others.
pub mod addr {
    // Intel architectural performance monitoring (SDM vol. 3 ch. 20 / vol. 4 table 2-2).
    /// IA32_PMC0; PMCn is `IA32_PMC0 + n`.
    pub const IA32_PMC0: u32 = 0xC1;
    /// IA32_PERFEVTSEL0; PERFEVTSELn is `IA32_PERFEVTSEL0 + n`.
    pub const IA32_PERFEVTSEL0: u32 = 0x186;
    /// IA32_A_PMC0: full-width writable alias of PMC0 (PERF_CAPABILITIES\[13\]).
    pub const IA32_A_PMC0: u32 = 0x4C1;
    /// IA32_FIXED_CTR0 (instructions); FIXED_CTRn is `IA32_FIXED_CTR0 + n` (n <= 3).
    pub const IA32_FIXED_CTR0: u32 = 0x309;
    /// IA32_FIXED_CTR3 (topdown slots, v5).
    pub const IA32_FIXED_CTR3: u32 = 0x30C;
    /// IA32_PERF_CAPABILITIES (present when CPUID.1:ECX.PDCM\[15\] = 1).
    pub const IA32_PERF_CAPABILITIES: u32 = 0x345;
    /// IA32_FIXED_CTR_CTRL.
    pub const IA32_FIXED_CTR_CTRL: u32 = 0x38D;
    /// IA32_PERF_GLOBAL_STATUS (v2+).
    pub const IA32_PERF_GLOBAL_STATUS: u32 = 0x38E;
    /// IA32_PERF_GLOBAL_CTRL (v2+).
    pub const IA32_PERF_GLOBAL_CTRL: u32 = 0x38F;
    /// IA32_PERF_GLOBAL_OVF_CTRL (v2, v3); the same address is
    /// IA32_PERF_GLOBAL_STATUS_RESET from v4 on.
    pub const IA32_PERF_GLOBAL_OVF_CTRL: u32 = 0x390;
    /// IA32_PERF_GLOBAL_STATUS_RESET (v4+).
    pub const IA32_PERF_GLOBAL_STATUS_RESET: u32 = 0x390;
    /// IA32_PERF_GLOBAL_STATUS_SET (v4+).
    pub const IA32_PERF_GLOBAL_STATUS_SET: u32 = 0x391;
    /// IA32_PEBS_ENABLE.
    pub const IA32_PEBS_ENABLE: u32 = 0x3F1;
    /// MSR_PEBS_DATA_CFG (adaptive PEBS, format 4+).
    pub const MSR_PEBS_DATA_CFG: u32 = 0x3F2;
    /// MSR_PEBS_LD_LAT_THRESHOLD (load latency facility).
    pub const MSR_PEBS_LD_LAT_THRESHOLD: u32 = 0x3F6;
    /// IA32_DS_AREA (linear address of the DS save area).
    pub const IA32_DS_AREA: u32 = 0x600;
    /// IA32_MISC_ENABLE (bit 12: PEBS unavailable, bit 11: BTS unavailable).
    pub const IA32_MISC_ENABLE: u32 = 0x1A0;
    /// IA32_DEBUGCTL.
    pub const IA32_DEBUGCTL: u32 = 0x1D9;

    // Legacy (model-specific) LBR.
    /// MSR_LBR_SELECT (Nehalem and later).
    pub const MSR_LBR_SELECT: u32 = 0x1C8;
    /// MSR_LASTBRANCH_TOS (Core 2 and later; NOT the Pentium 4 0x1DA).
    pub const MSR_LASTBRANCH_TOS: u32 = 0x1C9;
    /// MSR_LASTBRANCH_0_FROM_IP on Core 2 / Atom.
    pub const MSR_LBR_CORE_FROM: u32 = 0x40;
    /// MSR_LASTBRANCH_0_TO_IP on Core 2 / Atom.
    pub const MSR_LBR_CORE_TO: u32 = 0x60;
    /// MSR_LASTBRANCH_0_FROM_IP on Nehalem and later.
    pub const MSR_LBR_NHM_FROM: u32 = 0x680;
    /// MSR_LASTBRANCH_0_TO_IP on Nehalem and later.
    pub const MSR_LBR_NHM_TO: u32 = 0x6C0;
    /// MSR_LBR_INFO_0 (Skylake and later, LBR format 5).
    pub const MSR_LBR_INFO_0: u32 = 0xDC0;

    // Architectural LBR (SDM vol. 3 ch. 19 "Last Branch Records", CPUID leaf 0x1C).
    /// IA32_LBR_CTL.
    pub const IA32_LBR_CTL: u32 = 0x14CE;
    /// IA32_LBR_DEPTH.
    pub const IA32_LBR_DEPTH: u32 = 0x14CF;
    /// IA32_LBR_0_INFO; entry n is `+ n`.
    pub const IA32_LBR_0_INFO: u32 = 0x1200;
    /// IA32_LBR_0_FROM_IP; entry n is `+ n`.
    pub const IA32_LBR_0_FROM_IP: u32 = 0x1500;
    /// IA32_LBR_0_TO_IP; entry n is `+ n`.
    pub const IA32_LBR_0_TO_IP: u32 = 0x1600;

    // x2APIC LVT performance monitoring entry.
    /// x2APIC LVT Performance Monitoring register (xAPIC MMIO offset 0x340).
    pub const X2APIC_LVT_PMI: u32 = 0x834;

    // AMD (APM vol. 2 "Performance Monitoring Counters", PPR for family 17h/19h).
    /// PerfEvtSel0 legacy (K7); n = 0..=3 at `+ n`.
    pub const AMD_K7_PERF_CTL0: u32 = 0xC001_0000;
    /// PerfCtr0 legacy (K7); n = 0..=3 at `+ n`.
    pub const AMD_K7_PERF_CTR0: u32 = 0xC001_0004;
    /// Core PerfCtl0 in the extended set (PerfCtrExtCore); CTLn at `+ 2n`.
    pub const AMD_F15H_PERF_CTL0: u32 = 0xC001_0200;
    /// Core PerfCtr0 in the extended set; CTRn at `+ 2n`.
    pub const AMD_F15H_PERF_CTR0: u32 = 0xC001_0201;
    /// PerfMonV2 PerfCntrGlobalStatus.
    pub const AMD_PERF_CNTR_GLOBAL_STATUS: u32 = 0xC000_0300;
    /// PerfMonV2 PerfCntrGlobalCtl.
    pub const AMD_PERF_CNTR_GLOBAL_CTL: u32 = 0xC000_0301;
    /// PerfMonV2 PerfCntrGlobalStatusClr.
    pub const AMD_PERF_CNTR_GLOBAL_STATUS_CLR: u32 = 0xC000_0302;
    /// LbrExtV2 branch selection (filter) register.
    pub const AMD_LBR_SELECT: u32 = 0xC000_010E;
    /// DbgExtnCfg (bit 6 LBRV2EN).
    pub const AMD_DBG_EXTN_CFG: u32 = 0xC000_010F;
    /// LbrExtV2 entry 0 FROM; entry n FROM at `+ 2n`, TO at `+ 2n + 1`.
    pub const AMD_SAMP_BR_FROM0: u32 = 0xC001_0300;
}

/// IA32_DEBUGCTL bits used by the drivers (SDM vol. 3 "IA32_DEBUGCTL MSR").
pub mod debugctl {
    /// Record branches in the LBR stack.
    pub const LBR: u64 = 1 << 0;
    /// Freeze the LBR stack on a PMI (legacy: clears LBR; v4: sets LBR_FRZ).
    pub const FREEZE_LBRS_ON_PMI: u64 = 1 << 11;
    /// Freeze the counters on a PMI (legacy: clears GLOBAL_CTRL; v4: sets CTR_FRZ).
    pub const FREEZE_PERFMON_ON_PMI: u64 = 1 << 12;
}

#[cfg(test)]
mod tests {
    use super::addr::*;

    #[test]
    fn addresses_match_the_manuals() {
        // A few values that other tables get wrong.
        assert_eq!(MSR_LASTBRANCH_TOS, 0x1C9);
        assert_eq!(IA32_PERF_GLOBAL_STATUS, 0x38E);
        assert_eq!(IA32_FIXED_CTR3, IA32_FIXED_CTR0 + 3);
        assert_eq!(AMD_F15H_PERF_CTR0, AMD_F15H_PERF_CTL0 + 1);
        assert_eq!(IA32_PERF_GLOBAL_STATUS_RESET, IA32_PERF_GLOBAL_OVF_CTRL);
    }
}
