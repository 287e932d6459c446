//! `cargo xtask run` (record a profile of the demo appliance, `appliances/demo`, with `perch`
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

/// perch's own line on how to open `output`: plain `perf report` when
/// perch put the runtime `elf` in perf's build-id cache, else with
/// `--vmlinux`.
fn open_hint(output: &Path, elf: &Path) -> String {
    use host_tool::buildid_cache::{cache_dir, holds_kernel, open_hint};
    let cached = std::fs::read(elf)
        .ok()
        .and_then(|b| kcore::elf::build_id(&b).map(<[u8]>::to_vec))
        .zip(cache_dir())
        .is_some_and(|(id, dir)| holds_kernel(&dir, &id));
    open_hint(output, (!cached).then_some(elf))
}

/// Records the demo with `perch record` and prints the top of the profile.
pub fn run(o: &RunOptions) -> Result<i32> {
    tools::require_tool(&tools::QEMU)?;
    let elf = kernel::build()?;
    let perch = kernel::build_perch()?;
    let manifest = kernel::demo_manifest()?;
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
    cmd.arg("--appliance").arg(&manifest);
    for key in o.append.split_whitespace() {
        cmd.args(["--boot-arg", key]);
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
        println!("\nxtask: {}", open_hint(&o.output, &elf));
    } else {
        println!(
            "\nxtask: perf is not installed (apt-get install --no-install-recommends linux-perf); perch's own summary instead:"
        );
        let s = Command::new(&perch).arg("stat").arg(&capture).status()?;
        if !s.success() {
            bail!("perch stat failed ({s})");
        }
    }
    Ok(0)
}

/// One `perch record --appliance MANIFEST` of the demo appliance (under
/// icount unless `realtime`); returns success and perch's stderr.
fn record_with(
    perch: &Path,
    elf: &Path,
    manifest: &Path,
    realtime: bool,
    args: &[&str],
    out: &Path,
) -> Result<(bool, String)> {
    let mut cmd = Command::new(perch);
    cmd.arg("record")
        .arg("--image")
        .arg(elf)
        .arg("--no-buildid-cache");
    if !realtime {
        cmd.arg("--icount");
    }
    let o = cmd
        .arg("-o")
        .arg(out)
        .arg("--save-capture")
        .arg(out.with_extension("capture"))
        .arg("--appliance")
        .arg(manifest)
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
    number_after(stderr, "perch: NMI path")
}

fn bytes_per_sample(stderr: &str) -> Option<f64> {
    let line = stderr
        .lines()
        .find(|l| l.contains("bytes/sample on the wire"))?;
    let head = line.split(" bytes/sample").next()?;
    head.rsplit(' ').next()?.parse().ok()
}

/// Bytes a second a 115200-baud serial line carries (10 bits a byte).
const LINE_115200: f64 = 11_520.0;

/// The achieved share of the requested NMI clock rate, in percent, from
/// the end-of-run line "NMI clock: N ticks in T s: X Hz achieved of Y Hz
/// requested (P%)".
fn clock_share(stderr: &str) -> Option<f64> {
    let line = stderr.lines().find(|l| l.contains("perch: NMI clock:"))?;
    let achieved = number_after(line, "s: ")?;
    let requested = number_after(line, "achieved of ")?;
    (requested > 0.0).then(|| 100.0 * achieved / requested)
}

fn lost(stderr: &str) -> Option<u64> {
    target_counter(stderr, 2)
}

/// Samples delivered, from the same line.
fn delivered(stderr: &str) -> Option<u64> {
    target_counter(stderr, 1)
}

/// Number `i` of "target counters: taken T = delivered D + lost L".
fn target_counter(stderr: &str, i: usize) -> Option<u64> {
    number_after(stderr, "target counters: taken")?;
    let line = stderr
        .lines()
        .find(|l| l.contains("target counters: taken"))?;
    let nums: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    nums.get(i).copied()
}

/// Wall and CPU time of one command.
#[derive(Clone, Copy)]
struct Timing {
    /// Seconds from start to exit.
    wall: f64,
    /// User plus system seconds of the command and its threads.
    cpu: f64,
}

/// User plus system seconds of this process's waited-for children so far
/// (`cutime` and `cstime` of `/proc/self/stat`, in USER_HZ = 100 ticks).
fn children_cpu() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) start with
    // the state, field 3; cutime and cstime are fields 16 and 17.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(13)?.parse::<u64>().ok()? + f.get(14)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

