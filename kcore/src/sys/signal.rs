//! Signal delivery: choosing the next signal a thread takes, its default
//! action, the `rt_sigframe` Linux builds on the user stack of a 64-bit
//! process (`arch/x86/kernel/signal_64.c`: the return address, a
//! `ucontext` with the saved registers, a `siginfo`, and the FXSAVE image)
//! or the ia32 frames of an i386 one ([`ia32`]), and `rt_sigreturn` (and
//! i386 `sigreturn`), which restore all of it after checking what a
//! hostile program could have forged.
//!
//! The runtime hands the thread's user registers over as [`UserRegs`] (at a
//! return to user mode, or before the scheduler resumes it) and puts back
//! what these functions leave there. Frames are written through the
//! [`Machine`]'s checked copies only.

use super::Abi;
use super::machine::Machine;
use super::process::{AltStack, Process, Thread};

mod ia32;

/// The segment selectors of a thread in user mode (i386 frames save and
/// restore them; 64-bit frames ignore them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Selectors {
    /// CS.
    pub cs: u16,
    /// SS.
    pub ss: u16,
    /// DS.
    pub ds: u16,
    /// ES.
    pub es: u16,
    /// FS.
    pub fs: u16,
    /// GS.
    pub gs: u16,
}

/// The user registers the runtime saves at an entry, in `TrapFrame` terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserRegs {
    /// rax, rbx, rcx, rdx, rsi, rdi, rbp, r8 .. r15 (the `TrapFrame` GPR
    /// order).
    pub gprs: [u64; 15],
    /// Instruction pointer.
    pub rip: u64,
    /// Stack pointer.
    pub rsp: u64,
    /// RFLAGS.
    pub rflags: u64,
    /// The x87/SSE state (FXSAVE image).
    pub fpu: [u8; 512],
    /// The segment selectors.
    pub seg: Selectors,
}

const RAX: usize = 0;
const RBX: usize = 1;
const RCX: usize = 2;
const RDX: usize = 3;
const RSI: usize = 4;
const RDI: usize = 5;
const RBP: usize = 6;
const R8: usize = 7;

/// How a fault came to raise its signal (the `siginfo` of a synchronous
/// signal and the `sigcontext`'s trap fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultInfo {
    /// `si_code` (SEGV_MAPERR, FPE_INTDIV, ...).
    pub code: i32,
    /// `si_addr`: the faulting address (CR2) or instruction.
    pub addr: u64,
    /// The exception vector (`trapno`).
    pub trapno: u64,
    /// The error code (`err`).
    pub err: u64,
    /// CR2 as the fault left it.
    pub cr2: u64,
}

/// What [`deliver`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// No signal can be taken now.
    Nothing,
    /// A handler's frame was built: the registers now enter it.
    Handler(u8),
    /// The signal's action ends the process.
    Kill {
        /// The signal.
        signal: u8,
        /// Why, for the `killed by SIGNAME: REASON` line.
        reason: &'static str,
    },
}

/// `SA_*` flags.
pub mod sa {
    /// The handler takes (sig, info, ucontext).
    pub const SIGINFO: u64 = 4;
    /// Run the handler on the alternate stack.
    pub const ONSTACK: u64 = 0x0800_0000;
    /// Restart interrupted system calls.
    pub const RESTART: u64 = 0x1000_0000;
    /// Do not block the signal in its own handler.
    pub const NODEFER: u64 = 0x4000_0000;
    /// Reset the action to the default on delivery.
    pub const RESETHAND: u64 = 0x8000_0000;
    /// `sa_restorer` holds the return address.
    pub const RESTORER: u64 = 0x0400_0000;
}

