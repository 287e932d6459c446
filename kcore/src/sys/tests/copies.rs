//! `sendfile` and `copy_file_range` through the real handler paths, in
//! both ABIs: file to file, to the console and to a pipe, with and
//! without an offset pointer, the waits and signals of a pipe, and the
//! errors Linux gives. (To a socket: `sockets.rs`.)

use super::*;

const OFF: u64 = SCRATCH + 0x800;
const BUF: u64 = SCRATCH + 0x1000;

fn both() -> [Env; 2] {
    [Env::new(Abi::X86_64), Env::new(Abi::I386)]
}

/// Creates `path` holding `data`, open for reading and writing.
fn file_with(e: &mut Env, path: &str, data: &[u8]) -> u64 {
    let p = e.cstr(SCRATCH, path);
    let fd = e.ret("open", &[p, O_CREAT | O_RDWR, 0o644]);
    assert!(fd >= 3, "open {path}: {fd}");
    e.poke(BUF, data);
    assert_eq!(
        e.ret("write", &[fd as u64, BUF, data.len() as u64]),
        data.len() as i64
    );
    assert_eq!(e.ret("lseek", &[fd as u64, 0, 0]), 0);
    fd as u64
}

/// The whole content of the file open as `fd` (its offset is kept).
fn content(e: &mut Env, fd: u64) -> Vec<u8> {
    let n = e.ret("pread64", &[fd, BUF, 0x1000, 0, 0]);
    assert!(n >= 0, "pread64: {n}");
    e.peek(BUF, n as usize)
}

/// Writes offset `v` at `OFF` the way the ABI's `sendfile` reads it.
fn poke_off(e: &mut Env, v: i64, wide: bool) {
    if wide {
        e.poke(OFF, &v.to_le_bytes());
    } else {
        e.poke(OFF, &(v as i32).to_le_bytes());
    }
}

fn peek_off(e: &mut Env, wide: bool) -> i64 {
    if wide {
        e.u64_at(OFF) as i64
    } else {
        i64::from(e.u32_at(OFF) as i32)
    }
}

#[test]
fn sendfile_copies_a_file_from_its_offset_or_a_given_one() {
    for mut e in both() {
        let wide = e.abi == Abi::X86_64;
        let src = file_with(&mut e, "/tmp/src", b"0123456789abcdef");
        let dst = file_with(&mut e, "/tmp/dst", b"");
        // From the file's offset: it advances, as does the destination's.
        assert_eq!(e.ret("sendfile", &[dst, src, 0, 10]), 10);
        assert_eq!(content(&mut e, dst), b"0123456789");
        assert_eq!(e.ret("lseek", &[src, 0, 1]), 10);
        assert_eq!(e.ret("lseek", &[dst, 0, 1]), 10);
        // Up to the end of the file, then 0.
        assert_eq!(e.ret("sendfile", &[dst, src, 0, 100]), 6);
        assert_eq!(e.ret("sendfile", &[dst, src, 0, 100]), 0);
        assert_eq!(content(&mut e, dst), b"0123456789abcdef");
        // From a given offset: it advances, the file's offset stays.
        assert_eq!(e.ret("lseek", &[src, 3, 0]), 3);
        poke_off(&mut e, 12, wide);
        assert_eq!(e.ret("sendfile", &[dst, src, OFF, 3]), 3);
        assert_eq!(peek_off(&mut e, wide), 15);
        assert_eq!(e.ret("lseek", &[src, 0, 1]), 3);
        assert_eq!(content(&mut e, dst), b"0123456789abcdefcde");
        // i386's sendfile64 takes a 64-bit offset.
        if !wide {
            e.poke(OFF, &14i64.to_le_bytes());
            assert_eq!(e.ret("sendfile64", &[dst, src, OFF, 100]), 2);
            assert_eq!(e.u64_at(OFF), 16);
            assert_eq!(content(&mut e, dst), b"0123456789abcdefcdeef");
        }
        // To the console.
        let line = file_with(&mut e, "/tmp/line", b"a line\n");
        assert_eq!(e.ret("sendfile", &[1, line, 0, 100]), 7);
        assert_eq!(e.stdout_lines(), ["a line"]);
    }
}

