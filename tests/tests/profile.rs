//! End to end, as a user lives it: `perch record` boots the demo appliance
//! (the programs of `appliances/demo`, packed as the boot archive) under
//! `-icount shift=0,sleep=off`, the runtime samples it on the NMI clock and
//! streams the samples, and stock `perf report` / `perf script` and
//! `linux-perf-data` read the perf.data that comes out. Also forced losses
//! (exact accounting) and bad input through the whole pipe.
//!
//! The tests skip, saying why, only when QEMU or perf is missing.
#![forbid(unsafe_code)]

use e2e_tests::{
    Recording, perch_bin, perf_present, qemu_present, record_demo, run_perf, runtime_elf,
};
use linux_perf_data::linux_perf_event_reader::{CpuMode, EventRecord};
use linux_perf_data::{DsoKey, PerfFileReader, PerfFileRecord};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The designed split of `demo64`'s instructions between its hot functions.
const HOT: [(&str, f64); 3] = [
    ("demo_checksum_blocks", 50.0),
    ("demo_parse_records", 30.0),
    ("demo_update_stats", 20.0),
];

/// The register patterns `demoregs` holds while it spins.
use e2e_tests::DEMOREGS_PATTERNS as PATTERNS;

/// The demo appliance recorded once for every test of this binary: one
/// second of virtual time at 4 kHz.
fn demo() -> Option<&'static Recording> {
    static REC: OnceLock<Option<Recording>> = OnceLock::new();
    REC.get_or_init(|| qemu_present().then(|| record_demo(&["--freq", "4000", "--duration", "1"])))
        .as_ref()
        .inspect(|r| assert_eq!(r.status, Some(0), "perch record failed:\n{}", r.stderr))
}

/// One sample as `perf script -F comm,tid,ip,sym,dso,uregs` prints it.
#[derive(Debug, Default)]
struct ScriptSample {
    comm: String,
    /// `(address, symbol, dso)`, the sample IP first.
    chain: Vec<(u64, String, String)>,
    abi: Option<u64>,
    uregs: HashMap<String, u64>,
}

impl ScriptSample {
    fn sym(&self) -> &str {
        self.chain.first().map_or("", |c| c.1.as_str())
    }

    fn in_kernel(&self) -> bool {
        self.chain
            .first()
            .is_some_and(|c| c.2 == "[kernel.kallsyms]")
    }
}

fn script(rec: &Recording) -> Vec<ScriptSample> {
    let text = run_perf(rec, &["script", "-F", "comm,tid,ip,sym,dso,uregs"], &[]);
    let mut out: Vec<ScriptSample> = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        if t.starts_with("ABI:") {
            let s = out.last_mut().expect("registers after a sample line");
            for f in t.split_whitespace() {
                let (k, v) = f.split_once(':').expect("register field");
                if k == "ABI" {
                    s.abi = v.parse().ok();
                } else {
                    let v = u64::from_str_radix(v.trim_start_matches("0x"), 16)
                        .expect("register value");
                    s.uregs.insert(k.to_owned(), v);
                }
            }
        } else if line.starts_with('\t') {
            let s = out.last_mut().expect("callchain after a sample line");
            let mut parts = t.splitn(2, ' ');
            let addr = u64::from_str_radix(parts.next().unwrap_or(""), 16).unwrap_or(0);
            let rest = parts.next().unwrap_or("").trim();
            let (sym, dso) = match rest.rfind(" (") {
                Some(i) => (&rest[..i], rest[i + 2..].trim_end_matches(')')),
                None => (rest, ""),
            };
            s.chain.push((addr, sym.to_owned(), dso.to_owned()));
        } else {
            out.push(ScriptSample {
                comm: t.split_whitespace().next().unwrap_or("").to_owned(),
                ..Default::default()
            });
        }
    }
    out
}

/// `(taken, delivered, lost)` from the target's End record, via `perch stat`.
fn end_counters(capture: &Path) -> (u64, u64, u64) {
    let nums = e2e_tests::stat_numbers(capture, "end: taken ");
    (nums[0], nums[1], nums[2])
}

