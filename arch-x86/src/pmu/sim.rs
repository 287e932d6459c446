//! A simulated PMU, written from the Intel SDM vol. 3 (chapters "Performance
//! Monitoring" and "Last Branch Records") and the AMD APM/PPR, not from the
//! drivers. It implements [`Msr`], [`Cpuid`] and [`Lvt`], so the real drivers
//! run against it unchanged, and is driven by a synthetic stream of
//! [`SimStep`]s.
//!
//! Modelled: counter width, wrap and the 32-bit sign-extending PMC write; the
//! full-width IA32_A_PMCx aliases; EVTSEL/FIXED_CTR_CTRL enables and USR/OS
//! filtering; GLOBAL_CTRL/STATUS, OVF_CTRL (v2, v3) and STATUS_RESET/SET (v4+);
//! freeze on PMI, legacy (v1-v3: GLOBAL_CTRL and DEBUGCTL.LBR cleared) and
//! streamlined (v4+: CTR_FRZ / LBR_FRZ status bits); the LVT mask set on each
//! PMI delivery; PEBS records in every fixed format and adaptive groups written
//! into the DS buffer, counter reload from the DS reset slots, the buffer
//! threshold interrupt and collisions; legacy LBR with TOS and INFO, arch LBR
//! with entry 0 newest, call-stack mode; AMD legacy and extended counters,
//! PerfMonV2 global registers and LbrExtV2. It is `no_std` and allocation-free,
//! so `pmu=sim` runs it on the target too.
//!
//! Per model (from the row of [`crate::pmu::models`] for the simulated
//! model number): a general-purpose event counts only on the counters its
//! counter constraint allows (on another it counts nothing; PEBS events
//! follow the PEBS constraints instead); PEBS assists only for events and
//! counters the model
//! allows (0x3C never before PEBS baseline but on the Atoms from Goldmont
//! on; the load-latency event only on
//! its counters and, where the model needs it, while `mem-loads-aux`
//! counts), otherwise the PEBS-enabled counter just overflows
//! ([`SimStats::pebs_no_assist`]); adaptive records carry the
//! PEBS_DATA_CFG groups only for counters with their adaptive bit and with
//! PERF_CAPABILITIES\[14\], else the 32-byte basic group; fixed-counter
//! reset slots at 8 + n on format 4 and 32 + n later; a full buffer drops
//! the record without reloading the counter; MSRs the model lacks
//! (LBR_SELECT on Core 2 and Bonnell, LD_LAT without load latency,
//! PEBS_DATA_CFG without baseline, LBR entries past the depth) and reserved
//! bits (EVTSEL\[34\], FIXED_CTR_CTRL\[32+4n\], LBR_SELECT\[9\]) count as
//! #GP ([`SimStats::gp_faults`]). Test hooks model races the real hardware
//! has: [`SimPmu::set_pebs_status_race`] and
//! [`SimPmu::overflow_during_handler`].

use crate::cpuid::{CpuIdResult, Cpuid, regs};
use crate::msr::{Msr, addr, debugctl};
use crate::pmu::Lvt;
use crate::pmu::ds::{DsArea, DsMemory};
use crate::pmu::models::{self, CoreType, CyclesAlias, IntelModel, ModelLbr, PmiAck};

/// LBR model of a simulated Intel CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimLbr {
    /// No LBR.
    None,
    /// Model-specific LBR.
    Legacy {
        /// PERF_CAPABILITIES\[5:0\].
        format: u8,
        /// Entries.
        depth: u8,
        /// FROM_IP entry 0.
        from: u32,
        /// TO_IP entry 0.
        to: u32,
    },
    /// Architectural LBR with this maximum depth (multiple of 8).
    Arch {
        /// Maximum depth.
        depth: u8,
    },
}

/// Which CPU is simulated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimCpu {
    /// An Intel CPU with architectural perfmon.
    Intel {
        /// Family 6 model number reported by CPUID.
        model: u8,
        /// Stepping reported by CPUID.
        stepping: u8,
        /// A CPU of a hybrid part with this core type (CPUID.07H.0:EDX\[15\]
        /// and leaf 1AH); `None`: not hybrid.
        hybrid: Option<CoreType>,
        /// Perfmon version (1-5).
        version: u8,
        /// General-purpose counters.
        gp: u8,
        /// Fixed counters (v2+).
        fixed: u8,
        /// GP counter width.
        gp_width: u8,
        /// Fixed counter width.
        fixed_width: u8,
        /// PEBS record format, or `None` for no PEBS.
        pebs_format: Option<u8>,
        /// PEBS baseline (PERF_CAPABILITIES\[14\]): adaptive groups, PEBS
        /// on every event and on fixed counters. Without it a format 4+
        /// part writes 32-byte basic records only.
        pebs_baseline: bool,
        /// Trap-like PEBS assists (PERF_CAPABILITIES\[6\]): the record's IP
        /// is the instruction after the eventing one. Without it the assist
        /// is fault-like and the record's IP is the eventing instruction.
        pebs_trap: bool,
        /// Full-width counter writes (PERF_CAPABILITIES\[13\]).
        full_width: bool,
        /// Meminfo latency split into instruction and cache latency.
        split_latency: bool,
        /// LBR.
        lbr: SimLbr,
    },
    /// An AMD CPU.
    Amd {
        /// Display family reported by CPUID: 0x10 (legacy counters only),
        /// 0x15 (Bulldozer class: six counters with per-event counter
        /// constraints), 0x19 (Zen 4).
        family: u8,
        /// Extended six-counter set (PerfCtrExtCore).
        ext: bool,
        /// PerfMonV2.
        v2: bool,
        /// LbrExtV2 depth, 0 for none.
        lbr_depth: u8,
    },
    /// A CPU without any PMU (what QEMU TCG presents).
    NoPmu,
}

impl SimCpu {
    /// A Skylake-like client: v4, 4 GP + 3 fixed, 48-bit, PEBS format 3, LBR format 5 x 32.
    pub const fn skylake() -> Self {
        SimCpu::Intel {
            model: 0x5E,
            stepping: 10,
            hybrid: None,
            version: 4,
            gp: 4,
            fixed: 3,
            gp_width: 48,
            fixed_width: 48,
            pebs_format: Some(3),
            pebs_baseline: false,
            pebs_trap: true,
            full_width: true,
            split_latency: false,
            lbr: SimLbr::Legacy {
                format: 5,
                depth: 32,
                from: 0x680,
                to: 0x6C0,
            },
        }
    }

    /// An Ice-Lake-like client: v5, 8 GP + 4 fixed, 48-bit, adaptive PEBS
    /// format 4 with baseline, legacy LBR format 5 (LBR_INFO) x 32.
    pub const fn ice_lake() -> Self {
        SimCpu::Intel {
            model: 0x7E,
            stepping: 10,
            hybrid: None,
            version: 5,
            gp: 8,
            fixed: 4,
            gp_width: 48,
            fixed_width: 48,
            pebs_format: Some(4),
            pebs_baseline: true,
            pebs_trap: true,
            full_width: true,
            split_latency: false,
            lbr: SimLbr::Legacy {
                format: 5,
                depth: 32,
                from: 0x680,
                to: 0x6C0,
            },
        }
    }

    /// A Sapphire-Rapids-like server: v5, 8 GP + 4 fixed, adaptive PEBS format 5, arch LBR x 32.
    pub const fn sapphire_rapids() -> Self {
        SimCpu::Intel {
            model: 0x8F,
            stepping: 10,
            hybrid: None,
            version: 5,
            gp: 8,
            fixed: 4,
            gp_width: 48,
            fixed_width: 48,
            pebs_format: Some(5),
            pebs_baseline: true,
            pebs_trap: true,
            full_width: true,
            split_latency: true,
            lbr: SimLbr::Arch { depth: 32 },
        }
    }

    /// The typical CPU of a model-table row (its first model number).
    pub fn from_row(row: &IntelModel) -> Self {
        let lbr = match row.lbr {
            ModelLbr::None => SimLbr::None,
            ModelLbr::Legacy(l) => SimLbr::Legacy {
                format: l.format,
                depth: l.depth,
                from: l.from,
                to: l.to,
            },
            ModelLbr::Arch(depth) => SimLbr::Arch { depth },
        };
        SimCpu::Intel {
            model: row.models.first().copied().unwrap_or(0),
            stepping: 10,
            hybrid: row.core_type,
            version: row.version,
            gp: row.gp,
            fixed: row.fixed,
            gp_width: if row.version >= 2 { 48 } else { 40 },
            fixed_width: 48,
            pebs_format: row.pebs_format,
            pebs_baseline: row.pebs_baseline,
            pebs_trap: true,
            full_width: row.version >= 4,
            split_latency: row.pebs_format.is_some_and(|f| f >= 5),
            lbr,
        }
    }

    /// The same CPU reporting display model `model` (Intel; any other
    /// CPU is returned as it is).
    pub const fn with_model(mut self, model: u8) -> Self {
        if let SimCpu::Intel { model: m, .. } = &mut self {
            *m = model;
        }
        self
    }

    /// A Zen 4-like AMD CPU: 6 counters, PerfMonV2, LbrExtV2 x 16.
    pub const fn zen4() -> Self {
        SimCpu::Amd {
            family: 0x19,
            ext: true,
            v2: true,
            lbr_depth: 16,
        }
    }
}

