//! (tests: startup)
