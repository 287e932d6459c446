//! The I/O APIC: routing one pin to the boot CPU, here with NMI delivery.

/// Default MMIO base of the first I/O APIC.
pub const DEFAULT_BASE: u64 = 0xfec0_0000;
/// The pin the PIT's IRQ 0 arrives on (ISA IRQ 0 is overridden to GSI 2).
pub const PIT_PIN: u8 = 2;

/// Delivery modes of a redirection entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Delivery {
    /// Fixed vector.
    Fixed = 0,
    /// Non-maskable interrupt (the vector is ignored).
    Nmi = 4,
}

/// The physical destination that reaches every local APIC (xAPIC's
/// broadcast ID; an x2APIC system takes the 8-bit 0xFF as broadcast too).
pub const BROADCAST: u8 = 0xff;

/// Bit that masks a redirection entry.
pub const MASKED: u64 = 1 << 16;

/// An edge-triggered, active-high, physical-destination redirection entry.
pub const fn redirection(delivery: Delivery, vector: u8, dest_apic_id: u8, masked: bool) -> u64 {
    (vector as u64)
        | ((delivery as u64) << 8)
        | if masked { MASKED } else { 0 }
        | ((dest_apic_id as u64) << 56)
}

/// An I/O APIC reached through its memory-mapped window.
#[derive(Debug, Clone, Copy)]
pub struct IoApic {
    base: u64,
}

impl IoApic {
    /// A handle for the I/O APIC at `base`.
    ///
    /// # Safety
    /// `base` must be the virtual address (in the direct map) of the uncached MMIO window of an I/O APIC.
    pub const unsafe fn new(base: u64) -> Self {
        Self { base }
    }

    fn write(&self, reg: u32, val: u32) {
        // SAFETY: `new`'s contract: IOREGSEL at +0, IOWIN at +0x10.
        unsafe {
            core::ptr::write_volatile(self.base as *mut u32, reg);
            core::ptr::write_volatile((self.base + 0x10) as *mut u32, val);
        }
    }

    fn read(&self, reg: u32) -> u32 {
        // SAFETY: as in `write`.
        unsafe {
            core::ptr::write_volatile(self.base as *mut u32, reg);
            core::ptr::read_volatile((self.base + 0x10) as *const u32)
        }
    }

    /// Number of redirection entries.
    pub fn pins(&self) -> u8 {
        (((self.read(1) >> 16) & 0xff) + 1) as u8
    }

    /// Writes the redirection entry of `pin` (mask first, so no half-written entry fires).
    pub fn set_redirection(&self, pin: u8, entry: u64) {
        let reg = 0x10 + 2 * u32::from(pin);
        self.write(reg, MASKED as u32);
        self.write(reg + 1, (entry >> 32) as u32);
        self.write(reg, entry as u32);
    }

    /// Points the redirection entry of `pin` at the APIC `dest` (an 8-bit
    /// ID, or 0xff for every CPU), touching nothing else: one write of the
    /// entry's high half, which holds only the destination, so the entry is
    /// never masked or half-written. An edge that arrives meanwhile goes to
    /// the old destination or the new one, never nowhere (a masked entry
    /// drops a one-shot clock's edge, and the clock with it).
    pub fn set_destination(&self, pin: u8, dest: u8) {
        self.write(0x10 + 2 * u32::from(pin) + 1, u32::from(dest) << 24);
    }

    /// Masks every pin.
    pub fn mask_all(&self) {
        for pin in 0..self.pins() {
            self.set_redirection(pin, MASKED);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nmi_entry_encoding() {
        let e = redirection(Delivery::Nmi, 2, 0, false);
        assert_eq!(e, 0x0000_0000_0000_0402);
        assert_eq!(
            redirection(Delivery::Fixed, 0x30, 3, true),
            0x0300_0000_0001_0030
        );
    }
}
