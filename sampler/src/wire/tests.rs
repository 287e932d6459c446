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

#[test]
fn other_records_round_trip() {
    let hello = {
        let mut h = Hello::new(
            CpuId {
                vendor: CpuVendor::Intel,
                family: 6,
                model: 0x55,
                stepping: 4,
            },
            crate::event::PmuCaps::cpu_clock(),
        );
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
    };
    task.name.push_str("spin32").unwrap();
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
    let mut h = Hello::new(
        CpuId {
            vendor: CpuVendor::Amd,
            family: 0x19,
            model: 1,
            stepping: 1,
        },
        crate::event::PmuCaps::cpu_clock(),
    );
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
        msg.contains("version 2") && msg.contains("version 1"),
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
    let hello = Hello::new(
        CpuId {
            vendor: CpuVendor::Intel,
            family: 6,
            model: 1,
            stepping: 0,
        },
        crate::event::PmuCaps::cpu_clock(),
    );
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
