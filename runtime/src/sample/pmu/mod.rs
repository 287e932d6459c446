//! The PMU overflow sources on the target, sharing one glue path
//! ([`service_pmi`]: the driver's `handle_pmi`, then every overflow as a
//! sample, each PEBS record its own sample, the LBR stack as its branch
//! stack):
//!
//! - `pmu=auto` on a CPU with a PMU: the start-up check ([`startup_check`]:
//!   counters advance over a workload of known size, overflow NMIs arrive
//!   near the programmed period), then the real driver on [`CpuPmu`]
//!   samples the chosen event and its PMIs are the NMIs ([`setup_hw`],
//!   [`on_nmi`]); when the check fails, the reason is printed and the NMI
//!   clock is used.
//! - `pmu=sim`: the real Intel driver against the simulated PMU, with the
//!   simulator advanced by the NMI clock. The simulator is only ever
//!   selected by `pmu=sim`; the real path never touches it.
//!
//! The parts: [`sim`] (the simulated PMU, advanced by the NMI clock),
//! [`hw`] (the real PMU while it samples), [`check`] (the start-up check)
//! and [`service`] (the PMI glue both sources share); this module decides
//! at boot which one runs and reports it.
//!
//! Every CPU samples with its own PMU state ([`percpu`]): the boot CPU
//! decides and programs its own, and each CPU started after programs the
//! same for itself.

use crate::sample::profile::{self};
use arch_x86::cpuid::{PmuInfo, Vendor};
use arch_x86::pmu::driver::CheckReport;
use arch_x86::pmu::ds::{DsArea, DsMemory};
use arch_x86::pmu::events::EventSampling;
use arch_x86::pmu::selftest::Verdict;
use arch_x86::pmu::sim::SimCpu;
use arch_x86::pmu::{Event, EventConfig, PmuError, SampleMode};
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use kcore::cmdline::EventList;

pub mod check;
pub mod hw;
pub mod percpu;
pub mod service;
pub mod sim;

pub use arch_x86::pmu::perf::{
    DEFAULT_EVENT, caps_of, lbr_config, perf_event, sample_mode, uses_pebs,
};

/// `branch_sample_type` without `branch=`: every branch in both modes.
pub const DEFAULT_BRANCHES: u64 = sampler::event::branch_type::ANY
    | sampler::event::branch_type::USER
    | sampler::event::branch_type::KERNEL;
pub use check::*;
pub use hw::*;
pub use percpu::{prepare_cpu, report_cpus, start_this_cpu};
pub use service::*;
pub use sim::*;

/// Bytes of the PEBS buffer.
pub(super) const PEBS_BYTES: usize = 16 * 1024;

pub(super) struct BufCell(pub(super) UnsafeCell<[u8; PEBS_BYTES]>);

// SAFETY: the check's buffer: used only by whoever holds `CHECK_BUSY`.
unsafe impl Sync for BufCell {}

/// The index of the event PEBS losses are counted against: the first
/// precise event of the set.
static PEBS_EVENT: AtomicU32 = AtomicU32::new(0);

pub(super) fn set_pebs_event(i: usize) {
    PEBS_EVENT.store(i as u32, Ordering::Relaxed);
}

/// The event (index, which is its id) whose samples PEBS losses are: the
/// first precise event of the set.
pub fn pebs_event() -> u32 {
    PEBS_EVENT.load(Ordering::Relaxed)
}

/// PEBS samples lost on `cpu` since the last call (collisions, unusable
/// records).
pub fn take_pebs_lost(cpu: &crate::cpu::CpuLocal) -> u64 {
    percpu::slot_of(cpu).map_or(0, |s| s.pebs_lost.swap(0, Ordering::Relaxed))
}

