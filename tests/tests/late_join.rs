//! A host that joins late: the runtime repeats Hello and its Task records
//! every two seconds, so a capture whose start is missing (a board already
//! running when `perch record --serial` opens the port, or noise over the
//! first frames) is described by the next repetition: it converts from
//! where it starts, names the program, and says how much it missed.
#![forbid(unsafe_code)]

use e2e_tests::programs::{CBuild, c_program};
use e2e_tests::{perch_bin, qemu_present, record, runtime_elf};
use std::process::Command;

fn perch(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(perch_bin())
        .args(args)
        .output()
        .expect("running perch");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_capture_without_its_start_converts_from_where_it_starts() {
    let spin = c_program("spin", CBuild::Glibc);
    if !qemu_present() {
        return;
    }
    // Five seconds of a program that never makes a system call: the
    // repetitions at 2 s and 4 s fall inside the run.
    let rec = record(&[
        "--freq",
        "1000",
        "--duration",
        "5",
        "--",
        spin.to_str().unwrap(),
    ]);
    assert_eq!(rec.status, Some(0), "{}", rec.stderr);
    let bytes = std::fs::read(&rec.capture).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let img = runtime_elf();
    let img = img.to_str().unwrap();

    // The whole capture: one Hello, the repetitions are not restarts.
    let (code, full, err) = perch(&["stat", rec.capture.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!full.contains("restarted"), "{full}");

    // The line opened 2.5 s into the run (half the capture), mid-frame.
    let late = dir.path().join("late.bin");
    std::fs::write(&late, &bytes[bytes.len() / 2 + 7..]).unwrap();
    let (code, stat, err) = perch(&["stat", late.to_str().unwrap()]);
    assert_eq!(
        code,
        Some(0),
        "perch stat of the late capture: {err}\n{stat}"
    );
    assert!(stat.contains("spin"), "the program is named: {stat}");
    let out = dir.path().join("perf.data");
    let (code, _, err) = perch(&[
        "convert",
        late.to_str().unwrap(),
        "--image",
        img,
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    // The repetition at 4 s describes the capture from its start at 2.5 s.
    assert!(err.contains("first Hello was lost"), "{err}");
    // What was missed is counted: the samples written and the wire losses
    // add up to what the target delivered.
    let end = e2e_tests::stat_numbers(&rec.capture, "end: taken ");
    let delivered = end[1];
    let wrote: u64 = err
        .lines()
        .find(|l| l.starts_with("perch: wrote"))
        .and_then(|l| l.rsplit_once(": "))
        .and_then(|(_, n)| n.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no `wrote` line: {err}"));
    // Joined at 2.5 s: the last half, as `perch stat` counts it.
    assert!(
        wrote * 10 > delivered * 4 && wrote * 10 < delivered * 6,
        "{wrote} of {delivered} samples after 2.5 s"
    );
    assert!(
        stat.contains(&format!("samples: {wrote} ")),
        "convert wrote {wrote}, stat says: {stat}"
    );
    eprintln!("{err}");
    assert!(
        err.contains(&format!("{} samples", delivered - wrote)) || err.contains("lost"),
        "the missed samples are reported: {err}"
    );
}
