//! The `/proc` files through the real handler paths, in both ABIs: each
//! open reads the caller as it is then (its mappings, its status in
//! Linux's two layouts), or the machine (CPUs, memory); they cannot be
//! written; a closed snapshot's node is used again.

use super::*;
use crate::sys::uapi::Statx;

const BUF: u64 = SCRATCH + 0x2000;
const STX: u64 = SCRATCH + 0x800;

fn both() -> [Env; 2] {
    [Env::new(Abi::X86_64), Env::new(Abi::I386)]
}

/// Opens `path` for reading.
fn open(e: &mut Env, path: &str) -> u64 {
    let p = e.cstr(SCRATCH, path);
    let fd = e.ret("open", &[p, 0, 0]);
    assert!(fd >= 3, "open {path}: {fd}");
    fd as u64
}

/// Everything a read of `fd` gives, a small read at a time (as a line
/// reader does).
fn read_all(e: &mut Env, fd: u64) -> String {
    let mut out = Vec::new();
    loop {
        let n = e.ret("read", &[fd, BUF, 100]);
        assert!(n >= 0, "read: {n}");
        if n == 0 {
            break;
        }
        out.extend_from_slice(&e.peek(BUF, n as usize));
    }
    String::from_utf8(out).unwrap()
}

/// The text of `path` as one open reads it.
fn cat(e: &mut Env, path: &str) -> String {
    let fd = open(e, path);
    let s = read_all(e, fd);
    assert_eq!(e.ret("close", &[fd]), 0);
    s
}

/// The value of `key:` in a `key:\tvalue` text.
fn field<'a>(text: &'a str, key: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(':')))
        .unwrap_or_else(|| panic!("no {key} in:\n{text}"))
        .trim()
}

#[test]
fn proc_self_maps_lists_the_mappings_linux_style() {
    for mut e in both() {
        let maps = cat(&mut e, "/proc/self/maps");
        // The test's scratch page: read-write, private, no file.
        let scratch = format!(
            "{SCRATCH:08x}-{:08x} rw-p 00000000 00:00 0",
            SCRATCH + SCRATCH_LEN
        );
        assert!(maps.lines().any(|l| l == scratch), "{maps}");
        let ro = format!("{RO:08x}-");
        assert!(
            maps.lines()
                .any(|l| l.starts_with(&ro) && l.contains(" r--p ")),
            "{maps}"
        );
        // Every line: start-end perms offset dev inode, in address order.
        let mut last = 0;
        for l in maps.lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert!(f.len() >= 5, "{l}");
            let (a, b) = f[0].split_once('-').unwrap();
            let (a, b) = (
                u64::from_str_radix(a, 16).unwrap(),
                u64::from_str_radix(b, 16).unwrap(),
            );
            assert!(last <= a && a < b, "{maps}");
            last = b;
            assert_eq!(f[1].len(), 4, "{l}");
        }
        // A new mapping shows in the next open, not in an open one.
        let fd = open(&mut e, "/proc/self/maps");
        let mmap = if e.abi == Abi::X86_64 {
            "mmap"
        } else {
            "mmap2"
        };
        let at = e.ret(mmap, &[0, 0x3000, 3, 0x22, u64::MAX, 0]);
        assert!(!(-4095..0).contains(&at), "{mmap}: {at}");
        // i386's result is 32 bits.
        let at = if e.abi == Abi::X86_64 {
            at as u64
        } else {
            u64::from(at as u32)
        };
        let later = cat(&mut e, "/proc/self/maps");
        let mapped = format!("{at:08x}-{:08x} rw-p", at + 0x3000);
        assert!(later.contains(&mapped), "{later}");
        assert!(!read_all(&mut e, fd).contains(&mapped));
        assert_eq!(e.ret("close", &[fd]), 0);
    }
}

