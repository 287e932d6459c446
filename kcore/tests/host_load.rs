//! End-to-end check of `kcore::elf` and `kcore::initstack` against real libcs, on the host.
//!
//! Each test compiles a small program (C with glibc and musl, 64-bit and i386, static and
//! static-pie; Rust for the two musl targets), plans it with [`kcore::elf::plan`], builds
//! its initial stack with [`kcore::initstack::build`], and starts it through
//! `hostload/loader.c`: a user-space stand-in for the runtime's loader that maps exactly
//! the planned segments, copies the stack image and jumps to the entry point. The program's
//! output and exit status must equal those of the same binary started natively by Linux
//! with the same argv and environment. A test whose compiler is missing says so and passes.

use kcore::elf::{self, Class, LoadPlan};
use kcore::initstack::{self, StackSpec};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const LOADER_C: &str = include_str!("hostload/loader.c");
const PROG_C: &str = include_str!("hostload/prog.c");
const PROG_RS: &str = r#"
use std::io::Write;
fn main() {
    let mut out = std::io::stdout().lock();
    for (i, a) in std::env::args_os().enumerate() {
        writeln!(out, "argv[{i}] {a:?}").unwrap();
    }
    for (k, v) in std::env::vars_os() {
        writeln!(out, "env {k:?}={v:?}").unwrap();
    }
    let heap = vec![7u8; 80 << 20];
    let t = std::thread::spawn(|| 6 * 7).join().unwrap();
    writeln!(out, "heap {} thread {t} time {}", heap[12345], std::time::Instant::now().elapsed().as_secs()).unwrap();
    std::process::exit(3);
}
"#;

/// Where the program's stack ends, per class (clear of the loader and of Linux's mappings).
fn stack_top(class: Class) -> u64 {
    match class {
        Class::Elf64 => 0x6fff_0000_0000,
        Class::Elf32 => 0xc000_0000,
    }
}

