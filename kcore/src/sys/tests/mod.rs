//! Host tests of the personality: real handler paths driven through a
//! fake [`Machine`] whose user memory is built from the process's memory
//! areas (pages fault in from [`AreaSet::page_content`] on first touch and
//! are checked against the areas' rights on every access).

mod calls;
mod copies;
mod efault;
mod events;
mod exec;
mod fuzz;
mod procfiles;
mod procs;
mod restart;
mod signals;
mod sigwait;
mod sockets;
mod startup;
mod threads;

use std::collections::BTreeMap;
use std::vec::Vec;

use super::machine::{LineEnd, Machine, Stream, TlsEntry};
use super::vma::{Area, AreaKind, AreaSet, Backing, FileData, PAGE_SIZE, Prot};
use super::{Abi, Action, Errno, Process, System, Thread, Vfs, syscall, table};

/// The fake hardware: a page-granular user memory, a console log, clocks
/// that advance on every read, a xorshift random source.
#[derive(Debug, Default)]
pub(crate) struct Fake {
    pages: BTreeMap<u64, Box<[u8; 4096]>>,
    pub console: Vec<(Stream, Vec<u8>, LineEnd)>,
    pub mono: u64,
    pub real: u64,
    rng: u64,
    pub fs_base: u64,
    pub tls: Option<[Option<TlsEntry>; 3]>,
    pub discarded: Vec<(u64, u64)>,
    pub protected: Vec<(u64, u64, Prot)>,
    /// When non-zero, the most pages the fake brings in; past it an
    /// access is `EFAULT`, as when the runtime cannot bring a page in.
    pub page_budget: usize,
    /// Threads whose futex wait a wake ended, in order.
    pub woken: Vec<u32>,
    /// Other live threads of the process (for `tgkill`).
    pub threads: Vec<u32>,
    /// Signals sent to other threads, in order.
    pub signalled: Vec<(u32, u8)>,
    /// (pid, signal) of each `kill` of another process.
    pub process_signals: Vec<(u32, u8)>,
    /// ITIMER_REAL as (left, interval) ns.
    pub itimer: (u64, u64),
    /// CPUs up, less one (so that the default is one CPU).
    pub more_cpus: u32,
    /// The CPU the calling thread runs on.
    pub cpu: u32,
    /// Threads whose CPUs were narrowed, with their masks (the others may
    /// run on every CPU).
    pub affinity: BTreeMap<u32, u64>,
}

/// The calling thread's id in [`Env`] (its process's pid too).
pub(crate) const SELF_TID: u32 = 7;

impl Fake {
    fn page<'a>(
        pages: &'a mut BTreeMap<u64, Box<[u8; 4096]>>,
        areas: &AreaSet,
        pg: u64,
    ) -> &'a mut [u8; 4096] {
        pages.entry(pg).or_insert_with(|| {
            let mut b = Box::new([0u8; 4096]);
            areas.page_content(pg * PAGE_SIZE, &mut b);
            b
        })
    }

    fn access(
        &mut self,
        areas: &AreaSet,
        addr: u64,
        len: usize,
        write: bool,
        mut f: impl FnMut(&mut [u8], usize),
    ) -> Result<(), Errno> {
        let end = addr.checked_add(len as u64).ok_or(Errno::EFAULT)?;
        let mut at = addr;
        while at < end {
            let area = areas.find(at).ok_or(Errno::EFAULT)?;
            let ok = if write {
                area.prot.writable()
            } else {
                area.prot.readable()
            };
            if !ok {
                return Err(Errno::EFAULT);
            }
            let pg = at / PAGE_SIZE;
            if self.page_budget != 0
                && self.pages.len() >= self.page_budget
                && !self.pages.contains_key(&pg)
            {
                return Err(Errno::EFAULT);
            }
            let off = (at % PAGE_SIZE) as usize;
            let n = ((PAGE_SIZE as usize) - off).min((end - at) as usize);
            let page = Self::page(&mut self.pages, areas, pg);
            f(&mut page[off..off + n], (at - addr) as usize);
            at += n as u64;
        }
        Ok(())
    }
}

impl Machine for Fake {
    fn read_user(&mut self, areas: &AreaSet, addr: u64, buf: &mut [u8]) -> Result<(), Errno> {
        let len = buf.len();
        self.access(areas, addr, len, false, |page, at| {
            buf[at..at + page.len()].copy_from_slice(page)
        })
    }

