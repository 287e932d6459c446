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
