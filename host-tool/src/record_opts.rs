//! `perch record`'s command-line surface and its mapping onto the runtime
//! command line (`kcore::cmdline`): the arguments, the checks that refuse a
//! combination before anything boots, and the line QEMU passes to the
//! runtime. Commands that record (`perch top`) reuse [`RecordArgs`].

use std::path::PathBuf;
use std::time::Duration;

use arch_x86::pmu::events::{self, Event, EventKind as PmuEventKind, EventSampling};
use clap::ValueEnum;
use kcore::cmdline::{NetConfig, NetMode};
use sampler::event::sample_type as st;
use sampler::regs::{ALL_REGS, GPR_MASK, SEGMENT_MASK};

use crate::model::{EventKind, Hello};

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

/// The device the stream leaves a QEMU guest through (`--transport`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    /// A virtio console (`virtio-serial-pci` + `virtconsole`): one host
    /// write per page instead of one per byte; COM1 then carries only the
    /// runtime's text before the stream starts and a crash's last words.
    #[default]
    Virtio,
    /// COM1's 16550, as on bare metal (one host write per byte).
    Uart,
}

/// `perch record`'s arguments (also the base of commands that record,
/// such as `perch top`).
#[derive(clap::Args, Clone, Debug)]
pub struct RecordArgs {
    /// The appliance image (runtime ELF) to boot and symbolise with. A
    /// boot without it uses $PERCH_IMAGE, else the runtime shipped with
    /// perch (`perch-runtime` beside the perch binary, or the build tree's
    /// target/x86_64-unknown-none/release/perch-runtime); a warning names
    /// an image that is not the shipped one.
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
    /// The event(s) to sample, as perf names them (perf's `-e`): cycles,
    /// instructions, ref-cycles, branches, branch-misses, cache-references,
    /// cache-misses, mem-loads, mem-stores, raw `rUUEE`, with `:u`, `:k`,
    /// `:p`, `:pp`, `:ppp`; `cpu-clock` is the NMI clock (runtime `event=`).
    /// Comma-separated or repeated: up to 8 PMU events, one counter each
    /// (a set the PMU cannot hold is refused), each at -c/-F or at its own
    /// `NAME/period=N/MODS` or `NAME/freq=N/MODS`; `--pmu sim` samples
    /// `mem-loads:pp` by default and any set that fits the simulated CPU.
    #[arg(short = 'e', long = "event", value_name = "EVENT[,EVENT...]")]
    pub event: Vec<String>,
    /// Sample every N events (perf's `-c`; runtime `period=N`); on the NMI
    /// clock N is nanoseconds of cpu-clock; with `--pmu sim` every N-th
    /// load. Excludes -F.
    #[arg(short = 'c', long = "count", value_name = "N", conflicts_with = "freq",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
    /// Sampling frequency in Hz (perf's `-F`; 19 to 1000000: the NMI clock's range; above about
    /// 596 kHz the HPET ticks instead of the PIT).
    #[arg(short = 'F', long, default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(i64::from(MIN_FREQ_HZ)..=i64::from(MAX_FREQ_HZ)))]
    pub freq: u32,
    /// Run QEMU with `-icount shift=0,sleep=off` (instruction-exact, repeatable).
    #[arg(long)]
    pub icount: bool,
    /// How many CPUs the appliance machine has (QEMU `-smp N`, 1 to 64;
    /// one without it). The runtime starts every CPU the machine's ACPI
    /// MADT lists (the runtime command-line key `smp=N` starts at most N);
    /// programs run and are sampled on the first CPU only, the others are
    /// started and wait idle.
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_CPUS)))]
    pub cpus: Option<u32>,
    /// Record frame-pointer call chains (perf's `-g`, the same as
    /// `--call-graph fp`).
    #[arg(short = 'g')]
    pub call_graph_fp: bool,
    /// Record call chains: `fp` (frame pointers; the only mode Perch has).
    #[arg(long = "call-graph", value_name = "MODE")]
    pub call_graph: Option<String>,
    /// The user registers each sample carries, perf's x86 names
    /// (ax,bx,cx,dx,si,di,bp,sp,ip,flags,cs,ss,r8-r15; `?` lists them);
    /// without a list all of them (runtime `uregs_mask=`).
    #[arg(long = "user-regs", value_name = "REG,...", num_args = 0..=1,
          require_equals = true, default_missing_value = "all")]
    pub user_regs: Option<String>,
    /// The interrupted registers each sample carries (perf's `-I`), names
    /// as for --user-regs; without a list all of them (runtime `iregs_mask=`).
    #[arg(short = 'I', long = "intr-regs", value_name = "REG,...", num_args = 0..=1,
          require_equals = true, default_missing_value = "all")]
    pub intr_regs: Option<String>,
    /// Sample taken branches, any type (perf's `-b`, the same as `-j any`;
    /// needs an LBR: `--pmu sim` or a PMU with one).
    #[arg(short = 'b', long = "branch-any", conflicts_with = "branch_filter")]
    pub branch_any: bool,
    /// Sample taken branches of these types (perf's `-j`): any, any_call,
    /// any_ret, ind_call, ind_jmp, call, cond, and the modes u, k (runtime
    /// `branch=`).
    #[arg(short = 'j', long = "branch-filter", value_name = "TYPE,...")]
    pub branch_filter: Option<String>,
    /// Print no progress and no summary (errors and the programs' output
    /// still appear).
    #[arg(short = 'q', long)]
    pub quiet: bool,
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
    /// Ring size in samples (runtime `ring=N`): a power of two from 1 to
    /// 256.
    #[arg(long, value_parser = ring_slots)]
    pub ring: Option<u32>,
    /// The device the stream leaves QEMU through: `virtio` (a virtio
    /// console, the default) or `uart` (COM1's 16550, as on bare metal).
    #[arg(long, value_enum, default_value_t = Transport::Virtio)]
    pub transport: Transport,
    /// A flight-recorder buffer of this many MiB in the appliance's RAM
    /// (runtime `buffer=MiB`, up to 4096): frames wait there while the
    /// line is slower than the samples, and the run ends once it is empty.
    /// In QEMU the guest gets that much more memory.
    #[arg(long, value_name = "MiB", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub buffer: Option<u32>,
    /// Send samples in groups of N (runtime `wire_group=N`, 1 to 65536;
    /// the runtime's default is 256), each coded against context that
    /// spans its group: several times fewer bytes per sample than a frame
    /// per sample (0). A damaged frame costs the rest of its group,
    /// counted as lost; 16 suits a noisy line.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=65536))]
    pub wire_group: Option<u32>,
    /// Read the QEMU stream as slowly as a serial line at this baud (10
    /// bits a byte; 115200 carries 11,520 B/s), through a FIFO of one
    /// page, so the guest's device backs up as on that line: what a
    /// bare-metal run would lose, or keep with --buffer.
    #[arg(long, value_name = "BAUD", value_parser = clap::value_parser!(u32).range(300..))]
    pub line_baud: Option<u32>,
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
    /// Also write a gzipped pprof profile (profile.proto) to this file,
    /// for pprof, Pyroscope, Parca and Grafana.
    #[arg(long, value_name = "FILE")]
    pub pprof: Option<PathBuf>,
    /// Read a real serial line instead of starting QEMU (the options of a
    /// boot do not apply: the board runs its own command line).
    #[arg(long, conflicts_with = "input", conflicts_with_all = BOOT_ONLY)]
    pub serial: Option<String>,
    /// Baud rate of --serial (default 115200); refused without --serial
    /// (a QEMU run has no line to set: --line-baud paces it like one).
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
    /// Give the appliance a network: QEMU's user networking (NAT to the
    /// host's, no root needed) on a virtio-net card. The runtime takes
    /// 10.0.2.15/24 from QEMU's DHCP server (gateway 10.0.2.2, DNS
    /// 10.0.2.3) unless `--boot-arg net=ADDR/PREFIX,gw=GW` sets one, and
    /// programs reach it through their TCP and UDP sockets (the loopback
    /// works without --net). Once it has its address perch prints each
    /// forward (`perch: serving: tcp 127.0.0.1:8080 -> 10.0.2.15:80`).
    /// An appliance manifest's [net] table gives the same settings.
    #[arg(long)]
    pub net: bool,
    /// With --net: forward the host's 127.0.0.1:HOSTPORT to the
    /// appliance's GUESTPORT (repeatable; tcp: or udp:).
    #[arg(long, value_name = "tcp|udp:HOSTPORT:GUESTPORT", requires = "net")]
    pub forward: Vec<String>,
    /// With --net (or an appliance manifest's [net]): once the appliance
    /// has its address, probe the forward of this host port until the
    /// program in the appliance accepts connections on it, then print `perch: ready: tcp 127.0.0.1:HOSTPORT
    /// ...` (and write --ready-file). Repeatable: ready once all accept.
    /// A probe connects and must stay connected for half a second, twice
    /// in a row: QEMU accepts on the host port even when nothing listens
    /// in the appliance, and closes the connection when the appliance
    /// refuses it.
    #[arg(long, value_name = "tcp:HOSTPORT")]
    pub wait_for: Vec<String>,
    /// With --wait-for: create this file (holding the ready lines) once
    /// every --wait-for port accepts, so that a script running `perch
    /// record ... &` starts its load then (`until [ -e FILE ]; do sleep
    /// 0.1; done`). An old file of that name is removed first.
    #[arg(long, value_name = "FILE", requires = "wait_for")]
    pub ready_file: Option<PathBuf>,
    /// An extra QEMU argument, after perch's own (repeatable:
    /// `--qemu-arg -cpu --qemu-arg max`).
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
pub const BOOT_ONLY: [&str; 26] = [
    "freq",
    "cpus",
    "net",
    "forward",
    "wait_for",
    "ready_file",
    "icount",
    "pmu",
    "sim_cpu",
    "duration",
    "ring",
    "max_rate",
    "cpu_pct",
    "qemu",
    "qemu_arg",
    "boot_arg",
    "command",
    "file",
    "event",
    "count",
    "call_graph_fp",
    "call_graph",
    "user_regs",
    "intr_regs",
    "branch_any",
    "branch_filter",
];

