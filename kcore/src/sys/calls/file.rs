//! Descriptor, I/O, path and stat handlers.
//!
//! Copies between files and user memory go through a bounded kernel
//! buffer ([`CHUNK`] bytes at a time), and lengths are capped at Linux's
//! `MAX_RW_COUNT`, so a huge length costs neither memory nor a panic. A
//! fault after some bytes were transferred returns the count so far, a
//! fault before any returns `EFAULT` (as Linux).

use alloc::sync::Arc;
use alloc::vec::Vec;

use super::super::errno::{Errno, SysResult};
use super::super::event::{Obj, bits};
use super::super::fd::{OpenFile, PIPE_CAPACITY, Target, oflag};
use super::super::fs::{Content, Device, NodeId, ROOT, mode};
use super::super::machine::{CHUNK, Machine, Stream};
use super::super::table::Sys;
use super::super::uapi::{Iovec32, Iovec64, Pollfd, Stat, Stat32, Stat64, Statx};
use super::super::{Action, Process};
use super::Ctx;

/// `AT_FDCWD`.
pub(crate) const AT_FDCWD: i32 = -100;
/// `AT_SYMLINK_NOFOLLOW`.
pub(crate) const AT_SYMLINK_NOFOLLOW: u32 = 0x100;
/// `AT_REMOVEDIR`.
pub(crate) const AT_REMOVEDIR: u32 = 0x200;
/// `AT_EACCESS`.
const AT_EACCESS: u32 = 0x200;
/// `AT_EMPTY_PATH`.
const AT_EMPTY_PATH: u32 = 0x1000;
/// `AT_NO_AUTOMOUNT` (ignored).
const AT_NO_AUTOMOUNT: u32 = 0x800;
/// `AT_STATX_SYNC_TYPE` bits (ignored).
const AT_STATX_SYNC_TYPE: u32 = 0x6000;

/// Linux's `PIPE_BUF`: pipe writes up to this size are atomic.
const PIPE_BUF: u64 = 4096;
/// Linux's `MAX_RW_COUNT`: the most one read or write transfers.
pub(crate) const MAX_RW_COUNT: u64 = 0x7fff_f000;
/// Linux's `UIO_MAXIOV`.
const IOV_MAX: u64 = 1024;

/// The device number of the file system and of the console.
const FS_DEV: u64 = 0x2a;
const CONSOLE_RDEV: u64 = 136 << 8;

/// Which `struct stat` a call fills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StatLayout {
    /// x86_64 `struct stat`.
    Stat,
    /// i386 `struct stat`.
    Stat32,
    /// i386 `struct stat64`.
    Stat64,
}

/// The layout a stat call of `call` fills.
pub(crate) fn layout_of(call: Sys) -> StatLayout {
    match call {
        Sys::Stat32 | Sys::Lstat32 | Sys::Fstat32 => StatLayout::Stat32,
        Sys::Stat64 | Sys::Lstat64 | Sys::Fstat64 | Sys::Fstatat64 => StatLayout::Stat64,
        _ => StatLayout::Stat,
    }
}

/// What stat reports, before the ABI's layout.
#[derive(Debug, Clone, Copy)]
struct StatInfo {
    dev: u64,
    ino: u64,
    mode: u32,
    nlink: u32,
    rdev: u64,
    size: u64,
    mtime_ns: u64,
}

fn node_info(fs: &super::super::fs::Vfs, p: &Process, id: NodeId) -> StatInfo {
    let n = fs.node(id);
    let size = match n.content {
        Content::SelfExe => p.exe.len() as u64,
        _ => n.size(),
    };
    StatInfo {
        dev: FS_DEV,
        ino: id as u64 + 1,
        mode: n.mode(),
        nlink: if n.is_dir() {
            2
        } else if n.linked {
            1
        } else {
            0
        },
        rdev: n.rdev(),
        size,
        mtime_ns: n.mtime_ns,
    }
}

fn target_info(
    fs: &super::super::fs::Vfs,
    files: &super::super::fd::Files,
    p: &Process,
    t: Target,
) -> StatInfo {
    match t {
        Target::Node(id) => node_info(fs, p, id),
        Target::Stdin | Target::Console(_) => StatInfo {
            dev: 0x16,
            ino: 3,
            mode: mode::S_IFCHR | 0o620,
            nlink: 1,
            rdev: CONSOLE_RDEV,
            size: 0,
            mtime_ns: 0,
        },
        Target::Pipe { id, .. } => StatInfo {
            dev: 0x0c,
            ino: 0x1_0000 + id as u64,
            mode: 0o010600,
            nlink: 1,
            rdev: 0,
            size: files.pipe_ref(id).map_or(0, |p| p.buf.len() as u64),
            mtime_ns: 0,
        },
        // sockfs: a socket, 0777.
        Target::Socket(id) => StatInfo {
            dev: 0x08,
            ino: 0x2_0000 + id as u64,
            mode: 0o140777,
            nlink: 1,
            rdev: 0,
            size: 0,
            mtime_ns: 0,
        },
        // Linux's anonymous inode: no file type, 0600.
        Target::EventFd(_) | Target::Epoll(_) => StatInfo {
            dev: 0x0e,
            ino: 1,
            mode: 0o600,
            nlink: 1,
            rdev: 0,
            size: 0,
            mtime_ns: 0,
        },
    }
}

fn write_stat<M: Machine>(
    c: &mut Ctx<'_, M>,
    buf: u64,
    s: StatInfo,
    layout: StatLayout,
) -> SysResult {
    let secs = (s.mtime_ns / 1_000_000_000) as i64;
    let nsec = (s.mtime_ns % 1_000_000_000) as i64;
    let blocks = s.size.div_ceil(512) as i64;
    match layout {
        StatLayout::Stat => {
            let st = Stat {
                st_dev: s.dev,
                st_ino: s.ino,
                st_nlink: s.nlink.into(),
                st_mode: s.mode,
                st_uid: 0,
                st_gid: 0,
                pad0: 0,
                st_rdev: s.rdev,
                st_size: s.size as i64,
                st_blksize: 4096,
                st_blocks: blocks,
                st_atime: secs,
                st_atime_nsec: nsec,
                st_mtime: secs,
                st_mtime_nsec: nsec,
                st_ctime: secs,
                st_ctime_nsec: nsec,
                unused: [0; 3],
            };
            c.write(buf, &st.to_bytes())?;
        }
        StatLayout::Stat64 => {
            let st = Stat64 {
                st_dev: s.dev,
                pad0: [0; 4],
                st_ino32: s.ino as u32,
                st_mode: s.mode,
                st_nlink: s.nlink,
                st_uid: 0,
                st_gid: 0,
                st_rdev: s.rdev,
                pad3: [0; 4],
                st_size: s.size as i64,
                st_blksize: 4096,
                st_blocks: blocks as u64,
                st_atime: secs as u32,
                st_atime_nsec: nsec as u32,
                st_mtime: secs as u32,
                st_mtime_nsec: nsec as u32,
                st_ctime: secs as u32,
                st_ctime_nsec: nsec as u32,
                st_ino: s.ino,
            };
            c.write(buf, &st.to_bytes())?;
        }
        StatLayout::Stat32 => {
            if s.size > i32::MAX as u64 || s.ino > u32::MAX as u64 {
                return Err(Errno::EOVERFLOW);
            }
            let st = Stat32 {
                st_dev: s.dev as u32,
                st_ino: s.ino as u32,
                st_mode: s.mode as u16,
                st_nlink: s.nlink as u16,
                st_uid: 0,
                st_gid: 0,
                st_rdev: s.rdev as u32,
                st_size: s.size as u32,
                st_blksize: 4096,
                st_blocks: blocks as u32,
                st_atime: secs as u32,
                st_atime_nsec: nsec as u32,
                st_mtime: secs as u32,
                st_mtime_nsec: nsec as u32,
                st_ctime: secs as u32,
                st_ctime_nsec: nsec as u32,
                unused4: 0,
                unused5: 0,
            };
            c.write(buf, &st.to_bytes())?;
        }
    }
    Ok(0)
}

