//! Loaded Linux programs: the hardware side of `kcore::sys`. Demand paging
//! through the process's memory areas, the [`Machine`] the system calls use
//! (checked user copies, page rights, console lines, clocks, TLS), the
//! system-call and page-fault entry points, and starting a program from the
//! boot archive (ELF plan, memory areas, initial stack, first frame).

use crate::entry::{LEAVE, RESUME};
use crate::mm::space::AddressSpace;
use crate::mm::user::{self, Access, Pager};
use crate::proc::{self as task, Outcome, TaskSpec, TaskState};
use alloc::boxed::Box;
use alloc::vec::Vec;
use arch_x86::frame::TrapFrame;
use arch_x86::paging::{self as pg, PAGE, PRESENT, phys_to_virt, user_leaf_flags};
use core::cell::RefCell;
use core::sync::atomic::{AtomicU64, Ordering};
use critical_section::Mutex;
use kcore::sys::restart as signal_restart;
use kcore::sys::signal::{self, Delivery, UserRegs};
use kcore::sys::sigwait;
use kcore::sys::{
    self, Action, Area, AreaKind, AreaSet, Backing, Errno, FileData, LineEnd, Machine, Prot,
    Stream, System, TlsEntry,
};

/// The state all loaded programs share: the file system and the
/// unknown-call counts.
static SYSTEM: Mutex<RefCell<Option<System>>> = Mutex::new(RefCell::new(None));

/// Sets up the shared state for a run.
pub fn set_system(s: System) {
    critical_section::with(|cs| *SYSTEM.borrow_ref_mut(cs) = Some(s));
}

/// Runs `f` on the shared state (`None` before [`set_system`]).
pub fn with_system<R>(f: impl FnOnce(&mut System) -> R) -> Option<R> {
    critical_section::with(|cs| SYSTEM.borrow_ref_mut(cs).as_mut().map(f))
}

/// The run's unknown system calls for the End record, most frequent first.
pub fn unknown_for_end()
-> heapless::Vec<sampler::wire::UnknownSyscall, { sampler::wire::MAX_UNKNOWN_SYSCALLS }> {
    let mut list = with_system(|s| s.unknown.list()).unwrap_or_default();
    list.sort_by_key(|u| core::cmp::Reverse(u.3));
    list.iter()
        .take(sampler::wire::MAX_UNKNOWN_SYSCALLS)
        .map(|&(abi, nr, _, count)| sampler::wire::UnknownSyscall {
            abi: match abi {
                sys::Abi::X86_64 => 64,
                sys::Abi::I386 => 32,
            },
            nr: u32::try_from(nr).unwrap_or(u32::MAX),
            count,
        })
        .collect()
}

/// Page rights for an area's protection: x86 pages are readable once
/// present, so PROT_NONE pages stay present but supervisor-only (their
/// content survives an `mprotect` back to access).
fn page_flags(prot: Prot) -> u64 {
    let nx = crate::mm::nx();
    if !prot.readable() && !prot.writable() && !prot.executable() {
        let mut f = PRESENT;
        if nx {
            f |= arch_x86::paging::NO_EXECUTE;
        }
        return f;
    }
    user_leaf_flags(prot.writable(), prot.executable(), nx)
}

/// Demand paging through a process's memory areas.
pub struct AreaPager<'a> {
    /// The process's areas.
    pub areas: &'a AreaSet,
    /// The process's lowest present stack page (see [`task::Process::stack_low`]):
    /// a stack page below it is brought in with every page up to it.
    pub stack_low: &'a mut u64,
}

impl Pager for AreaPager<'_> {
    fn fault_in(&mut self, space: &mut AddressSpace, page: u64, access: Access) -> bool {
        let Some(area) = self.areas.find(page) else {
            return false;
        };
        let allowed = match access {
            Access::Read => area.prot.readable() || area.prot.executable(),
            Access::Write => area.prot.writable(),
            Access::Fill => true,
        };
        if !allowed {
            return false;
        }
        let e = space.entry(page);
        if e & PRESENT != 0 {
            // Present already: a write to a page shared since `fork` gets
            // its own copy; anything else is a rights problem.
            return access != Access::Read
                && e & pg::COW != 0
                && space.break_cow(page, area.prot.writable());
        }
        if area.kind == AreaKind::Stack && page < *self.stack_low {
            // Keep the stack's present pages contiguous up to the top.
            let mut p = (*self.stack_low).min(area.end);
            while p > page {
                p -= PAGE;
                if space.entry(p) & PRESENT == 0 && !populate(space, area, p) {
                    return false;
                }
                *self.stack_low = p;
            }
            return true;
        }
        populate(space, area, page)
    }
}

/// Maps a new frame at `page` holding the area's content for it.
fn populate(space: &mut AddressSpace, area: &Area, page: u64) -> bool {
    let Ok(frame) = space.map_zeroed(page, page_flags(area.prot)) else {
        return false;
    };
    if let Backing::File { .. } = area.backing {
        // SAFETY: `frame` was just allocated and mapped for this page only;
        // the direct map covers it and nothing else refers to it yet.
        let buf = unsafe { &mut *(phys_to_virt(frame) as *mut [u8; PAGE as usize]) };
        area.fill_page(page, buf);
    }
    true
}

/// Where a process's output goes: `[NAME] line` on the console.
fn print_line(name: &str, stream: Stream, line: &[u8], end: LineEnd) {
    let tag = match stream {
        Stream::Stdout => "",
        Stream::Stderr => ":err",
    };
    crate::kprint!("[{name}{tag}] ");
    crate::console::write_bytes(line);
    crate::kprintln!();
    if end == LineEnd::Partial {
        crate::kprintln!("perch: {name}: output did not end with a newline");
    }
}

/// The runtime side of one process's system calls.
pub struct RtMachine<'a> {
    /// The calling thread's process.
    proc: u8,
    space: &'a mut AddressSpace,
    segs: &'a mut crate::cpu::UserSegments,
    stack_low: &'a mut u64,
    stack_top: u64,
    name: &'static str,
}

impl RtMachine<'_> {
    /// A change to pages of `[start, end)`: when it touches the stack the
    /// NMI walk's present range shrinks to what lies above it.
    fn stack_changed(&mut self, start: u64, end: u64) {
        if end > *self.stack_low && start < self.stack_top {
            *self.stack_low = end.min(self.stack_top).max(*self.stack_low);
        }
    }

    /// The task of thread `tid` of the calling process, while it lives
    /// (`ESRCH` otherwise).
    fn thread_of(&self, tid: u32) -> Result<(u8, task::Task), Errno> {
        self.any_thread(tid)
            .filter(|(_, t)| t.proc == self.proc)
            .ok_or(Errno::ESRCH)
    }

    /// The live thread `tid` of any process of the run.
    fn any_thread(&self, tid: u32) -> Option<(u8, task::Task)> {
        let id = tid.checked_sub(1).and_then(|i| u8::try_from(i).ok())?;
        task::get(id)
            .filter(|t| t.linux && !t.state.ended())
            .map(|t| (id, t))
    }
}