const SIGKILL: u8 = 9;
const SIGSTOP: u8 = 19;
const SS_ONSTACK: u32 = 1;
const SS_DISABLE: u32 = 2;
const SS_AUTODISARM: u32 = 1 << 31;
/// `SI_TKILL`: sent by `tkill`/`tgkill`.
const SI_TKILL: i32 = -6;
/// The `uc_flags` Linux sets: UC_SIGCONTEXT_SS | UC_STRICT_RESTORE_SS.
const UC_FLAGS: u64 = 0x6;
/// `UC_STRICT_RESTORE_SS`: `rt_sigreturn` takes the frame's ss as it is.
const UC_STRICT_RESTORE_SS: u64 = 0x4;
/// Linux's `__USER_CS` and `__USER_DS`, the selectors a frame shows.
const USER_CS: u64 = 0x33;
const USER_DS: u64 = 0x2b;
/// RFLAGS bits a signal frame may change (Linux's FIX_EFLAGS).
const FIX_EFLAGS: u64 =
    0x1 | 0x4 | 0x10 | 0x40 | 0x80 | 0x100 | 0x400 | 0x800 | 0x4000 | 0x1_0000 | 0x4_0000;
/// TF, DF and RF, cleared for the handler.
const HANDLER_CLEARS: u64 = 0x100 | 0x400 | 0x1_0000;
/// MXCSR bits that must be zero (FXSAVE's default MXCSR_MASK, 0xffbf, is
/// what every x86-64 CPU without DAZ-less quirks reports).
const MXCSR_RESERVED: u32 = !0xffff;

const SIGINFO_SIZE: u64 = 128;
const SIGCONTEXT_SIZE: u64 = 256;
/// uc_flags, uc_link, stack_t (24), sigcontext, sigmask.
const UCONTEXT_SIZE: u64 = 8 + 8 + 24 + SIGCONTEXT_SIZE + 8;
/// pretcode, ucontext, siginfo.
const FRAME_SIZE: u64 = 8 + UCONTEXT_SIZE + SIGINFO_SIZE;
const UC_OFFSET: u64 = 8;
const INFO_OFFSET: u64 = 8 + UCONTEXT_SIZE;
/// The sigcontext inside the ucontext.
const MCONTEXT_OFFSET: u64 = 8 + 8 + 24;
const FPU_SIZE: u64 = 512;

fn bit(sig: u8) -> u64 {
    1 << (sig - 1)
}

/// Whether a signal's default action leaves the process alone (SIGCHLD,
/// SIGCONT, SIGURG, SIGWINCH; the stop signals, with nothing to stop for).
pub fn default_ignored(sig: u8) -> bool {
    matches!(sig, 17 | 18 | 23 | 28 | 19 | 20 | 21 | 22)
}

/// The signals thread `t` of `p` could take now: its own and its
/// process's pending ones that it does not block.
pub fn deliverable(p: &Process, t: &Thread) -> u64 {
    (t.pending | p.signals.pending) & !(t.sigmask & !(bit(SIGKILL) | bit(SIGSTOP)))
}

/// The alternate-stack state of `sp` for `stack_t.ss_flags`.
fn sas_flags(alt: &AltStack, sp: u64) -> u32 {
    if alt.flags & SS_DISABLE != 0 || alt.size == 0 {
        SS_DISABLE
    } else if sp > alt.sp && sp - alt.sp <= alt.size {
        SS_ONSTACK
    } else {
        0
    }
}

/// Takes the next signal thread `t` can take (the lowest deliverable one):
/// ignored ones are dropped, a default action that ends the process is
/// returned as [`Delivery::Kill`], and a handler gets its frame built on
/// the user stack with `regs` set to enter it (an ia32 frame for an i386
/// process).
pub fn deliver<M: Machine>(
    m: &mut M,
    p: &mut Process,
    t: &mut Thread,
    regs: &mut UserRegs,
) -> Delivery {
    loop {
        let ready = deliverable(p, t);
        if ready == 0 {
            // An rt_sigsuspend that no handler ended gets its mask back.
            if let Some(m) = t.saved_sigmask.take() {
                t.sigmask = m;
            }
            return Delivery::Nothing;
        }
        let sig = ready.trailing_zeros() as u8 + 1;
        if t.pending & bit(sig) != 0 {
            t.pending &= !bit(sig);
        } else {
            p.signals.pending &= !bit(sig);
        }
        let info = Info::Sent { pid: p.pid };
        let action = p.signals.actions[sig as usize - 1];
        if action.handler > 1 {
            // A call it waited in ends before the frame saves its registers.
            super::restart::finish(
                t,
                p.abi,
                &mut regs.gprs[RAX],
                &mut regs.rip,
                Some(action.flags),
            );
        }
        match take(m, p, t, regs, sig, info) {
            Delivery::Nothing => continue,
            d => return d,
        }
    }
}

