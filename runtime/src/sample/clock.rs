//! The NMI clock: a periodic NMI that works without a PMU. By default the
//! HPET's timer 0 drives ISA IRQ 0 in legacy-replacement mode, which the
//! I/O APIC (pin 2) delivers as an NMI: one-shot, its comparator moved one
//! period on from the previous expiry at each NMI ([`on_nmi`]), so the rate
//! holds when handlers run late, and ticks missed while the host did not run
//! the machine are skipped, their time carried by the next sample's PERIOD
//! (QEMU's HPET
//! counts at 100 MHz: 4 kHz is exactly 25,000 ticks, 1 MHz 100 ticks, 1,000
//! instructions under `-icount shift=0`). Without an HPET (QEMU's
//! `microvm`), or with `clock=pit`, the PIT's channel 0 drives the line in
//! its periodic mode (up to about 596 kHz: divisor 2).

use arch_x86::paging::phys_to_virt;
use arch_x86::{hpet, ioapic, lapic, pic, pit};
use core::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
pub use kcore::cmdline::ClockSource;

/// True while the clock delivers NMIs.
static RUNNING: AtomicBool = AtomicBool::new(false);

/// True while the clock delivers NMIs (NMI-safe): the PMU path then leaves
/// NMIs without an overflow to the clock instead of counting them unknown.
pub fn running() -> bool {
    RUNNING.load(Ordering::Relaxed)
}

/// What the clock runs on.
#[derive(Clone, Copy, Debug)]
pub struct ClockInfo {
    /// Human-readable source.
    pub source: &'static str,
    /// The PIT divisor or the HPET ticks per period.
    pub divisor: u64,
    /// The rate actually programmed, in mHz.
    pub actual_mhz: u64,
    /// Whether an HPET had to be taken out of legacy routing (PIT source).
    pub hpet_found: bool,
}

/// Why the clock could not start.
#[derive(Clone, Copy, Debug)]
pub enum ClockError {
    /// The rate is out of the PIT's range.
    Rate(pit::PitError),
    /// The rate needs the HPET, which cannot give it.
    Hpet(hpet::HpetError),
}

/// Which device ticks (for `stop` and `on_nmi`).
static ON_HPET: AtomicBool = AtomicBool::new(false);
/// HPET source: the main-counter value of the next expiry, and the period.
static HPET_NEXT: AtomicU64 = AtomicU64::new(0);
static HPET_TICKS: AtomicU64 = AtomicU64::new(0);

/// Called first thing in every NMI (NMI-safe): with the HPET as the source,
/// moves its comparator on one period, on the schedule (not from now, so
/// the rate holds when a handler runs late). When the next expiry on the
/// schedule has already passed (the host did not run the machine for a
/// while), the ticks missed are skipped and the next one is a period from
/// now: one NMI, not a burst of them at the same place, and the next
/// sample's PERIOD (the time since this tick) carries the gap, as Linux's
/// cpu-clock forwards its timer past overruns. Nothing to do for the PIT,
/// which is periodic. `HPET_TICKS` is 0 unless the HPET ticks, so one load
/// decides.
///
/// Only the boot CPU calls it: when the clock's NMIs reach every CPU, the
/// others leave the comparator alone.
#[inline]
pub fn on_nmi() {
    let ticks = HPET_TICKS.load(Ordering::Relaxed);
    if ticks == 0 {
        return;
    }
    let base = phys_to_virt(hpet::DEFAULT_BASE);
    let mut next = HPET_NEXT.load(Ordering::Relaxed) + ticks;
    // SAFETY: `start` found the HPET there and started it; only the boot
    // CPU's NMI path moves the comparator while it runs.
    let now = unsafe { hpet::counter(base) };
    if next <= now {
        next = now + ticks;
    }
    HPET_NEXT.store(next, Ordering::Relaxed);
    // SAFETY: as above.
    unsafe { hpet::set_comparator(base, next) };
}

/// HPET source: how far (in counter ticks) the counter may run past the
/// expiry on the schedule before [`watchdog`] takes the clock for stalled.
static HPET_GRACE: AtomicU64 = AtomicU64::new(0);
/// How many times [`watchdog`] found the clock stalled and re-armed it.
static STALLS: AtomicU64 = AtomicU64::new(0);

