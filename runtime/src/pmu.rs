//! The PMU overflow source on the target: `pmu=sim` runs the real Intel
//! driver against the simulated PMU, with the simulator advanced by the NMI
//! clock, and turns every overflow (each PEBS record its own sample, the LBR
//! stack as its branch stack) into a sample in the same ring as the NMI clock.
//!
//! The simulator is only ever selected by `pmu=sim`; the real path never
//! touches it.
//!
//! # Why the statics are sound
//!
//! [`setup_sim`] fills [`SIM`] and the PEBS buffer once, at boot, before
//! [`SIM_ON`] is set (Release) and before the NMI clock starts. From then on
//! they are touched only by [`on_tick`], which runs in NMI context after
//! seeing [`SIM_ON`] (Acquire). The runtime runs on one CPU and NMIs do not
//! nest (the CPU blocks further NMIs until the handler's IRET), so at most one
//! `&mut` to them exists at any time.

use crate::nmi::NmiContext;
use crate::profile::{self, Extra};
use arch_x86::cpuid::{self, CpuIdResult, Cpuid, PmuInfo};
use arch_x86::frame::Mode;
use arch_x86::pmu::driver::PmuDriver;
use arch_x86::pmu::ds::{DsArea, DsMemory};
use arch_x86::pmu::intel::IntelOptions;
use arch_x86::pmu::lbr::LbrConfig;
use arch_x86::pmu::sim::{SimClock, SimCpu, SimPmu, SimRegs};
use arch_x86::pmu::{Event, EventConfig, EventKind, LbrRawFormat, PmuError, SampleMode};
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use sampler::event::{EventSource, PmuCaps};
use sampler::lbr::{self as slbr, LbrFormat};
use sampler::pebs::{self, DecodeConfig, MemKind, PebsFormat};
use sampler::regs::RegFile;

/// The simulated CPU: adaptive PEBS (format 5) and architectural LBR.
pub const SIM_CPU: SimCpu = SimCpu::sapphire_rapids();
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
/// precise `mem-loads` at `period` with LBR, frozen on PMI, its PEBS
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
        freeze_on_pmi: true,
        ..Default::default()
    };
    driver.configure(&mut clock.sim, Some(mem), &events, &opts)?;
    let format = match info.pebs_format {
        Some(f @ 4..) => PebsFormat::Adaptive(f),
        Some(3) => PebsFormat::Skl,
        Some(2) => PebsFormat::Hsw,
        Some(1) => PebsFormat::Nhm,
        Some(0) => PebsFormat::Core,
        None => return Err(PmuError::PebsUnavailable),
    };
    let lbr = match driver.lbr_format() {
        LbrRawFormat::Arch => LbrFormat::Arch,
        LbrRawFormat::Legacy(f) => LbrFormat::Legacy(f),
        LbrRawFormat::AmdV2 => LbrFormat::AmdV2 { va_bits: 48 },
        LbrRawFormat::None => return Err(PmuError::LbrUnavailable),
    };
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
        },
        lbr,
    };
    Ok((state, info))
}

/// `pmu=sim`: sets up the simulated PMU and the real driver on it, and
/// starts it. Call once at boot, before the NMI clock starts. Returns the
/// capabilities for Hello (marked [`EventSource::Simulated`]).
pub fn setup_sim() -> Result<PmuCaps, PmuError> {
    // SAFETY: boot context, SIM_ON is still false and the NMI clock has not
    // started, so nothing else refers to the buffer or the state.
    let buf = unsafe { &mut *PEBS_BUF.0.get() };
    let mut mem = DsMemory::new(&AREA, buf);
    let (mut state, info) = build_sim(SIM_CPU, SIM_PERIOD, &mut mem)?;
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

/// One simulated tick on `st`: advance the simulator with the interrupted
/// context and, on a PMI, run the driver's handler and hand every overflow
/// to `emit` as sample extras. Returns the PEBS samples lost in this PMI.
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
    let decode = st.decode;
    let lbr_fmt = st.lbr;
    let mut bad = 0u32;
    let summary = st
        .driver
        .handle_pmi(&mut st.clock.sim, Some(mem), tsc, &mut |ov| {
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
            let mut branches = if raw.is_empty() {
                None
            } else {
                Some(slbr::to_stack(lbr_fmt, &raw))
            };
            match ov.pebs.map(|b| pebs::decode(b, &decode)) {
                Some(Ok(r)) => {
                    if branches.is_none() && r.lbr_len() > 0 {
                        raw.clear();
                        for b in r.lbr() {
                            if raw.push(b).is_err() {
                                break;
                            }
                        }
                        branches = Some(slbr::to_stack(lbr_fmt, &raw));
                    }
                    let regs: Option<RegFile> = r.regs;
                    emit(&Extra {
                        period: ov.period,
                        precise_ip: Some(r.ip),
                        pebs_regs: regs.as_ref(),
                        branches: branches.as_ref(),
                        mem: r.mem,
                    });
                }
                Some(Err(_)) => bad += 1,
                None => emit(&Extra {
                    period: ov.period,
                    precise_ip: None,
                    pebs_regs: None,
                    branches: branches.as_ref(),
                    mem: None,
                }),
            }
        });
    Some(summary.pebs_lost + bad)
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
        &mut |x| profile::push_sample(cap, entry_tsc, x),
    );
    if let Some(n) = lost
        && n > 0
    {
        PEBS_LOST.fetch_add(u64::from(n), Ordering::Relaxed);
    }
}
