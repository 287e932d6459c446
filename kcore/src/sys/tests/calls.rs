//! Behaviour of the implemented calls through the real handler paths:
//! files, memory, signals, futexes, time, unknown calls, output.

use super::*;
use crate::sys::signal::Delivery;
use crate::sys::uapi::{Sigaction32, Sigaction64, Stat, Statx};

fn both() -> [Env; 2] {
    [Env::new(Abi::X86_64), Env::new(Abi::I386)]
}

#[test]
fn create_write_read_back_seek_stat() {
    for mut e in both() {
        let path = e.cstr(SCRATCH, "/tmp/out.txt");
        let fd = e.ret(
            "openat",
            &[AT_FDCWD, path, O_CREAT | O_RDWR | O_EXCL, 0o666],
        ) as u64;
        assert_eq!(fd, 3);
        e.poke(SCRATCH + 0x100, b"hello file\n");
        assert_eq!(e.ret("write", &[fd, SCRATCH + 0x100, 11]), 11);
        assert_eq!(e.ret("lseek", &[fd, 0, 1]), 11);
        assert_eq!(e.ret("lseek", &[fd, 6, 0]), 6);
        assert_eq!(e.ret("read", &[fd, SCRATCH + 0x200, 100]), 5);
        assert_eq!(e.peek(SCRATCH + 0x200, 5), b"file\n");
        assert_eq!(e.ret("read", &[fd, SCRATCH + 0x200, 100]), 0);
        assert_eq!(e.ret("pread64", &[fd, SCRATCH + 0x200, 5, 0, 0]), 5);
        assert_eq!(e.peek(SCRATCH + 0x200, 5), b"hello");
        // The umask (022) applies to the creation mode.
        let st = e.ret("statx", &[AT_FDCWD, path, 0, 0x7ff, SCRATCH + 0x400]);
        assert_eq!(st, 0);
        let sx = Statx::from_bytes(&e.peek(SCRATCH + 0x400, 256).try_into().unwrap());
        assert_eq!(sx.stx_size, 11);
        assert_eq!(sx.stx_mode, 0o100644);
        assert_eq!(
            e.err(
                "openat",
                &[AT_FDCWD, path, O_CREAT | O_EXCL | O_WRONLY, 0o644]
            ),
            Errno::EEXIST
        );
        // O_TRUNC empties it, O_APPEND appends.
        let fd2 = e.ret("open", &[path, O_WRONLY | O_TRUNC | O_APPEND, 0]) as u64;
        assert_eq!(e.ret("write", &[fd2, SCRATCH + 0x100, 5]), 5);
        assert_eq!(e.ret("write", &[fd2, SCRATCH + 0x100, 5]), 5);
        assert_eq!(e.ret("pread64", &[fd, SCRATCH + 0x200, 20, 0, 0]), 10);
        assert_eq!(e.peek(SCRATCH + 0x200, 10), b"hellohello");
        assert_eq!(e.ret("ftruncate", &[fd, 2]), 0);
        assert_eq!(e.ret("pread64", &[fd, SCRATCH + 0x200, 20, 0, 0]), 2);
        assert_eq!(e.ret("close", &[fd2]), 0);
        assert_eq!(e.err("close", &[fd2]), Errno::EBADF);
        assert_eq!(e.err("read", &[fd2, SCRATCH, 1]), Errno::EBADF);
    }
}

#[test]
fn directories_getdents_rename_unlink() {
    let mut e = Env::new(Abi::X86_64);
    let d = e.cstr(SCRATCH, "/tmp/dir");
    assert_eq!(e.ret("mkdir", &[d, 0o755]), 0);
    assert_eq!(e.err("mkdir", &[d, 0o755]), Errno::EEXIST);
    assert_eq!(e.ret("chdir", &[d]), 0);
    assert_eq!(e.ret("getcwd", &[SCRATCH + 0x100, 100]), 9);
    assert_eq!(e.peek(SCRATCH + 0x100, 9), b"/tmp/dir\0");
    assert_eq!(e.err("getcwd", &[SCRATCH + 0x100, 8]), Errno::ERANGE);
    for name in ["b", "a"] {
        let p = e.cstr(SCRATCH + 0x200, name);
        let fd = e.ret("open", &[p, O_CREAT | O_WRONLY, 0o600]) as u64;
        e.ret("close", &[fd]);
    }
    let dot = e.cstr(SCRATCH + 0x200, ".");
    let fd = e.ret("open", &[dot, O_DIRECTORY, 0]) as u64;
    let n = e.ret("getdents64", &[fd, SCRATCH + 0x1000, 4096]) as usize;
    let buf = e.peek(SCRATCH + 0x1000, n);
    let mut names = Vec::new();
    let mut at = 0;
    while at < n {
        let reclen = u16::from_le_bytes([buf[at + 16], buf[at + 17]]) as usize;
        assert_eq!(reclen % 8, 0);
        let name = &buf[at + 19..at + reclen];
        let name = &name[..name.iter().position(|&b| b == 0).unwrap()];
        names.push((String::from_utf8(name.to_vec()).unwrap(), buf[at + 18]));
        at += reclen;
    }
    assert_eq!(
        names,
        [
            (".".into(), 4),
            ("..".into(), 4),
            ("a".into(), 8),
            ("b".into(), 8)
        ]
    );
    assert_eq!(e.ret("getdents64", &[fd, SCRATCH + 0x1000, 4096]), 0);
    assert_eq!(e.ret("lseek", &[fd, 0, 0]), 0);
    assert_eq!(
        e.err("getdents64", &[fd, SCRATCH + 0x1000, 10]),
        Errno::EINVAL
    );
    assert_eq!(
        e.ret("getdents64", &[fd, SCRATCH + 0x1000, 24]),
        24,
        "one entry fits"
    );
    // rename within the directory (relative), unlink, rmdir.
    let a = e.cstr(SCRATCH + 0x200, "a");
    let c = e.cstr(SCRATCH + 0x300, "../c");
    assert_eq!(e.ret("rename", &[a, c]), 0);
    let c_abs = e.cstr(SCRATCH + 0x400, "/tmp/c");
    assert_eq!(e.ret("access", &[c_abs, 0]), 0);
    assert_eq!(e.err("access", &[a, 0]), Errno::ENOENT);
    assert_eq!(e.err("rmdir", &[d]), Errno::ENOTEMPTY);
    let b = e.cstr(SCRATCH + 0x200, "b");
    assert_eq!(e.ret("unlink", &[b]), 0);
    assert_eq!(e.err("unlink", &[d]), Errno::EISDIR);
    assert_eq!(e.ret("rmdir", &[d]), 0);
    assert_eq!(e.err("chdir", &[d]), Errno::ENOENT);
}

