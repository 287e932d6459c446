//! Sockets under the runtime (issue #26):
//! - `tests/programs/c/sockets.c` (TCP and UDP over 127.0.0.1 in one
//!   process: blocking and non-blocking calls, errors, socket options,
//!   shutdown, resets and SIGPIPE, poll/ppoll/select/pselect and level-,
//!   edge-triggered and one-shot epoll on sockets, a 1 MiB transfer, waits
//!   a helper thread ends, and on i386 the socketcall multiplexer), built
//!   with glibc 64- and 32-bit and musl, prints under the runtime exactly
//!   what it prints natively and ends the same way;
//! - loopback between processes of one appliance: `netpeer serve` and
//!   `netpeer client 127.0.0.1`, `netpeer udp-serve` and `netpeer udp-echo
//!   127.0.0.1`, each pair of different builds;
//! - a client in the appliance reaches the host through QEMU's user network
//!   (`perch record --net`, the host is 10.0.2.2): a line echo with a TCP
//!   server of the test's, and a UDP round trip with a UDP echo server of
//!   the test's.
//!
//! Natively every program is checked first: the same bytes on every run and
//! in every build, and the lines the runtime must match.
#![forbid(unsafe_code)]

use e2e_tests::programs::{
    CBuild, End, Program, RunEnd, appliance, assert_same_as_native, c_program, c_program_with,
    run_appliance, run_native,
};
use e2e_tests::{STATUS_PASS, qemu_present, record_realtime};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, UdpSocket};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A run that ends by itself: the duration is only a backstop.
const CMDLINE: &str = "duration=150000";
const TIMEOUT: Duration = Duration::from_secs(240);

/// The socket calls, as the runtime names them in its summary of unknown
/// calls (x86-64 and i386 direct calls, and i386's multiplexer).
const SOCKET_CALLS: &[&str] = &[
    "socket",
    "connect",
    "accept",
    "accept4",
    "sendto",
    "recvfrom",
    "sendmsg",
    "recvmsg",
    "shutdown",
    "bind",
    "listen",
    "getsockname",
    "getpeername",
    "setsockopt",
    "getsockopt",
    "socketcall",
];

/// `tests/programs/c/sockets.c` built as `build` (a helper thread needs
/// `-pthread`).
fn sockets_c(build: CBuild) -> PathBuf {
    c_program_with("sockets", build, &["-pthread"], "")
}

