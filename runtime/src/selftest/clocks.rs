//! The NMI clock and throttling.

use super::*;

pub(super) fn nmi_clock_ticks() -> TestResult {
    let start = nmi::nmi_count();
    let t0 = cpu::rdtsc();
    while nmi::nmi_count() - start < 20 {
        if cpu::rdtsc() - t0 > 4_000_000_000 {
            fail!("only {} NMIs arrived", nmi::nmi_count() - start);
        }
        cpu::halt();
    }
    Ok(())
}

/// An HPET expiry that raises no NMI (as when the I/O APIC drops its edge)
/// does not stop the one-shot clock: the boot
/// CPU's scheduler tick finds the counter past the scheduled expiry, sets
/// the comparator again and counts a stall, and NMIs arrive again.
pub(super) fn nmi_clock_survives_a_lost_expiry() -> TestResult {
    use crate::proc::tick;
    if crate::cpu::this().index != 0 {
        fail!("runs on the boot CPU, whose tick watches the clock");
    }
    let ticking = tick::running();
    if !ticking && !tick::start() {
        kprintln!("selftest: nmi_clock_survives_a_lost_expiry: skipped (no scheduler tick)");
        return Ok(());
    }
    let stalls = crate::sample::clock::stalls();
    let dropped = crate::sample::clock::drop_next_expiry();
    let start = nmi::nmi_count();
    let t0 = cpu::rdtsc();
    // 50 ms for 10 NMIs: the stall is found within about 3 ms.
    let budget = crate::time::tsc_hz() / 20;
    while nmi::nmi_count() - start < 10 && cpu::rdtsc() - t0 < budget {
        // With interrupts on, so that the tick runs.
        crate::proc::idle();
    }
    let nmis = nmi::nmi_count() - start;
    let restarted = crate::sample::clock::stalls() - stalls;
    if !ticking {
        tick::stop();
    }
    match dropped {
        None => {
            kprintln!(
                "selftest: nmi_clock_survives_a_lost_expiry: skipped (the clock is not the HPET)"
            );
            return Ok(());
        }
        Some(false) => fail!("ten tries to drop an expiry were each met by an NMI"),
        Some(true) => {}
    }
    ensure!(
        nmis >= 10 && restarted >= 1,
        "after a lost expiry: {nmis} NMIs in 50 ms, {restarted} restarts"
    );
    Ok(())
}

/// The NMI clock faster than `max_rate` allows: with one sample per
/// 1 ms tick allowed (`max_rate=1000`) and the clock at `freq` >= 2 kHz,
/// each tick's second NMI throttles and samples (a Throttle record, then
/// its sample, in perf's order), the tick's later NMIs are suppressed and counted, and the
/// next tick's first NMI unthrottles (an Unthrottle record) and samples.
/// Every clock NMI taken while sampling is either a queued sample or a
/// suppressed one, exactly, and the End counters add up.
pub(super) fn nmi_clock_throttle(cfg: &Config) -> TestResult {
    use sampler::drain::NmiRecord;
    if cfg.freq_hz < 2000 || cpu_pmu_sampling() {
        kprintln!("selftest: nmi_clock_throttle: skipped (needs the NMI clock at 2 kHz or more)");
        return Ok(());
    }
    // Leftovers from earlier tests, if any, are not this test's.
    profile::take_queued(|_, _| {});
    profile::configure_throttle(1000, 0);
    let before = profile::throttle_stats();
    let end_before = crate::stream::drain::end_counters();
    // The handler counts the clock NMIs it takes while sampling is on.
    let n0 = profile::clock_overflows();
    profile::start();
    // 20 ms: about 20 ticks.
    let t0 = cpu::rdtsc();
    let budget = crate::time::tsc_hz() / 50;
    while cpu::rdtsc() - t0 < budget {
        cpu::halt();
    }
    profile::stop();
    let nmis = profile::clock_overflows() - n0;
    let (mut samples, mut throttles, mut unthrottles) = (0u64, 0u64, 0u64);
    let mut order_ok = true;
    // Throttled, and whether the throttling overflow's own sample is still
    // to come.
    let mut throttled = false;
    let mut its_sample_due = false;
    profile::take_queued(|_, r| match r {
        NmiRecord::Sample(_) => {
            samples += 1;
            order_ok &= !throttled || its_sample_due;
            its_sample_due = false;
        }
        NmiRecord::Throttle(_) => {
            throttles += 1;
            order_ok &= !throttled;
            throttled = true;
            its_sample_due = true;
        }
        NmiRecord::Unthrottle(_) => {
            unthrottles += 1;
            order_ok &= throttled && !its_sample_due;
            throttled = false;
        }
    });
    let after = profile::throttle_stats();
    let end = crate::stream::drain::end_counters();
    profile::configure_throttle(cfg.max_rate, cfg.cpu_pct);
    let suppressed = after.suppressed - before.suppressed;
    ensure!(
        throttles > 0 && unthrottles > 0,
        "{nmis} NMIs at {} Hz: {throttles} Throttle and {unthrottles} Unthrottle records",
        cfg.freq_hz
    );
    ensure!(
        order_ok,
        "records out of order: a Throttle must come before its overflow's sample, other samples only while unthrottled"
    );
    ensure!(
        after.throttles == throttles && throttles - unthrottles <= 1,
        "throttled {} times, {throttles} Throttle / {unthrottles} Unthrottle records",
        after.throttles
    );
    ensure!(
        after.records - before.records == throttles + unthrottles
            && after.records_dropped == before.records_dropped,
        "{} records counted, {} queued",
        after.records - before.records,
        throttles + unthrottles
    );
    ensure!(
        samples + suppressed == nmis && suppressed > 0,
        "{nmis} clock NMIs while sampling, but {samples} samples + {suppressed} suppressed"
    );
    // At most two samples per tick (the allowed one and the one that
    // throttles), so at least half the NMIs beyond that were suppressed.
    let ticks = budget / (crate::time::tsc_hz() / 1000).max(1) + 2;
    ensure!(
        samples <= 2 * ticks,
        "{samples} samples in about {ticks} ticks at max_rate=1000"
    );
    let taken = end.taken - end_before.taken;
    let delivered = end.delivered - end_before.delivered;
    let lost = end.lost - end_before.lost;
    ensure!(
        taken == nmis && delivered == samples && lost == suppressed && taken == delivered + lost,
        "End counters: taken {taken} = delivered {delivered} + lost {lost}; want {nmis} = {samples} + {suppressed}"
    );
    Ok(())
}
