//! The HPET: taken out of legacy-replacement routing when the PIT drives the
//! NMI clock (legacy routing would steal the PIT's interrupt line), or run as
//! the NMI clock itself for rates the PIT cannot give (above about 596 kHz):
//! timer 0 in legacy-replacement mode, so it drives ISA IRQ 0 (the I/O APIC's
//! pin 2) in place of the PIT.
//!
//! Timer 0 runs one-shot, its comparator moved one period on from each NMI
//! ([`set_comparator`]): QEMU's periodic mode (7.2) fires twice per period when
//! the counter meets the comparator exactly, as it always does under `-icount`.

/// The usual HPET base on PC chipsets and QEMU.
pub const DEFAULT_BASE: u64 = 0xfed0_0000;

/// General capabilities and ID register.
const CAPS: u64 = 0x00;
/// General configuration register.
const CONFIG: u64 = 0x10;
/// Main counter.
const COUNTER: u64 = 0xf0;
/// Timer 0 configuration and capabilities.
const T0_CONFIG: u64 = 0x100;
/// Timer 0 comparator.
const T0_COMPARATOR: u64 = 0x108;

/// CONFIG: the main counter runs.
const ENABLE_CNF: u64 = 1 << 0;
/// CONFIG: legacy replacement (timer 0 -> IRQ 0, timer 1 -> IRQ 8).
const LEG_RT_CNF: u64 = 1 << 1;
/// Tn config: interrupts enabled.
const TN_INT_ENB_CNF: u64 = 1 << 2;
/// Tn config: periodic.
const TN_TYPE_CNF: u64 = 1 << 3;
/// Tn config: the next comparator write sets the period's accumulator.
const TN_VAL_SET_CNF: u64 = 1 << 6;

/// The counter period in femtoseconds from the capabilities register, if
/// they look like an HPET's (a vendor, a period of at most 100 ns).
pub fn period_fs(caps: u64) -> Option<u64> {
    let vendor = caps >> 16 & 0xffff;
    let period = caps >> 32;
    if caps == u64::MAX || caps == 0 || vendor == 0 || period == 0 || period > 100_000_000 {
        return None;
    }
    Some(period)
}

/// A periodic rate the HPET gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HpetRate {
    /// Counter ticks per period (written to the comparator).
    pub ticks: u64,
    /// Actual rate in millihertz.
    pub actual_mhz: u64,
}

/// The period closest to `hz` for a counter of `period_fs` femtoseconds per
/// tick; `None` for 0 Hz or a rate above the counter's own.
pub fn rate_for(hz: u32, period_fs: u64) -> Option<HpetRate> {
    if hz == 0 || period_fs == 0 {
        return None;
    }
    let counter_hz = 1_000_000_000_000_000u64 / period_fs;
    let hz = u64::from(hz);
    let ticks = (counter_hz + hz / 2) / hz;
    if ticks == 0 {
        return None;
    }
    Some(HpetRate {
        ticks,
        actual_mhz: (1_000_000_000_000_000_000u128 / (u128::from(period_fs) * u128::from(ticks)))
            as u64,
    })
}

/// Reads register `reg`.
///
/// # Safety
/// 1. `base` must be the virtual address of uncached MMIO that is an HPET (or
///    reads as all ones / zeros: no device), and `reg` one of its registers.
unsafe fn read(base: u64, reg: u64) -> u64 {
    // SAFETY: (1): `base + reg` is an HPET register.
    unsafe { core::ptr::read_volatile((base + reg) as *const u64) }
}

/// Writes register `reg`.
///
/// # Safety
/// 1. As (1) of [`read`].
/// 2. The write must leave the HPET in a state its users expect.
unsafe fn write(base: u64, reg: u64, v: u64) {
    // SAFETY: (1): `base + reg` is an HPET register; (2) is the caller's.
    unsafe { core::ptr::write_volatile((base + reg) as *mut u64, v) }
}

/// Clears LEG_RT_CNF if a plausible HPET answers at `base`. Returns whether one did.
///
/// # Safety
/// 1. `base` must be the virtual address of uncached MMIO (the direct map) that is an HPET or
///    reads as all ones / zeros (no device).
pub unsafe fn disable_legacy_routing(base: u64) -> bool {
    // SAFETY: (1): the capabilities register is at +0.
    let caps = unsafe { read(base, CAPS) };
    if period_fs(caps).is_none() {
        return false;
    }
    // SAFETY: (1), an HPET answered; leaving legacy replacement only gives
    // the PIT its line back.
    unsafe { write(base, CONFIG, read(base, CONFIG) & !LEG_RT_CNF) };
    true
}

