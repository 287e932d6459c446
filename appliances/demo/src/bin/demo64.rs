//! demo64: splits its work 50/30/20 between three named hot functions
//! (`demo_checksum_blocks`, `demo_parse_records`, `demo_update_stats`) and
//! yields after each round, so a profile shows the designed split.
//!
//! `demo64 [ROUNDS]`: without ROUNDS it runs until the run ends.

use perch_demo_appliance::{mix, repeat, rounds, sink};

/// Work units per round; the three functions get 50 %, 30 % and 20 %.
const UNITS: u64 = 100_000;

/// 50 % of the work.
#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn demo_checksum_blocks(seed: u64, units: u64) -> u64 {
    let mut x = seed | 1;
    for i in 0..units {
        x = mix(x).wrapping_add(i);
    }
    x
}

/// 30 % of the work.
#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn demo_parse_records(seed: u64, units: u64) -> u64 {
    let mut x = seed | 3;
    for i in 0..units {
        x = mix(x) ^ i;
    }
    x
}

/// 20 % of the work.
#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn demo_update_stats(seed: u64, units: u64) -> u64 {
    let mut x = seed | 5;
    for i in 0..units {
        x = mix(x).wrapping_sub(i);
    }
    x
}

fn main() {
    let rounds = rounds();
    println!("demo64: appliance task ready");
    let mut x = 0x1234_5678u64;
    repeat(rounds, || {
        x = demo_checksum_blocks(x, UNITS * 5 / 10);
        x = demo_parse_records(x, UNITS * 3 / 10);
        x = demo_update_stats(x, UNITS * 2 / 10);
        sink(x);
        std::thread::yield_now();
    });
    println!("demo64: done, {x:016x}");
}
