//! Programs started through the ELF loader: address spaces, EFAULT, exact registers, saved user frames.

use super::*;

/// A minimal static ELF (ET_EXEC) for a loaded self-test program: its code
/// at `user::LOADED_CODE` (read, execute) and a data page at
/// `user::LOADED_DATA` (read, write; three pages) whose first word is `counter`.
pub(super) fn tiny_elf(compat: bool, code: &[u8], counter: u64) -> alloc::vec::Vec<u8> {
    let code_off = (user::LOADED_CODE - 0x40_0000) as usize;
    let data_off = (user::LOADED_DATA - 0x40_0000) as usize;
    let mut f = alloc::vec![0u8; data_off + 16];
    let put = |f: &mut [u8], at: usize, v: u64, n: usize| {
        f[at..at + n].copy_from_slice(&v.to_le_bytes()[..n]);
    };
    f[..4].copy_from_slice(b"\x7fELF");
    f[4] = if compat { 1 } else { 2 };
    f[5] = 1; // little-endian
    f[6] = 1; // EV_CURRENT
    put(&mut f, 16, 2, 2); // ET_EXEC
    put(&mut f, 18, if compat { 3 } else { 62 }, 2); // EM_386 / EM_X86_64
    put(&mut f, 20, 1, 4);
    // Header and program-header sizes, offsets of the fields after e_entry.
    let (ehsize, phentsize, w) = if compat { (52, 32, 4) } else { (64, 56, 8) };
    put(&mut f, 24, user::LOADED_CODE, w);
    put(&mut f, 24 + w, ehsize as u64, w); // e_phoff
    let rest = 24 + 3 * w + 4; // after e_shoff and e_flags
    put(&mut f, rest, ehsize as u64, 2);
    put(&mut f, rest + 2, phentsize as u64, 2);
    put(&mut f, rest + 4, 2, 2); // e_phnum
    let segs = [
        (
            0u64,
            0x40_0000u64,
            (code_off + code.len()) as u64,
            (code_off + code.len()) as u64,
            5u64,
        ),
        (data_off as u64, user::LOADED_DATA, 16, 0x3000, 6),
    ];
    for (k, (off, va, filesz, memsz, flags)) in segs.into_iter().enumerate() {
        let p = ehsize + k * phentsize;
        put(&mut f, p, 1, 4); // PT_LOAD
        if compat {
            put(&mut f, p + 4, off, 4);
            put(&mut f, p + 8, va, 4);
            put(&mut f, p + 12, va, 4);
            put(&mut f, p + 16, filesz, 4);
            put(&mut f, p + 20, memsz, 4);
            put(&mut f, p + 24, flags, 4);
            put(&mut f, p + 28, 0x1000, 4);
        } else {
            put(&mut f, p + 4, flags, 4);
            put(&mut f, p + 8, off, 8);
            put(&mut f, p + 16, va, 8);
            put(&mut f, p + 24, va, 8);
            put(&mut f, p + 32, filesz, 8);
            put(&mut f, p + 40, memsz, 8);
            put(&mut f, p + 48, 0x1000, 8);
        }
    }
    f[code_off..code_off + code.len()].copy_from_slice(code);
    put(&mut f, data_off, counter, 8);
    f
}

/// Starts a loaded self-test program through the program loader.
pub(super) fn start_loaded(
    name: &str,
    compat: bool,
    prog: user::LoadedCode,
    counter: u64,
) -> Result<u8, Why> {
    let elf: &'static [u8] =
        alloc::boxed::Box::leak(tiny_elf(compat, prog.code, counter).into_boxed_slice());
    let spec = kcore::manifest::ProcessSpec::new(name, "/selftest");
    match crate::abi::linux::start(&spec, elf) {
        Ok(s) => Ok(s.id),
        Err(e) => fail!("loader refused {name}: {e}"),
    }
}

/// Runs a loaded program while recording NMIs in `mode`.
pub(super) fn run_loaded_recorded(
    name: &str,
    compat: bool,
    prog: user::LoadedCode,
    counter: u64,
    mode: Mode,
) -> Result<(u8, heapless::Vec<nmi::NmiCapture, { recorder::SLOTS }>), Why> {
    let id = start_loaded(name, compat, prog, counter)?;
    record_until_exit(id, name, mode)
}

