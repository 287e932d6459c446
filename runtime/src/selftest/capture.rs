//! Exact registers and saved user frames captured by NMIs in built-in programs.

use core::sync::atomic::Ordering;

use super::*;

/// Runs `s` while recording NMIs in `mode`; returns the task id and the captures.
pub(super) fn run_recorded(
    s: TaskSpec,
    mode: Mode,
) -> Result<(u8, heapless::Vec<nmi::NmiCapture, { recorder::SLOTS }>), Why> {
    let id = match task::spawn(s) {
        Ok(id) => id,
        Err(e) => fail!("spawn: {e:?}"),
    };
    record_until_exit(id, s.name, mode)
}

/// Runs every process while recording NMIs in `mode`; process `id` must
/// exit with status 0. Returns the captures.
pub(super) fn record_until_exit(
    id: u8,
    name: &str,
    mode: Mode,
) -> Result<(u8, heapless::Vec<nmi::NmiCapture, { recorder::SLOTS }>), Why> {
    record_until_exit_per_task(id, name, mode, 0)
}

/// As [`record_until_exit`], keeping at most `per_task` captures of any
/// one task (0: no limit).
pub(super) fn record_until_exit_per_task(
    id: u8,
    name: &str,
    mode: Mode,
    per_task: u32,
) -> Result<(u8, heapless::Vec<nmi::NmiCapture, { recorder::SLOTS }>), Why> {
    recorder::start_per_task(mode, WANT_CAPTURES, SPIN_BUDGET, per_task);
    crate::dispatch::run_until(|| false);
    let (n, overflow) = recorder::stop();
    let t = task::get(id).map(|t| t.state);
    ensure!(t == Some(TaskState::Exited(0)), "{name}: state {t:?}");
    let mut caps = heapless::Vec::new();
    for i in 0..n {
        if let Some(c) = recorder::get(i) {
            let _ = caps.push(c);
        }
    }
    ensure!(
        caps.len() >= WANT_CAPTURES as usize || overflow > 0,
        "only {} NMIs landed in {mode:?} (budget ran out)",
        caps.len()
    );
    Ok((id, caps))
}

pub(super) fn compare(
    what: &str,
    regs: &TrapFrame,
    want: &[(usize, u64)],
    mask: u64,
) -> TestResult {
    let got = regs.gprs();
    for &(i, w) in want {
        ensure!(
            got[i] & mask == w & mask,
            "{what}: {} = {:#x}, want {w:#x}",
            arch_x86::frame::GPR_NAMES[i],
            got[i]
        );
    }
    Ok(())
}