fn timed(cmd: &mut Command) -> Result<Timing> {
    // Dirty pages of earlier steps are written back first, so no command
    // pays for another's output.
    let _ = Command::new("sync").status();
    let cpu0 = children_cpu();
    let t = Instant::now();
    let s = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .stdin(Stdio::null())
        .status()
        .with_context(|| format!("running {cmd:?}"))?;
    let wall = t.elapsed().as_secs_f64();
    if !s.success() {
        bail!("{cmd:?} failed ({s})");
    }
    let cpu = match (cpu0, children_cpu()) {
        (Some(a), Some(b)) => b - a,
        _ => f64::NAN,
    };
    Ok(Timing { wall, cpu })
}

/// Rounds of the conversion comparison; the table gives medians.
const TIMED_RUNS: usize = 7;

/// The median of `v` (not empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Medians of wall and CPU time over timings of one command.
fn medians(t: &[Timing]) -> Timing {
    Timing {
        wall: median(t.iter().map(|t| t.wall).collect()),
        cpu: median(t.iter().map(|t| t.cpu).collect()),
    }
}

/// The drain's average cost per sample from the end-of-run line.
fn drain_cost(stderr: &str) -> Option<f64> {
    number_after(stderr, "perch: drain")
}

/// Bytes of `file` compressed by `cmd` (`zstd -1 -c`, `xz -9 -c`).
fn compressed_len(cmd: &[&str], file: &Path) -> Result<u64> {
    let o = Command::new(cmd[0])
        .args(&cmd[1..])
        .arg(file)
        .stderr(Stdio::null())
        .output()
        .with_context(|| format!("running {}", cmd[0]))?;
    if !o.status.success() {
        bail!("{} {} failed ({})", cmd.join(" "), file.display(), o.status);
    }
    Ok(o.stdout.len() as u64)
}

/// The sample-group rows: per sample set and group size, wire bytes per
/// sample against `zstd -1` and `xz -9` of the same perf.data, and the
/// drain's instructions per sample (under icount).
fn group_rows(
    perch: &Path,
    elf: &Path,
    manifest: &Path,
    dir: &Path,
) -> Result<Vec<(String, String)>> {
    tools::require_tool(&tools::ZSTD)?;
    tools::require_tool(&tools::XZ)?;
    let mut rows = Vec::new();
    for (set, label, extra) in [
        ("minimal", "IP, TID, TIME, CPU, PERIOD", &[][..]),
        ("default", "the default sample", &[][..]),
        (
            "default",
            "the default sample, -cpu max (SSE4.2: the frame CRC by the crc32 instruction)",
            &["--qemu-arg", "-cpu", "--qemu-arg", "max"][..],
        ),
        ("full", "+ REGS_INTR", &[][..]),
        ("default", "pmu=sim, PEBS + LBR (32)", &["--pmu", "sim"][..]),
    ] {
        let mut cells = Vec::new();
        let mut drain = Vec::new();
        for group in [0u32, 16, 64, 256] {
            let name = format!("group-{set}-{}-{group}.data", extra.len());
            let out = dir.join(name);
            let mut args = append_args(4000, 500, &format!("sample={set} wire_group={group}"));
            args.extend(extra.iter().map(|s| s.to_string()));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let (ok, err) = record_with(perch, elf, manifest, false, &args, &out)?;
            if !ok {
                bail!("recording {label} with wire_group={group} failed:\n{err}");
            }
            let bytes = bytes_per_sample(&err);
            let samples = delivered(&err).unwrap_or(0).max(1) as f64;
            let what = if group == 0 {
                "a frame per sample".to_string()
            } else {
                format!("G={group}")
            };
            let mut cell = format!(
                "{what}: {}",
                bytes.map_or("?".into(), |b| format!("{b:.1}"))
            );
            if group == 256 {
                let zstd = compressed_len(&["zstd", "-1", "-c", "-q"], &out)? as f64 / samples;
                let xz = compressed_len(&["xz", "-9", "-c"], &out)? as f64 / samples;
                if let Some(b) = bytes {
                    cell.push_str(&format!(
                        " (zstd -1 of the perf.data {zstd:.1}, ratio {:.2}; xz -9 {xz:.1}, ratio {:.2}; \
                         a 115200-baud line carries {:.0} samples/s)",
                        b / zstd,
                        b / xz,
                        LINE_115200 / b
                    ));
                }
            }
            cells.push(cell);
            drain.push(format!(
                "{what}: {}",
                drain_cost(&err).map_or("?".into(), |c| format!("{c:.0}"))
            ));
        }
        rows.push((
            format!("wire bytes per sample, sample groups (wire_group=G): {label}"),
            cells.join("; "),
        ));
        rows.push((
            format!(
                "drain instructions per sample (taking, coding, writing), under icount: {label}"
            ),
            drain.join("; "),
        ));
    }
    Ok(rows)
}

