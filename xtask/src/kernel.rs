//! Building the runtime ELF for `x86_64-unknown-none`, the host tool, and
//! the demo appliance's boot archive.

use crate::project_root;
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The cargo target directory in use.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| project_root().join("target"))
}

/// Builds the runtime (optimised, with debug info) and returns the ELF path.
/// Adds the `x86_64-unknown-none` target first if the toolchain lacks it.
pub fn build() -> Result<PathBuf> {
    crate::tools::require_targets(&[crate::tools::RUNTIME_TARGET])?;
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(project_root())
        .args([
            "build",
            "--package",
            "runtime",
            "--target",
            "x86_64-unknown-none",
            "--release",
            // Thin LTO: the sample drain crosses crates (runtime, sampler,
            // crc) on every sample.
            "--config",
            "profile.release.lto=\"thin\"",
        ])
        .env("DEFMT_LOG", "info")
        .status()
        .context("running cargo build for the runtime")?;
    if !status.success() {
        bail!("building the runtime failed ({status})");
    }
    let elf = target_dir().join("x86_64-unknown-none/release/perch-runtime");
    if !elf.exists() {
        bail!("the runtime was built but {} is missing", elf.display());
    }
    Ok(elf)
}

/// Builds the demo appliance's programs (`appliances/demo`, through the
/// end-to-end tests' builder) and packs them into `target/demo-appliance.cpio`
/// (for booting without perch); returns the archive. Adds the musl targets
/// first if the toolchain lacks them.
pub fn demo_archive() -> Result<PathBuf> {
    crate::tools::require_targets(crate::tools::PROGRAM_TARGETS)?;
    let programs = e2e_tests::programs::try_demo_programs().map_err(anyhow::Error::msg)?;
    let archive = target_dir().join("demo-appliance.cpio");
    e2e_tests::programs::demo_appliance_of(&programs)
        .write_to(&archive)
        .with_context(|| format!("packing {}", archive.display()))?;
    Ok(archive)
}

/// Builds the demo appliance's programs and returns the manifest for
/// `perch record --appliance` (`appliances/demo/appliance.toml`, or a copy
/// naming the programs' paths when the target directory is elsewhere).
pub fn demo_manifest() -> Result<PathBuf> {
    crate::tools::require_targets(crate::tools::PROGRAM_TARGETS)?;
    e2e_tests::programs::try_demo_manifest().map_err(anyhow::Error::msg)
}

/// Builds the host tool `perch` (optimised) and returns its path.
/// The root `cargo install` installs into: `root`, else
/// `$CARGO_INSTALL_ROOT`, else `$CARGO_HOME`, else `~/.cargo`.
fn install_root(root: Option<&Path>) -> Result<PathBuf> {
    if let Some(r) = root {
        return Ok(r.to_owned());
    }
    for var in ["CARGO_INSTALL_ROOT", "CARGO_HOME"] {
        if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            return Ok(PathBuf::from(v));
        }
    }
    match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        Some(h) => Ok(PathBuf::from(h).join(".cargo")),
        None => bail!("neither CARGO_INSTALL_ROOT, CARGO_HOME nor HOME is set: pass --root"),
    }
}

/// `cargo xtask install`: builds the runtime, installs perch with `cargo
/// install --path host-tool` (reusing the workspace's target directory),
/// and puts the runtime beside it as `perch-runtime`, where perch looks
/// for the runtime shipped with it.
pub fn install(root: Option<&Path>) -> Result<()> {
    let elf = build()?;
    let root = install_root(root)?;
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(project_root())
        .args(["install", "--locked", "--force", "--path", "host-tool"])
        .arg("--root")
        .arg(&root)
        .arg("--target-dir")
        .arg(target_dir())
        .status()
        .context("running cargo install for perch")?;
    if !status.success() {
        bail!("installing perch failed ({status})");
    }
    let bin = root.join("bin");
    let dest = bin.join(host_tool::runtime::INSTALLED_NAME);
    // Through a temporary file and a rename: a perch running meanwhile
    // never sees half a runtime.
    let tmp = bin.join(format!(".{}.tmp", host_tool::runtime::INSTALLED_NAME));
    std::fs::copy(&elf, &tmp)
        .and_then(|_| std::fs::rename(&tmp, &dest))
        .with_context(|| format!("installing the runtime as {}", dest.display()))?;
    println!(
        "xtask: installed {} and its runtime {} (build-id {})",
        bin.join("perch").display(),
        dest.display(),
        host_tool::runtime::build_id_hex(&dest)
            .as_deref()
            .unwrap_or("none")
    );
    let on_path =
        std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d == bin));
    if !on_path {
        println!(
            "xtask: {} is not on PATH: add it to run perch by name",
            bin.display()
        );
    }
    Ok(())
}

pub fn build_perch() -> Result<PathBuf> {
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(project_root())
        .args([
            "build",
            "--package",
            "host-tool",
            "--bin",
            "perch",
            "--release",
        ])
        .status()
        .context("running cargo build for perch")?;
    if !status.success() {
        bail!("building perch failed ({status})");
    }
    let bin = target_dir().join("release/perch");
    if !bin.exists() {
        bail!("perch was built but {} is missing", bin.display());
    }
    Ok(bin)
}