impl Machine for RtMachine<'_> {
    fn read_user(&mut self, areas: &AreaSet, addr: u64, buf: &mut [u8]) -> Result<(), Errno> {
        let stack_low = &mut *self.stack_low;
        user::read(self.space, &mut AreaPager { areas, stack_low }, addr, buf)
            .map_err(|_| Errno::EFAULT)
    }

    fn write_user(&mut self, areas: &AreaSet, addr: u64, buf: &[u8]) -> Result<(), Errno> {
        let stack_low = &mut *self.stack_low;
        user::write(
            self.space,
            &mut AreaPager { areas, stack_low },
            addr,
            buf,
            Access::Write,
        )
        .map_err(|_| Errno::EFAULT)
    }

    fn discard_pages(&mut self, start: u64, end: u64) {
        self.stack_changed(start, end);
        task::hide_window();
        self.space.unmap_range(start, end);
    }

    fn protect_pages(&mut self, start: u64, end: u64, prot: Prot) {
        self.stack_changed(start, end);
        let flags = page_flags(prot);
        self.space.update_range(start, end, |_| flags);
    }

    fn console_line(&mut self, stream: Stream, line: &[u8], end: LineEnd) {
        print_line(self.name, stream, line, end);
    }

    fn monotonic_ns(&mut self) -> u64 {
        crate::time::now_ns()
    }

    fn realtime_ns(&mut self) -> u64 {
        crate::time::realtime_ns()
    }

    fn random_bytes(&mut self, buf: &mut [u8]) {
        crate::time::random_bytes(buf);
    }

    fn online_cpus(&self) -> u32 {
        crate::smp::online()
    }

    fn current_cpu(&self) -> u32 {
        crate::cpu::this().index
    }

    fn affinity(&self, tid: u32) -> Result<u64, Errno> {
        Ok(self.any_thread(tid).ok_or(Errno::ESRCH)?.1.affinity)
    }

    fn set_affinity(&mut self, tid: u32, mask: u64) -> Result<bool, Errno> {
        let (id, _) = self.any_thread(tid).ok_or(Errno::ESRCH)?;
        let moved = task::set_affinity(id, mask).ok_or(Errno::ESRCH)?;
        // The caller leaves a CPU it may no longer run on before it returns.
        Ok(moved && task::current() == Some(id))
    }

    fn wake_thread(&mut self, tid: u32) {
        if let Some(id) = tid.checked_sub(1).and_then(|i| u8::try_from(i).ok()) {
            task::wake(id, 0);
        }
    }

    fn itimer_real(&mut self, set: Option<(u64, u64)>) -> (u64, u64) {
        let i = self.proc as usize;
        let now = crate::time::now_ns();
        let at = ALARM_AT[i].load(Ordering::Relaxed);
        let old = (
            if at == 0 {
                0
            } else {
                at.saturating_sub(now).max(1)
            },
            ALARM_EVERY[i].load(Ordering::Relaxed),
        );
        if let Some((value, interval)) = set {
            let at = if value == 0 {
                0
            } else {
                now.saturating_add(value)
            };
            ALARM_AT[i].store(at, Ordering::Relaxed);
            ALARM_EVERY[i].store(if at == 0 { 0 } else { interval }, Ordering::Relaxed);
            recompute_next_alarm();
        }
        old
    }

    fn signal_thread(&mut self, tid: u32, sig: u8) -> Result<bool, Errno> {
        let (id, _) = self.thread_of(tid)?;
        if sig == 0 || u32::from(sig) > 64 {
            return Ok(false);
        }
        Ok(task::post_signal(
            id,
            1 << (sig - 1),
            Errno::EINTR.to_return(),
        ))
    }

    fn signal_process(&mut self, pid: u32, sig: u8) -> Option<u32> {
        let proc = u8::try_from(pid.checked_sub(1)?).ok()?;
        if sig == 0 || u32::from(sig) > 64 {
            return None;
        }
        post_to_process(proc, 1 << (sig - 1)).map(|id| u32::from(id) + 1)
    }

    fn set_fs_base(&mut self, base: u64) {
        self.segs.fs_base = base;
        crate::cpu::load_user_segments(self.segs);
    }

    fn set_tls(&mut self, tls: &[Option<TlsEntry>; 3]) {
        self.segs.tls = tls_descriptors(tls);
        for (i, &d) in self.segs.tls.iter().enumerate() {
            crate::cpu::set_tls_slot(i, d);
        }
    }
}

/// The GDT descriptors of a thread's TLS slots (0 for an empty one).
fn tls_descriptors(tls: &[Option<TlsEntry>; 3]) -> [u64; 3] {
    tls.map(|t| {
        t.map_or(0, |t| {
            arch_x86::gdt::UserSegment {
                base: t.base,
                limit: t.limit,
                seg_32bit: t.seg_32bit,
                contents: t.contents,
                read_exec_only: t.read_exec_only,
                limit_in_pages: t.limit_in_pages,
                seg_not_present: t.seg_not_present,
                useable: t.useable,
            }
            .descriptor()
        })
    })
}

/// Set while a loaded program's system call runs in the personality: an
/// NMI that sees it interrupted a call's body, where the process's saved
/// user frame is the one its entry saved (the self-test's recorder reads it).
pub static IN_CALL: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// Handles a system call of a loaded program (its personality is `Some`).
/// Returns the entry stub's RESUME or LEAVE.
pub fn syscall(frame: &mut TrapFrame, id: u8, abi: task::Abi) -> u64 {
    let (sys_abi, nr, args) = match abi {
        task::Abi::X64 => (
            sys::Abi::X86_64,
            frame.rax,
            [
                frame.rdi, frame.rsi, frame.rdx, frame.r10, frame.r8, frame.r9,
            ],
        ),
        task::Abi::Compat32 => (
            sys::Abi::I386,
            frame.rax,
            [
                frame.rbx, frame.rcx, frame.rdx, frame.rsi, frame.rdi, frame.rbp,
            ],
        ),
    };
    let mut renamed = None;
    let action = with_machine(id, |m, p, t| {
        IN_CALL.store(true, core::sync::atomic::Ordering::Relaxed);
        let mut a = with_system(|s| sys::syscall(m, s, p, t, sys_abi, nr, args))
            .unwrap_or(Action::Return(Errno::ENOSYS.to_return()));
        IN_CALL.store(false, core::sync::atomic::Ordering::Relaxed);
        t.pending |= task::take_posted(id);
        task::set_blocked(id, t.sigmask);
        if t.renamed {
            t.renamed = false;
            renamed = Some(t.comm);
        }
        // A thread with a signal to take does not start to wait: the call
        // is interrupted, and the handler runs on the way out.
        if matches!(
            a,
            Action::Block | Action::Sleep { .. } | Action::Wait { .. }
        ) && signal::deliverable(p, t) != 0
        {
            // A blocking send that queued part of its data says how much.
            let sent = with_system(|s| {
                s.futex.cancel(t.tid);
                sys::interrupt_wait(s, t)
            })
            .flatten();
            a = Action::Return(sent.unwrap_or(Errno::EINTR.to_return()));
        }
        if matches!(a, Action::Exit(_) | Action::Kill { .. }) {
            p.flush_output(m);
        }
        a
    })
    .unwrap_or(Action::Return(Errno::ENOSYS.to_return()));
    poll_net_if_dirty();
    // Pages of a stack may have gone (munmap, madvise, brk).
    task::republish_window(id);
    if let Some(comm) = renamed {
        task::rename(id, comm);
    }
    let ret = |frame: &mut TrapFrame, v: u64| {
        frame.rax = match abi {
            task::Abi::X64 => v,
            task::Abi::Compat32 => v & 0xffff_ffff,
        };
        signals_on_return(id, frame)
    };
    match action {
        Action::Return(v) => ret(frame, v),
        Action::SigReturn => sigreturn(id, frame, true),
        Action::OldSigReturn => sigreturn(id, frame, false),
        Action::Clone(args) => {
            let v = match clone_thread(id, frame, &args) {
                Ok(tid) => u64::from(tid),
                Err(e) => e.to_return(),
            };
            ret(frame, v)
        }
        Action::Fork(args) => match fork_process(id, frame, &args) {
            // vfork: the parent waits until the child execs or ends (its
            // pid is the call's result then).
            Ok(pid) if args.flags & sys::clone_flags::VFORK != 0 => {
                frame.rax = u64::from(pid);
                task::vfork_wait(id, (pid - 1) as u8);
                task::set_outcome(Outcome::Block);
                LEAVE
            }
            Ok(pid) => ret(frame, u64::from(pid)),
            Err(e) => ret(frame, e.to_return()),
        },
        Action::Exec(e) => exec_process(id, frame, &e),
        Action::ExitThread(status) => {
            task::set_outcome(Outcome::ThreadExit(i64::from(status)));
            LEAVE
        }
        Action::Exit(status) => {
            task::set_outcome(Outcome::Exit(i64::from(status)));
            LEAVE
        }
        Action::Kill { signal, reason } => {
            set_kill_reason(id, reason);
            task::set_outcome(Outcome::Signal(signal));
            LEAVE
        }
        Action::Yield => {
            frame.rax = 0;
            task::set_outcome(Outcome::Yield);
            LEAVE
        }
        Action::Sleep { until_ns, then } => {
            frame.rax = then;
            task::set_outcome(Outcome::Sleep(crate::time::ns_to_tsc_deadline(until_ns)));
            LEAVE
        }
        Action::Block => {
            task::set_outcome(Outcome::Block);
            LEAVE
        }
        Action::Wait { until_ns } => {
            // The packets the call itself sent may have made its socket
            // ready already (a loopback connect): then it runs again at
            // once and makes the call again, rather than wait for a wake
            // that came.
            if still_waits(id) {
                task::set_outcome(wait_outcome(until_ns));
            } else {
                task::set_outcome(Outcome::Yield);
            }
            LEAVE
        }
    }
}

