//! The `perch` binary on good and bad input: exit codes, messages, and
//! never a panic.
#![forbid(unsafe_code)]

mod common;

use std::path::Path;
use std::process::Command;

use common::fixture;
use host_tool::image::Image;
use host_tool::synth::{SynthConfig, write_capture};
use sampler::event::{EventConfig, PmuCaps};
use sampler::wire::{self, CpuId, CpuVendor, Encoder, Record};

struct Run {
    code: i32,
    stderr: String,
    stdout: String,
}

fn perch(args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_perch"))
        .args(args)
        .output()
        .unwrap();
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

fn capture(dir: &Path, name: &str, cfg: &SynthConfig) -> String {
    let image = Image::open(&fixture("appliance.elf")).unwrap();
    let path = dir.join(name);
    let mut f = std::fs::File::create(&path).unwrap();
    write_capture(Some(&image), cfg, &mut f).unwrap();
    path.to_str().unwrap().to_owned()
}

/// A synthetic capture of `samples` samples, `c.bin` in `dir`.
fn samples_capture(dir: &Path, samples: u64) -> String {
    capture(
        dir,
        "c.bin",
        &SynthConfig {
            samples,
            ..Default::default()
        },
    )
}

fn hello_capture(dir: &Path, name: &str, edit: impl FnOnce(&mut wire::Hello)) -> String {
    let cpu = CpuId {
        vendor: CpuVendor::Intel,
        family: 6,
        model: 85,
        stepping: 4,
    };
    let mut h = wire::Hello::new(cpu, PmuCaps::cpu_clock());
    let _ = h.events.push(EventConfig::cpu_clock(0, 1000));
    edit(&mut h);
    let mut enc: Encoder = Encoder::new(Default::default());
    let mut buf = [0u8; wire::MAX_FRAME];
    let n = enc.encode(&Record::Hello(h), &mut buf).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, &buf[..n]).unwrap();
    path.to_str().unwrap().to_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn convert_writes_perf_data_and_reports_counts() {
    let dir = tempfile::tempdir().unwrap();
    let cap = capture(
        dir.path(),
        "c.bin",
        &SynthConfig {
            samples: 500,
            lost: 9,
            ..Default::default()
        },
    );
    let out = dir.path().join("perf.data");
    let img = fixture("appliance.elf");
    let r = perch(&["convert", &cap, "--image", s(&img), "-o", s(&out)]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("500 samples, 9 lost (9 on the target, 0 on the wire)"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("taken 509 = delivered 500 + lost 9"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains(&format!(
            "--vmlinux={}",
            img.canonicalize().unwrap().display()
        )),
        "{}",
        r.stderr
    );
    // perf demangles symbols of the runtime, mapped as the kernel, only
    // when asked to (task symbols are demangled by default).
    assert!(r.stderr.contains("--demangle-kernel"), "{}", r.stderr);
    assert_eq!(&std::fs::read(&out).unwrap()[..8], b"PERFILE2");
}

#[test]
fn stat_counts_tasks_events_losses_and_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let cap = capture(
        dir.path(),
        "c.bin",
        &SynthConfig {
            samples: 1000,
            lost: 3,
            kernel_every: 4,
            ..Default::default()
        },
    );
    let bytes = std::fs::metadata(&cap).unwrap().len();
    let r = perch(&["stat", &cap]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.contains("samples: 1000 (750 user, 250 runtime)"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("synth64"), "{}", r.stdout);
    assert!(r.stdout.contains("cpu-clock"), "{}", r.stdout);
    assert!(r.stdout.contains("lost (target): 3"), "{}", r.stdout);
    assert!(r.stdout.contains("bad frames: 0"), "{}", r.stdout);
    assert!(
        r.stdout
            .contains(&format!("bytes per sample: {:.1}", bytes as f64 / 1000.0)),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout
            .contains("taken 1003 = delivered 1000 + lost 3 (consistent)"),
        "{}",
        r.stdout
    );
}

#[test]
fn damaged_frames_are_counted_and_written_as_lost() {
    let dir = tempfile::tempdir().unwrap();
    let cap = samples_capture(dir.path(), 2000);
    let mut bytes = std::fs::read(&cap).unwrap();
    // Flip a byte inside a frame in the middle of the stream.
    let mid = bytes.len() / 2;
    let pos = (mid..bytes.len())
        .find(|&i| bytes[i] != 0 && bytes[i + 1] != 0)
        .unwrap();
    bytes[pos] ^= 0x55;
    std::fs::write(&cap, &bytes).unwrap();
    let out = dir.path().join("perf.data");
    let r = perch(&[
        "convert",
        &cap,
        "--image",
        s(&fixture("appliance.elf")),
        "-o",
        s(&out),
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    // The damaged sample and any delta samples that depended on it are lost,
    // and the file still adds up to what the target took.
    let line = r.stderr.lines().find(|l| l.contains("wrote")).unwrap();
    let counts = line.split_once("perf.data:").unwrap().1;
    let nums: Vec<u64> = counts
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    let (samples, lost, wire_lost, bad) = (nums[0], nums[1], nums[3], nums[4]);
    assert!(bad >= 1, "{line}");
    assert!(wire_lost >= 1, "{line}");
    assert_eq!(samples + lost, 2000, "{line}");
    assert_eq!(lost, wire_lost, "{line}");
}

#[test]
fn garbage_and_empty_input_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.bin");
    let junk: Vec<u8> = (0..50_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&garbage, junk).unwrap();
    let out = dir.path().join("perf.data");
    let r = perch(&["convert", s(&garbage), "-o", s(&out)]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(r.stderr.contains("not a Perch stream"), "{}", r.stderr);
    let empty = dir.path().join("empty.bin");
    std::fs::write(&empty, b"").unwrap();
    let r = perch(&["convert", s(&empty), "-o", s(&out)]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(r.stderr.contains("empty"), "{}", r.stderr);
    let r = perch(&["stat", s(&garbage)]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    // A console left in text mode is named as such, with its first lines.
    let text = dir.path().join("text.bin");
    std::fs::write(
        &text,
        "perch: runtime booted\nperch: console=wire unsupported\n",
    )
    .unwrap();
    let r = perch(&["convert", s(&text), "-o", s(&out)]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(
        r.stderr.contains("wrote text instead of the wire stream"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("perch: runtime booted"), "{}", r.stderr);
}

#[test]
fn truncated_capture_is_converted_but_flagged() {
    let dir = tempfile::tempdir().unwrap();
    let cap = samples_capture(dir.path(), 300);
    let bytes = std::fs::read(&cap).unwrap();
    std::fs::write(&cap, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let out = dir.path().join("perf.data");
    let r = perch(&[
        "convert",
        &cap,
        "--image",
        s(&fixture("appliance.elf")),
        "-o",
        s(&out),
    ]);
    assert_eq!(r.code, 7, "{}", r.stderr);
    assert!(
        r.stderr.contains("ended before its End record"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("without an End record"), "{}", r.stderr);
    assert_eq!(&std::fs::read(&out).unwrap()[..8], b"PERFILE2");
}

#[test]
fn wrong_protocol_version_and_magic_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("perf.data");
    let v2 = hello_capture(dir.path(), "v2.bin", |h| {
        h.version = wire::PROTOCOL_VERSION + 1
    });
    let r = perch(&["convert", &v2, "-o", s(&out)]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(
        r.stderr
            .contains(&format!("protocol version {}", wire::PROTOCOL_VERSION + 1)),
        "{}",
        r.stderr
    );
    let bad = hello_capture(dir.path(), "magic.bin", |h| h.magic = *b"NOPE");
    let r = perch(&["convert", &bad, "-o", s(&out)]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(r.stderr.contains("not a Perch stream"), "{}", r.stderr);
}

#[test]
fn wrong_or_bad_image_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cap = samples_capture(dir.path(), 10);
    let out = dir.path().join("perf.data");
    let r = perch(&[
        "convert",
        &cap,
        "--image",
        s(&fixture("other.elf")),
        "-o",
        s(&out),
    ]);
    assert_eq!(r.code, 4, "{}", r.stderr);
    assert!(r.stderr.contains("build-id"), "{}", r.stderr);
    let r = perch(&[
        "convert",
        &cap,
        "--image",
        s(&fixture("appliance.S")),
        "-o",
        s(&out),
    ]);
    assert_eq!(r.code, 4, "{}", r.stderr);
    assert!(r.stderr.contains("not a valid ELF"), "{}", r.stderr);
    let r = perch(&[
        "convert",
        &cap,
        "--image",
        "/nonexistent/image.elf",
        "-o",
        s(&out),
    ]);
    assert_eq!(r.code, 4, "{}", r.stderr);
    let r = perch(&[
        "flamegraph",
        &cap,
        "--image",
        s(&fixture("other.elf")),
        "-o",
        s(&dir.path().join("f.svg")),
    ]);
    assert_eq!(r.code, 4, "{}", r.stderr);
}

#[test]
fn missing_qemu_names_the_install_command() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("perf.data");
    let r = perch(&[
        "record",
        "--image",
        s(&fixture("appliance.elf")),
        "--qemu",
        "/nonexistent/qemu-system-x86_64",
        "-o",
        s(&out),
    ]);
    assert_eq!(r.code, 5, "{}", r.stderr);
    assert!(
        r.stderr.contains("apt-get install qemu-system-x86"),
        "{}",
        r.stderr
    );
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(perch(&["convert", "--no-such-flag"]).code, 2);
    assert_eq!(perch(&["frobnicate"]).code, 2);
    let r = perch(&["record", "--baud", "9600"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    let img = fixture("appliance.elf");
    for (flag, v) in [
        ("--duration", "NaN"),
        ("--duration", "1e300"),
        ("--timeout", "inf"),
        ("--duration", "0"),
    ] {
        let r = perch(&["record", "--image", s(&img), flag, v]);
        assert_eq!(r.code, 2, "{flag} {v}: {}", r.stderr);
        assert!(r.stderr.contains(flag), "{}", r.stderr);
    }
    // A perch with no runtime shipped beside it and none given: exit 4,
    // naming --image among the places it looked.
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(lone_perch(dir.path()))
        .arg("record")
        .env_remove("PERCH_IMAGE")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("--image (not given)"), "{stderr}");
}

#[test]
fn cpus_out_of_range_or_without_a_boot_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let img = fixture("appliance.elf");
    for cmd in ["record", "top"] {
        for v in ["0", "65", "x", ""] {
            let r = perch(&[cmd, "--image", s(&img), "--cpus", v, "--", "p"]);
            assert_eq!(r.code, 2, "{cmd} --cpus {v:?}: {}", r.stderr);
            assert!(
                r.stderr.contains("--cpus"),
                "{cmd} --cpus {v:?}: {}",
                r.stderr
            );
        }
    }
    // A capture or a serial line is not a boot: there is no machine to
    // give CPUs to.
    let cap = samples_capture(dir.path(), 10);
    for source in [["--input", cap.as_str()], ["--serial", "/dev/null"]] {
        let r = perch(&["record", source[0], source[1], "--cpus", "2"]);
        assert_eq!(r.code, 2, "{source:?}: {}", r.stderr);
        assert!(
            r.stderr.contains("--cpus") && r.stderr.contains(source[0]),
            "{source:?}: {}",
            r.stderr
        );
    }
}

#[test]
fn stat_refuses_perf_data_with_a_pointer() {
    let dir = tempfile::tempdir().unwrap();
    let cap = samples_capture(dir.path(), 10);
    let out = dir.path().join("perf.data");
    assert_eq!(perch(&["convert", &cap, "-o", s(&out)]).code, 0);
    let r = perch(&["stat", s(&out)]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("perf report --stats"), "{}", r.stderr);
}

#[test]
fn record_from_input_saves_the_capture() {
    let dir = tempfile::tempdir().unwrap();
    let cap = samples_capture(dir.path(), 100);
    let saved = dir.path().join("saved.bin");
    let out = dir.path().join("perf.data");
    let r = perch(&[
        "record",
        "--input",
        &cap,
        "--save-capture",
        s(&saved),
        "-o",
        s(&out),
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(std::fs::read(&saved).unwrap(), std::fs::read(&cap).unwrap());
}

#[test]
fn flamegraph_names_the_image_functions() {
    let dir = tempfile::tempdir().unwrap();
    let cap = samples_capture(dir.path(), 400);
    let svg = dir.path().join("f.svg");
    let r = perch(&[
        "flamegraph",
        &cap,
        "--image",
        s(&fixture("appliance.elf")),
        "-o",
        s(&svg),
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<?xml"), "not an SVG");
    // inferno colours `_[k]` frames as kernel and drops the suffix.
    for f in [
        "synth64",
        "task_main",
        "hot_alpha",
        "hot_beta",
        "compat_main",
        "runtime_entry",
    ] {
        assert!(text.contains(f), "{f} missing from the flamegraph");
    }
}

/// `perch record` against a stand-in QEMU that serves a capture on the
/// wire socket; None when python3 is missing.
fn record_with_fake_qemu(
    dir: &Path,
    cap: &str,
    status: i32,
    extra: &[&str],
) -> Option<(Run, String)> {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("skipping: python3 is needed for the stand-in QEMU");
        return None;
    }
    let args_file = dir.join("qemu-args.txt");
    let out = dir.join("perf.data");
    let img = fixture("appliance.elf");
    let qemu = fixture("fake-qemu.py");
    let mut argv = vec![
        "record",
        "--image",
        s(&img),
        "--qemu",
        s(&qemu),
        "--freq",
        "1234",
        "--icount",
        "--pmu",
        "sim",
        "--duration",
        "2",
        "--ring",
        "64",
        "-o",
        s(&out),
    ];
    argv.extend_from_slice(extra);
    let o = Command::new(env!("CARGO_BIN_EXE_perch"))
        .args(&argv)
        .env("PERCH_FAKE_ARGS", &args_file)
        .env("PERCH_FAKE_CAPTURE", cap)
        .env("PERCH_FAKE_STATUS", status.to_string())
        .env("PERCH_FAKE_INITRD", dir.join("initrd.cpio"))
        .output()
        .unwrap();
    let r = Run {
        code: o.status.code().unwrap_or(-1),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
    };
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    Some((r, std::fs::read_to_string(&args_file).unwrap_or_default()))
}

#[test]
fn record_boots_qemu_with_the_documented_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let cap = samples_capture(dir.path(), 200);
    let Some((r, args)) = record_with_fake_qemu(
        dir.path(),
        &cap,
        33,
        &[
            "--qemu-arg",
            "-smp",
            "--qemu-arg",
            "1",
            "--boot-arg",
            "slice=5",
        ],
    ) else {
        return;
    };
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.contains("200 samples"), "{}", r.stderr);
    assert!(
        r.stderr.contains("appliance ended normally"),
        "{}",
        r.stderr
    );
    let args: Vec<&str> = args.lines().collect();
    let after = |flag: &str| args[args.iter().position(|a| *a == flag).unwrap() + 1];
    assert_eq!(after("-kernel"), fixture("appliance.elf").to_str().unwrap());
    assert_eq!(
        after("-append"),
        "console=wire freq=1234 pmu=sim duration=2000 ring=64 slice=5"
    );
    assert_eq!(after("-icount"), "shift=0,sleep=off");
    // The stream goes over a virtio console; COM1 (early boot text,
    // panics) to a file shown when a run fails.
    assert!(
        args.contains(&"virtconsole,chardev=wire,bus=perch-vser.0"),
        "{args:?}"
    );
    assert!(
        args.contains(&"virtio-serial-pci,id=perch-vser"),
        "{args:?}"
    );
    assert!(
        after("-serial").starts_with("file:") && after("-serial").ends_with("com1.txt"),
        "{args:?}"
    );
    assert!(
        after("-chardev").ends_with(",server=on,wait=on"),
        "{args:?}"
    );
    assert_eq!(after("-device"), "isa-debug-exit,iobase=0xf4,iosize=0x04");
    for flag in ["-nodefaults", "-no-reboot"] {
        assert!(args.contains(&flag), "{flag} missing: {args:?}");
    }
    assert_eq!(&args[args.len() - 2..], ["-smp", "1"]);
}

#[test]
fn record_gives_qemu_the_cpus_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let cap = samples_capture(dir.path(), 20);
    for (extra, smp) in [(&["--cpus", "4"][..], Some("4")), (&[][..], None)] {
        let Some((r, args)) = record_with_fake_qemu(dir.path(), &cap, 33, extra) else {
            return;
        };
        assert_eq!(r.code, 0, "{extra:?}: {}", r.stderr);
        let args: Vec<&str> = args.lines().collect();
        let at = args.iter().position(|a| *a == "-smp");
        assert_eq!(at.map(|i| args[i + 1]), smp, "{extra:?}: {args:?}");
    }
}

#[test]
fn record_reports_an_appliance_crash() {
    let dir = tempfile::tempdir().unwrap();
    let cap = capture(
        dir.path(),
        "c.bin",
        &SynthConfig {
            samples: 20,
            end: false,
            ..Default::default()
        },
    );
    let Some((r, _)) = record_with_fake_qemu(dir.path(), &cap, 37, &[]) else {
        return;
    };
    assert_eq!(r.code, 6, "{}", r.stderr);
    assert!(
        r.stderr.contains("the runtime crashed (exit status 37)"),
        "{}",
        r.stderr
    );
}

#[test]
fn missing_perf_is_named_with_its_install_command() {
    let dir = tempfile::tempdir().unwrap();
    let cap = samples_capture(dir.path(), 10);
    let out = dir.path().join("perf.data");
    let o = Command::new(env!("CARGO_BIN_EXE_perch"))
        .args(["convert", &cap, "-o", s(&out)])
        .env("PATH", dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("perf not found"), "{stderr}");
    assert!(stderr.contains("apt-get install linux-perf"), "{stderr}");
}

#[test]
fn target_text_logs_and_self_tests_are_shown_on_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let cpu = CpuId {
        vendor: CpuVendor::Amd,
        family: 25,
        model: 1,
        stepping: 1,
    };
    let mut h = wire::Hello::new(cpu, PmuCaps::cpu_clock());
    let _ = h.events.push(EventConfig::cpu_clock(0, 1000));
    let mut name = heapless::String::new();
    let _ = name.push_str("nmi_rate");
    let mut detail = heapless::String::new();
    let _ = detail.push_str("ticks per second");
    let records = [
        Record::Hello(h),
        Record::Log(wire::Log::text(5, wire::LogLevel::Warn, "ring nearly full")),
        Record::SelfTest(wire::SelfTest {
            name,
            passed: true,
            measured: 998,
            expected: 1000,
            detail,
        }),
        Record::End(wire::End::default()),
    ];
    let mut enc: Encoder = Encoder::new(Default::default());
    let mut bytes = Vec::new();
    let mut buf = [0u8; wire::MAX_FRAME];
    for r in &records {
        let n = enc.encode(r, &mut buf).unwrap();
        bytes.extend_from_slice(&buf[..n]);
    }
    let cap = dir.path().join("logs.bin");
    std::fs::write(&cap, bytes).unwrap();
    let r = perch(&["convert", s(&cap), "-o", s(&dir.path().join("perf.data"))]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr.contains("target: WARN ring nearly full"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains(
            "target: SELFTEST nmi_rate PASS: measured 998 expected 1000 ticks per second"
        ),
        "{}",
        r.stderr
    );
    let r = perch(&["stat", s(&cap)]);
    assert!(r.stdout.contains("log records: 2"), "{}", r.stdout);
    assert!(
        r.stdout
            .contains("AuthenticAMD family 25 model 1 stepping 1"),
        "{}",
        r.stdout
    );
}

#[test]
fn record_reads_a_serial_line() {
    let dir = tempfile::tempdir().unwrap();
    let cap = capture(
        dir.path(),
        "c.bin",
        &SynthConfig {
            samples: 300,
            lost: 2,
            ..Default::default()
        },
    );
    let out = dir.path().join("perf.data");
    let script = fixture("pty-serial.py");
    let o = match Command::new("python3")
        .args([s(&script), env!("CARGO_BIN_EXE_perch"), &cap, s(&out)])
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!("skipping: python3 is needed to drive a pseudo-terminal ({e})");
            return;
        }
    };
    let text = String::from_utf8_lossy(&o.stdout);
    let (code, stderr) = text.split_once('\n').unwrap();
    assert_eq!(code, "0", "{stderr}");
    assert!(stderr.contains("300 samples, 2 lost"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(&std::fs::read(&out).unwrap()[..8], b"PERFILE2");
}

/// A minimal static x86-64 executable: one R+X PT_LOAD at 0x400000 holding
/// the headers and an entry point (never run: the QEMU here is a stand-in).
fn tiny_static_elf() -> Vec<u8> {
    let mut e = vec![0u8; 0x1000];
    e[..16].copy_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    let put16 =
        |e: &mut Vec<u8>, at: usize, v: u16| e[at..at + 2].copy_from_slice(&v.to_le_bytes());
    let put32 =
        |e: &mut Vec<u8>, at: usize, v: u32| e[at..at + 4].copy_from_slice(&v.to_le_bytes());
    let put64 =
        |e: &mut Vec<u8>, at: usize, v: u64| e[at..at + 8].copy_from_slice(&v.to_le_bytes());
    put16(&mut e, 16, 2); // ET_EXEC
    put16(&mut e, 18, 62); // EM_X86_64
    put32(&mut e, 20, 1);
    put64(&mut e, 24, 0x40_0100); // e_entry
    put64(&mut e, 32, 64); // e_phoff
    put16(&mut e, 52, 64); // e_ehsize
    put16(&mut e, 54, 56); // e_phentsize
    put16(&mut e, 56, 1); // e_phnum
    put32(&mut e, 64, 1); // PT_LOAD
    put32(&mut e, 68, 5); // R+X
    put64(&mut e, 72, 0); // p_offset
    put64(&mut e, 80, 0x40_0000); // p_vaddr
    put64(&mut e, 88, 0x40_0000); // p_paddr
    put64(&mut e, 96, 0x1000); // p_filesz
    put64(&mut e, 104, 0x1000); // p_memsz
    put64(&mut e, 112, 0x1000); // p_align
    e[0x100] = 0xf4; // hlt
    e
}

#[test]
fn record_packs_a_program_with_its_files_and_boots_it_with_the_archive() {
    let dir = tempfile::tempdir().unwrap();
    let cap = samples_capture(dir.path(), 50);
    let prog = dir.path().join("my-prog");
    std::fs::write(&prog, tiny_static_elf()).unwrap();
    let data = dir.path().join("input.txt");
    std::fs::write(&data, "some input\n").unwrap();
    let file = format!("{}:data/in.txt", data.display());
    let prog_s = prog.display().to_string();
    // record_with_fake_qemu passes --duration 2: programs still get a bound
    // when asked for one.
    let Some((r, args)) = record_with_fake_qemu(
        dir.path(),
        &cap,
        33,
        &[
            "--no-buildid-cache",
            "--file",
            &file,
            "--",
            &prog_s,
            "a b",
            "-x",
        ],
    ) else {
        return;
    };
    assert_eq!(r.code, 0, "{}", r.stderr);
    let args: Vec<&str> = args.lines().collect();
    let after = |flag: &str| args[args.iter().rposition(|a| *a == flag).unwrap() + 1];
    assert_eq!(after("-m"), "1024M");
    assert!(after("-initrd").ends_with("app.cpio"), "{args:?}");
    assert!(
        !Path::new(after("-initrd")).exists(),
        "the archive outlived the run"
    );
    let bytes = std::fs::read(dir.path().join("initrd.cpio")).unwrap();
    let archive = kcore::archive::Archive::parse(&bytes).unwrap();
    let m = archive.manifest().unwrap();
    assert_eq!(m.processes.len(), 1);
    let p = &m.processes[0];
    assert_eq!(
        (p.name.as_str(), p.exe.as_str()),
        ("my-prog", "bin/my-prog")
    );
    let argv: Vec<&[u8]> = p.argv.iter().map(|a| &a[..]).collect();
    assert_eq!(argv, [prog_s.as_bytes(), b"a b", b"-x"]);
    assert_eq!(
        archive.get(b"bin/my-prog").unwrap().data(),
        &tiny_static_elf()[..]
    );
    assert_eq!(archive.get(b"data/in.txt").unwrap().data(), b"some input\n");
}

#[test]
fn a_program_runs_to_its_end_without_a_duration() {
    let dir = tempfile::tempdir().unwrap();
    let cap = samples_capture(dir.path(), 20);
    let prog = dir.path().join("p");
    std::fs::write(&prog, tiny_static_elf()).unwrap();
    let args_file = dir.path().join("args.txt");
    let o = Command::new(env!("CARGO_BIN_EXE_perch"))
        .args(["record", "--no-buildid-cache", "--image"])
        .arg(fixture("appliance.elf"))
        .arg("--qemu")
        .arg(fixture("fake-qemu.py"))
        .arg("-o")
        .arg(dir.path().join("perf.data"))
        .arg("--")
        .arg(&prog)
        .env("PERCH_FAKE_ARGS", &args_file)
        .env("PERCH_FAKE_CAPTURE", &cap)
        .output()
        .unwrap();
    if Command::new("python3").arg("--version").output().is_err() {
        return;
    }
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let args = std::fs::read_to_string(&args_file).unwrap();
    let append = args
        .lines()
        .skip_while(|a| *a != "-append")
        .nth(1)
        .unwrap()
        .to_owned();
    assert_eq!(append, "console=wire freq=1000 pmu=auto");
}

#[test]
fn convert_to_pprof_and_a_flamegraph_of_the_perf_data_agree_with_the_capture() {
    let dir = tempfile::tempdir().unwrap();
    let cap = samples_capture(dir.path(), 400);
    let img = fixture("appliance.elf");
    let image = Image::open(&img).unwrap();
    // pprof: every sample, its period summed, the image as a mapping with
    // its build-id, the image's functions named.
    let pb = dir.path().join("p.pb.gz");
    let r = perch(&[
        "convert",
        &cap,
        "--image",
        s(&img),
        "--format",
        "pprof",
        "-o",
        s(&pb),
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(!dir.path().join("perf.data").exists());
    let p = host_tool::pprof::read(&std::fs::read(&pb).unwrap()).unwrap();
    let count: i64 = p.sample.iter().map(|x| x.value[0]).sum();
    assert_eq!(count, 400);
    let st = |i: i64| p.string_table[i as usize].as_str();
    assert_eq!(st(p.sample_type[0].r#type), "samples");
    let id = image.build_id_hex().unwrap();
    assert!(
        p.mapping.iter().any(|m| st(m.build_id) == id),
        "no mapping with the image's build-id {id}"
    );
    let names: Vec<&str> = p.function.iter().map(|f| st(f.name)).collect();
    for f in ["task_main", "hot_alpha", "runtime_entry"] {
        assert!(names.iter().any(|n| n.contains(f)), "{f} not in {names:?}");
    }
    // The perf.data of the same capture folds into the capture's stacks.
    let data = dir.path().join("perf.data");
    let r = perch(&["convert", &cap, "--image", s(&img), "-o", s(&data)]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let fold = |input: &str, out: &str| {
        let out = dir.path().join(out);
        let r = perch(&[
            "flamegraph",
            input,
            "--image",
            s(&img),
            "--folded",
            "-o",
            s(&out),
        ]);
        assert_eq!(r.code, 0, "{}", r.stderr);
        std::fs::read_to_string(out).unwrap()
    };
    let a = fold(s(&data), "a.folded");
    assert_eq!(a, fold(&cap, "b.folded"));
    assert!(a.contains("hot_alpha"), "{a}");
}

/// A capture of a run of one program, `prog`, that ends with `end` (the
/// runtime's console line for it, as `perch: prog (pid 1) exited with
/// status 3`).
fn workload_capture(dir: &Path, end: &str) -> String {
    let mut h = wire::Hello::new(
        CpuId {
            vendor: CpuVendor::Intel,
            family: 6,
            model: 85,
            stepping: 4,
        },
        PmuCaps::cpu_clock(),
    );
    let _ = h.events.push(EventConfig::cpu_clock(0, 1000));
    let records = [
        Record::Hello(h),
        Record::Log(wire::Log::text(5, wire::LogLevel::Info, end)),
        Record::End(wire::End::default()),
    ];
    let mut enc: Encoder = Encoder::new(Default::default());
    let mut bytes = Vec::new();
    let mut buf = [0u8; wire::MAX_FRAME];
    for r in &records {
        let n = enc.encode(r, &mut buf).unwrap();
        bytes.extend_from_slice(&buf[..n]);
    }
    let cap = dir.join("workload.bin");
    std::fs::write(&cap, bytes).unwrap();
    cap.to_str().unwrap().to_owned()
}

/// `perch record -- PROGRAM` exits as `perf record -- PROGRAM` does: with
/// the program's own exit status, once the run is complete; 9 for a
/// program killed by a signal.
#[test]
fn record_exits_with_the_workloads_status() {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("skipping: python3 is needed for the stand-in QEMU");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The program is checked before boot: a static ELF named `prog`.
    let prog = dir.path().join("prog");
    std::fs::write(&prog, tiny_static_elf()).unwrap();
    for (end, code) in [
        ("perch: prog (pid 1) exited with status 0", 0),
        ("perch: prog (pid 1) exited with status 1", 1),
        ("perch: prog (pid 1) exited with status 3", 3),
        // The low 8 bits, as a shell sees them.
        ("perch: prog (pid 1) exited with status 256", 0),
        ("perch: prog (pid 1) exited with status 300", 44),
        ("perch: prog (pid 1) killed by SIGSEGV: page fault", 9),
    ] {
        let cap = workload_capture(dir.path(), end);
        let out = dir.path().join("perf.data");
        let _ = std::fs::remove_file(&out);
        let o = Command::new(env!("CARGO_BIN_EXE_perch"))
            .args(["record", "--image"])
            .arg(fixture("appliance.elf"))
            .arg("--qemu")
            .arg(fixture("fake-qemu.py"))
            .arg("--no-buildid-cache")
            .arg("-o")
            .arg(&out)
            .arg("--")
            .arg(&prog)
            .env("PERCH_FAKE_ARGS", dir.path().join("qemu-args.txt"))
            .env("PERCH_FAKE_CAPTURE", &cap)
            .env("PERCH_FAKE_STATUS", "33")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{end}: {stderr}");
        assert!(out.exists(), "{end}: perf.data is written: {stderr}");
    }
    // With --appliance the programs' statuses do not change perch's.
    let manifest = dir.path().join("app.toml");
    std::fs::write(
        &manifest,
        format!("[[process]]\nprogram = \"{}\"\n", prog.display()),
    )
    .unwrap();
    let cap = workload_capture(dir.path(), "perch: prog (pid 1) exited with status 3");
    let o = Command::new(env!("CARGO_BIN_EXE_perch"))
        .args(["record", "--image"])
        .arg(fixture("appliance.elf"))
        .arg("--qemu")
        .arg(fixture("fake-qemu.py"))
        .arg("--no-buildid-cache")
        .arg("-o")
        .arg(dir.path().join("app.data"))
        .arg("--appliance")
        .arg(&manifest)
        .env("PERCH_FAKE_ARGS", dir.path().join("qemu-args.txt"))
        .env("PERCH_FAKE_CAPTURE", &cap)
        .env("PERCH_FAKE_STATUS", "33")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("exited with status 3"), "{stderr}");
}

/// perch copied to `dir/bin`, away from any build tree: the runtime shipped
/// with it is `dir/bin/perch-runtime` only.
fn lone_perch(dir: &Path) -> std::path::PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let perch = bin.join("perch");
    std::fs::copy(env!("CARGO_BIN_EXE_perch"), &perch).unwrap();
    perch
}

/// `perch record -- PROG` with the perch at `perch` against the stand-in
/// QEMU, `env` set and $PERCH_IMAGE unset unless given there; returns the
/// run and the QEMU arguments.
fn record_without_image(
    perch: &Path,
    dir: &Path,
    extra: &[&str],
    env: &[(&str, &Path)],
) -> (Run, String) {
    let prog = dir.join("prog");
    std::fs::write(&prog, tiny_static_elf()).unwrap();
    let cap = workload_capture(dir, "perch: prog (pid 1) exited with status 0");
    let args_file = dir.join("qemu-args.txt");
    let _ = std::fs::remove_file(&args_file);
    let mut cmd = Command::new(perch);
    cmd.arg("record")
        .args(extra)
        .arg("--qemu")
        .arg(fixture("fake-qemu.py"))
        .arg("--no-buildid-cache")
        .arg("-o")
        .arg(dir.join("perf.data"))
        .arg("--")
        .arg(&prog)
        .current_dir(dir)
        .env_remove("PERCH_IMAGE")
        .env("PERCH_FAKE_ARGS", &args_file)
        .env("PERCH_FAKE_CAPTURE", &cap)
        .env("PERCH_FAKE_STATUS", "33");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output().unwrap();
    let r = Run {
        code: o.status.code().unwrap_or(-1),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
    };
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    (r, std::fs::read_to_string(&args_file).unwrap_or_default())
}

/// The `-kernel` argument perch gave QEMU.
fn kernel_arg(args: &str) -> &str {
    let a: Vec<&str> = args.lines().collect();
    a[a.iter().position(|x| *x == "-kernel").expect("-kernel") + 1]
}

/// With no --image, perch boots $PERCH_IMAGE, else the runtime beside its
/// binary; with none of them it names every place it looked and the
/// command that installs the runtime; an image that is not the shipped one
/// gets a warning and is booted all the same; `perch --version` names the
/// shipped runtime's build-id.
#[test]
fn record_finds_the_runtime_shipped_beside_it() {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("skipping: python3 is needed for the stand-in QEMU");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let perch = lone_perch(dir.path());
    let shipped = dir.path().join("bin/perch-runtime");
    // Nothing anywhere.
    let (r, _) = record_without_image(&perch, dir.path(), &[], &[]);
    assert_eq!(r.code, 4, "{}", r.stderr);
    for needle in [
        "no runtime image",
        "--image (not given)",
        "$PERCH_IMAGE (not set)",
        shipped.to_str().unwrap(),
        "cargo xtask install",
    ] {
        assert!(r.stderr.contains(needle), "{needle}: {}", r.stderr);
    }
    let v = Command::new(&perch).arg("--version").output().unwrap();
    let v = String::from_utf8_lossy(&v.stdout);
    assert!(v.contains("runtime: none shipped"), "{v}");
    // The shipped runtime, found by itself.
    std::fs::copy(fixture("appliance.elf"), &shipped).unwrap();
    let (r, args) = record_without_image(&perch, dir.path(), &[], &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(kernel_arg(&args), shipped.to_str().unwrap());
    assert!(!r.stderr.contains("runtime shipped"), "{}", r.stderr);
    let v = Command::new(&perch).arg("--version").output().unwrap();
    let v = String::from_utf8_lossy(&v.stdout);
    assert!(
        v.contains("build-id 215f51a8d97d269dc806ef7d75f988044378127c"),
        "{v}"
    );
    // $PERCH_IMAGE before it, --image before both; another build is
    // named as such and booted all the same.
    let other = fixture("other.elf");
    let (r, args) = record_without_image(&perch, dir.path(), &[], &[("PERCH_IMAGE", &other)]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(kernel_arg(&args), other.to_str().unwrap());
    assert!(
        r.stderr.contains(&format!(
            "warning: PERCH_IMAGE={} has build-id a4bb215b7913eafe110da13318b57e5ad9d315c3, \
             not that of the runtime shipped with this perch",
            other.display()
        )),
        "{}",
        r.stderr
    );
    let flag = fixture("appliance.elf");
    let (r, args) = record_without_image(
        &perch,
        dir.path(),
        &["--image", flag.to_str().unwrap()],
        &[("PERCH_IMAGE", &other)],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(kernel_arg(&args), flag.to_str().unwrap());
    assert!(
        !r.stderr.contains("runtime shipped"),
        "same build-id: {}",
        r.stderr
    );
}

/// A capture whose first Hello was damaged on the line: its repetition,
/// later in the file, describes the records before it, so convert, record
/// --input, stat and flamegraph all keep every sample, and none calls the
/// capture a late join.
#[test]
fn a_damaged_first_hello_costs_no_sample_in_any_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    let cap = capture(
        dir.path(),
        "c.bin",
        &SynthConfig {
            samples: 4000,
            repeat_every: 1000,
            ..Default::default()
        },
    );
    let mut bytes = std::fs::read(&cap).unwrap();
    // One flipped bit inside the first frame, the Hello.
    assert!(bytes[..40].iter().all(|&b| b != 0));
    bytes[6] ^= 0x10;
    let damaged = dir.path().join("damaged.bin");
    std::fs::write(&damaged, &bytes).unwrap();
    let img = fixture("appliance.elf");

    let stat = perch(&["stat", s(&damaged)]);
    assert_eq!(stat.code, 0, "{}", stat.stderr);
    assert!(
        stat.stdout.contains("samples: 4000 "),
        "stat: {}",
        stat.stdout
    );
    for (what, args) in [
        ("convert", vec!["convert", s(&damaged)]),
        (
            "record --input",
            vec!["record", "--input", s(&damaged), "--no-buildid-cache"],
        ),
    ] {
        let out = dir.path().join(format!("{}.data", what.len()));
        let mut a = args.clone();
        a.extend(["--image", s(&img), "-o", s(&out)]);
        let r = perch(&a);
        assert_eq!(r.code, 0, "{what}: {}", r.stderr);
        assert!(
            r.stderr
                .contains("4000 samples, 0 lost (0 on the target, 0 on the wire)"),
            "{what}: {}",
            r.stderr
        );
        assert!(
            r.stderr.contains("first Hello was lost")
                && !r.stderr.contains("joined the stream late"),
            "{what}: {}",
            r.stderr
        );
    }
}
