//! The `perch` binary against hostile input: concatenated and restarted
//! captures, outputs that are inputs, failed runs over existing files,
//! pipes, values the runtime cannot use, silent sources, damaged Task
//! records and images that do not fit. Each test guards one defect.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::fixture;
use host_tool::image::Image;
use host_tool::synth::{SynthConfig, write_capture};

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
