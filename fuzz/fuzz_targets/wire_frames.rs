//! The frame scanner: arbitrary bytes, fed in arbitrary chunks, split into
//! exactly the frames a plain reference finds (split at every `0x00`, COBS
//! undone by the `cobs` crate, frames over `MAX_FRAME` or without room for
//! a CRC refused), with the same payloads, CRC words and skipped-byte
//! counts; the one-pass COBS scan agrees with the general decoder and with
//! the reference wherever it decodes; and the whole decoder never panics
//! and keeps its counters consistent.

#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use perch_fuzz_input::damage::chunks;
use sampler::wire::framing::{RawFrame, cobs_decode, cobs_scan, push_frames};
use sampler::wire::{Decoder, Framer, MAX_FRAME};

#[derive(Debug, Arbitrary)]
struct Input {
    /// Read sizes; none: one read.
    sizes: Vec<u16>,
    /// The line's bytes.
    bytes: Vec<u8>,
}

/// The reference COBS decoder of one frame (no zero bytes in it).
fn reference_cobs(src: &[u8]) -> Option<Vec<u8>> {
    if src.is_empty() || src.len() > MAX_FRAME {
        return None;
    }
    let mut buf = src.to_vec();
    let n = cobs::decode_in_place(&mut buf).ok()?;
    buf.truncate(n);
    Some(buf)
}

fuzz_target!(|input: Input| {
    let bytes = &input.bytes;

    // The reference: every delimited run is a frame or a refusal.
    let mut want = Vec::new();
    let mut want_bad = 0u64;
    let mut want_skipped = 0u64;
    let mut segments: Vec<&[u8]> = bytes.split(|&b| b == 0).collect();
    segments.pop(); // not delimited yet
    for seg in segments {
        if seg.is_empty() {
            continue;
        }
        match reference_cobs(seg) {
            Some(d) if d.len() >= 5 => {
                let (payload, crc) = d.split_at(d.len() - 4);
                want.push(RawFrame {
                    payload: payload.to_vec(),
                    stored: u32::from_le_bytes(crc.try_into().unwrap()),
                    plain: crc32c::crc32c(payload),
                    len: seg.len(),
                });
            }
            _ => {
                want_bad += 1;
                want_skipped += seg.len() as u64 + 1;
            }
        }
    }

    let mut framer = Box::new(Framer::new());
    let mut got = Vec::new();
    for chunk in chunks(bytes, &input.sizes) {
        push_frames(&mut framer, chunk, |f| got.push(f));
    }
    assert_eq!(got, want);
    let stats = framer.stats();
    assert_eq!(stats.bad_frames, want_bad);
    assert_eq!(stats.bytes_skipped, want_skipped);

    // The one-pass scan against the general decoder and the reference, at
    // every frame start.
    let mut start = 0;
    while start < bytes.len() {
        let rest = &bytes[start..];
        if let Some((end, decoded)) = cobs_scan(rest) {
            assert_eq!(rest[end], 0, "the scan ends at a delimiter");
            assert!(
                !rest[..end].contains(&0),
                "the scan stops at the first delimiter"
            );
            if end > 0 {
                assert_eq!(cobs_decode(&rest[..end]).as_ref(), Some(&decoded));
                assert_eq!(reference_cobs(&rest[..end]).as_ref(), Some(&decoded));
            }
        }
        let next = rest
            .iter()
            .position(|&b| b == 0)
            .map_or(rest.len(), |i| i + 1);
        let seg = &rest[..next.min(rest.len())];
        let seg = seg.strip_suffix(&[0]).unwrap_or(seg);
        if seg.len() <= MAX_FRAME {
            assert_eq!(cobs_decode(seg), reference_cobs(seg));
        }
        start += next;
    }

    // The whole decoder: never panics, counters consistent.
    let mut dec = Box::new(Decoder::new());
    let mut records = 0u64;
    for chunk in chunks(bytes, &input.sizes) {
        dec.push(chunk, |r| records += u64::from(r.is_ok()));
    }
    let stats = dec.stats();
    assert_eq!(stats.frames_ok, records);
    assert!(
        stats.frames_ok + stats.bad_frames + stats.frames_ignored <= want.len() as u64 + want_bad
    );
    assert!(stats.unresolved_samples <= stats.bad_frames);
    assert!(stats.bytes_skipped <= bytes.len() as u64);
});
