//! Reading a stream: bytes from any source through the wire decoder and the
//! adapter to model items, with running counters (`perch stat`, progress)
//! and target log display (text as is, defmt decoded against the image).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Read;
use std::ops::ControlFlow;
use std::sync::mpsc::{channel, sync_channel};

use sampler::sample::CpuMode;
use sampler::wire::{
    DecodeError, Decoder, DecoderStats, FrameBatch, Framer, Lent, Record, SampleParts,
};

use crate::error::HostError;
use crate::model::{EndCounters, Hello, Item};
use crate::wire::Adapter;

/// Where the stream stands: running, or ended, after which records are
/// counted ([`StreamStats::after_end`]) but no longer handed on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Keep reading.
    Continue,
    /// The stream ended (End record).
    Done,
    /// A second Hello arrived before End: the appliance restarted, and what
    /// follows is another run.
    Restart,
}

/// Where [`Pump::feed_parts`] sends what it decodes.
pub trait PartsSink {
    /// Every item but samples.
    fn item(&mut self, item: &Item<'_>) -> Result<(), HostError>;
    /// Every sample.
    fn sample(&mut self, s: &SampleParts<'_>) -> Result<(), HostError>;
}

impl<W: crate::output::OwnedWrite> PartsSink for crate::convert::Converter<W> {
    fn item(&mut self, item: &Item<'_>) -> Result<(), HostError> {
        self.push(item).map_err(HostError::from)
    }

    #[inline]
    fn sample(&mut self, s: &SampleParts<'_>) -> Result<(), HostError> {
        self.push_parts(s).map_err(HostError::from)
    }
}

/// Watches a run as it is recorded (`perch top`): the recording loop hands
/// it every item and sample after the converter has them, asks it after
/// each chunk and at least every 100 ms whether to go on, and offers it the
/// target's log lines while it owns the terminal.
pub trait Observer {
    /// The run starts: the image and the programs' host files (by archive
    /// path) it is symbolised with.
    fn begin(
        &mut self,
        image: Option<&crate::image::Image>,
        programs: &BTreeMap<String, std::path::PathBuf>,
    );
    /// Every item but samples.
    fn item(&mut self, item: &Item<'_>);
    /// Every sample.
    fn sample(&mut self, s: &SampleParts<'_>);
    /// `Break` stops the run where it is (the user quit).
    fn tick(&mut self, stats: &StreamStats) -> ControlFlow<()>;
    /// A line for the terminal (a program's output, the runtime's log):
    /// true when the observer took it, false when the caller prints it.
    fn log(&mut self, line: &str) -> bool;
    /// Reading stopped: the terminal goes back to the caller.
    fn finish(&mut self, stats: &StreamStats);
    /// Whether the run stopped because the user quit.
    fn user_stopped(&self) -> bool;
}

/// Decodes chunks of a stream into items.
pub struct Pump {
    decoder: Decoder,
    adapter: Adapter,
    /// The first bytes of the stream, to explain an unrecognised one.
    head: Vec<u8>,
    /// Where the stream stands (`Done` after End, `Restart` after a
    /// second Hello).
    state: Flow,
    /// Counters of everything seen.
    pub stats: StreamStats,
}

impl Default for Pump {
    fn default() -> Self {
        Self::new()
    }
}

impl Pump {
    /// A pump at the start of a stream.
    pub fn new() -> Self {
        Pump {
            decoder: Decoder::new(),
            adapter: Adapter::new(),
            head: Vec::new(),
            state: Flow::Continue,
            stats: StreamStats::default(),
        }
    }

    /// Counts a chunk of `len` bytes and keeps the stream's first bytes
    /// (from `head`, the chunk's start) for error messages.
    fn note_chunk(&mut self, len: usize, head: &[u8]) {
        self.stats.bytes += len as u64;
        if self.head.len() < HEAD_BYTES {
            let n = (HEAD_BYTES - self.head.len()).min(head.len());
            self.head.extend_from_slice(&head[..n]);
        }
    }

    /// Feeds `chunk`; `sink` sees each item after the counters are updated.
    /// Returns `Done` once the End record has been handled.
    pub fn feed(
        &mut self,
        chunk: &[u8],
        sink: &mut dyn FnMut(&Item<'_>) -> Result<(), HostError>,
    ) -> Result<Flow, HostError> {
        self.note_chunk(chunk.len(), chunk);
        let mut result = Ok(self.state);
        let adapter = &mut self.adapter;
        let stats = &mut self.stats;
        self.decoder.push_ref(chunk, |rec| {
            // Records are lent by the decoder, which rebuilds each sample
            // in place: nothing is copied between the frame and the sink.
            let rec = match rec {
                Ok(rec) if admit(rec, stats, &mut result) => rec,
                Ok(_) => return,
                Err(e) => {
                    if matches!(result, Ok(Flow::Continue)) {
                        result = Err(decode_error(e));
                    }
                    return;
                }
            };
            let r = adapter.with_item(rec, |item| {
                stats.observe(item);
                sink(item)
            });
            match r {
                Err(e) => result = Err(e),
                Ok(()) if matches!(rec, Record::End(_)) => result = Ok(Flow::Done),
                Ok(()) => {}
            }
        });
        self.finish_chunk(result)
    }

    /// Updates the counters after a chunk and keeps where the stream stands.
    fn finish_chunk(&mut self, result: Result<Flow, HostError>) -> Result<Flow, HostError> {
        self.stats.decoder = self.decoder.stats();
        self.stats.settle();
        if let Ok(f) = result {
            self.state = f;
        }
        result
    }

    /// Like [`feed`](Self::feed), but samples go to
    /// [`PartsSink::sample`] as the decoder's [`SampleParts`], never built
    /// into a sample or an [`Item`]: the conversion's fast path
    /// ([`Converter::push_parts`](crate::convert::Converter::push_parts)).
    /// Everything else goes to [`PartsSink::item`] as with `feed`, and the
    /// counters come out the same.
    pub fn feed_parts(
        &mut self,
        chunk: &[u8],
        sink: &mut impl PartsSink,
    ) -> Result<Flow, HostError> {
        self.note_chunk(chunk.len(), chunk);
        let mut result = Ok(self.state);
        let adapter = &mut self.adapter;
        let stats = &mut self.stats;
        self.decoder.push_parts(chunk, |rec| {
            deliver(rec, adapter, stats, sink, &mut result);
        });
        self.finish_chunk(result)
    }

    /// Hands `hello` to `sink` as the stream's first record, before any of
    /// its bytes: for a capture file whose own first Hello was lost, the
    /// target's repetition found later in it, which describes the same run
    /// (see [`lost_first_hello`]). When the repetition itself comes, it is
    /// counted and dropped as repetitions are.
    pub fn seed_hello(
        &mut self,
        hello: &sampler::wire::Hello,
        sink: &mut impl PartsSink,
    ) -> Result<(), HostError> {
        let rec = Record::Hello(hello.clone());
        let stats = &mut self.stats;
        self.adapter.with_item(&rec, |item| {
            stats.observe(item);
            sink.item(item)
        })
    }

    /// Reads `input` to its end through [`feed_parts`](Self::feed_parts)
    /// (what follows an End record or a restart is only counted).
    pub fn read_all_parts(
        &mut self,
        mut input: impl Read,
        sink: &mut impl PartsSink,
    ) -> Result<Flow, HostError> {
        read_chunks(&mut input, |chunk| self.feed_parts(chunk, sink))
    }

    /// Like [`feed_parts`](Self::feed_parts) for a chunk whose frames
    /// were split off on another thread ([`read_all_framed`](Self::read_all_framed)).
    fn feed_framed(
        &mut self,
        chunk: &FramedChunk,
        sink: &mut impl PartsSink,
    ) -> Result<Flow, HostError> {
        self.note_chunk(chunk.len, &chunk.head);
        let mut result = Ok(self.state);
        let adapter = &mut self.adapter;
        let stats = &mut self.stats;
        self.decoder.push_batch_parts(&chunk.frames, |rec| {
            deliver(rec, adapter, stats, sink, &mut result);
        });
        self.finish_chunk(result)
    }

    /// Reads `input` to its end like [`read_all_parts`](Self::read_all_parts)
    /// (what follows an End record or a restart is only counted), but in
    /// two stages: a
    /// second thread reads the input and frames each chunk (delimiters,
    /// COBS, CRC) while this one decodes the records and hands them to
    /// `sink`, chunk by chunk, with the same results. `after_chunk` runs
    /// after every chunk; when it breaks, reading stops there.
    pub fn read_all_framed<S: PartsSink>(
        &mut self,
        input: impl Read + Send,
        sink: &mut S,
        mut after_chunk: impl FnMut(&Pump, &mut S) -> ControlFlow<()>,
    ) -> Result<Flow, HostError> {
        std::thread::scope(|scope| {
            // Framed chunks go one way, emptied ones come back.
            let (full_tx, full_rx) = sync_channel::<FramedChunks>(FRAMED_BATCHES);
            let (empty_tx, empty_rx) = channel::<FramedChunks>();
            for _ in 0..FRAMED_BATCHES {
                // Cannot fail: the receiver is alive.
                let _ = empty_tx.send(FramedChunks::default());
            }
            let framing = std::thread::Builder::new()
                .name("framing".into())
                .spawn_scoped(scope, move || {
                    let mut input = input;
                    let mut framer = Framer::new();
                    let mut buf = vec![0u8; READ_CHUNK];
                    let mut offset = 0usize;
                    // Stops when the other side hangs up.
                    while let Ok(mut c) = empty_rx.recv() {
                        c.used = 0;
                        while c.used < CHUNKS_PER_BATCH {
                            let n = loop {
                                match input.read(&mut buf) {
                                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                                    r => break r,
                                }
                            };
                            let n = match n {
                                Ok(0) => {
                                    c.end = Some(Ok(()));
                                    break;
                                }
                                Ok(n) => n,
                                Err(e) => {
                                    c.end = Some(Err(e));
                                    break;
                                }
                            };
                            if c.chunks.len() == c.used {
                                c.chunks.push(FramedChunk::default());
                            }
                            let chunk = &mut c.chunks[c.used];
                            c.used += 1;
                            chunk.len = n;
                            chunk.head.clear();
                            if offset < HEAD_BYTES {
                                chunk
                                    .head
                                    .extend_from_slice(&buf[..n.min(HEAD_BYTES - offset)]);
                            }
                            offset += n;
                            chunk.frames.clear();
                            chunk.frames.push_from(&mut framer, &buf[..n]);
                        }
                        let last = c.end.is_some();
                        if full_tx.send(c).is_err() || last {
                            return;
                        }
                    }
                })
                .map_err(|e| HostError::io("starting the framing thread", e))?;
            let result = 'read: loop {
                let Ok(mut c) = full_rx.recv() else {
                    break Err(HostError::io(
                        "reading the stream",
                        std::io::Error::other("the framing thread stopped"),
                    ));
                };
                for chunk in &c.chunks[..c.used] {
                    if let Err(e) = self.feed_framed(chunk, sink) {
                        break 'read Err(e);
                    }
                    if after_chunk(self, sink).is_break() {
                        break 'read Ok(self.state);
                    }
                }
                match c.end.take() {
                    Some(Ok(())) => break Ok(self.state),
                    Some(Err(e)) => break Err(HostError::io("reading the stream", e)),
                    None => {}
                }
                let _ = empty_tx.send(c);
            };
            // Hang up so the framing thread ends, then wait for it.
            drop(full_rx);
            drop(empty_tx);
            if framing.join().is_err() {
                return Err(HostError::io(
                    "reading the stream",
                    std::io::Error::other("the framing thread panicked"),
                ));
            }
            result
        })
    }

    /// Reads `input` to its end (what follows an End record or a restart
    /// is only counted).
    pub fn read_all(
        &mut self,
        mut input: impl Read,
        sink: &mut dyn FnMut(&Item<'_>) -> Result<(), HostError>,
    ) -> Result<Flow, HostError> {
        read_chunks(&mut input, |chunk| self.feed(chunk, sink))
    }

    /// An error for a stream that held nothing Perch could decode.
    pub fn check_recognised(&self) -> Result<(), HostError> {
        if self.stats.hello.is_none() {
            let d = self.stats.decoder;
            return Err(HostError::NotPerch(if self.stats.bytes == 0 {
                "the stream is empty".to_owned()
            } else if d.frames_ok == 0 && is_text(&self.head) {
                let text = String::from_utf8_lossy(&self.head);
                let lines: Vec<&str> = text.lines().take(4).collect();
                format!(
                    "not a Perch stream: the appliance wrote text instead of the wire stream \
                     (is `console=wire` supported by this build?). It begins:\n  {}",
                    lines.join("\n  ")
                )
            } else if d.frames_ok == 0 {
                format!(
                    "not a Perch stream: no valid frame in {} bytes ({} damaged frames)",
                    self.stats.bytes, d.bad_frames
                )
            } else {
                format!(
                    "the stream has no Hello record ({} frames decoded): its start was lost or it is not a Perch capture",
                    d.frames_ok
                )
            }));
        }
        Ok(())
    }
}

/// How far into a capture file [`lost_first_hello`] looks for a Hello
/// (the target repeats it every two seconds).
const HELLO_SCAN: u64 = 64 << 20;

/// The Hello that describes a capture file whose own first Hello was lost
/// (damaged on the line, or the host joined late): the file's first intact
/// Hello when it is the target's repetition. A repetition carries the
/// run's events, CPUs and image, so the records before it decode and
/// convert as if the first Hello had arrived: every subcommand then counts
/// the same samples. `None` when the first Hello is the run's own, when
/// there is none in the first [`HELLO_SCAN`] bytes from where `f` stands,
/// and for anything but a regular file (`f` does not move).
pub fn lost_first_hello(f: &mut std::fs::File) -> Option<sampler::wire::Hello> {
    use std::io::Seek;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let start = f.stream_position().ok()?;
    let mut found = None;
    scan_capture(f, start, HELLO_SCAN, |r| match r {
        Record::Hello(h) => {
            found = Some(h);
            false
        }
        _ => true,
    });
    found.filter(|h| h.repeat > 0)
}

/// The first Task record of each task in the capture file `f`, read
/// from its start to its end or to the Hello of another boot (`f` does
/// not move): what a converter looks ahead to when a task's own record
/// was lost (see
/// [`Converter::set_lookahead`](crate::convert::Converter::set_lookahead)).
pub fn tasks_named_in(f: &std::fs::File) -> crate::convert::Lookahead {
    let mut tasks = crate::convert::Lookahead::new();
    let mut boot = None;
    scan_capture(f, 0, u64::MAX, |r| match r {
        Record::Hello(h) if boot.is_some_and(|b| b != h.boot) => false,
        Record::Hello(h) => {
            boot = Some(h.boot);
            true
        }
        Record::Task(t) => {
            tasks
                .entry((t.pid, t.tid))
                .or_insert_with(|| crate::wire::task(&t));
            true
        }
        _ => true,
    });
    tasks
}

/// Decodes the capture file `f` from byte `from`, for at most `limit`
/// bytes, handing each intact record to `each` until it returns false;
/// reads at offsets, so `f`'s position does not move.
fn scan_capture(f: &std::fs::File, from: u64, limit: u64, mut each: impl FnMut(Record) -> bool) {
    use std::os::unix::fs::FileExt;
    let mut dec = Box::new(Decoder::new());
    let mut buf = vec![0u8; READ_CHUNK];
    let mut at = from;
    let mut more = true;
    while more && at - from < limit {
        let n = match f.read_at(&mut buf, at) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        at += n as u64;
        dec.push(&buf[..n], |r| {
            if more && let Ok(r) = r {
                more = each(r);
            }
        });
    }
}

/// Whether `rec` goes on to the sink, given where the stream stands in
/// `result`: nothing does after an error; after End or a restart records
/// are only counted; a second Hello before End is a restart, unless it
/// is the target's periodic repetition of the first (same boot, non-zero
/// repeat), which is counted and dropped.
#[inline]
fn admit(rec: &Record, stats: &mut StreamStats, result: &mut Result<Flow, HostError>) -> bool {
    match result {
        Ok(Flow::Continue) => {}
        Ok(_) => {
            stats.after_end += 1;
            return false;
        }
        Err(_) => return false,
    }
    if let Record::Hello(h) = rec
        && let Some(first) = &stats.hello
    {
        if h.repeat > 0 && h.boot == first.boot {
            // The target's periodic repetition: nothing new.
            stats.hello_repeats += 1;
            return false;
        }
        stats.restarted = true;
        stats.after_end += 1;
        *result = Ok(Flow::Restart);
        return false;
    }
    true
}

/// Hands one record lent by the decoder to `sink`, samples as parts and
/// everything else as an item, after counting it in `stats`. `result` holds
/// the first error (after which records are dropped), or `Done` once the End
/// record went through, or `Restart` after a second Hello (after both,
/// records are only counted).
#[inline]
fn deliver(
    rec: Result<Lent<'_>, DecodeError>,
    adapter: &mut Adapter,
    stats: &mut StreamStats,
    sink: &mut impl PartsSink,
    result: &mut Result<Flow, HostError>,
) {
    match result {
        Ok(Flow::Continue) => {}
        Ok(_) => {
            stats.after_end += u64::from(rec.is_ok());
            return;
        }
        Err(_) => return,
    }
    let r = match rec {
        Ok(Lent::Record(rec)) if !admit(rec, stats, result) => return,
        Ok(Lent::Sample(s)) => {
            stats.observe_sample(s.event(), (s.pid(), s.tid()), s.cpumode() == CpuMode::User);
            sink.sample(&s)
        }
        Ok(Lent::Record(rec)) => adapter
            .with_item(rec, |item| {
                stats.observe(item);
                sink.item(item)
            })
            .map(|()| {
                if matches!(rec, Record::End(_)) {
                    *result = Ok(Flow::Done);
                }
            }),
        Err(e) => Err(decode_error(e)),
    };
    if let Err(e) = r {
        *result = Err(e);
    }
}

/// The error for a stream the decoder cannot read.
fn decode_error(e: DecodeError) -> HostError {
    match e {
        DecodeError::VersionMismatch { found, expected } => HostError::Protocol(format!(
            "the stream speaks Perch wire protocol version {found}, this perch speaks version {expected}"
        )),
        DecodeError::BadMagic(m) => HostError::NotPerch(format!(
            "not a Perch stream: its first record has magic {m:02x?}, expected \"PRCH\""
        )),
    }
}

/// One chunk of input as the framing thread hands it over.
#[derive(Default)]
struct FramedChunk {
    /// Bytes read.
    len: usize,
    /// Its bytes that fall in the first [`HEAD_BYTES`] of the stream.
    head: Vec<u8>,
    /// Its frames.
    frames: FrameBatch,
}

/// Chunks read and framed, handed over together (fewer thread switches).
#[derive(Default)]
struct FramedChunks {
    /// The first `used` hold this batch's chunks.
    chunks: Vec<FramedChunk>,
    used: usize,
    /// The input ended after these chunks: at its end, or with an error.
    end: Option<std::io::Result<()>>,
}

/// Batches in flight between the framing thread and the decoding one.
const FRAMED_BATCHES: usize = 4;

/// Chunks per batch.
const CHUNKS_PER_BATCH: usize = 8;

/// Bytes read at a time.
const READ_CHUNK: usize = 1 << 16;

/// Bytes of the stream start kept for error messages.
const HEAD_BYTES: usize = 512;

/// Whether `b` looks like plain text (printable ASCII and whitespace).
fn is_text(b: &[u8]) -> bool {
    !b.is_empty()
        && b.iter()
            .all(|&c| c == b'\n' || c == b'\r' || c == b'\t' || (0x20..0x7f).contains(&c))
}

/// Counters over a stream.
#[derive(Clone, Debug, Default)]
pub struct StreamStats {
    /// Bytes read.
    pub bytes: u64,
    /// The Hello, once seen.
    pub hello: Option<Hello>,
    /// Samples decoded.
    pub samples: u64,
    /// Samples taken in ring 3.
    pub user_samples: u64,
    /// Samples per event id.
    pub by_event: BTreeMap<u32, u64>,
    /// Samples per (pid, tid).
    pub by_task: BTreeMap<(u32, u32), u64>,
    /// Task names by tid.
    pub task_names: BTreeMap<u32, String>,
    /// The program each loaded process runs, by pid.
    pub programs: BTreeMap<u32, crate::model::ProgramInfo>,
    /// Samples the target reported lost.
    pub lost: u64,
    /// Samples lost per event id (every reason).
    pub lost_by_event: BTreeMap<u32, u64>,
    /// The part of `lost` suppressed while the event was throttled.
    pub lost_throttled: u64,
    /// Throttle starts.
    pub throttled: u64,
    /// Throttle ends.
    pub unthrottled: u64,
    /// Log records.
    pub logs: u64,
    /// Task ends.
    pub task_exits: u64,
    /// End counters.
    pub end: Option<EndCounters>,
    /// The decoder's counters (bad frames, skipped bytes).
    pub decoder: DecoderStats,
    /// Records after the End record, or from a second Hello on: counted,
    /// never converted (a second capture appended, or a restart).
    pub after_end: u64,
    /// A second Hello arrived before End: the appliance restarted, and
    /// everything counted here is from the first run.
    pub restarted: bool,
    /// Periodic repetitions of the Hello (same boot) after the first one
    /// seen.
    pub hello_repeats: u64,
    /// Consecutive samples of one event and task not yet added to
    /// `by_event` / `by_task`.
    run: Option<SampleRun>,
}

/// A run of samples with the same event and task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SampleRun {
    event: u32,
    task: (u32, u32),
    count: u64,
}

impl StreamStats {
    /// Counts `item`. Consecutive samples of one event and task are
    /// counted as a run, which goes into `by_event` and `by_task` when the
    /// run ends or at [`settle`](Self::settle). [`Pump::feed`] settles
    /// before it returns, so its counters are always complete.
    pub fn observe(&mut self, item: &Item<'_>) {
        match item {
            Item::Hello(h) => {
                if self.hello.is_none() {
                    self.hello = Some(h.clone());
                }
            }
            Item::Task(t) => {
                self.task_names.insert(t.tid, t.name.clone());
                if let Some(p) = &t.program {
                    self.programs.insert(t.pid, p.clone());
                }
            }
            Item::Sample(s) => self.observe_sample(s.event, (s.pid, s.tid), s.user),
            Item::Lost {
                count,
                throttled,
                event,
                ..
            } => {
                self.lost += count;
                *self.lost_by_event.entry(*event).or_default() += count;
                if *throttled {
                    self.lost_throttled += count;
                }
            }
            Item::Throttle { on: true, .. } => self.throttled += 1,
            Item::Throttle { on: false, .. } => self.unthrottled += 1,
            Item::Log(_) | Item::Defmt(_) => self.logs += 1,
            Item::TaskExit { .. } => self.task_exits += 1,
            Item::End(e) => self.end = Some(e.clone()),
        }
    }

    /// Counts a sample of `event` by `task` (pid, tid), taken in ring 3
    /// when `user`: what [`observe`](Self::observe) does for a sample item.
    #[inline]
    pub fn observe_sample(&mut self, event: u32, task: (u32, u32), user: bool) {
        self.samples += 1;
        self.user_samples += u64::from(user);
        match &mut self.run {
            Some(r) if r.event == event && r.task == task => r.count += 1,
            _ => {
                self.settle();
                self.run = Some(SampleRun {
                    event,
                    task,
                    count: 1,
                });
            }
        }
    }

    /// Adds the current run of samples to `by_event` and `by_task`.
    pub fn settle(&mut self) {
        if let Some(r) = self.run.take() {
            *self.by_event.entry(r.event).or_default() += r.count;
            *self.by_task.entry(r.task).or_default() += r.count;
        }
    }

    /// The `perch stat` report.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "stream: {} bytes", self.bytes);
        if let Some(h) = &self.hello {
            let _ = writeln!(
                s,
                "appliance: protocol {}, {} cpu(s), {}, source {:?}, cmdline \"{}\"",
                h.protocol_version, h.cpus, h.cpu_desc, h.source, h.cmdline
            );
            let _ = writeln!(s, "transport: {}", h.transport);
        }
        let _ = writeln!(
            s,
            "samples: {} ({} user, {} runtime)",
            self.samples,
            self.user_samples,
            self.samples - self.user_samples
        );
        let _ = writeln!(s, "\nper event:");
        let mut ids: Vec<u32> = self.by_event.keys().copied().collect();
        ids.extend(
            self.lost_by_event
                .keys()
                .filter(|i| !self.by_event.contains_key(i)),
        );
        ids.sort_unstable();
        for id in &ids {
            let n = &self.by_event.get(id).copied().unwrap_or(0);
            let name = self
                .hello
                .as_ref()
                .and_then(|h| {
                    h.events
                        .iter()
                        .find(|e| e.id == *id)
                        .map(|e| e.perf_name(h.source))
                })
                .unwrap_or_else(|| "(undeclared)".into());
            let lost = self.lost_by_event.get(id).copied().unwrap_or(0);
            let _ = writeln!(
                s,
                "  {id:>4} {name:<24} {n:>10}  {:>6.2}%  lost {lost}",
                pct(*n, self.samples)
            );
        }
        let _ = writeln!(s, "\nper task:");
        for ((pid, tid), n) in &self.by_task {
            let name = if *pid == 0 {
                crate::convert::RUNTIME_COMM.to_owned()
            } else {
                self.task_names
                    .get(tid)
                    .cloned()
                    .unwrap_or_else(|| "(unnamed)".into())
            };
            let _ = writeln!(
                s,
                "  {pid:>4}/{tid:<4} {name:<20} {n:>10}  {:>6.2}%",
                pct(*n, self.samples)
            );
        }
        if !self.programs.is_empty() {
            let _ = writeln!(s, "\nprograms:");
            for (pid, p) in &self.programs {
                let text: Vec<String> = p
                    .segments
                    .iter()
                    .filter(|g| g.exec)
                    .map(|g| format!("{:#x}-{:#x}", g.start, g.start.saturating_add(g.len)))
                    .collect();
                let _ = writeln!(
                    s,
                    "  {pid:>4} {}: build-id {}, text {}",
                    p.path,
                    if p.build_id.is_empty() {
                        "(none)".to_owned()
                    } else {
                        crate::convert::hex(&p.build_id)
                    },
                    if text.is_empty() {
                        "(none)".to_owned()
                    } else {
                        text.join(" ")
                    }
                );
            }
        }
        let unnamed: Vec<u64> = self
            .by_task
            .iter()
            .filter(|((pid, tid), _)| *pid != 0 && !self.task_names.contains_key(tid))
            .map(|(_, n)| *n)
            .collect();
        if !unnamed.is_empty() {
            let _ = writeln!(
                s,
                "tasks without a Task record: {} ({} samples; the record was damaged or lost)",
                unnamed.len(),
                unnamed.iter().sum::<u64>()
            );
        }
        let d = self.decoder;
        let _ = writeln!(
            s,
            "\nlost (target): {} ({} throttled)",
            self.lost, self.lost_throttled
        );
        let _ = writeln!(
            s,
            "throttled: {} (unthrottled {})",
            self.throttled, self.unthrottled
        );
        let _ = writeln!(
            s,
            "bad frames: {} ({} unresolved delta samples, {} bytes skipped, {} frames ignored)",
            d.bad_frames, d.unresolved_samples, d.bytes_skipped, d.frames_ignored
        );
        let _ = writeln!(s, "log records: {}", self.logs);
        if self.restarted {
            let _ = writeln!(
                s,
                "restarted: a second Hello arrived before End (the appliance restarted); \
                 counted up to it, {} records from there on ignored",
                self.after_end
            );
        } else if self.after_end > 0 {
            let _ = writeln!(
                s,
                "after end: {} records after the End record ignored (a second capture appended?)",
                self.after_end
            );
        }
        if self.samples > 0 {
            let _ = writeln!(
                s,
                "bytes per sample: {:.1}",
                self.bytes as f64 / self.samples as f64
            );
        }
        match &self.end {
            Some(e) => {
                let _ = writeln!(
                    s,
                    "end: taken {} = delivered {} + lost {} ({}), throttled {}",
                    e.taken,
                    e.delivered,
                    e.lost,
                    if e.taken == e.delivered + e.lost {
                        "consistent"
                    } else {
                        "INCONSISTENT"
                    },
                    e.throttled
                );
                let missing = e.delivered.saturating_sub(self.samples);
                let _ = writeln!(s, "delivered but not received intact: {missing}");
                if !e.unknown_syscalls.is_empty() {
                    let _ = writeln!(s, "unknown system calls: {}", e.unknown_syscalls);
                }
            }
            None => {
                let _ = writeln!(
                    s,
                    "end: no End record (stream stopped early or was truncated)"
                );
            }
        }
        s
    }
}

fn pct(n: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        100.0 * n as f64 / total as f64
    }
}

/// Shows target logs on stderr: text as is, defmt frames decoded with the
/// image's defmt table.
pub struct LogPrinter {
    table: Option<defmt_decoder::Table>,
}

impl LogPrinter {
    /// A printer; `elf` supplies the defmt table when the image has one.
    pub fn new(elf: Option<&[u8]>) -> Self {
        let table = elf.and_then(|b| defmt_decoder::Table::parse(b).ok().flatten());
        LogPrinter { table }
    }

    /// The text for a log item, or None for other items.
    pub fn render(&self, item: &Item<'_>) -> Option<String> {
        match item {
            Item::Log(t) => Some(format!("target: {t}")),
            Item::Defmt(bytes) => Some(match &self.table {
                None => format!("target: defmt frame {bytes:02x?} (no defmt table: pass --image)"),
                Some(table) => match table.decode(bytes) {
                    Ok((frame, _)) => format!("target: {}", frame.display(false)),
                    Err(_) => {
                        let mut dec = table.new_stream_decoder();
                        dec.received(bytes);
                        if bytes.last() != Some(&0) {
                            dec.received(&[0]);
                        }
                        match dec.decode() {
                            Ok(frame) => format!("target: {}", frame.display(false)),
                            Err(e) => {
                                format!("target: undecodable defmt frame ({e:?}): {bytes:02x?}")
                            }
                        }
                    }
                },
            }),
            _ => None,
        }
    }
}

/// Reads `input` in 64 KiB chunks, handing each to `feed`, until the end
/// of the input ([`Flow::Continue`]) or until `feed` says [`Flow::Done`].
fn read_chunks(
    input: &mut impl Read,
    mut feed: impl FnMut(&[u8]) -> Result<Flow, HostError>,
) -> Result<Flow, HostError> {
    let mut buf = vec![0u8; 1 << 16];
    let mut last = Flow::Continue;
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => return Ok(last),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(HostError::io("reading the stream", e)),
        };
        last = feed(&buf[..n])?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SampleView;
    use object::write::{Object, Symbol, SymbolSection};
    use object::{Architecture, BinaryFormat, Endianness, SymbolFlags, SymbolKind, SymbolScope};

    /// An ELF carrying a defmt table with one info message at index 1.
    fn defmt_elf() -> Vec<u8> {
        let mut obj = Object::new(BinaryFormat::Elf, Architecture::X86_64, Endianness::Little);
        let sec = obj.add_section(
            Vec::new(),
            b".defmt".to_vec(),
            object::SectionKind::ReadOnlyData,
        );
        obj.set_section_data(sec, vec![0; 4], 1);
        let msg = r#"{"package":"perch","tag":"defmt_info","data":"ring has {=u8} free slots","disambiguator":"1","crate_name":"runtime"}"#;
        obj.add_symbol(Symbol {
            name: msg.as_bytes().to_vec(),
            value: 1,
            size: 1,
            kind: SymbolKind::Data,
            scope: SymbolScope::Linkage,
            weak: false,
            section: SymbolSection::Section(sec),
            flags: SymbolFlags::None,
        });
        for name in ["_defmt_version_ = 4", "_defmt_encoding_ = raw"] {
            obj.add_symbol(Symbol {
                name: name.as_bytes().to_vec(),
                value: 0,
                size: 0,
                kind: SymbolKind::Data,
                scope: SymbolScope::Compilation,
                weak: false,
                section: SymbolSection::Absolute,
                flags: SymbolFlags::None,
            });
        }
        obj.write().unwrap()
    }

    fn sample(event: u32, pid: u32, tid: u32) -> SampleView<'static> {
        SampleView {
            event,
            pid,
            tid,
            user: true,
            ..SampleView::default()
        }
    }

