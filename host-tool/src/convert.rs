//! Turns a decoded stream into perf.data: one attr per event, the runtime
//! as `[kernel.kallsyms]` with its relocation reference, COMM and user MMAPs
//! per task (FORK first for a task another made, an exec COMM and the new
//! program's MMAP2s for an exec, EXIT at its end), samples, losses and
//! throttling, then the feature sections.
//! Also checks the target's End counters against what arrived, so every
//! sample the target took is either in the file or counted as lost.

use thiserror::Error;

use sampler::sample::CpuMode;
use sampler::wire::SampleParts;

use crate::image::Image;
use crate::model::{
    EndCounters, EventKind, EventSource, Hello, Item, ProgramInfo, SampleView, TaskInfo, TaskOrigin,
};
use crate::output::OwnedWrite;
use crate::perf_abi::{self, context, misc};
use crate::perf_data::{
    AttrSpec, BranchEntry, BuildIdEntry, CpuTopo, FileMeta, PerfDataWriter, SampleRecord,
    WriteError, WriteStats,
};

/// The comm given to pid 0, the runtime itself.
pub const RUNTIME_COMM: &str = "perch-runtime";

/// Why a stream could not be converted.
#[derive(Debug, Error)]
pub enum ConvertError {
    /// perf.data writing failed.
    #[error(transparent)]
    Write(#[from] WriteError),
    /// The stream never said Hello.
    #[error("the stream has no Hello record: not a Perch stream, or its start was lost")]
    NoHello,
    /// A Hello without events.
    #[error("the stream's Hello declares no events")]
    NoEvents,
    /// The image does not belong to the stream.
    #[error(
        "{image} has build-id {image_id}, but the stream was produced by build-id {stream_id}: \
         pass the image the appliance was booted from"
    )]
    WrongImage {
        /// The image path.
        image: String,
        /// Its build-id.
        image_id: String,
        /// The stream's build-id.
        stream_id: String,
    },
    /// A second Hello (the target restarted mid-stream).
    #[error("the stream restarted (a second Hello); split the capture and convert each run")]
    Restarted,
    /// More samples arrived than the End record says were delivered: the
    /// stream is not one run (appended or duplicated data).
    #[error(
        "the stream holds {samples} samples, but its End record says the target delivered {delivered}: \
         it is not one run (data appended or duplicated)"
    )]
    MoreThanDelivered {
        /// Samples that arrived.
        samples: u64,
        /// End's `delivered`.
        delivered: u64,
    },
}

/// Options for a conversion.
#[derive(Clone, Debug, Default)]
pub struct ConvertOptions {
    /// The image the stream came from (symbols, build-id, maps).
    pub image: Option<Image>,
    /// The command line recorded in CMDLINE.
    pub cmdline: Vec<String>,
    /// The host file of each program of the boot archive, by archive path
    /// (`bin/app`, no leading `/` or `./`): what perch packed, or what
    /// `--appliance` names. A loaded process's MMAP2s and build-id entry
    /// name this file, so perf reads the program's own symbols from it.
    pub programs: std::collections::BTreeMap<String, std::path::PathBuf>,
    /// The runtime's Breakpad symbols in perf's build-id cache
    /// ([`crate::buildid_cache::kernel_symbols_path`]), named by a second
    /// kernel build-id entry after `[kernel.kallsyms]`: samply opens the
    /// kernel by the path of its build-id entry and finds the runtime's
    /// names there with no flags. The entry belongs to perf's machine 0
    /// (the default guest), so perf's host kernel stays
    /// `[kernel.kallsyms]`.
    pub kernel_file: Option<std::path::PathBuf>,
}

/// The archive path `path` as [`ConvertOptions::programs`] keys it (and as
/// the archive stores it): leading `/` and `./` stripped.
pub fn archive_key(path: &str) -> &str {
    let mut p = path;
    loop {
        if let Some(rest) = p.strip_prefix("./") {
            p = rest;
        } else if let Some(rest) = p.strip_prefix('/') {
            p = rest;
        } else {
            return p;
        }
    }
}

