//! The real PMU while it samples: set-up, the NMI handler's part, stop,
//! and the hardware path's counters (statics: see the parent module's docs).

use super::*;
use crate::sample::nmi::NmiContext;
use crate::sample::profile::{self, Extra, MAX_EVENTS, PmuEvent};
use arch_x86::cpuid::{LbrKind, PmuInfo, Vendor};
use arch_x86::frame::TrapFrame;
use arch_x86::pmu::driver::PmuDriver;
use arch_x86::pmu::ds::DsMemory;
use arch_x86::pmu::events::{self, MemEvent};
use arch_x86::pmu::hw::CpuPmu;
use arch_x86::pmu::intel::IntelOptions;
use arch_x86::pmu::{Event, EventConfig, PmuError, SampleMode};
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use sampler::event::{self as sev, EventSource, PmuCaps};
use sampler::pebs::{DecodeConfig, MemKind};

/// The hardware PMU while it samples.
pub(super) struct HwState {
    pub(super) driver: PmuDriver,
    pub(super) hw: CpuPmu,
    pub(super) dec: Decoding,
    pub(super) pebs: bool,
}

pub(super) struct HwCell(pub(super) UnsafeCell<Option<HwState>>);

// SAFETY: see the parent module's docs: filled before HW_STATE publishes it,
// afterwards used only from (non-nesting, single-CPU) NMI context until
// `stop_hw` withdraws it.
unsafe impl Sync for HwCell {}

pub(super) static HW: HwCell = HwCell(UnsafeCell::new(None));

pub(super) const HW_OFF: u8 = 0;

pub(super) const HW_ON: u8 = 1;

pub(super) const HW_STOPPING: u8 = 2;

pub(super) static HW_STATE: AtomicU8 = AtomicU8::new(HW_OFF);

pub(super) static HW_PMIS: AtomicU64 = AtomicU64::new(0);

pub(super) static HW_SAMPLES: AtomicU64 = AtomicU64::new(0);

pub(super) static HW_BRANCH_SAMPLES: AtomicU64 = AtomicU64::new(0);

pub(super) static HW_PEBS_DECODED: AtomicU64 = AtomicU64::new(0);

pub(super) static HW_PEBS_LOST: AtomicU64 = AtomicU64::new(0);

pub(super) static UNKNOWN_NMIS: AtomicU64 = AtomicU64::new(0);

/// Counters of the hardware path (NMI context counts, anyone reads).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HwStats {
    /// PMIs that reported at least one overflow.
    pub pmis: u64,
    /// Samples produced (one per overflow, one per PEBS record).
    pub samples: u64,
    /// Samples with a non-empty branch stack.
    pub with_branches: u64,
    /// PEBS records decoded into samples.
    pub pebs_decoded: u64,
    /// PEBS records lost (collisions, unusable or refused records).
    pub pebs_lost: u64,
    /// NMIs that were neither a PMI nor (while it runs) the NMI clock's.
    pub unknown_nmis: u64,
}

/// The hardware path's counters so far.
pub fn hw_stats() -> HwStats {
    HwStats {
        pmis: HW_PMIS.load(Ordering::Relaxed),
        samples: HW_SAMPLES.load(Ordering::Relaxed),
        with_branches: HW_BRANCH_SAMPLES.load(Ordering::Relaxed),
        pebs_decoded: HW_PEBS_DECODED.load(Ordering::Relaxed),
        pebs_lost: HW_PEBS_LOST.load(Ordering::Relaxed),
        unknown_nmis: UNKNOWN_NMIS.load(Ordering::Relaxed),
    }
}

/// Zeroes the hardware path's counters (self-test, outside NMI context).
pub fn reset_hw_stats() {
    for c in [
        &HW_PMIS,
        &HW_SAMPLES,
        &HW_BRANCH_SAMPLES,
        &HW_PEBS_DECODED,
        &HW_PEBS_LOST,
        &UNKNOWN_NMIS,
    ] {
        c.store(0, Ordering::Relaxed);
    }
}

/// True while the hardware PMU samples (its PMIs are NMIs).
pub fn hw_active() -> bool {
    HW_STATE.load(Ordering::Acquire) == HW_ON
}

