//! The local APIC in either mode firmware may leave it in: xAPIC (an MMIO
//! window) or x2APIC (MSRs 0x800 + offset / 16, SDM vol. 3 "x2APIC Register
//! Address Space"). Enable it, mask its local interrupts, read its ID, and
//! reach the performance-counter LVT entry the PMU drivers program.

/// IA32_APIC_BASE.
pub const IA32_APIC_BASE: u32 = 0x1b;
/// IA32_APIC_BASE\[11\]: the local APIC is globally enabled.
pub const APIC_BASE_ENABLE: u64 = 1 << 11;
/// IA32_APIC_BASE\[10\]: x2APIC mode (MMIO accesses then do nothing).
pub const APIC_BASE_EXTD: u64 = 1 << 10;

/// xAPIC offset of the ID register.
pub const ID: u64 = 0x20;
/// xAPIC offset of the spurious-interrupt vector register.
pub const SVR: u64 = 0xf0;
/// SVR\[8\]: APIC software enable.
pub const SVR_ENABLE: u32 = 1 << 8;
/// xAPIC offset of the LVT timer entry.
pub const LVT_TIMER: u64 = 0x320;
/// xAPIC offset of the end-of-interrupt register.
pub const EOI: u64 = 0xb0;
/// xAPIC offset of the timer's initial-count register.
pub const TIMER_INITIAL: u64 = 0x380;
/// xAPIC offset of the timer's current-count register.
pub const TIMER_CURRENT: u64 = 0x390;
/// xAPIC offset of the timer's divide-configuration register.
pub const TIMER_DIVIDE: u64 = 0x3e0;
/// Divide configuration value for divide by 16 (SDM: bits 0, 1, 3 = 0b011).
pub const TIMER_DIVIDE_16: u32 = 0b0011;
/// LVT timer mode bit 17: periodic.
pub const TIMER_PERIODIC: u32 = 1 << 17;
/// LVT mask bit.
pub const LVT_MASKED: u32 = 1 << 16;

/// The LVT timer entry for a fixed-delivery interrupt on `vector`.
pub const fn timer_entry(vector: u8, periodic: bool) -> u32 {
    vector as u32 | if periodic { TIMER_PERIODIC } else { 0 }
}

/// xAPIC offset of the LVT performance-counter entry.
pub const LVT_PMI: u64 = 0x340;
/// xAPIC offset of the LVT LINT0 entry.
pub const LVT_LINT0: u64 = 0x350;
/// xAPIC offset of the LVT LINT1 entry.
pub const LVT_LINT1: u64 = 0x360;
/// xAPIC offset of the LVT error entry.
pub const LVT_ERROR: u64 = 0x370;

/// xAPIC offset of the interrupt command register's low half (in x2APIC
/// mode the whole ICR is one 64-bit MSR, 0x830).
pub const ICR_LOW: u64 = 0x300;
/// xAPIC offset of the ICR's high half (the destination in bits 31:24).
pub const ICR_HIGH: u64 = 0x310;
/// ICR delivery mode NMI.
pub const ICR_NMI: u32 = 4 << 8;
/// ICR delivery mode INIT.
pub const ICR_INIT: u32 = 5 << 8;
/// ICR delivery mode start-up (SIPI).
pub const ICR_STARTUP: u32 = 6 << 8;
/// ICR\[12\]: delivery status, send pending (xAPIC only).
pub const ICR_PENDING: u32 = 1 << 12;
/// ICR\[14\]: level assert (INIT and SIPI are sent asserted).
pub const ICR_ASSERT: u32 = 1 << 14;

/// The ICR's low half for an INIT IPI (SDM vol. 3 "MP Initialization
/// Example": level-asserted INIT to one processor).
pub const fn icr_init() -> u32 {
    ICR_INIT | ICR_ASSERT
}

