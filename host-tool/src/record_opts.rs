//! `perch record`'s command-line surface and its mapping onto the runtime
//! command line (`kcore::cmdline`): the arguments, the checks that refuse a
//! combination before anything boots, and the line QEMU passes to the
//! runtime. Commands that record (`perch top`) reuse [`RecordArgs`].

use std::path::PathBuf;
use std::time::Duration;

use clap::ValueEnum;

use crate::error::HostError;

/// The event source (`--pmu`, runtime `pmu=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PmuMode {
    /// Use the PMU when one works, else the NMI clock.
    Auto,
    /// The simulated PMU (marked as simulated in perf.data).
    Sim,
    /// The NMI clock (cpu-clock) only.
    Off,
}

/// `perch record`'s arguments (also the base of commands that record,
/// such as `perch top`).
#[derive(clap::Args, Clone, Debug)]
pub struct RecordArgs {
    /// The appliance image (runtime ELF) to boot and symbolise with.
    #[arg(long)]
    pub image: Option<PathBuf>,
    /// An appliance manifest (TOML, docs/programs.md): the programs to run,
    /// their argv, env and data files. With --serial or --input it names
    /// the programs' host files for their symbols.
    #[arg(long, value_name = "FILE.toml", conflicts_with = "command")]
    pub appliance: Option<PathBuf>,
    /// A data file for the program: HOST, or HOST:GUEST (the path the
    /// program opens; default: HOST's file name, in `/`). Repeatable.
    #[arg(long, value_name = "HOST[:GUEST]", requires = "command")]
    pub file: Vec<String>,
    /// Sampling frequency in Hz (19 to 1000000: the NMI clock's range; above about
    /// 596 kHz the HPET ticks instead of the PIT).
    #[arg(long, default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(i64::from(MIN_FREQ_HZ)..=i64::from(MAX_FREQ_HZ)))]
    pub freq: u32,
    /// Run QEMU with `-icount shift=0,sleep=off` (instruction-exact, repeatable).
    #[arg(long)]
    pub icount: bool,
    /// Event source.
    #[arg(long, value_enum, default_value_t = PmuMode::Auto)]
    pub pmu: PmuMode,
    /// The CPU `--pmu sim` simulates: `spr` (Sapphire Rapids: adaptive PEBS
    /// format 5, architectural LBR; the default), `icl` (Ice Lake: adaptive
    /// PEBS format 4, legacy LBR) or `skl` (Skylake: PEBS format 3, legacy
    /// LBR with INFO).
    #[arg(long, value_parser = ["spr", "icl", "skl"])]
    pub sim_cpu: Option<String>,
    /// Upper bound on the run, in seconds. Programs run until they exit
    /// (no bound by default).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Ring size in samples (runtime `ring=N`, at least 1).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub ring: Option<u32>,
    /// Samples per second an event may take before it is throttled
    /// (runtime `max_rate=N`, perf_event_max_sample_rate; 0: no limit).
    #[arg(long)]
    pub max_rate: Option<u32>,
    /// Share of CPU time the sampling interrupt may take, in percent
    /// (runtime `cpu_pct=N`, perf_cpu_time_max_percent; 0: no budget).
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub cpu_pct: Option<u32>,
    /// Output file.
    #[arg(short = 'o', long, default_value = "perf.data")]
    pub output: PathBuf,
    /// Also save the raw stream to this file.
    #[arg(long)]
    pub save_capture: Option<PathBuf>,
    /// Read a real serial line instead of starting QEMU (the options of a
    /// boot do not apply: the board runs its own command line).
    #[arg(long, conflicts_with = "input", conflicts_with_all = BOOT_ONLY)]
    pub serial: Option<String>,
    /// Baud rate of --serial (default 115200; an option without a default
    /// value, so that clap refuses it without `--serial`).
    #[arg(long, requires = "serial", conflicts_with = "input")]
    pub baud: Option<u32>,
    /// Read a saved capture instead of starting QEMU (the options of a boot
    /// do not apply).
    #[arg(long, conflicts_with_all = BOOT_ONLY)]
    pub input: Option<PathBuf>,
    /// The QEMU binary.
    #[arg(long, default_value = "qemu-system-x86_64")]
    pub qemu: PathBuf,
    /// Hard time limit in seconds (default: duration + 60; none for
    /// programs without --duration).
    #[arg(long)]
    pub timeout: Option<f64>,
    /// Do not add the image and the programs to perf's build-id cache
    /// ($PERF_BUILDID_DIR or ~/.debug), which perch does by default so
    /// that a plain `perf report` finds their symbols.
    #[arg(long)]
    pub no_buildid_cache: bool,
    /// The default (kept for old command lines).
    #[arg(long, hide = true, conflicts_with = "no_buildid_cache")]
    pub buildid_cache: bool,
    /// An extra QEMU argument, after perch's own (repeatable:
    /// `--qemu-arg -smp --qemu-arg 2`).
    #[arg(long, value_name = "ARG", allow_hyphen_values = true)]
    pub qemu_arg: Vec<String>,
    /// A runtime command-line key, appended to the one perch builds
    /// (repeatable: `--boot-arg slice=5`).
    #[arg(long, value_name = "KEY=VALUE")]
    pub boot_arg: Vec<String>,
    /// The program to profile and its arguments (a static x86-64 or i386
    /// Linux executable). Without it (and without --appliance) the runtime
    /// has nothing to run: it says so and reports a failure (exit 6).
    #[arg(last = true, value_name = "PROGRAM [ARGS]")]
    pub command: Vec<String>,
}

