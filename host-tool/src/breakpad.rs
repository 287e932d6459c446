//! The runtime's functions as a Breakpad symbol file, for samply.
//!
//! samply names a kernel's frames from the file at the path of the
//! kernel's build-id entry in perf.data (`linux_shared/converter.rs`:
//! the build-id path replaces `[kernel.kallsyms]_text`), at addresses
//! relative to the start of the kernel MMAP. An ELF there is read relative
//! to its first PT_LOAD segment (`relative_address_base` of
//! samply-symbols), which for the runtime is the boot header at 1 MiB,
//! while samply's profile gives a kernel frame the low 32 bits of its
//! distance from the kernel MMAP's start (fxprof-processed-profile's
//! `LibMappings::convert_address`; perf.data maps the runtime from its
//! `.boot` code at 1 MiB up to the end of its text at -2 GiB, so the
//! runtime's functions land near 2 GiB). A Breakpad file (`MODULE ...`,
//! which samply-symbols reads wherever it finds one) states its addresses
//! itself, so the runtime's functions are written at those offsets, under
//! the debug id samply derives from the build-id.

use crate::image::Image;

/// The Breakpad debug id samply gives an ELF with GNU build-id `build_id`
/// on a little-endian machine: the first 16 bytes as a GUID (the first
/// three fields byte-swapped), uppercase, then age 0.
pub fn debug_id(build_id: &[u8]) -> String {
    let mut d = [0u8; 16];
    let n = build_id.len().min(16);
    d[..n].copy_from_slice(&build_id[..n]);
    d[0..4].reverse();
    d[4..6].reverse();
    d[6..8].reverse();
    let mut s: String = d.iter().map(|b| format!("{b:02X}")).collect();
    s.push('0');
    s
}

/// Where samply puts a kernel frame at `addr` when perf.data maps the kernel
/// from `kernel_start`: the low 32 bits of the distance.
pub fn offset(addr: u64, kernel_start: u64) -> u32 {
    addr.wrapping_sub(kernel_start) as u32
}

