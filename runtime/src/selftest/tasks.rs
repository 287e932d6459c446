//! Built-in programs: both system-call ABIs, user faults, preemption.

use core::sync::atomic::Ordering;

use super::*;

pub(super) fn spec(name: &'static str, abi: Abi, entry: unsafe extern "C" fn()) -> TaskSpec {
    TaskSpec {
        name,
        abi,
        entry: user::addr(entry),
        gprs: [0; 15],
    }
}

pub(super) fn run_to_end(s: TaskSpec) -> Result<task::Task, Why> {
    let id = match task::spawn(s) {
        Ok(id) => id,
        Err(e) => fail!("spawn {}: {e:?}", s.name),
    };
    crate::dispatch::run_until(|| false);
    match task::get(id) {
        Some(t) => Ok(t),
        None => fail!("task {} vanished", s.name),
    }
}

/// A process that never enters the runtime is preempted by the tick: two
/// such spinners share the CPU with a process that makes system calls,
/// which runs to its end while they spin; the run ends when asked.
pub(super) fn preemption() -> TestResult {
    let mut ids = [0u8; 3];
    for (i, (name, entry)) in [
        (
            "spin_a",
            user::perch_st_spin_forever as unsafe extern "C" fn(),
        ),
        ("spin_b", user::perch_st_spin_forever),
        ("hello64", user::perch_st_hello64),
    ]
    .into_iter()
    .enumerate()
    {
        ids[i] = match task::spawn(spec(name, Abi::X64, entry)) {
            Ok(id) => id,
            Err(e) => fail!("spawn {name}: {e:?}"),
        };
    }
    let slice = u64::from(task::tick::slice_ticks());
    let t0 = task::tick::ticks();
    // Ten slices of each spinner.
    let want = 20 * slice;
    crate::dispatch::run_until(|| task::tick::ticks() - t0 >= want);
    let ticks = task::tick::ticks() - t0;
    let (a, b, h) = match (task::get(ids[0]), task::get(ids[1]), task::get(ids[2])) {
        (Some(a), Some(b), Some(h)) => (a, b, h),
        _ => fail!("a task vanished"),
    };
    task::clear();
    ensure!(
        ticks >= want,
        "the run stopped after {ticks} ticks, before {want}"
    );
    ensure!(
        h.state == TaskState::Exited(user::HELLO64_EXIT),
        "hello64 did not finish beside the spinners: {:?}",
        h.state
    );
    for t in [a, b] {
        ensure!(
            t.state == TaskState::Ready,
            "{} ended: {:?}",
            t.spec.name,
            t.state
        );
        ensure!(
            t.preemptions >= 5,
            "{} preempted {} times in {ticks} ticks ({slice}-tick slices)",
            t.spec.name,
            t.preemptions
        );
    }
    Ok(())
}

pub(super) fn syscall_abi_64() -> TestResult {
    let t = run_to_end(spec("hello64", Abi::X64, user::perch_st_hello64))?;
    ensure!(
        t.state == TaskState::Exited(user::HELLO64_EXIT),
        "state {:?}",
        t.state
    );
    ensure!(t.bytes_written == 32, "wrote {} bytes", t.bytes_written);
    ensure!(t.yields == 1, "yielded {} times", t.yields);
    Ok(())
}

pub(super) fn int80_abi_compat() -> TestResult {
    let t = run_to_end(spec("hello32", Abi::Compat32, user::perch_st_hello32))?;
    ensure!(
        t.state == TaskState::Exited(user::HELLO32_EXIT),
        "state {:?}",
        t.state
    );
    ensure!(t.bytes_written == 37, "wrote {} bytes", t.bytes_written);
    ensure!(t.yields == 1, "yielded {} times", t.yields);
    Ok(())
}

