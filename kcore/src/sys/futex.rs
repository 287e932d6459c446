//! The futex wait queues: who waits on which word, and the wake, requeue
//! and wake-op rules of Linux's `kernel/futex` over them.
//!
//! The table is the personality's half of a futex. The runtime decides
//! what a word's [`FutexKey`] is (a private futex: the address space and
//! the address; a shared one: the physical word), checks the word's value
//! and blocks or wakes the threads this table names. Waiters of one key
//! are woken in the order they began to wait, as Linux's queue does for
//! threads of one priority. Nothing here reads user memory or allocates
//! more than one entry per waiting thread.

use alloc::vec::Vec;

use super::errno::Errno;

/// `FUTEX_BITSET_MATCH_ANY`: the bitset of `FUTEX_WAIT` and `FUTEX_WAKE`.
pub const BITSET_MATCH_ANY: u32 = u32::MAX;

/// What identifies a futex word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FutexKey {
    /// A word of one address space (`FUTEX_PRIVATE_FLAG`, or any word of
    /// private memory): the space's id and the word's user address.
    Private {
        /// The address space (the runtime's process id).
        space: u32,
        /// The word's user address.
        addr: u64,
    },
    /// A word of memory that several address spaces may map: its
    /// physical address.
    Shared {
        /// The word's physical address.
        phys: u64,
    },
}

impl FutexKey {
    /// The key of the word at `addr` of process `pid`. The appliance's
    /// processes share no memory (no `fork`, no shared mappings between
    /// processes), so every futex, `FUTEX_PRIVATE_FLAG` or not, is its
    /// process's word.
    pub fn of(pid: u32, addr: u64) -> FutexKey {
        FutexKey::Private { space: pid, addr }
    }
}

/// One waiting thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Waiter {
    key: FutexKey,
    bitset: u32,
    tid: u32,
}

/// Every thread waiting on a futex, in the order each began to wait.
#[derive(Debug, Default, Clone)]
pub struct FutexTable {
    waiters: Vec<Waiter>,
}

impl FutexTable {
    /// An empty table.
    pub const fn new() -> Self {
        FutexTable {
            waiters: Vec::new(),
        }
    }

    /// Thread `tid` waits on `key` for a wake whose bitset shares a bit
    /// with `bitset` (`EINVAL` for 0, as Linux). The caller has checked
    /// the word's value and blocks the thread; `ENOMEM` if the table
    /// cannot grow. A thread waits on one futex at a time: an earlier
    /// entry of `tid` is replaced.
    pub fn wait(&mut self, key: FutexKey, bitset: u32, tid: u32) -> Result<(), Errno> {
        if bitset == 0 {
            return Err(Errno::EINVAL);
        }
        self.cancel(tid);
        self.waiters.try_reserve(1).map_err(|_| Errno::ENOMEM)?;
        self.waiters.push(Waiter { key, bitset, tid });
        Ok(())
    }

    /// Removes `tid`'s wait (its timeout passed, a signal came, or it
    /// exited). Returns whether it was waiting; false means a wake took
    /// it first.
    pub fn cancel(&mut self, tid: u32) -> bool {
        let before = self.waiters.len();
        self.waiters.retain(|w| w.tid != tid);
        self.waiters.len() != before
    }

    /// True when `tid` waits on some futex.
    pub fn is_waiting(&self, tid: u32) -> bool {
        self.waiters.iter().any(|w| w.tid == tid)
    }

    /// The number of waiting threads.
    pub fn len(&self) -> usize {
        self.waiters.len()
    }

    /// True when no thread waits.
    pub fn is_empty(&self) -> bool {
        self.waiters.is_empty()
    }

    /// `FUTEX_WAKE` / `FUTEX_WAKE_BITSET`: wakes the first waiters of
    /// `key` whose bitset meets `bitset`, at most `nr` of them but at
    /// least one when any waits (Linux counts a wake before it compares
    /// with `nr`, so 0 wakes one). Calls `woken` for each in order and
    /// returns how many.
    pub fn wake(
        &mut self,
        key: FutexKey,
        nr: i32,
        bitset: u32,
        mut woken: impl FnMut(u32),
    ) -> Result<u32, Errno> {
        if bitset == 0 {
            return Err(Errno::EINVAL);
        }
        let mut count = 0u32;
        let limit = nr.max(1) as u32;
        self.waiters.retain(|w| {
            if count >= limit || w.key != key || w.bitset & bitset == 0 {
                return true;
            }
            count += 1;
            woken(w.tid);
            false
        });
        Ok(count)
    }