/// Kind of a simulated branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BranchKind {
    /// Conditional jump.
    Cond,
    /// Direct jump.
    Jmp,
    /// Indirect jump.
    IndJmp,
    /// Direct call.
    Call,
    /// Indirect call.
    IndCall,
    /// Near return.
    Ret,
    /// Far transfer, interrupt, syscall.
    Far,
}

/// A branch taken during a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimBranch {
    /// Source.
    pub from: u64,
    /// Target.
    pub to: u64,
    /// Mispredicted.
    pub mispred: bool,
    /// Kind.
    pub kind: BranchKind,
}

/// A memory access during a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimMem {
    /// Data linear address.
    pub addr: u64,
    /// Latency in cycles (loads).
    pub latency: u16,
    /// Intel data-source encoding.
    pub dse: u8,
    /// A store rather than a load.
    pub store: bool,
}

/// Register values at a step, in SDM PEBS (fixed-format) order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimRegs {
    /// RFLAGS.
    pub flags: u64,
    /// RAX, RBX, RCX, RDX, RSI, RDI, RBP, RSP, R8..R15.
    pub gprs: [u64; 16],
}

/// One step of the synthetic event stream: `instructions` retire, the last
/// one at `ip` (execution continues at `next_ip`), taking `cycles` cycles,
/// optionally with a branch and a memory access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimStep {
    /// Address of the last instruction retired.
    pub ip: u64,
    /// Address of the following instruction.
    pub next_ip: u64,
    /// Executing in user mode.
    pub user: bool,
    /// Registers after the step.
    pub regs: SimRegs,
    /// Instructions retired.
    pub instructions: u64,
    /// Core cycles taken.
    pub cycles: u64,
    /// A branch retired in the step.
    pub branch: Option<SimBranch>,
    /// A memory access retired in the step.
    pub mem: Option<SimMem>,
}

impl SimStep {
    /// A plain step of `n` instructions at `ip` (one cycle each).
    pub fn plain(ip: u64, n: u64) -> Self {
        SimStep {
            ip,
            next_ip: ip + 4,
            user: true,
            regs: SimRegs::default(),
            instructions: n,
            cycles: n,
            branch: None,
            mem: None,
        }
    }
}

/// Counters of things the simulated hardware saw that a correct driver never
/// causes, plus delivery statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStats {
    /// PMIs delivered as NMIs.
    pub pmis_delivered: u64,
    /// PMIs dropped because the LVT entry was masked (driver did not re-arm).
    pub pmis_masked: u64,
    /// PEBS records written.
    pub pebs_records: u64,
    /// PEBS records dropped because the buffer was full.
    pub pebs_dropped: u64,
    /// Writes to read-only or unimplemented MSRs (a #GP on hardware).
    pub bad_msr_writes: u64,
    /// Reads of unimplemented MSRs (a #GP on hardware).
    pub bad_msr_reads: u64,
    /// DS area or PEBS buffer address not matching the memory supplied.
    pub ds_faults: u64,
    /// Overflows of PEBS-enabled counters that wrote no record because
    /// the event or counter cannot take PEBS on this model (no assist).
    pub pebs_no_assist: u64,
    /// Counter resets of errata AAK100/AAP53/BD53 seen: the magic events
    /// on PMC0-3 enabled together through GLOBAL_CTRL (Nehalem and
    /// Westmere rows only).
    pub nhm_resets: u64,
    /// LVT entries unmasked during a PMI before the counters were
    /// re-enabled, on a model that needs the late ack (spurious PMIs on
    /// real parts).
    pub early_lvt_unmasks: u64,
    /// Counters enabled with a period below the model's minimum for their
    /// event (unsafe on real parts).
    pub short_periods: u64,
    /// Late NMIs delivered (AMD, [`SimPmu::set_amd_late_nmis`]).
    pub late_nmis: u64,
}

impl SimStats {
    /// Accesses that raise #GP on the real part (must stay 0).
    pub fn gp_faults(&self) -> u64 {
        self.bad_msr_reads + self.bad_msr_writes
    }
}

const MAX_GP: usize = 8;
const MAX_FIXED: usize = 4;
const MAX_LBR: usize = 32;

const STATUS_OVF_BUF: u64 = 1 << 62;
const STATUS_CTR_FRZ: u64 = 1 << 59;
const STATUS_LBR_FRZ: u64 = 1 << 58;

const EVTSEL_USR: u64 = 1 << 16;
const EVTSEL_OS: u64 = 1 << 17;
const EVTSEL_INT: u64 = 1 << 20;
const EVTSEL_EN: u64 = 1 << 22;

#[derive(Debug, Clone, Copy, Default)]
struct LbrSlot {
    from: u64,
    to: u64,
    info: u64,
}

/// The simulated PMU and local APIC LVT entry of one CPU.
#[derive(Debug)]
pub struct SimPmu {
    cpu: SimCpu,
    evtsel: [u64; MAX_GP],
    pmc: [u64; MAX_GP],
    fixed: [u64; MAX_FIXED],
    fixed_ctrl: u64,
    global_ctrl: u64,
    global_status: u64,
    debugctl: u64,
    pebs_enable: u64,
    pebs_data_cfg: u64,
    ld_lat: u64,
    ds_area: u64,
    lbr_select: u64,
    lbr_ctl: u64,
    lbr_depth: u64,
    amd_ext_cfg: u64,
    lbr: [LbrSlot; MAX_LBR],
    tos: u64,
    cycles_since_branch: u64,
    lvt: u32,
    tsc: u64,
    pmi_pending: bool,
    in_pmi: bool,
    /// Counters (GLOBAL_CTRL layout) loaded since they were last enabled.
    loaded: u64,
    status_race: bool,
    handler_overflow: u64,
    amd_late_nmis: bool,
    late_nmis: u32,
    /// Statistics.
    pub stats: SimStats,
}

fn width_mask(w: u8) -> u64 {
    if w >= 64 { u64::MAX } else { (1u64 << w) - 1 }
}

impl SimPmu {
    /// A simulated CPU in its reset state (LVT masked, everything disabled).
    pub fn new(cpu: SimCpu) -> Self {
        SimPmu {
            cpu,
            evtsel: [0; MAX_GP],
            pmc: [0; MAX_GP],
            fixed: [0; MAX_FIXED],
            fixed_ctrl: 0,
            global_ctrl: 0,
            global_status: 0,
            debugctl: 0,
            pebs_enable: 0,
            pebs_data_cfg: 0,
            ld_lat: 0,
            ds_area: 0,
            lbr_select: 0,
            lbr_ctl: 0,
            lbr_depth: 0,
            amd_ext_cfg: 0,
            lbr: [LbrSlot::default(); MAX_LBR],
            tos: 0,
            cycles_since_branch: 0,
            lvt: crate::pmu::LVT_MASKED,
            tsc: 0,
            pmi_pending: false,
            in_pmi: false,
            loaded: 0,
            status_race: false,
            handler_overflow: 0,
            amd_late_nmis: false,
            late_nmis: 0,
            stats: SimStats::default(),
        }
    }

    /// The simulated CPU.
    pub fn cpu(&self) -> SimCpu {
        self.cpu
    }

    /// Current TSC (advanced by each step's cycles).
    pub fn tsc(&self) -> u64 {
        self.tsc
    }

    /// A PMI was delivered and not yet taken with [`SimPmu::take_pmi`].
    pub fn pmi_pending(&self) -> bool {
        self.pmi_pending
    }

    /// Take the pending PMI (the NMI handler is about to run).
    pub fn take_pmi(&mut self) -> bool {
        core::mem::replace(&mut self.pmi_pending, false)
    }

    /// The LVT performance-counter entry as last written (or masked by delivery).
    pub fn lvt(&self) -> u32 {
        self.lvt
    }

    /// Formats 1 and 2: PEBS records race with the clearing of
    /// GLOBAL_STATUS and carry a status field of 0 (while `on`).
    pub fn set_pebs_status_race(&mut self, on: bool) {
        self.status_race = on;
    }

    /// AMD: each overflow raises its own NMI (while `on`). When several
    /// counters overflow together, the handler of the first NMI handles
    /// them all; each further NMI arrives once the handler has unmasked the
    /// LVT entry again and finds no overflow (a late NMI).
    pub fn set_amd_late_nmis(&mut self, on: bool) {
        self.amd_late_nmis = on;
    }

    /// Overflows that land while the PMI handler runs: right after the
    /// handler's next write to IA32_PERF_GLOBAL_OVF_CTRL / STATUS_RESET
    /// (its acknowledge), the counters in `bits` (GLOBAL_STATUS layout)
    /// wrap to 0, set their status bits and request a PMI (which the LVT
    /// entry drops while it is still masked).
    pub fn overflow_during_handler(&mut self, bits: u64) {
        self.handler_overflow |= bits;
    }

