//! The wire protocol between the runtime and the host: versioned records,
//! each one postcard-encoded, followed by a CRC-32C, COBS-stuffed and ended
//! by a `0x00` delimiter, so logs and samples share one serial line and a
//! reader can start or resynchronise at any frame boundary.
//!
//! # Frame
//! ```text
//! COBS( postcard(record) ++ le32(crc32c(postcard(record)) ^ chain) ) ++ 0x00
//! ```
//! The frame check is CRC-32C (Castagnoli; `CRC_32_ISCSI` in the `crc`
//! crate: polynomial 0x1EDC6F41, reflected, initial value and final XOR
//! 0xFFFFFFFF, check value 0xE3069283 for `"123456789"`). x86_64 hosts
//! compute it with the SSE4.2 `crc32` instruction, eight bytes at a time.
//! Protocol version 1 used CRC-32/ISO-HDLC (zlib's); a decoder of this
//! version still recognises a version-1 Hello by that CRC and its magic, and
//! reports the version mismatch.
//!
//! `chain` is 0 except for a *delta* sample (see below), where it is the
//! chain value of the task's state the sample was encoded against: the
//! CRC-32C of (the previous state's chain, the previous sample frame's plain
//! CRC, that frame's count since the keyframe), starting from 0 at the
//! keyframe. It binds a delta frame to the exact run of frames since the
//! task's keyframe, not just to the previous payload, which periodic code
//! repeats byte for byte. A decoder that missed a frame of the run (lost or
//! corrupted) holds a stale chain that no later frame of the run matches
//! (short of a 2^-32 CRC coincidence), so it rejects and counts those
//! samples until the next keyframe instead of rebuilding them on the wrong
//! base. `tests/wire_loss.rs` drops each of 8,000 sample frames of a
//! periodic capture in turn and finds no wrong sample.
//!
//! # Records
//! [`Record::Hello`] is always variant 0 and starts with the magic and the
//! protocol version, so any future version can still be recognised and
//! refused with a clear error.
//!
//! # Compact samples
//! Samples are encoded against per-task reference state that both sides keep
//! (time, IP, period, CPU, user and interrupt registers of the previous
//! sample of the same task). Values are zigzag varint deltas; registers use
//! either dense deltas or a changed-bitmap plus deltas, whichever is
//! smaller. Every [`EncoderConfig::keyframe_interval`] samples of a task, and
//! whenever the encoder has no state for it, a keyframe with absolute values
//! is sent. State is only updated from samples that were encoded, so ring
//! losses never desynchronise the two sides; wire losses cost at most the
//! samples up to the task's next keyframe, and those are counted
//! ([`DecoderStats::unresolved_samples`]).
//!
//! # Sample groups
//! With [`EncoderConfig::group`] set (`wire_group=N`), samples travel in
//! groups instead: runs of N samples coded together with adaptive context
//! models and a range coder, several to a frame, the models reset at each
//! group's start (see [`group`]). The per-sample frames below stay the
//! default.
//!
//! # Bytes per sample
//! Measured by `cargo test -p sampler --test wire_size -- --nocapture` and
//! the `wire_size` table printed by `cargo bench -p sampler`, on a
//! simulated 4 kHz cpu-clock task running a loop (see `tests/wire_size.rs`),
//! whole frames included (COBS, CRC, delimiter), averaged over 10,000
//! samples with keyframes every 128 samples:
//!
//! | fields | perf.data | wire (avg) | ratio | plain varints, no deltas |
//! | --- | --- | --- | --- | --- |
//! | IDENTIFIER, IP, TID, TIME, PERIOD | 48 | 15.1 | 31% | 23.0 |
//! | + REGS_USER (20 GPRs) | 216 | 37.9 | 18% | 100.5 |
//! | + REGS_USER + CALLCHAIN (4 frames) | 264 | 52.9 | 20% | 115.5 |
//! | + REGS_USER + REGS_INTR (20 GPRs each) | 384 | 61.7 | 16% | 177.0 |
//!
//! The acceptance sample (IP, TID, TIME, PERIOD and the 20 user GPRs) takes
//! 37.9 bytes on average, 18% of its 216 perf.data bytes (the bound is 25%,
//! 54 bytes). About 6 bytes of every frame are framing (COBS code byte,
//! CRC-32C, delimiter), which is why the basic sample only shrinks to 31%.
//! "Plain varints" is the same stream with `keyframe_interval = 1`: stack
//! and text addresses take 6-7 bytes each as varints, so deltas against the
//! previous sample of the same task pay off most for registers.
//!
//! The price of deltas is paid on a lossy line: a corrupted frame costs the
//! rest of that task's samples up to its next keyframe (at most
//! `keyframe_interval - 1`), all counted. Lower the interval for noisy
//! links.

