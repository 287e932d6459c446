//! Threads under the runtime: the thread test programs (`tests/programs/c/threads.c`
//! with pthreads, built with glibc 64- and 32-bit and musl; `threads-rs` with
//! `std::thread`, built for x86_64 and i686 musl) print under the runtime exactly what
//! they print natively and end the same way; and a recording of the 64-bit glibc build
//! gives each of its four named worker threads its own tid, a COMM record with its
//! name, and a fair share of the samples.
#![forbid(unsafe_code)]

use e2e_tests::programs::{
    CBuild, End, Program, RustTarget, assert_same_as_native, threads_c, threads_rs,
};
use e2e_tests::{qemu_present, record};
use linux_perf_data::linux_perf_event_reader::EventRecord;
use linux_perf_data::{PerfFileReader, PerfFileRecord};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

/// A run that should end by itself: the duration is only a backstop (each program takes
/// a fraction of a second natively, a few seconds under TCG).
const CMDLINE: &str = "duration=60000";
const TIMEOUT: Duration = Duration::from_secs(120);

/// The workers and rounds every run uses: about 230 million instructions in all
/// (x86-64 glibc), a quarter per worker.
const WORKERS: usize = 4;
const ARGS: &[&str] = &["4", "60"];

/// System calls a threaded program needs that a runtime without threads lacks.
const THREAD_CALLS: &[&str] = &["clone", "clone3", "futex", "set_robust_list", "rseq"];

/// The lines both programs print the same way: one checksum per worker, in worker
/// order, and the total (the same work in C and Rust gives the same numbers).
fn check_lines(out: &str) -> Vec<&str> {
    out.lines()
        .filter(|l| l.starts_with("worker-") || l.starts_with("total "))
        .map(|l| l.split(" (").next().unwrap_or(l))
        .collect()
}

/// The native run did what the tests rely on: every worker reported, the total counts
/// every round, `threads done`, exit status 0; and a second run prints the same.
fn assert_native_threads_work(p: &Program) {
    let native = p.native();
    let out = native.out();
    assert_eq!(native, p.native(), "two native runs differ");
    for w in 0..WORKERS {
        assert!(
            out.contains(&format!("worker-{w}: checksum ")),
            "native run lacks worker-{w}:\n{out}"
        );
    }
    for needle in ["after 240 updates", "threads done"] {
        assert!(out.contains(needle), "native run lacks {needle:?}:\n{out}");
    }
    assert!(
        !out.contains("MISMATCH") && !out.contains("failed"),
        "{out}"
    );
    assert_eq!(native.end, Some(End::Exited(0)), "native run:\n{out}");
    assert!(
        native.stderr.is_empty(),
        "native stderr: {:?}",
        native.stderr
    );
}

fn check(exe: PathBuf, name: &str) {
    let p = Program::new(&exe, name, ARGS, &[]);
    assert_native_threads_work(&p);
    if !qemu_present() {
        return;
    }
    // The runtime must know every thread-related call the program made.
    assert_same_as_native(std::slice::from_ref(&p), CMDLINE, TIMEOUT, THREAD_CALLS);
}

#[test]
fn c_glibc_threads_match_their_native_run() {
    check(threads_c(CBuild::Glibc), "thr-glibc");
}

#[test]
fn c_glibc_i386_threads_match_their_native_run() {
    check(threads_c(CBuild::Glibc32), "thr-glibc32");
}

#[test]
fn c_musl_threads_match_their_native_run() {
    check(threads_c(CBuild::Musl), "thr-musl");
}

#[test]
fn rust_x86_64_musl_threads_match_their_native_run() {
    check(threads_rs(RustTarget::X86_64Musl), "thr-rust64");
}

#[test]
fn rust_i686_musl_threads_match_their_native_run() {
    check(threads_rs(RustTarget::I686Musl), "thr-rust32");
}