/// Most `--cpus`: the runtime holds at most 64 CPUs (the runtime's
/// `smp=` takes 1 to 64).
pub const MAX_CPUS: u32 = 64;

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

/// The protocol of a `--forward`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

impl Proto {
    /// QEMU's name (`hostfwd=tcp:...`).
    pub fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
}

/// One `--forward PROTO:HOSTPORT:GUESTPORT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Forward {
    /// TCP or UDP.
    pub proto: Proto,
    /// The port on the host's 127.0.0.1.
    pub host: u16,
    /// The appliance's port.
    pub guest: u16,
}

impl Forward {
    /// Parses `tcp:HOSTPORT:GUESTPORT` or `udp:HOSTPORT:GUESTPORT`.
    pub fn parse(v: &str) -> Result<Forward, HostError> {
        let usage = |why: &str| {
            HostError::Usage(format!(
                "--forward {v:?}: {why} (expected tcp:HOSTPORT:GUESTPORT or udp:HOSTPORT:GUESTPORT, \
                 ports 1 to 65535)"
            ))
        };
        let mut parts = v.split(':');
        let proto = match parts.next() {
            Some("tcp") => Proto::Tcp,
            Some("udp") => Proto::Udp,
            _ => return Err(usage("the protocol must be tcp or udp")),
        };
        let (Some(host), Some(guest), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(usage("two ports are needed"));
        };
        let port = |p: &str, which: &str| match p.parse::<u16>() {
            Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
            _ => Err(usage(&format!("bad {which} port {p:?}"))),
        };
        Ok(Forward {
            proto,
            host: port(host, "host")?,
            guest: port(guest, "guest")?,
        })
    }
}

/// What `--net` asks of QEMU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Network {
    /// The host forwards, each host port once per protocol.
    pub forwards: Vec<Forward>,
    /// The appliance's address when `--boot-arg net=ADDR/...` sets one
    /// (forwards go there); `None`: the address QEMU's DHCP hands out.
    pub guest: Option<[u8; 4]>,
}

impl Network {
    /// QEMU's `-netdev` value: user networking with the forwards.
    pub fn netdev(&self, id: &str) -> String {
        let mut s = format!("user,id={id}");
        let guest = self
            .guest
            .map(|[a, b, c, d]| format!("{a}.{b}.{c}.{d}"))
            .unwrap_or_default();
        for f in &self.forwards {
            s.push_str(&format!(
                ",hostfwd={}:127.0.0.1:{}-{guest}:{}",
                f.proto.name(),
                f.host,
                f.guest
            ));
        }
        s
    }
}

impl RecordArgs {
    /// `--net` and its `--forward`s, checked: a bad forward, a host port
    /// forwarded twice, or a `net=` boot argument the runtime would refuse
    /// (or `net=off`) is a usage error. `None` without `--net`.
    pub fn network(&self) -> Result<Option<Network>, HostError> {
        if !self.net {
            if !self.forward.is_empty() {
                return Err(HostError::Usage(
                    "--forward needs --net (there is no network to forward to)".into(),
                ));
            }
            return Ok(None);
        }
        let mut forwards: Vec<Forward> = Vec::new();
        for v in &self.forward {
            let f = Forward::parse(v)?;
            if forwards
                .iter()
                .any(|o| o.proto == f.proto && o.host == f.host)
            {
                return Err(HostError::Usage(format!(
                    "--forward {v:?}: {} host port {} is forwarded twice",
                    f.proto.name(),
                    f.host
                )));
            }
            forwards.push(f);
        }
        let mut guest = None;
        for b in &self.boot_arg {
            let Some(v) = b.strip_prefix("net=") else {
                continue;
            };
            match NetConfig::parse(v) {
                Ok(NetConfig {
                    mode: NetMode::Static { addr, .. },
                    ..
                }) => guest = Some(addr),
                Ok(NetConfig {
                    mode: NetMode::Off, ..
                }) => {
                    return Err(HostError::Usage(
                        "--net with --boot-arg net=off: the runtime would not use the network"
                            .into(),
                    ));
                }
                Ok(_) => guest = None,
                Err(e) => {
                    return Err(HostError::Usage(format!("--boot-arg {b:?}: {e}")));
                }
            }
        }
        Ok(Some(Network { forwards, guest }))
    }
}

/// What perch passes to a runtime it boots.
#[derive(Clone, Debug, PartialEq)]
pub struct BootLine {
    /// The runtime command line (`console=wire freq=... pmu=...`).
    pub append: String,
    /// The bound on the run in seconds (`duration=` on the line), if any.
    pub duration: Option<f64>,
    /// What the appliance's Hello must show for the options to have been
    /// honoured (with `--pmu auto` only the booted runtime knows whether
    /// there is a PMU, an LBR, or the event).
    pub expect: Expect,
}

