//! The run's processes as their relatives see them: each one's parent,
//! process group and session, and the status of each process that ended
//! and that its parent has not waited for yet (a zombie, which keeps its
//! pid), as Linux keeps them for `wait4`, `waitid`, `getppid`,
//! `setpgid`, `setsid` and `kill` of a group.
//!
//! A process that ends gives its children to init (pid 1) while pid 1
//! lives, as Linux does; with no init alive the runtime stands in for it
//! and reaps them itself when they end (their parent becomes 0). A parent
//! that ignores SIGCHLD (`SIG_IGN`, or `SA_NOCLDWAIT`) leaves no zombies:
//! its children are reaped as they end, and a wait for them ends with
//! `ECHILD` once none is left.

use alloc::vec::Vec;

use super::errno::Errno;

/// init's pid.
pub const INIT_PID: u32 = 1;

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// `exit`/`exit_group` with this status.
    Exited(u8),
    /// Killed by a signal.
    Killed {
        /// The signal.
        signal: u8,
        /// Whether it dumped core (its default action is "core").
        core: bool,
    },
}

impl Status {
    /// The `wstatus` word `wait4` writes (`WEXITSTATUS`, `WTERMSIG`,
    /// `WCOREDUMP` read it).
    pub fn wstatus(self) -> u32 {
        match self {
            Status::Exited(c) => u32::from(c) << 8,
            Status::Killed { signal, core } => {
                u32::from(signal & 0x7f) | if core { 0x80 } else { 0 }
            }
        }
    }

    /// `si_code` of the SIGCHLD `siginfo_t` (`CLD_EXITED`, `CLD_KILLED`,
    /// `CLD_DUMPED`).
    pub fn si_code(self) -> i32 {
        match self {
            Status::Exited(_) => 1,
            Status::Killed { core: false, .. } => 2,
            Status::Killed { core: true, .. } => 3,
        }
    }

    /// `si_status`: the exit status or the signal.
    pub fn si_status(self) -> i32 {
        match self {
            Status::Exited(c) => i32::from(c),
            Status::Killed { signal, .. } => i32::from(signal),
        }
    }
}

/// One process of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its pid.
    pub pid: u32,
    /// Its parent's pid (0: the runtime, which reaps it itself).
    pub ppid: u32,
    /// Its process group.
    pub pgid: u32,
    /// Its session.
    pub sid: u32,
    /// How it ended, while it is a zombie.
    pub ended: Option<Status>,
    /// Its children are reaped as they end (it ignores SIGCHLD).
    pub reaps_children: bool,
    /// Its nice value (-20 to 19, `setpriority`): kept and reported, and
    /// a child inherits it; the runtime's scheduler does not weigh it.
    pub nice: i8,
    /// Its I/O priority (`ioprio_set`), kept as the nice value is.
    pub ioprio: u16,
}

/// The processes a priority call names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrioSet {
    /// The process with this pid.
    Process(u32),
    /// The live processes of this group.
    Group(u32),
    /// Every live process (the processes of user 0).
    Everyone,
}

/// Which children a wait takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// Any child (`-1`, `P_ALL`).
    Any,
    /// The child with this pid.
    Pid(u32),
    /// Any child in this process group.
    Group(u32),
}

/// The table.
#[derive(Debug, Default)]
pub struct Procs {
    entries: Vec<Entry>,
}

impl Procs {
    /// No processes.
    pub fn new() -> Procs {
        Procs::default()
    }

    /// Process `pid`, child of `ppid`, in group `pgid` of session `sid`,
    /// starts. `EAGAIN` when its pid is still held (a zombie) or when
    /// there is no memory for it.
    pub fn add(&mut self, pid: u32, ppid: u32, pgid: u32, sid: u32) -> Result<(), Errno> {
        if self.holds(pid) {
            return Err(Errno::EAGAIN);
        }
        self.entries.try_reserve(1).map_err(|_| Errno::EAGAIN)?;
        // A child inherits its parent's priorities.
        let (nice, ioprio) = self.get(ppid).map_or((0, 0), |e| (e.nice, e.ioprio));
        self.entries.push(Entry {
            pid,
            ppid,
            pgid,
            sid,
            ended: None,
            reaps_children: false,
            nice,
            ioprio,
        });
        Ok(())
    }

    /// The live processes `set` names: one process, a process group, or
    /// every process (all run as root); `ESRCH` when there is none.
    pub fn select(&mut self, set: PrioSet) -> Result<impl Iterator<Item = &mut Entry>, Errno> {
        let picks = move |e: &Entry| {
            e.ended.is_none()
                && match set {
                    PrioSet::Process(pid) => e.pid == pid,
                    PrioSet::Group(pgid) => e.pgid == pgid,
                    PrioSet::Everyone => true,
                }
        };
        if !self.entries.iter().any(picks) {
            return Err(Errno::ESRCH);
        }
        Ok(self.entries.iter_mut().filter(move |e| picks(e)))
    }

