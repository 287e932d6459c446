//! The ELF loader's plan: checks a static Linux program and says where each segment goes.
//!
//! [`plan`] reads the program with the `object` crate's ELF reader and checks everything
//! before anything is mapped, as Linux's `binfmt_elf` does: the identification (class,
//! data encoding, version, OS ABI), the machine (ELFCLASS64 + EM_X86_64 runs in 64-bit
//! mode, ELFCLASS32 + EM_386 in compat mode), the type (ET_EXEC, or ET_DYN as static-pie),
//! the program header table, and every PT_LOAD segment (sizes, file range, page offsets,
//! overflow, user-half limits, the 64 KiB floor, order and overlap). A program with
//! PT_INTERP is refused with [`ElfError::Dynamic`]: the runtime has no dynamic linker.
//!
//! The resulting [`LoadPlan`] has every address already biased. The runtime maps, for each
//! [`Segment`], the pages covering `[vaddr, vaddr + memsz)` with the segment's [`Prot`]
//! (x86 cannot express write-only or execute-only pages, so a mapping is readable whenever
//! it is anything), fills `[vaddr, vaddr + filesz)` from `file[file_offset..][..filesz]`, and
//! zeroes the rest of those pages. The bytes of the first page below `vaddr` may be zero or
//! may come from the file (`file_offset - vaddr % PAGE_SIZE` onwards); programs do not read
//! them, but AT_PHDR usually points into the first segment's file bytes (see
//! [`LoadPlan::phdr_addr`], which is checked to be inside a segment's file part).
//!
//! Two segments never share a page here ([`SegmentProblem::SharesPage`]): Linux allows it
//! (the later mapping wins), but the linkers' default layouts never produce it, and refusing
//! it lets the runtime map each page with exactly one segment's permissions.
//!
//! Static-pie programs (ET_DYN without PT_INTERP, e.g. Rust's x86_64-unknown-linux-musl
//! default) relocate themselves from the auxv; the plan only picks the load bias:
//! [`PIE_BASE_64`] or [`PIE_BASE_32`], rounded up to the largest PT_LOAD alignment.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use object::LittleEndian as LE;
use object::elf;
use object::read::elf::{FileHeader, ProgramHeader};

/// The page size segments are checked and mapped with.
pub const PAGE_SIZE: u64 = 4096;
/// Nothing is mapped below this address (Linux's default `vm.mmap_min_addr`).
pub const MIN_ADDR: u64 = 0x1_0000;
/// The end of the 64-bit user half (Linux's `TASK_SIZE_MAX`).
pub const USER_END_64: u64 = 0x0000_7fff_ffff_f000;
/// The end of a compat process's address space (Linux's `IA32_PAGE_OFFSET` minus the vDSO
/// page; the same limit Linux uses for i386 processes on x86-64).
pub const USER_END_32: u64 = 0xffff_e000;
/// Load bias of a 64-bit static-pie program (where Linux puts PIE programs without ASLR).
pub const PIE_BASE_64: u64 = 0x5555_5555_4000;
/// Load bias of an i386 static-pie program (where Linux puts them without ASLR).
pub const PIE_BASE_32: u64 = 0x5655_5000;
/// The largest program header table accepted, in bytes (as Linux: one page).
pub const MAX_PHDR_TABLE: usize = 4096;

/// The program's word size, which decides the CPU mode and the system-call ABI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// ELFCLASS64 + EM_X86_64: 64-bit mode, SYSCALL.
    Elf64,
    /// ELFCLASS32 + EM_386: compat mode, `int 0x80`.
    Elf32,
}

impl Class {
    /// The size of a pointer in bytes: 8 or 4.
    pub fn word_size(self) -> usize {
        match self {
            Class::Elf64 => 8,
            Class::Elf32 => 4,
        }
    }

    /// The AT_PLATFORM string Linux gives processes of this class.
    pub fn platform(self) -> &'static [u8] {
        match self {
            Class::Elf64 => b"x86_64",
            Class::Elf32 => b"i686",
        }
    }

    /// The end of the user address space for this class.
    pub fn user_end(self) -> u64 {
        match self {
            Class::Elf64 => USER_END_64,
            Class::Elf32 => USER_END_32,
        }
    }
}

/// How the program is linked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// ET_EXEC: linked at fixed addresses; bias 0.
    Exec,
    /// ET_DYN without PT_INTERP: a static-pie program, loaded at a bias.
    StaticPie,
}

