//! The compact sample encoding: a flag word selects which fields follow, and
//! values are either absolute (keyframes) or zigzag varint deltas against
//! the previous sample of the same task ([`TaskRef`]).

use core::fmt;

use serde::de::{self, SeqAccess, Visitor};
use serde::ser::SerializeTuple;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::regs::{Abi, MAX_SAMPLED_REGS, RegsSample};
use crate::sample::{
    BranchEntry, BranchFlags, BranchStack, CpuMode, MAX_BRANCHES, MAX_CALLCHAIN, MemInfo, Sample,
};

/// Flag bits of a wire sample. The seven most common fit the first varint
/// byte.
pub(crate) mod flag {
    pub const UREGS: u32 = 1 << 0;
    pub const UREGS_DELTA: u32 = 1 << 1;
    pub const UREGS_SPARSE: u32 = 1 << 2;
    pub const KEY: u32 = 1 << 3;
    pub const CPU: u32 = 1 << 4;
    pub const KERNEL: u32 = 1 << 5;
    pub const CALLCHAIN: u32 = 1 << 6;
    pub const UREGS_SHAPE: u32 = 1 << 7;
    pub const PID: u32 = 1 << 8;
    pub const BRANCHES: u32 = 1 << 9;
    pub const IREGS: u32 = 1 << 10;
    pub const IREGS_SHAPE: u32 = 1 << 11;
    pub const IREGS_DELTA: u32 = 1 << 12;
    pub const IREGS_SPARSE: u32 = 1 << 13;
    pub const MEM: u32 = 1 << 14;
    pub const ALL: u32 = (1 << 15) - 1;
}

/// Per-task reference state: the previous delivered sample of the task, as
/// both encoder and decoder see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskRef {
    /// The task.
    pub tid: u32,
    /// The state's chain value ([`chain_input`]): bound to every sample
    /// frame since the task's keyframe, in order. A delta frame's check is
    /// XORed with the chain of the state it was encoded against.
    pub chain: u32,
    /// Samples since the last keyframe.
    pub since_key: u32,
    pub(crate) time: u64,
    pub(crate) ip: u64,
    pub(crate) period: u64,
    pub(crate) cpu: u32,
    pub(crate) regs_user: Option<RegsSample>,
    pub(crate) regs_intr: Option<RegsSample>,
}

/// What a task's chain value is computed from (as CRC-32C of these 12
/// bytes) after a sample frame: the chain of the state the frame was
/// encoded against (0 for a keyframe), the frame's plain CRC, and its
/// count since the keyframe (0 for a keyframe). So the chain names the
/// whole run of frames since the keyframe, not just the last payload:
/// byte-identical delta payloads (periodic code) leave different chains,
/// and after a lost frame no later frame of the run matches the stale
/// state (protocol version 3; version 2 chained the previous payload's
/// plain CRC, which periodic code repeats).
pub(crate) fn chain_input(prev: u32, plain: u32, since_key: u32) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[..4].copy_from_slice(&prev.to_le_bytes());
    b[4..8].copy_from_slice(&plain.to_le_bytes());
    b[8..].copy_from_slice(&since_key.to_le_bytes());
    b
}

impl TaskRef {
    /// Whether a delta frame with stored CRC `stored` and plain CRC `plain`
    /// was encoded against this state (its CRC is chained to this state's;
    /// a keyframe's stored CRC is its plain one).
    pub(crate) fn chained(&self, stored: u32, plain: u32) -> bool {
        self.chain ^ plain == stored && stored != plain
    }

    /// The state after `s` was sent, with chain value `chain`.
    pub(crate) fn after(s: &Sample, chain: u32, since_key: u32) -> Self {
        TaskRef {
            tid: s.tid,
            chain,
            since_key,
            time: s.time,
            ip: s.ip,
            period: s.period,
            cpu: s.cpu,
            regs_user: s.regs_user.clone(),
            regs_intr: s.regs_intr.clone(),
        }
    }

    /// Becomes the state after `s`, like [`after`](Self::after) but
    /// reusing this entry's storage.
    pub(crate) fn update(&mut self, s: &Sample, chain: u32, since_key: u32) {
        self.tid = s.tid;
        self.chain = chain;
        self.since_key = since_key;
        self.time = s.time;
        self.ip = s.ip;
        self.period = s.period;
        self.cpu = s.cpu;
        copy_regs(&mut self.regs_user, s.regs_user.as_ref());
        copy_regs(&mut self.regs_intr, s.regs_intr.as_ref());
    }
}

/// `*dst = src.cloned()`, copying only the values in use when both are
/// present (a derived `clone_from` builds and moves a whole `RegsSample`).
fn copy_regs(dst: &mut Option<RegsSample>, src: Option<&RegsSample>) {
    match (dst.as_mut(), src) {
        (Some(d), Some(s)) => {
            d.abi = s.abi;
            d.mask = s.mask;
            d.values.clear();
            // Cannot fail: both have the same capacity.
            let _ = d.values.extend_from_slice(&s.values);
        }
        (_, s) => *dst = s.cloned(),
    }
}

/// How a register set is sent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct WireRegs {
    /// ABI and mask, when [`flag::UREGS_SHAPE`] / [`flag::IREGS_SHAPE`] is set.
    pub abi: u8,
    pub mask: u64,
    /// Sparse mode: which values changed.
    pub changed: u64,
    /// Absolute values, dense deltas, or the changed deltas (sparse).
    pub values: heapless::Vec<u64, MAX_SAMPLED_REGS>,
}

impl WireRegs {
    /// Back to the default (empty) state, keeping the storage.
    fn clear(&mut self) {
        self.abi = 0;
        self.mask = 0;
        self.changed = 0;
        self.values.clear();
    }
}

/// A sample as it travels: flags plus the fields they select. Values are
/// absolute in keyframes and wrapping deltas otherwise.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WireSample {
    pub(crate) flags: u32,
    pub(crate) event: u32,
    pub(crate) tid: u32,
    pub(crate) pid: u32,
    pub(crate) time: u64,
    pub(crate) ip: u64,
    pub(crate) period: u64,
    pub(crate) cpu: u32,
    pub(crate) callchain: heapless::Vec<u64, MAX_CALLCHAIN>,
    pub(crate) hw_idx: u64,
    pub(crate) branches: heapless::Vec<(u64, u64, u64), MAX_BRANCHES>,
    pub(crate) uregs: WireRegs,
    pub(crate) iregs: WireRegs,
    pub(crate) mem: MemInfo,
}

