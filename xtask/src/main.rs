//! Build, run, image, self-test, bench and hwcheck commands for Perch.
fn main() {}