/// The directory a `*at` call resolves relative paths against.
fn base_dir<M: Machine>(c: &Ctx<'_, M>, dirfd: i32, path: &[u8]) -> Result<NodeId, Errno> {
    if path.starts_with(b"/") || dirfd == AT_FDCWD {
        return Ok(c.p.cwd);
    }
    if dirfd < 0 {
        return Err(Errno::EBADF);
    }
    match c.files.get(&c.p.fds, dirfd as u64)?.target {
        Target::Node(id) if c.fs.node(id).is_dir() => Ok(id),
        _ => Err(Errno::ENOTDIR),
    }
}

/// Resolves a path argument, following `/proc/self/exe` to the executable
/// unless `nofollow`.
pub(crate) fn lookup<M: Machine>(
    c: &mut Ctx<'_, M>,
    dirfd: i32,
    path: &[u8],
    nofollow: bool,
) -> Result<NodeId, Errno> {
    let base = base_dir(c, dirfd, path)?;
    let id = c.fs.resolve(base, path)?;
    if !nofollow && matches!(c.fs.node(id).content, Content::SelfExe) {
        return c.fs.resolve(ROOT, &c.p.exe);
    }
    Ok(id)
}

/// `openat(dirfd, path, flags, mode)`.
pub(crate) fn openat<M: Machine>(
    c: &mut Ctx<'_, M>,
    dirfd: i32,
    path: u64,
    flags: u32,
    perm: u32,
) -> SysResult {
    let path = c.path(path)?;
    let acc = flags & oflag::O_ACCMODE;
    if acc == 3 {
        return Err(Errno::EINVAL);
    }
    let writing = acc != oflag::O_RDONLY;
    let base = base_dir(c, dirfd, &path)?;
    let id = if flags & oflag::O_CREAT != 0 {
        if flags & oflag::O_DIRECTORY != 0 {
            return Err(Errno::EINVAL);
        }
        let (dir, name, trailing) = c.fs.resolve_parent(base, &path)?;
        match name {
            None => return Err(Errno::EISDIR),
            Some(name) => match c.fs.child(dir, name)? {
                Some(existing) => {
                    if flags & oflag::O_EXCL != 0 {
                        return Err(Errno::EEXIST);
                    }
                    existing
                }
                None => {
                    if trailing {
                        return Err(Errno::EISDIR);
                    }
                    let now = c.now();
                    let perm = perm & 0o7777 & !c.p.umask;
                    c.fs.link_new(dir, name, Content::Mem(Vec::new()), perm, now)?
                }
            },
        }
    } else {
        c.fs.resolve(base, &path)?
    };
    let id = match c.fs.node(id).content {
        Content::SelfExe => {
            if flags & oflag::O_NOFOLLOW != 0 {
                return Err(Errno::ELOOP);
            }
            c.fs.resolve(ROOT, &c.p.exe)?
        }
        // A `/proc` file: this open reads its text as it is now.
        Content::Proc(f) if flags & oflag::O_PATH == 0 => {
            if writing {
                return Err(Errno::EACCES);
            }
            let text = super::procfs::text(c, f)?;
            c.fs.snapshot(text)?
        }
        _ => id,
    };
    let node = c.fs.node(id);
    if flags & oflag::O_DIRECTORY != 0 && !node.is_dir() {
        return Err(Errno::ENOTDIR);
    }
    if node.is_dir() && (writing || flags & oflag::O_TRUNC != 0) && flags & oflag::O_PATH == 0 {
        return Err(Errno::EISDIR);
    }
    if matches!(node.content, Content::Archive(_))
        && (writing || flags & oflag::O_TRUNC != 0)
        && flags & oflag::O_PATH == 0
    {
        return Err(Errno::EROFS);
    }
    if flags & oflag::O_TRUNC != 0 && writing && matches!(node.content, Content::Mem(_)) {
        let now = c.now();
        c.fs.truncate(id, 0, now)?;
    }
    let limit = c.p.rlimits[super::super::process::rlimit::NOFILE].cur;
    let kept = flags
        & (oflag::O_ACCMODE
            | oflag::O_APPEND
            | oflag::O_NONBLOCK
            | oflag::O_DIRECTORY
            | oflag::O_PATH
            | oflag::O_LARGEFILE
            | oflag::O_NOFOLLOW);
    c.files.open(
        &mut c.p.fds,
        OpenFile {
            target: Target::Node(id),
            offset: 0,
            flags: kept,
        },
        flags & oflag::O_CLOEXEC != 0,
        limit,
    )
}

/// `close(fd)`: the other end of a pipe whose end went sees it.
pub(crate) fn close<M: Machine>(c: &mut Ctx<'_, M>, fd: u64) -> SysResult {
    let gone = c.files.close(&mut c.p.fds, fd)?;
    if let Some(Target::Node(id)) = gone {
        c.fs.release_snapshot(id);
    }
    if let Some(t) = gone
        && let Some(obj @ Obj::Pipe(_)) = Obj::of(t)
    {
        c.changed(obj, 0);
    }
    Ok(0)
}

/// One transfer direction's source/sink for a descriptor.
fn readable_target<M: Machine>(c: &Ctx<'_, M>, fd: u64) -> Result<(Target, u64), Errno> {
    let f = c.files.get(&c.p.fds, fd)?;
    if !f.readable() {
        return Err(Errno::EBADF);
    }
    Ok((f.target, f.offset))
}

/// Reads up to `len` bytes from `target` at `offset` into user `buf`;
/// returns the count (the caller moves the offset).
fn read_into_user<M: Machine>(
    c: &mut Ctx<'_, M>,
    target: Target,
    offset: u64,
    buf: u64,
    len: u64,
) -> SysResult {
    let id = match target {
        Target::Stdin => return Ok(0),
        Target::Console(_) => return Err(Errno::EBADF),
        Target::Pipe { id, write: false } => return pipe_read(c, id, buf, len),
        Target::Pipe { write: true, .. } => return Err(Errno::EBADF),
        Target::EventFd(id) => return super::event::eventfd_read(c, id, buf, len),
        Target::Epoll(_) => return Err(Errno::EINVAL),
        // Reads of a socket go through `net::rw`; an offset one is ESPIPE.
        Target::Socket(_) => return Err(Errno::ESPIPE),
        Target::Node(id) => id,
    };
    if c.fs.node(id).is_dir() {
        return Err(Errno::EISDIR);
    }
    c.access_ok(buf, len)?;
    let len = len.min(MAX_RW_COUNT);
    let mut done = 0u64;
    let mut chunk = [0u8; CHUNK];
    while done < len {
        let want = (len - done).min(CHUNK as u64) as usize;
        let n = read_node(c, id, offset.saturating_add(done), &mut chunk[..want])?;
        if n == 0 {
            break;
        }
        if let Err(e) = c.write(buf + done, &chunk[..n]) {
            return if done == 0 { Err(e) } else { Ok(done) };
        }
        done += n as u64;
        if n < want {
            break;
        }
    }
    Ok(done)
}

/// Reads file node `id` (a regular file or a device) at `offset` into
/// `buf`; returns the bytes read (0 at the end of the file).
pub(crate) fn read_node<M: Machine>(
    c: &mut Ctx<'_, M>,
    id: NodeId,
    offset: u64,
    buf: &mut [u8],
) -> Result<usize, Errno> {
    if is_random(c, id) {
        c.m.random_bytes(buf);
        Ok(buf.len())
    } else {
        c.fs.read_at(id, offset, buf)
    }
}

/// Whether node `id` is a regular file (not a directory or a device).
pub(crate) fn is_regular<M: Machine>(c: &Ctx<'_, M>, id: NodeId) -> bool {
    matches!(c.fs.node(id).content, Content::Archive(_) | Content::Mem(_))
}

/// Whether node `id` is the random device (`/dev/urandom`).
pub(crate) fn is_random<M: Machine>(c: &Ctx<'_, M>, id: NodeId) -> bool {
    matches!(c.fs.node(id).content, Content::Device(Device::Random))
}

