//! The boot archive: a cpio "newc" archive read in place, validated whole before use.
//!
//! [`Archive::parse`] walks every header once and checks everything the runtime will later
//! rely on: the `070701` magic, the 13 eight-digit hex fields, the name size and its NUL
//! terminator, the zero padding to 4 bytes after the header+name and after the data, the
//! data lying inside the archive, the file types, the paths, and the `TRAILER!!!` entry
//! (after which only zero bytes may follow). Afterwards the entries are plain borrowed
//! slices of the archive bytes: iterating or looking up cannot fail.
//!
//! This module parses newc itself rather than through `cpio_reader`: that crate's iterator
//! ends silently at the first damaged header (a truncated or corrupt archive looks like a
//! shorter good one, and a missing trailer is not noticed), skips the NUL terminator and the
//! padding without checking that they are there, accepts a `+` sign inside hex fields
//! (`from_str_radix`), and requires UTF-8 names. Wrapping it would have meant re-checking
//! every field it reads, and newc is a 110-byte ASCII header.
//!
//! Paths are normalised as Linux's initramfs reader does for `./` prefixes: leading `/` and
//! `./` are stripped and trailing `/` removed. A path with a `..`, `.` or empty component
//! (`a/../b`, `a/./b`, `a//b`) is refused, so that each file has exactly one spelling. An
//! entry that names the root itself (`.`, `/`, `./`, as `find . | cpio -o` writes) must be a
//! directory and is not listed. Two entries with the same normalised path are refused.
//! Regular files, directories and symbolic links (whose data is the target) are accepted;
//! devices, FIFOs and sockets are refused. Hard links are not resolved: each entry has the
//! data written with it.

use crate::manifest::{Manifest, ParseError};
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

/// The newc magic.
pub const MAGIC: &[u8; 6] = b"070701";
/// The name of the entry that ends the archive.
pub const TRAILER: &[u8] = b"TRAILER!!!";
/// The archive path of the manifest.
pub const MANIFEST_PATH: &[u8] = b".perch/manifest";
/// Size of a newc header.
pub const HEADER_LEN: usize = 110;
/// The longest name accepted, NUL included (Linux's `PATH_MAX`).
pub const MAX_NAME_SIZE: usize = 4096;

const FIELDS: [&str; 13] = [
    "c_ino",
    "c_mode",
    "c_uid",
    "c_gid",
    "c_nlink",
    "c_mtime",
    "c_filesize",
    "c_devmajor",
    "c_devminor",
    "c_rdevmajor",
    "c_rdevminor",
    "c_namesize",
    "c_check",
];
const F_MODE: usize = 1;
const F_MTIME: usize = 5;
const F_FILESIZE: usize = 6;
const F_NAMESIZE: usize = 11;

/// `S_IFMT` and the types the archive may hold.
const S_IFMT: u32 = 0o170000;
const S_IFREG: u32 = 0o100000;
const S_IFDIR: u32 = 0o040000;
const S_IFLNK: u32 = 0o120000;

/// What kind of file an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileType {
    /// A regular file: its data is the contents.
    Regular,
    /// A directory (no data).
    Directory,
    /// A symbolic link: its data is the target path.
    Symlink,
}

/// One archive member, borrowed from the archive bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    path: &'a [u8],
    mode: u32,
    mtime: u32,
    data: &'a [u8],
}

impl<'a> Entry<'a> {
    /// The normalised path: no leading `/` or `./`, no trailing `/`, never empty, no `.`,
    /// `..` or empty components.
    pub fn path(&self) -> &'a [u8] {
        self.path
    }

    /// The full `st_mode`: file type bits and permission bits (as in the header).
    pub fn mode(&self) -> u32 {
        self.mode
    }

    /// The permission bits (`mode & 0o7777`).
    pub fn permissions(&self) -> u32 {
        self.mode & 0o7777
    }

    /// The file type.
    pub fn file_type(&self) -> FileType {
        match self.mode & S_IFMT {
            S_IFDIR => FileType::Directory,
            S_IFLNK => FileType::Symlink,
            // Parse accepted nothing else.
            _ => FileType::Regular,
        }
    }

    /// The modification time (seconds since the epoch) from the header.
    pub fn mtime(&self) -> u32 {
        self.mtime
    }

    /// The contents (empty for directories). Inside the archive, 4-byte aligned relative to
    /// the archive start, not page aligned: loaders copy from it.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }
}

/// A validated archive.
#[derive(Debug, Clone)]
pub struct Archive<'a> {
    entries: Vec<Entry<'a>>,
    /// Indices into `entries`, sorted by path.
    by_path: Vec<usize>,
}

