//! The local APIC (xAPIC mode): enable it, mask its local interrupts, read its ID.

/// IA32_APIC_BASE.
const IA32_APIC_BASE: u32 = 0x1b;

/// A local APIC reached through its MMIO window.
#[derive(Debug, Clone, Copy)]
pub struct LocalApic {
    base: u64,
}

impl LocalApic {
    /// The boot CPU's local APIC at the base IA32_APIC_BASE reports.
    ///
    /// # Safety
    /// Ring 0, with the APIC window identity-mapped and uncached.
    #[cfg(target_arch = "x86_64")]
    pub unsafe fn from_msr() -> Self {
        // SAFETY: IA32_APIC_BASE exists on every x86-64 CPU.
        let base = unsafe { x86::msr::rdmsr(IA32_APIC_BASE) } & 0x000f_ffff_ffff_f000;
        Self { base }
    }

    fn reg(&self, off: u64) -> *mut u32 {
        (self.base + off) as *mut u32
    }

    /// The APIC ID.
    pub fn id(&self) -> u8 {
        // SAFETY: the ID register is at +0x20 of a mapped APIC window.
        (unsafe { core::ptr::read_volatile(self.reg(0x20)) } >> 24) as u8
    }

    /// Software-enables the APIC (spurious vector 0xff) and masks the timer,
    /// LINT0, the error and the performance-counter LVT entries; LINT1 stays an NMI input.
    pub fn enable_masked(&self) {
        // SAFETY: register offsets from the SDM's xAPIC map, in a mapped window.
        unsafe {
            core::ptr::write_volatile(self.reg(0xf0), 0x1ff);
            for off in [0x320, 0x340, 0x350, 0x370] {
                core::ptr::write_volatile(self.reg(off), 1 << 16);
            }
            core::ptr::write_volatile(self.reg(0x360), 4 << 8);
        }
    }

    /// The MMIO base.
    pub fn base(&self) -> u64 {
        self.base
    }
}
