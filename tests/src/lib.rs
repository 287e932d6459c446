//! Helpers for Perch's QEMU end-to-end tests (in `tests/tests/`): build the
//! runtime once, boot it with a command line (and a boot archive) under a
//! hard timeout, and collect its serial output and exit status. The test
//! programs, their native runs and the console parser are in [`programs`].
#![forbid(unsafe_code)]

pub mod programs;

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// QEMU status for the runtime's pass code (0x10).
pub const STATUS_PASS: i32 = 33;
/// QEMU status for the runtime's fail code (0x11).
pub const STATUS_FAIL: i32 = 35;
/// QEMU status for the runtime's crash code (0x12).
pub const STATUS_CRASH: i32 = 37;

/// The repository root.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives one level below the workspace root")
        .to_path_buf()
}

/// Builds the runtime ELF (once per test binary) and returns its path.
pub fn runtime_elf() -> PathBuf {
    static ELF: OnceLock<PathBuf> = OnceLock::new();
    ELF.get_or_init(|| {
        let root = workspace_root();
        let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(&root)
            .args([
                "build",
                "--package",
                "runtime",
                "--target",
                "x86_64-unknown-none",
                "--release",
                // Thin LTO: the sample drain crosses crates (runtime, sampler,
                // crc) on every sample.
                "--config",
                "profile.release.lto=\"thin\"",
            ])
            .env("DEFMT_LOG", "info")
            .status()
            .expect("running cargo to build the runtime");
        assert!(status.success(), "building the runtime failed: {status}");
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target"));
        target.join("x86_64-unknown-none/release/perch-runtime")
    })
    .clone()
}

/// The end of one boot.
#[derive(Debug)]
pub struct Boot {
    /// QEMU's exit status (`None` if killed by a signal or the timeout).
    pub status: Option<i32>,
    /// Whether the timeout killed QEMU.
    pub timed_out: bool,
    /// Everything written to the serial line (lossily decoded).
    pub output: String,
    /// Everything written to the serial line, as bytes.
    pub bytes: Vec<u8>,
}

impl Boot {
    /// The last non-empty line.
    pub fn last_line(&self) -> &str {
        self.output
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
    }
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Boots the runtime with `cmdline` (`-kernel`, PVH, `-cpu max`) and waits at most `timeout`.
pub fn boot(cmdline: &str, timeout: Duration) -> Boot {
    boot_with(cmdline, timeout, &["-cpu", "max", "-m", "256M"])
}

/// Boots the runtime with `archive` as its boot archive (`-initrd`, the PVH
/// module) and 1 GiB of memory (`-cpu max`), and waits at most `timeout`.
pub fn boot_archive(cmdline: &str, archive: &std::path::Path, timeout: Duration) -> Boot {
    boot_archive_on(Cpu::Max, cmdline, archive, timeout, &[])
}

/// The CPU model QEMU emulates (`-cpu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cpu {
    /// `-cpu max`: under TCG every feature QEMU can emulate, among them NX,
    /// SMEP and SMAP, so the runtime's protections are on.
    Max,
    /// `-cpu qemu64`, QEMU's default model: NX, but no SMEP or SMAP (the
    /// runtime runs without them).
    Qemu64,
}

impl Cpu {
    /// The `-cpu` argument.
    pub fn model(self) -> &'static str {
        match self {
            Cpu::Max => "max",
            Cpu::Qemu64 => "qemu64",
        }
    }
}

/// [`boot_archive`] on CPU model `cpu`, with `extra` QEMU arguments (e.g. `-icount`).
pub fn boot_archive_on(
    cpu: Cpu,
    cmdline: &str,
    archive: &std::path::Path,
    timeout: Duration,
    extra: &[&str],
) -> Boot {
    let archive = archive.to_str().expect("the archive path is UTF-8");
    let mut args = vec!["-cpu", cpu.model(), "-m", "1G", "-initrd", archive];
    args.extend_from_slice(extra);
    boot_with(cmdline, timeout, &args)
}

