//! Real programs under the runtime: building the test programs of `tests/programs/`,
//! running them natively, packing them into a boot archive, booting it, and reading the
//! console back into each process's output and end (the console format of the program
//! runtime's contract).
//!
//! A test builds its programs with [`rust_appcheck`] and [`c_program`] (each build runs
//! once per test binary), describes the processes with [`ProcessSpec`], runs each one
//! natively with [`run_native`] (in a temporary directory holding the same data files,
//! with the same argv and environment), and boots them all with [`run_appliance`], which
//! returns the parsed [`Console`].

use crate::{Boot, Cpu, STATUS_PASS, boot_archive, boot_archive_on, workspace_root};
use host_tool::archive::Appliance;
pub use host_tool::archive::ProcessSpec;
use std::collections::{BTreeMap, HashMap};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// The cargo target directory in use.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// The Rust target of the Rust test program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RustTarget {
    /// `x86_64-unknown-linux-musl`: a 64-bit static-pie.
    X86_64Musl,
    /// `i686-unknown-linux-musl`: a 32-bit static executable (compat mode).
    I686Musl,
}

impl RustTarget {
    /// The target triple.
    pub fn triple(self) -> &'static str {
        match self {
            RustTarget::X86_64Musl => "x86_64-unknown-linux-musl",
            RustTarget::I686Musl => "i686-unknown-linux-musl",
        }
    }
}

/// Builds `tests/programs/rust` (appcheck-rs) for `target` once per test binary, into
/// `target/programs`, and returns the executable.
pub fn rust_appcheck(target: RustTarget) -> PathBuf {
    rust_program("tests/programs/rust", target, "appcheck-rs")
}

/// Builds binary `bin` of the Rust crate in `crate_dir` (relative to the repository root,
/// its own workspace) for `target`, release profile, once per test binary, and returns
/// the executable; panics with cargo's message when the build fails (see
/// [`try_rust_program`]).
pub fn rust_program(crate_dir: &str, target: RustTarget, bin: &str) -> PathBuf {
    try_rust_program(crate_dir, target, bin).unwrap_or_else(|e| panic!("{e}"))
}

/// [`rust_program`], with a failed build as an error message (cargo's output, and the
/// `rustup target add` line when the target is missing). Cargo runs from `crate_dir`, so
/// the crate's own `.cargo/config.toml` (rustflags such as frame pointers and a build-id)
/// applies; `RUSTFLAGS` from the environment is removed so that it cannot override them.
/// The output goes to `target/programs` (for `tests/programs/rust`) or
/// `target/programs/<crate dir name>`.
pub fn try_rust_program(crate_dir: &str, target: RustTarget, bin: &str) -> Result<PathBuf, String> {
    type Key = (String, RustTarget, String);
    static BUILT: Mutex<Vec<(Key, PathBuf)>> = Mutex::new(Vec::new());
    let key: Key = (crate_dir.to_string(), target, bin.to_string());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = built.iter().find(|(k, _)| *k == key) {
        return Ok(p.clone());
    }
    let root = workspace_root();
    let dir = match Path::new(crate_dir).file_name() {
        _ if crate_dir == "tests/programs/rust" => target_dir().join("programs"),
        Some(leaf) => target_dir().join("programs").join(leaf),
        None => return Err(format!("{crate_dir:?} is not a crate directory")),
    };
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root.join(crate_dir))
        .args([
            "build",
            "--release",
            "--bin",
            bin,
            "--target",
            target.triple(),
        ])
        .arg("--target-dir")
        .arg(&dir)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running cargo to build {crate_dir}: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!(
            "building {bin} of {crate_dir} for {} failed{}:\n{stderr}",
            target.triple(),
            if stderr.contains("E0463") || stderr.contains("target may not be installed") {
                format!(" (add the target: rustup target add {})", target.triple())
            } else {
                String::new()
            }
        ));
    }
    let exe = dir.join(target.triple()).join("release").join(bin);
    built.push((key, exe.clone()));
    Ok(exe)
}

/// The demo appliance's crate, relative to the repository root.
pub const DEMO_CRATE: &str = "appliances/demo";

/// The programs of the demo appliance (`appliances/demo`): `(name, target)` in the order
/// the manifest starts them: `demo64` (the 50/30/20 hot split), `demo32` (compat mode),
/// `demosys` (most of its time inside `getrandom`) and `demoregs` (register patterns).
pub const DEMO_PROGRAMS: [(&str, RustTarget); 4] = [
    ("demo64", RustTarget::X86_64Musl),
    ("demo32", RustTarget::I686Musl),
    ("demosys", RustTarget::X86_64Musl),
    ("demoregs", RustTarget::X86_64Musl),
];

