//! What the nested-producer ring tests share: a profiling timer whose
//! SIGPROF handler interrupts the producing thread (the way an NMI
//! interrupts the runtime), and the check that each producer's values are
//! delivered in order, each at most once.

use std::time::Duration;

/// Set in the values the signal handler produces.
pub const HANDLER_TAG: u64 = 1 << 63;

fn set_prof_timer(usec: libc::suseconds_t) {
    let t = libc::itimerval {
        it_interval: libc::timeval {
            tv_sec: 0,
            tv_usec: usec,
        },
        it_value: libc::timeval {
            tv_sec: 0,
            tv_usec: usec,
        },
    };
    // SAFETY: `t` is a valid itimerval; a null old value is allowed.
    let r = unsafe { libc::setitimer(libc::ITIMER_PROF, &t, std::ptr::null_mut()) };
    assert_eq!(r, 0, "setitimer");
}

/// Installs `handler` for SIGPROF and starts a 100 µs profiling timer.
/// `handler` must touch only atomics and the lock-free ring
/// (async-signal-safe).
pub fn start_prof_timer(handler: extern "C" fn(libc::c_int)) {
    // SAFETY: installs a handler that, per this function's contract, is
    // async-signal-safe; the sigaction is fully initialised before use.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGPROF, &sa, std::ptr::null_mut()), 0);
    }
    set_prof_timer(100);
}

/// Stops the timer and lets a signal still in flight land.
pub fn stop_prof_timer() {
    set_prof_timer(0);
    std::thread::sleep(Duration::from_millis(20));
}

/// Values delivered by the consumer, per producer, checked for order.
#[derive(Debug, Default)]
pub struct Delivered {
    next_main: u64,
    next_handler: u64,
    /// Values of the interrupted thread delivered.
    pub main: u64,
    /// Values of the signal handler delivered.
    pub handler: u64,
}

impl Delivered {
    /// Counts `v`, which must come after every earlier value of its producer.
    pub fn check(&mut self, v: u64) {
        if v & HANDLER_TAG != 0 {
            let n = v & !HANDLER_TAG;
            assert!(
                n >= self.next_handler,
                "handler values out of order: {n} after {}",
                self.next_handler
            );
            self.next_handler = n + 1;
            self.handler += 1;
        } else {
            assert!(
                v >= self.next_main,
                "main values out of order: {v} after {}",
                self.next_main
            );
            self.next_main = v + 1;
            self.main += 1;
        }
    }
}
