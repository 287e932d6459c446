//! Process and thread handlers: identity, uname, limits, TLS (arch_prctl,
//! set_thread_area), prctl, resource usage, threads (clone, exit), and the
//! signal state (rt_sigaction, rt_sigprocmask, sigaltstack, kill, tgkill).
//!
//! A signal sent to the process (`kill`) or to one of its threads
//! (`tgkill`) becomes pending there; the runtime delivers it on the
//! thread's way back to user mode ([`crate::sys::signal::deliver`]).

use super::super::errno::{Errno, SysResult};
use super::super::machine::{Machine, TlsEntry};
use super::super::process::{NSIG, RLIM_INFINITY, Rlimit, SigAction, TLS_ENTRY_MIN, rlimit};
use super::super::procs::PrioSet;
use super::super::uapi::{
    Rlimit32, Rlimit64, Rusage32, Rusage64, Sigaction32, Sigaction64, Stack32, Stack64, Sysinfo32,
    Sysinfo64, UserDesc, Utsname, uts_field,
};
use super::super::{Abi, Action};
use super::Ctx;

/// A pid argument that must name the caller (0 or its pid): `ESRCH`
/// otherwise.
pub(crate) fn self_pid<M: Machine>(c: &Ctx<'_, M>, pid: u64) -> Result<u32, Errno> {
    let pid = pid as u32 as i32;
    if pid == 0 || pid == c.p.pid as i32 {
        Ok(c.p.pid)
    } else if pid < 0 {
        Err(Errno::EINVAL)
    } else {
        Err(Errno::ESRCH)
    }
}

/// The processes `which` and `who` name for the priority calls
/// (`PRIO_PROCESS`/`IOPRIO_WHO_PROCESS` first): a pid (0 or the caller's
/// tid: the caller), a process group (0: the caller's), or a user (all
/// run as root, so user 0 is every process and any other user none).
fn prio_set<M: Machine>(
    c: &Ctx<'_, M>,
    which: u64,
    who: u64,
    first: u64,
) -> Result<PrioSet, Errno> {
    let who = who as u32;
    match which.wrapping_sub(first) {
        0 if who == 0 || who == c.t.tid => Ok(PrioSet::Process(c.p.pid)),
        0 => Ok(PrioSet::Process(who)),
        1 if who == 0 => Ok(PrioSet::Group(own_pgid(c))),
        1 => Ok(PrioSet::Group(who)),
        2 if who == 0 => Ok(PrioSet::Everyone),
        2 => Err(Errno::ESRCH),
        _ => Err(Errno::EINVAL),
    }
}

/// `getpriority(which, who)`: `20 - nice` of the highest priority (the
/// lowest nice) among the processes named, as the system call returns
/// it (libc turns it back into the nice value).
pub(crate) fn getpriority<M: Machine>(c: &mut Ctx<'_, M>, which: u64, who: u64) -> SysResult {
    let set = prio_set(c, which, who, 0)?;
    let nice = c.procs.select(set)?.map(|e| e.nice).min().unwrap_or(0);
    Ok((20 - i64::from(nice)) as u64)
}

/// `setpriority(which, who, prio)`: the nice value, kept within -20 to
/// 19, of every process named.
pub(crate) fn setpriority<M: Machine>(
    c: &mut Ctx<'_, M>,
    which: u64,
    who: u64,
    prio: u64,
) -> SysResult {
    let set = prio_set(c, which, who, 0)?;
    let nice = (prio as u32 as i32).clamp(-20, 19) as i8;
    for e in c.procs.select(set)? {
        e.nice = nice;
    }
    Ok(0)
}

/// `ioprio_get(which, who)`: the highest I/O priority among the processes
/// named (0, "none", for one that never set it).
pub(crate) fn ioprio_get<M: Machine>(c: &mut Ctx<'_, M>, which: u64, who: u64) -> SysResult {
    let set = prio_set(c, which, who, 1)?;
    let best = c
        .procs
        .select(set)?
        .map(|e| e.ioprio)
        // A lower class, then a lower level, is a higher priority; "none"
        // (class 0) ranks as best effort at level 4, as Linux ranks it.
        .min_by_key(|&p| {
            if p >> 13 == 0 {
                (2, 4)
            } else {
                (p >> 13, p & 0x1fff)
            }
        })
        .unwrap_or(0);
    Ok(u64::from(best))
}

/// `ioprio_set(which, who, ioprio)`: class (none, real-time, best effort,
/// idle) and level (0 to 7) of every process named.
pub(crate) fn ioprio_set<M: Machine>(
    c: &mut Ctx<'_, M>,
    which: u64,
    who: u64,
    ioprio: u64,
) -> SysResult {
    let set = prio_set(c, which, who, 1)?;
    let (class, level) = ((ioprio >> 13) & 0x7, ioprio & 0x1fff);
    let valid = match class {
        0 => level == 0,
        1 | 2 => level < 8,
        3 => true,
        _ => false,
    };
    if ioprio > 0xffff || !valid {
        return Err(Errno::EINVAL);
    }
    for e in c.procs.select(set)? {
        e.ioprio = ioprio as u16;
    }
    Ok(0)
}

/// `getresuid`/`getresgid`: all ids are 0.
pub(crate) fn getresid<M: Machine>(c: &mut Ctx<'_, M>, ptrs: [u64; 3], width: usize) -> SysResult {
    for p in ptrs {
        c.write(p, &[0u8; 4][..width])?;
    }
    Ok(0)
}

/// `uname(buf)`.
pub(crate) fn uname<M: Machine>(c: &mut Ctx<'_, M>, buf: u64) -> SysResult {
    let u = Utsname {
        sysname: uts_field(b"Linux"),
        nodename: uts_field(super::super::fs::HOSTNAME.as_bytes()),
        release: uts_field(b"6.1.0-perch"),
        version: uts_field(b"#1 SMP PREEMPT perch"),
        machine: uts_field(if c.wide() { b"x86_64" } else { b"i686" }),
        domainname: uts_field(b"(none)"),
    };
    c.write(buf, &u.to_bytes())?;
    Ok(0)
}

/// `arch_prctl(code, addr)`: ARCH_SET_FS/ARCH_GET_FS for 64-bit callers;
/// the GS base is not supported (`EINVAL`); i386 callers get `EINVAL` as
/// from Linux's compat arch_prctl (which only maps the vDSO).
pub(crate) fn arch_prctl<M: Machine>(c: &mut Ctx<'_, M>, code: u32, addr: u64) -> SysResult {
    const ARCH_SET_FS: u32 = 0x1002;
    const ARCH_GET_FS: u32 = 0x1003;
    const ARCH_GET_CPUID: u32 = 0x1011;
    if c.abi == Abi::I386 {
        return Err(Errno::EINVAL);
    }
    match code {
        ARCH_SET_FS => {
            if addr >= c.p.layout.user_top {
                return Err(Errno::EPERM);
            }
            c.t.fs_base = addr;
            c.m.set_fs_base(addr);
            Ok(0)
        }
        ARCH_GET_FS => {
            let v = c.t.fs_base;
            c.write(addr, &v.to_le_bytes())?;
            Ok(0)
        }
        ARCH_GET_CPUID => Ok(1),
        _ => Err(Errno::EINVAL),
    }
}