/// The boot CPU's scheduler tick (interrupt context, 1 kHz): restarts an
/// HPET clock that stopped. The comparator is one-shot and only the NMI
/// its expiry raises moves it on, so one expiry that raises no NMI stops
/// the clock for good: an edge the I/O APIC drops, or, on hardware whose
/// comparator does not fire once the counter has passed it, a comparator
/// written a moment too late after a long stall of the handler. When the
/// counter is past the scheduled expiry by more than two periods and 2 ms
/// (room for an NMI QEMU raises late), the expiry is taken as lost and the
/// comparator set a period from now; [`stalls`] counts it, and the next
/// sample's PERIOD carries the time without ticks, as after any gap.
///
/// An NMI that moves the comparator while this runs writes a later expiry
/// on the same schedule, so the two writes cannot leave the clock stopped
/// for longer than the next tick.
pub fn watchdog() {
    let grace = HPET_GRACE.load(Ordering::Relaxed);
    let ticks = HPET_TICKS.load(Ordering::Relaxed);
    if grace == 0 || ticks == 0 {
        return;
    }
    let base = phys_to_virt(hpet::DEFAULT_BASE);
    // SAFETY: `start` found the HPET there and started it (`ticks` is not 0
    // until it has); reading the counter has no side effect.
    let now = unsafe { hpet::counter(base) };
    if now <= HPET_NEXT.load(Ordering::Relaxed).saturating_add(grace) {
        return;
    }
    STALLS.fetch_add(1, Ordering::Relaxed);
    let next = now + ticks;
    HPET_NEXT.store(next, Ordering::Relaxed);
    // SAFETY: as above; the comparator is the clock's own, and an NMI that
    // interrupts this leaves a later expiry on the same schedule (see the
    // function's docs).
    unsafe { hpet::set_comparator(base, next) };
}

/// How many times the HPET clock was found stalled and restarted.
pub fn stalls() -> u64 {
    STALLS.load(Ordering::Relaxed)
}

/// For the self-test: stops the HPET clock as an expiry that raises no NMI
/// would (an edge the I/O APIC drops). The comparator is moved 2^40 ticks
/// (hours) past the scheduled expiry, and the counter is let pass that
/// expiry; an NMI meanwhile (one already on its way puts the comparator
/// back on the schedule) makes it try again. `None` when the HPET does not
/// tick (the PIT is periodic and has no expiry to lose), `Some(false)` when
/// no try got through without an NMI.
pub fn drop_next_expiry() -> Option<bool> {
    let ticks = HPET_TICKS.load(Ordering::Relaxed);
    if ticks == 0 {
        return None;
    }
    let base = phys_to_virt(hpet::DEFAULT_BASE);
    for _ in 0..10 {
        let nmis = crate::sample::nmi::nmi_count();
        // SAFETY: `ticks` is not 0, so `start` found and started the HPET;
        // the comparator is the clock's own.
        let give_up = unsafe {
            let now = hpet::counter(base);
            hpet::set_comparator(base, now + (1 << 40));
            now + 100 * ticks
        };
        loop {
            // SAFETY: as above.
            let now = unsafe { hpet::counter(base) };
            if now > HPET_NEXT.load(Ordering::Relaxed) + ticks || now > give_up {
                break;
            }
            core::hint::spin_loop();
        }
        if crate::sample::nmi::nmi_count() == nmis {
            return Some(true);
        }
    }
    Some(false)
}

