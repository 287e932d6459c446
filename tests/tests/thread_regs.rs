//! Register exactness per thread: two threads of one process spin with
//! their own value in every general-purpose register (`tregs`), and the
//! samples of each show that thread's registers and its own tid, never
//! the other's.
#![forbid(unsafe_code)]

use e2e_tests::programs::{CBuild, c_program_with};
use e2e_tests::{qemu_and_perf_present, record, run_perf};
use std::collections::{BTreeMap, BTreeSet};

/// The value thread `t` ('a' or 'b') holds in `reg`: its digit pair
/// repeated (RAX 1, RBX 2, RDX 4, ... R15 f).
fn pattern(t: char, reg: &str) -> Option<u64> {
    let digit = match reg {
        "AX" => '1',
        "BX" => '2',
        "DX" => '4',
        "SI" => '5',
        "DI" => '6',
        "BP" => '7',
        "R8" => '8',
        "R9" => '9',
        "R10" => 'a',
        "R11" => 'b',
        "R12" => 'c',
        "R13" => 'd',
        "R14" => 'e',
        "R15" => 'f',
        _ => return None,
    };
    u64::from_str_radix(&format!("{t}{digit}").repeat(8), 16).ok()
}

#[test]
fn each_threads_samples_hold_its_own_registers_and_tid() {
    if !qemu_and_perf_present() {
        return;
    }
    let exe = c_program_with("tregs", CBuild::Glibc, &["-pthread"], "");
    // 20 kHz under icount: a sample every 50,000 instructions, some 400
    // per thread.
    let rec = record(&["--freq", "20000", "--", exe.to_str().expect("a UTF-8 path")]);
    assert_eq!(rec.status, Some(0), "perch record failed:\n{}", rec.stderr);
    assert!(rec.stdout.contains("tregs done"), "{}", rec.stdout);
    let script = run_perf(&rec, &["script", "-G", "-F", "tid,ip,sym,uregs"], &[]);
    let mut tids: BTreeMap<char, BTreeSet<u32>> = BTreeMap::new();
    let mut counts: BTreeMap<char, usize> = BTreeMap::new();
    for line in script.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let Some(thread) = f.iter().find_map(|w| match *w {
            "tregs_a_spin" => Some('a'),
            "tregs_b_spin" => Some('b'),
            _ => None,
        }) else {
            continue;
        };
        let tid: u32 = f[0].parse().expect("a tid first");
        tids.entry(thread).or_default().insert(tid);
        *counts.entry(thread).or_default() += 1;
        assert!(f.contains(&"ABI:2"), "a 64-bit sample: {line}");
        let mut checked = 0;
        for w in &f {
            let Some((reg, value)) = w.split_once(':') else {
                continue;
            };
            let Some(want) = pattern(thread, reg) else {
                continue;
            };
            let got = u64::from_str_radix(value.trim_start_matches("0x"), 16).expect("a hex value");
            assert_eq!(got, want, "thread {thread}: {reg} in {line}");
            checked += 1;
        }
        assert_eq!(checked, 14, "every pattern register is in {line}");
    }
    for t in ['a', 'b'] {
        assert!(
            counts.get(&t).copied().unwrap_or(0) >= 100,
            "too few samples of thread {t}: {counts:?}"
        );
        assert_eq!(tids[&t].len(), 1, "thread {t} has one tid: {tids:?}");
    }
    assert_ne!(tids[&'a'], tids[&'b'], "the threads have their own tids");
}