/// A synchronous fault's signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL,
/// SIGTRAP): its handler runs if one is installed and the signal is not
/// blocked; otherwise (blocked, ignored or default) the process ends, as
/// Linux's `force_sig_fault` makes it.
pub fn deliver_fault<M: Machine>(
    m: &mut M,
    p: &mut Process,
    t: &mut Thread,
    regs: &mut UserRegs,
    sig: u8,
    fault: FaultInfo,
) -> Delivery {
    let action = p.signals.actions[sig as usize - 1];
    if t.sigmask & bit(sig) != 0 || action.handler <= 1 {
        return Delivery::Kill {
            signal: sig,
            reason: "",
        };
    }
    take(m, p, t, regs, sig, Info::Fault(fault))
}

/// Why a signal came: sent by a process (`pid`), or raised by a fault.
#[derive(Clone, Copy)]
pub(crate) enum Info {
    Sent { pid: u32 },
    Fault(FaultInfo),
}

/// The `siginfo` of signal `sig` in `abi`'s layout: signo, errno and code,
/// then the union (the sender's pid, or the fault's address) at 16 in the
/// 64-bit layout and at 12 in the i386 one.
pub(crate) fn siginfo(abi: Abi, sig: u8, info: Info) -> [u8; SIGINFO_SIZE as usize] {
    let mut si = [0u8; SIGINFO_SIZE as usize];
    si[0..4].copy_from_slice(&i32::from(sig).to_le_bytes());
    let (code, value) = match info {
        Info::Sent { pid } => (SI_TKILL, u64::from(pid)),
        Info::Fault(f) => (f.code, f.addr),
    };
    si[8..12].copy_from_slice(&code.to_le_bytes());
    match abi {
        Abi::X86_64 => {
            let n = if matches!(info, Info::Sent { .. }) {
                4
            } else {
                8
            };
            si[16..16 + n].copy_from_slice(&value.to_le_bytes()[..n]);
        }
        Abi::I386 => si[12..16].copy_from_slice(&(value as u32).to_le_bytes()),
    }
    si
}

fn take<M: Machine>(
    m: &mut M,
    p: &mut Process,
    t: &mut Thread,
    regs: &mut UserRegs,
    sig: u8,
    info: Info,
) -> Delivery {
    let i = sig as usize - 1;
    let action = p.signals.actions[i];
    match action.handler {
        1 => return Delivery::Nothing,
        0 if default_ignored(sig) => return Delivery::Nothing,
        0 => {
            return Delivery::Kill {
                signal: sig,
                reason: if sig == 6 {
                    "aborted (SIGABRT)"
                } else {
                    "its default action"
                },
            };
        }
        _ => {}
    }
    if action.flags & sa::RESTORER == 0 {
        return Delivery::Kill {
            signal: sig,
            reason: "a handler without SA_RESTORER (no way back from it)",
        };
    }
    // After rt_sigsuspend, the frame keeps the mask from before it.
    let old_mask = t.saved_sigmask.take().unwrap_or(t.sigmask);
    let what = Taking {
        sig,
        action,
        info,
        old_mask,
    };
    let entered = if p.abi == Abi::I386 {
        ia32::setup_frame(m, p, t, regs, &what)
    } else {
        build_frame(m, p, t, regs, &what).map(|frame| {
            // Enter the handler: (sig, &info, &uc), the restorer as its
            // return address.
            regs.gprs[RDI] = u64::from(sig);
            regs.gprs[RSI] = frame + INFO_OFFSET;
            regs.gprs[RDX] = frame + UC_OFFSET;
            regs.gprs[RAX] = 0;
            regs.rsp = frame;
            regs.rip = action.handler;
        })
    };
    if entered.is_none() {
        return Delivery::Kill {
            signal: 11,
            reason: "no room for a signal frame on its stack",
        };
    }
    // A fresh FPU state for the handler.
    regs.rflags &= !HANDLER_CLEARS;
    regs.fpu = initial_fpu();
    t.sigmask = old_mask | action.mask;
    if action.flags & sa::NODEFER == 0 {
        t.sigmask |= bit(sig);
    }
    t.sigmask &= !(bit(SIGKILL) | bit(SIGSTOP));
    if action.flags & sa::RESETHAND != 0 {
        p.signals.actions[i] = Default::default();
    }
    Delivery::Handler(sig)
}