/// Natively, the five builds agree with each other: the C builds print the same bytes,
/// the Rust builds too, and all five the same checksums and total.
#[test]
fn the_five_builds_compute_the_same_checksums_natively() {
    let outs: Vec<(String, String)> = [
        ("C glibc", threads_c(CBuild::Glibc)),
        ("C glibc -m32", threads_c(CBuild::Glibc32)),
        ("C musl", threads_c(CBuild::Musl)),
        ("Rust x86_64", threads_rs(RustTarget::X86_64Musl)),
        ("Rust i686", threads_rs(RustTarget::I686Musl)),
    ]
    .into_iter()
    .map(|(what, exe)| {
        (
            what.to_string(),
            Program::new(&exe, "t", ARGS, &[]).native().out(),
        )
    })
    .collect();
    assert_eq!(outs[0].1, outs[1].1, "{outs:?}");
    assert_eq!(outs[0].1, outs[2].1, "{outs:?}");
    assert_eq!(outs[3].1, outs[4].1, "{outs:?}");
    let want = check_lines(&outs[0].1);
    assert_eq!(want.len(), WORKERS + 1, "{outs:?}");
    for (what, out) in &outs {
        assert_eq!(check_lines(out), want, "{what}:\n{out}");
    }
}

/// What a perf.data file says about threads: the COMM records as (pid, tid, name) in
/// file order, the samples per (pid, tid) with the time and file position of the
/// last, and the EXIT records as (pid, tid, time, file position).
#[derive(Debug, Default)]
struct ThreadRecords {
    comms: Vec<(i32, i32, String)>,
    samples: BTreeMap<(i32, i32), u64>,
    last_sample: BTreeMap<(i32, i32), (u64, usize)>,
    exits: Vec<(i32, i32, u64, usize)>,
    /// PERF_RECORD_READ counts (what `perf report -T` lists) by (pid, tid).
    counts: BTreeMap<(i32, i32), u64>,
}

fn thread_records(data: &std::path::Path) -> ThreadRecords {
    let reader = std::io::BufReader::new(std::fs::File::open(data).expect("open perf.data"));
    let PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = PerfFileReader::parse_file(reader).expect("linux-perf-data parses the file");
    let mut t = ThreadRecords::default();
    let mut at = 0;
    while let Some(r) = record_iter.next_record(&mut perf_file).expect("a record") {
        at += 1;
        let PerfFileRecord::EventRecord { record, .. } = r else {
            continue;
        };
        if record.record_type.0 == 8 {
            let d = record.data.as_slice();
            let i32_at = |o: usize| i32::from_le_bytes(d[o..o + 4].try_into().expect("4 bytes"));
            let value = u64::from_le_bytes(d[8..16].try_into().expect("8 bytes"));
            t.counts.insert((i32_at(0), i32_at(4)), value);
            continue;
        }
        match record.parse() {
            Ok(EventRecord::Sample(s)) => {
                let (Some(pid), Some(tid), Some(time)) = (s.pid, s.tid, s.timestamp) else {
                    panic!("a sample without PID/TID/TIME: {s:?}");
                };
                *t.samples.entry((pid, tid)).or_default() += 1;
                t.last_sample.insert((pid, tid), (time, at));
            }
            Ok(EventRecord::Exit(e)) => t.exits.push((e.pid, e.tid, e.timestamp, at)),
            Ok(EventRecord::Comm(c)) => t.comms.push((
                c.pid,
                c.tid,
                String::from_utf8_lossy(&c.name.as_slice()).into_owned(),
            )),
            _ => {}
        }
    }
    t
}

