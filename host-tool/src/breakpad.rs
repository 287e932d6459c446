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

/// `name` without the `::h<16 hex digits>` hash rustc_demangle leaves at
/// the end of a legacy Rust symbol (perf's `--demangle-kernel` drops it too).
fn without_hash(name: &str) -> &str {
    match name.rfind("::h") {
        Some(i) if name.len() == i + 19 && name[i + 3..].bytes().all(|b| b.is_ascii_hexdigit()) => {
            &name[..i]
        }
        _ => name,
    }
}

/// The Breakpad text of `image`'s runtime functions (those inside
/// `kernel_start..kernel_end`, the kernel MMAP of perf.data) at the low
/// 32 bits of their distance from `kernel_start`, sorted; a function of
/// unknown size ends at the next one, or 1 MiB on. `None` when the image
/// has no build-id.
pub fn symbol_file(image: &Image) -> Option<String> {
    let id = image.build_id.as_deref().filter(|id| !id.is_empty())?;
    let name = image
        .path
        .file_name()
        .map_or_else(|| "perch-runtime".into(), |n| n.to_string_lossy());
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let mut out = format!(
        "MODULE Linux x86_64 {} {name}\nINFO CODE_ID {hex}\n",
        debug_id(id)
    );
    let syms: Vec<_> = image
        .symbols
        .iter()
        .filter(|s| s.addr >= image.kernel_start && s.addr < image.kernel_end)
        .filter(|s| !s.name.is_empty())
        .collect();
    let mut funcs: Vec<(u32, u32, String)> = Vec::with_capacity(syms.len());
    for (i, s) in syms.iter().enumerate() {
        let next = syms
            .get(i + 1)
            .map_or(image.kernel_end, |n| n.addr)
            .max(s.addr);
        let size = if s.size > 0 {
            s.size
        } else {
            (next - s.addr).min(1 << 20)
        };
        let offset = (s.addr - image.kernel_start) as u32;
        let size = size.min(u64::from(u32::MAX - offset)) as u32;
        // Breakpad names run to the end of the line.
        let name = without_hash(&s.name).replace(['\n', '\r'], " ");
        funcs.push((offset, size, name));
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
    use crate::image::Symbol;

    #[test]
    fn the_debug_id_is_the_build_id_as_a_little_endian_guid() {
        let id: Vec<u8> = (1..=20).collect();
        assert_eq!(debug_id(&id), "0403020106050807090A0B0C0D0E0F100");
        assert_eq!(debug_id(&[0xab]), "000000AB0000000000000000000000000");
    }

    #[test]
    fn functions_are_written_at_their_offset_from_the_kernel_mmap_in_32_bits() {
        let image = Image {
            path: "/x/perch-runtime".into(),
            build_id: Some(vec![0x11; 20]),
            kernel_start: 0x10_0030,
            kernel_end: 0xffff_ffff_8010_2000,
            ref_symbol: ("_text".into(), 0xffff_ffff_8010_1000),
            user_text: Vec::new(),
            symbols: vec![
                Symbol {
                    addr: 0x40_0000,
                    size: 8,
                    name: "user_side".into(),
                },
                Symbol {
                    addr: 0x10_0030,
                    size: 0,
                    name: "boot".into(),
                },
                Symbol {
                    addr: 0xffff_ffff_8010_1000,
                    size: 0x20,
                    name: "memcpy".into(),
                },
                Symbol {
                    addr: 0xffff_ffff_8010_1100,
                    size: 0,
                    name: "perch_runtime::time::random_bytes::hbf77ac307520aa6f".into(),
                },
            ],
            load_base: None,
        };
        let text = symbol_file(&image).unwrap();
        assert_eq!(
            text,
            "MODULE Linux x86_64 111111111111111111111111111111110 perch-runtime\n".to_owned()
                + "INFO CODE_ID 1111111111111111111111111111111111111111\n"
                + "FUNC 0 100000 0 boot\n"
                // The image's own tasks lie inside the kernel MMAP too, and
                // samply looks a frame up in the kernel's libraries first.
                + "FUNC 2fffd0 8 0 user_side\n"
                + "FUNC 80000fd0 20 0 memcpy\n"
                + "FUNC 800010d0 f00 0 perch_runtime::time::random_bytes\n"
        );
        let none = Image {
            build_id: None,
            ..image
        };
        assert_eq!(symbol_file(&none), None);
        assert_eq!(without_hash("a::b::h0123456789abcdef"), "a::b");
        assert_eq!(without_hash("a::b::h0123"), "a::b::h0123");
        assert_eq!(
            without_hash("a::hello_world_1234567"),
            "a::hello_world_1234567"
        );
    }
}