impl WireSample {
    /// True for a keyframe (no reference needed).
    pub fn is_key(&self) -> bool {
        self.flags & flag::KEY != 0
    }

    /// The task the sample belongs to.
    pub fn tid(&self) -> u32 {
        self.tid
    }

    /// True when the flags say the user registers are dense deltas: a
    /// register block without shape that is not sparse.
    #[inline(always)]
    pub(crate) fn dense_uregs(&self) -> bool {
        self.flags & (flag::UREGS | flag::UREGS_DELTA | flag::UREGS_SPARSE | flag::UREGS_SHAPE)
            == flag::UREGS | flag::UREGS_DELTA
    }
}

/// Bytes of the LEB128 varint of `v`.
pub(crate) const fn varint_len(v: u64) -> usize {
    let bits = 64 - v.leading_zeros() as usize;
    if bits == 0 { 1 } else { bits.div_ceil(7) }
}

/// Postcard's zigzag mapping of a wrapping delta.
pub(crate) const fn zigzag(d: u64) -> u64 {
    let d = d as i64;
    ((d << 1) ^ (d >> 63)) as u64
}

/// Chooses the cheapest encoding of `cur` against `reference` and returns
/// (wire regs, delta flag, sparse flag, shape flag).
fn encode_regs(
    cur: &RegsSample,
    reference: Option<&RegsSample>,
    key: bool,
) -> (WireRegs, bool, bool, bool) {
    let same_shape = !key && reference.is_some_and(|r| r.abi == cur.abi && r.mask == cur.mask);
    let mut out = WireRegs {
        abi: cur.abi as u8,
        mask: cur.mask,
        ..Default::default()
    };
    if cur.abi == Abi::None {
        return (out, false, false, !same_shape);
    }
    let absolute: usize = cur.values.iter().map(|v| varint_len(*v)).sum();
    let Some(r) = reference.filter(|_| same_shape) else {
        out.values = cur.values.clone();
        return (out, false, false, true);
    };
    let mut dense = 0;
    let mut changed = 0u64;
    let mut sparse_values = 0;
    for (i, (c, p)) in cur.values.iter().zip(r.values.iter()).enumerate() {
        let z = zigzag(c.wrapping_sub(*p));
        dense += varint_len(z);
        if z != 0 {
            changed |= 1 << i;
            sparse_values += varint_len(z);
        }
    }
    let sparse = varint_len(changed) + sparse_values;
    if absolute < dense && absolute < sparse {
        out.values = cur.values.clone();
        (out, false, false, false)
    } else if sparse < dense {
        out.changed = changed;
        for (c, p) in cur.values.iter().zip(r.values.iter()) {
            if c != p {
                // Cannot fail: at most as many values as `cur` has.
                let _ = out.values.push(c.wrapping_sub(*p));
            }
        }
        (out, false, true, false)
    } else {
        for (c, p) in cur.values.iter().zip(r.values.iter()) {
            // Cannot fail: at most as many values as `cur` has.
            let _ = out.values.push(c.wrapping_sub(*p));
        }
        (out, true, false, false)
    }
}

/// Encodes `s` against `reference` (a keyframe when `reference` is `None`).
pub(crate) fn encode_sample(s: &Sample, reference: Option<&TaskRef>) -> WireSample {
    let key = reference.is_none();
    let mut w = WireSample {
        event: s.event,
        tid: s.tid,
        pid: s.pid,
        cpu: s.cpu,
        mem: s.mem.unwrap_or_default(),
        hw_idx: 0,
        ..Default::default()
    };
    let mut f = 0;
    if let Some(r) = reference {
        w.time = s.time.wrapping_sub(r.time);
        w.ip = s.ip.wrapping_sub(r.ip);
        w.period = s.period.wrapping_sub(r.period);
        if s.cpu != r.cpu {
            f |= flag::CPU;
        }
    } else {
        f |= flag::KEY | flag::CPU;
        w.time = s.time;
        w.ip = s.ip;
        w.period = s.period;
    }
    if s.pid != s.tid {
        f |= flag::PID;
    }
    if s.cpumode == CpuMode::Kernel {
        f |= flag::KERNEL;
    }
    if !s.callchain.is_empty() {
        f |= flag::CALLCHAIN;
        let mut prev = s.ip;
        for e in &s.callchain {
            // Cannot fail: same capacity.
            let _ = w.callchain.push(e.wrapping_sub(prev));
            prev = *e;
        }
    }
    if let Some(b) = &s.branches {
        f |= flag::BRANCHES;
        w.hw_idx = b.hw_idx;
        let mut prev = s.ip;
        for e in &b.entries {
            // Cannot fail: same capacity.
            let _ = w.branches.push((
                e.from.wrapping_sub(prev),
                e.to.wrapping_sub(e.from),
                e.flags.to_perf(),
            ));
            prev = e.from;
        }
    }
    if let Some(u) = &s.regs_user {
        f |= flag::UREGS;
        let (regs, delta, sparse, shape) =
            encode_regs(u, reference.and_then(|r| r.regs_user.as_ref()), key);
        w.uregs = regs;
        f |= if delta { flag::UREGS_DELTA } else { 0 }
            | if sparse { flag::UREGS_SPARSE } else { 0 }
            | if shape { flag::UREGS_SHAPE } else { 0 };
    }
    if let Some(i) = &s.regs_intr {
        f |= flag::IREGS;
        let (regs, delta, sparse, shape) =
            encode_regs(i, reference.and_then(|r| r.regs_intr.as_ref()), key);
        w.iregs = regs;
        f |= if delta { flag::IREGS_DELTA } else { 0 }
            | if sparse { flag::IREGS_SPARSE } else { 0 }
            | if shape { flag::IREGS_SHAPE } else { 0 };
    }
    if s.mem.is_some() {
        f |= flag::MEM;
    }
    w.flags = f;
    w
}

/// Why a wire sample could not be turned back into a sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CodecError {
    /// A delta sample without reference state.
    NoReference,
    /// The flags or shapes are inconsistent.
    Malformed,
}

