//! `perch top`'s model, independent of any terminal: live samples
//! symbolised (the runtime from its image, each program from its own host
//! file), self counts per (command, shared object, symbol), ranked by self
//! share; the line's rates between refreshes; the plain text table; and the
//! [`Watch`] that drives a display from the recording loop, with the
//! keys it understands. The full-screen view is in [`tui`].

pub mod tui;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sampler::sample::CpuMode;
use sampler::wire::SampleParts;

use crate::convert::{RUNTIME_COMM, archive_key, hex};
use crate::error::HostError;
use crate::image::Image;
use crate::input::{Observer, StreamStats};
use crate::model::{Item, SegmentInfo, TaskInfo};
use crate::symtab::SymbolTable;

/// The shared-object name of runtime (ring 0) code.
pub const RUNTIME_DSO: &str = "[runtime]";

/// A shared object: the runtime, the image's built-in task code, or a
/// program file.
#[derive(Debug)]
struct Dso {
    /// What the table shows.
    name: String,
    /// Its symbols (`None`: the file could not be read).
    table: Option<SymbolTable>,
}

/// What is known of a process.
#[derive(Debug, Default)]
struct Proc {
    /// The program's shared object (`None` for built-in tasks, whose code
    /// is in the image).
    dso: Option<usize>,
    /// The program's loaded executable segments.
    segments: Vec<SegmentInfo>,
}

/// A symbol, or an address no symbol covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Sym {
    Func(u32),
    Addr(u64),
}

/// What a row counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct RowKey {
    comm: u32,
    /// Index in `dsos`, `u32::MAX` when unknown.
    dso: u32,
    kernel: bool,
    sym: Sym,
}

/// A row's counts.
#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    samples: u64,
    period: u64,
}

/// One row of the ranking.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Self share of all the period counted, in percent.
    pub share: f64,
    /// Samples.
    pub samples: u64,
    /// Period (the weight of the share).
    pub period: u64,
    /// The task's name.
    pub command: String,
    /// The shared object: the program's file name, the image's, or
    /// [`RUNTIME_DSO`].
    pub dso: String,
    /// Runtime code (`[k]`), else the program's (`[.]`).
    pub kernel: bool,
    /// The function, or `0x...` where no symbol covers the address.
    pub symbol: String,
}

/// One command's part of the samples.
#[derive(Clone, Debug, PartialEq)]
pub struct CommandShare {
    /// The task's name.
    pub command: String,
    /// Share of all the period counted, in percent.
    pub share: f64,
    /// The part of `share` spent in runtime code.
    pub runtime_share: f64,
}

/// Which rows a view shows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Filter {
    /// Every row.
    #[default]
    All,
    /// The rows of one command.
    Command(String),
    /// Runtime code only, of every command.
    Runtime,
}

impl Filter {
    fn admits(&self, command: &str, kernel: bool) -> bool {
        match self {
            Filter::All => true,
            Filter::Command(c) => c == command,
            Filter::Runtime => kernel,
        }
    }

    /// How the view names it.
    pub fn label(&self) -> String {
        match self {
            Filter::All => "all".into(),
            Filter::Command(c) => c.clone(),
            Filter::Runtime => "runtime code".into(),
        }
    }
}

/// Self counts per (command, shared object, symbol) of the samples seen.
#[derive(Debug, Default)]
pub struct Top {
    /// The runtime image's symbols (`RUNTIME` and `IMAGE` rows).
    runtime: Option<usize>,
    /// The image's built-in task code.
    image: Option<usize>,
    dsos: Vec<Dso>,
    /// Program shared objects by archive path.
    program_dsos: HashMap<String, usize>,
    /// Host files of the programs, by archive path.
    programs: BTreeMap<String, PathBuf>,
    procs: HashMap<u32, Proc>,
    comms: Vec<String>,
    comm_ids: HashMap<String, u32>,
    /// The command of each tid.
    tid_comm: HashMap<u32, u32>,
    rows: HashMap<RowKey, Counts>,
    samples: u64,
    period: u64,
    /// The event shown: the Hello's first (perf top's default), with
    /// the others' names after it ("cycles:u (of cycles:u, instructions:u)").
    event: Option<String>,
    /// The id of the event shown; samples of the others are not counted.
    shown: Option<u32>,
    /// Things the user should know (an unreadable program file, another
    /// build of it).
    notes: Vec<String>,
}

