//! The NMI clock: a periodic NMI that works without a PMU. The PIT's
//! channel 0 drives ISA IRQ 0, which the I/O APIC (pin 2) delivers as an NMI.

use arch_x86::{hpet, ioapic, lapic, pic, pit};

/// What the clock runs on.
#[derive(Clone, Copy, Debug)]
pub struct ClockInfo {
    /// Human-readable source.
    pub source: &'static str,
    /// The PIT rate actually programmed.
    pub rate: pit::PitRate,
    /// Whether an HPET had to be taken out of legacy routing.
    pub hpet_found: bool,
}

/// Why the clock could not start.
#[derive(Clone, Copy, Debug)]
pub enum ClockError {
    /// The rate is out of the PIT's range.
    Rate(pit::PitError),
}

/// Starts NMIs at about `hz`.
pub fn start(hz: u32) -> Result<ClockInfo, ClockError> {
    let rate = pit::rate_for(hz).map_err(ClockError::Rate)?;
    // SAFETY: standard PC platform resources (8259, HPET window, local APIC,
    // I/O APIC, PIT), all identity mapped uncached by `paging::init`.
    unsafe {
        pic::disable();
        let hpet_found = hpet::disable_legacy_routing(hpet::DEFAULT_BASE);
        let apic = lapic::LocalApic::from_msr();
        apic.enable_masked();
        let io = ioapic::IoApic::new(ioapic::DEFAULT_BASE);
        io.mask_all();
        io.set_redirection(
            ioapic::PIT_PIN,
            ioapic::redirection(ioapic::Delivery::Nmi, 2, apic.id(), false),
        );
        pit::start_channel0(rate);
        Ok(ClockInfo {
            source: "PIT channel 0 -> IOAPIC pin 2 (NMI delivery)",
            rate,
            hpet_found,
        })
    }
}

/// Stops NMI delivery from the clock.
pub fn stop() {
    // SAFETY: as in `start`.
    unsafe {
        ioapic::IoApic::new(ioapic::DEFAULT_BASE).set_redirection(ioapic::PIT_PIN, ioapic::MASKED);
    }
}
