//! `perch record --net`: the forwarded addresses once the appliance's
//! network is up (`perch: serving: ...`), and `--wait-for tcp:HOSTPORT`,
//! which probes a forward until the program in the appliance accepts on it
//! (`perch: ready: ...`, and `--ready-file`).
//!
//! QEMU's user networking accepts a connection to a forwarded host port at
//! once, whether or not anything in the appliance listens: it then connects
//! to the appliance, and closes the host side when the appliance answers
//! with a reset. So a probe connects, then reads for a while: an end of
//! file or a reset is "not yet", a connection that stays open (or data) is
//! a listener. Before the appliance has its address nobody answers QEMU at
//! all and the host side stays open too: probing starts only once the
//! runtime has said its address, and a listener counts once two probes in
//! a row find it (see [`confirmed`]).

use crate::error::HostError;
use crate::record_opts::{Forward, Network, Proto};
use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long a probe's connection must stay open to count as accepted.
pub const HOLD: Duration = Duration::from_millis(500);
/// The pause between probes.
const RETRY: Duration = Duration::from_millis(100);

/// Parses `--wait-for tcp:HOSTPORT`: the host port.
pub fn parse_wait_for(v: &str) -> Result<u16, HostError> {
    let usage = |why: &str| {
        HostError::Usage(format!(
            "--wait-for {v:?}: {why} (expected tcp:HOSTPORT, a host port of a --forward tcp:HOSTPORT:GUESTPORT)"
        ))
    };
    let Some(port) = v.strip_prefix("tcp:") else {
        return Err(usage("only tcp forwards can be waited for"));
    };
    match port.parse::<u16>() {
        Ok(n) if n > 0 && port.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
        _ => Err(usage(&format!("bad port {port:?}"))),
    }
}

/// The `--wait-for` forwards among `forwards`, checked: each must name a
/// TCP forward's host port.
pub fn waited_forwards(specs: &[String], forwards: &[Forward]) -> Result<Vec<Forward>, HostError> {
    let mut out: Vec<Forward> = Vec::new();
    for v in specs {
        let port = parse_wait_for(v)?;
        let Some(f) = forwards
            .iter()
            .find(|f| f.proto == Proto::Tcp && f.host == port)
        else {
            return Err(HostError::Usage(format!(
                "--wait-for {v:?}: no --forward tcp:{port}:GUESTPORT (perch waits on a forward's host port)"
            )));
        };
        if !out.contains(f) {
            out.push(*f);
        }
    }
    Ok(out)
}

/// The address in a runtime log line that says the network is up
/// (`perch: net: 10.0.2.15/24 via 10.0.2.2 (DHCP), DNS 10.0.2.3`, or
/// `... (static)`), as the runtime's `runtime/src/net/stack.rs` prints it.
pub fn net_up_address(line: &str) -> Option<[u8; 4]> {
    let rest = &line[line.find("perch: net: ")? + "perch: net: ".len()..];
    let (cidr, tail) = rest.split_once(' ')?;
    if !(tail.contains("(DHCP") || tail.contains("(static")) {
        return None;
    }
    let (addr, prefix) = cidr.split_once('/')?;
    prefix.parse::<u8>().ok().filter(|p| *p <= 32)?;
    let ip: std::net::Ipv4Addr = addr.parse().ok()?;
    Some(ip.octets())
}

/// Whether something accepts TCP connections at `addr` (through QEMU's
/// forward: a connection that stays open for `hold`, or that brings data).
pub fn probe(addr: SocketAddr, hold: Duration) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
        return false;
    };
    if s.set_read_timeout(Some(hold)).is_err() {
        return false;
    }
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => false,
        Ok(_) => true,
        Err(e) => matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
    }
}

/// Two [`probe`]s in a row that find a listener. The first connection
/// after the appliance has its address can stay open with nothing
/// listening: the appliance's network stack drops its reset while it asks
/// for the gateway's hardware address (ARP), and QEMU sends its SYN again
/// only seconds later. The second probe finds the address known.
fn confirmed(addr: SocketAddr) -> bool {
    probe(addr, HOLD) && probe(addr, HOLD)
}

/// What a run does with the appliance's network: the `perch: serving:`
/// lines when its address is known, and the `--wait-for` probes.
#[derive(Debug)]
pub struct NetWatch {
    net: Network,
    wait: Vec<Forward>,
    ready_file: Option<PathBuf>,
    quiet: bool,
    up: bool,
}

impl NetWatch {
    /// A watch over `net`'s forwards, probing `wait` once the network is
    /// up, and writing `ready_file` when all of them accept.
    pub fn new(net: Network, wait: Vec<Forward>, ready_file: Option<PathBuf>, quiet: bool) -> Self {
        NetWatch {
            net,
            wait,
            ready_file,
            quiet,
            up: false,
        }
    }

    /// Sees one runtime log line; returns the lines to print. The first
    /// line saying the network is up names each forward and starts the
    /// probes (on a thread of their own).
    pub fn log(&mut self, line: &str) -> Vec<String> {
        if self.up {
            return Vec::new();
        }
        let Some(found) = net_up_address(line) else {
            return Vec::new();
        };
        self.up = true;
        // QEMU forwards to the static address when there is one, else to
        // the first address its DHCP hands out (the one found).
        let [a, b, c, d] = self.net.guest.unwrap_or(found);
        let to = format!("{a}.{b}.{c}.{d}");
        let lines = if self.quiet {
            Vec::new()
        } else {
            self.net
                .forwards
                .iter()
                .map(|f| serving_line(f, &to))
                .collect()
        };
        if !self.wait.is_empty() {
            let wait = self.wait.clone();
            let file = self.ready_file.clone();
            let quiet = self.quiet;
            std::thread::spawn(move || {
                let mut ready = Vec::new();
                for f in &wait {
                    let addr = SocketAddr::from(([127, 0, 0, 1], f.host));
                    while !confirmed(addr) {
                        std::thread::sleep(RETRY);
                    }
                    ready.push(format!(
                        "perch: ready: tcp 127.0.0.1:{} ({to} port {} accepts connections)",
                        f.host, f.guest
                    ));
                }
                if !quiet {
                    for l in &ready {
                        eprintln!("{l}");
                    }
                }
                if let Some(p) = file
                    && let Err(e) = write_ready_file(&p, &ready)
                {
                    eprintln!("perch: warning: --ready-file {}: {e}", p.display());
                }
            });
        }
        lines
    }
}