mod castagnoli;
mod codec;
mod decoder;
mod encoder;
#[cfg(feature = "fuzzing")]
pub mod framing;
pub mod group;

pub use codec::{SampleParts, TaskRef, WireSample};
#[cfg(feature = "std")]
pub use decoder::FrameBatch;
pub use decoder::{DecodeError, Decoder, DecoderStats, Framer, Lent};
pub use encoder::{EncodeError, Encoder, EncoderConfig, MAX_GROUP, PutError};

use serde::{Deserialize, Serialize};

use crate::event::{EventConfig, PmuCaps};
use crate::regs::Abi;
use crate::sample::Sample;

/// The magic at the start of every Hello.
pub const MAGIC: [u8; 4] = *b"PRCH";
/// The protocol version this crate speaks. Version 2 changed the frame
/// check from CRC-32/ISO-HDLC to CRC-32C; version 3 made a delta sample's
/// chain the cumulative chain of its task's run since the keyframe instead
/// of the previous frame's plain CRC (see the module docs); version 4 added
/// the program of a loaded process to its Task record ([`Task::program`]);
/// version 5 added [`Record::TaskExit`]; version 6 added the CPUs' places
/// to Hello ([`Hello::cpus`]); version 7 added why a Task record was sent
/// ([`Task::origin`]: a task made by another, a process's exec); version 8
/// added sample groups ([`group`], record tag [`group::GROUP_TAG`]);
/// version 9 changed how a group codes its samples (change masks, the
/// period as the clock's step, the coder's bypass stream and models);
/// version 10 made how a changed register, an IP or a callchain entry is
/// coded and the size of its delta one symbol of the group coder;
/// version 11 codes a sample's task among the group's recent tasks and a
/// callchain's leading context marker and IP in one bit; version 12
/// divides the group coder's range by a symbol model's total through a
/// multiplication by its reciprocal; version 13 codes a changed register
/// against its set's table of recent values and one value model per set
/// (no per-register caches and models), with caches of 4 recent IPs and
/// return addresses; version 14 rebuilds a symbol model's cumulative
/// counts every 256 symbols at most, not every 64; version 15 codes a
/// register set's change mask that is none of its recent ones as raw
/// bits, and the changed registers with a test of their own (the IP
/// register, an interrupted set's against the user set) before the
/// others, moves a bit model's probability an eighth of the way at
/// every bit, and keeps 2 recent IPs a task, not 4. A Hello of another version is recognised and refused with the
/// version error.
pub const PROTOCOL_VERSION: u16 = 15;
/// The frame delimiter. A writer should send one before its first frame
/// (and after any reset of the line) so that noise on the line before it is
/// not glued to that frame.
pub const DELIMITER: u8 = 0;
/// The largest encoded frame (COBS, CRC and delimiter included). Decoders
/// discard longer runs as corrupt.
pub const MAX_FRAME: usize = 4096;
/// The most event configs in a Hello.
pub const MAX_EVENTS: usize = 8;
/// Longest command line carried in a Hello.
pub const MAX_CMDLINE: usize = 256;
/// Longest build-id.
pub const MAX_BUILD_ID: usize = 32;
/// Longest task name.
pub const MAX_TASK_NAME: usize = 32;
/// Most text ranges of a task.
pub const MAX_TASK_RANGES: usize = 4;
/// Longest archive path of a program in a Task record.
pub const MAX_PROGRAM_PATH: usize = 256;
/// Most loaded segments of a program in a Task record.
pub const MAX_PROGRAM_SEGMENTS: usize = 8;
/// Longest log payload.
pub const MAX_LOG: usize = 512;
/// Longest self-test name / detail.
pub const MAX_SELFTEST_TEXT: usize = 64;
/// The most CPUs a Hello lists (the most the runtime starts).
pub const MAX_CPUS: usize = 64;

/// CPU vendor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CpuVendor {
    /// GenuineIntel.
    Intel,
    /// AuthenticAMD.
    Amd,
    /// Anything else: the 12-byte CPUID vendor string.
    Other([u8; 12]),
}

/// CPU identification from CPUID leaf 0/1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuId {
    /// Vendor.
    pub vendor: CpuVendor,
    /// Display family.
    pub family: u16,
    /// Display model.
    pub model: u16,
    /// Stepping.
    pub stepping: u8,
}

