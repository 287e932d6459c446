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
//! - [`capture`]: the NMI-path record ([`capture::RawSample`]) and its
//!   expansion into a [`sample::Sample`] per the `perf_sample_regs_user`
//!   rules, and the return-to-user mode.
//! - [`ring`]: the per-CPU lock-free ring with exact loss counts.
//! - [`throttle`]: perf's throttling and frequency mode, clock supplied by
//!   the caller.
//! - [`drain`]: what the NMI handler queues, and the drain step that turns
//!   losses into Lost records and expands records into frames.
//! - [`wire`]: the versioned stream (records, encoder, decoder); its docs
//!   give the measured bytes per sample.
//! - [`pebs`], [`lbr`]: PEBS record and LBR entry decoding.
//!
//! # NMI path, in order
//! 1. [`throttle::Throttle::on_overflow`] says whether to sample;
//! 2. [`ring::Ring::push_with`] claims a slot (or counts the loss when the
//!    ring is full) and the handler fills that slot's
//!    [`capture::RawSample`] in place: header words, the register frames the
//!    event needs copied as the entry stub saved them
//!    ([`capture::RawFrame`]), the walked IPs, and [`capture::raw_flags`]
//!    saying what they are. It decides nothing else: no masks, no perf
//!    order, no ABI, no markers. A ring made with
//!    [`ring::Ring::new_filled`] never initialises a slot on this path;
//! 3. the slot is published when the fill returns;
//! 4. [`throttle::Throttle::sample_took`] with the handler's duration.
//!
//! The drain loop calls [`drain::drain_step`], which expands each record
//! into the wire [`sample::Sample`] with [`capture::RawSample::expand_into`]
//! (every `perf_sample_regs_user` rule, masks, compat R8-R15, callchain
//! markers and depth live there) and encodes it; the host feeds the bytes
//! to [`wire::Decoder`]. [`capture::capture`] and [`capture::build_sample`]
//! are the same two steps by value, for tests and cold paths;
//! [`capture::DeferredUserRegs::park_with`] parks a sample in return-to-user
//! mode.
//!
//! `unsafe` is denied everywhere except in [`ring`], whose every block is
//! justified in place.
#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod bytering;
pub mod capture;
pub mod drain;
pub mod event;
pub mod lbr;
pub mod pebs;
pub mod regs;
pub mod ring;
pub mod sample;
pub mod throttle;
pub mod walk;
pub mod wire;
