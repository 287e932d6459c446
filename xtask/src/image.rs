//! The bootable GRUB ISO (multiboot2; BIOS and UEFI) built with grub-mkrescue.

use crate::tools;
use anyhow::Result;
use std::path::Path;

/// Builds an ISO at `out` that boots `elf` with `cmdline` through
/// multiboot2, with `archive` (a boot archive) as its module when given
/// (`host_tool::iso`, which `perch image` uses too).
pub fn build_iso(elf: &Path, cmdline: &str, archive: Option<&Path>, out: &Path) -> Result<()> {
    tools::require_tool(&tools::GRUB_MKRESCUE)?;
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    host_tool::iso::build_iso(elf, cmdline, archive, out).map_err(|e| anyhow::anyhow!("{e}"))
}

/// The text of the self-test's boot archive probe file: the self-test
/// checks that the module it was handed holds exactly this.
pub const SELFTEST_PROBE: &str = "perch self-test boot archive\n";

/// Writes the boot archive the self-test is booted with in every mode: a
/// probe file and a manifest naming one process, so the self-test can
/// check that the boot protocol handed the archive over intact.
pub fn selftest_archive(out: &Path) -> Result<()> {
    // The process names the probe file as its program: the self-test only
    // reads the archive, it starts nothing from it.
    let spec = kcore::manifest::ProcessSpec::new("st_archive", "data/selftest.txt");
    host_tool::archive::Appliance::new()
        .file("data/selftest.txt", SELFTEST_PROBE.as_bytes().to_vec())
        .process(spec)
        .write_to(out)
        .map_err(|e| anyhow::anyhow!("writing the self-test archive: {e}"))
}