fn decode_desc(d: &UserDesc) -> TlsEntry {
    TlsEntry {
        base: d.base_addr,
        limit: d.limit,
        seg_32bit: d.flags & 1 != 0,
        contents: ((d.flags >> 1) & 3) as u8,
        read_exec_only: d.flags & 8 != 0,
        limit_in_pages: d.flags & 16 != 0,
        seg_not_present: d.flags & 32 != 0,
        useable: d.flags & 64 != 0,
    }
}

fn encode_desc(entry_number: u32, e: Option<TlsEntry>) -> UserDesc {
    // An empty slot reads back as Linux's "empty" descriptor.
    let e = e.unwrap_or(TlsEntry {
        read_exec_only: true,
        seg_not_present: true,
        ..TlsEntry::default()
    });
    let flags = e.seg_32bit as u32
        | (e.contents as u32 & 3) << 1
        | (e.read_exec_only as u32) << 3
        | (e.limit_in_pages as u32) << 4
        | (e.seg_not_present as u32) << 5
        | (e.useable as u32) << 6;
    UserDesc {
        entry_number,
        base_addr: e.base,
        limit: e.limit,
        flags,
    }
}

/// A `user_desc` as a TLS slot's content: `None` for Linux's empty and
/// zero descriptors, `EINVAL` for what `tls_desc_okay` refuses.
fn checked_tls(d: &UserDesc) -> Result<Option<TlsEntry>, Errno> {
    let e = decode_desc(d);
    // Linux's LDT_empty, and LDT_zero (every field 0).
    let empty = e.base == 0
        && e.limit == 0
        && e.contents == 0
        && e.read_exec_only
        && !e.seg_32bit
        && !e.limit_in_pages
        && e.seg_not_present
        && !e.useable;
    let zero = e == TlsEntry::default();
    // Linux's tls_desc_okay: 32-bit data segments only, and present ones (a
    // code segment could become CS, a not-present one SS or a data register
    // that no return to user mode could reload).
    if !empty && !zero && (!e.seg_32bit || e.contents > 1 || e.seg_not_present) {
        return Err(Errno::EINVAL);
    }
    Ok(if empty || zero { None } else { Some(e) })
}

/// `set_thread_area(u_info)`: fills one of the three TLS GDT slots
/// (entry_number -1 picks a free one and writes its number back).
pub(crate) fn set_thread_area<M: Machine>(c: &mut Ctx<'_, M>, uinfo: u64) -> SysResult {
    let d = UserDesc::from_bytes(&c.read_array(uinfo)?);
    let slot = if d.entry_number == u32::MAX {
        let free =
            c.t.tls
                .iter()
                .position(Option::is_none)
                .ok_or(Errno::ESRCH)?;
        c.write(uinfo, &(TLS_ENTRY_MIN + free as u32).to_le_bytes())?;
        free
    } else {
        let n = d.entry_number.wrapping_sub(TLS_ENTRY_MIN);
        if n >= 3 {
            return Err(Errno::EINVAL);
        }
        n as usize
    };
    c.t.tls[slot] = checked_tls(&d)?;
    let tls = c.t.tls;
    c.m.set_tls(&tls);
    Ok(0)
}

/// `get_thread_area(u_info)`.
pub(crate) fn get_thread_area<M: Machine>(c: &mut Ctx<'_, M>, uinfo: u64) -> SysResult {
    let n = super::super::machine::read_u32(c.m, &c.p.areas, uinfo)?;
    let slot = n.wrapping_sub(TLS_ENTRY_MIN);
    if slot >= 3 {
        return Err(Errno::EINVAL);
    }
    let d = encode_desc(n, c.t.tls[slot as usize]);
    c.write(uinfo, &d.to_bytes())?;
    Ok(0)
}

/// `get_robust_list(pid, head_ptr, len_ptr)`.
pub(crate) fn get_robust_list<M: Machine>(
    c: &mut Ctx<'_, M>,
    pid: u64,
    head: u64,
    len: u64,
) -> SysResult {
    self_pid(c, pid)?;
    let (h, l) = c.t.robust_list;
    c.write_word(head, h)?;
    c.write_word(len, l)?;
    Ok(0)
}

fn check_resource(res: u32) -> Result<usize, Errno> {
    let r = res as usize;
    if r >= rlimit::NLIMITS {
        return Err(Errno::EINVAL);
    }
    Ok(r)
}

/// Applies a new limit: soft above hard is `EINVAL`; the descriptor table
/// cannot grow past 1024 (`EPERM`).
fn set_limit<M: Machine>(c: &mut Ctx<'_, M>, r: usize, new: Rlimit) -> Result<(), Errno> {
    if new.cur > new.max {
        return Err(Errno::EINVAL);
    }
    if r == rlimit::NOFILE && new.max > super::super::fd::NOFILE_LIMIT {
        return Err(Errno::EPERM);
    }
    c.p.rlimits[r] = new;
    Ok(())
}

/// `prlimit64(pid, resource, new, old)`.
pub(crate) fn prlimit64<M: Machine>(
    c: &mut Ctx<'_, M>,
    pid: u64,
    res: u32,
    new: u64,
    old: u64,
) -> SysResult {
    self_pid(c, pid)?;
    let r = check_resource(res)?;
    let newv = if new != 0 {
        let v = Rlimit64::from_bytes(&c.read_array(new)?);
        Some(Rlimit {
            cur: v.rlim_cur,
            max: v.rlim_max,
        })
    } else {
        None
    };
    let cur = c.p.rlimits[r];
    if old != 0 {
        c.write(
            old,
            &Rlimit64 {
                rlim_cur: cur.cur,
                rlim_max: cur.max,
            }
            .to_bytes(),
        )?;
    }
    if let Some(v) = newv {
        set_limit(c, r, v)?;
    }
    Ok(0)
}

/// `getrlimit`/`ugetrlimit` (`old_style`: the i386 number 76, which
/// clamps to 0x7fffffff).
pub(crate) fn getrlimit<M: Machine>(
    c: &mut Ctx<'_, M>,
    res: u32,
    buf: u64,
    old_style: bool,
) -> SysResult {
    let r = check_resource(res)?;
    let l = c.p.rlimits[r];
    if c.wide() {
        let v = Rlimit64 {
            rlim_cur: l.cur,
            rlim_max: l.max,
        };
        c.write(buf, &v.to_bytes())?;
    } else {
        let top: u64 = if old_style {
            0x7fff_ffff
        } else {
            u32::MAX as u64
        };
        let v = Rlimit32 {
            rlim_cur: l.cur.min(top) as u32,
            rlim_max: l.max.min(top) as u32,
        };
        c.write(buf, &v.to_bytes())?;
    }
    Ok(0)
}

