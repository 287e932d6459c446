//! The NMI handler glue: capture the interrupted context and the current
//! task's user registers, then hand the capture on. Runs on the NMI IST
//! stack and never logs, locks, allocates or waits: atomics and bounded
//! copies only.

use crate::entry;
use crate::proc as task;
use arch_x86::frame::{Mode, TrapFrame};
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Whether the captured user registers can be trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum UserFrameState {
    /// Complete: the interrupted user context, or the saved frame of a task
    /// in the runtime outside any entry/exit window.
    Complete = 0,
    /// The NMI hit while the saved frame was being built or restored.
    InWindow = 1,
    /// No task was current (the runtime's own context).
    NoTask = 2,
}

/// Everything the NMI handler knows about the interrupted context.
#[derive(Clone, Copy, Debug)]
pub struct NmiCapture {
    /// The interrupted registers (mode, CS, SS, RIP, RSP, RFLAGS, 16 GPRs).
    pub interrupted: TrapFrame,
    /// The mode the NMI interrupted.
    pub mode: Mode,
    /// The current task, if any.
    pub task: Option<u8>,
    /// The task's user registers: the interrupted frame when the NMI hit ring
    /// 3, else the task's saved user frame.
    pub user_regs: TrapFrame,
    /// Whether `user_regs` is complete.
    pub user_state: UserFrameState,
    /// TSC at capture.
    pub tsc: u64,
    /// The CPU (its index) the NMI arrived on.
    pub cpu: u32,
}

/// NMIs taken since boot, on every CPU (the sampling layer counts them:
/// the common path's clock overflows and every other NMI).
pub fn nmi_count() -> u64 {
    crate::sample::profile::nmis_taken()
}

/// The interrupted context by reference: what the sampling path reads,
/// without copying any frame.
#[derive(Clone, Copy, Debug)]
pub struct NmiContext<'a> {
    /// The CPU the NMI arrived on.
    pub cpu: &'static crate::cpu::CpuLocal,
    /// That CPU's sampling state (its ring, its throttle).
    pub sampling: &'static crate::sample::profile::CpuSampling,
    /// The interrupted registers.
    pub interrupted: &'a TrapFrame,
    /// The mode the NMI interrupted.
    pub mode: Mode,
    /// The current task, if any.
    pub task: Option<u8>,
    /// Its thread id (the task number + 1; 0 without a task).
    pub tid: u32,
    /// The task's user registers when they are complete: the interrupted
    /// frame when the NMI hit ring 3, else the task's saved user frame.
    pub user_regs: Option<&'a TrapFrame>,
    /// Whether the user registers are complete, and if not why.
    pub user_state: UserFrameState,
}

/// Finds the task's user registers for the interrupted `frame`.
#[inline(always)]
pub fn context(frame: &TrapFrame) -> NmiContext<'_> {
    let cpu = crate::cpu::nmi_cpu(frame);
    context_on(frame, cpu, crate::sample::profile::of(cpu))
}

/// [`context`] for a caller that found the NMI's CPU and its sampling
/// state already.
#[inline(always)]
pub fn context_on<'a>(
    frame: &'a TrapFrame,
    cpu: &'static crate::cpu::CpuLocal,
    sampling: &'static crate::sample::profile::CpuSampling,
) -> NmiContext<'a> {
    let mode = frame.mode();
    let raw = cpu.current_task.load(Ordering::Relaxed);
    let task = (raw != task::NO_TASK).then_some(raw);
    // NO_TASK is 0xff, so the wrapping add gives 0 without a task.
    const _: () = assert!(task::NO_TASK.wrapping_add(1) == 0);
    let tid = u32::from(raw.wrapping_add(1));
    let (user_regs, user_state) = if mode.is_user() {
        (Some(frame), UserFrameState::Complete)
    } else if task.is_none() {
        (None, UserFrameState::NoTask)
    } else if entry::in_frame_window(frame.rip) {
        (None, UserFrameState::InWindow)
    } else {
        let top = cpu.kstack_top();
        // SAFETY: a task is current, so `top` ends its kernel stack and the
        // frame below it was completely written (the RIP is outside both
        // windows). Nothing writes it while the NMI handler runs: the code
        // that owns it is the interrupted context, suspended until the
        // handler returns, so a shared borrow for the handler's duration is
        // sound.
        let saved = unsafe { &*task::frame_at_kstack_top(top) };
        (Some(saved), UserFrameState::Complete)
    };
    NmiContext {
        cpu,
        sampling,
        interrupted: frame,
        mode,
        task,
        tid,
        user_regs,
        user_state,
    }
}

