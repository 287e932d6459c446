//! Start-up call sequences as static musl and glibc programs make them,
//! in both ABIs.

use super::*;
use crate::sys::uapi::{Stat, Stat64, UserDesc};

#[test]
fn musl_x86_64_start_up_and_hello() {
    let mut e = Env::new(Abi::X86_64);
    // __init_tp: arch_prctl(ARCH_SET_FS, tp), set_tid_address.
    assert_eq!(e.ret("arch_prctl", &[0x1002, SCRATCH + 0x800]), 0);
    assert_eq!(e.m.fs_base, SCRATCH + 0x800);
    assert_eq!(e.t.fs_base, SCRATCH + 0x800);
    assert_eq!(e.ret("arch_prctl", &[0x1003, SCRATCH]), 0);
    assert_eq!(e.u64_at(SCRATCH), SCRATCH + 0x800);
    assert_eq!(e.ret("set_tid_address", &[SCRATCH + 0x900]), 7);
    // __init_libc in secure mode polls the standard fds.
    let mut pfds = Vec::new();
    for fd in 0..3i32 {
        pfds.extend_from_slice(&fd.to_le_bytes());
        pfds.extend_from_slice(&[0; 4]);
    }
    e.poke(SCRATCH, &pfds);
    assert_eq!(e.ret("poll", &[SCRATCH, 3, 0]), 0);
    assert!(
        e.peek(SCRATCH, 24)
            .chunks(8)
            .all(|p| p[6] == 0 && p[7] == 0)
    );
    // stdout: TIOCGWINSZ says "not a tty", so stdio buffers fully.
    assert_eq!(e.err("ioctl", &[1, 0x5413, SCRATCH]), Errno::ENOTTY);
    // malloc: brk(0), then grow by a page.
    let b = e.ret("brk", &[0]) as u64;
    assert_eq!(b, TEXT + 3 * 4096, "brk starts at the page after the image");
    assert_eq!(e.ret("brk", &[b + 4096]) as u64, b + 4096);
    e.poke(b, b"heap");
    assert_eq!(e.peek(b, 4), b"heap");
    // Large allocations: mmap anonymous.
    let m = e.ret("mmap", &[0, 1 << 20, 3, 0x22, u64::MAX, 0]) as u64;
    assert!(m < e.p.layout.mmap_base && m.is_multiple_of(4096));
    e.poke(m + (1 << 20) - 1, b"x");
    // printf -> writev(1, [buf, len], 2)
    e.poke(SCRATCH + 0x100, b"hello, ");
    e.poke(SCRATCH + 0x200, b"world\n");
    let mut iov = Vec::new();
    for (b, l) in [(SCRATCH + 0x100, 7u64), (SCRATCH + 0x200, 6)] {
        iov.extend_from_slice(&b.to_le_bytes());
        iov.extend_from_slice(&l.to_le_bytes());
    }
    e.poke(SCRATCH + 0x300, &iov);
    assert_eq!(e.ret("writev", &[1, SCRATCH + 0x300, 2]), 13);
    assert_eq!(e.stdout_lines(), ["hello, world"]);
    assert_eq!(e.call("exit_group", &[3]), Action::Exit(3));
    assert_eq!(e.sys.unknown.summary(), "none");
}

#[test]
fn glibc_x86_64_start_up() {
    let mut e = Env::new(Abi::X86_64);
    let b = e.ret("brk", &[0]) as u64;
    // CET probing: arch_prctl(ARCH_CET_STATUS) is EINVAL on Linux without CET.
    assert_eq!(e.err("arch_prctl", &[0x3001, SCRATCH]), Errno::EINVAL);
    assert_eq!(e.ret("brk", &[b + 0x21000]) as u64, b + 0x21000);
    assert_eq!(e.ret("arch_prctl", &[0x1002, b + 0x100]), 0);
    assert_eq!(e.ret("set_tid_address", &[b + 0x200]), 7);
    assert_eq!(e.ret("set_robust_list", &[b + 0x300, 24]), 0);
    assert_eq!(e.err("set_robust_list", &[b + 0x300, 12]), Errno::EINVAL);
    assert_eq!(
        e.err("rseq", &[b + 0x400, 32, 0, 0x53053053]),
        Errno::ENOSYS
    );
    assert_eq!(e.ret("prlimit64", &[0, 3, 0, SCRATCH]), 0);
    assert_eq!(e.u64_at(SCRATCH), 8 << 20);
    assert_eq!(e.u64_at(SCRATCH + 8), u64::MAX);
    let path = e.cstr(SCRATCH + 0x100, "/proc/self/exe");
    assert_eq!(e.ret("readlink", &[path, SCRATCH + 0x200, 4096]), 9);
    assert_eq!(e.peek(SCRATCH + 0x200, 9), b"/bin/prog");
    assert_eq!(e.ret("getrandom", &[SCRATCH + 0x300, 8, 1]), 8);
    assert_ne!(e.peek(SCRATCH + 0x300, 8), [0; 8]);
    assert_eq!(e.ret("mprotect", &[b, 4096, 1]), 0);
    assert_eq!(e.p.areas.find(b).unwrap().prot, Prot::READ);
    // fstat of stdout through newfstatat(1, "", AT_EMPTY_PATH).
    let empty = e.cstr(SCRATCH + 0x400, "");
    assert_eq!(e.ret("newfstatat", &[1, empty, SCRATCH + 0x500, 0x1000]), 0);
    let st = Stat::from_bytes(&e.peek(SCRATCH + 0x500, Stat::SIZE).try_into().unwrap());
    assert_eq!(
        st.st_mode & 0o170000,
        0o020000,
        "stdout is a character device"
    );
    e.poke(SCRATCH + 0x600, b"partial");
    assert_eq!(e.ret("write", &[1, SCRATCH + 0x600, 7]), 7);
    assert!(e.stdout_lines().is_empty());
    e.p.flush_output(&mut e.m);
    assert_eq!(
        e.m.console,
        [(Stream::Stdout, b"partial".to_vec(), LineEnd::Partial)]
    );
    assert_eq!(e.call("exit_group", &[0]), Action::Exit(0));
}

