//! CRC-32C (Castagnoli) in software, eight bytes at a step ("slice-by-8"):
//! the frame CRC of builds without `std`, where the drain checks every
//! group frame it writes.
//!
//! Each step XORs the CRC into the next eight bytes, read as one
//! little-endian word, and looks up each of the word's bytes in its own
//! table: table `k` holds the CRC of a byte followed by `k` zero bytes,
//! so the eight lookups XORed together are the CRC of the eight bytes.
//! The word is read whole and every index is a masked byte, so a step has
//! no bounds checks (the `crc` crate's slice-by-16 checks every byte it
//! reads: about six instructions a byte on the runtime's target, against
//! under three here).

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
    let byte = |v: u64, at: u32| usize::from((v >> at) as u8);
    let mut c = !crc;
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        let v = u64::from_le_bytes(b) ^ u64::from(c);
        c = t[7][byte(v, 0)]
            ^ t[6][byte(v, 8)]
            ^ t[5][byte(v, 16)]
            ^ t[4][byte(v, 24)]
            ^ t[3][byte(v, 32)]
            ^ t[2][byte(v, 40)]
            ^ t[1][byte(v, 48)]
            ^ t[0][byte(v, 56)];
    }
    for &b in words.remainder() {
        c = (c >> 8) ^ t[0][usize::from(c as u8 ^ b)];
    }
    !c
}