/// Whether thread `id` is still listed as waiting on a file (a wake takes
/// it off the list).
fn still_waits(id: u8) -> bool {
    with_system(|s| s.waits.contains(u32::from(id) + 1)).unwrap_or(true)
}

/// How a thread waits for a file: until woken, or until a deadline too.
fn wait_outcome(until_ns: Option<u64>) -> Outcome {
    match until_ns {
        Some(ns) => Outcome::Sleep(crate::time::ns_to_tsc_deadline(ns)),
        None => Outcome::Block,
    }
}

/// Before thread `id` runs again: when it waits for a file (it was woken,
/// or its deadline passed), its call is made again ([`sys::resume`]) and
/// either returns (the value goes to its saved `rax`) or waits once more
/// (the outcome). A signal it can take ends the wait with `EINTR`; the
/// handler then runs from [`signals_before_run`].
pub fn resume_wait(id: u8) -> Option<Outcome> {
    // A call woken by its own packets (see `syscall`) is made again.
    for _ in 0..8 {
        match resume_once(id) {
            Some(Outcome::Block | Outcome::Sleep(_)) if !still_waits(id) => continue,
            o => return o,
        }
    }
    resume_once(id)
}

fn resume_once(id: u8) -> Option<Outcome> {
    let (action, wide) = with_machine(id, |m, p, t| {
        t.wait?;
        t.pending |= task::take_posted(id);
        let wide = p.abi == sys::Abi::X86_64;
        if signal::deliverable(p, t) != 0 {
            let sent = with_system(|s| sys::interrupt_wait(s, t)).flatten();
            let v = sent.unwrap_or(Errno::EINTR.to_return());
            return Some((Action::Return(v), wide));
        }
        let a = with_system(|s| sys::resume(m, s, p, t)).flatten()?;
        // A wait with its own mask that returned has the old one back.
        task::set_blocked(id, t.sigmask);
        if matches!(a, Action::Exit(_) | Action::Kill { .. }) {
            p.flush_output(m);
        }
        Some((a, wide))
    })
    .flatten()?;
    poll_net_if_dirty();
    match action {
        Action::Return(v) => {
            task::with_saved_frame(id, |f| {
                f.rax = if wide { v } else { v & 0xffff_ffff };
            });
            None
        }
        Action::Wait { until_ns } => Some(wait_outcome(until_ns)),
        Action::Kill { signal, reason } => {
            set_kill_reason(id, reason);
            Some(Outcome::Signal(signal))
        }
        Action::Exit(status) => Some(Outcome::Exit(i64::from(status))),
        // The calls that wait on files answer nothing else.
        _ => None,
    }
}

/// The user registers of `frame` and the CPU's x87/SSE state (live: the
/// thread is in a system call or an interrupt of its own).
fn regs_of(frame: &TrapFrame) -> UserRegs {
    let mut fpu = crate::cpu::FpuState::initial();
    fpu.save();
    let (fs, gs) = crate::cpu::saved_selectors();
    UserRegs {
        gprs: frame.gprs(),
        rip: frame.rip,
        rsp: frame.rsp,
        rflags: frame.rflags,
        fpu: fpu.0,
        seg: selectors(frame, fs, gs),
    }
}

/// The selectors of a thread whose user frame is `frame` and whose FS and
/// GS are `fs` and `gs` (DS and ES are live: the runtime never switches
/// them; the kernel data selector the boot left there reads as null, what
/// the first return to ring 3 made of it).
fn selectors(frame: &TrapFrame, fs: u16, gs: u16) -> signal::Selectors {
    let user = |s: u16| if s & 3 == 3 { s } else { 0 };
    let (ds, es) = crate::cpu::data_selectors();
    let (ds, es) = (user(ds), user(es));
    signal::Selectors {
        cs: frame.cs as u16,
        ss: frame.ss as u16,
        ds,
        es,
        fs,
        gs,
    }
}

/// Puts `r` back into `frame` and the CPU. A compat process's selectors
/// are those kcore left (an ia32 handler's entry or sigreturn: the
/// process's own user code and stack selectors, data selectors it may
/// load); a 64-bit process's stay.
fn put_regs(frame: &mut TrapFrame, segs: &mut crate::cpu::UserSegments, r: &UserRegs) {
    frame.set_gprs(&r.gprs);
    frame.rip = r.rip;
    frame.rsp = r.rsp;
    frame.rflags = r.rflags | 0x202;
    put_selectors(frame, segs, &r.seg);
    crate::cpu::FpuState(r.fpu).restore();
}

/// A compat process's selectors from `seg` into `frame` and the CPU
/// (FS and GS also into `segs`, what the thread switches with).
fn put_selectors(
    frame: &mut TrapFrame,
    segs: &mut crate::cpu::UserSegments,
    seg: &signal::Selectors,
) {
    // An ia32 frame's entry or sigreturn leaves the user 32-bit code
    // selector (whatever mode the thread was in); kcore checked SS: the
    // user data selector or a TLS slot (which `syscall` checks again).
    if seg.cs != arch_x86::gdt::USER_CODE32 || seg.ss & 3 != 3 {
        return;
    }
    frame.cs = u64::from(seg.cs);
    frame.ss = u64::from(seg.ss);
    crate::cpu::reload_user_selectors([seg.ds, seg.es, seg.fs, seg.gs], &segs.tls);
    (segs.fs, segs.gs) = crate::cpu::saved_selectors();
}