/// Where one CPU sits in the machine, from its APIC ID and the topology
/// CPUID describes (`arch_x86::topology`). Every field is a varint on the
/// wire: a few bytes per CPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuPlace {
    /// The CPU's (x2)APIC ID.
    pub apic_id: u32,
    /// Its package (socket).
    pub package: u32,
    /// Its die within the package (0 when the CPU describes no dies).
    pub die: u32,
    /// Its core within the package; the CPUs of one core are its threads.
    pub core: u32,
}

/// The first record of a stream: who is talking and what it samples.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Always [`MAGIC`]. Must stay the first field.
    pub magic: [u8; 4],
    /// Always [`PROTOCOL_VERSION`] for this crate. Must stay the second field.
    pub version: u16,
    /// The CPU.
    pub cpu: CpuId,
    /// Number of CPUs up (the boot CPU and those the runtime started).
    pub ncpus: u32,
    /// Where each CPU that is up sits, by CPU number (the `cpu` of samples):
    /// entry 0 is the boot CPU. Empty when unknown.
    pub cpus: heapless::Vec<CpuPlace, MAX_CPUS>,
    /// PMU capabilities, including the event source in use.
    pub pmu: PmuCaps,
    /// True when the PMU is the simulated one (`pmu=sim`).
    pub simulated: bool,
    /// TSC frequency in Hz (0 if unknown).
    pub tsc_hz: u64,
    /// GNU build-id of the runtime ELF.
    pub build_id: heapless::Vec<u8, MAX_BUILD_ID>,
    /// The kernel command line.
    pub cmdline: heapless::String<MAX_CMDLINE>,
    /// The events being sampled.
    pub events: heapless::Vec<EventConfig, MAX_EVENTS>,
    /// A number that is the same in every Hello of one boot and (with
    /// overwhelming likelihood) differs between boots.
    pub boot: u64,
    /// 0 for the boot's first Hello; the target repeats Hello (and its Task
    /// records) periodically with 1, 2, ..., so a host that joins late, or
    /// lost the start to noise, decodes from the next repetition. A Hello of
    /// the same `boot` with a non-zero `repeat` is never a restart.
    pub repeat: u32,
    /// The device the stream leaves the target through.
    pub transport: TransportKind,
}

/// The device carrying the stream (Hello's `transport`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum TransportKind {
    /// A 16550 UART (COM1): bare metal, `--serial`, `--transport uart`.
    #[default]
    Uart16550,
    /// A virtio console on PCI (QEMU's `virtio-serial-pci`).
    VirtioPci,
    /// A virtio console on virtio-mmio (QEMU's `microvm`).
    VirtioMmio,
}

impl TransportKind {
    /// A short name for summaries.
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Uart16550 => "16550 UART",
            TransportKind::VirtioPci => "virtio console (PCI)",
            TransportKind::VirtioMmio => "virtio console (MMIO)",
        }
    }
}

impl Hello {
    /// A Hello with the magic and version filled in.
    pub fn new(cpu: CpuId, pmu: PmuCaps) -> Self {
        Hello {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            cpu,
            ncpus: 1,
            cpus: heapless::Vec::new(),
            simulated: pmu.source == crate::event::EventSource::Simulated,
            pmu,
            tsc_hz: 0,
            build_id: heapless::Vec::new(),
            cmdline: heapless::String::new(),
            events: heapless::Vec::new(),
            boot: 0,
            repeat: 0,
            transport: TransportKind::Uart16550,
        }
    }

    /// Whether `self`, arriving after `first`, repeats it (the same boot)
    /// rather than starting a new run.
    pub fn repeats(&self, first: &Hello) -> bool {
        self.repeat > 0 && self.boot == first.boot
    }
}

/// Why samples were lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LostReason {
    /// The per-CPU ring was full.
    RingFull,
    /// The pending store of samples waiting for return-to-user registers was
    /// full.
    PendingFull,
    /// PEBS records collided or were malformed.
    Pebs,
    /// Overflows suppressed while the event was throttled (the per-tick
    /// limit of `max_rate`).
    Throttled,
}

/// Samples counted but not delivered (becomes PERF_RECORD_LOST / LOST_SAMPLES).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lost {
    /// Time of the drain that noticed the loss (ns).
    pub time: u64,
    /// CPU.
    pub cpu: u32,
    /// The event, if known (0 otherwise).
    pub event: u32,
    /// Number of samples lost.
    pub count: u64,
    /// Why.
    pub reason: LostReason,
}

/// An event was throttled or unthrottled (PERF_RECORD_THROTTLE / UNTHROTTLE).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThrottleEvent {
    /// Time (ns).
    pub time: u64,
    /// CPU.
    pub cpu: u32,
    /// The event.
    pub event: u32,
}