/// This CPU's PMU handle; `None` when its local APIC is globally disabled.
pub(super) fn cpu_pmu() -> Option<CpuPmu> {
    // SAFETY: the runtime runs at CPL 0; the drivers name only MSRs that
    // CPUID advertised (their contract with `PmuInfo`); `paging::init`
    // identity-maps the APIC window uncached; the LVT performance-counter
    // entry is written only by this module (and masked by `clock::start`
    // before any PMU use); handles used in NMI context re-arm it as the
    // interrupted code expects.
    unsafe { CpuPmu::new() }
}

/// Why the hardware PMU could not be set up for sampling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HwError {
    /// Already sampling, or `pmu=sim` owns the PMU state.
    Busy,
    /// The local APIC is globally disabled: no PMI can be delivered.
    ApicOff,
    /// The driver refused the event.
    Pmu(PmuError),
}

impl core::fmt::Display for HwError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            HwError::Busy => write!(f, "the PMU is already in use"),
            HwError::ApicOff => write!(
                f,
                "the local APIC is disabled (IA32_APIC_BASE), so no PMI can be delivered"
            ),
            HwError::Pmu(e) => write!(f, "{e}"),
        }
    }
}

/// What [`setup_hw`] programmed.
#[derive(Clone, Copy, Debug)]
pub struct HwSetup {
    /// The capabilities for Hello (source IntelPmu / AmdPmu).
    pub caps: PmuCaps,
    /// The events sampled (`configs[..n]`), each with its period or
    /// frequency, one counter each.
    pub configs: [EventConfig; MAX_EVENTS],
    /// How many events.
    pub n: usize,
    /// PEBS records are decoded into samples.
    pub pebs: bool,
    /// Samples carry the LBR stack.
    pub lbr: bool,
    /// The events as perf describes them, with the `PERF_SAMPLE_*` bits
    /// the PMU adds to each one's samples (`perf[..n]`); see
    /// `profile::configure_hw`.
    pub perf: [PmuEvent; MAX_EVENTS],
}

impl HwSetup {
    /// The events programmed, in index order.
    pub fn configs(&self) -> &[EventConfig] {
        &self.configs[..self.n]
    }

    /// perf's descriptions of the events, in index order.
    pub fn perf_events(&self) -> &[PmuEvent] {
        &self.perf[..self.n]
    }
}

/// An unused entry of [`HwSetup::perf`].
pub(super) const NO_PMU_EVENT: PmuEvent = PmuEvent {
    perf: sev::EventConfig::cpu_clock(0, 1),
    sample_type: 0,
};

/// An unused entry of [`HwSetup::configs`].
pub(super) const NO_CONFIG: EventConfig = EventConfig {
    event: DEFAULT_EVENT,
    mode: SampleMode::Period(1),
};

/// The PEBS records' memory kind of `ev` on the CPU of `info` (a store
/// event's records read as its model's: `IntelModel::store_kind`).
pub(super) fn mem_kind(ev: &Event, info: &PmuInfo) -> MemKind {
    match events::encode(ev.kind, info.vendor).map(|e| e.mem) {
        Some(MemEvent::Load) => MemKind::Load,
        Some(MemEvent::Store) => info.row().store_kind(),
        _ => MemKind::None,
    }
}

/// perf's descriptions of `cfgs` on the CPU of `info` (see
/// [`HwSetup::perf`]): PEBS where [`uses_pebs`], branch stacks of the
/// classes in `branches` with `lbr`.
pub(super) fn describe(
    cfgs: &[EventConfig],
    info: &PmuInfo,
    lbr: bool,
    branches: u64,
) -> [PmuEvent; MAX_EVENTS] {
    let vendor = info.vendor;
    let mut perf = [NO_PMU_EVENT; MAX_EVENTS];
    for (p, c) in perf.iter_mut().zip(cfgs) {
        let pebs = uses_pebs(&c.event, vendor);
        let (mut e, sample_type) = perf_event(
            &c.event,
            c.mode,
            vendor,
            pebs,
            mem_kind(&c.event, info),
            lbr,
        );
        if lbr {
            e.branch_sample_type = branches;
        }
        *p = PmuEvent {
            perf: e,
            sample_type,
        };
    }
    perf
}

