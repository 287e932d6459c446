//! AMD core PMU: the four legacy PERF_CTL/PERF_CTR pairs, the six-counter
//! extended set (PerfCtrExtCore, CTL/CTR interleaved from 0xC001_0200),
//! PerfMonV2 global control and status, and LbrExtV2 branch stacks
//! (AMD APM vol. 2 "Performance Monitoring Counters"; PPR for family 19h).
//! Events go on counters they may use: family 15h restricts many events
//! to some counters ([`super::models::AMD_F15H_CONSTRAINTS`]).

use super::events::EventKind;
use super::lbr::{LbrConfig, LbrDriver, LbrRawFormat, RawBranch};
use super::models;
use super::{
    Counter, EventConfig, FREQ_START_PERIOD, LVT_PMI_NMI, Overflow, PmiSummary, PmuError, PmuHw,
    SampleMode,
};
use crate::cpuid::{PmuInfo, Vendor};
use crate::msr::{Msr, addr};

/// Most counters an AMD core has.
pub const MAX_COUNTERS: usize = 6;

const EVTSEL_USR: u64 = 1 << 16;
const EVTSEL_OS: u64 = 1 << 17;
const EVTSEL_INT: u64 = 1 << 20;
const EVTSEL_EN: u64 = 1 << 22;
const WIDTH: u64 = (1 << 48) - 1;
/// PerfCntrGlobalStatus bit 58: the LBR stack froze on a PMI (LbrFrz).
const AMD_STATUS_LBR_FRZ: u64 = 1 << 58;

#[derive(Debug, Clone, Copy)]
struct Slot {
    counter: u8,
    evtsel: u64,
    period: u64,
    mode: SampleMode,
    last_tsc: u64,
}

/// The AMD PMU driver for one CPU.
#[derive(Debug)]
pub struct AmdPmu {
    info: PmuInfo,
    slots: [Option<Slot>; MAX_COUNTERS],
    n: usize,
    lbr: Option<LbrDriver>,
    lbr_on: bool,
    /// NMIs without an overflow still claimed as late NMIs of the last
    /// handled PMI.
    late_allowance: u8,
}

/// Most late NMIs claimed after one handled PMI (Linux's first form of
/// `amd_pmu_adjust_nmi_window`: `min(2, active counters)`; it now claims
/// any unhandled NMI within 100 ms instead).
pub const MAX_LATE_NMIS: u8 = 2;

impl AmdPmu {
    /// A driver for the detected PMU.
    pub fn new(info: &PmuInfo) -> Result<Self, PmuError> {
        if info.vendor != Vendor::Amd || !info.has_pmu() {
            return Err(PmuError::NoPmu);
        }
        Ok(AmdPmu {
            info: *info,
            slots: [None; MAX_COUNTERS],
            n: 0,
            lbr: LbrDriver::new(info.lbr),
            lbr_on: false,
            late_allowance: 0,
        })
    }

    /// Control and counter MSRs of counter `n`.
    pub fn msrs(&self, n: u8) -> (u32, u32) {
        let n = u32::from(n);
        if self.info.amd_ext || self.info.amd_v2 {
            (
                addr::AMD_F15H_PERF_CTL0 + 2 * n,
                addr::AMD_F15H_PERF_CTR0 + 2 * n,
            )
        } else {
            (addr::AMD_K7_PERF_CTL0 + n, addr::AMD_K7_PERF_CTR0 + n)
        }
    }

    /// Counter holding event `i`.
    pub fn counter_of(&self, i: usize) -> Option<Counter> {
        self.slots
            .get(i)
            .copied()
            .flatten()
            .map(|s| Counter::Gp(s.counter))
    }

    /// LBR format handed to the decoder.
    pub fn lbr_format(&self) -> LbrRawFormat {
        if self.lbr_on {
            LbrRawFormat::AmdV2
        } else {
            LbrRawFormat::None
        }
    }

