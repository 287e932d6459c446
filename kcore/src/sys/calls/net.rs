//! The socket calls: `socket`, `bind`, `listen`, `accept4`, `connect`,
//! `shutdown`, the `send*`/`recv*` family, `getsockname`/`getpeername`,
//! `setsockopt`/`getsockopt`, i386's `socketcall` multiplexer, and reads
//! and writes of a socket descriptor. The sockets themselves, and what
//! each call means for them, are [`Net`](super::super::net::Net)'s; this
//! file moves arguments and data between the caller's memory and it.
//!
//! A call that would block returns `EAGAIN` from [`Net`]; [`blocking`]
//! turns that into a wait for a blocking socket (until a change of the
//! socket wakes the thread and the call is made again, or its
//! `SO_RCVTIMEO`/`SO_SNDTIMEO` runs out).

use alloc::vec::Vec;

use super::super::Action;
use super::super::errno::{Errno, SysResult};
use super::super::fd::{OpenFile, Target, oflag};
use super::super::machine::Machine;
use super::super::net::{AF_INET, Addr, Opts, SOCK_DGRAM, SOCK_STREAM, msg};
use super::super::table::Sys;
use super::{Ctx, fd_arg, int_arg};

const SOCK_NONBLOCK: u32 = oflag::O_NONBLOCK;
const SOCK_CLOEXEC: u32 = oflag::O_CLOEXEC;
const AF_UNSPEC: u16 = 0;
/// `sizeof(struct sockaddr_in)`.
const SOCKADDR_IN: usize = 16;
/// `sizeof(struct sockaddr_storage)`: longer addresses are `EINVAL`.
const SOCKADDR_MAX: u64 = 128;
/// SIGPIPE's bit in a pending set.
const SIGPIPE_BIT: u64 = 1 << (13 - 1);

/// The socket behind `fd`: `EBADF` if not open, `ENOTSOCK` if not one.
fn sock_of<M: Machine>(c: &Ctx<'_, M>, fd: u64) -> Result<(usize, bool), Errno> {
    let f = c.files.get(&c.p.fds, fd_arg(fd))?;
    match f.target {
        Target::Socket(id) => Ok((id, f.flags & oflag::O_NONBLOCK != 0)),
        _ => Err(Errno::ENOTSOCK),
    }
}

/// Whether `fd` is a socket.
pub(crate) fn is_socket<M: Machine>(c: &Ctx<'_, M>, fd: u64) -> bool {
    sock_of(c, fd).is_ok()
}

/// Reads a `sockaddr` of `len` bytes at `addr`: `Ok(None)` for
/// `AF_UNSPEC`.
fn read_addr<M: Machine>(c: &mut Ctx<'_, M>, addr: u64, len: u64) -> Result<Option<Addr>, Errno> {
    let len = len & 0xffff_ffff;
    if len as i32 as i64 > SOCKADDR_MAX as i64 || (len as i32) < 0 {
        return Err(Errno::EINVAL);
    }
    if len < 2 {
        return Err(Errno::EINVAL);
    }
    let mut b = [0u8; SOCKADDR_IN];
    let n = (len as usize).min(SOCKADDR_IN);
    c.read(addr, &mut b[..n])?;
    match u16::from_le_bytes([b[0], b[1]]) {
        AF_INET if n >= SOCKADDR_IN => Ok(Some(Addr {
            ip: [b[4], b[5], b[6], b[7]],
            port: u16::from_be_bytes([b[2], b[3]]),
        })),
        AF_INET => Err(Errno::EINVAL),
        AF_UNSPEC => Ok(None),
        _ => Err(Errno::EAFNOSUPPORT),
    }
}

/// Writes `a` as a `sockaddr_in` to `addr` (at most `*len` bytes) and its
/// full length to `len`; nothing when `addr` is null.
fn write_addr<M: Machine>(c: &mut Ctx<'_, M>, addr: u64, len: u64, a: Addr) -> Result<(), Errno> {
    if addr == 0 {
        return Ok(());
    }
    let have = i32::from_le_bytes(c.read_array(len)?);
    if have < 0 {
        return Err(Errno::EINVAL);
    }
    let mut b = [0u8; SOCKADDR_IN];
    b[..2].copy_from_slice(&AF_INET.to_le_bytes());
    b[2..4].copy_from_slice(&a.port.to_be_bytes());
    b[4..8].copy_from_slice(&a.ip);
    let n = (have as usize).min(SOCKADDR_IN);
    c.write(addr, &b[..n])?;
    c.write(len, &(SOCKADDR_IN as u32).to_le_bytes())
}

/// A call that found nothing to do yet: for a blocking socket, wait for
/// a change of it (or until `timeo_ns` runs out, when not 0: then
/// `EAGAIN`); a non-blocking one says `EAGAIN`.
pub(crate) fn blocking<M: Machine>(
    c: &mut Ctx<'_, M>,
    nonblock: bool,
    timeo_ns: u64,
) -> Result<Action, Errno> {
    if nonblock {
        return Err(Errno::EAGAIN);
    }
    let now = c.m.monotonic_ns();
    let until = match c.resumed {
        Some(u) => u,
        None => (timeo_ns != 0).then(|| now.saturating_add(timeo_ns)),
    };
    if until.is_some_and(|u| now >= u) {
        return Err(Errno::EAGAIN);
    }
    Ok(Action::Wait { until_ns: until })
}

