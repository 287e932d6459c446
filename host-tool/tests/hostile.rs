//! The `perch` binary against hostile input: concatenated and restarted
//! captures, outputs that are inputs, failed runs over existing files,
//! pipes, values the runtime cannot use, silent sources, damaged Task
//! records and images that do not fit. Each test guards one defect.
#![forbid(unsafe_code)]

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::fixture;
use host_tool::image::Image;
use host_tool::synth::{SynthConfig, write_capture};
use sampler::wire::{self, Encoder, Record};

struct Run {
    code: i32,
    stderr: String,
    stdout: String,
}

fn finish(out: std::process::Output) -> Run {
    let r = Run {
        code: out.status.code().unwrap_or(-1),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
    };
    assert!(
        !r.stderr.contains("panicked"),
        "perch panicked: {}",
        r.stderr
    );
    r
}

fn perch(args: &[&str]) -> Run {
    finish(
        Command::new(env!("CARGO_BIN_EXE_perch"))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap(),
    )
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn image() -> Image {
    Image::open(&fixture("appliance.elf")).unwrap()
}

/// The bytes of a synthetic capture over the fixture image.
fn capture_bytes(cfg: &SynthConfig) -> Vec<u8> {
    let mut v = Vec::new();
    write_capture(Some(&image()), cfg, &mut v).unwrap();
    v
}

fn synth(samples: u64, end: bool) -> SynthConfig {
    SynthConfig {
        samples,
        end,
        ..Default::default()
    }
}

// ---- defect 4: a failed run keeps the old output ----

/// Regular files directly in `dir`.
fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

/// Failed runs (exit 3, 4, a directory as input) leave an existing output
/// as it was, create none where there was none, and leave no temporary
/// file behind; a good run replaces the file.
#[test]
fn a_failed_run_leaves_no_output_and_keeps_the_old_one() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.bin");
    std::fs::write(&garbage, vec![0x5a; 10_000]).unwrap();
    let cap = dir.path().join("c.bin");
    std::fs::write(&cap, capture_bytes(&synth(50, true))).unwrap();
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let out = dir.path().join("perf.data");
    let svg = dir.path().join("f.svg");
    let other = fixture("other.elf");
    let runs: Vec<(Vec<&str>, i32)> = vec![
        (vec!["convert", s(&garbage), "-o", s(&out)], 3),
        (
            vec!["convert", s(&cap), "--image", s(&other), "-o", s(&out)],
            4,
        ),
        (vec!["record", "--input", s(&garbage), "-o", s(&out)], 3),
        (vec!["flamegraph", s(&garbage), "-o", s(&svg)], 3),
        (
            vec!["flamegraph", s(&cap), "--image", s(&other), "-o", s(&svg)],
            4,
        ),
    ];
    let before = files_in(dir.path());
    for (args, code) in &runs {
        let r = perch(args);
        assert_eq!(r.code, *code, "{args:?}: {}", r.stderr);
        assert_eq!(files_in(dir.path()), before, "{args:?}: an output appeared");
    }
    std::fs::write(&out, b"precious").unwrap();
    std::fs::write(&svg, b"precious").unwrap();
    let before = files_in(dir.path());
    for (args, code) in &runs {
        let r = perch(args);
        assert_eq!(r.code, *code, "{args:?}: {}", r.stderr);
        assert_eq!(std::fs::read(&out).unwrap(), b"precious", "{args:?}");
        assert_eq!(std::fs::read(&svg).unwrap(), b"precious", "{args:?}");
        assert_eq!(files_in(dir.path()), before, "{args:?}: a file was left");
    }
    for cmd in ["convert", "stat", "flamegraph"] {
        let args = if cmd == "stat" {
            vec![cmd, s(&sub)]
        } else {
            vec![cmd, s(&sub), "-o", s(&out)]
        };
        let r = perch(&args);
        assert_eq!(r.code, 1, "{cmd}: {}", r.stderr);
        assert!(r.stderr.contains("is a directory"), "{cmd}: {}", r.stderr);
        assert_eq!(std::fs::read(&out).unwrap(), b"precious", "{cmd}");
        assert!(r.stdout.is_empty(), "{cmd}: {}", r.stdout);
    }
    let r = perch(&["record", "--input", s(&sub), "-o", s(&out)]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("is a directory"), "{}", r.stderr);
    let r = perch(&["convert", s(&cap), "-o", s(&out)]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(&std::fs::read(&out).unwrap()[..8], b"PERFILE2");
    assert_eq!(files_in(dir.path()), before);
}

// ---- defect 2: End ends the stream; a second Hello is a restart ----

/// `perch args` with `input` written to its stdin in `chunk`-byte writes.
fn perch_piped(args: &[&str], input: Vec<u8>, chunk: usize) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_perch"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        for c in input.chunks(chunk) {
            if stdin.write_all(c).is_err() {
                break;
            }
        }
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    finish(out)
}

