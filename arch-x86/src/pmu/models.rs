//! Per-model facts of Intel family-6 PMUs, in one table: which
//! general-purpose counters each event may count on at all (Linux's
//! `intel_*_event_constraints`: on Core 2 some events only on PMC0 or only
//! on PMC1, on Nehalem the L1D events on PMC0-1, from Sandy Bridge to
//! Broadwell L1D_PEND_MISS on PMC2, from Ice Lake many codes on PMC0-3 of
//! the eight), which counters PEBS may use for which events, the
//! load-latency event and whether its extra
//! register exists, the `cycles:p` alias, the LBR stack (depth, MSRs,
//! LBR_SELECT, call-stack mode, format quirks) and how the PMI handler
//! acknowledges. Each row names its sources: the Intel SDM vol. 3 chapters
//! "Performance Monitoring" / "Last Branch Records" and vol. 4 MSR tables
//! per microarchitecture, and the Linux perf_events facts
//! (`arch/x86/events/intel/{core,ds,lbr}.c`) they were checked against.
//!
//! The drivers and the detection take model-specific behaviour from here
//! only; the simulator takes the hardware behaviour of a simulated model
//! from the same rows, so a row is both what the driver assumes and what the
//! simulated CPU does. The `version`..`lbr` columns are a typical part of
//! the row (what the simulator builds for it); real parts report their own
//! counts through CPUID and PERF_CAPABILITIES.

use crate::msr::addr;
pub use sampler::pebs::DataSource;

/// How `cycles:p` is sampled where event 0x3C cannot trigger a PEBS assist:
/// an event that counts every cycle and is PEBS-capable (Linux
/// `intel_pebs_aliases_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CyclesAlias {
    /// No alias: cycles is PEBS-capable (adaptive PEBS on all events) or
    /// precise cycles is not available.
    None,
    /// INST_RETIRED.ANY_P with inv, cmask=16 (Core 2, Atom, Nehalem,
    /// Westmere; `intel_pebs_aliases_core2`).
    Core2,
    /// UOPS_RETIRED.ALL with inv, cmask=16 (Sandy Bridge;
    /// `intel_pebs_aliases_snb`).
    Snb,
    /// INST_RETIRED.PREC_DIST with inv, cmask=16 (Ivy Bridge, Haswell,
    /// Broadwell; `intel_pebs_aliases_ivb`).
    Ivb,
    /// As [`CyclesAlias::Snb`] below `:ppp`, PREC_DIST at `:ppp` (Skylake;
    /// `intel_pebs_aliases_skl`).
    Skl,
    /// No alias needed: 0x3C itself takes PEBS on the model's PEBS counters
    /// (Goldmont, Goldmont Plus and Tremont, where Linux sets
    /// `pebs_aliases` to NULL and allows every event in
    /// `intel_glm_pebs_event_constraints` / `intel_glp_...`).
    Direct,
}

impl CyclesAlias {
    /// The event-select bits (event, umask, inv, cmask) that replace 0x3C
    /// for precision level `precise`, or `None` without an alias.
    pub fn evtsel(self, precise: u8) -> Option<u64> {
        const INV_CMASK16: u64 = 1 << 23 | 16 << 24;
        let uops_retired_all = 0x01C2 | INV_CMASK16;
        let prec_dist = 0x01C0 | INV_CMASK16;
        match self {
            CyclesAlias::None => None,
            CyclesAlias::Direct => Some(0x003C),
            CyclesAlias::Core2 => Some(0x00C0 | INV_CMASK16),
            CyclesAlias::Snb => Some(uops_retired_all),
            CyclesAlias::Ivb => Some(prec_dist),
            CyclesAlias::Skl if precise >= 3 => Some(prec_dist),
            CyclesAlias::Skl => Some(uops_retired_all),
        }
    }
}

/// When the PMI handler re-arms the LVT entry (Linux `intel_pmu_handle_irq`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PmiAck {
    /// Before handling (older parts).
    Early,
    /// Just before re-enabling the counters (small cores from Gracemont on).
    Mid,
    /// After the counters are re-enabled (big cores from Haswell on:
    /// unmasking earlier causes spurious PMIs).
    Late,
}

/// A PEBS counter constraint: the event (event select bits 15:0, event and
/// umask) may only use the general-purpose counters in `gp_mask`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PebsConstraint {
    /// Event and umask (EVTSEL\[15:0\]).
    pub event: u16,
    /// Allowed general-purpose counters (bit n = PMCn).
    pub gp_mask: u32,
    /// When set, the constraint holds for every umask of the event codes
    /// from `event`'s code (bits 7:0) through this code, as Linux's
    /// INTEL_FLAGS_EVENT_CONSTRAINT and its _RANGE form match; when unset,
    /// only the exact event and umask.
    pub codes_to: Option<u8>,
}

impl PebsConstraint {
    /// A constraint on one event and umask.
    pub const fn exact(event: u16, gp_mask: u32) -> Self {
        Self {
            event,
            gp_mask,
            codes_to: None,
        }
    }

    /// A constraint on every umask of the event codes `first..=last`.
    pub const fn codes(first: u8, last: u8, gp_mask: u32) -> Self {
        Self {
            event: first as u16,
            gp_mask,
            codes_to: Some(last),
        }
    }

    /// Whether the constraint holds for the select bits `evtsel`.
    pub fn matches(&self, evtsel: u64) -> bool {
        match self.codes_to {
            None => (evtsel & 0xFFFF) as u16 == self.event,
            Some(last) => {
                let code = (evtsel & 0xFF) as u8;
                code >= self.event as u8 && code <= last
            }
        }
    }
}

/// A counter constraint of a general-purpose event, as a row of Linux's
/// `intel_*_event_constraints`: the events it matches may only count on the
/// counters in `gp_mask`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterConstraint {
    /// The matching value of EVTSEL\[15:0\] (event and umask), or with
    /// [`CounterConstraint::codes_to`] the first event code.
    pub event: u16,
    /// The EVTSEL\[15:0\] bits compared with `event`: 0x00FF for every umask
    /// of the code (INTEL_EVENT_CONSTRAINT), 0xFFFF for one event and umask
    /// (INTEL_UEVENT_CONSTRAINT), the code's bits and the umask bits of
    /// `event` for "this umask bit set" (INTEL_UBIT_EVENT_CONSTRAINT).
    pub cmask: u16,
    /// When set, every umask of the codes from `event`'s code through this
    /// one (INTEL_EVENT_CONSTRAINT_RANGE); `cmask` is then unused.
    pub codes_to: Option<u8>,
    /// Allowed general-purpose counters (bit n = PMCn).
    pub gp_mask: u32,
}

impl CounterConstraint {
    /// Every umask of event code `code`.
    pub const fn code(code: u8, gp_mask: u32) -> Self {
        Self {
            event: code as u16,
            cmask: 0x00FF,
            codes_to: None,
            gp_mask,
        }
    }

    /// Every umask of the event codes `first..=last`.
    pub const fn codes(first: u8, last: u8, gp_mask: u32) -> Self {
        Self {
            event: first as u16,
            cmask: 0x00FF,
            codes_to: Some(last),
            gp_mask,
        }
    }

    /// One event and umask.
    pub const fn exact(event: u16, gp_mask: u32) -> Self {
        Self {
            event,
            cmask: 0xFFFF,
            codes_to: None,
            gp_mask,
        }
    }

    /// The event code of `event` with at least the umask bits of `event`
    /// set.
    pub const fn umask_bits(event: u16, gp_mask: u32) -> Self {
        Self {
            event,
            cmask: 0x00FF | event,
            codes_to: None,
            gp_mask,
        }
    }

    /// Whether the constraint holds for the select bits `evtsel`.
    pub fn matches(&self, evtsel: u64) -> bool {
        match self.codes_to {
            None => (evtsel & 0xFFFF) as u16 & self.cmask == self.event,
            Some(last) => {
                let code = (evtsel & 0xFF) as u8;
                code >= self.event as u8 && code <= last
            }
        }
    }
}

/// The model-specific LBR stack of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LegacyLbr {
    /// Typical PERF_CAPABILITIES\[5:0\] (the real one is read at detection).
    pub format: u8,
    /// Entries.
    pub depth: u8,
    /// FROM_IP of entry 0.
    pub from: u32,
    /// TO_IP of entry 0.
    pub to: u32,
    /// MSR_LBR_SELECT exists (not on Core 2 and Bonnell: writing it is a #GP).
    pub select: bool,
    /// LBR_SELECT bit 9 (EN_CALLSTACK) exists (Haswell and later big cores,
    /// Goldmont and later small cores); reserved before.
    pub call_stack: bool,
    /// The part reports format 1 (LIP) but FROM\[63\] is the mispredict flag
    /// (Knights Landing / Mill; Linux `intel_pmu_lbr_init_knl`): decode as
    /// format 3.
    pub lip_has_mispred: bool,
}

/// LBR facility of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelLbr {
    /// No LBR.
    None,
    /// Model-specific LBR.
    Legacy(LegacyLbr),
    /// Architectural LBR (CPUID leaf 0x1C) with this typical depth.
    Arch(u8),
}

/// The core type of a CPU of a hybrid part (CPUID.1AH:EAX\[31:24\], SDM
/// vol. 2A "CPUID: Native Model ID Enumeration Leaf"; the part sets
/// CPUID.07H.0:EDX\[15\] "Hybrid").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoreType {
    /// Intel Atom (20H): the E-cores.
    Atom,
    /// Intel Core (40H): the P-cores.
    Core,
}