/// `setrlimit(resource, rlim)`.
pub(crate) fn setrlimit<M: Machine>(c: &mut Ctx<'_, M>, res: u32, buf: u64) -> SysResult {
    let r = check_resource(res)?;
    let v = if c.wide() {
        let v = Rlimit64::from_bytes(&c.read_array(buf)?);
        Rlimit {
            cur: v.rlim_cur,
            max: v.rlim_max,
        }
    } else {
        let v = Rlimit32::from_bytes(&c.read_array(buf)?);
        let widen = |x: u32| {
            if x == u32::MAX {
                RLIM_INFINITY
            } else {
                x.into()
            }
        };
        Rlimit {
            cur: widen(v.rlim_cur),
            max: widen(v.rlim_max),
        }
    };
    set_limit(c, r, v)?;
    Ok(0)
}

/// `sysinfo(info)`.
pub(crate) fn sysinfo<M: Machine>(c: &mut Ctx<'_, M>, buf: u64) -> SysResult {
    let up = (c.m.monotonic_ns() / 1_000_000_000) as i64;
    let (total, free) = c.ram;
    if c.wide() {
        let s = Sysinfo64 {
            uptime: up,
            loads: [0; 3],
            totalram: total,
            freeram: free,
            sharedram: 0,
            bufferram: 0,
            totalswap: 0,
            freeswap: 0,
            procs: 1,
            pad: 0,
            pad2: 0,
            totalhigh: 0,
            freehigh: 0,
            mem_unit: 1,
            pad3: 0,
        };
        c.write(buf, &s.to_bytes())?;
    } else {
        // Counted in KiB units so that more than 4 GiB fits.
        let s = Sysinfo32 {
            uptime: up as i32,
            loads: [0; 3],
            totalram: (total >> 10) as u32,
            freeram: (free >> 10) as u32,
            sharedram: 0,
            bufferram: 0,
            totalswap: 0,
            freeswap: 0,
            procs: 1,
            pad: 0,
            totalhigh: 0,
            freehigh: 0,
            mem_unit: 1024,
            f: [0; 8],
        };
        c.write(buf, &s.to_bytes())?;
    }
    Ok(0)
}

/// `prctl(option, arg2, ...)`: PR_SET_NAME and PR_GET_NAME, the dumpable
/// flag and PR_SET_PDEATHSIG (recorded nowhere: there is no parent
/// death); everything else `EINVAL`.
pub(crate) fn prctl<M: Machine>(c: &mut Ctx<'_, M>, option: i32, arg2: u64) -> SysResult {
    const PR_SET_PDEATHSIG: i32 = 1;
    const PR_GET_DUMPABLE: i32 = 3;
    const PR_SET_DUMPABLE: i32 = 4;
    const PR_SET_NAME: i32 = 15;
    const PR_GET_NAME: i32 = 16;
    match option {
        PR_SET_NAME => {
            // Linux copies at most 16 bytes and keeps 15.
            let mut name = [0u8; 16];
            for (i, b) in name.iter_mut().enumerate().take(15) {
                let mut one = [0u8; 1];
                c.read(arg2 + i as u64, &mut one)?;
                if one[0] == 0 {
                    break;
                }
                *b = one[0];
            }
            // A thread's own name; the first thread's is the process's too.
            c.t.comm = name;
            c.t.renamed = true;
            if c.t.tid == c.p.pid {
                c.p.comm = name;
            }
            Ok(0)
        }
        PR_GET_NAME => {
            let name = c.t.comm;
            c.write(arg2, &name)?;
            Ok(0)
        }
        PR_SET_PDEATHSIG => {
            if arg2 > NSIG as u64 {
                return Err(Errno::EINVAL);
            }
            Ok(0)
        }
        PR_GET_DUMPABLE => Ok(1),
        PR_SET_DUMPABLE => {
            if arg2 > 1 {
                return Err(Errno::EINVAL);
            }
            Ok(0)
        }
        _ => Err(Errno::EINVAL),
    }
}

/// `getrusage(who, usage)`: user time is the process's CPU time.
pub(crate) fn getrusage<M: Machine>(c: &mut Ctx<'_, M>, who: i32, buf: u64) -> SysResult {
    let ns = match who {
        0 | 1 => c.p.cpu_time_ns,
        -1 => 0,
        _ => return Err(Errno::EINVAL),
    };
    let (s, us) = (ns / 1_000_000_000, (ns % 1_000_000_000) / 1000);
    if c.wide() {
        let r = Rusage64 {
            utime_sec: s as i64,
            utime_usec: us as i64,
            stime_sec: 0,
            stime_usec: 0,
            rest: [0; 14],
        };
        c.write(buf, &r.to_bytes())?;
    } else {
        let r = Rusage32 {
            utime_sec: s as i32,
            utime_usec: us as i32,
            stime_sec: 0,
            stime_usec: 0,
            rest: [0; 14],
        };
        c.write(buf, &r.to_bytes())?;
    }
    Ok(0)
}

/// `times(buf)`: clock ticks (100 Hz) since boot; `buf` may be NULL.
pub(crate) fn times<M: Machine>(c: &mut Ctx<'_, M>, buf: u64) -> SysResult {
    let ticks = c.m.monotonic_ns() / 10_000_000;
    if buf != 0 {
        let user = c.p.cpu_time_ns / 10_000_000;
        if c.wide() {
            let mut b = [0u8; 32];
            b[..8].copy_from_slice(&user.to_le_bytes());
            c.write(buf, &b)?;
        } else {
            let mut b = [0u8; 16];
            b[..4].copy_from_slice(&(user as u32).to_le_bytes());
            c.write(buf, &b)?;
        }
    }
    Ok(if c.wide() { ticks } else { ticks & 0xffff_ffff })
}

const SIGKILL: u64 = 9;
const SIGCHLD: u64 = 17;
const SIGSTOP: u64 = 19;