/// Lines every build prints natively, one per kind of check.
const SOCKETS_LINES: &[&str] = &[
    "socket nonblock cloexec: O_NONBLOCK yes FD_CLOEXEC yes",
    "bound: family AF_INET addr 127.0.0.1 port nonzero yes len 16",
    "bind to a port in use: EADDRINUSE",
    "bind to a non-local address: EADDRNOTAVAIL",
    "bind to a port in TIME_WAIT with SO_REUSEADDR: ok",
    "blocking connect to a closed port: ECONNREFUSED",
    "non-blocking connect to a closed port: EINPROGRESS",
    "SO_ERROR: ECONNREFUSED",
    "non-blocking connect to a listener: EINPROGRESS",
    "accept on an empty queue (non-blocking): EAGAIN",
    "accept4 SOCK_NONBLOCK|SOCK_CLOEXEC: ok, O_NONBLOCK yes FD_CLOEXEC yes",
    "getpeername(client) is getsockname(accepted): yes",
    "recv MSG_PEEK: 5 \"hello\"",
    "readv: 6 \"ab|cdef\"",
    "recvmsg 2 iovecs: 13 \"one t|wo three\" namelen 0 flags 0",
    "recv on an empty non-blocking socket: EAGAIN",
    "1 MiB transfer: 1048576 bytes, fnv-1a 186f24732f17c4a9, matches yes, EAGAIN seen yes, eof yes",
    "peer poll after SHUT_WR: IN|OUT|RDHUP",
    "peer recv after SHUT_WR: 0",
    "send MSG_NOSIGNAL after the reset: EPIPE",
    "write with a SIGPIPE handler: EPIPE",
    "SIGPIPE handler ran: 1",
    "recv after a close with unread data: ECONNRESET",
    "recv on a never-connected socket: ENOTCONN",
    "send on a never-connected socket: EPIPE",
    "getpeername on a never-connected socket: ENOTCONN",
    "listen on UDP: EOPNOTSUPP",
    "accept on a socket that does not listen: EINVAL",
    "bind on a bad fd: EBADF",
    "bind on a pipe: ENOTSOCK",
    "socket with family 12345: EAFNOSUPPORT",
    "socket with type 15: EINVAL",
    "connect with a bad address pointer: EFAULT",
    "connect with addrlen 4: EINVAL",
    "TCP_NODELAY set: 1",
    "SO_RCVBUF: positive yes, at least what was set yes",
    "getsockopt SOL_SOCKET option 12345: ENOPROTOOPT",
    "setsockopt SO_REUSEADDR optlen 1: EINVAL",
    "epoll level: 1, after a partial read 1 [events IN data 1]",
    "epoll edge: 1, after a partial read 0, new data 1, then 0",
    "epoll one-shot: 1, then 0, re-armed 1, then 0",
    "epoll EPOLLOUT on a connected socket: 1 [events OUT data 4]",
    "epoll on a listener, a connection pending: 1 [events IN data 6]",
    "epoll after the peer's SHUT_WR: 1 [events IN|OUT|RDHUP]",
    "epoll eventfd and sockets: eventfd yes, socket with data yes, idle socket no",
    "poll: 1, readable+writable IN|OUT, idle 0",
    "select: 3, readable yes no, writable yes yes",
    "pselect: 2, readable yes no, writable yes",
    "udp recvfrom: 8 \"datagram\" from 127.0.0.1, port is the sender's yes, addrlen 16",
    "udp datagram 1: 5 \"three\"",
    "udp recv MSG_PEEK|MSG_TRUNC into 4 bytes: 10 \"0123\"",
    "udp recvmsg into 4 bytes: 4 \"0123\" MSG_TRUNC yes",
    "udp recv then: ECONNREFUSED",
    "blocking recv with SO_RCVTIMEO 30 ms: EAGAIN",
    "blocking recv woken by the peer: 4 \"late\"",
    "blocking accept woken by a connect: ok",
    "recv MSG_WAITALL of 4 over two sends: 4 \"abcd\"",
    "blocking send into full buffers once the peer reads: 1000",
    "blocking send of 1 MiB: 1048576",
    "raw socket calls: ok",
    "socketcall: ok",
    "sockets done",
];

/// The native run of `p` did what the tests rely on, twice alike; its
/// stdout.
fn assert_native_sockets_work(p: &Program) -> String {
    let native = p.native();
    let out = native.out();
    let again = p.native();
    assert_eq!(
        native,
        again,
        "two native runs differ; the first differing lines:\n{}",
        first_difference(&out, &again.out())
    );
    for line in SOCKETS_LINES {
        assert!(
            out.lines().any(|l| l == *line),
            "native run lacks {line:?}:\n{out}"
        );
    }
    assert_eq!(native.end, Some(End::Exited(0)), "native run:\n{out}");
    assert!(
        native.stderr.is_empty(),
        "native stderr: {:?}",
        native.stderr
    );
    out
}

/// The first line where `a` and `b` differ, both ways, for messages.
fn first_difference(a: &str, b: &str) -> String {
    let (mut la, mut lb) = (a.lines(), b.lines());
    loop {
        match (la.next(), lb.next()) {
            (None, None) => return "(the same lines)".into(),
            (x, y) if x != y => return format!("{x:?}\n{y:?}"),
            _ => {}
        }
    }
}

fn check_sockets(build: CBuild, name: &str) {
    let p = Program::new(&sockets_c(build), name, &[], &[]);
    assert_native_sockets_work(&p);
    if !qemu_present() {
        return;
    }
    assert_same_as_native(std::slice::from_ref(&p), CMDLINE, TIMEOUT, SOCKET_CALLS);
}

#[test]
fn sockets_glibc_match_their_native_run() {
    check_sockets(CBuild::Glibc, "sock-glibc");
}

#[test]
fn sockets_glibc_i386_match_their_native_run() {
    check_sockets(CBuild::Glibc32, "sock-glibc32");
}

