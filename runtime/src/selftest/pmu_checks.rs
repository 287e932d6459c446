//! PMU detection, the start-up check, event descriptions, the simulated PMI round trip, and the hardware PMU.

use super::*;

/// Whether a PMU (hardware or simulated) samples: the clock's NMIs are
/// then not the overflows.
pub(super) fn cpu_pmu_sampling() -> bool {
    crate::sample::pmu::hw_active() || crate::sample::pmu::sim_active()
}

/// Detection through CPUID: on QEMU TCG no PMU is found, with a reason, and
/// the overflow source in use is the NMI clock (its NMIs arrive).
pub(super) fn pmu_detection_and_fallback() -> TestResult {
    // SAFETY: CPL 0; `detect` reads only MSRs CPUID advertises and writes none.
    let mut msr = unsafe { arch_x86::msr::CpuMsr::new() };
    let info = arch_x86::cpuid::detect(&arch_x86::cpuid::CpuCpuid, &mut msr);
    if info.has_pmu() {
        kprintln!(
            "selftest: a PMU is present (v{}, {} GP counters); fallback not exercised",
            info.version,
            info.gp_counters
        );
    } else {
        ensure!(
            info.missing_reason().is_some(),
            "no PMU and no reason given"
        );
        ensure!(
            arch_x86::pmu::selftest::check_detected(&info).is_err(),
            "the start-up check accepts a missing PMU"
        );
        ensure!(info.pebs_format.is_none(), "PEBS without a PMU");
        ensure!(info.lbr_depth() == 0, "LBR without a PMU");
        // The runtime's start-up check stops at detection (touching no
        // MSR) and says why the NMI clock is used.
        let r = crate::sample::pmu::startup_check(&info);
        let Verdict::Fallback(reason @ Reason::NotDetected(_)) = r.verdict else {
            fail!("start-up check without a PMU: {:?}", r.verdict);
        };
        let mut msg = Why::new();
        let _ = write!(msg, "{reason}");
        ensure!(
            msg.ends_with("falling back to the NMI clock"),
            "fallback message: {msg}"
        );
        kprintln!("selftest: start-up check: {msg}");
    }
    ensure!(
        !crate::sample::pmu::sim_active(),
        "simulated PMU active without pmu=sim"
    );
    ensure!(
        !crate::sample::pmu::hw_active(),
        "hardware PMU sampling during the self-test"
    );
    nmi_clock_ticks()
}

/// The start-up check (the same generic function the runtime runs on the
/// real PMU) against simulated PMUs: a healthy one is usable (every
/// instruction counted, one PMI per period); one whose counters read 0 and
/// drop writes (an emulator's) falls back with `CountersDead`; one whose
/// PMIs are never delivered (LVT stays masked) falls back with
/// `OverflowOff`.
pub(super) fn pmu_startup_check_sim() -> TestResult {
    use arch_x86::pmu::driver::startup_check;
    use arch_x86::pmu::sim::{DeadCounters, NoPmiDelivery, SimCpu, SimPmu, run_workload};
    use core::cell::Cell;
    const WORK: u64 = 200_000;
    const PERIOD: u64 = 2000;
    const STEP: u64 = 100;
    for (name, cpu) in [
        ("Sapphire Rapids", SimCpu::sapphire_rapids()),
        ("Zen 4", SimCpu::zen4()),
    ] {
        let info =
            arch_x86::cpuid::detect(&crate::sample::pmu::SimCpuid(cpu), &mut SimPmu::new(cpu));
        let pmis = Cell::new(0);
        let mut sim = SimPmu::new(cpu);
        let r = startup_check(
            &info,
            &mut sim,
            PERIOD,
            &mut |h, d| run_workload(h, d, WORK, STEP, &pmis),
            &|| pmis.get(),
        );
        ensure!(
            r.verdict == Verdict::Usable && r.counted == WORK && r.pmis == WORK / PERIOD,
            "{name}, healthy: {r:?}"
        );
        ensure!(
            sim.lvt() == arch_x86::pmu::LVT_MASKED,
            "{name}: LVT entry left armed"
        );
        let pmis = Cell::new(0);
        let mut dead = DeadCounters(SimPmu::new(cpu));
        let r = startup_check(
            &info,
            &mut dead,
            PERIOD,
            &mut |h, d| run_workload(h, d, WORK, STEP, &pmis),
            &|| pmis.get(),
        );
        match r.verdict {
            Verdict::Fallback(reason @ Reason::CountersDead { counted: 0 }) => {
                kprintln!("selftest: simulated {name}, counters dead: {reason}")
            }
            v => fail!("{name}, dead counters: {v:?}"),
        }
        let pmis = Cell::new(0);
        let mut masked = NoPmiDelivery(SimPmu::new(cpu));
        let r = startup_check(
            &info,
            &mut masked,
            PERIOD,
            &mut |h, d| run_workload(h, d, WORK, STEP, &pmis),
            &|| pmis.get(),
        );
        match r.verdict {
            Verdict::Fallback(
                reason @ Reason::OverflowOff {
                    expected: 100,
                    observed: 0,
                },
            ) if r.counted == WORK => {
                kprintln!("selftest: simulated {name}, PMIs never delivered: {reason}")
            }
            v => fail!("{name}, PMIs masked: {v:?} after counting {}", r.counted),
        }
    }
    Ok(())
}

