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
use crate::lapic::{self, ApicMode, IA32_APIC_BASE, LocalApic};
use crate::msr::{CpuMsr, Msr};

/// The running CPU's PMU: MSRs and the LVT performance-counter entry.
#[derive(Debug)]
pub struct CpuPmu {
    msr: CpuMsr,
    apic: LocalApic,
}

impl CpuPmu {
    /// The running CPU's PMU, or `None` when its local APIC is globally
    /// disabled.
    ///
    /// # Safety
    /// 1. The obligations of [`CpuMsr::new`]: CPL 0, only MSRs this CPU
    ///    implements are named (detected through CPUID, never probed), and
    ///    the caller owns the PMU state of this CPU.
    /// 2. In xAPIC mode the APIC window at IA32_APIC_BASE is in the direct map,
    ///    uncached and writable.
    /// 3. Nothing else programs the LVT performance-counter entry while this
    ///    value is in use, except an NMI handler with a handle of its own
    ///    that leaves the entry as the interrupted user expects.
    pub unsafe fn new() -> Option<Self> {
        // SAFETY: obligation 1 of this function is `CpuMsr::new`'s contract.
        let mut msr = unsafe { CpuMsr::new() };
        // IA32_APIC_BASE is architectural on every x86-64 CPU.
        let mode = ApicMode::of_enabled(msr.read(IA32_APIC_BASE))?;
        // SAFETY: `mode` is this CPU's; ring 0 and the window per
        // obligations 1 and 2.
        let apic = unsafe { LocalApic::new(mode) };
        Some(CpuPmu { msr, apic })
    }

    /// How the LVT entry is reached.
    pub fn apic_mode(&self) -> ApicMode {
        self.apic.mode()
    }

    /// The LVT performance-counter entry as it reads now (the mask bit shows
    /// whether a PMI was delivered and not re-armed).
    pub fn read_lvt_pmi(&mut self) -> u32 {
        self.apic.read(lapic::LVT_PMI)
    }

    /// Software-enables the local APIC when it is not already: an LVT
    /// entry delivers nothing otherwise. Leaves every LVT entry as it is.
    pub fn software_enable(&mut self) {
        self.apic.software_enable();
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
        // Obligation 3 of `new`: this handle owns the entry.
        self.apic.write(lapic::LVT_PMI, entry);
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
    fn workload_ends() {
        workload(0);
        workload(1000);
    }
}
