//! The system-call tables: one per ABI, mapping a number to a named
//! handler ([`Sys`]), and the names of every number of both ABIs so that
//! an unimplemented call is reported by name.
//!
//! The same [`Sys`] serves both ABIs where the semantics match; argument
//! decoding stays per ABI in the handlers. Numbers whose call only exists
//! in one width (`_llseek`, `mmap2`, `stat64`, the i386 `*_time64` calls)
//! have their own variants.

use super::Abi;
use super::names::{I386_NAMES, X86_64_NAMES};

/// A system-call handler, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)] // Each variant is the Linux call of the same name.
pub enum Sys {
    Socket,
    Socketpair,
    Bind,
    Connect,
    Listen,
    Accept,
    Accept4,
    Getsockname,
    Getpeername,
    Sendto,
    Recvfrom,
    Sendmsg,
    Recvmsg,
    Sendmmsg,
    Recvmmsg,
    Shutdown,
    Setsockopt,
    Getsockopt,
    Socketcall,
    Access,
    ArchPrctl,
    Brk,
    Chdir,
    Chmod,
    ClockGetres,
    ClockGetres64,
    ClockGettime,
    ClockGettime64,
    ClockNanosleep,
    ClockNanosleep64,
    Close,
    CopyFileRange,
    Creat,
    Dup,
    Dup2,
    Dup3,
    EpollCreate,
    EpollCreate1,
    EpollCtl,
    EpollPwait,
    EpollPwait2,
    EpollWait,
    Eventfd,
    Eventfd2,
    Exit,
    Clone,
    Clone3,
    Alarm,
    Setitimer,
    Getitimer,
    Pause,
    RtSigsuspend,
    RtSigtimedwait,
    RtSigtimedwait64,
    ExitGroup,
    Faccessat,
    Faccessat2,
    Fchdir,
    Fchmod,
    Fchmodat,
    Fcntl,
    Fstat,
    Fstat32,
    Fstat64,
    Fstatat64,
    Fsync,
    Ftruncate,
    Ftruncate64,
    Futex,
    Futex64,
    GetRobustList,
    GetThreadArea,
    Getcpu,
    Getcwd,
    Getdents64,
    Getgroups,
    Getid,
    Getpgid,
    Getpgrp,
    Getpid,
    Getppid,
    Getpriority,
    Getrandom,
    Getresid,
    Getrlimit,
    Getrusage,
    Getsid,
    Gettid,
    Gettimeofday,
    Ioctl,
    IoprioGet,
    IoprioSet,
    Kill,
    Llseek,
    Lseek,
    Lstat,
    Lstat32,
    Lstat64,
    Madvise,
    Membarrier,
    Mkdir,
    Mkdirat,
    Mmap,
    Mmap2,
    Mprotect,
    Mremap,
    Msync,
    Munmap,
    Nanosleep,
    Newfstatat,
    OldGetrlimit,
    OldMmap,
    Open,
    Openat,
    Poll,
    Ppoll,
    Ppoll64,
    Select,
    Sendfile,
    Sendfile64,
    Utimensat,
    Utimensat64,
    Chown,
    Lchown,
    Fchown,
    Fchownat,
    Chown16,
    Lchown16,
    Fchown16,
    Pipe,
    Pipe2,
    OldSelect,
    Pselect6,
    Pselect6Time64,
    Prctl,
    Pread64,
    Preadv,
    Prlimit64,
    Pwrite64,
    Pwritev,
    Read,
    Readlink,
    Readlinkat,
    Readv,
    Rename,
    Renameat,
    Renameat2,
    Rmdir,
    Rseq,
    RtSigaction,
    RtSigprocmask,
    RtSigreturn,
    SchedGetaffinity,
    SchedGetparam,
    SchedGetscheduler,
    SchedSetaffinity,
    SchedYield,
    SetRobustList,
    SetThreadArea,
    SetTidAddress,
    Setpgid,
    Setpriority,
    Setsid,
    Fork,
    Execve,
    Execveat,
    Vfork,
    Wait4,
    Waitpid,
    Waitid,
    Setrlimit,
    Sigaltstack,
    Sigreturn,
    Stat,
    Stat32,
    Stat64,
    Statx,
    Sysinfo,
    Tgkill,
    Time,
    Times,
    Tkill,
    Truncate,
    Truncate64,
    Umask,
    Uname,
    Unlink,
    Unlinkat,
    Write,
    Writev,
}

