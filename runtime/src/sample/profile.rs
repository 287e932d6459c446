//! Profiling on the target: the NMI-context sampler glue (interrupted
//! context -> a `sampler::capture::RawSample` written straight into the
//! claimed slot of the per-CPU ring: header words, trap frames copied as
//! they are, walked IPs), the event and throttle configuration the path
//! reads, and the return-to-user store of `uregs=return`. The drain that
//! empties the ring onto the wire, and the End counters, are in
//! `crate::stream::drain`.
//!
//! The overflow source has one seam, [`Source`]: the NMI clock
//! (`cpu-clock`), where every NMI is one overflow; the hardware PMU, whose
//! PMIs are the NMIs; or the simulated PMU driven by the NMI clock.

use crate::cpu::CpuLocal;
use crate::sample::nmi::NmiContext;
use arch_x86::frame::{Mode, TrapFrame};
use arch_x86::gdt;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use sampler::capture::{DeferredUserRegs, RawFrame, RawSample, raw_flags};
use sampler::drain::NmiRecord;
use sampler::event::{EventConfig, PmuCaps, sample_type as st};
use sampler::regs::{GPR_MASK, RegFile};
use sampler::ring::{FilledRing, Ring};
use sampler::sample::MAX_CALLCHAIN;
use sampler::throttle::{EventThrottle, OverflowAction, Throttle, ThrottleConfig};
use sampler::walk::WalkRange;
use sampler::wire::ThrottleEvent;

/// Ring slots (the usable capacity can be lowered with `ring=N`).
pub const RING_SLOTS: usize = 256;
/// Most runtime frames walked per sample.
const MAX_KERNEL_FRAMES: usize = 16;
/// Most user frames walked per sample.
const MAX_USER_FRAMES: usize = 32;
/// Records written per drain step, so a drain never runs unbounded.
pub(crate) const DRAIN_BATCH: usize = 64;

/// What drives the overflows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The periodic NMI clock: the `cpu-clock` event.
    NmiClock,
    /// `pmu=sim`: the simulated PMU driven by the NMI clock (see `crate::sample::pmu`).
    Simulated(PmuCaps),
    /// `pmu=auto` with a usable PMU: its overflow NMIs (see `crate::sample::pmu`).
    Pmu(PmuCaps),
}

/// PMU data for one sample (see `crate::sample::pmu`); [`Extra::NONE`] for the NMI clock.
pub struct Extra<'a> {
    /// The index of the sample's event (the counter that overflowed) in
    /// the set [`events`] describes; 0 for the NMI clock.
    pub event: u8,
    /// The period this sample stands for; 0 for the NMI clock, whose
    /// period is the time since its previous tick ([`clock_period`]).
    pub period: u64,
    /// PEBS IP.
    pub precise_ip: Option<u64>,
    /// PEBS GPRs.
    pub pebs_regs: Option<&'a RegFile>,
    /// LBR stack.
    pub branches: Option<&'a sampler::sample::BranchStack>,
    /// PEBS memory fields.
    pub mem: Option<sampler::sample::MemInfo>,
}

impl Extra<'_> {
    /// No PMU data (a constant, so the NMI clock's path passes it without
    /// building one).
    pub const NONE: Extra<'static> = Extra {
        event: 0,
        period: 0,
        precise_ip: None,
        pebs_regs: None,
        branches: None,
        mem: None,
    };
}

/// The TSC when sampling started and stopped, for the achieved rate.
static STARTED_TSC: AtomicU64 = AtomicU64::new(0);
static STOPPED_TSC: AtomicU64 = AtomicU64::new(0);
/// [`clock_overflows`] when sampling started.
static OVERFLOWS_AT_START: AtomicU64 = AtomicU64::new(0);

/// NMI context, one tick of the NMI clock: the nanoseconds since
/// the previous tick, the PERIOD of its sample (cpu-clock semantics: the
/// time the sample stands for, so that perf's counts stay true when ticks
/// come late or are missed; a tick whose sample is throttled or lost keeps
/// its own time, counted with it).
/// `now` is the tick's time in ns (the sample's TIME).
#[inline(always)]
fn clock_period(s: &CpuSampling, now: u64) -> u64 {
    now.wrapping_sub(s.last_tick_ns.swap(now, Ordering::Relaxed))
}

/// NMI context: the sample of the tick at `tsc` is not written (throttled,
/// or the ring is full). A clock tick's time goes with it, so the next
/// sample's period starts here; a PMU sample (`x.period` set) has nothing
/// to account.
#[inline(always)]
fn drop_clock_time(s: &CpuSampling, x: &Extra<'_>, tsc: u64) {
    if x.period == 0 {
        let _ = clock_period(s, crate::time::tsc_to_ns(tsc));
    }
}

/// Which fields a sample carries (`sample=` on the command line).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleSet {
    /// IP, TID, TIME, CPU, PERIOD, REGS_USER (20 GPRs) and CALLCHAIN.
    Default,
    /// The default plus REGS_INTR (20 GPRs).
    Full,
    /// IP, TID, TIME, CPU and PERIOD only.
    Minimal,
}

/// One CPU's part of sampling: its ring, its throttle, its throttle tick
/// and its counters. The NMI path touches only its own CPU's ([`of`]).
pub struct CpuSampling {
    /// The CPU's index.
    cpu: u32,
    /// The records its NMIs queued for the drain.
    pub(crate) ring: FilledRing<NmiRecord, RING_SLOTS>,
    /// Its throttle (limits and CPU-time budget) and the sampled event's
    /// throttle state.
    throttle: ThrottleCell,
    /// TSC value at which its next throttle tick starts.
    next_tick_tsc: AtomicU64,
    /// The time (ns) of the NMI clock's previous tick here while sampling.
    last_tick_ns: AtomicU64,
    /// Overflows of event 0 suppressed while throttled, not yet sent in a
    /// Lost record (the others' are in `event_throttled_pending`).
    pub(crate) throttled_pending: AtomicU64,
    /// Overflows suppressed while throttled, in all.
    pub(crate) throttled_total: AtomicU64,
    /// Throttle and Unthrottle records queued in the ring (they pass
    /// through the ring's counters but are not samples).
    pub(crate) throttle_records: AtomicU64,
    /// Throttle and Unthrottle records dropped because the ring was full.
    throttle_records_dropped: AtomicU64,
    /// NMI-clock overflows taken while sampling on the inline path (the
    /// common one: the clock samples, nothing else routed).
    fast_overflows: AtomicU64,
    /// Of those, the ones that took no sample (throttled, or a mode the
    /// event excludes): the rest are the samples whose cost the path
    /// measured, so it counts them with no instruction of its own.
    fast_unsampled: AtomicU64,
    /// NMIs that took the routed path (every NMI but the inline path's).
    routed_nmis: AtomicU64,
    /// NMI-clock overflows taken while sampling on the routed path.
    routed_overflows: AtomicU64,
    /// Samples the routed path measured.
    routed_measured: AtomicU64,
    /// TSC ticks from NMI entry to the end of the push, over every sample
    /// measured.
    nmi_cost_tsc: AtomicU64,
    /// Ring losses of events 1.. (the NMI side counts them next to the
    /// ring's own count; the drain splits the ring's losses by them).
    pub(crate) event_ring_lost: [AtomicU64; MAX_EVENTS],
    /// Overflows of events 1.. suppressed while throttled, not yet sent in
    /// a Lost record.
    pub(crate) event_throttled_pending: [AtomicU64; MAX_EVENTS],
}

impl core::fmt::Debug for CpuSampling {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CpuSampling")
            .field("ring", &self.ring)
            .finish_non_exhaustive()
    }
}

