//! A streaming perf.data writer: header, attrs with ids, COMM/FORK/EXIT/
//! MMAP/SAMPLE/LOST/THROTTLE records in time-sorted batches separated by
//! FINISHED_ROUND, and the header feature sections perf uses for names,
//! build-ids and the machine description. Built to the facts in perf's
//! `Documentation/perf.data-file-format.txt` as read by perf 6.1.

use std::io::{self, SeekFrom};

use thiserror::Error;

use crate::output::OwnedWrite;

use crate::perf_abi::{
    self, FILE_ATTR_SIZE, FILE_HEADER_SIZE, attr_flag, attr_offset, feature, misc, record,
    regs_abi, sample,
};

/// Records per sorted batch; a FINISHED_ROUND follows each batch when the
/// order allows it. Keeps perf's memory flat on long recordings.
pub const ROUND_RECORDS: usize = 16 * 1024;

/// What went wrong while writing perf.data.
#[derive(Debug, Error)]
pub enum WriteError {
    /// The output could not be written.
    #[error("writing perf.data: {0}")]
    Io(#[from] io::Error),
    /// No event was configured.
    #[error("a perf.data file needs at least one event")]
    NoEvents,
    /// A sample names an attr index that does not exist.
    #[error("sample refers to event index {0}, but only {1} events are configured")]
    UnknownEvent(usize, usize),
    /// A register block's length does not match the attr's mask.
    #[error("{what} has {got} registers but the event's mask selects {want}")]
    RegisterCount {
        /// Which block ("user registers" or "interrupt registers").
        what: &'static str,
        /// Registers supplied.
        got: usize,
        /// Registers the mask selects.
        want: usize,
    },
    /// Two events share an id.
    #[error("event id {0} is used by more than one event")]
    DuplicateId(u64),
    /// A record would not fit the 16-bit size field of its header.
    #[error("record of {0} bytes exceeds the 65535-byte perf record limit")]
    RecordTooLarge(usize),
    /// An event perf_event_open would refuse, which perf.data readers do
    /// not read back: a config that is no generic hardware or software
    /// event of its type, or sample_type bits the writer does not lay out.
    #[error("event id {id} ({name}): {problem}")]
    BadEvent {
        /// The event's id.
        id: u64,
        /// Its name.
        name: String,
        /// What is wrong.
        problem: String,
    },
}

/// One event (`perf_event_attr` plus its name and sample id).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttrSpec {
    /// The id samples carry in IDENTIFIER; unique in the file.
    pub id: u64,
    /// Name shown by perf (EVENT_DESC), e.g. "cycles" or "cpu-clock".
    pub name: String,
    /// `perf_event_attr.type`.
    pub type_: u32,
    /// `perf_event_attr.config`.
    pub config: u64,
    /// Sample period, or frequency when `freq` is set.
    pub period_or_freq: u64,
    /// Frequency mode.
    pub freq: bool,
    /// `PERF_SAMPLE_*` bits; IDENTIFIER, TID, TIME and CPU are always added.
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
    /// `precise_ip` (0..=3).
    pub precise_ip: u8,
    /// `sample_max_stack`.
    pub max_stack: u16,
}

impl AttrSpec {
    /// A cpu-clock software event with the fields every Perch sample has.
    pub fn cpu_clock(id: u64, name: &str, freq_hz: u64) -> Self {
        AttrSpec {
            id,
            name: name.to_owned(),
            type_: perf_abi::attr_type::SOFTWARE,
            config: perf_abi::SW_CPU_CLOCK,
            period_or_freq: freq_hz,
            freq: true,
            sample_type: sample::IP | sample::PERIOD,
            regs_user: 0,
            regs_intr: 0,
            branch_sample_type: 0,
            exclude_user: false,
            exclude_kernel: false,
            precise_ip: 0,
            max_stack: 0,
        }
    }

    /// Checks what readers rely on: a `PERF_TYPE_HARDWARE` config names a
    /// generic event (`PERF_COUNT_HW_*`, below 10, in its low 32 bits; the
    /// high ones are the extended PMU type), a `PERF_TYPE_SOFTWARE` config a
    /// software counter (`PERF_COUNT_SW_*`, below 12), and `sample_type`
    /// holds only the fields the writer lays out
    /// ([`sample::SUPPORTED`]). Linux's `perf_event_open` refuses the same.
    pub fn check(&self) -> Result<(), WriteError> {
        let bad = |problem: String| WriteError::BadEvent {
            id: self.id,
            name: self.name.clone(),
            problem,
        };
        match self.type_ {
            perf_abi::attr_type::HARDWARE if self.config & 0xffff_ffff >= HW_EVENTS => {
                Err(bad(format!(
                    "hardware config {:#x} is no generic hardware event",
                    self.config
                )))
            }
            perf_abi::attr_type::SOFTWARE if self.config >= SW_EVENTS => Err(bad(format!(
                "software config {:#x} is no software counter",
                self.config
            ))),
            _ if self.sample_type & !sample::SUPPORTED != 0 => Err(bad(format!(
                "sample_type bits {:#x} are not written",
                self.sample_type & !sample::SUPPORTED
            ))),
            _ => {
                if self.sample_type & sample::REGS_USER != 0 {
                    check_regs_mask(self.regs_user, false).map_err(|why| {
                        bad(format!("sample_regs_user {:#x}: {why}", self.regs_user))
                    })?;
                }
                if self.sample_type & sample::REGS_INTR != 0 {
                    check_regs_mask(self.regs_intr, self.precise_ip > 0).map_err(|why| {
                        bad(format!("sample_regs_intr {:#x}: {why}", self.regs_intr))
                    })?;
                }
                if self.sample_type & sample::BRANCH_STACK != 0 {
                    let b = self.branch_sample_type;
                    if b & !(perf_abi::branch::MAX - 1) != 0 {
                        return Err(bad(format!(
                            "branch_sample_type bits {:#x} are not defined",
                            b & !(perf_abi::branch::MAX - 1)
                        )));
                    }
                    if b & !perf_abi::branch::PLM_ALL == 0 {
                        return Err(bad(format!(
                            "branch_sample_type {b:#x} names no branch type"
                        )));
                    }
                }
                Ok(())
            }
        }
    }

    /// The sample type actually written: the configured bits plus the ones
    /// the writer always needs (IDENTIFIER first in every sample so several
    /// attrs line up; TID/TIME/CPU for tasks, ordering and `-C`).
    pub fn effective_sample_type(&self) -> u64 {
        self.sample_type | sample::IDENTIFIER | sample::TID | sample::TIME | sample::CPU
    }

    fn encode(&self) -> [u8; FILE_ATTR_SIZE] {
        let mut b = [0u8; FILE_ATTR_SIZE];
        let put32 = |b: &mut [u8; FILE_ATTR_SIZE], off: usize, v: u32| {
            b[off..off + 4].copy_from_slice(&v.to_le_bytes())
        };
        let put64 = |b: &mut [u8; FILE_ATTR_SIZE], off: usize, v: u64| {
            b[off..off + 8].copy_from_slice(&v.to_le_bytes())
        };
        put32(&mut b, attr_offset::TYPE, self.type_);
        put32(&mut b, attr_offset::SIZE, perf_abi::ATTR_SIZE as u32);
        put64(&mut b, attr_offset::CONFIG, self.config);
        put64(&mut b, attr_offset::SAMPLE_PERIOD, self.period_or_freq);
        put64(
            &mut b,
            attr_offset::SAMPLE_TYPE,
            self.effective_sample_type(),
        );
        let mut flags = attr_flag::SAMPLE_ID_ALL | attr_flag::EXCLUDE_HV | attr_flag::EXCLUDE_GUEST;
        if self.freq {
            flags |= attr_flag::FREQ;
        }
        if self.exclude_user {
            flags |= attr_flag::EXCLUDE_USER;
        }
        if self.exclude_kernel {
            flags |= attr_flag::EXCLUDE_KERNEL;
        }
        flags |= u64::from(self.precise_ip & 3) << attr_flag::PRECISE_IP_SHIFT;
        put64(&mut b, attr_offset::FLAGS, flags);
        // A field whose sample bit is clear means nothing, and is written
        // as 0, as perf record leaves it: perf reads a branch_sample_type
        // with CALL_STACK as "callchains come from the branch stack" even
        // without BRANCH_STACK, and perf script 6.1 then dereferences the
        // branch stack the samples do not have.
        let st = self.effective_sample_type();
        let when = |bit: u64, v: u64| if st & bit != 0 { v } else { 0 };
        put64(
            &mut b,
            attr_offset::BRANCH_SAMPLE_TYPE,
            when(sample::BRANCH_STACK, self.branch_sample_type),
        );
        put64(
            &mut b,
            attr_offset::SAMPLE_REGS_USER,
            when(sample::REGS_USER, self.regs_user),
        );
        put64(
            &mut b,
            attr_offset::SAMPLE_REGS_INTR,
            when(sample::REGS_INTR, self.regs_intr),
        );
        b[attr_offset::SAMPLE_MAX_STACK..attr_offset::SAMPLE_MAX_STACK + 2]
            .copy_from_slice(&self.max_stack.to_le_bytes());
        b
    }
}

