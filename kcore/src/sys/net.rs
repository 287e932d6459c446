//! Internet sockets (`AF_INET`, TCP and UDP) over smoltcp, with Linux's
//! semantics: what each call returns, its `errno`, and what `poll` says.
//!
//! # Two interfaces
//! [`Net`] keeps two smoltcp interfaces, each with its own socket set:
//! the loopback (`127.0.0.1/8` on smoltcp's `Loopback` device, always
//! there) and the runtime's card once [`Net::attach`] gave it one (the
//! card itself stays the runtime's and is lent to [`Net::poll`]). A
//! connection lives on the side its peer address names: `127.x.x.x` on the
//! loopback, anything else on the card. A socket bound to `0.0.0.0`
//! listens (TCP) or receives (UDP) on both.
//!
//! # Linux sockets and smoltcp sockets
//! A Linux socket ([`Sock`]) is an object of the run, named by its index;
//! a descriptor reaches it through [`Target::Socket`](super::fd::Target).
//! A listening TCP socket keeps up to its backlog of smoltcp sockets in
//! `LISTEN` on each side: each takes one connection, and once the
//! handshake is done it moves to the accept queue and a fresh one takes its
//! place. A closed connection that still has to say goodbye (FIN, the ACK
//! of the peer's, `TIME-WAIT`) stays in smoltcp's set as a zombie until it
//! reaches `CLOSED`.
//!
//! # Errors smoltcp does not name
//! smoltcp says `CLOSED`, not why. A connection that reaches `CLOSED` from
//! `SYN-SENT` was refused (`ECONNREFUSED`); one that reaches it from
//! anything but the orderly ends (`TIME-WAIT`, `LAST-ACK`, `CLOSING`) was
//! reset or timed out (`ECONNRESET`). [`Net::poll`] sees every state
//! between polls, so it keeps the error for `SO_ERROR` and the next call.
//!
//! # Readiness
//! [`Net::mask`] answers as Linux's `tcp_poll` and `datagram_poll`.
//! [`Net::poll`] compares each socket's readiness and queue lengths with
//! what it saw last and returns the sockets that changed, so the runtime
//! can run their epoll callbacks and wake their waiters (a new segment on a
//! socket that was readiness already counts: edge-triggered epoll reports
//! every arrival).

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{Device, Loopback, Medium};
use smoltcp::socket::{tcp, udp};
use smoltcp::time::{Duration, Instant};
use smoltcp::wire::{
    HardwareAddress, IpAddress, IpCidr, IpEndpoint, IpListenEndpoint, Ipv4Address,
};

use super::errno::Errno;
use super::event::bits::*;

/// `AF_INET`.
pub const AF_INET: u16 = 2;
/// `SOCK_STREAM`.
pub const SOCK_STREAM: u32 = 1;
/// `SOCK_DGRAM`.
pub const SOCK_DGRAM: u32 = 2;

/// The first and last ephemeral port (Linux's `ip_local_port_range`).
const EPHEMERAL: (u16, u16) = (32768, 60999);

/// Linux's default `SO_RCVBUF` and `SO_SNDBUF` (`tcp_rmem[1]`,
/// `tcp_wmem[1]`), and `net.core.rmem_max`/`wmem_max` (a set value is
/// capped there, then doubled, as Linux does).
const RCVBUF_DEFAULT: u32 = 131072;
const SNDBUF_DEFAULT: u32 = 16384;
const BUF_MAX: u32 = 212992;
const RCVBUF_MIN: u32 = 2304;
const SNDBUF_MIN: u32 = 4608;

/// The bytes smoltcp buffers for a TCP connection, each way (its window),
/// unless `SO_RCVBUF`/`SO_SNDBUF` say otherwise (then half the doubled
/// value, 4 KiB to 128 KiB).
const TCP_BUFFER: usize = 32768;
/// A UDP socket's buffers: datagrams and bytes.
const UDP_PACKETS: usize = 64;
const UDP_BYTES: usize = 65536;
/// The most smoltcp listeners one side of a listening socket keeps.
const MAX_LISTENERS: usize = 16;
/// How long Linux keeps a connection in `TIME-WAIT` (`TCP_TIMEWAIT_LEN`).
const TIME_WAIT_US: i64 = 60_000_000;
/// How many `TIME-WAIT` addresses are remembered.
const TIME_WAIT_MAX: usize = 4096;
/// How many sockets a run may have open.
pub const MAX_SOCKETS: usize = 1024;

/// Which interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// `127.0.0.1/8`.
    Lo,
    /// The card.
    Ext,
}

/// An IPv4 socket address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Addr {
    /// Address (0 is `INADDR_ANY`).
    pub ip: [u8; 4],
    /// Port.
    pub port: u16,
}

impl Addr {
    fn side(&self) -> Side {
        if self.ip[0] == 127 {
            Side::Lo
        } else {
            Side::Ext
        }
    }

    fn any(&self) -> bool {
        self.ip == [0; 4]
    }

    /// The interfaces a socket bound here takes part in: both for
    /// `0.0.0.0`.
    fn sides(&self) -> &'static [Side] {
        if self.any() {
            &[Side::Lo, Side::Ext]
        } else if self.side() == Side::Lo {
            &[Side::Lo]
        } else {
            &[Side::Ext]
        }
    }

    fn endpoint(&self) -> IpEndpoint {
        IpEndpoint::new(IpAddress::Ipv4(Ipv4Address::from(self.ip)), self.port)
    }

    fn listen(&self) -> IpListenEndpoint {
        IpListenEndpoint {
            addr: (!self.any()).then(|| IpAddress::Ipv4(Ipv4Address::from(self.ip))),
            port: self.port,
        }
    }

    fn of(e: IpEndpoint) -> Addr {
        let IpAddress::Ipv4(a) = e.addr;
        Addr {
            ip: a.octets(),
            port: e.port,
        }
    }
}

/// Socket options kept per socket.
#[derive(Debug, Clone, Copy)]
pub struct Opts {
    /// `SO_REUSEADDR`.
    pub reuseaddr: bool,
    /// `SO_REUSEPORT`.
    pub reuseport: bool,
    /// `SO_KEEPALIVE`.
    pub keepalive: bool,
    /// `TCP_NODELAY`.
    pub nodelay: bool,
    /// `SO_BROADCAST`.
    pub broadcast: bool,
    /// `SO_OOBINLINE`.
    pub oobinline: bool,
    /// `SO_RCVBUF` as `getsockopt` reads it.
    pub rcvbuf: u32,
    /// `SO_SNDBUF` as `getsockopt` reads it.
    pub sndbuf: u32,
    /// Whether `SO_RCVBUF`/`SO_SNDBUF` were set (they then size the
    /// buffers of later connections).
    pub rcvbuf_set: bool,
    /// See `rcvbuf_set`.
    pub sndbuf_set: bool,
    /// `SO_RCVTIMEO` in ns (0: none).
    pub rcvtimeo_ns: u64,
    /// `SO_SNDTIMEO` in ns (0: none).
    pub sndtimeo_ns: u64,
    /// `SO_LINGER`: (on, seconds).
    pub linger: (bool, u32),
    /// `TCP_KEEPIDLE`, `TCP_KEEPINTVL`, `TCP_KEEPCNT`.
    pub keepidle: u32,
    /// See `keepidle`.
    pub keepintvl: u32,
    /// See `keepidle`.
    pub keepcnt: u32,
    /// `IP_TTL` (0: the default, 64).
    pub ttl: u8,
    /// `IP_TOS`.
    pub tos: u8,
    /// `SO_RCVLOWAT`.
    pub rcvlowat: u32,
    /// `TCP_MAXSEG` as set (0: not set).
    pub maxseg: u32,
    /// `TCP_QUICKACK`, `TCP_DEFER_ACCEPT`, `TCP_USER_TIMEOUT`, `TCP_CORK`
    /// (kept, not acted on).
    pub quickack: bool,
    /// See `quickack`.
    pub defer_accept: u32,
    /// See `quickack`.
    pub user_timeout: u32,
    /// See `quickack`.
    pub cork: bool,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            reuseaddr: false,
            reuseport: false,
            keepalive: false,
            nodelay: false,
            broadcast: false,
            oobinline: false,
            rcvbuf: RCVBUF_DEFAULT,
            sndbuf: SNDBUF_DEFAULT,
            rcvbuf_set: false,
            sndbuf_set: false,
            rcvtimeo_ns: 0,
            sndtimeo_ns: 0,
            linger: (false, 0),
            keepidle: 7200,
            keepintvl: 75,
            keepcnt: 9,
            ttl: 0,
            tos: 0,
            rcvlowat: 1,
            maxseg: 0,
            quickack: true,
            defer_accept: 0,
            user_timeout: 0,
            cork: false,
        }
    }
}