    /// `FUTEX_REQUEUE` / `FUTEX_CMP_REQUEUE` (after the caller compared the
    /// word): wakes up to `nr_wake` waiters of `from`, then moves up to
    /// `nr_requeue` more to `to`, keeping their order and bitsets. Returns
    /// woken plus moved, as Linux. Negative counts are `EINVAL`.
    pub fn requeue(
        &mut self,
        from: FutexKey,
        to: FutexKey,
        nr_wake: i32,
        nr_requeue: i32,
        mut woken: impl FnMut(u32),
    ) -> Result<u32, Errno> {
        if nr_wake < 0 || nr_requeue < 0 {
            return Err(Errno::EINVAL);
        }
        let (nr_wake, nr_requeue) = (nr_wake as u32, nr_requeue as u32);
        let mut seen = 0u32;
        let mut moved = Vec::new();
        let mut keep = Vec::new();
        keep.try_reserve(self.waiters.len())
            .map_err(|_| Errno::ENOMEM)?;
        for w in self.waiters.drain(..) {
            // Linux stops once both quotas are used, before it looks at
            // the next waiter.
            let done = u64::from(seen) >= u64::from(nr_wake) + u64::from(nr_requeue);
            if w.key != from || done {
                keep.push(w);
                continue;
            }
            seen += 1;
            if seen <= nr_wake {
                woken(w.tid);
            } else {
                moved.push(Waiter { key: to, ..w });
            }
        }
        // Moved waiters join the end of the queue, behind those already
        // waiting on `to`.
        keep.extend(moved);
        self.waiters = keep;
        Ok(seen)
    }

    /// `FUTEX_WAKE_OP`'s wakes, once the caller applied `op` to the second
    /// word: up to `nr_wake` waiters of `key1`, then, when `op`'s
    /// comparison held for the word's old value, up to `nr_wake2` of
    /// `key2`. Returns the total.
    pub fn wake_op(
        &mut self,
        key1: FutexKey,
        nr_wake: i32,
        key2: FutexKey,
        nr_wake2: i32,
        compare_held: bool,
        mut woken: impl FnMut(u32),
    ) -> u32 {
        let mut n = self
            .wake(key1, nr_wake, BITSET_MATCH_ANY, &mut woken)
            .unwrap_or(0);
        if compare_held {
            n += self
                .wake(key2, nr_wake2, BITSET_MATCH_ANY, &mut woken)
                .unwrap_or(0);
        }
        n
    }
}

/// A decoded `FUTEX_WAKE_OP` operation (`FUTEX_OP(op, oparg, cmp, cmparg)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WakeOp {
    op: u32,
    oparg: u32,
    cmp: u32,
    cmparg: i32,
}

impl WakeOp {
    /// Decodes the encoded operation as Linux does: `op` in bits 28-30
    /// (with `FUTEX_OP_OPARG_SHIFT`, bit 31, the argument is a shift count
    /// masked to 0-31), `cmp` in 24-27, and two signed 12-bit arguments.
    /// An unknown operation is `ENOSYS`; an unknown comparison is
    /// `ENOSYS` from [`WakeOp::compare`], after the word was written, as
    /// Linux.
    pub fn decode(encoded: u32) -> Result<WakeOp, Errno> {
        let op = (encoded >> 28) & 7;
        let cmp = (encoded >> 24) & 15;
        let mut oparg = sign_extend_12((encoded >> 12) & 0xfff) as u32;
        let cmparg = sign_extend_12(encoded & 0xfff);
        if encoded & (8 << 28) != 0 {
            oparg = 1u32 << (oparg & 31);
        }
        if op > 4 {
            return Err(Errno::ENOSYS);
        }
        Ok(WakeOp {
            op,
            oparg,
            cmp,
            cmparg,
        })
    }

    /// The word's new value for its old value: SET, ADD, OR, ANDN or XOR.
    pub fn apply(&self, old: u32) -> u32 {
        match self.op {
            0 => self.oparg,
            1 => old.wrapping_add(self.oparg),
            2 => old | self.oparg,
            3 => old & !self.oparg,
            _ => old ^ self.oparg,
        }
    }

    /// Whether the old value passes the comparison (signed, as Linux):
    /// EQ, NE, LT, LE, GT, GE.
    pub fn compare(&self, old: u32) -> Result<bool, Errno> {
        let old = old as i32;
        Ok(match self.cmp {
            0 => old == self.cmparg,
            1 => old != self.cmparg,
            2 => old < self.cmparg,
            3 => old <= self.cmparg,
            4 => old > self.cmparg,
            5 => old >= self.cmparg,
            _ => return Err(Errno::ENOSYS),
        })
    }
}

