//! eventfd, epoll, and waits on files that other threads end: through
//! the real handler paths, both ABIs (a test switches threads by
//! swapping `Env::t`, as the runtime's scheduler does, and makes a woken
//! thread's call again with `Env::resume`, as the runtime does before it
//! runs).

use super::*;
use crate::sys::event::bits::*;

fn both() -> [Env; 2] {
    [Env::new(Abi::X86_64), Env::new(Abi::I386)]
}

const EFD_SEMAPHORE: u64 = 1;
const ADD: u64 = 1;
const DEL: u64 = 2;
const MOD: u64 = 3;
/// Where test events are built and returned.
const EV: u64 = SCRATCH + 0x1000;
const OUT: u64 = SCRATCH + 0x2000;

fn write_u64(e: &mut Env, fd: u64, v: u64) -> i64 {
    e.poke(SCRATCH + 0x800, &v.to_le_bytes());
    e.ret("write", &[fd, SCRATCH + 0x800, 8])
}

fn read_u64(e: &mut Env, fd: u64) -> Result<u64, Errno> {
    match e.ret("read", &[fd, SCRATCH + 0x900, 8]) {
        8 => Ok(e.u64_at(SCRATCH + 0x900)),
        v if v < 0 => Err(errno_of(-v)),
        v => panic!("read gave {v}"),
    }
}

fn ctl(e: &mut Env, ep: u64, op: u64, fd: u64, events: u32, data: u64) -> i64 {
    let mut b = events.to_le_bytes().to_vec();
    b.extend_from_slice(&data.to_le_bytes());
    e.poke(EV, &b);
    e.ret("epoll_ctl", &[ep, op, fd, EV])
}

/// `epoll_wait` with a zero timeout: the (events, data) pairs, from the
/// 12-byte packed layout.
fn ready(e: &mut Env, ep: u64, max: u64) -> Vec<(u32, u64)> {
    let n = e.ret("epoll_wait", &[ep, OUT, max, 0]);
    assert!(n >= 0, "epoll_wait: {n}");
    (0..n as u64)
        .map(|i| {
            let b = e.peek(OUT + 12 * i, 12);
            (
                u32::from_le_bytes(b[..4].try_into().unwrap()),
                u64::from_le_bytes(b[4..].try_into().unwrap()),
            )
        })
        .collect()
}

fn pipe(e: &mut Env, flags: u64) -> (u64, u64) {
    assert_eq!(e.ret("pipe2", &[SCRATCH + 0xf00, flags]), 0);
    (
        e.u32_at(SCRATCH + 0xf00) as u64,
        e.u32_at(SCRATCH + 0xf04) as u64,
    )
}

