//! `perch record -- PROGRAM` end to end, as a user runs it: in a fresh
//! `HOME`, record each of the five builds of the test program (Rust musl
//! x86-64 and i686, musl-gcc C, glibc C, gcc -m32 glibc C), then a plain
//! `perf report` (no `--vmlinux`) prints no warning and names the samples'
//! symbols, `perf script` names the program's own ELF as the dso of its
//! samples and `perf annotate` disassembles its hottest symbol. Also: bad
//! programs and manifests are refused before any boot with exit code 8, a
//! crash gives its signal and exit code 9, and two processes of one program
//! (one link address) stay apart by pid.
//!
//! Each run hashes a 12 MiB data file (appcheck's FNV-1a over each FILE it
//! is given), about a second of user time under TCG at 1 kHz.
#![forbid(unsafe_code)]

use e2e_tests::programs::{CBuild, RustTarget, c_program, rust_appcheck};
use e2e_tests::{perch_bin, perf_present, qemu_present, runtime_elf};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The data file the program hashes: 12 MiB of xorshift bytes.
fn big_file(dir: &Path) -> PathBuf {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let bytes: Vec<u8> = (0..12 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect();
    let p = dir.join("big.bin");
    std::fs::write(&p, bytes).expect("writing the data file");
    p
}

/// The GNU build-id of an ELF (the runtime loader's reading of it).
fn kcore_build_id(elf: &[u8]) -> Option<Vec<u8>> {
    host_tool::manifest::build_id(elf)
}

/// One finished command.
struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// `perch record --image RUNTIME -o DIR/perf.data ARGS` with `HOME` = `home`
/// (and no PERF_BUILDID_DIR, so the cache is `home/.debug`, as for a user).
fn perch_record(home: &Path, data: &Path, args: &[&str]) -> Out {
    let o = Command::new(perch_bin())
        .arg("record")
        .arg("--image")
        .arg(runtime_elf())
        .arg("-o")
        .arg(data)
        // Under icount a sample falls every N instructions, so each build's
        // sample count is the same on a loaded host as on an idle one.
        .arg("--icount")
        .args(["--timeout", "240"])
        .args(args)
        .env("HOME", home)
        .env_remove("PERF_BUILDID_DIR")
        .stdin(Stdio::null())
        .output()
        .expect("running perch record");
    Out {
        code: o.status.code(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// A plain perf command on `data` with `HOME` = `home`: no `--vmlinux`, no
/// build-id dir.
fn perf(home: &Path, data: &Path, args: &[&str]) -> Out {
    let o = Command::new("perf")
        .args(args)
        .arg("-i")
        .arg(data)
        .env("HOME", home)
        .env("PAGER", "cat")
        .env_remove("PERF_BUILDID_DIR")
        .stdin(Stdio::null())
        .output()
        .expect("running perf");
    Out {
        code: o.status.code(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// One sample line of `perf script -G -F comm,pid,ip,sym,dso`.
#[derive(Debug)]
struct ScriptSample {
    pid: u32,
    ip: u64,
    sym: String,
    dso: String,
}

impl ScriptSample {
    fn user(&self) -> bool {
        self.ip < 0xffff_8000_0000_0000
    }
}

/// Parses `perf script -G -F comm,pid,ip,sym,dso` lines: `COMM PID IP SYM (DSO)`
/// (SYM may hold spaces; COMM does not, the manifest refuses them).
fn script_samples(text: &str) -> Vec<ScriptSample> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut w = l.split_whitespace();
            let _comm = w.next().expect("comm");
            let pid = w.next().and_then(|p| p.parse().ok()).expect("pid");
            let ip = w
                .next()
                .and_then(|ip| u64::from_str_radix(ip, 16).ok())
                .unwrap_or_else(|| panic!("no ip in {l:?}"));
            let rest: Vec<&str> = w.collect();
            let rest = rest.join(" ");
            let open = rest.rfind(" (").map_or(0, |i| i + 1);
            let (sym, dso) = rest.split_at(open);
            ScriptSample {
                pid,
                ip,
                sym: sym.trim().to_owned(),
                dso: dso
                    .trim()
                    .trim_start_matches('(')
                    .trim_end_matches(')')
                    .to_owned(),
            }
        })
        .collect()
}

/// Records `program` hashing the big file in a fresh HOME and checks what a
/// user then sees with plain perf commands.
fn profile_one(what: &str, program: &Path) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let home = dir.path().join("home");
    std::fs::create_dir(&home).expect("creating HOME");
    let big = big_file(dir.path());
    let data = dir.path().join("perf.data");
    let file = format!("{}:data/big.bin", big.display());
    let prog = program.display().to_string();
    let rec = perch_record(
        &home,
        &data,
        &["--file", &file, "--", &prog, "data", "data/big.bin"],
    );
    let err = &rec.stderr;
    // appcheck exits with status 3 when all its checks pass, and perch,
    // as `perf record -- PROGRAM` does, exits with the program's status.
    assert_eq!(
        rec.code,
        Some(3),
        "{what}: perch record's exit code:\n{err}"
    );
    // The program's own output, untagged (one program), on the host's
    // stdout and stderr.
    assert!(
        rec.stdout
            .contains(&format!("file data/big.bin: {} bytes", 12 << 20)),
        "{what}: the program's stdout:\n{}\nstderr:\n{err}",
        rec.stdout
    );
    assert!(!rec.stdout.contains("[appcheck"), "{what}: {}", rec.stdout);
    assert!(
        err.lines().any(|l| l.starts_with("appcheck")),
        "{what}: no untagged stderr line of the program:\n{err}"
    );
    assert!(
        err.contains("exited with status 3"),
        "{what}: no exit status:\n{err}"
    );
    assert!(
        err.contains("build-id cache"),
        "{what}: nothing cached:\n{err}"
    );

    let report = perf(&home, &data, &["report", "--stdio"]);
    assert_eq!(
        report.code,
        Some(0),
        "{what}: perf report: {}",
        report.stderr
    );
    assert_eq!(
        report.stderr.trim(),
        "",
        "{what}: perf report printed warnings"
    );
    assert!(
        !report.stdout.contains("No kallsyms or vmlinux"),
        "{what}: {}",
        report.stdout
    );

    let script = perf(&home, &data, &["script", "-G", "-F", "comm,pid,ip,sym,dso"]);
    assert_eq!(
        script.code,
        Some(0),
        "{what}: perf script: {}",
        script.stderr
    );
    let samples = script_samples(&script.stdout);
    assert!(
        samples.len() > 200,
        "{what}: only {} samples",
        samples.len()
    );
    let unnamed = samples
        .iter()
        .filter(|s| s.sym.is_empty() || s.sym.contains("[unknown]"))
        .count();
    assert!(
        unnamed * 100 <= samples.len(),
        "{what}: {unnamed} of {} samples have no symbol:\n{}",
        samples.len(),
        script.stdout
    );
    let own = std::fs::canonicalize(program)
        .expect("the program's path")
        .display()
        .to_string();
    let user: Vec<&ScriptSample> = samples.iter().filter(|s| s.user()).collect();
    assert!(user.len() > 50, "{what}: only {} user samples", user.len());
    for s in &user {
        assert_eq!(s.dso, own, "{what}: a user sample's dso: {s:?}");
        assert_eq!(s.pid, 1, "{what}: {s:?}");
    }
    for s in samples.iter().filter(|s| !s.user()) {
        assert_eq!(
            s.dso, "[kernel.kallsyms]",
            "{what}: a runtime sample: {s:?}"
        );
    }

    // The hottest user symbol, annotated.
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for s in &user {
        *counts.entry(&s.sym).or_default() += 1;
    }
    let (hot, _) = counts
        .iter()
        .max_by_key(|(_, n)| **n)
        .expect("a user symbol");
    eprintln!(
        "{what}: {} samples, {} user, {unnamed} without a symbol, hottest user symbol {hot} ({})",
        samples.len(),
        user.len(),
        counts[hot]
    );
    let ann = perf(&home, &data, &["annotate", "--stdio", hot]);
    assert_eq!(
        ann.code,
        Some(0),
        "{what}: perf annotate {hot}: {}",
        ann.stderr
    );
    assert!(
        ann.stdout.contains("Disassembly") && ann.stdout.contains("Percent"),
        "{what}: perf annotate {hot}:\n{}\n{}",
        ann.stdout,
        ann.stderr
    );
}

#[test]
fn each_program_is_profiled_with_its_own_symbols_in_a_fresh_home() {
    if !qemu_present() || !perf_present() {
        return;
    }
    let builds = [
        ("Rust x86_64 musl", rust_appcheck(RustTarget::X86_64Musl)),
        ("Rust i686 musl", rust_appcheck(RustTarget::I686Musl)),
        ("C musl-gcc", c_program("appcheck", CBuild::Musl)),
        ("C glibc", c_program("appcheck", CBuild::Glibc)),
        ("C glibc -m32", c_program("appcheck", CBuild::Glibc32)),
    ];
    // A program without a build-id note: perf finds it by its path.
    let dir = tempfile::tempdir().expect("temporary directory");
    let plain = dir.path().join("appcheck-no-build-id");
    let o = Command::new("objcopy")
        .arg("--remove-section")
        .arg(".note.gnu.build-id")
        .arg(&builds[2].1)
        .arg(&plain)
        .output()
        .expect("running objcopy (binutils)");
    assert!(
        o.status.success(),
        "objcopy: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let bytes = std::fs::read(&plain).expect("reading the copy");
    assert_eq!(kcore_build_id(&bytes), None, "the note is still there");
    for (what, program) in builds
        .iter()
        .chain([&("C musl-gcc without a build-id note", plain.clone())])
    {
        profile_one(what, program);
    }
}

/// Two processes of one program (one link address, 0x400000) in one run:
/// each one's samples carry its own pid and name the program's ELF, and
/// their output comes tagged by name.
#[test]
fn two_processes_of_one_program_are_kept_apart_by_pid() {
    if !qemu_present() || !perf_present() {
        return;
    }
    let program = c_program("appcheck", CBuild::Glibc);
    let dir = tempfile::tempdir().expect("temporary directory");
    let home = dir.path().join("home");
    std::fs::create_dir(&home).expect("creating HOME");
    // The manifest names it relative to itself, as `big.bin`.
    big_file(dir.path());
    let manifest = dir.path().join("two.toml");
    std::fs::write(
        &manifest,
        format!(
            r#"
[[process]]
name = "one"
program = "{p}"
args = ["data", "data/big.bin"]

[[process]]
name = "two"
program = "{p}"
args = ["data", "data/big.bin"]

[[file]]
host = "big.bin"
guest = "data/big.bin"
"#,
            p = program.display()
        ),
    )
    .expect("writing the manifest");
    let data = dir.path().join("perf.data");
    let rec = perch_record(
        &home,
        &data,
        &["--appliance", &manifest.display().to_string()],
    );
    assert_eq!(rec.code, Some(0), "perch record failed:\n{}", rec.stderr);
    for name in ["one", "two"] {
        assert!(
            rec.stdout
                .contains(&format!("[{name}] file data/big.bin: {} bytes", 12 << 20)),
            "{name}'s tagged output:\n{}",
            rec.stdout
        );
    }
    let script = perf(&home, &data, &["script", "-G", "-F", "comm,pid,ip,sym,dso"]);
    assert_eq!(script.code, Some(0), "perf script: {}", script.stderr);
    let own = std::fs::canonicalize(&program)
        .expect("the program's path")
        .display()
        .to_string();
    let samples = script_samples(&script.stdout);
    for pid in [1, 2] {
        let mine: Vec<&ScriptSample> = samples
            .iter()
            .filter(|s| s.user() && s.pid == pid)
            .collect();
        assert!(mine.len() > 20, "pid {pid}: {} user samples", mine.len());
        assert!(
            mine.iter()
                .all(|s| s.dso == own && !s.sym.contains("[unknown]")),
            "pid {pid}: {mine:?}"
        );
        assert!(
            mine.iter().any(|s| s.sym == "check_file"),
            "pid {pid} never in check_file: {mine:?}"
        );
    }
    // comm follows the pid.
    for l in script.stdout.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        match w.get(1) {
            Some(&"1") => assert_eq!(w[0], "one", "{l}"),
            Some(&"2") => assert_eq!(w[0], "two", "{l}"),
            _ => {}
        }
    }
}

#[test]
fn a_crashing_program_gives_its_signal_and_a_nonzero_exit() {
    if !qemu_present() {
        return;
    }
    let program = c_program("crash", CBuild::Glibc);
    let dir = tempfile::tempdir().expect("temporary directory");
    let home = dir.path().join("home");
    std::fs::create_dir(&home).expect("creating HOME");
    let data = dir.path().join("perf.data");
    let prog = program.display().to_string();
    let rec = perch_record(&home, &data, &["--", &prog, "write", "0"]);
    let err = &rec.stderr;
    assert_eq!(rec.code, Some(9), "exit code:\n{err}");
    assert!(
        err.contains("perch: crash-glibc (pid 1) crashed: killed by SIGSEGV: ")
            && err.contains("page fault writing 0x0 at rip 0x"),
        "{err}"
    );
    assert!(rec.stdout.contains("crash: writing 0x0"), "{}", rec.stdout);
    assert!(data.exists(), "perf.data is written all the same");
}

/// Programs and manifests refused before any boot: perch is given a QEMU
/// that does not exist, so reaching the boot would be exit code 5, not 8.
#[test]
fn bad_programs_and_manifests_are_refused_before_boot() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let home = dir.path().join("home");
    std::fs::create_dir(&home).expect("creating HOME");
    let data = dir.path().join("perf.data");
    let no_qemu = dir.path().join("no-qemu");
    let no_qemu = no_qemu.display().to_string();
    let refused = |args: &[&str], words: &[&str]| {
        let mut all = vec!["--qemu", &no_qemu];
        all.extend_from_slice(args);
        let r = perch_record(&home, &data, &all);
        assert_eq!(r.code, Some(8), "{args:?}: exit code:\n{}", r.stderr);
        let l = r.stderr.to_ascii_lowercase();
        for w in words {
            assert!(l.contains(w), "{args:?}: no {w:?} in:\n{}", r.stderr);
        }
        assert!(!data.exists(), "{args:?}: perf.data written");
    };
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "#!/bin/sh\necho not a program\n").expect("writing");
    let other = dir.path().join("aarch64-prog");
    let mut elf = std::fs::read(c_program("spin", CBuild::Glibc)).expect("reading spin");
    // e_machine = EM_AARCH64 (183).
    elf[18..20].copy_from_slice(&183u16.to_le_bytes());
    std::fs::write(&other, elf).expect("writing");
    let s = |p: &Path| p.display().to_string();
    let dynamic = s(&c_program("hello", CBuild::Dynamic));
    refused(&["--", &dynamic], &["dynamically linked", "statically"]);
    refused(&["--", &s(&text)], &["notes.txt", "not an elf"]);
    refused(
        &["--", &s(&other)],
        &["aarch64-prog", "em_aarch64", "x86-64"],
    );
    let missing = s(&dir.path().join("missing-prog"));
    refused(&["--", &missing], &["missing-prog", "cannot read"]);
    let spin = s(&c_program("spin", CBuild::Glibc));
    let nofile = s(&dir.path().join("no-such-data"));
    refused(
        &["--file", &nofile, "--", &spin],
        &["no-such-data", "cannot read"],
    );
    let manifest = dir.path().join("bad.toml");
    std::fs::write(
        &manifest,
        format!("[[process]]\nprogram = \"{spin}\"\nargz = [\"1\"]\n"),
    )
    .expect("writing");
    refused(
        &["--appliance", &s(&manifest)],
        &["bad.toml", "unknown field", "argz"],
    );
    std::fs::write(
        &manifest,
        format!("[[process]]\nprogram = \"{spin}\"\n\n[[file]]\nhost = \"gone.txt\"\n"),
    )
    .expect("writing");
    refused(
        &["--appliance", &s(&manifest)],
        &["gone.txt", "cannot read"],
    );
    refused(
        &["--appliance", &s(&dir.path().join("none.toml"))],
        &["none.toml"],
    );
}

/// The bare-metal path: `perch image --appliance` builds the GRUB ISO,
/// which boots (here under QEMU, its serial line saved to a file as a board
/// would send it), and `perch convert --appliance` turns what came back
/// into perf.data that names the program's own symbols.
#[test]
fn an_iso_of_a_manifest_boots_and_converts_with_the_programs_symbols() {
    if !qemu_present() || !perf_present() || !e2e_tests::have_tool("grub-mkrescue") {
        return;
    }
    let program = c_program("appcheck", CBuild::Musl);
    let dir = tempfile::tempdir().expect("temporary directory");
    let home = dir.path().join("home");
    std::fs::create_dir(&home).expect("creating HOME");
    big_file(dir.path());
    let manifest = dir.path().join("app.toml");
    std::fs::write(
        &manifest,
        format!(
            "[[process]]\nprogram = \"{}\"\nargs = [\"data\", \"data/big.bin\"]\n\n\
             [[file]]\nhost = \"big.bin\"\nguest = \"data/big.bin\"\n",
            program.display()
        ),
    )
    .expect("writing the manifest");
    let iso = dir.path().join("app.iso");
    // 1 kHz: in real time the 16550's host side takes about 100 KB/s, and
    // at about 35 bytes a grouped sample this stays well below it (this test
    // is about the ISO and the symbols, not the line's limit); the program
    // runs for about 50 ms, so 500 Hz left it barely over 20 samples.
    let o = Command::new(perch_bin())
        .arg("image")
        .arg("--image")
        .arg(runtime_elf())
        .arg("--appliance")
        .arg(&manifest)
        .args(["--freq", "1000"])
        .arg("-o")
        .arg(&iso)
        .output()
        .expect("running perch image");
    assert!(
        o.status.success(),
        "perch image: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let capture = dir.path().join("serial.bin");
    let status = Command::new("qemu-system-x86_64")
        .args([
            "-nodefaults",
            "-no-reboot",
            "-display",
            "none",
            "-machine",
            "pc",
        ])
        .args([
            "-m",
            "1G",
            "-device",
            "isa-debug-exit,iobase=0xf4,iosize=0x04",
        ])
        .arg("-serial")
        .arg(format!("file:{}", capture.display()))
        .arg("-cdrom")
        .arg(&iso)
        .stdin(Stdio::null())
        .status()
        .expect("running QEMU");
    assert_eq!(
        status.code(),
        Some(e2e_tests::STATUS_PASS),
        "QEMU: {status}"
    );
    let data = dir.path().join("perf.data");
    let o = Command::new(perch_bin())
        .arg("convert")
        .arg(&capture)
        .arg("--image")
        .arg(runtime_elf())
        .arg("--appliance")
        .arg(&manifest)
        .arg("--buildid-cache")
        .arg("-o")
        .arg(&data)
        .env("HOME", &home)
        .env_remove("PERF_BUILDID_DIR")
        .output()
        .expect("running perch convert");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "perch convert: {err}");
    let script = perf(&home, &data, &["script", "-G", "-F", "comm,pid,ip,sym,dso"]);
    assert_eq!(script.stderr.trim(), "", "perf script warned");
    let own = std::fs::canonicalize(&program)
        .expect("the program's path")
        .display()
        .to_string();
    let samples = script_samples(&script.stdout);
    let user: Vec<&ScriptSample> = samples.iter().filter(|s| s.user()).collect();
    assert!(user.len() > 20, "{} user samples", user.len());
    assert!(
        user.iter()
            .all(|s| s.dso == own && !s.sym.contains("[unknown]")),
        "{user:?}"
    );
    assert!(user.iter().any(|s| s.sym == "check_file"), "{user:?}");
}

/// As a new user after `cargo xtask install`: from another directory, with
/// a fresh HOME and neither --image nor $PERCH_IMAGE, `perch record --
/// ./prog` on a static C program boots the runtime shipped with perch
/// (here the build tree's, beside target/debug), writes perf.data, and a
/// plain `perf report` names the program's functions (sampled at 10 kHz:
/// at the default 1 kHz the run has about 40 samples, and a function with a
/// few percent of the time can go unsampled). A stale --image is named in a
/// warning.
#[test]
fn record_with_no_image_from_another_directory() {
    if !qemu_present() || !perf_present() {
        return;
    }
    let shipped = runtime_elf();
    let exe = c_program("hotspots", CBuild::Glibc);
    let dir = tempfile::tempdir().expect("temporary directory");
    let home = dir.path().join("home");
    std::fs::create_dir(&home).expect("creating HOME");
    std::fs::copy(&exe, dir.path().join("prog")).expect("copying the program");
    let o = Command::new(perch_bin())
        .args([
            "record",
            "--icount",
            "--freq",
            "10000",
            "--timeout",
            "240",
            "--",
            "./prog",
            "300",
        ])
        .current_dir(dir.path())
        .env("HOME", &home)
        .env_remove("PERF_BUILDID_DIR")
        .env_remove("PERCH_IMAGE")
        .stdin(Stdio::null())
        .output()
        .expect("running perch record");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "perch record failed:\n{err}");
    assert!(dir.path().join("perf.data").is_file(), "{err}");
    assert!(
        err.contains("open it with: perf report -i perf.data "),
        "{err}"
    );
    assert!(!err.contains("runtime shipped"), "{err}");
    let report = Command::new("perf")
        .args(["report", "--stdio"])
        .current_dir(dir.path())
        .env("HOME", &home)
        .env("PAGER", "cat")
        .env_remove("PERF_BUILDID_DIR")
        .stdin(Stdio::null())
        .output()
        .expect("running perf report");
    let text = String::from_utf8_lossy(&report.stdout);
    assert_eq!(report.status.code(), Some(0), "{text}");
    for f in ["crc_bytes", "sieve", "matmul"] {
        assert!(text.contains(f), "perf report does not name {f}:\n{text}");
    }
    // perch --version names the runtime it boots.
    let v = Command::new(perch_bin())
        .arg("--version")
        .output()
        .expect("perch --version");
    let v = String::from_utf8_lossy(&v.stdout);
    let id: String = kcore_build_id(&std::fs::read(&shipped).expect("reading the runtime"))
        .expect("the runtime has a build-id")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert!(v.contains(&format!("(build-id {id})")), "{v}");
    // Another runtime build given with --image is named as such (and
    // booted: the QEMU here is missing, so the run stops right there).
    let stale = workspace_fixture("host-tool/tests/fixtures/other.elf");
    let o = Command::new(perch_bin())
        .args(["record", "--qemu", "/nonexistent/qemu", "--image"])
        .arg(&stale)
        .args(["--", "./prog", "1"])
        .current_dir(dir.path())
        .env("HOME", &home)
        .output()
        .expect("running perch record");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("not that of the runtime shipped with this perch")
            && err.contains(&format!("build-id {id}")),
        "{err}"
    );
    assert_eq!(o.status.code(), Some(5), "{err}");
}

/// A file of the workspace.
fn workspace_fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}