impl Top {
    /// Counts symbolised with `image` (the runtime) and the programs' host
    /// files, by archive path (`bin/app`).
    pub fn new(image: Option<&Image>, programs: BTreeMap<String, PathBuf>) -> Top {
        let mut t = Top {
            programs,
            ..Top::default()
        };
        if let Some(img) = image {
            let table = SymbolTable::of_image(img);
            t.dsos.push(Dso {
                name: RUNTIME_DSO.into(),
                table: Some(table.clone()),
            });
            t.runtime = Some(0);
            t.dsos.push(Dso {
                name: file_name(&img.path),
                table: Some(table),
            });
            t.image = Some(1);
        }
        t
    }

    /// Samples counted.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// The sampled event's perf name, once the Hello is seen.
    pub fn event(&self) -> Option<&str> {
        self.event.as_deref()
    }

    /// What the user should know about the symbols.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Forgets the counts (not the tasks): `--zero`.
    pub fn zero(&mut self) {
        self.rows.clear();
        self.samples = 0;
        self.period = 0;
    }

    fn comm_id(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.comm_ids.get(name) {
            return id;
        }
        let id = self.comms.len() as u32;
        self.comms.push(name.to_owned());
        self.comm_ids.insert(name.to_owned(), id);
        id
    }

    /// Takes one stream item: the Hello names the event, Task records name
    /// the tasks and their programs, samples are counted.
    pub fn item(&mut self, item: &Item<'_>) {
        match item {
            Item::Hello(h) if self.event.is_none() => {
                let names: Vec<String> = h.events.iter().map(|e| e.perf_name(h.source)).collect();
                self.event = names.first().map(|first| {
                    if names.len() > 1 {
                        format!("{first} (samples of the first of {})", names.join(", "))
                    } else {
                        first.clone()
                    }
                });
                self.shown = h.events.first().map(|e| e.id);
            }
            Item::Task(t) => self.task(t),
            Item::Sample(s) if self.shows(s.event) => {
                self.sample(s.pid, s.tid, s.ip, !s.user, s.period)
            }
            _ => {}
        }
    }

    /// Takes a sample in the decoder's parts.
    #[inline]
    pub fn sample_parts(&mut self, s: &SampleParts<'_>) {
        if !self.shows(s.event()) {
            return;
        }
        self.sample(
            s.pid(),
            s.tid(),
            s.ip(),
            s.cpumode() == CpuMode::Kernel,
            s.period(),
        );
    }

    /// Whether samples of event `id` are counted: those of the event
    /// shown, or all before a Hello named one.
    #[inline]
    fn shows(&self, id: u32) -> bool {
        self.shown.is_none_or(|shown| shown == id)
    }

    fn task(&mut self, t: &TaskInfo) {
        let comm = self.comm_id(&t.name);
        self.tid_comm.insert(t.tid, comm);
        let dso = t.program.as_ref().map(|p| self.program_dso(t, p));
        let segments = t
            .program
            .as_ref()
            .map(|p| p.segments.iter().filter(|s| s.exec).copied().collect())
            .unwrap_or_default();
        self.procs.insert(t.pid, Proc { dso, segments });
    }