impl Opts {
    /// `SO_RCVBUF`/`SO_SNDBUF` as Linux stores a set value: capped at
    /// the maximum, doubled, at least the minimum.
    pub fn buf_value(v: i32, min: u32) -> u32 {
        (v.max(0) as u32).min(BUF_MAX).saturating_mul(2).max(min)
    }

    /// The minimum `SO_RCVBUF` Linux keeps.
    pub const RCVBUF_MIN: u32 = RCVBUF_MIN;
    /// The minimum `SO_SNDBUF` Linux keeps.
    pub const SNDBUF_MIN: u32 = SNDBUF_MIN;

    fn rx_bytes(&self) -> usize {
        if self.rcvbuf_set {
            ((self.rcvbuf / 2) as usize).clamp(4096, 4 * TCP_BUFFER)
        } else {
            TCP_BUFFER
        }
    }

    fn tx_bytes(&self) -> usize {
        if self.sndbuf_set {
            ((self.sndbuf / 2) as usize).clamp(4096, 4 * TCP_BUFFER)
        } else {
            TCP_BUFFER
        }
    }
}

/// A TCP socket's state as the Linux socket sees it.
#[derive(Debug, Clone)]
enum Tcp {
    /// Not connected, not listening (new, or after a failed connect).
    Idle,
    /// Listening: smoltcp listeners per side, and the accept queue.
    Listening {
        backlog: usize,
        listeners: Vec<(Side, SocketHandle)>,
        queue: VecDeque<(Side, SocketHandle)>,
    },
    /// A connection (connecting, open, or closing), and the smoltcp state
    /// last seen.
    Conn {
        side: Side,
        h: SocketHandle,
        seen: tcp::State,
    },
    /// The connection ended (reset, refused, timed out, or closed in
    /// order and gone from smoltcp); reads say end of file.
    Done,
}

/// A UDP socket: a smoltcp socket per side it is bound on, and its peer
/// once connected.
#[derive(Debug, Clone, Default)]
struct Udp {
    lo: Option<SocketHandle>,
    ext: Option<SocketHandle>,
    peer: Option<Addr>,
}

#[derive(Debug, Clone)]
enum Proto {
    Tcp(Tcp),
    Udp(Udp),
}

/// A Linux socket.
#[derive(Debug, Clone)]
pub struct Sock {
    /// The process that made it (its epolls and waiters hear of changes).
    pub owner: u32,
    proto: Proto,
    /// The bound address (a connect or listen binds an ephemeral port).
    local: Option<Addr>,
    /// Options.
    pub opts: Opts,
    /// A pending error (`SO_ERROR`): taken by `getsockopt` or the next call.
    error: Option<Errno>,
    /// `SHUT_RD` given, the peer's FIN came, or the connection ended.
    rd_shut: bool,
    /// `SHUT_WR` given, or the connection ended.
    wr_shut: bool,
    /// The connection was made and then ended (writes say `EPIPE`).
    was_connected: bool,
    /// A non-blocking connect is under way and no call has said yet that
    /// it is done (the next `connect` then says 0, as Linux, and
    /// `EISCONN` after that).
    connect_pending: bool,
    /// What [`Net::poll`] saw last: readiness, bytes queued each way.
    seen: (u32, usize, usize),
}

/// One socket whose readiness changed in [`Net::poll`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change {
    /// Its owner.
    pub pid: u32,
    /// The socket.
    pub id: usize,
    /// Its readiness now (`EPOLL*`), for the epoll callbacks' key.
    pub key: u32,
}

struct Stack {
    iface: Interface,
    set: SocketSet<'static>,
    /// smoltcp sockets in `set`: at most [`SET_CAPACITY`], so that the
    /// set, made with room for them, never grows (a full heap would end
    /// the runtime there).
    live: usize,
}

/// How many smoltcp sockets each interface's set holds at most (its
/// storage is reserved up front: [`Net::new`], and the runtime's set).
pub const SET_CAPACITY: usize = 2048;

impl Stack {
    fn add<T: smoltcp::socket::AnySocket<'static>>(&mut self, s: T) -> Result<SocketHandle, Errno> {
        if self.live >= SET_CAPACITY {
            return Err(Errno::ENOBUFS);
        }
        self.live += 1;
        Ok(self.set.add(s))
    }

    fn remove(&mut self, h: SocketHandle) {
        self.set.remove(h);
        self.live = self.live.saturating_sub(1);
    }
}

/// What a receive found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// Bytes copied.
    pub copied: usize,
    /// The datagram's whole length (UDP; TCP: `copied`).
    pub len: usize,
    /// The sender (UDP), or the peer (TCP).
    pub from: Option<Addr>,
}

/// `MSG_*` flags the calls act on.
pub mod msg {
    /// `MSG_OOB`.
    pub const OOB: u32 = 0x1;
    /// `MSG_PEEK`.
    pub const PEEK: u32 = 0x2;
    /// `MSG_TRUNC`.
    pub const TRUNC: u32 = 0x20;
    /// `MSG_DONTWAIT`.
    pub const DONTWAIT: u32 = 0x40;
    /// `MSG_EOR`.
    pub const EOR: u32 = 0x80;
    /// `MSG_WAITALL`.
    pub const WAITALL: u32 = 0x100;
    /// `MSG_NOSIGNAL`.
    pub const NOSIGNAL: u32 = 0x4000;
    /// `MSG_MORE`.
    pub const MORE: u32 = 0x8000;
    /// `MSG_CMSG_CLOEXEC`.
    pub const CMSG_CLOEXEC: u32 = 0x4000_0000;
}

/// Fills a slice with bytes `off..` of what a send sends (the caller's
/// memory).
pub type Fill<'a> = dyn FnMut(usize, &mut [u8]) -> Result<(), Errno> + 'a;

/// Takes bytes `off..` of what a receive found (into the caller's memory).
pub type Sink<'a> = dyn FnMut(usize, &[u8]) -> Result<(), Errno> + 'a;

/// The run's sockets and interfaces.
pub struct Net {
    lo: Stack,
    lo_dev: Loopback,
    ext: Option<Stack>,
    socks: Vec<Option<Sock>>,
    /// Closed TCP connections still saying goodbye, freed at `CLOSED`.
    zombies: Vec<(Side, SocketHandle)>,
    /// Local addresses of connections that went through `TIME-WAIT`, and
    /// until when (µs) Linux would keep them: a bind there without
    /// SO_REUSEADDR is `EADDRINUSE` (at most [`TIME_WAIT_MAX`], oldest
    /// forgotten first).
    time_wait: VecDeque<(Addr, i64)>,
    next_port: u16,
    /// A call queued data or changed a connection: poll soon.
    pub dirty: bool,
    now_us: i64,
}

impl core::fmt::Debug for Net {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Net")
            .field("sockets", &self.socks.iter().flatten().count())
            .field("card", &self.ext.is_some())
            .finish()
    }
}

impl Default for Net {
    fn default() -> Self {
        Net::new(0)
    }
}

/// `n` zero bytes, or `ENOBUFS` when the heap has no room (a run out of
/// memory refuses the socket, it does not end).
fn zeroed<T: Clone>(n: usize, v: T) -> Result<Vec<T>, Errno> {
    let mut b = Vec::new();
    b.try_reserve_exact(n).map_err(|_| Errno::ENOBUFS)?;
    b.resize(n, v);
    Ok(b)
}

