//! Short QEMU boots of the runtime that check what the host sees: exit
//! statuses, crash reports and command-line handling.

use e2e_tests::{STATUS_CRASH, STATUS_PASS, boot, boot_icount};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(120);

#[test]
fn unknown_key_is_reported_and_ignored() {
    let b = boot("selftest bogus=1 freq=abc", TIMEOUT);
    assert!(
        b.output
            .contains("perch: unknown command-line key `bogus` ignored"),
        "{}",
        b.output
    );
    assert!(
        b.output.contains("bad value `abc` for `freq` ignored"),
        "{}",
        b.output
    );
    assert!(
        b.output.contains("at 4000 Hz"),
        "default rate kept: {}",
        b.output
    );
    assert_eq!(b.status, Some(STATUS_PASS), "{}", b.output);
    assert!(b.last_line().ends_with("passed, 0 failed"), "{}", b.output);
}

#[test]
fn runtime_page_fault_is_reported_with_the_crash_status() {
    let b = boot("crash=pf", TIMEOUT);
    assert_eq!(b.status, Some(STATUS_CRASH), "{}", b.output);
    assert!(
        b.output
            .contains("RUNTIME EXCEPTION: #PF page fault (vector 14) error=0x0"),
        "{}",
        b.output
    );
    assert!(
        b.output.contains("<provoke_crash+0x"),
        "nearest symbol: {}",
        b.output
    );
    assert!(b.output.contains("cr2=0x0000000000000000"), "{}", b.output);
    assert!(b.output.contains("cs=0x8 "), "{}", b.output);
}

#[test]
fn runtime_invalid_opcode_is_reported_with_the_crash_status() {
    let b = boot("crash=ud", TIMEOUT);
    assert_eq!(b.status, Some(STATUS_CRASH), "{}", b.output);
    assert!(
        b.output
            .contains("RUNTIME EXCEPTION: #UD invalid opcode (vector 6)"),
        "{}",
        b.output
    );
}

#[test]
fn double_fault_is_taken_on_its_ist_stack_and_reported() {
    let b = boot("crash=df", TIMEOUT);
    assert_eq!(b.status, Some(STATUS_CRASH), "{}", b.output);
    assert!(
        b.output
            .contains("RUNTIME EXCEPTION: #DF double fault (vector 8) error=0x0"),
        "{}",
        b.output
    );
    // The push to the unmapped stack is what faulted, and the CPU could not
    // deliver that #PF on the same stack.
    assert!(b.output.contains("cr2=0xfffffffffffffff8"), "{}", b.output);
    assert!(b.output.contains("rsp=0x0000000000000000"), "{}", b.output);
}

#[test]
fn smap_stops_the_runtime_reading_appliance_memory() {
    // `-cpu max` reports SMAP, so the runtime turns it on.
    let b = boot("crash=smap", TIMEOUT);
    assert!(b.output.contains("smap=true"), "{}", b.output);
    assert_eq!(b.status, Some(STATUS_CRASH), "{}", b.output);
    // Present page, read, supervisor access.
    assert!(
        b.output
            .contains("RUNTIME EXCEPTION: #PF page fault (vector 14) error=0x1"),
        "{}",
        b.output
    );
}

#[test]
fn runtime_panic_is_reported_with_the_crash_status() {
    let b = boot("crash=panic", TIMEOUT);
    assert_eq!(b.status, Some(STATUS_CRASH), "{}", b.output);
    assert!(
        b.output
            .contains("RUNTIME PANIC: panicked at runtime/src/main.rs"),
        "{}",
        b.output
    );
}

#[test]
fn demo_runs_for_its_duration_and_passes() {
    let b = boot("duration=200 freq=2000", TIMEOUT);
    assert_eq!(b.status, Some(STATUS_PASS), "{}", b.output);
    assert!(
        b.output.contains("demo: running for 200 ms of TSC time"),
        "{}",
        b.output
    );
    for task in ["demo64", "demo32", "demosys"] {
        assert!(
            b.output.contains(&format!("demo: task {task} Ready")),
            "{task} still runnable at the end: {}",
            b.output
        );
    }
}

/// Share (%) of the NMIs the demo reports for `function` among its hot functions.
fn share(output: &str, function: &str) -> u64 {
    let line = output
        .lines()
        .find(|l| l.starts_with(&format!("demo: {function}: ")))
        .unwrap_or_else(|| panic!("no line for {function}: {output}"));
    let pct = line
        .split(", ")
        .nth(1)
        .and_then(|s| s.split('%').next())
        .and_then(|s| s.parse().ok());
    pct.unwrap_or_else(|| panic!("no share in {line:?}"))
}

#[test]
fn demo_work_splits_50_30_20_under_icount() {
    let b = boot_icount("duration=1000", TIMEOUT);
    assert_eq!(b.status, Some(STATUS_PASS), "{}", b.output);
    for (function, designed) in [
        ("demo_checksum_blocks", 50),
        ("demo_parse_records", 30),
        ("demo_update_stats", 20),
    ] {
        let got = share(&b.output, function);
        assert!(
            got.abs_diff(designed) <= 4,
            "{function}: {got}% of the hot-function NMIs, designed {designed}%\n{}",
            b.output
        );
    }
}

#[test]
fn missing_pmu_is_reported_and_the_nmi_clock_is_used() {
    let b = boot("duration=50", TIMEOUT);
    assert_eq!(b.status, Some(STATUS_PASS), "{}", b.output);
    assert!(
        b.output.contains("no PMU: ")
            && b.output
                .contains("falling back to the NMI clock (cpu-clock)"),
        "{}",
        b.output
    );
}
