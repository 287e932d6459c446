//! The real machine as a [`PmuHw`]: the processor's MSRs through
//! `rdmsr`/`wrmsr` ([`CpuMsr`]) and the local APIC's LVT performance-counter
//! entry, in whichever mode the APIC is in (xAPIC: MMIO offset 0x340;
//! x2APIC: MSR 0x834).
//!
//! # PMIs as NMIs
//!
//! The drivers program the LVT entry with delivery mode NMI (SDM vol. 3
//! "Local Vector Table"). Two consequences:
//!
//! - No EOI: the local APIC takes no EOI for interrupts delivered in NMI,
//!   SMI, INIT, ExtINT or start-up mode (SDM vol. 3 "Signaling Interrupt
//!   Servicing Completion"), so the PMI handler writes nothing to the EOI
//!   register. NMIs stay blocked until the handler's IRET.
//! - Re-arm: when the APIC delivers a PMI it sets the entry's mask bit
//!   (SDM vol. 3 "Generating an Interrupt on Overflow"), so the handler
//!   writes the unmasked NMI entry again on every PMI; the drivers' `handle_pmi`
//!   does that.

use super::{LVT_MASKED, Lvt};
use crate::msr::{CpuMsr, Msr, addr};

/// IA32_APIC_BASE.
pub const IA32_APIC_BASE: u32 = 0x1B;
/// IA32_APIC_BASE\[11\]: the local APIC is globally enabled.
pub const APIC_BASE_ENABLE: u64 = 1 << 11;
/// IA32_APIC_BASE\[10\]: x2APIC mode.
pub const APIC_BASE_EXTD: u64 = 1 << 10;
/// xAPIC MMIO offset of the LVT performance-counter register.
pub const XAPIC_LVT_PMI: u64 = 0x340;
/// xAPIC MMIO offset of the spurious-interrupt vector register.
pub const XAPIC_SVR: u64 = 0xF0;
/// x2APIC MSR of the spurious-interrupt vector register.
pub const X2APIC_SVR: u32 = 0x80F;
/// SVR\[8\]: APIC software enable.
pub const SVR_ENABLE: u32 = 1 << 8;

/// How the LVT performance-counter entry is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LvtAccess {
    /// xAPIC mode: a 32-bit register in the MMIO window at `base`.
    XApic {
        /// Physical (identity-mapped) base of the APIC window.
        base: u64,
    },
    /// x2APIC mode: MSR 0x834.
    X2Apic,
}

impl LvtAccess {
    /// The access path for an IA32_APIC_BASE value; `None` when the local
    /// APIC is globally disabled (no PMI can be delivered then).
    pub fn from_apic_base(apic_base: u64) -> Option<Self> {
        if apic_base & APIC_BASE_ENABLE == 0 {
            return None;
        }
        if apic_base & APIC_BASE_EXTD != 0 {
            Some(LvtAccess::X2Apic)
        } else {
            Some(LvtAccess::XApic {
                base: apic_base & 0x000F_FFFF_FFFF_F000,
            })
        }
    }
}

/// The running CPU's PMU: MSRs and the LVT performance-counter entry.
#[derive(Debug)]
pub struct CpuPmu {
    msr: CpuMsr,
    lvt: LvtAccess,
}

impl CpuPmu {
    /// The running CPU's PMU, or `None` when its local APIC is globally
    /// disabled.
    ///
    /// # Safety
    /// 1. The obligations of [`CpuMsr::new`]: CPL 0, only MSRs this CPU
    ///    implements are named (detected through CPUID, never probed), and
    ///    the caller owns the PMU state of this CPU.
    /// 2. In xAPIC mode the APIC window at IA32_APIC_BASE is identity-mapped,
    ///    uncached and writable.
    /// 3. Nothing else programs the LVT performance-counter entry while this
    ///    value is in use, except an NMI handler with a handle of its own
    ///    that leaves the entry as the interrupted user expects.
    pub unsafe fn new() -> Option<Self> {
        // SAFETY: obligation 1 of this function is `CpuMsr::new`'s contract.
        let mut msr = unsafe { CpuMsr::new() };
        // IA32_APIC_BASE is architectural on every x86-64 CPU.
        let lvt = LvtAccess::from_apic_base(msr.read(IA32_APIC_BASE))?;
        Some(CpuPmu { msr, lvt })
    }

    /// How the LVT entry is reached.
    pub fn lvt_access(&self) -> LvtAccess {
        self.lvt
    }