/// Rebuilds a register set into `out` (reused between samples).
fn decode_regs_into(
    w: &WireRegs,
    reference: Option<&RegsSample>,
    delta: bool,
    sparse: bool,
    shape: bool,
    out: &mut RegsSample,
) -> Result<(), CodecError> {
    let (abi, mask) = check_regs(w, reference, delta, sparse, shape)?;
    out.abi = abi;
    out.mask = mask;
    out.values.clear();
    if abi == Abi::None {
        return Ok(());
    }
    if delta || sparse {
        let r = reference.ok_or(CodecError::NoReference)?;
        out.values
            .extend_from_slice(&r.values)
            .map_err(|_| CodecError::Malformed)?;
        add_deltas(&mut out.values, w, delta);
    } else {
        out.values
            .extend_from_slice(&w.values)
            .map_err(|_| CodecError::Malformed)?;
    }
    Ok(())
}

/// Rebuilds a sample from its wire form and the task's reference state into
/// `s`, reusing its storage: nothing of the previous contents survives a
/// successful call. After an error `s` holds no meaningful sample.
pub(crate) fn decode_sample_into(
    w: &WireSample,
    reference: Option<&TaskRef>,
    s: &mut Sample,
) -> Result<(), CodecError> {
    let f = w.flags;
    if f & !flag::ALL != 0 {
        return Err(CodecError::Malformed);
    }
    let key = f & flag::KEY != 0;
    let reference = if key {
        None
    } else {
        Some(reference.ok_or(CodecError::NoReference)?)
    };
    s.event = w.event;
    s.tid = w.tid;
    s.pid = if f & flag::PID != 0 { w.pid } else { w.tid };
    s.cpumode = if f & flag::KERNEL != 0 {
        CpuMode::Kernel
    } else {
        CpuMode::User
    };
    match reference {
        None => {
            s.time = w.time;
            s.ip = w.ip;
            s.period = w.period;
            s.cpu = w.cpu;
        }
        Some(r) => {
            if r.tid != w.tid {
                return Err(CodecError::NoReference);
            }
            s.time = r.time.wrapping_add(w.time);
            s.ip = r.ip.wrapping_add(w.ip);
            s.period = r.period.wrapping_add(w.period);
            s.cpu = if f & flag::CPU != 0 { w.cpu } else { r.cpu };
        }
    }
    s.callchain.clear();
    if f & flag::CALLCHAIN != 0 {
        let mut prev = s.ip;
        for d in &w.callchain {
            prev = prev.wrapping_add(*d);
            s.callchain.push(prev).map_err(|_| CodecError::Malformed)?;
        }
    }
    if f & flag::BRANCHES != 0 {
        let b = s.branches.get_or_insert_with(|| BranchStack {
            hw_idx: 0,
            entries: heapless::Vec::new(),
        });
        b.hw_idx = w.hw_idx;
        b.entries.clear();
        let mut prev = s.ip;
        for (df, dt, fl) in &w.branches {
            let from = prev.wrapping_add(*df);
            let e = BranchEntry {
                from,
                to: from.wrapping_add(*dt),
                flags: BranchFlags::from_perf(*fl),
            };
            b.entries.push(e).map_err(|_| CodecError::Malformed)?;
            prev = from;
        }
    } else {
        s.branches = None;
    }
    if f & flag::UREGS != 0 {
        decode_regs_into(
            &w.uregs,
            reference.and_then(|r| r.regs_user.as_ref()),
            f & flag::UREGS_DELTA != 0,
            f & flag::UREGS_SPARSE != 0,
            f & flag::UREGS_SHAPE != 0,
            s.regs_user.get_or_insert_with(RegsSample::default),
        )?;
    } else {
        s.regs_user = None;
    }
    if f & flag::IREGS != 0 {
        decode_regs_into(
            &w.iregs,
            reference.and_then(|r| r.regs_intr.as_ref()),
            f & flag::IREGS_DELTA != 0,
            f & flag::IREGS_SPARSE != 0,
            f & flag::IREGS_SHAPE != 0,
            s.regs_intr.get_or_insert_with(RegsSample::default),
        )?;
    } else {
        s.regs_intr = None;
    }
    s.mem = if f & flag::MEM != 0 {
        Some(w.mem)
    } else {
        None
    };
    Ok(())
}