/// On a thread's way back to user mode (`frame` about to be restored,
/// its FPU state live): runs the handler of the next signal it can take,
/// or ends the process when that signal's action says so. Returns the
/// entry stub's RESUME or LEAVE.
pub fn signals_on_return(id: u8, frame: &mut TrapFrame) -> u64 {
    let d = with_machine(id, |m, p, t| {
        t.pending |= task::take_posted(id);
        if t.sigwait.is_some() {
            // An rt_sigtimedwait that a signal kept from waiting.
            sigwait::finish(m, p, t, &mut frame.rax);
        }
        let d = if signal::deliverable(p, t) == 0 {
            Delivery::Nothing
        } else {
            let mut regs = regs_of(frame);
            let d = signal::deliver(m, p, t, &mut regs);
            if let Delivery::Handler(_) = d {
                put_regs(frame, m.segs, &regs);
            }
            d
        };
        if t.interrupted.is_some() {
            // A call no handler ran for: restarted or EINTR by its kind.
            signal_restart::finish(t, p.abi, &mut frame.rax, &mut frame.rip, None);
        }
        task::set_blocked(id, t.sigmask);
        d
    });
    match d {
        Some(Delivery::Kill { signal, reason }) => {
            set_kill_reason(id, reason);
            task::set_outcome(Outcome::Signal(signal));
            LEAVE
        }
        _ => RESUME,
    }
}

/// Before the scheduler resumes thread `id` (its registers in its saved
/// frame and FPU state): runs the handler of a signal it can take now, so
/// a signal that interrupted its wait is handled before the wait returns.
/// Returns the outcome that ends it instead, if the signal's action says so.
pub fn signals_before_run(id: u8) -> Option<Outcome> {
    let d = with_machine_fpu(id, |m, p, t, fpu| {
        t.pending |= task::take_posted(id);
        if signal::deliverable(p, t) == 0 && t.interrupted.is_none() && t.sigwait.is_none() {
            return Delivery::Nothing;
        }
        task::with_saved_frame(id, |frame| {
            // Not running: its FS and GS are the saved ones.
            let mut regs = UserRegs {
                gprs: frame.gprs(),
                rip: frame.rip,
                rsp: frame.rsp,
                rflags: frame.rflags,
                fpu: fpu.0,
                seg: selectors(frame, m.segs.fs, m.segs.gs),
            };
            // An rt_sigtimedwait takes its signal before any handler runs.
            sigwait::finish(m, p, t, &mut regs.gprs[0]);
            let d = if signal::deliverable(p, t) != 0 {
                signal::deliver(m, p, t, &mut regs)
            } else {
                Delivery::Nothing
            };
            // The wait it leaves ends (a handler, if one runs, has seen to it).
            let waited = t.interrupted.is_some();
            signal_restart::finish(t, p.abi, &mut regs.gprs[0], &mut regs.rip, None);
            if matches!(d, Delivery::Handler(_)) || waited {
                frame.set_gprs(&regs.gprs);
                frame.rip = regs.rip;
                frame.rsp = regs.rsp;
                frame.rflags = regs.rflags | 0x202;
                fpu.0 = regs.fpu;
                // A handler's entry leaves FS and GS as they were (the
                // thread's saved ones, loaded when it runs): only CS, SS,
                // DS and ES change.
                let saved = (m.segs.fs, m.segs.gs);
                let (fs, gs) = crate::cpu::saved_selectors();
                put_selectors(frame, m.segs, &signal::Selectors { fs, gs, ..regs.seg });
                (m.segs.fs, m.segs.gs) = saved;
            }
            task::set_blocked(id, t.sigmask);
            d
        })
        .unwrap_or(Delivery::Nothing)
    })?;
    match d {
        Delivery::Kill { signal, reason } => {
            set_kill_reason(id, reason);
            Some(Outcome::Signal(signal))
        }
        _ => None,
    }
}

/// Each process's ITIMER_REAL: the monotonic ns it runs out at (0:
/// disarmed) and its interval, indexed by process.
static ALARM_AT: [AtomicU64; task::MAX_TASKS] = [const { AtomicU64::new(0) }; task::MAX_TASKS];
static ALARM_EVERY: [AtomicU64; task::MAX_TASKS] = [const { AtomicU64::new(0) }; task::MAX_TASKS];
/// The earliest armed ALARM_AT (u64::MAX: none), for the tick's test.
static NEXT_ALARM: AtomicU64 = AtomicU64::new(u64::MAX);

fn recompute_next_alarm() {
    let next = ALARM_AT
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .filter(|&a| a != 0)
        .min()
        .unwrap_or(u64::MAX);
    NEXT_ALARM.store(next, Ordering::Relaxed);
}

/// From the scheduler tick: sends SIGALRM to each process whose
/// ITIMER_REAL ran out (to a thread that does not block it, if any) and
/// re-arms it with its interval.
pub fn fire_timers(now_ns: u64) {
    if now_ns < NEXT_ALARM.load(Ordering::Relaxed) {
        return;
    }
    const SIGALRM: u64 = 1 << 13;
    for (proc, at) in ALARM_AT.iter().enumerate() {
        let due = at.load(Ordering::Relaxed);
        if due == 0 || now_ns < due {
            continue;
        }
        let every = ALARM_EVERY[proc].load(Ordering::Relaxed);
        at.store(
            if every == 0 {
                0
            } else {
                // Ticks the run missed are not sent in a burst.
                due + every * ((now_ns - due) / every + 1)
            },
            Ordering::Relaxed,
        );
        post_to_process(proc as u8, SIGALRM);
    }
    recompute_next_alarm();
}

/// Sends signal bit `bit` to process slot `proc`, as Linux picks the
/// thread for a process-directed signal: a live thread that does not block
/// it, else the first live one.
fn post_to_process(proc: u8, bit: u64) -> Option<u8> {
    let live: heapless::Vec<u8, { task::MAX_TASKS }> = task::threads_of(proc)
        .into_iter()
        .filter(|&t| task::get(t).is_some_and(|t| !t.state.ended()))
        .collect();
    let target = live
        .iter()
        .copied()
        .find(|&t| !task::blocks(t, bit))
        .or_else(|| live.first().copied());
    let t = target?;
    task::post_signal(t, bit, Errno::EINTR.to_return()).then_some(t)
}

/// A child of process `parent` ended: SIGCHLD goes to it when it has a
/// handler for it (its default action, and `SIG_IGN`, do nothing, and must
/// not interrupt the parent's waits).
fn tell_parent(parent: u32) {
    const SIGCHLD: usize = 17;
    let Some(proc) = parent.checked_sub(1).and_then(|p| u8::try_from(p).ok()) else {
        return;
    };
    let handled = task::threads_of(proc).into_iter().any(|t| {
        task::with_thread(t, |_, p| {
            p.linux
                .as_deref()
                .is_some_and(|l| l.signals.actions[SIGCHLD - 1].handler > 1)
        })
        .unwrap_or(false)
    });
    if handled {
        post_to_process(proc, 1 << (SIGCHLD - 1));
    }
}

/// True while some process has an armed interval timer.
pub fn timers_armed() -> bool {
    NEXT_ALARM.load(Ordering::Relaxed) != u64::MAX
        || with_system(|s| s.net.may_wake(crate::time::now_ns())).unwrap_or(false)
}

/// The sockets of `changes` changed (packets moved): their owners' epolls
/// hear of it and the threads of those processes waiting on files look
/// again.
pub fn net_changed(changes: &[sys::net::Change]) {
    if changes.is_empty() {
        return;
    }
    with_system(|s| {
        sys::net_changed(s, changes, |tid| {
            if let Some(id) = tid.checked_sub(1).and_then(|i| u8::try_from(i).ok()) {
                task::wake(id, 0);
            }
        });
    });
}

/// A call queued data or changed a connection: move the packets now, so
/// the answer does not wait for the next slice.
fn poll_net_if_dirty() {
    if with_system(|s| s.net.dirty).unwrap_or(false) {
        poll_net();
    }
}