/// What a conversion wrote and checked.
#[derive(Clone, Debug, Default)]
pub struct ConvertSummary {
    /// Writer counters.
    pub written: WriteStats,
    /// The target's final counters, if the stream ended properly.
    pub end: Option<EndCounters>,
    /// Samples the target delivered that never arrived intact (bad frames),
    /// written as losses so the file still adds up.
    pub wire_lost: u64,
    /// Samples whose event id matched no declared event (counted, not written).
    pub unknown_event_samples: u64,
    /// Records before the Hello (skipped, counted).
    pub before_hello: u64,
    /// Tasks that had samples but no Task record (damaged on the wire)
    /// and none later in the capture: a thread of a process whose program
    /// is known got a COMM of its process's name (perf gives a thread its
    /// process's mappings), any other a fallback COMM `tid-N` and no
    /// mappings (its samples keep their addresses, unresolved).
    pub tasks_without_record: u64,
    /// Of those, the ones that went under their process's program.
    pub tasks_under_their_process: u64,
    /// Samples of those tasks before any Task record of theirs arrived.
    pub samples_without_task: u64,
    /// Samples that came after their task's TaskExit (and before a new
    /// task on its ids): the target sends a task's samples before its end,
    /// so any of these is the target's fault (perf would file them under
    /// a thread that has already exited).
    pub samples_after_end: u64,
    /// Things the user should know.
    pub warnings: Vec<String>,
}

/// What the converter found out about a sample's task (kept for the
/// task of the previous sample).
#[derive(Clone, Copy)]
struct TaskNote {
    /// Named by a fallback: its Task record never arrived.
    fallback: bool,
    /// Its TaskExit came before this sample.
    ended: bool,
}

/// Hex of a build-id.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Streams items into a perf.data file.
pub struct Converter<W: OwnedWrite> {
    out: Option<W>,
    writer: Option<PerfDataWriter<W>>,
    options: ConvertOptions,
    hello: Option<Hello>,
    event_ids: Vec<u32>,
    chain: Vec<u64>,
    branches: Vec<BranchEntry>,
    last_time: u64,
    end: Option<EndCounters>,
    summary: ConvertSummary,
    /// The Hello was the target's repetition found later in a capture
    /// file, given first because the stream's own was lost.
    hello_found_later: bool,
    /// Tasks (pid, tid) with a COMM written: from their Task record, or a
    /// fallback.
    tasks: std::collections::BTreeSet<(u32, u32)>,
    /// The last Task record of each task, so the target's periodic
    /// repetitions are not written again; forgotten when the task ends, so
    /// a later task with the same ids is a new one.
    announced: std::collections::BTreeMap<(u32, u32), TaskInfo>,
    /// Of those, the ones named by a fallback.
    fallback: std::collections::BTreeSet<(u32, u32)>,
    /// Tasks whose EXIT is written.
    exited: std::collections::BTreeSet<(u32, u32)>,
    /// Each task's count per event (the periods of its samples), written
    /// as PERF_RECORD_READ at its end; the index of a task's counts by
    /// (pid, tid), and the last task counted.
    counts: Vec<((u32, u32), Vec<u64>)>,
    count_index: std::collections::HashMap<(u32, u32), usize>,
    last_count: usize,
    /// The task of the previous sample, and whether it is a fallback one
    /// (most samples follow one of the same task: no lookup).
    last_task: Option<((u32, u32), TaskNote)>,
    /// The programs' files met in Task records: their build-id entries and
    /// what was said about them.
    programs: ProgramFiles,
    /// Where to learn the Task records later in the input (a capture
    /// file), asked once a sample comes of a task with none so far.
    lookahead: Option<Box<dyn FnOnce() -> Lookahead>>,
    /// What the lookahead found.
    later: Lookahead,
}

/// The first Task record of each task (pid, tid) in a whole capture.
pub type Lookahead = std::collections::HashMap<(u32, u32), TaskInfo>;

/// The program files of a run's processes, for the BUILD_ID table.
#[derive(Debug, Default)]
struct ProgramFiles {
    /// One entry per (host file, build-id, pid): the BUILD_ID entry of a
    /// program names the process that ran it (perf itself writes -1 for
    /// every host DSO; perf 6.1 resolves the program either way, through
    /// the build-id its MMAP2 carries).
    entries: Vec<BuildIdEntry>,
    /// Archive paths already warned about.
    warned: std::collections::BTreeSet<String>,
    /// Warnings for the summary.
    warnings: Vec<String>,
}

impl<W: OwnedWrite> Converter<W> {
    /// A converter writing to `out` once the Hello arrives.
    pub fn new(out: W, options: ConvertOptions) -> Self {
        Converter {
            out: Some(out),
            writer: None,
            options,
            hello: None,
            event_ids: Vec::new(),
            chain: Vec::with_capacity(128),
            branches: Vec::new(),
            last_time: 0,
            end: None,
            summary: ConvertSummary::default(),
            hello_found_later: false,
            tasks: Default::default(),
            announced: Default::default(),
            exited: Default::default(),
            counts: Vec::new(),
            count_index: Default::default(),
            last_count: 0,
            fallback: Default::default(),
            last_task: None,
            programs: ProgramFiles::default(),
            lookahead: None,
            later: Lookahead::new(),
        }
    }

