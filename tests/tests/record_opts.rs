//! `perch record`'s perf-style options end to end: each option's runtime
//! command line reaches the runtime, and the perf.data it writes carries the
//! attr perf would write for it (type, config, period or frequency,
//! sample_type, precise_ip, register masks, branch_sample_type), read back
//! with linux-perf-data and `perf report --header-only`; the samples carry
//! what the attr says (exactly the registers asked for, a call chain only
//! with -g, branch stacks filtered by -j). Combinations the target cannot do
//! are refused before boot with perf's messages, or at the Hello where only
//! the booted runtime can know (`--pmu auto` without a PMU). `-q` keeps
//! stderr free of progress and summary; without it, stderr not being a
//! terminal, the summary is plain lines.
//!
//! Each run records `hotspots 300` (tests/programs/c/hotspots.c, gcc
//! -static) under icount. The tests skip, saying why, when QEMU or perf is
//! missing (the refusals before boot need neither).
#![forbid(unsafe_code)]

use e2e_tests::programs::{CBuild, c_program};
use e2e_tests::{
    Recording, perch_bin, qemu_and_perf_present, record_hotspots, run_perf, runtime_elf,
};
use linux_perf_data::linux_perf_event_reader::{
    CpuMode, EventRecord, IpSkidConstraint, PerfEventAttr, PerfEventType, SampleFormat,
    SamplingPolicy, SoftwareCounterType,
};
use linux_perf_data::{PerfFileReader, PerfFileRecord};
use std::process::{Command, Stdio};

/// `perch record --icount OPTS -- hotspots 300`, which must succeed.
fn rec(opts: &[&str]) -> Recording {
    let r = record_hotspots(opts);
    assert_eq!(
        r.status,
        Some(0),
        "perch record {opts:?} failed:\n{}",
        r.stderr
    );
    r
}

/// One sample's registers (perf index, value) and call chain length.
#[derive(Debug, Default)]
struct Sample {
    user_regs: Option<Vec<(u64, u64)>>,
    intr_regs: Option<Vec<(u64, u64)>>,
    callchain: Option<usize>,
    period: Option<u64>,
    ip: Option<u64>,
    user: bool,
}

/// The file's one attr and its samples, as linux-perf-data reads them.
fn read_back(rec: &Recording) -> (PerfEventAttr, Vec<Sample>) {
    let reader = std::io::BufReader::new(std::fs::File::open(&rec.data).expect("open perf.data"));
    let PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = PerfFileReader::parse_file(reader).expect("linux-perf-data parses the file");
    let attrs = perf_file.event_attributes();
    assert_eq!(attrs.len(), 1, "one event, one attr");
    let attr = attrs[0].attr;
    let regs = |r: &Option<linux_perf_data::linux_perf_event_reader::Regs<'_>>| {
        r.as_ref()
            .map(|r| (0..24).filter_map(|i| r.get(i).map(|v| (i, v))).collect())
    };
    let mut samples = Vec::new();
    while let Some(r) = record_iter.next_record(&mut perf_file).expect("record") {
        let PerfFileRecord::EventRecord { record, .. } = r else {
            continue;
        };
        if let EventRecord::Sample(s) = record.parse().expect("record parses") {
            samples.push(Sample {
                user_regs: regs(&s.user_regs),
                intr_regs: regs(&s.intr_regs),
                callchain: s.callchain.as_ref().map(|c| c.len()),
                period: s.period,
                ip: s.ip,
                user: s.cpu_mode == CpuMode::User,
            });
        }
    }
    assert!(samples.len() > 20, "too few samples: {}", samples.len());
    (attr, samples)
}

/// The `# event :` line of `perf report --header-only`.
fn header_event(rec: &Recording) -> String {
    let text = run_perf(rec, &["report", "--header-only"], &[]);
    text.lines()
        .find(|l| l.starts_with("# event :"))
        .unwrap_or_else(|| panic!("no event line in:\n{text}"))
        .to_owned()
}

/// Per sample, the number of branch entries `perf script -F brstack` shows.
fn branch_entries(rec: &Recording) -> Vec<usize> {
    run_perf(rec, &["script", "-F", "brstack"], &["kallsyms", "vmlinux"])
        .lines()
        .map(|l| l.split_whitespace().filter(|w| w.starts_with("0x")).count())
        .collect()
}