    /// The model-table row of the simulated Intel CPU.
    pub fn row(&self) -> &'static IntelModel {
        match self.cpu {
            SimCpu::Intel { model, hybrid, .. } => {
                models::row_for_core(true, 6, model, hybrid.is_some(), hybrid)
            }
            _ => &models::UNKNOWN_MODEL,
        }
    }

    fn pebs_baseline(&self) -> bool {
        matches!(
            self.cpu,
            SimCpu::Intel {
                pebs_format: Some(4..),
                pebs_baseline: true,
                ..
            }
        )
    }

    /// Whether an overflow of GP counter `i` with PEBS enabled makes a PEBS
    /// assist on this model: the counter and event must be PEBS-capable
    /// (model constraints; 0x3C never is before PEBS baseline; format 0
    /// only on PMC0), and a `mem_loads_aux` model's load-latency event only
    /// assists while the auxiliary event counts.
    fn gp_assists(&self, i: usize) -> bool {
        let Some(format) = self.pebs_format() else {
            return false;
        };
        let sel = self.evtsel[i];
        let row = self.row();
        if format == 0 && i != 0 {
            return false;
        }
        if row.pebs_counters(sel) & (1 << i) == 0 {
            return false;
        }
        if !self.pebs_baseline() && sel & 0xFF == 0x3C && row.cycles_alias != CyclesAlias::Direct {
            return false;
        }
        // Load latency below perfmon version 5 needs its LL_EN_PMCn bit,
        // a precise store its PS_ENABLE bit (SDM "PEBS Enable").
        if row.ld_lat_event == Some(sel as u16)
            && self.version() < 5
            && self.pebs_enable & (1 << (32 + i)) == 0
        {
            return false;
        }
        if row.store_kind() == sampler::pebs::MemKind::Store
            && sel & 0xFFFF == u64::from(models::PRECISE_STORE_EVENT)
            && self.pebs_enable & (1 << 63) == 0
        {
            return false;
        }
        if row.mem_loads_aux && row.ld_lat_event == Some(sel as u16) {
            return (0..self.n_gp()).any(|k| {
                self.evtsel[k] & 0xFFFF == u64::from(models::MEM_LOADS_AUX_EVENT)
                    && self.evtsel[k] & EVTSEL_EN != 0
                    && self.global_ctrl & (1 << k) != 0
            });
        }
        true
    }

    fn has_ld_lat(&self) -> bool {
        self.pebs_format().is_some() && self.row().ld_lat_event.is_some()
    }

    fn has_lbr_select(&self) -> bool {
        matches!(
            self.cpu,
            SimCpu::Intel {
                lbr: SimLbr::Legacy { .. },
                ..
            }
        ) && self.row().legacy_lbr().is_some_and(|l| l.select)
    }

    fn intel(&self) -> Option<(u8, u8, u8, u8, u8)> {
        match self.cpu {
            SimCpu::Intel {
                version,
                gp,
                fixed,
                gp_width,
                fixed_width,
                ..
            } => Some((version, gp, fixed, gp_width, fixed_width)),
            _ => None,
        }
    }

    fn version(&self) -> u8 {
        self.intel().map_or(0, |i| i.0)
    }

    fn n_gp(&self) -> usize {
        match self.cpu {
            SimCpu::Intel { gp, .. } => usize::from(gp),
            // The extended counters exist only with PerfCtrExtCore (a
            // hypervisor may report PerfMonV2 without it).
            SimCpu::Amd { ext, .. } => {
                if ext {
                    6
                } else {
                    4
                }
            }
            SimCpu::NoPmu => 0,
        }
    }

    fn gp_width(&self) -> u8 {
        match self.cpu {
            SimCpu::Intel { gp_width, .. } => gp_width,
            SimCpu::Amd { .. } => 48,
            SimCpu::NoPmu => 0,
        }
    }

    fn n_fixed(&self) -> usize {
        match self.cpu {
            SimCpu::Intel { version, fixed, .. } if version >= 2 => usize::from(fixed),
            _ => 0,
        }
    }

    fn pebs_format(&self) -> Option<u8> {
        match self.cpu {
            SimCpu::Intel { pebs_format, .. } => pebs_format,
            _ => None,
        }
    }

    fn perf_capabilities(&self) -> u64 {
        match self.cpu {
            SimCpu::Intel {
                pebs_format,
                pebs_baseline,
                pebs_trap,
                full_width,
                lbr,
                ..
            } => {
                let lbr_fmt = match lbr {
                    SimLbr::Legacy { format, .. } => u64::from(format),
                    SimLbr::Arch { .. } => 0x3F,
                    SimLbr::None => 0,
                };
                let mut c = lbr_fmt;
                if let Some(f) = pebs_format {
                    c |= 1 << 7 | (u64::from(f) & 0xF) << 8;
                    if pebs_trap {
                        c |= 1 << 6;
                    }
                    if f >= 4 && pebs_baseline {
                        c |= 1 << 14;
                    }
                }
                if full_width {
                    c |= 1 << 13;
                }
                c
            }
            _ => 0,
        }
    }

    fn frozen(&self) -> bool {
        self.global_status & STATUS_CTR_FRZ != 0
    }

    fn gp_enabled(&self, i: usize, user: bool) -> bool {
        let sel = self.evtsel[i];
        if sel & EVTSEL_EN == 0 {
            return false;
        }
        let mode_ok = if user {
            sel & EVTSEL_USR != 0
        } else {
            sel & EVTSEL_OS != 0
        };
        let global_ok = match self.cpu {
            SimCpu::Intel { version, .. } => version < 2 || self.global_ctrl & (1 << i) != 0,
            SimCpu::Amd { v2, ext, .. } => !(v2 && ext) || self.global_ctrl & (1 << i) != 0,
            SimCpu::NoPmu => false,
        };
        mode_ok && global_ok && !self.frozen()
    }

    fn fixed_enabled(&self, i: usize, user: bool) -> bool {
        let f = (self.fixed_ctrl >> (4 * i)) & 0xF;
        let mode_ok = if user { f & 2 != 0 } else { f & 1 != 0 };
        mode_ok && self.global_ctrl & (1 << (32 + i)) != 0 && !self.frozen()
    }

    /// Whether counter `i` can count its event: only the counters of the
    /// event's constraint in the model table do (AMD family 15h, the Intel
    /// rows' `counter_constraints` where they apply); on any other the
    /// event counts nothing.
    fn counts_on(&self, i: usize) -> bool {
        match self.cpu {
            SimCpu::Amd { family, .. } => {
                models::amd_counters(family, self.evtsel[i]) & (1 << i) != 0
            }
            SimCpu::Intel { .. } => {
                // PEBS events follow the PEBS constraints (gp_assists).
                let sel = self.evtsel[i];
                let pebs = self.pebs_enable & (1 << i) != 0 && self.pebs_format().is_some();
                !self
                    .row()
                    .counter_constraint_applies(sel, pebs, self.pebs_baseline())
                    || self.row().gp_counters(sel) & (1 << i) != 0
            }
            SimCpu::NoPmu => true,
        }
    }

    /// How many events a GP event-select counts in `s` (the events the
    /// simulator knows; any other code counts nothing).
    fn gp_increment(&self, sel: u64, s: &SimStep) -> u64 {
        // AMD keeps event bits 11:8 in EVTSEL[35:32]; on Intel bit 34 is
        // the adaptive-PEBS bit.
        let event = match self.cpu {
            SimCpu::Amd { .. } => (sel & 0xFF) | ((sel >> 24) & 0xF00),
            _ => sel & 0xFF,
        };
        let umask = (sel >> 8) & 0xFF;
        // inv with cmask=16: "fewer than 16 retired this cycle", i.e. every
        // cycle (the `cycles:p` aliases).
        let every_cycle = sel & (1 << 23) != 0 && (sel >> 24) & 0xFF == 16;
        let branch = u64::from(s.branch.is_some());
        let mispred = u64::from(s.branch.is_some_and(|b| b.mispred));
        let load = s.mem.filter(|m| !m.store);
        let store = u64::from(s.mem.is_some_and(|m| m.store));
        let l1_miss = load.is_some_and(|m| m.dse & 0xF != 1);
        match self.cpu {
            SimCpu::Amd { family, .. } => {
                let zen = family >= 0x17;
                let beyond_l1 = u64::from(load.is_some_and(|m| m.dse & 0xF != 1));
                let beyond_l2 =
                    u64::from(load.is_some_and(|m| (m.dse & 0xF) >= 4 || m.dse & 0xF == 0));
                match (event, umask) {
                    (0x76, _) => s.cycles,
                    (0xC0, _) => s.instructions,
                    (0xC2, _) => branch,
                    (0xC3, _) => mispred,
                    // Family 10h: refills from L2 (0x7D) / from the system (0x7E).
                    (0x7D, 0x07) if !zen => beyond_l1,
                    (0x7E, 0x07) if !zen => beyond_l2,
                    // Zen: L2 accesses (0x60) / L2 misses (0x64).
                    (0x60, 0xFF) if zen => beyond_l1,
                    (0x64, 0x09) if zen => beyond_l2,
                    _ => 0,
                }
            }
            _ => match (event, umask) {
                (0xC0, 0x00 | 0x01) | (0xC2, 0x01) if every_cycle => s.cycles,
                (0x3C, 0x00) | (0x3C, 0x01) => s.cycles,
                (0xC0, 0x00 | 0x01) | (0xC2, 0x01) => s.instructions,
                // MEM_LOADS_AUX: counts loads.
                (0x03, 0x82) => u64::from(load.is_some()),
                // Nehalem load latency (MEM_INST_RETIRED.LATENCY_ABOVE_THRESHOLD).
                (0x0B, 0x10) if self.row().ld_lat_event == Some(0x100B) => {
                    u64::from(load.is_some_and(|m| u64::from(m.latency) >= self.ld_lat.max(3)))
                }
                (0xC4, 0x00) => branch,
                (0xC5, 0x00) => mispred,
                // Core 2 MEM_LOAD_RETIRED.L1D_MISS (PMC0 only).
                (0xCB, 0x01)
                    if matches!(self.row().cycles_alias, CyclesAlias::Core2)
                        && self.row().ld_lat_event.is_none() =>
                {
                    u64::from(l1_miss)
                }
                // Nehalem / Westmere L1D_CACHE_LD.MESI: every load (PMC0-1).
                (0x40, 0x0F) if self.row().ld_lat_event == Some(0x100B) => {
                    u64::from(load.is_some())
                }
                // L1D_PEND_MISS.PENDING from Sandy Bridge on: the cycles L1D
                // misses are outstanding, each load's latency (PMC2 only
                // before Ice Lake).
                (0x48, 0x01) if self.row().ld_lat_event == Some(0x01CD) => {
                    load.filter(|_| l1_miss).map_or(0, |m| u64::from(m.latency))
                }
                // LLC reference: a load not served by L1, LFB or L2.
                (0x2E, 0x4F) => {
                    u64::from(load.is_some_and(|m| (m.dse & 0xF) >= 4 || m.dse & 0xF == 0))
                }
                // LLC miss: a load served by DRAM, a remote cache or unknown L3 miss.
                (0x2E, 0x41) => u64::from(load.is_some_and(|m| matches!(m.dse & 0xF, 0 | 8..=0xD))),
                // Gracemont load latency (MEM_UOPS_RETIRED.LOAD_LATENCY).
                (0xD0, 0x05) if self.row().ld_lat_event == Some(0x05D0) => {
                    u64::from(load.is_some_and(|m| u64::from(m.latency) >= self.ld_lat.max(3)))
                }
                // Load latency: loads at or above the threshold.
                (0xCD, 0x01) if self.row().ld_lat_event.is_none_or(|e| e == 0x01CD) => {
                    u64::from(load.is_some_and(|m| u64::from(m.latency) >= self.ld_lat.max(3)))
                }
                (0xD0, 0x82) => store,
                // MEM_TRANS_RETIRED.PRECISE_STORE (Sandy Bridge, Ivy Bridge)
                // and the store-latency event of Golden Cove.
                (0xCD, 0x02) if self.row().st_event == Some(models::PRECISE_STORE_EVENT) => store,
                _ => 0,
            },
        }
    }

    /// Run one step. Returns true when a PMI is pending afterwards.
    pub fn advance(&mut self, mem: Option<&mut DsMemory<'_>>, s: &SimStep) -> bool {
        self.tsc = self.tsc.wrapping_add(s.cycles);
        self.cycles_since_branch += s.cycles;
        let mut overflow_pmi = false;
        let mut interrupts = 0u32;
        let mut pebs_hits = 0u64; // PEBS_ENABLE-style bits of PEBS counters that overflowed
        let gp_mask = width_mask(self.gp_width());
        for i in 0..self.n_gp() {
            if !self.gp_enabled(i, s.user) {
                continue;
            }
            let inc = self.gp_increment(self.evtsel[i], s);
            if inc == 0 || !self.counts_on(i) {
                continue;
            }
            let sum = self.pmc[i] + inc;
            self.pmc[i] = sum & gp_mask;
            if sum > gp_mask {
                let pebs_on = self.pebs_enable & (1 << i) != 0 && self.pebs_format().is_some();
                if pebs_on && self.gp_assists(i) {
                    pebs_hits |= 1 << i;
                } else {
                    if pebs_on {
                        self.stats.pebs_no_assist += 1;
                    }
                    let int = self.evtsel[i] & EVTSEL_INT != 0;
                    interrupts += u32::from(int);
                    self.counter_overflow(1 << i, int, &mut overflow_pmi);
                }
            }
        }
        if let Some((_, _, _, _, fw)) = self.intel() {
            let fmask = width_mask(fw);
            for i in 0..self.n_fixed() {
                if !self.fixed_enabled(i, s.user) {
                    continue;
                }
                let inc = match i {
                    0 => s.instructions,
                    1 | 2 => s.cycles,
                    _ => 4 * s.cycles,
                };
                let sum = self.fixed[i] + inc;
                self.fixed[i] = sum & fmask;
                if sum > fmask {
                    let bit = 1u64 << (32 + i);
                    if self.pebs_baseline() && self.pebs_enable & bit != 0 {
                        pebs_hits |= bit;
                    } else {
                        let int = (self.fixed_ctrl >> (4 * i + 3)) & 1 != 0;
                        self.counter_overflow(bit, int, &mut overflow_pmi);
                    }
                }
            }
        }
        if pebs_hits != 0 {
            self.pebs_assist(mem, s, pebs_hits, &mut overflow_pmi);
        }
        if let Some(b) = s.branch {
            self.record_branch(&b, s.user);
        }
        if overflow_pmi {
            self.raise_pmi();
            if self.amd_late_nmis && matches!(self.cpu, SimCpu::Amd { .. }) && self.pmi_pending {
                self.late_nmis += interrupts.saturating_sub(1);
            }
        }
        self.pmi_pending
    }

    fn counter_overflow(&mut self, bit: u64, interrupt: bool, pmi: &mut bool) {
        match self.cpu {
            SimCpu::Intel { version, .. } if version >= 2 => self.global_status |= bit,
            SimCpu::Amd {
                v2: true,
                ext: true,
                ..
            } => self.global_status |= bit,
            _ => {}
        }
        if interrupt {
            *pmi = true;
        }
    }

    /// Request a PMI: apply freeze-on-PMI, then deliver through the LVT.
    fn raise_pmi(&mut self) {
        let v = self.version();
        if self.debugctl & debugctl::FREEZE_PERFMON_ON_PMI != 0 && v >= 2 {
            if v >= 4 {
                self.global_status |= STATUS_CTR_FRZ;
            } else {
                self.global_ctrl = 0;
            }
        }
        let arch_lbr = matches!(
            self.cpu,
            SimCpu::Intel {
                lbr: SimLbr::Arch { .. },
                ..
            }
        );
        // Steppings whose LBR cannot freeze (model table) record on.
        let lbr_broken = match self.cpu {
            SimCpu::Intel {
                model, stepping, ..
            } => self.row().lbr_broken(model, stepping),
            _ => false,
        };
        if self.debugctl & debugctl::FREEZE_LBRS_ON_PMI != 0 && !lbr_broken {
            if v >= 4 || arch_lbr || matches!(self.cpu, SimCpu::Amd { .. }) {
                self.global_status |= STATUS_LBR_FRZ;
            } else {
                self.debugctl &= !debugctl::LBR;
            }
        }
        if self.lvt & crate::pmu::LVT_MASKED != 0 || self.lvt & 0x700 != crate::pmu::LVT_PMI_NMI {
            self.stats.pmis_masked += 1;
            return;
        }
        self.lvt |= crate::pmu::LVT_MASKED;
        self.pmi_pending = true;
        self.in_pmi = true;
        self.stats.pmis_delivered += 1;
    }

    /// The DS reset value of the counter at GLOBAL_STATUS `bit`: GP
    /// counter n at slot n; fixed counter n at slot 8 + n on format 4
    /// (MAX_PEBS_EVENTS_FMT4 general-purpose slots) and 32 + n from format
    /// 5 on (SDM "PEBS Buffer and Counter Reset" per format).
    fn reset_value(&self, area: &DsArea, bit: u64) -> u64 {
        let idx = bit.trailing_zeros() as usize;
        let slot = match (idx, self.pebs_format()) {
            (0..32, _) => idx,
            (_, Some(4)) => 8 + idx - 32,
            _ => 32 + idx - 32,
        };
        area.pebs_reset.get(slot).map_or(0, DsArea::get)
    }

    /// Write one PEBS record for the counters in `hits` (SDM "PEBS Record
    /// Format" tables; adaptive: "PEBS Data Configuration"), reload them from
    /// the DS reset slots and raise the threshold interrupt.
    fn pebs_assist(
        &mut self,
        mem: Option<&mut DsMemory<'_>>,
        s: &SimStep,
        hits: u64,
        pmi: &mut bool,
    ) {
        let Some(format) = self.pebs_format() else {
            return;
        };
        let Some(mem) = mem else {
            self.stats.ds_faults += 1;
            return;
        };
        if self.ds_area != mem.area_addr() {
            self.stats.ds_faults += 1;
            return;
        }
        let area = mem.area;
        let base = DsArea::get(&area.pebs_base);
        if base != mem.pebs_addr() {
            self.stats.ds_faults += 1;
            return;
        }
        let mut rec = [0u8; 2048];
        let len = self.build_record(format, s, hits, &mut rec);
        let index = DsArea::get(&area.pebs_index);
        let max = DsArea::get(&area.pebs_max).min(base + mem.pebs.len() as u64);
        if index < base || index + len as u64 > max {
            // Buffer full: no record and no reload; the counters wrap and
            // show their overflow in GLOBAL_STATUS (INT is clear, so no PMI).
            self.stats.pebs_dropped += 1;
            let mut ignored = false;
            self.counter_overflow(hits, false, &mut ignored);
            return;
        } else {
            // Core 2 erratum: PEBS records beyond the first page of the
            // buffer are not written reliably.
            if self.row().pebs_quirks.one_page && (index + len as u64 - 1) / 4096 != base / 4096 {
                self.stats.ds_faults += 1;
            }
            let off = (index - base) as usize;
            mem.pebs[off..off + len].copy_from_slice(&rec[..len]);
            area.pebs_index
                .store(index + len as u64, core::sync::atomic::Ordering::Release);
            self.stats.pebs_records += 1;
        }
        // Reload each counter that produced the record.
        let mut h = hits;
        while h != 0 {
            let bit = h & h.wrapping_neg();
            h &= h - 1;
            let v = self.reset_value(area, bit);
            let idx = bit.trailing_zeros() as usize;
            if idx >= 32 {
                let fw = self.intel().map_or(48, |i| i.4);
                self.fixed[idx - 32] = v & width_mask(fw);
            } else {
                self.pmc[idx] = v & width_mask(self.gp_width());
            }
        }
        let thr = DsArea::get(&area.pebs_threshold);
        if DsArea::get(&area.pebs_index) >= thr {
            self.global_status |= STATUS_OVF_BUF;
            *pmi = true;
        }
    }

    fn build_record(&self, format: u8, s: &SimStep, hits: u64, out: &mut [u8]) -> usize {
        let mut n = 0usize;
        let mut put = |v: u64, out: &mut [u8]| {
            out[n..n + 8].copy_from_slice(&v.to_le_bytes());
            n += 8;
        };
        let r = &s.regs;
        let (dla, dse, lat) = match s.mem {
            Some(m) => (m.addr, u64::from(m.dse), u64::from(m.latency)),
            None => (0, 0, 0),
        };
        if format < 4 {
            // FLAGS, IP (trap-like: the next instruction; fault-like: the
            // eventing one), AX, BX, CX, DX, SI, DI, BP, SP, R8-R15.
            let trap = matches!(
                self.cpu,
                SimCpu::Intel {
                    pebs_trap: true,
                    ..
                }
            );
            put(r.flags, out);
            put(if trap { s.next_ip } else { s.ip }, out);
            for g in r.gprs {
                put(g, out);
            }
            if format >= 1 {
                // IA32_PERF_GLOBAL_STATUS: applicable counters (0 when the
                // record raced with the clearing of the status on formats 1-2).
                let status = if self.status_race && format <= 2 {
                    0
                } else {
                    hits
                };
                put(status, out);
                put(dla, out);
                put(dse, out);
                put(lat, out);
            }
            if format >= 2 {
                put(s.ip, out); // eventing IP
                put(0, out); // TSX tuning
            }
            if format >= 3 {
                put(self.tsc, out);
            }
            return n;
        }
        // Groups beyond the basic one only with PEBS baseline, and only for
        // counters whose adaptive bit is set (EVTSEL[34]; FIXED_CTR_CTRL
        // bit 32 + 4n): without it the record is the 32-byte basic group.
        let adaptive_bits = (0..MAX_GP)
            .all(|i| hits & (1 << i) == 0 || self.evtsel[i] & (1 << 34) != 0)
            && (0..MAX_FIXED)
                .all(|i| hits & (1 << (32 + i)) == 0 || self.fixed_ctrl & (1 << (32 + 4 * i)) != 0);
        let cfg = if self.pebs_baseline() && adaptive_bits {
            self.pebs_data_cfg
        } else {
            0
        };
        let groups = cfg & 0xFF00_000F;
        let lbr_n = if cfg & 8 != 0 {
            ((cfg >> 24) & 0xFF) as usize + 1
        } else {
            0
        };
        let size = 32
            + if cfg & 1 != 0 { 32 } else { 0 }
            + if cfg & 2 != 0 { 144 } else { 0 }
            + if cfg & 4 != 0 { 256 } else { 0 }
            + 24 * lbr_n;
        let retire_latency = s.cycles.min(0xFFFF);
        put((size as u64) << 48 | retire_latency << 32 | groups, out);
        put(s.ip, out);
        put(hits, out);
        put(self.tsc, out);
        if cfg & 1 != 0 {
            put(dla, out);
            put(dse, out);
            let split = matches!(
                self.cpu,
                SimCpu::Intel {
                    split_latency: true,
                    ..
                }
            );
            put(
                if split {
                    (lat << 32) | (s.cycles & 0xFFFF)
                } else {
                    lat
                },
                out,
            );
            put(0, out);
        }
        if cfg & 2 != 0 {
            // FLAGS, IP, AX, CX, DX, BX, SP, BP, SI, DI, R8-R15.
            let g = &r.gprs;
            for v in [
                r.flags, s.next_ip, g[0], g[2], g[3], g[1], g[7], g[6], g[4], g[5],
            ] {
                put(v, out);
            }
            for v in &g[8..16] {
                put(*v, out);
            }
        }
        if cfg & 4 != 0 {
            for _ in 0..32 {
                put(0, out);
            }
        }
        for i in 0..lbr_n {
            let e = if i < MAX_LBR {
                self.lbr_entry_newest(i)
            } else {
                LbrSlot::default()
            };
            put(e.from, out);
            put(e.to, out);
            put(e.info, out);
        }
        n
    }

    fn lbr_entry_newest(&self, i: usize) -> LbrSlot {
        match self.cpu {
            SimCpu::Intel {
                lbr: SimLbr::Arch { .. },
                ..
            }
            | SimCpu::Amd { .. } => self.lbr[i],
            SimCpu::Intel {
                lbr: SimLbr::Legacy { depth, .. },
                ..
            } => {
                let d = u64::from(depth);
                self.lbr[((self.tos + d - (i as u64 % d)) % d) as usize]
            }
            _ => LbrSlot::default(),
        }
    }

    fn suppressed_legacy(sel: u64, kind: BranchKind, user: bool) -> bool {
        let cpl_bit = if user { 1 } else { 0 };
        let kind_bit = match kind {
            BranchKind::Cond => 2,
            BranchKind::Call => 3,
            BranchKind::IndCall => 4,
            BranchKind::Ret => 5,
            BranchKind::IndJmp => 6,
            BranchKind::Jmp => 7,
            BranchKind::Far => 8,
        };
        sel & (1 << cpl_bit) != 0 || sel & (1 << kind_bit) != 0
    }

    fn record_branch(&mut self, b: &SimBranch, user: bool) {
        let cycles = self.cycles_since_branch.min(0xFFFF);
        let mut recorded = false;
        match self.cpu {
            SimCpu::Intel {
                lbr: SimLbr::Legacy { format, depth, .. },
                ..
            } => {
                if self.debugctl & debugctl::LBR == 0 || self.global_status & STATUS_LBR_FRZ != 0 {
                    return;
                }
                let call_stack = self.lbr_select & (1 << 9) != 0;
                if Self::suppressed_legacy(self.lbr_select & 0x1FF, b.kind, user) {
                    return;
                }
                let d = u64::from(depth);
                if call_stack && b.kind == BranchKind::Ret {
                    self.lbr[self.tos as usize] = LbrSlot::default();
                    self.tos = (self.tos + d - 1) % d;
                    return;
                }
                if call_stack && !matches!(b.kind, BranchKind::Call | BranchKind::IndCall) {
                    return;
                }
                self.tos = (self.tos + 1) % d;
                let mis = u64::from(b.mispred);
                let slot = match format {
                    // 32-bit format: FROM[31:0] source, FROM[63:32] target.
                    0 => LbrSlot {
                        from: (b.from & 0xFFFF_FFFF) | (b.to & 0xFFFF_FFFF) << 32,
                        to: 0,
                        info: 0,
                    },
                    // Knights Landing reports LIP but keeps the mispredict
                    // flag in FROM[63].
                    1 if self.row().legacy_lbr().is_some_and(|l| l.lip_has_mispred) => LbrSlot {
                        from: (b.from & !(1 << 63)) | mis << 63,
                        to: b.to,
                        info: 0,
                    },
                    1 | 2 => LbrSlot {
                        from: b.from,
                        to: b.to,
                        info: 0,
                    },
                    3 => LbrSlot {
                        from: (b.from & !(1 << 63)) | mis << 63,
                        to: b.to,
                        info: 0,
                    },
                    4 => LbrSlot {
                        from: (b.from & ((1 << 61) - 1)) | mis << 63,
                        to: b.to,
                        info: 0,
                    },
                    5 | 7 => LbrSlot {
                        from: b.from,
                        to: b.to,
                        info: mis << 63 | cycles,
                    },
                    _ => LbrSlot {
                        from: (b.from & ((1 << 48) - 1)) | mis << 63,
                        to: (b.to & ((1 << 48) - 1)) | cycles << 48,
                        info: 0,
                    },
                };
                self.lbr[self.tos as usize] = slot;
                recorded = true;
            }
            SimCpu::Intel {
                lbr: SimLbr::Arch { .. },
                ..
            } => {
                let ctl = self.lbr_ctl;
                if ctl & 1 == 0 || self.global_status & STATUS_LBR_FRZ != 0 {
                    return;
                }
                let mode_ok = if user { ctl & 4 != 0 } else { ctl & 2 != 0 };
                let (en_bit, br_type) = match b.kind {
                    BranchKind::Cond => (16, 0),
                    BranchKind::Jmp => (17, 2),
                    BranchKind::IndJmp => (18, 1),
                    BranchKind::Call => (19, 4),
                    BranchKind::IndCall => (20, 3),
                    BranchKind::Ret => (21, 5),
                    BranchKind::Far => (22, 6),
                };
                if !mode_ok || ctl & (1 << en_bit) == 0 {
                    return;
                }
                let depth = (self.lbr_depth as usize).min(MAX_LBR);
                if depth == 0 {
                    return;
                }
                let call_stack = ctl & 8 != 0;
                if call_stack && b.kind == BranchKind::Ret {
                    self.lbr.copy_within(1..depth, 0);
                    self.lbr[depth - 1] = LbrSlot::default();
                    return;
                }
                if call_stack && !matches!(b.kind, BranchKind::Call | BranchKind::IndCall) {
                    return;
                }
                self.lbr.copy_within(0..depth - 1, 1);
                let info = u64::from(b.mispred) << 63 | 1 << 60 | (br_type as u64) << 56 | cycles;
                self.lbr[0] = LbrSlot {
                    from: b.from,
                    to: b.to,
                    info,
                };
                recorded = true;
            }
            SimCpu::Amd { lbr_depth, .. } if lbr_depth > 0 => {
                if self.amd_ext_cfg & (1 << 6) == 0 || self.global_status & STATUS_LBR_FRZ != 0 {
                    return;
                }
                if Self::suppressed_legacy(self.lbr_select & 0x1FF, b.kind, user) {
                    return;
                }
                let depth = usize::from(lbr_depth).min(MAX_LBR);
                self.lbr.copy_within(0..depth - 1, 1);
                let ip_mask = (1u64 << 58) - 1;
                self.lbr[0] = LbrSlot {
                    from: (b.from & ip_mask) | u64::from(b.mispred) << 63,
                    to: (b.to & ip_mask) | 1 << 63,
                    info: 0,
                };
                recorded = true;
            }
            _ => {}
        }
        if recorded {
            self.cycles_since_branch = 0;
        }
    }

    /// Counters enabled by a GLOBAL_CTRL write of `enable` after being
    /// loaded: a distance to overflow below the model's minimum period for
    /// the counter's event is unsafe on the real part.
    fn check_periods(&mut self, enable: u64) {
        let row = self.row();
        let gpw = width_mask(self.gp_width());
        let fw = width_mask(self.intel().map_or(48, |i| i.4));
        for i in 0..self.n_gp() {
            if enable & self.loaded & (1 << i) != 0 {
                let left = (gpw - self.pmc[i]).wrapping_add(1);
                if left < row.min_period(self.evtsel[i], 0) {
                    self.stats.short_periods += 1;
                }
            }
        }
        for i in 0..self.n_fixed() {
            if enable & self.loaded & (1 << (32 + i)) != 0 {
                let left = (fw - self.fixed[i]).wrapping_add(1);
                if left < row.min_period(0, 0) {
                    self.stats.short_periods += 1;
                }
            }
        }
        self.loaded &= !enable;
    }

    /// Make the overflows armed by [`SimPmu::overflow_during_handler`] land:
    /// the counters wrap to 0, their status bits are set and a PMI is
    /// requested (dropped while the LVT entry is still masked).
    fn land_handler_overflows(&mut self) {
        let bits = core::mem::take(&mut self.handler_overflow);
        if bits == 0 {
            return;
        }
        for i in 0..MAX_GP {
            if bits & (1 << i) != 0 {
                self.pmc[i] = 0;
            }
        }
        for i in 0..MAX_FIXED {
            if bits & (1 << (32 + i)) != 0 {
                self.fixed[i] = 0;
            }
        }
        self.global_status |= bits;
        self.raise_pmi();
    }

    fn gp_slot(&self, a: u32, base: u32, stride: u32) -> Option<usize> {
        let off = a.checked_sub(base)?;
        if off % stride != 0 {
            return None;
        }
        let i = (off / stride) as usize;
        (i < self.n_gp()).then_some(i)
    }

    fn lbr_msr(&self, a: u32) -> Option<(usize, u8)> {
        match self.cpu {
            SimCpu::Intel {
                lbr:
                    SimLbr::Legacy {
                        depth,
                        from,
                        to,
                        format,
                    },
                ..
            } => {
                let d = u32::from(depth);
                if (from..from + d).contains(&a) {
                    Some(((a - from) as usize, 0))
                } else if (to..to + d).contains(&a) {
                    Some(((a - to) as usize, 1))
                } else if matches!(format, 5 | 7)
                    && (addr::MSR_LBR_INFO_0..addr::MSR_LBR_INFO_0 + d).contains(&a)
                {
                    Some(((a - addr::MSR_LBR_INFO_0) as usize, 2))
                } else {
                    None
                }
            }
            SimCpu::Intel {
                lbr: SimLbr::Arch { depth },
                ..
            } => {
                let d = u32::from(depth);
                if (addr::IA32_LBR_0_FROM_IP..addr::IA32_LBR_0_FROM_IP + d).contains(&a) {
                    Some(((a - addr::IA32_LBR_0_FROM_IP) as usize, 0))
                } else if (addr::IA32_LBR_0_TO_IP..addr::IA32_LBR_0_TO_IP + d).contains(&a) {
                    Some(((a - addr::IA32_LBR_0_TO_IP) as usize, 1))
                } else if (addr::IA32_LBR_0_INFO..addr::IA32_LBR_0_INFO + d).contains(&a) {
                    Some(((a - addr::IA32_LBR_0_INFO) as usize, 2))
                } else {
                    None
                }
            }
            SimCpu::Amd { lbr_depth, .. } => {
                let d = 2 * u32::from(lbr_depth);
                let off = a.checked_sub(addr::AMD_SAMP_BR_FROM0)?;
                (off < d).then_some(((off / 2) as usize, (off % 2) as u8))
            }
            _ => None,
        }
    }
}

