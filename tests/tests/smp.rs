//! Programs on four CPUs (`perch record --cpus 4`: QEMU `-smp 4` under TCG, the
//! runtime's default `sched=spread`): a four-thread CPU-bound program (C pthreads with
//! glibc, 64-bit and i386; Rust `std::thread`, 64-bit and i686; Go with GOMAXPROCS=4)
//! prints what it prints natively, and its samples spread over the four CPUs and at
//! least four of its threads, each CPU with at least 15% of them; memory one thread
//! unmaps or write-protects stops working at once for another thread running on
//! another CPU (`tests/programs/c/shootdown.c`).
#![forbid(unsafe_code)]

use e2e_tests::programs::{CBuild, RustTarget, c_program_with, go_program, threads_c, threads_rs};
use e2e_tests::{Recording, perf_present, qemu_present, record_realtime, run_perf};
use linux_perf_data::linux_perf_event_reader::{EventRecord, SampleRecord};
use linux_perf_data::{PerfFileReader, PerfFileRecord};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};

const CPUS: usize = 4;
/// Four workers of 1500 rounds each (about 5.7 billion instructions on x86-64).
const ROUNDS: &[&str] = &["4", "1500"];

/// What the program prints natively (stdout) and its exit status.
fn native(exe: &Path, args: &[&str]) -> (String, Option<i32>) {
    let out = Command::new(exe)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {} natively: {e}", exe.display()));
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        out.status.code(),
    )
}

/// Records `exe args` on four CPUs at 10 kHz in real time (QEMU's multi-threaded TCG
/// runs the four CPUs at once; under `-icount` it runs them one after another, each for
/// a long turn, so a CPU's share of the samples would follow QEMU's turns rather than
/// the program); checks that it printed what it prints natively and that the run ended
/// with it.
fn record_on_four(exe: &Path, args: &[&str]) -> Recording {
    record_on_four_with(exe, args, &[])
}

/// [`record_on_four`] with more `perch record` options.
fn record_on_four_with(exe: &Path, args: &[&str], opts: &[&str]) -> Recording {
    let (want, status) = native(exe, args);
    assert_eq!(status, Some(0), "the native run failed:\n{want}");
    let exe_arg = exe.to_str().expect("a UTF-8 program path");
    let mut a = vec![
        "--cpus",
        "4",
        "--freq",
        "10000",
        "--max-rate",
        "0",
        "--buffer",
        "16",
    ];
    a.extend_from_slice(opts);
    a.extend_from_slice(&["--", exe_arg]);
    a.extend_from_slice(args);
    let rec = record_realtime(240, &a);
    let err = &rec.stderr;
    assert_eq!(rec.status, Some(0), "perch record failed:\n{err}");
    assert!(!err.contains("RUNTIME"), "the runtime crashed:\n{err}");
    assert!(
        err.contains("cpus: 4 of 4 up") && err.contains("threads are spread over them"),
        "not four CPUs with threads spread:\n{err}"
    );
    assert!(
        err.contains("run ended: all processes exited"),
        "the run did not end with the program:\n{err}"
    );
    assert_eq!(
        rec.stdout, want,
        "stdout differs from the native run:\n{err}"
    );
    rec
}

/// Holds the host for one test: the four CPUs' threads of QEMU share the host's cores,
/// and a second machine or a build beside them would leave some CPUs waiting for a host
/// core while others run, which a CPU's share of the samples shows.
fn alone() -> MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// The program's samples (pid not 0: an idle CPU's samples have none) by CPU and by
/// tid, each weighted by its period (the time it stands for), as `perf report --sort
/// cpu` shows them: a CPU that QEMU's host thread left waiting takes the clock's NMIs
/// late, fewer samples that stand for more time each.
fn split(data: &Path) -> (BTreeMap<u32, u64>, BTreeMap<i32, u64>) {
    let (mut cpus, mut tids) = (BTreeMap::new(), BTreeMap::new());
    each_sample(data, |s| {
        let (Some(pid), Some(tid), Some(cpu), Some(period)) = (s.pid, s.tid, s.cpu, s.period)
        else {
            panic!("a sample without PID/TID/CPU/PERIOD: {s:?}");
        };
        if pid != 0 {
            *cpus.entry(cpu).or_default() += period;
            *tids.entry(tid).or_default() += period;
        }
    });
    (cpus, tids)
}