#[test]
fn sockets_musl_match_their_native_run() {
    check_sockets(CBuild::Musl, "sock-musl");
}

/// Natively the three builds print the same bytes (i386 through the
/// socketcall multiplexer as well as the direct calls).
#[test]
fn the_three_sockets_builds_print_the_same_natively() {
    let outs: Vec<String> = [CBuild::Glibc, CBuild::Glibc32, CBuild::Musl]
        .into_iter()
        .map(|b| {
            Program::new(&sockets_c(b), "sockets", &[], &[])
                .native()
                .out()
        })
        .collect();
    assert_eq!(
        outs[0],
        outs[1],
        "glibc and glibc -m32 differ:\n{}",
        first_difference(&outs[0], &outs[1])
    );
    assert_eq!(
        outs[0],
        outs[2],
        "glibc and musl differ:\n{}",
        first_difference(&outs[0], &outs[2])
    );
}

// ---- netpeer: processes of one appliance, and peers on the host ----

fn netpeer(build: CBuild) -> PathBuf {
    c_program("netpeer", build)
}

/// What `netpeer client` prints after a good exchange.
const CLIENT_OUT: &str = "client: connected\n\
client: echo: line 1\n\
client: echo: line 2\n\
client: echo: line 3\n\
client: 3 replies, then EOF\n";

/// What `netpeer serve` prints after a good exchange with a client on
/// 127.0.0.1.
const SERVE_OUT: &str = "serve: listening\n\
serve: connection from 127.0.0.1\n\
serve: line 1\n\
serve: line 2\n\
serve: line 3\n\
serve: 3 lines, then the peer shut its side\n";

/// What `netpeer udp-echo` prints after a good round trip.
const UDP_ECHO_OUT: &str = "udp: \"ping 1\" came back from the server: yes\n\
udp: \"ping 2\" came back from the server: yes\n\
udp: \"ping 3\" came back from the server: yes\n\
udp: done\n";

/// What `netpeer udp-serve PORT 3` prints after a good round trip.
const UDP_SERVE_OUT: &str = "udp-serve: bound\n\
udp-serve: ping 1\n\
udp-serve: ping 2\n\
udp-serve: ping 3\n\
udp-serve: 3 datagrams answered\n";

