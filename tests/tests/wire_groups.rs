//! Sample groups end to end (`perch record --wire-group N`, 256 by
//! default): the runtime codes its samples in groups, perch decodes every
//! one of them, the profile names the program's functions as with a frame
//! per sample (`--wire-group 0`), and the line carries fewer bytes per
//! sample.
#![forbid(unsafe_code)]

use e2e_tests::programs::{CBuild, c_program};
use e2e_tests::{Recording, qemu_present, record, run_perf};

/// `perch record --icount ARGS -- hotspots 3000`.
fn record_hotspots(args: &[&str]) -> Recording {
    let exe = c_program("hotspots", CBuild::Glibc);
    let mut all = args.to_vec();
    all.extend(["--", exe.to_str().unwrap(), "3000"]);
    record(&all)
}

/// The "N bytes/sample on the wire" of perch's summary.
fn bytes_per_sample(stderr: &str) -> f64 {
    let line = stderr
        .lines()
        .find(|l| l.contains("bytes/sample on the wire"))
        .unwrap_or_else(|| panic!("no summary in:\n{stderr}"));
    let head = line.split(" bytes/sample").next().unwrap();
    head.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn grouped_samples_all_arrive_and_profile_as_a_frame_per_sample_does() {
    c_program("hotspots", CBuild::Glibc);
    if !qemu_present() {
        return;
    }
    let base = ["--freq", "4000", "--max-rate", "0"];
    let mut args = base.to_vec();
    args.extend(["--wire-group", "0"]);
    let plain = record_hotspots(&args);
    assert_eq!(plain.status, Some(0), "{}", plain.stderr);
    let mut args = base.to_vec();
    args.extend(["--wire-group", "64"]);
    let grouped = record_hotspots(&args);
    assert_eq!(grouped.status, Some(0), "{}", grouped.stderr);

    // Every sample the target delivered was decoded: none lost on the
    // wire, no bad frame, and the target's counters agree.
    let err = &grouped.stderr;
    assert!(
        err.contains("(0 on the target, 0 on the wire), 0 bad frames"),
        "{err}"
    );
    let counters = err
        .lines()
        .find(|l| l.contains("target counters: taken"))
        .unwrap_or_else(|| panic!("no counters in:\n{err}"));
    let nums: Vec<u64> = counters
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    // taken = delivered + lost; the stream holds S samples + L lost.
    assert_eq!(nums[0], nums[1], "{counters}");
    assert_eq!(nums[3], nums[1], "{counters}");
    assert!(nums[1] > 1000, "{counters}");

    // The same hot functions, by the same symbols.
    let report = |rec| {
        run_perf(
            rec,
            &["report", "--stdio", "--sort", "sym", "--no-children"],
            &[],
        )
    };
    let (p, g) = (report(&plain), report(&grouped));
    for f in ["crc_bytes", "sieve", "sort_words"] {
        assert!(p.contains(f), "{f} in the plain profile:\n{p}");
        assert!(g.contains(f), "{f} in the grouped profile:\n{g}");
    }

    let (pb, gb) = (bytes_per_sample(&plain.stderr), bytes_per_sample(err));
    assert!(
        gb * 1.5 < pb,
        "groups of 64: {gb} bytes/sample, a frame per sample: {pb}"
    );
}
