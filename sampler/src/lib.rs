//! Perch's sampling core: the perf_event sample model, the NMI-safe ring,
//! throttling, PEBS/LBR record decoding and the wire format shared by the
//! runtime and the host tool. Pure logic, tested on the host.
//!
//! `unsafe` is denied everywhere except in [`ring`], whose every block is
//! justified in place.
#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod capture;
pub mod drain;
pub mod event;
pub mod lbr;
pub mod pebs;
pub mod regs;
pub mod ring;
pub mod sample;
pub mod throttle;
pub mod wire;
