//! Finding the external tools (QEMU, grub-mkrescue, OVMF, the C compilers of
//! the test programs) and the rustup targets, and saying exactly how to install
//! a missing one; installing it where that is possible (as root for Debian
//! packages, always for rustup targets), unless `PERCH_NO_INSTALL` is set.

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
/// musl-gcc, for the musl-linked C test program.
pub const MUSL_GCC: Tool = Tool {
    program: "musl-gcc",
    packages: &["musl-tools"],
};
/// The i386 C library `gcc -m32 -static` links against (gcc-multilib pulls it in).
pub const GCC_MULTILIB: Tool = Tool {
    program: "/usr/lib32/libc.a",
    packages: &["gcc-multilib"],
};
/// Debian's static busybox: the shell and tools the shell-script test runs.
pub const BUSYBOX: Tool = Tool {
    program: "/bin/busybox",
    packages: &["busybox-static"],
};
/// The compressors `cargo xtask bench` holds the wire against.
pub const ZSTD: Tool = Tool {
    program: "zstd",
    packages: &["zstd"],
};
/// See [`ZSTD`].
pub const XZ: Tool = Tool {
    program: "xz",
    packages: &["xz-utils"],
};
/// The target the runtime is built for.
pub const RUNTIME_TARGET: &str = "x86_64-unknown-none";
/// The targets of the Rust test program (`tests/programs/rust`).
pub const PROGRAM_TARGETS: &[&str] = &["x86_64-unknown-linux-musl", "i686-unknown-linux-musl"];

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
    let cmd = format!(
        "apt-get install -y --no-install-recommends {}",
        packages.join(" ")
    );
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

/// The toolchain channel pinned in `rust-toolchain.toml`.
fn pinned_toolchain() -> Result<String> {
    let path = crate::project_root().join("rust-toolchain.toml");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("channel"))
        .filter_map(|l| l.trim().strip_prefix('='))
        .map(|v| v.trim().trim_matches('"').to_string())
        .next()
        .ok_or_else(|| anyhow::anyhow!("{} has no `channel`", path.display()))
}

/// The targets whose standard library is missing from the sysroot of the
/// `rustc` that cargo uses here (the pinned toolchain under rustup).
fn missing_targets<'t>(targets: &[&'t str]) -> Result<Vec<&'t str>> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(&rustc)
        .current_dir(crate::project_root())
        .args(["--print", "sysroot"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| anyhow::anyhow!("running {rustc} --print sysroot: {e}"))?;
    if !out.status.success() {
        bail!(
            "{rustc} --print sysroot failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let sysroot = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    Ok(targets
        .iter()
        .copied()
        .filter(|t| !sysroot.join("lib/rustlib").join(t).join("lib").is_dir())
        .collect())
}

/// Makes sure the pinned toolchain has the standard library for `targets`:
/// adds the missing ones with rustup (saying so), or, without rustup or with
/// `PERCH_NO_INSTALL` set, fails with the exact command to run. Called before
/// any build, so that a missing target is not met as E0463 ("can't find
/// crate for `core`").
pub fn require_targets(targets: &[&str]) -> Result<()> {
    let policy = if std::env::var_os("PERCH_NO_INSTALL").is_some() {
        Install::Never
    } else {
        Install::IfRoot
    };
    require_targets_with(targets, policy)
}

/// [`require_targets`] with an explicit policy ([`Install::IfRoot`] adds
/// targets as any user: rustup installs into the user's own toolchain).
pub fn require_targets_with(targets: &[&str], policy: Install) -> Result<()> {
    let missing = missing_targets(targets)?;
    if missing.is_empty() {
        return Ok(());
    }
    let toolchain = pinned_toolchain()?;
    let cmd = format!(
        "rustup target add --toolchain {toolchain} {}",
        missing.join(" ")
    );
    if policy == Install::Never {
        bail!(
            "the Rust target(s) {} are missing; add them with: {cmd}",
            missing.join(", ")
        );
    }
    if !found("rustup") {
        bail!(
            "the Rust target(s) {} are missing and rustup is not installed; install rustup \
             (https://rustup.rs), then run: {cmd}",
            missing.join(", ")
        );
    }
    eprintln!(
        "xtask: the Rust target(s) {} are missing; adding them: {cmd}",
        missing.join(", ")
    );
    let ok = Command::new("rustup")
        .args(["target", "add", "--toolchain", &toolchain])
        .args(&missing)
        .stdin(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        bail!("`{cmd}` failed");
    }
    let still = missing_targets(&missing)?;
    if !still.is_empty() {
        bail!("`{cmd}` ran but {} are still missing", still.join(", "));
    }
    Ok(())
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
            "perch-no-such-tool is missing; install it with: sudo apt-get install -y \
             --no-install-recommends qemu-system-x86"
        );
    }

    #[test]
    fn installed_targets_are_found_and_a_made_up_one_is_missing() {
        // The runtime's target is in rust-toolchain.toml, so the pinned
        // toolchain has it wherever these tests build.
        assert_eq!(
            missing_targets(&[RUNTIME_TARGET]).unwrap(),
            Vec::<&str>::new()
        );
        assert_eq!(
            missing_targets(&["perch-no-such-target"]).unwrap(),
            vec!["perch-no-such-target"]
        );
        let version = Command::new("rustc")
            .current_dir(crate::project_root())
            .arg("--version")
            .output()
            .unwrap();
        let pinned = pinned_toolchain().unwrap();
        assert!(
            String::from_utf8_lossy(&version.stdout).contains(&pinned),
            "rustc here is not the pinned {pinned}"
        );
    }

    #[test]
    fn missing_target_names_the_rustup_command() {
        let e = require_targets_with(&[RUNTIME_TARGET, "perch-no-such-target"], Install::Never)
            .expect_err("the target does not exist");
        let pinned = pinned_toolchain().unwrap();
        assert_eq!(
            e.to_string(),
            format!(
                "the Rust target(s) perch-no-such-target are missing; add them with: \
                 rustup target add --toolchain {pinned} perch-no-such-target"
            )
        );
        require_targets_with(&[RUNTIME_TARGET], Install::Never).expect("installed");
    }

    #[test]
    fn present_tool_is_accepted() {
        require_with("sh", &["dash"], Install::Never).expect("sh exists");
        require_with("/", &["base-files"], Install::Never).expect("/ exists");
    }
}