/// Two loaded programs linked at the same address run side by side, each
/// in its own address space: each keeps the value its own data page
/// started with across yields, a system call handed a runtime pointer
/// returns EFAULT to it, and their pages are freed when they end.
pub(super) fn loaded_address_spaces() -> TestResult {
    let a = start_loaded("space_a", false, user::loaded_space64(), 7)?;
    let b = start_loaded("space_b", false, user::loaded_space64(), 9)?;
    crate::dispatch::run_until(|| false);
    let (sa, sb) = (task::get(a).map(|t| t.state), task::get(b).map(|t| t.state));
    ensure!(
        sa == Some(TaskState::Exited(7)) && sb == Some(TaskState::Exited(9)),
        "exit states {sa:?} and {sb:?} (want 7 and 9; +100 means no EFAULT)"
    );
    // An ended process's pages are freed at once.
    for (id, name) in [(a, "space_a"), (b, "space_b")] {
        let e = task::with_space(id, |s| s.entry(user::LOADED_DATA)).unwrap_or(0);
        ensure!(
            e & pg::PRESENT == 0,
            "{name} ended but its data page is still mapped ({e:#x})"
        );
    }
    Ok(())
}

pub(super) fn loaded_exact_regs64() -> TestResult {
    let prog = user::loaded_regs64();
    let (id, caps) = run_loaded_recorded("ld_regs64", false, prog, 20_000_000, Mode::User64)?;
    let lo = user::LOADED_CODE + prog.marks.0;
    let hi = user::LOADED_CODE + prog.marks.1;
    let want: [(usize, u64); 15] = core::array::from_fn(|i| (i, pattern64(i)));
    let mut exact = 0;
    for c in &caps {
        let r = &c.interrupted;
        ensure!(c.task == Some(id), "capture without the process");
        ensure!(r.cs == u64::from(gdt::USER_CODE64), "cs {:#x}", r.cs);
        if (lo..hi).contains(&r.rip) {
            compare("loaded user64", r, &want, u64::MAX)?;
            ensure!(r.rsp == user::PATTERN_RSP64, "rsp {:#x}", r.rsp);
            ensure!(
                c.user_regs == *r,
                "user_regs differ from the interrupted frame"
            );
            exact += 1;
        }
    }
    ensure!(
        exact > 0,
        "no NMI landed in the spin loop ({} captures)",
        caps.len()
    );
    Ok(())
}

/// Register exactness per thread: the two threads of `ld_threads64` spin
/// with different patterns in every GPR, and every NMI that lands in a
/// thread's spin loop shows that thread's own registers and its own task,
/// never the other's.
pub(super) fn loaded_thread_regs64() -> TestResult {
    let (prog, child) = user::loaded_threads64();
    // Both threads share one CPU in slices of several clock periods: at
    // most half the log goes to either, so the second thread's captures
    // find room however long the first one runs before it.
    let id = start_loaded("ld_threads64", false, prog, 10_000_000)?;
    let half = (recorder::SLOTS / 2) as u32;
    let (id, caps) = record_until_exit_per_task(id, "ld_threads64", Mode::User64, half)?;
    let first = user::LOADED_CODE + prog.marks.0..user::LOADED_CODE + prog.marks.1;
    let second = user::LOADED_CODE + child.0..user::LOADED_CODE + child.1;
    let want_first: [(usize, u64); 15] = core::array::from_fn(|i| (i, pattern64(i)));
    let want_second: [(usize, u64); 15] = core::array::from_fn(|i| (i, user::second_pattern64(i)));
    let (mut in_first, mut in_second) = (0, 0);
    let mut second_task = None;
    for c in &caps {
        let r = &c.interrupted;
        if first.contains(&r.rip) {
            ensure!(
                c.task == Some(id),
                "first thread's loop under task {:?}",
                c.task
            );
            compare("first thread", r, &want_first, u64::MAX)?;
            ensure!(
                r.rsp == user::PATTERN_RSP64,
                "first thread's rsp {:#x}",
                r.rsp
            );
            in_first += 1;
        } else if second.contains(&r.rip) {
            ensure!(
                c.task.is_some() && c.task != Some(id),
                "second thread's loop under task {:?} (the first is {id})",
                c.task
            );
            ensure!(
                second_task.is_none() || second_task == c.task,
                "second thread's loop under tasks {second_task:?} and {:?}",
                c.task
            );
            second_task = c.task;
            compare("second thread", r, &want_second, u64::MAX)?;
            ensure!(
                r.rsp == !user::PATTERN_RSP64,
                "second thread's rsp {:#x}",
                r.rsp
            );
            in_second += 1;
        } else {
            continue;
        }
        ensure!(
            c.user_regs == *r,
            "user_regs differ from the interrupted frame"
        );
    }
    ensure!(
        in_first > 0 && in_second > 0,
        "NMIs in the spin loops: {in_first} of the first thread, {in_second} of the second ({} captures)",
        caps.len()
    );
    Ok(())
}

