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
//! [`TASK_SLOTS`] at once), the previous sample's values; per field and per
//! register, adaptive bit probabilities. A value is coded as "same as
//! before" (one adaptive bit) or as a zigzag delta whose bit length is an
//! adaptive 7-bit tree and whose two leading bits are adaptive too (the
//! rest go as raw bits). Callchains keep the part they share with the
//! task's previous chain (its outer frames) and code only the rest.

use crate::regs::{Abi, MAX_SAMPLED_REGS, RegsSample};
use crate::sample::{
    BranchEntry, BranchFlags, BranchStack, CpuMode, MAX_CALLCHAIN, MemInfo, Sample,
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
// The range coder: LZMA's binary adaptive coder (11-bit probabilities,
// 32-bit range, carry through a cached byte), with raw bits sent up to 16
// at a time.

const PROB_BITS: u32 = 11;
const PROB_INIT: u16 = 1 << (PROB_BITS - 1);
const ADAPT: u32 = 4;
const TOP: u32 = 1 << 24;

/// What the models code through: the encoder takes each value and returns
/// it, the decoder ignores the argument and returns what it read. One
/// model code serves both, so they cannot disagree.
pub(crate) trait Coder {
    /// True for the decoder.
    const DECODE: bool;
    /// Codes one bit with adaptive probability `p` (of a zero).
    fn bit(&mut self, p: &mut u16, b: bool) -> bool;
    /// Codes the low `bits` (at most 16) bits of `v` with no model.
    fn raw16(&mut self, v: u32, bits: u32) -> u32;
    /// Marks the stream as malformed (decoder only).
    fn fail(&mut self);
}

/// The encoder's side of the range coder, writing into a fixed buffer.
pub(crate) struct RcEncoder {
    low: u64,
    range: u32,
    cache: u8,
    cache_size: u32,
    /// Whether the first byte (always 0) is still to be dropped.
    first: bool,
    pub(crate) out: [u8; FRAME_CODED_MAX + 16],
    pub(crate) len: usize,
    /// Set when `out` overflowed (the frame is then unusable).
    pub(crate) overflow: bool,
}

impl RcEncoder {
    pub(crate) const fn new() -> Self {
        RcEncoder {
            low: 0,
            range: u32::MAX,
            cache: 0,
            cache_size: 1,
            first: true,
            out: [0; FRAME_CODED_MAX + 16],
            len: 0,
            overflow: false,
        }
    }

    /// Starts a new frame.
    pub(crate) fn restart(&mut self) {
        self.low = 0;
        self.range = u32::MAX;
        self.cache = 0;
        self.cache_size = 1;
        self.first = true;
        self.len = 0;
        self.overflow = false;
    }

    fn put(&mut self, b: u8) {
        if self.first {
            // The coder's first byte is always 0; the decoder supplies it.
            self.first = false;
            return;
        }
        match self.out.get_mut(self.len) {
            Some(slot) => {
                *slot = b;
                self.len += 1;
            }
            None => self.overflow = true,
        }
    }

    fn shift_low(&mut self) {
        if (self.low as u32) < 0xff00_0000 || (self.low >> 32) != 0 {
            let carry = (self.low >> 32) as u8;
            let mut temp = self.cache;
            loop {
                self.put(temp.wrapping_add(carry));
                temp = 0xff;
                self.cache_size -= 1;
                if self.cache_size == 0 {
                    break;
                }
            }
            self.cache = (self.low >> 24) as u8;
        }
        self.cache_size += 1;
        self.low = (self.low & 0x00ff_ffff) << 8;
    }

    #[inline(always)]
    fn normalize(&mut self) {
        while self.range < TOP {
            self.range <<= 8;
            self.shift_low();
        }
    }

    /// Ends the frame: the bytes so far decode every bit coded.
    pub(crate) fn finish(&mut self) {
        for _ in 0..5 {
            self.shift_low();
        }
    }

    /// Coded bytes so far, counting the ones still held back.
    pub(crate) fn size(&self) -> usize {
        self.len + self.cache_size as usize + 4
    }
}

impl Coder for RcEncoder {
    const DECODE: bool = false;

    #[inline(always)]
    fn bit(&mut self, p: &mut u16, b: bool) -> bool {
        let bound = (self.range >> PROB_BITS) * u32::from(*p);
        if b {
            self.low += u64::from(bound);
            self.range -= bound;
            *p -= *p >> ADAPT;
        } else {
            self.range = bound;
            *p += ((1 << PROB_BITS) - *p) >> ADAPT;
        }
        self.normalize();
        b
    }

    #[inline(always)]
    fn raw16(&mut self, v: u32, bits: u32) -> u32 {
        let v = v & ((1 << bits) - 1);
        self.range >>= bits;
        self.low += u64::from(self.range) * u64::from(v);
        self.normalize();
        v
    }

    fn fail(&mut self) {}
}

/// The decoder's side of the range coder, reading one frame's bytes.
pub(crate) struct RcDecoder<'a> {
    code: u32,
    range: u32,
    data: &'a [u8],
    pos: usize,
    pub(crate) failed: bool,
}

