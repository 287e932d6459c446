//! The network: a virtio-net card (PCI on `pc`/`q35`, virtio-mmio on
//! `microvm`) under smoltcp's TCP/IP stack. The interface answers ARP and
//! ICMP echo, takes its address from DHCP or from `net=ADDR/PREFIX,gw=GW`,
//! and with `net=...,echo` returns UDP datagrams sent to port 7.
//!
//! Nothing here runs in NMI context or from an interrupt: the scheduler's
//! driver calls [`poll`] while it idles and between slices, which moves
//! frames and runs smoltcp's timers (DHCP renewal, ARP, TCP).
//!
//! For the socket system calls, [`with_stack`] lends the interface and its
//! socket set (smoltcp sockets are added there and polled with the rest),
//! [`poll_at`] says when the stack next needs a poll (a sleeping scheduler
//! should wake by then), and [`address`] gives the interface's address.
//! The network never shares a device with the profile stream.

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

    /// Nothing to poll.
    pub fn poll() {}
}
#[cfg(not(target_os = "none"))]
pub use host::*;