/// `rt_sigaction(sig, act, oact, sigsetsize)` in the caller's layout.
pub(crate) fn rt_sigaction<M: Machine>(
    c: &mut Ctx<'_, M>,
    sig: u64,
    act: u64,
    oact: u64,
    setsize: u64,
) -> SysResult {
    if setsize != 8 {
        return Err(Errno::EINVAL);
    }
    let sig = sig & 0xffff_ffff;
    if sig == 0 || sig > NSIG as u64 {
        return Err(Errno::EINVAL);
    }
    if act != 0 && (sig == SIGKILL || sig == SIGSTOP) {
        return Err(Errno::EINVAL);
    }
    let new = if act != 0 {
        Some(if c.wide() {
            let a = Sigaction64::from_bytes(&c.read_array(act)?);
            SigAction {
                handler: a.sa_handler,
                flags: a.sa_flags,
                restorer: a.sa_restorer,
                mask: a.sa_mask,
            }
        } else {
            let a = Sigaction32::from_bytes(&c.read_array(act)?);
            SigAction {
                handler: a.sa_handler.into(),
                flags: a.sa_flags.into(),
                restorer: a.sa_restorer.into(),
                mask: a.sa_mask,
            }
        })
    } else {
        None
    };
    let i = sig as usize - 1;
    let old = c.p.signals.actions[i];
    if oact != 0 {
        if c.wide() {
            let o = Sigaction64 {
                sa_handler: old.handler,
                sa_flags: old.flags,
                sa_restorer: old.restorer,
                sa_mask: old.mask,
            };
            c.write(oact, &o.to_bytes())?;
        } else {
            let o = Sigaction32 {
                sa_handler: old.handler as u32,
                sa_flags: old.flags as u32,
                sa_restorer: old.restorer as u32,
                sa_mask: old.mask,
            };
            c.write(oact, &o.to_bytes())?;
        }
    }
    if let Some(mut n) = new {
        n.mask &= !((1 << (SIGKILL - 1)) | (1 << (SIGSTOP - 1)));
        c.p.signals.actions[i] = n;
        if sig == SIGCHLD {
            // SIG_IGN or SA_NOCLDWAIT: the children leave no zombies.
            const SA_NOCLDWAIT: u64 = 2;
            c.procs
                .set_reaps_children(c.p.pid, n.handler == 1 || n.flags & SA_NOCLDWAIT != 0);
        }
    }
    Ok(0)
}

/// `wait4`'s and `waitid`'s option bits.
mod wopt {
    pub const WNOHANG: u64 = 1;
    pub const WSTOPPED: u64 = 2;
    pub const WEXITED: u64 = 4;
    pub const WCONTINUED: u64 = 8;
    pub const WNOWAIT: u64 = 0x0100_0000;
    pub const WNOTHREAD: u64 = 0x2000_0000;
    pub const WALL: u64 = 0x4000_0000;
    pub const WCLONE: u64 = 0x8000_0000;
}

/// The calling process's group.
fn own_pgid<M: Machine>(c: &Ctx<'_, M>) -> u32 {
    c.procs.get(c.p.pid).map_or(c.p.pid, |e| e.pgid)
}

/// `wait4(pid, wstatus, options, rusage)` (and the i386 `waitpid`, with
/// no rusage): takes a child that ended, as Linux picks it by `pid` (-1
/// any child, 0 any in the caller's group, below -1 any in group -pid,
/// else that child), writes its `wstatus`, reaps it and returns its pid.
/// Children that live but none ended: 0 with `WNOHANG`, else the thread
/// waits until one ends. `ECHILD` when no child matches. The rusage
/// written is all zeros (the runtime does not keep children's usage). No
/// process here stops or continues, so `WUNTRACED` and `WCONTINUED` never
/// report anything.
pub(crate) fn wait4<M: Machine>(
    c: &mut Ctx<'_, M>,
    pid: u64,
    wstatus: u64,
    options: u64,
    rusage: u64,
) -> Result<Action, Errno> {
    use super::super::procs::Which;
    use wopt::*;
    let options = options & 0xffff_ffff;
    if options & !(WNOHANG | WSTOPPED | WCONTINUED | WNOTHREAD | WALL | WCLONE) != 0 {
        return Err(Errno::EINVAL);
    }
    let which = match pid as u32 as i32 {
        -1 => Which::Any,
        0 => Which::Group(own_pgid(c)),
        i32::MIN => return Err(Errno::ESRCH),
        p if p < 0 => Which::Group(p.unsigned_abs()),
        p => Which::Pid(p as u32),
    };
    match c.procs.waitable(c.p.pid, which)? {
        Some((child, status)) => {
            if wstatus != 0 {
                c.write(wstatus, &status.wstatus().to_le_bytes())?;
            }
            if rusage != 0 {
                // struct rusage: 144 bytes (64-bit), 72 (i386).
                let len = if c.wide() { 144 } else { 72 };
                c.write(rusage, &[0u8; 144][..len])?;
            }
            c.procs.reap(child);
            Ok(Action::Return(child.into()))
        }
        None if options & WNOHANG != 0 => Ok(Action::Return(0)),
        None => Ok(Action::Wait { until_ns: None }),
    }
}

/// `waitid(idtype, id, infop, options, rusage)`: as [`wait4`], chosen by
/// `P_ALL`, `P_PID` or `P_PGID` (id 0: the caller's group), reported as
/// the SIGCHLD `siginfo_t` (`si_code` `CLD_EXITED`, `CLD_KILLED` or
/// `CLD_DUMPED`, `si_pid`, `si_status`); `WNOWAIT` leaves the child a
/// zombie. `options` must ask for `WEXITED`, `WSTOPPED` or `WCONTINUED`;
/// `P_PIDFD` is `EINVAL` (there are no pidfds). With `WNOHANG` and no child
/// ended, returns 0 with the fields zeroed.
pub(crate) fn waitid<M: Machine>(
    c: &mut Ctx<'_, M>,
    idtype: u64,
    id: u64,
    infop: u64,
    options: u64,
    rusage: u64,
) -> Result<Action, Errno> {
    use super::super::procs::Which;
    use wopt::*;
    let options = options & 0xffff_ffff;
    if options & !(WNOHANG | WSTOPPED | WEXITED | WCONTINUED | WNOWAIT | WNOTHREAD | WALL | WCLONE)
        != 0
        || options & (WEXITED | WSTOPPED | WCONTINUED) == 0
    {
        return Err(Errno::EINVAL);
    }
    let id = id as u32;
    let which = match idtype & 0xffff_ffff {
        0 => Which::Any,
        1 if id as i32 > 0 => Which::Pid(id),
        2 if id == 0 => Which::Group(own_pgid(c)),
        2 if id as i32 > 0 => Which::Group(id),
        _ => return Err(Errno::EINVAL),
    };
    // siginfo_t: signo, errno, code, then the union at 16 (64-bit) or 12
    // (i386): si_pid, si_uid, si_status, si_utime, si_stime.
    let (union, clock) = if c.wide() { (16, 8) } else { (12, 4) };
    let mut info = [0u8; 48];
    let len = union + 12 + 2 * clock;
    let found = if options & WEXITED != 0 {
        c.procs.waitable(c.p.pid, which)?
    } else {
        // Only stops or continues asked for: none ever comes.
        c.procs.waitable(c.p.pid, which)?;
        None
    };
    match found {
        Some((child, status)) => {
            const SIGCHLD_NR: i32 = 17;
            info[0..4].copy_from_slice(&SIGCHLD_NR.to_le_bytes());
            info[8..12].copy_from_slice(&status.si_code().to_le_bytes());
            info[union..union + 4].copy_from_slice(&child.to_le_bytes());
            info[union + 8..union + 12].copy_from_slice(&status.si_status().to_le_bytes());
            if infop != 0 {
                c.write(infop, &info[..len])?;
            }
            if rusage != 0 {
                let rlen = if c.wide() { 144 } else { 72 };
                c.write(rusage, &[0u8; 144][..rlen])?;
            }
            if options & WNOWAIT == 0 {
                c.procs.reap(child);
            }
            Ok(Action::Return(0))
        }
        None if options & WNOHANG != 0 => {
            if infop != 0 {
                c.write(infop, &info[..len])?;
            }
            Ok(Action::Return(0))
        }
        None => Ok(Action::Wait { until_ns: None }),
    }
}