/// Moves the packets of the run's sockets (the loopback, and the card
/// when there is one), answers DHCP and the echo service, and tells the
/// processes whose sockets changed. Cheap when nothing happened; never in
/// NMI context.
pub fn poll_net() {
    let now = crate::time::now_ns();
    let changes = with_system(|s| {
        let changes = crate::net::with_card(|card| s.net.poll(now, card));
        if let Some((iface, sockets)) = s.net.ext_mut() {
            crate::net::service(iface, sockets);
        }
        changes
    });
    if let Some(changes) = changes {
        net_changed(&changes);
    }
}

/// Whether signals were posted to thread `id` (a cheap test for the
/// returns from interrupts).
pub fn signals_posted(id: u8) -> bool {
    task::has_posted(id)
}

/// `rt_sigreturn` (or `rt` false: the i386 `sigreturn`): the registers,
/// FPU state, mask and alternate stack of the handler's frame, or the end
/// of the process for a frame it forged.
fn sigreturn(id: u8, frame: &mut TrapFrame, rt: bool) -> u64 {
    let r = with_machine(id, |m, p, t| {
        let mut regs = regs_of(frame);
        let r = if rt {
            signal::sigreturn(m, p, t, &mut regs)
        } else {
            signal::old_sigreturn(m, p, t, &mut regs)
        };
        if r.is_ok() {
            put_regs(frame, m.segs, &regs);
        }
        r
    });
    match r {
        Some(Ok(())) => signals_on_return(id, frame),
        Some(Err(reason)) => {
            set_kill_reason(id, reason);
            task::set_outcome(Outcome::Signal(11));
            LEAVE
        }
        None => RESUME,
    }
}

/// A ring-3 exception of a loaded program: its signal's handler runs when
/// one is installed and the signal is not blocked (RESUME); otherwise the
/// caller ends the process as before (`None`).
pub fn fault_to_handler(id: u8, frame: &mut TrapFrame, cr2: u64, mapped: bool) -> Option<u64> {
    let sig = fault_signal(frame.vector);
    // si_code: SEGV_MAPERR/ACCERR for page faults, SI_KERNEL for #GP,
    // FPE_INTDIV, ILL_ILLOPN, BUS_ADRALN, TRAP_BRKPT.
    let (code, addr) = match frame.vector {
        14 => (if mapped { 2 } else { 1 }, cr2),
        10..=13 => (0x80, 0),
        0 => (1, frame.rip),
        6 => (2, frame.rip),
        _ => (1, frame.rip),
    };
    let fault = signal::FaultInfo {
        code,
        addr,
        trapno: frame.vector,
        err: frame.error_code,
        cr2,
    };
    let d = with_machine(id, |m, p, t| {
        let mut regs = regs_of(frame);
        let d = signal::deliver_fault(m, p, t, &mut regs, sig, fault);
        if let Delivery::Handler(_) = d {
            put_regs(frame, m.segs, &regs);
        }
        task::set_blocked(id, t.sigmask);
        d
    })?;
    matches!(d, Delivery::Handler(_)).then_some(RESUME)
}

/// Why each process was killed by a signal it sent itself.
static KILL_REASONS: Mutex<RefCell<[&'static str; task::MAX_TASKS]>> =
    Mutex::new(RefCell::new([""; task::MAX_TASKS]));

fn set_kill_reason(id: u8, reason: &'static str) {
    let Some(proc) = task::get(id).map(|t| t.proc) else {
        return;
    };
    critical_section::with(|cs| {
        if let Some(r) = KILL_REASONS.borrow_ref_mut(cs).get_mut(proc as usize) {
            *r = reason;
        }
    });
}

fn kill_reason(id: u8) -> &'static str {
    let Some(proc) = task::get(id).map(|t| t.proc) else {
        return "";
    };
    critical_section::with(|cs| {
        KILL_REASONS
            .borrow_ref(cs)
            .get(proc as usize)
            .copied()
            .unwrap_or("")
    })
}

/// What a ring-3 page fault of a loaded program comes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageFault {
    /// The page was brought in: resume the program.
    Resolved,
    /// No area allows the access: SIGSEGV.
    Segv,
    /// The access is allowed but no frame is left: the process is killed
    /// (SIGKILL, as Linux's OOM killer does), never the runtime.
    OutOfMemory,
}

/// A page fault in ring 3 of a loaded program: brings the page in when its
/// area allows the access.
pub fn page_fault(id: u8, addr: u64, error_code: u64) -> PageFault {
    let page = addr & !(PAGE - 1);
    // Another thread of the process, on another CPU, brought the page in
    // (or widened its rights) since this fault was raised: the access
    // goes through when retried.
    let write = error_code & 2 != 0;
    let fetch = error_code & 0x10 != 0;
    let now = task::with_space(id, |s| s.entry(page)).unwrap_or(0);
    if now & (pg::PRESENT | pg::USER) == pg::PRESENT | pg::USER
        && (!write || now & pg::WRITABLE != 0)
        && (!fetch || now & pg::NO_EXECUTE == 0)
    {
        return PageFault::Resolved;
    }
    // Error code: bit 0 present (a rights violation, but for a write to a
    // page shared since `fork`), bit 1 write, bit 4 fetch.
    if error_code & 1 != 0 && !(write && now & pg::COW != 0) {
        return PageFault::Segv;
    }
    let access = if write { Access::Write } else { Access::Read };
    let fault = task::with_thread(id, |_, proc| {
        let task::Process {
            space,
            linux,
            stack_low,
        } = proc;
        let Some(p) = linux.as_deref() else {
            return PageFault::Segv;
        };
        let Some(area) = p.areas.find(page) else {
            return PageFault::Segv;
        };
        let allowed = match access {
            Access::Write => area.prot.writable(),
            _ if error_code & 0x10 != 0 => area.prot.executable(),
            _ => area.prot.readable() || area.prot.executable(),
        };
        if !allowed {
            return PageFault::Segv;
        }
        let mut pager = AreaPager {
            areas: &p.areas,
            stack_low,
        };
        if pager.fault_in(space, page, access) {
            PageFault::Resolved
        } else {
            PageFault::OutOfMemory
        }
    })
    .unwrap_or(PageFault::Segv);
    if fault == PageFault::Resolved {
        task::grow_window(id, page);
    }
    fault
}

/// Ends process `id` for want of memory (the trap handler leaves to the
/// scheduler next).
pub fn kill_out_of_memory(id: u8) {
    set_kill_reason(id, "out of memory (no free frame for a page it touched)");
    task::set_outcome(Outcome::Signal(9));
}

/// The signal a hardware fault delivers, as Linux maps the vectors.
pub fn fault_signal(vector: u64) -> u8 {
    match vector {
        0 | 16 | 19 => 8, // #DE, #MF, #XM: SIGFPE
        1 | 3 => 5,       // #DB, #BP: SIGTRAP
        6 => 4,           // #UD: SIGILL
        17 => 7,          // #AC: SIGBUS
        _ => 11,          // #GP, #PF, #SS, ...: SIGSEGV
    }
}

/// The `perch: NAME (pid P) ...` line for a process that ended.
pub fn report_end(id: u8, name: &str, state: &TaskState) {
    let pid = task::get(id).map_or(u32::from(id) + 1, |t| t.pid());
    match *state {
        TaskState::Exited(code) => {
            crate::kprintln!("perch: {name} (pid {pid}) exited with status {code}")
        }
        TaskState::Signaled(sig) => crate::kprintln!(
            "perch: {name} (pid {pid}) killed by {}: {}",
            sys::signal_name(sig),
            kill_reason(id)
        ),
        TaskState::Faulted(f) => {
            crate::kprint!(
                "perch: {name} (pid {pid}) killed by {}: {}",
                sys::signal_name(fault_signal(f.vector)),
                arch_x86::frame::exception_name(f.vector)
            );
            if f.vector == 14 {
                let what = if f.error_code & 0x10 != 0 {
                    "executing"
                } else if f.error_code & 2 != 0 {
                    "writing"
                } else {
                    "reading"
                };
                crate::kprint!(" {what} {:#x}", f.cr2);
            }
            crate::kprintln!(" at rip {:#x}", f.rip);
        }
        _ => {}
    }
}