/// The ICR's low half for a start-up IPI that starts the target in real
/// mode at physical `page * 4096` (`page` below 0x100, so the code is in
/// the first MiB).
pub const fn icr_startup(page: u8) -> u32 {
    ICR_STARTUP | ICR_ASSERT | page as u32
}

/// The ICR's low half for a fixed interrupt on `vector`.
pub const fn icr_fixed(vector: u8) -> u32 {
    ICR_ASSERT | vector as u32
}

/// The x2APIC MSR of the register at xAPIC MMIO offset `off`.
pub const fn x2apic_msr(off: u64) -> u32 {
    0x800 + (off >> 4) as u32
}

/// How the registers are reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApicMode {
    /// xAPIC: 32-bit registers in the MMIO window at `base`.
    XApic {
        /// Physical base of the window (reached through the direct map).
        base: u64,
    },
    /// x2APIC: MSR `0x800 + offset / 16`.
    X2Apic,
}

impl ApicMode {
    /// The mode an IA32_APIC_BASE value describes, whether or not the APIC
    /// is globally enabled.
    pub const fn of(apic_base: u64) -> Self {
        if apic_base & APIC_BASE_EXTD != 0 {
            ApicMode::X2Apic
        } else {
            ApicMode::XApic {
                base: apic_base & 0x000f_ffff_ffff_f000,
            }
        }
    }

    /// Like [`of`](Self::of), but `None` when the APIC is globally disabled
    /// (it then delivers nothing).
    pub const fn of_enabled(apic_base: u64) -> Option<Self> {
        if apic_base & APIC_BASE_ENABLE == 0 {
            None
        } else {
            Some(Self::of(apic_base))
        }
    }
}

/// A local APIC, in xAPIC or x2APIC mode.
#[derive(Debug, Clone, Copy)]
pub struct LocalApic {
    mode: ApicMode,
}

impl LocalApic {
    /// The APIC reached as `mode` says.
    ///
    /// # Safety
    /// Ring 0; `mode` is this CPU's (from its IA32_APIC_BASE), and in xAPIC
    /// mode its window is reached through the direct map, uncached.
    pub const unsafe fn new(mode: ApicMode) -> Self {
        Self { mode }
    }

    /// The boot CPU's local APIC, in the mode IA32_APIC_BASE reports.
    ///
    /// # Safety
    /// Ring 0; in xAPIC mode the APIC window is reached through the direct map, uncached.
    #[cfg(target_arch = "x86_64")]
    pub unsafe fn from_msr() -> Self {
        // SAFETY: IA32_APIC_BASE exists on every x86-64 CPU; ring 0 per
        // this function's contract.
        let v = unsafe { x86::msr::rdmsr(IA32_APIC_BASE) };
        Self {
            mode: ApicMode::of(v),
        }
    }

    /// How the registers are reached.
    pub fn mode(&self) -> ApicMode {
        self.mode
    }

    /// Reads the register at xAPIC offset `off`.
    #[cfg(target_arch = "x86_64")]
    pub fn read(&self, off: u64) -> u32 {
        match self.mode {
            // SAFETY: `off` is a register of the SDM's xAPIC map inside the
            // window, which the direct map covers (the constructor's caller
            // guarantees it is mapped uncached).
            ApicMode::XApic { base } => unsafe {
                core::ptr::read_volatile(crate::paging::phys_to_virt(base + off) as *const u32)
            },
            // SAFETY: in x2APIC mode every xAPIC register used here has its
            // MSR at 0x800 + off / 16; ring 0 per the constructor.
            ApicMode::X2Apic => unsafe { x86::msr::rdmsr(x2apic_msr(off)) as u32 },
        }
    }

    /// Writes the register at xAPIC offset `off`.
    #[cfg(target_arch = "x86_64")]
    pub fn write(&self, off: u64, value: u32) {
        match self.mode {
            // SAFETY: as in `read`.
            ApicMode::XApic { base } => unsafe {
                core::ptr::write_volatile(
                    crate::paging::phys_to_virt(base + off) as *mut u32,
                    value,
                )
            },
            // SAFETY: as in `read`.
            ApicMode::X2Apic => unsafe { x86::msr::wrmsr(x2apic_msr(off), u64::from(value)) },
        }
    }