/// An `EPIPE` of a send raises SIGPIPE unless `MSG_NOSIGNAL`.
pub(crate) fn pipe_signal<M: Machine>(c: &mut Ctx<'_, M>, r: &Result<usize, Errno>, flags: u32) {
    if *r == Err(Errno::EPIPE) && flags & msg::NOSIGNAL == 0 {
        c.t.pending |= SIGPIPE_BIT;
    }
}

/// `socket(domain, type, protocol)`.
pub(crate) fn socket<M: Machine>(
    c: &mut Ctx<'_, M>,
    domain: u64,
    ty: u64,
    proto: u64,
) -> SysResult {
    let (domain, ty, proto) = (domain as u32, ty as u32, proto as u32);
    let flags = ty & !0xf;
    let kind = ty & 0xf;
    if flags & !(SOCK_NONBLOCK | SOCK_CLOEXEC) != 0 || kind >= 11 {
        return Err(Errno::EINVAL);
    }
    if domain >= 46 {
        return Err(Errno::EAFNOSUPPORT);
    }
    if domain != u32::from(AF_INET) {
        return Err(Errno::EAFNOSUPPORT);
    }
    match (kind, proto) {
        (SOCK_STREAM, 0 | 6) | (SOCK_DGRAM, 0 | 17) => {}
        (SOCK_STREAM | SOCK_DGRAM, _) => return Err(Errno::EPROTONOSUPPORT),
        _ => return Err(Errno::ESOCKTNOSUPPORT),
    }
    let limit = c.p.rlimits[super::super::process::rlimit::NOFILE].cur;
    let pid = c.p.pid;
    let net = &mut *c.net;
    let mut made = None;
    let r = c.files.open_object(
        &mut c.p.fds,
        |_| {
            let id = net.open(pid, kind)?;
            made = Some(id);
            Ok(Target::Socket(id))
        },
        oflag::O_RDWR | (flags & SOCK_NONBLOCK),
        flags & SOCK_CLOEXEC != 0,
        limit,
    );
    if r.is_err()
        && let Some(id) = made
    {
        c.net.close(id);
    }
    r
}

/// `socketpair`: only `AF_UNIX` makes pairs, and there is none.
pub(crate) fn socketpair<M: Machine>(_c: &mut Ctx<'_, M>, domain: u64) -> SysResult {
    if domain as u32 == u32::from(AF_INET) {
        Err(Errno::EOPNOTSUPP)
    } else {
        Err(Errno::EAFNOSUPPORT)
    }
}

/// `bind(fd, addr, len)`.
pub(crate) fn bind<M: Machine>(c: &mut Ctx<'_, M>, fd: u64, addr: u64, len: u64) -> SysResult {
    let (id, _) = sock_of(c, fd)?;
    let a = match read_addr(c, addr, len)? {
        Some(a) => a,
        // Linux takes AF_UNSPEC with INADDR_ANY as AF_INET.
        None if len & 0xffff_ffff >= SOCKADDR_IN as u64 => {
            let mut b = [0u8; SOCKADDR_IN];
            c.read(addr, &mut b)?;
            if b[4..8] != [0; 4] {
                return Err(Errno::EAFNOSUPPORT);
            }
            Addr {
                ip: [0; 4],
                port: u16::from_be_bytes([b[2], b[3]]),
            }
        }
        None => return Err(Errno::EINVAL),
    };
    c.net.bind(id, a).map(|()| 0)
}

/// `listen(fd, backlog)`.
pub(crate) fn listen<M: Machine>(c: &mut Ctx<'_, M>, fd: u64, backlog: u64) -> SysResult {
    let (id, _) = sock_of(c, fd)?;
    c.net.listen(id, int_arg(backlog)).map(|()| 0)
}

/// `accept4(fd, addr, len, flags)` (`accept` with 0).
pub(crate) fn accept4<M: Machine>(
    c: &mut Ctx<'_, M>,
    fd: u64,
    addr: u64,
    len: u64,
    flags: u64,
) -> Result<Action, Errno> {
    let flags = flags as u32;
    if flags & !(SOCK_NONBLOCK | SOCK_CLOEXEC) != 0 {
        return Err(Errno::EINVAL);
    }
    let (id, nonblock) = sock_of(c, fd)?;
    if c.net.sock_type(id) != SOCK_STREAM {
        return Err(Errno::EOPNOTSUPP);
    }
    if !c.net.listening(id) {
        return Err(Errno::EINVAL);
    }
    if addr != 0 {
        // The length is checked before anything is taken.
        let have = i32::from_le_bytes(c.read_array(len)?);
        if have < 0 {
            return Err(Errno::EINVAL);
        }
    }
    let limit = c.p.rlimits[super::super::process::rlimit::NOFILE].cur;
    if c.p.fds.open_fds().count() as u64 >= limit {
        return Err(Errno::EMFILE);
    }
    let pid = c.p.pid;
    let timeo = c.net.sock(id).map_or(0, |s| s.opts.rcvtimeo_ns);
    let (new, peer) = match c.net.accept(id, pid) {
        Ok(x) => x,
        Err(Errno::EAGAIN) => return blocking(c, nonblock, timeo),
        Err(e) => return Err(e),
    };
    let file = OpenFile {
        target: Target::Socket(new),
        offset: 0,
        flags: oflag::O_RDWR | (flags & SOCK_NONBLOCK),
    };
    let nfd = match c
        .files
        .open(&mut c.p.fds, file, flags & SOCK_CLOEXEC != 0, limit)
    {
        Ok(fd) => fd,
        Err(e) => {
            c.net.close(new);
            return Err(e);
        }
    };
    if let Err(e) = write_addr(c, addr, len, peer) {
        // Linux has installed nothing yet when the copy fails.
        let _ = c.files.close(&mut c.p.fds, nfd);
        return Err(e);
    }
    Ok(Action::Return(nfd))
}

