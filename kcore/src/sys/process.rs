//! Per-process state of the personality, owned by the runtime: identity,
//! working directory, descriptors, memory areas, brk, recorded signal
//! state, TLS, rlimits and the console line buffers.

use alloc::vec::Vec;

use super::Abi;
use super::errno::Errno;
use super::fd::{FdTable, Files, NOFILE_LIMIT};
use super::fs::{NodeId, Vfs};
use super::machine::{LineEnd, Machine, Stream, TlsEntry};
use super::vma::{AreaSet, Layout, STACK_SIZE, page_round_up};

/// The longest line kept in a line buffer; a longer line is handed to the
/// console in pieces of this size ([`LineEnd::Overlong`]).
pub const LINE_MAX: usize = 16 * 1024;

/// Number of signals (1..=64).
pub const NSIG: usize = 64;

/// Linux's `RLIM_INFINITY`.
pub const RLIM_INFINITY: u64 = u64::MAX;

/// Resource numbers (`RLIMIT_*`).
pub mod rlimit {
    /// CPU time.
    pub const CPU: usize = 0;
    /// File size.
    pub const FSIZE: usize = 1;
    /// Data segment.
    pub const DATA: usize = 2;
    /// Stack.
    pub const STACK: usize = 3;
    /// Core file size.
    pub const CORE: usize = 4;
    /// Resident set.
    pub const RSS: usize = 5;
    /// Processes.
    pub const NPROC: usize = 6;
    /// Open files.
    pub const NOFILE: usize = 7;
    /// Locked memory.
    pub const MEMLOCK: usize = 8;
    /// Address space.
    pub const AS: usize = 9;
    /// Number of resources (`RLIM_NLIMITS`).
    pub const NLIMITS: usize = 16;
}

/// A resource limit (`struct rlimit64`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rlimit {
    /// Soft limit.
    pub cur: u64,
    /// Hard limit.
    pub max: u64,
}

/// A recorded `struct sigaction` (kernel layout; the handler is never
/// called, delivery is out of scope).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SigAction {
    /// `sa_handler` (0 = SIG_DFL, 1 = SIG_IGN).
    pub handler: u64,
    /// `sa_flags`.
    pub flags: u64,
    /// `sa_restorer`.
    pub restorer: u64,
    /// `sa_mask`.
    pub mask: u64,
}

/// A recorded `stack_t` (`sigaltstack`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AltStack {
    /// `ss_sp`.
    pub sp: u64,
    /// `ss_flags` (`SS_DISABLE` = 2 when none).
    pub flags: u32,
    /// `ss_size`.
    pub size: u64,
}

/// The recorded signal state the threads of a process share.
#[derive(Debug, Clone)]
pub struct Signals {
    /// Actions of signals 1..=64 (index = signal - 1).
    pub actions: [SigAction; NSIG],
    /// Signals sent to the process (`kill`) that no thread took yet (bit
    /// n-1 = signal n); a thread's own are in [`Thread::pending`].
    pub pending: u64,
}

/// One thread as the personality sees it: what Linux keeps per task
/// rather than per thread group. The threads of a process share its
/// [`Process`]; each has its own `Thread`.
#[derive(Debug, Clone)]
pub struct Thread {
    /// Thread id (the process id for its first thread).
    pub tid: u32,
    /// `set_tid_address`'s pointer (`clear_child_tid`): cleared and woken
    /// (a futex wake of one) when the thread exits.
    pub clear_child_tid: u64,
    /// `set_robust_list`'s head and length.
    pub robust_list: (u64, u64),
    /// The FS base (64-bit TLS pointer). The runtime loads it on each
    /// switch to the thread.
    pub fs_base: u64,
    /// The i386 TLS GDT slots (`set_thread_area`), installed by the
    /// runtime on each switch. Slot `i` is GDT entry
    /// [`TLS_ENTRY_MIN`] + `i`.
    pub tls: [Option<TlsEntry>; 3],
    /// The blocked signals (bit n-1 = signal n).
    pub sigmask: u64,
    /// Signals sent to this thread that it has not taken yet.
    pub pending: u64,
    /// The mask `rt_sigsuspend` replaced, which the next handler's frame
    /// saves (and its `rt_sigreturn` restores).
    pub saved_sigmask: Option<u64>,
    /// The thread's name (`prctl(PR_SET_NAME)`; 1..=15 bytes, NUL-padded).
    pub comm: [u8; 16],
    /// Set when `comm` changed; the runtime clears it once it told the
    /// profile.
    pub renamed: bool,
    /// The alternate signal stack.
    pub altstack: AltStack,
    /// The call it waits in (or waited in, until it is back in user
    /// mode), for the restart rules of [`super::restart`].
    pub interrupted: Option<super::restart::Interrupted>,
    /// The `rt_sigtimedwait` it waits in.
    pub sigwait: Option<super::sigwait::SigWait>,
    /// The call it waits in for a file to become ready (see
    /// [`wait`](super::wait)).
    pub wait: Option<super::wait::FileWait>,
    /// The bytes a blocking send on a stream socket has queued so far
    /// while it waits for room for the rest (0 otherwise): the call made
    /// again goes on from there, and a signal ends it with this count.
    pub sent: u64,
}