#[test]
fn sim_branch_filter_registers_and_call_graph_reach_the_attr_and_the_samples() {
    if !qemu_and_perf_present() {
        return;
    }
    let r = rec(&[
        "--pmu",
        "sim",
        "-j",
        "any_call,u",
        "-g",
        "--user-regs=ax,ip,sp",
        "--intr-regs=bp,r15",
    ]);
    assert!(
        r.stderr.contains(
            "command line \"console=wire freq=1000 pmu=sim callchain=fp uregs_mask=0x181 \
             iregs_mask=0x800040 branch=0x11"
        ),
        "{}",
        r.stderr
    );
    let (attr, samples) = read_back(&r);
    // The simulated PMU's precise mem-loads (MEM_TRANS_RETIRED.LOAD_LATENCY).
    assert!(
        matches!(attr.type_, PerfEventType::DynamicPmu(4, 0x1cd, _, _)),
        "{:?}",
        attr.type_
    );
    assert_eq!(attr.flags.ip_skid_constraint(), IpSkidConstraint::ZeroSkid);
    let want = SampleFormat::CALLCHAIN
        | SampleFormat::REGS_USER
        | SampleFormat::REGS_INTR
        | SampleFormat::BRANCH_STACK
        | SampleFormat::IDENTIFIER;
    assert!(
        attr.sample_format.contains(want),
        "{:?}",
        attr.sample_format
    );
    assert_eq!(attr.sample_regs_user, 0x181);
    assert_eq!(attr.sample_regs_intr, 0x80_0040);
    assert_eq!(attr.branch_sample_format.bits(), 0x11, "USER|ANY_CALL");
    let line = header_event(&r);
    for part in [
        "type = 4",
        "config = 0x1cd",
        "precise_ip = 2",
        "branch_sample_type = USER|ANY_CALL",
        "sample_regs_user = 0x181",
        "sample_regs_intr = 0x800040",
    ] {
        assert!(line.contains(part), "{part} not in {line}");
    }
    assert!(
        line.contains("CALLCHAIN") && line.contains("REGS_INTR"),
        "{line}"
    );
    // Exactly the registers asked for: AX (0), SP (7), IP (8); BP (6), R15 (23).
    let user: Vec<_> = samples
        .iter()
        .filter_map(|s| s.user_regs.as_ref())
        .collect();
    assert!(
        user.len() > 20,
        "{} samples with user registers",
        user.len()
    );
    for u in &user {
        let idx: Vec<u64> = u.iter().map(|&(i, _)| i).collect();
        assert_eq!(idx, [0, 7, 8], "{u:?}");
    }
    for s in &samples {
        let intr = s.intr_regs.as_ref().expect("every sample has REGS_INTR");
        let idx: Vec<u64> = intr.iter().map(|&(i, _)| i).collect();
        assert_eq!(idx, [6, 23], "{intr:?}");
        assert!(
            s.callchain.is_some_and(|n| n > 0),
            "-g: a call chain in {s:?}"
        );
    }
    // The simulator's branches are jumps: a call filter leaves none.
    let entries = branch_entries(&r);
    assert!(!entries.is_empty());
    assert!(
        entries.iter().all(|&n| n == 0),
        "any_call kept entries: {entries:?}"
    );
}

#[test]
fn sim_branch_any_records_branches_with_perchs_default_sample_set() {
    if !qemu_and_perf_present() {
        return;
    }
    let r = rec(&["--pmu", "sim", "-b"]);
    let (attr, samples) = read_back(&r);
    assert_eq!(attr.branch_sample_format.bits(), 1 << 3, "ANY");
    // No -g or register options: perch's default set (call chain, all GPRs).
    assert!(
        attr.sample_format
            .contains(SampleFormat::CALLCHAIN | SampleFormat::REGS_USER)
    );
    assert_eq!(attr.sample_regs_user, 0xff_0fff);
    assert!(samples.iter().all(|s| s.callchain.is_some()));
    assert!(header_event(&r).contains("branch_sample_type = ANY,"));
    let entries = branch_entries(&r);
    let with = entries.iter().filter(|&&n| n > 0).count();
    assert!(
        with * 2 > entries.len(),
        "only {with} of {} samples have branch entries",
        entries.len()
    );
}

#[test]
fn sim_count_samples_every_nth_load() {
    if !qemu_and_perf_present() {
        return;
    }
    // The clock ticks the simulator; -F and -c exclude each other.
    let every = rec(&["--pmu", "sim", "--boot-arg", "freq=8000", "-q"]);
    let fourth = rec(&["--pmu", "sim", "--boot-arg", "freq=8000", "-c", "4", "-q"]);
    let (attr, _) = read_back(&every);
    match attr.sampling_policy {
        SamplingPolicy::Period(p) => assert_eq!(p.get(), 1),
        other => panic!("the simulator samples with a period, not {other:?}"),
    }
    let (attr, samples) = read_back(&fourth);
    match attr.sampling_policy {
        SamplingPolicy::Period(p) => assert_eq!(p.get(), 4),
        other => panic!("-c gives a period, not {other:?}"),
    }
    assert!(
        samples.iter().all(|s| s.period == Some(4)),
        "a sample's period is not 4"
    );
    // Under icount the same loads, sampled every 4th: far fewer samples
    // (not exactly a quarter, by the simulator's overflow-to-PMI timing:
    // 610 and 88 when this was written).
    let n1 = read_back(&every).1.len() as f64;
    let n4 = samples.len() as f64;
    assert!(n1 / n4 >= 3.0, "{n1} samples, then {n4} at -c 4");
}

