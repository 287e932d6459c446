//! Structure-aware inputs of Perch's fuzz targets (`fuzz/fuzz_targets`):
//! the bytes libFuzzer mutates are read through `arbitrary` into stream
//! records, line damage, ELF programs, boot archives and manifests, so the
//! targets reach the code behind each parser's first checks. Builds on
//! stable: the `perf script` regression test over the saved `perf_data`
//! corpus (`tests/perf_script.rs`) runs these same generators.

pub mod damage;
pub mod elf;
pub mod newc;
pub mod perf;
pub mod wire;