pub(super) struct FaultCase {
    pub(super) name: &'static str,
    abi: Abi,
    entry: unsafe extern "C" fn(),
    vector: u64,
    /// Required page-fault error code bits (present, write, user, fetch).
    error_code: Option<u64>,
    /// Required CR2 (page faults).
    cr2: Option<fn() -> u64>,
}

pub(super) const FAULTS: &[FaultCase] = &[
    FaultCase {
        name: "user64_divide_error",
        abi: Abi::X64,
        entry: user::perch_st_fault_de,
        vector: 0,
        error_code: None,
        cr2: None,
    },
    FaultCase {
        name: "user64_invalid_opcode",
        abi: Abi::X64,
        entry: user::perch_st_fault_ud,
        vector: 6,
        error_code: None,
        cr2: None,
    },
    FaultCase {
        name: "user64_breakpoint",
        abi: Abi::X64,
        entry: user::perch_st_fault_bp,
        vector: 3,
        error_code: None,
        cr2: None,
    },
    FaultCase {
        name: "user64_rdmsr_privileged",
        abi: Abi::X64,
        entry: user::perch_st_fault_rdmsr,
        vector: 13,
        error_code: Some(0),
        cr2: None,
    },
    FaultCase {
        name: "user64_hlt_privileged",
        abi: Abi::X64,
        entry: user::perch_st_fault_hlt,
        vector: 13,
        error_code: Some(0),
        cr2: None,
    },
    FaultCase {
        name: "user64_noncanonical_gp",
        abi: Abi::X64,
        entry: user::perch_st_fault_noncanonical,
        vector: 13,
        error_code: Some(0),
        cr2: None,
    },
    FaultCase {
        name: "user64_null_page_fault",
        abi: Abi::X64,
        entry: user::perch_st_fault_null,
        vector: 14,
        error_code: Some(0x4),
        cr2: Some(|| 0),
    },
    FaultCase {
        name: "user64_reads_runtime",
        abi: Abi::X64,
        entry: user::perch_st_fault_kernel_read,
        vector: 14,
        error_code: Some(0x5),
        cr2: Some(|| crate::perch_kmain as *const () as u64),
    },
    FaultCase {
        name: "user64_writes_own_text",
        abi: Abi::X64,
        entry: user::perch_st_fault_text_write,
        vector: 14,
        error_code: Some(0x7),
        cr2: Some(|| user::addr(user::perch_st_fault_text_write)),
    },
    FaultCase {
        name: "user64_executes_data_nx",
        abi: Abi::X64,
        entry: user::perch_st_fault_nx,
        vector: 14,
        error_code: Some(0x15),
        cr2: Some(|| user::addr(user::perch_st_data_code)),
    },
    // A selector into the LDT: the LDTR is null, so #GP with the selector as
    // the error code (not a descriptor read through the process's page 0).
    FaultCase {
        name: "user64_ldt_selector_gp",
        abi: Abi::X64,
        entry: user::perch_st_fault_ldt,
        vector: 13,
        error_code: Some(0x4),
        cr2: None,
    },
    FaultCase {
        name: "compat_ldt_selector_gp",
        abi: Abi::Compat32,
        entry: user::perch_st_fault32_ldt,
        vector: 13,
        error_code: Some(0x4),
        cr2: None,
    },
    FaultCase {
        name: "compat_invalid_opcode",
        abi: Abi::Compat32,
        entry: user::perch_st_fault32_ud,
        vector: 6,
        error_code: None,
        cr2: None,
    },
    FaultCase {
        name: "compat_null_page_fault",
        abi: Abi::Compat32,
        entry: user::perch_st_fault32_pf,
        vector: 14,
        error_code: Some(0x4),
        cr2: Some(|| 0),
    },
    FaultCase {
        name: "compat_divide_error",
        abi: Abi::Compat32,
        entry: user::perch_st_fault32_de,
        vector: 0,
        error_code: None,
        cr2: None,
    },
];