impl CoreType {
    /// The core type of CPUID.1AH:EAX, `None` for an unknown type.
    pub fn from_leaf_1a(eax: u32) -> Option<Self> {
        match eax >> 24 {
            0x20 => Some(CoreType::Atom),
            0x40 => Some(CoreType::Core),
            _ => None,
        }
    }

    /// CPUID.1AH:EAX\[31:24\] of this core type.
    pub fn leaf_1a_id(self) -> u32 {
        match self {
            CoreType::Atom => 0x20,
            CoreType::Core => 0x40,
        }
    }
}

/// One row: the facts of a group of family-6 models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntelModel {
    /// Microarchitecture name.
    pub name: &'static str,
    /// CPUID display models (family 6).
    pub models: &'static [u8],
    /// `None`: every CPU of the models. `Some(t)`: the PMU of the
    /// core-type-`t` CPUs of a hybrid part, whose other core type has a row
    /// of its own (Linux: one `x86_hybrid_pmu` per core type).
    pub core_type: Option<CoreType>,
    /// Where the facts come from.
    pub source: &'static str,
    /// Typical perfmon version.
    pub version: u8,
    /// Typical general-purpose counters per logical CPU.
    pub gp: u8,
    /// Typical fixed counters.
    pub fixed: u8,
    /// Typical PEBS record format (`None`: no PEBS).
    pub pebs_format: Option<u8>,
    /// PERF_CAPABILITIES\[14\] (PEBS baseline: adaptive groups, PEBS on
    /// every event and on fixed counters).
    pub pebs_baseline: bool,
    /// PEBS errata of the model.
    pub pebs_quirks: PebsQuirks,
    /// General-purpose counters PEBS may use at all.
    pub pebs_gp_mask: u32,
    /// Further per-event PEBS constraints.
    pub pebs_constraints: &'static [PebsConstraint],
    /// The general-purpose counters each event may use at all, precise or
    /// not (Linux `intel_*_event_constraints`, first matching row wins);
    /// an event no row matches may use every counter. On another counter
    /// the event counts nothing useful.
    pub counter_constraints: &'static [CounterConstraint],
    /// Event and umask of the load-latency event (`mem-loads`), which uses
    /// the extra register MSR_PEBS_LD_LAT_THRESHOLD; `None`: the model has
    /// no load-latency facility and no such MSR.
    pub ld_lat_event: Option<u16>,
    /// Event and umask of the precise-store event (`mem-stores`): Linux's
    /// `mem_st_snb` (0x02CD, MEM_TRANS_RETIRED.PRECISE_STORE) on Sandy
    /// Bridge and Ivy Bridge, `mem_st_hsw` (0x82D0) from Haswell on;
    /// `None` where Linux has no mem-stores (Nehalem, Westmere, Core 2,
    /// the Atoms before Gracemont).
    pub st_event: Option<u16>,
    /// The load-latency event only assists when the auxiliary event 0x8203
    /// (`mem-loads-aux`) counts too (Linux `PMU_FL_MEM_LOADS_AUX`).
    pub mem_loads_aux: bool,
    /// How the load data-source field of PEBS records reads (Linux
    /// `pebs_data_source` as patched for the model in `intel_pmu_init`);
    /// [`DataSource::Snb`] where the model has no load latency.
    pub data_source: DataSource,
    /// `cycles:p` alias.
    pub cycles_alias: CyclesAlias,
    /// LBR facility.
    pub lbr: ModelLbr,
    /// `(model, stepping)`: steppings of `model` below `stepping` have no
    /// working LBR (it cannot freeze on a PMI): the model is treated as
    /// having none.
    pub lbr_min_stepping: &'static [(u8, u8)],
    /// LVT re-arm point in the PMI handler.
    pub ack: PmiAck,
    /// Smallest periods the model takes (Linux `*_limit_period`).
    pub min_periods: &'static [MinPeriod],
    /// Errata AAK100, AAP53 and BD53 (Nehalem, Westmere): the counters
    /// must be reset with [`NHM_MAGIC_EVENTS`] when events are added
    /// (Linux's `intel_pmu_nhm_enable_all`).
    pub reset_on_enable: bool,
}

/// A lower bound on the sampling period: shorter periods are unsafe on the
/// model (missed or stuck overflows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MinPeriod {
    /// Event and umask (EVTSEL\[15:0\]) it applies to; `None`: every event.
    pub event: Option<u16>,
    /// Only for precision level 3 (`:ppp`).
    pub ppp_only: bool,
    /// The smallest period.
    pub min: u64,
    /// Periods are rounded down to a multiple of this power of two (1: no
    /// rounding; 64 for Broadwell's INST_RETIRED.PREC_DIST, as Linux's
    /// bdw_limit_period).
    pub align: u64,
}

/// PEBS errata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PebsQuirks {
    /// PEBS is unreliable and must not be used (Merom / Clovertown; Linux
    /// `intel_clovertown_quirk`).
    pub broken: bool,
    /// The PEBS buffer must fit in one 4 KiB page (Core 2; Linux limits
    /// `pebs_buffer_size` to a page there).
    pub one_page: bool,
}

impl PebsQuirks {
    /// No PEBS errata.
    pub const NONE: PebsQuirks = PebsQuirks {
        broken: false,
        one_page: false,
    };
}

/// The auxiliary event of [`IntelModel::mem_loads_aux`] models (event 0x03,
/// umask 0x82).
pub const MEM_LOADS_AUX_EVENT: u16 = 0x8203;

const NHM_FROM: u32 = addr::MSR_LBR_NHM_FROM;
const NHM_TO: u32 = addr::MSR_LBR_NHM_TO;
const CORE_FROM: u32 = addr::MSR_LBR_CORE_FROM;
const CORE_TO: u32 = addr::MSR_LBR_CORE_TO;

const fn legacy(format: u8, depth: u8, from: u32, to: u32, select: bool, cs: bool) -> ModelLbr {
    ModelLbr::Legacy(LegacyLbr {
        format,
        depth,
        from,
        to,
        select,
        call_stack: cs,
        lip_has_mispred: false,
    })
}

const ALL_GP: u32 = 0xFF;

/// The three non-counting events (and the third again) that reset the
/// counters of Nehalem and Westmere when events are added (errata AAK100,
/// AAP53, BD53; Linux's `intel_pmu_nhm_workaround`).
pub const NHM_MAGIC_EVENTS: [u64; 4] = [0x4300B5, 0x4300D2, 0x4300B1, 0x4300B1];

/// MEM_TRANS_RETIRED.PRECISE_STORE, Sandy Bridge's and Ivy Bridge's
/// `mem-stores`: it takes PEBS only with IA32_PEBS_ENABLE\[63\]
/// (PS_ENABLE) set.
pub const PRECISE_STORE_EVENT: u16 = 0x02CD;

/// Core 2 (Linux `intel_core2_event_constraints`): FP_COMP_OPS_EXE (0x10),
/// CYCLES_DIV_BUSY (0x14), IDLE_DURING_DIV (0x18),
/// RS_UOPS_DISPATCH_CYCLES (0xa1), ITLB_MISS_RETIRED (0xc9) and
/// MEM_LOAD_RETIRED (0xcb) on PMC0; FP_ASSIST (0x11), MUL (0x12), DIV
/// (0x13) and DELAYED_BYPASS (0x19) on PMC1.
const CORE2_CONSTRAINTS: &[CounterConstraint] = &[
    CounterConstraint::code(0x10, 0x1),
    CounterConstraint::code(0x11, 0x2),
    CounterConstraint::code(0x12, 0x2),
    CounterConstraint::code(0x13, 0x2),
    CounterConstraint::code(0x14, 0x1),
    CounterConstraint::code(0x18, 0x1),
    CounterConstraint::code(0x19, 0x2),
    CounterConstraint::code(0xA1, 0x1),
    CounterConstraint::code(0xC9, 0x1),
    CounterConstraint::code(0xCB, 0x1),
];

/// Nehalem (Linux `intel_nehalem_event_constraints`): the L1D events
/// L1D_CACHE_LD/ST/LOCK, L1D_ALL_REF (0x40-0x43), L1D_PEND_MISS (0x48),
/// L1D_PREFETCH (0x4e), L1D (0x51) and CACHE_LOCK_CYCLES (0x63) on PMC0-1.
const NHM_CONSTRAINTS: &[CounterConstraint] = &[
    CounterConstraint::codes(0x40, 0x43, 0x3),
    CounterConstraint::code(0x48, 0x3),
    CounterConstraint::code(0x4E, 0x3),
    CounterConstraint::code(0x51, 0x3),
    CounterConstraint::code(0x63, 0x3),
];

/// Westmere (Linux `intel_westmere_event_constraints`): L1D (0x51) and
/// CACHE_LOCK_CYCLES (0x63) on PMC0-1, OFFCORE_REQUESTS_OUTSTANDING (0x60)
/// and SNOOPQ_REQUEST_OUTSTANDING (0xb3) on PMC0.
const WSM_CONSTRAINTS: &[CounterConstraint] = &[
    CounterConstraint::code(0x51, 0x3),
    CounterConstraint::code(0x60, 0x1),
    CounterConstraint::code(0x63, 0x3),
    CounterConstraint::code(0xB3, 0x1),
];

