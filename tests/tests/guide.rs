//! The user's guide runs as written: every `sh` block of host-tool/README.md
//! runs with `bash -euo pipefail`, in order, in one scratch directory that
//! looks like the repository root (`target`, `tests` and `appliances` link
//! to the real ones), with `perch` on `PATH`, the runtime image and the demo
//! appliance's programs built. Each block must exit 0; the files the guide
//! says it writes must be there.

#![forbid(unsafe_code)]

use std::path::Path;
use std::process::Command;

use e2e_tests::{perch_bin, programs, qemu_present, runtime_elf, workspace_root};

/// The `sh` blocks of `text`, in order.
fn sh_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut cur: Option<String> = None;
    for line in text.lines() {
        match (&mut cur, line.trim_end()) {
            (None, "```sh") => cur = Some(String::new()),
            (Some(b), "```") => {
                blocks.push(std::mem::take(b));
                cur = None;
            }
            (Some(b), l) => {
                b.push_str(l);
                b.push('\n');
            }
            (None, _) => {}
        }
    }
    assert!(cur.is_none(), "an unclosed ```sh block");
    blocks
}

#[test]
fn blocks_are_found_in_order() {
    let b = sh_blocks("a\n```sh\nx\ny\n```\n```text\nz\n```\n```sh\nw\n```\n");
    assert_eq!(b, ["x\ny\n", "w\n"]);
}

#[test]
fn every_shell_block_of_the_guide_runs_as_written() {
    if !qemu_present() || !e2e_tests::perf_present() {
        return;
    }
    let root = workspace_root();
    let guide = std::fs::read_to_string(root.join("host-tool/README.md")).unwrap();
    let blocks = sh_blocks(&guide);
    assert!(
        blocks.len() >= 4,
        "the guide has {} sh blocks",
        blocks.len()
    );
    // What the blocks expect to exist.
    let _ = runtime_elf();
    let _ = programs::demo_manifest();
    let dir = tempfile::tempdir().unwrap();
    for link in ["target", "tests", "appliances"] {
        std::os::unix::fs::symlink(root.join(link), dir.path().join(link)).unwrap();
    }
    let bin = perch_bin();
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for (i, block) in blocks.iter().enumerate() {
        let out = Command::new("bash")
            .args(["-euo", "pipefail", "-c", block])
            .current_dir(dir.path())
            .env("PATH", &path)
            // A private build-id cache, not the user's ~/.debug.
            .env("PERF_BUILDID_DIR", dir.path().join("buildid"))
            .env("HOME", dir.path())
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "block {i} failed ({}):\n{block}\nstdout:\n{}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for f in [
        "hot.data",
        "regs.data",
        "lbr.data",
        "demo.data",
        "demo.svg",
        "demo.pb.gz",
        "top.data",
    ] {
        let p: &Path = &dir.path().join(f);
        assert!(
            p.metadata().is_ok_and(|m| m.len() > 0),
            "{f} was not written"
        );
    }
    let hot = std::fs::read_to_string(dir.path().join("hot.txt")).unwrap();
    assert!(hot.contains("sieve") && hot.contains("crc_bytes"), "{hot}");
}