#[test]
fn sendfile_into_a_pipe_waits_when_full_and_signals_without_a_reader() {
    for mut e in both() {
        let wide = e.abi == Abi::X86_64;
        let data: Vec<u8> = (0..40_000u32).map(|i| (i % 251) as u8).collect();
        let p = e.cstr(SCRATCH, "/tmp/big");
        let src = e.ret("open", &[p, O_CREAT | O_RDWR, 0o644]) as u64;
        for (i, part) in data.chunks(0x4000).enumerate() {
            e.poke(BUF, part);
            let off = (i * 0x4000) as u64;
            assert_eq!(
                e.ret("pwrite64", &[src, BUF, part.len() as u64, off, 0]),
                part.len() as i64
            );
        }
        assert_eq!(e.ret("pipe2", &[SCRATCH + 0x40, O_NONBLOCK]), 0);
        let (r, w) = (
            e.u32_at(SCRATCH + 0x40) as u64,
            e.u32_at(SCRATCH + 0x44) as u64,
        );
        // The pipe takes 65536 bytes: the file twice, less a bit.
        poke_off(&mut e, 0, wide);
        assert_eq!(e.ret("sendfile", &[w, src, OFF, 40_000]), 40_000);
        assert_eq!(peek_off(&mut e, wide), 40_000);
        poke_off(&mut e, 0, wide);
        assert_eq!(e.ret("sendfile", &[w, src, OFF, 40_000]), 25_536);
        assert_eq!(e.err("sendfile", &[w, src, OFF, 1]), Errno::EAGAIN);
        // Nothing left to send returns 0 at once, even to a full pipe.
        poke_off(&mut e, 40_000, wide);
        assert_eq!(e.ret("sendfile", &[w, src, OFF, 1]), 0);
        let p = e.cstr(SCRATCH, "/dev/null");
        let null = e.ret("open", &[p, 0, 0]) as u64;
        assert_eq!(e.ret("sendfile", &[w, null, 0, 1]), 0);
        let n = e.ret("read", &[r, BUF, 0x4000]);
        assert_eq!(n, 0x4000);
        assert_eq!(e.peek(BUF, 0x4000), &data[..0x4000]);
        // A blocking writer waits for room.
        assert_eq!(e.ret("fcntl", &[w, 4, 0]), 0);
        poke_off(&mut e, 0, wide);
        assert_eq!(e.ret("sendfile", &[w, src, OFF, 40_000]), 0x4000);
        assert_eq!(
            e.call("sendfile", &[w, src, OFF, 1]),
            Action::Wait { until_ns: None }
        );
        // No reader: SIGPIPE.
        assert_eq!(e.ret("close", &[r]), 0);
        assert!(matches!(
            e.call("sendfile", &[w, src, OFF, 1]),
            Action::Kill { signal: 13, .. }
        ));
    }
}

#[test]
fn sendfile_refuses_what_linux_refuses() {
    for mut e in both() {
        let wide = e.abi == Abi::X86_64;
        let src = file_with(&mut e, "/tmp/src", b"abc");
        let p = e.cstr(SCRATCH, "/tmp/app");
        let app = e.ret("open", &[p, O_CREAT | O_WRONLY | O_APPEND, 0o644]) as u64;
        let p = e.cstr(SCRATCH, "/tmp");
        let dir = e.ret("open", &[p, O_DIRECTORY, 0]) as u64;
        assert_eq!(e.ret("pipe", &[SCRATCH + 0x40]), 0);
        let (r, w) = (
            e.u32_at(SCRATCH + 0x40) as u64,
            e.u32_at(SCRATCH + 0x44) as u64,
        );
        // The source is a file open for reading.
        assert_eq!(e.err("sendfile", &[w, r, 0, 1]), Errno::EINVAL);
        assert_eq!(e.err("sendfile", &[w, dir, 0, 1]), Errno::EINVAL);
        assert_eq!(e.err("sendfile", &[w, app, 0, 1]), Errno::EBADF);
        assert_eq!(e.err("sendfile", &[w, 99, 0, 1]), Errno::EBADF);
        // The destination is open for writing, not for appending.
        assert_eq!(e.err("sendfile", &[r, src, 0, 1]), Errno::EBADF);
        assert_eq!(e.err("sendfile", &[app, src, 0, 1]), Errno::EINVAL);
        assert_eq!(e.err("sendfile", &[99, src, 0, 1]), Errno::EBADF);
        // The offset: readable, writable, not negative.
        poke_off(&mut e, -1, wide);
        assert_eq!(e.err("sendfile", &[w, src, OFF, 1]), Errno::EINVAL);
        assert_eq!(e.err("sendfile", &[w, src, BAD, 1]), Errno::EFAULT);
        // Nothing moved.
        assert_eq!(e.ret("lseek", &[src, 0, 1]), 0);
        assert_eq!(
            e.call("read", &[r, BUF, 1]),
            Action::Wait { until_ns: None }
        );
        // An offset that cannot be written back: the bytes went, the call
        // says EFAULT (as Linux, which stores the offset after the copy).
        assert_eq!(e.err("sendfile", &[w, src, RO, 1]), Errno::EFAULT);
        assert_eq!(e.ret("read", &[r, BUF, 10]), 1);
        // i386's 32-bit offset stops at 2^31 - 1.
        if !wide {
            poke_off(&mut e, i32::MAX.into(), false);
            assert_eq!(e.err("sendfile", &[w, src, OFF, 1]), Errno::EOVERFLOW);
            assert_eq!(e.ret("sendfile", &[w, src, OFF, 0]), 0);
        }
    }
}

