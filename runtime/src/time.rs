//! Time and randomness for every layer: the TSC's rate (calibrated against
//! the PIT at boot), monotonic nanoseconds, the realtime clock (the CMOS RTC
//! at boot plus the TSC since), and random bytes. The monotonic readers are
//! NMI-safe: relaxed atomic loads and `rdtsc`.

use arch_x86::pit;
use core::sync::atomic::{AtomicU64, Ordering};

/// TSC ticks per second, measured by [`calibrate_tsc`] (0 until then).
static TSC_HZ: AtomicU64 = AtomicU64::new(0);
/// `ns = (tsc * NS_MULT) >> 32`.
static NS_MULT: AtomicU64 = AtomicU64::new(0);

/// PIT ticks the calibration waits (10 ms).
const CALIBRATION_PIT_TICKS: u32 = 11_932;
/// Reads of the PIT after which a count that never moves means no PIT.
const CALIBRATION_POLLS: u32 = 5_000_000;

/// Measures the TSC rate against the PIT's channel 0, free running (10 ms
/// of its ticks, read by latching the count), and sets the TSC-to-ns
/// conversion. Channel 0's gate is always open, so this works on machines
/// without the PC speaker port that gates channel 2 (QEMU's `microvm`).
/// Under `-icount shift=0` the TSC counts instructions and virtual time
/// runs one nanosecond per instruction, so the rate comes out near 1 GHz
/// and "time" means executed instructions. Returns the rate in Hz, 0 when
/// the PIT's count never moved.
pub fn calibrate_tsc() -> u64 {
    // SAFETY: ports 0x40/0x43 are the PIT on the PC platform and on
    // microvm; nothing uses channel 0 until the NMI clock programs it.
    let (t0, t1, done) = unsafe {
        pit::start_free_running();
        let mut last = pit::read_channel0();
        let mut elapsed = 0u32;
        let mut still = 0u32;
        let t0 = arch_x86::cpu::rdtsc();
        // Bounded: a missing PIT must not hang the boot.
        while elapsed < CALIBRATION_PIT_TICKS && still < CALIBRATION_POLLS {
            let now = pit::read_channel0();
            let d = pit::ticks_between(last, now);
            if d == 0 {
                still += 1;
            } else {
                still = 0;
            }
            elapsed += u32::from(d);
            last = now;
        }
        let t1 = arch_x86::cpu::rdtsc();
        (t0, t1, elapsed >= CALIBRATION_PIT_TICKS)
    };
    if !done {
        return 0;
    }
    let hz = (t1 - t0) * u64::from(arch_x86::pit::PIT_HZ) / u64::from(CALIBRATION_PIT_TICKS);
    set_tsc_hz(hz);
    hz
}

/// Sets the TSC rate used for time stamps.
pub fn set_tsc_hz(hz: u64) {
    let hz = hz.max(1);
    TSC_HZ.store(hz, Ordering::Relaxed);
    NS_MULT.store(
        ((1_000_000_000u128 << 32) / u128::from(hz)) as u64,
        Ordering::Relaxed,
    );
}

/// The calibrated TSC rate (0 before calibration).
pub fn tsc_hz() -> u64 {
    TSC_HZ.load(Ordering::Relaxed)
}

/// Converts a TSC value to nanoseconds. NMI-safe.
#[inline]
pub fn tsc_to_ns(tsc: u64) -> u64 {
    ((u128::from(tsc) * u128::from(NS_MULT.load(Ordering::Relaxed))) >> 32) as u64
}

/// Nanoseconds since reset, from the TSC. NMI-safe.
pub fn now_ns() -> u64 {
    tsc_to_ns(arch_x86::cpu::rdtsc())
}

/// Wall-clock seconds at boot (from the CMOS RTC) and the TSC then.
static BOOT_UNIX_NS: AtomicU64 = AtomicU64::new(0);
static BOOT_NS: AtomicU64 = AtomicU64::new(0);

/// Reads the RTC once at boot: the base of the realtime clock.
pub fn init_realtime() {
    // SAFETY: ring 0 on a PC platform; only this boot code uses the CMOS ports.
    let t = unsafe { arch_x86::rtc::read() };
    if let Some(s) = t.unix_seconds() {
        BOOT_UNIX_NS.store(s.saturating_mul(1_000_000_000), Ordering::Relaxed);
        BOOT_NS.store(now_ns(), Ordering::Relaxed);
    }
}

/// Nanoseconds since the Unix epoch: the RTC at boot plus the monotonic
/// time since then.
pub fn realtime_ns() -> u64 {
    let base = BOOT_UNIX_NS.load(Ordering::Relaxed);
    base.saturating_add(now_ns().saturating_sub(BOOT_NS.load(Ordering::Relaxed)))
}

/// The TSC value at which the monotonic clock reaches `ns`.
pub fn ns_to_tsc_deadline(ns: u64) -> u64 {
    let hz = tsc_hz();
    if hz == 0 {
        return 0;
    }
    let now = now_ns();
    let wait = ns.saturating_sub(now);
    let ticks = (u128::from(wait) * u128::from(hz) / 1_000_000_000) as u64;
    arch_x86::cpu::rdtsc().saturating_add(ticks)
}

static RNG: AtomicU64 = AtomicU64::new(0);

/// Random bytes: RDRAND where the CPU has it, else a xorshift generator
/// seeded from the TSC (documented as not cryptographic).
pub fn random_bytes(buf: &mut [u8]) {
    let rdrand = arch_x86::cpu::features().rdrand;
    for chunk in buf.chunks_mut(8) {
        let mut v = 0u64;
        let mut ok = false;
        if rdrand {
            for _ in 0..10 {
                // SAFETY: CPUID reports RDRAND.
                if unsafe { core::arch::x86_64::_rdrand64_step(&mut v) } == 1 {
                    ok = true;
                    break;
                }
            }
        }
        if !ok {
            let mut x = RNG.load(Ordering::Relaxed);
            if x == 0 {
                x = arch_x86::cpu::rdtsc() | 1;
            }
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            RNG.store(x, Ordering::Relaxed);
            v = x;
        }
        let b = v.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
}