/// x86's `perf_reg_validate` and perf_event_open's extended-register
/// rule: a sampled register mask is not empty, names no segment register
/// (DS, ES, FS, GS: not sampled on x86-64) and no reserved bit (24-31),
/// and names XMM registers only where PEBS records them (`pebs`: the
/// interrupt registers of a precise event).
fn check_regs_mask(mask: u64, pebs: bool) -> Result<(), &'static str> {
    use sampler::regs::{RESERVED_MASK, SEGMENT_MASK, XMM_MASK};
    if mask == 0 {
        Err("no register named")
    } else if mask & SEGMENT_MASK != 0 {
        Err("segment registers are not sampled on x86-64")
    } else if mask & RESERVED_MASK != 0 {
        Err("bits 24-31 name no register")
    } else if mask & XMM_MASK != 0 && !pebs {
        Err("XMM registers are sampled only by PEBS (the interrupt registers of a precise event)")
    } else {
        Ok(())
    }
}

/// `PERF_COUNT_HW_MAX`: generic hardware events are below it.
const HW_EVENTS: u64 = 10;
/// `PERF_COUNT_SW_MAX`: software counters are below it.
const SW_EVENTS: u64 = 12;

/// One LBR entry (`struct perf_branch_entry`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BranchEntry {
    /// Branch source.
    pub from: u64,
    /// Branch target.
    pub to: u64,
    /// Packed flags: mispred bit 0, predicted 1, in_tx 2, abort 3, cycles 4-19, type 20-23.
    pub flags: u64,
}

/// One sample to write. Fields the attr does not select are ignored.
#[derive(Clone, Copy, Debug, Default)]
pub struct SampleRecord<'a> {
    /// Index of the event in the writer's attr list.
    pub attr: usize,
    /// `misc::KERNEL` or `misc::USER`.
    pub misc: u16,
    /// Instruction pointer.
    pub ip: u64,
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Time in ns.
    pub time: u64,
    /// Data address.
    pub addr: u64,
    /// CPU number.
    pub cpu: u32,
    /// Period.
    pub period: u64,
    /// Callchain including context markers; the first ip is the sample ip.
    pub callchain: &'a [u64],
    /// Branch stack entries, newest first.
    pub branches: &'a [BranchEntry],
    /// `hw_idx` (written only with `PERF_SAMPLE_BRANCH_HW_INDEX`).
    pub branch_hw_idx: u64,
    /// `regs_abi` of the user registers (0 writes no registers).
    pub regs_user_abi: u64,
    /// User registers in mask-bit order.
    pub regs_user: &'a [u64],
    /// Weight (WEIGHT or WEIGHT_STRUCT).
    pub weight: u64,
    /// `perf_mem_data_src`.
    pub data_src: u64,
    /// `regs_abi` of the interrupt registers.
    pub regs_intr_abi: u64,
    /// Interrupt registers in mask-bit order.
    pub regs_intr: &'a [u64],
}

/// A BUILD_ID feature entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildIdEntry {
    /// `misc::KERNEL` for `[kernel.kallsyms]`, `misc::USER` for user DSOs.
    pub cpumode: u16,
    /// Build-id bytes (at most 20).
    pub build_id: Vec<u8>,
    /// DSO name: `[kernel.kallsyms]` or the absolute path of the ELF.
    pub filename: String,
    /// The entry's pid: -1 (`HOST_KERNEL_ID`, the host machine) for every
    /// entry perf itself writes; perf looks any other pid up as a guest
    /// machine.
    pub pid: i32,
}

/// Where one CPU sits, for the CPU_TOPOLOGY feature (the values of its
/// sysfs `topology/` files on Linux).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTopo {
    /// `physical_package_id`.
    pub socket: u32,
    /// `die_id`.
    pub die: u32,
    /// `core_id` (unique within the package).
    pub core: u32,
}

/// Machine description written into the feature sections.
#[derive(Clone, Debug, Default)]
pub struct FileMeta {
    /// HOSTNAME.
    pub hostname: String,
    /// OSRELEASE.
    pub osrelease: String,
    /// VERSION (the writing tool's version).
    pub version: String,
    /// ARCH, e.g. "x86_64".
    pub arch: String,
    /// NRCPUS: (available, online).
    pub nr_cpus: (u32, u32),
    /// CPU_TOPOLOGY: each CPU's place, by CPU number. Written only when
    /// it has one entry for each of the `nr_cpus.0` available CPUs, which
    /// is how many perf reads.
    pub cpus: Vec<CpuTopo>,
    /// CPUDESC.
    pub cpudesc: String,
    /// CMDLINE arguments.
    pub cmdline: Vec<String>,
    /// BUILD_ID entries.
    pub build_ids: Vec<BuildIdEntry>,
}

/// Counters of what was written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteStats {
    /// SAMPLE records.
    pub samples: u64,
    /// Sum of LOST record counts (saturating: counts come from the target).
    pub lost: u64,
    /// Sum of LOST_SAMPLES counts (saturating).
    pub lost_samples: u64,
    /// FINISHED_ROUND records.
    pub rounds: u64,
    /// Bytes of the data section.
    pub data_bytes: u64,
    /// Earliest and latest sample time, if any sample was written.
    pub sample_time: Option<(u64, u64)>,
}

struct Pending {
    time: u64,
    start: u32,
    len: u32,
}

/// What the sample records of one attr hold, worked out once.
#[derive(Clone, Copy, Debug)]
struct SampleLayout {
    /// The attr's id (IDENTIFIER, ID, STREAM_ID).
    id: u64,
    /// The effective `sample_type`.
    st: u64,
    /// Bytes of the words every record has: header, IDENTIFIER, TID, TIME,
    /// CPU, and the single-word optional fields the attr asks for.
    fixed: usize,
    /// The branch stack starts with `hw_idx`.
    hw_idx: bool,
    /// Registers in the attr's user and interrupt register masks.
    regs_user: usize,
    regs_intr: usize,
}

impl SampleLayout {
    fn of(a: &AttrSpec) -> Self {
        let st = a.effective_sample_type();
        let flag = |bit: u64| usize::from(st & bit != 0);
        SampleLayout {
            id: a.id,
            st,
            fixed: 8
                * (5 + flag(sample::IP)
                    + flag(sample::ADDR)
                    + flag(sample::ID)
                    + flag(sample::STREAM_ID)
                    + flag(sample::PERIOD)
                    + flag(sample::WEIGHT | sample::WEIGHT_STRUCT)
                    + flag(sample::DATA_SRC)),
            hw_idx: a.branch_sample_type & perf_abi::branch::HW_INDEX != 0,
            regs_user: a.regs_user.count_ones() as usize,
            regs_intr: a.regs_intr.count_ones() as usize,
        }
    }
}

/// Bytes kept free at the start of every batch for the FINISHED_ROUND
/// that may have to precede it, so the batch goes out in one piece.
const ROUND_SLOT: usize = 8;

/// Bytes of the batch zeroed at a time ahead of the sample records.
const ZERO_AHEAD: usize = 1024;

/// Writes one perf.data file. Records may arrive slightly out of time
/// order (several CPUs); each batch is sorted before it is written.
/// Batches are handed to the output by value ([`OwnedWrite`]), so a
/// [`BackgroundFile`](crate::output::BackgroundFile) writes them without
/// copying them first.
pub struct PerfDataWriter<W: OwnedWrite> {
    out: W,
    attrs: Vec<AttrSpec>,
    /// Per attr, what its sample records hold.
    layouts: Vec<SampleLayout>,
    data_offset: u64,
    /// `ROUND_SLOT` bytes, then the queued records (`used` bytes in all).
    /// Past `used`, bytes ready for sample records, which are stored word
    /// by word and so need their bytes to exist first: the batch is grown
    /// (zeroed) ahead in [`ZERO_AHEAD`] pieces, not per record, and keeps
    /// its length when it comes back from the output, so a reused batch is
    /// not zeroed again (every word of a sample record is stored).
    batch: Vec<u8>,
    used: usize,
    /// Where an out-of-order batch is put in order.
    sorted: Vec<u8>,
    /// The earliest and latest sample time so far (meaningful once
    /// `stats.samples` is not zero; `stats.sample_time` is made from it).
    sample_time: (u64, u64),
    pending: Vec<Pending>,
    stats: WriteStats,
    // perf's ordered-events state, mirrored to decide when a round is safe.
    max_time_written: u64,
    next_flush: u64,
}

