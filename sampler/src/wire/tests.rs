//! Round-trip tests of the frame format and the compact sample encoding.

use super::*;
use crate::regs::{CodeMode, GPR_MASK, RegFile, RegsSample};
use crate::sample::{CpuMode, Sample};

fn decode_all(bytes: &[u8]) -> (std::vec::Vec<Result<Record, DecodeError>>, DecoderStats) {
    let mut d = Decoder::new();
    let mut out = std::vec::Vec::new();
    d.push(bytes, |r| out.push(r));
    (out, d.stats())
}

fn sample(i: u64) -> Sample {
    let mut f = RegFile::default();
    for (k, v) in f.0.iter_mut().enumerate() {
        *v = 0x7fff_0000_0000 + (k as u64) * 0x100 + i * (k as u64 % 3);
    }
    Sample {
        event: 1,
        cpumode: CpuMode::User,
        ip: 0x40_1000 + (i * 7) % 64,
        pid: 5,
        tid: 5,
        time: 1_000_000_000 + i * 250_000,
        cpu: 0,
        period: 250_000,
        regs_user: Some(RegsSample::from_file(&f, GPR_MASK, CodeMode::Long64)),
        ..Default::default()
    }
}

#[test]
fn samples_round_trip_with_deltas() {
    let mut enc: Encoder<4> = Encoder::new(EncoderConfig {
        keyframe_interval: 8,
        ..EncoderConfig::default()
    });
    let mut bytes = std::vec::Vec::new();
    let mut buf = [0u8; MAX_FRAME];
    let samples: std::vec::Vec<Sample> = (0..40).map(sample).collect();
    for s in &samples {
        let n = enc.encode(&Record::Sample(s.clone()), &mut buf).unwrap();
        assert!(
            !buf[..n - 1].contains(&0),
            "COBS leaves no zero inside a frame"
        );
        bytes.extend_from_slice(&buf[..n]);
    }
    let (out, stats) = decode_all(&bytes);
    let got: std::vec::Vec<Sample> = out
        .into_iter()
        .map(|r| match r {
            Ok(Record::Sample(s)) => s,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(got, samples);
    assert_eq!(stats.frames_ok, 40);
    assert_eq!(stats.bad_frames, 0);
}

/// A Hello of a CPU without a PMU (the NMI clock), as the runtime sends it.
fn clock_hello(vendor: CpuVendor, family: u16, model: u16, stepping: u8) -> Hello {
    Hello::new(
        CpuId {
            vendor,
            family,
            model,
            stepping,
        },
        crate::event::PmuCaps::cpu_clock(),
    )
}

#[test]
fn other_records_round_trip() {
    let hello = {
        let mut h = clock_hello(CpuVendor::Intel, 6, 0x55, 4);
        h.tsc_hz = 2_000_000_000;
        h.build_id.extend_from_slice(&[0xab; 20]).unwrap();
        h.cmdline.push_str("pmu=sim ring=64").unwrap();
        h.events
            .push(crate::event::EventConfig::cpu_clock(0, 4000))
            .unwrap();
        h
    };
    let mut task = Task {
        time: 9,
        pid: 2,
        tid: 3,
        name: heapless::String::new(),
        abi: crate::regs::Abi::Bits32,
        text: heapless::Vec::new(),
        program: None,
        origin: Origin::Named,
    };
    task.name.push_str("spin32").unwrap();
    let mut program = Program::default();
    program.path.push_str("bin/app").unwrap();
    program.build_id.extend_from_slice(&[0x5a; 20]).unwrap();
    for (i, prot) in [
        Segment::READ,
        Segment::READ | Segment::EXEC,
        Segment::READ | Segment::WRITE,
    ]
    .into_iter()
    .enumerate()
    {
        let i = i as u64;
        program
            .segments
            .push(Segment {
                start: 0x40_0000 + i * 0x1000,
                len: 0x1000,
                file_offset: i * 0x1000,
                prot,
            })
            .unwrap();
    }
    let loaded = Task {
        pid: 4,
        tid: 4,
        text: heapless::Vec::new(),
        program: Some(program),
        ..task.clone()
    };
    task.text
        .push(TextRange {
            start: 0x40_0000,
            len: 0x2000,
            file_offset: 0x1000,
        })
        .unwrap();
    let records = [
        Record::Hello(hello),
        Record::Task(task),
        Record::Task(loaded),
        Record::Log(Log::text(1, LogLevel::Warn, "panicked at x.rs:3")),
        Record::Log(Log::defmt(2, LogLevel::Info, &[1, 0, 2, 0, 0])),
        Record::Lost(Lost {
            time: 3,
            cpu: 1,
            event: 0,
            count: 17,
            reason: LostReason::RingFull,
        }),
        Record::Throttle(ThrottleEvent {
            time: 4,
            cpu: 0,
            event: 1,
        }),
        Record::Unthrottle(ThrottleEvent {
            time: 5,
            cpu: 0,
            event: 1,
        }),
        Record::TaskExit(TaskExit {
            time: 6,
            pid: 2,
            tid: 3,
        }),
        Record::SelfTest(SelfTest {
            name: heapless::String::try_from("counters-advance").unwrap(),
            passed: false,
            measured: 0,
            expected: 1000,
            detail: heapless::String::new(),
        }),
        Record::End(End {
            time: 6,
            taken: 10,
            delivered: 7,
            lost: 3,
            throttled: 1,
            frames: 9,
            unknown_syscalls: [
                UnknownSyscall {
                    abi: 64,
                    nr: 41,
                    count: 2,
                },
                UnknownSyscall {
                    abi: 32,
                    nr: 102,
                    count: u64::MAX,
                },
            ]
            .into_iter()
            .collect(),
        }),
    ];
    let mut enc: Encoder = Encoder::new(EncoderConfig::default());
    let mut bytes = std::vec::Vec::new();
    let mut buf = [0u8; MAX_FRAME];
    for r in &records {
        let n = enc.encode(r, &mut buf).unwrap();
        bytes.extend_from_slice(&buf[..n]);
    }
    // Byte-at-a-time chunking gives the same result as one chunk.
    let mut d = Decoder::new();
    let mut out = std::vec::Vec::new();
    for b in &bytes {
        d.push(core::slice::from_ref(b), |r| out.push(r));
    }
    let expected: std::vec::Vec<_> = records.iter().cloned().map(Ok).collect();
    assert_eq!(out, expected);
}

/// Hello's CPU places survive the round trip, the largest Hello (every
/// list full, every number at its widest) fits a frame, and a Hello
/// without places still decodes.
#[test]
fn hello_cpus_round_trip() {
    let mut h = clock_hello(CpuVendor::Intel, 6, 0x8F, 8);
    h.ncpus = 4;
    for (apic_id, core) in [(0, 0), (1, 0), (2, 1), (0x81, 0)] {
        h.cpus
            .push(CpuPlace {
                apic_id,
                package: apic_id >> 7,
                die: 0,
                core,
            })
            .unwrap();
    }
    let mut enc: Encoder = Encoder::new(EncoderConfig::default());
    let mut buf = [0u8; MAX_FRAME];
    let n = enc.encode(&Record::Hello(h.clone()), &mut buf).unwrap();
    let (out, stats) = decode_all(&buf[..n]);
    assert_eq!(out, [Ok(Record::Hello(h.clone()))]);
    assert_eq!(stats.bad_frames, 0);

    // Varints: four small places cost a handful of bytes each.
    let mut without = h.clone();
    without.cpus.clear();
    let m = enc
        .encode(&Record::Hello(without.clone()), &mut buf)
        .unwrap();
    assert!(n - m <= 4 * 6, "{} bytes for four places", n - m);
    assert_eq!(decode_all(&buf[..m]).0, [Ok(Record::Hello(without))]);

    let mut big = h;
    big.ncpus = u32::MAX;
    big.cpus.clear();
    while big
        .cpus
        .push(CpuPlace {
            apic_id: u32::MAX,
            package: u32::MAX,
            die: u32::MAX,
            core: u32::MAX,
        })
        .is_ok()
    {}
    big.build_id.clear();
    big.build_id
        .extend_from_slice(&[0xff; MAX_BUILD_ID])
        .unwrap();
    big.cmdline.clear();
    while big.cmdline.push('x').is_ok() {}
    big.events.clear();
    while big
        .events
        .push(crate::event::EventConfig::cpu_clock(u32::MAX, u64::MAX))
        .is_ok()
    {}
    big.tsc_hz = u64::MAX;
    big.boot = u64::MAX;
    big.repeat = u32::MAX;
    assert_eq!(big.cpus.len(), MAX_CPUS);
    let n = enc.encode(&Record::Hello(big.clone()), &mut buf).unwrap();
    assert_eq!(decode_all(&buf[..n]).0, [Ok(Record::Hello(big))]);
}

/// A loaded program's Task record, named `name`, running `path`, with
/// `origin`: as the runtime sends it.
fn program_task(pid: u32, tid: u32, name: &str, path: &str, origin: Origin) -> Task {
    let mut program = Program::default();
    program.path.push_str(path).unwrap();
    program.build_id.extend_from_slice(&[0x5a; 20]).unwrap();
    program
        .segments
        .push(Segment {
            start: 0x40_1000,
            len: 0x2000,
            file_offset: 0x1000,
            prot: Segment::READ | Segment::EXEC,
        })
        .unwrap();
    Task {
        time: 100,
        pid,
        tid,
        name: heapless::String::try_from(name).unwrap(),
        abi: crate::regs::Abi::Bits64,
        text: heapless::Vec::new(),
        program: Some(program),
        origin,
    }
}

/// Every origin of a Task record survives the round trip (the parent's ids
/// of a made task at their widest too), and the record is otherwise the
/// same bytes whatever its origin but for the origin itself.
#[test]
fn task_origins_round_trip() {
    let origins = [
        Origin::Named,
        Origin::Made { ppid: 1, ptid: 1 },
        Origin::Made { ppid: 2, ptid: 5 },
        Origin::Made {
            ppid: u32::MAX,
            ptid: u32::MAX,
        },
        Origin::Exec,
    ];
    assert_eq!(Origin::default(), Origin::Named);
    let mut enc: Encoder = Encoder::new(EncoderConfig::default());
    let mut buf = [0u8; MAX_FRAME];
    let mut plain = [0u8; MAX_FRAME];
    let named = program_task(2, 2, "worker", "bin/work", Origin::Named);
    let named_len = postcard::to_slice(&WireRecordRef::Task(&named), &mut plain)
        .unwrap()
        .len();
    let mut bytes = std::vec::Vec::new();
    for origin in origins {
        let t = program_task(2, 2, "worker", "bin/work", origin);
        let n = enc.encode(&Record::Task(t.clone()), &mut buf).unwrap();
        assert_eq!(decode_all(&buf[..n]).0, [Ok(Record::Task(t.clone()))]);
        bytes.extend_from_slice(&buf[..n]);
        // The origin is the record's last field: a variant byte, and the
        // parent's ids as varints for a made task.
        let len = postcard::to_slice(&WireRecordRef::Task(&t), &mut plain)
            .unwrap()
            .len();
        let extra = match origin {
            Origin::Named | Origin::Exec => 0,
            Origin::Made { ppid, ptid } => varint_len(ppid) + varint_len(ptid),
        };
        assert_eq!(len, named_len + extra, "{origin:?}");
    }
    // One stream of all of them decodes to the same records, in order.
    let (out, stats) = decode_all(&bytes);
    let want: std::vec::Vec<_> = origins
        .iter()
        .map(|&o| Ok(Record::Task(program_task(2, 2, "worker", "bin/work", o))))
        .collect();
    assert_eq!(out, want);
    assert_eq!(stats.bad_frames, 0);
}

/// Bytes of `v` as a postcard varint.
fn varint_len(v: u32) -> usize {
    (32 - v.leading_zeros()).max(1).div_ceil(7) as usize
}

/// The largest Task record (every string and list full, every number at
/// its widest, a made task's parent ids too) fits one frame.
#[test]
fn the_largest_task_fits_a_frame() {
    let mut t = program_task(
        u32::MAX,
        u32::MAX,
        "",
        "",
        Origin::Made {
            ppid: u32::MAX,
            ptid: u32::MAX,
        },
    );
    t.time = u64::MAX;
    while t.name.push('\u{10FFFF}').is_ok() {}
    while t.name.push('x').is_ok() {}
    while t
        .text
        .push(TextRange {
            start: u64::MAX,
            len: u64::MAX,
            file_offset: u64::MAX,
        })
        .is_ok()
    {}
    let p = t.program.as_mut().unwrap();
    while p.path.push('x').is_ok() {}
    p.build_id.clear();
    p.build_id.extend_from_slice(&[0xff; MAX_BUILD_ID]).unwrap();
    p.segments.clear();
    while p
        .segments
        .push(Segment {
            start: u64::MAX,
            len: u64::MAX,
            file_offset: u64::MAX,
            prot: u8::MAX,
        })
        .is_ok()
    {}
    assert_eq!(t.name.len(), MAX_TASK_NAME);
    assert_eq!(p.path.len(), MAX_PROGRAM_PATH);
    let mut enc: Encoder = Encoder::new(EncoderConfig::default());
    let mut buf = [0u8; MAX_FRAME];
    let n = enc.encode(&Record::Task(t.clone()), &mut buf).unwrap();
    assert!(n < MAX_FRAME / 2, "{n} bytes");
    assert_eq!(decode_all(&buf[..n]).0, [Ok(Record::Task(t))]);
}

#[test]
fn long_logs_are_cut_and_flagged() {
    let long = "é".repeat(MAX_LOG); // 2 bytes per char
    let l = Log::text(0, LogLevel::Error, &long);
    match &l.payload {
        LogPayload::Text(t) => assert_eq!(t.len(), MAX_LOG),
        other => panic!("{other:?}"),
    }
    assert!(l.truncated);
    assert!(!Log::text(0, LogLevel::Error, "short").truncated);
}

#[test]
fn version_mismatch_is_a_clear_error_and_stops_decoding() {
    let mut h = clock_hello(CpuVendor::Amd, 0x19, 1, 1);
    h.version = PROTOCOL_VERSION + 1;
    let mut enc: Encoder = Encoder::new(EncoderConfig::default());
    let mut buf = [0u8; MAX_FRAME];
    let mut bytes = std::vec::Vec::new();
    let n = enc.encode(&Record::Hello(h.clone()), &mut buf).unwrap();
    bytes.extend_from_slice(&buf[..n]);
    let n = enc.encode(&Record::Sample(sample(0)), &mut buf).unwrap();
    bytes.extend_from_slice(&buf[..n]);
    let (out, stats) = decode_all(&bytes);
    assert_eq!(
        out,
        [Err(DecodeError::VersionMismatch {
            found: PROTOCOL_VERSION + 1,
            expected: PROTOCOL_VERSION
        })]
    );
    assert_eq!(stats.frames_ignored, 2);
    let msg = std::format!("{}", out[0].as_ref().unwrap_err());
    assert!(
        msg.contains(&std::format!("version {}", PROTOCOL_VERSION + 1))
            && msg.contains(&std::format!("version {PROTOCOL_VERSION}")),
        "{msg}"
    );

    h.version = PROTOCOL_VERSION;
    h.magic = *b"NOPE";
    let n = enc.encode(&Record::Hello(h), &mut buf).unwrap();
    let (out, _) = decode_all(&buf[..n]);
    assert_eq!(out, [Err(DecodeError::BadMagic(*b"NOPE"))]);
}

#[test]
fn a_lost_reference_makes_the_delta_unresolved_not_wrong() {
    let mut enc: Encoder<4> = Encoder::new(EncoderConfig {
        keyframe_interval: 4,
        ..EncoderConfig::default()
    });
    let mut buf = [0u8; MAX_FRAME];
    let mut frames = std::vec::Vec::new();
    for i in 0..8 {
        let n = enc.encode(&Record::Sample(sample(i)), &mut buf).unwrap();
        frames.push(buf[..n].to_vec());
    }
    // Drop frame 1 cleanly (whole frame, delimiters intact).
    let bytes: std::vec::Vec<u8> = frames
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 1)
        .flat_map(|(_, f)| f.clone())
        .collect();
    let (out, stats) = decode_all(&bytes);
    let times: std::vec::Vec<u64> = out
        .iter()
        .map(|r| match r {
            Ok(Record::Sample(s)) => s.time,
            other => panic!("{other:?}"),
        })
        .collect();
    // 0 decodes, 2 and 3 refer to the lost chain, 4 is a keyframe.
    assert_eq!(times, [0, 4, 5, 6, 7].map(|i| sample(i).time));
    assert_eq!(stats.unresolved_samples, 2);
    assert_eq!(stats.bad_frames, 2);
}

#[test]
fn garbage_before_the_first_frame_is_skipped() {
    let mut enc: Encoder = Encoder::new(EncoderConfig::default());
    let mut buf = [0u8; MAX_FRAME];
    let n = enc.encode(&Record::End(End::default()), &mut buf).unwrap();
    // Garbage glued to a frame (no delimiter between) spoils that frame:
    // counted, and the next frame decodes.
    let mut bytes = std::vec![0x55u8, 0x13, 0x99];
    bytes.extend_from_slice(&buf[..n]);
    bytes.extend_from_slice(&buf[..n]);
    let (out, stats) = decode_all(&bytes);
    assert_eq!(out, [Ok(Record::End(End::default()))]);
    assert_eq!(stats.bad_frames, 1);
    assert_eq!(stats.bytes_skipped, 3 + n as u64);
    // A delimiter written before the first frame protects it.
    let mut bytes = std::vec![0x55u8, 0x13, 0x99, DELIMITER];
    bytes.extend_from_slice(&buf[..n]);
    let (out, stats) = decode_all(&bytes);
    assert_eq!(out, [Ok(Record::End(End::default()))]);
    assert_eq!(stats.bad_frames, 1);
}

#[test]
fn overlong_runs_are_discarded() {
    let mut bytes = std::vec![0x42u8; MAX_FRAME * 3];
    bytes.push(0);
    let mut enc: Encoder = Encoder::new(EncoderConfig::default());
    let mut buf = [0u8; MAX_FRAME];
    let n = enc.encode(&Record::End(End::default()), &mut buf).unwrap();
    bytes.extend_from_slice(&buf[..n]);
    let (out, stats) = decode_all(&bytes);
    assert_eq!(out, [Ok(Record::End(End::default()))]);
    assert_eq!(stats.bad_frames, 1);
    assert_eq!(stats.bytes_skipped, (MAX_FRAME * 3 + 1) as u64);
}

#[test]
fn a_full_buffer_is_an_error_and_changes_nothing() {
    let mut enc: Encoder = Encoder::new(EncoderConfig::default());
    let mut small = [0u8; 8];
    assert_eq!(
        enc.encode(&Record::Sample(sample(0)), &mut small),
        Err(EncodeError::BufferFull)
    );
    assert_eq!(enc.frames(), 0);
    // The failed sample left no state: the next one is a keyframe that
    // decodes on its own.
    let mut buf = [0u8; MAX_FRAME];
    let n = enc.encode(&Record::Sample(sample(1)), &mut buf).unwrap();
    let (out, _) = decode_all(&buf[..n]);
    assert_eq!(out, [Ok(Record::Sample(sample(1)))]);
}

#[test]
fn a_hello_restarts_delta_state_on_both_sides() {
    let hello = clock_hello(CpuVendor::Intel, 6, 1, 0);
    let mut enc: Encoder<4> = Encoder::new(EncoderConfig::default());
    let mut buf = [0u8; MAX_FRAME];
    let mut bytes = std::vec::Vec::new();
    let mut expected = std::vec::Vec::new();
    for i in 0..6 {
        let rec = if i == 3 {
            Record::Hello(hello.clone())
        } else {
            Record::Sample(sample(i))
        };
        let n = enc.encode(&rec, &mut buf).unwrap();
        bytes.extend_from_slice(&buf[..n]);
        expected.push(Ok(rec));
    }
    let (out, stats) = decode_all(&bytes);
    assert_eq!(out, expected);
    assert_eq!(stats.unresolved_samples, 0);
}

/// A small deterministic generator (xorshift64*), so the differential tests
/// below cover many shapes without extra dependencies.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Samples of every shape the codec distinguishes: keyframes and deltas,
/// dense and sparse registers, shape changes, PID != TID, kernel mode,
/// callchains, branch stacks, interrupt registers and memory fields.
fn varied_samples(rng: &mut Rng, n: usize) -> std::vec::Vec<Sample> {
    use crate::sample::{BranchEntry, BranchFlags, BranchStack, MemInfo};
    let regs = |rng: &mut Rng, prev: Option<&RegsSample>| -> RegsSample {
        let mut r = match prev {
            Some(p) if rng.below(4) != 0 => p.clone(),
            _ => {
                let mask = match rng.below(3) {
                    0 => GPR_MASK,
                    1 => rng.next() & crate::regs::VALID_MASK_WITH_XMM,
                    _ => 0x3,
                };
                let abi = match rng.below(5) {
                    0 => crate::regs::Abi::None,
                    1 => crate::regs::Abi::Bits32,
                    _ => crate::regs::Abi::Bits64,
                };
                let n = if abi == crate::regs::Abi::None {
                    0
                } else {
                    mask.count_ones() as usize
                };
                let mut values = heapless::Vec::new();
                for _ in 0..n {
                    values.push(rng.next() >> rng.below(64)).unwrap();
                }
                return RegsSample { abi, mask, values };
            }
        };
        for v in r.values.iter_mut() {
            match rng.below(4) {
                0 => *v = rng.next(),
                1 => *v = v.wrapping_add(rng.below(100)),
                _ => {}
            }
        }
        r
    };
    let mut out: std::vec::Vec<Sample> = std::vec::Vec::new();
    for i in 0..n {
        let tid = rng.below(3) as u32 + 1;
        let prev = out.iter().rev().find(|s| s.tid == tid);
        let mut s = Sample {
            event: rng.below(3) as u32,
            cpumode: if rng.below(4) == 0 {
                CpuMode::Kernel
            } else {
                CpuMode::User
            },
            ip: 0x40_0000 + rng.below(1 << 20),
            pid: if rng.below(5) == 0 { 99 } else { tid },
            tid,
            time: 1_000_000 + i as u64 * 250_000 + rng.below(1000),
            cpu: rng.below(2) as u32,
            period: 250_000 + rng.below(3),
            ..Default::default()
        };
        for _ in 0..rng.below(6) {
            s.callchain.push(rng.next() >> rng.below(64)).unwrap();
        }
        if rng.below(3) == 0 {
            let mut b = BranchStack {
                hw_idx: rng.below(32),
                entries: heapless::Vec::new(),
            };
            for _ in 0..rng.below(5) {
                b.entries
                    .push(BranchEntry {
                        from: rng.next(),
                        to: rng.next(),
                        flags: BranchFlags::from_perf(rng.next() & 0xff_ffff),
                    })
                    .unwrap();
            }
            s.branches = Some(b);
        }
        if rng.below(5) != 0 {
            s.regs_user = Some(regs(rng, prev.and_then(|p| p.regs_user.as_ref())));
        }
        if rng.below(3) == 0 {
            s.regs_intr = Some(regs(rng, prev.and_then(|p| p.regs_intr.as_ref())));
        }
        if rng.below(4) == 0 {
            s.mem = Some(MemInfo {
                addr: rng.next(),
                weight: rng.below(1000),
                ins_lat: rng.below(1 << 16) as u16,
                data_src: rng.next(),
            });
        }
        out.push(s);
    }
    out
}

/// The postcard payloads (tag byte included, CRC removed) of `samples`.
fn sample_payloads(samples: &[Sample]) -> std::vec::Vec<std::vec::Vec<u8>> {
    let mut enc: Encoder<4> = Encoder::new(EncoderConfig {
        keyframe_interval: 5,
        ..EncoderConfig::default()
    });
    let mut buf = [0u8; MAX_FRAME];
    samples
        .iter()
        .map(|s| {
            let n = enc.encode(&Record::Sample(s.clone()), &mut buf).unwrap();
            let m = cobs::decode_in_place(&mut buf[..n - 1]).unwrap();
            buf[..m - 4].to_vec()
        })
        .collect()
}

/// The fast in-place sample parser accepts and rejects exactly what the
/// serde (postcard) path does, and yields the same value, on valid sample
/// payloads and on truncated and mutated ones, with one parse target reused
/// throughout so nothing of an earlier sample can leak into a later one.
#[test]
fn fast_sample_parser_matches_postcard() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let samples = varied_samples(&mut rng, 600);
    let payloads = sample_payloads(&samples);
    let mut w = WireSample::default();
    let (mut accepted, mut rejected) = (0u32, 0u32);
    let mut check = |p: &[u8], w: &mut WireSample| {
        let reference = match postcard::from_bytes::<WireRecord>(p) {
            Ok(WireRecord::Sample(s)) => Some(s),
            _ => None,
        };
        let fast = w.parse_into(&p[1..]).ok().map(|()| w.clone());
        assert_eq!(fast, reference, "payload {p:02x?}");
        if fast.is_some() {
            accepted += 1;
        } else {
            rejected += 1;
        }
    };
    for p in &payloads {
        assert_eq!(p[0], SAMPLE_TAG);
        check(p, &mut w);
        for cut in 1..p.len() {
            check(&p[..cut], &mut w);
        }
        for _ in 0..20 {
            let mut m = p.clone();
            let at = 1 + rng.below(m.len() as u64 - 1) as usize;
            m[at] = match rng.below(3) {
                0 => m[at] ^ (1 << rng.below(8)),
                1 => 0xff,
                _ => rng.next() as u8,
            };
            check(&m, &mut w);
        }
    }
    // Both outcomes were exercised many times.
    assert!(
        accepted > 5_000 && rejected > 5_000,
        "{accepted} {rejected}"
    );
}

