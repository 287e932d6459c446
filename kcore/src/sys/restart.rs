//! What a system call that a signal interrupted returns, Linux's
//! `-ERESTART*` rules (`arch/x86/kernel/signal.c`, `handle_signal` and
//! `arch_do_signal_or_restart`): a wait that a signal ended comes back
//! `-EINTR`, and on the thread's way back to user mode that becomes
//! either the error or a restart of the call (its instruction again, with
//! its number in `rax`), by the call's kind and the handler's SA_RESTART.

use super::Abi;
use super::process::Thread;
use super::signal::sa;
use super::table::Sys;

/// How an interrupted call ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restart {
    /// `-ERESTARTSYS`: restarted, unless a handler without SA_RESTART
    /// runs (reads and writes that wait, a futex wait with no timeout).
    UnlessHandlerSaysNo,
    /// `-ERESTARTNOHAND`: `EINTR` when a handler runs, else restarted
    /// (`pause`, `rt_sigsuspend`, `poll`, `select`).
    UnlessHandler,
    /// `EINTR` whatever happens (timed waits: `nanosleep`, a futex wait
    /// with a timeout, `epoll_wait`, `rt_sigtimedwait`).
    Never,
}

/// A call that started to wait: what it was, to restart it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interrupted {
    /// Its number in its ABI.
    pub nr: u64,
    /// How it ends when a signal interrupts it.
    pub restart: Restart,
}

/// The restart kind of `call` with arguments `args` (decoded per ABI).
pub(crate) fn kind(call: Sys, args: &[u64; 6]) -> Restart {
    const FUTEX_WAIT: u64 = 0;
    const FUTEX_WAIT_BITSET: u64 = 9;
    const FUTEX_CMD: u64 = 0x7f;
    use Sys::*;
    match call {
        Read | Readv | Write | Writev | Pread64 | Pwrite64 | Preadv | Pwritev | Accept
        | Accept4 | Connect | Sendto | Recvfrom | Sendmsg | Recvmsg | Sendmmsg | Recvmmsg
        | Socketcall | Sendfile | Sendfile64 | Wait4 | Waitpid | Waitid => {
            Restart::UnlessHandlerSaysNo
        }
        Futex | Futex64 if matches!(args[1] & FUTEX_CMD, FUTEX_WAIT | FUTEX_WAIT_BITSET) => {
            if args[3] == 0 {
                Restart::UnlessHandlerSaysNo
            } else {
                Restart::Never
            }
        }
        Pause | RtSigsuspend | Poll | Ppoll | Ppoll64 | Select | OldSelect | Pselect6
        | Pselect6Time64 => Restart::UnlessHandler,
        _ => Restart::Never,
    }
}

/// Whether `rax` holds `-EINTR` as the call's ABI reads it (an i386
/// process sees only `eax`).
fn is_eintr(abi: Abi, rax: u64) -> bool {
    let v = (-4i64) as u64;
    match abi {
        Abi::X86_64 => rax == v,
        Abi::I386 => rax & 0xffff_ffff == v & 0xffff_ffff,
    }
}

/// On the way back to user mode of thread `t` (its `rax` and `rip` about
/// to be restored): ends the call it waited in, if a signal interrupted
/// it. `handler` is the `sa_flags` of the handler about to run, `None`
/// when none runs. A restarted call's instruction (`syscall` or
/// `int 0x80`, both two bytes) runs again with its number in `rax` and
/// its arguments still in their registers.
pub fn finish(t: &mut Thread, abi: Abi, rax: &mut u64, rip: &mut u64, handler: Option<u64>) {
    let Some(i) = t.interrupted.take() else {
        return;
    };
    if !is_eintr(abi, *rax) {
        // The wait ended by itself (woken, timed out).
        return;
    }
    let again = match (i.restart, handler) {
        (Restart::Never, _) => false,
        (Restart::UnlessHandler, h) => h.is_none(),
        (Restart::UnlessHandlerSaysNo, None) => true,
        (Restart::UnlessHandlerSaysNo, Some(flags)) => flags & sa::RESTART != 0,
    };
    if again {
        *rax = i.nr;
        *rip = rip.wrapping_sub(2);
    }
}
