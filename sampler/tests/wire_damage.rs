//! A damaged line over a long capture (100,000 samples): random bit errors
//! at 1e-4 and 1e-3, bursts of noise, dropped chunks and duplicated chunks.
//! For each, every intact frame must come out of the decoder, either as
//! its sample or as a counted unresolved delta (a correct frame whose
//! reference, an earlier frame of its task, was damaged); no sample may
//! differ from what the target took; and the damage must be counted.
//! Run with `--nocapture` to see the numbers: with the delta chain, one
//! damaged frame makes its task's deltas unresolved until the next
//! keyframe, so at 1e-4 most intact deltas are counted rather than
//! rebuilt. The same damage over the capture in sample groups is at the
//! end.

mod long_capture;

use std::collections::HashSet;

use long_capture::{Capture, capture, capture_grouped};
use sampler::wire::group::{GROUP_TAG, GroupHead};
use sampler::wire::{Decoder, Record};

/// Sample frames in the capture.
const SAMPLES: usize = 100_000;

/// xorshift64: deterministic damage, the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A uniform float in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The capture as one byte stream, with each frame's byte range.
struct Stream {
    bytes: Vec<u8>,
    /// `[start, end)` of frame `i` (its delimiter is the last byte).
    ranges: Vec<(usize, usize)>,
}

fn stream(cap: &Capture) -> Stream {
    let mut bytes = Vec::new();
    let mut ranges = Vec::new();
    for f in &cap.frames {
        let start = bytes.len();
        bytes.extend_from_slice(f);
        ranges.push((start, bytes.len()));
    }
    Stream { bytes, ranges }
}

/// What came out of the decoder.
#[derive(Debug, Default)]
struct Outcome {
    samples: u64,
    bogus: u64,
    duplicates: u64,
    unresolved: u64,
    bad_frames: u64,
    /// Samples of group frames counted lost.
    group_lost: u64,
}

/// Decodes `bytes` in chunks of 1..=4096 bytes (as reads from a line
/// return them) and checks every sample against what was taken.
fn decode(bytes: &[u8], cap: &Capture, rng: &mut Rng) -> Outcome {
    let mut dec = Decoder::new();
    let mut out = Outcome::default();
    let mut seen = HashSet::new();
    let mut i = 0;
    while i < bytes.len() {
        let n = (1 + rng.next() % 4096) as usize;
        let chunk = &bytes[i..(i + n).min(bytes.len())];
        i += chunk.len();
        dec.push_ref(chunk, |r| {
            if let Ok(Record::Sample(s)) = r {
                out.samples += 1;
                if cap.taken.get(&(s.tid, s.time)) != Some(s) {
                    out.bogus += 1;
                } else if !seen.insert((s.tid, s.time)) {
                    out.duplicates += 1;
                }
            }
        });
    }
    let st = dec.stats();
    out.unresolved = st.unresolved_samples;
    out.bad_frames = st.bad_frames;
    out.group_lost = st.group_samples_lost;
    out
}

/// Sample frames whose bytes, and the delimiter before them, all arrived
/// unchanged and in place (`intact(range)` says so for a byte range).
fn intact_samples(cap: &Capture, s: &Stream, intact: impl Fn(usize, usize) -> bool) -> u64 {
    s.ranges
        .iter()
        .enumerate()
        .filter(|&(i, &(a, b))| cap.sample_frames[i].is_some() && a > 0 && intact(a - 1, b))
        .count() as u64
}

/// The checks every damage model must pass.
fn check(what: &str, out: &Outcome, intact: u64, damaged: bool) {
    println!(
        "{what}: {} samples ({} intact sample frames), {} unresolved, {} bad frames, \
         {} duplicates, {} bogus",
        out.samples, intact, out.unresolved, out.bad_frames, out.duplicates, out.bogus
    );
    assert_eq!(out.bogus, 0, "{what}: bogus samples");
    assert!(
        out.samples - out.duplicates + out.unresolved >= intact,
        "{what}: {} recovered + {} unresolved < {intact} intact sample frames",
        out.samples - out.duplicates,
        out.unresolved
    );
    if damaged {
        assert!(out.bad_frames > 0, "{what}: damage went uncounted");
        assert!(
            out.samples - out.duplicates < SAMPLES as u64,
            "{what}: every sample survived the damage"
        );
    }
}

/// Flips each bit with probability `ber`; returns the damaged stream and
/// the positions of the bytes it changed.
fn bit_errors(bytes: &[u8], ber: f64, rng: &mut Rng) -> (Vec<u8>, Vec<usize>) {
    let mut out = bytes.to_vec();
    let mut hit = Vec::new();
    let bits = bytes.len() * 8;
    // Geometric gaps between errors.
    let mut pos = 0usize;
    loop {
        let gap = ((1.0 - rng.unit()).ln() / (1.0 - ber).ln()).floor() as usize;
        pos += gap;
        if pos >= bits {
            break;
        }
        out[pos / 8] ^= 1 << (pos % 8);
        hit.push(pos / 8);
        pos += 1;
    }
    (out, hit)
}