/// NMI context, at a tick on `cpu` that unthrottled the event: restart the
/// counters the throttle stopped there (the hardware PMU's or the
/// simulator's).
pub fn unthrottle(cpu: &crate::cpu::CpuLocal) {
    let Some(slot) = percpu::slot_of(cpu).filter(|s| s.is_live()) else {
        return;
    };
    if HW_STATE.load(Ordering::Acquire) == HW_ON {
        // SAFETY: this is `cpu`'s NMI handler and the slot is live.
        if let Some((st, _)) = unsafe { slot.hw_in_nmi() } {
            st.driver.start(&mut st.hw);
        }
    } else if sim_active() {
        // SAFETY: as above.
        if let Some((st, _)) = unsafe { slot.sim_in_nmi() } {
            st.driver.start(&mut st.clock.sim);
        }
    }
}

/// What the boot decided about the overflow source, kept so it can be
/// reported once the console is set up (after Hello in wire mode). Lives
/// once on the boot stack; there is no allocator to box the large variant.
#[derive(Clone, Copy, Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Boot {
    /// `pmu=sim`: the simulated PMU (its events: none for the default
    /// precise mem-loads), or why it could not be set up.
    Sim(Result<HwSetup, PmuError>),
    /// `pmu=off`.
    Off,
    /// `pmu=auto` without a PMU (CPUID): why.
    NoPmu(&'static str),
    /// `pmu=auto` in the self-test: the `pmu_hardware` test exercises the
    /// PMU; the NMI clock drives the other tests.
    SelfTest(PmuInfo),
    /// `pmu=auto`: the start-up check failed.
    CheckFailed(CheckReport),
    /// `pmu=auto`: the check passed but no event could be programmed.
    SetupFailed(CheckReport, HwError),
    /// `pmu=auto`: the PMU samples.
    Hardware {
        /// The detected PMU.
        info: PmuInfo,
        /// The start-up check.
        report: CheckReport,
        /// What is sampled.
        setup: HwSetup,
        /// The `event=` set refused by the driver: the event that did not
        /// fit, and why (then cycles).
        refused: Option<(Event, HwError)>,
    },
}

impl Boot {
    /// The overflow source for Hello and the profile.
    pub fn source(&self) -> profile::Source {
        match self {
            Boot::Sim(Ok(s)) => profile::Source::Simulated(s.caps),
            Boot::Hardware { setup, .. } => profile::Source::Pmu(setup.caps),
            _ => profile::Source::NmiClock,
        }
    }

    /// True when the hardware PMU's overflows are the samples (the NMI
    /// clock then only ticks for the throttle).
    pub fn hardware(&self) -> bool {
        matches!(self, Boot::Hardware { .. })
    }
}

/// The event of `set` a refusal `e` names (the first when it names none).
fn refused_event(set: &[Event], e: HwError) -> Event {
    let i = match e {
        HwError::Pmu(
            PmuError::NoCounter { event }
            | PmuError::EventUnavailable { event }
            | PmuError::BadPeriod { event },
        ) => event,
        _ => 0,
    };
    set.get(i).or(set.first()).copied().unwrap_or(DEFAULT_EVENT)
}

