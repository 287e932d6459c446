//! Signal delivery for 64-bit and i386 processes: the frame a handler
//! gets, the way back through `rt_sigreturn` (and i386 `sigreturn`), the
//! alternate stack, and forged frames.

use super::*;
use crate::sys::signal::{self, Delivery, FaultInfo, UserRegs, sa};
use crate::sys::uapi::Sigaction64;

pub(super) const HANDLER: u64 = TEXT + 0x100;
const RESTORER: u64 = TEXT + 0x200;
const SIGUSR1: u64 = 10;
const SIGUSR2: u64 = 12;
const SIGSEGV: u8 = 11;

pub(super) fn install(e: &mut Env, sig: u64, flags: u64, mask: u64) {
    let act = Sigaction64 {
        sa_handler: HANDLER,
        sa_flags: flags,
        sa_restorer: RESTORER,
        sa_mask: mask,
    };
    e.poke(SCRATCH + 0xf00, &act.to_bytes());
    assert_eq!(e.ret("rt_sigaction", &[sig, SCRATCH + 0xf00, 0, 8]), 0);
}

fn deliver(e: &mut Env, r: &mut UserRegs) -> Delivery {
    signal::deliver(&mut e.m, &mut e.p, &mut e.t, r)
}

fn u32_at(e: &mut Env, a: u64) -> u32 {
    u32::from_le_bytes(e.peek(a, 4).try_into().unwrap())
}

#[test]
fn a_handler_gets_linuxs_frame_and_sigreturn_restores_everything() {
    let mut e = Env::new(Abi::X86_64);
    install(
        &mut e,
        SIGUSR1,
        sa::SIGINFO | sa::RESTORER,
        1 << (SIGUSR2 - 1),
    );
    e.t.sigmask = 1 << 2;
    assert_eq!(e.ret("tgkill", &[7, 7, SIGUSR1]), 0);
    let before = {
        let mut r = e.regs();
        r.fpu[24..28].copy_from_slice(&0x1f00u32.to_le_bytes());
        r.fpu[160] = 0xab; // an XMM0 byte
        r
    };
    let mut r = before.clone();
    assert_eq!(deliver(&mut e, &mut r), Delivery::Handler(10));
    let frame = r.rsp;
    // Entered as if called: (frame + 8) is 16-byte aligned, below the red zone.
    assert_eq!((frame + 8) % 16, 0);
    assert!(frame + 440 <= before.rsp - 128);
    assert_eq!(r.rip, HANDLER);
    assert_eq!(r.gprs[5], 10, "rdi = signal");
    assert_eq!(r.gprs[4], frame + 8 + 304, "rsi = &siginfo");
    assert_eq!(r.gprs[3], frame + 8, "rdx = &ucontext");
    assert_eq!(e.u64_at(frame), RESTORER, "return address");
    // siginfo: signo, code SI_TKILL, the sender's pid.
    let info = frame + 8 + 304;
    assert_eq!(u32_at(&mut e, info), 10);
    assert_eq!(u32_at(&mut e, info + 8) as i32, -6);
    assert_eq!(u32_at(&mut e, info + 16), 7);
    // The sigcontext: rip, rsp, rax, r8, the old mask, the FPU state.
    let mc = frame + 8 + 40;
    assert_eq!(e.u64_at(mc + 16 * 8), before.rip);
    assert_eq!(e.u64_at(mc + 15 * 8), before.rsp);
    assert_eq!(e.u64_at(mc + 13 * 8), before.gprs[0], "rax");
    assert_eq!(e.u64_at(mc), before.gprs[7], "r8");
    assert_eq!(e.u64_at(mc + 21 * 8), 1 << 2, "oldmask");
    let fpstate = e.u64_at(mc + 23 * 8);
    assert_eq!(fpstate % 64, 0);
    assert_eq!(e.peek(fpstate + 160, 1), [0xab]);
    // The handler runs with the signal and sa_mask blocked, a fresh FPU.
    assert_eq!(e.t.sigmask, (1 << 2) | (1 << 9) | (1 << 11));
    assert_eq!(r.fpu, signal::initial_fpu());
    // The handler clobbers registers, then returns through the restorer.
    r.gprs = [0xdead; 15];
    r.rsp = frame + 8;
    assert_eq!(e.call("rt_sigreturn", &[]), Action::SigReturn);
    signal::sigreturn(&mut e.m, &mut e.p, &mut e.t, &mut r).unwrap();
    assert_eq!(r, before);
    assert_eq!(e.t.sigmask, 1 << 2);
    assert_eq!(deliver(&mut e, &mut r), Delivery::Nothing);
}

