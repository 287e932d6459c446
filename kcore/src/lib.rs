//! The runtime's host-tested kernel core.
//!
//! Everything the runtime needs to run static Linux programs that does not
//! touch the CPU lives here, so it is tested on the host like `sampler`:
//! the runtime's command line, the boot archive and its manifest, the ELF loader's plan and the initial
//! process stack, and the Linux system-call personality (both ABIs' tables,
//! file descriptors, the in-memory file system, memory areas). The runtime
//! provides the hardware side (page tables, frames, clocks, the console)
//! through the traits in [`sys`].
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

pub mod archive;
pub mod cmdline;
pub mod elf;
pub mod initstack;
pub mod manifest;
pub mod sys;