/// One record as a frame (a fresh encoder: for records with no delta state).
fn frame(rec: &Record) -> Vec<u8> {
    let mut enc: Encoder = Encoder::new(Default::default());
    let mut buf = [0u8; wire::MAX_FRAME];
    let n = enc.encode(rec, &mut buf).unwrap();
    buf[..n].to_vec()
}

/// The sample count of perch's `wrote ...: N samples` line.
fn written_samples(stderr: &str) -> u64 {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("perch: wrote"))
        .unwrap_or_else(|| panic!("no `wrote` line: {stderr}"));
    let after = line.rsplit_once(": ").unwrap().1;
    after.split(' ').next().unwrap().parse().unwrap()
}

/// Two captures glued together: only the first run is converted, the same
/// however the bytes arrive (a file, or a pipe in 1000-byte writes), and
/// what follows End is reported.
#[test]
fn records_after_end_are_not_converted() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = capture_bytes(&synth(500, true));
    bytes.extend(capture_bytes(&synth(300, true)));
    let cap = dir.path().join("two.bin");
    std::fs::write(&cap, &bytes).unwrap();
    let out = dir.path().join("perf.data");
    let img = fixture("appliance.elf");
    let r = perch(&["convert", s(&cap), "--image", s(&img), "-o", s(&out)]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(written_samples(&r.stderr), 500, "{}", r.stderr);
    assert!(r.stderr.contains("after the End record"), "{}", r.stderr);
    for chunk in [1000, 7, 1 << 16] {
        let r = perch_piped(
            &[
                "record",
                "--input",
                "/dev/stdin",
                "--image",
                s(&img),
                "-o",
                s(&out),
            ],
            bytes.clone(),
            chunk,
        );
        assert_eq!(r.code, 0, "chunk {chunk}: {}", r.stderr);
        assert_eq!(
            written_samples(&r.stderr),
            500,
            "chunk {chunk}: {}",
            r.stderr
        );
    }
    let r = perch(&["stat", s(&cap)]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("samples: 500 "), "{}", r.stdout);
}

/// A run that restarts (a second Hello, no End before it) is stopped at
/// the restart, with a message and exit 7.
#[test]
fn a_second_hello_is_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = capture_bytes(&synth(300, false));
    bytes.extend(capture_bytes(&synth(200, true)));
    let cap = dir.path().join("restart.bin");
    std::fs::write(&cap, &bytes).unwrap();
    let out = dir.path().join("perf.data");
    let img = fixture("appliance.elf");
    let r = perch(&["convert", s(&cap), "--image", s(&img), "-o", s(&out)]);
    assert_eq!(r.code, 7, "{}", r.stderr);
    assert!(r.stderr.contains("restarted"), "{}", r.stderr);
    assert_eq!(written_samples(&r.stderr), 300, "{}", r.stderr);
    let r = perch(&["stat", s(&cap)]);
    assert!(r.stdout.contains("samples: 300 "), "{}", r.stdout);
    assert!(r.stdout.contains("restarted"), "{}", r.stdout);
}

// ---- defect 11: a host that joins late ----

/// The target repeats Hello and its Task records: an intact stream with
/// repetitions converts every sample, names the task once and is not a
/// restart.
#[test]
fn repeated_hellos_are_not_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = SynthConfig {
        repeat_every: 100,
        ..synth(1000, true)
    };
    let cap = dir.path().join("repeats.bin");
    std::fs::write(&cap, capture_bytes(&cfg)).unwrap();
    let out = dir.path().join("perf.data");
    let img = fixture("appliance.elf");
    let r = perch(&["convert", s(&cap), "--image", s(&img), "-o", s(&out)]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(written_samples(&r.stderr), 1000, "{}", r.stderr);
    assert!(!r.stderr.contains("late"), "{}", r.stderr);
    let comms = perf_comms(&out);
    assert_eq!(comms, ["synth64"], "one COMM for the task");
}

