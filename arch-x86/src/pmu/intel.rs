//! Intel architectural performance monitoring, versions 1 to 5 (SDM vol. 3
//! "Architectural Performance Monitoring"), with PEBS through the DS area and
//! the LBR stack.
//!
//! Counter assignment honours constraints (fixed counters for instructions,
//! cycles and ref-cycles; PEBS only on general-purpose counters, PMC0 only on
//! format 0). The PMI handler disables the counters, snapshots the LBR, drains
//! PEBS records one `Overflow` per record, reports the other overflows,
//! reloads periods, clears GLOBAL_STATUS (OVF_CTRL, or STATUS_RESET with the
//! freeze bits on v4+), re-arms the LVT entry and re-enables the counters.

use super::ds::{DsArea, DsMemory};
use super::events::{self, MemEvent};
use super::lbr::{LbrConfig, LbrDriver, LbrRawFormat, RawBranch};
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
    /// Freeze counters (and LBRs) on PMI.
    pub freeze_on_pmi: bool,
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
}

#[derive(Debug, Clone, Copy)]
struct PebsSetup {
    format: u8,
    record_size: usize,
    data_cfg: u64,
    large: bool,
}

/// The Intel PMU driver for one CPU.
#[derive(Debug)]
pub struct IntelPmu {
    info: PmuInfo,
    slots: [Option<Slot>; MAX_EVENTS],
    n: usize,
    global_ctrl: u64,
    fixed_ctrl: u64,
    pebs_enable: u64,
    pebs: Option<PebsSetup>,
    lbr: Option<LbrDriver>,
    lbr_on: bool,
    freeze: bool,
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
        Ok(IntelPmu {
            info: *info,
            slots: [None; MAX_EVENTS],
            n: 0,
            global_ctrl: 0,
            fixed_ctrl: 0,
            pebs_enable: 0,
            pebs: None,
            lbr: LbrDriver::new(info.lbr),
            lbr_on: false,
            freeze: false,
            pebs_disabled_reason: None,
        })
    }

    /// The PMU this driver was built for.
    pub fn info(&self) -> &PmuInfo {
        &self.info
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
        if events_in.len() > MAX_EVENTS {
            return Err(PmuError::NoCounter { event: MAX_EVENTS });
        }
        // Encodings and constraints.
        let mut enc = [None; MAX_EVENTS];
        let mut any_pebs = false;
        for (i, ev) in events_in.iter().enumerate() {
            let e = events::encode(ev.event.kind, self.info.vendor)
                .ok_or(PmuError::EventUnavailable { event: i })?;
            if let Some(bit) = events::arch_event_bit(ev.event.kind)
                && self.info.events_unavailable & (1 << bit) != 0
            {
                return Err(PmuError::EventUnavailable { event: i });
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
        let gp_mask_of = |i: usize| -> u32 {
            let Some((e, pebs)) = enc[i] else { return 0 };
            let mut m = e.gp_mask & gp_all;
            if pebs && self.info.pebs_format == Some(0) {
                m &= 1; // Core 2: PEBS on PMC0 only
            }
            m
        };
        let fixed_pebs = self.info.pebs_baseline && self.info.pebs_format.is_some_and(|f| f >= 4);
        order[..events_in.len()].sort_unstable_by_key(|&i| (gp_mask_of(i).count_ones(), i));
        for &i in &order[..events_in.len()] {
            let (e, pebs) = enc[i].ok_or(PmuError::EventUnavailable { event: i })?;
            let ev = &events_in[i];
            let mut counter = None;
            // Adaptive PEBS (format 4+) can also sample fixed counters.
            if let Some(f) = e.fixed
                && (!pebs || fixed_pebs)
                && self.info.fixed_mask & (1 << f) != 0
                && fixed_used & (1 << f) == 0
            {
                fixed_used |= 1 << f;
                counter = Some(Counter::Fixed(f));
            }
            if counter.is_none() {
                let free = gp_mask_of(i) & !gp_used;
                if free == 0 {
                    return Err(PmuError::NoCounter { event: i });
                }
                let n = free.trailing_zeros() as u8;
                gp_used |= 1 << n;
                counter = Some(Counter::Gp(n));
            }
            let counter = counter.ok_or(PmuError::NoCounter { event: i })?;
            let period = match ev.mode {
                SampleMode::Period(p) => p,
                SampleMode::Frequency { .. } => FREQ_START_PERIOD,
            };
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
            // PEBS events do not interrupt on overflow; the buffer threshold does.
            let evtsel = if pebs { evtsel & !EVTSEL_INT } else { evtsel };
            self.slots[i] = Some(Slot {
                counter,
                evtsel,
                fixed_bits,
                period,
                mode: ev.mode,
                pebs,
                last_tsc: 0,
            });
            let _ = e.mem;
        }
        self.n = events_in.len();
        // PEBS setup.
        if any_pebs {
            let mem = mem.ok_or(PmuError::BadDsMemory)?;
            self.setup_pebs(hw, mem, events_in, &enc, opts)?;
        }
        // Program counters, stopped.
        self.global_ctrl = 0;
        self.fixed_ctrl = 0;
        for i in 0..self.n {
            let Some(s) = self.slots[i] else { continue };
            self.write_period(hw, s.counter, s.period);
            match s.counter {
                Counter::Gp(n) => hw.write(addr::IA32_PERFEVTSEL0 + u32::from(n), s.evtsel),
                Counter::Fixed(n) => self.fixed_ctrl |= s.fixed_bits << (4 * u32::from(n)),
            }
            self.global_ctrl |= s.counter.global_bit();
        }
        if self.info.version >= 2 {
            hw.write(addr::IA32_FIXED_CTR_CTRL, self.fixed_ctrl);
        }
        // Freeze on PMI and LBR.
        self.freeze = opts.freeze_on_pmi && self.info.version >= 2;
        let dc = hw.read(addr::IA32_DEBUGCTL) & !debugctl::FREEZE_PERFMON_ON_PMI;
        hw.write(
            addr::IA32_DEBUGCTL,
            dc | if self.freeze {
                debugctl::FREEZE_PERFMON_ON_PMI
            } else {
                0
            },
        );
        self.lbr_on = false;
        if let Some(cfg) = opts.lbr {
            let lbr = self.lbr.as_mut().ok_or(PmuError::LbrUnavailable)?;
            lbr.enable(hw, cfg, opts.freeze_on_pmi);
            self.lbr_on = true;
        }
        hw.write_lvt_pmi(LVT_PMI_NMI);
        Ok(())
    }

    fn setup_pebs(
        &mut self,
        hw: &mut impl PmuHw,
        mem: &mut DsMemory<'_>,
        events_in: &[EventConfig],
        enc: &[Option<(events::Encoding, bool)>; MAX_EVENTS],
        opts: &IntelOptions,
    ) -> Result<(), PmuError> {
        let format = self.info.pebs_format.ok_or(PmuError::PebsUnavailable)?;
        let adaptive = format >= 4 && self.info.pebs_baseline;
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
                if format < 4 {
                    self.pebs_enable |= 1 << (32 + u32::from(n)); // LL_EN_PMCn
                }
            }
            if e.mem != MemEvent::None {
                data_cfg |= DATA_CFG_MEMINFO;
            }
        }
        let lbr_entries = match (&self.lbr, opts.lbr) {
            (Some(l), Some(_)) if adaptive => l.depth() as u64,
            _ => 0,
        };
        if adaptive {
            data_cfg |= DATA_CFG_GPRS;
            if opts.pebs_xmm {
                data_cfg |= DATA_CFG_XMMS;
            }
            if lbr_entries > 0 {
                data_cfg |= DATA_CFG_LBRS | (lbr_entries - 1) << 24;
            }
            hw.write(addr::MSR_PEBS_DATA_CFG, data_cfg);
        }
        let record_size = if adaptive {
            adaptive_size(data_cfg)
        } else {
            fixed_size(format)
        };
        if mem.pebs.len() < 2 * record_size {
            return Err(PmuError::BadDsMemory);
        }
        // Large PEBS only when every PEBS event has a fixed period and nothing
        // in the sample is taken at PMI time (fixed formats carry no LBR).
        let all_fixed_period = (0..self.n)
            .filter_map(|i| self.slots[i])
            .filter(|s| s.pebs)
            .all(|s| matches!(s.mode, SampleMode::Period(_)));
        let large = opts.large_pebs && all_fixed_period && (adaptive || opts.lbr.is_none());
        let base = mem.pebs_addr();
        let capacity = mem.pebs.len() / record_size;
        let area = mem.area;
        area.pebs_base.store(base, Ordering::Release);
        area.pebs_index.store(base, Ordering::Release);
        area.pebs_max
            .store(base + (capacity * record_size) as u64, Ordering::Release);
        let threshold_records = if large { capacity - 1 } else { 1 };
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
                area.reset_slot(s.counter).store(reload, Ordering::Release);
            }
        }
        hw.write(addr::IA32_DS_AREA, mem.area_addr());
        if ld_lat {
            hw.write(addr::MSR_PEBS_LD_LAT_THRESHOLD, 3);
        }
        let _ = events_in;
        self.pebs = Some(PebsSetup {
            format,
            record_size,
            data_cfg,
            large,
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
        if self.pebs.is_some() {
            hw.write(addr::IA32_PEBS_ENABLE, self.pebs_enable);
        }
        self.enable_all(hw);
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
    /// Calls `out` once per overflow and once per PEBS record.
    pub fn handle_pmi(
        &mut self,
        hw: &mut impl PmuHw,
        mem: Option<&mut DsMemory<'_>>,
        tsc: u64,
        out: &mut impl FnMut(Overflow<'_>),
    ) -> PmiSummary {
        let mut sum = PmiSummary::default();
        self.disable_all(hw);
        let v2 = self.info.version >= 2;
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

        // PEBS: drain whatever is in the buffer.
        if let (Some(p), Some(m)) = (self.pebs, mem) {
            let filled = m.pebs_filled();
            if filled > 0 {
                self.drain_pebs(p, m, filled, lbr, lbr_format, &mut sum, out);
                m.area.pebs_index.store(m.pebs_addr(), Ordering::Release);
                if !p.large {
                    for i in 0..self.n {
                        if let Some(s) = self.slots[i].filter(|s| s.pebs) {
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
                    );
                }
                s.last_tsc = tsc;
                self.slots[i] = Some(s);
            }
            self.write_period(hw, s.counter, s.period);
        }
        if sum.overflows == 0 && sum.pebs_records == 0 && sum.pebs_lost == 0 {
            sum.spurious = true;
        }
        // Clear what was handled, including the freeze bits, then thaw.
        if v2 {
            let clear_mask = if self.info.version >= 4 {
                u64::MAX
            } else {
                !(STATUS_CTR_FRZ | STATUS_LBR_FRZ)
            };
            status &= clear_mask;
            if status != 0 {
                hw.write(addr::IA32_PERF_GLOBAL_OVF_CTRL, status);
            }
        }
        if self.lbr_on
            && self.info.version < 4
            && let Some(l) = self.lbr.as_mut()
            && l.freezes_on_pmi()
        {
            l.thaw_legacy(hw);
        }
        hw.write_lvt_pmi(LVT_PMI_NMI);
        self.enable_all(hw);
        sum
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
                self.drain_pebs(p, mem, filled, &[], LbrRawFormat::None, &mut sum, out);
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
    ) {
        let adaptive = p.format >= 4;
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
            off += size;
            if adaptive && size != p.record_size {
                sum.pebs_lost += 1;
                continue;
            }
            let applicable = match p.format {
                0 => self.pebs_enable & 0xFF,
                1..=3 => read_u64(rec, 144),
                _ => read_u64(rec, 16),
            } & self.pebs_enable
                & if adaptive { 0xF_FFFF_FFFF } else { 0xFFFF_FFFF };
            if applicable == 0 {
                sum.pebs_lost += 1;
                continue;
            }
            if applicable.count_ones() > 1 {
                // Several PEBS events completed in the same record: a collision,
                // which cannot be attributed; each one is a lost sample.
                sum.pebs_lost += applicable.count_ones();
                continue;
            }
            let bit = applicable;
            let Some(i) = (0..self.n)
                .find(|&i| self.slots[i].is_some_and(|s| s.pebs && s.counter.global_bit() == bit))
            else {
                sum.pebs_lost += 1;
                continue;
            };
            let period = self.slots[i].map_or(0, |s| s.period);
            let (l, lf) = if !adaptive && off - size == last_start {
                (lbr, lbr_format)
            } else {
                (&[][..], LbrRawFormat::None)
            };
            let lf = if adaptive && p.data_cfg & DATA_CFG_LBRS != 0 {
                LbrRawFormat::Arch
            } else {
                lf
            };
            out(Overflow {
                event: i,
                period,
                pebs: Some(rec),
                pebs_format: p.format,
                lbr: l,
                lbr_format: lf,
            });
            sum.pebs_records += 1;
            sum.overflows += 1;
        }
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