#[test]
fn nmi_clock_count_and_user_regs_without_call_graph() {
    if !qemu_and_perf_present() {
        return;
    }
    let r = rec(&["-e", "cpu-clock", "-c", "250000", "--user-regs=ip,sp"]);
    // cpu-clock is --pmu off; a 250 us period ticks the clock at 4 kHz.
    assert!(
        r.stderr.contains(
            "command line \"console=wire freq=1000 pmu=off period=250000 callchain=no \
             uregs_mask=0x180 iregs_mask=0x0"
        ),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("at 4000 Hz"), "{}", r.stderr);
    let (attr, samples) = read_back(&r);
    assert!(
        matches!(
            attr.type_,
            PerfEventType::Software(SoftwareCounterType::CpuClock)
        ),
        "{:?}",
        attr.type_
    );
    match attr.sampling_policy {
        SamplingPolicy::Period(p) => assert_eq!(p.get(), 250_000),
        other => panic!("-c gives a period, not {other:?}"),
    }
    assert!(attr.sample_format.contains(SampleFormat::REGS_USER));
    assert!(!attr.sample_format.contains(SampleFormat::CALLCHAIN));
    assert!(!attr.sample_format.contains(SampleFormat::REGS_INTR));
    assert_eq!(attr.sample_regs_user, 0x180);
    assert_eq!(
        attr.flags.ip_skid_constraint(),
        IpSkidConstraint::ArbitrarySkid
    );
    assert_eq!(attr.branch_sample_format.bits(), 0);
    for (i, s) in samples.iter().enumerate() {
        assert_eq!(s.callchain, None, "no -g: no call chain");
        // The PIT's nearest rate to 4 kHz: within 0.1 % of 250 us (a
        // clock sample's period is the time since the previous tick; the
        // first one's runs from the start of sampling).
        assert!(
            i == 0 || s.period.is_some_and(|p| p.abs_diff(250_000) < 250),
            "{s:?}"
        );
        if let Some(u) = &s.user_regs {
            let idx: Vec<u64> = u.iter().map(|&(i, _)| i).collect();
            assert_eq!(idx, [7, 8], "{u:?}");
            // Each value in its own slot: a user sample's IP register is
            // its IP, its SP somewhere else.
            if s.user {
                assert_eq!(Some(u[1].1), s.ip, "{s:?}");
                assert_ne!(u[0].1, u[1].1, "{s:?}");
            }
        }
    }
    assert!(
        samples
            .iter()
            .filter(|s| s.user && s.user_regs.is_some())
            .count()
            > 20,
        "too few user samples with registers"
    );
    let line = header_event(&r);
    assert!(
        line.contains("type = 1") && line.contains("= 250000"),
        "{line}"
    );
    assert!(!line.contains("CALLCHAIN"), "{line}");
    // stderr is not a terminal: the summary is plain lines.
    assert!(
        r.stderr.lines().any(|l| l.starts_with("perch: ")
            && l.contains(" lost, ")
            && l.contains("/s on the wire")),
        "{}",
        r.stderr
    );
}

#[test]
fn frequency_sets_the_clock_and_the_attr() {
    if !qemu_and_perf_present() {
        return;
    }
    let r = rec(&["--pmu", "off", "-F", "2000", "-q"]);
    let (attr, _) = read_back(&r);
    match attr.sampling_policy {
        SamplingPolicy::Frequency(hz) => assert_eq!(hz, 2000),
        other => panic!("-F gives a frequency, not {other:?}"),
    }
    // -q: the program's output, nothing of perch's.
    assert!(r.stdout.contains("hotspots: 300 rounds"), "{}", r.stdout);
    assert!(
        !r.stderr
            .lines()
            .any(|l| l.starts_with("perch:") || l.starts_with("target:")),
        "-q printed:\n{}",
        r.stderr
    );
}