#[test]
fn musl_i386_start_up() {
    let mut e = Env::new(Abi::I386);
    // __set_thread_area: set_thread_area({-1, base, 0xfffff, 0x51}).
    let d = UserDesc {
        entry_number: u32::MAX,
        base_addr: 0x1000_0800,
        limit: 0xfffff,
        flags: 0x51,
    };
    e.poke(SCRATCH, &d.to_bytes());
    assert_eq!(e.ret("set_thread_area", &[SCRATCH]), 0);
    assert_eq!(e.u32_at(SCRATCH), 12);
    let tls = e.m.tls.expect("TLS installed")[0].expect("slot 12 used");
    assert_eq!(tls.base, 0x1000_0800);
    assert!(tls.seg_32bit && tls.limit_in_pages && tls.useable);
    assert_eq!(e.t.tls[0], Some(tls));
    // get_thread_area reads it back.
    e.poke(SCRATCH + 0x40, &12u32.to_le_bytes());
    assert_eq!(e.ret("get_thread_area", &[SCRATCH + 0x40]), 0);
    assert_eq!(
        UserDesc::from_bytes(&e.peek(SCRATCH + 0x40, 16).try_into().unwrap()),
        UserDesc {
            entry_number: 12,
            ..d
        }
    );
    assert_eq!(e.ret("set_tid_address", &[SCRATCH + 0x100]), 7);
    assert_eq!(e.err("ioctl", &[1, 0x5413, SCRATCH]), Errno::ENOTTY);
    let b = e.ret("brk", &[0]) as u64;
    assert_eq!(e.ret("brk", &[b + 8192]) as u64, b + 8192);
    // mmap2 anonymous stays below 4 GiB.
    let m = e.ret("mmap2", &[0, 0x10000, 3, 0x22, u32::MAX as u64, 0]) as u32 as u64;
    assert!((0x1_0000..0xffff_e000).contains(&m));
    assert!(e.p.areas.find(m).is_some());
    // writev with compat iovecs.
    e.poke(SCRATCH + 0x200, b"hi\nthere\n");
    let mut iov = Vec::new();
    for (b, l) in [(SCRATCH as u32 + 0x200, 3u32), (SCRATCH as u32 + 0x203, 6)] {
        iov.extend_from_slice(&b.to_le_bytes());
        iov.extend_from_slice(&l.to_le_bytes());
    }
    e.poke(SCRATCH + 0x300, &iov);
    assert_eq!(e.ret("writev", &[1, SCRATCH + 0x300, 2]), 9);
    assert_eq!(e.stdout_lines(), ["hi", "there"]);
    // clock_gettime64 writes a 64-bit timespec, clock_gettime a 32-bit one.
    assert_eq!(e.ret("clock_gettime64", &[0, SCRATCH + 0x400]), 0);
    assert!(e.u64_at(SCRATCH + 0x400) >= 1_700_000_000);
    e.poke(SCRATCH + 0x500, &[0xee; 16]);
    assert_eq!(e.ret("clock_gettime", &[1, SCRATCH + 0x500]), 0);
    assert_eq!(
        e.peek(SCRATCH + 0x508, 8),
        [0xee; 8],
        "only 8 bytes written"
    );
    assert_eq!(e.call("exit_group", &[0x101]), Action::Exit(1));
}

