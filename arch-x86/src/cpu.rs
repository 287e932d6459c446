//! Small CPU primitives: control registers, TSC, descriptor-table readback,
//! SMAP user-access toggles and CPUID feature checks.

/// CR0.WP.
pub const CR0_WP: u64 = 1 << 16;
/// CR4.SMEP.
pub const CR4_SMEP: u64 = 1 << 20;
/// CR4.SMAP.
pub const CR4_SMAP: u64 = 1 << 21;
/// EFER.SCE.
pub const EFER_SCE: u64 = 1 << 0;
/// EFER.LME: long mode enable (active once paging is on).
pub const EFER_LME: u64 = 1 << 8;
/// EFER.NXE.
pub const EFER_NXE: u64 = 1 << 11;
/// RFLAGS.IF.
pub const RFLAGS_IF: u64 = 1 << 9;
/// RFLAGS.AC.
pub const RFLAGS_AC: u64 = 1 << 18;

/// A descriptor-table register value as `sgdt`/`sidt` store it.
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TablePointer {
    /// Limit (size - 1).
    pub limit: u16,
    /// Linear base.
    pub base: u64,
}

/// CPU features the runtime cares about.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features {
    /// No-execute pages.
    pub nx: bool,
    /// Supervisor-mode execution prevention.
    pub smep: bool,
    /// Supervisor-mode access prevention.
    pub smap: bool,
    /// 1 GiB pages (CPUID 0x8000_0001 EDX bit 26).
    pub page1g: bool,
    /// RDRAND.
    pub rdrand: bool,
    /// SSE4.2, whose `crc32` instruction computes CRC-32C
    /// ([`crate::crc32c`]).
    pub sse42: bool,
}

impl Features {
    /// Set in [`Features::bits`]: the features were read.
    const KNOWN: u8 = 1 << 7;

    /// The features as bits, with [`Features::KNOWN`] set.
    fn bits(self) -> u8 {
        Self::KNOWN
            | u8::from(self.nx)
            | u8::from(self.smep) << 1
            | u8::from(self.smap) << 2
            | u8::from(self.page1g) << 3
            | u8::from(self.rdrand) << 4
            | u8::from(self.sse42) << 5
    }

    /// The features `bits` ([`Features::bits`]) hold, if they were read.
    fn from_bits(bits: u8) -> Option<Self> {
        (bits & Self::KNOWN != 0).then_some(Features {
            nx: bits & 1 != 0,
            smep: bits & 1 << 1 != 0,
            smap: bits & 1 << 2 != 0,
            page1g: bits & 1 << 3 != 0,
            rdrand: bits & 1 << 4 != 0,
            sse42: bits & 1 << 5 != 0,
        })
    }
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use super::*;
    use core::arch::asm;
    use core::sync::atomic::{AtomicU8, Ordering};

    /// The features, read from CPUID once: in a virtual machine every
    /// CPUID is an exit to the hypervisor, and the runtime asks on paths as
    /// hot as `getrandom`. Every CPU reports the same features.
    pub fn features() -> Features {
        let known = FEATURES.load(Ordering::Relaxed);
        if let Some(f) = Features::from_bits(known) {
            return f;
        }
        let f = read_features();
        FEATURES.store(f.bits(), Ordering::Relaxed);
        f
    }

    /// [`Features::bits`] of the features once read, else 0.
    static FEATURES: AtomicU8 = AtomicU8::new(0);

    /// Reads the features from CPUID.
    fn read_features() -> Features {
        let id = raw_cpuid::CpuId::new();
        let ext = id.get_extended_feature_info();
        Features {
            nx: id
                .get_extended_processor_and_feature_identifiers()
                .is_some_and(|f| f.has_execute_disable()),
            smep: ext.as_ref().is_some_and(|f| f.has_smep()),
            smap: ext.as_ref().is_some_and(|f| f.has_smap()),
            page1g: id
                .get_extended_processor_and_feature_identifiers()
                .is_some_and(|f| f.has_1gib_pages()),
            rdrand: id.get_feature_info().is_some_and(|f| f.has_rdrand()),
            sse42: id.get_feature_info().is_some_and(|f| f.has_sse42()),
        }
    }

