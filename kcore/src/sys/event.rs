//! Event files and readiness: the eventfd counter, the epoll instance and
//! its interest list, and [`poll::mask`], the one place each kind of file
//! answers what it is ready for (pipe, eventfd, regular file, console,
//! epoll itself), for `poll`, `select` and epoll alike. A new kind of
//! file (a socket) answers there and reports its changes through
//! [`Files::event`](super::fd::Files::event).

use alloc::vec::Vec;

use super::errno::Errno;

/// The `EPOLL*` (and `POLL*`) bits.
pub mod bits {
    /// Readable.
    pub const EPOLLIN: u32 = 0x1;
    /// Priority data.
    pub const EPOLLPRI: u32 = 0x2;
    /// Writable.
    pub const EPOLLOUT: u32 = 0x4;
    /// Error (always reported).
    pub const EPOLLERR: u32 = 0x8;
    /// Hang-up (always reported).
    pub const EPOLLHUP: u32 = 0x10;
    /// `poll`'s invalid descriptor.
    pub const POLLNVAL: u32 = 0x20;
    /// Normal data readable.
    pub const EPOLLRDNORM: u32 = 0x40;
    /// Priority band readable.
    pub const EPOLLRDBAND: u32 = 0x80;
    /// Normal data writable.
    pub const EPOLLWRNORM: u32 = 0x100;
    /// Priority band writable.
    pub const EPOLLWRBAND: u32 = 0x200;
    /// Peer closed its writing half.
    pub const EPOLLRDHUP: u32 = 0x2000;
    /// Wake one of several epolls watching the same file.
    pub const EPOLLEXCLUSIVE: u32 = 1 << 28;
    /// Keep the system awake (accepted, meaningless here).
    pub const EPOLLWAKEUP: u32 = 1 << 29;
    /// Report once, then disable until `EPOLL_CTL_MOD`.
    pub const EPOLLONESHOT: u32 = 1 << 30;
    /// Edge-triggered.
    pub const EPOLLET: u32 = 1 << 31;
    /// The bits that say how to report, not what.
    pub const EP_PRIVATE_BITS: u32 = EPOLLWAKEUP | EPOLLONESHOT | EPOLLET | EPOLLEXCLUSIVE;
    /// A regular file's readiness (Linux's `DEFAULT_POLLMASK`).
    pub const DEFAULT_POLLMASK: u32 = EPOLLIN | EPOLLOUT | EPOLLRDNORM | EPOLLWRNORM;
}

use bits::*;

/// An object that events happen to (what a description refers to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Obj {
    /// A pipe, both its ends.
    Pipe(usize),
    /// An eventfd.
    EventFd(usize),
    /// An epoll instance (its ready list gained an entry).
    Epoll(usize),
    /// A socket of the run.
    Socket(usize),
}

impl Obj {
    /// What description target `t` refers to, if events happen to it.
    pub fn of(t: super::fd::Target) -> Option<Obj> {
        use super::fd::Target;
        match t {
            Target::Pipe { id, .. } => Some(Obj::Pipe(id)),
            Target::EventFd(id) => Some(Obj::EventFd(id)),
            Target::Epoll(id) => Some(Obj::Epoll(id)),
            Target::Socket(id) => Some(Obj::Socket(id)),
            _ => None,
        }
    }
}

/// An eventfd: a 64-bit counter.
#[derive(Debug, Clone, Default)]
pub struct EventFd {
    /// The counter.
    pub count: u64,
    /// `EFD_SEMAPHORE`: a read takes 1, not everything.
    pub semaphore: bool,
}

/// One file an epoll instance watches (Linux's `epitem`): keyed by the
/// descriptor number it was added with and its description.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The descriptor number given to `EPOLL_CTL_ADD`.
    pub fd: u64,
    /// The description's index in the table.
    pub desc: usize,
    /// What to report (with `EPOLLERR | EPOLLHUP` always) and how.
    pub events: u32,
    /// Handed back as given.
    pub data: u64,
    /// Its place in the ready list (smaller first), when on it.
    ready: Option<u64>,
}

/// An epoll instance.
#[derive(Debug, Clone, Default)]
pub struct Epoll {
    entries: Vec<Entry>,
    next: u64,
}

/// The deepest epoll nesting Linux allows (`EP_MAX_NESTS`).
const MAX_NESTS: u32 = 4;

