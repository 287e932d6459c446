//! Sockets over the loopback interface, through the real handler paths in
//! both ABIs: TCP connections with their handshake, data, ends and
//! errors, UDP datagrams, readiness for poll and epoll (level- and
//! edge-triggered), blocking calls that wait and are made again, and
//! i386's `socketcall`. Between calls the test moves packets as the
//! runtime does ([`Net::poll`](crate::sys::net::Net::poll) and
//! [`net_changed`](crate::sys::net_changed)).

use super::*;
use crate::sys::event::bits::*;

const AF_INET: u64 = 2;
const STREAM: u64 = 1;
const DGRAM: u64 = 2;
const NONBLOCK: u64 = 0o4000;
const ADDR: u64 = SCRATCH + 0x100;
const LEN: u64 = SCRATCH + 0x180;
const BUF: u64 = SCRATCH + 0x1000;
const EV: u64 = SCRATCH + 0x3000;
const MSG_NOSIGNAL: u64 = 0x4000;
const MSG_PEEK: u64 = 2;

fn both() -> [Env; 2] {
    [Env::new(Abi::X86_64), Env::new(Abi::I386)]
}

/// Writes a `sockaddr_in` for `ip:port` at `at`.
fn sockaddr(e: &mut Env, at: u64, ip: [u8; 4], port: u16) {
    let mut b = [0u8; 16];
    b[..2].copy_from_slice(&2u16.to_le_bytes());
    b[2..4].copy_from_slice(&port.to_be_bytes());
    b[4..8].copy_from_slice(&ip);
    e.poke(at, &b);
}

fn tcp(e: &mut Env, flags: u64) -> u64 {
    let fd = e.ret("socket", &[AF_INET, STREAM | flags, 0]);
    assert!(fd >= 3, "socket: {fd}");
    fd as u64
}

/// A listening socket on 127.0.0.1:`port`.
fn listener(e: &mut Env, port: u16) -> u64 {
    let s = tcp(e, NONBLOCK);
    sockaddr(e, ADDR, [127, 0, 0, 1], port);
    assert_eq!(e.ret("bind", &[s, ADDR, 16]), 0);
    assert_eq!(e.ret("listen", &[s, 8]), 0);
    s
}

/// A connected pair over the loopback: (client, accepted).
fn pair(e: &mut Env, port: u16) -> (u64, u64, u64) {
    let l = listener(e, port);
    let c = tcp(e, NONBLOCK);
    sockaddr(e, ADDR, [127, 0, 0, 1], port);
    assert_eq!(e.err("connect", &[c, ADDR, 16]), Errno::EINPROGRESS);
    e.pump_net();
    let a = e.ret("accept4", &[l, 0, 0, NONBLOCK]);
    assert!(a >= 3, "accept4: {a}");
    (l, c, a as u64)
}

fn send(e: &mut Env, fd: u64, data: &[u8]) -> i64 {
    e.poke(BUF, data);
    e.ret("sendto", &[fd, BUF, data.len() as u64, MSG_NOSIGNAL, 0, 0])
}

fn recv(e: &mut Env, fd: u64, len: u64, flags: u64) -> Result<Vec<u8>, Errno> {
    match e.ret("recvfrom", &[fd, BUF, len, flags, 0, 0]) {
        n if n >= 0 => Ok(e.peek(BUF, n as usize)),
        n => Err(errno_of(-n)),
    }
}

fn poll_one(e: &mut Env, fd: u64, events: u16) -> u16 {
    let mut b = (fd as i32).to_le_bytes().to_vec();
    b.extend_from_slice(&(events as i16).to_le_bytes());
    b.extend_from_slice(&0i16.to_le_bytes());
    e.poke(EV, &b);
    e.ret("poll", &[EV, 1, 0]);
    u16::from_le_bytes(e.peek(EV + 6, 2).try_into().unwrap())
}

