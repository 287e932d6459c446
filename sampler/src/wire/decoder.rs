//! The incremental stream decoder used by the host: accepts arbitrary byte
//! chunks, splits frames at `0x00`, checks COBS and CRC, rebuilds delta
//! samples from per-task state, resynchronises after corruption and counts
//! everything it had to skip. Fixed memory (no allocation), never panics.

use core::fmt;

use super::codec::{
    DenseScratch, Reader, SampleParts, TaskRef, WireSample, chain_input, decode_sample_into,
};
use super::group::{GROUP_TAG, GroupHead, GroupModels, RcDecoder, code_sample};
use super::{MAGIC, MAX_FRAME, MAX_GROUP, PROTOCOL_VERSION, Record, SAMPLE_TAG, WireRecord};
use crate::sample::Sample;

/// The frame CRC, CRC-32C (Castagnoli, `CRC_32_ISCSI`). On the host (`std`)
/// it is the `crc32c` crate, which uses the SSE4.2 `crc32` instruction
/// (eight bytes per instruction) when the CPU has it, detected at run time,
/// and tables otherwise; elsewhere the slice-by-8 tables of [`super::castagnoli`]
/// (the runtime gives its encoder the CPU's `crc32` instruction for group
/// frames where it has one: [`super::Encoder::set_frame_crc`]).
#[inline]
pub(crate) fn frame_crc(bytes: &[u8]) -> u32 {
    crc32c_append(0, bytes)
}

/// The CRC-32C of what `crc` was the CRC-32C of, followed by `data`
/// ([`frame_crc`]'s implementation).
#[inline]
pub(crate) fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    #[cfg(feature = "std")]
    {
        crc32c::crc32c_append(crc, data)
    }
    #[cfg(not(feature = "std"))]
    {
        super::castagnoli::crc32c_append(crc, data)
    }
}

/// A task's chain value after a sample frame with plain CRC `plain`,
/// `since_key` frames after its keyframe, encoded against a state with
/// chain `prev` (0 for a keyframe): see [`chain_input`].
#[inline]
fn next_chain(prev: u32, plain: u32, since_key: u32) -> u32 {
    frame_crc(&chain_input(prev, plain, since_key))
}

/// The frame CRC of protocol version 1 (CRC-32/ISO-HDLC), only used to
/// recognise a version-1 Hello and report the version mismatch rather than
/// a bad frame.
static CRC32_V1: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);

/// The tag, magic and version at the start of a Hello's payload.
fn hello_head(payload: &[u8]) -> postcard::Result<(u32, [u8; 4], u16)> {
    postcard::take_from_bytes::<(u32, [u8; 4], u16)>(payload).map(|(t, _)| t)
}

/// The version of a Hello `payload` whose stored CRC `stored` is not its
/// CRC-32C, when it is a Hello of an older version (framed with
/// CRC-32/ISO-HDLC, as version 1 was, with the right magic).
#[cold]
#[inline(never)]
fn older_hello(payload: &[u8], stored: u32) -> Option<u16> {
    match hello_head(payload) {
        Ok((_, magic, version))
            if magic == MAGIC
                && version != PROTOCOL_VERSION
                && CRC32_V1.checksum(payload) == stored =>
        {
            Some(version)
        }
        _ => None,
    }
}

/// Tasks whose delta state the decoder keeps. When full, the oldest entry
/// is evicted; that task's next delta sample is counted as unresolved.
pub const DECODER_TASKS: usize = 128;

/// Errors the decoder reports to its caller (bad frames are only counted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// A Hello with another protocol version: this decoder cannot read the
    /// stream. Frames are ignored until a compatible Hello arrives.
    VersionMismatch {
        /// The stream's version.
        found: u16,
        /// The version this decoder speaks.
        expected: u16,
    },
    /// A valid frame whose Hello magic is wrong: not a Perch stream.
    BadMagic([u8; 4]),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::VersionMismatch { found, expected } => write!(
                f,
                "stream speaks Perch protocol version {found}, this decoder speaks version {expected}"
            ),
            DecodeError::BadMagic(m) => write!(f, "not a Perch stream (magic {m:02x?})"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for DecodeError {}

/// What the decoder has seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecoderStats {
    /// Frames that decoded to a record.
    pub frames_ok: u64,
    /// Frames that failed COBS, CRC or postcard checks (or were too long),
    /// unresolved delta samples included.
    pub bad_frames: u64,
    /// Bytes belonging to bad frames or skipped while resynchronising.
    pub bytes_skipped: u64,
    /// Delta samples whose reference (the task's previous sample) was lost:
    /// correct frames that cannot be rebuilt. Also counted in `bad_frames`.
    pub unresolved_samples: u64,
    /// Frames ignored after a version mismatch.
    pub frames_ignored: u64,
    /// Samples in group frames that arrived intact but could not be
    /// decoded because an earlier frame of their group was lost (also in
    /// `unresolved_samples`), or that were in group frames the stream
    /// index shows missing.
    pub group_samples_lost: u64,
}