impl CpuSampling {
    /// The boot CPU's, a static: every ring slot starts as an empty sample,
    /// so the NMI path never initialises one.
    const fn boot() -> Self {
        CpuSampling {
            cpu: 0,
            ring: Ring::new_filled(),
            throttle: ThrottleCell(UnsafeCell::new((
                Throttle::new(ThrottleConfig {
                    max_sample_rate: u64::MAX,
                    cpu_time_max_percent: 0,
                    tick_hz: TICK_HZ,
                }),
                EventThrottle::new(),
            ))),
            next_tick_tsc: AtomicU64::new(0),
            last_tick_ns: AtomicU64::new(0),
            throttled_pending: AtomicU64::new(0),
            throttled_total: AtomicU64::new(0),
            throttle_records: AtomicU64::new(0),
            throttle_records_dropped: AtomicU64::new(0),
            fast_overflows: AtomicU64::new(0),
            fast_unsampled: AtomicU64::new(0),
            routed_nmis: AtomicU64::new(0),
            routed_overflows: AtomicU64::new(0),
            routed_measured: AtomicU64::new(0),
            nmi_cost_tsc: AtomicU64::new(0),
            event_ring_lost: per_event(),
            event_throttled_pending: per_event(),
        }
    }

    /// The throttle (see `ThrottleCell`).
    #[inline(always)]
    pub(crate) fn throttle(&self) -> &(Throttle, EventThrottle) {
        // SAFETY: see `ThrottleCell`.
        unsafe { &*self.throttle.0.get() }
    }
}

static BOOT_SAMPLING: CpuSampling = CpuSampling::boot();

/// The boot CPU's sampling state.
#[inline(always)]
pub fn boot_sampling() -> &'static CpuSampling {
    &BOOT_SAMPLING
}

/// The sampling state of the CPU `cpu` describes.
#[inline(always)]
pub(crate) fn of(cpu: &CpuLocal) -> &'static CpuSampling {
    // SAFETY: every CPU's `sampling` points at its `CpuSampling` before it
    // can take an NMI or run the drain (`configure` for the boot CPU,
    // before the IDT is loaded; `prepare_cpu` for the others, before they
    // start), and the state lives for the rest of the run.
    unsafe { &*(cpu.sampling.get() as *const CpuSampling) }
}

/// Every CPU's sampling state, the boot CPU's first.
pub(crate) fn every_cpu() -> impl Iterator<Item = (u32, &'static CpuSampling)> {
    (0..crate::smp::online()).filter_map(|i| crate::smp::cpu(i).map(|c| (i, of(c))))
}

/// The usable ring capacity `ring=` set (every CPU's ring gets it).
static RING_CAP: AtomicUsize = AtomicUsize::new(RING_SLOTS);

/// Gives CPU `local` (not yet started) its sampling state: a ring with the
/// capacity in force and the throttle as configured. False when the heap
/// has no room (the CPU is then not started). Registered with
/// `cpu::set_prepare`.
pub fn prepare_cpu(local: &'static CpuLocal) -> bool {
    let layout = core::alloc::Layout::new::<CpuSampling>();
    // SAFETY: the layout is not zero-sized.
    let p = unsafe { alloc::alloc::alloc_zeroed(layout) } as *mut CpuSampling;
    if p.is_null() {
        return false;
    }
    // SAFETY: `p` is zeroed memory for a `CpuSampling`, used by no one
    // else yet: zero is a valid value of every field but the ring (which
    // `init_filled` makes, every slot an empty record, as the boot CPU's)
    // and the throttle (written whole); the block is never freed.
    let s = unsafe {
        Ring::init_filled(&raw mut (*p).ring);
        (&raw mut (*p).cpu).write(local.index);
        (&raw mut (*p).throttle).write(ThrottleCell(UnsafeCell::new((
            Throttle::new(throttle_config()),
            EventThrottle::new(),
        ))));
        &*p
    };
    if s.ring
        .set_capacity(RING_CAP.load(Ordering::Relaxed))
        .is_err()
    {
        return false;
    }
    // SAFETY: the CPU has not started: nothing reads its block yet.
    unsafe { local.sampling.set((s as *const CpuSampling).cast()) };
    true
}
/// Samples parked until the next return to user mode (`uregs=return`).
static PARKED: DeferredUserRegs<PARKED_SLOTS> = DeferredUserRegs::new();
/// Parked samples at most; more in one stay in the runtime get ABI_NONE.
const PARKED_SLOTS: usize = 16;
/// `uregs=return` is in force.
static AT_RETURN: AtomicBool = AtomicBool::new(false);
static SAMPLE_TYPE: AtomicU64 = AtomicU64::new(0);
static REGS_USER: AtomicU64 = AtomicU64::new(0);
static REGS_INTR: AtomicU64 = AtomicU64::new(0);
static FREQ_HZ: AtomicU64 = AtomicU64::new(1);
/// The NMI clock's nominal period (ns), from the rate programmed.
static PERIOD_NS: AtomicU64 = AtomicU64::new(0);
/// `period=`: the event's fixed period (0: frequency mode).
static PERIOD_ATTR: AtomicU64 = AtomicU64::new(0);
/// `branch_sample_type` of the simulated PMU's branch stacks (`branch=`).
static BRANCHES: AtomicU64 = AtomicU64::new(crate::sample::pmu::DEFAULT_BRANCHES);
static NOT_SAMPLED: AtomicU64 = AtomicU64::new(0);
/// Modes the event excludes ([`EXCLUDE_USER`], [`EXCLUDE_KERNEL`]).
static EXCLUDE: AtomicU32 = AtomicU32::new(0);
const EXCLUDE_USER: u32 = 1;
const EXCLUDE_KERNEL: u32 = 2;
static SIMULATED: AtomicBool = AtomicBool::new(false);
/// How an NMI is routed, one load on the NMI path: the clock's role in the
/// low bits, what an NMI-clock NMI that is not a PMI does:
/// [`CLOCK_SAMPLES`] (the `cpu-clock` event), [`CLOCK_DRIVES_SIM`]
/// (`pmu=sim`) or [`CLOCK_TICKS_ONLY`] (the hardware PMU samples; the
/// clock is the throttle's tick); and [`PMU_NMIS`] once the PMU may raise
/// PMIs (its start-up check or hardware sampling), so that every NMI asks
/// the PMU first; [`NOT_SAMPLING`] while sampling is off (the one
/// record of it: see [`sampling`]); and [`OBSERVED`] once an NMI observer
/// is registered (the self-test's), whose calls the fast path leaves out;
/// [`FORWARD`] when the boot CPU sends each clock tick on to the others
/// (`fanout=ipi`). 0, the NMI clock sampling with no PMU and no observer, is the fast path.
static ROUTE: AtomicU8 = AtomicU8::new(CLOCK_SAMPLES | NOT_SAMPLING);
const CLOCK_SAMPLES: u8 = 0;
const CLOCK_DRIVES_SIM: u8 = 1;
const CLOCK_TICKS_ONLY: u8 = 2;
const CLOCK_ROLE: u8 = 3;
const PMU_NMIS: u8 = 4;
const NOT_SAMPLING: u8 = 8;
const OBSERVED: u8 = 16;
const FORWARD: u8 = 32;

/// `fanout=ipi`: the boot CPU sends every clock NMI on to the other CPUs
/// (`clock::forward_tick`), on the routed path. Never cleared.
pub(crate) fn route_clock_through_the_boot_cpu() {
    ROUTE.fetch_or(FORWARD, Ordering::SeqCst);
}

/// An NMI observer is registered: from now on every NMI takes the routed
/// path, after which the dispatch calls the observers. Never cleared.
pub(crate) fn route_nmis_to_observers() {
    ROUTE.fetch_or(OBSERVED, Ordering::SeqCst);
}

