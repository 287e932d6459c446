//! One driver type for whichever PMU was detected, so the runtime's glue
//! (start-up check, NMI handler, `pmu=sim`) does not care about the vendor.

use super::amd::AmdPmu;
use super::ds::DsMemory;
use super::events::{Event, EventKind};
use super::intel::{IntelOptions, IntelPmu};
use super::lbr::LbrRawFormat;
use super::selftest::{self, Reason, Verdict};
use super::{EventConfig, LVT_MASKED, Overflow, PmiSummary, PmuError, PmuHw, SampleMode};
use crate::cpuid::{PmuInfo, Vendor};

/// The PMU driver for the detected vendor.
///
/// The variants differ in size; there is no allocator to box the larger one
/// and the driver lives in a per-CPU static anyway.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum PmuDriver {
    /// Intel architectural perfmon.
    Intel(IntelPmu),
    /// AMD core PMU.
    Amd(AmdPmu),
}

impl PmuDriver {
    /// The driver for `info`, or [`PmuError::NoPmu`].
    pub fn new(info: &PmuInfo) -> Result<Self, PmuError> {
        match info.vendor {
            Vendor::Amd => AmdPmu::new(info).map(PmuDriver::Amd),
            Vendor::Intel | Vendor::Other => IntelPmu::new(info).map(PmuDriver::Intel),
        }
    }

    /// Program `events` (stopped). PEBS (Intel) needs `mem`; AMD ignores it
    /// and refuses precise events.
    pub fn configure(
        &mut self,
        hw: &mut impl PmuHw,
        mem: Option<&mut DsMemory<'_>>,
        events: &[EventConfig],
        opts: &IntelOptions,
    ) -> Result<(), PmuError> {
        match self {
            PmuDriver::Intel(d) => d.configure(hw, mem, events, opts),
            PmuDriver::Amd(d) => d.configure(hw, events, opts.lbr),
        }
    }

    /// Start counting.
    pub fn start(&mut self, hw: &mut impl PmuHw) {
        match self {
            PmuDriver::Intel(d) => d.start(hw),
            PmuDriver::Amd(d) => d.start(hw),
        }
    }

    /// Stop counting.
    pub fn stop(&mut self, hw: &mut impl PmuHw) {
        match self {
            PmuDriver::Intel(d) => d.stop(hw),
            PmuDriver::Amd(d) => d.stop(hw),
        }
    }

    /// Handle a PMI (see the vendor drivers).
    pub fn handle_pmi(
        &mut self,
        hw: &mut impl PmuHw,
        mem: Option<&mut DsMemory<'_>>,
        tsc: u64,
        out: &mut impl FnMut(Overflow<'_>),
    ) -> PmiSummary {
        match self {
            PmuDriver::Intel(d) => d.handle_pmi(hw, mem, tsc, out),
            PmuDriver::Amd(d) => d.handle_pmi(hw, tsc, out),
        }
    }

    /// Events counted by event `i` since its counter was last reloaded.
    pub fn events_since_reload(&self, hw: &mut impl PmuHw, i: usize) -> Option<u64> {
        match self {
            PmuDriver::Intel(d) => d.events_since_reload(hw, i),
            PmuDriver::Amd(d) => d.events_since_reload(hw, i),
        }
    }

    /// LBR encoding of the overflows' branch entries.
    pub fn lbr_format(&self) -> LbrRawFormat {
        match self {
            PmuDriver::Intel(d) => d.lbr_format(),
            PmuDriver::Amd(d) => d.lbr_format(),
        }
    }
}

/// Period of the counting phase: long enough never to overflow.
pub const COUNTING_PERIOD: u64 = 1 << 30;

/// Start-up check, counting phase: count instructions while `work` runs.
/// Returns the count, or the reason to fall back to the NMI clock.
///
/// `work` gets the hardware handle back so a simulator can be advanced; on
/// the target it simply runs a workload.
pub fn count_instructions<H: PmuHw>(
    info: &PmuInfo,
    hw: &mut H,
    work: &mut dyn FnMut(&mut H),
) -> Result<u64, Reason> {
    selftest::check_detected(info)?;
    let mut d =
        PmuDriver::new(info).map_err(|_| Reason::NotDetected("no PMU driver for this CPU"))?;
    let ev = [EventConfig {
        event: Event::new(EventKind::Instructions),
        mode: SampleMode::Period(COUNTING_PERIOD),
    }];
    d.configure(hw, None, &ev, &IntelOptions::default())
        .map_err(|_| Reason::NotDetected("the instructions event cannot be programmed"))?;
    // The difference of two reads: a counter that ignores writes and reads
    // a constant (an emulated PMU) shows 0, not the distance to -period.
    let before = d.events_since_reload(hw, 0).unwrap_or(0);
    d.start(hw);
    work(hw);
    d.stop(hw);
    let after = d.events_since_reload(hw, 0).unwrap_or(0);
    let counted = after.wrapping_sub(before) & COUNTING_MASK;
    selftest::check_advance(counted)?;
    Ok(counted)
}

/// Mask for the difference of two counter reads: wider than the counting
/// period.
const COUNTING_MASK: u64 = (1 << 40) - 1;

/// What the start-up check measured, and its verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckReport {
    /// Instructions counted over the workload (0 when the check stopped
    /// before counting).
    pub counted: u64,
    /// Period of the overflow phase.
    pub period: u64,
    /// PMIs taken in the overflow phase (0 when it did not run).
    pub pmis: u64,
    /// Usable, or why not.
    pub verdict: Verdict,
}