#[test]
fn archive_files_are_read_only() {
    for mut e in both() {
        let p = e.cstr(SCRATCH, "/data/input.txt");
        assert_eq!(e.err("open", &[p, O_WRONLY, 0]), Errno::EROFS);
        assert_eq!(e.err("open", &[p, O_RDWR | O_TRUNC, 0]), Errno::EROFS);
        assert_eq!(e.err("unlink", &[p]), Errno::EROFS);
        assert_eq!(e.err("access", &[p, 2]), Errno::EROFS);
        assert_eq!(e.err("access", &[p, 1]), Errno::EACCES);
        let exe = e.cstr(SCRATCH + 0x100, "/bin/prog");
        assert_eq!(e.ret("access", &[exe, 1]), 0);
        let fd = e.ret("open", &[p, 0, 0]) as u64;
        assert_eq!(e.err("write", &[fd, SCRATCH, 1]), Errno::EBADF);
        assert_eq!(e.ret("read", &[fd, SCRATCH + 0x200, 4]), 4);
        assert_eq!(e.peek(SCRATCH + 0x200, 4), b"line");
        // Relative to the cwd (/data), through "..".
        let rel = e.cstr(SCRATCH + 0x300, "../data/./input.txt");
        assert!(e.ret("open", &[rel, 0, 0]) > 3);
        let missing = e.cstr(SCRATCH + 0x300, "/data/nope");
        assert_eq!(e.err("open", &[missing, 0, 0]), Errno::ENOENT);
        let notdir = e.cstr(SCRATCH + 0x300, "/data/input.txt/x");
        assert_eq!(e.err("open", &[notdir, 0, 0]), Errno::ENOTDIR);
        let dir = e.cstr(SCRATCH + 0x300, "/data");
        assert_eq!(e.err("open", &[dir, O_WRONLY, 0]), Errno::EISDIR);
        assert_eq!(e.err("open", &[p, O_DIRECTORY, 0]), Errno::ENOTDIR);
        // A new file may be created next to archive files.
        let new = e.cstr(SCRATCH + 0x300, "/data/new");
        assert!(e.ret("open", &[new, O_CREAT | O_WRONLY, 0o644]) > 3);
    }
}

#[test]
fn long_paths_and_devices() {
    let mut e = Env::new(Abi::X86_64);
    let long = "a".repeat(5000);
    let p = e.cstr(SCRATCH, &long);
    assert_eq!(e.err("open", &[p, 0, 0]), Errno::ENAMETOOLONG);
    let name = "b".repeat(300);
    let p = e.cstr(SCRATCH, &name);
    assert_eq!(e.err("open", &[p, 0, 0]), Errno::ENAMETOOLONG);
    let z = e.cstr(SCRATCH, "/dev/zero");
    let fd = e.ret("open", &[z, O_RDWR, 0]) as u64;
    e.poke(SCRATCH + 0x100, &[9; 16]);
    assert_eq!(e.ret("read", &[fd, SCRATCH + 0x100, 16]), 16);
    assert_eq!(e.peek(SCRATCH + 0x100, 16), [0; 16]);
    assert_eq!(e.ret("write", &[fd, SCRATCH, 100]), 100);
    let n = e.cstr(SCRATCH, "/dev/null");
    let fd = e.ret("open", &[n, O_RDWR, 0]) as u64;
    assert_eq!(e.ret("read", &[fd, SCRATCH + 0x100, 16]), 0);
    let r = e.cstr(SCRATCH, "/dev/urandom");
    let fd = e.ret("open", &[r, 0, 0]) as u64;
    assert_eq!(e.ret("read", &[fd, SCRATCH + 0x100, 16]), 16);
    assert_ne!(e.peek(SCRATCH + 0x100, 16), [0; 16]);
    // stdin reads EOF; a tty ioctl on a file is ENOTTY too.
    assert_eq!(e.ret("read", &[0, SCRATCH, 10]), 0);
    assert_eq!(e.err("ioctl", &[fd, 0x5401, SCRATCH]), Errno::ENOTTY);
    assert_eq!(e.err("ioctl", &[99, 0x5401, SCRATCH]), Errno::EBADF);
    assert_eq!(e.err("lseek", &[1, 0, 0]), Errno::ESPIPE);
}

#[test]
fn dup_shares_offsets_and_fcntl_flags() {
    let mut e = Env::new(Abi::X86_64);
    let p = e.cstr(SCRATCH, "/data/input.txt");
    let fd = e.ret("open", &[p, O_CLOEXEC, 0]) as u64;
    assert_eq!(e.ret("fcntl", &[fd, 1, 0]), 1);
    let d = e.ret("dup", &[fd]) as u64;
    assert_eq!(e.ret("fcntl", &[d, 1, 0]), 0);
    assert_eq!(e.ret("read", &[fd, SCRATCH + 0x100, 5]), 5);
    assert_eq!(e.ret("lseek", &[d, 0, 1]), 5, "dup shares the offset");
    assert_eq!(e.ret("dup2", &[fd, 10]), 10);
    assert_eq!(e.ret("dup3", &[fd, 11, O_CLOEXEC]), 11);
    assert_eq!(e.ret("fcntl", &[11, 1, 0]), 1);
    assert_eq!(e.err("dup3", &[fd, fd, 0]), Errno::EINVAL);
    assert_eq!(e.ret("dup2", &[fd, fd]), fd as i64);
    assert_eq!(e.ret("fcntl", &[fd, 1030, 20]), 20);
    assert_eq!(e.ret("fcntl", &[1, 3, 0]) & 3, 1, "stdout is write-only");
    assert_eq!(e.ret("fcntl", &[fd, 4, O_APPEND]), 0);
    assert_ne!(
        e.ret("fcntl", &[d, 3, 0]) as u64 & O_APPEND,
        0,
        "status flags are shared"
    );
    // The descriptor limit.
    let mut last = 0;
    loop {
        match e.call("dup", &[0]) {
            Action::Return(v) if (v as i64) >= 0 => last = v,
            Action::Return(v) => {
                assert_eq!(v as i64, -(Errno::EMFILE.number() as i64));
                break;
            }
            a => panic!("{a:?}"),
        }
    }
    assert_eq!(last, 1023);
}

#[test]
fn stat_layout_through_fstat_and_stat() {
    let mut e = Env::new(Abi::X86_64);
    let p = e.cstr(SCRATCH, "/bin/prog");
    assert_eq!(e.ret("stat", &[p, SCRATCH + 0x100]), 0);
    let st = Stat::from_bytes(&e.peek(SCRATCH + 0x100, Stat::SIZE).try_into().unwrap());
    assert_eq!(st.st_size, 8192);
    assert_eq!(st.st_mode, 0o100755);
    assert_eq!(st.st_nlink, 1);
    assert_eq!(st.st_blocks, 16);
    let link = e.cstr(SCRATCH + 0x80, "/proc/self/exe");
    assert_eq!(e.ret("lstat", &[link, SCRATCH + 0x100]), 0);
    let st = Stat::from_bytes(&e.peek(SCRATCH + 0x100, Stat::SIZE).try_into().unwrap());
    assert_eq!(st.st_mode & 0o170000, 0o120000);
    assert_eq!(e.ret("stat", &[link, SCRATCH + 0x100]), 0);
    let st = Stat::from_bytes(&e.peek(SCRATCH + 0x100, Stat::SIZE).try_into().unwrap());
    assert_eq!(st.st_size, 8192, "stat follows /proc/self/exe");
    assert_eq!(e.err("readlink", &[p, SCRATCH, 100]), Errno::EINVAL);
    assert_eq!(e.ret("readlink", &[link, SCRATCH + 0x200, 4]), 4);
    assert_eq!(e.peek(SCRATCH + 0x200, 4), b"/bin");
}

