//! A virtio console's transmit side, through the `virtio-drivers` crate:
//! the device is found on PCI (configuration space through the legacy
//! 0xCF8/0xCFC ports, modern virtio capabilities, MMIO BARs) or in
//! QEMU `microvm`'s virtio-mmio window, and written without blocking.
//!
//! Only port 0's transmit queue is used (no multiport, nothing is read).
//! [`VirtioConsole::try_write`] copies bytes into one of [`TX_SLOTS`] DMA
//! pages and hands it to the device; a slot is free again once the device
//! has used it. When the host does not read, the device holds its buffers
//! and `try_write` accepts nothing: the backpressure the flight recorder
//! needs, with one host write per page instead of one per byte.
//!
//! The [`Hal`] (DMA pages, address translation) is the caller's: the
//! runtime's frame allocator and direct map.
//!
//! [`find_pci`] and [`find_mmio`] find a device of any type the same way;
//! the network card (`virtio_net`) uses them too.

use core::ptr::NonNull;
use virtio_drivers::Hal;
use virtio_drivers::queue::VirtQueue;
pub use virtio_drivers::transport::DeviceType;
use virtio_drivers::transport::mmio::{MmioTransport, VirtIOHeader};
use virtio_drivers::transport::pci::bus::{Command, ConfigurationAccess, DeviceFunction, PciRoot};
use virtio_drivers::transport::pci::{PciTransport, virtio_device_type};
use virtio_drivers::transport::{SomeTransport, Transport};
use virtio_drivers::{BufferDirection, PAGE_SIZE};

/// Transmit buffers in flight at most (one page each).
pub const TX_SLOTS: usize = 8;
/// The console's transmit queue of port 0.
const TRANSMITQ: u16 = 1;

bitflags::bitflags! {
    /// The feature bits this driver negotiates.
    #[derive(Copy, Clone, Debug, Default, Eq, PartialEq)]
    struct Features: u64 {
        /// A modern (virtio 1.0) device.
        const VERSION_1 = 1 << 32;
    }
}

/// PCI configuration space through I/O ports 0xCF8 (address) and 0xCFC
/// (data): configuration mechanism #1 of every PC chipset QEMU emulates.
#[derive(Debug)]
pub struct PortCam(());

impl PortCam {
    /// The PC's configuration ports.
    ///
    /// # Safety
    /// 1. The caller runs at CPL 0 on a PC whose ports 0xCF8/0xCFC are the
    ///    PCI configuration mechanism (or decode to nothing).
    /// 2. No other code uses those ports while the returned value (or a
    ///    clone of it) lives.
    pub unsafe fn new() -> Self {
        PortCam(())
    }

    fn address(df: DeviceFunction, offset: u8) -> u32 {
        0x8000_0000
            | u32::from(df.bus) << 16
            | u32::from(df.device) << 11
            | u32::from(df.function) << 8
            | u32::from(offset & 0xfc)
    }
}

impl ConfigurationAccess for PortCam {
    fn read_word(&self, df: DeviceFunction, offset: u8) -> u32 {
        // SAFETY: `new`'s obligations 1 and 2: the ports are the
        // configuration mechanism and nobody else uses them; an address
        // write followed by a data read is the mechanism's protocol.
        unsafe {
            x86::io::outl(0xcf8, Self::address(df, offset));
            x86::io::inl(0xcfc)
        }
    }

    fn write_word(&mut self, df: DeviceFunction, offset: u8, data: u32) {
        // SAFETY: as in `read_word`.
        unsafe {
            x86::io::outl(0xcf8, Self::address(df, offset));
            x86::io::outl(0xcfc, data);
        }
    }

    unsafe fn unsafe_clone(&self) -> Self {
        PortCam(())
    }
}

/// Whether anything answers at PCI 00:00.0 (the host bridge of `pc` and
/// `q35`; `microvm` has no PCI).
///
/// # Safety
/// 1. As [`PortCam::new`]'s obligations.
pub unsafe fn pci_present() -> bool {
    // SAFETY: obligation 1 is `new`'s.
    let cam = unsafe { PortCam::new() };
    let id = cam.read_word(
        DeviceFunction {
            bus: 0,
            device: 0,
            function: 0,
        },
        0,
    );
    id != 0xffff_ffff && id != 0
}

/// Where a device was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bus {
    /// On PCI bus 0 at this device and function.
    Pci {
        /// Device number.
        device: u8,
        /// Function number.
        function: u8,
    },
    /// In the virtio-mmio window at this physical address.
    Mmio(u64),
}