/// A capture whose start is missing (the host opened the line late, or
/// noise ate the first frames) is described by the first repetition of
/// Hello in it: everything after the cut converts, the summary says the
/// first Hello was lost, the task keeps its name and code, and the
/// samples before the cut are counted as lost, so samples + lost =
/// delivered.
#[test]
fn a_capture_that_starts_late_converts_from_where_it_starts() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = SynthConfig {
        repeat_every: 100,
        ..synth(1000, true)
    };
    let bytes = capture_bytes(&cfg);
    // Open the line a quarter of the way in, mid-frame.
    let late = &bytes[bytes.len() / 4 + 3..];
    let cap = dir.path().join("late.bin");
    std::fs::write(&cap, late).unwrap();
    let out = dir.path().join("perf.data");
    let img = fixture("appliance.elf");
    let r = perch(&["convert", s(&cap), "--image", s(&img), "-o", s(&out)]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.contains("first Hello was lost"), "{}", r.stderr);
    let written = written_samples(&r.stderr);
    // The samples of the last three quarters, all but the one whose frame
    // the cut went through.
    let stat = perch(&["stat", s(&cap)]);
    assert!(
        stat.stdout.contains(&format!("samples: {written} ")),
        "convert wrote {written}, stat says: {}",
        stat.stdout
    );
    assert!(
        (700..800).contains(&written),
        "{written} samples from the last three quarters: {}",
        r.stderr
    );
    assert_eq!(perf_comms(&out), ["synth64"]);
    let lost = perf_lost_samples(&out);
    assert_eq!(written + lost, 1000, "samples {written} + lost {lost}");
}

/// The COMM names of pid 1 in a perf.data file, in order.
fn perf_comms(path: &Path) -> Vec<String> {
    let (comms, _) = comms_and_lost(path);
    comms
}

/// The samples a perf.data file's LOST_SAMPLES records count.
fn perf_lost_samples(path: &Path) -> u64 {
    comms_and_lost(path).1
}

fn comms_and_lost(path: &Path) -> (Vec<String>, u64) {
    let reader = std::io::BufReader::new(std::fs::File::open(path).unwrap());
    let linux_perf_data::PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = linux_perf_data::PerfFileReader::parse_file(reader).unwrap();
    let (mut comms, mut lost) = (Vec::new(), 0u64);
    while let Some(rec) = record_iter.next_record(&mut perf_file).unwrap() {
        let linux_perf_data::PerfFileRecord::EventRecord { record, .. } = rec else {
            continue;
        };
        if record.record_type.0 == 13 {
            // PERF_RECORD_LOST_SAMPLES: u64 lost, then the sample id.
            let mut n = [0u8; 8];
            record.data.clone().read_exact(&mut n).unwrap();
            lost += u64::from_le_bytes(n);
            continue;
        }
        if let Ok(linux_perf_data::linux_perf_event_reader::EventRecord::Comm(c)) = record.parse()
            && c.pid == 1
        {
            comms.push(String::from_utf8_lossy(&c.name.as_slice()).into_owned());
        }
    }
    (comms, lost)
}

/// A stream holding more samples than its End says were delivered is
/// refused: it is not one run.
#[test]
fn more_samples_than_delivered_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = capture_bytes(&synth(500, false));
    bytes.extend(frame(&Record::End(wire::End {
        time: 1 << 40,
        taken: 400,
        delivered: 400,
        lost: 0,
        throttled: 0,
        frames: 0,
        unknown_syscalls: Default::default(),
    })));
    let cap = dir.path().join("over.bin");
    std::fs::write(&cap, &bytes).unwrap();
    let out = dir.path().join("perf.data");
    let r = perch(&["convert", s(&cap), "-o", s(&out)]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(
        r.stderr.contains("500 samples") && r.stderr.contains("delivered 400"),
        "{}",
        r.stderr
    );
    assert!(!out.exists(), "a refused stream left {}", out.display());
}

// ---- defect 3: an output that is an input ----

