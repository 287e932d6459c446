//! eventfd and epoll.
//!
//! An eventfd is a 64-bit counter read and written 8 bytes at a time; an
//! epoll instance keeps an interest list and a ready list
//! ([`Epoll`](super::super::event::Epoll)) fed by the events of the files
//! it watches. Both are file descriptions of the process's table, so
//! `dup`, `close`, `fcntl` and `O_CLOEXEC` work on them as on any file.
//! Linux's `struct epoll_event` is packed on x86 (`__EPOLL_PACKED`), so
//! it is 12 bytes in both ABIs: `events` then `data`.

use super::super::errno::{Errno, SysResult};
use super::super::event::{EventFd, Obj, bits::*, poll};
use super::super::fd::{OpenFile, Target, oflag};
use super::super::machine::Machine;
use super::super::process::rlimit;
use super::super::{Action, Process};
use super::Ctx;

/// `EFD_SEMAPHORE`.
pub(crate) const EFD_SEMAPHORE: u32 = 1;
/// `EPOLL_CTL_ADD`, `_DEL`, `_MOD`.
const EPOLL_CTL_ADD: u32 = 1;
const EPOLL_CTL_DEL: u32 = 2;
const EPOLL_CTL_MOD: u32 = 3;
/// The size of a `struct epoll_event` (packed, both ABIs).
const EVENT_SIZE: u64 = 12;
/// Linux's `EP_MAX_EVENTS`.
const MAX_EVENTS: i32 = (i32::MAX as u64 / EVENT_SIZE) as i32;

fn limit(p: &Process) -> u64 {
    p.rlimits[rlimit::NOFILE].cur
}

/// `eventfd(initval)` (`flags` 0) and `eventfd2(initval, flags)`.
pub(crate) fn eventfd2<M: Machine>(c: &mut Ctx<'_, M>, initval: u32, flags: u32) -> SysResult {
    if flags & !(EFD_SEMAPHORE | oflag::O_CLOEXEC | oflag::O_NONBLOCK) != 0 {
        return Err(Errno::EINVAL);
    }
    let lim = limit(c.p);
    c.files.open_object(
        &mut c.p.fds,
        |t| {
            super::super::fd::put_in(
                &mut t.eventfds,
                EventFd {
                    count: initval.into(),
                    semaphore: flags & EFD_SEMAPHORE != 0,
                },
            )
            .map(Target::EventFd)
        },
        oflag::O_RDWR | (flags & oflag::O_NONBLOCK),
        flags & oflag::O_CLOEXEC != 0,
        lim,
    )
}

/// A read of eventfd `id` (the wait is [`io_wait`](super::file::io_wait)'s):
/// the counter (or 1 with `EFD_SEMAPHORE`), as 8 bytes.
pub(crate) fn eventfd_read<M: Machine>(
    c: &mut Ctx<'_, M>,
    id: usize,
    buf: u64,
    len: u64,
) -> SysResult {
    if len < 8 {
        return Err(Errno::EINVAL);
    }
    let e = c.files.eventfd_ref(id).ok_or(Errno::EBADF)?;
    if e.count == 0 {
        return Err(Errno::EAGAIN);
    }
    let v = if e.semaphore { 1 } else { e.count };
    c.write(buf, &v.to_le_bytes())?;
    if let Some(e) = c.files.eventfd_mut(id) {
        e.count -= v;
    }
    c.changed(Obj::EventFd(id), EPOLLOUT);
    Ok(8)
}

/// A write to eventfd `id`: adds the 8-byte value to the counter.
/// `EINVAL` for fewer than 8 bytes or the value `u64::MAX`, `EAGAIN` when
/// the sum would reach it.
pub(crate) fn eventfd_write<M: Machine>(
    c: &mut Ctx<'_, M>,
    id: usize,
    buf: u64,
    len: u64,
) -> SysResult {
    if len < 8 {
        return Err(Errno::EINVAL);
    }
    let v = u64::from_le_bytes(c.read_array(buf)?);
    if v == u64::MAX {
        return Err(Errno::EINVAL);
    }
    let e = c.files.eventfd_mut(id).ok_or(Errno::EBADF)?;
    if u64::MAX - e.count <= v {
        return Err(Errno::EAGAIN);
    }
    e.count += v;
    c.changed(Obj::EventFd(id), EPOLLIN);
    Ok(8)
}

/// `epoll_create1(flags)`; `epoll_create(size)` is `size > 0` and no flags.
pub(crate) fn epoll_create1<M: Machine>(c: &mut Ctx<'_, M>, flags: u32) -> SysResult {
    if flags & !oflag::O_CLOEXEC != 0 {
        return Err(Errno::EINVAL);
    }
    let lim = limit(c.p);
    c.files.open_object(
        &mut c.p.fds,
        |t| super::super::fd::put_in(&mut t.epolls, Default::default()).map(Target::Epoll),
        oflag::O_RDWR,
        flags & oflag::O_CLOEXEC != 0,
        lim,
    )
}

