//! The runtime's command line (`selftest freq=4000 pmu=auto ...`), parsed
//! once at boot into a [`Config`].
//!
//! Keys are separated by spaces and are either `key` or `key=value`. Unknown
//! keys and malformed values are reported through a callback and otherwise
//! ignored, so a typo never stops the appliance from booting.

use arch_x86::pmu::events::{self, Event, EventError, EventSampling};

/// Default NMI rate in Hz when `freq=` is not given.
pub const DEFAULT_FREQ_HZ: u32 = 4000;
/// Highest NMI rate accepted from `freq=`.
pub const MAX_FREQ_HZ: u32 = 1_000_000;
/// `max_rate=` default: perf's `perf_event_max_sample_rate`.
pub const DEFAULT_MAX_RATE: u32 = 100_000;
/// `cpu_pct=` default: perf's `perf_cpu_time_max_percent`.
pub const DEFAULT_CPU_PCT: u32 = 25;

/// Most events one run samples (one counter each): the wire's
/// `sampler::wire::MAX_EVENTS`.
pub const MAX_EVENTS: usize = 8;

/// The events of `event=`, in order (their index is each sample's event
/// index on the wire).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventList {
    list: [Event; MAX_EVENTS],
    sampling: [Option<EventSampling>; MAX_EVENTS],
    len: u8,
}

impl EventList {
    /// No event.
    pub const EMPTY: EventList = EventList {
        list: [Event::new(events::EventKind::Cycles); MAX_EVENTS],
        sampling: [None; MAX_EVENTS],
        len: 0,
    };

    /// A comma-separated list of event specs (`events::parse_spec` each:
    /// `NAME[:MODS]` or `NAME/period=N/MODS`, `NAME/freq=N/MODS`); more
    /// than [`MAX_EVENTS`], or an empty one, is refused.
    pub fn parse(v: &str) -> Result<EventList, EventError> {
        let mut l = EventList::EMPTY;
        for spec in events::split_list(v) {
            let (e, sampling) = events::parse_spec(spec)?;
            let i = usize::from(l.len);
            if !l.push(e) {
                return Err(EventError::TooMany);
            }
            l.sampling[i] = sampling;
        }
        Ok(l)
    }

    /// Event `i`'s own sampling (its `/period=N/` or `/freq=N/` term), if any.
    pub fn sampling(&self, i: usize) -> Option<EventSampling> {
        self.sampling.get(i).copied().flatten()
    }

    /// A list of `events` (at most [`MAX_EVENTS`]; the rest are dropped).
    pub fn of(events: &[Event]) -> EventList {
        let mut l = EventList::EMPTY;
        for e in events {
            l.push(*e);
        }
        l
    }

    /// Appends `e`; false when the list is full.
    pub fn push(&mut self, e: Event) -> bool {
        let Some(slot) = self.list.get_mut(usize::from(self.len)) else {
            return false;
        };
        *slot = e;
        self.len += 1;
        true
    }

    /// The events, in order.
    pub fn as_slice(&self) -> &[Event] {
        &self.list[..usize::from(self.len)]
    }

    /// The first event, if any.
    pub fn first(&self) -> Option<Event> {
        self.as_slice().first().copied()
    }

    /// True without events.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Which overflow source the runtime should use (`pmu=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PmuMode {
    /// Use the hardware PMU when CPUID reports one, else the NMI clock.
    Auto,
    /// Use the simulated PMU (testing only; marked as simulated downstream).
    Sim,
    /// Never touch the PMU; use the NMI clock.
    Off,
}

/// What COM1 carries (`console=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConsoleMode {
    /// Plain text lines.
    Text,
    /// The framed record stream; text is wrapped as log records.
    Wire,
}

/// A runtime fault to provoke after boot (`crash=`), to test crash reporting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashKind {
    /// A page fault in the runtime (`crash=pf`).
    PageFault,
    /// An invalid opcode in the runtime (`crash=ud`).
    InvalidOpcode,
    /// A Rust panic in the runtime (`crash=panic`).
    Panic,
    /// A page fault while pushing onto an unmapped stack, which escalates to
    /// a double fault taken on its IST stack (`crash=df`).
    DoubleFault,
    /// A runtime read of appliance memory without `stac`, which SMAP
    /// refuses (`crash=smap`; only faults where CPUID reports SMAP).
    Smap,
}

/// Which fields each sample carries (`sample=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SampleFields {
    /// IP, TID, TIME, CPU, PERIOD, REGS_USER, CALLCHAIN.
    #[default]
    Default,
    /// The default plus REGS_INTR.
    Full,
    /// Neither registers nor callchain.
    Minimal,
}

/// The CPU `pmu=sim` simulates (`sim=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SimModel {
    /// Sapphire-Rapids-like: adaptive PEBS format 5, architectural LBR.
    #[default]
    SapphireRapids,
    /// Ice-Lake-like: adaptive PEBS format 4, legacy LBR.
    IceLake,
    /// Skylake-like: PEBS format 3, legacy LBR with INFO.
    Skylake,
}

/// Where a sample's user registers come from when the NMI interrupted the
/// runtime (`uregs=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UserRegsAt {
    /// In the NMI: the process's user frame saved at entry (ABI_NONE inside
    /// an entry or exit window).
    #[default]
    Nmi,
    /// At the process's next return to user mode: the frame it restores.
    Return,
}

/// What ticks the NMI clock (`clock=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ClockSource {
    /// The HPET where one answers (its comparator is moved on the schedule
    /// at each NMI, so a late tick is caught up), else the PIT.
    #[default]
    Auto,
    /// The PIT's channel 0 (periodic; above its 596 kHz limit the HPET).
    Pit,
    /// The HPET's timer 0 (fails without an HPET).
    Hpet,
}