/// One `-e` event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordEvent {
    /// `cpu-clock`: the NMI clock (`--pmu off`).
    CpuClock,
    /// A PMU event, as the runtime's `event=` parses it, with its own
    /// sampling when it has a `/period=N/` or `/freq=N/` term.
    Pmu(Event, Option<EventSampling>),
}

/// Most `-e` events in one run (one counter each): the wire's.
pub const MAX_EVENTS: usize = sampler::wire::MAX_EVENTS;

/// Parses every `-e` value (each comma-separated) into `(spec, event)`
/// pairs, with perf's message for a name it does not know.
pub fn parse_events(values: &[String]) -> Result<Vec<(String, RecordEvent)>, HostError> {
    let mut out = Vec::new();
    for spec in values.iter().flat_map(|v| events::split_list(v)) {
        let spec = spec.trim();
        if spec.is_empty() {
            return Err(HostError::Usage(
                "event syntax error: '': an empty event name in -e".into(),
            ));
        }
        let (name, mods) = spec.split_once([':', '/']).unwrap_or((spec, ""));
        let ev = if matches!(name, "cpu-clock" | "cpu_clock") {
            if !mods.is_empty() {
                return Err(HostError::Usage(format!(
                    "event syntax error: '{spec}': cpu-clock (the NMI clock) counts every mode \
                     and has no precise levels: it takes no modifiers"
                )));
            }
            RecordEvent::CpuClock
        } else {
            let (ev, sampling) = events::parse_spec(spec).map_err(|e| {
                HostError::Usage(format!("event syntax error: '{spec}': {e}, or cpu-clock"))
            })?;
            RecordEvent::Pmu(ev, sampling)
        };
        out.push((spec.to_owned(), ev));
    }
    Ok(out)
}

/// perf's x86 register names, lower case, in bit order.
fn reg_names() -> impl Iterator<Item = (String, u64)> {
    ALL_REGS
        .iter()
        .map(|r| (r.name().to_ascii_lowercase(), r.bit()))
}

/// The register mask of a `--user-regs` / `--intr-regs` list (`flag`
/// names the option), perf's x86 names; `all` (the option without a list)
/// is every general register. `?` and unknown names are refused with the
/// names perf would list; DS, ES, FS and GS with the error x86-64 Linux
/// gives (EINVAL), since it does not sample them.
pub fn parse_regs(flag: &str, list: &str, event: &str) -> Result<u64, HostError> {
    let available = || {
        reg_names()
            .filter(|(_, bit)| bit & GPR_MASK != 0)
            .map(|(n, _)| n.to_ascii_uppercase())
            .collect::<Vec<_>>()
            .join(" ")
    };
    if list == "all" {
        return Ok(GPR_MASK);
    }
    if list.trim() == "?" {
        return Err(HostError::Usage(format!(
            "available registers: {}",
            available()
        )));
    }
    let mut mask = 0;
    for name in list.split(',') {
        let name = name.trim().to_ascii_lowercase();
        let Some((_, bit)) = reg_names().find(|(n, _)| *n == name) else {
            return Err(HostError::Usage(format!(
                "Unknown register \"{name}\", check man page or run \"perch record {flag}=?\" \
                 (available registers: {})",
                available()
            )));
        };
        mask |= bit;
    }
    if mask & SEGMENT_MASK != 0 {
        return Err(HostError::Usage(format!(
            "The sys_perf_event_open() syscall returned with 22 (Invalid argument) for event ({event}).\n\
             {flag}={list}: x86-64 does not sample DS, ES, FS or GS"
        )));
    }
    Ok(mask)
}

/// perf's `-j` names and their `branch_sample_type` bits, the ones the
/// LBR filter has.
const BRANCH_NAMES: [(&str, u64); 9] = [
    ("u", 1 << 0),
    ("k", 1 << 1),
    ("any", 1 << 3),
    ("any_call", 1 << 4),
    ("any_ret", 1 << 5),
    ("ind_call", 1 << 6),
    ("cond", 1 << 10),
    ("ind_jmp", 1 << 12),
    ("call", 1 << 13),
];

/// perf's other `-j` names, which Perch refuses with this reason.
const BRANCH_UNSUPPORTED: [(&str, &str); 11] = [
    ("hv", "there is no hypervisor mode to filter"),
    (
        "abort_tx",
        "transactional memory (TSX) flags are not recorded",
    ),
    ("in_tx", "transactional memory (TSX) flags are not recorded"),
    ("no_tx", "transactional memory (TSX) flags are not recorded"),
    ("call_stack", "the LBR call-stack mode is not programmed"),
    ("save_type", "branch types are not decoded into the entries"),
    ("no_flags", "the entries' flags are always recorded"),
    ("no_cycles", "the entries' cycles are always recorded"),
    ("hw_index", "the hardware index is not requested this way"),
    ("priv", "privilege levels are not saved in the entries"),
    ("counter", "counter values are not recorded in the entries"),
];

/// The `branch_sample_type` of a `-j` list; without a branch class (only
/// `u` / `k`) every class, as perf does.
pub fn parse_branch_filter(list: &str) -> Result<u64, HostError> {
    let mut bst = 0;
    for name in list.split(',') {
        let name = name.trim();
        if let Some((_, bit)) = BRANCH_NAMES.iter().find(|(n, _)| *n == name) {
            bst |= bit;
        } else if let Some((_, why)) = BRANCH_UNSUPPORTED.iter().find(|(n, _)| *n == name) {
            return Err(HostError::Usage(format!(
                "-j {name}: not supported: {why} (supported: {})",
                branch_names()
            )));
        } else {
            return Err(HostError::Usage(format!(
                "unknown branch filter {name}, check man page (supported: {})",
                branch_names()
            )));
        }
    }
    if bst & !0b11 == 0 {
        bst |= sampler::event::branch_type::ANY;
    }
    Ok(bst)
}