#[test]
fn proc_self_stat_and_status_describe_the_caller() {
    for mut e in both() {
        let status = cat(&mut e, "/proc/self/status");
        let pid = e.ret("getpid", &[]).to_string();
        assert_eq!(field(&status, "Pid"), pid);
        assert_eq!(field(&status, "Tgid"), pid);
        assert_eq!(field(&status, "State"), "R (running)");
        assert_eq!(field(&status, "Umask"), "0022");
        assert_eq!(field(&status, "Uid"), "0\t0\t0\t0");
        assert_eq!(field(&status, "Threads"), "1");
        // The blocked signals are the caller's mask.
        e.poke(SCRATCH + 0x40, &(1u64 << 9).to_le_bytes());
        assert_eq!(e.ret("rt_sigprocmask", &[0, SCRATCH + 0x40, 0, 8]), 0);
        let status = cat(&mut e, "/proc/self/status");
        assert_eq!(field(&status, "SigBlk"), "0000000000000200");
        // stat: pid (comm) state ppid ..., 52 fields.
        let stat = cat(&mut e, "/proc/self/stat");
        let (head, rest) = stat.split_once(") ").unwrap();
        let (p, name) = head.split_once(" (").unwrap();
        assert_eq!(p, pid);
        assert_eq!(name, field(&status, "Name"));
        let f: Vec<&str> = rest.split_whitespace().collect();
        assert_eq!(f.len() + 2, 52, "{stat}");
        assert_eq!(f[0], "R");
        // Field 20 (num_threads) and 23 (vsize, the mapped bytes).
        assert_eq!(f[17], "1");
        assert!(f[20].parse::<u64>().unwrap() > 0);
    }
}

#[test]
fn proc_cpuinfo_and_meminfo_describe_the_machine() {
    let mut e = Env::new(Abi::X86_64);
    e.m.more_cpus = 3;
    let cpuinfo = cat(&mut e, "/proc/cpuinfo");
    let procs: Vec<&str> = cpuinfo
        .lines()
        .filter_map(|l| l.strip_prefix("processor\t: "))
        .collect();
    assert_eq!(procs, ["0", "1", "2", "3"]);
    let meminfo = cat(&mut e, "/proc/meminfo");
    let total = field(&meminfo, "MemTotal");
    assert!(total.ends_with(" kB") && total != "0 kB", "{meminfo}");
    assert_eq!(field(&meminfo, "SwapTotal"), "0 kB");
}

#[test]
fn proc_files_cannot_be_written_and_their_snapshots_are_reused() {
    for mut e in both() {
        let p = e.cstr(SCRATCH, "/proc/self/status");
        assert_eq!(e.err("open", &[p, 1, 0]), Errno::EACCES);
        assert_eq!(e.err("open", &[p, 2, 0]), Errno::EACCES);
        // As Linux: the path says size 0, a regular file for everyone to
        // read; what an open reads has its own size.
        assert_eq!(e.ret("statx", &[(-100i64) as u64, p, 0, 0x7ff, STX]), 0);
        let sx = Statx::from_bytes(&e.peek(STX, 256).try_into().unwrap());
        assert_eq!((sx.stx_mode, sx.stx_size), (0o100444, 0));
        let fd = open(&mut e, "/proc/self/status");
        let empty = e.cstr(SCRATCH + 0x100, "");
        assert_eq!(e.ret("statx", &[fd, empty, 0x1000, 0x7ff, STX]), 0);
        let sx = Statx::from_bytes(&e.peek(STX, 256).try_into().unwrap());
        assert!(sx.stx_size > 0);
        let ino = sx.stx_ino;
        e.poke(BUF, b"x");
        assert_eq!(e.err("write", &[fd, BUF, 1]), Errno::EBADF);
        assert_eq!(e.ret("close", &[fd]), 0);
        // Closed: the next open takes its node again, however many come.
        for _ in 0..50 {
            let fd = open(&mut e, "/proc/self/stat");
            assert_eq!(e.ret("statx", &[fd, empty, 0x1000, 0x7ff, STX]), 0);
            let sx = Statx::from_bytes(&e.peek(STX, 256).try_into().unwrap());
            assert_eq!(sx.stx_ino, ino);
            assert_eq!(e.ret("close", &[fd]), 0);
        }
    }
}
