//! The frame encoder: record -> postcard -> CRC-32C -> COBS, into a caller's
//! buffer. `no_std`, no allocation; it runs in the drain loop, never in NMI
//! context.

use core::fmt;

use postcard::ser_flavors::{Cobs, Flavor, Slice};

use super::codec::{TaskRef, chain_input, encode_sample};
use super::decoder::crc32c_append;
use super::group::{
    FRAME_CODED_MAX, FRAME_TARGET, GROUP_MAX_BYTES, GROUP_TAG, GroupHead, GroupModels, RcEncoder,
    bound, code_sample,
};
use super::{Record, WireRecordRef};
use crate::sample::Sample;

/// The CRC used by every frame since protocol version 2: CRC-32C
/// (Castagnoli, `CRC_32_ISCSI`), which x86_64 hosts compute with the SSE4.2
/// `crc32` instruction. The target computes it byte by byte from a 1 KiB
/// table.
pub(crate) static CRC32: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);

/// Encoder settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncoderConfig {
    /// A task's samples are sent as a keyframe at least every this many
    /// samples (1 = every sample is a keyframe, no deltas).
    pub keyframe_interval: u32,
    /// Samples per group (`wire_group=N`, see [`super::group`]); 0 sends
    /// every sample in a frame of its own, coded against its task's
    /// previous sample. With groups, write records with
    /// [`Encoder::put`] and end with [`Encoder::flush`].
    pub group: u32,
}

impl EncoderConfig {
    /// The default settings: keyframes every 128 samples of a task, no
    /// groups.
    pub const DEFAULT: EncoderConfig = EncoderConfig {
        keyframe_interval: 128,
        group: 0,
    };
}

impl Default for EncoderConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The most samples a group may hold (larger `group` settings are cut to
/// this).
pub const MAX_GROUP: u32 = 65_536;

/// Why a record could not be encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncodeError {
    /// The output buffer is too small for the frame.
    BufferFull,
    /// postcard refused the record (should not happen for valid records).
    Serialize,
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::BufferFull => write!(f, "output buffer too small for the frame"),
            EncodeError::Serialize => write!(f, "record could not be serialised"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for EncodeError {}

/// A postcard flavor that appends `crc32(bytes) ^ xor` and reports the plain
/// CRC.
struct CrcXor<'c, B: Flavor> {
    flav: B,
    digest: crc::Digest<'static, u32>,
    xor: u32,
    plain: &'c mut u32,
}

impl<B: Flavor> Flavor for CrcXor<'_, B> {
    type Output = B::Output;

    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.digest.update(&[data]);
        self.flav.try_push(data)
    }

    fn finalize(mut self) -> postcard::Result<B::Output> {
        let crc = self.digest.finalize();
        *self.plain = crc;
        for b in (crc ^ self.xor).to_le_bytes() {
            self.flav.try_push(b)?;
        }
        self.flav.finalize()
    }
}

/// Encodes records into frames. Keeps the per-task delta state for samples
/// in `N` slots (slot = tid mod `N`; a task whose slot holds another task
/// starts with a keyframe).
///
/// ```
/// use sampler::wire::{Encoder, Record, End, MAX_FRAME};
/// let mut enc: Encoder<16> = Encoder::new(Default::default());
/// let mut buf = [0u8; MAX_FRAME];
/// let n = enc.encode(&Record::End(End::default()), &mut buf).unwrap();
/// assert_eq!(buf[n - 1], 0, "frames end with the delimiter");
/// ```
pub struct Encoder<const N: usize = 16> {
    config: EncoderConfig,
    tasks: [Option<TaskRef>; N],
    frames: u64,
    group: GroupWriter,
    /// CRC-32C of group frames ([`Encoder::set_frame_crc`]).
    crc: fn(u32, &[u8]) -> u32,
}

/// The encoder's group state: the models, the open frame and where the
/// stream stands.
struct GroupWriter {
    models: GroupModels,
    rc: RcEncoder,
    /// The open frame's head (`count` 0: no frame open).
    head: GroupHead,
    /// Whether a group is under way (else the next sample starts one).
    open: bool,
    /// Samples and coded bytes of the group so far.
    samples: u32,
    bytes: usize,
    /// The next sample's stream index.
    next: u64,
    /// The time of the open frame's first sample.
    since: u64,
    /// Scratch for the coder's unused output side.
    scratch: Sample,
}

