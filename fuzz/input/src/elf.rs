//! Static Linux programs built from fuzz input, for the ELF loader's plan:
//! an ELF header and program header table of either class, PT_LOAD
//! segments laid out the way linkers do (increasing pages, file offsets
//! congruent to addresses) unless the input asks for raw values, the other
//! program headers the plan reads (PT_PHDR, PT_TLS, PT_GNU_STACK,
//! PT_INTERP, PT_DYNAMIC), then arbitrary overwrites of header fields.

use arbitrary::Arbitrary;

/// Raw program header values.
#[derive(Clone, Copy, Debug, Arbitrary)]
pub struct RawPh {
    /// `p_type`.
    pub p_type: u32,
    /// `p_flags`.
    pub flags: u32,
    /// `p_offset`.
    pub offset: u64,
    /// `p_vaddr`.
    pub vaddr: u64,
    /// `p_filesz`.
    pub filesz: u64,
    /// `p_memsz`.
    pub memsz: u64,
    /// `p_align`.
    pub align: u64,
}

/// A PT_LOAD segment, laid out after the previous one.
#[derive(Clone, Copy, Debug, Arbitrary)]
pub struct LoadSpec {
    /// Pages skipped after the previous segment (0: the next page).
    pub gap_pages: u8,
    /// Offset of the segment's start in its page.
    pub in_page: u16,
    /// Bytes from the file.
    pub filesz: u16,
    /// Bytes of zero fill after them.
    pub bss: u16,
    /// PF_X, PF_W, PF_R in the low three bits.
    pub flags: u8,
    /// `p_align` is `1 << (align_log % 24)`.
    pub align_log: u8,
}

/// A program header other than PT_LOAD.
#[derive(Clone, Copy, Debug, Arbitrary)]
pub enum OtherPh {
    /// PT_PHDR at the table's address (or a raw one).
    Phdr(Option<u64>),
    /// PT_TLS.
    Tls(RawPh),
    /// PT_GNU_STACK with these flags.
    GnuStack(u32),
    /// PT_INTERP naming bytes of the file.
    Interp {
        /// `p_offset`.
        offset: u16,
        /// `p_filesz`.
        len: u16,
    },
    /// PT_DYNAMIC over bytes of the file (DT_NEEDED entries in the tail).
    Dynamic {
        /// `p_offset`.
        offset: u16,
        /// `p_filesz`.
        len: u16,
    },
    /// Anything else.
    Raw(RawPh),
}

/// A field overwritten after the file is laid out.
#[derive(Clone, Copy, Debug, Arbitrary)]
pub struct Edit {
    /// Byte offset (modulo the file length).
    pub offset: u16,
    /// Width: 1, 2, 4 or 8 bytes (low two bits select).
    pub width: u8,
    /// The value (little-endian, cut to the width).
    pub value: u64,
}

/// A program.
#[derive(Clone, Debug, Arbitrary)]
pub struct ElfSpec {
    /// ELFCLASS32 / EM_386 instead of ELFCLASS64 / EM_X86_64.
    pub class32: bool,
    /// ET_DYN (static-pie) instead of ET_EXEC.
    pub pie: bool,
    /// The PT_LOAD segments.
    pub loads: Vec<LoadSpec>,
    /// Raw PT_LOAD headers appended after the laid-out ones.
    pub raw_loads: Vec<RawPh>,
    /// Other program headers.
    pub others: Vec<OtherPh>,
    /// The entry point: this segment (modulo their number), this offset.
    pub entry_segment: u8,
    /// Offset of the entry point in its segment.
    pub entry_offset: u16,
    /// Bytes after the segments' file bytes (dynamic entries, notes, names).
    pub tail: Vec<u8>,
    /// Overwrites applied last.
    pub edits: Vec<Edit>,
}

/// An input of the image reader: the test appliance with fields
/// overwritten (offsets cover its 13 KB), or any bytes; and addresses to
/// look up in the image.
#[derive(Clone, Debug, Arbitrary)]
pub enum ImageInput {
    /// The appliance with fields overwritten.
    Edited(Vec<Edit>, Vec<u64>),
    /// Anything.
    Raw(Vec<u8>, Vec<u64>),
}

impl ImageInput {
    /// The ELF bytes.
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            ImageInput::Edited(edits, _) => {
                let mut b = crate::perf::APPLIANCE_ELF.to_vec();
                for e in edits.iter().take(16) {
                    e.apply(&mut b);
                }
                b
            }
            ImageInput::Raw(b, _) => b.clone(),
        }
    }

    /// The addresses to look up.
    pub fn probes(&self) -> &[u64] {
        match self {
            ImageInput::Edited(_, ips) | ImageInput::Raw(_, ips) => ips,
        }
    }
}

const PAGE: u64 = 4096;

fn put(b: &mut [u8], off: usize, v: u64, width: usize) {
    if let Some(dst) = b.get_mut(off..off + width) {
        dst.copy_from_slice(&v.to_le_bytes()[..width]);
    }
}

impl Edit {
    /// Applies the overwrite to `bytes`.
    pub fn apply(&self, bytes: &mut [u8]) {
        if bytes.is_empty() {
            return;
        }
        let width = 1 << (self.width & 3);
        let off = usize::from(self.offset) % bytes.len();
        put(bytes, off, self.value, width.min(bytes.len() - off));
    }
}

