//! Every pointer argument of every implemented call, handed an unmapped
//! or a runtime (kernel-half) address, gives `EFAULT`; the same call with
//! a good pointer in that place does not (so the `EFAULT` really comes from
//! that pointer).

use super::*;

const PATH: u64 = SCRATCH; // "/data/input.txt"
const NEWPATH: u64 = SCRATCH + 0x40; // "/tmp/newfile"
const TS: u64 = SCRATCH + 0x80; // the ABI's timespec {0, 1000}
const TS64: u64 = SCRATCH + 0xa0; // a 64-bit timespec {0, 1000}
const IOV: u64 = SCRATCH + 0xc0; // the ABI's iovec {BUF, 16}
const IOV_BAD: u64 = SCRATCH + 0xe0; // an iovec {BAD, 16}
const PFD: u64 = SCRATCH + 0x100; // pollfd {1, POLLOUT}
const ACT: u64 = SCRATCH + 0x140; // a zeroed sigaction
const SET: u64 = SCRATCH + 0x180; // an empty sigset / zero word
const UDESC: u64 = SCRATCH + 0x1c0; // user_desc {-1, ...}
const UDESC12: u64 = SCRATCH + 0x1e0; // user_desc {12, ...}
const RLIM: u64 = SCRATCH + 0x200; // the ABI's rlimit {8 MiB, inf}
const RLIM64: u64 = SCRATCH + 0x220; // rlimit64 {8 MiB, inf}
const FUTEX: u64 = SCRATCH + 0x240; // 0u32
const MMAPARGS: u64 = SCRATCH + 0x280; // i386 mmap_arg_struct, anonymous
const SS: u64 = SCRATCH + 0x300; // the ABI's stack_t {BUF, 0, 8192}
const DIRPATH: u64 = SCRATCH + 0x340; // "/tmp/emptyd"
const EXE: u64 = SCRATCH + 0x380; // "/proc/self/exe"
const AFF: u64 = SCRATCH + 0x3c0; // CPU mask {1}
const WPATH: u64 = SCRATCH + 0x3e0; // "/tmp/w"
const TS0: u64 = SCRATCH + 0x400; // a zero timespec / timeval
const SSARG: u64 = SCRATCH + 0x420; // pselect6's {SET, 8}
const SELARGS: u64 = SCRATCH + 0x440; // i386 sel_arg_struct {2, SET, 0, 0, TS0}
const BUF: u64 = SCRATCH + 0x1000;
const X: u64 = 0xbad0_bad0; // placeholder for the pointer under test

fn setup(abi: Abi) -> Env {
    let mut e = Env::new(abi);
    let wide = abi == Abi::X86_64;
    e.cstr(PATH, "/data/input.txt");
    e.cstr(NEWPATH, "/tmp/newfile");
    e.cstr(DIRPATH, "/tmp/emptyd");
    e.cstr(EXE, "/proc/self/exe");
    e.cstr(WPATH, "/tmp/w");
    let word = |v: u64| {
        if wide {
            v.to_le_bytes().to_vec()
        } else {
            (v as u32).to_le_bytes().to_vec()
        }
    };
    e.poke(TS, &[word(0), word(1000)].concat());
    e.poke(TS64, &[0u64.to_le_bytes(), 1000u64.to_le_bytes()].concat());
    e.poke(IOV, &[word(BUF), word(16)].concat());
    e.poke(IOV_BAD, &[word(BAD), word(16)].concat());
    e.poke(
        PFD,
        &[
            1i32.to_le_bytes().to_vec(),
            4u16.to_le_bytes().to_vec(),
            vec![0, 0],
        ]
        .concat(),
    );
    e.poke(
        UDESC,
        &[u32::MAX, 0x1000, 0xfffff, 0x51]
            .map(u32::to_le_bytes)
            .concat(),
    );
    e.poke(
        UDESC12,
        &[12u32, 0x1000, 0xfffff, 0x51]
            .map(u32::to_le_bytes)
            .concat(),
    );
    e.poke(
        RLIM,
        &[
            word(8 << 20),
            word(if wide { u64::MAX } else { u32::MAX as u64 }),
        ]
        .concat(),
    );
    e.poke(
        RLIM64,
        &[(8u64 << 20).to_le_bytes(), u64::MAX.to_le_bytes()].concat(),
    );
    e.poke(
        MMAPARGS,
        &[0u32, 4096, 3, 0x22, u32::MAX, 0]
            .map(u32::to_le_bytes)
            .concat(),
    );
    if wide {
        e.poke(
            SS,
            &[BUF.to_le_bytes(), 0u64.to_le_bytes(), 8192u64.to_le_bytes()].concat(),
        );
    } else {
        e.poke(SS, &[BUF as u32, 0, 8192].map(u32::to_le_bytes).concat());
    }
    e.poke(AFF, &[1]);
    e.poke(TS0, &[0; 16]);
    e.poke(
        SELARGS,
        &[2, SET as u32, 0, 0, TS0 as u32]
            .map(u32::to_le_bytes)
            .concat(),
    );
    e.poke(SSARG, &[word(SET), word(8)].concat());
    // fd 3: the archive file; fd 4: a writable memory file; fd 5: /tmp.
    assert_eq!(e.ret("open", &[PATH, 0, 0]), 3);
    assert_eq!(e.ret("open", &[WPATH, 0o102, 0o644]), 4);
    e.poke(BUF, b"0123456789abcdef");
    assert_eq!(e.ret("write", &[4, BUF, 16]), 16);
    let tmp = e.cstr(SCRATCH + 0x800, "/tmp");
    assert_eq!(e.ret("open", &[tmp, 0o200000, 0]), 5);
    assert_eq!(e.ret("mkdir", &[DIRPATH, 0o755]), 0);
    e
}