/// What part of an entry ran past the end of the archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The 110-byte header.
    Header,
    /// The name.
    Name,
    /// The padding after the name.
    NamePadding,
    /// The file data.
    Data,
    /// The padding after the data.
    DataPadding,
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Part::Header => "header",
            Part::Name => "name",
            Part::NamePadding => "padding after the name",
            Part::Data => "data",
            Part::DataPadding => "padding after the data",
        })
    }
}

/// Why a path was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathProblem {
    /// The name is empty.
    Empty,
    /// A `..` component.
    DotDot,
    /// A `.` or empty component inside the path (`a/./b`, `a//b`).
    NonCanonical,
    /// The name names the root, but the entry is not a directory.
    RootNotDirectory,
}

/// Why an archive was refused. `offset` is the byte offset of the entry's header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArchiveError {
    /// The archive ends inside an entry.
    Truncated {
        /// Header offset of the entry.
        offset: usize,
        /// Which part is cut off.
        part: Part,
    },
    /// The header does not start with `070701`.
    BadMagic {
        /// Header offset.
        offset: usize,
        /// The six bytes found.
        found: [u8; 6],
    },
    /// A header field is not eight hex digits.
    BadHex {
        /// Header offset.
        offset: usize,
        /// The field's name (`c_filesize`, ...).
        field: &'static str,
        /// The eight bytes found.
        found: [u8; 8],
    },
    /// `c_namesize` is 0 or larger than [`MAX_NAME_SIZE`].
    BadNameSize {
        /// Header offset.
        offset: usize,
        /// The size in the header.
        size: u32,
    },
    /// The name's last byte is not NUL, or it has a NUL before its end.
    NameNotTerminated {
        /// Header offset.
        offset: usize,
    },
    /// A padding byte is not zero.
    BadPadding {
        /// Header offset.
        offset: usize,
        /// After the name or after the data.
        part: Part,
    },
    /// `c_filesize` runs past the end of the archive.
    DataPastEnd {
        /// Header offset.
        offset: usize,
        /// The size in the header.
        size: u32,
        /// Bytes left in the archive after the name.
        available: usize,
    },
    /// The archive ends (at `offset`) without a `TRAILER!!!` entry.
    MissingTrailer {
        /// Where the next header should have been.
        offset: usize,
    },
    /// A non-zero byte after the trailer.
    DataAfterTrailer {
        /// Its offset.
        offset: usize,
    },
    /// A file type other than regular, directory or symbolic link.
    UnsupportedType {
        /// Header offset.
        offset: usize,
        /// The entry's path (lossy UTF-8).
        path: String,
        /// Its mode.
        mode: u32,
    },
    /// A directory with data.
    DirectoryWithData {
        /// Header offset.
        offset: usize,
        /// The entry's path (lossy UTF-8).
        path: String,
    },
    /// A refused path.
    BadPath {
        /// Header offset.
        offset: usize,
        /// The name as written (lossy UTF-8).
        path: String,
        /// What is wrong.
        problem: PathProblem,
    },
    /// Two entries with the same normalised path.
    DuplicatePath {
        /// Header offset of the second.
        offset: usize,
        /// The normalised path (lossy UTF-8).
        path: String,
    },
}

impl fmt::Display for ArchiveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("boot archive: ")?;
        match self {
            ArchiveError::Truncated { offset, part } => write!(
                f,
                "truncated: the archive ends inside the {part} of the entry at byte {offset}"
            ),
            ArchiveError::BadMagic { offset, found } => write!(
                f,
                "bad magic {:?} at byte {offset} (a cpio newc archive has \"070701\")",
                String::from_utf8_lossy(found)
            ),
            ArchiveError::BadHex {
                offset,
                field,
                found,
            } => write!(
                f,
                "header field {field} of the entry at byte {offset} is {:?}, not 8 hex digits",
                String::from_utf8_lossy(found)
            ),
            ArchiveError::BadNameSize { offset, size } => write!(
                f,
                "entry at byte {offset} has name size {size} (it must be 1 to {MAX_NAME_SIZE}, NUL included)"
            ),
            ArchiveError::NameNotTerminated { offset } => write!(
                f,
                "the name of the entry at byte {offset} is not a NUL-terminated string of its c_namesize"
            ),
            ArchiveError::BadPadding { offset, part } => {
                write!(f, "non-zero {part} in the entry at byte {offset}")
            }
            ArchiveError::DataPastEnd {
                offset,
                size,
                available,
            } => write!(
                f,
                "entry at byte {offset} has {size} bytes of data but only {available} bytes remain"
            ),
            ArchiveError::MissingTrailer { offset } => write!(
                f,
                "no TRAILER!!! entry: the archive ends at byte {offset} after a complete entry"
            ),
            ArchiveError::DataAfterTrailer { offset } => {
                write!(f, "non-zero byte at {offset} after the TRAILER!!! entry")
            }
            ArchiveError::UnsupportedType { offset, path, mode } => write!(
                f,
                "{path:?} (entry at byte {offset}) has mode {mode:o}: only regular files, directories and symbolic links are supported"
            ),
            ArchiveError::DirectoryWithData { offset, path } => {
                write!(f, "directory {path:?} (entry at byte {offset}) has data")
            }
            ArchiveError::BadPath {
                offset,
                path,
                problem,
            } => {
                write!(f, "path {path:?} (entry at byte {offset}) ")?;
                f.write_str(match problem {
                    PathProblem::Empty => "is empty",
                    PathProblem::DotDot => "has a `..` component",
                    PathProblem::NonCanonical => "has a `.` or empty component",
                    PathProblem::RootNotDirectory => "names the root but is not a directory",
                })
            }
            ArchiveError::DuplicatePath { offset, path } => {
                write!(f, "{path:?} appears twice (the second at byte {offset})")
            }
        }
    }
}