/// Programs the real PMU to sample the events of `cfgs`, one counter each
/// with its own period or frequency (with LBR branch stacks of the classes
/// in `branches` (perf's `branch_sample_type`) when the CPU has LBR, PEBS
/// for the precise events), and starts it; its PMIs are then the NMIs,
/// each overflowed counter a sample of its event. A set the counters
/// cannot hold is refused (`PmuError::NoCounter` names the event).
/// Outside NMI context, after the start-up check.
pub fn setup_hw(info: &PmuInfo, cfgs: &[EventConfig], branches: u64) -> Result<HwSetup, HwError> {
    if HW_STATE.load(Ordering::Acquire) != HW_OFF || sim_active() {
        return Err(HwError::Busy);
    }
    if !info.has_pmu() {
        return Err(HwError::Pmu(PmuError::NoPmu));
    }
    let mut hw = cpu_pmu().ok_or(HwError::ApicOff)?;
    hw.software_enable();
    let mut driver = PmuDriver::new(info).map_err(HwError::Pmu)?;
    if cfgs.is_empty() || cfgs.len() > MAX_EVENTS {
        return Err(HwError::Pmu(PmuError::NoCounter { event: MAX_EVENTS }));
    }
    let pebs_index = cfgs.iter().position(|c| uses_pebs(&c.event, info.vendor));
    let pebs = pebs_index.is_some();
    let mut opts = IntelOptions {
        lbr: (info.lbr != LbrKind::None).then(|| lbr_config(branches)),
        ..Default::default()
    };
    // SAFETY: HW_STATE is off and `pmu=sim` is not set up (checked above),
    // so neither NMI path refers to the PEBS buffer; this is the only
    // reference until the state is published.
    let buf = unsafe { &mut *PEBS_BUF.0.get() };
    buf.fill(0);
    let mut mem = DsMemory::new(&AREA, buf);
    let mut r = driver.configure(&mut hw, pebs.then_some(&mut mem), cfgs, &opts);
    if r == Err(PmuError::LbrUnavailable) {
        opts.lbr = None;
        r = driver.configure(&mut hw, pebs.then_some(&mut mem), cfgs, &opts);
    }
    r.map_err(HwError::Pmu)?;
    // PEBS records decode as the first precise event's.
    let mem_kind = pebs_index.map_or(MemKind::None, |i| mem_kind(&cfgs[i].event, info));
    let dec = Decoding {
        pebs: match (pebs, info.pebs_format) {
            (true, Some(f)) => Some(DecodeConfig {
                format: arch_x86::pmu::perf::pebs_format(f),
                mem: mem_kind,
                // The latency word splits in two from format 5 (Alder
                // Lake / Sapphire Rapids) on.
                split_latency: f >= 5,
                data_source: info.pebs_data_source(),
                pebs_trap: info.pebs_trap(),
            }),
            _ => None,
        },
        lbr: arch_x86::pmu::perf::lbr_format(driver.lbr_format()),
    };
    let lbr = dec.lbr.is_some();
    let source = if info.vendor == Vendor::Amd {
        EventSource::AmdPmu
    } else {
        EventSource::IntelPmu
    };
    let perf = describe(cfgs, info, lbr, branches);
    let mut configs = [NO_CONFIG; MAX_EVENTS];
    configs[..cfgs.len()].copy_from_slice(cfgs);
    set_pebs_event(pebs_index.unwrap_or(0));
    // SAFETY: HW_STATE is off: nothing else refers to the cell.
    let st = unsafe { &mut *HW.0.get() }.insert(HwState {
        driver,
        hw,
        dec,
        pebs,
    });
    // Started before it is published: the smallest period is
    // `MIN_PERIOD` events, far more than the two stores below take.
    profile::route_nmis_to_the_pmu();
    st.driver.start(&mut st.hw);
    HW_STATE.store(HW_ON, Ordering::Release);
    Ok(HwSetup {
        caps: caps_of(info, source),
        configs,
        n: cfgs.len(),
        pebs,
        lbr,
        perf,
    })
}