#[test]
fn a_tcp_connection_carries_data_both_ways_and_ends_in_order() {
    for mut e in both() {
        let (_l, c, a) = pair(&mut e, 5000);
        // The handshake is done: the next connect says 0 (once), then
        // EISCONN, as Linux.
        sockaddr(&mut e, ADDR, [127, 0, 0, 1], 5000);
        assert_eq!(e.ret("connect", &[c, ADDR, 16]), 0);
        assert_eq!(e.err("connect", &[c, ADDR, 16]), Errno::EISCONN);
        assert_eq!(send(&mut e, c, b"hello"), 5);
        e.pump_net();
        assert_eq!(recv(&mut e, a, 2, MSG_PEEK).unwrap(), b"he");
        assert_eq!(recv(&mut e, a, 64, 0).unwrap(), b"hello");
        assert_eq!(recv(&mut e, a, 64, 0), Err(Errno::EAGAIN));
        // read and write are recv and send.
        e.poke(BUF, b"back");
        assert_eq!(e.ret("write", &[a, BUF, 4]), 4);
        e.pump_net();
        assert_eq!(e.ret("read", &[c, BUF + 0x100, 64]), 4);
        assert_eq!(e.peek(BUF + 0x100, 4), b"back");
        // Names: the client's peer is the listener's port, and its own
        // port is the accepted socket's peer.
        e.poke(LEN, &16u32.to_le_bytes());
        assert_eq!(e.ret("getpeername", &[c, ADDR, LEN]), 0);
        assert_eq!(e.peek(ADDR + 2, 6), [0x13, 0x88, 127, 0, 0, 1]);
        e.poke(LEN, &16u32.to_le_bytes());
        assert_eq!(e.ret("getsockname", &[c, ADDR, LEN]), 0);
        let mine = e.peek(ADDR + 2, 2);
        e.poke(LEN, &16u32.to_le_bytes());
        assert_eq!(e.ret("getpeername", &[a, ADDR, LEN]), 0);
        assert_eq!(e.peek(ADDR + 2, 2), mine);
        // The client shuts its writing half: the server reads the end.
        assert_eq!(e.ret("shutdown", &[c, 1]), 0);
        e.pump_net();
        assert_eq!(recv(&mut e, a, 64, 0).unwrap(), b"");
        assert_ne!(poll_one(&mut e, a, 0x2001) & 0x2000, 0, "POLLRDHUP");
        // Writing after SHUT_WR: EPIPE, and SIGPIPE unless MSG_NOSIGNAL.
        assert_eq!(send(&mut e, c, b"x"), -(Errno::EPIPE as i64));
        assert_eq!(e.t.pending & (1 << 12), 0);
        e.poke(BUF, b"x");
        assert_eq!(e.err("write", &[c, BUF, 1]), Errno::EPIPE);
        assert_ne!(e.t.pending & (1 << 12), 0, "SIGPIPE raised");
        assert_eq!(e.ret("close", &[a]), 0);
        assert_eq!(e.ret("close", &[c]), 0);
        e.pump_net();
    }
}

#[test]
fn connect_to_a_closed_port_is_refused_blocking_or_not() {
    for mut e in both() {
        let c = tcp(&mut e, 0);
        sockaddr(&mut e, ADDR, [127, 0, 0, 1], 5001);
        // Blocking: the call waits; the RST wakes it with ECONNREFUSED.
        assert!(matches!(
            e.call("connect", &[c, ADDR, 16]),
            Action::Wait { until_ns: None }
        ));
        e.pump_net();
        assert_eq!(
            e.resume(),
            Some(Action::Return(Errno::ECONNREFUSED.to_return()))
        );
        // Non-blocking: EINPROGRESS, then POLLOUT|POLLERR|POLLHUP and
        // SO_ERROR says why (once).
        let n = tcp(&mut e, NONBLOCK);
        assert_eq!(e.err("connect", &[n, ADDR, 16]), Errno::EINPROGRESS);
        e.pump_net();
        let r = poll_one(&mut e, n, 0x4);
        assert_eq!(r & 0x1c, 0x1c, "POLLOUT|POLLERR|POLLHUP: {r:#x}");
        e.poke(LEN, &4u32.to_le_bytes());
        assert_eq!(e.ret("getsockopt", &[n, 1, 4, BUF, LEN]), 0);
        assert_eq!(e.u32_at(BUF), Errno::ECONNREFUSED as u32);
        assert_eq!(e.ret("getsockopt", &[n, 1, 4, BUF, LEN]), 0);
        assert_eq!(e.u32_at(BUF), 0);
    }
}

