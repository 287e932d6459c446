//! Sample groups (`wire_group=N`): every sample comes back exactly, in
//! order with the records around it, whatever its shape; groups cost fewer
//! bytes than per-sample frames; and a damaged line never yields a wrong
//! sample, while every sample the target delivered is either decoded or
//! counted lost.

mod common;
mod long_capture;

use std::collections::HashMap;

use common::{Config, Rng, Task};
use long_capture::{Capture, capture, capture_grouped};
use sampler::regs::{Abi, RegsSample};
use sampler::sample::{
    BranchEntry, BranchFlags, BranchStack, CpuMode, MAX_CALLCHAIN, MemInfo, PERF_CONTEXT_KERNEL,
    Sample,
};
use sampler::wire::{
    Decoder, Encoder, EncoderConfig, End, Lost, LostReason, MAX_FRAME, Record, TaskExit,
};

/// Encodes `records` with groups of `group` and returns the stream.
fn encode(records: &[Record], group: u32) -> Vec<u8> {
    let mut enc: Box<Encoder<16>> = Box::new(Encoder::new(EncoderConfig {
        group,
        ..EncoderConfig::default()
    }));
    let mut buf = [0u8; MAX_FRAME];
    let mut out = vec![0u8];
    let mut write = |f: &[u8]| {
        assert!(f.len() <= MAX_FRAME, "a frame of {} bytes", f.len());
        out.extend_from_slice(f);
        Ok::<(), ()>(())
    };
    for r in records {
        enc.put(r, &mut buf, &mut write).unwrap();
    }
    enc.flush(&mut buf, &mut write).unwrap();
    assert!(!enc.pending());
    out
}

/// Decodes a whole stream.
fn decode(bytes: &[u8]) -> (Vec<Record>, sampler::wire::DecoderStats) {
    let mut dec = Box::new(Decoder::new());
    let mut out = Vec::new();
    for chunk in bytes.chunks(777) {
        dec.push(chunk, |r| out.push(r.expect("no decode error")));
    }
    (out, dec.stats())
}

/// A sample of an odd shape, from `rng`.
fn odd_sample(rng: &mut Rng, i: u64) -> Sample {
    let tid = 1 + rng.below(40) as u32;
    let mut s = Sample {
        event: rng.below(3) as u32,
        cpumode: if rng.below(5) == 0 {
            CpuMode::Kernel
        } else {
            CpuMode::User
        },
        ip: 0xffff_ffff_8000_0000u64.wrapping_add(rng.next() % 0x10_0000) ^ (rng.below(2) << 63),
        pid: if rng.below(4) == 0 { tid + 1000 } else { tid },
        tid,
        time: 1_000_000 + i * 1000 + rng.below(500),
        cpu: rng.below(4) as u32,
        period: [1, 250_000, rng.next()][rng.below(3) as usize],
        ..Sample::default()
    };
    if rng.below(2) == 0 {
        let n = [1, 2, 5, MAX_CALLCHAIN][rng.below(4) as usize];
        s.callchain.push(PERF_CONTEXT_KERNEL).unwrap();
        while s.callchain.len() < n {
            s.callchain.push(rng.next()).unwrap();
        }
    }
    if rng.below(3) == 0 {
        let mut b = BranchStack {
            hw_idx: rng.below(100),
            entries: heapless::Vec::new(),
        };
        for _ in 0..rng.below(33) {
            let from = 0x40_0000 + rng.below(0x1_0000);
            b.entries
                .push(BranchEntry {
                    from,
                    to: from.wrapping_add(rng.next() % 512).wrapping_sub(256),
                    flags: BranchFlags::from_perf(rng.next() & sampler::regs::GPR_MASK),
                })
                .unwrap();
        }
        s.branches = Some(b);
    }
    for slot in [&mut s.regs_user, &mut s.regs_intr] {
        match rng.below(4) {
            0 => {}
            1 => *slot = Some(RegsSample::none(sampler::regs::GPR_MASK)),
            k => {
                let mask = if k == 2 {
                    sampler::regs::GPR_MASK
                } else {
                    rng.next() & sampler::regs::VALID_MASK_WITH_XMM
                };
                let abi = if rng.below(2) == 0 {
                    Abi::Bits32
                } else {
                    Abi::Bits64
                };
                let mut values = heapless::Vec::new();
                for _ in 0..mask.count_ones().min(56) {
                    // Half from a few values, so registers repeat theirs
                    // and their change masks repeat too.
                    let v = if rng.below(2) == 0 {
                        [0, 1, 0x7fff_f000, u64::MAX][rng.below(4) as usize]
                    } else {
                        rng.next() >> rng.below(64)
                    };
                    values.push(v).unwrap();
                }
                if mask.count_ones() <= 56 {
                    *slot = Some(RegsSample { abi, mask, values });
                }
            }
        }
    }
    if rng.below(3) == 0 {
        // A sample of user code: its interrupted registers are its user
        // registers.
        s.regs_intr.clone_from(&s.regs_user);
    }
    if rng.below(4) == 0 {
        s.mem = Some(MemInfo {
            addr: rng.next(),
            weight: rng.below(1000),
            ins_lat: rng.below(65536) as u16,
            data_src: rng.below(8),
        });
    }
    s
}

