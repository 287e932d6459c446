//! Throttling and frequency mode, after perf: a per-tick interrupt limit, a
//! moving-average CPU-time budget, and period adjustment toward a target
//! rate. Driven by a caller-supplied clock, so it is tested with a simulated
//! one.

/// `perf_event_max_sample_rate` default.
pub const DEFAULT_MAX_SAMPLE_RATE: u64 = 100_000;
