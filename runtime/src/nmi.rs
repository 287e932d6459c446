//! The NMI handler glue: capture the interrupted context and the current
//! task's user registers, then hand the capture on. Runs on the NMI IST
//! stack and never logs, locks, allocates or waits: atomics and bounded
//! copies only.

use crate::entry;
use crate::task;
use arch_x86::frame::{Mode, TrapFrame};
use core::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};

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
}

static NMI_COUNT: AtomicU64 = AtomicU64::new(0);

/// NMIs taken since boot.
pub fn nmi_count() -> u64 {
    NMI_COUNT.load(Ordering::Relaxed)
}

/// The interrupted context by reference: what the sampling path reads,
/// without copying any frame.
#[derive(Clone, Copy, Debug)]
pub struct NmiContext<'a> {
    /// The interrupted registers.
    pub interrupted: &'a TrapFrame,
    /// The mode the NMI interrupted.
    pub mode: Mode,
    /// The current task, if any.
    pub task: Option<u8>,
    /// The task's user registers when they are complete: the interrupted
    /// frame when the NMI hit ring 3, else the task's saved user frame.
    pub user_regs: Option<&'a TrapFrame>,
    /// Whether the user registers are complete, and if not why.
    pub user_state: UserFrameState,
}

/// Finds the task's user registers for the interrupted `frame`.
pub fn context(frame: &TrapFrame) -> NmiContext<'_> {
    let mode = frame.mode();
    let task = task::current();
    let (user_regs, user_state) = if mode.is_user() {
        (Some(frame), UserFrameState::Complete)
    } else if task.is_none() {
        (None, UserFrameState::NoTask)
    } else if entry::in_frame_window(frame.rip) {
        (None, UserFrameState::InWindow)
    } else {
        let top = entry::CURRENT_KSTACK_TOP.load(Ordering::Relaxed);
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
        interrupted: frame,
        mode,
        task,
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
    }
}

