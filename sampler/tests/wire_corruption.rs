//! Flips random bits in a long stream and checks that the decoder recovers
//! every record it can (every intact frame whose delta reference survived),
//! rejects every corrupted frame (no corrupted frame yields a sample), never
//! panics, and counts what it skipped. Also checks arbitrary chunking.

mod common;

use common::{Config, Rng, Task};
use sampler::sample::{BranchEntry, BranchFlags, BranchStack, MemInfo};
use sampler::wire::{
    CpuId, CpuVendor, Decoder, Encoder, EncoderConfig, End, Hello, Log, LogLevel, Lost, LostReason,
    MAX_FRAME, Record,
};

struct Frame {
    record: Record,
    range: std::ops::Range<usize>,
    /// For samples: (tid, keyframe?) as the encoder chose.
    sample: Option<(u32, bool)>,
}

fn build_stream(n: usize, keyframe_interval: u32) -> (Vec<u8>, Vec<Frame>) {
    let mut rng = Rng(0x5eed);
    let mut tasks: Vec<Task> = (1..=5).map(|t| Task::new(t, u64::from(t) * 77)).collect();
    let mut enc: Encoder<16> = Encoder::new(EncoderConfig {
        keyframe_interval,
        ..EncoderConfig::default()
    });
    let mut buf = [0u8; MAX_FRAME];
    let mut bytes = vec![0u8]; // leading delimiter
    let mut frames = Vec::new();
    let mut since_key = [u32::MAX; 6];
    let hello = Record::Hello(Hello::new(
        CpuId {
            vendor: CpuVendor::Intel,
            family: 6,
            model: 0x8f,
            stepping: 8,
        },
        sampler::event::PmuCaps::cpu_clock(),
    ));
    let mut push = |rec: Record, enc: &mut Encoder<16>, sample: Option<(u32, bool)>| {
        let len = enc.encode(&rec, &mut buf).unwrap();
        let start = bytes.len();
        bytes.extend_from_slice(&buf[..len]);
        frames.push(Frame {
            record: rec,
            range: start..bytes.len(),
            sample,
        });
    };
    push(hello, &mut enc, None);
    for i in 0..n {
        match rng.below(50) {
            0 => push(
                Record::Log(Log::text(i as u64, LogLevel::Info, "drain: ok")),
                &mut enc,
                None,
            ),
            1 => push(
                Record::Lost(Lost {
                    time: i as u64,
                    cpu: 0,
                    event: 1,
                    count: rng.below(100),
                    reason: LostReason::RingFull,
                }),
                &mut enc,
                None,
            ),
            _ => {
                let t = rng.below(tasks.len() as u64) as usize;
                let config = Config::ALL[rng.below(4) as usize];
                let mut s = tasks[t].step(config);
                if rng.below(8) == 0 {
                    let mut b = BranchStack::default();
                    for k in 0..rng.below(8) {
                        b.entries
                            .push(BranchEntry {
                                from: s.ip + k * 16,
                                to: s.ip - k * 4,
                                flags: BranchFlags {
                                    mispred: k % 2 == 0,
                                    cycles: k as u16 * 3,
                                    ..Default::default()
                                },
                            })
                            .unwrap();
                    }
                    s.branches = Some(b);
                    s.mem = Some(MemInfo {
                        addr: 0x60_0000 + rng.below(1 << 20),
                        weight: rng.below(500),
                        ins_lat: 7,
                        data_src: 0x68100142,
                    });
                }
                let tid = s.tid;
                // Mirror the encoder's keyframe rule to know which frames
                // are keyframes (slot = tid % 16: no collisions here).
                let key = since_key[tid as usize] >= keyframe_interval - 1;
                since_key[tid as usize] = if key { 0 } else { since_key[tid as usize] + 1 };
                push(Record::Sample(s), &mut enc, Some((tid, key)));
            }
        }
    }
    push(Record::End(End::default()), &mut enc, None);
    (bytes, frames)
}

/// What the decoder must produce from a stream whose damaged bytes are
/// `damaged`.
fn expected(frames: &[Frame], damaged: &[bool]) -> Vec<Record> {
    let mut valid = std::collections::HashMap::new();
    let mut out = Vec::new();
    for (k, f) in frames.iter().enumerate() {
        // A frame survives when none of its bytes (delimiter included) and
        // not the delimiter before it changed.
        let before = if k == 0 {
            0
        } else {
            frames[k - 1].range.end - 1
        };
        let intact = !damaged[before] && !damaged[f.range.clone()].iter().any(|d| *d);
        match f.sample {
            None => {
                if intact {
                    out.push(f.record.clone());
                }
            }
            Some((tid, key)) => {
                let ok = intact && (key || valid.get(&tid).copied().unwrap_or(false));
                valid.insert(tid, ok);
                if ok {
                    out.push(f.record.clone());
                }
            }
        }
    }
    out
}

fn run(bytes: &[u8], chunk_seed: u64) -> (Vec<Record>, sampler::wire::DecoderStats) {
    let mut dec = Decoder::new();
    let mut got = Vec::new();
    let mut rng = Rng(chunk_seed);
    let mut rest = bytes;
    while !rest.is_empty() {
        let n = (1 + rng.below(300) as usize).min(rest.len());
        dec.push(&rest[..n], |r| {
            got.push(r.expect("no version errors in this stream"))
        });
        rest = &rest[n..];
    }
    (got, dec.stats())
}

#[test]
fn clean_stream_decodes_completely_under_any_chunking() {
    let (bytes, frames) = build_stream(5_000, 32);
    let all: Vec<Record> = frames.iter().map(|f| f.record.clone()).collect();
    for seed in [1, 2, 3] {
        let (got, stats) = run(&bytes, seed);
        assert_eq!(got.len(), all.len());
        assert!(got == all, "clean stream decodes exactly");
        assert_eq!(stats.bad_frames, 0);
        assert_eq!(stats.bytes_skipped, 0);
    }
}

#[test]
fn bit_flips_lose_only_damaged_frames_and_their_dependents() {
    for (seed, flips_per_mb) in [(7u64, 200u64), (8, 2_000), (9, 20_000)] {
        let (original, frames) = build_stream(10_000, 32);
        let mut bytes = original.clone();
        let mut rng = Rng(seed);
        let mut damaged = vec![false; bytes.len()];
        let flips = (bytes.len() as u64 * flips_per_mb / 1_000_000).max(1);
        for _ in 0..flips {
            let at = rng.below(bytes.len() as u64) as usize;
            bytes[at] ^= 1 << rng.below(8);
            damaged[at] = true;
        }
        // Two flips of one bit cancel: that byte is intact again.
        for (i, d) in damaged.iter_mut().enumerate() {
            *d = bytes[i] != original[i];
        }
        let want = expected(&frames, &damaged);
        let (got, stats) = run(&bytes, seed);
        let lost_frames = frames.len() - want.len();
        println!(
            "{flips} flips in {} bytes: {} of {} frames recovered, {} bad frames counted, {} unresolved deltas, {} bytes skipped",
            bytes.len(),
            got.len(),
            frames.len(),
            stats.bad_frames,
            stats.unresolved_samples,
            stats.bytes_skipped
        );
        assert_eq!(got.len(), want.len(), "seed {seed}");
        for (i, (g, w)) in got.iter().zip(want.iter()).enumerate() {
            assert!(g == w, "record {i} differs (seed {seed})");
        }
        assert!(lost_frames > 0, "the flips really damaged frames");
        assert!(stats.bad_frames >= 1);
        assert_eq!(stats.frames_ok as usize, want.len());
    }
}