    /// Process `pid`, live or a zombie.
    pub fn get(&self, pid: u32) -> Option<&Entry> {
        self.entries.iter().find(|e| e.pid == pid)
    }

    fn get_mut(&mut self, pid: u32) -> Option<&mut Entry> {
        self.entries.iter_mut().find(|e| e.pid == pid)
    }

    /// Whether `pid` is in use: a live process or a zombie (the runtime
    /// gives the pid to no new process until it is reaped).
    pub fn holds(&self, pid: u32) -> bool {
        self.get(pid).is_some()
    }

    /// The zombies' pids 1..=64 as bits (bit n: pid n + 1), which the
    /// runtime gives to no new process or thread until they are reaped.
    pub fn zombie_mask(&self) -> u64 {
        self.entries
            .iter()
            .filter(|e| e.ended.is_some() && (1..=64).contains(&e.pid))
            .fold(0, |m, e| m | 1 << (e.pid - 1))
    }

    /// Whether `pid` lives (it has not ended).
    pub fn alive(&self, pid: u32) -> bool {
        self.get(pid).is_some_and(|e| e.ended.is_none())
    }

    /// Process `pid`'s parent (0 when the runtime is its parent or it is
    /// not in the table).
    pub fn ppid(&self, pid: u32) -> u32 {
        self.get(pid).map_or(0, |e| e.ppid)
    }

    /// Sets whether `pid` reaps its children as they end (its SIGCHLD
    /// action is `SIG_IGN`, or has `SA_NOCLDWAIT`).
    pub fn set_reaps_children(&mut self, pid: u32, on: bool) {
        if let Some(e) = self.get_mut(pid) {
            e.reaps_children = on;
        }
    }

    /// Process `pid` ended with `status`: its children go to init (see
    /// the module docs), and it stays a zombie for its parent, unless the
    /// parent reaps its children or is the runtime, when it goes at once.
    /// Returns the parent to tell (SIGCHLD, its threads waiting in
    /// `wait4`), if a process.
    pub fn ended(&mut self, pid: u32, status: Status) -> Option<u32> {
        let heir = if pid != INIT_PID && self.alive(INIT_PID) {
            INIT_PID
        } else {
            0
        };
        for e in self.entries.iter_mut().filter(|e| e.ppid == pid) {
            e.ppid = heir;
        }
        // Zombies nobody will wait for go now.
        if heir == 0 {
            self.entries.retain(|e| e.ppid != 0 || e.ended.is_none());
        } else if self.get(heir).is_some_and(|e| e.reaps_children) {
            self.entries.retain(|e| e.ppid != heir || e.ended.is_none());
        }
        let ppid = self.get(pid)?.ppid;
        let parent = self.get(ppid).filter(|p| p.ended.is_none());
        let keep = parent.is_some_and(|p| !p.reaps_children);
        let parent = parent.map(|p| p.pid);
        if keep {
            if let Some(e) = self.get_mut(pid) {
                e.ended = Some(status);
            }
        } else {
            self.reap(pid);
        }
        parent
    }

    /// Forgets process `pid` (a zombie that was waited for).
    pub fn reap(&mut self, pid: u32) {
        self.entries.retain(|e| e.pid != pid);
    }

    /// The child of `parent` that a wait for `which` takes now: `Ok(Some)`
    /// with the first zombie that matches, `Ok(None)` when matching
    /// children live but none ended, `ECHILD` when no child matches.
    pub fn waitable(&self, parent: u32, which: Which) -> Result<Option<(u32, Status)>, Errno> {
        let mut any = false;
        for e in self.entries.iter().filter(|e| e.ppid == parent) {
            let matches = match which {
                Which::Any => true,
                Which::Pid(p) => e.pid == p,
                Which::Group(g) => e.pgid == g,
            };
            if !matches {
                continue;
            }
            if let Some(s) = e.ended {
                return Ok(Some((e.pid, s)));
            }
            any = true;
        }
        if any { Ok(None) } else { Err(Errno::ECHILD) }
    }

    /// `setpgid(pid, pgid)` made by `caller` (0s already replaced by the
    /// caller's pid and by `pid`), as Linux checks it: `ESRCH` when `pid`
    /// is neither the caller nor a live child of it, `EPERM` when it is a
    /// session leader, in another session, or the group is not in its
    /// session.
    pub fn setpgid(&mut self, caller: u32, pid: u32, pgid: u32) -> Result<(), Errno> {
        let me = self.get(caller).ok_or(Errno::ESRCH)?.clone();
        let target = self
            .get(pid)
            .filter(|e| e.ended.is_none() && (e.pid == caller || e.ppid == caller))
            .ok_or(Errno::ESRCH)?
            .clone();
        if target.sid == target.pid || target.sid != me.sid {
            return Err(Errno::EPERM);
        }
        if pgid != pid
            && !self
                .entries
                .iter()
                .any(|e| e.pgid == pgid && e.sid == me.sid && e.ended.is_none())
        {
            return Err(Errno::EPERM);
        }
        if let Some(e) = self.get_mut(pid) {
            e.pgid = pgid;
        }
        Ok(())
    }

