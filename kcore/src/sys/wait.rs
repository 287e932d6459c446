//! Threads waiting on files: a read of an empty pipe or eventfd, a write
//! to a full one, `poll`, `select` and `epoll_wait` with nothing ready.
//!
//! A waiting thread keeps the call it made ([`FileWait`]) and is listed
//! in the run's [`WaitList`] under its process. Whatever may make a file
//! of the process ready (a write, a read that makes room, a close, an
//! `epoll_ctl`) wakes every waiter of that process
//! ([`Machine::wake_thread`]); before a woken thread runs, the runtime
//! calls [`resume`](super::resume), which makes the same call again with
//! the deadline it first computed: it returns, or waits once more. A
//! deadline that passed makes the call return as timed out; a signal the
//! thread can take ends the wait with `EINTR` instead
//! ([`cancel`](super::cancel_wait)).

use alloc::vec::Vec;

use super::Abi;
use super::machine::Machine;

/// The call a thread waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileWait {
    /// The ABI it came in through.
    pub abi: Abi,
    /// Its number.
    pub nr: u64,
    /// Its arguments.
    pub args: [u64; 6],
    /// When it times out (monotonic ns), if ever.
    pub until_ns: Option<u64>,
}

/// The threads waiting on files, as (pid, tid).
#[derive(Debug, Clone, Default)]
pub struct WaitList {
    waiters: Vec<(u32, u32)>,
}

impl WaitList {
    /// No waiters.
    pub fn new() -> WaitList {
        WaitList::default()
    }

    /// Thread `tid` of process `pid` waits (`false` when out of memory:
    /// the caller then does not wait).
    pub fn add(&mut self, pid: u32, tid: u32) -> bool {
        if self.waiters.contains(&(pid, tid)) {
            return true;
        }
        if self.waiters.try_reserve(1).is_err() {
            return false;
        }
        self.waiters.push((pid, tid));
        true
    }

    /// Thread `tid` no longer waits.
    pub fn remove(&mut self, tid: u32) {
        self.waiters.retain(|w| w.1 != tid);
    }

    /// Wakes every waiter of process `pid`; how many.
    pub fn wake<M: Machine>(&mut self, m: &mut M, pid: u32) -> usize {
        let mut n = 0;
        self.waiters.retain(|&(p, tid)| {
            if p == pid {
                m.wake_thread(tid);
                n += 1;
                false
            } else {
                true
            }
        });
        n
    }

    /// Wakes every waiter of every process (a file that may be shared
    /// between processes changed: a pipe); how many.
    pub fn wake_all<M: Machine>(&mut self, m: &mut M) -> usize {
        self.wake_all_with(&mut |tid| m.wake_thread(tid))
    }

    /// [`WaitList::wake_all`] through `wake(tid)`.
    pub fn wake_all_with(&mut self, wake: &mut impl FnMut(u32)) -> usize {
        let n = self.waiters.len();
        for (_, tid) in self.waiters.drain(..) {
            wake(tid);
        }
        n
    }

    /// Wakes every waiter of process `pid` through `wake(tid)`; how many.
    pub fn wake_with(&mut self, pid: u32, wake: &mut impl FnMut(u32)) -> usize {
        let mut n = 0;
        self.waiters.retain(|&(p, tid)| {
            if p == pid {
                wake(tid);
                n += 1;
                false
            } else {
                true
            }
        });
        n
    }

    /// Whether thread `tid` waits.
    pub fn contains(&self, tid: u32) -> bool {
        self.waiters.iter().any(|w| w.1 == tid)
    }

    /// Whether nobody waits.
    pub fn is_empty(&self) -> bool {
        self.waiters.is_empty()
    }
}