/// Whether sampling is on ([`start`] to [`stop`]); Acquire, so a caller
/// that sees it on sees the configuration stored before.
fn sampling() -> bool {
    ROUTE.load(Ordering::Acquire) & NOT_SAMPLING == 0
}

/// Sets the clock's role in [`ROUTE`], keeping [`PMU_NMIS`].
fn set_clock_role(role: u8) {
    let _ = ROUTE.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |r| {
        Some(r & !CLOCK_ROLE | role)
    });
}

/// Before the PMU may raise its first PMI (the start-up check, hardware
/// sampling): from now on every NMI asks the PMU whether it was a PMI. Never
/// cleared: after the PMU stops, its late PMIs still reach it.
pub(crate) fn route_nmis_to_the_pmu() {
    ROUTE.fetch_or(PMU_NMIS, Ordering::SeqCst);
}

/// Which exclusions and deferrals [`push_sample`] must look at; 0 (the
/// default event) skips them all with one test. Kept by [`update_path`].
static PATH: AtomicU32 = AtomicU32::new(0);
/// The event excludes user samples.
const PATH_EXCLUDE_USER: u32 = EXCLUDE_USER;
/// The event excludes runtime samples.
const PATH_EXCLUDE_KERNEL: u32 = EXCLUDE_KERNEL;
/// REGS_USER with `uregs=return`: runtime samples wait for the return.
const PATH_DEFER: u32 = 4;

/// Recomputes [`PATH`] from the configuration atomics; every setter of
/// them calls it (before sampling starts).
fn update_path() {
    let defer = SAMPLE_TYPE.load(Ordering::Relaxed) & st::REGS_USER != 0
        && AT_RETURN.load(Ordering::Relaxed);
    PATH.store(
        EXCLUDE.load(Ordering::Relaxed) | if defer { PATH_DEFER } else { 0 },
        Ordering::Relaxed,
    );
}
pub(crate) static PEBS_LOST_TOTAL: AtomicU64 = AtomicU64::new(0);
static HW_EVENTS: HwEventCell = HwEventCell(UnsafeCell::new(heapless::Vec::new()));
static HW_EVENT_SET: AtomicBool = AtomicBool::new(false);
/// `PERF_SAMPLE_*` bits the PMU events added to the sample set (each
/// event's description keeps only its own, [`events`]).
static PMU_ADDED: AtomicU64 = AtomicU64::new(0);

/// Most events sampled at once (one counter each): the wire's.
pub const MAX_EVENTS: usize = sampler::wire::MAX_EVENTS;
const _: () = assert!(MAX_EVENTS == kcore::cmdline::MAX_EVENTS && MAX_EVENTS.is_power_of_two());

/// A per-event counter array.
const fn per_event() -> [AtomicU64; MAX_EVENTS] {
    [const { AtomicU64::new(0) }; MAX_EVENTS]
}

/// Per event of a set of several: the modes it excludes ([`EXCLUDE_USER`],
/// [`EXCLUDE_KERNEL`]), checked on the PMU's path ([`pmu_overflow`]); a
/// single event's are in [`EXCLUDE`], on the common path.
static EVENT_EXCLUDE: [AtomicU32; MAX_EVENTS] = [const { AtomicU32::new(0) }; MAX_EVENTS];

/// One PMU event of the sampled set: how perf describes it (kind, config,
/// sampling, modes, precise, branch types) and the `PERF_SAMPLE_*` bits
/// its PMU adds to the sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PmuEvent {
    /// perf's description.
    pub perf: EventConfig,
    /// Bits the PMU adds (BRANCH_STACK with LBR; REGS_INTR, ADDR, WEIGHT,
    /// DATA_SRC with PEBS).
    pub sample_type: u64,
}

/// Timer ticks per second for throttling (perf's `HZ`); the tick is
/// derived from the TSC in the NMI handler.
pub const TICK_HZ: u64 = 1000;
/// TSC ticks per throttle tick (0: throttling not configured yet).
static TICK_TSC: AtomicU64 = AtomicU64::new(0);
/// `max_rate=` as configured (0: no limit).
static MAX_RATE_CONFIGURED: AtomicU32 = AtomicU32::new(0);
/// `cpu_pct=` as configured.
static CPU_PCT_CONFIGURED: AtomicU32 = AtomicU32::new(0);

/// A CPU's throttle (limits and CPU-time budget) and its sampled event's
/// throttle state (one event per CPU), replaced by [`configure_throttle`]
/// only while sampling is off.
struct ThrottleCell(UnsafeCell<(Throttle, EventThrottle)>);
// SAFETY: written only by `configure_throttle` (and `prepare_cpu`, before
// its CPU starts), outside NMI context and while sampling is off; the NMI
// path reads it only after seeing sampling on (ROUTE, Acquire). Each CPU's
// is used by that CPU's NMIs alone, and an NMI runs to completion before
// the code it interrupted resumes, so no reader overlaps a write.
unsafe impl Sync for ThrottleCell {}

/// The PMU's events, written once by [`configure_hw`] / [`configure_sim`]
/// before sampling starts and only read afterwards.
struct HwEventCell(UnsafeCell<heapless::Vec<PmuEvent, MAX_EVENTS>>);
// SAFETY: written once, before HW_EVENT_SET is published (Release); read
// only after seeing it (Acquire), never written again.
unsafe impl Sync for HwEventCell {}

fn hw_events() -> &'static [PmuEvent] {
    if !HW_EVENT_SET.load(Ordering::Acquire) {
        return &[];
    }
    // SAFETY: see `HwEventCell`.
    unsafe { &*HW_EVENTS.0.get() }
}

/// The events in force, in index order (Hello's, the samples' event
/// index), each with its id (its index), rebuilt from atomics (Hello and
/// the drain; the NMI path reads the atomics it needs directly). One
/// event on the NMI clock and the default simulated PMU; one per counter
/// on a PMU.
pub fn events() -> heapless::Vec<EventConfig, MAX_EVENTS> {
    let base = base_event();
    let mut out = heapless::Vec::new();
    let hw = hw_events();
    if hw.is_empty() {
        let _ = out.push(base);
        return out;
    }
    let added = PMU_ADDED.load(Ordering::Relaxed);
    for (i, h) in hw.iter().enumerate() {
        let mut e = base;
        e.count_as(&h.perf);
        e.id = i as u32;
        // The fields another event's PMU added are not this one's.
        e.sample_type &= !(added & !h.sample_type);
        if !e.has(st::REGS_INTR) {
            e.regs_intr = 0;
        }
        let _ = out.push(e);
    }
    out
}

/// The first (often the only) event in force (see [`events`]).
pub fn event() -> EventConfig {
    events()[0]
}

/// The event without the PMU's descriptions.
fn base_event() -> EventConfig {
    let mut e = EventConfig::cpu_clock(0, FREQ_HZ.load(Ordering::Relaxed));
    match PERIOD_ATTR.load(Ordering::Relaxed) {
        0 => {}
        p => e.sampling = sampler::event::Sampling::Period(p),
    }
    e.sample_type = SAMPLE_TYPE.load(Ordering::Relaxed);
    let exclude = EXCLUDE.load(Ordering::Relaxed);
    e.exclude_user = exclude & EXCLUDE_USER != 0;
    e.exclude_kernel = exclude & EXCLUDE_KERNEL != 0;
    e.regs_user = REGS_USER.load(Ordering::Relaxed);
    e.regs_intr = REGS_INTR.load(Ordering::Relaxed);
    if AT_RETURN.load(Ordering::Relaxed) && e.has(st::REGS_USER) {
        e.user_regs_mode = sampler::event::UserRegsMode::AtReturnToUser;
    }
    if SIMULATED.load(Ordering::Relaxed) {
        e.kind = sampler::event::EventKind::Raw;
        e.config = crate::sample::pmu::SIM_RAW_CONFIG;
        e.sampling = sampler::event::Sampling::Period(crate::sample::pmu::sim_period());
        e.precise = 2;
        e.branch_sample_type = BRANCHES.load(Ordering::Relaxed);
    }
    e
}

