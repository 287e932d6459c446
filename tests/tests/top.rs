//! `perch top` as a user sees it: the demo appliance boots in real time (no
//! icount: the live view is the point) inside a tmux pane, and the pane
//! (`tmux capture-pane`) ranks demo64's three hot functions by their
//! samples, `demo_checksum_blocks` (50 % of its instructions) first, then
//! `demo_parse_records` (30 %) and `demo_update_stats` (20 %), whose real-time
//! shares under TCG are close enough to come in either order. Then `q` ends the run: perch exits 0,
//! says the user stopped it, and the perf.data it wrote opens in `perf
//! report` with the same functions.
//!
//! The view is awaited up to 60 s (the boot), the hot functions up to 30 s
//! after it is up, and the order is checked only once demo64's rows hold
//! 300 samples, so that a loaded machine slows the test without failing it. Skips, saying why, when QEMU, perf or tmux is
//! missing.
#![forbid(unsafe_code)]

use e2e_tests::programs::demo_manifest;
use e2e_tests::{perch_bin, perf_present, qemu_present, runtime_elf};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// demo64's hot functions, hottest first by design.
const HOT: [&str; 3] = [
    "demo_checksum_blocks",
    "demo_parse_records",
    "demo_update_stats",
];

/// Samples demo64's three rows must hold before their order is checked.
const MIN_SAMPLES: u64 = 300;

/// A tmux server of the test's own (its own socket), killed at the end.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.socket]);
        c.stdin(Stdio::null());
        c
    }

    fn run(&self, args: &[&str]) -> String {
        let o = self.cmd().args(args).output().expect("running tmux");
        assert!(
            o.status.success(),
            "tmux {args:?} failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// The pane's visible text.
    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "top"])
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self
            .cmd()
            .arg("kill-server")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The rank (line index) and sample count of each hot function's row on
/// `screen`, when all three are shown.
fn hot_rows(screen: &str) -> Option<Vec<(usize, u64, u64)>> {
    HOT.iter()
        .map(|f| {
            screen.lines().enumerate().find_map(|(i, l)| {
                let w: Vec<&str> = l.split_whitespace().collect();
                // Overhead, Samples, Command, Shared Object, [.], Symbol.
                if !(w.len() == 6 && w[2] == "demo64" && w[4] == "[.]" && w[5] == *f) {
                    return None;
                }
                let samples = w[1].parse().ok()?;
                // The overhead in hundredths of a percent (`12.34%`).
                let overhead = w[0].strip_suffix('%')?.replace('.', "").parse().ok()?;
                Some((i, samples, overhead))
            })
        })
        .collect()
}

