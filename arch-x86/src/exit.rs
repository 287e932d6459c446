//! Leaving the machine: QEMU's isa-debug-exit device with distinct codes.

/// The I/O port of `-device isa-debug-exit,iobase=0xf4,iosize=0x04`.
pub const DEBUG_EXIT_PORT: u16 = 0xf4;

/// Why the runtime ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum ExitCode {
    /// Everything passed / the run ended normally.
    Pass = 0x10,
    /// A self-test failed.
    Fail = 0x11,
    /// The runtime itself crashed (exception or panic in ring 0).
    Crash = 0x12,
}

impl ExitCode {
    /// The process status QEMU exits with for this code.
    pub const fn qemu_status(self) -> i32 {
        (((self as u32) << 1) | 1) as i32 & 0xff
    }

    /// Maps a QEMU exit status back to a code, if it is one of ours.
    pub fn from_qemu_status(status: i32) -> Option<Self> {
        [ExitCode::Pass, ExitCode::Fail, ExitCode::Crash]
            .into_iter()
            .find(|c| c.qemu_status() == status)
    }
}

/// Ends the run: QEMU exits; on hardware without the device the CPU halts.
///
/// # Safety
/// Port 0xf4 must be the debug-exit device or unused.
#[cfg(target_arch = "x86_64")]
pub unsafe fn exit(code: ExitCode) -> ! {
    // SAFETY: forwarded from the caller.
    unsafe { x86::io::outl(DEBUG_EXIT_PORT, code as u32) };
    loop {
        // SAFETY: halting with interrupts off stops the CPU; NMIs return here.
        unsafe { core::arch::asm!("cli", "hlt", options(nomem, nostack)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_distinct_and_round_trip() {
        assert_eq!(ExitCode::Pass.qemu_status(), 33);
        assert_eq!(ExitCode::Fail.qemu_status(), 35);
        assert_eq!(ExitCode::Crash.qemu_status(), 37);
        for c in [ExitCode::Pass, ExitCode::Fail, ExitCode::Crash] {
            assert_eq!(ExitCode::from_qemu_status(c.qemu_status()), Some(c));
        }
        assert_eq!(ExitCode::from_qemu_status(0), None);
        assert_eq!(ExitCode::from_qemu_status(1), None);
    }
}
