//! Hand-written appliance programs used by the self-test: 64-bit and
//! compat-mode tasks that make system calls, provoke faults, and hold known
//! register patterns while NMIs arrive. All of it lives in `.user.text` /
//! `.user.data`, mapped user-accessible.

use crate::abi::perch::{SYS_CLOCK, SYS_EXIT, SYS_SPIN, SYS_WRITE, SYS_YIELD};

/// The pattern a task loads into GPR `i` (`TrapFrame::gprs` order), 64-bit.
pub const fn pattern64(i: usize) -> u64 {
    0x5a00_0000_0000_0000
        | ((i as u64 + 1) << 48)
        | ((i as u64 + 1) * 0x0101_0101_0101) & 0xffff_ffff_ffff
}

/// The pattern the second thread of the two-thread program loads into GPR
/// `i`: the complement of [`pattern64`].
pub const fn second_pattern64(i: usize) -> u64 {
    !pattern64(i)
}

/// The 32-bit pattern a compat task loads into GPR `i` (only 0..=6 exist there).
pub const fn pattern32(i: usize) -> u64 {
    0xc300_0000 | ((i as u64 + 1) * 0x0001_0101)
}

/// Pattern user RSP for the register test (never dereferenced).
pub const PATTERN_RSP64: u64 = 0x0000_7e57_0000_1230;
/// Pattern user ESP for the compat register test.
pub const PATTERN_ESP32: u32 = 0x7e57_1230;
/// Argument given to `spin` by the in-syscall tests (TSC cycles; large: the
/// NMI recorder ends the spin once it has its captures).
pub const SPIN_ARG: u64 = 3_000_000_000;
/// Exit code of the hello tasks.
pub const HELLO64_EXIT: i64 = 42;
/// Exit code of the compat hello task.
pub const HELLO32_EXIT: i64 = -7;

