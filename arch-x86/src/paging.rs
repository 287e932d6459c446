//! Page-table entry encoding and the policy that decides each page's rights.
//!
//! The runtime maps its own image supervisor-only and the appliance's
//! `.user.*` sections user-accessible, with NX on everything that is not
//! code. The policy is a pure function of the image layout so it is tested
//! here; the runtime only writes the entries it returns.

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

#[cfg(test)]
mod tests {
    use super::*;

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
