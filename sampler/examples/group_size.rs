//! Wire bytes per sample of a saved capture (`perch record --save-capture`)
//! when its samples are written again in sample groups: a quick way to
//! compare models on the same samples.
//!
//! `cargo run --release -p sampler --features std --example group_size -- CAPTURE [G...]`

use sampler::wire::{Decoder, Encoder, EncoderConfig, MAX_FRAME, Record};

fn main() -> std::process::ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: group_size CAPTURE [G...]");
        return std::process::ExitCode::from(2);
    };
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("group_size: {path}: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    let groups: Vec<u32> = args.filter_map(|a| a.parse().ok()).collect();
    let groups = if groups.is_empty() { vec![256] } else { groups };
    let mut records = Vec::new();
    let mut dec = Box::new(Decoder::new());
    dec.push(&bytes, |r| {
        if let Ok(r @ Record::Sample(_)) = r {
            records.push(r);
        }
    });
    let samples = records.len();
    if samples == 0 {
        eprintln!("group_size: {path}: no samples");
        return std::process::ExitCode::from(1);
    }
    for g in groups {
        let config = EncoderConfig {
            group: g,
            ..EncoderConfig::DEFAULT
        };
        let mut enc: Box<Encoder> = Box::new(Encoder::new(config));
        let mut buf = vec![0u8; MAX_FRAME];
        let mut stream = Vec::new();
        let mut write = |f: &[u8]| -> Result<(), ()> {
            stream.extend_from_slice(f);
            Ok(())
        };
        for r in &records {
            if enc.put(r, &mut buf, &mut write).is_err() {
                eprintln!("group_size: a sample did not encode");
                return std::process::ExitCode::from(1);
            }
        }
        let _ = enc.flush(&mut buf, &mut write);
        let total = stream.len();
        // The samples must come back exactly.
        let mut back = Vec::new();
        let mut dec = Box::new(Decoder::new());
        dec.push(&stream, |r| {
            if let Ok(r @ Record::Sample(_)) = r {
                back.push(r);
            }
        });
        if back != records {
            eprintln!("group_size: G={g}: the samples do not decode back exactly");
            return std::process::ExitCode::from(1);
        }
        println!(
            "G={g}: {samples} samples, {:.2} bytes/sample",
            total as f64 / samples as f64
        );
    }
    std::process::ExitCode::SUCCESS
}