#[test]
fn a_blocking_accept_and_recv_wait_until_the_peer_acts() {
    let mut e = Env::new(Abi::X86_64);
    let l = tcp(&mut e, 0);
    sockaddr(&mut e, ADDR, [127, 0, 0, 1], 5002);
    assert_eq!(e.ret("bind", &[l, ADDR, 16]), 0);
    assert_eq!(e.ret("listen", &[l, 1]), 0);
    assert!(matches!(e.call("accept", &[l, 0, 0]), Action::Wait { .. }));
    e.sys.waits.remove(e.t.tid);
    e.t.wait = None;
    let c = tcp(&mut e, NONBLOCK);
    assert_eq!(e.err("connect", &[c, ADDR, 16]), Errno::EINPROGRESS);
    e.pump_net();
    let a = e.ret("accept4", &[l, 0, 0, 0]) as u64;
    assert!(a > c);
    assert!(matches!(
        e.call("recvfrom", &[a, BUF, 16, 0, 0, 0]),
        Action::Wait { .. }
    ));
    let woken = e.m.woken.len();
    send(&mut e, c, b"wake");
    e.pump_net();
    assert!(e.m.woken.len() > woken, "the data wakes the waiter");
    assert_eq!(e.resume(), Some(Action::Return(4)));
    assert_eq!(e.peek(BUF, 4), b"wake");
    // SO_RCVTIMEO bounds a wait: past it the call says EAGAIN.
    let mut tv = 0u64.to_le_bytes().to_vec();
    tv.extend_from_slice(&1000u64.to_le_bytes());
    e.poke(ADDR, &tv);
    assert_eq!(e.ret("setsockopt", &[a, 1, 20, ADDR, 16]), 0);
    let Action::Wait { until_ns: Some(_) } = e.call("recvfrom", &[a, BUF, 16, 0, 0, 0]) else {
        panic!("a timed wait")
    };
    e.m.mono += 10_000_000;
    assert_eq!(e.resume(), Some(Action::Return(Errno::EAGAIN.to_return())));
}

#[test]
fn binding_follows_linux_rules() {
    for mut e in both() {
        let a = tcp(&mut e, 0);
        sockaddr(&mut e, ADDR, [127, 0, 0, 1], 5003);
        assert_eq!(e.ret("bind", &[a, ADDR, 16]), 0);
        assert_eq!(
            e.err("bind", &[a, ADDR, 16]),
            Errno::EINVAL,
            "bound already"
        );
        assert_eq!(e.ret("listen", &[a, 4]), 0);
        let b = tcp(&mut e, 0);
        assert_eq!(e.err("bind", &[b, ADDR, 16]), Errno::EADDRINUSE);
        sockaddr(&mut e, ADDR, [0, 0, 0, 0], 5003);
        assert_eq!(
            e.err("bind", &[b, ADDR, 16]),
            Errno::EADDRINUSE,
            "ANY overlaps"
        );
        // SO_REUSEADDR does not share a port with a listener.
        e.poke(BUF, &1u32.to_le_bytes());
        assert_eq!(e.ret("setsockopt", &[b, 1, 2, BUF, 4]), 0);
        assert_eq!(e.err("bind", &[b, ADDR, 16]), Errno::EADDRINUSE);
        // Not ours, short, the wrong family.
        sockaddr(&mut e, ADDR, [10, 9, 9, 9], 5004);
        assert_eq!(e.err("bind", &[b, ADDR, 16]), Errno::EADDRNOTAVAIL);
        assert_eq!(e.err("bind", &[b, ADDR, 8]), Errno::EINVAL);
        e.poke(ADDR, &10u16.to_le_bytes());
        assert_eq!(e.err("bind", &[b, ADDR, 16]), Errno::EAFNOSUPPORT);
        // Port 0 picks an ephemeral port.
        sockaddr(&mut e, ADDR, [127, 0, 0, 1], 0);
        assert_eq!(e.ret("bind", &[b, ADDR, 16]), 0);
        e.poke(LEN, &16u32.to_le_bytes());
        assert_eq!(e.ret("getsockname", &[b, ADDR, LEN]), 0);
        let port = u16::from_be_bytes(e.peek(ADDR + 2, 2).try_into().unwrap());
        assert!((32768..=60999).contains(&port), "{port}");
    }
}