    /// Says where the Task records later in the input are (for a capture
    /// file, which can be read ahead): a sample of a task whose own
    /// record was lost then goes under the program a later repetition of
    /// the record names, from its first sample.
    pub fn set_lookahead(&mut self, f: Box<dyn FnOnce() -> Lookahead>) {
        self.lookahead = Some(f);
    }

    /// Notes a sample of task (pid, tid). The first sample of a task whose
    /// Task record never arrived (damaged on the wire) names it from a
    /// later repetition of the record when the input can be read ahead,
    /// else after its process when the process is known, else `tid-N`
    /// (see [`ConvertSummary::tasks_without_record`]); such samples are
    /// counted.
    #[inline]
    /// Adds `period` to task (`pid`, `tid`)'s count of event `attr`.
    fn count(&mut self, pid: u32, tid: u32, attr: usize, period: u64) {
        let key = (pid, tid);
        let i = match self.counts.get(self.last_count) {
            Some((k, _)) if *k == key => self.last_count,
            _ => {
                let n = self.counts.len();
                let i = *self.count_index.entry(key).or_insert(n);
                if i == n {
                    self.counts.push((key, vec![0; self.event_ids.len()]));
                }
                self.last_count = i;
                i
            }
        };
        if let Some(c) = self.counts[i].1.get_mut(attr) {
            *c = c.saturating_add(period.max(1));
        }
    }

    /// The PERF_RECORD_READs of task `key`'s counts, at `time`.
    fn write_counts(
        w: &mut PerfDataWriter<W>,
        counts: &[((u32, u32), Vec<u64>)],
        index: &std::collections::HashMap<(u32, u32), usize>,
        key: (u32, u32),
        time: u64,
    ) -> Result<(), ConvertError> {
        let Some(&i) = index.get(&key) else {
            return Ok(());
        };
        for (attr, &value) in counts[i].1.iter().enumerate() {
            w.read(attr, key.0, key.1, value, time)?;
        }
        Ok(())
    }

    fn note_task(&mut self, pid: u32, tid: u32) -> Result<(), ConvertError> {
        let note = match self.last_task {
            Some((t, n)) if t == (pid, tid) => n,
            _ => {
                let n = TaskNote {
                    fallback: self.note_new_task(pid, tid)?,
                    ended: self.exited.contains(&(pid, tid)),
                };
                self.last_task = Some(((pid, tid), n));
                n
            }
        };
        self.summary.samples_without_task += u64::from(note.fallback);
        self.summary.samples_after_end += u64::from(note.ended);
        Ok(())
    }

    /// The slow path of [`note_task`](Self::note_task): whether the task is
    /// named by a fallback, writing the fallback on its first sample.
    fn note_new_task(&mut self, pid: u32, tid: u32) -> Result<bool, ConvertError> {
        if pid == 0 {
            return Ok(false);
        }
        if self.tasks.contains(&(pid, tid)) {
            return Ok(self.fallback.contains(&(pid, tid)));
        }
        if self.writer.is_none() {
            return Ok(false);
        }
        if let Some(look) = self.lookahead.take() {
            self.later = look();
        }
        if let Some(t) = self.later.get(&(pid, tid)).cloned() {
            // Its record comes later: it names the task from its first
            // sample, and is then a repetition.
            self.announce(&t)?;
            return Ok(false);
        }
        // A thread of a known process: perf gives a thread its process's
        // mappings, so only its name is written, the process's.
        let process = self
            .announced
            .iter()
            .chain(&self.later)
            .filter(|((p, _), _)| *p == pid)
            .min_by_key(|((_, t), _)| (*t != pid, *t))
            .map(|(_, t)| t.name.clone());
        let Some(w) = self.writer.as_mut() else {
            return Ok(false);
        };
        match &process {
            Some(name) => w.comm(pid, tid, name, 0)?,
            None => w.comm(pid, tid, &format!("tid-{tid}"), 0)?,
        }
        self.tasks.insert((pid, tid));
        self.fallback.insert((pid, tid));
        self.summary.tasks_without_record += 1;
        self.summary.tasks_under_their_process += u64::from(process.is_some());
        Ok(true)
    }