    /// Runs of samples, interrupted by other tasks, events and records,
    /// are counted exactly per event and per task once settled.
    #[test]
    fn per_task_and_per_event_counts_are_exact() {
        let mut st = StreamStats::default();
        let seq = [
            (0, 1, 1),
            (0, 1, 1),
            (0, 1, 2),
            (1, 1, 2),
            (1, 1, 2),
            (0, 1, 1),
            (0, 0, 0),
            (0, 1, 1),
            (0, 1, 1),
        ];
        for (i, &(e, p, t)) in seq.iter().enumerate() {
            st.observe(&Item::Sample(sample(e, p, t)));
            if i == 4 {
                st.observe(&Item::Log("between".into()));
            }
        }
        st.settle();
        st.settle();
        assert_eq!(st.samples, 9);
        assert_eq!(st.by_event.get(&0), Some(&7));
        assert_eq!(st.by_event.get(&1), Some(&2));
        assert_eq!(st.by_task.get(&(1, 1)), Some(&5));
        assert_eq!(st.by_task.get(&(1, 2)), Some(&3));
        assert_eq!(st.by_task.get(&(0, 0)), Some(&1));
        assert_eq!(st.by_task.len(), 3);
    }

    #[test]
    fn defmt_frames_are_decoded_with_the_image_table() {
        let elf = defmt_elf();
        let logs = LogPrinter::new(Some(&elf));
        // Raw encoding: u16 index, then the u8 argument.
        let line = logs.render(&Item::Defmt(&[1, 0, 7])).unwrap();
        assert!(line.contains("ring has 7 free slots"), "{line}");
        assert!(line.contains("INFO"), "{line}");
        // An index the table does not know is shown as undecodable, not dropped.
        let bad = logs.render(&Item::Defmt(&[9, 9])).unwrap();
        assert!(bad.contains("undecodable defmt frame"), "{bad}");
        // Without an image the bytes are shown with a hint.
        let none = LogPrinter::new(None)
            .render(&Item::Defmt(&[1, 0, 7]))
            .unwrap();
        assert!(none.contains("pass --image"), "{none}");
        assert_eq!(logs.render(&Item::Log("x".into())).unwrap(), "target: x");
    }
}
