//! (tests: fuzz)
