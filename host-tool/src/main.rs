//! `perch`: the host side of Perch.
fn main() {}