    fn write_user(&mut self, areas: &AreaSet, addr: u64, buf: &[u8]) -> Result<(), Errno> {
        self.access(areas, addr, buf.len(), true, |page, at| {
            page.copy_from_slice(&buf[at..at + page.len()])
        })
    }

    fn discard_pages(&mut self, start: u64, end: u64) {
        assert!(start.is_multiple_of(PAGE_SIZE) && end.is_multiple_of(PAGE_SIZE) && start <= end);
        let pgs: Vec<u64> = self
            .pages
            .range(start / PAGE_SIZE..end / PAGE_SIZE)
            .map(|(k, _)| *k)
            .collect();
        for p in pgs {
            self.pages.remove(&p);
        }
        self.discarded.push((start, end));
    }

    fn protect_pages(&mut self, start: u64, end: u64, prot: Prot) {
        self.protected.push((start, end, prot));
    }

    fn console_line(&mut self, stream: Stream, line: &[u8], end: LineEnd) {
        self.console.push((stream, line.to_vec(), end));
    }

    fn online_cpus(&self) -> u32 {
        self.more_cpus + 1
    }

    fn current_cpu(&self) -> u32 {
        self.cpu
    }

    fn affinity(&self, tid: u32) -> Result<u64, Errno> {
        if tid != SELF_TID && !self.threads.contains(&tid) {
            return Err(Errno::ESRCH);
        }
        Ok(self.affinity.get(&tid).copied().unwrap_or(u64::MAX))
    }

    fn set_affinity(&mut self, tid: u32, mask: u64) -> Result<bool, Errno> {
        self.affinity(tid)?;
        self.affinity.insert(tid, mask);
        Ok(tid == SELF_TID && mask & (1 << self.cpu) == 0)
    }

    fn monotonic_ns(&mut self) -> u64 {
        self.mono += 1000;
        self.mono
    }

    fn realtime_ns(&mut self) -> u64 {
        self.real += 1000;
        self.real
    }

    fn random_bytes(&mut self, buf: &mut [u8]) {
        for b in buf {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            *b = self.rng as u8;
        }
    }

    fn set_fs_base(&mut self, base: u64) {
        self.fs_base = base;
    }

    fn set_tls(&mut self, tls: &[Option<TlsEntry>; 3]) {
        self.tls = Some(*tls);
    }

    fn wake_thread(&mut self, tid: u32) {
        self.woken.push(tid);
    }

    fn itimer_real(&mut self, set: Option<(u64, u64)>) -> (u64, u64) {
        let old = self.itimer;
        if let Some(new) = set {
            self.itimer = new;
        }
        old
    }

    fn signal_thread(&mut self, tid: u32, sig: u8) -> Result<bool, Errno> {
        if !self.threads.contains(&tid) {
            return Err(Errno::ESRCH);
        }
        if sig != 0 {
            self.signalled.push((tid, sig));
        }
        Ok(false)
    }

    fn signal_process(&mut self, pid: u32, sig: u8) -> Option<u32> {
        self.process_signals.push((pid, sig));
        None
    }
}

/// The program image the test process has: an RX text page from the
/// archive's `bin/prog` and an RW data page.
pub(crate) const TEXT: u64 = 0x40_0000;
/// A 64 KiB read-write scratch area for test buffers.
pub(crate) const SCRATCH: u64 = 0x1000_0000;
pub(crate) const SCRATCH_LEN: u64 = 0x1_0000;
/// A read-only page.
pub(crate) const RO: u64 = 0x2000_0000;
/// Unmapped.
#[allow(dead_code)] // Used by the EFAULT tests.
pub(crate) const BAD: u64 = 0x3000_0000;

// `open` flags and `AT_FDCWD`, as the calls take them.
pub(crate) const O_WRONLY: u64 = 1;
pub(crate) const O_RDWR: u64 = 2;
pub(crate) const O_CREAT: u64 = 0o100;
pub(crate) const O_EXCL: u64 = 0o200;
pub(crate) const O_TRUNC: u64 = 0o1000;
pub(crate) const O_APPEND: u64 = 0o2000;
pub(crate) const O_NONBLOCK: u64 = 0o4000;
pub(crate) const O_DIRECTORY: u64 = 0o200000;
pub(crate) const O_CLOEXEC: u64 = 0o2000000;
pub(crate) const AT_FDCWD: u64 = -100i64 as u64;

pub(crate) static PROG: [u8; 8192] = {
    let mut d = [0u8; 8192];
    d[0] = 0x7f;
    d[1] = b'E';
    d[2] = b'L';
    d[3] = b'F';
    let mut i = 4096;
    while i < 8192 {
        d[i] = 0xaa;
        i += 1;
    }
    d
};