pub(super) fn exact_regs_user64() -> TestResult {
    let s = spec("regs64", Abi::X64, user::perch_st_regs64);
    let (id, caps) = run_recorded(s, Mode::User64)?;
    let loop_range =
        user::addr(user::perch_st_regs64_loop)..user::addr(user::perch_st_regs64_loop_end);
    let want: [(usize, u64); 15] = core::array::from_fn(|i| (i, pattern64(i)));
    let mut exact = 0;
    for c in &caps {
        let r = &c.interrupted;
        ensure!(c.task == Some(id), "capture without the task");
        ensure!(r.cs == u64::from(gdt::USER_CODE64), "cs {:#x}", r.cs);
        ensure!(
            c.user_state == UserFrameState::Complete,
            "user frame {:?}",
            c.user_state
        );
        if loop_range.contains(&r.rip) {
            compare("user64", r, &want, u64::MAX)?;
            ensure!(r.rsp == user::PATTERN_RSP64, "rsp {:#x}", r.rsp);
            ensure!(r.ss == u64::from(gdt::USER_DATA), "ss {:#x}", r.ss);
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

pub(super) fn compat_r8_r15() -> [u64; 15] {
    core::array::from_fn(|i| if i >= 7 { pattern64(i) } else { 0 })
}

pub(super) fn exact_regs_compat() -> TestResult {
    let mut s = spec("regs32", Abi::Compat32, user::perch_st_regs32);
    s.gprs = compat_r8_r15();
    let (id, caps) = run_recorded(s, Mode::UserCompat)?;
    let loop_range =
        user::addr(user::perch_st_regs32_loop)..user::addr(user::perch_st_regs32_loop_end);
    let low: [(usize, u64); 7] = core::array::from_fn(|i| (i, pattern32(i)));
    let high: [(usize, u64); 8] = core::array::from_fn(|i| (i + 7, pattern64(i + 7)));
    let mut exact = 0;
    for c in &caps {
        let r = &c.interrupted;
        ensure!(c.task == Some(id), "capture without the task");
        ensure!(r.cs == u64::from(gdt::USER_CODE32), "cs {:#x}", r.cs);
        if loop_range.contains(&r.rip) {
            compare("compat", r, &low, 0xffff_ffff)?;
            compare("compat r8-r15", r, &high, u64::MAX)?;
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

/// Checks the saved user frames seen by NMIs that hit the runtime during a system call.
pub(super) fn check_in_syscall(
    caps: &[nmi::NmiCapture],
    id: u8,
    want: &[(usize, u64)],
    mask: u64,
    ret: u64,
    cs: u16,
    vector: u64,
) -> TestResult {
    let mut complete = 0;
    let mut in_window = 0;
    for c in caps {
        ensure!(
            c.mode == Mode::Kernel && c.task == Some(id),
            "capture {:?}/{:?}",
            c.mode,
            c.task
        );
        match c.user_state {
            UserFrameState::InWindow => in_window += 1,
            UserFrameState::NoTask => fail!("capture with no task"),
            UserFrameState::Complete => {
                let u = &c.user_regs;
                compare("saved frame", u, want, mask)?;
                ensure!(u.rip == ret, "saved rip {:#x}, want {ret:#x}", u.rip);
                ensure!(u.cs == u64::from(cs), "saved cs {:#x}", u.cs);
                ensure!(u.ss == u64::from(gdt::USER_DATA), "saved ss {:#x}", u.ss);
                ensure!(u.vector == vector, "saved vector {:#x}", u.vector);
                complete += 1;
            }
        }
    }
    ensure!(complete > 0, "no complete frame ({in_window} in a window)");
    Ok(())
}

pub(super) fn spin_in_syscall64() -> TestResult {
    let s = spec("spin64", Abi::X64, user::perch_st_spin64);
    let (id, caps) = run_recorded(s, Mode::Kernel)?;
    let ret = user::addr(user::perch_st_spin64_ret);
    let mut want: heapless::Vec<(usize, u64), 15> = [1, 3, 4, 6, 7, 8, 9, 11, 12, 13, 14]
        .into_iter()
        .map(|i| (i, pattern64(i)))
        .collect();
    let _ = want.push((0, syscall::SYS_SPIN));
    let _ = want.push((5, user::SPIN_ARG));
    // SYSCALL puts the return RIP in rcx.
    let _ = want.push((2, ret));
    check_in_syscall(
        &caps,
        id,
        &want,
        u64::MAX,
        ret,
        gdt::USER_CODE64,
        SYSCALL_VECTOR,
    )?;
    for c in &caps {
        if c.user_state == UserFrameState::Complete {
            let u = &c.user_regs;
            ensure!(
                u.r11 == u.rflags,
                "r11 {:#x} != rflags {:#x}",
                u.r11,
                u.rflags
            );
            ensure!(u.rsp == user::PATTERN_RSP64, "saved rsp {:#x}", u.rsp);
        }
    }
    Ok(())
}

pub(super) fn spin_in_int80() -> TestResult {
    let mut s = spec("spin32", Abi::Compat32, user::perch_st_spin32);
    s.gprs = compat_r8_r15();
    let (id, caps) = run_recorded(s, Mode::Kernel)?;
    let ret = user::addr(user::perch_st_spin32_ret);
    let mut want: heapless::Vec<(usize, u64), 15> = (2..=6).map(|i| (i, pattern32(i))).collect();
    let _ = want.push((0, syscall::SYS_SPIN));
    let _ = want.push((1, user::SPIN_ARG));
    check_in_syscall(
        &caps,
        id,
        &want,
        0xffff_ffff,
        ret,
        gdt::USER_CODE32,
        INT80_VECTOR,
    )?;
    let high: [(usize, u64); 8] = core::array::from_fn(|i| (i + 7, pattern64(i + 7)));
    for c in &caps {
        if c.user_state == UserFrameState::Complete {
            compare("saved frame r8-r15", &c.user_regs, &high, u64::MAX)?;
            ensure!(
                c.user_regs.rsp as u32 == user::PATTERN_ESP32,
                "saved esp {:#x}",
                c.user_regs.rsp
            );
        }
    }
    Ok(())
}

/// Every CPU runs a spinning task of its own, each with registers of its
/// own, while the clock's NMIs reach every CPU and sampling is on: each
/// CPU's captures name its own task and hold exactly that task's
/// registers, every CPU has some; each CPU's ring holds only samples that
/// name that CPU and its task, and every ring's counts add up. With one
/// CPU there is nothing to tell apart.
pub(super) fn exact_regs_per_cpu() -> TestResult {
    let max = (recorder::SLOTS as u32 / WANT_CAPTURES).min(8);
    let cpus = crate::smp::online().min(max);
    if cpus < 2 {
        return Ok(());
    }
    let tag = |c: u32| 0x0101_0101_0101_0101u64.wrapping_mul(u64::from(c) + 1);
    let regs = |c: u32| -> [u64; 15] { core::array::from_fn(|i| pattern64(i) ^ tag(c)) };
    let mut ids: heapless::Vec<u8, 8> = heapless::Vec::new();
    for c in 0..cpus {
        let mut s = spec("cpu_spin", Abi::X64, user::perch_st_cpu_spin);
        s.gprs = regs(c);
        let id = match task::spawn(s) {
            Ok(id) => id,
            Err(e) => fail!("spawn for CPU {c}: {e:?}"),
        };
        task::pin(id, c as u8);
        let _ = ids.push(id);
    }
    profile::take_queued(|_, _| {});
    // A quota per task: CPUs whose task starts first (a host that gives
    // the vCPUs unequal time) cannot take every capture before the last
    // CPU's task has run.
    recorder::start_per_task(
        Mode::User64,
        WANT_CAPTURES * cpus,
        SPIN_BUDGET,
        WANT_CAPTURES,
    );
    profile::start();
    crate::sample::clock::deliver_to_every_cpu(true);
    for c in 1..cpus {
        crate::smp::kick(c);
    }
    // CPU 0 runs its own task to its end (the recorder has what it wants,
    // or the shared budget ran out); then the others are told to end
    // theirs, as a budget that one CPU took to zero does not end the rest.
    crate::dispatch::run_until(|| false);
    crate::cpu::with_user_access(|| recorder::user_stop().store(1, Ordering::Relaxed));
    let ended = |id: u8| !matches!(task::get(id).map(|t| t.state), Some(TaskState::Ready));
    let deadline = cpu::rdtsc() + crate::time::tsc_hz() * 20;
    while !ids.iter().all(|&id| ended(id)) && cpu::rdtsc() < deadline {
        core::hint::spin_loop();
    }
    crate::sample::clock::deliver_to_every_cpu(false);
    profile::stop();
    let (n, _) = recorder::stop();
    // Each ring: its own CPU's samples only, of that CPU's task while it
    // ran one (or of no task), and exact counts.
    let mut samples = [0u32; 8];
    let mut wrong: Option<(u32, u32, u32)> = None;
    profile::take_queued(|cpu, r| {
        if let sampler::drain::NmiRecord::Sample(raw) = r {
            let own = ids.get(cpu as usize).map(|&id| u32::from(id) + 1);
            if raw.cpu != cpu || (raw.tid != 0 && Some(raw.tid) != own) {
                wrong.get_or_insert((cpu, raw.cpu, raw.tid));
            } else if Some(raw.tid) == own {
                samples[cpu as usize % 8] += 1;
            }
        }
    });
    if let Some((ring, cpu, tid)) = wrong {
        fail!("CPU {ring}'s ring holds a sample of CPU {cpu}, tid {tid}");
    }
    for (c, s) in profile::every_cpu() {
        let st = s.ring.stats();
        ensure!(
            st.taken == st.delivered + st.lost,
            "CPU {c}'s ring: {} taken, {} delivered, {} lost",
            st.taken,
            st.delivered,
            st.lost
        );
    }
    for c in 0..cpus {
        ensure!(
            samples[c as usize] > 0,
            "no sample of CPU {c}'s task in its ring"
        );
    }
    for (c, &id) in ids.iter().enumerate() {
        let state = task::get(id).map(|t| t.state);
        ensure!(
            state == Some(TaskState::Exited(0)),
            "CPU {c}'s task: state {state:?}"
        );
    }
    let loop_range =
        user::addr(user::perch_st_cpu_spin_loop)..user::addr(user::perch_st_cpu_spin_loop_end);
    let mut exact = [0u32; 8];
    for i in 0..n {
        let Some(cap) = recorder::get(i) else {
            continue;
        };
        let c = cap.cpu;
        ensure!(c < cpus, "a capture on CPU {c}, which ran no task");
        ensure!(
            cap.task == Some(ids[c as usize]),
            "CPU {c}: a capture of task {:?}, not its own {}",
            cap.task,
            ids[c as usize]
        );
        if loop_range.contains(&cap.interrupted.rip) {
            let want: [(usize, u64); 15] = core::array::from_fn(|i| (i, regs(c)[i]));
            let mut what: heapless::String<16> = heapless::String::new();
            let _ = write!(what, "CPU {c}");
            compare(&what, &cap.interrupted, &want, u64::MAX)?;
            exact[c as usize] += 1;
        }
    }
    for c in 0..cpus {
        ensure!(
            exact[c as usize] > 0,
            "no NMI landed in CPU {c}'s spin loop ({n} captures)"
        );
    }
    Ok(())
}