/// Segment permissions, from `p_flags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Prot {
    /// PF_R.
    pub read: bool,
    /// PF_W.
    pub write: bool,
    /// PF_X.
    pub exec: bool,
}

/// One PT_LOAD segment, with its address biased.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Where the segment's first byte goes (not page aligned in general).
    pub vaddr: u64,
    /// Bytes in memory, from `vaddr`.
    pub memsz: u64,
    /// Where its bytes start in the file.
    pub file_offset: u64,
    /// Bytes taken from the file (`filesz <= memsz`; the rest reads as zero).
    pub filesz: u64,
    /// Its permissions.
    pub prot: Prot,
}

impl Segment {
    /// The first page's address.
    pub fn page_start(&self) -> u64 {
        self.vaddr & !(PAGE_SIZE - 1)
    }

    /// The end of the last page (exclusive).
    pub fn page_end(&self) -> u64 {
        // plan() checked that vaddr + memsz rounded up does not overflow.
        (self.vaddr + self.memsz).next_multiple_of(PAGE_SIZE)
    }
}

/// The PT_TLS segment, for information (the program sets up its own TLS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tls {
    /// Address of the TLS initialisation image (biased).
    pub vaddr: u64,
    /// Bytes of initialised TLS data.
    pub filesz: u64,
    /// Bytes of TLS in total.
    pub memsz: u64,
    /// Alignment.
    pub align: u64,
}

/// Everything the runtime needs to map a program and build its auxv.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadPlan {
    /// 64-bit or compat program.
    pub class: Class,
    /// ET_EXEC or static-pie.
    pub kind: Kind,
    /// Added to every address in the file (0 for ET_EXEC).
    pub bias: u64,
    /// The entry point (biased): AT_ENTRY, and where the program starts.
    pub entry: u64,
    /// The PT_LOAD segments with `memsz > 0`, sorted by address, not overlapping and not
    /// sharing pages.
    pub segments: Vec<Segment>,
    /// AT_PHDR: where the program headers are in memory (from PT_PHDR, else found inside a
    /// PT_LOAD's file bytes); always inside a segment's file-backed part.
    pub phdr_addr: u64,
    /// AT_PHENT: size of one program header (56 or 32).
    pub phent: u64,
    /// AT_PHNUM: number of program headers.
    pub phnum: u64,
    /// The page-aligned end of the highest segment: where the heap (brk) starts.
    pub brk_start: u64,
    /// PT_GNU_STACK has PF_X (an executable stack). No PT_GNU_STACK means non-executable.
    pub stack_exec: bool,
    /// PT_TLS, if any.
    pub tls: Option<Tls>,
}

/// What is wrong with one PT_LOAD segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentProblem {
    /// `p_filesz > p_memsz`.
    FileSizeAboveMemSize {
        /// p_filesz.
        filesz: u64,
        /// p_memsz.
        memsz: u64,
    },
    /// `[p_offset, p_offset + p_filesz)` is not inside the file.
    OutsideFile {
        /// p_offset.
        offset: u64,
        /// p_filesz.
        filesz: u64,
        /// The file's size.
        file_len: u64,
    },
    /// `p_vaddr % PAGE_SIZE != p_offset % PAGE_SIZE`: it cannot be mapped from the file.
    Misaligned {
        /// p_vaddr.
        vaddr: u64,
        /// p_offset.
        offset: u64,
    },
    /// Address arithmetic overflows (`bias + p_vaddr + p_memsz`, rounded to a page).
    Overflow,
    /// The segment ends above the user address space.
    AboveUserSpace {
        /// Its end (biased).
        end: u64,
        /// The limit for this class.
        limit: u64,
    },
    /// The segment starts below [`MIN_ADDR`].
    BelowMinAddr {
        /// Its first page (biased).
        start: u64,
    },
    /// The segment starts below the previous PT_LOAD's start.
    Unsorted,
    /// The segment overlaps the previous PT_LOAD.
    Overlaps {
        /// The previous segment's end (biased).
        previous_end: u64,
    },
    /// The segment's first page is the previous PT_LOAD's last page.
    SharesPage {
        /// The shared page (biased).
        page: u64,
    },
}

