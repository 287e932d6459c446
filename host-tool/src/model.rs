//! The host's view of a recording stream: what the target said about itself,
//! its events and tasks, and each sample, independent of the wire encoding.
//! The wire adapter produces these; the converter, stats and flamegraph
//! consume them.

/// How samples are triggered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventSource {
    /// A real performance-monitoring unit.
    Pmu,
    /// The simulated PMU (`pmu=sim`): marked as such in perf.data.
    SimulatedPmu,
    /// No PMU: the NMI clock ("cpu-clock").
    NmiClock,
}

/// What an event counts (`perf_event_attr.type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// `PERF_TYPE_HARDWARE`.
    Hardware,
    /// `PERF_TYPE_RAW`.
    Raw,
    /// `PERF_TYPE_SOFTWARE` cpu-clock.
    CpuClock,
}

/// One event as the target configured it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventInfo {
    /// The id samples carry.
    pub id: u32,
    /// What it counts.
    pub kind: EventKind,
    /// `perf_event_attr.config`.
    pub config: u64,
    /// Fixed period or frequency.
    pub period_or_freq: u64,
    /// Frequency mode.
    pub freq: bool,
    /// `PERF_SAMPLE_*` bits the target fills.
    pub sample_type: u64,
    /// `sample_regs_user`.
    pub regs_user: u64,
    /// `sample_regs_intr`.
    pub regs_intr: u64,
    /// `branch_sample_type`.
    pub branch_sample_type: u64,
    /// `exclude_user`.
    pub exclude_user: bool,
    /// `exclude_kernel`.
    pub exclude_kernel: bool,
    /// `precise_ip`.
    pub precise: u8,
    /// Callchain depth limit.
    pub max_stack: u16,
}

impl EventInfo {
    /// The perf event name for this event on `source`.
    pub fn perf_name(&self, source: EventSource) -> String {
        let base = match self.kind {
            EventKind::CpuClock => return "cpu-clock".to_owned(),
            EventKind::Raw => format!("r{:x}", self.config),
            EventKind::Hardware => match self.config {
                0 => "cycles".to_owned(),
                1 => "instructions".to_owned(),
                2 => "cache-references".to_owned(),
                3 => "cache-misses".to_owned(),
                4 => "branches".to_owned(),
                5 => "branch-misses".to_owned(),
                6 => "bus-cycles".to_owned(),
                7 => "stalled-cycles-frontend".to_owned(),
                8 => "stalled-cycles-backend".to_owned(),
                9 => "ref-cycles".to_owned(),
                c => format!("hw-{c}"),
            },
        };
        // perf's modifiers: the mode when one is excluded, then the
        // precise level (`cycles:upp`).
        let mode = match (self.exclude_user, self.exclude_kernel) {
            (false, true) => "u",
            (true, false) => "k",
            _ => "",
        };
        let precise = &"ppp"[..usize::from(self.precise.min(3))];
        let mods = format!("{mode}{precise}");
        let sim = if source == EventSource::SimulatedPmu {
            "-simulated"
        } else {
            ""
        };
        if mods.is_empty() {
            format!("{base}{sim}")
        } else {
            format!("{base}{sim}:{mods}")
        }
    }
}

/// Where one CPU of the appliance sits (the wire's `CpuPlace`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuPlace {
    /// Its (x2)APIC ID.
    pub apic_id: u32,
    /// Its package (socket).
    pub package: u32,
    /// Its die within the package.
    pub die: u32,
    /// Its core within the package.
    pub core: u32,
}

/// The stream's opening record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Wire protocol version.
    pub protocol_version: u32,
    /// Build-id of the image that produced the stream (empty if unknown).
    pub build_id: Vec<u8>,
    /// CPUs up in the appliance.
    pub cpus: u32,
    /// Where each of them sits, by CPU number (empty when the stream did
    /// not say).
    pub places: Vec<CpuPlace>,
    /// Trigger source.
    pub source: EventSource,
    /// CPU description (vendor / model string).
    pub cpu_desc: String,
    /// The runtime's command line.
    pub cmdline: String,
    /// Configured events.
    pub events: Vec<EventInfo>,
    /// The same in every Hello of one boot.
    pub boot: u64,
    /// 0 for the boot's first Hello, n for its n-th periodic repetition.
    pub repeat: u32,
    /// The device the stream left the target through ("16550 UART",
    /// "virtio console (PCI)", ...).
    pub transport: String,
}

#[cfg(test)]
impl EventInfo {
    /// For unit tests: event 0 of `kind`, config 0, at 1000 Hz, sampling
    /// nothing beyond the basics.
    pub(crate) fn for_test(kind: EventKind) -> Self {
        EventInfo {
            id: 0,
            kind,
            config: 0,
            period_or_freq: 1000,
            freq: true,
            sample_type: 0,
            regs_user: 0,
            regs_intr: 0,
            branch_sample_type: 0,
            exclude_user: false,
            exclude_kernel: false,
            precise: 0,
            max_stack: 0,
        }
    }
}

#[cfg(test)]
impl Hello {
    /// For unit tests: the first Hello of a one-CPU boot with `event`.
    pub(crate) fn for_test(source: EventSource, event: EventInfo) -> Self {
        Hello {
            protocol_version: 1,
            build_id: vec![],
            cpus: 1,
            places: vec![],
            source,
            cpu_desc: "test".into(),
            cmdline: String::new(),
            events: vec![event],
            boot: 1,
            repeat: 0,
            transport: "16550 UART".into(),
        }
    }
}