/// What linux-perf-data finds in a perf.data file.
#[derive(Debug, Default)]
struct FileContents {
    samples: u64,
    user_samples: u64,
    lost_in_lost_records: u64,
    lost_samples_records: u64,
    throttle_records: u64,
    unthrottle_records: u64,
    comms: Vec<String>,
    kernel_build_id: Option<Vec<u8>>,
    event_name: Option<String>,
    /// Every sample's PERIOD, in file order.
    periods: Vec<u64>,
}

fn read_back(path: &Path) -> FileContents {
    let reader = std::io::BufReader::new(std::fs::File::open(path).expect("open perf.data"));
    let PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = PerfFileReader::parse_file(reader).expect("linux-perf-data parses the file");
    let mut c = FileContents {
        event_name: perf_file.event_attributes()[0].name().map(str::to_owned),
        kernel_build_id: perf_file
            .build_ids()
            .expect("build ids")
            .get(&DsoKey::Kernel)
            .map(|b| b.build_id.clone()),
        ..Default::default()
    };
    while let Some(rec) = record_iter.next_record(&mut perf_file).expect("record") {
        let PerfFileRecord::EventRecord { record, .. } = rec else {
            continue;
        };
        if record.record_type.0 == 13 {
            // PERF_RECORD_LOST_SAMPLES: u64 lost.
            let data = record.data.as_slice();
            c.lost_samples_records += u64::from_le_bytes(data[..8].try_into().unwrap());
            continue;
        }
        match record.record_type.0 {
            // PERF_RECORD_THROTTLE / PERF_RECORD_UNTHROTTLE.
            5 => c.throttle_records += 1,
            6 => c.unthrottle_records += 1,
            _ => {}
        }
        match record.parse().expect("record parses") {
            EventRecord::Sample(s) => {
                c.samples += 1;
                c.user_samples += u64::from(s.cpu_mode == CpuMode::User);
                c.periods
                    .push(s.period.expect("cpu-clock samples carry PERIOD"));
            }
            EventRecord::Lost(l) => c.lost_in_lost_records += l.count,
            EventRecord::Comm(cm) => c
                .comms
                .push(String::from_utf8_lossy(&cm.name.as_slice()).into_owned()),
            _ => {}
        }
    }
    c
}

#[test]
fn hot_functions_get_their_designed_share_with_correct_symbols() {
    let Some(rec) = demo() else { return };
    if !perf_present() {
        return;
    }
    let samples = script(rec);
    let user64: Vec<&ScriptSample> = samples
        .iter()
        .filter(|s| s.comm == "demo64" && !s.in_kernel())
        .collect();
    assert!(
        user64.len() > 1000,
        "too few demo64 samples: {}",
        user64.len()
    );
    let hot = |name: &str| user64.iter().filter(|s| s.sym() == name).count() as f64;
    let in_hot: f64 = HOT.iter().map(|(n, _)| hot(n)).sum();
    let frac = 100.0 * in_hot / user64.len() as f64;
    assert!(
        frac >= 95.0,
        "only {frac:.1}% of demo64's user samples in its hot functions"
    );
    for (name, designed) in HOT {
        let share = 100.0 * hot(name) / in_hot;
        assert!(
            (share - designed).abs() <= 5.0,
            "{name}: {share:.1}% of the hot-function samples, designed {designed}%"
        );
    }
    // perf report agrees, with the names.
    let report = run_perf(
        rec,
        &["report", "--stdio", "--no-children", "-g", "none"],
        &[],
    );
    for (name, _) in HOT {
        assert!(
            report
                .lines()
                .any(|l| l.contains("demo64") && l.contains(&format!("[.] {name}"))),
            "{name} missing from perf report:\n{report}"
        );
    }
}

#[test]
fn runtime_samples_resolve_to_runtime_symbols() {
    let Some(rec) = demo() else { return };
    if !perf_present() {
        return;
    }
    let samples = script(rec);
    let kernel: Vec<&ScriptSample> = samples.iter().filter(|s| s.in_kernel()).collect();
    assert!(
        kernel.len() > 50,
        "too few runtime samples: {}",
        kernel.len()
    );
    let unknown = kernel.iter().filter(|s| s.sym() == "[unknown]").count();
    assert_eq!(unknown, 0, "runtime samples without a symbol: {unknown}");
    // demosys spends its time in the getrandom system call.
    assert!(
        kernel
            .iter()
            .any(|s| s.comm == "demosys" && in_getrandom(s)),
        "no demosys sample inside getrandom"
    );
}