/// `connect(fd, addr, len)`.
pub(crate) fn connect<M: Machine>(
    c: &mut Ctx<'_, M>,
    fd: u64,
    addr: u64,
    len: u64,
) -> Result<Action, Errno> {
    let (id, nonblock) = sock_of(c, fd)?;
    if c.resumed.is_some() {
        // Made again after its wait.
        if c.net.connecting(id) {
            let timeo = c.net.sock(id).map_or(0, |s| s.opts.sndtimeo_ns);
            return match blocking(c, false, timeo) {
                Err(Errno::EAGAIN) => Err(Errno::EINPROGRESS),
                r => r,
            };
        }
        return c.net.connect_outcome(id, true).map(|()| Action::Return(0));
    }
    let to = read_addr(c, addr, len)?;
    if c.net.sock_type(id) == SOCK_DGRAM {
        return c.net.udp_connect(id, to).map(|()| Action::Return(0));
    }
    let Some(to) = to else {
        return Err(Errno::EAFNOSUPPORT);
    };
    match c.net.connect(id, to) {
        Err(Errno::EINPROGRESS) if !nonblock => {
            let timeo = c.net.sock(id).map_or(0, |s| s.opts.sndtimeo_ns);
            blocking(c, false, timeo)
        }
        Err(Errno::EALREADY) if !nonblock => blocking(c, false, 0),
        r => r.map(|()| Action::Return(0)),
    }
}

/// `getsockname` (`peer`: `getpeername`).
pub(crate) fn sockname<M: Machine>(
    c: &mut Ctx<'_, M>,
    fd: u64,
    addr: u64,
    len: u64,
    peer: bool,
) -> SysResult {
    let (id, _) = sock_of(c, fd)?;
    let a = if peer {
        c.net.peer_addr(id)?
    } else {
        c.net.local_addr(id)?
    };
    if addr == 0 {
        return Err(Errno::EFAULT);
    }
    write_addr(c, addr, len, a).map(|()| 0)
}

/// `shutdown(fd, how)`.
pub(crate) fn shutdown<M: Machine>(c: &mut Ctx<'_, M>, fd: u64, how: u64) -> SysResult {
    let (id, _) = sock_of(c, fd)?;
    c.net.shutdown(id, how as u32).map(|()| 0)
}

/// The caller's iovecs (count checked, each read once).
fn iovecs<M: Machine>(c: &mut Ctx<'_, M>, iov: u64, cnt: u64) -> Result<Vec<(u64, u64)>, Errno> {
    if cnt > 1024 {
        return Err(Errno::EMSGSIZE);
    }
    super::file::check_iov(c, iov, cnt)?;
    let mut v = Vec::new();
    v.try_reserve(cnt as usize).map_err(|_| Errno::ENOMEM)?;
    for i in 0..cnt {
        let (base, len) = super::file::iovec(c, iov, i)?;
        c.access_ok(base, len)?;
        v.push((base, len));
    }
    Ok(v)
}

/// Walks bytes `off..off + len` of the transfer the iovecs `iov`
/// describe: `f(address, offset in the chunk, count)` for each piece, in
/// order.
fn each_piece(
    iov: &[(u64, u64)],
    off: usize,
    len: usize,
    mut f: impl FnMut(u64, usize, usize) -> Result<(), Errno>,
) -> Result<(), Errno> {
    let mut skip = off as u64;
    let mut at = 0usize;
    for &(base, l) in iov {
        if at == len {
            break;
        }
        if skip >= l {
            skip -= l;
            continue;
        }
        let n = ((l - skip) as usize).min(len - at);
        f(base + skip, at, n)?;
        at += n;
        skip = 0;
    }
    Ok(())
}