impl ElfSpec {
    /// The file's bytes.
    pub fn build(&self) -> Vec<u8> {
        let (ehsize, phentsize) = if self.class32 { (52, 32) } else { (64, 56) };
        let loads = &self.loads[..self.loads.len().min(8)];
        let raw_loads = &self.raw_loads[..self.raw_loads.len().min(4)];
        let others = &self.others[..self.others.len().min(8)];
        let phnum = (loads.len() + raw_loads.len() + others.len()).max(1);
        let table_end = ehsize + phentsize * phnum as u64;
        let base: u64 = if self.pie { 0 } else { 0x40_0000 };

        // Laid-out loads: the first one also maps the headers, from file
        // offset 0, as linkers do.
        let mut phs = Vec::new();
        let mut page = 0u64;
        let mut file_end = table_end;
        for (i, l) in loads.iter().enumerate() {
            let in_page = if i == 0 {
                0
            } else {
                u64::from(l.in_page) % PAGE
            };
            let filesz = if i == 0 {
                table_end + u64::from(l.filesz)
            } else {
                u64::from(l.filesz)
            };
            let offset = page * PAGE + in_page;
            phs.push(RawPh {
                p_type: 1,
                flags: u32::from(l.flags & 7),
                offset,
                vaddr: base + offset,
                filesz,
                memsz: filesz + u64::from(l.bss),
                align: 1 << (l.align_log % 24),
            });
            file_end = file_end.max(offset + filesz);
            let end = offset + filesz + u64::from(l.bss);
            page = end.div_ceil(PAGE) + u64::from(l.gap_pages % 4);
        }
        phs.extend_from_slice(raw_loads);
        let tail_at = file_end;
        for o in others {
            phs.push(match *o {
                OtherPh::Phdr(addr) => RawPh {
                    p_type: 6,
                    flags: 4,
                    offset: ehsize,
                    vaddr: addr.unwrap_or(base + ehsize),
                    filesz: table_end - ehsize,
                    memsz: table_end - ehsize,
                    align: 8,
                },
                OtherPh::Tls(raw) => RawPh { p_type: 7, ..raw },
                OtherPh::GnuStack(flags) => RawPh {
                    p_type: 0x6474_e551,
                    flags,
                    offset: 0,
                    vaddr: 0,
                    filesz: 0,
                    memsz: 0,
                    align: 16,
                },
                OtherPh::Interp { offset, len } => RawPh {
                    p_type: 3,
                    flags: 4,
                    offset: tail_at + u64::from(offset % 512),
                    vaddr: 0,
                    filesz: u64::from(len % 512),
                    memsz: u64::from(len % 512),
                    align: 1,
                },
                OtherPh::Dynamic { offset, len } => RawPh {
                    p_type: 2,
                    flags: 6,
                    offset: tail_at + u64::from(offset % 512),
                    vaddr: 0,
                    filesz: u64::from(len % 1024),
                    memsz: u64::from(len % 1024),
                    align: 8,
                },
                OtherPh::Raw(raw) => raw,
            });
        }
        if phs.is_empty() {
            phs.push(RawPh {
                p_type: 0,
                flags: 0,
                offset: 0,
                vaddr: 0,
                filesz: 0,
                memsz: 0,
                align: 0,
            });
        }
        let entry = match loads.len() {
            0 => base + u64::from(self.entry_offset),
            n => {
                let s = &phs[usize::from(self.entry_segment) % n];
                s.vaddr + u64::from(self.entry_offset) % s.filesz.max(1)
            }
        };

        let tail = &self.tail[..self.tail.len().min(2048)];
        let len = (tail_at as usize + tail.len()).min(1 << 20);
        let mut b = vec![0u8; len];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = if self.class32 { 1 } else { 2 }; // EI_CLASS
        b[5] = 1; // ELFDATA2LSB
        b[6] = 1; // EV_CURRENT
        put(&mut b, 16, if self.pie { 3 } else { 2 }, 2); // e_type
        put(&mut b, 18, if self.class32 { 3 } else { 62 }, 2); // e_machine
        put(&mut b, 20, 1, 4); // e_version
        if self.class32 {
            put(&mut b, 24, entry, 4);
            put(&mut b, 28, ehsize, 4); // e_phoff
            put(&mut b, 40, ehsize, 2);
            put(&mut b, 42, phentsize, 2);
            put(&mut b, 44, phnum as u64, 2);
        } else {
            put(&mut b, 24, entry, 8);
            put(&mut b, 32, ehsize, 8); // e_phoff
            put(&mut b, 52, ehsize, 2);
            put(&mut b, 54, phentsize, 2);
            put(&mut b, 56, phnum as u64, 2);
        }
        for (i, ph) in phs.iter().enumerate() {
            let at = (ehsize + phentsize * i as u64) as usize;
            if self.class32 {
                put(&mut b, at, u64::from(ph.p_type), 4);
                put(&mut b, at + 4, ph.offset, 4);
                put(&mut b, at + 8, ph.vaddr, 4);
                put(&mut b, at + 12, ph.vaddr, 4); // p_paddr
                put(&mut b, at + 16, ph.filesz, 4);
                put(&mut b, at + 20, ph.memsz, 4);
                put(&mut b, at + 24, u64::from(ph.flags), 4);
                put(&mut b, at + 28, ph.align, 4);
            } else {
                put(&mut b, at, u64::from(ph.p_type), 4);
                put(&mut b, at + 4, u64::from(ph.flags), 4);
                put(&mut b, at + 8, ph.offset, 8);
                put(&mut b, at + 16, ph.vaddr, 8);
                put(&mut b, at + 24, ph.vaddr, 8); // p_paddr
                put(&mut b, at + 32, ph.filesz, 8);
                put(&mut b, at + 40, ph.memsz, 8);
                put(&mut b, at + 48, ph.align, 8);
            }
        }
        if let Some(dst) = b.get_mut(tail_at as usize..) {
            let n = dst.len().min(tail.len());
            dst[..n].copy_from_slice(&tail[..n]);
        }
        for e in self.edits.iter().take(16) {
            e.apply(&mut b);
        }
        b
    }
}
