//! A shell script inside the appliance: Debian's static busybox runs
//! `tests/programs/sh/pipeline.sh` (pipes, command substitution, subshells,
//! redirections, a while-read loop over a pipe, background jobs and `wait`,
//! file copies, a trap), every command a fork and an execve of busybox,
//! and prints what it prints natively; a recording names busybox's
//! functions under each process the script made.
#![forbid(unsafe_code)]

use e2e_tests::programs::{
    Program, appliance, data_files, run_appliance, run_native, static_busybox,
};
use e2e_tests::{qemu_and_perf_present, qemu_present, record, run_perf};
use linux_perf_data::linux_perf_event_reader::EventRecord;
use linux_perf_data::{PerfFileReader, PerfFileRecord};
use std::path::Path;
use std::time::Duration;

const SCRIPT: &str = include_str!("../programs/sh/pipeline.sh");

/// How many COMM records a perf.data file holds.
fn comm_records(data: &Path) -> usize {
    let reader = std::io::BufReader::new(std::fs::File::open(data).expect("open perf.data"));
    let PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = PerfFileReader::parse_file(reader).expect("linux-perf-data parses the file");
    let mut n = 0;
    while let Some(r) = record_iter.next_record(&mut perf_file).expect("a record") {
        if let PerfFileRecord::EventRecord { record, .. } = r
            && matches!(record.parse(), Ok(EventRecord::Comm(_)))
        {
            n += 1;
        }
    }
    n
}

#[test]
fn busybox_runs_a_script_as_it_runs_natively() {
    let Some(bb) = static_busybox() else {
        return;
    };
    let mut p = Program::new(bb, "busybox", &["sh", "pipeline.sh"], &[]);
    p.spec.cwd = "/data".into();
    let mut files = data_files();
    files.push(("data/pipeline.sh".into(), SCRIPT.as_bytes().to_vec()));
    let native = run_native(bb, &p.spec, &files, Duration::from_secs(60));
    let out = native.out();
    for needle in [
        "start in data",
        "substitution: nested deeper",
        "DLROW ,OLLEH",
        "subshell status 3",
        "fruit: apple (5)",
        "total 15",
        "fast job status 5",
        "slow job status 7",
        "sum 500500",
        "copies agree",
        "done",
        "trap on exit",
    ] {
        assert!(out.contains(needle), "native run lacks {needle:?}:\n{out}");
    }
    if !qemu_present() {
        return;
    }
    let app = appliance(std::slice::from_ref(&p)).file("data/pipeline.sh", SCRIPT);
    let run = run_appliance(&app, "duration=60000", Duration::from_secs(120));
    let t = run.transcript();
    let guest = run.console.process("busybox");
    assert_eq!(guest.out(), out, "stdout differs from the native run:\n{t}");
    assert_eq!(
        String::from_utf8_lossy(&guest.stderr),
        String::from_utf8_lossy(&native.stderr),
        "{t}"
    );
    assert_eq!(guest.end, native.end, "{t}");
    // Every call busybox made is implemented (its cat and cp copy with
    // sendfile).
    assert_eq!(run.console.unknown, Some(vec![]), "{t}");
}

/// `perch record -- busybox sh SCRIPT`: every process the shell made is
/// named in the profile, and perf names busybox's code from its build-id.
#[test]
fn a_recorded_script_shows_every_process_it_made() {
    let Some(bb) = static_busybox() else {
        return;
    };
    if !qemu_and_perf_present() {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let script = dir.path().join("pipeline.sh");
    std::fs::write(&script, SCRIPT).expect("writing the script");
    let file = format!("{}:/pipeline.sh", script.display());
    let exe = bb.to_str().expect("a UTF-8 path");
    let rec = record(&[
        "--freq",
        "10000",
        "--file",
        &file,
        "--",
        exe,
        "sh",
        "/pipeline.sh",
    ]);
    let err = &rec.stderr;
    assert_eq!(rec.status, Some(0), "perch record failed:\n{err}");
    assert!(rec.stdout.contains("sum 500500"), "{}\n{err}", rec.stdout);
    // Each process the script made (some forty) is named by a COMM
    // record, though pids are reused once reaped (after their EXIT).
    let processes = err
        .lines()
        .filter(|l| l.starts_with("perch: busybox (pid ") && l.contains(") exited with status"))
        .count();
    assert!(processes >= 30, "{processes} processes:\n{err}");
    let comms = comm_records(&rec.data);
    assert!(
        comms >= processes,
        "{comms} COMM records for {processes} processes:\n{err}"
    );
    let script = run_perf(&rec, &["script", "-F", "comm,pid,sym"], &[]);
    assert!(
        script
            .lines()
            .any(|l| l.contains("busybox") && !l.contains("[unknown]")),
        "no busybox symbol named:\n{script}"
    );
}
