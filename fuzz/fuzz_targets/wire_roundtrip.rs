//! The wire round trip: a generated record stream (Hello, then samples
//! mostly close to their task's previous one, and every other record)
//! encodes and decodes back to exactly the records sent, whatever the read
//! sizes; after line damage (flipped bits, dropped and inserted bytes,
//! spurious delimiters, a cut), what still decodes is a subsequence of what
//! was sent: a damaged frame never yields a record, least of all a sample,
//! that differs from the encoded one.

#![no_main]

use arbitrary::{Arbitrary, Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use perch_fuzz_input::damage::{Damage, chunks};
use perch_fuzz_input::wire::{encode, encoder_config, records};
use sampler::wire::{Decoder, EncoderConfig, Record};

#[derive(Debug)]
struct Input {
    records: Vec<Record>,
    config: EncoderConfig,
    sizes: Vec<u16>,
    damage: Vec<Damage>,
}

impl<'a> Arbitrary<'a> for Input {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        Ok(Input {
            config: encoder_config(u)?,
            sizes: u.arbitrary()?,
            damage: u.arbitrary()?,
            records: records(u)?,
        })
    }
}

fn decode(bytes: &[u8], sizes: &[u16]) -> (Vec<Record>, sampler::wire::DecoderStats) {
    let mut dec = Box::new(Decoder::new());
    let mut got = Vec::new();
    for chunk in chunks(bytes, sizes) {
        dec.push(chunk, |r| match r {
            Ok(r) => got.push(r),
            Err(e) => panic!("a stream of this version gave {e}"),
        });
    }
    (got, dec.stats())
}

fuzz_target!(|input: Input| {
    let (bytes, _) = encode(&input.records, input.config);
    let (got, stats) = decode(&bytes, &input.sizes);
    assert_eq!(got, input.records, "decode(encode(x)) == x");
    assert_eq!(stats.bad_frames, 0);
    assert_eq!(stats.bytes_skipped, 0);

    let mut damaged = bytes.clone();
    for d in input.damage.iter().take(8) {
        d.apply(&mut damaged);
    }
    let (got, stats) = decode(&damaged, &input.sizes);
    // Every frame that decoded gave at least one record (a group frame
    // several).
    assert!(stats.frames_ok <= got.len() as u64);
    // Greedy matching decides whether `got` is a subsequence of the sent
    // records.
    let mut sent = input.records.iter();
    for (i, r) in got.iter().enumerate() {
        assert!(
            sent.any(|s| s == r),
            "decoded record {i} was not sent (or not in this order): {r:?}"
        );
    }
});
