//! Sample groups (`wire_group=N`): runs of consecutive samples coded
//! together with adaptive context models and a binary range coder, so a
//! sample costs what is new in it, not what its task's previous sample
//! already said.
//!
//! # Groups and frames
//! A group is up to `N` consecutive samples of the stream (or
//! [`GROUP_MAX_BYTES`] of coded bytes, whichever comes first). Every model
//! starts fresh at a group's start, so a decoder that missed part of one
//! group decodes the next one normally. A group travels in one or more
//! group frames (record tag [`GROUP_TAG`]), each an ordinary CRC-checked,
//! COBS-stuffed frame:
//!
//! ```text
//! 0x0a  postcard(GroupHead { group, seq, first, count })  coded bytes
//! ```
//!
//! `group` numbers the groups of the stream, `seq` the frames of a group
//! (0 starts the group and resets the models), `first` is the stream
//! index of the frame's first sample (samples coded in groups since the
//! last Hello) and `count` how many samples the frame holds. The range
//! coder restarts in every frame (a few bytes of flush), the models carry
//! on from frame to frame of a group. A sample never spans two frames.
//!
//! # Honest loss
//! A frame that fails its CRC, or a frame after a missing `seq`, cannot be
//! decoded against the right model state: the decoder counts its samples
//! (and every later frame's, to the end of the group) as lost, using the
//! checked `count` of the frames that arrive and the gap in `first` for
//! those that do not, and decodes nothing from them. No sample is ever
//! decoded against the wrong state.
//!
//! # Models
//! Each field is coded against context both sides keep: per task (up to
//! [`TASK_SLOTS`] at once), the previous sample's values and small caches
//! of recent ones; per field and per register, adaptive bit probabilities
//! and adaptive symbol frequencies.
//! - A number below 32 is one symbol; a larger one is its bit length (one
//!   symbol) and the bits below its leading one, raw (in the frame's
//!   bypass stream). Most numbers are zigzag deltas against a prediction.
//! - The task, which parts the sample has, its event, process, CPU and
//!   its register sets' ABI and mask are one bit when all are as the
//!   previous sample's task had them; else the task is one symbol for one
//!   of the group's 4 most recent tasks (tasks that take turns on a CPU
//!   come back in order) or a new one, and the rest one bit when all are
//!   as that task had them (else a register set's ABI and mask are one
//!   bit of their own).
//! - Time is a delta against the CPU's previous time plus its previous
//!   step. The period is the CPU's step (a clock's period) or the task's
//!   previous period (a counter's), whichever the task's previous sample
//!   had first, else a delta. The IP is one symbol for one of the task's
//!   2 most recent IPs or the size of a delta (and its raw bits).
//! - Registers: which of them changed since the task's previous sample is
//!   one of the set's 8 recent change masks (one symbol) or the mask's
//!   bits, raw, with the IP register expected to hold the sample's IP in
//!   the interrupted set and in the user set of a sample taken in user
//!   mode; an interrupted set is first one bit for "the user set" (a
//!   sample taken in user mode). A changed value is the sample's IP (the
//!   IP register), the user register (the interrupted set), or one symbol
//!   of the set's value model for how it is coded: a value a register of
//!   the set had (its slot in a 64-entry table of the values the set's
//!   registers took, each in the slot its hash picks), or a delta of a
//!   given size (its bits below the leading one follow raw). The
//!   registers with a test of their own (the IP register, an interrupted
//!   set's against the user set) are coded first, then the others.
//! - A callchain's length and the number of entries it shares at its
//!   outer end with the task's previous chain are one symbol when the
//!   length is within 3 of the previous chain's and fewer than 8 entries
//!   are new, else a symbol each; the leading context marker of the
//!   sample's mode and the sample's IP are one bit; the other entries are
//!   the previous chain's entry at the same depth (one bit), or one
//!   symbol for one of the task's recent return addresses or the size of
//!   a delta.
//! - A branch-stack entry is one of the CPU's 16 most recent branches
//!   (loops repeat theirs), with its flags the same as that entry's or
//!   coded, or deltas from the entry before.

use crate::regs::{Abi, MAX_SAMPLED_REGS, RegsSample};
use crate::sample::{
    BranchEntry, BranchFlags, BranchStack, CpuMode, MAX_BRANCHES, MAX_CALLCHAIN, MemInfo,
    PERF_CONTEXT_KERNEL, PERF_CONTEXT_USER, Sample,
};
use serde::{Deserialize, Serialize};

/// The record tag of a group frame (the variant after `TaskExit`).
pub const GROUP_TAG: u8 = 10;
/// The default group size (`wire_group=` when groups are asked for with no
/// size).
pub const DEFAULT_GROUP: u32 = 256;
/// A group ends after this many coded bytes even when it has fewer than
/// `N` samples, which bounds what one damaged frame can cost.
pub const GROUP_MAX_BYTES: usize = 16 * 1024;
/// A frame is closed once it holds this many coded bytes (or before a
/// sample that might take it past [`FRAME_CODED_MAX`]).
pub const FRAME_TARGET: usize = 1024;
/// The most coded bytes a frame holds (a lone large sample may use up to
/// this; a sample whose bound is larger travels as a plain sample frame).
pub const FRAME_CODED_MAX: usize = 4032;
/// Tasks whose previous sample the models remember at once (slot = tid
/// mod this; a task whose slot another task took starts afresh).
pub const TASK_SLOTS: usize = 16;

/// The head of a group frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupHead {
    /// The group's number in the stream (wrapping).
    pub group: u32,
    /// The frame's number in its group; 0 starts the group.
    pub seq: u32,
    /// The stream index (samples coded in groups since the last Hello) of
    /// the frame's first sample.
    pub first: u64,
    /// Samples in the frame.
    pub count: u32,
}

// ---------------------------------------------------------------------
// The range coder: binary adaptive bits (11-bit probabilities, as LZMA's)
// and adaptive symbols, over a 64-bit range that is renormalised 32 bits
// at a time (a carry is added straight into the bytes already written),
// with raw bits in a bypass stream of their own.

const PROB_BITS: u32 = 11;
const PROB_INIT: u16 = 1 << (PROB_BITS - 1);
/// A bit model is a `u16`: the probability of a zero, in [`PROB_BITS`]
/// bits. Each bit moves it an eighth of the way toward what it saw: fast
/// enough to learn within a group's first samples (a rate that started
/// at a half and slowed as the model saw more bits, counted beside the
/// probability, gained 0.02 bytes a default sample for about ten more
/// instructions a bit).
const RATE: u32 = 3;
// The probability stays in [7, 2041] (an update that would move it by
// less than one leaves it), so a bit costs at most 9 bits (within what
// [`bound`] counts on).

#[inline(always)]
fn prob(p: u16) -> u32 {
    u32::from(p)
}

#[inline(always)]
fn update(p: &mut u16, one: bool) {
    let q = *p;
    // Toward 0 for a one, toward 2048 for a zero.
    *p = if one {
        q - (q >> RATE)
    } else {
        q + (((1 << PROB_BITS) - q) >> RATE)
    };
}
/// The range is renormalised when it falls below this: then its top 32
/// bits go out as four bytes.
const TOP: u64 = 1 << 32;

/// What the models code through: the encoder takes each value and returns
/// it, the decoder ignores the argument and returns what it read. One
/// model code serves both, so they cannot disagree.
pub(crate) trait Coder {
    /// True for the decoder.
    const DECODE: bool;
    /// Codes one bit with adaptive probability `p` (of a zero).
    fn bit(&mut self, p: &mut u16, b: bool) -> bool;
    /// Codes `v`, which is below `2^bits` (`bits` 1 to 64), as `bits`
    /// bits with no model, in the frame's bypass stream (see
    /// [`RcEncoder`]).
    fn bypass(&mut self, v: u64, bits: u32) -> u64;
    /// Codes symbol `s` of model `m` in one step of the range coder.
    fn symbol<const S: usize, const B: usize>(&mut self, m: &Freq<S, B>, s: usize) -> usize;
    /// Marks the stream as malformed (decoder only).
    fn fail(&mut self);
}