fn touched(hits: &[usize]) -> impl Fn(usize, usize) -> bool + '_ {
    // `hits` is ascending: a range is intact when no hit falls inside.
    move |a, b| {
        let i = hits.partition_point(|&h| h < a);
        i == hits.len() || hits[i] >= b
    }
}

#[test]
fn random_bit_errors_yield_no_bogus_sample_and_count_every_loss() {
    let cap = capture(SAMPLES);
    let s = stream(&cap);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // The intact line decodes completely.
    let clean = decode(&s.bytes, &cap, &mut rng);
    check(
        "intact",
        &clean,
        intact_samples(&cap, &s, |_, _| true),
        false,
    );
    assert_eq!(clean.samples, SAMPLES as u64);
    for ber in [1e-4, 1e-3] {
        let (bytes, hits) = bit_errors(&s.bytes, ber, &mut rng);
        assert!(!hits.is_empty());
        let out = decode(&bytes, &cap, &mut rng);
        let intact = intact_samples(&cap, &s, touched(&hits));
        check(&format!("BER {ber:e}"), &out, intact, true);
    }
}

/// A burst of 16..=256 random bytes about every 64 KiB; returns the
/// damaged stream and the positions of the bytes it changed.
fn bursts(bytes: &[u8], rng: &mut Rng) -> (Vec<u8>, Vec<usize>) {
    let mut out = bytes.to_vec();
    let mut hits = Vec::new();
    let mut at = 0usize;
    loop {
        at += 32 * 1024 + (rng.next() % (64 * 1024)) as usize;
        let len = 16 + (rng.next() % 241) as usize;
        if at + len >= out.len() {
            break;
        }
        for (k, b) in out[at..at + len].iter_mut().enumerate() {
            let v = rng.next() as u8;
            if v != *b {
                *b = v;
                hits.push(at + k);
            }
        }
    }
    (out, hits)
}

#[test]
fn bursts_of_noise_yield_no_bogus_sample() {
    let cap = capture(SAMPLES);
    let s = stream(&cap);
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let (bytes, hits) = bursts(&s.bytes, &mut rng);
    let out = decode(&bytes, &cap, &mut rng);
    check(
        "bursts",
        &out,
        intact_samples(&cap, &s, touched(&hits)),
        true,
    );
}

/// Cuts the stream into chunks of 1..=4096 bytes, as a line's reads would
/// return them; `keep(rng)` says how many copies of each chunk arrive (0
/// drops it, 2 duplicates it). Returns the new stream and, for each
/// original byte, whether it arrived exactly once and in its place
/// relative to its neighbours.
fn rechunk(bytes: &[u8], rng: &mut Rng, keep: impl Fn(&mut Rng) -> usize) -> (Vec<u8>, Vec<bool>) {
    let mut out = Vec::with_capacity(bytes.len());
    let mut clean = vec![true; bytes.len()];
    let mut i = 0;
    while i < bytes.len() {
        let n = ((1 + rng.next() % 4096) as usize).min(bytes.len() - i);
        let copies = keep(rng);
        if copies != 1 {
            // The chunk, and the byte before it, no longer sit where they did.
            for c in clean.iter_mut().take(i + n).skip(i.saturating_sub(1)) {
                *c = false;
            }
            if let Some(c) = clean.get_mut(i + n) {
                *c = false;
            }
        }
        for _ in 0..copies {
            out.extend_from_slice(&bytes[i..i + n]);
        }
        i += n;
    }
    (out, clean)
}

#[test]
fn dropped_and_duplicated_chunks_yield_no_bogus_sample() {
    let cap = capture(SAMPLES);
    let s = stream(&cap);
    let mut rng = Rng(0x853c_49e6_748f_ea9b);
    for (what, copies) in [("dropped chunks", 0usize), ("duplicated chunks", 2)] {
        let (bytes, clean) = rechunk(&s.bytes, &mut rng, |r| {
            if r.next() % 100 == 0 { copies } else { 1 }
        });
        let out = decode(&bytes, &cap, &mut rng);
        let intact = intact_samples(&cap, &s, |a, b| clean[a..b].iter().all(|&c| c));
        check(what, &out, intact, copies == 0);
        if copies == 2 {
            // A replayed delta frame no longer matches its task's state: only
            // a replayed keyframe can repeat a sample, and it repeats it
            // exactly.
            assert!(
                out.duplicates < SAMPLES as u64 / 100,
                "{} duplicates",
                out.duplicates
            );
        }
    }
}

// Sample groups (`wire_group=N`): the same damage over the same capture
// coded in groups. A group frame decodes when it and every earlier frame
// of its group arrived intact; everything else of a hit group is counted,
// never decoded against the wrong models.

