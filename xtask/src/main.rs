//! Build, run, image, self-test, bench, fuzz and hwcheck commands for Perch.
//!
//! `cargo xtask <command>`; every command that boots the runtime runs QEMU
//! through [`qemu`], with a hard timeout, stdin closed and a kill guard.
#![forbid(unsafe_code)]

mod fuzz;
mod hwcheck;
mod image;
mod kernel;
#[cfg(test)]
mod layers;
mod profile;
mod qemu;
mod test;
mod tools;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Perch build and test tasks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// One variant per command; each delegates to its module.
#[derive(Subcommand)]
enum Command {
    /// Build the runtime ELF and print its path.
    Build,
    /// Install `perch` with its runtime: `cargo install --path host-tool`,
    /// then the runtime as `perch-runtime` beside the installed binary,
    /// where perch finds it with no --image.
    Install(InstallArgs),
    /// Record a profile of the demo appliance in QEMU with `perch` and show
    /// the top of `perf report`.
    Run(RunArgs),
    /// Measure the NMI path, the wire, the loss-free rate and conversion speed.
    Bench,
    /// Boot the runtime with `selftest` in QEMU; exit 0 only on a full pass.
    Selftest(SelftestArgs),
    /// Build the bootable GRUB ISO (multiboot2, BIOS and UEFI).
    Image(ImageArgs),
    /// fmt check, clippy, host tests, and the self-test in QEMU (plain, icount,
    /// `-cpu max` with icount, and the ISO under BIOS and UEFI).
    Test(TestArgs),
    /// Run every fuzz target (or one) for N executions on nightly with
    /// cargo-fuzz, installing both when missing, then `perf script` over the
    /// saved perf_data corpus.
    Fuzz(FuzzArgs),
    /// Run the PMU self-test under KVM `-cpu host` when a virtual PMU exists;
    /// otherwise say why not and how to boot the ISO on bare metal (exit 0).
    Hwcheck,
}