#[test]
fn every_sample_comes_back_exactly_in_order_with_the_records_around_it() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut records = Vec::new();
    for i in 0..6000u64 {
        records.push(Record::Sample(odd_sample(&mut rng, i)));
        match rng.below(50) {
            0 => records.push(Record::Lost(Lost {
                time: i,
                cpu: 1,
                event: 0,
                count: 3,
                reason: LostReason::RingFull,
            })),
            1 => records.push(Record::TaskExit(TaskExit {
                time: i,
                pid: 5,
                tid: 6,
            })),
            _ => {}
        }
    }
    records.push(Record::End(End::default()));
    for group in [1, 16, 256, 100_000] {
        let (got, stats) = decode(&encode(&records, group));
        if stats.bad_frames > 0 {
            for (i, (a, b)) in got.iter().zip(&records).enumerate() {
                assert_eq!(a, b, "record {i} with G={group}");
            }
        }
        assert_eq!(stats.bad_frames, 0, "G={group}: {stats:?}");
        assert_eq!(got.len(), records.len(), "G={group}");
        for (i, (a, b)) in got.iter().zip(&records).enumerate() {
            assert_eq!(a, b, "record {i} with G={group}");
        }
    }
}

#[test]
fn simulated_tasks_come_back_exactly_and_cost_less_than_per_sample_frames() {
    for config in Config::ALL {
        let mut tasks: Vec<Task> = (1..=3).map(|t| Task::new(t, 77 * u64::from(t))).collect();
        let mut rng = Rng(5);
        let mut records = Vec::new();
        for _ in 0..10_000 {
            let t = rng.below(3) as usize;
            records.push(Record::Sample(tasks[t].step(config)));
        }
        let plain = encode(&records, 0).len() as f64 / 10_000.0;
        for group in [16, 64, 256] {
            let bytes = encode(&records, group);
            let per = bytes.len() as f64 / 10_000.0;
            let (got, _) = decode(&bytes);
            assert_eq!(got, records, "{} G={group}", config.name());
            println!(
                "{:<45} G={group:<4} {per:6.1} B/sample (per-sample frames {plain:.1})",
                config.name()
            );
            // Small groups relearn too often to pay with both register
            // sets; from 64 samples on groups are always smaller.
            assert!(
                per < plain || group < 64,
                "{} G={group}: {per:.1} B/sample, per-sample frames {plain:.1}",
                config.name()
            );
        }
    }
}

/// Encodes `records` with groups of 64, the group frames checked by `crc`.
fn encode_with_crc(records: &[Record], crc: fn(u32, &[u8]) -> u32) -> Vec<u8> {
    let mut enc: Box<Encoder<16>> = Box::new(Encoder::new(EncoderConfig {
        group: 64,
        ..EncoderConfig::default()
    }));
    enc.set_frame_crc(crc);
    let mut buf = [0u8; MAX_FRAME];
    let mut out = vec![0u8];
    let mut write = |f: &[u8]| {
        out.extend_from_slice(f);
        Ok::<(), ()>(())
    };
    for r in records {
        enc.put(r, &mut buf, &mut write).unwrap();
    }
    enc.flush(&mut buf, &mut write).unwrap();
    out
}

