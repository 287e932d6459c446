//! The boot archive handed over by the boot protocol.

use super::*;

/// The probe file `cargo xtask selftest` puts in the boot archive it boots
/// the self-test with (xtask's `image::SELFTEST_PROBE`).
pub(super) const ARCHIVE_PROBE: &[u8] = b"perch self-test boot archive\n";

/// The boot archive arrived through the boot protocol's module list (PVH
/// or multiboot2) intact: it parses, its manifest names the one process
/// xtask wrote, and its probe file holds the expected bytes. Skipped (and
/// said so) when the runtime was booted without an archive.
pub(super) fn boot_archive(
    archive: Option<arch_x86::bootinfo::Module>,
    protocol: &str,
) -> TestResult {
    let Some(m) = archive else {
        kprintln!("selftest: boot_archive: skipped (booted without a boot archive)");
        return Ok(());
    };
    let bytes = crate::fs::module_bytes(&m);
    let a = match kcore::archive::Archive::parse(bytes) {
        Ok(a) => a,
        Err(e) => fail!("archive at {:#x} ({} bytes): {e}", m.base, m.len),
    };
    let man = match a.manifest() {
        Ok(man) => man,
        Err(e) => fail!("{e}"),
    };
    ensure!(
        man.processes.len() == 1 && man.processes[0].name == "st_archive",
        "manifest has {} processes",
        man.processes.len()
    );
    let probe = a.get(b"data/selftest.txt").map(|e| e.data());
    ensure!(probe == Some(ARCHIVE_PROBE), "probe file {probe:?}");
    kprintln!(
        "selftest: boot archive via {protocol}: {} bytes at {:#x}, {} entries",
        m.len,
        m.base,
        a.entries().len()
    );
    Ok(())
}