/// The encoder's side of the range coder, writing into a fixed buffer.
///
/// Bits with no model (the low bits of a value under its length) do not
/// go through the range coder: they are packed as they are into a bypass
/// stream, least significant bit first, which ends the frame's coded
/// bytes in reverse byte order, so the decoder reads it from the frame's
/// end while the range coder reads from its start.
pub(crate) struct RcEncoder {
    low: u64,
    range: u64,
    pub(crate) out: [u8; FRAME_CODED_MAX + 16],
    pub(crate) len: usize,
    /// Set when `out` or `bypass` overflowed (the frame is then unusable).
    pub(crate) overflow: bool,
    /// The bypass stream: whole 64-bit words so far, and the bits not yet
    /// in one. Each word fills the eight bytes below the previous one,
    /// most significant byte first, from the end of `bypass` down, so
    /// the bytes lie in the reverse order the frame ends with.
    bypass: [u8; BYPASS_BYTES],
    /// Words the stream filled since the frame's start. Word `k` goes to
    /// [`bypass_at`]`(k)`, a place within `bypass` whatever `k`, so the
    /// store needs no check; a frame that filled more than fit is refused
    /// when it ends.
    filled: usize,
    /// Bits not yet in a word of `bypass` (fewer than 64).
    acc: u64,
    acc_bits: u32,
}

/// The bypass stream's room in an [`RcEncoder`]: a power of two, at least
/// `FRAME_CODED_MAX` bytes.
const BYPASS_BYTES: usize = FRAME_CODED_MAX.next_power_of_two();
const _: () = assert!(BYPASS_BYTES >= FRAME_CODED_MAX);

/// Where word `k` of the bypass stream goes in [`RcEncoder::bypass`]: the
/// `k + 1`-th eight bytes from its end (modulo its size).
#[inline(always)]
fn bypass_at(k: usize) -> usize {
    (!k << 3) & (BYPASS_BYTES - 8)
}

impl RcEncoder {
    pub(crate) const fn new() -> Self {
        RcEncoder {
            low: 0,
            range: u64::MAX,
            out: [0; FRAME_CODED_MAX + 16],
            len: 0,
            overflow: false,
            bypass: [0; BYPASS_BYTES],
            filled: 0,
            acc: 0,
            acc_bits: 0,
        }
    }

    /// Starts a new frame.
    pub(crate) fn restart(&mut self) {
        self.low = 0;
        self.range = u64::MAX;
        self.len = 0;
        self.overflow = false;
        self.filled = 0;
        self.acc = 0;
        self.acc_bits = 0;
    }

    /// Adds `v` to `low`, carrying into the bytes already written. The
    /// interval never leaves the frame's first one, so a carry always
    /// stops at a byte below 0xff within them.
    #[inline(always)]
    fn add_low(&mut self, v: u64) {
        let (low, carry) = self.low.overflowing_add(v);
        self.low = low;
        if carry {
            self.carry();
        }
    }

    #[cold]
    fn carry(&mut self) {
        for b in self.out[..self.len].iter_mut().rev() {
            *b = b.wrapping_add(1);
            if *b != 0 {
                return;
            }
        }
    }

    /// Writes the top 32 bits of `low` as four bytes.
    #[inline(always)]
    fn put_top(&mut self) {
        match self.out.get_mut(self.len..self.len + 4) {
            Some(dst) => {
                dst.copy_from_slice(&((self.low >> 32) as u32).to_be_bytes());
                self.len += 4;
            }
            None => self.overflow = true,
        }
    }

    /// After a bit or a symbol the range is at least 2^17 (see the
    /// callers), so one step of 32 bits brings it back above [`TOP`].
    #[inline(always)]
    fn normalize(&mut self) {
        if self.range < TOP {
            self.put_top();
            self.low <<= 32;
            self.range <<= 32;
        }
    }

    /// Ends the frame: `out[..len]` then decodes every value coded (the
    /// range coder's bytes, then the bypass stream's in reverse).
    pub(crate) fn finish(&mut self) {
        // A value in [low, low + range) that the decoder reads whatever
        // follows it: with the range at 2^33 or more, `low` rounded up to
        // a multiple of 2^32, of which only the top four bytes are
        // written (the decoder reads the bypass stream's first bytes, less
        // than 2^32, below them); else all of `low`.
        if self.range >> 33 != 0 {
            self.add_low(u32::MAX.into());
            self.low &= !u64::from(u32::MAX);
            self.put_top();
        } else {
            self.put_top();
            self.low <<= 32;
            self.put_top();
        }
        let tail = self.acc.to_le_bytes();
        let tail = &tail[..self.acc_bits.div_ceil(8) as usize];
        let Some(words) = BYPASS_BYTES.checked_sub(self.filled * 8) else {
            self.overflow = true;
            return;
        };
        let words = &self.bypass[words..];
        let n = words.len() + tail.len();
        match self.out.get_mut(self.len..self.len + n) {
            Some(dst) => {
                let (head, rest) = dst.split_at_mut(tail.len());
                for (d, b) in head.iter_mut().zip(tail.iter().rev()) {
                    *d = *b;
                }
                rest.copy_from_slice(words);
                self.len += n;
            }
            None => self.overflow = true,
        }
    }

    /// Coded bytes so far, counting the ones still held back.
    pub(crate) fn size(&self) -> usize {
        self.len + 8 + self.filled * 8 + self.acc_bits.div_ceil(8) as usize
    }
}

impl Coder for RcEncoder {
    const DECODE: bool = false;

    #[inline(always)]
    fn bit(&mut self, p: &mut u16, b: bool) -> bool {
        // At least 2^21 either way: the range is 2^32 or more, the
        // probability in [7, 2041].
        let bound = (self.range >> PROB_BITS) * u64::from(prob(*p));
        if b {
            self.add_low(bound);
            self.range -= bound;
        } else {
            self.range = bound;
        }
        update(p, b);
        self.normalize();
        b
    }

    #[inline(always)]
    fn bypass(&mut self, v: u64, bits: u32) -> u64 {
        debug_assert!(bits == 64 || v >> bits == 0);
        // `acc_bits` is below 64, so the shift keeps the bits that fit.
        let word = self.acc | v << self.acc_bits;
        let room = 64 - self.acc_bits;
        let total = self.acc_bits + bits;
        if total < 64 {
            self.acc = word;
            self.acc_bits = total;
            return v;
        }
        let at = bypass_at(self.filled);
        self.bypass[at..at + 8].copy_from_slice(&word.to_be_bytes());
        self.filled += 1;
        // The bits of `v` above the `room` that fit (`room` is 1 to 64:
        // two shifts, so 64 gives 0).
        self.acc = v >> 1 >> (room - 1);
        self.acc_bits = total - 64;
        v
    }

    #[inline(always)]
    fn symbol<const S: usize, const B: usize>(&mut self, m: &Freq<S, B>, s: usize) -> usize {
        // At least 2^17: the range is 2^32 or more, the total below 2^16.
        let (lo, hi) = m.span(s);
        let r = m.unit(self.range);
        self.add_low(r * u64::from(lo));
        self.range = r * u64::from(hi - lo);
        self.normalize();
        s
    }

    fn fail(&mut self) {}
}

/// The decoder's side of the range coder, reading one frame's bytes (and
/// the bypass stream from their end, see [`RcEncoder`]).
pub(crate) struct RcDecoder<'a> {
    code: u64,
    range: u64,
    data: &'a [u8],
    pos: usize,
    pub(crate) failed: bool,
    /// Bypass bytes read so far (from the end), and bits not yet used.
    bypass_read: usize,
    acc: u128,
    acc_bits: u32,
}

impl<'a> RcDecoder<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        let mut d = RcDecoder {
            code: 0,
            range: u64::MAX,
            data,
            pos: 0,
            failed: false,
            bypass_read: 0,
            acc: 0,
            acc_bits: 0,
        };
        d.code = d.next() << 32 | d.next();
        d
    }

    /// The next four bytes, big-endian (zeros past the end).
    #[inline(always)]
    fn next(&mut self) -> u64 {
        let mut b = [0u8; 4];
        if let Some(src) = self.data.get(self.pos..self.pos + 4) {
            b.copy_from_slice(src);
        } else if let Some(src) = self.data.get(self.pos..) {
            b[..src.len()].copy_from_slice(src);
        }
        self.pos += 4;
        u64::from(u32::from_be_bytes(b))
    }

    #[inline(always)]
    fn normalize(&mut self) {
        if self.range < TOP {
            self.range <<= 32;
            self.code = self.code << 32 | self.next();
        }
    }

    /// Whether the frame decoded cleanly: nothing malformed, and no more
    /// bytes read from both ends than the encoder's flush leaves (its
    /// last four bytes may be read again as the bypass stream's first).
    pub(crate) fn clean(&self) -> bool {
        !self.failed && self.pos + self.bypass_read <= self.data.len() + 4
    }
}

