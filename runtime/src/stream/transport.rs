//! The device the record stream leaves through: COM1's 16550, or a virtio
//! console (PCI on `pc`/`q35`, virtio-mmio on `microvm`) when one answers
//! and `transport=` allows it. Both sit behind one [`Transport`]: a
//! non-blocking [`Transport::try_write`] for the flight recorder's pump and
//! the blocking `embedded_io::Write` for direct writes.
//!
//! The virtio driver's memory is `mm::dma`'s [`FrameHal`]: DMA pages
//! from the frame allocator, addresses through the direct map.

//!
//! The virtio side exists only in the runtime's own build (target
//! `x86_64-unknown-none`); a host build of the crate (clippy, `cargo
//! check --workspace`) has the 16550 alone.

use arch_x86::uart::{COM1, Uart16550};
use core::convert::Infallible;
use kcore::cmdline::TransportChoice;
use sampler::wire::TransportKind;
#[cfg(target_os = "none")]
pub use virtio_side::*;

#[cfg(target_os = "none")]
mod virtio_side {
    pub use crate::mm::dma::FrameHal;
    pub use arch_x86::virtio::{Bus, ProbeError, VirtioConsole};
}

/// The stream's device.
// One lives in the stream's static for good: the size does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Transport {
    /// COM1.
    Uart(Uart16550),
    /// A virtio console.
    #[cfg(target_os = "none")]
    Virtio(VirtioConsole<FrameHal>, TransportKind),
}

impl Transport {
    /// COM1, the transport until [`probe`] finds a better one.
    pub const fn com1() -> Self {
        // SAFETY: COM1 is the PC's first serial port, programmed once by
        // `console::init`; in wire mode only the stream writes to it.
        Transport::Uart(unsafe { Uart16550::new(COM1) })
    }

    /// Which kind, for Hello.
    pub fn kind(&self) -> TransportKind {
        match self {
            Transport::Uart(_) => TransportKind::Uart16550,
            #[cfg(target_os = "none")]
            Transport::Virtio(_, k) => *k,
        }
    }

    /// Writes what the device takes now; returns how many bytes. Never waits.
    pub fn try_write(&mut self, bytes: &[u8]) -> usize {
        match self {
            Transport::Uart(u) => u.try_write(bytes),
            #[cfg(target_os = "none")]
            Transport::Virtio(c, _) => c.try_write(bytes),
        }
    }

    /// Whether every byte written has left the target (the virtio device
    /// used all its buffers; the UART's FIFO is not waited for).
    pub fn idle(&mut self) -> bool {
        match self {
            Transport::Uart(_) => true,
            #[cfg(target_os = "none")]
            Transport::Virtio(c, _) => c.idle(),
        }
    }
}

impl embedded_io::ErrorType for Transport {
    type Error = Infallible;
}

impl embedded_io::Write for Transport {
    /// Waits until the device takes some of `buf`. The UART's own write is
    /// bounded (it writes on after a long wait); a virtio console waits for
    /// the host, which QEMU never makes wait for good (an unconnected
    /// chardev discards).
    fn write(&mut self, buf: &[u8]) -> Result<usize, Self::Error> {
        if buf.is_empty() {
            return Ok(0);
        }
        match self {
            Transport::Uart(u) => {
                u.write_bytes(buf);
                Ok(buf.len())
            }
            #[cfg(target_os = "none")]
            Transport::Virtio(c, _) => loop {
                let n = c.try_write(buf);
                if n > 0 {
                    return Ok(n);
                }
                core::hint::spin_loop();
            },
        }
    }

    fn flush(&mut self) -> Result<(), Self::Error> {
        while !self.idle() {
            core::hint::spin_loop();
        }
        Ok(())
    }
}

/// What [`probe`] found, for the boot log.
#[derive(Clone, Copy, Debug)]
pub enum Probe {
    /// `transport=uart`: not looked for.
    NotAsked,
    /// A console at this place.
    #[cfg(target_os = "none")]
    Found(Bus),
    /// None usable.
    #[cfg(target_os = "none")]
    Failed(ProbeError),
    /// A host build: no virtio driver.
    #[cfg(not(target_os = "none"))]
    Unavailable,
}

#[cfg(target_os = "none")]
fn pci_present() -> bool {
    // SAFETY: the runtime runs at CPL 0 on a PC; only the boot's probes
    // use the configuration ports, one after another.
    unsafe { arch_x86::virtio::pci_present() }
}

/// Looks for a virtio console as `choice` says; `Some` transport when one
/// is up. Needs the frame allocator (call after `mm::init`).
pub fn probe(choice: TransportChoice) -> (Option<Transport>, Probe) {
    if choice == TransportChoice::Uart {
        return (None, Probe::NotAsked);
    }
    #[cfg(not(target_os = "none"))]
    return (None, Probe::Unavailable);
    #[cfg(target_os = "none")]
    probe_virtio()
}

#[cfg(target_os = "none")]
fn probe_virtio() -> (Option<Transport>, Probe) {
    use arch_x86::paging::phys_to_virt;
    use arch_x86::virtio;
    let found = if pci_present() {
        // SAFETY: CPL 0 on a PC, the ports used by nothing else (boot, one
        // core); `FrameHal` maps BARs through the direct map, which covers
        // 0-4 GiB uncached in the device window, and `probe_pci` refuses
        // BARs above that; the DMA pages are never freed while the console
        // lives (it lives for good).
        unsafe { virtio::probe_pci::<FrameHal>() }.map(|(c, b)| (c, b, TransportKind::VirtioPci))
    } else {
        // SAFETY: without PCI the machine is `microvm`, whose window holds
        // virtio-mmio transports (or nothing); the direct map covers it
        // uncached for good; DMA pages as above.
        unsafe { virtio::probe_mmio::<FrameHal>(|pa| phys_to_virt(pa) as *mut u8) }
            .map(|(c, b)| (c, b, TransportKind::VirtioMmio))
    };
    match found {
        Ok((c, bus, kind)) => (Some(Transport::Virtio(c, kind)), Probe::Found(bus)),
        Err(e) => (None, Probe::Failed(e)),
    }
}
