//! Function symbol tables and load maps, the one place the host looks a
//! function up by address in an ELF's symbol table: the runtime image's
//! ([`crate::image::Image`]), each program's own for `perch top`
//! ([`SymbolTable`], read from the program's host file, 64-bit or i386, with
//! the file's load map so that an address in a loaded segment resolves
//! whatever base the runtime loaded the program at), and the load maps the
//! DWARF symbolizer ([`crate::symbolize`]) translates offsets with.

use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};

use crate::image::{Image, Symbol};

/// The function (text) symbols of `file` with a non-empty name, named by
/// `name` from the raw (mangled) name, sorted by address; of several at one
/// address the largest is kept.
pub fn function_symbols<'d>(file: &object::File<'d>, name: impl Fn(&str) -> String) -> Vec<Symbol> {
    let mut symbols: Vec<Symbol> = file
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text)
        .filter_map(|s| {
            let raw = s.name().ok().filter(|n| !n.is_empty())?;
            Some(Symbol {
                addr: s.address(),
                size: s.size(),
                name: name(raw),
            })
        })
        .collect();
    symbols.sort_by(|a, b| a.addr.cmp(&b.addr).then(b.size.cmp(&a.size)));
    symbols.dedup_by_key(|s| s.addr);
    symbols
}

/// The index in `symbols` (sorted by address) of the function containing
/// `addr`. A size of 0 reaches to the next symbol.
pub fn containing(symbols: &[Symbol], addr: u64) -> Option<usize> {
    let i = symbols.partition_point(|s| s.addr <= addr).checked_sub(1)?;
    let s = &symbols[i];
    // `addr >= s.addr` here; a symbol may claim to reach past the end of
    // the address space.
    (s.size == 0 || addr - s.addr < s.size).then_some(i)
}

/// A symbol name demangled (Rust legacy and v0) without the hash suffix,
/// as perf prints it; other names as they are.
pub fn demangle(raw: &str) -> String {
    format!("{:#}", rustc_demangle::demangle(raw))
}

/// An ELF's loaded segments that hold file bytes, to translate between
/// file offsets (an MMAP's pgoff) and link-time addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadMap {
    /// (file offset, size in the file, address), segments with file bytes only.
    segments: Vec<(u64, u64, u64)>,
}

impl LoadMap {
    /// The segments of `file`.
    pub fn of_file(file: &object::File<'_>) -> LoadMap {
        LoadMap::new(file.segments().map(|s| {
            let (off, size) = s.file_range();
            (off, size, s.address())
        }))
    }

    /// A map of `(file offset, size in the file, address)` segments; those
    /// with no file bytes are left out.
    pub fn new(segments: impl IntoIterator<Item = (u64, u64, u64)>) -> LoadMap {
        LoadMap {
            segments: segments.into_iter().filter(|s| s.1 > 0).collect(),
        }
    }

    /// The link-time address of the byte at file offset `offset`.
    pub fn vaddr_of_offset(&self, offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|&&(off, size, _)| offset >= off && offset - off < size)
            .and_then(|&(off, _, addr)| addr.checked_add(offset - off))
    }

    /// The file offset of link-time address `vaddr`.
    pub fn offset_of_vaddr(&self, vaddr: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|&&(_, size, v)| vaddr >= v && vaddr - v < size)
            .and_then(|&(off, _, v)| off.checked_add(vaddr - v))
    }
}

/// A sorted function symbol table and the load map of its file.
#[derive(Clone, Debug, Default)]
pub struct SymbolTable {
    /// Function symbols sorted by address.
    symbols: Vec<Symbol>,
    /// The file's loaded segments.
    loads: LoadMap,
    /// The file's GNU build-id, when it has one.
    build_id: Option<Vec<u8>>,
}

