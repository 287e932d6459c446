//! `perch`: record a Perch appliance (QEMU, a serial line or a saved
//! capture), write perf.data that stock perf opens with symbols, and show
//! stats and flamegraphs.
#![forbid(unsafe_code)]

use std::fs::File;
use std::io::{BufWriter, IsTerminal, Read, Write};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use host_tool::convert::{ConvertOptions, Converter, hex};
use host_tool::error::{HostError, exit};
use host_tool::flamegraph::Folder;
use host_tool::image::Image;
use host_tool::input::{
    Flow, LogPrinter, Observer, PartsSink, Pump, lost_first_hello, tasks_named_in,
};
use host_tool::manifest::AppSpec;
use host_tool::model::Item;
use host_tool::output::{Discard, OwnedWrite, Pending, PerfOut};
use host_tool::pprof::PprofBuilder;
use host_tool::procs::{Ending, ProcessLog, Routed};
use host_tool::qemu::{Qemu, QemuConfig, describe_exit};
use host_tool::ready::{NetWatch, waited_forwards};
use host_tool::record_opts::{
    BootLine, DEFAULT_BAUD, Expect, MAX_FREQ_HZ, MIN_FREQ_HZ, RecordArgs, push_boot_args, seconds,
};
use host_tool::runtime::{Located, Origin};
use host_tool::synth::{SynthConfig, write_capture};
use host_tool::top::{Plain, Watch, WatchOptions};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sampler::wire::SampleParts;

const EXIT_CODES: &str = "Exit codes: 0 ok (also when stopped by Ctrl-C, or by q in perch top), 1 I/O failure, 2 usage, 3 not a usable Perch stream \
(garbage, wrong protocol version, no Hello, no samples to draw), 4 no runtime image found, or a bad or mismatched one, 5 QEMU or perf missing, \
6 the appliance failed or crashed, 7 the stream stopped before its End record or at a restart (output written), \
8 a program, data file or appliance manifest is unusable (nothing booted), \
9 a program was killed by a signal (output written). \
As `perf record -- PROGRAM` exits with its workload's status (perf 6.1: `perf record -- false` exits 1), \
`perch record -- PROGRAM` whose run completed exits with the program's own exit status when that is not 0 \
(output written; it may coincide with one of perch's codes, whose message then says what went wrong); \
a program killed by a signal gives 9 where perf dies by the same signal \
(a program's forked child killed by a signal is left to its parent, as under perf); \
with --appliance the programs' exit statuses do not change perch's.";

#[derive(Parser)]
#[command(name = "perch", version, about = "Profile a Perch appliance into perf.data", after_help = EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// What `perch convert` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    /// perf.data, for perf and hotspot.
    Perf,
    /// A gzipped pprof profile.proto.
    Pprof,
}

#[derive(Subcommand)]
enum Cmd {
    /// Boot the appliance under QEMU (or read a serial line or capture) and write perf.data.
    Record(Box<RecordArgs>),
    /// Boot and record like `record`, showing the hottest symbols live
    /// (full screen on a terminal, `q` stops; a plain table every
    /// --delay where stdout is not one); perf.data is written as by
    /// `record`.
    Top(Box<TopArgs>),
    /// Convert a saved capture to perf.data (or a pprof profile).
    Convert {
        /// The capture file (raw wire stream).
        capture: PathBuf,
        /// The appliance image the stream came from (symbols, build-id).
        #[arg(long)]
        image: Option<PathBuf>,
        /// The appliance manifest the run was packed from: names each
        /// program's host file, for its symbols.
        #[arg(long, value_name = "FILE.toml")]
        appliance: Option<PathBuf>,
        /// Output file (default: perf.data, or profile.pb.gz for pprof).
        #[arg(short = 'o', long)]
        output: Option<PathBuf>,
        /// What to write: perf.data, or the gzipped profile.proto that
        /// pprof, Pyroscope, Parca and Grafana read.
        #[arg(long, value_enum, default_value_t = Format::Perf)]
        format: Format,
        /// Add the image and the programs to perf's build-id cache so perf needs no --vmlinux.
        #[arg(long)]
        buildid_cache: bool,
    },
    /// Build a bootable GRUB ISO (BIOS and UEFI) of the runtime and the
    /// programs, for bare metal; record it with `perch record --serial DEV
    /// --appliance FILE.toml`.
    Image(ImageArgs),
    /// Samples per task and event, losses, throttling, bad frames, bytes per sample.
    Stat {
        /// A capture file.
        file: PathBuf,
    },
    /// Render a flamegraph SVG from a capture or a perf.data file.
    Flamegraph {
        /// A capture file, or a perf.data file (told apart by perf.data's
        /// magic, "PERFILE2").
        file: PathBuf,
        /// The appliance image (symbols).
        #[arg(long)]
        image: Option<PathBuf>,
        /// The appliance manifest the run was packed from: names each
        /// program's host file, for a capture's symbols (a perf.data names
        /// them itself).
        #[arg(long, value_name = "FILE.toml")]
        appliance: Option<PathBuf>,
        /// Keep only the samples of this process id (repeatable).
        #[arg(long)]
        pid: Vec<u32>,
        /// Keep only the samples of this process name (repeatable).
        #[arg(long)]
        comm: Vec<String>,
        /// Write the folded stacks (`stack count` lines, inferno's and
        /// flamegraph.pl's input) instead of the SVG.
        #[arg(long)]
        folded: bool,
        /// Output SVG.
        #[arg(short = 'o', long, default_value = "flamegraph.svg")]
        output: PathBuf,
    },
    /// Write the runtime image's function symbols as a kallsyms file, for
    /// `hotspot --kallsyms FILE perf.data` (hotspot resolves the runtime's
    /// samples only through one).
    Kallsyms {
        /// The appliance image (runtime ELF).
        #[arg(long)]
        image: PathBuf,
        /// Output file.
        #[arg(short = 'o', long, default_value = "perch.kallsyms")]
        output: PathBuf,
    },
    /// Write a synthetic capture (for benchmarks and trying the tools).
    Synth {
        /// Output capture file.
        #[arg(short = 'o', long)]
        output: PathBuf,
        /// Image whose task and runtime symbols the samples hit.
        #[arg(long)]
        image: Option<PathBuf>,
        /// Number of samples.
        #[arg(long, default_value_t = 10_000)]
        samples: u64,
        /// Lost samples reported halfway.
        #[arg(long, default_value_t = 0)]
        lost: u64,
        /// Leave out the End record (a truncated capture).
        #[arg(long)]
        no_end: bool,
    },
}

#[derive(clap::Args)]
struct TopArgs {
    /// Print the plain text table every --delay (as where stdout is not a
    /// terminal) instead of the full-screen view.
    #[arg(long)]
    stdio: bool,
    /// Seconds between refreshes.
    #[arg(short = 'd', long, default_value_t = 1.0)]
    delay: f64,
    /// Rows of the plain table (the full-screen view fills the screen).
    #[arg(short = 'E', long, default_value_t = 25)]
    entries: usize,
    /// Zero the counts at each refresh: each view shows the last interval
    /// only (by default the counts run from the start).
    #[arg(short = 'z', long)]
    zero: bool,
    #[command(flatten)]
    record: RecordArgs,
}

