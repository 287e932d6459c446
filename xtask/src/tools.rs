//! Finding the external tools (QEMU, grub-mkrescue, OVMF) and saying exactly
//! how to install a missing one; as root, installing it.

use anyhow::{Result, bail};
use std::path::Path;
use std::process::{Command, Stdio};

/// An external tool and the Debian packages that provide it.
pub struct Tool {
    /// Program name (or file path for firmware).
    pub program: &'static str,
    /// Debian packages to install.
    pub packages: &'static [&'static str],
}

/// QEMU for x86-64.
pub const QEMU: Tool = Tool {
    program: "qemu-system-x86_64",
    packages: &["qemu-system-x86"],
};
/// grub-mkrescue and what it needs for BIOS and UEFI images.
pub const GRUB_MKRESCUE: Tool = Tool {
    program: "grub-mkrescue",
    packages: &[
        "grub-common",
        "grub-pc-bin",
        "grub-efi-amd64-bin",
        "xorriso",
        "mtools",
    ],
};
/// OVMF firmware path used for UEFI boots.
pub const OVMF_PATH: &str = "/usr/share/qemu/OVMF.fd";

fn found(program: &str) -> bool {
    if program.starts_with('/') {
        return Path::new(program).exists();
    }
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Whether a missing tool may be installed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Install {
    /// Install with apt-get when running as root.
    IfRoot,
    /// Never install; only explain.
    Never,
}

/// Makes sure `program` exists: installs `packages` when running as root
/// (unless `PERCH_NO_INSTALL` is set), otherwise fails with the exact
/// install command.
pub fn require(program: &str, packages: &[&str]) -> Result<()> {
    let policy = if std::env::var_os("PERCH_NO_INSTALL").is_some() {
        Install::Never
    } else {
        Install::IfRoot
    };
    require_with(program, packages, policy)
}

/// [`require`] with an explicit install policy.
pub fn require_with(program: &str, packages: &[&str], policy: Install) -> Result<()> {
    if found(program) {
        return Ok(());
    }
    let cmd = format!("apt-get install -y {}", packages.join(" "));
    if policy == Install::IfRoot && is_root() && found("apt-get") {
        eprintln!("xtask: {program} is missing; running as root, so installing it: {cmd}");
        let ok = Command::new("sh")
            .args([
                "-c",
                &format!("apt-get update -q && DEBIAN_FRONTEND=noninteractive {cmd}"),
            ])
            .stdin(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok && found(program) {
            return Ok(());
        }
        bail!("{program} is missing and `{cmd}` did not provide it");
    }
    bail!("{program} is missing; install it with: sudo {cmd}")
}

/// [`require`] for a [`Tool`].
pub fn require_tool(t: &Tool) -> Result<()> {
    require(t.program, t.packages)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_tool_names_the_install_command() {
        let e = require_with("perch-no-such-tool", &["qemu-system-x86"], Install::Never)
            .expect_err("the tool does not exist");
        assert_eq!(
            e.to_string(),
            "perch-no-such-tool is missing; install it with: sudo apt-get install -y qemu-system-x86"
        );
    }

    #[test]
    fn present_tool_is_accepted() {
        require_with("sh", &["dash"], Install::Never).expect("sh exists");
        require_with("/", &["base-files"], Install::Never).expect("/ exists");
    }
}
