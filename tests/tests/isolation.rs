//! Isolation under attack: hostile static programs (`tests/programs/c/attack.c`, x86-64
//! with musl and i386 with glibc), one attack per process, each appliance holding a
//! well-behaved program beside them. Every attack must end only its own process, with
//! the signal Linux gives it and the runtime's reason; the well-behaved program prints
//! exactly what it prints natively, and the runtime ends the run normally.
//!
//! The manifest holds at most 16 processes, so the attacks come in five appliances by
//! kind. Each runs on `-cpu max` (NX, SMEP, SMAP under TCG: the runtime's
//! protections on) and on `-cpu qemu64` (NX, no SMEP/SMAP).
//!
//! Exhaustion of memory and the endless loop are covered in `programs.rs`
//! (`a_process_that_exhausts_memory_is_killed_and_the_others_run_on`,
//! `a_process_that_never_makes_a_system_call_is_preempted_and_the_run_ends_at_duration`),
//! system calls with runtime pointers and huge lengths in
//! `system_calls_given_runtime_or_unmapped_pointers_return_efault`.

#![forbid(unsafe_code)]

use e2e_tests::programs::{
    CBuild, End, Program, RunEnd, appliance, c_program, c_program_with, run_appliance_on,
};
use e2e_tests::{Cpu, STATUS_PASS, qemu_present, runtime_elf};
use std::path::PathBuf;
use std::time::Duration;

const CMDLINE: &str = "duration=60000";
const TIMEOUT: Duration = Duration::from_secs(180);

