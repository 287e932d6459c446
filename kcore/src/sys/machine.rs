//! The hardware side of the system-call personality: what the runtime
//! provides, as one narrow trait, and the checked user-memory helpers that
//! every handler goes through.
//!
//! Handlers never touch user memory themselves: every user pointer goes
//! through [`Machine::read_user`] or [`Machine::write_user`], which the
//! runtime implements against the calling process's page tables and its
//! [`AreaSet`] (faulting pages in on demand and answering `EFAULT` for
//! anything not mapped with the needed rights). The helpers below bound
//! every copy, so a hostile length never allocates or loops unbounded.

use alloc::vec::Vec;

use super::errno::Errno;
use super::vma::{AreaSet, Prot};

/// An output stream of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stream {
    /// fd 1.
    Stdout,
    /// fd 2.
    Stderr,
}

/// How a line handed to [`Machine::console_line`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineEnd {
    /// The program wrote a newline (not included in the bytes).
    Newline,
    /// The process ended with these bytes and no newline after them
    /// (from [`Process::flush_output`](super::Process::flush_output)): the
    /// runtime prints the partial line and the "did not end with a
    /// newline" notice.
    Partial,
    /// The line grew past the line buffer ([`LINE_MAX`](super::process::LINE_MAX)
    /// bytes) and is handed over in pieces; more of the same line follows.
    Overlong,
}

/// One entry of an i386 process's thread-local-storage GDT slots
/// (`struct user_desc` as set by `set_thread_area`), decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TlsEntry {
    /// Segment base.
    pub base: u32,
    /// Segment limit (in pages when `limit_in_pages`).
    pub limit: u32,
    /// `seg_32bit`.
    pub seg_32bit: bool,
    /// `contents` (0 data, 1 stack, 2 code).
    pub contents: u8,
    /// `read_exec_only`.
    pub read_exec_only: bool,
    /// `limit_in_pages`.
    pub limit_in_pages: bool,
    /// `seg_not_present`.
    pub seg_not_present: bool,
    /// `useable`.
    pub useable: bool,
}

/// What the runtime provides to the system calls of the process that made
/// the call (the "current" process: its page tables are loaded).
pub trait Machine {
    /// Copies `buf.len()` bytes of user memory at `addr` into `buf`.
    /// `EFAULT` if any byte is not mapped readable in `areas` (the
    /// current process's areas), or lies outside user space, or its page
    /// cannot be brought in. Zero-length copies succeed.
    fn read_user(&mut self, areas: &AreaSet, addr: u64, buf: &mut [u8]) -> Result<(), Errno>;

    /// Copies `buf` to user memory at `addr`; `EFAULT` as for
    /// [`Machine::read_user`], for pages not mapped writable. A copy that
    /// faults part-way may have written a prefix (as Linux).
    fn write_user(&mut self, areas: &AreaSet, addr: u64, buf: &[u8]) -> Result<(), Errno>;

    /// Drops the present pages of `[start, end)` (page-aligned): the
    /// range was unmapped, replaced (MAP_FIXED) or discarded
    /// (MADV_DONTNEED, brk shrink). Frames are freed; a later touch
    /// faults the page in afresh from the areas.
    fn discard_pages(&mut self, start: u64, end: u64);

    /// Gives the present pages of `[start, end)` (page-aligned) the
    /// rights `prot` (`mprotect`); pages not yet present get them when
    /// they fault in, from the areas.
    fn protect_pages(&mut self, start: u64, end: u64, prot: Prot);

    /// Prints one line of the current process's output (without its
    /// newline). The `[NAME]` prefixes are the runtime's.
    fn console_line(&mut self, stream: Stream, line: &[u8], end: LineEnd);

    /// Monotonic time since boot, in nanoseconds.
    fn monotonic_ns(&mut self) -> u64;

    /// Wall-clock time (Unix epoch), in nanoseconds.
    fn realtime_ns(&mut self) -> u64;

    /// Fills `buf` with random bytes (RDRAND or a seeded generator).
    fn random_bytes(&mut self, buf: &mut [u8]);

    /// Loads the current process's FS base (`arch_prctl(ARCH_SET_FS)`);
    /// the runtime also restores [`Process::fs_base`](super::Process::fs_base)
    /// on every switch to the process.
    fn set_fs_base(&mut self, base: u64);

    /// Ends the futex wait of thread `tid` (of any process): it runs again
    /// with 0 in `rax`. Called for each thread a futex wake takes from
    /// the [`FutexTable`](super::futex::FutexTable).
    fn wake_thread(&mut self, tid: u32);

    /// The process's ITIMER_REAL as (ns left, interval ns), 0 ns left when
    /// disarmed; with `Some((value, interval))` it is set anew first
    /// (value 0 disarms). When it runs out the runtime sends the process
    /// SIGALRM and re-arms it with the interval.
    fn itimer_real(&mut self, set: Option<(u64, u64)>) -> (u64, u64);