/// Varints at postcard's limits: the longest accepted forms, one byte too
/// many, and a last byte with bits beyond the type.
#[test]
fn fast_parser_varint_limits_match_postcard() {
    // flags = KEY, then event (u32), tid (u32), time, ip, period (u64), cpu.
    let head = |event: &[u8]| {
        let mut p = vec![SAMPLE_TAG, 0x18];
        p.extend_from_slice(event);
        p.extend_from_slice(&[1, 2, 3, 4, 0]);
        p
    };
    let cases: [&[u8]; 6] = [
        &[0xff, 0xff, 0xff, 0xff, 0x0f],       // u32::MAX: accepted
        &[0xff, 0xff, 0xff, 0xff, 0x10],       // 33 bits: rejected
        &[0x80, 0x80, 0x80, 0x80, 0x80, 0x00], // six bytes: rejected
        &[0x80, 0x00],                         // non-canonical zero: accepted
        &[0x7f],
        &[0x80],
    ];
    let mut w = WireSample::default();
    let mut outcomes = std::vec::Vec::new();
    for c in cases {
        let p = head(c);
        let reference = match postcard::from_bytes::<WireRecord>(&p) {
            Ok(WireRecord::Sample(s)) => Some(s),
            _ => None,
        };
        let fast = w.parse_into(&p[1..]).ok().map(|()| w.clone());
        assert_eq!(fast, reference, "{c:02x?}");
        outcomes.push(fast.map(|w| w.event));
    }
    assert_eq!(
        outcomes,
        [Some(u32::MAX), None, None, Some(0), Some(0x7f), None]
    );
    // u64 (the keyframe's time), at every length up to and past ten bytes,
    // with and without bytes after it (the word-at-a-time path needs eight
    // at hand).
    let time = |t: &[u8], pad: usize| {
        let mut p = vec![SAMPLE_TAG, 0x18, 1, 2];
        p.extend_from_slice(t);
        p.extend_from_slice(&[3, 4, 0]);
        p.extend(std::iter::repeat_n(0x55, pad));
        p
    };
    let mut cases: std::vec::Vec<std::vec::Vec<u8>> = std::vec::Vec::new();
    for len in 1..=11 {
        for last in [0x00, 0x01, 0x02, 0x7f] {
            let mut t = vec![0xff; len - 1];
            t.push(last);
            cases.push(t.clone());
            let mut z = vec![0x80; len - 1];
            z.push(last);
            cases.push(z);
        }
    }
    cases.push(vec![0xff; 8]);
    cases.push(vec![0xff; 9]);
    cases.push(vec![0xff; 12]);
    let mut accepted = 0;
    for c in &cases {
        for pad in [0, 1, 8] {
            let p = time(c, pad);
            let reference = match postcard::from_bytes::<WireRecord>(&p) {
                Ok(WireRecord::Sample(s)) => Some(s),
                _ => None,
            };
            let fast = w.parse_into(&p[1..]).ok().map(|()| w.clone());
            assert_eq!(fast, reference, "{p:02x?}");
            accepted += usize::from(fast.is_some());
        }
    }
    assert!(accepted > 50 && accepted < cases.len() * 3, "{accepted}");
    // The ten-byte maximum and the value just past it.
    let mut max = vec![0xff; 9];
    max.push(0x01);
    assert_eq!(w.parse_into(&time(&max, 8)[1..]), Ok(()));
    assert_eq!(w.time, u64::MAX);
    max[9] = 0x02;
    assert!(w.parse_into(&time(&max, 8)[1..]).is_err());
}

