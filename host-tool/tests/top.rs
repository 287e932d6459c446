//! `perch top` where stdout is not a terminal: a plain table at every
//! refresh while the stream arrives, and a last one when it ends, while
//! perf.data is written as by `perch record`.
#![forbid(unsafe_code)]

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::fixture;
use host_tool::image::Image;
use host_tool::synth::{SynthConfig, write_capture};

/// The tables in `out`: each a list of its lines.
fn tables(out: &str) -> Vec<Vec<&str>> {
    out.split("\n\n")
        .filter(|t| t.starts_with("perch top: "))
        .map(|t| t.lines().collect())
        .collect()
}

/// (samples, marker, symbol) of each row of a table.
fn rows<'a>(table: &[&'a str]) -> Vec<(u64, &'a str, &'a str)> {
    table
        .iter()
        .skip_while(|l| !l.starts_with("Overhead"))
        .skip(1)
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(w.len(), 6, "a row of six columns: {l:?}");
            (w[1].parse().expect("samples"), w[4], w[5])
        })
        .collect()
}

#[test]
fn a_pipe_gets_a_table_each_refresh_and_a_last_one_and_perf_data_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let img_path = fixture("appliance.elf");
    let image = Image::open(&img_path).unwrap();
    let mut cap = Vec::new();
    write_capture(
        Some(&image),
        &SynthConfig {
            samples: 6000,
            ..Default::default()
        },
        &mut cap,
    )
    .unwrap();
    let data = dir.path().join("perf.data");
    let mut child = Command::new(env!("CARGO_BIN_EXE_perch"))
        .args([
            "top",
            "-d",
            "0.1",
            "-E",
            "50",
            "--no-buildid-cache",
            "--image",
        ])
        .arg(&img_path)
        .arg("--input")
        .arg("/dev/stdin")
        .arg("-o")
        .arg(&data)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Half the stream, a pause of several refreshes, the rest.
    let mut stdin = child.stdin.take().unwrap();
    let half = cap.len() / 2;
    stdin.write_all(&cap[..half]).unwrap();
    stdin.flush().unwrap();
    std::thread::sleep(Duration::from_millis(800));
    stdin.write_all(&cap[half..]).unwrap();
    drop(stdin);
    let o = child.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(data.exists(), "no perf.data: {err}");
    assert!(!out.contains('\x1b'), "escape sequences in the plain table");

    let t = tables(&out);
    assert!(
        t.len() >= 3,
        "a table per refresh while the stream waits:\n{out}"
    );
    // A refresh during the pause shows part of the stream.
    let partial = &t[t.len() / 2];
    let n: u64 = rows(partial).iter().map(|r| r.0).sum();
    assert!(
        n > 0 && n < 6000,
        "{n} samples mid-way:\n{}",
        partial.join("\n")
    );
    // The last: the whole run, every sample in a row, hottest first.
    let last = t.last().unwrap();
    assert!(
        last[0].contains(", ended: 6000 samples"),
        "{}",
        last.join("\n")
    );
    assert!(
        last[1].starts_with("commands: synth64 100.0% (10.0% runtime)"),
        "{}",
        last[1]
    );
    let r = rows(last);
    assert_eq!(r.iter().map(|r| r.0).sum::<u64>(), 6000);
    assert!(r.windows(2).all(|w| w[0].0 >= w[1].0), "{r:?}");
    for f in ["hot_alpha", "hot_beta", "hot_gamma"] {
        assert!(
            r.iter().any(|&(_, m, s)| m == "[.]" && s == f),
            "no {f}: {r:?}"
        );
    }
    assert!(
        r.iter()
            .any(|&(n, m, s)| m == "[k]" && s == "runtime_entry" && n == 600),
        "every tenth sample is in the runtime: {r:?}"
    );
}

#[test]
fn a_bad_delay_is_a_usage_error_before_anything_runs() {
    for d in ["0", "-1", "nan"] {
        let o = Command::new(env!("CARGO_BIN_EXE_perch"))
            .args([
                "top",
                &format!("--delay={d}"),
                "--input",
                "/nonexistent/capture",
            ])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "-d {d}: {err}");
        assert!(err.contains("--delay"), "-d {d}: {err}");
    }
}
