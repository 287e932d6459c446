//! `perch convert` throughput: a synthetic capture (wire frames) decoded and
//! written as perf.data in memory, reported as samples per second: as
//! `perch convert` does it (samples straight from the decoder's parts, with
//! framing on a second thread), the same on one thread, and through model
//! items (the path before samples were converted from their parts); and the
//! decoding alone. The output buffer is reused between iterations, so page
//! faults on fresh memory are not measured.

use std::io::Cursor;
use std::ops::ControlFlow;
use std::path::Path;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use host_tool::convert::{ConvertOptions, Converter};
use host_tool::image::Image;
use host_tool::input::Pump;
use host_tool::synth::{SynthConfig, write_capture};

const SAMPLES: u64 = 100_000;

/// How the capture reaches the converter.
#[derive(Clone, Copy)]
enum Path3 {
    Framed,
    Parts,
    Items,
}

fn convert_once(capture: &[u8], image: &Image, out: &mut Vec<u8>, path: Path3) -> usize {
    out.clear();
    let mut conv = Converter::new(
        Cursor::new(&mut *out),
        ConvertOptions {
            image: Some(image.clone()),
            cmdline: vec![],
            programs: Default::default(),
            kernel_file: None,
        },
    );
    let mut pump = Pump::new();
    match path {
        Path3::Framed => pump
            .read_all_framed(capture, &mut conv, |_, _| ControlFlow::Continue(()))
            .map(|_| ()),
        Path3::Parts => pump.read_all_parts(capture, &mut conv).map(|_| ()),
        Path3::Items => pump
            .read_all(capture, &mut |item| conv.push(item).map_err(Into::into))
            .map(|_| ()),
    }
    .expect("decodes");
    let (_, summary) = conv.finish().expect("converts");
    assert_eq!(summary.written.samples, SAMPLES);
    out.len()
}

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
    let mut out = Vec::with_capacity(32 << 20);
    let mut group = c.benchmark_group("convert");
    group.throughput(Throughput::Elements(SAMPLES));
    group.sample_size(10);
    for (name, path) in [
        ("wire_to_perf_data_100k_samples", Path3::Framed),
        ("wire_to_perf_data_100k_samples_one_thread", Path3::Parts),
        ("wire_to_perf_data_100k_samples_via_items", Path3::Items),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| convert_once(&capture, &image, &mut out, path))
        });
    }
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
