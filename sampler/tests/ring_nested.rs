//! A ring producer really interrupted by another producer on the same CPU:
//! a SIGPROF handler (driven by `setitimer(ITIMER_PROF)`) pushes into the
//! ring that the interrupted thread is pushing into and draining, the way
//! an NMI interrupts the runtime. Checks that every value is delivered
//! exactly once or counted as lost, and that each producer's values come
//! out in order.

#![cfg(target_os = "linux")]
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sampler::ring::Ring;

mod nesting;
use nesting::{Delivered, HANDLER_TAG};

/// Small enough that the handler often finds it full.
static RING: Ring<u64, 64> = Ring::new();
static HANDLER_PUSHED: AtomicU64 = AtomicU64::new(0);
static HANDLER_RUNS: AtomicU64 = AtomicU64::new(0);
/// Signals that arrived while the main thread was inside `push` or `pop`.
static NESTED_IN_OP: AtomicU64 = AtomicU64::new(0);
static IN_OP: AtomicBool = AtomicBool::new(false);
/// The producing thread's id; handler runs on any other thread do not count
/// as nesting.
static PRODUCER_TID: AtomicI64 = AtomicI64::new(-1);
static HANDLER_ON_PRODUCER: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_sigprof(_: libc::c_int) {
    HANDLER_RUNS.fetch_add(1, Ordering::Relaxed);
    // SAFETY: gettid has no preconditions and is async-signal-safe.
    let tid = i64::from(unsafe { libc::gettid() });
    if tid == PRODUCER_TID.load(Ordering::Relaxed) {
        HANDLER_ON_PRODUCER.fetch_add(1, Ordering::Relaxed);
        if IN_OP.load(Ordering::Relaxed) {
            NESTED_IN_OP.fetch_add(1, Ordering::Relaxed);
        }
    }
    // Several pushes per signal so the ring fills up at times.
    for _ in 0..8 {
        let n = HANDLER_PUSHED.fetch_add(1, Ordering::Relaxed);
        RING.push(HANDLER_TAG | n);
    }
}

#[test]
fn signal_handler_nests_into_producer_and_consumer() {
    // SAFETY: gettid has no preconditions.
    PRODUCER_TID.store(i64::from(unsafe { libc::gettid() }), Ordering::Relaxed);
    nesting::start_prof_timer(on_sigprof);

    let mut main_pushed = 0u64;
    let mut delivered = Delivered::default();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(1500) {
        for _ in 0..16 {
            IN_OP.store(true, Ordering::Relaxed);
            RING.push(main_pushed);
            IN_OP.store(false, Ordering::Relaxed);
            main_pushed += 1;
        }
        for _ in 0..12 {
            IN_OP.store(true, Ordering::Relaxed);
            let v = RING.pop();
            IN_OP.store(false, Ordering::Relaxed);
            match v {
                Some(v) => delivered.check(v),
                None => break,
            }
        }
    }
    nesting::stop_prof_timer();
    while let Some(v) = RING.pop() {
        delivered.check(v);
    }
    let handler_pushed = HANDLER_PUSHED.load(Ordering::Relaxed);
    let stats = RING.stats();
    let runs = HANDLER_RUNS.load(Ordering::Relaxed);
    let nested = NESTED_IN_OP.load(Ordering::Relaxed);
    let on_producer = HANDLER_ON_PRODUCER.load(Ordering::Relaxed);
    println!(
        "handler runs {runs} (on the producing thread: {on_producer}, inside its push/pop: {nested}), pushed main {main_pushed} handler {handler_pushed}, \
         delivered main {} handler {}, lost {}",
        delivered.main, delivered.handler, stats.lost
    );
    assert_eq!(
        stats.taken,
        main_pushed + handler_pushed,
        "every push is counted"
    );
    assert_eq!(stats.delivered, delivered.main + delivered.handler);
    assert_eq!(
        stats.taken,
        stats.delivered + stats.lost,
        "taken = delivered + lost"
    );
    assert!(
        runs > 100,
        "the timer really interrupted the thread ({runs} runs)"
    );
    assert!(
        nested > 10,
        "signals really landed inside push/pop ({nested})"
    );
    assert!(stats.lost > 0, "the ring really overflowed");
    assert!(delivered.handler > 0 && delivered.main > 0);
}
