//! Page tables: the virtual layout, entry encoding, the policy that decides
//! each image page's rights, and a four-level mapper over any memory that
//! can hand out tables by physical address.
//!
//! The layout: the runtime is linked at [`KERNEL_VMA`] (the top 2 GiB), all
//! physical memory is mapped at [`DIRECT_MAP`], and the lower half belongs to
//! the process whose page-table root is loaded. The runtime maps its own
//! image supervisor-only with NX on everything that is not code. The policy
//! and the mapper are pure logic over [`TableMemory`], so they are tested
//! here against a fake memory; the runtime supplies the real one.

/// Present.
pub const PRESENT: u64 = 1 << 0;
/// Writable.
pub const WRITABLE: u64 = 1 << 1;
/// User-accessible.
pub const USER: u64 = 1 << 2;
/// Write-through.
pub const WRITE_THROUGH: u64 = 1 << 3;
/// Cache disable.
pub const CACHE_DISABLE: u64 = 1 << 4;
/// Large page (2 MiB in a PD entry).
pub const HUGE: u64 = 1 << 7;
/// No-execute (needs EFER.NXE).
pub const NO_EXECUTE: u64 = 1 << 63;
/// Physical address bits of an entry.
pub const ADDR_MASK: u64 = 0x000f_ffff_ffff_f000;

/// Software-available bit 9: the leaf's frame is not owned by the address
/// space (shared image pages); tearing the space down must not free it.
pub const BORROWED: u64 = 1 << 9;
/// Software-available bit 10: the leaf's frame may be shared with another
/// address space after `fork` (copy-on-write); the leaf is never writable,
/// and a write gets the space a frame of its own first.
pub const COW: u64 = 1 << 10;
/// Accessed (set by the CPU).
pub const ACCESSED: u64 = 1 << 5;
/// Dirty (set by the CPU).
pub const DIRTY: u64 = 1 << 6;

/// Where the runtime is linked: physical address `p` of the image is at
/// `KERNEL_VMA + p` (the top 2 GiB, PML4 slot 511).
pub const KERNEL_VMA: u64 = 0xffff_ffff_8000_0000;
/// Base of the direct map of physical memory (PML4 slot 256 and up).
pub const DIRECT_MAP: u64 = 0xffff_8000_0000_0000;
/// First PML4 slot of the runtime half, shared by every address space.
pub const KERNEL_PML4_FIRST: usize = 256;
/// End of the lower (user) half: canonical user addresses are below it.
pub const USER_END: u64 = 0x0000_8000_0000_0000;

/// The direct-map address of physical address `pa`.
pub const fn phys_to_virt(pa: u64) -> u64 {
    DIRECT_MAP.wrapping_add(pa)
}

/// The physical address of `va`, for a direct-map or an image address
/// (`None` for anything else).
pub const fn virt_to_phys(va: u64) -> Option<u64> {
    if va >= KERNEL_VMA {
        Some(va - KERNEL_VMA)
    } else if va >= DIRECT_MAP && va < DIRECT_MAP + (1 << 46) {
        Some(va - DIRECT_MAP)
    } else {
        None
    }
}

/// Page size.
pub const PAGE: u64 = 4096;
/// Large page size.
pub const LARGE_PAGE: u64 = 2 << 20;

/// The address ranges of the runtime image, from the linker script.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageLayout {
    /// Runtime code (`.text`), page aligned.
    pub text: (u64, u64),
    /// Runtime read-only data.
    pub rodata: (u64, u64),
    /// Runtime writable data and bss.
    pub data: (u64, u64),
    /// Appliance code (`.user.text`).
    pub user_text: (u64, u64),
    /// Appliance data, read-only data and bss.
    pub user_data: (u64, u64),
}

/// What a 4 KiB page is used for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageKind {
    /// Page 0, left unmapped to catch null pointers.
    Null,
    /// Runtime code.
    Text,
    /// Runtime read-only data.
    Rodata,
    /// Runtime data, or other memory the runtime owns.
    Data,
    /// Appliance code.
    UserText,
    /// Appliance data.
    UserData,
}

fn within(addr: u64, r: (u64, u64)) -> bool {
    addr >= r.0 && addr < r.1
}

