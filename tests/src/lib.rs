//! QEMU and end-to-end tests for Perch live in `tests/tests/`.
