//! What the demo programs share: the unit of work they burn, the round
//! count they take from the command line, and the sink that keeps their
//! results alive.

use std::sync::atomic::{AtomicU64, Ordering};

/// Where results go so the optimiser keeps the work.
pub static SINK: AtomicU64 = AtomicU64::new(0);

/// One unit of "work": a round of xorshift mixing.
#[inline(always)]
pub fn mix(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

/// Keeps `x` alive.
pub fn sink(x: u64) {
    SINK.store(x, Ordering::Relaxed);
}

/// The number of rounds from `argv[1]`: `None` (run until the run's
/// duration ends it) without an argument; exits with a message and status 2
/// when the argument is not a number.
pub fn rounds() -> Option<u64> {
    let arg = std::env::args().nth(1)?;
    match arg.parse() {
        Ok(n) => Some(n),
        Err(_) => {
            eprintln!("usage: {} [ROUNDS] (got {arg:?})", program());
            std::process::exit(2);
        }
    }
}

fn program() -> String {
    std::env::args().next().unwrap_or_default()
}

/// Runs `round` `rounds` times (forever for `None`).
pub fn repeat(rounds: Option<u64>, mut round: impl FnMut()) {
    match rounds {
        Some(n) => (0..n).for_each(|_| round()),
        None => loop {
            round()
        },
    }
}