/// A process with an image, a stack, scratch memory, and the run's state.
pub(crate) struct Env {
    pub m: Fake,
    pub sys: System,
    pub p: Process,
    pub t: Thread,
    pub abi: Abi,
}

pub(crate) fn archive_fs() -> Vfs {
    Vfs::from_archive([
        (&b"bin/prog"[..], 0o100755, &PROG[..]),
        (b"data/input.txt", 0o100644, b"line one\nline two\n"),
        (b"data", 0o040755, b""),
    ])
    .unwrap()
}

impl Env {
    pub fn new(abi: Abi) -> Env {
        Env::with_fs(abi, archive_fs())
    }

    /// The same with its own file system (which must hold `/data`).
    pub fn with_fs(abi: Abi, fs: Vfs) -> Env {
        let mut sys = System::new(fs);
        let mut p =
            Process::new(&sys.fs, SELF_TID, 1, b"prog", b"bin/prog", abi, b"/data").unwrap();
        crate::sys::process_started(&mut sys, &mut p).unwrap();
        let areas = &mut p.areas;
        areas
            .insert(Area {
                start: TEXT,
                end: TEXT + PAGE_SIZE,
                prot: Prot::RX,
                kind: AreaKind::File,
                backing: Backing::File {
                    data: FileData::Static(&PROG),
                    offset: 0,
                    len: 4096,
                },
            })
            .unwrap();
        areas
            .insert(Area::zeroed(
                TEXT + PAGE_SIZE,
                TEXT + 2 * PAGE_SIZE,
                Prot::RW,
                AreaKind::File,
            ))
            .unwrap();
        areas
            .insert(Area::zeroed(
                SCRATCH,
                SCRATCH + SCRATCH_LEN,
                Prot::RW,
                AreaKind::Anon,
            ))
            .unwrap();
        areas
            .insert(Area::zeroed(RO, RO + PAGE_SIZE, Prot::READ, AreaKind::Anon))
            .unwrap();
        let l = p.layout;
        areas
            .insert(Area::zeroed(
                l.stack_bottom(),
                l.stack_top,
                Prot::RW,
                AreaKind::Stack,
            ))
            .unwrap();
        p.set_brk_start(TEXT + 2 * PAGE_SIZE + 100);
        Env {
            m: Fake {
                rng: 0x1234_5678_9abc_def1,
                real: 1_700_000_000 * 1_000_000_000,
                ..Fake::default()
            },
            sys,
            p,
            t: Thread::new(7),
            abi,
        }
    }

    /// Runs a call by Linux name.
    pub fn call(&mut self, name: &str, args: &[u64]) -> Action {
        let n = nr(self.abi, name);
        self.call_nr(n, args)
    }

    pub fn call_nr(&mut self, n: u64, args: &[u64]) -> Action {
        let mut a = [0u64; 6];
        a[..args.len()].copy_from_slice(args);
        syscall(
            &mut self.m,
            &mut self.sys,
            &mut self.p,
            &mut self.t,
            self.abi,
            n,
            a,
        )
    }

    /// Moves the sockets' packets as the runtime does between calls
    /// (a few polls, so a loopback exchange settles), and tells the
    /// process what changed (its woken waiters go to `m.woken`).
    pub fn pump_net(&mut self) {
        for _ in 0..4 {
            let now = self.m.monotonic_ns();
            let changes = self.sys.net.poll(now, None::<&mut smoltcp::phy::Loopback>);
            let (sys, m) = (&mut self.sys, &mut self.m);
            crate::sys::net_changed(sys, &changes, |tid| m.woken.push(tid));
        }
    }

    /// Makes the call the thread waits in again, as the runtime does
    /// before a woken thread runs.
    pub fn resume(&mut self) -> Option<Action> {
        super::resume(&mut self.m, &mut self.sys, &mut self.p, &mut self.t)
    }

    /// Runs a call that must return; the value as a signed number (i386
    /// values are taken as 32-bit).
    pub fn ret(&mut self, name: &str, args: &[u64]) -> i64 {
        match self.call(name, args) {
            Action::Return(v) => match self.abi {
                Abi::X86_64 => v as i64,
                Abi::I386 => v as u32 as i32 as i64,
            },
            other => panic!("{name}: expected a return, got {other:?}"),
        }
    }