core::arch::global_asm!(
    r#"
    .section .user.data.selftest, "aw"
perch_st_msg64: .ascii "hello from a 64-bit ring-3 task\n"
perch_st_msg64_end:
perch_st_msg32: .ascii "hello from a compat-mode ring-3 task\n"
perch_st_msg32_end:
    .balign 16
    .global perch_st_data_code
perch_st_data_code:
    .byte 0xc3

    .section .user.text.selftest, "ax"
    .code64
    .balign 16
    .global perch_st_hello64
perch_st_hello64:
    lea rdi, [rip + perch_st_msg64]
    lea rsi, [rip + perch_st_msg64_end]
    sub rsi, rdi
    mov eax, {write}
    syscall
    mov eax, {clock}
    syscall
    mov eax, {yld}
    syscall
    mov edi, {hello64}
    mov eax, {exit}
    syscall
    ud2

    .global perch_st_fault_de
perch_st_fault_de:
    xor edx, edx
    xor eax, eax
    xor ecx, ecx
    div ecx
    ud2
    .global perch_st_fault_ud
perch_st_fault_ud:
    ud2
    .global perch_st_fault_bp
perch_st_fault_bp:
    int3
    ud2
    .global perch_st_fault_rdmsr
perch_st_fault_rdmsr:
    mov ecx, 0x10
    rdmsr
    ud2
    .global perch_st_spin_forever
perch_st_spin_forever:
    inc rax
    jmp perch_st_spin_forever

    .global perch_st_fault_hlt
perch_st_fault_hlt:
    hlt
    ud2
    .global perch_st_fault_noncanonical
perch_st_fault_noncanonical:
    movabs rax, 0x8000000000000000
    mov rax, [rax]
    ud2
    .global perch_st_fault_null
perch_st_fault_null:
    xor eax, eax
    mov rax, [rax]
    ud2
    .global perch_st_fault_kernel_read
perch_st_fault_kernel_read:
    movabs rbx, offset {kmain}
    mov rax, [rbx]
    ud2
    .global perch_st_fault_text_write
perch_st_fault_text_write:
    lea rbx, [rip + perch_st_fault_text_write]
    mov byte ptr [rbx], 0
    ud2
    .global perch_st_fault_nx
perch_st_fault_nx:
    lea rbx, [rip + perch_st_data_code]
    call rbx
    ud2
    .global perch_st_fault_ldt
perch_st_fault_ldt:
    mov eax, 7
    mov ds, ax
    ud2

    // Spins with the registers it started with (its spec's), touching
    // none of them until it exits: one copy a CPU, each with its own.
    .balign 16
    .global perch_st_cpu_spin
perch_st_cpu_spin:
    .global perch_st_cpu_spin_loop
perch_st_cpu_spin_loop:
    cmp dword ptr [rip + perch_user_stop], 0
    jne 3f
    dec qword ptr [rip + perch_user_budget]
    jnz perch_st_cpu_spin_loop
    .global perch_st_cpu_spin_loop_end
perch_st_cpu_spin_loop_end:
3:
    xor edi, edi
    mov eax, {exit}
    syscall
    ud2

    .balign 16
    .global perch_st_regs64
perch_st_regs64:
    movabs rax, {p0}
    movabs rbx, {p1}
    movabs rcx, {p2}
    movabs rdx, {p3}
    movabs rsi, {p4}
    movabs rdi, {p5}
    movabs rbp, {p6}
    movabs r8, {p7}
    movabs r9, {p8}
    movabs r10, {p9}
    movabs r11, {p10}
    movabs r12, {p11}
    movabs r13, {p12}
    movabs r14, {p13}
    movabs r15, {p14}
    movabs rsp, {prsp}
    .global perch_st_regs64_loop
perch_st_regs64_loop:
    cmp dword ptr [rip + perch_user_stop], 0
    jne 3f
    dec qword ptr [rip + perch_user_budget]
    jnz perch_st_regs64_loop
    .global perch_st_regs64_loop_end
perch_st_regs64_loop_end:
3:
    xor edi, edi
    mov eax, {exit}
    syscall
    ud2

    .balign 16
    .global perch_st_spin64
perch_st_spin64:
    movabs rbx, {p1}
    movabs rdx, {p3}
    movabs rsi, {p4}
    movabs rbp, {p6}
    movabs r8, {p7}
    movabs r9, {p8}
    movabs r10, {p9}
    movabs r12, {p11}
    movabs r13, {p12}
    movabs r14, {p13}
    movabs r15, {p14}
    movabs rsp, {prsp}
    mov edi, {spin_arg}
    mov eax, {spin}
    syscall
    .global perch_st_spin64_ret
perch_st_spin64_ret:
    xor edi, edi
    mov eax, {exit}
    syscall
    ud2

    .code32
    .balign 16
    .global perch_st_hello32
perch_st_hello32:
    mov eax, {write}
    mov ebx, offset perch_st_msg32
    mov ecx, offset perch_st_msg32_end
    sub ecx, ebx
    int 0x80
    mov eax, {yld}
    int 0x80
    mov eax, {exit}
    mov ebx, {hello32}
    int 0x80
    ud2

    .global perch_st_fault32_ud
perch_st_fault32_ud:
    ud2
    .global perch_st_fault32_ldt
perch_st_fault32_ldt:
    mov eax, 7
    mov ds, ax
    ud2
    .global perch_st_fault32_pf
perch_st_fault32_pf:
    xor eax, eax
    mov eax, [eax]
    ud2
    .global perch_st_fault32_de
perch_st_fault32_de:
    xor edx, edx
    xor eax, eax
    xor ecx, ecx
    div ecx
    ud2

    .balign 16
    .global perch_st_regs32
perch_st_regs32:
    mov eax, {q0}
    mov ebx, {q1}
    mov ecx, {q2}
    mov edx, {q3}
    mov esi, {q4}
    mov edi, {q5}
    mov ebp, {q6}
    mov esp, {pesp}
    .global perch_st_regs32_loop
perch_st_regs32_loop:
    cmp dword ptr [perch_user_stop], 0
    jne 3f
    dec dword ptr [perch_user_budget]
    jnz perch_st_regs32_loop
    .global perch_st_regs32_loop_end
perch_st_regs32_loop_end:
3:
    mov eax, {exit}
    xor ebx, ebx
    int 0x80
    ud2

    .balign 16
    .global perch_st_spin32
perch_st_spin32:
    mov ecx, {q2}
    mov edx, {q3}
    mov esi, {q4}
    mov edi, {q5}
    mov ebp, {q6}
    mov esp, {pesp}
    mov ebx, {spin_arg}
    mov eax, {spin}
    int 0x80
    .global perch_st_spin32_ret
perch_st_spin32_ret:
    mov eax, {exit}
    xor ebx, ebx
    int 0x80
    ud2
    .global perch_st_end
perch_st_end:
    .code64
    "#,
    write = const SYS_WRITE,
    clock = const SYS_CLOCK,
    yld = const SYS_YIELD,
    exit = const SYS_EXIT,
    spin = const SYS_SPIN,
    spin_arg = const SPIN_ARG,
    hello64 = const HELLO64_EXIT,
    hello32 = const HELLO32_EXIT,
    kmain = sym crate::perch_kmain,
    p0 = const pattern64(0),
    p1 = const pattern64(1),
    p2 = const pattern64(2),
    p3 = const pattern64(3),
    p4 = const pattern64(4),
    p5 = const pattern64(5),
    p6 = const pattern64(6),
    p7 = const pattern64(7),
    p8 = const pattern64(8),
    p9 = const pattern64(9),
    p10 = const pattern64(10),
    p11 = const pattern64(11),
    p12 = const pattern64(12),
    p13 = const pattern64(13),
    p14 = const pattern64(14),
    prsp = const PATTERN_RSP64,
    q0 = const pattern32(0),
    q1 = const pattern32(1),
    q2 = const pattern32(2),
    q3 = const pattern32(3),
    q4 = const pattern32(4),
    q5 = const pattern32(5),
    q6 = const pattern32(6),
    pesp = const PATTERN_ESP32,
);

