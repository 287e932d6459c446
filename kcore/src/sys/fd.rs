//! Each process's file-descriptor table ([`FdTable`]) and the run's open
//! file descriptions ([`Files`]).
//!
//! A descriptor points at an open file description (what `open` made);
//! `dup` makes another descriptor for the same description, so the two
//! share the offset and status flags, as on Linux. The close-on-exec flag
//! belongs to the descriptor. Descriptions, and the pipes, eventfds and
//! epoll instances they refer to, belong to the run, not to one table:
//! a table copied for a new process ([`Files::copy_table`]) names the same
//! descriptions, and a description goes when the last descriptor of any
//! table that names it closes.

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use super::errno::Errno;
use super::event::{Epoll, EventFd, Obj, poll};
use super::fs::NodeId;
use super::machine::Stream;
use super::net::Net;

/// The default (and hard) `RLIMIT_NOFILE`.
pub const NOFILE_LIMIT: u64 = 1024;

/// `O_ACCMODE` and the status flags kept in a description.
pub mod oflag {
    /// Access-mode mask.
    pub const O_ACCMODE: u32 = 3;
    /// Read only.
    pub const O_RDONLY: u32 = 0;
    /// Write only.
    pub const O_WRONLY: u32 = 1;
    /// Read and write.
    pub const O_RDWR: u32 = 2;
    /// Create if missing.
    pub const O_CREAT: u32 = 0o100;
    /// With `O_CREAT`: fail if it exists.
    pub const O_EXCL: u32 = 0o200;
    /// Not a controlling terminal (ignored).
    pub const O_NOCTTY: u32 = 0o400;
    /// Truncate to zero on open.
    pub const O_TRUNC: u32 = 0o1000;
    /// Writes go to the end.
    pub const O_APPEND: u32 = 0o2000;
    /// Non-blocking (recorded).
    pub const O_NONBLOCK: u32 = 0o4000;
    /// Must be a directory.
    pub const O_DIRECTORY: u32 = 0o200000;
    /// Do not follow a final symlink.
    pub const O_NOFOLLOW: u32 = 0o400000;
    /// Close on exec.
    pub const O_CLOEXEC: u32 = 0o2000000;
    /// Path-only descriptor.
    pub const O_PATH: u32 = 0o10000000;
    /// 64-bit offsets (i386 libcs set it; meaningless here).
    pub const O_LARGEFILE: u32 = 0o100000;
    /// Status flags `F_SETFL` may change.
    pub const SETFL_MASK: u32 = O_APPEND | O_NONBLOCK;
}

/// What an open file description refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Standard input: always at end of file.
    Stdin,
    /// Standard output or error: the console, through the line buffers.
    Console(Stream),
    /// A file-system node.
    Node(NodeId),
    /// One end of a pipe of the run ([`Files::pipe_mut`]).
    Pipe {
        /// The pipe.
        id: usize,
        /// Whether this is the write end.
        write: bool,
    },
    /// An eventfd counter of the run ([`Files::eventfd_mut`]).
    EventFd(usize),
    /// An epoll instance of the run ([`Files::epoll_mut`]).
    Epoll(usize),
    /// A socket of the run ([`Net`](super::net::Net)).
    Socket(usize),
}

/// How many bytes a pipe holds (Linux's default pipe size).
pub const PIPE_CAPACITY: usize = 65536;

/// A pipe: the bytes written and not yet read, and how many open file
/// descriptions each end has.
#[derive(Debug, Clone, Default)]
pub struct Pipe {
    /// Buffered bytes (at most [`PIPE_CAPACITY`]).
    pub buf: VecDeque<u8>,
    /// Open read ends.
    pub readers: usize,
    /// Open write ends.
    pub writers: usize,
}

/// An open file description.
#[derive(Debug, Clone)]
pub struct OpenFile {
    /// What it refers to.
    pub target: Target,
    /// The file offset (for directories: the index of the next entry).
    pub offset: u64,
    /// Access mode and status flags (`O_ACCMODE`, `O_APPEND`, ...).
    pub flags: u32,
}

