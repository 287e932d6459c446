//! Agreement with an exact reference. Under QEMU `-icount shift=0` one
//! virtual nanosecond is one executed instruction, so the NMI clock samples
//! every N instructions: a symbol's share of a program's user samples must
//! then be its share of the program's executed instructions, which
//! callgrind counts exactly (its self cost, event `Ir`). For
//! `tests/programs/c/hotspots.c` (six hot functions of different weights),
//! built as a static musl x86_64 program and as a static i386 one, the
//! shares of callgrind's top five functions must agree within 2 percentage
//! points. So must those of `tests/programs/c/workers.c` (four pthreads,
//! each with its own hot function and amount of work; musl x86_64 and
//! glibc i386): callgrind sums a
//! function's self cost over the threads it runs one at a time, perch's
//! shares cover the samples of all the process's threads. The same
//! comparison against a native `perf record -e cpu-clock` is printed, not
//! asserted (a native sampler on a shared host has skid and noise that
//! icount does not).
//!
//! The tests skip, saying why, only when QEMU or valgrind is missing.
#![forbid(unsafe_code)]

use e2e_tests::programs::{CBuild, c_program};
use e2e_tests::{have_tool, qemu_present, record};
use linux_perf_data::linux_perf_event_reader::{CpuMode, EventRecord};
use linux_perf_data::{PerfFileReader, PerfFileRecord};
use object::{Object, ObjectKind, ObjectSymbol, SymbolKind};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

/// Rounds of `hotspots`: about 550 million instructions, 0.55 s of guest time.
const HOTSPOTS_ROUNDS: &str = "4000";

/// Rounds of `workers` (the first worker's; the others do 3/4, 1/2 and 1/4
/// of them): about 530 million instructions over four threads.
const WORKERS_ROUNDS: &str = "16000";

/// NMI clock rate: one sample every 50 000 instructions, about 11 000 samples.
const FREQ: &str = "20000";

/// How far apart a share may be, in percentage points.
const TOLERANCE: f64 = 2.0;

/// Shares in percent, by function name.
type Shares = BTreeMap<String, f64>;

fn percentages(counts: BTreeMap<String, u64>) -> Shares {
    let total: u64 = counts.values().sum();
    counts
        .into_iter()
        .map(|(k, n)| (k, 100.0 * n as f64 / total.max(1) as f64))
        .collect()
}

/// The self instruction count of every function in a callgrind output file
/// written with `--compress-strings=no --compress-pos=no`: the cost lines
/// under each `fn=` block, except the line after `calls=`, which is the
/// inclusive cost of that call.
fn parse_callgrind(text: &str) -> BTreeMap<String, u64> {
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut after_calls = false;
    let mut events_seen = false;
    for line in text.lines() {
        if let Some(ev) = line.strip_prefix("events: ") {
            assert_eq!(ev.trim(), "Ir", "callgrind recorded other events: {ev}");
            events_seen = true;
            continue;
        }
        if let Some(name) = line.strip_prefix("fn=") {
            current = Some(name.to_string());
            after_calls = false;
            continue;
        }
        if line.starts_with("calls=") {
            after_calls = true;
            continue;
        }
        let first = line.as_bytes().first().copied();
        let is_cost = matches!(first, Some(b'0'..=b'9' | b'+' | b'-' | b'*'));
        if !is_cost {
            continue;
        }
        if after_calls {
            after_calls = false;
            continue;
        }
        let Some(f) = &current else { continue };
        let mut fields = line.split_whitespace();
        let _position = fields.next();
        let ir: u64 = fields
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("callgrind cost line without a count: {line:?}"));
        *counts.entry(f.clone()).or_default() += ir;
    }
    assert!(events_seen, "not a callgrind output file");
    counts
}

/// Runs `exe rounds` under callgrind (which runs threads one at a time and
/// sums a function's self cost over all of them); `None` (after saying why)
/// without valgrind.
fn callgrind_shares(exe: &Path, rounds: &str, expect_line: &str) -> Option<Shares> {
    if !have_tool("valgrind") {
        eprintln!(
            "SKIPPED: valgrind is not installed (apt-get install --no-install-recommends valgrind)"
        );
        return None;
    }
    let dir = tempfile::tempdir().expect("temporary directory");
    let out_file = dir.path().join("callgrind.out");
    let out = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out_file.display()))
        .args(["--compress-strings=no", "--compress-pos=no"])
        .arg(exe)
        .arg(rounds)
        .stdin(Stdio::null())
        .output()
        .expect("running valgrind");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(expect_line),
        "callgrind run of {} failed:\n{stdout}\n{}",
        exe.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&out_file).expect("callgrind output");
    Some(percentages(parse_callgrind(&text)))
}