/// Decides the overflow source for `cfg.pmu` (after the IDT is loaded,
/// before the NMI clock starts): `pmu=auto` with a PMU runs the start-up
/// check and, when it passes, starts sampling `cfg.events` (one counter
/// each; cycles when there are none or the set is refused) at
/// `cfg.freq_hz` or every `cfg.period` events, its LBR filtered by
/// `cfg.branch`.
pub fn boot(cfg: &kcore::cmdline::Config, info: &PmuInfo, tsc_hz: u64, sim: SimCpu) -> Boot {
    use kcore::cmdline::PmuMode;
    let branches = cfg.branch.unwrap_or(DEFAULT_BRANCHES);
    match cfg.pmu {
        PmuMode::Sim => {
            return Boot::Sim(setup_sim(sim, &cfg.events, cfg.period, branches));
        }
        PmuMode::Off => return Boot::Off,
        PmuMode::Auto => {}
    }
    if let Some(why) = info.missing_reason() {
        return Boot::NoPmu(why);
    }
    if cfg.selftest {
        return Boot::SelfTest(*info);
    }
    let report = startup_check(info);
    if report.verdict != Verdict::Usable {
        return Boot::CheckFailed(report);
    }
    // Each event's own `/period=N/` or `/freq=N/`, else `period=`, else
    // `freq=`.
    let start = |evs: &EventList| {
        let mut cfgs = [NO_CONFIG; profile::MAX_EVENTS];
        for (i, (c, ev)) in cfgs.iter_mut().zip(evs.as_slice()).enumerate() {
            let pebs = uses_pebs(ev, info.vendor);
            let mode = match (evs.sampling(i), cfg.period) {
                (Some(EventSampling::Period(p)), _) | (None, Some(p)) => SampleMode::Period(p),
                (Some(EventSampling::Freq(hz)), _) => sample_mode(ev, pebs, tsc_hz, hz),
                (None, None) => sample_mode(ev, pebs, tsc_hz, cfg.freq_hz),
            };
            *c = EventConfig { event: *ev, mode };
        }
        setup_hw(info, &cfgs[..evs.as_slice().len()], branches)
    };
    let default = EventList::of(&[DEFAULT_EVENT]);
    let wanted = if cfg.events.is_empty() {
        &default
    } else {
        &cfg.events
    };
    let (setup, refused) = match start(wanted) {
        Ok(s) => (s, None),
        Err(e) if *wanted != default => match start(&default) {
            Ok(s) => (s, Some((refused_event(wanted.as_slice(), e), e))),
            Err(e2) => return Boot::SetupFailed(report, e2),
        },
        Err(e) => return Boot::SetupFailed(report, e),
    };
    Boot::Hardware {
        info: *info,
        report,
        setup,
        refused,
    }
}

pub(super) fn vendor_name(v: Vendor) -> &'static str {
    match v {
        Vendor::Intel => "Intel",
        Vendor::Amd => "AMD",
        Vendor::Other => "unknown-vendor",
    }
}

/// The events of `s` with their periods or frequencies, for the boot log:
/// `cycles (frequency mode, Hz 1000), instructions:u (period 100000)`.
struct EventsNote<'a>(&'a HwSetup);

impl core::fmt::Display for EventsNote<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        for (i, c) in self.0.configs().iter().enumerate() {
            let (how, n) = match c.mode {
                SampleMode::Period(p) => ("period", p),
                SampleMode::Frequency { hz, .. } => ("frequency mode, Hz", u64::from(hz)),
            };
            let sep = if i > 0 { ", " } else { "" };
            write!(f, "{sep}{} ({how} {n})", c.event)?;
        }
        Ok(())
    }
}

/// The simulated PMU's capabilities, for the boot log: `v5, 8 GP + 4
/// fixed counters, PEBS format ..., LBR format ... x 32`.
struct SimCapsNote<'a>(&'a HwSetup);

impl core::fmt::Display for SimCapsNote<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let c = &self.0.caps;
        write!(
            f,
            "v{}, {} GP + {} fixed counters, PEBS format {:?}, LBR format {:?} x {}",
            c.version, c.gp_counters, c.fixed_counters, c.pebs_format, c.lbr_format, c.lbr_depth
        )
    }
}

/// `event=`'s list, comma-separated.
struct ListNote<'a>(&'a [Event]);

impl core::fmt::Display for ListNote<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            write!(f, "{}{e}", if i > 0 { "," } else { "" })?;
        }
        Ok(())
    }
}