impl<'a> RcDecoder<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        let mut d = RcDecoder {
            code: 0,
            range: u32::MAX,
            data,
            pos: 0,
            failed: false,
        };
        for _ in 0..4 {
            d.code = (d.code << 8) | u32::from(d.next());
        }
        d
    }

    #[inline(always)]
    fn next(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    #[inline(always)]
    fn normalize(&mut self) {
        while self.range < TOP {
            self.range <<= 8;
            self.code = (self.code << 8) | u32::from(self.next());
        }
    }

    /// Whether the frame decoded cleanly: nothing malformed, and no more
    /// bytes read than the encoder's flush leaves.
    pub(crate) fn clean(&self) -> bool {
        !self.failed && self.pos <= self.data.len() + 1
    }
}

impl Coder for RcDecoder<'_> {
    const DECODE: bool = true;

    #[inline(always)]
    fn bit(&mut self, p: &mut u16, _: bool) -> bool {
        let bound = (self.range >> PROB_BITS) * u32::from(*p);
        let b = if self.code < bound {
            self.range = bound;
            *p += ((1 << PROB_BITS) - *p) >> ADAPT;
            false
        } else {
            self.code -= bound;
            self.range -= bound;
            *p -= *p >> ADAPT;
            true
        };
        self.normalize();
        b
    }

    #[inline(always)]
    fn raw16(&mut self, _: u32, bits: u32) -> u32 {
        self.range >>= bits;
        let v = self.code / self.range;
        if v >> bits != 0 {
            self.failed = true;
            return 0;
        }
        self.code -= v * self.range;
        self.normalize();
        v
    }

    fn fail(&mut self) {
        self.failed = true;
    }
}

/// Codes the low `bits` (at most 64) bits of `v` with no model.
#[inline]
fn raw<C: Coder>(c: &mut C, v: u64, bits: u32) -> u64 {
    let mut out = 0u64;
    let mut left = bits;
    while left > 0 {
        let k = left.min(16);
        left -= k;
        let chunk = c.raw16((v >> left) as u32 & ((1 << k) - 1), k);
        out = (out << k) | u64::from(chunk);
    }
    out
}

// ---------------------------------------------------------------------
// Models.

/// An adaptive model of unsigned integers: the bit length as a 7-bit tree,
/// then the two bits after the leading one under that length's context,
/// then raw bits.
#[derive(Clone, Copy)]
struct UintModel {
    len: [u16; 128],
    hi: [[u16; 4]; 65],
}

impl UintModel {
    const NEW: UintModel = UintModel {
        len: [PROB_INIT; 128],
        hi: [[PROB_INIT; 4]; 65],
    };

    fn reset(&mut self) {
        self.len.fill(PROB_INIT);
        for h in &mut self.hi {
            h.fill(PROB_INIT);
        }
    }

    #[inline]
    fn code<C: Coder>(&mut self, c: &mut C, v: u64) -> u64 {
        let n = 64 - v.leading_zeros();
        let n = tree::<C, 7>(c, &mut self.len, n);
        if n > 64 {
            c.fail();
            return 0;
        }
        if n <= 1 {
            return u64::from(n);
        }
        let rest = n - 1;
        let modelled = rest.min(2);
        let mut out = 1u64;
        let mut t = 1usize;
        for i in 0..modelled {
            let b = c.bit(&mut self.hi[n as usize][t], (v >> (rest - 1 - i)) & 1 != 0);
            t = t * 2 + usize::from(b);
            out = (out << 1) | u64::from(b);
        }
        let low = rest - modelled;
        if low > 0 {
            out = (out << low) | raw(c, v, low);
        }
        out
    }