/// Samples in group frames that must decode: the frame, the delimiter
/// before it and every earlier frame of its group arrived intact.
fn decodable_in_groups(cap: &Capture, s: &Stream, intact: impl Fn(usize, usize) -> bool) -> u64 {
    let mut whole_group = None;
    let mut n = 0;
    for (i, &(a, b)) in s.ranges.iter().enumerate().skip(1) {
        let p = long_capture::payload(&cap.frames[i]);
        if p.first() != Some(&GROUP_TAG) {
            continue;
        }
        let (h, _) = postcard::take_from_bytes::<GroupHead>(&p[1..]).unwrap();
        let whole = intact(a - 1, b);
        if h.seq == 0 {
            whole_group = whole.then_some(h.group);
        } else if !whole {
            whole_group = None;
        }
        if whole_group == Some(h.group) {
            n += u64::from(h.count);
        }
    }
    n
}

/// What decoding a damaged grouped stream must give: no wrong sample,
/// every decodable sample, and the damage counted.
fn check_groups(what: &str, out: &Outcome, stats_lost: u64, decodable: u64, damaged: bool) -> f64 {
    let unique = out.samples - out.duplicates;
    let share = unique as f64 / SAMPLES as f64;
    println!(
        "{what}: {unique} samples decoded ({:.2}%), {decodable} decodable, {stats_lost} counted lost, \
         {} bad frames, {} duplicates, {} bogus",
        100.0 * share,
        out.bad_frames,
        out.duplicates,
        out.bogus
    );
    assert_eq!(out.bogus, 0, "{what}: bogus samples");
    assert_eq!(
        out.duplicates, 0,
        "{what}: a replayed frame was decoded twice"
    );
    assert!(
        unique >= decodable,
        "{what}: {unique} decoded < {decodable} decodable"
    );
    assert!(
        unique + stats_lost <= SAMPLES as u64,
        "{what}: {unique} decoded + {stats_lost} counted lost > {SAMPLES} sent"
    );
    if damaged {
        assert!(out.bad_frames > 0, "{what}: damage went uncounted");
    }
    share
}

fn decode_counting(bytes: &[u8], cap: &Capture, rng: &mut Rng) -> (Outcome, u64) {
    let out = decode(bytes, cap, rng);
    let lost = out.group_lost;
    (out, lost)
}

#[test]
fn bit_errors_in_groups_yield_no_bogus_sample_and_lose_only_hit_groups() {
    for group in [16u32, 256] {
        let cap = capture_grouped(SAMPLES, group);
        let s = stream(&cap);
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ u64::from(group));
        let (clean, lost) = decode_counting(&s.bytes, &cap, &mut rng);
        let all = decodable_in_groups(&cap, &s, |_, _| true);
        assert_eq!(all, SAMPLES as u64);
        check_groups(&format!("G={group} intact"), &clean, lost, all, false);
        assert_eq!((clean.samples, lost), (SAMPLES as u64, 0));
        for ber in [1e-6, 1e-5, 1e-4, 1e-3] {
            // Several lines at the rarest rate, so some are hit.
            let rounds = if ber < 1e-5 { 8 } else { 1 };
            let mut shares = Vec::new();
            for _ in 0..rounds {
                let (bytes, hits) = bit_errors(&s.bytes, ber, &mut rng);
                let (out, lost) = decode_counting(&bytes, &cap, &mut rng);
                let decodable = decodable_in_groups(&cap, &s, touched(&hits));
                shares.push(check_groups(
                    &format!("G={group} BER {ber:e}"),
                    &out,
                    lost,
                    decodable,
                    !hits.is_empty(),
                ));
            }
            if ber == 1e-6 {
                let mean = shares.iter().sum::<f64>() / shares.len() as f64;
                let floor = if group <= 16 { 0.99 } else { 0.95 };
                assert!(
                    mean >= floor,
                    "G={group} at 1e-6: {:.2}% decoded",
                    100.0 * mean
                );
            }
        }
    }
}

#[test]
fn bursts_and_dropped_and_duplicated_chunks_in_groups_yield_no_bogus_sample() {
    let cap = capture_grouped(SAMPLES, 256);
    let s = stream(&cap);
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let (bytes, hits) = bursts(&s.bytes, &mut rng);
    let (out, lost) = decode_counting(&bytes, &cap, &mut rng);
    let decodable = decodable_in_groups(&cap, &s, touched(&hits));
    check_groups("G=256 bursts", &out, lost, decodable, true);
    for (what, copies) in [("dropped chunks", 0usize), ("duplicated chunks", 2)] {
        let (bytes, clean) = rechunk(&s.bytes, &mut rng, |r| {
            if r.next() % 100 == 0 { copies } else { 1 }
        });
        let (out, lost) = decode_counting(&bytes, &cap, &mut rng);
        let decodable = decodable_in_groups(&cap, &s, |a, b| clean[a..b].iter().all(|&c| c));
        check_groups(&format!("G=256 {what}"), &out, lost, decodable, copies == 0);
    }
}