    /// The shared object of the program `p` that task `t` runs, reading
    /// its host file the first time.
    fn program_dso(&mut self, t: &TaskInfo, p: &crate::model::ProgramInfo) -> usize {
        let key = archive_key(&p.path).to_owned();
        if let Some(&d) = self.program_dsos.get(&key) {
            return d;
        }
        let host = self.programs.get(&key).cloned();
        let name = match &host {
            Some(h) => file_name(h),
            None => file_name(Path::new(&key)),
        };
        let table = match &host {
            None => {
                self.notes.push(format!(
                    "{} runs {key}, whose host file perch does not know: its samples show as addresses",
                    t.name
                ));
                None
            }
            Some(h) => match std::fs::read(h)
                .map_err(|e| e.to_string())
                .and_then(|b| SymbolTable::parse(&b))
            {
                Err(e) => {
                    self.notes.push(format!(
                        "{} (the host file of {key}): {e}: its samples show as addresses",
                        h.display()
                    ));
                    None
                }
                Ok(table) => match table.build_id() {
                    Some(id) if !p.build_id.is_empty() && id != &p.build_id[..] => {
                        self.notes.push(format!(
                            "{} has build-id {}, but {} ran {key} with build-id {}: its samples show as addresses",
                            h.display(),
                            hex(id),
                            t.name,
                            hex(&p.build_id)
                        ));
                        None
                    }
                    _ => Some(table),
                },
            },
        };
        let d = self.dsos.len();
        self.dsos.push(Dso { name, table });
        self.program_dsos.insert(key, d);
        d
    }

    /// Counts one sample of task (pid, tid) at `ip`, in runtime code when
    /// `kernel`, weighing `period` (at least 1).
    pub fn sample(&mut self, pid: u32, tid: u32, ip: u64, kernel: bool, period: u64) {
        let comm = match self.tid_comm.get(&tid) {
            Some(&c) => c,
            None if pid == 0 => self.comm_id(RUNTIME_COMM),
            None => self.comm_id(&format!("tid-{tid}")),
        };
        let (dso, addr) = if kernel {
            (self.runtime, Some(ip))
        } else {
            match self.procs.get(&pid) {
                Some(Proc {
                    dso: Some(d),
                    segments,
                }) => {
                    // The program's file address of `ip`, through the
                    // segment it lies in and the file's load map.
                    let addr = segments
                        .iter()
                        .find(|s| ip >= s.start && ip - s.start < s.len)
                        .and_then(|s| s.file_offset.checked_add(ip - s.start))
                        .and_then(|off| {
                            self.dsos[*d]
                                .table
                                .as_ref()
                                .and_then(|t| t.address_of_offset(off))
                        });
                    (Some(*d), addr)
                }
                _ => (self.image, Some(ip)),
            }
        };
        let func = match (dso, addr) {
            (Some(d), Some(a)) => self.dsos[d].table.as_ref().and_then(|t| t.lookup(a)),
            _ => None,
        };
        let key = RowKey {
            comm,
            dso: dso.map_or(u32::MAX, |d| d as u32),
            kernel,
            sym: match func {
                Some(i) => Sym::Func(i as u32),
                None => Sym::Addr(ip),
            },
        };
        let period = period.max(1);
        let c = self.rows.entry(key).or_default();
        c.samples += 1;
        c.period += period;
        self.samples += 1;
        self.period += period;
    }

    fn share(&self, period: u64) -> f64 {
        if self.period == 0 {
            0.0
        } else {
            period as f64 * 100.0 / self.period as f64
        }
    }

    /// The rows `filter` admits, hottest first (by period, then samples,
    /// then command and symbol, so that equal rows keep one order).
    pub fn rows(&self, filter: &Filter) -> Vec<Row> {
        let mut rows: Vec<Row> = self
            .rows
            .iter()
            .filter_map(|(k, c)| {
                let command = self.comms.get(k.comm as usize)?;
                if !filter.admits(command, k.kernel) {
                    return None;
                }
                let dso = self.dsos.get(k.dso as usize);
                let symbol = match k.sym {
                    Sym::Func(i) => dso
                        .and_then(|d| d.table.as_ref())
                        .and_then(|t| t.name(i as usize))
                        .unwrap_or("?")
                        .to_owned(),
                    Sym::Addr(a) => format!("{a:#x}"),
                };
                Some(Row {
                    share: self.share(c.period),
                    samples: c.samples,
                    period: c.period,
                    command: command.clone(),
                    dso: match dso {
                        Some(d) => d.name.clone(),
                        None if k.kernel => RUNTIME_DSO.into(),
                        None => "[unknown]".into(),
                    },
                    kernel: k.kernel,
                    symbol,
                })
            })
            .collect();
        rows.sort_by(|a, b| {
            b.period
                .cmp(&a.period)
                .then(b.samples.cmp(&a.samples))
                .then_with(|| a.command.cmp(&b.command))
                .then_with(|| a.symbol.cmp(&b.symbol))
        });
        rows
    }