/// Compiles into `dir`; `None` (with the reason printed) if it cannot.
fn compile(
    dir: &Path,
    name: &str,
    compiler: &str,
    args: &[&str],
    source: &str,
    ext: &str,
) -> Option<PathBuf> {
    let src = dir.join(format!("{name}.{ext}"));
    std::fs::write(&src, source).unwrap();
    let out = dir.join(name);
    match Command::new(compiler)
        .args(args)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .output()
    {
        Err(e) => {
            println!("skipped {name}: cannot run {compiler}: {e}");
            None
        }
        Ok(o) if !o.status.success() => {
            println!(
                "skipped {name}: {compiler} {args:?} failed: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            None
        }
        Ok(_) => Some(out),
    }
}

fn loader(dir: &Path, class: Class) -> Option<PathBuf> {
    let base = ["-static", "-O1", "-Wl,-Ttext-segment=0x20000000"];
    match class {
        Class::Elf64 => compile(dir, "loader64", "gcc", &base, LOADER_C, "c"),
        Class::Elf32 => {
            let args = [&["-m32"][..], &base].concat();
            compile(dir, "loader32", "gcc", &args, LOADER_C, "c")
        }
    }
}

/// AT_HWCAP of this test process, as Linux gave it (CPUID.1:EDX).
fn host_hwcap() -> u32 {
    let auxv = std::fs::read("/proc/self/auxv").unwrap_or_default();
    auxv.chunks_exact(16)
        .map(|p| {
            (
                u64::from_le_bytes(p[..8].try_into().unwrap()),
                u64::from_le_bytes(p[8..].try_into().unwrap()),
            )
        })
        .find(|&(k, _)| k == initstack::at::HWCAP)
        .map_or(0x178b_fbff, |(_, v)| v as u32)
}

const ARGV: [&str; 4] = ["prog-name", "", "two words", "tail "];
const ENV: [(&str, &str); 3] = [("A", "1"), ("B", "x y"), ("EMPTY", "")];

fn native(prog: &Path) -> Output {
    Command::new(prog)
        .arg0(ARGV[0])
        .args(&ARGV[1..])
        .env_clear()
        .envs(ENV)
        .output()
        .unwrap()
}

fn loaded(prog: &Path, plan: &LoadPlan) -> Option<Output> {
    let loader = loader(prog.parent()?, plan.class)?;
    let file = std::fs::read(prog).unwrap();
    let argv: Vec<Vec<u8>> = ARGV.iter().map(|a| a.as_bytes().to_vec()).collect();
    let envp: Vec<Vec<u8>> = ENV
        .iter()
        .map(|(k, v)| format!("{k}={v}").into_bytes())
        .collect();
    let top = stack_top(plan.class);
    let execfn = prog.as_os_str().as_encoded_bytes();
    let random = *b"kcore-host-test!";
    let spec = StackSpec::for_plan(plan, top, &argv, &envp, execfn, random, host_hwcap());
    let image = initstack::build(&spec).unwrap();
    let image_path = prog.with_extension("stack");
    std::fs::write(&image_path, &image.bytes).unwrap();
    let segments = plan.segments.iter().map(|s| {
        let prot =
            u32::from(s.prot.read) | u32::from(s.prot.write) << 1 | u32::from(s.prot.exec) << 2;
        format!(
            "{:x}:{:x}:{:x}:{:x}:{prot:x}",
            s.vaddr, s.memsz, s.file_offset, s.filesz
        )
    });
    assert!(
        file.len() as u64
            >= plan
                .segments
                .iter()
                .map(|s| s.file_offset + s.filesz)
                .max()
                .unwrap()
    );
    Some(
        Command::new(loader)
            .arg(prog)
            .arg(&image_path)
            .arg(format!("{top:x}"))
            .arg(format!("{:x}", image.sp))
            .arg(format!("{:x}", plan.entry))
            .args(segments)
            .env_clear()
            .output()
            .unwrap(),
    )
}

/// Compiles a program, plans it, runs it natively and through the loader, and compares.
fn same_as_native(
    compiler: &str,
    args: &[&str],
    source: &str,
    ext: &str,
    class: Class,
    kind: elf::Kind,
) {
    let dir = tempfile::tempdir().unwrap();
    let Some(prog) = compile(dir.path(), "prog", compiler, args, source, ext) else {
        return;
    };
    let plan = elf::plan(&std::fs::read(&prog).unwrap()).unwrap();
    assert_eq!((plan.class, plan.kind), (class, kind));
    let want = native(&prog);
    let Some(got) = loaded(&prog, &plan) else {
        return;
    };
    let text = |o: &Output| String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(
        text(&got),
        text(&want),
        "stdout differs; loader stderr: {}",
        String::from_utf8_lossy(&got.stderr)
    );
    assert_eq!(got.status.code(), want.status.code(), "exit status");
    assert_eq!(want.status.code(), Some(3));
    // The run did what the program does, not something trivially equal.
    assert!(text(&want).contains("argv[2]"), "{}", text(&want));
}

const RUSTC: [&str; 4] = ["-O", "--edition", "2021", "--target"];

#[test]
fn glibc_static_64() {
    same_as_native(
        "gcc",
        &["-static", "-O1"],
        PROG_C,
        "c",
        Class::Elf64,
        elf::Kind::Exec,
    );
}

#[test]
fn glibc_static_pie_64() {
    same_as_native(
        "gcc",
        &["-static-pie", "-O1"],
        PROG_C,
        "c",
        Class::Elf64,
        elf::Kind::StaticPie,
    );
}

#[test]
fn glibc_static_32() {
    same_as_native(
        "gcc",
        &["-m32", "-static", "-O1"],
        PROG_C,
        "c",
        Class::Elf32,
        elf::Kind::Exec,
    );
}

#[test]
fn glibc_static_pie_32() {
    let args = ["-m32", "-static-pie", "-O1"];
    same_as_native(
        "gcc",
        &args,
        PROG_C,
        "c",
        Class::Elf32,
        elf::Kind::StaticPie,
    );
}

#[test]
fn musl_static_64() {
    same_as_native(
        "musl-gcc",
        &["-static", "-O1"],
        PROG_C,
        "c",
        Class::Elf64,
        elf::Kind::Exec,
    );
}

#[test]
fn rust_musl_64() {
    let args = [&RUSTC[..], &["x86_64-unknown-linux-musl"]].concat();
    same_as_native(
        "rustc",
        &args,
        PROG_RS,
        "rs",
        Class::Elf64,
        elf::Kind::StaticPie,
    );
}

#[test]
fn rust_musl_32() {
    let args = [&RUSTC[..], &["i686-unknown-linux-musl"]].concat();
    same_as_native("rustc", &args, PROG_RS, "rs", Class::Elf32, elf::Kind::Exec);
}
