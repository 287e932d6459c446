//! `pmu=sim`: the real Intel driver programmed against the simulated PMU,
//! which the NMI clock advances one tick at a time (statics: see the
//! parent module's docs).

use super::*;
use crate::sample::nmi::NmiContext;
use crate::sample::profile::{self, Extra};
use arch_x86::cpuid::{self, CpuIdResult, Cpuid, PmuInfo};
use arch_x86::frame::Mode;
use arch_x86::frame::TrapFrame;
use arch_x86::pmu::driver::PmuDriver;
use arch_x86::pmu::ds::DsMemory;
use arch_x86::pmu::intel::IntelOptions;
use arch_x86::pmu::sim::{SimClock, SimCpu, SimPmu, SimRegs};
use arch_x86::pmu::{Event, EventConfig, EventKind, PmuError, SampleMode};
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use sampler::event::EventSource;
use sampler::lbr::LbrFormat;
use sampler::pebs::{DecodeConfig, MemKind};

/// The simulated CPU `sim=` selects.
pub fn sim_cpu(model: kcore::cmdline::SimModel) -> SimCpu {
    use kcore::cmdline::SimModel;
    match model {
        SimModel::SapphireRapids => SimCpu::sapphire_rapids(),
        SimModel::IceLake => SimCpu::ice_lake(),
        SimModel::Skylake => SimCpu::skylake(),
    }
}

/// Instructions the simulator retires per NMI-clock tick.
pub const SIM_INSTRUCTIONS_PER_TICK: u64 = 1000;

/// Default sampling period of the simulated `mem-loads` event (every
/// load: one load per tick); `period=N` samples every N-th.
pub const SIM_PERIOD: u64 = 1;

/// The period [`setup_sim`] programmed.
static PERIOD_IN_USE: AtomicU64 = AtomicU64::new(SIM_PERIOD);

/// The simulated event's period in force (`period=`, else [`SIM_PERIOD`]).
pub fn sim_period() -> u64 {
    PERIOD_IN_USE.load(Ordering::Relaxed)
}

/// Raw encoding of the sampled event (MEM_TRANS_RETIRED.LOAD_LATENCY).
pub const SIM_RAW_CONFIG: u64 = 0x01CD;

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

pub(super) static SIM_ON: AtomicBool = AtomicBool::new(false);

/// CPUID of the simulated CPU (CPUID does not depend on the simulator's state).
pub struct SimCpuid(pub SimCpu);

impl Cpuid for SimCpuid {
    fn cpuid(&self, leaf: u32, subleaf: u32) -> CpuIdResult {
        SimPmu::new(self.0).cpuid(leaf, subleaf)
    }
}

/// The simulated precise `mem-loads` (`pmu=sim` without `event=`).
pub const SIM_EVENT: Event = Event {
    precise: 2,
    ..Event::new(EventKind::MemLoads)
};

/// The period of `ev` under `pmu=sim` without `period=`: what it counts in
/// one tick ([`SimClock`]: [`SIM_INSTRUCTIONS_PER_TICK`] instructions at
/// two cycles each, one branch, one load), so every counter overflows
/// about once a tick and each sample's period is what it stands for.
pub fn sim_default_period(ev: &Event) -> u64 {
    match ev.kind {
        EventKind::Cycles | EventKind::RefCycles => 2 * SIM_INSTRUCTIONS_PER_TICK,
        EventKind::Instructions => SIM_INSTRUCTIONS_PER_TICK,
        _ => SIM_PERIOD,
    }
}

/// Builds a simulated PMU of `cpu` with the real driver programmed for
/// precise `mem-loads` at `period` with LBR (frozen on PMI) of the classes
/// in `branches` (perf's `branch_sample_type`), its PEBS records going to
/// `mem`.
pub fn build_sim(
    cpu: SimCpu,
    period: u64,
    branches: u64,
    mem: &mut DsMemory<'_>,
) -> Result<(SimState, PmuInfo), PmuError> {
    let events = [EventConfig {
        event: SIM_EVENT,
        mode: SampleMode::Period(period),
    }];
    build_sim_events(cpu, &events, branches, mem)
}