/// The function symbols of a non-PIE static executable: `(start, end, name)`, sorted.
fn functions(exe: &Path) -> Vec<(u64, u64, String)> {
    let bytes = std::fs::read(exe).expect("reading the program");
    let file = object::File::parse(&*bytes).expect("an ELF file");
    assert_eq!(
        file.kind(),
        ObjectKind::Executable,
        "{} must be a non-PIE executable (link addresses are run addresses)",
        exe.display()
    );
    let mut f: Vec<(u64, u64, String)> = file
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0)
        .filter_map(|s| {
            let name = s.name().ok()?.to_string();
            Some((s.address(), s.address() + s.size(), name))
        })
        .collect();
    f.sort();
    f.dedup_by_key(|s| s.0);
    f
}

fn symbolize(funcs: &[(u64, u64, String)], ip: u64) -> String {
    let i = funcs.partition_point(|f| f.0 <= ip);
    match i.checked_sub(1).map(|i| &funcs[i]) {
        Some((start, end, name)) if (*start..*end).contains(&ip) => name.clone(),
        _ => format!("[unknown {ip:#x}]"),
    }
}

/// Records `exe rounds` alone (pid 1) with `perch record --icount -- exe rounds`
/// and returns the shares of its user samples (of all its threads) by
/// symbol, and the sample count.
fn perch_shares(exe: &Path, rounds: &str, expect_line: &str) -> (Shares, u64) {
    let exe_arg = exe.to_str().expect("a UTF-8 program path");
    // A flight-recorder buffer: frames wait in the guest's RAM when the
    // host is slow to read them, so the drain never stalls and no sample
    // is lost (lost samples fall on whichever thread runs next, and would
    // skew the shares with the host's load).
    let rec = record(&[
        "--freq",
        FREQ,
        "--max-rate",
        "0",
        "--duration",
        "60",
        "--buffer",
        "16",
        "--",
        exe_arg,
        rounds,
    ]);
    let err = &rec.stderr;
    assert_eq!(rec.status, Some(0), "perch record failed:\n{err}");
    assert!(
        err.contains(" 0 lost (0 on the target, 0 on the wire)"),
        "samples were lost, which skews the shares:\n{err}"
    );
    assert!(
        rec.stdout.lines().any(|l| l == expect_line),
        "{exe_arg} did not finish its rounds:\n{}\n{err}",
        rec.stdout
    );
    assert!(
        err.contains("run ended: all processes exited"),
        "the run did not end with the program:\n{err}"
    );
    let funcs = functions(exe);
    let reader = std::io::BufReader::new(std::fs::File::open(&rec.data).expect("perf.data"));
    let PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = PerfFileReader::parse_file(reader).expect("perf.data parses");
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut n = 0u64;
    while let Some(r) = record_iter.next_record(&mut perf_file).expect("a record") {
        let PerfFileRecord::EventRecord { record, .. } = r else {
            continue;
        };
        let Ok(EventRecord::Sample(s)) = record.parse() else {
            continue;
        };
        if s.pid != Some(1) || s.cpu_mode != CpuMode::User {
            continue;
        }
        let ip = s.ip.expect("samples carry IP");
        *counts.entry(symbolize(&funcs, ip)).or_default() += 1;
        n += 1;
    }
    (percentages(counts), n)
}

/// Runs `exe rounds` under a native `perf record -e cpu-clock` and returns the
/// shares of its user samples by symbol; `None` when perf cannot record here.
fn native_perf_shares(exe: &Path, rounds: &str) -> Option<Shares> {
    if !have_tool("perf") {
        return None;
    }
    let dir = tempfile::tempdir().expect("temporary directory");
    let data = dir.path().join("perf.data");
    let rec = Command::new("perf")
        .args(["record", "-q", "-e", "cpu-clock", "-F", "20000", "-o"])
        .arg(&data)
        .arg("--")
        .arg(exe)
        .arg(rounds)
        .stdin(Stdio::null())
        .output()
        .ok()?;
    if !rec.status.success() {
        eprintln!(
            "native perf record cannot record here: {}",
            String::from_utf8_lossy(&rec.stderr).trim()
        );
        return None;
    }
    let report = Command::new("perf")
        .args([
            "report",
            "--stdio",
            "--no-children",
            "-q",
            "--sort",
            "sym",
            "--percent-limit",
            "0",
            "-i",
        ])
        .arg(&data)
        .stdin(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&report.stdout);
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        // "    33.81%  [.] sieve": user symbols only.
        let t = line.trim();
        let Some((pct, rest)) = t.split_once('%') else {
            continue;
        };
        let Some(sym) = rest.trim().strip_prefix("[.] ") else {
            continue;
        };
        if let Ok(p) = pct.trim().parse::<f64>() {
            // Hundredths of a percent, to reuse `percentages`.
            counts.insert(sym.trim().to_string(), (p * 100.0).round() as u64);
        }
    }
    (!counts.is_empty()).then(|| percentages(counts))
}