fn branch_names() -> String {
    BRANCH_NAMES
        .iter()
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The one event `--pmu sim` samples: the simulated PMU's precise
/// `mem-loads` (runtime `sample::pmu::sim`).
pub const SIM_EVENT: Event = Event {
    kind: PmuEventKind::MemLoads,
    user: true,
    kernel: true,
    precise: 2,
};

/// The simulated CPU of `--sim-cpu` (`spr`, `icl`, `skl`).
fn sim_cpu_of(name: &str) -> arch_x86::pmu::sim::SimCpu {
    use arch_x86::pmu::sim::SimCpu;
    match name {
        "icl" => SimCpu::ice_lake(),
        "skl" => SimCpu::skylake(),
        _ => SimCpu::sapphire_rapids(),
    }
}

/// CPUID of a fresh simulator of `0` (CPUID does not depend on its state).
struct SimCpuid(arch_x86::pmu::sim::SimCpu);

impl arch_x86::cpuid::Cpuid for SimCpuid {
    fn cpuid(&self, leaf: u32, subleaf: u32) -> arch_x86::cpuid::CpuIdResult {
        arch_x86::cpuid::Cpuid::cpuid(&arch_x86::pmu::sim::SimPmu::new(self.0), leaf, subleaf)
    }
}

/// A page-aligned PEBS buffer, as the runtime's is.
#[repr(C, align(4096))]
struct PebsBuf([u8; 16 * 1024]);

/// Whether the `--pmu sim` CPU `cpu` can sample `events` at once: the
/// runtime's driver programmed against the same simulator here, so a set
/// it would refuse at boot (counter constraints, PEBS counters, events the
/// model lacks) is refused before boot with its reason. `count`: `-c`.
fn sim_fits(cpu: &str, events: &[(&String, &Event)], count: Option<u64>) -> Result<(), HostError> {
    use arch_x86::pmu::driver::PmuDriver;
    use arch_x86::pmu::ds::{DsArea, DsMemory};
    use arch_x86::pmu::intel::IntelOptions;
    use arch_x86::pmu::{EventConfig, PmuError, SampleMode};
    let sim_cpu = sim_cpu_of(cpu);
    let mut sim = arch_x86::pmu::sim::SimPmu::new(sim_cpu);
    let info = arch_x86::cpuid::detect(&SimCpuid(sim_cpu), &mut sim);
    let all: Vec<&str> = events.iter().map(|(s, _)| s.as_str()).collect();
    let all = all.join(",");
    let cfgs: Vec<EventConfig> = events
        .iter()
        .map(|(_, e)| EventConfig {
            event: **e,
            mode: SampleMode::Period(count.unwrap_or(1)),
        })
        .collect();
    let area = Box::new(DsArea::new());
    let mut buf = Box::new(PebsBuf([0; 16 * 1024]));
    let mut mem = DsMemory::new(&area, &mut buf.0);
    let opts = IntelOptions {
        lbr: Some(arch_x86::pmu::perf::lbr_config(
            sampler::event::branch_type::ANY
                | sampler::event::branch_type::USER
                | sampler::event::branch_type::KERNEL,
        )),
        ..Default::default()
    };
    let r =
        PmuDriver::new(&info).and_then(|mut d| d.configure(&mut sim, Some(&mut mem), &cfgs, &opts));
    let spec = |i: usize| events.get(i).map_or(all.as_str(), |(s, _)| s.as_str());
    match r {
        Ok(()) => Ok(()),
        Err(PmuError::NoCounter { event }) => Err(not_supported(
            &all,
            &format!(
                "The simulated {cpu} PMU ({} GP + {} fixed counters) cannot count these events at \
                 once: no free counter can count {} (counter constraints: some events count only on \
                 some counters of the model, PEBS events need a PEBS-capable counter, \
                 fixed-counter events share theirs); sample fewer events per run.",
                info.gp_counters,
                info.fixed_counters(),
                spec(event)
            ),
        )),
        Err(e @ PmuError::EventUnavailable { event }) => Err(not_supported(
            spec(event),
            &format!("The simulated {cpu} PMU refuses it: {e}."),
        )),
        Err(e @ PmuError::BadPeriod { event }) => Err(not_supported(
            spec(event),
            &format!("The simulated {cpu} PMU refuses it: {e}."),
        )),
        Err(e) => Err(not_supported(
            &all,
            &format!("The simulated {cpu} PMU refuses the set: {e}."),
        )),
    }
}

/// perf's refusal of an event the target cannot count.
fn not_supported(event: &str, why: &str) -> HostError {
    HostError::Usage(format!(
        "The sys_perf_event_open() syscall returned with 95 (Operation not supported) for event ({event}).\n{why}"
    ))
}

/// perf's refusal of branch stacks on an event without them.
fn no_branch_stack(event: &str, why: &str) -> HostError {
    HostError::Usage(format!(
        "{event}: PMU Hardware or event type doesn't support branch stack sampling.\n{why}"
    ))
}

/// What a boot's Hello must show (`--pmu auto`), checked by [`Expect::check`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Expect {
    /// The `-e` events the PMU must sample, in order: each one's spec and
    /// perf type/config (`None` where only the appliance's driver knows
    /// the raw code: memory events).
    pub events: Vec<(String, Option<(u32, u64)>)>,
    /// `-b` / `-j`: samples must carry branch stacks.
    pub branches: bool,
    /// `-c N` without `-e`: if the appliance falls back to the NMI clock,
    /// N is nanoseconds of cpu-clock and must be within the clock's rates.
    pub clock_period: Option<u64>,
}

/// Whether a `-c` period in ns of cpu-clock is within the NMI clock's rates.
fn clock_period_ok(ns: u64) -> bool {
    (u64::from(MIN_FREQ_HZ)..=u64::from(MAX_FREQ_HZ)).contains(&(1_000_000_000 / ns))
}

/// The refusal of a `-c` period the NMI clock cannot tick at.
fn bad_clock_period(n: u64) -> HostError {
    HostError::Usage(format!(
        "-c {n}: on the NMI clock the period is nanoseconds of cpu-clock, from {} ({MAX_FREQ_HZ} Hz) to {} ({MIN_FREQ_HZ} Hz)",
        1_000_000_000 / u64::from(MAX_FREQ_HZ),
        1_000_000_000 / u64::from(MIN_FREQ_HZ)
    ))
}

impl Expect {
    /// Whether `hello` honours the options; the error is perf's refusal,
    /// with what the appliance did instead.
    pub fn check(&self, hello: &Hello) -> Result<(), HostError> {
        let Some(e) = hello.events.first() else {
            return Ok(());
        };
        let specs: Vec<&str> = self.events.iter().map(|(s, _)| s.as_str()).collect();
        let name = if specs.is_empty() {
            "cycles".to_owned()
        } else {
            specs.join(",")
        };
        if (!self.events.is_empty() || self.branches) && e.kind == EventKind::CpuClock {
            return Err(not_supported(
                &name,
                "The appliance has no usable PMU: it sampled on the NMI clock (cpu-clock) instead \
                 (its log says why); run with --pmu off for cpu-clock or --pmu sim for the simulated PMU.",
            ));
        }
        if self.events.len() > 1 && hello.events.len() != self.events.len() {
            return Err(HostError::Usage(format!(
                "{}\nThe appliance's PMU cannot count these {} events at once (counter \
                 constraints: each event needs a counter that can count it) and sampled {} \
                 instead (its log says which event did not fit); sample fewer events per run.",
                not_supported(&name, "").to_string().trim_end(),
                self.events.len(),
                hello
                    .events
                    .iter()
                    .map(|e| e.perf_name(hello.source))
                    .collect::<Vec<_>>()
                    .join(",")
            )));
        }
        for ((spec, want), e) in self.events.iter().zip(&hello.events) {
            if let Some((ty, config)) = want
                && (perf_type(e.kind), e.config) != (*ty, *config)
            {
                return Err(not_supported(
                    spec,
                    &format!(
                        "The appliance's PMU driver refused it and sampled type {} config {:#x} instead \
                         (its log says why).",
                        perf_type(e.kind),
                        e.config
                    ),
                ));
            }
        }
        if let Some(n) = self.clock_period
            && e.kind == EventKind::CpuClock
            && !clock_period_ok(n)
        {
            return Err(HostError::Usage(format!(
                "{}\nThe appliance has no usable PMU: it samples on the NMI clock (its log says why).",
                bad_clock_period(n)
            )));
        }
        if self.branches && e.sample_type & st::BRANCH_STACK == 0 {
            return Err(no_branch_stack(
                &name,
                "The appliance's PMU has no usable LBR (its log says why).",
            ));
        }
        Ok(())
    }
}

/// `perf_event_attr.type` of a stream event.
fn perf_type(k: EventKind) -> u32 {
    match k {
        EventKind::Hardware => 0,
        EventKind::CpuClock => 1,
        EventKind::Raw => 4,
    }
}

