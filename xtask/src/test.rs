//! `cargo xtask test`: formatting, lints, host tests (the QEMU end-to-end
//! tests of `tests/` among them) and the on-target self-test in QEMU (plain,
//! under icount, `-cpu max` under icount with the protections checked, on
//! `-machine microvm`, and from the ISO under BIOS and UEFI), with a summary whose last line is
//! `N passed, M failed`.

use crate::tools::{self, BUSYBOX, GCC_MULTILIB, MUSL_GCC, PROGRAM_TARGETS, RUNTIME_TARGET};
use crate::{SelftestArgs, is_failure_line, project_root, selftest_failures};
use anyhow::Result;
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::Instant;

/// What a step says: whether it passed, and the lines of its output that
/// say what failed (repeated in the summary, where a long run's log ends).
type Outcome = (bool, Vec<String>);

/// Runs cargo with `args`, its output passed through as it comes.
fn cargo(args: &[&str]) -> Result<Outcome> {
    println!("xtask: cargo {}", args.join(" "));
    let mut child = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(project_root())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let out = child.stdout.take().map(|o| pass_through(o, false));
    let err = child.stderr.take().map(|e| pass_through(e, true));
    let status = child.wait()?;
    let mut failures = Vec::new();
    for h in [out, err].into_iter().flatten() {
        failures.extend(h.join().unwrap_or_default());
    }
    Ok((status.success(), failures))
}

/// Copies `from` line by line to this process's stdout (or stderr) on a
/// thread of its own; the thread returns the lines that say what failed.
fn pass_through(
    from: impl Read + Send + 'static,
    to_stderr: bool,
) -> std::thread::JoinHandle<Vec<String>> {
    std::thread::spawn(move || {
        let mut failures = Vec::new();
        for line in BufReader::new(from).lines() {
            let Ok(line) = line else { break };
            if to_stderr {
                eprintln!("{line}");
            } else {
                println!("{line}");
            }
            if is_failure_line(&line) {
                failures.push(line);
            }
        }
        failures
    })
}

/// Runs the self-test as `a` says.
fn selftest(a: &SelftestArgs) -> Result<Outcome> {
    let failures = selftest_failures(a)?;
    Ok((failures.is_empty(), failures))
}

/// Lines of a failed step's output the summary repeats, at most.
const SUMMARY_LINES: usize = 40;

/// Runs every step; returns the process exit code. First makes sure of what
/// the builds need: the runtime's and the test programs' rustup targets, and
/// the C compilers of `tests/programs/c` (musl-gcc, gcc -m32), and the
/// static busybox of the shell-script test.
pub fn run(with_iso: bool) -> Result<i32> {
    let mut targets = vec![RUNTIME_TARGET];
    targets.extend_from_slice(PROGRAM_TARGETS);
    tools::require_targets(&targets)?;
    tools::require_tool(&MUSL_GCC)?;
    tools::require_tool(&GCC_MULTILIB)?;
    tools::require_tool(&BUSYBOX)?;
    type Step = (&'static str, Box<dyn Fn() -> Result<Outcome>>);
    let st = |icount, iso, uefi| SelftestArgs {
        icount,
        iso,
        uefi,
        append: String::new(),
        cpu: None,
        machine: None,
        cpus: 1,
        timeout: 240,
    };
    let max_icount = SelftestArgs {
        cpu: Some("max".into()),
        ..st(true, false, false)
    };
    let microvm = SelftestArgs {
        machine: Some("microvm".into()),
        ..st(false, false, false)
    };
    // The plain run and the UEFI ISO on four CPUs, the BIOS ISO on two;
    // the icount runs and microvm keep one.
    let cpus = |n, a: SelftestArgs| SelftestArgs { cpus: n, ..a };
    let mut steps: Vec<Step> = vec![
        ("fmt", Box::new(|| cargo(&["fmt", "--all", "--check"]))),
        (
            "clippy (host crates)",
            Box::new(|| cargo(&["clippy", "--all-targets", "--", "-D", "warnings"])),
        ),
        (
            "clippy (runtime, x86_64-unknown-none)",
            Box::new(|| {
                cargo(&[
                    "clippy",
                    "--package",
                    "runtime",
                    "--target",
                    "x86_64-unknown-none",
                    "--release",
                    "--",
                    "-D",
                    "warnings",
                ])
            }),
        ),
        (
            "host tests",
            Box::new(|| cargo(&["test", "--no-fail-fast"])),
        ),
        (
            "selftest (QEMU, -kernel -smp 4)",
            Box::new(move || selftest(&cpus(4, st(false, false, false)))),
        ),
        (
            "selftest (QEMU, -icount shift=0,sleep=off)",
            Box::new(move || selftest(&st(true, false, false))),
        ),
        (
            "selftest (QEMU, -cpu max -icount: NX/SMEP/SMAP on)",
            Box::new(move || selftest(&max_icount)),
        ),
        (
            "selftest (QEMU, -machine microvm: no PCI, no HPET)",
            Box::new(move || selftest(&microvm)),
        ),
    ];
    if with_iso {
        steps.push((
            "selftest (GRUB ISO, BIOS, -smp 2)",
            Box::new(move || selftest(&cpus(2, st(false, true, false)))),
        ));
        steps.push((
            "selftest (GRUB ISO, UEFI, -smp 4)",
            Box::new(move || selftest(&cpus(4, st(false, false, true)))),
        ));
    }
    let mut results = Vec::new();
    for (name, step) in &steps {
        println!("\nxtask: ==== {name}");
        let t = Instant::now();
        let (ok, failures) = step().unwrap_or_else(|e| {
            let line = format!("xtask: {name}: {e:#}");
            println!("{line}");
            (false, vec![line])
        });
        results.push((*name, ok, failures, t.elapsed()));
    }
    println!("\nxtask: summary");
    for (name, ok, failures, t) in &results {
        println!(
            "  {:<44} {} ({:.1}s)",
            name,
            if *ok { "ok" } else { "FAILED" },
            t.as_secs_f64()
        );
        if !ok {
            for line in failures.iter().take(SUMMARY_LINES) {
                println!("      {line}");
            }
            if failures.len() > SUMMARY_LINES {
                println!("      ... {} more", failures.len() - SUMMARY_LINES);
            }
        }
    }
    let passed = results.iter().filter(|r| r.1).count();
    let failed = results.len() - passed;
    println!("{passed} passed, {failed} failed");
    Ok(if failed == 0 { 0 } else { 1 })
}
