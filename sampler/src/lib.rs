//! Perch's sampling core: the perf_event sample model, the NMI-safe ring,
//! throttling, PEBS/LBR record decoding and the wire format shared by the
//! runtime and the host tool. Pure logic, tested on the host.
#![cfg_attr(not(any(test, feature = "std")), no_std)]