/// Address the loaded self-test programs are linked at (their code).
pub const LOADED_CODE: u64 = 0x40_0100;
/// Address of their data: the loop counter at +0, scratch at +8, a 4 KiB
/// buffer at +0x1000.
pub const LOADED_DATA: u64 = 0x40_1000;

// The self-test's loaded programs: raw code for ELFs the self-test builds
// in memory and starts through the program loader, as any program from
// the boot archive. Linked for LOADED_CODE, with the data page at
// LOADED_DATA; each loops until its counter there reaches 0, then exits
// with Linux's exit system call. Kept as read-only data of the runtime
// (copied into the ELF), never executed in place.
core::arch::global_asm!(
    r#"
    .section .rodata.perch_loaded, "a"
    .code64
    .global perch_ld_regs64
perch_ld_regs64:
    movabs rax, {p0}
    movabs rbx, {p1}
    movabs rcx, {p2}
    movabs rdx, {p3}
    movabs rsi, {p4}
    movabs rdi, {p5}
    movabs rbp, {p6}
    movabs r8, {p7}
    movabs r9, {p8}
    movabs r10, {p9}
    movabs r11, {p10}
    movabs r12, {p11}
    movabs r13, {p12}
    movabs r14, {p13}
    movabs r15, {p14}
    movabs rsp, {prsp}
    .global perch_ld_regs64_loop
perch_ld_regs64_loop:
    dec qword ptr [{data}]
    jnz perch_ld_regs64_loop
    .global perch_ld_regs64_loop_end
perch_ld_regs64_loop_end:
    mov eax, 60
    xor edi, edi
    syscall
    ud2
    .global perch_ld_regs64_end
perch_ld_regs64_end:

    .global perch_ld_sys64
perch_ld_sys64:
    movabs rbx, {p1}
    movabs rbp, {p6}
    movabs r8, {p7}
    movabs r9, {p8}
    movabs r10, {p9}
    movabs r12, {p11}
    movabs r13, {p12}
    movabs r14, {p13}
    movabs r15, {p14}
    movabs rsp, {prsp}
perch_ld_sys64_loop:
    mov eax, 318
    mov edi, {buf}
    mov esi, 4096
    xor edx, edx
    syscall
    .global perch_ld_sys64_ret
perch_ld_sys64_ret:
    dec qword ptr [{data}]
    jnz perch_ld_sys64_loop
    mov eax, 60
    xor edi, edi
    syscall
    ud2
    .global perch_ld_sys64_end
perch_ld_sys64_end:

    .global perch_ld_threads64
perch_ld_threads64:
    mov rax, qword ptr [{data}]
    mov qword ptr [{data} + 8], rax
    mov eax, 56
    mov edi, 0x50f00
    mov esi, {tstack}
    xor edx, edx
    xor r10d, r10d
    xor r8d, r8d
    syscall
    test rax, rax
    jz perch_ld_threads64_child
    js perch_ld_threads64_fail
    movabs rax, {p0}
    movabs rbx, {p1}
    movabs rcx, {p2}
    movabs rdx, {p3}
    movabs rsi, {p4}
    movabs rdi, {p5}
    movabs rbp, {p6}
    movabs r8, {p7}
    movabs r9, {p8}
    movabs r10, {p9}
    movabs r11, {p10}
    movabs r12, {p11}
    movabs r13, {p12}
    movabs r14, {p13}
    movabs r15, {p14}
    movabs rsp, {prsp}
    .global perch_ld_threads64_loop
perch_ld_threads64_loop:
    dec qword ptr [{data}]
    jnz perch_ld_threads64_loop
    .global perch_ld_threads64_loop_end
perch_ld_threads64_loop_end:
    cmp qword ptr [{data} + 8], 0
    jne perch_ld_threads64_loop_end
    mov eax, 231
    xor edi, edi
    syscall
    ud2
perch_ld_threads64_fail:
    mov eax, 231
    mov edi, 1
    syscall
    ud2
perch_ld_threads64_child:
    movabs rax, {c0}
    movabs rbx, {c1}
    movabs rcx, {c2}
    movabs rdx, {c3}
    movabs rsi, {c4}
    movabs rdi, {c5}
    movabs rbp, {c6}
    movabs r8, {c7}
    movabs r9, {c8}
    movabs r10, {c9}
    movabs r11, {c10}
    movabs r12, {c11}
    movabs r13, {c12}
    movabs r14, {c13}
    movabs r15, {c14}
    movabs rsp, {crsp}
    .global perch_ld_threads64_child_loop
perch_ld_threads64_child_loop:
    dec qword ptr [{data} + 8]
    jnz perch_ld_threads64_child_loop
    .global perch_ld_threads64_child_loop_end
perch_ld_threads64_child_loop_end:
    mov eax, 60
    xor edi, edi
    syscall
    ud2
    .global perch_ld_threads64_end
perch_ld_threads64_end:

    .global perch_ld_space64
perch_ld_space64:
    mov rax, qword ptr [{data}]
    mov qword ptr [{data} + 8], rax
    mov ebx, 3
perch_ld_space64_yield:
    mov eax, 24
    syscall
    dec ebx
    jnz perch_ld_space64_yield
    mov eax, 1
    mov edi, 1
    movabs rsi, 0xffffffff80100000
    mov edx, 16
    syscall
    mov rdi, qword ptr [{data} + 8]
    cmp rax, -14
    je perch_ld_space64_exit
    add rdi, 100
perch_ld_space64_exit:
    mov eax, 60
    syscall
    ud2
    .global perch_ld_space64_end
perch_ld_space64_end:

    .code32
    .global perch_ld_regs32
perch_ld_regs32:
    mov eax, {q0}
    mov ebx, {q1}
    mov ecx, {q2}
    mov edx, {q3}
    mov esi, {q4}
    mov edi, {q5}
    mov ebp, {q6}
    mov esp, {pesp}
    .global perch_ld_regs32_loop
perch_ld_regs32_loop:
    dec dword ptr [{data}]
    jnz perch_ld_regs32_loop
    .global perch_ld_regs32_loop_end
perch_ld_regs32_loop_end:
    mov eax, 1
    xor ebx, ebx
    int 0x80
    ud2
    .global perch_ld_regs32_end
perch_ld_regs32_end:

    .global perch_ld_sys32
perch_ld_sys32:
    mov esi, {q4}
    mov edi, {q5}
    mov ebp, {q6}
    mov esp, {pesp}
perch_ld_sys32_loop:
    mov eax, 355
    mov ebx, {buf}
    mov ecx, 4096
    xor edx, edx
    int 0x80
    .global perch_ld_sys32_ret
perch_ld_sys32_ret:
    dec dword ptr [{data}]
    jnz perch_ld_sys32_loop
    mov eax, 1
    xor ebx, ebx
    int 0x80
    ud2
    .global perch_ld_sys32_end
perch_ld_sys32_end:
    .code64
    "#,
    data = const LOADED_DATA,
    buf = const LOADED_DATA + 0x1000,
    p0 = const pattern64(0),
    p1 = const pattern64(1),
    p2 = const pattern64(2),
    p3 = const pattern64(3),
    p4 = const pattern64(4),
    p5 = const pattern64(5),
    p6 = const pattern64(6),
    p7 = const pattern64(7),
    p8 = const pattern64(8),
    p9 = const pattern64(9),
    p10 = const pattern64(10),
    p11 = const pattern64(11),
    p12 = const pattern64(12),
    p13 = const pattern64(13),
    p14 = const pattern64(14),
    prsp = const PATTERN_RSP64,
    tstack = const LOADED_DATA + 0x3000,
    c0 = const second_pattern64(0),
    c1 = const second_pattern64(1),
    c2 = const second_pattern64(2),
    c3 = const second_pattern64(3),
    c4 = const second_pattern64(4),
    c5 = const second_pattern64(5),
    c6 = const second_pattern64(6),
    c7 = const second_pattern64(7),
    c8 = const second_pattern64(8),
    c9 = const second_pattern64(9),
    c10 = const second_pattern64(10),
    c11 = const second_pattern64(11),
    c12 = const second_pattern64(12),
    c13 = const second_pattern64(13),
    c14 = const second_pattern64(14),
    crsp = const !PATTERN_RSP64,
    q0 = const pattern32(0),
    q1 = const pattern32(1),
    q2 = const pattern32(2),
    q3 = const pattern32(3),
    q4 = const pattern32(4),
    q5 = const pattern32(5),
    q6 = const pattern32(6),
    pesp = const PATTERN_ESP32,
);