/// What a loaded program leaves when it ends: its last partial output
/// line, the `perch: NAME (pid P) ...` line, and its memory and
/// system-call state, given back at once (files stay: they belong to the
/// run).
pub fn ended(id: u8, name: &str) {
    flush(id);
    let Some(t) = task::get(id) else {
        return;
    };
    // Its timer stops with it; a vfork parent goes on.
    ALARM_AT[t.proc as usize].store(0, Ordering::Relaxed);
    task::vfork_done(t.proc);
    recompute_next_alarm();
    report_end(id, name, &t.state);
    // None of its threads waits any more; its descriptors close, and its
    // sockets with them.
    let mut linux = task::with_thread(id, |_, p| p.linux.take()).flatten();
    let parent = with_system(|s| {
        for tid in task::threads_of(t.proc) {
            s.futex.cancel(u32::from(tid) + 1);
            s.waits.remove(u32::from(tid) + 1);
        }
        if let Some(p) = linux.as_deref_mut() {
            let status = match t.state {
                TaskState::Signaled(sig) => sys::procs::Status::Killed {
                    signal: sig,
                    core: false,
                },
                TaskState::Faulted(f) => sys::procs::Status::Killed {
                    signal: fault_signal(f.vector),
                    core: false,
                },
                TaskState::Exited(code) => sys::procs::Status::Exited(code as u8),
                _ => sys::procs::Status::Exited(0),
            };
            sys::process_ended(s, p, status, |tid| {
                if let Some(w) = tid.checked_sub(1).and_then(|i| u8::try_from(i).ok()) {
                    task::wake(w, 0);
                }
            })
        } else {
            None
        }
    })
    .flatten();
    if let Some(parent) = parent {
        tell_parent(parent);
    }
    poll_net_if_dirty();
    task::with_thread(id, |_, p| {
        p.space.clear_user();
    });
    drop(linux);
}

/// A sleeping thread's deadline passed: a futex wait it was in ends (its
/// system call returns the `-ETIMEDOUT` set when it began to wait).
pub fn timed_out(id: u8) {
    with_system(|s| s.futex.cancel(u32::from(id) + 1));
}

/// Makes the thread `clone` asked for: a task slot (its number + 1 is the
/// tid), the Linux thread state ([`sys::new_thread`]: TLS, tid words),
/// the parent's segments and FPU registers as they are now, and a copy of
/// the parent's user frame returning 0 on the new stack. Nothing is made
/// when any step fails; the error is the parent's `clone` result.
fn clone_thread(id: u8, frame: &TrapFrame, args: &sys::CloneArgs) -> Result<u32, Errno> {
    // A tid is never a zombie's pid.
    let held = with_system(|s| s.procs.zombie_mask()).unwrap_or(u64::MAX);
    let slot = task::free_slot_but(held).ok_or(Errno::EAGAIN)? as u8;
    let tid = u32::from(slot) + 1;
    let linux =
        with_machine(id, |m, p, t| sys::new_thread(m, p, t, args, tid)).ok_or(Errno::ESRCH)??;
    let (segs, fpu, child) = child_cpu_state(&linux, frame, args);
    let thread = Box::new(task::Thread {
        segs,
        fpu,
        linux: Some(Box::new(linux)),
        stack_top: Some((child.rsp + PAGE - 1) & !(PAGE - 1)),
        stack_low: 0,
    });
    if task::install_thread(id, slot, thread, &child).is_err() {
        // Undo the count `new_thread` made; the tid words it wrote name a
        // thread that never ran, as after Linux's failed clone.
        with_machine(id, |_, p, _| p.threads -= 1);
        return Err(Errno::EAGAIN);
    }
    Ok(tid)
}

/// What a new thread (of `clone` or `fork`) starts with on the CPU: the
/// caller's segment selectors with the TLS and FS base of `linux` (the new
/// thread's state), the caller's FPU registers as they are now, and the
/// caller's user frame `frame` returning 0, on `args.stack` when given.
fn child_cpu_state(
    linux: &sys::Thread,
    frame: &TrapFrame,
    args: &sys::CloneArgs,
) -> (
    crate::cpu::UserSegments,
    Box<crate::cpu::FpuState>,
    TrapFrame,
) {
    let (fs, gs) = crate::cpu::saved_selectors();
    let segs = crate::cpu::UserSegments {
        fs,
        gs,
        tls: tls_descriptors(&linux.tls),
        fs_base: linux.fs_base,
    };
    let mut fpu = Box::new(crate::cpu::FpuState::initial());
    fpu.save();
    let mut child = *frame;
    child.rax = 0;
    if args.stack != 0 {
        child.rsp = args.stack;
    }
    (segs, fpu, child)
}

/// `fork`: a new process, copy of the caller's (task `id`, whose user
/// frame is `frame`): its Linux state from [`sys::fork_child`], a copy of
/// its address space, its thread's segments and FPU state, and the frame
/// with 0 in `rax` (on `args.stack` when given). The tids `args` asks for
/// are written in the child's memory and the parent's. Its pid, or
/// `EAGAIN` when there is no slot or no memory.
fn fork_process(id: u8, frame: &TrapFrame, args: &sys::CloneArgs) -> Result<u32, Errno> {
    use sys::clone_flags as f;
    let held = with_system(|s| s.procs.zombie_mask()).unwrap_or(u64::MAX);
    let slot = task::free_slot_but(held).ok_or(Errno::EAGAIN)? as u8;
    let pid = u32::from(slot) + 1;
    let now = crate::time::now_ns();
    let (mut cp, ct) = with_machine(id, |_, p, t| {
        with_system(|s| sys::fork_child(s, p, t, args, pid, now))
    })
    .flatten()
    .ok_or(Errno::ESRCH)??;
    // Undoes the child's Linux state when it cannot be made.
    let undo = |cp: &mut sys::Process| {
        with_system(|s| {
            s.files.close_all(&mut cp.fds);
            s.procs.reap(pid);
        });
    };
    // CLONE_VM: the same memory (vfork, posix_spawn); else a copy on
    // write, but for shared mappings, whose every page the parent brings
    // in first so that both map it.
    let copied = task::with_thread(id, |_, proc| {
        let space = if args.flags & f::VM != 0 {
            Some(proc.space.share())
        } else {
            let areas = &cp.areas;
            let shared = |va: u64| areas.find(va).is_some_and(|a| a.kind == AreaKind::Shared);
            let mut filled = true;
            for a in areas.iter().filter(|a| a.kind == AreaKind::Shared) {
                let mut page = a.start;
                while filled && page < a.end {
                    filled =
                        proc.space.entry(page) & PRESENT != 0 || populate(&mut proc.space, a, page);
                    page += PAGE;
                }
            }
            if filled {
                proc.space.cow_copy(arch_x86::paging::USER_END, shared)
            } else {
                None
            }
        };
        space.map(|space| (space, proc.stack_low))
    })
    .flatten();
    let Some((mut space, mut stack_low)) = copied else {
        undo(&mut cp);
        return Err(Errno::EAGAIN);
    };
    let tid = pid.to_le_bytes();
    if args.flags & f::CHILD_SETTID != 0 {
        let pager = &mut AreaPager {
            areas: &cp.areas,
            stack_low: &mut stack_low,
        };
        // As Linux, a bad address is not the caller's error.
        let _ = user::write(&mut space, pager, args.child_tid, &tid, Access::Write);
    }
    if args.flags & f::PARENT_SETTID != 0 {
        let _ = with_machine(id, |m, p, _| m.write_user(&p.areas, args.parent_tid, &tid));
    }
    let (segs, fpu, child) = child_cpu_state(&ct, frame, args);
    let (stack_top, thread_low) =
        task::with_thread(id, |t, _| (t.stack_top, t.stack_low)).unwrap_or((None, 0));
    let thread = Box::new(task::Thread {
        segs,
        fpu,
        linux: Some(Box::new(ct)),
        stack_top,
        stack_low: thread_low,
    });
    let process = Box::new(task::Process {
        space,
        linux: Some(Box::new(cp)),
        stack_low,
    });
    set_program(slot, program_of(task::get(id).map_or(slot, |t| t.proc)));
    if task::install_forked(id, slot, process, thread, &child).is_err() {
        // The slot was free a moment ago, under the kernel lock: not
        // reached. The child's state goes with the boxes; its table entry
        // and descriptors go here.
        with_system(|s| s.procs.reap(pid));
        return Err(Errno::EAGAIN);
    }
    Ok(pid)
}