impl Epoll {
    /// Drops the entries of description `desc` (its last reference went).
    pub(super) fn forget(&mut self, desc: usize) {
        self.entries.retain(|e| e.desc != desc);
    }

    /// The entry for (`fd`, `desc`), if watched.
    pub fn find(&self, fd: u64, desc: usize) -> Option<&Entry> {
        self.entries.iter().find(|e| e.fd == fd && e.desc == desc)
    }

    /// How many files it watches.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it watches nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn queue(&mut self, i: usize) {
        if self.entries[i].ready.is_none() {
            self.entries[i].ready = Some(self.next);
            self.next += 1;
        }
    }

    /// `EPOLL_CTL_ADD`: `ready_now` is the file's current readiness.
    pub(super) fn add(
        &mut self,
        fd: u64,
        desc: usize,
        events: u32,
        data: u64,
        ready_now: u32,
    ) -> Result<(), Errno> {
        if self.find(fd, desc).is_some() {
            return Err(Errno::EEXIST);
        }
        self.entries.try_reserve(1).map_err(|_| Errno::ENOMEM)?;
        let events = events | EPOLLERR | EPOLLHUP;
        self.entries.push(Entry {
            fd,
            desc,
            events,
            data,
            ready: None,
        });
        if ready_now & events != 0 {
            let i = self.entries.len() - 1;
            self.queue(i);
        }
        Ok(())
    }

    /// `EPOLL_CTL_MOD`.
    pub(super) fn modify(
        &mut self,
        fd: u64,
        desc: usize,
        events: u32,
        data: u64,
        ready_now: u32,
    ) -> Result<(), Errno> {
        let i = self
            .entries
            .iter()
            .position(|e| e.fd == fd && e.desc == desc)
            .ok_or(Errno::ENOENT)?;
        if self.entries[i].events & EPOLLEXCLUSIVE != 0 {
            return Err(Errno::EINVAL);
        }
        let events = events | EPOLLERR | EPOLLHUP;
        self.entries[i].events = events;
        self.entries[i].data = data;
        if ready_now & events != 0 {
            self.queue(i);
        }
        Ok(())
    }

    /// `EPOLL_CTL_DEL`.
    pub(super) fn delete(&mut self, fd: u64, desc: usize) -> Result<(), Errno> {
        let i = self
            .entries
            .iter()
            .position(|e| e.fd == fd && e.desc == desc)
            .ok_or(Errno::ENOENT)?;
        self.entries.remove(i);
        Ok(())
    }

    /// An event with `key` on the file of entry `i`: the entry joins the
    /// ready list unless it is disabled (a one-shot that fired) or the
    /// key is for something it does not watch. Whether it joined.
    fn callback(&mut self, i: usize, key: u32) -> bool {
        let e = &self.entries[i];
        if e.events & !EP_PRIVATE_BITS == 0 || (key != 0 && key & e.events == 0) {
            return false;
        }
        let new = e.ready.is_none();
        self.queue(i);
        new
    }
}

/// Readiness and events.
pub mod poll {
    use super::super::fd::{Files, OpenFile, PIPE_CAPACITY, Target};
    use super::super::net::Net;
    use super::*;

    /// What description `f` of the run's files `t` is ready for (`EPOLL*` bits), as
    /// each kind of file's `poll` answers it on Linux. `depth` counts
    /// nested epolls.
    pub fn mask(t: &Files, net: &mut Net, f: &OpenFile, depth: u32) -> u32 {
        match f.target {
            Target::Socket(id) => net.mask(id),
            // Always at end of file.
            Target::Stdin => EPOLLIN | EPOLLRDNORM,
            Target::Console(_) => EPOLLOUT | EPOLLWRNORM,
            Target::Node(_) => DEFAULT_POLLMASK,
            Target::Pipe { id, write } => {
                let Some(p) = t.pipe_ref(id) else {
                    return 0;
                };
                let mut m = 0;
                if write {
                    if p.buf.len() < PIPE_CAPACITY {
                        m |= EPOLLOUT | EPOLLWRNORM;
                    }
                    if p.readers == 0 {
                        m |= EPOLLERR;
                    }
                } else {
                    if !p.buf.is_empty() {
                        m |= EPOLLIN | EPOLLRDNORM;
                    }
                    if p.writers == 0 {
                        m |= EPOLLHUP;
                    }
                }
                m
            }
            Target::EventFd(id) => {
                let Some(e) = t.eventfd_ref(id) else {
                    return 0;
                };
                let mut m = 0;
                if e.count > 0 {
                    m |= EPOLLIN;
                }
                if e.count == u64::MAX {
                    m |= EPOLLERR;
                }
                if e.count < u64::MAX - 1 {
                    m |= EPOLLOUT;
                }
                m
            }
            Target::Epoll(id) => {
                if depth > MAX_NESTS {
                    return 0;
                }
                let Some(ep) = t.epoll_ref(id) else {
                    return 0;
                };
                let ready = ep.entries.iter().any(|e| {
                    e.ready.is_some()
                        && t.desc(e.desc)
                            .is_some_and(|d| mask(t, net, d, depth + 1) & e.events != 0)
                });
                if ready { EPOLLIN | EPOLLRDNORM } else { 0 }
            }
        }
    }

