//! `execve` and `execveat`: a process replaces its program.
//!
//! The call is checked here, up to the point of no return, as Linux checks
//! it: the path resolves to a regular file the caller may execute; the
//! argument and environment strings fit Linux's limits; a `#!` script
//! names an interpreter (at most [`MAX_INTERPRETERS`] deep) whose own file
//! is a static ELF the loader takes. Any failure is the caller's `errno`
//! and the process goes on. What passes becomes an [`Exec`] for the
//! runtime, which builds the new address space and then calls
//! [`exec_commit`] to give the process its new identity: its name, its
//! executable path, its ABI, default signal actions, no close-on-exec
//! descriptors, one thread.

use super::calls::Ctx;
use super::fd::Target;
use super::fs::{Content, NodeId};
use super::machine::{self, Machine};
use super::process::{AltStack, SigAction};
use super::vma::FileData;
use super::{Abi, Action, Errno, Process, System, Thread};
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;

/// Linux's `MAX_ARG_STRLEN`: one argument or environment string, with its
/// NUL, is at most 32 pages.
pub const MAX_ARG_STRLEN: usize = 32 * 4096;
/// All argument and environment strings with their pointers: a quarter of
/// the default 8 MiB stack limit, as Linux allows.
pub const MAX_ARG_BYTES: usize = 2 << 20;
/// A `#!` line is read from the file's first 256 bytes (`BINPRM_BUF_SIZE`).
pub const SCRIPT_LINE_MAX: usize = 256;
/// Scripts whose interpreter is a script: this many levels, then `ELOOP`
/// (Linux stops after 5 program loads, the last an ELF).
pub const MAX_INTERPRETERS: usize = 4;
/// How many refused programs the run remembers for its summary.
pub const MAX_REFUSALS: usize = 16;

/// `execveat` flags.
const AT_SYMLINK_NOFOLLOW: u64 = 0x100;
const AT_EMPTY_PATH: u64 = 0x1000;

/// A checked `execve`: what the runtime loads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exec {
    /// The ELF's bytes (a script's interpreter's, for a script).
    pub data: FileData,
    /// The ELF's absolute path in the file system: the process's
    /// executable from now on (`/proc/self/exe`), and the program the
    /// profile names.
    pub path: Vec<u8>,
    /// The path as the caller passed it (a script's, for a script):
    /// `AT_EXECFN`, and where the process's name comes from.
    pub execfn: Vec<u8>,
    /// The argument strings (a script's interpreter and its argument
    /// first).
    pub argv: Vec<Vec<u8>>,
    /// The environment strings.
    pub envp: Vec<Vec<u8>>,
    /// The ABI of the ELF.
    pub abi: Abi,
}

/// Programs `execve` refused because the loader cannot run them (a
/// dynamic ELF, a foreign machine), with the loader's reason, for the
/// run's summary. Bounded: the first [`MAX_REFUSALS`] distinct paths, and
/// a count of all.
#[derive(Debug, Default)]
pub struct Refusals {
    /// (path as passed, reason), the first of each path.
    pub first: Vec<(Vec<u8>, String)>,
    /// Every refusal.
    pub count: u64,
}

impl Refusals {
    fn note(&mut self, path: &[u8], reason: String) {
        self.count += 1;
        if self.first.len() < MAX_REFUSALS
            && !self.first.iter().any(|(p, _)| p == path)
            && self.first.try_reserve(1).is_ok()
        {
            let mut p = Vec::new();
            if p.try_reserve(path.len()).is_ok() {
                p.extend_from_slice(path);
                self.first.push((p, reason));
            }
        }
    }
}

/// `execveat(dirfd, path, argv, envp, flags)`; `execve` is it with
/// `AT_FDCWD` and no flags.
pub(crate) fn execveat<M: Machine>(
    c: &mut Ctx<'_, M>,
    dirfd: i32,
    path: u64,
    argv: u64,
    envp: u64,
    flags: u64,
) -> Result<Action, Errno> {
    if flags & !(AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH) != 0 {
        return Err(Errno::EINVAL);
    }
    let name = c.path(path)?;
    let mut budget = MAX_ARG_BYTES;
    let argv = strings(c, argv, &mut budget)?;
    let envp = strings(c, envp, &mut budget)?;
    let (node, execfn) = if name.is_empty() {
        if flags & AT_EMPTY_PATH == 0 {
            return Err(Errno::ENOENT);
        }
        // The file behind `dirfd` itself, named as Linux names it.
        let Target::Node(id) = c
            .files
            .get(&c.p.fds, super::calls::fd_arg(dirfd as u32 as u64))?
            .target
        else {
            return Err(Errno::EACCES);
        };
        (id, alloc::format!("/dev/fd/{dirfd}").into_bytes())
    } else {
        let id = super::calls::file::lookup(c, dirfd, &name, flags & AT_SYMLINK_NOFOLLOW != 0)?;
        if flags & AT_SYMLINK_NOFOLLOW != 0 && matches!(c.fs.node(id).content, Content::SelfExe) {
            return Err(Errno::ELOOP);
        }
        (id, name)
    };
    let exec = prepare(c.fs, c.p.cwd, node, execfn, argv, envp, budget).map_err(|e| {
        if let Refused::Loader(path, reason) = &e {
            c.execs.note(path, reason.clone());
        }
        e.errno()
    })?;
    Ok(Action::Exec(alloc::boxed::Box::new(exec)))
}

