//! Signal delivery for 64-bit processes: the frame a handler gets, the
//! way back through `rt_sigreturn`, the alternate stack, and forged frames.

use super::*;
use crate::sys::signal::{self, Delivery, FaultInfo, UserRegs, sa};
use crate::sys::uapi::Sigaction64;

const HANDLER: u64 = TEXT + 0x100;
const RESTORER: u64 = TEXT + 0x200;
const SIGUSR1: u64 = 10;
const SIGUSR2: u64 = 12;
const SIGSEGV: u8 = 11;

fn install(e: &mut Env, sig: u64, flags: u64, mask: u64) {
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
        (15, 0xffff_ffff_8000_0000, "stack outside user space"),
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
        crate::sys::interrupt_wait(&mut e.sys, &mut e.t);
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
        crate::sys::interrupt_wait(&mut e.sys, &mut e.t);
        e.t.pending |= 1 << (SIGUSR1 - 1);
        let mut r3 = before.clone();
        assert_eq!(deliver(&mut e, &mut r3), Delivery::Handler(10));
        r3.rsp += 8;
        signal::sigreturn(&mut e.m, &mut e.p, &mut e.t, &mut r3).unwrap();
        assert_eq!(r3, before);
        assert_eq!(e.t.restart, None);
    }
}
