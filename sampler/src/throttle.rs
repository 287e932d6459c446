//! Throttling and frequency mode, after perf: a per-tick interrupt limit, a
//! moving-average CPU-time budget, and period adjustment toward a target
//! rate. Driven by a caller-supplied clock, so it is tested with a simulated
//! one.
//!
//! # perf's rules, as implemented here
//! - `perf_event_max_sample_rate` (default 100,000/s) and
//!   `perf_cpu_time_max_percent` (default 25) give `max_samples_per_tick =
//!   ceil(rate / HZ)` and an allowed average handler time of
//!   `1e9 / rate * percent / 100` = 2,500 ns.
//! - After each sample the handler's duration enters a moving average over
//!   128 samples ([`Throttle::sample_took`]). When the average exceeds the
//!   allowed time, the rate is lowered so that samples at 1.25 x the
//!   average cost fit the CPU-time share of a tick.
//! - An event whose interrupts within one tick exceed `max_samples_per_tick`
//!   is throttled: that overflow still produces its sample, then the event
//!   stops and a Throttle record is emitted. The next tick unthrottles it
//!   (Unthrottle record) ([`Throttle::on_tick`]).
//! - Frequency mode ([`FreqPeriod`]) recomputes the period at each overflow
//!   from the events counted and the time elapsed, moving 1/8 of the way to
//!   the period that would give the target rate, as `perf record -F` does.
//!
//! # Contexts
//! [`Throttle`] and [`EventThrottle`] use atomics only: the NMI handler calls
//! [`Throttle::on_overflow`] and [`Throttle::sample_took`], the timer tick
//! calls [`Throttle::on_tick`], and a tick interrupted by an NMI (or the
//! reverse) stays consistent. [`FreqPeriod`] belongs to the NMI handler
//! alone.

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// `perf_event_max_sample_rate` default.
pub const DEFAULT_MAX_SAMPLE_RATE: u64 = 100_000;
/// `perf_cpu_time_max_percent` default.
pub const DEFAULT_CPU_TIME_MAX_PERCENT: u64 = 25;
/// Samples in the moving average of handler time (`NR_ACCUMULATED_SAMPLES`).
pub const NR_ACCUMULATED_SAMPLES: u64 = 128;
/// `perf record`'s default frequency.
pub const DEFAULT_FREQUENCY: u64 = 4000;

const NSEC_PER_SEC: u64 = 1_000_000_000;

/// Throttling parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThrottleConfig {
    /// `perf_event_max_sample_rate`.
    pub max_sample_rate: u64,
    /// `perf_cpu_time_max_percent` (0 disables the CPU-time budget).
    pub cpu_time_max_percent: u64,
    /// Timer ticks per second (`HZ`).
    pub tick_hz: u64,
}

impl Default for ThrottleConfig {
    fn default() -> Self {
        ThrottleConfig {
            max_sample_rate: DEFAULT_MAX_SAMPLE_RATE,
            cpu_time_max_percent: DEFAULT_CPU_TIME_MAX_PERCENT,
            tick_hz: 1000,
        }
    }
}

/// What to do with an overflow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverflowAction {
    /// Produce the sample.
    Sample,
    /// Produce the sample, then stop the event and emit a Throttle record.
    SampleThenThrottle,
    /// The event is throttled: produce nothing (a late overflow of a
    /// stopped counter).
    Suppressed,
}

/// Per-event throttle state.
#[derive(Debug, Default)]
pub struct EventThrottle {
    interrupts: AtomicU64,
    throttled: AtomicBool,
}

impl EventThrottle {
    /// Fresh state.
    pub const fn new() -> Self {
        EventThrottle {
            interrupts: AtomicU64::new(0),
            throttled: AtomicBool::new(false),
        }
    }

    /// Whether the event is throttled now.
    #[inline]
    pub fn is_throttled(&self) -> bool {
        self.throttled.load(Ordering::Acquire)
    }
}

/// The per-CPU throttle: tick sequence and CPU-time budget.
#[derive(Debug)]
pub struct Throttle {
    percent: u64,
    tick_hz: u64,
    max_sample_rate: AtomicU64,
    max_samples_per_tick: AtomicU64,
    allowed_ns: AtomicU64,
    running_len: AtomicU64,
    throttles: AtomicU64,
}