/// `perch record` options that only apply when perch boots the appliance.
pub const BOOT_ONLY: [&str; 13] = [
    "freq", "icount", "pmu", "sim_cpu", "duration", "ring", "max_rate", "cpu_pct", "qemu",
    "qemu_arg", "boot_arg", "command", "file",
];

/// `--baud` when not given.
pub const DEFAULT_BAUD: u32 = 115_200;

/// Lowest `--freq`: the NMI clock is the PIT, whose 16-bit divisor of
/// 1193182 Hz cannot go below 18.2 Hz (`arch_x86::pit::rate_for`).
pub const MIN_FREQ_HZ: u32 = 19;

/// Highest `--freq`: what the runtime accepts from `freq=`
/// (`kcore::cmdline::MAX_FREQ_HZ`).
pub const MAX_FREQ_HZ: u32 = 1_000_000;

/// Appends each `--boot-arg` to the runtime command line `line`; each must
/// be one `KEY` or `KEY=VALUE` without spaces.
pub fn push_boot_args(line: &mut String, args: &[String]) -> Result<(), HostError> {
    for b in args {
        if b.is_empty() || b.contains(char::is_whitespace) {
            return Err(HostError::Usage(format!(
                "--boot-arg {b:?}: one KEY or KEY=VALUE without spaces"
            )));
        }
        line.push(' ');
        line.push_str(b);
    }
    Ok(())
}

/// What perch passes to a runtime it boots.
#[derive(Clone, Debug, PartialEq)]
pub struct BootLine {
    /// The runtime command line (`console=wire freq=... pmu=...`).
    pub append: String,
    /// The bound on the run in seconds (`duration=` on the line), if any.
    pub duration: Option<f64>,
}

impl RecordArgs {
    /// The runtime command line for a boot of these arguments;
    /// `has_programs`: a program or an appliance manifest was given (without
    /// one the run is bounded to 3 s, as the runtime has nothing to run).
    pub fn boot_line(&self, has_programs: bool) -> Result<BootLine, HostError> {
        // Programs run until they exit; without any, the runtime says there is
        // nothing to run and fails at once (the bound only guards that).
        let duration = match (self.duration, has_programs) {
            (Some(d), _) => Some(d),
            (None, false) => Some(3.0),
            (None, true) => None,
        };
        let mut append = format!(
            "console=wire freq={} pmu={}",
            self.freq,
            match self.pmu {
                PmuMode::Auto => "auto",
                PmuMode::Sim => "sim",
                PmuMode::Off => "off",
            },
        );
        if let Some(d) = duration {
            seconds("--duration", d)?;
            let duration_ms = (d * 1000.0).round() as u64;
            if duration_ms == 0 {
                return Err(HostError::Usage(format!(
                    "--duration {d} rounds to 0 ms, which the runtime cannot use: give at least 0.0005 s"
                )));
            }
            append.push_str(&format!(" duration={duration_ms}"));
        }
        if let Some(r) = self.ring {
            append.push_str(&format!(" ring={r}"));
        }
        if let Some(c) = &self.sim_cpu {
            if self.pmu != PmuMode::Sim {
                return Err(HostError::Usage("--sim-cpu needs --pmu sim".into()));
            }
            append.push_str(&format!(" sim={c}"));
        }
        if let Some(r) = self.max_rate {
            append.push_str(&format!(" max_rate={r}"));
        }
        if let Some(p) = self.cpu_pct {
            append.push_str(&format!(" cpu_pct={p}"));
        }
        push_boot_args(&mut append, &self.boot_arg)?;
        Ok(BootLine { append, duration })
    }
}

/// A positive, finite number of seconds from the command line.
pub fn seconds(flag: &str, secs: f64) -> Result<Duration, HostError> {
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| !d.is_zero() && *d < Duration::from_secs(365 * 24 * 3600))
        .ok_or_else(|| {
            HostError::Usage(format!(
                "{flag} must be a positive number of seconds below a year, got {secs}"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        record: RecordArgs,
    }

    fn args(line: &[&str]) -> RecordArgs {
        let mut argv = vec!["perch"];
        argv.extend_from_slice(line);
        Cli::try_parse_from(argv).expect("arguments parse").record
    }

    #[test]
    fn default_line_without_programs_is_bounded() {
        let b = args(&[]).boot_line(false).unwrap();
        assert_eq!(b.append, "console=wire freq=1000 pmu=auto duration=3000");
        assert_eq!(b.duration, Some(3.0));
        let b = args(&["--", "prog"]).boot_line(true).unwrap();
        assert_eq!(b.append, "console=wire freq=1000 pmu=auto");
        assert_eq!(b.duration, None);
    }

    #[test]
    fn sim_cpu_needs_pmu_sim() {
        assert!(args(&["--sim-cpu", "icl"]).boot_line(true).is_err());
        let b = args(&["--pmu", "sim", "--sim-cpu", "icl", "--ring", "64"])
            .boot_line(true)
            .unwrap();
        assert_eq!(b.append, "console=wire freq=1000 pmu=sim ring=64 sim=icl");
    }
}
