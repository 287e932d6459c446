//! Waits on files that another thread ends, under the runtime:
//! `tests/programs/c/poll.c` (epoll over a pipe and an eventfd, `poll`,
//! `select`, plain reads of a pipe and an eventfd, a write to a full pipe,
//! a read a close ends, edge- against level-triggered epoll, timeouts,
//! and for 64-bit a SIGALRM that interrupts an `epoll_wait`, one that
//! `ppoll`'s mask holds off, and an SA_RESTART one after which a pipe
//! read goes on),
//! built with glibc 64- and 32-bit and musl, and `tests/programs/go/timers`
//! (Go's netpoller: `time.Sleep`, `time.After` in a `select`, an `os.Pipe`
//! read across goroutines) print exactly what they print natively and end
//! the same way.
#![forbid(unsafe_code)]

use e2e_tests::programs::{CBuild, Program, assert_same_as_native, c_program_with, go_program};
use e2e_tests::qemu_present;
use std::time::Duration;

const CMDLINE: &str = "duration=60000";
const TIMEOUT: Duration = Duration::from_secs(120);

/// The calls these programs wait in.
const WAIT_CALLS: &[&str] = &[
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_wait",
    "epoll_pwait",
    "eventfd",
    "eventfd2",
];

fn poll_c(build: CBuild, name: &str) -> Program {
    let exe = c_program_with("poll", build, &["-pthread"], "");
    Program::new(&exe, name, &[], &[])
}

#[test]
fn threads_wake_each_other_through_pipes_eventfds_poll_select_and_epoll() {
    let programs = [
        poll_c(CBuild::Glibc, "poll-glibc"),
        poll_c(CBuild::Glibc32, "poll-glibc32"),
        poll_c(CBuild::Musl, "poll-musl"),
    ];
    let signal_lines = [
        "epoll_wait and SIGALRM: -1 (Interrupted system call), handler ran 1",
        "ppoll with SIGALRM blocked: 0, then the handler ran: 2",
        "read under an SA_RESTART handler: 1 r",
    ];
    for p in &programs {
        let out = p.native().out();
        // 64-bit only: the runtime runs no i386 handlers yet.
        if !p.spec.name.ends_with("32") {
            for line in signal_lines {
                assert!(out.contains(line), "native run lacks {line:?}:\n{out}");
            }
        }
        for line in [
            "edge: 1 then 0",
            "timeouts: epoll 0 poll 0 select 0, waited yes",
            "epoll eventfd: 1 [events=0x1 data=200]",
            "blocking pipe read: hello",
            "blocking eventfd read: 7",
            "blocked write: 4096",
            "read after the close: 0",
            "poll done",
        ] {
            assert!(out.contains(line), "native run lacks {line:?}:\n{out}");
        }
    }
    if !qemu_present() {
        return;
    }
    assert_same_as_native(&programs, CMDLINE, TIMEOUT, WAIT_CALLS);
}

#[test]
fn go_timers_selects_and_pipe_reads_wait_in_the_poller_as_natively() {
    let p = Program::new(&go_program("timers"), "gotimers", &[], &[]);
    let out = p.native().out();
    for line in [
        "slept at least 20ms: true",
        "time.After fired",
        "first: goroutine",
        "read \"message 0\\nmessage 1\\nmessage 2\\n\" err=<nil>",
        "deadline read: 0 true",
        "timers done",
    ] {
        assert!(out.contains(line), "native run lacks {line:?}:\n{out}");
    }
    if !qemu_present() {
        return;
    }
    assert_same_as_native(
        &[p],
        CMDLINE,
        TIMEOUT,
        &["epoll_create1", "epoll_ctl", "epoll_pwait", "pipe2"],
    );
}
