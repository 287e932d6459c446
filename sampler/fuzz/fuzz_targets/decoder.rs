//! Fuzzes the stream decoder: arbitrary bytes, fed in arbitrary chunks,
//! must never panic, never yield a record from a frame that fails its
//! checks, and keep its counters consistent.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sampler::wire::Decoder;

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(split).max(1);
    let mut dec = Box::new(Decoder::new());
    let mut records = 0u64;
    for part in rest.chunks(chunk) {
        dec.push(part, |r| {
            if r.is_ok() {
                records += 1;
            }
        });
    }
    let stats = dec.stats();
    assert_eq!(stats.frames_ok, records);
    assert!(stats.unresolved_samples <= stats.bad_frames);
    assert!(stats.bytes_skipped <= rest.len() as u64);
    // Every frame needs at least 6 bytes plus its delimiter.
    assert!(records * 7 <= rest.len() as u64 + 1);
});
