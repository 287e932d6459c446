//! The Linux system-call personality of the runtime, for both x86 ABIs.
//!
//! The runtime catches a system call (SYSCALL from a 64-bit process,
//! `int 0x80` from an i386 one), reads the number and six arguments from
//! the ABI's registers and calls [`syscall`] with the current process's
//! [`Process`], the run's shared [`System`] (the file system and the
//! unknown-call counter) and its [`Machine`] implementation. The answer is
//! an [`Action`]: a value for `rax`, or what the scheduler must do
//! (exit, kill, yield, sleep, block).
//!
//! Module map:
//! - [`errno`]: the typed error numbers handlers return.
//! - [`table`] (+ `names`): one table per ABI, number -> named handler, and
//!   Linux's name for every number.
//! - [`machine`]: the narrow hardware trait and the checked user-copy
//!   helpers.
//! - [`vma`]: memory areas and the address-space layout.
//! - [`fs`]: the run's file system; [`fd`]: each process's descriptor
//!   table and the run's open file descriptions ([`fd::Files`]), which
//!   the tables share;
//!   [`event`]: eventfd, epoll and every file's readiness; [`wait`]:
//!   threads waiting on files; [`net`]: TCP and UDP sockets over smoltcp
//!   (the runtime moves their packets with [`net::Net::poll`] and passes
//!   what changed to [`net_changed`]).
//! - [`process`]: per-process and per-thread state; [`procs`]: the run's
//!   process table (parents, groups, sessions, zombies) that `wait4`,
//!   `waitid`, `setpgid` and `setsid` use.
//! - [`signal`]: delivery and `rt_sigreturn` in both ABIs' frames;
//!   [`restart`]: what a wait a signal interrupted returns (Linux's
//!   `-ERESTART*` rules); [`sigwait`]: `rt_sigtimedwait`.
//! - [`uapi`]: Linux's structures in each ABI's layout.
//! - `calls`: the handlers.
//!
//! A process has threads (`clone`, no `fork` or `execve`): they share its
//! memory, files and signal actions. A thread waits on a futex
//! ([`futex`]) or on files ([`wait`]), and another thread's wake or write
//! ends the wait; signals are delivered to handlers of both ABIs
//! ([`signal`]).
//!
//! # What the runtime does
//! 1. Once: `System::new(Vfs::from_archive(entries)?)`, with the archive's
//!    `(path, mode, data)` entries; set `ram_bytes`/`free_ram_bytes`.
//! 2. Per process: [`Process::new`] (the run, pid, ppid, comm, exe path,
//!    ABI, cwd),
//!    then insert the loaded image into `p.areas` ([`Area`] with
//!    [`Backing::File`] over the ELF's bytes, or [`Backing::Zero`]), the
//!    stack area (`[layout.stack_bottom(), layout.stack_top)`,
//!    [`AreaKind::Stack`], RW) and call [`Process::set_brk_start`] with the
//!    end of the highest segment. Write the initial stack through the
//!    same areas.
//! 3. On a page fault in user mode: [`AreaSet::find`] says whether the
//!    address is mapped and with what rights; for a page not present yet
//!    [`AreaSet::page_content`] gives its bytes. Anything else ends the
//!    process with SIGSEGV and a reason.
//! 4. On a system call: [`syscall`], then act on the [`Action`]. On
//!    `Exit`/`Kill` call [`Process::flush_output`] before reporting, and
//!    [`process_ended`] once its last thread is gone (its descriptors
//!    close: a pipe end another process holds stays open).
//! 5. On every switch to a process: load `p.fs_base` (64-bit) or install
//!    `p.tls` into GDT entries 12..=14 (i386).
//! 6. At the end of the run: `sys.unknown.summary()` after
//!    `perch: unknown system calls: `.
//!
//! # Implemented, and what is not
//! Every number in [`table`]'s `X86_64_TABLE`/`I386_TABLE` has a handler;
//! `rseq` and `membarrier` return `ENOSYS` on purpose (libc copes) and
//! are not counted as unknown; everything else (`fork`, `execve`,
//! `AF_UNIX` sockets, timerfd, signalfd, xattrs, SysV IPC,
//! ...) returns `ENOSYS` and is counted by name in [`UnknownCalls`].

pub mod errno;
pub mod event;
pub mod exec;
pub mod fd;
pub mod fs;
pub mod futex;
pub mod machine;
pub mod net;
pub mod process;
pub mod procs;
pub mod restart;
pub mod signal;
pub mod sigwait;
pub mod table;
pub mod uapi;
pub mod vma;
pub mod wait;

