//! Sampling: the overflow sources (the NMI clock, the PMU drivers' set-up
//! and PMI glue, the simulated PMU), the NMI handler glue, and the NMI
//! sample path (user-register rules, callchains, throttling) into the ring.

pub mod clock;
pub mod nmi;
pub mod pmu;
pub mod profile;