/// A send of the iovecs `iov` on socket `fd` (to `to`, if given) with
/// `MSG_*` `flags`: the count, or a wait. A blocking send on a stream
/// waits until all of it is queued, as Linux's: the count so far waits in
/// [`Thread::sent`](super::super::Thread::sent), and the call made again
/// goes on from there; a timeout, an error or a signal after some of it
/// ends the call with that count.
fn send_iov<M: Machine>(
    c: &mut Ctx<'_, M>,
    fd: u64,
    iov: &[(u64, u64)],
    flags: u32,
    to: Option<Addr>,
) -> Result<Action, Errno> {
    let (id, nonblock) = sock_of(c, fd)?;
    let total: u64 = iov.iter().map(|v| v.1).sum();
    let total = total.min(0x7fff_f000) as usize;
    let dontwait = nonblock || flags & msg::DONTWAIT != 0;
    let whole = !dontwait && c.net.sock_type(id) == SOCK_STREAM;
    let skip = match c.resumed {
        Some(_) if whole => (c.t.sent as usize).min(total),
        _ => 0,
    };
    c.t.sent = 0;
    let timeo = c.net.sock(id).map_or(0, |s| s.opts.sndtimeo_ns);
    let net = &mut *c.net;
    let (m, areas) = (&mut *c.m, &c.p.areas);
    let mut fill = |off: usize, out: &mut [u8]| -> Result<(), Errno> {
        each_piece(iov, skip + off, out.len(), |addr, at, n| {
            m.read_user(areas, addr, &mut out[at..at + n])
        })
    };
    let r = net.send(id, total - skip, to, &mut fill);
    let sent = match r {
        Ok(n) => skip + n,
        Err(Errno::EAGAIN) => skip,
        // An error after some of it was queued: the count.
        Err(_) if skip > 0 => return Ok(Action::Return(skip as u64)),
        Err(e) => {
            pipe_signal(c, &Err(e), flags);
            return Err(e);
        }
    };
    if sent == total && (total > 0 || r.is_ok()) {
        return Ok(Action::Return(sent as u64));
    }
    if sent > 0 && !whole {
        return Ok(Action::Return(sent as u64));
    }
    match blocking(c, dontwait, timeo) {
        Ok(wait) => {
            c.t.sent = sent as u64;
            Ok(wait)
        }
        Err(_) if sent > 0 => Ok(Action::Return(sent as u64)),
        Err(e) => Err(e),
    }
}

/// A receive into the iovecs `iov` from socket `fd` with `MSG_*`
/// `flags`: (count, whole datagram length, sender), or a wait.
fn recv_iov<M: Machine>(
    c: &mut Ctx<'_, M>,
    fd: u64,
    iov: &[(u64, u64)],
    flags: u32,
) -> Result<Result<super::super::net::Received, Action>, Errno> {
    let (id, nonblock) = sock_of(c, fd)?;
    if flags & msg::OOB != 0 {
        return Err(Errno::EINVAL);
    }
    let total: u64 = iov.iter().map(|v| v.1).sum();
    let total = total.min(0x7fff_f000) as usize;
    // MSG_WAITALL on a blocking stream: wait until all of it is there
    // (or the connection ends).
    if flags & msg::WAITALL != 0
        && !nonblock
        && flags & (msg::DONTWAIT | msg::PEEK) == 0
        && c.net.sock_type(id) == SOCK_STREAM
        && c.net.readable_bytes(id).unwrap_or(0) < total.min(1 << 16)
        && c.net.mask(id) & super::super::event::bits::EPOLLRDHUP == 0
    {
        let timeo = c.net.sock(id).map_or(0, |s| s.opts.rcvtimeo_ns);
        if let Ok(a) = blocking(c, false, timeo) {
            return Ok(Err(a));
        }
    }
    let net = &mut *c.net;
    let (m, areas) = (&mut *c.m, &c.p.areas);
    let mut sink = |off: usize, data: &[u8]| -> Result<(), Errno> {
        each_piece(iov, off, data.len(), |addr, at, n| {
            m.write_user(areas, addr, &data[at..at + n])
        })
    };
    match net.recv(id, total, flags & msg::PEEK != 0, &mut sink) {
        Ok(r) => Ok(Ok(r)),
        Err(Errno::EAGAIN) => {
            let timeo = c.net.sock(id).map_or(0, |s| s.opts.rcvtimeo_ns);
            blocking(c, nonblock || flags & msg::DONTWAIT != 0, timeo).map(Err)
        }
        Err(e) => Err(e),
    }
}

/// `sendto(fd, buf, len, flags, addr, addrlen)` (and `send`).
pub(crate) fn sendto<M: Machine>(c: &mut Ctx<'_, M>, a: [u64; 6]) -> Result<Action, Errno> {
    let (fd, buf, len, flags) = (a[0], a[1], a[2], a[3] as u32);
    let len = if c.wide() { len } else { len & 0xffff_ffff };
    sock_of(c, fd)?;
    c.access_ok(buf, len)?;
    let to = if a[4] != 0 {
        match read_addr(c, a[4], a[5])? {
            Some(t) => Some(t),
            None => return Err(Errno::EAFNOSUPPORT),
        }
    } else {
        None
    };
    // A stream socket ignores the address (once connected).
    let to = if c.net.sock_type(sock_of(c, fd)?.0) == SOCK_STREAM {
        None
    } else {
        to
    };
    send_iov(c, fd, &[(buf, len)], flags, to)
}

