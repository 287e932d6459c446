//! The text of the `/proc` files ([`ProcFile`]), made when one is opened:
//! the open reads a snapshot of the calling process, or of the machine,
//! as it was then ([`Vfs::snapshot`](super::super::fs::Vfs::snapshot)).
//! The layouts are Linux's, so what parses them there (glibc's
//! `pthread_getattr_np`, which finds the main thread's stack in
//! `/proc/self/maps`; `ps`, `free`, `nproc`-like scripts) parses them
//! here. What the runtime does not track reads as 0: page faults, the
//! resident set, context switches.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::Write;

use super::super::errno::Errno;
use super::super::fs::ProcFile;
use super::super::machine::Machine;
use super::super::vma::{AreaKind, Backing};
use super::Ctx;

/// Clock ticks a second (`AT_CLKTCK`, `sysconf(_SC_CLK_TCK)`).
const HZ: u64 = 100;

/// The text of `f` for the calling process.
pub(crate) fn text<M: Machine>(c: &mut Ctx<'_, M>, f: ProcFile) -> Result<Vec<u8>, Errno> {
    let s = match f {
        ProcFile::Maps => maps(c),
        ProcFile::Stat => stat(c),
        ProcFile::Status => status(c),
        ProcFile::Cpuinfo => cpuinfo(c),
        ProcFile::Meminfo => meminfo(c),
    };
    let mut v = Vec::new();
    v.try_reserve_exact(s.len()).map_err(|_| Errno::ENOMEM)?;
    v.extend_from_slice(s.as_bytes());
    Ok(v)
}

/// The process's name (`comm`) as text.
fn comm<M: Machine>(c: &Ctx<'_, M>) -> String {
    let n =
        c.p.comm
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(c.p.comm.len());
    String::from_utf8_lossy(&c.p.comm[..n]).into_owned()
}

/// One line a mapping: `start-end perms offset dev inode`, then the name
/// of the stack and of the heap.
fn maps<M: Machine>(c: &Ctx<'_, M>) -> String {
    let mut s = String::new();
    for a in c.p.areas.iter() {
        let bit = |on: bool, ch: char| if on { ch } else { '-' };
        let shared = if a.kind == AreaKind::Shared { 's' } else { 'p' };
        let offset = match &a.backing {
            Backing::File { offset, .. } => *offset,
            Backing::Zero => 0,
        };
        let name = match a.kind {
            AreaKind::Stack => "[stack]",
            AreaKind::Heap => "[heap]",
            _ => "",
        };
        let line = format!(
            "{:08x}-{:08x} {}{}{}{} {:08x} 00:00 0",
            a.start,
            a.end,
            bit(a.prot.readable(), 'r'),
            bit(a.prot.writable(), 'w'),
            bit(a.prot.executable(), 'x'),
            shared,
            offset
        );
        if name.is_empty() {
            let _ = writeln!(s, "{line}");
        } else {
            // Linux pads the name to column 73.
            let _ = writeln!(s, "{line:<72} {name}");
        }
    }
    s
}

/// The process's mapped bytes.
fn vsize<M: Machine>(c: &Ctx<'_, M>) -> u64 {
    c.p.areas.iter().map(|a| a.end - a.start).sum()
}

/// (process group, session) of the caller.
fn group_and_session<M: Machine>(c: &Ctx<'_, M>) -> (u32, u32) {
    c.procs
        .get(c.p.pid)
        .map_or((c.p.pid, c.p.pid), |e| (e.pgid, e.sid))
}

/// `/proc/self/stat`: the 52 fields of Linux's line.
fn stat<M: Machine>(c: &Ctx<'_, M>) -> String {
    let (pgrp, sid) = group_and_session(c);
    let ticks = |ns: u64| ns / (1_000_000_000 / HZ);
    let utime = ticks(c.p.cpu_time_ns);
    let start = ticks(c.p.start_ns);
    let (mask, pending) = (c.t.sigmask, c.t.pending | c.p.signals.pending);
    let (ignored, caught) = signal_sets(c);
    format!(
        "{pid} ({comm}) R {ppid} {pgrp} {sid} 0 -1 4194560 0 0 0 0 {utime} 0 0 0 20 0 {threads} 0 {start} {vsize} 0 18446744073709551615 0 0 0 0 0 {pending} {mask} {ignored} {caught} 0 0 0 17 {cpu} 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
        pid = c.p.pid,
        comm = comm(c),
        ppid = c.p.ppid,
        threads = c.p.threads.max(1),
        vsize = vsize(c),
        cpu = c.m.current_cpu(),
    )
}

