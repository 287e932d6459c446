//! `rt_sigtimedwait`'s wait: which signal it takes, the `siginfo` it
//! fills, and how the wait ends when the thread is back on its way to user
//! mode. While it waits, the signals of its set are unblocked (Linux's
//! `real_blocked`), so that the runtime wakes the thread for them; the
//! mask is put back before anything is delivered.

use super::Abi;
use super::errno::Errno;
use super::machine::Machine;
use super::process::{Process, Thread};
use super::signal;

/// An `rt_sigtimedwait` that waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SigWait {
    /// The signals it waits for (bit n-1 = signal n).
    pub set: u64,
    /// Where its `siginfo` goes (0: nowhere).
    pub info: u64,
    /// The thread's signal mask before the wait.
    pub mask: u64,
}

/// Takes the lowest pending signal of `set`: the thread's own first, then
/// the process's (as Linux's `dequeue_signal`).
pub fn take(p: &mut Process, t: &mut Thread, set: u64) -> Option<u8> {
    for pending in [&mut t.pending, &mut p.signals.pending] {
        let ready = *pending & set;
        if ready != 0 {
            let sig = ready.trailing_zeros() as u8 + 1;
            *pending &= !(1 << (sig - 1));
            return Some(sig);
        }
    }
    None
}

/// Writes the `siginfo` of `sig` at `addr` (nothing when it is 0), in the
/// ABI's layout, as a delivered signal's frame holds it.
pub fn write_info<M: Machine>(
    m: &mut M,
    p: &Process,
    abi: Abi,
    addr: u64,
    sig: u8,
) -> Result<(), Errno> {
    if addr == 0 {
        return Ok(());
    }
    let info = signal::siginfo(abi, sig, signal::Info::Sent { pid: p.pid });
    m.write_user(&p.areas, addr, &info)
}

/// On thread `t`'s way back to user mode (its `rax` about to be
/// restored, its pending signals up to date), before any signal is
/// delivered: ends the `rt_sigtimedwait` it waited in. The mask comes
/// back; a signal of the set that came is taken (`rax` = its number, its
/// `siginfo` written); otherwise `rax` keeps what ended the wait (`EINTR`
/// for another signal, `EAGAIN` for the timeout).
pub fn finish<M: Machine>(m: &mut M, p: &mut Process, t: &mut Thread, rax: &mut u64) {
    let Some(w) = t.sigwait.take() else {
        return;
    };
    t.sigmask = w.mask;
    if let Some(sig) = take(p, t, w.set) {
        *rax = match write_info(m, p, p.abi, w.info, sig) {
            Ok(()) => u64::from(sig),
            Err(e) => e.to_return(),
        };
    }
}
