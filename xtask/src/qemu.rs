//! Running the runtime in QEMU: fixed machine arguments, a hard timeout,
//! stdin closed, the serial line streamed to our stdout, and a guard that
//! kills QEMU when the runner returns, panics or dies.

use crate::tools;
use anyhow::{Context, Result};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// QEMU exit statuses of the runtime's isa-debug-exit codes (0x10, 0x11, 0x12).
pub const STATUS_PASS: i32 = 33;
/// See [`STATUS_PASS`].
pub const STATUS_FAIL: i32 = 35;
/// See [`STATUS_PASS`].
pub const STATUS_CRASH: i32 = 37;

/// What to boot.
pub enum Boot {
    /// `-kernel ELF -append CMDLINE` (PVH).
    Kernel {
        /// The runtime ELF.
        elf: PathBuf,
        /// Kernel command line.
        cmdline: String,
        /// The boot archive, passed as the PVH module (`-initrd`).
        initrd: Option<PathBuf>,
    },
    /// `-cdrom ISO` (multiboot2 through GRUB).
    Iso {
        /// The ISO.
        iso: PathBuf,
        /// Boot with OVMF on q35 instead of SeaBIOS on pc.
        uefi: bool,
    },
}

/// One QEMU run.
pub struct Config {
    /// What to boot.
    pub boot: Boot,
    /// `-icount shift=0,sleep=off`.
    pub icount: bool,
    /// The `-cpu` model; `None`: `max` without icount, QEMU's default
    /// (`qemu64`) with it.
    pub cpu: Option<String>,
    /// The `-machine`; `None`: `pc`, or `q35` for the UEFI ISO.
    pub machine: Option<String>,
    /// CPUs (`-smp N`); 1 gives no `-smp`.
    pub cpus: u32,
    /// Hard timeout.
    pub timeout: Duration,
}

/// How QEMU ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The runtime reported a pass.
    Pass,
    /// The runtime reported a failure.
    Fail,
    /// The runtime crashed (exception or panic in ring 0).
    Crash,
    /// The hard timeout killed QEMU.
    Timeout,
    /// Anything else (QEMU error, triple fault, signal).
    Unknown(Option<i32>),
}

/// The result of a run.
pub struct Outcome {
    /// How it ended.
    pub exit: Exit,
    /// Every serial line.
    pub lines: Vec<String>,
    /// Wall time.
    pub elapsed: Duration,
}

impl Outcome {
    /// A one-line description of the end.
    pub fn verdict(&self) -> String {
        let t = format!("{:.1}s", self.elapsed.as_secs_f64());
        match self.exit {
            Exit::Pass => format!("pass (status {STATUS_PASS}) after {t}"),
            Exit::Fail => format!("fail (status {STATUS_FAIL}) after {t}"),
            Exit::Crash => format!("runtime crashed (status {STATUS_CRASH}) after {t}"),
            Exit::Timeout => format!("killed by the {t} timeout"),
            Exit::Unknown(Some(0)) => {
                format!("status 0 after {t}: a triple fault or reset (crashed/unknown)")
            }
            Exit::Unknown(Some(s)) => format!("status {s} after {t} (crashed/unknown)"),
            Exit::Unknown(None) => format!("killed by a signal after {t} (crashed/unknown)"),
        }
    }

    /// `(passed, failed)` from the last non-empty line, if it is a summary.
    pub fn selftest_summary(&self) -> Option<(u32, u32)> {
        let last = self.lines.iter().rev().find(|l| !l.trim().is_empty())?;
        parse_summary(last.trim())
    }
}

/// Parses `N passed, M failed`.
pub fn parse_summary(line: &str) -> Option<(u32, u32)> {
    let (p, rest) = line.split_once(" passed, ")?;
    let f = rest.strip_suffix(" failed")?;
    Some((p.parse().ok()?, f.parse().ok()?))
}

/// Maps a QEMU exit status to an [`Exit`].
pub fn classify(status: Option<i32>) -> Exit {
    match status {
        Some(STATUS_PASS) => Exit::Pass,
        Some(STATUS_FAIL) => Exit::Fail,
        Some(STATUS_CRASH) => Exit::Crash,
        other => Exit::Unknown(other),
    }
}

/// The QEMU arguments for `cfg`.
pub fn args(cfg: &Config) -> Vec<String> {
    let mut a: Vec<String> = [
        "-nodefaults",
        "-no-reboot",
        "-display",
        "none",
        "-m",
        "256M",
        "-serial",
        "stdio",
        "-device",
        "isa-debug-exit,iobase=0xf4,iosize=0x04",
    ]
    .map(String::from)
    .to_vec();
    let machine = match (&cfg.machine, &cfg.boot) {
        (Some(m), _) => m.as_str(),
        (None, Boot::Iso { uefi: true, .. }) => "q35",
        (None, _) => "pc",
    };
    a.extend(["-machine".into(), machine.into()]);
    if cfg.cpus > 1 {
        a.extend(["-smp".into(), cfg.cpus.to_string()]);
    }
    // `max` exposes SMEP/SMAP and NX under TCG; with icount keep the
    // default model (the runtime adapts to what CPUID reports) unless a
    // model is asked for.
    match &cfg.cpu {
        Some(model) => a.extend(["-cpu".into(), model.clone()]),
        None if !cfg.icount => a.extend(["-cpu".into(), "max".into()]),
        None => {}
    }
    match &cfg.boot {
        Boot::Kernel {
            elf,
            cmdline,
            initrd,
        } => {
            a.extend(["-kernel".into(), elf.display().to_string()]);
            a.extend(["-append".into(), cmdline.clone()]);
            if let Some(i) = initrd {
                a.extend(["-initrd".into(), i.display().to_string()]);
            }
        }
        Boot::Iso { iso, uefi } => {
            if *uefi {
                a.extend(["-bios".into(), tools::OVMF_PATH.into()]);
            }
            a.extend([
                "-cdrom".into(),
                iso.display().to_string(),
                "-boot".into(),
                "d".into(),
            ]);
        }
    }
    if cfg.icount {
        a.extend(["-icount".into(), "shift=0,sleep=off".into()]);
    }
    a
}