unsafe extern "C" {
    static perch_ld_regs64: u8;
    static perch_ld_regs64_loop: u8;
    static perch_ld_regs64_loop_end: u8;
    static perch_ld_regs64_end: u8;
    static perch_ld_sys64: u8;
    static perch_ld_sys64_ret: u8;
    static perch_ld_sys64_end: u8;
    static perch_ld_threads64: u8;
    static perch_ld_threads64_loop: u8;
    static perch_ld_threads64_loop_end: u8;
    static perch_ld_threads64_child_loop: u8;
    static perch_ld_threads64_child_loop_end: u8;
    static perch_ld_threads64_end: u8;
    static perch_ld_space64: u8;
    static perch_ld_space64_end: u8;
    static perch_ld_regs32: u8;
    static perch_ld_regs32_loop: u8;
    static perch_ld_regs32_loop_end: u8;
    static perch_ld_regs32_end: u8;
    static perch_ld_sys32: u8;
    static perch_ld_sys32_ret: u8;
    static perch_ld_sys32_end: u8;
}

/// One loaded self-test program: its code bytes and where, relative to
/// its start, its marks are (loop start and end, or the system call's
/// return address).
#[derive(Clone, Copy, Debug)]
pub struct LoadedCode {
    /// The code.
    pub code: &'static [u8],
    /// Offsets of the marks from the start of the code.
    pub marks: (u64, u64),
}

