//! The flight recorder on a simulated 115200-baud line: `perch record
//! --line-baud 115200` reads the appliance's COM1 at 11,520 B/s through a
//! FIFO of one page, so QEMU's 16550 backs up as a real one does. A 1 s
//! burst at 2 kHz with the default sample fields, a frame per sample
//! (`--wire-group 0`: about 90 B a sample on the wire, more than ten times
//! what the line carries; sample groups would need three times the rate
//! for the same burst, which the real-time clock keeps less well) loses samples
//! without a buffer, and loses none with `--buffer 64`: the frames wait in
//! the appliance's RAM and the run ends once the line has taken them all.
//! End's counters match perf.data in both runs. Real time (no icount): the
//! line is paced by the host's clock.

#![forbid(unsafe_code)]

use e2e_tests::{perch_bin, programs, qemu_present, runtime_elf, stat_numbers};
use std::process::{Command, Stdio};

struct Run {
    taken: u64,
    delivered: u64,
    lost: u64,
    perf_samples: u64,
    perf_lost: u64,
    stderr: String,
}

fn burst(extra: &[&str]) -> Run {
    let dir = tempfile::tempdir().expect("temporary directory");
    let data = dir.path().join("perf.data");
    let capture = dir.path().join("capture.bin");
    let manifest = programs::demo_manifest();
    let out = Command::new(perch_bin())
        .arg("record")
        .arg("--image")
        .arg(runtime_elf())
        .arg("--appliance")
        .arg(&manifest)
        .arg("-o")
        .arg(&data)
        .arg("--save-capture")
        .arg(&capture)
        .args([
            "--no-buildid-cache",
            "--transport",
            "uart",
            "--line-baud",
            "115200",
            "-F",
            "2000",
            "--duration",
            "1",
            "--timeout",
            "300",
            "--wire-group",
            "0",
        ])
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .expect("running perch record");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "perch record failed:\n{stderr}");
    assert!(
        !stderr.contains("RUNTIME"),
        "the runtime crashed:\n{stderr}"
    );
    assert!(
        stderr.contains(" 0 bad frames"),
        "a slow line must not damage frames:\n{stderr}"
    );
    let end = stat_numbers(&capture, "end: taken ");
    let (taken, delivered, lost) = (end[0], end[1], end[2]);
    let (perf_samples, perf_lost) = perf_counts(&data);
    Run {
        taken,
        delivered,
        lost,
        perf_samples,
        perf_lost,
        stderr,
    }
}

/// perf.data's samples and the samples its LOST_SAMPLES records count.
fn perf_counts(data: &std::path::Path) -> (u64, u64) {
    let reader = std::io::BufReader::new(std::fs::File::open(data).expect("perf.data"));
    let linux_perf_data::PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = linux_perf_data::PerfFileReader::parse_file(reader).expect("perf.data parses");
    let (mut samples, mut lost) = (0u64, 0u64);
    while let Some(r) = record_iter.next_record(&mut perf_file).expect("a record") {
        let linux_perf_data::PerfFileRecord::EventRecord { record, .. } = r else {
            continue;
        };
        match record.record_type.0 {
            // PERF_RECORD_SAMPLE
            9 => samples += 1,
            // PERF_RECORD_LOST_SAMPLES: u64 lost, then the sample id.
            13 => {
                let body = record.data.as_slice();
                lost += u64::from_le_bytes(body[..8].try_into().expect("8 bytes"));
            }
            _ => {}
        }
    }
    (samples, lost)
}

fn check_counters(r: &Run, what: &str) {
    eprintln!(
        "{what}: taken {} = delivered {} + lost {}; perf.data {} samples + {} lost",
        r.taken, r.delivered, r.lost, r.perf_samples, r.perf_lost
    );
    assert_eq!(r.taken, r.delivered + r.lost, "{what}: End does not add up");
    assert_eq!(
        r.perf_samples, r.delivered,
        "{what}: perf.data's samples are not End's delivered:\n{}",
        r.stderr
    );
    assert_eq!(
        r.perf_lost, r.lost,
        "{what}: perf.data's lost samples are not End's lost:\n{}",
        r.stderr
    );
}

#[test]
fn a_burst_on_a_115200_baud_line_loses_nothing_with_a_buffer_and_much_without() {
    if !qemu_present() {
        return;
    }
    let bare = burst(&[]);
    check_counters(&bare, "no buffer");
    assert!(
        bare.lost > bare.taken / 2,
        "without a buffer the line should lose most of the burst:\n{}",
        bare.stderr
    );
    let buffered = burst(&["--buffer", "64"]);
    check_counters(&buffered, "64 MiB buffer");
    assert!(
        buffered.stderr.contains("flight recorder: 64 MiB buffer"),
        "the buffer was not set up:\n{}",
        buffered.stderr
    );
    assert_eq!(
        buffered.lost, 0,
        "the buffer should keep every sample:\n{}",
        buffered.stderr
    );
    // About 2,000 samples in 1 s (the real-time clock may lose a few ticks).
    assert!(
        buffered.taken >= 1_800,
        "only {} samples in a 1 s burst at 2 kHz:\n{}",
        buffered.taken,
        buffered.stderr
    );
}