impl Throttle {
    /// A throttle with `config`.
    pub const fn new(config: ThrottleConfig) -> Self {
        let hz = if config.tick_hz == 0 {
            1
        } else {
            config.tick_hz
        };
        let rate = if config.max_sample_rate == 0 {
            1
        } else {
            config.max_sample_rate
        };
        Throttle {
            percent: config.cpu_time_max_percent,
            tick_hz: hz,
            max_sample_rate: AtomicU64::new(rate),
            max_samples_per_tick: AtomicU64::new(rate.div_ceil(hz)),
            allowed_ns: AtomicU64::new(NSEC_PER_SEC / rate * config.cpu_time_max_percent / 100),
            running_len: AtomicU64::new(0),
            throttles: AtomicU64::new(0),
        }
    }

    /// The current sample-rate limit (lowered by the CPU-time budget).
    pub fn max_sample_rate(&self) -> u64 {
        self.max_sample_rate.load(Ordering::Relaxed)
    }

    /// The current per-tick interrupt limit.
    pub fn max_samples_per_tick(&self) -> u64 {
        self.max_samples_per_tick.load(Ordering::Relaxed)
    }

    /// The current allowed average handler time (ns).
    pub fn allowed_ns(&self) -> u64 {
        self.allowed_ns.load(Ordering::Relaxed)
    }

    /// The moving average of handler time (ns).
    pub fn average_ns(&self) -> u64 {
        self.running_len.load(Ordering::Relaxed) / NR_ACCUMULATED_SAMPLES
    }

    /// Times an event was throttled.
    pub fn throttle_count(&self) -> u64 {
        self.throttles.load(Ordering::Relaxed)
    }

    /// NMI path: accounts one overflow of `event` and says what to do.
    #[inline]
    pub fn on_overflow(&self, event: &EventThrottle) -> OverflowAction {
        if event.throttled.load(Ordering::Acquire) {
            return OverflowAction::Suppressed;
        }
        // The tick zeroes the count ([`Throttle::on_tick`]).
        let n = event.interrupts.fetch_add(1, Ordering::Relaxed) + 1;
        if n > self.max_samples_per_tick.load(Ordering::Relaxed) {
            event.throttled.store(true, Ordering::Release);
            self.throttles.fetch_add(1, Ordering::Relaxed);
            OverflowAction::SampleThenThrottle
        } else {
            OverflowAction::Sample
        }
    }

    /// NMI path, end of the handler: the handler took `ns()` nanoseconds.
    /// Lowers the rate when the moving average exceeds the budget
    /// (perf_sample_event_took). `ns` is called only while a CPU-time
    /// budget is in force, so without one the caller's conversion of its
    /// clock to nanoseconds costs nothing.
    #[inline]
    pub fn sample_took(&self, ns: impl FnOnce() -> u64) {
        // A percent of 0 gives 0 allowed ns (`new`), and only a non-zero
        // average above a non-zero allowance replaces it: one test covers both.
        let allowed = self.allowed_ns.load(Ordering::Relaxed);
        if allowed == 0 {
            return;
        }
        let ns = ns();
        let mut running = self.running_len.load(Ordering::Relaxed);
        running -= running / NR_ACCUMULATED_SAMPLES;
        // At most 128 times the largest duration added: no overflow for any
        // handler shorter than 2^56 ns (two years), so no saturation test.
        running = running.wrapping_add(ns);
        self.running_len.store(running, Ordering::Relaxed);
        let mut avg = running / NR_ACCUMULATED_SAMPLES;
        if avg <= allowed {
            return;
        }
        avg += avg / 4;
        let budget = NSEC_PER_SEC / self.tick_hz / 100 * self.percent;
        let per_tick = if avg < budget { budget / avg } else { 1 };
        self.allowed_ns.store(avg, Ordering::Relaxed);
        self.max_samples_per_tick.store(per_tick, Ordering::Relaxed);
        self.max_sample_rate
            .store(per_tick * self.tick_hz, Ordering::Relaxed);
    }