/// A ring-3 task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskInfo {
    /// Process id (perf pid).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Name (perf comm).
    pub name: String,
    /// Runs in compatibility mode (32-bit).
    pub compat: bool,
    /// Time the task was announced (ns).
    pub time: u64,
    /// User text ranges the target reports: (start, len, file offset).
    pub text: Vec<(u64, u64, u64)>,
    /// The program file a loaded process runs (`None` for the runtime's
    /// built-in programs, whose code is in the image).
    pub program: Option<ProgramInfo>,
    /// Why the target sent the record.
    pub origin: TaskOrigin,
}

impl TaskInfo {
    /// Whether `other` says what `self` says of the task, whatever the
    /// origin of either: a periodic repetition of it.
    pub fn repeats(&self, other: &TaskInfo) -> bool {
        let TaskInfo {
            pid,
            tid,
            name,
            compat,
            time,
            text,
            program,
            origin: _,
        } = self;
        *pid == other.pid
            && *tid == other.tid
            && *name == other.name
            && *compat == other.compat
            && *time == other.time
            && *text == other.text
            && *program == other.program
    }
}

/// Why a Task record was sent (the wire's `Origin`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TaskOrigin {
    /// The task started with the run, renamed itself, or the record is a
    /// periodic repetition.
    #[default]
    Named,
    /// Task `ptid` of process `ppid` just made it: a thread (`ppid` is
    /// then its own pid) or the first thread of a forked process
    /// (PERF_RECORD_FORK).
    Made {
        /// The maker's process.
        ppid: u32,
        /// The maker's task (thread).
        ptid: u32,
    },
    /// The process replaced its program (`execve`): an exec COMM.
    Exec,
}

/// The program of a loaded process, as its Task record names it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProgramInfo {
    /// Path in the boot archive (`bin/app`).
    pub path: String,
    /// GNU build-id; empty when the ELF has none.
    pub build_id: Vec<u8>,
    /// Loaded segments.
    pub segments: Vec<SegmentInfo>,
}

/// One loaded segment of a program.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegmentInfo {
    /// First mapped address.
    pub start: u64,
    /// Length in bytes.
    pub len: u64,
    /// File offset of `start` (the MMAP2 pgoff).
    pub file_offset: u64,
    /// Readable.
    pub read: bool,
    /// Writable.
    pub write: bool,
    /// Executable.
    pub exec: bool,
}

impl SegmentInfo {
    /// The PROT_* bits of an MMAP2 (PROT_READ 1, PROT_WRITE 2, PROT_EXEC 4).
    pub fn prot(&self) -> u32 {
        u32::from(self.read) | u32::from(self.write) << 1 | u32::from(self.exec) << 2
    }
}

/// One sample with borrowed variable-length parts.
#[derive(Clone, Copy, Debug, Default)]
pub struct SampleView<'a> {
    /// Event id.
    pub event: u32,
    /// CPU.
    pub cpu: u32,
    /// Process id (0 = runtime).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Time (ns).
    pub time: u64,
    /// Interrupted instruction pointer.
    pub ip: u64,
    /// The interrupted context was ring 3.
    pub user: bool,
    /// Period.
    pub period: u64,
    /// Data address.
    pub addr: u64,
    /// Callchain with `PERF_CONTEXT_KERNEL` / `PERF_CONTEXT_USER` markers,
    /// innermost first (empty when not sampled).
    pub callchain: &'a [u64],
    /// User register ABI (0 none, 1 compat, 2 64-bit).
    pub regs_user_abi: u64,
    /// User registers in mask order.
    pub regs_user: &'a [u64],
    /// Interrupt register ABI.
    pub regs_intr_abi: u64,
    /// Interrupt registers in mask order.
    pub regs_intr: &'a [u64],
    /// LBR entries.
    pub branches: &'a [crate::perf_data::BranchEntry],
    /// `hw_idx` of the branch stack.
    pub branch_hw_idx: u64,
    /// Weight.
    pub weight: u64,
    /// Data source.
    pub data_src: u64,
}

/// Counters the target reports when a run ends.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EndCounters {
    /// Overflows that produced a sample attempt.
    pub taken: u64,
    /// Samples put on the wire.
    pub delivered: u64,
    /// Samples dropped on the target (ring full).
    pub lost: u64,
    /// Times throttling engaged.
    pub throttled: u64,
    /// The programs' unknown system calls, named (empty when none).
    pub unknown_syscalls: String,
}

/// One decoded stream item.
#[derive(Clone, Debug)]
pub enum Item<'a> {
    /// Stream start.
    Hello(Hello),
    /// A task appeared.
    Task(TaskInfo),
    /// A task ended.
    TaskExit {
        /// Process id.
        pid: u32,
        /// Task (thread) id.
        tid: u32,
        /// When (ns).
        time: u64,
    },
    /// A sample.
    Sample(SampleView<'a>),
    /// Samples dropped on the target.
    Lost {
        /// Event id.
        event: u32,
        /// CPU.
        cpu: u32,
        /// Samples dropped.
        count: u64,
        /// When the loss was noticed (ns).
        time: u64,
        /// Overflows suppressed while the event was throttled (not
        /// dropped by a full ring or PEBS).
        throttled: bool,
    },
    /// Throttling started (`true`) or ended.
    Throttle {
        /// Event id.
        event: u32,
        /// CPU.
        cpu: u32,
        /// Started or ended.
        on: bool,
        /// When (ns).
        time: u64,
    },
    /// A log line (already text) from the target.
    Log(String),
    /// defmt-encoded log bytes from the target.
    Defmt(&'a [u8]),
    /// The run ended.
    End(EndCounters),
}