#[test]
fn user_registers_show_the_exact_patterns_and_abis() {
    let Some(rec) = demo() else { return };
    if !perf_present() {
        return;
    }
    let samples = script(rec);
    let regs: Vec<&ScriptSample> = samples
        .iter()
        .filter(|s| s.sym() == "perch_demoregs_spin")
        .collect();
    assert!(regs.len() > 20, "too few demoregs samples: {}", regs.len());
    for s in &regs {
        assert_eq!(s.abi, Some(2), "{s:?}");
        for (name, value) in PATTERNS {
            assert_eq!(s.uregs.get(name), Some(&value), "{name} in {s:?}");
        }
        assert_eq!(s.uregs.get("CS"), Some(&0x2b), "{s:?}");
    }
    let compat: Vec<&ScriptSample> = samples
        .iter()
        .filter(|s| s.comm == "demo32" && !s.in_kernel())
        .collect();
    assert!(
        compat.len() > 20,
        "too few demo32 samples: {}",
        compat.len()
    );
    for s in &compat {
        assert_eq!(s.abi, Some(1), "{s:?}");
        for r in ["R8", "R9", "R10", "R11", "R12", "R13", "R14", "R15"] {
            assert_eq!(s.uregs.get(r), Some(&0), "{r} in {s:?}");
        }
        assert_eq!(s.uregs.get("CS"), Some(&0x1b), "{s:?}");
    }
    // demo32 spends its time in its CRC loop; a sample may land in its
    // start-up (musl's malloc) first, as the clock's phase falls.
    let in_loop = compat
        .iter()
        .filter(|s| s.sym() == "perch_demo32_crc_loop")
        .count();
    assert!(
        in_loop * 10 >= compat.len() * 9,
        "{in_loop} of {} demo32 samples in perch_demo32_crc_loop",
        compat.len()
    );
}

/// Whether the sample's runtime frames are inside the getrandom handler.
fn in_getrandom(s: &ScriptSample) -> bool {
    s.chain
        .iter()
        .any(|c| c.2 == "[kernel.kallsyms]" && c.1.contains("getrandom"))
}

#[test]
fn samples_inside_syscalls_carry_the_user_frame_saved_at_entry() {
    let Some(rec) = demo() else { return };
    if !perf_present() {
        return;
    }
    let samples = script(rec);
    let in_call: Vec<&ScriptSample> = samples
        .iter()
        .filter(|s| s.comm == "demosys" && s.in_kernel() && in_getrandom(s))
        .collect();
    assert!(
        in_call.len() > 20,
        "too few samples in getrandom: {}",
        in_call.len()
    );
    for s in &in_call {
        assert_eq!(s.abi, Some(2), "{s:?}");
        // SYSCALL put the user RIP into RCX: the saved frame shows both.
        let ip = s.uregs["IP"];
        assert_eq!(s.uregs.get("CX"), Some(&ip), "{s:?}");
        assert_eq!(
            s.uregs.get("AX"),
            Some(&318),
            "the getrandom call number: {s:?}"
        );
        assert_eq!(s.uregs.get("CS"), Some(&0x2b), "{s:?}");
        // The callchain crosses from the runtime into the program: first
        // the call's own user frame, then its caller.
        let user: Vec<&str> = s
            .chain
            .iter()
            .filter(|c| c.2 != "[kernel.kallsyms]")
            .map(|c| c.1.as_str())
            .collect();
        assert_eq!(
            user.first().copied(),
            Some("demosys_fetch_random"),
            "the user frame saved at entry: {s:?}"
        );
        assert!(
            user.contains(&"demosys_main"),
            "no caller frame in the callchain: {s:?}"
        );
    }
}