/// The modes `perf` excludes, as [`EXCLUDE_USER`] / [`EXCLUDE_KERNEL`] bits.
fn exclude_bits(perf: &EventConfig) -> u32 {
    let user = if perf.exclude_user { EXCLUDE_USER } else { 0 };
    user | if perf.exclude_kernel {
        EXCLUDE_KERNEL
    } else {
        0
    }
}

/// Records the PMU's `events` (at most [`MAX_EVENTS`]; once): their
/// descriptions, the fields they add to the sample, and the modes they
/// exclude. Samples that skid across the privilege boundary a counter
/// filters on are dropped (and counted), as perf drops them: a single
/// event's on the common path, each event's of a set on the PMU's.
fn set_pmu_events(events: &[PmuEvent]) {
    if HW_EVENT_SET.load(Ordering::Acquire) || events.is_empty() {
        return;
    }
    // SAFETY: not yet published, and called once at boot before sampling
    // starts: nothing reads the cell yet.
    let cell = unsafe { &mut *HW_EVENTS.0.get() };
    let mut union = 0;
    for (i, e) in events.iter().take(MAX_EVENTS).enumerate() {
        let _ = cell.push(*e);
        union |= e.sample_type;
        let x = if events.len() > 1 {
            exclude_bits(&e.perf)
        } else {
            0
        };
        EVENT_EXCLUDE[i].store(x, Ordering::Relaxed);
    }
    HW_EVENT_SET.store(true, Ordering::Release);
    let single = if events.len() == 1 {
        exclude_bits(&events[0].perf)
    } else {
        0
    };
    EXCLUDE.store(single, Ordering::Relaxed);
    let before = SAMPLE_TYPE.fetch_or(union, Ordering::Relaxed);
    PMU_ADDED.store(union & !before, Ordering::Relaxed);
    if union & st::REGS_INTR != 0 {
        REGS_INTR.store(GPR_MASK, Ordering::Relaxed);
    }
    update_path();
}

/// `pmu=auto` with a usable PMU: samples of event `i` describe
/// `events[i]` (its kind, config, sampling, modes, precise and branch
/// types) and carry the fields its PMU adds (BRANCH_STACK with LBR;
/// REGS_INTR, and ADDR / WEIGHT / DATA_SRC for memory events, with PEBS).
/// Once, before [`start`].
pub fn configure_hw(events: &[PmuEvent]) {
    set_pmu_events(events);
    set_clock_role(CLOCK_TICKS_ONLY);
}

/// `pmu=sim`: samples carry the PMU fields (BRANCH_STACK, ADDR, WEIGHT,
/// DATA_SRC, REGS_INTR) of the simulated precise `mem-loads` event; with
/// `events` (`event=` under `pmu=sim`), those of each event, described
/// as [`configure_hw`] does.
pub fn configure_sim(events: &[PmuEvent]) {
    if events.is_empty() {
        let extra = st::REGS_INTR | st::BRANCH_STACK | st::ADDR | st::WEIGHT | st::DATA_SRC;
        SAMPLE_TYPE.fetch_or(extra, Ordering::Relaxed);
    }
    REGS_INTR.store(GPR_MASK, Ordering::Relaxed);
    SIMULATED.store(true, Ordering::Relaxed);
    set_pmu_events(events);
    set_clock_role(CLOCK_DRIVES_SIM);
    update_path();
}

/// NMI context, on the PMU's path (never the NMI clock's): one overflow
/// of event `x.event` of a set, unless that event excludes the mode the
/// NMI interrupted (counted, as perf drops such skid); then as
/// [`overflow`]. Out of line, so the per-counter work stays off the
/// clock's path.
#[inline(never)]
pub fn pmu_overflow(ctx: &NmiContext<'_>, entry_tsc: u64, x: &Extra<'_>) -> bool {
    let ex = EVENT_EXCLUDE[usize::from(x.event) & (MAX_EVENTS - 1)].load(Ordering::Relaxed);
    if ex != 0 {
        let mode = if ctx.mode == Mode::Kernel {
            EXCLUDE_KERNEL
        } else {
            EXCLUDE_USER
        };
        if ex & mode != 0 {
            NOT_SAMPLED.fetch_add(1, Ordering::Relaxed);
            return false;
        }
    }
    overflow(ctx, entry_tsc, x)
}

/// Configures the event for `freq_hz` (the rate really programmed, in
/// mHz) and `set`; call before [`start`].
pub fn configure(freq_hz: u32, actual_mhz: u64, set: SampleSet) {
    // The boot CPU's sampling state, before its first NMI (the IDT is
    // loaded after this).
    // SAFETY: the IDT is loaded after this (`cpu::init`), so no NMI reads
    // it yet.
    unsafe {
        crate::cpu::boot_cpu()
            .sampling
            .set((&raw const BOOT_SAMPLING).cast())
    };
    let base = st::IDENTIFIER | st::IP | st::TID | st::TIME | st::CPU | st::PERIOD;
    let (stype, ru, ri) = match set {
        SampleSet::Minimal => (base, 0, 0),
        SampleSet::Default => (base | st::REGS_USER | st::CALLCHAIN, GPR_MASK, 0),
        SampleSet::Full => (
            base | st::REGS_USER | st::CALLCHAIN | st::REGS_INTR,
            GPR_MASK,
            GPR_MASK,
        ),
    };
    SAMPLE_TYPE.store(stype, Ordering::Relaxed);
    REGS_USER.store(ru, Ordering::Relaxed);
    REGS_INTR.store(ri, Ordering::Relaxed);
    FREQ_HZ.store(u64::from(freq_hz.max(1)), Ordering::Relaxed);
    let mhz = actual_mhz.max(1);
    PERIOD_NS.store(1_000_000_000_000 / mhz, Ordering::Relaxed);
    update_path();
}

/// What the command line asks of each sample beyond `sample=`, applied
/// after the overflow source is configured ([`configure`], then
/// [`configure_sim`] or [`configure_hw`]), before [`start`]: a fixed
/// `period` for the event's description (`period=`), a call chain or none
/// (`callchain=`), the user and interrupted register masks (`uregs_mask=`,
/// `iregs_mask=`; 0 drops the field) and the simulated PMU's
/// `branch_sample_type` (`branch=`). `None` keeps what is configured.
pub fn configure_fields(
    period: Option<u64>,
    callchain: Option<bool>,
    uregs_mask: Option<u64>,
    iregs_mask: Option<u64>,
    branches: Option<u64>,
) {
    if sampling() {
        return;
    }
    PERIOD_ATTR.store(period.unwrap_or(0), Ordering::Relaxed);
    if let Some(b) = branches {
        BRANCHES.store(b, Ordering::Relaxed);
    }
    let mut stype = SAMPLE_TYPE.load(Ordering::Relaxed);
    let mut set = |bit: u64, on: bool| {
        if on {
            stype |= bit;
        } else {
            stype &= !bit;
        }
    };
    if let Some(c) = callchain {
        set(st::CALLCHAIN, c);
    }
    if let Some(m) = uregs_mask {
        set(st::REGS_USER, m != 0);
        REGS_USER.store(m, Ordering::Relaxed);
    }
    if let Some(m) = iregs_mask {
        set(st::REGS_INTR, m != 0);
        REGS_INTR.store(m, Ordering::Relaxed);
        // Asked for: every event's samples carry it, not only those whose
        // PMU adds it (PEBS).
        PMU_ADDED.fetch_and(!st::REGS_INTR, Ordering::Relaxed);
    }
    SAMPLE_TYPE.store(stype, Ordering::Relaxed);
    update_path();
}