/// CRC-32C appended by the `crc` crate's tables (continuing from `crc`:
/// its register is `!crc`, which the crate takes bit-reversed for a
/// reflected CRC).
fn crc32c_by_crate(crc: u32, data: &[u8]) -> u32 {
    const CASTAGNOLI: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);
    let mut d = CASTAGNOLI.digest_with_initial((!crc).reverse_bits());
    d.update(data);
    d.finalize()
}

#[test]
fn group_frames_are_checked_by_the_crc_function_given() {
    let mut rng = Rng(11);
    // Samples that all fit a group frame (not the full callchains, which
    // travel as plain frames).
    let records: Vec<Record> = (0..1000)
        .map(|i| odd_sample(&mut rng, i))
        .filter(|s| s.callchain.len() < MAX_CALLCHAIN)
        .map(Record::Sample)
        .collect();
    // Another implementation of CRC-32C (as the runtime's CPU instruction
    // is): the same stream, every sample back.
    assert_eq!(crc32c_by_crate(0, b"123456789"), 0xe306_9283);
    assert_eq!(
        crc32c_by_crate(crc32c_by_crate(0, b"1234"), b"56789"),
        0xe306_9283
    );
    let same = encode_with_crc(&records, crc32c_by_crate);
    assert_eq!(same, encode(&records, 64));
    assert_eq!(decode(&same).0, records);
    // A function that is not CRC-32C: every group frame fails its check,
    // and its samples are counted, never decoded.
    let wrong = encode_with_crc(&records, |c, d| crc32c_by_crate(c, d) ^ 1);
    let (got, stats) = decode(&wrong);
    assert!(got.is_empty(), "{} records decoded", got.len());
    assert!(stats.bad_frames > 0, "{stats:?}");
}

/// The sample records of a decoded stream, by (tid, time).
fn count_samples(
    bytes: &[u8],
    taken: &HashMap<(u32, u64), Sample>,
) -> (u64, u64, sampler::wire::DecoderStats) {
    let mut dec = Box::new(Decoder::new());
    let (mut n, mut bogus) = (0, 0);
    for chunk in bytes.chunks(4096) {
        dec.push_ref(chunk, |r| {
            if let Ok(Record::Sample(s)) = r {
                n += 1;
                if taken.get(&(s.tid, s.time)) != Some(s) {
                    bogus += 1;
                }
            }
        });
    }
    (n, bogus, dec.stats())
}

fn stream(cap: &Capture) -> Vec<u8> {
    cap.frames.concat()
}

#[test]
fn losing_any_one_frame_costs_only_its_group_and_never_gives_a_wrong_sample() {
    const SAMPLES: usize = 20_000;
    let cap = capture_grouped(SAMPLES, 64);
    let all = stream(&cap);
    let (n, bogus, _) = count_samples(&all, &cap.taken);
    assert_eq!((n, bogus), (SAMPLES as u64, 0));
    // Frames 0 (the leading delimiter), 1 (Hello) and the last (End) are
    // not samples.
    let groups = cap.frames.len() - 3;
    assert!(groups > 100, "{groups} group frames");
    for drop in 2..cap.frames.len() - 1 {
        let mut bytes = Vec::with_capacity(all.len());
        for (i, f) in cap.frames.iter().enumerate() {
            if i != drop {
                bytes.extend_from_slice(f);
            }
        }
        let (n, bogus, stats) = count_samples(&bytes, &cap.taken);
        assert_eq!(bogus, 0, "dropping frame {drop}");
        let lost = SAMPLES as u64 - n;
        assert!(lost > 0 && lost <= 64, "dropping frame {drop} lost {lost}");
        // The loss is known exactly from the stream index, unless the
        // dropped frame was the very last group frame.
        if drop < cap.frames.len() - 2 {
            assert_eq!(stats.group_samples_lost, lost, "dropping frame {drop}");
        }
    }
    // The same capture without groups, for scale.
    let plain = stream(&capture(SAMPLES));
    println!(
        "{SAMPLES} samples: {} bytes in groups of 64, {} in per-sample frames",
        all.len(),
        plain.len()
    );
}