/// A port free on the host's loopback a moment ago (TCP and UDP).
fn free_port() -> u16 {
    for _ in 0..100 {
        let tcp = TcpListener::bind("127.0.0.1:0").expect("a free TCP port");
        let port = tcp.local_addr().expect("its address").port();
        if UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no port free for both TCP and UDP");
}

/// The four loopback processes: a TCP server (glibc) and client (glibc
/// i386, socketcall), a UDP echo server (musl) and client (glibc), on
/// `tcp` and `udp`.
fn loopback_programs(tcp: u16, udp: u16) -> Vec<Program> {
    let (tcp, udp) = (tcp.to_string(), udp.to_string());
    vec![
        Program::new(&netpeer(CBuild::Glibc), "server", &["serve", &tcp], &[]),
        Program::new(
            &netpeer(CBuild::Glibc32),
            "client",
            &["client", "127.0.0.1", &tcp],
            &[],
        ),
        Program::new(
            &netpeer(CBuild::Musl),
            "udpserver",
            &["udp-serve", &udp, "3"],
            &[],
        ),
        Program::new(
            &netpeer(CBuild::Glibc),
            "udpclient",
            &["udp-echo", "127.0.0.1", &udp],
            &[],
        ),
    ]
}

/// What each loopback process prints after a good exchange, by name.
const LOOPBACK_OUT: [(&str, &str); 4] = [
    ("server", SERVE_OUT),
    ("client", CLIENT_OUT),
    ("udpserver", UDP_SERVE_OUT),
    ("udpclient", UDP_ECHO_OUT),
];

#[test]
fn two_processes_of_one_appliance_talk_over_loopback() {
    // Natively: all four at once, on ports free on the host.
    let natives: Vec<_> = loopback_programs(free_port(), free_port())
        .into_iter()
        .map(|p| {
            std::thread::spawn(move || {
                let run = run_native(&p.exe, &p.spec, &[], Duration::from_secs(60));
                (p.spec.name.clone(), run)
            })
        })
        .collect();
    for t in natives {
        let (name, run) = t.join().expect("a native run");
        let want = LOOPBACK_OUT
            .iter()
            .find(|(n, _)| *n == name)
            .expect("a known process")
            .1;
        assert_eq!(run.out(), want, "{name}: the native run");
        assert_eq!(run.end, Some(End::Exited(0)), "{name}: the native run");
    }
    if !qemu_present() {
        return;
    }
    // In the appliance: fixed ports, the appliance's own loopback.
    let programs = loopback_programs(7000, 7001);
    let run = run_appliance(&appliance(&programs), CMDLINE, TIMEOUT);
    let t = run.transcript();
    assert_eq!(
        run.boot.status,
        Some(STATUS_PASS),
        "QEMU did not end normally:\n{t}"
    );
    assert_eq!(run.console.run_end, Some(RunEnd::AllExited), "{t}");
    let unknown: Vec<String> = run
        .console
        .unknown
        .iter()
        .flatten()
        .filter(|u| SOCKET_CALLS.contains(&u.name.as_str()))
        .map(|u| format!("{} {} ({}) x{}", u.abi, u.nr, u.name, u.count))
        .collect();
    assert!(
        unknown.is_empty(),
        "the runtime does not know these calls: {unknown:?}\n{t}"
    );
    for (name, want) in LOOPBACK_OUT {
        let guest = run.console.process(name);
        assert_eq!(guest.out(), want, "{name}: under the runtime:\n{t}");
        assert_eq!(
            guest.end,
            Some(End::Exited(0)),
            "{name}: under the runtime:\n{t}"
        );
    }
}

/// `perch record --net -- netpeer ARGS` (no icount: the guest's clock must
/// keep pace with QEMU's network); perch's exit code, stdout (the
/// program's lines) and stderr (the runtime's log).
fn record_netpeer(args: &[&str]) -> (Option<i32>, String, String) {
    let exe = netpeer(CBuild::Glibc);
    let exe = exe.to_str().expect("a UTF-8 path");
    let mut all = vec!["--net", "--", exe];
    all.extend(args);
    let r = record_realtime(180, &all);
    (r.status, r.stdout, r.stderr)
}

/// The socket calls a `perch record` log names among the unknown ones
/// (the runtime's summary and perch's own line name them alike).
fn unknown_socket_calls(log: &str) -> Vec<String> {
    let mut calls: Vec<String> = log
        .lines()
        .filter_map(|l| l.split_once("unknown system calls").map(|(_, r)| r))
        .filter_map(|r| r.split_once(": ").map(|(_, list)| list))
        .flat_map(|list| list.split(", "))
        .filter(|item| {
            item.split_once(" (")
                .and_then(|(_, r)| r.split_once(')'))
                .is_some_and(|(name, _)| SOCKET_CALLS.contains(&name))
        })
        .map(str::to_string)
        .collect();
    calls.sort();
    calls.dedup();
    calls
}

/// A TCP line echo on the host's 127.0.0.1 (QEMU's 10.0.2.2 for the
/// guest), for one connection: each line answered with `echo: LINE`. Its
/// port, a flag that ends the wait for a connection, and the thread, which
/// gives back the lines it got.
fn host_tcp_echo() -> (u16, Arc<AtomicBool>, std::thread::JoinHandle<Vec<String>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a host TCP server");
    let port = listener.local_addr().expect("its address").port();
    listener
        .set_nonblocking(true)
        .expect("a non-blocking listener");
    let done = Arc::new(AtomicBool::new(false));
    let stop = Arc::clone(&done);
    let server = std::thread::spawn(move || {
        let t0 = Instant::now();
        let stream = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(_) if stop.load(Ordering::Relaxed) || t0.elapsed() > TIMEOUT => {
                    return Vec::new();
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        stream.set_nonblocking(false).expect("a blocking stream");
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .expect("a read timeout");
        let mut out = stream.try_clone().expect("a second handle");
        let mut got = Vec::new();
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if writeln!(out, "echo: {line}").is_err() {
                break;
            }
            got.push(line);
        }
        got
    });
    (port, done, server)
}

/// A UDP echo on the host's 127.0.0.1: every datagram sent back to its
/// sender, until the flag is set.
fn host_udp_echo() -> (u16, Arc<AtomicBool>, std::thread::JoinHandle<usize>) {
    let sock = UdpSocket::bind("127.0.0.1:0").expect("a host UDP server");
    let port = sock.local_addr().expect("its address").port();
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .expect("a read timeout");
    let done = Arc::new(AtomicBool::new(false));
    let stop = Arc::clone(&done);
    let server = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        let mut echoed = 0;
        let t0 = Instant::now();
        while !stop.load(Ordering::Relaxed) && t0.elapsed() < TIMEOUT {
            if let Ok((n, from)) = sock.recv_from(&mut buf)
                && sock.send_to(&buf[..n], from).is_ok()
            {
                echoed += 1;
            }
        }
        echoed
    });
    (port, done, server)
}