    /// Writes what a Task record says: perf's FORK for the first record
    /// of a task another made, its COMM and its mappings. A periodic
    /// repetition of the task's last record writes nothing.
    fn announce(&mut self, t: &TaskInfo) -> Result<(), ConvertError> {
        let Some(w) = self.writer.as_mut() else {
            return Ok(());
        };
        let key = (t.pid, t.tid);
        let last = self.announced.get(&key);
        // A periodic repetition is already in the file; an exec is always
        // news, even of the program the process ran.
        if t.origin != TaskOrigin::Exec && last.is_some_and(|l| l.repeats(t)) {
            return Ok(());
        }
        // The first record of a task another made: perf's FORK (for a
        // thread too, as perf records a `clone`).
        if let (None, TaskOrigin::Made { ppid, ptid }) = (last, t.origin) {
            w.fork(t.pid, ppid, t.tid, ptid, t.time)?;
        }
        self.announced.insert(key, t.clone());
        // A task on the ids of one that ended gets its own EXIT.
        self.exited.remove(&key);
        Self::on_task(w, &self.options, &mut self.programs, t)?;
        // A late Task record names the task from here on.
        self.tasks.insert(key);
        self.fallback.remove(&key);
        self.last_task = None;
        Ok(())
    }

    /// Says that the next Hello is the target's repetition found later in
    /// a capture file whose own first Hello was lost, given first
    /// ([`Pump::seed_hello`](crate::input::Pump::seed_hello)): the summary
    /// then says so rather than that the stream was joined late.
    pub fn hello_found_later(&mut self) {
        self.hello_found_later = true;
    }

    /// The stream's Hello, once seen.
    pub fn hello(&self) -> Option<&Hello> {
        self.hello.as_ref()
    }

    /// Consumes one stream item.
    pub fn push(&mut self, item: &Item<'_>) -> Result<(), ConvertError> {
        match item {
            Item::Hello(h) => return self.on_hello(h),
            Item::Log(_) | Item::Defmt(_) => return Ok(()),
            _ => {}
        }
        if let Item::Sample(s) = item
            && self.writer.is_some()
        {
            self.note_task(s.pid, s.tid)?;
        }
        let Some(w) = self.writer.as_mut() else {
            self.summary.before_hello += 1;
            return Ok(());
        };
        match item {
            Item::Task(t) => return self.announce(t),
            Item::Sample(s) => {
                let Some(attr) = self.event_ids.iter().position(|&e| e == s.event) else {
                    self.summary.unknown_event_samples += 1;
                    return Ok(());
                };
                self.last_time = self.last_time.max(s.time);
                Self::on_sample(w, &mut self.chain, attr, s)?;
                self.count(s.pid, s.tid, attr, s.period);
            }
            Item::Lost {
                event,
                cpu,
                count,
                time,
                ..
            } => {
                let attr = self.event_ids.iter().position(|e| e == event).unwrap_or(0);
                w.lost(attr, *count, *time, *cpu)?;
                w.lost_samples(attr, *count, *time, *cpu)?;
            }
            Item::Throttle {
                event,
                cpu,
                on,
                time,
            } => {
                let attr = self.event_ids.iter().position(|e| e == event).unwrap_or(0);
                w.throttle(attr, *on, *time, *cpu)?;
            }
            Item::TaskExit { pid, tid, time } => {
                let key = (*pid, *tid);
                // The next sample looks its task up again (this one ended).
                self.last_task = None;
                if self.exited.insert(key) {
                    Self::write_counts(w, &self.counts, &self.count_index, key, *time)?;
                    w.exit(*pid, *tid, *time)?;
                    // The target reuses the ids of a task that ended: the
                    // next task on them starts from nothing.
                    self.announced.remove(&key);
                    if let Some(&i) = self.count_index.get(&key) {
                        self.counts[i].1.fill(0);
                    }
                }
            }
            Item::End(e) => self.end = Some(e.clone()),
            Item::Hello(_) | Item::Log(_) | Item::Defmt(_) => {}
        }
        Ok(())
    }