mod calls;
mod names;

#[cfg(test)]
mod tests;

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::Write as _;

pub use errno::{Errno, SysResult};
pub use fs::Vfs;
pub use machine::{LineEnd, Machine, Stream, TlsEntry};
pub use process::{Process, Thread};
pub use table::Sys;
pub use vma::{Area, AreaKind, AreaSet, Backing, FileData, Layout, Prot};

/// The system-call ABI a call came in through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Abi {
    /// 64-bit: SYSCALL, number in `rax`, arguments in `rdi rsi rdx r10 r8 r9`.
    X86_64,
    /// i386 (compat mode): `int 0x80`, number in `eax`, arguments in
    /// `ebx ecx edx esi edi ebp`.
    I386,
}

impl Abi {
    /// The name used in reports (`x86_64`, `i386`).
    pub const fn name(self) -> &'static str {
        match self {
            Abi::X86_64 => "x86_64",
            Abi::I386 => "i386",
        }
    }
}

/// What the runtime does after a system call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Return to the process with this value in `rax` (for i386 the low 32
    /// bits go to `eax`). Errors are already encoded as Linux does: `-errno`.
    Return(u64),
    /// The process exits with this status (0..=255): `exit_group`, or
    /// `exit` of its only thread. The runtime calls
    /// [`Process::flush_output`] and reports the status.
    Exit(u8),
    /// The process ends by a signal it sent itself (abort(), raise of a
    /// signal whose default action terminates), or because it asked for
    /// something that cannot work (rt_sigreturn without a frame).
    Kill {
        /// The signal number (see [`signal_name`]).
        signal: u8,
        /// Why, for the `killed by SIGNAME: REASON` line.
        reason: &'static str,
    },
    /// `sched_yield`: put the process at the back of the run queue and
    /// return 0 to it.
    Yield,
    /// Block the process until the monotonic clock reaches `until_ns`, then
    /// return `then` in `rax` (nanosleep and clock_nanosleep: 0; a futex
    /// wait that times out: `-ETIMEDOUT`).
    Sleep {
        /// Monotonic deadline in ns ([`Machine::monotonic_ns`]).
        until_ns: u64,
        /// The value for `rax` when it is reached.
        then: u64,
    },
    /// Block the thread: a futex wait without timeout on a value that
    /// matched (another thread's wake, through [`Machine::wake_thread`],
    /// ends it with 0 in `rax`), `pause` or `rt_sigsuspend`. A thread
    /// nobody wakes stays blocked until the run ends (`duration=`); the
    /// runtime may report it as blocked forever.
    Block,
    /// `clone` of a thread, with its arguments checked: the runtime makes
    /// the thread (a task slot and its tid), builds its state with
    /// [`new_thread`], and returns the tid to the caller, or `-EAGAIN`
    /// when it has no room.
    Clone(CloneArgs),
    /// A copy of the process (`fork`, `vfork`, `clone` without `CLONE_VM`),
    /// its arguments checked: the runtime picks the child's pid, builds its
    /// state with [`fork_child`], copies the address space, writes the
    /// tids the flags ask for and returns the pid to the caller (0 to the
    /// child), or `-EAGAIN` when it has no room.
    Fork(CloneArgs),
    /// `execve` or `execveat` of a program that can run, checked up to
    /// Linux's point of no return: the runtime ends the process's other
    /// threads, builds the new address space from [`exec::Exec::data`]
    /// with the initial stack of its strings, and calls
    /// [`exec::exec_commit`]; the thread then starts at the new entry.
    /// Should the runtime fail past that point (no memory), the process
    /// is killed, as Linux kills it.
    Exec(alloc::boxed::Box<exec::Exec>),
    /// `rt_sigreturn`: the runtime restores the thread's registers from
    /// its signal frame with [`signal::sigreturn`].
    SigReturn,
    /// The i386 `sigreturn` (119): the runtime restores the thread's
    /// registers from its `sigframe_ia32` with [`signal::old_sigreturn`].
    OldSigReturn,
    /// `exit` of one thread of several: the thread ends (its
    /// `clear_child_tid` was cleared and woken, its robust futexes
    /// released), the process goes on.
    ExitThread(u8),
    /// Wait for a file to become ready (see [`wait`]): block until
    /// [`Machine::wake_thread`] or, with a deadline, until the monotonic
    /// clock reaches it; then call [`resume`] before the thread runs,
    /// which makes the call again and says what to do.
    Wait {
        /// Monotonic deadline in ns, if any.
        until_ns: Option<u64>,
    },
}

