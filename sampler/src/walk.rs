//! The frame-pointer walk behind callchains, over a word-reading closure.
//!
//! The NMI handler walks the runtime's stack and then the process's own. It
//! must never fault: every read is first checked against a [`WalkRange`]
//! (stack words that are known to be mapped). The caller supplies the reads
//! (the runtime does them with volatile loads through the current address
//! space); this module decides which reads happen, so the rules are tested
//! on the host.
//!
//! The rules are Linux's for user callchains (`perf_callchain_user`): a
//! frame is read only when its pair of words lies inside the stack, and
//! every return address read is stored, without a test against the
//! program's text (code in anonymous executable memory is walked through
//! too). On top of Linux's rules, frames must be strictly ascending, so a
//! loop of frame pointers or a pointer back down the stack ends the walk at
//! once instead of filling the chain. That costs two compares a frame: the
//! first frame pointer is tested against both ends of the stack, and every
//! later one only against the previous one and the stack's top, since
//! "above the previous one" implies "above the bottom".

use core::sync::atomic::{AtomicU64, Ordering};

/// Where a walk may read: the frame pointers `fp` whose pair of words
/// `[fp, fp + 2W)` lies inside the stack region, that is
/// `fp - lo < count` (one unsigned test, which also rejects an `fp` below
/// `lo`). All zero (nothing passes) until [`WalkRange::set`]. Atomics, so
/// the NMI handler can read a range the runtime updates between processes.
/// Alignment is not required: an unaligned pair inside the stack reads
/// mapped memory, and the runtime reads in ring 0, where alignment checks
/// do not apply.
#[derive(Debug)]
pub struct WalkRange {
    lo: AtomicU64,
    count: AtomicU64,
}