impl Lvt for SimPmu {
    fn write_lvt_pmi(&mut self, entry: u32) {
        let unmasked = entry & crate::pmu::LVT_MASKED == 0;
        if unmasked
            && self.in_pmi
            && self.version() >= 2
            && self.global_ctrl == 0
            && self.row().ack == PmiAck::Late
        {
            self.stats.early_lvt_unmasks += 1;
        }
        self.lvt = entry;
        // A latched late NMI (AMD) arrives once the handler unmasks.
        if unmasked && self.late_nmis > 0 && !self.pmi_pending {
            self.late_nmis -= 1;
            self.lvt |= crate::pmu::LVT_MASKED;
            self.pmi_pending = true;
            self.stats.late_nmis += 1;
        }
    }
}

impl Msr for SimPmu {
    fn read(&mut self, a: u32) -> u64 {
        let gpw = width_mask(self.gp_width());
        match self.cpu {
            SimCpu::Amd { ext, v2, .. } => {
                if let Some(i) = self
                    .gp_slot(a, addr::AMD_K7_PERF_CTL0, 1)
                    .filter(|&i| i < 4)
                {
                    return self.evtsel[i];
                }
                if let Some(i) = self
                    .gp_slot(a, addr::AMD_K7_PERF_CTR0, 1)
                    .filter(|&i| i < 4)
                {
                    return self.pmc[i];
                }
                if ext {
                    if let Some(i) = self.gp_slot(a, addr::AMD_F15H_PERF_CTL0, 2) {
                        return self.evtsel[i];
                    }
                    if let Some(i) = self.gp_slot(a, addr::AMD_F15H_PERF_CTR0, 2) {
                        return self.pmc[i];
                    }
                }
                if v2 && ext {
                    match a {
                        addr::AMD_PERF_CNTR_GLOBAL_STATUS => return self.global_status,
                        addr::AMD_PERF_CNTR_GLOBAL_CTL => return self.global_ctrl,
                        _ => {}
                    }
                }
                match a {
                    addr::IA32_DEBUGCTL => return self.debugctl,
                    addr::AMD_DBG_EXTN_CFG => return self.amd_ext_cfg,
                    addr::AMD_LBR_SELECT => return self.lbr_select,
                    _ => {}
                }
                if let Some((i, part)) = self.lbr_msr(a) {
                    let e = self.lbr[i];
                    return if part == 0 { e.from } else { e.to };
                }
                self.stats.bad_msr_reads += 1;
                0
            }
            SimCpu::NoPmu => {
                // Like QEMU TCG: reads of PMU MSRs return 0 without a fault.
                0
            }
            SimCpu::Intel { version, .. } => {
                if let Some(i) = self.gp_slot(a, addr::IA32_PERFEVTSEL0, 1) {
                    return self.evtsel[i];
                }
                if let Some(i) = self.gp_slot(a, addr::IA32_PMC0, 1) {
                    return self.pmc[i] & gpw;
                }
                if let Some(i) = self.gp_slot(a, addr::IA32_A_PMC0, 1) {
                    return self.pmc[i] & gpw;
                }
                if (addr::IA32_FIXED_CTR0..addr::IA32_FIXED_CTR0 + self.n_fixed() as u32)
                    .contains(&a)
                {
                    return self.fixed[(a - addr::IA32_FIXED_CTR0) as usize];
                }
                if let Some((i, part)) = self.lbr_msr(a) {
                    let e = self.lbr[i];
                    return [e.from, e.to, e.info][usize::from(part)];
                }
                let v2 = version >= 2;
                match a {
                    addr::IA32_PERF_CAPABILITIES => self.perf_capabilities(),
                    addr::IA32_MISC_ENABLE => {
                        if self.pebs_format().is_some() {
                            0
                        } else {
                            1 << 12
                        }
                    }
                    addr::IA32_DEBUGCTL => self.debugctl,
                    addr::IA32_FIXED_CTR_CTRL if v2 => self.fixed_ctrl,
                    addr::IA32_PERF_GLOBAL_STATUS if v2 => self.global_status,
                    addr::IA32_PERF_GLOBAL_CTRL if v2 => self.global_ctrl,
                    addr::IA32_PEBS_ENABLE if self.pebs_format().is_some() => self.pebs_enable,
                    addr::MSR_PEBS_DATA_CFG if self.pebs_baseline() => self.pebs_data_cfg,
                    addr::MSR_PEBS_LD_LAT_THRESHOLD if self.has_ld_lat() => self.ld_lat,
                    addr::IA32_DS_AREA if self.pebs_format().is_some() => self.ds_area,
                    addr::MSR_LBR_SELECT if self.has_lbr_select() => self.lbr_select,
                    addr::MSR_LASTBRANCH_TOS => self.tos,
                    addr::IA32_LBR_CTL => self.lbr_ctl,
                    addr::IA32_LBR_DEPTH => self.lbr_depth,
                    _ => {
                        self.stats.bad_msr_reads += 1;
                        0
                    }
                }
            }
        }
    }