impl GroupWriter {
    const NEW: GroupWriter = GroupWriter {
        models: GroupModels::NEW,
        rc: RcEncoder::new(),
        head: GroupHead {
            group: 0,
            seq: 0,
            first: 0,
            count: 0,
        },
        open: false,
        samples: 0,
        bytes: 0,
        next: 0,
        since: 0,
        scratch: Sample::EMPTY,
    };
}

/// Why [`Encoder::put`] or [`Encoder::flush`] stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutError<E> {
    /// A record did not fit the frame buffer (it is dropped).
    Encode(EncodeError),
    /// The writer failed.
    Write(E),
}

impl<const N: usize> core::fmt::Debug for Encoder<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Encoder")
            .field("config", &self.config)
            .field("frames", &self.frames)
            .finish_non_exhaustive()
    }
}

impl<const N: usize> Encoder<N> {
    /// A new encoder with empty delta state. A `const fn`, so a static
    /// encoder is built in place (it holds the group models: about 85 KiB).
    pub const fn new(config: EncoderConfig) -> Self {
        assert!(N > 0, "an encoder needs at least one task slot");
        Encoder {
            config,
            tasks: [const { None }; N],
            frames: 0,
            group: GroupWriter::NEW,
            crc: crc32c_append,
        }
    }

    /// Changes the settings and forgets all state, in place. Call it
    /// before the first record.
    pub fn configure(&mut self, config: EncoderConfig) {
        self.config = config;
        self.reset();
        self.group.head = GroupHead::default();
    }

    /// Computes the CRC-32C of group frames with `f` (`f(crc, data)`: the
    /// CRC-32C of what `crc` was the CRC-32C of followed by `data`),
    /// such as a CPU instruction's, instead of the crate's own; a frame
    /// per sample is framed the crate's way whatever this says.
    pub fn set_frame_crc(&mut self, f: fn(u32, &[u8]) -> u32) {
        self.crc = f;
    }

    /// Frames written so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Forgets all delta state: the next sample of every task is a keyframe
    /// and the next sample starts a new group. Call it when the stream
    /// restarts (e.g. a new Hello). An open group frame is dropped: write
    /// it first ([`flush`](Self::flush)).
    pub fn reset(&mut self) {
        self.tasks.iter_mut().for_each(|t| *t = None);
        let g = &mut self.group;
        g.open = false;
        g.head.count = 0;
        g.next = 0;
    }

    /// Whether samples wait in an open group frame.
    pub fn pending(&self) -> bool {
        self.group.head.count > 0
    }

    /// Writes `record` with `write`, one frame at a time, and returns the
    /// frames written. Without groups it is [`encode`](Self::encode) and
    /// one write. With groups a sample joins the open group frame, which
    /// is written when it is full or its group ends; any other record
    /// first writes the open frame, so records stay in order. A Hello also
    /// ends the group.
    pub fn put<E, W: FnMut(&[u8]) -> Result<(), E> + ?Sized>(
        &mut self,
        record: &Record,
        buf: &mut [u8],
        write: &mut W,
    ) -> Result<usize, PutError<E>> {
        let Record::Sample(s) = record else {
            let mut frames = self.flush(buf, write)?;
            let n = self.encode(record, buf).map_err(PutError::Encode)?;
            write(&buf[..n]).map_err(PutError::Write)?;
            frames += 1;
            return Ok(frames);
        };
        if self.config.group == 0 {
            let n = self.encode(record, buf).map_err(PutError::Encode)?;
            write(&buf[..n]).map_err(PutError::Write)?;
            return Ok(1);
        }
        let mut frames = 0;
        let need = bound(s).unwrap_or(usize::MAX);
        if need > FRAME_CODED_MAX {
            // Too large for a group frame (a full callchain, branch stack
            // and both register sets at once), or a register set that is
            // not well formed: a plain keyframe, outside the group.
            frames += self.flush(buf, write)?;
            let n = self.encode_plain_key(s, buf).map_err(PutError::Encode)?;
            write(&buf[..n]).map_err(PutError::Write)?;
            return Ok(frames + 1);
        }
        let g = &mut self.group;
        let size = g.rc.size();
        if g.head.count > 0 && (size >= FRAME_TARGET || size + need > FRAME_CODED_MAX) {
            frames += self.flush(buf, write)?;
        }
        let g = &mut self.group;
        if g.head.count == 0 {
            if !g.open {
                g.models.reset();
                g.open = true;
                g.head.group = g.head.group.wrapping_add(1);
                g.head.seq = 0;
                g.samples = 0;
                g.bytes = 0;
            }
            g.rc.restart();
            g.head.first = g.next;
            g.since = s.time;
        }
        code_sample(&mut g.rc, &mut g.models, s, &mut g.scratch);
        g.head.count += 1;
        g.samples += 1;
        g.next += 1;
        if g.samples >= self.config.group.min(MAX_GROUP) || g.bytes + g.rc.size() >= GROUP_MAX_BYTES
        {
            frames += self.flush(buf, write)?;
            self.group.open = false;
        }
        Ok(frames)
    }