    /// Each command's share, largest first, and the share of runtime code
    /// over all commands.
    pub fn commands(&self) -> (Vec<CommandShare>, f64) {
        let mut per: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        let mut runtime = 0;
        for (k, c) in &self.rows {
            let e = per.entry(k.comm).or_default();
            e.0 += c.period;
            if k.kernel {
                e.1 += c.period;
                runtime += c.period;
            }
        }
        let mut v: Vec<(u64, CommandShare)> = per
            .into_iter()
            .filter_map(|(id, (p, k))| {
                Some((
                    p,
                    CommandShare {
                        command: self.comms.get(id as usize)?.clone(),
                        share: self.share(p),
                        runtime_share: self.share(k),
                    },
                ))
            })
            .collect();
        v.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.command.cmp(&b.1.command)));
        (v.into_iter().map(|(_, c)| c).collect(), self.share(runtime))
    }

    /// The filters a view cycles through: all, each command (largest
    /// first), runtime code.
    pub fn filters(&self) -> Vec<Filter> {
        let mut v = vec![Filter::All];
        v.extend(
            self.commands()
                .0
                .into_iter()
                .map(|c| Filter::Command(c.command)),
        );
        v.push(Filter::Runtime);
        v
    }
}

fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(
        || p.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// The stream's counters that the view shows as totals and rates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Samples decoded.
    pub samples: u64,
    /// Samples the target reported lost (ring full, or suppressed while
    /// throttled).
    pub lost: u64,
    /// Times throttling engaged.
    pub throttles: u64,
    /// Bytes read from the line.
    pub bytes: u64,
    /// Damaged frames.
    pub bad_frames: u64,
}

impl Counters {
    /// The counters of `s`.
    pub fn of(s: &StreamStats) -> Counters {
        Counters {
            samples: s.samples,
            lost: s.lost,
            throttles: s.throttled,
            bytes: s.bytes,
            bad_frames: s.decoder.bad_frames,
        }
    }
}

/// Per-second rates over one refresh interval.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Rates {
    /// Samples per second.
    pub samples: f64,
    /// Lost samples per second.
    pub lost: f64,
    /// Throttles per second.
    pub throttles: f64,
    /// Line bytes per second.
    pub bytes: f64,
}

impl Rates {
    /// The rates from `before` to `now` over `secs` seconds.
    pub fn between(before: &Counters, now: &Counters, secs: f64) -> Rates {
        if secs <= 0.0 {
            return Rates::default();
        }
        let per = |a: u64, b: u64| b.saturating_sub(a) as f64 / secs;
        Rates {
            samples: per(before.samples, now.samples),
            lost: per(before.lost, now.lost),
            throttles: per(before.throttles, now.throttles),
            bytes: per(before.bytes, now.bytes),
        }
    }
}

/// How the run stands, for the header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RunState {
    /// Samples are arriving (or awaited).
    #[default]
    Running,
    /// The appliance sent End.
    Ended,
    /// The user quit.
    Stopped,
}

/// Everything one frame of the view shows.
#[derive(Clone, Debug, Default)]
pub struct Frame {
    /// Time since the view started.
    pub elapsed: Duration,
    /// Totals.
    pub totals: Counters,
    /// Rates over the last interval.
    pub rates: Rates,
    /// The event sampled.
    pub event: Option<String>,
    /// How the run stands.
    pub state: RunState,
    /// The commands' shares and the share of runtime code.
    pub commands: (Vec<CommandShare>, f64),
    /// The filter in use.
    pub filter: Filter,
    /// The rows it admits, hottest first.
    pub rows: Vec<Row>,
    /// Samples in the counts (differs from `totals.samples` with `--zero`).
    pub counted: u64,
    /// What the user should know.
    pub notes: Vec<String>,
}