/// perf's type and config of a PMU event (`event=`), as the runtime's
/// driver describes it (`arch_x86::pmu::perf::perf_event`); memory
/// events' raw codes depend on the vendor, so only their type is known.
fn perf_type_config(ev: &Event) -> Option<(u32, u64)> {
    use arch_x86::pmu::SampleMode;
    use arch_x86::pmu::perf::perf_event;
    if matches!(ev.kind, PmuEventKind::MemLoads | PmuEventKind::MemStores) {
        return None;
    }
    let (e, _) = perf_event(
        ev,
        SampleMode::Period(1),
        arch_x86::cpuid::Vendor::Intel,
        false,
        sampler::pebs::MemKind::None,
        false,
    );
    Some((e.kind.perf_type(), e.config))
}

impl RecordArgs {
    /// The runtime command line for a boot of these arguments;
    /// `has_programs`: a program or an appliance manifest was given (without
    /// one the run is bounded to 3 s, as the runtime has nothing to run).
    /// A combination the target cannot do is refused here, before boot,
    /// with perf's message where perf has one.
    pub fn boot_line(&self, has_programs: bool) -> Result<BootLine, HostError> {
        // Programs run until they exit; without any, the runtime says there is
        // nothing to run and fails at once (the bound only guards that).
        let duration = match (self.duration, has_programs) {
            (Some(d), _) => Some(d),
            (None, false) => Some(3.0),
            (None, true) => None,
        };
        let events = parse_events(&self.event)?;
        let mut pmu = self.pmu;
        let names: Vec<&str> = events.iter().map(|(s, _)| s.as_str()).collect();
        let all = names.join(",");
        if events.len() > MAX_EVENTS {
            return Err(HostError::Usage(format!(
                "-e {all}: {} events; perch samples at most {MAX_EVENTS} events in one run, \
                 one counter each",
                events.len()
            )));
        }
        let clocks = events
            .iter()
            .filter(|(_, e)| *e == RecordEvent::CpuClock)
            .count();
        if clocks > 0 && events.len() > 1 {
            return Err(not_supported(
                &all,
                "cpu-clock is the NMI clock, one event that cannot be sampled with others in \
                 one run (perch has no second software clock, and the NMI clock does not \
                 tick while a PMU samples): give cpu-clock alone, or PMU events alone.",
            ));
        }
        let pmu_events: Vec<(&String, &Event)> = events
            .iter()
            .filter_map(|(s, e)| match e {
                RecordEvent::Pmu(ev, _) => Some((s, ev)),
                RecordEvent::CpuClock => None,
            })
            .collect();
        if pmu == PmuMode::Sim
            && let Some((spec, _)) = events
                .iter()
                .find(|(_, e)| matches!(e, RecordEvent::Pmu(_, Some(EventSampling::Freq(_)))))
        {
            return Err(not_supported(
                spec,
                "The simulated PMU runs on simulated time and has no frequency mode: give the \
                 event a period (NAME/period=N/) or none (a tick's worth of its count).",
            ));
        }
        let mut expect = Expect::default();
        let mut event_key = None;
        match (pmu, events.first()) {
            (_, None) => {}
            (PmuMode::Auto, Some((_, RecordEvent::CpuClock))) => pmu = PmuMode::Off,
            (PmuMode::Off, Some((_, RecordEvent::CpuClock))) => {}
            (PmuMode::Sim, Some((spec, RecordEvent::CpuClock))) => {
                return Err(not_supported(
                    spec,
                    "--pmu sim samples the simulated PMU's events (mem-loads:pp by default); \
                     cpu-clock is the NMI clock of --pmu off.",
                ));
            }
            (PmuMode::Off, Some(_)) => {
                return Err(not_supported(
                    &all,
                    "--pmu off samples on the NMI clock, whose only event is cpu-clock; \
                     hardware events need --pmu auto (a PMU) or --pmu sim.",
                ));
            }
            (PmuMode::Sim, Some(_)) => {
                let set: Vec<Event> = pmu_events.iter().map(|(_, e)| **e).collect();
                let terms = events
                    .iter()
                    .any(|(_, e)| matches!(e, RecordEvent::Pmu(_, Some(_))));
                // The simulated PMU's own default needs no key.
                if set != [SIM_EVENT] || terms {
                    sim_fits(
                        self.sim_cpu.as_deref().unwrap_or("spr"),
                        &pmu_events,
                        self.count,
                    )?;
                    event_key = Some(all.clone());
                }
            }
            (PmuMode::Auto, Some(_)) => {
                event_key = Some(all.clone());
                expect.events = pmu_events
                    .iter()
                    .map(|(spec, ev)| ((*spec).clone(), perf_type_config(ev)))
                    .collect();
            }
        }
        let event_name = match (events.first(), pmu) {
            (Some(_), _) => all.clone(),
            (None, PmuMode::Off) => "cpu-clock".into(),
            (None, PmuMode::Sim) => "mem-loads:pp".into(),
            (None, PmuMode::Auto) => "cycles".into(),
        };
        let mut append = format!(
            "console=wire freq={} pmu={}",
            self.freq,
            match pmu {
                PmuMode::Auto => "auto",
                PmuMode::Sim => "sim",
                PmuMode::Off => "off",
            },
        );
        if let Some(spec) = &event_key {
            append.push_str(&format!(" event={spec}"));
        }
        if let Some(n) = self.count {
            match pmu {
                // The simulated mem-loads: every N-th load (one per tick).
                PmuMode::Sim => {}
                PmuMode::Off => {
                    if !clock_period_ok(n) {
                        return Err(bad_clock_period(n));
                    }
                }
                // With -e a fallback is refused anyway.
                PmuMode::Auto if event_key.is_none() => expect.clock_period = Some(n),
                PmuMode::Auto => {}
            }
            append.push_str(&format!(" period={n}"));
        }
        let callchain = match (self.call_graph_fp, self.call_graph.as_deref()) {
            (_, Some("fp")) | (true, None) => true,
            (_, Some("dwarf")) => {
                return Err(HostError::Usage(
                    "--call-graph dwarf needs copies of the user stack (PERF_SAMPLE_STACK_USER), \
                     which the runtime does not take: use --call-graph fp (-g)"
                        .into(),
                ));
            }
            (_, Some("lbr")) => {
                return Err(HostError::Usage(
                    "--call-graph lbr needs the LBR call-stack mode, which the runtime does not \
                     program: use --call-graph fp (-g)"
                        .into(),
                ));
            }
            (_, Some(other)) => {
                return Err(HostError::Usage(format!(
                    "callchain: Unknown --call-graph option value: {other} (perch has fp)"
                )));
            }
            (false, None) => false,
        };
        let uregs = self
            .user_regs
            .as_deref()
            .map(|l| parse_regs("--user-regs", l, &event_name))
            .transpose()?;
        let iregs = self
            .intr_regs
            .as_deref()
            .map(|l| parse_regs("--intr-regs", l, &event_name))
            .transpose()?;
        // perf's sample set: with any of these the samples carry exactly
        // what they ask for; with none, perch's default set (`sample=`).
        if callchain || self.call_graph.is_some() || uregs.is_some() || iregs.is_some() {
            append.push_str(&format!(
                " callchain={} uregs_mask={:#x} iregs_mask={:#x}",
                if callchain { "fp" } else { "no" },
                uregs.unwrap_or(0),
                iregs.unwrap_or(0)
            ));
        }
        let branches = match (&self.branch_filter, self.branch_any) {
            (Some(list), _) => Some(parse_branch_filter(list)?),
            (None, true) => Some(sampler::event::branch_type::ANY),
            (None, false) => None,
        };
        if let Some(b) = branches {
            match pmu {
                PmuMode::Off => {
                    return Err(no_branch_stack(
                        &event_name,
                        "--pmu off samples on the NMI clock (cpu-clock), which has no LBR: \
                         use --pmu sim or a PMU with one.",
                    ));
                }
                PmuMode::Sim => {}
                PmuMode::Auto => expect.branches = true,
            }
            append.push_str(&format!(" branch={b:#x}"));
        }
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
        if let Some(b) = self.buffer {
            append.push_str(&format!(" buffer={b}"));
        }
        if let Some(g) = self.wire_group {
            append.push_str(&format!(" wire_group={g}"));
        }
        if let Some(c) = &self.sim_cpu {
            if pmu != PmuMode::Sim {
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
        Ok(BootLine {
            append,
            duration,
            expect,
        })
    }
}

/// `--ring`: the runtime's ring holds a power of two of slots, at most 256.
fn ring_slots(v: &str) -> Result<u32, String> {
    match v.parse::<u32>() {
        Ok(n) if n.is_power_of_two() && n <= 256 => Ok(n),
        _ => Err(format!(
            "{v} is not a ring size: a power of two from 1 to 256"
        )),
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

    fn usage(r: Result<Option<Network>, HostError>) -> String {
        match r {
            Err(HostError::Usage(m)) => m,
            other => panic!("expected a usage error, got {other:?}"),
        }
    }

    #[test]
    fn net_and_forwards() {
        assert_eq!(args(&["--", "p"]).network().unwrap(), None);
        let n = args(&["--net", "--", "p"]).network().unwrap().unwrap();
        assert_eq!(n.forwards, []);
        assert_eq!(n.netdev("n0"), "user,id=n0");
        let n = args(&[
            "--net",
            "--forward",
            "tcp:8080:80",
            "--forward",
            "udp:5353:53",
            "--",
            "p",
        ])
        .network()
        .unwrap()
        .unwrap();
        assert_eq!(
            n.forwards,
            [
                Forward {
                    proto: Proto::Tcp,
                    host: 8080,
                    guest: 80
                },
                Forward {
                    proto: Proto::Udp,
                    host: 5353,
                    guest: 53
                }
            ]
        );
        assert_eq!(
            n.netdev("n0"),
            "user,id=n0,hostfwd=tcp:127.0.0.1:8080-:80,hostfwd=udp:127.0.0.1:5353-:53"
        );
        // A static address gets the forwards.
        let n = args(&[
            "--net",
            "--forward",
            "udp:7007:7",
            "--boot-arg",
            "net=10.0.2.20/24,gw=10.0.2.2,echo",
            "--",
            "p",
        ])
        .network()
        .unwrap()
        .unwrap();
        assert_eq!(n.guest, Some([10, 0, 2, 20]));
        assert_eq!(
            n.netdev("n0"),
            "user,id=n0,hostfwd=udp:127.0.0.1:7007-10.0.2.20:7"
        );
        // The same host port for TCP and UDP is two forwards.
        assert!(
            args(&["--net", "--forward", "tcp:80:80", "--forward", "udp:80:80"])
                .network()
                .is_ok()
        );
    }

    #[test]
    fn bad_net_options_are_usage_errors() {
        for (fwd, why) in [
            ("tcp", "two ports are needed"),
            ("tcp:8080", "two ports are needed"),
            ("tcp:1:2:3", "two ports are needed"),
            ("sctp:1:2", "the protocol must be tcp or udp"),
            (":1:2", "the protocol must be tcp or udp"),
            ("tcp:0:80", "bad host port \"0\""),
            ("tcp:65536:80", "bad host port \"65536\""),
            ("tcp:+80:80", "bad host port \"+80\""),
            ("udp:80:", "bad guest port \"\""),
            ("udp:80:x", "bad guest port \"x\""),
        ] {
            let m = usage(args(&["--net", "--forward", fwd]).network());
            assert!(m.contains(why), "{fwd}: {m}");
            assert!(m.contains("tcp:HOSTPORT:GUESTPORT"), "{fwd}: {m}");
        }
        let m = usage(
            args(&[
                "--net",
                "--forward",
                "tcp:8080:80",
                "--forward",
                "tcp:8080:81",
            ])
            .network(),
        );
        assert!(m.contains("tcp host port 8080 is forwarded twice"), "{m}");
        let m = usage(args(&["--net", "--boot-arg", "net=10.0.2.20"]).network());
        assert!(m.contains("needs a prefix length"), "{m}");
        let m = usage(args(&["--net", "--boot-arg", "net=off"]).network());
        assert!(m.contains("net=off"), "{m}");
        // clap: --forward without --net, and --net with a capture.
        assert!(Cli::try_parse_from(["perch", "--forward", "tcp:1:2"]).is_err());
        assert!(Cli::try_parse_from(["perch", "--net", "--input", "c.bin"]).is_err());
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

    /// The line of `line` (with a program), or the refusal's text.
    fn line_of(line: &[&str]) -> Result<BootLine, String> {
        let mut all = line.to_vec();
        all.extend_from_slice(&["--", "prog"]);
        args(&all).boot_line(true).map_err(|e| e.to_string())
    }

    fn refusal(line: &[&str]) -> String {
        match line_of(line) {
            Ok(b) => panic!("{line:?} was not refused: {:?}", b.append),
            Err(e) => e,
        }
    }

    #[test]
    fn events_map_to_the_event_key() {
        let b = line_of(&["-e", "instructions:u"]).unwrap();
        assert_eq!(
            b.append,
            "console=wire freq=1000 pmu=auto event=instructions:u"
        );
        // PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS.
        assert_eq!(b.expect.events, [("instructions:u".into(), Some((0, 1)))]);
        let b = line_of(&["--event", "r01c2:pp"]).unwrap();
        assert!(b.append.ends_with(" event=r01c2:pp"), "{}", b.append);
        assert_eq!(b.expect.events, [("r01c2:pp".into(), Some((4, 0x01c2)))]);
        // cpu-clock is the NMI clock: pmu=off, no event key, nothing to check.
        let b = line_of(&["-e", "cpu-clock"]).unwrap();
        assert_eq!(b.append, "console=wire freq=1000 pmu=off");
        assert_eq!(b.expect, Expect::default());
        // The simulated PMU's own event is accepted; it needs no key.
        let b = line_of(&["--pmu", "sim", "-e", "mem-loads:pp"]).unwrap();
        assert_eq!(b.append, "console=wire freq=1000 pmu=sim");
    }

    #[test]
    fn events_the_target_cannot_count_are_refused_like_perf() {
        let e = refusal(&["-e", "cycles:pp", "--pmu", "off"]);
        assert!(
            e.starts_with(
                "The sys_perf_event_open() syscall returned with 95 (Operation not supported) for event (cycles:pp)."
            ),
            "{e}"
        );
        assert!(e.contains("only event is cpu-clock"), "{e}");
        let e = refusal(&["--pmu", "sim", "-e", "cpu-clock"]);
        assert!(e.contains("for event (cpu-clock)"), "{e}");
        let e = refusal(&["-e", "cycles", "-e", "cpu-clock", "--pmu", "off"]);
        assert!(
            e.contains("for event (cycles,cpu-clock)") && e.contains("NMI clock"),
            "{e}"
        );
        let e = refusal(&["-e", "cpu-clock,cpu-clock"]);
        assert!(
            e.contains("for event (cpu-clock,cpu-clock)") && e.contains("cpu-clock alone"),
            "{e}"
        );
        let e = refusal(&["-e", "cycles,instructions", "--pmu", "off"]);
        assert!(
            e.contains("for event (cycles,instructions)") && e.contains("only event is cpu-clock"),
            "{e}"
        );
        let nine = ["cycles"; 9].join(",");
        let e = refusal(&["-e", &nine]);
        assert!(e.contains("at most 8 events"), "{e}");
        let e = refusal(&["-e", "cycels"]);
        assert!(
            e.starts_with("event syntax error: 'cycels': unknown event"),
            "{e}"
        );
        assert!(refusal(&["-e", "cycles:x"]).contains("modifier 'x'"));
        assert!(refusal(&["-e", "cpu-clock:u"]).contains("no modifiers"));
        assert!(refusal(&["-e", "cycles,"]).contains("empty event name"));
    }

    #[test]
    fn several_events_map_to_one_event_key() {
        // Comma-separated and repeated -e, each with its own modifiers.
        let b = line_of(&["-e", "cycles:u,instructions:k", "-e", "r01c2:pp"]).unwrap();
        assert_eq!(
            b.append,
            "console=wire freq=1000 pmu=auto event=cycles:u,instructions:k,r01c2:pp"
        );
        assert_eq!(
            b.expect.events,
            [
                ("cycles:u".into(), Some((0, 0))),
                ("instructions:k".into(), Some((0, 1))),
                ("r01c2:pp".into(), Some((4, 0x01c2)))
            ]
        );
        // mem-loads' raw code is the appliance's driver's to choose.
        let b = line_of(&["-e", "mem-loads:pp,branches", "-c", "5000"]).unwrap();
        assert!(
            b.append
                .ends_with(" event=mem-loads:pp,branches period=5000"),
            "{}",
            b.append
        );
        assert_eq!(b.expect.events[0], ("mem-loads:pp".into(), None));
        // The simulated PMU takes any set its counters hold, checked here
        // against the same driver and simulator the appliance runs.
        let b = line_of(&["--pmu", "sim", "-e", "cycles:u,instructions:u"]).unwrap();
        assert_eq!(
            b.append,
            "console=wire freq=1000 pmu=sim event=cycles:u,instructions:u"
        );
        assert_eq!(b.expect, Expect::default(), "nothing left to check");
        let b = line_of(&["--pmu", "sim", "-e", "mem-loads:pp,cycles"]).unwrap();
        assert!(
            b.append.ends_with(" event=mem-loads:pp,cycles"),
            "{}",
            b.append
        );
        // Sapphire Rapids: 8 GP + 4 fixed counters; mem-loads:pp needs a
        // PEBS-capable GP counter and so do the :pp instructions (PEBS on a
        // fixed counter needs adaptive PEBS, which spr has).
        let nine = ["branches"; 9].join(",");
        let e = refusal(&["--pmu", "sim", "-e", &nine]);
        assert!(e.contains("at most 8 events"), "{e}");
        let eight = ["branches"; 8].join(",");
        assert!(line_of(&["--pmu", "sim", "-e", &eight]).is_ok());
        // Skylake has 4 GP counters: a fifth GP event does not fit.
        let five = ["branches"; 5].join(",");
        let e = refusal(&["--pmu", "sim", "--sim-cpu", "skl", "-e", &five]);
        assert!(
            e.starts_with(&format!(
                "The sys_perf_event_open() syscall returned with 95 (Operation not supported) for event ({five})."
            )) && e.contains("no free counter can count branches")
                && e.contains("counter constraints"),
            "{e}"
        );
        assert!(
            line_of(&[
                "--pmu",
                "sim",
                "--sim-cpu",
                "skl",
                "-e",
                &["branches"; 4].join(",")
            ])
            .is_ok()
        );
    }

    #[test]
    fn an_event_term_gives_it_its_own_period_or_frequency() {
        let b = line_of(&["-e", "cycles/period=100000/u,instructions", "-F", "500"]).unwrap();
        assert_eq!(
            b.append,
            "console=wire freq=500 pmu=auto event=cycles/period=100000/u,instructions"
        );
        assert_eq!(
            b.expect.events[0],
            ("cycles/period=100000/u".into(), Some((0, 0)))
        );
        let b = line_of(&["--pmu", "sim", "-e", "mem-loads/period=4/pp"]).unwrap();
        assert!(
            b.append.ends_with(" event=mem-loads/period=4/pp"),
            "{}",
            b.append
        );
        let e = refusal(&["--pmu", "sim", "-e", "cycles/freq=100/,instructions"]);
        assert!(
            e.contains("for event (cycles/freq=100/)") && e.contains("no frequency mode"),
            "{e}"
        );
        assert!(refusal(&["-e", "cycles/name=x/"]).contains("bad event term"));
        assert!(refusal(&["-e", "cpu-clock/period=5/"]).contains("no modifiers"));
    }

    #[test]
    fn a_set_the_appliance_could_not_program_is_refused_after_boot() {
        let b = line_of(&["-e", "cycles,instructions"]).unwrap();
        let mut two = hello(EventKind::Hardware, 0, 0);
        let mut second = two.events[0].clone();
        second.config = 1;
        second.id = 1;
        two.events.push(second);
        assert!(b.expect.check(&two).is_ok());
        // The driver refused the set and sampled cycles alone.
        let e = b
            .expect
            .check(&hello(EventKind::Hardware, 0, 0))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("for event (cycles,instructions)")
                && e.contains("cannot count these 2 events at once")
                && e.contains("sampled cycles instead"),
            "{e}"
        );
        // Or a different second event.
        two.events[1].config = 4;
        let e = b.expect.check(&two).unwrap_err().to_string();
        assert!(e.contains("for event (instructions)"), "{e}");
    }

    #[test]
    fn count_and_frequency() {
        let b = line_of(&["-F", "4000"]).unwrap();
        assert_eq!(b.append, "console=wire freq=4000 pmu=auto");
        let b = line_of(&["-c", "100000", "-e", "cycles"]).unwrap();
        assert_eq!(
            b.append,
            "console=wire freq=1000 pmu=auto event=cycles period=100000"
        );
        // On the NMI clock the period is ns, within the clock's rates.
        let b = line_of(&["--pmu", "off", "-c", "250000"]).unwrap();
        assert!(b.append.ends_with(" period=250000"), "{}", b.append);
        assert!(refusal(&["--pmu", "off", "-c", "999"]).contains("nanoseconds of cpu-clock"));
        assert!(refusal(&["-e", "cpu-clock", "--count", "60000000"]).contains("52631578"));
        assert!(line_of(&["--pmu", "off", "-c", "52631578"]).is_ok());
        let b = line_of(&["--pmu", "sim", "-c", "10"]).unwrap();
        assert_eq!(b.append, "console=wire freq=1000 pmu=sim period=10");
        // -c and -F exclude each other (clap), and -c 0 is no period.
        let mut cli = vec!["perch", "-c", "100", "-F", "200"];
        assert!(Cli::try_parse_from(&cli).is_err());
        cli.truncate(3);
        cli[2] = "0";
        assert!(Cli::try_parse_from(&cli).is_err());
    }

    #[test]
    fn call_graph_and_registers() {
        // Without the sample options: perch's default set (`sample=`).
        let b = line_of(&[]).unwrap();
        assert!(!b.append.contains("callchain="), "{}", b.append);
        let want = " callchain=fp uregs_mask=0x0 iregs_mask=0x0";
        assert!(line_of(&["-g"]).unwrap().append.ends_with(want));
        assert!(
            line_of(&["--call-graph", "fp"])
                .unwrap()
                .append
                .ends_with(want)
        );
        // AX, BX, IP, R15: bits 0, 1, 8, 23.
        let b = line_of(&["--user-regs=ax,BX,ip,r15"]).unwrap();
        assert!(
            b.append
                .ends_with(" callchain=no uregs_mask=0x800103 iregs_mask=0x0"),
            "{}",
            b.append
        );
        // Without a list: every general register.
        let b = line_of(&["-g", "--intr-regs"]).unwrap();
        assert!(
            b.append.ends_with(&format!(
                " callchain=fp uregs_mask=0x0 iregs_mask={GPR_MASK:#x}"
            )),
            "{}",
            b.append
        );
        let b = line_of(&["-I=sp,flags,cs,ss", "--user-regs=r8"]).unwrap();
        // SP 7, FLAGS 9, CS 10, SS 11; R8 16.
        assert!(
            b.append
                .ends_with(" callchain=no uregs_mask=0x10000 iregs_mask=0xe80"),
            "{}",
            b.append
        );
        assert!(refusal(&["--call-graph", "dwarf"]).contains("STACK_USER"));
        assert!(refusal(&["--call-graph", "lbr"]).contains("call-stack"));
        assert!(
            refusal(&["--call-graph", "fpx"]).contains("Unknown --call-graph option value: fpx")
        );
        let e = refusal(&["--user-regs=ax,eax"]);
        assert!(e.starts_with("Unknown register \"eax\""), "{e}");
        assert!(refusal(&["--user-regs=?"]).starts_with("available registers: AX BX"));
        let e = refusal(&["--intr-regs=ax,gs"]);
        assert!(
            e.contains("returned with 22 (Invalid argument) for event (cycles)"),
            "{e}"
        );
        let e = refusal(&["--pmu", "off", "--user-regs=es"]);
        assert!(e.contains("for event (cpu-clock)"), "{e}");
    }

    #[test]
    fn branch_stacks() {
        let b = line_of(&["--pmu", "sim", "-b"]).unwrap();
        assert_eq!(b.append, "console=wire freq=1000 pmu=sim branch=0x8");
        assert!(!b.expect.branches, "sim has an LBR: nothing to check");
        let b = line_of(&["--pmu", "sim", "-j", "any_call,u"]).unwrap();
        assert!(b.append.ends_with(" branch=0x11"), "{}", b.append);
        let b = line_of(&["--pmu", "sim", "-j", "ind_call,cond,ind_jmp,call,any_ret,k"]).unwrap();
        assert!(b.append.ends_with(" branch=0x3462"), "{}", b.append);
        // A mode alone records every branch in it, as perf does.
        let b = line_of(&["-j", "k"]).unwrap();
        assert!(b.append.ends_with(" branch=0xa"), "{}", b.append);
        assert!(b.expect.branches);
        let e = refusal(&["--pmu", "off", "-b"]);
        assert!(
            e.starts_with(
                "cpu-clock: PMU Hardware or event type doesn't support branch stack sampling."
            ),
            "{e}"
        );
        assert!(refusal(&["-e", "cpu-clock", "-j", "any"]).contains("branch stack sampling"));
        assert!(
            refusal(&["--pmu", "sim", "-j", "abort_tx"]).contains("-j abort_tx: not supported")
        );
        assert!(
            refusal(&["--pmu", "sim", "-j", "anything"]).contains("unknown branch filter anything")
        );
        assert!(Cli::try_parse_from(["perch", "-b", "-j", "any"]).is_err());
    }

    /// A Hello from a runtime that sampled `kind` / `config`, with
    /// `sample_type`.
    fn hello(kind: EventKind, config: u64, sample_type: u64) -> Hello {
        let mut h = Hello::for_test(
            crate::model::EventSource::Pmu,
            crate::model::EventInfo {
                config,
                sample_type,
                max_stack: 127,
                ..crate::model::EventInfo::for_test(kind)
            },
        );
        h.protocol_version = 0;
        h
    }

    #[test]
    fn the_hello_must_show_what_auto_could_not_promise() {
        let b = line_of(&["-e", "instructions", "-b"]).unwrap();
        let e = &b.expect;
        assert!(
            e.check(&hello(EventKind::Hardware, 1, st::BRANCH_STACK))
                .is_ok()
        );
        let fell_back = e
            .check(&hello(EventKind::CpuClock, 0, 0))
            .unwrap_err()
            .to_string();
        assert!(
            fell_back.contains("for event (instructions)") && fell_back.contains("NMI clock"),
            "{fell_back}"
        );
        let other = e
            .check(&hello(EventKind::Hardware, 0, st::BRANCH_STACK))
            .unwrap_err();
        assert!(other.to_string().contains("refused it"), "{other}");
        let no_lbr = e.check(&hello(EventKind::Hardware, 1, 0)).unwrap_err();
        assert!(
            no_lbr.to_string().contains("branch stack sampling"),
            "{no_lbr}"
        );
        // Without -e / -b / -j any source will do.
        let plain = line_of(&[]).unwrap().expect;
        assert!(plain.check(&hello(EventKind::CpuClock, 0, 0)).is_ok());
        // -c alone: on the PMU any period; on the NMI clock one it can tick at.
        let c = line_of(&["-c", "10000000000"]).unwrap().expect;
        assert_eq!(c.clock_period, Some(10_000_000_000));
        assert!(c.check(&hello(EventKind::Hardware, 0, 0)).is_ok());
        let e = c.check(&hello(EventKind::CpuClock, 0, 0)).unwrap_err();
        assert!(e.to_string().contains("nanoseconds of cpu-clock"), "{e}");
        let ok = line_of(&["-c", "1000000"]).unwrap().expect;
        assert!(ok.check(&hello(EventKind::CpuClock, 0, 0)).is_ok());
        // With -e the fallback itself is the refusal.
        assert_eq!(
            line_of(&["-e", "cycles", "-c", "10"])
                .unwrap()
                .expect
                .clock_period,
            None
        );
    }

    #[test]
    fn sim_cpu_needs_pmu_sim() {
        assert!(args(&["--sim-cpu", "icl"]).boot_line(true).is_err());
        let b = args(&["--pmu", "sim", "--sim-cpu", "icl", "--ring", "64"])
            .boot_line(true)
            .unwrap();
        assert_eq!(b.append, "console=wire freq=1000 pmu=sim ring=64 sim=icl");
    }

    #[test]
    fn cpus_is_one_to_64_and_only_for_a_boot() {
        assert_eq!(args(&["--", "p"]).cpus, None);
        assert_eq!(args(&["--cpus", "1", "--", "p"]).cpus, Some(1));
        assert_eq!(args(&["--cpus", "64", "--", "p"]).cpus, Some(64));
        // The runtime's command line is the same: QEMU's -smp gives the CPUs.
        assert_eq!(
            args(&["--cpus", "4"]).boot_line(true).unwrap().append,
            args(&[]).boot_line(true).unwrap().append
        );
        let refused = |line: &[&str]| {
            let mut argv = vec!["perch"];
            argv.extend_from_slice(line);
            match Cli::try_parse_from(argv) {
                Ok(_) => panic!("{line:?} parsed"),
                Err(e) => e.to_string(),
            }
        };
        for v in ["0", "65", "x"] {
            let e = refused(&["--cpus", v]);
            assert!(e.contains("--cpus"), "{v}: {e}");
        }
        for other in [["--input", "c.bin"], ["--serial", "/dev/ttyS0"]] {
            let e = refused(&["--cpus", "2", other[0], other[1]]);
            assert!(e.contains("--cpus") && e.contains(other[0]), "{e}");
        }
    }
}