    /// Writes the open group frame, if any; returns the frames written (0
    /// or 1).
    pub fn flush<E, W: FnMut(&[u8]) -> Result<(), E> + ?Sized>(
        &mut self,
        buf: &mut [u8],
        write: &mut W,
    ) -> Result<usize, PutError<E>> {
        let g = &mut self.group;
        if g.head.count == 0 {
            return Ok(0);
        }
        g.rc.finish();
        let head = g.head;
        g.head.count = 0;
        g.head.seq = g.head.seq.wrapping_add(1);
        g.bytes += g.rc.len;
        if g.rc.overflow {
            // Cannot happen (`bound` holds every sample), but if it did the
            // frame's samples would be lost: the group ends here, and the
            // decoder counts them from the gap.
            g.open = false;
            return Err(PutError::Encode(EncodeError::BufferFull));
        }
        let n = write_group_frame(&head, &g.rc.out[..g.rc.len], buf, self.crc)
            .map_err(PutError::Encode)?;
        self.frames += 1;
        write(&buf[..n]).map_err(PutError::Write)?;
        Ok(1)
    }

    /// Writes the open group frame if its first sample is `age` ns or more
    /// older than `now`: what the drain calls when it finds the rings
    /// empty, so samples of a quiet stream do not wait long.
    pub fn flush_older<E, W: FnMut(&[u8]) -> Result<(), E> + ?Sized>(
        &mut self,
        now: u64,
        age: u64,
        buf: &mut [u8],
        write: &mut W,
    ) -> Result<usize, PutError<E>> {
        if self.group.head.count > 0 && now.saturating_sub(self.group.since) >= age {
            self.flush(buf, write)
        } else {
            Ok(0)
        }
    }

    /// A sample as a keyframe of its own, leaving the delta state alone.
    fn encode_plain_key(&mut self, s: &Sample, out: &mut [u8]) -> Result<usize, EncodeError> {
        let wire = encode_sample(s, None);
        let (n, _) = write_frame(&WireRecordRef::Sample(&wire), 0, out)?;
        self.frames += 1;
        Ok(n)
    }

    /// Encodes `record` as one complete frame (delimiter included) at the
    /// start of `out` and returns its length. On error nothing changes,
    /// including the delta state.
    pub fn encode(&mut self, record: &Record, out: &mut [u8]) -> Result<usize, EncodeError> {
        let (n, _) = match record {
            Record::Sample(s) => {
                let slot = s.tid as usize % N;
                let interval = self.config.keyframe_interval.max(1);
                let reference = self.tasks[slot]
                    .as_ref()
                    .filter(|r| r.tid == s.tid && r.since_key + 1 < interval);
                let wire = encode_sample(s, reference);
                let xor = reference.map_or(0, |r| r.chain);
                let since_key = reference.map_or(0, |r| r.since_key + 1);
                let (n, plain) = write_frame(&WireRecordRef::Sample(&wire), xor, out)?;
                let chain = CRC32.checksum(&chain_input(xor, plain, since_key));
                self.tasks[slot] = Some(TaskRef::after(s, chain, since_key));
                (n, plain)
            }
            Record::Hello(h) => {
                let r = write_frame(&WireRecordRef::Hello(h), 0, out)?;
                // A Hello starts a new stream: the decoder drops its delta
                // state (and any group) when it sees one, so the encoder
                // does too.
                self.reset();
                r
            }
            Record::Lost(l) => write_frame(&WireRecordRef::Lost(l), 0, out)?,
            Record::Throttle(t) => write_frame(&WireRecordRef::Throttle(t), 0, out)?,
            Record::Unthrottle(t) => write_frame(&WireRecordRef::Unthrottle(t), 0, out)?,
            Record::Task(t) => write_frame(&WireRecordRef::Task(t), 0, out)?,
            Record::Log(l) => write_frame(&WireRecordRef::Log(l), 0, out)?,
            Record::SelfTest(t) => write_frame(&WireRecordRef::SelfTest(t), 0, out)?,
            Record::End(e) => write_frame(&WireRecordRef::End(e), 0, out)?,
            Record::TaskExit(e) => write_frame(&WireRecordRef::TaskExit(e), 0, out)?,
        };
        self.frames += 1;
        Ok(n)
    }
}

