//! The PEBS record decoder (`sampler::pebs`): records of every format, the
//! adaptive ones with a header whose group bits and size field the input
//! sets (so that the groups are reached and not only the size check), and
//! the trap-like IP fix-up over arbitrary code bytes. Never panics; a
//! decoded record stays inside the bytes given (its size, its LBR entries
//! and XMM group), and the fix-up only returns the branch source or an IP
//! between the branch target and the record's IP.

#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use sampler::lbr::RawBranch;
use sampler::pebs::{
    self, DataSource, DecodeConfig, MemKind, PebsFormat, adaptive_lbr_entries, adaptive_record_size,
};

#[derive(Debug, Arbitrary)]
struct Input {
    format: u8,
    mem: u8,
    split_latency: bool,
    data_source: u8,
    pebs_trap: bool,
    /// Adaptive: the groups of the header (low 32 bits), and whether the
    /// size field is made to match them.
    groups: u32,
    size_matches: bool,
    /// Bytes dropped from the end.
    short: u8,
    bytes: Vec<u8>,
    /// The fix-up: LBR entry 0, bitness, code bytes, the user/kernel split.
    lbr0: (u64, u64),
    ip_delta: u16,
    bits32: bool,
    code: Vec<u8>,
}

fuzz_target!(|input: Input| {
    let Ok(format) = PebsFormat::from_number(input.format % 8) else {
        return;
    };
    let cfg = DecodeConfig {
        format,
        mem: [
            MemKind::None,
            MemKind::Load,
            MemKind::Store,
            MemKind::StoreDatala,
            MemKind::StoreLatency,
        ][usize::from(input.mem % 5)],
        split_latency: input.split_latency,
        data_source: [
            DataSource::Snb,
            DataSource::Nhm,
            DataSource::Wsm,
            DataSource::Skl { pmem: false },
            DataSource::Skl { pmem: true },
            DataSource::Grt,
        ][usize::from(input.data_source % 6)],
        pebs_trap: input.pebs_trap,
    };
    let mut bytes = input.bytes;
    if let PebsFormat::Adaptive(_) = format {
        let groups = u64::from(input.groups) & 0xff00_000f;
        let size = adaptive_record_size(groups);
        if bytes.len() < size {
            bytes.resize(size, 0xa5);
        }
        let found = if input.size_matches {
            size as u64
        } else {
            u64::from(input.groups >> 8) & 0xffff
        };
        let retire = bytes
            .get(4..6)
            .map_or(0, |b| u64::from(u16::from_le_bytes([b[0], b[1]])));
        let header = groups | retire << 32 | found << 48;
        if bytes.len() >= 8 {
            bytes[..8].copy_from_slice(&header.to_le_bytes());
        }
        assert!(adaptive_lbr_entries(groups) <= 256);
    } else if let Some(size) = format.fixed_size()
        && bytes.len() < size
        && input.size_matches
    {
        bytes.resize(size, 0x5a);
    }
    let cut = bytes.len().saturating_sub(usize::from(input.short % 16));
    if input.short >= 128 {
        bytes.truncate(cut);
    }
    if let Ok(rec) = pebs::decode(&bytes, &cfg) {
        let need = format
            .fixed_size()
            .unwrap_or_else(|| adaptive_record_size(groups_of(&bytes)));
        assert!(
            need <= bytes.len(),
            "a decoded record lies in the bytes given"
        );
        assert!(rec.lbr_len() * 24 <= bytes.len());
        assert_eq!(rec.lbr().count(), rec.lbr_len());
        if let Some(x) = rec.xmm() {
            assert_eq!(x.len(), 32);
        }
        if format.fixed_size().is_some() {
            assert_eq!(rec.lbr_len(), 0);
            assert!(rec.regs.is_some());
        }
    }

    // The IP fix-up over the input's code bytes.
    let (from, to) = input.lbr0;
    // Mostly within a few hundred bytes of the target: decoding 4 KiB of
    // one-byte instructions costs a thousand times more.
    let delta = if input.ip_delta & 0x8000 != 0 {
        u64::from(input.ip_delta & 0x7fff)
    } else {
        u64::from(input.ip_delta % 512)
    };
    let ip = to.wrapping_add(delta);
    let code = input.code;
    let base = to;
    let read = |addr: u64, buf: &mut [u8]| {
        let Some(off) = addr.checked_sub(base).and_then(|o| usize::try_from(o).ok()) else {
            return false;
        };
        for (i, b) in buf.iter_mut().enumerate() {
            *b = code.get(off + i).copied().unwrap_or(0x90);
        }
        true
    };
    let lbr0 = RawBranch { from, to, info: 0 };
    let bits = if input.bits32 { 32 } else { 64 };
    if let Ok(eventing) = pebs::fixup_ip(ip, lbr0, bits, read, |a| a < 1 << 47) {
        assert!(
            eventing == from || (eventing >= to && eventing < ip),
            "the fix-up gives the branch source or an IP between target and record IP"
        );
    }
});

/// The group bits of an adaptive record's header.
fn groups_of(bytes: &[u8]) -> u64 {
    bytes.get(..8).map_or(0, |b| {
        u64::from_le_bytes(b.try_into().unwrap()) & 0xffff_ffff
    })
}