#[test]
fn a_handler_on_the_alternate_stack_runs_there_and_nested_ones_stay() {
    let mut e = Env::new(Abi::X86_64);
    let alt = SCRATCH + 0x2000;
    let ss = crate::sys::uapi::Stack64 {
        ss_sp: alt,
        ss_flags: 0,
        pad: 0,
        ss_size: 0x4000,
    };
    e.poke(SCRATCH, &ss.to_bytes());
    assert_eq!(e.ret("sigaltstack", &[SCRATCH, 0]), 0);
    install(
        &mut e,
        SIGUSR1,
        sa::SIGINFO | sa::RESTORER | sa::ONSTACK | sa::NODEFER,
        0,
    );
    e.t.pending = 1 << (SIGUSR1 - 1);
    let mut r = e.regs();
    assert_eq!(deliver(&mut e, &mut r), Delivery::Handler(10));
    assert!((alt..alt + 0x4000).contains(&r.rsp));
    // SA_NODEFER: not blocked in its own handler; the next lands below.
    assert_eq!(e.t.sigmask, 0);
    let first = r.rsp;
    e.t.pending = 1 << (SIGUSR1 - 1);
    assert_eq!(deliver(&mut e, &mut r), Delivery::Handler(10));
    assert!(r.rsp < first && r.rsp >= alt);
    // uc_stack says SS_ONSTACK for the nested frame.
    assert_eq!(u32_at(&mut e, r.rsp + 8 + 24), 1);
}

#[test]
fn resethand_ignored_and_default_actions() {
    let mut e = Env::new(Abi::X86_64);
    install(&mut e, SIGUSR1, sa::RESTORER | sa::RESETHAND, 0);
    e.t.pending = 1 << (SIGUSR1 - 1);
    let mut r = e.regs();
    assert_eq!(deliver(&mut e, &mut r), Delivery::Handler(10));
    assert_eq!(e.p.signals.actions[9].handler, 0, "reset to SIG_DFL");
    // SIGURG's default is to ignore it (Go's preemption signal).
    e.t.pending = 1 << 22;
    assert_eq!(deliver(&mut e, &mut r), Delivery::Nothing);
    assert_eq!(e.t.pending, 0);
    // Once the handler returned (its mask restored), SIGUSR1 takes its
    // default action: the process ends.
    assert_eq!(e.ret("kill", &[7, SIGUSR1]), 0);
    assert_eq!(
        deliver(&mut e, &mut r),
        Delivery::Nothing,
        "blocked in the handler"
    );
    e.t.sigmask = 0;
    assert!(matches!(
        deliver(&mut e, &mut r),
        Delivery::Kill { signal: 10, .. }
    ));
}

#[test]
fn no_restorer_or_no_room_on_the_stack_ends_the_process() {
    let mut e = Env::new(Abi::X86_64);
    install(&mut e, SIGUSR1, sa::SIGINFO, 0);
    e.t.pending = 1 << (SIGUSR1 - 1);
    let mut r = e.regs();
    assert!(matches!(
        deliver(&mut e, &mut r),
        Delivery::Kill { signal: 10, reason } if reason.contains("SA_RESTORER")
    ));
    install(&mut e, SIGUSR1, sa::SIGINFO | sa::RESTORER, 0);
    e.t.pending = 1 << (SIGUSR1 - 1);
    r.rsp = BAD;
    assert!(matches!(
        deliver(&mut e, &mut r),
        Delivery::Kill { signal: 11, .. }
    ));
}

#[test]
fn a_fault_goes_to_its_handler_with_the_address_unless_blocked() {
    let mut e = Env::new(Abi::X86_64);
    install(&mut e, 11, sa::SIGINFO | sa::RESTORER, 0);
    let fault = FaultInfo {
        code: 1,
        addr: 0xdead_0000,
        trapno: 14,
        err: 4,
        cr2: 0xdead_0000,
    };
    let mut r = e.regs();
    let d = signal::deliver_fault(&mut e.m, &mut e.p, &mut e.t, &mut r, SIGSEGV, fault);
    assert_eq!(d, Delivery::Handler(11));
    let info = r.rsp + 8 + 304;
    assert_eq!(u32_at(&mut e, info + 8), 1, "SEGV_MAPERR");
    assert_eq!(e.u64_at(info + 16), 0xdead_0000);
    let mc = r.rsp + 8 + 40;
    assert_eq!(e.u64_at(mc + 20 * 8), 14, "trapno");
    assert_eq!(e.u64_at(mc + 22 * 8), 0xdead_0000, "cr2");
    // A second SEGV inside the handler (blocked there) ends the process.
    let d = signal::deliver_fault(&mut e.m, &mut e.p, &mut e.t, &mut r, SIGSEGV, fault);
    assert!(matches!(d, Delivery::Kill { signal: 11, .. }));
}