impl Coder for RcDecoder<'_> {
    const DECODE: bool = true;

    #[inline(always)]
    fn bit(&mut self, p: &mut u16, _: bool) -> bool {
        let bound = (self.range >> PROB_BITS) * u64::from(prob(*p));
        let b = if self.code < bound {
            self.range = bound;
            update(p, false);
            false
        } else {
            self.code -= bound;
            self.range -= bound;
            update(p, true);
            true
        };
        self.normalize();
        b
    }

    #[inline(always)]
    fn bypass(&mut self, _: u64, bits: u32) -> u64 {
        while self.acc_bits < bits {
            let b = self
                .data
                .len()
                .checked_sub(self.bypass_read + 1)
                .map_or(0, |i| self.data[i]);
            self.bypass_read += 1;
            self.acc |= u128::from(b) << self.acc_bits;
            self.acc_bits += 8;
        }
        let v = self.acc as u64 & (u64::MAX >> (64 - bits));
        self.acc >>= bits;
        self.acc_bits -= bits;
        v
    }

    fn symbol<const S: usize, const B: usize>(&mut self, m: &Freq<S, B>, _: usize) -> usize {
        let total = u64::from(m.total());
        // Never 0 (the range is 2^32 or more), but a division by it must
        // not be able to panic.
        let r = m.unit(self.range).max(1);
        let v = self.code / r;
        if v >= total {
            // Malformed: stop reading, but stay well-formed (the rest of
            // the sample is read as garbage and thrown away).
            self.failed = true;
            self.range = u64::MAX;
            self.code = 0;
            return 0;
        }
        // The symbol whose span holds `v`.
        let s = m.below.partition_point(|&b| u64::from(b) <= v) - 1;
        let (lo, hi) = m.span(s);
        self.code -= r * u64::from(lo);
        self.range = r * u64::from(hi - lo);
        self.normalize();
        s
    }

    fn fail(&mut self) {
        self.failed = true;
    }
}

// ---------------------------------------------------------------------
// Models.

/// What a [`Freq`] model adds to a symbol's count each time it is seen.
const FREQ_STEP: u16 = 24;
/// A [`Freq`] model's total beyond which its counts are halved.
const FREQ_LIMIT: u16 = 1 << 15;

/// Symbols a [`Freq`] model codes between two rebuilds of its cumulative
/// counts, at most (it starts at 1 and doubles up to this).
const REBUILD_MAX: u16 = 256;

/// An adaptive model of `S` symbols, each coded in one step of the range
/// coder: every symbol's count starts at 1 and grows by [`FREQ_STEP`] each
/// time it is seen.
///
/// Coding reads the cumulative counts of the last rebuild, and seeing a
/// symbol only adds to its own count; the cumulative counts are rebuilt
/// from the counts after 2, 4, 8, ... up to [`REBUILD_MAX`] symbols, so
/// the model learns fast at a group's start and then costs a few
/// instructions a symbol whatever its size.
///
/// `B` is `S + 1`: `below` ends with the total, so a symbol's span is two
/// entries of it.
#[derive(Clone, Copy)]
pub(crate) struct Freq<const S: usize, const B: usize> {
    count: [u16; S],
    /// The count below each symbol at the last rebuild, then the total.
    below: [u16; B],
    /// `floor((2^64 - 1) / total)`: the range coder's unit for a range
    /// (see [`Freq::unit`]) is a multiplication by it, not a division.
    inv: u64,
    /// Symbols until the next rebuild, and the next wait after it.
    left: u16,
    wait: u16,
}

impl<const S: usize, const B: usize> Freq<S, B> {
    const NEW: Self = {
        assert!(B == S + 1);
        let mut below = [0u16; B];
        let mut i = 0;
        while i < B {
            below[i] = i as u16;
            i += 1;
        }
        Freq {
            count: [1; S],
            below,
            inv: u64::MAX / S as u64,
            left: 2,
            wait: 4,
        }
    };

    /// The range coder's unit for `range`: `range * inv / 2^64`, which is
    /// `range / total` or one less (both sides compute it the same way,
    /// and `unit * total` stays within the range). For a range of 2^32
    /// or more it is at least 2^16.
    #[inline(always)]
    fn unit(&self, range: u64) -> u64 {
        ((u128::from(range) * u128::from(self.inv)) >> 64) as u64
    }

    /// The counts' total at the last rebuild.
    #[inline(always)]
    fn total(&self) -> u16 {
        self.below[S]
    }

    /// Symbol `s`'s span at the last rebuild.
    #[inline(always)]
    fn span(&self, s: usize) -> (u32, u32) {
        (u32::from(self.below[s]), u32::from(self.below[s + 1]))
    }

    /// Codes symbol `s` (the decoder's when decoding) and counts it.
    #[inline(always)]
    fn code<C: Coder>(&mut self, c: &mut C, s: usize) -> usize {
        let s = c.symbol(self, s);
        if let Some(n) = self.count.get_mut(s) {
            *n += FREQ_STEP;
        }
        self.left -= 1;
        if self.left == 0 {
            self.rebuild();
        }
        s
    }

    /// New cumulative counts from the counts; when their total passes
    /// [`FREQ_LIMIT`], the counts are halved first (each kept at least 1).
    #[cold]
    fn rebuild(&mut self) {
        if self.spread() > FREQ_LIMIT {
            for n in &mut self.count {
                *n = n.div_ceil(2);
            }
            self.spread();
        }
        self.inv = u64::MAX / u64::from(self.total());
        self.left = self.wait;
        self.wait = (self.wait * 2).min(REBUILD_MAX);
    }

    /// The cumulative counts of the counts as they are, and their total
    /// (returned).
    fn spread(&mut self) -> u16 {
        let mut below = 0u16;
        for (b, n) in self.below.iter_mut().zip(&self.count) {
            *b = below;
            below += *n;
        }
        self.below[S] = below;
        below
    }
}

/// A changed register's value is a recent value of its set (this plus its
/// slot in [`RegsState::table`]) ...
const REG_SLOT: usize = 0;
/// ... or a delta against its previous value: this plus the delta's
/// [`UintModel`] symbol, so how a value is coded and how large its delta
/// is are one step of the coder.
const REG_DELTA: usize = REG_SLOT + REG_TABLE;
/// A model of how a changed register's value is coded.
type RegValueModel = Freq<{ REG_DELTA + UINT_SYMBOLS }, { REG_DELTA + UINT_SYMBOLS + 1 }>;
/// A model of which recent change mask (or none).
type MaskModel = Freq<{ MASK_CACHE + 1 }, { MASK_CACHE + 2 }>;

/// Bits of the values a [`UintModel`] codes as a symbol each.
const SMALL_BITS: u32 = 5;
/// Symbols of a [`UintModel`]: the values below `2^SMALL_BITS`, then the
/// bit lengths above `SMALL_BITS`.
const UINT_SYMBOLS: usize = (1 << SMALL_BITS) + 64 - SMALL_BITS as usize;

/// An adaptive model of unsigned integers: a small value is one symbol;
/// a larger one is its bit length (one symbol) and the bits below its
/// leading one, raw.
#[derive(Clone, Copy)]
struct UintModel {
    sym: Freq<UINT_SYMBOLS, { UINT_SYMBOLS + 1 }>,
}

impl UintModel {
    const NEW: UintModel = UintModel { sym: Freq::NEW };

    fn reset(&mut self) {
        self.sym = Freq::NEW;
    }

    #[inline(always)]
    fn code<C: Coder>(&mut self, c: &mut C, v: u64) -> u64 {
        let s = self.sym.code(c, uint_symbol(v));
        uint_rest(c, s, v)
    }

    /// Codes a wrapping difference (zigzag).
    #[inline(always)]
    fn delta<C: Coder>(&mut self, c: &mut C, d: u64) -> u64 {
        let z = self.code(c, zigzag(d));
        if C::DECODE { unzigzag(z) } else { d }
    }
}

/// The [`UintModel`] symbol of `v`.
#[inline(always)]
fn uint_symbol(v: u64) -> usize {
    const SMALL: u64 = 1 << SMALL_BITS;
    if v < SMALL {
        v as usize
    } else {
        SMALL as usize + (63 - v.leading_zeros() - SMALL_BITS) as usize
    }
}

/// The value of [`UintModel`] symbol `s`: the symbol itself, or the bits
/// of `v` below its leading one, coded raw (the encoder has `v`, the
/// value of its own symbol).
#[inline(always)]
fn uint_rest<C: Coder>(c: &mut C, s: usize, v: u64) -> u64 {
    const SMALL: usize = 1 << SMALL_BITS;
    if s < SMALL {
        return s as u64;
    }
    let low = (s - SMALL) as u32 + SMALL_BITS;
    // The bits below the leading one (the encoder's `v` has it at `low`).
    let bits = c.bypass(v ^ (1 << low), low);
    if C::DECODE { (1u64 << low) | bits } else { v }
}