fn tcp_sock(rx: usize, tx: usize) -> Result<tcp::Socket<'static>, Errno> {
    Ok(tcp::Socket::new(
        tcp::SocketBuffer::new(zeroed(rx, 0u8)?),
        tcp::SocketBuffer::new(zeroed(tx, 0u8)?),
    ))
}

fn udp_sock() -> Result<udp::Socket<'static>, Errno> {
    let buf = || -> Result<udp::PacketBuffer<'static>, Errno> {
        Ok(udp::PacketBuffer::new(
            zeroed(UDP_PACKETS, udp::PacketMetadata::EMPTY)?,
            zeroed(UDP_BYTES, 0u8)?,
        ))
    };
    Ok(udp::Socket::new(buf()?, buf()?))
}

/// Whether smoltcp socket `t` is done with: `CLOSED`, with no RST of an
/// abort left to send.
fn gone(t: &tcp::Socket<'_>) -> bool {
    t.state() == tcp::State::Closed && t.local_endpoint().is_none()
}

/// Whether smoltcp state `s` is one a connection ends in order from.
fn orderly_end(s: tcp::State) -> bool {
    use tcp::State::*;
    matches!(s, TimeWait | LastAck | Closing | Closed)
}

impl Net {
    /// The loopback interface alone; `seed` seeds smoltcp's sequence
    /// numbers and ephemeral ports.
    pub fn new(seed: u64) -> Net {
        let mut lo_dev = Loopback::new(Medium::Ip);
        let mut config = Config::new(HardwareAddress::Ip);
        config.random_seed = seed;
        let mut iface = Interface::new(config, &mut lo_dev, Instant::from_micros(0));
        iface.update_ip_addrs(|a| {
            // Cannot fail: the list is empty.
            let _ = a.push(IpCidr::new(IpAddress::v4(127, 0, 0, 1), 8));
        });
        Net {
            lo: Stack {
                iface,
                set: SocketSet::new(Vec::with_capacity(SET_CAPACITY)),
                live: 0,
            },
            lo_dev,
            ext: None,
            socks: Vec::new(),
            zombies: Vec::new(),
            time_wait: VecDeque::new(),
            next_port: EPHEMERAL.0 + (seed % u64::from(EPHEMERAL.1 - EPHEMERAL.0)) as u16,
            dirty: false,
            now_us: 0,
        }
    }

    /// Gives the card's interface and socket set (which may hold the
    /// runtime's own sockets, DHCP's) to the sockets of the run.
    /// Its set should have room for [`SET_CAPACITY`] sockets.
    pub fn attach(&mut self, iface: Interface, set: SocketSet<'static>) {
        let live = set.iter().count();
        self.ext = Some(Stack { iface, set, live });
    }

    /// The card's interface and socket set, once attached.
    pub fn ext_mut(&mut self) -> Option<(&mut Interface, &mut SocketSet<'static>)> {
        self.ext.as_mut().map(|s| (&mut s.iface, &mut s.set))
    }

    /// How many sockets are open.
    pub fn open_count(&self) -> usize {
        self.socks.iter().flatten().count()
    }

    fn stack(&mut self, side: Side) -> Option<&mut Stack> {
        match side {
            Side::Lo => Some(&mut self.lo),
            Side::Ext => self.ext.as_mut(),
        }
    }

