//! The frame-pointer walk behind callchains, over a word-reading closure.
//!
//! The NMI handler walks the runtime's stack and then the process's own. It
//! must never fault: every read is first checked against a [`WalkRange`]
//! (stack words that are known to be mapped), and every return address
//! against the range's code. The caller supplies the reads (the runtime does
//! them with volatile loads through the current address space); this module
//! decides which reads happen, so the rules are tested on the host.

use core::sync::atomic::{AtomicU64, Ordering};

/// Where a walk may read: the frame pointers `fp` whose pair of words
/// `[fp, fp + 2W)` lies inside the stack region, `fp` aligned to `W`, are
/// exactly those with `(fp - lo).rotate_right(log2 W) < count` (a
/// misaligned `fp` rotates its low bits to the top). All zero (nothing
/// passes) until [`WalkRange::set`]. Atomics, so the NMI handler can read a
/// range the runtime updates between processes.
#[derive(Debug)]
pub struct WalkRange {
    lo: AtomicU64,
    count: AtomicU64,
    text_lo: AtomicU64,
    text_len: AtomicU64,
}

impl WalkRange {
    /// An empty range: every walk stops at once.
    pub const fn new() -> Self {
        WalkRange {
            lo: AtomicU64::new(0),
            count: AtomicU64::new(0),
            text_lo: AtomicU64::new(0),
            text_len: AtomicU64::new(0),
        }
    }

    /// Frames of `w`-byte words (8, or 4 for compat code) in `stack`
    /// (`[start, end)`), return addresses in `text`.
    pub fn set(&self, w: u64, stack: (u64, u64), text: (u64, u64)) {
        let lo = stack.0.next_multiple_of(w);
        let count = stack
            .1
            .checked_sub(lo)
            .and_then(|len| len.checked_sub(2 * w))
            .map_or(0, |room| room / w + 1);
        self.lo.store(lo, Ordering::Relaxed);
        self.count.store(count, Ordering::Relaxed);
        self.text_lo.store(text.0, Ordering::Relaxed);
        self.text_len
            .store(text.1.saturating_sub(text.0), Ordering::Relaxed);
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
/// code), both words inside the range's stack (one test, see
/// [`WalkRange`]), every return address inside its text, frames strictly
/// ascending. `read(fp)` returns the two words at `fp` and is called only
/// for an `fp` that passed the range test. Returns the new end.
#[inline(always)]
pub fn walk<const W: u64>(
    chain: &mut [u64],
    mut n: usize,
    mut fp: u64,
    range: &WalkRange,
    max: usize,
    mut read: impl FnMut(u64) -> (u64, u64),
) -> usize {
    let lo = range.lo.load(Ordering::Relaxed);
    let count = range.count.load(Ordering::Relaxed);
    let text_lo = range.text_lo.load(Ordering::Relaxed);
    let text_len = range.text_len.load(Ordering::Relaxed);
    let end = n.saturating_add(max).min(chain.len());
    while n < end {
        if fp.wrapping_sub(lo).rotate_right(W.trailing_zeros()) >= count {
            break;
        }
        let (next, ret) = read(fp);
        if ret.wrapping_sub(text_lo) >= text_len {
            break;
        }
        chain[n] = ret;
        n += 1;
        if next <= fp {
            break;
        }
        fp = next;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A fake stack: word address -> value; every read is checked to be
    /// one the range allows.
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
            assert_eq!(fp % W, 0, "misaligned read at {fp:#x}");
            (self.words[&fp], self.words[&(fp + W)])
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

    #[test]
    fn walks_a_chain_and_stops_at_its_end() {
        let s = stack(&[
            (0x1100, 0x1200, 0x40_1000),
            (0x1200, 0x1300, 0x40_2000),
            (0x1300, 0, 0x40_3000),
        ]);
        let r = WalkRange::new();
        r.set(8, (s.lo, s.hi), (0x40_0000, 0x50_0000));
        let mut chain = [0u64; 8];
        let n = walk::<8>(&mut chain, 0, 0x1100, &r, 8, |fp| s.read::<8>(fp));
        assert_eq!(&chain[..n], &[0x40_1000, 0x40_2000, 0x40_3000]);
    }

    #[test]
    fn bad_frame_pointers_end_the_walk_without_a_read() {
        let s = stack(&[(0x1100, 0x1ff8, 0x40_1000)]);
        let r = WalkRange::new();
        r.set(8, (s.lo, s.hi), (0x40_0000, 0x50_0000));
        let mut chain = [0u64; 8];
        // Past the stack, below it, misaligned, the last word of the stack
        // (its pair would cross the end), and a wrapping one.
        for fp in [0x2000, 0x800, 0x1104, 0x1ff8, u64::MAX - 7, 0] {
            assert_eq!(
                walk::<8>(&mut chain, 0, fp, &r, 8, |fp| s.read::<8>(fp)),
                0,
                "{fp:#x}"
            );
        }
        // The first frame's successor points at the stack's last word: one frame, then stop.
        assert_eq!(
            walk::<8>(&mut chain, 0, 0x1100, &r, 8, |fp| s.read::<8>(fp)),
            1
        );
        // An empty range lets nothing through.
        let empty = WalkRange::new();
        assert_eq!(
            walk::<8>(&mut chain, 0, 0x1100, &empty, 8, |_| panic!("read")),
            0
        );
    }

    #[test]
    fn return_addresses_outside_the_text_loops_and_limits_stop_it() {
        let r = WalkRange::new();
        r.set(8, (0x1000, 0x2000), (0x40_0000, 0x50_0000));
        let mut chain = [0u64; 4];
        let outside = stack(&[(0x1100, 0x1200, 0x60_0000)]);
        assert_eq!(
            walk::<8>(&mut chain, 0, 0x1100, &r, 8, |fp| outside.read::<8>(fp)),
            0
        );
        // A frame pointing back at itself is taken once.
        let looped = stack(&[(0x1100, 0x1100, 0x40_1000)]);
        assert_eq!(
            walk::<8>(&mut chain, 0, 0x1100, &r, 8, |fp| looped.read::<8>(fp)),
            1
        );
        // `max` and the chain's length bound it.
        let long: Vec<_> = (0..16u64)
            .map(|i| (0x1100 + i * 16, 0x1110 + i * 16, 0x40_1000 + i))
            .collect();
        let long = stack(&long);
        assert_eq!(
            walk::<8>(&mut chain, 0, 0x1100, &r, 2, |fp| long.read::<8>(fp)),
            2
        );
        assert_eq!(
            walk::<8>(&mut chain, 1, 0x1100, &r, 99, |fp| long.read::<8>(fp)),
            4
        );
    }

    #[test]
    fn compat_frames_are_four_byte_words() {
        let r = WalkRange::new();
        r.set(4, (0x1000, 0x1010), (0x0804_8000, 0x0805_0000));
        let mut words = BTreeMap::new();
        words.insert(0x1000u64, 0x1008u64);
        words.insert(0x1004, 0x0804_9000);
        words.insert(0x1008, 0);
        words.insert(0x100c, 0x0804_a000);
        let mut chain = [0u64; 4];
        let n = walk::<4>(&mut chain, 0, 0x1000, &r, 4, |fp| {
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