/// Why a program cannot be loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ElfError {
    /// No ELF magic (or fewer than 16 bytes).
    NotElf,
    /// The file ends inside the ELF header.
    TruncatedHeader {
        /// The file's size.
        len: usize,
        /// The header's size.
        needed: usize,
    },
    /// EI_CLASS is neither ELFCLASS32 nor ELFCLASS64.
    BadClass {
        /// EI_CLASS.
        class: u8,
    },
    /// EI_DATA is not ELFDATA2LSB.
    NotLittleEndian {
        /// EI_DATA.
        data: u8,
    },
    /// EI_VERSION or e_version is not EV_CURRENT.
    BadVersion {
        /// The version found.
        version: u32,
    },
    /// EI_OSABI is neither ELFOSABI_SYSV nor ELFOSABI_GNU (Linux).
    UnsupportedOsAbi {
        /// EI_OSABI.
        os_abi: u8,
    },
    /// e_machine is not the one for this class (x86-64 with ELFCLASS64, i386 with
    /// ELFCLASS32).
    UnsupportedMachine {
        /// e_machine.
        machine: u16,
        /// EI_CLASS.
        class: Class,
    },
    /// e_type is neither ET_EXEC nor ET_DYN.
    UnsupportedType {
        /// e_type.
        e_type: u16,
    },
    /// e_phentsize is not the size of a program header for this class.
    BadPhentsize {
        /// e_phentsize.
        phentsize: u16,
        /// The size for this class.
        expected: u16,
    },
    /// e_phnum is 0 or the table is larger than [`MAX_PHDR_TABLE`].
    BadPhnum {
        /// e_phnum.
        phnum: u16,
    },
    /// The program header table is not inside the file.
    PhdrTableOutsideFile {
        /// e_phoff.
        phoff: u64,
        /// Its size in bytes.
        size: u64,
        /// The file's size.
        file_len: u64,
    },
    /// PT_INTERP: the program is dynamically linked.
    Dynamic {
        /// The interpreter path (lossy UTF-8), e.g. `/lib/ld-musl-x86_64.so.1`.
        interp: String,
    },
    /// An ET_DYN whose PT_DYNAMIC lists DT_NEEDED libraries: a shared object or a program
    /// that needs libraries, not a static-pie program.
    NeedsLibraries {
        /// How many DT_NEEDED entries.
        count: usize,
    },
    /// No PT_LOAD with a non-zero size.
    NoLoadSegment,
    /// A PT_LOAD is wrong (`index` counts program headers, from 0).
    BadSegment {
        /// The program header's index.
        index: usize,
        /// What is wrong.
        problem: SegmentProblem,
    },
    /// The entry point is not inside the file bytes of an executable PT_LOAD.
    EntryNotExecutable {
        /// e_entry (biased).
        entry: u64,
    },
    /// The program headers are not in memory: no PT_PHDR, and no PT_LOAD's file bytes
    /// contain the table; or PT_PHDR points outside every PT_LOAD's file bytes.
    PhdrNotMapped {
        /// The address found (biased), if any.
        addr: Option<u64>,
    },
    /// PT_TLS or PT_GNU_STACK appears twice, or PT_INTERP / PT_PHDR twice.
    DuplicateHeader {
        /// The p_type.
        p_type: u32,
    },
}

fn machine_name(machine: u16) -> Option<&'static str> {
    elf::Machine(machine).name()
}