/// A cursor over postcard bytes that accepts exactly what postcard's own
/// deserializer accepts for the types a wire sample uses (LEB128 varints
/// with postcard's length and last-byte limits, zigzag for signed values,
/// raw bytes for `u8`). Trailing bytes are ignored, as `postcard::from_bytes`
/// ignores them.
pub(crate) struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader at the start of `bytes`.
    #[inline(always)]
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Reader { rest: bytes }
    }

    #[inline(always)]
    fn u8(&mut self) -> Result<u8, CodecError> {
        let (&b, rest) = self.rest.split_first().ok_or(CodecError::Malformed)?;
        self.rest = rest;
        Ok(b)
    }

    /// A varint of at most `MAX` bytes whose last byte is at most `LAST`.
    #[inline(always)]
    fn varint<const MAX: usize, const LAST: u8>(&mut self) -> Result<u64, CodecError> {
        // Most values are small: one byte, never the last of a longer form.
        if let Some((&b, rest)) = self.rest.split_first()
            && b & 0x80 == 0
        {
            self.rest = rest;
            return Ok(u64::from(b));
        }
        // Most longer ones (deltas of times, addresses and callchain
        // entries) take two to four bytes: with four bytes at hand, those
        // end without a bounds check per byte. None of them is the last
        // byte of a form of at most `MAX` bytes, so `LAST` does not apply.
        if MAX > 4
            && let Some(&[b0, b1, b2, b3]) = self.rest.first_chunk::<4>()
        {
            let mut out = u64::from(b0 & 0x7f) | u64::from(b1 & 0x7f) << 7;
            if b1 & 0x80 == 0 {
                self.rest = &self.rest[2..];
                return Ok(out);
            }
            out |= u64::from(b2 & 0x7f) << 14;
            if b2 & 0x80 == 0 {
                self.rest = &self.rest[3..];
                return Ok(out);
            }
            out |= u64::from(b3 & 0x7f) << 21;
            if b3 & 0x80 == 0 {
                self.rest = &self.rest[4..];
                return Ok(out);
            }
        }
        let mut out = 0u64;
        for i in 0..MAX {
            let b = self.u8()?;
            out |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return if i == MAX - 1 && b > LAST {
                    Err(CodecError::Malformed)
                } else {
                    Ok(out)
                };
            }
        }
        Err(CodecError::Malformed)
    }

    #[inline(always)]
    fn u16(&mut self) -> Result<u16, CodecError> {
        // Cannot truncate: three 7-bit groups with the last limited to 2 bits.
        Ok(self.varint::<3, 0b11>()? as u16)
    }

    #[inline(always)]
    fn u32(&mut self) -> Result<u32, CodecError> {
        // Cannot truncate: five 7-bit groups with the last limited to 4 bits.
        Ok(self.varint::<5, 0b1111>()? as u32)
    }

    #[inline(always)]
    fn u64(&mut self) -> Result<u64, CodecError> {
        self.varint::<10, 0b1>()
    }

    /// An `i64` (zigzag) returned as its two's-complement `u64`.
    #[inline(always)]
    fn i64(&mut self) -> Result<u64, CodecError> {
        let z = self.u64()?;
        Ok((z >> 1) ^ 0u64.wrapping_sub(z & 1))
    }

    #[inline(always)]
    fn value(&mut self, signed: bool) -> Result<u64, CodecError> {
        if signed { self.i64() } else { self.u64() }
    }

    #[inline(always)]
    fn regs(
        &mut self,
        r: &mut WireRegs,
        shape: bool,
        delta: bool,
        sparse: bool,
    ) -> Result<(), CodecError> {
        r.clear();
        if shape {
            r.abi = self.u8()?;
            r.mask = self.u64()?;
        }
        if sparse {
            r.changed = self.u64()?;
        }
        let n = usize::from(self.u8()?);
        self.values(&mut r.values, n, delta || sparse)
    }

    /// `n` varints (zigzag when `signed`) into `out`, which is empty.
    /// Register blocks are mostly one-byte varints, so eight bytes at a
    /// time are checked for continuation bits with one load and, when
    /// there are none, decoded without further checks; the rest goes
    /// varint by varint. Accepts and rejects exactly what reading the `n`
    /// values one by one does.
    #[inline]
    fn values(
        &mut self,
        out: &mut heapless::Vec<u64, MAX_SAMPLED_REGS>,
        n: usize,
        signed: bool,
    ) -> Result<(), CodecError> {
        // More values than fit: refused, as the push of the first extra
        // value would be (reading them could only fail first).
        if n > out.capacity() {
            return Err(CodecError::Malformed);
        }
        let mut i = 0;
        while i < n {
            if n - i >= 8
                && let Some(w) = self.eight_single_bytes()
            {
                let mut dst = [0u64; 8];
                if signed {
                    for (o, b) in dst.iter_mut().zip(unzigzag8(w)) {
                        *o = i64::from(b as i8) as u64;
                    }
                } else {
                    for (o, b) in dst.iter_mut().zip(w.to_le_bytes()) {
                        *o = u64::from(b);
                    }
                }
                // Cannot fail: `i + 8 <= n`, at most the capacity.
                let _ = out.extend_from_slice(&dst);
                self.rest = &self.rest[8..];
                i += 8;
                continue;
            }
            // Cannot fail: `i < n`, at most the capacity.
            let _ = out.push(self.value(signed)?);
            i += 1;
        }
        Ok(())
    }

    /// The next eight bytes as one little-endian word, when each of them is
    /// a whole one-byte varint (no continuation bit): the register blocks'
    /// fast path.
    #[inline(always)]
    fn eight_single_bytes(&self) -> Option<u64> {
        let w = u64::from_le_bytes(*self.rest.first_chunk::<8>()?);
        (w & 0x8080_8080_8080_8080 == 0).then_some(w)
    }

    /// `out.len()` zigzag varints, each added to the value of `base` at
    /// its position and stored in `out` (`base` is as long as `out`): a
    /// block of dense register deltas summed onto its reference in one
    /// pass. Accepts and rejects exactly what [`values`](Self::values)
    /// does for a signed block of that length, and with the same
    /// eight-at-a-time path for one-byte varints.
    #[inline(always)]
    fn sums(&mut self, base: &[u64], out: &mut [u64]) -> Result<(), CodecError> {
        let n = out.len().min(base.len());
        let mut i = 0;
        while i < n {
            if n - i >= 8
                && let Some(w) = self.eight_single_bytes()
            {
                for ((o, b), d) in out[i..i + 8]
                    .iter_mut()
                    .zip(&base[i..i + 8])
                    .zip(unzigzag8(w))
                {
                    *o = b.wrapping_add(i64::from(d as i8) as u64);
                }
                self.rest = &self.rest[8..];
                i += 8;
                continue;
            }
            out[i] = base[i].wrapping_add(self.i64()?);
            i += 1;
        }
        Ok(())
    }
}

/// The eight signed one-byte varints of `w` (from
/// [`Reader::eight_single_bytes`]) at once, each as the low byte of its
/// value, which is that byte sign-extended (`b as i8`). The zigzag of each
/// byte, `(b >> 1) ^ -(b & 1)`, has the value's low byte, and as `b < 0x80`
/// the rest is its sign.
#[inline(always)]
fn unzigzag8(w: u64) -> [u8; 8] {
    (((w >> 1) & 0x7f7f_7f7f_7f7f_7f7f) ^ ((w & 0x0101_0101_0101_0101) * 0xff)).to_le_bytes()
}

impl WireSample {
    /// Parses the postcard bytes of a wire sample (after the record tag)
    /// into `self`, reusing its storage. Accepts and rejects exactly what
    /// the serde `Deserialize` implementation does, without building a new
    /// value per sample.
    pub(crate) fn parse_into(&mut self, bytes: &[u8]) -> Result<(), CodecError> {
        let mut rd = Reader { rest: bytes };
        self.parse_head(&mut rd)?;
        self.parse_tail(&mut rd)
    }