impl OpenFile {
    /// Whether it was opened for reading.
    pub fn readable(&self) -> bool {
        self.flags & oflag::O_ACCMODE != oflag::O_WRONLY && self.flags & oflag::O_PATH == 0
    }

    /// Whether it was opened for writing.
    pub fn writable(&self) -> bool {
        matches!(
            self.flags & oflag::O_ACCMODE,
            oflag::O_WRONLY | oflag::O_RDWR
        ) && self.flags & oflag::O_PATH == 0
    }
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    desc: usize,
    cloexec: bool,
}

/// A process's descriptor table: descriptor numbers, each naming an open
/// file description of the run's [`Files`] and carrying its own
/// close-on-exec flag. Every operation that reaches a description goes
/// through [`Files`], which counts the tables' references to it.
#[derive(Debug, Default)]
pub struct FdTable {
    fds: Vec<Option<Slot>>,
}

/// The run's open file descriptions and the objects they refer to (pipes,
/// eventfds, epoll instances), shared by every process: a description
/// lives while any descriptor of any table names it, so descriptors that
/// two processes hold for one description share its offset and status
/// flags, and a pipe's ends may be held by different processes, as on
/// Linux.
#[derive(Debug, Default)]
pub struct Files {
    descs: Vec<Option<(OpenFile, usize)>>,
    pipes: Vec<Option<Pipe>>,
    pub(super) eventfds: Vec<Option<EventFd>>,
    pub(super) epolls: Vec<Option<Epoll>>,
    /// Sockets whose last description went, for the caller to close in
    /// the run's [`Net`](super::net::Net) ([`Files::take_closed_sockets`]).
    closed_sockets: Vec<usize>,
}

/// Puts `v` in the first free slot of `v`'s table (growing it by one when
/// full); its index.
pub(super) fn put_in<T>(table: &mut Vec<Option<T>>, v: T) -> Result<usize, Errno> {
    let i = match table.iter().position(Option::is_none) {
        Some(i) => i,
        None => {
            table.try_reserve(1).map_err(|_| Errno::ENOMEM)?;
            table.push(None);
            table.len() - 1
        }
    };
    table[i] = Some(v);
    Ok(i)
}

impl FdTable {
    fn slot(&self, fd: u64) -> Result<Slot, Errno> {
        usize::try_from(fd)
            .ok()
            .and_then(|i| self.fds.get(i).copied().flatten())
            .ok_or(Errno::EBADF)
    }

    /// The descriptor's close-on-exec flag.
    pub fn cloexec(&self, fd: u64) -> Result<bool, Errno> {
        Ok(self.slot(fd)?.cloexec)
    }

    /// Sets the descriptor's close-on-exec flag.
    pub fn set_cloexec(&mut self, fd: u64, on: bool) -> Result<(), Errno> {
        self.slot(fd)?;
        if let Some(Some(s)) = self.fds.get_mut(fd as usize) {
            s.cloexec = on;
        }
        Ok(())
    }

    /// The index of the description behind `fd` (`EBADF` if not open).
    pub fn desc_of(&self, fd: u64) -> Result<usize, Errno> {
        Ok(self.slot(fd)?.desc)
    }

    /// The open descriptors, in order.
    pub fn open_fds(&self) -> impl Iterator<Item = u64> + '_ {
        self.fds
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_some())
            .map(|(i, _)| i as u64)
    }

    fn lowest_free(&self, min: usize, limit: u64) -> Result<usize, Errno> {
        let i = (min..self.fds.len())
            .find(|&i| self.fds[i].is_none())
            .unwrap_or(self.fds.len().max(min));
        if i as u64 >= limit {
            return Err(Errno::EMFILE);
        }
        Ok(i)
    }

    fn put(&mut self, fd: usize, slot: Slot) -> Result<(), Errno> {
        if fd >= self.fds.len() {
            self.fds
                .try_reserve(fd + 1 - self.fds.len())
                .map_err(|_| Errno::ENOMEM)?;
            self.fds.resize(fd + 1, None);
        }
        self.fds[fd] = Some(slot);
        Ok(())
    }
}

impl Files {
    /// No descriptions.
    pub fn new() -> Files {
        Files::default()
    }