/// Why a program cannot be run.
#[derive(Debug)]
enum Refused {
    /// An error as it is.
    Errno(Errno),
    /// The loader refused the ELF at this path (`ENOEXEC`), for this reason.
    Loader(Vec<u8>, String),
}

impl Refused {
    fn errno(&self) -> Errno {
        match self {
            Refused::Errno(e) => *e,
            Refused::Loader(..) => Errno::ENOEXEC,
        }
    }
}

impl From<Errno> for Refused {
    fn from(e: Errno) -> Refused {
        Refused::Errno(e)
    }
}

/// Follows `#!` lines from file `node` (reached as `execfn`) to a static
/// ELF, and checks it: the [`Exec`] that runs it. `budget` is what is left
/// of [`MAX_ARG_BYTES`] for the interpreters' arguments.
fn prepare(
    fs: &super::Vfs,
    cwd: NodeId,
    node: NodeId,
    execfn: Vec<u8>,
    argv: Vec<Vec<u8>>,
    envp: Vec<Vec<u8>>,
    mut budget: usize,
) -> Result<Exec, Refused> {
    let mut node = node;
    let mut argv = argv;
    // The name the next interpreter gets its script by.
    let mut script = execfn.clone();
    for _ in 0..=MAX_INTERPRETERS {
        let bytes = executable(fs, node)?;
        let Some(line) = bytes.bytes().strip_prefix(b"#!") else {
            let abi = match crate::elf::plan(bytes.bytes()) {
                Ok(plan) => match plan.class {
                    crate::elf::Class::Elf64 => Abi::X86_64,
                    crate::elf::Class::Elf32 => Abi::I386,
                },
                Err(e) => {
                    return Err(Refused::Loader(script, alloc::format!("{e}")));
                }
            };
            return Ok(Exec {
                data: bytes,
                path: fs.path_of(node)?,
                execfn,
                argv,
                envp,
                abi,
            });
        };
        let (interp, arg) = script_line(line)?;
        // argv becomes: interpreter, its argument, the script, then the
        // caller's arguments after argv[0].
        let mut next = Vec::new();
        next.try_reserve(argv.len() + 3)
            .map_err(|_| Errno::ENOMEM)?;
        for s in [Some(interp), arg, Some(&script[..])].into_iter().flatten() {
            budget = budget.checked_sub(s.len() + 1 + 8).ok_or(Errno::E2BIG)?;
            next.push(copy(s)?);
        }
        next.extend(argv.drain(..).skip(1));
        argv = next;
        node = fs.resolve(cwd, interp)?;
        script = copy(interp)?;
    }
    Err(Refused::Errno(Errno::ELOOP))
}

/// The bytes of file `node` if it is a regular file with an execute bit:
/// `EACCES` for a directory, a device or a file nobody may execute.
fn executable(fs: &super::Vfs, node: NodeId) -> Result<FileData, Errno> {
    let n = fs.node(node);
    match &n.content {
        Content::Archive(d) if n.perm & 0o111 != 0 => Ok(FileData::Static(d)),
        Content::Mem(d) if n.perm & 0o111 != 0 => {
            let mut v = Vec::new();
            v.try_reserve_exact(d.len()).map_err(|_| Errno::ENOMEM)?;
            v.extend_from_slice(d);
            Ok(FileData::Shared(Arc::from(v)))
        }
        _ => Err(Errno::EACCES),
    }
}

/// The interpreter and its one optional argument of a `#!` line (`line`
/// is what follows the `#!`), as Linux splits it: blanks around both, the
/// argument the rest of the line. `ENOEXEC` when there is no interpreter,
/// or the line does not end within [`SCRIPT_LINE_MAX`] bytes and the
/// interpreter's name is cut by that.
fn script_line(line: &[u8]) -> Result<(&[u8], Option<&[u8]>), Errno> {
    let max = SCRIPT_LINE_MAX - 2;
    let (line, cut) = match line.iter().take(max).position(|&b| b == b'\n') {
        Some(nl) => (&line[..nl], false),
        None => (&line[..line.len().min(max)], line.len() >= max),
    };
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    let start = line.iter().position(|b| !blank(b)).ok_or(Errno::ENOEXEC)?;
    let line = &line[start..];
    let end = line.iter().position(blank).unwrap_or(line.len());
    if cut && end == line.len() {
        return Err(Errno::ENOEXEC);
    }
    let interp = &line[..end];
    let rest = &line[end..];
    let arg = rest.iter().position(|b| !blank(b)).map(|s| {
        let e = rest
            .iter()
            .rposition(|b| !blank(b))
            .map_or(rest.len(), |e| e + 1);
        &rest[s..e]
    });
    Ok((interp, arg))
}