    /// Parses the fields before the register blocks (flags to branches).
    #[inline(always)]
    pub(crate) fn parse_head(&mut self, rd: &mut Reader<'_>) -> Result<(), CodecError> {
        let f = rd.u32()?;
        if f & !flag::ALL != 0 {
            return Err(CodecError::Malformed);
        }
        self.flags = f;
        let key = f & flag::KEY != 0;
        self.event = rd.u32()?;
        self.tid = rd.u32()?;
        self.pid = if f & flag::PID != 0 { rd.u32()? } else { 0 };
        self.time = rd.value(!key)?;
        self.ip = rd.value(!key)?;
        self.period = rd.value(!key)?;
        self.cpu = if f & flag::CPU != 0 { rd.u32()? } else { 0 };
        self.callchain.clear();
        if f & flag::CALLCHAIN != 0 {
            let n = rd.u8()?;
            for _ in 0..n {
                let d = rd.i64()?;
                self.callchain.push(d).map_err(|_| CodecError::Malformed)?;
            }
        }
        self.hw_idx = 0;
        self.branches.clear();
        if f & flag::BRANCHES != 0 {
            self.hw_idx = rd.u64()?;
            let n = rd.u8()?;
            for _ in 0..n {
                let df = rd.i64()?;
                let dt = rd.i64()?;
                let fl = rd.u64()?;
                self.branches
                    .push((df, dt, fl))
                    .map_err(|_| CodecError::Malformed)?;
            }
        }
        Ok(())
    }

    /// Parses the fields from the user registers on, after
    /// [`parse_head`](Self::parse_head).
    #[inline(always)]
    pub(crate) fn parse_tail(&mut self, rd: &mut Reader<'_>) -> Result<(), CodecError> {
        let f = self.flags;
        if f & flag::UREGS != 0 {
            rd.regs(
                &mut self.uregs,
                f & flag::UREGS_SHAPE != 0,
                f & flag::UREGS_DELTA != 0,
                f & flag::UREGS_SPARSE != 0,
            )?;
        } else {
            self.uregs.clear();
        }
        self.parse_after_uregs(rd)
    }

    /// Parses the fields after the user registers (interrupt registers and
    /// memory fields).
    #[inline(always)]
    fn parse_after_uregs(&mut self, rd: &mut Reader<'_>) -> Result<(), CodecError> {
        let f = self.flags;
        if f & flag::IREGS != 0 {
            rd.regs(
                &mut self.iregs,
                f & flag::IREGS_SHAPE != 0,
                f & flag::IREGS_DELTA != 0,
                f & flag::IREGS_SPARSE != 0,
            )?;
        } else {
            self.iregs.clear();
        }
        self.mem = MemInfo::default();
        if f & flag::MEM != 0 {
            self.mem = MemInfo {
                addr: rd.u64()?,
                weight: rd.u64()?,
                ins_lat: rd.u16()?,
                data_src: rd.u64()?,
            };
        }
        Ok(())
    }
}

/// Writes a signed (zigzag) or unsigned varint depending on `signed`.
fn ser_value<S: SerializeTuple>(t: &mut S, v: u64, signed: bool) -> Result<(), S::Error> {
    if signed {
        t.serialize_element(&(v as i64))
    } else {
        t.serialize_element(&v)
    }
}

fn ser_regs<S: SerializeTuple>(
    t: &mut S,
    r: &WireRegs,
    shape: bool,
    delta: bool,
    sparse: bool,
) -> Result<(), S::Error> {
    if shape {
        t.serialize_element(&r.abi)?;
        t.serialize_element(&r.mask)?;
    }
    if sparse {
        t.serialize_element(&r.changed)?;
    }
    t.serialize_element(&(r.values.len() as u8))?;
    for v in &r.values {
        ser_value(t, *v, delta || sparse)?;
    }
    Ok(())
}

impl Serialize for WireSample {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let f = self.flags;
        let key = f & flag::KEY != 0;
        // postcard ignores the tuple length; the flags say what follows.
        let mut t = serializer.serialize_tuple(usize::MAX)?;
        t.serialize_element(&f)?;
        t.serialize_element(&self.event)?;
        t.serialize_element(&self.tid)?;
        if f & flag::PID != 0 {
            t.serialize_element(&self.pid)?;
        }
        ser_value(&mut t, self.time, !key)?;
        ser_value(&mut t, self.ip, !key)?;
        ser_value(&mut t, self.period, !key)?;
        if f & flag::CPU != 0 {
            t.serialize_element(&self.cpu)?;
        }
        if f & flag::CALLCHAIN != 0 {
            t.serialize_element(&(self.callchain.len() as u8))?;
            for d in &self.callchain {
                t.serialize_element(&(*d as i64))?;
            }
        }
        if f & flag::BRANCHES != 0 {
            t.serialize_element(&self.hw_idx)?;
            t.serialize_element(&(self.branches.len() as u8))?;
            for (df, dt, fl) in &self.branches {
                t.serialize_element(&(*df as i64))?;
                t.serialize_element(&(*dt as i64))?;
                t.serialize_element(fl)?;
            }
        }
        if f & flag::UREGS != 0 {
            ser_regs(
                &mut t,
                &self.uregs,
                f & flag::UREGS_SHAPE != 0,
                f & flag::UREGS_DELTA != 0,
                f & flag::UREGS_SPARSE != 0,
            )?;
        }
        if f & flag::IREGS != 0 {
            ser_regs(
                &mut t,
                &self.iregs,
                f & flag::IREGS_SHAPE != 0,
                f & flag::IREGS_DELTA != 0,
                f & flag::IREGS_SPARSE != 0,
            )?;
        }
        if f & flag::MEM != 0 {
            t.serialize_element(&self.mem.addr)?;
            t.serialize_element(&self.mem.weight)?;
            t.serialize_element(&self.mem.ins_lat)?;
            t.serialize_element(&self.mem.data_src)?;
        }
        t.end()
    }
}

struct WireSampleVisitor;

fn next<'de, A: SeqAccess<'de>, T: Deserialize<'de>>(seq: &mut A) -> Result<T, A::Error> {
    seq.next_element()?
        .ok_or_else(|| de::Error::custom("truncated sample"))
}

fn next_value<'de, A: SeqAccess<'de>>(seq: &mut A, signed: bool) -> Result<u64, A::Error> {
    if signed {
        Ok(next::<A, i64>(seq)? as u64)
    } else {
        next(seq)
    }
}

