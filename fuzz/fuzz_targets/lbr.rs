//! The LBR decoders (`sampler::lbr`): raw FROM/TO/INFO triples of every
//! legacy format, architectural LBR and AMD LbrExtV2 (any VA width). Never
//! panics; every decoded entry's flags survive perf's packing (cycles and
//! a 4-bit type); `to_stack` and `decode_stack` agree, keep the entries'
//! order and stop at their bounds; a call-stack callchain is the IP then
//! the call sites.

#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use sampler::lbr::{
    self, BranchEntry, BranchFlags, LbrFormat, MAX_BRANCHES, RawBranch, callchain_from_call_stack,
};

#[derive(Debug, Arbitrary)]
struct Input {
    format: u8,
    legacy: u8,
    va_bits: u8,
    raw: Vec<(u64, u64, u64)>,
    out_len: u8,
    ip: u64,
}

fuzz_target!(|input: Input| {
    let format = match input.format % 3 {
        0 => LbrFormat::Legacy(input.legacy % 10),
        1 => LbrFormat::Arch,
        _ => LbrFormat::AmdV2 {
            va_bits: input.va_bits,
        },
    };
    let raw: Vec<RawBranch> = input
        .raw
        .iter()
        .take(64)
        .map(|&(from, to, info)| RawBranch { from, to, info })
        .collect();
    let decoded: Vec<BranchEntry> = raw.iter().filter_map(|r| lbr::decode(format, r)).collect();
    for e in &decoded {
        assert!(e.flags.kind <= 0xf);
        assert_eq!(BranchFlags::from_perf(e.flags.to_perf()), e.flags);
    }
    let stack = lbr::to_stack(format, &raw);
    let n = decoded.len().min(MAX_BRANCHES);
    assert_eq!(&stack.entries[..], &decoded[..n]);

    let mut out = vec![BranchEntry::default(); usize::from(input.out_len % 40)];
    let written = lbr::decode_stack(format, &raw, &mut out);
    assert_eq!(written, decoded.len().min(out.len()));
    assert_eq!(&out[..written], &decoded[..written]);

    let mut chain = vec![0u64; usize::from(input.out_len % 70)];
    let k = callchain_from_call_stack(input.ip, &stack.entries, &mut chain);
    if chain.is_empty() {
        assert_eq!(k, 0);
    } else {
        assert_eq!(k, (1 + stack.entries.len()).min(chain.len()));
        assert_eq!(chain[0], input.ip);
        for (c, e) in chain[1..k].iter().zip(&stack.entries) {
            assert_eq!(*c, e.from);
        }
    }
});