/// Writes one group frame: the tag, the head and the coded bytes, with
/// its CRC, COBS-stuffed and delimited.
fn write_group_frame(
    head: &GroupHead,
    coded: &[u8],
    out: &mut [u8],
    crc: fn(u32, &[u8]) -> u32,
) -> Result<usize, EncodeError> {
    let mut head_buf = [0u8; 32];
    head_buf[0] = GROUP_TAG;
    let head_len = 1 + postcard::to_slice(head, &mut head_buf[1..])
        .map_err(|_| EncodeError::Serialize)?
        .len();
    let head_bytes = &head_buf[..head_len];
    // A group frame's bytes are all in hand: CRC and COBS go a slice at a
    // time, several times cheaper than a byte at a time through postcard's
    // flavors (this runs for every group frame the drain writes).
    let crc = crc(crc(0, head_bytes), coded).to_le_bytes();
    let mut w = CobsWriter::new(out).ok_or(EncodeError::BufferFull)?;
    for part in [head_bytes, coded, &crc[..]] {
        w.push(part).ok_or(EncodeError::BufferFull)?;
    }
    w.finish().ok_or(EncodeError::BufferFull)
}

/// COBS framing of bytes pushed a slice at a time, ending with the 0
/// delimiter: the same encoding postcard's `Cobs` flavor writes (a block
/// closes at a zero byte, or after 254 others once more bytes come, as the
/// `cobs` crate does). The crate's own encoder goes a byte at a time
/// through its state machine: on the demo's default samples at G = 256 it
/// cost the drain about 400 more instructions per sample than this, which
/// copies the runs between zeros whole.
struct CobsWriter<'a> {
    out: &'a mut [u8],
    /// Where the open block's code byte goes.
    code_at: usize,
    len: usize,
}

impl<'a> CobsWriter<'a> {
    fn new(out: &'a mut [u8]) -> Option<Self> {
        (!out.is_empty()).then_some(CobsWriter {
            out,
            code_at: 0,
            len: 1,
        })
    }

    /// Closes the open block with `code` and opens the next.
    #[inline]
    fn close(&mut self, code: u8) -> Option<()> {
        *self.out.get_mut(self.code_at)? = code;
        self.code_at = self.len;
        self.len += 1;
        (self.len <= self.out.len()).then_some(())
    }

    fn push(&mut self, mut data: &[u8]) -> Option<()> {
        while !data.is_empty() {
            let run = self.len - self.code_at - 1;
            if run == 254 {
                // A full block closes once more bytes come.
                self.close(0xff)?;
                continue;
            }
            let take = data.len().min(254 - run);
            let (chunk, zero) = match first_zero(&data[..take]) {
                Some(z) => (&data[..z], true),
                None => (&data[..take], false),
            };
            let n = chunk.len();
            self.out
                .get_mut(self.len..self.len + n)?
                .copy_from_slice(chunk);
            self.len += n;
            if zero {
                self.close((run + n + 1) as u8)?;
                data = &data[n + 1..];
            } else {
                data = &data[n..];
            }
        }
        Some(())
    }

    /// Closes the last block and writes the delimiter; the frame's length.
    fn finish(self) -> Option<usize> {
        *self.out.get_mut(self.code_at)? = (self.len - self.code_at) as u8;
        *self.out.get_mut(self.len)? = 0;
        Some(self.len + 1)
    }
}