/// (ignored, caught) signal sets, bit n-1 for signal n.
fn signal_sets<M: Machine>(c: &Ctx<'_, M>) -> (u64, u64) {
    let mut ignored = 0u64;
    let mut caught = 0u64;
    for (i, a) in c.p.signals.actions.iter().enumerate() {
        match a.handler {
            0 => {}
            1 => ignored |= 1 << i,
            _ => caught |= 1 << i,
        }
    }
    (ignored, caught)
}

/// `/proc/self/status`.
fn status<M: Machine>(c: &Ctx<'_, M>) -> String {
    let (ignored, caught) = signal_sets(c);
    let cpus = c.m.online_cpus().clamp(1, 64);
    let allowed = c.m.affinity(c.t.tid).unwrap_or(u64::MAX) & (u64::MAX >> (64 - cpus));
    let mut list = String::new();
    let mut i = 0;
    while i < cpus {
        if allowed >> i & 1 == 0 {
            i += 1;
            continue;
        }
        let from = i;
        while i + 1 < cpus && allowed >> (i + 1) & 1 != 0 {
            i += 1;
        }
        if !list.is_empty() {
            list.push(',');
        }
        if from == i {
            let _ = write!(list, "{from}");
        } else {
            let _ = write!(list, "{from}-{i}");
        }
        i += 1;
    }
    let kb = vsize(c) / 1024;
    format!(
        "Name:\t{name}\nUmask:\t{umask:04o}\nState:\tR (running)\nTgid:\t{pid}\nNgid:\t0\nPid:\t{pid}\nPPid:\t{ppid}\nTracerPid:\t0\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nFDSize:\t64\nGroups:\t\nVmPeak:\t{kb:8} kB\nVmSize:\t{kb:8} kB\nVmRSS:\t       0 kB\nThreads:\t{threads}\nSigQ:\t0/0\nSigPnd:\t{tpend:016x}\nShdPnd:\t{ppend:016x}\nSigBlk:\t{mask:016x}\nSigIgn:\t{ignored:016x}\nSigCgt:\t{caught:016x}\nCpus_allowed:\t{allowed:x}\nCpus_allowed_list:\t{list}\nvoluntary_ctxt_switches:\t0\nnonvoluntary_ctxt_switches:\t0\n",
        name = comm(c),
        umask = c.p.umask,
        pid = c.p.pid,
        ppid = c.p.ppid,
        threads = c.p.threads.max(1),
        tpend = c.t.pending,
        ppend = c.p.signals.pending,
        mask = c.t.sigmask,
    )
}

/// `/proc/cpuinfo`: a block for each CPU that is up.
fn cpuinfo<M: Machine>(c: &Ctx<'_, M>) -> String {
    let cpus = c.m.online_cpus().max(1);
    let mut s = String::new();
    for n in 0..cpus {
        let _ = write!(
            s,
            "processor\t: {n}\nphysical id\t: 0\nsiblings\t: {cpus}\ncore id\t\t: {n}\ncpu cores\t: {cpus}\napicid\t\t: {n}\n\n"
        );
    }
    s
}

/// `/proc/meminfo`: the RAM the runtime has and has free (no swap, no
/// page cache).
fn meminfo<M: Machine>(c: &Ctx<'_, M>) -> String {
    let (total, free) = (c.ram.0 / 1024, c.ram.1 / 1024);
    format!(
        "MemTotal:       {total:8} kB\nMemFree:        {free:8} kB\nMemAvailable:   {free:8} kB\nBuffers:               0 kB\nCached:                0 kB\nSwapCached:            0 kB\nSwapTotal:             0 kB\nSwapFree:              0 kB\n"
    )
}
