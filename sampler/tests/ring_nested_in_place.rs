//! The in-place ring API under real nesting: a SIGPROF handler (driven by
//! `setitimer(ITIMER_PROF)`) fills slots with `push_with` while the
//! interrupted thread is itself inside `push_with` or `pop_with` on the same
//! ring, the way the NMI handler builds samples in their ring slots. Each
//! value is a 32-word record written word by word, so a slot handed over
//! before its producer finished (or reused while being read) shows up as a
//! torn record. Checks that every record is delivered whole exactly once or
//! counted as lost, and that each producer's records come out in order.

#![cfg(target_os = "linux")]
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sampler::ring::Ring;

mod nesting;
use nesting::{Delivered, HANDLER_TAG};

/// Small enough that the handler often finds it full.
static RING: Ring<[u64; WORDS], 64> = Ring::new();
/// Words per record.
const WORDS: usize = 32;
static HANDLER_PUSHED: AtomicU64 = AtomicU64::new(0);
static HANDLER_RUNS: AtomicU64 = AtomicU64::new(0);
/// Records the handler consumed (it also drains, so a consumer runs while
/// the interrupted thread is in the middle of filling a slot).
static HANDLER_POPPED: AtomicU64 = AtomicU64::new(0);
/// Records the handler found torn.
static HANDLER_TORN: AtomicU64 = AtomicU64::new(0);
/// Signals that arrived while the main thread was inside `push` or `pop`.
static NESTED_IN_OP: AtomicU64 = AtomicU64::new(0);
static IN_OP: AtomicBool = AtomicBool::new(false);
/// The producing thread's id; handler runs on any other thread do not count
/// as nesting.
static PRODUCER_TID: AtomicI64 = AtomicI64::new(-1);
static HANDLER_ON_PRODUCER: AtomicU64 = AtomicU64::new(0);

/// Writes `v` into every word of the slot, one word at a time.
fn fill(slot: &mut [u64; WORDS], v: u64) {
    for w in slot.iter_mut() {
        // Volatile so the words really are written one by one.
        // SAFETY: `w` is a valid, exclusive reference.
        unsafe { std::ptr::write_volatile(w, v) };
    }
}

/// The record's value, if all its words agree.
fn whole(slot: &[u64; WORDS]) -> u64 {
    assert!(slot.iter().all(|w| *w == slot[0]), "torn record: {slot:?}");
    slot[0]
}

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
        RING.push_with(|slot| fill(slot, HANDLER_TAG | n));
    }
    // On some runs drain everything published, up to the slot the
    // interrupted thread may be filling.
    let pops = if HANDLER_RUNS.load(Ordering::Relaxed).is_multiple_of(2) {
        64
    } else {
        2
    };
    for _ in 0..pops {
        let torn = RING.pop_with(|slot| slot.iter().any(|w| *w != slot[0]));
        match torn {
            Some(torn) => {
                HANDLER_POPPED.fetch_add(1, Ordering::Relaxed);
                if torn {
                    HANDLER_TORN.fetch_add(1, Ordering::Relaxed);
                }
            }
            None => break,
        }
    }
}

#[test]
fn signal_handler_fills_slots_in_place_inside_push_with_and_pop_with() {
    // SAFETY: gettid has no preconditions.
    PRODUCER_TID.store(i64::from(unsafe { libc::gettid() }), Ordering::Relaxed);
    nesting::start_prof_timer(on_sigprof);

    let mut main_pushed = 0u64;
    let mut delivered = Delivered::default();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(1500) {
        for _ in 0..16 {
            IN_OP.store(true, Ordering::Relaxed);
            RING.push_with(|slot| fill(slot, main_pushed));
            IN_OP.store(false, Ordering::Relaxed);
            main_pushed += 1;
        }
        for _ in 0..12 {
            IN_OP.store(true, Ordering::Relaxed);
            let v = RING.pop_with(|slot| whole(slot));
            IN_OP.store(false, Ordering::Relaxed);
            match v {
                Some(v) => delivered.check(v),
                None => break,
            }
        }
    }
    nesting::stop_prof_timer();
    while let Some(v) = RING.pop_with(|slot| whole(slot)) {
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
    let handler_popped = HANDLER_POPPED.load(Ordering::Relaxed);
    println!("handler consumed {handler_popped}");
    assert_eq!(
        HANDLER_TORN.load(Ordering::Relaxed),
        0,
        "the handler never saw a half-written record"
    );
    assert!(handler_popped > 0, "the handler really consumed");
    assert_eq!(
        stats.delivered,
        delivered.main + delivered.handler + handler_popped
    );
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