impl<W: OwnedWrite> PerfDataWriter<W> {
    /// Starts a file with these events; the header is completed by [`finish`](Self::finish).
    pub fn new(out: W, attrs: Vec<AttrSpec>) -> Result<Self, WriteError> {
        if attrs.is_empty() {
            return Err(WriteError::NoEvents);
        }
        for (i, a) in attrs.iter().enumerate() {
            if attrs[..i].iter().any(|b| b.id == a.id) {
                return Err(WriteError::DuplicateId(a.id));
            }
            a.check()?;
        }
        let mut out = out;
        let mut head = Vec::with_capacity(FILE_HEADER_SIZE as usize + 200 * attrs.len());
        head.extend_from_slice(&[0u8; FILE_HEADER_SIZE as usize]);
        let attrs_offset = FILE_HEADER_SIZE;
        let ids_offset = attrs_offset + (attrs.len() * FILE_ATTR_SIZE) as u64;
        for (i, a) in attrs.iter().enumerate() {
            let mut b = a.encode();
            let ids = ids_offset + 8 * i as u64;
            b[perf_abi::ATTR_SIZE..perf_abi::ATTR_SIZE + 8].copy_from_slice(&ids.to_le_bytes());
            b[perf_abi::ATTR_SIZE + 8..].copy_from_slice(&8u64.to_le_bytes());
            head.extend_from_slice(&b);
        }
        for a in &attrs {
            head.extend_from_slice(&a.id.to_le_bytes());
        }
        out.write_all(&head)?;
        let data_offset = ids_offset + 8 * attrs.len() as u64;
        let mut batch = Vec::with_capacity(1 << 20);
        batch.resize(ROUND_SLOT, 0);
        Ok(PerfDataWriter {
            out,
            layouts: attrs.iter().map(SampleLayout::of).collect(),
            attrs,
            data_offset,
            batch,
            used: ROUND_SLOT,
            sorted: Vec::new(),
            sample_time: (u64::MAX, 0),
            pending: Vec::with_capacity(ROUND_RECORDS),
            stats: WriteStats::default(),
            max_time_written: 0,
            next_flush: 0,
        })
    }

    /// The configured events.
    pub fn attrs(&self) -> &[AttrSpec] {
        &self.attrs
    }

    /// What has been written so far.
    pub fn stats(&self) -> WriteStats {
        WriteStats {
            sample_time: (self.stats.samples > 0).then_some(self.sample_time),
            ..self.stats
        }
    }

    /// The sample_id trailer of non-sample records, laid out for attr 0.
    fn push_sample_id(buf: &mut Vec<u8>, attr: &AttrSpec, pid: u32, tid: u32, time: u64, cpu: u32) {
        let st = attr.effective_sample_type();
        if st & sample::TID != 0 {
            buf.extend_from_slice(&pid.to_le_bytes());
            buf.extend_from_slice(&tid.to_le_bytes());
        }
        if st & sample::TIME != 0 {
            buf.extend_from_slice(&time.to_le_bytes());
        }
        if st & sample::ID != 0 {
            buf.extend_from_slice(&attr.id.to_le_bytes());
        }
        if st & sample::STREAM_ID != 0 {
            buf.extend_from_slice(&attr.id.to_le_bytes());
        }
        if st & sample::CPU != 0 {
            buf.extend_from_slice(&cpu.to_le_bytes());
            buf.extend_from_slice(&0u32.to_le_bytes());
        }
        buf.extend_from_slice(&attr.id.to_le_bytes());
    }

    fn begin(buf: &mut Vec<u8>, type_: u32, misc: u16) -> usize {
        let start = buf.len();
        buf.extend_from_slice(&type_.to_le_bytes());
        buf.extend_from_slice(&misc.to_le_bytes());
        buf.extend_from_slice(&0u16.to_le_bytes());
        start
    }

    /// The batch, cut to the bytes in use, for a record to be appended.
    fn take_batch(&mut self) -> Vec<u8> {
        self.batch.truncate(self.used);
        std::mem::take(&mut self.batch)
    }

    /// Fixes the size of the record appended to the batch at `start` and
    /// queues it.
    fn end(&mut self, start: usize, time: u64) -> Result<(), WriteError> {
        let len = self.batch.len() - start;
        debug_assert_eq!(len % 8, 0);
        if len > usize::from(u16::MAX) {
            self.batch.truncate(start);
            return Err(WriteError::RecordTooLarge(len));
        }
        self.batch[start + 6..start + 8].copy_from_slice(&(len as u16).to_le_bytes());
        self.queue(start, len, time)
    }

    /// Queues the record of `len` bytes at `start`, the last in the batch.
    #[inline(always)]
    fn queue(&mut self, start: usize, len: usize, time: u64) -> Result<(), WriteError> {
        self.used = start + len;
        self.pending.push(Pending {
            time,
            start: start as u32,
            len: len as u32,
        });
        if self.pending.len() >= ROUND_RECORDS {
            self.flush_batch()?;
        }
        Ok(())
    }

    fn push_str_padded(buf: &mut Vec<u8>, s: &str) {
        let bytes = s.as_bytes();
        let bytes = &bytes[..bytes.iter().position(|&c| c == 0).unwrap_or(bytes.len())];
        buf.extend_from_slice(bytes);
        let padded = perf_abi::align8(bytes.len() + 1);
        buf.resize(buf.len() + padded - bytes.len(), 0);
    }

    /// PERF_RECORD_COMM: names a task from `time` on.
    pub fn comm(&mut self, pid: u32, tid: u32, name: &str, time: u64) -> Result<(), WriteError> {
        self.comm_with_misc(0, pid, tid, name, time)
    }

    /// PERF_RECORD_COMM with `PERF_RECORD_MISC_COMM_EXEC`: the task's
    /// process replaced its program at `time` and is named `name` from
    /// then on (`perf script --show-task-events` prints it as `exec:`).
    pub fn exec_comm(
        &mut self,
        pid: u32,
        tid: u32,
        name: &str,
        time: u64,
    ) -> Result<(), WriteError> {
        self.comm_with_misc(misc::COMM_EXEC, pid, tid, name, time)
    }

    fn comm_with_misc(
        &mut self,
        misc: u16,
        pid: u32,
        tid: u32,
        name: &str,
        time: u64,
    ) -> Result<(), WriteError> {
        let mut buf = self.take_batch();
        let start = Self::begin(&mut buf, record::COMM, misc);
        buf.extend_from_slice(&pid.to_le_bytes());
        buf.extend_from_slice(&tid.to_le_bytes());
        Self::push_str_padded(&mut buf, name);
        Self::push_sample_id(&mut buf, &self.attrs[0], pid, tid, time, 0);
        self.batch = buf;
        self.end(start, time)
    }

    /// PERF_RECORD_EXIT: the task ended at `time`. Its parent (`ppid`,
    /// `ptid`) is the process's parent, as Linux fills them for every
    /// thread of a group: the runtime, pid 0, which started it.
    pub fn exit(&mut self, pid: u32, tid: u32, time: u64) -> Result<(), WriteError> {
        self.fork_or_exit(record::EXIT, pid, 0, tid, 0, time)
    }

    /// PERF_RECORD_FORK: task (`pid`, `tid`) was made at `time` by task
    /// `ptid` of process `ppid`, a thread of its own process (`pid ==
    /// ppid`, as perf records a `clone`) or the first thread of a forked
    /// one.
    pub fn fork(
        &mut self,
        pid: u32,
        ppid: u32,
        tid: u32,
        ptid: u32,
        time: u64,
    ) -> Result<(), WriteError> {
        self.fork_or_exit(record::FORK, pid, ppid, tid, ptid, time)
    }