#[derive(clap::Args)]
struct InstallArgs {
    /// The installation root (cargo install's `--root`: perch goes to
    /// ROOT/bin; default: $CARGO_INSTALL_ROOT, else $CARGO_HOME, else
    /// ~/.cargo).
    #[arg(long, value_name = "ROOT")]
    root: Option<PathBuf>,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Length of the recording in ms (TSC time on the target; instructions
    /// / 10^6 under icount).
    #[arg(long, default_value_t = 2000)]
    duration: u64,
    /// NMI rate in Hz.
    #[arg(long, default_value_t = 4000)]
    freq: u64,
    /// Run under `-icount shift=0,sleep=off` (instruction-exact, repeatable;
    /// the default for recordings).
    #[arg(long)]
    icount: bool,
    /// Record in real time instead of under icount: the emulated UART then
    /// costs real host time per byte and shows up in the profile.
    #[arg(long, conflicts_with = "icount")]
    realtime: bool,
    /// Where perf.data goes (default: perf.data in the repository root).
    #[arg(short = 'o', long)]
    output: Option<PathBuf>,
    /// Boot the demo with the plain text console instead (no recording).
    #[arg(long)]
    text: bool,
    /// Extra kernel command-line items (text console only).
    #[arg(long, default_value = "")]
    append: String,
    /// Hard timeout in seconds (text console only).
    #[arg(long, default_value_t = 120)]
    timeout: u64,
}

#[derive(clap::Args, Clone)]
pub struct SelftestArgs {
    /// Run under `-icount shift=0,sleep=off`.
    #[arg(long)]
    pub icount: bool,
    /// Boot the GRUB ISO under BIOS instead of `-kernel`.
    #[arg(long)]
    pub iso: bool,
    /// Boot the GRUB ISO under UEFI (OVMF, q35).
    #[arg(long)]
    pub uefi: bool,
    /// Extra kernel command-line items.
    #[arg(long, default_value = "")]
    pub append: String,
    /// QEMU CPU model (`-cpu`; default: `max`, or QEMU's default under
    /// `--icount`). `--cpu max` also requires the protections to be on and
    /// checked: NX, SMEP and SMAP enabled (TCG's `max` has them), the page-rights
    /// and NX self-tests run, not skipped.
    #[arg(long)]
    pub cpu: Option<String>,
    /// QEMU machine (`-machine`; default `pc`, `q35` with `--uefi`).
    /// `microvm` is the Firecracker-style machine: no PCI, no HPET, no PC
    /// speaker port; it boots only `-kernel`.
    #[arg(long, value_parser = ["pc", "q35", "microvm"], conflicts_with_all = ["iso", "uefi"])]
    pub machine: Option<String>,
    /// CPUs (`-smp N`): the self-test then checks that every CPU came up
    /// on its own tables.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub cpus: u32,
    /// Hard timeout in seconds.
    #[arg(long, default_value_t = 180)]
    pub timeout: u64,
}

#[derive(clap::Args)]
struct ImageArgs {
    /// Kernel command line baked into the GRUB entry.
    #[arg(long, default_value = "")]
    cmdline: String,
    /// Output path (default: out/perch.iso).
    #[arg(long)]
    output: Option<PathBuf>,
    /// A boot archive (cpio newc with `.perch/manifest`) to load as the
    /// multiboot2 module: the programs the appliance runs (default: the
    /// demo appliance, or the self-test's archive with `selftest` in the
    /// command line).
    #[arg(long)]
    archive: Option<PathBuf>,
}

#[derive(clap::Args)]
struct FuzzArgs {
    /// Executions per target.
    #[arg(long, default_value_t = 10_000)]
    runs: u64,
    /// Run only this target.
    #[arg(long)]
    target: Option<String>,
}

#[derive(clap::Args)]
struct TestArgs {
    /// Skip the ISO boots (BIOS and UEFI).
    #[arg(long)]
    no_iso: bool,
}

/// The workspace root (the parent of this crate).
pub fn project_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

fn main() {
    let cli = Cli::parse();
    let result: Result<i32> = match cli.command {
        Command::Build => kernel::build().map(|elf| {
            println!("{}", elf.display());
            0
        }),
        Command::Install(a) => kernel::install(a.root.as_deref()).map(|()| 0),
        Command::Run(a) if !a.text => profile::run(&profile::RunOptions {
            duration_ms: a.duration,
            freq: a.freq,
            icount: !a.realtime,
            output: a.output.unwrap_or_else(|| project_root().join("perf.data")),
            append: a.append,
        }),
        Command::Run(a) => run(a),
        Command::Bench => profile::bench(),
        Command::Selftest(a) => selftest(&a).map(|ok| if ok { 0 } else { 1 }),
        Command::Image(a) => {
            let out = a
                .output
                .unwrap_or_else(|| project_root().join("out/perch.iso"));
            // Without --archive (and without `selftest` in the command
            // line) the ISO carries the demo appliance: the runtime has no
            // built-in programs.
            let archive = match a.archive {
                Some(p) => Ok(p),
                None if a.cmdline.split_whitespace().any(|k| k == "selftest") => {
                    let p = project_root().join("target/selftest-archive.cpio");
                    image::selftest_archive(&p).map(|()| p)
                }
                None => kernel::demo_archive(),
            };
            archive
                .and_then(|archive| {
                    let elf = kernel::build()?;
                    image::build_iso(&elf, &a.cmdline, Some(&archive), &out)
                })
                .map(|()| {
                    println!("{}", out.display());
                    0
                })
        }
        Command::Test(a) => test::run(!a.no_iso),
        Command::Fuzz(a) => fuzz::run(&fuzz::Options {
            runs: a.runs,
            target: a.target,
        }),
        Command::Hwcheck => hwcheck::run(),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            std::process::exit(2);
        }
    }
}