impl fmt::Display for ElfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const RUNS: &str =
            "this runtime runs x86-64 (ELFCLASS64 EM_X86_64) and i386 (ELFCLASS32 EM_386) programs";
        match self {
            ElfError::NotElf => f.write_str("not an ELF file (no \\x7fELF magic)"),
            ElfError::TruncatedHeader { len, needed } => write!(
                f,
                "truncated ELF: the file is {len} bytes, the ELF header needs {needed}"
            ),
            ElfError::BadClass { class } => write!(f, "ELF class {class} is not ELFCLASS32 or ELFCLASS64"),
            ElfError::NotLittleEndian { data } => write!(
                f,
                "ELF data encoding {data} is not little-endian (ELFDATA2LSB); {RUNS}"
            ),
            ElfError::BadVersion { version } => {
                write!(f, "ELF version {version} is not EV_CURRENT (1)")
            }
            ElfError::UnsupportedOsAbi { os_abi } => {
                match elf::OsAbi(*os_abi).name() {
                    Some(name) => write!(f, "ELF for OS ABI {name} ({os_abi})")?,
                    None => write!(f, "ELF for OS ABI {os_abi}")?,
                }
                f.write_str(", this runtime runs Linux (ELFOSABI_SYSV or ELFOSABI_GNU) programs")
            }
            ElfError::UnsupportedMachine { machine, class } => {
                match machine_name(*machine) {
                    Some(name) => write!(f, "ELF for {name}")?,
                    None => write!(f, "ELF for machine {machine}")?,
                }
                match (class, *machine) {
                    (Class::Elf32, 62) => write!(f, " with ELFCLASS32 (the x32 ABI), {RUNS}"),
                    (Class::Elf64, 3) => write!(f, " with ELFCLASS64, {RUNS}"),
                    _ => write!(f, ", {RUNS}"),
                }
            }
            ElfError::UnsupportedType { e_type } => match *e_type {
                1 => f.write_str(
                    "ELF type ET_REL: a relocatable object file, not a program (link it statically)",
                ),
                4 => f.write_str("ELF type ET_CORE: a core dump, not a program"),
                t => write!(f, "ELF type {t} is not ET_EXEC or ET_DYN"),
            },
            ElfError::BadPhentsize {
                phentsize,
                expected,
            } => write!(
                f,
                "e_phentsize is {phentsize}, a program header of this class is {expected} bytes"
            ),
            ElfError::BadPhnum { phnum } => write!(
                f,
                "e_phnum is {phnum}: a program needs 1 to {MAX_PHDR_TABLE} bytes of program headers"
            ),
            ElfError::PhdrTableOutsideFile {
                phoff,
                size,
                file_len,
            } => write!(
                f,
                "the program headers ({size} bytes at offset {phoff:#x}) are not inside the {file_len}-byte file"
            ),
            ElfError::Dynamic { interp } => write!(
                f,
                "dynamically linked (PT_INTERP {interp}): link it statically"
            ),
            ElfError::NeedsLibraries { count } => write!(
                f,
                "ET_DYN with {count} DT_NEEDED libraries: a shared object or a dynamically linked program, not a static-pie program (link it statically)"
            ),
            ElfError::NoLoadSegment => f.write_str("no PT_LOAD segment: nothing to load"),
            ElfError::BadSegment { index, problem } => {
                write!(f, "PT_LOAD (program header {index}) ")?;
                match problem {
                    SegmentProblem::FileSizeAboveMemSize { filesz, memsz } => write!(
                        f,
                        "has p_filesz {filesz:#x} larger than p_memsz {memsz:#x}"
                    ),
                    SegmentProblem::OutsideFile {
                        offset,
                        filesz,
                        file_len,
                    } => write!(
                        f,
                        "has {filesz:#x} file bytes at offset {offset:#x}, past the end of the {file_len:#x}-byte file"
                    ),
                    SegmentProblem::Misaligned { vaddr, offset } => write!(
                        f,
                        "has p_vaddr {vaddr:#x} and p_offset {offset:#x} at different offsets in a {PAGE_SIZE}-byte page"
                    ),
                    SegmentProblem::Overflow => f.write_str("has an address range that overflows"),
                    SegmentProblem::AboveUserSpace { end, limit } => write!(
                        f,
                        "ends at {end:#x}, above the user address space (which ends at {limit:#x})"
                    ),
                    SegmentProblem::BelowMinAddr { start } => write!(
                        f,
                        "starts at {start:#x}, below the lowest mappable address {MIN_ADDR:#x}"
                    ),
                    SegmentProblem::Unsorted => {
                        f.write_str("starts below the previous PT_LOAD (they must be sorted)")
                    }
                    SegmentProblem::Overlaps { previous_end } => write!(
                        f,
                        "overlaps the previous PT_LOAD, which ends at {previous_end:#x}"
                    ),
                    SegmentProblem::SharesPage { page } => write!(
                        f,
                        "shares the page at {page:#x} with the previous PT_LOAD"
                    ),
                }
            }
            ElfError::EntryNotExecutable { entry } => write!(
                f,
                "the entry point {entry:#x} is not inside an executable PT_LOAD"
            ),
            ElfError::PhdrNotMapped { addr: Some(addr) } => write!(
                f,
                "PT_PHDR at {addr:#x} is not inside the file bytes of a PT_LOAD"
            ),
            ElfError::PhdrNotMapped { addr: None } => f.write_str(
                "the program headers are not inside any PT_LOAD, so AT_PHDR cannot point at them",
            ),
            ElfError::DuplicateHeader { p_type } => {
                match elf::ProgramType(*p_type).name() {
                    Some(name) => write!(f, "more than one {name} program header"),
                    None => write!(f, "more than one program header of type {p_type:#x}"),
                }
            }
        }
    }
}