impl core::error::Error for ArchiveError {}

/// Why [`Archive::manifest`] found no usable manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManifestError {
    /// The archive has no `.perch/manifest`.
    Missing,
    /// `.perch/manifest` is not a regular file.
    NotAFile,
    /// It does not parse.
    Parse(ParseError),
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ManifestError::Missing => f.write_str("boot archive has no .perch/manifest"),
            ManifestError::NotAFile => {
                f.write_str("boot archive: .perch/manifest is not a regular file")
            }
            ManifestError::Parse(e) => write!(f, ".perch/manifest: {e}"),
        }
    }
}

impl core::error::Error for ManifestError {}

/// The normalised form of a path as [`Entry::path`] spells it, or `Ok(None)` for the root.
///
/// Strips leading `/` and `./`, and trailing `/`; refuses `..`, `.` and empty components.
pub fn normalise_path(path: &[u8]) -> Result<Option<&[u8]>, PathProblem> {
    if path.is_empty() {
        return Err(PathProblem::Empty);
    }
    let mut p = path;
    loop {
        if let Some(rest) = p.strip_prefix(b"/") {
            p = rest;
        } else if let Some(rest) = p.strip_prefix(b"./") {
            p = rest;
        } else {
            break;
        }
    }
    while let Some(rest) = p.strip_suffix(b"/") {
        p = rest;
    }
    if p.is_empty() || p == b"." {
        return Ok(None);
    }
    for component in p.split(|&b| b == b'/') {
        match component {
            b".." => return Err(PathProblem::DotDot),
            b"" | b"." => return Err(PathProblem::NonCanonical),
            _ => {}
        }
    }
    Ok(Some(p))
}

fn hex_field(header: &[u8], offset: usize, index: usize) -> Result<u32, ArchiveError> {
    let start = 6 + 8 * index;
    let mut found = [0u8; 8];
    found.copy_from_slice(&header[start..start + 8]);
    let mut value: u32 = 0;
    for &d in &found {
        let digit = match d {
            b'0'..=b'9' => d - b'0',
            b'a'..=b'f' => d - b'a' + 10,
            b'A'..=b'F' => d - b'A' + 10,
            _ => {
                return Err(ArchiveError::BadHex {
                    offset,
                    field: FIELDS[index],
                    found,
                });
            }
        };
        value = value << 4 | u32::from(digit);
    }
    Ok(value)
}

const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Checks that `bytes[from..to]` exists and is all zero.
fn padding(
    bytes: &[u8],
    from: usize,
    to: usize,
    offset: usize,
    part: Part,
) -> Result<(), ArchiveError> {
    let pad = bytes
        .get(from..to)
        .ok_or(ArchiveError::Truncated { offset, part })?;
    if pad.iter().any(|&b| b != 0) {
        return Err(ArchiveError::BadPadding { offset, part });
    }
    Ok(())
}