/// `getpgid(pid)` / `getsid(pid)` (0: the caller): the group or session
/// of a process that lives or is a zombie; `ESRCH` otherwise.
pub(crate) fn getpgid<M: Machine>(c: &Ctx<'_, M>, pid: u64, session: bool) -> SysResult {
    let pid = match pid as u32 as i32 {
        0 => c.p.pid,
        p if p < 0 => return Err(Errno::ESRCH),
        p => p as u32,
    };
    match c.procs.get(pid) {
        Some(e) => Ok(u64::from(if session { e.sid } else { e.pgid })),
        // A process the table does not know answers for itself.
        None if pid == c.p.pid => Ok(u64::from(pid)),
        None => Err(Errno::ESRCH),
    }
}

/// `setpgid(pid, pgid)`: 0s mean the caller and `pid`; a negative group
/// is `EINVAL`; the rest as [`Procs::setpgid`](super::super::procs::Procs::setpgid).
pub(crate) fn setpgid<M: Machine>(c: &mut Ctx<'_, M>, pid: u64, pgid: u64) -> SysResult {
    let pid = match pid as u32 as i32 {
        0 => c.p.pid,
        p if p < 0 => return Err(Errno::ESRCH),
        p => p as u32,
    };
    let pgid = match pgid as u32 as i32 {
        0 => pid,
        g if g < 0 => return Err(Errno::EINVAL),
        g => g as u32,
    };
    c.procs.setpgid(c.p.pid, pid, pgid).map(|()| 0)
}

/// `rt_sigprocmask(how, set, oset, sigsetsize)`. Unblocking a pending
/// signal acts on it (see the module doc).
pub(crate) fn rt_sigprocmask<M: Machine>(
    c: &mut Ctx<'_, M>,
    how: i32,
    set: u64,
    oset: u64,
    setsize: u64,
) -> Result<Action, Errno> {
    if setsize != 8 {
        return Err(Errno::EINVAL);
    }
    let new = if set != 0 {
        if !(0..=2).contains(&how) {
            return Err(Errno::EINVAL);
        }
        Some(u64::from_le_bytes(c.read_array(set)?))
    } else {
        None
    };
    let old = c.t.sigmask;
    if oset != 0 {
        c.write(oset, &old.to_le_bytes())?;
    }
    if let Some(s) = new {
        let m = match how {
            0 => old | s,
            1 => old & !s,
            _ => s,
        };
        c.t.sigmask = m & !((1 << (SIGKILL - 1)) | (1 << (SIGSTOP - 1)));
    }
    Ok(Action::Return(0))
}

/// `rt_sigsuspend(mask, sigsetsize)`: waits with `mask` blocked until a
/// signal comes; the handler's frame keeps the mask from before, which
/// `rt_sigreturn` puts back. Always ends with `EINTR`.
pub(crate) fn rt_sigsuspend<M: Machine>(
    c: &mut Ctx<'_, M>,
    mask: u64,
    setsize: u64,
) -> Result<Action, Errno> {
    if setsize != 8 {
        return Err(Errno::EINVAL);
    }
    let m = u64::from_le_bytes(c.read_array(mask)?);
    c.t.saved_sigmask = Some(c.t.sigmask);
    c.t.sigmask = m & !((1 << (SIGKILL - 1)) | (1 << (SIGSTOP - 1)));
    Ok(Action::Block)
}

/// `rt_sigtimedwait(set, info, timeout, sigsetsize)` (and `_time64`, whose
/// timespec is 64-bit in both ABIs): takes the lowest signal of `set` that
/// is pending (the thread's own first, then the process's), fills `info`
/// and returns its number. With none pending it waits, with `set`
/// unblocked so that a signal of it wakes the thread, until one comes
/// ([`super::super::sigwait::finish`] takes it then), another signal's
/// handler interrupts it (`EINTR`) or `timeout` passes (`EAGAIN`).
pub(crate) fn rt_sigtimedwait<M: Machine>(
    c: &mut Ctx<'_, M>,
    a: [u64; 6],
    wide_timespec: bool,
) -> Result<Action, Errno> {
    use super::super::sigwait::{self, SigWait};
    let (set, info, timeout, setsize) = (a[0], a[1], a[2], a[3]);
    if setsize != 8 {
        return Err(Errno::EINVAL);
    }
    let set =
        u64::from_le_bytes(c.read_array(set)?) & !((1 << (SIGKILL - 1)) | (1 << (SIGSTOP - 1)));
    let deadline = if timeout == 0 {
        None
    } else {
        let d = super::time::read_duration(c, timeout, wide_timespec)?;
        Some(c.m.monotonic_ns().saturating_add(d))
    };
    if let Some(sig) = sigwait::take(c.p, c.t, set) {
        sigwait::write_info(c.m, c.p, c.abi, info, sig)?;
        return Ok(Action::Return(u64::from(sig)));
    }
    if deadline.is_some_and(|d| d <= c.m.monotonic_ns()) {
        return Err(Errno::EAGAIN);
    }
    c.t.sigwait = Some(SigWait {
        set,
        info,
        mask: c.t.sigmask,
    });
    c.t.sigmask &= !set;
    Ok(match deadline {
        None => Action::Block,
        Some(until_ns) => Action::Sleep {
            until_ns,
            then: Errno::EAGAIN.to_return(),
        },
    })
}

/// Sends `sig` to the calling thread itself (0 sends nothing).
fn raise_self<M: Machine>(c: &mut Ctx<'_, M>, sig: u64) -> Result<Action, Errno> {
    if sig > NSIG as u64 {
        return Err(Errno::EINVAL);
    }
    if sig != 0 {
        c.t.pending |= 1 << (sig - 1);
    }
    Ok(Action::Return(0))
}