#[test]
fn linux_perf_data_reads_the_recording_and_counts_match_the_target() {
    let Some(rec) = demo() else { return };
    let (taken, delivered, lost) = end_counters(&rec.capture);
    let c = read_back(&rec.data);
    assert_eq!(c.event_name.as_deref(), Some("cpu-clock"));
    assert_eq!(c.samples, delivered);
    assert_eq!(c.lost_samples_records, lost);
    assert_eq!(taken, delivered + lost);
    assert!(c.user_samples > c.samples / 2, "{c:?}");
    for task in ["demo64", "demo32", "demosys", "demoregs"] {
        assert!(
            c.comms.iter().any(|n| n == task),
            "no COMM for {task}: {c:?}"
        );
    }
    let elf = std::fs::read(runtime_elf()).expect("runtime ELF");
    let id = c.kernel_build_id.expect("kernel build-id in perf.data");
    assert!(
        elf.windows(id.len()).any(|w| w == id.as_slice()),
        "the file's kernel build-id is not the image's"
    );
}

/// `perf report` on a recording with losses: it counts exactly `lost`
/// (perf warns about LOST records as lost chunks, which is the point).
fn perf_reports_lost(rec: &Recording, lost: u64) {
    if !perf_present() {
        return;
    }
    let report = run_perf(
        rec,
        &["report", "--stdio", "--no-children", "-g", "none"],
        &[
            "Warning:",
            " chunks!",
            " samples and lost ",
            "Check IO/CPU overload!",
        ],
    );
    assert!(
        report.contains(&format!("Total Lost Samples: {lost}")),
        "{report}"
    );
}

/// cpu-clock semantics: each sample's PERIOD is the time since the clock's
/// previous tick, so the periods add up to the time sampled, and the
/// runtime reports the rate it achieved against the one requested.
#[test]
fn clock_periods_are_the_time_since_the_previous_tick() {
    let Some(rec) = demo() else { return };
    let line = rec
        .stderr
        .lines()
        .find(|l| l.contains("perch: NMI clock: "))
        .unwrap_or_else(|| panic!("no rate line:\n{}", rec.stderr));
    let hz = |after: &str| -> f64 {
        line.split(after)
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|hz| hz.parse().ok())
            .unwrap_or_else(|| panic!("no rate after `{after}` in {line}"))
    };
    let (achieved, requested) = (hz(" s: "), hz(" achieved of "));
    assert!(
        (requested - 4000.0).abs() < 10.0,
        "requested {requested} Hz: {line}"
    );
    // Under icount the clock keeps its rate exactly.
    assert!(
        (achieved - requested).abs() < requested * 0.01,
        "achieved {achieved} Hz: {line}"
    );
    let tick_ns = 1e9 / requested;
    let c = read_back(&rec.data);
    let sum: u64 = c.periods.iter().sum();
    // One second of virtual time was sampled (under icount, exactly
    // instructions); the first period runs from the start of sampling.
    assert!(
        (0.99e9..=1.01e9).contains(&(sum as f64)),
        "periods add up to {sum} ns over a 1 s recording"
    );
    for (i, &p) in c.periods.iter().enumerate().skip(1) {
        assert!(
            (p as f64 - tick_ns).abs() < tick_ns * 0.01,
            "sample {i}: period {p} ns, the clock ticks every {tick_ns:.0} ns"
        );
    }
}

#[test]
fn forced_losses_are_counted_exactly() {
    if !qemu_present() {
        return;
    }
    // Two ring slots and 50k NMIs/s: the ring overflows between drains.
    let rec = record_demo(&["--freq", "50000", "--duration", "0.2", "--ring", "2"]);
    assert_eq!(rec.status, Some(0), "{}", rec.stderr);
    let (taken, delivered, lost) = end_counters(&rec.capture);
    assert!(
        lost > 0,
        "no losses forced: taken {taken}, delivered {delivered}"
    );
    assert_eq!(taken, delivered + lost);
    let c = read_back(&rec.data);
    assert_eq!(c.samples, delivered);
    assert_eq!(c.lost_in_lost_records, lost);
    assert_eq!(c.lost_samples_records, lost);
    perf_reports_lost(&rec, lost);
}

