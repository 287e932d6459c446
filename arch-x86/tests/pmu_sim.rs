//! Host tests: the real PMU drivers run against the simulated PMU, and their
//! raw records are decoded by `sampler::pebs` / `sampler::lbr`.

use arch_x86::cpuid::{self, LbrKind, PmuInfo, Vendor};
use arch_x86::msr::{Msr, addr};
use arch_x86::pmu::amd::AmdPmu;
use arch_x86::pmu::ds::{DsArea, DsMemory};
use arch_x86::pmu::events::{self, Event, EventKind};
use arch_x86::pmu::intel::{IntelOptions, IntelPmu};
use arch_x86::pmu::lbr::{LbrConfig, LbrDriver, LbrRawFormat, filter};
use arch_x86::pmu::models;
use arch_x86::pmu::selftest::{self, Reason, Verdict};
use arch_x86::pmu::sim::{BranchKind, SimBranch, SimCpu, SimLbr, SimMem, SimPmu, SimRegs, SimStep};
use arch_x86::pmu::{Counter, EventConfig, PmiSummary, PmuError, SampleMode};
use sampler::lbr::{self as slbr, LbrFormat, RawBranch as SRaw};
use sampler::pebs::{self, DecodeConfig, MemKind, PebsFormat};
use sampler::regs::Reg;

fn detect(sim: &mut SimPmu) -> PmuInfo {
    // The simulator is both the CPUID source and the MSR space.
    let snapshot = SimCpuid(sim.cpu());
    cpuid::detect(&snapshot, sim)
}

/// CPUID of a fresh simulator of the same CPU (CPUID does not depend on state).
struct SimCpuid(SimCpu);
impl cpuid::Cpuid for SimCpuid {
    fn cpuid(&self, leaf: u32, sub: u32) -> cpuid::CpuIdResult {
        cpuid::Cpuid::cpuid(&SimPmu::new(self.0), leaf, sub)
    }
}

fn intel(version: u8, pebs_format: Option<u8>, lbr: SimLbr) -> SimCpu {
    SimCpu::Intel {
        model: 0x3C,
        stepping: 1,
        hybrid: None,
        version,
        gp: 4,
        fixed: if version >= 2 { 3 } else { 0 },
        gp_width: 48,
        fixed_width: 48,
        pebs_format,
        pebs_baseline: pebs_format.is_some_and(|f| f >= 4),
        pebs_trap: true,
        full_width: version >= 2,
        split_latency: false,
        lbr,
    }
}

fn ev(kind: EventKind, period: u64) -> EventConfig {
    EventConfig {
        event: Event::new(kind),
        mode: SampleMode::Period(period),
    }
}

fn precise(kind: EventKind, period: u64) -> EventConfig {
    EventConfig {
        event: Event {
            precise: 2,
            ..Event::new(kind)
        },
        mode: SampleMode::Period(period),
    }
}

/// Step `i` of a deterministic workload: one instruction, two cycles, a
/// branch every step (mispredicted every fifth), a load every step.
fn step(i: u64) -> SimStep {
    let ip = 0x40_1000 + 4 * (i % 64);
    let mut gprs = [0u64; 16];
    for (k, g) in gprs.iter_mut().enumerate() {
        *g = i * 100 + k as u64;
    }
    SimStep {
        ip,
        next_ip: ip + 4,
        user: true,
        regs: SimRegs { flags: 0x202, gprs },
        instructions: 1,
        cycles: 2,
        branch: Some(SimBranch {
            from: ip,
            to: 0x50_0000 + 16 * i,
            mispred: i.is_multiple_of(5),
            kind: if i.is_multiple_of(2) {
                BranchKind::Cond
            } else {
                BranchKind::Jmp
            },
        }),
        mem: Some(SimMem {
            addr: 0x10_0000 + 8 * i,
            latency: 20 + (i % 50) as u16,
            dse: 0x3,
            store: false,
        }),
    }
}

#[derive(Debug, Clone, Default)]
struct Seen {
    event: usize,
    period: u64,
    pebs: Option<Vec<u8>>,
    pebs_format: u8,
    lbr: Vec<SRaw>,
    lbr_format: Option<LbrRawFormat>,
}

/// A page-aligned PEBS buffer (as the runtime's and Linux's are).
#[repr(C, align(4096))]
struct PageBuf([u8; 16 * 1024]);

impl std::ops::Deref for PageBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl std::ops::DerefMut for PageBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

struct Rig {
    sim: SimPmu,
    area: Box<DsArea>,
    buf: Box<PageBuf>,
    seen: Vec<Seen>,
    total: PmiSummary,
    pmis: u64,
}

impl Rig {
    fn new(cpu: SimCpu) -> Self {
        Rig {
            sim: SimPmu::new(cpu),
            area: Box::new(DsArea::new()),
            buf: Box::new(PageBuf([0; 16 * 1024])),
            seen: Vec::new(),
            total: PmiSummary::default(),
            pmis: 0,
        }
    }

    fn info(&mut self) -> PmuInfo {
        detect(&mut self.sim)
    }

    fn intel(&mut self, events: &[EventConfig], opts: IntelOptions) -> Result<IntelPmu, PmuError> {
        let info = self.info();
        let mut d = IntelPmu::new(&info)?;
        let mut mem = DsMemory::new(&self.area, &mut self.buf);
        d.configure(&mut self.sim, Some(&mut mem), events, &opts)?;
        d.start(&mut self.sim);
        Ok(d)
    }

    fn record(&mut self, ov: &arch_x86::pmu::Overflow<'_>) {
        self.seen.push(Seen {
            event: ov.event,
            period: ov.period,
            pebs: ov.pebs.map(<[u8]>::to_vec),
            pebs_format: ov.pebs_format,
            lbr: ov
                .lbr
                .iter()
                .map(|r| SRaw {
                    from: r.from,
                    to: r.to,
                    info: r.info,
                })
                .collect(),
            lbr_format: Some(ov.lbr_format),
        });
    }

    fn add(&mut self, s: PmiSummary) {
        self.pmis += 1;
        self.total.overflows += s.overflows;
        self.total.pebs_records += s.pebs_records;
        self.total.pebs_lost += s.pebs_lost;
    }

    /// Run steps `range` through the simulator, taking each PMI with the driver.
    fn run_intel(&mut self, d: &mut IntelPmu, steps: impl Iterator<Item = SimStep>) {
        for s in steps {
            let mut mem = DsMemory::new(&self.area, &mut self.buf);
            if self.sim.advance(Some(&mut mem), &s) {
                self.sim.take_pmi();
                let tsc = self.sim.tsc();
                let mut got = Vec::new();
                let sum = d.handle_pmi(&mut self.sim, Some(&mut mem), tsc, &mut |ov| {
                    got.push(Seen {
                        event: ov.event,
                        period: ov.period,
                        pebs: ov.pebs.map(<[u8]>::to_vec),
                        pebs_format: ov.pebs_format,
                        lbr: ov
                            .lbr
                            .iter()
                            .map(|r| SRaw {
                                from: r.from,
                                to: r.to,
                                info: r.info,
                            })
                            .collect(),
                        lbr_format: Some(ov.lbr_format),
                    })
                });
                self.seen.extend(got);
                self.add(sum);
            }
        }
    }

    fn run_amd(&mut self, d: &mut AmdPmu, steps: impl Iterator<Item = SimStep>) {
        for s in steps {
            if self.sim.advance(None, &s) {
                self.sim.take_pmi();
                let tsc = self.sim.tsc();
                let mut got = Vec::new();
                let sum = d.handle_pmi(&mut self.sim, tsc, &mut |ov| got.push(ov.event));
                let _ = &got;
                for e in got {
                    self.seen.push(Seen {
                        event: e,
                        ..Seen::default()
                    });
                }
                self.add(sum);
            }
        }
        let _ = Self::record;
    }

    fn count(&self, event: usize) -> usize {
        self.seen.iter().filter(|s| s.event == event).count()
    }
}

// ---------------------------------------------------------------- detection

#[test]
fn detection_on_a_cpu_without_pmu_reports_no_pmu() {
    let mut sim = SimPmu::new(SimCpu::NoPmu);
    let info = detect(&mut sim);
    assert!(!info.has_pmu());
    assert_eq!(info.lbr, LbrKind::None);
    assert!(info.missing_reason().unwrap().contains("no PMU"));
    assert!(matches!(IntelPmu::new(&info), Err(PmuError::NoPmu)));
    assert!(matches!(AmdPmu::new(&info), Err(PmuError::NoPmu)));
    assert!(matches!(
        selftest::verdict(&info, 0, 1000, 0),
        Verdict::Fallback(Reason::NotDetected(_))
    ));
}

#[test]
fn detection_intel_skylake_and_sapphire_rapids() {
    let info = detect(&mut SimPmu::new(SimCpu::skylake()));
    assert_eq!(
        (info.vendor, info.family, info.model),
        (Vendor::Intel, 6, 0x5E)
    );
    assert_eq!(
        (
            info.version,
            info.gp_counters,
            info.gp_width,
            info.fixed_mask,
            info.fixed_width
        ),
        (4, 4, 48, 0b111, 48)
    );
    assert_eq!((info.pebs_format, info.pebs_baseline), (Some(3), false));
    assert_eq!(
        info.lbr,
        LbrKind::Legacy {
            format: 5,
            depth: 32,
            from: 0x680,
            to: 0x6C0,
            info: 0xDC0
        }
    );
    assert!(info.full_width_write());

    let info = detect(&mut SimPmu::new(SimCpu::sapphire_rapids()));
    assert_eq!(
        (info.version, info.gp_counters, info.fixed_mask),
        (5, 8, 0b1111)
    );
    assert_eq!((info.pebs_format, info.pebs_baseline), (Some(5), true));
    assert!(matches!(
        info.lbr,
        LbrKind::Arch {
            max_depth: 32,
            depth_mask: 0xF,
            call_stack: true,
            ..
        }
    ));
}

#[test]
fn detection_amd_variants() {
    let info = detect(&mut SimPmu::new(SimCpu::zen4()));
    assert_eq!(
        (info.vendor, info.gp_counters, info.amd_ext, info.amd_v2),
        (Vendor::Amd, 6, true, true)
    );
    assert_eq!(
        info.lbr,
        LbrKind::AmdV2 {
            depth: 16,
            freeze: false
        }
    );
    let info = detect(&mut SimPmu::new(SimCpu::Amd {
        family: 0x19,
        ext: true,
        v2: false,
        lbr_depth: 0,
    }));
    assert_eq!(
        (info.gp_counters, info.amd_ext, info.amd_v2, info.version),
        (6, true, false, 1)
    );
    let info = detect(&mut SimPmu::new(SimCpu::Amd {
        family: 0x10,
        ext: false,
        v2: false,
        lbr_depth: 0,
    }));
    assert_eq!(
        (info.gp_counters, info.amd_ext, info.has_pmu()),
        (4, false, true)
    );
}

// ------------------------------------------------------- Intel: counting

#[test]
fn intel_overflows_at_the_programmed_period_with_rearm() {
    let mut rig = Rig::new(SimCpu::skylake());
    let events = [
        ev(EventKind::Cycles, 1000),
        ev(EventKind::Branches, 37),
        ev(EventKind::Instructions, 250),
    ];
    let mut d = rig.intel(&events, IntelOptions::default()).unwrap();
    assert_eq!(d.counter_of(0), Some(Counter::Fixed(1)));
    assert_eq!(d.counter_of(1), Some(Counter::Gp(0)));
    assert_eq!(d.counter_of(2), Some(Counter::Fixed(0)));
    rig.run_intel(&mut d, (0..10_000).map(step));
    // 10,000 steps: 20,000 cycles, 10,000 branches, 10,000 instructions.
    assert_eq!(rig.count(0), 20);
    assert_eq!(rig.count(1), 10_000 / 37);
    assert_eq!(rig.count(2), 40);
    assert_eq!(rig.sim.stats.pmis_masked, 0, "LVT was not re-armed");
    assert_eq!(rig.sim.stats.bad_msr_writes, 0);
    assert!(rig.seen.iter().all(|s| s.pebs.is_none()));
}

#[test]
fn intel_v4_lbr_freeze_holds_the_lbrs_not_the_counters_until_status_reset() {
    let mut rig = Rig::new(SimCpu::skylake());
    let mut d = rig
        .intel(
            &[ev(EventKind::Instructions, 10)],
            IntelOptions {
                lbr: Some(LbrConfig::default()),
                ..Default::default()
            },
        )
        .unwrap();
    let mut i = 0;
    while !rig.sim.advance(None, &step(i)) {
        i += 1;
    }
    let status = rig.sim.read(addr::IA32_PERF_GLOBAL_STATUS);
    assert_eq!(status & (1 << 59), 0, "CTR_FRZ never set");
    assert_ne!(status & (1 << 58), 0, "LBR_FRZ set on PMI");
    assert_ne!(status & (1 << 32), 0, "fixed counter 0 overflow bit");
    let at_pmi = rig.sim.read(addr::IA32_FIXED_CTR0);
    let tos = rig.sim.read(addr::MSR_LASTBRANCH_TOS);
    for k in 0..5 {
        rig.sim.advance(None, &step(100 + k));
    }
    assert_eq!(
        rig.sim.read(addr::IA32_FIXED_CTR0),
        at_pmi + 5,
        "counters keep counting until the handler runs"
    );
    assert_eq!(rig.sim.read(addr::MSR_LASTBRANCH_TOS), tos, "LBRs frozen");
    assert_ne!(
        rig.sim.lvt() & arch_x86::pmu::LVT_MASKED,
        0,
        "delivery masks the LVT"
    );
    rig.sim.take_pmi();
    let s = d.handle_pmi(&mut rig.sim, None, 0, &mut |_| {});
    assert_eq!(s.overflows, 1);
    assert_eq!(
        rig.sim.read(addr::IA32_PERF_GLOBAL_STATUS),
        0,
        "status and freeze bits cleared"
    );
    assert_eq!(rig.sim.lvt(), arch_x86::pmu::LVT_PMI_NMI, "LVT re-armed");
    let before = rig.sim.read(addr::IA32_FIXED_CTR0);
    rig.sim.advance(None, &step(200));
    assert_eq!(
        rig.sim.read(addr::IA32_FIXED_CTR0),
        before + 1,
        "counting resumed"
    );
    assert_ne!(rig.sim.read(addr::MSR_LASTBRANCH_TOS), tos, "LBRs resumed");
}

#[test]
fn intel_v3_counts_exactly_without_freezing() {
    let mut rig = Rig::new(intel(3, None, SimLbr::None));
    let mut d = rig
        .intel(&[ev(EventKind::Instructions, 10)], IntelOptions::default())
        .unwrap();
    let mut i = 0;
    while !rig.sim.advance(None, &step(i)) {
        i += 1;
    }
    assert_eq!(
        rig.sim.read(addr::IA32_PERF_GLOBAL_CTRL),
        1 << 32,
        "perfmon not frozen"
    );
    rig.sim.take_pmi();
    d.handle_pmi(&mut rig.sim, None, 0, &mut |_| {});
    assert_eq!(rig.sim.read(addr::IA32_PERF_GLOBAL_CTRL), 1 << 32);
    assert_eq!(rig.sim.read(addr::IA32_PERF_GLOBAL_STATUS), 0);
    rig.run_intel(&mut d, (0..1000).map(step));
    assert_eq!(rig.count(0), 100);
}

#[test]
fn intel_v1_without_global_registers() {
    let mut rig = Rig::new(intel(1, None, SimLbr::None));
    let info = rig.info();
    assert_eq!((info.version, info.fixed_mask), (1, 0));
    // Instructions fall back to a GP counter; v1 writes PMCs 32 bits wide.
    let mut d = rig
        .intel(
            &[ev(EventKind::Instructions, 100), ev(EventKind::Cycles, 300)],
            IntelOptions::default(),
        )
        .unwrap();
    assert_eq!(d.counter_of(0), Some(Counter::Gp(0)));
    rig.run_intel(&mut d, (0..3000).map(step));
    assert_eq!(rig.count(0), 30);
    assert_eq!(rig.count(1), 20);
    assert_eq!(
        rig.sim.stats.bad_msr_writes, 0,
        "v1 has no global MSRs to write"
    );
    // Without full-width writes a period of 2^31 or more cannot be programmed.
    let mut rig = Rig::new(intel(1, None, SimLbr::None));
    assert!(matches!(
        rig.intel(&[ev(EventKind::Branches, 1 << 31)], IntelOptions::default()),
        Err(PmuError::BadPeriod { event: 0 })
    ));
}

