//! `cargo xtask test`: formatting, lints, host tests (the QEMU end-to-end
//! tests of `tests/` among them) and the on-target self-test in QEMU (plain,
//! under icount, `-cpu max` under icount with the protections checked, on
//! `-machine microvm`, and from the ISO under BIOS and UEFI), with a summary whose last line is
//! `N passed, M failed`.

use crate::tools::{self, BUSYBOX, GCC_MULTILIB, MUSL_GCC, PROGRAM_TARGETS, RUNTIME_TARGET};
use crate::{SelftestArgs, project_root, selftest};
use anyhow::Result;
use std::process::Command;
use std::time::Instant;

fn cargo(args: &[&str]) -> Result<bool> {
    println!("xtask: cargo {}", args.join(" "));
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(project_root())
        .args(args)
        .status()?;
    Ok(status.success())
}

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
    type Step = (&'static str, Box<dyn Fn() -> Result<bool>>);
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
        let ok = match step() {
            Ok(ok) => ok,
            Err(e) => {
                println!("xtask: {name}: {e:#}");
                false
            }
        };
        results.push((*name, ok, t.elapsed()));
    }
    println!("\nxtask: summary");
    for (name, ok, t) in &results {
        println!(
            "  {:<44} {} ({:.1}s)",
            name,
            if *ok { "ok" } else { "FAILED" },
            t.as_secs_f64()
        );
    }
    let passed = results.iter().filter(|r| r.1).count();
    let failed = results.len() - passed;
    println!("{passed} passed, {failed} failed");
    Ok(if failed == 0 { 0 } else { 1 })
}