/// The FXSAVE image of a fresh FPU (FCW 0x37f, MXCSR 0x1f80).
pub fn initial_fpu() -> [u8; 512] {
    let mut f = [0u8; 512];
    f[0..2].copy_from_slice(&0x037fu16.to_le_bytes());
    f[24..28].copy_from_slice(&0x1f80u32.to_le_bytes());
    f
}

/// The signal a frame is built for.
struct Taking {
    sig: u8,
    action: super::process::SigAction,
    info: Info,
    /// The mask the frame saves (and `rt_sigreturn` restores).
    old_mask: u64,
}

/// Writes the `rt_sigframe`; returns its address, or `None` when the
/// stack cannot hold it.
fn build_frame<M: Machine>(
    m: &mut M,
    p: &Process,
    t: &mut Thread,
    regs: &UserRegs,
    what: &Taking,
) -> Option<u64> {
    let Taking {
        sig,
        ref action,
        info,
        old_mask,
    } = *what;
    let alt = t.altstack;
    let on_alt = sas_flags(&alt, regs.rsp);
    // The red zone below the interrupted stack pointer stays untouched.
    let sp = stack_top(&alt, on_alt, regs.rsp.checked_sub(128)?, action)?;
    let fpstate = sp.checked_sub(FPU_SIZE)? & !63;
    let frame = (fpstate.checked_sub(FRAME_SIZE)? & !15).checked_sub(8)?;
    if frame < super::vma::MMAP_MIN_ADDR {
        return None;
    }
    let g = &regs.gprs;
    let (trapno, err, cr2) = match info {
        Info::Fault(f) => (f.trapno, f.err, f.cr2),
        Info::Sent { .. } => (0, 0, 0),
    };
    // struct sigcontext (x86-64): r8-r15, rdi, rsi, rbp, rbx, rdx, rax,
    // rcx, rsp, rip, eflags, cs/gs/fs/ss, err, trapno, oldmask, cr2,
    // fpstate, reserved[8].
    let mut mc = [0u64; (SIGCONTEXT_SIZE / 8) as usize];
    mc[..8].copy_from_slice(&g[R8..R8 + 8]);
    mc[8] = g[RDI];
    mc[9] = g[RSI];
    mc[10] = g[RBP];
    mc[11] = g[RBX];
    mc[12] = g[RDX];
    mc[13] = g[RAX];
    mc[14] = g[RCX];
    mc[15] = regs.rsp;
    mc[16] = regs.rip;
    mc[17] = regs.rflags;
    // cs (0x33, Linux's __USER_CS), gs 0, fs 0, ss (0x2b, __USER_DS): what
    // a program reads there is Linux's, whatever selectors the runtime uses.
    mc[18] = USER_CS | (USER_DS << 48);
    mc[19] = err;
    mc[20] = trapno;
    mc[21] = old_mask;
    mc[22] = cr2;
    mc[23] = fpstate;
    let mut uc = [0u8; UCONTEXT_SIZE as usize];
    uc[0..8].copy_from_slice(&UC_FLAGS.to_le_bytes());
    uc[16..24].copy_from_slice(&alt.sp.to_le_bytes());
    uc[24..28].copy_from_slice(&on_alt.to_le_bytes());
    uc[32..40].copy_from_slice(&alt.size.to_le_bytes());
    for (i, w) in mc.iter().enumerate() {
        let o = MCONTEXT_OFFSET as usize + i * 8;
        uc[o..o + 8].copy_from_slice(&w.to_le_bytes());
    }
    let o = (MCONTEXT_OFFSET + SIGCONTEXT_SIZE) as usize;
    uc[o..o + 8].copy_from_slice(&old_mask.to_le_bytes());
    let si = siginfo(Abi::X86_64, sig, info);
    let mut fpu = regs.fpu;
    // No XSAVE magic in the software-reserved bytes: a plain FXSAVE image.
    fpu[464..].fill(0);
    m.write_user(&p.areas, fpstate, &fpu).ok()?;
    m.write_user(&p.areas, frame, &action.restorer.to_le_bytes())
        .ok()?;
    m.write_user(&p.areas, frame + UC_OFFSET, &uc).ok()?;
    m.write_user(&p.areas, frame + INFO_OFFSET, &si).ok()?;
    disarm(t, on_alt, action);
    Some(frame)
}