#[test]
fn bad_calls_get_linux_errors() {
    for mut e in both() {
        assert_eq!(e.err("socket", &[10, STREAM, 0]), Errno::EAFNOSUPPORT);
        assert_eq!(e.err("socket", &[1, STREAM, 0]), Errno::EAFNOSUPPORT);
        assert_eq!(e.err("socket", &[AF_INET, 3, 0]), Errno::ESOCKTNOSUPPORT);
        assert_eq!(e.err("socket", &[AF_INET, 12, 0]), Errno::EINVAL);
        assert_eq!(
            e.err("socket", &[AF_INET, STREAM, 17]),
            Errno::EPROTONOSUPPORT
        );
        assert_eq!(e.err("listen", &[1, 1]), Errno::ENOTSOCK);
        assert_eq!(e.err("listen", &[99, 1]), Errno::EBADF);
        let s = tcp(&mut e, NONBLOCK);
        assert_eq!(e.err("accept4", &[s, 0, 0, 0]), Errno::EINVAL);
        assert_eq!(recv(&mut e, s, 4, 0), Err(Errno::ENOTCONN));
        assert_eq!(send(&mut e, s, b"x"), -(Errno::EPIPE as i64));
        e.poke(LEN, &16u32.to_le_bytes());
        assert_eq!(e.err("getpeername", &[s, ADDR, LEN]), Errno::ENOTCONN);
        e.poke(BUF, &1u32.to_le_bytes());
        assert_eq!(
            e.err("setsockopt", &[s, 1, 999, BUF, 4]),
            Errno::ENOPROTOOPT
        );
        assert_eq!(e.err("setsockopt", &[s, 1, 2, BUF, 2]), Errno::EINVAL);
        assert_eq!(e.err("setsockopt", &[s, 1, 2, 0x10, 4]), Errno::EFAULT);
        let u = e.ret("socket", &[AF_INET, DGRAM, 0]) as u64;
        assert_eq!(e.err("listen", &[u, 1]), Errno::EOPNOTSUPP);
        assert_eq!(e.err("sendto", &[u, BUF, 1, 0, 0, 0]), Errno::EDESTADDRREQ);
        // Options read back.
        assert_eq!(e.ret("setsockopt", &[s, 6, 1, BUF, 4]), 0);
        e.poke(LEN, &4u32.to_le_bytes());
        assert_eq!(e.ret("getsockopt", &[s, 6, 1, BUF + 8, LEN]), 0);
        assert_eq!(e.u32_at(BUF + 8), 1, "TCP_NODELAY");
        e.poke(BUF, &4096u32.to_le_bytes());
        assert_eq!(e.ret("setsockopt", &[s, 1, 8, BUF, 4]), 0);
        assert_eq!(e.ret("getsockopt", &[s, 1, 8, BUF + 8, LEN]), 0);
        assert_eq!(e.u32_at(BUF + 8), 8192, "SO_RCVBUF doubles");
        assert_eq!(e.ret("getsockopt", &[s, 1, 3, BUF + 8, LEN]), 0);
        assert_eq!(e.u32_at(BUF + 8), 1, "SO_TYPE");
    }
}

