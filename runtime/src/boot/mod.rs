//! Boot entry: the multiboot2 header, the PVH note, the 32-bit entry that
//! builds identity page tables and enters long mode, and reading the kernel
//! command line from whichever protocol started us.

use arch_x86::bootinfo::{self, BootProtocol, MemRegion, Module, PvhStartInfo};
use arch_x86::paging::phys_to_virt;

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
perch_boot_pdpt_low: .skip 4096
perch_boot_pdpt_high: .skip 4096
perch_boot_pd:   .skip 4 * 4096
    .balign 16
perch_boot_stack_bottom: .skip 65536
    .global perch_boot_stack_top
perch_boot_stack_top:

    .section .text.boot, "ax"
    .balign 8
perch_boot_gdt:
    .quad 0
    .quad 0x00af9a000000ffff
    .quad 0x00cf92000000ffff
perch_boot_gdt_ptr:
    .short 23
    .long perch_boot_gdt

    .code32
    .global perch_start32
perch_start32:
    cli
    cld
    mov ebp, eax
    mov esi, ebx
    xor eax, eax
    mov edi, offset __bss_phys
    mov ecx, offset __bss_end - {kvma}
    sub ecx, offset __bss_start - {kvma}
    rep stosb
    mov edi, offset __user_bss_phys
    mov ecx, offset __user_bss_end
    sub ecx, offset __user_bss_start
    rep stosb

    // 2 MiB pages over 0-4 GiB: identity (for this transition), the direct
    // map at {direct} (the same PDPT) and the runtime's window at {kvma}
    // (physical 0-2 GiB).
    mov edi, offset perch_boot_pd - {kvma}
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

    mov edi, offset perch_boot_pdpt_low - {kvma}
    mov eax, offset perch_boot_pd - {kvma}
    or eax, 3
    mov [edi], eax
    mov [perch_boot_pdpt_high - {kvma} + 510 * 8], eax
    add eax, 4096
    mov [edi + 8], eax
    mov [perch_boot_pdpt_high - {kvma} + 511 * 8], eax
    add eax, 4096
    mov [edi + 16], eax
    add eax, 4096
    mov [edi + 24], eax
    mov eax, offset perch_boot_pdpt_low - {kvma}
    or eax, 3
    mov [perch_boot_pml4 - {kvma}], eax
    mov [perch_boot_pml4 - {kvma} + 256 * 8], eax
    mov eax, offset perch_boot_pdpt_high - {kvma}
    or eax, 3
    mov [perch_boot_pml4 - {kvma} + 511 * 8], eax

    mov eax, offset perch_boot_pml4 - {kvma}
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
    movabs rax, offset perch_start64_high
    jmp rax

    .section .text.entry, "ax"
perch_start64_high:
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
    call perch_kmain
    ud2
    "#,
    kvma = const arch_x86::paging::KERNEL_VMA,
    direct = const arch_x86::paging::DIRECT_MAP,
);

/// Maximum command-line length kept.
pub const CMDLINE_MAX: usize = 512;
/// Most memory-map entries kept.
pub const MAX_REGIONS: usize = 64;
/// Most boot modules kept.
pub const MAX_MODULES: usize = 4;

/// What the loader told us.
pub struct BootInfo {
    /// The protocol that started the runtime.
    pub protocol: BootProtocol,
    cmdline: [u8; CMDLINE_MAX],
    cmdline_len: usize,
    /// True when the command line was longer than [`CMDLINE_MAX`] and was cut.
    pub cmdline_truncated: bool,
    regions: [MemRegion; MAX_REGIONS],
    region_count: usize,
    modules: [Module; MAX_MODULES],
    module_count: usize,
    rsdp: Option<u64>,
}

impl BootInfo {
    /// The command line (lossy: invalid UTF-8 yields an empty line).
    pub fn cmdline(&self) -> &str {
        core::str::from_utf8(&self.cmdline[..self.cmdline_len]).unwrap_or("")
    }

    /// The memory map.
    pub fn regions(&self) -> &[MemRegion] {
        &self.regions[..self.region_count]
    }

    /// The physical address of the ACPI RSDP, when the loader gave one (PVH
    /// names it; multiboot2 carries a copy, which is kept in the image).
    pub fn rsdp(&self) -> Option<u64> {
        self.rsdp
    }

    /// The boot modules (the first is the boot archive).
    pub fn modules(&self) -> &[Module] {
        &self.modules[..self.module_count]
    }

    fn push_region(&mut self, r: MemRegion) {
        if self.region_count < MAX_REGIONS {
            self.regions[self.region_count] = r;
            self.region_count += 1;
        }
    }

    fn push_module(&mut self, m: Module) {
        if self.module_count < MAX_MODULES && m.len > 0 {
            self.modules[self.module_count] = m;
            self.module_count += 1;
        }
    }
}

/// `len` bytes of physical memory at `pa` through the direct map.
///
/// # Safety
/// 1. `[pa, pa + len)` is memory the loader handed over, below 4 GiB (the
///    boot tables' direct map), and nothing writes it while the slice lives.
unsafe fn phys_bytes<'a>(pa: u64, len: usize) -> &'a [u8] {
    // SAFETY: obligation 1.
    unsafe { core::slice::from_raw_parts(phys_to_virt(pa) as *const u8, len) }
}

/// The multiboot2 loader's copy of the RSDP, kept where the frame
/// allocator never reaches (the loader's information block is reused).
struct RsdpCopy(core::cell::UnsafeCell<[u8; bootinfo::RSDP_LEN]>);