/// The [`DEMO_PROGRAMS`], built, each at `bin/NAME` without arguments (each runs until
/// the run's duration ends it); panics when a build fails.
pub fn demo_programs() -> Vec<Program> {
    try_demo_programs().unwrap_or_else(|e| panic!("{e}"))
}

/// [`demo_programs`], with a failed build as an error message.
pub fn try_demo_programs() -> Result<Vec<Program>, String> {
    DEMO_PROGRAMS
        .iter()
        .map(|&(name, target)| {
            let exe = try_rust_program(DEMO_CRATE, target, name)?;
            Ok(Program::new(&exe, name, &[], &[]))
        })
        .collect()
}

/// The demo appliance's manifest for `perch record --appliance`, with its programs
/// built: `appliances/demo/appliance.toml` itself, whose host paths name the programs
/// under `target/` relative to it; when the target directory is elsewhere
/// (`CARGO_TARGET_DIR`), a copy of it in `<target>/programs/demo/` naming the programs
/// where they were built.
pub fn try_demo_manifest() -> Result<PathBuf, String> {
    let programs = try_demo_programs()?;
    let root = workspace_root();
    let manifest = root.join(DEMO_CRATE).join("appliance.toml");
    let text = std::fs::read_to_string(&manifest)
        .map_err(|e| format!("reading {}: {e}", manifest.display()))?;
    let dir = manifest.parent().expect("a manifest has a directory");
    let resolves = |rel: &str| {
        let want = std::fs::canonicalize(dir.join(rel)).ok();
        want.is_some()
            && programs
                .iter()
                .any(|p| std::fs::canonicalize(&p.exe).ok() == want)
    };
    let rels: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("program = \""))
        .filter_map(|l| l.strip_suffix('"'))
        .collect();
    if rels.len() == programs.len() && rels.iter().all(|r| resolves(r)) {
        return Ok(manifest);
    }
    let target = target_dir();
    let target = target.to_str().ok_or("the target directory is not UTF-8")?;
    let copy = text.replace("\"../../target/", &format!("\"{target}/"));
    let out = target_dir().join("programs/demo/appliance.toml");
    std::fs::write(&out, copy).map_err(|e| format!("writing {}: {e}", out.display()))?;
    Ok(out)
}

/// [`try_demo_manifest`]; panics when a build fails.
pub fn demo_manifest() -> PathBuf {
    try_demo_manifest().unwrap_or_else(|e| panic!("{e}"))
}

/// The demo appliance packed: its [`demo_programs`] at `bin/NAME`, no data files.
pub fn demo_appliance() -> Appliance {
    demo_appliance_of(&demo_programs())
}

/// The appliance of already built demo `programs` (see [`try_demo_programs`]).
pub fn demo_appliance_of(programs: &[Program]) -> Appliance {
    programs.iter().fold(Appliance::new(), |app, p| {
        app.file(&p.spec.exe, p.exe.as_path())
            .process(p.spec.clone())
    })
}

/// How a C test program is compiled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CBuild {
    /// `musl-gcc -static` (Debian musl-tools).
    Musl,
    /// `gcc -static` (glibc), non-PIE at 0x400000.
    Glibc,
    /// `gcc -m32 -static` (glibc, i386; gcc-multilib).
    Glibc32,
    /// Plain `gcc`: dynamically linked, with PT_INTERP.
    Dynamic,
}

