//! Start-up self-check of the PMU: detection, counters that really advance,
//! and overflow NMIs that arrive near the programmed period. When any step
//! fails the verdict says why, and the caller falls back to the NMI clock.

use crate::cpuid::PmuInfo;

/// Outcome of the PMU self-check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The PMU works: sample with it.
    Usable,
    /// Fall back to the NMI clock, for this reason.
    Fallback(Reason),
}

/// Why the PMU is not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// CPUID advertises no PMU.
    NotDetected(&'static str),
    /// A counter did not move while work ran (an emulated or disabled PMU).
    CountersDead {
        /// Events counted over the workload.
        counted: u64,
    },
    /// Overflow NMIs did not arrive as programmed.
    OverflowOff {
        /// NMIs expected for the counted events and period.
        expected: u64,
        /// NMIs that arrived.
        observed: u64,
    },
}

impl core::fmt::Display for Reason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Reason::NotDetected(why) => write!(f, "{why}; falling back to the NMI clock"),
            Reason::CountersDead { counted } => write!(
                f,
                "PMU counters do not advance ({counted} events counted over the workload); falling back to the NMI clock"
            ),
            Reason::OverflowOff { expected, observed } => write!(
                f,
                "PMU overflow NMIs do not arrive at the programmed period (expected about {expected}, got {observed}); \
                 falling back to the NMI clock"
            ),
        }
    }
}

/// Least number of events a counter must show after the workload.
pub const MIN_COUNTED: u64 = 1000;

/// Step 1: detection.
pub fn check_detected(info: &PmuInfo) -> Result<(), Reason> {
    match info.missing_reason() {
        Some(why) => Err(Reason::NotDetected(why)),
        None => Ok(()),
    }
}

/// Step 2: a counter read after a workload of known size must have advanced.
pub fn check_advance(counted: u64) -> Result<(), Reason> {
    if counted < MIN_COUNTED {
        Err(Reason::CountersDead { counted })
    } else {
        Ok(())
    }
}

/// Step 3: `counted` events at `period` should have raised about
/// `counted / period` NMIs; accept within a quarter (plus one for the
/// partial period at each end).
pub fn check_overflow(counted: u64, period: u64, observed: u64) -> Result<(), Reason> {
    let expected = counted / period.max(1);
    let slack = expected / 4 + 1;
    if expected == 0 || observed + slack < expected || observed > expected + slack {
        Err(Reason::OverflowOff { expected, observed })
    } else {
        Ok(())
    }
}

/// All three steps over measured values.
pub fn verdict(info: &PmuInfo, counted: u64, period: u64, nmis: u64) -> Verdict {
    let r = check_detected(info)
        .and_then(|()| check_advance(counted))
        .and_then(|()| check_overflow(counted, period, nmis));
    match r {
        Ok(()) => Verdict::Usable,
        Err(reason) => Verdict::Fallback(reason),
    }
}
