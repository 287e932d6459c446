//! `execve` and `execveat` through the real handlers in both ABIs: what a
//! call that can run hands the runtime (the program, its path, argv and
//! envp, a script's interpreter line), the errors of the calls that
//! cannot, and what [`exec_commit`] leaves of the process.

use super::*;
use crate::elf::tests::Hand;
use crate::sys::exec::{Exec, MAX_ARG_STRLEN, exec_commit};

const F_GETFD: u64 = 1;
const AT_EMPTY_PATH: u64 = 0x1000;

fn leak(b: Vec<u8>) -> &'static [u8] {
    Box::leak(b.into_boxed_slice())
}

/// `/bin` holds a 64-bit and a 32-bit static program, scripts, a dynamic
/// program and files that are not programs.
fn exec_fs() -> Vfs {
    let long = {
        let mut s = b"#!/bin/".to_vec();
        s.extend(core::iter::repeat_n(b'x', 300));
        leak(s)
    };
    Vfs::from_archive([
        (&b"bin/app64"[..], 0o100755, leak(Hand::good64().bytes())),
        (b"bin/app32", 0o100755, leak(Hand::good32().bytes())),
        (b"bin/dyn", 0o100755, leak(Hand::dynamic64().bytes())),
        (b"bin/noexec", 0o100644, leak(Hand::good64().bytes())),
        (b"bin/prog", 0o100755, &PROG[..]),
        (b"bin/script", 0o100755, b"#! /bin/app64  -x  y \necho hi\n"),
        (b"bin/plain", 0o100755, b"#!../bin/app32\n"),
        (b"bin/nested", 0o100755, b"#!/bin/script\n"),
        (b"bin/loop", 0o100755, b"#!/bin/loop\n"),
        (b"bin/empty", 0o100755, b"#!   \n"),
        (b"bin/long", 0o100755, long),
        (b"data/input.txt", 0o100644, b"line\n"),
        (b"data", 0o040755, b""),
    ])
    .unwrap()
}

fn both() -> [Env; 2] {
    [
        Env::with_fs(Abi::X86_64, exec_fs()),
        Env::with_fs(Abi::I386, exec_fs()),
    ]
}

/// A NULL-terminated array of pointers to `strs`, of the caller's width,
/// at `at` (strings after it); its address.
fn array(e: &mut Env, at: u64, strs: &[&str]) -> u64 {
    let w = if e.abi == Abi::X86_64 { 8 } else { 4 };
    let mut s = at + (strs.len() as u64 + 1) * w;
    for (i, st) in strs.iter().enumerate() {
        let p = e.cstr(s, st);
        e.poke(at + i as u64 * w, &p.to_le_bytes()[..w as usize]);
        s += st.len() as u64 + 1;
    }
    e.poke(at + strs.len() as u64 * w, &[0; 8][..w as usize]);
    at
}