/// Where a frame goes below: `sp`, or the top of the alternate stack for
/// an SA_ONSTACK handler while the thread is not on it.
fn stack_top(
    alt: &AltStack,
    on_alt: u32,
    sp: u64,
    action: &super::process::SigAction,
) -> Option<u64> {
    if action.flags & sa::ONSTACK != 0 && on_alt == 0 {
        alt.sp.checked_add(alt.size)
    } else {
        Some(sp)
    }
}

/// SS_AUTODISARM: entering the alternate stack disables it.
fn disarm(t: &mut Thread, on_alt: u32, action: &super::process::SigAction) {
    let alt = t.altstack;
    if on_alt == 0 && action.flags & sa::ONSTACK != 0 && alt.flags & SS_AUTODISARM != 0 {
        t.altstack = AltStack {
            sp: 0,
            flags: SS_DISABLE,
            size: 0,
        };
    }
}

/// The alternate stack as a frame's `uc_stack` says (Linux's
/// `restore_altstack`; a bad one is ignored), unless the thread runs on
/// the current one (`rsp`: where sigreturn resumes it).
fn restore_altstack(t: &mut Thread, rsp: u64, sp: u64, flags: u32, size: u64) {
    if sas_flags(&t.altstack, rsp) == SS_ONSTACK {
        return;
    }
    if flags & SS_DISABLE != 0 {
        t.altstack = AltStack {
            sp: 0,
            flags: SS_DISABLE,
            size: 0,
        };
    } else if flags & !(SS_ONSTACK | SS_AUTODISARM) == 0 && size >= 2048 {
        t.altstack = AltStack {
            sp,
            flags: flags & SS_AUTODISARM,
            size,
        };
    }
}

