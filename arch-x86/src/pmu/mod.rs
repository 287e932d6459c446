//! PMU drivers: Intel architectural perfmon (v1-v5) with PEBS and LBR, the AMD
//! core PMU with LbrExtV2, the simulated PMU they are tested against, and the
//! start-up self-check.
//!
//! Drivers reach the hardware only through [`Msr`], [`Lvt`] and the DS memory
//! in [`ds::DsMemory`]; they hand raw PEBS bytes and raw LBR values to the
//! caller (which decodes them with `sampler::pebs` / `sampler::lbr`) and never
//! build perf samples themselves.
//!
//! # Using the drivers
//!
//! 1. `cpuid::detect(&CpuCpuid, &mut msr)` gives a [`crate::cpuid::PmuInfo`];
//!    `selftest::check_detected` turns a missing PMU into a fallback reason.
//! 2. Build `intel::IntelPmu` or `amd::AmdPmu` from it, `configure` the
//!    events (names parsed by `events::parse`) and `start`.
//! 3. Self-check: `driver::startup_check(info, hw, period, work, pmis)`
//!    counts instructions over a workload with a period too long to
//!    overflow (counters advance), then samples the same workload at
//!    `period` counting the PMIs the handler took (overflows arrive near the
//!    period). On `Verdict::Fallback(reason)` print the reason and use the
//!    NMI clock. On the target the hardware is `hw::CpuPmu`.
//! 4. In the NMI handler: `handle_pmi(hw, mem, tsc, &mut |ov| ..)`. For each
//!    [`Overflow`], decode `ov.pebs` with `sampler::pebs::decode` (its GPRs
//!    become REGS_INTR, and REGS_USER when the IP is a user address; its IP
//!    is the sample IP) and `ov.lbr` with `sampler::lbr::to_stack`. Count
//!    `PmiSummary::pebs_lost` as LOST_SAMPLES. Before stopping, drain the
//!    rest with `IntelPmu::flush_pebs`.
//! 5. `pmu=sim`: `sim::SimClock::new(SimCpu::sapphire_rapids(), n)` (or
//!    `skylake()`, `ice_lake()`, or `SimCpu::from_row` of a
//!    [`models::INTEL_MODELS`] row) and the
//!    same driver with `&mut clock.sim` as the hardware; on each NMI-clock
//!    tick call `clock.on_tick(mem, ip, user, regs)` and, when it returns
//!    true, `clock.sim.take_pmi()` and the driver's `handle_pmi` as above.
//!    The stream must mark such a run as simulated.

pub mod amd;
pub mod driver;
pub mod ds;
pub mod events;
pub mod hw;
pub mod intel;
pub mod lbr;
pub mod models;
pub mod perf;
pub mod selftest;
pub mod sim;

use crate::msr::Msr;
pub use events::{Event, EventError, EventKind};
pub use lbr::{LbrRawFormat, RawBranch};

/// Local APIC LVT Performance Monitoring Counter entry (SDM vol. 3 "Local
/// Vector Table"): mode NMI, unmasked. The CPU sets the mask bit when it
/// delivers a PMI, so the handler writes this again on every PMI.
pub const LVT_PMI_NMI: u32 = 0b100 << 8;
/// LVT mask bit.
pub const LVT_MASKED: u32 = 1 << 16;

/// Write the local APIC's LVT performance-counter entry (xAPIC offset 0x340 or
/// x2APIC MSR 0x834).
pub trait Lvt {
    /// Write `entry` to the LVT performance-counter register.
    fn write_lvt_pmi(&mut self, entry: u32);
}

/// What a driver needs from the machine: MSRs and the LVT entry.
pub trait PmuHw: Msr + Lvt {}
impl<T: Msr + Lvt> PmuHw for T {}

/// How an event's sampling period is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleMode {
    /// A fixed number of events between samples.
    Period(u64),
    /// A target number of samples per second; the period is adapted at each
    /// overflow from the elapsed TSC time.
    Frequency {
        /// Samples per second wanted.
        hz: u32,
        /// TSC ticks per second.
        tsc_hz: u64,
    },
}

/// One event to sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventConfig {
    /// What to count.
    pub event: Event,
    /// Period or frequency.
    pub mode: SampleMode,
}

/// Period used first in frequency mode, before any overflow was timed.
pub const FREQ_START_PERIOD: u64 = 10_000;