#[test]
fn an_event_auto_cannot_sample_is_refused_at_the_hello() {
    if !qemu_and_perf_present() {
        return;
    }
    // Under icount (TCG) the appliance has no PMU.
    let r = record_hotspots(&["-e", "instructions"]);
    assert_eq!(r.status, Some(2), "{}", r.stderr);
    assert!(
        r.stderr.contains(
            "The sys_perf_event_open() syscall returned with 95 (Operation not supported) \
             for event (instructions)."
        ),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("no usable PMU"), "{}", r.stderr);
    assert!(!r.data.exists(), "no perf.data for a refused event");
}

/// `perch record --qemu /nonexistent OPTS -- /bin/true`: a refusal before
/// boot is exit 2 with its message; had perch tried to boot, it would
/// have failed on the QEMU binary (exit 5).
fn refused_before_boot(opts: &[&str]) -> String {
    let out = Command::new(perch_bin())
        .arg("record")
        .arg("--image")
        .arg(runtime_elf())
        .args(["--qemu", "/nonexistent/qemu-system-x86_64"])
        .args(opts)
        .args(["--", "/bin/true"])
        .stdin(Stdio::null())
        .output()
        .expect("running perch record");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{opts:?}: {stderr}");
    stderr
}

#[test]
fn combinations_the_target_cannot_do_are_refused_before_boot() {
    let e = refused_before_boot(&["-e", "cycles:pp", "--pmu", "off"]);
    assert!(
        e.contains(
            "The sys_perf_event_open() syscall returned with 95 (Operation not supported) \
             for event (cycles:pp)."
        ),
        "{e}"
    );
    let e = refused_before_boot(&["--pmu", "off", "-b"]);
    assert!(
        e.contains("cpu-clock: PMU Hardware or event type doesn't support branch stack sampling."),
        "{e}"
    );
    let e = refused_before_boot(&["-e", "cycles,instructions", "--pmu", "off"]);
    assert!(e.contains("for event (cycles,instructions)"), "{e}");
    let e = refused_before_boot(&["--intr-regs=ax,fs"]);
    assert!(e.contains("returned with 22 (Invalid argument)"), "{e}");
    let e = refused_before_boot(&["--pmu", "off", "-c", "100"]);
    assert!(e.contains("nanoseconds of cpu-clock"), "{e}");
    let e = refused_before_boot(&["-g", "--call-graph", "dwarf"]);
    assert!(e.contains("STACK_USER"), "{e}");
}

/// `perch record --icount OPTS -- hotspots 300` on a terminal (util-linux
/// `script`), its terminal output; `None` without `script`.
fn on_terminal(opts: &[&str]) -> Option<String> {
    if !e2e_tests::have_tool("script") {
        eprintln!("skipped: util-linux script is missing");
        return None;
    }
    let dir = tempfile::tempdir().expect("temporary directory");
    let data = dir.path().join("perf.data");
    let exe = c_program("hotspots", CBuild::Glibc);
    let line = format!(
        "{} record --image {} --icount --no-buildid-cache -o {} {} -- {} 300",
        perch_bin().display(),
        runtime_elf().display(),
        data.display(),
        opts.join(" "),
        exe.display()
    );
    let out = Command::new("script")
        .args(["-q", "-e", "-c", &line, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .expect("running script");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{line}:\n{text}");
    assert!(data.exists(), "{line}: no perf.data");
    Some(text)
}

#[test]
fn on_a_terminal_a_live_progress_line_and_none_with_q() {
    if !qemu_and_perf_present() {
        return;
    }
    let Some(text) = on_terminal(&["--pmu", "off"]) else {
        return;
    };
    // indicatif redraws the line in place: CR, clear line, spinner,
    // elapsed seconds, the counts.
    let live: Vec<&str> = text
        .split('\r')
        .filter_map(|seg| seg.strip_prefix("\u{1b}[2K"))
        // The summary follows the cleared line.
        .filter(|seg| !seg.starts_with("perch:"))
        .filter(|seg| seg.contains(" samples (") && seg.contains("/s on the wire"))
        .collect();
    assert!(live.len() > 3, "no live progress line in:\n{text}");
    // `{spinner} {elapsed} {msg}`: the second word is the elapsed time.
    for l in &live {
        let elapsed = l.split_whitespace().nth(1).unwrap_or("");
        assert!(
            elapsed.ends_with('s') && elapsed[..elapsed.len() - 1].parse::<u32>().is_ok(),
            "not a progress line: {l:?}"
        );
    }
    // And the summary after it.
    assert!(text.contains("perch: wrote "), "{text}");
    let Some(quiet) = on_terminal(&["--pmu", "off", "-q"]) else {
        return;
    };
    assert!(!quiet.contains("\u{1b}[2K"), "-q drew:\n{quiet}");
    assert!(!quiet.contains(" samples ("), "-q summarised:\n{quiet}");
    assert!(quiet.contains("hotspots: 300 rounds"), "{quiet}");
}