impl ImageLayout {
    /// Classifies the page at `addr`.
    pub fn classify(&self, addr: u64) -> PageKind {
        if addr < PAGE {
            PageKind::Null
        } else if within(addr, self.text) {
            PageKind::Text
        } else if within(addr, self.rodata) {
            PageKind::Rodata
        } else if within(addr, self.user_text) {
            PageKind::UserText
        } else if within(addr, self.user_data) {
            PageKind::UserData
        } else {
            PageKind::Data
        }
    }
}

/// Leaf flags for a page of `kind` (`nx` = the CPU supports NX).
pub fn leaf_flags(kind: PageKind, nx: bool) -> u64 {
    let nx_bit = if nx { NO_EXECUTE } else { 0 };
    match kind {
        PageKind::Null => 0,
        PageKind::Text => PRESENT,
        PageKind::Rodata => PRESENT | nx_bit,
        PageKind::Data => PRESENT | WRITABLE | nx_bit,
        PageKind::UserText => PRESENT | USER,
        PageKind::UserData => PRESENT | WRITABLE | USER | nx_bit,
    }
}

/// Flags for a 2 MiB identity page at `addr` above the finely mapped region:
/// supervisor data, uncached in the 3-4 GiB device window.
pub fn large_page_flags(addr: u64, nx: bool) -> u64 {
    let mut f = PRESENT | WRITABLE | HUGE;
    if nx {
        f |= NO_EXECUTE;
    }
    if (0xc000_0000..0x1_0000_0000).contains(&addr) {
        f |= CACHE_DISABLE | WRITE_THROUGH;
    }
    f
}

/// Flags for a non-leaf entry: everything allowed, the leaf decides.
pub const TABLE_FLAGS: u64 = PRESENT | WRITABLE | USER;

/// Index of `addr` in the table at `level` (4 = PML4 ... 1 = PT).
pub const fn index(addr: u64, level: u32) -> usize {
    ((addr >> (12 + 9 * (level - 1))) & 0x1ff) as usize
}

/// A 4 KiB-aligned table of 512 entries.
#[repr(C, align(4096))]
#[derive(Clone, Copy, Debug)]
pub struct PageTable(pub [u64; 512]);

impl PageTable {
    /// An empty table.
    pub const fn new() -> Self {
        Self([0; 512])
    }
}

impl Default for PageTable {
    fn default() -> Self {
        Self::new()
    }
}

/// Page tables reached by physical address: the direct map on the target,
/// a fake memory in host tests.
pub trait TableMemory {
    /// The table at physical address `phys` (a frame this memory handed out,
    /// or a root it was built with).
    fn table(&mut self, phys: u64) -> &mut PageTable;
    /// A new zeroed table frame, or `None` when memory is exhausted.
    fn alloc_table(&mut self) -> Option<u64>;
    /// Gives back a table frame from [`TableMemory::alloc_table`].
    fn free_table(&mut self, phys: u64);
}

/// Why a mapping could not be made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapError {
    /// No frame for an intermediate table.
    NoMemory,
    /// The address is not canonical or not page aligned.
    BadAddress,
    /// A large page already covers the address.
    LargePage,
}

const fn canonical(va: u64) -> bool {
    let top = va >> 47;
    top == 0 || top == 0x1_ffff
}

/// A four-level page-table walker and editor for the tables under one root.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapper {
    /// Physical address of the PML4.
    pub root: u64,
}

impl Mapper {
    /// The walker for the tables under the PML4 at `root`.
    pub const fn new(root: u64) -> Self {
        Self { root }
    }

    /// The physical address of the page table that holds `va`'s leaf entry,
    /// creating intermediate tables (flags [`TABLE_FLAGS`]) when `create`.
    fn leaf_table(
        &self,
        mem: &mut impl TableMemory,
        va: u64,
        create: bool,
    ) -> Result<Option<u64>, MapError> {
        let mut table = self.root;
        for level in [4u32, 3, 2] {
            let i = index(va, level);
            let e = mem.table(table).0[i];
            if e & PRESENT == 0 {
                if !create {
                    return Ok(None);
                }
                let t = mem.alloc_table().ok_or(MapError::NoMemory)?;
                mem.table(table).0[i] = t | TABLE_FLAGS;
                table = t;
            } else if e & HUGE != 0 {
                return Err(MapError::LargePage);
            } else {
                table = e & ADDR_MASK;
            }
        }
        Ok(Some(table))
    }

