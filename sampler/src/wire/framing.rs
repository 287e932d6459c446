//! The framing stage's internals, for the fuzz targets in `fuzz/` (feature
//! `fuzzing`): the frames a [`Framer`] completes, and the two COBS decoders
//! it uses (the one-pass scan of a frame at the start of a chunk and the
//! general one), so a target can hold them to a reference. Not a stable API.

use super::MAX_FRAME;
use super::decoder::{COBS_SLACK, Scan, cobs_decode_to, cobs_scan_to};
use super::{Framer, decoder::Frame};

/// One frame as the framing stage hands it to the record stage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawFrame {
    /// The COBS-decoded bytes before the CRC word (never empty).
    pub payload: Vec<u8>,
    /// The CRC word stored in the frame.
    pub stored: u32,
    /// The CRC-32C of `payload`.
    pub plain: u32,
    /// The frame's length on the wire, delimiter excluded.
    pub len: usize,
}

impl From<Frame<'_>> for RawFrame {
    fn from(f: Frame<'_>) -> Self {
        let (payload, stored, plain, len) = f.parts();
        RawFrame {
            payload: payload.to_vec(),
            stored,
            plain,
            len,
        }
    }
}

/// Feeds `chunk` to `framer`, calling `sink` with every frame it completes.
pub fn push_frames(framer: &mut Framer, chunk: &[u8], mut sink: impl FnMut(RawFrame)) {
    framer.push(chunk, |f| sink(RawFrame::from(f)));
}

/// The general COBS decoder of one frame without its delimiter: the decoded
/// bytes, or `None` when the frame is malformed or longer than
/// [`MAX_FRAME`].
pub fn cobs_decode(src: &[u8]) -> Option<Vec<u8>> {
    let mut dst = Box::new([0u8; MAX_FRAME + COBS_SLACK]);
    cobs_decode_to(src, &mut dst).map(|n| dst[..n].to_vec())
}

/// The one-pass scan of the frame at the start of `src`: the delimiter's
/// index and the decoded bytes, or `None` when it leaves the frame to the
/// general path.
pub fn cobs_scan(src: &[u8]) -> Option<(usize, Vec<u8>)> {
    let mut dst = Box::new([0u8; MAX_FRAME + COBS_SLACK]);
    match cobs_scan_to(src, &mut dst) {
        Scan::Decoded { end, n } => Some((end, dst[..n].to_vec())),
        Scan::Open => None,
    }
}