fn loaded(start: u64, end: u64, marks: (u64, u64)) -> LoadedCode {
    // SAFETY: `start..end` brackets bytes of the runtime's read-only data
    // (the section above), mapped and never written.
    let code = unsafe { core::slice::from_raw_parts(start as *const u8, (end - start) as usize) };
    LoadedCode {
        code,
        marks: (marks.0 - start, marks.1 - start),
    }
}

/// The 64-bit register-pattern program (marks: its spin loop).
pub fn loaded_regs64() -> LoadedCode {
    let s = crate::abs_addr!(perch_ld_regs64);
    let (a, b) = (
        crate::abs_addr!(perch_ld_regs64_loop),
        crate::abs_addr!(perch_ld_regs64_loop_end),
    );
    loaded(s, crate::abs_addr!(perch_ld_regs64_end), (a, b))
}

/// The 64-bit program that loops on `getrandom` of 4 KiB (marks: the return address twice).
pub fn loaded_sys64() -> LoadedCode {
    let r = crate::abs_addr!(perch_ld_sys64_ret);
    loaded(
        crate::abs_addr!(perch_ld_sys64),
        crate::abs_addr!(perch_ld_sys64_end),
        (r, r),
    )
}

/// The 64-bit program of two threads: the first `clone`s the second
/// (Go's flags: CLONE_VM, FS, FILES, SIGHAND, SYSVSEM and THREAD), then
/// each spins with its own register patterns ([`pattern64`] and
/// [`second_pattern64`]) until its counter (the data page's first word,
/// copied to the second for the other thread) runs out; the first waits
/// for the second, then `exit_group(0)`. Marks: the first thread's spin
/// loop; the second's is returned beside.
pub fn loaded_threads64() -> (LoadedCode, (u64, u64)) {
    let s = crate::abs_addr!(perch_ld_threads64);
    let code = loaded(
        s,
        crate::abs_addr!(perch_ld_threads64_end),
        (
            crate::abs_addr!(perch_ld_threads64_loop),
            crate::abs_addr!(perch_ld_threads64_loop_end),
        ),
    );
    let child = (
        crate::abs_addr!(perch_ld_threads64_child_loop) - s,
        crate::abs_addr!(perch_ld_threads64_child_loop_end) - s,
    );
    (code, child)
}

