//! The host side of Perch as a library: the perf.data writer, the image
//! reader, the stream model, the conversions the `perch` binary drives, and
//! the appliance packer (boot archive and manifest).
#![forbid(unsafe_code)]

pub mod archive;
pub mod breakpad;
pub mod buildid_cache;
pub mod convert;
pub mod error;
pub mod flamegraph;
pub mod image;
pub mod input;
pub mod iso;
pub mod kallsyms;
pub mod manifest;
pub mod model;
pub mod output;
pub mod perf_abi;
pub mod perf_data;
pub mod pprof;
pub mod procs;
pub mod qemu;
pub mod ready;
pub mod record_opts;
pub mod runtime;
pub mod symbolize;
pub mod symtab;
pub mod synth;
pub mod top;
pub mod wire;