    /// A FORK or EXIT record (the same body): pid, ppid, tid, ptid, time.
    fn fork_or_exit(
        &mut self,
        type_: u32,
        pid: u32,
        ppid: u32,
        tid: u32,
        ptid: u32,
        time: u64,
    ) -> Result<(), WriteError> {
        let mut buf = self.take_batch();
        let start = Self::begin(&mut buf, type_, 0);
        buf.extend_from_slice(&pid.to_le_bytes());
        buf.extend_from_slice(&ppid.to_le_bytes());
        buf.extend_from_slice(&tid.to_le_bytes());
        buf.extend_from_slice(&ptid.to_le_bytes());
        buf.extend_from_slice(&time.to_le_bytes());
        Self::push_sample_id(&mut buf, &self.attrs[0], pid, tid, time, 0);
        self.batch = buf;
        self.end(start, time)
    }

    /// PERF_RECORD_READ of event `attr` for task (`pid`, `tid`): its count
    /// over the task's life (the periods of its samples), as perf writes
    /// at a thread's exit with `inherit_stat`; `perf report -T` lists them.
    pub fn read(
        &mut self,
        attr: usize,
        pid: u32,
        tid: u32,
        value: u64,
        time: u64,
    ) -> Result<(), WriteError> {
        let mut buf = self.take_batch();
        let start = Self::begin(&mut buf, record::READ, 0);
        buf.extend_from_slice(&pid.to_le_bytes());
        buf.extend_from_slice(&tid.to_le_bytes());
        buf.extend_from_slice(&value.to_le_bytes());
        Self::push_sample_id(&mut buf, &self.attrs[attr], pid, tid, time, 0);
        self.batch = buf;
        self.end(start, time)
    }

    /// PERF_RECORD_MMAP. Kernel maps use `pid = u32::MAX` (-1), `tid = 0`
    /// and `misc::KERNEL`; user maps `misc::USER` and the task's ids.
    #[allow(clippy::too_many_arguments)]
    pub fn mmap(
        &mut self,
        cpumode: u16,
        pid: u32,
        tid: u32,
        addr: u64,
        len: u64,
        pgoff: u64,
        filename: &str,
        time: u64,
    ) -> Result<(), WriteError> {
        let mut buf = self.take_batch();
        let start = Self::begin(&mut buf, record::MMAP, cpumode);
        buf.extend_from_slice(&pid.to_le_bytes());
        buf.extend_from_slice(&tid.to_le_bytes());
        buf.extend_from_slice(&addr.to_le_bytes());
        buf.extend_from_slice(&len.to_le_bytes());
        buf.extend_from_slice(&pgoff.to_le_bytes());
        Self::push_str_padded(&mut buf, filename);
        Self::push_sample_id(&mut buf, &self.attrs[0], pid, tid, time, 0);
        self.batch = buf;
        self.end(start, time)
    }

    /// PERF_RECORD_MMAP2 of a user file mapping: `prot` (PROT_* bits),
    /// MAP_PRIVATE, and the file's build-id when it has one (misc
    /// `MMAP_BUILD_ID`, which perf 5.12 and later read instead of the
    /// device and inode), else zero device and inode numbers.
    #[allow(clippy::too_many_arguments)]
    pub fn mmap2(
        &mut self,
        pid: u32,
        tid: u32,
        addr: u64,
        len: u64,
        pgoff: u64,
        prot: u32,
        build_id: &[u8],
        filename: &str,
        time: u64,
    ) -> Result<(), WriteError> {
        const MAP_PRIVATE: u32 = 2;
        let mut buf = self.take_batch();
        let cpumode = if build_id.is_empty() {
            misc::USER
        } else {
            misc::USER | misc::MMAP_BUILD_ID
        };
        let start = Self::begin(&mut buf, record::MMAP2, cpumode);
        buf.extend_from_slice(&pid.to_le_bytes());
        buf.extend_from_slice(&tid.to_le_bytes());
        buf.extend_from_slice(&addr.to_le_bytes());
        buf.extend_from_slice(&len.to_le_bytes());
        buf.extend_from_slice(&pgoff.to_le_bytes());
        let mut id = [0u8; 24];
        if !build_id.is_empty() {
            let n = build_id.len().min(20);
            id[0] = n as u8;
            id[4..4 + n].copy_from_slice(&build_id[..n]);
        }
        buf.extend_from_slice(&id);
        buf.extend_from_slice(&prot.to_le_bytes());
        buf.extend_from_slice(&MAP_PRIVATE.to_le_bytes());
        Self::push_str_padded(&mut buf, filename);
        Self::push_sample_id(&mut buf, &self.attrs[0], pid, tid, time, 0);
        self.batch = buf;
        self.end(start, time)
    }

    /// PERF_RECORD_LOST: `count` samples of event `attr` were dropped.
    pub fn lost(&mut self, attr: usize, count: u64, time: u64, cpu: u32) -> Result<(), WriteError> {
        let a = self
            .attrs
            .get(attr)
            .ok_or(WriteError::UnknownEvent(attr, self.attrs.len()))?;
        let id = a.id;
        let mut buf = self.take_batch();
        let start = Self::begin(&mut buf, record::LOST, 0);
        buf.extend_from_slice(&id.to_le_bytes());
        buf.extend_from_slice(&count.to_le_bytes());
        Self::push_sample_id(&mut buf, &self.attrs[attr], 0, 0, time, cpu);
        self.batch = buf;
        self.stats.lost = self.stats.lost.saturating_add(count);
        self.end(start, time)
    }

    /// PERF_RECORD_LOST_SAMPLES: `count` samples were dropped (shown by
    /// `perf report` as "Total Lost Samples").
    pub fn lost_samples(
        &mut self,
        attr: usize,
        count: u64,
        time: u64,
        cpu: u32,
    ) -> Result<(), WriteError> {
        if attr >= self.attrs.len() {
            return Err(WriteError::UnknownEvent(attr, self.attrs.len()));
        }
        let mut buf = self.take_batch();
        let start = Self::begin(&mut buf, record::LOST_SAMPLES, 0);
        buf.extend_from_slice(&count.to_le_bytes());
        Self::push_sample_id(&mut buf, &self.attrs[attr], 0, 0, time, cpu);
        self.batch = buf;
        self.stats.lost_samples = self.stats.lost_samples.saturating_add(count);
        self.end(start, time)
    }

    /// PERF_RECORD_THROTTLE (or UNTHROTTLE when `throttled` is false).
    pub fn throttle(
        &mut self,
        attr: usize,
        throttled: bool,
        time: u64,
        cpu: u32,
    ) -> Result<(), WriteError> {
        let a = self
            .attrs
            .get(attr)
            .ok_or(WriteError::UnknownEvent(attr, self.attrs.len()))?;
        let id = a.id;
        let ty = if throttled {
            record::THROTTLE
        } else {
            record::UNTHROTTLE
        };
        let mut buf = self.take_batch();
        let start = Self::begin(&mut buf, ty, 0);
        buf.extend_from_slice(&time.to_le_bytes());
        buf.extend_from_slice(&id.to_le_bytes());
        buf.extend_from_slice(&id.to_le_bytes());
        Self::push_sample_id(&mut buf, &self.attrs[attr], 0, 0, time, cpu);
        self.batch = buf;
        self.end(start, time)
    }

    /// Checks a register block against the attr's mask; returns the bytes
    /// it takes (the ABI word plus the values unless the ABI is NONE).
    /// `want` is the number of bits in the mask.
    #[inline(always)]
    fn regs_bytes(
        what: &'static str,
        want: usize,
        abi: u64,
        regs: &[u64],
    ) -> Result<usize, WriteError> {
        if abi == regs_abi::NONE {
            return Ok(8);
        }
        if regs.len() != want {
            return Err(WriteError::RegisterCount {
                what,
                got: regs.len(),
                want,
            });
        }
        Ok(8 + 8 * want)
    }

    /// PERF_RECORD_SAMPLE, laid out for the sample's attr. The record's
    /// size is worked out first, then its words are stored straight into
    /// the batch: no per-field growth checks, no intermediate copy.
    pub fn sample(&mut self, s: &SampleRecord<'_>) -> Result<(), WriteError> {
        self.sample_chain(s, Chain::Plain(s.callchain))
    }

    /// Like [`sample`](Self::sample), with the callchain given as
    /// `lead` (a context marker written first, if any) followed by the
    /// running sums of `deltas` from `base`: the words are summed as they
    /// are stored, with no copy of the chain first. `s.callchain` is
    /// ignored.
    pub fn sample_deltas(
        &mut self,
        s: &SampleRecord<'_>,
        lead: Option<u64>,
        base: u64,
        deltas: &[u64],
    ) -> Result<(), WriteError> {
        self.sample_chain(s, Chain::Deltas { lead, base, deltas })
    }

