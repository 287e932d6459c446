//! The runtime image's function symbols in `/proc/kallsyms` form
//! (`ADDRESS t NAME`, sorted), for tools that resolve kernel addresses only
//! through a kallsyms file: hotspot (`hotspot --kallsyms FILE perf.data`,
//! `hotspot-perfparser --kallsyms FILE`) otherwise looks the runtime's
//! samples up in the analysing host's own `/proc/kallsyms` and shows `??`.

use object::{Object, ObjectSymbol, SymbolKind};

use crate::image::{Image, ImageError};

/// The kallsyms text of the runtime text of `image`, whose ELF bytes are
/// `elf`. Names are demangled without the Rust hash; a name with a space
/// in it (kallsyms fields are whitespace-separated) is given mangled, which
/// readers demangle themselves.
pub fn kallsyms(image: &Image, elf: &[u8]) -> Result<String, ImageError> {
    let file = object::File::parse(elf).map_err(|e| ImageError::NotElf {
        path: image.path.clone(),
        reason: e.to_string(),
    })?;
    let mut syms: Vec<(u64, String)> = file
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text)
        .filter(|s| s.address() >= image.kernel_start && s.address() < image.kernel_end)
        .filter_map(|s| {
            let raw = s.name().ok().filter(|n| !n.is_empty())?;
            let name = crate::symtab::demangle(raw);
            let name = if name.contains(char::is_whitespace) {
                raw.to_owned()
            } else {
                name
            };
            Some((s.address(), name))
        })
        .filter(|(_, n)| !n.contains(char::is_whitespace))
        .collect();
    syms.sort();
    syms.dedup();
    let mut out = String::with_capacity(syms.len() * 48);
    for (addr, name) in syms {
        out.push_str(&format!("{addr:016x} t {name}\n"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_text_symbols_come_sorted_in_kallsyms_form() {
        // A small ELF with two functions in a runtime text section.
        use object::write::{Object as W, Symbol, SymbolSection};
        use object::{Architecture, BinaryFormat, Endianness, SectionKind, SymbolFlags};
        let mut w = W::new(BinaryFormat::Elf, Architecture::X86_64, Endianness::Little);
        let text = w.add_section(vec![], b".text".to_vec(), SectionKind::Text);
        w.append_section_data(text, &[0xc3; 64], 16);
        for (name, value) in [
            ("_ZN13perch_runtime4exit17h74d19193b07549ebE", 32),
            ("_start", 0),
        ] {
            w.add_symbol(Symbol {
                name: name.as_bytes().to_vec(),
                value,
                size: 8,
                kind: SymbolKind::Text,
                scope: object::SymbolScope::Linkage,
                weak: false,
                section: SymbolSection::Section(text),
                flags: SymbolFlags::None,
            });
        }
        let elf = w.write().expect("an ELF");
        let image = Image {
            path: "runtime".into(),
            build_id: None,
            kernel_start: 0,
            kernel_end: 64,
            ref_symbol: ("_start".into(), 0),
            user_text: vec![],
            symbols: vec![],
            load_base: None,
        };
        let text = kallsyms(&image, &elf).expect("kallsyms");
        assert_eq!(
            text,
            "0000000000000000 t _start\n0000000000000020 t perch_runtime::exit\n"
        );
        // Outside the runtime text: left out.
        let narrow = Image {
            kernel_start: 16,
            ..image
        };
        assert_eq!(
            kallsyms(&narrow, &elf).expect("kallsyms"),
            "0000000000000020 t perch_runtime::exit\n"
        );
    }
}