pub(super) fn loaded_exact_regs32() -> TestResult {
    let prog = user::loaded_regs32();
    let (id, caps) = run_loaded_recorded("ld_regs32", true, prog, 20_000_000, Mode::UserCompat)?;
    let lo = user::LOADED_CODE + prog.marks.0;
    let hi = user::LOADED_CODE + prog.marks.1;
    let low: [(usize, u64); 7] = core::array::from_fn(|i| (i, pattern32(i)));
    let high: [(usize, u64); 8] = core::array::from_fn(|i| (i + 7, 0));
    let mut exact = 0;
    for c in &caps {
        let r = &c.interrupted;
        ensure!(c.task == Some(id), "capture without the process");
        ensure!(r.cs == u64::from(gdt::USER_CODE32), "cs {:#x}", r.cs);
        if (lo..hi).contains(&r.rip) {
            compare("loaded compat", r, &low, 0xffff_ffff)?;
            compare("loaded compat r8-r15", r, &high, u64::MAX)?;
            ensure!(r.rsp as u32 == user::PATTERN_ESP32, "esp {:#x}", r.rsp);
            exact += 1;
        }
    }
    ensure!(
        exact > 0,
        "no NMI landed in the spin loop ({} captures)",
        caps.len()
    );
    Ok(())
}

pub(super) fn loaded_syscall_frame64() -> TestResult {
    let prog = user::loaded_sys64();
    let (id, caps) = run_loaded_recorded("ld_sys64", false, prog, 20_000, Mode::Kernel)?;
    let ret = user::LOADED_CODE + prog.marks.0;
    let mut want: heapless::Vec<(usize, u64), 15> = [1, 6, 7, 8, 9, 11, 12, 13, 14]
        .into_iter()
        .map(|i| (i, pattern64(i)))
        .collect();
    // SYSCALL puts the return RIP in rcx; rax is the number (getrandom),
    // rdi, rsi, rdx its arguments.
    let _ = want.push((2, ret));
    let _ = want.push((0, 318));
    let _ = want.push((5, user::LOADED_DATA + 0x1000));
    let _ = want.push((4, 4096));
    let _ = want.push((3, 0));
    check_in_syscall(
        &caps,
        id,
        &want,
        u64::MAX,
        ret,
        gdt::USER_CODE64,
        SYSCALL_VECTOR,
    )?;
    for c in caps
        .iter()
        .filter(|c| c.user_state == UserFrameState::Complete)
    {
        let u = &c.user_regs;
        ensure!(
            u.r11 == u.rflags,
            "r11 {:#x} != rflags {:#x}",
            u.r11,
            u.rflags
        );
        ensure!(u.rsp == user::PATTERN_RSP64, "saved rsp {:#x}", u.rsp);
    }
    Ok(())
}

pub(super) fn loaded_int80_frame32() -> TestResult {
    let prog = user::loaded_sys32();
    let (id, caps) = run_loaded_recorded("ld_sys32", true, prog, 20_000, Mode::Kernel)?;
    let ret = user::LOADED_CODE + prog.marks.0;
    let mut want: heapless::Vec<(usize, u64), 15> = (4..=6).map(|i| (i, pattern32(i))).collect();
    // eax is the number (getrandom), ebx, ecx, edx its arguments.
    let _ = want.push((0, 355));
    let _ = want.push((1, user::LOADED_DATA + 0x1000));
    let _ = want.push((2, 4096));
    let _ = want.push((3, 0));
    check_in_syscall(
        &caps,
        id,
        &want,
        0xffff_ffff,
        ret,
        gdt::USER_CODE32,
        INT80_VECTOR,
    )?;
    for c in caps
        .iter()
        .filter(|c| c.user_state == UserFrameState::Complete)
    {
        ensure!(
            c.user_regs.rsp as u32 == user::PATTERN_ESP32,
            "saved esp {:#x}",
            c.user_regs.rsp
        );
    }
    Ok(())
}