/// Samples `ev` with `mode` on the real PMU while `work` runs; returns what
/// was programmed and the hardware path's counters for the run.
pub(super) fn sample_hw(
    info: &arch_x86::cpuid::PmuInfo,
    ev: arch_x86::pmu::Event,
    mode: arch_x86::pmu::SampleMode,
    work: impl FnOnce(),
) -> Result<(crate::sample::pmu::HwSetup, crate::sample::pmu::HwStats), crate::sample::pmu::HwError>
{
    crate::sample::pmu::reset_hw_stats();
    let cfg = [arch_x86::pmu::EventConfig { event: ev, mode }];
    let setup = crate::sample::pmu::setup_hw(info, &cfg, crate::sample::pmu::DEFAULT_BRANCHES)?;
    work();
    crate::sample::pmu::stop_hw();
    Ok((setup, crate::sample::pmu::hw_stats()))
}

/// The real PMU, on a CPU that has one (skipped, and says so, without):
/// the runtime's start-up check (counters advance over a workload of known
/// size; overflow NMIs arrive near the programmed period), then sampling
/// through the same path as a profile: instructions at a period (PMIs near
/// it; LBR branch stacks when present), cycles for 20 ms of TSC time, and
/// precise instructions whose PEBS records must decode when PEBS is
/// present. `cargo xtask hwcheck` prints these lines.
pub(super) fn pmu_hardware() -> TestResult {
    use crate::sample::pmu::{CHECK_INSTRUCTIONS, HwError};
    use arch_x86::pmu::{Event, EventKind, PmuError, SampleMode};
    // SAFETY: CPL 0; `detect` reads only MSRs CPUID advertises and writes none.
    let mut msr = unsafe { arch_x86::msr::CpuMsr::new() };
    let info = arch_x86::cpuid::detect(&arch_x86::cpuid::CpuCpuid, &mut msr);
    if let Some(why) = info.missing_reason() {
        kprintln!("selftest: pmu_hardware: skipped ({why})");
        return Ok(());
    }
    kprintln!(
        "selftest: pmu_hardware: PMU {:?} v{}, {} GP x {} bits, {} fixed x {} bits, PEBS format {:?}, LBR {:?} x {}",
        info.vendor,
        info.version,
        info.gp_counters,
        info.gp_width,
        info.fixed_counters(),
        info.fixed_width,
        info.pebs_format,
        info.lbr_format(),
        info.lbr_depth()
    );
    let r = crate::sample::pmu::startup_check(&info);
    kprintln!(
        "selftest: pmu_hardware: counting: {} instructions counted over a workload of {}",
        r.counted,
        CHECK_INSTRUCTIONS
    );
    kprintln!(
        "selftest: pmu_hardware: overflow: period {}: {} PMIs, expected about {}",
        r.period,
        r.pmis,
        r.expected_pmis()
    );
    if let Verdict::Fallback(reason) = r.verdict {
        fail!("start-up check: {reason}");
    }
    ensure!(
        r.counted >= CHECK_INSTRUCTIONS && r.counted <= 2 * CHECK_INSTRUCTIONS,
        "{} instructions counted for a workload of {CHECK_INSTRUCTIONS}",
        r.counted
    );
    let workload = || arch_x86::pmu::hw::workload(crate::sample::pmu::CHECK_ITERATIONS);
    // Instructions at a period, through the sampling path.
    let period = CHECK_INSTRUCTIONS / 64;
    let ins = Event::new(EventKind::Instructions);
    let (setup, s) = match sample_hw(&info, ins, SampleMode::Period(period), workload) {
        Ok(x) => x,
        Err(e) => fail!("sampling instructions: {e}"),
    };
    kprintln!(
        "selftest: pmu_hardware: sampling instructions at period {period}: {} samples in {} PMIs, expected about {}; {} unknown NMIs",
        s.samples,
        s.pmis,
        r.counted / period,
        s.unknown_nmis
    );
    if let Err(reason) = arch_x86::pmu::selftest::check_overflow(r.counted, period, s.samples) {
        fail!("sampling instructions: {reason}");
    }
    if info.lbr_depth() > 0 {
        kprintln!(
            "selftest: pmu_hardware: LBR: {} of {} samples carry a branch stack",
            s.with_branches,
            s.samples
        );
        ensure!(setup.lbr, "the CPU has LBR but sampling did not enable it");
        ensure!(s.with_branches > 0, "no sample carried a branch stack");
    } else {
        kprintln!("selftest: pmu_hardware: LBR: absent, not checked");
    }
    // Cycles for 20 ms of TSC time: about 20 PMIs at a period of a
    // millisecond of TSC ticks when the core runs near the TSC rate.
    let tsc_hz = crate::time::tsc_hz();
    if tsc_hz > 0 {
        let spin = || {
            let t0 = cpu::rdtsc();
            while cpu::rdtsc().wrapping_sub(t0) < tsc_hz / 50 {
                core::hint::spin_loop();
            }
        };
        let cyc = Event::new(EventKind::Cycles);
        let (_, s) = match sample_hw(&info, cyc, SampleMode::Period(tsc_hz / 1000), spin) {
            Ok(x) => x,
            Err(e) => fail!("sampling cycles: {e}"),
        };
        kprintln!(
            "selftest: pmu_hardware: sampling cycles at period {} (1 ms of TSC) for 20 ms: {} samples (about 20 when cycles run at the TSC rate)",
            tsc_hz / 1000,
            s.samples
        );
        ensure!(
            (4..=100).contains(&s.samples),
            "{} cycle samples in 20 ms at 1 kHz of TSC",
            s.samples
        );
    }
    // PEBS records decode.
    if info.pebs_format.is_some() {
        let pins = Event {
            precise: 1,
            ..Event::new(EventKind::Instructions)
        };
        match sample_hw(&info, pins, SampleMode::Period(period), workload) {
            Err(HwError::Pmu(PmuError::PebsUnknownFormat(f))) => {
                kprintln!(
                    "selftest: pmu_hardware: PEBS: format {f} unknown to the decoder, PEBS disabled"
                )
            }
            Err(e) => fail!("sampling {}: {e}", pins),
            Ok((_, s)) => {
                kprintln!(
                    "selftest: pmu_hardware: PEBS: {} records decoded, {} lost, {} samples, expected about {}",
                    s.pebs_decoded,
                    s.pebs_lost,
                    s.samples,
                    r.counted / period
                );
                ensure!(
                    s.pebs_decoded >= r.counted / period / 2,
                    "only {} PEBS records decoded",
                    s.pebs_decoded
                );
                ensure!(
                    s.pebs_lost <= s.pebs_decoded / 10,
                    "{} PEBS records lost",
                    s.pebs_lost
                );
            }
        }
    } else {
        kprintln!("selftest: pmu_hardware: PEBS: absent, not checked");
    }
    ensure!(!crate::sample::pmu::hw_active(), "the PMU still samples");
    Ok(())
}