/// `kill(pid, sig)`: process `pid`, the caller's process group (0), group
/// `-pid`, or every process but init and the caller (-1). A target that
/// is not there is `ESRCH`, whatever the signal (Linux looks the target up
/// before it checks the signal); a zombie takes the signal and nothing
/// happens. The caller's own process gets it as pending, like `raise`.
pub(crate) fn kill<M: Machine>(c: &mut Ctx<'_, M>, pid: i32, sig: u64) -> Result<Action, Errno> {
    let me = c.p.pid;
    let mut targets: alloc::vec::Vec<u32> = alloc::vec::Vec::new();
    match pid {
        1.. => {
            if pid as u32 == me || c.procs.holds(pid as u32) {
                targets.push(pid as u32);
            }
        }
        -1 => targets.extend(
            c.procs
                .pids()
                .filter(|&p| p != me && p != super::super::procs::INIT_PID),
        ),
        i32::MIN => return Err(Errno::ESRCH),
        _ => {
            let pgid = if pid == 0 {
                c.procs.get(me).map_or(me, |e| e.pgid)
            } else {
                pid.unsigned_abs()
            };
            targets.extend(c.procs.group(pgid));
            if pgid == me && !targets.contains(&me) {
                targets.push(me);
            }
        }
    }
    if targets.is_empty() {
        return Err(Errno::ESRCH);
    }
    if sig & 0xffff_ffff > NSIG as u64 {
        return Err(Errno::EINVAL);
    }
    let sig = (sig & 0xffff_ffff) as u8;
    if sig == 0 {
        return Ok(Action::Return(0));
    }
    for t in targets {
        if t == me {
            c.p.signals.pending |= 1 << (sig - 1);
        } else if c.procs.alive(t)
            && let Some(tid) = c.m.signal_process(t, sig)
        {
            c.futex.cancel(tid);
        }
    }
    Ok(Action::Return(0))
}

/// `tgkill(tgid, tid, sig)` (and `tkill(tid, sig)` as `tgkill(pid, tid, sig)`).
/// As Linux, a thread that does not exist (one that has ended) is `ESRCH`
/// before the signal is checked: only a live target makes a bad signal
/// `EINVAL`.
pub(crate) fn tgkill<M: Machine>(
    c: &mut Ctx<'_, M>,
    tgid: i32,
    tid: i32,
    sig: u64,
) -> Result<Action, Errno> {
    if tgid <= 0 || tid <= 0 {
        return Err(Errno::EINVAL);
    }
    if tgid != c.p.pid as i32 {
        return Err(Errno::ESRCH);
    }
    let sig = sig & 0xffff_ffff;
    if tid as u32 == c.t.tid {
        return raise_self(c, sig);
    }
    // A probe (signal 0) says whether the thread lives.
    c.m.signal_thread(tid as u32, 0)?;
    if sig > NSIG as u64 {
        return Err(Errno::EINVAL);
    }
    if c.m.signal_thread(tid as u32, sig as u8)? {
        c.futex.cancel(tid as u32);
    }
    Ok(Action::Return(0))
}

/// `sigaltstack(ss, old_ss)` in the caller's layout.
pub(crate) fn sigaltstack<M: Machine>(c: &mut Ctx<'_, M>, ss: u64, old: u64) -> SysResult {
    const SS_DISABLE: u32 = 2;
    const SS_AUTODISARM: u32 = 1 << 31;
    const MINSIGSTKSZ: u64 = 2048;
    let new = if ss != 0 {
        let (sp, flags, size) = if c.wide() {
            let s = Stack64::from_bytes(&c.read_array(ss)?);
            (s.ss_sp, s.ss_flags as u32, s.ss_size)
        } else {
            let s = Stack32::from_bytes(&c.read_array(ss)?);
            (s.ss_sp.into(), s.ss_flags as u32, s.ss_size.into())
        };
        if flags & !(SS_DISABLE | SS_AUTODISARM) != 0 {
            return Err(Errno::EINVAL);
        }
        if flags & SS_DISABLE == 0 && size < MINSIGSTKSZ {
            return Err(Errno::ENOMEM);
        }
        Some(super::super::process::AltStack { sp, flags, size })
    } else {
        None
    };
    let o = c.t.altstack;
    if old != 0 {
        if c.wide() {
            let s = Stack64 {
                ss_sp: o.sp,
                ss_flags: o.flags as i32,
                pad: 0,
                ss_size: o.size,
            };
            c.write(old, &s.to_bytes())?;
        } else {
            let s = Stack32 {
                ss_sp: o.sp as u32,
                ss_flags: o.flags as i32,
                ss_size: o.size as u32,
            };
            c.write(old, &s.to_bytes())?;
        }
    }
    if let Some(n) = new {
        c.t.altstack = if n.flags & SS_DISABLE != 0 {
            super::super::process::AltStack {
                sp: 0,
                flags: SS_DISABLE,
                size: 0,
            }
        } else {
            n
        };
    }
    Ok(0)
}

/// `clone` flags (linux/sched.h).
pub mod clone_flags {
    /// The exit signal of a child process.
    pub const CSIGNAL: u64 = 0xff;
    /// Share the address space.
    pub const VM: u64 = 0x100;
    /// Share the working directory and umask.
    pub const FS: u64 = 0x200;
    /// Share the descriptor table.
    pub const FILES: u64 = 0x400;
    /// Share the signal handlers.
    pub const SIGHAND: u64 = 0x800;
    /// A thread of the same thread group.
    pub const THREAD: u64 = 0x10000;
    /// Share System V semaphore undo lists.
    pub const SYSVSEM: u64 = 0x40000;
    /// Set the child's TLS from the `tls` argument.
    pub const SETTLS: u64 = 0x80000;
    /// Write the child's tid at `parent_tid`.
    pub const PARENT_SETTID: u64 = 0x100000;
    /// Clear and wake `child_tid` when the child exits.
    pub const CHILD_CLEARTID: u64 = 0x200000;
    /// The parent waits until the child calls `execve` or ends (vfork).
    pub const VFORK: u64 = 0x4000;
    /// Ignored since Linux 2.6.
    pub const DETACHED: u64 = 0x400000;
    /// Write the child's tid at `child_tid` in the child's memory.
    pub const CHILD_SETTID: u64 = 0x1000000;
    /// What every thread library passes for a thread.
    pub const THREAD_SET: u64 = VM | FS | FILES | SIGHAND | THREAD;
    /// What may come with [`THREAD_SET`].
    pub const THREAD_EXTRAS: u64 =
        SYSVSEM | SETTLS | PARENT_SETTID | CHILD_CLEARTID | DETACHED | CHILD_SETTID | CSIGNAL;
}

/// The most threads one process may have at once; one more `clone` is
/// `EAGAIN` (as Linux's RLIMIT_NPROC would say).
pub const MAX_THREADS: u32 = 64;

/// A checked `clone` of a thread, for the runtime to carry out
/// ([`Action::Clone`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloneArgs {
    /// The flags (a superset of [`clone_flags::THREAD_SET`]).
    pub flags: u64,
    /// The child's stack pointer (0: the parent's).
    pub stack: u64,
    /// Where `CLONE_PARENT_SETTID` writes the tid.
    pub parent_tid: u64,
    /// Where `CLONE_CHILD_SETTID` writes and `CLONE_CHILD_CLEARTID` clears.
    pub child_tid: u64,
    /// `CLONE_SETTLS`'s argument: the FS base (x86-64) or a `user_desc`
    /// pointer (i386).
    pub tls: u64,
}