pub(super) fn user_fault(c: &FaultCase) -> TestResult {
    if c.name == "user64_executes_data_nx" && !cpu::features().nx {
        return Ok(());
    }
    let t = run_to_end(spec(c.name, c.abi, c.entry))?;
    let TaskState::Faulted(f) = t.state else {
        fail!("task was not ended by a fault: {:?}", t.state);
    };
    ensure!(
        f.vector == c.vector,
        "vector {} (want {})",
        f.vector,
        c.vector
    );
    let want_cs = match c.abi {
        Abi::X64 => gdt::USER_CODE64,
        Abi::Compat32 => gdt::USER_CODE32,
    };
    ensure!(f.cs == u64::from(want_cs), "cs {:#x}", f.cs);
    // An instruction fetch fault reports the target as RIP; others the faulting instruction.
    let fetch_fault = f.vector == 14 && f.error_code & 0x10 != 0;
    ensure!(
        (f.rip >= user::addr(c.entry) && f.rip < user::addr(c.entry) + 32)
            || (fetch_fault && f.rip == f.cr2),
        "rip {:#x} outside the task",
        f.rip
    );
    if let Some(e) = c.error_code {
        ensure!(
            f.error_code == e,
            "error code {:#x} (want {e:#x})",
            f.error_code
        );
    }
    if let Some(cr2) = c.cr2 {
        ensure!(f.cr2 == cr2(), "cr2 {:#x} (want {:#x})", f.cr2, cr2());
    }
    Ok(())
}

/// Every CPU but the boot CPU preempts with a tick of its own: two
/// spinners pinned to each of them, which never enter the runtime until
/// told to stop, both get slices (each is preempted again and again), and
/// all exit when told. With one CPU there is nothing to check.
pub(super) fn preemption_on_other_cpus() -> TestResult {
    let cpus = crate::smp::online().min(4);
    if cpus < 2 {
        return Ok(());
    }
    crate::cpu::with_user_access(|| {
        recorder::user_stop().store(0, Ordering::Relaxed);
        recorder::user_budget().store(SPIN_BUDGET, Ordering::Relaxed);
    });
    let mut ids: heapless::Vec<(u8, u32), 8> = heapless::Vec::new();
    for c in 1..cpus {
        for _ in 0..2 {
            let id = match task::spawn(spec("pinned_spin", Abi::X64, user::perch_st_cpu_spin)) {
                Ok(id) => id,
                Err(e) => fail!("spawn for CPU {c}: {e:?}"),
            };
            task::pin(id, c as u8);
            let _ = ids.push((id, c));
        }
        crate::smp::kick(c);
    }
    // Until each has been preempted twice (the other ran between), or 20
    // s of TSC time: a loaded host may give the CPUs little time.
    let preempted = |&(id, _): &(u8, u32)| task::get(id).is_some_and(|t| t.preemptions >= 2);
    let deadline = cpu::rdtsc() + crate::time::tsc_hz() * 20;
    while !ids.iter().all(preempted) && cpu::rdtsc() < deadline {
        core::hint::spin_loop();
    }
    crate::cpu::with_user_access(|| recorder::user_stop().store(1, Ordering::Relaxed));
    let deadline = cpu::rdtsc() + crate::time::tsc_hz() * 10;
    let ended = |id: u8| !matches!(task::get(id).map(|t| t.state), Some(TaskState::Ready));
    while !ids.iter().all(|&(id, _)| ended(id)) && cpu::rdtsc() < deadline {
        core::hint::spin_loop();
    }
    for &(id, c) in &ids {
        let Some(t) = task::get(id) else {
            fail!("CPU {c}'s task {id} vanished");
        };
        ensure!(
            t.state == TaskState::Exited(0),
            "CPU {c}'s task {id}: {:?}",
            t.state
        );
        ensure!(
            t.preemptions >= 2,
            "CPU {c}'s task {id} was preempted {} times",
            t.preemptions
        );
    }
    Ok(())
}