#[test]
fn glibc_i386_start_up() {
    let mut e = Env::new(Abi::I386);
    assert_eq!(e.ret("uname", &[SCRATCH]), 0);
    assert_eq!(&e.peek(SCRATCH, 6), b"Linux\0");
    assert_eq!(&e.peek(SCRATCH + 260, 5), b"i686\0");
    assert_eq!(&e.peek(SCRATCH + 65, 6), b"perch\0");
    let b = e.ret("brk", &[0]) as u64;
    assert!(b > TEXT);
    e.poke(
        SCRATCH + 0x400,
        &UserDesc {
            entry_number: u32::MAX,
            base_addr: 0x1000,
            limit: 0xfffff,
            flags: 0x51,
        }
        .to_bytes(),
    );
    assert_eq!(e.ret("set_thread_area", &[SCRATCH + 0x400]), 0);
    assert_eq!(
        e.ret("set_thread_area", &[SCRATCH + 0x400]),
        0,
        "entry 12 given back again is a rewrite"
    );
    // As Linux's tls_desc_okay: no 16-bit, code or not-present segments (a
    // return to user mode could not reload SS, CS or a data register from
    // them); the empty and the all-zero descriptor delete the slot.
    for (flags, what) in [(0x50, "16-bit"), (0x55, "code"), (0x71, "not present")] {
        e.poke(
            SCRATCH + 0x400,
            &UserDesc {
                entry_number: 12,
                base_addr: 0x1000,
                limit: 0xfffff,
                flags,
            }
            .to_bytes(),
        );
        assert_eq!(
            e.err("set_thread_area", &[SCRATCH + 0x400]),
            Errno::EINVAL,
            "a {what} TLS segment"
        );
    }
    for (limit, flags) in [(0, 0x28), (0, 0)] {
        e.poke(
            SCRATCH + 0x400,
            &UserDesc {
                entry_number: 12,
                base_addr: 0,
                limit,
                flags,
            }
            .to_bytes(),
        );
        assert_eq!(e.ret("set_thread_area", &[SCRATCH + 0x400]), 0);
    }
    // fstat64 of stdout and of an archive file, in the stat64 layout.
    assert_eq!(e.ret("fstat64", &[1, SCRATCH + 0x100]), 0);
    let st = Stat64::from_bytes(&e.peek(SCRATCH + 0x100, 96).try_into().unwrap());
    assert_eq!({ st.st_mode } & 0o170000, 0o020000);
    let path = e.cstr(SCRATCH + 0x200, "input.txt");
    assert_eq!(e.ret("stat64", &[path, SCRATCH + 0x100]), 0);
    let st = Stat64::from_bytes(&e.peek(SCRATCH + 0x100, 96).try_into().unwrap());
    assert_eq!({ st.st_size }, 18);
    assert_eq!({ st.st_mode }, 0o100644);
    assert_eq!({ st.st_ino }, { st.st_ino32 } as u64);
    // open, _llseek, read.
    let fd = e.ret("open", &[path, 0o100000, 0]) as u64;
    assert_eq!(fd, 3);
    assert_eq!(e.ret("_llseek", &[fd, 0, 5, SCRATCH + 0x300, 0]), 0);
    assert_eq!(e.u64_at(SCRATCH + 0x300), 5);
    assert_eq!(e.ret("read", &[fd, SCRATCH + 0x300, 100]), 13);
    assert_eq!(e.peek(SCRATCH + 0x300, 13), b"one\nline two\n");
    // A private file mapping of the executable with mmap2 (page offset 1).
    let exe = e.cstr(SCRATCH + 0x500, "/proc/self/exe");
    let fd = e.ret("open", &[exe, 0, 0]) as u64;
    let m = e.ret("mmap2", &[0, 4096, 1, 2, fd, 1]) as u32 as u64;
    assert_eq!(e.peek(m, 4), [0xaa; 4]);
    assert_eq!(e.ret("close", &[fd]), 0);
    assert_eq!(
        e.peek(m + 4095, 1),
        [0xaa],
        "the mapping outlives the descriptor"
    );
    assert_eq!(e.call("exit", &[0]), Action::Exit(0));
}

