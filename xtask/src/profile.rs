//! `cargo xtask run` (record a profile of the demo appliance with `perch`
//! and show the top of `perf report`) and `cargo xtask bench` (one table of
//! the costs that matter: NMI-path instructions per sample, wire bytes per
//! sample, the highest loss-free NMI rate, and `perch convert` beside
//! `perf script` / `perf report` on the same 1M samples).

use crate::{kernel, project_root, tools};
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// What `cargo xtask run` records.
pub struct RunOptions {
    /// Sampled time in ms.
    pub duration_ms: u64,
    /// NMI rate.
    pub freq: u64,
    /// Instruction-exact timing.
    pub icount: bool,
    /// Where perf.data goes.
    pub output: PathBuf,
    /// Extra runtime command-line keys.
    pub append: String,
}

fn perf_found() -> bool {
    Command::new("perf")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Records the demo with `perch record` and prints the top of the profile.
pub fn run(o: &RunOptions) -> Result<i32> {
    tools::require_tool(&tools::QEMU)?;
    let elf = kernel::build()?;
    let perch = kernel::build_perch()?;
    let out_dir = project_root().join("out");
    std::fs::create_dir_all(&out_dir)?;
    let capture = out_dir.join("run.capture");
    let mut cmd = Command::new(&perch);
    cmd.arg("record")
        .arg("--image")
        .arg(&elf)
        .args(["--freq", &o.freq.to_string()])
        .args(["--duration", &format!("{}", o.duration_ms as f64 / 1000.0)])
        .arg("-o")
        .arg(&o.output)
        .arg("--save-capture")
        .arg(&capture)
        .stdin(Stdio::null());
    if o.icount {
        cmd.arg("--icount");
    }
    if !o.append.trim().is_empty() {
        eprintln!(
            "xtask: note: perch record sets the runtime command line; --append is ignored here"
        );
    }
    println!("xtask: {cmd:?}");
    let status = cmd.status().context("running perch record")?;
    if !status.success() {
        println!("xtask: perch record failed ({status})");
        return Ok(status.code().unwrap_or(1));
    }
    if !perf_found() {
        let _ = tools::require("perf", &["linux-perf"]);
    }
    if perf_found() {
        let out = Command::new("perf")
            .args([
                "report",
                "--stdio",
                "--no-children",
                "-g",
                "none",
                "--percent-limit",
                "0.5",
                "--demangle-kernel",
            ])
            .arg("-i")
            .arg(&o.output)
            .arg(format!("--vmlinux={}", elf.display()))
            .stdin(Stdio::null())
            .output()
            .context("running perf report")?;
        let text = String::from_utf8_lossy(&out.stdout);
        println!(
            "\nxtask: top of `perf report --stdio` on {}:",
            o.output.display()
        );
        for line in text.lines().filter(|l| !l.trim().is_empty()).take(30) {
            println!("{line}");
        }
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        println!(
            "\nxtask: open it with: perf report -i {} --vmlinux={} --demangle-kernel",
            o.output.display(),
            elf.display()
        );
    } else {
        println!(
            "\nxtask: perf is not installed (apt-get install linux-perf); perch's own summary instead:"
        );
        let s = Command::new(&perch).arg("stat").arg(&capture).status()?;
        if !s.success() {
            bail!("perch stat failed ({s})");
        }
    }
    Ok(0)
}

/// One `perch record` (under icount unless `realtime`); returns success and
/// perch's stderr.
fn record_with(
    perch: &Path,
    elf: &Path,
    realtime: bool,
    args: &[&str],
    out: &Path,
) -> Result<(bool, String)> {
    let mut cmd = Command::new(perch);
    cmd.arg("record").arg("--image").arg(elf);
    if !realtime {
        cmd.arg("--icount");
    }
    let o = cmd
        .arg("-o")
        .arg(out)
        .arg("--save-capture")
        .arg(out.with_extension("capture"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running perch record")?;
    Ok((
        o.status.success(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    ))
}

/// The number after `key` in `text` (first match).
fn number_after(text: &str, key: &str) -> Option<f64> {
    let i = text.find(key)? + key.len();
    let rest = text[i..].trim_start();
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

fn nmi_cost(stderr: &str) -> Option<f64> {
    number_after(stderr, "demo: NMI path")
}

fn bytes_per_sample(stderr: &str) -> Option<f64> {
    let line = stderr
        .lines()
        .find(|l| l.contains("bytes/sample on the wire"))?;
    let head = line.split(" bytes/sample").next()?;
    head.rsplit(' ').next()?.parse().ok()
}

fn lost(stderr: &str) -> Option<u64> {
    number_after(stderr, "target counters: taken")?;
    let line = stderr
        .lines()
        .find(|l| l.contains("target counters: taken"))?;
    let nums: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    nums.get(2).copied()
}

fn timed(cmd: &mut Command) -> Result<f64> {
    // Dirty pages of earlier steps are written back first, so no command
    // pays for another's output.
    let _ = Command::new("sync").status();
    let t = Instant::now();
    let s = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .stdin(Stdio::null())
        .status()
        .with_context(|| format!("running {cmd:?}"))?;
    if !s.success() {
        bail!("{cmd:?} failed ({s})");
    }
    Ok(t.elapsed().as_secs_f64())
}

/// Runs of each timed command; the table gives the median.
const TIMED_RUNS: usize = 5;

/// The median wall time of [`TIMED_RUNS`] runs of `make()`'s command,
/// calling `before` ahead of each.
fn median_timed(mut before: impl FnMut(), mut make: impl FnMut() -> Command) -> Result<f64> {
    let mut t = Vec::with_capacity(TIMED_RUNS);
    for _ in 0..TIMED_RUNS {
        before();
        t.push(timed(&mut make())?);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[TIMED_RUNS / 2])
}

/// `perch record` args that set the runtime command line with extra keys
/// (QEMU keeps the last `-append`).
fn append_args(freq: u64, duration_ms: u64, extra: &str) -> Vec<String> {
    vec![
        "--freq".into(),
        freq.to_string(),
        "--duration".into(),
        format!("{}", duration_ms as f64 / 1000.0),
        "--".into(),
        "-append".into(),
        format!("console=wire freq={freq} pmu=auto duration={duration_ms} {extra}"),
    ]
}

/// Runs the measurements and prints one table.
pub fn bench() -> Result<i32> {
    tools::require_tool(&tools::QEMU)?;
    let elf = kernel::build()?;
    let perch = kernel::build_perch()?;
    let dir = project_root().join("out/bench");
    std::fs::create_dir_all(&dir)?;
    let mut rows: Vec<(String, String)> = Vec::new();

    for (set, label) in [
        ("minimal", "IP, TID, TIME, CPU, PERIOD"),
        ("default", "+ REGS_USER (20 GPRs) + CALLCHAIN (the default)"),
        ("full", "+ REGS_USER + CALLCHAIN + REGS_INTR (20 GPRs)"),
    ] {
        let out = dir.join(format!("{set}.data"));
        let args = append_args(4000, 500, &format!("sample={set}"));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, err) = record_with(&perch, &elf, false, &args, &out)?;
        if !ok {
            bail!("recording with sample={set} failed:\n{err}");
        }
        let cost = nmi_cost(&err).map_or("?".into(), |c| format!("{c:.0}"));
        let bytes = bytes_per_sample(&err).map_or("?".into(), |b| format!("{b:.1}"));
        rows.push((format!("NMI path, instructions per sample: {label}"), cost));
        rows.push((format!("wire bytes per sample: {label}"), bytes));
    }

    for (realtime, rates, what) in [
        (
            false,
            &[1_000u64, 4_000, 10_000, 20_000, 50_000, 100_000, 200_000][..],
            "under icount (UART bytes cost one instruction each)",
        ),
        (
            true,
            &[250u64, 500, 1_000, 2_000, 4_000][..],
            "in real time (UART socket at host speed)",
        ),
    ] {
        let mut best = None;
        for &freq in rates {
            let out = dir.join(format!("rate-{freq}-{realtime}.data"));
            // Throttling off: the row measures the ring and the line, not
            // the max_rate limit (100,000/s by default).
            let args = append_args(freq, 500, "max_rate=0");
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let (ok, err) = record_with(&perch, &elf, realtime, &args, &out)?;
            match (ok, lost(&err)) {
                (true, Some(0)) => best = Some(freq),
                _ => break,
            }
        }
        let tried: Vec<String> = rates.iter().map(u64::to_string).collect();
        rows.push((
            format!(
                "highest NMI rate with no loss (max_rate=0), {what}; Hz tried: {}",
                tried.join(" ")
            ),
            best.map_or("none".into(), |f| f.to_string()),
        ));
    }

    let capture = dir.join("synth-1M.capture");
    let data = dir.join("synth-1M.data");
    let s = Command::new(&perch)
        .arg("synth")
        .arg("-o")
        .arg(&capture)
        .arg("--image")
        .arg(&elf)
        .args(["--samples", "1000000"])
        .stdout(Stdio::null())
        .status()?;
    if !s.success() {
        bail!("perch synth failed ({s})");
    }
    // Each conversion writes a new file: removing the previous one (ext4
    // freeing 250 MB of blocks) is not part of converting.
    let convert = median_timed(
        || {
            let _ = std::fs::remove_file(&data);
        },
        || {
            let mut c = Command::new(&perch);
            c.arg("convert")
                .arg(&capture)
                .arg("--image")
                .arg(&elf)
                .arg("-o")
                .arg(&data);
            c
        },
    )?;
    rows.push((
        "perch convert, 1M samples (s, median of 5)".into(),
        format!("{convert:.2} ({:.2} M samples/s)", 1.0 / convert),
    ));
    if perf_found() {
        let vmlinux = format!("--vmlinux={}", elf.display());
        let script = median_timed(
            || {},
            || {
                let mut c = Command::new("perf");
                c.arg("script").arg("-i").arg(&data).arg(&vmlinux);
                c
            },
        )?;
        let report = median_timed(
            || {},
            || {
                let mut c = Command::new("perf");
                c.args(["report", "--stdio", "--no-children", "-g", "none", "-i"])
                    .arg(&data)
                    .arg(&vmlinux);
                c
            },
        )?;
        rows.push((
            "perf script, same file (s, median of 5)".into(),
            format!("{script:.2}"),
        ));
        rows.push((
            "perf report --stdio, same file (s, median of 5)".into(),
            format!("{report:.2}"),
        ));
        rows.push((
            "perch convert speed / perf script speed".into(),
            format!("{:.1}x", script / convert),
        ));
    } else {
        rows.push((
            "perf script / perf report".into(),
            "perf not installed (apt-get install linux-perf)".into(),
        ));
    }

    let width = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    println!("\n| {:<width$} | value |", "measurement");
    println!("| {} | --- |", "-".repeat(width));
    for (k, v) in &rows {
        println!("| {k:<width$} | {v} |");
    }
    Ok(0)
}