    /// `setsid()` by `pid`: a new session and group led by it, its id;
    /// `EPERM` when a group with its pid exists already.
    pub fn setsid(&mut self, pid: u32) -> Result<u32, Errno> {
        if self
            .entries
            .iter()
            .any(|e| e.pgid == pid && e.ended.is_none())
        {
            return Err(Errno::EPERM);
        }
        let e = self.get_mut(pid).ok_or(Errno::ESRCH)?;
        e.pgid = pid;
        e.sid = pid;
        Ok(pid)
    }

    /// Every pid in the table, zombies too.
    pub fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.entries.iter().map(|e| e.pid)
    }

    /// The live processes of group `pgid`.
    pub fn group(&self, pgid: u32) -> impl Iterator<Item = u32> + '_ {
        self.entries
            .iter()
            .filter(move |e| e.pgid == pgid && e.ended.is_none())
            .map(|e| e.pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// init (1) with children 2 and 3; 3 has child 4.
    fn family() -> Procs {
        let mut p = Procs::new();
        p.add(1, 0, 1, 1).unwrap();
        p.add(2, 1, 1, 1).unwrap();
        p.add(3, 1, 1, 1).unwrap();
        p.add(4, 3, 1, 1).unwrap();
        p
    }

    #[test]
    fn a_zombie_keeps_its_pid_until_its_parent_waits() {
        let mut p = family();
        assert_eq!(p.waitable(1, Which::Any), Ok(None));
        assert_eq!(p.ended(2, Status::Exited(7)), Some(1));
        assert_eq!(p.waitable(1, Which::Pid(3)), Ok(None));
        assert_eq!(p.waitable(1, Which::Any), Ok(Some((2, Status::Exited(7)))));
        assert_eq!(p.add(2, 1, 1, 1), Err(Errno::EAGAIN));
        assert_eq!(p.zombie_mask(), 0b10);
        p.reap(2);
        assert_eq!(p.zombie_mask(), 0);
        assert!(!p.holds(2));
        assert_eq!(p.waitable(1, Which::Pid(2)), Err(Errno::ECHILD));
        assert_eq!(p.waitable(2, Which::Any), Err(Errno::ECHILD));
    }

    #[test]
    fn orphans_go_to_init_or_to_the_runtime() {
        let mut p = family();
        // 3 ends before its child: 4 is init's now.
        assert_eq!(p.ended(3, Status::Exited(0)), Some(1));
        assert_eq!(p.ppid(4), 1);
        assert_eq!(p.ended(4, Status::Exited(1)), Some(1));
        p.reap(3);
        assert_eq!(
            p.waitable(1, Which::Pid(4)),
            Ok(Some((4, Status::Exited(1))))
        );
        // init ends: its live child goes to the runtime, its zombies go.
        assert_eq!(p.ended(1, Status::Exited(0)), None);
        assert!(!p.holds(4) && !p.holds(1));
        assert_eq!(p.ppid(2), 0);
        assert_eq!(p.ended(2, Status::Exited(0)), None);
        assert!(!p.holds(2));
    }

    #[test]
    fn a_parent_that_ignores_sigchld_leaves_no_zombies() {
        let mut p = family();
        p.set_reaps_children(1, true);
        assert_eq!(p.ended(2, Status::Exited(3)), Some(1));
        assert!(!p.holds(2));
        assert_eq!(p.waitable(1, Which::Pid(2)), Err(Errno::ECHILD));
    }

    #[test]
    fn groups_and_sessions_follow_linuxs_rules() {
        let mut p = family();
        // 1 leads session 1: it cannot move.
        assert_eq!(p.setpgid(1, 1, 1), Err(Errno::EPERM));
        // A child into a new group of its own, then its sibling into it.
        assert_eq!(p.setpgid(1, 2, 2), Ok(()));
        assert_eq!(p.setpgid(1, 3, 2), Ok(()));
        assert_eq!(p.group(2).collect::<Vec<_>>(), [2, 3]);
        assert_eq!(p.waitable(1, Which::Group(2)), Ok(None));
        // No such group; not a child.
        assert_eq!(p.setpgid(1, 3, 9), Err(Errno::EPERM));
        assert_eq!(p.setpgid(2, 3, 2), Err(Errno::ESRCH));
        // 4 leads a new session, and then cannot join group 2.
        assert_eq!(p.setsid(4), Ok(4));
        assert_eq!(p.setpgid(3, 4, 2), Err(Errno::EPERM));
        // A group leader cannot start a session.
        assert_eq!(p.setsid(2), Err(Errno::EPERM));
        let k = Status::Killed {
            signal: 11,
            core: true,
        };
        assert_eq!((k.wstatus(), k.si_code(), k.si_status()), (0x8b, 3, 11));
        let e = Status::Exited(5);
        assert_eq!((e.wstatus(), e.si_code(), e.si_status()), (0x500, 1, 5));
    }
}