#[test]
fn throttled_overflows_are_counted_exactly() {
    if !qemu_present() {
        return;
    }
    // 20 NMIs per 1 ms tick, 4 allowed (max_rate=4000): each tick's fifth
    // NMI samples and throttles, the rest of the tick is suppressed, and
    // the next tick unthrottles.
    // A flight-recorder buffer: a drain that waited on a slow host would
    // run past the 0.2 s and take more ticks.
    let rec = record_demo(&[
        "--freq",
        "20000",
        "--max-rate",
        "4000",
        "--duration",
        "0.2",
        "--buffer",
        "16",
    ]);
    assert_eq!(rec.status, Some(0), "{}", rec.stderr);
    assert!(
        rec.stderr
            .contains("throttle: max_rate=4000/s (4 per 1000 Hz tick)"),
        "{}",
        rec.stderr
    );
    let end = e2e_tests::stat_numbers(&rec.capture, "end: taken ");
    let (taken, delivered, lost, throttled) = (end[0], end[1], end[2], end[3]);
    let lost_line = e2e_tests::stat_numbers(&rec.capture, "lost (target): ");
    let suppressed = lost_line[1];
    assert_eq!(lost_line[0], lost, "Lost records vs End");
    assert!(throttled > 0 && suppressed > 0, "not throttled: {end:?}");
    assert_eq!(taken, delivered + lost);
    // Only throttling loses samples here (the ring never fills at this rate).
    assert_eq!(
        suppressed, lost,
        "lost {lost}, of which throttled {suppressed}"
    );
    // About 5 samples per tick of 200, against 20 NMIs per tick.
    assert!(
        (4 * 190..=5 * 203).contains(&delivered),
        "{delivered} samples in 0.2 s at max_rate=4000"
    );
    assert!(
        taken >= 3 * delivered,
        "taken {taken}, delivered {delivered}"
    );
    let c = read_back(&rec.data);
    assert_eq!(c.samples, delivered);
    assert_eq!(c.samples + c.lost_samples_records, taken);
    assert_eq!(c.lost_in_lost_records, lost);
    assert_eq!(c.throttle_records, throttled);
    // A suppressed tick keeps its own time: the samples that follow it
    // stand for one tick each (20 kHz: 50 us), not for the gap.
    let tick = 1e9 / 20_000.0;
    for (i, &p) in c.periods.iter().enumerate().skip(1) {
        assert!(
            (p as f64 - tick).abs() < tick * 0.02,
            "sample {i}: period {p} ns, the clock ticks every {tick:.0} ns"
        );
    }
    assert!(
        c.unthrottle_records + 1 >= throttled && c.unthrottle_records <= throttled,
        "{} THROTTLE, {} UNTHROTTLE",
        c.throttle_records,
        c.unthrottle_records
    );
    perf_reports_lost(&rec, lost);
}

#[test]
fn throttling_stops_and_restarts_the_simulated_pmu() {
    if !qemu_present() {
        return;
    }
    // pmu=sim: every clock NMI is a PMI of the simulated counter (period
    // 1). Throttling stops the counter through the driver, so no overflow
    // arrives (none is suppressed or lost), and each tick restarts it.
    let rec = record_demo(&[
        "--pmu",
        "sim",
        "--freq",
        "20000",
        "--max-rate",
        "4000",
        "--duration",
        "0.2",
        "--buffer",
        "16",
    ]);
    assert_eq!(rec.status, Some(0), "{}", rec.stderr);
    let end = e2e_tests::stat_numbers(&rec.capture, "end: taken ");
    let (taken, delivered, lost, throttled) = (end[0], end[1], end[2], end[3]);
    assert_eq!((taken, lost), (delivered, 0), "{end:?}");
    assert!(throttled >= 150, "throttled {throttled} times in 200 ticks");
    // Five samples per tick (four allowed, the fifth throttles), restarted
    // every tick.
    assert!(
        (5 * 190..=5 * 203).contains(&delivered),
        "{delivered} samples in 0.2 s at max_rate=4000"
    );
    let c = read_back(&rec.data);
    assert_eq!(c.samples, delivered);
    assert_eq!(c.throttle_records, throttled);
    assert!(c.unthrottle_records + 1 >= throttled && c.unthrottle_records <= throttled);
}

