//! End to end with `pmu=sim`: `perch record --pmu sim` boots the demo under
//! `-icount shift=0,sleep=off`; the runtime runs the real Intel driver against
//! the simulated PMU (adaptive PEBS, architectural LBR), advanced by the NMI
//! clock, and every PEBS record becomes a sample. Stock `perf script` must
//! show the PEBS registers, branch stacks with the demo's symbols and the
//! memory fields; `perf report -b` must work; the file must say the PMU was
//! simulated.
//!
//! The tests skip, saying why, only when QEMU or perf is missing.
#![forbid(unsafe_code)]

use e2e_tests::{Recording, qemu_and_perf_present, record_demo, run_perf};
use std::collections::HashMap;
use std::sync::OnceLock;

/// The register patterns `demoregs` holds while it spins.
use e2e_tests::DEMOREGS_PATTERNS as PATTERNS;

/// The demo's hot functions.
const HOT: [&str; 3] = [
    "demo_checksum_blocks",
    "demo_parse_records",
    "demo_update_stats",
];

/// The demo recorded once with `pmu=sim`: one second of virtual time at 4 kHz.
fn sim_run() -> Option<&'static Recording> {
    static REC: OnceLock<Option<Recording>> = OnceLock::new();
    REC.get_or_init(|| {
        qemu_and_perf_present()
            .then(|| record_demo(&["--freq", "4000", "--duration", "1", "--pmu", "sim"]))
    })
    .as_ref()
    .inspect(|r| assert_eq!(r.status, Some(0), "perch record failed:\n{}", r.stderr))
}

/// One line of `perf script -G -F comm,addr,weight,ip,sym,iregs,brstacksym`.
#[derive(Debug)]
struct Line {
    comm: String,
    addr: u64,
    weight: u64,
    sym: String,
    iregs: HashMap<String, u64>,
    /// `(from, to)` symbols (offsets stripped), newest first.
    branches: Vec<(String, String)>,
}

fn hex(s: &str) -> u64 {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).expect("hex number")
}

fn strip_off(s: &str) -> String {
    s.split('+').next().unwrap_or("").to_owned()
}

fn script(rec: &Recording) -> Vec<Line> {
    let out = run_perf(
        rec,
        &[
            "script",
            "-G",
            "-F",
            "comm,ip,sym,iregs,brstacksym,addr,weight",
        ],
        &[],
    );
    let mut lines = Vec::new();
    for l in out.lines().filter(|l| !l.trim().is_empty()) {
        let t: Vec<&str> = l.split_whitespace().collect();
        assert!(t.len() >= 5, "short perf script line: {l}");
        let mut iregs = HashMap::new();
        let mut branches = Vec::new();
        for tok in &t[5..] {
            if tok.contains('/') {
                let parts: Vec<&str> = tok.split('/').collect();
                assert!(parts.len() >= 2, "bad branch entry {tok}");
                branches.push((strip_off(parts[0]), strip_off(parts[1])));
            } else if let Some((k, v)) = tok.split_once(':')
                && v.starts_with("0x")
            {
                iregs.insert(k.to_owned(), hex(v));
            }
        }
        lines.push(Line {
            comm: t[0].to_owned(),
            addr: hex(t[1]),
            weight: t[2].parse().expect("weight"),
            sym: t[4].to_owned(),
            iregs,
            branches,
        });
    }
    lines
}

fn lines() -> Option<&'static [Line]> {
    static L: OnceLock<Option<Vec<Line>>> = OnceLock::new();
    L.get_or_init(|| sim_run().map(script)).as_deref()
}

#[test]
fn pebs_registers_are_the_interrupted_registers() {
    let Some(lines) = lines() else { return };
    // One PEBS record per tick (period 1): about 4000 samples in 1 s at 4 kHz.
    assert!(lines.len() > 3000, "only {} samples", lines.len());
    let spins: Vec<&Line> = lines
        .iter()
        .filter(|l| l.comm == "demoregs" && l.sym == "perch_demoregs_spin")
        .collect();
    assert!(spins.len() >= 20, "only {} demoregs samples", spins.len());
    for l in &spins {
        for (reg, want) in PATTERNS {
            assert_eq!(l.iregs.get(reg), Some(&want), "{reg} in {l:?}");
        }
    }
}

#[test]
fn memory_fields_come_from_the_pebs_records() {
    let Some(lines) = lines() else { return };
    let mut checked = 0;
    for l in lines.iter().filter(|l| HOT.contains(&l.sym.as_str())) {
        // The simulated load reads the interrupted stack pointer.
        assert_eq!(Some(&l.addr), l.iregs.get("SP"), "{l:?}");
        // Cache latency 4..=64 in the low word, instruction latency above.
        let cache = l.weight & 0xffff_ffff;
        assert!((4..=64).contains(&cache), "weight {:#x}", l.weight);
        assert!(l.weight >> 32 > 0, "weight {:#x}", l.weight);
        checked += 1;
    }
    assert!(checked > 1000, "only {checked} hot samples");
    // DATA_SRC decodes as loads from the levels the simulator cycles through.
    let Some(rec) = sim_run() else { return };
    let ds = run_perf(rec, &["script", "-G", "-F", "data_src"], &[]);
    // perf prints the level from both mem_lvl and mem_lvl_num
    // ("LVL L1 or L1 hit"), as for Linux's own PEBS data sources.
    for lvl in [
        "LVL L1 or L1 hit",
        "LVL L2 or L2 hit",
        "LVL L3 or L3 hit",
        "LVL LFB/MAB or LFB/MAB hit",
        "SNP HitM",
    ] {
        assert!(ds.contains(lvl), "no `{lvl}` in data_src");
    }
    assert!(ds.lines().filter(|l| l.contains("|OP LOAD|")).count() > 3000);
}