impl SymbolTable {
    /// The runtime image's symbols (addresses as loaded: the runtime is not
    /// relocated).
    pub fn of_image(image: &Image) -> SymbolTable {
        SymbolTable {
            symbols: image
                .symbols
                .iter()
                .map(|s| Symbol {
                    name: without_hash(&s.name),
                    ..s.clone()
                })
                .collect(),
            loads: LoadMap::default(),
            build_id: image.build_id.clone(),
        }
    }

    /// Parses a program file (ELF, 64- or 32-bit). An ELF without a
    /// symbol table gives an empty table, not an error: its samples are
    /// shown by address.
    pub fn parse(data: &[u8]) -> Result<SymbolTable, String> {
        let file = object::File::parse(data).map_err(|e| e.to_string())?;
        if file.format() != object::BinaryFormat::Elf {
            return Err(format!("a {:?} file, not ELF", file.format()));
        }
        Ok(SymbolTable {
            // Without the legacy hash suffix, as perf shows them.
            symbols: function_symbols(&file, demangle),
            loads: LoadMap::of_file(&file),
            build_id: file.build_id().ok().flatten().map(<[u8]>::to_vec),
        })
    }

    /// The file's GNU build-id.
    pub fn build_id(&self) -> Option<&[u8]> {
        self.build_id.as_deref()
    }

    /// The number of symbols.
    pub fn len(&self) -> usize {
        self.symbols.len()
    }

    /// Whether the table holds no symbol.
    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }

    /// The name of symbol `i` (an index [`lookup`](Self::lookup) returned).
    pub fn name(&self, i: usize) -> Option<&str> {
        self.symbols.get(i).map(|s| s.name.as_str())
    }

    /// The index of the function containing address `addr`, if any.
    pub fn lookup(&self, addr: u64) -> Option<usize> {
        containing(&self.symbols, addr)
    }

    /// The file address of the byte at file offset `offset`, through the
    /// load map.
    pub fn address_of_offset(&self, offset: u64) -> Option<u64> {
        self.loads.vaddr_of_offset(offset)
    }
}