    /// A new table with fds 0 (stdin, EOF), 1 (stdout) and 2 (stderr), each
    /// on a description of its own.
    pub fn standard_streams(&mut self) -> Result<FdTable, Errno> {
        let mut t = FdTable::default();
        t.fds.try_reserve(8).map_err(|_| Errno::ENOMEM)?;
        for (target, flags) in [
            (Target::Stdin, oflag::O_RDONLY),
            (Target::Console(Stream::Stdout), oflag::O_WRONLY),
            (Target::Console(Stream::Stderr), oflag::O_WRONLY),
        ] {
            let file = OpenFile {
                target,
                offset: 0,
                flags,
            };
            if let Err(e) = self.open(&mut t, file, false, NOFILE_LIMIT) {
                self.close_all(&mut t);
                return Err(e);
            }
        }
        Ok(t)
    }

    /// A copy of table `t` for a new process (`fork`): the same descriptor
    /// numbers and close-on-exec flags, naming the same descriptions.
    pub fn copy_table(&mut self, t: &FdTable) -> Result<FdTable, Errno> {
        let mut fds = Vec::new();
        fds.try_reserve(t.fds.len()).map_err(|_| Errno::ENOMEM)?;
        fds.extend_from_slice(&t.fds);
        for s in fds.iter().flatten() {
            self.addref(s.desc);
        }
        Ok(FdTable { fds })
    }

    /// The description behind descriptor `fd` of `t` (`EBADF` if it is not
    /// open).
    pub fn get(&self, t: &FdTable, fd: u64) -> Result<&OpenFile, Errno> {
        let s = t.slot(fd)?;
        self.descs
            .get(s.desc)
            .and_then(Option::as_ref)
            .map(|d| &d.0)
            .ok_or(Errno::EBADF)
    }

    /// The description behind descriptor `fd` of `t`, mutable (shared with
    /// its dups, in this table and in others).
    pub fn get_mut(&mut self, t: &FdTable, fd: u64) -> Result<&mut OpenFile, Errno> {
        let s = t.slot(fd)?;
        self.descs
            .get_mut(s.desc)
            .and_then(Option::as_mut)
            .map(|d| &mut d.0)
            .ok_or(Errno::EBADF)
    }

    /// Opens a new description on the lowest free descriptor of `t` below
    /// `limit`.
    pub fn open(
        &mut self,
        t: &mut FdTable,
        file: OpenFile,
        cloexec: bool,
        limit: u64,
    ) -> Result<u64, Errno> {
        let fd = t.lowest_free(0, limit)?;
        let d = match self.descs.iter().position(Option::is_none) {
            Some(d) => d,
            None => {
                self.descs.try_reserve(1).map_err(|_| Errno::ENOMEM)?;
                self.descs.push(None);
                self.descs.len() - 1
            }
        };
        // Reserve the fd slot before committing the description.
        if fd >= t.fds.len() {
            t.fds.try_reserve(1).map_err(|_| Errno::ENOMEM)?;
        }
        self.descs[d] = Some((file, 1));
        t.put(fd, Slot { desc: d, cloexec })?;
        Ok(fd as u64)
    }

    /// Opens a description of a new object (an eventfd, an epoll) that
    /// `make` puts in the run's files, on the lowest free descriptor of
    /// `t`; the object goes again when no descriptor can be had.
    pub fn open_object(
        &mut self,
        t: &mut FdTable,
        make: impl FnOnce(&mut Files) -> Result<Target, Errno>,
        flags: u32,
        cloexec: bool,
        limit: u64,
    ) -> Result<u64, Errno> {
        t.lowest_free(0, limit)?;
        let target = make(self)?;
        let file = OpenFile {
            target,
            offset: 0,
            flags,
        };
        self.open(t, file, cloexec, limit)
            .inspect_err(|_| match target {
                Target::EventFd(id) => self.eventfds[id] = None,
                Target::Epoll(id) => self.epolls[id] = None,
                _ => {}
            })
    }