fn run(a: RunArgs) -> Result<i32> {
    let elf = kernel::build()?;
    let archive = kernel::demo_archive()?;
    let cmdline = format!("duration={} {}", a.duration, a.append);
    let cfg = qemu::Config {
        boot: qemu::Boot::Kernel {
            elf,
            cmdline: cmdline.trim().to_string(),
            initrd: Some(archive),
        },
        icount: a.icount,
        cpu: None,
        machine: None,
        cpus: 1,
        timeout: std::time::Duration::from_secs(a.timeout),
    };
    let out = qemu::run(&cfg)?;
    println!("xtask: QEMU ended: {}", out.verdict());
    Ok(if out.exit == qemu::Exit::Pass { 0 } else { 1 })
}

/// Runs the self-test as `a` says; true on a full pass.
pub fn selftest(a: &SelftestArgs) -> Result<bool> {
    selftest_failures(a).map(|failures| failures.is_empty())
}

/// Runs the self-test as `a` says; what failed (its failed tests' lines,
/// panics, what the run lacked and how QEMU ended), empty on a full pass.
pub fn selftest_failures(a: &SelftestArgs) -> Result<Vec<String>> {
    let elf = kernel::build()?;
    let cmdline = format!("selftest {}", a.append).trim().to_string();
    let archive = project_root().join("target/selftest-archive.cpio");
    image::selftest_archive(&archive)?;
    let boot = if a.iso || a.uefi {
        let iso = project_root().join(if a.uefi {
            "out/perch-selftest-uefi.iso"
        } else {
            "out/perch-selftest.iso"
        });
        image::build_iso(&elf, &cmdline, Some(&archive), &iso)?;
        qemu::Boot::Iso { iso, uefi: a.uefi }
    } else {
        qemu::Boot::Kernel {
            elf,
            cmdline,
            initrd: Some(archive),
        }
    };
    let cfg = qemu::Config {
        boot,
        icount: a.icount,
        cpu: a.cpu.clone(),
        machine: a.machine.clone(),
        cpus: a.cpus,
        timeout: std::time::Duration::from_secs(a.timeout),
    };
    let out = qemu::run(&cfg)?;
    let summary = out.selftest_summary();
    // `--cpu max`: the protections must be on, and their checks must have run.
    let mut missing_lines = Vec::new();
    let protections = a.cpu.as_deref() != Some("max") || {
        let missing = missing_protection_checks(&out.lines);
        for m in &missing {
            let line = format!("xtask: -cpu max: {m}");
            println!("{line}");
            missing_lines.push(line);
        }
        missing.is_empty()
    };
    // The boot archive must have reached the self-test through the protocol.
    let archive_seen = out
        .lines
        .iter()
        .any(|l| l.contains("selftest: boot_archive ... ok"))
        && !out
            .lines
            .iter()
            .any(|l| l.contains("boot_archive: skipped"));
    // `--cpus N` (without `smp=`): the runtime must have found and started
    // all N.
    let cpus_up = a.cpus == 1 || a.append.contains("smp=") || {
        let want = format!("perch: cpus: {n} of {n} up", n = a.cpus);
        let seen = out.lines.iter().any(|l| l.contains(&want));
        if !seen {
            let line = format!("xtask: --cpus {}: no \"{want}\" line", a.cpus);
            println!("{line}");
            missing_lines.push(line);
        }
        seen
    };
    let pass = out.exit == qemu::Exit::Pass
        && summary.is_some_and(|(_, failed)| failed == 0)
        && archive_seen
        && protections
        && cpus_up;
    if !archive_seen {
        let line = "xtask: the self-test did not read the boot archive it was booted with";
        println!("{line}");
        missing_lines.push(line.to_string());
    }
    let verdict = match (pass, summary) {
        (true, Some((p, _))) => {
            println!("xtask: selftest passed ({p} tests)");
            return Ok(Vec::new());
        }
        (_, Some((p, f))) => format!(
            "xtask: selftest FAILED: {p} passed, {f} failed; QEMU: {}",
            out.verdict()
        ),
        (_, None) => format!(
            "xtask: selftest FAILED: no summary line; QEMU: {}",
            out.verdict()
        ),
    };
    println!("{verdict}");
    let mut failures: Vec<String> = out
        .lines
        .iter()
        .filter(|l| is_failure_line(l))
        .cloned()
        .collect();
    failures.extend(missing_lines);
    failures.push(verdict);
    Ok(failures)
}