impl<'a> Archive<'a> {
    /// Validates the whole archive and indexes its entries. See the module docs for the
    /// checks. Never panics, whatever the bytes.
    pub fn parse(bytes: &'a [u8]) -> Result<Archive<'a>, ArchiveError> {
        let mut entries = Vec::new();
        let mut offset = 0;
        loop {
            if offset >= bytes.len() {
                return Err(ArchiveError::MissingTrailer { offset });
            }
            let header = bytes
                .get(offset..offset + HEADER_LEN)
                .ok_or(ArchiveError::Truncated {
                    offset,
                    part: Part::Header,
                })?;
            if &header[..6] != MAGIC {
                let mut found = [0u8; 6];
                found.copy_from_slice(&header[..6]);
                return Err(ArchiveError::BadMagic { offset, found });
            }
            let mut fields = [0u32; 13];
            for (index, value) in fields.iter_mut().enumerate() {
                *value = hex_field(header, offset, index)?;
            }
            let name_size = fields[F_NAMESIZE];
            let name_len = name_size as usize;
            if name_len == 0 || name_len > MAX_NAME_SIZE {
                return Err(ArchiveError::BadNameSize {
                    offset,
                    size: name_size,
                });
            }
            let name_start = offset + HEADER_LEN;
            let name_end = name_start + name_len;
            let name = bytes
                .get(name_start..name_end)
                .ok_or(ArchiveError::Truncated {
                    offset,
                    part: Part::Name,
                })?;
            let (nul, name) = name
                .split_last()
                .ok_or(ArchiveError::NameNotTerminated { offset })?;
            if *nul != 0 || name.contains(&0) {
                return Err(ArchiveError::NameNotTerminated { offset });
            }
            let data_start = align4(name_end);
            padding(bytes, name_end, data_start, offset, Part::NamePadding)?;

            let size = fields[F_FILESIZE];
            let available = bytes.len() - data_start;
            let data_end = data_start
                .checked_add(size as usize)
                .filter(|&end| end <= bytes.len())
                .ok_or(ArchiveError::DataPastEnd {
                    offset,
                    size,
                    available,
                })?;
            let data = &bytes[data_start..data_end];
            let next = align4(data_end);
            padding(bytes, data_end, next, offset, Part::DataPadding)?;

            if name == TRAILER {
                if let Some(pos) = bytes[next..].iter().position(|&b| b != 0) {
                    return Err(ArchiveError::DataAfterTrailer { offset: next + pos });
                }
                break;
            }

            let mode = fields[F_MODE];
            let lossy = || String::from_utf8_lossy(name).into_owned();
            let is_dir = match mode & S_IFMT {
                S_IFDIR => true,
                S_IFREG | S_IFLNK => false,
                _ => {
                    return Err(ArchiveError::UnsupportedType {
                        offset,
                        path: lossy(),
                        mode,
                    });
                }
            };
            if is_dir && size != 0 {
                return Err(ArchiveError::DirectoryWithData {
                    offset,
                    path: lossy(),
                });
            }
            let bad_path = |problem| ArchiveError::BadPath {
                offset,
                path: lossy(),
                problem,
            };
            match normalise_path(name).map_err(bad_path)? {
                Some(path) => entries.push((
                    offset,
                    Entry {
                        path,
                        mode,
                        mtime: fields[F_MTIME],
                        data,
                    },
                )),
                None if is_dir => {}
                None => return Err(bad_path(PathProblem::RootNotDirectory)),
            }
            offset = next;
        }

        let mut by_path: Vec<usize> = (0..entries.len()).collect();
        by_path.sort_by(|&a, &b| entries[a].1.path.cmp(entries[b].1.path).then(a.cmp(&b)));
        for pair in by_path.windows(2) {
            let (first, second) = (&entries[pair[0]], &entries[pair[1]]);
            if first.1.path == second.1.path {
                return Err(ArchiveError::DuplicatePath {
                    offset: second.0,
                    path: String::from_utf8_lossy(second.1.path).into_owned(),
                });
            }
        }
        Ok(Archive {
            entries: entries.into_iter().map(|(_, e)| e).collect(),
            by_path,
        })
    }

    /// The entries in archive order (the root directory entry, if any, is not listed).
    pub fn entries(&self) -> impl ExactSizeIterator<Item = Entry<'a>> + '_ {
        self.entries.iter().copied()
    }

    /// The entry at `path`, normalised as [`normalise_path`] does (so `/bin/p`, `./bin/p`
    /// and `bin/p` find the same entry). `None` if absent or not a valid path.
    pub fn get(&self, path: &[u8]) -> Option<Entry<'a>> {
        let path = normalise_path(path).ok()??;
        let found = self
            .by_path
            .binary_search_by(|&i| self.entries[i].path.cmp(path))
            .ok()?;
        Some(self.entries[self.by_path[found]])
    }