/// A range of a task's user text, for an MMAP record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TextRange {
    /// Start address.
    pub start: u64,
    /// Length in bytes.
    pub len: u64,
    /// Page-aligned offset of the segment in the runtime ELF (MMAP pgoff).
    pub file_offset: u64,
}

/// One loaded segment of a program, as the loader mapped it (page-aligned,
/// as Linux's `mmap` of a PT_LOAD segment): becomes an MMAP2 on the host
/// when it is executable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// First mapped address (page-aligned).
    pub start: u64,
    /// Mapped length in bytes (whole pages).
    pub len: u64,
    /// Offset in the program file of the byte at `start` (page-aligned; the
    /// MMAP2 pgoff).
    pub file_offset: u64,
    /// Rights: [`Segment::READ`], [`Segment::WRITE`], [`Segment::EXEC`].
    pub prot: u8,
}

impl Segment {
    /// Readable.
    pub const READ: u8 = 1;
    /// Writable.
    pub const WRITE: u8 = 2;
    /// Executable.
    pub const EXEC: u8 = 4;

    /// Whether the segment holds code.
    pub fn executable(&self) -> bool {
        self.prot & Self::EXEC != 0
    }
}

/// The program a loaded process runs: which file of the boot archive, its
/// build-id and where its segments were loaded.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Program {
    /// The program's path in the boot archive (`bin/app`), as the manifest
    /// names it (cut at [`MAX_PROGRAM_PATH`] bytes).
    pub path: heapless::String<MAX_PROGRAM_PATH>,
    /// The ELF's NT_GNU_BUILD_ID note; empty when it has none.
    pub build_id: heapless::Vec<u8, MAX_BUILD_ID>,
    /// Its loaded PT_LOAD segments, in program-header order (the first
    /// [`MAX_PROGRAM_SEGMENTS`]).
    pub segments: heapless::Vec<Segment, MAX_PROGRAM_SEGMENTS>,
}

/// Why a Task record was sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Origin {
    /// The task started with the run (a program perch started), or renamed
    /// itself, or a repetition.
    #[default]
    Named,
    /// The task was just made by task `ptid` of process `ppid`: a thread
    /// (`clone`, then `ppid` is its own pid) or the first thread of a forked
    /// process.
    Made {
        /// The process of the task that made it.
        ppid: u32,
        /// The task (thread) that made it.
        ptid: u32,
    },
    /// The process replaced its program (`execve`): the record names the
    /// new program.
    Exec,
}

/// A task appeared, renamed itself or replaced its program (COMM + MMAP on
/// the host; FORK first for a task made by another, and an exec COMM for
/// an exec).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    /// Time the task was created (ns).
    pub time: u64,
    /// Process id.
    pub pid: u32,
    /// Task (thread) id.
    pub tid: u32,
    /// Name.
    pub name: heapless::String<MAX_TASK_NAME>,
    /// ABI of its user code.
    pub abi: Abi,
    /// Its user text inside the runtime image (built-in programs; empty
    /// for a loaded program, whose code is in [`Task::program`]).
    pub text: heapless::Vec<TextRange, MAX_TASK_RANGES>,
    /// The program file a loaded process runs (`None` for the runtime's
    /// built-in programs).
    pub program: Option<Program>,
    /// Why the record was sent. Periodic repetitions say
    /// [`Origin::Named`], whatever the first record said.
    pub origin: Origin,
}

/// A task (thread) ended (EXIT on the host). Sent after every sample the
/// task took, so its time is later than theirs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskExit {
    /// When the runtime saw it end (ns).
    pub time: u64,
    /// Process id.
    pub pid: u32,
    /// Task (thread) id.
    pub tid: u32,
}

/// Log severity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogLevel {
    /// Error.
    Error,
    /// Warning.
    Warn,
    /// Info.
    Info,
    /// Debug.
    Debug,
    /// Trace.
    Trace,
}

/// What a log record carries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogPayload {
    /// Raw defmt frame bytes (decoded on the host with the ELF's table).
    Defmt(heapless::Vec<u8, MAX_LOG>),
    /// Plain UTF-8 text (panics, exception reports via `core::fmt`).
    Text(heapless::String<MAX_LOG>),
}

/// A log line or defmt frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Log {
    /// Time (ns).
    pub time: u64,
    /// Severity.
    pub level: LogLevel,
    /// The text or defmt bytes.
    pub payload: LogPayload,
    /// True when the payload was cut to fit [`MAX_LOG`].
    pub truncated: bool,
}