/// `uregs=return` through the sampling path (NMI, ring, expansion): NMIs
/// that land in the runtime while `ld_sys64` loops on `getrandom` of 4 KiB
/// get the registers of its return from the system call, which differ
/// from the frame saved at entry: rax is the result (4096) where the entry
/// frame holds the number (318). rcx and rip are the return address, r11
/// the flags, the other registers the program's patterns and arguments.
/// Every sample of the run is either exact so, or ABI_NONE, or (taken
/// while the runtime started the process) the entry point's frame; some
/// are exact.
pub(super) fn loaded_return_to_user_regs() -> TestResult {
    use sampler::drain::NmiRecord;
    use sampler::regs::{Abi, Reg};
    if cpu_pmu_sampling() {
        kprintln!(
            "selftest: loaded_return_to_user_regs: skipped (the PMU samples, not the NMI clock)"
        );
        return Ok(());
    }
    profile::take_queued(|_, _| {});
    profile::set_user_regs_at_return(true);
    let event = profile::event();
    let started = start_loaded("ld_ret64", false, user::loaded_sys64(), 20_000);
    if started.is_ok() {
        profile::start();
        crate::dispatch::run_until(|| false);
        profile::stop();
    }
    profile::set_user_regs_at_return(false);
    let id = started?;
    ensure!(
        event.user_regs_mode == sampler::event::UserRegsMode::AtReturnToUser,
        "the event does not say return-to-user mode"
    );
    let ret = user::LOADED_CODE + user::loaded_sys64().marks.0;
    // `TrapFrame::gprs` order: AX..BP as perf numbers them, then R8-R15.
    let order: heapless::Vec<Reg, 15> = sampler::regs::ALL_REGS[..7]
        .iter()
        .chain(&sampler::regs::ALL_REGS[16..])
        .copied()
        .collect();
    let mut want: [Option<u64>; 15] = core::array::from_fn(|i| Some(pattern64(i)));
    want[0] = Some(4096);
    want[2] = Some(ret);
    want[3] = Some(0);
    want[4] = Some(4096);
    want[5] = Some(user::LOADED_DATA + 0x1000);
    want[10] = None;
    let (mut exact, mut none, mut user_mode, mut first) = (0u32, 0u32, 0u32, 0u32);
    let mut bad: Option<(Reg, u64, u64)> = None;
    let mut bad_abi = None;
    profile::take_queued(|_, r| {
        let NmiRecord::Sample(raw) = r else { return };
        let s = raw.expand(&event);
        if s.pid != u32::from(id) + 1 {
            return;
        }
        if s.cpumode != sampler::sample::CpuMode::Kernel {
            user_mode += 1;
            return;
        }
        let Some(u) = s.regs_user.as_ref() else {
            bad_abi = Some(Abi::None);
            return;
        };
        match u.abi {
            Abi::None => none += 1,
            Abi::Bits64 => {
                let get = |reg: Reg| u.get(reg).unwrap_or(u64::MAX);
                if get(Reg::Ip) == user::LOADED_CODE {
                    // Taken while the runtime started the process: its
                    // first return to user mode is to the entry point.
                    first += 1;
                    return;
                }
                for (i, reg) in order.iter().enumerate() {
                    if let Some(w) = want[i]
                        && get(*reg) != w
                    {
                        bad.get_or_insert((*reg, get(*reg), w));
                    }
                }
                for (reg, w) in [
                    (Reg::Ip, ret),
                    (Reg::Sp, user::PATTERN_RSP64),
                    (Reg::R11, get(Reg::Flags)),
                ] {
                    if get(reg) != w {
                        bad.get_or_insert((reg, get(reg), w));
                    }
                }
                exact += 1;
            }
            other => bad_abi = Some(other),
        }
    });
    ensure!(bad_abi.is_none(), "a runtime sample with ABI {bad_abi:?}");
    if let Some((reg, got, w)) = bad {
        fail!("return-to-user sample: {reg:?} = {got:#x}, want {w:#x}");
    }
    ensure!(
        exact > 0,
        "no runtime sample got the return frame ({none} ABI_NONE, {first} at the entry, {user_mode} in user mode)"
    );
    Ok(())
}