/// How the NMI clock's ticks reach the CPUs when threads run on several
/// (`fanout=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ClockFanout {
    /// The I/O APIC delivers each tick to every CPU at once (its physical
    /// broadcast).
    #[default]
    Ioapic,
    /// The I/O APIC delivers each tick to the boot CPU, which forwards it
    /// to every other CPU as an NMI IPI.
    Ipi,
}

/// Which device carries the record stream (`transport=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TransportChoice {
    /// A virtio console where one answers (PCI, or MMIO on microvm),
    /// else COM1's 16550.
    #[default]
    Auto,
    /// COM1's 16550 even when a virtio console is present.
    Uart,
    /// A virtio console; without one the stream stays on the 16550 and
    /// the boot log says why.
    Virtio,
}

/// How the network interface gets its address (`net=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NetMode {
    /// From a DHCP server (QEMU's user network has one).
    #[default]
    Dhcp,
    /// This address and prefix, with a default route through `gateway`
    /// when one is given.
    Static {
        /// The interface's IPv4 address.
        addr: [u8; 4],
        /// The network prefix length, 1 to 32.
        prefix: u8,
        /// The default gateway.
        gateway: Option<[u8; 4]>,
    },
    /// No network even when a virtio-net device is present.
    Off,
}

/// The network's configuration (`net=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetConfig {
    /// Where the address comes from.
    pub mode: NetMode,
    /// `echo`: answer UDP datagrams on port 7 with the same bytes.
    pub echo: bool,
}

/// Why a `net=` value was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetError {
    /// Nothing after `net=`.
    Empty,
    /// The first item is neither `dhcp`, `off` nor `ADDR/PREFIX`.
    BadMode,
    /// An address that is not four decimal octets.
    BadAddress,
    /// `ADDR` without `/PREFIX`.
    NoPrefix,
    /// A prefix that is not 1 to 32.
    BadPrefix,
    /// An item after the first that is neither `gw=ADDR` nor `echo`.
    UnknownItem,
    /// `gw=` with `dhcp` or `off` (the server gives the gateway).
    GatewayWithoutAddress,
    /// `gw=` given twice.
    TwoGateways,
    /// A gateway outside the address's network.
    GatewayOffNetwork,
    /// `echo` with `off`.
    EchoWithoutNetwork,
}

impl core::fmt::Display for NetError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            NetError::Empty => "empty",
            NetError::BadMode => "the first item must be dhcp, off or ADDR/PREFIX",
            NetError::BadAddress => "an address must be four decimal octets (10.0.2.15)",
            NetError::NoPrefix => "the address needs a prefix length (10.0.2.15/24)",
            NetError::BadPrefix => "the prefix length must be 1 to 32",
            NetError::UnknownItem => "items after the first are gw=ADDR and echo",
            NetError::GatewayWithoutAddress => "gw= goes with a static address, not dhcp or off",
            NetError::TwoGateways => "gw= given twice",
            NetError::GatewayOffNetwork => "the gateway is outside the address's network",
            NetError::EchoWithoutNetwork => "echo needs a network (not off)",
        })
    }
}

/// Parses four decimal octets.
pub fn parse_ipv4(s: &str) -> Option<[u8; 4]> {
    let mut out = [0u8; 4];
    let mut parts = s.split('.');
    for o in &mut out {
        let p = parts.next()?;
        // No signs, no empty octets, no leading zeros that read as octal
        // elsewhere.
        if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        if p.len() > 1 && p.starts_with('0') {
            return None;
        }
        *o = p.parse().ok()?;
    }
    parts.next().is_none().then_some(out)
}

impl NetConfig {
    /// Parses a `net=` value: `dhcp`, `off` or `ADDR/PREFIX`, then
    /// `gw=ADDR` (with a static address) and `echo`, comma-separated.
    pub fn parse(v: &str) -> Result<NetConfig, NetError> {
        if v.is_empty() {
            return Err(NetError::Empty);
        }
        let mut items = v.split(',');
        let first = items.next().unwrap_or("");
        let mut mode = match first {
            "dhcp" => NetMode::Dhcp,
            "off" => NetMode::Off,
            _ => {
                let Some((a, p)) = first.split_once('/') else {
                    return Err(if parse_ipv4(first).is_some() {
                        NetError::NoPrefix
                    } else if first.contains('.') {
                        NetError::BadAddress
                    } else {
                        NetError::BadMode
                    });
                };
                let addr = parse_ipv4(a).ok_or(NetError::BadAddress)?;
                let prefix = match p.parse::<u8>() {
                    Ok(n) if (1..=32).contains(&n) && !p.starts_with('+') => n,
                    _ => return Err(NetError::BadPrefix),
                };
                NetMode::Static {
                    addr,
                    prefix,
                    gateway: None,
                }
            }
        };
        let mut echo = false;
        for item in items {
            if item == "echo" {
                echo = true;
                continue;
            }
            let Some(gw) = item.strip_prefix("gw=") else {
                return Err(NetError::UnknownItem);
            };
            let gw = parse_ipv4(gw).ok_or(NetError::BadAddress)?;
            match &mut mode {
                NetMode::Static {
                    addr,
                    prefix,
                    gateway,
                } => {
                    if gateway.is_some() {
                        return Err(NetError::TwoGateways);
                    }
                    let mask = u32::MAX << (32 - u32::from(*prefix));
                    if u32::from_be_bytes(*addr) & mask != u32::from_be_bytes(gw) & mask {
                        return Err(NetError::GatewayOffNetwork);
                    }
                    *gateway = Some(gw);
                }
                _ => return Err(NetError::GatewayWithoutAddress),
            }
        }
        if echo && mode == NetMode::Off {
            return Err(NetError::EchoWithoutNetwork);
        }
        Ok(NetConfig { mode, echo })
    }
}

