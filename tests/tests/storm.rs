//! The NMI storm: under `-icount shift=0,sleep=off` (one instruction = 1 ns of
//! virtual time) the NMI clock fires at 1 MHz, an NMI every 1,000 instructions
//! (the HPET's timer 0: the PIT stops at 596 kHz), for more than 10 s of virtual
//! time while an appliance of programs (`tests/programs/c/storm.c`, 64-bit and
//! i386) make system calls, switch, take demand faults, compute, exit, get
//! killed, and run four threads that hand a token round through futexes. The runtime must not crash; every program prints exactly what it prints
//! natively; End's counts add up exactly (taken = delivered + lost) and perf.data
//! holds every delivered sample and, in LOST_SAMPLES records, every lost one.
//! Throttling (`max_rate=`, perf's default 100,000/s) suppresses most overflows at
//! this rate: those count as lost.

#![forbid(unsafe_code)]

use e2e_tests::programs::{CBuild, End, Program, appliance, c_program};
use e2e_tests::{qemu_present, record_for, stat_numbers};
use std::time::Instant;

/// NMI rate.
const FREQ: &str = "1000000";
/// The throttle: samples per second delivered (the rest is suppressed and counted
/// lost). Low enough that the serial line keeps up with the samples and the
/// programs' console output (in wire mode the console shares the stream).
const MAX_RATE: &str = "2000";
/// The backstop: the programs end well before it (about 11 s of virtual time).
const DURATION_S: &str = "40";

fn storm(build: CBuild, name: &str, args: &[&str]) -> Program {
    Program::new(&c_program("storm", build), name, args, &[])
}

#[test]
fn an_nmi_every_thousand_instructions_for_ten_virtual_seconds() {
    let _alone = alone();
    storm_on("1", &[]);
}

/// One storm at a time: two machines on the host's two cores change how QEMU
/// interleaves the four-CPU machine's vCPUs with its devices, and with them the
/// counts that test sees.
fn alone() -> std::sync::MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// The same storm on four CPUs: the clock's NMIs reach every CPU (the I/O APIC's
/// broadcast), each CPU samples into its own ring under its own throttle while the
/// programs' threads run on all four, and the counts add up exactly in all. Four
/// CPUs' samples fill the console device faster than QEMU empties it in real time
/// while the guest runs on instruction time, so frames wait in a 64 MiB flight
/// recorder instead of failing to be written (which perf.data would count as lost
/// on the wire, not as the samples delivered).
///
/// Under `-icount` QEMU runs the four vCPUs in turns on one host thread, and a CPU
/// takes the clock's NMIs only in its own turns: the NMIs the CPUs take together
/// (12 to 23 million in runs here) and each program's share of the samples (a CPU
/// keeps 2 per millisecond of virtual time) follow QEMU's turns, not the programs.
/// So this storm asks for what does not depend on them: no crash, every program's
/// output, exact counts on the target and in perf.data, and the programs sampled.
#[test]
fn the_storm_on_four_cpus() {
    let _alone = alone();
    storm_on("4", &["--buffer", "64"]);
}