    /// Consumes one sample in the decoder's parts
    /// ([`Pump::feed_parts`](crate::input::Pump::feed_parts)): writes the
    /// same record as [`push`](Self::push) of the sample's item, straight
    /// from the wire form and the task's reference state.
    pub fn push_parts(&mut self, s: &SampleParts<'_>) -> Result<(), ConvertError> {
        if self.writer.is_some() {
            self.note_task(s.pid(), s.tid())?;
        }
        let Some(w) = self.writer.as_mut() else {
            self.summary.before_hello += 1;
            return Ok(());
        };
        let event = s.event();
        let Some(attr) = self.event_ids.iter().position(|&e| e == event) else {
            self.summary.unknown_event_samples += 1;
            return Ok(());
        };
        let time = s.time();
        self.last_time = self.last_time.max(time);
        let user = s.cpumode() == CpuMode::User;
        // The callchain, led by a context marker when it does not start
        // with one (as in `on_sample`), summed up as it is written.
        let (base, deltas) = s.callchain_deltas();
        let lead = match deltas.first() {
            Some(&d) if base.wrapping_add(d) < (-4095i64) as u64 => {
                Some(if user { context::USER } else { context::KERNEL })
            }
            _ => None,
        };
        self.branches.clear();
        let hw_idx = s.branch_hw_idx();
        if hw_idx.is_some() {
            self.branches.extend(s.branches().map(|e| BranchEntry {
                from: e.from,
                to: e.to,
                flags: e.flags.to_perf(),
            }));
        }
        let (ua, ur) = s
            .regs_user()
            .map_or((0, &[][..]), |r| (r.abi.perf_value(), &r.values[..]));
        let (ia, ir) = s
            .regs_intr()
            .map_or((0, &[][..]), |r| (r.abi.perf_value(), &r.values[..]));
        // Without memory fields these are zero, as from a default
        // `MemInfo`.
        let (addr, weight, data_src) = match s.mem() {
            Some(mem) => (
                mem.addr,
                if mem.ins_lat != 0 {
                    mem.weight_struct()
                } else {
                    mem.weight
                },
                mem.data_src,
            ),
            None => (0, 0, 0),
        };
        let rec = SampleRecord {
            attr,
            misc: if user { misc::USER } else { misc::KERNEL },
            ip: s.ip(),
            pid: s.pid(),
            tid: s.tid(),
            time,
            addr,
            cpu: s.cpu(),
            period: s.period(),
            callchain: &[],
            branches: &self.branches,
            branch_hw_idx: hw_idx.unwrap_or(0),
            regs_user_abi: ua,
            regs_user: ur,
            weight,
            data_src,
            regs_intr_abi: ia,
            regs_intr: ir,
        };
        w.sample_deltas(&rec, lead, base, deltas)?;
        self.count(s.pid(), s.tid(), attr, s.period());
        Ok(())
    }

    fn on_hello(&mut self, h: &Hello) -> Result<(), ConvertError> {
        if self.hello.is_some() {
            return Err(ConvertError::Restarted);
        }
        if h.events.is_empty() {
            return Err(ConvertError::NoEvents);
        }
        if let Some(img) = &self.options.image
            && !h.build_id.is_empty()
            && img.build_id.as_deref() != Some(&h.build_id[..])
        {
            return Err(ConvertError::WrongImage {
                image: img.path.display().to_string(),
                image_id: img.build_id_hex().unwrap_or_else(|| "(none)".into()),
                stream_id: hex(&h.build_id),
            });
        }
        let attrs: Vec<AttrSpec> = h
            .events
            .iter()
            .map(|e| AttrSpec {
                id: u64::from(e.id) + 1,
                name: e.perf_name(h.source),
                type_: match e.kind {
                    EventKind::Hardware => perf_abi::attr_type::HARDWARE,
                    EventKind::Raw => perf_abi::attr_type::RAW,
                    EventKind::CpuClock => perf_abi::attr_type::SOFTWARE,
                },
                config: e.config,
                period_or_freq: e.period_or_freq,
                freq: e.freq,
                sample_type: e.sample_type,
                regs_user: e.regs_user,
                regs_intr: e.regs_intr,
                branch_sample_type: e.branch_sample_type,
                exclude_user: e.exclude_user,
                exclude_kernel: e.exclude_kernel,
                precise_ip: e.precise,
                max_stack: e.max_stack,
            })
            .collect();
        self.event_ids = h.events.iter().map(|e| e.id).collect();
        let out = self.out.take().ok_or(ConvertError::Restarted)?;
        let mut w = PerfDataWriter::new(out, attrs)?;
        w.comm(0, 0, RUNTIME_COMM, 0)?;
        if let Some(img) = &self.options.image {
            let (ref_name, ref_addr) = &img.ref_symbol;
            w.mmap(
                misc::KERNEL,
                u32::MAX,
                0,
                img.kernel_start,
                img.kernel_end - img.kernel_start,
                *ref_addr,
                &format!("[kernel.kallsyms]{ref_name}"),
                0,
            )?;
        }
        self.writer = Some(w);
        self.hello = Some(h.clone());
        Ok(())
    }