/// Next period in frequency mode: scale the last one by how far the measured
/// interval was from the wanted one, by at most a factor of 2 each step, and
/// stay in `[1, max]`.
pub fn next_frequency_period(
    last_period: u64,
    elapsed_tsc: u64,
    hz: u32,
    tsc_hz: u64,
    max: u64,
) -> u64 {
    if hz == 0 || tsc_hz == 0 {
        return last_period.clamp(1, max);
    }
    let want = (tsc_hz / u64::from(hz)).max(1);
    let elapsed = elapsed_tsc.max(1);
    let scaled = (u128::from(last_period) * u128::from(want) / u128::from(elapsed)) as u64;
    let lo = (last_period / 2).max(1);
    let hi = last_period.saturating_mul(2);
    scaled.clamp(lo, hi).clamp(1, max)
}

/// A counter a configured event sits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    /// General-purpose counter n.
    Gp(u8),
    /// Intel fixed counter n.
    Fixed(u8),
}

impl Counter {
    /// Bit of this counter in IA32_PERF_GLOBAL_CTRL / STATUS.
    pub fn global_bit(self) -> u64 {
        match self {
            Counter::Gp(n) => 1 << n,
            Counter::Fixed(n) => 1 << (32 + u32::from(n)),
        }
    }
}

/// Why an event set could not be programmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PmuError {
    /// No PMU was detected.
    NoPmu,
    /// More events than fit at once, or an event whose allowed counters are taken.
    NoCounter {
        /// Index of the event that did not fit.
        event: usize,
    },
    /// The event needs PEBS, which this CPU does not offer.
    PebsUnavailable,
    /// PEBS record format not known to the decoder: PEBS is disabled.
    PebsUnknownFormat(u8),
    /// The event is not available on this CPU.
    EventUnavailable {
        /// Index of the event.
        event: usize,
    },
    /// Branch stacks requested but there is no LBR.
    LbrUnavailable,
    /// A period of zero, or one larger than the counter can hold.
    BadPeriod {
        /// Index of the event.
        event: usize,
    },
    /// The DS area or PEBS buffer is too small or misaligned.
    BadDsMemory,
    /// The PMU is already programmed for sampling.
    InUse,
}

impl core::fmt::Display for PmuError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PmuError::NoPmu => write!(f, "no PMU detected"),
            PmuError::NoCounter { event } => {
                write!(f, "event {event}: no free counter can count it")
            }
            PmuError::PebsUnavailable => {
                write!(f, "precise sampling (PEBS) is not available on this CPU")
            }
            PmuError::PebsUnknownFormat(n) => {
                write!(f, "unknown PEBS record format {n}; PEBS disabled")
            }
            PmuError::EventUnavailable { event } => {
                write!(f, "event {event} is not available on this CPU")
            }
            PmuError::LbrUnavailable => {
                write!(f, "branch stacks requested but this CPU has no usable LBR")
            }
            PmuError::BadPeriod { event } => {
                write!(f, "event {event}: period is zero or wider than the counter")
            }
            PmuError::BadDsMemory => write!(f, "DS area or PEBS buffer too small or misaligned"),
            PmuError::InUse => write!(f, "the PMU is already programmed for sampling"),
        }
    }
}

/// One overflow reported by a driver's PMI handler.
#[derive(Debug, Clone, Copy)]
pub struct Overflow<'a> {
    /// Index of the event in the configured set.
    pub event: usize,
    /// Events counted since the previous sample of this event.
    pub period: u64,
    /// The raw PEBS record (one record per `Overflow`) when the event is precise.
    pub pebs: Option<&'a [u8]>,
    /// PEBS record format number, meaningful when `pebs` is set.
    pub pebs_format: u8,
    /// Raw LBR entries at the PMI, newest first (empty without LBR).
    pub lbr: &'a [RawBranch],
    /// How `lbr` is encoded.
    pub lbr_format: LbrRawFormat,
}

/// What one PMI contained, for statistics and loss accounting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PmiSummary {
    /// Overflows reported (PEBS records included).
    pub overflows: u32,
    /// PEBS records drained.
    pub pebs_records: u32,
    /// PEBS samples lost to collisions or unusable records (LOST_SAMPLES).
    pub pebs_lost: u32,
    /// The PMI found nothing to report (e.g. a late or shared NMI).
    pub spurious: bool,
    /// A `spurious` NMI that the driver claims as a late NMI of a PMI it
    /// already handled (AMD: an overflow handled in an earlier NMI still
    /// raises its own; Linux `amd_pmu_adjust_nmi_window`): benign, not an
    /// unknown NMI.
    pub late: bool,
}