/// The simulated PMU (no command line needed) through the real driver:
/// counters advance, the overflow comes at the programmed period, the PMI
/// re-arms the LVT entry, the PEBS record decodes to the fed context and
/// the LBR stack holds the branch between the last two ticks.
pub(super) fn pmu_sim_pmi_round_trip() -> TestResult {
    use arch_x86::pmu::sim::{SimCpu, SimRegs};
    const PERIOD: u64 = 5;
    let ip = |t: u64| 0x40_1000 + 0x10 * t;
    let out = crate::sample::pmu::with_check_memory(|mem| -> TestResult {
        let (mut st, info) = match crate::sample::pmu::build_sim(
            SimCpu::sapphire_rapids(),
            PERIOD,
            crate::sample::pmu::DEFAULT_BRANCHES,
            mem,
        ) {
            Ok(x) => x,
            Err(e) => fail!("driver on the simulator: {e}"),
        };
        ensure!(
            info.pebs_format == Some(5) && info.lbr_depth() == 32,
            "detected {:?}",
            info
        );
        st.driver.start(&mut st.clock.sim);
        let mut got: Option<(u64, u64, u64, usize, u64)> = None;
        let mut pmis = 0;
        for t in 1..=PERIOD {
            let mut gprs = [0u64; 16];
            gprs[0] = 0xA0 + t;
            gprs[7] = 0x7FFF_0000 - 8 * t;
            let regs = SimRegs { flags: 0x202, gprs };
            let lost = crate::sample::pmu::tick(&mut st, mem, ip(t), true, regs, &mut |x| {
                got = Some((
                    x.precise_ip.unwrap_or(0),
                    x.pebs_regs.map_or(0, |r| r.get(sampler::regs::Reg::Ax)),
                    x.mem.map_or(0, |m| m.addr),
                    x.branches.map_or(0, |b| b.entries.len()),
                    x.branches
                        .and_then(|b| b.entries.first())
                        .map_or(0, |e| e.to),
                ));
            });
            if t < PERIOD {
                ensure!(lost.is_none(), "PMI after {t} of {PERIOD} events");
                let n = st.driver.events_since_reload(&mut st.clock.sim, 0);
                ensure!(n == Some(t), "counter at {n:?} after {t} events");
            } else if let Some(l) = lost {
                pmis += 1;
                ensure!(l == 0, "{l} PEBS records lost");
            }
        }
        ensure!(pmis == 1, "no PMI at the programmed period");
        ensure!(
            st.clock.sim.lvt() == arch_x86::pmu::LVT_PMI_NMI,
            "LVT entry not re-armed: {:#x}",
            st.clock.sim.lvt()
        );
        let Some((pip, ax, addr, nbr, to)) = got else {
            fail!("the PMI produced no sample");
        };
        ensure!(pip == ip(PERIOD), "PEBS IP {pip:#x}");
        ensure!(ax == 0xA0 + PERIOD, "PEBS AX {ax:#x}");
        ensure!(addr == 0x7FFF_0000 - 8 * PERIOD, "PEBS address {addr:#x}");
        ensure!(nbr > 0, "no LBR entries");
        ensure!(to == ip(PERIOD - 1), "newest branch ends at {to:#x}");
        Ok(())
    });
    match out {
        Some(r) => r,
        None => fail!("check memory busy"),
    }
}