    /// Like `ret` but expects an error.
    pub fn err(&mut self, name: &str, args: &[u64]) -> Errno {
        let v = self.ret(name, args);
        assert!(
            (-4095..0).contains(&v),
            "{name}{args:x?}: expected an error, got {v}"
        );
        errno_of(-v)
    }

    /// The user registers of a thread stopped in the middle of the
    /// program text, on the scratch stack.
    pub fn regs(&self) -> super::signal::UserRegs {
        let mut gprs = [0u64; 15];
        for (i, g) in gprs.iter_mut().enumerate() {
            *g = 0x1000 + i as u64;
        }
        super::signal::UserRegs {
            gprs,
            rip: TEXT + 0x10,
            rsp: SCRATCH + 0x8000,
            rflags: 0x246,
            fpu: super::signal::initial_fpu(),
            seg: super::signal::Selectors {
                cs: if self.abi == Abi::I386 {
                    arch_x86::gdt::USER_CODE32
                } else {
                    arch_x86::gdt::USER_CODE64
                },
                ss: arch_x86::gdt::USER_DATA,
                ds: 0,
                es: 0,
                fs: 0,
                gs: 0,
            },
        }
    }

    /// Delivers what the thread can take now, with [`Env::regs`].
    pub fn deliver(&mut self) -> super::signal::Delivery {
        let mut r = self.regs();
        super::signal::deliver(&mut self.m, &mut self.p, &mut self.t, &mut r)
    }

    pub fn poke(&mut self, addr: u64, bytes: &[u8]) {
        self.m.write_user(&self.p.areas, addr, bytes).unwrap();
    }

    pub fn peek(&mut self, addr: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        self.m.read_user(&self.p.areas, addr, &mut b).unwrap();
        b
    }

    pub fn u64_at(&mut self, addr: u64) -> u64 {
        u64::from_le_bytes(self.peek(addr, 8).try_into().unwrap())
    }

    pub fn u32_at(&mut self, addr: u64) -> u32 {
        u32::from_le_bytes(self.peek(addr, 4).try_into().unwrap())
    }

    /// Writes a NUL-terminated string at `addr`; returns `addr`.
    pub fn cstr(&mut self, addr: u64, s: &str) -> u64 {
        let mut b = s.as_bytes().to_vec();
        b.push(0);
        self.poke(addr, &b);
        addr
    }

    /// The complete stdout lines so far.
    pub fn stdout_lines(&self) -> Vec<String> {
        self.m
            .console
            .iter()
            .filter(|(s, _, _)| *s == Stream::Stdout)
            .map(|(_, l, _)| String::from_utf8_lossy(l).into_owned())
            .collect()
    }
}

/// The number of the call Linux names `name` in `abi`.
pub(crate) fn nr(abi: Abi, name: &str) -> u64 {
    (0..600u64)
        .find(|&n| table::name(abi, n) == Some(name))
        .unwrap_or_else(|| panic!("no {abi:?} call {name}"))
}

pub(crate) fn errno_of(n: i64) -> Errno {
    use Errno::*;
    for e in [
        EPERM,
        ENOENT,
        ESRCH,
        EINTR,
        EIO,
        ENXIO,
        E2BIG,
        ENOEXEC,
        EBADF,
        ECHILD,
        EAGAIN,
        ENOMEM,
        EACCES,
        EFAULT,
        EBUSY,
        EEXIST,
        EXDEV,
        ENODEV,
        ENOTDIR,
        EISDIR,
        EINVAL,
        ENFILE,
        EMFILE,
        ENOTTY,
        EFBIG,
        ENOSPC,
        ESPIPE,
        EROFS,
        EMLINK,
        EPIPE,
        ERANGE,
        ENAMETOOLONG,
        ENOSYS,
        ENOTEMPTY,
        ELOOP,
        EOVERFLOW,
        EOPNOTSUPP,
        ETIMEDOUT,
        EDOM,
        ENOTSOCK,
        EDESTADDRREQ,
        EMSGSIZE,
        EPROTOTYPE,
        ENOPROTOOPT,
        EPROTONOSUPPORT,
        ESOCKTNOSUPPORT,
        EAFNOSUPPORT,
        EADDRINUSE,
        EADDRNOTAVAIL,
        ENETUNREACH,
        ECONNABORTED,
        ECONNRESET,
        EISCONN,
        ENOTCONN,
        ECONNREFUSED,
        EALREADY,
        EINPROGRESS,
        ENOBUFS,
    ] {
        if e.number() as i64 == n {
            return e;
        }
    }
    panic!("unknown errno {n}")
}