/// The NMI clock's rate as the device that ticks gives it (mHz), once it
/// started: the nominal period the end-of-run report compares with.
pub fn set_clock_rate(actual_mhz: u64) {
    PERIOD_NS.store(1_000_000_000_000 / actual_mhz.max(1), Ordering::Relaxed);
}

/// The throttle limits: `max_rate` samples per second per event (0: no
/// limit, and then no CPU-time budget either, since the budget works by
/// lowering that limit) and `cpu_pct` percent of CPU time for the handler
/// (0: no budget), at [`TICK_HZ`] ticks measured with the TSC. Resets the
/// throttle state and its counters. Only while sampling is off (before
/// [`start`] or after [`stop`]), outside NMI context.
pub fn configure_throttle(max_rate: u32, cpu_pct: u32) {
    if sampling() {
        return;
    }
    MAX_RATE_CONFIGURED.store(max_rate, Ordering::Relaxed);
    CPU_PCT_CONFIGURED.store(cpu_pct, Ordering::Relaxed);
    let cfg = throttle_config();
    for (_, s) in every_cpu() {
        // SAFETY: sampling is off (checked above) and this is not NMI
        // context: see `ThrottleCell`.
        unsafe { *s.throttle.0.get() = (Throttle::new(cfg), EventThrottle::new()) };
        s.next_tick_tsc.store(0, Ordering::Relaxed);
    }
    let tick = (crate::time::tsc_hz() / TICK_HZ).max(1);
    TICK_TSC.store(tick, Ordering::Relaxed);
}

/// The throttle's limits as configured.
fn throttle_config() -> ThrottleConfig {
    match MAX_RATE_CONFIGURED.load(Ordering::Relaxed) {
        0 => ThrottleConfig {
            max_sample_rate: u64::MAX,
            cpu_time_max_percent: 0,
            tick_hz: TICK_HZ,
        },
        rate => ThrottleConfig {
            max_sample_rate: u64::from(rate),
            cpu_time_max_percent: u64::from(CPU_PCT_CONFIGURED.load(Ordering::Relaxed)),
            tick_hz: TICK_HZ,
        },
    }
}

/// `max_rate=` as configured (0: no limit).
pub fn max_rate_configured() -> u32 {
    MAX_RATE_CONFIGURED.load(Ordering::Relaxed)
}

/// Outside NMI context, without the wire (the self-test): takes every
/// queued record out of every CPU's ring, each ring's in order, handing
/// each to `f` with its CPU.
pub fn take_queued(mut f: impl FnMut(u32, &NmiRecord)) {
    for (cpu, s) in every_cpu() {
        while s.ring.pop_with(|r| f(cpu, r)).is_some() {}
    }
}

/// Whether every CPU's ring is empty.
pub fn rings_empty() -> bool {
    every_cpu().all(|(_, s)| s.ring.is_empty())
}

/// What the throttle did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThrottleStats {
    /// Times the event was throttled.
    pub throttles: u64,
    /// Overflows suppressed while throttled (sent as Lost, reason Throttled).
    pub suppressed: u64,
    /// Throttle and Unthrottle records queued.
    pub records: u64,
    /// Throttle and Unthrottle records dropped (ring full).
    pub records_dropped: u64,
    /// The sample-rate limit in force (lowered by the CPU-time budget;
    /// `u64::MAX`: no limit).
    pub max_rate: u64,
    /// The moving average of the handler's time (ns).
    pub average_ns: u64,
}

/// The throttles' counters, summed over the CPUs (the rate limit and the
/// handler's average time are the boot CPU's).
pub fn throttle_stats() -> ThrottleStats {
    let (t, _) = BOOT_SAMPLING.throttle();
    let mut stats = ThrottleStats {
        max_rate: t.max_sample_rate(),
        average_ns: t.average_ns(),
        ..ThrottleStats::default()
    };
    for (_, s) in every_cpu() {
        stats.throttles += s.throttle().0.throttle_count();
        stats.suppressed += s.throttled_total.load(Ordering::Relaxed);
        stats.records += s.throttle_records.load(Ordering::Relaxed);
        stats.records_dropped += s.throttle_records_dropped.load(Ordering::Relaxed);
    }
    stats
}

/// Caps the usable ring slots (`ring=N`) of every CPU's ring, and of those
/// of CPUs started later; returns the capacity in force.
pub fn set_ring_slots(n: u32) -> Result<usize, sampler::ring::CapacityError> {
    for (_, s) in every_cpu() {
        s.ring.set_capacity(n as usize)?;
    }
    RING_CAP.store(n as usize, Ordering::Relaxed);
    Ok(BOOT_SAMPLING.ring.capacity())
}

/// Starts sampling.
pub fn start() {
    let l = crate::mm::layout();
    RUNTIME_WALK.set(8, l.data);
    crate::proc::set_walk(l.user_data);
    let now = crate::sample::nmi::rdtsc();
    for (_, s) in every_cpu() {
        s.last_tick_ns
            .store(crate::time::tsc_to_ns(now), Ordering::Relaxed);
    }
    STARTED_TSC.store(now, Ordering::Relaxed);
    STOPPED_TSC.store(0, Ordering::Relaxed);
    OVERFLOWS_AT_START.store(clock_overflows(), Ordering::Relaxed);
    ROUTE.fetch_and(!NOT_SAMPLING, Ordering::Release);
}

/// Stops sampling (NMIs still arrive but take no samples). Samples still
/// waiting for a return to user mode are queued with ABI_NONE user
/// registers, so every one is delivered or counted as lost.
pub fn stop() {
    ROUTE.fetch_or(NOT_SAMPLING, Ordering::SeqCst);
    STOPPED_TSC.store(crate::sample::nmi::rdtsc(), Ordering::Relaxed);
    // An NMI that saw sampling on runs to completion before this line (only
    // the boot CPU's NMIs park), so nothing parks after it.
    PARKED.abandon(&BOOT_SAMPLING.ring);
}

/// Copies the trap frame into a ring slot's raw frame: the 22 words as
/// they are (the drain puts them in perf order), one `rep movsq`.
#[inline(always)]
fn copy_frame(dst: &mut RawFrame, src: &TrapFrame) {
    // SAFETY: both are `repr(C)` structs of 22 `u64` words with the same
    // layout (asserted below); `dst` is a ring slot owned by this context
    // and `src` a saved frame, so they do not overlap. Every entry stub
    // clears DF (`cld`) before calling Rust, so `rep movsq` copies upwards.
    unsafe {
        core::arch::asm!(
            "rep movsq",
            inout("rcx") 22usize => _,
            inout("rdi") dst as *mut RawFrame => _,
            inout("rsi") src as *const TrapFrame => _,
            options(nostack, preserves_flags)
        );
    }
}

// `copy_frame` is a plain word copy only while the layouts agree, word
// for word.
const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<TrapFrame>() == size_of::<RawFrame>());
    macro_rules! same_offsets {
        ($($f:ident),*) => { $(assert!(offset_of!(TrapFrame, $f) == offset_of!(RawFrame, $f));)* };
    }
    same_offsets!(
        r15, r14, r13, r12, r11, r10, r9, r8, rbp, rdi, rsi, rdx, rcx, rbx, rax, vector,
        error_code, rip, cs, rflags, rsp, ss
    );
};