/// `perch: serving: tcp 127.0.0.1:8080 -> 10.0.2.15:80`.
pub fn serving_line(f: &Forward, to: &str) -> String {
    format!(
        "perch: serving: {} 127.0.0.1:{} -> {to}:{}",
        f.proto.name(),
        f.host,
        f.guest
    )
}

/// Writes the ready lines to `path` whole: to a file beside it first,
/// then renamed, so a script that sees the file sees all of it.
fn write_ready_file(path: &Path, lines: &[String]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut text = lines.join("\n");
    text.push('\n');
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    fn fwd(proto: Proto, host: u16, guest: u16) -> Forward {
        Forward { proto, host, guest }
    }

    #[test]
    fn wait_for_names_a_tcp_forward() {
        assert_eq!(parse_wait_for("tcp:8080").unwrap(), 8080);
        for bad in [
            "8080",
            "udp:53",
            "tcp:",
            "tcp:0",
            "tcp:+80",
            "tcp:70000",
            "tcp:1:2",
        ] {
            assert!(
                matches!(parse_wait_for(bad), Err(HostError::Usage(_))),
                "{bad}"
            );
        }
        let fw = [fwd(Proto::Udp, 8080, 80), fwd(Proto::Tcp, 8081, 80)];
        assert_eq!(
            waited_forwards(&["tcp:8081".into(), "tcp:8081".into()], &fw).unwrap(),
            [fwd(Proto::Tcp, 8081, 80)]
        );
        let Err(HostError::Usage(m)) = waited_forwards(&["tcp:8080".into()], &fw) else {
            panic!("a UDP forward was waited for");
        };
        assert!(m.contains("no --forward tcp:8080"), "{m}");
    }

    #[test]
    fn the_runtime_says_its_address() {
        assert_eq!(
            net_up_address("perch: net: 10.0.2.15/24 via 10.0.2.2 (DHCP), DNS 10.0.2.3"),
            Some([10, 0, 2, 15])
        );
        assert_eq!(
            net_up_address("[ 0.5] perch: net: 10.0.2.20/24 via 10.0.2.2 (static)"),
            Some([10, 0, 2, 20])
        );
        assert_eq!(
            net_up_address("perch: net: 192.168.1.9/16 (DHCP, no gateway)"),
            Some([192, 168, 1, 9])
        );
        for no in [
            "perch: net: virtio-net at PCI 00:03.0, MAC 52:54:00:12:34:56",
            "perch: net: UDP echo on port 7",
            "perch: net: DHCP lease lost",
            "perch: net: 10.0.2/24 via 10.0.2.2 (DHCP)",
            "hello",
        ] {
            assert_eq!(net_up_address(no), None, "{no}");
        }
    }

    #[test]
    fn serving_lines_name_the_forwards_once_the_network_is_up() {
        let net = Network {
            forwards: vec![fwd(Proto::Tcp, 8080, 80), fwd(Proto::Udp, 5353, 53)],
            guest: None,
        };
        let mut w = NetWatch::new(net.clone(), Vec::new(), None, false);
        assert!(w.log("perch: net: virtio-net at PCI 00:03.0").is_empty());
        assert_eq!(
            w.log("perch: net: 10.0.2.15/24 via 10.0.2.2 (DHCP), DNS 10.0.2.3"),
            [
                "perch: serving: tcp 127.0.0.1:8080 -> 10.0.2.15:80",
                "perch: serving: udp 127.0.0.1:5353 -> 10.0.2.15:53"
            ]
        );
        // Once: a renewed lease says nothing more.
        assert!(
            w.log("perch: net: 10.0.2.15/24 via 10.0.2.2 (DHCP), DNS 10.0.2.3")
                .is_empty()
        );
        let mut q = NetWatch::new(net, Vec::new(), None, true);
        assert!(
            q.log("perch: net: 10.0.2.15/24 via 10.0.2.2 (DHCP)")
                .is_empty()
        );
    }

    #[test]
    fn a_probe_needs_the_connection_to_stay_open() {
        let hold = Duration::from_millis(200);
        // Nothing listens.
        let free = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = free.local_addr().unwrap();
        drop(free);
        assert!(!probe(addr, hold));
        // Accepted and closed at once: what QEMU's forward does when the
        // appliance answers with a reset.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || drop(l.accept()));
        assert!(!probe(addr, hold));
        t.join().unwrap();
        // Accepted and held: a listener.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            std::thread::sleep(Duration::from_millis(600));
            drop(s);
        });
        assert!(probe(addr, hold));
        t.join().unwrap();
        // Accepted with a greeting.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.write_all(b"220 hi\r\n").unwrap();
            std::thread::sleep(Duration::from_millis(100));
        });
        assert!(probe(addr, Duration::from_secs(5)));
        t.join().unwrap();
    }

    #[test]
    fn the_ready_file_appears_whole() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ready");
        write_ready_file(&p, &["a".into(), "b".into()]).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "a\nb\n");
        assert!(!dir.path().join("ready.tmp").exists());
    }
}
