//! The runtime's page tables: identity map of 0-4 GiB, 4 KiB pages over the
//! image so each section gets its own rights (runtime supervisor-only,
//! appliance `.user.*` user-accessible, NX on data), 2 MiB pages elsewhere.

use arch_x86::cpu;
use arch_x86::paging::{self, ImageLayout, PageTable, TABLE_FLAGS};
use core::cell::UnsafeCell;

/// Bytes covered with 4 KiB pages (the image must end below this).
pub const FINE_REGION: u64 = 8 << 20;
const FINE_TABLES: usize = (FINE_REGION / paging::LARGE_PAGE) as usize;

#[repr(C, align(4096))]
struct Tables {
    pml4: PageTable,
    pdpt: PageTable,
    pd: [PageTable; 4],
    pt: [PageTable; FINE_TABLES],
}

struct TableCell(UnsafeCell<Tables>);

// SAFETY: written once during boot before CR3 points at it; read by the CPU
// and by the self-test afterwards.
unsafe impl Sync for TableCell {}

static TABLES: TableCell = TableCell(UnsafeCell::new(Tables {
    pml4: PageTable::new(),
    pdpt: PageTable::new(),
    pd: [PageTable::new(); 4],
    pt: [PageTable::new(); FINE_TABLES],
}));

unsafe extern "C" {
    static __text_start: u8;
    static __text_end: u8;
    static __rodata_start: u8;
    static __rodata_end: u8;
    static __data_start: u8;
    static __data_end: u8;
    static __user_text_start: u8;
    static __user_text_end: u8;
    static __user_data_start: u8;
    static __user_data_end: u8;
}

/// The image layout from the linker script.
pub fn layout() -> ImageLayout {
    ImageLayout {
        text: (
            (&raw const __text_start) as u64,
            (&raw const __text_end) as u64,
        ),
        rodata: (
            (&raw const __rodata_start) as u64,
            (&raw const __rodata_end) as u64,
        ),
        data: (
            (&raw const __data_start) as u64,
            (&raw const __data_end) as u64,
        ),
        user_text: (
            (&raw const __user_text_start) as u64,
            (&raw const __user_text_end) as u64,
        ),
        user_data: (
            (&raw const __user_data_start) as u64,
            (&raw const __user_data_end) as u64,
        ),
    }
}

/// True when `[addr, addr+len)` lies inside any appliance page.
pub fn is_user_range(addr: u64, len: u64) -> bool {
    let l = layout();
    let end = match addr.checked_add(len) {
        Some(e) => e,
        None => return false,
    };
    (addr >= l.user_text.0 && end <= l.user_text.1)
        || (addr >= l.user_data.0 && end <= l.user_data.1)
}

/// Why the tables could not be built.
#[derive(Debug)]
pub enum PagingError {
    /// The image reaches past the finely mapped region.
    ImageTooLarge(u64),
}

/// Builds and loads the tables. `nx` says whether NX bits may be used.
pub fn init(nx: bool) -> Result<(), PagingError> {
    let l = layout();
    let end = l.user_data.1.max(l.data.1);
    if end > FINE_REGION {
        return Err(PagingError::ImageTooLarge(end));
    }
    // SAFETY: boot code, single core; nothing uses TABLES until CR3 is written.
    let t = unsafe { &mut *TABLES.0.get() };
    t.pml4.0[0] = (&raw const t.pdpt) as u64 | TABLE_FLAGS;
    for (i, pd) in t.pd.iter_mut().enumerate() {
        t.pdpt.0[i] = (pd as *const PageTable) as u64 | TABLE_FLAGS;
        for (j, e) in pd.0.iter_mut().enumerate() {
            let addr = ((i * 512 + j) as u64) * paging::LARGE_PAGE;
            *e = addr | paging::large_page_flags(addr, nx);
        }
    }
    for (k, pt) in t.pt.iter_mut().enumerate() {
        t.pd[0].0[k] = (pt as *const PageTable) as u64 | TABLE_FLAGS;
        for (j, e) in pt.0.iter_mut().enumerate() {
            let addr = ((k * 512 + j) as u64) * paging::PAGE;
            let flags = paging::leaf_flags(l.classify(addr), nx);
            *e = if flags == 0 { 0 } else { addr | flags };
        }
    }
    // SAFETY: the new tables identity-map everything the boot tables did that
    // the runtime uses (its image with the right rights, devices, the rest of
    // 0-4 GiB), so execution continues at the same addresses.
    unsafe { cpu::write_cr3((&raw const t.pml4) as u64) };
    Ok(())
}

/// The leaf entry that maps `addr` (0 if unmapped), for the self-test.
pub fn leaf_entry(addr: u64) -> u64 {
    // SAFETY: read-only access to tables that are no longer written.
    let t = unsafe { &*TABLES.0.get() };
    if addr >= 1 << 32 {
        return 0;
    }
    if addr < FINE_REGION {
        let k = (addr / paging::LARGE_PAGE) as usize;
        return t.pt[k].0[paging::index(addr, 1)];
    }
    t.pd[paging::index(addr, 3)].0[paging::index(addr, 2)]
}