#[derive(clap::Args)]
struct ImageArgs {
    /// The runtime ELF (default: $PERCH_IMAGE, else the runtime shipped
    /// with perch).
    #[arg(long)]
    image: Option<PathBuf>,
    /// An appliance manifest (TOML, docs/programs.md).
    #[arg(long, value_name = "FILE.toml", conflicts_with = "command")]
    appliance: Option<PathBuf>,
    /// A data file for the program: HOST or HOST:GUEST. Repeatable.
    #[arg(long, value_name = "HOST[:GUEST]", requires = "command")]
    file: Vec<String>,
    /// Sampling frequency in Hz.
    #[arg(long, default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(i64::from(MIN_FREQ_HZ)..=i64::from(MAX_FREQ_HZ)))]
    freq: u32,
    /// A runtime command-line key, after `console=wire freq=HZ`
    /// (repeatable: `--boot-arg duration=5000`).
    #[arg(long, value_name = "KEY=VALUE")]
    boot_arg: Vec<String>,
    /// Output ISO.
    #[arg(short = 'o', long)]
    output: PathBuf,
    /// The program and its arguments.
    #[arg(last = true, value_name = "PROGRAM [ARGS]")]
    command: Vec<String>,
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// `perch --version`: the version and the runtime shipped with this perch
/// (its path and build-id), or where perch looked for it.
fn version_text() -> String {
    let v = env!("CARGO_PKG_VERSION");
    match host_tool::runtime::shipped() {
        Some(p) => format!(
            "{v}\nruntime: {} (build-id {})",
            p.display(),
            host_tool::runtime::build_id_hex(&p)
                .as_deref()
                .unwrap_or("none")
        ),
        None => format!(
            "{v}\nruntime: none shipped with this perch ({}; `{}` installs it)",
            host_tool::runtime::candidates()
                .iter()
                .map(|c| c.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            host_tool::runtime::INSTALL_COMMAND
        ),
    }
}

fn main() -> ExitCode {
    let mut command = Cli::command();
    if std::env::args_os()
        .skip(1)
        .any(|a| a == "--version" || a == "-V")
    {
        command = command.version(&*Box::leak(version_text().into_boxed_str()));
    }
    let parsed = command
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m));
    let cli = match parsed {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { exit::USAGE as u8 } else { 0 });
        }
    };
    let r = match cli.cmd {
        Cmd::Record(a) => record(*a, None),
        Cmd::Top(a) => top(*a),
        Cmd::Convert {
            capture,
            image,
            appliance,
            output,
            format,
            buildid_cache,
        } => convert(
            &capture,
            image.as_deref(),
            appliance.as_deref(),
            output.as_deref(),
            format,
            buildid_cache,
        ),
        Cmd::Image(a) => image(&a),
        Cmd::Stat { file } => stat(&file),
        Cmd::Flamegraph {
            file,
            image,
            appliance,
            pid,
            comm,
            folded,
            output,
        } => flamegraph(
            &file,
            image.as_deref(),
            appliance.as_deref(),
            host_tool::flamegraph::Filter {
                pids: pid,
                comms: comm,
            },
            folded,
            &output,
        ),
        Cmd::Kallsyms { image, output } => kallsyms(&image, &output),
        Cmd::Synth {
            output,
            image,
            samples,
            lost,
            no_end,
        } => synth(&output, image.as_deref(), samples, lost, !no_end),
    };
    match r {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => {
            eprintln!("perch: error: {e}");
            ExitCode::from(e.exit_code() as u8)
        }
    }
}

fn open_image(path: Option<&Path>) -> Result<(Option<Image>, Option<Vec<u8>>), HostError> {
    let Some(p) = path else {
        return Ok((None, None));
    };
    let bytes = std::fs::read(p).map_err(|source| host_tool::image::ImageError::Io {
        path: p.to_owned(),
        source,
    })?;
    let abs = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned());
    let image = Image::parse(&bytes, abs)?;
    Ok((Some(image), Some(bytes)))
}

/// The runtime to boot (see `host_tool::runtime`), with a warning when
/// the one given is not the runtime shipped with perch.
fn locate_runtime(flag: Option<&Path>) -> Result<Located, HostError> {
    let located = host_tool::runtime::locate(flag).map_err(HostError::NoImage)?;
    if located.origin != Origin::Shipped
        && let Some(shipped) = host_tool::runtime::shipped()
        && let Some(w) = host_tool::runtime::stale_warning(
            &located,
            host_tool::runtime::build_id_hex(&located.path).as_deref(),
            &shipped,
            host_tool::runtime::build_id_hex(&shipped).as_deref(),
        )
    {
        eprintln!("perch: warning: {w}");
    }
    Ok(located)
}

/// The error for an image that would not open, against the capture it was
/// given for: when the image is unusable (no runtime text, no symbols) and
/// the capture, a regular file, was made by another build, the mismatch is
/// the real problem and is what gets reported.
fn image_error_for(e: HostError, capture: &Path) -> HostError {
    let HostError::Image(ie) = &e else { return e };
    let Some(image_id) = ie.build_id() else {
        return e;
    };
    if !std::fs::metadata(capture).is_ok_and(|m| m.is_file()) {
        return e;
    }
    let Ok(f) = File::open(capture) else { return e };
    // The Hello is the first record: the first 64 KiB are plenty.
    let mut pump = Pump::new();
    if pump.read_all(f.take(1 << 16), &mut |_| Ok(())).is_err() {
        return e;
    }
    match &pump.stats.hello {
        Some(h) if !h.build_id.is_empty() && h.build_id != image_id => {
            host_tool::convert::ConvertError::WrongImage {
                image: ie.path().display().to_string(),
                image_id: hex(image_id),
                stream_id: hex(&h.build_id),
            }
            .into()
        }
        _ => e,
    }
}

/// Opens an input: a capture file, a device or a pipe, never a directory.
fn open_file(path: &Path) -> Result<File, HostError> {
    let f =
        File::open(path).map_err(|e| HostError::io(format!("opening {}", path.display()), e))?;
    if f.metadata().is_ok_and(|m| m.is_dir()) {
        return Err(HostError::io(
            format!("opening {}", path.display()),
            std::io::Error::new(
                std::io::ErrorKind::IsADirectory,
                "it is a directory, not a capture file",
            ),
        ));
    }
    Ok(f)
}

/// What a path names, to tell whether two paths are one file: the device
/// and inode of an existing file (through symlinks and hard links), or the
/// absolute path of one still to be created.
#[derive(Debug, PartialEq, Eq)]
enum FileId {
    Node(u64, u64),
    New(PathBuf),
}

fn file_id(path: &Path) -> FileId {
    use std::os::unix::fs::MetadataExt;
    if let Ok(m) = std::fs::metadata(path) {
        return FileId::Node(m.dev(), m.ino());
    }
    let parent = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let dir = std::fs::canonicalize(parent).unwrap_or_else(|_| parent.to_owned());
    FileId::New(dir.join(path.file_name().unwrap_or_default()))
}

/// Refuses a run in which an output is one of the inputs, or two outputs
/// are one file, before anything is opened for writing. Each entry is
/// (what it is, its path); absent ones are skipped.
fn refuse_same_files(
    outputs: &[(&str, Option<&Path>)],
    inputs: &[(&str, Option<&Path>)],
) -> Result<(), HostError> {
    let outputs: Vec<(&str, &Path, FileId)> = outputs
        .iter()
        .filter_map(|&(what, p)| p.map(|p| (what, p, file_id(p))))
        .collect();
    for (i, (what, p, id)) in outputs.iter().enumerate() {
        for &(in_what, q) in inputs {
            if let Some(q) = q
                && matches!(id, FileId::Node(..))
                && file_id(q) == *id
            {
                return Err(HostError::Usage(format!(
                    "{what} {} is also the {in_what} {} (the same file): perch would \
                     overwrite its input; choose another output",
                    p.display(),
                    q.display()
                )));
            }
        }
        for (other_what, q, other) in &outputs[i + 1..] {
            if other == id {
                return Err(HostError::Usage(format!(
                    "{what} {} is also the {other_what} {} (the same file): one output \
                     would overwrite the other; choose two paths",
                    p.display(),
                    q.display()
                )));
            }
        }
    }
    Ok(())
}

/// Starts an output: a temporary file beside `path`, which becomes `path`
/// only when the run succeeds.
fn create_output(path: &Path) -> Result<Pending, HostError> {
    Pending::new(path).map_err(|e| HostError::io(format!("creating {}", path.display()), e))
}

/// Puts a finished output in place.
fn commit_output(p: Pending) -> Result<(), HostError> {
    let target = p.target().to_owned();
    p.commit()
        .map_err(|e| HostError::io(format!("writing {}", target.display()), e))
}

/// Why reading stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    End,
    Restart,
    Eof,
    Interrupted,
    TimeLimit,
    /// The observer stopped the run (`q` in `perch top`).
    User,
}

/// The live progress line on stderr when it is a terminal and the run is
/// not quiet: samples, their rate, losses and the wire's bytes per second.
struct Progress {
    bar: Option<ProgressBar>,
    start: Instant,
    last: Instant,
}