/// Starts NMIs at about `hz`. `pmu_armed`: the hardware PMU samples
/// already, so the local APIC keeps its performance-counter LVT entry
/// armed; every other LVT entry (and otherwise that one too) is masked.
/// `source` picks the device: [`ClockSource::Auto`] takes the HPET where
/// one answers (see the module docs), else the PIT.
pub fn start(hz: u32, pmu_armed: bool, source: ClockSource) -> Result<ClockInfo, ClockError> {
    let hpet_base = phys_to_virt(hpet::DEFAULT_BASE);
    // SAFETY: the HPET window is mapped uncached by `mm::init`; reading the
    // capabilities register of an absent device gives all ones or zeros.
    let hpet_present =
        hpet::period_fs(unsafe { core::ptr::read_volatile(hpet_base as *const u64) }).is_some();
    let pit_rate = match (source, pit::rate_for(hz)) {
        (ClockSource::Hpet, _) => None,
        (ClockSource::Auto, Ok(_)) if hpet_present => None,
        (_, Ok(r)) => Some(r),
        (_, Err(pit::PitError::TooFast)) => None,
        (_, Err(e)) => return Err(ClockError::Rate(e)),
    };
    // SAFETY: standard PC platform resources (8259, HPET window, local APIC,
    // I/O APIC, PIT), all reached through the direct map that `mm::init` builds
    // (uncached in the device window); nothing else uses the HPET or IRQ 0.
    unsafe {
        pic::disable();
        let apic = lapic::LocalApic::from_msr();
        apic.enable_masked(pmu_armed);
        let io = ioapic::IoApic::new(phys_to_virt(ioapic::DEFAULT_BASE));
        io.mask_all();
        BOOT_APIC_ID.store(apic.id(), Ordering::Relaxed);
        io.set_redirection(
            ioapic::PIT_PIN,
            ioapic::redirection(ioapic::Delivery::Nmi, 2, apic.id(), false),
        );
        let info = match pit_rate {
            Some(rate) => {
                let hpet_found = hpet::disable_legacy_routing(hpet_base);
                RUNNING.store(true, Ordering::Relaxed);
                pit::start_channel0(rate);
                ClockInfo {
                    source: "PIT channel 0 -> IOAPIC pin 2 (NMI delivery)",
                    divisor: u64::from(rate.divisor),
                    actual_mhz: rate.actual_mhz,
                    hpet_found,
                }
            }
            None => {
                let rate = hpet::rate_for(
                    hz,
                    hpet::period_fs(core::ptr::read_volatile(hpet_base as *const u64)).unwrap_or(0),
                );
                if let Some(r) = rate {
                    HPET_TICKS.store(r.ticks, Ordering::Relaxed);
                    HPET_NEXT.store(r.ticks, Ordering::Relaxed);
                    // Two periods and 2 ms of counter ticks.
                    let per_ms = r.ticks * u64::from(hz) / 1000;
                    HPET_GRACE.store(2 * r.ticks + 2 * per_ms.max(1), Ordering::Relaxed);
                }
                RUNNING.store(true, Ordering::Relaxed);
                ON_HPET.store(true, Ordering::Relaxed);
                match hpet::start_legacy(hpet_base, hz) {
                    Ok(rate) => ClockInfo {
                        source: "HPET timer 0 (legacy replacement, one-shot re-armed per NMI) -> IOAPIC pin 2 (NMI delivery)",
                        divisor: rate.ticks,
                        actual_mhz: rate.actual_mhz,
                        hpet_found: false,
                    },
                    Err(e) => {
                        io.set_redirection(ioapic::PIT_PIN, ioapic::MASKED);
                        RUNNING.store(false, Ordering::Relaxed);
                        ON_HPET.store(false, Ordering::Relaxed);
                        HPET_GRACE.store(0, Ordering::Relaxed);
                        HPET_TICKS.store(0, Ordering::Relaxed);
                        return Err(ClockError::Hpet(e));
                    }
                }
            }
        };
        Ok(info)
    }
}

/// The boot CPU's APIC ID, the clock's destination.
static BOOT_APIC_ID: AtomicU8 = AtomicU8::new(0);

/// Sends the clock's NMIs to every CPU (`true`: the I/O APIC's physical
/// broadcast) or to the boot CPU alone (`false`, the default). Only the
/// boot CPU re-arms the HPET ([`on_nmi`]). Nothing changes while the
/// clock is stopped.
pub fn deliver_to_every_cpu(every: bool) {
    if !RUNNING.load(Ordering::Relaxed) {
        return;
    }
    let dest = if every {
        ioapic::BROADCAST
    } else {
        BOOT_APIC_ID.load(Ordering::Relaxed)
    };
    // SAFETY: as in `start`: the I/O APIC's window through the direct map.
    // Only the destination changes, and the entry is never masked on the
    // way: the HPET's one-shot comparator is moved on only by the NMI its
    // expiry raises, so an edge lost to a masked entry would stop the clock.
    unsafe {
        ioapic::IoApic::new(phys_to_virt(ioapic::DEFAULT_BASE))
            .set_destination(ioapic::PIT_PIN, dest);
    }
}

/// NMI context, on the boot CPU (`fanout=ipi`): sends this tick on to
/// every other CPU that is up, an NMI IPI each. Atomics and APIC writes
/// only; an interrupted IPI sender's ICR is kept
/// (`LocalApic::send_nmi_keeping_icr`).
#[inline(never)]
pub fn forward_tick() {
    // SAFETY: ring 0; the direct map covers the APIC window, uncached.
    let apic = unsafe { lapic::LocalApic::from_msr() };
    for i in 1..crate::smp::online() {
        if let Some(id) = crate::smp::apic_id(i) {
            apic.send_nmi_keeping_icr(id);
        }
    }
}

/// Stops NMI delivery from the clock.
pub fn stop() {
    // SAFETY: as in `start`.
    unsafe {
        ioapic::IoApic::new(phys_to_virt(ioapic::DEFAULT_BASE))
            .set_redirection(ioapic::PIT_PIN, ioapic::MASKED);
        if ON_HPET.swap(false, Ordering::Relaxed) {
            HPET_GRACE.store(0, Ordering::Relaxed);
            HPET_TICKS.store(0, Ordering::Relaxed);
            hpet::stop(phys_to_virt(hpet::DEFAULT_BASE));
        }
    }
    RUNNING.store(false, Ordering::Relaxed);
}
