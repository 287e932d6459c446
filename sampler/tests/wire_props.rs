//! Property tests of the wire format: arbitrary sample sequences round-trip
//! through encoder and decoder, the largest possible sample fits
//! `MAX_FRAME`, and arbitrary or mutated input never panics the decoder nor
//! yields a record that was not sent (the stable stand-in for the fuzz
//! targets in `fuzz/`).

use proptest::prelude::*;
use sampler::regs::{Abi, GPR_MASK, RegsSample, VALID_MASK_WITH_XMM, XMM_MASK};
use sampler::sample::{
    BranchEntry, BranchFlags, BranchStack, CpuMode, MAX_BRANCHES, MAX_CALLCHAIN, MemInfo, Sample,
};
use sampler::wire::{Decoder, Encoder, EncoderConfig, MAX_FRAME, Record};

fn regs() -> impl Strategy<Value = RegsSample> {
    (0u8..3, any::<u64>(), any::<u64>()).prop_flat_map(|(abi, mask, seed)| {
        let mask = mask & VALID_MASK_WITH_XMM;
        let abi = Abi::from_perf_value(u64::from(abi)).unwrap();
        let n = if abi == Abi::None {
            0
        } else {
            mask.count_ones() as usize
        };
        proptest::collection::vec(prop_oneof![Just(seed), any::<u64>(), 0u64..1000], n..=n)
            .prop_map(move |values| RegsSample {
                abi,
                mask,
                values: heapless::Vec::from_slice(&values).unwrap(),
            })
    })
}

fn sample() -> impl Strategy<Value = Sample> {
    (
        (
            any::<u32>(),
            any::<bool>(),
            any::<u64>(),
            0u32..4,
            any::<u32>(),
            any::<u64>(),
        ),
        (any::<u32>(), any::<u64>()),
        proptest::collection::vec(any::<u64>(), 0..=MAX_CALLCHAIN),
        proptest::option::of((
            any::<u64>(),
            proptest::collection::vec((any::<u64>(), any::<u64>(), any::<u64>()), 0..=MAX_BRANCHES),
        )),
        proptest::option::of(regs()),
        proptest::option::of(regs()),
        proptest::option::of((any::<u64>(), any::<u64>(), any::<u16>(), any::<u64>())),
    )
        .prop_map(
            |((event, kernel, ip, tid, pid, time), (cpu, period), chain, br, ur, ir, mem)| Sample {
                event,
                cpumode: if kernel {
                    CpuMode::Kernel
                } else {
                    CpuMode::User
                },
                ip,
                pid: if pid % 2 == 0 { tid } else { pid },
                tid,
                time,
                cpu,
                period,
                callchain: heapless::Vec::from_slice(&chain).unwrap(),
                branches: br.map(|(hw_idx, entries)| BranchStack {
                    hw_idx,
                    entries: entries
                        .into_iter()
                        .map(|(from, to, f)| BranchEntry {
                            from,
                            to,
                            flags: BranchFlags::from_perf(f),
                        })
                        .collect(),
                }),
                regs_user: ur,
                regs_intr: ir,
                mem: mem.map(|(addr, weight, ins_lat, data_src)| MemInfo {
                    addr,
                    weight,
                    ins_lat,
                    data_src,
                }),
            },
        )
}

fn encode_all(samples: &[Sample], interval: u32) -> Vec<u8> {
    let mut enc: Encoder<4> = Encoder::new(EncoderConfig {
        keyframe_interval: interval,
        ..EncoderConfig::default()
    });
    let mut buf = [0u8; MAX_FRAME];
    let mut out = vec![0u8];
    for s in samples {
        let n = enc
            .encode(&Record::Sample(s.clone()), &mut buf)
            .expect("every sample fits MAX_FRAME");
        out.extend_from_slice(&buf[..n]);
    }
    out
}

fn decode(bytes: &[u8], chunk: usize) -> Vec<Sample> {
    let mut dec = Box::new(Decoder::new());
    let mut got = Vec::new();
    for part in bytes.chunks(chunk.max(1)) {
        dec.push(part, |r| match r {
            Ok(Record::Sample(s)) => got.push(s),
            other => panic!("unexpected {other:?}"),
        });
    }
    got
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_samples_round_trip(samples in proptest::collection::vec(sample(), 1..24), interval in 1u32..6, chunk in 1usize..200) {
        let bytes = encode_all(&samples, interval);
        prop_assert_eq!(decode(&bytes, chunk), samples);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4000), chunk in 1usize..300) {
        let mut dec = Box::new(Decoder::new());
        let mut ok = 0u64;
        for part in bytes.chunks(chunk) {
            dec.push(part, |r| ok += u64::from(r.is_ok()));
        }
        let s = dec.stats();
        prop_assert_eq!(s.frames_ok, ok);
        prop_assert!(s.bytes_skipped <= bytes.len() as u64);
    }

    /// Any mutation of a valid stream yields only records that were sent.
    #[test]
    fn mutated_streams_yield_only_sent_samples(
        samples in proptest::collection::vec(sample(), 1..12),
        edits in proptest::collection::vec((any::<u16>(), any::<u8>()), 1..6),
    ) {
        let mut bytes = encode_all(&samples, 3);
        for (at, v) in edits {
            let i = usize::from(at) % bytes.len();
            bytes[i] = v;
        }
        for s in decode(&bytes, 64) {
            prop_assert!(samples.contains(&s), "decoded a sample that was never sent");
        }
    }
}

/// The largest sample (every field, maximal lengths, values that need the
/// longest varints) fits in `MAX_FRAME`, as keyframe and as delta.
#[test]
fn the_largest_sample_fits_a_frame() {
    let big = |i: u64| 0x8000_0000_0000_0000u64 ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let full_regs = |salt: u64| {
        let mask = GPR_MASK | XMM_MASK;
        RegsSample {
            abi: Abi::Bits64,
            mask,
            values: (0..mask.count_ones() as u64)
                .map(|i| big(i + salt))
                .collect(),
        }
    };
    let s = |salt: u64| Sample {
        event: u32::MAX,
        cpumode: CpuMode::Kernel,
        ip: big(1 + salt),
        pid: u32::MAX - 1,
        tid: u32::MAX,
        time: big(2 + salt),
        cpu: u32::MAX,
        period: big(3 + salt),
        callchain: (0..MAX_CALLCHAIN as u64)
            .map(|i| big(i * 7 + salt))
            .collect(),
        branches: Some(BranchStack {
            hw_idx: u64::MAX,
            entries: (0..MAX_BRANCHES as u64)
                .map(|i| BranchEntry {
                    from: big(i * 3 + salt),
                    to: big(i * 5 + salt + 1),
                    flags: BranchFlags::from_perf(u64::MAX),
                })
                .collect(),
        }),
        regs_user: Some(full_regs(salt)),
        regs_intr: Some(full_regs(salt + 100)),
        mem: Some(MemInfo {
            addr: u64::MAX,
            weight: u64::MAX,
            ins_lat: u16::MAX,
            data_src: u64::MAX,
        }),
    };
    let seq = [s(0), s(1), s(2)];
    let bytes = encode_all(&seq, 128);
    println!(
        "largest sample sequence: {} bytes for 3 frames (MAX_FRAME {MAX_FRAME})",
        bytes.len()
    );
    assert_eq!(decode(&bytes, 1000), seq);
}