/// The native run of `netpeer ARGS` against a host server; its stdout.
fn native_netpeer(args: &[&str]) -> (String, Option<End>) {
    let p = Program::new(&netpeer(CBuild::Glibc), "netpeer", args, &[]);
    let run = run_native(&p.exe, &p.spec, &[], Duration::from_secs(60));
    (run.out(), run.end)
}

#[test]
fn a_client_in_the_appliance_reaches_a_tcp_server_on_the_host() {
    // Natively, against the same kind of server.
    let (port, done, server) = host_tcp_echo();
    let (out, end) = native_netpeer(&["client", "127.0.0.1", &port.to_string()]);
    done.store(true, Ordering::Relaxed);
    let got = server.join().expect("the host server");
    assert_eq!(out, CLIENT_OUT, "the native run");
    assert_eq!(end, Some(End::Exited(0)));
    assert_eq!(got, ["line 1", "line 2", "line 3"]);
    if !qemu_present() {
        return;
    }
    let (port, done, server) = host_tcp_echo();
    let (code, out, log) = record_netpeer(&["client", "10.0.2.2", &port.to_string()]);
    done.store(true, Ordering::Relaxed);
    let got = server.join().expect("the host server");
    let unknown = unknown_socket_calls(&log);
    assert!(
        unknown.is_empty(),
        "the runtime does not know these calls: {unknown:?}\n{log}"
    );
    assert_eq!(out, CLIENT_OUT, "under the runtime:\n{log}");
    assert_eq!(
        got,
        ["line 1", "line 2", "line 3"],
        "the host server:\n{log}"
    );
    assert!(log.contains("exited with status 0"), "{log}");
    assert_eq!(code, Some(0), "perch failed:\n{log}");
}

#[test]
fn a_udp_round_trip_from_the_appliance_to_an_echo_server_on_the_host() {
    let (port, done, server) = host_udp_echo();
    let (out, end) = native_netpeer(&["udp-echo", "127.0.0.1", &port.to_string()]);
    done.store(true, Ordering::Relaxed);
    let echoed = server.join().expect("the host server");
    assert_eq!(out, UDP_ECHO_OUT, "the native run");
    assert_eq!(end, Some(End::Exited(0)));
    assert!(echoed >= 3, "the host server echoed {echoed} datagrams");
    if !qemu_present() {
        return;
    }
    let (port, done, server) = host_udp_echo();
    let (code, out, log) = record_netpeer(&["udp-echo", "10.0.2.2", &port.to_string()]);
    done.store(true, Ordering::Relaxed);
    let echoed = server.join().expect("the host server");
    let unknown = unknown_socket_calls(&log);
    assert!(
        unknown.is_empty(),
        "the runtime does not know these calls: {unknown:?}\n{log}"
    );
    assert_eq!(out, UDP_ECHO_OUT, "under the runtime:\n{log}");
    assert!(
        echoed >= 3,
        "the host server echoed {echoed} datagrams:\n{log}"
    );
    assert!(log.contains("exited with status 0"), "{log}");
    assert_eq!(code, Some(0), "perch failed:\n{log}");
}