/// Why the HPET cannot run the clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HpetError {
    /// No HPET answers at the base.
    Absent,
    /// The rate is 0 or above the counter's.
    Rate,
}

/// Starts timer 0 at about `hz`: one-shot, first expiry one period after a
/// counter restarted from 0, in legacy-replacement mode (it then drives ISA
/// IRQ 0, and the PIT's output is disconnected). The caller moves the
/// comparator on by `ticks` at each expiry ([`set_comparator`]).
///
/// # Safety
/// 1. `base` must be the virtual address of uncached MMIO (the direct map)
///    that is an HPET or reads as all ones / zeros (no device).
/// 2. Nothing else may use the HPET or ISA IRQ 0 while it runs.
pub unsafe fn start_legacy(base: u64, hz: u32) -> Result<HpetRate, HpetError> {
    // SAFETY: (1): the capabilities register.
    let caps = unsafe { read(base, CAPS) };
    let period = period_fs(caps).ok_or(HpetError::Absent)?;
    let rate = rate_for(hz, period).ok_or(HpetError::Rate)?;
    // SAFETY: (1), an HPET answered; (2) nobody else programs it.
    unsafe {
        let t0 = read(base, T0_CONFIG);
        let cfg = read(base, CONFIG) & !(ENABLE_CNF | LEG_RT_CNF);
        write(base, CONFIG, cfg);
        write(base, COUNTER, 0);
        // Edge-triggered, 64-bit, one-shot, interrupts on.
        write(
            base,
            T0_CONFIG,
            (t0 & !(0x1f << 9) & !(1 << 1) & !(1 << 8) & !TN_TYPE_CNF & !TN_VAL_SET_CNF)
                | TN_INT_ENB_CNF,
        );
        write(base, T0_COMPARATOR, rate.ticks);
        write(base, CONFIG, cfg | ENABLE_CNF | LEG_RT_CNF);
    }
    Ok(rate)
}

/// Sets timer 0's next expiry to main-counter value `at` (one already past
/// fires at once).
///
/// # Safety
/// As [`start_legacy`], which must have found the HPET at `base`. NMI-safe
/// (one MMIO write).
#[inline]
pub unsafe fn set_comparator(base: u64, at: u64) {
    // SAFETY: (1) and (2) of the caller.
    unsafe { write(base, T0_COMPARATOR, at) }
}

/// The main counter. NMI-safe (one MMIO read).
///
/// # Safety
/// As [`start_legacy`], which must have found the HPET at `base`.
#[inline]
pub unsafe fn counter(base: u64) -> u64 {
    // SAFETY: (1) of the caller: the main counter register.
    unsafe { read(base, COUNTER) }
}

/// Stops the main counter and timer 0's interrupts, and leaves legacy
/// replacement (the PIT has its line back).
///
/// # Safety
/// As [`start_legacy`].
pub unsafe fn stop(base: u64) {
    // SAFETY: (1) of the caller.
    let caps = unsafe { read(base, CAPS) };
    if period_fs(caps).is_none() {
        return;
    }
    // SAFETY: an HPET answered; (2).
    unsafe {
        write(base, T0_CONFIG, read(base, T0_CONFIG) & !TN_INT_ENB_CNF);
        write(
            base,
            CONFIG,
            read(base, CONFIG) & !(ENABLE_CNF | LEG_RT_CNF),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu_hpet_rates() {
        // QEMU's HPET: 10 ns per tick (100 MHz).
        let caps = (10_000_000u64 << 32) | (0x8086 << 16) | 0x01;
        let p = period_fs(caps).unwrap();
        assert_eq!(p, 10_000_000);
        assert_eq!(
            rate_for(1_000_000, p),
            Some(HpetRate {
                ticks: 100,
                actual_mhz: 1_000_000_000
            })
        );
        let r = rate_for(3000, p).unwrap();
        assert_eq!(r.ticks, 33_333);
        assert_eq!(r.actual_mhz, 3_000_030);
        assert_eq!(rate_for(0, p), None);
        // Above the counter's own rate.
        assert_eq!(rate_for(300_000_000, p), None);
    }

    #[test]
    fn absent_or_implausible_hpets() {
        assert_eq!(period_fs(0), None);
        assert_eq!(period_fs(u64::MAX), None);
        // No vendor.
        assert_eq!(period_fs(10_000_000u64 << 32), None);
        // A period above 100 ns.
        assert_eq!(period_fs((100_000_001u64 << 32) | (0x8086 << 16)), None);
        // A 14.318 MHz HPET (69.84 ns).
        let p = period_fs((69_841_279u64 << 32) | (0x8086 << 16)).unwrap();
        assert_eq!(rate_for(1_000_000, p).unwrap().ticks, 14);
    }
}