fn copy(s: &[u8]) -> Result<Vec<u8>, Errno> {
    let mut v = Vec::new();
    v.try_reserve_exact(s.len()).map_err(|_| Errno::ENOMEM)?;
    v.extend_from_slice(s);
    Ok(v)
}

/// The strings of a NULL-terminated array of pointers at `addr` (pointers
/// of the caller's width); a NULL array is empty. `E2BIG` when a string
/// or all of them with their pointers exceed Linux's limits (`budget`
/// counts down), `EFAULT` for a bad pointer.
fn strings<M: Machine>(
    c: &mut Ctx<'_, M>,
    addr: u64,
    budget: &mut usize,
) -> Result<Vec<Vec<u8>>, Errno> {
    let mut out = Vec::new();
    if addr == 0 {
        return Ok(out);
    }
    let wide = c.wide();
    let step = if wide { 8 } else { 4 };
    let mut at = addr;
    loop {
        let p = machine::read_word(c.m, &c.p.areas, at, wide)?;
        if p == 0 {
            return Ok(out);
        }
        let s = match machine::read_cstr(c.m, &c.p.areas, p, MAX_ARG_STRLEN - 1) {
            Err(Errno::ENAMETOOLONG) => return Err(Errno::E2BIG),
            r => r?,
        };
        *budget = budget
            .checked_sub(s.len() + 1 + step as usize)
            .ok_or(Errno::E2BIG)?;
        out.try_reserve(1).map_err(|_| Errno::ENOMEM)?;
        out.push(s);
        at = at.checked_add(step).ok_or(Errno::EFAULT)?;
    }
}

/// Process `p`, whose thread `t` made the `execve` that `e` describes and
/// whose other threads the runtime ended, runs `e`'s program from now on;
/// the runtime built its address space and gives its areas and break in
/// `p` before or after. Its name becomes the last component of the path
/// the caller gave; its executable, `e`'s path; its ABI, the ELF's. Its
/// close-on-exec descriptors close (pipe ends wake their other ends'
/// holders through `wake`); caught signals go back to their default
/// action (ignored ones stay ignored); the thread's alternate stack,
/// robust list, TLS and `clear_child_tid` are gone. Pending signals and
/// the signal mask stay, as do pid, parent, group and session.
pub fn exec_commit(
    sys: &mut System,
    p: &mut Process,
    t: &mut Thread,
    e: &Exec,
    mut wake: impl FnMut(u32),
) {
    let base = e.execfn.rsplit(|&b| b == b'/').next().unwrap_or(&e.execfn);
    let mut comm = [0u8; 16];
    let n = base.len().min(15);
    comm[..n].copy_from_slice(&base[..n]);
    p.comm = comm;
    t.comm = comm;
    p.exe.clear();
    if p.exe.try_reserve(e.path.len()).is_ok() {
        p.exe.extend_from_slice(&e.path);
    }
    p.abi = e.abi;
    p.layout = super::Layout::for_abi(e.abi);
    p.threads = 1;
    for a in &mut p.signals.actions {
        if a.handler > 1 {
            *a = SigAction::default();
        }
    }
    let gone = sys.files.close_on_exec(&mut p.fds);
    for id in sys.files.take_closed_sockets() {
        sys.net.close(id);
    }
    if pipe_events(sys, gone) {
        sys.waits.wake_all_with(&mut wake);
    }
    t.clear_child_tid = 0;
    t.robust_list = (0, 0);
    t.fs_base = 0;
    t.tls = [None; 3];
    t.altstack = AltStack {
        sp: 0,
        flags: 2,
        size: 0,
    };
    t.renamed = false;
}

/// The pipes among descriptions that closed (`gone`) tell their other
/// ends' holders, in any process, and the `/proc` snapshots among them
/// can be used again. Whether there was a pipe.
pub(crate) fn pipe_events(sys: &mut System, gone: Vec<Target>) -> bool {
    let mut pipes = false;
    for t in gone {
        if let Target::Node(id) = t {
            sys.fs.release_snapshot(id);
        }
        if let Some(obj @ super::event::Obj::Pipe(_)) = super::event::Obj::of(t) {
            sys.files.event(obj, 0);
            pipes = true;
        }
    }
    pipes
}
