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
use core::sync::atomic::{AtomicU8, Ordering};
use sampler::event::{self as sev, EventSource, PmuCaps};
use sampler::pebs::{DecodeConfig, MemKind};

/// The hardware PMU while it samples.
pub(super) struct HwState {
    pub(super) driver: PmuDriver,
    pub(super) hw: CpuPmu,
    pub(super) dec: Decoding,
    pub(super) pebs: bool,
}

pub(super) const HW_OFF: u8 = 0;

pub(super) const HW_ON: u8 = 1;

pub(super) const HW_STOPPING: u8 = 2;

pub(super) static HW_STATE: AtomicU8 = AtomicU8::new(HW_OFF);

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

/// The hardware path's counters so far, summed over the CPUs.
pub fn hw_stats() -> HwStats {
    let mut sum = [0u64; 6];
    for (_, slot) in percpu::every_slot() {
        for (t, c) in sum.iter_mut().zip(slot.counters()) {
            *t += c.load(Ordering::Relaxed);
        }
    }
    let [
        pmis,
        samples,
        with_branches,
        pebs_decoded,
        pebs_lost,
        unknown_nmis,
    ] = sum;
    HwStats {
        pmis,
        samples,
        with_branches,
        pebs_decoded,
        pebs_lost,
        unknown_nmis,
    }
}

/// Zeroes the hardware path's counters (self-test, outside NMI context).
pub fn reset_hw_stats() {
    for (_, slot) in percpu::every_slot() {
        for c in slot.counters() {
            c.store(0, Ordering::Relaxed);
        }
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
    let slot = percpu::boot_slot();
    if HW_STATE.load(Ordering::Acquire) != HW_OFF || sim_active() || slot.is_live() {
        return Err(HwError::Busy);
    }
    if !info.has_pmu() {
        return Err(HwError::Pmu(PmuError::NoPmu));
    }
    // SAFETY: on the boot CPU outside NMI context (the set-up's caller),
    // and its slot is not live (checked above).
    let mut mem = unsafe { slot.setup_memory() };
    let st = program_hw(info, cfgs, branches, &mut mem)?;
    let (pebs, lbr) = (st.pebs, st.dec.lbr.is_some());
    let source = if info.vendor == Vendor::Amd {
        EventSource::AmdPmu
    } else {
        EventSource::IntelPmu
    };
    let perf = describe(cfgs, info, lbr, branches);
    let mut configs = [NO_CONFIG; MAX_EVENTS];
    configs[..cfgs.len()].copy_from_slice(cfgs);
    let pebs_index = cfgs.iter().position(|c| uses_pebs(&c.event, info.vendor));
    set_pebs_event(pebs_index.unwrap_or(0));
    profile::route_nmis_to_the_pmu();
    // SAFETY: as above.
    unsafe { slot.publish_hw(st) };
    percpu::set_plan(percpu::Plan {
        sim: None,
        configs,
        n: cfgs.len(),
        branches,
    });
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

/// Programs this CPU's PMU for `cfgs` as [`setup_hw`] describes, its
/// PEBS records going to `mem`, without starting it (outside NMI context).
pub(super) fn program_hw(
    info: &PmuInfo,
    cfgs: &[EventConfig],
    branches: u64,
    mem: &mut DsMemory<'_>,
) -> Result<HwState, HwError> {
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
    let mut r = driver.configure(&mut hw, pebs.then_some(&mut *mem), cfgs, &opts);
    if r == Err(PmuError::LbrUnavailable) {
        opts.lbr = None;
        r = driver.configure(&mut hw, pebs.then_some(&mut *mem), cfgs, &opts);
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
    Ok(HwState {
        driver,
        hw,
        dec,
        pebs,
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
    // SAFETY: on the boot CPU outside NMI context (the caller), and
    // HW_STATE is STOPPING, so its NMI handler no longer touches the
    // state. The other CPUs stop theirs at their next PMI.
    if let Some(mut st) = unsafe { percpu::boot_slot().take_hw() } {
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
    let Some(slot) = percpu::slot_of(cap.cpu) else {
        return false;
    };
    match HW_STATE.load(Ordering::Acquire) {
        HW_ON => {}
        HW_STOPPING | HW_OFF if slot.is_live() => {
            // Sampling stopped on the boot CPU: this CPU stops its own
            // counters at its first NMI after.
            // SAFETY: this CPU's NMI handler, and its slot is live.
            if let Some(mut st) = unsafe { slot.take_hw() } {
                st.driver.stop(&mut st.hw);
                st.hw.mask_lvt_pmi();
            }
            return !clock_running;
        }
        HW_STOPPING => return !clock_running,
        _ => return false,
    }
    if !slot.is_live() {
        return false;
    }
    // SAFETY: this CPU's NMI handler, and its slot is live.
    let Some((st, mut mem)) = (unsafe { slot.hw_in_nmi() }) else {
        return false;
    };
    let mut emit = |x: &Extra<'_>| {
        if sampling {
            profile::pmu_overflow(cap, entry_tsc, x);
        }
    };
    let s = service_pmi(
        &mut st.driver,
        &mut st.hw,
        st.pebs.then_some(&mut mem),
        entry_tsc,
        &st.dec,
        &mut emit,
    );
    if profile::throttled(cap.cpu) {
        // Throttled: the counter stops until the next tick (the NMI clock).
        st.driver.stop(&mut st.hw);
    }
    slot.samples
        .fetch_add(u64::from(s.samples), Ordering::Relaxed);
    slot.with_branches
        .fetch_add(u64::from(s.with_branches), Ordering::Relaxed);
    slot.pebs_decoded
        .fetch_add(u64::from(s.pebs_decoded), Ordering::Relaxed);
    let lost = s.pebs_lost();
    if lost > 0 {
        slot.pebs_lost_total
            .fetch_add(u64::from(lost), Ordering::Relaxed);
        slot.pebs_lost.fetch_add(u64::from(lost), Ordering::Relaxed);
    }
    if s.summary.spurious {
        if clock_running {
            return false;
        }
        slot.unknown_nmis
            .fetch_add(u64::from(!s.summary.late), Ordering::Relaxed);
        return true;
    }
    slot.pmis.fetch_add(1, Ordering::Relaxed);
    true
}
