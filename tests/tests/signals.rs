//! Signals and Go under the runtime: a C program whose handlers run as on
//! Linux (SIGALRM from setitimer, a SIGSEGV handler that siglongjmps out,
//! tgkill to another thread, a handler on a sigaltstack, sigsuspend, a
//! SA_SIGINFO handler that returns),
//! built with glibc and musl, and with glibc for i386 (its handlers get
//! Linux's ia32 frames); and a Go program, whose runtime starts OS
//! threads and preempts goroutines with signals, run and profiled thread
//! by thread.
#![forbid(unsafe_code)]

use e2e_tests::programs::{CBuild, Program, assert_same_as_native, c_program_with, go_program};
use e2e_tests::{qemu_and_perf_present, qemu_present, record, run_perf};
use std::collections::BTreeMap;
use std::time::Duration;

const CMDLINE: &str = "duration=60000";
const TIMEOUT: Duration = Duration::from_secs(120);

fn signals(build: CBuild, name: &str) -> Program {
    let exe = c_program_with("signals", build, &["-pthread"], "");
    Program::new(&exe, name, &[], &[])
}

/// The native run printed every check as passed (what the runtime's run
/// is then compared with).
fn assert_native_signals_work(p: &Program) {
    let out = p.native().out();
    for line in [
        "SIGALRM from setitimer: five",
        "SIGSEGV handled, si_addr right, siglongjmp out",
        "SIGUSR1 by tgkill ran in the worker: 1",
        "SIGUSR1 on the sigaltstack: yes",
        "SIGUSR2 while blocked: 0",
        "SIGUSR2 after sigsuspend: 1",
        "SA_SIGINFO handler returned: info right, saved mask right, stack aligned",
        "mask after it: SIGUSR2 blocked, SIGWINCH unblocked",
        "signals done",
    ] {
        assert!(out.contains(line), "native run lacks {line:?}:\n{out}");
    }
}

#[test]
fn signal_handlers_run_as_natively_with_glibc_musl_and_i386_glibc() {
    let programs = [
        signals(CBuild::Glibc, "signals-glibc"),
        signals(CBuild::Musl, "signals-musl"),
        signals(CBuild::Glibc32, "signals-glibc32"),
    ];
    for p in &programs {
        assert_native_signals_work(p);
    }
    if !qemu_present() {
        return;
    }
    assert_same_as_native(&programs, CMDLINE, TIMEOUT, &[]);
}

/// The restart and sigtimedwait checks of `restart.c`, as Linux answers them.
const RESTART_LINES: [&str; 9] = [
    "futex (SA_RESTART): woken, handler ran 1 time(s)",
    "futex: EINTR, handler ran 1 time(s)",
    "timed futex (SA_RESTART): EINTR, handler ran 1 time(s)",
    "nanosleep (SA_RESTART): EINTR, handler ran 1 time(s)",
    "pause (SA_RESTART): EINTR, handler ran 1 time(s)",
    "sigtimedwait, pending: 12, si_signo 12, si_code sent, si_pid ours",
    "sigtimedwait, sent by a thread: 12, si_signo 12",
    "sigtimedwait, nothing sent: -1, EAGAIN",
    "restart done",
];

#[test]
fn interrupted_waits_and_sigtimedwait_end_as_natively() {
    let programs: Vec<Program> = [
        (CBuild::Glibc, "restart-glibc"),
        (CBuild::Glibc32, "restart-glibc32"),
        (CBuild::Musl, "restart-musl"),
    ]
    .into_iter()
    .map(|(build, name)| {
        let exe = c_program_with("restart", build, &["-pthread"], "");
        Program::new(&exe, name, &[], &[])
    })
    .collect();
    for p in &programs {
        let out = p.native().out();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines, RESTART_LINES, "native run of {}", p.spec.name);
    }
    if !qemu_present() {
        return;
    }
    assert_same_as_native(&programs, CMDLINE, TIMEOUT, &["futex", "rt_sigtimedwait"]);
}

fn go_threads() -> Program {
    Program::new(&go_program("threads"), "gothreads", &[], &[])
}

#[test]
fn a_go_program_runs_its_goroutines_on_four_threads_as_natively() {
    let p = go_threads();
    assert!(p.native().out().contains("go done"));
    if !qemu_present() {
        return;
    }
    assert_same_as_native(&[p], CMDLINE, TIMEOUT, &[]);
}

#[test]
fn the_go_programs_work_is_sampled_on_at_least_four_threads_of_one_pid() {
    if !qemu_and_perf_present() {
        return;
    }
    let exe = go_program("threads");
    let rec = record(&["--", exe.to_str().expect("a UTF-8 path")]);
    assert_eq!(rec.status, Some(0), "perch record failed:\n{}", rec.stderr);
    assert!(rec.stdout.contains("go done"), "{}", rec.stdout);
    let script = run_perf(&rec, &["script", "-G", "-F", "pid,tid,ip,sym"], &[]);
    // Samples in the goroutines' work, by (pid, tid).
    let mut work: BTreeMap<(u32, u32), usize> = BTreeMap::new();
    for line in script.lines() {
        let mut f = line.split_whitespace();
        let (Some(ids), Some(_ip), Some(sym)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if !sym.starts_with("main.") {
            continue;
        }
        let Some((pid, tid)) = ids.split_once('/') else {
            continue;
        };
        let (Ok(pid), Ok(tid)) = (pid.parse(), tid.parse()) else {
            continue;
        };
        *work.entry((pid, tid)).or_default() += 1;
    }
    let total: usize = work.values().sum();
    let pids: std::collections::BTreeSet<u32> = work.keys().map(|k| k.0).collect();
    assert_eq!(pids.len(), 1, "the work's samples name one pid: {work:?}");
    let busy: Vec<usize> = work
        .values()
        .copied()
        .filter(|&n| n * 10 >= total)
        .collect();
    assert!(
        busy.len() >= 4,
        "at least four threads hold 10% or more of the goroutines' {total} samples: {work:?}"
    );
    // Each thread is named in perf.data (the Go runtime does not name its
    // threads, so each carries the program's name).
    let comms = run_perf(&rec, &["script", "-F", "tid,comm"], &[]);
    for (_, tid) in work.keys() {
        let tid = tid.to_string();
        assert!(
            comms.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.contains(&"threads") && f.contains(&tid.as_str())
            }),
            "thread {tid} has no COMM:\n{comms}"
        );
    }
}
