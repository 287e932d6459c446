//! The record decoder behind the frame check: frames of a generated stream
//! whose payloads are mutated and whose check word is then fixed up (the
//! CRC-32C of the new payload, XORed with the frame's original delta chain
//! value), so that postcard, the compact-sample parser and the delta
//! rebuild (and, for streams in sample groups, the group decoder) see
//! hostile bytes that pass the CRC. Never panics; frames before
//! the first mutated one decode to exactly what was sent; counters stay
//! consistent.

#![no_main]

use arbitrary::{Arbitrary, Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use perch_fuzz_input::damage::Damage;
use perch_fuzz_input::wire::{encode, encoder_config, records, records_per_frame};
use sampler::wire::{Decoder, EncoderConfig, Record};

#[derive(Debug)]
struct Input {
    records: Vec<Record>,
    config: EncoderConfig,
    /// (frame index, change to its payload).
    edits: Vec<(u8, Damage)>,
}

impl<'a> Arbitrary<'a> for Input {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        Ok(Input {
            config: encoder_config(u)?,
            edits: u.arbitrary()?,
            records: records(u)?,
        })
    }
}

fuzz_target!(|input: Input| {
    let (bytes, frames) = encode(&input.records, input.config);
    // A group frame carries several samples.
    let per_frame = records_per_frame(&bytes, &frames);
    assert_eq!(per_frame.iter().sum::<usize>(), input.records.len());
    let mut payloads: Vec<(Vec<u8>, u32)> = frames
        .iter()
        .map(|f| {
            let framed = &bytes[f.start..f.end - 1];
            let mut plain = cobs::decode_vec(framed).expect("the encoder's COBS decodes");
            let crc = plain.split_off(plain.len() - 4);
            let stored = u32::from_le_bytes(crc.try_into().unwrap());
            let chain = stored ^ crc32c::crc32c(&plain);
            (plain, chain)
        })
        .collect();
    let mut first_edit = payloads.len();
    for &(frame, d) in input.edits.iter().take(8) {
        if payloads.is_empty() {
            break;
        }
        let i = usize::from(frame) % payloads.len();
        let before = payloads[i].0.clone();
        d.apply(&mut payloads[i].0);
        if payloads[i].0 != before {
            first_edit = first_edit.min(i);
        }
    }
    let mut stream = vec![0u8];
    for (payload, chain) in &payloads {
        let mut plain = payload.clone();
        plain.extend_from_slice(&(crc32c::crc32c(payload) ^ chain).to_le_bytes());
        stream.extend_from_slice(&cobs::encode_vec(&plain));
        stream.push(0);
    }

    let mut dec = Box::new(Decoder::new());
    let mut got = Vec::new();
    let mut errors = 0u64;
    dec.push(&stream, |r| match r {
        Ok(r) => got.push(r),
        Err(_) => errors += 1,
    });
    let stats = dec.stats();
    // Every frame that decoded gave at least one record (a group frame,
    // which an edit can also make, gives several).
    assert!(stats.frames_ok <= got.len() as u64);
    // Every frame is decoded, one bad frame or one ignored frame.
    assert_eq!(
        stats.frames_ok + stats.bad_frames + stats.frames_ignored,
        payloads.len() as u64
    );
    assert!(errors <= stats.frames_ignored);
    let intact: usize = per_frame[..first_edit].iter().sum();
    assert!(
        got.len() >= intact,
        "the frames before the first mutated one decode"
    );
    assert_eq!(
        got[..intact],
        input.records[..intact],
        "frames before the first mutated one decode to what was sent"
    );
    if first_edit == payloads.len() {
        assert_eq!(got, input.records);
    }
});
