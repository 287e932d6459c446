//! The CMOS real-time clock (MC146818-compatible, ports 0x70/0x71): the
//! wall-clock time at boot, which the runtime carries forward with the TSC.
//! The date arithmetic is pure and tested on the host.

/// A calendar time as the RTC reports it, already converted from BCD.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DateTime {
    /// Full year (e.g. 2026).
    pub year: u32,
    /// 1..=12.
    pub month: u32,
    /// 1..=31.
    pub day: u32,
    /// 0..=23.
    pub hour: u32,
    /// 0..=59.
    pub minute: u32,
    /// 0..=59.
    pub second: u32,
}

impl DateTime {
    /// Seconds since 1970-01-01 00:00:00 UTC, or `None` for an impossible date.
    pub fn unix_seconds(&self) -> Option<u64> {
        if !(1970..=9999).contains(&self.year)
            || !(1..=12).contains(&self.month)
            || !(1..=31).contains(&self.day)
            || self.hour > 23
            || self.minute > 59
            || self.second > 60
        {
            return None;
        }
        // Days from the civil date (Howard Hinnant's algorithm).
        let (y, m) = if self.month <= 2 {
            (self.year as i64 - 1, self.month as i64 + 9)
        } else {
            (self.year as i64, self.month as i64 - 3)
        };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let doy = (153 * m + 2) / 5 + self.day as i64 - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        let days = era * 146_097 + doe - 719_468;
        let secs =
            days * 86_400 + self.hour as i64 * 3600 + self.minute as i64 * 60 + self.second as i64;
        u64::try_from(secs).ok()
    }
}

/// Decodes the raw RTC registers (seconds, minutes, hours, day, month,
/// year, century or 0) with status register B's format bits.
pub fn decode(raw: [u8; 7], status_b: u8) -> DateTime {
    let binary = status_b & 0x04 != 0;
    let h24 = status_b & 0x02 != 0;
    let bcd = |v: u8| {
        if binary {
            u32::from(v)
        } else {
            u32::from(v & 0x0f) + u32::from(v >> 4) * 10
        }
    };
    let pm = raw[2] & 0x80 != 0;
    let mut hour = bcd(raw[2] & 0x7f);
    if !h24 {
        hour %= 12;
        if pm {
            hour += 12;
        }
    }
    let century = if raw[6] != 0 { bcd(raw[6]) } else { 20 };
    DateTime {
        year: century * 100 + bcd(raw[5]),
        month: bcd(raw[4]),
        day: bcd(raw[3]),
        hour,
        minute: bcd(raw[1]),
        second: bcd(raw[0]),
    }
}

/// Reads the RTC (waiting out an update in progress, bounded).
///
/// # Safety
/// 1. Ring 0 on a PC platform: ports 0x70/0x71 are the CMOS, and nothing
///    else uses them concurrently.
#[cfg(target_arch = "x86_64")]
pub unsafe fn read() -> DateTime {
    use x86::io::{inb, outb};
    let reg = |r: u8| {
        // SAFETY: obligation 1; bit 7 of the index keeps NMIs enabled as
        // they are (it is left clear).
        unsafe {
            outb(0x70, r);
            inb(0x71)
        }
    };
    for _ in 0..1_000_000 {
        if reg(0x0a) & 0x80 == 0 {
            break;
        }
    }
    let raw = [
        reg(0x00),
        reg(0x02),
        reg(0x04),
        reg(0x07),
        reg(0x08),
        reg(0x09),
        reg(0x32),
    ];
    decode(raw, reg(0x0b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_time_of_known_dates() {
        let d = |year, month, day, hour, minute, second| DateTime {
            year,
            month,
            day,
            hour,
            minute,
            second,
        };
        assert_eq!(d(1970, 1, 1, 0, 0, 0).unix_seconds(), Some(0));
        assert_eq!(d(2000, 3, 1, 0, 0, 0).unix_seconds(), Some(951_868_800));
        assert_eq!(
            d(2026, 12, 1, 20, 54, 51).unix_seconds(),
            Some(1_796_158_491)
        );
        assert_eq!(d(2024, 2, 29, 12, 0, 0).unix_seconds(), Some(1_709_208_000));
        assert_eq!(d(2026, 13, 1, 0, 0, 0).unix_seconds(), None);
        assert_eq!(d(1969, 12, 31, 23, 59, 59).unix_seconds(), None);
    }

    #[test]
    fn bcd_and_12_hour_registers() {
        // 2026-12-01 20:54:51 in BCD, 24-hour, century register 0x20.
        let raw = [0x51, 0x54, 0x20, 0x01, 0x12, 0x26, 0x20];
        let t = decode(raw, 0x02);
        assert_eq!(
            t,
            DateTime {
                year: 2026,
                month: 12,
                day: 1,
                hour: 20,
                minute: 54,
                second: 51
            }
        );
        // 8 PM in 12-hour BCD mode.
        assert_eq!(
            decode([0x51, 0x54, 0x88, 0x01, 0x12, 0x26, 0], 0x00).hour,
            20
        );
        // 12 AM is hour 0; binary mode.
        assert_eq!(decode([0, 0, 12, 1, 1, 26, 0], 0x04).hour, 0);
        assert_eq!(decode([0, 0, 12, 1, 1, 26, 0], 0x04).year, 2026);
    }
}