/// The epoll instance behind `epfd`: `EBADF` if not open, `EINVAL` if not
/// an epoll.
fn epoll_of<M: Machine>(c: &Ctx<'_, M>, epfd: u64) -> Result<usize, Errno> {
    match c.files.get(&c.p.fds, epfd)?.target {
        Target::Epoll(id) => Ok(id),
        _ => Err(Errno::EINVAL),
    }
}

/// `epoll_ctl(epfd, op, fd, event)`, with Linux's order of checks.
pub(crate) fn epoll_ctl<M: Machine>(
    c: &mut Ctx<'_, M>,
    epfd: u64,
    op: u32,
    fd: u64,
    event: u64,
) -> SysResult {
    let (events, data) = if op != EPOLL_CTL_DEL {
        let b: [u8; 12] = c.read_array(event)?;
        let mut ev = [0u8; 4];
        ev.copy_from_slice(&b[..4]);
        let mut d = [0u8; 8];
        d.copy_from_slice(&b[4..]);
        (u32::from_le_bytes(ev), u64::from_le_bytes(d))
    } else {
        (0, 0)
    };
    let ep_desc = c.p.fds.desc_of(epfd)?;
    let desc = c.p.fds.desc_of(fd)?;
    let target: OpenFile = c.files.get(&c.p.fds, fd)?.clone();
    if !poll::can_poll(&target) {
        return Err(Errno::EPERM);
    }
    let id = epoll_of(c, epfd)?;
    if ep_desc == desc {
        return Err(Errno::EINVAL);
    }
    if op != EPOLL_CTL_DEL && events & EPOLLEXCLUSIVE != 0 {
        const OK: u32 = EPOLLIN | EPOLLOUT | EPOLLERR | EPOLLHUP | EPOLLWAKEUP | EPOLLET;
        if op == EPOLL_CTL_MOD
            || op == EPOLL_CTL_ADD
                && (matches!(target.target, Target::Epoll(_))
                    || events & !(OK | EPOLLEXCLUSIVE) != 0)
        {
            return Err(Errno::EINVAL);
        }
    }
    if op == EPOLL_CTL_ADD
        && let Target::Epoll(inner) = target.target
        && poll::loops(c.files, inner, id, 0)
    {
        return Err(Errno::ELOOP);
    }
    let ready_now = c.files.poll_mask(c.net, &target);
    let ep = c.files.epoll_mut(id).ok_or(Errno::EBADF)?;
    match op {
        EPOLL_CTL_ADD => ep.add(fd, desc, events, data, ready_now)?,
        EPOLL_CTL_MOD => ep.modify(fd, desc, events, data, ready_now)?,
        EPOLL_CTL_DEL => ep.delete(fd, desc)?,
        _ => return Err(Errno::EINVAL),
    }
    if op != EPOLL_CTL_DEL && ready_now & (events | EPOLLERR | EPOLLHUP) != 0 {
        // Its ready list grew: those waiting on it (or on an epoll
        // watching it) look again.
        c.changed(Obj::Epoll(id), EPOLLIN | EPOLLRDNORM);
    }
    Ok(0)
}

/// `epoll_wait`, `epoll_pwait`, `epoll_pwait2`: up to `max` ready events
/// into `events`; with none, wait for one or the timeout (`None`: none).
pub(crate) fn epoll_wait<M: Machine>(
    c: &mut Ctx<'_, M>,
    epfd: u64,
    events: u64,
    max: i32,
    timeout_ns: Option<u64>,
) -> Result<Action, Errno> {
    if max <= 0 || max > MAX_EVENTS {
        return Err(Errno::EINVAL);
    }
    c.access_ok(events, max as u64 * EVENT_SIZE)?;
    let id = epoll_of(c, epfd)?;
    let got = poll::collect(c.files, c.net, id, max as usize);
    if got.is_empty() {
        return Ok(c.wait_or_time_out(timeout_ns));
    }
    for (i, (ev, data)) in got.iter().enumerate() {
        let mut b = [0u8; 12];
        b[..4].copy_from_slice(&ev.to_le_bytes());
        b[4..].copy_from_slice(&data.to_le_bytes());
        if let Err(e) = c.write(events + i as u64 * EVENT_SIZE, &b) {
            return if i == 0 {
                Err(e)
            } else {
                Ok(Action::Return(i as u64))
            };
        }
    }
    Ok(Action::Return(got.len() as u64))
}