/// Kills and reaps QEMU when dropped.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// util-linux's `setpriv` (Debian: essential).
const SETPRIV: &str = "/usr/bin/setpriv";

/// Boots QEMU as `cfg` says, streaming its serial output, and waits for it.
pub fn run(cfg: &Config) -> Result<Outcome> {
    tools::require_tool(&tools::QEMU)?;
    if matches!(cfg.boot, Boot::Iso { uefi: true, .. }) {
        tools::require(tools::OVMF_PATH, &["ovmf"])?;
    }
    let args = args(cfg);
    println!("xtask: qemu-system-x86_64 {}", args.join(" "));
    // QEMU gets SIGKILL if xtask dies (util-linux's setpriv sets the
    // parent-death signal and execs it), so a killed test run leaves no
    // QEMU behind; without setpriv the kill guard below still covers every
    // ordinary exit.
    let mut cmd = if std::path::Path::new(SETPRIV).exists() {
        let mut c = Command::new(SETPRIV);
        c.args(["--pdeathsig", "KILL", "--", tools::QEMU.program]);
        c
    } else {
        Command::new(tools::QEMU.program)
    };
    cmd.args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let start = Instant::now();
    let mut child = KillOnDrop(cmd.spawn().context("starting qemu-system-x86_64")?);
    let stdout = child.0.stdout.take().context("QEMU stdout")?;
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut buf = Vec::new();
        while r.read_until(b'\n', &mut buf).is_ok_and(|n| n > 0) {
            let line = String::from_utf8_lossy(&buf)
                .trim_end_matches(['\n', '\r'])
                .to_string();
            println!("{line}");
            if tx.send(line).is_err() {
                break;
            }
            buf.clear();
        }
    });
    let exit = loop {
        if let Some(status) = child.0.try_wait()? {
            break classify(status.code());
        }
        if start.elapsed() > cfg.timeout {
            let _ = child.0.kill();
            let _ = child.0.wait();
            break Exit::Timeout;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(child);
    let _ = reader.join();
    Ok(Outcome {
        exit,
        lines: rx.try_iter().collect(),
        elapsed: start.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_lines() {
        assert_eq!(parse_summary("24 passed, 0 failed"), Some((24, 0)));
        assert_eq!(parse_summary("3 passed, 2 failed"), Some((3, 2)));
        assert_eq!(parse_summary("selftest: x ... ok"), None);
        assert_eq!(parse_summary("passed, 0 failed"), None);
    }

    #[test]
    fn statuses() {
        assert_eq!(classify(Some(33)), Exit::Pass);
        assert_eq!(classify(Some(35)), Exit::Fail);
        assert_eq!(classify(Some(37)), Exit::Crash);
        assert_eq!(classify(Some(0)), Exit::Unknown(Some(0)));
        assert_eq!(classify(Some(1)), Exit::Unknown(Some(1)));
        assert_eq!(classify(None), Exit::Unknown(None));
    }

    /// A `-kernel` run with everything else at its default.
    fn kernel_run() -> Config {
        Config {
            boot: Boot::Kernel {
                elf: "k".into(),
                cmdline: String::new(),
                initrd: None,
            },
            icount: false,
            cpu: None,
            machine: None,
            cpus: 1,
            timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn cpus_give_smp_only_past_one() {
        let with = |cpus| {
            args(&Config {
                cpus,
                ..kernel_run()
            })
            .join(" ")
        };
        assert!(with(4).contains("-machine pc -smp 4 "));
        assert!(!with(1).contains("-smp"));
    }

    #[test]
    fn machine_is_chosen_or_follows_the_boot() {
        let kernel = |machine: Option<&str>| {
            args(&Config {
                machine: machine.map(String::from),
                ..kernel_run()
            })
            .join(" ")
        };
        assert!(kernel(None).contains("-machine pc"));
        let m = kernel(Some("microvm"));
        assert!(m.contains("-machine microvm") && !m.contains("-machine pc"));
    }

    #[test]
    fn icount_and_uefi_arguments() {
        let cfg = Config {
            boot: Boot::Iso {
                iso: "x.iso".into(),
                uefi: true,
            },
            icount: true,
            cpu: None,
            machine: None,
            cpus: 1,
            timeout: Duration::from_secs(1),
        };
        let a = args(&cfg).join(" ");
        assert!(!a.contains("-cpu"));
        assert!(a.contains("-machine q35"));
        assert!(a.contains("-bios /usr/share/qemu/OVMF.fd"));
        assert!(a.contains("-icount shift=0,sleep=off"));
        assert!(a.contains("isa-debug-exit,iobase=0xf4,iosize=0x04"));
        assert!(a.contains("-no-reboot"));
    }

    #[test]
    fn cpu_models() {
        let kernel = |icount, cpu: Option<&str>| {
            args(&Config {
                icount,
                cpu: cpu.map(String::from),
                ..kernel_run()
            })
            .join(" ")
        };
        assert!(kernel(false, None).contains("-cpu max"));
        assert!(!kernel(true, None).contains("-cpu"));
        let a = kernel(true, Some("max"));
        assert!(a.contains("-cpu max") && a.contains("-icount shift=0,sleep=off"));
        assert_eq!(kernel(false, Some("qemu64")).matches("-cpu").count(), 1);
    }
}