impl Progress {
    fn new(quiet: bool) -> Self {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let b = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            b.set_style(
                ProgressStyle::with_template("{spinner} {elapsed} {msg}").expect("static template"),
            );
            b
        });
        Progress {
            bar,
            start: Instant::now(),
            last: Instant::now(),
        }
    }

    fn update(&mut self, pump: &Pump, force: bool) {
        let Some(bar) = &self.bar else { return };
        if !force && self.last.elapsed() < Duration::from_millis(100) {
            return;
        }
        self.last = Instant::now();
        let s = &pump.stats;
        let secs = self.start.elapsed().as_secs_f64().max(1e-3);
        bar.set_message(progress_line(
            s.samples,
            s.lost,
            s.bytes,
            s.decoder.bad_frames,
            secs,
        ));
        bar.tick();
    }

    fn println(&self, line: &str) {
        match &self.bar {
            Some(b) => b.suspend(|| eprintln!("{line}")),
            None => eprintln!("{line}"),
        }
    }

    fn suspend(&self, f: impl FnOnce()) {
        match &self.bar {
            Some(b) => b.suspend(f),
            None => f(),
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// The progress line's text: samples, their rate, losses, the wire's
/// bytes per second and bad frames over `secs` seconds.
fn progress_line(samples: u64, lost: u64, bytes: u64, bad_frames: u64, secs: f64) -> String {
    let secs = secs.max(1e-3);
    format!(
        "{samples} samples ({:.0}/s), {lost} lost, {}/s on the wire, {bad_frames} bad frames",
        samples as f64 / secs,
        indicatif::HumanBytes((bytes as f64 / secs) as u64),
    )
}

/// The converter, with target logs shown on the way: the programs' output
/// on the host's stdout and stderr, the runtime's lines on stderr.
struct ConvertSink<'a, 'w, W: OwnedWrite> {
    conv: &'a mut Converter<W>,
    /// The pprof profile, fed the same items and samples.
    pprof: Option<&'a mut PprofBuilder>,
    logs: &'a LogPrinter,
    progress: &'a mut Progress,
    procs: Option<&'a mut ProcessLog>,
    /// What the Hello must show (`perch record`'s options).
    expect: &'a Expect,
    /// No runtime log lines (`-q`).
    quiet: bool,
    /// Sees every item after the converter, and takes the log lines it
    /// wants (while it owns the terminal).
    watch: Option<&'a mut (dyn Observer + 'w)>,
    /// Sees the runtime's log lines for the one saying the network is up.
    net: Option<&'a mut NetWatch>,
}

impl<W: OwnedWrite> PartsSink for ConvertSink<'_, '_, W> {
    fn item(&mut self, item: &Item<'_>) -> Result<(), HostError> {
        if let Item::Hello(h) = item {
            self.expect.check(h)?;
        }
        let routed = match (&mut self.procs, item) {
            (Some(p), Item::Log(text)) => p.route(text),
            _ => Routed::Log,
        };
        let taken = self.watch.as_deref_mut().is_some_and(|w| match routed {
            Routed::Stdout(line) | Routed::Stderr(line) => w.log(line),
            Routed::Log => self.quiet || self.logs.render(item).is_none_or(|line| w.log(&line)),
        });
        match routed {
            _ if taken => {}
            Routed::Stdout(line) => self.progress.suspend(|| {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{line}");
                let _ = out.flush();
            }),
            Routed::Stderr(line) => self.progress.suspend(|| eprintln!("{line}")),
            Routed::Log if self.quiet => {}
            Routed::Log => {
                if let Some(line) = self.logs.render(item) {
                    self.progress.println(&line);
                }
            }
        }
        if let (Some(net), Routed::Log, Item::Log(text)) = (self.net.as_deref_mut(), &routed, item)
        {
            for line in net.log(text) {
                self.progress.println(&line);
            }
        }
        if let Some(p) = self.pprof.as_mut() {
            p.push(item);
        }
        self.conv.push(item).map_err(HostError::from)?;
        if let Some(w) = self.watch.as_deref_mut() {
            w.item(item);
        }
        Ok(())
    }

    #[inline]
    fn sample(&mut self, s: &SampleParts<'_>) -> Result<(), HostError> {
        if let Some(p) = self.pprof.as_mut() {
            p.push_parts(s);
        }
        self.conv.push_parts(s).map_err(HostError::from)?;
        if let Some(w) = self.watch.as_deref_mut() {
            w.sample(s);
        }
        Ok(())
    }
}

/// Where `run` reads the stream from.
enum Source {
    /// A live stream (QEMU, a serial port, `record --input`), read as it
    /// comes on a thread of its own, so that the deadline and Ctrl-C are
    /// honoured even while a read blocks (a silent pipe).
    Live(Box<dyn Read + Send>),
    /// A capture file, which a second thread reads and frames ahead (read
    /// to its end: `run`'s deadline and capture copy are for live streams).
    File(File),
}

/// A live source read on a thread of its own, chunk by chunk.
struct LiveReader {
    chunks: std::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>,
    stop: std::sync::Arc<AtomicBool>,
}

impl LiveReader {
    /// Starts reading `src`. The thread ends at EOF, on an error, or after
    /// [`stop`](Self::stop) once its current read returns; one blocked in a
    /// read that never returns ends with the process.
    fn start(mut src: Box<dyn Read + Send>) -> Result<LiveReader, HostError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(16);
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let stopped = std::sync::Arc::clone(&stop);
        std::thread::Builder::new()
            .name("stream reader".into())
            .spawn(move || {
                let mut buf = vec![0u8; 1 << 16];
                while !stopped.load(Ordering::Relaxed) {
                    let msg = match src.read(&mut buf) {
                        Ok(n) => Ok(buf[..n].to_vec()),
                        Err(e)
                            if matches!(
                                e.kind(),
                                std::io::ErrorKind::Interrupted
                                    | std::io::ErrorKind::TimedOut
                                    | std::io::ErrorKind::WouldBlock
                            ) =>
                        {
                            continue;
                        }
                        Err(e) => Err(e),
                    };
                    let last = !matches!(&msg, Ok(c) if !c.is_empty());
                    if tx.send(msg).is_err() || last {
                        return;
                    }
                }
            })
            .map_err(|e| HostError::io("starting the stream reader", e))?;
        Ok(LiveReader { chunks: rx, stop })
    }

    /// The next chunk (empty at EOF), or None when none came within `wait`.
    fn next(&self, wait: Duration) -> Option<std::io::Result<Vec<u8>>> {
        match self.chunks.recv_timeout(wait) {
            Ok(m) => Some(m),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => None,
            // The thread ended without a word: treat it as the end.
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Some(Ok(Vec::new())),
        }
    }

    /// Asks the thread to end.
    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// What a run knows of the programs it profiles.
#[derive(Default)]
struct RunPrograms {
    /// The host file of each program, by archive path.
    files: std::collections::BTreeMap<String, PathBuf>,
    /// The processes' names, when perch knows them (it packed them or read
    /// the manifest): their output is routed and their ends checked.
    log: Option<ProcessLog>,
    /// What the Hello must show for `perch record`'s options.
    expect: Expect,
    /// `-q`: no progress, no runtime log lines, no summary.
    quiet: bool,
    /// The run is one program given after `--` (the workload, as in
    /// `perf record -- PROGRAM`): perch exits with its exit status.
    workload: bool,
    /// `--net`: the forwards to name once the appliance has its address,
    /// and the `--wait-for` probes.
    net: Option<NetWatch>,
}

impl RunPrograms {
    fn of(spec: Option<&AppSpec>) -> RunPrograms {
        match spec {
            Some(s) => RunPrograms {
                files: s.program_files(),
                log: Some(ProcessLog::new(s.names())),
                ..RunPrograms::default()
            },
            None => RunPrograms::default(),
        }
    }
}

/// What a run writes besides (or instead of) perf.data.
#[derive(Clone, Debug)]
struct Formats {
    /// Write perf.data to the run's output (`false`: the conversion runs,
    /// with its checks, but its perf.data is dropped).
    perf_data: bool,
    /// Also write a pprof profile here.
    pprof: Option<PathBuf>,
}

impl Formats {
    /// perf.data alone.
    const PERF: Formats = Formats {
        perf_data: true,
        pprof: None,
    };
}

/// When a capture file was last written (a recording's end), or now for a
/// live stream, in ns since the epoch.
fn ended_nanos(src: &Source) -> i64 {
    let t = match src {
        Source::File(f) => f
            .metadata()
            .and_then(|m| m.modified())
            .unwrap_or_else(|_| std::time::SystemTime::now()),
        Source::Live(_) => std::time::SystemTime::now(),
    };
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// Reads `src` into the converter until End, EOF, Ctrl-C, the deadline or
/// the observer's stop; `watch` sees the run as it goes.
///
/// `seed` is the Hello that describes a capture file whose own first Hello
/// was lost ([`lost_first_hello`]); for a [`Source::File`] `run` looks for
/// it itself.
#[allow(clippy::too_many_arguments)]
fn run<'w>(
    mut src: Source,
    seed: Option<sampler::wire::Hello>,
    image: Option<Image>,
    elf: Option<&[u8]>,
    output: &Path,
    save: Option<&Path>,
    deadline: Option<Instant>,
    buildid_cache: bool,
    mut programs: RunPrograms,
    formats: &Formats,
    mut watch: Option<&mut (dyn Observer + 'w)>,
) -> Result<i32, HostError> {
    // Whether perf is there is only reported at the end; asking it (a
    // process start) overlaps the conversion.
    let perf_check = formats.perf_data.then(|| std::thread::spawn(check_perf));
    let pending = formats
        .perf_data
        .then(|| create_output(output))
        .transpose()?;
    let out = match &pending {
        Some(p) => p
            .file()
            .and_then(host_tool::output::BackgroundFile::new)
            .map(PerfOut::File)
            .map_err(|e| HostError::io(format!("creating {}", output.display()), e))?,
        None => PerfOut::Discard(Discard::default()),
    };
    let pprof_pending = formats.pprof.as_deref().map(create_output).transpose()?;
    let ended = ended_nanos(&src);
    let mut seed = seed.or_else(|| match &mut src {
        Source::File(f) => lost_first_hello(f),
        Source::Live(_) => None,
    });
    let save_pending = save.map(create_output).transpose()?;
    let mut save = match &save_pending {
        Some(p) => Some(BufWriter::new(p.file().map_err(|e| {
            HostError::io(format!("creating {}", p.target().display()), e)
        })?)),
        None => None,
    };
    let image_path = image.as_ref().map(|i| i.path.clone());
    let image_has_id = image.as_ref().is_some_and(|i| i.build_id.is_some());
    let cmdline: Vec<String> = std::env::args().collect();
    let program_files = programs.files.clone();
    if let Some(w) = watch.as_deref_mut() {
        w.begin(image.as_ref(), &programs.files);
    }
    // The runtime's Breakpad symbols (for samply), which `cache_build_ids`
    // adds to the build-id cache once the stream is converted.
    let kernel_symbols = match (&image, elf) {
        (Some(img), Some(bytes)) if buildid_cache => host_tool::breakpad::symbol_file(img, bytes),
        _ => None,
    };
    let kernel_file = match (&image, &kernel_symbols) {
        (Some(img), Some(_)) => host_tool::buildid_cache::cache_dir().and_then(|dir| {
            img.build_id
                .as_deref()
                .and_then(|id| host_tool::buildid_cache::kernel_symbols_path(&dir, &img.path, id))
        }),
        _ => None,
    };
    let options = ConvertOptions {
        image,
        cmdline,
        programs: programs.files,
        kernel_file,
    };
    let mut pprof = pprof_pending
        .as_ref()
        .map(|_| PprofBuilder::new(&options, ended));
    let mut conv = Converter::new(out, options);
    // A capture file can be read ahead: a task whose own Task record was
    // lost is named by a later repetition of it.
    if let Source::File(f) = &src
        && let Ok(f) = f.try_clone()
    {
        conv.set_lookahead(Box::new(move || tasks_named_in(&f)));
    }
    let logs = LogPrinter::new(elf);
    let mut pump = Pump::new();
    let quiet = programs.quiet;
    // The summary and notes; `-q` keeps only errors and the lines that
    // explain a failing exit code.
    macro_rules! say {
        ($($t:tt)*) => {
            if !quiet {
                eprintln!($($t)*)
            }
        };
    }
    // No progress line under a live view (it owns the terminal).
    let mut progress = Progress::new(quiet || watch.is_some());
    let started = Instant::now();
    let stop = match src {
        Source::File(file) => {
            // A file can be read ahead: frame it on a second thread.
            let mut sink = ConvertSink {
                conv: &mut conv,
                logs: &logs,
                progress: &mut progress,
                procs: programs.log.as_mut(),
                expect: &programs.expect,
                quiet,
                watch: watch.as_deref_mut(),
                pprof: pprof.as_mut(),
                net: programs.net.as_mut(),
            };
            if let Some(h) = seed.take() {
                sink.conv.hello_found_later();
                pump.seed_hello(&h, &mut sink)?;
            }
            let mut user = false;
            let flow = pump.read_all_framed(file, &mut sink, |pump, sink| {
                sink.progress.update(pump, false);
                user = sink
                    .watch
                    .as_deref_mut()
                    .is_some_and(|w| w.tick(&pump.stats).is_break());
                if INTERRUPTED.load(Ordering::Relaxed) || user {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })?;
            match flow {
                Flow::Done => Stop::End,
                Flow::Restart => Stop::Restart,
                Flow::Continue if user => Stop::User,
                Flow::Continue if INTERRUPTED.load(Ordering::Relaxed) => Stop::Interrupted,
                Flow::Continue => Stop::Eof,
            }
        }
        Source::Live(src) => {
            let reader = LiveReader::start(src)?;
            let stop = loop {
                if INTERRUPTED.load(Ordering::Relaxed) {
                    break Stop::Interrupted;
                }
                if let Some(w) = watch.as_deref_mut()
                    && w.tick(&pump.stats).is_break()
                {
                    break Stop::User;
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    break Stop::TimeLimit;
                }
                let chunk = match reader.next(Duration::from_millis(100)) {
                    Some(Ok(c)) if c.is_empty() => break Stop::Eof,
                    Some(Ok(c)) => c,
                    Some(Err(e)) => return Err(HostError::io("reading the stream", e)),
                    None => {
                        progress.update(&pump, false);
                        continue;
                    }
                };
                if let Some(s) = save.as_mut() {
                    s.write_all(&chunk)
                        .map_err(|e| HostError::io("saving the capture", e))?;
                }
                let mut sink = ConvertSink {
                    conv: &mut conv,
                    logs: &logs,
                    progress: &mut progress,
                    procs: programs.log.as_mut(),
                    expect: &programs.expect,
                    quiet,
                    watch: watch.as_deref_mut(),
                    pprof: pprof.as_mut(),
                    net: programs.net.as_mut(),
                };
                if let Some(h) = seed.take() {
                    sink.conv.hello_found_later();
                    pump.seed_hello(&h, &mut sink)?;
                }
                let flow = pump.feed_parts(&chunk, &mut sink)?;
                progress.update(&pump, false);
                match flow {
                    Flow::Done => break Stop::End,
                    Flow::Restart => break Stop::Restart,
                    Flow::Continue => {}
                }
            };
            reader.stop();
            stop
        }
    };
    progress.update(&pump, true);
    progress.finish();
    if let Some(w) = watch {
        w.finish(&pump.stats);
    }
    if let Some(mut s) = save {
        s.flush()
            .map_err(|e| HostError::io("saving the capture", e))?;
    }
    pump.check_recognised()?;
    let (out, summary) = conv.finish()?;
    out.finish()
        .map_err(|e| HostError::io(format!("writing {}", output.display()), e))?;
    if let Some(p) = pending {
        commit_output(p)?;
    }
    if let Some(p) = save_pending {
        commit_output(p)?;
    }
    let w = summary.written;
    let d = pump.stats.decoder;
    let secs = started.elapsed().as_secs_f64();
    say!(
        "perch: {} in {secs:.1} s",
        progress_line(
            pump.stats.samples,
            pump.stats.lost,
            pump.stats.bytes,
            d.bad_frames,
            secs
        )
    );
    say!(
        "perch: {}: {} samples, {} lost ({} on the target, {} on the wire), {} bad frames, {:.1} bytes/sample on the wire",
        if formats.perf_data {
            format!("wrote {}", output.display())
        } else {
            "read the stream".to_owned()
        },
        w.samples,
        w.lost_samples,
        pump.stats.lost,
        summary.wire_lost,
        d.bad_frames,
        if w.samples > 0 {
            pump.stats.bytes as f64 / w.samples as f64
        } else {
            0.0
        }
    );
    if let Some(h) = &pump.stats.hello
        && h.events.len() > 1
    {
        let st = &pump.stats;
        let each: Vec<String> = h
            .events
            .iter()
            .map(|e| {
                format!(
                    "{} {} samples + {} lost",
                    e.perf_name(h.source),
                    st.by_event.get(&e.id).copied().unwrap_or(0),
                    st.lost_by_event.get(&e.id).copied().unwrap_or(0)
                )
            })
            .collect();
        say!("perch: per event: {}", each.join(", "));
    }
    // After the perf.data line, which scripts read first.
    if let (Some(b), Some(p)) = (pprof, pprof_pending) {
        write_pprof(b, p)?;
    }
    if let Some(h) = &pump.stats.hello {
        say!("perch: transport: {}", h.transport);
    }
    if let Some(e) = &summary.end {
        say!(
            "perch: target counters: taken {} = delivered {} + lost {}; the stream holds {} samples + {} lost",
            e.taken,
            e.delivered,
            e.lost,
            w.samples,
            w.lost_samples
        );
        if !e.unknown_syscalls.is_empty() {
            say!(
                "perch: the programs made unknown system calls (ENOSYS): {}",
                e.unknown_syscalls
            );
        }
    }
    for warn in &summary.warnings {
        say!("perch: warning: {warn}");
    }
    if stop == Stop::End && pump.stats.after_end > 0 {
        say!(
            "perch: warning: {} records after the End record were ignored (a second capture appended?)",
            pump.stats.after_end
        );
    }
    if let Some(check) = perf_check
        && let Err(e) = check.join().unwrap_or_else(|_| check_perf())
    {
        say!("perch: {e}; `perch stat` and `perch flamegraph` work without it");
    }
    let cached = if buildid_cache {
        cache_build_ids(
            image_path.as_deref(),
            elf,
            kernel_symbols.as_deref(),
            &program_files,
            quiet,
        )
    } else {
        false
    };
    match &image_path {
        _ if !formats.perf_data => {}
        Some(_) if cached => say!(
            "perch: {}",
            host_tool::buildid_cache::open_hint(output, None)
        ),
        Some(p) => {
            if !image_has_id {
                say!(
                    "perch: warning: {} has no build-id, so the build-id cache cannot hold it",
                    p.display()
                );
            }
            say!(
                "perch: {}",
                host_tool::buildid_cache::open_hint(output, Some(p))
            )
        }
        None => say!("perch: no --image given: perf cannot symbolise this file"),
    }
    let crashed = match &programs.log {
        Some(log) => report_ends(log, quiet),
        None => false,
    };
    if crashed && matches!(stop, Stop::End | Stop::Eof) && summary.end.is_some() {
        return Ok(exit::PROGRAM_CRASHED);
    }
    // As `perf record -- PROGRAM` does: a completed run exits with the
    // workload's exit status (the low 8 bits, as the shell sees it).
    if programs.workload
        && matches!(stop, Stop::End | Stop::Eof)
        && summary.end.is_some()
        && let Some(status) = programs.log.as_ref().and_then(workload_status)
    {
        return Ok(status);
    }
    Ok(match stop {
        Stop::End => exit::OK,
        Stop::Restart => {
            eprintln!(
                "perch: the appliance restarted (a second Hello before End): stopped there; \
                 the file holds the first run, convert the rest as a capture of its own"
            );
            exit::TRUNCATED
        }
        Stop::Interrupted => {
            say!("perch: stopped by Ctrl-C");
            exit::OK
        }
        Stop::User => {
            say!(
                "perch: stopped by the user (q) before the appliance sent End: {} holds what arrived",
                output.display()
            );
            exit::OK
        }
        Stop::TimeLimit => {
            eprintln!("perch: stopped at the time limit before the appliance sent End");
            exit::TRUNCATED
        }
        Stop::Eof if summary.end.is_some() => exit::OK,
        // Ctrl-C also reaches QEMU, which closes the stream first.
        Stop::Eof if INTERRUPTED.load(Ordering::Relaxed) => {
            say!("perch: stopped by Ctrl-C");
            exit::OK
        }
        Stop::Eof => {
            eprintln!(
                "perch: the stream ended before its End record (truncated capture or the appliance stopped)"
            );
            exit::TRUNCATED
        }
    })
}

/// Writes the pprof profile `b` built into `p` and puts it in place.
fn write_pprof(b: PprofBuilder, p: Pending) -> Result<(), HostError> {
    let target = p.target().to_owned();
    let (profile, summary) = b.finish().map_err(|e| {
        HostError::io(
            format!("writing {}", target.display()),
            std::io::Error::other(e),
        )
    })?;
    let f = p
        .file()
        .map_err(|e| HostError::io(format!("creating {}", target.display()), e))?;
    host_tool::pprof::write_gz(&profile, BufWriter::new(f))
        .map_err(|e| HostError::io(format!("writing {}", target.display()), e))?;
    commit_output(p)?;
    eprintln!(
        "perch: wrote {}: pprof profile of {} samples ({} stacks, {} locations, {} mappings)",
        target.display(),
        summary.samples,
        summary.stacks,
        summary.locations,
        summary.mappings
    );
    for problem in &summary.problems {
        eprintln!("perch: warning: pprof: {problem}: its frames are named by address");
    }
    Ok(())
}

/// Adds the runtime image (as the kernel too) and every program with a
/// build-id to perf's build-id cache, so perf finds their symbols with no
/// flags. Says what it did; returns whether the runtime image is cached.
fn cache_build_ids(
    image: Option<&Path>,
    elf: Option<&[u8]>,
    kernel_symbols: Option<&str>,
    programs: &std::collections::BTreeMap<String, PathBuf>,
    quiet: bool,
) -> bool {
    use host_tool::buildid_cache::{Added, add, add_kernel_symbols, cache_dir};
    let Some(dir) = cache_dir() else {
        eprintln!(
            "perch: warning: neither PERF_BUILDID_DIR nor HOME is set: nothing added to perf's build-id cache"
        );
        return false;
    };
    let mut image_cached = false;
    let mut files: Vec<(PathBuf, Vec<u8>, bool)> = Vec::new();
    if let (Some(p), Some(bytes)) = (image, elf) {
        files.push((p.to_owned(), bytes.to_vec(), true));
    }
    for host in programs.values() {
        match std::fs::read(host) {
            Ok(b) => files.push((host.clone(), b, false)),
            Err(e) => eprintln!(
                "perch: warning: {} not added to the build-id cache: {e}",
                host.display()
            ),
        }
    }
    let mut added = Vec::new();
    for (path, bytes, kernel) in &files {
        let Some(id) = kcore::elf::build_id(bytes) else {
            if !kernel && !quiet {
                eprintln!(
                    "perch: note: {} has no build-id note (link with -Wl,--build-id to cache it): \
                     perf opens it by its path",
                    path.display()
                );
            }
            continue;
        };
        match add(&dir, path, bytes, id, *kernel) {
            Ok(a) => {
                image_cached |= *kernel;
                if *kernel
                    && let Some(text) = kernel_symbols
                    && let Err(e) = add_kernel_symbols(&dir, path, id, text)
                {
                    eprintln!(
                        "perch: warning: adding the runtime's symbols for samply to the build-id cache {}: {e}",
                        dir.display()
                    );
                }
                if matches!(a, Added::New(_)) {
                    added.push(path.display().to_string());
                }
            }
            Err(e) => eprintln!(
                "perch: warning: adding {} to the build-id cache {}: {e}",
                path.display(),
                dir.display()
            ),
        }
    }
    if !added.is_empty() && !quiet {
        eprintln!(
            "perch: added {} to perf's build-id cache ({})",
            added.join(", "),
            dir.display()
        );
    }
    image_cached
}

/// Reports how the programs ended (`quiet`: only the crashes); returns
/// whether one that perch started was killed by a signal.
fn report_ends(log: &ProcessLog, quiet: bool) -> bool {
    for e in &log.ends {
        match &e.ending {
            Ending::Exited(_) if quiet => {}
            Ending::Exited(code) => eprintln!(
                "perch: {} (pid {}) exited with status {code}",
                e.name, e.pid
            ),
            Ending::Killed { .. } if quiet && !e.started => {}
            Ending::Killed { signal, reason } => eprintln!(
                "perch: {} (pid {}) {}killed by {signal}{}{reason}",
                e.name,
                e.pid,
                if e.started { "crashed: " } else { "" },
                if reason.is_empty() { "" } else { ": " }
            ),
        }
    }
    log.crashed().next().is_some()
}

/// The exit status of the workload (the first process, pid 1) when it
/// exited with a non-zero one.
fn workload_status(log: &ProcessLog) -> Option<i32> {
    log.ends
        .iter()
        .find(|e| e.pid == 1)
        .and_then(|e| match e.ending {
            Ending::Exited(s) if s & 0xff != 0 => Some((s & 0xff) as i32),
            _ => None,
        })
}

/// Checks that `perf` can be run, to open what perch wrote.
fn check_perf() -> Result<(), HostError> {
    let missing = |reason: String| HostError::MissingTool {
        tool: "perf".into(),
        reason,
        install: "apt-get install linux-perf".into(),
    };
    match std::process::Command::new("perf")
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .output()
    {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(missing(format!(
            "`perf --version` exited with {}",
            o.status
        ))),
        Err(e) => Err(missing(e.to_string())),
    }
}

/// `perch top`: `record` with a live view on the terminal (or a plain
/// table every refresh where stdout is not one).
fn top(a: TopArgs) -> Result<i32, HostError> {
    let options = WatchOptions {
        delay: seconds("--delay", a.delay)?,
        zero: a.zero,
    };
    if a.stdio || !std::io::stdout().is_terminal() {
        let mut w = Watch::new(Plain::new(std::io::stdout(), a.entries), options);
        let code = record(a.record, Some(&mut w))?;
        view_error(w.take_error());
        Ok(code)
    } else {
        let mut w = Watch::new(host_tool::top::tui::Tui::new(a.entries), options);
        let code = record(a.record, Some(&mut w));
        // The terminal is back before anything is said about the run.
        let err = w.take_error();
        drop(w);
        view_error(err);
        code
    }
}

/// Reports a view that failed (the run went on into perf.data).
fn view_error(e: Option<HostError>) {
    if let Some(e) = e {
        eprintln!("perch: warning: the live view stopped: {e}");
    }
}

/// The `[net]` of an appliance manifest under `perch record`: a network
/// (as `--net`) with its `net=` key, unless the command line gives one,
/// and its forwards beside those of `--forward` (one the command line
/// gives too is taken once). `enabled = false` leaves the command line's
/// choice alone.
fn apply_manifest_net(a: &mut RecordArgs, net: Option<host_tool::manifest::NetSpec>) {
    let Some(net) = net.filter(|n| n.enabled) else {
        return;
    };
    a.net = true;
    if !a.boot_arg.iter().any(|b| b.starts_with("net=")) {
        a.boot_arg.insert(0, net.boot_arg());
    }
    for f in net.forwards {
        if !a.forward.contains(&f) {
            a.forward.push(f);
        }
    }
}

/// `perch record`; `watch` (perch top) sees the run as it goes.
fn record(mut a: RecordArgs, mut watch: Option<&mut dyn Observer>) -> Result<i32, HostError> {
    refuse_same_files(
        &[
            ("-o", Some(&a.output)),
            ("--save-capture", a.save_capture.as_deref()),
            ("--pprof", a.pprof.as_deref()),
        ],
        &[
            ("--input", a.input.as_deref()),
            ("--image", a.image.as_deref()),
        ],
    )?;
    // clap's `requires` does not hold --baud to --serial once --serial's
    // own conflicts are in play: checked here, so it is never ignored.
    if a.baud.is_some() && a.serial.is_none() {
        return Err(HostError::Usage(
            "--baud sets the rate of the --serial line: without --serial DEVICE there is no \
             line to set (QEMU's stream has no baud; --line-baud paces it like one)"
                .into(),
        ));
    }
    let boots = a.input.is_none() && a.serial.is_none();
    if boots {
        let net = a.appliance.as_deref().and_then(AppSpec::net_of_manifest);
        apply_manifest_net(&mut a, net);
    }
    // The options first, then the programs: a combination the target
    // cannot do, or a bad program, is an error before anything boots.
    let boot_line = if boots {
        Some(a.boot_line(a.appliance.is_some() || !a.command.is_empty())?)
    } else {
        None
    };
    let network = if boots { a.network()? } else { None };
    let wait = match &network {
        Some(net) => waited_forwards(&a.wait_for, &net.forwards)?,
        None if !a.wait_for.is_empty() => {
            return Err(HostError::Usage(
                "--wait-for needs a network (--net, or [net] in the appliance manifest) and a \
                 --forward to wait on"
                    .into(),
            ));
        }
        None => Vec::new(),
    };
    let spec = match (&a.appliance, a.command.is_empty()) {
        (Some(m), _) => Some(AppSpec::from_manifest(m)?),
        (None, false) => Some(AppSpec::from_command_line(&a.command, &a.file)?),
        (None, true) => None,
    };
    let programs = || RunPrograms {
        quiet: a.quiet,
        workload: a.appliance.is_none() && !a.command.is_empty(),
        ..RunPrograms::of(spec.as_ref())
    };
    if let Some(s) = &spec
        && boots
    {
        s.validate()?;
    }
    // A boot finds the runtime by itself (--image, $PERCH_IMAGE, the one
    // shipped with perch); a capture or a serial line uses --image only.
    let located = if boots {
        Some(locate_runtime(a.image.as_deref())?)
    } else {
        a.image.as_ref().map(|p| Located {
            path: p.clone(),
            origin: Origin::Flag,
        })
    };
    let (image, elf) =
        open_image(located.as_ref().map(|l| l.path.as_path())).map_err(|e| match &a.input {
            Some(input) => image_error_for(e, input),
            None => e,
        })?;
    let _ = ctrlc::set_handler(|| INTERRUPTED.store(true, Ordering::Relaxed));
    let deadline = match a.timeout {
        Some(t) => Some(Instant::now() + seconds("--timeout", t)?),
        None => None,
    };
    let cache = !a.no_buildid_cache;
    let formats = Formats {
        perf_data: true,
        pprof: a.pprof.clone(),
    };
    if let Some(input) = &a.input {
        let mut f = open_file(input)?;
        let seed = lost_first_hello(&mut f);
        return run(
            Source::Live(Box::new(f)),
            seed,
            image,
            elf.as_deref(),
            &a.output,
            a.save_capture.as_deref(),
            deadline,
            cache,
            programs(),
            &formats,
            watch,
        );
    }
    if let Some(dev) = &a.serial {
        let port = serialport::new(dev, a.baud.unwrap_or(DEFAULT_BAUD))
            .timeout(Duration::from_millis(100))
            .open()
            .map_err(|source| HostError::Serial {
                device: dev.clone(),
                source,
            })?;
        return run(
            Source::Live(Box::new(port)),
            None,
            image,
            elf.as_deref(),
            &a.output,
            a.save_capture.as_deref(),
            deadline,
            cache,
            programs(),
            &formats,
            watch,
        );
    }
    let Some(img) = located.as_ref().map(|l| &l.path) else {
        unreachable!("a boot has its runtime")
    };
    let Some(BootLine {
        append,
        duration,
        expect,
    }) = boot_line
    else {
        unreachable!("a boot has its command line")
    };
    // The boot archive lives as long as the run.
    let (archive_dir, initrd) = pack_archive(spec.as_ref(), "perch-archive-")?;
    let cfg = QemuConfig {
        qemu: a.qemu.clone(),
        image: img.clone(),
        append,
        icount: a.icount,
        // The flight recorder's buffer comes on top of what the run needs.
        memory: format!(
            "{}M",
            if spec.is_some() { 1024 } else { 128 } + a.buffer.unwrap_or(0)
        ),
        cpus: a.cpus,
        initrd,
        extra: a.qemu_arg.clone(),
        transport: a.transport,
        line_baud: a.line_baud,
        net: network,
    };
    let limit = a.timeout.or(duration.map(|d| d + 60.0));
    let within = match limit {
        Some(l) => seconds("--timeout", l)?,
        // QEMU opens its socket at once; a year is "no limit".
        None => Duration::from_secs(365 * 24 * 3600 - 1),
    };
    let deadline = limit.map(|_| Instant::now() + within);
    let net_watch = match &cfg.net {
        Some(net) => {
            if let Some(f) = &a.ready_file {
                match std::fs::remove_file(f) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(HostError::io("removing the old --ready-file", e));
                    }
                    _ => {}
                }
            }
            Some(NetWatch::new(
                net.clone(),
                wait,
                a.ready_file.clone(),
                a.quiet,
            ))
        }
        None => None,
    };
    let (mut qemu, stream) = Qemu::spawn(&cfg, within)?;
    if cfg.net.is_some() && !a.quiet {
        // The forwards are named (`perch: serving: ...`) once the
        // appliance says its address: QEMU forwards to the one its DHCP
        // hands out, or to a static one.
        eprintln!("perch: net: QEMU user networking on a virtio-net card (10.0.2.0/24)");
    }
    let code = run(
        Source::Live(stream),
        None,
        image,
        elf.as_deref(),
        &a.output,
        a.save_capture.as_deref(),
        deadline,
        cache,
        RunPrograms {
            expect,
            net: net_watch,
            ..programs()
        },
        &formats,
        watch.as_deref_mut(),
    );
    // A run the user stopped has no End to wait for: QEMU goes at once.
    let user_stop = watch.as_ref().is_some_and(|w| w.user_stopped());
    let status = qemu.wait(if user_stop {
        Duration::ZERO
    } else {
        Duration::from_secs(5)
    });
    let qemu_err = qemu.take_stderr();
    let com1 = qemu.com1_text();
    drop(archive_dir);
    // With the stream on virtio, COM1 has the text of a boot that failed
    // before the stream moved, and a crash's last words.
    if (code.is_err() || describe_exit(status).is_err()) && !com1.trim().is_empty() {
        eprintln!("perch: the appliance's serial console (COM1) said:");
        for line in com1
            .lines()
            .rev()
            .take(20)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            eprintln!("  {line}");
        }
    }
    let code = code?;
    if INTERRUPTED.load(Ordering::Relaxed) || user_stop {
        return Ok(code);
    }
    match describe_exit(status) {
        Ok(msg) => {
            if !a.quiet {
                eprintln!("perch: {msg}");
            }
            Ok(code)
        }
        Err(msg) => {
            if !qemu_err.trim().is_empty() {
                eprintln!("perch: QEMU said: {}", qemu_err.trim());
            }
            Err(HostError::Appliance(msg))
        }
    }
}

