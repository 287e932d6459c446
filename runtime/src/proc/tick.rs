//! The scheduler's clock: the local APIC timer, periodic at [`TICK_HZ`],
//! on vector [`TIMER_VECTOR`] (a fixed interrupt, never the sampling NMI).
//! Each tick that lands in ring 3 charges the running process; once its
//! slice is used up the trap handler sends it back to the scheduler. Every
//! CPU has its own timer and its own slice; the boot CPU's ticks are the
//! ones [`ticks`] counts.

use arch_x86::madt::MAX_CPUS;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// Interrupt vector of the scheduler tick.
pub const TIMER_VECTOR: u64 = 0x20;
/// The local APIC's spurious-interrupt vector (set by `software_enable`).
pub const SPURIOUS_VECTOR: u64 = 0xff;
/// Ticks per second.
pub const TICK_HZ: u64 = 1000;
/// Default time slice (`slice=MS`).
pub const DEFAULT_SLICE_MS: u32 = 10;

static TIMER_COUNT: AtomicU32 = AtomicU32::new(0);
/// Whether each CPU's timer runs, by CPU index.
static RUNNING: [AtomicBool; MAX_CPUS] = [const { AtomicBool::new(false) }; MAX_CPUS];
static TICKS: AtomicU64 = AtomicU64::new(0);
static SLICE_TICKS: AtomicU32 = AtomicU32::new(DEFAULT_SLICE_MS);
/// Ticks left of the running process's slice, by CPU index.
static SLICE_LEFT: [AtomicU32; MAX_CPUS] = [const { AtomicU32::new(DEFAULT_SLICE_MS) }; MAX_CPUS];

/// This CPU's index, for the per-CPU arrays.
fn me() -> usize {
    crate::cpu::this().index as usize % MAX_CPUS
}

fn apic() -> arch_x86::lapic::LocalApic {
    // SAFETY: ring 0; the APIC window is in the direct map (uncached device
    // window), and the clock module already enabled the APIC.
    unsafe { arch_x86::lapic::LocalApic::from_msr() }
}

/// Measures the local APIC timer against the TSC (call after the TSC is
/// calibrated); returns the timer count per tick, or 0 if it does not run.
pub fn calibrate(tsc_hz: u64) -> u32 {
    if tsc_hz == 0 {
        return 0;
    }
    let a = apic();
    a.software_enable();
    // One-shot, masked: count down from the top for 10 ms of TSC time.
    a.write(
        arch_x86::lapic::TIMER_DIVIDE,
        arch_x86::lapic::TIMER_DIVIDE_16,
    );
    a.write(
        arch_x86::lapic::LVT_TIMER,
        arch_x86::lapic::LVT_MASKED | TIMER_VECTOR as u32,
    );
    a.write(arch_x86::lapic::TIMER_INITIAL, u32::MAX);
    let wait = tsc_hz / 100;
    let t0 = arch_x86::cpu::rdtsc();
    while arch_x86::cpu::rdtsc().wrapping_sub(t0) < wait {
        core::hint::spin_loop();
    }
    let elapsed = u32::MAX - a.timer_current();
    a.stop_timer();
    let per_tick = u64::from(elapsed) * 100 / TICK_HZ;
    let per_tick = u32::try_from(per_tick).unwrap_or(u32::MAX);
    TIMER_COUNT.store(per_tick, Ordering::Relaxed);
    per_tick
}

/// Sets the time slice in milliseconds (at least 1).
pub fn set_slice_ms(ms: u32) {
    let t = (u64::from(ms.max(1)) * TICK_HZ / 1000).max(1) as u32;
    SLICE_TICKS.store(t, Ordering::Relaxed);
}

/// The time slice in ticks.
pub fn slice_ticks() -> u32 {
    SLICE_TICKS.load(Ordering::Relaxed)
}

/// Starts the periodic tick (idempotent). Returns false when the timer
/// could not be calibrated (no preemption then).
pub fn start() -> bool {
    let count = TIMER_COUNT.load(Ordering::Relaxed);
    if count == 0 {
        return false;
    }
    if !RUNNING[me()].swap(true, Ordering::Relaxed) {
        apic().start_timer(TIMER_VECTOR as u8, count, true);
    }
    true
}

/// Whether this CPU's tick runs.
pub fn running() -> bool {
    RUNNING[me()].load(Ordering::Relaxed)
}

/// Stops this CPU's tick.
pub fn stop() {
    if RUNNING[me()].swap(false, Ordering::Relaxed) {
        apic().stop_timer();
    }
}

/// Gives the next process on this CPU a full slice.
pub fn new_slice() {
    SLICE_LEFT[me()].store(SLICE_TICKS.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// Ticks since the tick first started.
pub fn ticks() -> u64 {
    TICKS.load(Ordering::Relaxed)
}

/// Handles one tick interrupt (acknowledges it). Returns true when it
/// interrupted ring 3 and the running process has used up its slice.
pub fn on_tick(from_user: bool) -> bool {
    apic().eoi();
    let me = me();
    if me == 0 {
        TICKS.fetch_add(1, Ordering::Relaxed);
    }
    if !from_user {
        return false;
    }
    let left = SLICE_LEFT[me].load(Ordering::Relaxed).saturating_sub(1);
    SLICE_LEFT[me].store(left, Ordering::Relaxed);
    left == 0
}