/// Why no device (a console, a network card) could be driven.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeError {
    /// No virtio device of the kind looked for answered.
    NotFound,
    /// A device was found but could not be set up (its BARs, its queues,
    /// DMA memory).
    Setup(Bus, virtio_drivers::Error),
    /// The PCI transport refused the device (BARs not assigned or above
    /// the direct-mapped window).
    Pci(Bus),
}

/// The first virtio console on PCI bus 0.
///
/// # Safety
/// 1. As [`PortCam::new`]'s obligations.
/// 2. `H` maps any memory BAR below 4 GiB (the virtio capabilities' MMIO)
///    uncached in `mmio_phys_to_virt`, and its DMA pages stay owned by the
///    device for as long as the returned console lives.
pub unsafe fn probe_pci<H: Hal>() -> Result<(VirtioConsole<H>, Bus), ProbeError> {
    // SAFETY: the caller's obligations 1 and 2 are `find_pci`'s.
    let (transport, bus) = unsafe { find_pci::<H>(DeviceType::Console) }?;
    VirtioConsole::new(transport)
        .map(|c| (c, bus))
        .map_err(|e| ProbeError::Setup(bus, e))
}

/// The transport of the first virtio device of type `ty` on PCI bus 0,
/// with memory decoding and bus mastering on.
///
/// # Safety
/// 1. As [`PortCam::new`]'s obligations.
/// 2. `H` maps any memory BAR below 4 GiB (the virtio capabilities' MMIO)
///    uncached in `mmio_phys_to_virt`, valid for as long as the transport
///    lives.
pub unsafe fn find_pci<H: Hal>(
    ty: DeviceType,
) -> Result<(SomeTransport<'static>, Bus), ProbeError> {
    // SAFETY: obligation 1.
    let mut root = PciRoot::new(unsafe { PortCam::new() });
    let found = root
        .enumerate_bus(0)
        .find(|(_, info)| virtio_device_type(info) == Some(ty));
    let Some((df, _)) = found else {
        return Err(ProbeError::NotFound);
    };
    let bus = Bus::Pci {
        device: df.device,
        function: df.function,
    };
    // Memory decoding for the BARs, bus mastering for the queues' DMA.
    let (_, cmd) = root.get_status_command(df);
    root.set_command(df, cmd | Command::MEMORY_SPACE | Command::BUS_MASTER);
    // Only BARs in the low 4 GiB are mapped (obligation 2).
    let bars = root.bars(df).map_err(|_| ProbeError::Pci(bus))?;
    let high = bars.iter().flatten().any(|b| {
        b.memory_address_size()
            .is_some_and(|(a, len)| a.saturating_add(len) > 1 << 32)
    });
    if high {
        return Err(ProbeError::Pci(bus));
    }
    let transport = PciTransport::new::<H, _>(&mut root, df).map_err(|_| ProbeError::Pci(bus))?;
    Ok((transport.into(), bus))
}

/// QEMU `microvm`'s virtio-mmio window: this many 512-byte transports
/// from [`MMIO_WINDOW`].
pub const MMIO_SLOTS: u64 = 24;
/// Physical base of `microvm`'s first virtio-mmio transport.
pub const MMIO_WINDOW: u64 = 0xfeb0_0000;
const MMIO_SIZE: usize = 0x200;

/// The first virtio console in `microvm`'s virtio-mmio window.
///
/// # Safety
/// 1. The machine is QEMU `microvm` (or the window at [`MMIO_WINDOW`]
///    holds virtio-mmio transports or nothing), and `map` turns a physical
///    address there into an uncached mapping of it valid for good.
/// 2. As [`probe_pci`]'s obligation 2 for the DMA pages.
pub unsafe fn probe_mmio<H: Hal>(
    map: impl Fn(u64) -> *mut u8,
) -> Result<(VirtioConsole<H>, Bus), ProbeError> {
    // SAFETY: obligation 1 is `find_mmio`'s.
    let (t, bus) = unsafe { find_mmio(DeviceType::Console, map) }?;
    VirtioConsole::new(t)
        .map(|c| (c, bus))
        .map_err(|e| ProbeError::Setup(bus, e))
}