/// Boots under `-icount shift=0,sleep=off`: instruction-exact, repeatable timing.
pub fn boot_icount(cmdline: &str, timeout: Duration) -> Boot {
    boot_with(
        cmdline,
        timeout,
        &["-icount", "shift=0,sleep=off", "-m", "256M"],
    )
}

fn boot_with(cmdline: &str, timeout: Duration, extra: &[&str]) -> Boot {
    let elf = runtime_elf();
    let child = Command::new("qemu-system-x86_64")
        .args([
            "-nodefaults",
            "-no-reboot",
            "-display",
            "none",
            "-machine",
            "pc",
            "-serial",
            "stdio",
            "-device",
            "isa-debug-exit,iobase=0xf4,iosize=0x04",
            "-kernel",
        ])
        .arg(&elf)
        .args(["-append", cmdline])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn();
    let child = match child {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "qemu-system-x86_64 not found: install it with `sudo apt-get install --no-install-recommends qemu-system-x86`"
        ),
        Err(e) => panic!("starting QEMU: {e}"),
    };
    let mut child = KillOnDrop(child);
    let mut stdout = child.0.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stdout.read_to_end(&mut buf);
        buf
    });
    let start = Instant::now();
    let (status, timed_out) = loop {
        if let Some(s) = child.0.try_wait().expect("waiting for QEMU") {
            break (s.code(), false);
        }
        if start.elapsed() > timeout {
            let _ = child.0.kill();
            let _ = child.0.wait();
            break (None, true);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(child);
    let bytes = reader.join().unwrap_or_default();
    Boot {
        status,
        timed_out,
        output: String::from_utf8_lossy(&bytes).into_owned(),
        bytes,
    }
}

/// Builds the host tool `perch` (once per test binary) and returns its path.
pub fn perch_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let root = workspace_root();
        let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(&root)
            .args(["build", "--package", "host-tool", "--bin", "perch"])
            .status()
            .expect("running cargo to build perch");
        assert!(status.success(), "building perch failed: {status}");
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target"));
        target.join("debug/perch")
    })
    .clone()
}

