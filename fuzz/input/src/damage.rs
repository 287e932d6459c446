//! Line damage applied to an encoded stream: what a noisy serial line does
//! (flipped bits, dropped and inserted bytes, a spurious delimiter, a cut).
//! No operation copies a run of the stream, so damage cannot make a second
//! valid copy of a frame: whatever still decodes after it must be a record
//! that was sent, in the order it was sent.

use arbitrary::Arbitrary;

/// One change to the byte stream. Positions are taken modulo the stream's
/// length at the time the change is applied.
#[derive(Clone, Copy, Debug, Arbitrary)]
pub enum Damage {
    /// Flip one bit.
    FlipBit {
        /// Byte position.
        pos: u16,
        /// Bit (0..=7, modulo 8).
        bit: u8,
    },
    /// Set one byte.
    SetByte {
        /// Byte position.
        pos: u16,
        /// The new value.
        value: u8,
    },
    /// Drop `len` bytes.
    Drop {
        /// First byte dropped.
        pos: u16,
        /// Bytes dropped (at most to the end).
        len: u8,
    },
    /// Insert one byte.
    Insert {
        /// Where.
        pos: u16,
        /// The byte.
        value: u8,
    },
    /// A spurious delimiter: the frame around it is split in two.
    Delimiter {
        /// Where.
        pos: u16,
    },
    /// The line stops: everything from `pos` on is lost.
    Cut {
        /// First byte lost.
        pos: u16,
    },
}

impl Damage {
    /// Applies the change to `bytes`.
    pub fn apply(self, bytes: &mut Vec<u8>) {
        if bytes.is_empty() {
            return;
        }
        let at = |pos: u16, n: usize| usize::from(pos) % n;
        match self {
            Damage::FlipBit { pos, bit } => {
                let i = at(pos, bytes.len());
                bytes[i] ^= 1 << (bit % 8);
            }
            Damage::SetByte { pos, value } => {
                let i = at(pos, bytes.len());
                bytes[i] = value;
            }
            Damage::Drop { pos, len } => {
                let i = at(pos, bytes.len());
                let end = (i + usize::from(len)).min(bytes.len());
                bytes.drain(i..end);
            }
            Damage::Insert { pos, value } => {
                let i = at(pos, bytes.len() + 1);
                bytes.insert(i, value);
            }
            Damage::Delimiter { pos } => {
                let i = at(pos, bytes.len() + 1);
                bytes.insert(i, 0);
            }
            Damage::Cut { pos } => {
                let i = at(pos, bytes.len());
                bytes.truncate(i);
            }
        }
    }
}

/// Splits `bytes` into chunks of the given sizes (each at least 1), the
/// last size repeating, as reads from a serial port arrive; no sizes: one
/// chunk (the decoder's one-pass scan needs chunks of over 1 KiB).
pub fn chunks<'a>(bytes: &'a [u8], sizes: &[u16]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut rest = bytes;
    let mut i = 0;
    while !rest.is_empty() {
        let size = sizes
            .get(i)
            .or(sizes.last())
            .map_or(rest.len(), |&s| usize::from(s).max(1));
        let (head, tail) = rest.split_at(size.min(rest.len()));
        out.push(head);
        rest = tail;
        i += 1;
    }
    out
}