fn convert(
    capture: &Path,
    image: Option<&Path>,
    appliance: Option<&Path>,
    output: Option<&Path>,
    format: Format,
    buildid_cache: bool,
) -> Result<i32, HostError> {
    let output = output.unwrap_or(Path::new(match format {
        Format::Perf => "perf.data",
        Format::Pprof => "profile.pb.gz",
    }));
    let formats = match format {
        Format::Perf => Formats::PERF,
        Format::Pprof => Formats {
            perf_data: false,
            pprof: Some(output.to_owned()),
        },
    };
    refuse_same_files(
        &[("-o", Some(output))],
        &[("capture", Some(capture)), ("--image", image)],
    )?;
    let spec = appliance.map(AppSpec::from_manifest).transpose()?;
    let (image, elf) = open_image(image).map_err(|e| image_error_for(e, capture))?;
    let f = open_file(capture)?;
    run(
        Source::File(f),
        None,
        image,
        elf.as_deref(),
        output,
        None,
        None,
        buildid_cache,
        RunPrograms::of(spec.as_ref()),
        &formats,
        None,
    )
}

/// The runtime command line of `perch image` before its `--boot-arg`s:
/// the manifest's `net=` key when it has a `[net]` (its forwards are
/// QEMU's: a board has none).
fn image_cmdline(freq: u32, net: Option<&host_tool::manifest::NetSpec>) -> String {
    let mut line = format!("console=wire freq={freq}");
    if let Some(n) = net {
        line.push(' ');
        line.push_str(&n.boot_arg());
    }
    line
}