    fn write(&mut self, a: u32, v: u64) {
        let gpw = width_mask(self.gp_width());
        match self.cpu {
            SimCpu::NoPmu => {}
            SimCpu::Amd { ext, v2, .. } => {
                if let Some(i) = self
                    .gp_slot(a, addr::AMD_K7_PERF_CTL0, 1)
                    .filter(|&i| i < 4)
                {
                    self.evtsel[i] = v;
                } else if let Some(i) = self
                    .gp_slot(a, addr::AMD_K7_PERF_CTR0, 1)
                    .filter(|&i| i < 4)
                {
                    self.pmc[i] = v & gpw;
                } else if let (true, Some(i)) = (ext, self.gp_slot(a, addr::AMD_F15H_PERF_CTL0, 2))
                {
                    self.evtsel[i] = v;
                } else if let (true, Some(i)) = (ext, self.gp_slot(a, addr::AMD_F15H_PERF_CTR0, 2))
                {
                    self.pmc[i] = v & gpw;
                } else if v2 && ext && a == addr::AMD_PERF_CNTR_GLOBAL_CTL {
                    self.global_ctrl = v;
                } else if v2 && ext && a == addr::AMD_PERF_CNTR_GLOBAL_STATUS_CLR {
                    self.global_status &= !v;
                } else if a == addr::IA32_DEBUGCTL {
                    self.debugctl = v;
                } else if a == addr::AMD_DBG_EXTN_CFG {
                    self.amd_ext_cfg = v;
                } else if a == addr::AMD_LBR_SELECT {
                    self.lbr_select = v;
                } else {
                    self.stats.bad_msr_writes += 1;
                }
            }
            SimCpu::Intel {
                version,
                full_width,
                ..
            } => {
                let v2 = version >= 2;
                if let Some(i) = self.gp_slot(a, addr::IA32_PERFEVTSEL0, 1) {
                    // Bit 34 (adaptive PEBS record) is reserved without PEBS baseline.
                    if v & (1 << 34) != 0 && !self.pebs_baseline() {
                        self.stats.bad_msr_writes += 1;
                        return;
                    }
                    self.evtsel[i] = v;
                } else if let Some(i) = self.gp_slot(a, addr::IA32_PMC0, 1) {
                    // SDM: a write to IA32_PMCx sets bits 31:0 and sign-extends bit 31.
                    self.pmc[i] = ((v as u32 as i32) as i64 as u64) & gpw;
                    self.loaded |= 1 << i;
                } else if let (true, Some(i)) = (full_width, self.gp_slot(a, addr::IA32_A_PMC0, 1))
                {
                    self.pmc[i] = v & gpw;
                    self.loaded |= 1 << i;
                } else if (addr::IA32_FIXED_CTR0..addr::IA32_FIXED_CTR0 + self.n_fixed() as u32)
                    .contains(&a)
                {
                    let fw = self.intel().map_or(48, |i| i.4);
                    let n = (a - addr::IA32_FIXED_CTR0) as usize;
                    self.fixed[n] = v & width_mask(fw);
                    self.loaded |= 1 << (32 + n);
                } else if v2 && a == addr::IA32_FIXED_CTR_CTRL {
                    let adaptive_bits = (0..4).fold(0u64, |m, n| m | 1 << (32 + 4 * n));
                    if v & adaptive_bits != 0 && !self.pebs_baseline() {
                        self.stats.bad_msr_writes += 1;
                    } else {
                        self.fixed_ctrl = v;
                    }
                } else if v2 && a == addr::IA32_PERF_GLOBAL_CTRL {
                    if self.row().reset_on_enable
                        && v & 0xF == 0xF
                        && self.evtsel[..4] == models::NHM_MAGIC_EVENTS
                    {
                        self.stats.nhm_resets += 1;
                    }
                    self.check_periods(v);
                    self.global_ctrl = v;
                    if v != 0 {
                        self.in_pmi = false;
                    }
                } else if v2 && a == addr::IA32_PERF_GLOBAL_OVF_CTRL {
                    // v2/v3 OVF_CTRL and v4 STATUS_RESET both clear the bits written;
                    // only v4+ knows the freeze bits.
                    let clearable = if version >= 4 {
                        u64::MAX
                    } else {
                        !(STATUS_CTR_FRZ | STATUS_LBR_FRZ)
                    };
                    self.global_status &= !(v & clearable);
                    self.land_handler_overflows();
                } else if version >= 4 && a == addr::IA32_PERF_GLOBAL_STATUS_SET {
                    self.global_status |= v;
                } else if a == addr::IA32_DEBUGCTL {
                    self.debugctl = v;
                } else if a == addr::IA32_PEBS_ENABLE && self.pebs_format().is_some() {
                    self.pebs_enable = v;
                } else if a == addr::MSR_PEBS_DATA_CFG && self.pebs_baseline() {
                    self.pebs_data_cfg = v;
                } else if a == addr::MSR_PEBS_LD_LAT_THRESHOLD && self.has_ld_lat() {
                    self.ld_lat = v & 0xFFFF;
                } else if a == addr::IA32_DS_AREA && self.pebs_format().is_some() {
                    self.ds_area = v;
                } else if a == addr::MSR_LBR_SELECT && self.has_lbr_select() {
                    // EN_CALLSTACK (bit 9) is reserved where the model has no
                    // call-stack mode.
                    let call_stack = self.row().legacy_lbr().is_some_and(|l| l.call_stack);
                    if v & (1 << 9) != 0 && !call_stack {
                        self.stats.bad_msr_writes += 1;
                    } else {
                        self.lbr_select = v;
                    }
                } else if a == addr::MSR_LASTBRANCH_TOS {
                    self.tos = v;
                } else if a == addr::IA32_LBR_CTL
                    && matches!(
                        self.cpu,
                        SimCpu::Intel {
                            lbr: SimLbr::Arch { .. },
                            ..
                        }
                    )
                {
                    self.lbr_ctl = v;
                } else if let (
                    SimCpu::Intel {
                        lbr: SimLbr::Arch { depth },
                        ..
                    },
                    addr::IA32_LBR_DEPTH,
                ) = (self.cpu, a)
                {
                    // Writing the depth resets the stack (SDM "IA32_LBR_DEPTH").
                    if v == 0 || !v.is_multiple_of(8) || v > u64::from(depth) {
                        self.stats.bad_msr_writes += 1;
                    } else {
                        self.lbr_depth = v;
                        self.lbr = [LbrSlot::default(); MAX_LBR];
                    }
                } else if let Some((i, part)) = self.lbr_msr(a) {
                    match part {
                        0 => self.lbr[i].from = v,
                        1 => self.lbr[i].to = v,
                        _ => self.lbr[i].info = v,
                    }
                } else {
                    self.stats.bad_msr_writes += 1;
                }
            }
        }
    }
}

