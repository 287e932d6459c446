//! The bootable GRUB ISO (multiboot2; BIOS and UEFI) built with grub-mkrescue.

use crate::tools;
use anyhow::{Context, Result, bail};
use std::path::Path;
use std::process::{Command, Stdio};

/// Builds an ISO at `out` that boots `elf` with `cmdline` through
/// multiboot2, with `archive` (a boot archive) as its module when given.
pub fn build_iso(elf: &Path, cmdline: &str, archive: Option<&Path>, out: &Path) -> Result<()> {
    tools::require_tool(&tools::GRUB_MKRESCUE)?;
    let parent = out.parent().context("ISO path has no parent directory")?;
    std::fs::create_dir_all(parent)?;
    let stage = parent.join(format!(
        "{}.d",
        out.file_name().and_then(|n| n.to_str()).unwrap_or("iso")
    ));
    if stage.exists() {
        std::fs::remove_dir_all(&stage)?;
    }
    std::fs::create_dir_all(stage.join("boot/grub"))?;
    std::fs::copy(elf, stage.join("boot/perch-runtime"))
        .with_context(|| format!("copying {}", elf.display()))?;
    let module = match archive {
        Some(a) => {
            std::fs::copy(a, stage.join("boot/app.cpio"))
                .with_context(|| format!("copying {}", a.display()))?;
            "    module2 /boot/app.cpio\n"
        }
        None => "",
    };
    std::fs::write(
        stage.join("boot/grub/grub.cfg"),
        format!(
            "set timeout=0\nset default=0\nmenuentry \"perch\" {{\n    multiboot2 /boot/perch-runtime {cmdline}\n{module}    boot\n}}\n"
        ),
    )?;
    let output = Command::new("grub-mkrescue")
        .arg("-o")
        .arg(out)
        .arg(&stage)
        .stdin(Stdio::null())
        .output()
        .context("running grub-mkrescue")?;
    if !output.status.success() {
        bail!(
            "grub-mkrescue failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    std::fs::remove_dir_all(&stage)?;
    Ok(())
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