// The expansion's test for a plausible user return address is the
// runtime's user layout: nothing mapped below mmap_min_addr, nothing of a
// process at or above the end of the user half.
const _: () = {
    assert!(sampler::capture::USER_CODE.start == kcore::sys::vma::MMAP_MIN_ADDR);
    assert!(sampler::capture::USER_CODE.end == arch_x86::paging::USER_END);
    assert!(sampler::capture::KERNEL_CODE_START == arch_x86::paging::DIRECT_MAP);
};

/// `bit` when `cs` is the compat (32-bit) user code selector.
#[inline(always)]
fn compat(cs: u64, bit: u32) -> u32 {
    if cs as u16 == gdt::USER_CODE32 {
        bit
    } else {
        0
    }
}

static RUNTIME_WALK: WalkRange = WalkRange::new();

/// The frame-pointer walk of [`sampler::walk`] with the reads done as
/// volatile loads of `W`-byte words through the current address space.
#[inline(always)]
fn walk<const W: u64>(
    chain: &mut [u64; MAX_CALLCHAIN],
    n: usize,
    fp: u64,
    range: &WalkRange,
    max: usize,
) -> usize {
    sampler::walk::walk::<W>(
        chain,
        n,
        fp,
        range,
        max,
        #[inline(always)]
        |fp| {
            // SAFETY: `walk` only reads at an `fp` aligned to `W` whose pair
            // of words lies inside the range's stack: the runtime's data, or
            // the running process's present stack pages (its range is set on
            // every switch, read inside `with_user_access`), so neither load
            // can fault.
            unsafe {
                if W == 8 {
                    (
                        core::ptr::read_volatile(fp as *const u64),
                        core::ptr::read_volatile((fp + 8) as *const u64),
                    )
                } else {
                    (
                        u64::from(core::ptr::read_volatile(fp as *const u32)),
                        u64::from(core::ptr::read_volatile((fp + 4) as *const u32)),
                    )
                }
            }
        },
    )
}

/// The callchain's raw IPs: the runtime's (interrupted RIP, then return
/// addresses) when the NMI hit the runtime, then the task's user IPs. The
/// drain adds the context markers and applies `max_stack`.
#[inline(always)]
fn callchain(r: &mut RawSample, ctx: &NmiContext<'_>) {
    let f = ctx.interrupted;
    let mut n = 0;
    let user = if ctx.mode == Mode::Kernel {
        r.chain[0] = f.rip;
        n = walk::<8>(&mut r.chain, 1, f.rbp, &RUNTIME_WALK, MAX_KERNEL_FRAMES);
        ctx.user_regs.filter(|_| ctx.task.is_some())
    } else {
        Some(f)
    };
    // At most 1 + MAX_KERNEL_FRAMES.
    r.kernel_len = n as u8;
    let start = n;
    if let Some(u) = user {
        r.chain[n] = u.rip;
        n += 1;
        let chain = &mut r.chain;
        // SMAP is opened once for the whole user walk.
        n = crate::cpu::with_user_access(
            #[inline(always)]
            || {
                if compat(u.cs, 1) != 0 {
                    walk::<4>(
                        chain,
                        n,
                        u.rbp & 0xffff_ffff,
                        &ctx.cpu.compat_walk,
                        MAX_USER_FRAMES,
                    )
                } else {
                    walk::<8>(chain, n, u.rbp, &ctx.cpu.user_walk, MAX_USER_FRAMES)
                }
            },
        );
    }
    // At most 1 + MAX_USER_FRAMES.
    r.user_len = (n - start) as u8;
}