fn image(a: &ImageArgs) -> Result<i32, HostError> {
    let spec = match (&a.appliance, a.command.is_empty()) {
        (Some(m), _) => Some(AppSpec::from_manifest(m)?),
        (None, false) => Some(AppSpec::from_command_line(&a.command, &a.file)?),
        (None, true) => None,
    };
    if let Some(s) = &spec {
        s.validate()?;
    }
    let located = locate_runtime(a.image.as_deref())?;
    let img = &located.path;
    open_image(Some(img))?;
    let mut cmdline = image_cmdline(a.freq, spec.as_ref().and_then(|s| s.net.as_ref()));
    push_boot_args(&mut cmdline, &a.boot_arg)?;
    let (_dir, archive) = pack_archive(spec.as_ref(), "perch-image-")?;
    host_tool::iso::build_iso(img, &cmdline, archive.as_deref(), &a.output)?;
    eprintln!(
        "perch: wrote {} (runtime command line \"{cmdline}\"{})",
        a.output.display(),
        match &spec {
            Some(s) => format!(", {} process(es)", s.processes.len()),
            None => ", no boot archive: the runtime will have nothing to run".into(),
        }
    );
    if let Some(m) = &a.appliance {
        eprintln!(
            "perch: record it with: perch record --serial DEVICE --image {} --appliance {}",
            img.display(),
            m.display()
        );
    }
    Ok(exit::OK)
}