/// Sandy Bridge (Linux `intel_snb_event_constraints`, first match wins):
/// CYCLE_ACTIVITY.CYCLES_NO_DISPATCH (0x04a3) and .STALLS_L2_PENDING
/// (0x05a3) on PMC0-3, .CYCLES_L1D_PENDING (0x02a3), .STALLS_L1D_PENDING
/// (0x06a3) and L1D_PEND_MISS (0x48) on PMC2, INST_RETIRED.PREC_DIST
/// (0x01c0) on PMC1, MEM_TRANS_RETIRED (0xcd) on PMC3, the memory events
/// 0xd0-0xd3 on PMC0-3.
const SNB_CONSTRAINTS: &[CounterConstraint] = &[
    CounterConstraint::exact(0x04A3, 0xF),
    CounterConstraint::exact(0x05A3, 0xF),
    CounterConstraint::exact(0x02A3, 0x4),
    CounterConstraint::exact(0x06A3, 0x4),
    CounterConstraint::code(0x48, 0x4),
    CounterConstraint::exact(0x01C0, 0x2),
    CounterConstraint::code(0xCD, 0x8),
    CounterConstraint::codes(0xD0, 0xD3, 0xF),
];

/// Ivy Bridge (Linux `intel_ivb_event_constraints`): L1D_PEND_MISS.PENDING
/// (0x0148) and CYCLE_ACTIVITY.CYCLES/STALLS_L1D_PENDING (0x08a3, 0x0ca3)
/// on PMC2, IDQ.EMPTY (0x0279), IDQ_UOPS_NOT_DELIVERED.CORE (0x019c) and
/// the other CYCLE_ACTIVITY umasks 0x02, 0x04-0x06 on PMC0-3,
/// INST_RETIRED.PREC_DIST (0x01c0) on PMC1, 0xd0-0xd3 on PMC0-3.
const IVB_CONSTRAINTS: &[CounterConstraint] = &[
    CounterConstraint::exact(0x0148, 0x4),
    CounterConstraint::exact(0x0279, 0xF),
    CounterConstraint::exact(0x019C, 0xF),
    CounterConstraint::exact(0x02A3, 0xF),
    CounterConstraint::exact(0x04A3, 0xF),
    CounterConstraint::exact(0x05A3, 0xF),
    CounterConstraint::exact(0x06A3, 0xF),
    CounterConstraint::exact(0x08A3, 0x4),
    CounterConstraint::exact(0x0CA3, 0x4),
    CounterConstraint::exact(0x01C0, 0x2),
    CounterConstraint::codes(0xD0, 0xD3, 0xF),
];

/// Haswell (Linux `intel_hsw_event_constraints`): L1D_PEND_MISS.PENDING
/// (0x0148) on PMC2, INST_RETIRED.PREC_DIST (0x01c0) on PMC1,
/// MEM_TRANS_RETIRED (0xcd) on PMC3, CYCLE_ACTIVITY.CYCLES/STALLS_L1D_PENDING
/// (0x08a3, 0x0ca3) on PMC2, .CYCLES_NO_EXECUTE (0x04a3) and 0xd0-0xd3 on
/// PMC0-3.
const HSW_CONSTRAINTS: &[CounterConstraint] = &[
    CounterConstraint::exact(0x0148, 0x4),
    CounterConstraint::exact(0x01C0, 0x2),
    CounterConstraint::code(0xCD, 0x8),
    CounterConstraint::exact(0x08A3, 0x4),
    CounterConstraint::exact(0x0CA3, 0x4),
    CounterConstraint::exact(0x04A3, 0xF),
    CounterConstraint::codes(0xD0, 0xD3, 0xF),
];

/// Broadwell (Linux `intel_bdw_event_constraints`): L1D_PEND_MISS.PENDING
/// (0x0148) and CYCLE_ACTIVITY with umask bit 3 (0x08a3, CYCLES_L1D_MISS)
/// on PMC2; 0xd0-0xd2 and 0xcd on PMC0-3.
const BDW_CONSTRAINTS: &[CounterConstraint] = &[
    CounterConstraint::exact(0x0148, 0x4),
    CounterConstraint::umask_bits(0x08A3, 0x4),
    CounterConstraint::codes(0xD0, 0xD2, 0xF),
    CounterConstraint::code(0xCD, 0xF),
];

/// Skylake (Linux `intel_skl_event_constraints`): INST_RETIRED.PREC_DIST
/// (0x01c0) on PMC1; 0xd0-0xd2, 0xcd and FRONTEND_RETIRED (0xc6) on PMC0-3.
const SKL_CONSTRAINTS: &[CounterConstraint] = &[
    CounterConstraint::exact(0x01C0, 0x2),
    CounterConstraint::codes(0xD0, 0xD2, 0xF),
    CounterConstraint::code(0xCD, 0xF),
    CounterConstraint::code(0xC6, 0xF),
];

/// Ice Lake (Linux `intel_icl_event_constraints`): of the eight counters,
/// event codes 0x03-0x0a, 0x1f-0x28, 0x32, 0x48-0x54, 0x60-0x8b, 0xa3
/// (except CYCLE_ACTIVITY.STALLS_TOTAL 0x04a3, .CYCLES_MEM_ANY 0x10a3 and
/// .STALLS_MEM_ANY 0x14a3, on all), 0xa8-0xb0, 0xb7-0xbd, 0xd0-0xe6, 0xef
/// and 0xf0-0xf4 only on PMC0-3.
const ICL_CONSTRAINTS: &[CounterConstraint] = &[
    CounterConstraint::codes(0x03, 0x0A, 0xF),
    CounterConstraint::codes(0x1F, 0x28, 0xF),
    CounterConstraint::code(0x32, 0xF),
    CounterConstraint::codes(0x48, 0x54, 0xF),
    CounterConstraint::codes(0x60, 0x8B, 0xF),
    CounterConstraint::exact(0x04A3, 0xFF),
    CounterConstraint::exact(0x10A3, 0xFF),
    CounterConstraint::exact(0x14A3, 0xFF),
    CounterConstraint::code(0xA3, 0xF),
    CounterConstraint::codes(0xA8, 0xB0, 0xF),
    CounterConstraint::codes(0xB7, 0xBD, 0xF),
    CounterConstraint::codes(0xD0, 0xE6, 0xF),
    CounterConstraint::code(0xEF, 0xF),
    CounterConstraint::codes(0xF0, 0xF4, 0xF),
];

/// Sapphire Rapids and the Golden Cove P-cores (Linux
/// `intel_spr_event_constraints`): event codes below 0x90 on PMC0-3 except
/// 0x2e and 0x3c (all eight); CYCLE_ACTIVITY 0x01a3, 0x02a3, 0x08a3 and
/// 0xd0-0xdf on PMC0-3; 0x04a4, 0x08a4 (TOPDOWN), 0x02cd and 0xce on PMC0.
const SPR_CONSTRAINTS: &[CounterConstraint] = &[
    CounterConstraint::code(0x2E, 0xFF),
    CounterConstraint::code(0x3C, 0xFF),
    CounterConstraint::codes(0x01, 0x8F, 0xF),
    CounterConstraint::exact(0x01A3, 0xF),
    CounterConstraint::exact(0x02A3, 0xF),
    CounterConstraint::exact(0x08A3, 0xF),
    CounterConstraint::exact(0x04A4, 0x1),
    CounterConstraint::exact(0x08A4, 0x1),
    CounterConstraint::exact(0x02CD, 0x1),
    CounterConstraint::code(0xCE, 0x1),
    CounterConstraint::codes(0xD0, 0xDF, 0xF),
];

const NEHALEM: IntelModel = IntelModel {
    name: "Nehalem",
    // Linux's Nehalem case: NEHALEM (0x1E), NEHALEM_EP (0x1A) and
    // NEHALEM_EX (0x2E); NEHALEM_G (0x1F) is not among them and takes the
    // architectural default there, as here.
    models: &[0x1A, 0x1E, 0x2E],
    core_type: None,
    source: "SDM vol. 3 \"Nehalem\" load latency MEM_INST_RETIRED.LATENCY_ABOVE_THRESHOLD (0x100B) with MSR_PEBS_LD_LAT_THRESHOLD, LBR 16 at 0x680/0x6C0; Linux intel_nehalem_pebs_event_constraints, intel_nehalem_extra_regs, intel_pebs_aliases_core2; data source: intel_pmu_pebs_data_source_nhm and pebs_no_tlb",
    version: 3,
    gp: 4,
    fixed: 3,
    pebs_format: Some(1),
    pebs_baseline: false,
    pebs_quirks: PebsQuirks::NONE,
    pebs_gp_mask: 0xF,
    pebs_constraints: &[PebsConstraint::exact(0x100B, 0xF)],
    counter_constraints: NHM_CONSTRAINTS,
    ld_lat_event: Some(0x100B),
    st_event: None,
    mem_loads_aux: false,
    data_source: DataSource::Nhm,
    cycles_alias: CyclesAlias::Core2,
    lbr: legacy(3, 16, NHM_FROM, NHM_TO, true, false),
    lbr_min_stepping: &[],
    ack: PmiAck::Early,
    min_periods: &[MinPeriod {
        event: None,
        ppp_only: false,
        min: 32,
        align: 1,
    }],
    reset_on_enable: true,
};