/// `clone(flags, stack, parent_tid, child_tid, tls)` (x86-64 order; the
/// caller passes i386's `tls, child_tid` swapped back). A thread, or a
/// copy of the process (no `CLONE_VM`: what `fork` asks, with
/// `CLONE_CHILD_SETTID`, `CLONE_CHILD_CLEARTID` or `CLONE_PARENT_SETTID`
/// and an exit signal) for the runtime to make ([`Action::Fork`]). A
/// process sharing the caller's memory without being its thread
/// (`CLONE_VM` without `CLONE_THREAD`, as `posix_spawn` asks), or a copy
/// sharing its files or handlers, is `ENOSYS`, and a thread with flags
/// beyond what thread libraries pass is `EINVAL`; both are named in the
/// run's unknown-call summary.
pub(crate) fn clone<M: Machine>(
    c: &mut Ctx<'_, M>,
    nr: u64,
    args: CloneArgs,
) -> Result<Action, Errno> {
    use clone_flags as f;
    let flags = args.flags;
    // Linux's own consistency rules come first.
    if flags & f::THREAD != 0 && flags & f::SIGHAND == 0
        || flags & f::SIGHAND != 0 && flags & f::VM == 0
    {
        return Err(Errno::EINVAL);
    }
    if flags & f::THREAD == 0 {
        // A copy of the process, or with CLONE_VM one that shares its
        // memory (vfork, posix_spawn); CLONE_VFORK holds the parent until
        // the child execs or ends.
        const FORK_FLAGS: u64 = f::CSIGNAL
            | f::VM
            | f::VFORK
            | f::PARENT_SETTID
            | f::CHILD_SETTID
            | f::CHILD_CLEARTID
            | f::DETACHED;
        if flags & !FORK_FLAGS != 0 {
            c.unknown.record(c.abi, nr);
            return Err(Errno::ENOSYS);
        }
        if args.stack >= c.p.layout.user_top {
            return Err(Errno::EINVAL);
        }
        return Ok(Action::Fork(args));
    }
    if flags & f::THREAD_SET != f::THREAD_SET || flags & !(f::THREAD_SET | f::THREAD_EXTRAS) != 0 {
        c.unknown.record(c.abi, nr);
        return Err(Errno::EINVAL);
    }
    if c.p.threads >= MAX_THREADS {
        return Err(Errno::EAGAIN);
    }
    if args.stack >= c.p.layout.user_top {
        return Err(Errno::EINVAL);
    }
    Ok(Action::Clone(args))
}

/// `clone3(args, size)`: the same threads as [`clone`], from a `struct
/// clone_args` (its stack is the lowest address and a size). A size below
/// the first version (64 bytes) or past a page is `EINVAL`, non-zero bytes
/// past what Linux knows are `E2BIG`; `set_tid` and `cgroup` are `EINVAL`
/// (they need privileges or cgroups the appliance has not).
pub(crate) fn clone3<M: Machine>(
    c: &mut Ctx<'_, M>,
    nr: u64,
    args: u64,
    size: u64,
) -> Result<Action, Errno> {
    const VER0: u64 = 64;
    const KNOWN: usize = 88;
    if !(VER0..=4096).contains(&size) {
        return Err(Errno::EINVAL);
    }
    let mut raw = [0u8; 4096];
    let raw = &mut raw[..size as usize];
    c.read(args, raw)?;
    if raw.len() > KNOWN && raw[KNOWN..].iter().any(|&b| b != 0) {
        return Err(Errno::E2BIG);
    }
    let word = |i: usize| {
        raw.get(i * 8..i * 8 + 8)
            .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
    };
    // flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size,
    // tls, set_tid, set_tid_size, cgroup.
    let (flags, exit_signal, stack, stack_size) = (word(0), word(4), word(5), word(6));
    if exit_signal & !clone_flags::CSIGNAL != 0
        || flags & clone_flags::CSIGNAL != 0
        || (stack == 0) != (stack_size == 0)
        || word(8) != 0
        || word(9) != 0
        || word(10) != 0
    {
        return Err(Errno::EINVAL);
    }
    clone(
        c,
        nr,
        CloneArgs {
            flags: flags | exit_signal,
            stack: stack.checked_add(stack_size).ok_or(Errno::EINVAL)?,
            parent_tid: word(3),
            child_tid: word(2),
            tls: word(7),
        },
    )
}

/// The state of the process `fork` makes as pid `pid` (the runtime chose
/// it, and copies the address space): a copy of `p` ([`Process::forked`]:
/// its descriptors name the same descriptions) and of its calling thread
/// `t` (registers aside: the same TLS, blocked signals and alternate
/// stack; no pending signals, no robust list; `CLONE_CHILD_CLEARTID`'s
/// address to clear at its exit), entered in the process table in `p`'s
/// group and session. `EAGAIN` when `pid` is still held or memory runs
/// out. The runtime writes the tids `CLONE_CHILD_SETTID` and
/// `CLONE_PARENT_SETTID` ask for, in the child's memory and the parent's.
pub fn fork_child(
    sys: &mut super::super::System,
    p: &super::super::Process,
    t: &super::super::Thread,
    args: &CloneArgs,
    pid: u32,
    now_ns: u64,
) -> Result<(super::super::Process, super::super::Thread), Errno> {
    let (pgid, sid) = sys
        .procs
        .get(p.pid)
        .map_or((p.pid, p.pid), |e| (e.pgid, e.sid));
    let mut child = p.forked(&mut sys.files, pid, now_ns)?;
    if let Err(e) = sys.procs.add(pid, p.pid, pgid, sid) {
        sys.files.close_all(&mut child.fds);
        return Err(e);
    }
    let mut ct = t.clone();
    ct.tid = pid;
    ct.pending = 0;
    ct.robust_list = (0, 0);
    ct.clear_child_tid = if args.flags & clone_flags::CHILD_CLEARTID != 0 {
        args.child_tid
    } else {
        0
    };
    ct.saved_sigmask = None;
    ct.interrupted = None;
    ct.sigwait = None;
    ct.wait = None;
    ct.sent = 0;
    ct.renamed = false;
    Ok((child, ct))
}

