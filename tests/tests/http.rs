//! Servers profiled under load: `perch record --net --forward tcp:PORT:80
//! --wait-for tcp:PORT -- httpd 80`, `wrk` sends at least 10,000 requests
//! through QEMU's forward and checks every answer, `GET /quit` ends the
//! server, and perf report names its request handling among its hottest
//! symbols. Two servers: tests/programs/c/httpd.c (one thread,
//! non-blocking sockets and epoll; `page_crc32`, `render_page`) and
//! tests/programs/go/httpd (Go's net/http, a goroutine per connection on
//! the threads of Go's scheduler; `main.renderPage`).
//!
//! Not under icount: with `-icount sleep=off` the guest's clock leaps over
//! its waits, faster than QEMU's network answers. Needs `wrk` (Debian's
//! package of that name); skipped with a word without it. Run alone with
//! `cargo test -p e2e-tests --test http`.
#![forbid(unsafe_code)]

use e2e_tests::programs::{CBuild, c_program, go_program};
use e2e_tests::{perch_bin, qemu_and_perf_present, runtime_elf};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Requests wrk must get answered, all correctly.
const REQUESTS: u64 = 10_000;
/// wrk's threads and connections.
const THREADS: u64 = 2;
const CONNECTIONS: u64 = 8;
/// The length of one wrk run, and the most runs.
const RUN_SECONDS: u64 = 5;
const MAX_RUNS: u32 = 10;
/// What the C httpd answers to `/work?n=64` (the same natively).
const WORK_BODY: &str = "rows 64 bytes 4577 crc32 5d1f4b4b\n";
/// What the Go httpd answers to `/` (the same natively).
const GO_BODY: &str = "hello from go httpd\nrows 2000 checksum e039cad5\n";

/// A server under test.
struct Server<'a> {
    exe: &'a Path,
    /// What wrk asks for, and the body every answer must have.
    path: &'a str,
    body: &'a str,
    /// The server's own stdout lines (those starting with `httpd:`).
    says: &'a [&'a str],
    /// Functions of the request handling that must be among the hottest
    /// symbols.
    hot: &'a [&'a str],
    /// How many symbols count as the hottest.
    top: usize,
}

