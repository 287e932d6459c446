//! Criterion benchmarks of the sampler: sample build + encode, decode, ring
//! push/pop, and a table of wire bytes vs perf.data bytes per sample.

use criterion::{Criterion, criterion_group, criterion_main};

fn benches(_c: &mut Criterion) {}

criterion_group!(all, benches);
criterion_main!(all);