#[test]
fn intel_counter_constraints() {
    let mut rig = Rig::new(SimCpu::skylake());
    let four = [
        ev(EventKind::Branches, 10),
        ev(EventKind::BranchMisses, 10),
        ev(EventKind::CacheMisses, 10),
        ev(EventKind::CacheReferences, 10),
    ];
    let mut five = four.to_vec();
    five.push(ev(EventKind::Raw(0x01C2), 10));
    assert!(rig.intel(&four, IntelOptions::default()).is_ok());
    assert_eq!(
        rig.intel(&five, IntelOptions::default()).unwrap_err(),
        PmuError::NoCounter { event: 4 }
    );
    // Fixed-counter events still fit beside four GP events.
    let mut seven = four.to_vec();
    seven.extend([
        ev(EventKind::Cycles, 10),
        ev(EventKind::Instructions, 10),
        ev(EventKind::RefCycles, 10),
    ]);
    assert!(rig.intel(&seven, IntelOptions::default()).is_ok());
    // Format 0 (Core 2): PEBS on PMC0 only, so two precise events do not fit.
    let mut rig = Rig::new(intel(2, Some(0), SimLbr::None));
    let two = [
        precise(EventKind::Instructions, 10),
        precise(EventKind::Branches, 10),
    ];
    assert_eq!(
        rig.intel(&two, IntelOptions::default()).unwrap_err(),
        PmuError::NoCounter { event: 1 }
    );
    // No PEBS at all.
    let mut rig = Rig::new(intel(4, None, SimLbr::None));
    assert_eq!(
        rig.intel(
            &[precise(EventKind::Instructions, 10)],
            IntelOptions::default()
        )
        .unwrap_err(),
        PmuError::PebsUnavailable
    );
    assert_eq!(
        rig.intel(&[ev(EventKind::Cycles, 0)], IntelOptions::default())
            .unwrap_err(),
        PmuError::BadPeriod { event: 0 }
    );
}

/// The GP counter of event `i`, which must be on one.
fn gp_of(d: &IntelPmu, i: usize) -> u8 {
    match d.counter_of(i) {
        Some(Counter::Gp(n)) => n,
        other => panic!("event {i} on {other:?}"),
    }
}

#[test]
fn core2_pmc0_only_event_lands_on_pmc0_and_counts() {
    // MEM_LOAD_RETIRED (0xcb) counts on PMC0 only (Linux
    // intel_core2_event_constraints), MUL (0x12) on PMC1 only. Listed after
    // an unconstrained event, 0xcb must still get PMC0.
    let row = models::intel_row(0x17).unwrap();
    let mut rig = Rig::new(SimCpu::from_row(row));
    let evs = [ev(EventKind::Branches, 10), ev(EventKind::Raw(0x01CB), 10)];
    let mut d = rig.intel(&evs, IntelOptions::default()).unwrap();
    assert_eq!(gp_of(&d, 1), 0, "MEM_LOAD_RETIRED.L1D_MISS on PMC0");
    assert_eq!(gp_of(&d, 0), 1);
    // Every load of the workload misses L1.
    rig.run_intel(&mut d, (0..100).map(step));
    assert_eq!((rig.count(0), rig.count(1)), (10, 10));
    // A PMC1-only event beside it fits; a second PMC0-only one does not.
    let fits = [
        ev(EventKind::Raw(0x0012), 10),
        ev(EventKind::Raw(0x01CB), 10),
    ];
    let d = rig.intel(&fits, IntelOptions::default()).unwrap();
    assert_eq!((gp_of(&d, 0), gp_of(&d, 1)), (1, 0));
    let clash = [
        ev(EventKind::Raw(0x01CB), 10),
        ev(EventKind::Raw(0x0010), 10),
    ];
    let err = rig.intel(&clash, IntelOptions::default()).unwrap_err();
    assert_eq!(err, PmuError::NoCounter { event: 1 });
    assert_eq!(err.to_string(), "event 1: no free counter can count it");
}

#[test]
fn nehalem_l1d_events_only_on_pmc0_and_pmc1() {
    // L1D_CACHE_LD (0x40) .. L1D_ALL_REF (0x43) count on PMC0-1 only
    // (Linux intel_nehalem_event_constraints).
    let row = models::intel_row(0x1E).unwrap();
    let mut rig = Rig::new(SimCpu::from_row(row));
    let evs = [
        ev(EventKind::Branches, 10),
        ev(EventKind::BranchMisses, 10),
        ev(EventKind::CacheReferences, 10),
        ev(EventKind::Raw(0x0F40), 40),
    ];
    let mut d = rig.intel(&evs, IntelOptions::default()).unwrap();
    assert!(gp_of(&d, 3) < 2, "L1D_CACHE_LD on PMC{}", gp_of(&d, 3));
    // (Nehalem's shortest period is 32.)
    rig.run_intel(&mut d, (0..200).map(step));
    assert_eq!(rig.count(3), 5, "every load counted");
    // Three of them for the two counters: refused.
    let three = [
        ev(EventKind::Raw(0x0F40), 10),
        ev(EventKind::Raw(0x0F41), 10),
        ev(EventKind::Raw(0x0143), 10),
    ];
    assert_eq!(
        rig.intel(&three, IntelOptions::default()).unwrap_err(),
        PmuError::NoCounter { event: 2 }
    );
    // Westmere has no such constraint on 0x40 (its own table).
    let wsm = models::intel_row(0x2C).unwrap();
    assert_eq!(wsm.gp_counters(0x0F40), u32::MAX);
    assert_eq!(wsm.gp_counters(0x0160), 0x1);
}

#[test]
fn sandy_bridge_l1d_pend_miss_on_pmc2_beside_other_events() {
    // L1D_PEND_MISS.PENDING (0x0148) counts on PMC2 only on Sandy Bridge
    // to Broadwell (Linux intel_snb/ivb/hsw/bdw_event_constraints).
    for model in [0x2A, 0x3A, 0x3C, 0x3D] {
        let row = models::intel_row(model).unwrap();
        let mut rig = Rig::new(SimCpu::from_row(row));
        let evs = [
            ev(EventKind::Branches, 10),
            ev(EventKind::BranchMisses, 10),
            ev(EventKind::CacheMisses, 10),
            ev(EventKind::Raw(0x0148), 1000),
        ];
        let mut d = rig.intel(&evs, IntelOptions::default()).unwrap();
        assert_eq!(gp_of(&d, 3), 2, "{}", row.name);
        let others: Vec<u8> = (0..3).map(|i| gp_of(&d, i)).collect();
        assert!(!others.contains(&2), "{}: {others:?}", row.name);
        // Latencies 20..=69, twice: 4450 pending cycles.
        rig.run_intel(&mut d, (0..100).map(step));
        assert_eq!(rig.count(3), 4, "{}", row.name);
        assert_eq!(rig.count(0), 10, "{}", row.name);
    }
}

#[test]
fn haswell_impossible_pmc2_set_is_refused() {
    // L1D_PEND_MISS.PENDING and CYCLE_ACTIVITY.CYCLES_L1D_PENDING (0x08a3)
    // both need PMC2 on Haswell: no assignment, whatever the order.
    let row = models::intel_row(0x3C).unwrap();
    let mut rig = Rig::new(SimCpu::from_row(row));
    let set = [
        ev(EventKind::Raw(0x0148), 10),
        ev(EventKind::Branches, 10),
        ev(EventKind::Raw(0x0108_08A3), 10),
    ];
    assert_eq!(
        rig.intel(&set, IntelOptions::default()).unwrap_err(),
        PmuError::NoCounter { event: 2 }
    );
    // On Skylake neither is constrained: the same set fits.
    let mut rig = Rig::new(SimCpu::skylake());
    assert!(rig.intel(&set, IntelOptions::default()).is_ok());
    // Sandy Bridge: INST_RETIRED.PREC_DIST on PMC1, L1D_PEND_MISS on PMC2,
    // MEM_TRANS_RETIRED on PMC3 and a free event fill all four.
    let snb = models::intel_row(0x2A).unwrap();
    let mut rig = Rig::new(SimCpu::from_row(snb));
    let four = [
        ev(EventKind::Branches, 10),
        ev(EventKind::Raw(0x02CD), 10),
        ev(EventKind::Raw(0x0148), 10),
        ev(EventKind::Raw(0x01C0), 10),
    ];
    let d = rig.intel(&four, IntelOptions::default()).unwrap();
    let got: Vec<u8> = (0..4).map(|i| gp_of(&d, i)).collect();
    assert_eq!(got, [0, 3, 2, 1]);
    let mut five = four.to_vec();
    five[0] = ev(EventKind::Raw(0x0248), 10);
    assert_eq!(
        rig.intel(&five, IntelOptions::default()).unwrap_err(),
        PmuError::NoCounter { event: 2 }
    );
}

#[test]
fn frequency_mode_converges_on_the_target_rate() {
    let mut rig = Rig::new(SimCpu::skylake());
    // 2 cycles per step: TSC advances 2 per step. Target: 1 sample per 2,000 TSC.
    let cfg = EventConfig {
        event: Event::new(EventKind::Instructions),
        mode: SampleMode::Frequency {
            hz: 1000,
            tsc_hz: 2_000_000,
        },
    };
    let mut d = rig.intel(&[cfg], IntelOptions::default()).unwrap();
    rig.run_intel(&mut d, (0..200_000).map(step));
    let last = rig.seen.last().unwrap().period;
    // 2,000 TSC ticks = 1,000 instructions.
    assert!((900..=1100).contains(&last), "period {last}");
    assert!(rig.seen.first().unwrap().period > 5_000);
}

// ---------------------------------------------------------------- PEBS

fn decode_cfg(format: u8, mem: MemKind, split: bool) -> DecodeConfig {
    DecodeConfig {
        format: PebsFormat::from_number(format).unwrap(),
        mem,
        split_latency: split,
        data_source: pebs::DataSource::Snb,
        pebs_trap: true,
    }
}

#[test]
fn pebs_each_fixed_format_through_driver_and_decoder() {
    for format in 0..=3u8 {
        let mut rig = Rig::new(intel(4, Some(format), SimLbr::None));
        let mut d = rig
            .intel(
                &[precise(EventKind::Instructions, 100)],
                IntelOptions::default(),
            )
            .unwrap();
        assert_eq!(d.pebs_format(), Some(format));
        rig.run_intel(&mut d, (0..1000).map(step));
        assert_eq!(rig.total.pebs_records, 10, "format {format}");
        assert_eq!(rig.total.pebs_lost, 0);
        assert_eq!(rig.sim.stats.pmis_masked, 0);
        for (k, s) in rig.seen.iter().enumerate() {
            let bytes = s.pebs.as_ref().unwrap();
            assert_eq!(s.pebs_format, format);
            assert_eq!(bytes.len(), [144, 176, 192, 200][format as usize]);
            let r = pebs::decode(bytes, &decode_cfg(format, MemKind::None, false)).unwrap();
            // The 100th instruction of each period retires at step 100k + 99.
            let i = 100 * k as u64 + 99;
            let expect = step(i);
            let regs = r.regs.unwrap();
            assert_eq!(regs.get(Reg::Ax), expect.regs.gprs[0]);
            assert_eq!(regs.get(Reg::Bx), expect.regs.gprs[1]);
            assert_eq!(regs.get(Reg::Sp), expect.regs.gprs[7]);
            assert_eq!(regs.get(Reg::R15), expect.regs.gprs[15]);
            if format >= 2 {
                assert_eq!((r.ip, r.precise), (expect.ip, true));
            } else {
                assert_eq!((r.ip, r.precise), (expect.next_ip, false));
            }
            assert_eq!(r.tsc.is_some(), format == 3);
            if let Some(t) = r.tsc {
                assert_eq!(t, 2 * (i + 1));
            }
        }
    }
}

#[test]
fn pebs_memory_fields_for_mem_loads() {
    let mut rig = Rig::new(intel(4, Some(3), SimLbr::None));
    let mut d = rig
        .intel(&[precise(EventKind::MemLoads, 10)], IntelOptions::default())
        .unwrap();
    assert_eq!(rig.sim.read(addr::MSR_PEBS_LD_LAT_THRESHOLD), 3);
    assert_ne!(
        rig.sim.read(addr::IA32_PEBS_ENABLE) & (1 << 32),
        0,
        "LL_EN for PMC0"
    );
    rig.run_intel(&mut d, (0..100).map(step));
    assert_eq!(rig.total.pebs_records, 10);
    let r = pebs::decode(
        rig.seen[0].pebs.as_ref().unwrap(),
        &decode_cfg(3, MemKind::Load, false),
    )
    .unwrap();
    let m = r.mem.unwrap();
    assert_eq!((m.addr, m.weight), (0x10_0000 + 8 * 9, 29));
    assert_eq!(
        m.data_src,
        pebs::data_src(pebs::DataSource::Snb, MemKind::Load, 0x3)
    );
}

/// Decodes the load records of a run of `mem-loads` on the typical CPU of
/// the row of `model`, every load with data-source encoding `dse`, with
/// the decoder set up from detection (as the runtime does).
fn mem_loads_data_src(model: u8, dse: u8) -> Vec<u64> {
    let row = models::intel_row(model).unwrap();
    let mut rig = Rig::new(SimCpu::from_row(row));
    let info = rig.info();
    assert_eq!(info.row().name, row.name);
    let mut d = rig
        .intel(&[precise(EventKind::MemLoads, 10)], IntelOptions::default())
        .unwrap();
    rig.run_intel(
        &mut d,
        (0..100).map(|i| {
            let mut s = step(i);
            if let Some(m) = s.mem.as_mut() {
                m.dse = dse;
            }
            s
        }),
    );
    assert!(!rig.seen.is_empty(), "{}", row.name);
    let cfg = DecodeConfig {
        format: PebsFormat::from_number(info.pebs_format.unwrap()).unwrap(),
        mem: MemKind::Load,
        split_latency: info.pebs_format.is_some_and(|f| f >= 5),
        data_source: info.pebs_data_source(),
        pebs_trap: info.pebs_trap(),
    };
    rig.seen
        .iter()
        .map(|s| {
            pebs::decode(s.pebs.as_ref().unwrap(), &cfg)
                .unwrap()
                .mem
                .unwrap()
                .data_src
        })
        .collect()
}

#[test]
fn pebs_data_source_table_is_the_models() {
    use pebs::mem::*;
    let snoop = |v: u64| (v >> SNOOP_SHIFT) & 0x1F;
    let lvl_num = |v: u64| (v >> LVLNUM_SHIFT) & 0xF;
    let tlb = |v: u64| (v >> TLB_SHIFT) & 0x7F;
    // Nehalem: 0x05 is an L3 hit with a snoop hit (Sandy Bridge: snoop
    // miss), and the record has no TLB bits.
    for v in mem_loads_data_src(0x1E, 0x5 | 1 << 4) {
        assert_eq!(snoop(v), SNOOP_HIT, "{v:#x}");
        assert_eq!(tlb(v), TLB_NA, "{v:#x}");
    }
    // Westmere: the same table, with TLB bits.
    for v in mem_loads_data_src(0x2C, 0x5 | 1 << 4) {
        assert_eq!((snoop(v), tlb(v)), (SNOOP_HIT, TLB_MISS | TLB_L2));
    }
    // Sandy Bridge: the base table.
    for v in mem_loads_data_src(0x2A, 0x5) {
        assert_eq!(snoop(v), SNOOP_MISS);
    }
    // Skylake client: 0x08 is L4; Skylake-X and Sapphire Rapids: PMEM.
    for v in mem_loads_data_src(0x5E, 0x8) {
        assert_eq!(lvl_num(v), LVLNUM_L4);
    }
    for model in [0x55, 0x6A, 0x8F] {
        for v in mem_loads_data_src(model, 0x8) {
            assert_eq!(lvl_num(v), LVLNUM_PMEM, "model {model:#x}");
        }
    }
    // Ice Lake client: 0x0B is remote RAM.
    for v in mem_loads_data_src(0x7E, 0xB) {
        assert_eq!(lvl_num(v), LVLNUM_RAM);
        assert_ne!(v & 1 << REMOTE_SHIFT, 0);
    }
}