/// A demangled Rust name without its hashes, as perf shows it: the legacy
/// suffix (`::h` and 16 hex digits) and v0's crate disambiguators
/// (`core[bb170dea1013a3a3]::str` becomes `core::str`).
pub fn without_hash(name: &str) -> String {
    let name = match name.rsplit_once("::h") {
        Some((head, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            head
        }
        _ => name,
    };
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        match after.find(']') {
            Some(close)
                if close > 0
                    && after[..close].bytes().all(|b| b.is_ascii_hexdigit())
                    && rest[..open]
                        .chars()
                        .next_back()
                        .is_some_and(|c| c.is_alphanumeric() || c == '_') =>
            {
                out.push_str(&rest[..open]);
                rest = &after[close + 1..];
            }
            _ => {
                out.push_str(&rest[..=open]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::write::{Object as WObject, StandardSegment, Symbol as WSymbol, SymbolSection};
    use object::{Architecture, BinaryFormat, Endianness, SectionKind, SymbolFlags, SymbolScope};

    /// A relocatable ELF with functions `f` at 0x10 (size 0x10) and `g`
    /// at 0x40 (size 0x8) in `.text`.
    fn elf(arch: Architecture) -> Vec<u8> {
        let mut o = WObject::new(BinaryFormat::Elf, arch, Endianness::Little);
        let seg = o.segment_name(StandardSegment::Text).to_vec();
        let text = o.add_section(seg, b".text".to_vec(), SectionKind::Text);
        o.append_section_data(text, &[0x90; 0x80], 16);
        for (name, addr, size) in [
            ("f", 0x10, 0x10),
            ("_ZN4demo1g17h0123456789abcdefE", 0x40, 8),
        ] {
            o.add_symbol(WSymbol {
                name: name.as_bytes().to_vec(),
                value: addr,
                size,
                kind: SymbolKind::Text,
                scope: SymbolScope::Linkage,
                weak: false,
                section: SymbolSection::Section(text),
                flags: SymbolFlags::None,
            });
        }
        o.write().expect("writing a test ELF")
    }

    #[test]
    fn functions_resolve_by_address_with_their_sizes_and_demangled_names() {
        for arch in [Architecture::X86_64, Architecture::I386] {
            let t = SymbolTable::parse(&elf(arch)).expect("parses");
            assert_eq!(t.len(), 2, "{arch:?}");
            let name = |a| t.lookup(a).and_then(|i| t.name(i));
            assert_eq!(name(0x10), Some("f"));
            assert_eq!(name(0x1f), Some("f"));
            assert_eq!(name(0x20), None, "past f's size");
            assert_eq!(name(0x0f), None, "before every symbol");
            assert_eq!(name(0x47), Some("demo::g"));
            assert_eq!(name(0x48), None);
        }
    }

    #[test]
    fn a_symbol_of_unknown_size_reaches_to_the_next_and_lookups_do_not_overflow() {
        let sym = |addr, size, name: &str| Symbol {
            addr,
            size,
            name: name.into(),
        };
        let syms = [
            sym(0x10, 0, "open"),
            sym(0x40, 4, "g"),
            sym(u64::MAX - 1, u64::MAX, "huge"),
        ];
        assert_eq!(containing(&syms, 0x3f), Some(0), "up to the next symbol");
        assert_eq!(containing(&syms, 0x43), Some(1));
        assert_eq!(containing(&syms, 0x44), None);
        assert_eq!(
            containing(&syms, u64::MAX),
            Some(2),
            "no overflow at the top"
        );
        assert_eq!(containing(&[], 0x10), None);
        let t = SymbolTable::parse(&elf(Architecture::X86_64)).expect("parses");
        assert_eq!(t.lookup(0x10).and_then(|i| t.name(i)), Some("f"));
    }

    #[test]
    fn legacy_hashes_are_dropped_and_other_names_kept() {
        assert_eq!(without_hash("demo::g::h0123456789abcdef"), "demo::g");
        assert_eq!(without_hash("demo::g::h0123"), "demo::g::h0123");
        assert_eq!(
            without_hash("demo::g::hxyz3456789abcdef"),
            "demo::g::hxyz3456789abcdef"
        );
        assert_eq!(without_hash("plain_c_name"), "plain_c_name");
        assert_eq!(
            without_hash("core[bb170dea1013a3a3]::str::converts::from_utf8"),
            "core::str::converts::from_utf8"
        );
        assert_eq!(
            without_hash("<alloc[1a2b]::vec::Vec<u8> as core[3c4d]::clone::Clone>::clone"),
            "<alloc::vec::Vec<u8> as core::clone::Clone>::clone"
        );
        // Slices and arrays are not hashes.
        assert_eq!(without_hash("<[u8] as x>::f"), "<[u8] as x>::f");
        assert_eq!(without_hash("[u8; 4]::f"), "[u8; 4]::f");
        assert_eq!(without_hash("a[]b[12"), "a[]b[12");
    }

    #[test]
    fn garbage_is_an_error_and_offsets_outside_the_load_map_have_no_address() {
        assert!(SymbolTable::parse(b"not an elf at all").is_err());
        assert!(SymbolTable::parse(&[]).is_err());
        let t = SymbolTable {
            loads: LoadMap::new([(0x1000, 0x200, 0x40_1000), (0x1200, 0, 0x50_0000)]),
            ..Default::default()
        };
        assert_eq!(t.address_of_offset(0x1010), Some(0x40_1010));
        assert_eq!(
            t.address_of_offset(0x1200),
            None,
            "a segment of no file bytes"
        );
        assert_eq!(t.address_of_offset(0xfff), None);
        assert_eq!(t.loads.offset_of_vaddr(0x40_11ff), Some(0x11ff));
        assert_eq!(t.loads.offset_of_vaddr(0x40_1200), None);
        assert_eq!(t.loads.offset_of_vaddr(0x50_0000), None);
    }
}
