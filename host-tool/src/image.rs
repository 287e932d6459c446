//! The appliance image as perf sees it: its build-id, the runtime ("kernel")
//! text and the relocation reference symbol, the ring-3 task text sections,
//! and a symbol table for host-side symbolisation (flamegraphs).

use std::path::{Path, PathBuf};

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SectionFlags};

use crate::symtab::{containing, function_symbols};
use thiserror::Error;

/// Symbols tried, in order, as the kernel map's relocation reference.
pub const REF_SYMBOLS: [&str; 4] = ["_text", "_stext", "__text_start", "_start"];

/// Prefix of the linker sections that hold ring-3 task code.
pub const USER_SECTION_PREFIX: &str = ".user";

/// What can be wrong with an image.
#[derive(Debug, Error)]
pub enum ImageError {
    /// The file could not be read.
    #[error("cannot read image {path}: {source}")]
    Io {
        /// The image path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Not a parseable object file.
    #[error("{path} is not a valid ELF file: {reason}")]
    NotElf {
        /// The image path.
        path: PathBuf,
        /// The parser's reason.
        reason: String,
    },
    /// An ELF for another machine.
    #[error("{path} is a {arch} ELF; Perch images are x86_64")]
    WrongArch {
        /// The image path.
        path: PathBuf,
        /// The architecture found.
        arch: String,
    },
    /// No executable section outside the task sections.
    #[error("{path} has no executable runtime section: it is not a Perch runtime image")]
    NoText {
        /// The image path.
        path: PathBuf,
        /// Its GNU build-id, to tell the user it is another image.
        build_id: Option<Vec<u8>>,
    },
    /// An executable section that runs past the end of the address space.
    #[error("{path}: section {name} at {addr:#x} with {size:#x} bytes ends past the address space")]
    BadSection {
        /// The image path.
        path: PathBuf,
        /// The section's name.
        name: String,
        /// Its address.
        addr: u64,
        /// Its size.
        size: u64,
    },
    /// No symbol table: a stripped copy.
    #[error(
        "{path} has no symbol table (stripped?): perch and perf need the unstripped runtime ELF \
         the appliance was built as"
    )]
    NoSymbols {
        /// The image path.
        path: PathBuf,
        /// Its GNU build-id, to tell the user it is another image.
        build_id: Option<Vec<u8>>,
    },
}

impl ImageError {
    /// The build-id of an image that parsed as an ELF but is unusable, so
    /// that a stream from another image can be named as the real problem.
    pub fn build_id(&self) -> Option<&[u8]> {
        match self {
            ImageError::NoText { build_id, .. } | ImageError::NoSymbols { build_id, .. } => {
                build_id.as_deref()
            }
            _ => None,
        }
    }

    /// The image path.
    pub fn path(&self) -> &Path {
        match self {
            ImageError::Io { path, .. }
            | ImageError::NotElf { path, .. }
            | ImageError::WrongArch { path, .. }
            | ImageError::NoText { path, .. }
            | ImageError::NoSymbols { path, .. }
            | ImageError::BadSection { path, .. } => path,
        }
    }
}

/// One executable section of ring-3 task code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserText {
    /// Section name, e.g. ".user.text".
    pub name: String,
    /// Virtual address.
    pub addr: u64,
    /// Size in bytes.
    pub size: u64,
    /// Offset of the section's bytes in the file (the MMAP pgoff).
    pub file_offset: u64,
}

/// A function symbol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    /// Start address.
    pub addr: u64,
    /// Size (0 when unknown: extends to the next symbol).
    pub size: u64,
    /// Demangled name.
    pub name: String,
}

/// A parsed appliance image.
#[derive(Clone, Debug)]
pub struct Image {
    /// Absolute path of the ELF (the DSO name perf looks up).
    pub path: PathBuf,
    /// GNU build-id, if the image has one.
    pub build_id: Option<Vec<u8>>,
    /// Runtime text: start address.
    pub kernel_start: u64,
    /// Runtime text: end address (exclusive).
    pub kernel_end: u64,
    /// Relocation reference: symbol name and address.
    pub ref_symbol: (String, u64),
    /// Task text sections.
    pub user_text: Vec<UserText>,
    /// Function symbols sorted by address.
    pub symbols: Vec<Symbol>,
    /// The lowest address a PT_LOAD segment maps, page-aligned: where the
    /// file starts in memory for tools that map a whole ELF at once
    /// (hotspot's parser, elfutils' libdwfl).
    pub load_base: Option<u64>,
}

