//! Decoding of raw last-branch-record values (Intel legacy formats, Intel
//! architectural LBR, AMD LbrExtV2) into perf branch entries.
//!
//! The PMU driver reads the MSRs and hands over [`RawBranch`] triples, newest
//! first; everything format-specific about their bits lives here.

/// One LBR entry as read from the hardware: FROM, TO and INFO (0 where the
/// format has no INFO register).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawBranch {
    /// FROM_IP MSR value (may carry flag bits, depending on the format).
    pub from: u64,
    /// TO_IP MSR value (may carry cycle counts, depending on the format).
    pub to: u64,
    /// LBR_INFO value, 0 when the format has none.
    pub info: u64,
}

/// How the raw values of [`RawBranch`] are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LbrFormat {
    /// Model-specific LBR with the format number from IA32_PERF_CAPABILITIES\[5:0\].
    Legacy(u8),
    /// Architectural LBR (CPUID leaf 0x1C).
    Arch,
    /// AMD LbrExtV2, with the CPU's linear-address width for sign extension.
    AmdV2 {
        /// Virtual address bits (48 or 57).
        va_bits: u8,
    },
}

/// Legacy format numbers (SDM vol. 3 "LBR Stack", IA32_PERF_CAPABILITIES.LBR_FMT).
pub mod legacy {
    /// 32-bit offsets, source and target packed in the FROM MSR.
    pub const FMT_32: u8 = 0;
    /// 64-bit linear addresses.
    pub const FMT_LIP: u8 = 1;
    /// 64-bit effective addresses.
    pub const FMT_EIP: u8 = 2;
    /// FROM\[63\] is the mispredict flag.
    pub const FMT_EIP_FLAGS: u8 = 3;
    /// FROM\[63\] mispredict, FROM\[62\] in TSX, FROM\[61\] TSX abort.
    pub const FMT_EIP_FLAGS2: u8 = 4;
    /// Flags and cycle count in MSR_LBR_INFO_x.
    pub const FMT_INFO: u8 = 5;
    /// FROM\[63\] mispredict, TO\[63:48\] elapsed cycles (Goldmont).
    pub const FMT_TIME: u8 = 6;
    /// Like INFO without the TSX bits.
    pub const FMT_INFO2: u8 = 7;
}

pub use crate::sample::{BranchEntry, BranchFlags, BranchStack, MAX_BRANCHES, branch_kind};

/// Sign-extend `v` from bit `bits - 1`.
fn sign_extend(v: u64, bits: u32) -> u64 {
    let shift = 64 - bits;
    (((v << shift) as i64) >> shift) as u64
}