const SKYLAKE: IntelModel = IntelModel {
    name: "Skylake / Kaby Lake / Coffee Lake / Comet Lake (client)",
    // Linux's Skylake case: SKYLAKE(_L), KABYLAKE(_L), COMETLAKE(_L);
    // Cannon Lake (0x66) is not among them and takes the architectural
    // default there, as here.
    models: &[0x4E, 0x5E, 0x8E, 0x9E, 0xA5, 0xA6],
    core_type: None,
    source: "SDM vol. 3 \"Skylake\" (PEBS format 3, LBR 32 with MSR_LBR_INFO); Linux intel_skl_pebs_event_constraints, intel_pebs_aliases_skl, intel_pmu_lbr_init_skl, late_ack; data source: intel_pmu_pebs_data_source_skl(false)",
    version: 4,
    gp: 4,
    fixed: 3,
    pebs_format: Some(3),
    pebs_baseline: false,
    pebs_quirks: PebsQuirks::NONE,
    pebs_gp_mask: 0xF,
    pebs_constraints: &[PebsConstraint::exact(0x01C0, 0x2)],
    counter_constraints: SKL_CONSTRAINTS,
    ld_lat_event: Some(0x01CD),
    st_event: Some(0x82D0),
    mem_loads_aux: false,
    data_source: DataSource::Skl { pmem: false },
    cycles_alias: CyclesAlias::Skl,
    lbr: legacy(5, 32, NHM_FROM, NHM_TO, true, true),
    lbr_min_stepping: &[],
    ack: PmiAck::Late,
    min_periods: &[],
    reset_on_enable: false,
};

const ICE_LAKE: IntelModel = IntelModel {
    name: "Ice Lake / Tiger Lake / Rocket Lake (client)",
    models: &[0x7D, 0x7E, 0x8C, 0x8D, 0xA7],
    core_type: None,
    source: "SDM vol. 3 \"Ice Lake\" adaptive PEBS format 4 with baseline (PEBS on all events and fixed counters, EVTSEL[34] / FIXED_CTR_CTRL[32+4n] adaptive bits), legacy LBR 32 with LBR_INFO; Linux intel_icl_pebs_event_constraints (memory events 0xd0-0xd4 on PMC0-3), intel_pmu_lbr_init_skl, late_ack; data source: intel_pmu_pebs_data_source_skl(false)",
    version: 5,
    gp: 8,
    fixed: 4,
    pebs_format: Some(4),
    pebs_baseline: true,
    pebs_quirks: PebsQuirks::NONE,
    pebs_gp_mask: ALL_GP,
    pebs_constraints: &[PebsConstraint::codes(0xD0, 0xD4, 0xF)],
    counter_constraints: ICL_CONSTRAINTS,
    ld_lat_event: Some(0x01CD),
    st_event: Some(0x82D0),
    mem_loads_aux: false,
    data_source: DataSource::Skl { pmem: false },
    cycles_alias: CyclesAlias::None,
    lbr: legacy(5, 32, NHM_FROM, NHM_TO, true, true),
    lbr_min_stepping: &[],
    ack: PmiAck::Late,
    min_periods: &[],
    reset_on_enable: false,
};

const SAPPHIRE_RAPIDS: IntelModel = IntelModel {
    name: "Sapphire Rapids / Emerald Rapids",
    models: &[0x8F, 0xCF],
    core_type: None,
    source: "SDM vol. 3 \"Golden Cove\" adaptive PEBS format 5, architectural LBR; Linux intel_spr_pebs_event_constraints (instructions 0xc0 and load latency 0x1cd not on PMC0, store latency 0x2cd (mem_st_spr) on PMC0 only, memory events 0xd0-0xd4 on PMC0-3), PMU_FL_MEM_LOADS_AUX (0x8203), spr_limit_period (:ppp at least 128), late_ack; data source: intel_pmu_pebs_data_source_skl(true) (pmem)",
    version: 5,
    gp: 8,
    fixed: 4,
    pebs_format: Some(5),
    pebs_baseline: true,
    pebs_quirks: PebsQuirks::NONE,
    pebs_gp_mask: ALL_GP,
    pebs_constraints: &[
        PebsConstraint::codes(0xC0, 0xC0, 0xFE),
        PebsConstraint::exact(0x01CD, 0xFE),
        PebsConstraint::exact(PRECISE_STORE_EVENT, 0x1),
        PebsConstraint::codes(0xD0, 0xD4, 0xF),
    ],
    counter_constraints: SPR_CONSTRAINTS,
    ld_lat_event: Some(0x01CD),
    st_event: Some(PRECISE_STORE_EVENT),
    mem_loads_aux: true,
    data_source: DataSource::Skl { pmem: true },
    cycles_alias: CyclesAlias::None,
    lbr: ModelLbr::Arch(32),
    lbr_min_stepping: &[],
    ack: PmiAck::Late,
    min_periods: &[MinPeriod {
        event: None,
        ppp_only: true,
        min: 128,
        align: 1,
    }],
    reset_on_enable: false,
};

