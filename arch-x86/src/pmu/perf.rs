//! How a hardware event is named, sampled and described to perf: the name
//! `event=` spells (it round-trips through [`events::parse`]), the sampling
//! mode a profile at `freq=` uses, the `perf_event_attr`-like description
//! that Hello and perf.data carry, the capabilities a detected PMU offers
//! and the decoder formats its PEBS and LBR records take.
//!
//! Everything here is pure and host-tested; the runtime calls it when it
//! sets up sampling.

use core::fmt;

use sampler::event::sample_type as stype;
use sampler::event::{self as sev, EventSource, PmuCaps};
use sampler::lbr::LbrFormat;
use sampler::pebs::{MemKind, PebsFormat};

use super::events::{self, Event, EventKind};
use super::{LbrRawFormat, SampleMode};
use crate::cpuid::{PmuInfo, Vendor};

/// The event sampled when `event=` is not given: cycles in both modes.
pub const DEFAULT_EVENT: Event = Event::new(EventKind::Cycles);

/// Smallest sampling period programmed.
pub const MIN_PERIOD: u64 = 1000;
/// Largest sampling period programmed (31 bits: what a general-purpose
/// counter without full-width writes takes).
pub const MAX_PERIOD: u64 = (1 << 31) - 1;

impl fmt::Display for Event {
    /// The name as `event=` spells it (`cycles`, `r1c2:pp`, `branches:u`):
    /// [`events::parse`] gives the same event back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            EventKind::Cycles => f.write_str("cycles")?,
            EventKind::Instructions => f.write_str("instructions")?,
            EventKind::RefCycles => f.write_str("ref-cycles")?,
            EventKind::Branches => f.write_str("branches")?,
            EventKind::BranchMisses => f.write_str("branch-misses")?,
            EventKind::CacheReferences => f.write_str("cache-references")?,
            EventKind::CacheMisses => f.write_str("cache-misses")?,
            EventKind::MemLoads => f.write_str("mem-loads")?,
            EventKind::MemStores => f.write_str("mem-stores")?,
            EventKind::Raw(v) => write!(f, "r{v:x}")?,
        }
        let all = self.user && self.kernel;
        if !all || self.precise > 0 {
            f.write_str(":")?;
            if !all && self.user {
                f.write_str("u")?;
            }
            if !all && self.kernel {
                f.write_str("k")?;
            }
            for _ in 0..self.precise {
                f.write_str("p")?;
            }
        }
        Ok(())
    }
}

/// Whether `ev` samples through PEBS on `vendor`: it asks for precision,
/// or its encoding exists only as a PEBS event (the memory events).
pub fn uses_pebs(ev: &Event, vendor: Vendor) -> bool {
    ev.precise > 0 || events::encode(ev.kind, vendor).is_some_and(|e| e.needs_pebs)
}

/// How `ev` is sampled for `freq_hz` samples per second on a TSC of
/// `tsc_hz` (0 when uncalibrated: 1 GHz is assumed): cycles, ref-cycles
/// and instructions with a fixed period of TSC ticks per sample (cycles run
/// at about the TSC rate); PEBS events (whose periods the driver does not
/// adapt) with a quarter of that; everything else in frequency mode toward
/// `freq_hz`. Periods stay within [`MIN_PERIOD`]..=[`MAX_PERIOD`].
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

/// The perf description of `ev` (sampled with `mode`, through PEBS when
/// `pebs`, with memory fields of kind `mem`, with branch stacks when `lbr`)
/// and the `PERF_SAMPLE_*` bits the PMU adds to each sample.
///
/// Generic events are `PERF_TYPE_HARDWARE` with perf's config numbers;
/// memory and raw events are `PERF_TYPE_RAW` with their event-select
/// encoding.
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

/// The decoder's record layout for PEBS format `f`
/// (IA32_PERF_CAPABILITIES[11:8]).
pub fn pebs_format(f: u8) -> PebsFormat {
    match f {
        4.. => PebsFormat::Adaptive(f),
        3 => PebsFormat::Skl,
        2 => PebsFormat::Hsw,
        1 => PebsFormat::Nhm,
        _ => PebsFormat::Core,
    }
}

/// The decoder's branch format for the driver's raw LBR format, `None`
/// without LBR.
pub fn lbr_format(f: LbrRawFormat) -> Option<LbrFormat> {
    match f {
        LbrRawFormat::Arch => Some(LbrFormat::Arch),
        LbrRawFormat::Legacy(n) => Some(LbrFormat::Legacy(n)),
        LbrRawFormat::AmdV2 => Some(LbrFormat::AmdV2 { va_bits: 48 }),
        LbrRawFormat::None => None,
    }
}