/// A record as [`Decoder::push_parts`] lends it.
#[derive(Clone, Copy, Debug)]
pub enum Lent<'a> {
    /// Any record but a sample.
    Record(&'a Record),
    /// A sample, in parts.
    Sample(SampleParts<'a>),
}

/// One frame, delimited, COBS-decoded and split from its CRC, but not yet
/// checked against it (a delta sample's CRC depends on record state).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Frame<'a> {
    /// The postcard payload (never empty).
    payload: &'a [u8],
    /// The CRC word stored in the frame.
    stored: u32,
    /// The CRC of `payload`.
    plain: u32,
    /// The frame's length on the wire, delimiter excluded.
    len: usize,
}

#[cfg(any(test, feature = "fuzzing"))]
impl Frame<'_> {
    /// The payload, the stored and the plain CRC, and the wire length.
    pub(crate) fn parts(&self) -> (&[u8], u32, u32, usize) {
        (self.payload, self.stored, self.plain, self.len)
    }
}

/// Bytes of room after a decoded frame, so short COBS runs can be copied
/// with one fixed-size move.
pub(crate) const COBS_SLACK: usize = 16;

/// The framing stage of the decoder: splits a byte stream at delimiters,
/// undoes COBS and computes each frame's CRC. It keeps no record state, so
/// it can run ahead of the record stage, on another thread if need be
/// ([`FrameBatch`], [`Decoder::push_batch_parts`]).
#[derive(Clone)]
pub struct Framer {
    /// A frame that straddles chunks, collected.
    frame: heapless::Vec<u8, MAX_FRAME>,
    /// Discarding an overlong frame until the next delimiter.
    overflow: bool,
    /// The COBS-decoded frame.
    plain: [u8; MAX_FRAME + COBS_SLACK],
    /// Frames refused before the record stage, and bytes skipped.
    stats: DecoderStats,
}

