//! pprof output end to end: `perch record --pprof FILE` of the demo
//! appliance (under icount) writes a gzipped profile.proto that
//! `go tool pprof` reads; the self shares of its top functions equal
//! `perf report`'s on the same recording within one point; its mappings
//! name the runtime image and each program with the build-ids their ELFs
//! carry; its locations have source lines and inlined frames; and
//! `perch convert --format pprof` of the saved capture gives the same
//! samples.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

use e2e_tests::{perch_bin, perf_present, qemu_present, record_demo, run_perf, runtime_elf};

/// Whether `go` is installed; says so loudly when it is not (the test then
/// skips: CI installs golang-go).
fn go_present() -> bool {
    if Command::new("go")
        .arg("version")
        .stdin(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return true;
    }
    eprintln!(
        "SKIPPED: go is not installed, so `go tool pprof` cannot read the profile back \
         (apt-get install --no-install-recommends golang-go; CI has it)"
    );
    false
}

/// `go tool pprof ARGS FILE`'s stdout; it must succeed.
fn go_pprof(args: &[&str], file: &Path) -> String {
    let o = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .arg(file)
        .env("HOME", std::env::temp_dir())
        .env("PPROF_TMPDIR", std::env::temp_dir())
        .stdin(Stdio::null())
        .output()
        .expect("running go tool pprof");
    assert!(
        o.status.success(),
        "go tool pprof {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A symbol name as both tools print it: without a Rust hash suffix.
fn normal(name: &str) -> String {
    let n = name.trim();
    match n.rsplit_once("::h") {
        Some((head, hash)) if hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit()) => {
            head.to_owned()
        }
        _ => n.to_owned(),
    }
}

/// `perf report --no-children --sort sym` lines: `PCT%  [.] NAME`.
fn perf_shares(text: &str) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    for l in text.lines() {
        let l = l.trim();
        let Some((pct, rest)) = l.split_once('%') else {
            continue;
        };
        let Ok(pct) = pct.trim().parse::<f64>() else {
            continue;
        };
        let rest = rest.trim();
        let name = rest
            .strip_prefix("[.]")
            .or_else(|| rest.strip_prefix("[k]"))
            .unwrap_or(rest);
        *m.entry(normal(name)).or_default() += pct;
    }
    m
}

/// `go tool pprof -top` rows: `flat flat% sum% cum cum% NAME`.
fn pprof_shares(text: &str) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    for l in text.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 6 {
            continue;
        }
        let Some(Ok(pct)) = f[1].strip_suffix('%').map(str::parse::<f64>) else {
            continue;
        };
        let name = f[5..].join(" ");
        *m.entry(normal(&name)).or_default() += pct;
    }
    m
}