/// `perf_event_attr.branch_sample_type` bits ([`sev::branch_type`] and
/// the rest of perf's `PERF_SAMPLE_BRANCH_*`).
pub mod branch_bits {
    /// User branches.
    pub const USER: u64 = 1 << 0;
    /// Kernel branches.
    pub const KERNEL: u64 = 1 << 1;
    /// Any branch.
    pub const ANY: u64 = 1 << 3;
    /// Any call (direct, indirect, far).
    pub const ANY_CALL: u64 = 1 << 4;
    /// Any return.
    pub const ANY_RETURN: u64 = 1 << 5;
    /// Indirect calls.
    pub const IND_CALL: u64 = 1 << 6;
    /// Conditional branches.
    pub const COND: u64 = 1 << 10;
    /// Indirect jumps.
    pub const IND_JUMP: u64 = 1 << 12;
    /// Direct calls.
    pub const CALL: u64 = 1 << 13;
}

/// The LBR filter for perf's `branch_sample_type` `bst`, as Linux's
/// `intel_pmu_setup_hw_lbr_filter` maps it: ANY records every class,
/// ANY_CALL direct, indirect and far calls, ANY_RETURN returns and far
/// branches; with neither USER nor KERNEL both modes are recorded.
pub fn lbr_config(bst: u64) -> super::lbr::LbrConfig {
    use super::lbr::filter as f;
    use branch_bits as b;
    let mut filter = 0;
    if bst & b::USER != 0 {
        filter |= f::USER;
    }
    if bst & b::KERNEL != 0 {
        filter |= f::KERNEL;
    }
    if filter == 0 {
        filter = f::USER | f::KERNEL;
    }
    let classes = [
        (b::ANY, f::ANY),
        (b::ANY_CALL, f::CALL | f::IND_CALL | f::FAR),
        (b::ANY_RETURN, f::RET | f::FAR),
        (b::IND_CALL, f::IND_CALL),
        (b::COND, f::COND),
        (b::IND_JUMP, f::IND_JMP),
        (b::CALL, f::CALL),
    ];
    let mut any_class = false;
    for (bit, fl) in classes {
        if bst & bit != 0 {
            filter |= fl;
            any_class = true;
        }
    }
    if !any_class {
        filter |= f::ANY;
    }
    super::lbr::LbrConfig {
        filter,
        call_stack: false,
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::string::ToString;

    use super::*;
    use crate::pmu::sim::{SimCpu, SimPmu};
    use sampler::event::{EventKind as Perf, Sampling, sample_type as st};

    fn parse(s: &str) -> Event {
        events::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn names_round_trip_through_the_parser() {
        for spec in [
            "cycles",
            "instructions:u",
            "ref-cycles:k",
            "branches",
            "branch-misses:p",
            "cache-references",
            "cache-misses",
            "mem-loads:pp",
            "mem-stores:p",
            "r1c2",
            "r4f2e:upp",
        ] {
            let e = parse(spec);
            let name = e.to_string();
            assert_eq!(events::parse(&name), Ok(e), "{spec} is named {name}");
        }
        assert_eq!(parse("cycles:uk").to_string(), "cycles");
        assert_eq!(parse("r1c2:ppp").to_string(), "r1c2:ppp");
        assert_eq!(parse("branches:u").to_string(), "branches:u");
    }

    /// Generic events are PERF_TYPE_HARDWARE with perf's config, memory
    /// and raw events PERF_TYPE_RAW with their encoding; the sample fields
    /// follow PEBS and LBR; and every description passes the validation
    /// `perf_event_open` would do against a PMU with PEBS and LBR (the
    /// simulated Sapphire Rapids).
    #[test]
    fn descriptions_match_perf_and_pass_validation() {
        let cpu = SimCpu::sapphire_rapids();
        let mut sim = SimPmu::new(cpu);
        let info = crate::cpuid::detect(&SimPmu::new(cpu), &mut sim);
        let caps = caps_of(&info, EventSource::IntelPmu);
        let cases = [
            ("cycles", false, MemKind::None, Perf::Hardware, 0, 0),
            ("instructions:u", false, MemKind::None, Perf::Hardware, 1, 0),
            ("ref-cycles", false, MemKind::None, Perf::Hardware, 9, 0),
            ("branch-misses", false, MemKind::None, Perf::Hardware, 5, 0),
            ("r1c2:p", true, MemKind::None, Perf::Raw, 0x1c2, 1),
            ("mem-loads:pp", true, MemKind::Load, Perf::Raw, 0x1cd, 2),
            ("mem-stores", true, MemKind::Store, Perf::Raw, 0x82d0, 1),
        ];
        for (spec, pebs, mem, kind, config, precise) in cases {
            let ev = parse(spec);
            assert_eq!(uses_pebs(&ev, Vendor::Intel), pebs, "{spec}: PEBS use");
            let mode = sample_mode(&ev, pebs, 2_800_000_000, 4000);
            let (p, extra) = perf_event(&ev, mode, Vendor::Intel, pebs, mem, true);
            assert_eq!(
                (p.kind, p.config, p.precise),
                (kind, config, precise),
                "{spec}"
            );
            assert!(
                p.exclude_kernel != ev.kernel && p.exclude_user != ev.user,
                "{spec}: modes"
            );
            let mut want = st::BRANCH_STACK;
            if pebs {
                want |= st::REGS_INTR;
            }
            if mem != MemKind::None {
                want |= st::ADDR | st::WEIGHT | st::DATA_SRC;
            }
            assert_eq!(extra, want, "{spec}: sample bits");
            // What the stream's Hello carries for it.
            let mut e = sev::EventConfig::cpu_clock(0, 4000);
            e.sample_type |= st::REGS_USER | st::CALLCHAIN | st::CPU | extra;
            e.regs_user = sampler::regs::GPR_MASK;
            if extra & st::REGS_INTR != 0 {
                e.regs_intr = sampler::regs::GPR_MASK;
            }
            e.count_as(&p);
            if let Err(err) = e.validate(&caps) {
                panic!("{spec}: the description is refused: {err}");
            }
        }
        // AMD has no PEBS: a precise event there is not PEBS.
        assert!(!uses_pebs(&parse("branches"), Vendor::Amd));
    }

    #[test]
    fn periods_follow_the_frequency_and_stay_in_range() {
        let cyc = parse("cycles");
        assert_eq!(
            sample_mode(&cyc, false, 2_800_000_000, 4000),
            SampleMode::Period(700_000)
        );
        assert_eq!(
            sample_mode(&cyc, false, 2_800_000_000, 1),
            SampleMode::Period(MAX_PERIOD)
        );
        assert_eq!(
            sample_mode(&cyc, false, 0, 4000),
            SampleMode::Period(250_000),
            "without a calibrated TSC"
        );
        assert_eq!(
            sample_mode(&cyc, false, 1000, 4000),
            SampleMode::Period(MIN_PERIOD)
        );
        assert_eq!(
            sample_mode(&parse("mem-loads:pp"), true, 2_800_000_000, 4000),
            SampleMode::Period(175_000)
        );
        let br = parse("branches");
        assert!(matches!(
            sample_mode(&br, false, 2_800_000_000, 4000),
            SampleMode::Frequency { hz: 4000, .. }
        ));
        let (p, extra) = perf_event(
            &br,
            sample_mode(&br, false, 1, 4000),
            Vendor::Intel,
            false,
            MemKind::None,
            false,
        );
        assert_eq!(p.sampling, Sampling::Frequency(4000));
        assert_eq!((p.branch_sample_type, extra), (0, 0));
    }

    #[test]
    fn formats_map_to_the_decoders() {
        assert_eq!(pebs_format(0), PebsFormat::Core);
        assert_eq!(pebs_format(1), PebsFormat::Nhm);
        assert_eq!(pebs_format(2), PebsFormat::Hsw);
        assert_eq!(pebs_format(3), PebsFormat::Skl);
        assert_eq!(pebs_format(5), PebsFormat::Adaptive(5));
        assert_eq!(lbr_format(LbrRawFormat::None), None);
        assert_eq!(lbr_format(LbrRawFormat::Arch), Some(LbrFormat::Arch));
        assert_eq!(
            lbr_format(LbrRawFormat::Legacy(5)),
            Some(LbrFormat::Legacy(5))
        );
    }

    #[test]
    fn lbr_config_maps_perf_branch_types() {
        use super::branch_bits as b;
        use crate::pmu::lbr::filter as f;
        assert_eq!(
            lbr_config(b::ANY | b::USER | b::KERNEL).filter,
            f::ALL,
            "any, both modes"
        );
        assert_eq!(lbr_config(b::ANY).filter, f::ALL, "no mode: both");
        assert_eq!(
            lbr_config(b::ANY_CALL | b::USER).filter,
            f::USER | f::CALL | f::IND_CALL | f::FAR
        );
        assert_eq!(
            lbr_config(b::ANY_RETURN | b::KERNEL).filter,
            f::KERNEL | f::RET | f::FAR
        );
        assert_eq!(
            lbr_config(b::IND_CALL | b::COND | b::IND_JUMP | b::CALL).filter,
            f::USER | f::KERNEL | f::IND_CALL | f::COND | f::IND_JMP | f::CALL
        );
        // A mode without a class records every class in it.
        assert_eq!(lbr_config(b::USER).filter, f::USER | f::ANY);
        assert!(!lbr_config(b::ANY).call_stack);
    }
}