#[test]
fn mmap_munmap_mprotect_against_the_areas() {
    for mut e in both() {
        // i386's "mmap" is the old one with its arguments in memory.
        let mmap = if e.abi == Abi::I386 { "mmap2" } else { "mmap" };
        let mask = if e.abi == Abi::I386 {
            0xffff_ffff
        } else {
            u64::MAX
        };
        let len = 8 * 4096;
        let m = e.ret(mmap, &[0, len, 3, 0x22, u64::MAX, 0]) as u64;
        let m = if e.abi == Abi::I386 {
            m & 0xffff_ffff
        } else {
            m
        };
        assert_eq!(
            e.p.areas.find(m).map(|a| a.end),
            Some(m + len),
            "{:?} {m:x}",
            e.abi
        );
        e.poke(m + 4096, b"data");
        // munmap the middle: the area splits and the pages are dropped.
        assert_eq!(e.ret("munmap", &[m + 2 * 4096, 2 * 4096]), 0);
        assert!(e.p.areas.find(m + 2 * 4096).is_none());
        assert!(e.p.areas.find(m + 4 * 4096).is_some());
        assert!(e.m.discarded.contains(&(m + 2 * 4096, m + 4 * 4096)));
        assert_eq!(e.err("munmap", &[m + 1, 4096]), Errno::EINVAL);
        assert_eq!(e.err("munmap", &[m, 0]), Errno::EINVAL);
        // mprotect read-only: writes through the user-copy path now fault.
        assert_eq!(e.ret("mprotect", &[m, 4096 * 2, 1]), 0);
        assert_eq!(e.p.areas.find(m).unwrap().prot, Prot::READ);
        assert!(e.m.protected.contains(&(m, m + 2 * 4096, Prot::READ)));
        assert_eq!(e.m.write_user(&e.p.areas, m, b"x"), Err(Errno::EFAULT));
        let z = e.cstr(SCRATCH, "/dev/zero");
        let zfd = e.ret("open", &[z, 0, 0]) as u64;
        assert_eq!(e.err("read", &[zfd, m, 1]), Errno::EFAULT);
        assert_eq!(
            e.err("mprotect", &[m, 4096 * 8, 1]),
            Errno::ENOMEM,
            "a hole"
        );
        assert_eq!(e.err("mprotect", &[m, 4096, 8]), Errno::EINVAL);
        // MAP_FIXED replaces, MAP_FIXED_NOREPLACE refuses.
        assert_eq!(
            e.ret(mmap, &[m, 4096, 3, 0x32, u64::MAX, 0]) as u64 & mask,
            m
        );
        assert_eq!(e.peek(m + 4096, 4), b"data", "the rest is untouched");
        assert_eq!(
            e.err(mmap, &[m, 4096, 3, 0x10_0022, u64::MAX, 0]),
            Errno::EEXIST
        );
        assert_eq!(
            e.err(mmap, &[0x1000, 4096, 3, 0x32, u64::MAX, 0]),
            Errno::EPERM
        );
        assert_eq!(e.err(mmap, &[0, 0, 3, 0x22, u64::MAX, 0]), Errno::EINVAL);
        assert_eq!(e.err(mmap, &[0, 4096, 3, 0x20, u64::MAX, 0]), Errno::EINVAL);
        assert_eq!(e.err(mmap, &[0, 4096, 3, 0x02, 99, 0]), Errno::EBADF);
        // A hint that is free is taken.
        let h = 0x5000_0000;
        assert_eq!(
            e.ret(mmap, &[h, 4096, 3, 0x22, u64::MAX, 0]) as u64 & mask,
            h
        );
    }
}

#[test]
fn read_into_read_only_memory_is_efault() {
    let mut e = Env::new(Abi::X86_64);
    let p = e.cstr(SCRATCH, "/data/input.txt");
    let fd = e.ret("open", &[p, 0, 0]) as u64;
    assert_eq!(e.err("read", &[fd, RO, 4]), Errno::EFAULT);
    assert_eq!(e.err("read", &[fd, TEXT, 4]), Errno::EFAULT);
    assert_eq!(e.ret("lseek", &[fd, 0, 1]), 0, "nothing was consumed");
}

#[test]
fn brk_grows_and_shrinks_the_heap_area() {
    for mut e in both() {
        let b = e.ret("brk", &[0]) as u64;
        assert_eq!(e.ret("brk", &[b + 100_000]) as u64, b + 100_000);
        let a = e.p.areas.find(b).unwrap();
        assert_eq!((a.start, a.kind, a.prot), (b, AreaKind::Heap, Prot::RW));
        assert_eq!(e.ret("brk", &[b + 200_000]) as u64, b + 200_000);
        assert_eq!(
            e.p.areas
                .iter()
                .filter(|a| a.kind == AreaKind::Heap)
                .count(),
            1
        );
        e.poke(b + 199_999, b"z");
        assert_eq!(e.ret("brk", &[b + 10]) as u64, b + 10);
        assert!(e.p.areas.find(b + 8192).is_none());
        assert!(e.m.discarded.iter().any(|&(s, _)| s == b + 4096));
        // Below the start, or into another mapping: the old break.
        assert_eq!(e.ret("brk", &[b - 4096]) as u64, b + 10);
        assert_eq!(e.ret("brk", &[SCRATCH + 10]) as u64, b + 10);
        // A 64 MiB heap.
        assert_eq!(e.ret("brk", &[b + (64 << 20)]) as u64, b + (64 << 20));
    }
}

#[test]
fn madvise_dontneed_zeroes_and_mremap_moves() {
    let mut e = Env::new(Abi::X86_64);
    let m = e.ret("mmap", &[0, 4 * 4096, 3, 0x22, u64::MAX, 0]) as u64;
    e.poke(m, b"keep");
    assert_eq!(e.ret("madvise", &[m, 4096, 4]), 0);
    assert_eq!(e.peek(m, 4), [0; 4]);
    assert_eq!(e.err("madvise", &[m, 4096, 999]), Errno::EINVAL);
    assert_eq!(e.ret("madvise", &[m, 4096, 14]), 0);
    e.poke(m + 4096, b"moved");
    // Block the in-place growth, so it must move.
    assert_eq!(
        e.ret("mmap", &[m + 4 * 4096, 4096, 3, 0x32, u64::MAX, 0]) as u64,
        m + 4 * 4096
    );
    assert_eq!(
        e.err("mremap", &[m, 4 * 4096, 8 * 4096, 0, 0]),
        Errno::ENOMEM
    );
    let n = e.ret("mremap", &[m, 4 * 4096, 8 * 4096, 1, 0]) as u64;
    assert_ne!(n, m);
    assert_eq!(e.peek(n + 4096, 5), b"moved");
    assert!(e.p.areas.find(m).is_none());
    assert_eq!(e.p.areas.find(n).unwrap().end, n + 8 * 4096);
    // Shrink in place.
    assert_eq!(e.ret("mremap", &[n, 8 * 4096, 4096, 0, 0]) as u64, n);
    assert!(e.p.areas.find(n + 4096).is_none());
}

