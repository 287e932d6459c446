//! The runtime image reader (`host_tool::image::Image::parse`): the test
//! appliance ELF with header and table fields overwritten, or arbitrary
//! bytes. Never panics; an image it accepts has a non-empty runtime text
//! range, sorted symbols and a reference symbol, and looking addresses up
//! in it never panics.

#![no_main]

use host_tool::image::Image;
use libfuzzer_sys::fuzz_target;
use perch_fuzz_input::elf::ImageInput;

fuzz_target!(|input: ImageInput| {
    let bytes = input.bytes();
    let ips = input.probes();
    let Ok(image) = Image::parse(&bytes, "/fuzz/image.elf".into()) else {
        return;
    };
    assert!(image.kernel_start < image.kernel_end);
    assert!(image.symbols.is_sorted_by_key(|s| s.addr));
    let _ = image.build_id_hex();
    let probes = [
        image.kernel_start,
        image.kernel_end,
        image.ref_symbol.1,
        u64::MAX,
        0,
    ];
    for ip in probes.into_iter().chain(ips.iter().copied().take(16)) {
        let _ = image.is_user_ip(ip);
        if let Some(name) = image.symbolize(ip) {
            assert!(image.symbols.iter().any(|s| s.name == name));
        }
    }
    for s in image.symbols.iter().take(64) {
        let _ = image.symbolize(s.addr);
        let _ = image.is_user_ip(s.addr);
    }
});