/// Whether `tool --version` runs (QEMU, perf).
pub fn have_tool(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The register patterns `demoregs` holds while it spins.
pub const DEMOREGS_PATTERNS: [(&str, u64); 14] = [
    ("AX", 0x1111_1111_1111_1111),
    ("BX", 0x2222_2222_2222_2222),
    ("DX", 0x4444_4444_4444_4444),
    ("SI", 0x5555_5555_5555_5555),
    ("DI", 0x6666_6666_6666_6666),
    ("BP", 0x7777_7777_7777_7777),
    ("R8", 0x8888_8888_8888_8888),
    ("R9", 0x9999_9999_9999_9999),
    ("R10", 0xaaaa_aaaa_aaaa_aaaa),
    ("R11", 0xbbbb_bbbb_bbbb_bbbb),
    ("R12", 0xcccc_cccc_cccc_cccc),
    ("R13", 0xdddd_dddd_dddd_dddd),
    ("R14", 0xeeee_eeee_eeee_eeee),
    ("R15", 0xf0f0_f0f0_f0f0_f0f0),
];

/// One `perch record` run under icount, with its perf.data and
/// saved capture in a temporary directory that lives as long as it does.
pub struct Recording {
    _dir: tempfile::TempDir,
    /// The perf.data written.
    pub data: PathBuf,
    /// The raw stream saved with `--save-capture`.
    pub capture: PathBuf,
    /// perch's exit status.
    pub status: Option<i32>,
    /// perch's stderr (the target's log included).
    pub stderr: String,
    /// perch's stdout (the programs' output).
    pub stdout: String,
}

/// Runs `perch record --icount` on the runtime image with `args` added.
pub fn record(args: &[&str]) -> Recording {
    record_for(240, args)
}

/// [`record`] with perch's `--timeout` at `timeout_s` seconds.
pub fn record_for(timeout_s: u64, args: &[&str]) -> Recording {
    record_clocked(true, timeout_s, args)
}

/// [`record_for`] in real time (no `--icount`): what a run on QEMU's
/// network needs, whose host side keeps the host's time.
pub fn record_realtime(timeout_s: u64, args: &[&str]) -> Recording {
    record_clocked(false, timeout_s, args)
}

fn record_clocked(icount: bool, timeout_s: u64, args: &[&str]) -> Recording {
    let dir = tempfile::tempdir().expect("temporary directory");
    let data = dir.path().join("perf.data");
    let capture = dir.path().join("capture.bin");
    let out = Command::new(perch_bin())
        .arg("record")
        .arg("--image")
        .arg(runtime_elf())
        .args(icount.then_some("--icount"))
        .arg("-o")
        .arg(&data)
        .arg("--save-capture")
        .arg(&capture)
        .args(["--timeout", &timeout_s.to_string()])
        .args(args)
        // perch adds the image and the programs to perf's build-id cache:
        // a private one per recording, not the user's ~/.debug.
        .env("PERF_BUILDID_DIR", dir.path().join("buildid"))
        .stdin(Stdio::null())
        .output()
        .expect("running perch record");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    // On a clean line every task's samples come before its end, in every
    // recording (threads end in many of them).
    assert!(
        !stderr.contains("after their task's end"),
        "samples came after their task's TaskExit:\n{stderr}"
    );
    Recording {
        _dir: dir,
        data,
        capture,
        status: out.status.code(),
        stderr,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
    }
}

/// Runs `perch record --icount --appliance appliances/demo/appliance.toml` (the demo
/// appliance, built first: see [`programs::demo_manifest`]) with `args` added.
pub fn record_demo(args: &[&str]) -> Recording {
    let manifest = programs::demo_manifest();
    let manifest = manifest.to_str().expect("a UTF-8 manifest path").to_owned();
    let mut all: Vec<&str> = vec!["--appliance", &manifest];
    all.extend_from_slice(args);
    record(&all)
}

/// Runs `perch record --icount OPTS -- hotspots 300` (the glibc test
/// program of [`programs`]) without checking its exit status.
pub fn record_hotspots(opts: &[&str]) -> Recording {
    let exe = programs::c_program("hotspots", programs::CBuild::Glibc);
    let exe = exe.to_str().expect("a UTF-8 path").to_owned();
    let mut all = opts.to_vec();
    all.extend_from_slice(&["--", &exe, "300"]);
    record(&all)
}

/// Runs perf on the recording (with the runtime as vmlinux); it must succeed
/// and print nothing on stderr but lines containing one of `allowed`.
pub fn run_perf(rec: &Recording, args: &[&str], allowed: &[&str]) -> String {
    let out = Command::new("perf")
        .args(args)
        .arg("-i")
        .arg(&rec.data)
        .arg(format!("--vmlinux={}", runtime_elf().display()))
        .stdin(Stdio::null())
        .output()
        .expect("running perf");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "perf {args:?} failed: {stderr}");
    let unexpected: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty() && !allowed.iter().any(|a| l.contains(a)))
        .collect();
    assert!(
        unexpected.is_empty(),
        "perf {args:?} printed warnings: {unexpected:?}"
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether QEMU is installed; says so when it is not (the test then skips).
pub fn qemu_present() -> bool {
    if have_tool("qemu-system-x86_64") {
        return true;
    }
    eprintln!(
        "SKIPPED: qemu-system-x86_64 is not installed (apt-get install --no-install-recommends qemu-system-x86)"
    );
    false
}

/// Whether QEMU and perf are both installed; says which is missing.
pub fn qemu_and_perf_present() -> bool {
    qemu_present() && perf_present()
}

/// Whether perf is installed; says so when it is not (the test then skips).
pub fn perf_present() -> bool {
    if have_tool("perf") {
        return true;
    }
    eprintln!(
        "SKIPPED: perf is not installed (apt-get install --no-install-recommends linux-perf)"
    );
    false
}

/// The numbers on the `perch stat` line of `capture` that starts with `prefix`.
pub fn stat_numbers(capture: &std::path::Path, prefix: &str) -> Vec<u64> {
    let out = Command::new(perch_bin())
        .arg("stat")
        .arg(capture)
        .output()
        .expect("running perch stat");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no `{prefix}` line in perch stat:\n{text}"));
    line.split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect()
}
