//! A long synthetic capture for the wire's damage tests: three tasks that
//! hop between a few hot addresses at a steady rate (many delta frames
//! carry byte-identical payloads: the hard case for a delta chain), framed
//! exactly as the target frames them.
#![allow(dead_code)]

use std::collections::HashMap;

use sampler::regs::{CodeMode, GPR_MASK, RegFile, RegsSample};
use sampler::sample::{CpuMode, PERF_CONTEXT_USER, Sample};
use sampler::wire::{
    CpuId, CpuVendor, Decoder, Encoder, EncoderConfig, End, Hello, MAX_FRAME, Record,
};

/// The encoder's keyframe interval (its default).
pub const KEYFRAME_INTERVAL: u32 = 128;

pub struct Capture {
    /// Every frame, delimiter included; the stream starts with a delimiter.
    pub frames: Vec<Vec<u8>>,
    /// For each frame that holds a sample: (tid, keyframe?).
    pub sample_frames: Vec<Option<(u32, bool)>>,
    /// What the target took, by (tid, time).
    pub taken: HashMap<(u32, u64), Sample>,
}

/// A capture of `samples` sample frames between a Hello and an End.
pub fn capture(samples: usize) -> Capture {
    capture_with(
        samples,
        EncoderConfig {
            keyframe_interval: KEYFRAME_INTERVAL,
            group: 0,
        },
    )
}

/// The same capture with samples in groups of `group` (`sample_frames`
/// then says `None` for group frames too).
pub fn capture_grouped(samples: usize, group: u32) -> Capture {
    capture_with(
        samples,
        EncoderConfig {
            keyframe_interval: KEYFRAME_INTERVAL,
            group,
        },
    )
}

fn capture_with(samples: usize, config: EncoderConfig) -> Capture {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut enc: Box<Encoder<16>> = Box::new(Encoder::new(config));
    let mut buf = [0u8; MAX_FRAME];
    let mut frames = vec![vec![0u8]];
    let mut sample_frames = vec![None];
    let mut taken = HashMap::new();
    let grouped = config.group > 0;
    let mut put = |enc: &mut Encoder<16>, rec: &Record, sample: Option<(u32, bool)>| {
        if grouped {
            enc.put(rec, &mut buf, &mut |f: &[u8]| {
                frames.push(f.to_vec());
                sample_frames.push(None);
                Ok::<(), ()>(())
            })
            .unwrap();
        } else {
            let n = enc.encode(rec, &mut buf).unwrap();
            frames.push(buf[..n].to_vec());
            sample_frames.push(sample);
        }
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
    for i in 0..samples as u64 {
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
    let delivered = samples as u64;
    put(
        &mut enc,
        &Record::End(End {
            taken: delivered,
            delivered,
            ..End::default()
        }),
        None,
    );
    Capture {
        frames,
        sample_frames,
        taken,
    }
}

/// The record bytes of a frame: COBS undone, the check and the delimiter
/// left off.
pub fn payload(frame: &[u8]) -> Vec<u8> {
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
pub fn feed(dec: &mut Decoder, frame: &[u8], taken: &HashMap<(u32, u64), Sample>) -> (u64, u64) {
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