impl CBuild {
    fn command(self) -> (&'static str, &'static [&'static str], &'static str) {
        match self {
            CBuild::Musl => ("musl-gcc", &["-static"], "musl-tools"),
            CBuild::Glibc => ("gcc", &["-static", "-no-pie"], "gcc"),
            CBuild::Glibc32 => ("gcc", &["-m32", "-static", "-no-pie"], "gcc-multilib"),
            CBuild::Dynamic => ("gcc", &[], "gcc"),
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            CBuild::Musl => "musl",
            CBuild::Glibc => "glibc",
            CBuild::Glibc32 => "glibc32",
            CBuild::Dynamic => "dynamic",
        }
    }
}

/// Compiles `tests/programs/c/NAME.c` as `build` (`-O2`, warnings as errors) once per
/// test binary, into `target/programs/c/NAME-BUILD`.
pub fn c_program(name: &str, build: CBuild) -> PathBuf {
    c_program_with(name, build, &[], "")
}

/// [`c_program`] with extra compiler flags, and `tag` added to the output name to tell
/// variants apart (e.g. another link address).
pub fn c_program_with(name: &str, build: CBuild, flags: &[&str], tag: &str) -> PathBuf {
    type Key = (String, CBuild, Vec<String>);
    static BUILT: OnceLock<Mutex<HashMap<Key, PathBuf>>> = OnceLock::new();
    let key: Key = (
        name.to_string(),
        build,
        flags.iter().map(|f| f.to_string()).collect(),
    );
    let mut built = BUILT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(p) = built.get(&key) {
        return p.clone();
    }
    let source = workspace_root().join(format!("tests/programs/c/{name}.c"));
    let dir = target_dir().join("programs/c");
    std::fs::create_dir_all(&dir).expect("creating target/programs/c");
    let exe = dir.join(format!("{name}{tag}-{}", build.suffix()));
    let (cc, build_flags, package) = build.command();
    let out = Command::new(cc)
        .args(build_flags)
        .args(["-O2", "-g", "-Wall", "-Wextra", "-Werror"])
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg(&source)
        .stdin(Stdio::null())
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "{cc} not found: install it with `apt-get install -y --no-install-recommends {package}`"
        ),
        Err(e) => panic!("running {cc}: {e}"),
    };
    assert!(
        out.status.success(),
        "{cc} {} failed for {} (is {package} installed? `apt-get install -y \
         --no-install-recommends {package}`):\n{}",
        build_flags.join(" "),
        source.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    built.insert(key, exe.clone());
    exe
}

/// `tests/programs/c/threads.c` built as `build`, with pthreads and frame pointers.
pub fn threads_c(build: CBuild) -> PathBuf {
    c_program_with(
        "threads",
        build,
        &["-pthread", "-fno-omit-frame-pointer"],
        "",
    )
}

/// `threads-rs` of `tests/programs/rust` built for `target`.
pub fn threads_rs(target: RustTarget) -> PathBuf {
    rust_program("tests/programs/rust", target, "threads-rs")
}

/// Builds the Go program in `tests/programs/go/NAME` (its own module) once per test
/// binary, as `CGO_ENABLED=0 go build` makes it (static), into `target/programs/go`,
/// and returns the executable. Go's build cache goes under the target directory too, so a
/// test needs no writable home.
pub fn go_program(name: &str) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let mut built = BUILT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(p) = built.get(name) {
        return p.clone();
    }
    let source = workspace_root().join("tests/programs/go").join(name);
    let dir = target_dir().join("programs/go");
    std::fs::create_dir_all(&dir).expect("creating target/programs/go");
    let exe = dir.join(name);
    let out = Command::new("go")
        .args(["build", "-trimpath", "-o"])
        .arg(&exe)
        .arg(".")
        .current_dir(&source)
        .env("CGO_ENABLED", "0")
        .env("GOFLAGS", "-mod=mod")
        .env("GOCACHE", dir.join("cache"))
        .env("GOPATH", dir.join("gopath"))
        .stdin(Stdio::null())
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "go not found: install it with `apt-get install -y --no-install-recommends golang-go`"
        ),
        Err(e) => panic!("running go: {e}"),
    };
    assert!(
        out.status.success(),
        "go build failed for {}:\n{}",
        source.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    built.insert(name.to_string(), exe.clone());
    exe
}

/// The data files every test appliance carries (and every native run finds in its
/// directory): a text file, a binary file of every byte value, and a nested directory.
pub fn data_files() -> Vec<(String, Vec<u8>)> {
    let text: String = (1..=40)
        .map(|i| format!("line {i}: the quick brown fox jumps over the lazy dog\n"))
        .collect();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let binary: Vec<u8> = (0..100_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    vec![
        (
            "data/input.txt".into(),
            format!("hello\n{text}").into_bytes(),
        ),
        ("data/blob.bin".into(), binary),
        ("data/sub/nested.txt".into(), b"nested file\n".to_vec()),
    ]
}

/// A process spec for `bin/NAME` with `args` after argv\[0\] (= NAME) and `env`.
pub fn spec(name: &str, args: &[&str], env: &[&str]) -> ProcessSpec {
    let mut p = ProcessSpec::new(name, &format!("bin/{name}"));
    p.argv = std::iter::once(name)
        .chain(args.iter().copied())
        .map(|a| a.as_bytes().to_vec())
        .collect();
    p.envp = env.iter().map(|e| e.as_bytes().to_vec()).collect();
    p
}

/// How a process ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// It exited with this status.
    Exited(i32),
    /// It was killed by this signal (`SIGSEGV`, ...); the runtime also gives a reason.
    Killed {
        /// The signal's name.
        signal: String,
        /// The runtime's reason (empty for a native run).
        reason: String,
    },
}