/// `base` plus the zigzag delta of [`UintModel`] symbol `s` (see
/// [`uint_rest`]): `v`, whose delta is `delta`, when encoding.
#[inline(always)]
fn delta_value<C: Coder>(c: &mut C, s: usize, base: u64, delta: u64, v: u64) -> u64 {
    let z = uint_rest(c, s, delta);
    if C::DECODE {
        base.wrapping_add(unzigzag(z))
    } else {
        v
    }
}

/// Codes the low `BITS` bits of `v`, most significant first, through a
/// bit tree of `probs` (which has `1 << BITS` entries).
#[inline]
fn tree<C: Coder, const BITS: u32>(c: &mut C, probs: &mut [u16], v: u32) -> u32 {
    let mut idx = 1usize;
    for i in (0..BITS).rev() {
        let b = c.bit(&mut probs[idx], (v >> i) & 1 != 0);
        idx = idx * 2 + usize::from(b);
    }
    idx as u32 - (1 << BITS)
}

const fn zigzag(d: u64) -> u64 {
    let d = d as i64;
    ((d << 1) ^ (d >> 63)) as u64
}

const fn unzigzag(z: u64) -> u64 {
    (z >> 1) ^ (z & 1).wrapping_neg()
}

/// The models of one register set (user or interrupt). Its registers share
/// them: models of their own, per register, each paid their warm-up (the
/// first rebuilds of their counts) in every group, and bought no density
/// on the samples measured.
#[derive(Clone, Copy)]
struct RegModels {
    shape_same: u16,
    /// "Equal to the same register of the sample's user set", by whether
    /// the sample was taken in the kernel.
    alt: [u16; 2],
    /// "The sample's IP" (the IP register), by whether the sample was
    /// taken in the kernel.
    ip_eq: [u16; 2],
    /// How a changed value is coded ([`REG_SLOT`] plus its slot in the
    /// set's recent values, or [`REG_DELTA`] plus the delta's size).
    value: RegValueModel,
    /// "All the same as the alternative set", by whether the sample was
    /// taken in the kernel.
    all_alt: [u16; 2],
    /// Which of the recent change masks, or none ([`MASK_CACHE`]).
    mask_which: MaskModel,
}

impl RegModels {
    const NEW: RegModels = RegModels {
        shape_same: PROB_INIT,
        alt: [PROB_INIT; 2],
        ip_eq: [PROB_INIT; 2],
        value: RegValueModel::NEW,
        all_alt: [PROB_INIT; 2],
        mask_which: MaskModel::NEW,
    };

    fn reset(&mut self) {
        self.shape_same = PROB_INIT;
        self.alt.fill(PROB_INIT);
        self.ip_eq.fill(PROB_INIT);
        self.value = RegValueModel::NEW;
        self.all_alt.fill(PROB_INIT);
        self.mask_which = MaskModel::NEW;
    }
}

/// Values of perf's general-purpose register set ([`crate::regs::GPR_MASK`]).
const GPRS: usize = crate::regs::GPR_MASK.count_ones() as usize;
/// Recent change masks a register set keeps.
const MASK_CACHE: usize = 8;
/// The set's recent values ([`RegsState::table`]): `2^REG_TABLE_BITS`
/// slots.
const REG_TABLE_BITS: u32 = 6;
const REG_TABLE: usize = 1 << REG_TABLE_BITS;

/// The slot of value `v` in a register set's recent values (Fibonacci
/// hashing: the top bits of a product with 2^64 / phi).
#[inline(always)]
fn slot(v: u64) -> usize {
    (v.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - REG_TABLE_BITS)) as usize
}
/// Recent IPs a task's cache keeps.
const IP_CACHE: usize = 2;
/// Recent callchain entries (return addresses) a task's cache keeps.
const CHAIN_CACHE: usize = 4;
/// Recent branches (from, to, flags) a task's cache keeps.
const BRANCH_CACHE: usize = 16;

/// Puts `v` at the front of `cache`, moving entries `0..at` back by one
/// (entry `at` is dropped). A fixed-length pass of conditional moves: the
/// caches are a few entries long, and a call to `memmove` costs more.
#[inline(always)]
fn put_front<T: Copy, const N: usize>(cache: &mut [T; N], at: usize, v: T) {
    for j in (1..N).rev() {
        if j <= at {
            cache[j] = cache[j - 1];
        }
    }
    cache[0] = v;
}

/// Codes `v` as one of `cache`'s entries or a delta against `base`, in
/// one symbol of `model` (the entry's place, or `N` plus the delta's
/// [`UintModel`] symbol) and the delta's raw bits, and moves it to the
/// front of the cache (a delta's value was not in it: the oldest entry
/// goes).
#[inline(always)]
fn code_cached_or_delta<C: Coder, const N: usize, const M: usize, const B: usize>(
    c: &mut C,
    model: &mut Freq<M, B>,
    cache: &mut [u64; N],
    base: u64,
    v: u64,
) -> u64 {
    const { assert!(M == N + UINT_SYMBOLS) };
    let delta = zigzag(v.wrapping_sub(base));
    let s_in = if C::DECODE {
        0
    } else {
        cache
            .iter()
            .position(|e| *e == v)
            .unwrap_or_else(|| N + uint_symbol(delta))
    };
    let s = model.code(c, s_in);
    // Each arm moves the cache itself: a delta's place is a constant.
    match cache.get(s) {
        Some(&hit) => {
            put_front(cache, s, hit);
            hit
        }
        None => {
            let v = delta_value(c, s - N, base, delta, v);
            put_front(cache, N - 1, v);
            v
        }
    }
}

/// Every field's adaptive probabilities.
#[derive(Clone)]
struct FieldModels {
    as_before: u16,
    which_task: Freq<{ TID_CACHE + 1 }, { TID_CACHE + 2 }>,
    tid: UintModel,
    task_as_before: u16,
    shape_same: u16,
    shape: [u16; 128],
    event_same: u16,
    event: UintModel,
    pid_same: u16,
    pid: UintModel,
    cpu_same: u16,
    cpu: UintModel,
    time: UintModel,
    period_first: [u16; 2],
    period_second: [u16; 2],
    period: UintModel,
    ip: Freq<{ IP_CACHE + UINT_SYMBOLS }, { IP_CACHE + UINT_SYMBOLS + 1 }>,
    cc_len: Freq<MAX_CALLCHAIN, { MAX_CALLCHAIN + 1 }>,
    cc_keep: Freq<{ MAX_CALLCHAIN + 1 }, { MAX_CALLCHAIN + 2 }>,
    cc_shape: Freq<{ CC_SHAPES + 1 }, { CC_SHAPES + 2 }>,
    cc_same: u16,
    cc_head: u16,
    cc: Freq<{ CHAIN_CACHE + UINT_SYMBOLS }, { CHAIN_CACHE + UINT_SYMBOLS + 1 }>,
    br_idx_same: u16,
    br_idx: UintModel,
    br_len_same: u16,
    br_len: UintModel,
    br_shift: UintModel,
    br_which: Freq<{ BRANCH_CACHE + 1 }, { BRANCH_CACHE + 2 }>,
    br_from: UintModel,
    br_to: UintModel,
    br_flags_same: u16,
    br_flags: UintModel,
    regs: [RegModels; 2],
    mem_addr: UintModel,
    mem_weight: UintModel,
    mem_lat: UintModel,
    mem_src_same: u16,
    mem_src: UintModel,
}

impl FieldModels {
    const NEW: FieldModels = FieldModels {
        as_before: PROB_INIT,
        which_task: Freq::NEW,
        tid: UintModel::NEW,
        task_as_before: PROB_INIT,
        shape_same: PROB_INIT,
        shape: [PROB_INIT; 128],
        event_same: PROB_INIT,
        event: UintModel::NEW,
        pid_same: PROB_INIT,
        pid: UintModel::NEW,
        cpu_same: PROB_INIT,
        cpu: UintModel::NEW,
        time: UintModel::NEW,
        period_first: [PROB_INIT; 2],
        period_second: [PROB_INIT; 2],
        period: UintModel::NEW,
        ip: Freq::NEW,
        cc_len: Freq::NEW,
        cc_keep: Freq::NEW,
        cc_shape: Freq::NEW,
        cc_same: PROB_INIT,
        cc_head: PROB_INIT,
        cc: Freq::NEW,
        br_idx_same: PROB_INIT,
        br_idx: UintModel::NEW,
        br_len_same: PROB_INIT,
        br_len: UintModel::NEW,
        br_shift: UintModel::NEW,
        br_which: Freq::NEW,
        br_from: UintModel::NEW,
        br_to: UintModel::NEW,
        br_flags_same: PROB_INIT,
        br_flags: UintModel::NEW,
        regs: [RegModels::NEW; 2],
        mem_addr: UintModel::NEW,
        mem_weight: UintModel::NEW,
        mem_lat: UintModel::NEW,
        mem_src_same: PROB_INIT,
        mem_src: UintModel::NEW,
    };