#[test]
fn udp_datagrams_keep_their_bounds_and_senders() {
    for mut e in both() {
        let a = e.ret("socket", &[AF_INET, DGRAM | NONBLOCK, 0]) as u64;
        let b = e.ret("socket", &[AF_INET, DGRAM | NONBLOCK, 0]) as u64;
        sockaddr(&mut e, ADDR, [127, 0, 0, 1], 6000);
        assert_eq!(e.ret("bind", &[a, ADDR, 16]), 0);
        e.poke(BUF, b"onetwo!");
        assert_eq!(e.ret("sendto", &[b, BUF, 3, 0, ADDR, 16]), 3);
        assert_eq!(e.ret("sendto", &[b, BUF + 3, 4, 0, ADDR, 16]), 4);
        e.pump_net();
        let from = SCRATCH + 0x200;
        e.poke(LEN, &16u32.to_le_bytes());
        assert_eq!(e.ret("recvfrom", &[a, BUF + 0x100, 64, 0, from, LEN]), 3);
        assert_eq!(e.peek(BUF + 0x100, 3), b"one");
        // The sender's address is b's (autobound) name.
        e.poke(LEN + 8, &16u32.to_le_bytes());
        assert_eq!(e.ret("getsockname", &[b, ADDR + 0x40, LEN + 8]), 0);
        assert_eq!(e.peek(from + 2, 2), e.peek(ADDR + 0x40 + 2, 2));
        // A short buffer truncates; MSG_TRUNC says the real length.
        assert_eq!(e.ret("recvfrom", &[a, BUF + 0x100, 2, 0x20, 0, 0]), 4);
        assert_eq!(e.peek(BUF + 0x100, 2), b"tw");
        assert_eq!(recv(&mut e, a, 64, 0), Err(Errno::EAGAIN));
        // Connected: send without an address.
        assert_eq!(e.ret("connect", &[b, ADDR, 16]), 0);
        assert_eq!(send(&mut e, b, b"c"), 1);
        e.pump_net();
        assert_eq!(recv(&mut e, a, 64, 0).unwrap(), b"c");
    }
}

#[test]
fn epoll_reports_socket_readiness_level_and_edge_triggered() {
    for mut e in both() {
        let (l, c, a) = pair(&mut e, 5005);
        let ep = e.ret("epoll_create1", &[0]) as u64;
        let add = |e: &mut Env, fd: u64, ev: u32, data: u64| {
            // Packed in both ABIs: 12 bytes.
            let mut b = ev.to_le_bytes().to_vec();
            b.extend_from_slice(&data.to_le_bytes());
            e.poke(EV, &b);
            assert_eq!(e.ret("epoll_ctl", &[ep, 1, fd, EV]), 0);
        };
        add(&mut e, a, EPOLLIN | EPOLLET, 1);
        add(&mut e, l, EPOLLIN, 2);
        let wait = |e: &mut Env| e.ret("epoll_wait", &[ep, EV + 0x100, 8, 0]);
        assert_eq!(wait(&mut e), 0);
        send(&mut e, c, b"abcdef");
        e.pump_net();
        assert_eq!(wait(&mut e), 1, "the arrival");
        assert_eq!(recv(&mut e, a, 2, 0).unwrap(), b"ab");
        assert_eq!(wait(&mut e), 0, "edge-triggered: no new arrival");
        send(&mut e, c, b"g");
        e.pump_net();
        assert_eq!(wait(&mut e), 1, "a new arrival");
        // Level-triggered listener: a pending connection reports until
        // accepted.
        let d = tcp(&mut e, NONBLOCK);
        sockaddr(&mut e, ADDR, [127, 0, 0, 1], 5005);
        assert_eq!(e.err("connect", &[d, ADDR, 16]), Errno::EINPROGRESS);
        e.pump_net();
        assert_eq!(wait(&mut e), 1);
        assert_eq!(wait(&mut e), 1);
        assert!(e.ret("accept4", &[l, 0, 0, 0]) > 0);
        assert_eq!(wait(&mut e), 0);
    }
}

#[test]
fn i386_socketcall_reaches_the_same_calls() {
    let mut e = Env::new(Abi::I386);
    let args = SCRATCH + 0x400;
    let words = |e: &mut Env, w: &[u32]| {
        let b: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        e.poke(args, &b);
    };
    words(&mut e, &[2, 1 | NONBLOCK as u32, 0]);
    let l = e.ret("socketcall", &[1, args]);
    assert!(l >= 3);
    sockaddr(&mut e, ADDR, [127, 0, 0, 1], 5006);
    words(&mut e, &[l as u32, ADDR as u32, 16]);
    assert_eq!(e.ret("socketcall", &[2, args]), 0);
    words(&mut e, &[l as u32, 4]);
    assert_eq!(e.ret("socketcall", &[4, args]), 0);
    words(&mut e, &[2, 1 | NONBLOCK as u32, 0]);
    let c = e.ret("socketcall", &[1, args]);
    words(&mut e, &[c as u32, ADDR as u32, 16]);
    assert_eq!(e.err("socketcall", &[3, args]), Errno::EINPROGRESS);
    e.pump_net();
    words(&mut e, &[l as u32, 0, 0]);
    let a = e.ret("socketcall", &[5, args]);
    assert!(a > c);
    e.poke(BUF, b"via socketcall");
    words(&mut e, &[c as u32, BUF as u32, 14, 0]);
    assert_eq!(e.ret("socketcall", &[9, args]), 14);
    e.pump_net();
    words(&mut e, &[a as u32, (BUF + 0x100) as u32, 64, 0]);
    assert_eq!(e.ret("socketcall", &[10, args]), 14);
    assert_eq!(e.peek(BUF + 0x100, 14), b"via socketcall");
    assert_eq!(e.err("socketcall", &[0, args]), Errno::EINVAL);
    assert_eq!(e.err("socketcall", &[21, args]), Errno::EINVAL);
}