#[test]
fn forged_sigreturn_frames_end_the_process_with_a_reason() {
    for (word, value, what) in [
        (16, 0xffff_8000_0000_1000u64, "outside user space"),
        (16, 0x8000_0000_0000_0000, "outside user space"),
        (16, 0xffff_ffff_8010_0000, "outside user space"),
        (15, 0xffff_ffff_8000_0000, "stack outside user space"),
        // cs/gs/fs/ss: ring-0 code, a 32-bit user code segment, the user
        // data segment as code, a null or ring-0 stack segment.
        (18, 0x002b_0000_0000_0008, "code segment"),
        (18, 0x002b_0000_0000_0023, "code segment"),
        (18, 0x002b_0000_0000_002b, "code segment"),
        (18, 0x0000_0000_0000_0033, "stack segment"),
        (18, 0x0010_0000_0000_0033, "stack segment"),
    ] {
        let mut e = Env::new(Abi::X86_64);
        install(&mut e, SIGUSR1, sa::SIGINFO | sa::RESTORER, 0);
        e.t.pending = 1 << (SIGUSR1 - 1);
        let mut r = e.regs();
        assert_eq!(deliver(&mut e, &mut r), Delivery::Handler(10));
        e.poke(r.rsp + 8 + 40 + word * 8, &value.to_le_bytes());
        r.rsp += 8;
        let err = signal::sigreturn(&mut e.m, &mut e.p, &mut e.t, &mut r).unwrap_err();
        assert!(err.contains(what), "{err}");
    }
    // RPL 0 in the frame's selectors is Linux's user ones with RPL 3; a bad
    // ss without UC_STRICT_RESTORE_SS is replaced, as Linux's force_valid_ss.
    for (flags, selectors) in [(6u64, 0x0028_0000_0000_0030u64), (2, 0x0010_0000_0000_0033)] {
        let mut e = Env::new(Abi::X86_64);
        install(&mut e, SIGUSR1, sa::SIGINFO | sa::RESTORER, 0);
        e.t.pending = 1 << (SIGUSR1 - 1);
        let mut r = e.regs();
        assert_eq!(deliver(&mut e, &mut r), Delivery::Handler(10));
        e.poke(r.rsp + 8, &flags.to_le_bytes());
        e.poke(r.rsp + 8 + 40 + 18 * 8, &selectors.to_le_bytes());
        r.rsp += 8;
        signal::sigreturn(&mut e.m, &mut e.p, &mut e.t, &mut r).unwrap();
    }
    // Reserved MXCSR bits in the saved FPU state.
    let mut e = Env::new(Abi::X86_64);
    install(&mut e, SIGUSR1, sa::SIGINFO | sa::RESTORER, 0);
    e.t.pending = 1 << (SIGUSR1 - 1);
    let mut r = e.regs();
    assert_eq!(deliver(&mut e, &mut r), Delivery::Handler(10));
    let fpstate = e.u64_at(r.rsp + 8 + 40 + 23 * 8);
    e.poke(fpstate + 24, &0xffff_1f80u32.to_le_bytes());
    r.rsp += 8;
    let err = signal::sigreturn(&mut e.m, &mut e.p, &mut e.t, &mut r).unwrap_err();
    assert!(err.contains("FPU"), "{err}");
    // No frame at all.
    let mut r = e.regs();
    r.rsp = BAD;
    assert!(signal::sigreturn(&mut e.m, &mut e.p, &mut e.t, &mut r).is_err());
}

#[test]
fn tgkill_reaches_other_threads_of_the_process_only() {
    let mut e = Env::new(Abi::X86_64);
    e.m.threads = vec![8];
    assert_eq!(e.ret("tgkill", &[7, 8, SIGUSR1]), 0);
    assert_eq!(e.m.signalled, [(8, 10)]);
    assert_eq!(e.ret("tgkill", &[7, 8, 0]), 0, "a probe sends nothing");
    assert_eq!(e.m.signalled.len(), 1);
    assert_eq!(e.err("tgkill", &[7, 9, SIGUSR1]), Errno::ESRCH);
    // A thread that is not there is ESRCH whatever the signal, as Linux;
    // a bad signal to one that is, or to the caller, is EINVAL.
    assert_eq!(e.err("tgkill", &[7, 9, 1000]), Errno::ESRCH);
    assert_eq!(e.err("tkill", &[9, 65]), Errno::ESRCH);
    assert_eq!(e.err("tgkill", &[7, 8, 65]), Errno::EINVAL);
    assert_eq!(e.err("tgkill", &[7, 7, 65]), Errno::EINVAL);
    assert_eq!(e.err("kill", &[99, 1000]), Errno::ESRCH);
    assert_eq!(e.err("kill", &[7, 1000]), Errno::EINVAL);
    assert_eq!(e.m.signalled.len(), 1);
    assert_eq!(
        e.err("tgkill", &[8, 8, SIGUSR1]),
        Errno::ESRCH,
        "another tgid"
    );
    assert_eq!(e.t.pending, 0);
}

#[test]
fn setitimer_getitimer_and_alarm_go_through_the_runtimes_timer() {
    for mut e in both_abis() {
        let wide = e.abi == Abi::X86_64;
        // interval 0.25 s, value 1.5 s.
        let tv = |s: i64, us: i64| -> Vec<u8> {
            if wide {
                [s.to_le_bytes(), us.to_le_bytes()].concat()
            } else {
                [(s as i32).to_le_bytes(), (us as i32).to_le_bytes()].concat()
            }
        };
        let itv = [tv(0, 250_000), tv(1, 500_000)].concat();
        e.poke(SCRATCH, &itv);
        assert_eq!(e.ret("setitimer", &[0, SCRATCH, 0]), 0);
        assert_eq!(e.m.itimer, (1_500_000_000, 250_000_000));
        assert_eq!(e.ret("getitimer", &[0, SCRATCH + 0x100]), 0);
        assert_eq!(e.peek(SCRATCH + 0x100, itv.len()), itv);
        // alarm(3) replaces it and says what was left, rounded: 1.5 s -> 2.
        assert_eq!(e.ret("alarm", &[3]), 2);
        assert_eq!(e.m.itimer, (3_000_000_000, 0));
        assert_eq!(e.ret("alarm", &[0]), 3);
        // Only ITIMER_REAL; microseconds past a second are EINVAL.
        assert_eq!(e.err("setitimer", &[1, SCRATCH, 0]), Errno::EINVAL);
        e.poke(SCRATCH, &[tv(0, 1_000_000), tv(0, 0)].concat());
        assert_eq!(e.err("setitimer", &[0, SCRATCH, 0]), Errno::EINVAL);
        assert_eq!(e.err("setitimer", &[0, BAD, 0]), Errno::EFAULT);
    }
}

