//! The bootable GRUB ISO for bare metal (multiboot2; BIOS and UEFI), built
//! with grub-mkrescue: the runtime as `/boot/perch-runtime` with its command
//! line, and the boot archive as the module `/boot/app.cpio` when there is
//! one (`perch image`, `cargo xtask image`).

use std::path::Path;
use std::process::{Command, Stdio};

use crate::error::HostError;

/// The packages grub-mkrescue needs (Debian).
pub const GRUB_PACKAGES: &str = "grub-common grub-pc-bin grub-efi-amd64-bin xorriso mtools";

/// The GRUB configuration that boots the runtime with `cmdline` and, when
/// `module` is set, the boot archive.
pub fn grub_cfg(cmdline: &str, module: bool) -> String {
    let module = if module {
        "    module2 /boot/app.cpio\n"
    } else {
        ""
    };
    format!(
        "set timeout=0\nset default=0\nmenuentry \"perch\" {{\n    multiboot2 /boot/perch-runtime {cmdline}\n{module}    boot\n}}\n"
    )
}

/// Builds an ISO at `out` that boots `elf` with `cmdline` through
/// multiboot2, with `archive` (a boot archive) as its module when given.
/// The staging directory is a temporary one, removed afterwards.
pub fn build_iso(
    elf: &Path,
    cmdline: &str,
    archive: Option<&Path>,
    out: &Path,
) -> Result<(), HostError> {
    let stage = tempfile::Builder::new()
        .prefix("perch-iso-")
        .tempdir()
        .map_err(|e| HostError::io("creating the ISO staging directory", e))?;
    let boot = stage.path().join("boot");
    std::fs::create_dir_all(boot.join("grub"))
        .map_err(|e| HostError::io("creating the ISO staging directory", e))?;
    std::fs::copy(elf, boot.join("perch-runtime"))
        .map_err(|e| HostError::io(format!("copying {}", elf.display()), e))?;
    if let Some(a) = archive {
        std::fs::copy(a, boot.join("app.cpio"))
            .map_err(|e| HostError::io(format!("copying {}", a.display()), e))?;
    }
    std::fs::write(
        boot.join("grub/grub.cfg"),
        grub_cfg(cmdline, archive.is_some()),
    )
    .map_err(|e| HostError::io("writing grub.cfg", e))?;
    let output = Command::new("grub-mkrescue")
        .arg("-o")
        .arg(out)
        .arg(stage.path())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| HostError::MissingTool {
            tool: "grub-mkrescue".into(),
            reason: e.to_string(),
            install: format!("apt-get install --no-install-recommends {GRUB_PACKAGES}"),
        })?;
    if !output.status.success() {
        return Err(HostError::BadTool(format!(
            "grub-mkrescue failed ({}): {} (it needs {GRUB_PACKAGES})",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grub_config_boots_the_runtime_with_its_module() {
        let c = grub_cfg("console=wire freq=1000", true);
        assert!(c.contains("multiboot2 /boot/perch-runtime console=wire freq=1000\n"));
        assert!(c.contains("module2 /boot/app.cpio\n"));
        assert!(!grub_cfg("x", false).contains("module2"));
    }
}
