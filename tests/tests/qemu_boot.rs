//! Short QEMU boots of the runtime that check what the host sees: exit
//! statuses, crash reports and command-line handling.
#![forbid(unsafe_code)]

use e2e_tests::{STATUS_CRASH, STATUS_FAIL, STATUS_PASS, boot, boot_archive};
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
fn without_an_archive_or_selftest_there_is_nothing_to_run() {
    let b = boot("duration=200 freq=2000", TIMEOUT);
    assert_eq!(b.status, Some(STATUS_FAIL), "{}", b.output);
    assert!(
        b.output.contains("perch: nothing to run: no boot archive")
            && b.output.contains("and no `selftest` on the command line"),
        "{}",
        b.output
    );
}

/// Boots the demo appliance (`appliances/demo`) with the text console.
fn boot_demo(cmdline: &str) -> e2e_tests::Boot {
    let dir = tempfile::tempdir().expect("temporary directory");
    let archive = dir.path().join("demo.cpio");
    e2e_tests::programs::demo_appliance()
        .write_to(&archive)
        .expect("packing the demo appliance");
    boot_archive(cmdline, &archive, TIMEOUT)
}

#[test]
fn demo_runs_for_its_duration_and_passes() {
    let b = boot_demo("duration=200 freq=2000");
    assert_eq!(b.status, Some(STATUS_PASS), "{}", b.output);
    for task in ["demo64", "demo32", "demosys", "demoregs"] {
        assert!(
            b.output
                .contains(&format!("[{task}] {task}: appliance task ready")),
            "{task} did not start: {}",
            b.output
        );
    }
    assert!(
        b.output
            .contains("perch: run ended: duration reached (4 still running)"),
        "{}",
        b.output
    );
}

#[test]
fn missing_pmu_is_reported_and_the_nmi_clock_is_used() {
    let b = boot_demo("duration=50");
    assert_eq!(b.status, Some(STATUS_PASS), "{}", b.output);
    assert!(
        b.output.contains("no PMU: ")
            && b.output
                .contains("falling back to the NMI clock (cpu-clock)"),
        "{}",
        b.output
    );
}