/// The table. A model appears in one row only.
pub static INTEL_MODELS: &[IntelModel] = &[
    IntelModel {
        name: "Core 2 Merom / Clovertown",
        models: &[0x0F],
        core_type: None,
        source: "SDM vol. 3 \"Intel Core Microarchitecture\" (LBR 4 entries at 0x40/0x60, no LBR_SELECT); PEBS unreliable: Linux intel_clovertown_quirk disables it",
        version: 2,
        gp: 2,
        fixed: 3,
        pebs_format: Some(0),
        pebs_baseline: false,
        pebs_quirks: PebsQuirks {
            broken: true,
            one_page: true,
        },
        pebs_gp_mask: 0x1,
        pebs_constraints: &[],
        counter_constraints: CORE2_CONSTRAINTS,
        ld_lat_event: None,
        st_event: None,
        mem_loads_aux: false,
        data_source: DataSource::Snb,
        cycles_alias: CyclesAlias::Core2,
        lbr: legacy(1, 4, CORE_FROM, CORE_TO, false, false),
        lbr_min_stepping: &[],
        ack: PmiAck::Early,
        min_periods: &[],
        reset_on_enable: false,
    },
    IntelModel {
        name: "Core 2 (Merom-L, Penryn, Dunnington)",
        models: &[0x16, 0x17, 0x1D],
        core_type: None,
        source: "SDM vol. 3 \"Intel Core Microarchitecture\" PEBS (PMC0 only), LBR 4 entries at 0x40/0x60, no LBR_SELECT; Linux intel_core2_pebs_event_constraints, intel_pebs_aliases_core2, intel_pmu_lbr_init_core, one-page PEBS buffer",
        version: 2,
        gp: 2,
        fixed: 3,
        pebs_format: Some(0),
        pebs_baseline: false,
        pebs_quirks: PebsQuirks {
            broken: false,
            one_page: true,
        },
        pebs_gp_mask: 0x1,
        pebs_constraints: &[],
        counter_constraints: CORE2_CONSTRAINTS,
        ld_lat_event: None,
        st_event: None,
        mem_loads_aux: false,
        data_source: DataSource::Snb,
        cycles_alias: CyclesAlias::Core2,
        lbr: legacy(1, 4, CORE_FROM, CORE_TO, false, false),
        lbr_min_stepping: &[],
        ack: PmiAck::Early,
        min_periods: &[],
        reset_on_enable: false,
    },
    IntelModel {
        name: "Atom Bonnell / Saltwell",
        models: &[0x1C, 0x26, 0x27, 0x35, 0x36],
        core_type: None,
        source: "SDM vol. 4 MSRs for Atom (LBR 8 entries at 0x40/0x60, no LBR_SELECT); Linux intel_atom_pebs_event_constraints (PMC0), intel_pmu_lbr_init_atom (model 28 before stepping 10: LBR disabled, erratum: it cannot freeze on PMI)",
        version: 3,
        gp: 2,
        fixed: 3,
        pebs_format: Some(0),
        pebs_baseline: false,
        pebs_quirks: PebsQuirks::NONE,
        pebs_gp_mask: 0x1,
        pebs_constraints: &[],
        counter_constraints: &[],
        ld_lat_event: None,
        st_event: None,
        mem_loads_aux: false,
        data_source: DataSource::Snb,
        cycles_alias: CyclesAlias::Core2,
        lbr: legacy(1, 8, CORE_FROM, CORE_TO, false, false),
        lbr_min_stepping: &[(0x1C, 10)],
        ack: PmiAck::Early,
        min_periods: &[],
        reset_on_enable: false,
    },
    IntelModel {
        name: "Silvermont / Airmont",
        models: &[0x37, 0x4A, 0x4C, 0x4D, 0x5A, 0x5D],
        core_type: None,
        source: "SDM vol. 3 \"Silvermont\" PEBS on PMC0 only, LBR 8 entries at 0x40/0x60 with LBR_SELECT; Linux intel_slm_pebs_event_constraints (cycles:p through the Core 2 alias 0x108000c0 on PMC0), intel_pmu_lbr_init_slm",
        version: 3,
        gp: 2,
        fixed: 3,
        pebs_format: Some(2),
        pebs_baseline: false,
        pebs_quirks: PebsQuirks::NONE,
        pebs_gp_mask: 0x1,
        pebs_constraints: &[],
        counter_constraints: &[],
        ld_lat_event: None,
        st_event: None,
        mem_loads_aux: false,
        data_source: DataSource::Snb,
        cycles_alias: CyclesAlias::Core2,
        lbr: legacy(3, 8, CORE_FROM, CORE_TO, true, false),
        lbr_min_stepping: &[],
        ack: PmiAck::Early,
        min_periods: &[],
        reset_on_enable: false,
    },
    IntelModel {
        name: "Knights Landing / Knights Mill",
        models: &[0x57, 0x85],
        core_type: None,
        source: "SDM vol. 4 MSRs for Xeon Phi (LBR 8 entries at 0x680/0x6C0); Linux intel_pmu_lbr_init_knl (8 entries, LIP format carries the mispredict bit), KNL uses the SLM PEBS constraints (PMC0), no load latency",
        version: 3,
        gp: 2,
        fixed: 3,
        pebs_format: Some(2),
        pebs_baseline: false,
        pebs_quirks: PebsQuirks::NONE,
        pebs_gp_mask: 0x1,
        pebs_constraints: &[],
        counter_constraints: &[],
        ld_lat_event: None,
        st_event: None,
        mem_loads_aux: false,
        data_source: DataSource::Snb,
        cycles_alias: CyclesAlias::None,
        lbr: ModelLbr::Legacy(LegacyLbr {
            format: 1,
            depth: 8,
            from: NHM_FROM,
            to: NHM_TO,
            select: true,
            call_stack: false,
            lip_has_mispred: true,
        }),
        lbr_min_stepping: &[],
        ack: PmiAck::Early,
        min_periods: &[],
        reset_on_enable: false,
    },
    IntelModel {
        name: "Goldmont",
        models: &[0x5C, 0x5F],
        core_type: None,
        source: "SDM vol. 3 \"Goldmont\" PEBS (PMC0), LBR 32 entries with cycle counts in TO; Linux intel_glm_pebs_event_constraints, intel_pmu_lbr_init_skl",
        version: 4,
        gp: 4,
        fixed: 3,
        pebs_format: Some(3),
        pebs_baseline: false,
        pebs_quirks: PebsQuirks::NONE,
        pebs_gp_mask: 0x1,
        pebs_constraints: &[],
        counter_constraints: &[],
        ld_lat_event: None,
        st_event: None,
        mem_loads_aux: false,
        data_source: DataSource::Snb,
        cycles_alias: CyclesAlias::Direct,
        lbr: legacy(6, 32, NHM_FROM, NHM_TO, true, true),
        lbr_min_stepping: &[],
        ack: PmiAck::Early,
        min_periods: &[],
        reset_on_enable: false,
    },
    IntelModel {
        name: "Goldmont Plus",
        models: &[0x7A],
        core_type: None,
        source: "SDM vol. 3 \"Goldmont Plus\" LBR 32 entries with cycle counts in TO; Linux intel_glp_pebs_event_constraints (PEBS on every general-purpose counter), intel_pmu_lbr_init_skl",
        version: 4,
        gp: 4,
        fixed: 3,
        pebs_format: Some(3),
        pebs_baseline: false,
        pebs_quirks: PebsQuirks::NONE,
        pebs_gp_mask: 0xF,
        pebs_constraints: &[],
        counter_constraints: &[],
        ld_lat_event: None,
        st_event: None,
        mem_loads_aux: false,
        data_source: DataSource::Snb,
        cycles_alias: CyclesAlias::Direct,
        lbr: legacy(6, 32, NHM_FROM, NHM_TO, true, true),
        lbr_min_stepping: &[],
        ack: PmiAck::Early,
        min_periods: &[],
        reset_on_enable: false,
    },
    IntelModel {
        name: "Tremont",
        models: &[0x86, 0x96, 0x9C],
        core_type: None,
        source: "SDM vol. 3 \"Tremont\" extended PEBS, format 4 with basic records only (no PERF_CAPABILITIES[14]); Linux intel_ds_init format 4 without pebs_baseline",
        version: 5,
        gp: 4,
        fixed: 3,
        pebs_format: Some(4),
        pebs_baseline: false,
        pebs_quirks: PebsQuirks::NONE,
        pebs_gp_mask: 0xF,
        pebs_constraints: &[],
        counter_constraints: &[],
        ld_lat_event: None,
        st_event: None,
        mem_loads_aux: false,
        data_source: DataSource::Snb,
        cycles_alias: CyclesAlias::Direct,
        lbr: legacy(6, 32, NHM_FROM, NHM_TO, true, true),
        lbr_min_stepping: &[],
        ack: PmiAck::Early,
        min_periods: &[],
        reset_on_enable: false,
    },
    NEHALEM,
    IntelModel {
        name: "Westmere",
        models: &[0x25, 0x2C, 0x2F],
        core_type: None,
        source: "SDM vol. 3 \"Westmere\" (as Nehalem, load latency 0x100B with MSR_PEBS_LD_LAT_THRESHOLD, LBR 16 at 0x680/0x6C0); Linux intel_westmere_pebs_event_constraints, intel_westmere_extra_regs; data source: intel_pmu_pebs_data_source_nhm with TLB and lock bits (no pebs_no_tlb)",
        data_source: DataSource::Wsm,
        counter_constraints: WSM_CONSTRAINTS,
        ..NEHALEM
    },
    IntelModel {
        name: "Sandy Bridge",
        models: &[0x2A, 0x2D],
        core_type: None,
        source: "SDM vol. 3 \"Sandy Bridge\" load latency on PMC3 only; Linux intel_snb_pebs_event_constraints (INTEL_PLD_CONSTRAINT 0x01cd, 0x8), intel_snb_extra_regs, intel_pebs_aliases_snb",
        version: 3,
        gp: 4,
        fixed: 3,
        pebs_format: Some(1),
        pebs_baseline: false,
        pebs_quirks: PebsQuirks::NONE,
        pebs_gp_mask: 0xF,
        pebs_constraints: &[
            PebsConstraint::exact(0x01CD, 0x8),
            PebsConstraint::exact(PRECISE_STORE_EVENT, 0x8),
        ],
        counter_constraints: SNB_CONSTRAINTS,
        ld_lat_event: Some(0x01CD),
        st_event: Some(PRECISE_STORE_EVENT),
        mem_loads_aux: false,
        data_source: DataSource::Snb,
        cycles_alias: CyclesAlias::Snb,
        lbr: legacy(3, 16, NHM_FROM, NHM_TO, true, false),
        lbr_min_stepping: &[],
        ack: PmiAck::Early,
        min_periods: &[],
        reset_on_enable: false,
    },
    IntelModel {
        name: "Ivy Bridge",
        models: &[0x3A, 0x3E],
        core_type: None,
        source: "SDM vol. 3 \"Ivy Bridge\" (load latency on PMC3, INST_RETIRED.PREC_DIST on PMC1); Linux intel_ivb_pebs_event_constraints, intel_pebs_aliases_ivb",
        version: 3,
        gp: 4,
        fixed: 3,
        pebs_format: Some(1),
        pebs_baseline: false,
        pebs_quirks: PebsQuirks::NONE,
        pebs_gp_mask: 0xF,
        pebs_constraints: &[
            PebsConstraint::exact(0x01CD, 0x8),
            PebsConstraint::exact(PRECISE_STORE_EVENT, 0x8),
            PebsConstraint::exact(0x01C0, 0x2),
        ],
        counter_constraints: IVB_CONSTRAINTS,
        ld_lat_event: Some(0x01CD),
        st_event: Some(PRECISE_STORE_EVENT),
        mem_loads_aux: false,
        data_source: DataSource::Snb,
        cycles_alias: CyclesAlias::Ivb,
        lbr: legacy(3, 16, NHM_FROM, NHM_TO, true, false),
        lbr_min_stepping: &[],
        ack: PmiAck::Early,
        min_periods: &[],
        reset_on_enable: false,
    },
    IntelModel {
        name: "Haswell",
        models: &[0x3C, 0x3F, 0x45, 0x46],
        core_type: None,
        source: "SDM vol. 3 \"Haswell\" (PEBS format 2, PREC_DIST on PMC1, LBR call-stack mode); Linux intel_hsw_pebs_event_constraints, intel_pebs_aliases_ivb, intel_pmu_lbr_init_hsw, late_ack",
        version: 3,
        gp: 4,
        fixed: 3,
        pebs_format: Some(2),
        pebs_baseline: false,
        pebs_quirks: PebsQuirks::NONE,
        pebs_gp_mask: 0xF,
        pebs_constraints: &[PebsConstraint::exact(0x01C0, 0x2)],
        counter_constraints: HSW_CONSTRAINTS,
        ld_lat_event: Some(0x01CD),
        st_event: Some(0x82D0),
        mem_loads_aux: false,
        data_source: DataSource::Snb,
        cycles_alias: CyclesAlias::Ivb,
        lbr: legacy(4, 16, NHM_FROM, NHM_TO, true, true),
        lbr_min_stepping: &[],
        ack: PmiAck::Late,
        min_periods: &[],
        reset_on_enable: false,
    },
    IntelModel {
        name: "Broadwell",
        models: &[0x3D, 0x47, 0x4F, 0x56],
        core_type: None,
        source: "SDM vol. 3 \"Broadwell\" (as Haswell); Linux intel_bdw_pebs_event_constraints, intel_pebs_aliases_ivb, bdw_limit_period (INST_RETIRED.ALL at least 128, a multiple of 64), late_ack",
        version: 3,
        gp: 4,
        fixed: 3,
        pebs_format: Some(2),
        pebs_baseline: false,
        pebs_quirks: PebsQuirks::NONE,
        pebs_gp_mask: 0xF,
        pebs_constraints: &[PebsConstraint::exact(0x01C0, 0x2)],
        counter_constraints: BDW_CONSTRAINTS,
        ld_lat_event: Some(0x01CD),
        st_event: Some(0x82D0),
        mem_loads_aux: false,
        data_source: DataSource::Snb,
        cycles_alias: CyclesAlias::Ivb,
        lbr: legacy(4, 16, NHM_FROM, NHM_TO, true, true),
        lbr_min_stepping: &[],
        ack: PmiAck::Late,
        min_periods: &[MinPeriod {
            event: Some(0x01C0),
            ppp_only: false,
            min: 128,
            align: 64,
        }],
        reset_on_enable: false,
    },
    SKYLAKE,
    IntelModel {
        name: "Skylake-X / Cascade Lake / Cooper Lake (server)",
        models: &[0x55],
        core_type: None,
        source: "as the Skylake client row; Linux intel_pmu_init: pmem for SKYLAKE_X, intel_pmu_pebs_data_source_skl(true)",
        data_source: DataSource::Skl { pmem: true },
        ..SKYLAKE
    },
    ICE_LAKE,
    IntelModel {
        name: "Ice Lake-X / Ice Lake-D (server)",
        models: &[0x6A, 0x6C],
        core_type: None,
        source: "as the Ice Lake client row; Linux intel_pmu_init: pmem for ICELAKE_X / ICELAKE_D, intel_pmu_pebs_data_source_skl(true)",
        data_source: DataSource::Skl { pmem: true },
        ..ICE_LAKE
    },
    SAPPHIRE_RAPIDS,
    IntelModel {
        name: "Alder Lake / Raptor Lake (Golden Cove / Raptor Cove P-cores)",
        models: &[0x97, 0x9A, 0xB7, 0xBA, 0xBF],
        core_type: Some(CoreType::Core),
        source: "SDM vol. 3 \"Golden Cove\", vol. 2A CPUID leaf 1AH core type 40H; Linux intel_pmu_init ALDERLAKE / RAPTORLAKE cpu_core PMU: intel_spr_pebs_event_constraints, PMU_FL_MEM_LOADS_AUX, spr_limit_period, late_ack; data source: intel_pmu_pebs_data_source_adl (skl(false) for the core PMU)",
        data_source: DataSource::Skl { pmem: false },
        ..SAPPHIRE_RAPIDS
    },
    IntelModel {
        name: "Alder Lake / Raptor Lake (Gracemont E-cores)",
        models: &[0x97, 0x9A, 0xB7, 0xBA, 0xBF],
        core_type: Some(CoreType::Atom),
        source: "SDM vol. 3 \"Gracemont\", vol. 2A CPUID leaf 1AH core type 20H; Linux intel_pmu_init ALDERLAKE / RAPTORLAKE cpu_atom PMU: intel_grt_pebs_event_constraints (load latency MEM_UOPS_RETIRED.LOAD_LATENCY 0x5d0 on PMC0-1), intel_grt_extra_regs (MSR_PEBS_LD_LAT_THRESHOLD), mid_ack, no mem-loads-aux (require_mem_loads_aux_event: big cores only), spr_limit_period; data source: intel_pmu_pebs_data_source_grt, adl_latency_data_small",
        version: 5,
        gp: 6,
        fixed: 3,
        pebs_format: Some(5),
        pebs_baseline: true,
        pebs_quirks: PebsQuirks::NONE,
        pebs_gp_mask: ALL_GP,
        pebs_constraints: &[PebsConstraint::exact(0x05D0, 0x3)],
        counter_constraints: &[],
        ld_lat_event: Some(0x05D0),
        st_event: Some(0x82D0),
        mem_loads_aux: false,
        data_source: DataSource::Grt,
        cycles_alias: CyclesAlias::None,
        lbr: ModelLbr::Arch(32),
        lbr_min_stepping: &[],
        ack: PmiAck::Mid,
        min_periods: &[MinPeriod {
            event: None,
            ppp_only: true,
            min: 128,
            align: 1,
        }],
        reset_on_enable: false,
    },
];

