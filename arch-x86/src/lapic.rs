//! The local APIC in either mode firmware may leave it in: xAPIC (an MMIO
//! window) or x2APIC (MSRs 0x800 + offset / 16, SDM vol. 3 "x2APIC Register
//! Address Space"). Enable it, mask its local interrupts, read its ID.

/// IA32_APIC_BASE.
const IA32_APIC_BASE: u32 = 0x1b;
/// IA32_APIC_BASE\[10\]: x2APIC mode (MMIO accesses then do nothing).
const APIC_BASE_EXTD: u64 = 1 << 10;

/// How the registers are reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// xAPIC: 32-bit registers in the MMIO window at this base.
    Mmio(u64),
    /// x2APIC: MSR `0x800 + offset / 16`.
    Msr,
}

/// A local APIC, in xAPIC or x2APIC mode.
#[derive(Debug, Clone, Copy)]
pub struct LocalApic {
    access: Access,
    base: u64,
}

/// The x2APIC MSR of the register at xAPIC MMIO offset `off`.
pub const fn x2apic_msr(off: u64) -> u32 {
    0x800 + (off >> 4) as u32
}

impl LocalApic {
    /// The boot CPU's local APIC, in the mode IA32_APIC_BASE reports.
    ///
    /// # Safety
    /// Ring 0; in xAPIC mode the APIC window is identity-mapped and uncached.
    #[cfg(target_arch = "x86_64")]
    pub unsafe fn from_msr() -> Self {
        // SAFETY: IA32_APIC_BASE exists on every x86-64 CPU.
        let msr = unsafe { x86::msr::rdmsr(IA32_APIC_BASE) };
        let base = msr & 0x000f_ffff_ffff_f000;
        let access = if msr & APIC_BASE_EXTD != 0 {
            Access::Msr
        } else {
            Access::Mmio(base)
        };
        Self { access, base }
    }

    /// True in x2APIC mode.
    pub fn x2apic(&self) -> bool {
        self.access == Access::Msr
    }

    #[cfg(target_arch = "x86_64")]
    fn read(&self, off: u64) -> u32 {
        match self.access {
            // SAFETY: `off` is a register of the SDM's xAPIC map inside the
            // window `from_msr`'s caller mapped.
            Access::Mmio(base) => unsafe { core::ptr::read_volatile((base + off) as *const u32) },
            // SAFETY: in x2APIC mode every xAPIC register used here has its
            // MSR at 0x800 + off / 16; ring 0 per `from_msr`.
            Access::Msr => unsafe { x86::msr::rdmsr(x2apic_msr(off)) as u32 },
        }
    }

    #[cfg(target_arch = "x86_64")]
    fn write(&self, off: u64, value: u32) {
        match self.access {
            // SAFETY: as in `read`.
            Access::Mmio(base) => unsafe {
                core::ptr::write_volatile((base + off) as *mut u32, value)
            },
            // SAFETY: as in `read`.
            Access::Msr => unsafe { x86::msr::wrmsr(x2apic_msr(off), u64::from(value)) },
        }
    }

    /// The APIC ID (its low 8 bits in x2APIC mode, where it is 32 bits wide).
    #[cfg(target_arch = "x86_64")]
    pub fn id(&self) -> u8 {
        let v = self.read(0x20);
        if self.x2apic() {
            v as u8
        } else {
            (v >> 24) as u8
        }
    }

    /// Software-enables the APIC (spurious vector 0xff) and masks the timer,
    /// LINT0, the error and (unless `keep_pmi`) the performance-counter LVT
    /// entries; LINT1 stays an NMI input.
    #[cfg(target_arch = "x86_64")]
    pub fn enable_masked(&self, keep_pmi: bool) {
        self.write(0xf0, 0x1ff);
        for off in [0x320, 0x340, 0x350, 0x370] {
            if keep_pmi && off == 0x340 {
                continue;
            }
            self.write(off, 1 << 16);
        }
        self.write(0x360, 4 << 8);
    }

    /// The MMIO base (meaningful in xAPIC mode).
    pub fn base(&self) -> u64 {
        self.base
    }
}

#[cfg(test)]
mod tests {
    use super::x2apic_msr;

    #[test]
    fn x2apic_msrs_follow_the_sdm_map() {
        assert_eq!(x2apic_msr(0x20), 0x802); // ID
        assert_eq!(x2apic_msr(0xf0), 0x80f); // SVR
        assert_eq!(x2apic_msr(0x340), 0x834); // LVT performance counter
        assert_eq!(x2apic_msr(0x360), 0x836); // LVT LINT1
    }
}
