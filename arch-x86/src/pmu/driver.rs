//! One driver type for whichever PMU was detected, so the runtime's glue
//! (start-up check, NMI handler, `pmu=sim`) does not care about the vendor.

use super::amd::AmdPmu;
use super::ds::DsMemory;
use super::events::{Event, EventKind};
use super::intel::{IntelOptions, IntelPmu};
use super::lbr::LbrRawFormat;
use super::selftest::{self, Reason, Verdict};
use super::{EventConfig, Overflow, PmiSummary, PmuError, PmuHw, SampleMode};
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
    d.start(hw);
    work(hw);
    d.stop(hw);
    let counted = d.events_since_reload(hw, 0).unwrap_or(0);
    selftest::check_advance(counted)?;
    Ok(counted)
}

/// Start-up check, overflow phase: the caller has run the same workload
/// with instructions sampled at `period` and counted the PMIs its NMI
/// handler took.
pub fn overflow_verdict(info: &PmuInfo, counted: u64, period: u64, pmis: u64) -> Verdict {
    selftest::verdict(info, counted, period, pmis)
}