/// Largest flight-recorder buffer (`buffer=MiB`).
pub const MAX_BUFFER_MIB: u32 = 4096;
/// The largest `wire_group=` (the wire's own limit).
pub const MAX_WIRE_GROUP: u32 = 65_536;
/// Samples per group when the command line does not say (`wire_group=`):
/// about 2.7 times fewer bytes per default sample than a frame each, at
/// a little over half the drain's cost, and at most a group's rest lost
/// to a damaged frame.
pub const DEFAULT_WIRE_GROUP: u32 = 256;

/// Where threads run (`sched=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Sched {
    /// Each new thread or process on the CPU with the fewest threads that
    /// have not ended (the self-test places its tasks itself).
    #[default]
    Spread,
    /// Every thread on the boot CPU.
    Boot,
}

/// The parsed kernel command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// `selftest`: run the on-target self-test instead of the appliance.
    pub selftest: bool,
    /// `freq=HZ`: NMI clock rate.
    pub freq_hz: u32,
    /// `pmu=auto|sim|off`.
    pub pmu: PmuMode,
    /// `console=text|wire`; `None` when not given (the runtime picks).
    pub console: Option<ConsoleMode>,
    /// `ring=N`: cap on usable ring slots.
    pub ring_slots: Option<u32>,
    /// `duration=MS`: length of a profiling run.
    pub duration_ms: Option<u64>,
    /// `crash=pf|ud|df|smap|panic`: provoke a runtime fault after boot.
    pub crash: Option<CrashKind>,
    /// `event=NAME[:mods][,NAME[:mods]...]`: the events to sample with a
    /// PMU (`pmu=auto`, `pmu=sim`), one counter each; empty: cycles
    /// (`pmu=sim`: precise mem-loads).
    pub events: EventList,
    /// `max_rate=N`: samples per second one event may take before it is
    /// throttled (`perf_event_max_sample_rate`); 0: no limit.
    pub max_rate: u32,
    /// `cpu_pct=N`: the share of CPU time the NMI handler may take on
    /// average before the rate is lowered (`perf_cpu_time_max_percent`);
    /// 0: no CPU-time budget.
    pub cpu_pct: u32,
    /// `sample=default|full|minimal`.
    pub sample: SampleFields,
    /// `slice=MS`: a process's time slice; `None`: the scheduler's default.
    pub slice_ms: Option<u32>,
    /// `smp=N`: start at most N CPUs (the boot CPU counts); `None`: every
    /// CPU the ACPI MADT lists, up to [`MAX_CPUS`].
    pub smp: Option<u32>,
    /// `sched=spread|boot`: where threads run.
    pub sched: Sched,
    /// `sim=spr|icl|skl`: the CPU `pmu=sim` simulates.
    pub sim: SimModel,
    /// `uregs=nmi|return`: where user registers of runtime samples come from.
    pub uregs: UserRegsAt,
    /// `period=N`: a sample every N events (`perf record -c`); on the NMI
    /// clock N is nanoseconds of cpu-clock and sets the clock's rate
    /// instead of `freq=` ([`Config::clock_hz`]).
    pub period: Option<u64>,
    /// `callchain=fp|no`: whether samples carry a frame-pointer call chain
    /// (`perf record -g`); `None`: as `sample=` says.
    pub callchain: Option<bool>,
    /// `uregs_mask=HEX`: the user registers each sample carries
    /// (`sample_regs_user`, perf's x86 register bits; 0: none); `None`: as
    /// `sample=` says.
    pub uregs_mask: Option<u64>,
    /// `iregs_mask=HEX`: the interrupted registers each sample carries
    /// (`sample_regs_intr`; 0: none); `None`: as `sample=` and the PMU say.
    pub iregs_mask: Option<u64>,
    /// `branch=HEX`: perf's `branch_sample_type` for the LBR (`perf record
    /// -b` / `-j`); `None`: every branch, both modes, where there is an LBR.
    pub branch: Option<u64>,
    /// `clock=auto|pit|hpet`: what ticks the NMI clock.
    pub clock: ClockSource,
    /// `fanout=ioapic|ipi`: how its ticks reach every CPU.
    pub fanout: ClockFanout,
    /// `transport=auto|uart|virtio`: the device the record stream goes to.
    pub transport: TransportChoice,
    /// `buffer=MiB`: a RAM buffer of encoded frames between the drain and
    /// the transport (the flight recorder); `None` or 0: frames are written
    /// straight to the transport.
    pub buffer_mib: Option<u32>,
    /// `wire_group=N`: samples go on the wire in groups of `N` (1 to
    /// 65536, default [`DEFAULT_WIRE_GROUP`]), coded against context that
    /// spans the group; 0 sends each sample in a frame of its own.
    pub wire_group: u32,
    /// `net=dhcp|off|ADDR/PREFIX[,gw=GW][,echo]`: how a virtio-net
    /// device, when one is present, gets its address.
    pub net: NetConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            selftest: false,
            freq_hz: DEFAULT_FREQ_HZ,
            pmu: PmuMode::Auto,
            console: None,
            ring_slots: None,
            duration_ms: None,
            crash: None,
            events: EventList::EMPTY,
            max_rate: DEFAULT_MAX_RATE,
            cpu_pct: DEFAULT_CPU_PCT,
            sample: SampleFields::Default,
            slice_ms: None,
            smp: None,
            sched: Sched::Spread,
            sim: SimModel::SapphireRapids,
            uregs: UserRegsAt::Nmi,
            period: None,
            callchain: None,
            uregs_mask: None,
            iregs_mask: None,
            branch: None,
            clock: ClockSource::Auto,
            fanout: ClockFanout::Ioapic,
            transport: TransportChoice::Auto,
            buffer_mib: None,
            wire_group: DEFAULT_WIRE_GROUP,
            net: NetConfig {
                mode: NetMode::Dhcp,
                echo: false,
            },
        }
    }
}