fn de_regs<'de, A: SeqAccess<'de>>(
    seq: &mut A,
    shape: bool,
    delta: bool,
    sparse: bool,
) -> Result<WireRegs, A::Error> {
    let mut r = WireRegs::default();
    if shape {
        r.abi = next(seq)?;
        r.mask = next(seq)?;
    }
    if sparse {
        r.changed = next(seq)?;
    }
    let n: u8 = next(seq)?;
    for _ in 0..n {
        let v = next_value(seq, delta || sparse)?;
        r.values
            .push(v)
            .map_err(|_| de::Error::custom("too many registers"))?;
    }
    Ok(r)
}

impl<'de> Visitor<'de> for WireSampleVisitor {
    type Value = WireSample;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a compact sample")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<WireSample, A::Error> {
        let mut w = WireSample {
            flags: next(&mut seq)?,
            ..Default::default()
        };
        let f = w.flags;
        if f & !flag::ALL != 0 {
            return Err(de::Error::custom("unknown sample flags"));
        }
        let key = f & flag::KEY != 0;
        w.event = next(&mut seq)?;
        w.tid = next(&mut seq)?;
        if f & flag::PID != 0 {
            w.pid = next(&mut seq)?;
        }
        w.time = next_value(&mut seq, !key)?;
        w.ip = next_value(&mut seq, !key)?;
        w.period = next_value(&mut seq, !key)?;
        if f & flag::CPU != 0 {
            w.cpu = next(&mut seq)?;
        }
        if f & flag::CALLCHAIN != 0 {
            let n: u8 = next(&mut seq)?;
            for _ in 0..n {
                let d: i64 = next(&mut seq)?;
                w.callchain
                    .push(d as u64)
                    .map_err(|_| de::Error::custom("callchain too deep"))?;
            }
        }
        if f & flag::BRANCHES != 0 {
            w.hw_idx = next(&mut seq)?;
            let n: u8 = next(&mut seq)?;
            for _ in 0..n {
                let df: i64 = next(&mut seq)?;
                let dt: i64 = next(&mut seq)?;
                let fl: u64 = next(&mut seq)?;
                w.branches
                    .push((df as u64, dt as u64, fl))
                    .map_err(|_| de::Error::custom("branch stack too deep"))?;
            }
        }
        if f & flag::UREGS != 0 {
            w.uregs = de_regs(
                &mut seq,
                f & flag::UREGS_SHAPE != 0,
                f & flag::UREGS_DELTA != 0,
                f & flag::UREGS_SPARSE != 0,
            )?;
        }
        if f & flag::IREGS != 0 {
            w.iregs = de_regs(
                &mut seq,
                f & flag::IREGS_SHAPE != 0,
                f & flag::IREGS_DELTA != 0,
                f & flag::IREGS_SPARSE != 0,
            )?;
        }
        if f & flag::MEM != 0 {
            w.mem = MemInfo {
                addr: next(&mut seq)?,
                weight: next(&mut seq)?,
                ins_lat: next(&mut seq)?,
                data_src: next(&mut seq)?,
            };
        }
        Ok(w)
    }
}

impl<'de> Deserialize<'de> for WireSample {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_tuple(usize::MAX, WireSampleVisitor)
    }
}

/// What [`check_regs`] found a register block to be: the result's ABI and
/// mask.
type RegsShape = (Abi, u64);

/// Checks a register block against its reference without building
/// anything, and returns the shape of the result.
fn check_regs(
    w: &WireRegs,
    reference: Option<&RegsSample>,
    delta: bool,
    sparse: bool,
    shape: bool,
) -> Result<RegsShape, CodecError> {
    let (abi, mask) = if shape {
        let abi = Abi::from_perf_value(u64::from(w.abi)).ok_or(CodecError::Malformed)?;
        (abi, w.mask)
    } else {
        let r = reference.ok_or(CodecError::NoReference)?;
        (r.abi, r.mask)
    };
    if mask & !crate::regs::VALID_MASK_WITH_XMM != 0 {
        return Err(CodecError::Malformed);
    }
    let n = mask.count_ones() as usize;
    if abi == Abi::None {
        return if w.values.is_empty() && !delta && !sparse {
            Ok((abi, mask))
        } else {
            Err(CodecError::Malformed)
        };
    }
    if delta || sparse {
        if shape {
            return Err(CodecError::Malformed);
        }
        let r = reference.ok_or(CodecError::NoReference)?;
        if r.values.len() != n {
            return Err(CodecError::Malformed);
        }
        if delta {
            if w.values.len() != n {
                return Err(CodecError::Malformed);
            }
        } else if (n < 64 && w.changed >> n != 0)
            || w.changed.count_ones() as usize != w.values.len()
        {
            return Err(CodecError::Malformed);
        }
    } else if w.values.len() != n {
        return Err(CodecError::Malformed);
    }
    Ok((abi, mask))
}

/// Adds a delta (`delta`: one per value) or sparse (one per bit of
/// `w.changed`) block's values to the reference's `values`. The block has
/// passed [`check_regs`] against them.
fn add_deltas(values: &mut [u64], w: &WireRegs, delta: bool) {
    if delta {
        for (v, dv) in values.iter_mut().zip(w.values.iter()) {
            *v = v.wrapping_add(*dv);
        }
    } else {
        let mut changed = w.changed;
        for dv in &w.values {
            let i = changed.trailing_zeros() as usize;
            changed &= changed.wrapping_sub(1);
            if let Some(v) = values.get_mut(i) {
                *v = v.wrapping_add(*dv);
            }
        }
    }
}

/// Turns `dst` (the reference when the block is a delta) into the register
/// set the block describes. The block has passed [`check_regs`] against
/// `dst`, so nothing here can fail.
fn apply_regs(
    w: &WireRegs,
    (abi, mask): RegsShape,
    delta: bool,
    sparse: bool,
    dst: &mut Option<RegsSample>,
) {
    if delta || sparse {
        // `check_regs` saw a reference with the right number of values.
        let Some(d) = dst.as_mut() else { return };
        add_deltas(&mut d.values, w, delta);
        d.abi = abi;
        d.mask = mask;
        return;
    }
    let d = dst.get_or_insert_with(RegsSample::default);
    d.abi = abi;
    d.mask = mask;
    d.values.clear();
    if abi != Abi::None {
        // Cannot fail: `check_regs` saw one value per mask bit, at most
        // the capacity.
        let _ = d.values.extend_from_slice(&w.values);
    }
}

