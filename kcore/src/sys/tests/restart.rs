//! A wait that a signal ends: the call restarted or `EINTR`, by the kind
//! of call and the handler's SA_RESTART, as Linux's `-ERESTART*` rules.

use super::signals::{HANDLER, install};
use super::*;
use crate::sys::restart;
use crate::sys::signal::{self, Delivery, UserRegs, sa};

const SIGUSR1: u64 = 10;
const EINTR: u64 = (-4i64) as u64;
const FUTEX_WAIT_PRIVATE: u64 = 128;
const TIMESPEC: u64 = SCRATCH + 0x100;

/// The registers of a thread a signal woke from the call it waited in:
/// `rax` is `-EINTR`, `rip` just after its `syscall`.
fn woken(e: &Env) -> UserRegs {
    let mut r = e.regs();
    r.gprs[0] = EINTR;
    r
}

/// Starts `name(args)`, which must wait; then SIGUSR1 (handled with
/// `flags`) comes, and the handler's frame is built. Returns the `rax` and
/// `rip` the frame saved: what `rt_sigreturn` resumes with.
fn interrupted_by_handler(name: &str, args: &[u64], flags: u64) -> (u64, u64, u64) {
    let mut e = Env::new(Abi::X86_64);
    install(&mut e, SIGUSR1, sa::SIGINFO | sa::RESTORER | flags, 0);
    // A 1 ms timespec for the timed waits.
    e.poke(TIMESPEC, &[0; 8]);
    e.poke(TIMESPEC + 8, &1_000_000u64.to_le_bytes());
    assert!(
        matches!(e.call(name, args), Action::Block | Action::Sleep { .. }),
        "{name} waits"
    );
    e.t.pending = 1 << (SIGUSR1 - 1);
    let mut r = woken(&e);
    let before_rip = r.rip;
    assert_eq!(
        signal::deliver(&mut e.m, &mut e.p, &mut e.t, &mut r),
        Delivery::Handler(10)
    );
    assert_eq!(r.rip, HANDLER);
    assert_eq!(e.t.interrupted, None, "the wait is over");
    let mc = r.rsp + 8 + 40;
    (e.u64_at(mc + 13 * 8), e.u64_at(mc + 16 * 8), before_rip)
}

#[test]
fn sa_restart_restarts_an_untimed_futex_wait_and_without_it_the_wait_is_eintr() {
    let wait = [SCRATCH, FUTEX_WAIT_PRIVATE, 0, 0];
    let (rax, rip, at) = interrupted_by_handler("futex", &wait, sa::RESTART);
    assert_eq!((rax, rip), (202, at - 2), "futex again, from its syscall");
    let (rax, rip, at) = interrupted_by_handler("futex", &wait, 0);
    assert_eq!((rax, rip), (EINTR, at));
}

#[test]
fn timed_waits_and_pause_end_with_eintr_even_under_sa_restart() {
    let timed = [SCRATCH, FUTEX_WAIT_PRIVATE, 0, TIMESPEC];
    let (rax, rip, at) = interrupted_by_handler("futex", &timed, sa::RESTART);
    assert_eq!((rax, rip), (EINTR, at), "futex with a timeout");
    let (rax, rip, at) = interrupted_by_handler("nanosleep", &[TIMESPEC, 0], sa::RESTART);
    assert_eq!((rax, rip), (EINTR, at), "nanosleep");
    let (rax, rip, at) = interrupted_by_handler("pause", &[], sa::RESTART);
    assert_eq!((rax, rip), (EINTR, at), "pause");
}

#[test]
fn with_no_handler_to_run_an_interrupted_wait_restarts_unless_it_is_timed() {
    let mut e = Env::new(Abi::X86_64);
    assert_eq!(e.call("pause", &[]), Action::Block);
    let mut r = woken(&e);
    let at = r.rip;
    restart::finish(&mut e.t, Abi::X86_64, &mut r.gprs[0], &mut r.rip, None);
    assert_eq!((r.gprs[0], r.rip), (34, at - 2), "pause again");
    // Only once: the next return to user mode leaves rax alone.
    let mut again = woken(&e);
    restart::finish(
        &mut e.t,
        Abi::X86_64,
        &mut again.gprs[0],
        &mut again.rip,
        None,
    );
    assert_eq!((again.gprs[0], again.rip), (EINTR, at));
}

#[test]
fn a_wait_that_ended_by_itself_is_left_as_it_ended() {
    let mut e = Env::new(Abi::X86_64);
    let wait = [SCRATCH, FUTEX_WAIT_PRIVATE, 0, 0];
    assert_eq!(e.call("futex", &wait), Action::Block);
    let mut r = e.regs();
    r.gprs[0] = 0; // woken by FUTEX_WAKE
    let want = r.clone();
    restart::finish(
        &mut e.t,
        Abi::X86_64,
        &mut r.gprs[0],
        &mut r.rip,
        Some(sa::RESTART),
    );
    assert_eq!(r, want);
    assert_eq!(e.t.interrupted, None);
    // A call that did not wait leaves nothing to restart.
    assert_eq!(e.ret("getpid", &[]), 7);
    assert_eq!(e.t.interrupted, None);
}

#[test]
fn an_i386_call_restarts_with_its_own_number_through_int_0x80() {
    let mut e = Env::new(Abi::I386);
    // i386 futex is 240.
    // The runtime's wake leaves -EINTR in all of rax; eax is what counts.
    for rax in [0xffff_fffc, EINTR] {
        assert_eq!(
            e.call("futex", &[SCRATCH, FUTEX_WAIT_PRIVATE, 0, 0]),
            Action::Block
        );
        let mut r = e.regs();
        r.gprs[0] = rax;
        let at = r.rip;
        restart::finish(
            &mut e.t,
            Abi::I386,
            &mut r.gprs[0],
            &mut r.rip,
            Some(sa::RESTART),
        );
        assert_eq!((r.gprs[0], r.rip), (240, at - 2));
    }
}
