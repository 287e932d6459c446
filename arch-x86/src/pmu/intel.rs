//! Intel architectural performance monitoring, versions 1 to 5 (SDM vol. 3
//! "Architectural Performance Monitoring"), with PEBS through the DS area and
//! the LBR stack.
//!
//! Model-specific behaviour comes from the table in [`super::models`]:
//! PEBS counter constraints (and PMC0 only on format 0), the load-latency
//! event and its extra register, the `mem-loads-aux` event, the `cycles:p`
//! alias, the LBR facts and the PMI acknowledge order.
//!
//! Adaptive PEBS (format 4+ with PERF_CAPABILITIES\[14\]) sets the
//! per-counter adaptive bit (EVTSEL\[34\], FIXED_CTR_CTRL\[32+4n\]) next to
//! PEBS_DATA_CFG; format 4+ without baseline writes 32-byte basic records.
//!
//! The PMI handler follows Linux's `intel_pmu_handle_irq`: disable the
//! counters, read GLOBAL_STATUS, then loop (bounded) acknowledging the status
//! before handling it (PEBS records, one `Overflow` per counter a record
//! applies to; other overflows; period reloads) and reading it again until it
//! is clear, and re-arm the LVT entry at the model's point (early, or after
//! re-enabling the counters on big cores from Haswell on). Perfmon is never
//! frozen on PMI (FREEZE_PERFMON_ON_PMI freezes when the PMI is raised, not
//! when it is taken); the LBRs always are, except in call-stack mode.

use super::ds::{DsArea, DsMemory};
use super::events::{self, MemEvent};
use super::lbr::{LbrConfig, LbrDriver, LbrRawFormat, RawBranch};
use super::models::{self, IntelModel, PmiAck};
use super::{
    Counter, EventConfig, FREQ_START_PERIOD, LVT_PMI_NMI, Overflow, PmiSummary, PmuError, PmuHw,
    SampleMode,
};
use crate::cpuid::{PmuInfo, Vendor};
use crate::msr::{Msr, addr, debugctl};
use core::sync::atomic::Ordering;

/// Most events programmed at once (8 GP + 4 fixed).
pub const MAX_EVENTS: usize = 12;

const EVTSEL_USR: u64 = 1 << 16;
const EVTSEL_OS: u64 = 1 << 17;
const EVTSEL_INT: u64 = 1 << 20;
const EVTSEL_EN: u64 = 1 << 22;
/// EVTSEL: adaptive PEBS record for this counter (ICL_EVENTSEL_ADAPTIVE).
const EVTSEL_ADAPTIVE: u64 = 1 << 34;

/// Most passes of the PMI handler over GLOBAL_STATUS before it gives up and
/// resets the counters (Linux: 100).
pub const MAX_PMI_LOOPS: u32 = 100;

/// GLOBAL_STATUS: PEBS buffer threshold reached.
pub const STATUS_OVF_BUF: u64 = 1 << 62;
/// GLOBAL_STATUS (v4+): counters frozen by a PMI.
pub const STATUS_CTR_FRZ: u64 = 1 << 59;
/// GLOBAL_STATUS (v4+): LBRs frozen by a PMI.
pub const STATUS_LBR_FRZ: u64 = 1 << 58;

/// Driver options beyond the event list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IntelOptions {
    /// Record branch stacks with these settings.
    pub lbr: Option<LbrConfig>,
    /// Let PEBS fill the buffer with many records per PMI ("large PEBS") when
    /// every PEBS event allows it (fixed period, no PMI-time-only data).
    pub large_pebs: bool,
    /// Ask adaptive PEBS for the XMM register group.
    pub pebs_xmm: bool,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    counter: Counter,
    evtsel: u64,
    fixed_bits: u64,
    period: u64,
    mode: SampleMode,
    pebs: bool,
    last_tsc: u64,
    /// Smallest period the model takes for this event.
    min_period: u64,
    /// Periods are rounded down to a multiple of this power of two.
    period_align: u64,
}

#[derive(Debug, Clone, Copy)]
struct PebsSetup {
    format: u8,
    record_size: usize,
    data_cfg: u64,
    large: bool,
    /// Records carry the LBR group, encoded as the CPU's LBR.
    lbr_in_record: bool,
}

/// The Intel PMU driver for one CPU.
#[derive(Debug)]
pub struct IntelPmu {
    info: PmuInfo,
    row: &'static IntelModel,
    /// GP counter of the `mem-loads-aux` event, when one is programmed.
    aux: Option<u8>,
    slots: [Option<Slot>; MAX_EVENTS],
    n: usize,
    global_ctrl: u64,
    fixed_ctrl: u64,
    pebs_enable: u64,
    pebs: Option<PebsSetup>,
    lbr: Option<LbrDriver>,
    lbr_on: bool,
    pebs_disabled_reason: Option<u8>,
}

fn width_mask(w: u8) -> u64 {
    if w >= 64 { u64::MAX } else { (1u64 << w) - 1 }
}

impl IntelPmu {
    /// A driver for the detected PMU.
    pub fn new(info: &PmuInfo) -> Result<Self, PmuError> {
        if info.vendor == Vendor::Amd || !info.has_pmu() {
            return Err(PmuError::NoPmu);
        }
        let row = info.row();
        Ok(IntelPmu {
            info: *info,
            row,
            aux: None,
            slots: [None; MAX_EVENTS],
            n: 0,
            global_ctrl: 0,
            fixed_ctrl: 0,
            pebs_enable: 0,
            pebs: None,
            lbr: LbrDriver::new(info.lbr).map(|l| l.for_model(row)),
            lbr_on: false,
            pebs_disabled_reason: None,
        })
    }

    /// The PMU this driver was built for.
    pub fn info(&self) -> &PmuInfo {
        &self.info
    }

