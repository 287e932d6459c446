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
//! # Why the statics are sound
//!
//! [`setup_sim`] and [`setup_hw`] fill [`SIM`] / [`HW`] and the PEBS buffer
//! outside NMI context, before [`SIM_ON`] / [`HW_STATE`] publish them
//! (Release). From then on they are touched only by the NMI handler after
//! seeing the flag (Acquire), until [`stop_hw`] withdraws the flag and takes
//! them back. The runtime runs on one CPU and NMIs do not nest (the CPU
//! blocks further NMIs until the handler's IRET), so at most one `&mut` to
//! them exists at any time. Only one of the two is ever set up, so they
//! share the PEBS buffer. The start-up check publishes its driver through
//! [`CHECK_DRIVER`] the same way, for the duration of its workload only.

use crate::sample::nmi::NmiContext;
use crate::sample::profile::{self, Extra};
use arch_x86::cpuid::{self, CpuIdResult, Cpuid, LbrKind, PmuInfo, Vendor};
use arch_x86::frame::Mode;
use arch_x86::pmu::driver::{self, CheckReport, PmuDriver};
use arch_x86::pmu::ds::{DsArea, DsMemory};
use arch_x86::pmu::events::{self, MemEvent};
use arch_x86::pmu::hw::{self as cpu_pmu, CpuPmu};
use arch_x86::pmu::intel::IntelOptions;
use arch_x86::pmu::lbr::LbrConfig;
use arch_x86::pmu::selftest::{Reason, Verdict};
use arch_x86::pmu::sim::{SimClock, SimCpu, SimPmu, SimRegs};
use arch_x86::pmu::{
    Event, EventConfig, EventKind, LbrRawFormat, PmiSummary, PmuError, PmuHw, SampleMode,
};
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU64, Ordering};
use sampler::event::sample_type as stype;
use sampler::event::{self as sev, EventSource, PmuCaps};
use sampler::lbr::{self as slbr, LbrFormat};
use sampler::pebs::{self, DecodeConfig, MemKind, PebsFormat};
use sampler::regs::RegFile;

/// The simulated CPU `sim=` selects.
pub fn sim_cpu(model: arch_x86::cmdline::SimModel) -> SimCpu {
    use arch_x86::cmdline::SimModel;
    match model {
        SimModel::SapphireRapids => SimCpu::sapphire_rapids(),
        SimModel::IceLake => SimCpu::ice_lake(),
        SimModel::Skylake => SimCpu::skylake(),
    }
}

/// Instructions the simulator retires per NMI-clock tick.
pub const SIM_INSTRUCTIONS_PER_TICK: u64 = 1000;
/// Sampling period of the simulated `mem-loads` event (one load per tick).
pub const SIM_PERIOD: u64 = 1;
/// Raw encoding of the sampled event (MEM_TRANS_RETIRED.LOAD_LATENCY).
pub const SIM_RAW_CONFIG: u64 = 0x01CD;
/// Bytes of the PEBS buffer.
const PEBS_BYTES: usize = 16 * 1024;
/// Most branch entries taken from one PEBS record.
const MAX_BRANCHES: usize = 32;

/// Everything the simulated run keeps between ticks.
pub struct SimState {
    /// The simulator, advanced by the NMI clock.
    pub clock: SimClock,
    /// The real driver, programmed against the simulator.
    pub driver: PmuDriver,
    /// How PEBS records are decoded.
    pub decode: DecodeConfig,
    /// How LBR entries are decoded.
    pub lbr: LbrFormat,
}

struct SimCell(UnsafeCell<Option<SimState>>);
// SAFETY: see the module docs: written once before SIM_ON is published,
// afterwards used only from (non-nesting, single-CPU) NMI context.
unsafe impl Sync for SimCell {}

struct BufCell(UnsafeCell<[u8; PEBS_BYTES]>);
// SAFETY: as for `SimCell`.
unsafe impl Sync for BufCell {}

static SIM: SimCell = SimCell(UnsafeCell::new(None));
static PEBS_BUF: BufCell = BufCell(UnsafeCell::new([0; PEBS_BYTES]));
static AREA: DsArea = DsArea::new();
static CHECK_BUF: BufCell = BufCell(UnsafeCell::new([0; PEBS_BYTES]));
static CHECK_AREA: DsArea = DsArea::new();
static CHECK_BUSY: AtomicBool = AtomicBool::new(false);
static SIM_ON: AtomicBool = AtomicBool::new(false);
static PEBS_LOST: AtomicU64 = AtomicU64::new(0);

/// CPUID of the simulated CPU (CPUID does not depend on the simulator's state).
pub struct SimCpuid(pub SimCpu);

