//! Several events in one run, end to end: `perch record -e a,b` on the
//! simulated PMU (`--pmu sim`, the real driver against the simulator)
//! programs one counter per event, and the perf.data has one attr per event
//! with its own id, read back with linux-perf-data and `perf report
//! --header-only` (config, sample_type, precise_ip), samples of every
//! event (`perf script -F event` names each one's), and per-event counts
//! that add up with the target's End counters (taken = delivered + lost).
//! A set the simulated CPU's counters cannot hold is refused before boot.
//!
//! Each run records `hotspots 300` (tests/programs/c/hotspots.c, gcc
//! -static) under icount. The tests skip, saying why, when QEMU or perf is
//! missing (the refusal before boot needs neither).
#![forbid(unsafe_code)]

use e2e_tests::programs::{CBuild, c_program};
use e2e_tests::{
    Recording, perch_bin, qemu_and_perf_present, record, record_hotspots, run_perf, runtime_elf,
};
use linux_perf_data::linux_perf_event_reader::{
    AttrFlags, EventRecord, HardwareEventId, IpSkidConstraint, PerfEventAttr, PerfEventType,
    SampleFormat, SamplingPolicy,
};
use linux_perf_data::{PerfFileReader, PerfFileRecord};
use std::collections::BTreeMap;
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

/// Each attr of a file, with its ids.
type Attrs = Vec<(PerfEventAttr, Vec<u64>)>;

/// The file's attrs (each with its ids) and its samples per attr index.
fn read_back(rec: &Recording) -> (Attrs, BTreeMap<usize, u64>) {
    let reader = std::io::BufReader::new(std::fs::File::open(&rec.data).expect("open perf.data"));
    let PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = PerfFileReader::parse_file(reader).expect("linux-perf-data parses the file");
    let attrs: Attrs = perf_file
        .event_attributes()
        .iter()
        .map(|a| (a.attr, a.event_ids.clone()))
        .collect();
    let mut per_attr = BTreeMap::new();
    while let Some(r) = record_iter.next_record(&mut perf_file).expect("record") {
        let PerfFileRecord::EventRecord { attr_index, record } = r else {
            continue;
        };
        if let EventRecord::Sample(_) = record.parse().expect("record parses") {
            *per_attr.entry(attr_index).or_default() += 1;
        }
    }
    (attrs, per_attr)
}

/// The `# event :` lines of `perf report --header-only`.
fn header_events(rec: &Recording) -> Vec<String> {
    let text = run_perf(rec, &["report", "--header-only"], &[]);
    text.lines()
        .filter(|l| l.starts_with("# event :"))
        .map(str::to_owned)
        .collect()
}

/// Samples per event name, as `perf script -F event` prints them.
fn script_events(rec: &Recording) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for l in run_perf(rec, &["script", "-F", "event"], &["kallsyms", "vmlinux"]).lines() {
        let name = l.trim().trim_end_matches(':');
        if !name.is_empty() {
            *out.entry(name.to_owned()).or_default() += 1;
        }
    }
    out
}

/// The numbers after `word` in the summary line starting with `prefix`.
fn summary_line<'a>(rec: &'a Recording, prefix: &str) -> &'a str {
    rec.stderr
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} line in:\n{}", rec.stderr))
}

/// `perch: per event: NAME N samples + L lost, ...` as (name, N, L).
fn per_event(rec: &Recording) -> Vec<(String, u64, u64)> {
    let line = summary_line(rec, "perch: per event: ");
    line["perch: per event: ".len()..]
        .split(", ")
        .map(|e| {
            let w: Vec<&str> = e.split_whitespace().collect();
            assert_eq!(w.len(), 6, "{e:?} in {line:?}");
            (
                w[0].to_owned(),
                w[1].parse().unwrap(),
                w[4].parse().unwrap(),
            )
        })
        .collect()
}

/// The End counters line: (taken, delivered, lost).
fn end_counters(rec: &Recording) -> (u64, u64, u64) {
    let line = summary_line(rec, "perch: target counters: taken ");
    let n: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .map(|w| w.parse().unwrap())
        .collect();
    (n[0], n[1], n[2])
}

/// Per-event counts add up with End's: each event's samples and losses
/// sum to what the target took, and the samples to what it delivered.
fn counts_add_up(rec: &Recording, per_attr: &BTreeMap<usize, u64>) {
    let each = per_event(rec);
    let (taken, delivered, lost) = end_counters(rec);
    let samples: u64 = each.iter().map(|e| e.1).sum();
    let lost_each: u64 = each.iter().map(|e| e.2).sum();
    assert_eq!(
        samples, delivered,
        "{each:?} vs End {taken}/{delivered}/{lost}"
    );
    assert_eq!(
        lost_each, lost,
        "{each:?} vs End {taken}/{delivered}/{lost}"
    );
    assert_eq!(taken, samples + lost_each);
    for (i, e) in each.iter().enumerate() {
        let written = per_attr.get(&i).copied().unwrap_or(0);
        assert_eq!(written, e.1, "perf.data's samples of {}", e.0);
    }
}