/// Reads the TSC, inlined (the NMI path's cost is measured with it).
#[inline(always)]
pub fn rdtsc() -> u64 {
    // SAFETY: rdtsc has no side effects (CR4.TSD only restricts ring 3).
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Called by the NMI entry stub. The sampling path reads the frames in
/// place; the copied capture for the self-test recorder and the demo's hit
/// counters is built after the sample is queued.
pub extern "C" fn nmi_dispatch(frame: &mut TrapFrame) {
    let entry_tsc = rdtsc();
    NMI_COUNT.fetch_add(1, Ordering::Relaxed);
    crate::profile::on_overflow(&context(frame), entry_tsc);
    let cap = capture(frame);
    recorder::on_capture(&cap);
    crate::demo::hits::on_capture(&cap);
}

/// A bounded, NMI-safe log of captures for the self-test, with a stop
/// condition: once enough captures of the wanted kind arrived, the user
/// stop flag and [`crate::syscall::SPIN_ABORT`] are set.
pub mod recorder {
    use super::*;

    /// Slots in the log.
    pub const SLOTS: usize = 48;
    const WORDS: usize = 2 * 22 + 4;

    static RECORDING: AtomicBool = AtomicBool::new(false);
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    static OVERFLOW: AtomicU64 = AtomicU64::new(0);
    static PUBLISHED: [AtomicBool; SLOTS] = [const { AtomicBool::new(false) }; SLOTS];
    static LOG: [[AtomicU64; WORDS]; SLOTS] =
        [const { [const { AtomicU64::new(0) }; WORDS] }; SLOTS];
    static WANT_MODE: AtomicU8 = AtomicU8::new(0);
    static WANT: AtomicU32 = AtomicU32::new(0);
    static MATCHED: AtomicU32 = AtomicU32::new(0);

    /// The user-visible stop flag the self-test tasks poll.
    #[unsafe(link_section = ".user.data.perch_stop")]
    #[unsafe(no_mangle)]
    pub static perch_user_stop: AtomicU32 = AtomicU32::new(0);
    /// Iteration budget of the self-test spin loops (ends them if NMIs never come).
    #[unsafe(link_section = ".user.data.perch_budget")]
    #[unsafe(no_mangle)]
    pub static perch_user_budget: AtomicU64 = AtomicU64::new(0);

    /// The runtime's view of [`perch_user_stop`] (through the direct map:
    /// the ring-3 image is not mapped in the runtime's own address space).
    pub fn user_stop() -> &'static AtomicU32 {
        let a = crate::mm::builtin_alias(crate::abs_addr!(perch_user_stop));
        // SAFETY: the alias is the same always-mapped memory as the static,
        // and an atomic tolerates the ring-3 tasks' concurrent accesses.
        unsafe { &*(a as *const AtomicU32) }
    }

    /// The runtime's view of [`perch_user_budget`].
    pub fn user_budget() -> &'static AtomicU64 {
        let a = crate::mm::builtin_alias(crate::abs_addr!(perch_user_budget));
        // SAFETY: as in `user_stop`.
        unsafe { &*(a as *const AtomicU64) }
    }

    fn mode_code(m: Mode) -> u8 {
        match m {
            Mode::Kernel => 1,
            Mode::User64 => 2,
            Mode::UserCompat => 3,
        }
    }

    fn code_mode(c: u64) -> Mode {
        match c {
            2 => Mode::User64,
            3 => Mode::UserCompat,
            _ => Mode::Kernel,
        }
    }

    fn frame_words(f: &TrapFrame) -> [u64; 22] {
        [
            f.r15,
            f.r14,
            f.r13,
            f.r12,
            f.r11,
            f.r10,
            f.r9,
            f.r8,
            f.rbp,
            f.rdi,
            f.rsi,
            f.rdx,
            f.rcx,
            f.rbx,
            f.rax,
            f.vector,
            f.error_code,
            f.rip,
            f.cs,
            f.rflags,
            f.rsp,
            f.ss,
        ]
    }

    fn words_frame(w: &[u64]) -> TrapFrame {
        TrapFrame {
            r15: w[0],
            r14: w[1],
            r13: w[2],
            r12: w[3],
            r11: w[4],
            r10: w[5],
            r9: w[6],
            r8: w[7],
            rbp: w[8],
            rdi: w[9],
            rsi: w[10],
            rdx: w[11],
            rcx: w[12],
            rbx: w[13],
            rax: w[14],
            vector: w[15],
            error_code: w[16],
            rip: w[17],
            cs: w[18],
            rflags: w[19],
            rsp: w[20],
            ss: w[21],
        }
    }

    /// Starts recording; stops the tasks after `want` captures in `mode`
    /// (for [`Mode::Kernel`], only captures taken inside the spin system
    /// call with a current task count).
    pub fn start(mode: Mode, want: u32, budget: u64) {
        RECORDING.store(false, Ordering::SeqCst);
        for p in &PUBLISHED {
            p.store(false, Ordering::Relaxed);
        }
        NEXT.store(0, Ordering::Relaxed);
        OVERFLOW.store(0, Ordering::Relaxed);
        MATCHED.store(0, Ordering::Relaxed);
        WANT_MODE.store(mode_code(mode), Ordering::Relaxed);
        WANT.store(want, Ordering::Relaxed);
        crate::syscall::SPIN_ABORT.store(false, Ordering::Relaxed);
        crate::cpu::with_user_access(|| {
            user_stop().store(0, Ordering::Relaxed);
            user_budget().store(budget, Ordering::Relaxed);
        });
        RECORDING.store(true, Ordering::SeqCst);
    }

    /// Stops recording and returns how many captures were kept and how many did not fit.
    pub fn stop() -> (usize, u64) {
        RECORDING.store(false, Ordering::SeqCst);
        (
            NEXT.load(Ordering::Relaxed).min(SLOTS),
            OVERFLOW.load(Ordering::Relaxed),
        )
    }

    /// The capture in slot `i`, if published.
    pub fn get(i: usize) -> Option<NmiCapture> {
        if i >= SLOTS || !PUBLISHED[i].load(Ordering::Acquire) {
            return None;
        }
        let w: [u64; WORDS] = core::array::from_fn(|k| LOG[i][k].load(Ordering::Relaxed));
        Some(NmiCapture {
            interrupted: words_frame(&w[0..22]),
            user_regs: words_frame(&w[22..44]),
            mode: code_mode(w[44]),
            task: if w[45] == u64::from(task::NO_TASK) {
                None
            } else {
                Some(w[45] as u8)
            },
            user_state: match w[46] {
                0 => UserFrameState::Complete,
                1 => UserFrameState::InWindow,
                _ => UserFrameState::NoTask,
            },
            tsc: w[47],
        })
    }

    /// NMI context: records `cap` and applies the stop condition.
    pub fn on_capture(cap: &NmiCapture) {
        if !RECORDING.load(Ordering::Acquire) {
            return;
        }
        // Runtime-mode captures count only inside the spin system call: the
        // tests check the frame its entry saved, and elsewhere (a task's
        // first dispatch) the saved frame is the task's initial one.
        let wanted = mode_code(cap.mode) == WANT_MODE.load(Ordering::Relaxed)
            && (cap.mode.is_user()
                || (cap.task.is_some()
                    && (crate::syscall::IN_SPIN.load(Ordering::Relaxed)
                        || crate::task::linux::IN_CALL.load(Ordering::Relaxed))));
        if !wanted {
            return;
        }
        let i = NEXT.fetch_add(1, Ordering::Relaxed);
        if i < SLOTS {
            let slot = &LOG[i];
            for (k, v) in frame_words(&cap.interrupted).into_iter().enumerate() {
                slot[k].store(v, Ordering::Relaxed);
            }
            for (k, v) in frame_words(&cap.user_regs).into_iter().enumerate() {
                slot[22 + k].store(v, Ordering::Relaxed);
            }
            slot[44].store(u64::from(mode_code(cap.mode)), Ordering::Relaxed);
            slot[45].store(
                u64::from(cap.task.unwrap_or(task::NO_TASK)),
                Ordering::Relaxed,
            );
            slot[46].store(cap.user_state as u64, Ordering::Relaxed);
            slot[47].store(cap.tsc, Ordering::Relaxed);
            PUBLISHED[i].store(true, Ordering::Release);
        } else {
            OVERFLOW.fetch_add(1, Ordering::Relaxed);
        }
        if MATCHED.fetch_add(1, Ordering::Relaxed) + 1 >= WANT.load(Ordering::Relaxed) {
            crate::syscall::SPIN_ABORT.store(true, Ordering::Relaxed);
            user_stop().store(1, Ordering::Relaxed);
        }
    }
}