/// A single-quoted shell word.
fn sh(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

#[test]
fn the_live_view_ranks_the_demo_hot_functions_and_q_writes_perf_data() {
    if !qemu_present() || !perf_present() {
        return;
    }
    if !have_tool_v("tmux") {
        eprintln!("SKIPPED: tmux is not installed (apt-get install --no-install-recommends tmux)");
        return;
    }
    let perch = perch_bin();
    let image = runtime_elf();
    let manifest = demo_manifest();
    let dir = tempfile::tempdir().expect("temporary directory");
    let data = dir.path().join("perf.data");
    let status = dir.path().join("status");
    let stderr = dir.path().join("stderr");
    let cache = dir.path().join("buildid");
    let line = format!(
        "env PERF_BUILDID_DIR={} {} top --image {} --appliance {} -o {} --timeout 240 2>{}; echo $? >{}; sleep 600",
        sh(&cache),
        sh(&perch),
        sh(&image),
        sh(&manifest),
        sh(&data),
        sh(&stderr),
        sh(&status),
    );
    let tmux = Tmux {
        socket: format!("perch-top-test-{}", std::process::id()),
    };
    let o = tmux
        .cmd()
        .env("TERM", "xterm-256color")
        .args([
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            "160",
            "-y",
            "48",
        ])
        .arg(&line)
        .output()
        .expect("starting tmux");
    assert!(
        o.status.success(),
        "tmux new-session failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );

    // The view, with demo64's hot functions in their order: the view must
    // be up within 60 s (the boot), and show them within 30 s of that.
    let start = Instant::now();
    let mut up: Option<Instant> = None;
    let (rows, screen) = loop {
        let screen = tmux.screen();
        if up.is_none() && screen.starts_with("perch top: ") {
            up = Some(Instant::now());
        }
        if let Some(r) = hot_rows(&screen)
            && r.iter().map(|&(_, n, _)| n).sum::<u64>() >= MIN_SAMPLES
        {
            break (r, screen);
        }
        assert!(
            !status.exists(),
            "perch top ended before the view showed the hot functions:\n{screen}\nstderr:\n{}",
            std::fs::read_to_string(&stderr).unwrap_or_default()
        );
        assert!(
            up.is_some() || start.elapsed() < Duration::from_secs(60),
            "after 60 s there is no view:\n{screen}"
        );
        assert!(
            up.is_none_or(|t| t.elapsed() < Duration::from_secs(30)),
            "30 s after it came up the view does not show demo64's hot functions with {MIN_SAMPLES} samples:\n{screen}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    eprintln!(
        "the view was up after {:.1} s and ranked demo64's rows (line, samples, overhead in 0.01 %) {rows:?} after {:.1} s",
        up.map_or(0.0, |t| t.duration_since(start).as_secs_f64()),
        start.elapsed().as_secs_f64()
    );
    assert!(
        screen.starts_with("perch top: ") && screen.contains("samples ("),
        "no status line:\n{screen}"
    );
    // The view ranks by overhead (the samples' periods, which differ as
    // the NMI clock's ticks come late or on time): a row with more is
    // higher up.
    for a in &rows {
        for b in &rows {
            assert!(
                a.2 <= b.2 || a.0 < b.0,
                "the view ranks a row with less overhead higher: {rows:?}\n{screen}"
            );
        }
    }
    // demo_checksum_blocks, half of demo64's work, leads. The other two
    // (30 % and 20 % of its instructions) are close in real time under
    // TCG, where an instruction's cost depends on its kind, so only their
    // presence is checked: each holds at least a tenth of the three rows.
    let total: u64 = rows.iter().map(|r| r.1).sum();
    assert!(
        rows[0].1 > rows[1].1 && rows[0].1 > rows[2].1,
        "demo_checksum_blocks does not lead: {rows:?}\n{screen}"
    );
    assert!(
        rows[1].1 * 10 >= total && rows[2].1 * 10 >= total,
        "demo_parse_records or demo_update_stats holds under a tenth: {rows:?}\n{screen}"
    );

    // Every program has its share, and runtime code its rows.
    let commands = screen
        .lines()
        .find(|l| l.starts_with("commands: "))
        .unwrap_or_else(|| panic!("no commands line:\n{screen}"));
    for p in ["demo64", "demo32", "demosys", "demoregs"] {
        assert!(
            commands.contains(&format!("{p} ")),
            "{p} missing: {commands}"
        );
    }
    assert!(screen.contains(" [k] "), "no runtime row:\n{screen}");

    // `p` steps to demo64's own view: its rows only.
    let mut own = None;
    for _ in 0..8 {
        tmux.run(&["send-keys", "-t", "top", "p"]);
        std::thread::sleep(Duration::from_millis(700));
        let s = tmux.screen();
        if s.lines().any(|l| l.starts_with("showing: demo64 ")) {
            own = Some(s);
            break;
        }
    }
    let own = own.unwrap_or_else(|| panic!("p never showed demo64's view:\n{}", tmux.screen()));
    let table: Vec<Vec<&str>> = own
        .lines()
        .skip_while(|l| !l.starts_with("Overhead"))
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|w| w.len() >= 6 && w[0].ends_with('%'))
        .collect();
    assert!(
        !table.is_empty() && table.iter().all(|w| w[2] == "demo64"),
        "demo64's view shows other commands:\n{own}"
    );
    assert!(
        table[0][5] == HOT[0],
        "demo64's view does not lead with {}:\n{own}",
        HOT[0]
    );

    // q stops the run; perch says so and exits 0.
    tmux.run(&["send-keys", "-t", "top", "q"]);
    let stopped = Instant::now();
    while !status.exists() {
        assert!(
            stopped.elapsed() < Duration::from_secs(60),
            "perch top did not end within 60 s of q:\n{}",
            tmux.screen()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The status file is written by the shell right after perch ends.
    std::thread::sleep(Duration::from_millis(200));
    let code = std::fs::read_to_string(&status).expect("status");
    let err = std::fs::read_to_string(&stderr).expect("stderr");
    assert_eq!(code.trim(), "0", "perch top's exit status; stderr:\n{err}");
    assert!(err.contains("stopped by the user (q)"), "{err}");
    assert!(!err.contains("error"), "{err}");
    // The last table stays on the screen after the view closes.
    let after = tmux.screen();
    assert!(after.contains("stopped:"), "no last table:\n{after}");

    // The perf.data opens in perf report, with the programs' own symbols.
    let o = Command::new("perf")
        .args(["report", "--stdio", "--sort", "comm,sym", "-i"])
        .arg(&data)
        .env("PERF_BUILDID_DIR", &cache)
        .env("PAGER", "cat")
        .stdin(Stdio::null())
        .output()
        .expect("running perf report");
    let report = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "perf report failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    for f in HOT {
        assert!(report.contains(f), "perf report lacks {f}:\n{report}");
    }
}

/// `tool -V` (tmux has no `--version`).
fn have_tool_v(tool: &str) -> bool {
    Command::new(tool)
        .arg("-V")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
