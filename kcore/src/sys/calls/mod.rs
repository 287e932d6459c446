//! The system-call handlers and the dispatcher that decodes each call's
//! arguments per ABI.
//!
//! Files: `file` (descriptors, I/O, paths, stat), `mem` (brk, mmap and
//! friends), `task` (identity, limits, TLS, signals), `time` (clocks,
//! sleeping, futex, randomness, scheduling).

mod copy;
mod event;
pub(crate) mod file;
mod mem;
mod net;
mod procfs;
pub(crate) mod task;
pub(crate) mod time;

use alloc::vec::Vec;

use super::errno::{Errno, SysResult};
use super::fs::{PATH_MAX, Vfs};
use super::futex::FutexTable;
use super::machine::{self, Machine};
use super::process::{Process, Thread};
use super::table::Sys;
use super::{Abi, Action};

/// Everything a handler works with.
pub(crate) struct Ctx<'a, M: Machine> {
    pub m: &'a mut M,
    pub fs: &'a mut Vfs,
    /// Every thread waiting on a futex.
    pub futex: &'a mut FutexTable,
    /// The run's unimplemented calls (and unsupported forms of known ones).
    pub unknown: &'a mut super::UnknownCalls,
    pub p: &'a mut Process,
    /// The calling thread.
    pub t: &'a mut Thread,
    pub abi: Abi,
    /// (total, free) RAM for sysinfo.
    pub ram: (u64, u64),
    /// The threads waiting on files.
    pub waits: &'a mut super::wait::WaitList,
    /// The run's sockets.
    pub net: &'a mut super::net::Net,
    /// The run's open file descriptions (`p.fds` names some of them).
    pub files: &'a mut super::fd::Files,
    /// The run's processes: parents, groups, sessions, zombies.
    pub procs: &'a mut super::procs::Procs,
    /// Programs `execve` refused, for the run's summary.
    pub execs: &'a mut super::exec::Refusals,
    /// When the call is made again after a wait ([`super::resume`]): the
    /// deadline it first computed.
    pub resumed: Option<Option<u64>>,
}

impl<M: Machine> Ctx<'_, M> {
    /// Whether the call came in through the 64-bit ABI.
    pub fn wide(&self) -> bool {
        self.abi == Abi::X86_64
    }

    /// Copies user memory in.
    pub fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), Errno> {
        self.m.read_user(&self.p.areas, addr, buf)
    }

    /// Copies to user memory.
    pub fn write(&mut self, addr: u64, buf: &[u8]) -> Result<(), Errno> {
        self.m.write_user(&self.p.areas, addr, buf)
    }

    /// Reads a fixed-size block of user memory.
    pub fn read_array<const N: usize>(&mut self, addr: u64) -> Result<[u8; N], Errno> {
        machine::read_array(self.m, &self.p.areas, addr)
    }

    /// Writes a pointer-sized word of the caller's ABI.
    pub fn write_word(&mut self, addr: u64, v: u64) -> Result<(), Errno> {
        if self.wide() {
            self.write(addr, &v.to_le_bytes())
        } else {
            self.write(addr, &(v as u32).to_le_bytes())
        }
    }

    /// Reads a path argument (`ENAMETOOLONG` past `PATH_MAX`).
    pub fn path(&mut self, addr: u64) -> Result<Vec<u8>, Errno> {
        machine::read_cstr(self.m, &self.p.areas, addr, PATH_MAX - 1)
    }

    /// The wall clock, for file times.
    pub fn now(&mut self) -> u64 {
        self.m.realtime_ns()
    }

    /// Something happened to `obj` that may make it ready for `key`
    /// (`EPOLL*` bits, 0 for anything): its epoll entries join their
    /// ready lists and every thread waiting on a file looks again, in
    /// every process (another process may hold the same pipe).
    pub fn changed(&mut self, obj: super::event::Obj, key: u32) {
        self.files.event(obj, key);
        self.waits.wake_all(self.m);
    }

    /// The signal mask at `addr` that `ppoll`, `pselect6` and
    /// `epoll_pwait` wait with: it replaces the thread's until the call
    /// returns (then the old one is back) or a
    /// signal's handler runs (whose frame keeps the old one). A call made
    /// again after a wait has it already.
    pub fn wait_mask(&mut self, addr: u64) -> Result<(), Errno> {
        let m = u64::from_le_bytes(self.read_array(addr)?);
        if self.resumed.is_none() {
            self.t.saved_sigmask = Some(self.t.sigmask);
            // SIGKILL and SIGSTOP cannot be blocked.
            self.t.sigmask = m & !((1 << 8) | (1 << 18));
        }
        Ok(())
    }

    /// Nothing is ready: return 0 when the timeout (`None`: none) ran
    /// out, or wait. A call made again after a wait keeps its first
    /// deadline.
    pub fn wait_or_time_out(&mut self, timeout_ns: Option<u64>) -> Action {
        let now = self.m.monotonic_ns();
        let until = match self.resumed {
            Some(u) => u,
            None if timeout_ns == Some(0) => return Action::Return(0),
            None => timeout_ns.map(|ns| now.saturating_add(ns)),
        };
        match until {
            Some(u) if now >= u => Action::Return(0),
            _ => Action::Wait { until_ns: until },
        }
    }

    /// `EFAULT` unless `[addr, addr + len)` lies inside the caller's user
    /// space (Linux's `access_ok`); a cheap bound check before long copies.
    pub fn access_ok(&self, addr: u64, len: u64) -> Result<(), Errno> {
        match addr.checked_add(len) {
            Some(end) if end <= self.p.layout.user_top => Ok(()),
            _ if len == 0 => Ok(()),
            _ => Err(Errno::EFAULT),
        }
    }
}

