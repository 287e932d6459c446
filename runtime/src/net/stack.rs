//! The card, the interface and the sockets of the runtime's own use (the
//! DHCP client, the UDP echo), in one static behind a critical section.

use crate::kprintln;
use crate::mm::dma::FrameHal;
use alloc::vec;
use alloc::vec::Vec;
use arch_x86::paging::phys_to_virt;
use arch_x86::virtio::{Bus, ProbeError};
use arch_x86::virtio_net::{self, MAX_FRAME, NetStats, VirtioNet};
use core::cell::RefCell;
use critical_section::Mutex;
use kcore::cmdline::{NetConfig, NetMode};
use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::socket::{dhcpv4, udp};
use smoltcp::time::Instant;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpCidr, Ipv4Address, Ipv4Cidr};

/// The UDP port of the echo service (`net=...,echo`), as RFC 862.
pub const ECHO_PORT: u16 = 7;

/// The card as smoltcp's `phy::Device`: a received frame is copied out of
/// its DMA buffer (which goes straight back to the device), so a reply can
/// be sent while the frame is processed.
pub struct Card {
    nic: VirtioNet<FrameHal>,
    rx: [u8; MAX_FRAME],
}

/// One received frame.
pub struct RxToken<'a>(&'a [u8]);

/// Room for one frame to send.
pub struct TxToken<'a>(&'a mut VirtioNet<FrameHal>);

impl phy::RxToken for RxToken<'_> {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(self.0)
    }
}

impl phy::TxToken for TxToken<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        // `transmit` gave this token only with a buffer free, and smoltcp
        // never asks for more than the MTU. Should the card refuse all the
        // same, the frame is built in a scratch buffer and dropped, as a
        // wire would lose it.
        match self.0.send(len, f) {
            Ok(r) => r,
            Err(f) => f(&mut vec![0u8; len]),
        }
    }
}

impl phy::Device for Card {
    type RxToken<'a> = RxToken<'a>;
    type TxToken<'a> = TxToken<'a>;

    fn receive(&mut self, _now: Instant) -> Option<(RxToken<'_>, TxToken<'_>)> {
        if !self.nic.can_send() {
            // A reply could not go out: leave the frame in the queue.
            return None;
        }
        let rx = &mut self.rx;
        let len = self.nic.receive(|frame| {
            let n = frame.len().min(MAX_FRAME);
            rx[..n].copy_from_slice(&frame[..n]);
            n
        })?;
        Some((RxToken(&self.rx[..len]), TxToken(&mut self.nic)))
    }

    fn transmit(&mut self, _now: Instant) -> Option<TxToken<'_>> {
        self.nic.can_send().then_some(TxToken(&mut self.nic))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = MAX_FRAME;
        caps.max_burst_size = Some(virtio_net::TX_SLOTS);
        caps
    }
}