/// Bytes with a binary unit.
pub fn human_bytes(b: f64) -> String {
    if b >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", b / (1024.0 * 1024.0))
    } else if b >= 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{b:.0} B")
    }
}

impl Frame {
    /// The status line: time, event, samples, losses, throttles and line
    /// bytes, with their rates.
    pub fn status(&self) -> String {
        let t = &self.totals;
        let r = &self.rates;
        format!(
            "{:.1} s{}{}: {} samples ({:.0}/s), {} lost ({:.0}/s), {} throttles ({:.1}/s), {} on the line ({}/s), {} bad frames",
            self.elapsed.as_secs_f64(),
            self.event
                .as_deref()
                .map_or(String::new(), |e| format!(", event {e}")),
            match self.state {
                RunState::Running => "",
                RunState::Ended => ", ended",
                RunState::Stopped => ", stopped",
            },
            t.samples,
            r.samples,
            t.lost,
            r.lost,
            t.throttles,
            r.throttles,
            human_bytes(t.bytes as f64),
            human_bytes(r.bytes),
            t.bad_frames
        )
    }

    /// The commands' shares: `demo64 25.1% (2.0% runtime)  ...  runtime code 9.0%`.
    pub fn command_line(&self) -> String {
        let mut s = String::new();
        for c in &self.commands.0 {
            let _ = write!(s, "{} {:.1}%", c.command, c.share);
            if c.runtime_share >= 0.05 {
                let _ = write!(s, " ({:.1}% runtime)", c.runtime_share);
            }
            s.push_str("  ");
        }
        let _ = write!(s, "| runtime code {:.1}%", self.commands.1);
        s
    }

    /// The plain text table (`--stdio`, or stdout not a terminal): a
    /// header, then at most `entries` rows.
    pub fn render_table(&self, entries: usize) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "perch top: {}", self.status());
        let _ = writeln!(s, "commands: {}", self.command_line());
        if self.filter != Filter::All {
            let _ = writeln!(s, "showing: {}", self.filter.label());
        }
        for n in &self.notes {
            let _ = writeln!(s, "note: {n}");
        }
        let cw = self
            .rows
            .iter()
            .take(entries)
            .map(|r| r.command.len())
            .chain([7])
            .max()
            .unwrap_or(7);
        let dw = self
            .rows
            .iter()
            .take(entries)
            .map(|r| r.dso.len())
            .chain([13])
            .max()
            .unwrap_or(13);
        let _ = writeln!(
            s,
            "{:>8}  {:>9}  {:<cw$}  {:<dw$}  Symbol",
            "Overhead", "Samples", "Command", "Shared Object"
        );
        for r in self.rows.iter().take(entries) {
            let _ = writeln!(
                s,
                "{:>7.2}%  {:>9}  {:<cw$}  {:<dw$}  {} {}",
                r.share,
                r.samples,
                r.command,
                r.dso,
                if r.kernel { "[k]" } else { "[.]" },
                r.symbol
            );
        }
        if self.rows.is_empty() {
            let _ = writeln!(s, "(no samples yet)");
        }
        s
    }
}

/// A key the view reacts to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    /// `q`, Esc or Ctrl-C: stop the run.
    Quit,
    /// `p`: show the next command (all, each command, runtime code).
    NextFilter,
    /// `P`: the previous one.
    PrevFilter,
    /// The terminal changed size or asked for a redraw.
    Redraw,
}

/// Where a [`Watch`] shows its frames.
pub trait Display {
    /// Shows `frame`.
    fn draw(&mut self, frame: &Frame) -> Result<(), HostError>;
    /// The next key pressed, if any is waiting (never blocks).
    fn key(&mut self) -> Result<Option<Key>, HostError>;
    /// A line of the target's (program output, runtime log) while the
    /// display owns the terminal; returns false when the caller should print
    /// it as usual.
    fn log(&mut self, line: &str) -> bool;
    /// The run stopped reading: the last frame, then the terminal goes
    /// back to normal.
    fn finish(&mut self, frame: &Frame) -> Result<(), HostError>;
    /// Whether the first tick draws at once (a screen, blank until then),
    /// rather than after the first interval.
    fn immediate(&self) -> bool {
        true
    }
}

