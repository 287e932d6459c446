//! The self-test's NMI recorder: a bounded, NMI-safe log of captures, with
//! a stop condition: once enough captures of the wanted kind arrived, the
//! user stop flag and [`crate::abi::perch::SPIN_ABORT`] are set. It sees the
//! NMIs through the observer hook of [`crate::sample::nmi`].

use crate::proc as task;
use crate::sample::nmi::{NmiCapture, UserFrameState};
use arch_x86::frame::{Mode, TrapFrame};
use core::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Slots in the log.
pub const SLOTS: usize = 48;
const WORDS: usize = 2 * 22 + 5;

static RECORDING: AtomicBool = AtomicBool::new(false);
static NEXT: AtomicUsize = AtomicUsize::new(0);
static OVERFLOW: AtomicU64 = AtomicU64::new(0);
static PUBLISHED: [AtomicBool; SLOTS] = [const { AtomicBool::new(false) }; SLOTS];
static LOG: [[AtomicU64; WORDS]; SLOTS] = [const { [const { AtomicU64::new(0) }; WORDS] }; SLOTS];
static WANT_MODE: AtomicU8 = AtomicU8::new(0);
static WANT: AtomicU32 = AtomicU32::new(0);
static MATCHED: AtomicU32 = AtomicU32::new(0);
/// Most captures kept of any one task (0: no limit).
static PER_TASK: AtomicU32 = AtomicU32::new(0);
/// Captures kept so far, by task ID.
static KEPT: [AtomicU32; 256] = [const { AtomicU32::new(0) }; 256];

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
/// call with a current task count), keeping at most `per_task` captures
/// of any one task (0: no limit), so that one task that runs a whole time
/// slice first cannot fill the log before another one runs; captures over
/// a task's quota do not count toward `want` either.
pub fn start_per_task(mode: Mode, want: u32, budget: u64, per_task: u32) {
    RECORDING.store(false, Ordering::SeqCst);
    for k in &KEPT {
        k.store(0, Ordering::Relaxed);
    }
    PER_TASK.store(per_task, Ordering::Relaxed);
    for p in &PUBLISHED {
        p.store(false, Ordering::Relaxed);
    }
    NEXT.store(0, Ordering::Relaxed);
    OVERFLOW.store(0, Ordering::Relaxed);
    MATCHED.store(0, Ordering::Relaxed);
    WANT_MODE.store(mode_code(mode), Ordering::Relaxed);
    WANT.store(want, Ordering::Relaxed);
    crate::abi::perch::SPIN_ABORT.store(false, Ordering::Relaxed);
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
        cpu: w[48] as u32,
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
                && (crate::abi::perch::IN_SPIN.load(Ordering::Relaxed)
                    || crate::abi::linux::IN_CALL.load(Ordering::Relaxed))));
    if !wanted {
        return;
    }
    let per_task = PER_TASK.load(Ordering::Relaxed);
    let kept = &KEPT[usize::from(cap.task.unwrap_or(task::NO_TASK))];
    let over_quota = per_task != 0 && kept.fetch_add(1, Ordering::Relaxed) >= per_task;
    let i = if over_quota {
        SLOTS
    } else {
        NEXT.fetch_add(1, Ordering::Relaxed)
    };
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
        slot[48].store(u64::from(cap.cpu), Ordering::Relaxed);
        PUBLISHED[i].store(true, Ordering::Release);
    } else {
        OVERFLOW.fetch_add(1, Ordering::Relaxed);
    }
    // A capture over its task's quota does not count toward the stop: with
    // a quota, the recording ends when the tasks have their captures, not
    // when the first tasks to run have had many.
    if !over_quota && MATCHED.fetch_add(1, Ordering::Relaxed) + 1 >= WANT.load(Ordering::Relaxed) {
        crate::abi::perch::SPIN_ABORT.store(true, Ordering::Relaxed);
        user_stop().store(1, Ordering::Relaxed);
    }
}