/// The card and the runtime's own use of it. The interface and its
/// socket set go to the run's sockets ([`attach`]) once there is a run;
/// until then they wait here.
struct Net {
    card: Card,
    pending: Option<(Interface, SocketSet<'static>)>,
    dhcp: Option<SocketHandle>,
    echo: Option<SocketHandle>,
    /// The address in force and its gateway.
    addr: Option<(Ipv4Cidr, Option<Ipv4Address>)>,
}

static NET: Mutex<RefCell<Option<Net>>> = Mutex::new(RefCell::new(None));

fn now() -> Instant {
    Instant::from_micros((crate::time::now_ns() / 1000) as i64)
}

/// Looks for a virtio-net card unless `net=off`, brings the interface up
/// as `cfg` says and logs what it found. Needs the frame allocator and the
/// heap (call after `mm::init`); a machine without a card has no network
/// and logs nothing unless `net=` asked for one.
pub fn init(cfg: NetConfig) {
    if cfg.mode == NetMode::Off {
        return;
    }
    let found = if pci_present() {
        // SAFETY: CPL 0 on a PC, the configuration ports used by nothing
        // else (boot, one core, the probes one after another); `FrameHal`
        // maps BARs through the direct map, which covers 0-4 GiB uncached
        // in the device window, and `find_pci` refuses BARs above that;
        // the card lives for good in `NET`, so its DMA pages stay its own.
        unsafe { virtio_net::probe_pci::<FrameHal>() }
    } else {
        // SAFETY: without PCI the machine is `microvm`, whose window holds
        // virtio-mmio transports (or nothing); the direct map covers it
        // uncached for good; DMA pages as above.
        unsafe { virtio_net::probe_mmio::<FrameHal>(|pa| phys_to_virt(pa) as *mut u8) }
    };
    let (nic, bus) = match found {
        Ok(f) => f,
        Err(ProbeError::NotFound) => {
            if cfg != NetConfig::default() {
                kprintln!("perch: net: no virtio-net device; net= ignored");
            }
            return;
        }
        Err(ProbeError::Pci(_)) => {
            kprintln!("perch: net: the virtio-net device's PCI BARs are unassigned or above 4 GiB");
            return;
        }
        Err(ProbeError::Setup(_, e)) => {
            kprintln!("perch: net: virtio-net set-up failed: {e}");
            return;
        }
    };
    let mac = nic.mac();
    let m = Mac(mac);
    match bus {
        Bus::Pci { device, function } => {
            kprintln!("perch: net: virtio-net at PCI 00:{device:02x}.{function}, MAC {m}")
        }
        Bus::Mmio(pa) => kprintln!("perch: net: virtio-net at {pa:#x}, MAC {m}"),
    }
    let mut card = Card {
        nic,
        rx: [0; MAX_FRAME],
    };
    let mut config = Config::new(HardwareAddress::Ethernet(EthernetAddress(mac)));
    config.random_seed = arch_x86::cpu::rdtsc();
    let mut iface = Interface::new(config, &mut card, now());
    let mut sockets = SocketSet::new(Vec::with_capacity(kcore::sys::net::SET_CAPACITY));
    let mut addr = None;
    let dhcp = match cfg.mode {
        NetMode::Static {
            addr: a,
            prefix,
            gateway,
        } => {
            let cidr = Ipv4Cidr::new(Ipv4Address::from(a), prefix);
            let gw = gateway.map(Ipv4Address::from);
            set_address(&mut iface, cidr, gw);
            addr = Some((cidr, gw));
            match gw {
                Some(gw) => kprintln!("perch: net: {cidr} via {gw} (static)"),
                None => kprintln!("perch: net: {cidr} (static, no gateway)"),
            }
            None
        }
        _ => Some(sockets.add(dhcpv4::Socket::new())),
    };
    let echo = cfg.echo.then(|| {
        let buf = || {
            udp::PacketBuffer::new(
                vec![udp::PacketMetadata::EMPTY; 8],
                vec![0u8; 8 * MAX_FRAME],
            )
        };
        let mut s = udp::Socket::new(buf(), buf());
        // Cannot fail: the port is not 0 and the socket is new.
        let _ = s.bind(ECHO_PORT);
        kprintln!("perch: net: UDP echo on port {ECHO_PORT}");
        sockets.add(s)
    });
    critical_section::with(|cs| {
        *NET.borrow_ref_mut(cs) = Some(Net {
            card,
            pending: Some((iface, sockets)),
            dhcp,
            echo,
            addr,
        });
    });
}

/// Hands the card's interface to the run's sockets (`sys.net`), when
/// there is a card.
pub fn attach(sys: &mut kcore::sys::System) {
    let taken = critical_section::with(|cs| {
        NET.borrow_ref_mut(cs)
            .as_mut()
            .and_then(|n| n.pending.take())
    });
    if let Some((iface, sockets)) = taken {
        sys.net.attach(iface, sockets);
    }
}

/// A MAC address as Linux prints it (52:54:00:12:34:56).
struct Mac([u8; 6]);

impl core::fmt::Display for Mac {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

fn pci_present() -> bool {
    // SAFETY: the runtime runs at CPL 0 on a PC; only the boot's probes
    // use the configuration ports, one after another.
    unsafe { arch_x86::virtio::pci_present() }
}

fn set_address(iface: &mut Interface, cidr: Ipv4Cidr, gw: Option<Ipv4Address>) {
    iface.update_ip_addrs(|addrs| {
        addrs.clear();
        // Cannot fail: the list was just emptied.
        let _ = addrs.push(IpCidr::Ipv4(cidr));
    });
    match gw {
        Some(gw) => {
            // Cannot fail: one default route replaces the other.
            let _ = iface.routes_mut().add_default_ipv4_route(gw);
        }
        None => {
            iface.routes_mut().remove_default_ipv4_route();
        }
    }
}

/// Lends the card (`None` without one) to `f`, which moves its frames
/// (the run's sockets poll it with the loopback: `abi::linux::poll_net`).
pub fn with_card<R>(f: impl FnOnce(Option<&mut Card>) -> R) -> R {
    critical_section::with(|cs| {
        let mut net = NET.borrow_ref_mut(cs);
        f(net.as_mut().map(|n| &mut n.card))
    })
}

/// After a poll of the card's interface: DHCP's news and the echo
/// service, on the interface and socket set the run's sockets hold.
pub fn service(iface: &mut Interface, sockets: &mut SocketSet<'static>) {
    critical_section::with(|cs| {
        if let Some(n) = NET.borrow_ref_mut(cs).as_mut() {
            n.service(iface, sockets);
        }
    });
}

impl Net {
    /// DHCP's news and the echo service.
    fn service(&mut self, iface: &mut Interface, sockets: &mut SocketSet<'static>) {
        if let Some(h) = self.dhcp {
            let event = sockets.get_mut::<dhcpv4::Socket>(h).poll();
            match event {
                Some(dhcpv4::Event::Configured(c)) => {
                    let (cidr, gw) = (c.address, c.router);
                    match (gw, c.dns_servers.first()) {
                        (Some(gw), Some(dns)) => {
                            kprintln!("perch: net: {cidr} via {gw} (DHCP), DNS {dns}")
                        }
                        (Some(gw), None) => kprintln!("perch: net: {cidr} via {gw} (DHCP)"),
                        (None, _) => kprintln!("perch: net: {cidr} (DHCP, no gateway)"),
                    }
                    set_address(iface, cidr, gw);
                    self.addr = Some((cidr, gw));
                }
                Some(dhcpv4::Event::Deconfigured) => {
                    if self.addr.is_some() {
                        kprintln!("perch: net: DHCP lease lost");
                    }
                    iface.update_ip_addrs(|a| a.clear());
                    iface.routes_mut().remove_default_ipv4_route();
                    self.addr = None;
                }
                None => {}
            }
        }
        if let Some(h) = self.echo {
            let s = sockets.get_mut::<udp::Socket>(h);
            let mut buf = [0u8; MAX_FRAME];
            let mut sent = false;
            while s.can_send() {
                let Ok((n, meta)) = s.recv_slice(&mut buf) else {
                    break;
                };
                // A full transmit buffer drops the echo, as UDP may.
                sent |= s.send_slice(&buf[..n], meta).is_ok();
            }
            if sent {
                // The replies leave now, not at the next poll.
                iface.poll(now(), &mut self.card, sockets);
            }
        }
    }
}

/// The card's counters, for reports.
pub fn stats() -> Option<NetStats> {
    critical_section::with(|cs| NET.borrow_ref(cs).as_ref().map(|n| n.card.nic.stats))
}