/// `push_ref` rebuilds samples in one reused record: fields a sample does
/// not carry must not survive from the previous, richer sample.
#[test]
fn lent_samples_carry_nothing_over() {
    let mut rng = Rng(7);
    let samples = varied_samples(&mut rng, 400);
    let mut enc: Encoder<4> = Encoder::new(EncoderConfig {
        keyframe_interval: 5,
        ..EncoderConfig::default()
    });
    let mut bytes = std::vec::Vec::new();
    let mut buf = [0u8; MAX_FRAME];
    for s in &samples {
        let n = enc.encode(&Record::Sample(s.clone()), &mut buf).unwrap();
        bytes.extend_from_slice(&buf[..n]);
    }
    let mut d = Decoder::new();
    let mut got = std::vec::Vec::new();
    // Odd chunk sizes so frames straddle chunks.
    for chunk in bytes.chunks(97) {
        d.push_ref(chunk, |r| match r {
            Ok(Record::Sample(s)) => got.push(s.clone()),
            other => panic!("{other:?}"),
        });
    }
    assert_eq!(got.len(), samples.len());
    for (i, (g, s)) in got.iter().zip(&samples).enumerate() {
        assert_eq!(g, s, "sample {i}");
    }
    assert_eq!(d.stats().bad_frames, 0);
}