    fn reset(&mut self) {
        for p in [
            &mut self.as_before,
            &mut self.task_as_before,
            &mut self.pid_same,
            &mut self.shape_same,
            &mut self.event_same,
            &mut self.cpu_same,
            &mut self.mem_src_same,
            &mut self.cc_same,
            &mut self.cc_head,
            &mut self.br_idx_same,
            &mut self.br_len_same,
            &mut self.br_flags_same,
        ] {
            *p = PROB_INIT;
        }
        self.shape.fill(PROB_INIT);
        self.period_first.fill(PROB_INIT);
        self.period_second.fill(PROB_INIT);
        self.cc_len = Freq::NEW;
        self.cc_keep = Freq::NEW;
        self.cc_shape = Freq::NEW;
        self.ip = Freq::NEW;
        self.which_task = Freq::NEW;
        self.cc = Freq::NEW;
        self.br_which = Freq::NEW;
        for m in [
            &mut self.tid,
            &mut self.event,
            &mut self.pid,
            &mut self.cpu,
            &mut self.time,
            &mut self.period,
            &mut self.br_idx,
            &mut self.br_len,
            &mut self.br_shift,
            &mut self.br_from,
            &mut self.br_to,
            &mut self.br_flags,
            &mut self.mem_addr,
            &mut self.mem_weight,
            &mut self.mem_lat,
            &mut self.mem_src,
        ] {
            m.reset();
        }
        for r in &mut self.regs {
            r.reset();
        }
    }
}

/// A register set as a task's state keeps it.
#[derive(Clone, Copy)]
struct RegsState {
    abi: Abi,
    mask: u64,
    n: usize,
    /// The values (the first `n`): as many entries as a mask has bits, so
    /// a value's index, a bit of a mask, needs no bounds check.
    values: [u64; 64],
    /// Values the set's registers took, each in its [`slot`]: a value a
    /// register had before (a loop's pointers and counters come back) or
    /// another register has (a copy, a return value, RCX and R11 after a
    /// system call).
    table: [u64; REG_TABLE],
    /// Recent change masks, most recent first.
    masks: [u64; MASK_CACHE],
}

impl RegsState {
    const NEW: RegsState = RegsState {
        abi: Abi::None,
        mask: 0,
        n: 0,
        values: [0; 64],
        table: [0; REG_TABLE],
        masks: [0; MASK_CACHE],
    };
}

/// What the models remember of a task: its previous sample in the group.
#[derive(Clone)]
struct TaskState {
    valid: bool,
    tid: u32,
    /// The shape bits of the previous sample ([`shape_of`]); `NO_SHAPE`
    /// before the first.
    shape: u32,
    event: u32,
    pid: u32,
    cpu: u32,
    period: u64,
    /// Whether the previous period was the CPU's time step.
    period_by_step: bool,
    ip: u64,
    ips: [u64; IP_CACHE],
    callchain: heapless::Vec<u64, MAX_CALLCHAIN>,
    returns: [u64; CHAIN_CACHE],
    regs: [RegsState; 2],
    mem: MemInfo,
}

/// What the models remember of a CPU: its previous sample's time and the
/// step before it (samples of one CPU come in time order, whatever their
/// task), and its branch stack (the LBR belongs to the CPU, not the
/// task): the previous stack and recent branches.
#[derive(Clone)]
struct CpuState {
    valid: bool,
    cpu: u32,
    time: u64,
    step: u64,
    hw_idx: u64,
    stack: heapless::Vec<(u64, u64, u64), MAX_BRANCHES>,
    recent: [(u64, u64, u64); BRANCH_CACHE],
}

impl CpuState {
    const NEW: CpuState = CpuState {
        valid: false,
        cpu: 0,
        time: 0,
        step: 0,
        hw_idx: 0,
        stack: heapless::Vec::new(),
        recent: [(0, 0, 0); BRANCH_CACHE],
    };

    fn claim(&mut self, cpu: u32) {
        self.valid = true;
        self.cpu = cpu;
        self.time = 0;
        self.step = 0;
        self.hw_idx = 0;
        self.stack.clear();
        self.recent = [(0, 0, 0); BRANCH_CACHE];
    }
}

/// CPUs the models remember at once (slot = CPU mod this).
const CPU_SLOTS: usize = 4;

/// A shape no sample has: the task's first sample in the group.
const NO_SHAPE: u32 = 1 << 7;

impl TaskState {
    const NEW: TaskState = TaskState {
        valid: false,
        tid: 0,
        shape: NO_SHAPE,
        event: 0,
        pid: 0,
        cpu: 0,
        period: 0,
        period_by_step: false,
        ip: 0,
        ips: [0; IP_CACHE],
        callchain: heapless::Vec::new(),
        returns: [0; CHAIN_CACHE],
        regs: [RegsState::NEW; 2],
        mem: MemInfo {
            addr: 0,
            weight: 0,
            ins_lat: 0,
            data_src: 0,
        },
    };

    fn claim(&mut self, tid: u32) {
        self.valid = true;
        self.tid = tid;
        self.shape = NO_SHAPE;
        self.event = 0;
        self.pid = tid;
        self.cpu = 0;
        self.period = 0;
        self.period_by_step = false;
        self.ip = 0;
        self.ips = [0; IP_CACHE];
        self.callchain.clear();
        self.returns = [0; CHAIN_CACHE];
        for r in &mut self.regs {
            r.abi = Abi::None;
            r.mask = 0;
            r.n = 0;
            r.table = [0; REG_TABLE];
            r.masks = [0; MASK_CACHE];
        }
        self.mem = MemInfo::default();
    }
}

mod shape {
    pub const KERNEL: u32 = 1 << 0;
    pub const PID: u32 = 1 << 1;
    pub const CALLCHAIN: u32 = 1 << 2;
    pub const BRANCHES: u32 = 1 << 3;
    pub const UREGS: u32 = 1 << 4;
    pub const IREGS: u32 = 1 << 5;
    pub const MEM: u32 = 1 << 6;
}

/// Which parts a sample has.
fn shape_of(s: &Sample) -> u32 {
    // A test and a branch each, taken by the parts samples seldom have
    // (cheaper than turning each test into its bit).
    let mut f = shape::CALLCHAIN | shape::UREGS;
    if s.cpumode == CpuMode::Kernel {
        core::hint::cold_path();
        f |= shape::KERNEL;
    }
    if s.pid != s.tid {
        core::hint::cold_path();
        f |= shape::PID;
    }
    if s.callchain.is_empty() {
        core::hint::cold_path();
        f &= !shape::CALLCHAIN;
    }
    if s.branches.is_some() {
        core::hint::cold_path();
        f |= shape::BRANCHES;
    }
    if s.regs_user.is_none() {
        core::hint::cold_path();
        f &= !shape::UREGS;
    }
    if s.regs_intr.is_some() {
        core::hint::cold_path();
        f |= shape::IREGS;
    }
    if s.mem.is_some() {
        core::hint::cold_path();
        f |= shape::MEM;
    }
    f
}

/// The state both sides of a group keep: the models and the tasks.
#[derive(Clone)]
pub(crate) struct GroupModels {
    fields: FieldModels,
    tasks: [TaskState; TASK_SLOTS],
    cpus: [CpuState; CPU_SLOTS],
    /// The tasks of the latest samples, most recent first (the first
    /// `known_tids`): tasks that take turns on a CPU come back in the
    /// same order.
    tids: [u32; TID_CACHE],
    known_tids: usize,
}

/// A callchain's length and kept entries are one symbol when its length
/// is within this of the previous chain's ...
const CC_STEP: usize = 3;
/// ... and it has fewer than this many entries not kept.
const CC_FRESH: usize = 8;
/// Symbols of that: (length step + `CC_STEP`) * `CC_FRESH` + entries not
/// kept; this one says the length and kept entries follow as symbols.
const CC_SHAPES: usize = (2 * CC_STEP + 1) * CC_FRESH;

/// Recent tasks a group remembers in order.
const TID_CACHE: usize = 4;

impl GroupModels {
    pub(crate) const NEW: GroupModels = GroupModels {
        fields: FieldModels::NEW,
        tasks: [TaskState::NEW; TASK_SLOTS],
        cpus: [CpuState::NEW; CPU_SLOTS],
        tids: [0; TID_CACHE],
        known_tids: 0,
    };