/// Every way of naming an input as an output is refused before anything
/// is written, by device and inode (a hard link, a symlink, `./X`).
#[test]
fn an_output_that_is_an_input_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cap = dir.path().join("c.bin");
    let bytes = capture_bytes(&synth(100, true));
    std::fs::write(&cap, &bytes).unwrap();
    let link = dir.path().join("hard.bin");
    std::fs::hard_link(&cap, &link).unwrap();
    let sym = dir.path().join("sym.bin");
    std::os::unix::fs::symlink(&cap, &sym).unwrap();
    let img = fixture("appliance.elf");
    let other = dir.path().join("other.data");
    let cases: Vec<Vec<&str>> = vec![
        vec!["convert", s(&cap), "-o", s(&cap)],
        vec!["convert", s(&cap), "-o", s(&link)],
        vec!["convert", s(&cap), "-o", s(&sym)],
        vec!["convert", s(&cap), "--image", s(&img), "-o", s(&img)],
        vec!["record", "--input", s(&cap), "-o", s(&link)],
        vec![
            "record",
            "--input",
            s(&cap),
            "--save-capture",
            s(&sym),
            "-o",
            s(&other),
        ],
        vec!["flamegraph", s(&cap), "-o", s(&cap)],
        vec![
            "record",
            "--input",
            s(&sym),
            "--save-capture",
            s(&other),
            "-o",
            s(&other),
        ],
    ];
    let img_bytes = std::fs::read(&img).unwrap();
    for args in cases {
        let r = perch(&args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.stderr);
        assert!(
            r.stderr.contains("is also") || r.stderr.contains("same file"),
            "{args:?}: {}",
            r.stderr
        );
        assert_eq!(std::fs::read(&cap).unwrap(), bytes, "{args:?}");
        assert_eq!(std::fs::read(&img).unwrap(), img_bytes, "{args:?}");
        assert!(!other.exists(), "{args:?}");
    }
    // The check must not stop a normal run with an existing output.
    std::fs::write(&other, b"old").unwrap();
    let r = perch(&["convert", s(&cap), "-o", s(&other)]);
    assert_eq!(r.code, 0, "{}", r.stderr);
}

// ---- defect 6: perch stat reads a pipe ----

#[test]
fn stat_reads_a_pipe() {
    let bytes = capture_bytes(&SynthConfig {
        samples: 700,
        lost: 5,
        ..Default::default()
    });
    let r = perch_piped(&["stat", "/dev/stdin"], bytes, 1000);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("samples: 700 "), "{}", r.stdout);
    assert!(r.stdout.contains("lost (target): 5"), "{}", r.stdout);
}

/// A reader that goes away early (`perch stat X | head -1`) ends `stat`
/// quietly, not with a panic.
#[test]
fn stat_into_a_closed_pipe_does_not_panic() {
    let dir = tempfile::tempdir().unwrap();
    let cap = dir.path().join("c.bin");
    std::fs::write(&cap, capture_bytes(&synth(2000, true))).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_perch"))
        .args(["stat", s(&cap)])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let r = finish(child.wait_with_output().unwrap());
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.is_empty(), "{}", r.stderr);
}

// ---- defect 7: values the runtime cannot use ----

#[test]
fn values_the_runtime_cannot_use_are_refused_before_boot() {
    let img = fixture("appliance.elf");
    // A QEMU that would be started only if the values got through.
    for (flag, v, needle) in [
        ("--freq", "0", "--freq"),
        ("--freq", "99999999", "--freq"),
        ("--freq", "5", "--freq"),
        ("--ring", "0", "--ring"),
        ("--ring", "3", "--ring"),
        ("--ring", "512", "--ring"),
        ("--duration", "0.0001", "--duration"),
        ("--duration", "0.0004", "--duration"),
    ] {
        let r = perch(&[
            "record",
            "--image",
            s(&img),
            "--qemu",
            "/nonexistent/qemu",
            flag,
            v,
        ]);
        assert_eq!(r.code, 2, "{flag} {v}: {}", r.stderr);
        assert!(r.stderr.contains(needle), "{flag} {v}: {}", r.stderr);
    }
    // With a capture or a serial line, the options of a boot do nothing:
    // they are refused.
    let dir = tempfile::tempdir().unwrap();
    let cap = dir.path().join("c.bin");
    std::fs::write(&cap, capture_bytes(&synth(10, true))).unwrap();
    for extra in [
        &["--freq", "4000"][..],
        &["--duration", "2"],
        &["--icount"],
        &["--baud", "9600"],
        &["--ring", "16"],
        &["--pmu", "sim"],
        &["--max-rate", "10"],
        &["--cpu-pct", "10"],
        &["--qemu", "qemu-system-x86_64"],
        &["--qemu-arg", "-smp"],
        &["--boot-arg", "slice=5"],
        &["--", "prog"],
    ] {
        let out = dir.path().join("perf.data");
        let mut args = vec!["record", "--input", s(&cap), "-o", s(&out)];
        args.extend_from_slice(extra);
        let r = perch(&args);
        assert_eq!(r.code, 2, "{extra:?}: {}", r.stderr);
        assert!(r.stderr.contains(extra[0]), "{extra:?}: {}", r.stderr);
    }
}