/// The run-copying COBS decoder agrees with the `cobs` crate on every
/// zero-free input: valid encodings of random payloads (long runs and
/// 0xff blocks included), and random and truncated byte strings.
#[test]
fn cobs_decoder_matches_the_cobs_crate() {
    let mut rng = Rng(0x51ed_270b_9a3c_44e1);
    let check = |input: &[u8]| {
        assert!(!input.contains(&0));
        let mut ours = [0xa5u8; MAX_FRAME + 16];
        let mut theirs = input.to_vec();
        let a = decoder::cobs_decode_to(input, &mut ours);
        let b = cobs::decode_in_place(&mut theirs).ok();
        assert_eq!(a, b, "{input:02x?}");
        if let Some(n) = a {
            assert_eq!(ours[..n], theirs[..n], "{input:02x?}");
        }
        a.is_some()
    };
    let mut valid = 0;
    for i in 0..3000 {
        let len = if i % 10 == 0 {
            rng.below(700) as usize
        } else {
            rng.below(60) as usize
        };
        let payload: std::vec::Vec<u8> = (0..len)
            .map(|_| {
                if rng.below(4) == 0 {
                    0
                } else {
                    rng.next() as u8
                }
            })
            .collect();
        let mut enc = vec![0u8; cobs::max_encoding_length(len)];
        let n = cobs::encode(&payload, &mut enc);
        if n > 0 {
            valid += u32::from(check(&enc[..n]));
            let mut ours = [0u8; MAX_FRAME + 16];
            let m = decoder::cobs_decode_to(&enc[..n], &mut ours).unwrap();
            assert_eq!(ours[..m], payload[..], "round trip");
        }
        for cut in [1, n / 2, n.saturating_sub(1)] {
            if cut > 0 && cut < n {
                check(&enc[..cut]);
            }
        }
        let noise: std::vec::Vec<u8> = (0..rng.below(40))
            .map(|_| (rng.below(255) + 1) as u8)
            .collect();
        check(&noise);
    }
    assert!(valid > 2500, "{valid}");
}