#[test]
fn sim_cycles_and_instructions_user_give_two_attrs_and_samples_of_both() {
    if !qemu_and_perf_present() {
        return;
    }
    let r = rec(&["--pmu", "sim", "-e", "cycles:u,instructions:u"]);
    assert!(
        r.stderr.contains(
            "command line \"console=wire freq=1000 pmu=sim event=cycles:u,instructions:u"
        ),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr
            .contains("events cycles:u (period 2000), instructions:u (period 1000)"),
        "{}",
        r.stderr
    );
    let (attrs, per_attr) = read_back(&r);
    assert_eq!(attrs.len(), 2, "one attr per event");
    let configs: Vec<_> = attrs.iter().map(|(a, _)| a.type_).collect();
    assert!(
        matches!(
            configs[..],
            [
                PerfEventType::Hardware(HardwareEventId::CpuCycles, _),
                PerfEventType::Hardware(HardwareEventId::Instructions, _)
            ]
        ),
        "{configs:?}"
    );
    let ids: Vec<&Vec<u64>> = attrs.iter().map(|(_, ids)| ids).collect();
    assert!(ids[0] != ids[1] && !ids[0].is_empty(), "{ids:?}");
    for (a, _) in &attrs {
        assert!(a.sample_format.contains(SampleFormat::IDENTIFIER));
        assert!(a.flags.contains(AttrFlags::EXCLUDE_KERNEL), "{:?}", a.flags);
    }
    assert_eq!(per_attr.len(), 2, "samples of both events: {per_attr:?}");
    assert!(per_attr.values().all(|&n| n > 10), "{per_attr:?}");
    let header = header_events(&r);
    assert_eq!(header.len(), 2, "{header:?}");
    assert!(
        header[0].contains("name = cycles-simulated:u,") && header[0].contains("id = { 1 }"),
        "{}",
        header[0]
    );
    assert!(
        header[1].contains("name = instructions-simulated:u,")
            && header[1].contains("config = 0x1,")
            && header[1].contains("id = { 2 }"),
        "{}",
        header[1]
    );
    let by_name = script_events(&r);
    assert_eq!(
        by_name.keys().collect::<Vec<_>>(),
        ["cycles-simulated:u", "instructions-simulated:u"],
        "{by_name:?}"
    );
    assert_eq!(
        by_name.values().copied().collect::<Vec<_>>(),
        per_attr.values().copied().collect::<Vec<_>>()
    );
    counts_add_up(&r, &per_attr);
    // perch stat reads the same per-event counts from the capture.
    let stat = Command::new(perch_bin())
        .arg("stat")
        .arg(&r.capture)
        .output()
        .expect("perch stat");
    let text = String::from_utf8_lossy(&stat.stdout);
    for (i, name) in ["cycles-simulated:u", "instructions-simulated:u"]
        .iter()
        .enumerate()
    {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(name))
            .unwrap_or_else(|| panic!("no {name} line in:\n{text}"));
        let n: u64 = line.split_whitespace().nth(2).unwrap().parse().unwrap();
        assert_eq!(n, per_attr[&i], "{line}");
    }
}

#[test]
fn sim_precise_mem_loads_beside_cycles_each_with_its_own_attr() {
    if !qemu_and_perf_present() {
        return;
    }
    let r = rec(&["--pmu", "sim", "-e", "mem-loads:pp,cycles", "-q"]);
    let (attrs, per_attr) = read_back(&r);
    assert_eq!(attrs.len(), 2, "one attr per event");
    let (loads, cycles) = (&attrs[0].0, &attrs[1].0);
    // The simulated load-latency event, precise, with the memory fields;
    // cycles with neither.
    assert!(
        matches!(loads.type_, PerfEventType::DynamicPmu(4, 0x1cd, _, _)),
        "{:?}",
        loads.type_
    );
    assert_eq!(loads.flags.ip_skid_constraint(), IpSkidConstraint::ZeroSkid);
    let mem = SampleFormat::ADDR | SampleFormat::WEIGHT | SampleFormat::DATA_SRC;
    assert!(loads.sample_format.contains(mem | SampleFormat::REGS_INTR));
    assert!(matches!(
        cycles.type_,
        PerfEventType::Hardware(HardwareEventId::CpuCycles, _)
    ));
    assert_eq!(
        cycles.flags.ip_skid_constraint(),
        IpSkidConstraint::ArbitrarySkid
    );
    assert!(
        !cycles.sample_format.intersects(mem),
        "{:?}",
        cycles.sample_format
    );
    // The PEBS registers are the precise event's; with -I every event's.
    assert!(!cycles.sample_format.contains(SampleFormat::REGS_INTR));
    assert_eq!(cycles.sample_regs_intr, 0);
    let with_i = rec(&["--pmu", "sim", "-e", "mem-loads:pp,cycles", "-I", "-q"]);
    let (attrs_i, _) = read_back(&with_i);
    for (a, _) in &attrs_i {
        assert!(
            a.sample_format.contains(SampleFormat::REGS_INTR),
            "{:?}",
            a.sample_format
        );
        assert_ne!(a.sample_regs_intr, 0);
    }
    assert_eq!(per_attr.len(), 2, "samples of both events: {per_attr:?}");
    let header = header_events(&r);
    assert!(
        header[0].contains("name = r1cd-simulated:pp,")
            && header[0].contains("precise_ip = 2")
            && header[0].contains("ADDR"),
        "{}",
        header[0]
    );
    assert!(
        header[1].contains("name = cycles-simulated,") && !header[1].contains("precise_ip"),
        "{}",
        header[1]
    );
    let by_name = script_events(&r);
    assert_eq!(
        by_name.keys().collect::<Vec<_>>(),
        ["cycles-simulated", "r1cd-simulated:pp"],
        "{by_name:?}"
    );
}