pub use calls::task::{CloneArgs, clone_flags, fork_child, new_thread, release_robust_list};

/// Signal names for reports: `SIGABRT` for 6, `SIG34` style past 31.
pub fn signal_name(sig: u8) -> &'static str {
    const NAMES: [&str; 32] = [
        "SIG0",
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    NAMES.get(sig as usize).copied().unwrap_or("SIGRT")
}

/// How many distinct numbers past the end of a table are remembered; more
/// are counted together.
const MAX_OUT_OF_RANGE: usize = 32;

/// Counts of unimplemented system calls, by (ABI, number), for the run's
/// summary. Only calls that returned `ENOSYS` because nothing implements
/// them are counted; calls implemented as a deliberate `ENOSYS` (rseq,
/// membarrier) are not. Memory is bounded: one counter per named number,
/// and a few for numbers past the tables.
#[derive(Debug, Clone)]
pub struct UnknownCalls {
    x86_64: Vec<u64>,
    i386: Vec<u64>,
    out_of_range: Vec<(Abi, u64, u64)>,
    other_out_of_range: [u64; 2],
}

impl Default for UnknownCalls {
    fn default() -> Self {
        UnknownCalls::new()
    }
}

impl UnknownCalls {
    /// No calls counted.
    pub fn new() -> UnknownCalls {
        UnknownCalls {
            x86_64: alloc::vec![0; names::X86_64_NAMES.len()],
            i386: alloc::vec![0; names::I386_NAMES.len()],
            out_of_range: Vec::new(),
            other_out_of_range: [0; 2],
        }
    }

    /// Counts one unimplemented call.
    pub fn record(&mut self, abi: Abi, nr: u64) {
        let counts = match abi {
            Abi::X86_64 => &mut self.x86_64,
            Abi::I386 => &mut self.i386,
        };
        if let Some(c) = usize::try_from(nr).ok().and_then(|i| counts.get_mut(i)) {
            *c += 1;
            return;
        }
        if let Some(e) = self
            .out_of_range
            .iter_mut()
            .find(|e| e.0 == abi && e.1 == nr)
        {
            e.2 += 1;
        } else if self.out_of_range.len() < MAX_OUT_OF_RANGE
            && self.out_of_range.try_reserve(1).is_ok()
        {
            self.out_of_range.push((abi, nr, 1));
        } else {
            self.other_out_of_range[abi as usize] += 1;
        }
    }

    /// The distinct unknown calls: `(abi, nr, name, count)`, x86_64 first,
    /// by number. The name is Linux's, `unassigned` for a number Linux
    /// does not use and `invalid` past the table (`nr` is `u64::MAX` for
    /// the bucket of numbers past the table not remembered one by one).
    pub fn list(&self) -> Vec<(Abi, u64, &'static str, u64)> {
        let mut out = Vec::new();
        for (abi, counts) in [(Abi::X86_64, &self.x86_64), (Abi::I386, &self.i386)] {
            for (nr, &c) in counts.iter().enumerate() {
                if c > 0 {
                    let n = table::name(abi, nr as u64).unwrap_or("");
                    let n = if n.is_empty() { "unassigned" } else { n };
                    out.push((abi, nr as u64, n, c));
                }
            }
            let mut far: Vec<_> = self.out_of_range.iter().filter(|e| e.0 == abi).collect();
            far.sort_by_key(|e| e.1);
            for e in far {
                out.push((abi, e.1, "invalid", e.2));
            }
            if self.other_out_of_range[abi as usize] > 0 {
                out.push((
                    abi,
                    u64::MAX,
                    "invalid",
                    self.other_out_of_range[abi as usize],
                ));
            }
        }
        out
    }

    /// The summary text after `perch: unknown system calls: `: `none`, or
    /// `x86_64 NR (NAME) xCOUNT, i386 NR (NAME) xCOUNT, ...`.
    pub fn summary(&self) -> String {
        let list = self.list();
        if list.is_empty() {
            return String::from("none");
        }
        let mut s = String::new();
        for (i, (abi, nr, name, count)) in list.into_iter().enumerate() {
            if i > 0 {
                s.push_str(", ");
            }
            let _ = write!(s, "{} {} ({}) x{}", abi.name(), nr, name, count);
        }
        s
    }
}