/// The `Mappings` section of `go tool pprof -raw`: (file, build-id).
fn raw_mappings(text: &str) -> Vec<(String, String)> {
    let Some((_, maps)) = text.split_once("\nMappings\n") else {
        panic!("no Mappings in go tool pprof -raw:\n{text}");
    };
    maps.lines()
        .filter_map(|l| {
            // ID: START/LIMIT/OFFSET FILE BUILDID [FLAGS]
            let mut w = l.split_whitespace();
            w.next()?.strip_suffix(':')?;
            let _range = w.next()?;
            Some((w.next()?.to_owned(), w.next()?.to_owned()))
        })
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn pprof_of_the_demo_matches_perf_report_and_the_elfs() {
    if !qemu_present() || !perf_present() || !go_present() {
        return;
    }
    let dir = tempfile::tempdir().expect("temporary directory");
    let profile = dir.path().join("profile.pb.gz");
    let rec = record_demo(&[
        "--duration",
        "2",
        "--pprof",
        profile.to_str().expect("a UTF-8 path"),
    ]);
    assert_eq!(rec.status, Some(0), "perch record failed:\n{}", rec.stderr);
    assert!(
        rec.stderr.contains("pprof profile of"),
        "perch did not say it wrote the profile:\n{}",
        rec.stderr
    );

    // Self shares: perf report's by symbol against pprof's flat shares
    // (inlined functions counted in their callers, as perf's symbols are).
    let perf = run_perf(
        &rec,
        &[
            "report",
            "--stdio",
            "--no-children",
            "--sort",
            "sym",
            "-g",
            "none",
            "--demangle-kernel",
        ],
        &[],
    );
    let perf = perf_shares(&perf);
    let top = go_pprof(&["-top", "-noinlines", "-nodecount=10000"], &profile);
    let pp = pprof_shares(&top);
    let mut hot: Vec<(&String, &f64)> = perf.iter().filter(|(_, p)| **p >= 1.0).collect();
    hot.sort_by(|a, b| b.1.total_cmp(a.1));
    assert!(
        hot.len() >= 5,
        "perf report shows only {} symbols above 1%: {perf:?}",
        hot.len()
    );
    for (name, share) in &hot {
        let got = pp.get(*name).copied().unwrap_or_else(|| {
            panic!("{name} ({share}% in perf report) is not in the pprof profile:\n{top}")
        });
        assert!(
            (got - **share).abs() <= 1.0,
            "{name}: perf report {share}%, pprof {got}%\n{top}"
        );
        eprintln!("{name}: perf report {share:.2}%, pprof {got:.2}%");
    }
    for want in [
        "demo_checksum_blocks",
        "demo_parse_records",
        "demo_update_stats",
    ] {
        assert!(
            hot.iter().any(|(n, _)| n.as_str() == want),
            "{want} is not among the hot symbols"
        );
    }

    // Mappings: the runtime image and every demo program, each with the
    // build-id of the ELF it names.
    let raw = go_pprof(&["-raw"], &profile);
    let maps = raw_mappings(&raw);
    let runtime = std::fs::canonicalize(runtime_elf()).expect("the runtime ELF");
    assert!(
        maps.iter().any(|(f, _)| Path::new(f) == runtime.as_path()),
        "no mapping of the runtime {}: {maps:?}",
        runtime.display()
    );
    for prog in ["demo64", "demo32", "demosys", "demoregs"] {
        assert!(
            maps.iter().any(|(f, _)| f.ends_with(&format!("/{prog}"))),
            "no mapping of {prog}: {maps:?}"
        );
    }
    for (file, id) in &maps {
        let elf = std::fs::read(file).unwrap_or_else(|e| panic!("reading {file}: {e}"));
        let want =
            host_tool::manifest::build_id(&elf).unwrap_or_else(|| panic!("{file} has no build-id"));
        assert_eq!(id, &hex(&want), "the build-id of {file}'s mapping");
    }

    // Locations: source files and lines, and inlined frames (an indented
    // continuation line under a location).
    let locs = raw
        .split_once("\nLocations\n")
        .and_then(|(_, l)| l.split_once("\nMappings\n"))
        .map(|(l, _)| l)
        .expect("a Locations section");
    assert!(
        locs.lines()
            .any(|l| l.contains("demo_checksum_blocks") && l.contains("demo64.rs:")),
        "no demo_checksum_blocks location with a line of demo64.rs:\n{locs}"
    );
    let inlined = locs
        .lines()
        .filter(|l| l.starts_with("             ") && !l.trim().is_empty())
        .count();
    assert!(inlined > 0, "no inlined frames:\n{locs}");
    // Labels: comm, pid and cpu on the samples.
    let samples = raw.split_once("\nLocations\n").map_or("", |(s, _)| s);
    for label in ["comm:[demo64]", "pid:[1]", "cpu:[0]"] {
        assert!(
            samples.contains(label),
            "no {label} label in the samples:\n{}",
            &samples[..samples.len().min(4000)]
        );
    }

    // The capture converted to pprof gives the same samples.
    let again = dir.path().join("again.pb.gz");
    let manifest = e2e_tests::programs::demo_manifest();
    let o = Command::new(perch_bin())
        .arg("convert")
        .arg(&rec.capture)
        .arg("--image")
        .arg(runtime_elf())
        .arg("--appliance")
        .arg(&manifest)
        .args(["--format", "pprof", "-o"])
        .arg(&again)
        .stdin(Stdio::null())
        .output()
        .expect("running perch convert");
    assert!(
        o.status.success(),
        "perch convert --format pprof failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let read = |p: &Path| {
        host_tool::pprof::read(&std::fs::read(p).expect("reading a profile")).expect("a profile")
    };
    let (a, b) = (read(&profile), read(&again));
    assert_eq!(a.sample, b.sample);
    assert_eq!(a.location, b.location);
    assert_eq!(a.mapping, b.mapping);
    assert_eq!(a.sample_type, b.sample_type);
}

#[test]
fn convert_to_pprof_refuses_garbage_and_keeps_the_old_output() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let garbage = dir.path().join("garbage.bin");
    std::fs::write(&garbage, b"this is not a Perch capture at all").expect("writing");
    let out = dir.path().join("profile.pb.gz");
    std::fs::write(&out, b"old").expect("writing");
    let o = Command::new(perch_bin())
        .arg("convert")
        .arg(&garbage)
        .args(["--format", "pprof", "-o"])
        .arg(&out)
        .stdin(Stdio::null())
        .output()
        .expect("running perch convert");
    assert_eq!(
        o.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(std::fs::read(&out).expect("reading"), b"old");
}