    /// Reads the TSC.
    pub fn rdtsc() -> u64 {
        // SAFETY: rdtsc has no side effects (CR4.TSD only restricts ring 3).
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    macro_rules! read_cr {
        ($name:ident, $reg:literal) => {
            /// Reads the control register.
            pub fn $name() -> u64 {
                let v: u64;
                // SAFETY: reading a control register in ring 0 has no side effects.
                unsafe { asm!(concat!("mov {}, ", $reg), out(reg) v, options(nomem, nostack)) };
                v
            }
        };
    }
    read_cr!(cr0, "cr0");
    read_cr!(cr2, "cr2");
    read_cr!(cr3, "cr3");
    read_cr!(cr4, "cr4");

    /// Writes CR4.
    ///
    /// # Safety
    /// The new value must only enable features the CPU has and the runtime is ready for.
    pub unsafe fn write_cr4(v: u64) {
        // SAFETY: forwarded from the caller.
        unsafe { asm!("mov cr4, {}", in(reg) v, options(nostack)) };
    }

    /// Switches to the page tables at `pml4`.
    ///
    /// # Safety
    /// `pml4` must be a valid PML4 that maps all code and data in use.
    pub unsafe fn write_cr3(pml4: u64) {
        // SAFETY: forwarded from the caller.
        unsafe { asm!("mov cr3, {}", in(reg) pml4, options(nostack)) };
    }

    /// The current RFLAGS.
    pub fn rflags() -> u64 {
        let v: u64;
        // SAFETY: pushfq/pop only touch the stack.
        unsafe { asm!("pushfq", "pop {}", out(reg) v, options(nomem)) };
        v
    }

    /// The GDTR.
    pub fn sgdt() -> TablePointer {
        let mut p = TablePointer::default();
        // SAFETY: sgdt writes 10 bytes into `p`.
        unsafe { asm!("sgdt [{}]", in(reg) &mut p, options(nostack)) };
        p
    }

    /// The IDTR.
    pub fn sidt() -> TablePointer {
        let mut p = TablePointer::default();
        // SAFETY: sidt writes 10 bytes into `p`.
        unsafe { asm!("sidt [{}]", in(reg) &mut p, options(nostack)) };
        p
    }

    /// The task register.
    pub fn str() -> u16 {
        let v: u16;
        // SAFETY: str only reads TR.
        unsafe { asm!("str {:x}", out(reg) v, options(nomem, nostack)) };
        v
    }

    /// The current CS.
    pub fn cs() -> u16 {
        let v: u16;
        // SAFETY: reading a segment register has no side effects.
        unsafe { asm!("mov {:x}, cs", out(reg) v, options(nomem, nostack)) };
        v
    }

    /// Allows supervisor access to user pages (`stac`).
    ///
    /// # Safety
    /// The CPU must support SMAP; the caller must call [`clac`] when done.
    pub unsafe fn stac() {
        // SAFETY: forwarded from the caller.
        unsafe { asm!("stac", options(nomem, nostack)) };
    }

    /// Forbids supervisor access to user pages again (`clac`).
    ///
    /// # Safety
    /// The CPU must support SMAP.
    pub unsafe fn clac() {
        // SAFETY: forwarded from the caller.
        unsafe { asm!("clac", options(nomem, nostack)) };
    }

    /// Clears IF and returns whether it was set.
    pub fn disable_interrupts() -> bool {
        let flags: u64;
        // SAFETY: reading RFLAGS and clearing IF have no memory effects.
        unsafe { asm!("pushfq", "pop {}", "cli", out(reg) flags) };
        flags & RFLAGS_IF != 0
    }

    /// Sets IF again if `was_enabled`.
    ///
    /// # Safety
    /// Must pair with the [`disable_interrupts`] that returned `was_enabled`.
    pub unsafe fn restore_interrupts(was_enabled: bool) {
        if was_enabled {
            // SAFETY: forwarded from the caller.
            unsafe { asm!("sti", options(nomem, nostack)) };
        }
    }

    /// Halts until the next interrupt or NMI.
    pub fn halt() {
        // SAFETY: hlt only waits; an NMI or interrupt resumes execution.
        unsafe { asm!("hlt", options(nomem, nostack)) };
    }
}

#[cfg(target_arch = "x86_64")]
pub use imp::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_pointer_layout() {
        assert_eq!(core::mem::size_of::<TablePointer>(), 10);
    }

    #[test]
    fn features_round_trip_through_their_bits() {
        assert_eq!(Features::from_bits(0), None);
        for b in 0..64u8 {
            let f = Features {
                nx: b & 1 != 0,
                smep: b & 2 != 0,
                smap: b & 4 != 0,
                page1g: b & 8 != 0,
                rdrand: b & 16 != 0,
                sse42: b & 32 != 0,
            };
            assert_eq!(f.bits(), b | Features::KNOWN);
            assert_eq!(Features::from_bits(f.bits()), Some(f));
        }
    }

    #[test]
    fn bits() {
        assert_eq!(CR4_SMEP | CR4_SMAP, 0x30_0000);
        assert_eq!(EFER_NXE | EFER_SCE, 0x801);
    }
}