/// Compares the shares of `program rounds` (built as `build`) under perch
/// and callgrind; `name` names the build in messages.
fn agreement(program: &str, rounds: &str, build: CBuild, name: &str) {
    if !qemu_present() {
        return;
    }
    let exe = c_program(program, build);
    // The last line, from a native run (the same bytes everywhere).
    let native = Command::new(&exe)
        .arg(rounds)
        .output()
        .expect("running the program natively");
    assert!(native.status.success());
    let stdout = String::from_utf8_lossy(&native.stdout);
    let line = stdout.lines().last().unwrap_or_default().to_string();
    assert!(
        line.starts_with(&format!("{program}: {rounds} rounds")),
        "{line}"
    );
    let Some(reference) = callgrind_shares(&exe, rounds, &line) else {
        return;
    };
    let (measured, samples) = perch_shares(&exe, rounds, &line);
    assert!(
        samples > 5000,
        "only {samples} user samples of {name}: {measured:?}"
    );
    let mut top: Vec<(&String, &f64)> = reference.iter().collect();
    top.sort_by(|a, b| b.1.total_cmp(a.1));
    top.truncate(5);
    let native = native_perf_shares(&exe, rounds);
    eprintln!("{name}: {samples} user samples under perch record --icount");
    eprintln!(
        "{:<12} {:>10} {:>10} {:>8} {:>12}",
        "function", "callgrind", "perch", "diff", "native perf"
    );
    let mut failures = Vec::new();
    for (f, want) in &top {
        let got = measured.get(*f).copied().unwrap_or(0.0);
        let diff = got - **want;
        let nat = native
            .as_ref()
            .map(|n| format!("{:.2}%", n.get(*f).copied().unwrap_or(0.0)))
            .unwrap_or_else(|| "-".into());
        eprintln!("{f:<12} {want:>9.2}% {got:>9.2}% {diff:>+8.2} {nat:>12}");
        if diff.abs() > TOLERANCE {
            failures.push(format!(
                "{f}: perch {got:.2}%, callgrind {want:.2}% ({diff:+.2} points)"
            ));
        }
    }
    if native.is_none() {
        eprintln!("(no native perf comparison: perf cannot record here)");
    }
    assert!(
        failures.is_empty(),
        "{name}: shares disagree by more than {TOLERANCE} points: {failures:?}\nperch: {measured:?}\ncallgrind: {reference:?}"
    );
}

#[test]
fn callgrind_parser_takes_self_cost_and_skips_inclusive_call_costs() {
    let text = "version: 1\npositions: line\nevents: Ir\n\nob=/x\nfl=a.c\nfn=main\n12 5\n\
                cfn=work\ncalls=2 30\n30 1000\n13 3\nfi=b.h\n+2 4\n\nfn=work\n30 600\n\
                fn=main\n14 1\n";
    let c = parse_callgrind(text);
    assert_eq!(c.get("main"), Some(&13));
    assert_eq!(c.get("work"), Some(&600));
    assert_eq!(c.len(), 2);
}

#[test]
fn shares_agree_with_callgrind_x86_64_musl() {
    agreement("hotspots", HOTSPOTS_ROUNDS, CBuild::Musl, "hotspots64");
}

#[test]
fn shares_agree_with_callgrind_i386() {
    agreement("hotspots", HOTSPOTS_ROUNDS, CBuild::Glibc32, "hotspots32");
}

/// Four threads with different work in different functions: the shares over
/// all the process's threads agree with callgrind's sums over its threads.
#[test]
fn shares_of_a_multi_threaded_program_agree_with_callgrind() {
    agreement("workers", WORKERS_ROUNDS, CBuild::Musl, "workers64");
}

/// The same four threads as an i386 glibc program (compat mode).
#[test]
fn shares_of_a_multi_threaded_i386_program_agree_with_callgrind() {
    agreement("workers", WORKERS_ROUNDS, CBuild::Glibc32, "workers32");
}
