//! demo32: the compat-mode (i386) program. It spins in a hand-written CRC
//! loop, `perch_demo32_crc_loop`, that uses only 32-bit registers, and
//! yields with `int 0x80` (i386 `sched_yield`) every 20000 rounds, so its
//! samples show ABI 1 with R8 to R15 at zero.
//!
//! `demo32` runs until the run ends.

#[cfg(target_arch = "x86")]
core::arch::global_asm!(
    r#"
    .text
    .balign 16
    .global perch_demo32_main
    .type perch_demo32_main, @function
perch_demo32_main:
    mov esi, 0x9e3779b9
1:
    mov ecx, 20000
    .size perch_demo32_main, . - perch_demo32_main
    .global perch_demo32_crc_loop
    .type perch_demo32_crc_loop, @function
perch_demo32_crc_loop:
    mov eax, esi
    shr eax, 1
    jnc 2f
    xor eax, 0xedb88320
2:
    mov esi, eax
    dec ecx
    jnz perch_demo32_crc_loop
    mov eax, 158
    int 0x80
    jmp 1b
    .size perch_demo32_crc_loop, . - perch_demo32_crc_loop
    "#
);

#[cfg(target_arch = "x86")]
unsafe extern "C" {
    /// Spins and yields forever.
    fn perch_demo32_main() -> !;
}

#[cfg(target_arch = "x86")]
fn main() {
    println!("demo32: appliance task ready");
    // SAFETY: perch_demo32_main never returns and touches no memory; it
    // clobbers registers of a call that never comes back.
    unsafe { perch_demo32_main() }
}

#[cfg(not(target_arch = "x86"))]
fn main() {
    eprintln!("demo32 is an i386 program");
    std::process::exit(2);
}