#[test]
fn pebs_large_buffer_with_auto_reload() {
    let mut rig = Rig::new(intel(4, Some(3), SimLbr::None));
    let mut d = rig
        .intel(
            &[precise(EventKind::Instructions, 10)],
            IntelOptions {
                large_pebs: true,
                ..Default::default()
            },
        )
        .unwrap();
    assert!(d.large_pebs());
    let capacity = rig.buf.len() / 200;
    // The threshold leaves room for one record per PEBS-capable counter (4).
    let per_pmi = capacity - 4;
    rig.run_intel(&mut d, (0..10 * capacity as u64 * 3).map(step));
    // Many records per PMI: one PMI per `per_pmi` records.
    let pmis = 3 * capacity / per_pmi;
    assert_eq!(rig.pmis as usize, pmis);
    assert_eq!(rig.total.pebs_records as usize, pmis * per_pmi);
    // The rest is drained when the recording stops.
    let mut mem = DsMemory::new(&rig.area, &mut rig.buf);
    let mut rest = Vec::new();
    let s = d.flush_pebs(&mut mem, &mut |ov| rest.push(ov.pebs.unwrap().to_vec()));
    assert_eq!(s.pebs_records as usize, 3 * capacity - pmis * per_pmi);
    rig.seen.extend(rest.into_iter().map(|b| Seen {
        pebs: Some(b),
        ..Seen::default()
    }));
    assert_eq!(rig.seen.len(), 3 * capacity);
    assert_eq!(rig.sim.stats.pebs_dropped, 0);
    let ips: Vec<u64> = rig
        .seen
        .iter()
        .map(|s| {
            pebs::decode(
                s.pebs.as_ref().unwrap(),
                &decode_cfg(3, MemKind::None, false),
            )
            .unwrap()
            .ip
        })
        .collect();
    for (k, ip) in ips.iter().enumerate() {
        assert_eq!(*ip, step(10 * k as u64 + 9).ip, "record {k}");
    }
    // Frequency-mode PEBS events never use large PEBS.
    let mut rig = Rig::new(intel(4, Some(3), SimLbr::None));
    let f = EventConfig {
        event: Event {
            precise: 1,
            ..Event::new(EventKind::Instructions)
        },
        mode: SampleMode::Frequency {
            hz: 100,
            tsc_hz: 1 << 20,
        },
    };
    let d = rig
        .intel(
            &[f],
            IntelOptions {
                large_pebs: true,
                ..Default::default()
            },
        )
        .unwrap();
    assert!(!d.large_pebs());
}

#[test]
fn pebs_collisions_are_counted_as_lost() {
    let mut rig = Rig::new(intel(4, Some(1), SimLbr::None));
    // Both events overflow on the same step every 10 steps.
    let mut d = rig
        .intel(
            &[
                precise(EventKind::Instructions, 10),
                precise(EventKind::Branches, 10),
            ],
            IntelOptions::default(),
        )
        .unwrap();
    rig.run_intel(&mut d, (0..100).map(step));
    assert_eq!(rig.total.pebs_records, 0);
    assert_eq!(rig.total.pebs_lost, 20);
}

#[test]
fn pebs_unknown_format_is_refused() {
    let mut rig = Rig::new(intel(4, Some(9), SimLbr::None));
    let e = rig
        .intel(
            &[precise(EventKind::Instructions, 10)],
            IntelOptions::default(),
        )
        .unwrap_err();
    assert_eq!(e, PmuError::PebsUnknownFormat(9));
    assert!(e.to_string().contains("PEBS disabled"));
    // Non-precise events still work.
    assert!(
        rig.intel(&[ev(EventKind::Instructions, 10)], IntelOptions::default())
            .is_ok()
    );
}

fn adaptive_run(lbr: bool, mem_event: bool) -> (Rig, IntelPmu) {
    let mut rig = Rig::new(SimCpu::sapphire_rapids());
    let kind = if mem_event {
        EventKind::MemLoads
    } else {
        EventKind::Instructions
    };
    let opts = IntelOptions {
        lbr: lbr.then(LbrConfig::default),
        ..Default::default()
    };
    let mut d = rig.intel(&[precise(kind, 10)], opts).unwrap();
    rig.run_intel(&mut d, (0..100).map(step));
    (rig, d)
}

#[test]
fn adaptive_pebs_group_combinations() {
    for (lbr, mem) in [(false, false), (false, true), (true, false), (true, true)] {
        let (rig, d) = adaptive_run(lbr, mem);
        let cfg = d.pebs_data_cfg();
        assert_eq!(cfg & 1 != 0, mem, "meminfo group");
        assert_ne!(cfg & 2, 0, "GPR group always");
        assert_eq!(cfg & 8 != 0, lbr, "LBR group");
        assert_eq!(rig.total.pebs_records, 10, "lbr {lbr} mem {mem}");
        let size = pebs::adaptive_record_size(cfg);
        for (k, s) in rig.seen.iter().enumerate() {
            let bytes = s.pebs.as_ref().unwrap();
            assert_eq!(bytes.len(), size);
            let dc = decode_cfg(5, if mem { MemKind::Load } else { MemKind::None }, true);
            let r = pebs::decode(bytes, &dc).unwrap();
            let i = 10 * k as u64 + 9;
            assert_eq!(r.ip, step(i).ip);
            assert_eq!(r.tsc, Some(2 * (i + 1)));
            // mem-loads sits on PMC1 (not PMC0 on this model, which has the
            // auxiliary event), and so do precise instructions (Linux's 0xc0
            // constraint: neither PMC0 nor fixed counter 0 below :ppp).
            assert_eq!(r.applicable, 1 << 1);
            let regs = r.regs.unwrap();
            assert_eq!(
                (regs.get(Reg::Ax), regs.get(Reg::Cx), regs.get(Reg::Bx)),
                (i * 100, i * 100 + 2, i * 100 + 1)
            );
            assert_eq!(r.mem.is_some(), mem);
            if let Some(m) = r.mem {
                assert_eq!(
                    (m.addr, m.weight, m.ins_lat),
                    (0x10_0000 + 8 * i, 20 + i % 50, 2)
                );
            }
            if lbr {
                assert_eq!(r.lbr_len(), 32);
                let newest = slbr::decode(LbrFormat::Arch, &r.lbr().next().unwrap()).unwrap();
                // The branch of step i is recorded after the PEBS record of step i.
                assert_eq!(
                    (newest.from, newest.to),
                    (step(i - 1).ip, 0x50_0000 + 16 * (i - 1))
                );
                assert_eq!(s.lbr_format, Some(LbrRawFormat::Arch));
            }
        }
    }
}

#[test]
fn adaptive_pebs_xmm_group() {
    let mut rig = Rig::new(SimCpu::sapphire_rapids());
    let opts = IntelOptions {
        pebs_xmm: true,
        ..Default::default()
    };
    let mut d = rig
        .intel(&[precise(EventKind::Branches, 10)], opts)
        .unwrap();
    assert_eq!(d.pebs_data_cfg(), 0b110);
    rig.run_intel(&mut d, (0..20).map(step));
    assert_eq!(rig.total.pebs_records, 2);
    let bytes = rig.seen[0].pebs.as_ref().unwrap();
    assert_eq!(bytes.len(), 32 + 144 + 256);
    let r = pebs::decode(bytes, &decode_cfg(5, MemKind::None, true)).unwrap();
    // The simulator has no vector state: the group is present and zero.
    assert_eq!(r.xmm(), Some([0u64; 32]));
    assert_eq!(r.regs.unwrap().get(Reg::Ax), 900);
}

#[test]
fn adaptive_size_mismatch_is_skipped_and_counted() {
    let mut rig = Rig::new(SimCpu::sapphire_rapids());
    let mut d = rig
        .intel(
            &[precise(EventKind::Instructions, 10)],
            IntelOptions::default(),
        )
        .unwrap();
    // Change the groups behind the driver's back: records no longer match.
    rig.sim.write(addr::MSR_PEBS_DATA_CFG, 0x3);
    rig.run_intel(&mut d, (0..30).map(step));
    assert_eq!(rig.total.pebs_records, 0);
    assert_eq!(rig.total.pebs_lost, 3);
}

// ---------------------------------------------------------------- LBR

fn lbr_cpu(format: u8) -> SimCpu {
    SimCpu::Intel {
        model: 0x5E,
        stepping: 1,
        hybrid: None,
        version: 4,
        gp: 4,
        fixed: 3,
        gp_width: 48,
        fixed_width: 48,
        pebs_format: None,
        pebs_baseline: false,
        pebs_trap: true,
        full_width: true,
        split_latency: false,
        lbr: SimLbr::Legacy {
            format,
            depth: 32,
            from: 0x680,
            to: 0x6C0,
        },
    }
}

#[test]
fn legacy_lbr_formats_tos_walk_newest_first() {
    for format in [3u8, 4, 5, 6] {
        let mut rig = Rig::new(lbr_cpu(format));
        let mut d = rig
            .intel(
                &[ev(EventKind::Instructions, 50)],
                IntelOptions {
                    lbr: Some(LbrConfig::default()),
                    ..Default::default()
                },
            )
            .unwrap();
        rig.run_intel(&mut d, (0..100).map(step));
        assert_eq!(rig.seen.len(), 2);
        let s = &rig.seen[1];
        assert_eq!(s.lbr_format, Some(LbrRawFormat::Legacy(format)));
        assert_eq!(s.lbr.len(), 32, "format {format}");
        let mut out = [slbr::BranchEntry::default(); 32];
        let n = slbr::decode_stack(LbrFormat::Legacy(format), &s.lbr, &mut out);
        assert_eq!(n, 32);
        // Newest first: the PMI came at step 99, whose branch was recorded too.
        for (k, e) in out.iter().enumerate() {
            let i = 99 - k as u64;
            assert_eq!(
                (e.from, e.to),
                (step(i).ip, 0x50_0000 + 16 * i),
                "format {format} entry {k}"
            );
            assert_eq!(e.flags.mispred, i.is_multiple_of(5));
        }
        if matches!(format, 5 | 6) {
            assert_eq!(out[0].flags.cycles, 2);
        }
        assert_eq!(
            rig.sim.read(addr::IA32_PERF_GLOBAL_STATUS),
            0,
            "LBR_FRZ cleared"
        );
    }
}

#[test]
fn legacy_lbr_filter_and_v3_thaw() {
    let mut cpu = lbr_cpu(5);
    if let SimCpu::Intel { version, .. } = &mut cpu {
        *version = 3;
    }
    let mut rig = Rig::new(cpu);
    let cond_only = LbrConfig {
        filter: filter::USER | filter::COND,
        call_stack: false,
    };
    let mut d = rig
        .intel(
            &[ev(EventKind::Instructions, 50)],
            IntelOptions {
                lbr: Some(cond_only),
                ..Default::default()
            },
        )
        .unwrap();
    rig.run_intel(&mut d, (0..150).map(step));
    assert_eq!(rig.seen.len(), 3);
    let s = &rig.seen[2];
    // Only even steps take conditional branches.
    assert!(s.lbr.iter().all(|r| (r.to - 0x50_0000) / 16 % 2 == 0));
    assert_eq!(
        slbr::decode(LbrFormat::Legacy(5), &s.lbr[0]).unwrap().from,
        step(148).ip
    );
    // The v3 freeze cleared DEBUGCTL.LBR; the handler set it again.
    assert_ne!(rig.sim.read(addr::IA32_DEBUGCTL) & 1, 0);
}