    /// `dup`/`F_DUPFD`: a new descriptor `>= min` of `t` for `fd`'s
    /// description.
    pub fn dup_min(
        &mut self,
        t: &mut FdTable,
        fd: u64,
        min: u64,
        cloexec: bool,
        limit: u64,
    ) -> Result<u64, Errno> {
        let s = t.slot(fd)?;
        if min >= limit {
            return Err(Errno::EINVAL);
        }
        let new = t.lowest_free(min as usize, limit)?;
        t.put(
            new,
            Slot {
                desc: s.desc,
                cloexec,
            },
        )?;
        self.addref(s.desc);
        Ok(new as u64)
    }

    /// `dup2`/`dup3`: makes `new` of `t` refer to `old`'s description,
    /// closing what `new` was first. `EBADF` if `old` is not open or `new`
    /// is out of range.
    pub fn dup_to(
        &mut self,
        t: &mut FdTable,
        old: u64,
        new: u64,
        cloexec: bool,
        limit: u64,
    ) -> Result<u64, Errno> {
        let s = t.slot(old)?;
        if new >= limit {
            return Err(Errno::EBADF);
        }
        if old == new {
            return Ok(new);
        }
        // Make room first so a failure leaves `new` as it was.
        if new as usize >= t.fds.len() {
            t.fds
                .try_reserve(new as usize + 1 - t.fds.len())
                .map_err(|_| Errno::ENOMEM)?;
        }
        let _ = self.close(t, new);
        t.put(
            new as usize,
            Slot {
                desc: s.desc,
                cloexec,
            },
        )?;
        self.addref(s.desc);
        Ok(new)
    }

    fn addref(&mut self, d: usize) {
        if let Some(Some((_, n))) = self.descs.get_mut(d) {
            *n += 1;
        }
    }

    /// Closes descriptor `fd` of `t`; the description goes when the last
    /// descriptor of every table that names it does. Returns what the
    /// description referred to when it went (so the caller can tell those
    /// waiting on the other end of a pipe).
    pub fn close(&mut self, t: &mut FdTable, fd: u64) -> Result<Option<Target>, Errno> {
        let s = t.slot(fd)?;
        t.fds[fd as usize] = None;
        while t.fds.last().is_some_and(Option::is_none) {
            t.fds.pop();
        }
        Ok(self.release(s.desc))
    }

    /// Closes every descriptor of `t` (its process ended); the targets of
    /// the descriptions that went with them.
    pub fn close_all(&mut self, t: &mut FdTable) -> Vec<Target> {
        self.close_where(t, |_| true)
    }

    /// Closes the descriptors of `t` marked close-on-exec (its process
    /// calls `execve`); the targets of the descriptions that went with
    /// them.
    pub fn close_on_exec(&mut self, t: &mut FdTable) -> Vec<Target> {
        self.close_where(t, |s| s.cloexec)
    }

    /// Closes the descriptors of `t` whose slot `which` picks; the targets
    /// of the descriptions that went with them.
    fn close_where(&mut self, t: &mut FdTable, which: impl Fn(&Slot) -> bool) -> Vec<Target> {
        let mut gone = Vec::new();
        for slot in &mut t.fds {
            if let Some(s) = slot.take_if(|s| which(s))
                && let Some(target) = self.release(s.desc)
                && gone.try_reserve(1).is_ok()
            {
                gone.push(target);
            }
        }
        while t.fds.last().is_some_and(Option::is_none) {
            t.fds.pop();
        }
        gone
    }

    /// Drops one reference to description `d`; its target when that was
    /// the last.
    fn release(&mut self, d: usize) -> Option<Target> {
        let Some(Some((f, n))) = self.descs.get_mut(d) else {
            return None;
        };
        *n -= 1;
        if *n > 0 {
            return None;
        }
        let target = f.target;
        match target {
            Target::Pipe { id, write } => {
                if let Some(Some(p)) = self.pipes.get_mut(id) {
                    if write {
                        p.writers -= 1;
                    } else {
                        p.readers -= 1;
                    }
                    if p.readers == 0 && p.writers == 0 {
                        self.pipes[id] = None;
                    }
                }
            }
            Target::EventFd(id) => self.eventfds[id] = None,
            Target::Epoll(id) => self.epolls[id] = None,
            // Should there be no room, the socket goes with its process.
            Target::Socket(id) if self.closed_sockets.try_reserve(1).is_ok() => {
                self.closed_sockets.push(id);
            }
            _ => {}
        }
        self.descs[d] = None;
        // Its last reference went: no epoll watches it any more.
        for ep in self.epolls.iter_mut().flatten() {
            ep.forget(d);
        }
        Some(target)
    }