/// `rt_sigreturn`: restores the registers, FPU state, signal mask and
/// alternate stack a handler's frame holds (the frame's `pretcode` was
/// popped, so it starts 8 bytes below `regs.rsp`, 4 for an i386 frame). A
/// frame that cannot be read or that would resume the thread outside user
/// space (a non-canonical or runtime RIP or stack, a code or stack segment
/// selector other than Linux's user ones, an FPU state with reserved MXCSR
/// bits, an i386 frame's selectors other than the process's own) ends the
/// process with a reason, never the runtime.
pub fn sigreturn<M: Machine>(
    m: &mut M,
    p: &mut Process,
    t: &mut Thread,
    regs: &mut UserRegs,
) -> Result<(), &'static str> {
    if p.abi == Abi::I386 {
        return ia32::sigreturn(m, p, t, regs, true);
    }
    let frame = regs
        .rsp
        .checked_sub(8)
        .ok_or("sigreturn with no signal frame on the stack")?;
    let mut uc = [0u8; UCONTEXT_SIZE as usize];
    m.read_user(&p.areas, frame + UC_OFFSET, &mut uc)
        .map_err(|_| "sigreturn with no signal frame on the stack")?;
    let word = |i: usize| {
        let o = MCONTEXT_OFFSET as usize + i * 8;
        u64::from_le_bytes(uc[o..o + 8].try_into().unwrap_or([0; 8]))
    };
    let rip = word(16);
    let rsp = word(15);
    let top = p.layout.user_top;
    if rip >= top {
        return Err("sigreturn to an address outside user space (a forged frame)");
    }
    if rsp >= top {
        return Err("sigreturn to a stack outside user space (a forged frame)");
    }
    // cs, gs, fs, ss: Linux ORs RPL 3 into cs and ss and lets IRET take
    // them, which faults on anything but its 64-bit user code segment (a
    // 32-bit one would switch to compat mode, which a 64-bit process here
    // cannot) and, under UC_STRICT_RESTORE_SS, on anything but its user
    // data segment (without it a bad ss is replaced by that one).
    let selectors = word(18);
    if (selectors & 0xffff) | 3 != USER_CS {
        return Err("sigreturn with a bad code segment selector (a forged frame)");
    }
    let uc_flags = u64::from_le_bytes(uc[0..8].try_into().unwrap_or([0; 8]));
    if uc_flags & UC_STRICT_RESTORE_SS != 0 && (selectors >> 48) | 3 != USER_DS {
        return Err("sigreturn with a bad stack segment selector (a forged frame)");
    }
    let fpstate = word(23);
    let fpu = if fpstate == 0 {
        initial_fpu()
    } else {
        let mut f = [0u8; 512];
        m.read_user(&p.areas, fpstate, &mut f)
            .map_err(|_| "sigreturn with an unreadable FPU state (a forged frame)")?;
        let mxcsr = u32::from_le_bytes([f[24], f[25], f[26], f[27]]);
        if mxcsr & MXCSR_RESERVED != 0 {
            return Err("sigreturn with a bad FPU state (reserved MXCSR bits)");
        }
        f
    };
    let g = &mut regs.gprs;
    for i in 0..8 {
        g[R8 + i] = word(i);
    }
    g[RDI] = word(8);
    g[RSI] = word(9);
    g[RBP] = word(10);
    g[RBX] = word(11);
    g[RDX] = word(12);
    g[RAX] = word(13);
    g[RCX] = word(14);
    regs.rsp = rsp;
    regs.rip = rip;
    regs.rflags = (regs.rflags & !FIX_EFLAGS) | (word(17) & FIX_EFLAGS);
    regs.fpu = fpu;
    let o = (MCONTEXT_OFFSET + SIGCONTEXT_SIZE) as usize;
    let mask = u64::from_le_bytes(uc[o..o + 8].try_into().unwrap_or([0; 8]));
    t.sigmask = mask & !(bit(SIGKILL) | bit(SIGSTOP));
    let sp = u64::from_le_bytes(uc[16..24].try_into().unwrap_or([0; 8]));
    let flags = u32::from_le_bytes(uc[24..28].try_into().unwrap_or([0; 4]));
    let size = u64::from_le_bytes(uc[32..40].try_into().unwrap_or([0; 8]));
    restore_altstack(t, regs.rsp, sp, flags, size);
    Ok(())
}

/// The i386 `sigreturn` (119) of a handler installed without SA_SIGINFO:
/// its `sigframe_ia32` starts 8 bytes below `regs.rsp` (the restorer
/// popped the return address and the signal number). Checked as
/// [`sigreturn`] checks a frame; a 64-bit process has no such call.
pub fn old_sigreturn<M: Machine>(
    m: &mut M,
    p: &mut Process,
    t: &mut Thread,
    regs: &mut UserRegs,
) -> Result<(), &'static str> {
    if p.abi != Abi::I386 {
        return Err("sigreturn (119) of a 64-bit process");
    }
    ia32::sigreturn(m, p, t, regs, false)
}