fn sign_extend_12(v: u32) -> i32 {
    ((v << 20) as i32) >> 20
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    const A: FutexKey = FutexKey::Private {
        space: 1,
        addr: 0x1000,
    };
    const B: FutexKey = FutexKey::Private {
        space: 1,
        addr: 0x1004,
    };
    const OTHER_SPACE: FutexKey = FutexKey::Private {
        space: 2,
        addr: 0x1000,
    };

    fn woken_by(f: impl FnOnce(&mut dyn FnMut(u32)) -> u32) -> (u32, Vec<u32>) {
        let mut v = Vec::new();
        let n = f(&mut |t| v.push(t));
        (n, v)
    }

    fn table(entries: &[(FutexKey, u32)]) -> FutexTable {
        let mut t = FutexTable::new();
        for &(k, tid) in entries {
            t.wait(k, BITSET_MATCH_ANY, tid).unwrap();
        }
        t
    }

    #[test]
    fn wake_takes_the_oldest_waiters_of_the_key_only() {
        let mut t = table(&[(A, 10), (B, 11), (A, 12), (OTHER_SPACE, 13), (A, 14)]);
        let (n, v) = woken_by(|w| t.wake(A, 2, BITSET_MATCH_ANY, w).unwrap());
        assert_eq!((n, v), (2, vec![10, 12]));
        assert!(t.is_waiting(14) && t.is_waiting(11) && t.is_waiting(13));
        let (n, v) = woken_by(|w| t.wake(A, i32::MAX, BITSET_MATCH_ANY, w).unwrap());
        assert_eq!((n, v), (1, vec![14]));
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn a_wake_of_zero_still_wakes_one_and_an_empty_key_none() {
        let mut t = table(&[(A, 1), (A, 2)]);
        assert_eq!(
            woken_by(|w| t.wake(A, 0, BITSET_MATCH_ANY, w).unwrap()).1,
            [1]
        );
        assert_eq!(
            woken_by(|w| t.wake(B, 5, BITSET_MATCH_ANY, w).unwrap()).0,
            0
        );
    }

    #[test]
    fn bitsets_select_waiters_and_zero_is_einval() {
        let mut t = FutexTable::new();
        t.wait(A, 0b01, 1).unwrap();
        t.wait(A, 0b10, 2).unwrap();
        t.wait(A, 0b11, 3).unwrap();
        assert_eq!(t.wait(A, 0, 4), Err(Errno::EINVAL));
        assert_eq!(t.wake(A, 1, 0, |_| {}), Err(Errno::EINVAL));
        assert_eq!(woken_by(|w| t.wake(A, 10, 0b10, w).unwrap()).1, [2, 3]);
        assert_eq!(woken_by(|w| t.wake(A, 10, 0b10, w).unwrap()).0, 0);
        assert_eq!(woken_by(|w| t.wake(A, 10, 0b01, w).unwrap()).1, [1]);
    }

    #[test]
    fn cancel_removes_a_timed_out_waiter_and_says_whether_it_waited() {
        let mut t = table(&[(A, 1), (A, 2)]);
        assert!(t.cancel(1));
        assert!(!t.cancel(1));
        assert_eq!(
            woken_by(|w| t.wake(A, 5, BITSET_MATCH_ANY, w).unwrap()).1,
            [2]
        );
        assert!(t.is_empty());
    }

    #[test]
    fn a_second_wait_of_one_thread_replaces_its_first() {
        let mut t = table(&[(A, 1)]);
        t.wait(B, BITSET_MATCH_ANY, 1).unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(
            woken_by(|w| t.wake(A, 5, BITSET_MATCH_ANY, w).unwrap()).0,
            0
        );
        assert_eq!(
            woken_by(|w| t.wake(B, 5, BITSET_MATCH_ANY, w).unwrap()).1,
            [1]
        );
    }

    #[test]
    fn requeue_wakes_then_moves_behind_the_target_queue() {
        let mut t = table(&[(A, 1), (B, 9), (A, 2), (A, 3), (A, 4), (A, 5)]);
        let (n, v) = woken_by(|w| t.requeue(A, B, 1, 2, w).unwrap());
        // One woken, two moved: the count is both.
        assert_eq!((n, v), (3, vec![1]));
        // B's own waiter first, then the moved ones in their order.
        let (n, v) = woken_by(|w| t.wake(B, 10, BITSET_MATCH_ANY, w).unwrap());
        assert_eq!((n, v), (3, vec![9, 2, 3]));
        let (_, v) = woken_by(|w| t.wake(A, 10, BITSET_MATCH_ANY, w).unwrap());
        assert_eq!(v, [4, 5]);
    }

    #[test]
    fn requeue_with_no_quota_touches_nothing_and_negative_counts_are_einval() {
        let mut t = table(&[(A, 1), (A, 2)]);
        assert_eq!(woken_by(|w| t.requeue(A, B, 0, 0, w).unwrap()).0, 0);
        assert_eq!(t.len(), 2);
        assert_eq!(t.requeue(A, B, -1, 1, |_| {}), Err(Errno::EINVAL));
        assert_eq!(t.requeue(A, B, 1, -1, |_| {}), Err(Errno::EINVAL));
        // Requeue only: nothing woken, both moved.
        let (n, v) = woken_by(|w| t.requeue(A, B, 0, 5, w).unwrap());
        assert_eq!((n, v.len()), (2, 0));
        assert_eq!(
            woken_by(|w| t.wake(B, 5, BITSET_MATCH_ANY, w).unwrap()).1,
            [1, 2]
        );
    }

    #[test]
    fn wake_op_wakes_the_second_key_only_when_the_compare_held() {
        let mut t = table(&[(A, 1), (B, 2), (B, 3)]);
        let (n, v) = woken_by(|w| t.wake_op(A, 1, B, 1, false, w));
        assert_eq!((n, v), (1, vec![1]));
        let (n, v) = woken_by(|w| t.wake_op(A, 1, B, 5, true, w));
        assert_eq!((n, v), (2, vec![2, 3]));
    }

    /// `FUTEX_OP(op, oparg, cmp, cmparg)` from linux/futex.h.
    fn futex_op(op: u32, oparg: u32, cmp: u32, cmparg: u32) -> u32 {
        ((op & 0xf) << 28) | ((cmp & 0xf) << 24) | ((oparg & 0xfff) << 12) | (cmparg & 0xfff)
    }

    #[test]
    fn wake_op_decodes_every_operation_and_comparison() {
        let set = WakeOp::decode(futex_op(0, 7, 0, 0)).unwrap();
        assert_eq!(set.apply(100), 7);
        assert_eq!(WakeOp::decode(futex_op(1, 5, 0, 0)).unwrap().apply(10), 15);
        assert_eq!(
            WakeOp::decode(futex_op(2, 0b100, 0, 0)).unwrap().apply(1),
            0b101
        );
        assert_eq!(
            WakeOp::decode(futex_op(3, 0b1, 0, 0)).unwrap().apply(0b11),
            0b10
        );
        assert_eq!(
            WakeOp::decode(futex_op(4, 0b11, 0, 0)).unwrap().apply(0b01),
            0b10
        );
        // FUTEX_OP_OPARG_SHIFT: the argument is a bit number.
        assert_eq!(
            WakeOp::decode(futex_op(8 | 2, 4, 0, 0)).unwrap().apply(0),
            16
        );
        // A negative 12-bit argument: ADD of -1.
        assert_eq!(
            WakeOp::decode(futex_op(1, 0xfff, 0, 0)).unwrap().apply(5),
            4
        );
        // Comparisons are signed: -1 < 1.
        let cmp = |c, arg, old| {
            WakeOp::decode(futex_op(0, 0, c, arg))
                .unwrap()
                .compare(old)
                .unwrap()
        };
        assert!(cmp(0, 1, 1) && !cmp(0, 1, 2));
        assert!(cmp(1, 1, 2) && !cmp(1, 1, 1));
        assert!(cmp(2, 1, u32::MAX) && !cmp(2, 1, 1));
        assert!(cmp(3, 1, 1) && !cmp(3, 1, 2));
        assert!(cmp(4, 1, 2) && !cmp(4, 1, u32::MAX));
        assert!(cmp(5, 0xfff, u32::MAX) && !cmp(5, 0, u32::MAX));
        assert_eq!(WakeOp::decode(futex_op(5, 0, 0, 0)), Err(Errno::ENOSYS));
        let bad_cmp = WakeOp::decode(futex_op(0, 0, 6, 0)).unwrap();
        assert_eq!(bad_cmp.compare(0), Err(Errno::ENOSYS));
        // A shift past 31 is masked (Linux warns and masks).
        assert_eq!(WakeOp::decode(futex_op(8, 33, 0, 0)).unwrap().apply(0), 2);
    }
}
