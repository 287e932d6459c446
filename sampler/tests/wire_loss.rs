//! Exhaustive single-frame loss over a long capture: for every sample
//! frame, the stream is decoded without it, and no decoded sample may
//! differ from the sample the target took at that time. The workload is
//! the hard case for a delta chain: tasks that hop between a few hot
//! addresses at a steady rate, so many delta frames carry byte-identical
//! payloads.

mod long_capture;

use long_capture::{capture, feed, payload};
use sampler::wire::Decoder;

/// Sample frames in the capture.
const SAMPLES: usize = 8000;

#[test]
fn no_single_frame_loss_yields_a_bogus_sample() {
    let cap = capture(SAMPLES);
    // The intact stream decodes completely and exactly.
    let mut dec = Decoder::new();
    let (mut all, mut bogus) = (0, 0);
    for f in &cap.frames {
        let (n, b) = feed(&mut dec, f, &cap.taken);
        all += n;
        bogus += b;
    }
    assert_eq!((all, bogus), (SAMPLES as u64, 0));

    // The hard case is really there: delta frames whose payload repeats.
    let mut payloads = std::collections::HashSet::new();
    let repeats = cap
        .frames
        .iter()
        .zip(&cap.sample_frames)
        .filter(|(f, s)| matches!(s, Some((_, false))) && !payloads.insert(payload(f)))
        .count();
    assert!(
        repeats > SAMPLES / 4,
        "only {repeats} repeated delta frames"
    );

    // Drop each sample frame in turn. Up to the dropped frame the decoder
    // is the intact one (a snapshot); after it, only the dropped frame's
    // task is affected, and once that task's next keyframe is through the
    // decoder's state is the intact one again, so decoding stops there.
    let mut prefix = Decoder::new();
    let (mut bogus_total, mut unresolved, mut positions) = (0u64, 0u64, 0u64);
    let mut bad_positions = Vec::new();
    for (i, f) in cap.frames.iter().enumerate() {
        if let Some((tid, _)) = cap.sample_frames[i] {
            positions += 1;
            let mut dec = prefix.clone();
            let before = dec.stats().unresolved_samples;
            let mut bogus = 0;
            for (j, g) in cap.frames.iter().enumerate().skip(i + 1) {
                bogus += feed(&mut dec, g, &cap.taken).1;
                if cap.sample_frames[j] == Some((tid, true)) {
                    break;
                }
            }
            unresolved += dec.stats().unresolved_samples - before;
            if bogus > 0 {
                bad_positions.push(i);
            }
            bogus_total += bogus;
        }
        feed(&mut prefix, f, &cap.taken);
    }
    assert_eq!(positions, SAMPLES as u64);
    assert!(
        bogus_total == 0,
        "{bogus_total} bogus samples from {} of {positions} loss positions (first {:?})",
        bad_positions.len(),
        &bad_positions[..bad_positions.len().min(8)]
    );
    // The samples a loss cost are counted, not silently dropped.
    assert!(unresolved > 0);
}
