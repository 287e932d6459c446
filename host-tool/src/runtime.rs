//! Where `perch record`, `perch top` and `perch image` find the runtime
//! image when the command line names none.
//!
//! In order: `--image ELF`; else `$PERCH_IMAGE`; else the runtime shipped
//! with perch, beside its binary: `perch-runtime` in perch's own directory
//! (where `cargo xtask install` puts it), then the build tree's
//! `../x86_64-unknown-none/release/perch-runtime` (perch run from
//! `target/debug` or `target/release` after `cargo xtask build`).

use std::path::{Path, PathBuf};

/// The environment variable naming the runtime image.
pub const ENV: &str = "PERCH_IMAGE";

/// The file name of the runtime installed beside perch.
pub const INSTALLED_NAME: &str = "perch-runtime";

/// The one command that makes the shipped runtime.
pub const INSTALL_COMMAND: &str = "cargo xtask install";

/// Where the image came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// `--image`.
    Flag,
    /// `$PERCH_IMAGE`.
    Env,
    /// The runtime shipped with perch.
    Shipped,
}

/// The runtime image to use, and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Located {
    /// Its path.
    pub path: PathBuf,
    /// How it was found.
    pub origin: Origin,
}

impl Located {
    /// How to name it in a message: `--image X`, `PERCH_IMAGE=X`, or the
    /// shipped runtime `X`.
    pub fn describe(&self) -> String {
        let p = self.path.display();
        match self.origin {
            Origin::Flag => format!("--image {p}"),
            Origin::Env => format!("{ENV}={p}"),
            Origin::Shipped => format!("the runtime shipped with perch ({p})"),
        }
    }
}

/// The places the runtime shipped with perch may be, for perch at `exe`.
pub fn shipped_candidates(exe: &Path) -> Vec<PathBuf> {
    let Some(dir) = exe.parent() else {
        return Vec::new();
    };
    let mut v = vec![dir.join(INSTALLED_NAME)];
    if let Some(up) = dir.parent() {
        v.push(up.join("x86_64-unknown-none/release/perch-runtime"));
    }
    v
}

/// perch's own binary, links resolved (so that a symlink on PATH still
/// finds the runtime beside the real file).
fn current_exe() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    Some(std::fs::canonicalize(&exe).unwrap_or(exe))
}

/// The places the runtime shipped with this perch may be.
pub fn candidates() -> Vec<PathBuf> {
    current_exe()
        .map(|e| shipped_candidates(&e))
        .unwrap_or_default()
}

/// The runtime shipped with perch, if it is there.
pub fn shipped() -> Option<PathBuf> {
    candidates().into_iter().find(|p| p.is_file())
}

/// Finds the runtime: `flag` (`--image`), else `$PERCH_IMAGE`, else the
/// shipped one. The error names every place looked and the command that
/// makes the runtime.
pub fn locate(flag: Option<&Path>) -> Result<Located, String> {
    if let Some(p) = flag {
        return Ok(Located {
            path: p.to_owned(),
            origin: Origin::Flag,
        });
    }
    if let Some(p) = std::env::var_os(ENV).filter(|v| !v.is_empty()) {
        return Ok(Located {
            path: PathBuf::from(p),
            origin: Origin::Env,
        });
    }
    let candidates = candidates();
    if let Some(p) = candidates.iter().find(|p| p.is_file()) {
        return Ok(Located {
            path: p.clone(),
            origin: Origin::Shipped,
        });
    }
    Err(not_found(&candidates))
}

/// The message for a runtime found nowhere.
pub fn not_found(candidates: &[PathBuf]) -> String {
    let mut places = vec![
        "--image (not given)".to_owned(),
        format!("${ENV} (not set)"),
    ];
    places.extend(
        candidates
            .iter()
            .map(|p| format!("{} (no such file)", p.display())),
    );
    format!(
        "no runtime image to boot; perch looked at: {}. \
         `{INSTALL_COMMAND}` (in the Perch source tree) installs perch with its runtime \
         (`cargo xtask build` builds it for a perch run from that tree's target directory)",
        places.join(", ")
    )
}

/// The build-id of the ELF at `path`, in hex.
pub fn build_id_hex(path: &Path) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    let id = kcore::elf::build_id(&bytes)?;
    Some(id.iter().map(|b| format!("{b:02x}")).collect())
}

/// A warning when `image` (given with --image or $PERCH_IMAGE) is not the
/// runtime shipped with perch (`shipped`, build-id `shipped_id`): another
/// or an older build, whose boot and symbols are its own.
pub fn stale_warning(
    image: &Located,
    image_id: Option<&str>,
    shipped: &Path,
    shipped_id: Option<&str>,
) -> Option<String> {
    if image.origin == Origin::Shipped {
        return None;
    }
    let (Some(mine), Some(theirs)) = (image_id, shipped_id) else {
        return None;
    };
    (mine != theirs).then(|| {
        format!(
            "{} has build-id {mine}, not that of the runtime shipped with this perch \
             ({}, build-id {theirs}): it is another or an older build; perch boots it as asked \
             (rebuild it, or drop --image / {ENV} to use the shipped one)",
            image.describe(),
            shipped.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_are_beside_the_binary_then_in_the_build_tree() {
        assert_eq!(
            shipped_candidates(Path::new("/home/u/.cargo/bin/perch")),
            [
                PathBuf::from("/home/u/.cargo/bin/perch-runtime"),
                PathBuf::from("/home/u/.cargo/x86_64-unknown-none/release/perch-runtime"),
            ]
        );
        assert_eq!(
            shipped_candidates(Path::new("/src/target/debug/perch"))[1],
            Path::new("/src/target/x86_64-unknown-none/release/perch-runtime")
        );
    }

    #[test]
    fn the_not_found_message_names_every_place_and_the_command() {
        let c = [PathBuf::from("/a/perch-runtime"), PathBuf::from("/b/rt")];
        let m = not_found(&c);
        for needle in [
            "--image",
            "$PERCH_IMAGE",
            "/a/perch-runtime",
            "/b/rt",
            "cargo xtask install",
        ] {
            assert!(m.contains(needle), "{needle}: {m}");
        }
    }

    #[test]
    fn a_stale_image_is_named_and_the_shipped_one_never() {
        let given = Located {
            path: "old.elf".into(),
            origin: Origin::Flag,
        };
        let w = stale_warning(&given, Some("aa"), Path::new("/s/rt"), Some("bb")).unwrap();
        assert!(w.contains("--image old.elf has build-id aa"), "{w}");
        assert!(w.contains("/s/rt, build-id bb"), "{w}");
        assert_eq!(
            stale_warning(&given, Some("aa"), Path::new("/s/rt"), Some("aa")),
            None
        );
        let shipped = Located {
            origin: Origin::Shipped,
            ..given
        };
        assert_eq!(
            stale_warning(&shipped, Some("aa"), Path::new("/s/rt"), Some("bb")),
            None
        );
    }
}