/// Decode one raw entry. Returns `None` for an entry that holds no branch
/// (an unused arch-LBR slot, an AMD entry without its valid bit, a zero legacy
/// entry) and for an unknown legacy format.
pub fn decode(format: LbrFormat, raw: &RawBranch) -> Option<BranchEntry> {
    let mut e = Flat::default();
    match format {
        LbrFormat::Legacy(fmt) => {
            if raw.from == 0 && raw.to == 0 {
                return None;
            }
            match fmt {
                legacy::FMT_32 => {
                    // One MSR per entry: FROM[31:0] source, FROM[63:32]
                    // target (the TO value is not used).
                    e.from = raw.from & 0xFFFF_FFFF;
                    e.to = raw.from >> 32;
                }
                legacy::FMT_LIP | legacy::FMT_EIP => {
                    e.from = raw.from;
                    e.to = raw.to;
                }
                legacy::FMT_EIP_FLAGS => {
                    e.mispred = raw.from >> 63 != 0;
                    e.predicted = !e.mispred;
                    e.from = sign_extend(raw.from, 63);
                    e.to = raw.to;
                }
                legacy::FMT_EIP_FLAGS2 => {
                    e.mispred = raw.from >> 63 != 0;
                    e.predicted = !e.mispred;
                    e.in_tx = raw.from >> 62 & 1 != 0;
                    e.abort = raw.from >> 61 & 1 != 0;
                    e.from = sign_extend(raw.from, 61);
                    e.to = raw.to;
                }
                legacy::FMT_INFO | legacy::FMT_INFO2 => {
                    // MSR_LBR_INFO_x: [63] MISPRED, [62] IN_TSX, [61] TSX_ABORT, [15:0] CYC_CNT.
                    e.mispred = raw.info >> 63 != 0;
                    e.predicted = !e.mispred;
                    if fmt == legacy::FMT_INFO {
                        e.in_tx = raw.info >> 62 & 1 != 0;
                        e.abort = raw.info >> 61 & 1 != 0;
                    }
                    e.cycles = raw.info as u16;
                    // The flags are in MSR_LBR_INFO_x: FROM and TO hold the
                    // whole linear address, taken as it is (Linux's
                    // lbr_has_info), whatever the CPU's address width.
                    e.from = raw.from;
                    e.to = raw.to;
                }
                legacy::FMT_TIME => {
                    // FROM[63] MISPRED above a 63-bit address; TO[63:48]
                    // the cycle count above a 48-bit one (Linux's
                    // lbr_from_flags and lbr_to_cycles).
                    e.mispred = raw.from >> 63 != 0;
                    e.predicted = !e.mispred;
                    e.cycles = (raw.to >> 48) as u16;
                    e.from = sign_extend(raw.from, 63);
                    e.to = sign_extend(raw.to, 48);
                }
                _ => return None,
            }
        }
        LbrFormat::Arch => {
            // SDM vol. 3 "Architectural LBR": FROM 0 marks an unused slot.
            // IA32_LBR_x_INFO: [63] MISPRED, [62] IN_TSX, [61] TSX_ABORT,
            // [60] CYC_CNT_VALID, [59:56] BR_TYPE, [15:0] CYC_CNT.
            if raw.from == 0 {
                return None;
            }
            e.from = raw.from;
            e.to = raw.to;
            e.mispred = raw.info >> 63 != 0;
            e.predicted = !e.mispred;
            e.in_tx = raw.info >> 62 & 1 != 0;
            e.abort = raw.info >> 61 & 1 != 0;
            if raw.info >> 60 & 1 != 0 {
                e.cycles = raw.info as u16;
            }
            e.kind = match (raw.info >> 56) & 0xF {
                0 => branch_kind::COND,
                1 => branch_kind::IND,
                2 => branch_kind::UNCOND,
                3 => branch_kind::IND_CALL,
                4 => branch_kind::CALL,
                5 => branch_kind::RET,
                _ => branch_kind::UNKNOWN,
            };
        }
        LbrFormat::AmdV2 { va_bits } => {
            // AMD PPR "LbrExtV2": FROM [57:0] IP, [63] mispredict; TO [57:0] IP,
            // [61] reserved (set = erroneous entry), [62] speculative, [63] valid.
            let valid = raw.to >> 63 != 0;
            let spec = raw.to >> 62 & 1 != 0;
            let reserved = raw.to >> 61 & 1 != 0;
            if (!valid && !spec) || reserved {
                return None;
            }
            let bits = u32::from(va_bits.clamp(32, 58));
            e.from = sign_extend(raw.from & ((1 << 58) - 1), bits);
            e.to = sign_extend(raw.to & ((1 << 58) - 1), bits);
            e.mispred = raw.from >> 63 != 0;
            e.predicted = !e.mispred;
        }
    }
    Some(BranchEntry {
        from: e.from,
        to: e.to,
        flags: BranchFlags {
            mispred: e.mispred,
            predicted: e.predicted,
            in_tx: e.in_tx,
            abort: e.abort,
            cycles: e.cycles,
            kind: e.kind,
        },
    })
}

/// Working copy of an entry while its format is unpacked.
#[derive(Default)]
struct Flat {
    from: u64,
    to: u64,
    mispred: bool,
    predicted: bool,
    in_tx: bool,
    abort: bool,
    cycles: u16,
    kind: u8,
}

/// Decode a newest-first list of raw entries into a perf branch stack
/// (at most [`MAX_BRANCHES`] entries), skipping empty slots.
pub fn to_stack(format: LbrFormat, raw: &[RawBranch]) -> BranchStack {
    let mut st = BranchStack::default();
    for r in raw {
        if let Some(e) = decode(format, r)
            && st.entries.push(e).is_err()
        {
            break;
        }
    }
    st
}