impl Cpuid for SimCpuid {
    fn cpuid(&self, leaf: u32, subleaf: u32) -> CpuIdResult {
        SimPmu::new(self.0).cpuid(leaf, subleaf)
    }
}

/// Perch's capabilities for a detected PMU, marked as `source`.
pub fn caps_of(info: &PmuInfo, source: EventSource) -> PmuCaps {
    let mut c = PmuCaps::cpu_clock();
    c.source = source;
    c.version = info.version;
    c.gp_counters = info.gp_counters;
    c.gp_width = info.gp_width;
    c.fixed_counters = info.fixed_counters();
    c.fixed_width = info.fixed_width;
    c.pebs_format = info.pebs_format;
    c.pebs_xmm = info.pebs_baseline;
    c.lbr_format = info.lbr_format();
    c.lbr_depth = info.lbr_depth();
    c
}

/// Builds a simulated PMU of `cpu` with the real driver programmed for
/// precise `mem-loads` at `period` with LBR (frozen on PMI), its PEBS
/// records going to `mem`.
pub fn build_sim(
    cpu: SimCpu,
    period: u64,
    mem: &mut DsMemory<'_>,
) -> Result<(SimState, PmuInfo), PmuError> {
    let mut clock = SimClock::new(cpu, SIM_INSTRUCTIONS_PER_TICK);
    let info = cpuid::detect(&SimCpuid(cpu), &mut clock.sim);
    let mut driver = PmuDriver::new(&info)?;
    let events = [EventConfig {
        event: Event {
            precise: 2,
            ..Event::new(EventKind::MemLoads)
        },
        mode: SampleMode::Period(period),
    }];
    let opts = IntelOptions {
        lbr: Some(LbrConfig::default()),
        ..Default::default()
    };
    driver.configure(&mut clock.sim, Some(mem), &events, &opts)?;
    let format = pebs_format_of(info.pebs_format.ok_or(PmuError::PebsUnavailable)?);
    let lbr = lbr_format_of(driver.lbr_format()).ok_or(PmuError::LbrUnavailable)?;
    let state = SimState {
        clock,
        driver,
        decode: DecodeConfig {
            format,
            mem: MemKind::Load,
            split_latency: matches!(
                cpu,
                SimCpu::Intel {
                    split_latency: true,
                    ..
                }
            ),
            data_source: info.pebs_data_source(),
            pebs_trap: info.pebs_trap(),
        },
        lbr,
    };
    Ok((state, info))
}

/// `pmu=sim`: sets up the simulated PMU and the real driver on it, and
/// starts it. Call once at boot, before the NMI clock starts. Returns the
/// capabilities for Hello (marked [`EventSource::Simulated`]).
pub fn setup_sim(cpu: SimCpu) -> Result<PmuCaps, PmuError> {
    // SAFETY: boot context, SIM_ON is still false and the NMI clock has not
    // started, so nothing else refers to the buffer or the state.
    let buf = unsafe { &mut *PEBS_BUF.0.get() };
    let mut mem = DsMemory::new(&AREA, buf);
    let (mut state, info) = build_sim(cpu, SIM_PERIOD, &mut mem)?;
    state.driver.start(&mut state.clock.sim);
    // SAFETY: as above.
    unsafe { *SIM.0.get() = Some(state) };
    SIM_ON.store(true, Ordering::Release);
    Ok(caps_of(&info, EventSource::Simulated))
}