impl Log {
    /// A text log, cut at a character boundary to fit [`MAX_LOG`] bytes.
    pub fn text(time: u64, level: LogLevel, text: &str) -> Self {
        let mut end = text.len().min(MAX_LOG);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let mut s = heapless::String::new();
        // Cannot fail: `end <= MAX_LOG`.
        let _ = s.push_str(&text[..end]);
        Log {
            time,
            level,
            payload: LogPayload::Text(s),
            truncated: end < text.len(),
        }
    }

    /// A defmt frame, cut to fit [`MAX_LOG`] bytes.
    pub fn defmt(time: u64, level: LogLevel, frame: &[u8]) -> Self {
        let end = frame.len().min(MAX_LOG);
        let mut v = heapless::Vec::new();
        // Cannot fail: `end <= MAX_LOG`.
        let _ = v.extend_from_slice(&frame[..end]);
        Log {
            time,
            level,
            payload: LogPayload::Defmt(v),
            truncated: end < frame.len(),
        }
    }
}

/// One self-test result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SelfTest {
    /// Test name.
    pub name: heapless::String<MAX_SELFTEST_TEXT>,
    /// Whether it passed.
    pub passed: bool,
    /// What was measured.
    pub measured: u64,
    /// What was expected.
    pub expected: u64,
    /// Free-form detail.
    pub detail: heapless::String<MAX_SELFTEST_TEXT>,
}

/// Most distinct unknown system calls an End record names.
pub const MAX_UNKNOWN_SYSCALLS: usize = 16;

/// A system call the runtime does not implement, as its programs made it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnknownSyscall {
    /// 64 for the x86-64 ABI (SYSCALL), 32 for i386 (`int 0x80`).
    pub abi: u8,
    /// The call's number in that ABI.
    pub nr: u32,
    /// Calls made.
    pub count: u64,
}

/// Final counters, sent once at the end of a run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct End {
    /// Time (ns).
    pub time: u64,
    /// Samples the target took (offered to a ring).
    pub taken: u64,
    /// Samples delivered (encoded onto the wire).
    pub delivered: u64,
    /// Samples lost (counted in Lost records).
    pub lost: u64,
    /// Times an event was throttled.
    pub throttled: u64,
    /// Frames written, this one excluded.
    pub frames: u64,
    /// The distinct unknown system calls of the run's programs (the first
    /// [`MAX_UNKNOWN_SYSCALLS`], most frequent first).
    pub unknown_syscalls: heapless::Vec<UnknownSyscall, MAX_UNKNOWN_SYSCALLS>,
}

/// One record of the stream.
// Samples are large but fixed-size by design: no_std has no Box, and the
// drain encodes one record at a time.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// Stream header (always variant 0 on the wire).
    Hello(Hello),
    /// A sample.
    Sample(Sample),
    /// Samples counted but not delivered.
    Lost(Lost),
    /// An event was throttled.
    Throttle(ThrottleEvent),
    /// An event was unthrottled.
    Unthrottle(ThrottleEvent),
    /// A task appeared.
    Task(Task),
    /// A log line or defmt frame.
    Log(Log),
    /// A self-test result.
    SelfTest(SelfTest),
    /// Final counters.
    End(End),
    /// A task ended.
    TaskExit(TaskExit),
}

/// The on-wire form of a record (the sample replaced by its compact form).
/// Variant order is the protocol: never reorder, only append. Tag 10
/// ([`group::GROUP_TAG`]) is a group frame, written and read by hand.
#[derive(Serialize)]
enum WireRecordRef<'a> {
    Hello(&'a Hello),
    Sample(&'a WireSample),
    Lost(&'a Lost),
    Throttle(&'a ThrottleEvent),
    Unthrottle(&'a ThrottleEvent),
    Task(&'a Task),
    Log(&'a Log),
    SelfTest(&'a SelfTest),
    End(&'a End),
    TaskExit(&'a TaskExit),
}

/// The decoded on-wire form of a record; must mirror [`WireRecordRef`].
#[allow(clippy::large_enum_variant)]
#[derive(Deserialize)]
enum WireRecord {
    Hello(Hello),
    // The decoder parses samples with `WireSample::parse_into`; this serde
    // path stays as the reference the tests compare that parser against.
    #[cfg_attr(not(test), allow(dead_code))]
    Sample(WireSample),
    Lost(Lost),
    Throttle(ThrottleEvent),
    Unthrottle(ThrottleEvent),
    Task(Task),
    Log(Log),
    SelfTest(SelfTest),
    End(End),
    TaskExit(TaskExit),
}

/// The postcard variant index of [`Record::Sample`].
const SAMPLE_TAG: u8 = 1;

#[cfg(test)]
mod tests;