    /// Back to the state at a group's start.
    pub(crate) fn reset(&mut self) {
        self.fields.reset();
        for t in &mut self.tasks {
            t.valid = false;
        }
        for l in &mut self.cpus {
            l.valid = false;
        }
        self.known_tids = 0;
    }
}

/// An upper bound of the coded bytes of `s` whatever the models hold: a
/// modelled bit costs at most 9 bits (its probability stays at 7/2048
/// or more), a symbol at most 16 (its count is at least 1 of a total of
/// at most 2^15 after a rebuild), and a value takes at most three bits,
/// two symbols and 63 raw bits: 128 bits, within the 20 bytes counted
/// for it. `None` when a register set is not well formed (the coder
/// relies on it).
#[inline(always)]
pub(crate) fn bound(s: &Sample) -> Option<usize> {
    const VALUE: usize = 20;
    let regs = |r: &Option<RegsSample>| match r {
        None => Some(0),
        Some(r) => r.well_formed().then_some(10 + r.values.len() * VALUE),
    };
    let branches = s.branches.as_ref().map_or(0, |b| 2 + b.entries.len() * 3) * VALUE;
    Some(
        32 + 12 * VALUE
            + (s.callchain.len() + 2) * VALUE
            + branches
            + regs(&s.regs_user)?
            + regs(&s.regs_intr)?,
    )
}

/// Codes one sample: `inp` when encoding, into `out` when decoding (the
/// other is not touched).
// Inlined into the encoder's `put`: a call and its saved registers
// cost the drain about 45 instructions a sample.
#[inline(always)]
pub(crate) fn code_sample<C: Coder>(
    c: &mut C,
    m: &mut GroupModels,
    inp: &Sample,
    out: &mut Sample,
) {
    let f = &mut m.fields;
    // The task, and which parts the sample has, its event, process and CPU:
    // all as the previous sample's task had them (one bit); else which of
    // the recent tasks (one symbol) or a new one, then all as that task
    // had them (one bit) or each coded.
    let shape_in = shape_of(inp);
    // A register set's ABI and mask as the task's previous sample had them.
    let regs_fit = |r: &Option<RegsSample>, st: &RegsState| {
        r.as_ref()
            .is_none_or(|r| r.abi == st.abi && r.mask == st.mask)
    };
    let fits = |t: &TaskState| {
        t.valid
            && t.tid == inp.tid
            && shape_in == t.shape
            && inp.event == t.event
            && inp.pid == t.pid
            && inp.cpu == t.cpu
            && regs_fit(&inp.regs_user, &t.regs[0])
            && regs_fit(&inp.regs_intr, &t.regs[1])
    };
    let last_tid = m.tids[0];
    let last = &m.tasks[last_tid as usize % TASK_SLOTS];
    let known = m.known_tids > 0 && last.valid && last.tid == last_tid;
    let (tid, shape, event, pid, cpu);
    // Whether the register sets keep their ABI and mask (part of "as the
    // task had them").
    let regs_known;
    if known && c.bit(&mut f.as_before, !C::DECODE && fits(last)) {
        (tid, shape, event, pid, cpu) = (last.tid, last.shape, last.event, last.pid, last.cpu);
        regs_known = true;
    } else {
        let n = m.known_tids;
        let at_in = if C::DECODE {
            0
        } else {
            m.tids[..n]
                .iter()
                .position(|&x| x == inp.tid)
                .unwrap_or(TID_CACHE)
        };
        let at = f.which_task.code(c, at_in);
        tid = if at < n {
            m.tids[at]
        } else if at < TID_CACHE {
            c.fail();
            0
        } else {
            let v = f.tid.code(c, u64::from(inp.tid));
            if v > u64::from(u32::MAX) {
                c.fail();
            }
            v as u32
        };
        // The new task goes first; one not among them takes the place of
        // the oldest (or a free one).
        put_front(&mut m.tids, at.min(n).min(TID_CACHE - 1), tid);
        m.known_tids = (n + usize::from(at >= n)).min(TID_CACHE);
        let t = &mut m.tasks[tid as usize % TASK_SLOTS];
        if !t.valid || t.tid != tid {
            t.claim(tid);
        }
        let had = t.shape & NO_SHAPE == 0;
        regs_known = had && c.bit(&mut f.task_as_before, !C::DECODE && fits(t));
        if regs_known {
            (shape, event, pid, cpu) = (t.shape, t.event, t.pid, t.cpu);
        } else {
            shape = if c.bit(&mut f.shape_same, shape_in == t.shape) {
                t.shape
            } else {
                tree::<C, 7>(c, &mut f.shape, shape_in)
            };
            event = if c.bit(&mut f.event_same, inp.event == t.event) {
                t.event
            } else {
                f.event.code(c, u64::from(inp.event)) as u32
            };
            pid = if shape & shape::PID == 0 {
                tid
            } else if c.bit(&mut f.pid_same, inp.pid == t.pid && t.pid != tid) {
                t.pid
            } else {
                let v = f.pid.code(c, u64::from(inp.pid)) as u32;
                if v == tid {
                    c.fail();
                }
                v
            };
            cpu = if c.bit(&mut f.cpu_same, inp.cpu == t.cpu) {
                t.cpu
            } else {
                f.cpu.code(c, u64::from(inp.cpu)) as u32
            };
        }
    }
    if shape == NO_SHAPE || (shape & shape::PID != 0 && pid == tid) {
        c.fail();
    }
    let t = &mut m.tasks[tid as usize % TASK_SLOTS];
    (t.shape, t.event, t.pid, t.cpu) = (shape, event, pid, cpu);

    // Time: against the CPU's previous sample plus the step before it (a
    // clock's period), whichever task it was.
    let cs = &mut m.cpus[cpu as usize % CPU_SLOTS];
    if !cs.valid || cs.cpu != cpu {
        cs.claim(cpu);
    }
    let predicted = cs.time.wrapping_add(cs.step);
    let time = predicted.wrapping_add(f.time.delta(c, inp.time.wrapping_sub(predicted)));
    cs.step = time.wrapping_sub(cs.time);
    cs.time = time;
    // The period: a clock's is the time since the CPU's previous sample,
    // a counter's its fixed sample period. Whichever the task's previous
    // period was is tried first.
    let step = cs.step;
    let by_step = usize::from(t.period_by_step);
    let (first, second) = if t.period_by_step {
        (step, t.period)
    } else {
        (t.period, step)
    };
    let period = if c.bit(&mut f.period_first[by_step], inp.period == first) {
        first
    } else if c.bit(&mut f.period_second[by_step], inp.period == second) {
        second
    } else {
        t.period
            .wrapping_add(f.period.delta(c, inp.period.wrapping_sub(t.period)))
    };
    t.period_by_step = period == step;
    t.period = period;
    let old_ip = t.ip;
    // IP: one of the task's recent ones, else against the last.
    let ip = code_cached_or_delta(c, &mut f.ip, &mut t.ips, t.ip, inp.ip);
    t.ip = ip;
    if C::DECODE {
        out.tid = tid;
        out.pid = pid;
        out.event = event;
        out.cpu = cpu;
        out.time = time;
        out.period = period;
        out.ip = ip;
        out.cpumode = if shape & shape::KERNEL != 0 {
            CpuMode::Kernel
        } else {
            CpuMode::User
        };
    }

    // Callchain: the entries it shares at its outer end with the task's
    // previous chain are kept; the rest go as deltas, inner to outer.
    if C::DECODE {
        out.callchain.clear();
    }
    if shape & shape::CALLCHAIN != 0 {
        let marker = if shape & shape::KERNEL != 0 {
            PERF_CONTEXT_KERNEL
        } else {
            PERF_CONTEXT_USER
        };
        code_callchain(c, f, t, old_ip, marker, inp, out);
    } else {
        t.callchain.clear();
    }

    if C::DECODE {
        out.branches = None;
    }
    if shape & shape::BRANCHES != 0 {
        code_branches(c, f, cs, ip, inp, out);
    }

    let kernel = usize::from(shape & shape::KERNEL != 0);
    let (user, intr) = t.regs.split_at_mut(1);
    if shape & shape::UREGS != 0 {
        code_regs(
            c,
            &mut f.regs[0],
            &mut user[0],
            None,
            ip,
            kernel,
            kernel == 0,
            regs_known,
            inp.regs_user.as_ref(),
        );
    }
    if shape & shape::IREGS != 0 {
        // Interrupted registers against the sample's user ones first: the
        // same values when the sample interrupted user code.
        let alt = (shape & shape::UREGS != 0).then_some(&user[0]);
        code_regs(
            c,
            &mut f.regs[1],
            &mut intr[0],
            alt,
            ip,
            kernel,
            true,
            regs_known,
            inp.regs_intr.as_ref(),
        );
    }
    if C::DECODE {
        out.regs_user = (shape & shape::UREGS != 0).then(|| regs_sample(&t.regs[0]));
        out.regs_intr = (shape & shape::IREGS != 0).then(|| regs_sample(&t.regs[1]));
    }

    if shape & shape::MEM != 0 {
        let mi = inp.mem.unwrap_or_default();
        let mem = MemInfo {
            addr: t
                .mem
                .addr
                .wrapping_add(f.mem_addr.delta(c, mi.addr.wrapping_sub(t.mem.addr))),
            weight: f.mem_weight.code(c, mi.weight),
            ins_lat: {
                let v = f.mem_lat.code(c, u64::from(mi.ins_lat));
                if v > u64::from(u16::MAX) {
                    c.fail();
                }
                v as u16
            },
            data_src: if c.bit(&mut f.mem_src_same, mi.data_src == t.mem.data_src) {
                t.mem.data_src
            } else {
                f.mem_src.code(c, mi.data_src)
            },
        };
        t.mem = mem;
        if C::DECODE {
            out.mem = Some(mem);
        }
    } else if C::DECODE {
        out.mem = None;
    }
}