/// A descriptor argument: Linux takes `unsigned int fd`, so only the low
/// 32 bits count (in both ABIs).
pub(crate) fn fd_arg(a: u64) -> u64 {
    a & 0xffff_ffff
}

/// A signed `int` argument (dirfd, flags compared as int).
pub(crate) fn int_arg(a: u64) -> i32 {
    a as u32 as i32
}

/// A signed `long` argument of the caller's ABI.
pub(crate) fn long_arg(abi: Abi, a: u64) -> i64 {
    match abi {
        Abi::X86_64 => a as i64,
        Abi::I386 => a as u32 as i32 as i64,
    }
}

/// A 64-bit value passed as two 32-bit halves (i386 `pread64` etc.).
pub(crate) fn hilo(lo: u64, hi: u64) -> u64 {
    (lo & 0xffff_ffff) | (hi << 32)
}

fn ret(r: SysResult) -> Result<Action, Errno> {
    r.map(Action::Return)
}

/// Runs the handler `call` for the decoded arguments.
pub(crate) fn dispatch<M: Machine>(
    c: &mut Ctx<'_, M>,
    call: Sys,
    nr: u64,
    a: [u64; 6],
) -> Result<Action, Errno> {
    let wide = c.wide();
    let abi = c.abi;
    use Sys::*;
    match call {
        // Sockets: a read or write of one is a receive or send.
        Read | Readv | Write | Writev if net::is_socket(c, fd_arg(a[0])) => net::rw(c, call, a),
        Socket => ret(net::socket(c, a[0], a[1], a[2])),
        Socketpair => ret(net::socketpair(c, a[0])),
        Bind => ret(net::bind(c, a[0], a[1], a[2])),
        Listen => ret(net::listen(c, a[0], a[1])),
        Accept => net::accept4(c, a[0], a[1], a[2], 0),
        Accept4 => net::accept4(c, a[0], a[1], a[2], a[3]),
        Connect => net::connect(c, a[0], a[1], a[2]),
        Getsockname => ret(net::sockname(c, a[0], a[1], a[2], false)),
        Getpeername => ret(net::sockname(c, a[0], a[1], a[2], true)),
        Shutdown => ret(net::shutdown(c, a[0], a[1])),
        Sendto => net::sendto(c, a),
        Recvfrom => net::recvfrom(c, a),
        Sendmsg => net::sendmsg(c, a[0], a[1], a[2]),
        Recvmsg => net::recvmsg(c, a[0], a[1], a[2]),
        Sendmmsg => net::mmsg(c, a[0], a[1], a[2], a[3], true),
        Recvmmsg => net::mmsg(c, a[0], a[1], a[2], a[3], false),
        Setsockopt => ret(net::setsockopt(c, a)),
        Getsockopt => ret(net::getsockopt(c, a)),
        Socketcall => net::socketcall(c, a[0], a[1]),
        // Descriptors and I/O. A pipe or an eventfd may make a non-empty
        // transfer wait.
        Read | Readv | Write | Writev
            if a[2] != 0
                && let Some(wait) = file::io_wait(
                    c,
                    fd_arg(a[0]),
                    matches!(call, Write | Writev),
                    (call == Write).then_some(a[1]),
                    if call == Write { a[2] } else { u64::MAX },
                ) =>
        {
            Ok(wait)
        }
        Read => ret(file::read(c, fd_arg(a[0]), a[1], a[2])),
        Write => ret(file::write(c, fd_arg(a[0]), a[1], a[2])),
        Readv => ret(file::readv(c, fd_arg(a[0]), a[1], a[2], None)),
        Writev => ret(file::writev(c, fd_arg(a[0]), a[1], a[2], None)),
        Pipe => ret(file::pipe2(c, a[0], 0)),
        Pipe2 => ret(file::pipe2(c, a[0], a[1] as u32)),
        // In-kernel copies: i386 `sendfile` has a 32-bit offset, its
        // `sendfile64` and x86_64's a 64-bit one.
        Sendfile | Sendfile64 => copy::sendfile(
            c,
            fd_arg(a[0]),
            fd_arg(a[1]),
            copy::OffsetArg::new(a[2], wide || call == Sendfile64),
            if wide { a[3] } else { a[3] & 0xffff_ffff },
        ),
        CopyFileRange => ret(copy::copy_file_range(
            c,
            fd_arg(a[0]),
            a[1],
            fd_arg(a[2]),
            a[3],
            if wide { a[4] } else { a[4] & 0xffff_ffff },
            a[5] & 0xffff_ffff,
        )),
        Pread64 | Pwrite64 => {
            let off = if wide { a[3] } else { hilo(a[3], a[4]) } as i64;
            if off < 0 {
                return Err(Errno::EINVAL);
            }
            if call == Pread64 {
                ret(file::pread(c, fd_arg(a[0]), a[1], a[2], off as u64))
            } else {
                ret(file::pwrite(c, fd_arg(a[0]), a[1], a[2], off as u64))
            }
        }
        Preadv | Pwritev => {
            let off = if wide { a[3] } else { hilo(a[3], a[4]) } as i64;
            if off < 0 {
                return Err(Errno::EINVAL);
            }
            if call == Preadv {
                ret(file::readv(c, fd_arg(a[0]), a[1], a[2], Some(off as u64)))
            } else {
                ret(file::writev(c, fd_arg(a[0]), a[1], a[2], Some(off as u64)))
            }
        }
        Open => ret(file::openat(
            c,
            file::AT_FDCWD,
            a[0],
            a[1] as u32,
            a[2] as u32,
        )),
        Openat => ret(file::openat(
            c,
            int_arg(a[0]),
            a[1],
            a[2] as u32,
            a[3] as u32,
        )),
        Creat => ret(file::openat(
            c,
            file::AT_FDCWD,
            a[0],
            0o1101, // O_CREAT | O_WRONLY | O_TRUNC
            a[1] as u32,
        )),
        Close => ret(file::close(c, fd_arg(a[0]))),
        Lseek => ret(file::lseek(
            c,
            fd_arg(a[0]),
            long_arg(abi, a[1]),
            a[2] as u32,
        )),
        Llseek => ret(file::llseek(
            c,
            fd_arg(a[0]),
            hilo(a[2], a[1]),
            a[3],
            a[4] as u32,
        )),
        Fstat | Fstat32 | Fstat64 => ret(file::fstat(c, fd_arg(a[0]), a[1], file::layout_of(call))),
        Stat | Stat32 | Stat64 => ret(file::stat_path(
            c,
            file::AT_FDCWD,
            a[0],
            a[1],
            0,
            file::layout_of(call),
        )),
        Lstat | Lstat32 | Lstat64 => ret(file::stat_path(
            c,
            file::AT_FDCWD,
            a[0],
            a[1],
            file::AT_SYMLINK_NOFOLLOW,
            file::layout_of(call),
        )),
        Newfstatat | Fstatat64 => ret(file::stat_path(
            c,
            int_arg(a[0]),
            a[1],
            a[2],
            a[3] as u32,
            file::layout_of(call),
        )),
        Statx => ret(file::statx(c, int_arg(a[0]), a[1], a[2] as u32, a[4])),
        Getdents64 => ret(file::getdents64(c, fd_arg(a[0]), a[1], a[2])),
        Fcntl => ret(file::fcntl(c, fd_arg(a[0]), a[1] as u32, a[2])),
        Dup => ret(file::dup(c, fd_arg(a[0]))),
        Dup2 => ret(file::dup3(c, fd_arg(a[0]), fd_arg(a[1]), 0, true)),
        Dup3 => ret(file::dup3(
            c,
            fd_arg(a[0]),
            fd_arg(a[1]),
            a[2] as u32,
            false,
        )),
        Ioctl => ret(file::ioctl(c, fd_arg(a[0]), a[1] as u32, a[2])),
        Poll => {
            let t = int_arg(a[2]);
            let timeout = if t < 0 {
                None
            } else {
                Some(t as u64 * 1_000_000)
            };
            file::poll(c, a[0], a[1], timeout)
        }
        Ppoll | Ppoll64 => {
            let timeout = if a[2] == 0 {
                None
            } else {
                Some(time::read_duration(c, a[2], wide || call == Ppoll64)?)
            };
            if a[3] != 0 {
                if a[4] != 8 {
                    return Err(Errno::EINVAL);
                }
                c.wait_mask(a[3])?;
            }
            file::poll(c, a[0], a[1], timeout)
        }
        Select | OldSelect => {
            let a = if call == OldSelect {
                // i386 `select(struct sel_arg_struct *)`: five words.
                let b: [u8; 20] = c.read_array(a[0])?;
                let w = |i: usize| {
                    u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]) as u64
                };
                [w(0), w(1), w(2), w(3), w(4), 0]
            } else {
                a
            };
            let timeout = if a[4] == 0 {
                None
            } else {
                let (s, us) = if wide {
                    let t = super::uapi::Timeval64::from_bytes(&c.read_array(a[4])?);
                    (t.tv_sec, t.tv_usec)
                } else {
                    let t = super::uapi::Timeval32::from_bytes(&c.read_array(a[4])?);
                    (t.tv_sec.into(), t.tv_usec.into())
                };
                if s < 0 || !(0..1_000_000).contains(&us) {
                    return Err(Errno::EINVAL);
                }
                Some(
                    (s as u64)
                        .saturating_mul(1_000_000_000)
                        .saturating_add(us as u64 * 1000),
                )
            };
            let action = file::select(c, int_arg(a[0]), [a[1], a[2], a[3]], timeout)?;
            if a[4] != 0 && action == Action::Return(0) {
                // The time left, which is none when the timeout runs out.
                let zero = [0u8; 16];
                c.write(a[4], &zero[..if wide { 16 } else { 8 }])?;
            }
            Ok(action)
        }
        Pselect6 | Pselect6Time64 => {
            let timeout = if a[4] == 0 {
                None
            } else {
                Some(time::read_duration(
                    c,
                    a[4],
                    wide || call == Pselect6Time64,
                )?)
            };
            if a[5] != 0 {
                // { const sigset_t *ss; size_t ss_len; }
                let word = if wide { 8 } else { 4 };
                let p = machine::read_word(c.m, &c.p.areas, a[5], wide)?;
                let len = machine::read_word(c.m, &c.p.areas, a[5] + word, wide)?;
                if p != 0 {
                    if len != 8 {
                        return Err(Errno::EINVAL);
                    }
                    c.wait_mask(p)?;
                }
            }
            file::select(c, int_arg(a[0]), [a[1], a[2], a[3]], timeout)
        }
        Eventfd => ret(event::eventfd2(c, a[0] as u32, 0)),
        Eventfd2 => ret(event::eventfd2(c, a[0] as u32, a[1] as u32)),
        EpollCreate => {
            if int_arg(a[0]) <= 0 {
                return Err(Errno::EINVAL);
            }
            ret(event::epoll_create1(c, 0))
        }
        EpollCreate1 => ret(event::epoll_create1(c, a[0] as u32)),
        EpollCtl => ret(event::epoll_ctl(
            c,
            fd_arg(a[0]),
            a[1] as u32,
            fd_arg(a[2]),
            a[3],
        )),
        EpollWait | EpollPwait | EpollPwait2 => {
            let timeout = if call == EpollPwait2 {
                if a[3] == 0 {
                    None
                } else {
                    Some(time::read_duration(c, a[3], true)?)
                }
            } else {
                let t = int_arg(a[3]);
                (t >= 0).then(|| t as u64 * 1_000_000)
            };
            if call != EpollWait && a[4] != 0 {
                if a[5] != 8 {
                    return Err(Errno::EINVAL);
                }
                c.wait_mask(a[4])?;
            }
            event::epoll_wait(c, fd_arg(a[0]), a[1], int_arg(a[2]), timeout)
        }
        Access => ret(file::faccessat(c, file::AT_FDCWD, a[0], a[1] as u32, 0)),
        Faccessat => ret(file::faccessat(c, int_arg(a[0]), a[1], a[2] as u32, 0)),
        Faccessat2 => ret(file::faccessat(
            c,
            int_arg(a[0]),
            a[1],
            a[2] as u32,
            a[3] as u32,
        )),
        Readlink => ret(file::readlinkat(c, file::AT_FDCWD, a[0], a[1], a[2])),
        Readlinkat => ret(file::readlinkat(c, int_arg(a[0]), a[1], a[2], a[3])),
        Getcwd => ret(file::getcwd(c, a[0], a[1])),
        Chdir => ret(file::chdir(c, a[0])),
        Fchdir => ret(file::fchdir(c, fd_arg(a[0]))),
        Mkdir => ret(file::mkdirat(c, file::AT_FDCWD, a[0], a[1] as u32)),
        Mkdirat => ret(file::mkdirat(c, int_arg(a[0]), a[1], a[2] as u32)),
        Unlink => ret(file::unlinkat(c, file::AT_FDCWD, a[0], 0)),
        Rmdir => ret(file::unlinkat(c, file::AT_FDCWD, a[0], file::AT_REMOVEDIR)),
        Unlinkat => ret(file::unlinkat(c, int_arg(a[0]), a[1], a[2] as u32)),
        Rename => ret(file::renameat(
            c,
            file::AT_FDCWD,
            a[0],
            file::AT_FDCWD,
            a[1],
            0,
        )),
        Renameat => ret(file::renameat(
            c,
            int_arg(a[0]),
            a[1],
            int_arg(a[2]),
            a[3],
            0,
        )),
        Renameat2 => ret(file::renameat(
            c,
            int_arg(a[0]),
            a[1],
            int_arg(a[2]),
            a[3],
            a[4] as u32,
        )),
        Ftruncate => ret(file::ftruncate(c, fd_arg(a[0]), long_arg(abi, a[1]))),
        Ftruncate64 => ret(file::ftruncate(c, fd_arg(a[0]), hilo(a[1], a[2]) as i64)),
        Truncate => ret(file::truncate(c, a[0], long_arg(abi, a[1]))),
        Truncate64 => ret(file::truncate(c, a[0], hilo(a[1], a[2]) as i64)),
        Fsync => ret(file::fsync(c, fd_arg(a[0]))),
        Umask => {
            let old = c.p.umask;
            c.p.umask = a[0] as u32 & 0o777;
            ret(Ok(old as u64))
        }
        Chmod => ret(file::chmodat(c, file::AT_FDCWD, a[0], a[1] as u32)),
        Fchmodat => ret(file::chmodat(c, int_arg(a[0]), a[1], a[2] as u32)),
        Fchmod => ret(file::fchmod(c, fd_arg(a[0]), a[1] as u32)),
        Utimensat => ret(file::utimensat(
            c,
            int_arg(a[0]),
            a[1],
            a[2],
            a[3] as u32,
            wide,
        )),
        Utimensat64 => ret(file::utimensat(
            c,
            int_arg(a[0]),
            a[1],
            a[2],
            a[3] as u32,
            true,
        )),
        Chown | Lchown => {
            let nofollow = if call == Lchown {
                file::AT_SYMLINK_NOFOLLOW
            } else {
                0
            };
            ret(file::chownat(
                c,
                file::AT_FDCWD,
                Some(a[0]),
                a[1] as u32,
                a[2] as u32,
                nofollow,
            ))
        }
        Fchown => ret(file::chownat(
            c,
            int_arg(a[0]),
            None,
            a[1] as u32,
            a[2] as u32,
            0,
        )),
        Fchownat => ret(file::chownat(
            c,
            int_arg(a[0]),
            Some(a[1]),
            a[2] as u32,
            a[3] as u32,
            a[4] as u32,
        )),
        // The i386 16-bit ids: 0xffff is "unchanged".
        Chown16 | Lchown16 | Fchown16 => {
            let id16 = |v: u64| {
                if v as u16 == u16::MAX {
                    u32::MAX
                } else {
                    v as u16 as u32
                }
            };
            let (uid, gid) = (id16(a[1]), id16(a[2]));
            if call == Fchown16 {
                ret(file::chownat(c, int_arg(a[0]), None, uid, gid, 0))
            } else {
                let nofollow = if call == Lchown16 {
                    file::AT_SYMLINK_NOFOLLOW
                } else {
                    0
                };
                ret(file::chownat(
                    c,
                    file::AT_FDCWD,
                    Some(a[0]),
                    uid,
                    gid,
                    nofollow,
                ))
            }
        }

        // Memory.
        Brk => ret(mem::brk(c, a[0])),
        Mmap => ret(mem::mmap(c, a[0], a[1], a[2], a[3], fd_arg(a[4]), a[5])),
        Mmap2 => ret(mem::mmap(
            c,
            a[0],
            a[1],
            a[2],
            a[3],
            fd_arg(a[4]),
            a[5] << 12,
        )),
        OldMmap => {
            let b = super::uapi::MmapArgs32::from_bytes(&c.read_array(a[0])?);
            ret(mem::mmap(
                c,
                b.addr.into(),
                b.len.into(),
                b.prot.into(),
                b.flags.into(),
                b.fd.into(),
                b.offset.into(),
            ))
        }
        Munmap => ret(mem::munmap(c, a[0], a[1])),
        Mprotect => ret(mem::mprotect(c, a[0], a[1], a[2])),
        Madvise => ret(mem::madvise(c, a[0], a[1], int_arg(a[2]))),
        Mremap => ret(mem::mremap(c, a[0], a[1], a[2], a[3], a[4])),
        Msync => ret(mem::msync(c, a[0], a[1], a[2])),

        // Process identity, limits, TLS.
        Exit => task::exit_thread(c, a[0] as u8),
        ExitGroup => Ok(Action::Exit(a[0] as u8)),
        Clone3 => task::clone3(c, nr, a[0], a[1]),
        Clone => task::clone(
            c,
            nr,
            task::CloneArgs {
                flags: a[0],
                stack: a[1],
                parent_tid: a[2],
                // i386 passes `tls` before `child_tid`.
                child_tid: if wide { a[3] } else { a[4] },
                tls: if wide { a[4] } else { a[3] },
            },
        ),
        Getpid => ret(Ok(c.p.pid.into())),
        Getpgrp => ret(task::getpgid(c, 0, false)),
        Gettid => ret(Ok(c.t.tid.into())),
        Getppid => ret(Ok(c.procs.get(c.p.pid).map_or(c.p.ppid, |e| e.ppid).into())),
        Getpgid => ret(task::getpgid(c, a[0], false)),
        Getsid => ret(task::getpgid(c, a[0], true)),
        Setpgid => ret(task::setpgid(c, a[0], a[1])),
        Setsid => ret(c.procs.setsid(c.p.pid).map(u64::from)),
        // vfork is clone(CLONE_VM | CLONE_VFORK | SIGCHLD), as on Linux.
        Fork | Vfork => Ok(Action::Fork(task::CloneArgs {
            flags: if call == Vfork {
                task::clone_flags::VM | task::clone_flags::VFORK | 17
            } else {
                17
            },
            stack: 0,
            parent_tid: 0,
            child_tid: 0,
            tls: 0,
        })),
        Execve => super::exec::execveat(c, file::AT_FDCWD, a[0], a[1], a[2], 0),
        Execveat => super::exec::execveat(c, int_arg(a[0]), a[1], a[2], a[3], a[4]),
        Wait4 => task::wait4(c, a[0], a[1], a[2], a[3]),
        Waitpid => task::wait4(c, a[0], a[1], a[2], 0),
        Waitid => task::waitid(c, a[0], a[1], a[2], a[3], a[4]),
        Getid => ret(Ok(0)),
        Getresid => {
            // The i386 16-bit getresuid/getresgid (165, 171) write
            // `old_uid_t`s.
            let width = if abi == Abi::I386 && (nr == 165 || nr == 171) {
                2
            } else {
                4
            };
            ret(task::getresid(c, [a[0], a[1], a[2]], width))
        }
        Getgroups => ret(if int_arg(a[0]) < 0 {
            Err(Errno::EINVAL)
        } else {
            Ok(0)
        }),
        Uname => ret(task::uname(c, a[0])),
        ArchPrctl => ret(task::arch_prctl(c, a[0] as u32, a[1])),
        SetThreadArea => ret(task::set_thread_area(c, a[0])),
        GetThreadArea => ret(task::get_thread_area(c, a[0])),
        SetTidAddress => {
            c.t.clear_child_tid = a[0];
            ret(Ok(c.t.tid.into()))
        }
        SetRobustList => {
            if a[1] != if wide { 24 } else { 12 } {
                return Err(Errno::EINVAL);
            }
            c.t.robust_list = (a[0], a[1]);
            ret(Ok(0))
        }
        GetRobustList => ret(task::get_robust_list(c, a[0], a[1], a[2])),
        Rseq | Membarrier => Err(Errno::ENOSYS),
        Prlimit64 => ret(task::prlimit64(c, a[0], a[1] as u32, a[2], a[3])),
        Getrlimit => ret(task::getrlimit(c, a[0] as u32, a[1], false)),
        OldGetrlimit => ret(task::getrlimit(c, a[0] as u32, a[1], true)),
        Setrlimit => ret(task::setrlimit(c, a[0] as u32, a[1])),
        Sysinfo => ret(task::sysinfo(c, a[0])),
        Prctl => ret(task::prctl(c, int_arg(a[0]), a[1])),
        Getrusage => ret(task::getrusage(c, int_arg(a[0]), a[1])),
        Times => ret(task::times(c, a[0])),
        Getcpu => {
            // The CPU, then the NUMA node (one node).
            let cpu = c.m.current_cpu();
            for (p, v) in [(a[0], cpu), (a[1], 0)] {
                if p != 0 {
                    c.write(p, &v.to_le_bytes())?;
                }
            }
            ret(Ok(0))
        }
        Getpriority => ret(task::getpriority(c, a[0], a[1])),
        Setpriority => ret(task::setpriority(c, a[0], a[1], a[2])),
        IoprioGet => ret(task::ioprio_get(c, a[0], a[1])),
        IoprioSet => ret(task::ioprio_set(c, a[0], a[1], a[2])),
        SchedGetscheduler => ret(task::self_pid(c, a[0]).map(|_| 0)),
        SchedGetparam => {
            task::self_pid(c, a[0])?;
            c.write(a[1], &0u32.to_le_bytes())?;
            ret(Ok(0))
        }

        // Signals.
        RtSigaction => ret(task::rt_sigaction(c, a[0], a[1], a[2], a[3])),
        RtSigprocmask => task::rt_sigprocmask(c, int_arg(a[0]), a[1], a[2], a[3]),
        Sigaltstack => ret(task::sigaltstack(c, a[0], a[1])),
        Kill => task::kill(c, int_arg(a[0]), a[1]),
        Tgkill => task::tgkill(c, int_arg(a[0]), int_arg(a[1]), a[2]),
        Tkill => {
            let pid = c.p.pid as i32;
            task::tgkill(c, pid, int_arg(a[0]), a[1])
        }
        RtSigreturn => Ok(Action::SigReturn),
        Sigreturn => Ok(Action::OldSigReturn),

        // Time and scheduling.
        SchedYield => Ok(Action::Yield),
        SchedGetaffinity => ret(time::sched_getaffinity(c, a[0], a[1], a[2])),
        SchedSetaffinity => time::sched_setaffinity(c, a[0], a[1], a[2]),
        Nanosleep => time::nanosleep(c, a[0], wide),
        Setitimer => ret(time::setitimer(c, int_arg(a[0]), a[1], a[2])),
        Getitimer => ret(time::getitimer(c, int_arg(a[0]), a[1])),
        Alarm => ret(time::alarm(c, a[0] as u32)),
        // Until a signal: the runtime ends the wait with EINTR.
        Pause => Ok(Action::Block),
        RtSigsuspend => task::rt_sigsuspend(c, a[0], a[1]),
        RtSigtimedwait => task::rt_sigtimedwait(c, a, wide),
        RtSigtimedwait64 => task::rt_sigtimedwait(c, a, true),
        ClockNanosleep => time::clock_nanosleep(c, int_arg(a[0]), a[1] as u32, a[2], wide),
        ClockNanosleep64 => time::clock_nanosleep(c, int_arg(a[0]), a[1] as u32, a[2], true),
        ClockGettime => ret(time::clock_gettime(c, int_arg(a[0]), a[1], wide)),
        ClockGettime64 => ret(time::clock_gettime(c, int_arg(a[0]), a[1], true)),
        ClockGetres => ret(time::clock_getres(c, int_arg(a[0]), a[1], wide)),
        ClockGetres64 => ret(time::clock_getres(c, int_arg(a[0]), a[1], true)),
        Gettimeofday => ret(time::gettimeofday(c, a[0], a[1])),
        Time => ret(time::time(c, a[0])),
        Getrandom => ret(time::getrandom(c, a[0], a[1], a[2] as u32)),
        Futex => time::futex(c, a, wide),
        Futex64 => time::futex(c, a, true),
    }
}