    /// Tick path, once per tick for each event: starts the event's count
    /// for the new tick (perf counts per tick by a sequence number its
    /// overflow path compares; here every event's tick runs on the CPU
    /// that counts it, so the tick zeroes the count and the overflow path
    /// compares nothing). Returns true when `event` was throttled and is
    /// now unthrottled: restart it and emit an Unthrottle record.
    #[inline]
    pub fn on_tick(&self, event: &EventThrottle) -> bool {
        event.interrupts.store(0, Ordering::Relaxed);
        event.throttled.swap(false, Ordering::AcqRel)
    }
}

/// Frequency mode: the period of one event, adjusted toward a target rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreqPeriod {
    freq: u64,
    period: u64,
    last_time: Option<u64>,
    tick_ns: u64,
}

impl FreqPeriod {
    /// Targets `freq` samples per second, starting at period 1 as perf
    /// does (the first overflows come fast and the period grows), with
    /// `tick_hz` bounding which intervals are trusted.
    pub const fn new(freq: u64, tick_hz: u64) -> Self {
        FreqPeriod {
            freq: if freq == 0 { 1 } else { freq },
            period: 1,
            last_time: None,
            tick_ns: NSEC_PER_SEC / if tick_hz == 0 { 1 } else { tick_hz },
        }
    }

    /// Starts from `period` instead of 1.
    pub const fn with_period(mut self, period: u64) -> Self {
        self.period = if period == 0 { 1 } else { period };
        self
    }

    /// The period to program now.
    pub const fn period(&self) -> u64 {
        self.period
    }

    /// The period that `count` events in `nsec` would need for the target
    /// frequency (perf_calculate_period).
    pub fn ideal_period(&self, count: u64, nsec: u64) -> u64 {
        if nsec == 0 {
            return self.period;
        }
        let p = u128::from(count) * u128::from(NSEC_PER_SEC)
            / (u128::from(nsec) * u128::from(self.freq));
        u64::try_from(p).unwrap_or(u64::MAX >> 1).max(1)
    }

    /// Moves 1/8 of the way from the current period toward `ideal`
    /// (perf_adjust_period).
    fn adjust(&mut self, ideal: u64) {
        let cur = self.period as i128;
        let delta = ideal as i128 - cur;
        let step = if delta >= 0 {
            (delta + 7) / 8
        } else {
            (delta - 7) / 8
        };
        let next = (cur + step).clamp(1, (u64::MAX >> 1) as i128);
        self.period = next as u64;
    }

    /// An overflow at `now` (ns) after `count` events (normally the period
    /// that just elapsed). Returns the new period. Intervals longer than two
    /// ticks are not trusted (the event was stopped or idle), as in perf.
    pub fn on_overflow(&mut self, now: u64, count: u64) -> u64 {
        if let Some(last) = self.last_time {
            let delta = now.wrapping_sub(last);
            if delta > 0 && delta < 2 * self.tick_ns {
                let ideal = self.ideal_period(count, delta);
                self.adjust(ideal);
            }
        }
        self.last_time = Some(now);
        self.period
    }