// ---- defect 8: --timeout everywhere ----

/// `--timeout` stops a pipe that never sends End, and a QEMU that never
/// opens its wire socket, near the limit.
#[test]
fn timeout_covers_a_silent_pipe_and_a_qemu_without_its_socket() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("perf.data");
    // A pipe that sends the start of a run and then nothing, but stays open.
    let head = capture_bytes(&synth(20, false));
    let mut child = Command::new(env!("CARGO_BIN_EXE_perch"))
        .args(["record", "--input", "/dev/stdin", "--timeout", "1", "-o"])
        .arg(&out)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&head).unwrap();
    let start = Instant::now();
    let deadline = start + Duration::from_secs(15);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(stdin);
    let r = finish(child.wait_with_output().unwrap());
    assert!(status.is_some(), "perch ignored --timeout on a pipe");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(r.code, 7, "{}", r.stderr);
    assert!(r.stderr.contains("time limit"), "{}", r.stderr);
    assert_eq!(written_samples(&r.stderr), 20, "{}", r.stderr);

    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("skipping the QEMU half: python3 is needed for the stand-in QEMU");
        return;
    }
    let start = Instant::now();
    let o = Command::new(env!("CARGO_BIN_EXE_perch"))
        .args(["record", "--image"])
        .arg(fixture("appliance.elf"))
        .arg("--qemu")
        .arg(fixture("fake-qemu.py"))
        .args(["--timeout", "1", "-o"])
        .arg(&out)
        .env("PERCH_FAKE_ARGS", dir.path().join("args.txt"))
        .env("PERCH_FAKE_NO_SOCKET", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let r = finish(o);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(r.code, 6, "{}", r.stderr);
    assert!(r.stderr.contains("within 1 s"), "{}", r.stderr);
}

// ---- defect 9: flamegraph ----

