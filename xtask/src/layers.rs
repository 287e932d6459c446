//! The runtime's layers, bottom to top, and the check that no module of
//! `runtime/src` imports one from a higher layer. The entry stubs reach the
//! top through the upcall symbols (`runtime/src/entry.rs`), which are not
//! imports; everything else must follow the table. `runtime/README.md`
//! draws the same layers.

use std::collections::BTreeMap;
use std::path::Path;

/// Each layer's top-level modules of `runtime/src`, lowest first.
pub const LAYERS: &[(&str, &[&str])] = &[
    ("base services", &["boot", "console", "symbols", "time"]),
    ("cpu", &["entry", "cpu"]),
    ("memory", &["mm", "fs", "net"]),
    ("cpus", &["smp"]),
    ("processes", &["proc"]),
    ("system calls", &["abi"]),
    ("sampling", &["sample"]),
    ("stream", &["stream"]),
    ("top", &["dispatch", "appliance", "selftest", "main"]),
];

/// The crate-root macros and items, by the module that defines them
/// (`#[macro_export]` puts a macro at the root wherever it is written;
/// `main.rs` items are the top layer's).
const ROOT_ITEMS: &[(&str, &str)] = &[
    ("kprintln", "console"),
    ("kprint", "console"),
    ("entry_upcalls", "entry"),
    ("abs_addr", "mm"),
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, mods)| mods.contains(&module))
}

/// One import that runs upwards: `file` (in module `from`) names `to`.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Violation {
    pub file: String,
    pub from: String,
    pub to: String,
}

/// Removes `//` comments (doc comments' intra-doc links name modules
/// without importing them) and string literals.
fn code_only(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    for line in src.lines() {
        let mut in_str = false;
        let mut prev = '\0';
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            if !in_str && c == '/' && chars.peek() == Some(&'/') {
                break;
            }
            if c == '"' && prev != '\\' {
                in_str = !in_str;
            } else if !in_str {
                out.push(c);
            }
            prev = c;
        }
        out.push('\n');
    }
    out
}

/// The crate-level names `src` refers to: `crate::x`, `$crate::x`, each
/// name of `crate::{x, y::z}`, and, in a top-level module's own file,
/// `super::x`.
fn referenced(src: &str, top_level_file: bool) -> Vec<String> {
    let code = code_only(src);
    let mut names = Vec::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut prefixes = vec!["crate::"];
    if top_level_file {
        prefixes.push("super::");
    }
    for prefix in prefixes {
        let mut rest = code.as_str();
        while let Some(i) = rest.find(prefix) {
            let before = rest[..i].chars().next_back();
            rest = &rest[i + prefix.len()..];
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                for item in group[..end].split(',') {
                    let name = ident(item.trim());
                    if !name.is_empty() {
                        names.push(name);
                    }
                }
            } else {
                let name = ident(rest);
                if !name.is_empty() {
                    names.push(name);
                }
            }
        }
    }
    names
}

/// Every upward import of the runtime at `root` (its `src` folder).
pub fn violations(src_dir: &Path) -> Result<Vec<Violation>, String> {
    let mut found = Vec::new();
    let mut files = BTreeMap::new();
    collect(src_dir, src_dir, &mut files)?;
    for (rel, text) in &files {
        let module = rel
            .split('/')
            .next()
            .unwrap_or_default()
            .trim_end_matches(".rs")
            .to_string();
        let Some(own) = layer_of(&module) else {
            return Err(format!(
                "runtime/src/{rel}: module `{module}` is in no layer of xtask/src/layers.rs"
            ));
        };
        let top_level_file = !rel.contains('/') || rel.ends_with("/mod.rs");
        for name in referenced(text, top_level_file && module != "main") {
            let target = ROOT_ITEMS
                .iter()
                .find(|(item, _)| *item == name)
                .map_or(name.as_str(), |(_, m)| m);
            // Names that are no module (root items such as `exit`) belong
            // to `main`, the top.
            let to_layer = layer_of(target).unwrap_or(LAYERS.len() - 1);
            if to_layer > own {
                found.push(Violation {
                    file: rel.clone(),
                    from: module.clone(),
                    to: name,
                });
            }
        }
    }
    found.sort();
    found.dedup();
    Ok(found)
}

fn collect(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.is_dir() {
            collect(root, &path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path
                .strip_prefix(root)
                .map_err(|e| e.to_string())?
                .to_string_lossy()
                .replace('\\', "/");
            let text =
                std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            out.insert(rel, text);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_runtime_module_imports_a_higher_layer() {
        let src = crate::project_root().join("runtime/src");
        let v = violations(&src).unwrap();
        assert!(
            v.is_empty(),
            "imports from a lower layer to a higher one (see xtask/src/layers.rs):\n{}",
            v.iter()
                .map(|v| format!("  runtime/src/{}: {} -> {}", v.file, v.from, v.to))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    #[test]
    fn the_check_finds_each_form_of_an_upward_import() {
        let dir = std::env::temp_dir().join(format!("perch-layers-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("proc")).unwrap();
        std::fs::write(
            dir.join("proc/mod.rs"),
            "use crate::{mm, stream::wire};\n\
             // crate::selftest in a comment is no import\n\
             fn f() { crate::sample::profile::start(); super::dispatch::run(); \
             let s = \"crate::appliance\"; }\n",
        )
        .unwrap();
        std::fs::write(dir.join("console.rs"), "fn g() { $crate::proc::x(); }\n").unwrap();
        let v = violations(&dir).unwrap();
        let pairs: Vec<(&str, &str)> = v.iter().map(|v| (v.from.as_str(), v.to.as_str())).collect();
        assert_eq!(
            pairs,
            [
                ("console", "proc"),
                ("proc", "dispatch"),
                ("proc", "sample"),
                ("proc", "stream"),
            ]
        );
        std::fs::write(dir.join("extra.rs"), "").unwrap();
        assert!(
            violations(&dir)
                .unwrap_err()
                .contains("`extra` is in no layer")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