    /// A tick: `count` events over the last `nsec` (perf_adjust_freq_unthr_context).
    /// Returns the new period.
    pub fn on_tick(&mut self, count: u64, nsec: u64) -> u64 {
        if count > 0 && nsec > 0 {
            let ideal = self.ideal_period(count, nsec);
            self.adjust(ideal);
        }
        self.period
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_perf() {
        let t = Throttle::new(ThrottleConfig::default());
        assert_eq!(t.max_sample_rate(), 100_000);
        assert_eq!(t.max_samples_per_tick(), 100);
        assert_eq!(t.allowed_ns(), 2_500);
        let t250 = Throttle::new(ThrottleConfig {
            tick_hz: 250,
            ..Default::default()
        });
        assert_eq!(t250.max_samples_per_tick(), 400);
    }

    #[test]
    fn per_tick_limit_throttles_and_the_tick_unthrottles() {
        let t = Throttle::new(ThrottleConfig {
            max_sample_rate: 10_000,
            tick_hz: 1000,
            ..Default::default()
        });
        let e = EventThrottle::new();
        let mut actions = std::vec::Vec::new();
        for _ in 0..15 {
            actions.push(t.on_overflow(&e));
        }
        // 10 per tick allowed; the 11th is sampled and throttles.
        assert!(actions[..10].iter().all(|a| *a == OverflowAction::Sample));
        assert_eq!(actions[10], OverflowAction::SampleThenThrottle);
        assert!(
            actions[11..]
                .iter()
                .all(|a| *a == OverflowAction::Suppressed)
        );
        assert!(e.is_throttled());
        assert_eq!(t.throttle_count(), 1);
        assert!(t.on_tick(&e), "unthrottled at the next tick");
        assert!(!t.on_tick(&e), "only once");
        assert_eq!(t.on_overflow(&e), OverflowAction::Sample);
        // A quiet event is never throttled.
        let q = EventThrottle::new();
        for _ in 0..100 {
            assert_eq!(t.on_overflow(&q), OverflowAction::Sample);
            assert!(!t.on_tick(&q));
        }
    }

    #[test]
    fn cpu_time_budget_lowers_the_rate() {
        let t = Throttle::new(ThrottleConfig::default());
        // Cheap handlers: nothing changes.
        for _ in 0..1000 {
            t.sample_took(|| 1_000);
        }
        assert_eq!(t.max_sample_rate(), 100_000);
        assert_eq!(t.average_ns(), 1000, "moving average converged");
        // Expensive handlers (8 us, the "interrupt took too long" reports):
        for _ in 0..2000 {
            t.sample_took(|| 8_000);
        }
        let avg = t.average_ns();
        assert!((7_900..=8_000).contains(&avg), "{avg}");
        // per tick: 25% of 1 ms / (1.25 x avg)
        let expected_per_tick = 250_000 / (avg + avg / 4);
        assert_eq!(t.max_samples_per_tick(), expected_per_tick);
        assert_eq!(t.max_sample_rate(), expected_per_tick * 1000);
        assert!(t.max_sample_rate() < 26_000, "{}", t.max_sample_rate());
    }

    /// Simulated clock: an event counting `rate` events per second sampled
    /// in frequency mode converges to the period giving `freq` samples/s.
    #[test]
    fn frequency_mode_converges_to_the_target_rate() {
        for (rate, freq) in [
            (2_000_000_000u64, 4000u64),
            (1_000_000, 1000),
            (3_000_000_000, 997),
        ] {
            let mut f = FreqPeriod::new(freq, 1000);
            let mut now = 0u64;
            let mut samples_last_second = 0u64;
            let total_ns = 3 * NSEC_PER_SEC;
            while now < total_ns {
                let p = f.period();
                now += (u128::from(p) * u128::from(NSEC_PER_SEC) / u128::from(rate)).max(1) as u64;
                f.on_overflow(now, p);
                if now > total_ns - NSEC_PER_SEC {
                    samples_last_second += 1;
                }
            }
            let ideal = rate / freq;
            let p = f.period();
            assert!(
                p.abs_diff(ideal) * 100 <= ideal,
                "rate {rate} freq {freq}: period {p} vs {ideal}"
            );
            assert!(
                samples_last_second.abs_diff(freq) * 100 <= freq,
                "{samples_last_second} samples/s vs {freq}"
            );
        }
    }

    #[test]
    fn frequency_mode_ignores_stale_intervals_and_uses_ticks() {
        let mut f = FreqPeriod::new(1000, 1000).with_period(500);
        f.on_overflow(0, 500);
        // 10 s later (the event was stopped): not trusted.
        assert_eq!(f.on_overflow(10 * NSEC_PER_SEC, 500), 500);
        // A tick that saw 2,000,000 events in 1 ms wants period 2,000,000:
        // the step is 1/8 of the way.
        let p = f.on_tick(2_000_000, 1_000_000);
        assert_eq!(p, 500 + (2_000_000 - 500u64).div_ceil(8));
        // Never below 1.
        let mut g = FreqPeriod::new(1_000_000, 1000).with_period(1);
        assert_eq!(g.on_tick(1, NSEC_PER_SEC), 1);
    }
}