#[test]
fn file_mappings_read_the_file() {
    let mut e = Env::new(Abi::X86_64);
    let p = e.cstr(SCRATCH, "/tmp/f");
    let fd = e.ret("open", &[p, O_CREAT | O_RDWR, 0o644]) as u64;
    e.poke(SCRATCH + 0x100, b"mapped bytes");
    assert_eq!(e.ret("write", &[fd, SCRATCH + 0x100, 12]), 12);
    let m = e.ret("mmap", &[0, 8192, 1, 2, fd, 0]) as u64;
    assert_eq!(e.peek(m, 12), b"mapped bytes");
    assert_eq!(e.peek(m + 12, 4), [0; 4]);
    assert_eq!(e.err("mmap", &[0, 4096, 3, 1, fd, 0]), Errno::ENODEV);
    assert_eq!(e.err("mmap", &[0, 4096, 1, 2, fd, 100]), Errno::EINVAL);
    assert_eq!(e.err("mmap", &[0, 4096, 1, 2, 1, 0]), Errno::EACCES);
    let z = e.cstr(SCRATCH, "/dev/zero");
    let zfd = e.ret("open", &[z, O_RDWR, 0]) as u64;
    let zm = e.ret("mmap", &[0, 4096, 3, 2, zfd, 0]) as u64;
    assert_eq!(e.p.areas.find(zm).unwrap().kind, AreaKind::Anon);
    // Shared anonymous memory, and shared /dev/zero, is shared with a
    // forked child.
    let sm = e.ret("mmap", &[0, 4096, 3, 0x21, u64::MAX, 0]) as u64;
    assert_eq!(e.p.areas.find(sm).unwrap().kind, AreaKind::Shared);
    let szm = e.ret("mmap", &[0, 4096, 3, 1, zfd, 0]) as u64;
    assert_eq!(e.p.areas.find(szm).unwrap().kind, AreaKind::Shared);
}

#[test]
fn signals_to_itself() {
    let mut e = Env::new(Abi::X86_64);
    assert_eq!(e.ret("kill", &[7, 0]), 0);
    assert_eq!(e.err("kill", &[8, 0]), Errno::ESRCH);
    assert_eq!(
        e.err("kill", &[-1i64 as u64, 9]),
        Errno::ESRCH,
        "-1 is everyone but the caller: nobody here"
    );
    assert_eq!(e.err("kill", &[7, 65]), Errno::EINVAL);
    assert_eq!(e.ret("kill", &[7, 17]), 0, "SIGCHLD is ignored by default");
    // An ignored SIGTERM does nothing.
    let act = Sigaction64 {
        sa_handler: 1,
        sa_flags: 0,
        sa_restorer: 0,
        sa_mask: 0,
    };
    e.poke(SCRATCH, &act.to_bytes());
    assert_eq!(e.ret("rt_sigaction", &[15, SCRATCH, 0, 8]), 0);
    assert_eq!(e.ret("kill", &[7, 15]), 0);
    assert_eq!(e.ret("rt_sigaction", &[15, 0, SCRATCH + 0x100, 8]), 0);
    assert_eq!(e.u64_at(SCRATCH + 0x100), 1);
    assert_eq!(e.err("rt_sigaction", &[9, SCRATCH, 0, 8]), Errno::EINVAL);
    assert_eq!(e.err("rt_sigaction", &[15, SCRATCH, 0, 4]), Errno::EINVAL);
    // musl's abort(): raise() blocks everything, tkill, restores the mask.
    e.poke(SCRATCH, &u64::MAX.to_le_bytes());
    assert_eq!(e.ret("rt_sigprocmask", &[0, SCRATCH, SCRATCH + 8, 8]), 0);
    assert_eq!(e.ret("tkill", &[7, 6]), 0, "blocked: pending");
    assert_eq!(e.deliver(), Delivery::Nothing, "blocked");
    assert_eq!(e.ret("rt_sigprocmask", &[2, SCRATCH + 8, 0, 8]), 0);
    assert!(matches!(e.deliver(), Delivery::Kill { signal: 6, .. }));
    // tgkill straight away.
    let mut e = Env::new(Abi::I386);
    assert_eq!(e.err("tgkill", &[7, 8, 6]), Errno::ESRCH);
    assert_eq!(e.ret("tgkill", &[7, 7, 11]), 0);
    assert!(matches!(e.deliver(), Delivery::Kill { signal: 11, .. }));
    let act = Sigaction32 {
        sa_handler: 0x8048000,
        sa_flags: 0x0400_0000,
        sa_restorer: 0x8048010,
        sa_mask: 1 << 5,
    };
    e.poke(SCRATCH, &act.to_bytes());
    assert_eq!(e.ret("rt_sigaction", &[10, SCRATCH, 0, 8]), 0);
    assert_eq!(e.ret("rt_sigaction", &[10, 0, SCRATCH + 0x40, 8]), 0);
    assert_eq!(
        Sigaction32::from_bytes(&e.peek(SCRATCH + 0x40, 20).try_into().unwrap()),
        act
    );
    assert_eq!(e.ret("kill", &[0, 10]), 0);
    assert_eq!(e.deliver(), Delivery::Handler(10), "i386 handlers run");
    assert_eq!(e.call("rt_sigreturn", &[]), Action::SigReturn);
    assert_eq!(e.call("sigreturn", &[]), Action::OldSigReturn);
    // sigaltstack records.
    let mut e = Env::new(Abi::X86_64);
    let ss = crate::sys::uapi::Stack64 {
        ss_sp: SCRATCH,
        ss_flags: 0,
        pad: 0,
        ss_size: 8192,
    };
    e.poke(SCRATCH + 0x200, &ss.to_bytes());
    assert_eq!(e.ret("sigaltstack", &[SCRATCH + 0x200, SCRATCH + 0x300]), 0);
    assert_eq!(
        e.peek(SCRATCH + 0x308, 4),
        2u32.to_le_bytes(),
        "the old one was disabled"
    );
    assert_eq!(e.t.altstack.size, 8192);
}