/// The row of family-6 model `model`, if the table knows it (for a hybrid
/// part, its P-core row).
pub fn intel_row(model: u8) -> Option<&'static IntelModel> {
    intel_row_for_core(model, false, None)
}

/// The row of family-6 model `model` for a CPU that is of a hybrid part
/// (`hybrid`, CPUID.07H.0:EDX\[15\]) with core type `core_type` (CPUID leaf
/// 1AH). A hybrid CPU gets its core type's row, and none (architectural
/// behaviour only) when the table has no row for it or the type is
/// unknown: the drivers must never take the E-core PMU for the P-core's.
/// A hybrid model on a CPU without the hybrid bit (E-cores disabled) runs
/// P-cores only.
pub fn intel_row_for_core(
    model: u8,
    hybrid: bool,
    core_type: Option<CoreType>,
) -> Option<&'static IntelModel> {
    let rows = || {
        INTEL_MODELS
            .iter()
            .filter(move |r| r.models.contains(&model))
    };
    if hybrid {
        let t = core_type?;
        rows().find(|r| r.core_type == Some(t))
    } else {
        rows().find(|r| matches!(r.core_type, None | Some(CoreType::Core)))
    }
}

/// What the drivers assume of a model the table does not know: only
/// architectural behaviour (no load latency, no model-specific LBR, no
/// alias, no constraints beyond the record format's own).
pub const UNKNOWN_MODEL: IntelModel = IntelModel {
    name: "unknown model (architectural only)",
    models: &[],
    core_type: None,
    source: "SDM vol. 3 \"Architectural Performance Monitoring\"",
    version: 0,
    gp: 0,
    fixed: 0,
    pebs_format: None,
    pebs_baseline: false,
    pebs_quirks: PebsQuirks::NONE,
    pebs_gp_mask: ALL_GP,
    pebs_constraints: &[],
    counter_constraints: &[],
    ld_lat_event: None,
    st_event: None,
    mem_loads_aux: false,
    data_source: DataSource::Snb,
    cycles_alias: CyclesAlias::None,
    lbr: ModelLbr::None,
    lbr_min_stepping: &[],
    ack: PmiAck::Late,
    min_periods: &[],
    reset_on_enable: false,
};

/// The row for a CPU: its table row for Intel family 6, else
/// [`UNKNOWN_MODEL`].
pub fn row_for(vendor_intel: bool, family: u8, model: u8) -> &'static IntelModel {
    row_for_core(vendor_intel, family, model, false, None)
}

/// [`row_for`] for a CPU that may be of a hybrid part (see
/// [`intel_row_for_core`]).
pub fn row_for_core(
    vendor_intel: bool,
    family: u8,
    model: u8,
    hybrid: bool,
    core_type: Option<CoreType>,
) -> &'static IntelModel {
    if vendor_intel && family == 6 {
        intel_row_for_core(model, hybrid, core_type).unwrap_or(&UNKNOWN_MODEL)
    } else {
        &UNKNOWN_MODEL
    }
}

impl IntelModel {
    /// How the model's `mem-stores` records read
    /// ([`sampler::pebs::MemKind`]): Sandy Bridge's precise store, the
    /// data-linear-address store of Haswell to Ice Lake, or Golden Cove's
    /// store latency (its 0x02CD with adaptive PEBS).
    pub fn store_kind(&self) -> sampler::pebs::MemKind {
        use sampler::pebs::MemKind;
        match self.st_event {
            Some(PRECISE_STORE_EVENT) if self.pebs_format.is_some_and(|f| f >= 4) => {
                MemKind::StoreLatency
            }
            Some(PRECISE_STORE_EVENT) => MemKind::Store,
            _ => MemKind::StoreDatala,
        }
    }

    /// General-purpose counters the event whose select bits are `evtsel`
    /// may count on at all (the first matching row of
    /// [`IntelModel::counter_constraints`]; every counter without one).
    pub fn gp_counters(&self, evtsel: u64) -> u32 {
        self.counter_constraints
            .iter()
            .find(|c| c.matches(evtsel))
            .map_or(u32::MAX, |c| c.gp_mask)
    }

    /// Whether [`IntelModel::counter_constraints`] govern the event with
    /// select bits `evtsel`: always when it is counted without PEBS; with
    /// PEBS the PEBS constraints take their place, as in Linux
    /// (`intel_pebs_constraints` before `x86_get_event_constraints`), except
    /// for an event no PEBS constraint names under PEBS baseline
    /// (`PMU_FL_PEBS_ALL`), which keeps its counter constraint.
    pub fn counter_constraint_applies(&self, evtsel: u64, pebs: bool, baseline: bool) -> bool {
        !pebs || (baseline && !self.pebs_constraints.iter().any(|c| c.matches(evtsel)))
    }

    /// General-purpose counters that can take PEBS for the event whose
    /// select bits are `evtsel`.
    pub fn pebs_counters(&self, evtsel: u64) -> u32 {
        let mut m = self.pebs_gp_mask;
        for c in self.pebs_constraints {
            if c.matches(evtsel) {
                m &= c.gp_mask;
            }
        }
        m
    }

    /// Whether the event with select bits `evtsel` may take PEBS on its
    /// fixed counter (with adaptive PEBS) at precision `precise`: not when a
    /// PEBS constraint of the model holds for it, since Linux's constraints
    /// name general-purpose counters only (0xc0 on Golden Cove is 0xfe:
    /// neither PMC0 nor fixed 0). As in Linux (icl_get_event_constraints),
    /// instructions at :ppp keep fixed counter 0.
    pub fn pebs_on_fixed(&self, evtsel: u64, precise: u8) -> bool {
        (precise >= 3 && evtsel & 0xFFFF == 0x00C0)
            || !self.pebs_constraints.iter().any(|c| c.matches(evtsel))
    }