    #[inline(always)]
    fn sample_chain(&mut self, s: &SampleRecord<'_>, chain: Chain<'_>) -> Result<(), WriteError> {
        let Some(&SampleLayout {
            id,
            st,
            fixed,
            hw_idx,
            regs_user,
            regs_intr,
        }) = self.layouts.get(s.attr)
        else {
            return Err(WriteError::UnknownEvent(s.attr, self.attrs.len()));
        };
        let mut len = fixed;
        if st & sample::CALLCHAIN != 0 {
            len += 8 + 8 * chain.len();
        }
        if st & sample::BRANCH_STACK != 0 {
            len += 8 + 8 * usize::from(hw_idx) + 24 * s.branches.len();
        }
        if st & sample::REGS_USER != 0 {
            len += Self::regs_bytes("user registers", regs_user, s.regs_user_abi, s.regs_user)?;
        }
        if st & sample::REGS_INTR != 0 {
            len += Self::regs_bytes(
                "interrupt registers",
                regs_intr,
                s.regs_intr_abi,
                s.regs_intr,
            )?;
        }
        if len > usize::from(u16::MAX) {
            return Err(WriteError::RecordTooLarge(len));
        }
        let start = self.used;
        let end = start + len;
        if self.batch.len() < end {
            let ahead = (end + ZERO_AHEAD).min(self.batch.capacity().max(end));
            self.batch.resize(ahead, 0);
        }
        let mut p = Put {
            b: self.batch[start..].as_chunks_mut::<8>().0,
            at: 0,
        };
        p.u32x2(record::SAMPLE, u32::from(s.misc) | (len as u32) << 16);
        p.u64(id); // IDENTIFIER
        if st & sample::IP != 0 {
            p.u64(s.ip);
        }
        p.u32x2(s.pid, s.tid);
        p.u64(s.time);
        if st & sample::ADDR != 0 {
            p.u64(s.addr);
        }
        if st & sample::ID != 0 {
            p.u64(id);
        }
        if st & sample::STREAM_ID != 0 {
            p.u64(id);
        }
        p.u32x2(s.cpu, 0);
        if st & sample::PERIOD != 0 {
            p.u64(s.period);
        }
        if st & sample::CALLCHAIN != 0 {
            p.u64(chain.len() as u64);
            match chain {
                Chain::Plain(c) => p.u64s(c),
                Chain::Deltas { lead, base, deltas } => {
                    if let Some(m) = lead {
                        p.u64(m);
                    }
                    p.sums(base, deltas);
                }
            }
        }
        if st & sample::BRANCH_STACK != 0 {
            p.u64(s.branches.len() as u64);
            if hw_idx {
                p.u64(s.branch_hw_idx);
            }
            for b in s.branches {
                p.u64(b.from);
                p.u64(b.to);
                p.u64(b.flags);
            }
        }
        if st & sample::REGS_USER != 0 {
            p.regs(s.regs_user_abi, s.regs_user);
        }
        if st & (sample::WEIGHT | sample::WEIGHT_STRUCT) != 0 {
            p.u64(s.weight);
        }
        if st & sample::DATA_SRC != 0 {
            p.u64(s.data_src);
        }
        if st & sample::REGS_INTR != 0 {
            p.regs(s.regs_intr_abi, s.regs_intr);
        }
        debug_assert_eq!(p.at * 8, len);
        self.stats.samples += 1;
        self.sample_time.0 = self.sample_time.0.min(s.time);
        self.sample_time.1 = self.sample_time.1.max(s.time);
        self.queue(start, len, s.time)
    }

    /// Writes the queued records in time order; puts a FINISHED_ROUND in
    /// front of them when no queued record is older than what perf will
    /// have flushed by then, so perf never sees an out-of-order event.
    fn flush_batch(&mut self) -> Result<(), WriteError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let sorted = self.pending.is_sorted_by_key(|p| p.time);
        if !sorted {
            self.pending.sort_by_key(|p| p.time);
        }
        let min = self.pending[0].time;
        let round = self.stats.samples > 0 && min >= self.next_flush && self.max_time_written > 0;
        let mut finished_round = [0u8; ROUND_SLOT];
        finished_round[..4].copy_from_slice(&record::FINISHED_ROUND.to_le_bytes());
        finished_round[6..].copy_from_slice(&8u16.to_le_bytes());
        if round {
            self.stats.rounds += 1;
            self.stats.data_bytes += ROUND_SLOT as u64;
            self.next_flush = self.max_time_written;
        }
        if sorted {
            // Already in order (the usual case): the batch itself goes to
            // the output, the round (if any) in its reserved slot.
            self.stats.data_bytes += (self.used - ROUND_SLOT) as u64;
            let last = self.pending.last().map_or(0, |p| p.time);
            self.max_time_written = self.max_time_written.max(last);
            let from = if round {
                self.batch[..ROUND_SLOT].copy_from_slice(&finished_round);
                0
            } else {
                ROUND_SLOT
            };
            let batch = std::mem::take(&mut self.batch);
            self.batch = self.out.write_owned(batch, from..self.used)?;
        } else {
            // Gather the records in time order into the spare buffer.
            let mut out = std::mem::take(&mut self.sorted);
            out.clear();
            out.reserve(self.used);
            if round {
                out.extend_from_slice(&finished_round);
            }
            for p in &self.pending {
                let (s, l) = (p.start as usize, p.len as usize);
                out.extend_from_slice(&self.batch[s..s + l]);
                self.stats.data_bytes += l as u64;
                self.max_time_written = self.max_time_written.max(p.time);
            }
            let all = 0..out.len();
            self.sorted = self.out.write_owned(out, all)?;
        }
        self.pending.clear();
        if self.batch.len() < ROUND_SLOT {
            self.batch.resize(ROUND_SLOT, 0);
        }
        self.used = ROUND_SLOT;
        Ok(())
    }

    /// Writes the remaining records, the feature sections and the header.
    pub fn finish(mut self, meta: &FileMeta) -> Result<(W, WriteStats), WriteError> {
        self.flush_batch()?;
        let data_size = self.stats.data_bytes;
        let mut feats: Vec<(u32, Vec<u8>)> = Vec::new();
        let has_branch = self
            .attrs
            .iter()
            .any(|a| a.effective_sample_type() & sample::BRANCH_STACK != 0);
        if !meta.build_ids.is_empty() {
            feats.push((feature::BUILD_ID, encode_build_ids(&meta.build_ids)));
        }
        feats.push((feature::HOSTNAME, encode_string(&meta.hostname)));
        feats.push((feature::OSRELEASE, encode_string(&meta.osrelease)));
        feats.push((feature::VERSION, encode_string(&meta.version)));
        feats.push((feature::ARCH, encode_string(&meta.arch)));
        let mut nr = Vec::with_capacity(8);
        nr.extend_from_slice(&meta.nr_cpus.0.to_le_bytes());
        nr.extend_from_slice(&meta.nr_cpus.1.to_le_bytes());
        feats.push((feature::NRCPUS, nr));
        feats.push((feature::CPUDESC, encode_string(&meta.cpudesc)));
        if !meta.cpus.is_empty() && meta.cpus.len() == meta.nr_cpus.0 as usize {
            feats.push((feature::CPU_TOPOLOGY, encode_cpu_topology(&meta.cpus)));
        }
        let mut cmd = Vec::new();
        cmd.extend_from_slice(&(meta.cmdline.len() as u32).to_le_bytes());
        for c in &meta.cmdline {
            cmd.extend_from_slice(&encode_string(c));
        }
        feats.push((feature::CMDLINE, cmd));
        feats.push((feature::EVENT_DESC, self.encode_event_desc()));
        if has_branch {
            feats.push((feature::BRANCH_STACK, Vec::new()));
        }
        self.stats = self.stats();
        if let Some((first, last)) = self.stats.sample_time {
            let mut t = Vec::with_capacity(16);
            t.extend_from_slice(&first.to_le_bytes());
            t.extend_from_slice(&last.to_le_bytes());
            feats.push((feature::SAMPLE_TIME, t));
        }
        feats.sort_by_key(|f| f.0);
        let index_offset = self.data_offset + data_size;
        let mut payload_offset = index_offset + 16 * feats.len() as u64;
        let mut tail = Vec::new();
        for (_, p) in &feats {
            tail.extend_from_slice(&payload_offset.to_le_bytes());
            tail.extend_from_slice(&(p.len() as u64).to_le_bytes());
            payload_offset += p.len() as u64;
        }
        for (_, p) in &feats {
            tail.extend_from_slice(p);
        }
        self.out.write_all(&tail)?;
        let mut bits = [0u8; 32];
        for (f, _) in &feats {
            bits[(*f / 8) as usize] |= 1 << (f % 8);
        }
        let mut h = Vec::with_capacity(FILE_HEADER_SIZE as usize);
        h.extend_from_slice(perf_abi::MAGIC);
        h.extend_from_slice(&FILE_HEADER_SIZE.to_le_bytes());
        h.extend_from_slice(&(FILE_ATTR_SIZE as u64).to_le_bytes());
        h.extend_from_slice(&FILE_HEADER_SIZE.to_le_bytes());
        h.extend_from_slice(&((self.attrs.len() * FILE_ATTR_SIZE) as u64).to_le_bytes());
        h.extend_from_slice(&self.data_offset.to_le_bytes());
        h.extend_from_slice(&data_size.to_le_bytes());
        h.extend_from_slice(&[0u8; 16]);
        h.extend_from_slice(&bits);
        let mut out = self.out;
        out.seek(SeekFrom::Start(0))?;
        out.write_all(&h)?;
        out.seek(SeekFrom::End(0))?;
        out.flush()?;
        Ok((out, self.stats))
    }

    fn encode_event_desc(&self) -> Vec<u8> {
        let mut d = Vec::new();
        d.extend_from_slice(&(self.attrs.len() as u32).to_le_bytes());
        d.extend_from_slice(&(perf_abi::ATTR_SIZE as u32).to_le_bytes());
        for a in &self.attrs {
            d.extend_from_slice(&a.encode()[..perf_abi::ATTR_SIZE]);
            d.extend_from_slice(&1u32.to_le_bytes());
            d.extend_from_slice(&encode_string(&a.name));
            d.extend_from_slice(&a.id.to_le_bytes());
        }
        d
    }
}

