//! Passes the linker script (and defmt's) when building for the bare-metal target.
fn main() {
    let target = std::env::var("TARGET").unwrap_or_default();
    if target == "x86_64-unknown-none" {
        let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
        let script = std::path::Path::new(&dir).join("../linker/runtime.ld");
        let script = script.canonicalize().unwrap_or(script);
        println!("cargo:rustc-link-arg-bins=-T{}", script.display());
        println!("cargo:rustc-link-arg-bins=-Tdefmt.x");
        // A GNU build-id, read by the runtime (Hello) and checked by `perch`.
        println!("cargo:rustc-link-arg-bins=--build-id=sha1");
        println!("cargo:rerun-if-changed={}", script.display());
    }
    println!("cargo:rerun-if-changed=build.rs");
}