fn both_abis() -> [Env; 2] {
    [Env::new(Abi::X86_64), Env::new(Abi::I386)]
}

#[test]
fn sigsuspend_waits_with_its_mask_and_the_handler_frame_keeps_the_old_one() {
    let mut e = Env::new(Abi::X86_64);
    install(&mut e, SIGUSR1, sa::SIGINFO | sa::RESTORER, 0);
    e.t.sigmask = 1 << (SIGUSR1 - 1);
    e.poke(SCRATCH, &0u64.to_le_bytes());
    assert_eq!(e.call("rt_sigsuspend", &[SCRATCH, 8]), Action::Block);
    assert_eq!(e.t.sigmask, 0, "waits with the given mask");
    e.t.pending = 1 << (SIGUSR1 - 1);
    let mut r = e.regs();
    assert_eq!(deliver(&mut e, &mut r), Delivery::Handler(10));
    let mc = r.rsp + 8 + 40;
    assert_eq!(
        e.u64_at(mc + 21 * 8),
        1 << 9,
        "the frame keeps the mask from before"
    );
    r.rsp += 8;
    signal::sigreturn(&mut e.m, &mut e.p, &mut e.t, &mut r).unwrap();
    assert_eq!(e.t.sigmask, 1 << 9);
    // A suspend that only an ignored signal ended gets its mask back.
    assert_eq!(e.call("rt_sigsuspend", &[SCRATCH, 8]), Action::Block);
    e.t.pending = 1 << 22;
    assert_eq!(deliver(&mut e, &mut r), Delivery::Nothing);
    assert_eq!(e.t.sigmask, 1 << 9);
    assert_eq!(e.call("pause", &[]), Action::Block);
}

#[test]
fn an_sa_restart_handler_makes_an_interrupted_pipe_read_again_and_poll_says_eintr() {
    for (flags, restarts) in [(sa::RESTORER | sa::RESTART, true), (sa::RESTORER, false)] {
        let mut e = Env::new(Abi::X86_64);
        install(&mut e, SIGUSR1, flags, 0);
        assert_eq!(e.ret("pipe", &[SCRATCH]), 0);
        let r = e.u32_at(SCRATCH) as u64;
        assert_eq!(
            e.call("read", &[r, SCRATCH + 0x100, 10]),
            Action::Wait { until_ns: None }
        );
        // The runtime interrupts the wait: -EINTR in rax, then delivery.
        assert_eq!(crate::sys::interrupt_wait(&mut e.sys, &mut e.t), None);
        assert!(e.sys.waits.is_empty() && e.t.wait.is_none());
        e.t.pending |= 1 << (SIGUSR1 - 1);
        let mut before = e.regs();
        before.gprs[0] = Errno::EINTR.to_return();
        let mut r2 = before.clone();
        assert_eq!(deliver(&mut e, &mut r2), Delivery::Handler(10));
        r2.rsp += 8;
        signal::sigreturn(&mut e.m, &mut e.p, &mut e.t, &mut r2).unwrap();
        if restarts {
            assert_eq!(r2.rip, before.rip - 2, "back at the SYSCALL");
            assert_eq!(r2.gprs[0], nr(Abi::X86_64, "read"), "with its number");
        } else {
            assert_eq!(r2, before, "EINTR");
        }
        // poll is never made again.
        e.poke(
            SCRATCH + 0x200,
            &[r as i32, 1].map(i32::to_le_bytes).concat(),
        );
        assert_eq!(
            e.call("poll", &[SCRATCH + 0x200, 1, -1i64 as u64]),
            Action::Wait { until_ns: None }
        );
        assert_eq!(crate::sys::interrupt_wait(&mut e.sys, &mut e.t), None);
        e.t.pending |= 1 << (SIGUSR1 - 1);
        let mut r3 = before.clone();
        assert_eq!(deliver(&mut e, &mut r3), Delivery::Handler(10));
        r3.rsp += 8;
        signal::sigreturn(&mut e.m, &mut e.p, &mut e.t, &mut r3).unwrap();
        assert_eq!(r3, before);
        assert_eq!(e.t.interrupted, None);
    }
}

// i386 processes: Linux's ia32 frames (`sigframe_ia32`, `rt_sigframe_ia32`,
// `struct sigcontext_32`, `struct _fpstate_32`), byte offsets as in
// arch/x86/include/asm/sigframe.h and uapi/asm/sigcontext.h.

mod ia32 {
    use super::*;
    use crate::sys::uapi::{Sigaction32, Stack32};
    use arch_x86::gdt;