#[test]
fn eventfd_counts_and_checks_its_arguments() {
    for mut e in both() {
        let fd = e.ret("eventfd2", &[5, O_NONBLOCK | O_CLOEXEC]) as u64;
        assert_eq!(fd, 3);
        assert_eq!(e.ret("fcntl", &[fd, 1, 0]), 1, "EFD_CLOEXEC");
        assert_eq!(
            e.ret("fcntl", &[fd, 3, 0]) & 0o4003,
            0o4002,
            "O_RDWR|O_NONBLOCK"
        );
        assert_eq!(read_u64(&mut e, fd), Ok(5));
        assert_eq!(read_u64(&mut e, fd), Err(Errno::EAGAIN));
        assert_eq!(write_u64(&mut e, fd, 3), 8);
        assert_eq!(write_u64(&mut e, fd, 4), 8);
        assert_eq!(read_u64(&mut e, fd), Ok(7), "the sum, and back to 0");
        // Short buffers, the forbidden value, and the overflow.
        assert_eq!(e.err("read", &[fd, SCRATCH, 7]), Errno::EINVAL);
        assert_eq!(e.err("write", &[fd, SCRATCH, 4]), Errno::EINVAL);
        e.poke(SCRATCH, &u64::MAX.to_le_bytes());
        assert_eq!(e.err("write", &[fd, SCRATCH, 8]), Errno::EINVAL);
        assert_eq!(write_u64(&mut e, fd, u64::MAX - 1), 8);
        e.poke(SCRATCH, &1u64.to_le_bytes());
        assert_eq!(e.err("write", &[fd, SCRATCH, 8]), Errno::EAGAIN);
        assert_eq!(e.err("write", &[fd, BAD, 8]), Errno::EFAULT);
        assert_eq!(e.err("read", &[fd, BAD, 8]), Errno::EFAULT);
        assert_eq!(
            read_u64(&mut e, fd),
            Ok(u64::MAX - 1),
            "a fault took nothing"
        );
        assert_eq!(e.err("lseek", &[fd, 0, 0]), Errno::ESPIPE);
        // EFD_SEMAPHORE: one at a time.
        let s = e.ret("eventfd2", &[2, EFD_SEMAPHORE | O_NONBLOCK]) as u64;
        assert_eq!(read_u64(&mut e, s), Ok(1));
        assert_eq!(read_u64(&mut e, s), Ok(1));
        assert_eq!(read_u64(&mut e, s), Err(Errno::EAGAIN));
        assert_eq!(e.err("eventfd2", &[0, 8]), Errno::EINVAL);
        // eventfd(initval): no flags, so a read at 0 waits.
        let b = e.ret("eventfd", &[0]) as u64;
        assert_eq!(e.ret("fcntl", &[b, 1, 0]), 0);
        assert_eq!(
            e.call("read", &[b, SCRATCH, 8]),
            Action::Wait { until_ns: None }
        );
        // An anonymous inode: no file type, 0600.
        assert_eq!(e.ret("fstat", &[b, SCRATCH + 0x400]), 0);
        let mode_at = if e.abi == Abi::X86_64 { 24 } else { 8 };
        assert_eq!(e.u32_at(SCRATCH + 0x400 + mode_at) & 0xffff, 0o600);
        assert_eq!(e.ret("close", &[b]), 0);
        assert_eq!(e.err("read", &[b, SCRATCH, 8]), Errno::EBADF);
    }
}

