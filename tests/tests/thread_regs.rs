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
    // Frames wait in the guest's RAM when the host is slow to read them.
    let rec = record(&[
        "--freq",
        "20000",
        "--buffer",
        "16",
        "--",
        exe.to_str().expect("a UTF-8 path"),
    ]);
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

/// Where each thread's `tregs_X_yield` lies in the program.
fn yield_ranges(exe: &std::path::Path) -> BTreeMap<char, std::ops::Range<u64>> {
    use object::{Object, ObjectSymbol};
    let data = std::fs::read(exe).expect("read tregs");
    let file = object::File::parse(&*data).expect("tregs parses");
    let mut out = BTreeMap::new();
    for s in file.symbols() {
        let thread = match s.name() {
            Ok("tregs_a_yield") => 'a',
            Ok("tregs_b_yield") => 'b',
            _ => continue,
        };
        out.insert(thread, s.address()..s.address() + s.size());
    }
    assert_eq!(out.len(), 2, "both yields in tregs: {out:?}");
    out
}

/// The runtime's entry and exit path, where a sample says ABI_NONE by
/// design (`perch_upcall_*` as perf names them, without their hash).
const ENTRY_EXIT_PATH: [&str; 6] = [
    "perch_trap_common",
    "perch_syscall_entry",
    "perch_entry_window_end",
    "perch_exit_window_start",
    "perch_upcall_trap",
    "perch_upcall_return",
];

/// `uregs=return` per thread: a sample taken in the runtime while a thread
/// is in its `sched_yield` gets the registers of that thread's own return
/// from it (its patterns, RAX the result 0, RCX the return address), even
/// though the yield runs the other thread first and that one returns to
/// user mode before it. Never the other thread's registers, and never
/// ABI_NONE outside the runtime's entry and exit windows.
#[test]
fn uregs_return_gives_each_threads_runtime_samples_its_own_return() {
    if !qemu_and_perf_present() {
        return;
    }
    let exe = c_program_with("tregs", CBuild::Glibc, &["-pthread"], "");
    let yields = yield_ranges(&exe);
    let rec = record(&[
        "--freq",
        "20000",
        "--boot-arg",
        "uregs=return",
        // Frames wait in the guest's RAM when the host is slow to read
        // them: no sample is lost to a stalled drain.
        "--buffer",
        "16",
        "--",
        exe.to_str().expect("a UTF-8 path"),
        "yield",
    ]);
    assert_eq!(rec.status, Some(0), "perch record failed:\n{}", rec.stderr);
    assert!(rec.stdout.contains("tregs done"), "{}", rec.stdout);
    let script = run_perf(&rec, &["script", "-G", "-F", "tid,ip,sym,uregs"], &[]);
    // Runtime samples (user registers in the uregs): (tid, registers).
    let mut runtime: Vec<(u32, BTreeMap<&str, u64>, &str)> = Vec::new();
    let mut abi_none: BTreeMap<u32, usize> = BTreeMap::new();
    for line in script.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let Some(tid) = f.first().and_then(|t| t.parse::<u32>().ok()) else {
            continue;
        };
        if f.iter().any(|w| w.starts_with("tregs_")) {
            continue; // a user-mode sample: its registers are the interrupt frame
        }
        if !f.iter().any(|w| w.starts_with("IP:")) {
            // ABI_NONE: perf prints no user registers. By design inside the
            // entry and exit windows (the stubs, and the upcalls before the
            // user frame is saved or once the return has begun); how many
            // land there depends on how the clock's phase falls on the
            // yield loop, so only the others count.
            let in_window = f
                .get(2)
                .is_some_and(|sym| ENTRY_EXIT_PATH.iter().any(|w| sym.starts_with(w)));
            if !in_window {
                *abi_none.entry(tid).or_default() += 1;
            }
            continue;
        }
        let regs: BTreeMap<&str, u64> = f
            .iter()
            .filter_map(|w| w.split_once(':'))
            .filter_map(|(r, v)| {
                Some((r, u64::from_str_radix(v.trim_start_matches("0x"), 16).ok()?))
            })
            .collect();
        runtime.push((tid, regs, line));
    }
    // A thread's runtime samples return into its own yield, so its tid is
    // the one whose samples return there.
    let mut tid_of: BTreeMap<u32, char> = BTreeMap::new();
    let mut exact = 0;
    for (tid, regs, line) in &runtime {
        let ip = regs.get("IP").copied().unwrap_or(0);
        let Some((&thread, _)) = yields.iter().find(|(_, r)| r.contains(&ip)) else {
            continue; // a call of the thread's start or end, not its yield
        };
        let old = tid_of.insert(*tid, thread);
        assert!(
            old.is_none() || old == Some(thread),
            "tid {tid} returns into both yields: {line}"
        );
        let mut matched = 0;
        for (reg, value) in regs {
            if let Some(want) = pattern(thread, reg)
                && *reg != "AX"
                && *reg != "R11"
            {
                assert_eq!(*value, want, "thread {thread}: {reg} in {line}");
                matched += 1;
            }
        }
        assert_eq!(matched, 12, "every pattern register in {line}");
        assert_eq!(regs.get("AX"), Some(&0), "sched_yield's result in {line}");
        assert_eq!(
            regs.get("CX"),
            regs.get("IP"),
            "RCX is the return address: {line}"
        );
        exact += 1;
    }
    assert_eq!(tid_of.len(), 2, "a tid per thread: {tid_of:?}");
    let none: usize = tid_of
        .keys()
        .map(|t| abi_none.get(t).copied().unwrap_or(0))
        .sum();
    eprintln!(
        "{exact} runtime samples with their thread's return registers, {none} ABI_NONE outside the entry and exit windows"
    );
    assert!(
        exact >= 100,
        "too few runtime samples with their thread's return registers: {exact} ({none} ABI_NONE)"
    );
    assert!(
        none * 4 <= exact,
        "{none} runtime samples of the spinners said ABI_NONE against {exact} with registers"
    );
}