/// (call, arguments, index of the pointer under test, good value, bad
/// value (0 = the unmapped and the kernel address)).
type Case = (&'static str, [u64; 6], usize, u64, u64);

fn case(name: &'static str, args: &[u64], good: u64) -> Case {
    let mut a = [0u64; 6];
    a[..args.len()].copy_from_slice(args);
    let i = args.iter().position(|&v| v == X).expect("a placeholder");
    (name, a, i, good, 0)
}

fn common_cases() -> Vec<Case> {
    vec![
        case("read", &[3, X, 10], BUF),
        case("write", &[4, X, 10], BUF),
        case("readv", &[3, X, 1], IOV),
        ("readv", [3, X, 1, 0, 0, 0], 1, IOV, IOV_BAD),
        case("writev", &[4, X, 1], IOV),
        ("writev", [4, X, 1, 0, 0, 0], 1, IOV, IOV_BAD),
        case("pread64", &[3, X, 10, 0], BUF),
        case("pwrite64", &[4, X, 10, 0], BUF),
        case("preadv", &[3, X, 1, 0], IOV),
        ("preadv", [3, X, 1, 0, 0, 0], 1, IOV, IOV_BAD),
        case("pwritev", &[4, X, 1, 0], IOV),
        case("open", &[X, 0, 0], PATH),
        case("openat", &[AT_FDCWD, X, 0, 0], PATH),
        case("creat", &[X, 0o644], NEWPATH),
        case("newfstatat_or_fstatat64", &[AT_FDCWD, X, BUF, 0], PATH),
        case("newfstatat_or_fstatat64", &[AT_FDCWD, PATH, X, 0], BUF),
        case("statx", &[AT_FDCWD, X, 0, 0x7ff, BUF], PATH),
        case("statx", &[AT_FDCWD, PATH, 0, 0x7ff, X], BUF),
        case("stat", &[X, BUF], PATH),
        case("stat", &[PATH, X], BUF),
        case("lstat", &[X, BUF], PATH),
        case("lstat", &[PATH, X], BUF),
        case("fstat", &[3, X], BUF),
        case("getdents64", &[5, X, 4096], BUF),
        case("ioctl", &[3, 0x5421, X], SET),
        case("fcntl_or_fcntl64", &[3, 5, X], SET),
        case("fcntl_or_fcntl64", &[3, 6, X], SET),
        case("poll", &[X, 1, 0], PFD),
        case("ppoll", &[X, 1, TS, 0, 8], PFD),
        case("ppoll", &[PFD, 1, X, 0, 8], TS),
        case("ppoll", &[PFD, 1, TS, X, 8], SET),
        case("select_or_newselect", &[2, X, 0, 0, 0], SET),
        case("select_or_newselect", &[2, 0, X, 0, 0], SET),
        case("select_or_newselect", &[2, 0, 0, X, 0], SET),
        case("select_or_newselect", &[2, SET, 0, 0, X], TS0),
        case("pselect6", &[2, X, 0, 0, 0, 0], SET),
        case("pselect6", &[2, SET, 0, 0, X, 0], TS0),
        case("pselect6", &[2, SET, 0, 0, TS0, X], SSARG),
        case("utimensat", &[AT_FDCWD, X, 0, 0], WPATH),
        case("utimensat", &[AT_FDCWD, WPATH, X, 0], TS0),
        case("fchownat", &[AT_FDCWD, X, 0, 0, 0], WPATH),
        case("pipe", &[X], BUF),
        case("pipe2", &[X, 0], BUF),
        case("access", &[X, 0], PATH),
        case("faccessat", &[AT_FDCWD, X, 0], PATH),
        case("faccessat2", &[AT_FDCWD, X, 0, 0], PATH),
        case("readlink", &[X, BUF, 100], EXE),
        case("readlink", &[EXE, X, 100], BUF),
        case("readlinkat", &[AT_FDCWD, EXE, X, 100], BUF),
        case("readlinkat", &[AT_FDCWD, X, BUF, 100], EXE),
        case("getcwd", &[X, 100], BUF),
        case("chdir", &[X], DIRPATH),
        case("mkdir", &[X, 0o755], NEWPATH),
        case("mkdirat", &[AT_FDCWD, X, 0o755], NEWPATH),
        case("unlink", &[X], WPATH),
        case("unlinkat", &[AT_FDCWD, X, 0], WPATH),
        case("rmdir", &[X], DIRPATH),
        case("rename", &[X, NEWPATH], WPATH),
        case("rename", &[WPATH, X], NEWPATH),
        case("renameat", &[AT_FDCWD, X, AT_FDCWD, NEWPATH], WPATH),
        case("renameat2", &[AT_FDCWD, WPATH, AT_FDCWD, X, 0], NEWPATH),
        case("truncate", &[X, 0], WPATH),
        case("chmod", &[X, 0o600], WPATH),
        case("fchmodat", &[AT_FDCWD, X, 0o600], WPATH),
        case("uname", &[X], BUF),
        case("get_robust_list", &[0, X, BUF], BUF),
        case("get_robust_list", &[0, BUF, X], BUF),
        case("prlimit64", &[0, 3, X, 0], RLIM64),
        case("prlimit64", &[0, 3, 0, X], BUF),
        case("setrlimit", &[3, X], RLIM),
        case("sysinfo", &[X], BUF),
        case("prctl", &[15, X], PATH),
        case("prctl", &[16, X], BUF),
        case("getrusage", &[0, X], BUF),
        case("times", &[X], BUF),
        case("getcpu", &[X, 0, 0], BUF),
        case("getcpu", &[0, X, 0], BUF),
        case("sched_getparam", &[0, X], BUF),
        case("rt_sigaction", &[10, X, 0, 8], ACT),
        case("rt_sigaction", &[10, 0, X, 8], BUF),
        case("rt_sigprocmask", &[0, X, 0, 8], SET),
        case("rt_sigprocmask", &[0, 0, X, 8], BUF),
        case("sigaltstack", &[X, 0], SS),
        case("sigaltstack", &[0, X], BUF),
        case("nanosleep", &[X, 0], TS),
        case("clock_nanosleep", &[1, 0, X, 0], TS),
        case("clock_gettime", &[1, X], BUF),
        case("clock_getres", &[1, X], BUF),
        case("gettimeofday", &[X, 0], BUF),
        case("gettimeofday", &[0, X], BUF),
        case("time", &[X], BUF),
        case("getrandom", &[X, 8, 0], BUF),
        case("futex", &[X, 128, 1, 0], FUTEX),
        case("futex", &[FUTEX, 128, 0, X], TS),
        case("futex", &[FUTEX, 128 | 5, 1, 0, X, 0], FUTEX),
        case("sched_getaffinity", &[0, 8, X], BUF),
        case("sched_setaffinity", &[0, 8, X], AFF),
    ]
}

fn x86_64_cases() -> Vec<Case> {
    vec![
        case("arch_prctl", &[0x1003, X], BUF),
        case("chown", &[X, 0, 0], WPATH),
        case("lchown", &[X, 0, 0], WPATH),
        case("getresuid", &[X, BUF, BUF], BUF),
        case("getresgid", &[BUF, BUF, X], BUF),
        case("getrlimit", &[3, X], BUF),
    ]
}

fn i386_cases() -> Vec<Case> {
    vec![
        case("_llseek", &[3, 0, 0, X, 0], BUF),
        case("chown32", &[X, 0, 0], WPATH),
        case("chown", &[X, 0, 0], WPATH),
        case("utimensat_time64", &[AT_FDCWD, WPATH, X, 0], TS0),
        case("stat64", &[X, BUF], PATH),
        case("stat64", &[PATH, X], BUF),
        case("lstat64", &[X, BUF], PATH),
        case("lstat64", &[PATH, X], BUF),
        case("fstat64", &[3, X], BUF),
        case("mmap", &[X], MMAPARGS),
        case("set_thread_area", &[X], UDESC),
        case("get_thread_area", &[X], UDESC12),
        case("clock_gettime64", &[1, X], BUF),
        case("clock_getres_time64", &[1, X], BUF),
        case("clock_nanosleep_time64", &[1, 0, X, 0], TS64),
        case("ppoll_time64", &[PFD, 1, X, 0, 8], TS64),
        case("futex_time64", &[FUTEX, 128, 0, X], TS64),
        case("ugetrlimit", &[3, X], BUF),
        case("getrlimit", &[3, X], BUF),
        case("getresuid32", &[X, BUF, BUF], BUF),
        case("getresuid", &[BUF, X, BUF], BUF),
        case("truncate64", &[X, 0, 0], WPATH),
    ]
}

fn run(abi: Abi, cases: Vec<Case>) -> usize {
    let kernel = match abi {
        Abi::X86_64 => 0xffff_8000_0000_1000,
        Abi::I386 => 0xffff_f000,
    };
    let mut checked = 0;
    for (name, args, i, good, bad) in cases {
        let name = match (name, abi) {
            ("newfstatat_or_fstatat64", Abi::X86_64) => "newfstatat",
            ("newfstatat_or_fstatat64", Abi::I386) => "fstatat64",
            ("select_or_newselect", Abi::X86_64) => "select",
            ("fcntl_or_fcntl64", Abi::X86_64) => "fcntl",
            ("fcntl_or_fcntl64", Abi::I386) => "fcntl64",
            ("select_or_newselect", Abi::I386) => "_newselect",
            (n, _) => n,
        };
        let efault = Action::Return(Errno::EFAULT.to_return());
        let mut a = args;
        a[i] = good;
        let mut e = setup(abi);
        let r = e.call(name, &a);
        assert_ne!(r, efault, "{abi:?} {name}{a:x?} with a good pointer");
        let bads: Vec<u64> = if bad == 0 {
            vec![BAD, kernel, u64::MAX - 7]
        } else {
            vec![bad]
        };
        for b in bads {
            let mut a = args;
            a[i] = b;
            let mut e = setup(abi);
            let r = e.call(name, &a);
            assert_eq!(r, efault, "{abi:?} {name}{a:x?}: pointer argument {i}");
            checked += 1;
        }
    }
    checked
}

#[test]
fn every_pointer_argument_faults_cleanly_x86_64() {
    let mut cases = common_cases();
    cases.extend(x86_64_cases());
    assert!(run(Abi::X86_64, cases) > 200);
}

#[test]
fn every_pointer_argument_faults_cleanly_i386() {
    let mut cases: Vec<Case> = common_cases()
        .into_iter()
        .filter(|c| !matches!(c.0, "stat" | "lstat" | "fstat"))
        .collect();
    cases.extend(i386_cases());
    // The i386 stat/lstat/fstat (106-108) use the old struct stat.
    cases.push(case("fstat", &[3, X], BUF));
    cases.push(case("stat", &[PATH, X], BUF));
    cases.push(case("stat", &[X, BUF], PATH));
    cases.push(case("lstat", &[PATH, X], BUF));
    cases.push(case("lstat", &[X, BUF], PATH));
    cases.push(case("pselect6_time64", &[2, SET, 0, 0, X, 0], TS64));
    cases.push(case("select", &[X], SELARGS));
    assert!(run(Abi::I386, cases) > 200);
}