#[test]
fn epoll_ctl_errnos_follow_linux() {
    for mut e in both() {
        assert_eq!(e.err("epoll_create", &[0]), Errno::EINVAL);
        assert_eq!(e.err("epoll_create1", &[1]), Errno::EINVAL);
        let ep = e.ret("epoll_create1", &[O_CLOEXEC]) as u64;
        assert_eq!(e.ret("fcntl", &[ep, 1, 0]), 1);
        let ep2 = e.ret("epoll_create", &[1]) as u64;
        let (r, w) = pipe(&mut e, 0);
        let file = e.cstr(SCRATCH + 0x700, "/data/input.txt");
        let file = e.ret("open", &[file, 0, 0]) as u64;
        assert_eq!(ctl(&mut e, ep, ADD, r, EPOLLIN, 1), 0);
        assert_eq!(e.err("epoll_ctl", &[ep, ADD, r, EV]), Errno::EEXIST);
        assert_eq!(e.err("epoll_ctl", &[ep, MOD, w, EV]), Errno::ENOENT);
        assert_eq!(e.err("epoll_ctl", &[ep, DEL, w, 0]), Errno::ENOENT);
        assert_eq!(e.err("epoll_ctl", &[ep, ADD, 99, EV]), Errno::EBADF);
        assert_eq!(e.err("epoll_ctl", &[99, ADD, r, EV]), Errno::EBADF);
        assert_eq!(
            e.err("epoll_ctl", &[r, ADD, w, EV]),
            Errno::EINVAL,
            "not an epoll"
        );
        assert_eq!(
            e.err("epoll_ctl", &[ep, ADD, file, EV]),
            Errno::EPERM,
            "a regular file"
        );
        assert_eq!(
            e.err("epoll_ctl", &[ep, ADD, ep, EV]),
            Errno::EINVAL,
            "itself"
        );
        assert_eq!(
            e.err("epoll_ctl", &[ep, 9, r, EV]),
            Errno::EINVAL,
            "no such op"
        );
        assert_eq!(e.err("epoll_ctl", &[ep, ADD, w, BAD]), Errno::EFAULT);
        // EPOLLEXCLUSIVE: only with ADD, only in/out/err/hup/et, never on
        // an epoll.
        assert_eq!(ctl(&mut e, ep, ADD, w, EPOLLOUT | EPOLLEXCLUSIVE, 2), 0);
        assert_eq!(e.err("epoll_ctl", &[ep, MOD, w, EV]), Errno::EINVAL);
        e.poke(EV, &(EPOLLPRI | EPOLLEXCLUSIVE).to_le_bytes());
        assert_eq!(e.err("epoll_ctl", &[ep2, ADD, r, EV]), Errno::EINVAL);
        e.poke(EV, &(EPOLLIN | EPOLLEXCLUSIVE).to_le_bytes());
        assert_eq!(e.err("epoll_ctl", &[ep2, ADD, ep, EV]), Errno::EINVAL);
        // Nesting: ep2 in ep is fine, ep in ep2 then loops.
        assert_eq!(ctl(&mut e, ep, ADD, ep2, EPOLLIN, 3), 0);
        assert_eq!(e.err("epoll_ctl", &[ep2, ADD, ep, EV]), Errno::ELOOP);
        assert_eq!(ctl(&mut e, ep, DEL, r, 0, 0), 0);
        assert_eq!(e.err("epoll_ctl", &[ep, DEL, r, 0]), Errno::ENOENT);
        // epoll_wait's arguments.
        assert_eq!(e.err("epoll_wait", &[ep, OUT, 0, 0]), Errno::EINVAL);
        assert_eq!(e.err("epoll_wait", &[r, OUT, 1, 0]), Errno::EINVAL);
        assert_eq!(e.err("epoll_wait", &[99, OUT, 1, 0]), Errno::EBADF);
        let top = e.p.layout.user_top;
        assert_eq!(e.err("epoll_wait", &[ep, top - 12, 2, 0]), Errno::EFAULT);
        assert_eq!(
            e.err("epoll_pwait", &[ep, OUT, 1, 0, SCRATCH, 4]),
            Errno::EINVAL
        );
        assert_eq!(
            e.err("epoll_pwait2", &[ep, OUT, 1, BAD, 0, 0]),
            Errno::EFAULT
        );
        // read and write of an epoll are EINVAL.
        assert_eq!(e.err("read", &[ep, SCRATCH, 8]), Errno::EINVAL);
    }
}

