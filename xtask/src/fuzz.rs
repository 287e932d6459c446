//! `cargo xtask fuzz`: runs the cargo-fuzz (libFuzzer) targets of `fuzz/`
//! for a number of executions each, then the `perf script` regression test
//! over the saved `perf_data` corpus.
//!
//! Nightly Rust is used for the fuzzing tool alone: the command installs the
//! nightly toolchain (`rustup toolchain install nightly --profile minimal`)
//! and `cargo-fuzz` (`cargo install cargo-fuzz --locked`) when they are
//! missing, saying so, and builds the targets once. Each target runs with
//! its working corpus `fuzz/corpus/TARGET` (not checked in; new inputs go
//! there) and its saved corpus `fuzz/saved/TARGET` (checked in, read only)
//! on one job. A crash leaves its input in `fuzz/artifacts/TARGET/` and
//! fails the command after the remaining targets have run.

use anyhow::{Context, Result, bail};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::project_root;

/// How the targets are built, for `cargo fuzz build` and `cargo fuzz run`
/// alike (a run with other flags would build again): optimised, with debug
/// assertions and overflow checks, without AddressSanitizer (the code under
/// test is safe Rust, and ASan halves the executions per second).
const BUILD_FLAGS: &[&str] = &["-O", "-a", "--sanitizer", "none"];

/// Every target, in the order they run.
pub const TARGETS: &[&str] = &[
    "wire_frames",
    "wire_roundtrip",
    "wire_records",
    "perf_data",
    "image",
    "archive",
    "manifest",
    "elf_plan",
    "cmdline",
    "pebs",
    "lbr",
];

/// What to run.
pub struct Options {
    /// Executions per target.
    pub runs: u64,
    /// Only this target.
    pub target: Option<String>,
}

/// How one target's run went.
struct Outcome {
    target: &'static str,
    runs: Option<u64>,
    seconds: f64,
    ok: bool,
}

fn status_ok(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Installs the nightly toolchain and cargo-fuzz when they are missing.
fn ensure_tools() -> Result<()> {
    if !status_ok(Command::new("rustup").args(["run", "nightly", "rustc", "--version"])) {
        println!("xtask: fuzz: the nightly toolchain is missing; installing it (minimal profile)");
        let ok = Command::new("rustup")
            .args(["toolchain", "install", "nightly", "--profile", "minimal"])
            .status()
            .context("running rustup")?
            .success();
        if !ok {
            bail!("`rustup toolchain install nightly --profile minimal` failed");
        }
    }
    if !status_ok(Command::new("cargo").args(["+nightly", "fuzz", "--version"])) {
        println!("xtask: fuzz: cargo-fuzz is missing; installing it (cargo install cargo-fuzz)");
        let ok = Command::new("cargo")
            .args(["install", "cargo-fuzz", "--locked"])
            .status()
            .context("running cargo install")?
            .success();
        if !ok {
            bail!("`cargo install cargo-fuzz --locked` failed");
        }
    }
    Ok(())
}

/// libFuzzer's closing count: `Done 10000 runs in 3 second(s)`.
fn done_runs(stderr: &str) -> Option<u64> {
    stderr.lines().rev().find_map(|l| {
        let rest = l.strip_prefix("Done ")?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

fn run_target(fuzz_dir: &Path, target: &'static str, runs: u64) -> Result<Outcome> {
    let corpus = fuzz_dir.join("corpus").join(target);
    std::fs::create_dir_all(&corpus).with_context(|| format!("creating {}", corpus.display()))?;
    let mut cmd = Command::new("cargo");
    cmd.current_dir(fuzz_dir)
        .args(["+nightly", "fuzz", "run"])
        .args(BUILD_FLAGS)
        .arg(target)
        .arg(&corpus);
    let saved = fuzz_dir.join("saved").join(target);
    if saved.is_dir() {
        cmd.arg(&saved);
    }
    cmd.args([
        "--",
        &format!("-runs={runs}"),
        "-timeout=30",
        "-rss_limit_mb=2048",
        "-print_final_stats=1",
    ]);
    println!("xtask: fuzz: {target}: {runs} executions");
    let start = Instant::now();
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .context("running cargo fuzz")?;
    let seconds = start.elapsed().as_secs_f64();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let ok = out.status.success();
    if !ok {
        // libFuzzer's report (the failing assertion, the artifact path).
        let lines: Vec<&str> = stderr.lines().collect();
        for l in &lines[lines.len().saturating_sub(40)..] {
            eprintln!("  {l}");
        }
    }
    Ok(Outcome {
        target,
        runs: done_runs(&stderr),
        seconds,
        ok,
    })
}

/// Runs the targets and the corpus regression test; 0 when all pass.
pub fn run(opts: &Options) -> Result<i32> {
    let targets: Vec<&'static str> = match &opts.target {
        Some(t) => match TARGETS.iter().find(|x| *x == t) {
            Some(x) => vec![*x],
            None => bail!(
                "no fuzz target `{t}`; the targets are {}",
                TARGETS.join(", ")
            ),
        },
        None => TARGETS.to_vec(),
    };
    ensure_tools()?;
    let fuzz_dir = project_root().join("fuzz");
    let start = Instant::now();
    let built = Command::new("cargo")
        .current_dir(&fuzz_dir)
        .args(["+nightly", "fuzz", "build"])
        .args(BUILD_FLAGS)
        .stdin(Stdio::null())
        .status()
        .context("running cargo fuzz build")?
        .success();
    if !built {
        bail!("`cargo +nightly fuzz build` failed");
    }
    println!(
        "xtask: fuzz: targets built in {:.0} s",
        start.elapsed().as_secs_f64()
    );
    let mut outcomes = Vec::new();
    for t in targets {
        outcomes.push(run_target(&fuzz_dir, t, opts.runs)?);
    }
    println!("xtask: fuzz: target, executions, seconds, result");
    for o in &outcomes {
        println!(
            "xtask: fuzz: {}, {}, {:.1}, {}",
            o.target,
            o.runs.map_or("?".to_owned(), |r| r.to_string()),
            o.seconds,
            if o.ok {
                "ok".to_owned()
            } else {
                format!("FAILED (input in fuzz/artifacts/{}/)", o.target)
            }
        );
    }
    let failed = outcomes.iter().filter(|o| !o.ok).count();

    // perf script over the saved perf_data corpus (stable toolchain).
    println!("xtask: fuzz: perf script over the saved perf_data corpus");
    let regression = Command::new("cargo")
        .current_dir(&fuzz_dir)
        .args(["test", "-p", "perch-fuzz-input"])
        .stdin(Stdio::null())
        .status()
        .context("running the corpus regression test")?
        .success();
    println!(
        "xtask: fuzz: done in {:.0} s (the tools' install excluded); corpus regression {}",
        start.elapsed().as_secs_f64(),
        if regression { "passed" } else { "FAILED" }
    );
    let passed = outcomes.len() - failed + usize::from(regression);
    let failed = failed + usize::from(!regression);
    println!("fuzz: {passed} passed, {failed} failed");
    Ok(if failed == 0 { 0 } else { 1 })
}