    /// Codes a wrapping difference (zigzag).
    #[inline]
    fn delta<C: Coder>(&mut self, c: &mut C, d: u64) -> u64 {
        unzigzag(self.code(c, zigzag(d)))
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

/// Registers with a model of their own (by position in the sample); the
/// rest share the last one.
const REG_MODELS: usize = 25;

/// The models of one register set (user or interrupt).
#[derive(Clone, Copy)]
struct RegModels {
    shape_same: u16,
    same: [u16; REG_MODELS],
    value: [UintModel; REG_MODELS],
}

impl RegModels {
    const NEW: RegModels = RegModels {
        shape_same: PROB_INIT,
        same: [PROB_INIT; REG_MODELS],
        value: [UintModel::NEW; REG_MODELS],
    };

    fn reset(&mut self) {
        self.shape_same = PROB_INIT;
        self.same.fill(PROB_INIT);
        for v in &mut self.value {
            v.reset();
        }
    }
}

/// Every field's adaptive probabilities.
#[derive(Clone)]
struct FieldModels {
    tid_same: u16,
    tid: UintModel,
    shape_same: u16,
    shape: [u16; 128],
    event_same: u16,
    event: UintModel,
    pid: UintModel,
    cpu_same: u16,
    cpu: UintModel,
    time: UintModel,
    period_same: u16,
    period: UintModel,
    ip: UintModel,
    cc_len: UintModel,
    cc_keep: UintModel,
    cc: UintModel,
    br_idx: UintModel,
    br_len: UintModel,
    br_from: UintModel,
    br_to: UintModel,
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
        tid_same: PROB_INIT,
        tid: UintModel::NEW,
        shape_same: PROB_INIT,
        shape: [PROB_INIT; 128],
        event_same: PROB_INIT,
        event: UintModel::NEW,
        pid: UintModel::NEW,
        cpu_same: PROB_INIT,
        cpu: UintModel::NEW,
        time: UintModel::NEW,
        period_same: PROB_INIT,
        period: UintModel::NEW,
        ip: UintModel::NEW,
        cc_len: UintModel::NEW,
        cc_keep: UintModel::NEW,
        cc: UintModel::NEW,
        br_idx: UintModel::NEW,
        br_len: UintModel::NEW,
        br_from: UintModel::NEW,
        br_to: UintModel::NEW,
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
            &mut self.tid_same,
            &mut self.shape_same,
            &mut self.event_same,
            &mut self.cpu_same,
            &mut self.period_same,
            &mut self.mem_src_same,
        ] {
            *p = PROB_INIT;
        }
        self.shape.fill(PROB_INIT);
        for m in [
            &mut self.tid,
            &mut self.event,
            &mut self.pid,
            &mut self.cpu,
            &mut self.time,
            &mut self.period,
            &mut self.ip,
            &mut self.cc_len,
            &mut self.cc_keep,
            &mut self.cc,
            &mut self.br_idx,
            &mut self.br_len,
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
    values: [u64; MAX_SAMPLED_REGS],
}

impl RegsState {
    const NEW: RegsState = RegsState {
        abi: Abi::None,
        mask: 0,
        n: 0,
        values: [0; MAX_SAMPLED_REGS],
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
    time: u64,
    step: u64,
    period: u64,
    ip: u64,
    callchain: heapless::Vec<u64, MAX_CALLCHAIN>,
    regs: [RegsState; 2],
    mem: MemInfo,
}

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
        time: 0,
        step: 0,
        period: 0,
        ip: 0,
        callchain: heapless::Vec::new(),
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
        self.time = 0;
        self.step = 0;
        self.period = 0;
        self.ip = 0;
        self.callchain.clear();
        for r in &mut self.regs {
            r.abi = Abi::None;
            r.mask = 0;
            r.n = 0;
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
    let mut f = 0;
    if s.cpumode == CpuMode::Kernel {
        f |= shape::KERNEL;
    }
    if s.pid != s.tid {
        f |= shape::PID;
    }
    if !s.callchain.is_empty() {
        f |= shape::CALLCHAIN;
    }
    if s.branches.is_some() {
        f |= shape::BRANCHES;
    }
    if s.regs_user.is_some() {
        f |= shape::UREGS;
    }
    if s.regs_intr.is_some() {
        f |= shape::IREGS;
    }
    if s.mem.is_some() {
        f |= shape::MEM;
    }
    f
}

/// The state both sides of a group keep: the models and the tasks.
#[derive(Clone)]
pub(crate) struct GroupModels {
    fields: FieldModels,
    tasks: [TaskState; TASK_SLOTS],
    last_tid: u32,
}

impl GroupModels {
    pub(crate) const NEW: GroupModels = GroupModels {
        fields: FieldModels::NEW,
        tasks: [TaskState::NEW; TASK_SLOTS],
        last_tid: 0,
    };

    /// Back to the state at a group's start.
    pub(crate) fn reset(&mut self) {
        self.fields.reset();
        for t in &mut self.tasks {
            t.valid = false;
        }
        self.last_tid = 0;
    }
}

/// An upper bound of the coded bytes of `s` whatever the models hold: a
/// bit costs at most about 7.1 bits at the coder's least probability, and
/// each value takes at most 10 modelled bits and 63 raw ones.
pub(crate) fn bound(s: &Sample) -> usize {
    const VALUE: usize = 17;
    let regs = |r: &Option<RegsSample>| r.as_ref().map_or(0, |r| 10 + r.values.len() * VALUE);
    let branches = s.branches.as_ref().map_or(0, |b| 2 + b.entries.len() * 3) * VALUE;
    32 + 12 * VALUE
        + (s.callchain.len() + 2) * VALUE
        + branches
        + regs(&s.regs_user)
        + regs(&s.regs_intr)
}

/// Codes one sample: `inp` when encoding, into `out` when decoding (the
/// other is not touched).
pub(crate) fn code_sample<C: Coder>(
    c: &mut C,
    m: &mut GroupModels,
    inp: &Sample,
    out: &mut Sample,
) {
    let f = &mut m.fields;
    // The task.
    let tid = if c.bit(&mut f.tid_same, inp.tid == m.last_tid) {
        m.last_tid
    } else {
        let v = f.tid.code(c, u64::from(inp.tid));
        if v > u64::from(u32::MAX) {
            c.fail();
        }
        v as u32
    };
    m.last_tid = tid;
    let t = &mut m.tasks[tid as usize % TASK_SLOTS];
    if !t.valid || t.tid != tid {
        t.claim(tid);
    }

    // Which parts it has.
    let shape_in = shape_of(inp);
    let shape = if c.bit(&mut f.shape_same, shape_in == t.shape) {
        t.shape
    } else {
        tree::<C, 7>(c, &mut f.shape, shape_in)
    };
    if shape == NO_SHAPE {
        c.fail();
    }
    t.shape = shape;

    let event = if c.bit(&mut f.event_same, inp.event == t.event) {
        t.event
    } else {
        f.event.code(c, u64::from(inp.event)) as u32
    };
    t.event = event;
    let pid = if shape & shape::PID != 0 {
        let v = f.pid.code(c, u64::from(inp.pid)) as u32;
        if v == tid {
            c.fail();
        }
        v
    } else {
        tid
    };
    t.pid = pid;
    let cpu = if c.bit(&mut f.cpu_same, inp.cpu == t.cpu) {
        t.cpu
    } else {
        f.cpu.code(c, u64::from(inp.cpu)) as u32
    };
    t.cpu = cpu;

    // Time: against the task's previous time plus its previous step.
    let predicted = t.time.wrapping_add(t.step);
    let time = predicted.wrapping_add(f.time.delta(c, inp.time.wrapping_sub(predicted)));
    t.step = time.wrapping_sub(t.time);
    t.time = time;
    let period = if c.bit(&mut f.period_same, inp.period == t.period) {
        t.period
    } else {
        t.period
            .wrapping_add(f.period.delta(c, inp.period.wrapping_sub(t.period)))
    };
    t.period = period;
    let ip = t.ip.wrapping_add(f.ip.delta(c, inp.ip.wrapping_sub(t.ip)));
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
        code_callchain(c, f, t, inp, out);
    } else {
        t.callchain.clear();
    }

    if C::DECODE {
        out.branches = None;
    }
    if shape & shape::BRANCHES != 0 {
        code_branches(c, f, ip, inp, out);
    }

    for (i, (bit, inp_r)) in [
        (shape::UREGS, &inp.regs_user),
        (shape::IREGS, &inp.regs_intr),
    ]
    .into_iter()
    .enumerate()
    {
        let present = shape & bit != 0;
        if present {
            code_regs(c, &mut f.regs[i], &mut t.regs[i], inp_r.as_ref());
        }
        if C::DECODE {
            let o = if i == 0 {
                &mut out.regs_user
            } else {
                &mut out.regs_intr
            };
            *o = present.then(|| regs_sample(&t.regs[i]));
        }
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

fn code_callchain<C: Coder>(
    c: &mut C,
    f: &mut FieldModels,
    t: &mut TaskState,
    inp: &Sample,
    out: &mut Sample,
) {
    let len_in = inp.callchain.len();
    let len = (f.cc_len.code(c, (len_in as u64).wrapping_sub(1)) as usize).wrapping_add(1);
    if len > MAX_CALLCHAIN {
        c.fail();
        t.callchain.clear();
        return;
    }
    // Entries shared at the outer end.
    let prev = &t.callchain;
    let shared_in = if C::DECODE {
        0
    } else {
        inp.callchain
            .iter()
            .rev()
            .zip(prev.iter().rev())
            .take_while(|(a, b)| a == b)
            .count()
    };
    let keep = f.cc_keep.code(c, shared_in as u64) as usize;
    if keep > len || keep > prev.len() {
        c.fail();
        t.callchain.clear();
        return;
    }
    let mut chain: heapless::Vec<u64, MAX_CALLCHAIN> = heapless::Vec::new();
    let mut last = t.ip;
    for i in 0..len - keep {
        let v = if C::DECODE { 0 } else { inp.callchain[i] };
        // Against the previous chain's entry at the same depth (its
        // context marker, the same function), else the entry before.
        let base = prev.get(i).copied().unwrap_or(last);
        let e = base.wrapping_add(f.cc.delta(c, v.wrapping_sub(base)));
        // Cannot fail: `len <= MAX_CALLCHAIN`.
        let _ = chain.push(e);
        last = e;
    }
    for e in &prev[prev.len() - keep..] {
        // Cannot fail: `len <= MAX_CALLCHAIN`.
        let _ = chain.push(*e);
    }
    if C::DECODE {
        out.callchain.clone_from(&chain);
    }
    t.callchain = chain;
}

fn code_branches<C: Coder>(
    c: &mut C,
    f: &mut FieldModels,
    ip: u64,
    inp: &Sample,
    out: &mut Sample,
) {
    let empty = BranchStack::default();
    let b = inp.branches.as_ref().unwrap_or(&empty);
    let hw_idx = f.br_idx.code(c, b.hw_idx);
    let n = f.br_len.code(c, b.entries.len() as u64) as usize;
    if n > crate::sample::MAX_BRANCHES {
        c.fail();
        return;
    }
    let mut stack = BranchStack {
        hw_idx,
        entries: heapless::Vec::new(),
    };
    let mut prev = ip;
    for i in 0..n {
        let e = if C::DECODE {
            BranchEntry::default()
        } else {
            b.entries[i]
        };
        let from = prev.wrapping_add(f.br_from.delta(c, e.from.wrapping_sub(prev)));
        let to = from.wrapping_add(f.br_to.delta(c, e.to.wrapping_sub(from)));
        let flags = f.br_flags.code(c, e.flags.to_perf());
        if C::DECODE {
            // Cannot fail: `n <= MAX_BRANCHES`.
            let _ = stack.entries.push(BranchEntry {
                from,
                to,
                flags: BranchFlags::from_perf(flags),
            });
        }
        prev = from;
    }
    if C::DECODE {
        out.branches = Some(stack);
    }
}

fn code_regs<C: Coder>(c: &mut C, m: &mut RegModels, st: &mut RegsState, inp: Option<&RegsSample>) {
    let (abi_in, mask_in) = inp.map_or((Abi::None, 0), |r| (r.abi, r.mask));
    if !c.bit(&mut m.shape_same, abi_in == st.abi && mask_in == st.mask) {
        let abi = match raw(c, abi_in as u64, 2) {
            0 => Abi::None,
            1 => Abi::Bits32,
            2 => Abi::Bits64,
            _ => {
                c.fail();
                Abi::None
            }
        };
        let mask = raw(c, mask_in, 64);
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
    }
    let values = inp.map_or(&[][..], |r| &r.values[..]);
    for (i, slot) in st.values[..st.n].iter_mut().enumerate() {
        let k = i.min(REG_MODELS - 1);
        let prev = *slot;
        let v = if C::DECODE { 0 } else { values[i] };
        if !c.bit(&mut m.same[k], v == prev) {
            *slot = prev.wrapping_add(m.value[k].delta(c, v.wrapping_sub(prev)));
        }
    }
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