#[test]
fn futex_wait_checks_the_word_and_blocks() {
    for mut e in both() {
        e.poke(SCRATCH, &5u32.to_le_bytes());
        assert_eq!(e.err("futex", &[SCRATCH, 128, 4, 0, 0, 0]), Errno::EAGAIN);
        assert_eq!(e.call("futex", &[SCRATCH, 128, 5, 0, 0, 0]), Action::Block);
        // A wake (here by the same thread id, as a test can) takes it.
        assert_eq!(e.ret("futex", &[SCRATCH, 129, 1, 0, 0, 0]), 1);
        assert_eq!(e.m.woken, [7]);
        assert_eq!(e.ret("futex", &[SCRATCH, 129, 1, 0, 0, 0]), 0);
        assert_eq!(
            e.err("futex", &[SCRATCH + 1, 128, 5, 0, 0, 0]),
            Errno::EINVAL
        );
        assert_eq!(e.err("futex", &[BAD, 128, 5, 0, 0, 0]), Errno::EFAULT);
        // A relative timeout of 1.5 s.
        let ts: Vec<u8> = if e.abi == Abi::X86_64 {
            [1i64.to_le_bytes(), 500_000_000i64.to_le_bytes()].concat()
        } else {
            [1i32.to_le_bytes(), 500_000_000i32.to_le_bytes()].concat()
        };
        e.poke(SCRATCH + 0x10, &ts);
        match e.call("futex", &[SCRATCH, 128, 5, SCRATCH + 0x10, 0, 0]) {
            Action::Sleep { until_ns, then } => {
                assert!((1_500_000_000..1_600_000_000).contains(&until_ns));
                assert_eq!(then, Errno::ETIMEDOUT.to_return());
            }
            a => panic!("{a:?}"),
        }
        assert_eq!(
            e.err("futex", &[SCRATCH, 128 | 9, 5, 0, 0, 0]),
            Errno::EINVAL,
            "bitset 0"
        );
        assert_eq!(
            e.err("futex", &[SCRATCH, 128 | 77, 5, 0, 0, 0]),
            Errno::ENOSYS
        );
        assert!(
            e.sys.unknown.list().is_empty(),
            "an unsupported futex op is not an unknown call"
        );
    }
}

#[test]
fn sleeping_and_clocks() {
    let mut e = Env::new(Abi::X86_64);
    e.poke(SCRATCH, &[2i64.to_le_bytes(), 0i64.to_le_bytes()].concat());
    match e.call("nanosleep", &[SCRATCH, 0]) {
        Action::Sleep { until_ns, then: 0 } => {
            assert!((2_000_000_000..2_001_000_000).contains(&until_ns))
        }
        a => panic!("{a:?}"),
    }
    // Absolute monotonic deadline at 5 s.
    e.poke(SCRATCH, &[5i64.to_le_bytes(), 0i64.to_le_bytes()].concat());
    match e.call("clock_nanosleep", &[1, 1, SCRATCH, 0]) {
        Action::Sleep { until_ns, .. } => {
            assert!((4_999_000_000..=5_000_010_000).contains(&until_ns))
        }
        a => panic!("{a:?}"),
    }
    e.poke(
        SCRATCH,
        &[0i64.to_le_bytes(), 2_000_000_000i64.to_le_bytes()].concat(),
    );
    assert_eq!(e.err("nanosleep", &[SCRATCH, 0]), Errno::EINVAL);
    assert_eq!(e.err("clock_gettime", &[99, SCRATCH]), Errno::EINVAL);
    for clock in [0u64, 1, 2, 3, 4, 5, 6, 7] {
        assert_eq!(e.ret("clock_gettime", &[clock, SCRATCH]), 0);
        assert_eq!(e.ret("clock_getres", &[clock, SCRATCH + 0x10]), 0);
    }
    assert_eq!(e.ret("clock_getres", &[1, 0]), 0);
    let t = e.ret("time", &[SCRATCH]);
    assert!(t >= 1_700_000_000);
    assert_eq!(e.u64_at(SCRATCH), t as u64);
    assert_eq!(e.ret("gettimeofday", &[SCRATCH, 0]), 0);
    assert!(e.u64_at(SCRATCH) >= 1_700_000_000);
    assert_eq!(e.call("sched_yield", &[]), Action::Yield);
    assert_eq!(e.ret("sched_getaffinity", &[0, 128, SCRATCH]), 8);
    assert_eq!(e.u64_at(SCRATCH), 1);
    assert_eq!(e.err("sched_getaffinity", &[0, 3, SCRATCH]), Errno::EINVAL);
    assert_eq!(e.err("getrandom", &[SCRATCH, 8, 8]), Errno::EINVAL);
    // i386: a 32-bit timespec for clock_nanosleep, 64-bit for the _time64 one.
    let mut e = Env::new(Abi::I386);
    e.poke(SCRATCH, &[1i32.to_le_bytes(), 0i32.to_le_bytes()].concat());
    assert!(matches!(
        e.call("clock_nanosleep", &[1, 0, SCRATCH, 0]),
        Action::Sleep { .. }
    ));
    e.poke(SCRATCH, &[1i64.to_le_bytes(), 0i64.to_le_bytes()].concat());
    assert!(matches!(
        e.call("clock_nanosleep_time64", &[1, 0, SCRATCH, 0]),
        Action::Sleep { .. }
    ));
    assert_eq!(e.ret("sched_getaffinity", &[0, 4, SCRATCH]), 4);
}