/// Whether a line of a run's output says what failed: a failed self-test,
/// the runtime's panic or exception, a failed Rust test (its header, its
/// panic and the result line), a compiler or lint error, or a file
/// `cargo fmt --check` would change.
pub fn is_failure_line(line: &str) -> bool {
    let l = line.trim_start();
    l.contains(" ... FAILED")
        || l.contains("panicked at")
        || l.starts_with("---- ")
        || l.starts_with("error")
        || l.starts_with("test result: FAILED")
        || l.starts_with("Diff in ")
        || l.starts_with("RUNTIME PANIC")
        || l.starts_with("RUNTIME EXCEPTION")
}

/// What a `-cpu max` self-test run lacks of the protection checks: the boot
/// line must report NX, SMEP and SMAP on, and the self-tests that check them
/// (`paging_rights`: CR4 against CPUID and the page rights;
/// `user64_executes_data_nx`: an NX fetch fault, skipped without NX) must
/// have passed.
fn missing_protection_checks(lines: &[String]) -> Vec<String> {
    let mut missing = Vec::new();
    if !lines
        .iter()
        .any(|l| l.contains("cpu tables loaded; nx=true smep=true smap=true"))
    {
        missing.push("the runtime did not report nx=true smep=true smap=true".to_string());
    }
    for test in ["paging_rights", "user64_executes_data_nx"] {
        let ok = format!("selftest: {test} ... ok");
        if !lines.iter().any(|l| l.contains(&ok)) {
            missing.push(format!("no `{ok}`"));
        }
    }
    missing
}

#[cfg(test)]
mod tests {
    use super::{is_failure_line, missing_protection_checks};

    #[test]
    fn protection_checks_must_all_be_there() {
        let good: Vec<String> = [
            "perch: cpu tables loaded; nx=true smep=true smap=true",
            "selftest: paging_rights ... ok",
            "selftest: user64_executes_data_nx ... ok",
        ]
        .map(String::from)
        .to_vec();
        assert!(missing_protection_checks(&good).is_empty());
        let mut off = good.clone();
        off[0] = "perch: cpu tables loaded; nx=true smep=false smap=false".into();
        assert_eq!(missing_protection_checks(&off).len(), 1);
        let mut failed = good.clone();
        failed[1] = "selftest: paging_rights ... FAILED (CR0.WP off)".into();
        assert_eq!(missing_protection_checks(&failed).len(), 1);
        assert_eq!(missing_protection_checks(&[]).len(), 3);
    }

    #[test]
    fn failure_lines_are_picked_from_a_run() {
        let run = [
            "selftest: preemption ... ok",
            "selftest: preemption_on_other_cpus ... FAILED (CPU 2's task 7 was preempted 1 times)",
            "RUNTIME PANIC: panicked at runtime/src/proc/mod.rs:12:5:",
            "RUNTIME EXCEPTION: #PF page fault (vector 14) error=0x2",
            "---- smp::threads_spread stdout ----",
            "thread 'smp::threads_spread' panicked at tests/tests/smp.rs:40:9:",
            "test result: FAILED. 10 passed; 1 failed; 0 ignored",
            "test result: ok. 11 passed; 0 failed; 0 ignored",
            "error[E0308]: mismatched types",
            "Diff in /repo/xtask/src/test.rs:12:",
            "perch: wrote out.data: 8004 samples, 0 lost",
            "45 passed, 0 failed",
        ];
        let picked: Vec<&str> = run.into_iter().filter(|l| is_failure_line(l)).collect();
        assert_eq!(
            picked,
            run[1..=6]
                .iter()
                .chain(&run[8..=9])
                .copied()
                .collect::<Vec<_>>()
        );
    }
}
