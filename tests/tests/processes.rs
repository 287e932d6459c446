//! Processes that make processes: `tests/programs/c/fork.c` forks four workers that
//! compute, report up a shared pipe and end each their own way (exit statuses, a
//! SIGTERM its parent sends while it waits on a second pipe), and reaps them with
//! `waitpid` and `waitid`.
//! Built with glibc (64- and 32-bit) and musl, it prints under the runtime exactly
//! what it prints natively and ends the same way; and a recording gives each worker
//! its own pid, with its samples named by the program's symbols.
//!
//! `tests/programs/c/exec.c` forks workers that execve `execwork` (one of
//! them the other ABI's build) with their output in pipes, reaps them with
//! wait4, and runs what cannot run and a script it writes: the same lines
//! as natively, in both ABIs; a recording names each exec'd program.
//! `tests/programs/go/spawn` starts busybox with Go's `os/exec`
//! (CLONE_VFORK | CLONE_VM, pipes, wait4) and prints what it prints
//! natively.
#![forbid(unsafe_code)]

use e2e_tests::programs::{
    CBuild, End, Program, appliance, assert_same_as_native, c_program_with, data_files, go_program,
    run_appliance, run_native, static_busybox,
};
use e2e_tests::{perf_present, qemu_and_perf_present, qemu_present, record, run_perf};
use linux_perf_data::linux_perf_event_reader::EventRecord;
use linux_perf_data::{PerfFileReader, PerfFileRecord};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

/// A run that ends by itself; the duration is only a backstop.
const CMDLINE: &str = "duration=60000";
const TIMEOUT: Duration = Duration::from_secs(120);
const WORKERS: usize = 4;

fn fork_c(build: CBuild) -> PathBuf {
    c_program_with("fork", build, &["-fno-omit-frame-pointer"], "")
}

/// The native run did what the test relies on: every worker's line, every end as
/// the program arranged it, `fork done`, status 0.
fn assert_native_forks_work(p: &Program) {
    let native = p.native();
    let out = native.out();
    for w in 0..WORKERS {
        assert!(
            out.contains(&format!("worker {w}: ")) && !out.contains("NOT THE PARENT"),
            "native run lacks worker {w}:\n{out}"
        );
    }
    for needle in [
        "waitpid WNOHANG on a waiting worker: 0",
        "waitid: code 1, status 1",
        "kill: 0",
        "worker 2 exited with status 3",
        "worker 3 killed by signal 15",
        "wait with no child left: -1",
        "parent's global: 1",
        "parent's pipe words: -7 -7",
        "shared page: 0xf",
        "SIGCHLD came: yes",
        "fork done",
    ] {
        assert!(out.contains(needle), "native run lacks {needle:?}:\n{out}");
    }
    assert_eq!(native.end, Some(End::Exited(0)), "native run:\n{out}");
}

fn check(build: CBuild, name: &str) {
    let p = Program::new(&fork_c(build), name, &["200000"], &[]);
    assert_native_forks_work(&p);
    if !qemu_present() {
        return;
    }
    assert_same_as_native(
        std::slice::from_ref(&p),
        CMDLINE,
        TIMEOUT,
        &["fork", "vfork", "clone", "wait4", "waitpid", "waitid"],
    );
}

#[test]
fn c_glibc_forks_match_their_native_run() {
    check(CBuild::Glibc, "fork-glibc");
}

#[test]
fn c_glibc_i386_forks_match_their_native_run() {
    check(CBuild::Glibc32, "fork-glibc32");
}

#[test]
fn c_musl_forks_match_their_native_run() {
    check(CBuild::Musl, "fork-musl");
}

/// Samples by pid, and the pids a COMM record names, in a perf.data file.
fn samples_and_comms(data: &std::path::Path) -> (BTreeMap<i32, u64>, BTreeSet<i32>) {
    let reader = std::io::BufReader::new(std::fs::File::open(data).expect("open perf.data"));
    let PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = PerfFileReader::parse_file(reader).expect("linux-perf-data parses the file");
    let (mut samples, mut comms) = (BTreeMap::new(), BTreeSet::new());
    while let Some(r) = record_iter.next_record(&mut perf_file).expect("a record") {
        let PerfFileRecord::EventRecord { record, .. } = r else {
            continue;
        };
        match record.parse() {
            Ok(EventRecord::Sample(s)) => {
                *samples.entry(s.pid.expect("a sample's pid")).or_default() += 1;
            }
            Ok(EventRecord::Comm(c)) => {
                comms.insert(c.pid);
            }
            _ => {}
        }
    }
    (samples, comms)
}