/// The 64-bit program that keeps its data-page value across yields and
/// exits with it (plus 100 unless `write` of a runtime pointer gave EFAULT).
pub fn loaded_space64() -> LoadedCode {
    let s = crate::abs_addr!(perch_ld_space64);
    loaded(s, crate::abs_addr!(perch_ld_space64_end), (s, s))
}

/// The compat register-pattern program (marks: its spin loop).
pub fn loaded_regs32() -> LoadedCode {
    let s = crate::abs_addr!(perch_ld_regs32);
    let (a, b) = (
        crate::abs_addr!(perch_ld_regs32_loop),
        crate::abs_addr!(perch_ld_regs32_loop_end),
    );
    loaded(s, crate::abs_addr!(perch_ld_regs32_end), (a, b))
}

/// The compat program that loops on `getrandom` of 4 KiB through `int 0x80`.
pub fn loaded_sys32() -> LoadedCode {
    let r = crate::abs_addr!(perch_ld_sys32_ret);
    loaded(
        crate::abs_addr!(perch_ld_sys32),
        crate::abs_addr!(perch_ld_sys32_end),
        (r, r),
    )
}

macro_rules! user_symbols {
    ($($name:ident),* $(,)?) => {
        unsafe extern "C" {
            $(
                #[doc = concat!("The appliance program `", stringify!($name), "`.")]
                pub fn $name();
            )*
        }

        /// The named appliance entry points (for reports).
        pub fn symbols() -> impl Iterator<Item = (u64, &'static str)> {
            [$(($name as *const () as u64, stringify!($name))),*].into_iter()
        }
    };
}

user_symbols!(
    perch_st_hello64,
    perch_st_cpu_spin,
    perch_st_cpu_spin_loop,
    perch_st_cpu_spin_loop_end,
    perch_st_fault_de,
    perch_st_fault_ud,
    perch_st_fault_bp,
    perch_st_fault_rdmsr,
    perch_st_fault_hlt,
    perch_st_spin_forever,
    perch_st_fault_noncanonical,
    perch_st_fault_null,
    perch_st_fault_kernel_read,
    perch_st_fault_text_write,
    perch_st_fault_nx,
    perch_st_fault_ldt,
    perch_st_regs64,
    perch_st_regs64_loop,
    perch_st_regs64_loop_end,
    perch_st_spin64,
    perch_st_spin64_ret,
    perch_st_hello32,
    perch_st_fault32_ud,
    perch_st_fault32_ldt,
    perch_st_fault32_pf,
    perch_st_fault32_de,
    perch_st_regs32,
    perch_st_regs32_loop,
    perch_st_regs32_loop_end,
    perch_st_spin32,
    perch_st_spin32_ret,
    perch_st_end,
    perch_st_data_code,
);

/// Address of an appliance symbol.
pub fn addr(f: unsafe extern "C" fn()) -> u64 {
    f as *const () as u64
}
