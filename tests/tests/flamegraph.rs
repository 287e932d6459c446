//! `perch flamegraph` of a perf.data: on a recording of the demo appliance
//! the folded stacks of the perf.data equal those of the capture it was
//! converted from (one symboliser for both), they name the demo's hot
//! functions, `--pid` and `--comm` keep only those processes' stacks, and
//! a damaged perf.data is refused with a clear error and a non-zero exit
//! without touching the output that was there.
#![forbid(unsafe_code)]

use std::path::Path;
use std::process::{Command, Stdio};

use e2e_tests::{perch_bin, qemu_present, record_demo, runtime_elf};

/// `perch flamegraph ARGS`: (exit code, stderr).
fn perch_flamegraph(args: &[&std::ffi::OsStr]) -> (Option<i32>, String) {
    let o = Command::new(perch_bin())
        .arg("flamegraph")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running perch flamegraph");
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The folded stacks of `input` (with the runtime image and `extra`).
fn folded(input: &Path, out: &Path, extra: &[&str]) -> Vec<String> {
    let elf = runtime_elf();
    let mut args: Vec<&std::ffi::OsStr> = vec![
        input.as_os_str(),
        "--image".as_ref(),
        elf.as_os_str(),
        "--folded".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
    ];
    args.extend(extra.iter().map(|a| std::ffi::OsStr::new(*a)));
    let (code, stderr) = perch_flamegraph(&args);
    assert_eq!(code, Some(0), "perch flamegraph {args:?} failed: {stderr}");
    std::fs::read_to_string(out)
        .expect("the folded stacks")
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn flamegraph_of_perf_data_equals_that_of_its_capture_and_filters() {
    if !qemu_present() {
        return;
    }
    let rec = record_demo(&["--duration", "1"]);
    assert_eq!(rec.status, Some(0), "perch record failed:\n{}", rec.stderr);
    let dir = tempfile::tempdir().expect("temporary directory");
    let manifest = e2e_tests::programs::demo_manifest();
    let manifest = manifest.to_str().expect("a UTF-8 path");

    let from_data = folded(&rec.data, &dir.path().join("a.folded"), &[]);
    let from_capture = folded(
        &rec.capture,
        &dir.path().join("b.folded"),
        &["--appliance", manifest],
    );
    assert_eq!(from_data, from_capture);
    let text = from_data.join("\n");
    for f in [
        "demo64;",
        "demo_checksum_blocks",
        "demo_parse_records",
        "perch_demo32_crc_loop",
        "perch_demoregs_spin",
        "_[k]",
    ] {
        assert!(text.contains(f), "{f} is not in the folded stacks:\n{text}");
    }
    let total = |lines: &[String]| -> u64 {
        lines
            .iter()
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
            .sum()
    };
    let all = total(&from_data);

    // --comm: demo32's stacks only, the same from both inputs.
    let comm = folded(
        &rec.data,
        &dir.path().join("c.folded"),
        &["--comm", "demo32"],
    );
    assert!(!comm.is_empty());
    assert!(comm.iter().all(|l| l.starts_with("demo32;")), "{comm:?}");
    assert_eq!(
        comm,
        from_data
            .iter()
            .filter(|l| l.starts_with("demo32;"))
            .cloned()
            .collect::<Vec<_>>()
    );
    let comm_capture = folded(
        &rec.capture,
        &dir.path().join("d.folded"),
        &["--appliance", manifest, "--comm", "demo32"],
    );
    assert_eq!(comm, comm_capture);

    // --pid: pid 1 is demo64 (the manifest's first process), twice given
    // with pid 3 (demosys).
    let pid1 = folded(&rec.data, &dir.path().join("e.folded"), &["--pid", "1"]);
    assert!(pid1.iter().all(|l| l.starts_with("demo64;")), "{pid1:?}");
    let two = folded(
        &rec.data,
        &dir.path().join("f.folded"),
        &["--pid", "1", "--pid", "3"],
    );
    assert!(
        two.iter()
            .all(|l| l.starts_with("demo64;") || l.starts_with("demosys;"))
    );
    assert!(total(&two) > total(&pid1) && total(&two) < all);

    // A filter that keeps nothing: exit 3, nothing written.
    let none = dir.path().join("none.folded");
    let data = rec.data.as_os_str();
    let (code, stderr) = perch_flamegraph(&[
        data,
        "--comm".as_ref(),
        "nosuchprogram".as_ref(),
        "-o".as_ref(),
        none.as_os_str(),
    ]);
    assert_eq!(code, Some(3), "{stderr}");
    assert!(stderr.contains("--pid/--comm"), "{stderr}");
    assert!(!none.exists());

    // The SVG of the perf.data names the hot functions too.
    let svg = dir.path().join("g.svg");
    let (code, stderr) = perch_flamegraph(&[
        data,
        "--image".as_ref(),
        runtime_elf().as_os_str(),
        "-o".as_ref(),
        svg.as_os_str(),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let svg = std::fs::read_to_string(&svg).expect("the SVG");
    assert!(svg.contains("demo_checksum_blocks"));
}

#[test]
fn a_damaged_perf_data_is_refused_and_the_output_kept() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let out = dir.path().join("flamegraph.svg");
    std::fs::write(&out, b"the old flamegraph").expect("writing");
    // perf.data's magic, then a header that points nowhere.
    let mut bad = b"PERFILE2".to_vec();
    bad.extend_from_slice(&[0xff; 200]);
    let data = dir.path().join("perf.data");
    std::fs::write(&data, &bad).expect("writing");
    let (code, stderr) = perch_flamegraph(&[data.as_os_str(), "-o".as_ref(), out.as_os_str()]);
    assert_eq!(code, Some(3), "{stderr}");
    assert!(
        stderr.contains("perf.data"),
        "the error does not say what is wrong: {stderr}"
    );
    assert_eq!(std::fs::read(&out).expect("reading"), b"the old flamegraph");
    // The magic alone is no better.
    bad.truncate(8);
    std::fs::write(&data, &bad).expect("writing");
    let (code, _) = perch_flamegraph(&[data.as_os_str(), "-o".as_ref(), out.as_os_str()]);
    assert_eq!(code, Some(3));
    assert_eq!(std::fs::read(&out).expect("reading"), b"the old flamegraph");
}
