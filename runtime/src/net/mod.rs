//! The network: a virtio-net card (PCI on `pc`/`q35`, virtio-mmio on
//! `microvm`) under smoltcp's TCP/IP stack. The interface answers ARP and
//! ICMP echo, takes its address from DHCP or from `net=ADDR/PREFIX,gw=GW`,
//! and with `net=...,echo` returns UDP datagrams sent to port 7.
//!
//! Nothing here runs in NMI context or from an interrupt: the scheduler's
//! driver calls [`poll`] while it idles and between slices, which moves
//! frames and runs smoltcp's timers (DHCP renewal, ARP, TCP).
//!
//! The sockets of the system calls are `kcore::sys::net`'s: [`attach`]
//! gives them the card's interface when the run starts; the personality
//! (`abi::linux::poll_net`) moves their packets on the loopback and on the
//! card [`with_card`] lends, lets [`service`] answer DHCP and the echo, and
//! tells the processes whose sockets changed. A call that queued data
//! polls at once, so an answer does not wait for the next slice. The network never shares a device with the profile stream.

#[cfg(target_os = "none")]
mod stack;
#[cfg(target_os = "none")]
pub use stack::*;

/// Host builds have no virtio driver: no network.
#[cfg(not(target_os = "none"))]
mod host {
    use kcore::cmdline::NetConfig;

    /// Nothing to probe.
    pub fn init(_cfg: NetConfig) {}

    /// No card to lend.
    pub fn with_card<R>(f: impl FnOnce(Option<&mut smoltcp::phy::Loopback>) -> R) -> R {
        f(None)
    }

    /// No runtime services.
    pub fn service(
        _iface: &mut smoltcp::iface::Interface,
        _sockets: &mut smoltcp::iface::SocketSet<'static>,
    ) {
    }

    /// No card to hand over.
    pub fn attach(_sys: &mut kcore::sys::System) {}
}
#[cfg(not(target_os = "none"))]
pub use host::*;