#[test]
fn a_reset_reads_as_econnreset_and_the_process_end_closes_its_sockets() {
    let mut e = Env::new(Abi::X86_64);
    let (_l, c, a) = pair(&mut e, 5007);
    send(&mut e, c, b"unread");
    e.pump_net();
    // Closing with unread data resets the connection.
    assert_eq!(e.ret("close", &[a]), 0);
    e.pump_net();
    assert_eq!(recv(&mut e, c, 16, 0), Err(Errno::ECONNRESET));
    assert_eq!(recv(&mut e, c, 16, 0).unwrap(), b"");
    assert!(e.sys.net.open_count() >= 2);
    crate::sys::process_ended(
        &mut e.sys,
        &mut e.p,
        crate::sys::procs::Status::Exited(0),
        |_| {},
    );
    assert_eq!(e.sys.net.open_count(), 0);
}

#[test]
fn a_socket_a_forked_child_holds_outlives_its_parent() {
    let mut e = Env::new(Abi::X86_64);
    let (l, c, a) = pair(&mut e, 5009);
    // A child's table names the same descriptions (fork).
    let mut child = e.sys.files.copy_table(&e.p.fds).unwrap();
    let open = e.sys.net.open_count();
    crate::sys::process_ended(
        &mut e.sys,
        &mut e.p,
        crate::sys::procs::Status::Exited(0),
        |_| {},
    );
    assert_eq!(e.sys.net.open_count(), open, "the child holds them all");
    // The child closes the accepted one: that alone goes.
    e.sys.files.close(&mut child, a).unwrap();
    for id in e.sys.files.take_closed_sockets() {
        e.sys.net.close(id);
    }
    assert_eq!(e.sys.net.open_count(), open - 1);
    let gone = e.sys.files.close_all(&mut child);
    assert!(!gone.is_empty() && l != c);
    for id in e.sys.files.take_closed_sockets() {
        e.sys.net.close(id);
    }
    assert_eq!(e.sys.net.open_count(), 0);
}

#[test]
fn data_for_a_closed_socket_resets_its_peer() {
    for mut e in both() {
        let (_l, c, a) = pair(&mut e, 5008);
        assert_eq!(e.ret("close", &[a]), 0);
        e.pump_net();
        // The peer's FIN came: end of file, and sending still works.
        assert_eq!(recv(&mut e, c, 16, 0).unwrap(), b"");
        assert_eq!(send(&mut e, c, b"x"), 1);
        e.pump_net();
        e.pump_net();
        let r = poll_one(&mut e, c, 0x2005);
        assert_eq!(r, 0x201d, "IN|OUT|ERR|HUP|RDHUP: {r:#x}");
        // The peer had closed: Linux's reset in CLOSE-WAIT says EPIPE.
        assert_eq!(send(&mut e, c, b"x"), -(Errno::EPIPE as i64));
        assert_eq!(recv(&mut e, c, 16, 0).unwrap(), b"");
    }
}

