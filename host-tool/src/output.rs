//! An output file written from a second thread: the converter fills large
//! buffers while the previous one is being copied into the page cache, so
//! the kernel's share of writing a big perf.data overlaps the decoding
//! instead of following it.

use std::fs::File;
use std::io::{self, Seek, SeekFrom, Write};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

/// Bytes collected before a buffer is handed to the writing thread.
pub const CHUNK: usize = 1 << 20;

/// Buffers in flight (one filling, the others queued or being written).
const BUFFERS: usize = 4;

/// A [`File`] whose writes are carried out by a background thread. The
/// first seek (or [`finish`](Self::finish)) waits for everything queued to
/// be written; from then on the file is used directly. Write errors from
/// the thread are reported by the next call that waits for it.
pub struct BackgroundFile {
    /// Filled by `write`, handed over when full.
    buf: Vec<u8>,
    /// While the thread runs: full buffers out, empty ones back.
    pipe: Option<Pipe>,
    /// After the thread is done.
    file: Option<File>,
}

struct Pipe {
    full: SyncSender<Vec<u8>>,
    empty: Receiver<Vec<u8>>,
    thread: JoinHandle<io::Result<File>>,
}

impl BackgroundFile {
    /// Starts the writing thread for `file`.
    pub fn new(file: File) -> io::Result<Self> {
        let (full_tx, full_rx) = sync_channel::<Vec<u8>>(BUFFERS);
        let (empty_tx, empty_rx) = sync_channel::<Vec<u8>>(BUFFERS);
        for _ in 1..BUFFERS {
            // Cannot fail: the channel has room for every spare buffer.
            let _ = empty_tx.send(Vec::with_capacity(CHUNK));
        }
        let thread = std::thread::Builder::new()
            .name("perf.data writer".into())
            .spawn(move || -> io::Result<File> {
                let mut file = file;
                for mut b in full_rx {
                    file.write_all(&b)?;
                    b.clear();
                    // The other side may already be gone (finishing).
                    let _ = empty_tx.send(b);
                }
                Ok(file)
            })?;
        Ok(BackgroundFile {
            buf: Vec::with_capacity(CHUNK),
            pipe: Some(Pipe {
                full: full_tx,
                empty: empty_rx,
                thread,
            }),
            file: None,
        })
    }

    /// Hands the filled buffer to the thread and takes an empty one.
    fn hand_over(&mut self) -> io::Result<()> {
        let Some(pipe) = &self.pipe else {
            return Ok(());
        };
        let next = match pipe.empty.recv() {
            Ok(b) => b,
            // The thread stopped early: it failed. Collect its error.
            Err(_) => return self.join().map(|_| ()),
        };
        let full = std::mem::replace(&mut self.buf, next);
        if pipe.full.send(full).is_err() {
            return self.join().map(|_| ());
        }
        Ok(())
    }

    /// Queues what is left, waits for the thread and returns the file.
    fn join(&mut self) -> io::Result<&mut File> {
        if let Some(pipe) = self.pipe.take() {
            let rest = std::mem::take(&mut self.buf);
            let sent = rest.is_empty() || pipe.full.send(rest).is_ok();
            drop(pipe.full);
            let file = pipe
                .thread
                .join()
                .map_err(|_| io::Error::other("the perf.data writer thread panicked"))??;
            if !sent {
                return Err(io::Error::other(
                    "the perf.data writer thread stopped before the end",
                ));
            }
            self.file = Some(file);
        }
        self.file
            .as_mut()
            .ok_or_else(|| io::Error::other("the perf.data writer thread failed earlier"))
    }

    /// Waits for every write and returns the file.
    pub fn finish(mut self) -> io::Result<File> {
        self.join()?;
        self.file
            .take()
            .ok_or_else(|| io::Error::other("the perf.data writer thread failed earlier"))
    }
}

impl Write for BackgroundFile {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.pipe.is_none() {
            return self.join()?.write(data);
        }
        let room = CHUNK - self.buf.len();
        let n = data.len().min(room);
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= CHUNK {
            self.hand_over()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.pipe.is_none() {
            return self.join()?.flush();
        }
        Ok(())
    }
}

impl Drop for BackgroundFile {
    /// Lets queued writes finish (on error paths too) instead of leaving
    /// the thread running while the process exits.
    fn drop(&mut self) {
        let _ = self.join();
    }
}

impl Seek for BackgroundFile {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        self.join()?.seek(pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// Everything written arrives in order, across many buffer handovers
    /// and writes of every size, and seeks work after the thread is done.
    #[test]
    fn writes_arrive_in_order_and_seeks_work() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        let mut w = BackgroundFile::new(File::create(&path).unwrap()).unwrap();
        let mut expect = Vec::new();
        let mut x = 1u32;
        let mut sizes = [1usize, 7, 4096, CHUNK - 3, 1 << 20, 3 * CHUNK + 5]
            .iter()
            .cycle();
        while expect.len() < 5 * CHUNK {
            let n = *sizes.next().unwrap();
            let part: Vec<u8> = (0..n)
                .map(|_| {
                    x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (x >> 24) as u8
                })
                .collect();
            w.write_all(&part).unwrap();
            expect.extend_from_slice(&part);
        }
        assert_eq!(w.seek(SeekFrom::Start(2)).unwrap(), 2);
        w.write_all(b"head").unwrap();
        expect[2..6].copy_from_slice(b"head");
        w.seek(SeekFrom::End(0)).unwrap();
        w.write_all(b"tail").unwrap();
        expect.extend_from_slice(b"tail");
        drop(w.finish().unwrap());
        let mut got = Vec::new();
        File::open(&path).unwrap().read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), expect.len());
        assert!(got == expect, "contents differ");
    }

    /// A write error in the thread comes back to the caller instead of
    /// being lost.
    #[test]
    fn a_failing_disk_is_reported() {
        // /dev/full accepts the open and fails every write with ENOSPC.
        let Ok(full) = File::options().write(true).open("/dev/full") else {
            eprintln!("skipped: no /dev/full");
            return;
        };
        let mut w = BackgroundFile::new(full).unwrap();
        let data = vec![7u8; CHUNK];
        let mut failed = None;
        for _ in 0..2 * BUFFERS + 2 {
            if let Err(e) = w.write_all(&data) {
                failed = Some(e);
                break;
            }
        }
        let err = match failed {
            Some(e) => e,
            None => w.finish().expect_err("writing to /dev/full must fail"),
        };
        assert!(err.to_string().contains("space"), "{err}");
    }
}
