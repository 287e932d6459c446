//! A virtio network card through the `virtio-drivers` crate's raw driver:
//! found like the console ([`crate::virtio::find_pci`] on `pc`/`q35`,
//! [`crate::virtio::find_mmio`] on `microvm`), polled, never blocking.
//!
//! Every buffer the device sees is one of the card's own DMA pages (from
//! the caller's [`Hal`]): [`RX_SLOTS`] receive buffers, all kept in the
//! receive queue, and [`TX_SLOTS`] transmit buffers, each free again once
//! the device has used it. Frames go in and out through closures, so the
//! caller (the TCP/IP stack) never holds a device buffer.

use crate::virtio::{Bus, DeviceType, ProbeError, find_mmio, find_pci};
use core::ptr::NonNull;
use virtio_drivers::device::net::VirtIONetRaw;
use virtio_drivers::transport::SomeTransport;
use virtio_drivers::{BufferDirection, Hal, PAGE_SIZE};

/// Receive buffers kept in the device's queue.
pub const RX_SLOTS: usize = 16;
/// Transmit buffers in flight at most.
pub const TX_SLOTS: usize = 16;
/// Descriptors of each queue (a power of two, at least the slots).
const QUEUE: usize = 16;
/// Bytes of one buffer: a virtio-net header and an Ethernet frame of
/// 1514 bytes fit (the driver wants at least 1526 for a receive buffer).
const BUF: usize = 2048;
/// The largest Ethernet frame (no FCS, no VLAN tag) the card carries.
pub const MAX_FRAME: usize = 1514;
/// The virtio-net header before each frame (virtio 1.0 and legacy with
/// mergeable buffers: 12 bytes; plain legacy: 10).
const MAX_HDR: usize = 12;

const _: () = assert!(RX_SLOTS <= QUEUE && TX_SLOTS <= QUEUE && BUF * 2 == PAGE_SIZE);
const _: () = assert!(MAX_HDR + MAX_FRAME <= BUF);

/// The first virtio-net device on PCI bus 0.
///
/// # Safety
/// 1. As [`crate::virtio::PortCam::new`]'s obligations.
/// 2. `H` maps any memory BAR below 4 GiB uncached in
///    `mmio_phys_to_virt`, and its DMA pages stay owned by the device for
///    as long as the returned card lives.
pub unsafe fn probe_pci<H: Hal>() -> Result<(VirtioNet<H>, Bus), ProbeError> {
    // SAFETY: obligations 1 and 2 are `find_pci`'s.
    let (t, bus) = unsafe { find_pci::<H>(DeviceType::Network) }?;
    VirtioNet::new(t)
        .map(|n| (n, bus))
        .map_err(|e| ProbeError::Setup(bus, e))
}

/// The first virtio-net device in `microvm`'s virtio-mmio window.
///
/// # Safety
/// 1. As [`find_mmio`]'s obligation 1 for `map`.
/// 2. As [`probe_pci`]'s obligation 2 for the DMA pages.
pub unsafe fn probe_mmio<H: Hal>(
    map: impl Fn(u64) -> *mut u8,
) -> Result<(VirtioNet<H>, Bus), ProbeError> {
    // SAFETY: obligation 1 is `find_mmio`'s.
    let (t, bus) = unsafe { find_mmio(DeviceType::Network, map) }?;
    VirtioNet::new(t)
        .map(|n| (n, bus))
        .map_err(|e| ProbeError::Setup(bus, e))
}

/// Counters of a card, for the log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Frames received.
    pub rx_frames: u64,
    /// Frames handed to the device.
    pub tx_frames: u64,
    /// Frames not sent: every transmit buffer was in flight.
    pub tx_full: u64,
    /// Receive or transmit operations the driver refused.
    pub errors: u64,
}

/// A virtio network card, polled.
pub struct VirtioNet<H: Hal> {
    raw: VirtIONetRaw<H, SomeTransport<'static>, QUEUE>,
    /// `RX_SLOTS` buffers of `BUF` bytes (contiguous pages).
    rx: NonNull<u8>,
    /// `TX_SLOTS` buffers of `BUF` bytes (contiguous pages).
    tx: NonNull<u8>,
    /// The queue token of each receive slot's buffer, all in the queue.
    rx_token: [Option<u16>; RX_SLOTS],
    /// The queue token and length of each transmit slot's buffer in flight.
    tx_inflight: [Option<(u16, usize)>; TX_SLOTS],
    /// What the card did so far.
    pub stats: NetStats,
}

// SAFETY: the card owns its DMA pages and its transport; the runtime is
// single-core and keeps the card behind a critical section.
unsafe impl<H: Hal> Send for VirtioNet<H> {}

impl<H: Hal> VirtioNet<H> {
    fn new(transport: SomeTransport<'static>) -> Result<Self, virtio_drivers::Error> {
        let raw = VirtIONetRaw::new(transport)?;
        let (rx_pa, rx) = H::dma_alloc(RX_SLOTS * BUF / PAGE_SIZE, BufferDirection::DeviceToDriver);
        let (tx_pa, tx) = H::dma_alloc(TX_SLOTS * BUF / PAGE_SIZE, BufferDirection::DriverToDevice);
        if rx_pa == 0 || tx_pa == 0 {
            return Err(virtio_drivers::Error::DmaError);
        }
        let mut card = VirtioNet {
            raw,
            rx,
            tx,
            rx_token: [None; RX_SLOTS],
            tx_inflight: [None; TX_SLOTS],
            stats: NetStats::default(),
        };
        for i in 0..RX_SLOTS {
            card.give_rx(i)?;
        }
        Ok(card)
    }