    /// The smallest period the model takes for the event with select bits
    /// `evtsel` at precision `precise` (1 when unrestricted).
    pub fn min_period(&self, evtsel: u64, precise: u8) -> u64 {
        self.period_limits(evtsel, precise).0
    }

    /// The smallest period and the power of two periods are rounded down
    /// to, for the event with select bits `evtsel` at precision `precise`.
    pub fn period_limits(&self, evtsel: u64, precise: u8) -> (u64, u64) {
        let ev = (evtsel & 0xFFFF) as u16;
        let applies =
            |m: &&MinPeriod| m.event.is_none_or(|e| e == ev) && (!m.ppp_only || precise >= 3);
        let align = self
            .min_periods
            .iter()
            .filter(applies)
            .map(|m| m.align)
            .max()
            .unwrap_or(1);
        let min = self.min_periods.iter().filter(applies).map(|m| m.min).max();
        (min.unwrap_or(1), align)
    }

    /// The LBR of `model` at `stepping` does not work (see
    /// [`IntelModel::lbr_min_stepping`]).
    pub fn lbr_broken(&self, model: u8, stepping: u8) -> bool {
        self.lbr_min_stepping
            .iter()
            .any(|&(m, min)| m == model && stepping < min)
    }

    /// The legacy LBR facts, if the model has a model-specific LBR.
    pub fn legacy_lbr(&self) -> Option<&LegacyLbr> {
        match &self.lbr {
            ModelLbr::Legacy(l) => Some(l),
            _ => None,
        }
    }
}

/// How a row of [`AMD_F15H_CONSTRAINTS`] selects events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AmdEventMatch {
    /// This event code (EVTSEL\[35:32\] and \[7:0\] as bits 11:0), any unit mask.
    Code(u16),
    /// Event codes `.0..=.1`.
    Codes(u16, u16),
    /// This event code with a unit mask that has bits in both nibbles.
    CodeUmaskBothNibbles(u16),
    /// This event code with more than one unit-mask bit.
    CodeUmaskMultiBit(u16),
    /// This event code with at most one unit-mask bit.
    CodeUmaskOneBit(u16),
    /// Every code whose bits 7:4 (the unit type) are `.0..=.1` (as
    /// 0x00..=0xF0).
    Types(u16, u16),
}

/// A counter constraint of the AMD family 15h core PMU: events that only
/// count on some of the six PERF_CTRs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AmdConstraint {
    /// The events of the row.
    pub events: AmdEventMatch,
    /// Allowed counters (bit n = PERF_CTRn); 0: not a core event.
    pub counters: u32,
    /// Where the fact comes from.
    pub source: &'static str,
}

const F15H: &str = "AMD BKDG for family 15h, \"Core Performance Event Select\" PERF_CTL[5:0] event-to-counter table; Linux amd_get_event_constraints_f15h";

/// The family 15h (Bulldozer to Excavator) core-PMU constraints, first
/// matching row wins (exceptions before the unit-type defaults). Linux
/// uses them on family 15h with the core counter extensions
/// (`amd_core_pmu_init`).
pub static AMD_F15H_CONSTRAINTS: &[AmdConstraint] = &[
    // FP exceptions: PERF_CTR3 only.
    AmdConstraint {
        events: AmdEventMatch::CodeUmaskBothNibbles(0x000),
        counters: 0x08,
        source: F15H,
    },
    AmdConstraint {
        events: AmdEventMatch::CodeUmaskMultiBit(0x004),
        counters: 0x08,
        source: F15H,
    },
    AmdConstraint {
        events: AmdEventMatch::Code(0x003),
        counters: 0x08,
        source: F15H,
    },
    AmdConstraint {
        events: AmdEventMatch::Code(0x00B),
        counters: 0x08,
        source: F15H,
    },
    AmdConstraint {
        events: AmdEventMatch::Code(0x00D),
        counters: 0x08,
        source: F15H,
    },
    // FP (unit types 0x00, 0x10): PERF_CTR5:3.
    AmdConstraint {
        events: AmdEventMatch::Types(0x00, 0x10),
        counters: 0x38,
        source: F15H,
    },
    // LS / DC / EX exceptions.
    AmdConstraint {
        events: AmdEventMatch::Code(0x023),
        counters: 0x07,
        source: F15H,
    },
    AmdConstraint {
        events: AmdEventMatch::Code(0x043),
        counters: 0x07,
        source: F15H,
    },
    AmdConstraint {
        events: AmdEventMatch::Code(0x045),
        counters: 0x07,
        source: F15H,
    },
    AmdConstraint {
        events: AmdEventMatch::Code(0x046),
        counters: 0x07,
        source: F15H,
    },
    AmdConstraint {
        events: AmdEventMatch::Code(0x054),
        counters: 0x07,
        source: F15H,
    },
    AmdConstraint {
        events: AmdEventMatch::Code(0x055),
        counters: 0x07,
        source: F15H,
    },
    AmdConstraint {
        events: AmdEventMatch::Code(0x02D),
        counters: 0x08,
        source: F15H,
    },
    AmdConstraint {
        events: AmdEventMatch::Code(0x02E),
        counters: 0x09,
        source: F15H,
    },
    AmdConstraint {
        events: AmdEventMatch::CodeUmaskOneBit(0x031),
        counters: 0x07,
        source: F15H,
    },
    AmdConstraint {
        events: AmdEventMatch::Code(0x031),
        counters: 0,
        source: F15H,
    },
    AmdConstraint {
        events: AmdEventMatch::Code(0x1C0),
        counters: 0x38,
        source: F15H,
    },
    // CU / IC / DE exceptions.
    AmdConstraint {
        events: AmdEventMatch::Code(0x08F),
        counters: 0x01,
        source: F15H,
    },
    AmdConstraint {
        events: AmdEventMatch::Code(0x187),
        counters: 0x01,
        source: F15H,
    },
    AmdConstraint {
        events: AmdEventMatch::Code(0x188),
        counters: 0x01,
        source: F15H,
    },
    AmdConstraint {
        events: AmdEventMatch::Codes(0x0DB, 0x0DF),
        counters: 0x3F,
        source: F15H,
    },
    AmdConstraint {
        events: AmdEventMatch::Code(0x1D6),
        counters: 0x3F,
        source: F15H,
    },
    AmdConstraint {
        events: AmdEventMatch::Code(0x1D8),
        counters: 0x3F,
        source: F15H,
    },
    // Unit-type defaults: LS and DC (0x20-0x50) and EX/LS (0xC0) on all
    // six; CU, IC/DE (0x60-0x90) and DE (0xD0) on PERF_CTR2:0; NB events
    // (0xE0, 0xF0) and the unused types belong to no core counter.
    AmdConstraint {
        events: AmdEventMatch::Types(0x20, 0x50),
        counters: 0x3F,
        source: F15H,
    },
    AmdConstraint {
        events: AmdEventMatch::Types(0xC0, 0xC0),
        counters: 0x3F,
        source: F15H,
    },
    AmdConstraint {
        events: AmdEventMatch::Types(0x60, 0x90),
        counters: 0x07,
        source: F15H,
    },
    AmdConstraint {
        events: AmdEventMatch::Types(0xD0, 0xD0),
        counters: 0x07,
        source: F15H,
    },
];

impl AmdEventMatch {
    fn matches(self, code: u16, umask: u8) -> bool {
        match self {
            AmdEventMatch::Code(c) => code == c,
            AmdEventMatch::Codes(lo, hi) => (lo..=hi).contains(&code),
            AmdEventMatch::CodeUmaskBothNibbles(c) => {
                code == c && umask & 0xF0 != 0 && umask & 0x0F != 0
            }
            AmdEventMatch::CodeUmaskMultiBit(c) => code == c && umask.count_ones() > 1,
            AmdEventMatch::CodeUmaskOneBit(c) => code == c && umask.count_ones() <= 1,
            AmdEventMatch::Types(lo, hi) => (lo..=hi).contains(&(code & 0xF0)),
        }
    }
}

/// The counters an AMD core event with select bits `evtsel` (event at
/// \[7:0\] and \[35:32\], unit mask at \[15:8\]) may use on family `family`
/// (bit n = PERF_CTRn): the family 15h table, else all six.
pub fn amd_counters(family: u8, evtsel: u64) -> u32 {
    if family != 0x15 {
        return 0x3F;
    }
    let code = ((evtsel >> 24) & 0xF00 | evtsel & 0xFF) as u16;
    let umask = (evtsel >> 8) as u8;
    AMD_F15H_CONSTRAINTS
        .iter()
        .find(|c| c.events.matches(code, umask))
        .map_or(0, |c| c.counters)
}