/// `recvfrom(fd, buf, len, flags, addr, addrlen)` (and `recv`).
pub(crate) fn recvfrom<M: Machine>(c: &mut Ctx<'_, M>, a: [u64; 6]) -> Result<Action, Errno> {
    let (fd, buf, len, flags) = (a[0], a[1], a[2], a[3] as u32);
    let len = if c.wide() { len } else { len & 0xffff_ffff };
    sock_of(c, fd)?;
    c.access_ok(buf, len)?;
    let r = match recv_iov(c, fd, &[(buf, len)], flags)? {
        Ok(r) => r,
        Err(wait) => return Ok(wait),
    };
    if a[4] != 0 {
        match r.from {
            Some(from) if c.net.sock_type(sock_of(c, fd)?.0) == SOCK_DGRAM => {
                write_addr(c, a[4], a[5], from)?;
            }
            // A stream has no sender's address: the length says 0.
            _ => c.write(a[5], &0u32.to_le_bytes())?,
        }
    }
    let n = if flags & msg::TRUNC != 0 {
        r.len
    } else {
        r.copied
    };
    Ok(Action::Return(n as u64))
}

/// A `struct msghdr` of the caller's ABI.
struct MsgHdr {
    name: u64,
    namelen: u64,
    iov: u64,
    iovlen: u64,
}

impl MsgHdr {
    fn size(wide: bool) -> u64 {
        if wide { 56 } else { 28 }
    }

    fn read<M: Machine>(c: &mut Ctx<'_, M>, at: u64) -> Result<MsgHdr, Errno> {
        if c.wide() {
            let b: [u8; 56] = c.read_array(at)?;
            let q = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
            Ok(MsgHdr {
                name: q(0),
                namelen: u64::from(u32::from_le_bytes(b[8..12].try_into().unwrap_or_default())),
                iov: q(16),
                iovlen: q(24),
            })
        } else {
            let b: [u8; 28] = c.read_array(at)?;
            let d = |i: usize| {
                u64::from(u32::from_le_bytes(
                    b[i..i + 4].try_into().unwrap_or_default(),
                ))
            };
            Ok(MsgHdr {
                name: d(0),
                namelen: d(4),
                iov: d(8),
                iovlen: d(12),
            })
        }
    }

    /// Offsets of `msg_namelen`, `msg_controllen` and `msg_flags`.
    fn offsets(wide: bool) -> (u64, u64, u64) {
        if wide { (8, 40, 48) } else { (4, 20, 24) }
    }
}

/// `sendmsg(fd, msg, flags)`.
pub(crate) fn sendmsg<M: Machine>(
    c: &mut Ctx<'_, M>,
    fd: u64,
    at: u64,
    flags: u64,
) -> Result<Action, Errno> {
    sock_of(c, fd)?;
    let h = MsgHdr::read(c, at)?;
    let iov = iovecs(c, h.iov, h.iovlen)?;
    let to = if h.name != 0 && h.namelen != 0 && c.net.sock_type(sock_of(c, fd)?.0) == SOCK_DGRAM {
        match read_addr(c, h.name, h.namelen)? {
            Some(t) => Some(t),
            None => return Err(Errno::EAFNOSUPPORT),
        }
    } else {
        None
    };
    send_iov(c, fd, &iov, flags as u32, to)
}

/// `recvmsg(fd, msg, flags)`.
pub(crate) fn recvmsg<M: Machine>(
    c: &mut Ctx<'_, M>,
    fd: u64,
    at: u64,
    flags: u64,
) -> Result<Action, Errno> {
    sock_of(c, fd)?;
    let wide = c.wide();
    let h = MsgHdr::read(c, at)?;
    let iov = iovecs(c, h.iov, h.iovlen)?;
    let flags = flags as u32;
    let r = match recv_iov(c, fd, &iov, flags)? {
        Ok(r) => r,
        Err(wait) => return Ok(wait),
    };
    let (namelen_at, controllen_at, flags_at) = MsgHdr::offsets(wide);
    let dgram = c.net.sock_type(sock_of(c, fd)?.0) == SOCK_DGRAM;
    if h.name != 0 {
        match r.from {
            Some(from) if dgram => {
                let mut b = [0u8; SOCKADDR_IN];
                b[..2].copy_from_slice(&AF_INET.to_le_bytes());
                b[2..4].copy_from_slice(&from.port.to_be_bytes());
                b[4..8].copy_from_slice(&from.ip);
                let n = (h.namelen as usize).min(SOCKADDR_IN);
                c.write(h.name, &b[..n])?;
                c.write(at + namelen_at, &(SOCKADDR_IN as u32).to_le_bytes())?;
            }
            _ => c.write(at + namelen_at, &0u32.to_le_bytes())?,
        }
    }
    // No control messages (those of sendmsg are ignored too).
    if wide {
        c.write(at + controllen_at, &0u64.to_le_bytes())?;
    } else {
        c.write(at + controllen_at, &0u32.to_le_bytes())?;
    }
    let out_flags = if r.len > r.copied { msg::TRUNC } else { 0 };
    c.write(at + flags_at, &out_flags.to_le_bytes())?;
    let n = if flags & msg::TRUNC != 0 {
        r.len
    } else {
        r.copied
    };
    Ok(Action::Return(n as u64))
}