impl End {
    /// The same end, without the reason (for comparing a native run with a runtime run).
    pub fn without_reason(&self) -> End {
        match self {
            End::Exited(s) => End::Exited(*s),
            End::Killed { signal, .. } => End::Killed {
                signal: signal.clone(),
                reason: String::new(),
            },
        }
    }
}

/// Debian's static busybox at `/bin/busybox` (the shell and tools of the
/// tests that run programs from programs), or `None` after saying why not:
/// the test then skips (`cargo xtask test` and CI install it).
pub fn static_busybox() -> Option<&'static Path> {
    use object::read::elf::{ElfFile64, ProgramHeader};
    let path = Path::new("/bin/busybox");
    let Ok(bytes) = std::fs::read(path) else {
        eprintln!(
            "SKIPPED: /bin/busybox is missing (apt-get install --no-install-recommends busybox-static)"
        );
        return None;
    };
    let dynamic = ElfFile64::<object::Endianness>::parse(&*bytes).map_or(true, |elf| {
        elf.elf_program_headers()
            .iter()
            .any(|ph| ph.p_type(elf.endian()) == object::elf::PT_INTERP)
    });
    if dynamic {
        eprintln!("SKIPPED: /bin/busybox is not a static x86-64 program: install busybox-static");
        return None;
    }
    Some(path)
}

/// What one run of a program printed, and how it ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Run {
    /// Its standard output.
    pub stdout: Vec<u8>,
    /// Its standard error.
    pub stderr: Vec<u8>,
    /// Its end (`None`: still running when the run ended).
    pub end: Option<End>,
}

impl Run {
    /// stdout as text (lossy), for messages and matching.
    pub fn out(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

fn signal_name(sig: i32) -> String {
    match sig {
        4 => "SIGILL".into(),
        6 => "SIGABRT".into(),
        7 => "SIGBUS".into(),
        8 => "SIGFPE".into(),
        9 => "SIGKILL".into(),
        11 => "SIGSEGV".into(),
        _ => format!("signal {sig}"),
    }
}

/// Runs `exe` natively as `spec` says: argv (argv\[0\] included) and envp exactly, cwd
/// `spec.cwd` inside a fresh temporary directory holding `files`; stdin closed; killed
/// after `timeout`.
pub fn run_native(
    exe: &Path,
    spec: &ProcessSpec,
    files: &[(String, Vec<u8>)],
    timeout: Duration,
) -> Run {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().expect("temporary directory");
    for (path, bytes) in files {
        let host = dir.path().join(path);
        std::fs::create_dir_all(host.parent().expect("a file has a parent"))
            .expect("creating the data directories");
        std::fs::write(&host, bytes).expect("writing a data file");
        // As the archive packs them: programs a program may execve.
        if bytes.starts_with(b"\x7fELF") || bytes.starts_with(b"#!") {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&host, std::fs::Permissions::from_mode(0o755))
                .expect("making a program executable");
        }
    }
    let cwd = dir.path().join(spec.cwd.trim_start_matches('/'));
    std::fs::create_dir_all(&cwd).expect("creating the working directory");
    let mut cmd = Command::new(exe);
    let argv0 = spec.argv.first().cloned().unwrap_or_default();
    cmd.arg0(std::ffi::OsStr::from_bytes(&argv0))
        .args(
            spec.argv
                .iter()
                .skip(1)
                .map(|a| std::ffi::OsStr::from_bytes(a)),
        )
        .env_clear()
        .current_dir(&cwd)
        .stdin(Stdio::null());
    for e in &spec.envp {
        let (k, v) = match e.iter().position(|&b| b == b'=') {
            Some(i) => (&e[..i], &e[i + 1..]),
            None => (&e[..], &[][..]),
        };
        cmd.env(
            std::ffi::OsStr::from_bytes(k),
            std::ffi::OsStr::from_bytes(v),
        );
    }
    let out_path = dir.path().join(".native-stdout");
    let err_path = dir.path().join(".native-stderr");
    cmd.stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("stderr file"));
    let mut child = cmd.spawn().expect("starting the program natively");
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("waiting for the program") {
            break Some(s);
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let end = status.map(|s| match (s.code(), s.signal()) {
        (Some(code), _) => End::Exited(code),
        (None, Some(sig)) => End::Killed {
            signal: signal_name(sig),
            reason: String::new(),
        },
        (None, None) => unreachable!("an exit status has a code or a signal"),
    });
    Run {
        stdout: std::fs::read(&out_path).unwrap_or_default(),
        stderr: std::fs::read(&err_path).unwrap_or_default(),
        end,
    }
}

/// How the run as a whole ended (`perch: run ended: ...`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunEnd {
    /// `all processes exited`.
    AllExited,
    /// `duration reached (N still running)`.
    Duration {
        /// How many were still running.
        still_running: u32,
    },
}

