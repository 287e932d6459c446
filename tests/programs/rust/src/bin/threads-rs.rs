//! threads-rs: the Rust `std::thread` counterpart of `tests/programs/c/threads.c`.
//!
//! `threads-rs [N [ROUNDS]]` (N 1..16, default 4; ROUNDS default 60) starts N
//! workers in a `std::thread::scope`, each named `worker-I` with
//! `thread::Builder::name` (the std library gives the OS thread that name).
//! The main thread hands each worker its rounds over its own `mpsc` channel;
//! a worker runs each round (a sieve over a segment and an FNV-1a hash of a
//! xorshift stream: the same work for every worker, so they get similar
//! shares of the CPU), adds the result to a total behind a `Mutex`, and sends
//! it back over a shared result channel. The main thread folds each worker's
//! results in round order and prints, in worker order, each worker's name
//! and checksum, then the total, then `threads done`; exit status 0.
//!
//! Every line is deterministic: no ids, times or addresses, and the total is
//! a wrapping sum (the same in any interleaving).

use std::sync::Mutex;
use std::sync::mpsc;
use std::thread;

const MAX_WORKERS: usize = 16;
const SEGMENT: u32 = 16384;

/// The primes in `[base, base + SEGMENT)` by a segmented sieve: their count,
/// and their values folded into `h`.
#[inline(never)]
fn sieve_segment(marks: &mut [bool], base: u32, h: &mut u32) -> u32 {
    marks.fill(true);
    let end = base + SEGMENT;
    let mut p = 2u32;
    while p * p < end {
        let first = (base.div_ceil(p) * p).max(p * p);
        let mut m = first;
        while m < end {
            marks[(m - base) as usize] = false;
            m += p;
        }
        p += 1;
    }
    let mut count = 0;
    for (i, &prime) in marks.iter().enumerate() {
        let n = base + i as u32;
        if prime && n >= 2 {
            count += 1;
            *h = (*h ^ n).wrapping_mul(16_777_619);
        }
    }
    count
}

/// FNV-1a over 4096 words of a xorshift stream seeded with `seed`.
#[inline(never)]
fn hash_stream(seed: u32, mut h: u32) -> u32 {
    let mut x = seed | 1;
    for _ in 0..4096 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        for b in 0..4 {
            h ^= (x >> (8 * b)) & 0xff;
            h = h.wrapping_mul(16_777_619);
        }
    }
    h
}

/// One round of worker `index`: its new running hash from `h`.
fn round(index: u32, r: u32, marks: &mut [bool], mut h: u32) -> u32 {
    let base = 1_000_000 + (index * 1000 + r) * 64;
    let primes = sieve_segment(marks, base, &mut h);
    h = hash_stream(index.wrapping_mul(0x9e37_79b9).wrapping_add(r), h);
    h ^ primes
}

/// A worker's report of one round.
struct Done {
    worker: usize,
    round: u32,
    hash: u32,
}

fn arg(args: &[String], i: usize, default: u32) -> u32 {
    args.get(i).map_or(default, |a| a.parse().unwrap_or(0))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n = arg(&args, 1, 4) as usize;
    let rounds = arg(&args, 2, 60);
    if !(1..=MAX_WORKERS).contains(&n) {
        eprintln!("threads-rs: N must be 1..{MAX_WORKERS}");
        std::process::exit(2);
    }
    println!("threads-rs: {n} workers, {rounds} rounds");
    let total = Mutex::new((0u64, 0u64));
    let (done_tx, done_rx) = mpsc::channel::<Done>();
    let mut hashes = vec![vec![0u32; rounds as usize]; n];
    let (names, checksums) = thread::scope(|s| {
        let mut jobs = Vec::new();
        let mut handles = Vec::new();
        for w in 0..n {
            let (job_tx, job_rx) = mpsc::channel::<u32>();
            let done_tx = done_tx.clone();
            let total = &total;
            let handle = thread::Builder::new()
                .name(format!("worker-{w}"))
                .spawn_scoped(s, move || {
                    let name = thread::current().name().unwrap_or("?").to_string();
                    let mut marks = vec![true; SEGMENT as usize];
                    let mut h = 2_166_136_261u32;
                    for r in job_rx {
                        h = round(w as u32, r, &mut marks, h);
                        {
                            let mut t = total.lock().unwrap();
                            t.0 = t.0.wrapping_add(u64::from(h));
                            t.1 += 1;
                        }
                        done_tx
                            .send(Done {
                                worker: w,
                                round: r,
                                hash: h,
                            })
                            .unwrap();
                    }
                    (name, h)
                })
                .unwrap_or_else(|e| {
                    println!("threads-rs: spawning worker {w} failed: {e}");
                    std::process::exit(1);
                });
            jobs.push(job_tx);
            handles.push(handle);
        }
        drop(done_tx);
        // Round by round, one job for every worker: they run side by side.
        for r in 0..rounds {
            for job in &jobs {
                job.send(r).unwrap();
            }
        }
        drop(jobs);
        for d in done_rx.iter() {
            hashes[d.worker][d.round as usize] = d.hash;
        }
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .unzip::<_, _, Vec<String>, Vec<u32>>()
    });
    for (w, (name, sum)) in names.iter().zip(&checksums).enumerate() {
        let last = hashes[w].last().copied().unwrap_or(2_166_136_261);
        let agree = if last == *sum { "ok" } else { "MISMATCH" };
        println!("{name}: checksum {sum:08x} ({agree})");
    }
    let (sum, updates) = *total.lock().unwrap();
    println!("total {sum:016x} after {updates} updates");
    println!("threads done");
}