#[test]
fn copy_file_range_copies_between_files_and_refuses_the_rest() {
    for mut e in both() {
        let src = file_with(&mut e, "/tmp/src", b"0123456789");
        let dst = file_with(&mut e, "/tmp/dst", b"..........");
        // The files' offsets: both advance.
        assert_eq!(e.ret("lseek", &[src, 2, 0]), 2);
        assert_eq!(e.ret("copy_file_range", &[src, 0, dst, 0, 3, 0]), 3);
        assert_eq!(content(&mut e, dst), b"234.......");
        assert_eq!(e.ret("lseek", &[src, 0, 1]), 5);
        assert_eq!(e.ret("lseek", &[dst, 0, 1]), 3);
        // Given offsets (64-bit in both ABIs): they advance, the files'
        // stay; the copy ends at the source's end, then gives 0.
        e.poke(OFF, &8i64.to_le_bytes());
        e.poke(OFF + 8, &12i64.to_le_bytes());
        assert_eq!(
            e.ret("copy_file_range", &[src, OFF, dst, OFF + 8, 100, 0]),
            2
        );
        assert_eq!((e.u64_at(OFF), e.u64_at(OFF + 8)), (10, 14));
        assert_eq!(content(&mut e, dst), b"234.......\0\089");
        assert_eq!(
            e.ret("copy_file_range", &[src, OFF, dst, OFF + 8, 100, 0]),
            0
        );
        assert_eq!(e.ret("lseek", &[src, 0, 1]), 5);
        // Within one file, ranges that do not overlap.
        e.poke(OFF, &0i64.to_le_bytes());
        e.poke(OFF + 8, &4i64.to_le_bytes());
        assert_eq!(e.ret("copy_file_range", &[src, OFF, src, OFF + 8, 4, 0]), 4);
        assert_eq!(content(&mut e, src), b"0123012389");
        e.poke(OFF, &0i64.to_le_bytes());
        e.poke(OFF + 8, &2i64.to_le_bytes());
        assert_eq!(
            e.err("copy_file_range", &[src, OFF, src, OFF + 8, 4, 0]),
            Errno::EINVAL
        );
        // Flags, a pipe, a directory, an appending or read-only
        // destination, a bad offset.
        assert_eq!(
            e.err("copy_file_range", &[src, 0, dst, 0, 1, 1]),
            Errno::EINVAL
        );
        assert_eq!(e.ret("pipe", &[SCRATCH + 0x40]), 0);
        let (r, w) = (
            e.u32_at(SCRATCH + 0x40) as u64,
            e.u32_at(SCRATCH + 0x44) as u64,
        );
        assert_eq!(
            e.err("copy_file_range", &[src, 0, w, 0, 1, 0]),
            Errno::EINVAL
        );
        assert_eq!(
            e.err("copy_file_range", &[r, 0, dst, 0, 1, 0]),
            Errno::EINVAL
        );
        let p = e.cstr(SCRATCH, "/tmp");
        let dir = e.ret("open", &[p, O_DIRECTORY, 0]) as u64;
        assert_eq!(
            e.err("copy_file_range", &[dir, 0, dst, 0, 1, 0]),
            Errno::EISDIR
        );
        let p = e.cstr(SCRATCH, "/tmp/app");
        let app = e.ret("open", &[p, O_CREAT | O_WRONLY | O_APPEND, 0o644]) as u64;
        assert_eq!(
            e.err("copy_file_range", &[src, 0, app, 0, 1, 0]),
            Errno::EBADF
        );
        let p = e.cstr(SCRATCH, "/tmp/src");
        let ro = e.ret("open", &[p, 0, 0]) as u64;
        assert_eq!(
            e.err("copy_file_range", &[src, 0, ro, 0, 1, 0]),
            Errno::EBADF
        );
        e.poke(OFF, &(-1i64).to_le_bytes());
        assert_eq!(
            e.err("copy_file_range", &[src, OFF, dst, 0, 1, 0]),
            Errno::EINVAL
        );
        assert_eq!(
            e.err("copy_file_range", &[src, BAD, dst, 0, 1, 0]),
            Errno::EFAULT
        );
    }
}