/// What a frame splitter must give, done the plain way: bytes are
/// collected up to each zero, and the frame between two zeros is undone by
/// the `cobs` crate. Frames longer than `MAX_FRAME` are bad, and so are
/// frames that do not decode or are too short for a CRC.
#[derive(Default)]
struct PlainFramer {
    frame: std::vec::Vec<u8>,
    bad_frames: u64,
    bytes_skipped: u64,
}

/// One frame as a splitter hands it on: payload, stored and plain CRC,
/// wire length.
type FrameParts = (std::vec::Vec<u8>, u32, u32, usize);

impl PlainFramer {
    fn push(&mut self, chunk: &[u8], out: &mut std::vec::Vec<FrameParts>) {
        for &b in chunk {
            if b != 0 {
                self.frame.push(b);
                continue;
            }
            let len = self.frame.len();
            let mut plain = core::mem::take(&mut self.frame);
            let decoded = match cobs::decode_in_place(&mut plain) {
                Ok(n) if n >= 5 && len <= MAX_FRAME => Some(n),
                _ => None,
            };
            match decoded {
                _ if len == 0 => {}
                Some(n) => {
                    let (payload, crc) = plain[..n].split_at(n - 4);
                    out.push((
                        payload.to_vec(),
                        u32::from_le_bytes(crc.try_into().unwrap()),
                        decoder::frame_crc(payload),
                        len,
                    ));
                }
                None => {
                    self.bad_frames += 1;
                    self.bytes_skipped += len as u64 + 1;
                }
            }
        }
    }
}

/// `Framer`, which finds most frames while undoing their COBS, splits
/// streams exactly as [`PlainFramer`] does, with the same counters: real
/// frames, frames with long runs and full 254-byte blocks, frames around
/// the scan limit and `MAX_FRAME`, and all of them damaged (zeros written
/// inside runs, bytes flipped, dropped or inserted), fed in chunks of many
/// sizes so that frames start near and span chunk ends.
#[test]
fn framer_splits_like_a_plain_splitter() {
    let mut rng = Rng(0x7a3d_19c4_e2b8_0f51);
    let mut enc: Encoder<4> = Encoder::new(EncoderConfig {
        keyframe_interval: 5,
        ..EncoderConfig::default()
    });
    let mut buf = [0u8; MAX_FRAME];
    let mut clean = vec![0u8];
    for (i, s) in varied_samples(&mut rng, 600).iter().enumerate() {
        let n = enc.encode(&Record::Sample(s.clone()), &mut buf).unwrap();
        clean.extend_from_slice(&buf[..n]);
        if i % 50 == 7 {
            // A frame of random bytes, often with long runs; some around
            // the scan limit, some past MAX_FRAME.
            let len = match rng.below(4) {
                0 => rng.below(600) as usize,
                1 => 1000 + rng.below(80) as usize,
                2 => MAX_FRAME - 10 + rng.below(20) as usize,
                _ => rng.below(40) as usize,
            };
            let zero_odds = [2, 30, 1000][rng.below(3) as usize];
            let p: std::vec::Vec<u8> = (0..len)
                .map(|_| {
                    if rng.below(zero_odds) == 0 {
                        0
                    } else {
                        rng.below(256) as u8
                    }
                })
                .collect();
            let mut e = vec![0u8; cobs::max_encoding_length(p.len())];
            let m = cobs::encode(&p, &mut e);
            clean.extend_from_slice(&e[..m]);
            clean.push(0);
        }
    }
    let mut streams = vec![clean.clone()];
    for round in 0..24 {
        let mut b = clean.clone();
        for _ in 0..(1 + round * 3) {
            let pos = rng.below(b.len() as u64) as usize;
            match rng.below(5) {
                // Zeros where runs are: frames end inside a run.
                0 | 1 => b[pos] = 0,
                2 => b[pos] ^= (rng.below(255) + 1) as u8,
                3 => {
                    b.remove(pos);
                }
                _ => b.insert(pos, rng.below(256) as u8),
            }
        }
        streams.push(b);
    }
    let mut frames_seen = 0;
    for (i, stream) in streams.iter().enumerate() {
        for chunk in [1, 7, 100, 1055, 1057, 4099, 65536, 1 + (i * 977) % 3000] {
            let (mut ours, mut theirs) = (std::vec::Vec::new(), std::vec::Vec::new());
            let (mut framer, mut plain) = (Framer::new(), PlainFramer::default());
            for c in stream.chunks(chunk) {
                framer.push(c, |f| {
                    let (p, stored, crc, len) = f.parts();
                    ours.push((p.to_vec(), stored, crc, len));
                });
                plain.push(c, &mut theirs);
            }
            // A last delimiter, so a frame cut off at the end is counted
            // by both.
            framer.push(&[0], |f| {
                let (p, stored, crc, len) = f.parts();
                ours.push((p.to_vec(), stored, crc, len));
            });
            plain.push(&[0], &mut theirs);
            assert_eq!(ours.len(), theirs.len(), "stream {i} chunk {chunk}");
            for (k, (a, b)) in ours.iter().zip(&theirs).enumerate() {
                assert_eq!(a, b, "stream {i} chunk {chunk} frame {k}");
            }
            let st = framer.stats();
            assert_eq!(
                (st.bad_frames, st.bytes_skipped),
                (plain.bad_frames, plain.bytes_skipped),
                "stream {i} chunk {chunk}"
            );
            frames_seen += ours.len();
        }
    }
    assert!(frames_seen > 100_000, "{frames_seen}");
}

/// `cobs_scan_to` either gives up or finds the frame end that `memchr`
/// finds and decodes it as `cobs_decode_to` does, on random bytes with
/// zeros at every density, and finds nearly every frame of a clean stream.
#[test]
fn cobs_scan_agrees_with_memchr_and_cobs_decode() {
    let mut rng = Rng(0x0dd5_ca11_ab1e_f00d);
    let mut decoded = 0;
    for i in 0..20_000 {
        let len = if i % 4 == 0 {
            rng.below(3000) as usize
        } else {
            1200 + rng.below(200) as usize
        };
        let zero_odds = [2, 8, 40, 200, 5000][i % 5];
        let src: std::vec::Vec<u8> = (0..len)
            .map(|_| {
                if rng.below(zero_odds) == 0 {
                    0
                } else {
                    (rng.below(255) + 1) as u8
                }
            })
            .collect();
        let mut ours = [0x5au8; MAX_FRAME + 16];
        match decoder::cobs_scan_to(&src, &mut ours) {
            decoder::Scan::Decoded { end, n } => {
                decoded += 1;
                assert_eq!(memchr::memchr(0, &src), Some(end), "{src:02x?}");
                if end == 0 {
                    assert_eq!(n, 0);
                    continue;
                }
                let mut theirs = [0xa5u8; MAX_FRAME + 16];
                assert_eq!(
                    decoder::cobs_decode_to(&src[..end], &mut theirs),
                    Some(n),
                    "{src:02x?}"
                );
                assert_eq!(ours[..n], theirs[..n]);
            }
            decoder::Scan::Open => {}
        }
    }
    assert!(decoded > 2000, "{decoded}");
    // In a clean stream of samples the scan finds every frame with enough
    // bytes after it, unless the frame is longer than the scan limit or
    // holds a full 254-byte run.
    let mut enc: Encoder<4> = Encoder::new(EncoderConfig::default());
    let mut buf = [0u8; MAX_FRAME];
    let mut stream = std::vec::Vec::new();
    let mut ends = std::vec::Vec::new();
    for s in varied_samples(&mut rng, 300) {
        let n = enc.encode(&Record::Sample(s), &mut buf).unwrap();
        stream.extend_from_slice(&buf[..n]);
        ends.push(stream.len() - 1);
    }
    let (mut start, mut found) = (0, 0);
    let mut plain = [0u8; MAX_FRAME + 16];
    for &end in &ends {
        if stream.len() - start < 1100 {
            break;
        }
        let frame = &stream[start..end];
        let mut full_run = false;
        let mut c = 0;
        while c < frame.len() {
            full_run |= frame[c] == 0xff;
            c += usize::from(frame[c]);
        }
        let got = decoder::cobs_scan_to(&stream[start..], &mut plain);
        if frame.len() <= 1024 && !full_run {
            found += 1;
            assert_eq!(
                got,
                decoder::Scan::Decoded {
                    end: end - start,
                    n: cobs::decode(frame, &mut [0u8; MAX_FRAME]).unwrap()
                }
            );
        }
        start = end + 1;
    }
    assert!(found > 200, "{found}");
}