/// Prints what [`boot`] decided: which overflow source is in use and why.
pub fn report_boot(b: &Boot, events: &EventList) {
    let check = |r: &CheckReport| {
        crate::kprintln!(
            "perch: PMU start-up check: {} instructions counted over a workload of {}; overflow phase at period {}: {} PMIs (expected about {})",
            r.counted,
            CHECK_INSTRUCTIONS,
            r.period,
            r.pmis,
            r.expected_pmis()
        );
    };
    match b {
        Boot::Sim(Ok(s)) if s.n > 0 => crate::kprintln!(
            "perch: pmu=sim: SIMULATED PMU ({}); events {}, driven by the NMI clock",
            SimCapsNote(s),
            EventsNote(s)
        ),
        Boot::Sim(Ok(s)) => crate::kprintln!(
            "perch: pmu=sim: SIMULATED PMU ({}); precise mem-loads period {}, driven by the NMI clock",
            SimCapsNote(s),
            sim_period()
        ),
        Boot::Sim(Err(e)) => crate::kprintln!(
            "perch: pmu=sim: simulated PMU not set up: {e}; overflow source: NMI clock"
        ),
        Boot::Off => crate::kprintln!("perch: pmu=off; overflow source: NMI clock (cpu-clock)"),
        Boot::NoPmu(why) => {
            crate::kprintln!("perch: {why}; falling back to the NMI clock (cpu-clock)")
        }
        Boot::SelfTest(info) => crate::kprintln!(
            "perch: PMU found ({} v{}, {} GP + {} fixed counters); the self-test checks it in pmu_hardware; overflow source for the other tests: NMI clock",
            vendor_name(info.vendor),
            info.version,
            info.gp_counters,
            info.fixed_counters()
        ),
        Boot::CheckFailed(r) => {
            check(r);
            if let Verdict::Fallback(reason) = r.verdict {
                crate::kprintln!("perch: PMU start-up check failed: {reason}");
            }
            crate::kprintln!("perch: overflow source: NMI clock (cpu-clock)");
        }
        Boot::SetupFailed(r, e) => {
            check(r);
            crate::kprintln!(
                "perch: PMU start-up check passed, but no event could be programmed: {e}; falling back to the NMI clock (cpu-clock)"
            );
        }
        Boot::Hardware {
            info,
            report,
            setup,
            refused,
        } => {
            check(report);
            if let Some((ev, e)) = refused {
                if events.as_slice().len() > 1 {
                    crate::kprintln!(
                        "perch: event={} refused ({ev}: {e}); sampling cycles instead",
                        ListNote(events.as_slice())
                    );
                } else {
                    crate::kprintln!("perch: event={} refused: {e}; sampling cycles instead", ev);
                }
            }
            crate::kprintln!(
                "perch: overflow source: {} PMU (v{}, {} GP x {} bits + {} fixed counters); event {}; PEBS {}; LBR {}; the NMI clock is not started",
                vendor_name(info.vendor),
                info.version,
                info.gp_counters,
                info.gp_width,
                info.fixed_counters(),
                EventsNote(setup),
                match (setup.pebs, info.pebs_format) {
                    (true, Some(f)) => FmtOpt::Format(f),
                    (false, Some(_)) => FmtOpt::Unused,
                    _ => FmtOpt::Absent,
                },
                if setup.lbr {
                    LbrNote::On(info.lbr_depth())
                } else {
                    LbrNote::Absent
                },
            );
        }
    }
    let simulated = matches!(b, Boot::Sim(Ok(_)));
    if !events.is_empty() && !b.hardware() && !simulated {
        crate::kprintln!(
            "perch: event={} ignored: the hardware PMU is not the overflow source",
            ListNote(events.as_slice())
        );
    }
}

enum FmtOpt {
    Format(u8),
    Unused,
    Absent,
}

impl core::fmt::Display for FmtOpt {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            FmtOpt::Format(n) => write!(f, "records format {n}"),
            FmtOpt::Unused => write!(f, "present, not used by this event"),
            FmtOpt::Absent => write!(f, "absent"),
        }
    }
}

enum LbrNote {
    On(u8),
    Absent,
}

impl core::fmt::Display for LbrNote {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            LbrNote::On(d) => write!(f, "branch stacks x {d}"),
            LbrNote::Absent => write!(f, "absent"),
        }
    }
}

/// At the end of a run: the hardware path's counters, unknown NMIs included.
pub fn report_end() {
    let s = hw_stats();
    if s.pmis + s.unknown_nmis == 0 {
        return;
    }
    crate::kprintln!(
        "perch: PMU: {} PMIs, {} samples ({} with a branch stack, {} from PEBS records, {} PEBS records lost); {} unknown NMIs",
        s.pmis,
        s.samples,
        s.with_branches,
        s.pebs_decoded,
        s.pebs_lost,
        s.unknown_nmis
    );
}
