//! Boot protocol structures: the PVH start info and multiboot2 information tags.
//!
//! Parsing works on plain byte slices so it is tested on the host; the
//! runtime builds the slices from the physical pointers it was handed.

/// `hvm_start_info.magic` for PVH boots.
pub const PVH_START_MAGIC: u32 = 0x336e_c578;
/// `eax` value set by a multiboot2 loader.
pub const MULTIBOOT2_BOOT_MAGIC: u32 = 0x36d7_6289;
/// Multiboot2 header magic (in the image).
pub const MULTIBOOT2_HEADER_MAGIC: u32 = 0xe852_50d6;
/// Xen ELF note type for the 32-bit PVH entry point.
pub const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;

/// The start of Xen's `hvm_start_info` (version 1), as QEMU hands it over.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PvhStartInfo {
    /// Must be [`PVH_START_MAGIC`].
    pub magic: u32,
    /// Structure version.
    pub version: u32,
    /// Flags.
    pub flags: u32,
    /// Number of modules.
    pub nr_modules: u32,
    /// Physical address of the module list.
    pub modlist_paddr: u64,
    /// Physical address of the NUL-terminated command line (0 if none).
    pub cmdline_paddr: u64,
    /// Physical address of the ACPI RSDP.
    pub rsdp_paddr: u64,
    /// Physical address of the memory map (version 1).
    pub memmap_paddr: u64,
    /// Entries in the memory map.
    pub memmap_entries: u32,
    /// Reserved.
    pub reserved: u32,
}

/// Which loader started the runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootProtocol {
    /// Xen PVH entry (`qemu -kernel`).
    Pvh,
    /// Multiboot2 (GRUB).
    Multiboot2,
    /// Neither magic matched.
    Unknown,
}

impl BootProtocol {
    /// Decides the protocol from the entry `eax` and the first word at `ebx`.
    pub fn detect(eax: u32, first_word_at_ebx: Option<u32>) -> Self {
        if eax == MULTIBOOT2_BOOT_MAGIC {
            BootProtocol::Multiboot2
        } else if first_word_at_ebx == Some(PVH_START_MAGIC) {
            BootProtocol::Pvh
        } else {
            BootProtocol::Unknown
        }
    }

    /// A short name for boot messages.
    pub fn name(self) -> &'static str {
        match self {
            BootProtocol::Pvh => "pvh",
            BootProtocol::Multiboot2 => "multiboot2",
            BootProtocol::Unknown => "unknown",
        }
    }
}

/// Why boot information could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootInfoError {
    /// The structure is shorter than its header claims.
    Truncated,
    /// A tag's size field is impossible.
    BadTag,
}

/// Reads the total size of a multiboot2 information structure from its first 8 bytes.
pub fn multiboot2_total_size(header: &[u8]) -> Result<usize, BootInfoError> {
    let b = header.get(0..4).ok_or(BootInfoError::Truncated)?;
    let size = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
    if size < 8 {
        return Err(BootInfoError::BadTag);
    }
    Ok(size)
}

/// Finds the command line (tag type 1) in a multiboot2 information structure.
///
/// `info` must start at the structure and cover its total size. Returns the
/// string bytes without the terminating NUL, or `None` if there is no tag.
pub fn multiboot2_cmdline(info: &[u8]) -> Result<Option<&[u8]>, BootInfoError> {
    let total = multiboot2_total_size(info)?;
    let info = info.get(..total).ok_or(BootInfoError::Truncated)?;
    let mut off = 8;
    while off + 8 <= info.len() {
        let ty = u32::from_le_bytes([info[off], info[off + 1], info[off + 2], info[off + 3]]);
        let size = u32::from_le_bytes([info[off + 4], info[off + 5], info[off + 6], info[off + 7]])
            as usize;
        if ty == 0 {
            return Ok(None);
        }
        if size < 8 {
            return Err(BootInfoError::BadTag);
        }
        let body = info
            .get(off + 8..off + size)
            .ok_or(BootInfoError::Truncated)?;
        if ty == 1 {
            return Ok(Some(until_nul(body)));
        }
        off += size.next_multiple_of(8);
    }
    Ok(None)
}

/// A range of physical memory from the boot memory map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemRegion {
    /// First byte.
    pub base: u64,
    /// Length in bytes.
    pub len: u64,
    /// The map's type: 1 is usable RAM (the same in E820, PVH and multiboot2).
    pub kind: u32,
}

impl MemRegion {
    /// Usable RAM.
    pub const USABLE: u32 = 1;

    /// True for usable RAM.
    pub fn usable(&self) -> bool {
        self.kind == Self::USABLE
    }
}

/// A boot module (the boot archive) in physical memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Module {
    /// First byte.
    pub base: u64,
    /// Length in bytes.
    pub len: u64,
}

fn le_u32(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

fn le_u64(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(off..off + 8)?.try_into().ok()?))
}