/// The decoder's frame CRC is CRC-32C (CRC-32/ISCSI) at every length
/// (below, inside and above the 8-byte words and the three-way interleaved
/// blocks of the hardware path) and alignment, byte-for-byte the same as
/// the bitwise definition in the `crc` crate, and the same as the
/// encoder's table-driven CRC.
#[test]
fn frame_crc_is_crc32c() {
    const BITWISE: crc::Crc<u32, crc::NoTable> =
        crc::Crc::<u32, crc::NoTable>::new(&crc::CRC_32_ISCSI);
    let mut rng = Rng(0x0c4c_32f0_77a1_d9e5);
    let data: std::vec::Vec<u8> = (0..1100).map(|_| rng.below(256) as u8).collect();
    for len in 0..=600 {
        for start in [0, 1, 7] {
            let b = &data[start..start + len];
            let want = BITWISE.checksum(b);
            assert_eq!(decoder::frame_crc(b), want, "len {len} start {start}");
            assert_eq!(encoder::CRC32.checksum(b), want, "len {len} start {start}");
            assert_eq!(
                super::castagnoli::crc32c_append(0, b),
                want,
                "len {len} start {start}"
            );
            // In two parts, split anywhere.
            let (x, y) = b.split_at(len / 3);
            let parts = super::castagnoli::crc32c_append(super::castagnoli::crc32c_append(0, x), y);
            assert_eq!(parts, want, "len {len} start {start} split");
        }
    }
    assert_eq!(decoder::frame_crc(b"123456789"), 0xe306_9283);
    assert_eq!(encoder::CRC32.checksum(b"123456789"), 0xe306_9283);
    assert_eq!(
        super::castagnoli::crc32c_append(0, b"123456789"),
        0xe306_9283
    );
}

/// The CRC the encoder stores in a frame is the decoder's CRC of the
/// payload (keyframes and other records), or that CRC XORed with the
/// task's chain (delta samples): the CRC-32C of the previous chain, the
/// previous frame's plain CRC and its count since the keyframe.
#[test]
fn encoded_frames_carry_the_decoders_crc() {
    let mut enc: Encoder<4> = Encoder::new(EncoderConfig {
        keyframe_interval: 4,
        ..EncoderConfig::default()
    });
    let mut buf = [0u8; MAX_FRAME];
    let mut chain = 0u32;
    for i in 0..12u32 {
        let n = enc
            .encode(&Record::Sample(sample(u64::from(i))), &mut buf)
            .unwrap();
        let mut raw = buf[..n - 1].to_vec();
        let m = cobs::decode_in_place(&mut raw).unwrap();
        let (payload, crc) = raw[..m].split_at(m - 4);
        let stored = u32::from_le_bytes(crc.try_into().unwrap());
        let plain = decoder::frame_crc(payload);
        if i % 4 == 0 {
            assert_eq!(stored, plain, "keyframe {i}");
            chain = 0;
        } else {
            assert_eq!(stored, plain ^ chain, "delta {i}");
        }
        chain = decoder::frame_crc(&super::codec::chain_input(chain, plain, i % 4));
    }
    let n = enc.encode(&Record::End(End::default()), &mut buf).unwrap();
    let mut raw = buf[..n - 1].to_vec();
    let m = cobs::decode_in_place(&mut raw).unwrap();
    let (payload, crc) = raw[..m].split_at(m - 4);
    assert_eq!(
        u32::from_le_bytes(crc.try_into().unwrap()),
        decoder::frame_crc(payload)
    );
}

/// A frame as protocol version 1 wrote it: `payload`, its CRC-32/ISO-HDLC
/// (XOR `chain`), COBS and the delimiter.
fn version_1_frame(payload: &[u8], chain: u32) -> std::vec::Vec<u8> {
    const ISO_HDLC: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);
    cobs_frame(payload, ISO_HDLC.checksum(payload) ^ chain)
}

/// `payload` and the check word `crc` as a frame: COBS and the delimiter.
fn cobs_frame(payload: &[u8], crc: u32) -> std::vec::Vec<u8> {
    let mut p = payload.to_vec();
    p.extend_from_slice(&crc.to_le_bytes());
    let mut out = vec![0u8; cobs::max_encoding_length(p.len()) + 1];
    let m = cobs::encode(&p, &mut out);
    out.truncate(m);
    out.push(0);
    out
}

/// A version-1 stream (frames checked with CRC-32/ISO-HDLC) gets the
/// version error, on every decoding path, not a bad frame per record; a
/// frame with that CRC whose magic is wrong is only a bad frame.
#[test]
fn a_version_1_stream_gets_the_version_error() {
    let mut h = clock_hello(CpuVendor::Intel, 6, 0x55, 4);
    h.version = 1;
    let mut plain = [0u8; MAX_FRAME];
    let hello = postcard::to_slice(&WireRecordRef::Hello(&h), &mut plain)
        .unwrap()
        .to_vec();
    assert_eq!(hello[0], 0, "a Hello is variant 0");
    let mut bytes = vec![0u8];
    bytes.extend(version_1_frame(&hello, 0));
    // A keyframe, then a delta sample chained to it, as version 1 sent
    // them: re-framed with the old CRC.
    let mut enc: Encoder<4> = Encoder::new(EncoderConfig::default());
    let mut buf = [0u8; MAX_FRAME];
    let mut chain = 0;
    for i in 0..2 {
        let n = enc.encode(&Record::Sample(sample(i)), &mut buf).unwrap();
        let mut raw = buf[..n - 1].to_vec();
        let m = cobs::decode_in_place(&mut raw).unwrap();
        let payload = raw[..m - 4].to_vec();
        bytes.extend(version_1_frame(&payload, chain));
        chain = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC).checksum(&payload);
    }
    let want = [Err(DecodeError::VersionMismatch {
        found: 1,
        expected: PROTOCOL_VERSION,
    })];
    assert_eq!(PROTOCOL_VERSION, 15);
    #[cfg(feature = "std")]
    let paths = [Path::Rebuilt, Path::Parts, Path::Batches];
    #[cfg(not(feature = "std"))]
    let paths = [Path::Rebuilt, Path::Parts];
    for chunk in [1, 7, bytes.len()] {
        for path in paths {
            let (out, stats) = lend_all(&bytes, chunk, path);
            assert_eq!(out, want, "chunk {chunk}");
            assert_eq!(stats.frames_ignored, 3, "chunk {chunk}");
            assert_eq!(stats.bad_frames, 0, "chunk {chunk}");
            assert_eq!(stats.frames_ok, 0, "chunk {chunk}");
        }
    }

    // The old CRC with a wrong magic, or a CRC that is neither: bad frames.
    let mut bad_magic = hello.clone();
    bad_magic[1] ^= 0x20;
    let mut bad_crc = version_1_frame(&hello, 0);
    let at = bad_crc.len() - 2;
    bad_crc[at] = if bad_crc[at] == 1 { 2 } else { 1 };
    for frame in [version_1_frame(&bad_magic, 0), bad_crc] {
        let (out, stats) = decode_all(&frame);
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(stats.bad_frames, 1);
        assert_eq!(stats.frames_ignored, 0);
    }

    // A version-2 Hello (CRC-32C, with the chain of the previous payload
    // only) gets the version error too.
    h.version = 2;
    let n = enc.encode(&Record::Hello(h.clone()), &mut buf).unwrap();
    let (out, _) = decode_all(&buf[..n]);
    assert_eq!(
        out,
        [Err(DecodeError::VersionMismatch {
            found: 2,
            expected: PROTOCOL_VERSION,
        })]
    );

    // The same Hello as this version writes it decodes.
    h.version = PROTOCOL_VERSION;
    let n = enc.encode(&Record::Hello(h.clone()), &mut buf).unwrap();
    let (out, stats) = decode_all(&buf[..n]);
    assert_eq!(out, [Ok(Record::Hello(h))]);
    assert_eq!(stats.bad_frames, 0);
}