impl TaskRef {
    /// An entry for `tid` with no state yet, to be filled by
    /// [`apply`](Self::apply) from a keyframe.
    pub(crate) fn empty(tid: u32) -> Self {
        TaskRef {
            tid,
            chain: 0,
            since_key: 0,
            time: 0,
            ip: 0,
            period: 0,
            cpu: 0,
            regs_user: None,
            regs_intr: None,
        }
    }

    /// Becomes the state after the wire sample `w`, rebuilt against this
    /// entry (or, for a keyframe, on its own), without building the
    /// sample: the same result as [`decode_sample_into`] followed by
    /// [`update`](Self::update), and the same errors. Everything is
    /// checked before anything is changed, so after an error the entry is
    /// as it was.
    pub(crate) fn apply(
        &mut self,
        w: &WireSample,
        chain: u32,
        since_key: u32,
    ) -> Result<(), CodecError> {
        let f = w.flags;
        if f & !flag::ALL != 0 {
            return Err(CodecError::Malformed);
        }
        let key = f & flag::KEY != 0;
        if !key && self.tid != w.tid {
            return Err(CodecError::NoReference);
        }
        let has = |bit: u32| f & bit != 0;
        let ushape = if has(flag::UREGS) {
            Some(check_regs(
                &w.uregs,
                if key { None } else { self.regs_user.as_ref() },
                has(flag::UREGS_DELTA),
                has(flag::UREGS_SPARSE),
                has(flag::UREGS_SHAPE),
            )?)
        } else {
            None
        };
        let ishape = if has(flag::IREGS) {
            Some(check_regs(
                &w.iregs,
                if key { None } else { self.regs_intr.as_ref() },
                has(flag::IREGS_DELTA),
                has(flag::IREGS_SPARSE),
                has(flag::IREGS_SHAPE),
            )?)
        } else {
            None
        };
        // Checked: from here on nothing fails.
        self.commit_scalars(w, chain, since_key);
        match ushape {
            Some(s) => apply_regs(
                &w.uregs,
                s,
                has(flag::UREGS_DELTA),
                has(flag::UREGS_SPARSE),
                &mut self.regs_user,
            ),
            None => self.regs_user = None,
        }
        self.commit_iregs(w, ishape);
        Ok(())
    }

    /// Takes the CRC chain, the keyframe count and the scalar fields (time,
    /// IP, period, CPU) of `w`, which has passed `apply`'s checks.
    #[inline(always)]
    fn commit_scalars(&mut self, w: &WireSample, chain: u32, since_key: u32) {
        let f = w.flags;
        self.tid = w.tid;
        self.chain = chain;
        self.since_key = since_key;
        if f & flag::KEY != 0 {
            self.time = w.time;
            self.ip = w.ip;
            self.period = w.period;
            self.cpu = w.cpu;
        } else {
            self.time = self.time.wrapping_add(w.time);
            self.ip = self.ip.wrapping_add(w.ip);
            self.period = self.period.wrapping_add(w.period);
            if f & flag::CPU != 0 {
                self.cpu = w.cpu;
            }
        }
    }

    /// Takes the interrupt registers of `w`, whose block (if any) passed
    /// [`check_regs`] with the shape `ishape`.
    #[inline(always)]
    fn commit_iregs(&mut self, w: &WireSample, ishape: Option<RegsShape>) {
        let f = w.flags;
        match ishape {
            Some(s) => apply_regs(
                &w.iregs,
                s,
                f & flag::IREGS_DELTA != 0,
                f & flag::IREGS_SPARSE != 0,
                &mut self.regs_intr,
            ),
            None => self.regs_intr = None,
        }
    }

    /// [`apply`](Self::apply) for the usual delta sample, whose user
    /// registers are dense deltas ([`WireSample::dense_uregs`]), with its
    /// payload parsed by [`WireSample::parse_head`] and `rd` at the user
    /// register block: parses the rest into `w` and sums the register
    /// deltas onto this entry's values as they are read, into `scratch`.
    /// The entry changes only once the whole payload has parsed and
    /// passed `apply`'s checks, then the summed values go in with one
    /// copy. Fails where `parse_tail` followed by `apply` fails (not
    /// always with the same error), and otherwise leaves the entry as they
    /// do. Of `w`, only the fields its flags select are meaningful
    /// afterwards (its user registers are not among them), as
    /// [`SampleParts`] reads it.
    pub(crate) fn apply_dense(
        &mut self,
        w: &mut WireSample,
        mut rd: Reader<'_>,
        scratch: &mut DenseScratch,
        chain: u32,
        since_key: u32,
    ) -> Result<(), CodecError> {
        debug_assert!(w.dense_uregs() && !w.is_key() && w.tid == self.tid);
        // What `check_regs` asks of a dense block without shape: a
        // reference of a known ABI whose values match its mask, and as
        // many deltas as values.
        let r = self.regs_user.as_ref().ok_or(CodecError::NoReference)?;
        let n = r.values.len();
        if r.abi == Abi::None
            || r.mask & !crate::regs::VALID_MASK_WITH_XMM != 0
            || scratch.count(r.mask) != n
            || usize::from(rd.u8()?) != n
        {
            return Err(CodecError::Malformed);
        }
        let sums = &mut scratch.values[..n];
        rd.sums(&r.values, sums)?;
        // Fields the flags do not select are left as they are: nothing
        // reads them (see `SampleParts`). The usual sample has none.
        let f = w.flags;
        if f & (flag::IREGS | flag::MEM) != 0 {
            w.parse_after_uregs(&mut rd)?;
        }
        let ishape = if f & flag::IREGS != 0 {
            Some(check_regs(
                &w.iregs,
                self.regs_intr.as_ref(),
                f & flag::IREGS_DELTA != 0,
                f & flag::IREGS_SPARSE != 0,
                f & flag::IREGS_SHAPE != 0,
            )?)
        } else {
            None
        };
        // Checked: from here on nothing fails.
        self.commit_scalars(w, chain, since_key);
        if let Some(d) = self.regs_user.as_mut() {
            d.values.copy_from_slice(sums);
        }
        self.commit_iregs(w, ishape);
        Ok(())
    }
}