#[inline(always)]
fn code_callchain<C: Coder>(
    c: &mut C,
    f: &mut FieldModels,
    t: &mut TaskState,
    old_ip: u64,
    marker: u64,
    inp: &Sample,
    out: &mut Sample,
) {
    // The chain's length and the entries it shares at its outer end with
    // the previous chain (kept): one symbol for a length within
    // `CC_STEP` of the previous one and fewer than `CC_FRESH` other
    // entries, else a symbol each.
    let prev = &t.callchain;
    let (len_in, shared_in) = if C::DECODE {
        (0, 0)
    } else {
        // The outer ends of the two chains, compared from the outside in.
        let (a, b) = (inp.callchain.as_slice(), prev.as_slice());
        let mut shared = 0;
        for (x, y) in a.iter().rev().zip(b.iter().rev()) {
            if x != y {
                break;
            }
            shared += 1;
        }
        (inp.callchain.len(), shared)
    };
    let step_in = (len_in + CC_STEP).wrapping_sub(prev.len());
    let fresh_in = len_in - shared_in;
    let sym_in = if step_in <= 2 * CC_STEP && fresh_in < CC_FRESH {
        step_in * CC_FRESH + fresh_in
    } else {
        CC_SHAPES
    };
    let sym = f.cc_shape.code(c, sym_in);
    let (len, keep) = if sym < CC_SHAPES {
        let len = (prev.len() + sym / CC_FRESH).wrapping_sub(CC_STEP);
        (len, len.wrapping_sub(sym % CC_FRESH))
    } else {
        // A chain has 1 to MAX_CALLCHAIN entries.
        let len = f.cc_len.code(c, len_in.wrapping_sub(1)) + 1;
        (len, f.cc_keep.code(c, shared_in))
    };
    if len == 0 || len > MAX_CALLCHAIN || keep > len || keep > prev.len() {
        c.fail();
        t.callchain.clear();
        return;
    }
    // The previous chain [its own entries | the kept ones] becomes [the
    // fresh entries | the kept ones], in place: the kept ones move first
    // (only above the fresh ones' places), then each fresh entry replaces
    // the previous chain's entry at its depth, which it is coded against.
    let plen = t.callchain.len();
    let cc = &mut t.callchain;
    if len > plen {
        // Cannot fail: `len <= MAX_CALLCHAIN`.
        let _ = cc.resize(len, 0);
    }
    if len != plen {
        cc.copy_within(plen - keep..plen, len - keep);
        cc.truncate(len);
    }
    let fresh = len - keep;
    let mut last = t.ip;
    // A chain starts with the context marker of the sample's mode and the
    // sample's IP (one bit for both).
    let mut from = 0;
    if fresh >= 2
        && c.bit(
            &mut f.cc_head,
            !C::DECODE && inp.callchain[..2] == [marker, t.ip],
        )
    {
        cc[0] = marker;
        cc[1] = t.ip;
        from = 2;
    }
    for i in from..fresh {
        let v = if C::DECODE { 0 } else { inp.callchain[i] };
        // Against the previous chain's entry at the same depth (its
        // context marker, the same function), else the entry before.
        // The entry that held the task's previous IP holds this IP.
        let base = match cc[i] {
            _ if i >= plen => last,
            e if e == old_ip => t.ip,
            e => e,
        };
        // The same as that, or one of the task's recent entries (a loop
        // calling a few functions from a few call sites), or a delta.
        let e = if c.bit(&mut f.cc_same, v == base) {
            base
        } else {
            code_cached_or_delta(c, &mut f.cc, &mut t.returns, base, v)
        };
        cc[i] = e;
        last = e;
    }
    if C::DECODE {
        out.callchain.clone_from(cc);
    }
}

fn code_branches<C: Coder>(
    c: &mut C,
    f: &mut FieldModels,
    l: &mut CpuState,
    ip: u64,
    inp: &Sample,
    out: &mut Sample,
) {
    let empty = BranchStack::default();
    let b = inp.branches.as_ref().unwrap_or(&empty);
    let hw_idx = if c.bit(&mut f.br_idx_same, b.hw_idx == l.hw_idx) {
        l.hw_idx
    } else {
        f.br_idx.code(c, b.hw_idx)
    };
    l.hw_idx = hw_idx;
    let n_in = b.entries.len();
    let n = if c.bit(&mut f.br_len_same, n_in == l.stack.len()) {
        l.stack.len()
    } else {
        f.br_len.code(c, n_in as u64) as usize
    };
    if n > MAX_BRANCHES {
        c.fail();
        return;
    }
    let entry = |i: usize| {
        let e = b.entries[i];
        (e.from, e.to, e.flags.to_perf())
    };
    // The stack as the CPU's previous one shifted by `shift` new entries
    // (the LBR is a ring: a sample soon after another sees the same
    // branches one place further down): the smallest shift whose rest
    // is the previous stack's start.
    let prev = &l.stack;
    let shift_in = if C::DECODE {
        0
    } else {
        (0..=n)
            .find(|&s| n - s <= prev.len() && (s..n).all(|i| entry(i) == prev[i - s]))
            .unwrap_or(n)
    };
    let shift = f.br_shift.code(c, shift_in as u64) as usize;
    if shift > n || n - shift > prev.len() {
        c.fail();
        return;
    }
    let mut stack: heapless::Vec<(u64, u64, u64), MAX_BRANCHES> = heapless::Vec::new();
    let mut last = ip;
    for i in 0..shift {
        let e = if C::DECODE { (0, 0, 0) } else { entry(i) };
        // A branch of a loop comes back: one of the CPU's recent ones
        // (its from and to; the flags against that entry's), else deltas.
        let at = if C::DECODE {
            BRANCH_CACHE
        } else {
            l.recent
                .iter()
                .position(|r| (r.0, r.1) == (e.0, e.1))
                .unwrap_or(BRANCH_CACHE)
        };
        let cached = l
            .recent
            .get(f.br_which.code(c, at))
            .map(|&(from, to, _)| (from, to));
        let (from, to, flags) = match cached {
            Some((from, to)) => {
                let known = l
                    .recent
                    .iter()
                    .find(|r| (r.0, r.1) == (from, to))
                    .map_or(0, |r| r.2);
                let flags = if c.bit(&mut f.br_flags_same, e.2 == known) {
                    known
                } else {
                    f.br_flags.code(c, e.2)
                };
                (from, to, flags)
            }
            None => {
                let from = last.wrapping_add(f.br_from.delta(c, e.0.wrapping_sub(last)));
                let to = from.wrapping_add(f.br_to.delta(c, e.1.wrapping_sub(from)));
                (from, to, f.br_flags.code(c, e.2))
            }
        };
        let at = l
            .recent
            .iter()
            .position(|r| (r.0, r.1) == (from, to))
            .unwrap_or(BRANCH_CACHE - 1);
        put_front(&mut l.recent, at, (from, to, flags));
        // Cannot fail: `shift <= n <= MAX_BRANCHES`.
        let _ = stack.push((from, to, flags));
        last = from;
    }
    for e in &l.stack[..n - shift] {
        // Cannot fail: `n <= MAX_BRANCHES`.
        let _ = stack.push(*e);
    }
    if C::DECODE {
        let mut entries = heapless::Vec::new();
        for &(from, to, flags) in &stack {
            // Cannot fail: same capacity.
            let _ = entries.push(BranchEntry {
                from,
                to,
                flags: BranchFlags::from_perf(flags),
            });
        }
        out.branches = Some(BranchStack { hw_idx, entries });
    }
    l.stack = stack;
}