impl Cpuid for SimPmu {
    fn cpuid(&self, leaf: u32, subleaf: u32) -> CpuIdResult {
        const ZERO: CpuIdResult = regs(0, 0, 0, 0);
        // "GenuineIntel" / "AuthenticAMD" in EBX, EDX, ECX.
        let intel_vendor = |max: u32| regs(max, 0x756E_6547, 0x6C65_746E, 0x4965_6E69);
        let amd_vendor = |max: u32| regs(max, 0x6874_7541, 0x444D_4163, 0x6974_6E65);
        match self.cpu {
            SimCpu::NoPmu => match leaf {
                0 => amd_vendor(0xD),
                // Family 15 model 107 (QEMU's qemu64), hypervisor bit set.
                1 => regs(0x0006_0FB1, 0, 1 << 31, 0),
                0x8000_0000 => regs(0x8000_000A, 0, 0, 0),
                _ => ZERO,
            },
            SimCpu::Amd {
                family,
                ext,
                v2,
                lbr_depth,
            } => match leaf {
                0 => amd_vendor(0x10),
                // Family 19h is Zen 4 (model 11h), 15h Piledriver (model
                // 02h), 10h model 02h; under a hypervisor when the part has
                // the extended set, else bare metal (the four legacy
                // counters have no CPUID bit).
                1 => {
                    let eax = match family {
                        0x19 => 0x00A1_0F10,
                        0x15 => 0x0060_0F20,
                        f if f >= 0xF => u32::from(f - 0xF) << 20 | 0xF20,
                        f => u32::from(f) << 8 | 0x20,
                    };
                    regs(eax, 0, if ext { 1 << 31 } else { 0 }, 0)
                }
                0x8000_0000 => regs(0x8000_0022, 0, 0, 0),
                0x8000_0001 => regs(0, 0, if ext { 1 << 23 } else { 0 }, 0),
                0x8000_0022 => {
                    let eax = u32::from(v2) | if lbr_depth > 0 { 2 } else { 0 };
                    let ebx = if v2 { 6 } else { 0 } | u32::from(lbr_depth) << 4;
                    regs(eax, ebx, 0, 0)
                }
                _ => ZERO,
            },
            SimCpu::Intel {
                model,
                stepping,
                hybrid,
                version,
                gp,
                fixed,
                gp_width,
                fixed_width,
                pebs_format,
                lbr,
                ..
            } => match leaf {
                0 => intel_vendor(0x1C),
                1 => {
                    let eax = 6 << 8
                        | u32::from(model & 0xF) << 4
                        | u32::from(model >> 4) << 16
                        | u32::from(stepping & 0xF);
                    let pebs = pebs_format.is_some();
                    let ecx = 1 << 15 | if pebs { 1 << 2 } else { 0 }; // PDCM, DTES64
                    let edx = if pebs { 1 << 21 } else { 0 }; // DS
                    regs(eax, 0, ecx, edx)
                }
                7 if subleaf == 0 => regs(
                    0,
                    0,
                    0,
                    if matches!(lbr, SimLbr::Arch { .. }) {
                        1 << 19
                    } else {
                        0
                    } | if hybrid.is_some() { 1 << 15 } else { 0 },
                ),
                0x1A => regs(hybrid.map_or(0, |t| t.leaf_1a_id() << 24), 0, 0, 0),
                0xA => {
                    let eax = u32::from(version)
                        | u32::from(gp) << 8
                        | u32::from(gp_width) << 16
                        | 7 << 24;
                    let (ecx, edx) = if version >= 2 {
                        let bitmap = if version >= 5 { (1u32 << fixed) - 1 } else { 0 };
                        (bitmap, u32::from(fixed) | u32::from(fixed_width) << 5)
                    } else {
                        (0, 0)
                    };
                    regs(eax, 0, ecx, edx)
                }
                0x1C => match lbr {
                    SimLbr::Arch { depth } => {
                        let mask = (1u32 << (depth / 8)) - 1;
                        regs(mask, 0b111, 0b111, 0)
                    }
                    _ => ZERO,
                },
                _ => ZERO,
            },
        }
    }
}

