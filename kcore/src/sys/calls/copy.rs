//! Copies between descriptors inside the kernel: `sendfile` (a file to a
//! file, the console, a pipe or a socket) and `copy_file_range` (a file
//! to a file). The bytes go through the same bounded buffer as a read or
//! a write ([`CHUNK`](super::super::machine::CHUNK) at a time), never
//! through user memory; only the offsets are read from and written to
//! the caller.
//!
//! As on Linux: the source of `sendfile` is a file (a pipe or a socket is
//! `EINVAL`), an offset pointer reads and advances `*offset` and leaves
//! the file's own offset alone, without one the file's offset advances;
//! a destination opened `O_APPEND` is `EINVAL` for `sendfile` and `EBADF`
//! for `copy_file_range`; a full pipe or socket makes a blocking call
//! wait until it takes something, and the count can be short (callers
//! loop).

use super::super::Action;
use super::super::errno::{Errno, SysResult};
use super::super::fd::{Target, oflag};
use super::super::fs::{Content, Device, NodeId};
use super::super::machine::Machine;
use super::file::{self, MAX_RW_COUNT};
use super::{Ctx, net};

/// How a call passes a file offset: none, or a pointer to a 32-bit
/// (`off_t` of i386 `sendfile`) or a 64-bit (`loff_t`) offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OffsetArg {
    None,
    Off32(u64),
    Off64(u64),
}

impl OffsetArg {
    /// The offset argument `ptr` of a call whose offsets are `wide`
    /// (64-bit) or not.
    pub(crate) fn new(ptr: u64, wide: bool) -> Self {
        match (ptr, wide) {
            (0, _) => OffsetArg::None,
            (p, true) => OffsetArg::Off64(p),
            (p, false) => OffsetArg::Off32(p),
        }
    }

    /// The offset the pointer holds (`EINVAL` when negative), or `None`.
    fn read<M: Machine>(self, c: &mut Ctx<'_, M>) -> Result<Option<u64>, Errno> {
        let v = match self {
            OffsetArg::None => return Ok(None),
            OffsetArg::Off32(p) => i64::from(i32::from_le_bytes(c.read_array(p)?)),
            OffsetArg::Off64(p) => i64::from_le_bytes(c.read_array(p)?),
        };
        u64::try_from(v).map(Some).map_err(|_| Errno::EINVAL)
    }

    /// Stores `v` through the pointer.
    fn write<M: Machine>(self, c: &mut Ctx<'_, M>, v: u64) -> Result<(), Errno> {
        match self {
            OffsetArg::None => Ok(()),
            OffsetArg::Off32(p) => c.write(p, &(v as u32).to_le_bytes()),
            OffsetArg::Off64(p) => c.write(p, &v.to_le_bytes()),
        }
    }
}

/// The file node an input descriptor reads, with its offset: `EBADF`
/// unless it is open for reading, `EINVAL` unless it is a file, `dir` for
/// a directory.
fn source_file<M: Machine>(c: &Ctx<'_, M>, fd: u64, dir: Errno) -> Result<(NodeId, u64), Errno> {
    let f = c.files.get(&c.p.fds, fd)?;
    if !f.readable() {
        return Err(Errno::EBADF);
    }
    let Target::Node(id) = f.target else {
        return Err(Errno::EINVAL);
    };
    if c.fs.node(id).is_dir() {
        return Err(dir);
    }
    Ok((id, f.offset))
}

/// `sendfile(out_fd, in_fd, offset, count)` and i386 `sendfile64`
/// (`offset` is [`OffsetArg`]).
pub(crate) fn sendfile<M: Machine>(
    c: &mut Ctx<'_, M>,
    out_fd: u64,
    in_fd: u64,
    offset: OffsetArg,
    count: u64,
) -> Result<Action, Errno> {
    let (src, fd_off) = source_file(c, in_fd, Errno::EINVAL)?;
    let out = c.files.get(&c.p.fds, out_fd)?.clone();
    if !out.writable() {
        return Err(Errno::EBADF);
    }
    if out.flags & oflag::O_APPEND != 0 {
        return Err(Errno::EINVAL);
    }
    let start = match offset.read(c)? {
        Some(v) => v,
        None => fd_off,
    };
    let mut count = count.min(MAX_RW_COUNT);
    // A 32-bit offset stops at 2^31 - 1.
    if matches!(offset, OffsetArg::Off32(_)) {
        let max = i32::MAX as u64;
        if start >= max && count > 0 {
            return Err(Errno::EOVERFLOW);
        }
        count = count.min(max.saturating_sub(start));
    }
    // What the file still has: nothing to send returns at once, even to
    // a full pipe or socket.
    let count = match &c.fs.node(src).content {
        Content::Device(Device::Null) => 0,
        Content::Device(_) => count,
        _ => c.fs.node(src).size().saturating_sub(start).min(count),
    };
    let sent = match out.target {
        _ if count == 0 => 0,
        // A socket takes exactly what it is offered.
        Target::Socket(id) => match send_to_socket(c, id, out.flags, src, start, count)? {
            Ok(n) => n,
            Err(wait) => return Ok(wait),
        },
        Target::Pipe { .. } => {
            // A full pipe waits (or says EAGAIN), one without a reader
            // raises SIGPIPE, as a write.
            if let Some(wait) = file::io_wait(c, out_fd, true, None, u64::MAX) {
                return Ok(wait);
            }
            copy_to(c, out.target, out.offset, src, start, count)?
        }
        t => {
            let n = copy_to(c, t, out.offset, src, start, count)?;
            if let Target::Node(_) = t {
                c.files.get_mut(&c.p.fds, out_fd)?.offset = out.offset + n;
            }
            n
        }
    };
    match offset {
        OffsetArg::None => c.files.get_mut(&c.p.fds, in_fd)?.offset = start + sent,
        o => o.write(c, start + sent)?,
    }
    Ok(Action::Return(sent))
}