    /// `struct sigcontext_32` word offsets.
    const GS: u64 = 0;
    const FS: u64 = 4;
    const ES: u64 = 8;
    const DS: u64 = 12;
    const EDI: u64 = 16;
    const ESI: u64 = 20;
    const EBP: u64 = 24;
    const ESP: u64 = 28;
    const EBX: u64 = 32;
    const EDX: u64 = 36;
    const ECX: u64 = 40;
    const EAX: u64 = 44;
    const TRAPNO: u64 = 48;
    const ERR: u64 = 52;
    const EIP: u64 = 56;
    const CS: u64 = 60;
    const EFLAGS: u64 = 64;
    const ESP_AT_SIGNAL: u64 = 68;
    const SS: u64 = 72;
    const FPSTATE: u64 = 76;
    const OLDMASK: u64 = 80;
    const CR2: u64 = 84;
    /// rt_sigframe_ia32: info at 16, uc at 144 (sigcontext at uc + 20,
    /// uc_sigmask at uc + 108), retcode at 260.
    const RT_INFO: u64 = 16;
    const RT_UC: u64 = 144;
    const RT_SC: u64 = RT_UC + 20;
    /// sigframe_ia32: sigcontext at 8, extramask at 720, retcode at 724.
    const OLD_SC: u64 = 8;

    fn install32(e: &mut Env, sig: u64, flags: u32, mask: u64) {
        let act = Sigaction32 {
            sa_handler: HANDLER as u32,
            sa_flags: flags,
            sa_restorer: RESTORER as u32,
            sa_mask: mask,
        };
        e.poke(SCRATCH + 0xf00, &act.to_bytes());
        assert_eq!(e.ret("rt_sigaction", &[sig, SCRATCH + 0xf00, 0, 8]), 0);
    }

    /// Registers as an i386 thread has them: 32-bit values, glibc's TLS in
    /// GS, the user data selector in DS and ES, an x87 register in use.
    fn regs32(e: &Env) -> UserRegs {
        let mut r = e.regs();
        for (i, g) in r.gprs.iter_mut().enumerate().take(7) {
            *g = 0x1111_0000 + i as u64;
        }
        r.rsp = SCRATCH + 0x8000 - 4;
        r.rflags = 0x246;
        r.seg.gs = gdt::tls_selector(0);
        r.seg.fs = 3;
        r.seg.ds = gdt::USER_DATA;
        r.seg.es = gdt::USER_DATA;
        // st0 = 1.0 in physical register 7 (TOP = 7), MXCSR with FTZ set.
        r.fpu[2..4].copy_from_slice(&(7u16 << 11).to_le_bytes());
        r.fpu[4] = 0x80;
        r.fpu[32 + 7] = 0x80;
        r.fpu[32 + 8..32 + 10].copy_from_slice(&0x3fffu16.to_le_bytes());
        r.fpu[24..28].copy_from_slice(&0x9f80u32.to_le_bytes());
        r.fpu[160] = 0xab; // an XMM0 byte
        r
    }