/// Decode a newest-first list of raw entries into `out`, skipping empty slots.
/// Returns how many entries were written.
pub fn decode_stack(format: LbrFormat, raw: &[RawBranch], out: &mut [BranchEntry]) -> usize {
    let mut n = 0;
    for r in raw {
        if n == out.len() {
            break;
        }
        if let Some(e) = decode(format, r) {
            out[n] = e;
            n += 1;
        }
    }
    n
}

/// Turn a call-stack-mode LBR (newest first; each entry a call whose `from` is
/// the call site) into callchain return addresses, after `ip`.
/// Returns how many addresses were written to `out` (including `ip` first).
pub fn callchain_from_call_stack(ip: u64, stack: &[BranchEntry], out: &mut [u64]) -> usize {
    let mut n = 0;
    if out.is_empty() {
        return 0;
    }
    out[n] = ip;
    n += 1;
    for e in stack {
        if n == out.len() {
            break;
        }
        out[n] = e.from;
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eip_flags_mispredict_and_sign_extension() {
        let raw = RawBranch {
            from: (1 << 63) | 0x7FFF_FFFF_FFFF_F000,
            to: 0x2000,
            info: 0,
        };
        // Bit 62 set means the address is negative after dropping the flag bit.
        let e = decode(LbrFormat::Legacy(legacy::FMT_EIP_FLAGS), &raw).unwrap();
        assert!(e.flags.mispred && !e.flags.predicted);
        assert_eq!(e.from, 0xFFFF_FFFF_FFFF_F000);
        let raw = RawBranch {
            from: 0x40_1000,
            to: 0x40_2000,
            info: 0,
        };
        let e = decode(LbrFormat::Legacy(legacy::FMT_EIP_FLAGS), &raw).unwrap();
        assert!(!e.flags.mispred && e.flags.predicted);
        assert_eq!((e.from, e.to), (0x40_1000, 0x40_2000));
    }

    #[test]
    fn eip_flags2_tsx_bits() {
        let raw = RawBranch {
            from: (0b011 << 61) | 0x1234,
            to: 0x10,
            info: 0,
        };
        let e = decode(LbrFormat::Legacy(legacy::FMT_EIP_FLAGS2), &raw).unwrap();
        assert!(!e.flags.mispred && e.flags.in_tx && e.flags.abort);
        assert_eq!(e.from, 0x1234);
    }

    #[test]
    fn info_format_takes_flags_and_cycles_from_info() {
        let raw = RawBranch {
            from: 0x1000,
            to: 0x2000,
            info: (1 << 63) | (1 << 62) | 77,
        };
        let e = decode(LbrFormat::Legacy(legacy::FMT_INFO), &raw).unwrap();
        assert!(e.flags.mispred && e.flags.in_tx && !e.flags.abort);
        assert_eq!(e.flags.cycles, 77);
        let e2 = decode(LbrFormat::Legacy(legacy::FMT_INFO2), &raw).unwrap();
        assert!(e2.flags.mispred && !e2.flags.in_tx);
    }

    #[test]
    fn time_format_cycles_in_to_high_bits() {
        let raw = RawBranch {
            from: 0x1000,
            to: (500u64 << 48) | 0x2000,
            info: 0,
        };
        let e = decode(LbrFormat::Legacy(legacy::FMT_TIME), &raw).unwrap();
        assert_eq!((e.to, e.flags.cycles), (0x2000, 500));
    }

    #[test]
    fn info_and_time_formats_keep_addresses_beyond_48_bits_as_linux() {
        // A 57-bit (LA57) user address and a kernel address: formats 5 and
        // 7 take FROM and TO as they are; format 6 sign-extends FROM from
        // bit 62 (below its MISPRED bit) and TO from bit 47.
        let la57 = 0x00ff_8000_0000_1000u64;
        let kernel = 0xff7f_ffff_8010_0000u64;
        for fmt in [legacy::FMT_INFO, legacy::FMT_INFO2] {
            let raw = RawBranch {
                from: la57,
                to: kernel,
                info: 0,
            };
            let e = decode(LbrFormat::Legacy(fmt), &raw).unwrap();
            assert_eq!((e.from, e.to), (la57, kernel), "format {fmt}");
        }
        let raw = RawBranch {
            from: (1 << 63) | la57,
            to: (7u64 << 48) | 0x7fff_f000_2000,
            info: 0,
        };
        let e = decode(LbrFormat::Legacy(legacy::FMT_TIME), &raw).unwrap();
        assert!(e.flags.mispred);
        assert_eq!(e.from, la57);
        assert_eq!((e.to, e.flags.cycles), (0x7fff_f000_2000, 7));
        let raw = RawBranch {
            from: 0x7fff_ffff_8010_0000,
            to: 0xffff_8000_0000_0000,
            info: 0,
        };
        let e = decode(LbrFormat::Legacy(legacy::FMT_TIME), &raw).unwrap();
        assert_eq!(e.from, 0xffff_ffff_8010_0000, "bit 62 extends into 63");
        assert!(!e.flags.mispred);
    }

    #[test]
    fn legacy_32bit_and_empty_and_unknown() {
        let raw = RawBranch {
            from: 0x0000_0010_1234_5678,
            to: 0xAAAA_0000_0000_0020,
            info: 0,
        };
        let e = decode(LbrFormat::Legacy(legacy::FMT_32), &raw).unwrap();
        assert_eq!(
            (e.from, e.to),
            (0x1234_5678, 0x10),
            "target from FROM[63:32]"
        );
        assert!(decode(LbrFormat::Legacy(3), &RawBranch::default()).is_none());
        assert!(decode(LbrFormat::Legacy(0x3F), &raw).is_none());
    }

    #[test]
    fn arch_lbr_type_cycles_and_empty_slot() {
        let info = (1 << 60) | (4u64 << 56) | 33;
        let e = decode(
            LbrFormat::Arch,
            &RawBranch {
                from: 0x10,
                to: 0x20,
                info,
            },
        )
        .unwrap();
        assert_eq!(
            (e.flags.kind, e.flags.cycles, e.flags.mispred),
            (branch_kind::CALL, 33, false)
        );
        // Without CYC_CNT_VALID the count is not reported.
        let e = decode(
            LbrFormat::Arch,
            &RawBranch {
                from: 0x10,
                to: 0x20,
                info: 33,
            },
        )
        .unwrap();
        assert_eq!(e.flags.cycles, 0);
        assert!(
            decode(
                LbrFormat::Arch,
                &RawBranch {
                    from: 0,
                    to: 0x20,
                    info
                }
            )
            .is_none()
        );
    }

    #[test]
    fn amd_v2_valid_bit_and_sign_extension() {
        let fmt = LbrFormat::AmdV2 { va_bits: 48 };
        let raw = RawBranch {
            from: (1 << 63) | 0xFFFF_8000_0000_1000 & ((1 << 58) - 1),
            to: (1 << 63) | 0x4000,
            info: 0,
        };
        let e = decode(fmt, &raw).unwrap();
        assert_eq!(e.from, 0xFFFF_8000_0000_1000);
        assert_eq!(e.to, 0x4000);
        assert!(e.flags.mispred);
        assert!(
            decode(
                fmt,
                &RawBranch {
                    from: 0x10,
                    to: 0x20,
                    info: 0
                }
            )
            .is_none()
        );
        // Reserved bit set: erroneous entry.
        assert!(
            decode(
                fmt,
                &RawBranch {
                    from: 0x10,
                    to: (1 << 63) | (1 << 61) | 0x20,
                    info: 0
                }
            )
            .is_none()
        );
    }

    #[test]
    fn stack_skips_empty_slots_and_callchain_starts_at_ip() {
        let raw = [
            RawBranch {
                from: 0x10,
                to: 0x20,
                info: 0,
            },
            RawBranch::default(),
            RawBranch {
                from: 0x30,
                to: 0x40,
                info: 0,
            },
        ];
        let mut out = [BranchEntry::default(); 4];
        let n = decode_stack(LbrFormat::Arch, &raw, &mut out);
        assert_eq!(n, 2);
        assert_eq!(out[1].from, 0x30);
        let mut cc = [0u64; 8];
        let m = callchain_from_call_stack(0x99, &out[..n], &mut cc);
        assert_eq!(&cc[..m], &[0x99, 0x10, 0x30]);
        let st = to_stack(LbrFormat::Arch, &raw);
        assert_eq!(st.entries.len(), 2);
        assert_eq!(st.entries[1], out[1]);
    }
}