/// `execve` of thread `id` (user frame `frame`) that kcore checked as
/// `e`: the new program is loaded into a new address space first (a
/// failure there, such as no memory, is the caller's error and the old
/// program goes on); then the process's other threads end (while one still
/// runs on another CPU, the call is made again once it has left), the
/// process takes its new identity ([`sys::exec::exec_commit`]), the new
/// space replaces the old, and the thread leaves to the new program's
/// entry with the new stack, zeroed registers, initial FPU state and no
/// TLS. The next Task record names the new program.
fn exec_process(id: u8, frame: &mut TrapFrame, e: &sys::exec::Exec) -> u64 {
    let image = match load_image(e.data.clone(), &e.path, &e.argv, &e.envp, &e.execfn) {
        Ok(image) => image,
        Err(err) => {
            let errno = match err {
                StartError::Stack(_) => Errno::E2BIG,
                StartError::Elf(_) => Errno::ENOEXEC,
                StartError::Process(e) => e,
                StartError::NoMemory | StartError::NoSlot => Errno::ENOMEM,
            };
            frame.rax = errno.to_return();
            return signals_on_return(id, frame);
        }
    };
    let Some(proc) = task::get(id).map(|t| t.proc) else {
        return RESUME;
    };
    let others: heapless::Vec<u8, { task::MAX_TASKS }> = task::threads_of(proc)
        .into_iter()
        .filter(|&i| i != id)
        .collect();
    if !others.is_empty() {
        with_system(|s| {
            for &i in &others {
                s.futex.cancel(u32::from(i) + 1);
                s.waits.remove(u32::from(i) + 1);
            }
        });
        if task::end_other_threads(id) {
            // `syscall` and `int 0x80` are both two bytes; `rax` still
            // holds the call's number.
            frame.rip -= 2;
            task::set_outcome(Outcome::Yield);
            return LEAVE;
        }
    }
    let comm = with_machine(id, |_, p, t| {
        p.areas = image.areas;
        p.set_brk_start(image.brk_start);
        with_system(|s| {
            sys::exec::exec_commit(s, p, t, e, |tid| {
                if let Some(w) = tid.checked_sub(1).and_then(|i| u8::try_from(i).ok()) {
                    task::wake(w, 0);
                }
            });
        });
        p.comm
    });
    let Some(comm) = comm else {
        return RESUME;
    };
    set_program(proc, Some(image.program));
    ALARM_AT[usize::from(proc)].store(0, Ordering::Relaxed);
    // A vfork parent goes on once its child has its own memory.
    task::vfork_done(proc);
    let abi = task_abi(image.abi);
    let old = task::exec_replace(id, image.space, image.stack_low, abi, image.entry, comm);
    drop(old);
    let spec = TaskSpec {
        name: "",
        abi,
        entry: image.entry,
        gprs: [0; 15],
    };
    *frame = task::first_frame(&spec, image.sp);
    let user_data = arch_x86::gdt::USER_DATA;
    crate::cpu::reload_user_selectors([user_data, user_data, 0, 0], &[0; 3]);
    crate::cpu::load_user_segments(&crate::cpu::UserSegments::default());
    crate::cpu::FpuState::initial().restore();
    signals_on_return(id, frame)
}

/// Each process's program by process slot, for the Task records of its
/// threads: set when it starts, copied to a child at `fork`.
static PROGRAMS: Mutex<RefCell<alloc::vec::Vec<Option<sampler::wire::Program>>>> =
    Mutex::new(RefCell::new(alloc::vec::Vec::new()));

/// The program process slot `proc` runs, if a loaded one.
pub fn program_of(proc: u8) -> Option<sampler::wire::Program> {
    critical_section::with(|cs| {
        PROGRAMS
            .borrow_ref(cs)
            .get(usize::from(proc))
            .cloned()
            .flatten()
    })
}

fn set_program(proc: u8, program: Option<sampler::wire::Program>) {
    critical_section::with(|cs| {
        let mut all = PROGRAMS.borrow_ref_mut(cs);
        let i = usize::from(proc);
        if all.len() <= i {
            all.resize(i + 1, None);
        }
        all[i] = program;
    });
}

/// Flushes a process's pending partial output lines (at a fault or when
/// the run ends).
pub fn flush(id: u8) {
    with_machine(id, |m, p, _| p.flush_output(m));
}

/// Runs `f` with the [`Machine`] of loaded program `id` and its Linux
/// state (`None` for a built-in program or a free slot).
fn with_machine<R>(
    id: u8,
    f: impl FnOnce(&mut RtMachine<'_>, &mut sys::Process, &mut sys::Thread) -> R,
) -> Option<R> {
    with_machine_fpu(id, |m, p, t, _| f(m, p, t))
}

/// [`with_machine`], with the thread's saved FPU state too.
fn with_machine_fpu<R>(
    id: u8,
    f: impl FnOnce(
        &mut RtMachine<'_>,
        &mut sys::Process,
        &mut sys::Thread,
        &mut crate::cpu::FpuState,
    ) -> R,
) -> Option<R> {
    let (name, pidx) = task::get(id).map_or(("?", 0), |t| (t.spec.name, t.proc));
    task::with_thread(id, |thread, proc| {
        let task::Thread {
            segs,
            linux: lt,
            fpu,
            ..
        } = thread;
        let task::Process {
            space,
            linux,
            stack_low,
        } = proc;
        let p = linux.as_deref_mut()?;
        let t = lt.as_deref_mut()?;
        let stack_top = p.layout.stack_top;
        let mut m = RtMachine {
            proc: pidx,
            space,
            segs,
            stack_low,
            stack_top,
            name,
        };
        Some(f(&mut m, p, t, fpu))
    })
    .flatten()
}

/// Why a program could not be started.
#[derive(Debug)]
pub enum StartError {
    /// The ELF was refused.
    Elf(kcore::elf::ElfError),
    /// The initial stack could not be built.
    Stack(kcore::initstack::StackError),
    /// The process state could not be made.
    Process(Errno),
    /// Out of memory or process slots.
    NoMemory,
    /// No free process slot.
    NoSlot,
}

impl core::fmt::Display for StartError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            StartError::Elf(e) => write!(f, "{e}"),
            StartError::Stack(e) => write!(f, "{e}"),
            StartError::Process(e) => write!(f, "{e:?}"),
            StartError::NoMemory => write!(f, "out of memory"),
            StartError::NoSlot => write!(f, "too many processes"),
        }
    }
}

