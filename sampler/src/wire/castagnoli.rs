//! CRC-32C (Castagnoli) in software, eight bytes at a step ("slice-by-8"):
//! the frame CRC of builds without `std`, where the drain checks every
//! group frame it writes.
//!
//! Each step XORs the CRC into the next eight bytes, read as two
//! little-endian 32-bit halves, and looks up each of their bytes in its
//! own table: table `k` holds the CRC of a byte followed by `k` zero
//! bytes, so the eight lookups XORed together are the CRC of the eight
//! bytes. Every index is a masked byte, so a step has no bounds checks,
//! and the low two bytes of a half are read without a shift: 26
//! instructions a step on the runtime's target (the `crc` crate's
//! slice-by-16 checks every byte it reads, about six instructions a
//! byte). Where the CPU has SSE4.2 the runtime uses its `crc32`
//! instruction instead.

/// The reflected CRC-32C polynomial.
const POLY: u32 = 0x82f6_3b78;

/// `TABLES[k][b]`: the CRC register after byte `b` then `k` zero bytes,
/// from a zero register.
static TABLES: [[u32; 256]; 8] = tables();

const fn tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    let mut b = 0;
    while b < 256 {
        let mut c = b as u32;
        let mut i = 0;
        while i < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            i += 1;
        }
        t[0][b] = c;
        b += 1;
    }
    let mut k = 1;
    while k < 8 {
        let mut b = 0;
        while b < 256 {
            let prev = t[k - 1][b];
            t[k][b] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            b += 1;
        }
        k += 1;
    }
    t
}

/// The CRC-32C of what `crc` was the CRC of, followed by `data` (`crc` 0
/// starts a new one): `crc32c_append` of the `crc32c` crate.
#[cfg_attr(feature = "std", allow(dead_code))]
pub(crate) fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    let t = &TABLES;
    // A byte of a 32-bit half: its low bytes are read without a shift.
    let byte = |v: u32, at: u32| usize::from((v >> at) as u8);
    let mut c = !crc;
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let mut b = [0u8; 4];
        b.copy_from_slice(&w[..4]);
        let lo = u32::from_le_bytes(b) ^ c;
        b.copy_from_slice(&w[4..]);
        let hi = u32::from_le_bytes(b);
        c = t[7][byte(lo, 0)]
            ^ t[6][byte(lo, 8)]
            ^ t[5][byte(lo, 16)]
            ^ t[4][byte(lo, 24)]
            ^ t[3][byte(hi, 0)]
            ^ t[2][byte(hi, 8)]
            ^ t[1][byte(hi, 16)]
            ^ t[0][byte(hi, 24)];
    }
    for &b in words.remainder() {
        c = (c >> 8) ^ t[0][usize::from(c as u8 ^ b)];
    }
    !c
}