    /// Finds and parses [`MANIFEST_PATH`].
    pub fn manifest(&self) -> Result<Manifest, ManifestError> {
        let entry = self.get(MANIFEST_PATH).ok_or(ManifestError::Missing)?;
        if entry.file_type() != FileType::Regular {
            return Err(ManifestError::NotAFile);
        }
        Manifest::parse(entry.data()).map_err(ManifestError::Parse)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::ProcessSpec;
    use std::io::Write;

    /// One member for [`build`]: name as written, mode, data.
    type Member<'m> = (&'m str, u32, &'m [u8]);

    /// Builds an archive with the independent `cpio` crate's newc writer.
    fn build(members: &[Member<'_>]) -> Vec<u8> {
        let mut out = Vec::new();
        for (ino, (name, mode, data)) in members.iter().enumerate() {
            let mut w = cpio::newc::Builder::new(name)
                .ino(ino as u32 + 1)
                .mode(*mode)
                .nlink(1)
                .mtime(1_700_000_000)
                .write(&mut out, data.len() as u32);
            w.write_all(data).unwrap();
            w.finish().unwrap();
        }
        cpio::newc::trailer(&mut out).unwrap();
        out
    }

    const MANIFEST: &str = "perch-manifest 1\nprocess hello\nexe bin/hello\narg hello\nend\n";

    fn sample() -> Vec<u8> {
        build(&[
            (".", 0o040755, b""),
            ("./bin", 0o040755, b""),
            ("./bin/hello", 0o100755, b"\x7fELF program bytes"),
            ("data/input.txt", 0o100644, b"abc"),
            ("/data/empty", 0o100644, b""),
            ("bin/sh", 0o120777, b"hello"),
            (".perch/", 0o040755, b""),
            (".perch/manifest", 0o100644, MANIFEST.as_bytes()),
        ])
    }

    /// Overwrites header field `index` of the entry at `offset`.
    fn set_field(bytes: &mut [u8], offset: usize, index: usize, text: &[u8; 8]) {
        let at = offset + 6 + 8 * index;
        bytes[at..at + 8].copy_from_slice(text);
    }

    /// Header offsets of the entries (the trailer included), read independently of parse().
    fn header_offsets(bytes: &[u8]) -> Vec<usize> {
        let mut offsets = Vec::new();
        let mut off = 0;
        loop {
            offsets.push(off);
            let field = |i: usize| {
                let s = std::str::from_utf8(&bytes[off + 6 + 8 * i..off + 14 + 8 * i]).unwrap();
                usize::from_str_radix(s, 16).unwrap()
            };
            let name_end = off + HEADER_LEN + field(F_NAMESIZE);
            if &bytes[off + HEADER_LEN..name_end - 1] == TRAILER {
                return offsets;
            }
            off = align4(align4(name_end) + field(F_FILESIZE));
        }
    }

    #[test]
    fn reads_entries_with_normalised_paths() {
        let bytes = sample();
        let a = Archive::parse(&bytes).unwrap();
        let paths: Vec<&[u8]> = a.entries().map(|e| e.path()).collect();
        assert_eq!(
            paths,
            [
                &b"bin"[..],
                b"bin/hello",
                b"data/input.txt",
                b"data/empty",
                b"bin/sh",
                b".perch",
                b".perch/manifest"
            ]
        );
        let hello = a.get(b"/bin/hello").unwrap();
        assert_eq!(hello.data(), b"\x7fELF program bytes");
        assert_eq!(hello.file_type(), FileType::Regular);
        assert_eq!(hello.mode(), 0o100755);
        assert_eq!(hello.permissions(), 0o755);
        assert_eq!(hello.mtime(), 1_700_000_000);
        assert_eq!(a.get(b"./bin/hello"), Some(hello));
        assert_eq!(a.get(b"bin/hello/"), Some(hello));
        assert_eq!(a.get(b"bin").unwrap().file_type(), FileType::Directory);
        assert_eq!(a.get(b"bin").unwrap().data(), b"");
        let sh = a.get(b"bin/sh").unwrap();
        assert_eq!(
            (sh.file_type(), sh.data()),
            (FileType::Symlink, &b"hello"[..])
        );
        assert_eq!(a.get(b"data/empty").unwrap().data(), b"");
        assert_eq!(a.get(b"data/input.txt").unwrap().data(), b"abc");
        assert_eq!(a.get(b"data/missing"), None);
        assert_eq!(a.get(b"data/../bin/hello"), None);
        assert_eq!(a.get(b"/"), None);
        assert_eq!(a.get(b""), None);
    }

    #[test]
    fn manifest_is_found_and_parsed() {
        let bytes = sample();
        let m = Archive::parse(&bytes).unwrap().manifest().unwrap();
        let mut hello = ProcessSpec::new("hello", "bin/hello");
        hello.argv = vec![b"hello".to_vec()];
        assert_eq!(m.processes, vec![hello]);

        let none = build(&[("bin/x", 0o100755, b"x")]);
        assert_eq!(
            Archive::parse(&none).unwrap().manifest(),
            Err(ManifestError::Missing)
        );
        let dir = build(&[(".perch/manifest", 0o040755, b"")]);
        assert_eq!(
            Archive::parse(&dir).unwrap().manifest(),
            Err(ManifestError::NotAFile)
        );
        let bad = build(&[(".perch/manifest", 0o100644, b"perch-manifest 2\n")]);
        let e = Archive::parse(&bad).unwrap().manifest().unwrap_err();
        assert!(matches!(
            e,
            ManifestError::Parse(ParseError { line: 1, .. })
        ));
        assert!(
            e.to_string()
                .starts_with(".perch/manifest: manifest line 1: ")
        );
    }

    #[test]
    fn empty_archive_is_only_a_trailer() {
        let bytes = build(&[]);
        assert_eq!(Archive::parse(&bytes).unwrap().entries().len(), 0);
        assert_eq!(
            Archive::parse(&[]).unwrap_err(),
            ArchiveError::MissingTrailer { offset: 0 }
        );
    }

    #[test]
    fn every_truncation_is_an_error() {
        let bytes = sample();
        assert!(Archive::parse(&bytes).is_ok());
        for len in 0..bytes.len() {
            let e = Archive::parse(&bytes[..len]).expect_err(&format!("prefix of {len} bytes"));
            assert!(
                matches!(
                    e,
                    ArchiveError::Truncated { .. }
                        | ArchiveError::DataPastEnd { .. }
                        | ArchiveError::MissingTrailer { .. }
                ),
                "prefix {len}: {e:?}"
            );
        }
    }

    #[test]
    fn truncation_reports_the_part() {
        let bytes = sample();
        let offs = header_offsets(&bytes);
        let second = offs[1];
        let cut = |len: usize| Archive::parse(&bytes[..len]).unwrap_err();
        assert_eq!(
            cut(second + 50),
            ArchiveError::Truncated {
                offset: second,
                part: Part::Header
            }
        );
        assert_eq!(
            cut(second + HEADER_LEN + 2),
            ArchiveError::Truncated {
                offset: second,
                part: Part::Name
            }
        );
        assert_eq!(cut(second), ArchiveError::MissingTrailer { offset: second });
        let hello = offs[2];
        // "./bin/hello\0" is 12 bytes: header+name = 122, padded to 124.
        assert_eq!(
            cut(hello + 123),
            ArchiveError::Truncated {
                offset: hello,
                part: Part::NamePadding
            }
        );
        // 18 bytes of data end at 142, padded to 144.
        assert_eq!(
            cut(hello + 130),
            ArchiveError::DataPastEnd {
                offset: hello,
                size: 18,
                available: 6
            }
        );
        assert_eq!(
            cut(hello + 143),
            ArchiveError::Truncated {
                offset: hello,
                part: Part::DataPadding
            }
        );
    }

    #[test]
    fn bad_magic() {
        let mut bytes = sample();
        let offs = header_offsets(&bytes);
        bytes[offs[3] + 5] = b'7';
        assert_eq!(
            Archive::parse(&bytes).unwrap_err(),
            ArchiveError::BadMagic {
                offset: offs[3],
                found: *b"070707"
            }
        );
        let e = Archive::parse(b"\x1f\x8b compressed").unwrap_err();
        assert_eq!(
            e,
            ArchiveError::Truncated {
                offset: 0,
                part: Part::Header
            }
        );
        let mut gz = vec![0x1f, 0x8b];
        gz.resize(200, 0);
        let e = Archive::parse(&gz).unwrap_err();
        assert!(matches!(e, ArchiveError::BadMagic { offset: 0, .. }));
        assert!(e.to_string().contains("a cpio newc archive has \"070701\""));
    }

    #[test]
    fn bad_hex_in_every_field() {
        let clean = sample();
        let off = header_offsets(&clean)[2];
        for (index, field) in FIELDS.iter().enumerate() {
            for bad in [b"0000000g", b"+0000001", b" 0000001", b"0x000001"] {
                let mut bytes = clean.clone();
                set_field(&mut bytes, off, index, bad);
                assert_eq!(
                    Archive::parse(&bytes).unwrap_err(),
                    ArchiveError::BadHex {
                        offset: off,
                        field,
                        found: *bad
                    }
                );
            }
        }
        // Upper-case hex is hex.
        let mut bytes = clean.clone();
        set_field(&mut bytes, off, F_MODE, b"000081ED");
        assert_eq!(
            Archive::parse(&bytes)
                .unwrap()
                .get(b"bin/hello")
                .unwrap()
                .mode(),
            0o100755
        );
    }

    #[test]
    fn name_size_and_terminator() {
        let clean = sample();
        let off = header_offsets(&clean)[2]; // "./bin/hello\0", 12 bytes
        let with_namesize = |text: &[u8; 8]| {
            let mut b = clean.clone();
            set_field(&mut b, off, F_NAMESIZE, text);
            Archive::parse(&b).unwrap_err()
        };
        assert_eq!(
            with_namesize(b"00000000"),
            ArchiveError::BadNameSize {
                offset: off,
                size: 0
            }
        );
        assert_eq!(
            with_namesize(b"00001001"),
            ArchiveError::BadNameSize {
                offset: off,
                size: 4097
            }
        );
        assert_eq!(
            with_namesize(b"ffffffff"),
            ArchiveError::BadNameSize {
                offset: off,
                size: u32::MAX
            }
        );
        // One byte short: the last name byte is 'o', not NUL.
        assert_eq!(
            with_namesize(b"0000000b"),
            ArchiveError::NameNotTerminated { offset: off }
        );
        // A NUL inside the name.
        let mut b = clean.clone();
        b[off + HEADER_LEN + 5] = 0;
        assert_eq!(
            Archive::parse(&b).unwrap_err(),
            ArchiveError::NameNotTerminated { offset: off }
        );
        // The terminator replaced.
        let mut b = clean.clone();
        b[off + HEADER_LEN + 11] = b'x';
        assert_eq!(
            Archive::parse(&b).unwrap_err(),
            ArchiveError::NameNotTerminated { offset: off }
        );
    }

    #[test]
    fn padding_must_be_zero() {
        let clean = sample();
        let off = header_offsets(&clean)[2];
        let mut b = clean.clone();
        b[off + 123] = 1; // padding after the 12-byte name
        assert_eq!(
            Archive::parse(&b).unwrap_err(),
            ArchiveError::BadPadding {
                offset: off,
                part: Part::NamePadding
            }
        );
        let mut b = clean.clone();
        b[off + 142] = 1; // padding after the 18 data bytes
        assert_eq!(
            Archive::parse(&b).unwrap_err(),
            ArchiveError::BadPadding {
                offset: off,
                part: Part::DataPadding
            }
        );
    }

    #[test]
    fn oversized_data() {
        let clean = sample();
        let offs = header_offsets(&clean);
        let off = offs[3]; // data/input.txt, 3 bytes
        for size in [b"ffffffff", b"7fffffff", b"00010000"] {
            let mut b = clean.clone();
            set_field(&mut b, off, F_FILESIZE, size);
            let e = Archive::parse(&b).unwrap_err();
            assert!(
                matches!(e, ArchiveError::DataPastEnd { offset, .. } if offset == off),
                "{e:?}"
            );
        }
        // A size a little too large reads into the next header and then fails somewhere,
        // unless it ends where a header starts (swallowing zero padding or whole entries):
        // then it is another valid archive.
        let data_start = offs[4] - align4(3);
        for extra in 1..300 {
            let mut b = clean.clone();
            let size: [u8; 8] = format!("{:08x}", 3 + extra).as_bytes().try_into().unwrap();
            set_field(&mut b, off, F_FILESIZE, &size);
            match Archive::parse(&b) {
                Ok(a) => {
                    let next = data_start + align4(3 + extra);
                    assert!(offs[4..].contains(&next), "size +{extra}");
                    assert_eq!(a.get(b"data/input.txt").unwrap().data().len(), 3 + extra);
                    assert_eq!(a.get(b"data/empty").is_some(), next == offs[4]);
                }
                Err(e) => assert!(!matches!(e, ArchiveError::MissingTrailer { .. }), "{e:?}"),
            }
        }
    }

    #[test]
    fn trailer_is_required_and_ends_the_archive() {
        let clean = sample();
        let offs = header_offsets(&clean);
        let trailer = *offs.last().unwrap();
        assert_eq!(
            Archive::parse(&clean[..trailer]).unwrap_err(),
            ArchiveError::MissingTrailer { offset: trailer }
        );
        // Zero padding after the trailer (as cpio writes to 512-byte blocks) is fine.
        let mut padded = clean.clone();
        padded.resize(clean.len().next_multiple_of(512) + 512, 0);
        assert_eq!(Archive::parse(&padded).unwrap().entries().len(), 7);
        // Anything else after it is refused.
        let mut junk = padded.clone();
        junk[clean.len() + 7] = b'0';
        assert_eq!(
            Archive::parse(&junk).unwrap_err(),
            ArchiveError::DataAfterTrailer {
                offset: clean.len() + 7
            }
        );
        // A renamed trailer is just an entry, and the archive then has none.
        let mut renamed = clean.clone();
        renamed[trailer + HEADER_LEN] = b't';
        set_field(&mut renamed, trailer, F_MODE, b"000081a4");
        assert_eq!(
            Archive::parse(&renamed).unwrap_err(),
            ArchiveError::MissingTrailer {
                offset: clean.len()
            }
        );
    }

    #[test]
    fn bad_paths() {
        let cases: [(&str, u32, PathProblem); 9] = [
            ("..", 0o040755, PathProblem::DotDot),
            ("../etc/passwd", 0o100644, PathProblem::DotDot),
            ("bin/../../x", 0o100644, PathProblem::DotDot),
            ("/a/..", 0o040755, PathProblem::DotDot),
            ("", 0o100644, PathProblem::Empty),
            ("a//b", 0o100644, PathProblem::NonCanonical),
            ("a/./b", 0o100644, PathProblem::NonCanonical),
            ("a/.", 0o100644, PathProblem::NonCanonical),
            ("./", 0o100644, PathProblem::RootNotDirectory),
        ];
        for (name, mode, problem) in cases {
            let bytes = build(&[("ok", 0o100644, b""), (name, mode, b"")]);
            let off = header_offsets(&bytes)[1];
            let e = Archive::parse(&bytes).unwrap_err();
            assert_eq!(
                e,
                ArchiveError::BadPath {
                    offset: off,
                    path: name.into(),
                    problem
                },
                "{name:?}"
            );
        }
        // Names that are fine, including non-UTF-8 ones and odd but legal components.
        assert_eq!(
            normalise_path(b"//././/a/b.c/..d/"),
            Ok(Some(&b"a/b.c/..d"[..]))
        );
        assert_eq!(normalise_path(b"\xff/x"), Ok(Some(&b"\xff/x"[..])));
        assert_eq!(normalise_path(b"/"), Ok(None));
        assert_eq!(normalise_path(b"."), Ok(None));
    }

    #[test]
    fn unsupported_types_and_directory_data() {
        for mode in [0o020644, 0o060644, 0o010644, 0o140755, 0o000644, 0o170644] {
            let bytes = build(&[("dev/x", mode, b"")]);
            assert_eq!(
                Archive::parse(&bytes).unwrap_err(),
                ArchiveError::UnsupportedType {
                    offset: 0,
                    path: "dev/x".into(),
                    mode
                }
            );
        }
        let bytes = build(&[("d", 0o040755, b"x")]);
        assert_eq!(
            Archive::parse(&bytes).unwrap_err(),
            ArchiveError::DirectoryWithData {
                offset: 0,
                path: "d".into()
            }
        );
    }

    #[test]
    fn duplicate_paths() {
        let bytes = build(&[
            ("a", 0o100644, b"1"),
            ("b", 0o100644, b"2"),
            ("./a", 0o100644, b"3"),
        ]);
        let off = header_offsets(&bytes)[2];
        assert_eq!(
            Archive::parse(&bytes).unwrap_err(),
            ArchiveError::DuplicatePath {
                offset: off,
                path: "a".into()
            }
        );
        // Two root entries are not duplicates of anything listed.
        let bytes = build(&[(".", 0o040755, b""), ("/", 0o040755, b"")]);
        assert_eq!(Archive::parse(&bytes).unwrap().entries().len(), 0);
    }

    #[test]
    fn error_messages() {
        let e = ArchiveError::DataPastEnd {
            offset: 124,
            size: 4096,
            available: 10,
        };
        assert_eq!(
            e.to_string(),
            "boot archive: entry at byte 124 has 4096 bytes of data but only 10 bytes remain"
        );
        let e = ArchiveError::BadPath {
            offset: 0,
            path: "../x".into(),
            problem: PathProblem::DotDot,
        };
        assert_eq!(
            e.to_string(),
            "boot archive: path \"../x\" (entry at byte 0) has a `..` component"
        );
    }

    proptest::proptest! {
        #[test]
        fn proptest_damaged_archives_never_panic(
            edits in proptest::collection::vec((0usize..1000, proptest::prelude::any::<u8>()), 1..6),
            cut in 0usize..1100,
        ) {
            let mut bytes = sample();
            for (at, value) in edits {
                let at = at % bytes.len();
                bytes[at] = value;
            }
            bytes.truncate(cut.min(bytes.len()));
            if let Ok(a) = Archive::parse(&bytes) {
                for e in a.entries() {
                    proptest::prop_assert!(normalise_path(e.path()) == Ok(Some(e.path())));
                }
                let _ = a.manifest();
            }
        }
    }
}