/// The Breakpad text of the runtime's code symbols in `elf` (the bytes of
/// `image`): functions and the labels of assembly code (perf names samples
/// by both), those inside `kernel_start..kernel_end` (the kernel MMAP of
/// perf.data), at their [`offset`], sorted, Rust names demangled without
/// their hash; a symbol of unknown size ends at the next one, or 1 MiB on.
/// `None` when the image has no build-id or `elf` does not parse.
pub fn symbol_file(image: &Image, elf: &[u8]) -> Option<String> {
    use object::{Object, ObjectSection, ObjectSymbol, SectionKind, SymbolKind};
    let id = image.build_id.as_deref().filter(|id| !id.is_empty())?;
    let file = object::File::parse(elf).ok()?;
    let mut syms: Vec<(u64, u64, String)> = file
        .symbols()
        .filter(|s| {
            matches!(
                s.kind(),
                SymbolKind::Text | SymbolKind::Label | SymbolKind::Unknown
            )
        })
        .filter(|s| s.address() >= image.kernel_start && s.address() < image.kernel_end)
        .filter(|s| {
            s.section_index()
                .and_then(|i| file.section_by_index(i).ok())
                .is_some_and(|sec| sec.kind() == SectionKind::Text)
        })
        .filter_map(|s| {
            let raw = s.name().ok().filter(|n| !n.is_empty())?;
            Some((s.address(), s.size(), crate::symtab::demangle(raw)))
        })
        .collect();
    // At one address, the symbol with a size first, then by name.
    syms.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
    syms.dedup_by_key(|s| s.0);
    let name = image
        .path
        .file_name()
        .map_or_else(|| "perch-runtime".into(), |n| n.to_string_lossy());
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let mut out = format!(
        "MODULE Linux x86_64 {} {name}\nINFO CODE_ID {hex}\n",
        debug_id(id)
    );
    let mut funcs: Vec<(u32, u32, String)> = Vec::with_capacity(syms.len());
    for (i, (addr, size, name)) in syms.iter().enumerate() {
        let next = syms.get(i + 1).map_or(image.kernel_end, |n| n.0);
        let size = if *size > 0 {
            *size
        } else {
            (next - addr).min(1 << 20)
        };
        let offset = offset(*addr, image.kernel_start);
        let size = size.min(u64::from(u32::MAX - offset)) as u32;
        // Breakpad names run to the end of the line.
        funcs.push((offset, size, name.replace(['\n', '\r'], " ")));
    }
    funcs.sort();
    for (offset, size, name) in funcs {
        out.push_str(&format!("FUNC {offset:x} {size:x} 0 {name}\n"));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_debug_id_is_the_build_id_as_a_little_endian_guid() {
        let id: Vec<u8> = (1..=20).collect();
        assert_eq!(debug_id(&id), "0403020106050807090A0B0C0D0E0F100");
        assert_eq!(debug_id(&[0xab]), "000000AB0000000000000000000000000");
    }

    #[test]
    fn code_symbols_are_written_at_their_offset_from_the_kernel_mmap() {
        // A small ELF: a function, an assembly label and a Rust function in
        // a text section, and a data object, which is left out.
        use object::write::{Object as W, Symbol, SymbolSection};
        use object::{
            Architecture, BinaryFormat, Endianness, SectionKind, SymbolFlags, SymbolKind,
        };
        let mut w = W::new(BinaryFormat::Elf, Architecture::X86_64, Endianness::Little);
        let text = w.add_section(vec![], b".text".to_vec(), SectionKind::Text);
        w.append_section_data(text, &[0xc3; 0x100], 16);
        let data = w.add_section(vec![], b".data".to_vec(), SectionKind::Data);
        w.append_section_data(data, &[0; 16], 16);
        for (name, value, size, kind, section) in [
            ("memcpy", 0x10, 0x20, SymbolKind::Text, text),
            ("perch_isr_table", 0x30, 0, SymbolKind::Label, text),
            (
                "_ZN13perch_runtime4time12random_bytes17hbf77ac307520aa6fE",
                0x80,
                0x40,
                SymbolKind::Text,
                text,
            ),
            ("a_table", 0, 8, SymbolKind::Data, data),
        ] {
            w.add_symbol(Symbol {
                name: name.as_bytes().to_vec(),
                value,
                size,
                kind,
                scope: object::SymbolScope::Linkage,
                weak: false,
                section: SymbolSection::Section(section),
                flags: SymbolFlags::None,
            });
        }
        let elf = w.write().expect("an ELF");
        let image = Image {
            path: "/x/perch-runtime".into(),
            build_id: Some(vec![0x11; 20]),
            kernel_start: 0x10,
            kernel_end: 0x100,
            ref_symbol: ("memcpy".into(), 0x10),
            user_text: Vec::new(),
            symbols: Vec::new(),
            load_base: None,
        };
        assert_eq!(
            symbol_file(&image, &elf).unwrap(),
            "MODULE Linux x86_64 111111111111111111111111111111110 perch-runtime\n".to_owned()
                + "INFO CODE_ID 1111111111111111111111111111111111111111\n"
                + "FUNC 0 20 0 memcpy\n"
                // A label reaches to the next symbol.
                + "FUNC 20 50 0 perch_isr_table\n"
                + "FUNC 70 40 0 perch_runtime::time::random_bytes\n"
        );
        let none = Image {
            build_id: None,
            ..image.clone()
        };
        assert_eq!(symbol_file(&none, &elf), None);
        assert_eq!(symbol_file(&image, b"not an ELF"), None);
    }

    #[test]
    fn offsets_are_the_low_32_bits_of_the_distance_from_the_mmap() {
        // perch's kernel MMAP starts at the `.boot` code just above 1 MiB
        // and reaches the runtime text at -2 GiB.
        assert_eq!(offset(0x10_0030, 0x10_0030), 0);
        assert_eq!(offset(0xffff_ffff_8012_bdb0, 0x10_0030), 0x8002_bd80);
    }
}
