//! perf's build-id cache, written the way `perf buildid-cache -a` lays it
//! out, so a plain `perf report` finds the runtime and every program by the
//! build-ids in perf.data with no flags and no perf needed to write it.
//!
//! The cache directory is `$PERF_BUILDID_DIR` when set, else
//! `$HOME/.debug` (perf's default `buildid.dir`). An ELF at absolute path
//! `/a/b/prog` with build-id `0123ab...` is cached as
//!
//! ```text
//! DIR/a/b/prog/0123ab.../elf             a copy of the file
//! DIR/.build-id/01/23ab...  ->  ../../a/b/prog/0123ab...
//! ```
//!
//! which perf reads for user DSOs (`.build-id/01/23ab.../elf`). perf looks
//! the kernel up as `.build-id/<xx>/<rest>/kallsyms` and loads that file as
//! a vmlinux before the standard vmlinux paths (`dso__load_kernel_sym`), so
//! the runtime's entry also holds the ELF as `kallsyms`: runtime samples
//! under `[kernel.kallsyms]` then resolve with no `--vmlinux` and no
//! "No kallsyms or vmlinux" warning.
//!
//! The runtime's entry also holds its functions as a Breakpad symbol file,
//! `breakpad.sym` ([`crate::breakpad`]), which perf.data names in a second
//! kernel build-id entry ([`kernel_symbols_path`]): samply opens the kernel
//! by the path of its build-id entry (as perf itself writes one for a
//! kernel it read from a vmlinux file) and finds the runtime's names there,
//! while perf files that entry under another machine (pid 0) and keeps
//! `[kernel.kallsyms]` as the host's kernel.
//!
//! Files are written to a temporary name in the entry's directory and
//! renamed into place; an entry or link already there is left alone (a
//! cache is shared with perf and other runs: nothing is ever removed or
//! overwritten).

use std::io::Write;
use std::path::{Path, PathBuf};

/// The cache directory: `$PERF_BUILDID_DIR`, else `$HOME/.debug`; `None`
/// when neither is set.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("PERF_BUILDID_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".debug"))
}

/// What [`add`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Added {
    /// The entry was written (or completed).
    New(PathBuf),
    /// The entry was there already, with these bytes.
    Present(PathBuf),
}

/// Lowercase hex.
fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Writes `bytes` as `path` through a temporary file in the same
/// directory, unless `path` exists. Returns whether it wrote.
fn put_file(path: &Path, bytes: &[u8], executable: bool) -> std::io::Result<bool> {
    if std::fs::symlink_metadata(path).is_ok() {
        return Ok(false);
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new()
        .prefix(".perch-")
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.flush()?;
    if executable {
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o755))?;
    }
    // `persist_noclobber` refuses to replace a file that appeared meanwhile.
    match tmp.persist_noclobber(path) {
        Ok(_) => Ok(true),
        Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e.error),
    }
}

/// The directory [`add`] makes for `file` with `build_id` in the cache at
/// `dir`: `DIR/<absolute path of file>/<build-id in hex>`.
fn entry_dir(dir: &Path, file: &Path, build_id: &[u8]) -> std::io::Result<PathBuf> {
    let abs = std::fs::canonicalize(file)?;
    let rel = abs.strip_prefix("/").unwrap_or(&abs);
    Ok(dir.join(rel).join(hex(build_id)))
}

/// The name of the runtime's Breakpad symbol file in its entry.
pub const KERNEL_SYMBOLS: &str = "breakpad.sym";

/// Where [`add_kernel_symbols`] puts the Breakpad symbols of the runtime
/// image `file` with `build_id` in the cache at `dir`
/// (`.../<build-id>/breakpad.sym`), made absolute; `None` when `file`
/// cannot be resolved or has no build-id.
pub fn kernel_symbols_path(dir: &Path, file: &Path, build_id: &[u8]) -> Option<PathBuf> {
    if build_id.is_empty() {
        return None;
    }
    let dir = std::path::absolute(dir).ok()?;
    entry_dir(&dir, file, build_id)
        .ok()
        .map(|e| e.join(KERNEL_SYMBOLS))
}

/// Adds `text`, the Breakpad symbols of the runtime image `file` with
/// `build_id`, to its entry in the cache at `dir`, unless there already.
/// Returns whether it wrote.
pub fn add_kernel_symbols(
    dir: &Path,
    file: &Path,
    build_id: &[u8],
    text: &str,
) -> std::io::Result<bool> {
    if build_id.is_empty() {
        return Err(std::io::Error::other("the file has no build-id"));
    }
    let entry = entry_dir(dir, file, build_id)?;
    std::fs::create_dir_all(&entry)?;
    put_file(&entry.join(KERNEL_SYMBOLS), text.as_bytes(), false)
}