impl Config {
    /// The console mode in force: the explicit `console=` value, else text.
    pub fn console_mode(&self) -> ConsoleMode {
        self.console.unwrap_or(ConsoleMode::Text)
    }

    /// The NMI clock's rate in Hz: `freq=`, or with `period=NS` the rate
    /// of one tick per period (at least 1 Hz, at most [`MAX_FREQ_HZ`]) when
    /// the clock is what samples (not `pmu=sim`, whose period counts the
    /// simulated loads the clock's ticks drive).
    pub fn clock_hz(&self) -> u32 {
        match self.period {
            Some(ns) if self.pmu != PmuMode::Sim => {
                (1_000_000_000 / ns.max(1)).clamp(1, u64::from(MAX_FREQ_HZ)) as u32
            }
            _ => self.freq_hz,
        }
    }
}

/// Register bits `uregs_mask=` / `iregs_mask=` may set: perf's x86-64
/// registers AX to R15 (bits 0 to 23) without DS, ES, FS and GS (bits 12
/// to 15, which x86-64 Linux refuses too); XMM registers are not sampled.
pub const REGS_MASK_ALLOWED: u64 = ((1 << 24) - 1) & !(0xf << 12);

/// `branch_sample_type` bits `branch=` may set: USER, KERNEL, ANY,
/// ANY_CALL, ANY_RETURN, IND_CALL, COND, IND_JUMP and CALL (the classes
/// the LBR filter has).
pub const BRANCH_ALLOWED: u64 =
    1 << 0 | 1 << 1 | 1 << 3 | 1 << 4 | 1 << 5 | 1 << 6 | 1 << 10 | 1 << 12 | 1 << 13;

/// The most CPUs the runtime starts (`smp=`).
pub const MAX_CPUS: u32 = 64;

/// A hexadecimal number, with or without `0x`.
fn parse_hex(v: &str) -> Option<u64> {
    let digits = v
        .strip_prefix("0x")
        .or_else(|| v.strip_prefix("0X"))
        .unwrap_or(v);
    if digits.is_empty() || digits.len() > 16 {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

/// A problem found while parsing; the offending item is ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Issue<'a> {
    /// A key this runtime does not know.
    UnknownKey(&'a str),
    /// A known key with a value that does not parse or is out of range.
    BadValue {
        /// The key.
        key: &'a str,
        /// The rejected value (empty when the value was missing).
        value: &'a str,
        /// What was expected.
        expected: &'static str,
    },
    /// An `event=` value the event table refuses; the PMU samples cycles
    /// (an earlier `event=` is dropped too).
    BadEvent {
        /// The rejected value.
        value: &'a str,
        /// Why it was refused.
        error: EventError,
    },
    /// A `net=` value that does not parse; the network keeps DHCP.
    BadNet {
        /// The rejected value.
        value: &'a str,
        /// Why it was refused.
        error: NetError,
    },
}

impl core::fmt::Display for Issue<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Issue::UnknownKey(k) => write!(f, "unknown command-line key `{k}` ignored"),
            Issue::BadValue {
                key,
                value,
                expected,
            } => write!(
                f,
                "bad value `{value}` for `{key}` ignored (expected {expected})"
            ),
            Issue::BadEvent { value, error } => write!(
                f,
                "bad value `{value}` for `event` ignored: {error}; the PMU samples cycles"
            ),
            Issue::BadNet { value, error } => write!(
                f,
                "bad value `{value}` for `net` ignored: {error}; the network uses DHCP"
            ),
        }
    }
}

