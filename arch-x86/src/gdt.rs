//! The global descriptor table layout, its descriptor encodings and the TSS.
//!
//! The order follows what SYSCALL/SYSRET need: kernel code at 0x08 with
//! kernel data right after it, and the user compat code, user data and user
//! 64-bit code in that order so that `STAR[63:48] = 0x18` yields both user
//! code selectors.

/// Kernel 64-bit code selector.
pub const KERNEL_CODE: u16 = 0x08;
/// Kernel data selector.
pub const KERNEL_DATA: u16 = 0x10;
/// User 32-bit (compatibility mode) code selector, RPL 3.
pub const USER_CODE32: u16 = 0x18 | 3;
/// User data selector, RPL 3.
pub const USER_DATA: u16 = 0x20 | 3;
/// User 64-bit code selector, RPL 3.
pub const USER_CODE64: u16 = 0x28 | 3;
/// TSS selector (a 16-byte system descriptor).
pub const TSS: u16 = 0x30;
/// First of the three thread-local-storage slots compat processes set with
/// `set_thread_area` (Linux's GDT_ENTRY_TLS_MIN on x86-64: selectors 0x63,
/// 0x6b, 0x73).
pub const TLS_FIRST: usize = 12;
/// Number of TLS slots.
pub const TLS_SLOTS: usize = 3;
/// Number of 8-byte GDT slots.
pub const GDT_ENTRIES: usize = TLS_FIRST + TLS_SLOTS;

/// The fields of Linux's `struct user_desc` that make a segment descriptor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserSegment {
    /// Base address.
    pub base: u32,
    /// Limit (20 bits; in pages when `limit_in_pages`).
    pub limit: u32,
    /// 32-bit segment (D/B).
    pub seg_32bit: bool,
    /// `contents`: 0 data, 1 expand-down data, 2 code (3 is refused by the caller).
    pub contents: u8,
    /// Read-only data / execute-only code.
    pub read_exec_only: bool,
    /// Granularity: limit counted in 4 KiB pages.
    pub limit_in_pages: bool,
    /// Not present.
    pub seg_not_present: bool,
    /// The AVL bit.
    pub useable: bool,
}

impl UserSegment {
    /// The ring-3 descriptor for these fields, as Linux's `fill_ldt` builds
    /// it (accessed bit set, S = 1, DPL 3, never a 64-bit segment).
    pub const fn descriptor(&self) -> u64 {
        let ty = (((!self.read_exec_only) as u64) << 1) | ((self.contents as u64 & 3) << 2) | 1;
        let limit = self.limit as u64 & 0xf_ffff;
        let base = self.base as u64;
        (limit & 0xffff)
            | ((base & 0xff_ffff) << 16)
            | (ty << 40)
            | DESC_S
            | dpl(3)
            | (((!self.seg_not_present) as u64) << 47)
            | ((limit >> 16) << 48)
            | ((self.useable as u64) << 52)
            | ((self.seg_32bit as u64) << 54)
            | ((self.limit_in_pages as u64) << 55)
            | ((base >> 24) << 56)
    }
}

/// The selector of TLS slot `i` (0-based) with RPL 3.
pub const fn tls_selector(i: usize) -> u16 {
    (((TLS_FIRST + i) as u16) << 3) | 3
}

/// IST slot (1-based, as stored in IDT entries) used by the NMI handler.
pub const IST_NMI: u8 = 1;
/// IST slot used by the double-fault handler.
pub const IST_DOUBLE_FAULT: u8 = 2;
/// IST slot used by the machine-check handler.
pub const IST_MACHINE_CHECK: u8 = 3;

const PRESENT: u64 = 1 << 47;
const DESC_S: u64 = 1 << 44;
const EXEC: u64 = 1 << 43;
const RW: u64 = 1 << 41;
const LONG: u64 = 1 << 53;
const DB: u64 = 1 << 54;
const GRAN: u64 = 1 << 55;
const LIMIT_MAX: u64 = 0xffff | (0xf << 48);

const fn dpl(level: u64) -> u64 {
    level << 45
}

/// A 64-bit code segment descriptor for privilege `level`.
pub const fn code64(level: u64) -> u64 {
    PRESENT | DESC_S | EXEC | RW | LONG | GRAN | LIMIT_MAX | dpl(level)
}