/// A wrk script that checks each answer's status and body and prints the
/// totals.
fn wrk_script(body: &str) -> String {
    format!(
        r#"local threads = {{}}
function setup(thread) table.insert(threads, thread) end
function init(args) ok = 0; bad = 0 end
function response(status, headers, body)
  if status == 200 and body == "{body}" then ok = ok + 1 else bad = bad + 1 end
end
function done(summary, latency, requests)
  local o, b = 0, 0
  for _, t in ipairs(threads) do o = o + t:get("ok"); b = b + t:get("bad") end
  io.write(string.format("checked: %d ok, %d bad\n", o, b))
end
"#,
        body = body.replace('\n', "\\n"),
    )
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn read(p: &Path) -> String {
    String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned()
}

/// The numbers after `label` in wrk's output (`checked: 10000 ok, 0 bad`).
fn numbers_after(text: &str, label: &str) -> Vec<u64> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(label))
        .map(|rest| {
            rest.split(|c: char| !c.is_ascii_digit())
                .filter_map(|w| w.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_server_profiled_under_load() {
    if !qemu_and_perf_present() {
        return;
    }
    if !wrk_runs() {
        eprintln!("SKIPPED: wrk is not installed (apt-get install --no-install-recommends wrk)");
        return;
    }
    let exe = c_program("httpd", CBuild::Glibc);
    profile_under_load(&Server {
        exe: &exe,
        path: "/work?n=64",
        body: WORK_BODY,
        says: &["httpd: listening on port 80", "httpd: quit"],
        hot: &["page_crc32", "render_page"],
        top: 12,
    });
}

#[test]
fn a_go_net_http_server_profiled_under_load() {
    if !qemu_and_perf_present() {
        return;
    }
    if !wrk_runs() {
        eprintln!("SKIPPED: wrk is not installed (apt-get install --no-install-recommends wrk)");
        return;
    }
    let exe = go_program("httpd");
    profile_under_load(&Server {
        exe: &exe,
        path: "/",
        body: GO_BODY,
        says: &["httpd: listening", "httpd: done"],
        hot: &["main.renderPage"],
        top: 12,
    });
}

fn profile_under_load(server: &Server<'_>) {
    let exe = server.exe;
    let runtime = runtime_elf();
    let dir = tempfile::tempdir().expect("temporary directory");
    let data = dir.path().join("perf.data");
    let ready = dir.path().join("ready");
    let out_path = dir.path().join("stdout");
    let log_path = dir.path().join("stderr");
    // A free TCP port on the host for QEMU's forward (given back at once).
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free TCP port")
        .port();
    let forward = format!("tcp:{port}:80");
    let wait_for = format!("tcp:{port}");
    let perch = Command::new(perch_bin())
        .arg("record")
        .arg("--image")
        .arg(&runtime)
        .arg("-o")
        .arg(&data)
        .args(["--timeout", "150", "--net", "--forward", &forward])
        .args(["--wait-for", &wait_for, "--ready-file"])
        .arg(&ready)
        .arg("--")
        .arg(exe)
        .arg("80")
        .env("PERF_BUILDID_DIR", dir.path().join("buildid"))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&log_path).expect("stderr file"))
        .spawn()
        .expect("starting perch record");
    let mut perch = KillOnDrop(perch);

    // Until httpd accepts through the forward (perch writes the ready file).
    let t0 = Instant::now();
    while !ready.exists() {
        if let Some(status) = perch.0.try_wait().expect("waiting for perch") {
            panic!(
                "perch record ended ({status}) before httpd accepted connections:\nstdout:\n{}\nlog:\n{}",
                read(&out_path),
                read(&log_path)
            );
        }
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "httpd did not accept connections within 90 s:\nstdout:\n{}\nlog:\n{}",
            read(&out_path),
            read(&log_path)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = read(&log_path);
    assert!(
        log.contains(&format!(
            "perch: serving: tcp 127.0.0.1:{port} -> 10.0.2.15:80"
        )),
        "perch did not say where the server is:\n{log}"
    );
    assert!(
        read(&ready).contains(&format!("perch: ready: tcp 127.0.0.1:{port}")),
        "{}",
        read(&ready)
    );

    // The load: wrk runs of a few seconds each (wrk runs for its whole
    // duration) until REQUESTS answers have come, every one of them right.
    let script = dir.path().join("check.lua");
    std::fs::write(&script, wrk_script(server.body)).expect("writing the wrk script");
    let (mut good, mut runs) = (0u64, 0);
    while good < REQUESTS {
        assert!(
            runs < MAX_RUNS,
            "only {good} answers in {MAX_RUNS} wrk runs of {RUN_SECONDS} s (wanted {REQUESTS}):\n{}",
            read(&log_path)
        );
        runs += 1;
        let wrk = Command::new("wrk")
            .arg(format!("-t{THREADS}"))
            .arg(format!("-c{CONNECTIONS}"))
            .arg(format!("-d{RUN_SECONDS}s"))
            .args(["--timeout", "10s", "-s"])
            .arg(&script)
            .arg(format!("http://127.0.0.1:{port}{}", server.path))
            .stdin(Stdio::null())
            .output()
            .expect("running wrk");
        let report = String::from_utf8_lossy(&wrk.stdout).into_owned();
        let log = read(&log_path);
        assert!(
            wrk.status.success(),
            "wrk failed: {}\n{report}\nlog:\n{log}",
            String::from_utf8_lossy(&wrk.stderr)
        );
        eprintln!("wrk run {runs}:\n{report}");
        let checked = numbers_after(&report, "checked:");
        assert_eq!(checked.len(), 2, "no totals from wrk:\n{report}");
        assert!(
            checked[0] > 0 && checked[1] == 0,
            "{} good answers and {} bad:\n{report}\nlog:\n{log}",
            checked[0],
            checked[1]
        );
        assert!(
            !report.contains("Socket errors") && !report.contains("Non-2xx"),
            "wrk saw errors:\n{report}\nlog:\n{log}"
        );
        good += checked[0];
    }

    // /quit: the answer, then httpd and the run end cleanly.
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connecting for /quit");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("a read timeout");
    s.write_all(b"GET /quit HTTP/1.1\r\nHost: perch\r\n\r\n")
        .expect("sending /quit");
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 200 OK") && answer.ends_with("\r\n\r\nbye\n"),
        "/quit answered {answer:?}"
    );
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = perch.0.try_wait().expect("waiting for perch") {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "perch record did not end after /quit:\n{}",
            read(&log_path)
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = read(&out_path);
    let log = read(&log_path);
    assert_eq!(status.code(), Some(0), "perch record failed:\n{out}\n{log}");
    let said: Vec<&str> = out.lines().filter(|l| l.starts_with("httpd:")).collect();
    assert_eq!(said, server.says, "stdout:\n{out}\nlog:\n{log}");
    let served = numbers_after(&log, "httpd: served");
    assert!(
        served.first().is_some_and(|&n| n > REQUESTS),
        "httpd's count: {served:?}\n{log}"
    );

    // The request handling is among the hottest symbols.
    let perf = Command::new("perf")
        .args(["report", "--stdio", "--no-children", "-g", "none"])
        .args(["--sort", "sym", "-i"])
        .arg(&data)
        .arg(format!("--vmlinux={}", runtime.display()))
        .env("PERF_BUILDID_DIR", dir.path().join("buildid"))
        .stdin(Stdio::null())
        .output()
        .expect("running perf report");
    let text = String::from_utf8_lossy(&perf.stdout);
    assert!(
        perf.status.success(),
        "perf report failed: {}",
        String::from_utf8_lossy(&perf.stderr)
    );
    let top: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("[.]") || l.contains("[k]"))
        .take(server.top)
        .collect();
    for &name in server.hot {
        assert!(
            top.iter().any(|l| l.contains(&format!("] {name}"))),
            "{name} is not among the hottest symbols:\n{}\n\nthe whole report:\n{text}",
            top.join("\n")
        );
    }
}

/// Whether `wrk` starts (it has no `--version` that exits 0).
fn wrk_runs() -> bool {
    Command::new("wrk")
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}