    /// Makes signal `sig` pending for thread `tid` of the current process
    /// (`tgkill`; 0 only checks that the thread lives): `ESRCH` when no
    /// such thread runs. A thread that waits (a futex, a sleep) and does
    /// not block `sig` stops waiting with `-EINTR`; the result says
    /// whether it did, so that its futex wait can be cancelled.
    fn signal_thread(&mut self, tid: u32, sig: u8) -> Result<bool, super::errno::Errno>;

    /// Makes signal `sig` (1..=64) pending for process `pid`, another
    /// process than the caller's (`kill`): one of its threads that does
    /// not block it takes it, as on Linux. Returns the tid of a thread
    /// that stopped waiting for it (its futex wait is cancelled), if any.
    /// A process that has no live thread (a zombie) takes nothing.
    fn signal_process(&mut self, pid: u32, sig: u8) -> Option<u32>;

    /// How many CPUs are up (1 to 64): `sched_getaffinity` reports them.
    fn online_cpus(&self) -> u32;

    /// The CPU the calling thread runs on now (`getcpu`; 0 to
    /// [`online_cpus`](Machine::online_cpus) - 1).
    fn current_cpu(&self) -> u32;

    /// The CPUs thread `tid` (of any process: every program runs as root)
    /// may run on (bit n: CPU n; every CPU that is up unless it was
    /// narrowed): `ESRCH` when no such thread lives.
    fn affinity(&self, tid: u32) -> Result<u64, super::errno::Errno>;

    /// Lets thread `tid` (of any process) run only on the CPUs of `mask`
    /// (not empty, only CPUs that are up): `ESRCH` when no such thread
    /// lives. A thread outside the mask moves to a CPU in it; the
    /// result says whether the calling thread itself must leave the CPU it
    /// runs on (the caller then yields, so it returns on an allowed CPU).
    fn set_affinity(&mut self, tid: u32, mask: u64) -> Result<bool, super::errno::Errno>;

    /// Installs the current process's i386 TLS GDT slots
    /// (`set_thread_area`); the runtime also installs
    /// [`Process::tls`](super::Process::tls) on every switch.
    fn set_tls(&mut self, tls: &[Option<TlsEntry>; 3]);
}

/// The largest chunk copied through a kernel buffer at once.
pub const CHUNK: usize = 4096;

/// Reads a fixed-size value of user memory.
pub fn read_array<M: Machine, const N: usize>(
    m: &mut M,
    areas: &AreaSet,
    addr: u64,
) -> Result<[u8; N], Errno> {
    let mut b = [0u8; N];
    m.read_user(areas, addr, &mut b)?;
    Ok(b)
}

/// Reads a little-endian `u32` of user memory.
pub fn read_u32<M: Machine>(m: &mut M, areas: &AreaSet, addr: u64) -> Result<u32, Errno> {
    Ok(u32::from_le_bytes(read_array(m, areas, addr)?))
}

/// Reads a little-endian `u64` of user memory.
pub fn read_u64<M: Machine>(m: &mut M, areas: &AreaSet, addr: u64) -> Result<u64, Errno> {
    Ok(u64::from_le_bytes(read_array(m, areas, addr)?))
}

/// Reads a pointer-sized word (`u32` for i386, `u64` for x86_64).
pub fn read_word<M: Machine>(
    m: &mut M,
    areas: &AreaSet,
    addr: u64,
    wide: bool,
) -> Result<u64, Errno> {
    if wide {
        read_u64(m, areas, addr)
    } else {
        read_u32(m, areas, addr).map(u64::from)
    }
}

/// Reads a NUL-terminated string of at most `max` bytes (NUL excluded)
/// from user memory. `ENAMETOOLONG` if no NUL comes within `max` bytes,
/// `EFAULT` if the string runs into unmapped memory, `ENOMEM` if the
/// buffer cannot be allocated. Reads page by page, so a string that ends
/// just before an unmapped page is read fine.
pub fn read_cstr<M: Machine>(
    m: &mut M,
    areas: &AreaSet,
    addr: u64,
    max: usize,
) -> Result<Vec<u8>, Errno> {
    let mut out = Vec::new();
    let mut at = addr;
    loop {
        // Up to the end of the page, so no read crosses into a page that
        // the string does not reach.
        let in_page = (4096 - (at % 4096)) as usize;
        let mut buf = [0u8; 4096];
        let chunk = &mut buf[..in_page];
        m.read_user(areas, at, chunk)?;
        if let Some(nul) = chunk.iter().position(|&b| b == 0) {
            if out.len() + nul > max {
                return Err(Errno::ENAMETOOLONG);
            }
            out.try_reserve(nul).map_err(|_| Errno::ENOMEM)?;
            out.extend_from_slice(&chunk[..nul]);
            return Ok(out);
        }
        if out.len() + in_page > max {
            return Err(Errno::ENAMETOOLONG);
        }
        out.try_reserve(in_page).map_err(|_| Errno::ENOMEM)?;
        out.extend_from_slice(chunk);
        at = at.checked_add(in_page as u64).ok_or(Errno::EFAULT)?;
    }
}
