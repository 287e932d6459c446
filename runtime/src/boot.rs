//! Boot entry: the multiboot2 header, the PVH note, the 32-bit entry that
//! builds identity page tables and enters long mode, and reading the kernel
//! command line from whichever protocol started us.

use arch_x86::bootinfo::{self, BootProtocol, PvhStartInfo};

core::arch::global_asm!(
    r#"
    .section .multiboot2, "a"
    .balign 8
perch_mb2_header:
    .long 0xe85250d6
    .long 0
    .long perch_mb2_header_end - perch_mb2_header
    .long 0x100000000 - (0xe85250d6 + (perch_mb2_header_end - perch_mb2_header))
    .short 0
    .short 0
    .long 8
perch_mb2_header_end:

    .section .note.pvh, "a", @note
    .balign 4
    .long 4
    .long 4
    .long 18
    .asciz "Xen"
    .balign 4
    .long perch_start32

    .section .bss.perch_boot, "aw", @nobits
    .balign 4096
perch_boot_pml4: .skip 4096
perch_boot_pdpt: .skip 4096
perch_boot_pd:   .skip 4 * 4096
    .balign 16
perch_boot_stack_bottom: .skip 65536
    .global perch_boot_stack_top
perch_boot_stack_top:

    .section .rodata.perch_boot, "a"
    .balign 8
perch_boot_gdt:
    .quad 0
    .quad 0x00af9a000000ffff
    .quad 0x00cf92000000ffff
perch_boot_gdt_ptr:
    .short 23
    .long perch_boot_gdt

    .section .text.boot, "ax"
    .code32
    .global perch_start32
perch_start32:
    cli
    cld
    mov ebp, eax
    mov esi, ebx
    xor eax, eax
    mov edi, offset __bss_start
    mov ecx, offset __bss_end
    sub ecx, edi
    rep stosb
    mov edi, offset __user_bss_start
    mov ecx, offset __user_bss_end
    sub ecx, edi
    rep stosb
    mov esp, offset perch_boot_stack_top

    mov edi, offset perch_boot_pd
    xor ecx, ecx
2:
    mov eax, ecx
    shl eax, 21
    or eax, 0x83
    mov [edi + ecx * 8], eax
    mov edx, ecx
    shr edx, 11
    mov [edi + ecx * 8 + 4], edx
    inc ecx
    cmp ecx, 2048
    jne 2b

    mov edi, offset perch_boot_pdpt
    mov eax, offset perch_boot_pd
    or eax, 3
    mov [edi], eax
    add eax, 4096
    mov [edi + 8], eax
    add eax, 4096
    mov [edi + 16], eax
    add eax, 4096
    mov [edi + 24], eax
    mov eax, offset perch_boot_pdpt
    or eax, 3
    mov [perch_boot_pml4], eax

    mov eax, offset perch_boot_pml4
    mov cr3, eax
    mov eax, cr4
    or eax, 0x20
    mov cr4, eax
    mov ecx, 0xc0000080
    rdmsr
    or eax, 0x101
    wrmsr
    mov eax, cr0
    or eax, 0x80010001
    mov cr0, eax
    lgdt [perch_boot_gdt_ptr]
    push 0x08
    mov eax, offset perch_start64
    push eax
    retf

    .code64
perch_start64:
    mov ax, 0x10
    mov ds, ax
    mov es, ax
    mov ss, ax
    xor eax, eax
    mov fs, ax
    mov gs, ax
    lea rsp, [rip + perch_boot_stack_top]
    mov edi, ebp
    xor ebp, ebp
    call {kmain}
    ud2
    "#,
    kmain = sym crate::perch_kmain,
);

/// Maximum command-line length kept.
pub const CMDLINE_MAX: usize = 512;

/// What the loader told us.
pub struct BootInfo {
    /// The protocol that started the runtime.
    pub protocol: BootProtocol,
    cmdline: [u8; CMDLINE_MAX],
    cmdline_len: usize,
    /// True when the command line was longer than [`CMDLINE_MAX`] and was cut.
    pub cmdline_truncated: bool,
}

impl BootInfo {
    /// The command line (lossy: invalid UTF-8 yields an empty line).
    pub fn cmdline(&self) -> &str {
        core::str::from_utf8(&self.cmdline[..self.cmdline_len]).unwrap_or("")
    }
}

/// Reads the protocol and command line from the entry registers.
///
/// Must run before the boot identity mapping is replaced; everything is
/// copied out so the loader's memory is not needed afterwards.
pub fn read_boot_info(magic: u32, info: u32) -> BootInfo {
    let mut out = BootInfo {
        protocol: BootProtocol::Unknown,
        cmdline: [0; CMDLINE_MAX],
        cmdline_len: 0,
        cmdline_truncated: false,
    };
    if info == 0 {
        return out;
    }
    // SAFETY: a non-zero `info` is a physical address from the loader, identity
    // mapped (0-4 GiB) by the boot page tables; reading one word is harmless.
    let first = unsafe { core::ptr::read_volatile(info as usize as *const u32) };
    out.protocol = BootProtocol::detect(magic, Some(first));
    let line: &[u8] = match out.protocol {
        BootProtocol::Pvh => {
            // SAFETY: the PVH magic matched, so `info` points at hvm_start_info.
            let si = unsafe { core::ptr::read_unaligned(info as usize as *const PvhStartInfo) };
            if si.cmdline_paddr == 0 || si.cmdline_paddr >= 1 << 32 {
                &[]
            } else {
                // SAFETY: the loader put a NUL-terminated string at cmdline_paddr
                // (identity mapped); we read at most CMDLINE_MAX + 1 bytes of it.
                let raw = unsafe {
                    core::slice::from_raw_parts(
                        si.cmdline_paddr as usize as *const u8,
                        CMDLINE_MAX + 1,
                    )
                };
                bootinfo::until_nul(raw)
            }
        }
        BootProtocol::Multiboot2 => {
            let total = first as usize;
            if !(8..=1 << 20).contains(&total) {
                &[]
            } else {
                // SAFETY: the multiboot2 information structure is `total` bytes
                // at `info`, identity mapped.
                let raw = unsafe { core::slice::from_raw_parts(info as usize as *const u8, total) };
                bootinfo::multiboot2_cmdline(raw)
                    .ok()
                    .flatten()
                    .unwrap_or(&[])
            }
        }
        BootProtocol::Unknown => &[],
    };
    let n = line.len().min(CMDLINE_MAX);
    out.cmdline_truncated = line.len() > CMDLINE_MAX;
    out.cmdline[..n].copy_from_slice(&line[..n]);
    out.cmdline_len = n;
    out
}