    /// The APIC ID (its low 8 bits in x2APIC mode, where it is 32 bits wide).
    #[cfg(target_arch = "x86_64")]
    pub fn id(&self) -> u8 {
        let v = self.read(ID);
        match self.mode {
            ApicMode::X2Apic => v as u8,
            ApicMode::XApic { .. } => (v >> 24) as u8,
        }
    }

    /// The full APIC ID: 32 bits in x2APIC mode, 8 in xAPIC mode (the
    /// MADT's x2APIC entries give IDs of 255 and above).
    #[cfg(target_arch = "x86_64")]
    pub fn id32(&self) -> u32 {
        let v = self.read(ID);
        match self.mode {
            ApicMode::X2Apic => v,
            ApicMode::XApic { .. } => v >> 24,
        }
    }

    /// Sends the inter-processor interrupt `low` (an `icr_*` value) to the
    /// CPU with APIC ID `dest`, and waits until the APIC has sent it (in
    /// xAPIC mode the delivery-status bit clears; in x2APIC mode the write
    /// itself is the send). An xAPIC reaches IDs up to 255 only.
    #[cfg(target_arch = "x86_64")]
    pub fn send_ipi(&self, dest: u32, low: u32) {
        match self.mode {
            ApicMode::XApic { .. } => {
                self.write(ICR_HIGH, dest << 24);
                self.write(ICR_LOW, low);
                while self.read(ICR_LOW) & ICR_PENDING != 0 {
                    core::hint::spin_loop();
                }
            }
            // SAFETY: in x2APIC mode the ICR is MSR 0x830, destination in
            // bits 63:32 (SDM vol. 3 "Interrupt Command Register (ICR)");
            // ring 0 per the constructor.
            ApicMode::X2Apic => unsafe {
                x86::msr::wrmsr(
                    x2apic_msr(ICR_LOW),
                    (u64::from(dest) << 32) | u64::from(low),
                )
            },
        }
    }

    /// Sends an NMI IPI to the APIC `dest` from NMI context, where the
    /// interrupted code may be half-way through [`Self::send_ipi`]: in
    /// xAPIC mode the ICR's high half (the destination) is read first and
    /// put back after, so an interrupted sender that wrote its destination
    /// but not yet its command still sends where it meant to. x2APIC writes
    /// the ICR in one MSR write, so it has nothing to keep.
    #[cfg(target_arch = "x86_64")]
    pub fn send_nmi_keeping_icr(&self, dest: u32) {
        match self.mode {
            ApicMode::XApic { .. } => {
                let high = self.read(ICR_HIGH);
                while self.read(ICR_LOW) & ICR_PENDING != 0 {
                    core::hint::spin_loop();
                }
                self.write(ICR_HIGH, dest << 24);
                self.write(ICR_LOW, ICR_NMI | ICR_ASSERT);
                while self.read(ICR_LOW) & ICR_PENDING != 0 {
                    core::hint::spin_loop();
                }
                self.write(ICR_HIGH, high);
            }
            ApicMode::X2Apic => self.send_ipi(dest, ICR_NMI | ICR_ASSERT),
        }
    }

    /// Software-enables the APIC (SVR bit 8, spurious vector 0xff) when it
    /// is not already: an LVT entry delivers nothing otherwise.
    #[cfg(target_arch = "x86_64")]
    pub fn software_enable(&self) {
        let v = self.read(SVR);
        if v & SVR_ENABLE == 0 {
            self.write(SVR, v | SVR_ENABLE | 0xff);
        }
    }