pub(crate) const X86_64_TABLE: &[(u16, Sys)] = &[
    (41, Sys::Socket),             // socket
    (42, Sys::Connect),            // connect
    (43, Sys::Accept),             // accept
    (44, Sys::Sendto),             // sendto
    (45, Sys::Recvfrom),           // recvfrom
    (46, Sys::Sendmsg),            // sendmsg
    (47, Sys::Recvmsg),            // recvmsg
    (48, Sys::Shutdown),           // shutdown
    (49, Sys::Bind),               // bind
    (50, Sys::Listen),             // listen
    (51, Sys::Getsockname),        // getsockname
    (52, Sys::Getpeername),        // getpeername
    (53, Sys::Socketpair),         // socketpair
    (54, Sys::Setsockopt),         // setsockopt
    (55, Sys::Getsockopt),         // getsockopt
    (288, Sys::Accept4),           // accept4
    (299, Sys::Recvmmsg),          // recvmmsg
    (307, Sys::Sendmmsg),          // sendmmsg
    (0, Sys::Read),                // read
    (1, Sys::Write),               // write
    (2, Sys::Open),                // open
    (3, Sys::Close),               // close
    (4, Sys::Stat),                // stat
    (5, Sys::Fstat),               // fstat
    (6, Sys::Lstat),               // lstat
    (7, Sys::Poll),                // poll
    (8, Sys::Lseek),               // lseek
    (9, Sys::Mmap),                // mmap
    (10, Sys::Mprotect),           // mprotect
    (11, Sys::Munmap),             // munmap
    (12, Sys::Brk),                // brk
    (13, Sys::RtSigaction),        // rt_sigaction
    (14, Sys::RtSigprocmask),      // rt_sigprocmask
    (15, Sys::RtSigreturn),        // rt_sigreturn
    (16, Sys::Ioctl),              // ioctl
    (17, Sys::Pread64),            // pread64
    (18, Sys::Pwrite64),           // pwrite64
    (19, Sys::Readv),              // readv
    (20, Sys::Writev),             // writev
    (21, Sys::Access),             // access
    (22, Sys::Pipe),               // pipe
    (23, Sys::Select),             // select
    (24, Sys::SchedYield),         // sched_yield
    (25, Sys::Mremap),             // mremap
    (26, Sys::Msync),              // msync
    (28, Sys::Madvise),            // madvise
    (32, Sys::Dup),                // dup
    (33, Sys::Dup2),               // dup2
    (34, Sys::Pause),              // pause
    (35, Sys::Nanosleep),          // nanosleep
    (36, Sys::Getitimer),          // getitimer
    (37, Sys::Alarm),              // alarm
    (38, Sys::Setitimer),          // setitimer
    (39, Sys::Getpid),             // getpid
    (40, Sys::Sendfile),           // sendfile
    (56, Sys::Clone),              // clone
    (60, Sys::Exit),               // exit
    (57, Sys::Fork),               // fork
    (59, Sys::Execve),             // execve
    (58, Sys::Vfork),              // vfork
    (61, Sys::Wait4),              // wait4
    (62, Sys::Kill),               // kill
    (112, Sys::Setsid),            // setsid
    (247, Sys::Waitid),            // waitid
    (63, Sys::Uname),              // uname
    (72, Sys::Fcntl),              // fcntl
    (74, Sys::Fsync),              // fsync
    (75, Sys::Fsync),              // fdatasync
    (76, Sys::Truncate),           // truncate
    (77, Sys::Ftruncate),          // ftruncate
    (79, Sys::Getcwd),             // getcwd
    (80, Sys::Chdir),              // chdir
    (81, Sys::Fchdir),             // fchdir
    (82, Sys::Rename),             // rename
    (83, Sys::Mkdir),              // mkdir
    (84, Sys::Rmdir),              // rmdir
    (85, Sys::Creat),              // creat
    (87, Sys::Unlink),             // unlink
    (89, Sys::Readlink),           // readlink
    (90, Sys::Chmod),              // chmod
    (91, Sys::Fchmod),             // fchmod
    (92, Sys::Chown),              // chown
    (93, Sys::Fchown),             // fchown
    (94, Sys::Lchown),             // lchown
    (95, Sys::Umask),              // umask
    (96, Sys::Gettimeofday),       // gettimeofday
    (97, Sys::Getrlimit),          // getrlimit
    (98, Sys::Getrusage),          // getrusage
    (99, Sys::Sysinfo),            // sysinfo
    (100, Sys::Times),             // times
    (102, Sys::Getid),             // getuid
    (104, Sys::Getid),             // getgid
    (107, Sys::Getid),             // geteuid
    (108, Sys::Getid),             // getegid
    (109, Sys::Setpgid),           // setpgid
    (110, Sys::Getppid),           // getppid
    (111, Sys::Getpgrp),           // getpgrp
    (115, Sys::Getgroups),         // getgroups
    (118, Sys::Getresid),          // getresuid
    (120, Sys::Getresid),          // getresgid
    (121, Sys::Getpgid),           // getpgid
    (124, Sys::Getsid),            // getsid
    (128, Sys::RtSigtimedwait),    // rt_sigtimedwait
    (130, Sys::RtSigsuspend),      // rt_sigsuspend
    (131, Sys::Sigaltstack),       // sigaltstack
    (140, Sys::Getpriority),       // getpriority
    (141, Sys::Setpriority),       // setpriority
    (143, Sys::SchedGetparam),     // sched_getparam
    (145, Sys::SchedGetscheduler), // sched_getscheduler
    (157, Sys::Prctl),             // prctl
    (158, Sys::ArchPrctl),         // arch_prctl
    (160, Sys::Setrlimit),         // setrlimit
    (186, Sys::Gettid),            // gettid
    (200, Sys::Tkill),             // tkill
    (201, Sys::Time),              // time
    (202, Sys::Futex),             // futex
    (203, Sys::SchedSetaffinity),  // sched_setaffinity
    (204, Sys::SchedGetaffinity),  // sched_getaffinity
    (213, Sys::EpollCreate),       // epoll_create
    (217, Sys::Getdents64),        // getdents64
    (218, Sys::SetTidAddress),     // set_tid_address
    (228, Sys::ClockGettime),      // clock_gettime
    (229, Sys::ClockGetres),       // clock_getres
    (230, Sys::ClockNanosleep),    // clock_nanosleep
    (231, Sys::ExitGroup),         // exit_group
    (232, Sys::EpollWait),         // epoll_wait
    (233, Sys::EpollCtl),          // epoll_ctl
    (234, Sys::Tgkill),            // tgkill
    (251, Sys::IoprioSet),         // ioprio_set
    (252, Sys::IoprioGet),         // ioprio_get
    (257, Sys::Openat),            // openat
    (258, Sys::Mkdirat),           // mkdirat
    (260, Sys::Fchownat),          // fchownat
    (262, Sys::Newfstatat),        // newfstatat
    (263, Sys::Unlinkat),          // unlinkat
    (264, Sys::Renameat),          // renameat
    (267, Sys::Readlinkat),        // readlinkat
    (268, Sys::Fchmodat),          // fchmodat
    (269, Sys::Faccessat),         // faccessat
    (270, Sys::Pselect6),          // pselect6
    (271, Sys::Ppoll),             // ppoll
    (273, Sys::SetRobustList),     // set_robust_list
    (274, Sys::GetRobustList),     // get_robust_list
    (280, Sys::Utimensat),         // utimensat
    (281, Sys::EpollPwait),        // epoll_pwait
    (284, Sys::Eventfd),           // eventfd
    (290, Sys::Eventfd2),          // eventfd2
    (291, Sys::EpollCreate1),      // epoll_create1
    (292, Sys::Dup3),              // dup3
    (293, Sys::Pipe2),             // pipe2
    (295, Sys::Preadv),            // preadv
    (296, Sys::Pwritev),           // pwritev
    (302, Sys::Prlimit64),         // prlimit64
    (309, Sys::Getcpu),            // getcpu
    (316, Sys::Renameat2),         // renameat2
    (318, Sys::Getrandom),         // getrandom
    (322, Sys::Execveat),          // execveat
    (324, Sys::Membarrier),        // membarrier
    (326, Sys::CopyFileRange),     // copy_file_range
    (332, Sys::Statx),             // statx
    (334, Sys::Rseq),              // rseq
    (435, Sys::Clone3),            // clone3
    (439, Sys::Faccessat2),        // faccessat2
    (441, Sys::EpollPwait2),       // epoll_pwait2
];

