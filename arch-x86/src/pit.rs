//! The 8254 programmable interval timer, channel 0 as a periodic rate generator.

/// Input clock of the PIT in Hz.
pub const PIT_HZ: u32 = 1_193_182;

/// The reload value for `hz`, and the rate it really gives (in mHz).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PitRate {
    /// Reload value written to channel 0 (never 0 or 1).
    pub divisor: u16,
    /// Actual rate in millihertz.
    pub actual_mhz: u64,
}

/// Why a rate cannot be produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PitError {
    /// Below about 18.2 Hz the 16-bit divisor overflows.
    TooSlow,
    /// Above about 596 kHz the divisor would be below 2.
    TooFast,
}

/// Computes the divisor closest to `hz`.
pub fn rate_for(hz: u32) -> Result<PitRate, PitError> {
    if hz == 0 {
        return Err(PitError::TooSlow);
    }
    let div = (PIT_HZ + hz / 2) / hz;
    if div > 65_535 {
        return Err(PitError::TooSlow);
    }
    if div < 2 {
        return Err(PitError::TooFast);
    }
    Ok(PitRate {
        divisor: div as u16,
        actual_mhz: u64::from(PIT_HZ) * 1000 / u64::from(div),
    })
}

/// Starts channel 0 in mode 2 (rate generator) with `rate`.
///
/// # Safety
/// Ports 0x40/0x43 must be the PIT.
#[cfg(target_arch = "x86_64")]
pub unsafe fn start_channel0(rate: PitRate) {
    use x86::io::outb;
    // SAFETY: forwarded from the caller.
    unsafe {
        outb(0x43, 0x34); // channel 0, lobyte/hibyte, mode 2, binary
        outb(0x40, rate.divisor as u8);
        outb(0x40, (rate.divisor >> 8) as u8);
    }
}

/// Starts channel 0 in mode 2 with the largest divisor (65,536: a wrap
/// every 54.9 ms), free running, for [`read_channel0`] to measure time with.
///
/// # Safety
/// Ports 0x40/0x43 must be the PIT, and nothing else may use channel 0
/// until it is programmed again.
#[cfg(target_arch = "x86_64")]
pub unsafe fn start_free_running() {
    use x86::io::outb;
    // SAFETY: forwarded from the caller.
    unsafe {
        outb(0x43, 0x34); // channel 0, lobyte/hibyte, mode 2, binary
        outb(0x40, 0);
        outb(0x40, 0);
    }
}

/// Latches and reads channel 0's count (counting down at [`PIT_HZ`]).
///
/// # Safety
/// Ports 0x40/0x43 must be the PIT.
#[cfg(target_arch = "x86_64")]
pub unsafe fn read_channel0() -> u16 {
    use x86::io::{inb, outb};
    // SAFETY: forwarded from the caller.
    unsafe {
        outb(0x43, 0x00); // latch channel 0
        let lo = inb(0x40);
        let hi = inb(0x40);
        u16::from_le_bytes([lo, hi])
    }
}

/// PIT ticks between two reads of a free-running down-counter, `before`
/// then `after`, less than one wrap (65,536 ticks) apart.
pub fn ticks_between(before: u16, after: u16) -> u16 {
    before.wrapping_sub(after)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divisors() {
        let r = rate_for(4000).unwrap();
        assert_eq!(r.divisor, 298);
        assert_eq!(r.actual_mhz / 1000, 4003);
        assert_eq!(rate_for(1000).unwrap().divisor, 1193);
        assert_eq!(rate_for(18), Err(PitError::TooSlow));
        assert_eq!(rate_for(0), Err(PitError::TooSlow));
        assert_eq!(rate_for(1_000_000), Err(PitError::TooFast));
        assert_eq!(rate_for(200_000).unwrap().divisor, 6);
    }

    #[test]
    fn ticks_across_the_reload() {
        assert_eq!(ticks_between(0x8000, 0x7000), 0x1000);
        // The counter reloads 65,536 after 1 (read as 0 at the reload).
        assert_eq!(ticks_between(10, 0xfff0), 26);
        assert_eq!(ticks_between(0, 0xffff), 1);
        assert_eq!(ticks_between(5, 5), 0);
    }
}
