//! Threads, futexes and signals used carelessly or with hostile intent
//! (`tests/programs/c/hostile.c`, built with glibc for x86-64 and i386): a
//! program that makes threads without end gets `EAGAIN` at the runtime's
//! per-process limit and can go on; signals to threads that have exited are
//! `ESRCH`; threads that exit while others wait on a futex (their tid word,
//! a robust mutex they hold, futexes no one will wake, the main thread's
//! own exit) never hang the run; a program that opens sockets until one is
//! refused (the runtime's heap runs out before its descriptors), leaves
//! connections half-open and resets one mid-request gets its errors and
//! can go on; forks without end get `EAGAIN`, and a fork bomb ends with
//! the run. Forged `rt_sigreturn` frames are in
//! `isolation.rs`, random arguments to all of these calls in the fuzzer
//! (`programs.rs`).
#![forbid(unsafe_code)]

use e2e_tests::programs::{
    CBuild, End, Program, RunEnd, appliance, assert_same_as_native, c_program_with, run_appliance,
};
use e2e_tests::{STATUS_PASS, qemu_present};
use std::path::PathBuf;
use std::time::Duration;

const CMDLINE: &str = "duration=60000";
const TIMEOUT: Duration = Duration::from_secs(180);

/// The system calls these programs make that the runtime must know.
const CALLS: &[&str] = &[
    "clone",
    "clone3",
    "futex",
    "set_robust_list",
    "set_tid_address",
    "tgkill",
    "tkill",
    "gettid",
];

fn hostile(build: CBuild) -> PathBuf {
    c_program_with("hostile", build, &["-pthread"], "")
}

/// The acts whose output is the same natively and under the runtime, for
/// both ABIs in one run.
#[test]
fn threads_that_exit_under_waiters_and_signals_to_dead_threads_end_as_on_linux() {
    let mut programs = Vec::new();
    for (build, abi) in [(CBuild::Glibc, "64"), (CBuild::Glibc32, "32")] {
        let exe = hostile(build);
        for act in [
            "dead",
            "cleartid",
            "robust",
            "main-exits",
            "abandon",
            "sockets",
        ] {
            let p = Program::new(&exe, &format!("{act}{abi}"), &[act], &[]);
            let native = p.native();
            assert_eq!(native.end, Some(End::Exited(0)), "{act} natively");
            if act == "dead" {
                let out = native.out();
                assert_eq!(out.matches(": ESRCH").count(), 6, "{out}");
                assert_eq!(out.matches(": EINVAL").count(), 1, "{out}");
                assert_eq!(out.matches(": 0\n").count(), 2, "{out}");
            }
            programs.push(p);
        }
    }
    if !qemu_present() {
        return;
    }
    assert_same_as_native(&programs, CMDLINE, TIMEOUT, CALLS);
}

/// Alone in a run (the runtime's task table holds 64 threads in all), a
/// process makes 63 threads besides its main one, then gets `EAGAIN`; once
/// they are joined it can make another, and threads made and joined one at
/// a time (many more than the limit) never run out.
#[test]
fn endless_threads_get_eagain_at_the_per_process_limit() {
    let tail = "limit: all joined\nlimit: one more thread: 0\nlimit: 200 more, one at a time\n";
    limit_act(
        "limit",
        &format!("limit: 100 threads\n{tail}"),
        &format!("limit: 63 threads, then EAGAIN\n{tail}"),
    );
}

/// Runs hostile `act 100` in both ABIs, alone in a run: natively it
/// prints `native`, under the runtime (whose table holds 64 threads and
/// processes in all) `guest`, and ends with status 0.
fn limit_act(act: &str, native: &str, guest: &str) {
    for (build, abi) in [(CBuild::Glibc, "64"), (CBuild::Glibc32, "32")] {
        let name = format!("{act}{abi}");
        let p = Program::new(&hostile(build), &name, &[act, "100"], &[]);
        assert_eq!(p.native().out(), native);
        if !qemu_present() {
            continue;
        }
        let run = run_appliance(&appliance(std::slice::from_ref(&p)), CMDLINE, TIMEOUT);
        let t = run.transcript();
        assert_eq!(run.boot.status, Some(STATUS_PASS), "{t}");
        assert_eq!(run.console.run_end, Some(RunEnd::AllExited), "{t}");
        let g = run.console.process(&name);
        assert_eq!(g.out(), guest, "{t}");
        assert_eq!(g.end, Some(End::Exited(0)), "{t}");
    }
}

/// Alone in a run, a process forks children that wait on a pipe until
/// `fork` says `EAGAIN` (the runtime's table holds 64 processes and
/// threads in all); once they are reaped it can fork again, and children
/// forked and reaped one at a time (many more than the limit) never run
/// out. A fork bomb, every process forking for ever, fills the table,
/// gets `EAGAIN` from then on, and the run still ends at its duration.
#[test]
fn endless_forks_get_eagain_and_a_fork_bomb_ends_with_the_run() {
    let tail = "forks: all reaped, 0 ended badly\nforks: one more: made, status 0\n\
                forks: 200 more, one at a time\n";
    limit_act(
        "forks",
        &format!("forks: 100 children\n{tail}"),
        &format!("forks: 63 children, then EAGAIN\n{tail}"),
    );
    if !qemu_present() {
        return;
    }
    let bomb = Program::new(
        &hostile(CBuild::Glibc),
        "bomb",
        &["bomb"],
        &["PERCH_FUZZ_GUEST=1"],
    );
    let run = run_appliance(
        &appliance(std::slice::from_ref(&bomb)),
        "duration=3000",
        TIMEOUT,
    );
    let t = run.transcript();
    assert_eq!(run.boot.status, Some(STATUS_PASS), "{t}");
    assert!(
        matches!(run.console.run_end, Some(RunEnd::Duration { still_running }) if still_running >= 60),
        "{t}"
    );
    assert!(
        run.console
            .process("bomb")
            .out()
            .starts_with("bomb: forking\n"),
        "{t}"
    );
}