#[test]
fn cpu_time_budget_lowers_the_rate_and_says_so_after_the_run() {
    if !qemu_present() {
        return;
    }
    // cpu_pct=1 at the default max_rate allows 100 ns per sample on
    // average; a default sample takes about 230 instructions (ns here).
    let rec = record_demo(&["--freq", "20000", "--cpu-pct", "1", "--duration", "0.2"]);
    assert_eq!(rec.status, Some(0), "{}", rec.stderr);
    let line = rec
        .stderr
        .lines()
        .find(|l| l.contains("perch: interrupt took too long ("))
        .unwrap_or_else(|| panic!("no lowered-rate report:\n{}", rec.stderr));
    let rate: u64 = line
        .rsplit("lowered max_rate to ")
        .next()
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(rate > 0 && rate < 100_000, "{line}");
    let (taken, delivered, lost) = end_counters(&rec.capture);
    assert_eq!(taken, delivered + lost);
}

fn perch(args: &[&str], path: Option<&str>) -> (Option<i32>, String) {
    let mut cmd = Command::new(perch_bin());
    cmd.args(args).stdin(Stdio::null());
    if let Some(p) = path {
        cmd.env("PATH", p);
    }
    let out = cmd.output().expect("running perch");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "perch panicked: {stderr}");
    (out.status.code(), stderr)
}

#[test]
fn bad_input_gives_clear_errors_and_exit_codes() {
    let Some(rec) = demo() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).display().to_string();
    let full = std::fs::read(&rec.capture).unwrap();

    // Truncated: written, but exit 7 and said.
    std::fs::write(p("trunc.bin"), &full[..full.len() / 2]).unwrap();
    let (code, err) = perch(&["convert", &p("trunc.bin"), "-o", &p("t.data")], None);
    assert_eq!(code, Some(7), "{err}");
    assert!(err.contains("before its End record"), "{err}");

    // Garbage: exit 3.
    let garbage: Vec<u8> = (0..5000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(p("garbage.bin"), garbage).unwrap();
    let (code, err) = perch(&["convert", &p("garbage.bin"), "-o", &p("g.data")], None);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("not a Perch stream"), "{err}");

    // Wrong protocol version: exit 3, naming the versions.
    let mut hello = sampler::wire::Hello::new(
        sampler::wire::CpuId {
            vendor: sampler::wire::CpuVendor::Intel,
            family: 6,
            model: 1,
            stepping: 0,
        },
        sampler::event::PmuCaps::cpu_clock(),
    );
    hello.version = sampler::wire::PROTOCOL_VERSION + 7;
    let mut enc: sampler::wire::Encoder<4> = sampler::wire::Encoder::new(Default::default());
    let mut buf = [0u8; sampler::wire::MAX_FRAME];
    let n = enc
        .encode(&sampler::wire::Record::Hello(hello), &mut buf)
        .unwrap();
    std::fs::write(p("version.bin"), &buf[..n]).unwrap();
    let (code, err) = perch(&["convert", &p("version.bin"), "-o", &p("v.data")], None);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("version"), "{err}");

    // Wrong ELF for the stream's build-id: exit 4.
    let other =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../host-tool/tests/fixtures/other.elf");
    let (code, err) = perch(
        &[
            "convert",
            &rec.capture.display().to_string(),
            "--image",
            &other.display().to_string(),
            "-o",
            &p("o.data"),
        ],
        None,
    );
    assert_eq!(code, Some(4), "{err}");
    assert!(err.contains("build-id"), "{err}");

    // Missing QEMU (a PATH without it): exit 5 with the install line.
    let elf = runtime_elf().display().to_string();
    let manifest = e2e_tests::programs::demo_manifest().display().to_string();
    let (code, err) = perch(
        &[
            "record",
            "--image",
            &elf,
            "--appliance",
            &manifest,
            "-o",
            &p("q.data"),
        ],
        Some("/nonexistent"),
    );
    assert_eq!(code, Some(5), "{err}");
    assert!(err.contains("apt-get install qemu-system-x86"), "{err}");

    // Missing perf for the build-id cache: the file is still written
    // (exit 0), and perch says how to install perf.
    let (code, err) = perch(
        &[
            "convert",
            &rec.capture.display().to_string(),
            "--image",
            &elf,
            "--buildid-cache",
            "-o",
            &p("b.data"),
        ],
        Some("/nonexistent"),
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("apt-get install linux-perf"), "{err}");
    assert!(dir.path().join("b.data").exists());
}