    fn tcp(&mut self, side: Side, h: SocketHandle) -> Option<&mut tcp::Socket<'static>> {
        Some(self.stack(side)?.set.get_mut::<tcp::Socket>(h))
    }

    fn udp(&mut self, side: Side, h: SocketHandle) -> Option<&mut udp::Socket<'static>> {
        Some(self.stack(side)?.set.get_mut::<udp::Socket>(h))
    }

    /// Socket `id`.
    pub fn sock(&self, id: usize) -> Option<&Sock> {
        self.socks.get(id).and_then(Option::as_ref)
    }

    fn sock_mut(&mut self, id: usize) -> Result<&mut Sock, Errno> {
        self.socks
            .get_mut(id)
            .and_then(Option::as_mut)
            .ok_or(Errno::EBADF)
    }

    /// Socket `id`'s options, to change (then [`Net::options_changed`]).
    pub fn sock_mut_opts(&mut self, id: usize) -> Option<&mut Opts> {
        self.socks
            .get_mut(id)
            .and_then(Option::as_mut)
            .map(|s| &mut s.opts)
    }

    /// `socket(AF_INET, ty, 0)` for process `owner`: its index.
    pub fn open(&mut self, owner: u32, ty: u32) -> Result<usize, Errno> {
        if self.open_count() >= MAX_SOCKETS {
            return Err(Errno::ENFILE);
        }
        let proto = match ty {
            SOCK_STREAM => Proto::Tcp(Tcp::Idle),
            SOCK_DGRAM => Proto::Udp(Udp::default()),
            _ => return Err(Errno::ESOCKTNOSUPPORT),
        };
        super::fd::put_in(
            &mut self.socks,
            Sock {
                owner,
                proto,
                local: None,
                opts: Opts::default(),
                error: None,
                rd_shut: false,
                wr_shut: false,
                was_connected: false,
                connect_pending: false,
                seen: (0, 0, 0),
            },
        )
    }

    /// The socket's type (`SOCK_STREAM` or `SOCK_DGRAM`).
    pub fn sock_type(&self, id: usize) -> u32 {
        match self.sock(id).map(|s| &s.proto) {
            Some(Proto::Udp(_)) => SOCK_DGRAM,
            _ => SOCK_STREAM,
        }
    }

    /// Whether it listens.
    pub fn listening(&self, id: usize) -> bool {
        matches!(
            self.sock(id).map(|s| &s.proto),
            Some(Proto::Tcp(Tcp::Listening { .. }))
        )
    }

    /// Whether `ip` is one of ours (or `INADDR_ANY`).
    fn local_ip(&self, ip: [u8; 4]) -> bool {
        if ip == [0; 4] || ip[0] == 127 {
            return true;
        }
        let want = IpAddress::Ipv4(Ipv4Address::from(ip));
        self.ext
            .as_ref()
            .is_some_and(|s| s.iface.ip_addrs().iter().any(|c| c.address() == want))
    }

    /// Whether `port` is taken for a socket of type `ty` at `ip` by
    /// another socket than `me`, as Linux's bind conflict rules say:
    /// `SO_REUSEPORT` on both shares it; `SO_REUSEADDR` on both shares it
    /// unless one listens.
    fn port_taken(&self, me: usize, ty: u32, ip: [u8; 4], port: u16) -> bool {
        let mine = self.sock(me).map(|s| s.opts).unwrap_or_default();
        if ty == SOCK_STREAM
            && !mine.reuseaddr
            && self.time_wait.iter().any(|&(a, until)| {
                a.port == port && until > self.now_us && (a.any() || ip == [0; 4] || a.ip == ip)
            })
        {
            return true;
        }
        let listening_me = self.listening(me);
        self.socks.iter().enumerate().any(|(i, s)| {
            let Some(s) = s else { return false };
            let Some(l) = s.local else { return false };
            if i == me || l.port != port || self.sock_type(i) != ty {
                return false;
            }
            if !(l.any() || ip == [0; 4] || l.ip == ip) {
                return false;
            }
            if mine.reuseport && s.opts.reuseport {
                return false;
            }
            let done = matches!(s.proto, Proto::Tcp(Tcp::Done));
            if mine.reuseaddr && s.opts.reuseaddr && !listening_me && !self.listening(i) {
                return false;
            }
            // A socket whose connection ended holds its port only as
            // TIME-WAIT would, which SO_REUSEADDR passes.
            !(done && mine.reuseaddr)
        })
    }

    fn ephemeral(&mut self, me: usize, ty: u32, ip: [u8; 4]) -> Result<u16, Errno> {
        let span = EPHEMERAL.1 - EPHEMERAL.0 + 1;
        for _ in 0..span {
            let p = self.next_port;
            self.next_port = if p >= EPHEMERAL.1 { EPHEMERAL.0 } else { p + 1 };
            if !self.port_taken(me, ty, ip, p) && !self.zombie_port(p) {
                return Ok(p);
            }
        }
        Err(Errno::EADDRINUSE)
    }

    fn zombie_port(&mut self, port: u16) -> bool {
        let zs = self.zombies.clone();
        zs.iter().any(|&(side, h)| {
            self.tcp(side, h)
                .and_then(|t| t.local_endpoint())
                .is_some_and(|e| e.port == port)
        })
    }

    /// `bind(addr)`.
    pub fn bind(&mut self, id: usize, addr: Addr) -> Result<(), Errno> {
        let ty = self.sock_type(id);
        if self.sock_mut(id)?.local.is_some() {
            return Err(Errno::EINVAL);
        }
        if !self.local_ip(addr.ip) {
            return Err(Errno::EADDRNOTAVAIL);
        }
        let port = if addr.port == 0 {
            self.ephemeral(id, ty, addr.ip)?
        } else {
            if self.port_taken(id, ty, addr.ip, addr.port) {
                return Err(Errno::EADDRINUSE);
            }
            addr.port
        };
        let a = Addr { ip: addr.ip, port };
        if ty == SOCK_DGRAM {
            self.udp_open(id, a)?;
        }
        self.sock_mut(id)?.local = Some(a);
        Ok(())
    }

    /// Binds an unbound socket to an ephemeral port of `0.0.0.0`.
    fn autobind(&mut self, id: usize) -> Result<Addr, Errno> {
        if let Some(a) = self.sock(id).and_then(|s| s.local) {
            return Ok(a);
        }
        self.bind(id, Addr::default())?;
        self.sock(id).and_then(|s| s.local).ok_or(Errno::EINVAL)
    }

    /// The smoltcp UDP sockets of a bound UDP socket, per side its
    /// address covers.
    fn udp_open(&mut self, id: usize, a: Addr) -> Result<(), Errno> {
        let sides = a.sides();
        let mut made = Udp::default();
        for &side in sides {
            let Some(st) = self.stack(side) else { continue };
            let mut s = udp_sock()?;
            s.bind(a.listen()).map_err(|_| Errno::EINVAL)?;
            let h = st.add(s)?;
            match side {
                Side::Lo => made.lo = Some(h),
                Side::Ext => made.ext = Some(h),
            }
        }
        if let Proto::Udp(u) = &mut self.sock_mut(id)?.proto {
            u.lo = made.lo;
            u.ext = made.ext;
        }
        Ok(())
    }

    /// Whether a UDP socket of the run is bound where `to` points (on the
    /// loopback).
    fn udp_port_bound(&self, to: Addr) -> bool {
        self.socks.iter().flatten().any(|s| {
            matches!(s.proto, Proto::Udp(_))
                && s.local
                    .is_some_and(|l| l.port == to.port && (l.any() || l.ip == to.ip))
        })
    }

    /// `listen(backlog)`.
    pub fn listen(&mut self, id: usize, backlog: i32) -> Result<(), Errno> {
        let backlog = backlog.clamp(1, 4096) as usize;
        match &mut self.sock_mut(id)?.proto {
            Proto::Udp(_) => return Err(Errno::EOPNOTSUPP),
            Proto::Tcp(Tcp::Listening { backlog: b, .. }) => {
                *b = backlog;
                self.refill(id);
                return Ok(());
            }
            Proto::Tcp(Tcp::Idle) => {}
            Proto::Tcp(_) => return Err(Errno::EINVAL),
        }
        let a = self.autobind(id)?;
        // Another socket listening on the port (SO_REUSEPORT on both
        // aside) makes this one EADDRINUSE, as Linux's inet_csk_get_port.
        let me = self.sock(id).map(|s| s.opts).unwrap_or_default();
        let clash = self.socks.iter().enumerate().any(|(i, s)| {
            i != id
                && s.as_ref().is_some_and(|s| {
                    matches!(s.proto, Proto::Tcp(Tcp::Listening { .. }))
                        && s.local.is_some_and(|l| {
                            l.port == a.port && (l.any() || a.any() || l.ip == a.ip)
                        })
                        && !(me.reuseport && s.opts.reuseport)
                })
        });
        if clash {
            return Err(Errno::EADDRINUSE);
        }
        self.sock_mut(id)?.proto = Proto::Tcp(Tcp::Listening {
            backlog,
            listeners: Vec::new(),
            queue: VecDeque::new(),
        });
        self.refill(id);
        Ok(())
    }

    /// Tops up a listening socket's smoltcp listeners on each side so that
    /// those waiting and those queued stay within its backlog.
    fn refill(&mut self, id: usize) {
        let Some(s) = self.sock(id) else { return };
        let (Some(a), opts) = (s.local, s.opts) else {
            return;
        };
        let Proto::Tcp(Tcp::Listening {
            backlog,
            listeners,
            queue,
        }) = &s.proto
        else {
            return;
        };
        let sides = a.sides();
        let per_side = (*backlog).min(MAX_LISTENERS);
        let mut add = Vec::new();
        for &side in sides {
            if side == Side::Ext && self.ext.is_none() {
                continue;
            }
            let have = listeners.iter().filter(|l| l.0 == side).count()
                + queue.iter().filter(|l| l.0 == side).count();
            for _ in have..per_side {
                add.push(side);
            }
        }
        let mut made = Vec::new();
        for side in add {
            let Some(st) = self.stack(side) else { continue };
            // Out of memory: fewer listeners wait (the next refill tries
            // again).
            let Ok(mut t) = tcp_sock(opts.rx_bytes(), opts.tx_bytes()) else {
                break;
            };
            apply_opts(&mut t, &opts);
            if t.listen(a.listen()).is_err() {
                continue;
            }
            match st.add(t) {
                Ok(h) => made.push((side, h)),
                Err(_) => break,
            }
        }
        if let Some(Some(Sock {
            proto: Proto::Tcp(Tcp::Listening { listeners, .. }),
            ..
        })) = self.socks.get_mut(id)
        {
            listeners.extend(made);
        }
    }

    /// `accept`: the next connection of the queue, as a new socket of
    /// `owner` with its peer's address; `EAGAIN` when none waits.
    pub fn accept(&mut self, id: usize, owner: u32) -> Result<(usize, Addr), Errno> {
        let s = self.sock_mut(id)?;
        let opts = s.opts;
        let Proto::Tcp(Tcp::Listening { queue, .. }) = &mut s.proto else {
            return Err(Errno::EINVAL);
        };
        let Some(&(side, h)) = queue.front() else {
            return Err(Errno::EAGAIN);
        };
        if self.open_count() >= MAX_SOCKETS {
            return Err(Errno::ENFILE);
        }
        if let Proto::Tcp(Tcp::Listening { queue, .. }) = &mut self.sock_mut(id)?.proto {
            queue.pop_front();
        }
        let (state, local, peer) = match self.tcp(side, h) {
            Some(t) => (t.state(), t.local_endpoint(), t.remote_endpoint()),
            None => return Err(Errno::ECONNABORTED),
        };
        let new = super::fd::put_in(
            &mut self.socks,
            Sock {
                owner,
                proto: Proto::Tcp(Tcp::Conn {
                    side,
                    h,
                    seen: state,
                }),
                local: local.map(Addr::of),
                opts: Opts {
                    reuseaddr: opts.reuseaddr,
                    reuseport: false,
                    keepalive: opts.keepalive,
                    nodelay: opts.nodelay,
                    ..opts
                },
                error: None,
                rd_shut: false,
                wr_shut: false,
                was_connected: true,
                connect_pending: false,
                seen: (0, 0, 0),
            },
        )?;
        self.refill(id);
        self.resync(id);
        // A connection that already ended since the handshake reads its
        // end of file (or its reset) from the new socket.
        self.track(new);
        Ok((new, peer.map(Addr::of).unwrap_or_default()))
    }

    /// `connect(addr)` for TCP: starts it (`EINPROGRESS`), or says where
    /// one started before stands (`Ok` once open, its error once failed,
    /// `EALREADY` while the handshake runs).
    pub fn connect(&mut self, id: usize, to: Addr) -> Result<(), Errno> {
        match self.sock(id).map(|s| &s.proto) {
            None => return Err(Errno::EBADF),
            Some(Proto::Udp(_)) => return self.udp_connect(id, Some(to)),
            Some(Proto::Tcp(Tcp::Listening { .. })) => return Err(Errno::EINVAL),
            Some(Proto::Tcp(Tcp::Conn { .. })) => return self.connect_outcome(id, false),
            Some(Proto::Tcp(Tcp::Done)) => {
                let s = self.sock_mut(id)?;
                if let Some(e) = s.error.take() {
                    return Err(e);
                }
                if s.was_connected {
                    return Err(Errno::EISCONN);
                }
            }
            Some(Proto::Tcp(Tcp::Idle)) => {}
        }
        if let Some(e) = self.sock_mut(id)?.error.take() {
            return Err(e);
        }
        if to.any() {
            // Linux connects 0.0.0.0 to the loopback.
            return self.connect(
                id,
                Addr {
                    ip: [127, 0, 0, 1],
                    port: to.port,
                },
            );
        }
        if to.port == 0 {
            return Err(Errno::ECONNREFUSED);
        }
        let side = to.side();
        if side == Side::Ext && self.ext.is_none() {
            return Err(Errno::ENETUNREACH);
        }
        let local = self.autobind(id)?;
        let opts = self.sock(id).map(|s| s.opts).unwrap_or_default();
        let mut t = tcp_sock(opts.rx_bytes(), opts.tx_bytes())?;
        apply_opts(&mut t, &opts);
        let Some(st) = self.stack(side) else {
            return Err(Errno::ENETUNREACH);
        };
        let from = if local.any() || local.side() != side {
            IpListenEndpoint {
                addr: None,
                port: local.port,
            }
        } else {
            local.listen()
        };
        t.connect(st.iface.context(), to.endpoint(), from)
            .map_err(|e| match e {
                tcp::ConnectError::InvalidState => Errno::EISCONN,
                tcp::ConnectError::Unaddressable => Errno::ENETUNREACH,
            })?;
        let h = st.add(t)?;
        let s = self.sock_mut(id)?;
        s.proto = Proto::Tcp(Tcp::Conn {
            side,
            h,
            seen: tcp::State::SynSent,
        });
        s.rd_shut = false;
        s.wr_shut = false;
        s.connect_pending = true;
        self.dirty = true;
        Err(Errno::EINPROGRESS)
    }

    /// Whether a blocking `connect` is still under way.
    pub fn connecting(&self, id: usize) -> bool {
        matches!(
            self.sock(id).map(|s| &s.proto),
            Some(Proto::Tcp(Tcp::Conn {
                seen: tcp::State::SynSent | tcp::State::SynReceived,
                ..
            }))
        )
    }

    /// Where a connect started before stands: `EALREADY` while the
    /// handshake runs, its error once it failed, 0 once open. Linux says
    /// 0 to the first call after a non-blocking connect finished and
    /// `EISCONN` to later ones; a blocking connect made again after its
    /// wait (`resumed`) says 0.
    pub fn connect_outcome(&mut self, id: usize, resumed: bool) -> Result<(), Errno> {
        self.track(id);
        let s = self.sock_mut(id)?;
        if let Some(e) = s.error.take() {
            return Err(e);
        }
        match s.proto {
            Proto::Tcp(Tcp::Conn {
                seen: tcp::State::SynSent | tcp::State::SynReceived,
                ..
            }) => Err(Errno::EALREADY),
            _ if !s.was_connected => Err(Errno::ECONNREFUSED),
            _ if resumed || s.connect_pending => {
                s.connect_pending = false;
                Ok(())
            }
            _ => Err(Errno::EISCONN),
        }
    }

    /// `connect` of a UDP socket: sets the peer (`None`: `AF_UNSPEC`
    /// dissolves it).
    pub fn udp_connect(&mut self, id: usize, to: Option<Addr>) -> Result<(), Errno> {
        if let Some(to) = to {
            if to.side() == Side::Ext && self.ext.is_none() && !to.any() {
                return Err(Errno::ENETUNREACH);
            }
            self.autobind(id)?;
        }
        match &mut self.sock_mut(id)?.proto {
            Proto::Udp(u) => {
                u.peer = to.map(|a| {
                    if a.any() {
                        Addr {
                            ip: [127, 0, 0, 1],
                            port: a.port,
                        }
                    } else {
                        a
                    }
                });
                Ok(())
            }
            Proto::Tcp(_) => Err(Errno::EINVAL),
        }
    }

    /// `getsockname`.
    pub fn local_addr(&mut self, id: usize) -> Result<Addr, Errno> {
        let s = self.sock_mut(id)?;
        let local = s.local.unwrap_or_default();
        if let Proto::Tcp(Tcp::Conn { side, h, .. }) = s.proto
            && let Some(e) = self.tcp(side, h).and_then(|t| t.local_endpoint())
        {
            return Ok(Addr::of(e));
        }
        if let Proto::Udp(u) = &self.sock_mut(id)?.proto
            && let Some(peer) = u.peer
            && local.any()
            && local.port != 0
        {
            // A connected UDP socket names the address it sends from.
            let ip = if peer.side() == Side::Lo {
                [127, 0, 0, 1]
            } else {
                self.ext_ip().unwrap_or_default()
            };
            return Ok(Addr {
                ip,
                port: local.port,
            });
        }
        Ok(local)
    }

    fn ext_ip(&self) -> Option<[u8; 4]> {
        self.ext.as_ref().and_then(|s| {
            s.iface
                .ip_addrs()
                .iter()
                .map(|c| {
                    let IpAddress::Ipv4(a) = c.address();
                    a.octets()
                })
                .next()
        })
    }

    /// `getpeername`: `ENOTCONN` unless connected.
    pub fn peer_addr(&mut self, id: usize) -> Result<Addr, Errno> {
        let s = self.sock_mut(id)?;
        match &s.proto {
            Proto::Udp(u) => u.peer.ok_or(Errno::ENOTCONN),
            &Proto::Tcp(Tcp::Conn { side, h, seen }) => {
                if matches!(seen, tcp::State::SynSent) {
                    return Err(Errno::ENOTCONN);
                }
                self.tcp(side, h)
                    .and_then(|t| t.remote_endpoint())
                    .map(Addr::of)
                    .ok_or(Errno::ENOTCONN)
            }
            _ => Err(Errno::ENOTCONN),
        }
    }

    /// `shutdown(how)`: 0 `SHUT_RD`, 1 `SHUT_WR`, 2 `SHUT_RDWR`.
    pub fn shutdown(&mut self, id: usize, how: u32) -> Result<(), Errno> {
        if how > 2 {
            return Err(Errno::EINVAL);
        }
        let (rd, wr) = (how != 1, how != 0);
        let s = self.sock_mut(id)?;
        match s.proto.clone() {
            Proto::Tcp(Tcp::Conn { side, h, seen }) => {
                if matches!(seen, tcp::State::SynSent) {
                    return Err(Errno::ENOTCONN);
                }
                s.rd_shut |= rd;
                if wr && !s.wr_shut {
                    s.wr_shut = true;
                    if let Some(t) = self.tcp(side, h) {
                        t.close();
                    }
                    // The state close() moved to (LAST-ACK, FIN-WAIT-1) is
                    // the one a later CLOSED is judged from.
                    self.track(id);
                    self.dirty = true;
                }
                Ok(())
            }
            Proto::Tcp(Tcp::Listening { .. }) if rd => {
                self.drop_listeners(id);
                if let Ok(s) = self.sock_mut(id) {
                    s.proto = Proto::Tcp(Tcp::Idle);
                    s.rd_shut = true;
                }
                Ok(())
            }
            Proto::Udp(u) if u.peer.is_some() => {
                s.rd_shut |= rd;
                s.wr_shut |= wr;
                Ok(())
            }
            // Linux's inet_shutdown marks an unconnected socket shut all
            // the same (its poll then says so), and answers ENOTCONN.
            _ => {
                s.rd_shut |= rd;
                s.wr_shut |= wr;
                Err(Errno::ENOTCONN)
            }
        }
    }

    fn drop_listeners(&mut self, id: usize) {
        let Ok(s) = self.sock_mut(id) else { return };
        let Proto::Tcp(Tcp::Listening {
            listeners, queue, ..
        }) = core::mem::replace(&mut s.proto, Proto::Tcp(Tcp::Done))
        else {
            return;
        };
        for (side, h) in listeners.into_iter().chain(queue) {
            if let Some(st) = self.stack(side) {
                let t = st.set.get_mut::<tcp::Socket>(h);
                t.abort();
                if gone(t) {
                    st.remove(h);
                } else {
                    self.zombies.push((side, h));
                }
            }
        }
        self.dirty = true;
    }

    /// The last descriptor of socket `id` closed: a connection says
    /// goodbye (FIN, or RST when unread data is left or `SO_LINGER` is 0),
    /// listeners and queued connections go.
    pub fn close(&mut self, id: usize) {
        let Some(s) = self.socks.get_mut(id).and_then(Option::take) else {
            return;
        };
        match s.proto {
            Proto::Tcp(Tcp::Listening { .. }) => {
                self.socks[id] = Some(s);
                self.drop_listeners(id);
                self.socks[id] = None;
            }
            Proto::Tcp(Tcp::Conn { side, h, .. }) => {
                if let Some(st) = self.stack(side) {
                    let t = st.set.get_mut::<tcp::Socket>(h);
                    if t.recv_queue() > 0 || s.opts.linger == (true, 0) {
                        t.abort();
                    } else {
                        t.close();
                    }
                    if gone(t) {
                        st.remove(h);
                    } else {
                        self.zombies.push((side, h));
                    }
                }
            }
            Proto::Udp(u) => {
                for (side, h) in [(Side::Lo, u.lo), (Side::Ext, u.ext)] {
                    if let (Some(h), Some(st)) = (h, self.stack(side)) {
                        st.remove(h);
                    }
                }
            }
            Proto::Tcp(_) => {}
        }
        self.dirty = true;
    }

    /// Takes the pending error (`SO_ERROR`).
    pub fn take_error(&mut self, id: usize) -> Result<Option<Errno>, Errno> {
        self.track(id);
        Ok(self.sock_mut(id)?.error.take())
    }

    /// Sends up to `len` bytes that `fill` copies in (it may be called
    /// several times, each with a slice to fill from the caller's data in
    /// order; it returns how many bytes it gave, or an error). `to` is
    /// `sendto`'s address. `EAGAIN` when nothing fits now; `EPIPE` once
    /// the writing side is shut (the caller raises SIGPIPE).
    pub fn send(
        &mut self,
        id: usize,
        len: usize,
        to: Option<Addr>,
        fill: &mut Fill<'_>,
    ) -> Result<usize, Errno> {
        self.track(id);
        let s = self.sock_mut(id)?;
        let proto = s.proto.clone();
        match proto {
            Proto::Tcp(t) => {
                if let Some(e) = s.error.take() {
                    return Err(e);
                }
                if s.wr_shut {
                    return Err(Errno::EPIPE);
                }
                let (side, h) = match t {
                    Tcp::Conn {
                        seen: tcp::State::SynSent | tcp::State::SynReceived,
                        ..
                    } => return Err(Errno::EAGAIN),
                    Tcp::Conn { side, h, .. } => (side, h),
                    _ => return Err(Errno::EPIPE),
                };
                let sock = self.tcp(side, h).ok_or(Errno::EPIPE)?;
                if !sock.may_send() {
                    return Err(Errno::EPIPE);
                }
                if len == 0 {
                    return Ok(0);
                }
                let mut done = 0usize;
                while done < len {
                    let r = sock.send(|room| {
                        let n = room.len().min(len - done);
                        match fill(done, &mut room[..n]) {
                            Ok(()) => (n, Ok(n)),
                            Err(e) => (0, Err(e)),
                        }
                    });
                    match r {
                        Ok(Ok(0)) => break,
                        Ok(Ok(n)) => done += n,
                        Ok(Err(e)) if done == 0 => return Err(e),
                        Ok(Err(_)) => break,
                        Err(_) => break,
                    }
                }
                if done == 0 {
                    return Err(Errno::EAGAIN);
                }
                self.dirty = true;
                self.resync(id);
                Ok(done)
            }
            Proto::Udp(u) => {
                if s.wr_shut {
                    return Err(Errno::EPIPE);
                }
                let to = match (to, u.peer) {
                    (Some(t), _) => t,
                    (None, Some(p)) => p,
                    (None, None) => return Err(Errno::EDESTADDRREQ),
                };
                let to = if to.any() {
                    Addr {
                        ip: [127, 0, 0, 1],
                        port: to.port,
                    }
                } else {
                    to
                };
                if to.port == 0 {
                    return Err(Errno::EINVAL);
                }
                if len > UDP_BYTES.min(65507) {
                    return Err(Errno::EMSGSIZE);
                }
                let local = self.autobind(id)?;
                let side = to.side();
                let h = match &self.sock(id).map(|s| &s.proto) {
                    Some(Proto::Udp(u)) => match side {
                        Side::Lo => u.lo,
                        Side::Ext => u.ext,
                    },
                    _ => None,
                };
                let Some(h) = h else {
                    // Bound to an address of the other side: unreachable.
                    return Err(
                        if self.ext.is_none() || local.side() != side && !local.any() {
                            Errno::ENETUNREACH
                        } else {
                            Errno::EINVAL
                        },
                    );
                };
                // Nobody on the loopback has that port: Linux's ICMP port
                // unreachable comes back, and a connected socket hears it.
                if side == Side::Lo && u.peer.is_some() && !self.udp_port_bound(to) {
                    if let Ok(s) = self.sock_mut(id) {
                        s.error = Some(Errno::ECONNREFUSED);
                    }
                    return Ok(len);
                }
                let mut data = Vec::new();
                data.try_reserve_exact(len).map_err(|_| Errno::ENOMEM)?;
                data.resize(len, 0);
                fill(0, &mut data)?;
                let sock = self.udp(side, h).ok_or(Errno::ENETUNREACH)?;
                sock.send_slice(&data, to.endpoint()).map_err(|e| match e {
                    udp::SendError::BufferFull => Errno::EAGAIN,
                    udp::SendError::Unaddressable => Errno::ENETUNREACH,
                })?;
                self.dirty = true;
                Ok(len)
            }
        }
    }

    /// Receives up to `len` bytes, handing them to `sink` in order (with
    /// their offset); `EAGAIN` when nothing is there yet, 0 bytes at end
    /// of file. `peek` leaves them queued.
    pub fn recv(
        &mut self,
        id: usize,
        len: usize,
        peek: bool,
        sink: &mut Sink<'_>,
    ) -> Result<Received, Errno> {
        self.track(id);
        let s = self.sock_mut(id)?;
        match s.proto.clone() {
            Proto::Tcp(t) => {
                let rd_shut = s.rd_shut;
                let (side, h) = match t {
                    Tcp::Conn {
                        seen: tcp::State::SynSent | tcp::State::SynReceived,
                        ..
                    } => return Err(Errno::EAGAIN),
                    Tcp::Conn { side, h, .. } => (side, h),
                    Tcp::Done => {
                        return match s.error.take() {
                            Some(e) => Err(e),
                            None => Ok(Received {
                                copied: 0,
                                len: 0,
                                from: None,
                            }),
                        };
                    }
                    _ => return Err(Errno::ENOTCONN),
                };
                let sock = self.tcp(side, h).ok_or(Errno::ENOTCONN)?;
                let peer = sock.remote_endpoint().map(Addr::of);
                // A receive of 0 bytes says 0 when there is data (or the
                // end), and waits like any other when there is none.
                if len == 0 && sock.can_recv() {
                    return Ok(Received {
                        copied: 0,
                        len: 0,
                        from: peer,
                    });
                }
                let mut done = 0usize;
                if peek {
                    let mut chunk = [0u8; 4096];
                    let want = len.min(sock.recv_queue()).min(chunk.len());
                    let n = sock.peek_slice(&mut chunk[..want]).unwrap_or(0);
                    if n > 0 {
                        sink(0, &chunk[..n])?;
                        done = n;
                    }
                } else {
                    while done < len && sock.can_recv() {
                        let r = sock.recv(|data| {
                            let n = data.len().min(len - done);
                            match sink(done, &data[..n]) {
                                Ok(()) => (n, Ok(n)),
                                Err(e) => (0, Err(e)),
                            }
                        });
                        match r {
                            Ok(Ok(0)) => break,
                            Ok(Ok(n)) => done += n,
                            Ok(Err(e)) if done == 0 => return Err(e),
                            _ => break,
                        }
                    }
                }
                if done > 0 {
                    self.dirty = true;
                    self.resync(id);
                    return Ok(Received {
                        copied: done,
                        len: done,
                        from: peer,
                    });
                }
                let sock = self.tcp(side, h).ok_or(Errno::ENOTCONN)?;
                if rd_shut || !sock.may_recv() {
                    return Ok(Received {
                        copied: 0,
                        len: 0,
                        from: peer,
                    });
                }
                Err(Errno::EAGAIN)
            }
            Proto::Udp(u) => {
                if let Some(e) = s.error.take() {
                    return Err(e);
                }
                if s.rd_shut {
                    return Ok(Received {
                        copied: 0,
                        len: 0,
                        from: None,
                    });
                }
                for (side, h) in [(Side::Lo, u.lo), (Side::Ext, u.ext)] {
                    let Some(h) = h else { continue };
                    let Some(sock) = self.udp(side, h) else {
                        continue;
                    };
                    let got = if peek {
                        sock.peek().map(|(d, m)| (d, m.endpoint))
                    } else {
                        sock.recv().map(|(d, m)| (d, m.endpoint))
                    };
                    let Ok((data, from)) = got else { continue };
                    // A connected socket takes only its peer's datagrams.
                    if let Some(p) = u.peer
                        && Addr::of(from) != p
                    {
                        if peek {
                            let _ = sock.recv();
                        }
                        continue;
                    }
                    let n = data.len().min(len);
                    let whole = data.len();
                    if n > 0 {
                        sink(0, &data[..n])?;
                    }
                    self.resync(id);
                    return Ok(Received {
                        copied: n,
                        len: whole,
                        from: Some(Addr::of(from)),
                    });
                }
                Err(Errno::EAGAIN)
            }
        }
    }

    /// After a call took data or made room: what [`Net::poll`] compares
    /// the queues with starts from here, so that the next arrival counts
    /// as one (edge-triggered epoll).
    fn resync(&mut self, id: usize) {
        let q = self.queues(id);
        if let Ok(s) = self.sock_mut(id) {
            s.seen.1 = q.0;
            s.seen.2 = q.1;
        }
    }

    /// Bytes waiting to be read (`FIONREAD`): the TCP queue, or the next
    /// datagram's length.
    pub fn readable_bytes(&mut self, id: usize) -> Result<usize, Errno> {
        let s = self.sock_mut(id)?;
        match s.proto.clone() {
            Proto::Tcp(Tcp::Conn { side, h, .. }) => {
                Ok(self.tcp(side, h).map_or(0, |t| t.recv_queue()))
            }
            Proto::Tcp(Tcp::Listening { .. }) => Err(Errno::EINVAL),
            Proto::Tcp(_) => Ok(0),
            Proto::Udp(u) => {
                for (side, h) in [(Side::Lo, u.lo), (Side::Ext, u.ext)] {
                    if let Some(h) = h
                        && let Some(sock) = self.udp(side, h)
                        && let Ok((d, _)) = sock.peek()
                    {
                        return Ok(d.len());
                    }
                }
                Ok(0)
            }
        }
    }

    /// Applies changed options to a connection's smoltcp socket.
    pub fn options_changed(&mut self, id: usize) {
        let Ok(s) = self.sock_mut(id) else { return };
        let opts = s.opts;
        if let Proto::Tcp(Tcp::Conn { side, h, .. }) = s.proto
            && let Some(t) = self.tcp(side, h)
        {
            apply_opts(t, &opts);
        }
    }

    /// Readiness of socket `id` (`EPOLL*` bits), as Linux's `tcp_poll`
    /// and `datagram_poll`.
    pub fn mask(&mut self, id: usize) -> u32 {
        self.track(id);
        let Some(s) = self.sock(id) else { return 0 };
        let err = if s.error.is_some() { EPOLLERR } else { 0 };
        let (rd_shut, wr_shut) = (s.rd_shut, s.wr_shut);
        match s.proto.clone() {
            Proto::Tcp(Tcp::Listening { queue, .. }) => {
                if queue.is_empty() {
                    0
                } else {
                    EPOLLIN | EPOLLRDNORM
                }
            }
            Proto::Tcp(Tcp::Idle) | Proto::Tcp(Tcp::Done) => {
                let mut m = err | EPOLLHUP | EPOLLOUT | EPOLLWRNORM;
                if rd_shut {
                    m |= EPOLLIN | EPOLLRDNORM | EPOLLRDHUP;
                }
                m
            }
            Proto::Tcp(Tcp::Conn { side, h, seen }) => {
                let mut m = err;
                if rd_shut && wr_shut {
                    m |= EPOLLHUP;
                }
                if rd_shut {
                    m |= EPOLLIN | EPOLLRDNORM | EPOLLRDHUP;
                }
                if matches!(seen, tcp::State::SynSent | tcp::State::SynReceived) {
                    return m;
                }
                let Some(t) = self.tcp(side, h) else { return m };
                if t.can_recv() || !t.may_recv() {
                    m |= EPOLLIN | EPOLLRDNORM;
                }
                if !t.may_recv() {
                    m |= EPOLLRDHUP;
                }
                let free = t.send_capacity() - t.send_queue();
                if wr_shut || free > 0 && free >= t.send_queue() / 2 {
                    m |= EPOLLOUT | EPOLLWRNORM;
                }
                m
            }
            Proto::Udp(u) => {
                let mut m = err;
                if rd_shut {
                    m |= EPOLLIN | EPOLLRDNORM | EPOLLRDHUP;
                }
                if rd_shut && wr_shut {
                    m |= EPOLLHUP;
                }
                let mut readable = false;
                let mut writable = u.lo.is_none() && u.ext.is_none();
                for (side, h) in [(Side::Lo, u.lo), (Side::Ext, u.ext)] {
                    if let Some(h) = h
                        && let Some(s) = self.udp(side, h)
                    {
                        readable |= s.can_recv();
                        writable |= s.can_send();
                    }
                }
                if readable {
                    m |= EPOLLIN | EPOLLRDNORM;
                }
                if writable {
                    m |= EPOLLOUT | EPOLLWRNORM | EPOLLWRBAND;
                }
                m
            }
        }
    }

    /// Follows socket `id`'s smoltcp state since it was last seen: a
    /// finished handshake, the peer's FIN, a reset or refusal (kept as the
    /// pending error).
    fn track(&mut self, id: usize) {
        let Ok(s) = self.sock_mut(id) else { return };
        let Proto::Tcp(Tcp::Conn { side, h, seen }) = s.proto else {
            return;
        };
        let Some(state) = self.tcp(side, h).map(|t| t.state()) else {
            return;
        };
        let Ok(s) = self.sock_mut(id) else { return };
        if state != seen {
            if !matches!(
                state,
                tcp::State::SynSent | tcp::State::SynReceived | tcp::State::Closed
            ) {
                s.was_connected = true;
            }
            if state == tcp::State::Closed {
                s.connect_pending = false;
                if seen == tcp::State::SynSent {
                    s.error = Some(Errno::ECONNREFUSED);
                } else if seen == tcp::State::CloseWait {
                    // Linux's tcp_reset: the peer had closed already.
                    s.error = Some(Errno::EPIPE);
                } else if !orderly_end(seen) || !s.wr_shut {
                    s.error = Some(Errno::ECONNRESET);
                }
                s.rd_shut = true;
                s.wr_shut = true;
                s.proto = Proto::Tcp(Tcp::Done);
                if let Some(st) = self.stack(side) {
                    st.remove(h);
                }
                return;
            }
            s.proto = Proto::Tcp(Tcp::Conn {
                side,
                h,
                seen: state,
            });
        }
        // The peer's FIN came: reads end once the data before it is read.
        if matches!(
            state,
            tcp::State::CloseWait
                | tcp::State::LastAck
                | tcp::State::Closing
                | tcp::State::TimeWait
        ) {
            s.rd_shut = true;
        }
    }

    /// Moves finished handshakes of every listening socket to its queue
    /// and tops its listeners up.
    fn accept_ready(&mut self) {
        for id in 0..self.socks.len() {
            let Some(Some(Sock {
                proto: Proto::Tcp(Tcp::Listening { listeners, .. }),
                ..
            })) = self.socks.get(id)
            else {
                continue;
            };
            let ls = listeners.clone();
            let mut done = Vec::new();
            for (side, h) in ls {
                let Some(t) = self.tcp(side, h) else { continue };
                match t.state() {
                    tcp::State::Listen | tcp::State::SynReceived => {}
                    _ => done.push((side, h)),
                }
            }
            if done.is_empty() {
                continue;
            }
            if let Some(Some(Sock {
                proto:
                    Proto::Tcp(Tcp::Listening {
                        listeners, queue, ..
                    }),
                ..
            })) = self.socks.get_mut(id)
            {
                listeners.retain(|l| !done.contains(l));
                queue.extend(done);
            }
            self.refill(id);
        }
    }

    /// Frees zombies that reached `CLOSED`, or `TIME-WAIT`: both ends
    /// have closed, and what Linux keeps of such a connection is a few
    /// bytes, not its buffers (a late duplicate segment then meets a
    /// reset rather than silence).
    fn reap(&mut self) -> bool {
        let mut aborted = false;
        let zs = core::mem::take(&mut self.zombies);
        let now = self.now_us;
        while self
            .time_wait
            .front()
            .is_some_and(|&(_, until)| until <= now)
        {
            self.time_wait.pop_front();
        }
        for (side, h) in zs {
            let Some(st) = self.stack(side) else { continue };
            let t = st.set.get_mut::<tcp::Socket>(h);
            // Data for a socket nobody holds any more: Linux answers
            // with a reset.
            if t.recv_queue() > 0 {
                t.abort();
                aborted = true;
            }
            if t.state() == tcp::State::TimeWait
                && let Some(local) = t.local_endpoint()
            {
                if self.time_wait.len() >= TIME_WAIT_MAX {
                    self.time_wait.pop_front();
                }
                if self.time_wait.try_reserve(1).is_ok() {
                    self.time_wait
                        .push_back((Addr::of(local), now + TIME_WAIT_US));
                }
            }
            let Some(st) = self.stack(side) else { continue };
            let t = st.set.get_mut::<tcp::Socket>(h);
            if gone(t) || t.state() == tcp::State::TimeWait {
                st.remove(h);
            } else {
                self.zombies.push((side, h));
            }
        }
        aborted
    }

    /// Moves packets on both interfaces (`card` is the runtime's device,
    /// when it has one) at `now_ns`, then returns the sockets whose
    /// readiness changed (and those that got more data).
    pub fn poll<D: Device + ?Sized>(&mut self, now_ns: u64, card: Option<&mut D>) -> Vec<Change> {
        let now = Instant::from_micros((now_ns / 1000) as i64);
        self.now_us = now.total_micros();
        self.dirty = false;
        let mut card = card;
        // A reset for data that reached a closed socket goes out in the
        // same poll, as Linux answers it at once.
        for _ in 0..4 {
            // Loopback: what one poll sends, the next receives; a handful
            // of rounds settles a handshake or an exchange.
            for _ in 0..8 {
                let r = self.lo.iface.poll(now, &mut self.lo_dev, &mut self.lo.set);
                if r == smoltcp::iface::PollResult::None {
                    break;
                }
            }
            if let (Some(st), Some(card)) = (self.ext.as_mut(), card.as_deref_mut()) {
                st.iface.poll(now, card, &mut st.set);
            }
            self.accept_ready();
            if !self.reap() {
                break;
            }
        }
        let mut out = Vec::new();
        for id in 0..self.socks.len() {
            if self.sock(id).is_none() {
                continue;
            }
            let mask = self.mask(id);
            let queues = self.queues(id);
            let Ok(s) = self.sock_mut(id) else { continue };
            let (m0, rx0, tx0) = s.seen;
            s.seen = (mask, queues.0, queues.1);
            let mut key = 0;
            if mask != m0 {
                key |= mask;
            }
            if queues.0 > rx0 {
                key |= mask & (EPOLLIN | EPOLLRDNORM);
            }
            if queues.1 < tx0 {
                key |= mask & (EPOLLOUT | EPOLLWRNORM);
            }
            if key != 0 && out.try_reserve(1).is_ok() {
                out.push(Change {
                    pid: s.owner,
                    id,
                    key,
                });
            }
        }
        out
    }

    /// (bytes to read, bytes not yet sent) of socket `id`.
    fn queues(&mut self, id: usize) -> (usize, usize) {
        let Some(s) = self.sock(id) else {
            return (0, 0);
        };
        match s.proto.clone() {
            Proto::Tcp(Tcp::Conn { side, h, .. }) => self
                .tcp(side, h)
                .map_or((0, 0), |t| (t.recv_queue(), t.send_queue())),
            Proto::Tcp(Tcp::Listening { queue, .. }) => (queue.len(), 0),
            Proto::Udp(u) => {
                let mut n = (0, 0);
                for (side, h) in [(Side::Lo, u.lo), (Side::Ext, u.ext)] {
                    if let Some(h) = h
                        && let Some(s) = self.udp(side, h)
                    {
                        n.0 += s.recv_queue();
                        n.1 += s.send_queue();
                    }
                }
                n
            }
            _ => (0, 0),
        }
    }

    /// When the stack next needs a poll (ns on [`Net::poll`]'s clock):
    /// its earliest timer, `None` with nothing pending.
    pub fn poll_at(&mut self, now_ns: u64) -> Option<u64> {
        let now = Instant::from_micros((now_ns / 1000) as i64);
        let lo = self.lo.iface.poll_at(now, &self.lo.set);
        let ext = self.ext.as_mut().and_then(|s| s.iface.poll_at(now, &s.set));
        let at = match (lo, ext) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }?;
        Some(at.total_micros().max(0) as u64 * 1000)
    }

    /// Whether something outside the run's threads may make an open
    /// socket ready (a card, or the stack's timers: a retransmission): a
    /// run whose threads all wait then idles rather than ends.
    pub fn may_wake(&mut self, now_ns: u64) -> bool {
        self.open_count() > 0 && (self.ext.is_some() || self.poll_at(now_ns).is_some())
    }
}

/// Gives a smoltcp socket the options of its Linux socket.
fn apply_opts(t: &mut tcp::Socket<'static>, o: &Opts) {
    t.set_nagle_enabled(!o.nodelay);
    t.set_keep_alive(
        o.keepalive
            .then(|| Duration::from_secs(u64::from(o.keepintvl.max(1)))),
    );
    t.set_hop_limit((o.ttl != 0).then_some(o.ttl));
    // ACK at once: request and answer traffic then never waits out a
    // delayed ACK behind Nagle's rule.
    t.set_ack_delay(None);
}