/// `pmu=sim` on the target: each NMI-clock tick becomes one [`SimStep`]
/// built from the interrupted context, so the simulator's counters, PEBS
/// records and LBR entries carry the appliance's real IPs and registers
/// through the real drivers, NMI handler, ring, wire and host tool.
///
/// The synthetic parts are deterministic: each tick retires
/// `instructions_per_tick` instructions (two cycles each), takes one branch
/// from the previous tick's IP to this one (every seventh mispredicted) and
/// performs one load at the interrupted stack pointer, with a latency and
/// data source that cycle through the load-latency encodings.
#[derive(Debug)]
pub struct SimClock {
    /// The simulated PMU the drivers talk to.
    pub sim: SimPmu,
    instructions_per_tick: u64,
    tick: u64,
    last_ip: u64,
}

impl SimClock {
    /// A simulator of `cpu` advanced by `instructions_per_tick` per clock tick.
    pub fn new(cpu: SimCpu, instructions_per_tick: u64) -> Self {
        SimClock {
            sim: SimPmu::new(cpu),
            instructions_per_tick: instructions_per_tick.max(1),
            tick: 0,
            last_ip: 0,
        }
    }

    /// The step for a tick that interrupted `ip` (user mode or not) with `regs`.
    pub fn step_for(&mut self, ip: u64, user: bool, regs: SimRegs) -> SimStep {
        const SOURCES: [u8; 6] = [0x1, 0x2, 0x3, 0x4, 0x7, 0xC];
        let t = self.tick;
        self.tick += 1;
        let from = if self.last_ip == 0 { ip } else { self.last_ip };
        self.last_ip = ip;
        SimStep {
            ip,
            next_ip: ip + 1,
            user,
            regs,
            instructions: self.instructions_per_tick,
            cycles: 2 * self.instructions_per_tick,
            branch: Some(SimBranch {
                from,
                to: ip,
                mispred: t % 7 == 6,
                kind: BranchKind::Jmp,
            }),
            mem: Some(SimMem {
                addr: regs.gprs[7],
                latency: 4 + (t % 61) as u16,
                dse: SOURCES[(t % SOURCES.len() as u64) as usize],
                store: false,
            }),
        }
    }