/// `perch record` args for a run with extra runtime command-line keys
/// (`--boot-arg`, appended to the command line perch builds).
fn append_args(freq: u64, duration_ms: u64, extra: &str) -> Vec<String> {
    let mut a = vec![
        "--freq".into(),
        freq.to_string(),
        "--duration".into(),
        format!("{}", duration_ms as f64 / 1000.0),
    ];
    for key in extra.split_whitespace() {
        a.push("--boot-arg".into());
        a.push(key.into());
    }
    a
}

/// Runs the measurements and prints one table.
pub fn bench() -> Result<i32> {
    tools::require_tool(&tools::QEMU)?;
    let elf = kernel::build()?;
    let perch = kernel::build_perch()?;
    let manifest = kernel::demo_manifest()?;
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
        let (ok, err) = record_with(&perch, &elf, &manifest, false, &args, &out)?;
        if !ok {
            bail!("recording with sample={set} failed:\n{err}");
        }
        let cost = nmi_cost(&err).map_or("?".into(), |c| format!("{c:.0}"));
        let bytes = bytes_per_sample(&err).map_or("?".into(), |b| format!("{b:.1}"));
        rows.push((format!("NMI path, instructions per sample: {label}"), cost));
        rows.push((format!("wire bytes per sample: {label}"), bytes));
    }

    rows.extend(group_rows(&perch, &elf, &manifest, &dir)?);

    // Four CPUs sampling at once (the demo's four programs spread over
    // them, each CPU's NMIs into its own ring, one drain), in real time:
    // under -icount QEMU runs the CPUs one after another and the TSC counts
    // every CPU's instructions, so neither the per-sample cost nor a rate
    // means what it does on one CPU there.
    let mut best = None;
    let rates = [1_000u64, 2_000, 4_000, 8_000, 16_000, 32_000];
    for &freq in &rates {
        let out = dir.join(format!("smp-rate-{freq}.data"));
        let mut args = append_args(freq, 1000, "max_rate=0 cpu_pct=0");
        args.extend(["--cpus".into(), "4".into()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, err) = record_with(&perch, &elf, &manifest, true, &args, &out)?;
        match (ok, lost(&err), delivered(&err)) {
            (true, Some(0), Some(d)) => best = Some((freq, d)),
            _ => break,
        }
    }
    let tried: Vec<String> = rates.iter().map(u64::to_string).collect();
    rows.push((
        format!(
            "drain with 4 CPUs sampling at once, in real time over the virtio console: \
             highest NMI rate with no loss (max_rate=0 cpu_pct=0) and the samples \
             delivered in its 1 s; Hz tried: {}",
            tried.join(" ")
        ),
        best.map_or("none".into(), |(f, d)| format!("{f} Hz: {d} samples")),
    ));

    for (realtime, transport, rates, what) in [
        (
            false,
            "uart",
            &[1_000u64, 4_000, 10_000, 20_000, 50_000, 100_000, 200_000][..],
            "under icount over the 16550 (UART bytes cost one instruction each)",
        ),
        (
            true,
            "uart",
            &[1_000u64, 2_000, 4_000, 8_000, 10_000, 16_000, 32_000][..],
            "in real time over the 16550 (one host write per byte)",
        ),
        (
            true,
            "virtio",
            &[1_000u64, 2_000, 4_000, 8_000, 10_000, 16_000, 32_000][..],
            "in real time over the virtio console (one host write per page)",
        ),
    ] {
        let mut best = None;
        for &freq in rates {
            let out = dir.join(format!("rate-{freq}-{realtime}-{transport}.data"));
            // Throttling off: the row measures the ring and the line, not
            // the max_rate limit (100,000/s by default) or the CPU budget.
            let mut args = append_args(freq, 500, "max_rate=0 cpu_pct=0");
            args.extend(["--transport".into(), transport.into()]);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let (ok, err) = record_with(&perch, &elf, &manifest, realtime, &args, &out)?;
            match (ok, lost(&err)) {
                (true, Some(0)) => best = Some(freq),
                _ => break,
            }
        }
        let tried: Vec<String> = rates.iter().map(u64::to_string).collect();
        rows.push((
            format!(
                "highest NMI rate with no loss (max_rate=0 cpu_pct=0), {what}; Hz tried: {}",
                tried.join(" ")
            ),
            best.map_or("none".into(), |f| f.to_string()),
        ));
    }

    // The NMI clock in real time: ticks over the run's seconds against the
    // request, per source (the end-of-run "NMI clock:" line).
    for clock in ["pit", "hpet"] {
        let mut cells = Vec::new();
        for freq in [1_000u64, 4_000, 10_000, 16_000, 32_000] {
            let out = dir.join(format!("clock-{clock}-{freq}.data"));
            let args = append_args(freq, 1000, &format!("clock={clock} max_rate=0 cpu_pct=0"));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let (ok, err) = record_with(&perch, &elf, &manifest, true, &args, &out)?;
            let achieved = ok.then(|| clock_share(&err)).flatten();
            cells.push(format!(
                "{}k: {}",
                freq / 1000,
                achieved.map_or("?".into(), |p| format!("{p:.1}%"))
            ));
        }
        rows.push((
            format!("NMI clock in real time over virtio, achieved / requested rate, clock={clock}"),
            cells.join(", "),
        ));
    }

    // A server profiled under load from the host.
    rows.extend(http_rows(&perch, &elf, &dir)?);

    // What a bare-metal 115200-baud line (11,520 B/s) carries.
    for (key, value) in rows.clone() {
        let Some(label) = key.strip_prefix("wire bytes per sample: ") else {
            continue;
        };
        if let Ok(b) = value.parse::<f64>() {
            rows.push((
                format!(
                    "samples/s a 115200-baud line sustains (11,520 B/s / bytes per sample): {label}"
                ),
                format!("{:.0}", LINE_115200 / b),
            ));
        }
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
    // Rounds alternate the commands, so a change in the machine's load
    // weighs on all of them alike. Each conversion writes a new file:
    // removing the previous one (ext4 freeing 250 MB of blocks) is not part
    // of converting.
    let perf = perf_found();
    let vmlinux = format!("--vmlinux={}", elf.display());
    let (mut convert, mut script, mut report) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..TIMED_RUNS {
        let _ = std::fs::remove_file(&data);
        convert.push(timed(
            Command::new(&perch)
                .arg("convert")
                .arg(&capture)
                .arg("--image")
                .arg(&elf)
                .arg("-o")
                .arg(&data),
        )?);
        if perf {
            script.push(timed(
                Command::new("perf")
                    .arg("script")
                    .arg("-i")
                    .arg(&data)
                    .arg(&vmlinux),
            )?);
            report.push(timed(
                Command::new("perf")
                    .args(["report", "--stdio", "--no-children", "-g", "none", "-i"])
                    .arg(&data)
                    .arg(&vmlinux),
            )?);
        }
    }
    let convert = medians(&convert);
    let runs = format!("medians of {TIMED_RUNS}, wall / CPU s");
    rows.push((
        format!("perch convert, 1M samples ({runs})"),
        format!(
            "{:.2} / {:.2} ({:.2} M samples/s)",
            convert.wall,
            convert.cpu,
            1.0 / convert.wall
        ),
    ));
    if perf {
        let (script, report) = (medians(&script), medians(&report));
        rows.push((
            format!("perf script, same file ({runs})"),
            format!("{:.2} / {:.2}", script.wall, script.cpu),
        ));
        rows.push((
            format!("perf report --stdio, same file ({runs})"),
            format!("{:.2} / {:.2}", report.wall, report.cpu),
        ));
        rows.push((
            "perch convert speed / perf script speed, by wall / by CPU time".into(),
            format!(
                "{:.1}x / {:.1}x",
                script.wall / convert.wall,
                script.cpu / convert.cpu
            ),
        ));
    } else {
        rows.push((
            "perf script / perf report".into(),
            "perf not installed (apt-get install --no-install-recommends linux-perf)".into(),
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

/// The host port the HTTP bench forwards to the appliance's port 80.
const HTTP_BENCH_PORT: u16 = 18931;
/// How long wrk drives the server, in seconds.
const HTTP_BENCH_SECONDS: u32 = 5;

/// `tests/programs/c/httpd.c` in the appliance under `perch record --net`,
/// driven from the host by wrk (2 threads, 8 keep-alive connections, for
/// [`HTTP_BENCH_SECONDS`]): requests per second, and the profile's sample
/// rate over the run. Measurements, not thresholds; a row says why when a
/// tool is missing.
fn http_rows(perch: &Path, elf: &Path, dir: &Path) -> Result<Vec<(String, String)>> {
    let label = format!(
        "HTTP server (tests/programs/c/httpd.c, one thread, epoll) under wrk -t2 -c8 -d{HTTP_BENCH_SECONDS}s, keep-alive, perch record --net"
    );
    if !found("wrk") {
        return Ok(vec![(
            format!("{label}: requests/s"),
            "wrk not installed (apt-get install wrk)".into(),
        )]);
    }
    let exe = dir.join("httpd");
    let src = project_root().join("tests/programs/c/httpd.c");
    let s = Command::new("gcc")
        .args(["-static", "-O2", "-fno-omit-frame-pointer", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .context("running gcc")?;
    if !s.success() {
        bail!("building {} failed ({s})", src.display());
    }
    let out = dir.join("http.data");
    let child = Command::new(perch)
        .arg("record")
        .arg("--image")
        .arg(elf)
        .args(["--no-buildid-cache", "--net", "--forward"])
        .arg(format!("tcp:{HTTP_BENCH_PORT}:80"))
        .arg("-o")
        .arg(&out)
        .arg("--")
        .arg(&exe)
        .arg("80")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running perch record")?;
    let ready = wait_for_http(HTTP_BENCH_PORT, std::time::Duration::from_secs(60));
    let wrk = ready.then(|| {
        Command::new("wrk")
            .args(["-t2", "-c8"])
            .arg(format!("-d{HTTP_BENCH_SECONDS}s"))
            .arg(format!("http://127.0.0.1:{HTTP_BENCH_PORT}/work?n=64"))
            .stdin(Stdio::null())
            .output()
    });
    // Ends the server (and so the recording) whatever happened.
    let _ = http_get(HTTP_BENCH_PORT, "/quit");
    let o = child
        .wait_with_output()
        .context("waiting for perch record")?;
    let err = String::from_utf8_lossy(&o.stderr);
    if !ready {
        let _ = std::fs::remove_file(&out);
        bail!("the HTTP bench server never answered:\n{err}");
    }
    let text = match wrk {
        Some(Ok(w)) => String::from_utf8_lossy(&w.stdout).into_owned(),
        _ => String::new(),
    };
    let rps = number_after(&text, "Requests/sec:").map_or("?".into(), |r| format!("{r:.0}"));
    let errors = if text.contains("Socket errors") || text.contains("Non-2xx") {
        " (with errors: see wrk's output)"
    } else {
        ""
    };
    // perch's summary: `perch: N samples (R/s), ...`.
    let rate = err
        .lines()
        .filter_map(|l| l.strip_prefix("perch: "))
        .find(|l| l.contains(" samples (") && l.contains("/s)"))
        .and_then(|l| number_after(l, "samples ("))
        .map_or("?".into(), |r| format!("{r:.0}"));
    Ok(vec![
        (format!("{label}: requests/s"), format!("{rps}{errors}")),
        (format!("{label}: samples/s over the recording"), rate),
    ])
}

/// Whether `program` is on the PATH.
fn found(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// One `GET path` on 127.0.0.1:`port`: the response's head and body, if
/// one came (QEMU's forward accepts a connection before the appliance
/// listens, so only an answer says the server is there).
fn http_get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s =
        std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: perch\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    (!text.is_empty()).then_some(text)
}

/// Waits until the server on `port` answers `GET /` with 200.
fn wait_for_http(port: u16, limit: std::time::Duration) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if http_get(port, "/").is_some_and(|t| t.starts_with("HTTP/1.1 200")) {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_counts_the_childs_cpu_time() {
        // A child that spins for about 0.3 s of CPU time (and sleeps 0.2 s,
        // which counts as wall time only).
        let t = timed(Command::new("sh").args([
            "-c",
            "sleep 0.2; i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done",
        ]))
        .unwrap();
        assert!(t.cpu >= 0.05, "CPU time {} s", t.cpu);
        assert!(
            t.wall >= 0.2 + t.cpu * 0.5,
            "wall {} s, CPU {} s",
            t.wall,
            t.cpu
        );
        assert!(timed(&mut Command::new("false")).is_err());
    }

    #[test]
    fn the_clock_share_comes_from_the_end_of_run_line() {
        let line = "target: INFO perch: NMI clock: 4116 ticks in 1.003 s: 4099.723 Hz \
                    achieved of 10026.771 Hz requested (40.8%)";
        let p = clock_share(line).unwrap();
        assert!((p - 40.888).abs() < 0.01, "{p}");
        assert_eq!(clock_share("no such line"), None);
    }

    #[test]
    fn medians_take_the_middle_value_of_each() {
        let t = |wall, cpu| Timing { wall, cpu };
        let m = medians(&[t(3.0, 0.1), t(1.0, 0.3), t(2.0, 0.2)]);
        assert_eq!((m.wall, m.cpu), (2.0, 0.2));
    }
}
