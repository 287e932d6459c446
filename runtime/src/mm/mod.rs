//! Memory: the physical frame allocator, the kernel's page tables (the
//! runtime image in the upper 2 GiB, a direct map of physical memory), the
//! heap, per-process address spaces and checked access to user memory.

#[cfg(target_os = "none")]
pub mod dma;
pub mod frames;
pub mod heap;
pub mod space;
pub mod user;

use arch_x86::bootinfo::MemRegion;
use arch_x86::paging::{
    self, CACHE_DISABLE, DIRECT_MAP, HUGE, ImageLayout, KERNEL_VMA, LARGE_PAGE, NO_EXECUTE, PAGE,
    PRESENT, PageTable, TABLE_FLAGS, WRITABLE, WRITE_THROUGH,
};
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Bytes of the image window covered with 4 KiB pages (the image must end below this).
pub const FINE_REGION: u64 = 16 << 20;
const FINE_TABLES: usize = (FINE_REGION / LARGE_PAGE) as usize;
/// Physical memory always in the direct map with 2 MiB pages (devices included).
const LOW_DIRECT: u64 = 4 << 30;

#[repr(C, align(4096))]
struct Tables {
    pml4: PageTable,
    pdpt_kernel: PageTable,
    pd_kernel: PageTable,
    pt_image: [PageTable; FINE_TABLES],
    pdpt_direct: PageTable,
    pd_direct: [PageTable; 4],
}

struct TableCell(UnsafeCell<Tables>);

// SAFETY: written during boot before CR3 points at it (and, for the direct
// map above 4 GiB, only then); read by the CPU and the self-test afterwards.
unsafe impl Sync for TableCell {}

static TABLES: TableCell = TableCell(UnsafeCell::new(Tables {
    pml4: PageTable::new(),
    pdpt_kernel: PageTable::new(),
    pd_kernel: PageTable::new(),
    pt_image: [PageTable::new(); FINE_TABLES],
    pdpt_direct: PageTable::new(),
    pd_direct: [PageTable::new(); 4],
}));

static KERNEL_ROOT: AtomicU64 = AtomicU64::new(0);
static NX: AtomicBool = AtomicBool::new(false);

unsafe extern "C" {
    static __image_phys_start: u8;
    static __image_phys_end: u8;
    static __text_start: u8;
    static __text_end: u8;
    static __rodata_start: u8;
    static __rodata_end: u8;
    static __data_start: u8;
    static __data_end: u8;
    static __user_image_phys: u8;
    static __user_text_start: u8;
    static __user_text_end: u8;
    static __user_data_start: u8;
    static __user_data_end: u8;
}

/// The address of a linker-script symbol or function, loaded as an absolute
/// 64-bit immediate: the runtime (upper half) and the built-in ring-3 code
/// (lower half) are too far apart for RIP-relative references.
#[macro_export]
macro_rules! abs_addr {
    ($s:path) => {{
        let a: u64;
        // SAFETY: loads a link-time constant into a register; no memory is touched.
        unsafe {
            core::arch::asm!("movabs {0}, offset {1}", out(reg) a, sym $s,
                options(pure, nomem, nostack, preserves_flags))
        };
        a
    }};
}

/// The image layout from the linker script (virtual addresses).
pub fn layout() -> ImageLayout {
    ImageLayout {
        text: (abs_addr!(__text_start), abs_addr!(__text_end)),
        rodata: (abs_addr!(__rodata_start), abs_addr!(__rodata_end)),
        data: (abs_addr!(__data_start), abs_addr!(__data_end)),
        user_text: (abs_addr!(__user_text_start), abs_addr!(__user_text_end)),
        user_data: (abs_addr!(__user_data_start), abs_addr!(__user_data_end)),
    }
}

/// Physical `[start, end)` of the whole image.
pub fn image_phys() -> (u64, u64) {
    (abs_addr!(__image_phys_start), abs_addr!(__image_phys_end))
}

/// Physical address of the built-in ring-3 image (`.user.text` first).
pub fn user_image_phys() -> u64 {
    abs_addr!(__user_image_phys)
}

/// The runtime's alias, through the direct map, of address `va` in the
/// built-in ring-3 image (which the runtime's own root does not map).
pub fn builtin_alias(va: u64) -> u64 {
    paging::phys_to_virt(user_image_phys() + va.wrapping_sub(layout().user_text.0))
}

/// Physical address of the kernel's PML4.
pub fn kernel_root() -> u64 {
    KERNEL_ROOT.load(Ordering::Relaxed)
}

/// Whether NX bits are in use.
pub fn nx() -> bool {
    NX.load(Ordering::Relaxed)
}

/// Switches to the kernel's own tables (no process mapped).
pub fn activate_kernel() {
    // SAFETY: the kernel root maps all runtime code and data.
    unsafe { arch_x86::cpu::write_cr3(kernel_root()) };
    crate::cpu::set_active_root(kernel_root());
}

/// Why memory could not be set up.
#[derive(Debug)]
pub enum MemError {
    /// The image reaches past the finely mapped window.
    ImageTooLarge(u64),
    /// No memory map, or too little RAM for the heap.
    NoMemory,
}

/// What `init` set up.
#[derive(Clone, Copy, Debug)]
pub struct MemInfo {
    /// Usable RAM in bytes (after the boot's reservations).
    pub usable: u64,
    /// Highest physical address in the direct map.
    pub direct_top: u64,
    /// Heap size in bytes.
    pub heap: u64,
}