    fn xapic_reg(base: u64, off: u64) -> *mut u32 {
        (base + off) as *mut u32
    }

    /// The LVT performance-counter entry as it reads now (the mask bit shows
    /// whether a PMI was delivered and not re-armed).
    pub fn read_lvt_pmi(&mut self) -> u32 {
        match self.lvt {
            // SAFETY: obligation 2 of `new`: the window is mapped uncached;
            // 0x340 is the LVT performance-counter register.
            LvtAccess::XApic { base } => unsafe {
                core::ptr::read_volatile(Self::xapic_reg(base, XAPIC_LVT_PMI))
            },
            LvtAccess::X2Apic => self.msr.read(addr::X2APIC_LVT_PMI) as u32,
        }
    }

    /// Software-enables the local APIC (SVR bit 8, spurious vector 0xFF)
    /// when it is not already: an LVT entry delivers nothing otherwise.
    /// Leaves every other LVT entry as it is.
    pub fn software_enable(&mut self) {
        match self.lvt {
            LvtAccess::XApic { base } => {
                let svr = Self::xapic_reg(base, XAPIC_SVR);
                // SAFETY: obligation 2 of `new`; SVR is at 0xF0.
                unsafe {
                    let v = core::ptr::read_volatile(svr);
                    if v & SVR_ENABLE == 0 {
                        core::ptr::write_volatile(svr, v | SVR_ENABLE | 0xFF);
                    }
                }
            }
            LvtAccess::X2Apic => {
                let v = self.msr.read(X2APIC_SVR);
                if v & u64::from(SVR_ENABLE) == 0 {
                    self.msr.write(X2APIC_SVR, v | u64::from(SVR_ENABLE) | 0xFF);
                }
            }
        }
    }

    /// Masks the LVT performance-counter entry (no more PMIs).
    pub fn mask_lvt_pmi(&mut self) {
        self.write_lvt_pmi(LVT_MASKED);
    }
}

impl Msr for CpuPmu {
    fn read(&mut self, a: u32) -> u64 {
        self.msr.read(a)
    }

    fn write(&mut self, a: u32, value: u64) {
        self.msr.write(a, value)
    }
}

impl Lvt for CpuPmu {
    fn write_lvt_pmi(&mut self, entry: u32) {
        match self.lvt {
            // SAFETY: obligation 2 of `new`: the window is mapped uncached and
            // writable; obligation 3: this handle owns the entry.
            LvtAccess::XApic { base } => unsafe {
                core::ptr::write_volatile(Self::xapic_reg(base, XAPIC_LVT_PMI), entry)
            },
            LvtAccess::X2Apic => self.msr.write(addr::X2APIC_LVT_PMI, u64::from(entry)),
        }
    }
}

/// Instructions [`workload`] retires per iteration.
pub const WORKLOAD_INSTRUCTIONS_PER_ITERATION: u64 = 2;

/// A workload of known size for the start-up check: retires
/// `2 * iterations` instructions (plus a handful around the loop) in the
/// current mode, touching no memory. It is not marked `nomem`, so the
/// compiler keeps memory accesses (e.g. publishing a driver to the NMI
/// handler) on their side of it.
#[inline(never)]
pub fn workload(iterations: u64) {
    if iterations == 0 {
        return;
    }
    // SAFETY: a register-only countdown loop: no memory, no stack, and it
    // ends because `n` starts above 0 and drops by one each time round.
    unsafe {
        core::arch::asm!(
            "2:",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) iterations => _,
            options(nostack),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lvt_access_follows_apic_base() {
        // Reset value on most parts: enabled, BSP, xAPIC at 0xFEE0_0000.
        assert_eq!(
            LvtAccess::from_apic_base(0xFEE0_0900),
            Some(LvtAccess::XApic { base: 0xFEE0_0000 })
        );
        assert_eq!(
            LvtAccess::from_apic_base(0xFEE0_0D00),
            Some(LvtAccess::X2Apic)
        );
        assert_eq!(LvtAccess::from_apic_base(0xFEE0_0100), None);
        assert_eq!(XAPIC_LVT_PMI, 0x340);
        assert_eq!(addr::X2APIC_LVT_PMI, 0x800 + (XAPIC_LVT_PMI >> 4) as u32);
        assert_eq!(X2APIC_SVR, 0x800 + (XAPIC_SVR >> 4) as u32);
    }

    #[test]
    fn workload_ends() {
        workload(0);
        workload(1000);
    }
}