impl core::error::Error for ElfError {}

/// Reads the identification bytes: the class, after checking magic, encoding, version and
/// OS ABI.
fn identify(bytes: &[u8]) -> Result<Class, ElfError> {
    let ident = bytes.get(..16).ok_or(ElfError::NotElf)?;
    if ident[..4] != elf::ELFMAG {
        return Err(ElfError::NotElf);
    }
    let class = match ident[4] {
        2 => Class::Elf64,
        1 => Class::Elf32,
        class => return Err(ElfError::BadClass { class }),
    };
    if ident[5] != elf::ELFDATA2LSB.0 {
        return Err(ElfError::NotLittleEndian { data: ident[5] });
    }
    if ident[6] != elf::EV_CURRENT.0 {
        return Err(ElfError::BadVersion {
            version: u32::from(ident[6]),
        });
    }
    if ident[7] != elf::ELFOSABI_SYSV.0 && ident[7] != elf::ELFOSABI_GNU.0 {
        return Err(ElfError::UnsupportedOsAbi { os_abi: ident[7] });
    }
    Ok(class)
}

/// Checks a program and plans its loading. Never panics, whatever the bytes.
pub fn plan(bytes: &[u8]) -> Result<LoadPlan, ElfError> {
    match identify(bytes)? {
        Class::Elf64 => plan_for::<elf::FileHeader64<LE>>(bytes, Class::Elf64),
        Class::Elf32 => plan_for::<elf::FileHeader32<LE>>(bytes, Class::Elf32),
    }
}

/// The program header table, checked.
fn program_headers<H: FileHeader<Endian = LE>>(
    bytes: &[u8],
    class: Class,
) -> Result<(&H, &[H::ProgramHeader]), ElfError> {
    let needed = size_of::<H>();
    if bytes.len() < needed {
        return Err(ElfError::TruncatedHeader {
            len: bytes.len(),
            needed,
        });
    }
    let header = H::parse(bytes).map_err(|_| ElfError::TruncatedHeader {
        len: bytes.len(),
        needed,
    })?;
    let machine = header.e_machine(LE).0;
    let expected_machine = match class {
        Class::Elf64 => elf::EM_X86_64,
        Class::Elf32 => elf::EM_386,
    };
    if machine != expected_machine.0 {
        return Err(ElfError::UnsupportedMachine { machine, class });
    }
    let version = header.e_version(LE);
    if version != u32::from(elf::EV_CURRENT.0) {
        return Err(ElfError::BadVersion { version });
    }
    let e_type = header.e_type(LE).0;
    if e_type != elf::ET_EXEC.0 && e_type != elf::ET_DYN.0 {
        return Err(ElfError::UnsupportedType { e_type });
    }
    let entsize = size_of::<H::ProgramHeader>();
    let phentsize = header.e_phentsize(LE);
    if usize::from(phentsize) != entsize {
        return Err(ElfError::BadPhentsize {
            phentsize,
            expected: entsize as u16,
        });
    }
    let phnum = header.e_phnum(LE);
    let table = usize::from(phnum) * entsize;
    if phnum == 0 || table > MAX_PHDR_TABLE {
        return Err(ElfError::BadPhnum { phnum });
    }
    let phoff: u64 = header.e_phoff(LE).into();
    let outside = ElfError::PhdrTableOutsideFile {
        phoff,
        size: table as u64,
        file_len: bytes.len() as u64,
    };
    let end = phoff.checked_add(table as u64).ok_or(outside.clone())?;
    if end > bytes.len() as u64 {
        return Err(outside);
    }
    let phdrs = header.program_headers(LE, bytes).map_err(|_| outside)?;
    Ok((header, phdrs))
}