/// How an attack must end.
#[derive(Clone, Copy, Debug)]
enum Want {
    /// Killed by SIGSEGV for a #GP (a privileged instruction, a bad selector, a
    /// non-canonical address).
    GeneralProtection,
    /// Killed by SIGSEGV for a page fault of this kind (`writing`, `executing`) at
    /// the address given (`None`: the one the program printed).
    PageFault(&'static str, Option<u64>),
    /// Killed by SIGSEGV for a write to the table an `sgdt`/`sidt` named, or by the
    /// #GP of that instruction itself where UMIP is on.
    TableWrite,
    /// Killed by SIGSEGV with a reason containing this text.
    Reason(&'static str),
    /// Exited with status 0 (what Linux allows), printing what it prints natively.
    Exit0,
    /// Exited with status 0; the output depends on the limits (the descriptor
    /// count: RLIMIT_NOFILE natively, the runtime's table under it).
    Exit0Limits,
}

struct Attack {
    /// The process name.
    name: String,
    program: Program,
    want: Want,
}

fn attack_exe(build: CBuild) -> PathBuf {
    c_program_with("attack", build, &["-fno-stack-protector"], "")
}

fn attack(build: CBuild, what: &str, arg: Option<u64>, want: Want) -> Attack {
    let suffix = if build == CBuild::Glibc32 { "-32" } else { "" };
    let short = what
        .replace("noncanonical", "noncanon")
        .replace("sigreturn-forged", "sigret")
        .replace("exec-mprotect", "mprotect-x");
    let name = format!("{short}{suffix}");
    assert!(
        name.len() <= 15,
        "{name}: a process name has 15 bytes at most"
    );
    let arg = arg.map(|a| format!("{a:x}"));
    let args: Vec<&str> = std::iter::once(what).chain(arg.as_deref()).collect();
    Attack {
        program: Program::new(&attack_exe(build), &name, &args, &[]),
        name,
        want,
    }
}

/// The well-behaved neighbour: writes a global, yields, re-checks, 300 times.
fn sibling() -> Program {
    Program::new(
        &c_program("twin", CBuild::Glibc),
        "sibling",
        &["sibling", "300"],
        &[],
    )
}

/// Every hex number (`0x...`) in `text`.
fn hex_numbers(text: &str) -> Vec<u64> {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .filter_map(|w| w.strip_prefix("0x"))
        .filter_map(|h| u64::from_str_radix(h, 16).ok())
        .collect()
}

/// The address of the first symbol of the runtime ELF whose name contains `part`.
fn runtime_symbol(part: &str) -> u64 {
    use object::{Object, ObjectSymbol};
    let data = std::fs::read(runtime_elf()).expect("reading the runtime ELF");
    let elf = object::File::parse(&*data).expect("the runtime is an ELF");
    elf.symbols()
        .find(|s| s.name().is_ok_and(|n| n.contains(part)))
        .unwrap_or_else(|| panic!("no symbol containing {part:?} in the runtime"))
        .address()
}

/// The runtime's link address of its upper half and where the direct map starts.
const KERNEL_VMA: u64 = 0xffff_ffff_8000_0000;
const DIRECT_MAP: u64 = 0xffff_8000_0000_0000;

/// The direct-map alias of a runtime address (the image is loaded at its
/// physical address `va - KERNEL_VMA`).
fn direct_alias(va: u64) -> u64 {
    DIRECT_MAP + (va - KERNEL_VMA)
}

/// Runs `attacks` beside [`sibling`] on `cpu` and checks every end.
fn run_attacks(cpu: Cpu, attacks: &[Attack]) {
    assert!(attacks.len() < 16, "the manifest holds 16 processes");
    // Natively (Linux) every attack ends as the runtime must end it.
    for a in attacks {
        let mut n = a.program.native();
        // Linux's UMIP emulation answers a 32-bit SGDT/SIDT with a fixed
        // address just below 4 GiB, which the randomised stack sometimes
        // covers: then the write lands in the attack's own stack. Another
        // run draws another stack.
        for _ in 0..8 {
            if !(a.name.starts_with("sgdt-write") || a.name.starts_with("sidt-write"))
                || !n.out().contains("NOT STOPPED")
            {
                break;
            }
            n = a.program.native();
        }
        let want = match a.want {
            Want::Exit0 | Want::Exit0Limits => End::Exited(0),
            _ => End::Killed {
                signal: "SIGSEGV".into(),
                reason: String::new(),
            },
        };
        assert_eq!(n.end, Some(want), "{} natively: {}", a.name, n.out());
    }
    if !qemu_present() {
        return;
    }
    let good = sibling();
    let mut programs: Vec<Program> = attacks.iter().map(|a| a.program.clone()).collect();
    programs.push(good.clone());
    let started = std::time::Instant::now();
    let run = run_appliance_on(cpu, &appliance(&programs), CMDLINE, TIMEOUT, &[]);
    eprintln!(
        "{} attacks on -cpu {}: {:.1} s",
        attacks.len(),
        cpu.model(),
        started.elapsed().as_secs_f64()
    );
    let t = run.transcript();
    assert_eq!(
        run.boot.status,
        Some(STATUS_PASS),
        "the runtime did not end the run normally (timed out: {}):\n{t}",
        run.boot.timed_out
    );
    assert!(!t.contains("RUNTIME"), "the runtime faulted:\n{t}");
    assert_eq!(run.console.run_end, Some(RunEnd::AllExited), "{t}");
    if cpu == Cpu::Max {
        assert!(
            t.contains("nx=true smep=true smap=true"),
            "-cpu max without the protections on:\n{t}"
        );
    }
    for a in attacks {
        let g = run.console.process(&a.name);
        let out = g.out();
        let what = &a.program.spec.argv[1];
        assert!(
            out.starts_with(&format!("attack: {}\n", what.escape_ascii())),
            "{} did not start:\n{t}",
            a.name
        );
        assert!(!out.contains("NOT STOPPED"), "{} got through:\n{t}", a.name);
        let end = g
            .end
            .clone()
            .unwrap_or_else(|| panic!("{} never ended:\n{t}", a.name));
        if let Want::Exit0 | Want::Exit0Limits = a.want {
            assert_eq!(end, End::Exited(0), "{}:\n{t}", a.name);
            if let Want::Exit0 = a.want {
                assert_eq!(
                    out,
                    a.program.native().out(),
                    "{}: stdout differs from the native run:\n{t}",
                    a.name
                );
            }
            continue;
        }
        let End::Killed { signal, reason } = end else {
            panic!("{} was not killed: {end:?}\n{t}", a.name);
        };
        assert_eq!(signal, "SIGSEGV", "{}:\n{t}", a.name);
        let gp = reason.starts_with("#GP general protection at rip 0x");
        match a.want {
            Want::GeneralProtection => {
                assert!(gp, "{}: reason {reason:?}:\n{t}", a.name)
            }
            Want::PageFault(kind, addr) => {
                let addr = addr.unwrap_or_else(|| *hex_numbers(&out).last().unwrap_or(&0));
                assert!(
                    reason.starts_with(&format!("#PF page fault {kind} {addr:#x} at rip 0x")),
                    "{}: reason {reason:?}, want a fault {kind} {addr:#x}:\n{t}",
                    a.name
                );
            }
            Want::TableWrite => {
                let written = out
                    .lines()
                    .find_map(|l| l.split_once(": writing 0x").map(|(_, h)| h.to_string()));
                match written {
                    // The instruction gave an address: the write there faulted.
                    Some(h) => {
                        let addr = u64::from_str_radix(&h, 16).unwrap_or(0);
                        assert!(
                            reason.starts_with(&format!("#PF page fault writing {addr:#x}")),
                            "{}: reason {reason:?}:\n{t}",
                            a.name
                        );
                    }
                    // UMIP: the instruction itself faulted.
                    None => assert!(gp, "{}: reason {reason:?}:\n{t}", a.name),
                }
            }
            Want::Reason(r) => assert!(reason.contains(r), "{}: reason {reason:?}:\n{t}", a.name),
            Want::Exit0 | Want::Exit0Limits => unreachable!(),
        }
    }
    let s = run.console.process(&good.spec.name);
    assert_eq!(s.out(), good.native().out(), "the sibling's output:\n{t}");
    assert_eq!(s.end, Some(End::Exited(0)), "{t}");
}

const A64: CBuild = CBuild::Musl;
const A32: CBuild = CBuild::Glibc32;

fn privileged() -> Vec<Attack> {
    let mut v: Vec<Attack> = [
        "cli", "hlt", "in", "out", "rdmsr", "wrmsr", "mov-cr3", "lgdt", "lidt", "invlpg", "wbinvd",
    ]
    .iter()
    .map(|w| attack(A64, w, None, Want::GeneralProtection))
    .collect();
    for w in ["cli", "out", "rdmsr", "lgdt"] {
        v.push(attack(A32, w, None, Want::GeneralProtection));
    }
    v
}

fn tables() -> Vec<Attack> {
    // The boot CPU's tables: its TSS (104 bytes), then its GDT.
    let tss = runtime_symbol("3cpu10BSP_TABLES");
    let gdt = tss + 104;
    let idt = runtime_symbol("3cpu3IDT");
    let pml4 = runtime_symbol("2mm6TABLES");
    let boot_pml4 = runtime_symbol("perch_boot_pml4");
    let text = runtime_symbol("perch_kmain");
    let mut v = vec![
        attack(A64, "sgdt-write", None, Want::TableWrite),
        attack(A64, "sidt-write", None, Want::TableWrite),
        attack(A32, "sgdt-write", None, Want::TableWrite),
        attack(A32, "sidt-write", None, Want::TableWrite),
    ];
    for (name, addr) in [
        ("wr-gdt", gdt),
        ("wr-gdt-dmap", direct_alias(gdt)),
        ("wr-idt-dmap", direct_alias(idt)),
        ("wr-tss-dmap", direct_alias(tss)),
        ("wr-pml4", pml4),
        ("wr-pml4-dmap", direct_alias(pml4)),
        ("wr-bootpml4-dm", direct_alias(boot_pml4)),
        ("wr-text", text),
        ("wr-dmap", DIRECT_MAP),
        // The page tables of the first process the runtime builds are frames above
        // the image; the direct map's first 16 MiB cover them.
        ("wr-dmap-16m", DIRECT_MAP + (16 << 20)),
    ] {
        let hex = format!("{addr:x}");
        v.push(Attack {
            program: Program::new(&attack_exe(A64), name, &["write", &hex], &[]),
            name: name.to_string(),
            want: Want::PageFault("writing", Some(addr)),
        });
    }
    v
}

fn transfers() -> Vec<Attack> {
    let gp = Want::GeneralProtection;
    let sigreturn = Want::Reason("sigreturn");
    vec![
        attack(A64, "ret-noncanonical", None, gp),
        attack(A64, "jmp-noncanonical", None, gp),
        attack(A64, "sigreturn-forged", None, sigreturn),
        attack(A32, "sigreturn-forged", None, sigreturn),
        attack(A64, "ljmp-ring0", None, gp),
        attack(A32, "ljmp-ring0", None, gp),
        attack(A64, "ljmp-tss", None, gp),
        attack(A32, "ljmp-tss", None, gp),
        attack(A64, "ljmp-ldt", None, gp),
        attack(A64, "mov-ss-null", None, gp),
        attack(A32, "mov-ss-null", None, gp),
        attack(A64, "mov-ss-ring0", None, gp),
        attack(A64, "mov-ds-ring0", None, gp),
        attack(A32, "mov-ds-ring0", None, gp),
    ]
}

/// rt_sigreturn over frames that are good but for one thing (x86-64), and
/// the good frame itself, which must resume where it says; signals whose
/// handler or restorer is outside user space, or whose alternate stack is
/// not mapped.
fn forged_frames() -> Vec<Attack> {
    vec![
        attack(A64, "sigret-ok", None, Want::Exit0),
        attack(
            A64,
            "sigret-rip-rt",
            None,
            Want::Reason("outside user space"),
        ),
        attack(A64, "sigret-cs", None, Want::Reason("code segment")),
        attack(A64, "sigret-ss", None, Want::Reason("stack segment")),
        attack(
            A64,
            "sigret-mxcsr",
            None,
            Want::Reason("reserved MXCSR bits"),
        ),
        attack(A64, "handler-noncan", None, Want::GeneralProtection),
        attack(
            A64,
            "handler-rt",
            None,
            Want::PageFault("executing", Some(0xffff_ffff_8010_0000)),
        ),
        attack(A64, "restorer-noncan", None, Want::GeneralProtection),
        attack(A64, "altstack-wild", None, Want::Reason("signal frame")),
    ]
}

fn data_and_exhaustion() -> Vec<Attack> {
    let exec = Want::PageFault("executing", None);
    vec![
        attack(A64, "exec-stack", None, exec),
        attack(A32, "exec-stack", None, exec),
        attack(A64, "exec-heap", None, exec),
        attack(A32, "exec-heap", None, exec),
        attack(A64, "exec-mprotect", None, Want::Exit0),
        attack(A32, "exec-mprotect", None, Want::Exit0),
        attack(A64, "fds", None, Want::Exit0Limits),
        attack(A32, "fds", None, Want::Exit0Limits),
        attack(
            A64,
            "recurse",
            None,
            Want::Reason("#PF page fault writing 0x"),
        ),
        attack(
            A32,
            "recurse",
            None,
            Want::Reason("#PF page fault writing 0x"),
        ),
    ]
}

/// i386 TLS segments (set_thread_area) loaded into SS or FS, then made not
/// present (refused: EINVAL, as Linux) or deleted while loaded (the return to
/// user mode or the next FS reload meets a null descriptor); and a deleted
/// one named as GS by the sigcontext a handler returns (rt_sigreturn loads
/// null, as Linux).
fn tls_segments() -> Vec<Attack> {
    vec![
        attack(A32, "tls-ss", None, Want::Exit0),
        attack(A32, "tls-fs", None, Want::Exit0),
        attack(A32, "tls-ss-clear", None, Want::GeneralProtection),
        attack(A32, "tls-fs-clear", None, Want::Exit0),
        attack(A32, "gs-empty-tls", None, Want::Exit0),
    ]
}

#[test]
fn tls_segments_pulled_from_under_a_process_end_only_it() {
    let a = tls_segments();
    run_attacks(Cpu::Max, &a);
    run_attacks(Cpu::Qemu64, &a);
}

#[test]
fn privileged_instructions_end_only_the_offender() {
    let a = privileged();
    run_attacks(Cpu::Max, &a);
    run_attacks(Cpu::Qemu64, &a);
}

#[test]
fn writes_to_descriptor_and_page_tables_fault_through_every_mapping() {
    let a = tables();
    run_attacks(Cpu::Max, &a);
    run_attacks(Cpu::Qemu64, &a);
}

#[test]
fn non_canonical_targets_forged_frames_and_bad_selectors_end_only_the_offender() {
    let a = transfers();
    run_attacks(Cpu::Max, &a);
    run_attacks(Cpu::Qemu64, &a);
}

/// The checks are the runtime's own (no CPU feature is involved): one CPU.
#[test]
fn forged_sigreturn_frames_and_wild_handlers_end_only_the_offender_naming_what_was_wrong() {
    run_attacks(Cpu::Max, &forged_frames());
}

#[test]
fn data_is_not_executable_and_exhaustion_ends_only_the_offender() {
    let a = data_and_exhaustion();
    run_attacks(Cpu::Max, &a);
    run_attacks(Cpu::Qemu64, &a);
}