    /// Whether `f` can be watched by epoll (Linux's `file_can_poll`):
    /// regular files and directories cannot.
    pub fn can_poll(f: &OpenFile) -> bool {
        !matches!(f.target, Target::Node(_))
    }

    /// Runs the callbacks of the entries watching `obj` (see
    /// [`Files::event`]); an epoll whose ready list grew tells those
    /// watching it in turn.
    pub(in super::super) fn event(t: &mut Files, obj: Obj, key: u32, depth: u32) {
        if depth > MAX_NESTS {
            return;
        }
        let mut grew: Vec<usize> = Vec::new();
        for i in 0..t.epolls.len() {
            let Some(ep) = t.epolls[i].as_ref() else {
                continue;
            };
            let hits: Vec<usize> = ep
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| {
                    t.desc(e.desc)
                        .is_some_and(|d| Obj::of(d.target) == Some(obj))
                })
                .map(|(j, _)| j)
                .collect();
            let Some(ep) = t.epolls[i].as_mut() else {
                continue;
            };
            let mut any = false;
            for j in hits {
                any |= ep.callback(j, key);
            }
            if any && grew.try_reserve(1).is_ok() {
                grew.push(i);
            }
        }
        for i in grew {
            event(t, Obj::Epoll(i), EPOLLIN | EPOLLRDNORM, depth + 1);
        }
    }

    /// Takes up to `max` events from epoll `id`'s ready list, as Linux's
    /// `ep_send_events`: an entry no longer ready leaves the list, a
    /// reported one-shot is disabled, a reported level-triggered entry
    /// goes back to the end of the list, an edge-triggered one leaves it.
    pub fn collect(t: &mut Files, net: &mut Net, id: usize, max: usize) -> Vec<(u32, u64)> {
        let Some(ep) = t.epoll_ref(id) else {
            return Vec::new();
        };
        let mut order: Vec<(u64, usize, u32)> = ep
            .entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                let seq = e.ready?;
                let m = t.desc(e.desc).map_or(0, |d| mask(t, net, d, 1));
                Some((seq, i, m & e.events))
            })
            .collect();
        order.sort_unstable();
        let mut out = Vec::new();
        let Some(ep) = t.epoll_mut(id) else {
            return out;
        };
        for (_, i, revents) in order {
            if out.len() >= max {
                break;
            }
            let e = &mut ep.entries[i];
            e.ready = None;
            if revents == 0 {
                continue;
            }
            if out.try_reserve(1).is_err() {
                ep.queue(i);
                break;
            }
            out.push((revents & !EP_PRIVATE_BITS, e.data));
            if e.events & EPOLLONESHOT != 0 {
                e.events &= EP_PRIVATE_BITS;
            } else if e.events & EPOLLET == 0 {
                ep.queue(i);
            }
        }
        out
    }

    /// Whether epoll `inner` watches epoll `outer`, directly or through
    /// others, or nests deeper than Linux allows (adding `inner` to
    /// `outer` would then be `ELOOP`).
    pub fn loops(t: &Files, inner: usize, outer: usize, depth: u32) -> bool {
        if inner == outer || depth >= MAX_NESTS {
            return true;
        }
        let Some(ep) = t.epoll_ref(inner) else {
            return false;
        };
        ep.entries
            .iter()
            .any(|e| match t.desc(e.desc).map(|d| d.target) {
                Some(Target::Epoll(j)) => loops(t, j, outer, depth + 1),
                _ => false,
            })
    }
}