    /// Advance the simulator by one tick. Returns true when a PMI is pending:
    /// then call [`SimPmu::take_pmi`] and the driver's `handle_pmi`.
    pub fn on_tick(
        &mut self,
        mem: Option<&mut DsMemory<'_>>,
        ip: u64,
        user: bool,
        regs: SimRegs,
    ) -> bool {
        let s = self.step_for(ip, user, regs);
        self.sim.advance(mem, &s)
    }
}

impl AsMut<SimPmu> for SimPmu {
    fn as_mut(&mut self) -> &mut SimPmu {
        self
    }
}

/// A simulated PMU whose counters are dead, the way an emulator shows a PMU
/// it does not implement (QEMU TCG): every MSR reads 0 and every write is
/// dropped. CPUID and the LVT entry are those of the wrapped simulator.
#[derive(Debug)]
pub struct DeadCounters(pub SimPmu);

impl Msr for DeadCounters {
    fn read(&mut self, _: u32) -> u64 {
        0
    }

    fn write(&mut self, _: u32, _: u64) {}
}

impl Lvt for DeadCounters {
    fn write_lvt_pmi(&mut self, entry: u32) {
        self.0.write_lvt_pmi(entry)
    }
}

impl AsMut<SimPmu> for DeadCounters {
    fn as_mut(&mut self) -> &mut SimPmu {
        &mut self.0
    }
}

/// A simulated PMU whose counters work but whose overflow interrupts never
/// arrive: writes to the LVT entry are dropped, so it stays masked (a
/// hypervisor that cannot deliver PMIs).
#[derive(Debug)]
pub struct NoPmiDelivery(pub SimPmu);

impl Msr for NoPmiDelivery {
    fn read(&mut self, a: u32) -> u64 {
        self.0.read(a)
    }

    fn write(&mut self, a: u32, v: u64) {
        self.0.write(a, v)
    }
}

impl Lvt for NoPmiDelivery {
    fn write_lvt_pmi(&mut self, _: u32) {}
}

impl AsMut<SimPmu> for NoPmiDelivery {
    fn as_mut(&mut self) -> &mut SimPmu {
        &mut self.0
    }
}

/// A start-up-check workload on a simulator: `instructions` retire in steps
/// of `per_step` (kernel mode, one cycle each). When the simulator delivers
/// a PMI and `driver` is given, it is handled the way the NMI handler does
/// (`take_pmi`, then the driver's `handle_pmi`) and counted in `pmis`.
pub fn run_workload<H: crate::pmu::PmuHw + AsMut<SimPmu>>(
    hw: &mut H,
    mut driver: Option<&mut crate::pmu::driver::PmuDriver>,
    instructions: u64,
    per_step: u64,
    pmis: &core::cell::Cell<u64>,
) {
    let per_step = per_step.max(1);
    let mut done = 0;
    while done < instructions {
        let n = per_step.min(instructions - done);
        let mut s = SimStep::plain(0xFFFF_FFFF_8000_1000 + (done & 0xFFF), n);
        s.user = false;
        done += n;
        if !hw.as_mut().advance(None, &s) {
            continue;
        }
        if let Some(d) = driver.as_deref_mut() {
            let tsc = hw.as_mut().tsc();
            hw.as_mut().take_pmi();
            let sum = d.handle_pmi(hw, None, tsc, &mut |_| {});
            if !sum.spurious {
                pmis.set(pmis.get() + 1);
            }
        }
    }
}