    fn on_task(
        w: &mut PerfDataWriter<W>,
        options: &ConvertOptions,
        programs: &mut ProgramFiles,
        t: &TaskInfo,
    ) -> Result<(), ConvertError> {
        // An exec's COMM says so, as perf's does; its program's MMAP2s
        // follow.
        if t.origin == TaskOrigin::Exec {
            w.exec_comm(t.pid, t.tid, &t.name, t.time)?;
        } else {
            w.comm(t.pid, t.tid, &t.name, t.time)?;
        }
        if let Some(p) = &t.program {
            return Self::on_program(w, options, programs, t, p);
        }
        let Some(img) = &options.image else {
            return Ok(());
        };
        let file = img.path.display().to_string();
        // The image's start, at file offset 0: hotspot's parser maps a whole
        // ELF from the mapping of its offset 0 (or from the mapping's own
        // address less its offset, which for the task text at its own
        // offset is not where the image starts, and every lookup then
        // reports the image again over itself: "address range overlaps
        // an existing module"). perf resolves samples in the text MMAPs
        // below either way.
        if let Some(base) = img.load_base {
            w.mmap(misc::USER, t.pid, t.tid, base, 0x1000, 0, &file, t.time)?;
        }
        if t.text.is_empty() {
            for u in &img.user_text {
                w.mmap(
                    misc::USER,
                    t.pid,
                    t.tid,
                    u.addr,
                    u.size,
                    u.file_offset,
                    &file,
                    t.time,
                )?;
            }
        } else {
            for &(start, len, off) in &t.text {
                // Prefer the offset the image itself gives for this address.
                let pgoff = img.user_text_offset(start).unwrap_or(off);
                w.mmap(misc::USER, t.pid, t.tid, start, len, pgoff, &file, t.time)?;
            }
        }
        Ok(())
    }

    /// The MMAP2s of a loaded process: one per executable segment, naming
    /// the program's host file and build-id, and its BUILD_ID entry.
    fn on_program(
        w: &mut PerfDataWriter<W>,
        options: &ConvertOptions,
        programs: &mut ProgramFiles,
        t: &TaskInfo,
        p: &ProgramInfo,
    ) -> Result<(), ConvertError> {
        let key = archive_key(&p.path);
        let file = match options.programs.get(key) {
            Some(host) => {
                let abs = std::fs::canonicalize(host).unwrap_or_else(|_| host.clone());
                abs.display().to_string()
            }
            None => {
                if programs.warned.insert(key.to_owned()) {
                    programs.warnings.push(format!(
                        "process {} runs {key}, whose host file perch does not know: its samples name /{key}, which perf cannot open (give the manifest with --appliance)",
                        t.name
                    ));
                }
                format!("/{key}")
            }
        };
        if options.programs.contains_key(key) && programs.warned.insert(key.to_owned()) {
            let host = std::fs::read(&file).ok();
            let host_id = host.as_deref().and_then(kcore::elf::build_id);
            match host_id {
                _ if host.is_none() => programs.warnings.push(format!(
                    "{file} (the host file of {key}) cannot be read: perf cannot symbolise {}",
                    t.name
                )),
                Some(id) if !p.build_id.is_empty() && id != &p.build_id[..] => {
                    programs.warnings.push(format!(
                        "{file} has build-id {}, but {} ran {key} with build-id {}: perf will not                          use this file for it",
                        hex(id),
                        t.name,
                        hex(&p.build_id)
                    ))
                }
                _ => {}
            }
        }
        for s in p.segments.iter().filter(|s| s.exec) {
            w.mmap2(
                t.pid,
                t.tid,
                s.start,
                s.len,
                s.file_offset,
                s.prot(),
                &p.build_id,
                &file,
                t.time,
            )?;
        }
        if !p.build_id.is_empty()
            && !programs
                .entries
                .iter()
                .any(|e| e.filename == file && e.build_id == p.build_id && e.pid == t.pid as i32)
        {
            programs.entries.push(BuildIdEntry {
                cpumode: misc::USER,
                build_id: p.build_id.clone(),
                filename: file,
                pid: t.pid as i32,
            });
        }
        Ok(())
    }