#[test]
fn flamegraph_of_no_samples_and_of_a_truncated_stream() {
    let dir = tempfile::tempdir().unwrap();
    let img = fixture("appliance.elf");
    let svg = dir.path().join("f.svg");
    let empty = dir.path().join("empty.bin");
    std::fs::write(&empty, capture_bytes(&synth(0, true))).unwrap();
    let r = perch(&["flamegraph", s(&empty), "--image", s(&img), "-o", s(&svg)]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(r.stderr.contains("no samples"), "{}", r.stderr);
    assert!(!svg.exists());

    let cut = dir.path().join("cut.bin");
    let bytes = capture_bytes(&synth(300, true));
    std::fs::write(&cut, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let r = perch(&["flamegraph", s(&cut), "--image", s(&img), "-o", s(&svg)]);
    assert_eq!(r.code, 7, "{}", r.stderr);
    assert!(
        r.stderr.contains("ended before its End record"),
        "{}",
        r.stderr
    );
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<?xml"));
}

// ---- defect 10: messages that name the real problem ----

#[test]
fn image_and_qemu_messages_name_the_real_problem() {
    let dir = tempfile::tempdir().unwrap();
    let cap = dir.path().join("c.bin");
    std::fs::write(&cap, capture_bytes(&synth(10, true))).unwrap();
    let out = dir.path().join("perf.data");
    // Another image, stripped: the build-id is what is wrong.
    let r = perch(&[
        "convert",
        s(&cap),
        "--image",
        s(&fixture("other-stripped.elf")),
        "-o",
        s(&out),
    ]);
    assert_eq!(r.code, 4, "{}", r.stderr);
    assert!(r.stderr.contains("build-id"), "{}", r.stderr);
    assert!(!r.stderr.contains("no executable"), "{}", r.stderr);
    // The right image, stripped: its symbols are missing.
    for cmd in ["convert", "flamegraph"] {
        let r = perch(&[
            cmd,
            s(&cap),
            "--image",
            s(&fixture("appliance-stripped.elf")),
            "-o",
            s(&out),
        ]);
        assert_eq!(r.code, 4, "{cmd}: {}", r.stderr);
        assert!(r.stderr.contains("stripped"), "{cmd}: {}", r.stderr);
        assert!(!r.stderr.contains("no executable"), "{cmd}: {}", r.stderr);
    }
    // A program that is there but is no QEMU.
    let r = perch(&[
        "record",
        "--image",
        s(&fixture("appliance.elf")),
        "--qemu",
        "/bin/false",
        "-o",
        s(&out),
    ]);
    assert_eq!(r.code, 5, "{}", r.stderr);
    assert!(!r.stderr.contains("not found"), "{}", r.stderr);
    assert!(r.stderr.contains("not a working QEMU"), "{}", r.stderr);
    // A directory, and a file without execute permission: said as such,
    // not as "not found (Permission denied)".
    let plain = dir.path().join("plain-file");
    std::fs::write(&plain, "not a program\n").unwrap();
    for (qemu, what) in [
        (dir.path(), "is a directory"),
        (plain.as_path(), "without execute permission (mode 644)"),
    ] {
        let r = perch(&[
            "record",
            "--image",
            s(&fixture("appliance.elf")),
            "--qemu",
            s(qemu),
            "-o",
            s(&out),
        ]);
        assert_eq!(r.code, 5, "{qemu:?}: {}", r.stderr);
        assert!(r.stderr.contains(what), "{qemu:?}: {}", r.stderr);
        assert!(
            r.stderr.contains(&format!("--qemu {}", s(qemu))),
            "{qemu:?}: {}",
            r.stderr
        );
        assert!(!r.stderr.contains("not found"), "{qemu:?}: {}", r.stderr);
        assert!(!r.stderr.contains("denied"), "{qemu:?}: {}", r.stderr);
    }
    assert!(!out.exists(), "nothing was recorded");
}

/// `--baud` sets a serial line's rate: with a QEMU boot it is refused
/// (exit 2, before QEMU starts), as `perch record --help` says.
#[test]
fn baud_without_serial_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("perf.data");
    let img = fixture("appliance.elf");
    for extra in [&[][..], &["--", "prog"]] {
        let mut args = vec![
            "record",
            "--image",
            s(&img),
            "--qemu",
            "/nonexistent/qemu",
            "--baud",
            "9600",
            "-o",
            s(&out),
        ];
        args.extend_from_slice(extra);
        let r = perch(&args);
        assert_eq!(r.code, 2, "{extra:?}: {}", r.stderr);
        assert!(r.stderr.contains("--baud"), "{extra:?}: {}", r.stderr);
        assert!(r.stderr.contains("--serial"), "{extra:?}: {}", r.stderr);
        assert!(
            !r.stderr.contains("/nonexistent"),
            "{extra:?}: {}",
            r.stderr
        );
    }
    // perch top takes the same options.
    let r = perch(&[
        "top",
        "--stdio",
        "--image",
        s(&fixture("appliance.elf")),
        "--qemu",
        "/nonexistent/qemu",
        "--baud",
        "9600",
    ]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("--baud"), "{}", r.stderr);
}

// ---- defect 5 (host part): a damaged Task record ----

/// The capture with its Task frame (the second frame) damaged.
fn without_task_record(cfg: &SynthConfig) -> Vec<u8> {
    let mut bytes = capture_bytes(cfg);
    // Frames end with 0x00: the first is the Hello, the second the Task.
    let ends: Vec<usize> = bytes
        .iter()
        .enumerate()
        .filter(|&(_, &b)| b == 0)
        .map(|(i, _)| i)
        .collect();
    assert_ne!(bytes[0], 0, "the synthetic stream starts with its Hello");
    let (start, end) = (ends[0] + 1, ends[1]);
    bytes[(start + end) / 2] ^= 0x10;
    bytes
}

/// A pid or an address, and a name.
type Named<T> = (T, String);

/// perf.data's COMMs of user tasks (pid, name) and the MMAPs of pid 1
/// (address, file), in file order.
fn comms_and_maps(path: &Path) -> (Vec<Named<u32>>, Vec<Named<u64>>) {
    let reader = std::io::BufReader::new(std::fs::File::open(path).unwrap());
    let linux_perf_data::PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = linux_perf_data::PerfFileReader::parse_file(reader).unwrap();
    let mut comms = Vec::new();
    let mut user_maps = Vec::new();
    while let Some(rec) = record_iter.next_record(&mut perf_file).unwrap() {
        if let linux_perf_data::PerfFileRecord::EventRecord { record, .. } = rec {
            if record.record_type.0 == 13 {
                continue;
            }
            match record.parse().unwrap() {
                linux_perf_data::linux_perf_event_reader::EventRecord::Comm(c) if c.pid != 0 => {
                    comms.push((
                        c.pid as u32,
                        String::from_utf8_lossy(&c.name.as_slice()).into_owned(),
                    ))
                }
                linux_perf_data::linux_perf_event_reader::EventRecord::Mmap(m) if m.pid == 1 => {
                    user_maps.push((
                        m.address,
                        String::from_utf8_lossy(&m.path.as_slice()).into_owned(),
                    ))
                }
                _ => {}
            }
        }
    }
    (comms, user_maps)
}

/// A task whose Task record never arrives is warned about and counted,
/// named `tid-N`, and not mapped onto the image's text (it could be any
/// program): its samples keep their addresses.
#[test]
fn a_lost_task_record_is_warned_about_counted_and_left_unmapped() {
    let dir = tempfile::tempdir().unwrap();
    let cap = dir.path().join("notask.bin");
    std::fs::write(&cap, without_task_record(&synth(400, true))).unwrap();
    let out = dir.path().join("perf.data");
    let img = fixture("appliance.elf");
    let r = perch(&["convert", s(&cap), "--image", s(&img), "-o", s(&out)]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr.contains(
            "400 samples of 1 task whose Task record never arrived (damaged on the wire?): \
             named tid-N, their addresses unresolved"
        ),
        "{}",
        r.stderr
    );
    let (comms, user_maps) = comms_and_maps(&out);
    assert_eq!(comms, vec![(1, "tid-1".to_owned())]);
    assert_eq!(user_maps, vec![], "nothing maps the unknown task's code");
    let r = perch(&["stat", s(&cap)]);
    assert!(
        r.stdout
            .contains("tasks without a Task record: 1 (400 samples;"),
        "{}",
        r.stdout
    );
}

/// When the lost Task record is repeated later in the capture file (the
/// runtime repeats every task's record every few seconds), the task is
/// named and mapped by the repetition from its first sample on, as if
/// the first had arrived.
#[test]
fn a_lost_task_record_is_named_by_its_later_repetition_from_the_first_sample() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = SynthConfig {
        repeat_every: 100,
        ..synth(400, true)
    };
    let intact = dir.path().join("intact.bin");
    std::fs::write(&intact, capture_bytes(&cfg)).unwrap();
    let cap = dir.path().join("notask.bin");
    std::fs::write(&cap, without_task_record(&cfg)).unwrap();
    let img = fixture("appliance.elf");
    let want = dir.path().join("want.data");
    let r = perch(&["convert", s(&intact), "--image", s(&img), "-o", s(&want)]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let out = dir.path().join("perf.data");
    let r = perch(&["convert", s(&cap), "--image", s(&img), "-o", s(&out)]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(!r.stderr.contains("never arrived"), "{}", r.stderr);
    let (comms, user_maps) = comms_and_maps(&out);
    let (want_comms, want_maps) = comms_and_maps(&want);
    assert!(!want_comms.is_empty() && !want_maps.is_empty());
    assert_eq!(comms, want_comms);
    // The image's first page at offset 0 (for hotspot), then its task text.
    assert_eq!(user_maps, want_maps);
    // Every sample resolves as in the intact capture.
    let script = |data: &Path| {
        common::perf(&["script", "-i", s(data), "-F", "comm,tid,ip,sym"]).map(|(out, _)| out)
    };
    if let (Some(got), Some(want)) = (script(&out), script(&want)) {
        assert!(got.lines().count() >= 400, "{got}");
        assert_eq!(got, want);
    }
}

// ---- defect 12: wire losses named as such ----

/// A damaged line's losses are called wire losses in perch's summary, and
/// perf does not blame IO/CPU overload for them, while the counts stay
/// exact.
#[test]
fn wire_losses_are_named_and_perf_does_not_blame_overload() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = capture_bytes(&synth(2000, true));
    let mut next = common::xorshift(0x1234_5678);
    // Flip one byte in each of a few frames past the Hello and Task.
    for _ in 0..5 {
        let pos = 400 + (next() as usize) % (bytes.len() - 800);
        if bytes[pos] != 0 {
            bytes[pos] ^= 0x21;
        }
    }
    let cap = dir.path().join("damaged.bin");
    std::fs::write(&cap, &bytes).unwrap();
    let out = dir.path().join("perf.data");
    let img = fixture("appliance.elf");
    let r = perch(&["convert", s(&cap), "--image", s(&img), "-o", s(&out)]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let samples = written_samples(&r.stderr);
    let lost = 2000 - samples;
    assert!(lost > 0, "{}", r.stderr);
    assert!(
        r.stderr.contains(&format!(
            "{lost} samples were lost on the wire (damaged frames on the line, not an overload)"
        )),
        "{}",
        r.stderr
    );
    let Some((stdout, stderr)) = common::perf(&[
        "report",
        "-i",
        s(&out),
        "--stdio",
        "--stats",
        &format!("--vmlinux={}", s(&img)),
    ]) else {
        return;
    };
    assert!(!stderr.contains("overload"), "{stderr}");
    assert!(!stdout.contains("overload"), "{stdout}");
    assert!(!stdout.contains("LOST events"), "{stdout}");
    let Some((report, _)) = common::perf(&[
        "report",
        "-i",
        s(&out),
        "--stdio",
        &format!("--vmlinux={}", s(&img)),
    ]) else {
        return;
    };
    assert!(
        report.contains(&format!("Total Lost Samples: {lost}")),
        "{report}"
    );
}

/// A thread whose Task record never arrived, of a process whose record
/// did, goes under its process: its COMM is the process's name and no
/// mapping is written for it (perf gives a thread its process's
/// mappings), so its samples resolve in the process's program.
#[test]
fn a_thread_without_its_task_record_goes_under_its_process() {
    use host_tool::convert::{ConvertOptions, Converter};
    use host_tool::model::Item;
    let image = image();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("perf.data");
    let mut conv = Converter::new(
        std::fs::File::create(&out).unwrap(),
        ConvertOptions {
            image: Some(image.clone()),
            cmdline: vec!["perch".into(), "test".into()],
            programs: Default::default(),
            kernel_file: None,
        },
    );
    let demo = common::Demo::PLAIN;
    common::demo_items(&image, demo, |item| {
        let r = match item {
            // pid 1's samples come from its thread 7, which has no record.
            Item::Sample(s) if s.pid == 1 => {
                let mut t = *s;
                t.tid = 7;
                conv.push(&Item::Sample(t))
            }
            _ => conv.push(item),
        };
        r.unwrap();
    });
    let summary = conv.finish().unwrap().1;
    assert_eq!(summary.tasks_without_record, 1);
    assert_eq!(summary.tasks_under_their_process, 1);
    assert!(
        summary
            .warnings
            .iter()
            .any(|w| w.contains("named after their process, under its program")),
        "{:?}",
        summary.warnings
    );
    let (comms, maps) = comms_and_maps(&out);
    assert_eq!(
        comms
            .iter()
            .filter(|c| **c == (1, "app64".to_owned()))
            .count(),
        2,
        "{comms:?}"
    );
    assert!(
        !comms.iter().any(|(_, n)| n.starts_with("tid-")),
        "{comms:?}"
    );
    // Only the process's own mappings (the image's first page and its
    // task text), none added for the thread.
    assert_eq!(maps.len(), 1 + image.user_text.len(), "{maps:?}");
    if let Some((script, _)) = common::perf(&["script", "-i", s(&out), "-F", "tid,ip,sym", "-G"]) {
        let hot = script
            .lines()
            .filter(|l| l.trim_start().starts_with("7 ") && l.contains("hot_alpha"))
            .count();
        assert_eq!(hot as u64, demo.alpha, "{script}");
    }
}