impl Thread {
    /// A process's first thread, or a new thread before `clone` gives it
    /// its parent's state: no TLS, no signals blocked, no alternate stack.
    pub fn new(tid: u32) -> Thread {
        Thread {
            tid,
            clear_child_tid: 0,
            robust_list: (0, 0),
            fs_base: 0,
            tls: [None; 3],
            sigmask: 0,
            pending: 0,
            saved_sigmask: None,
            comm: [0; 16],
            renamed: false,
            altstack: AltStack {
                sp: 0,
                flags: 2,
                size: 0,
            },
            interrupted: None,
            sigwait: None,
            wait: None,
            sent: 0,
        }
    }
}

#[derive(Debug, Clone, Default)]
struct LineBuffer {
    bytes: Vec<u8>,
}

/// One process as the personality sees it.
#[derive(Debug)]
pub struct Process {
    /// Process id (also its only thread's id).
    pub pid: u32,
    /// Parent's pid (the runtime is 0... Linux would say 1 for init's
    /// children; the runtime chooses).
    pub ppid: u32,
    /// The name shown in output and profiles (1..=15 bytes; `prctl`
    /// `PR_SET_NAME` changes it).
    pub comm: [u8; 16],
    /// The executable's absolute path (readlink of `/proc/self/exe`).
    pub exe: Vec<u8>,
    /// The ABI the process runs in.
    pub abi: Abi,
    /// The address-space layout for its ABI.
    pub layout: Layout,
    /// The current working directory.
    pub cwd: NodeId,
    /// The file-creation mask.
    pub umask: u32,
    /// Descriptors, naming descriptions of the run's
    /// [`Files`](super::fd::Files) (`System::files`).
    pub fds: FdTable,
    /// Memory areas. The runtime's fault handler and user copies use them.
    pub areas: AreaSet,
    /// Start of the brk heap (page-aligned end of the loaded image).
    pub brk_start: u64,
    /// Current program break (`brk_start` until the program moves it).
    pub brk: u64,
    /// Recorded signal state.
    pub signals: Signals,
    /// Live threads (1 at start): `clone` counts one more, the `exit` of
    /// one thread of several one less.
    pub threads: u32,
    /// Resource limits.
    pub rlimits: [Rlimit; rlimit::NLIMITS],
    /// CPU time the process has used, in ns: the runtime's scheduler
    /// keeps it up to date (CLOCK_PROCESS_CPUTIME_ID, getrusage, times).
    pub cpu_time_ns: u64,
    /// Monotonic time the process started at, in ns (for `times`).
    pub start_ns: u64,
    out: [LineBuffer; 2],
}

/// The first GDT entry number of the TLS slots, as Linux's
/// `GDT_ENTRY_TLS_MIN` on 64-bit kernels (entries 12, 13, 14; selectors
/// 0x63, 0x6b, 0x73).
pub const TLS_ENTRY_MIN: u32 = 12;

impl Process {
    /// A new process with no descriptors yet, default limits and an empty
    /// address space; `cwd` is resolved in `fs` (it must be a directory).
    /// [`process_started`](super::process_started) gives it the standard
    /// descriptors once it is loaded. The loader then adds the image and stack areas and
    /// calls [`Process::set_brk_start`].
    pub fn new(
        fs: &Vfs,
        pid: u32,
        ppid: u32,
        comm: &[u8],
        exe: &[u8],
        abi: Abi,
        cwd: &[u8],
    ) -> Result<Process, Errno> {
        let cwd = fs.resolve(super::fs::ROOT, cwd)?;
        if !fs.node(cwd).is_dir() {
            return Err(Errno::ENOTDIR);
        }
        let mut c = [0u8; 16];
        let n = comm.len().min(15);
        c[..n].copy_from_slice(&comm[..n]);
        let mut exe_path = Vec::new();
        exe_path
            .try_reserve(exe.len() + 1)
            .map_err(|_| Errno::ENOMEM)?;
        if !exe.starts_with(b"/") {
            exe_path.push(b'/');
        }
        exe_path.extend_from_slice(exe);
        let inf = Rlimit {
            cur: RLIM_INFINITY,
            max: RLIM_INFINITY,
        };
        let mut rlimits = [inf; rlimit::NLIMITS];
        rlimits[rlimit::STACK] = Rlimit {
            cur: STACK_SIZE,
            max: RLIM_INFINITY,
        };
        rlimits[rlimit::NOFILE] = Rlimit {
            cur: NOFILE_LIMIT,
            max: NOFILE_LIMIT,
        };
        rlimits[rlimit::CORE] = Rlimit {
            cur: 0,
            max: RLIM_INFINITY,
        };
        rlimits[rlimit::MEMLOCK] = Rlimit {
            cur: 8 << 20,
            max: 8 << 20,
        };
        rlimits[rlimit::NPROC] = Rlimit {
            cur: 4096,
            max: 4096,
        };
        // RLIMIT_SIGPENDING (11) and RLIMIT_MSGQUEUE (12), RTPRIO (14).
        rlimits[11] = Rlimit {
            cur: 4096,
            max: 4096,
        };
        rlimits[12] = Rlimit {
            cur: 819_200,
            max: 819_200,
        };
        rlimits[13] = Rlimit { cur: 0, max: 0 };
        rlimits[14] = Rlimit { cur: 0, max: 0 };
        Ok(Process {
            pid,
            ppid,
            comm: c,
            exe: exe_path,
            abi,
            layout: Layout::for_abi(abi),
            cwd,
            umask: 0o022,
            fds: FdTable::default(),
            areas: AreaSet::new(),
            brk_start: 0,
            brk: 0,
            signals: Signals {
                actions: [SigAction::default(); NSIG],
                pending: 0,
            },
            threads: 1,
            rlimits,
            cpu_time_ns: 0,
            start_ns: 0,
            out: [LineBuffer::default(), LineBuffer::default()],
        })
    }