impl core::fmt::Display for IntelModel {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        writeln!(f, "{}", self.name)?;
        if let Some(t) = self.core_type {
            writeln!(f, "  hybrid part: the {t:?} cores' PMU")?;
        }
        write!(f, "  models:")?;
        for m in self.models {
            write!(f, " {m:#04x}")?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "  PEBS: format {:?}, baseline {}, GP counters {:#x}, load latency {:?}, mem-loads-aux {}",
            self.pebs_format,
            self.pebs_baseline,
            self.pebs_gp_mask,
            self.ld_lat_event,
            self.mem_loads_aux
        )?;
        for c in self.pebs_constraints {
            match c.codes_to {
                None => writeln!(
                    f,
                    "  PEBS constraint: event {:#06x} on {:#x}",
                    c.event, c.gp_mask
                )?,
                Some(last) => writeln!(
                    f,
                    "  PEBS constraint: event codes {:#04x}-{:#04x} (any umask) on {:#x}",
                    c.event, last, c.gp_mask
                )?,
            }
        }
        for c in self.counter_constraints {
            match c.codes_to {
                None => writeln!(
                    f,
                    "  counter constraint: select {:#06x} (compared bits {:#06x}) on {:#x}",
                    c.event, c.cmask, c.gp_mask
                )?,
                Some(last) => writeln!(
                    f,
                    "  counter constraint: event codes {:#04x}-{:#04x} (any umask) on {:#x}",
                    c.event, last, c.gp_mask
                )?,
            }
        }
        writeln!(
            f,
            "  PEBS errata: {:?}; cycles:p alias {:?}, PMI ack {:?}",
            self.pebs_quirks, self.cycles_alias, self.ack
        )?;
        writeln!(f, "  LBR: {:?}", self.lbr)?;
        writeln!(f, "  PEBS data source: {:?}", self.data_source)?;
        write!(f, "  source: {}", self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_model_is_in_one_row_and_rows_are_consistent() {
        for (i, r) in INTEL_MODELS.iter().enumerate() {
            assert!(!r.source.is_empty(), "{}", r.name);
            for m in r.models {
                let same = || INTEL_MODELS.iter().filter(|o| o.models.contains(m));
                match r.core_type {
                    None => {
                        assert_eq!(same().count(), 1, "model {m:#x}");
                        assert_eq!(intel_row(*m), Some(&INTEL_MODELS[i]));
                    }
                    // A hybrid model: one row per core type, no plain row.
                    Some(t) => {
                        assert!(same().all(|o| o.core_type.is_some()), "model {m:#x}");
                        assert_eq!(
                            same().filter(|o| o.core_type == Some(t)).count(),
                            1,
                            "model {m:#x}"
                        );
                        assert_eq!(
                            intel_row_for_core(*m, true, Some(t)),
                            Some(&INTEL_MODELS[i])
                        );
                    }
                }
            }
            if r.mem_loads_aux {
                assert!(r.ld_lat_event.is_some(), "{}", r.name);
            }
            if let ModelLbr::Legacy(l) = r.lbr {
                assert!(l.depth.is_power_of_two() && l.depth <= 32, "{}", r.name);
                assert!(!l.call_stack || l.select, "{}", r.name);
            }
        }
    }

    #[test]
    fn amd_family_15h_constraints() {
        // Event code bits 11:8 live in EVTSEL[35:32].
        let sel = |code: u64, umask: u64| (code & 0xFF) | (code >> 8) << 32 | umask << 8;
        assert_eq!(amd_counters(0x15, sel(0x076, 0)), 0x07, "cycles: CU");
        assert_eq!(amd_counters(0x15, sel(0x0C0, 0)), 0x3F, "instructions: EX");
        assert_eq!(amd_counters(0x15, sel(0x07D, 0x07)), 0x07);
        assert_eq!(amd_counters(0x15, sel(0x003, 0)), 0x08);
        assert_eq!(amd_counters(0x15, sel(0x000, 0x11)), 0x08);
        assert_eq!(amd_counters(0x15, sel(0x000, 0x01)), 0x38);
        assert_eq!(amd_counters(0x15, sel(0x004, 0x03)), 0x08);
        assert_eq!(amd_counters(0x15, sel(0x004, 0x02)), 0x38);
        assert_eq!(amd_counters(0x15, sel(0x02E, 0)), 0x09);
        assert_eq!(amd_counters(0x15, sel(0x031, 0x01)), 0x07);
        assert_eq!(amd_counters(0x15, sel(0x031, 0x03)), 0);
        assert_eq!(amd_counters(0x15, sel(0x187, 0)), 0x01);
        assert_eq!(amd_counters(0x15, sel(0x1C0, 0)), 0x38);
        assert_eq!(amd_counters(0x15, sel(0x0DD, 0)), 0x3F);
        assert_eq!(amd_counters(0x15, sel(0x0D0, 0)), 0x07);
        assert_eq!(amd_counters(0x15, sel(0x0E0, 0)), 0, "NB");
        assert_eq!(amd_counters(0x15, sel(0x0A0, 0)), 0);
        assert_eq!(amd_counters(0x17, sel(0x076, 0)), 0x3F);
        assert_eq!(amd_counters(0x10, sel(0x0E0, 0)), 0x3F);
    }

    #[test]
    fn counter_constraints_by_model() {
        let row = |m| intel_row(m).unwrap();
        // Core 2: any umask of the code.
        assert_eq!(row(0x17).gp_counters(0x01CB), 0x1);
        assert_eq!(row(0x17).gp_counters(0x8112), 0x2);
        assert_eq!(row(0x0F).gp_counters(0x0010), 0x1);
        assert_eq!(row(0x17).gp_counters(0x00C4), u32::MAX);
        // Nehalem and Westmere have tables of their own.
        assert_eq!(row(0x1E).gp_counters(0x0142), 0x3);
        assert_eq!(row(0x1E).gp_counters(0x0160), u32::MAX);
        assert_eq!(row(0x25).gp_counters(0x0142), u32::MAX);
        assert_eq!(row(0x25).gp_counters(0x01B3), 0x1);
        // Sandy Bridge: the first matching row wins.
        let snb = row(0x2A);
        assert_eq!(snb.gp_counters(0x0548), 0x4);
        assert_eq!(snb.gp_counters(0x02A3), 0x4);
        assert_eq!(snb.gp_counters(0x05A3), 0xF);
        assert_eq!(snb.gp_counters(0x01A3), u32::MAX);
        assert_eq!(snb.gp_counters(0x02CD), 0x8);
        // Ivy Bridge and Haswell: only umask 1 of 0x48.
        assert_eq!(row(0x3A).gp_counters(0x0248), u32::MAX);
        assert_eq!(row(0x3C).gp_counters(0x0148), 0x4);
        assert_eq!(row(0x3C).gp_counters(0x0CA3), 0x4);
        // Broadwell: CYCLE_ACTIVITY with umask bit 3 set.
        let bdw = row(0x3D);
        assert_eq!(bdw.gp_counters(0x0CA3), 0x4);
        assert_eq!(bdw.gp_counters(0x08A3), 0x4);
        assert_eq!(bdw.gp_counters(0x04A3), u32::MAX);
        // Skylake, server Skylake.
        assert_eq!(row(0x5E).gp_counters(0x01C6), 0xF);
        assert_eq!(row(0x55).gp_counters(0x81D0), 0xF);
        assert_eq!(row(0x5E).gp_counters(0x0148), u32::MAX);
        // Ice Lake: 0xa3 on PMC0-3 except three umasks.
        let icl = row(0x7E);
        assert_eq!(icl.gp_counters(0x0148), 0xF);
        assert_eq!(icl.gp_counters(0x08A3), 0xF);
        assert_eq!(icl.gp_counters(0x14A3), 0xFF);
        assert_eq!(icl.gp_counters(0x00C4), u32::MAX);
        // Golden Cove: below 0x90 on PMC0-3 but 0x2e and 0x3c.
        let spr = row(0x8F);
        assert_eq!(spr.gp_counters(0x4F2E), 0xFF);
        assert_eq!(spr.gp_counters(0x003C), 0xFF);
        assert_eq!(spr.gp_counters(u64::from(MEM_LOADS_AUX_EVENT)), 0xF);
        assert_eq!(spr.gp_counters(0x02CD), 0x1);
        assert_eq!(spr.gp_counters(0x01CD), u32::MAX);
        assert_eq!(spr.gp_counters(0x08A4), 0x1);
        let adl_core = intel_row_for_core(0x97, true, Some(CoreType::Core)).unwrap();
        assert_eq!(adl_core.gp_counters(0x0148), 0xF);
        // The Atoms: fixed-counter constraints only.
        for m in [0x1C, 0x37, 0x57, 0x5C, 0x7A, 0x86] {
            assert!(row(m).counter_constraints.is_empty(), "model {m:#x}");
        }
        // PEBS constraints take the place of counter constraints, except
        // for events none names under PEBS baseline.
        assert!(snb.counter_constraint_applies(0x01CD, false, false));
        assert!(!snb.counter_constraint_applies(0x01CD, true, false));
        assert!(spr.counter_constraint_applies(0x0148, true, true));
        assert!(!spr.counter_constraint_applies(0x02CD, true, true));
    }

    #[test]
    fn constraints_and_aliases() {
        let snb = intel_row(0x2A).unwrap();
        assert_eq!(snb.pebs_counters(0x01CD), 0x8);
        assert_eq!(snb.pebs_counters(0x00C0), 0xF);
        let spr = intel_row(0x8F).unwrap();
        assert_eq!(spr.pebs_counters(0x01CD), 0xFE);
        assert_eq!(intel_row(0x37).unwrap().pebs_counters(0x00C4), 0x1);
        assert_eq!(CyclesAlias::Snb.evtsel(2), Some(0x1080_01C2));
        assert_eq!(CyclesAlias::Skl.evtsel(3), Some(0x1080_01C0));
        assert_eq!(CyclesAlias::Core2.evtsel(1), Some(0x1080_00C0));
        assert_eq!(
            intel_row(0x57).unwrap().legacy_lbr().map(|l| l.depth),
            Some(8)
        );
        assert!(!intel_row(0x17).unwrap().legacy_lbr().unwrap().select);
        assert_eq!(row_for(true, 6, 0x01).name, UNKNOWN_MODEL.name);
    }
}