impl CheckReport {
    /// PMIs the overflow phase should have seen.
    pub fn expected_pmis(&self) -> u64 {
        self.counted / self.period.max(1)
    }
}

/// The whole start-up check of the PMU described by `info`, on `hw`:
///
/// 1. detection (nothing is touched when CPUID advertises no PMU);
/// 2. counting: instructions (OS and USR) counted while `work(hw, None)`
///    runs must advance;
/// 3. overflow: instructions sampled every `period` with the LVT entry as
///    NMI while `work(hw, Some(driver))` runs the same workload; `pmis()`
///    (read before and after) counts the PMIs the handler took, which must
///    be about `counted / period`.
///
/// `work` gets the driver of the overflow phase so that a caller can
/// hand it to its PMI handler (on the target: publish it for the NMI
/// handler for the duration of the workload; for a simulator: call
/// `handle_pmi` when the simulator raises a PMI). The counters are stopped
/// and the LVT entry masked when this returns.
pub fn startup_check<H: PmuHw>(
    info: &PmuInfo,
    hw: &mut H,
    period: u64,
    work: &mut dyn FnMut(&mut H, Option<&mut PmuDriver>),
    pmis: &dyn Fn() -> u64,
) -> CheckReport {
    let mut report = CheckReport {
        counted: 0,
        period,
        pmis: 0,
        verdict: Verdict::Usable,
    };
    let counted = match count_instructions(info, hw, &mut |h| work(h, None)) {
        Ok(n) => n,
        Err(reason) => {
            if let Reason::CountersDead { counted } = reason {
                report.counted = counted;
            }
            hw.write_lvt_pmi(LVT_MASKED);
            report.verdict = Verdict::Fallback(reason);
            return report;
        }
    };
    report.counted = counted;
    let ev = [EventConfig {
        event: Event::new(EventKind::Instructions),
        mode: SampleMode::Period(period),
    }];
    let mut d = match PmuDriver::new(info) {
        Ok(d) => d,
        Err(_) => {
            report.verdict = Verdict::Fallback(Reason::NotDetected("no PMU driver for this CPU"));
            return report;
        }
    };
    if d.configure(hw, None, &ev, &IntelOptions::default())
        .is_err()
    {
        hw.write_lvt_pmi(LVT_MASKED);
        report.verdict = Verdict::Fallback(Reason::NotDetected(
            "the instructions event cannot be sampled",
        ));
        return report;
    }
    let before = pmis();
    d.start(hw);
    work(hw, Some(&mut d));
    d.stop(hw);
    hw.write_lvt_pmi(LVT_MASKED);
    report.pmis = pmis().wrapping_sub(before);
    report.verdict = overflow_verdict(info, counted, period, report.pmis);
    report
}

/// Start-up check, overflow phase: the caller has run the same workload
/// with instructions sampled at `period` and counted the PMIs its NMI
/// handler took.
pub fn overflow_verdict(info: &PmuInfo, counted: u64, period: u64, pmis: u64) -> Verdict {
    selftest::verdict(info, counted, period, pmis)
}