    /// Software-enables the APIC and masks the timer, LINT0, the error and
    /// (unless `keep_pmi`) the performance-counter LVT entries; LINT1 stays
    /// an NMI input.
    #[cfg(target_arch = "x86_64")]
    pub fn enable_masked(&self, keep_pmi: bool) {
        self.write(SVR, 0x1ff);
        for off in [LVT_TIMER, LVT_PMI, LVT_LINT0, LVT_ERROR] {
            if keep_pmi && off == LVT_PMI {
                continue;
            }
            self.write(off, 1 << 16);
        }
        self.write(LVT_LINT1, 4 << 8);
    }

    /// Signals the end of a fixed-delivery interrupt.
    #[cfg(target_arch = "x86_64")]
    pub fn eoi(&self) {
        self.write(EOI, 0);
    }

    /// Starts the timer on `vector` with `count` ticks (of the bus clock
    /// divided by 16) per period, or once when not `periodic`.
    #[cfg(target_arch = "x86_64")]
    pub fn start_timer(&self, vector: u8, count: u32, periodic: bool) {
        self.write(TIMER_DIVIDE, TIMER_DIVIDE_16);
        self.write(LVT_TIMER, timer_entry(vector, periodic));
        self.write(TIMER_INITIAL, count);
    }

    /// Stops and masks the timer.
    #[cfg(target_arch = "x86_64")]
    pub fn stop_timer(&self) {
        self.write(LVT_TIMER, LVT_MASKED);
        self.write(TIMER_INITIAL, 0);
    }

    /// The timer's current count.
    #[cfg(target_arch = "x86_64")]
    pub fn timer_current(&self) -> u32 {
        self.read(TIMER_CURRENT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_registers_follow_the_sdm() {
        assert_eq!(x2apic_msr(TIMER_INITIAL), 0x838);
        assert_eq!(x2apic_msr(TIMER_CURRENT), 0x839);
        assert_eq!(x2apic_msr(TIMER_DIVIDE), 0x83e);
        assert_eq!(x2apic_msr(EOI), 0x80b);
        assert_eq!(timer_entry(0x20, true), 0x2_0020);
        assert_eq!(timer_entry(0x20, false), 0x20);
    }

    #[test]
    fn x2apic_msrs_follow_the_sdm_map() {
        assert_eq!(x2apic_msr(ID), 0x802);
        assert_eq!(x2apic_msr(SVR), 0x80f);
        assert_eq!(x2apic_msr(LVT_PMI), 0x834);
        assert_eq!(x2apic_msr(LVT_PMI), crate::msr::addr::X2APIC_LVT_PMI);
        assert_eq!(x2apic_msr(LVT_LINT1), 0x836);
    }

    #[test]
    fn ipi_commands_follow_the_sdm() {
        // SDM vol. 3 "MP Initialization Example": INIT is 0x000C4500 with
        // the all-excluding-self shorthand, a SIPI to page 9 0x000C4609;
        // without the shorthand both keep their low bits.
        assert_eq!(icr_init(), 0x4500);
        assert_eq!(icr_startup(0x09), 0x4609);
        assert_eq!(icr_fixed(0xf0), 0x40f0);
        assert_eq!(x2apic_msr(ICR_LOW), 0x830);
        assert_eq!(ICR_NMI | ICR_ASSERT, 0x4400);
    }

    #[test]
    fn mode_follows_apic_base() {
        // Reset value on most parts: enabled, BSP, xAPIC at 0xFEE0_0000.
        assert_eq!(
            ApicMode::of_enabled(0xFEE0_0900),
            Some(ApicMode::XApic { base: 0xFEE0_0000 })
        );
        assert_eq!(ApicMode::of_enabled(0xFEE0_0D00), Some(ApicMode::X2Apic));
        assert_eq!(ApicMode::of_enabled(0xFEE0_0100), None);
        assert_eq!(
            ApicMode::of(0xFEE0_0100),
            ApicMode::XApic { base: 0xFEE0_0000 }
        );
    }
}