/// The plain display: a table every refresh, written to `out` (stdout when
/// it is not a terminal, like `perf top --stdio`), the last one when the
/// run ends; the target's lines go to stderr. Keys are not read (Ctrl-C
/// stops the run).
#[derive(Debug)]
pub struct Plain<W: std::io::Write> {
    out: W,
    entries: usize,
}

impl<W: std::io::Write> Plain<W> {
    /// Tables of at most `entries` rows to `out`.
    pub fn new(out: W, entries: usize) -> Self {
        Plain { out, entries }
    }

    /// The writer.
    pub fn into_inner(self) -> W {
        self.out
    }

    fn write(&mut self, frame: &Frame) -> Result<(), HostError> {
        let text = frame.render_table(self.entries);
        match self
            .out
            .write_all(text.as_bytes())
            .and_then(|()| self.out.write_all(b"\n"))
            .and_then(|()| self.out.flush())
        {
            // A reader that went away (`perch top | head`) is no error:
            // the recording goes on into perf.data.
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                Err(HostError::io("writing the table", e))
            }
            _ => Ok(()),
        }
    }
}

impl<W: std::io::Write> Display for Plain<W> {
    fn draw(&mut self, frame: &Frame) -> Result<(), HostError> {
        self.write(frame)
    }

    fn key(&mut self) -> Result<Option<Key>, HostError> {
        Ok(None)
    }

    /// The target's lines go to stderr, so that the tables' stream holds
    /// nothing else.
    fn log(&mut self, line: &str) -> bool {
        eprintln!("{line}");
        true
    }

    fn finish(&mut self, frame: &Frame) -> Result<(), HostError> {
        self.write(frame)
    }

    /// No empty table at the start: the first one comes after `delay`.
    fn immediate(&self) -> bool {
        false
    }
}

/// Options of a view.
#[derive(Clone, Copy, Debug)]
pub struct WatchOptions {
    /// Time between refreshes.
    pub delay: Duration,
    /// Zero the counts after each refresh (`perf top -z`).
    pub zero: bool,
}

/// Drives a [`Display`] from the recording loop: counts what arrives in a
/// [`Top`], redraws every `delay` (and at once after a key), and stops the
/// run on [`Key::Quit`].
pub struct Watch<D: Display> {
    top: Option<Top>,
    display: D,
    options: WatchOptions,
    start: Instant,
    /// The last refresh: when, and the counters then.
    last: (Instant, Counters),
    rates: Rates,
    filter: Filter,
    state: RunState,
    /// Whether a frame was drawn (the first tick draws one at once).
    drawn: bool,
    /// The first display error, reported when the run ends.
    error: Option<HostError>,
}

impl<D: Display> Watch<D> {
    /// A view on `display`.
    pub fn new(display: D, options: WatchOptions) -> Self {
        let now = Instant::now();
        Watch {
            top: None,
            display,
            options,
            start: now,
            last: (now, Counters::default()),
            rates: Rates::default(),
            filter: Filter::All,
            state: RunState::Running,
            drawn: false,
            error: None,
        }
    }

    /// The counts (once the run began).
    pub fn top(&self) -> Option<&Top> {
        self.top.as_ref()
    }

    /// Whether the user quit.
    pub fn stopped(&self) -> bool {
        self.state == RunState::Stopped
    }

    /// The display.
    pub fn display(&self) -> &D {
        &self.display
    }

    /// The display, taken back.
    pub fn into_display(self) -> D {
        self.display
    }

    /// The first error the display gave, if any.
    pub fn take_error(&mut self) -> Option<HostError> {
        self.error.take()
    }