/// Each worker is its own process in the profile: four pids besides the parent's,
/// each named by a COMM record, each with samples, and `perf report` names the
/// workers' hot function, `work`, under each of them.
#[test]
fn each_forked_worker_is_profiled_under_its_own_pid() {
    if !qemu_present() {
        return;
    }
    let exe = fork_c(CBuild::Glibc);
    let exe = exe.to_str().expect("a UTF-8 path");
    let rec = record(&["--freq", "10000", "--", exe, "3000000"]);
    let err = &rec.stderr;
    assert_eq!(rec.status, Some(0), "perch record failed:\n{err}");
    assert!(rec.stdout.contains("fork done"), "{}\n{err}", rec.stdout);
    let (samples, comms) = samples_and_comms(&rec.data);
    let workers: Vec<i32> = samples
        .iter()
        .filter(|&(&pid, &n)| pid > 1 && n >= 20)
        .map(|(&pid, _)| pid)
        .collect();
    assert_eq!(
        workers.len(),
        WORKERS,
        "workers with samples: {samples:?}\n{err}"
    );
    for pid in &workers {
        assert!(comms.contains(pid), "no COMM for pid {pid}: {comms:?}");
    }
    if perf_present() {
        let report = run_perf(
            &rec,
            &["report", "--stdio", "--no-children", "--sort", "pid,sym"],
            &[],
        );
        let named: BTreeSet<&str> = report
            .lines()
            .filter(|l| !l.starts_with('#') && l.contains("[.] work"))
            .filter_map(|l| l.split_whitespace().nth(1))
            .collect();
        assert_eq!(named.len(), WORKERS, "{report}");
    }
}

/// The exec test's parent and the two `execwork` builds it runs: its own
/// ABI's at `bin/execwork`, the other's at `bin/execwork-other`.
fn exec_programs(build: CBuild) -> (Program, Vec<(String, Vec<u8>)>) {
    let other = match build {
        CBuild::Glibc32 => CBuild::Glibc,
        _ => CBuild::Glibc32,
    };
    let flags = ["-fno-omit-frame-pointer"];
    let parent = c_program_with("exec", build, &flags, "");
    let read = |b| std::fs::read(c_program_with("execwork", b, &flags, "")).expect("execwork");
    let mut files = data_files();
    files.push(("bin/execwork".into(), read(build)));
    files.push(("bin/execwork-other".into(), read(other)));
    let mut p = Program::new(&parent, "exec", &["200000"], &[]);
    p.spec.cwd = "/data".into();
    (p, files)
}

fn exec_check(build: CBuild) {
    let (p, files) = exec_programs(build);
    let native = run_native(&p.exe, &p.spec, &files, Duration::from_secs(60));
    let out = native.out();
    for needle in [
        "worker 0 said: execwork w0: fd 3 open, fd 4 closed",
        "worker 3 said: execwork: WORKER=3",
        "worker 3: exit status 13",
        "missing: exit status 2",
        "directory: exit status 13",
        "corrupt: exit status 8",
        "script said: execwork: argc 5: [script] [./run.sh] [100] [7]",
        "script: exit status 100",
        "spawned said: execwork spawned: ",
        "spawned: exit status 21",
        "vfork: the child's write is seen, exit status 22",
        "exec done",
    ] {
        assert!(out.contains(needle), "native run lacks {needle:?}:\n{out}");
    }
    assert_eq!(native.end, Some(End::Exited(0)), "native run:\n{out}");
    if !qemu_present() {
        return;
    }
    let mut app = appliance(std::slice::from_ref(&p));
    for (path, bytes) in &files[files.len() - 2..] {
        app = app.file(path, bytes.clone());
    }
    let run = run_appliance(&app, CMDLINE, TIMEOUT);
    let t = run.transcript();
    let guest = run.console.process("exec");
    assert_eq!(guest.out(), out, "stdout differs from the native run:\n{t}");
    assert_eq!(guest.end, native.end, "{t}");
}

