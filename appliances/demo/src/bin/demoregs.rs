//! demoregs: spins in `perch_demoregs_spin` with a known pattern in every
//! general-purpose register but RCX (the loop counter) and RSP: AX 0x11..,
//! BX 0x22.., DX 0x44.., SI 0x55.., DI 0x66.., BP 0x77.., R8 0x88..
//! through R14 0xee.. (each byte repeated eight times) and R15 0xf0f0..,
//! so `perf script -F uregs` can be checked exactly. Between spins it
//! yields (`sched_yield`) and reloads the patterns.
//!
//! `demoregs` runs until the run ends.

#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    r#"
    .text
    .balign 16
    .global perch_demoregs_main
    .type perch_demoregs_main, @function
perch_demoregs_main:
    movabs rax, 0x1111111111111111
    movabs rbx, 0x2222222222222222
    movabs rdx, 0x4444444444444444
    movabs rsi, 0x5555555555555555
    movabs rdi, 0x6666666666666666
    movabs rbp, 0x7777777777777777
    movabs r8, 0x8888888888888888
    movabs r9, 0x9999999999999999
    movabs r10, 0xaaaaaaaaaaaaaaaa
    movabs r11, 0xbbbbbbbbbbbbbbbb
    movabs r12, 0xcccccccccccccccc
    movabs r13, 0xdddddddddddddddd
    movabs r14, 0xeeeeeeeeeeeeeeee
    movabs r15, 0xf0f0f0f0f0f0f0f0
    mov ecx, 50000
    .size perch_demoregs_main, . - perch_demoregs_main
    .global perch_demoregs_spin
    .type perch_demoregs_spin, @function
perch_demoregs_spin:
    dec rcx
    jnz perch_demoregs_spin
    .size perch_demoregs_spin, . - perch_demoregs_spin
    .global perch_demoregs_yield
    .type perch_demoregs_yield, @function
perch_demoregs_yield:
    mov eax, 24
    syscall
    jmp perch_demoregs_main
    .size perch_demoregs_yield, . - perch_demoregs_yield
    "#
);

#[cfg(target_arch = "x86_64")]
unsafe extern "C" {
    /// Loads the patterns, spins, yields, forever.
    fn perch_demoregs_main() -> !;
}

#[cfg(target_arch = "x86_64")]
fn main() {
    println!("demoregs: appliance task ready");
    // SAFETY: perch_demoregs_main never returns and touches no memory; it
    // clobbers every register but RSP, which is fine for a call that never
    // comes back.
    unsafe { perch_demoregs_main() }
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    eprintln!("demoregs is an x86_64 program");
    std::process::exit(2);
}