    fn on_sample(
        w: &mut PerfDataWriter<W>,
        chain: &mut Vec<u64>,
        attr: usize,
        s: &SampleView<'_>,
    ) -> Result<(), ConvertError> {
        let cpumode = if s.user { misc::USER } else { misc::KERNEL };
        let callchain = match s.callchain.first() {
            Some(&first) if first < (-4095i64) as u64 => {
                // No leading marker: add the one for the sampled mode.
                chain.clear();
                chain.push(if s.user {
                    context::USER
                } else {
                    context::KERNEL
                });
                chain.extend_from_slice(s.callchain);
                &chain[..]
            }
            _ => s.callchain,
        };
        w.sample(&SampleRecord {
            attr,
            misc: cpumode,
            ip: s.ip,
            pid: s.pid,
            tid: s.tid,
            time: s.time,
            addr: s.addr,
            cpu: s.cpu,
            period: s.period,
            callchain,
            branches: s.branches,
            branch_hw_idx: s.branch_hw_idx,
            regs_user_abi: s.regs_user_abi,
            regs_user: s.regs_user,
            weight: s.weight,
            data_src: s.data_src,
            regs_intr_abi: s.regs_intr_abi,
            regs_intr: s.regs_intr,
        })?;
        Ok(())
    }

    /// Reconciles the End counters, writes the feature sections and returns
    /// what was written.
    pub fn finish(mut self) -> Result<(W, ConvertSummary), ConvertError> {
        let mut w = self.writer.take().ok_or(ConvertError::NoHello)?;
        let h = self.hello.take().ok_or(ConvertError::NoHello)?;
        let mut summary = std::mem::take(&mut self.summary);
        if h.repeat > 0 && self.hello_found_later {
            summary.warnings.push(format!(
                "the capture's first Hello was lost: its repetition {}, found later in the file, \
                 describes the records before it too",
                h.repeat
            ));
        } else if h.repeat > 0 {
            summary.warnings.push(format!(
                "joined the stream late: the first Hello seen is the target's repetition {} \
                 ({} records before it were skipped); the samples missed are counted as lost{}",
                h.repeat,
                summary.before_hello,
                if self.end.is_some() {
                    ""
                } else {
                    ", once End arrives"
                }
            ));
        } else if summary.before_hello > 0 {
            summary.warnings.push(format!(
                "{} records before the Hello were skipped",
                summary.before_hello
            ));
        }
        if summary.tasks_without_record > 0 {
            let n = summary.tasks_without_record;
            let under = summary.tasks_under_their_process;
            let how = match (under, n - under) {
                (0, _) => "named tid-N, their addresses unresolved".to_owned(),
                (_, 0) => "named after their process, under its program".to_owned(),
                (u, o) => format!(
                    "{u} named after their process, under its program; {o} named tid-N, their addresses unresolved"
                ),
            };
            summary.warnings.push(format!(
                "{} samples of {n} task{} whose Task record never arrived (damaged on the wire?): {how}",
                summary.samples_without_task,
                if n == 1 { "" } else { "s" },
            ));
        }
        if summary.samples_after_end > 0 {
            summary.warnings.push(format!(
                "{} samples arrived after their task's end (TaskExit): the target sent them out of order",
                summary.samples_after_end
            ));
        }
        if summary.unknown_event_samples > 0 {
            summary.warnings.push(format!(
                "{} samples named an event the Hello did not declare and were dropped",
                summary.unknown_event_samples
            ));
        }
        // Tasks that did not end before the stream did: their counts as of
        // the last sample.
        for (key, _) in &self.counts {
            if !self.exited.contains(key) {
                Self::write_counts(
                    &mut w,
                    &self.counts,
                    &self.count_index,
                    *key,
                    self.last_time,
                )?;
            }
        }
        match self.end {
            Some(ref end) => {
                let st = w.stats();
                let arrived = st.samples + summary.unknown_event_samples;
                if arrived > end.delivered {
                    return Err(ConvertError::MoreThanDelivered {
                        samples: arrived,
                        delivered: end.delivered,
                    });
                }
                if end.delivered.checked_add(end.lost) != Some(end.taken) {
                    summary.warnings.push(format!(
                        "target counters disagree: taken {} != delivered {} + lost {}",
                        end.taken, end.delivered, end.lost
                    ));
                }
                // Samples delivered by the target that did not arrive intact.
                summary.wire_lost = end.delivered.saturating_sub(st.samples);
                // Target losses whose Lost records did not arrive.
                let target_unreported = end.lost.saturating_sub(st.lost);
                // Target losses are what PERF_RECORD_LOST means (the
                // producer could not keep up); wire losses are not, and
                // get PERF_RECORD_LOST_SAMPLES alone, which perf counts in
                // "Total Lost Samples" without blaming IO/CPU overload.
                if target_unreported > 0 {
                    w.lost(0, target_unreported, self.last_time, 0)?;
                    w.lost_samples(0, target_unreported, self.last_time, 0)?;
                }
                if summary.wire_lost > 0 {
                    w.lost_samples(0, summary.wire_lost, self.last_time, 0)?;
                    summary.warnings.push(format!(
                        "{} samples were lost on the wire ({}, not an overload): written as \
                         lost samples",
                        summary.wire_lost,
                        if h.repeat > 0 {
                            "sent before the host joined, or damaged on the line"
                        } else {
                            "damaged frames on the line"
                        }
                    ));
                }
            }
            None => summary.warnings.push(
                "the stream ended without an End record (stopped early or truncated): \
                 loss counts cover only what arrived"
                    .into(),
            ),
        }
        if let Some(img) = &self.options.image
            && img.build_id.is_none()
        {
            summary.warnings.push(format!(
                "{} has no GNU build-id (link it with --build-id): without one, perf run without \
                 --vmlinux={} resolves runtime samples against this machine's kernel",
                img.path.display(),
                img.path.display()
            ));
        }
        if self.options.image.is_some() && h.build_id.is_empty() {
            summary.warnings.push(
                "the stream carries no build-id, so perch could not check that the image matches it"
                    .into(),
            );
        }
        summary.warnings.append(&mut self.programs.warnings);
        summary.end = self.end.clone();
        let meta = self.meta(&h);
        let (out, written) = w.finish(&meta)?;
        summary.written = written;
        Ok((out, summary))
    }