/// Size of one `hvm_memmap_table_entry` (addr, size, type, reserved).
pub const PVH_MEMMAP_ENTRY: usize = 24;
/// Size of one `hvm_modlist_entry` (paddr, size, cmdline_paddr, reserved).
pub const PVH_MODLIST_ENTRY: usize = 32;

/// The entries of a PVH memory map (`memmap_entries` entries of
/// [`PVH_MEMMAP_ENTRY`] bytes at `memmap_paddr`).
pub fn pvh_memmap(table: &[u8]) -> impl Iterator<Item = MemRegion> + '_ {
    table.chunks_exact(PVH_MEMMAP_ENTRY).map(|e| MemRegion {
        base: le_u64(e, 0).unwrap_or(0),
        len: le_u64(e, 8).unwrap_or(0),
        kind: le_u32(e, 16).unwrap_or(0),
    })
}

/// The entries of a PVH module list (`nr_modules` entries of
/// [`PVH_MODLIST_ENTRY`] bytes at `modlist_paddr`).
pub fn pvh_modules(list: &[u8]) -> impl Iterator<Item = Module> + '_ {
    list.chunks_exact(PVH_MODLIST_ENTRY).map(|e| Module {
        base: le_u64(e, 0).unwrap_or(0),
        len: le_u64(e, 8).unwrap_or(0),
    })
}

/// The tags of a multiboot2 information structure as `(type, body)`, up to
/// the end tag; stops at the first malformed tag.
pub fn multiboot2_tags(info: &[u8]) -> impl Iterator<Item = (u32, &[u8])> + '_ {
    let total = multiboot2_total_size(info)
        .ok()
        .map_or(0, |t| t.min(info.len()));
    let info = &info[..total];
    let mut off = 8;
    core::iter::from_fn(move || {
        let ty = le_u32(info, off)?;
        let size = le_u32(info, off + 4)? as usize;
        if ty == 0 || size < 8 {
            return None;
        }
        let body = info.get(off + 8..off + size)?;
        off += size.next_multiple_of(8);
        Some((ty, body))
    })
}

/// Multiboot2 tag type of a module.
pub const MB2_TAG_MODULE: u32 = 3;
/// Multiboot2 tag type of the memory map.
pub const MB2_TAG_MMAP: u32 = 6;
/// Multiboot2 tag type of a copy of an ACPI 1.0 RSDP.
pub const MB2_TAG_ACPI_OLD: u32 = 14;
/// Multiboot2 tag type of a copy of an ACPI 2.0+ RSDP.
pub const MB2_TAG_ACPI_NEW: u32 = 15;
/// Bytes of an ACPI 2.0 RSDP (a 1.0 RSDP is the first 20).
pub const RSDP_LEN: usize = 36;

/// The regions of a multiboot2 memory-map tag body (entry_size, entry_version, entries).
pub fn multiboot2_mmap(body: &[u8]) -> impl Iterator<Item = MemRegion> + '_ {
    let size = le_u32(body, 0).unwrap_or(0) as usize;
    let entries = if size >= 20 {
        body.get(8..).unwrap_or(&[])
    } else {
        &[]
    };
    entries.chunks_exact(size.max(1)).filter_map(|e| {
        Some(MemRegion {
            base: le_u64(e, 0)?,
            len: le_u64(e, 8)?,
            kind: le_u32(e, 16)?,
        })
    })
}

/// The module of a multiboot2 module tag body (mod_start, mod_end, string).
pub fn multiboot2_module(body: &[u8]) -> Option<Module> {
    let start = u64::from(le_u32(body, 0)?);
    let end = u64::from(le_u32(body, 4)?);
    (end >= start).then_some(Module {
        base: start,
        len: end - start,
    })
}