#[test]
fn rust_std_start_up_on_musl_both_abis() {
    for abi in [Abi::X86_64, Abi::I386] {
        let mut e = Env::new(abi);
        let wide = abi == Abi::X86_64;
        let mask = if wide { u64::MAX } else { 0xffff_ffff };
        // std::rt: poll the standard fds; none is POLLNVAL.
        let mut pfds = Vec::new();
        for fd in 0..3i32 {
            pfds.extend_from_slice(&fd.to_le_bytes());
            pfds.extend_from_slice(&[0; 4]);
        }
        e.poke(SCRATCH, &pfds);
        assert_eq!(e.ret("poll", &[SCRATCH, 3, 0]), 0);
        // Close stdin: the next poll reports POLLNVAL for it.
        assert_eq!(e.ret("close", &[0]), 0);
        assert_eq!(e.ret("poll", &[SCRATCH, 3, 0]), 1);
        assert_eq!(e.peek(SCRATCH + 6, 2), 0x20u16.to_le_bytes());
        let null = e.cstr(SCRATCH + 0x100, "/dev/null");
        assert_eq!(e.ret("open", &[null, 2, 0]), 0, "reopened on the lowest fd");
        // signal(SIGPIPE, SIG_IGN).
        let act: Vec<u8> = if wide {
            crate::sys::uapi::Sigaction64 {
                sa_handler: 1,
                sa_flags: 0x0400_0000,
                sa_restorer: TEXT,
                sa_mask: 0,
            }
            .to_bytes()
            .to_vec()
        } else {
            crate::sys::uapi::Sigaction32 {
                sa_handler: 1,
                sa_flags: 0x0400_0000,
                sa_restorer: TEXT as u32,
                sa_mask: 0,
            }
            .to_bytes()
            .to_vec()
        };
        e.poke(SCRATCH + 0x200, &act);
        assert_eq!(e.ret("rt_sigaction", &[13, SCRATCH + 0x200, 0, 8]), 0);
        assert_eq!(e.p.signals.actions[12].handler, 1);
        // musl's pthread_getattr_np on the main thread probes the stack
        // with mremap(p - l - PAGE, PAGE, 2 * PAGE, 0) until it is not ENOMEM.
        let top = e.p.layout.stack_top;
        let mut l = 4096;
        loop {
            match e.call("mremap", &[top - l - 4096, 4096, 8192, 0, 0]) {
                Action::Return(v) if (v & mask) == (Errno::ENOMEM.to_return() & mask) => l += 4096,
                Action::Return(v) => {
                    assert_eq!(v & mask, Errno::EFAULT.to_return() & mask);
                    break;
                }
                a => panic!("{a:?}"),
            }
        }
        assert_eq!(
            l,
            crate::sys::vma::STACK_SIZE,
            "the whole stack area was found"
        );
        // The stack-overflow handler: an alternate stack with a guard page.
        let mmap = if wide { "mmap" } else { "mmap2" };
        let alt = e.ret(mmap, &[0, 4096 + 16384, 3, 0x2_0022, u64::MAX, 0]) as u64 & mask;
        assert_eq!(e.ret("mprotect", &[alt, 4096, 0]), 0);
        assert_eq!(e.p.areas.find(alt).unwrap().prot, Prot::NONE);
        let ss: Vec<u8> = if wide {
            crate::sys::uapi::Stack64 {
                ss_sp: alt + 4096,
                ss_flags: 0,
                pad: 0,
                ss_size: 16384,
            }
            .to_bytes()
            .to_vec()
        } else {
            crate::sys::uapi::Stack32 {
                ss_sp: (alt + 4096) as u32,
                ss_flags: 0,
                ss_size: 16384,
            }
            .to_bytes()
            .to_vec()
        };
        e.poke(SCRATCH + 0x300, &ss);
        assert_eq!(e.ret("sigaltstack", &[0, SCRATCH + 0x400]), 0);
        assert_eq!(e.ret("sigaltstack", &[SCRATCH + 0x300, 0]), 0);
        assert_eq!(e.t.altstack.sp, alt + 4096);
        // available_parallelism, HashMap keys, Instant::now.
        assert!(e.ret("sched_getaffinity", &[0, 128, SCRATCH + 0x500]) > 0);
        assert_eq!(e.ret("getrandom", &[SCRATCH + 0x600, 16, 4]), 16);
        let clock = if wide {
            "clock_gettime"
        } else {
            "clock_gettime64"
        };
        assert_eq!(e.ret(clock, &[1, SCRATCH + 0x700]), 0);
        // std::fs::read of an archive file through statx and read.
        let p = e.cstr(SCRATCH + 0x800, "input.txt");
        let fd = e.ret("openat", &[-100i64 as u64, p, 0o2000000, 0]) as u64;
        let empty = e.cstr(SCRATCH + 0x900, "");
        assert_eq!(
            e.ret("statx", &[fd, empty, 0x1000, 0xfff, SCRATCH + 0xa00]),
            0
        );
        assert_eq!(e.u64_at(SCRATCH + 0xa00 + 40), 18);
        assert_eq!(e.ret("read", &[fd, SCRATCH + 0xb00, 18]), 18);
        assert_eq!(e.ret("read", &[fd, SCRATCH + 0xb00, 18]), 0);
        assert_eq!(e.call("exit_group", &[0]), Action::Exit(0));
        assert_eq!(e.sys.unknown.summary(), "none");
    }
}
