//! Exhaustive single-frame loss over a long capture: for every sample
//! frame, the stream is decoded without it, and no decoded sample may
//! differ from the sample the target took at that time. The workload is
//! the hard case for a delta chain: tasks that hop between a few hot
//! addresses at a steady rate, so many delta frames carry byte-identical
//! payloads.

use std::collections::HashMap;

use sampler::regs::{CodeMode, GPR_MASK, RegFile, RegsSample};
use sampler::sample::{CpuMode, PERF_CONTEXT_USER, Sample};
use sampler::wire::{
    CpuId, CpuVendor, Decoder, Encoder, EncoderConfig, End, Hello, MAX_FRAME, Record,
};

/// Sample frames in the capture.
const SAMPLES: usize = 8000;
/// The encoder's keyframe interval (its default).
const KEYFRAME_INTERVAL: u32 = 128;

struct Capture {
    /// Every frame, delimiter included; the stream starts with a delimiter.
    frames: Vec<Vec<u8>>,
    /// For each frame that holds a sample: (tid, keyframe?).
    sample_frames: Vec<Option<(u32, bool)>>,
    /// What the target took, by (tid, time).
    taken: HashMap<(u32, u64), Sample>,
}

fn capture() -> Capture {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut enc: Encoder<16> = Encoder::new(EncoderConfig {
        keyframe_interval: KEYFRAME_INTERVAL,
    });
    let mut buf = [0u8; MAX_FRAME];
    let mut frames = vec![vec![0u8]];
    let mut sample_frames = vec![None];
    let mut taken = HashMap::new();
    let mut put = |enc: &mut Encoder<16>, rec: &Record, sample: Option<(u32, bool)>| {
        let n = enc.encode(rec, &mut buf).unwrap();
        frames.push(buf[..n].to_vec());
        sample_frames.push(sample);
    };
    let hello = Hello::new(
        CpuId {
            vendor: CpuVendor::Intel,
            family: 6,
            model: 0x8f,
            stepping: 8,
        },
        sampler::event::PmuCaps::cpu_clock(),
    );
    put(&mut enc, &Record::Hello(hello), None);
    // Three tasks, each hopping between three hot addresses; the running
    // task changes now and then, so time deltas are mostly one step.
    let hot: [[u64; 3]; 3] = [
        [0x40_1000, 0x40_1040, 0x40_10c8],
        [0x40_2000, 0x40_2010, 0x40_2300],
        [0x40_3000, 0x40_3008, 0x40_3010],
    ];
    let mut since = [0u32; 3];
    let mut task = 0usize;
    let mut regs = RegFile([0; sampler::regs::NUM_GPR_SLOTS]);
    for (k, r) in regs.0.iter_mut().enumerate() {
        *r = 0x1111 * k as u64;
    }
    for i in 0..SAMPLES as u64 {
        if next() % 40 == 0 {
            task = (next() % 3) as usize;
        }
        let ip = hot[task][(next() % 3) as usize];
        regs.0[8] = ip;
        let mut callchain = heapless::Vec::new();
        callchain.push(PERF_CONTEXT_USER).unwrap();
        callchain.push(ip).unwrap();
        callchain.push(hot[task][0] + 5).unwrap();
        let tid = task as u32 + 1;
        let s = Sample {
            cpumode: CpuMode::User,
            ip,
            pid: tid,
            tid,
            time: 1_000_000 + i * 250_000,
            period: 250_000,
            callchain,
            regs_user: Some(RegsSample::from_file(&regs, GPR_MASK, CodeMode::Long64)),
            ..Sample::default()
        };
        let key = since[task] % KEYFRAME_INTERVAL == 0;
        since[task] += 1;
        taken.insert((tid, s.time), s.clone());
        put(&mut enc, &Record::Sample(s), Some((tid, key)));
    }
    put(&mut enc, &Record::End(End::default()), None);
    Capture {
        frames,
        sample_frames,
        taken,
    }
}

/// The record bytes of a frame: COBS undone, the check and the delimiter
/// left off.
fn payload(frame: &[u8]) -> Vec<u8> {
    let body = &frame[..frame.len() - 1];
    let mut out = Vec::new();
    let mut i = 0;
    while i < body.len() {
        let code = body[i] as usize;
        out.extend_from_slice(&body[i + 1..i + code]);
        i += code;
        if code < 0xff && i < body.len() {
            out.push(0);
        }
    }
    out.truncate(out.len() - 4);
    out
}

/// Feeds `frame` and checks every sample it yields against what was
/// taken; returns (samples, bogus samples).
fn feed(dec: &mut Decoder, frame: &[u8], taken: &HashMap<(u32, u64), Sample>) -> (u64, u64) {
    let (mut n, mut bogus) = (0, 0);
    dec.push_ref(frame, |r| {
        if let Ok(Record::Sample(s)) = r {
            n += 1;
            if taken.get(&(s.tid, s.time)) != Some(s) {
                bogus += 1;
            }
        }
    });
    (n, bogus)
}

#[test]
fn no_single_frame_loss_yields_a_bogus_sample() {
    let cap = capture();
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