pub(crate) const I386_TABLE: &[(u16, Sys)] = &[
    (102, Sys::Socketcall),        // socketcall
    (337, Sys::Recvmmsg),          // recvmmsg
    (345, Sys::Sendmmsg),          // sendmmsg
    (358, Sys::Execveat),          // execveat
    (359, Sys::Socket),            // socket
    (360, Sys::Socketpair),        // socketpair
    (361, Sys::Bind),              // bind
    (362, Sys::Connect),           // connect
    (363, Sys::Listen),            // listen
    (364, Sys::Accept4),           // accept4
    (365, Sys::Getsockopt),        // getsockopt
    (366, Sys::Setsockopt),        // setsockopt
    (367, Sys::Getsockname),       // getsockname
    (368, Sys::Getpeername),       // getpeername
    (369, Sys::Sendto),            // sendto
    (370, Sys::Sendmsg),           // sendmsg
    (371, Sys::Recvfrom),          // recvfrom
    (372, Sys::Recvmsg),           // recvmsg
    (373, Sys::Shutdown),          // shutdown
    (417, Sys::Recvmmsg),          // recvmmsg_time64
    (1, Sys::Exit),                // exit
    (3, Sys::Read),                // read
    (4, Sys::Write),               // write
    (5, Sys::Open),                // open
    (6, Sys::Close),               // close
    (8, Sys::Creat),               // creat
    (10, Sys::Unlink),             // unlink
    (12, Sys::Chdir),              // chdir
    (13, Sys::Time),               // time
    (15, Sys::Chmod),              // chmod
    (16, Sys::Lchown16),           // lchown
    (19, Sys::Lseek),              // lseek
    (20, Sys::Getpid),             // getpid
    (24, Sys::Getid),              // getuid
    (27, Sys::Alarm),              // alarm
    (29, Sys::Pause),              // pause
    (33, Sys::Access),             // access
    (37, Sys::Kill),               // kill
    (38, Sys::Rename),             // rename
    (39, Sys::Mkdir),              // mkdir
    (40, Sys::Rmdir),              // rmdir
    (41, Sys::Dup),                // dup
    (42, Sys::Pipe),               // pipe
    (43, Sys::Times),              // times
    (45, Sys::Brk),                // brk
    (47, Sys::Getid),              // getgid
    (49, Sys::Getid),              // geteuid
    (50, Sys::Getid),              // getegid
    (54, Sys::Ioctl),              // ioctl
    (55, Sys::Fcntl),              // fcntl
    (57, Sys::Setpgid),            // setpgid
    (60, Sys::Umask),              // umask
    (63, Sys::Dup2),               // dup2
    (64, Sys::Getppid),            // getppid
    (2, Sys::Fork),                // fork
    (11, Sys::Execve),             // execve
    (190, Sys::Vfork),             // vfork
    (7, Sys::Waitpid),             // waitpid
    (114, Sys::Wait4),             // wait4
    (66, Sys::Setsid),             // setsid
    (284, Sys::Waitid),            // waitid
    (65, Sys::Getpgrp),            // getpgrp
    (75, Sys::Setrlimit),          // setrlimit
    (76, Sys::OldGetrlimit),       // getrlimit
    (77, Sys::Getrusage),          // getrusage
    (78, Sys::Gettimeofday),       // gettimeofday
    (80, Sys::Getgroups),          // getgroups
    (82, Sys::OldSelect),          // select
    (85, Sys::Readlink),           // readlink
    (90, Sys::OldMmap),            // mmap
    (91, Sys::Munmap),             // munmap
    (92, Sys::Truncate),           // truncate
    (93, Sys::Ftruncate),          // ftruncate
    (94, Sys::Fchmod),             // fchmod
    (95, Sys::Fchown16),           // fchown
    (96, Sys::Getpriority),        // getpriority
    (97, Sys::Setpriority),        // setpriority
    (104, Sys::Setitimer),         // setitimer
    (105, Sys::Getitimer),         // getitimer
    (106, Sys::Stat32),            // stat
    (107, Sys::Lstat32),           // lstat
    (108, Sys::Fstat32),           // fstat
    (116, Sys::Sysinfo),           // sysinfo
    (118, Sys::Fsync),             // fsync
    (119, Sys::Sigreturn),         // sigreturn
    (120, Sys::Clone),             // clone
    (122, Sys::Uname),             // uname
    (125, Sys::Mprotect),          // mprotect
    (132, Sys::Getpgid),           // getpgid
    (133, Sys::Fchdir),            // fchdir
    (140, Sys::Llseek),            // _llseek
    (142, Sys::Select),            // _newselect
    (144, Sys::Msync),             // msync
    (145, Sys::Readv),             // readv
    (146, Sys::Writev),            // writev
    (147, Sys::Getsid),            // getsid
    (148, Sys::Fsync),             // fdatasync
    (155, Sys::SchedGetparam),     // sched_getparam
    (157, Sys::SchedGetscheduler), // sched_getscheduler
    (158, Sys::SchedYield),        // sched_yield
    (162, Sys::Nanosleep),         // nanosleep
    (163, Sys::Mremap),            // mremap
    (165, Sys::Getresid),          // getresuid
    (168, Sys::Poll),              // poll
    (171, Sys::Getresid),          // getresgid
    (172, Sys::Prctl),             // prctl
    (173, Sys::RtSigreturn),       // rt_sigreturn
    (174, Sys::RtSigaction),       // rt_sigaction
    (175, Sys::RtSigprocmask),     // rt_sigprocmask
    (177, Sys::RtSigtimedwait),    // rt_sigtimedwait
    (179, Sys::RtSigsuspend),      // rt_sigsuspend
    (180, Sys::Pread64),           // pread64
    (181, Sys::Pwrite64),          // pwrite64
    (182, Sys::Chown16),           // chown
    (183, Sys::Getcwd),            // getcwd
    (186, Sys::Sigaltstack),       // sigaltstack
    (187, Sys::Sendfile),          // sendfile
    (191, Sys::Getrlimit),         // ugetrlimit
    (192, Sys::Mmap2),             // mmap2
    (193, Sys::Truncate64),        // truncate64
    (194, Sys::Ftruncate64),       // ftruncate64
    (195, Sys::Stat64),            // stat64
    (196, Sys::Lstat64),           // lstat64
    (197, Sys::Fstat64),           // fstat64
    (198, Sys::Lchown),            // lchown32
    (199, Sys::Getid),             // getuid32
    (200, Sys::Getid),             // getgid32
    (201, Sys::Getid),             // geteuid32
    (202, Sys::Getid),             // getegid32
    (205, Sys::Getgroups),         // getgroups32
    (207, Sys::Fchown),            // fchown32
    (209, Sys::Getresid),          // getresuid32
    (211, Sys::Getresid),          // getresgid32
    (212, Sys::Chown),             // chown32
    (219, Sys::Madvise),           // madvise
    (220, Sys::Getdents64),        // getdents64
    (221, Sys::Fcntl),             // fcntl64
    (224, Sys::Gettid),            // gettid
    (238, Sys::Tkill),             // tkill
    (239, Sys::Sendfile64),        // sendfile64
    (240, Sys::Futex),             // futex
    (241, Sys::SchedSetaffinity),  // sched_setaffinity
    (242, Sys::SchedGetaffinity),  // sched_getaffinity
    (243, Sys::SetThreadArea),     // set_thread_area
    (244, Sys::GetThreadArea),     // get_thread_area
    (252, Sys::ExitGroup),         // exit_group
    (254, Sys::EpollCreate),       // epoll_create
    (255, Sys::EpollCtl),          // epoll_ctl
    (256, Sys::EpollWait),         // epoll_wait
    (258, Sys::SetTidAddress),     // set_tid_address
    (265, Sys::ClockGettime),      // clock_gettime
    (266, Sys::ClockGetres),       // clock_getres
    (267, Sys::ClockNanosleep),    // clock_nanosleep
    (270, Sys::Tgkill),            // tgkill
    (289, Sys::IoprioSet),         // ioprio_set
    (290, Sys::IoprioGet),         // ioprio_get
    (295, Sys::Openat),            // openat
    (296, Sys::Mkdirat),           // mkdirat
    (298, Sys::Fchownat),          // fchownat
    (300, Sys::Fstatat64),         // fstatat64
    (301, Sys::Unlinkat),          // unlinkat
    (302, Sys::Renameat),          // renameat
    (305, Sys::Readlinkat),        // readlinkat
    (306, Sys::Fchmodat),          // fchmodat
    (307, Sys::Faccessat),         // faccessat
    (308, Sys::Pselect6),          // pselect6
    (309, Sys::Ppoll),             // ppoll
    (311, Sys::SetRobustList),     // set_robust_list
    (312, Sys::GetRobustList),     // get_robust_list
    (318, Sys::Getcpu),            // getcpu
    (319, Sys::EpollPwait),        // epoll_pwait
    (320, Sys::Utimensat),         // utimensat
    (323, Sys::Eventfd),           // eventfd
    (328, Sys::Eventfd2),          // eventfd2
    (329, Sys::EpollCreate1),      // epoll_create1
    (330, Sys::Dup3),              // dup3
    (331, Sys::Pipe2),             // pipe2
    (333, Sys::Preadv),            // preadv
    (334, Sys::Pwritev),           // pwritev
    (340, Sys::Prlimit64),         // prlimit64
    (353, Sys::Renameat2),         // renameat2
    (355, Sys::Getrandom),         // getrandom
    (375, Sys::Membarrier),        // membarrier
    (377, Sys::CopyFileRange),     // copy_file_range
    (383, Sys::Statx),             // statx
    (384, Sys::ArchPrctl),         // arch_prctl
    (386, Sys::Rseq),              // rseq
    (403, Sys::ClockGettime64),    // clock_gettime64
    (406, Sys::ClockGetres64),     // clock_getres_time64
    (407, Sys::ClockNanosleep64),  // clock_nanosleep_time64
    (412, Sys::Utimensat64),       // utimensat_time64
    (413, Sys::Pselect6Time64),    // pselect6_time64
    (414, Sys::Ppoll64),           // ppoll_time64
    (421, Sys::RtSigtimedwait64),  // rt_sigtimedwait_time64
    (422, Sys::Futex64),           // futex_time64
    (435, Sys::Clone3),            // clone3
    (439, Sys::Faccessat2),        // faccessat2
    (441, Sys::EpollPwait2),       // epoll_pwait2
];