#[test]
fn affinity_reports_every_cpu_that_is_up() {
    let mut e = Env::new(Abi::X86_64);
    e.m.more_cpus = 3;
    e.poke(SCRATCH, &[0xaa; 16]);
    assert_eq!(e.ret("sched_getaffinity", &[0, 128, SCRATCH]), 8);
    assert_eq!(e.u64_at(SCRATCH), 0xf);
    assert_eq!(
        e.u64_at(SCRATCH + 8),
        0xaaaa_aaaa_aaaa_aaaa,
        "past the size"
    );
    assert_eq!(e.err("sched_getaffinity", &[0, 12, SCRATCH]), Errno::EINVAL);
    assert_eq!(e.ret("sched_getaffinity", &[0, u64::MAX - 7, SCRATCH]), 8);
    // Setting: a mask that names a CPU that is up; the CPUs past the last
    // one up are dropped. The caller, on CPU 0, leaves it (the call yields,
    // returning 0); get reads the narrowed mask back.
    e.poke(SCRATCH, &0xf8u64.to_le_bytes());
    assert_eq!(e.call("sched_setaffinity", &[0, 8, SCRATCH]), Action::Yield);
    assert_eq!(e.m.affinity.get(&7), Some(&8));
    assert_eq!(e.ret("sched_getaffinity", &[0, 8, SCRATCH + 16]), 8);
    assert_eq!(e.u64_at(SCRATCH + 16), 8);
    // A mask that keeps the caller's CPU returns at once.
    e.poke(SCRATCH, &1u64.to_le_bytes());
    assert_eq!(e.ret("sched_setaffinity", &[7, 8, SCRATCH]), 0);
    e.poke(SCRATCH, &0x10u64.to_le_bytes());
    assert_eq!(e.err("sched_setaffinity", &[0, 8, SCRATCH]), Errno::EINVAL);
    // Another thread of the process, by its tid; a tid that is none: ESRCH.
    e.m.threads.push(9);
    e.poke(SCRATCH, &4u64.to_le_bytes());
    assert_eq!(e.ret("sched_setaffinity", &[9, 8, SCRATCH]), 0);
    assert_eq!(e.ret("sched_getaffinity", &[9, 8, SCRATCH + 16]), 8);
    assert_eq!(e.u64_at(SCRATCH + 16), 4);
    assert_eq!(e.err("sched_setaffinity", &[10, 8, SCRATCH]), Errno::ESRCH);
    assert_eq!(e.err("sched_getaffinity", &[10, 8, SCRATCH]), Errno::ESRCH);
    e.m.affinity.clear();
    // 64 CPUs: every bit; an i386 caller needs two 4-byte words for them.
    e.m.more_cpus = 63;
    assert_eq!(e.ret("sched_getaffinity", &[0, 8, SCRATCH]), 8);
    assert_eq!(e.u64_at(SCRATCH), u64::MAX);
    // getcpu: the CPU the caller runs on, node 0.
    e.m.cpu = 5;
    e.poke(SCRATCH, &[0xff; 8]);
    assert_eq!(e.ret("getcpu", &[SCRATCH, SCRATCH + 4, 0]), 0);
    assert_eq!(e.u64_at(SCRATCH), 5);
    let mut e = Env::new(Abi::I386);
    e.m.more_cpus = 39;
    assert_eq!(e.err("sched_getaffinity", &[0, 4, SCRATCH]), Errno::EINVAL);
    assert_eq!(e.ret("sched_getaffinity", &[0, 64, SCRATCH]), 8);
    assert_eq!(e.u64_at(SCRATCH), (1 << 40) - 1);
}

#[test]
fn limits_identity_and_prctl() {
    for mut e in both() {
        for n in ["getpid", "gettid", "getpgrp"] {
            assert_eq!(e.ret(n, &[]), 7);
        }
        assert_eq!(e.ret("getppid", &[]), 1);
        assert_eq!(e.ret("getuid", &[]), 0);
        assert_eq!(e.ret("umask", &[0o077]), 0o022);
        assert_eq!(e.ret("umask", &[0o022]), 0o077);
        assert_eq!(e.ret("getrlimit", &[7, SCRATCH]), 0);
        assert_eq!(e.u32_at(SCRATCH), 1024);
        assert_eq!(e.ret("prlimit64", &[0, 7, 0, SCRATCH]), 0);
        assert_eq!(e.u64_at(SCRATCH + 8), 1024);
        assert_eq!(e.err("prlimit64", &[0, 99, 0, SCRATCH]), Errno::EINVAL);
        assert_eq!(e.err("prlimit64", &[3, 7, 0, SCRATCH]), Errno::ESRCH);
        e.poke(
            SCRATCH,
            &[100u64.to_le_bytes(), 200u64.to_le_bytes()].concat(),
        );
        assert_eq!(e.ret("prlimit64", &[0, 7, SCRATCH, 0]), 0);
        assert_eq!(e.p.rlimits[7].cur, 100);
        e.poke(
            SCRATCH,
            &[300u64.to_le_bytes(), 200u64.to_le_bytes()].concat(),
        );
        assert_eq!(e.err("prlimit64", &[0, 7, SCRATCH, 0]), Errno::EINVAL);
        let name = e.cstr(SCRATCH, "a-very-long-thread-name");
        assert_eq!(e.ret("prctl", &[15, name]), 0);
        assert_eq!(e.p.comm(), b"a-very-long-thr");
        assert_eq!(e.ret("prctl", &[16, SCRATCH + 0x100]), 0);
        assert_eq!(e.peek(SCRATCH + 0x100, 16), b"a-very-long-thr\0");
        assert_eq!(e.err("prctl", &[1000, 0]), Errno::EINVAL);
        assert_eq!(e.ret("sysinfo", &[SCRATCH]), 0);
        assert_eq!(e.ret("getrusage", &[0, SCRATCH]), 0);
        assert_eq!(e.err("getrusage", &[5, SCRATCH]), Errno::EINVAL);
        assert!(e.ret("times", &[0]) >= 0);
    }
    let mut e = Env::new(Abi::I386);
    assert_eq!(e.ret("ugetrlimit", &[3, SCRATCH]), 0);
    assert_eq!(e.u32_at(SCRATCH + 4), u32::MAX, "infinity");
    assert_eq!(e.ret("getrlimit", &[3, SCRATCH]), 0);
    assert_eq!(
        e.u32_at(SCRATCH + 4),
        0x7fff_ffff,
        "the old getrlimit clamps"
    );
    assert_eq!(e.err("arch_prctl", &[0x1002, SCRATCH]), Errno::EINVAL);
}

#[test]
fn unknown_calls_are_counted_by_name() {
    let mut e = Env::new(Abi::X86_64);
    assert_eq!(e.err("acct", &[0]), Errno::ENOSYS);
    assert_eq!(e.err("acct", &[0]), Errno::ENOSYS);
    // A process sharing the caller's descriptor table.
    assert_eq!(e.err("clone", &[0x400 | 17]), Errno::ENOSYS);
    assert_eq!(
        e.call_nr(400, &[]),
        Action::Return(Errno::ENOSYS.to_return())
    );
    assert_eq!(
        e.call_nr(1 << 40, &[]),
        Action::Return(Errno::ENOSYS.to_return())
    );
    assert_eq!(e.err("rseq", &[0, 0, 0, 0]), Errno::ENOSYS);
    e.abi = Abi::I386;
    assert_eq!(e.err("acct", &[0]), Errno::ENOSYS);
    assert_eq!(
        e.sys.unknown.summary(),
        "x86_64 56 (clone) x1, x86_64 163 (acct) x2, x86_64 400 (unassigned) x1, \
         x86_64 1099511627776 (invalid) x1, i386 51 (acct) x1"
    );
    // Memory stays bounded however many distinct numbers come in.
    for n in 0..10_000u64 {
        e.call_nr(100_000 + n, &[]);
    }
    assert!(e.sys.unknown.list().len() < 50);
}