    fn meta(&self, h: &Hello) -> FileMeta {
        let image = self.options.image.as_ref();
        let source = match h.source {
            EventSource::Pmu => "PMU",
            EventSource::SimulatedPmu => "simulated PMU (pmu=sim)",
            EventSource::NmiClock => "no PMU: NMI clock (cpu-clock)",
        };
        let mut build_ids = Vec::new();
        let kernel_id = image.map_or_else(
            || h.build_id.clone(),
            |i| i.build_id.clone().unwrap_or_default(),
        );
        if !kernel_id.is_empty() {
            build_ids.push(BuildIdEntry {
                cpumode: misc::KERNEL,
                build_id: kernel_id.clone(),
                filename: "[kernel.kallsyms]".into(),
                pid: -1,
            });
        }
        if let Some(img) = image
            && !kernel_id.is_empty()
        {
            build_ids.push(BuildIdEntry {
                cpumode: misc::USER,
                build_id: kernel_id.clone(),
                filename: img.path.display().to_string(),
                pid: -1,
            });
        }
        // For samply, which keys build-id entries by path and mode alone
        // and keeps the last kernel one: after `[kernel.kallsyms]`, in
        // machine 0. perf files each entry under the machine its pid names
        // (-1 the host, 0 the default guest), so this one never becomes the
        // host's kernel DSO, whatever order a perf version keeps its DSOs in
        // (6.9 and later sort them by path, and "/..." sorts before
        // "[kernel.kallsyms]").
        if let Some(file) = &self.options.kernel_file
            && !kernel_id.is_empty()
        {
            build_ids.push(BuildIdEntry {
                cpumode: misc::KERNEL,
                build_id: kernel_id,
                filename: file.display().to_string(),
                pid: 0,
            });
        }
        build_ids.extend(self.programs.entries.iter().cloned());
        let online = h.cpus.max(1);
        // One place per CPU, or no topology (perf reads one per CPU).
        let cpus = if h.places.len() == online as usize {
            h.places
                .iter()
                .map(|p| CpuTopo {
                    socket: p.package,
                    die: p.die,
                    core: p.core,
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut cmdline = self.options.cmdline.clone();
        if !h.cmdline.is_empty() {
            cmdline.push(format!("[appliance: {}]", h.cmdline));
        }
        FileMeta {
            hostname: image.and_then(|i| i.path.file_stem()).map_or_else(
                || "perch-appliance".into(),
                |s| s.to_string_lossy().into_owned(),
            ),
            osrelease: format!("perch-runtime (wire protocol {})", h.protocol_version),
            version: format!("perch {}", env!("CARGO_PKG_VERSION")),
            arch: "x86_64".into(),
            // The runtime numbers the CPUs it started, and samples name
            // those numbers: every CPU perf knows of is online.
            nr_cpus: (online, online),
            cpus,
            cpudesc: format!("{} [{source}]", h.cpu_desc),
            cmdline,
            build_ids,
        }
    }
}
