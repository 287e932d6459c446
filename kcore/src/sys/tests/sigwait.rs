//! `rt_sigtimedwait`: a pending signal of the set is taken at once;
//! otherwise the thread waits with the set unblocked, and the wait ends
//! with the signal, `EINTR` or `EAGAIN`, its mask back as it was.

use super::*;
use crate::sys::signal::UserRegs;
use crate::sys::sigwait;

const SIGUSR1: u64 = 10;
const SIGUSR2: u64 = 12;
const SET: u64 = SCRATCH + 0x100;
const INFO: u64 = SCRATCH + 0x200;
const TIMEOUT: u64 = SCRATCH + 0x300;

fn bit(sig: u64) -> u64 {
    1 << (sig - 1)
}

/// An env whose thread blocks SIGUSR1 and SIGUSR2 and has the set
/// {SIGUSR1} at `SET`.
fn env(abi: Abi) -> Env {
    let mut e = Env::new(abi);
    e.t.sigmask = bit(SIGUSR1) | bit(SIGUSR2);
    e.poke(SET, &bit(SIGUSR1).to_le_bytes());
    e
}

fn i32_at(e: &mut Env, a: u64) -> i32 {
    i32::from_le_bytes(e.peek(a, 4).try_into().unwrap())
}

#[test]
fn a_pending_signal_of_the_set_is_taken_at_once_with_its_siginfo() {
    for (abi, pid_at) in [(Abi::X86_64, 16), (Abi::I386, 12)] {
        let mut e = env(abi);
        e.t.pending = bit(SIGUSR2);
        e.p.signals.pending = bit(SIGUSR1);
        assert_eq!(e.ret("rt_sigtimedwait", &[SET, INFO, 0, 8]), 10);
        assert_eq!(e.p.signals.pending, 0, "taken");
        assert_eq!(e.t.pending, bit(SIGUSR2), "not in the set: left");
        assert_eq!(i32_at(&mut e, INFO), 10, "si_signo");
        assert_eq!(i32_at(&mut e, INFO + 8), -6, "si_code");
        assert_eq!(i32_at(&mut e, INFO + pid_at), 7, "si_pid");
        assert_eq!(e.t.sigmask, bit(SIGUSR1) | bit(SIGUSR2), "mask kept");
        assert_eq!(e.t.sigwait, None);
    }
}

#[test]
fn bad_arguments_and_a_zero_timeout_fail_as_on_linux() {
    let mut e = env(Abi::X86_64);
    assert_eq!(e.err("rt_sigtimedwait", &[SET, 0, 0, 4]), Errno::EINVAL);
    assert_eq!(e.err("rt_sigtimedwait", &[0, 0, 0, 8]), Errno::EFAULT);
    e.poke(TIMEOUT, &[0; 16]);
    assert_eq!(
        e.err("rt_sigtimedwait", &[SET, 0, TIMEOUT, 8]),
        Errno::EAGAIN
    );
    e.poke(TIMEOUT + 8, &(-1i64).to_le_bytes());
    assert_eq!(
        e.err("rt_sigtimedwait", &[SET, 0, TIMEOUT, 8]),
        Errno::EINVAL
    );
}

/// The registers of a thread woken with `rax`.
fn woken(e: &Env, rax: u64) -> UserRegs {
    let mut r = e.regs();
    r.gprs[0] = rax;
    r
}

#[test]
fn a_waiting_thread_has_the_set_unblocked_and_takes_the_signal_when_woken() {
    let mut e = env(Abi::X86_64);
    assert_eq!(e.call("rt_sigtimedwait", &[SET, INFO, 0, 8]), Action::Block);
    assert_eq!(e.t.sigmask, bit(SIGUSR2), "SIGUSR1 wakes it");
    // SIGUSR1 came; the runtime woke the thread with -EINTR.
    e.t.pending = bit(SIGUSR1);
    let mut r = woken(&e, Errno::EINTR.to_return());
    sigwait::finish(&mut e.m, &mut e.p, &mut e.t, &mut r.gprs[0]);
    assert_eq!(r.gprs[0], 10);
    assert_eq!(e.t.pending, 0);
    assert_eq!(i32_at(&mut e, INFO), 10);
    assert_eq!(e.t.sigmask, bit(SIGUSR1) | bit(SIGUSR2), "mask back");
    assert_eq!(e.t.sigwait, None);
}

#[test]
fn the_timeout_gives_eagain_and_another_signal_eintr() {
    let mut e = env(Abi::X86_64);
    e.poke(TIMEOUT, &0u64.to_le_bytes());
    e.poke(TIMEOUT + 8, &5_000_000u64.to_le_bytes());
    let Action::Sleep { then, .. } = e.call("rt_sigtimedwait", &[SET, INFO, TIMEOUT, 8]) else {
        panic!("a timed wait sleeps");
    };
    assert_eq!(then, Errno::EAGAIN.to_return());
    let mut r = woken(&e, then);
    sigwait::finish(&mut e.m, &mut e.p, &mut e.t, &mut r.gprs[0]);
    assert_eq!(r.gprs[0], Errno::EAGAIN.to_return());
    assert_eq!(e.t.sigmask, bit(SIGUSR1) | bit(SIGUSR2));
    // Woken by a signal outside the set: EINTR stays, its handler runs next.
    assert_eq!(e.call("rt_sigtimedwait", &[SET, INFO, 0, 8]), Action::Block);
    e.t.pending = bit(3);
    let mut r = woken(&e, Errno::EINTR.to_return());
    sigwait::finish(&mut e.m, &mut e.p, &mut e.t, &mut r.gprs[0]);
    assert_eq!(r.gprs[0], Errno::EINTR.to_return());
    assert_eq!(e.t.pending, bit(3));
}