/// A 32-bit flat code segment descriptor (compatibility mode) for `level`.
pub const fn code32(level: u64) -> u64 {
    PRESENT | DESC_S | EXEC | RW | DB | GRAN | LIMIT_MAX | dpl(level)
}

/// A flat writable data segment descriptor for `level`.
pub const fn data(level: u64) -> u64 {
    PRESENT | DESC_S | RW | DB | GRAN | LIMIT_MAX | dpl(level)
}

/// The two 8-byte halves of an available 64-bit TSS descriptor.
pub const fn tss_descriptor(base: u64, limit: u32) -> [u64; 2] {
    let low = (limit as u64 & 0xffff)
        | ((base & 0xff_ffff) << 16)
        | (0x9 << 40)
        | PRESENT
        | (((limit as u64 >> 16) & 0xf) << 48)
        | (((base >> 24) & 0xff) << 56);
    [low, base >> 32]
}

/// The base of the TSS descriptor in a table [`build`] made (slots 6 and 7).
pub const fn tss_base(gdt: &[u64; GDT_ENTRIES]) -> u64 {
    let lo = gdt[6];
    ((lo >> 16) & 0xff_ffff) | (((lo >> 56) & 0xff) << 24) | (gdt[7] << 32)
}

/// The full table for a TSS at `tss_base`.
pub const fn build(tss_base: u64) -> [u64; GDT_ENTRIES] {
    let tss = tss_descriptor(
        tss_base,
        core::mem::size_of::<TaskStateSegment>() as u32 - 1,
    );
    [
        0,
        code64(0),
        data(0),
        code32(3),
        data(3),
        code64(3),
        tss[0],
        tss[1],
        0,
        0,
        0,
        0,
        0,
        0,
        0,
    ]
}

/// The IA32_STAR value for this layout.
pub const fn star() -> u64 {
    ((0x18u64) << 48) | ((KERNEL_CODE as u64) << 32)
}

/// The 64-bit task state segment.
#[repr(C, packed(4))]
#[derive(Clone, Copy, Debug, Default)]
pub struct TaskStateSegment {
    reserved0: u32,
    /// Stack loaded on entry from ring 3.
    pub rsp0: u64,
    pub rsp1: u64,
    pub rsp2: u64,
    reserved1: u64,
    /// Interrupt stack table, slots 1..=7 at index 0..=6.
    pub ist: [u64; 7],
    reserved2: u64,
    reserved3: u16,
    /// Offset of the I/O permission bitmap (past the limit: none).
    pub iomap_base: u16,
}

impl TaskStateSegment {
    /// An empty TSS with no I/O bitmap.
    pub const fn new() -> Self {
        Self {
            reserved0: 0,
            rsp0: 0,
            rsp1: 0,
            rsp2: 0,
            reserved1: 0,
            ist: [0; 7],
            reserved2: 0,
            reserved3: 0,
            iomap_base: core::mem::size_of::<TaskStateSegment>() as u16,
        }
    }
}