    /// The card's MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.raw.mac_address()
    }

    /// Buffer `i` of `base`'s slots.
    ///
    /// # Safety
    /// 1. `base` is `rx` or `tx`, and `i` is below that side's slot count.
    /// 2. The buffer is not in the device's queue (or is being handed to
    ///    or taken back from it, which the driver does by address only),
    ///    and no other reference to it lives.
    unsafe fn buf(base: NonNull<u8>, i: usize) -> &'static mut [u8] {
        // SAFETY: obligation 1: the slot lies in the side's DMA pages,
        // which the card owns for good (it never frees them); obligation 2
        // makes the reference the only one.
        unsafe { core::slice::from_raw_parts_mut(base.as_ptr().add(i * BUF), BUF) }
    }

    /// Hands receive slot `i` (not in the queue) to the device.
    fn give_rx(&mut self, i: usize) -> Result<(), virtio_drivers::Error> {
        // SAFETY: `i < RX_SLOTS`; slot `i` is not in the queue (the
        // caller's word) and the reference lives only for the call.
        let buf = unsafe { Self::buf(self.rx, i) };
        // SAFETY: the buffer is the card's DMA memory, valid for good; it
        // is touched again only after the device hands it back through
        // `poll_receive`.
        let token = unsafe { self.raw.receive_begin(buf) }?;
        self.rx_token[i] = Some(token);
        Ok(())
    }

    /// Takes one received frame, if any, and gives it to `f`; the buffer
    /// goes back to the device afterwards.
    pub fn receive<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let token = self.raw.poll_receive()?;
        let Some(i) = self.rx_token.iter().position(|t| *t == Some(token)) else {
            // Not one of ours: cannot happen with one driver.
            self.stats.errors += 1;
            return None;
        };
        // SAFETY: `i < RX_SLOTS`; the device has used the buffer (its
        // token is in the used ring), so only this reference touches it.
        let buf = unsafe { Self::buf(self.rx, i) };
        // SAFETY: the very buffer `give_rx` added with this token.
        let done = unsafe { self.raw.receive_complete(token, buf) };
        self.rx_token[i] = None;
        let r = match done {
            Ok((hdr, len)) if hdr + len <= BUF => {
                self.stats.rx_frames += 1;
                Some(f(&buf[hdr..hdr + len]))
            }
            _ => {
                self.stats.errors += 1;
                None
            }
        };
        if self.give_rx(i).is_err() {
            self.stats.errors += 1;
        }
        r
    }

    /// Takes back the transmit buffers the device has used.
    fn reclaim(&mut self) {
        while let Some(token) = self.raw.poll_transmit() {
            let Some(i) = self
                .tx_inflight
                .iter()
                .position(|s| s.is_some_and(|(t, _)| t == token))
            else {
                self.stats.errors += 1;
                return;
            };
            let Some((_, len)) = self.tx_inflight[i] else {
                return;
            };
            // SAFETY: `i < TX_SLOTS`; the device has used the buffer.
            let buf = unsafe { Self::buf(self.tx, i) };
            // SAFETY: the very buffer `send` added with this token, of
            // this length.
            if unsafe { self.raw.transmit_complete(token, &buf[..len]) }.is_err() {
                self.stats.errors += 1;
                return;
            }
            self.tx_inflight[i] = None;
        }
    }

    /// Whether a transmit buffer is free.
    pub fn can_send(&mut self) -> bool {
        self.reclaim();
        self.tx_inflight.iter().any(Option::is_none)
    }

    /// Sends a frame of `len` bytes (at most [`MAX_FRAME`]) that `f`
    /// writes. `f` comes back unused when every transmit buffer is in
    /// flight or `len` is too long; once it has written the frame, a frame
    /// the driver refuses is counted in `errors` and lost, as on a wire.
    pub fn send<R, F: FnOnce(&mut [u8]) -> R>(&mut self, len: usize, f: F) -> Result<R, F> {
        self.reclaim();
        let Some(i) = self.tx_inflight.iter().position(Option::is_none) else {
            self.stats.tx_full += 1;
            return Err(f);
        };
        if len > MAX_FRAME {
            self.stats.errors += 1;
            return Err(f);
        }
        // SAFETY: `i < TX_SLOTS`; slot `i` is not in flight.
        let buf = unsafe { Self::buf(self.tx, i) };
        let Ok(hdr) = self.raw.fill_buffer_header(buf) else {
            self.stats.errors += 1;
            return Err(f);
        };
        let r = f(&mut buf[hdr..hdr + len]);
        let frame: &[u8] = &buf[..hdr + len];
        // SAFETY: the buffer is the card's DMA memory, valid for good, and
        // untouched until `reclaim` pops this token.
        match unsafe { self.raw.transmit_begin(frame) } {
            Ok(token) => {
                self.tx_inflight[i] = Some((token, hdr + len));
                self.stats.tx_frames += 1;
            }
            Err(_) => self.stats.errors += 1,
        }
        Ok(r)
    }
}