/// One entry of `perch: unknown system calls: ...`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unknown {
    /// `x86_64` or `i386`.
    pub abi: String,
    /// The number.
    pub nr: u64,
    /// The name the runtime gives it.
    pub name: String,
    /// How often it was made.
    pub count: u64,
}

/// A `perch: NAME: cannot start PATH: REASON` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The process name.
    pub name: String,
    /// The exe path.
    pub path: String,
    /// The reason.
    pub reason: String,
}

/// The console of one run, parsed.
#[derive(Clone, Debug, Default)]
pub struct Console {
    /// Each process's output and end, by name.
    pub processes: BTreeMap<String, Run>,
    /// The pid each process was started (or, failing that line, ended)
    /// with; the ends of the processes it forked, which share its name,
    /// are not its own.
    pub pids: BTreeMap<String, u64>,
    /// Names whose output did not end with a newline.
    pub partial: Vec<String>,
    /// Processes the runtime refused to start.
    pub refusals: Vec<Refusal>,
    /// How the run ended, if it said.
    pub run_end: Option<RunEnd>,
    /// The unknown-system-call summary (`Some(empty)` for `none`).
    pub unknown: Option<Vec<Unknown>>,
    /// Every other line (the runtime's own log).
    pub other: Vec<String>,
}

/// Splits `[NAME] rest` / `[NAME:err] rest` into (name, is_stderr, rest).
fn tagged(line: &[u8]) -> Option<(String, bool, &[u8])> {
    let rest = line.strip_prefix(b"[")?;
    let close = rest.iter().position(|&b| b == b']')?;
    let tag = std::str::from_utf8(&rest[..close]).ok()?;
    let after = &rest[close + 1..];
    let text = if after.is_empty() {
        after
    } else {
        after.strip_prefix(b" ")?
    };
    let (name, err) = match tag.strip_suffix(":err") {
        Some(n) => (n, true),
        None => (tag, false),
    };
    if name.is_empty() || name.len() > 15 || name.contains(' ') || name.contains('[') {
        return None;
    }
    Some((name.to_string(), err, text))
}

fn parse_unknowns(list: &str) -> Option<Vec<Unknown>> {
    if list == "none" {
        return Some(Vec::new());
    }
    list.split(", ")
        .map(|item| {
            // ABI NR (NAME) xCOUNT
            let (abi, rest) = item.split_once(' ')?;
            let (nr, rest) = rest.split_once(" (")?;
            let (name, count) = rest.rsplit_once(") x")?;
            Some(Unknown {
                abi: abi.to_string(),
                nr: nr.parse().ok()?,
                name: name.to_string(),
                count: count.parse().ok()?,
            })
        })
        .collect()
}

impl Console {
    /// Parses the serial output of a run. A trailing `\r` on a console line is dropped
    /// (serial line endings); program bytes are otherwise kept as they are.
    pub fn parse(bytes: &[u8]) -> Console {
        let mut c = Console::default();
        // The stream each process printed its last line on, to undo the newline added to
        // a partial last line.
        let mut last_stream: HashMap<String, bool> = HashMap::new();
        for raw in bytes.split(|&b| b == b'\n') {
            let line = raw.strip_suffix(b"\r").unwrap_or(raw);
            if let Some((name, err, text)) = tagged(line) {
                let run = c.processes.entry(name.clone()).or_default();
                let stream = if err {
                    &mut run.stderr
                } else {
                    &mut run.stdout
                };
                stream.extend_from_slice(text);
                stream.push(b'\n');
                last_stream.insert(name, err);
                continue;
            }
            let text = String::from_utf8_lossy(line).into_owned();
            if !c.parse_perch_line(&text, &last_stream) && !text.trim().is_empty() {
                c.other.push(text);
            }
        }
        c
    }