    /// Program `events` (stopped).
    pub fn configure(
        &mut self,
        hw: &mut impl PmuHw,
        events_in: &[EventConfig],
        lbr: Option<LbrConfig>,
    ) -> Result<(), PmuError> {
        self.stop(hw);
        self.slots = [None; MAX_COUNTERS];
        self.late_allowance = 0;
        let ncount = usize::from(self.info.gp_counters).min(MAX_COUNTERS);
        for (i, ev) in events_in.iter().enumerate() {
            if i >= ncount {
                return Err(PmuError::NoCounter { event: i });
            }
            if ev.event.precise > 0 {
                return Err(PmuError::PebsUnavailable);
            }
            let mut e = super::events::encode(ev.event.kind, Vendor::Amd)
                .ok_or(PmuError::EventUnavailable { event: i })?;
            // Before Zen (family 17h) the cache events are the data-cache
            // refills from L2 / the system (Linux amd_perfmon_event_map).
            if self.info.family < 0x17 {
                match ev.event.kind {
                    EventKind::CacheReferences => e.evtsel = 0x077D,
                    EventKind::CacheMisses => e.evtsel = 0x077E,
                    _ => {}
                }
            }
            let period = match ev.mode {
                SampleMode::Period(p) => p,
                SampleMode::Frequency { .. } => FREQ_START_PERIOD,
            };
            if period == 0 || period > WIDTH >> 1 {
                return Err(PmuError::BadPeriod { event: i });
            }
            // Event select [7:0] and [11:8] (at bits 35:32), unit mask [15:8].
            let mut sel = e.evtsel & 0xF_0000_FFFF;
            if e.evtsel & 0xF00 != 0 && e.evtsel >> 16 == 0 && e.evtsel & 0xFF00 == 0 {
                sel = (e.evtsel & 0xFF) | ((e.evtsel >> 8) & 0xF) << 32;
            }
            sel |= e.evtsel & (1 << 18 | 1 << 23 | 0xFF << 24 | 0b11 << 40);
            sel |= if ev.event.user { EVTSEL_USR } else { 0 }
                | if ev.event.kernel { EVTSEL_OS } else { 0 };
            sel |= EVTSEL_INT | EVTSEL_EN;
            self.slots[i] = Some(Slot {
                counter: 0,
                evtsel: sel,
                period,
                mode: ev.mode,
                last_tsc: 0,
            });
        }
        self.n = events_in.len();
        self.assign_counters(ncount)?;
        if self.info.amd_v2 {
            // Stale overflow and LbrFrz bits of an earlier user would read
            // as overflows at the first PMI (Linux amd_pmu_cpu_reset).
            let counters = (1u64 << ncount) - 1;
            hw.write(
                addr::AMD_PERF_CNTR_GLOBAL_STATUS_CLR,
                counters | AMD_STATUS_LBR_FRZ,
            );
        }
        for i in 0..self.n {
            let Some(s) = self.slots[i] else { continue };
            let (ctl, ctr) = self.msrs(s.counter);
            hw.write(ctr, s.period.wrapping_neg() & WIDTH);
            // With PerfMonV2 the enable bit can stay set; GlobalCtl gates counting.
            hw.write(
                ctl,
                if self.info.amd_v2 {
                    s.evtsel
                } else {
                    s.evtsel & !EVTSEL_EN
                },
            );
        }
        self.lbr_on = false;
        if let Some(cfg) = lbr {
            let l = self.lbr.as_mut().ok_or(PmuError::LbrUnavailable)?;
            if cfg.call_stack && !l.supports_call_stack() {
                return Err(PmuError::LbrUnavailable);
            }
            l.enable(hw, cfg, true);
            self.lbr_on = true;
        }
        hw.write_lvt_pmi(LVT_PMI_NMI);
        Ok(())
    }

    /// Put each event on a counter it may use (the model's constraints,
    /// [`models::amd_counters`]), the most constrained events first, each on
    /// its lowest free counter.
    fn assign_counters(&mut self, ncount: usize) -> Result<(), PmuError> {
        let present = (1u32 << ncount) - 1;
        let family = self.info.family;
        let allowed =
            |s: &Option<Slot>| s.map_or(0, |s| models::amd_counters(family, s.evtsel) & present);
        let mut order = [0usize; MAX_COUNTERS];
        for (k, o) in order.iter_mut().enumerate() {
            *o = k;
        }
        let order = &mut order[..self.n];
        order.sort_unstable_by_key(|&i| (allowed(&self.slots[i]).count_ones(), i));
        let mut used = 0u32;
        for &i in order.iter() {
            let free = allowed(&self.slots[i]) & !used;
            if free == 0 {
                self.slots = [None; MAX_COUNTERS];
                self.n = 0;
                return Err(PmuError::NoCounter { event: i });
            }
            let c = free.trailing_zeros();
            used |= 1 << c;
            if let Some(s) = self.slots[i].as_mut() {
                s.counter = c as u8;
            }
        }
        Ok(())
    }

