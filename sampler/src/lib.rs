//! Perch's sampling core: the perf_event sample model, the NMI-safe ring,
//! throttling, PEBS/LBR record decoding and the wire format shared by the
//! runtime and the host tool. Pure logic, tested on the host.
//!
//! # Map
//! - [`event`]: event configs (`perf_event_attr` subset), PMU capabilities,
//!   validation that refuses what Linux refuses.
//! - [`regs`]: the perf x86-64 register table, ABI values, the compat rule
//!   and the PEBS-to-perf GPR order.
//! - [`sample`]: the sample model, branch entries and memory fields.
//! - [`capture`]: the NMI-path API (interrupted frame -> [`sample::Sample`]
//!   per the `perf_sample_regs_user` rules) and the return-to-user mode.
//! - [`ring`]: the per-CPU lock-free ring with exact loss counts.
//! - [`throttle`]: perf's throttling and frequency mode, clock supplied by
//!   the caller.
//! - [`drain`]: what the NMI handler queues, and the drain step that turns
//!   losses into Lost records and records into frames.
//! - [`wire`]: the versioned stream (records, encoder, decoder); its docs
//!   give the measured bytes per sample.
//! - [`pebs`], [`lbr`]: PEBS record and LBR entry decoding.
//!
//! # NMI path, in order
//! 1. [`throttle::Throttle::on_overflow`] says whether to sample;
//! 2. [`ring::Ring::push_with`] claims a slot (or counts the loss when the
//!    ring is full) and [`capture::build_sample_into`] builds the sample in
//!    that slot's [`drain::NmiRecord`], writing only the fields in use, with
//!    the callchain walked straight in through [`capture::CallchainWriter`]
//!    ([`capture::build_sample`] and [`ring::Ring::push`] are the by-value
//!    forms, for tests and cold paths; [`capture::DeferredUserRegs::defer`]
//!    parks a sample in return-to-user mode);
//! 3. the slot is published when the fill returns;
//! 4. [`throttle::Throttle::sample_took`] with the handler's duration.
//!
//! The drain loop calls [`drain::drain_step`]; the host feeds the bytes to
//! [`wire::Decoder`].
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