/// How [`lend_all`] feeds a decoder.
#[derive(Clone, Copy, PartialEq)]
enum Path {
    /// `push_ref`.
    Rebuilt,
    /// `push_parts`.
    Parts,
    /// A separate `Framer` into `FrameBatch`es of several chunks, then
    /// `push_batch_parts` (with `std`).
    #[cfg(feature = "std")]
    Batches,
}

/// Everything `push_ref` yields for `bytes` fed in chunks of `chunk`
/// bytes, with samples built from [`SampleParts`] on the other paths.
fn lend_all(
    bytes: &[u8],
    chunk: usize,
    path: Path,
) -> (std::vec::Vec<Result<Record, DecodeError>>, DecoderStats) {
    let mut d = Decoder::new();
    let mut out = std::vec::Vec::new();
    #[cfg(feature = "std")]
    let (mut framer, mut batch) = (Framer::new(), FrameBatch::new());
    let mut lend = |r: Result<Lent<'_>, DecodeError>| {
        out.push(r.map(|l| match l {
            Lent::Record(r) => r.clone(),
            Lent::Sample(p) => Record::Sample(p.to_sample()),
        }))
    };
    for (i, c) in bytes.chunks(chunk).enumerate() {
        let _ = i; // Only batches use it.
        match path {
            Path::Rebuilt => d.push_ref(c, |r| lend(r.map(Lent::Record))),
            Path::Parts => d.push_parts(c, &mut lend),
            #[cfg(feature = "std")]
            Path::Batches => {
                batch.push_from(&mut framer, c);
                if i % 3 == 2 {
                    d.push_batch_parts(&batch, &mut lend);
                    batch.clear();
                }
            }
        }
    }
    #[cfg(feature = "std")]
    if path == Path::Batches {
        d.push_batch_parts(&batch, &mut lend);
    }
    (out, d.stats())
}

/// Re-frames `frame` (one encoded frame, delimiter included) with its
/// payload byte at `at` replaced by `value`, keeping the CRC valid against
/// the same chain value: the decoder's checks past the CRC see the change.
fn remade_frame(frame: &[u8], at: usize, value: u8) -> std::vec::Vec<u8> {
    let mut raw = frame[..frame.len() - 1].to_vec();
    let n = cobs::decode_in_place(&mut raw).unwrap();
    let (payload, crc) = raw[..n].split_at(n - 4);
    let stored = u32::from_le_bytes(crc.try_into().unwrap());
    let chain = stored ^ super::decoder::frame_crc(payload);
    let mut p = payload.to_vec();
    let at = at % p.len();
    p[at] = value;
    cobs_frame(&p, super::decoder::frame_crc(&p) ^ chain)
}

/// `push_parts`, which never builds a `Sample` and brings each task's
/// reference up to date in place, lends exactly the samples `push_ref`
/// rebuilds, and counts the same, and so does framing apart into batches
/// (`push_batch_parts`), on streams of every sample shape with
/// other records between them: intact, with random bytes flipped, cut
/// short, with frames dropped (lost references), with payloads changed
/// behind a valid CRC (frames that pass the CRC but not the codec checks),
/// and with such changed copies sent just before their intact frames (a
/// refused frame must leave its task's state as it was).
#[test]
fn sample_parts_match_rebuilt_samples() {
    let mut rng = Rng(0xfeed_beef);
    let samples = varied_samples(&mut rng, 1500);
    let mut enc: Encoder<4> = Encoder::new(EncoderConfig {
        keyframe_interval: 6,
        ..EncoderConfig::default()
    });
    let mut frames = std::vec::Vec::new();
    let mut buf = [0u8; MAX_FRAME];
    for (i, s) in samples.iter().enumerate() {
        if i % 97 == 3 {
            let rec = Record::Lost(Lost {
                time: i as u64,
                cpu: 0,
                event: 1,
                count: 2,
                reason: LostReason::RingFull,
            });
            let n = enc.encode(&rec, &mut buf).unwrap();
            frames.push(buf[..n].to_vec());
        }
        let n = enc.encode(&Record::Sample(s.clone()), &mut buf).unwrap();
        frames.push(buf[..n].to_vec());
    }
    let clean: std::vec::Vec<u8> = frames.concat();
    let mut streams = vec![clean.clone()];
    for round in 0..12u64 {
        // Flipped bytes.
        let mut b = clean.clone();
        for _ in 0..(round + 1) * 5 {
            let at = rng.below(b.len() as u64) as usize;
            b[at] ^= 1 << rng.below(8);
        }
        streams.push(b);
        // Cut short.
        let cut = rng.below(clean.len() as u64) as usize;
        streams.push(clean[..cut].to_vec());
        // Dropped frames and payloads changed behind a valid CRC.
        let mut b = std::vec::Vec::new();
        for f in &frames {
            match rng.below(40) {
                0 => {}
                1..=3 => {
                    let at = rng.below(f.len() as u64) as usize;
                    let v = match rng.below(3) {
                        0 => 0x80,
                        1 => rng.below(60) as u8,
                        _ => rng.next() as u8,
                    };
                    b.extend_from_slice(&remade_frame(f, at, v));
                }
                // A changed copy, then the frame itself: whatever the copy
                // did to its task's state before it was refused shows in
                // the frame after it, which is chained to the same state.
                4..=6 => {
                    let at = rng.below(f.len() as u64) as usize;
                    let v = match rng.below(3) {
                        0 => 0x80,
                        1 => rng.below(60) as u8,
                        _ => rng.next() as u8,
                    };
                    b.extend_from_slice(&remade_frame(f, at, v));
                    b.extend_from_slice(f);
                }
                _ => b.extend_from_slice(f),
            }
        }
        streams.push(b);
    }
    let (mut samples_seen, mut bad) = (0usize, 0u64);
    for (i, s) in streams.iter().enumerate() {
        let chunk = 1 + (i * 37) % 300;
        let (want, want_stats) = lend_all(s, chunk, Path::Rebuilt);
        #[cfg(feature = "std")]
        let paths = [Path::Parts, Path::Batches];
        #[cfg(not(feature = "std"))]
        let paths = [Path::Parts];
        for path in paths {
            let (got, got_stats) = lend_all(s, chunk, path);
            assert_eq!(got.len(), want.len(), "stream {i}");
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g, w, "stream {i}, record {k}");
            }
            assert_eq!(got_stats, want_stats, "stream {i}");
        }
        samples_seen += want
            .iter()
            .filter(|r| matches!(r, Ok(Record::Sample(_))))
            .count();
        bad += want_stats.bad_frames;
    }
    assert!(samples_seen > 20_000 && bad > 500, "{samples_seen} {bad}");
}