/// Stops hardware sampling and masks the LVT entry (outside NMI context).
pub fn stop_hw() {
    if HW_STATE
        .compare_exchange(HW_ON, HW_STOPPING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    // SAFETY: HW_STATE is STOPPING, so the NMI handler no longer touches
    // the state (the parent module's docs); this is the only reference.
    if let Some(mut st) = unsafe { &mut *HW.0.get() }.take() {
        st.driver.stop(&mut st.hw);
        st.hw.mask_lvt_pmi();
    }
    HW_STATE.store(HW_OFF, Ordering::Release);
}

/// Masks the LVT entry when the PMU is in use (sampling or being checked),
/// touching no driver state: for the crash exit.
pub fn mask_pmis() {
    let in_use = HW_STATE.load(Ordering::Acquire) != HW_OFF || CHECK_PHASE.load(Ordering::Acquire);
    if in_use && let Some(mut hw) = cpu_pmu() {
        hw.mask_lvt_pmi();
    }
}

/// NMI context: the PMU's part of one NMI, interrupting `frame`. Services
/// a PMI of the start-up check or of hardware sampling (samples go to
/// `profile::push_sample` when `sampling`). Returns true when the NMI was
/// the PMU's business and must not be taken as an NMI-clock tick: a PMI,
/// or (while the NMI clock does not run) an NMI nobody claims, which is
/// counted as unknown. Called only once the PMU may raise PMIs
/// (`profile::route_nmis_to_the_pmu`). NMI-safe: atomics and bounded
/// copies only.
pub fn on_nmi(frame: &TrapFrame, entry_tsc: u64, sampling: bool) -> bool {
    on_pmu_nmi(
        &crate::sample::nmi::context(frame),
        entry_tsc,
        sampling,
        crate::sample::clock::running(),
    )
}

#[inline(never)]
pub(super) fn on_pmu_nmi(
    cap: &NmiContext<'_>,
    entry_tsc: u64,
    sampling: bool,
    clock_running: bool,
) -> bool {
    if CHECK_PHASE.load(Ordering::Acquire) {
        return on_check_nmi(entry_tsc, clock_running);
    }
    match HW_STATE.load(Ordering::Acquire) {
        HW_ON => {}
        HW_STOPPING => return !clock_running,
        _ => return false,
    }
    // SAFETY: HW_ON was seen, so setup finished; NMI context is the only
    // user until `stop_hw`, and NMIs do not nest (the parent module's docs).
    let Some(st) = (unsafe { &mut *HW.0.get() }).as_mut() else {
        return false;
    };
    let mut emit = |x: &Extra<'_>| {
        if sampling {
            profile::pmu_overflow(cap, entry_tsc, x);
        }
    };
    let s = if st.pebs {
        // SAFETY: as above, for the PEBS buffer (only the hardware path
        // uses it once HW_ON is set).
        let buf = unsafe { &mut *PEBS_BUF.0.get() };
        let mut mem = DsMemory::new(&AREA, buf);
        service_pmi(
            &mut st.driver,
            &mut st.hw,
            Some(&mut mem),
            entry_tsc,
            &st.dec,
            &mut emit,
        )
    } else {
        service_pmi(
            &mut st.driver,
            &mut st.hw,
            None,
            entry_tsc,
            &st.dec,
            &mut emit,
        )
    };
    if profile::throttled(cap.cpu) {
        // Throttled: the counter stops until the next tick (the NMI clock).
        st.driver.stop(&mut st.hw);
    }
    HW_SAMPLES.fetch_add(u64::from(s.samples), Ordering::Relaxed);
    HW_BRANCH_SAMPLES.fetch_add(u64::from(s.with_branches), Ordering::Relaxed);
    HW_PEBS_DECODED.fetch_add(u64::from(s.pebs_decoded), Ordering::Relaxed);
    let lost = s.pebs_lost();
    if lost > 0 {
        HW_PEBS_LOST.fetch_add(u64::from(lost), Ordering::Relaxed);
        PEBS_LOST.fetch_add(u64::from(lost), Ordering::Relaxed);
    }
    if s.summary.spurious {
        if clock_running {
            return false;
        }
        UNKNOWN_NMIS.fetch_add(u64::from(!s.summary.late), Ordering::Relaxed);
        return true;
    }
    HW_PMIS.fetch_add(1, Ordering::Relaxed);
    true
}
