//! The CPU count and topology end to end: `perch record --cpus N` boots N
//! CPUs, the runtime's Hello lists where each sits (its APIC ID placed by
//! the topology CPUID describes), and perf.data carries them in
//! HEADER_NRCPUS and HEADER_CPU_TOPOLOGY, as `perf report --header-only -I`
//! prints them; `perf script -F cpu` reads the samples' CPUs.
//!
//! QEMU's default `-smp N` shape differs between versions, so the plain
//! four-CPU run checks that the sibling lists perf prints are the ones
//! each CPU's socket, die and core IDs imply; runs with an explicit shape
//! (sockets, dies, cores, threads, on an Intel CPU model so that CPUID leaf
//! 1FH describes the dies) check the exact lines.
//!
//! Each run records `hotspots 30` (tests/programs/c/hotspots.c) under
//! icount, a few seconds. The tests skip, saying why, when QEMU or perf is
//! missing.
#![forbid(unsafe_code)]

use e2e_tests::programs::{CBuild, c_program};
use e2e_tests::{Recording, qemu_and_perf_present, record, run_perf};

/// `perch record --icount --cpus N ARGS -- hotspots 30`, which must succeed.
fn rec(cpus: u32, args: &[&str]) -> Recording {
    let exe = c_program("hotspots", CBuild::Glibc);
    let exe = exe.to_str().expect("a UTF-8 path").to_owned();
    let n = cpus.to_string();
    let mut all = vec!["--cpus", &n];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--", &exe, "30"]);
    let r = record(&all);
    assert_eq!(
        r.status,
        Some(0),
        "perch record {all:?} failed:\n{}",
        r.stderr
    );
    r
}

/// What `perf report --header-only -I` says of the CPUs.
#[derive(Debug, Default)]
struct Cpus {
    online: Option<u32>,
    avail: Option<u32>,
    sockets: Vec<String>,
    dies: Vec<String>,
    threads: Vec<String>,
    /// (core, die, socket) of CPU 0, 1, ...
    ids: Vec<(u32, u32, u32)>,
}

/// The number after `key` on a header line.
fn number_after(line: &str, key: &str) -> u32 {
    let rest = &line[line.find(key).unwrap_or_else(|| panic!("{key} in {line}")) + key.len()..];
    let digits: String = rest
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("a number after {key} in {line}"))
}

fn header(r: &Recording) -> (String, Cpus) {
    let text = run_perf(r, &["report", "--header-only", "-I"], &[]);
    let mut c = Cpus::default();
    for line in text.lines() {
        let Some(l) = line.strip_prefix("# ") else {
            continue;
        };
        let value = || l.split_once(':').map_or("", |(_, v)| v.trim()).to_owned();
        if l.starts_with("nrcpus online") {
            c.online = value().parse().ok();
        } else if l.starts_with("nrcpus avail") {
            c.avail = value().parse().ok();
        } else if l.starts_with("sibling sockets") {
            c.sockets.push(value());
        } else if l.starts_with("sibling dies") {
            c.dies.push(value());
        } else if l.starts_with("sibling threads") {
            c.threads.push(value());
        } else if let Some(rest) = l.strip_prefix("CPU ") {
            let n = number_after(rest, "");
            assert_eq!(n as usize, c.ids.len(), "CPU lines in order: {line}");
            c.ids.push((
                number_after(l, "Core ID"),
                number_after(l, "Die ID"),
                number_after(l, "Socket ID"),
            ));
        }
    }
    (text, c)
}