    /// How many descriptions are open.
    pub fn descriptions(&self) -> usize {
        self.descs.iter().flatten().count()
    }

    /// The description with index `d`, if open.
    pub fn desc(&self, d: usize) -> Option<&OpenFile> {
        self.descs.get(d).and_then(Option::as_ref).map(|d| &d.0)
    }

    /// The eventfd `id` (from a [`Target::EventFd`]).
    pub fn eventfd_mut(&mut self, id: usize) -> Option<&mut EventFd> {
        self.eventfds.get_mut(id).and_then(Option::as_mut)
    }

    /// The epoll instance `id` (from a [`Target::Epoll`]).
    pub fn epoll_mut(&mut self, id: usize) -> Option<&mut Epoll> {
        self.epolls.get_mut(id).and_then(Option::as_mut)
    }

    /// The epoll instance `id`.
    pub fn epoll_ref(&self, id: usize) -> Option<&Epoll> {
        self.epolls.get(id).and_then(Option::as_ref)
    }

    /// The eventfd `id`.
    pub fn eventfd_ref(&self, id: usize) -> Option<&EventFd> {
        self.eventfds.get(id).and_then(Option::as_ref)
    }

    /// The readiness of description `f` as Linux's `poll` file operation
    /// answers it (`EPOLLIN`, `EPOLLOUT`, `EPOLLHUP`, ... bits): the one
    /// place every kind of file says what it is ready for, for `poll`,
    /// `select` and epoll alike (a socket asks the run's `net`).
    pub fn poll_mask(&self, net: &mut Net, f: &OpenFile) -> u32 {
        poll::mask(self, net, f, 0)
    }

    /// The sockets whose last description went since the last call: the
    /// caller closes them in the run's [`Net`].
    pub fn take_closed_sockets(&mut self) -> Vec<usize> {
        core::mem::take(&mut self.closed_sockets)
    }

    /// Something happened to `obj` that may make it ready for `key`
    /// (`EPOLL*` bits; 0 for anything): the epoll entries watching it
    /// join their instance's ready list, as Linux's wake-up callback does.
    pub fn event(&mut self, obj: Obj, key: u32) {
        poll::event(self, obj, key, 0);
    }