fn image_flags(l: &ImageLayout, va: u64, nx: bool) -> u64 {
    let nx_bit = if nx { NO_EXECUTE } else { 0 };
    let within = |r: (u64, u64)| va >= r.0 && va < r.1;
    if within(l.text) {
        PRESENT
    } else if within(l.rodata) {
        PRESENT | nx_bit
    } else if within(l.data) {
        PRESENT | WRITABLE | nx_bit
    } else {
        0
    }
}

/// Builds and loads the kernel's tables, then the frame allocator and the
/// heap. `reserved` lists physical ranges the boot still uses (the archive).
pub fn init(
    features: arch_x86::cpu::Features,
    regions: &[MemRegion],
    reserved: &[(u64, u64)],
) -> Result<MemInfo, MemError> {
    let nx = features.nx;
    NX.store(nx, Ordering::Relaxed);
    let l = layout();
    let (img_start, img_end) = image_phys();
    if img_end > FINE_REGION {
        return Err(MemError::ImageTooLarge(img_end));
    }
    let phys = |t: &PageTable| (t as *const PageTable as u64) - KERNEL_VMA;
    // SAFETY: boot code, single core; nothing uses TABLES until CR3 is written.
    let t = unsafe { &mut *TABLES.0.get() };
    // The runtime image, 4 KiB pages with the rights of each section.
    t.pml4.0[511] = phys(&t.pdpt_kernel) | TABLE_FLAGS;
    t.pdpt_kernel.0[510] = phys(&t.pd_kernel) | TABLE_FLAGS;
    for k in 0..FINE_TABLES {
        t.pd_kernel.0[k] = phys(&t.pt_image[k]) | TABLE_FLAGS;
        for j in 0..512 {
            let pa = (k as u64 * 512 + j as u64) * PAGE;
            let flags = image_flags(&l, KERNEL_VMA + pa, nx);
            t.pt_image[k].0[j] = if flags == 0 { 0 } else { pa | flags };
        }
    }
    // The direct map: 0-4 GiB with 2 MiB pages (uncached in the device
    // window), RAM above that with 1 GiB pages where the CPU has them.
    t.pml4.0[paging::index(DIRECT_MAP, 4)] = phys(&t.pdpt_direct) | TABLE_FLAGS;
    for (i, pd) in t.pd_direct.iter_mut().enumerate() {
        for (j, e) in pd.0.iter_mut().enumerate() {
            let pa = (i as u64 * 512 + j as u64) * LARGE_PAGE;
            *e = pa | paging::large_page_flags(pa, nx);
        }
    }
    for i in 0..4 {
        t.pdpt_direct.0[i] = phys(&t.pd_direct[i]) | TABLE_FLAGS;
    }
    let ram_top = regions
        .iter()
        .filter(|r| r.usable())
        .map(|r| r.base.saturating_add(r.len))
        .max()
        .unwrap_or(0);
    let mut direct_top = LOW_DIRECT;
    if features.page1g {
        let top = ram_top.min(512 << 30);
        let mut pa = LOW_DIRECT;
        while pa < top {
            let mut f = PRESENT | WRITABLE | HUGE;
            if nx {
                f |= NO_EXECUTE;
            }
            t.pdpt_direct.0[(pa >> 30) as usize] = pa | f;
            pa += 1 << 30;
        }
        direct_top = direct_top.max(pa);
    }
    let _ = (CACHE_DISABLE, WRITE_THROUGH);
    let root = phys(&t.pml4);
    KERNEL_ROOT.store(root, Ordering::Relaxed);
    // SAFETY: the new tables map the whole image at its link addresses with
    // the right rights, the boot stack in it, and the direct map the boot
    // tables also had; execution continues at the same addresses.
    unsafe { arch_x86::cpu::write_cr3(root) };
    crate::cpu::set_kernel_root(root);
    crate::cpu::set_active_root(root);

    // Frames: RAM the direct map covers, less the image and the boot's ranges.
    let mut usable_regions = [MemRegion {
        base: 0,
        len: 0,
        kind: 0,
    }; 64];
    let mut n = 0;
    for r in regions.iter().filter(|r| r.usable()).take(64) {
        let end = r.base.saturating_add(r.len).min(direct_top);
        if end > r.base {
            usable_regions[n] = MemRegion {
                base: r.base,
                len: end - r.base,
                kind: r.kind,
            };
            n += 1;
        }
    }
    let mut res = [(0u64, 0u64); 8];
    res[0] = (img_start, img_end);
    let mut m = 1;
    for &r in reserved.iter().take(7) {
        res[m] = r;
        m += 1;
    }
    frames::init(&usable_regions[..n], &res[..m]);
    let (total, _) = frames::stats();
    if total == 0 {
        return Err(MemError::NoMemory);
    }
    let usable = total * PAGE;
    let heap = (usable / 8).clamp(2 << 20, 256 << 20) & !(PAGE - 1);
    let start = frames::take_contiguous(heap).ok_or(MemError::NoMemory)?;
    // SAFETY: the frames were just taken from the allocator for good, and
    // the direct map covers them (they are below `direct_top`).
    unsafe { heap::init(paging::phys_to_virt(start), heap) };
    Ok(MemInfo {
        usable,
        direct_top,
        heap,
    })
}

/// The kernel's leaf entry for image or direct-map address `va` (0 if
/// unmapped), for the self-test.
pub fn kernel_entry(va: u64) -> u64 {
    arch_x86::paging::Mapper::new(kernel_root()).entry(&mut space::DirectTables, va)
}