/// Runs `f` with DS memory of its own (for start-up checks and self-tests,
/// outside NMI context). `None` while another call is using it.
pub fn with_check_memory<R>(f: impl FnOnce(&mut DsMemory<'_>) -> R) -> Option<R> {
    if CHECK_BUSY.swap(true, Ordering::Acquire) {
        return None;
    }
    // SAFETY: CHECK_BUSY was false and is now ours, so this is the only
    // reference to CHECK_BUF until it is released below; NMI context never
    // touches it.
    let buf = unsafe { &mut *CHECK_BUF.0.get() };
    buf.fill(0);
    let r = f(&mut DsMemory::new(&CHECK_AREA, buf));
    CHECK_BUSY.store(false, Ordering::Release);
    Some(r)
}

/// True once `pmu=sim` is set up: NMI-clock ticks drive the simulator.
pub fn sim_active() -> bool {
    SIM_ON.load(Ordering::Acquire)
}

/// PEBS samples lost since the last call (collisions, unusable records).
pub fn take_pebs_lost() -> u64 {
    PEBS_LOST.swap(0, Ordering::Relaxed)
}

/// The simulator's registers for an interrupted frame (SDM PEBS order).
pub fn sim_regs(cap: &NmiContext<'_>) -> SimRegs {
    let f = cap.interrupted;
    SimRegs {
        flags: f.rflags,
        gprs: [
            f.rax, f.rbx, f.rcx, f.rdx, f.rsi, f.rdi, f.rbp, f.rsp, f.r8, f.r9, f.r10, f.r11,
            f.r12, f.r13, f.r14, f.r15,
        ],
    }
}

/// How a driver's raw records are decoded into sample fields.
#[derive(Clone, Copy, Debug)]
pub struct Decoding {
    /// PEBS records, when the event is precise.
    pub pebs: Option<DecodeConfig>,
    /// LBR entries, when branch stacks are recorded.
    pub lbr: Option<LbrFormat>,
}

/// What one serviced PMI produced.
#[derive(Clone, Copy, Debug, Default)]
pub struct Serviced {
    /// The driver's account of the PMI.
    pub summary: PmiSummary,
    /// Samples handed to `emit`.
    pub samples: u32,
    /// Samples that carried a non-empty branch stack.
    pub with_branches: u32,
    /// PEBS records decoded into samples.
    pub pebs_decoded: u32,
    /// PEBS records the decoder refused (each a lost sample).
    pub pebs_bad: u32,
}

impl Serviced {
    /// PEBS samples lost in this PMI (collisions, unusable records, refused decodes).
    pub fn pebs_lost(&self) -> u32 {
        self.summary.pebs_lost + self.pebs_bad
    }
}

/// The glue both overflow sources share: run the driver's PMI handler on
/// `hw` and hand every overflow to `emit` as sample extras (a PEBS record's
/// IP, GPRs and memory fields; the LBR stack as the branch stack).
/// NMI-safe: no allocation, lock or log; bounded copies only.
pub fn service_pmi<H: PmuHw>(
    driver: &mut PmuDriver,
    hw: &mut H,
    mem: Option<&mut DsMemory<'_>>,
    tsc: u64,
    dec: &Decoding,
    emit: &mut dyn FnMut(&Extra<'_>),
) -> Serviced {
    let mut out = Serviced::default();
    out.summary = driver.handle_pmi(hw, mem, tsc, &mut |ov| {
        let mut raw: heapless::Vec<slbr::RawBranch, MAX_BRANCHES> = heapless::Vec::new();
        for b in ov.lbr {
            let b = slbr::RawBranch {
                from: b.from,
                to: b.to,
                info: b.info,
            };
            if raw.push(b).is_err() {
                break;
            }
        }
        let mut branches = match dec.lbr {
            Some(f) if !raw.is_empty() => Some(slbr::to_stack(f, &raw)),
            _ => None,
        };
        let decoded = match (ov.pebs, dec.pebs) {
            (None, _) => None,
            (Some(b), Some(cfg)) => Some(pebs::decode(b, &cfg).ok()),
            (Some(_), None) => Some(None),
        };
        match decoded {
            Some(Some(r)) => {
                if branches.is_none()
                    && r.lbr_len() > 0
                    && let Some(f) = dec.lbr
                {
                    raw.clear();
                    for b in r.lbr() {
                        if raw.push(b).is_err() {
                            break;
                        }
                    }
                    branches = Some(slbr::to_stack(f, &raw));
                }
                let regs: Option<RegFile> = r.regs;
                out.pebs_decoded += 1;
                count_sample(&mut out, branches.as_ref());
                emit(&Extra {
                    period: ov.period,
                    precise_ip: Some(r.ip),
                    pebs_regs: regs.as_ref(),
                    branches: branches.as_ref(),
                    mem: r.mem,
                });
            }
            Some(None) => out.pebs_bad += 1,
            None => {
                count_sample(&mut out, branches.as_ref());
                emit(&Extra {
                    period: ov.period,
                    precise_ip: None,
                    pebs_regs: None,
                    branches: branches.as_ref(),
                    mem: None,
                })
            }
        }
    });
    out
}

fn count_sample(out: &mut Serviced, branches: Option<&sampler::sample::BranchStack>) {
    out.samples += 1;
    if branches.is_some_and(|b| !b.entries.is_empty()) {
        out.with_branches += 1;
    }
}

/// One simulated tick on `st`: advance the simulator with the interrupted
/// context and, on a PMI, service it with [`service_pmi`], handing every
/// overflow to `emit`. Returns the PEBS samples lost in this PMI.
/// NMI-safe: no allocation, lock or log; bounded copies only.
pub fn tick(
    st: &mut SimState,
    mem: &mut DsMemory<'_>,
    ip: u64,
    user: bool,
    regs: SimRegs,
    emit: &mut dyn FnMut(&Extra<'_>),
) -> Option<u32> {
    if !st.clock.on_tick(Some(mem), ip, user, regs) {
        return None;
    }
    st.clock.sim.take_pmi();
    let tsc = st.clock.sim.tsc();
    let dec = Decoding {
        pebs: Some(st.decode),
        lbr: Some(st.lbr),
    };
    let s = service_pmi(
        &mut st.driver,
        &mut st.clock.sim,
        Some(mem),
        tsc,
        &dec,
        emit,
    );
    Some(s.pebs_lost())
}

/// NMI context, `pmu=sim`: one NMI-clock tick.
pub fn on_tick(cap: &NmiContext<'_>, entry_tsc: u64) {
    if !sim_active() {
        return;
    }
    // SAFETY: SIM_ON was seen, so setup finished; we are in NMI context,
    // the only user from now on, and NMIs do not nest (module docs).
    let Some(st) = (unsafe { &mut *SIM.0.get() }).as_mut() else {
        return;
    };
    // SAFETY: as above, for the PEBS buffer.
    let buf = unsafe { &mut *PEBS_BUF.0.get() };
    let mut mem = DsMemory::new(&AREA, buf);
    let user = cap.mode != Mode::Kernel;
    let lost = tick(
        st,
        &mut mem,
        cap.interrupted.rip,
        user,
        sim_regs(cap),
        &mut |x| {
            profile::overflow(cap, entry_tsc, x);
        },
    );
    if profile::throttled() {
        // Throttled: the counter stops until the next tick.
        st.driver.stop(&mut st.clock.sim);
    }
    if let Some(n) = lost
        && n > 0
    {
        PEBS_LOST.fetch_add(u64::from(n), Ordering::Relaxed);
    }
}

// ------------------------------------------------------------------ hardware

/// Iterations of the start-up check's workload (two instructions each).
pub const CHECK_ITERATIONS: u64 = 5_000_000;
/// Instructions the start-up check's workload retires.
pub const CHECK_INSTRUCTIONS: u64 = CHECK_ITERATIONS * cpu_pmu::WORKLOAD_INSTRUCTIONS_PER_ITERATION;
/// Period of the start-up check's overflow phase: about 100 PMIs.
pub const CHECK_PERIOD: u64 = 100_000;
/// Smallest sampling period programmed.
pub const MIN_PERIOD: u64 = 1000;
/// Largest sampling period programmed (31 bits: what a general-purpose
/// counter without full-width writes takes).
pub const MAX_PERIOD: u64 = (1 << 31) - 1;

/// The hardware PMU while it samples.
struct HwState {
    driver: PmuDriver,
    hw: CpuPmu,
    dec: Decoding,
    pebs: bool,
}

struct HwCell(UnsafeCell<Option<HwState>>);
// SAFETY: see the module docs: filled before HW_STATE publishes it,
// afterwards used only from (non-nesting, single-CPU) NMI context until
// `stop_hw` withdraws it.
unsafe impl Sync for HwCell {}

static HW: HwCell = HwCell(UnsafeCell::new(None));
const HW_OFF: u8 = 0;
const HW_ON: u8 = 1;
const HW_STOPPING: u8 = 2;
static HW_STATE: AtomicU8 = AtomicU8::new(HW_OFF);
static CHECK_PHASE: AtomicBool = AtomicBool::new(false);
static CHECK_DRIVER: AtomicPtr<PmuDriver> = AtomicPtr::new(core::ptr::null_mut());
static CHECK_PMIS: AtomicU64 = AtomicU64::new(0);
static HW_PMIS: AtomicU64 = AtomicU64::new(0);
static HW_SAMPLES: AtomicU64 = AtomicU64::new(0);
static HW_BRANCH_SAMPLES: AtomicU64 = AtomicU64::new(0);
static HW_PEBS_DECODED: AtomicU64 = AtomicU64::new(0);
static HW_PEBS_LOST: AtomicU64 = AtomicU64::new(0);
static UNKNOWN_NMIS: AtomicU64 = AtomicU64::new(0);

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
fn cpu_pmu() -> Option<CpuPmu> {
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

/// An event's name as `event=` spells it (`cycles`, `r1c2:pp`, ...).
#[derive(Clone, Copy, Debug)]
pub struct EventName(pub Event);

impl core::fmt::Display for EventName {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let e = self.0;
        match e.kind {
            EventKind::Cycles => write!(f, "cycles")?,
            EventKind::Instructions => write!(f, "instructions")?,
            EventKind::RefCycles => write!(f, "ref-cycles")?,
            EventKind::Branches => write!(f, "branches")?,
            EventKind::BranchMisses => write!(f, "branch-misses")?,
            EventKind::CacheReferences => write!(f, "cache-references")?,
            EventKind::CacheMisses => write!(f, "cache-misses")?,
            EventKind::MemLoads => write!(f, "mem-loads")?,
            EventKind::MemStores => write!(f, "mem-stores")?,
            EventKind::Raw(v) => write!(f, "r{v:x}")?,
        }
        let all = e.user && e.kernel;
        if !all || e.precise > 0 {
            write!(f, ":")?;
            if !all && e.user {
                write!(f, "u")?;
            }
            if !all && e.kernel {
                write!(f, "k")?;
            }
            for _ in 0..e.precise {
                write!(f, "p")?;
            }
        }
        Ok(())
    }
}

/// The event sampled when `event=` is not given: cycles in both modes.
pub const DEFAULT_EVENT: Event = Event::new(EventKind::Cycles);

/// Whether `ev` samples through PEBS on `vendor`.
pub fn uses_pebs(ev: &Event, vendor: Vendor) -> bool {
    ev.precise > 0 || events::encode(ev.kind, vendor).is_some_and(|e| e.needs_pebs)
}

/// How `ev` is sampled for `freq_hz` samples per second: cycles,
/// ref-cycles and instructions with a fixed period of TSC ticks per sample
/// (cycles run at about the TSC rate); PEBS events (whose periods the
/// driver does not adapt) with a quarter of that; everything else in
/// frequency mode toward `freq_hz`.
pub fn sample_mode(ev: &Event, pebs: bool, tsc_hz: u64, freq_hz: u32) -> SampleMode {
    let tsc_hz = if tsc_hz == 0 { 1_000_000_000 } else { tsc_hz };
    let per_sample = (tsc_hz / u64::from(freq_hz.max(1))).clamp(MIN_PERIOD, MAX_PERIOD);
    match ev.kind {
        EventKind::Cycles | EventKind::RefCycles | EventKind::Instructions => {
            SampleMode::Period(per_sample)
        }
        _ if pebs => SampleMode::Period((per_sample / 4).max(MIN_PERIOD)),
        _ => SampleMode::Frequency {
            hz: freq_hz.max(1),
            tsc_hz,
        },
    }
}

fn pebs_format_of(f: u8) -> PebsFormat {
    match f {
        4.. => PebsFormat::Adaptive(f),
        3 => PebsFormat::Skl,
        2 => PebsFormat::Hsw,
        1 => PebsFormat::Nhm,
        _ => PebsFormat::Core,
    }
}

fn lbr_format_of(f: LbrRawFormat) -> Option<LbrFormat> {
    match f {
        LbrRawFormat::Arch => Some(LbrFormat::Arch),
        LbrRawFormat::Legacy(n) => Some(LbrFormat::Legacy(n)),
        LbrRawFormat::AmdV2 => Some(LbrFormat::AmdV2 { va_bits: 48 }),
        LbrRawFormat::None => None,
    }
}

/// What [`setup_hw`] programmed.
#[derive(Clone, Copy, Debug)]
pub struct HwSetup {
    /// The capabilities for Hello (source IntelPmu / AmdPmu).
    pub caps: PmuCaps,
    /// The event sampled.
    pub event: Event,
    /// Its period or frequency.
    pub mode: SampleMode,
    /// PEBS records are decoded into samples.
    pub pebs: bool,
    /// Samples carry the LBR stack.
    pub lbr: bool,
    /// The event as perf describes it (kind, config, sampling, modes,
    /// precise, branch_sample_type); see `profile::configure_hw`.
    pub perf: sev::EventConfig,
    /// `PERF_SAMPLE_*` bits the PMU adds to the sample.
    pub sample_type: u64,
}

/// Programs the real PMU to sample `ev` with `mode` (with LBR branch stacks
/// when the CPU has LBR, PEBS when the event is precise) and starts it; its
/// PMIs are then the NMIs. Outside NMI context, after the start-up check.
pub fn setup_hw(info: &PmuInfo, ev: Event, mode: SampleMode) -> Result<HwSetup, HwError> {
    if HW_STATE.load(Ordering::Acquire) != HW_OFF || sim_active() {
        return Err(HwError::Busy);
    }
    if !info.has_pmu() {
        return Err(HwError::Pmu(PmuError::NoPmu));
    }
    let mut hw = cpu_pmu().ok_or(HwError::ApicOff)?;
    hw.software_enable();
    let mut driver = PmuDriver::new(info).map_err(HwError::Pmu)?;
    let pebs = uses_pebs(&ev, info.vendor);
    let mut opts = IntelOptions {
        lbr: (info.lbr != LbrKind::None).then(LbrConfig::default),
        ..Default::default()
    };
    // SAFETY: HW_STATE is off and `pmu=sim` is not set up (checked above),
    // so neither NMI path refers to the PEBS buffer; this is the only
    // reference until the state is published.
    let buf = unsafe { &mut *PEBS_BUF.0.get() };
    buf.fill(0);
    let mut mem = DsMemory::new(&AREA, buf);
    let cfg = [EventConfig { event: ev, mode }];
    let mut r = driver.configure(&mut hw, pebs.then_some(&mut mem), &cfg, &opts);
    if r == Err(PmuError::LbrUnavailable) {
        opts.lbr = None;
        r = driver.configure(&mut hw, pebs.then_some(&mut mem), &cfg, &opts);
    }
    r.map_err(HwError::Pmu)?;
    let mem_kind = match events::encode(ev.kind, info.vendor).map(|e| e.mem) {
        Some(MemEvent::Load) => MemKind::Load,
        Some(MemEvent::Store) => MemKind::Store,
        _ => MemKind::None,
    };
    let dec = Decoding {
        pebs: match (pebs, info.pebs_format) {
            (true, Some(f)) => Some(DecodeConfig {
                format: pebs_format_of(f),
                mem: mem_kind,
                // The latency word splits in two from format 5 (Alder
                // Lake / Sapphire Rapids) on.
                split_latency: f >= 5,
                data_source: info.pebs_data_source(),
                pebs_trap: info.pebs_trap(),
            }),
            _ => None,
        },
        lbr: lbr_format_of(driver.lbr_format()),
    };
    let lbr = dec.lbr.is_some();
    let source = if info.vendor == Vendor::Amd {
        EventSource::AmdPmu
    } else {
        EventSource::IntelPmu
    };
    let (perf, sample_type) = perf_event(&ev, mode, info.vendor, pebs, mem_kind, lbr);
    // SAFETY: HW_STATE is off: nothing else refers to the cell.
    let st = unsafe { &mut *HW.0.get() }.insert(HwState {
        driver,
        hw,
        dec,
        pebs,
    });
    // Started before it is published: the smallest period is
    // `MIN_PERIOD` events, far more than the two stores below take.
    st.driver.start(&mut st.hw);
    HW_STATE.store(HW_ON, Ordering::Release);
    Ok(HwSetup {
        caps: caps_of(info, source),
        event: ev,
        mode,
        pebs,
        lbr,
        perf,
        sample_type,
    })
}

/// The perf description of `ev` (sampled with `mode`, through PEBS when
/// `pebs`, with memory fields of kind `mem`, with branch stacks when `lbr`)
/// and the `PERF_SAMPLE_*` bits the PMU adds to each sample.
pub fn perf_event(
    ev: &Event,
    mode: SampleMode,
    vendor: Vendor,
    pebs: bool,
    mem: MemKind,
    lbr: bool,
) -> (sev::EventConfig, u64) {
    use sev::hw;
    let mut e = sev::EventConfig::hardware(0, hw::CPU_CYCLES, 1);
    let generic = |c| (sev::EventKind::Hardware, c);
    let (kind, config) = match ev.kind {
        EventKind::Cycles => generic(hw::CPU_CYCLES),
        EventKind::Instructions => generic(hw::INSTRUCTIONS),
        EventKind::CacheReferences => generic(hw::CACHE_REFERENCES),
        EventKind::CacheMisses => generic(hw::CACHE_MISSES),
        EventKind::Branches => generic(hw::BRANCH_INSTRUCTIONS),
        EventKind::BranchMisses => generic(hw::BRANCH_MISSES),
        // PERF_COUNT_HW_REF_CPU_CYCLES.
        EventKind::RefCycles => generic(9),
        EventKind::MemLoads | EventKind::MemStores => (
            sev::EventKind::Raw,
            events::encode(ev.kind, vendor).map_or(0, |c| c.evtsel),
        ),
        EventKind::Raw(v) => (sev::EventKind::Raw, v),
    };
    e.kind = kind;
    e.config = config;
    e.sampling = match mode {
        SampleMode::Period(p) => sev::Sampling::Period(p),
        SampleMode::Frequency { hz, .. } => sev::Sampling::Frequency(u64::from(hz)),
    };
    e.exclude_user = !ev.user;
    e.exclude_kernel = !ev.kernel;
    e.precise = if pebs { ev.precise.max(1) } else { 0 };
    let mut extra = 0;
    if lbr {
        extra |= stype::BRANCH_STACK;
        e.branch_sample_type =
            sev::branch_type::ANY | sev::branch_type::USER | sev::branch_type::KERNEL;
    }
    if pebs {
        extra |= stype::REGS_INTR;
        if mem != MemKind::None {
            extra |= stype::ADDR | stype::WEIGHT | stype::DATA_SRC;
        }
    }
    (e, extra)
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
    // the state (module docs); this is the only reference.
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

/// The start-up check on this CPU's PMU (outside NMI context, before the
/// PMU samples): [`driver::startup_check`] with [`CpuPmu`], the workload
/// [`cpu_pmu::workload`] of [`CHECK_INSTRUCTIONS`], and the PMIs
/// [`on_nmi`] counts while the overflow phase's driver is published.
/// Touches nothing when CPUID advertises no PMU.
pub fn startup_check(info: &PmuInfo) -> CheckReport {
    let not_run = |r| CheckReport {
        counted: 0,
        period: CHECK_PERIOD,
        pmis: 0,
        verdict: Verdict::Fallback(r),
    };
    if let Err(r) = arch_x86::pmu::selftest::check_detected(info) {
        return not_run(r);
    }
    let Some(mut hw) = cpu_pmu() else {
        return not_run(Reason::NotDetected(
            "the local APIC is disabled (IA32_APIC_BASE), so no PMI can be delivered",
        ));
    };
    if HW_STATE.load(Ordering::Acquire) != HW_OFF || sim_active() {
        return not_run(Reason::NotDetected("the PMU is already in use"));
    }
    hw.software_enable();
    CHECK_PHASE.store(true, Ordering::SeqCst);
    let report = driver::startup_check(
        info,
        &mut hw,
        CHECK_PERIOD,
        &mut |_, d| match d {
            Some(d) => {
                CHECK_DRIVER.store(d, Ordering::Release);
                cpu_pmu::workload(CHECK_ITERATIONS);
                CHECK_DRIVER.store(core::ptr::null_mut(), Ordering::Release);
            }
            None => cpu_pmu::workload(CHECK_ITERATIONS),
        },
        &|| CHECK_PMIS.load(Ordering::Acquire),
    );
    CHECK_PHASE.store(false, Ordering::SeqCst);
    report
}

/// NMI context, at a tick that unthrottled the event: restart the
/// counters the throttle stopped (the hardware PMU's or the simulator's).
pub fn unthrottle() {
    if HW_STATE.load(Ordering::Acquire) == HW_ON {
        // SAFETY: HW_ON was seen, so setup finished; NMI context is the
        // only user until `stop_hw`, and NMIs do not nest (module docs).
        if let Some(st) = (unsafe { &mut *HW.0.get() }).as_mut() {
            st.driver.start(&mut st.hw);
        }
    } else if sim_active() {
        // SAFETY: SIM_ON was seen, so setup finished; NMI context is the
        // only user, and NMIs do not nest (module docs).
        if let Some(st) = (unsafe { &mut *SIM.0.get() }).as_mut() {
            st.driver.start(&mut st.clock.sim);
        }
    }
}

/// NMI context: the PMU's part of one NMI. Services a PMI of the start-up
/// check or of hardware sampling (samples go to `profile::push_sample` when
/// `sampling`). Returns true when the NMI was the PMU's business and must
/// not be taken as an NMI-clock tick: a PMI, or (while the NMI clock does
/// not run) an NMI nobody claims, which is counted as unknown.
/// NMI-safe: atomics and bounded copies only.
/// The test for "no PMU work" is two atomic loads, inlined into the NMI
/// path; the rest is out of line.
#[inline]
pub fn on_nmi(cap: &NmiContext<'_>, entry_tsc: u64, sampling: bool) -> bool {
    if !CHECK_PHASE.load(Ordering::Relaxed) && HW_STATE.load(Ordering::Relaxed) == HW_OFF {
        return false;
    }
    on_pmu_nmi(cap, entry_tsc, sampling, crate::sample::clock::running())
}

#[inline(never)]
fn on_pmu_nmi(cap: &NmiContext<'_>, entry_tsc: u64, sampling: bool, clock_running: bool) -> bool {
    if CHECK_PHASE.load(Ordering::Acquire) {
        return on_check_nmi(entry_tsc, clock_running);
    }
    match HW_STATE.load(Ordering::Acquire) {
        HW_ON => {}
        HW_STOPPING => return !clock_running,
        _ => return false,
    }
    // SAFETY: HW_ON was seen, so setup finished; NMI context is the only
    // user until `stop_hw`, and NMIs do not nest (module docs).
    let Some(st) = (unsafe { &mut *HW.0.get() }).as_mut() else {
        return false;
    };
    let mut emit = |x: &Extra<'_>| {
        if sampling {
            profile::overflow(cap, entry_tsc, x);
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
    if profile::throttled() {
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

fn on_check_nmi(tsc: u64, clock_running: bool) -> bool {
    let p = CHECK_DRIVER.load(Ordering::Acquire);
    // SAFETY: a non-null pointer is the overflow phase's driver, published
    // by `startup_check` for exactly as long as its workload runs, during
    // which the code that owns it does not touch it; NMIs do not nest.
    let Some(d) = (unsafe { p.as_mut() }) else {
        // Before or after the overflow phase's workload.
        return !clock_running;
    };
    let Some(mut hw) = cpu_pmu() else {
        return false;
    };
    let sum = d.handle_pmi(&mut hw, None, tsc, &mut |_| {});
    if !sum.spurious {
        CHECK_PMIS.fetch_add(1, Ordering::Relaxed);
        return true;
    }
    if clock_running {
        return false;
    }
    UNKNOWN_NMIS.fetch_add(u64::from(!sum.late), Ordering::Relaxed);
    true
}

// ---------------------------------------------------------------- at boot

/// What the boot decided about the overflow source, kept so it can be
/// reported once the console is set up (after Hello in wire mode). Lives
/// once on the boot stack; there is no allocator to box the large variant.
#[derive(Clone, Copy, Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Boot {
    /// `pmu=sim`: the simulated PMU, or why it could not be set up.
    Sim(Result<PmuCaps, PmuError>),
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
        /// The `event=` value refused by the driver, and why (then cycles).
        refused: Option<(Event, HwError)>,
    },
}

impl Boot {
    /// The overflow source for Hello and the profile.
    pub fn source(&self) -> profile::Source {
        match self {
            Boot::Sim(Ok(caps)) => profile::Source::Simulated(*caps),
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

/// Decides the overflow source for `pmu=` (after the IDT is loaded, before
/// the NMI clock starts): `pmu=auto` with a PMU runs the start-up check
/// and, when it passes, starts sampling `event` (cycles when `None` or
/// refused) at `freq_hz`.
pub fn boot(
    mode: arch_x86::cmdline::PmuMode,
    selftest: bool,
    info: &PmuInfo,
    event: Option<Event>,
    tsc_hz: u64,
    freq_hz: u32,
    sim: SimCpu,
) -> Boot {
    use arch_x86::cmdline::PmuMode;
    match mode {
        PmuMode::Sim => return Boot::Sim(setup_sim(sim)),
        PmuMode::Off => return Boot::Off,
        PmuMode::Auto => {}
    }
    if let Some(why) = info.missing_reason() {
        return Boot::NoPmu(why);
    }
    if selftest {
        return Boot::SelfTest(*info);
    }
    let report = startup_check(info);
    if report.verdict != Verdict::Usable {
        return Boot::CheckFailed(report);
    }
    let start = |ev: Event| {
        let mode = sample_mode(&ev, uses_pebs(&ev, info.vendor), tsc_hz, freq_hz);
        setup_hw(info, ev, mode)
    };
    let wanted = event.unwrap_or(DEFAULT_EVENT);
    let (setup, refused) = match start(wanted) {
        Ok(s) => (s, None),
        Err(e) if wanted != DEFAULT_EVENT => match start(DEFAULT_EVENT) {
            Ok(s) => (s, Some((wanted, e))),
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

fn vendor_name(v: Vendor) -> &'static str {
    match v {
        Vendor::Intel => "Intel",
        Vendor::Amd => "AMD",
        Vendor::Other => "unknown-vendor",
    }
}

/// Prints what [`boot`] decided: which overflow source is in use and why.
pub fn report_boot(b: &Boot, event: Option<Event>) {
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
        Boot::Sim(Ok(caps)) => crate::kprintln!(
            "perch: pmu=sim: SIMULATED PMU (v{}, {} GP + {} fixed counters, PEBS format {:?}, LBR format {:?} x {}); precise mem-loads period {}, driven by the NMI clock",
            caps.version,
            caps.gp_counters,
            caps.fixed_counters,
            caps.pebs_format,
            caps.lbr_format,
            caps.lbr_depth,
            SIM_PERIOD
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
                crate::kprintln!(
                    "perch: event={} refused: {e}; sampling cycles instead",
                    EventName(*ev)
                );
            }
            let (how, n) = match setup.mode {
                SampleMode::Period(p) => ("period", p),
                SampleMode::Frequency { hz, .. } => ("frequency mode, Hz", u64::from(hz)),
            };
            crate::kprintln!(
                "perch: overflow source: {} PMU (v{}, {} GP x {} bits + {} fixed counters); event {} ({} {}); PEBS {}; LBR {}; the NMI clock is not started",
                vendor_name(info.vendor),
                info.version,
                info.gp_counters,
                info.gp_width,
                info.fixed_counters(),
                EventName(setup.event),
                how,
                n,
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
    if let Some(ev) = event
        && !b.hardware()
    {
        crate::kprintln!(
            "perch: event={} ignored: the hardware PMU is not the overflow source",
            EventName(ev)
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