/// Writes up to `len` bytes of user `buf` to `target` at `offset`.
fn write_from_user<M: Machine>(
    c: &mut Ctx<'_, M>,
    target: Target,
    offset: u64,
    buf: u64,
    len: u64,
) -> SysResult {
    c.access_ok(buf, len)?;
    let len = len.min(MAX_RW_COUNT);
    if let Target::EventFd(id) = target {
        return super::event::eventfd_write(c, id, buf, len);
    }
    write_target(c, target, offset, len, |c, done, chunk| {
        c.read(buf + done, chunk).map(|()| chunk.len())
    })
}

/// Writes up to `len` bytes to `target` (a file at `offset`, the console
/// or a pipe's write end), taking them a chunk at a time from `source`
/// (called with the bytes done so far and a buffer to fill; it returns
/// how many it filled, fewer at its end). Returns the bytes written; an
/// error of `source` or of the file after some bytes were written
/// returns the count so far.
pub(crate) fn write_target<M: Machine>(
    c: &mut Ctx<'_, M>,
    target: Target,
    offset: u64,
    len: u64,
    mut source: impl FnMut(&mut Ctx<'_, M>, u64, &mut [u8]) -> Result<usize, Errno>,
) -> SysResult {
    // Where each chunk goes.
    enum Sink {
        Console(Stream),
        File(NodeId),
    }
    let sink = match target {
        Target::EventFd(_) | Target::Epoll(_) => return Err(Errno::EINVAL),
        Target::Socket(_) => return Err(Errno::ESPIPE),
        Target::Pipe { id, write: true } => return pipe_write(c, id, len, source),
        Target::Pipe { write: false, .. } | Target::Stdin => return Err(Errno::EBADF),
        Target::Console(s) => Sink::Console(s),
        Target::Node(id) => Sink::File(id),
    };
    let mut done = 0u64;
    let mut chunk = [0u8; CHUNK];
    while done < len {
        let want = (len - done).min(CHUNK as u64) as usize;
        let want = match source(c, done, &mut chunk[..want]) {
            Ok(0) => break,
            Ok(n) => n.min(want),
            Err(e) => return if done == 0 { Err(e) } else { Ok(done) },
        };
        match sink {
            Sink::Console(s) => c.p.output(c.m, s, &chunk[..want]),
            Sink::File(id) => {
                let now = c.m.realtime_ns();
                match c
                    .fs
                    .write_at(id, offset.saturating_add(done), &chunk[..want], now)
                {
                    Ok(_) => {}
                    Err(e) if done == 0 => return Err(e),
                    Err(_) => return Ok(done),
                }
            }
        }
        done += want as u64;
    }
    Ok(done)
}

/// Reads from pipe `id`: what is buffered, up to `len`; 0 when empty and
/// no writer is left; `EAGAIN` when empty (the caller has turned the
/// blocking case into [`Action::Wait`] already, see [`io_wait`]).
fn pipe_read<M: Machine>(c: &mut Ctx<'_, M>, id: usize, buf: u64, len: u64) -> SysResult {
    c.access_ok(buf, len)?;
    let p = c.files.pipe_ref(id).ok_or(Errno::EBADF)?;
    if len == 0 {
        return Ok(0);
    }
    if p.buf.is_empty() {
        return if p.writers == 0 {
            Ok(0)
        } else {
            Err(Errno::EAGAIN)
        };
    }
    let mut chunk = [0u8; CHUNK];
    let mut done = 0u64;
    while done < len {
        let p = c.files.pipe_ref(id).ok_or(Errno::EBADF)?;
        let n = ((len - done) as usize).min(CHUNK).min(p.buf.len());
        if n == 0 {
            break;
        }
        for (d, s) in chunk[..n].iter_mut().zip(p.buf.iter()) {
            *d = *s;
        }
        if let Err(e) = c.write(buf + done, &chunk[..n]) {
            return if done == 0 { Err(e) } else { Ok(done) };
        }
        if let Some(p) = c.files.pipe_mut(id) {
            p.buf.drain(..n);
        }
        done += n as u64;
    }
    if done > 0 {
        c.changed(Obj::Pipe(id), bits::EPOLLOUT | bits::EPOLLWRNORM);
    }
    Ok(done)
}

/// Writes to pipe `id` what fits of `len` bytes from `source` (see
/// [`write_target`]); `EPIPE` without a reader (the caller has raised
/// SIGPIPE already), `EAGAIN` when full.
fn pipe_write<M: Machine>(
    c: &mut Ctx<'_, M>,
    id: usize,
    len: u64,
    mut source: impl FnMut(&mut Ctx<'_, M>, u64, &mut [u8]) -> Result<usize, Errno>,
) -> SysResult {
    let p = c.files.pipe_ref(id).ok_or(Errno::EBADF)?;
    if len == 0 {
        return Ok(0);
    }
    if p.readers == 0 {
        return Err(Errno::EPIPE);
    }
    let room = PIPE_CAPACITY - p.buf.len();
    if room == 0 || len <= PIPE_BUF && (room as u64) < len {
        return Err(Errno::EAGAIN);
    }
    let len = len.min(room as u64);
    let mut chunk = [0u8; CHUNK];
    let mut done = 0u64;
    while done < len {
        let want = ((len - done) as usize).min(CHUNK);
        let n = match source(c, done, &mut chunk[..want]) {
            Ok(0) => break,
            Ok(n) => n.min(want),
            Err(e) => return if done == 0 { Err(e) } else { Ok(done) },
        };
        let p = c.files.pipe_mut(id).ok_or(Errno::EBADF)?;
        if p.buf.try_reserve(n).is_err() {
            return if done == 0 {
                Err(Errno::ENOMEM)
            } else {
                Ok(done)
            };
        }
        p.buf.extend(&chunk[..n]);
        done += n as u64;
    }
    if done > 0 {
        c.changed(Obj::Pipe(id), bits::EPOLLIN | bits::EPOLLRDNORM);
    }
    Ok(done)
}

/// Before a read or write of `fd`: whether it must wait. Reading an
/// empty pipe that still has a writer, or an eventfd at 0, writing a full
/// pipe that still has a reader, or an eventfd the value would take past
/// its maximum, waits until another thread changes that
/// ([`Action::Wait`]; with `O_NONBLOCK` the call says `EAGAIN` instead);
/// writing a pipe without a reader raises SIGPIPE, which ends the process
/// unless it is ignored or blocked (then the call says `EPIPE`).
pub(crate) fn io_wait<M: Machine>(
    c: &mut Ctx<'_, M>,
    fd: u64,
    writing: bool,
    buf: Option<u64>,
    len: u64,
) -> Option<Action> {
    const WAIT: Action = Action::Wait { until_ns: None };
    let f = c.files.get(&c.p.fds, fd).ok()?;
    let nonblock = f.flags & oflag::O_NONBLOCK != 0;
    if writing && !f.writable() || !writing && !f.readable() {
        return None;
    }
    let (id, write) = match f.target {
        Target::Pipe { id, write } => (id, write),
        Target::EventFd(id) => {
            let count = c.files.eventfd_ref(id)?.count;
            if nonblock {
                return None;
            }
            if !writing {
                return (count == 0).then_some(WAIT);
            }
            let v = u64::from_le_bytes(c.read_array(buf?).ok()?);
            return (v != u64::MAX && u64::MAX - count <= v).then_some(WAIT);
        }
        _ => return None,
    };
    if write != writing {
        return None;
    }
    let p = c.files.pipe_ref(id)?;
    if writing {
        if p.readers == 0 {
            let sigpipe = c.p.signals.actions[12];
            let blocked = c.t.sigmask & (1 << 12) != 0;
            if sigpipe.handler == 0 && !blocked {
                return Some(Action::Kill {
                    signal: 13,
                    reason: "write to a pipe with no reader",
                });
            }
            return None;
        }
        // Up to PIPE_BUF bytes go in at once or not at all.
        let room = PIPE_CAPACITY - p.buf.len();
        (!nonblock && (room == 0 || len <= PIPE_BUF && room < len as usize)).then_some(WAIT)
    } else {
        (p.buf.is_empty() && p.writers > 0 && !nonblock).then_some(WAIT)
    }
}

/// `pipe(fds)` and `pipe2(fds, flags)`.
pub(crate) fn pipe2<M: Machine>(c: &mut Ctx<'_, M>, fds: u64, flags: u32) -> SysResult {
    const O_DIRECT: u32 = 0o40000;
    if flags & !(oflag::O_CLOEXEC | oflag::O_NONBLOCK | O_DIRECT) != 0 {
        return Err(Errno::EINVAL);
    }
    // Check the destination before making anything.
    let probe: [u8; 8] = c.read_array(fds)?;
    c.write(fds, &probe)?;
    let limit = c.p.rlimits[super::super::process::rlimit::NOFILE].cur;
    let (r, w) = c.files.pipe(
        &mut c.p.fds,
        flags & oflag::O_NONBLOCK,
        flags & oflag::O_CLOEXEC != 0,
        limit,
    )?;
    let mut out = [0u8; 8];
    out[..4].copy_from_slice(&(r as u32).to_le_bytes());
    out[4..].copy_from_slice(&(w as u32).to_le_bytes());
    if let Err(e) = c.write(fds, &out) {
        let _ = c.files.close(&mut c.p.fds, r);
        let _ = c.files.close(&mut c.p.fds, w);
        return Err(e);
    }
    Ok(0)
}

fn file_size<M: Machine>(c: &Ctx<'_, M>, t: Target) -> u64 {
    match t {
        Target::Node(id) => c.fs.node(id).size(),
        _ => 0,
    }
}

/// `read(fd, buf, count)`.
pub(crate) fn read<M: Machine>(c: &mut Ctx<'_, M>, fd: u64, buf: u64, len: u64) -> SysResult {
    let (t, off) = readable_target(c, fd)?;
    let n = read_into_user(c, t, off, buf, len)?;
    if let Target::Node(_) = t {
        c.files.get_mut(&c.p.fds, fd)?.offset = off + n;
    }
    Ok(n)
}

fn writable_target<M: Machine>(c: &Ctx<'_, M>, fd: u64) -> Result<(Target, u64, bool), Errno> {
    let f = c.files.get(&c.p.fds, fd)?;
    if !f.writable() {
        return Err(Errno::EBADF);
    }
    Ok((f.target, f.offset, f.flags & oflag::O_APPEND != 0))
}

/// `write(fd, buf, count)`.
pub(crate) fn write<M: Machine>(c: &mut Ctx<'_, M>, fd: u64, buf: u64, len: u64) -> SysResult {
    let (t, off, append) = writable_target(c, fd)?;
    let off = if append { file_size(c, t) } else { off };
    let n = write_from_user(c, t, off, buf, len)?;
    if let Target::Node(_) = t {
        c.files.get_mut(&c.p.fds, fd)?.offset = off + n;
    }
    Ok(n)
}

fn seekable(t: Target) -> Result<NodeId, Errno> {
    match t {
        Target::Node(id) => Ok(id),
        _ => Err(Errno::ESPIPE),
    }
}

/// `pread64(fd, buf, count, offset)`.
pub(crate) fn pread<M: Machine>(
    c: &mut Ctx<'_, M>,
    fd: u64,
    buf: u64,
    len: u64,
    off: u64,
) -> SysResult {
    let (t, _) = readable_target(c, fd)?;
    seekable(t)?;
    read_into_user(c, t, off, buf, len)
}

/// `pwrite64(fd, buf, count, offset)`.
pub(crate) fn pwrite<M: Machine>(
    c: &mut Ctx<'_, M>,
    fd: u64,
    buf: u64,
    len: u64,
    off: u64,
) -> SysResult {
    let (t, _, _) = writable_target(c, fd)?;
    seekable(t)?;
    write_from_user(c, t, off, buf, len)
}

/// Reads the `i`th iovec of the caller's ABI.
pub(crate) fn iovec<M: Machine>(c: &mut Ctx<'_, M>, iov: u64, i: u64) -> Result<(u64, u64), Errno> {
    if c.wide() {
        let v = Iovec64::from_bytes(&c.read_array(iov + i * 16)?);
        Ok((v.iov_base, v.iov_len))
    } else {
        let v = Iovec32::from_bytes(&c.read_array(iov + i * 8)?);
        Ok((v.iov_base.into(), v.iov_len.into()))
    }
}

/// Checks an iovec array: count, readability, and the total length
/// (`EINVAL` when it overflows `ssize_t`).
pub(crate) fn check_iov<M: Machine>(c: &mut Ctx<'_, M>, iov: u64, cnt: u64) -> Result<(), Errno> {
    if cnt > IOV_MAX {
        return Err(Errno::EINVAL);
    }
    let max: u64 = if c.wide() {
        i64::MAX as u64
    } else {
        i32::MAX as u64
    };
    let mut total = 0u64;
    for i in 0..cnt {
        let (_, len) = iovec(c, iov, i)?;
        total = total
            .checked_add(len)
            .filter(|&t| t <= max)
            .ok_or(Errno::EINVAL)?;
    }
    Ok(())
}

/// `readv`/`preadv` (`at` = the explicit offset).
pub(crate) fn readv<M: Machine>(
    c: &mut Ctx<'_, M>,
    fd: u64,
    iov: u64,
    cnt: u64,
    at: Option<u64>,
) -> SysResult {
    let (t, off) = readable_target(c, fd)?;
    if at.is_some() {
        seekable(t)?;
    }
    check_iov(c, iov, cnt)?;
    let start = at.unwrap_or(off);
    let mut done = 0u64;
    for i in 0..cnt {
        let (base, len) = iovec(c, iov, i)?;
        let want = len.min(MAX_RW_COUNT - done.min(MAX_RW_COUNT));
        let n = match read_into_user(c, t, start + done, base, want) {
            Ok(n) => n,
            Err(e) if done == 0 => return Err(e),
            Err(_) => break,
        };
        done += n;
        if n < want || done >= MAX_RW_COUNT {
            break;
        }
    }
    if at.is_none() && matches!(t, Target::Node(_)) {
        c.files.get_mut(&c.p.fds, fd)?.offset = start + done;
    }
    Ok(done)
}

/// `writev`/`pwritev`.
pub(crate) fn writev<M: Machine>(
    c: &mut Ctx<'_, M>,
    fd: u64,
    iov: u64,
    cnt: u64,
    at: Option<u64>,
) -> SysResult {
    let (t, off, append) = writable_target(c, fd)?;
    if at.is_some() {
        seekable(t)?;
    }
    check_iov(c, iov, cnt)?;
    let start = match at {
        Some(o) => o,
        None if append => file_size(c, t),
        None => off,
    };
    let mut done = 0u64;
    for i in 0..cnt {
        let (base, len) = iovec(c, iov, i)?;
        let want = len.min(MAX_RW_COUNT - done.min(MAX_RW_COUNT));
        let n = match write_from_user(c, t, start + done, base, want) {
            Ok(n) => n,
            Err(e) if done == 0 => return Err(e),
            Err(_) => break,
        };
        done += n;
        if n < want || done >= MAX_RW_COUNT {
            break;
        }
    }
    if at.is_none() && matches!(t, Target::Node(_)) {
        c.files.get_mut(&c.p.fds, fd)?.offset = start + done;
    }
    Ok(done)
}

/// Computes a new offset for `lseek`.
fn seek_to<M: Machine>(c: &mut Ctx<'_, M>, fd: u64, off: i64, whence: u32) -> Result<u64, Errno> {
    let f = c.files.get(&c.p.fds, fd)?;
    let id = seekable(f.target)?;
    let size = c.fs.node(id).size() as i64;
    let cur = f.offset as i64;
    let new = match whence {
        0 => Some(off),
        1 => cur.checked_add(off),
        2 => size.checked_add(off),
        // SEEK_DATA: the whole file is data; SEEK_HOLE: the end.
        3 | 4 => {
            if off < 0 || off >= size {
                return Err(Errno::ENXIO);
            }
            Some(if whence == 3 { off } else { size })
        }
        _ => return Err(Errno::EINVAL),
    };
    let new = new.filter(|&n| n >= 0).ok_or(Errno::EINVAL)?;
    c.files.get_mut(&c.p.fds, fd)?.offset = new as u64;
    Ok(new as u64)
}

/// `lseek(fd, offset, whence)`.
pub(crate) fn lseek<M: Machine>(c: &mut Ctx<'_, M>, fd: u64, off: i64, whence: u32) -> SysResult {
    let old = c.files.get(&c.p.fds, fd)?.offset;
    let new = seek_to(c, fd, off, whence)?;
    if !c.wide() && new > i32::MAX as u64 {
        c.files.get_mut(&c.p.fds, fd)?.offset = old;
        return Err(Errno::EOVERFLOW);
    }
    Ok(new)
}

/// i386 `_llseek(fd, offset_high, offset_low, result, whence)`.
pub(crate) fn llseek<M: Machine>(
    c: &mut Ctx<'_, M>,
    fd: u64,
    off: u64,
    result: u64,
    whence: u32,
) -> SysResult {
    let old = c.files.get(&c.p.fds, fd)?.offset;
    let new = seek_to(c, fd, off as i64, whence)?;
    if let Err(e) = c.write(result, &new.to_le_bytes()) {
        c.files.get_mut(&c.p.fds, fd)?.offset = old;
        return Err(e);
    }
    Ok(0)
}

/// `fstat`, `fstat64` and the i386 `fstat`.
pub(crate) fn fstat<M: Machine>(
    c: &mut Ctx<'_, M>,
    fd: u64,
    buf: u64,
    layout: StatLayout,
) -> SysResult {
    let t = c.files.get(&c.p.fds, fd)?.target;
    let info = target_info(c.fs, c.files, c.p, t);
    write_stat(c, buf, info, layout)
}

/// `stat`, `lstat`, `newfstatat`, `fstatat64` and the i386 ones.
pub(crate) fn stat_path<M: Machine>(
    c: &mut Ctx<'_, M>,
    dirfd: i32,
    path: u64,
    buf: u64,
    flags: u32,
    layout: StatLayout,
) -> SysResult {
    if flags & !(AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH | AT_NO_AUTOMOUNT) != 0 {
        return Err(Errno::EINVAL);
    }
    let p = c.path(path)?;
    let info = if p.is_empty() && flags & AT_EMPTY_PATH != 0 {
        let t = if dirfd == AT_FDCWD {
            Target::Node(c.p.cwd)
        } else {
            c.files
                .get(&c.p.fds, super::fd_arg(dirfd as u32 as u64))?
                .target
        };
        target_info(c.fs, c.files, c.p, t)
    } else {
        let id = lookup(c, dirfd, &p, flags & AT_SYMLINK_NOFOLLOW != 0)?;
        node_info(c.fs, c.p, id)
    };
    write_stat(c, buf, info, layout)
}

/// `statx(dirfd, path, flags, mask, buf)`.
pub(crate) fn statx<M: Machine>(
    c: &mut Ctx<'_, M>,
    dirfd: i32,
    path: u64,
    flags: u32,
    buf: u64,
) -> SysResult {
    if flags & !(AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH | AT_NO_AUTOMOUNT | AT_STATX_SYNC_TYPE) != 0
        || flags & AT_STATX_SYNC_TYPE == AT_STATX_SYNC_TYPE
    {
        return Err(Errno::EINVAL);
    }
    let p = c.path(path)?;
    let s = if p.is_empty() && flags & AT_EMPTY_PATH != 0 {
        let t = if dirfd == AT_FDCWD {
            Target::Node(c.p.cwd)
        } else {
            c.files.get(&c.p.fds, dirfd as u32 as u64)?.target
        };
        target_info(c.fs, c.files, c.p, t)
    } else {
        let id = lookup(c, dirfd, &p, flags & AT_SYMLINK_NOFOLLOW != 0)?;
        node_info(c.fs, c.p, id)
    };
    let secs = (s.mtime_ns / 1_000_000_000) as i64;
    let nsec = (s.mtime_ns % 1_000_000_000) as u32;
    let st = Statx {
        // STATX_BASIC_STATS (0x7ff) | STATX_BTIME (0x800).
        stx_mask: 0xfff,
        stx_blksize: 4096,
        stx_attributes: 0,
        stx_nlink: s.nlink,
        stx_uid: 0,
        stx_gid: 0,
        stx_mode: s.mode as u16,
        spare0: 0,
        stx_ino: s.ino,
        stx_size: s.size,
        stx_blocks: s.size.div_ceil(512),
        stx_attributes_mask: 0,
        stx_atime_sec: secs,
        stx_atime_nsec: nsec,
        stx_atime_res: 0,
        stx_btime_sec: secs,
        stx_btime_nsec: nsec,
        stx_btime_res: 0,
        stx_ctime_sec: secs,
        stx_ctime_nsec: nsec,
        stx_ctime_res: 0,
        stx_mtime_sec: secs,
        stx_mtime_nsec: nsec,
        stx_mtime_res: 0,
        stx_rdev_major: (s.rdev >> 8) as u32,
        stx_rdev_minor: (s.rdev & 0xff) as u32,
        stx_dev_major: (s.dev >> 8) as u32,
        stx_dev_minor: (s.dev & 0xff) as u32,
        stx_mnt_id: 1,
        stx_dio_mem_align: 0,
        stx_dio_offset_align: 0,
        spare3: [0; 12],
    };
    c.write(buf, &st.to_bytes())?;
    Ok(0)
}

fn dtype(m: u32) -> u8 {
    match m & mode::S_IFMT {
        mode::S_IFDIR => 4,
        mode::S_IFREG => 8,
        mode::S_IFCHR => 2,
        mode::S_IFLNK => 10,
        _ => 0,
    }
}

/// `getdents64(fd, dirp, count)`: `.`, `..`, then the entries by name;
/// the offset counts entries.
pub(crate) fn getdents64<M: Machine>(
    c: &mut Ctx<'_, M>,
    fd: u64,
    buf: u64,
    count: u64,
) -> SysResult {
    let f = c.files.get(&c.p.fds, fd)?;
    let Target::Node(dir) = f.target else {
        return Err(Errno::ENOTDIR);
    };
    let start = f.offset;
    if !c.fs.node(dir).is_dir() {
        return Err(Errno::ENOTDIR);
    }
    // At most 32 KiB per call: libc loops until 0.
    let room = count.min(32 * 1024) as usize;
    let mut out: Vec<u8> = Vec::new();
    out.try_reserve(room).map_err(|_| Errno::ENOMEM)?;
    let entries = c.fs.entries(dir)?;
    let parent = c.fs.node(dir).parent;
    let mut idx = start;
    loop {
        let (name, id): (&[u8], NodeId) = match idx {
            0 => (b".", dir),
            1 => (b"..", parent),
            i => match entries.get((i - 2) as usize) {
                Some((n, id)) => (n, *id),
                None => break,
            },
        };
        let reclen = (19 + name.len() + 1).next_multiple_of(8);
        if out.len() + reclen > room {
            if out.is_empty() {
                return Err(Errno::EINVAL);
            }
            break;
        }
        let at = out.len();
        out.resize(at + reclen, 0);
        out[at..at + 8].copy_from_slice(&(id as u64 + 1).to_le_bytes());
        out[at + 8..at + 16].copy_from_slice(&(idx + 1).to_le_bytes());
        out[at + 16..at + 18].copy_from_slice(&(reclen as u16).to_le_bytes());
        out[at + 18] = dtype(c.fs.node(id).mode());
        out[at + 19..at + 19 + name.len()].copy_from_slice(name);
        idx += 1;
    }
    c.write(buf, &out)?;
    c.files.get_mut(&c.p.fds, fd)?.offset = idx;
    Ok(out.len() as u64)
}

/// `fcntl`/`fcntl64`.
pub(crate) fn fcntl<M: Machine>(c: &mut Ctx<'_, M>, fd: u64, cmd: u32, arg: u64) -> SysResult {
    let limit = c.p.rlimits[super::super::process::rlimit::NOFILE].cur;
    match cmd {
        0 | 1030 => c
            .files
            .dup_min(&mut c.p.fds, fd, arg & 0xffff_ffff, cmd == 1030, limit),
        1 => Ok(c.p.fds.cloexec(fd)? as u64),
        2 => {
            c.p.fds.set_cloexec(fd, arg & 1 != 0)?;
            Ok(0)
        }
        3 => {
            let f = c.files.get(&c.p.fds, fd)?;
            // 64-bit files always have O_LARGEFILE (Linux forces it).
            let extra = if c.abi == super::super::Abi::X86_64 {
                oflag::O_LARGEFILE
            } else {
                0
            };
            Ok((f.flags | extra) as u64)
        }
        4 => {
            let f = c.files.get_mut(&c.p.fds, fd)?;
            f.flags = (f.flags & !oflag::SETFL_MASK) | (arg as u32 & oflag::SETFL_MASK);
            Ok(0)
        }
        // Record locks: one process, so no lock ever conflicts. F_GETLK
        // (5; the i386 F_GETLK64 12; F_OFD_GETLK 36) answers F_UNLCK in
        // `l_type`, the first field of every `struct flock` layout; the
        // setters (6, 7; i386 13, 14; F_OFD_SETLK 37, F_OFD_SETLKW 38)
        // check the type and succeed.
        5 | 6 | 7 | 12 | 13 | 14 | 36 | 37 | 38 => {
            c.files.get(&c.p.fds, fd)?;
            if !c.wide() || !(12..=14).contains(&cmd) {
                let t = u16::from_le_bytes(c.read_array(arg)?);
                if t > 2 {
                    return Err(Errno::EINVAL);
                }
                if matches!(cmd, 5 | 12 | 36) {
                    c.write(arg, &2u16.to_le_bytes())?;
                }
                return Ok(0);
            }
            Err(Errno::EINVAL)
        }
        // F_GETOWN, F_SETOWN, F_SETSIG, F_GETSIG.
        8..=11 => {
            c.files.get(&c.p.fds, fd)?;
            Ok(0)
        }
        // F_GETPIPE_SZ and F_SETPIPE_SZ on a non-pipe, others.
        _ => {
            c.files.get(&c.p.fds, fd)?;
            Err(Errno::EINVAL)
        }
    }
}

/// `dup(fd)`.
pub(crate) fn dup<M: Machine>(c: &mut Ctx<'_, M>, fd: u64) -> SysResult {
    let limit = c.p.rlimits[super::super::process::rlimit::NOFILE].cur;
    c.files.dup_min(&mut c.p.fds, fd, 0, false, limit)
}

/// `dup2(old, new)` (`legacy`) and `dup3(old, new, flags)`.
pub(crate) fn dup3<M: Machine>(
    c: &mut Ctx<'_, M>,
    old: u64,
    new: u64,
    flags: u32,
    legacy: bool,
) -> SysResult {
    if flags & !oflag::O_CLOEXEC != 0 {
        return Err(Errno::EINVAL);
    }
    if old == new {
        c.files.get(&c.p.fds, old)?;
        return if legacy { Ok(new) } else { Err(Errno::EINVAL) };
    }
    let limit = c.p.rlimits[super::super::process::rlimit::NOFILE].cur;
    let replaced = c
        .files
        .get(&c.p.fds, new)
        .ok()
        .and_then(|f| Obj::of(f.target));
    let fd = c.files.dup_to(&mut c.p.fds, old, new, flags != 0, limit)?;
    // The end of a pipe `new` was may have been its last: the other end
    // sees it.
    if let Some(obj @ Obj::Pipe(_)) = replaced {
        c.changed(obj, 0);
    }
    Ok(fd)
}

/// `ioctl(fd, request, arg)`: no descriptor is a terminal.
pub(crate) fn ioctl<M: Machine>(c: &mut Ctx<'_, M>, fd: u64, req: u32, arg: u64) -> SysResult {
    c.files.get(&c.p.fds, fd)?;
    match req {
        // FIONCLEX, FIOCLEX.
        0x5450 => c.p.fds.set_cloexec(fd, false).map(|_| 0),
        0x5451 => c.p.fds.set_cloexec(fd, true).map(|_| 0),
        // FIONBIO.
        0x5421 => {
            let on = super::super::machine::read_u32(c.m, &c.p.areas, arg)? != 0;
            let f = c.files.get_mut(&c.p.fds, fd)?;
            if on {
                f.flags |= oflag::O_NONBLOCK;
            } else {
                f.flags &= !oflag::O_NONBLOCK;
            }
            Ok(0)
        }
        // FIONREAD (SIOCINQ) of a socket: the bytes to read.
        0x541b if let Ok(Target::Socket(id)) = c.files.get(&c.p.fds, fd).map(|f| f.target) => {
            let n = c.net.readable_bytes(id)?;
            c.write(arg, &(n.min(i32::MAX as usize) as u32).to_le_bytes())?;
            Ok(0)
        }
        // TCGETS, TIOCGWINSZ and everything else: not a terminal.
        _ => Err(Errno::ENOTTY),
    }
}

/// `poll`/`ppoll`: each descriptor's readiness ([`FdTable::poll_mask`],
/// `POLLERR` and `POLLHUP` always); with nothing ready, wait for a change
/// or the timeout (`None`: none).
///
/// [`FdTable::poll_mask`]: super::super::fd::FdTable::poll_mask
pub(crate) fn poll<M: Machine>(
    c: &mut Ctx<'_, M>,
    fds: u64,
    nfds: u64,
    timeout_ns: Option<u64>,
) -> Result<Action, Errno> {
    let limit = c.p.rlimits[super::super::process::rlimit::NOFILE].cur;
    if nfds > limit {
        return Err(Errno::EINVAL);
    }
    let mut ready = 0u64;
    let mut pending: Vec<(u64, Pollfd)> = Vec::new();
    for i in 0..nfds {
        let at = fds + i * 8;
        let mut pfd = Pollfd::from_bytes(&c.read_array(at)?);
        pfd.revents = 0;
        if pfd.fd >= 0 {
            match c.files.get(&c.p.fds, pfd.fd as u64) {
                Err(_) => pfd.revents = bits::POLLNVAL as i16,
                Ok(f) => {
                    let want = u32::from(pfd.events as u16) | bits::EPOLLERR | bits::EPOLLHUP;
                    pfd.revents = (c.files.poll_mask(c.net, f) & want) as u16 as i16;
                }
            }
        }
        if pfd.revents != 0 {
            ready += 1;
        }
        pending.try_reserve(1).map_err(|_| Errno::ENOMEM)?;
        pending.push((at, pfd));
    }
    let action = if ready > 0 {
        Action::Return(ready)
    } else {
        c.wait_or_time_out(timeout_ns)
    };
    if let Action::Return(_) = action {
        for (at, pfd) in pending {
            c.write(at, &pfd.to_bytes())?;
        }
    }
    Ok(action)
}

/// `access`, `faccessat`, `faccessat2`.
pub(crate) fn faccessat<M: Machine>(
    c: &mut Ctx<'_, M>,
    dirfd: i32,
    path: u64,
    amode: u32,
    flags: u32,
) -> SysResult {
    if amode & !7 != 0 || flags & !(AT_EACCESS | AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH) != 0 {
        return Err(Errno::EINVAL);
    }
    let p = c.path(path)?;
    let id = if p.is_empty() && flags & AT_EMPTY_PATH != 0 {
        match c.files.get(&c.p.fds, dirfd as u32 as u64)?.target {
            Target::Node(id) => id,
            _ => return Ok(0),
        }
    } else {
        lookup(c, dirfd, &p, flags & AT_SYMLINK_NOFOLLOW != 0)?
    };
    let n = c.fs.node(id);
    if amode & 2 != 0 && matches!(n.content, Content::Archive(_)) {
        return Err(Errno::EROFS);
    }
    if amode & 1 != 0 && !n.is_dir() && n.perm & 0o111 == 0 {
        return Err(Errno::EACCES);
    }
    Ok(0)
}

/// `readlink`, `readlinkat`: only `/proc/self/exe` is a link.
pub(crate) fn readlinkat<M: Machine>(
    c: &mut Ctx<'_, M>,
    dirfd: i32,
    path: u64,
    buf: u64,
    size: u64,
) -> SysResult {
    if super::int_arg(size) <= 0 {
        return Err(Errno::EINVAL);
    }
    let p = c.path(path)?;
    let id = lookup(c, dirfd, &p, true)?;
    if !matches!(c.fs.node(id).content, Content::SelfExe) {
        return Err(Errno::EINVAL);
    }
    let n = c.p.exe.len().min(size as usize);
    let exe = c.p.exe[..n].to_vec();
    c.write(buf, &exe)?;
    Ok(n as u64)
}

/// `getcwd(buf, size)`: the length including the NUL.
pub(crate) fn getcwd<M: Machine>(c: &mut Ctx<'_, M>, buf: u64, size: u64) -> SysResult {
    let mut path = c.fs.path_of(c.p.cwd)?;
    if (path.len() as u64) >= size {
        return Err(Errno::ERANGE);
    }
    path.try_reserve(1).map_err(|_| Errno::ENOMEM)?;
    path.push(0);
    c.write(buf, &path)?;
    Ok(path.len() as u64)
}

/// `chdir(path)`.
pub(crate) fn chdir<M: Machine>(c: &mut Ctx<'_, M>, path: u64) -> SysResult {
    let p = c.path(path)?;
    let id = lookup(c, AT_FDCWD, &p, false)?;
    if !c.fs.node(id).is_dir() {
        return Err(Errno::ENOTDIR);
    }
    c.p.cwd = id;
    Ok(0)
}

/// `fchdir(fd)`.
pub(crate) fn fchdir<M: Machine>(c: &mut Ctx<'_, M>, fd: u64) -> SysResult {
    match c.files.get(&c.p.fds, fd)?.target {
        Target::Node(id) if c.fs.node(id).is_dir() => {
            c.p.cwd = id;
            Ok(0)
        }
        _ => Err(Errno::ENOTDIR),
    }
}

/// `mkdir`, `mkdirat`.
pub(crate) fn mkdirat<M: Machine>(
    c: &mut Ctx<'_, M>,
    dirfd: i32,
    path: u64,
    perm: u32,
) -> SysResult {
    let p = c.path(path)?;
    let base = base_dir(c, dirfd, &p)?;
    let (dir, name, _) = c.fs.resolve_parent(base, &p)?;
    let name = name.ok_or(Errno::EEXIST)?;
    let now = c.now();
    let perm = perm & 0o7777 & !c.p.umask;
    c.fs.mkdir(dir, name, perm, now)?;
    Ok(0)
}

/// `unlink`, `rmdir`, `unlinkat`.
pub(crate) fn unlinkat<M: Machine>(
    c: &mut Ctx<'_, M>,
    dirfd: i32,
    path: u64,
    flags: u32,
) -> SysResult {
    if flags & !AT_REMOVEDIR != 0 {
        return Err(Errno::EINVAL);
    }
    let p = c.path(path)?;
    let base = base_dir(c, dirfd, &p)?;
    let (dir, name, trailing) = c.fs.resolve_parent(base, &p)?;
    let rmdir = flags & AT_REMOVEDIR != 0;
    let Some(name) = name else {
        return Err(if rmdir { Errno::EINVAL } else { Errno::EISDIR });
    };
    if trailing && !rmdir {
        // unlink("file/") is ENOTDIR, unlink("dir/") is EISDIR.
        let id = c.fs.child(dir, name)?.ok_or(Errno::ENOENT)?;
        return Err(if c.fs.node(id).is_dir() {
            Errno::EISDIR
        } else {
            Errno::ENOTDIR
        });
    }
    c.fs.unlink(dir, name, rmdir)?;
    Ok(0)
}

/// `rename`, `renameat`, `renameat2` (`RENAME_NOREPLACE` supported).
pub(crate) fn renameat<M: Machine>(
    c: &mut Ctx<'_, M>,
    olddirfd: i32,
    old: u64,
    newdirfd: i32,
    new: u64,
    flags: u32,
) -> SysResult {
    const RENAME_NOREPLACE: u32 = 1;
    if flags & !RENAME_NOREPLACE != 0 {
        return Err(Errno::EINVAL);
    }
    let op = c.path(old)?;
    let np = c.path(new)?;
    let ob = base_dir(c, olddirfd, &op)?;
    let nb = base_dir(c, newdirfd, &np)?;
    let (od, on, _) = c.fs.resolve_parent(ob, &op)?;
    let (nd, nn, _) = c.fs.resolve_parent(nb, &np)?;
    let (Some(on), Some(nn)) = (on, nn) else {
        return Err(Errno::EBUSY);
    };
    if flags & RENAME_NOREPLACE != 0 && c.fs.child(nd, nn)?.is_some() {
        return Err(Errno::EEXIST);
    }
    c.fs.rename(od, on, nd, nn)?;
    Ok(0)
}

/// `ftruncate`, `ftruncate64`.
pub(crate) fn ftruncate<M: Machine>(c: &mut Ctx<'_, M>, fd: u64, len: i64) -> SysResult {
    if len < 0 {
        return Err(Errno::EINVAL);
    }
    let f = c.files.get(&c.p.fds, fd)?;
    let Target::Node(id) = f.target else {
        return Err(Errno::EINVAL);
    };
    if !f.writable() {
        return Err(Errno::EINVAL);
    }
    if c.fs.node(id).is_dir() {
        return Err(Errno::EISDIR);
    }
    let now = c.now();
    c.fs.truncate(id, len as u64, now)?;
    Ok(0)
}

/// `truncate`, `truncate64`.
pub(crate) fn truncate<M: Machine>(c: &mut Ctx<'_, M>, path: u64, len: i64) -> SysResult {
    let p = c.path(path)?;
    if len < 0 {
        return Err(Errno::EINVAL);
    }
    let id = lookup(c, AT_FDCWD, &p, false)?;
    if c.fs.node(id).is_dir() {
        return Err(Errno::EISDIR);
    }
    let now = c.now();
    c.fs.truncate(id, len as u64, now)?;
    Ok(0)
}

/// `fsync`, `fdatasync`: everything is in memory already.
pub(crate) fn fsync<M: Machine>(c: &mut Ctx<'_, M>, fd: u64) -> SysResult {
    c.files.get(&c.p.fds, fd)?;
    Ok(0)
}

fn set_perm<M: Machine>(c: &mut Ctx<'_, M>, id: NodeId, perm: u32) -> SysResult {
    let n = c.fs.node_mut(id);
    if !matches!(n.content, Content::Mem(_) | Content::Dir(_)) {
        return Err(Errno::EROFS);
    }
    n.perm = perm & 0o7777;
    Ok(0)
}

/// `chmod`, `fchmodat`.
pub(crate) fn chmodat<M: Machine>(
    c: &mut Ctx<'_, M>,
    dirfd: i32,
    path: u64,
    perm: u32,
) -> SysResult {
    let p = c.path(path)?;
    let id = lookup(c, dirfd, &p, false)?;
    set_perm(c, id, perm)
}

/// `fchmod`.
pub(crate) fn fchmod<M: Machine>(c: &mut Ctx<'_, M>, fd: u64, perm: u32) -> SysResult {
    match c.files.get(&c.p.fds, fd)?.target {
        Target::Node(id) => set_perm(c, id, perm),
        _ => Ok(0),
    }
}

/// The bytes of the regular file behind `fd` from `offset`, for a private
/// file mapping: archive files in place, in-memory files as a snapshot of
/// at most `len` bytes. `EACCES` if not open for reading, `ENODEV` for
/// what cannot be mapped.
pub(crate) fn mapping_source<M: Machine>(
    c: &Ctx<'_, M>,
    fd: u64,
    offset: u64,
    len: u64,
) -> Result<MapSource, Errno> {
    let f = c.files.get(&c.p.fds, fd)?;
    if f.flags & oflag::O_PATH != 0 {
        return Err(Errno::EBADF);
    }
    if !f.readable() {
        return Err(Errno::EACCES);
    }
    let Target::Node(id) = f.target else {
        return Err(Errno::ENODEV);
    };
    match &c.fs.node(id).content {
        Content::Archive(d) => Ok(MapSource::File {
            data: super::super::vma::FileData::Static(d),
            offset,
            len: (d.len() as u64).saturating_sub(offset),
            writable: f.writable(),
        }),
        Content::Mem(d) => {
            let start = usize::try_from(offset).unwrap_or(usize::MAX).min(d.len());
            let end = start
                .saturating_add(usize::try_from(len).unwrap_or(usize::MAX))
                .min(d.len());
            let mut v = Vec::new();
            v.try_reserve_exact(end - start)
                .map_err(|_| Errno::ENOMEM)?;
            v.extend_from_slice(&d[start..end]);
            let n = v.len() as u64;
            Ok(MapSource::File {
                data: super::super::vma::FileData::Shared(Arc::from(v)),
                offset: 0,
                len: n,
                writable: f.writable(),
            })
        }
        Content::Device(Device::Zero) => Ok(MapSource::Zero),
        _ => Err(Errno::ENODEV),
    }
}

/// Where a file mapping's bytes come from.
pub(crate) enum MapSource {
    /// `/dev/zero`: an anonymous mapping.
    Zero,
    /// File content.
    File {
        data: super::super::vma::FileData,
        offset: u64,
        len: u64,
        writable: bool,
    },
}

/// `select`/`pselect6` over the descriptor sets at `sets` (read, write,
/// except; each may be NULL), from each descriptor's readiness as Linux
/// maps it (`POLLIN_SET`, `POLLOUT_SET`, `POLLEX_SET`). `EBADF` for a
/// descriptor in a set that is not open. With nothing ready: wait for a
/// change or the timeout (`None`: none); the sets are written back only
/// when the call returns.
pub(crate) fn select<M: Machine>(
    c: &mut Ctx<'_, M>,
    nfds: i32,
    sets: [u64; 3],
    timeout_ns: Option<u64>,
) -> Result<Action, Errno> {
    use bits::*;
    const IN_SET: u32 = EPOLLRDNORM | EPOLLRDBAND | EPOLLIN | EPOLLHUP | EPOLLERR;
    const OUT_SET: u32 = EPOLLWRBAND | EPOLLWRNORM | EPOLLOUT | EPOLLERR;
    const EX_SET: u32 = EPOLLPRI;
    if nfds < 0 {
        return Err(Errno::EINVAL);
    }
    let n = (nfds as usize).min(1024);
    let word = if c.wide() { 8 } else { 4 };
    let bytes = n.div_ceil(8 * word) * word;
    let mut bits = [[0u8; 128]; 3];
    for (set, b) in sets.iter().zip(bits.iter_mut()) {
        if *set != 0 {
            c.read(*set, &mut b[..bytes])?;
        }
    }
    let mut ready = 0u64;
    for fd in 0..n {
        let (byte, bit) = (fd / 8, 1u8 << (fd % 8));
        if bits.iter().all(|b| b[byte] & bit == 0) {
            continue;
        }
        let f = c.files.get(&c.p.fds, fd as u64)?;
        let mask = c.files.poll_mask(c.net, f);
        for (i, set) in [IN_SET, OUT_SET, EX_SET].into_iter().enumerate() {
            if bits[i][byte] & bit != 0 {
                if mask & set != 0 {
                    ready += 1;
                } else {
                    bits[i][byte] &= !bit;
                }
            }
        }
    }
    let action = if ready > 0 {
        Action::Return(ready)
    } else {
        c.wait_or_time_out(timeout_ns)
    };
    if let Action::Return(_) = action {
        for (set, b) in sets.iter().zip(bits.iter()) {
            if *set != 0 {
                c.write(*set, &b[..bytes])?;
            }
        }
    }
    Ok(action)
}

/// `utimensat(dirfd, path, times, flags)` (path NULL: the descriptor
/// itself, as glibc's `futimens`): sets the modification time of an
/// in-memory file (`UTIME_NOW`, `UTIME_OMIT` understood; access times are
/// not kept). Archive files are `EROFS`.
pub(crate) fn utimensat<M: Machine>(
    c: &mut Ctx<'_, M>,
    dirfd: i32,
    path: u64,
    times: u64,
    flags: u32,
    wide_time: bool,
) -> SysResult {
    const UTIME_NOW: i64 = (1 << 30) - 1;
    const UTIME_OMIT: i64 = (1 << 30) - 2;
    if flags & !(AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH) != 0 {
        return Err(Errno::EINVAL);
    }
    let mtime = if times == 0 {
        Some(c.now())
    } else {
        let mut ts = [(0i64, 0i64); 2];
        for (i, t) in ts.iter_mut().enumerate() {
            *t = if wide_time {
                let v = super::super::uapi::Timespec64::from_bytes(
                    &c.read_array(times + 16 * i as u64)?,
                );
                (v.tv_sec, v.tv_nsec)
            } else {
                let v = super::super::uapi::Timespec32::from_bytes(
                    &c.read_array(times + 8 * i as u64)?,
                );
                (v.tv_sec.into(), v.tv_nsec.into())
            };
            if t.1 != UTIME_NOW && t.1 != UTIME_OMIT && !(0..1_000_000_000).contains(&t.1) {
                return Err(Errno::EINVAL);
            }
        }
        match ts[1] {
            (_, UTIME_OMIT) => None,
            (_, UTIME_NOW) => Some(c.now()),
            (s, ns) => Some(
                (s.max(0) as u64)
                    .saturating_mul(1_000_000_000)
                    .saturating_add(ns as u64),
            ),
        }
    };
    let id = if path == 0 {
        match c.files.get(&c.p.fds, dirfd as u32 as u64)?.target {
            Target::Node(id) => id,
            _ => return Ok(0),
        }
    } else {
        let p = c.path(path)?;
        if p.is_empty() && flags & AT_EMPTY_PATH != 0 {
            match c.files.get(&c.p.fds, dirfd as u32 as u64)?.target {
                Target::Node(id) => id,
                _ => return Ok(0),
            }
        } else {
            lookup(c, dirfd, &p, flags & AT_SYMLINK_NOFOLLOW != 0)?
        }
    };
    let n = c.fs.node_mut(id);
    match n.content {
        Content::Mem(_) | Content::Dir(_) => {
            if let Some(t) = mtime {
                n.mtime_ns = t;
            }
            Ok(0)
        }
        Content::Device(_) => Ok(0),
        _ => Err(Errno::EROFS),
    }
}

/// `chown`, `lchown`, `fchown`, `fchownat`: everything belongs to root and
/// stays so: an owner other than 0 (or -1, unchanged) is `EPERM`; archive
/// files are `EROFS`.
pub(crate) fn chownat<M: Machine>(
    c: &mut Ctx<'_, M>,
    dirfd: i32,
    path: Option<u64>,
    uid: u32,
    gid: u32,
    flags: u32,
) -> SysResult {
    if flags & !(AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH) != 0 {
        return Err(Errno::EINVAL);
    }
    let id = match path {
        None => match c.files.get(&c.p.fds, dirfd as u32 as u64)?.target {
            Target::Node(id) => Some(id),
            _ => None,
        },
        Some(path) => {
            let p = c.path(path)?;
            if p.is_empty() && flags & AT_EMPTY_PATH != 0 {
                match c.files.get(&c.p.fds, dirfd as u32 as u64)?.target {
                    Target::Node(id) => Some(id),
                    _ => None,
                }
            } else {
                Some(lookup(c, dirfd, &p, flags & AT_SYMLINK_NOFOLLOW != 0)?)
            }
        }
    };
    if let Some(id) = id
        && matches!(
            c.fs.node(id).content,
            Content::Archive(_) | Content::SelfExe
        )
    {
        return Err(Errno::EROFS);
    }
    let keep = |v: u32| v == 0 || v == u32::MAX;
    if keep(uid) && keep(gid) {
        Ok(0)
    } else {
        Err(Errno::EPERM)
    }
}