    fn global_bits(&self) -> u64 {
        (0..self.n)
            .filter_map(|i| self.slots[i])
            .fold(0, |m, s| m | 1 << s.counter)
    }

    /// Start counting.
    pub fn start(&mut self, hw: &mut impl PmuHw) {
        if self.info.amd_v2 {
            hw.write(addr::AMD_PERF_CNTR_GLOBAL_CTL, self.global_bits());
        } else {
            for i in 0..self.n {
                if let Some(s) = self.slots[i] {
                    hw.write(self.msrs(s.counter).0, s.evtsel);
                }
            }
        }
    }

    /// Stop counting.
    pub fn stop(&mut self, hw: &mut impl PmuHw) {
        if self.info.amd_v2 {
            hw.write(addr::AMD_PERF_CNTR_GLOBAL_CTL, 0);
        } else {
            for i in 0..self.n {
                if let Some(s) = self.slots[i] {
                    hw.write(self.msrs(s.counter).0, s.evtsel & !EVTSEL_EN);
                }
            }
        }
    }

    /// Read a counter.
    pub fn read_counter(&self, hw: &mut impl Msr, counter: u8) -> u64 {
        hw.read(self.msrs(counter).1)
    }

    /// Events counted by event `i` since its counter was last loaded with -period.
    pub fn events_since_reload(&self, hw: &mut impl Msr, i: usize) -> Option<u64> {
        let s = self.slots.get(i).copied().flatten()?;
        let start = s.period.wrapping_neg() & WIDTH;
        Some(self.read_counter(hw, s.counter).wrapping_sub(start) & WIDTH)
    }

    /// Handle a PMI: one `Overflow` per overflowed counter. An NMI with no
    /// overflow is `spurious`; right after a handled PMI it is also `late`
    /// (at most [`MAX_LATE_NMIS`], bounded by the counters in use).
    pub fn handle_pmi(
        &mut self,
        hw: &mut impl PmuHw,
        tsc: u64,
        out: &mut impl FnMut(Overflow<'_>),
    ) -> PmiSummary {
        let mut sum = PmiSummary::default();
        self.stop(hw);
        let status = if self.info.amd_v2 {
            hw.read(addr::AMD_PERF_CNTR_GLOBAL_STATUS)
        } else {
            // No status register: a counter set to -period overflowed once bit 47 is clear.
            let mut st = 0;
            for i in 0..self.n {
                if let Some(s) = self.slots[i]
                    && self.read_counter(hw, s.counter) & (1 << 47) == 0
                {
                    st |= 1 << s.counter;
                }
            }
            st
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
        for i in 0..self.n {
            let Some(mut s) = self.slots[i] else { continue };
            if status & (1 << s.counter) == 0 {
                continue;
            }
            out(Overflow {
                event: i,
                period: s.period,
                pebs: None,
                pebs_format: 0,
                lbr: &lbr_buf[..lbr_len],
                lbr_format,
            });
            sum.overflows += 1;
            if let SampleMode::Frequency { hz, tsc_hz } = s.mode {
                if s.last_tsc != 0 {
                    s.period = super::next_frequency_period(
                        s.period,
                        tsc.wrapping_sub(s.last_tsc),
                        hz,
                        tsc_hz,
                        WIDTH >> 1,
                    );
                }
                s.last_tsc = tsc;
                self.slots[i] = Some(s);
            }
            hw.write(self.msrs(s.counter).1, s.period.wrapping_neg() & WIDTH);
        }
        if self.info.amd_v2 && status != 0 {
            hw.write(addr::AMD_PERF_CNTR_GLOBAL_STATUS_CLR, status);
        }
        sum.spurious = sum.overflows == 0;
        // Each overflow raises its own NMI, and one handled together with
        // an earlier overflow arrives after that handler, finding nothing
        // (Linux amd_pmu_adjust_nmi_window): a few such NMIs after a
        // handled PMI are the PMU's, not unknown ones.
        if sum.spurious {
            if self.late_allowance > 0 {
                self.late_allowance -= 1;
                sum.late = true;
            }
        } else {
            self.late_allowance = MAX_LATE_NMIS.min(self.n as u8);
        }
        hw.write_lvt_pmi(LVT_PMI_NMI);
        self.start(hw);
        sum
    }
}
