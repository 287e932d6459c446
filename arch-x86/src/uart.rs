//! A polled 16550 UART driver behind `embedded_io::Write`.

use core::convert::Infallible;

/// I/O port base of COM1.
pub const COM1: u16 = 0x3f8;

/// Polls of the line-status register before a byte is written regardless
/// once the UART has been found wedged (see [`TX_WAIT_TSC`]); a missing or
/// wedged UART must never hang the runtime.
const TX_SPIN_LIMIT: u32 = 100_000;
/// TSC cycles (about a second) a byte waits for room in the transmitter
/// before the UART counts as wedged. A line that is only slow, the host
/// reading a QEMU chardev at a serial line's pace with a one-page FIFO in
/// between, stalls the transmitter for hundreds of milliseconds at a
/// time; writing on then would overwrite bytes still waiting.
const TX_WAIT_TSC: u64 = 1 << 31;

/// Set when a byte waited [`TX_WAIT_TSC`] in vain; cleared when the
/// transmitter takes bytes again.
static WEDGED: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// A 16550-compatible UART reached through port I/O.
#[derive(Debug, Clone, Copy)]
pub struct Uart16550 {
    base: u16,
}

impl Uart16550 {
    /// A handle for the UART at `base`.
    ///
    /// # Safety
    /// `base` must be the I/O base of a 16550-compatible UART (or of nothing),
    /// and no other code may program that UART differently.
    pub const unsafe fn new(base: u16) -> Self {
        Self { base }
    }

    /// Programs 115200 baud, 8N1, FIFOs on, interrupts off.
    pub fn init(&self) {
        let b = self.base;
        // SAFETY: `new`'s contract says these ports belong to this UART.
        unsafe {
            outb(b + 1, 0x00); // no interrupts
            outb(b + 3, 0x80); // DLAB
            outb(b, 0x01); // divisor 1 = 115200
            outb(b + 1, 0x00);
            outb(b + 3, 0x03); // 8N1
            outb(b + 2, 0xc7); // FIFO on, cleared, 14-byte threshold
            outb(b + 4, 0x03); // DTR, RTS
        }
    }

    /// Writes one byte, waiting (boundedly) for room in the transmitter.
    pub fn write_byte(&self, byte: u8) {
        use core::sync::atomic::Ordering;
        let mut spins = 0;
        let wedged = WEDGED.load(Ordering::Relaxed);
        let start = crate::cpu::rdtsc();
        // SAFETY: as in `init`.
        while unsafe { inb(self.base + 5) } & 0x20 == 0 {
            spins += 1;
            if (wedged && spins >= TX_SPIN_LIMIT)
                || crate::cpu::rdtsc().wrapping_sub(start) > TX_WAIT_TSC
            {
                WEDGED.store(true, Ordering::Relaxed);
                break;
            }
            core::hint::spin_loop();
        }
        if spins < TX_SPIN_LIMIT && wedged {
            WEDGED.store(false, Ordering::Relaxed);
        }
        // SAFETY: as in `init`.
        unsafe { outb(self.base, byte) };
    }

    /// Writes all of `bytes`.
    pub fn write_bytes(&self, bytes: &[u8]) {
        for &b in bytes {
            self.write_byte(b);
        }
    }
}

#[cfg(target_arch = "x86_64")]
unsafe fn outb(port: u16, val: u8) {
    // SAFETY: forwarded from the caller.
    unsafe { x86::io::outb(port, val) }
}

#[cfg(target_arch = "x86_64")]
unsafe fn inb(port: u16) -> u8 {
    // SAFETY: forwarded from the caller.
    unsafe { x86::io::inb(port) }
}

impl embedded_io::ErrorType for Uart16550 {
    type Error = Infallible;
}

impl embedded_io::Write for Uart16550 {
    fn write(&mut self, buf: &[u8]) -> Result<usize, Self::Error> {
        self.write_bytes(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
}

impl core::fmt::Write for Uart16550 {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        self.write_bytes(s.as_bytes());
        Ok(())
    }
}

/// Bytes the transmitter takes at once when its line-status register says
/// it is empty (the 16550's FIFO).
pub const TX_FIFO: usize = 16;

impl Uart16550 {
    /// Writes as many of `bytes` as the transmitter takes now (up to its
    /// FIFO when it is empty, none while it is still sending); returns
    /// how many. Never waits.
    pub fn try_write(&self, bytes: &[u8]) -> usize {
        // SAFETY: as in `init`.
        if unsafe { inb(self.base + 5) } & 0x20 == 0 {
            return 0;
        }
        let n = bytes.len().min(TX_FIFO);
        for &b in &bytes[..n] {
            // SAFETY: as in `init`.
            unsafe { outb(self.base, b) };
        }
        n
    }
}