/// `sendmmsg(fd, msgs, n, flags)` and `recvmmsg(fd, msgs, n, flags,
/// timeout)`: one message after another, each's count in its
/// `msg_len`; a wait only before the first.
pub(crate) fn mmsg<M: Machine>(
    c: &mut Ctx<'_, M>,
    fd: u64,
    at: u64,
    n: u64,
    flags: u64,
    send: bool,
) -> Result<Action, Errno> {
    sock_of(c, fd)?;
    let n = (n & 0xffff_ffff).min(1024);
    let stride = MsgHdr::size(c.wide()) + if c.wide() { 8 } else { 4 };
    let mut done = 0u64;
    for i in 0..n {
        let m = at + i * stride;
        let f = if i == 0 {
            flags
        } else {
            flags | u64::from(msg::DONTWAIT)
        };
        let r = if send {
            sendmsg(c, fd, m, f)
        } else {
            recvmsg(c, fd, m, f)
        };
        match r {
            Ok(Action::Return(len)) => {
                c.write(m + MsgHdr::size(c.wide()), &(len as u32).to_le_bytes())?;
                done += 1;
            }
            Ok(wait) if i == 0 => return Ok(wait),
            Err(e) if i == 0 => return Err(e),
            _ => break,
        }
    }
    Ok(Action::Return(done))
}

/// `setsockopt(fd, level, name, val, len)`.
pub(crate) fn setsockopt<M: Machine>(c: &mut Ctx<'_, M>, a: [u64; 6]) -> SysResult {
    let (id, _) = sock_of(c, a[0])?;
    let (level, name, val, len) = (a[1] as u32, a[2] as u32, a[3], a[4] as u32 as i32);
    if len < 0 {
        return Err(Errno::EINVAL);
    }
    let int = |c: &mut Ctx<'_, M>| -> Result<i32, Errno> {
        if len < 4 {
            return Err(Errno::EINVAL);
        }
        Ok(i32::from_le_bytes(c.read_array(val)?))
    };
    let timeval = |c: &mut Ctx<'_, M>, new: bool| -> Result<u64, Errno> {
        let (s, us) = if c.wide() || new {
            if len < 16 {
                return Err(Errno::EINVAL);
            }
            let b: [u8; 16] = c.read_array(val)?;
            (
                i64::from_le_bytes(b[..8].try_into().unwrap_or_default()),
                i64::from_le_bytes(b[8..].try_into().unwrap_or_default()),
            )
        } else {
            if len < 8 {
                return Err(Errno::EINVAL);
            }
            let b: [u8; 8] = c.read_array(val)?;
            (
                i64::from(i32::from_le_bytes(b[..4].try_into().unwrap_or_default())),
                i64::from(i32::from_le_bytes(b[4..].try_into().unwrap_or_default())),
            )
        };
        if !(0..1_000_000).contains(&us) {
            return Err(Errno::EDOM);
        }
        if s < 0 {
            return Ok(0);
        }
        Ok((s as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(us as u64 * 1000))
    };
    let stream = c.net.sock_type(id) == SOCK_STREAM;
    let mut o = c.net.sock(id).map(|s| s.opts).ok_or(Errno::EBADF)?;
    match (level, name) {
        // SOL_SOCKET.
        (1, 2) => o.reuseaddr = int(c)? != 0,
        (1, 15) => o.reuseport = int(c)? != 0,
        (1, 9) => o.keepalive = int(c)? != 0,
        (1, 6) => o.broadcast = int(c)? != 0,
        (1, 10) => o.oobinline = int(c)? != 0,
        (1, 7 | 32) => {
            o.sndbuf = Opts::buf_value(int(c)?, Opts::SNDBUF_MIN);
            o.sndbuf_set = true;
        }
        (1, 8 | 33) => {
            o.rcvbuf = Opts::buf_value(int(c)?, Opts::RCVBUF_MIN);
            o.rcvbuf_set = true;
        }
        (1, 18) => o.rcvlowat = int(c)?.max(1) as u32,
        (1, 19) => {
            int(c)?;
            return Err(Errno::ENOPROTOOPT);
        }
        (1, 20) => o.rcvtimeo_ns = timeval(c, false)?,
        (1, 21) => o.sndtimeo_ns = timeval(c, false)?,
        (1, 66) => o.rcvtimeo_ns = timeval(c, true)?,
        (1, 67) => o.sndtimeo_ns = timeval(c, true)?,
        (1, 13) => {
            if len < 8 {
                return Err(Errno::EINVAL);
            }
            let b: [u8; 8] = c.read_array(val)?;
            o.linger = (
                i32::from_le_bytes(b[..4].try_into().unwrap_or_default()) != 0,
                i32::from_le_bytes(b[4..].try_into().unwrap_or_default()).max(0) as u32,
            );
        }
        // SO_DEBUG, SO_DONTROUTE, SO_PRIORITY, SO_TIMESTAMP, SO_BUSY_POLL,
        // SO_INCOMING_CPU, SO_ZEROCOPY: taken, no effect.
        (1, 1 | 5 | 12 | 29 | 46 | 49 | 60) => {
            int(c)?;
        }
        (1, 26 | 27) => return Err(Errno::EINVAL),
        // IPPROTO_IP.
        (0, 1) => o.tos = int(c)? as u8,
        (0, 2) => {
            let v = int(c)?;
            if !(-1..=255).contains(&v) || v == 0 {
                return Err(Errno::EINVAL);
            }
            o.ttl = if v == -1 { 0 } else { v as u8 };
        }
        // IP_RECVERR, IP_PKTINFO, IP_MTU_DISCOVER, IP_RECVTOS, IP_BIND_ADDRESS_NO_PORT,
        // IP_FREEBIND, IP_MULTICAST_TTL/LOOP: taken, no effect.
        (0, 11 | 8 | 10 | 13 | 24 | 15 | 33 | 34) => {
            int(c)?;
        }
        // IPPROTO_TCP.
        (6, _) if !stream => return Err(Errno::ENOPROTOOPT),
        (6, 1) => o.nodelay = int(c)? != 0,
        (6, 2) => {
            let v = int(c)?;
            if v != 0 && !(88..=65535).contains(&v) {
                return Err(Errno::EINVAL);
            }
            o.maxseg = v as u32;
        }
        (6, 3) => o.cork = int(c)? != 0,
        (6, 4..=6) => {
            let v = int(c)?;
            if !(1..=32767).contains(&v) {
                return Err(Errno::EINVAL);
            }
            match name {
                4 => o.keepidle = v as u32,
                5 => o.keepintvl = v as u32,
                _ => o.keepcnt = v as u32,
            }
        }
        (6, 9) => o.defer_accept = int(c)?.max(0) as u32,
        (6, 12) => o.quickack = int(c)? != 0,
        (6, 18) => {
            let v = int(c)?;
            if v < 0 {
                return Err(Errno::EINVAL);
            }
            o.user_timeout = v as u32;
        }
        // TCP_FASTOPEN, TCP_FASTOPEN_CONNECT, TCP_NOTSENT_LOWAT,
        // TCP_CONGESTION ... : taken, no effect.
        (6, 23 | 30 | 25) => {
            int(c)?;
        }
        (6, 13) => {
            if len < 1 {
                return Err(Errno::EINVAL);
            }
        }
        // IPPROTO_UDP options, IPPROTO_IPV6 on an IPv4 socket.
        (17, _) if stream => return Err(Errno::ENOPROTOOPT),
        (17, _) => {
            int(c)?;
        }
        _ => return Err(Errno::ENOPROTOOPT),
    }
    let Some(s) = c.net.sock_mut_opts(id) else {
        return Err(Errno::EBADF);
    };
    *s = o;
    c.net.options_changed(id);
    Ok(0)
}