/// State shared by all processes of the run.
#[derive(Debug)]
pub struct System {
    /// The file system.
    pub fs: Vfs,
    /// Unimplemented calls seen so far.
    pub unknown: UnknownCalls,
    /// The threads waiting on futexes, of every process.
    pub futex: futex::FutexTable,
    /// The threads waiting on files, of every process.
    pub waits: wait::WaitList,
    /// The sockets of every process, and the interfaces they use.
    pub net: net::Net,
    /// The open file descriptions of every process, and the pipes,
    /// eventfds and epoll instances they refer to.
    pub files: fd::Files,
    /// Every process's parent, group and session, and the zombies.
    pub procs: procs::Procs,
    /// Programs `execve` refused, for the run's summary.
    pub execs: exec::Refusals,
    /// Memory the runtime manages for programs, in bytes (sysinfo's
    /// `totalram`); the runtime sets it from the memory map.
    pub ram_bytes: u64,
    /// Free memory in bytes (sysinfo's `freeram`); the runtime may keep
    /// it up to date.
    pub free_ram_bytes: u64,
}

impl System {
    /// A run with file system `fs`.
    pub fn new(fs: Vfs) -> System {
        System {
            fs,
            unknown: UnknownCalls::new(),
            futex: futex::FutexTable::new(),
            waits: wait::WaitList::new(),
            net: net::Net::new(0),
            files: fd::Files::new(),
            procs: procs::Procs::new(),
            execs: exec::Refusals::default(),
            ram_bytes: 1 << 30,
            free_ram_bytes: 1 << 29,
        }
    }
}

/// Handles one system call of process `p`, which came in through `abi`
/// with number `nr` and arguments `args` (the six argument registers in
/// the ABI's order; for i386 only the low 32 bits of each are used).
pub fn syscall<M: Machine>(
    m: &mut M,
    sys: &mut System,
    p: &mut Process,
    t: &mut Thread,
    abi: Abi,
    nr: u64,
    args: [u64; 6],
) -> Action {
    run(m, sys, p, t, abi, nr, args, None)
}

/// Before thread `t`, woken from an [`Action::Wait`] (or past its
/// deadline), runs again: makes the call it waits in again, with the
/// deadline it first had. `None` when it waits for no file.
pub fn resume<M: Machine>(
    m: &mut M,
    sys: &mut System,
    p: &mut Process,
    t: &mut Thread,
) -> Option<Action> {
    let w = t.wait.take()?;
    sys.waits.remove(t.tid);
    Some(run(m, sys, p, t, w.abi, w.nr, w.args, Some(w.until_ns)))
}

/// After [`net::Net::poll`]: the sockets that changed run the callbacks of
/// the epoll entries watching them, and every thread of their owners
/// waiting on a file looks again (`wake`).
pub fn net_changed(sys: &mut System, changes: &[net::Change], mut wake: impl FnMut(u32)) {
    for c in changes {
        sys.files.event(event::Obj::Socket(c.id), c.key);
    }
    for c in changes {
        sys.waits.wake_with(c.pid, &mut wake);
    }
}

/// Process `p`, loaded, is about to run: it gets the standard descriptors
/// (0 stdin at end of file, 1 and 2 the console) and its place in the
/// process table, leading a group and a session of its own. `EAGAIN` when
/// its pid is still a zombie's.
pub fn process_started(sys: &mut System, p: &mut Process) -> Result<(), Errno> {
    let fds = sys.files.standard_streams()?;
    if let Err(e) = sys.procs.add(p.pid, p.ppid, p.pid, p.pid) {
        let mut fds = fds;
        sys.files.close_all(&mut fds);
        return Err(e);
    }
    p.fds = fds;
    Ok(())
}

/// Process `p` ended with `status`: its descriptors close (a description
/// another process still names stays; the holders of a pipe's other end
/// hear of it), its sockets with them, and it becomes a zombie for its
/// parent ([`procs::Procs::ended`]). Returns the parent, whose threads
/// waiting in `wait4` or `waitid` were woken through `wake` (each waiting
/// tid), and which the runtime sends SIGCHLD.
pub fn process_ended(
    sys: &mut System,
    p: &mut Process,
    status: procs::Status,
    wake: impl FnMut(u32),
) -> Option<u32> {
    let mut wake = wake;
    let gone = sys.files.close_all(&mut p.fds);
    // The sockets whose last descriptor it held close; one a forked
    // process still holds stays open.
    for id in sys.files.take_closed_sockets() {
        sys.net.close(id);
    }
    // A pipe end it held went: the other end's holders, in any process,
    // see end of file or a broken pipe.
    let pipes = exec::pipe_events(sys, gone);
    let parent = sys.procs.ended(p.pid, status);
    if pipes {
        sys.waits.wake_all_with(&mut wake);
    } else if let Some(parent) = parent {
        sys.waits.wake_with(parent, &mut wake);
    }
    parent
}