const fn build<const N: usize>(table: &[(u16, Sys)]) -> [Option<Sys>; N] {
    let mut out = [None; N];
    let mut i = 0;
    while i < table.len() {
        let (nr, sys) = table[i];
        // A number listed twice or past the names would be a table bug;
        // the test `tables_are_consistent_with_the_names` catches both.
        if (nr as usize) < N {
            out[nr as usize] = Some(sys);
        }
        i += 1;
    }
    out
}

static X86_64: [Option<Sys>; X86_64_NAMES.len()] = build(X86_64_TABLE);
static I386: [Option<Sys>; I386_NAMES.len()] = build(I386_TABLE);

/// The handler for `nr` in `abi`, or `None` when it is not implemented.
pub fn lookup(abi: Abi, nr: u64) -> Option<Sys> {
    let table: &[Option<Sys>] = match abi {
        Abi::X86_64 => &X86_64,
        Abi::I386 => &I386,
    };
    usize::try_from(nr)
        .ok()
        .and_then(|i| table.get(i).copied().flatten())
}

/// Linux's name for `nr` in `abi`: `None` past the end of the table,
/// `Some("")` for a number Linux leaves unassigned.
pub fn name(abi: Abi, nr: u64) -> Option<&'static str> {
    let names: &[&'static str] = match abi {
        Abi::X86_64 => &X86_64_NAMES,
        Abi::I386 => &I386_NAMES,
    };
    usize::try_from(nr).ok().and_then(|i| names.get(i).copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_consistent_with_the_names() {
        for (abi, table, names) in [
            (Abi::X86_64, X86_64_TABLE, &X86_64_NAMES[..]),
            (Abi::I386, I386_TABLE, &I386_NAMES[..]),
        ] {
            let mut seen = std::collections::HashSet::new();
            for &(nr, sys) in table {
                assert!(seen.insert(nr), "{abi:?} {nr} listed twice");
                let n = names.get(nr as usize).copied().unwrap_or("");
                assert!(!n.is_empty(), "{abi:?} {nr} ({sys:?}) has no Linux name");
                assert_eq!(lookup(abi, nr as u64), Some(sys));
            }
        }
    }

    #[test]
    fn well_known_numbers() {
        use Abi::*;
        for (abi, nr, sys, n) in [
            (X86_64, 0, Sys::Read, "read"),
            (X86_64, 9, Sys::Mmap, "mmap"),
            (X86_64, 158, Sys::ArchPrctl, "arch_prctl"),
            (X86_64, 231, Sys::ExitGroup, "exit_group"),
            (X86_64, 257, Sys::Openat, "openat"),
            (X86_64, 262, Sys::Newfstatat, "newfstatat"),
            (X86_64, 302, Sys::Prlimit64, "prlimit64"),
            (X86_64, 332, Sys::Statx, "statx"),
            (I386, 1, Sys::Exit, "exit"),
            (I386, 4, Sys::Write, "write"),
            (I386, 90, Sys::OldMmap, "mmap"),
            (I386, 140, Sys::Llseek, "_llseek"),
            (I386, 192, Sys::Mmap2, "mmap2"),
            (I386, 197, Sys::Fstat64, "fstat64"),
            (I386, 243, Sys::SetThreadArea, "set_thread_area"),
            (I386, 252, Sys::ExitGroup, "exit_group"),
            (I386, 295, Sys::Openat, "openat"),
            (I386, 403, Sys::ClockGettime64, "clock_gettime64"),
            (I386, 422, Sys::Futex64, "futex_time64"),
        ] {
            assert_eq!(lookup(abi, nr), Some(sys), "{abi:?} {nr}");
            assert_eq!(name(abi, nr), Some(n));
        }
        assert_eq!(name(X86_64, 41), Some("socket"));
        assert_eq!(lookup(X86_64, 41), Some(Sys::Socket));
        assert_eq!(lookup(I386, 102), Some(Sys::Socketcall));
        assert_eq!(name(X86_64, 57), Some("fork"));
        assert_eq!(lookup(X86_64, 57), Some(Sys::Fork));
        assert_eq!(lookup(I386, 190), Some(Sys::Vfork));
        assert_eq!(name(X86_64, 59), Some("execve"));
        assert_eq!(lookup(X86_64, 59), Some(Sys::Execve));
        assert_eq!(lookup(I386, 358), Some(Sys::Execveat));
        assert_eq!(lookup(X86_64, 163), None, "acct");
        assert_eq!(name(X86_64, 400), Some(""));
        assert_eq!(name(X86_64, 467), Some("uretprobe"));
        assert_eq!(name(X86_64, 468), None);
        assert_eq!(name(I386, 222), Some(""));
        assert_eq!(name(I386, 466), Some("removexattrat"));
        assert_eq!(lookup(X86_64, 205), None, "x86_64 has no set_thread_area");
        assert_eq!(lookup(I386, u64::MAX), None);
    }
}
