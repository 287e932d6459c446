//! The boot archive reader (`kcore::archive::Archive::parse`) and its
//! manifest lookup: newc archives built from members with colliding,
//! dotted and rooted paths and every file type, a manifest member, the
//! trailer or not, overwritten header bytes. Never panics; an archive it
//! accepts lists each normalised path once, finds every entry by its path,
//! and hands out data that lies inside the archive.

#![no_main]

use kcore::archive::{Archive, normalise_path};
use libfuzzer_sys::fuzz_target;
use perch_fuzz_input::newc::ArchiveSpec;

fuzz_target!(|spec: ArchiveSpec| {
    let bytes = spec.build();
    let Ok(archive) = Archive::parse(&bytes) else {
        return;
    };
    let range = bytes.as_ptr_range();
    let mut paths = Vec::new();
    for e in archive.entries() {
        let path = e.path();
        assert_eq!(
            normalise_path(path),
            Ok(Some(path)),
            "entry paths are normalised"
        );
        let found = archive.get(path).expect("every entry is found by its path");
        assert_eq!(found.path(), path);
        let data = e.data().as_ptr_range();
        assert!(data.start >= range.start && data.end <= range.end);
        let _ = e.file_type();
        let _ = e.permissions();
        let _ = e.mtime();
        paths.push(path.to_vec());
    }
    let n = paths.len();
    paths.sort();
    paths.dedup();
    assert_eq!(paths.len(), n, "no path is listed twice");
    if let Ok(m) = archive.manifest() {
        // What the archive's manifest says renders and reads back the same.
        let text = m.render().expect("a parsed manifest renders");
        assert_eq!(kcore::manifest::Manifest::parse(text.as_bytes()), Ok(m));
    }
});