#[test]
fn a_set_the_simulated_counters_cannot_hold_is_refused_before_boot() {
    let five = ["branches"; 5].join(",");
    let out = Command::new(perch_bin())
        .arg("record")
        .arg("--image")
        .arg(runtime_elf())
        .args(["--qemu", "/nonexistent/qemu-system-x86_64"])
        .args(["--pmu", "sim", "--sim-cpu", "skl", "-e", &five])
        .args(["--", "/bin/true"])
        .stdin(Stdio::null())
        .output()
        .expect("running perch record");
    let e = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{e}");
    assert!(
        e.contains(&format!(
            "The sys_perf_event_open() syscall returned with 95 (Operation not supported) for event ({five})."
        )) && e.contains("no free counter can count branches"),
        "{e}"
    );
}

#[test]
fn several_events_auto_cannot_sample_are_refused_at_the_hello() {
    if !qemu_and_perf_present() {
        return;
    }
    // Under icount (TCG) the appliance has no PMU: perch refuses the set
    // at its Hello, writing no perf.data.
    let exe = c_program("hotspots", CBuild::Glibc);
    let exe = exe.to_str().expect("a UTF-8 path").to_owned();
    let r = record(&["-e", "cycles:u", "-e", "instructions", "--", &exe, "300"]);
    assert_eq!(r.status, Some(2), "{}", r.stderr);
    assert!(
        r.stderr.contains(
            "The sys_perf_event_open() syscall returned with 95 (Operation not supported) \
             for event (cycles:u,instructions)."
        ) && r.stderr.contains("no usable PMU"),
        "{}",
        r.stderr
    );
    assert!(!r.data.exists(), "no perf.data for a refused set");
}

#[test]
fn ring_losses_are_counted_against_their_own_event() {
    if !qemu_and_perf_present() {
        return;
    }
    // A ring of one slot: of the two samples of a PMI where both counters
    // overflowed (every tick in user mode), the second finds it full.
    let r = rec(&[
        "--pmu",
        "sim",
        "-e",
        "cycles:u,instructions:u",
        "--ring",
        "1",
    ]);
    let (_, per_attr) = read_back(&r);
    counts_add_up(&r, &per_attr);
    let each = per_event(&r);
    assert!(each[1].2 > 0, "no losses of the second event: {each:?}");
    // Both count the same ticks, so each took as many as the other.
    assert_eq!(each[0].1 + each[0].2, each[1].1 + each[1].2, "{each:?}");
    let text = run_perf(&r, &["report", "--header-only"], &[]);
    assert!(text.contains("name = instructions-simulated:u"), "{text}");
}

#[test]
fn an_event_term_gives_that_event_its_own_period() {
    if !qemu_and_perf_present() {
        return;
    }
    // cycles every 4000 (two ticks), instructions every 1000 (a tick).
    let r = rec(&[
        "--pmu",
        "sim",
        "-e",
        "cycles/period=4000/u,instructions:u",
        "-q",
    ]);
    let (attrs, per_attr) = read_back(&r);
    let periods: Vec<_> = attrs.iter().map(|(a, _)| a.sampling_policy).collect();
    assert!(
        matches!(
            periods[..],
            [
                SamplingPolicy::Period(a),
                SamplingPolicy::Period(b)
            ] if a.get() == 4000 && b.get() == 1000
        ),
        "{periods:?}"
    );
    let (cycles, instructions) = (per_attr[&0] as f64, per_attr[&1] as f64);
    let ratio = instructions / cycles;
    assert!((1.7..=2.3).contains(&ratio), "{per_attr:?}");
}