fn storm_on(cpus: &str, extra: &[&str]) {
    let g = CBuild::Glibc;
    let programs = [
        storm(g, "sys", &["sys", "13500"]),
        storm(CBuild::Glibc32, "sys32", &["sys", "13500"]),
        storm(g, "fault", &["fault", "18000"]),
        storm(g, "compute", &["compute", "330000"]),
        storm(g, "exit-early", &["exit", "20000", "7"]),
        storm(g, "exit-late", &["exit", "220000", "0"]),
        storm(g, "die-early", &["die", "10000"]),
        storm(g, "die-late", &["die", "180000"]),
        storm(g, "threads", &["threads", "5000"]),
        storm(CBuild::Glibc32, "threads32", &["threads", "5000"]),
    ];
    let natives: Vec<_> = programs.iter().map(Program::native).collect();
    for (p, n) in programs.iter().zip(&natives) {
        assert!(
            n.out().contains("checksum"),
            "{} natively: {}",
            p.spec.name,
            n.out()
        );
    }
    if !qemu_present() {
        return;
    }
    let dir = tempfile::tempdir().expect("temporary directory");
    let archive = dir.path().join("app.cpio");
    appliance(&programs)
        .write_to(&archive)
        .expect("packing the appliance");
    let archive = archive.display().to_string();
    let started = Instant::now();
    let mut args = vec![
        "--cpus",
        cpus,
        "--freq",
        FREQ,
        "--max-rate",
        MAX_RATE,
        "--duration",
        DURATION_S,
        "--qemu-arg",
        "-initrd",
        "--qemu-arg",
        &archive,
        "--qemu-arg",
        "-m",
        "--qemu-arg",
        "1G",
    ];
    args.extend_from_slice(extra);
    let rec = record_for(600, &args);
    let wall = started.elapsed();
    let err = &rec.stderr;
    eprintln!("storm: {:.1} s wall", wall.as_secs_f64());
    assert_eq!(rec.status, Some(0), "perch record failed:\n{err}");
    assert!(!err.contains("RUNTIME"), "the runtime crashed:\n{err}");
    assert!(
        err.contains("HPET timer 0") && err.contains("at 1000000 Hz (divisor 100, 1000000.000 Hz)"),
        "the NMI clock is not at 1 MHz:\n{err}"
    );
    assert!(
        err.contains("run ended: all processes exited"),
        "the run did not end with the programs:\n{err}"
    );
    // Each program's output, line by line, as the console tagged it (perch shows
    // the target's log lines as `target: LEVEL LINE`).
    let log: String = err
        .lines()
        .filter_map(|l| l.strip_prefix("target: "))
        .map(|l| l.split_once(' ').map_or(l, |(_, rest)| rest))
        .flat_map(|l| [l, "\n"])
        .collect();
    let console = e2e_tests::programs::Console::parse(log.as_bytes());
    for (p, n) in programs.iter().zip(&natives) {
        let g = console.process(&p.spec.name);
        assert_eq!(g.out(), n.out(), "{}: output differs:\n{err}", p.spec.name);
        assert_eq!(
            g.end.as_ref().map(End::without_reason),
            n.end,
            "{}: ends differently:\n{err}",
            p.spec.name
        );
    }
    let end = stat_numbers(&rec.capture, "end: taken ");
    let (taken, delivered, lost, throttled) = (end[0], end[1], end[2], end[3]);
    eprintln!("storm: taken {taken} = delivered {delivered} + lost {lost}, throttled {throttled}");
    assert_eq!(taken, delivered + lost, "End's counts do not add up");
    // 10 s at 1 MHz on one CPU; on four, about one NMI a microsecond of virtual
    // time between them (see `the_storm_on_four_cpus`), at least half of that.
    let least = if cpus == "1" { 10_000_000 } else { 5_000_000 };
    assert!(
        taken >= least,
        "only {taken} NMIs taken on {cpus} CPU(s), under {least}"
    );
    // The throttle lets at least 2,000 a second through.
    assert!(delivered >= 20_000, "only {delivered} samples delivered");
    // perf.data: every delivered sample, and LOST_SAMPLES for the rest.
    let reader = std::io::BufReader::new(std::fs::File::open(&rec.data).expect("perf.data"));
    let linux_perf_data::PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = linux_perf_data::PerfFileReader::parse_file(reader).expect("perf.data parses");
    let (mut samples, mut lost_records) = (0u64, 0u64);
    // Samples by pid.
    let mut pids = std::collections::BTreeMap::<i32, u64>::new();
    while let Some(r) = record_iter.next_record(&mut perf_file).expect("a record") {
        let linux_perf_data::PerfFileRecord::EventRecord { record, .. } = r else {
            continue;
        };
        // PERF_RECORD_LOST_SAMPLES: u64 lost, then the sample id.
        if record.record_type.0 == 13 {
            let body = record.data.as_slice();
            let lost = u64::from_le_bytes(body[..8].try_into().expect("8 bytes"));
            lost_records += lost;
            continue;
        }
        if let Ok(linux_perf_data::linux_perf_event_reader::EventRecord::Sample(s)) = record.parse()
        {
            samples += 1;
            if let Some(p) = s.pid {
                *pids.entry(p).or_default() += 1;
            }
        }
    }
    eprintln!("storm: perf.data: {samples} samples, LOST_SAMPLES {lost_records}");
    eprintln!("storm: samples by pid: {pids:?}");
    assert_eq!(samples, delivered, "perf.data holds every delivered sample");
    assert_eq!(
        samples + lost_records,
        taken,
        "perf.data's samples and LOST_SAMPLES add up to End's taken"
    );
    if cpus == "1" {
        for pid in 1..=programs.len() as i32 {
            assert!(
                pids.contains_key(&pid),
                "no sample of pid {pid} (samples by pid: {pids:?}):\n{err}"
            );
        }
    } else {
        let of_programs: u64 = pids.iter().filter(|(p, _)| **p != 0).map(|(_, n)| n).sum();
        assert!(
            of_programs * 20 >= samples,
            "the programs hold {of_programs} of {samples} samples (by pid: {pids:?}):\n{err}"
        );
    }
}
