//! Packing a Perch appliance: the boot archive (cpio newc, as Linux's initramfs) with the
//! programs, their data files, their directories and the `.perch/manifest` that says what
//! to start.
//!
//! ```no_run
//! use host_tool::archive::{Appliance, ProcessSpec};
//! let mut app = ProcessSpec::new("app", "bin/app");
//! app.argv.push(b"data/input.txt".to_vec());
//! Appliance::new()
//!     .file("bin/app", std::path::Path::new("target/app"))
//!     .file("data/input.txt", b"hello\n".to_vec())
//!     .process(app)
//!     .write_to(std::path::Path::new("app.cpio"))?;
//! # Ok::<(), host_tool::archive::PackError>(())
//! ```
//!
//! Entries are written with the `cpio` crate's newc writer, in path order, so parents
//! come before children: directories as 040755, programs (every file a process names as
//! its `exe`) as 0755, data files as 0644, owner 0:0 and mtime 0, so the same inputs give
//! the same bytes. The parent directories of every file are added. The manifest is
//! rendered by [`kcore::manifest::Manifest::render`], the format the runtime parses.
//! [`Appliance::write_to`] writes a temporary file beside the target and renames it into
//! place, so a reader never sees half an archive.

use kcore::manifest::{Manifest, RenderError};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

pub use kcore::manifest::ProcessSpec;

/// The archive path of the manifest.
pub const MANIFEST_PATH: &str = ".perch/manifest";

const MODE_DIR: u32 = 0o040755;
const MODE_PROGRAM: u32 = 0o100755;
const MODE_DATA: u32 = 0o100644;

/// Where a file's contents come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// These bytes.
    Bytes(Vec<u8>),
    /// The contents of this host file, read when the archive is written.
    Host(PathBuf),
}

impl From<Vec<u8>> for Source {
    fn from(bytes: Vec<u8>) -> Source {
        Source::Bytes(bytes)
    }
}

impl From<&[u8]> for Source {
    fn from(bytes: &[u8]) -> Source {
        Source::Bytes(bytes.to_vec())
    }
}

impl From<&str> for Source {
    /// The bytes of the string (not a host path: use a [`Path`] for that).
    fn from(text: &str) -> Source {
        Source::Bytes(text.as_bytes().to_vec())
    }
}

impl From<&Path> for Source {
    fn from(path: &Path) -> Source {
        Source::Host(path.to_path_buf())
    }
}

impl From<PathBuf> for Source {
    fn from(path: PathBuf) -> Source {
        Source::Host(path)
    }
}