/// Two counters at once on the simulated PMU, through the runtime's glue
/// (`tick`, `service_pmi`): cycles:u on its fixed counter and precise
/// mem-loads on a PEBS-capable GP counter, both overflowing in the same
/// tick; each PMI hands one sample per overflowed counter to the
/// sampler, tagged with its event index (the PEBS one with its record).
pub(super) fn pmu_sim_two_counters() -> TestResult {
    use crate::sample::pmu::{SIM_EVENT, SIM_INSTRUCTIONS_PER_TICK};
    use arch_x86::pmu::sim::{SimCpu, SimRegs};
    use arch_x86::pmu::{Event, EventConfig, EventKind, SampleMode};
    const TICKS: u64 = 12;
    let cycles = Event {
        kernel: false,
        ..Event::new(EventKind::Cycles)
    };
    // Two cycles an instruction: cycles overflow every tick, loads (one a
    // tick) every third.
    let cfgs = [
        EventConfig {
            event: cycles,
            mode: SampleMode::Period(2 * SIM_INSTRUCTIONS_PER_TICK),
        },
        EventConfig {
            event: SIM_EVENT,
            mode: SampleMode::Period(3),
        },
    ];
    let out = crate::sample::pmu::with_check_memory(|mem| -> TestResult {
        let (mut st, _) = match crate::sample::pmu::build_sim_events(
            SimCpu::sapphire_rapids(),
            &cfgs,
            crate::sample::pmu::DEFAULT_BRANCHES,
            mem,
        ) {
            Ok(x) => x,
            Err(e) => fail!("two events on the simulator: {e}"),
        };
        st.driver.start(&mut st.clock.sim);
        let (mut per_event, mut pmis, mut both) = ([0u64; 2], 0, 0);
        for t in 1..=TICKS {
            let mut gprs = [0u64; 16];
            gprs[7] = 0x7FFF_0000 - 8 * t;
            let regs = SimRegs { flags: 0x202, gprs };
            let mut seen = [0u32; 2];
            let mut bad = None;
            let lost =
                crate::sample::pmu::tick(&mut st, mem, 0x40_1000 + t, true, regs, &mut |x| {
                    let e = usize::from(x.event);
                    match (e, x.precise_ip.is_some()) {
                        (0, false) | (1, true) => seen[e] += 1,
                        other => bad = Some(other),
                    }
                });
            if let Some((e, precise)) = bad {
                fail!("tick {t}: a sample of event {e} (precise: {precise})");
            }
            if let Some(l) = lost {
                pmis += 1;
                ensure!(l == 0, "{l} PEBS records lost");
            }
            both += u64::from(seen == [1, 1]);
            per_event[0] += u64::from(seen[0]);
            per_event[1] += u64::from(seen[1]);
        }
        ensure!(pmis == TICKS, "{pmis} PMIs in {TICKS} ticks");
        ensure!(
            per_event == [TICKS, TICKS / 3],
            "samples per event {per_event:?}, expected [{TICKS}, {}]",
            TICKS / 3
        );
        ensure!(both == TICKS / 3, "{both} PMIs with both counters");
        kprintln!(
            "selftest: simulated two counters: {} cycles:u + {} mem-loads:pp samples in {pmis} PMIs ({both} with both)",
            per_event[0],
            per_event[1]
        );
        Ok(())
    });
    match out {
        Some(r) => r,
        None => fail!("check memory busy"),
    }
}
