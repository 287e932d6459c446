//! CRC-32C (Castagnoli) with the SSE4.2 `crc32` instruction, eight bytes
//! an instruction: the frame check of the wire's group frames, which the
//! drain computes over every byte it writes. A table CRC costs about
//! three instructions a byte; this costs well under one.
//!
//! [`hardware`] hands the function out only on a CPU that has the
//! instruction (CPUID.1:ECX.SSE4_2); elsewhere the wire keeps its tables.

/// The CRC-32C append function of this CPU's `crc32` instruction, if it
/// has one: `f(crc, data)` is the CRC-32C of what `crc` was the CRC-32C
/// of, followed by `data` (`crc` 0 starts a new one).
pub fn hardware() -> Option<fn(u32, &[u8]) -> u32> {
    crate::cpu::features()
        .sse42
        .then_some(append as fn(u32, &[u8]) -> u32)
}

/// [`hardware`]'s function. Only reachable through it, so only called on a
/// CPU with SSE4.2.
fn append(crc: u32, data: &[u8]) -> u32 {
    let mut c = u64::from(!crc);
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        let v = u64::from_le_bytes(b);
        // SAFETY: `crc32` reads and writes only the two registers named
        // (the 64-bit form leaves the CRC zero-extended in `c`); the CPU
        // has it, as `hardware` checked before handing this function out.
        unsafe {
            core::arch::asm!(
                "crc32 {c}, {v}",
                c = inout(reg) c,
                v = in(reg) v,
                options(pure, nomem, nostack, preserves_flags)
            );
        }
    }
    for &b in words.remainder() {
        // SAFETY: as above, with the byte form.
        unsafe {
            core::arch::asm!(
                "crc32 {c:e}, {b}",
                c = inout(reg) c,
                b = in(reg_byte) b,
                options(pure, nomem, nostack, preserves_flags)
            );
        }
    }
    !(c as u32)
}

/// CRC-32C bit by bit, from its definition (the reflected polynomial
/// 0x82f63b78), appended as [`hardware`]'s function appends: what the
/// tests and the runtime's self-test check the instruction against.
pub fn bitwise(crc: u32, data: &[u8]) -> u32 {
    let mut c = !crc;
    for &b in data {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0x82f6_3b78
            } else {
                c >> 1
            };
        }
    }
    !c
}

#[cfg(test)]
mod tests {
    use super::bitwise;

    #[test]
    fn the_instruction_computes_crc32c() {
        // Offered exactly when the CPU says it has SSE4.2.
        let f = super::hardware();
        assert_eq!(f.is_some(), std::is_x86_feature_detected!("sse4.2"));
        let Some(f) = f else { return };
        assert_eq!(f(0, b"123456789"), 0xe306_9283, "the standard check value");
        let data: Vec<u8> = (0..700u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for start in 0..3 {
            for len in 0..600 {
                let d = &data[start..start + len];
                assert_eq!(f(0, d), bitwise(0, d), "len {len} start {start}");
                let (x, y) = d.split_at(len / 3);
                assert_eq!(f(f(0, x), y), bitwise(0, d), "len {len} in two parts");
            }
        }
    }
}