fn stat(file: &Path) -> Result<i32, HostError> {
    // Read once, from the start: the file may be a pipe, which cannot be
    // opened again. The bytes sniffed for the perf.data magic are fed first.
    let mut f = open_file(file)?;
    let (head, got) = read_head(&mut f, file)?;
    if got == head.len() && &head == host_tool::perf_abi::MAGIC {
        return Err(HostError::Usage(format!(
            "{} is a perf.data file; perch stat reads captures (use `perf report --stats -i {}`)",
            file.display(),
            file.display()
        )));
    }
    let mut pump = Pump::new();
    pump.read_all(std::io::Cursor::new(&head[..got]).chain(f), &mut |_| Ok(()))?;
    pump.check_recognised()?;
    let mut text = pump.stats.render();
    if let Some(h) = &pump.stats.hello {
        text.push_str(&format!("build-id: {}\n", hex(&h.build_id)));
    }
    // A reader that stops early (`perch stat X | head`) is not an error.
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(HostError::io("writing to stdout", e))
        }
        _ => Ok(exit::OK),
    }
}

/// The first 8 bytes of `f` (`path`, for the message), as many as it has:
/// what is read to tell a perf.data (its magic) from a capture.
fn read_head(f: &mut impl Read, path: &Path) -> Result<([u8; 8], usize), HostError> {
    let mut head = [0u8; 8];
    let mut got = 0;
    while got < head.len() {
        match f.read(&mut head[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(HostError::io(format!("reading {}", path.display()), e)),
        }
    }
    Ok((head, got))
}

/// Whether `path` starts with perf.data's magic (read once, then reopened:
/// a perf.data is a seekable file).
fn is_perf_data(path: &Path) -> Result<bool, HostError> {
    let (head, got) = read_head(&mut open_file(path)?, path)?;
    Ok(got == head.len() && &head == host_tool::perf_abi::MAGIC)
}

fn flamegraph(
    file: &Path,
    image: Option<&Path>,
    appliance: Option<&Path>,
    filter: host_tool::flamegraph::Filter,
    folded: bool,
    output: &Path,
) -> Result<i32, HostError> {
    refuse_same_files(
        &[("-o", Some(output))],
        &[("input", Some(file)), ("--image", image)],
    )?;
    let spec = appliance.map(AppSpec::from_manifest).transpose()?;
    let programs = spec.map(|s| s.program_files()).unwrap_or_default();
    let perf_data = is_perf_data(file)?;
    let (image, _) = if perf_data {
        open_image(image)?
    } else {
        open_image(image).map_err(|e| image_error_for(e, file))?
    };
    let filtered = !filter.pids.is_empty() || !filter.comms.is_empty();
    let mut folder = Folder::with(image.clone(), programs, filter);
    // How the input ended: None for a perf.data (complete by construction).
    let mut ending = None;
    if perf_data {
        let f = open_file(file)?;
        folder.read_perf_data(std::io::BufReader::new(f))?;
    } else {
        let mut pump = Pump::new();
        let mut f = open_file(file)?;
        let mut mismatch = None;
        pump.read_all(&mut f, &mut |item| {
            if let (Item::Hello(h), Some(img)) = (item, &image)
                && !h.build_id.is_empty()
                && img.build_id.as_deref() != Some(&h.build_id[..])
            {
                mismatch = Some(host_tool::convert::ConvertError::WrongImage {
                    image: img.path.display().to_string(),
                    image_id: img.build_id_hex().unwrap_or_default(),
                    stream_id: hex(&h.build_id),
                });
            }
            folder.push(item);
            Ok(())
        })?;
        pump.check_recognised()?;
        if let Some(e) = mismatch {
            return Err(e.into());
        }
        ending = Some((pump.stats.restarted, pump.stats.end.is_some()));
    }
    if folder.samples == 0 {
        return Err(HostError::NoSamples(format!(
            "{} holds no samples: there is nothing to draw",
            file.display()
        )));
    }
    if folder.is_empty() {
        return Err(HostError::NoSamples(format!(
            "none of the {} samples of {} is of the --pid/--comm given: there is nothing to draw",
            folder.samples,
            file.display()
        )));
    }
    let pending = create_output(output)?;
    let out = pending
        .file()
        .map_err(|e| HostError::io(format!("creating {}", output.display()), e))?;
    let mut out = BufWriter::new(out);
    if folded {
        for line in folder.folded() {
            writeln!(out, "{line}")
                .map_err(|e| HostError::io(format!("writing {}", output.display()), e))?;
        }
    } else {
        folder.render(&format!("perch: {}", file.display()), &mut out)?;
    }
    out.flush()
        .map_err(|e| HostError::io(format!("writing {}", output.display()), e))?;
    drop(out);
    commit_output(pending)?;
    if filtered {
        eprintln!(
            "perch: wrote {} ({} of {} samples)",
            output.display(),
            folder.kept,
            folder.samples
        );
    } else {
        eprintln!(
            "perch: wrote {} ({} samples)",
            output.display(),
            folder.samples
        );
    }
    // The same endings, messages and exit codes as a conversion.
    match ending {
        Some((true, _)) => {
            eprintln!(
                "perch: the appliance restarted (a second Hello before End): stopped there; \
                 the flamegraph shows the first run"
            );
            Ok(exit::TRUNCATED)
        }
        Some((false, false)) => {
            eprintln!(
                "perch: the stream ended before its End record (truncated capture or the appliance stopped)"
            );
            Ok(exit::TRUNCATED)
        }
        _ => Ok(exit::OK),
    }
}

fn kallsyms(image: &Path, output: &Path) -> Result<i32, HostError> {
    refuse_same_files(&[("-o", Some(output))], &[("--image", Some(image))])?;
    let (Some(img), Some(elf)) = open_image(Some(image))? else {
        return Err(HostError::Usage("perch kallsyms needs --image ELF".into()));
    };
    let text = host_tool::kallsyms::kallsyms(&img, &elf)?;
    let pending = create_output(output)?;
    let mut f = pending
        .file()
        .map_err(|e| HostError::io(format!("creating {}", output.display()), e))?;
    f.write_all(text.as_bytes())
        .map_err(|e| HostError::io(format!("writing {}", output.display()), e))?;
    commit_output(pending)?;
    eprintln!(
        "perch: wrote {} ({} symbols); open a recording with: hotspot --kallsyms {} perf.data",
        output.display(),
        text.lines().count(),
        output.display()
    );
    Ok(exit::OK)
}

fn synth(
    output: &Path,
    image: Option<&Path>,
    samples: u64,
    lost: u64,
    end: bool,
) -> Result<i32, HostError> {
    refuse_same_files(&[("-o", Some(output))], &[("--image", image)])?;
    let (image, _) = open_image(image)?;
    let pending = create_output(output)?;
    let f = pending
        .file()
        .map_err(|e| HostError::io(format!("creating {}", output.display()), e))?;
    let mut w = BufWriter::new(f);
    let cfg = SynthConfig {
        samples,
        lost,
        end,
        ..SynthConfig::default()
    };
    let bytes = write_capture(image.as_ref(), &cfg, &mut w)
        .map_err(|e| HostError::io("writing the capture", e))?;
    w.flush()
        .map_err(|e| HostError::io("writing the capture", e))?;
    drop(w);
    commit_output(pending)?;
    eprintln!(
        "perch: wrote {} ({samples} samples, {bytes} bytes)",
        output.display()
    );
    Ok(exit::OK)
}

/// Packs `spec`'s boot archive into a new temporary directory named from
/// `prefix`; returns the directory (the archive lives as long as it does)
/// and the archive's path, `None` without programs.
fn pack_archive(
    spec: Option<&AppSpec>,
    prefix: &str,
) -> Result<(tempfile::TempDir, Option<std::path::PathBuf>), HostError> {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(|e| HostError::io("creating a directory for the boot archive", e))?;
    let archive = match spec {
        Some(s) => {
            let path = dir.path().join("app.cpio");
            s.appliance().write_to(&path)?;
            Some(path)
        }
        None => None,
    };
    Ok((dir, archive))
}

#[cfg(test)]
mod tests {
    use super::{Cli, Cmd, apply_manifest_net, image_cmdline, progress_line};
    use clap::Parser;
    use host_tool::manifest::NetSpec;
    use host_tool::record_opts::RecordArgs;

    fn record_args(args: &[&str]) -> RecordArgs {
        let mut all = vec!["perch", "record"];
        all.extend_from_slice(args);
        match Cli::try_parse_from(all).unwrap().cmd {
            Cmd::Record(a) => *a,
            _ => unreachable!(),
        }
    }

    fn spec(enabled: bool, runtime: &str, forwards: &[&str]) -> NetSpec {
        NetSpec {
            enabled,
            runtime: runtime.into(),
            forwards: forwards.iter().map(|f| f.to_string()).collect(),
        }
    }

    #[test]
    fn an_image_puts_the_manifest_network_on_the_command_line() {
        assert_eq!(image_cmdline(1000, None), "console=wire freq=1000");
        assert_eq!(
            image_cmdline(
                997,
                Some(&spec(true, "10.0.2.20/24,gw=10.0.2.2", &["tcp:8080:80"]))
            ),
            "console=wire freq=997 net=10.0.2.20/24,gw=10.0.2.2"
        );
        assert_eq!(
            image_cmdline(1000, Some(&spec(false, "off", &[]))),
            "console=wire freq=1000 net=off"
        );
    }

    #[test]
    fn a_recording_takes_the_manifest_network() {
        let mut a = record_args(&["--appliance", "a.toml"]);
        apply_manifest_net(&mut a, None);
        assert!(!a.net && a.forward.is_empty() && a.boot_arg.is_empty());
        apply_manifest_net(&mut a, Some(spec(false, "off", &[])));
        assert!(!a.net && a.boot_arg.is_empty());
        apply_manifest_net(
            &mut a,
            Some(spec(true, "10.0.2.20/24,gw=10.0.2.2", &["tcp:8080:80"])),
        );
        assert!(a.net);
        assert_eq!(a.boot_arg, ["net=10.0.2.20/24,gw=10.0.2.2"]);
        assert_eq!(a.forward, ["tcp:8080:80"]);
        let n = a.network().unwrap().unwrap();
        assert_eq!(n.guest, Some([10, 0, 2, 20]));
        assert!(
            n.netdev("n")
                .contains("hostfwd=tcp:127.0.0.1:8080-10.0.2.20:80")
        );
        // The command line's net= and forwards come first; one forward
        // given twice is taken once.
        let mut a = record_args(&[
            "--appliance",
            "a.toml",
            "--net",
            "--forward",
            "tcp:8080:80",
            "--forward",
            "udp:7:7",
            "--boot-arg",
            "net=dhcp,echo",
        ]);
        apply_manifest_net(
            &mut a,
            Some(spec(true, "10.0.2.20/24", &["tcp:8080:80", "tcp:9090:90"])),
        );
        assert_eq!(a.boot_arg, ["net=dhcp,echo"]);
        assert_eq!(a.forward, ["tcp:8080:80", "udp:7:7", "tcp:9090:90"]);
        assert_eq!(a.network().unwrap().unwrap().guest, None);
    }

    #[test]
    fn progress_line_gives_rates_per_second() {
        assert_eq!(
            progress_line(100, 2, 2048, 1, 2.0),
            "100 samples (50/s), 2 lost, 1.00 KiB/s on the wire, 1 bad frames"
        );
        // At the very start the elapsed time is not zero.
        assert_eq!(
            progress_line(0, 0, 0, 0, 0.0),
            "0 samples (0/s), 0 lost, 0 B/s on the wire, 0 bad frames"
        );
    }
}