/// Makes the new thread `tid` of process `p` that `parent` asked for
/// with `args`: its TLS (`CLONE_SETTLS`), its blocked signals (the
/// parent's), its `clear_child_tid`, and the tids written for
/// `CLONE_PARENT_SETTID` and `CLONE_CHILD_SETTID`. On an error (a bad TLS
/// descriptor or tid pointer) no thread is made and the caller's `clone`
/// returns it. Counts the thread in [`Process::threads`].
pub fn new_thread<M: Machine>(
    m: &mut M,
    p: &mut super::super::Process,
    parent: &super::super::Thread,
    args: &CloneArgs,
    tid: u32,
) -> Result<super::super::Thread, Errno> {
    use clone_flags as f;
    let mut t = super::super::Thread::new(tid);
    t.comm = parent.comm;
    t.sigmask = parent.sigmask;
    t.fs_base = parent.fs_base;
    t.tls = parent.tls;
    if args.flags & f::SETTLS != 0 {
        match p.abi {
            Abi::X86_64 => {
                if args.tls >= p.layout.user_top {
                    return Err(Errno::EPERM);
                }
                t.fs_base = args.tls;
            }
            Abi::I386 => {
                let d = UserDesc::from_bytes(&super::super::machine::read_array(
                    m, &p.areas, args.tls,
                )?);
                let n = d.entry_number.wrapping_sub(TLS_ENTRY_MIN);
                if n >= 3 {
                    return Err(Errno::EINVAL);
                }
                t.tls[n as usize] = checked_tls(&d)?;
            }
        }
    }
    if args.flags & f::CHILD_CLEARTID != 0 {
        t.clear_child_tid = args.child_tid;
    }
    for (flag, addr) in [
        (f::PARENT_SETTID, args.parent_tid),
        (f::CHILD_SETTID, args.child_tid),
    ] {
        if args.flags & flag != 0 {
            m.write_user(&p.areas, addr, &tid.to_le_bytes())?;
        }
    }
    p.threads += 1;
    Ok(t)
}

/// Linux's `ROBUST_LIST_LIMIT`: the most entries a thread's exit walks.
const ROBUST_LIST_LIMIT: usize = 2048;
/// The owner-died bit of a robust futex word.
const FUTEX_OWNER_DIED: u32 = 0x4000_0000;
/// The waiters bit of a robust futex word.
const FUTEX_WAITERS: u32 = 0x8000_0000;
/// The tid bits of a robust futex word.
const FUTEX_TID_MASK: u32 = 0x3fff_ffff;

/// At a thread's exit, as Linux's `exit_robust_list`: every robust futex
/// the thread `t` still holds (its word's tid bits are `t.tid`) gets the
/// owner-died bit and loses the tid, and one waiter is woken (none for a
/// PI futex, which the list marks in bit 0 of its pointer); a pending
/// entry whose word is already 0 (the thread died between unlocking and
/// waking) gets its waiter woken. The list is
/// user memory: a bad pointer or a loop ends the walk (at most
/// [`ROBUST_LIST_LIMIT`] entries), never the runtime.
pub fn release_robust_list<M: Machine>(
    m: &mut M,
    p: &super::super::Process,
    futexes: &mut super::super::futex::FutexTable,
    t: &super::super::Thread,
) {
    let (head, len) = t.robust_list;
    let wide = p.abi == Abi::X86_64;
    let word = if wide { 8 } else { 4 };
    if head == 0 || len != 3 * word {
        return;
    }
    let read_ptr = |m: &mut M, addr: u64| -> Option<u64> {
        let mut b = [0u8; 8];
        m.read_user(&p.areas, addr, &mut b[..word as usize]).ok()?;
        Some(if wide {
            u64::from_le_bytes(b)
        } else {
            u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        })
    };
    // struct robust_list_head { list.next, futex_offset, list_op_pending }
    let Some(first) = read_ptr(m, head) else {
        return;
    };
    let Some(offset) = read_ptr(m, head + word) else {
        return;
    };
    let offset = if wide {
        offset as i64
    } else {
        i64::from(offset as u32 as i32)
    };
    // Bit 0 of a list pointer marks a PI futex (Linux's
    // fetch_robust_entry): the entry is the pointer without it.
    let pending = read_ptr(m, head + 2 * word).unwrap_or(0);
    let (pending, pending_pi) = (pending & !1, pending & 1 != 0);
    let mut entry = first & !1;
    let mut release = |m: &mut M, entry: u64, pi: bool, pending_op: bool| {
        let addr = entry.wrapping_add_signed(offset);
        if !addr.is_multiple_of(4) || addr >= p.layout.user_top {
            return;
        }
        let Ok(v) = super::super::machine::read_u32(m, &p.areas, addr) else {
            return;
        };
        // The thread died between unlocking (the word is 0) and waking a
        // waiter: the wake is made for it (Linux's HANDLE_DEATH_PENDING).
        if pending_op && !pi && v == 0 {
            let key = super::super::futex::FutexKey::of(p.pid, addr);
            let _ = futexes.wake(key, 1, super::super::futex::BITSET_MATCH_ANY, |tid| {
                m.wake_thread(tid)
            });
            return;
        }
        if v & FUTEX_TID_MASK != t.tid {
            return;
        }
        let new = (v & FUTEX_WAITERS) | FUTEX_OWNER_DIED;
        if m.write_user(&p.areas, addr, &new.to_le_bytes()).is_err() {
            return;
        }
        // A PI futex's waiters are not futex waiters (and the runtime
        // has no PI waits: FUTEX_LOCK_PI is ENOSYS).
        if v & FUTEX_WAITERS != 0 && !pi {
            let key = super::super::futex::FutexKey::of(p.pid, addr);
            let _ = futexes.wake(key, 1, super::super::futex::BITSET_MATCH_ANY, |tid| {
                m.wake_thread(tid)
            });
        }
    };
    let mut pi = first & 1 != 0;
    for _ in 0..ROBUST_LIST_LIMIT {
        // The list is circular through the head; pending is handled last.
        if entry == head || entry == 0 {
            break;
        }
        if entry != pending {
            release(m, entry, pi, false);
        }
        match read_ptr(m, entry) {
            Some(next) => (entry, pi) = (next & !1, next & 1 != 0),
            None => break,
        }
    }
    if pending != 0 {
        release(m, pending, pending_pi, true);
    }
}

/// `exit(status)` of the calling thread: with other threads alive only
/// this one ends: its robust futexes are released and its
/// `clear_child_tid` word is cleared and woken (how `pthread_join` learns
/// of the exit); the last thread's exit ends the process.
pub(crate) fn exit_thread<M: Machine>(c: &mut Ctx<'_, M>, status: u8) -> Result<Action, Errno> {
    if c.p.threads <= 1 {
        return Ok(Action::Exit(status));
    }
    release_robust_list(c.m, c.p, c.futex, c.t);
    let ctid = c.t.clear_child_tid;
    if ctid != 0 && ctid.is_multiple_of(4) && c.write(ctid, &0u32.to_le_bytes()).is_ok() {
        let key = super::super::futex::FutexKey::of(c.p.pid, ctid);
        let m = &mut *c.m;
        let _ = c
            .futex
            .wake(key, 1, super::super::futex::BITSET_MATCH_ANY, |tid| {
                m.wake_thread(tid)
            });
    }
    c.futex.cancel(c.t.tid);
    c.p.threads -= 1;
    Ok(Action::ExitThread(status))
}