fn strings(v: &[Vec<u8>]) -> Vec<String> {
    v.iter()
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

/// `execve(path, argv, envp)` that must run: what it hands the runtime.
fn exec_ok(e: &mut Env, path: &str, argv: &[&str], envp: &[&str]) -> Exec {
    let p = e.cstr(SCRATCH, path);
    let a = array(e, SCRATCH + 0x1000, argv);
    let v = array(e, SCRATCH + 0x2000, envp);
    match e.call("execve", &[p, a, v]) {
        Action::Exec(x) => *x,
        other => panic!("execve {path}: {other:?}"),
    }
}

fn exec_err(e: &mut Env, path: &str) -> Errno {
    let p = e.cstr(SCRATCH, path);
    let a = array(e, SCRATCH + 0x1000, &["x"]);
    e.err("execve", &[p, a, 0])
}

#[test]
fn an_elf_runs_with_its_arguments_in_its_own_abi() {
    for mut e in both() {
        let x = exec_ok(&mut e, "/bin/app64", &["app64", "a b", ""], &["K=v"]);
        assert_eq!(x.path, b"/bin/app64");
        assert_eq!(x.execfn, b"/bin/app64");
        assert_eq!(strings(&x.argv), ["app64", "a b", ""]);
        assert_eq!(strings(&x.envp), ["K=v"]);
        assert_eq!(x.abi, Abi::X86_64);
        // Relative to the working directory (/data), into the other ABI.
        let x = exec_ok(&mut e, "../bin/app32", &["app32"], &[]);
        assert_eq!(x.path, b"/bin/app32");
        assert_eq!(x.execfn, b"../bin/app32");
        assert_eq!(x.abi, Abi::I386);
        // NULL argv and envp are empty.
        let p = e.cstr(SCRATCH, "/bin/app32");
        let Action::Exec(x) = e.call("execve", &[p, 0, 0]) else {
            panic!("execve with NULL arrays");
        };
        assert!(x.argv.is_empty() && x.envp.is_empty());
    }
}

#[test]
fn a_script_runs_under_its_interpreter_with_the_script_as_an_argument() {
    for mut e in both() {
        let x = exec_ok(&mut e, "/bin/script", &["script", "one"], &[]);
        assert_eq!(
            strings(&x.argv),
            ["/bin/app64", "-x  y", "/bin/script", "one"]
        );
        assert_eq!(x.path, b"/bin/app64");
        assert_eq!(x.execfn, b"/bin/script");
        // A relative interpreter resolves from the working directory; no
        // argument; argv[0] of the caller goes.
        let x = exec_ok(&mut e, "/bin/plain", &["whatever", "1", "2"], &[]);
        assert_eq!(strings(&x.argv), ["../bin/app32", "/bin/plain", "1", "2"]);
        assert_eq!(x.abi, Abi::I386);
        // A script whose interpreter is a script.
        let x = exec_ok(&mut e, "/bin/nested", &["n", "z"], &[]);
        assert_eq!(
            strings(&x.argv),
            ["/bin/app64", "-x  y", "/bin/script", "/bin/nested", "z"]
        );
        assert_eq!(exec_err(&mut e, "/bin/loop"), Errno::ELOOP);
        assert_eq!(exec_err(&mut e, "/bin/empty"), Errno::ENOEXEC);
        // The interpreter's name runs past the 256 bytes read.
        assert_eq!(exec_err(&mut e, "/bin/long"), Errno::ENOEXEC);
    }
}

#[test]
fn what_cannot_run_is_the_callers_error() {
    for mut e in both() {
        assert_eq!(exec_err(&mut e, "/bin/missing"), Errno::ENOENT);
        assert_eq!(exec_err(&mut e, "/data/input.txt/x"), Errno::ENOTDIR);
        assert_eq!(exec_err(&mut e, "/data"), Errno::EACCES);
        assert_eq!(exec_err(&mut e, "/bin/noexec"), Errno::EACCES);
        assert_eq!(exec_err(&mut e, "/dev/null"), Errno::EACCES);
        assert_eq!(exec_err(&mut e, "/bin/prog"), Errno::ENOEXEC);
        assert_eq!(exec_err(&mut e, ""), Errno::ENOENT);
        // The loader's reason for a dynamic program is kept for the
        // summary, once per path, and every refusal counted.
        assert_eq!(exec_err(&mut e, "/bin/dyn"), Errno::ENOEXEC);
        assert_eq!(exec_err(&mut e, "/bin/dyn"), Errno::ENOEXEC);
        let refusals = &e.sys.execs;
        assert_eq!(refusals.count, 3);
        let dyn_reason = refusals.first.iter().find(|(p, _)| p == b"/bin/dyn");
        assert!(
            dyn_reason.is_some_and(|(_, r)| r.contains("PT_INTERP /lib/ld-musl-x86_64.so.1")),
            "{:?}",
            refusals.first
        );
        // Bad pointers.
        let p = e.cstr(SCRATCH, "/bin/app64");
        assert_eq!(e.err("execve", &[BAD, 0, 0]), Errno::EFAULT);
        assert_eq!(e.err("execve", &[p, BAD, 0]), Errno::EFAULT);
        let a = array(&mut e, SCRATCH + 0x1000, &["x"]);
        e.poke(SCRATCH + 0x1000, &BAD.to_le_bytes()[..4]);
        assert_eq!(e.err("execve", &[p, a, 0]), Errno::EFAULT);
    }
}

#[test]
fn arguments_past_linuxs_limits_are_e2big() {
    for mut e in both() {
        let w = if e.abi == Abi::X86_64 { 8 } else { 4 };
        let p = e.cstr(SCRATCH, "/bin/app64");
        // One 40,000-byte string named 60 times: 2.4 MB, past the 2 MiB
        // of all strings.
        let s = SCRATCH + 0x4000;
        e.poke(s, &vec![b'a'; 40_000]);
        e.poke(s + 40_000, &[0]);
        let a = SCRATCH + 0x1000;
        for i in 0..60 {
            e.poke(a + i * w, &s.to_le_bytes()[..w as usize]);
        }
        e.poke(a + 60 * w, &[0; 8][..w as usize]);
        assert_eq!(e.err("execve", &[p, a, 0]), Errno::E2BIG);
        // 40 times fits.
        e.poke(a + 40 * w, &[0; 8][..w as usize]);
        assert!(matches!(e.call("execve", &[p, a, 0]), Action::Exec(_)));
        // One string of MAX_ARG_STRLEN bytes or more (the scratch area is
        // smaller: it runs into the unmapped page after it, and a string
        // that long is E2BIG before that is found).
        assert!(MAX_ARG_STRLEN as u64 > SCRATCH_LEN);
    }
}

#[test]
fn execveat_runs_an_open_file_or_a_path_from_a_directory() {
    for mut e in both() {
        let bin = e.cstr(SCRATCH + 0x800, "/bin");
        let dir = e.ret("openat", &[AT_FDCWD, bin, 0o200000, 0]) as u64;
        let name = e.cstr(SCRATCH, "app32");
        let a = array(&mut e, SCRATCH + 0x1000, &["app32"]);
        let Action::Exec(x) = e.call("execveat", &[dir, name, a, 0, 0]) else {
            panic!("execveat from a directory");
        };
        assert_eq!(x.path, b"/bin/app32");
        let file = e.cstr(SCRATCH + 0x800, "/bin/app64");
        let fd = e.ret("openat", &[AT_FDCWD, file, 0, 0]) as u64;
        let empty = e.cstr(SCRATCH, "");
        let Action::Exec(x) = e.call("execveat", &[fd, empty, a, 0, AT_EMPTY_PATH]) else {
            panic!("execveat of an open file");
        };
        assert_eq!(x.path, b"/bin/app64");
        assert_eq!(x.execfn, format!("/dev/fd/{fd}").as_bytes());
        assert_eq!(e.err("execveat", &[fd, empty, a, 0, 0]), Errno::ENOENT);
        assert_eq!(e.err("execveat", &[fd, empty, a, 0, 0x4]), Errno::EINVAL);
        // /proc/self/exe without following it.
        let me = e.cstr(SCRATCH, "/proc/self/exe");
        assert_eq!(
            e.err("execveat", &[AT_FDCWD, me, a, 0, 0x100]),
            Errno::ELOOP
        );
    }
}

#[test]
fn exec_commit_gives_the_process_its_new_program() {
    for mut e in both() {
        // A caught, an ignored and a default signal; descriptors with and
        // without close-on-exec; a pipe whose write end closes on exec.
        e.p.signals.actions[9].handler = 0x401000; // SIGUSR1
        e.p.signals.actions[12].handler = 1; // SIGPIPE ignored
        e.t.sigmask = 1 << 14;
        let path = e.cstr(SCRATCH + 0x800, "/data/input.txt");
        let kept = e.ret("openat", &[AT_FDCWD, path, 0, 0]) as u64;
        let gone = e.ret("openat", &[AT_FDCWD, path, O_CLOEXEC, 0]) as u64;
        assert_eq!(e.ret("pipe2", &[SCRATCH + 0x900, 0]), 0);
        let (r, w) = (
            u64::from(e.u32_at(SCRATCH + 0x900)),
            u64::from(e.u32_at(SCRATCH + 0x904)),
        );
        assert_eq!(e.ret("fcntl", &[w, 2, 1]), 0); // F_SETFD FD_CLOEXEC
        e.t.robust_list = (0x5000, 24);
        e.t.clear_child_tid = 0x6000;
        e.t.altstack.sp = 0x7000;
        e.t.altstack.flags = 0;
        let x = exec_ok(&mut e, "/bin/app32", &["app32"], &[]);
        let mut woken = Vec::new();
        exec_commit(&mut e.sys, &mut e.p, &mut e.t, &x, |t| woken.push(t));
        e.abi = Abi::I386;
        assert_eq!(e.p.comm(), b"app32");
        assert_eq!(&e.t.comm[..6], b"app32\0");
        assert_eq!(e.p.exe, b"/bin/app32");
        assert_eq!(e.p.abi, Abi::I386);
        assert_eq!(e.p.signals.actions[9].handler, 0);
        assert_eq!(e.p.signals.actions[12].handler, 1);
        assert_eq!(e.t.sigmask, 1 << 14);
        assert_eq!(e.t.robust_list, (0, 0));
        assert_eq!(e.t.clear_child_tid, 0);
        assert_eq!(e.t.altstack.flags, 2);
        assert_eq!(e.ret("fcntl", &[kept, F_GETFD]), 0);
        assert_eq!(e.err("fcntl", &[gone, F_GETFD]), Errno::EBADF);
        assert_eq!(e.err("fcntl", &[w, F_GETFD]), Errno::EBADF);
        // The read end sees end of file: its writer went with the exec.
        assert_eq!(e.ret("read", &[r, SCRATCH, 16]), 0);
        // The name comes from the path as given.
        let x = exec_ok(&mut e, "../bin/script", &["s"], &[]);
        exec_commit(&mut e.sys, &mut e.p, &mut e.t, &x, |_| {});
        assert_eq!(e.p.comm(), b"script");
        assert_eq!(e.p.exe, b"/bin/app64");
    }
}
