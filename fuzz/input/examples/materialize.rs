//! Writes the bytes a fuzz input stands for, to turn a crash into a plain
//! test of the crate that owns the code:
//! `cargo run -p perch-fuzz-input --example materialize -- TARGET INPUT OUT`
//! (`image`, `elf_plan`, `archive`: the file; `perf_data`: the perf.data
//! written; `wire_roundtrip`-style streams are not covered).

use arbitrary::{Arbitrary, Unstructured};
use perch_fuzz_input::elf::{ElfSpec, ImageInput};
use perch_fuzz_input::newc::ArchiveSpec;
use perch_fuzz_input::perf::Case;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, target, input, out] = &args[..] else {
        eprintln!("usage: materialize TARGET INPUT OUT");
        std::process::exit(2);
    };
    let data = std::fs::read(input).expect("reading the input");
    let mut u = Unstructured::new(&data);
    let bytes = match target.as_str() {
        "image" => ImageInput::arbitrary_take_rest(u)
            .expect("an image input")
            .bytes(),
        "elf_plan" => ElfSpec::arbitrary_take_rest(u)
            .expect("an ELF input")
            .build(),
        "archive" => ArchiveSpec::arbitrary_take_rest(u)
            .expect("an archive input")
            .build(),
        "perf_data" => {
            let case = Case::from_input(&mut u).expect("a perf_data input");
            eprintln!("{case:#?}");
            case.convert().expect("the case converts").0
        }
        _ => {
            eprintln!("no materializer for `{target}`");
            std::process::exit(2);
        }
    };
    std::fs::write(out, bytes).expect("writing the output");
}