/// The transport of the first virtio device of type `ty` in `microvm`'s
/// virtio-mmio window.
///
/// # Safety
/// 1. The machine is QEMU `microvm` (or the window at [`MMIO_WINDOW`]
///    holds virtio-mmio transports or nothing), and `map` turns a physical
///    address there into an uncached mapping of it valid for good.
pub unsafe fn find_mmio(
    ty: DeviceType,
    map: impl Fn(u64) -> *mut u8,
) -> Result<(SomeTransport<'static>, Bus), ProbeError> {
    for i in 0..MMIO_SLOTS {
        let pa = MMIO_WINDOW + i * MMIO_SIZE as u64;
        let Some(header) = NonNull::new(map(pa).cast::<VirtIOHeader>()) else {
            continue;
        };
        // SAFETY: obligation 1: `header` maps a transport's 512 bytes (or
        // nothing, whose magic does not match and is refused), valid for
        // good.
        let Ok(t) = (unsafe { MmioTransport::new(header, MMIO_SIZE) }) else {
            continue;
        };
        if t.device_type() != ty {
            continue;
        }
        return Ok((t.into(), Bus::Mmio(pa)));
    }
    Err(ProbeError::NotFound)
}

/// A virtio console's port 0, transmit only, never blocking.
pub struct VirtioConsole<H: Hal> {
    transport: SomeTransport<'static>,
    txq: VirtQueue<H, TX_SLOTS>,
    /// `TX_SLOTS` DMA pages (contiguous), one per buffer in flight.
    pages: NonNull<u8>,
    /// The queue token and length of each slot's buffer in flight.
    inflight: [Option<(u16, usize)>; TX_SLOTS],
    /// Bytes handed to the device so far.
    pub sent: u64,
}

// SAFETY: the console owns its DMA pages and its transport; the runtime is
// single-core and keeps the console behind a critical section.
unsafe impl<H: Hal> Send for VirtioConsole<H> {}

impl<H: Hal> VirtioConsole<H> {
    fn new(mut transport: SomeTransport<'static>) -> Result<Self, virtio_drivers::Error> {
        transport.begin_init(Features::VERSION_1);
        let txq = VirtQueue::new(&mut transport, TRANSMITQ, false, false)?;
        let (paddr, pages) = H::dma_alloc(TX_SLOTS, BufferDirection::DriverToDevice);
        if paddr == 0 {
            return Err(virtio_drivers::Error::DmaError);
        }
        transport.finish_init();
        Ok(VirtioConsole {
            transport,
            txq,
            pages,
            inflight: [None; TX_SLOTS],
            sent: 0,
        })
    }

    /// Slot `i`'s page, `len` bytes of it.
    fn page(&self, i: usize, len: usize) -> &'static mut [u8] {
        debug_assert!(i < TX_SLOTS && len <= PAGE_SIZE);
        // SAFETY: `pages` is `TX_SLOTS` pages of DMA memory this console
        // owns for good (it never frees them); slot `i`'s page is only
        // touched while the slot is free (by the copy in `try_write`) or
        // given to the device (by nothing but the device).
        unsafe { core::slice::from_raw_parts_mut(self.pages.as_ptr().add(i * PAGE_SIZE), len) }
    }

    /// Takes back the buffers the device has used.
    fn reclaim(&mut self) {
        while let Some(token) = self.txq.peek_used() {
            let Some(i) = self
                .inflight
                .iter()
                .position(|s| s.is_some_and(|(t, _)| t == token))
            else {
                // Not ours: cannot happen with one queue and one driver.
                return;
            };
            let Some((_, len)) = self.inflight[i] else {
                return;
            };
            let buf: &[u8] = self.page(i, len);
            // SAFETY: `buf` is the very buffer `try_write` added with this
            // token, still valid (the pages are never freed).
            if unsafe { self.txq.pop_used(token, &[buf], &mut []) }.is_err() {
                return;
            }
            self.inflight[i] = None;
        }
    }

    /// Hands up to one page of `bytes` to the device if a transmit buffer
    /// is free; returns how many bytes it took (0: the device still holds
    /// every buffer, the host is not reading as fast as the target writes).
    pub fn try_write(&mut self, bytes: &[u8]) -> usize {
        if bytes.is_empty() {
            return 0;
        }
        self.reclaim();
        let Some(i) = self.inflight.iter().position(Option::is_none) else {
            return 0;
        };
        let n = bytes.len().min(PAGE_SIZE);
        let page = self.page(i, n);
        page.copy_from_slice(&bytes[..n]);
        let buf: &[u8] = page;
        // SAFETY: the page stays valid and untouched by the driver until
        // `reclaim` pops this token.
        let Ok(token) = (unsafe { self.txq.add(&[buf], &mut []) }) else {
            return 0;
        };
        self.inflight[i] = Some((token, n));
        if self.txq.should_notify() {
            self.transport.notify(TRANSMITQ);
        }
        self.sent += n as u64;
        n
    }

    /// Whether the device has used every buffer it was given.
    pub fn idle(&mut self) -> bool {
        self.reclaim();
        self.inflight.iter().all(Option::is_none)
    }
}