#[test]
fn branch_stacks_follow_the_sampled_ips_with_demo_symbols() {
    let Some(lines) = lines() else { return };
    let with = lines.iter().filter(|l| !l.branches.is_empty()).count();
    assert!(
        with * 10 >= lines.len() * 9,
        "{with} of {} with branches",
        lines.len()
    );
    // The simulator's newest branch leads to the previous tick's IP. perf
    // resolves a branch address in the sampled process's maps, so only
    // consecutive samples of one process (one address space) can name the
    // same function.
    let mut pairs = 0;
    let mut matching = 0;
    for w in lines.windows(2) {
        let (prev, cur) = (&w[0], &w[1]);
        if !HOT.contains(&prev.sym.as_str()) || prev.comm != cur.comm {
            continue;
        }
        let Some((_, to)) = cur.branches.first() else {
            continue;
        };
        pairs += 1;
        if *to == prev.sym {
            matching += 1;
        }
    }
    assert!(pairs > 1000, "only {pairs} pairs");
    assert!(
        matching * 100 >= pairs * 95,
        "{matching} of {pairs} newest branches end at the previous sample's function"
    );
    let demo_to_demo = lines
        .iter()
        .flat_map(|l| &l.branches)
        .filter(|(f, t)| HOT.contains(&f.as_str()) && HOT.contains(&t.as_str()))
        .count();
    assert!(demo_to_demo > 10_000, "only {demo_to_demo} demo branches");
}

#[test]
fn perf_report_branch_mode_works() {
    let Some(rec) = sim_run() else { return };
    let out = run_perf(rec, &["report", "-b", "--stdio"], &[]);
    assert!(out.contains("of event 'r1cd-simulated:pp'"), "{out}");
    assert!(out.contains("# Total Lost Samples: 0"), "{out}");
    let hot_pair = out.lines().any(|l| {
        !l.starts_with('#')
            && l.contains("[.] demo_checksum_blocks")
            && l.contains("[.] demo_parse_records")
    });
    assert!(
        hot_pair,
        "no demo_checksum_blocks -> demo_parse_records row:\n{out}"
    );
}

#[test]
fn the_file_says_the_pmu_is_simulated() {
    let Some(rec) = sim_run() else { return };
    let out = run_perf(rec, &["report", "--header-only"], &[]);
    let cpudesc = out
        .lines()
        .find(|l| l.starts_with("# cpudesc"))
        .expect("cpudesc line");
    assert!(cpudesc.contains("simulated PMU (pmu=sim)"), "{cpudesc}");
    let event = out
        .lines()
        .find(|l| l.starts_with("# event : name = "))
        .expect("event line");
    for want in [
        "r1cd-simulated:pp",
        "precise_ip = 2",
        "BRANCH_STACK",
        "REGS_INTR",
        "DATA_SRC",
        "WEIGHT",
        "ADDR",
    ] {
        assert!(event.contains(want), "no {want} in {event}");
    }
}

/// The same recording on each simulated CPU model: Skylake (PEBS format 3,
/// legacy LBR with INFO), Ice Lake (adaptive PEBS format 4, legacy LBR) and
/// Sapphire Rapids (adaptive format 5, architectural LBR). Under each the
/// real driver programs the model's own PEBS and LBR layout, and every
/// model yields PEBS samples with their memory fields, the interrupted
/// registers and branch stacks.
#[test]
fn pebs_yields_samples_on_skylake_ice_lake_and_sapphire_rapids() {
    if !qemu_and_perf_present() {
        return;
    }
    for (model, format) in [("skl", 3), ("icl", 4), ("spr", 5)] {
        let rec = record_demo(&[
            "--freq",
            "4000",
            "--duration",
            "0.5",
            "--pmu",
            "sim",
            "--sim-cpu",
            model,
        ]);
        assert_eq!(
            rec.status,
            Some(0),
            "{model}: perch record failed:\n{}",
            rec.stderr
        );
        assert!(
            rec.stderr.contains(&format!("PEBS format Some({format})")),
            "{model}: the runtime did not simulate PEBS format {format}:\n{}",
            rec.stderr
        );
        let lines = script(&rec);
        assert!(
            lines.len() > 1500,
            "{model}: only {} PEBS samples in 0.5 s at 4 kHz:\n{}",
            lines.len(),
            rec.stderr
        );
        let with_memory = lines.iter().filter(|l| l.addr != 0 && l.weight > 0).count();
        assert!(
            with_memory * 10 > lines.len() * 9,
            "{model}: {with_memory} of {} samples carry ADDR and WEIGHT",
            lines.len()
        );
        let regs = lines
            .iter()
            .filter(|l| l.comm == "demoregs" && l.sym.starts_with("perch_demoregs_spin"))
            .filter(|l| PATTERNS.iter().all(|(r, v)| l.iregs.get(*r) == Some(v)))
            .count();
        assert!(
            regs > 0,
            "{model}: no demoregs sample with its register patterns in iregs"
        );
        let branches = lines.iter().filter(|l| !l.branches.is_empty()).count();
        assert!(
            branches * 10 > lines.len() * 9,
            "{model}: {branches} of {} samples carry a branch stack",
            lines.len()
        );
    }
}