/// Where the first zero byte of `data` is: eight bytes at a time (a word
/// with a zero byte has the top bit of `b - 1` set where `b` had it
/// clear; a borrow can only mark bytes above the first zero, so the lowest
/// mark is exact).
#[inline]
fn first_zero(data: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const TOPS: u64 = 0x8080_8080_8080_8080;
    let mut words = data.chunks_exact(8);
    let mut at = 0;
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        let w = u64::from_le_bytes(b);
        let marks = w.wrapping_sub(ONES) & !w & TOPS;
        if marks != 0 {
            return Some(at + (marks.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    words
        .remainder()
        .iter()
        .position(|&b| b == 0)
        .map(|p| at + p)
}

/// Writes one frame and returns (frame length, plain CRC of the payload).
fn write_frame(
    rec: &WireRecordRef<'_>,
    xor: u32,
    out: &mut [u8],
) -> Result<(usize, u32), EncodeError> {
    let mut plain = 0;
    let cobs = Cobs::try_new(Slice::new(out)).map_err(|_| EncodeError::BufferFull)?;
    let flavor = CrcXor {
        flav: cobs,
        digest: CRC32.digest(),
        xor,
        plain: &mut plain,
    };
    match postcard::serialize_with_flavor(rec, flavor) {
        Ok(frame) => Ok((frame.len(), plain)),
        Err(postcard::Error::SerializeBufferFull) => Err(EncodeError::BufferFull),
        Err(_) => Err(EncodeError::Serialize),
    }
}

#[cfg(test)]
mod cobs_tests {
    use super::CobsWriter;
    use proptest::prelude::*;

    /// What the `cobs` crate (postcard's `Cobs` flavor) makes of `data`,
    /// with the delimiter.
    fn reference(data: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; cobs::max_encoding_length(data.len()) + 1];
        let n = cobs::encode(data, &mut out);
        out.truncate(n);
        out.push(0);
        out
    }

    fn ours(parts: &[&[u8]]) -> Option<Vec<u8>> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut out = vec![0u8; cobs::max_encoding_length(total) + 1];
        let mut w = CobsWriter::new(&mut out)?;
        for p in parts {
            w.push(p)?;
        }
        let n = w.finish()?;
        out.truncate(n);
        Some(out)
    }

    #[test]
    fn runs_at_the_block_limit_frame_as_the_cobs_crate_does() {
        // A frame always holds its tag, so never nothing.
        for len in [1, 2, 253, 254, 255, 508, 509, 600] {
            for zero_at in [None, Some(0), Some(253), Some(254)] {
                let mut data: Vec<u8> = (0..len).map(|i| (i % 255 + 1) as u8).collect();
                if let Some(z) = zero_at.filter(|&z| z < len) {
                    data[z] = 0;
                }
                for split in [0, 1, len / 2, len] {
                    let (a, b) = data.split_at(split.min(len));
                    assert_eq!(
                        ours(&[a, b]),
                        Some(reference(&data)),
                        "len {len} zero {zero_at:?} split {split}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_full_buffer_is_refused_not_overrun() {
        let data = [7u8; 300];
        let need = reference(&data).len();
        for room in 0..need {
            let mut out = vec![0u8; room];
            let r = CobsWriter::new(&mut out).and_then(|mut w| {
                w.push(&data)?;
                w.finish()
            });
            assert_eq!(r, None, "room {room}");
        }
    }

    proptest! {
        #[test]
        fn the_first_zero_is_found_a_word_at_a_time(
            data in proptest::collection::vec(prop_oneof![Just(0u8), Just(1u8), Just(0x80u8), any::<u8>()], 0..40),
        ) {
            prop_assert_eq!(super::first_zero(&data), data.iter().position(|&b| b == 0));
        }

        #[test]
        fn any_bytes_in_any_pieces_frame_as_the_cobs_crate_does(
            data in proptest::collection::vec(prop_oneof![Just(0u8), any::<u8>(), 1u8..=255], 1..1200),
            cuts in proptest::collection::vec(any::<usize>(), 0..4),
        ) {
            let mut at: Vec<usize> = cuts.iter().map(|c| c % (data.len() + 1)).collect();
            at.sort_unstable();
            let mut parts = Vec::new();
            let mut from = 0;
            for a in at {
                parts.push(&data[from..a]);
                from = a;
            }
            parts.push(&data[from..]);
            prop_assert_eq!(ours(&parts), Some(reference(&data)));
        }
    }
}
