//! (tests: calls)
