//! `perch convert` throughput: a synthetic capture (wire frames) decoded and
//! written as perf.data in memory, reported as samples per second; and the
//! decoding alone.

use std::io::Cursor;
use std::path::Path;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use host_tool::convert::{ConvertOptions, Converter};
use host_tool::image::Image;
use host_tool::input::Pump;
use host_tool::synth::{SynthConfig, write_capture};

const SAMPLES: u64 = 100_000;

fn convert(c: &mut Criterion) {
    let image =
        Image::open(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/appliance.elf"))
            .expect("fixture image");
    let mut capture = Vec::new();
    let cfg = SynthConfig {
        samples: SAMPLES,
        ..SynthConfig::default()
    };
    write_capture(Some(&image), &cfg, &mut capture).expect("synthetic capture");
    let mut group = c.benchmark_group("convert");
    group.throughput(Throughput::Elements(SAMPLES));
    group.sample_size(10);
    group.bench_function("wire_to_perf_data_100k_samples", |b| {
        b.iter(|| {
            let out = Cursor::new(Vec::with_capacity(16 << 20));
            let mut conv = Converter::new(
                out,
                ConvertOptions {
                    image: Some(image.clone()),
                    cmdline: vec![],
                },
            );
            let mut pump = Pump::new();
            pump.read_all_parts(&capture[..], &mut conv)
                .expect("decodes");
            let (out, summary) = conv.finish().expect("converts");
            assert_eq!(summary.written.samples, SAMPLES);
            out.into_inner().len()
        })
    });
    // Decoding alone (wire to model items, what `perch stat` does), to
    // separate the decoder's share from the perf.data writer's.
    group.bench_function("wire_decode_only_100k_samples", |b| {
        b.iter(|| {
            let mut pump = Pump::new();
            pump.read_all(&capture[..], &mut |_| Ok(()))
                .expect("decodes");
            assert_eq!(pump.stats.samples, SAMPLES);
            pump.stats.samples
        })
    });
    group.finish();
}

criterion_group!(benches, convert);
criterion_main!(benches);