    /// The copy of this process that `fork` makes, as pid `pid` started at
    /// `now_ns`: the same program, memory areas, break, working directory,
    /// umask, limits and signal actions; a descriptor table naming the same
    /// descriptions of `files`; one thread, no pending signals, no CPU time
    /// and empty line buffers.
    pub fn forked(&self, files: &mut Files, pid: u32, now_ns: u64) -> Result<Process, Errno> {
        let mut exe = Vec::new();
        exe.try_reserve(self.exe.len()).map_err(|_| Errno::EAGAIN)?;
        exe.extend_from_slice(&self.exe);
        let fds = files.copy_table(&self.fds).map_err(|_| Errno::EAGAIN)?;
        Ok(Process {
            pid,
            ppid: self.pid,
            comm: self.comm,
            exe,
            abi: self.abi,
            layout: self.layout,
            cwd: self.cwd,
            umask: self.umask,
            fds,
            areas: self.areas.clone(),
            brk_start: self.brk_start,
            brk: self.brk,
            signals: Signals {
                actions: self.signals.actions,
                pending: 0,
            },
            threads: 1,
            rlimits: self.rlimits,
            cpu_time_ns: 0,
            start_ns: now_ns,
            out: [LineBuffer::default(), LineBuffer::default()],
        })
    }

    /// The name as bytes (up to the first NUL).
    pub fn comm(&self) -> &[u8] {
        let n = self.comm.iter().position(|&b| b == 0).unwrap_or(16);
        &self.comm[..n]
    }

    /// Sets where the brk heap starts: the end of the highest loaded
    /// segment (rounded up to a page).
    pub fn set_brk_start(&mut self, image_end: u64) {
        let start = page_round_up(image_end).unwrap_or(image_end);
        self.brk_start = start;
        self.brk = start;
    }

    /// Whether the process is 64-bit.
    pub fn wide(&self) -> bool {
        self.abi == Abi::X86_64
    }

    /// Appends program output to the stream's line buffer and hands every
    /// completed line to the console. Never fails: a line that outgrows
    /// [`LINE_MAX`] (or memory) goes out in pieces.
    pub fn output<M: Machine>(&mut self, m: &mut M, stream: Stream, mut bytes: &[u8]) {
        let buf = &mut self.out[stream as usize].bytes;
        while let Some(nl) = bytes.iter().position(|&b| b == b'\n') {
            let line = &bytes[..nl];
            if buf.is_empty() {
                m.console_line(stream, line, LineEnd::Newline);
            } else {
                Self::append(m, stream, buf, line);
                m.console_line(stream, buf, LineEnd::Newline);
                buf.clear();
            }
            bytes = &bytes[nl + 1..];
        }
        Self::append(m, stream, buf, bytes);
    }

    fn append<M: Machine>(m: &mut M, stream: Stream, buf: &mut Vec<u8>, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let room = LINE_MAX - buf.len();
            let take = bytes.len().min(room);
            if buf.try_reserve(take).is_err() {
                // No memory for the buffer: pass the bytes through.
                if !buf.is_empty() {
                    m.console_line(stream, buf, LineEnd::Overlong);
                    buf.clear();
                }
                m.console_line(stream, bytes, LineEnd::Overlong);
                return;
            }
            buf.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if buf.len() == LINE_MAX {
                m.console_line(stream, buf, LineEnd::Overlong);
                buf.clear();
            }
        }
    }

    /// Hands the last partial line of each stream (stdout first) to the
    /// console as [`LineEnd::Partial`]. The runtime calls it when the
    /// process ends, however it ends.
    pub fn flush_output<M: Machine>(&mut self, m: &mut M) {
        for stream in [Stream::Stdout, Stream::Stderr] {
            let buf = &mut self.out[stream as usize].bytes;
            if !buf.is_empty() {
                m.console_line(stream, buf, LineEnd::Partial);
                buf.clear();
            }
        }
    }
}
