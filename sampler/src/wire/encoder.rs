//! The frame encoder: record -> postcard -> CRC-32C -> COBS, into a caller's
//! buffer. `no_std`, no allocation; it runs in the drain loop, never in NMI
//! context.

use core::fmt;

use postcard::ser_flavors::{Cobs, Flavor, Slice};

use super::codec::{TaskRef, chain_input, encode_sample};
use super::{Record, WireRecordRef};

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
}

impl Default for EncoderConfig {
    fn default() -> Self {
        EncoderConfig {
            keyframe_interval: 128,
        }
    }
}

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
    /// A new encoder with empty delta state.
    pub fn new(config: EncoderConfig) -> Self {
        assert!(N > 0, "an encoder needs at least one task slot");
        Encoder {
            config,
            tasks: core::array::from_fn(|_| None),
            frames: 0,
        }
    }

    /// Frames written so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Forgets all delta state: the next sample of every task is a keyframe.
    /// Call it when the stream restarts (e.g. a new Hello).
    pub fn reset(&mut self) {
        self.tasks.iter_mut().for_each(|t| *t = None);
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
                // state when it sees one, so the encoder does too.
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