fn plan_for<H: FileHeader<Endian = LE>>(bytes: &[u8], class: Class) -> Result<LoadPlan, ElfError> {
    let (header, phdrs) = program_headers::<H>(bytes, class)?;
    let file_len = bytes.len() as u64;
    let kind = if header.e_type(LE) == elf::ET_DYN {
        Kind::StaticPie
    } else {
        Kind::Exec
    };

    let mut interp = None;
    let mut phdr = None;
    let mut tls = None;
    let mut gnu_stack = None;
    let mut max_align = PAGE_SIZE;
    for ph in phdrs {
        let p_type = ph.p_type(LE);
        let duplicate = ElfError::DuplicateHeader { p_type: p_type.0 };
        match p_type {
            elf::PT_INTERP => {
                if interp.is_some() {
                    return Err(duplicate);
                }
                interp = Some(ph);
            }
            elf::PT_PHDR => {
                if phdr.is_some() {
                    return Err(duplicate);
                }
                phdr = Some(ph);
            }
            elf::PT_TLS => {
                if tls.is_some() {
                    return Err(duplicate);
                }
                tls = Some(ph);
            }
            elf::PT_GNU_STACK => {
                if gnu_stack.is_some() {
                    return Err(duplicate);
                }
                gnu_stack = Some(ph);
            }
            elf::PT_LOAD => {
                let align: u64 = ph.p_align(LE).into();
                if align.is_power_of_two() && align > max_align {
                    max_align = align;
                }
            }
            _ => {}
        }
    }
    if let Some(ph) = interp {
        let path = ph
            .data(LE, bytes)
            .ok()
            .map(|d| d.split(|&b| b == 0).next().unwrap_or(d));
        let interp = match path {
            Some(p) if !p.is_empty() => String::from_utf8_lossy(p).into_owned(),
            _ => String::from("(unreadable)"),
        };
        return Err(ElfError::Dynamic { interp });
    }
    if kind == Kind::StaticPie {
        let needed = phdrs
            .iter()
            .filter_map(|ph| ph.dynamic(LE, bytes).ok().flatten())
            .flat_map(|entries| entries.iter())
            .filter(|d| {
                use object::read::elf::Dyn;
                d.d_tag(LE) == elf::DT_NEEDED
            })
            .count();
        if needed > 0 {
            return Err(ElfError::NeedsLibraries { count: needed });
        }
    }

    let (bias, limit) = match (kind, class) {
        (Kind::Exec, _) => (0, class.user_end()),
        // Keep the largest alignment the segments ask for (2 MiB pages, say).
        (Kind::StaticPie, Class::Elf64) => (PIE_BASE_64.next_multiple_of(max_align), USER_END_64),
        (Kind::StaticPie, Class::Elf32) => (PIE_BASE_32.next_multiple_of(max_align), USER_END_32),
    };

    let mut segments: Vec<Segment> = Vec::new();
    let mut previous: Option<(u64, u64)> = None; // biased start, end
    for (index, ph) in phdrs.iter().enumerate() {
        if ph.p_type(LE) != elf::PT_LOAD {
            continue;
        }
        let bad = |problem| ElfError::BadSegment { index, problem };
        let vaddr: u64 = ph.p_vaddr(LE).into();
        let offset: u64 = ph.p_offset(LE).into();
        let filesz: u64 = ph.p_filesz(LE).into();
        let memsz: u64 = ph.p_memsz(LE).into();
        if filesz > memsz {
            return Err(bad(SegmentProblem::FileSizeAboveMemSize { filesz, memsz }));
        }
        if offset.checked_add(filesz).is_none_or(|end| end > file_len) {
            return Err(bad(SegmentProblem::OutsideFile {
                offset,
                filesz,
                file_len,
            }));
        }
        if vaddr % PAGE_SIZE != offset % PAGE_SIZE {
            return Err(bad(SegmentProblem::Misaligned { vaddr, offset }));
        }
        let start = bias
            .checked_add(vaddr)
            .ok_or(bad(SegmentProblem::Overflow))?;
        let end = start
            .checked_add(memsz)
            .and_then(|end| end.checked_next_multiple_of(PAGE_SIZE))
            .ok_or(bad(SegmentProblem::Overflow))?;
        if end > limit {
            return Err(bad(SegmentProblem::AboveUserSpace {
                end: start + memsz,
                limit,
            }));
        }
        let page = start & !(PAGE_SIZE - 1);
        if page < MIN_ADDR {
            return Err(bad(SegmentProblem::BelowMinAddr { start: page }));
        }
        if memsz == 0 {
            continue;
        }
        if let Some((prev_start, prev_end)) = previous {
            if start < prev_start {
                return Err(bad(SegmentProblem::Unsorted));
            }
            if start < prev_end {
                return Err(bad(SegmentProblem::Overlaps {
                    previous_end: prev_end,
                }));
            }
            let prev_last_page = (prev_end - 1) & !(PAGE_SIZE - 1);
            if page == prev_last_page {
                return Err(bad(SegmentProblem::SharesPage { page }));
            }
        }
        previous = Some((start, start + memsz));
        let flags = ph.p_flags(LE).0;
        segments.push(Segment {
            vaddr: start,
            memsz,
            file_offset: offset,
            filesz,
            prot: Prot {
                read: flags & elf::PF_R.0 != 0,
                write: flags & elf::PF_W.0 != 0,
                exec: flags & elf::PF_X.0 != 0,
            },
        });
    }
    let last = segments.last().ok_or(ElfError::NoLoadSegment)?;
    let brk_start = last.page_end();

    let e_entry: u64 = header.e_entry(LE).into();
    let entry = e_entry.wrapping_add(bias);
    let in_text = e_entry.checked_add(bias).is_some()
        && segments
            .iter()
            .any(|s| s.prot.exec && entry >= s.vaddr && entry - s.vaddr < s.filesz);
    if !in_text {
        return Err(ElfError::EntryNotExecutable { entry });
    }

    let phent = size_of::<H::ProgramHeader>() as u64;
    let phnum = phdrs.len() as u64;
    let table_size = phent * phnum;
    let phdr_addr = match phdr {
        Some(ph) => {
            let addr = bias.checked_add(ph.p_vaddr(LE).into());
            match addr {
                Some(addr) if file_backed(&segments, addr, table_size) => addr,
                _ => return Err(ElfError::PhdrNotMapped { addr }),
            }
        }
        None => {
            let phoff: u64 = header.e_phoff(LE).into();
            segments
                .iter()
                .find(|s| phoff >= s.file_offset && phoff + table_size <= s.file_offset + s.filesz)
                .map(|s| s.vaddr + (phoff - s.file_offset))
                .ok_or(ElfError::PhdrNotMapped { addr: None })?
        }
    };

    let stack_exec = gnu_stack.is_some_and(|ph| ph.p_flags(LE).0 & elf::PF_X.0 != 0);
    let tls = tls.map(|ph| Tls {
        vaddr: bias.wrapping_add(ph.p_vaddr(LE).into()),
        filesz: ph.p_filesz(LE).into(),
        memsz: ph.p_memsz(LE).into(),
        align: ph.p_align(LE).into(),
    });
    Ok(LoadPlan {
        class,
        kind,
        bias,
        entry,
        segments,
        phdr_addr,
        phent,
        phnum,
        brk_start,
        stack_exec,
        tls,
    })
}