/// The bytes of `s` before its first NUL (all of `s` if there is none).
pub fn until_nul(s: &[u8]) -> &[u8] {
    let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn pvh_start_info_layout() {
        assert_eq!(size_of::<PvhStartInfo>(), 56);
        assert_eq!(offset_of!(PvhStartInfo, nr_modules), 12);
        assert_eq!(offset_of!(PvhStartInfo, cmdline_paddr), 24);
        assert_eq!(offset_of!(PvhStartInfo, rsdp_paddr), 32);
        assert_eq!(offset_of!(PvhStartInfo, memmap_entries), 48);
    }

    #[test]
    fn detect_protocol() {
        assert_eq!(
            BootProtocol::detect(MULTIBOOT2_BOOT_MAGIC, None),
            BootProtocol::Multiboot2
        );
        assert_eq!(
            BootProtocol::detect(0, Some(PVH_START_MAGIC)),
            BootProtocol::Pvh
        );
        assert_eq!(BootProtocol::detect(0, Some(1)), BootProtocol::Unknown);
    }

    fn tag(ty: u32, body: &[u8]) -> Vec<u8> {
        let mut t = Vec::new();
        t.extend_from_slice(&ty.to_le_bytes());
        t.extend_from_slice(&((8 + body.len()) as u32).to_le_bytes());
        t.extend_from_slice(body);
        while t.len() % 8 != 0 {
            t.push(0);
        }
        t
    }

    fn info(tags: &[Vec<u8>]) -> Vec<u8> {
        let mut body: Vec<u8> = tags.concat();
        body.extend(tag(0, &[]));
        let mut v = Vec::new();
        v.extend_from_slice(&((8 + body.len()) as u32).to_le_bytes());
        v.extend_from_slice(&0u32.to_le_bytes());
        v.extend(body);
        v
    }

    #[test]
    fn finds_cmdline_after_other_tags() {
        let i = info(&[tag(2, b"GRUB 2.06\0"), tag(1, b"selftest freq=100\0")]);
        assert_eq!(
            multiboot2_cmdline(&i).unwrap(),
            Some(&b"selftest freq=100"[..])
        );
    }

    #[test]
    fn multiboot2_memory_map_and_modules() {
        let mut mmap = Vec::new();
        mmap.extend_from_slice(&24u32.to_le_bytes());
        mmap.extend_from_slice(&0u32.to_le_bytes());
        for (base, len, kind) in [
            (0u64, 0x9fc00u64, 1u32),
            (0x10_0000, 0x7ee_0000, 1),
            (0xfffc_0000, 0x4_0000, 2),
        ] {
            mmap.extend_from_slice(&base.to_le_bytes());
            mmap.extend_from_slice(&len.to_le_bytes());
            mmap.extend_from_slice(&kind.to_le_bytes());
            mmap.extend_from_slice(&0u32.to_le_bytes());
        }
        let mut module = Vec::new();
        module.extend_from_slice(&0x20_0000u32.to_le_bytes());
        module.extend_from_slice(&0x20_1234u32.to_le_bytes());
        module.extend_from_slice(b"archive\0");
        let i = info(&[
            tag(1, b"x\0"),
            tag(MB2_TAG_MMAP, &mmap),
            tag(MB2_TAG_MODULE, &module),
        ]);
        let tags: Vec<_> = multiboot2_tags(&i).collect();
        assert_eq!(tags.len(), 3);
        let (_, body) = tags.iter().find(|t| t.0 == MB2_TAG_MMAP).unwrap();
        let regions: Vec<_> = multiboot2_mmap(body).collect();
        assert_eq!(regions.len(), 3);
        assert_eq!(
            regions[1],
            MemRegion {
                base: 0x10_0000,
                len: 0x7ee_0000,
                kind: 1
            }
        );
        assert!(!regions[2].usable());
        let (_, body) = tags.iter().find(|t| t.0 == MB2_TAG_MODULE).unwrap();
        assert_eq!(
            multiboot2_module(body),
            Some(Module {
                base: 0x20_0000,
                len: 0x1234
            })
        );
        // Damaged tags end the walk instead of running past the end.
        let mut bad = i.clone();
        bad[12] = 1;
        assert_eq!(multiboot2_tags(&bad).count(), 0);
        assert_eq!(multiboot2_tags(&i[..17]).count(), 0);
        assert_eq!(multiboot2_tags(&i[..18]).count(), 1);
    }

    #[test]
    fn pvh_tables() {
        let mut t = Vec::new();
        for (base, len, kind) in [(0u64, 0x9fc00u64, 1u32), (0x10_0000, 0x3ff0_0000, 1)] {
            t.extend_from_slice(&base.to_le_bytes());
            t.extend_from_slice(&len.to_le_bytes());
            t.extend_from_slice(&kind.to_le_bytes());
            t.extend_from_slice(&0u32.to_le_bytes());
        }
        let r: Vec<_> = pvh_memmap(&t).collect();
        assert_eq!(
            r[1],
            MemRegion {
                base: 0x10_0000,
                len: 0x3ff0_0000,
                kind: 1
            }
        );
        let mut m = Vec::new();
        for w in [0x1234_5000u64, 0x800, 0, 0] {
            m.extend_from_slice(&w.to_le_bytes());
        }
        assert_eq!(
            pvh_modules(&m).collect::<Vec<_>>(),
            vec![Module {
                base: 0x1234_5000,
                len: 0x800
            }]
        );
        assert_eq!(pvh_modules(&m[..31]).count(), 0);
    }

    #[test]
    fn no_cmdline_tag() {
        let i = info(&[tag(2, b"x\0")]);
        assert_eq!(multiboot2_cmdline(&i).unwrap(), None);
    }

    #[test]
    fn truncated_and_bad_tags_are_errors() {
        let mut i = info(&[tag(1, b"abc\0")]);
        assert_eq!(multiboot2_cmdline(&i[..4]), Err(BootInfoError::Truncated));
        i[12] = 3; // tag size 3 < 8
        assert_eq!(multiboot2_cmdline(&i), Err(BootInfoError::BadTag));
        let mut j = info(&[tag(1, b"abc\0")]);
        j[12] = 200; // tag runs past the end
        assert_eq!(multiboot2_cmdline(&j), Err(BootInfoError::Truncated));
    }
}