/// Thread `t` stops waiting for a file (a signal interrupts it, or it ends).
pub fn cancel_wait(sys: &mut System, t: &mut Thread) {
    t.wait = None;
    t.sent = 0;
    sys.waits.remove(t.tid);
}

/// A signal interrupts thread `t`'s wait for a file: the call says
/// `EINTR`, and on the way back to user mode [`restart::finish`] ends it
/// by its kind (a read or write of a pipe or an eventfd is made again
/// after a handler with `SA_RESTART`; `poll` and `select` only when no
/// handler runs; `epoll_wait` never).
///
/// A blocking send that queued part of its data ends with that count
/// instead, as Linux's does (returned here; the call is not restarted).
pub fn interrupt_wait(sys: &mut System, t: &mut Thread) -> Option<u64> {
    if t.sent > 0 {
        let sent = core::mem::take(&mut t.sent);
        t.wait = None;
        t.interrupted = None;
        sys.waits.remove(t.tid);
        return Some(sent);
    }
    if let Some(w) = t.wait.take()
        && let Some(call) = table::lookup(w.abi, w.nr)
    {
        t.interrupted = Some(restart::Interrupted {
            nr: w.nr,
            restart: restart::kind(call, &w.args),
        });
    }
    sys.waits.remove(t.tid);
    None
}

#[allow(clippy::too_many_arguments)]
fn run<M: Machine>(
    m: &mut M,
    sys: &mut System,
    p: &mut Process,
    t: &mut Thread,
    abi: Abi,
    nr: u64,
    args: [u64; 6],
    resumed: Option<Option<u64>>,
) -> Action {
    let (nr, args) = match abi {
        Abi::X86_64 => (nr, args),
        Abi::I386 => (nr & 0xffff_ffff, args.map(|a| a & 0xffff_ffff)),
    };
    let Some(call) = table::lookup(abi, nr) else {
        sys.unknown.record(abi, nr);
        return Action::Return(Errno::ENOSYS.to_return());
    };
    let mut ctx = calls::Ctx {
        m,
        fs: &mut sys.fs,
        futex: &mut sys.futex,
        waits: &mut sys.waits,
        net: &mut sys.net,
        files: &mut sys.files,
        procs: &mut sys.procs,
        execs: &mut sys.execs,
        unknown: &mut sys.unknown,
        p,
        t,
        abi,
        ram: (sys.ram_bytes, sys.free_ram_bytes),
        resumed,
    };
    let a = match calls::dispatch(&mut ctx, call, nr, args) {
        Ok(a) => a,
        Err(e) => Action::Return(e.to_return()),
    };
    // Sockets whose last descriptor went (close, dup2 over one, ...).
    for id in sys.files.take_closed_sockets() {
        sys.net.close(id);
    }
    // A wait with its own signal mask that returned, but not because of
    // a signal, gets the thread's mask back (a handler's frame keeps it
    // otherwise).
    if matches!(
        call,
        Sys::Ppoll
            | Sys::Ppoll64
            | Sys::Pselect6
            | Sys::Pselect6Time64
            | Sys::EpollPwait
            | Sys::EpollPwait2
    ) && matches!(a, Action::Return(v) if v != Errno::EINTR.to_return())
        && let Some(m) = t.saved_sigmask.take()
    {
        t.sigmask = m;
    }
    // A call that waits is ended by a signal as its kind says
    // ([`restart`]); a file wait is made again when woken, and
    // [`interrupt_wait`] says what a signal makes of it.
    t.interrupted = match a {
        Action::Block | Action::Sleep { .. } => Some(restart::Interrupted {
            nr,
            restart: restart::kind(call, &args),
        }),
        _ => None,
    };
    if let Action::Wait { until_ns } = a {
        if !sys.waits.add(p.pid, t.tid) {
            return Action::Return(Errno::ENOMEM.to_return());
        }
        t.wait = Some(wait::FileWait {
            abi,
            nr,
            args,
            until_ns,
        });
    }
    a
}