#[test]
fn output_is_line_buffered_per_stream() {
    let mut e = Env::new(Abi::X86_64);
    e.poke(SCRATCH, b"one\ntwo");
    assert_eq!(e.ret("write", &[1, SCRATCH, 7]), 7);
    e.poke(SCRATCH, b"err\n");
    assert_eq!(e.ret("write", &[2, SCRATCH, 4]), 4);
    e.poke(SCRATCH, b" more\nend");
    assert_eq!(e.ret("write", &[1, SCRATCH, 9]), 9);
    e.p.flush_output(&mut e.m);
    assert_eq!(
        e.m.console,
        [
            (Stream::Stdout, b"one".to_vec(), LineEnd::Newline),
            (Stream::Stderr, b"err".to_vec(), LineEnd::Newline),
            (Stream::Stdout, b"two more".to_vec(), LineEnd::Newline),
            (Stream::Stdout, b"end".to_vec(), LineEnd::Partial),
        ]
    );
    // A line longer than the buffer goes out in pieces.
    e.m.console.clear();
    let big = vec![b'x'; SCRATCH_LEN as usize];
    e.poke(SCRATCH, &big);
    assert_eq!(
        e.ret("write", &[1, SCRATCH, SCRATCH_LEN]),
        SCRATCH_LEN as i64
    );
    assert_eq!(e.m.console.len(), 4);
    assert!(
        e.m.console
            .iter()
            .all(|(_, l, end)| l.len() == 16384 && *end == LineEnd::Overlong)
    );
    assert_eq!(e.err("write", &[0, SCRATCH, 1]), Errno::EBADF);
}

#[test]
fn huge_lengths_are_bounded() {
    let mut e = Env::new(Abi::X86_64);
    // Past the scratch area the copy faults: the count so far comes back.
    assert_eq!(e.ret("write", &[1, SCRATCH, 1 << 40]), SCRATCH_LEN as i64);
    assert_eq!(e.err("write", &[1, SCRATCH, u64::MAX]), Errno::EFAULT);
    assert_eq!(
        e.ret("getrandom", &[SCRATCH, 1 << 40, 0]),
        SCRATCH_LEN as i64
    );
    let z = e.cstr(SCRATCH, "/dev/zero");
    let fd = e.ret("open", &[z, 0, 0]) as u64;
    assert_eq!(e.ret("read", &[fd, SCRATCH, 1 << 40]), SCRATCH_LEN as i64);
    let mut e = Env::new(Abi::I386);
    assert_eq!(
        e.ret("write", &[1, SCRATCH, 1 << 40]),
        0,
        "i386 sees the low 32 bits"
    );
    assert_eq!(e.err("write", &[1, SCRATCH, 0xffff_ffff]), Errno::EFAULT);
}

#[test]
fn select_and_pselect6() {
    for mut e in both() {
        let wide = e.abi == Abi::X86_64;
        let tv: Vec<u8> = if wide {
            [1i64.to_le_bytes(), 0i64.to_le_bytes()].concat()
        } else {
            [1i32.to_le_bytes(), 0i32.to_le_bytes()].concat()
        };
        // select(0, NULL, NULL, NULL, &{1 s}) waits; made again past its
        // deadline it returns 0 and leaves no time.
        e.poke(SCRATCH, &tv);
        let select = if wide { "select" } else { "_newselect" };
        let start = e.m.mono;
        match e.call(select, &[0, 0, 0, 0, SCRATCH]) {
            Action::Wait {
                until_ns: Some(until_ns),
            } => {
                assert!((start + 1_000_000_000..start + 1_001_000_000).contains(&until_ns))
            }
            a => panic!("{a:?}"),
        }
        assert_eq!(e.peek(SCRATCH, tv.len()), tv, "untouched while waiting");
        // Woken early, it waits again for the same deadline.
        let until = e.t.wait.unwrap().until_ns;
        assert_eq!(e.resume(), Some(Action::Wait { until_ns: until }));
        e.m.mono += 1_000_000_000;
        assert_eq!(e.resume(), Some(Action::Return(0)));
        assert_eq!(e.peek(SCRATCH, tv.len()), vec![0; tv.len()]);
        assert!(e.t.wait.is_none() && e.sys.waits.is_empty());
        // fd 1 is writable, not readable; fd 9 is not open.
        e.poke(SCRATCH + 0x10, &[0b10, 0, 0, 0, 0, 0, 0, 0]);
        e.poke(SCRATCH + 0x20, &[0b10, 0, 0, 0, 0, 0, 0, 0]);
        e.poke(SCRATCH, &[0; 16]);
        assert_eq!(
            e.ret(select, &[2, SCRATCH + 0x10, SCRATCH + 0x20, 0, SCRATCH]),
            1
        );
        assert_eq!(e.peek(SCRATCH + 0x10, 1), [0], "not readable");
        assert_eq!(e.peek(SCRATCH + 0x20, 1), [0b10], "writable");
        e.poke(SCRATCH + 0x10, &[0, 2, 0, 0, 0, 0, 0, 0]);
        assert_eq!(e.err(select, &[10, SCRATCH + 0x10, 0, 0, 0]), Errno::EBADF);
        assert_eq!(e.err(select, &[-1i64 as u64, 0, 0, 0, 0]), Errno::EINVAL);
        assert_eq!(e.err(select, &[8, BAD, 0, 0, 0]), Errno::EFAULT);
        assert_eq!(e.err(select, &[0, 0, 0, 0, BAD]), Errno::EFAULT);
        // pselect6 with a zero timespec and a sigset argument.
        e.poke(SCRATCH + 0x20, &[0b1, 0, 0, 0, 0, 0, 0, 0]);
        e.poke(SCRATCH + 0x40, &[0; 16]);
        let word = |v: u64| {
            if wide {
                v.to_le_bytes().to_vec()
            } else {
                (v as u32).to_le_bytes().to_vec()
            }
        };
        e.poke(SCRATCH + 0x60, &[word(SCRATCH + 0x80), word(8)].concat());
        assert_eq!(
            e.ret(
                "pselect6",
                &[1, SCRATCH + 0x20, 0, 0, SCRATCH + 0x40, SCRATCH + 0x60]
            ),
            1
        );
        e.poke(SCRATCH + 0x60, &[word(SCRATCH + 0x80), word(4)].concat());
        assert_eq!(
            e.err("pselect6", &[1, 0, 0, 0, SCRATCH + 0x40, SCRATCH + 0x60]),
            Errno::EINVAL
        );
        assert_eq!(
            e.err("pselect6", &[1, 0, 0, 0, SCRATCH + 0x40, BAD]),
            Errno::EFAULT
        );
    }
    // The i386 old select takes its arguments in a block.
    let mut e = Env::new(Abi::I386);
    e.poke(SCRATCH + 0x20, &[0b10, 0, 0, 0]);
    let block = [2u32, 0, SCRATCH as u32 + 0x20, 0, 0]
        .map(u32::to_le_bytes)
        .concat();
    e.poke(SCRATCH, &block);
    assert_eq!(e.ret("select", &[SCRATCH]), 1);
    assert_eq!(e.err("select", &[BAD]), Errno::EFAULT);
}

