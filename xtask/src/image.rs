//! The bootable GRUB ISO (multiboot2; BIOS and UEFI) built with grub-mkrescue.

use crate::tools;
use anyhow::{Context, Result, bail};
use std::path::Path;
use std::process::{Command, Stdio};

/// Builds an ISO at `out` that boots `elf` with `cmdline` through multiboot2.
pub fn build_iso(elf: &Path, cmdline: &str, out: &Path) -> Result<()> {
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
    std::fs::write(
        stage.join("boot/grub/grub.cfg"),
        format!(
            "set timeout=0\nset default=0\nmenuentry \"perch\" {{\n    multiboot2 /boot/perch-runtime {cmdline}\n    boot\n}}\n"
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