#[test]
fn arch_lbr_entry_zero_newest_and_call_stack_mode() {
    let mut rig = Rig::new(SimCpu::sapphire_rapids());
    let cs = LbrConfig {
        filter: filter::ALL,
        call_stack: true,
    };
    let mut d = rig
        .intel(
            &[ev(EventKind::Instructions, 8)],
            IntelOptions {
                lbr: Some(cs),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(rig.sim.read(addr::IA32_LBR_DEPTH), 32);
    // Calls A -> B -> C, return from C, call D: the stack is [D, B, A].
    let calls = [
        (0x1000, 0x2000, BranchKind::Call),
        (0x2010, 0x3000, BranchKind::Call),
        (0x3010, 0x2014, BranchKind::Ret),
        (0x2020, 0x4000, BranchKind::IndCall),
    ];
    let mut steps: Vec<SimStep> = calls
        .iter()
        .map(|&(from, to, kind)| SimStep {
            branch: Some(SimBranch {
                from,
                to,
                mispred: false,
                kind,
            }),
            ..SimStep::plain(from, 1)
        })
        .collect();
    steps.extend((0..4).map(|i| SimStep::plain(0x4000 + 4 * i, 1)));
    rig.run_intel(&mut d, steps.into_iter());
    assert_eq!(rig.seen.len(), 1);
    let mut out = [slbr::BranchEntry::default(); 32];
    let n = slbr::decode_stack(LbrFormat::Arch, &rig.seen[0].lbr, &mut out);
    let froms: Vec<u64> = out[..n].iter().map(|e| e.from).collect();
    assert_eq!(froms, [0x2020, 0x1000]);
    assert_eq!(out[0].flags.kind, slbr::branch_kind::IND_CALL);
    let mut cc = [0u64; 8];
    let m = slbr::callchain_from_call_stack(0x400C, &out[..n], &mut cc);
    assert_eq!(&cc[..m], &[0x400C, 0x2020, 0x1000]);
}

// ---------------------------------------------------------------- AMD

#[test]
fn amd_legacy_four_counters() {
    let mut rig = Rig::new(SimCpu::Amd {
        family: 0x10,
        ext: false,
        v2: false,
        lbr_depth: 0,
    });
    let info = rig.info();
    let mut d = AmdPmu::new(&info).unwrap();
    assert_eq!(d.msrs(2), (0xC001_0002, 0xC001_0006));
    let evs = [
        ev(EventKind::Cycles, 100),
        ev(EventKind::Instructions, 100),
        ev(EventKind::Branches, 7),
        ev(EventKind::BranchMisses, 3),
    ];
    d.configure(&mut rig.sim, &evs, None).unwrap();
    d.start(&mut rig.sim);
    rig.run_amd(&mut d, (0..1000).map(step));
    assert_eq!(
        (rig.count(0), rig.count(1), rig.count(2), rig.count(3)),
        (20, 10, 142, 66)
    );
    assert_eq!(d.events_since_reload(&mut rig.sim, 2), Some(1000 % 7));
    assert_eq!(rig.sim.stats.pmis_masked, 0);
    let mut five = evs.to_vec();
    five.push(ev(EventKind::Cycles, 10));
    assert_eq!(
        d.configure(&mut rig.sim, &five, None).unwrap_err(),
        PmuError::NoCounter { event: 4 }
    );
    assert_eq!(
        d.configure(&mut rig.sim, &[ev(EventKind::RefCycles, 10)], None)
            .unwrap_err(),
        PmuError::EventUnavailable { event: 0 }
    );
}

#[test]
fn amd_extended_six_counters_and_perfmon_v2() {
    for v2 in [false, true] {
        let mut rig = Rig::new(SimCpu::Amd {
            family: 0x19,
            ext: true,
            v2,
            lbr_depth: 0,
        });
        let info = rig.info();
        let mut d = AmdPmu::new(&info).unwrap();
        assert_eq!(d.msrs(5), (0xC001_020A, 0xC001_020B));
        let evs: Vec<EventConfig> = (1..=6)
            .map(|p| ev(EventKind::Instructions, 10 * p))
            .collect();
        d.configure(&mut rig.sim, &evs, None).unwrap();
        d.start(&mut rig.sim);
        if v2 {
            assert_eq!(rig.sim.read(addr::AMD_PERF_CNTR_GLOBAL_CTL), 0x3F);
        }
        rig.run_amd(&mut d, (0..600).map(step));
        for (k, p) in (1..=6).enumerate() {
            assert_eq!(rig.count(k), 600 / (10 * p as usize), "v2 {v2} counter {k}");
        }
        if v2 {
            assert_eq!(rig.sim.read(addr::AMD_PERF_CNTR_GLOBAL_STATUS), 0);
        }
        assert_eq!(rig.sim.stats.bad_msr_writes, 0);
    }
}

#[test]
fn amd_family_15h_events_go_on_counters_they_may_use() {
    let mut rig = Rig::new(SimCpu::Amd {
        family: 0x15,
        ext: true,
        v2: false,
        lbr_depth: 0,
    });
    let info = rig.info();
    assert_eq!((info.family, info.gp_counters), (0x15, 6));
    let mut d = AmdPmu::new(&info).unwrap();
    // Instructions (EX) may use any counter; cycles (0x76) and the pre-Zen
    // cache events (0x7D, 0x7E) only PERF_CTR2:0. Listed unconstrained
    // first, the constrained ones must still get the low counters.
    let evs = [
        ev(EventKind::Instructions, 100),
        ev(EventKind::Branches, 7),
        ev(EventKind::BranchMisses, 3),
        ev(EventKind::Cycles, 100),
        ev(EventKind::CacheReferences, 10),
        ev(EventKind::CacheMisses, 10),
    ];
    d.configure(&mut rig.sim, &evs, None).unwrap();
    for (i, e) in evs.iter().enumerate() {
        let Some(Counter::Gp(c)) = d.counter_of(i) else {
            panic!("event {i} has no counter")
        };
        let (ctl, _) = d.msrs(c);
        let sel = rig.sim.read(ctl);
        assert_ne!(
            models::amd_counters(0x15, sel) & (1 << c),
            0,
            "{:?} on PERF_CTR{c}",
            e.event.kind
        );
    }
    d.start(&mut rig.sim);
    // Every load misses L1; every other one is served from L3 (misses L2).
    rig.run_amd(
        &mut d,
        (0..1000).map(|i| {
            let mut s = step(i);
            if let Some(m) = s.mem.as_mut() {
                m.dse = if i % 2 == 1 { 0x4 } else { 0x3 };
            }
            s
        }),
    );
    // Every event counted.
    assert_eq!(rig.count(3), 20, "cycles");
    assert_eq!(rig.count(0), 10, "instructions");
    assert_eq!((rig.count(1), rig.count(2)), (142, 66));
    assert_eq!((rig.count(4), rig.count(5)), (100, 50), "cache events");
    assert_eq!(rig.sim.stats.gp_faults(), 0);
    // Four events for the three counters of cycles: no assignment.
    let four = [ev(EventKind::Cycles, 10); 4];
    assert_eq!(
        d.configure(&mut rig.sim, &four, None).unwrap_err(),
        PmuError::NoCounter { event: 3 }
    );
}

#[test]
fn amd_late_nmis_after_a_handled_pmi_are_benign() {
    for cpu in [
        SimCpu::zen4(),
        SimCpu::Amd {
            family: 0x10,
            ext: false,
            v2: false,
            lbr_depth: 0,
        },
    ] {
        let mut rig = Rig::new(cpu);
        rig.sim.set_amd_late_nmis(true);
        let info = rig.info();
        let mut d = AmdPmu::new(&info).unwrap();
        // Two counters that overflow on the same step: two NMIs, the
        // second after the handler has handled both overflows.
        let evs = [ev(EventKind::Instructions, 10), ev(EventKind::Branches, 10)];
        d.configure(&mut rig.sim, &evs, None).unwrap();
        d.start(&mut rig.sim);
        let (mut handled, mut late, mut unknown, mut overflows) = (0, 0, 0, 0);
        // Overflows on steps 9, 19, ..., 199; the last late NMI on step 200.
        for s in (0..205).map(step) {
            if rig.sim.advance(None, &s) {
                rig.sim.take_pmi();
                let tsc = rig.sim.tsc();
                let sum = d.handle_pmi(&mut rig.sim, tsc, &mut |_| overflows += 1);
                match (sum.spurious, sum.late) {
                    (false, _) => handled += 1,
                    (true, true) => late += 1,
                    (true, false) => unknown += 1,
                }
            }
        }
        assert_eq!((handled, overflows), (20, 40), "{cpu:?}");
        assert_eq!(rig.sim.stats.late_nmis, 20, "{cpu:?}");
        assert_eq!((late, unknown), (20, 0), "{cpu:?}");
        // The allowance is bounded: NMIs beyond it with no overflow, or
        // with no PMI before them, are unknown.
        let tsc = rig.sim.tsc();
        let sum = d.handle_pmi(&mut rig.sim, tsc, &mut |_| {});
        assert!(
            sum.spurious && sum.late,
            "{cpu:?}: one more within min(2, active)"
        );
        let sum = d.handle_pmi(&mut rig.sim, tsc, &mut |_| {});
        assert!(sum.spurious && !sum.late, "{cpu:?}: beyond the allowance");
        d.configure(&mut rig.sim, &evs, None).unwrap();
        let sum = d.handle_pmi(&mut rig.sim, tsc, &mut |_| {});
        assert!(sum.spurious && !sum.late, "{cpu:?}: no PMI handled yet");
    }
}

#[test]
fn amd_lbr_ext_v2() {
    let mut rig = Rig::new(SimCpu::zen4());
    let info = rig.info();
    let mut d = AmdPmu::new(&info).unwrap();
    d.configure(
        &mut rig.sim,
        &[ev(EventKind::Instructions, 40)],
        Some(LbrConfig::default()),
    )
    .unwrap();
    d.start(&mut rig.sim);
    let mut lbrs = Vec::new();
    for i in 0..40 {
        if rig.sim.advance(None, &step(i)) {
            rig.sim.take_pmi();
            d.handle_pmi(&mut rig.sim, 0, &mut |ov| {
                assert_eq!(ov.lbr_format, LbrRawFormat::AmdV2);
                lbrs = ov
                    .lbr
                    .iter()
                    .map(|r| SRaw {
                        from: r.from,
                        to: r.to,
                        info: r.info,
                    })
                    .collect();
            });
        }
    }
    assert_eq!(lbrs.len(), 16);
    let mut out = [slbr::BranchEntry::default(); 16];
    let n = slbr::decode_stack(LbrFormat::AmdV2 { va_bits: 48 }, &lbrs, &mut out);
    assert_eq!(n, 16);
    for (k, e) in out.iter().enumerate() {
        let i = 39 - k as u64;
        assert_eq!(
            (e.from, e.to, e.flags.mispred),
            (step(i).ip, 0x50_0000 + 16 * i, i.is_multiple_of(5))
        );
    }
    // Recording resumed after the read.
    assert_ne!(rig.sim.read(addr::AMD_DBG_EXTN_CFG) & (1 << 6), 0);
}

// ---------------------------------------------------------------- self-test

#[test]
fn selftest_verdicts_against_the_simulator() {
    // A working PMU: count instructions, then sample them at a period.
    let mut rig = Rig::new(SimCpu::skylake());
    let info = rig.info();
    // Counting: a period too long to overflow during the workload.
    let mut d = rig
        .intel(
            &[ev(EventKind::Instructions, 1 << 40)],
            IntelOptions::default(),
        )
        .unwrap();
    rig.run_intel(&mut d, (0..10_250).map(step));
    let counted = d.events_since_reload(&mut rig.sim, 0).unwrap();
    assert_eq!(counted, 10_250);
    assert_eq!(rig.pmis, 0);
    // Sampling: the same workload at a period of 500.
    let mut d = rig
        .intel(&[ev(EventKind::Instructions, 500)], IntelOptions::default())
        .unwrap();
    rig.run_intel(&mut d, (0..10_250).map(step));
    let nmis = rig.pmis;
    assert_eq!(d.events_since_reload(&mut rig.sim, 0), Some(250));
    assert_eq!(
        selftest::verdict(&info, counted, 500, nmis),
        Verdict::Usable
    );
    // Counters that never move (what an emulator without a PMU shows).
    match selftest::verdict(&info, 0, 500, 0) {
        Verdict::Fallback(r @ Reason::CountersDead { .. }) => {
            assert!(r.to_string().contains("NMI clock"))
        }
        v => panic!("{v:?}"),
    }
    // Overflow interrupts that never come.
    assert!(matches!(
        selftest::verdict(&info, counted, 500, 0),
        Verdict::Fallback(Reason::OverflowOff {
            expected: 20,
            observed: 0
        })
    ));
    assert!(matches!(
        selftest::verdict(&info, counted, 500, 40),
        Verdict::Fallback(Reason::OverflowOff { .. })
    ));
}

#[test]
fn event_table_round_trip() {
    let e = events::parse("branch-misses:u").unwrap();
    let mut rig = Rig::new(SimCpu::skylake());
    let mut d = rig
        .intel(
            &[EventConfig {
                event: e,
                mode: SampleMode::Period(5),
            }],
            IntelOptions::default(),
        )
        .unwrap();
    let sel = rig.sim.read(addr::IA32_PERFEVTSEL0);
    assert_eq!(sel & 0xFFFF, 0x00C5);
    assert_eq!(sel & (3 << 16), 1 << 16, "user only");
    rig.run_intel(&mut d, (0..100).map(step));
    assert_eq!(rig.count(0), 4); // 20 mispredicts
    // Kernel-mode steps are not counted by a :u event.
    let mut rig = Rig::new(SimCpu::skylake());
    let mut d = rig
        .intel(
            &[EventConfig {
                event: e,
                mode: SampleMode::Period(5),
            }],
            IntelOptions::default(),
        )
        .unwrap();
    rig.run_intel(
        &mut d,
        (0..100).map(|i| SimStep {
            user: false,
            ..step(i)
        }),
    );
    assert_eq!(rig.count(0), 0);
}

// ---------------------------------------------------------------- pmu=sim

#[test]
fn sim_clock_carries_real_ips_registers_branches_and_memory() {
    use arch_x86::pmu::sim::SimClock;
    let mut clock = SimClock::new(SimCpu::sapphire_rapids(), 100);
    let info = detect(&mut clock.sim);
    assert_eq!(
        (info.lbr_format(), info.lbr_depth(), info.fixed_counters()),
        (Some(0x3F), 32, 4)
    );
    let mut d = IntelPmu::new(&info).unwrap();
    let area = Box::new(DsArea::new());
    let mut buf = vec![0u8; 16 * 1024];
    let events = [
        precise(EventKind::MemLoads, 3),
        EventConfig {
            event: Event::new(EventKind::Cycles),
            mode: SampleMode::Period(1000),
        },
    ];
    let opts = IntelOptions {
        lbr: Some(LbrConfig::default()),
        ..Default::default()
    };
    {
        let mut mem = DsMemory::new(&area, &mut buf);
        d.configure(&mut clock.sim, Some(&mut mem), &events, &opts)
            .unwrap();
    }
    d.start(&mut clock.sim);
    // An appliance loop over three functions.
    let ips = [0x40_1000u64, 0x40_2000, 0x40_3000];
    let mut samples = Vec::new();
    let mut cycles_samples = 0;
    for t in 0..60u64 {
        let ip = ips[(t % 3) as usize] + t;
        let mut gprs = [0u64; 16];
        gprs[0] = t;
        gprs[7] = 0x7FFF_0000 - 8 * t;
        let regs = SimRegs { flags: 0x202, gprs };
        let mut mem = DsMemory::new(&area, &mut buf);
        if clock.on_tick(Some(&mut mem), ip, true, regs) {
            clock.sim.take_pmi();
            let tsc = clock.sim.tsc();
            d.handle_pmi(
                &mut clock.sim,
                Some(&mut mem),
                tsc,
                &mut |ov| match ov.pebs {
                    Some(bytes) => {
                        let cfg = DecodeConfig {
                            format: PebsFormat::Adaptive(5),
                            mem: MemKind::Load,
                            split_latency: true,
                            data_source: pebs::DataSource::Skl { pmem: true },
                            pebs_trap: true,
                        };
                        let r = pebs::decode(bytes, &cfg).unwrap();
                        let stack = slbr::to_stack(LbrFormat::Arch, &r.lbr().collect::<Vec<_>>());
                        samples.push((r.ip, r.regs.unwrap().get(Reg::Ax), r.mem.unwrap(), stack));
                    }
                    None => cycles_samples += 1,
                },
            );
        }
    }
    // Every third tick is a load sample; 60 ticks x 200 cycles = 12 cycles samples.
    assert_eq!(samples.len(), 20);
    assert_eq!(cycles_samples, 12);
    for (k, (ip, ax, m, stack)) in samples.iter().enumerate() {
        let t = 3 * k as u64 + 2;
        assert_eq!(*ip, ips[(t % 3) as usize] + t);
        assert_eq!(*ax, t);
        assert_eq!(m.addr, 0x7FFF_0000 - 8 * t);
        assert!(m.weight >= 4 && m.data_src != 0);
        // The newest branch led from the previous tick's IP to this tick's one.
        assert!(!stack.entries.is_empty());
        assert_eq!(stack.entries[0].to, ips[((t - 1) % 3) as usize] + t - 1);
    }
    assert_eq!(clock.sim.stats.pmis_masked, 0);
}

// ------------------------------------------------ pre-Haswell IP fixup

#[test]
fn trap_like_pebs_ip_is_fixed_up_with_lbr_entry_zero() {
    // Sandy Bridge-like: PEBS format 1 (trap-like IP), LBR format 3, 16 deep.
    let cpu = SimCpu::Intel {
        model: 0x2A,
        stepping: 1,
        hybrid: None,
        version: 3,
        gp: 4,
        fixed: 3,
        gp_width: 48,
        fixed_width: 48,
        pebs_format: Some(1),
        pebs_baseline: false,
        pebs_trap: true,
        full_width: false,
        split_latency: false,
        lbr: SimLbr::Legacy {
            format: 3,
            depth: 16,
            from: 0x680,
            to: 0x6C0,
        },
    };
    let mut rig = Rig::new(cpu);
    let info = rig.info();
    assert_eq!(
        info.lbr,
        LbrKind::Legacy {
            format: 3,
            depth: 16,
            from: 0x680,
            to: 0x6C0,
            info: 0
        }
    );
    let opts = IntelOptions {
        lbr: Some(LbrConfig::default()),
        ..Default::default()
    };
    let mut d = rig
        .intel(&[precise(EventKind::Instructions, 5)], opts)
        .unwrap();
    // A loop: jmp at 0x900 to 0x1000; mov eax,1 (5 bytes); add rax,rbx (3); nop (1).
    const CODE: [u8; 10] = [0xB8, 1, 0, 0, 0, 0x48, 0x01, 0xD8, 0x90, 0xC3];
    let body = [
        (0x900u64, 0x1000u64, true),
        (0x1000, 0x1005, false),
        (0x1005, 0x1008, false),
        (0x1008, 0x1009, false),
    ];
    let steps = (0..40).map(|k| {
        let (ip, next_ip, jump) = body[k % 4];
        SimStep {
            next_ip,
            branch: jump.then_some(SimBranch {
                from: 0x900,
                to: 0x1000,
                mispred: false,
                kind: BranchKind::Jmp,
            }),
            ..SimStep::plain(ip, 1)
        }
    });
    rig.run_intel(&mut d, steps);
    assert_eq!(rig.seen.len(), 8);
    let read = |addr: u64, buf: &mut [u8]| -> bool {
        let Some(off) = addr
            .checked_sub(0x1000)
            .map(|o| o as usize)
            .filter(|&o| o < CODE.len())
        else {
            return false;
        };
        buf.fill(0x90);
        let n = (CODE.len() - off).min(buf.len());
        buf[..n].copy_from_slice(&CODE[off..off + n]);
        true
    };
    let mut fixed = Vec::new();
    for s in &rig.seen {
        let r = pebs::decode(
            s.pebs.as_ref().unwrap(),
            &decode_cfg(1, MemKind::None, false),
        )
        .unwrap();
        assert!(!r.precise);
        assert_eq!(s.lbr_format, Some(LbrRawFormat::Legacy(3)));
        let e0 = slbr::decode(LbrFormat::Legacy(3), &s.lbr[0]).unwrap();
        let lbr0 = SRaw {
            from: e0.from,
            to: e0.to,
            info: 0,
        };
        fixed.push(pebs::fixup_ip(r.ip, lbr0, 64, read, |a| a < 0x8000_0000_0000).unwrap());
    }
    // Period 5 over a 4-instruction loop lands on each instruction in turn;
    // the fixed-up IP is the instruction that retired the 5th event.
    assert_eq!(
        fixed,
        [0x900, 0x1000, 0x1005, 0x1008, 0x900, 0x1000, 0x1005, 0x1008]
    );
}

/// A Sandy Bridge-like CPU with PEBS format `format`, trap-like assists
/// when `trap`.
fn snb_with_trap(format: u8, trap: bool) -> SimCpu {
    let mut cpu = SimCpu::from_row(models::intel_row(0x2A).unwrap());
    if let SimCpu::Intel {
        pebs_format,
        pebs_baseline,
        pebs_trap,
        ..
    } = &mut cpu
    {
        *pebs_format = Some(format);
        *pebs_baseline = false;
        *pebs_trap = trap;
    }
    cpu
}

#[test]
fn pebs_trap_bit_decides_the_ip_fixup() {
    // (format, PERF_CAPABILITIES[6], record IP is the eventing IP, needs fixup)
    for (format, trap, eventing, fixup) in [
        (1, true, false, true),
        (1, false, true, false),
        (0, false, true, false),
        (2, true, true, false),
        (2, false, true, false),
    ] {
        let mut rig = Rig::new(snb_with_trap(format, trap));
        let info = rig.info();
        assert_eq!(info.pebs_trap(), trap);
        assert_eq!(
            info.pebs_ip_needs_fixup(),
            fixup,
            "format {format} trap {trap}"
        );
        let mut d = rig
            .intel(
                &[precise(EventKind::Instructions, 100)],
                IntelOptions::default(),
            )
            .unwrap();
        rig.run_intel(&mut d, (0..1000).map(step));
        assert_eq!(rig.seen.len(), 10);
        let cfg = DecodeConfig {
            pebs_trap: info.pebs_trap(),
            ..decode_cfg(format, MemKind::None, false)
        };
        for (k, s) in rig.seen.iter().enumerate() {
            let r = pebs::decode(s.pebs.as_ref().unwrap(), &cfg).unwrap();
            let expect = step(100 * k as u64 + 99);
            let ip = if eventing { expect.ip } else { expect.next_ip };
            assert_eq!(
                (r.ip, r.precise, r.needs_fixup),
                (ip, eventing, fixup),
                "format {format} trap {trap}"
            );
        }
    }
}

/// The typical CPU of the row of `model`, at `stepping`, reporting `model`.
fn row_cpu(model: u8, stepping: u8) -> SimCpu {
    let mut cpu = SimCpu::from_row(models::intel_row(model).unwrap());
    if let SimCpu::Intel {
        model: m,
        stepping: st,
        ..
    } = &mut cpu
    {
        (*m, *st) = (model, stepping);
    }
    cpu
}

#[test]
fn atom_bonnell_before_stepping_10_has_no_lbr() {
    let lbr_opts = IntelOptions {
        lbr: Some(LbrConfig::default()),
        ..Default::default()
    };
    // Bonnell (model 28) before stepping 10: the LBR cannot freeze on a
    // PMI. Detection reports none and the driver refuses branch stacks.
    for stepping in [0, 2, 9] {
        let mut rig = Rig::new(row_cpu(0x1C, stepping));
        let info = rig.info();
        assert_eq!(info.stepping, stepping);
        assert_eq!(info.lbr, LbrKind::None, "stepping {stepping}");
        assert_eq!(
            rig.intel(&[ev(EventKind::Instructions, 100)], lbr_opts)
                .err(),
            Some(PmuError::LbrUnavailable)
        );
        assert_eq!(rig.sim.stats.gp_faults(), 0);
    }
    // From stepping 10 on, and on the other Bonnell / Saltwell models,
    // the 8-entry LBR works and freezes on PMI.
    for (model, stepping) in [(0x1C, 10), (0x1C, 12), (0x26, 1), (0x36, 1)] {
        let mut rig = Rig::new(row_cpu(model, stepping));
        let info = rig.info();
        assert!(
            matches!(info.lbr, LbrKind::Legacy { depth: 8, .. }),
            "model {model:#x} stepping {stepping}: {:?}",
            info.lbr
        );
        let mut d = rig
            .intel(&[ev(EventKind::Instructions, 100)], lbr_opts)
            .unwrap();
        rig.run_intel(&mut d, (0..300).map(step));
        assert_eq!(rig.seen.len(), 3);
        // The stack is the one at the overflow: frozen by the PMI.
        for (k, s) in rig.seen.iter().enumerate() {
            let i = 100 * k as u64 + 99;
            assert_eq!(s.lbr[0].from & 0xFFFF_FFFF, step(i).ip, "{model:#x}");
        }
        assert_eq!(rig.sim.stats.gp_faults(), 0);
    }
}

#[test]
fn hybrid_parts_use_the_row_of_the_boot_cpus_core_type() {
    use models::CoreType;
    let e_row = models::intel_row_for_core(0x97, true, Some(CoreType::Atom)).unwrap();
    let p_row = models::intel_row_for_core(0x97, true, Some(CoreType::Core)).unwrap();
    assert_ne!(e_row.name, p_row.name);
    for (row, t) in [(e_row, CoreType::Atom), (p_row, CoreType::Core)] {
        let mut rig = Rig::new(SimCpu::from_row(row));
        let info = rig.info();
        assert!(info.hybrid, "{}", row.name);
        assert_eq!(info.core_type, Some(t));
        assert_eq!(info.row().name, row.name);
        let mut d = rig
            .intel(&[precise(EventKind::MemLoads, 10)], IntelOptions::default())
            .unwrap();
        // The core type's load-latency event, on a counter it allows, with
        // the auxiliary event only on the P-cores.
        let Some(Counter::Gp(c)) = d.counter_of(0) else {
            panic!("{}: mem-loads not on a GP counter", row.name)
        };
        let sel = rig.sim.read(addr::IA32_PERFEVTSEL0 + u32::from(c)) & 0xFFFF;
        assert_eq!(Some(sel as u16), row.ld_lat_event, "{}", row.name);
        assert_ne!(row.pebs_counters(sel) & (1 << c), 0, "{}", row.name);
        let aux = (0..u32::from(info.gp_counters)).any(|k| {
            rig.sim.read(addr::IA32_PERFEVTSEL0 + k) & 0xFFFF
                == u64::from(models::MEM_LOADS_AUX_EVENT)
        });
        assert_eq!(aux, t == CoreType::Core, "{}", row.name);
        // Records arrive, and their data source reads with the core
        // type's table: on the E-cores bit 4 is the lock bit.
        rig.run_intel(
            &mut d,
            (0..100).map(|i| {
                let mut s = step(i);
                if let Some(m) = s.mem.as_mut() {
                    m.dse = 0x1 | 1 << 4;
                }
                s
            }),
        );
        assert_eq!(rig.total.pebs_records, 10, "{}", row.name);
        assert_eq!(rig.sim.stats.pebs_no_assist, 0, "{}", row.name);
        assert_eq!(
            rig.sim.stats.gp_faults(),
            0,
            "{}: {:?}",
            row.name,
            rig.sim.stats
        );
        let cfg = DecodeConfig {
            format: PebsFormat::Adaptive(5),
            mem: MemKind::Load,
            split_latency: true,
            data_source: info.pebs_data_source(),
            pebs_trap: info.pebs_trap(),
        };
        let m = pebs::decode(rig.seen[0].pebs.as_ref().unwrap(), &cfg)
            .unwrap()
            .mem
            .unwrap();
        let locked = (m.data_src >> pebs::mem::LOCK_SHIFT) & 3 == pebs::mem::LOCK_LOCKED;
        assert_eq!(locked, t == CoreType::Atom, "{}", row.name);
    }
    // An unknown core type on a hybrid part: no row (architectural only);
    // a hybrid model without the hybrid bit (E-cores off): the P-cores'.
    assert_eq!(models::intel_row_for_core(0x97, true, None), None);
    assert_eq!(
        models::intel_row_for_core(0x9A, false, None).map(|r| r.name),
        Some(p_row.name)
    );
    assert_eq!(
        models::row_for_core(true, 6, 0x97, true, None).name,
        models::UNKNOWN_MODEL.name
    );
}

#[test]
fn adaptive_pebs_on_fixed_counters() {
    // Ice Lake: adaptive PEBS with no constraint on instructions.
    let mut rig = Rig::new(SimCpu::from_row(
        arch_x86::pmu::models::intel_row(0x7E).unwrap(),
    ));
    let opts = IntelOptions {
        large_pebs: true,
        ..Default::default()
    };
    let mut d = rig
        .intel(
            &[
                precise(EventKind::Instructions, 10),
                precise(EventKind::Branches, 7),
            ],
            opts,
        )
        .unwrap();
    assert_eq!(d.counter_of(0), Some(Counter::Fixed(0)));
    assert_eq!(d.counter_of(1), Some(Counter::Gp(0)));
    assert_eq!(rig.sim.read(addr::IA32_PEBS_ENABLE), 1 << 32 | 1);
    // No PMI bit for the PEBS fixed counter.
    assert_eq!(rig.sim.read(addr::IA32_FIXED_CTR_CTRL) & 0b1000, 0);
    assert!(d.large_pebs());
    rig.run_intel(&mut d, (0..69).map(step));
    let mut mem = DsMemory::new(&rig.area, &mut rig.buf);
    let mut got = Vec::new();
    let s = d.flush_pebs(&mut mem, &mut |ov| {
        got.push((ov.event, ov.pebs.unwrap().to_vec()))
    });
    // Instructions at steps 9, 19, ..., 59; branches at steps 6, 13, ..., 62:
    // no step has both, so there is no collision.
    let ins: Vec<u64> = got
        .iter()
        .filter(|(e, _)| *e == 0)
        .map(|(_, b)| pebs::decode(b, &decode_cfg(4, MemKind::None, true)).unwrap())
        .map(|r| {
            assert_eq!(r.applicable, 1 << 32);
            r.ip
        })
        .collect();
    assert_eq!(ins, (0..6).map(|k| step(10 * k + 9).ip).collect::<Vec<_>>());
    assert_eq!(got.iter().filter(|(e, _)| *e == 1).count(), 9);
    assert_eq!((s.pebs_records, s.pebs_lost), (15, 0));
}

// ------------------------------------------------ vendor-neutral driver

#[test]
fn start_up_check_through_the_vendor_neutral_driver() {
    use arch_x86::pmu::driver::{self, PmuDriver};
    for cpu in [
        SimCpu::skylake(),
        SimCpu::zen4(),
        SimCpu::Amd {
            family: 0x10,
            ext: false,
            v2: false,
            lbr_depth: 0,
        },
    ] {
        let mut sim = SimPmu::new(cpu);
        let info = detect(&mut sim);
        let counted = driver::count_instructions(&info, &mut sim, &mut |s| {
            for i in 0..5000 {
                s.advance(None, &step(i));
            }
        })
        .unwrap();
        assert_eq!(counted, 5000, "{cpu:?}");
        // Overflow phase: same workload, period 250, PMIs taken by the driver.
        let mut d = PmuDriver::new(&info).unwrap();
        d.configure(
            &mut sim,
            None,
            &[ev(EventKind::Instructions, 250)],
            &IntelOptions::default(),
        )
        .unwrap();
        d.start(&mut sim);
        let mut pmis = 0;
        for i in 0..5000 {
            if sim.advance(None, &step(i)) {
                sim.take_pmi();
                d.handle_pmi(&mut sim, None, 0, &mut |_| {});
                pmis += 1;
            }
        }
        assert_eq!(
            driver::overflow_verdict(&info, counted, 250, pmis),
            Verdict::Usable,
            "{cpu:?}"
        );
    }
    // No PMU: the counting phase already says why.
    let mut sim = SimPmu::new(SimCpu::NoPmu);
    let info = detect(&mut sim);
    let r = driver::count_instructions(&info, &mut sim, &mut |_| {}).unwrap_err();
    assert!(matches!(r, Reason::NotDetected(_)));
    assert!(r.to_string().contains("falling back to the NMI clock"));
    // A PMU whose counters never move: the workload retires nothing it counts.
    let mut sim = SimPmu::new(SimCpu::skylake());
    let info = detect(&mut sim);
    let r = driver::count_instructions(&info, &mut sim, &mut |_| {}).unwrap_err();
    assert_eq!(r, Reason::CountersDead { counted: 0 });
}

#[test]
fn startup_check_healthy_dead_and_undelivered() {
    use arch_x86::pmu::driver::startup_check;
    use arch_x86::pmu::sim::{DeadCounters, NoPmiDelivery, run_workload};
    use std::cell::Cell;
    const WORK: u64 = 100_000;
    const PERIOD: u64 = 1000;
    for cpu in [SimCpu::skylake(), SimCpu::sapphire_rapids(), SimCpu::zen4()] {
        // Healthy: counts the workload exactly, one PMI per period.
        let mut sim = SimPmu::new(cpu);
        let info = detect(&mut sim);
        let pmis = Cell::new(0);
        let r = startup_check(
            &info,
            &mut sim,
            PERIOD,
            &mut |h, d| run_workload(h, d, WORK, 100, &pmis),
            &|| pmis.get(),
        );
        assert_eq!(r.verdict, Verdict::Usable, "{cpu:?}");
        assert_eq!((r.counted, r.pmis, r.expected_pmis()), (WORK, 100, 100));
        assert_eq!(sim.lvt(), arch_x86::pmu::LVT_MASKED, "LVT left armed");
        // Counters that read 0 and ignore writes (TCG-like).
        let mut dead = DeadCounters(SimPmu::new(cpu));
        let pmis = Cell::new(0);
        let r = startup_check(
            &info,
            &mut dead,
            PERIOD,
            &mut |h, d| run_workload(h, d, WORK, 100, &pmis),
            &|| pmis.get(),
        );
        match r.verdict {
            Verdict::Fallback(reason @ Reason::CountersDead { counted: 0 }) => {
                assert!(reason.to_string().contains("do not advance"));
                assert!(reason.to_string().contains("NMI clock"));
            }
            v => panic!("{cpu:?}: {v:?}"),
        }
        // Counters work, PMIs are never delivered.
        let mut masked = NoPmiDelivery(SimPmu::new(cpu));
        let pmis = Cell::new(0);
        let r = startup_check(
            &info,
            &mut masked,
            PERIOD,
            &mut |h, d| run_workload(h, d, WORK, 100, &pmis),
            &|| pmis.get(),
        );
        assert_eq!(r.counted, WORK);
        assert_eq!(
            r.verdict,
            Verdict::Fallback(Reason::OverflowOff {
                expected: 100,
                observed: 0
            })
        );
        assert!(masked.0.stats.pmis_masked > 0, "{:?}", masked.0.stats);
    }
    // No PMU: nothing is touched, the reason says so.
    let mut sim = SimPmu::new(SimCpu::NoPmu);
    let info = detect(&mut sim);
    let r = startup_check(&info, &mut sim, PERIOD, &mut |_, _| {}, &|| 0);
    assert!(matches!(
        r.verdict,
        Verdict::Fallback(Reason::NotDetected(_))
    ));
    assert_eq!(sim.stats.bad_msr_writes + sim.stats.bad_msr_reads, 0);
}

// ------------------------------------- per-model facts (Linux perf_events)

/// Like `Rig::run_intel`, but a PMI is handled only `delay` steps after the
/// simulator raised it (NMI latency), the way records keep arriving on real
/// hardware before the handler drains them.
fn run_delayed(rig: &mut Rig, d: &mut IntelPmu, steps: impl Iterator<Item = SimStep>, delay: u32) {
    let mut waiting: Option<u32> = None;
    for s in steps {
        let mut mem = DsMemory::new(&rig.area, &mut rig.buf);
        let pending = rig.sim.advance(Some(&mut mem), &s);
        if pending && waiting.is_none() {
            waiting = Some(delay);
        }
        match waiting {
            Some(0) => {
                waiting = None;
                rig.sim.take_pmi();
                let tsc = rig.sim.tsc();
                let sum = d.handle_pmi(&mut rig.sim, Some(&mut mem), tsc, &mut |_| {});
                rig.add(sum);
            }
            Some(k) => waiting = Some(k - 1),
            None => {}
        }
    }
    if waiting.is_some() {
        let mut mem = DsMemory::new(&rig.area, &mut rig.buf);
        rig.sim.take_pmi();
        let tsc = rig.sim.tsc();
        let sum = d.handle_pmi(&mut rig.sim, Some(&mut mem), tsc, &mut |_| {});
        rig.add(sum);
    }
}

#[test]
fn adaptive_pebs_sets_the_per_counter_adaptive_bits() {
    // Ice Lake: without EVTSEL[34] / FIXED_CTR_CTRL[32+4n] the CPU writes
    // 32-byte basic records whatever PEBS_DATA_CFG says.
    let mut rig = Rig::new(SimCpu::ice_lake());
    let mut d = rig
        .intel(
            &[
                precise(EventKind::Instructions, 10),
                precise(EventKind::Branches, 7),
            ],
            IntelOptions::default(),
        )
        .unwrap();
    assert_eq!(d.counter_of(0), Some(Counter::Fixed(0)));
    rig.run_intel(&mut d, (0..70).map(step));
    let size = pebs::adaptive_record_size(d.pebs_data_cfg());
    // Step 69 completes both periods: one record for the two counters.
    assert_eq!((rig.count(0), rig.count(1)), (7, 10), "{:?}", rig.total);
    assert_eq!((rig.total.pebs_records, rig.total.pebs_lost), (16, 0));
    for s in &rig.seen {
        assert_eq!(s.pebs.as_ref().unwrap().len(), size);
    }
    assert_ne!(rig.sim.read(addr::IA32_PERFEVTSEL0) & (1 << 34), 0);
    assert_ne!(rig.sim.read(addr::IA32_FIXED_CTR_CTRL) & (1 << 32), 0);
    assert_eq!(rig.sim.stats.gp_faults(), 0);
}

#[test]
fn format4_fixed_counter_reset_slot_is_8_plus_n() {
    // Large PEBS on fixed counter 0: format 4 reloads it from DS slot 8.
    let mut rig = Rig::new(SimCpu::ice_lake());
    let mut d = rig
        .intel(
            &[precise(EventKind::Instructions, 10)],
            IntelOptions {
                large_pebs: true,
                ..Default::default()
            },
        )
        .unwrap();
    assert!(d.large_pebs());
    rig.run_intel(&mut d, (0..100).map(step));
    let mut mem = DsMemory::new(&rig.area, &mut rig.buf);
    let s = d.flush_pebs(&mut mem, &mut |_| {});
    assert_eq!(
        rig.total.pebs_records + s.pebs_records,
        10,
        "records after the first one need the reload from slot 8"
    );
}

#[test]
fn cycles_precise_before_ice_lake_uses_a_pebs_capable_alias() {
    // Skylake (format 3) and Haswell (format 2): 0x3C makes no PEBS assist.
    for cpu in [SimCpu::skylake(), intel(4, Some(2), SimLbr::None)] {
        let mut rig = Rig::new(cpu);
        let mut d = rig
            .intel(&[precise(EventKind::Cycles, 100)], IntelOptions::default())
            .unwrap();
        rig.run_intel(&mut d, (0..1000).map(step));
        // 1000 steps of 2 cycles.
        assert_eq!(rig.total.pebs_records, 20, "{cpu:?}");
        assert_eq!(rig.sim.stats.pebs_no_assist, 0);
        let Some(Counter::Gp(n)) = d.counter_of(0) else {
            panic!("{cpu:?}: precise cycles not on a GP counter")
        };
        let sel = rig.sim.read(addr::IA32_PERFEVTSEL0 + u32::from(n));
        assert_ne!(sel & 0xFF, 0x3C, "{cpu:?}");
    }
    // Ice Lake samples cycles:p on fixed counter 1.
    let mut rig = Rig::new(SimCpu::ice_lake());
    let mut d = rig
        .intel(&[precise(EventKind::Cycles, 100)], IntelOptions::default())
        .unwrap();
    assert_eq!(d.counter_of(0), Some(Counter::Fixed(1)));
    rig.run_intel(&mut d, (0..1000).map(step));
    assert_eq!(rig.total.pebs_records, 20);
}

#[test]
fn atom_cycles_precise_as_linux_samples_it() {
    // Silvermont: the Core 2 alias (INST_RETIRED.ANY_P, inv, cmask=16), on
    // PMC0 as intel_slm_pebs_event_constraints allows.
    let mut rig = Rig::new(SimCpu::from_row(models::intel_row(0x37).unwrap()));
    let mut d = rig
        .intel(&[precise(EventKind::Cycles, 100)], IntelOptions::default())
        .expect("Silvermont samples cycles:p");
    assert_eq!(d.counter_of(0), Some(Counter::Gp(0)));
    let sel = rig.sim.read(addr::IA32_PERFEVTSEL0);
    assert_eq!(
        sel & 0xFFFF_0000_FFFF & !(0xFF << 16),
        0xC0,
        "Silvermont: {sel:#x}"
    );
    assert_eq!(sel >> 23 & 1, 1, "inv");
    assert_eq!(sel >> 24 & 0xFF, 16, "cmask");
    rig.run_intel(&mut d, (0..1000).map(step));
    assert_eq!(rig.total.pebs_records, 20, "Silvermont: 2,000 cycles");
    assert_eq!(rig.sim.stats.pebs_no_assist, 0);
    // Goldmont (PMC0), Goldmont Plus and Tremont (any GP counter): 0x3C
    // itself, whose overflows make PEBS records there.
    for (model, any_gp) in [(0x5C, false), (0x7A, true), (0x86, true)] {
        let cpu = || SimCpu::from_row(models::intel_row(model).unwrap());
        let mut rig = Rig::new(cpu());
        let mut d = rig
            .intel(&[precise(EventKind::Cycles, 100)], IntelOptions::default())
            .unwrap_or_else(|e| panic!("model {model:#x} refuses cycles:p: {e:?}"));
        let Some(Counter::Gp(n)) = d.counter_of(0) else {
            panic!("model {model:#x}: cycles:p not on a GP counter")
        };
        let sel = rig.sim.read(addr::IA32_PERFEVTSEL0 + u32::from(n));
        assert_eq!(sel & 0xFFFF, 0x3C, "model {model:#x}");
        rig.run_intel(&mut d, (0..1000).map(step));
        assert_eq!(rig.total.pebs_records, 20, "model {model:#x}");
        assert_eq!(rig.sim.stats.pebs_no_assist, 0, "model {model:#x}");
        // Beside precise instructions: both fit only where PEBS is not
        // limited to PMC0.
        let mut rig = Rig::new(cpu());
        let both = rig.intel(
            &[
                precise(EventKind::Instructions, 1000),
                precise(EventKind::Cycles, 100),
            ],
            IntelOptions::default(),
        );
        assert_eq!(both.is_ok(), any_gp, "model {model:#x}: {:?}", both.err());
    }
}

fn sandy_bridge() -> SimCpu {
    SimCpu::Intel {
        model: 0x2A,
        stepping: 1,
        hybrid: None,
        version: 3,
        gp: 4,
        fixed: 3,
        gp_width: 48,
        fixed_width: 48,
        pebs_format: Some(1),
        pebs_baseline: false,
        pebs_trap: true,
        full_width: false,
        split_latency: false,
        lbr: SimLbr::Legacy {
            format: 3,
            depth: 16,
            from: 0x680,
            to: 0x6C0,
        },
    }
}

#[test]
fn pebs_counter_constraints_per_model() {
    use arch_x86::pmu::models;
    // Sandy Bridge: load latency on PMC3 only.
    let mut rig = Rig::new(sandy_bridge());
    let mut d = rig
        .intel(&[precise(EventKind::MemLoads, 10)], IntelOptions::default())
        .unwrap();
    rig.run_intel(&mut d, (0..100).map(step));
    assert_eq!(rig.total.pebs_records, 10, "Sandy Bridge mem-loads");
    assert_eq!(d.counter_of(0), Some(Counter::Gp(3)));
    // Sapphire Rapids: not on PMC0, and only with the auxiliary event.
    let mut rig = Rig::new(SimCpu::sapphire_rapids());
    let mut d = rig
        .intel(&[precise(EventKind::MemLoads, 10)], IntelOptions::default())
        .unwrap();
    rig.run_intel(&mut d, (0..100).map(step));
    assert_eq!(rig.total.pebs_records, 10, "Sapphire Rapids mem-loads");
    assert_eq!(rig.sim.stats.pebs_no_assist, 0);
    assert!(matches!(d.counter_of(0), Some(Counter::Gp(n)) if n != 0));
    let aux = (0..8).any(|k| {
        rig.sim.read(addr::IA32_PERFEVTSEL0 + k) & 0xFFFF == u64::from(models::MEM_LOADS_AUX_EVENT)
    });
    assert!(aux, "mem-loads-aux event programmed");
    // Silvermont: PEBS on PMC0 only.
    let slm = SimCpu::from_row(models::intel_row(0x37).unwrap());
    let mut rig = Rig::new(slm);
    assert_eq!(
        rig.intel(
            &[
                precise(EventKind::Instructions, 10),
                precise(EventKind::Branches, 10)
            ],
            IntelOptions::default()
        )
        .err(),
        Some(PmuError::NoCounter { event: 1 }),
        "Silvermont"
    );
    // Nehalem: mem-loads is 0x100B.
    let nhm = SimCpu::from_row(models::intel_row(0x1E).unwrap());
    let mut rig = Rig::new(nhm);
    let mut d = rig
        .intel(&[precise(EventKind::MemLoads, 32)], IntelOptions::default())
        .unwrap();
    rig.run_intel(&mut d, (0..320).map(step));
    assert_eq!(rig.total.pebs_records, 10, "Nehalem mem-loads");
    assert_eq!(rig.sim.read(addr::IA32_PERFEVTSEL0) & 0xFFFF, 0x100B);
}

#[test]
fn pebs_records_for_several_counters_go_to_each() {
    // Format 3 and adaptive: both events overflow on the same step and share
    // one record, which belongs to each of them.
    for cpu in [
        SimCpu::skylake(),
        SimCpu::ice_lake(),
        SimCpu::sapphire_rapids(),
    ] {
        let mut rig = Rig::new(cpu);
        let mut d = rig
            .intel(
                &[
                    precise(EventKind::Instructions, 10),
                    precise(EventKind::Branches, 10),
                ],
                IntelOptions::default(),
            )
            .unwrap();
        rig.run_intel(&mut d, (0..100).map(step));
        assert_eq!((rig.count(0), rig.count(1)), (10, 10), "{cpu:?}");
        assert_eq!(rig.total.pebs_lost, 0, "{cpu:?}");
    }
    // Format 1: a record whose status raced to 0 belongs to the only PEBS event.
    let mut rig = Rig::new(intel(4, Some(1), SimLbr::None));
    rig.sim.set_pebs_status_race(true);
    let mut d = rig
        .intel(
            &[precise(EventKind::Instructions, 10)],
            IntelOptions::default(),
        )
        .unwrap();
    rig.run_intel(&mut d, (0..100).map(step));
    assert_eq!((rig.count(0), rig.total.pebs_lost), (10, 0));
}

#[test]
fn older_parts_never_see_msrs_they_lack() {
    use arch_x86::pmu::models;
    let lbr = IntelOptions {
        lbr: Some(LbrConfig::default()),
        ..Default::default()
    };
    // Core 2 and Bonnell: no LBR_SELECT, no load latency.
    for model in [0x17u8, 0x1C] {
        let mut rig = Rig::new(SimCpu::from_row(models::intel_row(model).unwrap()));
        let mut d = rig.intel(&[ev(EventKind::Branches, 10)], lbr).unwrap();
        rig.run_intel(&mut d, (0..100).map(step));
        assert_eq!(rig.count(0), 10);
        assert_eq!(rig.sim.stats.gp_faults(), 0, "model {model:#x} LBR");
        let r = rig.intel(&[precise(EventKind::MemLoads, 10)], IntelOptions::default());
        assert_eq!(rig.sim.stats.gp_faults(), 0, "model {model:#x} mem-loads");
        assert_eq!(r.err(), Some(PmuError::EventUnavailable { event: 0 }));
    }
    // Knights Landing: 8 LBR entries, LIP format with the mispredict bit.
    let mut rig = Rig::new(SimCpu::from_row(models::intel_row(0x57).unwrap()));
    let mut d = rig.intel(&[ev(EventKind::Instructions, 50)], lbr).unwrap();
    rig.run_intel(&mut d, (0..100).map(step));
    assert_eq!(rig.sim.stats.gp_faults(), 0, "KNL");
    assert_eq!(rig.info().lbr_depth(), 8);
    let s = &rig.seen[1];
    assert_eq!(s.lbr.len(), 8);
    let LbrRawFormat::Legacy(f) = d.lbr_format() else {
        panic!("{:?}", d.lbr_format())
    };
    let e = slbr::decode(LbrFormat::Legacy(f), &s.lbr[4]).unwrap();
    assert_eq!((e.from, e.flags.mispred), (step(95).ip, true));
    // Sandy Bridge has no call-stack mode: refused, nothing written.
    let mut rig = Rig::new(sandy_bridge());
    let cs = IntelOptions {
        lbr: Some(LbrConfig {
            filter: filter::ALL,
            call_stack: true,
        }),
        ..Default::default()
    };
    let r = rig.intel(&[ev(EventKind::Instructions, 50)], cs);
    assert_eq!(rig.sim.stats.gp_faults(), 0, "call stack on SNB");
    assert_eq!(r.err(), Some(PmuError::LbrUnavailable));
}

#[test]
fn format4_without_baseline_writes_basic_records() {
    use arch_x86::pmu::models;
    let tremont = SimCpu::from_row(models::intel_row(0x86).unwrap());
    let mut rig = Rig::new(tremont);
    assert_eq!(
        (rig.info().pebs_format, rig.info().pebs_baseline),
        (Some(4), false)
    );
    let mut d = rig
        .intel(&[precise(EventKind::Branches, 10)], IntelOptions::default())
        .unwrap();
    rig.run_intel(&mut d, (0..100).map(step));
    assert_eq!((rig.total.pebs_records, rig.total.pebs_lost), (10, 0));
    for (k, s) in rig.seen.iter().enumerate() {
        let b = s.pebs.as_ref().unwrap();
        assert_eq!(b.len(), 32);
        let r = pebs::decode(b, &decode_cfg(4, MemKind::None, false)).unwrap();
        assert_eq!((r.ip, r.applicable), (step(10 * k as u64 + 9).ip, 1));
    }
    assert_eq!(rig.sim.stats.gp_faults(), 0);
}

#[test]
fn perfmon_is_never_frozen_and_lbrs_always_are() {
    use arch_x86::msr::debugctl;
    for cpu in [
        SimCpu::skylake(),
        SimCpu::ice_lake(),
        SimCpu::sapphire_rapids(),
    ] {
        let mut rig = Rig::new(cpu);
        let mut d = rig
            .intel(
                &[ev(EventKind::Instructions, 10)],
                IntelOptions {
                    lbr: Some(LbrConfig::default()),
                    ..Default::default()
                },
            )
            .unwrap();
        let dc = rig.sim.read(addr::IA32_DEBUGCTL);
        assert_eq!(dc & debugctl::FREEZE_PERFMON_ON_PMI, 0, "{cpu:?}");
        assert_ne!(dc & debugctl::FREEZE_LBRS_ON_PMI, 0, "{cpu:?} LBR freeze");
        // Events during the NMI latency are counted, not frozen away.
        let mut i = 0;
        while !rig.sim.advance(None, &step(i)) {
            i += 1;
        }
        let at_pmi = rig.sim.read(addr::IA32_FIXED_CTR0);
        for k in 1..=3 {
            rig.sim.advance(None, &step(i + k));
        }
        assert_eq!(rig.sim.read(addr::IA32_FIXED_CTR0), at_pmi + 3, "{cpu:?}");
        rig.sim.take_pmi();
        d.handle_pmi(&mut rig.sim, None, 0, &mut |_| {});
        assert_eq!(rig.sim.read(addr::IA32_PERF_GLOBAL_STATUS), 0, "{cpu:?}");
        // Call-stack mode never freezes the LBRs.
        let mut rig = Rig::new(cpu);
        rig.intel(
            &[ev(EventKind::Instructions, 10)],
            IntelOptions {
                lbr: Some(LbrConfig {
                    filter: filter::ALL,
                    call_stack: true,
                }),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(
            rig.sim.read(addr::IA32_DEBUGCTL) & debugctl::FREEZE_LBRS_ON_PMI,
            0
        );
    }
}

#[test]
fn overflow_during_the_handler_is_not_lost() {
    let mut rig = Rig::new(SimCpu::skylake());
    let mut d = rig
        .intel(&[ev(EventKind::Branches, 50)], IntelOptions::default())
        .unwrap();
    assert_eq!(d.counter_of(0), Some(Counter::Gp(0)));
    let mut armed = false;
    for i in 0..10_000 {
        let s = step(i);
        if rig.sim.advance(None, &s) {
            rig.sim.take_pmi();
            if !armed {
                // PMC0 overflows while the handler runs.
                rig.sim.overflow_during_handler(1);
                armed = true;
            }
            let mut got = Vec::new();
            let sum = d.handle_pmi(&mut rig.sim, None, 0, &mut |ov| got.push(ov.event));
            rig.seen.extend(got.into_iter().map(|e| Seen {
                event: e,
                ..Seen::default()
            }));
            rig.add(sum);
        }
    }
    // Every period sampled, plus the overflow that landed in the handler.
    assert_eq!(rig.count(0), 10_000 / 50 + 1, "branch samples");
    assert_eq!(
        rig.sim.stats.early_lvt_unmasks, 0,
        "LVT unmasked before re-enabling"
    );
}

#[test]
fn large_pebs_reserves_a_record_per_counter_and_counts_losses() {
    let large = IntelOptions {
        large_pebs: true,
        ..Default::default()
    };
    // A record every step; the handler runs 3 steps after the threshold PMI.
    let mut rig = Rig::new(SimCpu::skylake());
    let mut d = rig
        .intel(&[precise(EventKind::Instructions, 1)], large)
        .unwrap();
    run_delayed(&mut rig, &mut d, (0..2000).map(step), 3);
    assert_eq!(
        rig.sim.stats.pebs_dropped, 0,
        "no headroom for late records"
    );
    // A much later handler: the records past the end are counted as lost.
    let mut rig = Rig::new(SimCpu::skylake());
    let mut d = rig
        .intel(&[precise(EventKind::Instructions, 1)], large)
        .unwrap();
    run_delayed(&mut rig, &mut d, (0..2000).map(step), 20);
    assert!(rig.sim.stats.pebs_dropped > 0);
    let mut mem = DsMemory::new(&rig.area, &mut rig.buf);
    let rest = d.flush_pebs(&mut mem, &mut |_| {});
    // Every period is either a record or a counted loss.
    let delivered = rig.total.pebs_records + rest.pebs_records;
    assert!(rig.total.pebs_lost > 0, "lost records counted");
    assert_eq!(delivered + rig.total.pebs_lost, 2000);
}

#[test]
fn adaptive_pebs_lbr_entries_on_legacy_lbr_keep_their_info() {
    // Ice Lake: the record's LBR group holds legacy FROM/TO/LBR_INFO.
    let mut rig = Rig::new(SimCpu::ice_lake());
    let mut d = rig
        .intel(
            &[precise(EventKind::Instructions, 10)],
            IntelOptions {
                lbr: Some(LbrConfig::default()),
                ..Default::default()
            },
        )
        .unwrap();
    rig.run_intel(&mut d, (0..100).map(step));
    assert_eq!(rig.total.pebs_records, 10);
    let s = &rig.seen[3];
    let f = match s.lbr_format.unwrap() {
        LbrRawFormat::Arch => LbrFormat::Arch,
        LbrRawFormat::Legacy(n) => LbrFormat::Legacy(n),
        other => panic!("{other:?}"),
    };
    let r = pebs::decode(
        s.pebs.as_ref().unwrap(),
        &decode_cfg(4, MemKind::None, false),
    )
    .unwrap();
    let raw: Vec<SRaw> = r.lbr().collect();
    let mut out = [slbr::BranchEntry::default(); 32];
    let n = slbr::decode_stack(f, &raw, &mut out);
    assert_eq!(n, 32);
    // Record of step 39: the newest branch is step 38's; its cycle count
    // and the jump of step 37 (no type in legacy LBR_INFO) survive.
    assert_eq!(out[0].from, step(38).ip);
    assert_eq!(out[0].flags.cycles, 2, "cycles from LBR_INFO");
    assert_eq!(out[1].flags.kind, slbr::branch_kind::UNKNOWN, "branch type");
    assert_eq!(out[3].flags.mispred, 35 % 5 == 0);
}

#[test]
fn every_model_row_runs_detect_configure_pmi_stop_without_gp() {
    use arch_x86::msr::debugctl;
    use arch_x86::pmu::models::{INTEL_MODELS, ModelLbr};
    for row in INTEL_MODELS {
        let cpu = SimCpu::from_row(row);
        let mut rig = Rig::new(cpu);
        let info = rig.info();
        assert_eq!(
            (info.family, info.model),
            (6, row.models[0]),
            "{}",
            row.name
        );
        let pebs = row.pebs_format.filter(|_| !row.pebs_quirks.broken);
        assert_eq!(info.pebs_format, pebs, "{}", row.name);
        match row.lbr {
            ModelLbr::Legacy(l) => assert_eq!(info.lbr_depth(), l.depth, "{}", row.name),
            ModelLbr::Arch(d) => assert_eq!(info.lbr_depth(), d, "{}", row.name),
            ModelLbr::None => assert_eq!(info.lbr, LbrKind::None),
        }
        let mut events = vec![ev(EventKind::Instructions, 50)];
        // Periods above every model's minimum, and never completing on
        // the same step (a collision on formats 1-2).
        if pebs.is_some() {
            events.push(precise(EventKind::Branches, 37));
        }
        if row.ld_lat_event.is_some() && row.gp >= 4 {
            events.push(precise(EventKind::MemLoads, 41));
        }
        let opts = IntelOptions {
            lbr: (row.lbr != ModelLbr::None).then(LbrConfig::default),
            ..Default::default()
        };
        let mut d = match rig.intel(&events, opts) {
            Ok(d) => d,
            Err(e) => panic!("{}: {e}", row.name),
        };
        assert_eq!(
            rig.sim.read(addr::IA32_DEBUGCTL) & debugctl::FREEZE_PERFMON_ON_PMI,
            0
        );
        let mut i = 0;
        while rig.pmis == 0 && i < 1000 {
            rig.run_intel(&mut d, std::iter::once(step(i)));
            i += 1;
        }
        assert_eq!(rig.pmis, 1, "{}", row.name);
        assert!(!rig.seen.is_empty(), "{}", row.name);
        d.stop(&mut rig.sim);
        let mut mem = DsMemory::new(&rig.area, &mut rig.buf);
        d.flush_pebs(&mut mem, &mut |_| {});
        assert_eq!(
            rig.sim.stats.gp_faults(),
            0,
            "{}: {:?}",
            row.name,
            rig.sim.stats
        );
        assert_eq!(rig.sim.stats.pebs_no_assist, 0, "{}", row.name);
        assert_eq!(rig.sim.stats.pmis_masked, 0, "{}", row.name);
        assert_eq!(rig.sim.stats.early_lvt_unmasks, 0, "{}", row.name);
    }
}

#[test]
fn sim_clock_yields_pebs_samples_on_skylake_ice_lake_and_sapphire_rapids() {
    use arch_x86::pmu::driver::PmuDriver;
    use arch_x86::pmu::sim::SimClock;
    for cpu in [
        SimCpu::skylake(),
        SimCpu::ice_lake(),
        SimCpu::sapphire_rapids(),
    ] {
        // What `pmu=sim` programs: mem-loads:pp every load, with LBR.
        let mut clock = SimClock::new(cpu, 100);
        let info = detect(&mut clock.sim);
        let mut d = PmuDriver::new(&info).unwrap();
        let area = Box::new(DsArea::new());
        let mut buf = vec![0u8; 16 * 1024];
        {
            let mut mem = DsMemory::new(&area, &mut buf);
            d.configure(
                &mut clock.sim,
                Some(&mut mem),
                &[precise(EventKind::MemLoads, 1)],
                &IntelOptions {
                    lbr: Some(LbrConfig::default()),
                    ..Default::default()
                },
            )
            .unwrap();
        }
        d.start(&mut clock.sim);
        let format = PebsFormat::from_number(info.pebs_format.unwrap()).unwrap();
        let mut samples = 0;
        let mut with_branches = 0;
        for t in 0..50u64 {
            let mut gprs = [0u64; 16];
            gprs[7] = 0x7FFF_0000 - 8 * t;
            let regs = SimRegs { flags: 0x202, gprs };
            let mut mem = DsMemory::new(&area, &mut buf);
            if clock.on_tick(Some(&mut mem), 0x40_1000 + 16 * t, true, regs) {
                clock.sim.take_pmi();
                let tsc = clock.sim.tsc();
                d.handle_pmi(&mut clock.sim, Some(&mut mem), tsc, &mut |ov| {
                    let cfg = DecodeConfig {
                        format,
                        mem: MemKind::Load,
                        split_latency: info.pebs_format.is_some_and(|f| f >= 5),
                        data_source: info.pebs_data_source(),
                        pebs_trap: info.pebs_trap(),
                    };
                    let r = pebs::decode(ov.pebs.unwrap(), &cfg).unwrap();
                    assert!(r.mem.is_some());
                    samples += 1;
                    if !ov.lbr.is_empty() || r.lbr_len() > 0 {
                        with_branches += 1;
                    }
                });
            }
        }
        assert_eq!(samples, 50, "{cpu:?}");
        assert!(with_branches > 0, "{cpu:?}");
        assert_eq!(clock.sim.stats.gp_faults(), 0, "{cpu:?}");
    }
}

// ------------------------------------------------ lesser facts

#[test]
fn legacy_lbr_format_0_packs_source_and_target_in_from() {
    let mut rig = Rig::new(lbr_cpu(0));
    let mut d = rig
        .intel(
            &[ev(EventKind::Instructions, 50)],
            IntelOptions {
                lbr: Some(LbrConfig::default()),
                ..Default::default()
            },
        )
        .unwrap();
    rig.run_intel(&mut d, (0..50).map(step));
    let s = &rig.seen[0];
    let e = slbr::decode(LbrFormat::Legacy(0), &s.lbr[0]).unwrap();
    assert_eq!((e.from, e.to), (step(49).ip, 0x50_0000 + 16 * 49));
    assert_eq!(rig.sim.stats.gp_faults(), 0);
}

#[test]
fn amd_lbr_ext_v2_needs_perfmon_v2() {
    let info = detect(&mut SimPmu::new(SimCpu::Amd {
        family: 0x19,
        ext: true,
        v2: false,
        lbr_depth: 16,
    }));
    assert_eq!(info.lbr, LbrKind::None);
}

#[test]
fn amd_configure_clears_stale_perfmon_v2_status() {
    let mut rig = Rig::new(SimCpu::zen4());
    let info = rig.info();
    let mut d = AmdPmu::new(&info).unwrap();
    d.configure(&mut rig.sim, &[ev(EventKind::Instructions, 10)], None)
        .unwrap();
    d.start(&mut rig.sim);
    let mut i = 0;
    while !rig.sim.advance(None, &step(i)) {
        i += 1;
    }
    // Stopped with the overflow unhandled: the next user must not see it.
    d.stop(&mut rig.sim);
    assert_ne!(rig.sim.read(addr::AMD_PERF_CNTR_GLOBAL_STATUS), 0);
    d.configure(&mut rig.sim, &[ev(EventKind::Branches, 10)], None)
        .unwrap();
    assert_eq!(rig.sim.read(addr::AMD_PERF_CNTR_GLOBAL_STATUS), 0);
    assert_eq!(rig.sim.stats.gp_faults(), 0);
}

#[test]
fn core2_pebs_errata_one_page_buffer_and_no_pebs_on_merom() {
    use arch_x86::pmu::models;
    // Penryn: large PEBS stays within the buffer's first page.
    let mut rig = Rig::new(SimCpu::from_row(models::intel_row(0x17).unwrap()));
    let mut d = rig
        .intel(
            &[precise(EventKind::Instructions, 1)],
            IntelOptions {
                large_pebs: true,
                ..Default::default()
            },
        )
        .unwrap();
    run_delayed(&mut rig, &mut d, (0..1000).map(step), 0);
    assert_eq!(rig.sim.stats.ds_faults, 0, "records past the first page");
    assert!(rig.total.pebs_records > 0);
    // Merom: PEBS is unreliable, so it is not offered.
    let mut rig = Rig::new(SimCpu::from_row(models::intel_row(0x0F).unwrap()));
    assert_eq!(rig.info().pebs_format, None);
    assert_eq!(
        rig.intel(
            &[precise(EventKind::Instructions, 10)],
            IntelOptions::default()
        )
        .err(),
        Some(PmuError::PebsUnavailable)
    );
}

#[test]
fn periods_below_the_model_minimum_are_raised() {
    use arch_x86::pmu::models;
    // Nehalem: at least 32 for every event.
    let mut rig = Rig::new(SimCpu::from_row(models::intel_row(0x1E).unwrap()));
    let mut d = rig
        .intel(&[ev(EventKind::Branches, 10)], IntelOptions::default())
        .unwrap();
    rig.run_intel(&mut d, (0..640).map(step));
    assert_eq!(rig.sim.stats.short_periods, 0, "Nehalem period below 32");
    assert_eq!((rig.count(0), rig.seen[0].period), (20, 32));
    // Broadwell: INST_RETIRED.PREC_DIST (the cycles:pp alias) at least 128.
    let mut rig = Rig::new(SimCpu::from_row(models::intel_row(0x3D).unwrap()));
    let mut d = rig
        .intel(&[precise(EventKind::Cycles, 50)], IntelOptions::default())
        .unwrap();
    rig.run_intel(&mut d, (0..640).map(step));
    assert_eq!(rig.sim.stats.short_periods, 0, "Broadwell period below 128");
    assert_eq!(rig.total.pebs_records, 1280 / 128);
}

#[test]
fn amd_cache_events_before_and_from_zen() {
    for cpu in [
        SimCpu::Amd {
            family: 0x10,
            ext: false,
            v2: false,
            lbr_depth: 0,
        },
        SimCpu::zen4(),
    ] {
        let mut rig = Rig::new(cpu);
        let info = rig.info();
        let mut d = AmdPmu::new(&info).unwrap();
        d.configure(
            &mut rig.sim,
            &[
                ev(EventKind::CacheReferences, 5),
                ev(EventKind::CacheMisses, 5),
            ],
            None,
        )
        .unwrap();
        d.start(&mut rig.sim);
        // Every step's load is an L2 hit: a reference, never a miss.
        rig.run_amd(&mut d, (0..100).map(step));
        assert_eq!((rig.count(0), rig.count(1)), (20, 0), "{cpu:?}");
    }
}

#[test]
fn several_counters_overflowing_at_once_give_one_pmi_with_a_sample_each() {
    // cycles and instructions on their fixed counters (perf's choice),
    // branches and cycles:u on GP counters; the first three overflow at
    // the same step (two cycles and one instruction and branch a step).
    let mut rig = Rig::new(SimCpu::sapphire_rapids());
    let evs = [
        ev(EventKind::Cycles, 20),
        ev(EventKind::Instructions, 10),
        ev(EventKind::Branches, 10),
        EventConfig {
            event: Event {
                kernel: false,
                ..Event::new(EventKind::Raw(0x003C))
            },
            mode: SampleMode::Period(50),
        },
    ];
    let mut d = rig.intel(&evs, IntelOptions::default()).unwrap();
    assert_eq!(d.counter_of(0), Some(Counter::Fixed(1)));
    assert_eq!(d.counter_of(1), Some(Counter::Fixed(0)));
    assert_eq!(d.counter_of(2), Some(Counter::Gp(0)));
    assert_eq!(d.counter_of(3), Some(Counter::Gp(1)));
    let mut pmis_with = std::collections::BTreeMap::<Vec<usize>, u32>::new();
    for i in 0..1000 {
        let mut mem = DsMemory::new(&rig.area, &mut rig.buf);
        if !rig.sim.advance(Some(&mut mem), &step(i)) {
            continue;
        }
        let status = rig.sim.read(addr::IA32_PERF_GLOBAL_STATUS);
        rig.sim.take_pmi();
        let tsc = rig.sim.tsc();
        let mut got = Vec::new();
        let sum = d.handle_pmi(&mut rig.sim, Some(&mut mem), tsc, &mut |ov| {
            got.push((ov.event, ov.period));
        });
        // One PMI, every overflowed counter's bit in GLOBAL_STATUS, one
        // overflow each, acknowledged.
        let events: Vec<usize> = got.iter().map(|g| g.0).collect();
        let bits = events
            .iter()
            .map(|&e| d.counter_of(e).unwrap().global_bit())
            .fold(0, |a, b| a | b);
        assert_eq!(status & 0xF_0000_00FF, bits, "step {i}: {got:?}");
        assert_eq!(sum.overflows as usize, got.len());
        assert_eq!(rig.sim.read(addr::IA32_PERF_GLOBAL_STATUS) & bits, 0);
        for (e, period) in &got {
            assert_eq!(*period, [20, 10, 10, 50][*e]);
        }
        let mut events = events;
        events.sort_unstable();
        *pmis_with.entry(events).or_default() += 1;
    }
    // Every 10th step the three overflow together, every 50th with the
    // raw cycles counter too; every 25th step that one alone otherwise.
    let want = std::collections::BTreeMap::from([
        (vec![0, 1, 2], 80),
        (vec![0, 1, 2, 3], 20),
        (vec![3], 20),
    ]);
    assert_eq!(pmis_with, want);
    assert_eq!(rig.sim.stats.gp_faults(), 0);
}

#[test]
fn amd_counters_overflowing_at_once_are_each_found_by_their_sign() {
    // Without PerfMonV2 there is no status register: each counter whose
    // bit 47 cleared overflowed. cycles (two a step) at 20 and
    // instructions at 10 overflow together every 10th step, branches at
    // 25 every 25th.
    for v2 in [false, true] {
        let mut rig = Rig::new(SimCpu::Amd {
            family: 0x19,
            ext: true,
            v2,
            lbr_depth: 0,
        });
        let info = rig.info();
        let mut d = AmdPmu::new(&info).unwrap();
        let evs = [
            ev(EventKind::Cycles, 20),
            ev(EventKind::Instructions, 10),
            ev(EventKind::Branches, 25),
        ];
        d.configure(&mut rig.sim, &evs, None).unwrap();
        d.start(&mut rig.sim);
        let mut pmis_with = std::collections::BTreeMap::<Vec<usize>, u32>::new();
        for i in 0..1000 {
            if !rig.sim.advance(None, &step(i)) {
                continue;
            }
            rig.sim.take_pmi();
            let tsc = rig.sim.tsc();
            let mut got = Vec::new();
            let sum = d.handle_pmi(&mut rig.sim, tsc, &mut |ov| got.push(ov.event));
            assert_eq!(sum.overflows as usize, got.len());
            got.sort_unstable();
            *pmis_with.entry(got).or_default() += 1;
        }
        let want = std::collections::BTreeMap::from([
            (vec![0, 1], 80),
            (vec![0, 1, 2], 20),
            (vec![2], 20),
        ]);
        assert_eq!(pmis_with, want, "PerfMonV2 {v2}");
        assert_eq!(rig.sim.stats.pmis_masked, 0);
    }
}

#[test]
fn golden_cove_precise_instructions_never_on_pmc0() {
    // Linux: INTEL_FLAGS_EVENT_CONSTRAINT(0xc0, 0xfe) in
    // intel_spr_pebs_event_constraints, used by Sapphire Rapids and the
    // Alder Lake / Raptor Lake P-cores. With instructions on fixed counter
    // 0, the precise one must skip PMC0.
    use arch_x86::pmu::models;
    for model in [0x8F, 0x97] {
        let row = models::intel_row(model).unwrap();
        assert_eq!(row.pebs_counters(0x00C0), 0xFE, "{}", row.name);
        assert_eq!(row.pebs_counters(0x01C0), 0xFE, "{}", row.name);
    }
    let mut rig = Rig::new(SimCpu::sapphire_rapids());
    let mut d = rig
        .intel(
            &[
                ev(EventKind::Instructions, 10),
                precise(EventKind::Instructions, 10),
            ],
            IntelOptions::default(),
        )
        .unwrap();
    assert!(
        matches!(d.counter_of(1), Some(Counter::Gp(n)) if n != 0),
        "{:?}",
        d.counter_of(1)
    );
    rig.run_intel(&mut d, (0..100).map(step));
    assert_eq!(rig.total.pebs_records, 10);
    assert_eq!(rig.sim.stats.pebs_no_assist, 0);
}

#[test]
fn ice_lake_and_golden_cove_memory_events_pebs_on_pmc0_to_3() {
    // Linux: INTEL_FLAGS_EVENT_CONSTRAINT(0xd0, 0xf) and the 0xd1-0xd4
    // range on 0xf in intel_icl_pebs_event_constraints and
    // intel_spr_pebs_event_constraints.
    use arch_x86::pmu::models;
    for model in [0x7E, 0x6A, 0x8F, 0x97] {
        let row = models::intel_row(model).unwrap();
        for sel in [0x82D0, 0x81D0, 0x01D1, 0x04D4] {
            assert_eq!(row.pebs_counters(sel), 0xF, "{} {sel:#x}", row.name);
        }
        assert_eq!(row.pebs_counters(0x00C4), 0xFF, "{}", row.name);
    }
    // Four precise branches first: mem-stores:p must still get PMC0-3.
    let icl = SimCpu::from_row(models::intel_row(0x7E).unwrap());
    let mut rig = Rig::new(icl);
    let mut events = vec![precise(EventKind::Branches, 10); 4];
    events.push(precise(EventKind::MemStores, 10));
    let d = rig.intel(&events, IntelOptions::default()).unwrap();
    assert!(
        matches!(d.counter_of(4), Some(Counter::Gp(n)) if n < 4),
        "{:?}",
        d.counter_of(4)
    );
}

#[test]
fn mem_stores_is_each_models_own_precise_store_event() {
    // Linux: mem_st_snb (event=0xcd,umask=0x2) on Sandy Bridge and Ivy
    // Bridge, with INTEL_PST_CONSTRAINT(0x02cd, 0x8); mem_st_hsw
    // (0x82d0) from Haswell on; no mem-stores on Nehalem, Westmere, Core 2
    // and the Atoms before Gracemont.
    let stores = |i: u64| {
        let mut s = step(i);
        if let Some(m) = s.mem.as_mut() {
            m.store = true;
            m.dse = 0x1; // an L1 hit
        }
        s
    };
    // Golden Cove's mem_st_spr is the store-latency event 0x02CD, on PMC0
    // only (INTEL_PSD_CONSTRAINT(0x2cd, 0x1)), without PS_ENABLE.
    for (model, sel, counter) in [
        (0x2A, 0x02CD, 3),
        (0x3A, 0x02CD, 3),
        (0x3C, 0x82D0, 0),
        (0x8F, 0x02CD, 0),
    ] {
        let row = models::intel_row(model).unwrap();
        let mut rig = Rig::new(SimCpu::from_row(row));
        let info = rig.info();
        let mut d = rig
            .intel(
                &[precise(EventKind::MemStores, 10)],
                IntelOptions::default(),
            )
            .unwrap_or_else(|e| panic!("{}: {e:?}", row.name));
        let Some(Counter::Gp(n)) = d.counter_of(0) else {
            panic!("{}: mem-stores not on a GP counter", row.name)
        };
        if sel == 0x02CD {
            assert_eq!(n, counter, "{}: its one counter", row.name);
        }
        let got = rig.sim.read(addr::IA32_PERFEVTSEL0 + u32::from(n)) & 0xFFFF;
        assert_eq!(got, sel, "{}", row.name);
        // PS_ENABLE (IA32_PEBS_ENABLE[63]) for Sandy Bridge's precise store.
        assert_eq!(
            rig.sim.read(addr::IA32_PEBS_ENABLE) >> 63,
            u64::from(row.store_kind() == MemKind::Store),
            "{}",
            row.name
        );
        rig.run_intel(&mut d, (0..100).map(stores));
        assert_eq!(rig.total.pebs_records, 10, "{}", row.name);
        let format = info.pebs_format.unwrap();
        let cfg = DecodeConfig {
            format: PebsFormat::from_number(format).unwrap(),
            mem: row.store_kind(),
            split_latency: format >= 5,
            data_source: info.pebs_data_source(),
            pebs_trap: info.pebs_trap(),
        };
        for s in &rig.seen {
            let r = pebs::decode(s.pebs.as_ref().unwrap(), &cfg).unwrap();
            let m = r.mem.expect("a store record has memory fields");
            assert_eq!(m.data_src & 0x1F, 0x04, "{}: PERF_MEM_OP_STORE", row.name);
        }
    }
    // Their records read as Linux reads them: precise_store_data,
    // precise_datala_hsw, store_latency_data.
    for (model, kind) in [
        (0x2A, MemKind::Store),
        (0x3E, MemKind::Store),
        (0x3C, MemKind::StoreDatala),
        (0x4E, MemKind::StoreDatala),
        (0x7E, MemKind::StoreDatala),
        (0x8F, MemKind::StoreLatency),
        (0x97, MemKind::StoreLatency),
    ] {
        let row = models::intel_row(model).unwrap();
        assert_eq!(row.store_kind(), kind, "{}", row.name);
    }
    for model in [0x1E, 0x2C, 0x17, 0x37, 0x5C, 0x86] {
        let row = models::intel_row(model).unwrap();
        let mut rig = Rig::new(SimCpu::from_row(row));
        assert_eq!(
            rig.intel(
                &[precise(EventKind::MemStores, 10)],
                IntelOptions::default()
            )
            .err(),
            Some(PmuError::EventUnavailable { event: 0 }),
            "{}",
            row.name
        );
    }
}

#[test]
fn the_load_latency_enable_bit_follows_the_perfmon_version_as_linux() {
    // Linux's intel_pmu_pebs_enable sets LL_EN_PMCn below perfmon version 5,
    // whatever the PEBS format: a version 4 CPU with format 4 needs it (the
    // simulator then writes no record without it), a version 5 one with
    // format 3 must not get it.
    for (version, format, ll_en) in [(4, 4, true), (5, 3, false), (4, 3, true)] {
        let mut rig = Rig::new(intel(version, Some(format), SimLbr::None));
        let mut d = rig
            .intel(&[precise(EventKind::MemLoads, 10)], IntelOptions::default())
            .unwrap();
        let Some(Counter::Gp(n)) = d.counter_of(0) else {
            panic!("mem-loads not on a GP counter")
        };
        assert_eq!(
            rig.sim.read(addr::IA32_PEBS_ENABLE) >> (32 + n) & 1 == 1,
            ll_en,
            "v{version} format {format}"
        );
        rig.run_intel(&mut d, (0..100).map(step));
        assert_eq!(rig.total.pebs_records, 10, "v{version} format {format}");
        assert_eq!(
            rig.sim.stats.pebs_no_assist, 0,
            "v{version} format {format}"
        );
    }
}

#[test]
fn nehalem_g_and_cannon_lake_are_architectural_only_as_in_linux() {
    // intel_pmu_init has no case for 0x1F (NEHALEM_G) nor 0x66
    // (CANNONLAKE_L): generic architectural perfmon, no PEBS constraints
    // (so no precise events) and no LBR, whatever the CPU reports.
    for model in [0x1F, 0x66] {
        assert!(models::intel_row(model).is_none(), "{model:#x}");
        // A Skylake-like PMU (PEBS format 3, LBR format 5) under the
        // unlisted model number.
        let cpu = SimCpu::skylake().with_model(model);
        let mut rig = Rig::new(cpu);
        assert_eq!(
            rig.info().row().name,
            models::UNKNOWN_MODEL.name,
            "{model:#x}"
        );
        assert!(
            rig.intel(&[precise(EventKind::Cycles, 100)], IntelOptions::default())
                .is_err(),
            "{model:#x}: precise cycles"
        );
        assert_eq!(
            rig.intel(
                &[ev(EventKind::Instructions, 100)],
                IntelOptions {
                    lbr: Some(LbrConfig::default()),
                    ..IntelOptions::default()
                }
            )
            .err(),
            Some(PmuError::LbrUnavailable),
            "{model:#x}: LBR"
        );
        let mut d = rig
            .intel(&[ev(EventKind::Instructions, 100)], IntelOptions::default())
            .unwrap();
        rig.run_intel(&mut d, (0..1000).map(step));
        assert_eq!(rig.count(0), 10, "{model:#x}: counting works");
    }
}

#[test]
fn nehalem_and_westmere_counters_are_reset_when_events_are_added() {
    // Errata AAK100, AAP53, BD53: Linux's intel_pmu_nhm_enable_all runs the
    // magic events on PMC0-3 before enabling; the events and periods are
    // then the configured ones, and sampling is exact.
    for model in [0x1A, 0x1E, 0x2E, 0x25, 0x2C, 0x2F] {
        let row = models::intel_row(model).unwrap();
        let mut rig = Rig::new(SimCpu::from_row(row));
        let mut d = rig
            .intel(
                &[
                    ev(EventKind::Instructions, 100),
                    ev(EventKind::Branches, 50),
                ],
                IntelOptions::default(),
            )
            .unwrap();
        assert_eq!(rig.sim.stats.nhm_resets, 1, "{}", row.name);
        let Some(Counter::Gp(n)) = d.counter_of(1) else {
            panic!("{}: branches not on a GP counter", row.name)
        };
        assert_eq!(
            rig.sim.read(addr::IA32_PERFEVTSEL0 + u32::from(n)) & 0xFFFF,
            0x00C4,
            "{}: its own event back",
            row.name
        );
        rig.run_intel(&mut d, (0..1000).map(step));
        assert_eq!((rig.count(0), rig.count(1)), (10, 20), "{}", row.name);
    }
    // Not on the models after them.
    for model in [0x2A, 0x3C, 0x4E] {
        let mut rig = Rig::new(SimCpu::from_row(models::intel_row(model).unwrap()));
        rig.intel(&[ev(EventKind::Branches, 50)], IntelOptions::default())
            .unwrap();
        assert_eq!(rig.sim.stats.nhm_resets, 0, "{model:#x}");
    }
}

#[test]
fn amd_lbr_call_stack_is_refused() {
    // LbrExtV2 has no call-stack mode (Linux's amd_pmu_lbr_setup_filter
    // refuses PERF_SAMPLE_BRANCH_CALL_STACK): refused, as on Intel before
    // Haswell, instead of being masked off with the freeze dropped.
    let mut rig = Rig::new(SimCpu::zen4());
    let info = rig.info();
    let mut d = AmdPmu::new(&info).unwrap();
    let cs = LbrConfig {
        call_stack: true,
        ..LbrConfig::default()
    };
    assert_eq!(
        d.configure(&mut rig.sim, &[ev(EventKind::Instructions, 40)], Some(cs))
            .err(),
        Some(PmuError::LbrUnavailable)
    );
    assert!(!LbrDriver::new(info.lbr).unwrap().supports_call_stack());
    // Without call stack it is accepted, frozen on a PMI.
    d.configure(
        &mut rig.sim,
        &[ev(EventKind::Instructions, 40)],
        Some(LbrConfig::default()),
    )
    .unwrap();
}

#[test]
fn amd_perfmon_v2_without_perfctrextcore_uses_the_legacy_layout() {
    // Linux (amd_core_pmu_init) keys the extended layout on PerfCtrExtCore
    // alone and sets up PerfMonV2 only when it is present. A hypervisor
    // reporting v2 without ExtCore gets the four K7 counters, no global
    // registers and no LbrExtV2.
    let mut rig = Rig::new(SimCpu::Amd {
        family: 0x19,
        ext: false,
        v2: true,
        lbr_depth: 16,
    });
    let info = rig.info();
    assert!(!info.amd_ext);
    assert!(!info.amd_v2, "PerfMonV2 without PerfCtrExtCore");
    assert_eq!(info.gp_counters, 4);
    assert_eq!(info.lbr, LbrKind::None);
    let mut d = AmdPmu::new(&info).unwrap();
    assert_eq!(d.msrs(3), (0xC001_0003, 0xC001_0007));
    let evs: Vec<EventConfig> = (1..=4)
        .map(|p| ev(EventKind::Instructions, 10 * p))
        .collect();
    d.configure(&mut rig.sim, &evs, None).unwrap();
    d.start(&mut rig.sim);
    rig.run_amd(&mut d, (0..400).map(step));
    for (k, p) in (1..=4).enumerate() {
        assert_eq!(rig.count(k), 400 / (10 * p as usize), "counter {k}");
    }
    assert_eq!(rig.sim.stats.bad_msr_writes, 0);
}

#[test]
fn goldmont_plus_pebs_on_any_general_purpose_counter() {
    // Linux: intel_glp_pebs_event_constraints is INTEL_ALL_EVENT_CONSTRAINT(0, 0xf);
    // Goldmont keeps PMC0 only (intel_glm_pebs_event_constraints).
    let glp = SimCpu::from_row(models::intel_row(0x7A).unwrap());
    let mut rig = Rig::new(glp);
    let mut d = rig
        .intel(
            &[
                precise(EventKind::Instructions, 10),
                precise(EventKind::Branches, 7),
            ],
            IntelOptions::default(),
        )
        .unwrap();
    assert_eq!(d.counter_of(1), Some(Counter::Gp(1)));
    rig.run_intel(&mut d, (0..100).map(step));
    // Branches overflow 14 times (one step shared with instructions).
    assert!(rig.count(1) >= 13, "{}", rig.count(1));
    assert_eq!(rig.sim.stats.pebs_no_assist, 0);
    let glm = SimCpu::from_row(models::intel_row(0x5C).unwrap());
    let mut rig = Rig::new(glm);
    assert_eq!(
        rig.intel(
            &[
                precise(EventKind::Instructions, 10),
                precise(EventKind::Branches, 10)
            ],
            IntelOptions::default()
        )
        .err(),
        Some(PmuError::NoCounter { event: 1 })
    );
}

#[test]
fn broadwell_prec_dist_periods_are_multiples_of_64() {
    // Linux bdw_limit_period: INST_RETIRED.PREC_DIST at least 128 and
    // rounded down to a multiple of 64. The cycles:pp alias is that event.
    let mut rig = Rig::new(SimCpu::from_row(models::intel_row(0x3D).unwrap()));
    let mut d = rig
        .intel(&[precise(EventKind::Cycles, 200)], IntelOptions::default())
        .unwrap();
    rig.run_intel(&mut d, (0..960).map(step));
    assert_eq!(rig.sim.stats.short_periods, 0);
    assert_eq!(rig.seen[0].period, 192);
    assert_eq!(rig.total.pebs_records, 1920 / 192);
    // Other events keep their period.
    let mut rig = Rig::new(SimCpu::from_row(models::intel_row(0x3D).unwrap()));
    let mut d = rig
        .intel(&[ev(EventKind::Branches, 200)], IntelOptions::default())
        .unwrap();
    rig.run_intel(&mut d, (0..400).map(step));
    assert_eq!(rig.seen[0].period, 200);
}

#[test]
fn ref_cycles_only_on_fixed_counter_2() {
    // Linux: ref-cycles has no general-purpose encoding to fall back on.
    let mut rig = Rig::new(SimCpu::skylake());
    let d = rig
        .intel(&[ev(EventKind::RefCycles, 10)], IntelOptions::default())
        .unwrap();
    assert_eq!(d.counter_of(0), Some(Counter::Fixed(2)));
    assert_eq!(
        rig.intel(
            &[ev(EventKind::RefCycles, 10), ev(EventKind::RefCycles, 20)],
            IntelOptions::default()
        )
        .err(),
        Some(PmuError::NoCounter { event: 1 })
    );
}