/// Loads a GDT built by [`build`], reloads every segment register, loads the TSS
/// and loads the null LDT selector.
///
/// The LDTR must be null: whatever the CPU or the firmware left there (QEMU resets
/// it to base 0, limit 0xffff) would make every selector with TI set (`mov ds, 7`,
/// `ljmp 7:...` from ring 3) read descriptors from a linear address of the running
/// process's space, one it may map and fill with a call gate into ring 0. With a
/// null LDTR those selectors raise #GP.
///
/// # Safety
/// `gdt` must hold [`build`]'s layout for a TSS that stays valid and in place
/// for as long as the CPU runs; the GDT must also stay in place. Must run in
/// ring 0 with interrupts disabled.
#[cfg(target_arch = "x86_64")]
pub unsafe fn load(gdt: *const [u64; GDT_ENTRIES]) {
    #[repr(C, packed)]
    struct Pointer {
        limit: u16,
        base: u64,
    }
    let ptr = Pointer {
        limit: (GDT_ENTRIES * 8 - 1) as u16,
        base: gdt as u64,
    };
    // SAFETY: the caller guarantees the table is valid and permanent; the far
    // return reloads CS with the kernel code selector of that table.
    unsafe {
        core::arch::asm!(
            "lgdt [{ptr}]",
            "push {cs}",
            "lea {tmp}, [rip + 2f]",
            "push {tmp}",
            "retfq",
            "2:",
            "mov ds, {ds:x}",
            "mov es, {ds:x}",
            "mov ss, {ds:x}",
            "xor {tmp:e}, {tmp:e}",
            "mov fs, {tmp:x}",
            "mov gs, {tmp:x}",
            "ltr {tss:x}",
            "lldt {tmp:x}",
            ptr = in(reg) &ptr,
            cs = const KERNEL_CODE as u64,
            ds = in(reg) KERNEL_DATA as u64,
            tss = in(reg) TSS as u64,
            tmp = out(reg) _,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn descriptors_match_reference_encodings() {
        assert_eq!(code64(0), 0x00af_9a00_0000_ffff);
        assert_eq!(data(0), 0x00cf_9200_0000_ffff);
        assert_eq!(code32(3), 0x00cf_fa00_0000_ffff);
        assert_eq!(data(3), 0x00cf_f200_0000_ffff);
        assert_eq!(code64(3), 0x00af_fa00_0000_ffff);
    }

    #[test]
    fn selectors_index_the_table() {
        let g = build(0x1234_5678_9abc_def0);
        assert_eq!(g[(KERNEL_CODE >> 3) as usize], code64(0));
        assert_eq!(g[(KERNEL_DATA >> 3) as usize], data(0));
        assert_eq!(g[(USER_CODE32 >> 3) as usize], code32(3));
        assert_eq!(g[(USER_DATA >> 3) as usize], data(3));
        assert_eq!(g[(USER_CODE64 >> 3) as usize], code64(3));
    }

    #[test]
    fn tls_descriptors_match_linux() {
        // glibc's i386 TLS: base, limit 0xfffff in pages, 32-bit, data, writable, useable.
        let d = UserSegment {
            base: 0x0804_c840,
            limit: 0xf_ffff,
            seg_32bit: true,
            contents: 0,
            read_exec_only: false,
            limit_in_pages: true,
            seg_not_present: false,
            useable: true,
        };
        // Flat writable data, DPL 3, accessed, AVL, base split over the descriptor.
        assert_eq!(d.descriptor(), 0x08df_f304_c840_ffff);
        assert_eq!(
            d.descriptor() & !(0xff_ffff << 16) & !(0xff << 56) & !(1 << 52) & !(1 << 40),
            data(3)
        );
        assert_eq!(tls_selector(0), 0x63);
        assert_eq!(tls_selector(2), 0x73);
        let g = build(0);
        assert_eq!(g.len(), 15);
        assert!(g[TLS_FIRST..].iter().all(|&e| e == 0));
        let np = UserSegment {
            seg_not_present: true,
            ..d
        };
        assert_eq!(np.descriptor() & (1 << 47), 0);
    }

    #[test]
    fn tss_descriptor_splits_base() {
        let [lo, hi] = tss_descriptor(0x1234_5678_9abc_def0, 103);
        assert_eq!(lo & 0xffff, 103);
        assert_eq!((lo >> 16) & 0xff_ffff, 0xbc_def0);
        assert_eq!((lo >> 56) & 0xff, 0x9a);
        assert_eq!(
            (lo >> 40) & 0xff,
            0x89,
            "present, type 9 (available 64-bit TSS)"
        );
        assert_eq!(hi, 0x1234_5678);
    }

    #[test]
    fn star_gives_sysret_selectors() {
        let s = star();
        let sysret_base = (s >> 48) as u16;
        assert_eq!((s >> 32) as u16, KERNEL_CODE);
        assert_eq!((s >> 32) as u16 + 8, KERNEL_DATA);
        // SYSRET to 64-bit: CS = base + 16, SS = base + 8 (RPL forced to 3).
        assert_eq!((sysret_base + 16) | 3, USER_CODE64);
        assert_eq!((sysret_base + 8) | 3, USER_DATA);
        // SYSRET to compat: CS = base.
        assert_eq!(sysret_base | 3, USER_CODE32);
    }

    #[test]
    fn tss_layout() {
        assert_eq!(size_of::<TaskStateSegment>(), 104);
        assert_eq!(offset_of!(TaskStateSegment, rsp0), 4);
        assert_eq!(offset_of!(TaskStateSegment, ist), 0x24);
        assert_eq!(offset_of!(TaskStateSegment, iomap_base), 0x66);
        assert_eq!({ TaskStateSegment::new().iomap_base }, 104);
    }
}