/// Stores little-endian words into a record whose size is already known.
/// A sample's callchain as the writer receives it.
#[derive(Clone, Copy)]
enum Chain<'a> {
    /// The words as they are.
    Plain(&'a [u64]),
    /// `lead`, then the running sums of `deltas` from `base`.
    Deltas {
        lead: Option<u64>,
        base: u64,
        deltas: &'a [u64],
    },
}

impl Chain<'_> {
    /// Words in the chain.
    #[inline]
    fn len(&self) -> usize {
        match *self {
            Chain::Plain(c) => c.len(),
            Chain::Deltas { lead, deltas, .. } => usize::from(lead.is_some()) + deltas.len(),
        }
    }
}

struct Put<'a> {
    /// The record, as little-endian words.
    b: &'a mut [[u8; 8]],
    /// The next word.
    at: usize,
}

impl Put<'_> {
    #[inline]
    fn u64(&mut self, v: u64) {
        self.b[self.at] = v.to_le_bytes();
        self.at += 1;
    }

    #[inline]
    fn u32x2(&mut self, lo: u32, hi: u32) {
        self.u64(u64::from(lo) | u64::from(hi) << 32);
    }

    #[inline(always)]
    fn u64s(&mut self, vs: &[u64]) {
        let end = self.at + vs.len();
        for (d, v) in self.b[self.at..end].iter_mut().zip(vs) {
            *d = v.to_le_bytes();
        }
        self.at = end;
    }

    /// The running sums of `deltas` from `base`.
    #[inline(always)]
    fn sums(&mut self, base: u64, deltas: &[u64]) {
        let end = self.at + deltas.len();
        let mut v = base;
        for (d, dv) in self.b[self.at..end].iter_mut().zip(deltas) {
            v = v.wrapping_add(*dv);
            *d = v.to_le_bytes();
        }
        self.at = end;
    }

    /// A register block already checked by `regs_bytes`.
    #[inline(always)]
    fn regs(&mut self, abi: u64, regs: &[u64]) {
        self.u64(abi);
        if abi != regs_abi::NONE {
            self.u64s(regs);
        }
    }
}

/// `struct perf_header_string`: u32 len, then the string NUL-padded to 64.
fn encode_string(s: &str) -> Vec<u8> {
    let s = s.replace('\0', "");
    let len = (s.len() + 1).div_ceil(64) * 64;
    let mut v = Vec::with_capacity(4 + len);
    v.extend_from_slice(&(len as u32).to_le_bytes());
    v.extend_from_slice(s.as_bytes());
    v.resize(4 + len, 0);
    v
}