impl Image {
    /// Reads and parses `path`.
    pub fn open(path: &Path) -> Result<Image, ImageError> {
        let data = std::fs::read(path).map_err(|source| ImageError::Io {
            path: path.to_owned(),
            source,
        })?;
        let abs = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
        Self::parse(&data, abs)
    }

    /// Parses image bytes; `path` is what perf will be told.
    pub fn parse(data: &[u8], path: PathBuf) -> Result<Image, ImageError> {
        let file = object::File::parse(data).map_err(|e| ImageError::NotElf {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        if file.format() != object::BinaryFormat::Elf {
            return Err(ImageError::NotElf {
                path,
                reason: format!("{:?} object, not ELF", file.format()),
            });
        }
        if file.architecture() != object::Architecture::X86_64 {
            return Err(ImageError::WrongArch {
                path,
                arch: format!("{:?}", file.architecture()),
            });
        }
        let build_id = file.build_id().ok().flatten().map(<[u8]>::to_vec);
        let mut kernel_start = u64::MAX;
        let mut kernel_end = 0;
        let mut user_text = Vec::new();
        for s in file.sections() {
            let SectionFlags::Elf { sh_flags, .. } = s.flags() else {
                continue;
            };
            let exec = sh_flags.0 & object::elf::SHF_EXECINSTR.0 != 0;
            let alloc = sh_flags.0 & object::elf::SHF_ALLOC.0 != 0;
            if !exec || !alloc || s.size() == 0 {
                continue;
            }
            let name = s.name().unwrap_or("").to_owned();
            let Some(end) = s.address().checked_add(s.size()) else {
                return Err(ImageError::BadSection {
                    path,
                    name,
                    addr: s.address(),
                    size: s.size(),
                });
            };
            if name.starts_with(USER_SECTION_PREFIX) {
                let file_offset = s.file_range().map(|r| r.0).unwrap_or(0);
                user_text.push(UserText {
                    name,
                    addr: s.address(),
                    size: s.size(),
                    file_offset,
                });
            } else {
                kernel_start = kernel_start.min(s.address());
                kernel_end = kernel_end.max(end);
            }
        }
        if kernel_start >= kernel_end {
            return Err(ImageError::NoText { path, build_id });
        }
        let symbols = function_symbols(&file, |raw| rustc_demangle::demangle(raw).to_string());
        let mut ref_candidates: Vec<(usize, String, u64)> = file
            .symbols()
            .filter_map(|sym| {
                let raw = sym.name().ok()?;
                let rank = REF_SYMBOLS.iter().position(|r| *r == raw)?;
                Some((rank, raw.to_owned(), sym.address()))
            })
            .collect();
        ref_candidates.sort();
        let ref_symbol = match ref_candidates.into_iter().next() {
            Some((_, name, addr)) => (name, addr),
            None => {
                // Fall back to the first function symbol in the runtime text.
                let Some(s) = symbols
                    .iter()
                    .find(|s| s.addr >= kernel_start && s.addr < kernel_end)
                else {
                    return Err(if symbols.is_empty() {
                        ImageError::NoSymbols { path, build_id }
                    } else {
                        ImageError::NoText { path, build_id }
                    });
                };
                (s.name.clone(), s.addr)
            }
        };
        let load_base = file.segments().map(|s| s.address() & !0xfff).min();
        Ok(Image {
            load_base,
            path,
            build_id,
            kernel_start,
            kernel_end,
            ref_symbol,
            user_text,
            symbols,
        })
    }

    /// The build-id as lowercase hex.
    pub fn build_id_hex(&self) -> Option<String> {
        self.build_id
            .as_ref()
            .map(|b| b.iter().map(|x| format!("{x:02x}")).collect())
    }

    /// Whether `ip` lies in task text.
    pub fn is_user_ip(&self, ip: u64) -> bool {
        self.user_text
            .iter()
            .any(|t| ip >= t.addr && ip - t.addr < t.size)
    }

    /// The file offset of task-text address `addr`, where the image's
    /// sections say (`None` outside task text).
    pub fn user_text_offset(&self, addr: u64) -> Option<u64> {
        self.user_text
            .iter()
            .find(|u| addr >= u.addr && addr - u.addr < u.size)
            .and_then(|u| u.file_offset.checked_add(addr - u.addr))
    }

    /// The function containing `ip`, if any.
    pub fn symbolize(&self, ip: u64) -> Option<&str> {
        containing(&self.symbols, ip).map(|i| self.symbols[i].name.as_str())
    }
}
