//! `perch record --net`: the runtime drives the virtio-net card QEMU's user
//! network sits on, takes its address from QEMU's DHCP server (10.0.2.15/24,
//! gateway 10.0.2.2, DNS 10.0.2.3) or from `net=ADDR/PREFIX,gw=GW`, and
//! with `net=...,echo` answers UDP datagrams on port 7, reached from the
//! host through `--forward udp:HOSTPORT:7`. A small static program sleeps
//! while the network comes up.
//!
//! The runs are not under icount: with `-icount sleep=off` the guest's
//! clock leaps over its sleeps, faster than QEMU's network answers.
#![forbid(unsafe_code)]

use e2e_tests::programs::{CBuild, c_program};
use e2e_tests::{qemu_present, record_realtime};
use std::net::UdpSocket;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// `perch record` of `netwait MS` with `args` added (no icount); perch's
/// exit code, stdout and stderr (the runtime's log).
fn record_netwait(args: &[&str], ms: u32) -> (Option<i32>, String, String) {
    let exe = c_program("netwait", CBuild::Glibc);
    let exe = exe.to_str().expect("a UTF-8 path");
    let ms = ms.to_string();
    let mut all = args.to_vec();
    all.extend(["--", exe, &ms]);
    let r = record_realtime(120, &all);
    (r.status, r.stdout, r.stderr)
}

/// The runtime's `perch: net:` lines.
fn net_lines(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains("perch: net:")).collect()
}

fn assert_ran(code: Option<i32>, out: &str, log: &str) {
    assert_eq!(code, Some(0), "perch failed:\n{log}");
    assert!(
        out.contains("netwait: slept"),
        "stdout:\n{out}\nlog:\n{log}"
    );
}

#[test]
fn net_takes_the_address_from_qemu_dhcp() {
    if !qemu_present() {
        return;
    }
    let (code, out, log) = record_netwait(&["--net"], 2000);
    assert_ran(code, &out, &log);
    let lines = net_lines(&log);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("virtio-net at PCI 00:") && l.contains("MAC 52:54:00:")),
        "no card in the log:\n{log}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("perch: net: 10.0.2.15/24 via 10.0.2.2 (DHCP), DNS 10.0.2.3")),
        "no DHCP lease in the log:\n{log}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("QEMU user networking on a virtio-net card")),
        "perch did not say the network is attached:\n{log}"
    );
}

#[test]
fn net_takes_a_static_address_from_the_command_line() {
    if !qemu_present() {
        return;
    }
    let (code, out, log) = record_netwait(
        &["--net", "--boot-arg", "net=10.0.2.20/24,gw=10.0.2.2"],
        500,
    );
    assert_ran(code, &out, &log);
    let lines = net_lines(&log);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("perch: net: 10.0.2.20/24 via 10.0.2.2 (static)")),
        "no static address in the log:\n{log}"
    );
    assert!(
        !lines.iter().any(|l| l.contains("(DHCP)")),
        "DHCP ran beside a static address:\n{log}"
    );
}

#[test]
fn without_net_there_is_no_card_and_net_is_ignored_with_a_word() {
    if !qemu_present() {
        return;
    }
    let (code, out, log) = record_netwait(&[], 10);
    assert_ran(code, &out, &log);
    assert_eq!(net_lines(&log), Vec::<&str>::new(), "{log}");
    let (code, out, log) = record_netwait(&["--boot-arg", "net=10.0.2.20/24"], 10);
    assert_ran(code, &out, &log);
    assert!(
        log.contains("perch: net: no virtio-net device; net= ignored"),
        "{log}"
    );
}