/// Scratch space of [`TaskRef::apply_dense`], kept between samples.
#[derive(Clone, Debug)]
pub(crate) struct DenseScratch {
    /// The summed register values, before they go into the reference.
    values: [u64; MAX_SAMPLED_REGS],
    /// The last register mask counted and its number of bits (a software
    /// popcount on the baseline x86-64 target; the mask rarely changes).
    mask: u64,
    bits: usize,
}

impl Default for DenseScratch {
    fn default() -> Self {
        DenseScratch {
            values: [0; MAX_SAMPLED_REGS],
            mask: 0,
            bits: 0,
        }
    }
}

impl DenseScratch {
    /// `mask.count_ones()`, remembered for the next call.
    #[inline(always)]
    fn count(&mut self, mask: u64) -> usize {
        if mask != self.mask {
            self.mask = mask;
            self.bits = mask.count_ones() as usize;
        }
        self.bits
    }
}

/// A decoded sample as [`Decoder::push_parts`](super::Decoder::push_parts)
/// lends it: the per-sample fields are read from the wire form and the
/// delta-coded ones (time, IP, period, CPU, registers) from the task's
/// reference state, which already holds this sample's values. Nothing is
/// copied into a [`Sample`]; [`to_sample`](Self::to_sample) builds one.
#[derive(Clone, Copy, Debug)]
pub struct SampleParts<'a> {
    pub(crate) wire: &'a WireSample,
    pub(crate) state: &'a TaskRef,
}

impl<'a> SampleParts<'a> {
    /// The event id.
    #[inline]
    pub fn event(&self) -> u32 {
        self.wire.event
    }

    /// Thread id.
    #[inline]
    pub fn tid(&self) -> u32 {
        self.wire.tid
    }

    /// Process id.
    #[inline]
    pub fn pid(&self) -> u32 {
        if self.wire.flags & flag::PID != 0 {
            self.wire.pid
        } else {
            self.wire.tid
        }
    }

    /// Where the IP ran.
    #[inline]
    pub fn cpumode(&self) -> CpuMode {
        if self.wire.flags & flag::KERNEL != 0 {
            CpuMode::Kernel
        } else {
            CpuMode::User
        }
    }

    /// Time (ns).
    #[inline]
    pub fn time(&self) -> u64 {
        self.state.time
    }

    /// Sampled IP.
    #[inline]
    pub fn ip(&self) -> u64 {
        self.state.ip
    }

    /// Period.
    #[inline]
    pub fn period(&self) -> u64 {
        self.state.period
    }

    /// CPU.
    #[inline]
    pub fn cpu(&self) -> u32 {
        self.state.cpu
    }

    /// Entries in the callchain.
    #[inline]
    pub fn callchain_len(&self) -> usize {
        if self.wire.flags & flag::CALLCHAIN != 0 {
            self.wire.callchain.len()
        } else {
            0
        }
    }

    /// The callchain, rebuilt from its deltas.
    #[inline]
    pub fn callchain(&self) -> impl Iterator<Item = u64> + 'a {
        let deltas: &'a [u64] = if self.wire.flags & flag::CALLCHAIN != 0 {
            &self.wire.callchain
        } else {
            &[]
        };
        deltas.iter().scan(self.state.ip, |prev, d| {
            *prev = prev.wrapping_add(*d);
            Some(*prev)
        })
    }

    /// The callchain as the sample IP and the deltas that rebuild it:
    /// entry `i` is the IP plus the first `i + 1` deltas.
    #[inline]
    pub fn callchain_deltas(&self) -> (u64, &'a [u64]) {
        let deltas: &'a [u64] = if self.wire.flags & flag::CALLCHAIN != 0 {
            &self.wire.callchain
        } else {
            &[]
        };
        (self.state.ip, deltas)
    }

    /// The branch stack's `hw_idx`, if the sample has a branch stack.
    #[inline]
    pub fn branch_hw_idx(&self) -> Option<u64> {
        (self.wire.flags & flag::BRANCHES != 0).then_some(self.wire.hw_idx)
    }

    /// The branch stack's entries (none without a branch stack).
    pub fn branches(&self) -> impl Iterator<Item = BranchEntry> + 'a {
        let entries: &'a [(u64, u64, u64)] = if self.wire.flags & flag::BRANCHES != 0 {
            &self.wire.branches
        } else {
            &[]
        };
        entries.iter().scan(self.state.ip, |prev, (df, dt, fl)| {
            let from = prev.wrapping_add(*df);
            *prev = from;
            Some(BranchEntry {
                from,
                to: from.wrapping_add(*dt),
                flags: BranchFlags::from_perf(*fl),
            })
        })
    }

    /// User registers, if sampled.
    #[inline]
    pub fn regs_user(&self) -> Option<&'a RegsSample> {
        self.state.regs_user.as_ref()
    }

    /// Interrupt registers, if sampled.
    #[inline]
    pub fn regs_intr(&self) -> Option<&'a RegsSample> {
        self.state.regs_intr.as_ref()
    }

    /// Memory fields, if sampled.
    #[inline]
    pub fn mem(&self) -> Option<MemInfo> {
        (self.wire.flags & flag::MEM != 0).then_some(self.wire.mem)
    }

    /// The whole sample, as [`Decoder::push_ref`](super::Decoder::push_ref)
    /// would lend it.
    pub fn to_sample(&self) -> Sample {
        let mut s = Sample {
            event: self.event(),
            cpumode: self.cpumode(),
            ip: self.ip(),
            pid: self.pid(),
            tid: self.tid(),
            time: self.time(),
            cpu: self.cpu(),
            period: self.period(),
            regs_user: self.regs_user().cloned(),
            regs_intr: self.regs_intr().cloned(),
            mem: self.mem(),
            ..Sample::default()
        };
        for c in self.callchain() {
            // Cannot fail: same capacity.
            let _ = s.callchain.push(c);
        }
        if let Some(hw_idx) = self.branch_hw_idx() {
            let mut entries = heapless::Vec::new();
            for e in self.branches() {
                // Cannot fail: same capacity.
                let _ = entries.push(e);
            }
            s.branches = Some(BranchStack { hw_idx, entries });
        }
        s
    }
}