/// Writes up to `len` bytes of file `src` from `at` to `target` (at
/// `offset` when it is a file); returns the bytes written.
fn copy_to<M: Machine>(
    c: &mut Ctx<'_, M>,
    target: Target,
    offset: u64,
    src: NodeId,
    at: u64,
    len: u64,
) -> SysResult {
    file::write_target(c, target, offset, len, |c, done, chunk| {
        file::read_node(c, src, at.saturating_add(done), chunk)
    })
}

/// Sends `len` bytes of file `src` from `at` on socket `id` (whose file
/// flags are `flags`): the count, or the wait of a blocking socket that
/// takes nothing now.
fn send_to_socket<M: Machine>(
    c: &mut Ctx<'_, M>,
    id: usize,
    flags: u32,
    src: NodeId,
    at: u64,
    len: u64,
) -> Result<Result<u64, Action>, Errno> {
    let nonblock = flags & oflag::O_NONBLOCK != 0;
    let timeo = c.net.sock(id).map_or(0, |s| s.opts.sndtimeo_ns);
    // At most MAX_RW_COUNT (the caller's count), which fits a usize.
    let len = len as usize;
    // The file's bytes go straight from the file system into the socket's
    // buffer (a device's: zeros or random bytes, as a read gives them).
    let random = file::is_random(c, src);
    let (net, fs, m) = (&mut *c.net, &*c.fs, &mut *c.m);
    let mut fill = |off: usize, out: &mut [u8]| -> Result<(), Errno> {
        if random {
            m.random_bytes(out);
            return Ok(());
        }
        let n = fs.read_at(src, at.saturating_add(off as u64), out)?;
        // The file shrank since its size was read: what is missing reads
        // as zeros (not possible within one call, which holds the file
        // system).
        out[n..].fill(0);
        Ok(())
    };
    match net.send(id, len, None, &mut fill) {
        Ok(n) if n > 0 => Ok(Ok(n as u64)),
        Ok(_) | Err(Errno::EAGAIN) => match net::blocking(c, nonblock, timeo) {
            Ok(wait) => Ok(Err(wait)),
            Err(e) => Err(e),
        },
        Err(e) => {
            net::pipe_signal(c, &Err(e), 0);
            Err(e)
        }
    }
}

/// `copy_file_range(fd_in, off_in, fd_out, off_out, len, flags)`: from a
/// regular file to a regular file, `EINVAL` for anything else, for flags,
/// and for overlapping ranges of one file; `EBADF` for a destination
/// opened `O_APPEND`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn copy_file_range<M: Machine>(
    c: &mut Ctx<'_, M>,
    fd_in: u64,
    off_in: u64,
    fd_out: u64,
    off_out: u64,
    len: u64,
    flags: u64,
) -> SysResult {
    let (src, in_pos) = source_file(c, fd_in, Errno::EISDIR)?;
    let out = c.files.get(&c.p.fds, fd_out)?.clone();
    if !out.writable() || out.flags & oflag::O_APPEND != 0 {
        return Err(Errno::EBADF);
    }
    let Target::Node(dst) = out.target else {
        return Err(Errno::EINVAL);
    };
    if c.fs.node(dst).is_dir() {
        return Err(Errno::EISDIR);
    }
    if flags != 0 || !file::is_regular(c, src) || !file::is_regular(c, dst) {
        return Err(Errno::EINVAL);
    }
    let (off_in, off_out) = (OffsetArg::new(off_in, true), OffsetArg::new(off_out, true));
    let from = off_in.read(c)?.unwrap_or(in_pos);
    let to = off_out.read(c)?.unwrap_or(out.offset);
    let len = len.min(MAX_RW_COUNT);
    if from.checked_add(len).is_none() || to.checked_add(len).is_none() {
        return Err(Errno::EOVERFLOW);
    }
    if src == dst && from < to + len && to < from + len {
        return Err(Errno::EINVAL);
    }
    // No more than the source has (a copy never writes past its end).
    let len = c.fs.node(src).size().saturating_sub(from).min(len);
    let n = copy_to(c, out.target, to, src, from, len)?;
    match off_in {
        OffsetArg::None => c.files.get_mut(&c.p.fds, fd_in)?.offset = from + n,
        o => o.write(c, from + n)?,
    }
    match off_out {
        OffsetArg::None => c.files.get_mut(&c.p.fds, fd_out)?.offset = to + n,
        o => o.write(c, to + n)?,
    }
    Ok(n)
}
