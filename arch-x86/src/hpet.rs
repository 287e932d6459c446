//! The HPET, only as far as taking it out of legacy-replacement routing,
//! which would otherwise steal the PIT's interrupt line.

/// The usual HPET base on PC chipsets and QEMU.
pub const DEFAULT_BASE: u64 = 0xfed0_0000;

/// Clears LEG_RT_CNF if a plausible HPET answers at `base`. Returns whether one did.
///
/// # Safety
/// `base` must be the virtual address of uncached MMIO (the direct map) that is an HPET or reads as
/// all ones / zeros (no device).
pub unsafe fn disable_legacy_routing(base: u64) -> bool {
    // SAFETY: the caller guarantees the window; the capabilities register is at +0.
    let caps = unsafe { core::ptr::read_volatile(base as *const u64) };
    let vendor = caps >> 16 & 0xffff;
    let period = caps >> 32;
    if caps == u64::MAX || caps == 0 || vendor == 0 || period == 0 || period > 100_000_000 {
        return false;
    }
    let cfg = (base + 0x10) as *mut u64;
    // SAFETY: general configuration register of the HPET found above.
    unsafe { core::ptr::write_volatile(cfg, core::ptr::read_volatile(cfg) & !2) };
    true
}