    fn parse_perch_line(&mut self, line: &str, last_stream: &HashMap<String, bool>) -> bool {
        let Some(rest) = line.strip_prefix("perch: ") else {
            return false;
        };
        if let Some(how) = rest.strip_prefix("run ended: ") {
            if how == "all processes exited" {
                self.run_end = Some(RunEnd::AllExited);
                return true;
            }
            if let Some(n) = how
                .strip_prefix("duration reached (")
                .and_then(|s| s.strip_suffix(" still running)"))
                .and_then(|n| n.parse().ok())
            {
                self.run_end = Some(RunEnd::Duration { still_running: n });
                return true;
            }
            return false;
        }
        if let Some(list) = rest.strip_prefix("unknown system calls: ") {
            if let Some(u) = parse_unknowns(list) {
                self.unknown = Some(u);
                return true;
            }
            return false;
        }
        // started NAME (pid P): PATH (ABI), entry E
        if let Some(started) = rest.strip_prefix("started ")
            && let Some((name, after)) = started.split_once(" (pid ")
            && let Some((pid, _)) = after.split_once("):")
            && let Ok(pid) = pid.parse::<u64>()
        {
            self.pids.insert(name.to_string(), pid);
            return true;
        }
        let Some((name, what)) = rest.split_once(' ').or_else(|| rest.split_once(':')) else {
            return false;
        };
        // NAME (pid P) exited with status S / NAME (pid P) killed by SIG: REASON
        if let Some(after) = what.strip_prefix("(pid ") {
            let Some((pid, end)) = after.split_once(") ") else {
                return false;
            };
            let Ok(pid) = pid.parse::<u64>() else {
                return false;
            };
            let end = if let Some(s) = end.strip_prefix("exited with status ") {
                match s.parse() {
                    Ok(s) => End::Exited(s),
                    Err(_) => return false,
                }
            } else if let Some(k) = end.strip_prefix("killed by ") {
                let (signal, reason) = k.split_once(": ").unwrap_or((k, ""));
                End::Killed {
                    signal: signal.to_string(),
                    reason: reason.to_string(),
                }
            } else {
                return false;
            };
            // A process the named one forked ends under its name too:
            // its end is not the named process's.
            if self.pids.get(name).is_some_and(|&p| p != pid) {
                return true;
            }
            self.pids.insert(name.to_string(), pid);
            self.processes.entry(name.to_string()).or_default().end = Some(end);
            return true;
        }
        // NAME: cannot start PATH: REASON / NAME: output did not end with a newline
        let Some(name) = name.strip_suffix(':') else {
            return false;
        };
        if what == "output did not end with a newline" {
            if let Some(run) = self.processes.get_mut(name) {
                let stream = match last_stream.get(name) {
                    Some(true) => &mut run.stderr,
                    _ => &mut run.stdout,
                };
                if stream.last() == Some(&b'\n') {
                    stream.pop();
                }
            }
            self.partial.push(name.to_string());
            return true;
        }
        if let Some(r) = what.strip_prefix("cannot start ") {
            let (path, reason) = r.split_once(": ").unwrap_or((r, ""));
            self.refusals.push(Refusal {
                name: name.to_string(),
                path: path.to_string(),
                reason: reason.to_string(),
            });
            return true;
        }
        false
    }

    /// The run of process `name` (empty if it printed nothing and never ended).
    pub fn process(&self, name: &str) -> Run {
        self.processes.get(name).cloned().unwrap_or_default()
    }
}

/// One program of an appliance: its host executable and its process spec.
#[derive(Clone, Debug)]
pub struct Program {
    /// The executable on the host.
    pub exe: PathBuf,
    /// How to start it (its `exe` is the archive path it is packed at).
    pub spec: ProcessSpec,
}

impl Program {
    /// `exe` packed at `bin/NAME`, started as NAME with `args` and `env`.
    pub fn new(exe: &Path, name: &str, args: &[&str], env: &[&str]) -> Program {
        Program {
            exe: exe.to_path_buf(),
            spec: spec(name, args, env),
        }
    }

    /// Runs it natively with the data files (see [`run_native`]), 60 s at most.
    pub fn native(&self) -> Run {
        run_native(
            &self.exe,
            &self.spec,
            &data_files(),
            Duration::from_secs(60),
        )
    }
}