/// `getsockopt(fd, level, name, val, lenp)`.
pub(crate) fn getsockopt<M: Machine>(c: &mut Ctx<'_, M>, a: [u64; 6]) -> SysResult {
    let (id, _) = sock_of(c, a[0])?;
    let (level, name, val, lenp) = (a[1] as u32, a[2] as u32, a[3], a[4]);
    let len = i32::from_le_bytes(c.read_array(lenp)?);
    if len < 0 {
        return Err(Errno::EINVAL);
    }
    let o = c.net.sock(id).map(|s| s.opts).ok_or(Errno::EBADF)?;
    let stream = c.net.sock_type(id) == SOCK_STREAM;
    let timeval = |c: &Ctx<'_, M>, ns: u64, new: bool| -> Vec<u8> {
        let (s, us) = (ns / 1_000_000_000, (ns % 1_000_000_000) / 1000);
        let mut v = Vec::new();
        if c.wide() || new {
            v.extend_from_slice(&s.to_le_bytes());
            v.extend_from_slice(&us.to_le_bytes());
        } else {
            v.extend_from_slice(&(s as u32).to_le_bytes());
            v.extend_from_slice(&(us as u32).to_le_bytes());
        }
        v
    };
    let v: Vec<u8> = match (level, name) {
        (1, 2) => (o.reuseaddr as i32).to_le_bytes().into(),
        (1, 15) => (o.reuseport as i32).to_le_bytes().into(),
        (1, 9) => (o.keepalive as i32).to_le_bytes().into(),
        (1, 6) => (o.broadcast as i32).to_le_bytes().into(),
        (1, 10) => (o.oobinline as i32).to_le_bytes().into(),
        (1, 3) => (c.net.sock_type(id) as i32).to_le_bytes().into(),
        (1, 4) => {
            let e = c.net.take_error(id)?;
            (e.map_or(0, |e| e.number() as i32)).to_le_bytes().into()
        }
        (1, 7) => (o.sndbuf as i32).to_le_bytes().into(),
        (1, 8) => (o.rcvbuf as i32).to_le_bytes().into(),
        (1, 18) => (o.rcvlowat as i32).to_le_bytes().into(),
        (1, 19) => 1i32.to_le_bytes().into(),
        (1, 20) => timeval(c, o.rcvtimeo_ns, false),
        (1, 21) => timeval(c, o.sndtimeo_ns, false),
        (1, 66) => timeval(c, o.rcvtimeo_ns, true),
        (1, 67) => timeval(c, o.sndtimeo_ns, true),
        (1, 13) => {
            let mut v: Vec<u8> = (o.linger.0 as i32).to_le_bytes().into();
            v.extend_from_slice(&(o.linger.1 as i32).to_le_bytes());
            v
        }
        (1, 30) => (c.net.listening(id) as i32).to_le_bytes().into(),
        (1, 38) => (if stream { 6i32 } else { 17 }).to_le_bytes().into(),
        (1, 39) => i32::from(AF_INET).to_le_bytes().into(),
        (1, 1 | 5 | 12 | 29) => 0i32.to_le_bytes().into(),
        (0, 1) => i32::from(o.tos).to_le_bytes().into(),
        (0, 2) => (if o.ttl == 0 { 64 } else { i32::from(o.ttl) })
            .to_le_bytes()
            .into(),
        (6, _) if !stream => return Err(Errno::EOPNOTSUPP),
        (6, 1) => (o.nodelay as i32).to_le_bytes().into(),
        (6, 2) => (if o.maxseg == 0 { 536 } else { o.maxseg as i32 })
            .to_le_bytes()
            .into(),
        (6, 3) => (o.cork as i32).to_le_bytes().into(),
        (6, 4) => (o.keepidle as i32).to_le_bytes().into(),
        (6, 5) => (o.keepintvl as i32).to_le_bytes().into(),
        (6, 6) => (o.keepcnt as i32).to_le_bytes().into(),
        (6, 9) => (o.defer_accept as i32).to_le_bytes().into(),
        (6, 12) => (o.quickack as i32).to_le_bytes().into(),
        (6, 18) => (o.user_timeout as i32).to_le_bytes().into(),
        // A level the socket has, an option it does not: ENOPROTOOPT; a
        // level it does not have reaches ip_getsockopt: EOPNOTSUPP.
        (1 | 0 | 6, _) => return Err(Errno::ENOPROTOOPT),
        (17, _) if !stream => return Err(Errno::ENOPROTOOPT),
        _ => return Err(Errno::EOPNOTSUPP),
    };
    // Linux copies at most the caller's length (an int option of a
    // shorter buffer is EINVAL for most; take the common rule).
    if (len as usize) < v.len() && v.len() == 4 && len < 4 {
        return Err(Errno::EINVAL);
    }
    let n = (len as usize).min(v.len());
    c.write(val, &v[..n])?;
    c.write(lenp, &(n as u32).to_le_bytes())?;
    Ok(0)
}