#[test]
fn pipes_within_one_process() {
    for mut e in both() {
        assert_eq!(e.ret("pipe", &[SCRATCH]), 0);
        let (r, w) = (e.u32_at(SCRATCH) as u64, e.u32_at(SCRATCH + 4) as u64);
        assert_eq!((r, w), (3, 4));
        // Reading the empty pipe while a writer is open waits.
        assert_eq!(
            e.call("read", &[r, SCRATCH + 0x100, 10]),
            Action::Wait { until_ns: None }
        );
        assert_eq!(
            e.ret("read", &[r, SCRATCH + 0x100, 0]),
            0,
            "an empty read does not wait"
        );
        assert_eq!(e.ret("fstat", &[r, SCRATCH + 0x800]), 0);
        assert_eq!(
            e.u32_at(SCRATCH + 0x800 + if e.abi == Abi::X86_64 { 24 } else { 8 }) & 0o170000,
            0o010000
        );
        e.poke(SCRATCH + 0x100, b"through the pipe");
        assert_eq!(e.ret("write", &[w, SCRATCH + 0x100, 16]), 16);
        assert_eq!(e.err("read", &[w, SCRATCH + 0x200, 4]), Errno::EBADF);
        assert_eq!(e.err("write", &[r, SCRATCH + 0x200, 4]), Errno::EBADF);
        assert_eq!(e.ret("read", &[r, SCRATCH + 0x200, 7]), 7);
        assert_eq!(e.peek(SCRATCH + 0x200, 7), b"through");
        assert_eq!(e.err("lseek", &[r, 0, 1]), Errno::ESPIPE);
        // poll: readable with bytes in it; writable with room.
        let pfds = [r as i32, 1, w as i32, 4].map(|v| v.to_le_bytes()).concat();
        e.poke(SCRATCH + 0x300, &pfds);
        assert_eq!(e.ret("poll", &[SCRATCH + 0x300, 2, 0]), 2);
        // A dup keeps the write end open after close.
        let w2 = e.ret("dup", &[w]) as u64;
        assert_eq!(e.ret("close", &[w]), 0);
        assert_eq!(e.ret("read", &[r, SCRATCH + 0x200, 100]), 9);
        assert_eq!(
            e.call("read", &[r, SCRATCH + 0x200, 100]),
            Action::Wait { until_ns: None }
        );
        assert_eq!(e.ret("close", &[w2]), 0);
        assert_eq!(
            e.ret("read", &[r, SCRATCH + 0x200, 100]),
            0,
            "no writer: end of file"
        );
        // Writing without a reader: SIGPIPE, or EPIPE when it is ignored.
        assert_eq!(e.ret("pipe2", &[SCRATCH, 0o4000 | 0o2000000]), 0);
        let (r, w) = (e.u32_at(SCRATCH) as u64, e.u32_at(SCRATCH + 4) as u64);
        assert_eq!(e.ret("fcntl", &[r, 1, 0]), 1, "O_CLOEXEC");
        assert_eq!(
            e.err("read", &[r, SCRATCH + 0x200, 1]),
            Errno::EAGAIN,
            "O_NONBLOCK"
        );
        // Fill it: 65536 bytes fit, then EAGAIN.
        let mut total = 0;
        while total < 65536 {
            total += e.ret("write", &[w, SCRATCH, 0x8000]);
        }
        assert_eq!(total, 65536);
        assert_eq!(e.err("write", &[w, SCRATCH, 1]), Errno::EAGAIN);
        assert_eq!(e.ret("close", &[r]), 0);
        assert!(matches!(
            e.call("write", &[w, SCRATCH, 1]),
            Action::Kill { signal: 13, .. }
        ));
        let ign = if e.abi == Abi::X86_64 {
            vec![1u8, 0, 0, 0, 0, 0, 0, 0]
        } else {
            vec![1u8, 0, 0, 0]
        };
        e.poke(SCRATCH + 0x400, &[ign, vec![0; 24]].concat());
        assert_eq!(e.ret("rt_sigaction", &[13, SCRATCH + 0x400, 0, 8]), 0);
        assert_eq!(e.err("write", &[w, SCRATCH, 1]), Errno::EPIPE);
        assert_eq!(e.err("pipe2", &[SCRATCH, 1]), Errno::EINVAL);
        assert_eq!(e.err("pipe", &[RO]), Errno::EFAULT);
        assert_eq!(e.err("pipe", &[BAD]), Errno::EFAULT);
    }
}

#[test]
fn utimensat_and_chown() {
    for mut e in both() {
        let wide = e.abi == Abi::X86_64;
        let p = e.cstr(SCRATCH, "/tmp/t");
        let fd = e.ret("open", &[p, O_CREAT | O_WRONLY, 0o644]) as u64;
        let ts: Vec<u8> = if wide {
            [0i64, (1 << 30) - 2, 1_000_000, 5]
                .map(i64::to_le_bytes)
                .concat()
        } else {
            [0i32, (1 << 30) - 2, 1_000_000, 5]
                .map(i32::to_le_bytes)
                .concat()
        };
        e.poke(SCRATCH + 0x100, &ts);
        assert_eq!(e.ret("utimensat", &[AT_FDCWD, p, SCRATCH + 0x100, 0]), 0);
        let id = e.sys.fs.resolve(crate::sys::fs::ROOT, b"/tmp/t").unwrap();
        assert_eq!(e.sys.fs.node(id).mtime_ns, 1_000_000 * 1_000_000_000 + 5);
        // NULL path: the descriptor (futimens); NULL times: now.
        assert_eq!(e.ret("utimensat", &[fd, 0, 0, 0]), 0);
        assert!(e.sys.fs.node(id).mtime_ns >= 1_700_000_000 * 1_000_000_000);
        let ro = e.cstr(SCRATCH + 0x200, "/data/input.txt");
        assert_eq!(e.err("utimensat", &[AT_FDCWD, ro, 0, 0]), Errno::EROFS);
        e.poke(SCRATCH + 0x100, &[0xff; 32]);
        assert_eq!(
            e.err("utimensat", &[AT_FDCWD, p, SCRATCH + 0x100, 0]),
            Errno::EINVAL
        );
        assert_eq!(e.err("utimensat", &[AT_FDCWD, p, BAD, 0]), Errno::EFAULT);
        let (chown, fchown) = if wide {
            ("chown", "fchown")
        } else {
            ("chown32", "fchown32")
        };
        assert_eq!(e.ret(chown, &[p, 0, u32::MAX as u64]), 0);
        assert_eq!(e.err(chown, &[p, 1000, 1000]), Errno::EPERM);
        assert_eq!(e.err(chown, &[ro, 0, 0]), Errno::EROFS);
        assert_eq!(e.ret(fchown, &[fd, 0, 0]), 0);
        assert_eq!(e.err(chown, &[BAD, 0, 0]), Errno::EFAULT);
        assert_eq!(e.ret("fchownat", &[AT_FDCWD, p, 0, 0, 0x100]), 0);
    }
    let mut e = Env::new(Abi::I386);
    let p = e.cstr(SCRATCH, "/tmp");
    assert_eq!(e.ret("chown", &[p, 0xffff, 0]), 0, "16-bit -1 is unchanged");
    assert_eq!(e.err("chown", &[p, 5, 0]), Errno::EPERM);
}