#[test]
fn c_glibc_execs_match_their_native_run() {
    exec_check(CBuild::Glibc);
}

#[test]
fn c_glibc_i386_execs_match_their_native_run() {
    exec_check(CBuild::Glibc32);
}

#[test]
fn c_musl_execs_match_their_native_run() {
    exec_check(CBuild::Musl);
}

/// `perch record` of the exec test: each fork is a PERF_RECORD_FORK, each
/// execve a COMM with perf's exec flag naming the new program, and `perf
/// report --sort comm,sym` names `crunch` under both exec'd programs, each
/// symbolised from its own file (one of them the other ABI's).
#[test]
fn each_execd_program_is_profiled_under_its_own_name_and_symbols() {
    if !qemu_and_perf_present() {
        return;
    }
    let (p, files) = exec_programs(CBuild::Glibc);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut args: Vec<String> = vec!["--freq".into(), "10000".into()];
    for (guest, bytes) in &files[files.len() - 2..] {
        let host = dir.path().join(guest.replace('/', "_"));
        std::fs::write(&host, bytes).expect("writing a program");
        args.extend(["--file".into(), format!("{}:/{guest}", host.display())]);
    }
    let (_, input) = files
        .iter()
        .find(|(g, _)| g == "data/input.txt")
        .expect("the input file");
    let host = dir.path().join("input.txt");
    std::fs::write(&host, input).expect("writing the input");
    args.extend(["--file".into(), format!("{}:/input.txt", host.display())]);
    args.extend([
        "--".into(),
        p.exe.to_str().expect("a UTF-8 path").into(),
        "2000000".into(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let rec = record(&args);
    let err = &rec.stderr;
    assert_eq!(rec.status, Some(0), "perch record failed:\n{err}");
    assert!(rec.stdout.contains("exec done"), "{}\n{err}", rec.stdout);
    let events = run_perf(&rec, &["script", "--show-task-events"], &[]);
    let forks = events
        .lines()
        .filter(|l| l.contains("PERF_RECORD_FORK("))
        .count();
    // Four workers, posix_spawn, vfork, four children whose execve fails
    // (missing, directory, not executable, corrupt), the script.
    assert_eq!(forks, 11, "FORK records:\n{events}");
    for comm in ["execwork", "execwork-other"] {
        assert!(
            events
                .lines()
                .any(|l| l.contains(&format!("PERF_RECORD_COMM exec: {comm}:"))),
            "no exec COMM for {comm}:\n{events}"
        );
    }
    let report = run_perf(
        &rec,
        &["report", "--stdio", "--no-children", "--sort", "comm,sym"],
        &[],
    );
    for comm in ["execwork", "execwork-other"] {
        assert!(
            report.lines().any(|l| {
                let mut w = l.split_whitespace();
                w.nth(1) == Some(comm) && l.contains("[.] crunch")
            }),
            "{comm} has no crunch:\n{report}"
        );
    }
}

#[test]
fn go_os_exec_matches_its_native_run() {
    let Some(bb) = static_busybox() else {
        return;
    };
    let p = Program::new(&go_program("spawn"), "spawn", &[], &[]);
    let native = p.native();
    let out = native.out();
    assert!(
        out.contains("output: \"hello from a child\\n\", error: <nil>")
            && out.contains("exit: exit status 3, code 3")
            && out.contains("missing: not found true")
            && out.ends_with("spawn done\n"),
        "native run:\n{out}"
    );
    if !qemu_present() {
        return;
    }
    let app = appliance(std::slice::from_ref(&p)).file("bin/busybox", bb);
    let run = run_appliance(&app, CMDLINE, TIMEOUT);
    let t = run.transcript();
    let guest = run.console.process("spawn");
    assert_eq!(guest.out(), out, "stdout differs from the native run:\n{t}");
    assert_eq!(guest.end, native.end, "{t}");
}