    fn sigreturn32(e: &mut Env, r: &mut UserRegs) -> Result<(), &'static str> {
        signal::sigreturn(&mut e.m, &mut e.p, &mut e.t, r)
    }

    fn old_sigreturn32(e: &mut Env, r: &mut UserRegs) -> Result<(), &'static str> {
        signal::old_sigreturn(&mut e.m, &mut e.p, &mut e.t, r)
    }

    /// The `_fpstate_32` at `fp` as Linux writes it from `before`'s FXSAVE
    /// image: the FNSAVE header converted from it, then the image.
    fn check_fpstate(e: &mut Env, fp: u64, before: &UserRegs) {
        assert_eq!((fp + 112) % 64, 0, "the FXSAVE part is 64-byte aligned");
        assert_eq!(u32_at(e, fp), 0xffff_037f, "cwd");
        assert_eq!(u32_at(e, fp + 4), 0xffff_3800, "swd");
        // Physical register 7 holds a normal number (tag 0), the rest are
        // empty (tag 3).
        assert_eq!(u32_at(e, fp + 8), 0xffff_3fff, "twd");
        assert_eq!(u32_at(e, fp + 16), u32::from(gdt::USER_CODE32), "fcs");
        assert_eq!(
            u32_at(e, fp + 24),
            0xffff_0000 | u32::from(gdt::USER_DATA),
            "fos"
        );
        // _st[0] (10 bytes at 28) is st0 = 1.0.
        assert_eq!(e.peek(fp + 28, 10), before.fpu[32..42]);
        assert_eq!(e.peek(fp + 108, 2), [0x00, 0x38], "status = swd");
        assert_eq!(e.peek(fp + 110, 2), [0, 0], "magic: FXSR present");
        assert_eq!(e.peek(fp + 112, 464), before.fpu[..464], "the FXSAVE image");
    }

    #[test]
    fn an_rt_handler_gets_rt_sigframe_ia32_and_rt_sigreturn_restores_everything() {
        let mut e = Env::new(Abi::I386);
        let flags = (sa::SIGINFO | sa::RESTORER) as u32;
        install32(&mut e, SIGUSR1, flags, 1 << (SIGUSR2 - 1));
        e.t.sigmask = (1 << 2) | (1 << 40);
        assert_eq!(e.ret("tgkill", &[7, 7, SIGUSR1]), 0);
        let before = regs32(&e);
        let mut r = before.clone();
        assert_eq!(deliver(&mut e, &mut r), Delivery::Handler(10));
        let frame = r.rsp;
        // Entry as Linux's ia32_setup_rt_frame: ((esp + 4) & 15) == 0,
        // eax = signal, edx = &info, ecx = &uc, the user selectors.
        assert_eq!((frame + 4) % 16, 0);
        assert!(frame + 268 <= before.rsp);
        assert_eq!(r.rip, HANDLER);
        assert_eq!(r.gprs[0], 10, "eax = signal");
        assert_eq!(r.gprs[3], frame + RT_INFO, "edx = &info");
        assert_eq!(r.gprs[2], frame + RT_UC, "ecx = &uc");
        assert_eq!(r.seg.cs, gdt::USER_CODE32);
        assert_eq!(
            [r.seg.ss, r.seg.ds, r.seg.es],
            [gdt::USER_DATA; 3],
            "ss, ds, es"
        );
        assert_eq!(r.seg.gs, before.seg.gs, "gs stays (the thread's TLS)");
        assert_eq!(r.rflags & 0x400, 0, "DF clear");
        // pretcode, sig, pinfo, puc.
        assert_eq!(u32_at(&mut e, frame), RESTORER as u32);
        assert_eq!(u32_at(&mut e, frame + 4), 10);
        assert_eq!(u64::from(u32_at(&mut e, frame + 8)), frame + RT_INFO);
        assert_eq!(u64::from(u32_at(&mut e, frame + 12)), frame + RT_UC);
        // Compat siginfo: signo, errno, code SI_TKILL, si_pid at 12.
        let info = frame + RT_INFO;
        assert_eq!(u32_at(&mut e, info), 10);
        assert_eq!(u32_at(&mut e, info + 4), 0);
        assert_eq!(u32_at(&mut e, info + 8) as i32, -6);
        assert_eq!(u32_at(&mut e, info + 12), 7);
        // ucontext_ia32: uc_flags 0 (no XSAVE state), uc_link, uc_stack
        // (ss_sp, ss_flags SS_DISABLE, ss_size).
        let uc = frame + RT_UC;
        assert_eq!(u32_at(&mut e, uc), 0);
        assert_eq!(u32_at(&mut e, uc + 4), 0);
        assert_eq!(u32_at(&mut e, uc + 12), 2);
        // The sigcontext, word by word.
        let sc = frame + RT_SC;
        let g = &before.gprs;
        for (off, want) in [
            (GS, u32::from(gdt::tls_selector(0))),
            (FS, 3),
            (ES, u32::from(gdt::USER_DATA)),
            (DS, u32::from(gdt::USER_DATA)),
            (EDI, g[5] as u32),
            (ESI, g[4] as u32),
            (EBP, g[6] as u32),
            (ESP, before.rsp as u32),
            (EBX, g[1] as u32),
            (EDX, g[3] as u32),
            (ECX, g[2] as u32),
            (EAX, g[0] as u32),
            (TRAPNO, 0),
            (ERR, 0),
            (EIP, before.rip as u32),
            (CS, u32::from(gdt::USER_CODE32)),
            (EFLAGS, 0x246),
            (ESP_AT_SIGNAL, before.rsp as u32),
            (SS, u32::from(gdt::USER_DATA)),
            (OLDMASK, 1 << 2),
            (CR2, 0),
        ] {
            assert_eq!(u32_at(&mut e, sc + off), want, "sigcontext + {off}");
        }
        assert_eq!(e.u64_at(uc + 108), (1 << 2) | (1 << 40), "uc_sigmask");
        // movl $173, %eax; int $0x80.
        assert_eq!(e.peek(frame + 260, 8), [0xb8, 173, 0, 0, 0, 0xcd, 0x80, 0]);
        let fp = u64::from(u32_at(&mut e, sc + FPSTATE));
        assert!(
            (frame + 268..frame + 268 + 16).contains(&fp),
            "the FPU state right above the frame"
        );
        check_fpstate(&mut e, fp, &before);
        assert_eq!(e.t.sigmask, (1 << 2) | (1 << 40) | (1 << 9) | (1 << 11));
        assert_eq!(r.fpu, signal::initial_fpu());
        // The handler clobbers the i386 registers; its restorer pops the
        // return address and calls rt_sigreturn.
        for g in &mut r.gprs[..7] {
            *g = 0xdead;
        }
        r.rsp = frame + 4;
        assert_eq!(e.call("rt_sigreturn", &[]), Action::SigReturn);
        sigreturn32(&mut e, &mut r).unwrap();
        assert_eq!(r, before);
        assert_eq!(e.t.sigmask, (1 << 2) | (1 << 40));
        assert_eq!(deliver(&mut e, &mut r), Delivery::Nothing);
    }

    #[test]
    fn a_plain_handler_gets_sigframe_ia32_and_sigreturn_restores_the_split_mask() {
        let mut e = Env::new(Abi::I386);
        install32(&mut e, SIGUSR1, sa::RESTORER as u32, 0);
        e.t.sigmask = (1 << 3) | (1 << 35);
        e.t.pending = 1 << (SIGUSR1 - 1);
        let before = regs32(&e);
        let mut r = before.clone();
        assert_eq!(deliver(&mut e, &mut r), Delivery::Handler(10));
        let frame = r.rsp;
        assert_eq!((frame + 4) % 16, 0);
        assert_eq!(r.gprs[0], 10, "eax = signal");
        assert_eq!((r.gprs[3], r.gprs[2]), (0, 0), "edx, ecx = 0");
        assert_eq!(u32_at(&mut e, frame), RESTORER as u32);
        assert_eq!(u32_at(&mut e, frame + 4), 10, "sig");
        let sc = frame + OLD_SC;
        assert_eq!(u32_at(&mut e, sc + EIP), before.rip as u32);
        assert_eq!(u32_at(&mut e, sc + EAX), before.gprs[0] as u32);
        assert_eq!(u32_at(&mut e, sc + CS), u32::from(gdt::USER_CODE32));
        assert_eq!(u32_at(&mut e, sc + OLDMASK), 1 << 3, "the mask's low word");
        assert_eq!(
            u32_at(&mut e, frame + 720),
            1 << 3,
            "extramask: its high word"
        );
        // popl %eax; movl $119, %eax; int $0x80.
        assert_eq!(
            e.peek(frame + 724, 8),
            [0x58, 0xb8, 119, 0, 0, 0, 0xcd, 0x80]
        );
        let fp = u64::from(u32_at(&mut e, sc + FPSTATE));
        assert!((frame + 732..frame + 732 + 16).contains(&fp));
        check_fpstate(&mut e, fp, &before);
        // The restorer pops the return address and the signal number.
        for g in &mut r.gprs[..7] {
            *g = 0xdead;
        }
        r.rsp = frame + 8;
        assert_eq!(e.call("sigreturn", &[]), Action::OldSigReturn);
        old_sigreturn32(&mut e, &mut r).unwrap();
        assert_eq!(r, before);
        assert_eq!(e.t.sigmask, (1 << 3) | (1 << 35));
    }

    #[test]
    fn sigreturn_folds_the_fnsave_header_into_the_fpu_state() {
        let mut e = Env::new(Abi::I386);
        install32(&mut e, SIGUSR1, (sa::SIGINFO | sa::RESTORER) as u32, 0);
        e.t.pending = 1 << (SIGUSR1 - 1);
        let before = regs32(&e);
        let mut r = before.clone();
        assert_eq!(deliver(&mut e, &mut r), Delivery::Handler(10));
        let fp = u64::from(u32_at(&mut e, r.rsp + RT_SC + FPSTATE));
        // The handler changes the control word and empties every register
        // in the legacy part: the legacy part wins, as on Linux.
        e.poke(fp, &0xffff_027fu32.to_le_bytes());
        e.poke(fp + 8, &0xffff_ffffu32.to_le_bytes());
        r.rsp += 4;
        sigreturn32(&mut e, &mut r).unwrap();
        assert_eq!(r.fpu[0..2], [0x7f, 0x02]);
        assert_eq!(r.fpu[4], 0, "abridged tag: all empty");
        assert_eq!(r.fpu[24..28], before.fpu[24..28], "MXCSR from the image");
        assert_eq!(r.fpu[160], 0xab);
    }

    #[test]
    fn the_alternate_stack_nodefer_and_resethand() {
        let mut e = Env::new(Abi::I386);
        let alt = SCRATCH + 0x2000;
        let ss = Stack32 {
            ss_sp: alt as u32,
            ss_flags: 0,
            ss_size: 0x4000,
        };
        e.poke(SCRATCH, &ss.to_bytes());
        assert_eq!(e.ret("sigaltstack", &[SCRATCH, 0]), 0);
        let flags = sa::SIGINFO | sa::RESTORER | sa::ONSTACK | sa::NODEFER | sa::RESETHAND;
        install32(&mut e, SIGUSR1, flags as u32, 0);
        e.t.pending = 1 << (SIGUSR1 - 1);
        let mut r = regs32(&e);
        assert_eq!(deliver(&mut e, &mut r), Delivery::Handler(10));
        assert!((alt..alt + 0x4000).contains(&r.rsp));
        assert_eq!((r.rsp + 4) % 16, 0);
        assert_eq!(e.t.sigmask, 0, "SA_NODEFER");
        assert_eq!(e.p.signals.actions[9].handler, 0, "SA_RESETHAND");
        let uc = r.rsp + RT_UC;
        assert_eq!(u64::from(u32_at(&mut e, uc + 8)), alt, "uc_stack.ss_sp");
        assert_eq!(u32_at(&mut e, uc + 12), 0, "not on it when the signal came");
        assert_eq!(u32_at(&mut e, uc + 16), 0x4000);
        // A nested one lands below, and its uc_stack says SS_ONSTACK.
        let first = r.rsp;
        install32(&mut e, SIGUSR1, flags as u32, 0);
        e.t.pending = 1 << (SIGUSR1 - 1);
        assert_eq!(deliver(&mut e, &mut r), Delivery::Handler(10));
        assert!(r.rsp < first && r.rsp >= alt);
        assert_eq!(u32_at(&mut e, r.rsp + RT_UC + 12), 1);
        // rt_sigreturn back to the first handler keeps the stack.
        r.rsp += 4;
        sigreturn32(&mut e, &mut r).unwrap();
        assert_eq!(e.t.altstack.sp, alt);
        assert_eq!(e.t.altstack.size, 0x4000);
    }

    #[test]
    fn a_fault_gives_trapno_err_cr2_and_si_addr() {
        let mut e = Env::new(Abi::I386);
        install32(&mut e, 11, (sa::SIGINFO | sa::RESTORER) as u32, 0);
        let fault = FaultInfo {
            code: 1,
            addr: 0x10,
            trapno: 14,
            err: 6,
            cr2: 0x10,
        };
        let mut r = regs32(&e);
        let d = signal::deliver_fault(&mut e.m, &mut e.p, &mut e.t, &mut r, SIGSEGV, fault);
        assert_eq!(d, Delivery::Handler(11));
        let info = r.rsp + RT_INFO;
        assert_eq!(u32_at(&mut e, info + 8), 1, "SEGV_MAPERR");
        assert_eq!(u32_at(&mut e, info + 12), 0x10, "si_addr");
        let sc = r.rsp + RT_SC;
        assert_eq!(u32_at(&mut e, sc + TRAPNO), 14);
        assert_eq!(u32_at(&mut e, sc + ERR), 6);
        assert_eq!(u32_at(&mut e, sc + CR2), 0x10);
        let d = signal::deliver_fault(&mut e.m, &mut e.p, &mut e.t, &mut r, SIGSEGV, fault);
        assert!(matches!(d, Delivery::Kill { signal: 11, .. }), "blocked");
    }

    #[test]
    fn no_restorer_or_no_room_ends_the_process() {
        let mut e = Env::new(Abi::I386);
        install32(&mut e, SIGUSR1, sa::SIGINFO as u32, 0);
        e.t.pending = 1 << (SIGUSR1 - 1);
        let mut r = regs32(&e);
        assert!(matches!(
            deliver(&mut e, &mut r),
            Delivery::Kill { signal: 10, reason } if reason.contains("SA_RESTORER")
        ));
        install32(&mut e, SIGUSR1, sa::RESTORER as u32, 0);
        e.t.pending = 1 << (SIGUSR1 - 1);
        r.rsp = 0x2000;
        assert!(matches!(
            deliver(&mut e, &mut r),
            Delivery::Kill { signal: 11, .. }
        ));
    }

    #[test]
    fn forged_frames_end_the_process_with_a_reason() {
        let top = 0xffff_e000u32;
        for (rt, off, value, what) in [
            (true, EIP, top, "outside user space"),
            (false, EIP, 0xffff_f000, "outside user space"),
            (true, ESP, 0xffff_fff0, "stack outside user space"),
            (true, CS, u32::from(gdt::KERNEL_CODE), "selector"),
            (false, CS, u32::from(gdt::USER_CODE64), "selector"),
            (true, SS, u32::from(gdt::KERNEL_DATA), "selector"),
            (true, SS, 0, "selector"),
            (false, DS, u32::from(gdt::KERNEL_DATA), "selector"),
            (true, ES, u32::from(gdt::TSS), "selector"),
            (true, FS, u32::from(gdt::USER_CODE32), "selector"),
            (true, GS, 0x7b, "selector"),
        ] {
            let mut e = Env::new(Abi::I386);
            let flags = if rt { sa::SIGINFO } else { 0 } | sa::RESTORER;
            install32(&mut e, SIGUSR1, flags as u32, 0);
            e.t.pending = 1 << (SIGUSR1 - 1);
            let mut r = regs32(&e);
            assert_eq!(deliver(&mut e, &mut r), Delivery::Handler(10));
            let sc = r.rsp + if rt { RT_SC } else { OLD_SC };
            e.poke(sc + off, &value.to_le_bytes());
            r.rsp += if rt { 4 } else { 8 };
            let before = (r.clone(), e.t.sigmask);
            let err = if rt {
                sigreturn32(&mut e, &mut r)
            } else {
                old_sigreturn32(&mut e, &mut r)
            }
            .unwrap_err();
            assert!(err.contains(what), "sigcontext + {off}: {err}");
            assert_eq!((r, e.t.sigmask), before, "nothing restored");
        }
        // Reserved MXCSR bits in the FXSAVE part.
        let mut e = Env::new(Abi::I386);
        install32(&mut e, SIGUSR1, sa::RESTORER as u32, 0);
        e.t.pending = 1 << (SIGUSR1 - 1);
        let mut r = regs32(&e);
        assert_eq!(deliver(&mut e, &mut r), Delivery::Handler(10));
        let fp = u64::from(u32_at(&mut e, r.rsp + OLD_SC + FPSTATE));
        e.poke(fp + 112 + 24, &0x0001_1f80u32.to_le_bytes());
        r.rsp += 8;
        let err = old_sigreturn32(&mut e, &mut r).unwrap_err();
        assert!(err.contains("FPU"), "{err}");
        // No frame at all; and no 119 for a 64-bit process.
        let mut r = regs32(&e);
        r.rsp = BAD;
        assert!(sigreturn32(&mut e, &mut r).is_err());
        assert!(old_sigreturn32(&mut e, &mut r).is_err());
        let mut e = Env::new(Abi::X86_64);
        let mut r = e.regs();
        assert!(
            old_sigreturn32(&mut e, &mut r)
                .unwrap_err()
                .contains("64-bit")
        );
    }
}