#[test]
fn level_edge_and_oneshot_reports() {
    for mut e in both() {
        let ep = e.ret("epoll_create1", &[0]) as u64;
        let (r, w) = pipe(&mut e, O_NONBLOCK);
        let efd = e.ret("eventfd2", &[0, O_NONBLOCK]) as u64;
        let data = 0x1122_3344_5566_7788;
        assert_eq!(ctl(&mut e, ep, ADD, r, EPOLLIN, data), 0);
        assert_eq!(ctl(&mut e, ep, ADD, efd, EPOLLIN | EPOLLET, 42), 0);
        assert_eq!(ready(&mut e, ep, 8), []);
        // Level-triggered: reported while readable, every time.
        e.poke(SCRATCH, b"abc");
        assert_eq!(e.ret("write", &[w, SCRATCH, 3]), 3);
        assert_eq!(ready(&mut e, ep, 8), [(EPOLLIN, data)]);
        assert_eq!(ready(&mut e, ep, 8), [(EPOLLIN, data)]);
        assert_eq!(e.ret("read", &[r, SCRATCH, 3]), 3);
        assert_eq!(ready(&mut e, ep, 8), []);
        // Edge-triggered: once per write, however much is left.
        assert_eq!(write_u64(&mut e, efd, 1), 8);
        assert_eq!(ready(&mut e, ep, 8), [(EPOLLIN, 42)]);
        assert_eq!(ready(&mut e, ep, 8), [], "no new edge");
        assert_eq!(write_u64(&mut e, efd, 1), 8);
        assert_eq!(ready(&mut e, ep, 8), [(EPOLLIN, 42)]);
        // Both ready: in the order they became so, one per call with
        // maxevents 1, the level-triggered one going round again.
        assert_eq!(e.ret("write", &[w, SCRATCH, 1]), 1);
        assert_eq!(write_u64(&mut e, efd, 1), 8);
        assert_eq!(ready(&mut e, ep, 1), [(EPOLLIN, data)]);
        assert_eq!(ready(&mut e, ep, 1), [(EPOLLIN, 42)]);
        assert_eq!(ready(&mut e, ep, 1), [(EPOLLIN, data)]);
        assert_eq!(e.ret("read", &[r, SCRATCH, 8]), 1);
        // One-shot: reported once, then silent until EPOLL_CTL_MOD.
        assert_eq!(ctl(&mut e, ep, MOD, r, EPOLLIN | EPOLLONESHOT, 7), 0);
        assert_eq!(e.ret("write", &[w, SCRATCH, 1]), 1);
        assert_eq!(ready(&mut e, ep, 8), [(EPOLLIN, 7)]);
        assert_eq!(e.ret("write", &[w, SCRATCH, 1]), 1);
        assert_eq!(ready(&mut e, ep, 8), []);
        assert_eq!(ctl(&mut e, ep, MOD, r, EPOLLIN, 8), 0);
        assert_eq!(ready(&mut e, ep, 8), [(EPOLLIN, 8)]);
        // The write end: EPOLLOUT while there is room; EPOLLERR (always
        // reported) once no reader is left. The read end: EPOLLHUP once
        // no writer is left.
        assert_eq!(ctl(&mut e, ep, DEL, r, 0, 0), 0);
        assert_eq!(ctl(&mut e, ep, ADD, w, EPOLLOUT, 9), 0);
        assert_eq!(ready(&mut e, ep, 8), [(EPOLLOUT, 9)]);
        let (r2, w2) = pipe(&mut e, 0);
        assert_eq!(ctl(&mut e, ep, ADD, r2, EPOLLIN | EPOLLRDHUP, 10), 0);
        assert_eq!(e.ret("close", &[w2]), 0);
        assert_eq!(ready(&mut e, ep, 8), [(EPOLLOUT, 9), (EPOLLHUP, 10)]);
        assert_eq!(e.ret("close", &[r]), 0);
        // Both stay on the ready list in their order.
        assert_eq!(
            ready(&mut e, ep, 8),
            [(EPOLLOUT | EPOLLERR, 9), (EPOLLHUP, 10)]
        );
        let _ = r2;
    }
}

#[test]
fn closing_the_last_reference_removes_the_watch() {
    for mut e in both() {
        let ep = e.ret("epoll_create1", &[0]) as u64;
        let efd = e.ret("eventfd2", &[1, 0]) as u64;
        assert_eq!(ctl(&mut e, ep, ADD, efd, EPOLLIN, 5), 0);
        // A dup keeps the description: still reported, under the data
        // given, though the number it was added with is closed.
        let d = e.ret("dup", &[efd]) as u64;
        assert_eq!(e.ret("close", &[efd]), 0);
        assert_eq!(ready(&mut e, ep, 8), [(EPOLLIN, 5)]);
        assert_eq!(e.err("epoll_ctl", &[ep, DEL, efd, 0]), Errno::EBADF);
        assert_eq!(
            e.err("epoll_ctl", &[ep, DEL, d, 0]),
            Errno::ENOENT,
            "keyed by the fd added"
        );
        assert_eq!(e.ret("close", &[d]), 0);
        assert_eq!(ready(&mut e, ep, 8), []);
        assert!(e.sys.files.epoll_ref(0).unwrap().is_empty());
        // The number used again is a new file.
        let again = e.ret("eventfd2", &[1, 0]) as u64;
        assert_eq!(again, efd);
        assert_eq!(ready(&mut e, ep, 8), []);
        assert_eq!(ctl(&mut e, ep, ADD, again, EPOLLIN, 6), 0);
        assert_eq!(ready(&mut e, ep, 8), [(EPOLLIN, 6)]);
        // A nested epoll is readable while its own list has something.
        let outer = e.ret("epoll_create1", &[0]) as u64;
        assert_eq!(ctl(&mut e, outer, ADD, ep, EPOLLIN, 11), 0);
        assert_eq!(ready(&mut e, outer, 8), [(EPOLLIN, 11)]);
        assert_eq!(read_u64(&mut e, again), Ok(1));
        assert_eq!(ready(&mut e, outer, 8), []);
    }
}