/// Adds `file` (whose contents are `bytes` and GNU build-id `build_id`) to
/// the cache at `dir`; `kernel` also stores it as the kernel's `kallsyms`
/// (the runtime image).
pub fn add(
    dir: &Path,
    file: &Path,
    bytes: &[u8],
    build_id: &[u8],
    kernel: bool,
) -> std::io::Result<Added> {
    if build_id.is_empty() {
        return Err(std::io::Error::other("the file has no build-id"));
    }
    let abs = std::fs::canonicalize(file)?;
    let id = hex(build_id);
    let rel = abs.strip_prefix("/").unwrap_or(&abs);
    let entry = entry_dir(dir, file, build_id)?;
    std::fs::create_dir_all(&entry)?;
    let mut wrote = put_file(&entry.join("elf"), bytes, true)?;
    if kernel {
        wrote |= put_file(&entry.join("kallsyms"), bytes, false)?;
    }
    let (head, rest) = id.split_at(2);
    let links = dir.join(".build-id").join(head);
    std::fs::create_dir_all(&links)?;
    let link = links.join(rest);
    if std::fs::symlink_metadata(&link).is_err() {
        let target = Path::new("../..").join(rel).join(&id);
        let tmp = links.join(format!(".perch-{rest}-{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&target, &tmp)?;
        // rename(2) over a link that appeared meanwhile would replace it:
        // check once more, as close to the rename as this gets.
        if std::fs::symlink_metadata(&link).is_ok() {
            let _ = std::fs::remove_file(&tmp);
        } else {
            std::fs::rename(&tmp, &link)?;
            wrote = true;
        }
    }
    Ok(if wrote {
        Added::New(entry)
    } else {
        Added::Present(entry)
    })
}

/// Whether the cache at `dir` holds the runtime image with `build_id` as
/// the kernel (`.build-id/<xx>/<rest>/kallsyms`), so that a plain
/// `perf report` names its frames.
pub fn holds_kernel(dir: &Path, build_id: &[u8]) -> bool {
    if build_id.is_empty() {
        return false;
    }
    let id = hex(build_id);
    let (head, rest) = id.split_at(2);
    dir.join(".build-id")
        .join(head)
        .join(rest)
        .join("kallsyms")
        .is_file()
}

/// How to open `output` with perf: plain `perf report` when the runtime is
/// in the build-id cache (`vmlinux` is `None`), else with
/// `--vmlinux=IMAGE --demangle-kernel`. perch and `cargo xtask run` both
/// end with this line.
pub fn open_hint(output: &Path, vmlinux: Option<&Path>) -> String {
    let o = output.display();
    match vmlinux {
        None => format!("open it with: perf report -i {o}   (or perf script -i {o})"),
        Some(v) => {
            let v = v.display();
            format!(
                "open it with: perf report -i {o} --vmlinux={v} --demangle-kernel   \
                 (or perf script -i {o} --vmlinux={v} --demangle-kernel)"
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_open_hint_needs_vmlinux_only_for_a_runtime_not_cached() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let file = dir.path().join("runtime");
        std::fs::write(&file, b"elf").unwrap();
        let id = [0x12, 0x34, 0x56];
        assert!(!holds_kernel(&cache, &id));
        // A program (not the kernel) does not make the runtime findable.
        add(&cache, &file, b"elf", &id, false).unwrap();
        assert!(!holds_kernel(&cache, &id));
        let cache = dir.path().join("cache2");
        add(&cache, &file, b"elf", &id, true).unwrap();
        assert!(holds_kernel(&cache, &id));
        assert!(!holds_kernel(&cache, &[0x12, 0x34, 0x57]));
        assert!(!holds_kernel(&cache, &[]));
        let out = Path::new("out/perf.data");
        assert_eq!(
            open_hint(out, None),
            "open it with: perf report -i out/perf.data   (or perf script -i out/perf.data)"
        );
        let h = open_hint(out, Some(Path::new("rt.elf")));
        assert!(
            h.starts_with(
                "open it with: perf report -i out/perf.data --vmlinux=rt.elf --demangle-kernel"
            ),
            "{h}"
        );
        assert!(
            h.contains("perf script -i out/perf.data --vmlinux=rt.elf --demangle-kernel"),
            "{h}"
        );
    }

    #[test]
    fn entries_and_links_follow_perfs_layout_and_are_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let file = dir.path().join("prog");
        std::fs::write(&file, b"one").unwrap();
        let id = [0xab, 0xcd, 0x01, 0x02];
        let got = add(&cache, &file, b"one", &id, true).unwrap();
        let abs = std::fs::canonicalize(&file).unwrap();
        let entry = cache.join(abs.strip_prefix("/").unwrap()).join("abcd0102");
        assert_eq!(got, Added::New(entry.clone()));
        let sym = kernel_symbols_path(&cache, &file, &id).unwrap();
        assert_eq!(sym, entry.join("breakpad.sym"));
        assert!(add_kernel_symbols(&cache, &file, &id, "MODULE one").unwrap());
        assert!(!add_kernel_symbols(&cache, &file, &id, "MODULE two").unwrap());
        assert_eq!(std::fs::read(&sym).unwrap(), b"MODULE one");
        assert_eq!(kernel_symbols_path(&cache, &file, &[]), None);
        assert_eq!(
            kernel_symbols_path(&cache, &dir.path().join("absent"), &id),
            None
        );
        assert_eq!(std::fs::read(entry.join("elf")).unwrap(), b"one");
        assert_eq!(std::fs::read(entry.join("kallsyms")).unwrap(), b"one");
        let link = cache.join(".build-id/ab/cd0102");
        assert_eq!(
            std::fs::read_link(&link).unwrap(),
            Path::new("../..")
                .join(abs.strip_prefix("/").unwrap())
                .join("abcd0102")
        );
        assert_eq!(std::fs::read(link.join("elf")).unwrap(), b"one");
        // A second add leaves the entry as it was, even with other bytes.
        assert_eq!(
            add(&cache, &file, b"two", &id, true).unwrap(),
            Added::Present(entry.clone())
        );
        assert_eq!(std::fs::read(entry.join("elf")).unwrap(), b"one");
        // No temporary file is left behind.
        let leftovers: Vec<_> = std::fs::read_dir(&entry)
            .unwrap()
            .chain(std::fs::read_dir(cache.join(".build-id/ab")).unwrap())
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(".perch-"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        assert!(add(&cache, &file, b"one", &[], false).is_err());
    }
}