/// Builds the capture for the interrupted `frame`.
pub fn capture(frame: &TrapFrame) -> NmiCapture {
    let ctx = context(frame);
    NmiCapture {
        interrupted: *frame,
        mode: ctx.mode,
        task: ctx.task,
        user_regs: ctx.user_regs.copied().unwrap_or_default(),
        user_state: ctx.user_state,
        tsc: arch_x86::cpu::rdtsc(),
        cpu: ctx.cpu.index,
    }
}

/// Reads the TSC, inlined (the NMI path's cost is measured with it).
#[inline(always)]
pub fn rdtsc() -> u64 {
    // SAFETY: rdtsc has no side effects (CR4.TSD only restricts ring 3).
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Something that looks at every NMI's capture (from NMI context, so it
/// must itself be NMI-safe: atomics and bounded copies only). The
/// self-test's recorder registers one; the core
/// names neither.
pub type Observer = fn(&NmiCapture);

/// Observer slots.
pub const OBSERVERS: usize = 2;

static OBSERVER: [AtomicUsize; OBSERVERS] = [const { AtomicUsize::new(0) }; OBSERVERS];
/// Some observer slot was ever filled: one load decides whether the NMI
/// path looks at the slots at all.
static ANY_OBSERVER: AtomicBool = AtomicBool::new(false);

/// Registers `f` in observer slot `slot` (replacing what was there).
pub fn set_observer(slot: usize, f: Observer) {
    if let Some(o) = OBSERVER.get(slot) {
        o.store(f as usize, Ordering::Release);
        ANY_OBSERVER.store(true, Ordering::Release);
        crate::sample::profile::route_nmis_to_observers();
    }
}

/// An NMI on a CPU other than the boot CPU, out of line: the boot CPU's
/// path, inlined into the upcall, stays as short as a single CPU's.
#[inline(never)]
fn on_other_cpu(frame: &TrapFrame, entry_tsc: u64, cpu: &'static crate::cpu::CpuLocal) -> bool {
    let s = crate::sample::profile::of(cpu);
    crate::sample::profile::on_overflow(frame, entry_tsc, cpu, s)
}

/// Called by the NMI entry stub. The sampling path reads the frames in
/// place; a copied capture is built for the observers, if any, after the
/// sample is queued.
#[inline(always)]
pub extern "C" fn nmi_dispatch(frame: &mut TrapFrame) {
    let entry_tsc = rdtsc();
    let cpu = crate::cpu::nmi_cpu(frame);
    let routed = if core::ptr::eq(cpu, crate::cpu::boot_cpu()) {
        // The boot CPU alone moves the clock on (the clock's NMIs reach
        // the others too when threads run on every CPU).
        crate::sample::clock::on_nmi();
        let s = crate::sample::profile::boot_sampling();
        crate::sample::profile::on_overflow(frame, entry_tsc, cpu, s)
    } else {
        on_other_cpu(frame, entry_tsc, cpu)
    };
    // An observer makes every NMI take the routed path.
    if !routed || !ANY_OBSERVER.load(Ordering::Acquire) {
        return;
    }
    let mut cap = None;
    for o in &OBSERVER {
        let f = o.load(Ordering::Acquire);
        if f != 0 {
            let c = cap.get_or_insert_with(|| capture(frame));
            // SAFETY: a non-zero slot holds an `Observer` stored by
            // `set_observer` (a fn pointer as usize, same size and valid
            // for the whole run).
            let f: Observer = unsafe { core::mem::transmute::<usize, Observer>(f) };
            f(c);
        }
    }
}