/// The register-block reader's eight-at-a-time path: blocks of every
/// length up to the maximum, signed (deltas) and unsigned (absolute), with
/// one-byte varints and longer ones at every position, parse exactly as
/// postcard parses them, also cut short and with bytes changed.
#[test]
fn register_blocks_parse_like_postcard() {
    use super::codec::flag;
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    let mut w = WireSample::default();
    let mut buf = [0u8; MAX_FRAME];
    let (mut accepted, mut rejected, mut fast) = (0u32, 0u32, 0u32);
    for round in 0..3000u64 {
        let n = (round % 57) as usize;
        let signed = round % 2 == 0;
        let long_every = [0, 3, 9, 40][(round / 2 % 4) as usize];
        let mut src = WireSample {
            flags: if signed {
                flag::UREGS | flag::UREGS_DELTA
            } else {
                flag::UREGS | flag::UREGS_SHAPE | flag::KEY
            },
            tid: 1,
            ..Default::default()
        };
        src.uregs.abi = 2;
        src.uregs.mask = (1u64 << n) - 1;
        for _ in 0..n {
            let small = if signed {
                (rng.below(128) as i64 - 64) as u64
            } else {
                rng.below(128)
            };
            let v = block_value(&mut rng, long_every, small);
            src.uregs.values.push(v).unwrap();
        }
        let p = postcard::to_slice(&WireRecordRef::Sample(&src), &mut buf)
            .unwrap()
            .to_vec();
        let check = |p: &[u8]| {
            let reference = match postcard::from_bytes::<WireRecord>(p) {
                Ok(WireRecord::Sample(s)) => Some(s),
                _ => None,
            };
            let got = w.parse_into(&p[1..]).ok().map(|()| w.clone());
            assert_eq!(got, reference, "payload {p:02x?}");
            if got.is_some() {
                accepted += 1;
            } else {
                rejected += 1;
            }
        };
        check_cut_and_changed(&mut rng, &p, check);
        fast += u32::from(n >= 8 && long_every == 0);
    }
    assert!(
        accepted > 8_000 && rejected > 8_000 && fast > 300,
        "{accepted} {rejected} {fast}"
    );
}

/// A value for a register block under test: `small` (a one-byte varint),
/// or, about one time in `long_every` (never when it is 0), a value of
/// several bytes.
fn block_value(rng: &mut Rng, long_every: u64, small: u64) -> u64 {
    if long_every != 0 && rng.below(long_every) == 0 {
        rng.next() >> rng.below(56)
    } else {
        small
    }
}

/// Runs `check` on the sample payload `p`, then six times on a copy cut
/// short and on a copy with one byte changed (never the tag byte).
fn check_cut_and_changed(rng: &mut Rng, p: &[u8], mut check: impl FnMut(&[u8])) {
    check(p);
    for _ in 0..6 {
        check(&p[..1 + rng.below(p.len() as u64 - 1) as usize]);
        let mut m = p.to_vec();
        let at = 1 + rng.below(m.len() as u64 - 1) as usize;
        m[at] = match rng.below(3) {
            0 => m[at] ^ 0x80,
            1 => 0xff,
            _ => rng.next() as u8,
        };
        check(&m);
    }
}

/// The first `n` register bits of the valid mask.
fn first_regs(n: usize) -> u64 {
    let mut m = 0u64;
    let mut valid = crate::regs::VALID_MASK_WITH_XMM;
    for _ in 0..n {
        let low = valid & valid.wrapping_neg();
        m |= low;
        valid &= !low;
    }
    m
}

/// The dense-delta path (`parse_head`, then `TaskRef::apply_dense`, which
/// sums the register deltas onto the reference as it reads them) accepts
/// exactly the payloads that `parse_into` followed by `apply` accepts, and
/// leaves the same state, on blocks of every length with one-byte and
/// longer deltas at every position, with and without interrupt registers
/// and memory fields after the block, against references that do and do
/// not fit the block, also cut short and with bytes changed. A refused
/// payload leaves the state as it was.
#[test]
fn dense_register_sums_match_parse_and_apply() {
    use super::codec::{DenseScratch, Reader, flag};
    use crate::regs::Abi;
    use crate::sample::MemInfo;
    let mut rng = Rng(0x5eed_f00d_de45);
    let mut scratch = DenseScratch::default();
    let (mut w, mut w2) = (WireSample::default(), WireSample::default());
    let mut buf = [0u8; MAX_FRAME];
    let (mut accepted, mut rejected, mut fast) = (0u32, 0u32, 0u32);
    for round in 0..4000u64 {
        let n = (round % 57) as usize;
        let long_every = [0, 3, 9, 40][(round / 57 % 4) as usize];
        // The reference: usually one that fits the block.
        let mut reference = TaskRef::empty(7);
        reference.chain = rng.next() as u32;
        reference.time = rng.next();
        reference.ip = rng.next();
        let mut regs = RegsSample {
            abi: Abi::Bits64,
            mask: first_regs(n),
            values: heapless::Vec::new(),
        };
        for _ in 0..n {
            regs.values.push(rng.next() >> rng.below(64)).unwrap();
        }
        match rng.below(12) {
            0 => regs.abi = Abi::None,
            1 => regs.mask = first_regs(n + 1),
            2 => regs.mask |= 1 << 63,
            3 => regs.mask = 0,
            _ => {}
        }
        reference.regs_user = (rng.below(16) != 0).then_some(regs);
        if rng.below(3) == 0 {
            reference.regs_intr = Some(RegsSample {
                abi: Abi::Bits64,
                mask: first_regs(2),
                values: heapless::Vec::from_slice(&[1, 2]).unwrap(),
            });
        }
        let mut src = WireSample {
            flags: flag::UREGS | flag::UREGS_DELTA,
            tid: 7,
            time: rng.below(1 << 20),
            ip: rng.next(),
            ..Default::default()
        };
        for _ in 0..n {
            let small = (rng.below(128) as i64 - 64) as u64;
            let v = block_value(&mut rng, long_every, small);
            src.uregs.values.push(v).unwrap();
        }
        // A block of the wrong length now and then.
        if rng.below(10) == 0 && n < 56 {
            src.uregs.values.push(3).unwrap();
        } else if rng.below(10) == 0 && n > 0 {
            src.uregs.values.pop();
        }
        match rng.below(4) {
            0 => {
                src.flags |= flag::IREGS | flag::IREGS_DELTA;
                src.iregs
                    .values
                    .extend_from_slice(&[5, 1u64.wrapping_neg()])
                    .unwrap();
            }
            1 => src.flags |= flag::IREGS,
            2 => {
                src.flags |= flag::MEM;
                src.mem = MemInfo {
                    addr: rng.next(),
                    weight: rng.below(1000),
                    ins_lat: rng.below(1 << 16) as u16,
                    data_src: rng.next() >> 20,
                };
            }
            _ => {}
        }
        let p = postcard::to_slice(&WireRecordRef::Sample(&src), &mut buf)
            .unwrap()
            .to_vec();
        let check = |p: &[u8]| {
            let body = &p[1..];
            let mut want_state = reference.clone();
            let want = w
                .parse_into(body)
                .map_err(|_| ())
                .and_then(|()| want_state.apply(&w, 11, 5).map_err(|_| ()));
            let mut got_state = reference.clone();
            let mut rd = Reader::new(body);
            let got = w2.parse_head(&mut rd).map_err(|_| ()).and_then(|()| {
                // Changed flags leave the dense path: nothing to compare.
                if w2.dense_uregs() && !w2.is_key() && w2.tid() == 7 {
                    got_state
                        .apply_dense(&mut w2, rd, &mut scratch, 11, 5)
                        .map_err(|_| ())
                } else {
                    Err(())
                }
            });
            if !(w2.dense_uregs() && !w2.is_key() && w2.tid() == 7) {
                return;
            }
            assert_eq!(got, want, "payload {p:02x?} against {reference:?}");
            if got.is_ok() {
                assert_eq!(got_state, want_state, "payload {p:02x?}");
                let lent = |wire, state| SampleParts { wire, state }.to_sample();
                assert_eq!(
                    lent(&w2, &got_state),
                    lent(&w, &want_state),
                    "payload {p:02x?}"
                );
                accepted += 1;
            } else {
                assert_eq!(got_state, reference, "refused payload {p:02x?}");
                rejected += 1;
            }
        };
        check_cut_and_changed(&mut rng, &p, check);
        fast += u32::from(n >= 8 && long_every == 0);
    }
    assert!(
        accepted > 3_000 && rejected > 8_000 && fast > 300,
        "{accepted} {rejected} {fast}"
    );
}