/// Boots `programs` and checks that each printed exactly what it prints natively, on
/// stdout and stderr, and ended the same way; the run must end normally, and none of
/// the system calls named in `must_know` may be among the run's unknown ones.
pub fn assert_same_as_native(
    programs: &[Program],
    cmdline: &str,
    timeout: Duration,
    must_know: &[&str],
) {
    let run = run_appliance(&appliance(programs), cmdline, timeout);
    let t = run.transcript();
    assert_eq!(
        run.boot.status,
        Some(STATUS_PASS),
        "QEMU did not report a normal end (timed out: {}):\n{t}",
        run.boot.timed_out
    );
    assert_eq!(
        run.console.run_end,
        Some(RunEnd::AllExited),
        "the run did not end with every process exited:\n{t}"
    );
    let unknown = run
        .console
        .unknown
        .as_ref()
        .unwrap_or_else(|| panic!("no unknown-system-call summary:\n{t}"));
    let missing: Vec<String> = unknown
        .iter()
        .filter(|u| must_know.contains(&u.name.as_str()))
        .map(|u| format!("{} {} ({}) x{}", u.abi, u.nr, u.name, u.count))
        .collect();
    assert!(
        missing.is_empty(),
        "the runtime does not know these calls: {missing:?}\n{t}"
    );
    for p in programs {
        let native = p.native();
        let guest = run.console.process(&p.spec.name);
        assert_eq!(
            guest.out(),
            native.out(),
            "{}: stdout differs from the native run:\n{t}",
            p.spec.name
        );
        assert_eq!(
            String::from_utf8_lossy(&guest.stderr),
            String::from_utf8_lossy(&native.stderr),
            "{}: stderr differs from the native run:\n{t}",
            p.spec.name
        );
        assert_eq!(
            guest.end.as_ref().map(End::without_reason),
            native.end,
            "{}: ends differently from the native run:\n{t}",
            p.spec.name
        );
    }
}

/// The appliance holding `programs` (each at its spec's `exe`, started in order) and the
/// [`data_files`].
pub fn appliance(programs: &[Program]) -> Appliance {
    let mut app = Appliance::new();
    for (path, bytes) in data_files() {
        app = app.file(&path, bytes);
    }
    for p in programs {
        app = app
            .file(&p.spec.exe, p.exe.as_path())
            .process(p.spec.clone());
    }
    app
}

/// A finished boot with an archive, and its parsed console.
#[derive(Debug)]
pub struct ApplianceRun {
    /// QEMU's end and the raw output.
    pub boot: Boot,
    /// The parsed console.
    pub console: Console,
}

impl ApplianceRun {
    /// The whole serial output, for assertion messages.
    pub fn transcript(&self) -> &str {
        &self.boot.output
    }
}

/// Packs `app` into a temporary archive and boots it with `cmdline` (1 GiB, `-initrd`).
pub fn run_appliance(app: &Appliance, cmdline: &str, timeout: Duration) -> ApplianceRun {
    run_appliance_on(Cpu::Max, app, cmdline, timeout, &[])
}

/// [`run_appliance`] on CPU model `cpu`, with `extra` QEMU arguments.
pub fn run_appliance_on(
    cpu: Cpu,
    app: &Appliance,
    cmdline: &str,
    timeout: Duration,
    extra: &[&str],
) -> ApplianceRun {
    let dir = tempfile::tempdir().expect("temporary directory");
    let archive = dir.path().join("app.cpio");
    app.write_to(&archive).expect("packing the appliance");
    let boot = boot_archive_on(cpu, cmdline, &archive, timeout, extra);
    let console = Console::parse(&boot.bytes);
    ApplianceRun { boot, console }
}