impl Default for Framer {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Framer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Framer")
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Framer {
    /// A framer at the start of a stream (or anywhere in one).
    pub fn new() -> Self {
        Framer {
            frame: heapless::Vec::new(),
            overflow: false,
            plain: [0; MAX_FRAME + COBS_SLACK],
            stats: DecoderStats::default(),
        }
    }

    /// What the framing stage refused (`bad_frames`, `bytes_skipped`).
    pub fn stats(&self) -> DecoderStats {
        self.stats
    }

    /// Feeds `chunk`, calling `sink` for every frame it completes.
    pub(crate) fn push(&mut self, chunk: &[u8], mut sink: impl FnMut(Frame<'_>)) {
        let mut rest = chunk;
        while !rest.is_empty() {
            if self.frame.is_empty() && !self.overflow {
                // A frame that starts in this chunk (the usual case): find
                // its end while undoing COBS, in one pass.
                match cobs_scan_to(rest, &mut self.plain) {
                    Scan::Decoded { end, n } => {
                        self.emit(end, n, &mut sink);
                        rest = &rest[end + 1..];
                        continue;
                    }
                    // Malformed, or it goes on past the chunk or past
                    // MAX_FRAME: the general path below.
                    Scan::Open => {}
                }
            }
            match memchr::memchr(0, rest) {
                None => {
                    self.take(rest);
                    rest = &[];
                }
                Some(end) => {
                    if self.frame.is_empty() && !self.overflow && end <= MAX_FRAME {
                        // The whole frame is in the chunk (the usual
                        // case): decode it from there.
                        self.finish(Some(&rest[..end]), &mut sink);
                    } else {
                        self.take(&rest[..end]);
                        self.finish(None, &mut sink);
                        self.frame.clear();
                    }
                    rest = &rest[end + 1..];
                }
            }
        }
    }

    fn take(&mut self, bytes: &[u8]) {
        if self.overflow {
            self.stats.bytes_skipped += bytes.len() as u64;
            return;
        }
        if self.frame.extend_from_slice(bytes).is_err() {
            self.stats.bytes_skipped += (self.frame.len() + bytes.len()) as u64;
            self.frame.clear();
            self.overflow = true;
        }
    }

    /// Decodes the frame `whole`, or else the one collected in
    /// `self.frame`, and hands it to `sink`.
    fn finish(&mut self, whole: Option<&[u8]>, sink: &mut impl FnMut(Frame<'_>)) {
        if self.overflow {
            self.overflow = false;
            self.stats.bad_frames += 1;
            self.stats.bytes_skipped += 1;
            return;
        }
        let src = whole.unwrap_or(&self.frame);
        let len = src.len();
        if len == 0 {
            // Back-to-back delimiters: a resync point, not a frame.
            return;
        }
        match cobs_decode_to(src, &mut self.plain) {
            Some(n) => self.emit(len, n, sink),
            None => self.refuse(len),
        }
    }

    /// Hands the frame of wire length `len` (delimiter excluded; not 0),
    /// decoded to `n` bytes in `self.plain`, to `sink`, or refuses it when
    /// it is too short to hold a payload and a CRC.
    #[inline(always)]
    fn emit(&mut self, len: usize, n: usize, sink: &mut impl FnMut(Frame<'_>)) {
        if len == 0 {
            // Back-to-back delimiters: a resync point, not a frame.
            return;
        }
        if n < 5 {
            return self.refuse(len);
        }
        let (payload, crc_bytes) = self.plain[..n].split_at(n - 4);
        let stored = u32::from_le_bytes([crc_bytes[0], crc_bytes[1], crc_bytes[2], crc_bytes[3]]);
        sink(Frame {
            payload,
            stored,
            plain: frame_crc(payload),
            len,
        });
    }

    /// Counts a bad frame of wire length `len` and its delimiter.
    fn refuse(&mut self, len: usize) {
        self.stats.bad_frames += 1;
        self.stats.bytes_skipped += len as u64 + 1;
    }
}

/// Frames collected by a [`Framer`] for a record stage that runs elsewhere
/// ([`Decoder::push_batch_parts`]), with the framer's counters as of the
/// last frame.
#[cfg(feature = "std")]
#[derive(Clone, Debug, Default)]
pub struct FrameBatch {
    /// Per frame: payload length (u16), encoded length (u16), stored and
    /// plain CRC (u32 each), then the payload.
    bytes: std::vec::Vec<u8>,
    /// The framer's counters.
    stats: DecoderStats,
}

#[cfg(feature = "std")]
impl FrameBatch {
    /// Bytes of bookkeeping per frame.
    const HEAD: usize = 12;

    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Empties the batch, keeping its storage.
    pub fn clear(&mut self) {
        self.bytes.clear();
    }

    /// Bytes held (payloads and bookkeeping).
    pub fn len_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Feeds `chunk` through `framer` and appends the frames it completes.
    pub fn push_from(&mut self, framer: &mut Framer, chunk: &[u8]) {
        let bytes = &mut self.bytes;
        framer.push(chunk, |f| {
            // Both fit 16 bits: frames are at most MAX_FRAME bytes.
            let head = u128::from(f.payload.len() as u16)
                | u128::from(f.len as u16) << 16
                | u128::from(f.stored) << 32
                | u128::from(f.plain) << 64;
            bytes.reserve(Self::HEAD + f.payload.len());
            bytes.extend_from_slice(&head.to_le_bytes()[..Self::HEAD]);
            bytes.extend_from_slice(f.payload);
        });
        self.stats = framer.stats();
    }

    /// The frames, in order.
    fn frames(&self) -> impl Iterator<Item = Frame<'_>> {
        let mut rest = &self.bytes[..];
        core::iter::from_fn(move || {
            let (head, tail) = rest.split_first_chunk::<{ Self::HEAD }>()?;
            let n = usize::from(u16::from_le_bytes([head[0], head[1]]));
            let len = usize::from(u16::from_le_bytes([head[2], head[3]]));
            let stored = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
            let plain = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
            let payload = tail.get(..n)?;
            rest = &tail[n..];
            Some(Frame {
                payload,
                stored,
                plain,
                len,
            })
        })
    }
}

/// The incremental decoder. A clone is a snapshot of its place in the
/// stream and its delta state, from which decoding can go on separately.
///
/// ```
/// use sampler::wire::{Decoder, Encoder, End, Record, MAX_FRAME};
/// let mut enc: Encoder = Encoder::new(Default::default());
/// let mut buf = [0u8; MAX_FRAME];
/// let n = enc.encode(&Record::End(End { taken: 3, ..End::default() }), &mut buf).unwrap();
/// let mut dec = Decoder::new();
/// let mut got = Vec::new();
/// dec.push(&buf[..2], |r| got.push(r)); // any chunking works
/// dec.push(&buf[2..n], |r| got.push(r));
/// assert_eq!(got, [Ok(Record::End(End { taken: 3, ..End::default() }))]);
/// ```
#[derive(Clone)]
pub struct Decoder {
    framer: Framer,
    records: Records,
}

/// Where the decoder stands in the stream's groups.
#[derive(Clone)]
struct GroupReader {
    models: GroupModels,
    /// The group being decoded, and the next frame expected of it; `live`
    /// is false when no group can be decoded until the next one starts.
    group: u32,
    next_seq: u32,
    live: bool,
    /// The stream index of the next sample expected, once known.
    next: Option<u64>,
    /// The newest group seen since the last Hello (older ones are
    /// replays).
    last_group: Option<u32>,
    /// The decoder's unused input side.
    empty: Sample,
}

/// The record stage: CRC checks, delta state, records.
#[derive(Clone)]
struct Records {
    groups: GroupReader,
    tasks: heapless::Deque<TaskRef, DECODER_TASKS>,
    incompatible: bool,
    stats: DecoderStats,
    /// The wire form of the current sample, parsed in place.
    wire: WireSample,
    /// Scratch space of the dense register delta path.
    scratch: DenseScratch,
    /// The record lent to the sink; samples are rebuilt in place in it.
    record: Record,
}

impl fmt::Debug for Decoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decoder")
            .field("stats", &self.stats())
            .field("incompatible", &self.records.incompatible)
            .finish_non_exhaustive()
    }
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Decoder {
    /// A decoder at the start of a stream (or anywhere in one: it
    /// synchronises at the first delimiter).
    pub fn new() -> Self {
        Decoder {
            framer: Framer::new(),
            records: Records {
                groups: GroupReader {
                    models: GroupModels::NEW,
                    group: 0,
                    next_seq: 0,
                    live: false,
                    next: None,
                    last_group: None,
                    empty: Sample::EMPTY,
                },
                tasks: heapless::Deque::new(),
                incompatible: false,
                stats: DecoderStats::default(),
                wire: WireSample::default(),
                scratch: DenseScratch::default(),
                record: Record::Sample(Sample::default()),
            },
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> DecoderStats {
        let (f, r) = (self.framer.stats, self.records.stats);
        DecoderStats {
            frames_ok: f.frames_ok + r.frames_ok,
            bad_frames: f.bad_frames + r.bad_frames,
            bytes_skipped: f.bytes_skipped + r.bytes_skipped,
            unresolved_samples: f.unresolved_samples + r.unresolved_samples,
            frames_ignored: f.frames_ignored + r.frames_ignored,
            group_samples_lost: f.group_samples_lost + r.group_samples_lost,
        }
    }

    /// Feeds `chunk`, calling `sink` for every record (or error) completed
    /// by it, in stream order. Each record is a copy; [`push_ref`](Self::push_ref)
    /// lends them instead, which is faster.
    pub fn push(&mut self, chunk: &[u8], mut sink: impl FnMut(Result<Record, DecodeError>)) {
        self.push_ref(chunk, |r| sink(r.cloned()));
    }

    /// Feeds `chunk`, lending `sink` every record (or error) completed by
    /// it, in stream order. The record lives in the decoder and is reused
    /// for the next one: samples are rebuilt in place, so no sample is
    /// copied or moved between the frame and the sink.
    pub fn push_ref(&mut self, chunk: &[u8], mut sink: impl FnMut(Result<&Record, DecodeError>)) {
        let records = &mut self.records;
        self.framer.push(chunk, |f| {
            records.finish_frame::<false>(f, &mut |r| match r {
                Ok(Lent::Record(r)) => sink(Ok(r)),
                // Not produced without `PARTS`.
                Ok(Lent::Sample(_)) => {}
                Err(e) => sink(Err(e)),
            })
        });
    }

    /// Feeds `chunk`, lending `sink` every record (or error) completed by
    /// it, in stream order, like [`push_ref`](Self::push_ref), except that
    /// samples come as [`SampleParts`]: the sample is not rebuilt at all,
    /// its delta-coded fields are read from the task's reference state,
    /// which is updated in place. The fastest way to consume a stream.
    pub fn push_parts(
        &mut self,
        chunk: &[u8],
        mut sink: impl FnMut(Result<Lent<'_>, DecodeError>),
    ) {
        let records = &mut self.records;
        self.framer
            .push(chunk, |f| records.finish_frame::<true>(f, &mut sink));
    }

    /// Like [`push_parts`](Self::push_parts) for frames a [`Framer`]
    /// collected elsewhere (in stream order, from the start of the stream,
    /// by one framer). The framer's counters, as of the batch, become this
    /// decoder's framing counters.
    #[cfg(feature = "std")]
    pub fn push_batch_parts(
        &mut self,
        batch: &FrameBatch,
        mut sink: impl FnMut(Result<Lent<'_>, DecodeError>),
    ) {
        for f in batch.frames() {
            self.records.finish_frame::<true>(f, &mut sink);
        }
        self.framer.stats = batch.stats;
    }

    /// Feeds `chunk` and returns the records it completed.
    #[cfg(feature = "std")]
    pub fn push_vec(&mut self, chunk: &[u8]) -> std::vec::Vec<Result<Record, DecodeError>> {
        let mut out = std::vec::Vec::new();
        self.push(chunk, |r| out.push(r));
        out
    }
}

/// Counts a bad frame of `len` bytes (and its delimiter).
fn bad(stats: &mut DecoderStats, len: usize) {
    stats.bad_frames += 1;
    stats.bytes_skipped += len as u64 + 1;
}

impl Records {
    fn bad(&mut self, len: usize) {
        bad(&mut self.stats, len);
    }

    /// Checks and decodes one frame and hands the record or error to
    /// `sink`.
    fn finish_frame<const PARTS: bool>(
        &mut self,
        f: Frame<'_>,
        sink: &mut impl FnMut(Result<Lent<'_>, DecodeError>),
    ) {
        let Frame {
            payload,
            stored,
            plain,
            len,
        } = f;
        if payload[0] == SAMPLE_TAG && !self.incompatible {
            return if PARTS {
                self.finish_sample_parts(&payload[1..], len, stored, plain, sink)
            } else {
                self.finish_sample(&payload[1..], len, stored, plain, sink)
            };
        }
        if payload[0] == 0 {
            // A Hello: check magic and version before the rest, whose
            // layout may differ in other versions.
            if stored != plain {
                // Version 1 framed with CRC-32/ISO-HDLC: a Hello of that
                // version gets the clear version error, not a bad frame
                // (after which its records would all be bad frames too).
                return match older_hello(payload, stored) {
                    Some(found) => {
                        self.incompatible = true;
                        self.stats.frames_ignored += 1;
                        sink(Err(DecodeError::VersionMismatch {
                            found,
                            expected: PROTOCOL_VERSION,
                        }))
                    }
                    None => self.bad(len),
                };
            }
            if let Ok((tag, magic, version)) = hello_head(payload) {
                debug_assert_eq!(tag, 0);
                if magic != MAGIC {
                    self.stats.frames_ignored += 1;
                    return sink(Err(DecodeError::BadMagic(magic)));
                }
                if version != PROTOCOL_VERSION {
                    self.incompatible = true;
                    self.stats.frames_ignored += 1;
                    return sink(Err(DecodeError::VersionMismatch {
                        found: version,
                        expected: PROTOCOL_VERSION,
                    }));
                }
                self.incompatible = false;
                // A new stream (or its repetition, where the encoder
                // starts a new group too): old delta state is meaningless.
                self.tasks.clear();
                self.groups.live = false;
                // The stream index restarts with every Hello.
                self.groups.next = Some(0);
                self.groups.last_group = None;
            }
        } else if self.incompatible {
            self.stats.frames_ignored += 1;
            return;
        } else if payload[0] == GROUP_TAG {
            return self.finish_group(payload, len, stored, plain, sink);
        }

        let Ok(rec) = postcard::from_bytes::<WireRecord>(payload) else {
            return self.bad(len);
        };
        if stored != plain {
            return self.bad(len);
        }
        self.record = match rec {
            WireRecord::Hello(h) => Record::Hello(h),
            // Tag 1 is handled by `finish_sample`; a Sample here means the
            // tag byte was not the plain single-byte varint.
            WireRecord::Sample(_) => return self.bad(len),
            WireRecord::Lost(l) => Record::Lost(l),
            WireRecord::Throttle(t) => Record::Throttle(t),
            WireRecord::Unthrottle(t) => Record::Unthrottle(t),
            WireRecord::Task(t) => Record::Task(t),
            WireRecord::Log(l) => Record::Log(l),
            WireRecord::SelfTest(t) => Record::SelfTest(t),
            WireRecord::End(e) => Record::End(e),
            WireRecord::TaskExit(e) => Record::TaskExit(e),
        };
        self.stats.frames_ok += 1;
        sink(Ok(Lent::Record(&self.record)));
    }

    /// Decodes a sample (`body`: its payload after the tag) straight into
    /// the lent record, checking its CRC against the task's reference
    /// state.
    fn finish_sample(
        &mut self,
        body: &[u8],
        len: usize,
        stored: u32,
        plain: u32,
        sink: &mut impl FnMut(Result<Lent<'_>, DecodeError>),
    ) {
        let Records {
            tasks,
            stats,
            wire,
            record,
            ..
        } = self;
        if wire.parse_into(body).is_err() {
            return self.bad(len);
        }
        let pos = tasks.iter().position(|t| t.tid == wire.tid());
        let key = wire.is_key();
        let reference = if key {
            if stored != plain {
                return self.bad(len);
            }
            None
        } else {
            let reference = pos.and_then(|p| tasks.iter().nth(p));
            let ok = reference.is_some_and(|r| r.chained(stored, plain));
            if !ok {
                stats.unresolved_samples += u64::from(stored != plain);
                return self.bad(len);
            }
            reference
        };
        if !matches!(record, Record::Sample(_)) {
            *record = Record::Sample(Sample::default());
        }
        let Record::Sample(s) = record else {
            return self.bad(len);
        };
        if decode_sample_into(wire, reference, s).is_err() {
            return self.bad(len);
        }
        let since = reference.map_or(0, |r| r.since_key + 1);
        let chain = next_chain(reference.map_or(0, |r| r.chain), plain, since);
        match pos.and_then(|p| tasks.iter_mut().nth(p)) {
            Some(slot) => slot.update(s, chain, since),
            None => {
                remember(tasks, TaskRef::after(s, chain, since));
            }
        }
        self.stats.frames_ok += 1;
        sink(Ok(Lent::Record(&self.record)));
    }

    /// Like [`finish_sample`](Self::finish_sample), but brings the task's
    /// reference state up to this sample in place and lends the sample as
    /// [`SampleParts`] over that state, without building a [`Sample`].
    fn finish_sample_parts(
        &mut self,
        body: &[u8],
        len: usize,
        stored: u32,
        plain: u32,
        sink: &mut impl FnMut(Result<Lent<'_>, DecodeError>),
    ) {
        let mut rd = Reader::new(body);
        if self.wire.parse_head(&mut rd).is_err() {
            return self.bad(len);
        }
        let Records {
            tasks,
            stats,
            wire,
            scratch,
            ..
        } = self;
        let tid = wire.tid();
        let key = wire.is_key();
        let slot = match tasks.iter_mut().find(|t| t.tid == tid) {
            // The usual sample: a delta chained to its task's state, with
            // dense register deltas, summed onto the state as they are
            // parsed. Whatever fails here fails below too, and only as a
            // bad frame (never unresolved, which needs the chain broken).
            Some(slot) if !key && wire.dense_uregs() && slot.chained(stored, plain) => {
                let since = slot.since_key + 1;
                let chain = next_chain(slot.chain, plain, since);
                if slot.apply_dense(wire, rd, scratch, chain, since).is_err() {
                    return bad(stats, len);
                }
                stats.frames_ok += 1;
                return sink(Ok(Lent::Sample(SampleParts { wire, state: slot })));
            }
            slot => slot,
        };
        if wire.parse_tail(&mut rd).is_err() {
            return bad(stats, len);
        }
        if key && stored != plain {
            return bad(stats, len);
        }
        let state = match slot {
            Some(slot) => {
                let (prev, since) = if key {
                    (0, 0)
                } else if slot.chained(stored, plain) {
                    (slot.chain, slot.since_key + 1)
                } else {
                    stats.unresolved_samples += u64::from(stored != plain);
                    return bad(stats, len);
                };
                if slot
                    .apply(wire, next_chain(prev, plain, since), since)
                    .is_err()
                {
                    return bad(stats, len);
                }
                &*slot
            }
            None => {
                if !key {
                    stats.unresolved_samples += u64::from(stored != plain);
                    return bad(stats, len);
                }
                let mut state = TaskRef::empty(tid);
                if state.apply(wire, next_chain(0, plain, 0), 0).is_err() {
                    return bad(stats, len);
                }
                match remember(tasks, state) {
                    Some(s) => s,
                    None => return bad(stats, len),
                }
            }
        };
        stats.frames_ok += 1;
        sink(Ok(Lent::Sample(SampleParts { wire, state })));
    }
}

impl Records {
    /// Decodes a group frame (see [`super::group`]): every sample it holds
    /// when it continues the group being decoded, none (and all counted)
    /// when an earlier frame of its group is missing.
    fn finish_group(
        &mut self,
        payload: &[u8],
        len: usize,
        stored: u32,
        plain: u32,
        sink: &mut impl FnMut(Result<Lent<'_>, DecodeError>),
    ) {
        if stored != plain {
            return self.bad(len);
        }
        let Ok((head, coded)) = postcard::take_from_bytes::<GroupHead>(&payload[1..]) else {
            return self.bad(len);
        };

        let g = &mut self.groups;
        // The encoder never sends an empty group frame.
        if head.count == 0 || head.count > MAX_GROUP {
            g.live = false;
            return bad(&mut self.stats, len);
        }
        // A frame the line delivered twice (a replayed chunk): its samples
        // were decoded, or counted, the first time.
        let replay = g.last_group.is_some_and(|last| {
            let ahead = head.group.wrapping_sub(last) as i32;
            ahead < 0 || (ahead == 0 && (head.seq == 0 || head.seq < g.next_seq))
        });
        if replay {
            return bad(&mut self.stats, len);
        }
        g.last_group = Some(head.group);
        // Samples the stream index shows missing: frames that never
        // arrived intact, counted exactly once a later frame tells where
        // the stream stands.
        if let Some(next) = g.next
            && head.first > next
        {
            self.stats.group_samples_lost += head.first - next;
        }
        g.next = Some(head.first.saturating_add(u64::from(head.count)));
        let continues = g.live && head.group == g.group && head.seq == g.next_seq;
        if head.seq == 0 {
            g.models.reset();
            g.group = head.group;
        } else if !continues {
            // An earlier frame of this group is missing: its models are
            // not the encoder's, so nothing here is decoded.
            g.live = false;
            g.group = head.group;
            g.next_seq = head.seq.wrapping_add(1);
            self.stats.unresolved_samples += u64::from(head.count);
            self.stats.group_samples_lost += u64::from(head.count);
            return bad(&mut self.stats, len);
        }
        g.live = true;
        g.next_seq = head.seq.wrapping_add(1);
        if !matches!(self.record, Record::Sample(_)) {
            self.record = Record::Sample(Sample::default());
        }
        let mut rc = RcDecoder::new(coded);
        for done in 0..head.count {
            let Record::Sample(s) = &mut self.record else {
                return;
            };
            code_sample(&mut rc, &mut g.models, &g.empty, s);
            if !rc.clean() {
                // Malformed although its CRC holds (a hostile stream): the
                // rest of the group is lost, counted, and a frame that gave
                // nothing is a bad one.
                let rest = u64::from(head.count - done);
                g.live = false;
                self.stats.unresolved_samples += rest;
                self.stats.group_samples_lost += rest;
                if done == 0 {
                    bad(&mut self.stats, len);
                }
                return;
            }
            if done == 0 {
                self.stats.frames_ok += 1;
            }
            sink(Ok(Lent::Record(&self.record)));
        }
    }
}

/// Stores `state` for a task not in `tasks` yet, evicting the oldest entry
/// when the table is full, and returns the stored entry.
fn remember(
    tasks: &mut heapless::Deque<TaskRef, DECODER_TASKS>,
    state: TaskRef,
) -> Option<&TaskRef> {
    if tasks.is_full() {
        tasks.pop_front();
    }
    // Cannot fail: there is room now.
    let _ = tasks.push_back(state);
    tasks.back()
}

/// Undoes COBS from `src` into `dst` and returns the decoded length, or
/// `None` for a malformed frame. `src` is one frame without its delimiter
/// (at most [`MAX_FRAME`] bytes), so it holds no zero byte (the decoder
/// splits frames at zeros). Accepts and rejects exactly what
/// `cobs::decode_in_place` does on such input, but moves each run of bytes
/// with one copy, and a short run with one fixed 16-byte move (the bytes
/// it writes past the run are overwritten or lie past the result).
pub(crate) fn cobs_decode_to(src: &[u8], dst: &mut [u8; MAX_FRAME + COBS_SLACK]) -> Option<usize> {
    let end = src.len();
    if end == 0 || end > MAX_FRAME {
        return None;
    }
    // `d <= s` throughout (each code byte yields at most itself), so
    // `d + COBS_SLACK` stays inside `dst`.
    let (mut s, mut d) = (0, 0);
    while s < end {
        let code = usize::from(src[s]);
        // A zero code cannot occur in a frame split at zeros; refuse it
        // rather than loop.
        if code == 0 || s + code > end {
            return None;
        }
        let run = code - 1;
        if run <= COBS_SLACK
            && let Some(from) = src.get(s + 1..s + 1 + COBS_SLACK)
        {
            dst[d..d + COBS_SLACK].copy_from_slice(from);
        } else {
            dst[d..d + run].copy_from_slice(&src[s + 1..s + code]);
        }
        s += code;
        d += run;
        if code != 0xff && s < end {
            dst[d] = 0;
            d += 1;
        }
    }
    Some(d)
}

/// How the frame at the start of some bytes ends, as [`cobs_scan_to`]
/// found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scan {
    /// The delimiter at `end` ends the frame, which was decoded to `n`
    /// bytes (a frame of length 0 is two delimiters in a row).
    Decoded {
        /// The delimiter's index.
        end: usize,
        /// The decoded length.
        n: usize,
    },
    /// The frame holds a zero inside a COBS run (it is malformed and ends
    /// there), or it does not end within the bytes given and `MAX_FRAME`:
    /// the caller takes the general path.
    Open,
}

/// Frames up to this long (delimiter excluded) are found by
/// [`cobs_scan_to`]; longer ones take the general path.
const SCAN_MAX: usize = 1024;

/// Finds the end of the frame at the start of `src` and undoes its COBS
/// into `dst`, without searching for the delimiter byte by byte: the code
/// bytes are walked to the zero code byte that ends the frame; then the
/// bytes after the first code byte are moved down by one, 16 at a time,
/// and the same 16-byte words are tested for a zero before that end (a
/// zero inside a run); last, each code byte's place gets the zero it
/// stands for. Gives exactly what splitting at the first zero (`memchr`)
/// and [`cobs_decode_to`] give for a well-formed frame of at most
/// [`SCAN_MAX`] bytes without a full 254-byte run, followed by at least 32
/// more bytes in `src`, and [`Scan::Open`] for anything else (a zero
/// inside a run included): the general path handles those.
#[inline]
pub(crate) fn cobs_scan_to(src: &[u8], dst: &mut [u8; MAX_FRAME + COBS_SLACK]) -> Scan {
    const ONES: u128 = u128::from_le_bytes([0x01; 16]);
    const HIGHS: u128 = u128::from_le_bytes([0x80; 16]);
    // A fixed-size window: every code byte and 16-byte piece read below
    // lies in it.
    let Some(win) = src.first_chunk::<{ SCAN_MAX + 2 * COBS_SLACK }>() else {
        return Scan::Open;
    };
    let Some(dst) = dst.first_chunk_mut::<{ SCAN_MAX + 2 * COBS_SLACK }>() else {
        return Scan::Open;
    };
    let mut s = 0;
    let end = loop {
        let code = win[s];
        if code == 0 {
            break s;
        }
        // A full run has no zero after it, so the bytes after it move
        // down by more than one: the general path (rare in samples).
        if code == 0xff {
            return Scan::Open;
        }
        s += usize::from(code);
        if s > SCAN_MAX {
            return Scan::Open;
        }
    };
    if end == 0 {
        return Scan::Decoded { end: 0, n: 0 };
    }
    let mut p = 1;
    while p < end {
        let Some(&piece) = win[p..].first_chunk::<COBS_SLACK>() else {
            return Scan::Open;
        };
        let w = u128::from_le_bytes(piece);
        // The lowest flagged byte is the first zero (borrows only flag
        // bytes above a zero).
        let zeros = w.wrapping_sub(ONES) & !w & HIGHS;
        if zeros != 0 && p + ((zeros.trailing_zeros() / 8) as usize) < end {
            return Scan::Open;
        }
        // Bytes written past the frame lie past the result.
        dst[p - 1..p - 1 + COBS_SLACK].copy_from_slice(&piece);
        p += COBS_SLACK;
    }
    // Every code byte but the first stands for a zero one place down.
    let mut c = usize::from(win[0]);
    while c < end {
        dst[c - 1] = 0;
        c += usize::from(win[c]);
    }
    Scan::Decoded { end, n: end - 1 }
}