#[test]
fn poll_and_select_answer_from_the_same_readiness() {
    for mut e in both() {
        let (r, w) = pipe(&mut e, 0);
        let efd = e.ret("eventfd2", &[0, 0]) as u64;
        let pfds = [r as i32, 0x1 | 0x4, efd as i32, 0x1 | 0x4, w as i32, 0x4]
            .map(|v| v.to_le_bytes())
            .concat();
        let pfds: Vec<u8> = pfds
            .chunks(8)
            .flat_map(|c| [&c[..4], &c[4..6], &[0, 0][..]].concat())
            .collect();
        e.poke(SCRATCH, &pfds);
        assert_eq!(e.ret("poll", &[SCRATCH, 3, 0]), 2);
        let revents = |e: &mut Env, i: u64| {
            u16::from_le_bytes(e.peek(SCRATCH + 8 * i + 6, 2).try_into().unwrap())
        };
        assert_eq!(revents(&mut e, 0), 0, "empty pipe");
        assert_eq!(revents(&mut e, 1), 0x4, "eventfd writable");
        assert_eq!(revents(&mut e, 2), 0x4, "pipe has room");
        assert_eq!(e.ret("close", &[w]), 0);
        e.poke(SCRATCH, &pfds[..8]);
        assert_eq!(e.ret("poll", &[SCRATCH, 1, 0]), 1);
        assert_eq!(
            revents(&mut e, 0),
            0x10,
            "POLLHUP, not POLLIN, with no writer"
        );
        // select counts a hang-up as readable.
        e.poke(SCRATCH + 0x100, &[1 << r, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            e.ret(
                if e.abi == Abi::X86_64 {
                    "select"
                } else {
                    "_newselect"
                },
                &[8, SCRATCH + 0x100, 0, 0, 0]
            ),
            1
        );
    }
}

#[test]
fn a_wait_on_files_ends_when_another_thread_makes_one_ready() {
    for mut e in both() {
        let ep = e.ret("epoll_create1", &[0]) as u64;
        let (r, w) = pipe(&mut e, 0);
        let efd = e.ret("eventfd2", &[0, 0]) as u64;
        assert_eq!(ctl(&mut e, ep, ADD, r, EPOLLIN, 1), 0);
        assert_eq!(ctl(&mut e, ep, ADD, efd, EPOLLIN, 2), 0);
        let main = e.t.clone();
        // Thread 8 waits in epoll_wait without a timeout.
        e.t = Thread::new(8);
        assert_eq!(
            e.call("epoll_wait", &[ep, OUT, 4, -1i64 as u64]),
            Action::Wait { until_ns: None }
        );
        let waiter = core::mem::replace(&mut e.t, main.clone());
        assert!(e.sys.waits.contains(8));
        // Woken early (by something else), it waits again.
        e.t = waiter;
        assert_eq!(e.resume(), Some(Action::Wait { until_ns: None }));
        let waiter = core::mem::replace(&mut e.t, main.clone());
        // The main thread writes the eventfd: thread 8 is woken, and its
        // call, made again, reports it.
        assert_eq!(write_u64(&mut e, efd, 3), 8);
        assert_eq!(e.m.woken, [8]);
        assert!(!e.sys.waits.contains(8));
        e.t = waiter;
        assert_eq!(e.resume(), Some(Action::Return(1)));
        assert_eq!(e.peek(OUT, 12)[..4], EPOLLIN.to_le_bytes());
        assert_eq!(e.peek(OUT + 4, 8), 2u64.to_le_bytes());
        assert_eq!(e.resume(), None, "no wait left");
        // A plain read of the empty pipe, woken by a write.
        assert_eq!(
            e.call("read", &[r, SCRATCH + 0x300, 16]),
            Action::Wait { until_ns: None }
        );
        let waiter = core::mem::replace(&mut e.t, main.clone());
        e.poke(SCRATCH, b"hello");
        assert_eq!(e.ret("write", &[w, SCRATCH, 5]), 5);
        assert_eq!(e.m.woken, [8, 8]);
        e.t = waiter;
        assert_eq!(e.resume(), Some(Action::Return(5)));
        assert_eq!(e.peek(SCRATCH + 0x300, 5), b"hello");
        // poll with a timeout: woken by the eventfd's read side (room),
        // not before; then timed out when its deadline passes.
        let pfd = [efd as i32, 0x1].map(i32::to_le_bytes).concat();
        e.poke(SCRATCH + 0x400, &pfd);
        assert_eq!(read_u64(&mut e, efd), Ok(3));
        let start = e.m.mono;
        let Action::Wait {
            until_ns: Some(until),
        } = e.call("poll", &[SCRATCH + 0x400, 1, 50])
        else {
            panic!("poll should wait")
        };
        assert!(until > start + 50_000_000 && until < start + 51_000_000);
        e.m.mono = until;
        assert_eq!(e.resume(), Some(Action::Return(0)), "timed out");
        // A close of the write end (here by dup2 over it) wakes a
        // reader, which sees end of file.
        assert_eq!(
            e.call("read", &[r, SCRATCH + 0x300, 16]),
            Action::Wait { until_ns: None }
        );
        let waiter = core::mem::replace(&mut e.t, main.clone());
        assert_eq!(e.ret("dup2", &[efd, w]), w as i64);
        assert!(!e.sys.waits.contains(8), "woken");
        e.t = waiter;
        assert_eq!(e.resume(), Some(Action::Return(0)));
        // A cancelled wait (a signal) is gone from the list.
        assert_eq!(
            e.call("read", &[efd, SCRATCH, 8]),
            Action::Wait { until_ns: None }
        );
        crate::sys::cancel_wait(&mut e.sys, &mut e.t);
        assert!(e.sys.waits.is_empty() && e.t.wait.is_none());
    }
}

#[test]
fn pipe_writes_up_to_pipe_buf_go_in_whole_or_wait() {
    for mut e in both() {
        let (r, w) = pipe(&mut e, O_NONBLOCK);
        let mut total = 0;
        while total < 65536 - 10 {
            total += e.ret(
                "write",
                &[w, SCRATCH, (65536 - 10 - total).min(0x8000) as u64],
            );
        }
        // 100 bytes do not fit in 10: EAGAIN, not a short write.
        assert_eq!(e.err("write", &[w, SCRATCH, 100]), Errno::EAGAIN);
        // More than PIPE_BUF may go in part.
        assert_eq!(e.ret("write", &[w, SCRATCH, 8192]), 10);
        assert_eq!(e.ret("read", &[r, SCRATCH, 50]), 50);
        // Blocking: 100 bytes wait for room, then go in whole.
        assert_eq!(e.ret("fcntl", &[w, 4, 0]), 0);
        assert_eq!(e.ret("read", &[r, SCRATCH, 0]), 0);
        assert_eq!(
            e.call("write", &[w, SCRATCH, 100]),
            Action::Wait { until_ns: None }
        );
        let main = e.t.clone();
        let waiter = core::mem::replace(&mut e.t, Thread::new(9));
        assert_eq!(e.ret("read", &[r, SCRATCH + 0x1000, 100]), 100);
        assert_eq!(e.m.woken, [7]);
        e.t = waiter;
        assert_eq!(e.resume(), Some(Action::Return(100)));
        let _ = main;
    }
}

#[test]
fn ppoll_and_epoll_pwait_wait_with_their_own_signal_mask() {
    for mut e in both() {
        let (r, w) = pipe(&mut e, 0);
        let ep = e.ret("epoll_create1", &[0]) as u64;
        assert_eq!(ctl(&mut e, ep, ADD, r, EPOLLIN, 1), 0);
        e.t.sigmask = 0b1;
        // SIGUSR1 (bit 9) blocked during the wait; SIGKILL cannot be.
        e.poke(SCRATCH + 0x500, &((1u64 << 9) | (1 << 8)).to_le_bytes());
        let pfd = [r as i32, 0x1].map(i32::to_le_bytes).concat();
        e.poke(SCRATCH + 0x400, &pfd);
        let ppoll = if e.abi == Abi::X86_64 {
            "ppoll"
        } else {
            "ppoll_time64"
        };
        assert_eq!(
            e.call(ppoll, &[SCRATCH + 0x400, 1, 0, SCRATCH + 0x500, 8]),
            Action::Wait { until_ns: None }
        );
        assert_eq!(e.t.sigmask, 1 << 9);
        assert_eq!(e.t.saved_sigmask, Some(0b1));
        // Made again (woken early), it keeps the mask it waits with.
        assert_eq!(e.resume(), Some(Action::Wait { until_ns: None }));
        assert_eq!(e.t.saved_sigmask, Some(0b1));
        let waiter = core::mem::replace(&mut e.t, Thread::new(9));
        assert_eq!(e.ret("write", &[w, SCRATCH, 1]), 1);
        e.t = waiter;
        assert_eq!(e.resume(), Some(Action::Return(1)));
        assert_eq!((e.t.sigmask, e.t.saved_sigmask), (0b1, None), "back");
        // A wait that returns at once gives the mask back at once.
        assert_eq!(
            e.ret("epoll_pwait", &[ep, OUT, 4, 0, SCRATCH + 0x500, 8]),
            1
        );
        assert_eq!((e.t.sigmask, e.t.saved_sigmask), (0b1, None));
    }
}

#[test]
fn epoll_pwait2_takes_a_64_bit_timespec_in_both_abis() {
    for mut e in both() {
        let ep = e.ret("epoll_create1", &[0]) as u64;
        let efd = e.ret("eventfd2", &[0, 0]) as u64;
        assert_eq!(ctl(&mut e, ep, ADD, efd, EPOLLIN, 4), 0);
        // { tv_sec: 0, tv_nsec: 30 ms } as a __kernel_timespec.
        e.poke(
            SCRATCH,
            &[0i64.to_le_bytes(), 30_000_000i64.to_le_bytes()].concat(),
        );
        let start = e.m.mono;
        let Action::Wait {
            until_ns: Some(until),
        } = e.call("epoll_pwait2", &[ep, OUT, 2, SCRATCH, 0, 0])
        else {
            panic!("epoll_pwait2 should wait")
        };
        assert!(until > start + 30_000_000 && until < start + 31_000_000);
        e.m.mono = until + 1;
        assert_eq!(e.resume(), Some(Action::Return(0)));
        // A zero timespec polls; NULL waits for ever.
        e.poke(SCRATCH, &[0u8; 16]);
        assert_eq!(e.ret("epoll_pwait2", &[ep, OUT, 2, SCRATCH, 0, 0]), 0);
        assert_eq!(
            e.call("epoll_pwait2", &[ep, OUT, 2, 0, 0, 0]),
            Action::Wait { until_ns: None }
        );
        e.poke(
            SCRATCH,
            &[0i64.to_le_bytes(), 1_000_000_000i64.to_le_bytes()].concat(),
        );
        assert_eq!(
            e.err("epoll_pwait2", &[ep, OUT, 2, SCRATCH, 0, 0]),
            Errno::EINVAL
        );
        assert_eq!(write_u64(&mut e, efd, 1), 8);
        assert_eq!(e.resume(), Some(Action::Return(1)));
        assert_eq!(e.peek(OUT + 4, 8), 4u64.to_le_bytes());
    }
}
