//! Measures wire bytes per sample (whole frames) against perf.data bytes for
//! the common configurations, and checks the acceptance bound: IP, TID,
//! TIME, PERIOD and 20 user GPRs in at most 25% of perf.data's 216 bytes.
//! Run with `--nocapture` to see the table.

mod common;

use common::{Config, Task};
use sampler::wire::{Decoder, Encoder, EncoderConfig, MAX_FRAME, Record};

const SAMPLES: usize = 10_000;

/// (average wire bytes per sample, perf.data bytes per sample), checking
/// that the stream decodes back to the same samples.
fn measure(config: Config, keyframe_interval: u32) -> (f64, usize) {
    let event = config.event();
    let mut tasks = [Task::new(1, 11), Task::new(2, 22), Task::new(3, 33)];
    let mut enc: Encoder<16> = Encoder::new(EncoderConfig {
        keyframe_interval,
        ..EncoderConfig::default()
    });
    let mut dec = Decoder::new();
    let mut buf = [0u8; MAX_FRAME];
    let (mut wire, mut perf) = (0usize, 0usize);
    for i in 0..SAMPLES {
        let s = tasks[i % 3].step(config);
        perf += s.perf_data_bytes(&event);
        let n = enc.encode(&Record::Sample(s.clone()), &mut buf).unwrap();
        wire += n;
        let mut got = Vec::new();
        dec.push(&buf[..n], |r| got.push(r));
        assert_eq!(got, [Ok(Record::Sample(s))]);
    }
    assert_eq!(perf % SAMPLES, 0, "fixed perf.data size per sample");
    (wire as f64 / SAMPLES as f64, perf / SAMPLES)
}

#[test]
fn bytes_per_sample() {
    println!("| fields | perf.data | wire (avg) | ratio | plain varints (no deltas) |");
    println!("| --- | --- | --- | --- | --- |");
    for config in Config::ALL {
        let (wire, perf) = measure(config, 128);
        let (plain, _) = measure(config, 1);
        println!(
            "| {} | {perf} | {wire:.1} | {:.0}% | {plain:.1} |",
            config.name(),
            100.0 * wire / perf as f64
        );
        assert!(
            wire < plain,
            "deltas beat plain varints for {}",
            config.name()
        );
    }
    let (wire, perf) = measure(Config::UserRegs, 128);
    assert_eq!(perf, 216);
    assert!(wire <= 0.25 * 216.0, "acceptance: {wire:.1} bytes > 54");
}