/// Records `netwait` with `--net`, `--boot-arg NET` (an `echo` one) and
/// a forward of a free host UDP port to port 7, while a client sends
/// datagrams there; the runtime's log, the forward's host port and the
/// first datagram that came back.
fn echo_through_forward(net: &str) -> (String, u16, Option<Vec<u8>>) {
    // A free UDP port on the host for QEMU's forward (given back at once).
    let port = UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("a free UDP port")
        .port();
    let forward = format!("udp:{port}:7");
    let done = Arc::new(AtomicBool::new(false));
    let run_done = Arc::clone(&done);
    let client = std::thread::spawn(move || {
        let s = UdpSocket::bind("127.0.0.1:0").expect("a client socket");
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("a read timeout");
        let t0 = Instant::now();
        let mut buf = [0u8; 64];
        // Until the appliance answers, its run ends, or 60 s.
        while t0.elapsed() < Duration::from_secs(60) && !run_done.load(Ordering::Relaxed) {
            let _ = s.send_to(ECHO_MSG, ("127.0.0.1", port));
            if let Ok((n, _)) = s.recv_from(&mut buf) {
                return Some(buf[..n].to_vec());
            }
        }
        None
    });
    let (code, out, log) =
        record_netwait(&["--net", "--forward", &forward, "--boot-arg", net], 6000);
    done.store(true, Ordering::Relaxed);
    let echoed = client.join().expect("the client thread");
    assert_ran(code, &out, &log);
    assert!(
        log.contains("perch: net: UDP echo on port 7"),
        "no echo service:\n{log}"
    );
    (log, port, echoed)
}

const ECHO_MSG: &[u8] = b"perch echo test";

#[test]
fn udp_echo_answers_through_a_host_forward() {
    if !qemu_present() {
        return;
    }
    let (log, port, echoed) = echo_through_forward("net=dhcp,echo");
    assert!(
        log.contains(&format!(
            "perch: serving: udp 127.0.0.1:{port} -> 10.0.2.15:7"
        )),
        "perch did not name the forward:\n{log}"
    );
    assert_eq!(
        echoed.as_deref(),
        Some(ECHO_MSG),
        "no echo came back:\n{log}"
    );
}

#[test]
fn a_static_address_is_in_force() {
    if !qemu_present() {
        return;
    }
    // The forward goes to 10.0.2.20: only an interface holding that
    // address answers.
    let (log, port, echoed) = echo_through_forward("net=10.0.2.20/24,gw=10.0.2.2,echo");
    assert!(
        log.contains(&format!(
            "perch: serving: udp 127.0.0.1:{port} -> 10.0.2.20:7"
        )),
        "perch did not name the forward:\n{log}"
    );
    assert_eq!(
        echoed.as_deref(),
        Some(ECHO_MSG),
        "no echo came back:\n{log}"
    );
}

#[test]
fn net_on_microvm_finds_the_virtio_mmio_card() {
    if !qemu_present() {
        return;
    }
    // microvm has no PCI: the stream goes to COM1, the card sits in the
    // virtio-mmio window.
    let (code, out, log) = record_netwait(
        &[
            "--net",
            "--transport",
            "uart",
            "--qemu-arg",
            "-machine",
            "--qemu-arg",
            "microvm,pit=on,pic=on,rtc=on",
        ],
        2000,
    );
    assert_ran(code, &out, &log);
    let lines = net_lines(&log);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("virtio-net at 0xfeb0") && l.contains("MAC 52:54:00:")),
        "no virtio-mmio card in the log:\n{log}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("perch: net: 10.0.2.15/24 via 10.0.2.2 (DHCP)")),
        "no DHCP lease in the log:\n{log}"
    );
}

#[test]
fn forwards_are_named_and_a_refused_port_is_not_ready() {
    if !qemu_present() {
        return;
    }
    // Nothing listens on port 80: QEMU accepts each probe's connection on
    // the host and closes it when the appliance refuses it, which
    // `--wait-for` must not take for a listener.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free TCP port")
        .port();
    let dir = tempfile::tempdir().expect("temporary directory");
    let ready = dir.path().join("ready");
    let ready_arg = ready.to_str().expect("a UTF-8 path").to_owned();
    let (code, out, log) = record_netwait(
        &[
            "--net",
            "--forward",
            &format!("tcp:{port}:80"),
            "--wait-for",
            &format!("tcp:{port}"),
            "--ready-file",
            &ready_arg,
        ],
        6000,
    );
    assert_ran(code, &out, &log);
    assert!(
        log.contains(&format!(
            "perch: serving: tcp 127.0.0.1:{port} -> 10.0.2.15:80"
        )),
        "perch did not name the forward:\n{log}"
    );
    assert!(!log.contains("perch: ready:"), "{log}");
    assert!(!ready.exists(), "a ready file without a listener:\n{log}");
}
