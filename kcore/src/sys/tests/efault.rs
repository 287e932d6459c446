//! (tests: efault)
