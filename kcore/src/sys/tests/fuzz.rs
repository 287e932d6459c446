//! Random system calls with random numbers, pointers and lengths in both
//! ABIs: nothing panics, every error is a Linux errno, the memory areas
//! stay a valid set, and the descriptor table stays within its limit.

use proptest::prelude::*;

use super::*;

/// Interesting argument values: small numbers, flags, fds, good, read-only,
/// unmapped and kernel pointers, huge lengths.
fn arg() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..8,
        0u64..4096,
        Just(u64::MAX),
        Just(-100i64 as u64),
        Just(1 << 40),
        Just(0x7fff_f000),
        (0u64..SCRATCH_LEN).prop_map(|o| SCRATCH + o),
        Just(SCRATCH),
        Just(RO),
        Just(TEXT),
        Just(BAD),
        Just(0xffff_8000_0000_0000),
        Just(0xffff_f000),
        any::<u64>(),
    ]
}

fn number() -> impl Strategy<Value = u64> {
    prop_oneof![8 => 0u64..470, 1 => any::<u64>(), 1 => 0u64..0x1_0000_0000]
}

/// Checks the result of call `nr` and the process's invariants. `alarm`
/// answers a count of seconds, which an i386 process may see in the
/// errno range (Linux returns the same): not an error.
fn check(e: &Env, nr: u64, a: &Action) {
    if let Action::Return(v) = a
        && table::lookup(e.abi, nr) != Some(table::Sys::Alarm)
    {
        let v = match e.abi {
            Abi::X86_64 => *v as i64,
            Abi::I386 => *v as u32 as i32 as i64,
        };
        if (-4095..0).contains(&v) {
            errno_of(-v);
        }
    }
    let areas: Vec<_> = e.p.areas.iter().collect();
    for w in areas.windows(2) {
        assert!(
            w[0].end <= w[1].start,
            "areas overlap: {:x?} {:x?}",
            w[0],
            w[1]
        );
    }
    for a in &areas {
        assert!(a.start < a.end && a.start % 4096 == 0 && a.end % 4096 == 0);
        assert!(a.end <= e.p.layout.user_top);
    }
    assert!(e.p.fds.open_fds().count() <= 1024);
}

/// Makes a file and a directory to aim at, and writes a few paths into the
/// scratch memory so that random pointers sometimes hit a real path.
fn prepare(abi: Abi) -> Env {
    let mut e = Env::new(abi);
    e.cstr(SCRATCH, "/tmp/f");
    e.cstr(SCRATCH + 0x10, "/data/input.txt");
    e.cstr(SCRATCH + 0x30, "/tmp");
    e.cstr(SCRATCH + 0x40, "/proc/self/exe");
    e.ret("open", &[SCRATCH, 0o102, 0o644]);
    e.ret("open", &[SCRATCH + 0x10, 0, 0]);
    e.m.page_budget = 512;
    e.sys.fs.max_file_size = 4 << 20;
    e
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_calls_never_panic(
        wide in any::<bool>(),
        calls in proptest::collection::vec((number(), proptest::array::uniform6(arg())), 1..40),
    ) {
        let abi = if wide { Abi::X86_64 } else { Abi::I386 };
        let mut e = prepare(abi);
        for (nr, args) in calls {
            let a = e.call_nr(nr, &args);
            check(&e, nr, &a);
        }
        e.p.flush_output(&mut e.m);
    }
}

/// A long deterministic run per ABI over the implemented numbers.
#[test]
fn a_hundred_thousand_random_calls_per_abi() {
    for abi in [Abi::X86_64, Abi::I386] {
        let mut e = prepare(abi);
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let implemented: Vec<u64> = (0..470)
            .filter(|&n| table::lookup(abi, n).is_some())
            .collect();
        let picks = [
            0,
            1,
            2,
            3,
            4,
            5,
            8,
            16,
            100,
            4096,
            u64::MAX,
            1 << 40,
            SCRATCH,
            RO,
            TEXT,
            BAD,
        ];
        for i in 0..100_000u32 {
            let nr = implemented[(next() % implemented.len() as u64) as usize];
            let mut args = [0u64; 6];
            for a in &mut args {
                let r = next();
                *a = match r % 4 {
                    0 => picks[(r >> 8) as usize % picks.len()],
                    1 => SCRATCH + (r >> 8) % SCRATCH_LEN,
                    2 => (r >> 8) % 64,
                    _ => r,
                };
            }
            let a = e.call_nr(nr, &args);
            check(&e, nr, &a);
            if i % 10_000 == 0 {
                // Start again now and then, so state does not only pile up.
                e = prepare(abi);
            }
        }
    }
}