/// CPU numbers as a cpulist (`0-3,8,10-11`): ascending, runs of two or
/// more consecutive numbers as a range, as sysfs writes them.
pub fn cpu_list(cpus: &[u32]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out = String::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end.wrapping_add(1) {
            i += 1;
            end = sorted[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if end == start {
            out.push_str(&start.to_string());
        } else {
            out.push_str(&format!("{start}-{end}"));
        }
        i += 1;
    }
    out
}

/// The cpulists of the CPUs that share a key, in the order each key's
/// first CPU comes.
fn sibling_lists<K: PartialEq>(cpus: &[CpuTopo], key: impl Fn(&CpuTopo) -> K) -> Vec<String> {
    let mut groups: Vec<(K, Vec<u32>)> = Vec::new();
    for (n, c) in cpus.iter().enumerate() {
        let k = key(c);
        match groups.iter_mut().find(|(g, _)| *g == k) {
            Some((_, members)) => members.push(n as u32),
            None => groups.push((k, vec![n as u32])),
        }
    }
    groups.into_iter().map(|(_, m)| cpu_list(&m)).collect()
}

/// `HEADER_CPU_TOPOLOGY` as perf's `write_cpu_topology` lays it out (and
/// `process_cpu_topology` reads it): the packages' sibling lists (u32
/// count, then strings), the cores' (threads of one core), one
/// {u32 core_id, u32 socket_id} per CPU, then the dies' sibling lists and
/// one u32 die_id per CPU.
fn encode_cpu_topology(cpus: &[CpuTopo]) -> Vec<u8> {
    fn lists(v: &mut Vec<u8>, lists: Vec<String>) {
        v.extend_from_slice(&(lists.len() as u32).to_le_bytes());
        for l in &lists {
            v.extend_from_slice(&encode_string(l));
        }
    }
    let mut v = Vec::new();
    lists(&mut v, sibling_lists(cpus, |c| c.socket));
    lists(&mut v, sibling_lists(cpus, |c| (c.socket, c.die, c.core)));
    for c in cpus {
        v.extend_from_slice(&c.core.to_le_bytes());
        v.extend_from_slice(&c.socket.to_le_bytes());
    }
    lists(&mut v, sibling_lists(cpus, |c| (c.socket, c.die)));
    for c in cpus {
        v.extend_from_slice(&c.die.to_le_bytes());
    }
    v
}

fn encode_build_ids(entries: &[BuildIdEntry]) -> Vec<u8> {
    let mut v = Vec::new();
    for e in entries {
        let name_len = (e.filename.len() + 1).div_ceil(64) * 64;
        let size = 8 + 4 + 24 + name_len;
        v.extend_from_slice(&0u32.to_le_bytes());
        v.extend_from_slice(&(e.cpumode | misc::BUILD_ID_SIZE).to_le_bytes());
        v.extend_from_slice(&(size as u16).to_le_bytes());
        v.extend_from_slice(&e.pid.to_le_bytes());
        let mut id = [0u8; 24];
        let n = e.build_id.len().min(20);
        id[..n].copy_from_slice(&e.build_id[..n]);
        id[20] = n as u8;
        v.extend_from_slice(&id);
        v.extend_from_slice(e.filename.as_bytes());
        v.resize(v.len() + name_len - e.filename.len(), 0);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn u64_at(b: &[u8], off: usize) -> u64 {
        u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
    }

    #[test]
    fn header_points_at_attrs_data_and_features() {
        let attrs = vec![AttrSpec::cpu_clock(7, "cpu-clock", 1000)];
        let mut w = PerfDataWriter::new(Cursor::new(Vec::new()), attrs).unwrap();
        w.comm(1, 1, "task", 0).unwrap();
        w.sample(&SampleRecord {
            ip: 0x1000,
            pid: 1,
            tid: 1,
            time: 5,
            period: 9,
            misc: misc::USER,
            ..Default::default()
        })
        .unwrap();
        let (out, stats) = w
            .finish(&FileMeta {
                arch: "x86_64".into(),
                ..Default::default()
            })
            .unwrap();
        let b = out.into_inner();
        assert_eq!(&b[..8], b"PERFILE2");
        assert_eq!(u64_at(&b, 8), 104);
        assert_eq!(u64_at(&b, 16), 144);
        assert_eq!(u64_at(&b, 24), 104);
        assert_eq!(u64_at(&b, 32), 144);
        let data_off = u64_at(&b, 40);
        let data_size = u64_at(&b, 48);
        assert_eq!(data_off, 104 + 144 + 8);
        assert_eq!(data_size, stats.data_bytes);
        // The attr's ids section holds the single id 7.
        let ids_off = u64_at(&b, 104 + 128) as usize;
        assert_eq!(u64_at(&b, ids_off), 7);
        // First record is the COMM, its size a multiple of 8.
        let rec = data_off as usize;
        assert_eq!(
            u32::from_le_bytes(b[rec..rec + 4].try_into().unwrap()),
            record::COMM
        );
        let size = u16::from_le_bytes(b[rec + 6..rec + 8].try_into().unwrap());
        assert_eq!(size % 8, 0);
        assert_eq!(stats.sample_time, Some((5, 5)));
    }

    #[test]
    fn register_count_must_match_mask() {
        let mut a = AttrSpec::cpu_clock(1, "cpu-clock", 1000);
        a.sample_type |= sample::REGS_USER;
        a.regs_user = 0b111;
        let mut w = PerfDataWriter::new(Cursor::new(Vec::new()), vec![a]).unwrap();
        let regs = [1u64, 2];
        let err = w
            .sample(&SampleRecord {
                regs_user_abi: regs_abi::ABI_64,
                regs_user: &regs,
                ..Default::default()
            })
            .unwrap_err();
        assert!(
            matches!(
                err,
                WriteError::RegisterCount {
                    got: 2,
                    want: 3,
                    ..
                }
            ),
            "{err}"
        );
        // ABI_NONE writes no registers and is always fine.
        w.sample(&SampleRecord::default()).unwrap();
    }

    #[test]
    fn bad_configuration_is_refused() {
        assert!(matches!(
            PerfDataWriter::new(Cursor::new(Vec::new()), vec![]),
            Err(WriteError::NoEvents)
        ));
        let a = AttrSpec::cpu_clock(1, "a", 1);
        assert!(matches!(
            PerfDataWriter::new(Cursor::new(Vec::new()), vec![a.clone(), a]),
            Err(WriteError::DuplicateId(1))
        ));
        let mut w = PerfDataWriter::new(
            Cursor::new(Vec::new()),
            vec![AttrSpec::cpu_clock(1, "a", 1)],
        )
        .unwrap();
        assert!(matches!(
            w.sample(&SampleRecord {
                attr: 3,
                ..Default::default()
            }),
            Err(WriteError::UnknownEvent(3, 1))
        ));
    }

    #[test]
    fn batches_are_sorted_and_rounds_never_precede_older_records() {
        let attrs = vec![AttrSpec::cpu_clock(1, "cpu-clock", 1000)];
        let mut w = PerfDataWriter::new(Cursor::new(Vec::new()), attrs).unwrap();
        let n = ROUND_RECORDS * 3 + 5;
        for i in 0..n as u64 {
            // Pairs swapped: slightly out of order, as from two CPUs.
            let t = if i % 2 == 0 { i * 10 + 10 } else { i * 10 - 10 };
            w.sample(&SampleRecord {
                time: t,
                ..Default::default()
            })
            .unwrap();
        }
        let (out, stats) = w.finish(&FileMeta::default()).unwrap();
        assert_eq!(stats.samples, n as u64);
        assert!(stats.rounds >= 2, "rounds {}", stats.rounds);
        let b = out.into_inner();
        let mut off = u64_at(&b, 40) as usize;
        let end = off + u64_at(&b, 48) as usize;
        let mut times = Vec::new();
        let mut last_round_bound = 0;
        let mut max_seen = 0;
        let mut next_flush = 0;
        while off < end {
            let ty = u32::from_le_bytes(b[off..off + 4].try_into().unwrap());
            let size = u16::from_le_bytes(b[off + 6..off + 8].try_into().unwrap()) as usize;
            if ty == record::FINISHED_ROUND {
                last_round_bound = next_flush;
                next_flush = max_seen;
            } else {
                let t = u64_at(&b, off + 8 + 8 + 8 + 8);
                assert!(
                    t >= last_round_bound,
                    "record at {t} after perf flushed up to {last_round_bound}"
                );
                max_seen = max_seen.max(t);
                times.push(t);
            }
            off += size;
        }
        assert_eq!(times.len(), n);
    }

    /// Samples of every size, as plain and as summed callchains, with
    /// other records and refused samples between them, over several
    /// batches: each comes out whole, with exactly the words given.
    #[test]
    fn records_of_every_size_come_out_whole_between_others() {
        let mut a = AttrSpec::cpu_clock(1, "cpu-clock", 1000);
        a.sample_type |= sample::CALLCHAIN | sample::REGS_USER;
        a.regs_user = 0b11;
        let mut w = PerfDataWriter::new(Cursor::new(Vec::new()), vec![a]).unwrap();
        let n = ROUND_RECORDS as u64 * 2 + 300;
        let marker = perf_abi::context::USER;
        let chain_of = |i: u64| -> Vec<u64> {
            let mut c = Vec::new();
            if i.is_multiple_of(3) {
                c.push(marker);
            }
            c.extend((0..i % 29).map(|k| 0x1000 + i + k));
            c
        };
        let mut comms = 0;
        for i in 0..n {
            let regs = [i, !i];
            let chain = chain_of(i);
            let rec = SampleRecord {
                ip: i,
                pid: 1,
                tid: 2,
                time: i * 10,
                period: i,
                callchain: &chain,
                regs_user_abi: regs_abi::ABI_64,
                regs_user: &regs,
                ..Default::default()
            };
            if i.is_multiple_of(2) {
                w.sample(&rec).unwrap();
            } else {
                let len = (i % 29) as usize;
                let deltas: Vec<u64> = (0..len).map(|k| u64::from(k > 0)).collect();
                let lead = i.is_multiple_of(3).then_some(marker);
                w.sample_deltas(&rec, lead, 0x1000 + i, &deltas).unwrap();
            }
            if i.is_multiple_of(97) {
                w.comm(1, 2, "a-longer-task-name", i * 10).unwrap();
                comms += 1;
            }
            if i.is_multiple_of(101) {
                let short = [i];
                let bad = SampleRecord {
                    regs_user_abi: regs_abi::ABI_64,
                    regs_user: &short,
                    ..rec
                };
                assert!(w.sample(&bad).is_err());
            }
        }
        let (out, stats) = w.finish(&FileMeta::default()).unwrap();
        assert_eq!(stats.samples, n);
        let b = out.into_inner();
        let mut off = u64_at(&b, 40) as usize;
        let end = off + u64_at(&b, 48) as usize;
        let (mut i, mut seen_comms) = (0u64, 0);
        while off < end {
            let ty = u32::from_le_bytes(b[off..off + 4].try_into().unwrap());
            let size = u16::from_le_bytes(b[off + 6..off + 8].try_into().unwrap()) as usize;
            let words: Vec<u64> = (0..size / 8).map(|k| u64_at(&b, off + 8 * k)).collect();
            match ty {
                record::SAMPLE => {
                    let chain = chain_of(i);
                    // header, IDENTIFIER, IP, TID, TIME, CPU, PERIOD,
                    // callchain, user registers.
                    let mut want = vec![words[0], 1, i, 1 | 2 << 32, i * 10, 0, i];
                    want.push(chain.len() as u64);
                    want.extend(&chain);
                    want.extend([regs_abi::ABI_64, i, !i]);
                    assert_eq!(words, want, "sample {i}");
                    i += 1;
                }
                record::COMM => seen_comms += 1,
                record::FINISHED_ROUND => {}
                other => panic!("record type {other}"),
            }
            off += size;
        }
        assert_eq!((i, seen_comms), (n, comms));
    }

    #[test]
    fn cpu_lists_are_written_as_sysfs_writes_them() {
        assert_eq!(cpu_list(&[0, 1, 2, 3]), "0-3");
        assert_eq!(cpu_list(&[2, 0]), "0,2");
        assert_eq!(cpu_list(&[9, 0, 1, 4, 5, 6]), "0-1,4-6,9");
        assert_eq!(cpu_list(&[7]), "7");
        assert_eq!(
            cpu_list(&[u32::MAX - 1, u32::MAX, 0]),
            "0,4294967294-4294967295"
        );
        assert_eq!(cpu_list(&[]), "");
    }

    /// HEADER_CPU_TOPOLOGY read back as perf's `process_cpu_topology`
    /// reads it: (packages' lists, cores' lists, (core, socket) per CPU,
    /// dies' lists, die per CPU), `nr` CPUs; `None` when it does not end
    /// exactly where the section does.
    #[allow(clippy::type_complexity)]
    fn read_cpu_topology(
        b: &[u8],
        nr: usize,
    ) -> Option<(
        Vec<String>,
        Vec<String>,
        Vec<(u32, u32)>,
        Vec<String>,
        Vec<u32>,
    )> {
        let mut at = 0;
        let u32_at = |at: &mut usize| -> Option<u32> {
            let v = u32::from_le_bytes(b.get(*at..*at + 4)?.try_into().ok()?);
            *at += 4;
            Some(v)
        };
        let strings = |at: &mut usize| -> Option<Vec<String>> {
            let n = u32_at(at)?;
            let mut out = Vec::new();
            for _ in 0..n {
                let len = u32_at(at)? as usize;
                assert_eq!(len % 64, 0, "strings are padded to 64 bytes");
                let raw = b.get(*at..*at + len)?;
                *at += len;
                let end = raw.iter().position(|&c| c == 0)?;
                out.push(String::from_utf8(raw[..end].to_vec()).ok()?);
            }
            Some(out)
        };
        let packages = strings(&mut at)?;
        let cores = strings(&mut at)?;
        let mut ids = Vec::new();
        for _ in 0..nr {
            ids.push((u32_at(&mut at)?, u32_at(&mut at)?));
        }
        let dies = strings(&mut at)?;
        let mut die_ids = Vec::new();
        for _ in 0..nr {
            die_ids.push(u32_at(&mut at)?);
        }
        (at == b.len()).then_some((packages, cores, ids, dies, die_ids))
    }

    #[test]
    fn cpu_topology_reads_back_as_perf_reads_it() {
        use linux_perf_data::{Feature, PerfFileReader};
        // Two packages of two cores with two threads each, CPUs numbered
        // as a runtime starts them (package 1's first, then package 0's).
        let place = |socket, core| CpuTopo {
            socket,
            die: 0,
            core,
        };
        let cpus = vec![
            place(0, 0),
            place(0, 0),
            place(1, 0),
            place(1, 1),
            place(0, 1),
            place(0, 1),
            place(1, 0),
            place(1, 1),
        ];
        let write = |nr_cpus, cpus: Vec<CpuTopo>| {
            let attrs = vec![AttrSpec::cpu_clock(1, "cpu-clock", 1000)];
            let w = PerfDataWriter::new(Cursor::new(Vec::new()), attrs).unwrap();
            let (out, _) = w
                .finish(&FileMeta {
                    arch: "x86_64".into(),
                    nr_cpus,
                    cpus,
                    ..Default::default()
                })
                .unwrap();
            PerfFileReader::parse_file(Cursor::new(out.into_inner()))
                .unwrap()
                .perf_file
        };
        let file = write((8, 8), cpus.clone());
        let nr = file.nr_cpus().unwrap().unwrap();
        assert_eq!((nr.nr_cpus_available, nr.nr_cpus_online), (8, 8));
        let section = file.feature_section_data(Feature::CPU_TOPOLOGY).unwrap();
        assert_eq!(section, encode_cpu_topology(&cpus));
        // The first list: a u32 count, then a 64-byte padded string.
        assert_eq!(&section[..8], &[2, 0, 0, 0, 64, 0, 0, 0]);
        assert_eq!(&section[8..16], b"0-1,4-5\0");
        let (packages, cores, ids, dies, die_ids) = read_cpu_topology(section, 8).unwrap();
        assert_eq!(packages, ["0-1,4-5", "2-3,6-7"]);
        assert_eq!(cores, ["0-1", "2,6", "3,7", "4-5"]);
        assert_eq!(
            ids,
            [
                (0, 0),
                (0, 0),
                (0, 1),
                (1, 1),
                (1, 0),
                (1, 0),
                (0, 1),
                (1, 1)
            ]
        );
        assert_eq!(dies, ["0-1,4-5", "2-3,6-7"]);
        assert_eq!(die_ids, [0; 8]);

        // One CPU: one of everything.
        let file = write((1, 1), vec![CpuTopo::default()]);
        let section = file.feature_section_data(Feature::CPU_TOPOLOGY).unwrap();
        let (packages, cores, ids, dies, die_ids) = read_cpu_topology(section, 1).unwrap();
        assert_eq!(
            (packages, cores, dies),
            (
                vec!["0".to_owned()],
                vec!["0".to_owned()],
                vec!["0".to_owned()]
            )
        );
        assert_eq!((ids, die_ids), (vec![(0, 0)], vec![0]));

        // Not one place per available CPU (perf would read past it or
        // stop short): no topology, the CPU count still written.
        let file = write((4, 4), cpus[..2].to_vec());
        assert!(file.feature_section_data(Feature::CPU_TOPOLOGY).is_none());
        assert_eq!(file.nr_cpus().unwrap().unwrap().nr_cpus_online, 4);
        let file = write((1, 1), vec![]);
        assert!(file.feature_section_data(Feature::CPU_TOPOLOGY).is_none());
    }

    #[test]
    fn strings_are_padded_to_64() {
        let s = encode_string("x86_64");
        assert_eq!(u32::from_le_bytes(s[..4].try_into().unwrap()), 64);
        assert_eq!(s.len(), 68);
        assert_eq!(&s[4..10], b"x86_64");
        assert_eq!(s[10], 0);
    }

    #[test]
    fn several_attrs_read_back_with_their_ids_names_and_samples() {
        use linux_perf_data::linux_perf_event_reader::{EventRecord, IpSkidConstraint};
        use linux_perf_data::{PerfFileReader, PerfFileRecord};
        let mut cycles = AttrSpec::cpu_clock(1, "cycles:u", 1000);
        cycles.type_ = perf_abi::attr_type::HARDWARE;
        cycles.config = 0;
        cycles.exclude_kernel = true;
        let mut loads = AttrSpec::cpu_clock(2, "r1cd:pp", 0);
        loads.type_ = perf_abi::attr_type::RAW;
        loads.config = 0x1cd;
        loads.freq = false;
        loads.period_or_freq = 3;
        loads.precise_ip = 2;
        loads.sample_type |= sample::ADDR;
        let mut w = PerfDataWriter::new(Cursor::new(Vec::new()), vec![cycles, loads]).unwrap();
        w.comm(1, 1, "task", 0).unwrap();
        for t in 0..10u64 {
            w.sample(&SampleRecord {
                attr: usize::from(t % 3 == 0),
                ip: 0x1000 + t,
                pid: 1,
                tid: 1,
                time: 10 + t,
                period: 5,
                addr: 0x7000,
                misc: misc::USER,
                ..Default::default()
            })
            .unwrap();
        }
        w.lost(1, 4, 30, 0).unwrap();
        let (out, stats) = w
            .finish(&FileMeta {
                arch: "x86_64".into(),
                ..Default::default()
            })
            .unwrap();
        assert_eq!((stats.samples, stats.lost), (10, 4));
        let PerfFileReader {
            mut perf_file,
            mut record_iter,
        } = PerfFileReader::parse_file(Cursor::new(out.into_inner())).unwrap();
        let attrs = perf_file.event_attributes();
        assert_eq!(attrs.len(), 2);
        assert_eq!(
            (attrs[0].name(), attrs[0].ids()),
            (Some("cycles:u"), &[1][..])
        );
        assert_eq!(
            (attrs[1].name(), attrs[1].ids()),
            (Some("r1cd:pp"), &[2][..])
        );
        assert_eq!(
            attrs[1].attributes().flags.ip_skid_constraint(),
            IpSkidConstraint::ZeroSkid
        );
        let mut per_attr = [0u64; 2];
        let mut addrs = [0u64; 2];
        while let Some(r) = record_iter.next_record(&mut perf_file).unwrap() {
            let PerfFileRecord::EventRecord { attr_index, record } = r else {
                continue;
            };
            if let EventRecord::Sample(s) = record.parse().unwrap() {
                per_attr[attr_index] += 1;
                addrs[attr_index] += u64::from(s.addr.is_some());
            }
        }
        assert_eq!(
            per_attr,
            [6, 4],
            "each sample under its own attr, by its id"
        );
        assert_eq!(addrs, [0, 4], "each attr's own sample layout");
    }
}