    /// The frame as of `now`, with `totals`.
    pub fn frame(&self, now: Instant, totals: Counters) -> Frame {
        let (rows, commands, event, counted, notes) = match &self.top {
            Some(t) => (
                t.rows(&self.filter),
                t.commands(),
                t.event().map(str::to_owned),
                t.samples(),
                t.notes().to_vec(),
            ),
            None => Default::default(),
        };
        Frame {
            elapsed: now.saturating_duration_since(self.start),
            totals,
            rates: self.rates,
            event,
            state: self.state,
            commands,
            filter: self.filter.clone(),
            rows,
            counted,
            notes,
        }
    }

    fn keep<T>(&mut self, r: Result<T, HostError>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.error.get_or_insert(e);
                None
            }
        }
    }

    /// Moves the filter `step` places along [`Top::filters`].
    fn cycle(&mut self, forward: bool) {
        let Some(t) = &self.top else { return };
        let all = t.filters();
        let i = all.iter().position(|f| *f == self.filter).unwrap_or(0);
        let n = all.len();
        self.filter = all[if forward {
            (i + 1) % n
        } else {
            (i + n - 1) % n
        }]
        .clone();
    }

    /// What [`Observer::tick`] does, at `now`: handles waiting keys, and
    /// redraws at the first tick, when `delay` has passed since the last
    /// refresh, and after a key.
    pub fn tick_at(&mut self, now: Instant, stats: &StreamStats) -> ControlFlow<()> {
        let mut redraw = !self.drawn && self.display.immediate();
        if self.error.is_none() {
            while let Some(Some(key)) = {
                let k = self.display.key();
                self.keep(k)
            } {
                match key {
                    Key::Quit => {
                        self.state = RunState::Stopped;
                        return ControlFlow::Break(());
                    }
                    Key::NextFilter => self.cycle(true),
                    Key::PrevFilter => self.cycle(false),
                    Key::Redraw => {}
                }
                redraw = true;
            }
        }
        let totals = Counters::of(stats);
        let since = now.saturating_duration_since(self.last.0);
        let due = since >= self.options.delay;
        if due {
            self.rates = Rates::between(&self.last.1, &totals, since.as_secs_f64());
            self.last = (now, totals);
        } else if !redraw {
            return ControlFlow::Continue(());
        }
        if self.error.is_none() {
            let frame = self.frame(now, totals);
            let r = self.display.draw(&frame);
            self.keep(r);
            self.drawn = true;
            if self.options.zero
                && due
                && let Some(t) = &mut self.top
            {
                t.zero();
            }
        }
        ControlFlow::Continue(())
    }
}

impl<D: Display> Observer for Watch<D> {
    fn begin(&mut self, image: Option<&Image>, programs: &BTreeMap<String, PathBuf>) {
        self.top = Some(Top::new(image, programs.clone()));
        let now = Instant::now();
        self.start = now;
        self.last = (now, Counters::default());
    }

    fn item(&mut self, item: &Item<'_>) {
        if matches!(item, Item::End(_)) {
            self.state = RunState::Ended;
        }
        if let Some(t) = &mut self.top {
            t.item(item);
        }
    }

    #[inline]
    fn sample(&mut self, s: &SampleParts<'_>) {
        if let Some(t) = &mut self.top {
            t.sample_parts(s);
        }
    }

    fn tick(&mut self, stats: &StreamStats) -> ControlFlow<()> {
        self.tick_at(Instant::now(), stats)
    }

    fn log(&mut self, line: &str) -> bool {
        self.display.log(line)
    }

    fn finish(&mut self, stats: &StreamStats) {
        let now = Instant::now();
        let totals = Counters::of(stats);
        let since = now.saturating_duration_since(self.last.0);
        if since > Duration::ZERO && since >= self.options.delay / 4 {
            self.rates = Rates::between(&self.last.1, &totals, since.as_secs_f64());
        } else if self.last.1 == Counters::default() {
            // No refresh yet (a short run, a capture read at once): the
            // run's average.
            let secs = now.saturating_duration_since(self.start).as_secs_f64();
            self.rates = Rates::between(&Counters::default(), &totals, secs);
        }
        let frame = self.frame(now, totals);
        let r = self.display.finish(&frame);
        self.keep(r);
    }

    fn user_stopped(&self) -> bool {
        self.stopped()
    }
}

#[cfg(test)]
mod tests;