/// Boots an archive file as it is (for damaged archives).
pub fn run_archive(archive: &Path, cmdline: &str, timeout: Duration) -> ApplianceRun {
    let boot = boot_archive(cmdline, archive, timeout);
    let console = Console::parse(&boot.bytes);
    ApplianceRun { boot, console }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A transcript in the console format of the contract, by hand.
    const TRANSCRIPT: &[u8] = b"perch-runtime 0.1.0: booting\r\n\
[app] appcheck: 2 args: [app] [data]\r\n\
[app] line with \xff raw bytes and [brackets]\n\
[twin-a] twin a: start\n\
[app:err] appcheck: done\n\
[app] \n\
[twin-a] no newline at the end\n\
perch: twin-a: output did not end with a newline\n\
perch: app (pid 1) exited with status 3\n\
perch: twin-a (pid 2) killed by SIGSEGV: page fault reading 0xffffffff80100000 at rip 0x401234\n\
perch: dyn: cannot start bin/dyn: dynamically linked (PT_INTERP /lib64/ld-linux-x86-64.so.2): link it statically\n\
[spin] spin: spinning without system calls\n\
perch: run ended: duration reached (1 still running)\n\
perch: unknown system calls: x86_64 163 (acct) x3, i386 51 (acct) x12, x86_64 1000 (?) x2\n";

    #[test]
    fn console_transcript_parses_into_processes_ends_and_summary() {
        let c = Console::parse(TRANSCRIPT);
        let app = c.process("app");
        assert_eq!(
            app.stdout,
            b"appcheck: 2 args: [app] [data]\nline with \xff raw bytes and [brackets]\n\n"
        );
        assert_eq!(app.stderr, b"appcheck: done\n");
        assert_eq!(app.end, Some(End::Exited(3)));
        let twin = c.process("twin-a");
        assert_eq!(twin.stdout, b"twin a: start\nno newline at the end");
        assert_eq!(
            twin.end,
            Some(End::Killed {
                signal: "SIGSEGV".into(),
                reason: "page fault reading 0xffffffff80100000 at rip 0x401234".into()
            })
        );
        assert_eq!(c.partial, vec!["twin-a".to_string()]);
        assert_eq!(c.pids.get("app"), Some(&1));
        assert_eq!(c.pids.get("twin-a"), Some(&2));
        assert_eq!(
            c.refusals,
            vec![Refusal {
                name: "dyn".into(),
                path: "bin/dyn".into(),
                reason: "dynamically linked (PT_INTERP /lib64/ld-linux-x86-64.so.2): link it \
                         statically"
                    .into()
            }]
        );
        let spin = c.process("spin");
        assert_eq!(spin.stdout, b"spin: spinning without system calls\n");
        assert_eq!(spin.end, None);
        assert_eq!(c.run_end, Some(RunEnd::Duration { still_running: 1 }));
        let unknown = c.unknown.expect("the summary line");
        assert_eq!(unknown.len(), 3);
        assert_eq!(
            unknown[1],
            Unknown {
                abi: "i386".into(),
                nr: 51,
                name: "acct".into(),
                count: 12
            }
        );
        assert_eq!(unknown[2].nr, 1000);
        assert_eq!(c.other, vec!["perch-runtime 0.1.0: booting".to_string()]);
    }

    #[test]
    fn a_forked_childs_end_is_not_its_parents() {
        let c = Console::parse(
            b"perch: started sh (pid 1): bin/sh (x86_64), entry 0x401000\n\
perch: sh (pid 1) exited with status 0\n\
perch: sh (pid 2) killed by SIGTERM: its default action\n",
        );
        assert_eq!(c.pids.get("sh"), Some(&1));
        assert_eq!(c.process("sh").end, Some(End::Exited(0)));
    }

    #[test]
    fn console_other_endings_and_malformed_lines() {
        let c = Console::parse(
            b"perch: run ended: all processes exited\n\
perch: unknown system calls: none\n\
perch: app (pid x) exited with status 3\n\
[has space] not a tag\n\
perch: something else\n",
        );
        assert_eq!(c.run_end, Some(RunEnd::AllExited));
        assert_eq!(c.unknown, Some(Vec::new()));
        assert!(c.processes.is_empty(), "{:?}", c.processes);
        assert_eq!(c.other.len(), 3, "{:?}", c.other);
    }

    #[test]
    fn native_run_gets_argv_env_cwd_files_and_status() {
        let p = Program::new(
            Path::new("/bin/sh"),
            "sh",
            &[
                "-c",
                "echo \"$0 $1 [$PERCH_GREETING] $HOME\"; cat data/sub/nested.txt; \
                 echo err >&2; exit 3",
                "arg1",
            ],
            &["PERCH_GREETING=hi there"],
        );
        // argv[1..] of the spec: -c SCRIPT arg1, so $0 is arg1 (sh's rule for -c).
        let run = p.native();
        assert_eq!(run.out(), "arg1  [hi there] \nnested file\n");
        assert_eq!(run.stderr, b"err\n");
        assert_eq!(run.end, Some(End::Exited(3)));
        let killed = Program::new(Path::new("/bin/sh"), "sh", &["-c", "kill -SEGV $$"], &[]);
        assert_eq!(
            killed.native().end,
            Some(End::Killed {
                signal: "SIGSEGV".into(),
                reason: String::new()
            })
        );
    }
}
