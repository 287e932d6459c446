//! The start-up check on this CPU's PMU: counters advance over a workload
//! of known size, and overflow NMIs arrive near the programmed period; and
//! DS memory of its own for checks and self-tests.

use super::*;
use arch_x86::cpuid::PmuInfo;
use arch_x86::pmu::driver::{self, CheckReport, PmuDriver};
use arch_x86::pmu::ds::{DsArea, DsMemory};
use arch_x86::pmu::hw::{self as cpu_pmu};
use arch_x86::pmu::selftest::{Reason, Verdict};
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

pub(super) static CHECK_BUF: BufCell = BufCell(UnsafeCell::new([0; PEBS_BYTES]));

pub(super) static CHECK_AREA: DsArea = DsArea::new();

pub(super) static CHECK_BUSY: AtomicBool = AtomicBool::new(false);

/// Runs `f` with DS memory of its own (for start-up checks and self-tests,
/// outside NMI context). `None` while another call is using it.
pub fn with_check_memory<R>(f: impl FnOnce(&mut DsMemory<'_>) -> R) -> Option<R> {
    if CHECK_BUSY.swap(true, Ordering::Acquire) {
        return None;
    }
    // SAFETY: CHECK_BUSY was false and is now ours, so this is the only
    // reference to CHECK_BUF until it is released below; NMI context never
    // touches it.
    let buf = unsafe { &mut *CHECK_BUF.0.get() };
    buf.fill(0);
    let r = f(&mut DsMemory::new(&CHECK_AREA, buf));
    CHECK_BUSY.store(false, Ordering::Release);
    Some(r)
}

/// Iterations of the start-up check's workload (two instructions each).
pub const CHECK_ITERATIONS: u64 = 5_000_000;

/// Instructions the start-up check's workload retires.
pub const CHECK_INSTRUCTIONS: u64 = CHECK_ITERATIONS * cpu_pmu::WORKLOAD_INSTRUCTIONS_PER_ITERATION;

/// Period of the start-up check's overflow phase: about 100 PMIs.
pub const CHECK_PERIOD: u64 = 100_000;

pub(super) static CHECK_PHASE: AtomicBool = AtomicBool::new(false);

pub(super) static CHECK_DRIVER: AtomicPtr<PmuDriver> = AtomicPtr::new(core::ptr::null_mut());

pub(super) static CHECK_PMIS: AtomicU64 = AtomicU64::new(0);

/// The start-up check on this CPU's PMU (outside NMI context, before the
/// PMU samples): [`driver::startup_check`] with [`CpuPmu`], the workload
/// [`cpu_pmu::workload`] of [`CHECK_INSTRUCTIONS`], and the PMIs
/// [`on_nmi`] counts while the overflow phase's driver is published.
/// Touches nothing when CPUID advertises no PMU.
pub fn startup_check(info: &PmuInfo) -> CheckReport {
    let not_run = |r| CheckReport {
        counted: 0,
        period: CHECK_PERIOD,
        pmis: 0,
        verdict: Verdict::Fallback(r),
    };
    if let Err(r) = arch_x86::pmu::selftest::check_detected(info) {
        return not_run(r);
    }
    let Some(mut hw) = cpu_pmu() else {
        return not_run(Reason::NotDetected(
            "the local APIC is disabled (IA32_APIC_BASE), so no PMI can be delivered",
        ));
    };
    if HW_STATE.load(Ordering::Acquire) != HW_OFF || sim_active() {
        return not_run(Reason::NotDetected("the PMU is already in use"));
    }
    hw.software_enable();
    crate::sample::profile::route_nmis_to_the_pmu();
    CHECK_PHASE.store(true, Ordering::SeqCst);
    let report = driver::startup_check(
        info,
        &mut hw,
        CHECK_PERIOD,
        &mut |_, d| match d {
            Some(d) => {
                CHECK_DRIVER.store(d, Ordering::Release);
                cpu_pmu::workload(CHECK_ITERATIONS);
                CHECK_DRIVER.store(core::ptr::null_mut(), Ordering::Release);
            }
            None => cpu_pmu::workload(CHECK_ITERATIONS),
        },
        &|| CHECK_PMIS.load(Ordering::Acquire),
    );
    CHECK_PHASE.store(false, Ordering::SeqCst);
    report
}

pub(super) fn on_check_nmi(tsc: u64, clock_running: bool) -> bool {
    let p = CHECK_DRIVER.load(Ordering::Acquire);
    // SAFETY: a non-null pointer is the overflow phase's driver, published
    // by `startup_check` for exactly as long as its workload runs, during
    // which the code that owns it does not touch it; NMIs do not nest.
    let Some(d) = (unsafe { p.as_mut() }) else {
        // Before or after the overflow phase's workload.
        return !clock_running;
    };
    let Some(mut hw) = cpu_pmu() else {
        return false;
    };
    let sum = d.handle_pmi(&mut hw, None, tsc, &mut |_| {});
    if !sum.spurious {
        CHECK_PMIS.fetch_add(1, Ordering::Relaxed);
        return true;
    }
    if clock_running {
        return false;
    }
    percpu::boot_slot()
        .unknown_nmis
        .fetch_add(u64::from(!sum.late), Ordering::Relaxed);
    true
}