#[test]
fn a_blocking_send_queues_all_of_its_data_or_says_how_much_a_signal_left() {
    for mut e in both() {
        let (_l, c, a) = pair(&mut e, 5009);
        // c blocking; 48 KiB is more than its 32 KiB of buffer.
        let fl = e.ret("fcntl", &[c, 3, 0]) as u64;
        assert_eq!(e.ret("fcntl", &[c, 4, fl & !NONBLOCK]), 0);
        let big: Vec<u8> = (0..48 * 1024u32).map(|i| (i * 7 % 251) as u8).collect();
        e.poke(SCRATCH + 0x4000, &big);
        let send = e.call("write", &[c, SCRATCH + 0x4000, big.len() as u64]);
        assert!(matches!(send, Action::Wait { .. }), "{send:?}");
        assert!(e.t.sent > 0 && (e.t.sent as usize) < big.len());
        // The peer reads; the writer goes on from where it was until all
        // of it is queued.
        let mut got = Vec::new();
        let mut done = None;
        for _ in 0..64 {
            e.pump_net();
            while let Ok(d) = recv(&mut e, a, 8192, 0) {
                if d.is_empty() {
                    break;
                }
                got.extend_from_slice(&d);
            }
            e.pump_net();
            if done.is_none() {
                match e.resume() {
                    Some(Action::Return(n)) => done = Some(n),
                    Some(Action::Wait { .. }) => {}
                    other => panic!("{other:?}"),
                }
            }
            if got.len() == big.len() {
                break;
            }
        }
        assert_eq!(done, Some(big.len() as u64));
        assert!(got == big, "the bytes arrive whole and in order");
        assert_eq!(e.t.sent, 0);
        // A signal while part of it waits: the call says how much went.
        let send = e.call("write", &[c, SCRATCH + 0x4000, big.len() as u64]);
        assert!(matches!(send, Action::Wait { .. }));
        let part = e.t.sent;
        assert!(part > 0);
        assert_eq!(crate::sys::interrupt_wait(&mut e.sys, &mut e.t), Some(part));
        assert_eq!((e.t.sent, e.t.wait, e.t.interrupted), (0, None, None));
    }
}

#[test]
fn sendfile_sends_a_file_on_a_connection_and_waits_for_room() {
    for mut e in both() {
        let (_l, c, a) = pair(&mut e, 5010);
        let data: Vec<u8> = (0..3000u32).map(|i| (i * 7 % 256) as u8).collect();
        let p = e.cstr(SCRATCH, "/tmp/page");
        let f = e.ret("open", &[p, 0o102, 0o644]) as u64;
        e.poke(BUF, &data);
        assert_eq!(e.ret("write", &[f, BUF, 3000]), 3000);
        assert_eq!(e.ret("lseek", &[f, 1000, 0]), 1000);
        // From the file's offset to its end: what is left, not the count.
        assert_eq!(e.ret("sendfile", &[c, f, 0, 100_000]), 2000);
        assert_eq!(e.ret("lseek", &[f, 0, 1]), 3000);
        assert_eq!(e.ret("sendfile", &[c, f, 0, 100_000]), 0);
        e.pump_net();
        let mut got = Vec::new();
        while let Ok(part) = recv(&mut e, a, 4096, 0) {
            got.extend_from_slice(&part);
        }
        assert_eq!(got, &data[1000..]);
        // A socket that takes no more: EAGAIN when non-blocking, a wait
        // when blocking.
        let off = SCRATCH + 0x800;
        let mut queued = 0;
        loop {
            e.poke(
                off,
                &0u64.to_le_bytes()[..if e.abi == Abi::X86_64 { 8 } else { 4 }],
            );
            match e.ret("sendfile", &[c, f, off, 3000]) {
                n if n > 0 => queued += n,
                n => {
                    assert_eq!(errno_of(-n), Errno::EAGAIN);
                    break;
                }
            }
            assert!(queued < 1 << 24, "the socket never filled");
        }
        assert_eq!(e.ret("fcntl", &[c, 4, 0]), 0);
        assert_eq!(
            e.call("sendfile", &[c, f, off, 3000]),
            Action::Wait { until_ns: None }
        );
        // Its peer reads: the bytes arrive in order, and there is room.
        e.pump_net();
        let mut first = Vec::new();
        while first.len() < 3000 {
            first.extend_from_slice(&recv(&mut e, a, 3000 - first.len() as u64, 0).unwrap());
        }
        assert_eq!(first, data);
        e.pump_net();
        assert!(e.ret("sendfile", &[c, f, off, 3000]) > 0);
    }
}