fn prot_of(p: kcore::elf::Prot) -> Prot {
    let mut r = Prot::NONE;
    if p.read {
        r = r.union(Prot::READ);
    }
    if p.write {
        r = r.union(Prot::WRITE);
    }
    if p.exec {
        r = r.union(Prot::EXEC);
    }
    r
}

/// A started program.
#[derive(Clone, Debug)]
pub struct Started {
    /// The process slot.
    pub id: u8,
}

/// The wire form of a loaded segment's rights.
fn wire_prot(p: kcore::elf::Prot) -> u8 {
    use sampler::wire::Segment as S;
    (if p.read { S::READ } else { 0 })
        | (if p.write { S::WRITE } else { 0 })
        | (if p.exec { S::EXEC } else { 0 })
}

/// A program loaded into a new address space, ready to run.
struct Image {
    /// The ELF's ABI.
    abi: sys::Abi,
    /// Where it starts.
    entry: u64,
    /// Its initial stack pointer (argc on top).
    sp: u64,
    /// Its page tables, the initial stack written.
    space: AddressSpace,
    /// Its areas: the segments and the main stack.
    areas: AreaSet,
    /// The lowest present page of its stack.
    stack_low: u64,
    /// Where its heap starts.
    brk_start: u64,
    /// What the Task records say of it.
    program: sampler::wire::Program,
}

/// The program path a Task record gives: archive-relative, cut at the
/// wire's bound.
fn program_path(path: &[u8]) -> heapless::String<{ sampler::wire::MAX_PROGRAM_PATH }> {
    let path = core::str::from_utf8(path).unwrap_or("?");
    let path = path.trim_start_matches("./").trim_start_matches('/');
    let mut cut = path.len().min(sampler::wire::MAX_PROGRAM_PATH);
    while !path.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut s = heapless::String::new();
    let _ = s.push_str(&path[..cut]);
    s
}

/// Loads the static ELF `data` (at `path` in the file system) into a new
/// address space with the initial stack Linux builds from `argv`, `envp`
/// and `execfn`: the segments as file-backed areas (brought in on first
/// touch), the main stack for its ABI.
fn load_image(
    data: FileData,
    path: &[u8],
    argv: &[Vec<u8>],
    envp: &[Vec<u8>],
    execfn: &[u8],
) -> Result<Image, StartError> {
    let elf = data.bytes();
    let plan = kcore::elf::plan(elf).map_err(StartError::Elf)?;
    let abi = match plan.class {
        kcore::elf::Class::Elf64 => sys::Abi::X86_64,
        kcore::elf::Class::Elf32 => sys::Abi::I386,
    };
    let mut areas = AreaSet::new();
    let mut program = sampler::wire::Program {
        path: program_path(path),
        ..Default::default()
    };
    if let Some(id) = kcore::elf::build_id(elf) {
        let _ = program
            .build_id
            .extend_from_slice(&id[..id.len().min(sampler::wire::MAX_BUILD_ID)]);
    }
    for seg in &plan.segments {
        let start = seg.page_start();
        let lead = seg.vaddr - start;
        let area = Area {
            start,
            end: seg.page_end(),
            prot: prot_of(seg.prot),
            kind: AreaKind::File,
            backing: Backing::File {
                data: data.clone(),
                offset: seg.file_offset - lead,
                len: seg.filesz + lead,
            },
        };
        areas.insert(area).map_err(StartError::Process)?;
        // As Linux maps a PT_LOAD: whole pages from the page holding the
        // segment's first byte (the bias is in `vaddr` already).
        let _ = program.segments.push(sampler::wire::Segment {
            start,
            len: seg.page_end() - start,
            file_offset: seg.file_offset - lead,
            prot: wire_prot(seg.prot),
        });
    }
    let layout = sys::Layout::for_abi(abi);
    let mut stack_prot = Prot::RW;
    if plan.stack_exec {
        stack_prot = stack_prot.union(Prot::EXEC);
    }
    areas
        .insert(Area::zeroed(
            layout.stack_bottom(),
            layout.stack_top,
            stack_prot,
            AreaKind::Stack,
        ))
        .map_err(StartError::Process)?;
    let mut space = AddressSpace::new().ok_or(StartError::NoMemory)?;
    let mut random = [0u8; 16];
    crate::time::random_bytes(&mut random);
    let stack_spec = kcore::initstack::StackSpec::for_plan(
        &plan,
        layout.stack_top,
        argv,
        envp,
        execfn,
        random,
        crate::cpu::hwcap(),
    );
    let image = kcore::initstack::build(&stack_spec).map_err(StartError::Stack)?;
    let mut stack_low = layout.stack_top;
    let pager = &mut AreaPager {
        areas: &areas,
        stack_low: &mut stack_low,
    };
    user::write(&mut space, pager, image.sp, &image.bytes, Access::Fill)
        .map_err(|_| StartError::NoMemory)?;
    Ok(Image {
        abi,
        entry: plan.entry,
        sp: image.sp,
        space,
        areas,
        stack_low,
        brk_start: plan.brk_start,
        program,
    })
}

/// Starts the manifest's process `spec` from the program bytes `elf`.
pub fn start(
    spec: &kcore::manifest::ProcessSpec,
    elf: &'static [u8],
) -> Result<Started, StartError> {
    let execfn = spec.exe.as_bytes();
    let argv: Vec<Vec<u8>> = if spec.argv.is_empty() {
        alloc::vec![execfn.to_vec()]
    } else {
        spec.argv.clone()
    };
    let image = load_image(FileData::Static(elf), execfn, &argv, &spec.envp, execfn)?;
    let slot = task::free_slot().ok_or(StartError::NoSlot)?;
    let pid = slot as u32 + 1;
    let mut proc = with_system(|s| {
        sys::Process::new(
            &s.fs,
            pid,
            0,
            spec.name.as_bytes(),
            spec.exe.as_bytes(),
            image.abi,
            spec.cwd.as_bytes(),
        )
    })
    .ok_or(StartError::Process(Errno::ENOSYS))?
    .map_err(StartError::Process)?;
    proc.areas = image.areas;
    proc.set_brk_start(image.brk_start);
    let name: &'static str = Box::leak(spec.name.clone().into_boxed_str());
    let task_spec = TaskSpec {
        name,
        abi: task_abi(image.abi),
        entry: image.entry,
        gprs: [0; 15],
    };
    // Its standard descriptors and its place in the process table, last:
    // nothing fails between here and its install (the slot is free).
    with_system(|s| sys::process_started(s, &mut proc))
        .ok_or(StartError::Process(Errno::ENOSYS))?
        .map_err(StartError::Process)?;
    let comm = proc.comm;
    let process = Box::new(task::Process {
        space: image.space,
        linux: Some(Box::new(proc)),
        stack_low: image.stack_low,
    });
    let mut first = sys::Thread::new(pid);
    first.comm = comm;
    let thread = task::Thread::first(Some(Box::new(first)));
    let sp = image.sp;
    let id = task::install(task_spec, process, thread, |_| sp).map_err(|_| StartError::NoSlot)?;
    // What the Task records of its threads say of its program: archive
    // path, build-id and the segments as mapped.
    set_program(id, Some(image.program));
    Ok(Started { id })
}

fn task_abi(abi: sys::Abi) -> task::Abi {
    match abi {
        sys::Abi::X86_64 => task::Abi::X64,
        sys::Abi::I386 => task::Abi::Compat32,
    }
}
