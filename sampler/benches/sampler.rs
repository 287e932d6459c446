//! Criterion benchmarks of the sampler: the raw NMI record's capture and its
//! expansion in the drain, encode, decode, ring push/pop, and a printed table of wire bytes per sample vs
//! perf.data bytes per sample for the same fields.

#[path = "../tests/common/mod.rs"]
mod common;

use std::hint::black_box;

use common::{Config, Task};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sampler::capture::{InterruptFrame, RawSample, SampleInput, UserFrame, build_sample, capture};
use sampler::regs::{CodeMode, Reg, RegFile};
use sampler::ring::Ring;
use sampler::sample::Sample;
use sampler::wire::{Decoder, Encoder, EncoderConfig, MAX_FRAME, Record};

/// Prints wire vs perf.data bytes per sample for the common configurations.
fn print_size_table() {
    const N: usize = 10_000;
    println!();
    println!("wire bytes per sample vs perf.data bytes per sample ({N} samples, 3 tasks)");
    println!("| fields | perf.data | wire (avg) | ratio |");
    println!("| --- | --- | --- | --- |");
    for config in Config::ALL {
        let event = config.event();
        let mut tasks = [Task::new(1, 11), Task::new(2, 22), Task::new(3, 33)];
        let mut enc: Encoder<16> = Encoder::new(EncoderConfig::default());
        let mut buf = [0u8; MAX_FRAME];
        let (mut wire, mut perf) = (0usize, 0usize);
        for i in 0..N {
            let s = tasks[i % 3].step(config);
            perf += s.perf_data_bytes(&event);
            wire += enc
                .encode(&Record::Sample(s), &mut buf)
                .expect("fits MAX_FRAME");
        }
        let w = wire as f64 / N as f64;
        let p = perf as f64 / N as f64;
        println!(
            "| {} | {p:.0} | {w:.1} | {:.0}% |",
            config.name(),
            100.0 * w / p
        );
    }
    println!();
}

fn benches(c: &mut Criterion) {
    print_size_table();

    let event = Config::UserRegs.event();
    let mut regs = RegFile::default();
    for (i, v) in regs.0.iter_mut().enumerate() {
        *v = 0x7fff_0000_0000 + i as u64;
    }
    regs.set(Reg::Cs, 0x2b);
    let frame = InterruptFrame {
        regs,
        code: CodeMode::Long64,
    };
    c.bench_function(
        "build_sample by value (IP, TID, TIME, PERIOD, 20 user GPRs)",
        |b| {
            b.iter(|| {
                let input = SampleInput::new(&event, &frame, UserFrame::NoTask, 1, 0, 7, 250_000);
                black_box(build_sample(black_box(&input)))
            })
        },
    );
    let input = SampleInput::new(&event, &frame, UserFrame::NoTask, 1, 0, 7, 250_000);
    let mut raw = Box::new(RawSample::default());
    c.bench_function("capture into a raw record (the NMI side's copies)", |b| {
        b.iter(|| black_box(capture(black_box(&input), &mut raw)))
    });
    let mut expanded = Box::new(Sample::default());
    c.bench_function(
        "expand a raw record in place (the drain side: 20 user GPRs)",
        |b| b.iter(|| raw.expand_into(black_box(&event), &mut expanded)),
    );

    let mut task = Task::new(1, 5);
    let samples: Vec<Sample> = (0..1024).map(|_| task.step(Config::UserRegs)).collect();
    let mut group = c.benchmark_group("wire");
    group.throughput(Throughput::Elements(1));
    group.bench_function("encode sample (delta, 20 user GPRs)", |b| {
        let mut enc: Encoder<16> = Encoder::new(EncoderConfig::default());
        let mut buf = [0u8; MAX_FRAME];
        let mut i = 0;
        b.iter(|| {
            let rec = Record::Sample(samples[i % samples.len()].clone());
            i += 1;
            black_box(enc.encode(&rec, &mut buf).expect("fits"))
        })
    });
    let mut stream = Vec::new();
    {
        let mut enc: Encoder<16> = Encoder::new(EncoderConfig::default());
        let mut buf = [0u8; MAX_FRAME];
        for s in &samples {
            let n = enc
                .encode(&Record::Sample(s.clone()), &mut buf)
                .expect("fits");
            stream.extend_from_slice(&buf[..n]);
        }
    }
    group.throughput(Throughput::Elements(samples.len() as u64));
    group.bench_function("decode 1024 samples", |b| {
        b.iter(|| {
            let mut dec = Box::new(Decoder::new());
            let mut n = 0usize;
            dec.push(black_box(&stream), |r| {
                n += usize::from(r.is_ok());
            });
            assert_eq!(n, samples.len());
            n
        })
    });
    // The host's path: records lent in place, no copy per sample.
    group.bench_function("decode 1024 samples (push_ref)", |b| {
        b.iter(|| {
            let mut dec = Box::new(Decoder::new());
            let mut n = 0usize;
            dec.push_ref(black_box(&stream), |r| {
                n += usize::from(r.is_ok());
            });
            assert_eq!(n, samples.len());
            n
        })
    });
    group.finish();

    let ring: Box<Ring<Sample, 64>> = Box::new(Ring::new());
    let sample = samples[0].clone();
    c.bench_function("ring push + pop (Sample)", |b| {
        b.iter(|| {
            ring.push(black_box(sample.clone()));
            black_box(ring.pop())
        })
    });
    let small: Ring<u64, 64> = Ring::new();
    c.bench_function("ring push + pop (u64)", |b| {
        b.iter(|| {
            small.push(black_box(1));
            black_box(small.pop())
        })
    });
}

criterion_group!(all, benches);
criterion_main!(all);