/// Reads and writes of a socket descriptor (`read`, `write`, `readv`,
/// `writev`), as `recv`/`send` without flags.
pub(crate) fn rw<M: Machine>(c: &mut Ctx<'_, M>, call: Sys, a: [u64; 6]) -> Result<Action, Errno> {
    let fd = a[0];
    let iov = match call {
        Sys::Read | Sys::Write => {
            let len = if c.wide() { a[2] } else { a[2] & 0xffff_ffff };
            c.access_ok(a[1], len)?;
            alloc::vec![(a[1], len)]
        }
        _ => iovecs(c, a[1], a[2]).map_err(|e| {
            if e == Errno::EMSGSIZE {
                Errno::EINVAL
            } else {
                e
            }
        })?,
    };
    if matches!(call, Sys::Read | Sys::Readv) {
        match recv_iov(c, fd, &iov, 0)? {
            Ok(r) => Ok(Action::Return(r.copied as u64)),
            Err(wait) => Ok(wait),
        }
    } else {
        send_iov(c, fd, &iov, 0, None)
    }
}

/// The number of arguments of each `socketcall` sub-call (1..=20).
const SOCKETCALL_ARGS: [u8; 21] = [
    0, 3, 3, 3, 2, 3, 3, 3, 4, 4, 4, 6, 6, 2, 5, 5, 3, 3, 4, 5, 4,
];

/// i386 `socketcall(call, args)`: the sub-call's arguments are 32-bit
/// words at `args`.
pub(crate) fn socketcall<M: Machine>(
    c: &mut Ctx<'_, M>,
    call: u64,
    args: u64,
) -> Result<Action, Errno> {
    let call = call as u32;
    let n = *SOCKETCALL_ARGS
        .get(call as usize)
        .filter(|&&n| n > 0)
        .ok_or(Errno::EINVAL)? as usize;
    let mut a = [0u64; 6];
    let mut b = [0u8; 24];
    c.read(args, &mut b[..n * 4])?;
    for (i, w) in a.iter_mut().enumerate().take(n) {
        *w = u64::from(u32::from_le_bytes(
            b[i * 4..i * 4 + 4].try_into().unwrap_or_default(),
        ));
    }
    let r = |v: SysResult| v.map(Action::Return);
    match call {
        1 => r(socket(c, a[0], a[1], a[2])),
        2 => r(bind(c, a[0], a[1], a[2])),
        3 => connect(c, a[0], a[1], a[2]),
        4 => r(listen(c, a[0], a[1])),
        5 => accept4(c, a[0], a[1], a[2], 0),
        6 => r(sockname(c, a[0], a[1], a[2], false)),
        7 => r(sockname(c, a[0], a[1], a[2], true)),
        8 => r(socketpair(c, a[0])),
        9 => sendto(c, [a[0], a[1], a[2], a[3], 0, 0]),
        10 => recvfrom(c, [a[0], a[1], a[2], a[3], 0, 0]),
        11 => sendto(c, a),
        12 => recvfrom(c, a),
        13 => r(shutdown(c, a[0], a[1])),
        14 => r(setsockopt(c, a)),
        15 => r(getsockopt(c, a)),
        16 => sendmsg(c, a[0], a[1], a[2]),
        17 => recvmsg(c, a[0], a[1], a[2]),
        18 => accept4(c, a[0], a[1], a[2], a[3]),
        19 => mmsg(c, a[0], a[1], a[2], a[3], false),
        _ => mmsg(c, a[0], a[1], a[2], a[3], true),
    }
}