/// Whether `[addr, addr + len)` lies inside one segment's file-backed bytes.
fn file_backed(segments: &[Segment], addr: u64, len: u64) -> bool {
    segments.iter().any(|s| {
        addr >= s.vaddr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= s.vaddr + s.filesz)
    })
}

/// The NT_GNU_BUILD_ID note's descriptor (the build id bytes), from the PT_NOTE segments.
/// `None` if the file is not a readable little-endian x86 ELF or has no build id.
pub fn build_id(bytes: &[u8]) -> Option<&[u8]> {
    match identify(bytes).ok()? {
        Class::Elf64 => build_id_for::<elf::FileHeader64<LE>>(bytes, Class::Elf64),
        Class::Elf32 => build_id_for::<elf::FileHeader32<LE>>(bytes, Class::Elf32),
    }
}

fn build_id_for<H: FileHeader<Endian = LE>>(bytes: &[u8], class: Class) -> Option<&[u8]> {
    let (_, phdrs) = program_headers::<H>(bytes, class).ok()?;
    for ph in phdrs {
        let Ok(Some(mut notes)) = ph.notes(LE, bytes) else {
            continue;
        };
        while let Ok(Some(note)) = notes.next() {
            if note.name() == elf::ELF_NOTE_GNU && note.n_type(LE) == elf::NT_GNU_BUILD_ID {
                return Some(note.desc());
            }
        }
    }
    None
}

#[cfg(test)]
pub(crate) mod tests;