    /// Makes a pipe and two descriptors of `t` for it, the read end first
    /// (as `pipe2`): both or neither.
    pub fn pipe(
        &mut self,
        t: &mut FdTable,
        extra_flags: u32,
        cloexec: bool,
        limit: u64,
    ) -> Result<(u64, u64), Errno> {
        let id = match self.pipes.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.pipes.try_reserve(1).map_err(|_| Errno::ENOMEM)?;
                self.pipes.push(None);
                self.pipes.len() - 1
            }
        };
        self.pipes[id] = Some(Pipe {
            buf: VecDeque::new(),
            readers: 1,
            writers: 1,
        });
        let end = |write: bool| OpenFile {
            target: Target::Pipe { id, write },
            offset: 0,
            flags: extra_flags
                | if write {
                    oflag::O_WRONLY
                } else {
                    oflag::O_RDONLY
                },
        };
        let r = match self.open(t, end(false), cloexec, limit) {
            Ok(r) => r,
            Err(e) => {
                self.pipes[id] = None;
                return Err(e);
            }
        };
        match self.open(t, end(true), cloexec, limit) {
            Ok(w) => Ok((r, w)),
            Err(e) => {
                // Closing the read end drops its count; drop the writer's.
                if let Some(Some(p)) = self.pipes.get_mut(id) {
                    p.writers = 0;
                }
                let _ = self.close(t, r);
                self.pipes[id] = None;
                Err(e)
            }
        }
    }

    /// The pipe `id` (from a [`Target::Pipe`]).
    pub fn pipe_ref(&self, id: usize) -> Option<&Pipe> {
        self.pipes.get(id).and_then(Option::as_ref)
    }

    /// The pipe `id`, mutable.
    pub fn pipe_mut(&mut self, id: usize) -> Option<&mut Pipe> {
        self.pipes.get_mut(id).and_then(Option::as_mut)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(n: NodeId) -> OpenFile {
        OpenFile {
            target: Target::Node(n),
            offset: 0,
            flags: oflag::O_RDWR,
        }
    }

    #[test]
    fn dup_shares_the_offset_and_close_keeps_the_other() {
        let mut f = Files::new();
        let mut t = f.standard_streams().unwrap();
        let fd = f.open(&mut t, file(7), false, NOFILE_LIMIT).unwrap();
        assert_eq!(fd, 3);
        let d = f.dup_min(&mut t, fd, 0, true, NOFILE_LIMIT).unwrap();
        assert_eq!(d, 4);
        f.get_mut(&t, fd).unwrap().offset = 42;
        assert_eq!(f.get(&t, d).unwrap().offset, 42);
        assert!(t.cloexec(d).unwrap() && !t.cloexec(fd).unwrap());
        f.close(&mut t, fd).unwrap();
        assert_eq!(f.get(&t, fd).err(), Some(Errno::EBADF));
        assert_eq!(f.get(&t, d).unwrap().offset, 42);
        assert_eq!(f.dup_to(&mut t, d, 1, false, NOFILE_LIMIT), Ok(1));
        assert_eq!(f.get(&t, 1).unwrap().target, Target::Node(7));
        assert_eq!(
            f.dup_to(&mut t, d, NOFILE_LIMIT, false, NOFILE_LIMIT),
            Err(Errno::EBADF)
        );
        assert_eq!(f.close(&mut t, 99), Err(Errno::EBADF));
    }

    #[test]
    fn the_limit_gives_emfile() {
        let mut f = Files::new();
        let mut t = f.standard_streams().unwrap();
        for i in 3..10 {
            assert_eq!(f.open(&mut t, file(1), false, 10), Ok(i));
        }
        assert_eq!(f.open(&mut t, file(1), false, 10), Err(Errno::EMFILE));
        f.close(&mut t, 5).unwrap();
        assert_eq!(f.open(&mut t, file(1), false, 10), Ok(5));
        assert_eq!(f.dup_min(&mut t, 0, 10, false, 10), Err(Errno::EINVAL));
    }

    /// A copied table (fork) names the same descriptions: the offset is
    /// shared, and a pipe's end lives until the last table closes it.
    #[test]
    fn a_copied_table_shares_descriptions_until_both_close() {
        let mut f = Files::new();
        let mut parent = f.standard_streams().unwrap();
        let fd = f.open(&mut parent, file(3), false, NOFILE_LIMIT).unwrap();
        let (r, w) = f.pipe(&mut parent, 0, false, NOFILE_LIMIT).unwrap();
        let mut child = f.copy_table(&parent).unwrap();
        f.get_mut(&child, fd).unwrap().offset = 9;
        assert_eq!(f.get(&parent, fd).unwrap().offset, 9);
        let Target::Pipe { id, .. } = f.get(&parent, r).unwrap().target else {
            panic!("not a pipe");
        };
        // The child closes its write end: the parent's still writes.
        assert_eq!(f.close(&mut child, w), Ok(None));
        assert_eq!(f.pipe_ref(id).unwrap().writers, 1);
        // The parent's last write end goes: readers see end of file.
        assert_eq!(
            f.close(&mut parent, w),
            Ok(Some(Target::Pipe { id, write: true }))
        );
        assert_eq!(f.pipe_ref(id).unwrap().writers, 0);
        let gone = f.close_all(&mut child);
        assert!(!gone.contains(&Target::Pipe { id, write: false }));
        assert_eq!(f.descriptions(), 5);
        let gone = f.close_all(&mut parent);
        assert!(gone.contains(&Target::Pipe { id, write: false }));
        assert!(gone.contains(&Target::Node(3)));
        assert_eq!(f.descriptions(), 0);
        assert!(f.pipe_ref(id).is_none());
    }
}
