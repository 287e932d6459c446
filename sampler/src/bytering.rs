//! The flight recorder's byte ring: encoded frames wait here between the
//! drain (which pushes whole frames) and a transport that empties it as
//! fast as the line allows. Pure logic over a caller's memory, no
//! allocation; never used in NMI context.
//!
//! A frame goes in whole or not at all ([`ByteRing::push`]), so the bytes
//! that leave are always a run of whole frames: a reader that attaches
//! late sees a delimiter-aligned stream again after one frame.

/// A first-in first-out ring of bytes over `buf`.
#[derive(Debug)]
pub struct ByteRing<'a> {
    buf: &'a mut [u8],
    /// Index of the oldest byte.
    head: usize,
    /// Bytes stored.
    len: usize,
    /// Most bytes stored at once.
    high_water: usize,
}

impl<'a> ByteRing<'a> {
    /// An empty ring over `buf` (its whole length is the capacity).
    pub fn new(buf: &'a mut [u8]) -> Self {
        ByteRing {
            buf,
            head: 0,
            len: 0,
            high_water: 0,
        }
    }

    /// Bytes it can hold.
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// Bytes stored.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes that can still be pushed.
    pub fn free(&self) -> usize {
        self.buf.len() - self.len
    }

    /// The most bytes ever stored at once.
    pub fn high_water(&self) -> usize {
        self.high_water
    }

    /// Appends all of `bytes`, or nothing when they do not fit; returns
    /// whether they went in.
    pub fn push(&mut self, bytes: &[u8]) -> bool {
        if bytes.len() > self.free() {
            return false;
        }
        let cap = self.buf.len();
        if bytes.is_empty() {
            return true;
        }
        let tail = (self.head + self.len) % cap;
        let first = bytes.len().min(cap - tail);
        self.buf[tail..tail + first].copy_from_slice(&bytes[..first]);
        self.buf[..bytes.len() - first].copy_from_slice(&bytes[first..]);
        self.len += bytes.len();
        self.high_water = self.high_water.max(self.len);
        true
    }

    /// The oldest stored bytes that lie contiguously in memory (all of
    /// them unless they wrap around the end); empty when the ring is.
    pub fn peek(&self) -> &[u8] {
        let n = self.len.min(self.buf.len() - self.head);
        &self.buf[self.head..self.head + n]
    }

    /// Drops the `n` oldest bytes (at most [`ByteRing::len`]), the ones a
    /// transport took from [`ByteRing::peek`].
    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.len);
        self.len -= n;
        self.head = if self.len == 0 {
            0
        } else {
            (self.head + n) % self.buf.len()
        };
    }

    /// Moves bytes out through `write` (which returns how many of the
    /// offered bytes it took, 0 when it takes none now) until the ring is
    /// empty or `write` takes nothing; returns the bytes moved.
    pub fn pump(&mut self, mut write: impl FnMut(&[u8]) -> usize) -> usize {
        let mut moved = 0;
        while !self.is_empty() {
            let n = write(self.peek());
            if n == 0 {
                break;
            }
            self.consume(n);
            moved += n;
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    #[test]
    fn frames_go_in_whole_or_not_at_all_and_come_out_in_order() {
        let mut mem = [0u8; 10];
        let mut r = ByteRing::new(&mut mem);
        assert!(r.push(b"abcd"));
        assert!(r.push(b"efgh"));
        assert_eq!(r.free(), 2);
        assert!(!r.push(b"ijk"), "a frame that does not fit is refused");
        assert_eq!(r.len(), 8, "and nothing of it is stored");
        assert_eq!(r.peek(), b"abcdefgh");
        r.consume(6);
        // Wraps: 2 bytes at the end, 3 at the start.
        assert!(r.push(b"ijklm"));
        assert_eq!(r.len(), 7);
        let mut out = Vec::new();
        let moved = r.pump(|b| {
            out.extend_from_slice(b);
            b.len()
        });
        assert_eq!(moved, 7);
        assert_eq!(out, b"ghijklm");
        assert!(r.is_empty());
        assert_eq!(r.high_water(), 8);
    }

    #[test]
    fn pump_stops_when_the_writer_takes_nothing_and_resumes() {
        let mut mem = [0u8; 64];
        let mut r = ByteRing::new(&mut mem);
        let data: Vec<u8> = (0..50).collect();
        assert!(r.push(&data));
        let mut out = Vec::new();
        let mut budget = 7;
        // A writer that takes 3 bytes at a time until its budget is spent.
        let moved = r.pump(|b| {
            let n = b.len().min(3).min(budget);
            budget -= n;
            out.extend_from_slice(&b[..n]);
            n
        });
        assert_eq!(moved, 7);
        assert_eq!(r.len(), 43);
        r.pump(|b| {
            out.extend_from_slice(b);
            b.len()
        });
        assert_eq!(out, data);
    }

    #[test]
    fn a_long_random_run_keeps_every_byte_in_order() {
        let mut mem = [0u8; 97];
        let mut r = ByteRing::new(&mut mem);
        let mut x: u32 = 12345;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        let (mut next_in, mut next_out) = (0u8, 0u8);
        let (mut pushed, mut refused) = (0usize, 0usize);
        for _ in 0..20_000 {
            let len = (rnd() % 40) as usize;
            let frame: Vec<u8> = (0..len).map(|i| next_in.wrapping_add(i as u8)).collect();
            let before = r.len();
            if r.push(&frame) {
                next_in = next_in.wrapping_add(len as u8);
                pushed += len;
            } else {
                assert!(len > 97 - before);
                refused += 1;
            }
            let take = (rnd() % 50) as usize;
            let mut left = take;
            r.pump(|b| {
                let n = b.len().min(left);
                for &c in &b[..n] {
                    assert_eq!(c, next_out);
                    next_out = next_out.wrapping_add(1);
                }
                left -= n;
                n
            });
        }
        assert!(pushed > 0 && refused > 0);
    }
}