    /// Maps the 4 KiB page at `va` to frame `pa` with leaf `flags`, replacing
    /// any previous entry, which is returned (0 if there was none).
    pub fn map(
        &self,
        mem: &mut impl TableMemory,
        va: u64,
        pa: u64,
        flags: u64,
    ) -> Result<u64, MapError> {
        if !canonical(va) || !va.is_multiple_of(PAGE) || !pa.is_multiple_of(PAGE) {
            return Err(MapError::BadAddress);
        }
        let t = self.leaf_table(mem, va, true)?.ok_or(MapError::NoMemory)?;
        let slot = &mut mem.table(t).0[index(va, 1)];
        let old = *slot;
        *slot = (pa & ADDR_MASK) | flags;
        Ok(old)
    }

    /// The leaf entry for `va` (0 when nothing maps it).
    pub fn entry(&self, mem: &mut impl TableMemory, va: u64) -> u64 {
        if !canonical(va) {
            return 0;
        }
        match self.leaf_table(mem, va & !(PAGE - 1), false) {
            Ok(Some(t)) => mem.table(t).0[index(va, 1)],
            _ => 0,
        }
    }

    /// Replaces the leaf entry for `va` with `f(entry)` when it is present;
    /// returns the old entry (0 when nothing was mapped).
    pub fn update(&self, mem: &mut impl TableMemory, va: u64, f: impl FnOnce(u64) -> u64) -> u64 {
        if !canonical(va) {
            return 0;
        }
        match self.leaf_table(mem, va & !(PAGE - 1), false) {
            Ok(Some(t)) => {
                let slot = &mut mem.table(t).0[index(va, 1)];
                let old = *slot;
                if old & PRESENT != 0 {
                    *slot = f(old);
                }
                old
            }
            _ => 0,
        }
    }

    /// Removes the leaf for `va`; returns the old entry (0 if none).
    pub fn unmap(&self, mem: &mut impl TableMemory, va: u64) -> u64 {
        self.update(mem, va, |_| 0)
    }

    /// Calls `leaf(va, entry)` for every present 4 KiB leaf in `[start, end)`
    /// of the lower half, in address order, until `leaf` returns false.
    /// Absent tables are skipped whole at every level (512 GiB, 1 GiB,
    /// 2 MiB), so a walk over a huge, mostly empty range stays cheap.
    /// Returns the address after the last leaf visited when `leaf` stopped
    /// the walk, or `None` when it reached `end`.
    pub fn for_each_leaf(
        &self,
        mem: &mut impl TableMemory,
        start: u64,
        end: u64,
        mut leaf: impl FnMut(u64, u64) -> bool,
    ) -> Option<u64> {
        let end = end.min(USER_END);
        let mut va = start & !(PAGE - 1);
        'walk: while va < end {
            let mut table = self.root;
            for level in [4u32, 3, 2] {
                let e = mem.table(table).0[index(va, level)];
                if e & PRESENT == 0 || e & HUGE != 0 {
                    // Skip what this entry covers.
                    let span = 1u64 << (12 + 9 * (level - 1));
                    va = (va | (span - 1)).saturating_add(1);
                    continue 'walk;
                }
                table = e & ADDR_MASK;
            }
            let e = mem.table(table).0[index(va, 1)];
            if e & PRESENT != 0 && !leaf(va, e) {
                return Some(va + PAGE);
            }
            va += PAGE;
        }
        None
    }

    /// Frees every table of the lower half, calling `leaf(entry)` for each
    /// present leaf first (the owner frees the frames it owns), and clears
    /// the root's lower-half slots.
    pub fn free_lower_half(&self, mem: &mut impl TableMemory, mut leaf: impl FnMut(u64)) {
        for i4 in 0..KERNEL_PML4_FIRST {
            let e4 = mem.table(self.root).0[i4];
            if e4 & PRESENT == 0 {
                continue;
            }
            let pdpt = e4 & ADDR_MASK;
            for i3 in 0..512 {
                let e3 = mem.table(pdpt).0[i3];
                if e3 & PRESENT == 0 || e3 & HUGE != 0 {
                    continue;
                }
                let pd = e3 & ADDR_MASK;
                for i2 in 0..512 {
                    let e2 = mem.table(pd).0[i2];
                    if e2 & PRESENT == 0 || e2 & HUGE != 0 {
                        continue;
                    }
                    let pt = e2 & ADDR_MASK;
                    for i1 in 0..512 {
                        let e1 = mem.table(pt).0[i1];
                        if e1 & PRESENT != 0 {
                            leaf(e1);
                        }
                    }
                    mem.free_table(pt);
                }
                mem.free_table(pd);
            }
            mem.free_table(pdpt);
            mem.table(self.root).0[i4] = 0;
        }
    }
}