/// NMI context: one NMI, interrupting `frame`. Starts a throttle tick when
/// the TSC crossed a tick boundary, lets the PMU service a PMI, and
/// otherwise takes the NMI as one overflow of the NMI clock (or a step of
/// the simulated PMU; in hardware mode the clock only ticks). Atomics and
/// bounded copies only. `entry_tsc` is the TSC read first thing in the
/// handler (for the per-sample cost and the handler time the CPU-time
/// budget averages).
///
/// `cpu` is the CPU that took it and `s` its sampling state: the NMI
/// dispatch calls this once with the boot CPU's state, a static at an
/// address known when linking (so that copy reaches its fields as a single
/// CPU's were, with no register held for them), and once with the others'.
///
/// Returns whether the NMI took the routed path, the only one on which
/// observers may be registered ([`OBSERVED`]): the fast path returns a
/// constant false, so the dispatch's look at the observers drops out of it.
#[inline(always)]
pub fn on_overflow(
    frame: &TrapFrame,
    entry_tsc: u64,
    cpu: &'static CpuLocal,
    s: &'static CpuSampling,
) -> bool {
    // Acquire: sampling on means its configuration is visible.
    let route = ROUTE.load(Ordering::Acquire);
    if route == CLOCK_SAMPLES {
        // Sampling on, the NMI clock's own sample, built inline.
        if entry_tsc >= s.next_tick_tsc.load(Ordering::Relaxed) {
            new_tick(s, cpu, entry_tsc);
        }
        s.fast_overflows.fetch_add(1, Ordering::Relaxed);
        let ctx = crate::sample::nmi::context_on(frame, cpu, s);
        if !overflow(&ctx, entry_tsc, &Extra::NONE) {
            // Suppressed: nothing was sampled.
            s.fast_unsampled.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        account_cost(s, entry_tsc);
        false
    } else {
        if routed(frame, s, entry_tsc, route) {
            s.routed_measured.fetch_add(1, Ordering::Relaxed);
            account_cost(s, entry_tsc);
        }
        true
    }
}

/// NMI context: the handler's cost so far, for the per-sample average and
/// the CPU-time budget.
#[inline(always)]
fn account_cost(s: &CpuSampling, entry_tsc: u64) {
    let cost = crate::sample::nmi::rdtsc().wrapping_sub(entry_tsc);
    s.nmi_cost_tsc.fetch_add(cost, Ordering::Relaxed);
    s.throttle().0.sample_took(|| crate::time::tsc_to_ns(cost));
}

/// NMI context, out of line: an NMI the PMU may have raised, or a clock
/// NMI of the simulated or hardware PMU mode. True when a sample was taken
/// (and its cost is to be accounted).
#[inline(never)]
fn routed(frame: &TrapFrame, s: &CpuSampling, entry_tsc: u64, route: u8) -> bool {
    if route & FORWARD != 0 && s.cpu == 0 {
        crate::sample::clock::forward_tick();
    }
    s.routed_nmis.fetch_add(1, Ordering::Relaxed);
    let on = route & NOT_SAMPLING == 0;
    if on && entry_tsc >= s.next_tick_tsc.load(Ordering::Relaxed) {
        new_tick(s, crate::cpu::nmi_cpu(frame), entry_tsc);
    }
    // A PMI of the hardware PMU is serviced (and sampled when on) there.
    let pmi = route & PMU_NMIS != 0 && crate::sample::pmu::on_nmi(frame, entry_tsc, on);
    if !on {
        return false;
    }
    if pmi {
        return true;
    }
    match route & CLOCK_ROLE {
        CLOCK_SAMPLES => {
            s.routed_overflows.fetch_add(1, Ordering::Relaxed);
            overflow(&crate::sample::nmi::context(frame), entry_tsc, &Extra::NONE)
        }
        CLOCK_DRIVES_SIM => {
            crate::sample::pmu::on_tick(frame, entry_tsc);
            true
        }
        // The clock is only the throttle's tick here.
        _ => false,
    }
}

/// NMIs taken since boot on every CPU: each took the inline path (one
/// clock overflow) or the routed one.
pub fn nmis_taken() -> u64 {
    every_cpu()
        .map(|(_, s)| {
            s.fast_overflows.load(Ordering::Relaxed) + s.routed_nmis.load(Ordering::Relaxed)
        })
        .sum()
}

/// NMI-clock overflows taken while sampling, since boot, on every CPU
/// (each becomes a sample or a suppressed, counted overflow).
pub fn clock_overflows() -> u64 {
    every_cpu()
        .map(|(_, s)| {
            s.fast_overflows.load(Ordering::Relaxed) + s.routed_overflows.load(Ordering::Relaxed)
        })
        .sum()
}

/// NMI context: one overflow of the sampled event, through the throttle
/// (perf's per-tick interrupt limit). Samples it, and when it exceeds the
/// tick's limit first queues a Throttle record (as perf logs the throttle
/// before it outputs the overflow's sample; deciding it first also leaves
/// nothing of the throttle's to keep across the sample's build); a
/// throttled event's overflow is counted (a Lost record with reason
/// Throttled) instead. Returns false when the overflow was suppressed.
/// The caller stops a hardware counter when [`throttled`] says so.
#[inline(always)]
pub fn overflow(ctx: &NmiContext<'_>, entry_tsc: u64, x: &Extra<'_>) -> bool {
    let s = ctx.sampling;
    let (t, e) = s.throttle();
    let action = t.on_overflow(e);
    if action == OverflowAction::Suppressed {
        // Event 0's pending count is the drain's first; the others' are
        // by event (a constant 0 on the NMI clock's path).
        if x.event == 0 {
            s.throttled_pending.fetch_add(1, Ordering::Relaxed);
        } else {
            s.event_throttled_pending[usize::from(x.event) & (MAX_EVENTS - 1)]
                .fetch_add(1, Ordering::Relaxed);
        }
        s.throttled_total.fetch_add(1, Ordering::Relaxed);
        drop_clock_time(s, x, entry_tsc);
        return false;
    }
    if action == OverflowAction::SampleThenThrottle {
        push_transition(s, ctx.cpu.index, true, entry_tsc);
    }
    // One call site, so the sample is built inline.
    push_sample(ctx, entry_tsc, x);
    true
}

/// NMI-safe: whether the sampled event is throttled now on `cpu` (a
/// hardware counter should be stopped until the next tick).
#[inline(always)]
pub fn throttled(cpu: &CpuLocal) -> bool {
    of(cpu).throttle().1.is_throttled()
}

/// NMI context: the TSC crossed a tick boundary: advance the tick and, if
/// the event was throttled, unthrottle it (Unthrottle record, the counter
/// restarted).
#[inline(never)]
fn new_tick(s: &CpuSampling, cpu: &CpuLocal, tsc: u64) {
    let tick = TICK_TSC.load(Ordering::Relaxed).max(1);
    s.next_tick_tsc
        .store((tsc / tick + 1) * tick, Ordering::Relaxed);
    let (t, e) = s.throttle();
    if t.on_tick(e) {
        push_transition(s, cpu.index, false, tsc);
        crate::sample::pmu::unthrottle(cpu);
    }
}

/// NMI context: queues a Throttle (`on`) or Unthrottle record, in order
/// with the samples, for every event of the set (the throttle stops and
/// restarts the set's counters together, so each event is throttled). A
/// record that finds the ring full is dropped and counted (it is not a
/// sample, so it must not count as a lost one).
#[inline(never)]
fn push_transition(s: &CpuSampling, cpu: u32, on: bool, tsc: u64) {
    let time = crate::time::tsc_to_ns(tsc);
    for event in 0..hw_events().len().max(1) as u32 {
        if s.ring.len() >= s.ring.capacity() {
            s.throttle_records_dropped.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let ev = ThrottleEvent { time, cpu, event };
        let pushed = s.ring.push_with(|rec| {
            *rec = if on {
                NmiRecord::Throttle(ev)
            } else {
                NmiRecord::Unthrottle(ev)
            }
        });
        if pushed {
            s.throttle_records.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// NMI context: queues one sample of the interrupted context, with the PMU
/// data in `x`, in place in its ring slot: header words, the frames the
/// event needs copied as they are, the walked IPs. The drain expands it
/// (`sampler::capture::RawSample::expand_into`). Bounded copies only.
/// Inlined into its one caller, [`overflow`]: the NMI path's cost is
/// measured per instruction.
#[inline(always)]
pub fn push_sample(ctx: &NmiContext<'_>, entry_tsc: u64, x: &Extra<'_>) {
    let stype = SAMPLE_TYPE.load(Ordering::Relaxed);
    let kernel = ctx.mode == Mode::Kernel;
    let path = PATH.load(Ordering::Relaxed);
    let mut saved_user = ctx.user_regs;
    if path != 0 {
        let excluded = if kernel {
            PATH_EXCLUDE_KERNEL
        } else {
            PATH_EXCLUDE_USER
        };
        if path & excluded != 0 {
            NOT_SAMPLED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // Return-to-user mode: an NMI in the runtime while a task's user
        // frame is complete waits for the registers of that task's next
        // return; in a window, without a task or with the store full it is
        // queued at once, with ABI_NONE user registers.
        if kernel && path & PATH_DEFER != 0 {
            saved_user = None;
            if ctx.user_regs.is_some() && park(ctx.interrupted, entry_tsc, x, stype) {
                return;
            }
        }
    }
    // Drops and counts the sample when the ring is full.
    let s = ctx.sampling;
    let pushed = s.ring.push_with(
        #[inline(always)]
        |rec| fill_sample(rec.sample_mut(), ctx, entry_tsc, x, stype, saved_user),
    );
    if !pushed {
        if x.event != 0 {
            s.event_ring_lost[usize::from(x.event) & (MAX_EVENTS - 1)]
                .fetch_add(1, Ordering::Relaxed);
        }
        drop_clock_time(s, x, entry_tsc);
    }
}

/// `uregs=return`: parks the sample of an NMI that interrupted the runtime
/// (`frame`) until the task's next return to user mode; false when it must
/// be queued at once (see `DeferredUserRegs::park_with`). Out of line, and
/// rebuilding the context from `frame`, so the common path keeps its
/// context in registers.
#[inline(never)]
fn park(frame: &TrapFrame, entry_tsc: u64, x: &Extra<'_>, stype: u64) -> bool {
    let ctx = crate::sample::nmi::context(frame);
    PARKED.park_with(&mut |r| fill_sample(r, &ctx, entry_tsc, x, stype, None))
}

/// Writes one sample into `r` (a ring slot or a parked slot): header
/// words, the frames the event needs copied as they are (`saved_user` as
/// the user frame when the NMI hit the runtime), the walked IPs and the
/// PMU data. Inlined into both call sites, so the common one stays a
/// straight line.
#[inline(always)]
fn fill_sample(
    r: &mut RawSample,
    ctx: &NmiContext<'_>,
    entry_tsc: u64,
    x: &Extra<'_>,
    stype: u64,
    saved_user: Option<&TrapFrame>,
) {
    let f = ctx.interrupted;
    let kernel = ctx.mode == Mode::Kernel;
    let now = crate::time::tsc_to_ns(entry_tsc);
    r.time = now;
    r.ip = match x.precise_ip {
        Some(ip) => ip,
        None => f.rip,
    };
    // The NMI clock's period is measured here, where the sample is
    // written, so the value is not held across the ring claim.
    r.period = if x.period == 0 {
        clock_period(ctx.sampling, now)
    } else {
        x.period
    };
    r.pid = crate::proc::PID_OF_TID[(ctx.tid & 0xff) as usize].load(Ordering::Relaxed);
    r.tid = ctx.tid;
    r.cpu = ctx.cpu.index;
    let mut flags = 0;
    if kernel {
        flags = raw_flags::KERNEL;
        if stype & st::REGS_USER != 0
            && let Some(u) = saved_user
        {
            copy_frame(&mut r.user, u);
            flags |= raw_flags::SAVED_USER | compat(u.cs, raw_flags::USER_COMPAT);
        }
        if stype & st::REGS_INTR != 0 {
            copy_frame(&mut r.intr, f);
            flags |= compat(f.cs, raw_flags::INTR_COMPAT);
        }
    } else if stype & (st::REGS_USER | st::REGS_INTR) != 0 {
        copy_frame(&mut r.user, f);
        flags |= compat(f.cs, raw_flags::USER_COMPAT);
    }
    if stype & st::CALLCHAIN != 0 {
        callchain(r, ctx);
    }
    if let Some(p) = x.pebs_regs {
        r.pmu.pebs_regs = *p;
        flags |= raw_flags::PEBS_REGS;
    }
    if let Some(b) = x.branches {
        r.pmu.branches.clone_from(b);
        flags |= raw_flags::BRANCHES;
    }
    if let Some(m) = x.mem {
        r.pmu.mem = m;
        flags |= raw_flags::MEM;
    }
    // The event index (0, a constant, on the NMI clock's path).
    r.flags = flags | u32::from(x.event) << sampler::capture::raw_flags::EVENT_SHIFT;
}

/// `uregs=return`: user registers of samples taken in the runtime come
/// from the task's next return to user mode. Before [`start`].
pub fn set_user_regs_at_return(on: bool) {
    AT_RETURN.store(on, Ordering::Relaxed);
    update_path();
}

/// The return-to-user path, with `frame` the complete frame its `iretq`
/// restores: parked samples of the current task get its registers, those of
/// other tasks ABI_NONE, and NMIs stop parking until the next entry
/// ([`on_entry_from_user`]). Called by the exit stub for every return,
/// with interrupts off; one load when `uregs=return` is off.
#[inline(always)]
pub extern "C" fn on_return(frame: &TrapFrame) {
    if !AT_RETURN.load(Ordering::Relaxed) || frame.mode() == Mode::Kernel {
        return;
    }
    PARKED.enter_exit_window();
    if PARKED.is_empty() {
        return;
    }
    let tid = crate::proc::current().map_or(0, |t| u32::from(t) + 1);
    let mut user = RawFrame::ZERO;
    copy_frame(&mut user, frame);
    let compat = compat(frame.cs, 1) != 0;
    PARKED.complete(tid, &user, compat, &BOOT_SAMPLING.ring);
}

/// Thread `tid` ended and will never return to user mode: its samples
/// parked for `uregs=return` go to the ring with ABI_NONE user registers,
/// and stop taking room from the other threads'. From the scheduler loop.
pub fn release_parked(tid: u32) {
    if !AT_RETURN.load(Ordering::Relaxed) {
        return;
    }
    // NMIs do not park while the store is sorted; the window is then left
    // as it was.
    let was_closed = PARKED.in_exit_window();
    PARKED.enter_exit_window();
    PARKED.release(tid, &BOOT_SAMPLING.ring);
    if !was_closed {
        PARKED.leave_exit_window();
    }
}

/// The entry path, once the user frame is saved: NMIs may park again.
#[inline]
pub fn on_entry_from_user() {
    if AT_RETURN.load(Ordering::Relaxed) {
        PARKED.leave_exit_window();
    }
}

/// The NMI clock's rate over the last sampling run: requested (the rate
/// programmed) against achieved (ticks over the time sampling was on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockRate {
    /// Clock ticks while sampling was on.
    pub ticks: u64,
    /// How long sampling was on.
    pub elapsed_ns: u64,
    /// The rate programmed, in mHz.
    pub requested_mhz: u64,
    /// Ticks per second, in mHz.
    pub achieved_mhz: u64,
    /// Achieved over requested, in tenths of a percent.
    pub permille: u64,
}

/// The NMI clock's rate over the last sampling run (after [`stop`]);
/// `None` when the clock did not sample (a PMU did) or nothing ran.
pub fn clock_rate() -> Option<ClockRate> {
    if ROUTE.load(Ordering::Relaxed) & CLOCK_ROLE != CLOCK_SAMPLES {
        return None;
    }
    let (t0, t1) = (
        STARTED_TSC.load(Ordering::Relaxed),
        STOPPED_TSC.load(Ordering::Relaxed),
    );
    let elapsed_ns = crate::time::tsc_to_ns(t1.checked_sub(t0).filter(|&d| d > 0 && t0 > 0)?);
    let ticks = clock_overflows() - OVERFLOWS_AT_START.load(Ordering::Relaxed);
    let period = PERIOD_NS.load(Ordering::Relaxed).max(1);
    let requested_mhz = 1_000_000_000_000 / period;
    let achieved_mhz =
        (u128::from(ticks) * 1_000_000_000_000 / u128::from(elapsed_ns.max(1))) as u64;
    Some(ClockRate {
        ticks,
        elapsed_ns,
        requested_mhz,
        achieved_mhz,
        permille: achieved_mhz * 1000 / requested_mhz.max(1),
    })
}

/// `(TSC ticks spent from NMI entry to the end of the push, samples measured)`;
/// under `-icount shift=0` the ticks are instructions.
pub fn nmi_cost() -> (u64, u64) {
    every_cpu().fold((0, 0), |(t, n), (_, s)| {
        (
            t + s.nmi_cost_tsc.load(Ordering::Relaxed),
            n + s.fast_overflows.load(Ordering::Relaxed) - s.fast_unsampled.load(Ordering::Relaxed)
                + s.routed_measured.load(Ordering::Relaxed),
        )
    })
}

/// Outside NMI context, after sampling stopped: the end-of-run report of
/// whatever ran (the boot archive's programs): the NMI path's average cost
/// per sample (`perch: NMI path N TSC ticks per sample ...`; instructions
/// under `-icount shift=0`, which `cargo xtask bench` and the tests read),
/// perf's "interrupt took too long" line when the CPU-time budget lowered
/// the rate, and what the throttle did.
pub fn report_end_of_run() {
    let (cost, measured) = nmi_cost();
    if let Some(avg) = cost.checked_div(measured) {
        crate::kprintln!(
            "perch: NMI path {avg} TSC ticks per sample on average over {measured} samples (instructions under -icount shift=0)"
        );
    }
    if let Some(r) = clock_rate() {
        crate::kprintln!(
            "perch: NMI clock: {} ticks in {}.{:03} s: {}.{:03} Hz achieved of {}.{:03} Hz requested ({}.{}%)",
            r.ticks,
            r.elapsed_ns / 1_000_000_000,
            r.elapsed_ns / 1_000_000 % 1000,
            r.achieved_mhz / 1000,
            r.achieved_mhz % 1000,
            r.requested_mhz / 1000,
            r.requested_mhz % 1000,
            r.permille / 10,
            r.permille % 10
        );
    }
    let stalls = super::clock::stalls();
    if stalls > 0 {
        crate::kprintln!(
            "perch: NMI clock: restarted {stalls} times (no NMI came within 2 ms of an expiry)"
        );
    }
    let t = throttle_stats();
    if t.max_rate != u64::MAX && t.max_rate < u64::from(max_rate_configured()) {
        crate::kprintln!(
            "perch: interrupt took too long ({} ns on average), lowered max_rate to {}",
            t.average_ns,
            t.max_rate
        );
    }
    crate::kprintln!(
        "perch: throttled {} times, {} overflows suppressed while throttled, {} throttle records ({} dropped: ring full)",
        t.throttles,
        t.suppressed,
        t.records,
        t.records_dropped
    );
}