/// `alarm(0xffffff9c)` then `alarm(0)` on i386 answers 0xffffff9c seconds,
/// which reads as -100 (a random seed of the property above found it):
/// the check takes it as seconds, as Linux returns them.
#[test]
fn an_i386_alarm_count_in_the_errno_range_is_not_an_error() {
    let mut e = prepare(Abi::I386);
    let alarm = (0..470)
        .find(|&n| table::lookup(Abi::I386, n) == Some(table::Sys::Alarm))
        .expect("i386 has alarm");
    let a = e.call_nr(alarm, &[0xffff_ff9c]);
    check(&e, alarm, &a);
    let a = e.call_nr(alarm, &[0]);
    assert!(
        matches!(a, Action::Return(v) if v as u32 >= 0xffff_ff9b),
        "{a:?}"
    );
    check(&e, alarm, &a);
}

/// Random socket calls on real sockets (a listener, a connected pair, UDP
/// sockets, sockaddrs of the loopback in scratch memory) with bad
/// descriptors, pointers and huge lengths, packets moved between calls:
/// nothing panics, every error is a Linux errno, and what a run keeps
/// stays bounded.
#[test]
fn random_socket_calls_on_live_sockets() {
    use crate::sys::table::Sys;
    for abi in [Abi::X86_64, Abi::I386] {
        let mut e = prepare(abi);
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let socket_calls: Vec<u64> = (0..470)
            .filter(|&n| {
                matches!(
                    table::lookup(abi, n),
                    Some(
                        Sys::Socket
                            | Sys::Bind
                            | Sys::Connect
                            | Sys::Listen
                            | Sys::Accept
                            | Sys::Accept4
                            | Sys::Getsockname
                            | Sys::Getpeername
                            | Sys::Sendto
                            | Sys::Recvfrom
                            | Sys::Sendmsg
                            | Sys::Recvmsg
                            | Sys::Sendmmsg
                            | Sys::Recvmmsg
                            | Sys::Shutdown
                            | Sys::Setsockopt
                            | Sys::Getsockopt
                            | Sys::Socketcall
                            | Sys::Read
                            | Sys::Write
                            | Sys::Readv
                            | Sys::Writev
                            | Sys::Close
                            | Sys::Poll
                            | Sys::EpollCtl
                            | Sys::EpollCreate1
                            | Sys::Fcntl
                            | Sys::Ioctl
                            | Sys::Dup
                    )
                )
            })
            .collect();
        // sockaddr_in 127.0.0.1:7000 and 127.0.0.1:7001 in scratch.
        let sa = |port: u16| {
            let mut b = [0u8; 16];
            b[..2].copy_from_slice(&2u16.to_le_bytes());
            b[2..4].copy_from_slice(&port.to_be_bytes());
            b[4..8].copy_from_slice(&[127, 0, 0, 1]);
            b
        };
        for round in 0..200u32 {
            if round % 20 == 0 {
                e = prepare(abi);
                e.poke(SCRATCH + 0x100, &sa(7000));
                e.poke(SCRATCH + 0x110, &sa(7001));
                e.poke(SCRATCH + 0x120, &16u32.to_le_bytes());
                // fd 5: a listener, 6 and 7 a pair, 8 UDP bound to 7001.
                let l = e.ret("socket", &[2, 1 | 0o4000, 0]) as u64;
                e.ret("bind", &[l, SCRATCH + 0x100, 16]);
                e.ret("listen", &[l, 4]);
                let c = e.ret("socket", &[2, 1 | 0o4000, 0]) as u64;
                e.ret("connect", &[c, SCRATCH + 0x100, 16]);
                e.pump_net();
                e.ret("accept4", &[l, 0, 0, 0o4000]);
                let u = e.ret("socket", &[2, 2 | 0o4000, 0]) as u64;
                e.ret("bind", &[u, SCRATCH + 0x110, 16]);
            }
            for _ in 0..50 {
                let nr = socket_calls[(next() % socket_calls.len() as u64) as usize];
                let mut args = [0u64; 6];
                for a in &mut args {
                    let r = next();
                    *a = match r % 8 {
                        0 => 3 + (r >> 8) % 8,
                        1 => SCRATCH + 0x100 + ((r >> 8) % 2) * 0x10,
                        2 => SCRATCH + (r >> 8) % SCRATCH_LEN,
                        3 => [16, 0, 1, 4, 8, 0x7fff_ffff, u64::MAX][(r >> 8) as usize % 7],
                        4 => [BAD, RO, TEXT, 0xffff_8000_0000_0000][(r >> 8) as usize % 4],
                        5 => (r >> 8) % 64,
                        6 => 0o4000 | 0x40,
                        _ => r,
                    };
                }
                let a = e.call_nr(nr, &args);
                check(&e, nr, &a);
                // A call that would wait is let go, as a signal would.
                if e.t.wait.is_some() {
                    crate::sys::cancel_wait(&mut e.sys, &mut e.t);
                }
                if next() % 4 == 0 {
                    e.pump_net();
                }
            }
            assert!(e.sys.net.open_count() <= crate::sys::net::MAX_SOCKETS);
        }
        crate::sys::process_ended(
            &mut e.sys,
            &mut e.p,
            crate::sys::procs::Status::Exited(0),
            |_| {},
        );
        e.pump_net();
        assert_eq!(e.sys.net.open_count(), 0);
    }
}