/// Leaf flags for a user page with the given rights (`nx` = the CPU
/// supports NX). x86 pages are always readable once present.
pub const fn user_leaf_flags(write: bool, exec: bool, nx: bool) -> u64 {
    let mut f = PRESENT | USER;
    if write {
        f |= WRITABLE;
    }
    if !exec && nx {
        f |= NO_EXECUTE;
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Page tables in a plain vector; frame `i` is at physical `(i + 1) * 4096`.
    struct FakeMemory {
        tables: Vec<PageTable>,
        free: Vec<u64>,
        limit: usize,
    }

    impl FakeMemory {
        fn new(limit: usize) -> (Self, u64) {
            let mut m = FakeMemory {
                tables: Vec::new(),
                free: Vec::new(),
                limit,
            };
            let root = m.alloc_table().unwrap();
            (m, root)
        }
        fn live(&self) -> usize {
            self.tables.len() - self.free.len()
        }
    }

    impl TableMemory for FakeMemory {
        fn table(&mut self, phys: u64) -> &mut PageTable {
            &mut self.tables[(phys / PAGE - 1) as usize]
        }
        fn alloc_table(&mut self) -> Option<u64> {
            if let Some(p) = self.free.pop() {
                *self.table(p) = PageTable::new();
                return Some(p);
            }
            if self.tables.len() >= self.limit {
                return None;
            }
            self.tables.push(PageTable::new());
            Some(self.tables.len() as u64 * PAGE)
        }
        fn free_table(&mut self, phys: u64) {
            assert!(!self.free.contains(&phys), "table {phys:#x} freed twice");
            self.free.push(phys);
        }
    }

    #[test]
    fn map_translate_unmap() {
        let (mut m, root) = FakeMemory::new(64);
        let mp = Mapper::new(root);
        let va = 0x40_1000;
        assert_eq!(mp.entry(&mut m, va), 0);
        assert_eq!(mp.map(&mut m, va, 0x7000, PRESENT | USER), Ok(0));
        assert_eq!(mp.entry(&mut m, va + 0x123), 0x7000 | PRESENT | USER);
        assert_eq!(mp.entry(&mut m, va + PAGE), 0);
        // Three intermediate tables were made.
        assert_eq!(m.live(), 4);
        let old = mp.update(&mut m, va, |e| e | WRITABLE);
        assert_eq!(old, 0x7000 | PRESENT | USER);
        assert_eq!(mp.unmap(&mut m, va), 0x7000 | PRESENT | USER | WRITABLE);
        assert_eq!(mp.entry(&mut m, va), 0);
        assert_eq!(
            mp.map(&mut m, 0x8000_0000_0000, 0, PRESENT),
            Err(MapError::BadAddress)
        );
        assert_eq!(
            mp.map(&mut m, 0x1001, 0, PRESENT),
            Err(MapError::BadAddress)
        );
    }

    #[test]
    fn out_of_tables_is_an_error() {
        let (mut m, root) = FakeMemory::new(3);
        let mp = Mapper::new(root);
        assert_eq!(
            mp.map(&mut m, 0x1000, 0x1000, PRESENT),
            Err(MapError::NoMemory)
        );
    }

    #[test]
    fn leaves_are_visited_and_the_half_is_freed() {
        let (mut m, root) = FakeMemory::new(64);
        let mp = Mapper::new(root);
        let pages = [
            0x1000u64,
            0x2000,
            0x40_0000,
            0x7fff_ffff_f000,
            0x1_0000_0000,
        ];
        for (i, &va) in pages.iter().enumerate() {
            mp.map(&mut m, va, (i as u64 + 1) * 0x10_0000, PRESENT | USER)
                .unwrap();
        }
        // A runtime-half entry must survive.
        m.table(root).0[511] = 0xabc000 | PRESENT;
        let mut seen = Vec::new();
        mp.for_each_leaf(&mut m, 0, USER_END, |va, _| {
            seen.push(va);
            true
        });
        let mut first = Vec::new();
        let stopped = mp.for_each_leaf(&mut m, 0, USER_END, |va, _| {
            first.push(va);
            first.len() < 2
        });
        assert_eq!(first, vec![0x1000, 0x2000]);
        assert_eq!(stopped, Some(0x3000));
        assert_eq!(seen, {
            let mut p = pages.to_vec();
            p.sort();
            p
        });
        let mut freed = Vec::new();
        mp.free_lower_half(&mut m, |e| freed.push(e & ADDR_MASK));
        assert_eq!(freed.len(), pages.len());
        assert_eq!(m.live(), 1, "only the root is left");
        assert_eq!(m.table(root).0[511], 0xabc000 | PRESENT);
        assert!(m.table(root).0[..256].iter().all(|&e| e == 0));
    }

    #[test]
    fn address_translations() {
        assert_eq!(phys_to_virt(0xfee0_0000), 0xffff_8000_fee0_0000);
        assert_eq!(virt_to_phys(0xffff_8000_fee0_0000), Some(0xfee0_0000));
        assert_eq!(virt_to_phys(KERNEL_VMA + 0x10_0000), Some(0x10_0000));
        assert_eq!(virt_to_phys(0x40_0000), None);
        assert_eq!(index(KERNEL_VMA, 4), 511);
        assert_eq!(index(DIRECT_MAP, 4), KERNEL_PML4_FIRST);
        let f = user_leaf_flags(false, false, true);
        assert_eq!(f & (WRITABLE | NO_EXECUTE | USER), NO_EXECUTE | USER);
        assert_eq!(user_leaf_flags(true, true, true) & NO_EXECUTE, 0);
    }

    fn layout() -> ImageLayout {
        ImageLayout {
            text: (0x10_1000, 0x12_0000),
            rodata: (0x12_0000, 0x13_0000),
            data: (0x13_0000, 0x20_0000),
            user_text: (0x20_0000, 0x20_2000),
            user_data: (0x20_2000, 0x21_0000),
        }
    }

    #[test]
    fn classification() {
        let l = layout();
        assert_eq!(l.classify(0), PageKind::Null);
        assert_eq!(l.classify(0xb8000), PageKind::Data);
        assert_eq!(l.classify(0x10_1000), PageKind::Text);
        assert_eq!(l.classify(0x11_ffff), PageKind::Text);
        assert_eq!(l.classify(0x12_0000), PageKind::Rodata);
        assert_eq!(l.classify(0x20_1fff), PageKind::UserText);
        assert_eq!(l.classify(0x20_2000), PageKind::UserData);
        assert_eq!(l.classify(0x21_0000), PageKind::Data);
    }

    #[test]
    fn rights() {
        assert_eq!(
            leaf_flags(PageKind::Text, true) & (USER | WRITABLE | NO_EXECUTE),
            0
        );
        assert_eq!(
            leaf_flags(PageKind::UserText, true) & (WRITABLE | NO_EXECUTE),
            0
        );
        assert_ne!(leaf_flags(PageKind::UserText, true) & USER, 0);
        for k in [PageKind::Rodata, PageKind::Data, PageKind::UserData] {
            assert_ne!(leaf_flags(k, true) & NO_EXECUTE, 0, "{k:?} must be NX");
            assert_eq!(leaf_flags(k, false) & NO_EXECUTE, 0);
        }
        assert_eq!(leaf_flags(PageKind::Data, true) & USER, 0);
        assert_eq!(leaf_flags(PageKind::Null, true) & PRESENT, 0);
        assert_ne!(large_page_flags(0xfec0_0000, true) & CACHE_DISABLE, 0);
        assert_eq!(
            large_page_flags(0x4000_0000, true) & (CACHE_DISABLE | USER),
            0
        );
    }

    #[test]
    fn indices() {
        let a = 0x0000_7fff_ffff_f000u64;
        assert_eq!(index(a, 4), 255);
        assert_eq!(index(a, 1), 511);
        assert_eq!(index(0x20_1000, 2), 1);
        assert_eq!(index(0x20_1000, 1), 1);
        assert_eq!(core::mem::size_of::<PageTable>(), 4096);
        assert_eq!(core::mem::align_of::<PageTable>(), 4096);
    }
}