/// Builds a simulated PMU of `cpu` with the real driver programmed for
/// `events` (one counter each, as on a real PMU: the driver's counter
/// constraints apply) with LBR (frozen on PMI) of the classes in
/// `branches`, PEBS records going to `mem`.
pub fn build_sim_events(
    cpu: SimCpu,
    events: &[EventConfig],
    branches: u64,
    mem: &mut DsMemory<'_>,
) -> Result<(SimState, PmuInfo), PmuError> {
    let mut clock = SimClock::new(cpu, SIM_INSTRUCTIONS_PER_TICK);
    let info = cpuid::detect(&SimCpuid(cpu), &mut clock.sim);
    let mut driver = PmuDriver::new(&info)?;
    let opts = IntelOptions {
        lbr: Some(lbr_config(branches)),
        ..Default::default()
    };
    driver.configure(&mut clock.sim, Some(mem), events, &opts)?;
    let mem_kind = events
        .iter()
        .find(|c| uses_pebs(&c.event, info.vendor))
        .map_or(MemKind::Load, |c| super::hw::mem_kind(&c.event, &info));
    let format =
        arch_x86::pmu::perf::pebs_format(info.pebs_format.ok_or(PmuError::PebsUnavailable)?);
    let lbr =
        arch_x86::pmu::perf::lbr_format(driver.lbr_format()).ok_or(PmuError::LbrUnavailable)?;
    let state = SimState {
        clock,
        driver,
        decode: DecodeConfig {
            format,
            mem: mem_kind,
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
/// starts it, its LBR recording the classes in `branches`: without
/// `list`'s events, sampling every `period`-th load (precise mem-loads;
/// every load by default); with them, each event on its own counter every
/// `period` events (its own `/period=N/` first; by default
/// [`sim_default_period`]; the simulator runs on simulated time, so it has
/// no frequency mode and a `/freq=N/` term is ignored: the host refuses
/// it). Call once at boot, before
/// the NMI clock starts. Returns what was programmed, with the
/// capabilities for Hello (marked [`EventSource::Simulated`]); no events
/// for the default mem-loads.
pub fn setup_sim(
    cpu: SimCpu,
    list: &kcore::cmdline::EventList,
    period: Option<u64>,
    branches: u64,
) -> Result<HwSetup, PmuError> {
    let events = list.as_slice();
    let slot = percpu::boot_slot();
    if slot.is_live() {
        return Err(PmuError::InUse);
    }
    // SAFETY: boot context on the boot CPU, whose slot is not live.
    let mut mem = unsafe { slot.setup_memory() };
    let mut cfgs = [super::hw::NO_CONFIG; crate::sample::profile::MAX_EVENTS];
    let n = events.len().min(cfgs.len());
    for (i, (c, ev)) in cfgs.iter_mut().zip(events).enumerate() {
        // An event's own `/period=N/`, else `period=`, else a tick's worth.
        let own = match list.sampling(i) {
            Some(arch_x86::pmu::events::EventSampling::Period(p)) => Some(p),
            _ => None,
        };
        *c = EventConfig {
            event: *ev,
            mode: SampleMode::Period(own.or(period).unwrap_or_else(|| sim_default_period(ev))),
        };
    }
    // Without events, the precise mem-loads.
    let default = [EventConfig {
        event: SIM_EVENT,
        mode: SampleMode::Period(period.unwrap_or(SIM_PERIOD)),
    }];
    let programmed = if n == 0 { &default[..] } else { &cfgs[..n] };
    let (state, info) = build_sim_events(cpu, programmed, branches, &mut mem)?;
    let mut plan = percpu::Plan {
        sim: Some(cpu),
        configs: [super::hw::NO_CONFIG; crate::sample::profile::MAX_EVENTS],
        n: programmed.len(),
        branches,
    };
    plan.configs[..programmed.len()].copy_from_slice(programmed);
    let mut perf = super::hw::describe(&cfgs[..n], &info, true, branches);
    for (p, c) in perf.iter_mut().zip(&cfgs[..n]) {
        // The load-latency event the driver programs.
        if c.event.kind == EventKind::MemLoads {
            p.perf.config = SIM_RAW_CONFIG;
        }
    }
    let pebs_index = cfgs[..n]
        .iter()
        .position(|c| uses_pebs(&c.event, info.vendor));
    set_pebs_event(pebs_index.unwrap_or(0));
    PERIOD_IN_USE.store(period.unwrap_or(SIM_PERIOD), Ordering::Relaxed);
    // SAFETY: as above.
    unsafe { slot.publish_sim(state) };
    percpu::set_plan(plan);
    SIM_ON.store(true, Ordering::Release);
    Ok(HwSetup {
        caps: caps_of(&info, EventSource::Simulated),
        configs: cfgs,
        n,
        pebs: n == 0 || pebs_index.is_some(),
        lbr: true,
        perf,
    })
}

/// True once `pmu=sim` is set up: NMI-clock ticks drive the simulator.
pub fn sim_active() -> bool {
    SIM_ON.load(Ordering::Acquire)
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

/// NMI context, `pmu=sim`: one NMI-clock tick. Out of line, so the NMI
/// clock's own path stays short.
#[inline(never)]
pub fn on_tick(frame: &TrapFrame, entry_tsc: u64) {
    if !sim_active() {
        return;
    }
    let cap = &crate::sample::nmi::context(frame);
    let Some(slot) = percpu::slot_of(cap.cpu).filter(|s| s.is_live()) else {
        return;
    };
    // SAFETY: this CPU's NMI handler, and its slot is live.
    let Some((st, mut mem)) = (unsafe { slot.sim_in_nmi() }) else {
        return;
    };
    let user = cap.mode != Mode::Kernel;
    let lost = tick(
        st,
        &mut mem,
        cap.interrupted.rip,
        user,
        sim_regs(cap),
        &mut |x| {
            profile::pmu_overflow(cap, entry_tsc, x);
        },
    );
    if profile::throttled(cap.cpu) {
        // Throttled: the counter stops until the next tick.
        st.driver.stop(&mut st.clock.sim);
    }
    if let Some(n) = lost
        && n > 0
    {
        slot.pebs_lost.fetch_add(u64::from(n), Ordering::Relaxed);
    }
}