/// Parses `line`, reporting every ignored item through `on_issue`.
pub fn parse<'a>(line: &'a str, mut on_issue: impl FnMut(Issue<'a>)) -> Config {
    let mut cfg = Config::default();
    for item in line.split_ascii_whitespace() {
        let (key, value) = match item.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (item, None),
        };
        let mut bad = |expected: &'static str| {
            on_issue(Issue::BadValue {
                key,
                value: value.unwrap_or(""),
                expected,
            })
        };
        match key {
            "selftest" => match value {
                None | Some("1") | Some("on") => cfg.selftest = true,
                Some("0") | Some("off") => cfg.selftest = false,
                Some(_) => bad("no value, on or off"),
            },
            "freq" => match value.and_then(|v| v.parse::<u32>().ok()) {
                Some(hz) if (1..=MAX_FREQ_HZ).contains(&hz) => cfg.freq_hz = hz,
                _ => bad("a rate in Hz from 1 to 1000000"),
            },
            "pmu" => match value {
                Some("auto") => cfg.pmu = PmuMode::Auto,
                Some("sim") => cfg.pmu = PmuMode::Sim,
                Some("off") => cfg.pmu = PmuMode::Off,
                _ => bad("auto, sim or off"),
            },
            "console" => match value {
                Some("text") => cfg.console = Some(ConsoleMode::Text),
                Some("wire") => cfg.console = Some(ConsoleMode::Wire),
                _ => bad("text or wire"),
            },
            "ring" => match value.and_then(|v| v.parse::<u32>().ok()) {
                Some(n) if n.is_power_of_two() => cfg.ring_slots = Some(n),
                _ => bad("a slot count that is a power of two (1, 2, 4, ... 256)"),
            },
            "duration" => match value.and_then(|v| v.parse::<u64>().ok()) {
                Some(ms) if ms > 0 => cfg.duration_ms = Some(ms),
                _ => bad("milliseconds above 0"),
            },
            "crash" => match value {
                Some("pf") => cfg.crash = Some(CrashKind::PageFault),
                Some("ud") => cfg.crash = Some(CrashKind::InvalidOpcode),
                Some("panic") => cfg.crash = Some(CrashKind::Panic),
                Some("df") => cfg.crash = Some(CrashKind::DoubleFault),
                Some("smap") => cfg.crash = Some(CrashKind::Smap),
                _ => bad("pf, ud, df, smap or panic"),
            },
            "max_rate" => match value.and_then(|v| v.parse::<u32>().ok()) {
                Some(n) => cfg.max_rate = n,
                None => bad("samples per second (0: no limit)"),
            },
            "cpu_pct" => match value.and_then(|v| v.parse::<u32>().ok()) {
                Some(n) if n <= 100 => cfg.cpu_pct = n,
                _ => bad("a percentage from 0 (no budget) to 100"),
            },
            "sample" => match value {
                Some("default") => cfg.sample = SampleFields::Default,
                Some("full") => cfg.sample = SampleFields::Full,
                Some("minimal") => cfg.sample = SampleFields::Minimal,
                _ => bad("default, full or minimal"),
            },
            "slice" => match value.and_then(|v| v.parse::<u32>().ok()) {
                Some(ms) if (1..=10_000).contains(&ms) => cfg.slice_ms = Some(ms),
                _ => bad("milliseconds from 1 to 10000"),
            },
            "sched" => match value {
                Some("spread") => cfg.sched = Sched::Spread,
                Some("boot") => cfg.sched = Sched::Boot,
                _ => bad("spread or boot"),
            },
            "smp" => match value.and_then(|v| v.parse::<u32>().ok()) {
                Some(n) if (1..=MAX_CPUS).contains(&n) => cfg.smp = Some(n),
                _ => bad("a number of CPUs from 1 to 64"),
            },
            "sim" => match value {
                Some("spr") | Some("sapphire-rapids") => cfg.sim = SimModel::SapphireRapids,
                Some("icl") | Some("ice-lake") => cfg.sim = SimModel::IceLake,
                Some("skl") | Some("skylake") => cfg.sim = SimModel::Skylake,
                _ => bad("spr, icl or skl"),
            },
            "uregs" => match value {
                Some("nmi") => cfg.uregs = UserRegsAt::Nmi,
                Some("return") => cfg.uregs = UserRegsAt::Return,
                _ => bad("nmi or return"),
            },
            "clock" => match value {
                Some("auto") => cfg.clock = ClockSource::Auto,
                Some("pit") => cfg.clock = ClockSource::Pit,
                Some("hpet") => cfg.clock = ClockSource::Hpet,
                _ => bad("auto, pit or hpet"),
            },
            "fanout" => match value {
                Some("ioapic") => cfg.fanout = ClockFanout::Ioapic,
                Some("ipi") => cfg.fanout = ClockFanout::Ipi,
                _ => bad("ioapic or ipi"),
            },
            "transport" => match value {
                Some("auto") => cfg.transport = TransportChoice::Auto,
                Some("uart") => cfg.transport = TransportChoice::Uart,
                Some("virtio") => cfg.transport = TransportChoice::Virtio,
                _ => bad("auto, uart or virtio"),
            },
            "buffer" => match value.and_then(|v| v.parse::<u32>().ok()) {
                Some(n) if n <= MAX_BUFFER_MIB => cfg.buffer_mib = (n > 0).then_some(n),
                _ => bad("MiB of RAM from 0 (no buffer) to 4096"),
            },
            "wire_group" => match value.and_then(|v| v.parse::<u32>().ok()) {
                Some(n) if n <= MAX_WIRE_GROUP => cfg.wire_group = n,
                _ => bad("samples per group from 0 (a frame per sample) to 65536"),
            },
            "period" => match value.and_then(|v| v.parse::<u64>().ok()) {
                Some(n) if n > 0 => cfg.period = Some(n),
                _ => bad("an event count above 0"),
            },
            "callchain" => match value {
                Some("fp") => cfg.callchain = Some(true),
                Some("no") => cfg.callchain = Some(false),
                _ => bad("fp or no"),
            },
            "uregs_mask" => match value.and_then(parse_hex) {
                Some(m) if m & !REGS_MASK_ALLOWED == 0 => cfg.uregs_mask = Some(m),
                _ => bad("a hex mask of perf's x86-64 registers (within 0xff0fff)"),
            },
            "iregs_mask" => match value.and_then(parse_hex) {
                Some(m) if m & !REGS_MASK_ALLOWED == 0 => cfg.iregs_mask = Some(m),
                _ => bad("a hex mask of perf's x86-64 registers (within 0xff0fff)"),
            },
            "branch" => match value.and_then(parse_hex) {
                Some(b) if b & !BRANCH_ALLOWED == 0 && b & !0b11 != 0 => cfg.branch = Some(b),
                _ => bad("a hex branch_sample_type with a branch class (any, any_call, ...)"),
            },
            "event" => match value.map(|v| (v, EventList::parse(v))) {
                Some((_, Ok(l))) => cfg.events = l,
                Some((v, Err(error))) => {
                    cfg.events = EventList::EMPTY;
                    on_issue(Issue::BadEvent { value: v, error })
                }
                None => {
                    cfg.events = EventList::EMPTY;
                    bad("an event name, e.g. cycles, instructions:u, r01c2 or mem-loads:pp");
                }
            },
            "net" => match NetConfig::parse(value.unwrap_or("")) {
                Ok(n) => cfg.net = n,
                Err(error) => {
                    cfg.net = NetConfig::default();
                    on_issue(Issue::BadNet {
                        value: value.unwrap_or(""),
                        error,
                    })
                }
            },
            _ => on_issue(Issue::UnknownKey(key)),
        }
    }
    cfg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_values() {
        assert_eq!(parse_all("").0.net, NetConfig::default());
        assert_eq!(NetConfig::default().mode, NetMode::Dhcp);
        assert_eq!(parse_all("net=off").0.net.mode, NetMode::Off);
        let (cfg, issues) = parse_all("net=dhcp,echo");
        assert!(issues.is_empty(), "{issues:?}");
        assert_eq!(
            cfg.net,
            NetConfig {
                mode: NetMode::Dhcp,
                echo: true
            }
        );
        let (cfg, issues) = parse_all("net=10.0.2.20/24,gw=10.0.2.2");
        assert!(issues.is_empty(), "{issues:?}");
        assert_eq!(
            cfg.net.mode,
            NetMode::Static {
                addr: [10, 0, 2, 20],
                prefix: 24,
                gateway: Some([10, 0, 2, 2])
            }
        );
        assert!(!cfg.net.echo);
        assert_eq!(
            NetConfig::parse("192.168.7.1/32,echo").map(|n| n.mode),
            Ok(NetMode::Static {
                addr: [192, 168, 7, 1],
                prefix: 32,
                gateway: None
            })
        );
        for (v, e) in [
            ("", NetError::Empty),
            ("static", NetError::BadMode),
            ("10.0.2.20", NetError::NoPrefix),
            ("10.0.2/24", NetError::BadAddress),
            ("10.0.2.256/24", NetError::BadAddress),
            ("10.0.2.-1/24", NetError::BadAddress),
            ("10.0.2.010/24", NetError::BadAddress),
            ("10.0.2.1.5/24", NetError::BadAddress),
            ("10.0.2.20/0", NetError::BadPrefix),
            ("10.0.2.20/33", NetError::BadPrefix),
            ("10.0.2.20/+8", NetError::BadPrefix),
            ("10.0.2.20/", NetError::BadPrefix),
            ("10.0.2.20/24,gw=10.0.3.2", NetError::GatewayOffNetwork),
            ("10.0.2.20/24,gw=10.0.2", NetError::BadAddress),
            (
                "10.0.2.20/24,gw=10.0.2.2,gw=10.0.2.3",
                NetError::TwoGateways,
            ),
            ("10.0.2.20/24,mtu=1500", NetError::UnknownItem),
            ("10.0.2.20/24,", NetError::UnknownItem),
            ("dhcp,gw=10.0.2.2", NetError::GatewayWithoutAddress),
            ("off,echo", NetError::EchoWithoutNetwork),
        ] {
            assert_eq!(NetConfig::parse(v), Err(e), "net={v}");
        }
        // A bad value is reported with its reason and leaves DHCP.
        let (cfg, issues) = parse_all("net=off net=10.0.2.20/40");
        assert_eq!(cfg.net, NetConfig::default());
        assert_eq!(
            issues,
            [
                "bad value `10.0.2.20/40` for `net` ignored: the prefix length must be 1 to 32; the network uses DHCP"
            ]
        );
        let (_, issues) = parse_all("net");
        assert_eq!(issues.len(), 1);
        assert!(issues[0].contains("for `net` ignored: empty"), "{issues:?}");
    }

    fn parse_all(line: &str) -> (Config, Vec<String>) {
        let mut issues = Vec::new();
        let cfg = parse(line, |i| issues.push(i.to_string()));
        (cfg, issues)
    }

    #[test]
    fn empty_line_gives_defaults() {
        let (cfg, issues) = parse_all("   ");
        assert_eq!(cfg, Config::default());
        assert!(issues.is_empty());
        assert_eq!(cfg.freq_hz, 4000);
        assert_eq!(cfg.console_mode(), ConsoleMode::Text);
    }

    #[test]
    fn runtime_keys() {
        let (cfg, issues) = parse_all("sample=full slice=25 sim=icl uregs=return");
        assert!(issues.is_empty(), "{issues:?}");
        assert_eq!(cfg.sample, SampleFields::Full);
        assert_eq!(cfg.slice_ms, Some(25));
        assert_eq!(cfg.sim, SimModel::IceLake);
        assert_eq!(cfg.uregs, UserRegsAt::Return);
        assert_eq!(parse_all("smp=4").0.smp, Some(4));
        assert_eq!(parse_all("smp=64").0.smp, Some(64));
        for bad in ["smp=0", "smp=65", "smp=x", "smp"] {
            let (cfg, issues) = parse_all(bad);
            assert_eq!(cfg.smp, None, "{bad}");
            assert!(
                issues[0].contains("number of CPUs from 1 to 64"),
                "{issues:?}"
            );
        }
        assert_eq!(parse_all("").0.sched, Sched::Spread);
        assert_eq!(parse_all("sched=boot").0.sched, Sched::Boot);
        assert_eq!(parse_all("sched=boot sched=spread").0.sched, Sched::Spread);
        let (cfg, issues) = parse_all("sched=all");
        assert_eq!(cfg.sched, Sched::Spread);
        assert!(issues[0].contains("spread or boot"), "{issues:?}");
        let (cfg, issues) = parse_all("sample=all slice=0 sim=zen uregs=later");
        assert_eq!(issues.len(), 4, "{issues:?}");
        assert!(issues[3].contains("expected nmi or return"), "{issues:?}");
        assert_eq!(
            parse_all("transport=uart").0.transport,
            TransportChoice::Uart
        );
        assert_eq!(
            parse_all("transport=virtio").0.transport,
            TransportChoice::Virtio
        );
        assert_eq!(parse_all("").0.transport, TransportChoice::Auto);
        let (bad, issues) = parse_all("transport=usb");
        assert_eq!(bad.transport, TransportChoice::Auto);
        assert_eq!(issues.len(), 1);
        assert_eq!(parse_all("buffer=64").0.buffer_mib, Some(64));
        assert_eq!(parse_all("buffer=0").0.buffer_mib, None);
        assert_eq!(parse_all("wire_group=256").0.wire_group, 256);
        assert_eq!(parse_all("").0.wire_group, DEFAULT_WIRE_GROUP);
        assert_eq!(parse_all("wire_group=0").0.wire_group, 0);
        let (bad, issues) = parse_all("wire_group=65537");
        assert_eq!((bad.wire_group, issues.len()), (DEFAULT_WIRE_GROUP, 1));
        let (bad, issues) = parse_all("buffer=5000");
        assert_eq!(bad.buffer_mib, None);
        assert_eq!(issues.len(), 1);
        assert_eq!(parse_all("clock=pit").0.clock, ClockSource::Pit);
        assert_eq!(parse_all("clock=hpet").0.clock, ClockSource::Hpet);
        assert_eq!(parse_all("").0.clock, ClockSource::Auto);
        assert_eq!(parse_all("fanout=ipi").0.fanout, ClockFanout::Ipi);
        assert_eq!(parse_all("").0.fanout, ClockFanout::Ioapic);
        let (bad, issues) = parse_all("fanout=pit");
        assert_eq!(bad.fanout, ClockFanout::Ioapic);
        assert!(issues[0].contains("expected ioapic or ipi"), "{issues:?}");
        let (bad, issues) = parse_all("clock=tsc");
        assert_eq!(bad.clock, ClockSource::Auto);
        assert!(
            issues[0].contains("expected auto, pit or hpet"),
            "{issues:?}"
        );
        assert_eq!(
            (cfg.sample, cfg.slice_ms, cfg.sim, cfg.uregs),
            (
                SampleFields::Default,
                None,
                SimModel::SapphireRapids,
                UserRegsAt::Nmi
            )
        );
    }

    #[test]
    fn all_known_keys() {
        let (cfg, issues) =
            parse_all("selftest freq=1000 pmu=sim console=wire ring=16 duration=250");
        assert!(issues.is_empty(), "{issues:?}");
        assert!(cfg.selftest);
        assert_eq!(cfg.freq_hz, 1000);
        assert_eq!(cfg.pmu, PmuMode::Sim);
        assert_eq!(cfg.console, Some(ConsoleMode::Wire));
        assert_eq!(cfg.ring_slots, Some(16));
        assert_eq!(cfg.duration_ms, Some(250));
    }

    #[test]
    fn unknown_key_is_reported_and_ignored() {
        let (cfg, issues) = parse_all("bogus=1 selftest quiet");
        assert!(cfg.selftest);
        assert_eq!(
            issues,
            [
                "unknown command-line key `bogus` ignored",
                "unknown command-line key `quiet` ignored"
            ]
        );
    }

    #[test]
    fn bad_values_keep_defaults() {
        let (cfg, issues) =
            parse_all("freq=0 freq=abc freq=1000001 pmu=maybe ring=0 duration= ring=3");
        assert_eq!(cfg, Config::default());
        assert_eq!(issues.len(), 7);
        assert!(issues[6].contains("power of two"), "{issues:?}");
        assert!(issues[0].contains("`0` for `freq`"));
        assert!(issues[5].contains("`duration`"));
    }

    #[test]
    fn crash_hook() {
        let (cfg, issues) = parse_all("crash=pf");
        assert_eq!(cfg.crash, Some(CrashKind::PageFault));
        assert!(issues.is_empty());
        let (cfg, issues) = parse_all("crash=boom");
        assert_eq!(cfg.crash, None);
        assert_eq!(issues.len(), 1);
        assert_eq!(parse_all("crash=panic").0.crash, Some(CrashKind::Panic));
        assert_eq!(
            parse_all("crash=ud").0.crash,
            Some(CrashKind::InvalidOpcode)
        );
        assert_eq!(parse_all("crash=df").0.crash, Some(CrashKind::DoubleFault));
        assert_eq!(parse_all("crash=smap").0.crash, Some(CrashKind::Smap));
    }

    #[test]
    fn event_key() {
        use arch_x86::pmu::events::EventKind;
        let (cfg, issues) = parse_all("event=instructions:u");
        assert!(issues.is_empty(), "{issues:?}");
        let e = cfg.events.first().unwrap();
        assert_eq!(
            (e.kind, e.user, e.kernel, e.precise),
            (EventKind::Instructions, true, false, 0)
        );
        let e = parse_all("event=r01c2:pp").0.events.first().unwrap();
        assert_eq!((e.kind, e.precise), (EventKind::Raw(0x01C2), 2));
        assert_eq!(
            parse_all("event=mem-loads:p")
                .0
                .events
                .first()
                .unwrap()
                .kind,
            EventKind::MemLoads
        );
        assert!(parse_all("").0.events.is_empty());
        // Several events, in order, each with its modifiers.
        let (cfg, issues) = parse_all("event=cycles:u,instructions:k,r01c2:pp");
        assert!(issues.is_empty(), "{issues:?}");
        let kinds: Vec<_> = cfg
            .events
            .as_slice()
            .iter()
            .map(|e| (e.kind, e.user, e.kernel, e.precise))
            .collect();
        assert_eq!(
            kinds,
            [
                (EventKind::Cycles, true, false, 0),
                (EventKind::Instructions, false, true, 0),
                (EventKind::Raw(0x01C2), true, true, 2)
            ]
        );
        let (cfg, issues) =
            parse_all("event=cycles,cycles,cycles,cycles,cycles,cycles,cycles,cycles,cycles");
        assert!(cfg.events.is_empty());
        assert!(issues[0].contains("at most 8 events"), "{}", issues[0]);
        let (cfg, issues) = parse_all("event=cycles/period=5000/u,instructions/freq=300/");
        assert!(issues.is_empty(), "{issues:?}");
        assert_eq!(cfg.events.as_slice().len(), 2);
        assert_eq!(cfg.events.sampling(0), Some(EventSampling::Period(5000)));
        assert_eq!(cfg.events.sampling(1), Some(EventSampling::Freq(300)));
        assert!(!cfg.events.first().unwrap().kernel);
        let (cfg, issues) = parse_all("event=cycles,,instructions");
        assert!(cfg.events.is_empty() && issues.len() == 1, "{issues:?}");
    }

    #[test]
    fn bad_event_keeps_cycles_with_a_clear_message() {
        let (cfg, issues) = parse_all("event=cycels");
        assert!(cfg.events.is_empty());
        assert_eq!(issues.len(), 1);
        assert!(
            issues[0].starts_with(
                "bad value `cycels` for `event` ignored: unknown event (known: cycles,"
            ),
            "{}",
            issues[0]
        );
        assert!(
            issues[0].ends_with("; the PMU samples cycles"),
            "{}",
            issues[0]
        );
        // A bad value falls back to cycles even after a good one.
        let (cfg, issues) =
            parse_all("event=instructions event=r5000c0 event=cycles:x event=rzz event");
        assert!(cfg.events.is_empty());
        assert_eq!(issues.len(), 4);
        assert!(issues[0].contains("0x500000"), "{}", issues[0]);
        assert!(issues[1].contains("modifier 'x'"), "{}", issues[1]);
        assert!(issues[2].contains("hex digits"), "{}", issues[2]);
        assert!(
            issues[3].contains("(expected an event name"),
            "{}",
            issues[3]
        );
    }

    #[test]
    fn throttle_keys() {
        let (cfg, issues) = parse_all("");
        assert!(issues.is_empty());
        assert_eq!((cfg.max_rate, cfg.cpu_pct), (100_000, 25));
        let (cfg, issues) = parse_all("max_rate=4000 cpu_pct=0");
        assert!(issues.is_empty(), "{issues:?}");
        assert_eq!((cfg.max_rate, cfg.cpu_pct), (4000, 0));
        assert_eq!(parse_all("max_rate=0").0.max_rate, 0);
        assert_eq!(parse_all("cpu_pct=100").0.cpu_pct, 100);
        let (cfg, issues) = parse_all("max_rate=-1 max_rate=fast max_rate cpu_pct=101 cpu_pct=x");
        assert_eq!((cfg.max_rate, cfg.cpu_pct), (100_000, 25));
        assert_eq!(issues.len(), 5, "{issues:?}");
        assert!(issues[0].contains("`-1` for `max_rate`"), "{}", issues[0]);
        assert!(issues[3].contains("`101` for `cpu_pct`"), "{}", issues[3]);
        assert!(issues[3].contains("0 (no budget) to 100"), "{}", issues[3]);
    }

    #[test]
    fn record_option_keys() {
        let (cfg, issues) =
            parse_all("period=250000 callchain=no uregs_mask=0x1c0 iregs_mask=ff0000 branch=0x11");
        assert!(issues.is_empty(), "{issues:?}");
        assert_eq!(cfg.period, Some(250_000));
        assert_eq!(cfg.clock_hz(), 4000);
        assert_eq!(cfg.callchain, Some(false));
        assert_eq!(cfg.uregs_mask, Some(0x1c0));
        assert_eq!(cfg.iregs_mask, Some(0xff_0000));
        assert_eq!(cfg.branch, Some(0x11));
        assert_eq!(parse_all("callchain=fp").0.callchain, Some(true));
        assert_eq!(parse_all("uregs_mask=0").0.uregs_mask, Some(0));
        assert_eq!(parse_all("freq=99").0.clock_hz(), 99);
        // One tick per period, within the clock's range.
        assert_eq!(parse_all("period=1").0.clock_hz(), MAX_FREQ_HZ);
        assert_eq!(parse_all("period=4000000000").0.clock_hz(), 1);
        // The simulated PMU's period counts loads: the clock keeps freq=.
        assert_eq!(parse_all("pmu=sim freq=2000 period=4").0.clock_hz(), 2000);
        let (cfg, issues) = parse_all(
            "period=0 period=x callchain=dwarf uregs_mask=0x1000000 iregs_mask=zz branch=1 branch=0x80 branch= iregs_mask=0x1000",
        );
        assert_eq!(cfg, Config::default());
        assert_eq!(issues.len(), 9, "{issues:?}");
        // DS is not an x86-64 sample register.
        assert!(
            issues[8].contains("`0x1000` for `iregs_mask`"),
            "{}",
            issues[8]
        );
        assert!(issues[2].contains("expected fp or no"), "{}", issues[2]);
        assert!(
            issues[3].contains("`0x1000000` for `uregs_mask`"),
            "{}",
            issues[3]
        );
        // USER alone names no branch class; 0x80 (ABORT_TX) is not sampled.
        assert!(issues[5].contains("`1` for `branch`"), "{}", issues[5]);
        assert!(issues[6].contains("`0x80` for `branch`"), "{}", issues[6]);
    }

    #[test]
    fn later_value_wins() {
        let (cfg, _) = parse_all("freq=10 freq=20 selftest selftest=off");
        assert_eq!(cfg.freq_hz, 20);
        assert!(!cfg.selftest);
    }
}
