//! Interrupt descriptor table entries and loading.

use crate::gdt;

/// One 16-byte interrupt gate.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IdtEntry {
    offset_low: u16,
    selector: u16,
    ist: u8,
    type_attr: u8,
    offset_mid: u16,
    offset_high: u32,
    reserved: u32,
}

impl IdtEntry {
    /// A not-present entry.
    pub const MISSING: Self = Self {
        offset_low: 0,
        selector: 0,
        ist: 0,
        type_attr: 0,
        offset_mid: 0,
        offset_high: 0,
        reserved: 0,
    };

    /// A present 64-bit interrupt gate (IF cleared on entry) into the kernel code segment.
    ///
    /// `ist` is the 1-based IST slot (0 = none); `dpl` is the lowest
    /// privilege allowed to raise it with `int n`.
    pub const fn interrupt_gate(handler: u64, ist: u8, dpl: u8) -> Self {
        Self {
            offset_low: handler as u16,
            selector: gdt::KERNEL_CODE,
            ist: ist & 7,
            type_attr: 0x80 | ((dpl & 3) << 5) | 0xe,
            offset_mid: (handler >> 16) as u16,
            offset_high: (handler >> 32) as u32,
            reserved: 0,
        }
    }

    /// The handler address.
    pub const fn handler(&self) -> u64 {
        self.offset_low as u64
            | ((self.offset_mid as u64) << 16)
            | ((self.offset_high as u64) << 32)
    }

    /// The IST slot.
    pub const fn ist(&self) -> u8 {
        self.ist
    }

    /// The descriptor privilege level.
    pub const fn dpl(&self) -> u8 {
        (self.type_attr >> 5) & 3
    }

    /// True when present.
    pub const fn present(&self) -> bool {
        self.type_attr & 0x80 != 0
    }
}

/// A full 256-entry table.
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug)]
pub struct Idt {
    /// The gates, indexed by vector.
    pub entries: [IdtEntry; 256],
}

impl Idt {
    /// A table with every entry missing.
    pub const fn new() -> Self {
        Self {
            entries: [IdtEntry::MISSING; 256],
        }
    }
}

impl Default for Idt {
    fn default() -> Self {
        Self::new()
    }
}

/// Loads `idt` with `lidt`.
///
/// # Safety
/// `idt` must stay valid and in place while the CPU can take interrupts, and
/// every present gate must point at a correct entry stub.
#[cfg(target_arch = "x86_64")]
pub unsafe fn load(idt: *const Idt) {
    #[repr(C, packed)]
    struct Pointer {
        limit: u16,
        base: u64,
    }
    let ptr = Pointer {
        limit: (core::mem::size_of::<Idt>() - 1) as u16,
        base: idt as u64,
    };
    // SAFETY: the caller guarantees the table stays valid.
    unsafe { core::arch::asm!("lidt [{}]", in(reg) &ptr, options(readonly, nostack)) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn layout() {
        assert_eq!(size_of::<IdtEntry>(), 16);
        assert_eq!(offset_of!(IdtEntry, selector), 2);
        assert_eq!(offset_of!(IdtEntry, ist), 4);
        assert_eq!(offset_of!(IdtEntry, type_attr), 5);
        assert_eq!(offset_of!(IdtEntry, offset_mid), 6);
        assert_eq!(offset_of!(IdtEntry, offset_high), 8);
        assert_eq!(size_of::<Idt>(), 4096);
    }

    #[test]
    fn gate_encoding() {
        let e = IdtEntry::interrupt_gate(0xffff_8000_1234_5678, 1, 3);
        assert_eq!(e.handler(), 0xffff_8000_1234_5678);
        assert_eq!(e.ist(), 1);
        assert_eq!(e.dpl(), 3);
        assert!(e.present());
        // SAFETY: IdtEntry is plain old data of 16 bytes.
        let raw: [u8; 16] = unsafe { core::mem::transmute(e) };
        assert_eq!(raw[5], 0xee, "present, DPL 3, 64-bit interrupt gate");
        assert_eq!(&raw[2..4], &gdt::KERNEL_CODE.to_le_bytes());
        assert!(!IdtEntry::MISSING.present());
    }
}