// SAFETY: written once by `keep_rsdp` during boot, on one CPU, before any
// reader exists; read only after.
unsafe impl Sync for RsdpCopy {}

static RSDP_COPY: RsdpCopy = RsdpCopy(core::cell::UnsafeCell::new([0; bootinfo::RSDP_LEN]));

/// Keeps `rsdp` (a multiboot2 tag's copy, up to 36 bytes) in the image and
/// returns the copy's physical address.
fn keep_rsdp(rsdp: &[u8]) -> u64 {
    let n = rsdp.len().min(bootinfo::RSDP_LEN);
    // SAFETY: boot code on one CPU, before anything reads the copy.
    unsafe { (&mut *RSDP_COPY.0.get())[..n].copy_from_slice(&rsdp[..n]) };
    RSDP_COPY.0.get() as u64 - arch_x86::paging::KERNEL_VMA
}

/// Reads the protocol, command line, memory map and modules from the entry
/// registers.
///
/// Must run before the frame allocator can reuse the loader's memory;
/// everything is copied out (the modules' contents stay where they are and
/// are reserved by the caller).
pub fn read_boot_info(magic: u32, info: u32) -> BootInfo {
    let mut out = BootInfo {
        protocol: BootProtocol::Unknown,
        cmdline: [0; CMDLINE_MAX],
        cmdline_len: 0,
        cmdline_truncated: false,
        regions: [MemRegion {
            base: 0,
            len: 0,
            kind: 0,
        }; MAX_REGIONS],
        region_count: 0,
        modules: [Module { base: 0, len: 0 }; MAX_MODULES],
        module_count: 0,
        rsdp: None,
    };
    if info == 0 {
        return out;
    }
    let info = u64::from(info);
    // SAFETY: a non-zero `info` is a physical address from the loader below
    // 4 GiB; reading one word is harmless.
    let first = u32::from_le_bytes(unsafe { phys_bytes(info, 4) }.try_into().unwrap_or([0; 4]));
    out.protocol = BootProtocol::detect(magic, Some(first));
    let mut line: &[u8] = &[];
    match out.protocol {
        BootProtocol::Pvh => {
            // SAFETY: the PVH magic matched, so `info` points at hvm_start_info.
            let si =
                unsafe { core::ptr::read_unaligned(phys_to_virt(info) as *const PvhStartInfo) };
            if si.cmdline_paddr != 0 && si.cmdline_paddr < 1 << 32 {
                // SAFETY: the loader put a NUL-terminated string at
                // cmdline_paddr; we read at most CMDLINE_MAX + 1 bytes of it.
                line =
                    bootinfo::until_nul(unsafe { phys_bytes(si.cmdline_paddr, CMDLINE_MAX + 1) });
            }
            let n = (si.memmap_entries as usize).min(MAX_REGIONS);
            if si.version >= 1 && si.memmap_paddr != 0 && si.memmap_paddr < 1 << 32 {
                // SAFETY: version 1 start info describes `memmap_entries`
                // entries at memmap_paddr.
                let t = unsafe { phys_bytes(si.memmap_paddr, n * bootinfo::PVH_MEMMAP_ENTRY) };
                for r in bootinfo::pvh_memmap(t) {
                    out.push_region(r);
                }
            }
            if si.version >= 1 && si.rsdp_paddr != 0 {
                out.rsdp = Some(si.rsdp_paddr);
            }
            let m = (si.nr_modules as usize).min(MAX_MODULES);
            if si.modlist_paddr != 0 && si.modlist_paddr < 1 << 32 {
                // SAFETY: `nr_modules` entries at modlist_paddr.
                let t = unsafe { phys_bytes(si.modlist_paddr, m * bootinfo::PVH_MODLIST_ENTRY) };
                for md in bootinfo::pvh_modules(t) {
                    out.push_module(md);
                }
            }
        }
        BootProtocol::Multiboot2 => {
            let total = first as usize;
            if (8..=1 << 20).contains(&total) {
                // SAFETY: the multiboot2 information structure is `total`
                // bytes at `info`.
                let raw = unsafe { phys_bytes(info, total) };
                line = bootinfo::multiboot2_cmdline(raw)
                    .ok()
                    .flatten()
                    .unwrap_or(&[]);
                for (ty, body) in bootinfo::multiboot2_tags(raw) {
                    match ty {
                        bootinfo::MB2_TAG_MMAP => {
                            for r in bootinfo::multiboot2_mmap(body) {
                                out.push_region(r);
                            }
                        }
                        bootinfo::MB2_TAG_MODULE => {
                            if let Some(md) = bootinfo::multiboot2_module(body) {
                                out.push_module(md);
                            }
                        }
                        // The 2.0 copy wins over the 1.0 one.
                        bootinfo::MB2_TAG_ACPI_NEW | bootinfo::MB2_TAG_ACPI_OLD
                            if ty == bootinfo::MB2_TAG_ACPI_NEW || out.rsdp.is_none() =>
                        {
                            out.rsdp = Some(keep_rsdp(body));
                        }
                        _ => {}
                    }
                }
            }
        }
        BootProtocol::Unknown => {}
    }
    let n = line.len().min(CMDLINE_MAX);
    out.cmdline_truncated = line.len() > CMDLINE_MAX;
    out.cmdline[..n].copy_from_slice(&line[..n]);
    out.cmdline_len = n;
    out
}