/// The cpulist of the CPUs `keep` selects, as perf prints sibling lists.
fn list(ids: &[(u32, u32, u32)], keep: impl Fn(&(u32, u32, u32)) -> bool) -> String {
    let cpus: Vec<usize> = (0..ids.len()).filter(|&i| keep(&ids[i])).collect();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if j == i {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// The sibling lists that CPUs sharing `key` make, in order of each
/// group's first CPU.
fn groups<K: PartialEq>(
    ids: &[(u32, u32, u32)],
    key: impl Fn(&(u32, u32, u32)) -> K,
) -> Vec<String> {
    let mut seen: Vec<K> = Vec::new();
    let mut out = Vec::new();
    for id in ids {
        let k = key(id);
        if !seen.contains(&k) {
            out.push(list(ids, |o| key(o) == k));
            seen.push(k);
        }
    }
    out
}

/// `n` CPUs online and available, one ID line each, and sibling lists
/// that are exactly what the IDs imply; `perf script -F cpu` names only
/// those CPUs.
fn check_consistent(r: &Recording, n: u32) -> Cpus {
    let (text, c) = header(r);
    assert_eq!(c.online, Some(n), "nrcpus online:\n{text}");
    assert_eq!(c.avail, Some(n), "nrcpus avail:\n{text}");
    assert_eq!(c.ids.len(), n as usize, "one line per CPU:\n{text}");
    assert_eq!(c.sockets, groups(&c.ids, |&(_, _, s)| s), "{text}");
    assert_eq!(c.dies, groups(&c.ids, |&(_, d, s)| (s, d)), "{text}");
    assert_eq!(
        c.threads,
        groups(&c.ids, |&(core, _, s)| (s, core)),
        "{text}"
    );

    let script = run_perf(r, &["script", "-F", "cpu"], &[]);
    let mut lines = 0;
    for line in script.lines().filter(|l| !l.trim().is_empty()) {
        let cpu: u32 = line
            .trim()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .unwrap_or_else(|_| panic!("`perf script -F cpu` printed {line:?}"));
        assert!(cpu < n, "sample on CPU {cpu} of {n}");
        lines += 1;
    }
    assert!(lines > 0, "no samples in `perf script -F cpu`");
    c
}

#[test]
fn four_cpus_reach_nrcpus_and_the_topology() {
    if !qemu_and_perf_present() {
        return;
    }
    let r = rec(4, &[]);
    check_consistent(&r, 4);

    // Two sockets of two cores, named exactly.
    let r = rec(
        4,
        &[
            "--qemu-arg",
            "-smp",
            "--qemu-arg",
            "sockets=2,cores=2,threads=1",
        ],
    );
    let (text, c) = header(&r);
    check_consistent(&r, 4);
    assert_eq!(c.sockets, ["0-1", "2-3"], "{text}");
    assert_eq!(c.threads, ["0", "1", "2", "3"], "{text}");
    assert_eq!(
        c.ids,
        [(0, 0, 0), (1, 0, 0), (0, 0, 1), (1, 0, 1)],
        "{text}"
    );
    for line in [
        "# nrcpus online : 4",
        "# nrcpus avail : 4",
        "# sibling sockets : 0-1",
        "# sibling threads : 3",
        "# CPU 3: Core ID 1, Die ID 0, Socket ID 1",
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
    }
}

#[test]
fn dies_and_threads_from_cpuid_leaf_1f() {
    if !qemu_and_perf_present() {
        return;
    }
    // An Intel model, so that QEMU gives leaf 1FH for the dies: two
    // sockets of two dies of one core with two threads.
    let r = rec(
        8,
        &[
            "--qemu-arg",
            "-cpu",
            "--qemu-arg",
            "max,vendor=GenuineIntel",
            "--qemu-arg",
            "-smp",
            "--qemu-arg",
            "sockets=2,dies=2,cores=1,threads=2",
        ],
    );
    assert!(
        r.stderr.contains("topology from CPUID leaf 1FH"),
        "{}",
        r.stderr
    );
    let c = check_consistent(&r, 8);
    assert_eq!(c.sockets, ["0-3", "4-7"]);
    assert_eq!(c.dies, ["0-1", "2-3", "4-5", "6-7"]);
    assert_eq!(c.threads, ["0-1", "2-3", "4-5", "6-7"]);
    assert_eq!(
        c.ids,
        [
            (0, 0, 0),
            (0, 0, 0),
            (1, 1, 0),
            (1, 1, 0),
            (0, 0, 1),
            (0, 0, 1),
            (1, 1, 1),
            (1, 1, 1)
        ]
    );
}

#[test]
fn one_cpu_is_one_core_of_one_socket() {
    if !qemu_and_perf_present() {
        return;
    }
    let r = rec(1, &[]);
    let c = check_consistent(&r, 1);
    assert_eq!(
        (c.sockets, c.dies, c.threads),
        (
            vec!["0".to_owned()],
            vec!["0".to_owned()],
            vec!["0".to_owned()]
        )
    );
    assert_eq!(c.ids, [(0, 0, 0)]);
}