impl WalkRange {
    /// An empty range: every walk stops at once.
    pub const fn new() -> Self {
        WalkRange {
            lo: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    /// Frames of `w`-byte words (8, or 4 for compat code) in `stack`
    /// (`[start, end)`).
    ///
    /// Safe against an NMI on the same CPU at any point: the range is
    /// emptied first, then moved, then sized, so a walk that interrupts
    /// the update sees the old range, an empty one, or the new one, never
    /// the new start with the old length.
    pub fn set(&self, w: u64, stack: (u64, u64)) {
        let lo = stack.0;
        let count = stack
            .1
            .checked_sub(lo)
            .and_then(|len| len.checked_sub(2 * w))
            .map_or(0, |room| room + 1);
        self.count.store(0, Ordering::Relaxed);
        self.lo.store(lo, Ordering::Release);
        self.count.store(count, Ordering::Release);
    }
}

impl Default for WalkRange {
    fn default() -> Self {
        Self::new()
    }
}

/// Appends return addresses to `chain` from index `n`, at most `max`
/// frames (and never past the end of `chain`): the saved frame pointer at
/// `[fp]`, the return address at `[fp + W]` (`W` = 8, or 4 for compat
/// code), both words inside the range's stack, frames strictly ascending.
/// `read(fp)` returns the two words at `fp` and is called only for an `fp`
/// whose pair lies inside the stack. Returns the new end.
#[inline(always)]
pub fn walk<const W: u64>(
    chain: &mut [u64],
    n: usize,
    mut fp: u64,
    range: &WalkRange,
    max: usize,
    mut read: impl FnMut(u64) -> (u64, u64),
) -> usize {
    let lo = range.lo.load(Ordering::Relaxed);
    let count = range.count.load(Ordering::Relaxed);
    let end = n.saturating_add(max).min(chain.len());
    let Some(out) = chain.get_mut(n..end) else {
        return n;
    };
    if fp.wrapping_sub(lo) >= count {
        return n;
    }
    // The highest frame pointer whose pair fits (count > 0 here).
    let last = lo.wrapping_add(count - 1);
    let mut taken = 0;
    for slot in out.iter_mut() {
        let (next, ret) = read(fp);
        *slot = ret;
        taken += 1;
        // Two branches, not one test of two flags: a compare and a jump
        // each, the cheapest form of the pair on the NMI path.
        if next <= fp {
            break;
        }
        if next > last {
            break;
        }
        fp = next;
    }
    n + taken
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A fake stack: word address -> value (unset words read as 0); every
    /// read is checked to be one the range allows.
    struct Stack {
        words: BTreeMap<u64, u64>,
        lo: u64,
        hi: u64,
    }

    impl Stack {
        fn read<const W: u64>(&self, fp: u64) -> (u64, u64) {
            assert!(
                fp >= self.lo && fp + 2 * W <= self.hi,
                "read outside the stack at {fp:#x}"
            );
            let word = |a: u64| self.words.get(&a).copied().unwrap_or(0);
            (word(fp), word(fp + W))
        }
    }

    fn stack(frames: &[(u64, u64, u64)]) -> Stack {
        let mut words = BTreeMap::new();
        for &(at, next, ret) in frames {
            words.insert(at, next);
            words.insert(at + 8, ret);
        }
        Stack {
            words,
            lo: 0x1000,
            hi: 0x2000,
        }
    }

    fn range(s: &Stack) -> WalkRange {
        let r = WalkRange::new();
        r.set(8, (s.lo, s.hi));
        r
    }

    #[test]
    fn walks_a_chain_and_stops_at_its_end() {
        let s = stack(&[
            (0x1100, 0x1200, 0x40_1000),
            (0x1200, 0x1300, 0x40_2000),
            (0x1300, 0, 0x40_3000),
        ]);
        let mut chain = [0u64; 8];
        let n = walk::<8>(&mut chain, 0, 0x1100, &range(&s), 8, |fp| s.read::<8>(fp));
        assert_eq!(&chain[..n], &[0x40_1000, 0x40_2000, 0x40_3000]);
    }

    #[test]
    fn bad_frame_pointers_end_the_walk_without_a_read() {
        let s = stack(&[(0x1100, 0x1ff8, 0x40_1000), (0x1200, 0x2000, 0x40_2000)]);
        let r = range(&s);
        let mut chain = [0u64; 8];
        // Past the stack, below it, the last word of the stack (its pair
        // would cross the end), and wrapping ones.
        for fp in [0x2000, 0x800, 0x1ff8, 0x1ff1, u64::MAX - 7, 0] {
            assert_eq!(
                walk::<8>(&mut chain, 0, fp, &r, 8, |_| panic!("read at {fp:#x}")),
                0,
                "{fp:#x}"
            );
        }
        // The highest frame whose pair fits is read.
        assert_eq!(
            walk::<8>(&mut chain, 0, 0x1ff0, &r, 8, |fp| s.read::<8>(fp)),
            1
        );
        // A successor at the stack's last word, or at its end: one frame, then stop.
        for fp in [0x1100, 0x1200] {
            assert_eq!(
                walk::<8>(&mut chain, 0, fp, &r, 8, |fp| s.read::<8>(fp)),
                1,
                "{fp:#x}"
            );
        }
        // An empty range lets nothing through.
        let empty = WalkRange::new();
        for fp in [0, 0x1100] {
            assert_eq!(
                walk::<8>(&mut chain, 0, fp, &empty, 8, |_| panic!("read")),
                0
            );
        }
        // A stack too small for one pair is empty too.
        let tiny = WalkRange::new();
        tiny.set(8, (0x1000, 0x100f));
        assert_eq!(
            walk::<8>(&mut chain, 0, 0x1000, &tiny, 8, |_| panic!("read")),
            0
        );
    }

    #[test]
    fn unaligned_frames_inside_the_stack_are_read() {
        let s = stack(&[(0x1104, 0x1300, 0x40_1000), (0x1300, 0, 0x40_2000)]);
        let mut chain = [0u64; 4];
        let n = walk::<8>(&mut chain, 0, 0x1104, &range(&s), 8, |fp| s.read::<8>(fp));
        assert_eq!(&chain[..n], &[0x40_1000, 0x40_2000]);
    }

    #[test]
    fn every_return_address_is_kept_as_linux_keeps_it() {
        // Outside any text, zero, kernel-looking: stored as read.
        let s = stack(&[
            (0x1100, 0x1200, 0x60_0000),
            (0x1200, 0x1300, 0),
            (0x1300, 0, 0xffff_ffff_8000_0000),
        ]);
        let mut chain = [0u64; 4];
        let n = walk::<8>(&mut chain, 0, 0x1100, &range(&s), 8, |fp| s.read::<8>(fp));
        assert_eq!(&chain[..n], &[0x60_0000, 0, 0xffff_ffff_8000_0000]);
    }

    #[test]
    fn loops_descents_and_limits_stop_it() {
        let mut chain = [0u64; 4];
        // A frame pointing back at itself, or down the stack, is taken once.
        for back in [0x1100, 0x10f0, 0x1000] {
            let s = stack(&[(0x1100, back, 0x40_1000), (back, 0x1100, 0x40_2000)]);
            assert_eq!(
                walk::<8>(&mut chain, 0, 0x1100, &range(&s), 8, |fp| s.read::<8>(fp)),
                1,
                "{back:#x}"
            );
        }
        // `max` and the chain's length bound it.
        let long: Vec<_> = (0..16u64)
            .map(|i| (0x1100 + i * 16, 0x1110 + i * 16, 0x40_1000 + i))
            .collect();
        let long = stack(&long);
        let r = range(&long);
        assert_eq!(
            walk::<8>(&mut chain, 0, 0x1100, &r, 2, |fp| long.read::<8>(fp)),
            2
        );
        assert_eq!(
            walk::<8>(&mut chain, 1, 0x1100, &r, 99, |fp| long.read::<8>(fp)),
            4
        );
        assert_eq!(&chain[1..4], &[0x40_1000, 0x40_1001, 0x40_1002]);
        // Nothing is written when the start is at or past the end.
        assert_eq!(
            walk::<8>(&mut chain, 4, 0x1100, &r, 8, |_| panic!("read")),
            4
        );
        assert_eq!(
            walk::<8>(&mut chain, 9, 0x1100, &r, 8, |_| panic!("read")),
            9
        );
        assert_eq!(
            walk::<8>(&mut chain, 0, 0x1100, &r, 0, |_| panic!("read")),
            0
        );
    }

    #[test]
    fn compat_frames_are_four_byte_words() {
        let r = WalkRange::new();
        r.set(4, (0x1000, 0x1010));
        let mut words = BTreeMap::new();
        words.insert(0x1000u64, 0x1008u64);
        words.insert(0x1004, 0x0804_9000);
        words.insert(0x1008, 0);
        words.insert(0x100c, 0x0804_a000);
        let mut chain = [0u64; 4];
        let n = walk::<4>(&mut chain, 0, 0x1000, &r, 4, |fp| {
            assert!(fp + 8 <= 0x1010, "read past the stack at {fp:#x}");
            (words[&fp], words[&(fp + 4)])
        });
        assert_eq!(&chain[..n], &[0x0804_9000, 0x0804_a000]);
        // 0x100c: its pair would end past the stack.
        assert_eq!(
            walk::<4>(&mut chain, 0, 0x100c, &r, 4, |_| panic!("read")),
            0
        );
    }
}