/// Calls `f` with every sample of the perf.data file `data`.
fn each_sample(data: &Path, mut f: impl FnMut(&SampleRecord<'_>)) {
    let reader = std::io::BufReader::new(std::fs::File::open(data).expect("open perf.data"));
    let PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = PerfFileReader::parse_file(reader).expect("linux-perf-data parses the file");
    while let Some(r) = record_iter.next_record(&mut perf_file).expect("a record") {
        let PerfFileRecord::EventRecord { record, .. } = r else {
            continue;
        };
        if let Ok(EventRecord::Sample(s)) = record.parse() {
            f(&s);
        }
    }
}

/// Four CPUs with at least 15% of the program's samples each, and at least four of
/// its threads with samples.
fn assert_spread(rec: &Recording) {
    let (cpus, tids) = split(&rec.data);
    let total: u64 = cpus.values().sum();
    // At least 0.2 s of the program's time (ns).
    assert!(
        total >= 200_000_000,
        "only {total} ns of samples of the program: {cpus:?}\n{}",
        rec.stderr
    );
    assert_eq!(
        cpus.keys().copied().collect::<BTreeSet<u32>>(),
        (0..CPUS as u32).collect(),
        "the program's samples by CPU: {cpus:?}"
    );
    for (cpu, n) in &cpus {
        assert!(
            n * 100 >= total * 15,
            "CPU {cpu} holds {n} of the program's {total} ns of samples (under 15%): {cpus:?}\n{}",
            rec.stderr
        );
    }
    let busy = tids.values().filter(|&&n| n * 20 >= total).count();
    assert!(
        busy >= CPUS,
        "fewer than four threads with 5% of the samples or more: {tids:?}"
    );
}

/// The target's loss total from perch's "target counters: taken T = delivered D +
/// lost L; ..." line (0 when there is none).
fn target_lost(stderr: &str) -> u64 {
    stderr
        .lines()
        .find_map(|l| l.split("target counters: ").nth(1))
        .and_then(|rest| {
            let n = rest.split("+ lost ").nth(1)?;
            n[..n.find(|c: char| !c.is_ascii_digit()).unwrap_or(n.len())]
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// Records `program args` (built by `build` once the host is held) on four CPUs and
/// checks the spread.
fn check_spread(build: impl FnOnce() -> PathBuf, args: &[&str]) {
    let _alone = alone();
    if !qemu_present() {
        return;
    }
    assert_spread(&record_on_four(&build(), args));
}

/// perf's own views of the split: `perf report --sort cpu` lists the four CPUs, and
/// `perf report -T` gives per-thread totals for at least four of the program's
/// threads.
///
/// In real time a vCPU can be kept off the host long enough for its ring to fill.
/// The target then counts losses, perch writes them as LOST records, and perf warns
/// about "lost chunks" and the share of samples lost: allowed only when the target
/// reported losses.
fn assert_perf_shows_the_split(rec: &Recording) {
    let allowed: &[&str] = if target_lost(&rec.stderr) > 0 {
        &[
            "Warning:",
            " chunks!",
            " samples and lost ",
            "Check IO/CPU overload!",
        ]
    } else {
        &[]
    };
    let by_cpu = run_perf(rec, &["report", "--stdio", "--sort", "cpu"], allowed);
    let cpus: BTreeSet<u32> = by_cpu
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains('%'))
        .filter_map(|l| l.split_whitespace().last()?.parse().ok())
        .collect();
    assert_eq!(
        cpus,
        (0..CPUS as u32).collect(),
        "perf report --sort cpu:\n{by_cpu}"
    );
    let threads = run_perf(rec, &["report", "--stdio", "-T"], allowed);
    // The table after "# PID  TID  cpu-clock": pid, tid, the thread's total.
    let table: Vec<(i64, i64, u64)> = threads
        .lines()
        .skip_while(|l| !(l.starts_with('#') && l.contains("PID") && l.contains("TID")))
        .skip(1)
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            match w.as_slice() {
                [p, t, n] => Some((p.parse().ok()?, t.parse().ok()?, n.parse().ok()?)),
                _ => None,
            }
        })
        .collect();
    let busy = table.iter().filter(|(p, _, n)| *p != 0 && *n > 0).count();
    assert!(
        busy >= CPUS,
        "perf report -T: {busy} of the program's threads with a total:\n{threads}"
    );
}

#[test]
fn c_glibc_pthreads_spread_over_four_cpus() {
    let _alone = alone();
    if !qemu_present() {
        return;
    }
    let rec = record_on_four(&threads_c(CBuild::Glibc), ROUNDS);
    assert_spread(&rec);
    if perf_present() {
        assert_perf_shows_the_split(&rec);
    }
}

#[test]
fn c_glibc_i386_pthreads_spread_over_four_cpus() {
    check_spread(|| threads_c(CBuild::Glibc32), ROUNDS);
}

#[test]
fn rust_x86_64_std_threads_spread_over_four_cpus() {
    check_spread(|| threads_rs(RustTarget::X86_64Musl), ROUNDS);
}

#[test]
fn rust_i686_std_threads_spread_over_four_cpus() {
    check_spread(|| threads_rs(RustTarget::I686Musl), ROUNDS);
}

/// `fanout=ipi`: the I/O APIC ticks the boot CPU alone, which forwards every tick to
/// the other three as an NMI IPI; every CPU still samples its share.
#[test]
fn the_clock_forwarded_by_the_boot_cpu_reaches_every_cpu() {
    let _alone = alone();
    if !qemu_present() {
        return;
    }
    let exe = threads_c(CBuild::Glibc);
    let rec = record_on_four_with(&exe, ROUNDS, &["--boot-arg", "fanout=ipi"]);
    assert!(
        rec.stderr.contains("forwards each tick to the other CPUs"),
        "the clock was not forwarded:\n{}",
        rec.stderr
    );
    assert_spread(&rec);
}

#[test]
fn go_goroutines_spread_over_four_cpus() {
    check_spread(|| go_program("threads"), &["600000000"]);
}

/// munmap and mprotect by one thread reach another thread of the process running on
/// another CPU before they return: its next access faults, natively and under the
/// runtime (whose TLB shootdown makes the other CPU drop the old translation). A
/// thread that keeps writing a page while another unmaps it never writes to the page's
/// memory once it is free (the runtime frees it only after the shootdown; before, the
/// late writes overwrote the free list's link and the next allocations crashed). The
/// checks run again with the touching thread pinned to CPU 0 and the changing one to
/// CPU 1: a change made on another CPU reaches the boot CPU too (the shootdown used to
/// skip it, and i386 Rust threads crashed in musl's malloc about one run in ten). Four
/// threads that fault on the same fresh page at once all go on (the one that comes
/// second finds the page present and resumes).
#[test]
fn memory_taken_from_a_thread_on_another_cpu_faults_at_once() {
    let _alone = alone();
    let exe = c_program_with("shootdown", CBuild::Glibc, &["-pthread"], "");
    let (out, status) = native(&exe, &["20"]);
    assert_eq!(status, Some(0), "native:\n{out}");
    assert!(
        out.contains("unmap: 20 of 20")
            && out.contains("protect: 20 of 20")
            && out.contains("unmap-write: 20 of 20")
            && out.contains("first-touch: 20 of 20"),
        "native:\n{out}"
    );
    // The pinned pass (a change made on another CPU reaches the first, the runtime's
    // boot CPU) needs CPUs 0 and 1 here; under the runtime there are four.
    if !out.contains("pinned: skipped") {
        assert!(
            out.contains("unmap (CPU 1 to CPU 0): 20 of 20")
                && out.contains("protect (CPU 1 to CPU 0): 20 of 20")
                && out.contains("unmap-write (CPU 1 to CPU 0): 20 of 20"),
            "native:\n{out}"
        );
    }
    if !qemu_present() {
        return;
    }
    let rec = record_on_four(&exe, &["20"]);
    // Both threads ran, on two CPUs.
    let (cpus, _) = split(&rec.data);
    assert!(cpus.len() >= 2, "the program ran on one CPU: {cpus:?}");
}

/// Samples and lost samples (LOST_SAMPLES records, as in the storm test) in perf.data
/// by CPU: (samples, lost).
fn per_cpu_counts(data: &Path) -> BTreeMap<u32, (u64, u64)> {
    let reader = std::io::BufReader::new(std::fs::File::open(data).expect("open perf.data"));
    let PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = PerfFileReader::parse_file(reader).expect("linux-perf-data parses the file");
    let mut by_cpu: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    while let Some(r) = record_iter.next_record(&mut perf_file).expect("a record") {
        let PerfFileRecord::EventRecord { record, .. } = r else {
            continue;
        };
        // PERF_RECORD_LOST_SAMPLES: u64 lost, then the sample id.
        if record.record_type.0 == 13 {
            let body = record.data.as_slice();
            let lost = u64::from_le_bytes(body[..8].try_into().expect("8 bytes"));
            let common = record
                .common_data()
                .expect("a LOST_SAMPLES record's sample_id");
            let cpu = common.cpu.expect("a LOST_SAMPLES record's CPU");
            by_cpu.entry(cpu).or_default().1 += lost;
            continue;
        }
        if let Ok(EventRecord::Sample(s)) = record.parse() {
            let cpu = s.cpu.expect("a sample's CPU");
            by_cpu.entry(cpu).or_default().0 += 1;
        }
    }
    by_cpu
}

/// With a ring of four samples per CPU, most of four CPUs' samples are lost, and
/// perf.data accounts for every one, CPU by CPU: each CPU's samples and LOST counts
/// there are what the target counted for it (`taken = delivered + lost`), and the
/// totals are the End record's.
#[test]
fn every_cpus_losses_reach_perf_data_exactly() {
    let _alone = alone();
    if !qemu_present() {
        return;
    }
    let exe = threads_c(CBuild::Glibc);
    let exe_arg = exe.to_str().expect("a UTF-8 program path");
    let mut a = vec![
        "--cpus",
        "4",
        "--freq",
        "10000",
        "--max-rate",
        "0",
        "--ring",
        "4",
        "--",
        exe_arg,
    ];
    a.extend_from_slice(ROUNDS);
    let rec = record_realtime(240, &a);
    let err = &rec.stderr;
    assert_eq!(rec.status, Some(0), "perch record failed:\n{err}");
    // The target's own count, CPU by CPU.
    let mut target: BTreeMap<u32, (u64, u64, u64)> = BTreeMap::new();
    for line in err.lines() {
        let Some(rest) = line.split("perch: CPU ").nth(1) else {
            continue;
        };
        let n: Vec<u64> = rest
            .split(|c: char| !c.is_ascii_digit())
            .filter(|w| !w.is_empty())
            .map(|w| w.parse().expect("a number"))
            .collect();
        assert_eq!(n.len(), 4, "a CPU counter line: {line}");
        assert_eq!(n[1], n[2] + n[3], "taken = delivered + lost: {line}");
        target.insert(n[0] as u32, (n[1], n[2], n[3]));
    }
    assert_eq!(
        target.keys().copied().collect::<Vec<u32>>(),
        vec![0, 1, 2, 3],
        "four CPU counter lines:\n{err}"
    );
    let file = per_cpu_counts(&rec.data);
    for (cpu, (taken, delivered, lost)) in &target {
        assert!(*lost > 0, "CPU {cpu} lost nothing with a ring of 4:\n{err}");
        assert_eq!(
            file.get(cpu).copied().unwrap_or_default(),
            (*delivered, *lost),
            "CPU {cpu}: perf.data's (samples, lost) against the target's {taken} taken:\n{err}"
        );
    }
    let (taken, delivered, lost) = target
        .values()
        .fold((0, 0, 0), |a, t| (a.0 + t.0, a.1 + t.1, a.2 + t.2));
    assert!(
        err.contains(&format!(
            "target counters: taken {taken} = delivered {delivered} + lost {lost}"
        )),
        "the End record's totals are the CPUs' sums ({taken} = {delivered} + {lost}):\n{err}"
    );
}

/// Runs the C program `name` (built with glibc and pthreads), which checks
/// itself and prints `...: no` for what failed: natively, then on four CPUs,
/// where it must print the same.
fn self_checking_on_four(name: &str) {
    let _alone = alone();
    let exe = c_program_with(name, CBuild::Glibc, &["-pthread"], "");
    let (out, status) = native(&exe, &[]);
    assert_eq!(status, Some(0), "native:\n{out}");
    assert!(!out.contains(": no"), "native:\n{out}");
    if !qemu_present() {
        return;
    }
    record_on_four(&exe, &[]);
}

/// What a program learns of four CPUs: sched_getaffinity, get_nprocs and sysconf
/// agree, sched_getcpu answers below the count, four spinning threads see more
/// than one CPU through it (as natively on a host of two CPUs or more),
/// /proc/cpuinfo names each, and glibc's pthread_getattr_np finds the main
/// thread's stack (in /proc/self/maps).
#[test]
fn a_program_sees_the_cpus_it_runs_on() {
    self_checking_on_four("cpus");
}

/// `pmu=sim` on four CPUs: each CPU programs its own simulated PMU (the real Intel
/// driver against a simulator of its own, advanced by the clock's NMIs there), so the
/// program's PEBS samples, each with the data address of its record, come from all
/// four CPUs, and each CPU's count holds. (With one simulator for every CPU, two CPUs
/// stepped it at once and the runtime crashed.)
#[test]
fn every_cpu_samples_with_its_own_simulated_pmu() {
    let _alone = alone();
    if !qemu_present() {
        return;
    }
    let rec = record_on_four_with(&threads_c(CBuild::Glibc), ROUNDS, &["--pmu", "sim"]);
    let err = &rec.stderr;
    assert!(
        err.contains("SIMULATED PMU") && !err.contains("PMU not programmed"),
        "not the simulated PMU on every CPU:\n{err}"
    );
    // The program's samples by CPU: (samples, with a data address).
    let mut by_cpu: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    each_sample(&rec.data, |s| {
        if s.pid.is_some_and(|p| p != 0) {
            let e = by_cpu.entry(s.cpu.expect("a sample's CPU")).or_default();
            e.0 += 1;
            e.1 += u64::from(s.addr.is_some_and(|a| a != 0));
        }
    });
    let total: u64 = by_cpu.values().map(|v| v.0).sum();
    assert!(
        total >= 400,
        "only {total} samples of the program: {by_cpu:?}"
    );
    assert_eq!(
        by_cpu.keys().copied().collect::<Vec<u32>>(),
        vec![0, 1, 2, 3],
        "the program's samples by CPU: {by_cpu:?}\n{err}"
    );
    // Every CPU's own PMU samples: a CPU whose simulator never overflows has
    // none of the program's samples, or a stray few. How evenly the four share
    // them is up to the host: four vCPUs on a 2-core host get unequal time (the
    // boot CPU often a half, another CPU as little as 8%), so the floor is 4%.
    for (cpu, (n, with_addr)) in &by_cpu {
        assert!(
            n * 100 >= total * 4,
            "CPU {cpu} has {n} of {total} samples: {by_cpu:?}"
        );
        assert!(
            *with_addr * 2 >= *n,
            "CPU {cpu}: {with_addr} of {n} samples with a PEBS data address"
        );
    }
    let counts = err
        .lines()
        .filter(|l| l.contains("perch: CPU ") && l.contains("taken"))
        .count();
    assert_eq!(counts, 4, "a count line per CPU:\n{err}");
}

/// CPU affinity: a thread that pins itself (sched_setaffinity) is on its CPU when the
/// call returns and stays there, threads pinned one to a CPU run only there, a thread
/// pinned by another (pthread_setaffinity_np, by its tid) moves there and stays, a
/// child process pinned by its parent (by its pid) moves there too, and the masks read
/// back as set (`tests/programs/c/pin.c`, which prints the same on any machine of two
/// CPUs or more).
#[test]
fn threads_pinned_to_a_cpu_run_only_there() {
    self_checking_on_four("pin");
}