/// `perch record` of the 64-bit glibc build: one pid, at least four tids with samples,
/// a COMM record naming each worker `worker-N` on its own tid, and each worker with at
/// least 15% of the workers' samples (each does a quarter of the work).
#[test]
fn a_recording_gives_each_named_worker_thread_its_tid_comm_and_share() {
    let exe = threads_c(CBuild::Glibc);
    assert_native_threads_work(&Program::new(&exe, "threads", ARGS, &[]));
    if !qemu_present() {
        return;
    }
    let exe_arg = exe.to_str().expect("a UTF-8 program path");
    let mut args = vec![
        "--freq",
        "20000",
        "--max-rate",
        "0",
        "--duration",
        "60",
        "--",
        exe_arg,
    ];
    args.extend_from_slice(ARGS);
    let rec = record(&args);
    let err = &rec.stderr;
    assert_eq!(rec.status, Some(0), "perch record failed:\n{err}");
    assert!(!err.contains("RUNTIME"), "the runtime crashed:\n{err}");
    let thread_calls: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("unknown system calls:"))
        .filter(|l| THREAD_CALLS.iter().any(|c| l.contains(&format!("({c})"))))
        .collect();
    assert!(
        thread_calls.is_empty(),
        "the runtime does not know the thread calls: {thread_calls:?}\n{err}"
    );
    assert!(
        err.contains("run ended: all processes exited"),
        "the run did not end with the program:\n{err}"
    );
    let all_out = format!("{}\n{err}", rec.stdout);
    assert!(
        all_out.contains("threads done") && all_out.contains("after 240 updates"),
        "the program did not finish its rounds:\n{}\n{err}",
        rec.stdout
    );

    let t = thread_records(&rec.data);
    // Each worker's tid: the tid its last COMM record names it on.
    let mut named: BTreeMap<String, (i32, i32)> = BTreeMap::new();
    for (pid, tid, name) in &t.comms {
        if name.starts_with("worker-") {
            let old = named.insert(name.clone(), (*pid, *tid));
            assert!(
                old.is_none() || old == Some((*pid, *tid)),
                "{name} named on two tasks: {old:?} and ({pid}, {tid}); COMMs: {:?}",
                t.comms
            );
        }
    }
    let want: Vec<String> = (0..WORKERS).map(|w| format!("worker-{w}")).collect();
    assert_eq!(
        named.keys().cloned().collect::<Vec<_>>(),
        want,
        "a COMM record per worker; COMMs: {:?}",
        t.comms
    );
    let pids: BTreeSet<i32> = named.values().map(|&(pid, _)| pid).collect();
    assert_eq!(pids.len(), 1, "the workers are in one process: {named:?}");
    let pid = *pids.first().expect("one pid");
    assert_ne!(pid, 0, "the workers are not the runtime: {named:?}");
    let tids: BTreeSet<i32> = named.values().map(|&(_, tid)| tid).collect();
    assert_eq!(tids.len(), WORKERS, "a tid per worker: {named:?}");
    assert!(
        !tids.contains(&pid),
        "no worker is the main thread (tid = pid): {named:?}"
    );

    let sampled: BTreeSet<i32> = t
        .samples
        .iter()
        .filter(|&(&(p, _), &n)| p == pid && n > 0)
        .map(|(&(_, tid), _)| tid)
        .collect();
    assert!(
        sampled.len() >= WORKERS,
        "samples under pid {pid} carry only tids {sampled:?}; samples: {:?}",
        t.samples
    );
    // Every thread of the process ends once, after its last sample.
    let mut ended: Vec<(i32, i32)> = t.exits.iter().map(|e| (e.0, e.1)).collect();
    ended.sort();
    let mut want_ended: Vec<(i32, i32)> = named.values().copied().collect();
    want_ended.push((pid, pid));
    want_ended.sort();
    assert_eq!(ended, want_ended, "an EXIT per thread; {:?}", t.exits);
    for &(p, tid, time, at) in &t.exits {
        if let Some(&(last, last_at)) = t.last_sample.get(&(p, tid)) {
            assert!(
                time >= last && at > last_at,
                "thread {tid}'s EXIT (time {time}, record {at}) before its last sample (time {last}, record {last_at})"
            );
        }
    }

    // Every sampled thread's count (`perf report -T`) is positive.
    for key in t.samples.keys() {
        assert!(
            t.counts.get(key).is_some_and(|&c| c > 0),
            "no count for {key:?}: {:?}",
            t.counts
        );
    }

    let per_worker: Vec<(String, u64)> = named
        .iter()
        .map(|(name, key)| (name.clone(), t.samples.get(key).copied().unwrap_or(0)))
        .collect();
    let workers_total: u64 = per_worker.iter().map(|(_, n)| n).sum();
    assert!(
        workers_total >= 400,
        "too few worker samples ({workers_total}): {per_worker:?}; samples: {:?}",
        t.samples
    );
    for (name, n) in &per_worker {
        let share = 100.0 * *n as f64 / workers_total as f64;
        assert!(
            share >= 15.0,
            "{name}: {share:.1}% of the workers' samples; {per_worker:?}"
        );
    }
}