// The loop walks the state's values, caches and change bits, the input's
// values and the alternative set's by one index. The arguments are the
// set's models and state and what the sample says about it.
// Inlined (as are the callchain's and the cached values' coding): the
// drain's hottest code, which keeps its state in registers across them.
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
#[inline(always)]
fn code_regs<C: Coder>(
    c: &mut C,
    m: &mut RegModels,
    st: &mut RegsState,
    alt: Option<&RegsState>,
    ip: u64,
    kernel: usize,
    sampled_ip: bool,
    shape_known: bool,
    inp: Option<&RegsSample>,
) {
    let (abi_in, mask_in) = inp.map_or((Abi::None, 0), |r| (r.abi, r.mask));
    // The ABI and mask as before: known from the task's bit, else one bit.
    if !shape_known && !c.bit(&mut m.shape_same, abi_in == st.abi && mask_in == st.mask) {
        let abi = match c.bypass(abi_in as u64, 2) {
            0 => Abi::None,
            1 => Abi::Bits32,
            2 => Abi::Bits64,
            _ => {
                c.fail();
                Abi::None
            }
        };
        let mask = c.bypass(mask_in, 64);
        if mask & !crate::regs::VALID_MASK_WITH_XMM != 0 {
            c.fail();
        }
        let n = if abi == Abi::None {
            0
        } else {
            mask.count_ones() as usize
        };
        if n > MAX_SAMPLED_REGS {
            c.fail();
            st.n = 0;
            return;
        }
        // A new shape: the values are coded against zeros.
        st.abi = abi;
        st.mask = mask;
        st.n = n;
        st.values[..n].fill(0);
        st.masks = [0; MASK_CACHE];
    }
    let alt = alt.filter(|a| a.mask == st.mask && a.n == st.n);
    // At most `MAX_SAMPLED_REGS` (a new shape is refused above it): said
    // again so the values are read without bounds checks.
    let n = st.n.min(MAX_SAMPLED_REGS);
    let values = inp.map_or(&[][..], |r| &r.values[..]);
    // The whole set the same as the alternative one (the interrupted
    // registers of a sample taken in user mode are its user registers).
    if let Some(a) = alt {
        let same = !C::DECODE && values[..n] == a.values[..n];
        if c.bit(&mut m.all_alt[kernel], same) {
            let mut changed = 0;
            for i in 0..n {
                if st.values[i] != a.values[i] {
                    changed |= 1 << i;
                    remember(st, i, a.values[i]);
                }
            }
            put_front(&mut st.masks, MASK_CACHE - 1, changed);
            return;
        }
    }
    // Where the IP register sits among the values (perf's bit 8). When it
    // holds the sample's IP (the interrupted set, or the user set of a
    // sample taken in user mode), that is its expected value: it counts
    // as changed only when it is not.
    let ip_at = (st.mask >> 8 & 1 != 0)
        .then(|| (st.mask & 0xff).count_ones() as usize)
        .filter(|&j| j < n);
    if sampled_ip && let Some(j) = ip_at {
        st.values[j] = ip;
    }
    // Which values changed: one of the set's recent change masks (one
    // symbol), else register by register against the previous mask.
    let mask_in = if C::DECODE {
        0
    } else {
        let vals = &values[..n.min(values.len())];
        let prev = &st.values[..vals.len()];
        // The general-purpose set (perf's 20 registers, the usual one):
        // with no loop, each register a compare and a branch taken when
        // it changed, to one more instruction (most do not change: three
        // instructions a register, where a flag turned into its bit costs
        // five or six).
        if let (Ok(v), Ok(p)) = (
            <&[u64; GPRS]>::try_from(vals),
            <&[u64; GPRS]>::try_from(prev),
        ) {
            let mut mask = 0u64;
            for i in 0..GPRS {
                if v[i] != p[i] {
                    core::hint::cold_path();
                    mask |= 1 << i;
                }
            }
            mask
        } else {
            // Four registers at a time, each a compare and a shift.
            let mut mask = 0u64;
            let mut i = 0;
            while i + 4 <= vals.len() {
                let (v, p) = (&vals[i..i + 4], &prev[i..i + 4]);
                mask |= (u64::from(v[0] != p[0])
                    | u64::from(v[1] != p[1]) << 1
                    | u64::from(v[2] != p[2]) << 2
                    | u64::from(v[3] != p[3]) << 3)
                    << i;
                i += 4;
            }
            while i < vals.len() {
                mask |= u64::from(vals[i] != prev[i]) << i;
                i += 1;
            }
            mask
        }
    };
    let at = if C::DECODE {
        0
    } else {
        st.masks
            .iter()
            .position(|e| *e == mask_in)
            .unwrap_or(MASK_CACHE)
    };
    let at = m.mask_which.code(c, at);
    let changed = match st.masks.get(at) {
        Some(&mask) => {
            put_front(&mut st.masks, at, mask);
            mask
        }
        None => {
            // A mask the set has not had lately: its `n` bits, raw. Coded
            // bit by bit against the register's previous change, a miss
            // cost the coder more than all the cached ones together, and
            // saved a few bits only at the few samples that miss.
            let mask = match n {
                0 => 0,
                n => c.bypass(mask_in, n as u32),
            };
            put_front(&mut st.masks, MASK_CACHE - 1, mask);
            mask
        }
    };
    // The registers with a test of their own before the set's value
    // model: all of them against the alternative set, the IP register
    // against the sample's IP.
    let tested = if alt.is_some() { u64::MAX } else { 0 }
        | match ip_at {
            Some(j) if !sampled_ip => 1 << j,
            _ => 0,
        };
    let mut rest = changed;
    if changed >> n != 0 {
        // Only from a damaged stream: a cached mask of another shape.
        c.fail();
        rest &= (1 << n) - 1;
    }
    // The tested registers first, then the others: a loop of their own
    // that keeps nothing but the value model's state live.
    let mut first = rest & tested;
    rest &= !tested;
    while first != 0 {
        let i = first.trailing_zeros() as usize;
        first &= first - 1;
        let v = if C::DECODE { 0 } else { values[i] };
        let new = if ip_at == Some(i) && !sampled_ip && c.bit(&mut m.ip_eq[kernel], v == ip) {
            ip
        } else if let Some(a) = alt
            && c.bit(&mut m.alt[kernel], v == a.values[i])
        {
            a.values[i]
        } else {
            code_value(c, &mut m.value, st, i, v);
            continue;
        };
        remember(st, i, new);
    }
    while rest != 0 {
        let i = rest.trailing_zeros() as usize;
        rest &= rest - 1;
        code_value(
            c,
            &mut m.value,
            st,
            i,
            if C::DECODE { 0 } else { values[i] },
        );
    }
}

/// Codes changed value `i` of `st` (`v` when encoding) through the set's
/// value model: a value a register of the set had (a loop's pointer or
/// counter back at an earlier value, a copy, a return value, RCX and R11
/// after a system call), or a delta: one symbol says which.
#[inline(always)]
fn code_value<C: Coder>(
    c: &mut C,
    model: &mut RegValueModel,
    st: &mut RegsState,
    i: usize,
    v: u64,
) {
    let prev = st.values[i % 64];
    let delta_in = zigzag(v.wrapping_sub(prev));
    let sym_in = if C::DECODE {
        0
    } else {
        let h = slot(v);
        if st.table[h] == v {
            REG_SLOT + h
        } else {
            REG_DELTA + uint_symbol(delta_in)
        }
    };
    match model.code(c, sym_in) {
        s if s >= REG_DELTA => remember(st, i, delta_value(c, s - REG_DELTA, prev, delta_in, v)),
        // Already in its slot.
        s => st.values[i % 64] = st.table[(s - REG_SLOT) % REG_TABLE],
    }
}

/// Sets value `i` of `st` to `new`, which goes into its slot of the set's
/// recent values.
#[inline(always)]
fn remember(st: &mut RegsState, i: usize, new: u64) {
    st.values[i % 64] = new;
    st.table[slot(new)] = new;
}

fn regs_sample(st: &RegsState) -> RegsSample {
    let mut values = heapless::Vec::new();
    // Cannot fail: `n <= MAX_SAMPLED_REGS`.
    let _ = values.extend_from_slice(&st.values[..st.n]);
    RegsSample {
        abi: st.abi,
        mask: st.mask,
        values,
    }
}