    /// The model-table row the driver follows.
    pub fn model(&self) -> &'static IntelModel {
        self.row
    }

    /// Counter holding event `i`.
    pub fn counter_of(&self, i: usize) -> Option<Counter> {
        self.slots.get(i).copied().flatten().map(|s| s.counter)
    }

    /// The PEBS format the driver decided to use, if any.
    pub fn pebs_format(&self) -> Option<u8> {
        self.pebs.map(|p| p.format)
    }

    /// The PEBS_DATA_CFG in use (adaptive PEBS).
    pub fn pebs_data_cfg(&self) -> u64 {
        self.pebs.map_or(0, |p| p.data_cfg)
    }

    /// Large PEBS is active.
    pub fn large_pebs(&self) -> bool {
        self.pebs.is_some_and(|p| p.large)
    }

    /// LBR format handed to the decoder with each overflow.
    pub fn lbr_format(&self) -> LbrRawFormat {
        match (&self.lbr, self.lbr_on) {
            (Some(l), true) => l.raw_format(),
            _ => LbrRawFormat::None,
        }
    }

    fn max_period(&self, counter: Counter) -> u64 {
        match counter {
            Counter::Fixed(_) => width_mask(self.info.fixed_width) >> 1,
            Counter::Gp(_) if self.info.full_width_write() => width_mask(self.info.gp_width) >> 1,
            Counter::Gp(_) => (1 << 31) - 1,
        }
    }

    /// Choose counters for `events` and program them (stopped). PEBS events
    /// need `mem`, the DS area and buffer.
    pub fn configure(
        &mut self,
        hw: &mut impl PmuHw,
        mem: Option<&mut DsMemory<'_>>,
        events_in: &[EventConfig],
        opts: &IntelOptions,
    ) -> Result<(), PmuError> {
        self.stop(hw);
        self.slots = [None; MAX_EVENTS];
        self.n = 0;
        self.pebs = None;
        self.aux = None;
        if events_in.len() > MAX_EVENTS {
            return Err(PmuError::NoCounter { event: MAX_EVENTS });
        }
        if let Some(cfg) = opts.lbr {
            let lbr = self.lbr.as_ref().ok_or(PmuError::LbrUnavailable)?;
            if cfg.call_stack && !lbr.supports_call_stack() {
                return Err(PmuError::LbrUnavailable);
            }
        }
        let baseline = self.info.pebs_baseline && self.info.pebs_format.is_some_and(|f| f >= 4);
        // Encodings and constraints.
        let mut enc = [None; MAX_EVENTS];
        let mut any_pebs = false;
        let mut needs_aux = None;
        for (i, ev) in events_in.iter().enumerate() {
            let mut e = events::encode(ev.event.kind, self.info.vendor)
                .ok_or(PmuError::EventUnavailable { event: i })?;
            if let Some(bit) = events::arch_event_bit(ev.event.kind)
                && self.info.events_unavailable & (1 << bit) != 0
            {
                return Err(PmuError::EventUnavailable { event: i });
            }
            if e.mem == MemEvent::Load {
                // The load-latency event is per model; without the facility
                // (and its MSR_PEBS_LD_LAT_THRESHOLD) there is no mem-loads.
                let ld = self
                    .row
                    .ld_lat_event
                    .ok_or(PmuError::EventUnavailable { event: i })?;
                e.evtsel = u64::from(ld);
                if self.row.mem_loads_aux {
                    needs_aux = Some(i);
                }
            }
            if e.mem == MemEvent::Store {
                // The precise-store event is per model too (Linux's
                // mem_st_snb / mem_st_hsw); some models have none.
                let st = self
                    .row
                    .st_event
                    .ok_or(PmuError::EventUnavailable { event: i })?;
                e.evtsel = u64::from(st);
            }
            let pebs = ev.event.precise > 0 || e.needs_pebs;
            if pebs {
                match self.info.pebs_format {
                    None => return Err(PmuError::PebsUnavailable),
                    Some(f) if sampler_known_format(f).is_none() => {
                        self.pebs_disabled_reason = Some(f);
                        return Err(PmuError::PebsUnknownFormat(f));
                    }
                    Some(_) => {}
                }
                any_pebs = true;
                // Event 0x3C (cycles) makes no PEBS assist before PEBS
                // baseline: use the model's alias (Linux intel_pebs_aliases_*),
                // which counts every cycle on a PEBS-capable event.
                if !baseline && e.evtsel & 0xFFFF_FFFF == 0x3C {
                    let alt = self
                        .row
                        .cycles_alias
                        .evtsel(ev.event.precise)
                        .ok_or(PmuError::EventUnavailable { event: i })?;
                    e.evtsel = alt;
                    e.fixed = None;
                }
            }
            match ev.mode {
                SampleMode::Period(0) => return Err(PmuError::BadPeriod { event: i }),
                SampleMode::Frequency { hz: 0, .. } => {
                    return Err(PmuError::BadPeriod { event: i });
                }
                _ => {}
            }
            enc[i] = Some((e, pebs));
        }
        // Assign: fixed counters first, then GP events by tightest constraint.
        let mut gp_used = 0u32;
        let mut fixed_used = 0u8;
        let gp_all = width_mask(self.info.gp_counters) as u32;
        let mut order = [0usize; MAX_EVENTS];
        for (k, o) in order.iter_mut().enumerate().take(events_in.len()) {
            *o = k;
        }
        let row = self.row;
        let format0 = self.info.pebs_format == Some(0);
        let gp_mask_of = |i: usize| -> u32 {
            let Some((e, pebs)) = enc[i] else { return 0 };
            let mut m = e.gp_mask & gp_all;
            // The model's counter constraints (Linux
            // intel_*_event_constraints), which PEBS constraints replace.
            if row.counter_constraint_applies(e.evtsel, pebs, baseline) {
                m &= row.gp_counters(e.evtsel);
            }
            if pebs {
                m &= row.pebs_counters(e.evtsel);
                if format0 {
                    m &= 1; // format 0: PEBS on PMC0 only
                }
            }
            m
        };
        order[..events_in.len()].sort_unstable_by_key(|&i| (gp_mask_of(i).count_ones(), i));
        // Fixed counters first; the rest go on GP counters as a matching of
        // events to their allowed counters: each event takes its lowest
        // free allowed counter, or, when none is free, moves events already
        // placed to other counters they may use (an augmenting path), so a
        // set is refused only when no assignment exists at all.
        let mut counters = [None; MAX_EVENTS];
        // Owner of each GP counter: an event, or MAX_EVENTS for the
        // auxiliary event.
        let mut owner = [None; 32];
        let mut masks = [0u32; MAX_EVENTS + 1];
        for &i in &order[..events_in.len()] {
            let (e, pebs) = enc[i].ok_or(PmuError::EventUnavailable { event: i })?;
            let ev = &events_in[i];
            // PEBS baseline (adaptive PEBS) can also sample fixed counters.
            if let Some(f) = e.fixed
                && (!pebs || (baseline && row.pebs_on_fixed(e.evtsel, ev.event.precise)))
                && self.info.fixed_mask & (1 << f) != 0
                && fixed_used & (1 << f) == 0
            {
                fixed_used |= 1 << f;
                counters[i] = Some(Counter::Fixed(f));
                continue;
            }
            masks[i] = gp_mask_of(i);
            if !place_gp(i, &masks, &mut owner, &mut gp_used) {
                return Err(PmuError::NoCounter { event: i });
            }
        }
        // The auxiliary event the load-latency event needs on some models
        // (Linux PMU_FL_MEM_LOADS_AUX): counted, never sampled.
        if let Some(i) = needs_aux {
            masks[MAX_EVENTS] = gp_all & row.gp_counters(u64::from(models::MEM_LOADS_AUX_EVENT));
            if !place_gp(MAX_EVENTS, &masks, &mut owner, &mut gp_used) {
                return Err(PmuError::NoCounter { event: i });
            }
        }
        for (n, o) in owner.iter().enumerate() {
            match *o {
                Some(i) if i < MAX_EVENTS => counters[i] = Some(Counter::Gp(n as u8)),
                Some(_) => self.aux = Some(n as u8),
                None => {}
            }
        }
        for i in 0..events_in.len() {
            let (e, pebs) = enc[i].ok_or(PmuError::EventUnavailable { event: i })?;
            let ev = &events_in[i];
            let counter = counters[i].ok_or(PmuError::NoCounter { event: i })?;
            // Shorter periods than the model takes are raised to its
            // minimum (Linux *_limit_period).
            let (min_period, period_align) = self.row.period_limits(e.evtsel, ev.event.precise);
            let period = match ev.mode {
                SampleMode::Period(p) => p,
                SampleMode::Frequency { .. } => FREQ_START_PERIOD,
            }
            .max(min_period)
                & !(period_align - 1);
            if period > self.max_period(counter) {
                return Err(PmuError::BadPeriod { event: i });
            }
            let mode_bits = if ev.event.user { EVTSEL_USR } else { 0 }
                | if ev.event.kernel { EVTSEL_OS } else { 0 };
            let (evtsel, fixed_bits) = match counter {
                Counter::Gp(_) => (e.evtsel | mode_bits | EVTSEL_INT | EVTSEL_EN, 0),
                Counter::Fixed(_) => {
                    let en = u64::from(ev.event.kernel) | u64::from(ev.event.user) << 1;
                    // PMI on overflow, except for PEBS (the threshold interrupts).
                    (0, en | if pebs { 0 } else { 1 << 3 })
                }
            };
            // PEBS events do not interrupt on overflow; the buffer threshold
            // does. With PEBS baseline the record layout follows
            // PEBS_DATA_CFG only for counters with the adaptive bit.
            let evtsel = if pebs {
                (evtsel & !EVTSEL_INT) | if baseline { EVTSEL_ADAPTIVE } else { 0 }
            } else {
                evtsel
            };
            self.slots[i] = Some(Slot {
                counter,
                evtsel,
                fixed_bits,
                period,
                mode: ev.mode,
                pebs,
                last_tsc: 0,
                min_period,
                period_align,
            });
        }
        self.n = events_in.len();
        // PEBS setup.
        if any_pebs {
            let mem = mem.ok_or(PmuError::BadDsMemory)?;
            self.setup_pebs(hw, mem, &enc, opts)?;
        }
        // Program counters, stopped.
        self.global_ctrl = 0;
        self.fixed_ctrl = 0;
        for i in 0..self.n {
            let Some(s) = self.slots[i] else { continue };
            self.write_period(hw, s.counter, s.period);
            match s.counter {
                Counter::Gp(n) => hw.write(addr::IA32_PERFEVTSEL0 + u32::from(n), s.evtsel),
                Counter::Fixed(n) => {
                    self.fixed_ctrl |= s.fixed_bits << (4 * u32::from(n));
                    if s.pebs && baseline {
                        self.fixed_ctrl |= 1 << (32 + 4 * u32::from(n)); // ICL_FIXED_0_ADAPTIVE
                    }
                }
            }
            self.global_ctrl |= s.counter.global_bit();
        }
        if let Some(n) = self.aux {
            let sel = u64::from(models::MEM_LOADS_AUX_EVENT) | EVTSEL_USR | EVTSEL_OS | EVTSEL_EN;
            self.write_period(hw, Counter::Gp(n), self.max_period(Counter::Gp(n)));
            hw.write(addr::IA32_PERFEVTSEL0 + u32::from(n), sel);
            self.global_ctrl |= Counter::Gp(n).global_bit();
        }
        if self.info.version >= 2 {
            hw.write(addr::IA32_FIXED_CTR_CTRL, self.fixed_ctrl);
        }
        // Never freeze perfmon on PMI; freeze the LBRs (except in call-stack
        // mode, which the LBR driver handles).
        let dc = hw.read(addr::IA32_DEBUGCTL);
        if dc & debugctl::FREEZE_PERFMON_ON_PMI != 0 {
            hw.write(addr::IA32_DEBUGCTL, dc & !debugctl::FREEZE_PERFMON_ON_PMI);
        }
        self.lbr_on = false;
        if let Some(cfg) = opts.lbr {
            let lbr = self.lbr.as_mut().ok_or(PmuError::LbrUnavailable)?;
            lbr.enable(hw, cfg, true);
            self.lbr_on = true;
        }
        hw.write_lvt_pmi(LVT_PMI_NMI);
        Ok(())
    }

    fn setup_pebs(
        &mut self,
        hw: &mut impl PmuHw,
        mem: &mut DsMemory<'_>,
        enc: &[Option<(events::Encoding, bool)>; MAX_EVENTS],
        opts: &IntelOptions,
    ) -> Result<(), PmuError> {
        let format = self.info.pebs_format.ok_or(PmuError::PebsUnavailable)?;
        // Format 4 and later use the adaptive layout; its groups beyond the
        // basic one exist only with PEBS baseline.
        let adaptive = format >= 4;
        let baseline = adaptive && self.info.pebs_baseline;
        let mut data_cfg = 0u64;
        let mut ld_lat = false;
        self.pebs_enable = 0;
        for (slot, en) in self.slots.iter().zip(enc.iter()).take(self.n) {
            let (Some(s), Some((e, true))) = (*slot, *en) else {
                continue;
            };
            self.pebs_enable |= s.counter.global_bit();
            let Counter::Gp(n) = s.counter else { continue };
            if e.mem == MemEvent::Load {
                ld_lat = true;
                // LL_EN_PMCn, below perfmon version 5 (Linux's
                // intel_pmu_pebs_enable keys it on the version).
                if self.info.version < 5 {
                    self.pebs_enable |= 1 << (32 + u32::from(n));
                }
            } else if e.mem == MemEvent::Store
                && self.row.store_kind() == sampler::pebs::MemKind::Store
            {
                // PS_ENABLE: Sandy Bridge's precise-store facility
                // (Linux's PERF_X86_EVENT_PEBS_ST).
                self.pebs_enable |= 1 << 63;
            }
            if e.mem != MemEvent::None {
                data_cfg |= DATA_CFG_MEMINFO;
            }
        }
        let lbr_entries = match (&self.lbr, opts.lbr) {
            (Some(l), Some(_)) if baseline => l.depth() as u64,
            _ => 0,
        };
        if baseline {
            data_cfg |= DATA_CFG_GPRS;
            if opts.pebs_xmm {
                data_cfg |= DATA_CFG_XMMS;
            }
            if lbr_entries > 0 {
                data_cfg |= DATA_CFG_LBRS | (lbr_entries - 1) << 24;
            }
            hw.write(addr::MSR_PEBS_DATA_CFG, data_cfg);
        } else {
            data_cfg = 0;
        }
        let record_size = if adaptive {
            adaptive_size(data_cfg)
        } else {
            fixed_size(format)
        };
        // Core 2 errata: the buffer must stay within one page.
        let usable = if self.row.pebs_quirks.one_page {
            let base = mem.pebs_addr() as usize;
            let to_page_end = 4096 - base % 4096;
            mem.pebs.len().min(to_page_end)
        } else {
            mem.pebs.len()
        };
        if usable < 2 * record_size {
            return Err(PmuError::BadDsMemory);
        }
        let capacity = usable / record_size;
        // Large PEBS keeps room above the threshold for one record per
        // PEBS-capable counter: each may add a record between the threshold
        // PMI and the handler (Linux reserves max_pebs_events + fixed).
        let reserve = usize::from(self.info.gp_counters)
            + if baseline {
                usize::from(self.info.fixed_counters())
            } else {
                0
            };
        // Large PEBS only when every PEBS event has a fixed period and nothing
        // in the sample is taken at PMI time (fixed formats carry no LBR).
        let all_fixed_period = (0..self.n)
            .filter_map(|i| self.slots[i])
            .filter(|s| s.pebs)
            .all(|s| matches!(s.mode, SampleMode::Period(_)));
        let large = opts.large_pebs
            && all_fixed_period
            && (baseline || opts.lbr.is_none())
            && capacity > reserve + 1;
        let base = mem.pebs_addr();
        let area = mem.area;
        area.pebs_base.store(base, Ordering::Release);
        area.pebs_index.store(base, Ordering::Release);
        area.pebs_max
            .store(base + (capacity * record_size) as u64, Ordering::Release);
        let threshold_records = if large { capacity - reserve } else { 1 };
        area.pebs_threshold.store(
            base + (threshold_records * record_size) as u64,
            Ordering::Release,
        );
        for r in &area.pebs_reset {
            r.store(0, Ordering::Release);
        }
        for i in 0..self.n {
            let Some(s) = self.slots[i] else { continue };
            if s.pebs && large {
                let width = match s.counter {
                    Counter::Gp(_) => self.info.gp_width,
                    Counter::Fixed(_) => self.info.fixed_width,
                };
                let reload = s.period.wrapping_neg() & width_mask(width);
                area.reset_slot(s.counter, format)
                    .store(reload, Ordering::Release);
            }
        }
        hw.write(addr::IA32_DS_AREA, mem.area_addr());
        if ld_lat && self.row.ld_lat_event.is_some() {
            hw.write(addr::MSR_PEBS_LD_LAT_THRESHOLD, 3);
        }
        self.pebs = Some(PebsSetup {
            format,
            record_size,
            data_cfg,
            large,
            lbr_in_record: data_cfg & DATA_CFG_LBRS != 0,
        });
        Ok(())
    }

    fn write_period(&self, hw: &mut impl Msr, counter: Counter, period: u64) {
        match counter {
            Counter::Gp(n) => {
                let v = period.wrapping_neg() & width_mask(self.info.gp_width);
                if self.info.full_width_write() {
                    hw.write(addr::IA32_A_PMC0 + u32::from(n), v);
                } else {
                    // Bits 31:0 are written and bit 31 is sign-extended, so
                    // -period arrives intact for periods below 2^31.
                    hw.write(addr::IA32_PMC0 + u32::from(n), v & 0xFFFF_FFFF);
                }
            }
            Counter::Fixed(n) => {
                let v = period.wrapping_neg() & width_mask(self.info.fixed_width);
                hw.write(addr::IA32_FIXED_CTR0 + u32::from(n), v);
            }
        }
    }

    /// Read a counter's raw value.
    pub fn read_counter(&self, hw: &mut impl Msr, counter: Counter) -> u64 {
        match counter {
            Counter::Gp(n) => hw.read(addr::IA32_PMC0 + u32::from(n)),
            Counter::Fixed(n) => hw.read(addr::IA32_FIXED_CTR0 + u32::from(n)),
        }
    }

    /// Events counted by event `i` since its counter was last loaded with
    /// -period (at configure time or at its last overflow). The self-check
    /// uses it to see whether counters advance.
    pub fn events_since_reload(&self, hw: &mut impl Msr, i: usize) -> Option<u64> {
        let s = self.slots.get(i).copied().flatten()?;
        let width = match s.counter {
            Counter::Gp(_) => self.info.gp_width,
            Counter::Fixed(_) => self.info.fixed_width,
        };
        let mask = width_mask(width);
        let start = s.period.wrapping_neg() & mask;
        Some(self.read_counter(hw, s.counter).wrapping_sub(start) & mask)
    }

    /// Start counting.
    pub fn start(&mut self, hw: &mut impl PmuHw) {
        if self.row.reset_on_enable && self.info.version >= 2 {
            self.nhm_reset(hw);
        }
        if self.pebs.is_some() {
            hw.write(addr::IA32_PEBS_ENABLE, self.pebs_enable);
        }
        self.enable_all(hw);
    }

    /// Nehalem's and Westmere's counter reset when events are added
    /// (errata AAK100, AAP53, BD53), as Linux's `intel_pmu_nhm_workaround`:
    /// the magic events on PMC0-3 from zero, enabled and disabled at once;
    /// then each counter gets its own event and period back (or is
    /// cleared). Counting is off (GLOBAL_CTRL 0) when it is called.
    fn nhm_reset(&mut self, hw: &mut impl PmuHw) {
        for (i, &magic) in models::NHM_MAGIC_EVENTS.iter().enumerate() {
            hw.write(addr::IA32_PERFEVTSEL0 + i as u32, magic);
            hw.write(addr::IA32_PMC0 + i as u32, 0);
        }
        hw.write(addr::IA32_PERF_GLOBAL_CTRL, 0xF);
        hw.write(addr::IA32_PERF_GLOBAL_CTRL, 0);
        for i in 0..models::NHM_MAGIC_EVENTS.len() as u8 {
            let mine = self.slots[..self.n]
                .iter()
                .flatten()
                .find(|s| s.counter == Counter::Gp(i))
                .copied();
            match mine {
                Some(s) => {
                    hw.write(addr::IA32_PERFEVTSEL0 + u32::from(i), s.evtsel);
                    self.write_period(hw, s.counter, s.period);
                }
                None => {
                    hw.write(addr::IA32_PERFEVTSEL0 + u32::from(i), 0);
                    hw.write(addr::IA32_PMC0 + u32::from(i), 0);
                }
            }
        }
    }

    fn enable_all(&mut self, hw: &mut impl PmuHw) {
        if self.info.version >= 2 {
            hw.write(addr::IA32_PERF_GLOBAL_CTRL, self.global_ctrl);
        } else {
            for i in 0..self.n {
                if let Some(Slot {
                    counter: Counter::Gp(n),
                    evtsel,
                    ..
                }) = self.slots[i]
                {
                    hw.write(addr::IA32_PERFEVTSEL0 + u32::from(n), evtsel);
                }
            }
        }
    }

    fn disable_all(&mut self, hw: &mut impl PmuHw) {
        if self.info.version >= 2 {
            hw.write(addr::IA32_PERF_GLOBAL_CTRL, 0);
        } else {
            for i in 0..self.n {
                if let Some(Slot {
                    counter: Counter::Gp(n),
                    evtsel,
                    ..
                }) = self.slots[i]
                {
                    hw.write(addr::IA32_PERFEVTSEL0 + u32::from(n), evtsel & !EVTSEL_EN);
                }
            }
        }
    }

    /// Stop counting (PEBS off too).
    pub fn stop(&mut self, hw: &mut impl PmuHw) {
        self.disable_all(hw);
        if self.pebs.is_some() {
            hw.write(addr::IA32_PEBS_ENABLE, 0);
        }
    }

    /// Handle a PMI. `tsc` is the time of the NMI (for frequency mode).
    /// Calls `out` once per overflow and once per counter a PEBS record
    /// applies to. Allocation-free, lock-free and bounded: at most
    /// [`MAX_PMI_LOOPS`] passes over GLOBAL_STATUS, each over the fixed
    /// slot table and the (bounded) PEBS buffer.
    pub fn handle_pmi(
        &mut self,
        hw: &mut impl PmuHw,
        mut mem: Option<&mut DsMemory<'_>>,
        tsc: u64,
        out: &mut impl FnMut(Overflow<'_>),
    ) -> PmiSummary {
        let mut sum = PmiSummary::default();
        let v2 = self.info.version >= 2;
        let ack = if v2 { self.row.ack } else { PmiAck::Early };
        if ack == PmiAck::Early {
            hw.write_lvt_pmi(LVT_PMI_NMI);
        }
        self.disable_all(hw);
        let mut status = if v2 {
            hw.read(addr::IA32_PERF_GLOBAL_STATUS)
        } else {
            self.v1_status(hw)
        };
        let lbr_format = self.lbr_format();
        let mut lbr_buf = [RawBranch::default(); super::lbr::MAX_LBR];
        let mut lbr_len = 0;
        if self.lbr_on
            && let Some(l) = self.lbr.as_mut()
        {
            let e = l.read(hw);
            lbr_len = e.len();
            lbr_buf[..lbr_len].copy_from_slice(e);
        }
        let lbr = &lbr_buf[..lbr_len];
        // v2/v3 have no freeze bits in GLOBAL_STATUS to acknowledge.
        let clear_mask = if self.info.version >= 4 {
            u64::MAX
        } else {
            !(STATUS_CTR_FRZ | STATUS_LBR_FRZ)
        };
        let mut loops = 0;
        loop {
            // Acknowledge before handling, so that an overflow that lands
            // while this pass runs stays set for the next one.
            if v2 && status & clear_mask != 0 {
                hw.write(addr::IA32_PERF_GLOBAL_OVF_CTRL, status & clear_mask);
            }
            self.handle_status(
                hw,
                mem.as_deref_mut(),
                status,
                tsc,
                lbr,
                lbr_format,
                &mut sum,
                out,
            );
            if !v2 {
                break;
            }
            loops += 1;
            if loops >= MAX_PMI_LOOPS {
                // Stuck: start every counter over (Linux intel_pmu_reset).
                self.reload_all(hw);
                let st = hw.read(addr::IA32_PERF_GLOBAL_STATUS) & clear_mask;
                if st != 0 {
                    hw.write(addr::IA32_PERF_GLOBAL_OVF_CTRL, st);
                }
                break;
            }
            status = hw.read(addr::IA32_PERF_GLOBAL_STATUS);
            if status & clear_mask == 0 {
                break;
            }
        }
        if sum.overflows == 0 && sum.pebs_records == 0 && sum.pebs_lost == 0 {
            sum.spurious = true;
        }
        if self.lbr_on
            && self.info.version < 4
            && let Some(l) = self.lbr.as_mut()
            && l.freezes_on_pmi()
        {
            l.thaw_legacy(hw);
        }
        if ack == PmiAck::Mid {
            hw.write_lvt_pmi(LVT_PMI_NMI);
        }
        self.enable_all(hw);
        if ack == PmiAck::Late {
            hw.write_lvt_pmi(LVT_PMI_NMI);
        }
        sum
    }

    /// One pass of the PMI handler over `status`: drain PEBS, count PEBS
    /// records lost to a full buffer, report and reload the other overflows.
    #[allow(clippy::too_many_arguments)]
    fn handle_status(
        &mut self,
        hw: &mut impl PmuHw,
        mem: Option<&mut DsMemory<'_>>,
        status: u64,
        tsc: u64,
        lbr: &[RawBranch],
        lbr_format: LbrRawFormat,
        sum: &mut PmiSummary,
        out: &mut impl FnMut(Overflow<'_>),
    ) {
        if let (Some(p), Some(m)) = (self.pebs, mem) {
            let filled = m.pebs_filled();
            let max = DsArea::get(&m.area.pebs_max).saturating_sub(m.pebs_addr()) as usize;
            // Full: the records that did not fit were not written and their
            // counters were not reloaded; they wrapped and show the overflow.
            if filled + p.record_size > max {
                self.count_full_buffer_losses(hw, status, sum);
            }
            if filled > 0 {
                let wrote = self.drain_pebs(p, m, filled, lbr, lbr_format, sum, out);
                m.area.pebs_index.store(m.pebs_addr(), Ordering::Release);
                // Without auto-reload the counters that wrote a record were
                // loaded from their (zero) DS reset slots: start their next
                // period. The others keep counting.
                if !p.large {
                    for i in 0..self.n {
                        if let Some(s) = self.slots[i].filter(|s| s.pebs)
                            && wrote & s.counter.global_bit() != 0
                        {
                            self.write_period(hw, s.counter, s.period);
                        }
                    }
                }
            }
        }
        // Ordinary overflows.
        for i in 0..self.n {
            let Some(mut s) = self.slots[i] else { continue };
            if s.pebs || status & s.counter.global_bit() == 0 {
                continue;
            }
            out(Overflow {
                event: i,
                period: s.period,
                pebs: None,
                pebs_format: 0,
                lbr,
                lbr_format,
            });
            sum.overflows += 1;
            if let SampleMode::Frequency { hz, tsc_hz } = s.mode {
                if s.last_tsc != 0 {
                    let max = self.max_period(s.counter);
                    s.period = super::next_frequency_period(
                        s.period,
                        tsc.wrapping_sub(s.last_tsc),
                        hz,
                        tsc_hz,
                        max,
                    )
                    .max(s.min_period)
                        & !(s.period_align - 1);
                }
                s.last_tsc = tsc;
                self.slots[i] = Some(s);
            }
            self.write_period(hw, s.counter, s.period);
        }
    }

    /// PEBS counters that overflowed into a full buffer: each has counted
    /// (from 0, not reloaded) the events since its first lost record, so it
    /// lost one record plus one per further period. Counted as lost, then
    /// reloaded.
    fn count_full_buffer_losses(&self, hw: &mut impl PmuHw, status: u64, sum: &mut PmiSummary) {
        for i in 0..self.n {
            let Some(s) = self.slots[i].filter(|s| s.pebs) else {
                continue;
            };
            if status & s.counter.global_bit() == 0 {
                continue;
            }
            let width = match s.counter {
                Counter::Gp(_) => self.info.gp_width,
                Counter::Fixed(_) => self.info.fixed_width,
            };
            let since = self.read_counter(hw, s.counter) & width_mask(width);
            let lost = 1 + since / s.period.max(1);
            sum.pebs_lost = sum
                .pebs_lost
                .saturating_add(lost.min(u64::from(u32::MAX)) as u32);
            self.write_period(hw, s.counter, s.period);
        }
    }

    /// Load every configured counter with its period again.
    fn reload_all(&self, hw: &mut impl PmuHw) {
        for i in 0..self.n {
            if let Some(s) = self.slots[i] {
                self.write_period(hw, s.counter, s.period);
            }
        }
    }

    /// Drain the PEBS records still below the threshold (before stopping or
    /// reconfiguring, so large PEBS loses nothing). Counters keep their state.
    pub fn flush_pebs(
        &mut self,
        mem: &mut DsMemory<'_>,
        out: &mut impl FnMut(Overflow<'_>),
    ) -> PmiSummary {
        let mut sum = PmiSummary::default();
        if let Some(p) = self.pebs {
            let filled = mem.pebs_filled();
            if filled > 0 {
                let _ = self.drain_pebs(p, mem, filled, &[], LbrRawFormat::None, &mut sum, out);
                mem.area
                    .pebs_index
                    .store(mem.pebs_addr(), Ordering::Release);
            }
        }
        sum
    }

    /// v1 has no GLOBAL_STATUS: a counter programmed to -period has
    /// overflowed once its top bit is clear.
    fn v1_status(&self, hw: &mut impl Msr) -> u64 {
        let top = 1u64 << (self.info.gp_width.max(1) - 1);
        let mut st = 0;
        for i in 0..self.n {
            if let Some(Slot {
                counter: c @ Counter::Gp(_),
                ..
            }) = self.slots[i]
                && self.read_counter(hw, c) & top == 0
            {
                st |= c.global_bit();
            }
        }
        st
    }

    #[allow(clippy::too_many_arguments)]
    fn drain_pebs(
        &self,
        p: PebsSetup,
        mem: &DsMemory<'_>,
        filled: usize,
        lbr: &[RawBranch],
        lbr_format: LbrRawFormat,
        sum: &mut PmiSummary,
        out: &mut impl FnMut(Overflow<'_>),
    ) -> u64 {
        let adaptive = p.format >= 4;
        let mut wrote = 0u64;
        let buf = &mem.pebs[..filled];
        let mut off = 0;
        // Find the last record first, so only it carries the PMI-time LBR.
        let mut last_start = 0;
        {
            let mut o = 0;
            while o < filled {
                let size = if adaptive {
                    record_size_field(&buf[o..]).unwrap_or(p.record_size)
                } else {
                    p.record_size
                };
                if size == 0 || o + size > filled {
                    break;
                }
                last_start = o;
                o += size;
            }
        }
        let counters_mask = if adaptive { 0xF_FFFF_FFFF } else { 0xFFFF_FFFF };
        let pebs_counters = self.pebs_enable & counters_mask;
        while off < filled {
            let rest = &buf[off..];
            let size = if adaptive {
                match record_size_field(rest) {
                    Some(s) if s > 0 => s,
                    _ => {
                        sum.pebs_lost += 1;
                        break;
                    }
                }
            } else {
                p.record_size
            };
            if off + size > filled {
                sum.pebs_lost += 1;
                break;
            }
            let rec = &rest[..size];
            let start = off;
            off += size;
            if adaptive && size != p.record_size {
                // Not the layout programmed: unusable, but its counters were
                // reloaded all the same.
                wrote |= read_u64(rec, 16) & pebs_counters;
                sum.pebs_lost += 1;
                continue;
            }
            let mut applicable = match p.format {
                0 => pebs_counters,
                1..=3 => read_u64(rec, 144),
                _ => read_u64(rec, 16),
            } & pebs_counters;
            // Formats 1 and 2: the status field can race with the clearing of
            // GLOBAL_STATUS and read 0; with a single PEBS event the record
            // is that event's.
            if applicable == 0 && matches!(p.format, 1 | 2) && pebs_counters.count_ones() == 1 {
                applicable = pebs_counters;
            }
            if applicable == 0 {
                sum.pebs_lost += 1;
                continue;
            }
            wrote |= applicable;
            if p.format <= 2 && applicable.count_ones() > 1 {
                // Formats 1-2: several PEBS events completed in the same
                // record and the status cannot tell which one caused it: a
                // collision, each one a lost sample.
                sum.pebs_lost += applicable.count_ones();
                continue;
            }
            // From format 3 on (and in adaptive PEBS) the status is exact:
            // the record belongs to every counter it names.
            let (l, lf) = if p.lbr_in_record {
                // The entries are in the record, encoded as the CPU's LBR
                // (legacy LBR_INFO on Ice Lake / Tiger Lake, arch LBR later).
                (
                    &[][..],
                    self.lbr
                        .as_ref()
                        .map_or(LbrRawFormat::None, |l| l.raw_format()),
                )
            } else if !adaptive && start == last_start {
                (lbr, lbr_format)
            } else {
                (&[][..], LbrRawFormat::None)
            };
            let mut delivered = false;
            let mut bits = applicable;
            while bits != 0 {
                let bit = bits & bits.wrapping_neg();
                bits &= bits - 1;
                let Some(i) = (0..self.n).find(|&i| {
                    self.slots[i].is_some_and(|s| s.pebs && s.counter.global_bit() == bit)
                }) else {
                    sum.pebs_lost += 1;
                    continue;
                };
                let period = self.slots[i].map_or(0, |s| s.period);
                out(Overflow {
                    event: i,
                    period,
                    pebs: Some(rec),
                    pebs_format: p.format,
                    lbr: l,
                    lbr_format: lf,
                });
                sum.overflows += 1;
                delivered = true;
            }
            if delivered {
                sum.pebs_records += 1;
            }
        }
        wrote
    }

    /// Read the DS area fields (for diagnostics).
    pub fn ds_index(mem: &DsMemory<'_>) -> (u64, u64) {
        (
            DsArea::get(&mem.area.pebs_base),
            DsArea::get(&mem.area.pebs_index),
        )
    }

    /// The PEBS format number that was refused as unknown, if any.
    pub fn pebs_refused_format(&self) -> Option<u8> {
        self.pebs_disabled_reason
    }
}

fn read_u64(b: &[u8], off: usize) -> u64 {
    let mut w = [0u8; 8];
    if let Some(s) = b.get(off..off + 8) {
        w.copy_from_slice(s);
    }
    u64::from_le_bytes(w)
}

fn record_size_field(rec: &[u8]) -> Option<usize> {
    (rec.len() >= 8).then(|| (read_u64(rec, 0) >> 48) as usize)
}

/// PEBS_DATA_CFG: memory-info group.
pub const DATA_CFG_MEMINFO: u64 = 1 << 0;
/// PEBS_DATA_CFG: GPR group.
pub const DATA_CFG_GPRS: u64 = 1 << 1;
/// PEBS_DATA_CFG: XMM group.
pub const DATA_CFG_XMMS: u64 = 1 << 2;
/// PEBS_DATA_CFG: LBR group (entries - 1 in bits 31:24).
pub const DATA_CFG_LBRS: u64 = 1 << 3;

/// Size of a fixed-format PEBS record (SDM PEBS record format tables).
pub fn fixed_size(format: u8) -> usize {
    match format {
        0 => 144,
        1 => 176,
        2 => 192,
        _ => 200,
    }
}

/// Size of an adaptive record under `cfg`.
pub fn adaptive_size(cfg: u64) -> usize {
    let lbr = if cfg & DATA_CFG_LBRS != 0 {
        ((cfg >> 24) & 0xFF) as usize + 1
    } else {
        0
    };
    32 + if cfg & DATA_CFG_MEMINFO != 0 { 32 } else { 0 }
        + if cfg & DATA_CFG_GPRS != 0 { 144 } else { 0 }
        + if cfg & DATA_CFG_XMMS != 0 { 256 } else { 0 }
        + 24 * lbr
}

/// Formats the record decoder knows (0-3 fixed, 4-6 adaptive).
fn sampler_known_format(f: u8) -> Option<u8> {
    (f <= 6).then_some(f)
}

/// Put the event `i` (an index into `masks`, its allowed GP counters) on a
/// GP counter: its lowest free allowed counter, else one freed by moving
/// placed events to other counters they allow (`owner`: the event on each
/// counter; `used`: the counters taken). False when no assignment of the
/// placed events and `i` exists.
fn place_gp(
    i: usize,
    masks: &[u32; MAX_EVENTS + 1],
    owner: &mut [Option<usize>; 32],
    used: &mut u32,
) -> bool {
    let free = masks[i] & !*used;
    let n = if free != 0 {
        free.trailing_zeros() as usize
    } else {
        let mut seen = 0u32;
        match augment(i, masks, owner, &mut seen) {
            Some(n) => n,
            None => return false,
        }
    };
    owner[n] = Some(i);
    // The path may end on a counter that was free.
    *used = owner
        .iter()
        .enumerate()
        .filter(|(_, o)| o.is_some())
        .fold(0, |u, (k, _)| u | 1 << k);
    true
}

/// An augmenting path for event `i` through the counters not in `seen`:
/// moves the events along it and returns the counter left for `i`.
fn augment(
    i: usize,
    masks: &[u32; MAX_EVENTS + 1],
    owner: &mut [Option<usize>; 32],
    seen: &mut u32,
) -> Option<usize> {
    let mut m = masks[i] & !*seen;
    while m != 0 {
        let n = m.trailing_zeros() as usize;
        m &= m - 1;
        *seen |= 1 << n;
        match owner[n] {
            None => return Some(n),
            Some(j) => {
                if let Some(k) = augment(j, masks, owner, seen) {
                    owner[k] = Some(j);
                    return Some(n);
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assign(masks: &[u32]) -> Option<[Option<usize>; 32]> {
        let mut m = [0u32; MAX_EVENTS + 1];
        m[..masks.len()].copy_from_slice(masks);
        let mut owner = [None; 32];
        let mut used = 0;
        for i in 0..masks.len() {
            if !place_gp(i, &m, &mut owner, &mut used) {
                return None;
            }
        }
        Some(owner)
    }

    #[test]
    fn gp_assignment_moves_placed_events_when_needed() {
        // `o[n]`: the event on PMCn. Lowest free counter first.
        let o = assign(&[0xF, 0x4, 0xF]).unwrap();
        assert_eq!(o[..4], [Some(0), Some(2), Some(1), None]);
        // PMC0-1, PMC1-2, PMC0-1: the first two move up for the third.
        let o = assign(&[0x3, 0x6, 0x3]).unwrap();
        assert_eq!(o[..3], [Some(2), Some(0), Some(1)]);
        // A chain of two moves.
        let o = assign(&[0x1 | 0x2, 0x2 | 0x4, 0x4 | 0x8, 0x1]).unwrap();
        assert_eq!(o[..4], [Some(3), Some(0), Some(1), Some(2)]);
        // Three events for two counters.
        assert!(assign(&[0x3, 0x3, 0x3]).is_none());
        assert!(assign(&[0x4, 0x4]).is_none());
    }
}