/// Why an appliance could not be packed.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// A guest path is not a plain relative path.
    #[error("archive path {path:?}: {why}")]
    BadPath {
        /// The path as given.
        path: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// Two entries with one path, or a file where a directory is needed.
    #[error("archive path {0:?} is given twice (or is both a file and a directory)")]
    Duplicate(String),
    /// A process's `exe` is not a file in the appliance.
    #[error("process {name}: exe {exe:?} is not a file in the appliance")]
    MissingExe {
        /// The process name.
        name: String,
        /// Its exe path.
        exe: String,
    },
    /// The manifest cannot be rendered.
    #[error("manifest: {0}")]
    Manifest(#[from] RenderError),
    /// A file is too large for the newc format (4 GiB - 1).
    #[error("archive path {0:?}: larger than 4 GiB, which cpio newc cannot hold")]
    TooLarge(String),
    /// Reading a host file or writing the archive failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The host path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

#[derive(Debug, Clone)]
enum Node {
    Dir,
    File(Source),
}

/// An appliance under construction: files, directories and processes. Builder calls
/// record problems, which [`Appliance::to_bytes`] and [`Appliance::write_to`] report.
#[derive(Debug, Clone, Default)]
pub struct Appliance {
    nodes: BTreeMap<String, Node>,
    processes: Vec<ProcessSpec>,
    raw_manifest: Option<Vec<u8>>,
    problem: Option<(String, Option<&'static str>)>,
}

/// The normalised form of a guest path: leading `/` and `./` and a trailing `/` stripped;
/// empty, `.` and `..` components refused.
fn normalise(path: &str) -> Result<String, &'static str> {
    let p = crate::convert::archive_key(path);
    let p = p.strip_suffix('/').unwrap_or(p);
    if p.is_empty() {
        return Err("empty, or the root itself");
    }
    for part in p.split('/') {
        match part {
            "" | "." => return Err("has an empty or `.` component"),
            ".." => return Err("has a `..` component"),
            _ => {}
        }
    }
    if p == MANIFEST_PATH {
        return Err("is the manifest's own path");
    }
    Ok(p.to_string())
}

impl Appliance {
    /// An empty appliance.
    pub fn new() -> Appliance {
        Appliance::default()
    }

    fn add(mut self, path: &str, node: Node) -> Appliance {
        if self.problem.is_some() {
            return self;
        }
        let path = match normalise(path) {
            Ok(p) => p,
            Err(why) => {
                self.problem = Some((path.to_string(), Some(why)));
                return self;
            }
        };
        // Parents become directories; a parent that is a file is a conflict.
        let mut parent = path.as_str();
        while let Some((up, _)) = parent.rsplit_once('/') {
            match self.nodes.get(up) {
                Some(Node::File(_)) => {
                    self.problem = Some((up.to_string(), None));
                    return self;
                }
                Some(Node::Dir) => {}
                None => {
                    self.nodes.insert(up.to_string(), Node::Dir);
                }
            }
            parent = up;
        }
        match (self.nodes.get(&path), &node) {
            (None, _) => {
                self.nodes.insert(path, node);
            }
            (Some(Node::Dir), Node::Dir) => {}
            _ => self.problem = Some((path, None)),
        }
        self
    }

    /// Adds a file at `guest_path` (relative; a leading `/` or `./` is stripped) with the
    /// given bytes or the contents of a host file. Mode 0644, or 0755 when a process names
    /// it as its `exe`. Its parent directories are added.
    pub fn file(self, guest_path: &str, contents: impl Into<Source>) -> Appliance {
        self.add(guest_path, Node::File(contents.into()))
    }

    /// Adds a directory (040755), e.g. an empty one; parents are added too.
    pub fn dir(self, guest_path: &str) -> Appliance {
        self.add(guest_path, Node::Dir)
    }

    /// Adds a process to the manifest (started in the order added).
    pub fn process(mut self, spec: ProcessSpec) -> Appliance {
        self.processes.push(spec);
        self
    }

    /// Writes `text` as `.perch/manifest` instead of rendering the processes: for tests of
    /// how the runtime treats a bad manifest. The processes' exe checks are skipped.
    pub fn raw_manifest(mut self, text: impl Into<Vec<u8>>) -> Appliance {
        self.raw_manifest = Some(text.into());
        self
    }

    /// The manifest text the archive will hold.
    pub fn manifest_text(&self) -> Result<Vec<u8>, PackError> {
        if let Some(raw) = &self.raw_manifest {
            return Ok(raw.clone());
        }
        for p in &self.processes {
            let exe = normalise(&p.exe).unwrap_or_default();
            if !matches!(self.nodes.get(&exe), Some(Node::File(_))) {
                return Err(PackError::MissingExe {
                    name: p.name.clone(),
                    exe: p.exe.clone(),
                });
            }
        }
        let manifest = Manifest {
            processes: self.processes.clone(),
        };
        Ok(manifest.render()?.into_bytes())
    }

    /// The archive as bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, PackError> {
        let mut out = Vec::new();
        self.write(&mut out)?;
        Ok(out)
    }

    /// Writes the archive to `path`: into a temporary file in the same directory, renamed
    /// over `path` once complete.
    pub fn write_to(&self, path: &Path) -> Result<(), PackError> {
        let io = |what: &'static str, p: &Path| {
            let p = p.to_path_buf();
            move |source| PackError::Io {
                what,
                path: p,
                source,
            }
        };
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let bytes = self.to_bytes()?;
        let mut tmp = tempfile::Builder::new()
            .prefix(".perch-archive-")
            .tempfile_in(dir)
            .map_err(io("creating a temporary file in", dir))?;
        tmp.write_all(&bytes)
            .and_then(|()| tmp.as_file().sync_all())
            .map_err(io("writing", tmp.path()))?;
        tmp.persist(path)
            .map_err(|e| io("renaming the archive onto", path)(e.error))?;
        Ok(())
    }

    fn write(&self, out: &mut Vec<u8>) -> Result<(), PackError> {
        if let Some((path, why)) = &self.problem {
            return Err(match why {
                Some(why) => PackError::BadPath {
                    path: path.clone(),
                    why,
                },
                None => PackError::Duplicate(path.clone()),
            });
        }
        let manifest = self.manifest_text()?;
        let exes: Vec<String> = self
            .processes
            .iter()
            .filter_map(|p| normalise(&p.exe).ok())
            .collect();
        let mut ino = 0u32;
        let mut entry = |out: &mut Vec<u8>, name: &str, mode: u32, data: &[u8]| {
            ino += 1;
            let size = u32::try_from(data.len()).map_err(|_| PackError::TooLarge(name.into()))?;
            let nlink = if mode == MODE_DIR { 2 } else { 1 };
            let mut w = cpio::newc::Builder::new(name)
                .ino(ino)
                .mode(mode)
                .nlink(nlink)
                .write(&mut *out, size);
            w.write_all(data)
                .and_then(|()| w.finish().map(drop))
                .map_err(|source| PackError::Io {
                    what: "writing the archive entry",
                    path: PathBuf::from(name),
                    source,
                })
        };
        for (path, node) in &self.nodes {
            match node {
                Node::Dir => entry(out, path, MODE_DIR, &[])?,
                Node::File(source) => {
                    // A program of the manifest, or a file a program may
                    // execve: one its host file's mode lets run, an ELF or
                    // a `#!` script.
                    let mode = |b: &[u8], host_exec: bool| {
                        if exes.contains(path)
                            || host_exec
                            || b.starts_with(b"\x7fELF")
                            || b.starts_with(b"#!")
                        {
                            MODE_PROGRAM
                        } else {
                            MODE_DATA
                        }
                    };
                    match source {
                        Source::Bytes(b) => entry(out, path, mode(b, false), b)?,
                        Source::Host(host) => {
                            let b = std::fs::read(host).map_err(|source| PackError::Io {
                                what: "reading",
                                path: host.clone(),
                                source,
                            })?;
                            let host_exec = {
                                use std::os::unix::fs::PermissionsExt;
                                std::fs::metadata(host)
                                    .is_ok_and(|m| m.permissions().mode() & 0o111 != 0)
                            };
                            entry(out, path, mode(&b, host_exec), &b)?
                        }
                    }
                }
            }
        }
        if !self.nodes.contains_key(".perch") {
            entry(out, ".perch", MODE_DIR, &[])?;
        }
        entry(out, MANIFEST_PATH, MODE_DATA, &manifest)?;
        cpio::newc::trailer(&mut *out).map_err(|source| PackError::Io {
            what: "writing the archive trailer",
            path: PathBuf::new(),
            source,
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kcore::archive::{Archive, FileType};

    fn spec(name: &str, exe: &str, args: &[&str]) -> ProcessSpec {
        let mut p = ProcessSpec::new(name, exe);
        p.argv = args.iter().map(|a| a.as_bytes().to_vec()).collect();
        p.envp = vec![b"PERCH_GREETING=hi there".to_vec()];
        p.cwd = "/".into();
        p
    }

    #[test]
    fn files_a_program_may_run_are_packed_executable() {
        use std::os::unix::fs::PermissionsExt;
        let exe = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(exe.path(), b"any bytes").unwrap();
        std::fs::set_permissions(exe.path(), std::fs::Permissions::from_mode(0o750)).unwrap();
        let plain = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(plain.path(), b"any bytes").unwrap();
        std::fs::set_permissions(plain.path(), std::fs::Permissions::from_mode(0o640)).unwrap();
        let bytes = Appliance::new()
            .file("bin/host-exec", exe.path())
            .file("data/host-plain", plain.path())
            .file("bin/elf", b"\x7fELF\x02".to_vec())
            .file("bin/script", "#!/bin/sh\n")
            .file("data/text", "#not a script\n")
            .to_bytes()
            .unwrap();
        let archive = Archive::parse(&bytes).unwrap();
        let mode = |p: &str| archive.get(p.as_bytes()).map(|e| e.mode());
        assert_eq!(mode("bin/host-exec"), Some(0o100755));
        assert_eq!(mode("data/host-plain"), Some(0o100644));
        assert_eq!(mode("bin/elf"), Some(0o100755));
        assert_eq!(mode("bin/script"), Some(0o100755));
        assert_eq!(mode("data/text"), Some(0o100644));
    }

    #[test]
    fn archive_reads_back_with_modes_directories_and_manifest() {
        let host = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(host.path(), b"\x7fELF pretend program").unwrap();
        let a = spec("app", "bin/app", &["app", "data/input.txt"]);
        let b = spec("tab\\name", "/bin/other", &["other", "a\tb\n\\ \x01"]);
        let app = Appliance::new()
            .file("bin/app", host.path())
            .file("./bin/other", b"other".to_vec())
            .file("data/input.txt", "hello\nworld\n")
            .file("data/sub/deep.bin", vec![0u8, 1, 2, 255])
            .dir("data/empty")
            .process(a.clone())
            .process(b.clone());
        let bytes = app.to_bytes().unwrap();
        assert_eq!(&bytes[..6], b"070701");
        let archive = Archive::parse(&bytes).expect("kcore reads the archive");
        let got: Vec<(String, u32)> = archive
            .entries()
            .map(|e| (String::from_utf8(e.path().to_vec()).unwrap(), e.mode()))
            .collect();
        let want: Vec<(String, u32)> = [
            (".perch", 0o040755),
            (".perch/manifest", 0o100644),
            ("bin", 0o040755),
            ("bin/app", 0o100755),
            ("bin/other", 0o100755),
            ("data", 0o040755),
            ("data/empty", 0o040755),
            ("data/input.txt", 0o100644),
            ("data/sub", 0o040755),
            ("data/sub/deep.bin", 0o100644),
        ]
        .iter()
        .map(|(p, m)| (p.to_string(), *m))
        .collect();
        let mut sorted = got.clone();
        sorted.sort();
        assert_eq!(sorted, want);
        // Parents are written before their children.
        for (i, (path, _)) in got.iter().enumerate() {
            if let Some((parent, _)) = path.rsplit_once('/') {
                let at = got.iter().position(|(p, _)| p == parent).unwrap();
                assert!(at < i, "{parent} comes after {path}");
            }
        }
        assert_eq!(
            archive.get(b"bin/app").unwrap().data(),
            b"\x7fELF pretend program"
        );
        assert_eq!(
            archive.get(b"data/sub/deep.bin").unwrap().data(),
            [0, 1, 2, 255]
        );
        assert_eq!(
            archive.get(b"data/empty").unwrap().file_type(),
            FileType::Directory
        );
        let manifest = archive.manifest().expect("the manifest parses");
        assert_eq!(manifest.processes, vec![a, b]);
    }

    #[test]
    fn same_inputs_give_the_same_bytes() {
        let make = || {
            Appliance::new()
                .file("bin/p", b"p".to_vec())
                .file("z", b"z".to_vec())
                .process(ProcessSpec::new("p", "bin/p"))
                .to_bytes()
                .unwrap()
        };
        assert_eq!(make(), make());
    }

    #[test]
    fn raw_manifest_is_written_as_given() {
        let bytes = Appliance::new()
            .file("bin/p", b"p".to_vec())
            .raw_manifest("perch-manifest 2\n")
            .to_bytes()
            .unwrap();
        let archive = Archive::parse(&bytes).unwrap();
        assert_eq!(
            archive.get(b".perch/manifest").unwrap().data(),
            b"perch-manifest 2\n"
        );
        let err = archive.manifest().expect_err("version 2 is refused");
        assert!(err.to_string().contains('2'), "{err}");
    }

    #[test]
    fn bad_inputs_are_refused_with_the_reason() {
        let refuse = |app: Appliance| app.to_bytes().expect_err("refused").to_string();
        assert!(refuse(Appliance::new().file("a/../b", b"".to_vec())).contains("`..`"));
        assert!(refuse(Appliance::new().file("a//b", b"".to_vec())).contains("empty"));
        assert!(refuse(Appliance::new().file("/", b"".to_vec())).contains("root"));
        assert!(
            refuse(Appliance::new().file(".perch/manifest", b"".to_vec())).contains("manifest")
        );
        assert!(
            refuse(
                Appliance::new()
                    .file("x", b"1".to_vec())
                    .file("./x", b"2".to_vec())
            )
            .contains("given twice")
        );
        assert!(
            refuse(
                Appliance::new()
                    .file("x", b"1".to_vec())
                    .file("x/y", b"2".to_vec())
            )
            .contains("\"x\"")
        );
        let missing = refuse(Appliance::new().process(ProcessSpec::new("p", "bin/p")));
        assert!(missing.contains("bin/p"), "{missing}");
        let bad_name = refuse(
            Appliance::new()
                .file("bin/p", b"p".to_vec())
                .process(ProcessSpec::new("has space", "bin/p")),
        );
        assert!(bad_name.starts_with("manifest:"), "{bad_name}");
        let no_host = refuse(Appliance::new().file("p", Path::new("/nonexistent/perch/x")));
        assert!(no_host.contains("/nonexistent/perch/x"), "{no_host}");
    }

    #[test]
    fn write_to_replaces_the_target_whole_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("app.cpio");
        std::fs::write(&target, b"old").unwrap();
        let app = Appliance::new()
            .file("bin/p", b"p".to_vec())
            .process(ProcessSpec::new("p", "bin/p"));
        app.write_to(&target).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), app.to_bytes().unwrap());
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("app.cpio")]);
        // A failed pack leaves the old archive alone.
        let bad = Appliance::new().process(ProcessSpec::new("p", "bin/missing"));
        bad.write_to(&target).expect_err("missing exe");
        assert_eq!(std::fs::read(&target).unwrap(), app.to_bytes().unwrap());
    }
}
