//! An output file written from a second thread: the converter fills large
//! buffers while the previous one is being copied into the page cache, so
//! the kernel's share of writing a big perf.data overlaps the decoding
//! instead of following it. Whole buffers can also be handed over without
//! a copy ([`OwnedWrite`]). Outputs are written to a temporary file beside
//! their target and renamed over it only when the run succeeds
//! ([`Pending`]), so a failed run never leaves a partial file nor destroys
//! the one that was there.

use std::fs::File;
use std::io::{self, Cursor, Seek, SeekFrom, Write};
use std::ops::Range;
use std::sync::mpsc::{Receiver, Sender, SyncSender, channel, sync_channel};
use std::thread::JoinHandle;

/// An output that can take a filled buffer by value. The default copies
/// `buf[from..]` with `write_all`; [`BackgroundFile`] hands the buffer
/// itself to its writing thread, so big record batches are never copied
/// a second time.
pub trait OwnedWrite: Write + Seek {
    /// Writes `buf[range]` after everything written before, and returns a
    /// buffer for the caller to fill next (the same one, or one coming back
    /// from the writing thread). Its length is kept and its bytes are
    /// whatever they were: a caller that stores into a buffer's existing
    /// bytes need not initialise them again, one that appends clears it.
    fn write_owned(&mut self, buf: Vec<u8>, range: Range<usize>) -> io::Result<Vec<u8>> {
        self.write_all(&buf[range])?;
        Ok(buf)
    }
}

impl OwnedWrite for File {}
impl OwnedWrite for Cursor<Vec<u8>> {}
impl OwnedWrite for Cursor<&mut Vec<u8>> {}

/// An output being written: a temporary file in the target's directory,
/// renamed to the target by [`commit`](Self::commit). Dropped without a
/// commit, it is removed and the target is left as it was. A target that
/// is a symlink is written through (the file it names is replaced); one
/// that is not a regular file (`/dev/null`, a FIFO, a directory) is opened
/// directly, since renaming over it would replace the device itself.
pub struct Pending {
    out: PendingOut,
    target: std::path::PathBuf,
}

enum PendingOut {
    /// The temporary file and the path it is renamed to.
    Temp(tempfile::NamedTempFile, std::path::PathBuf),
    /// A device or FIFO, written in place.
    Direct(File),
}

impl Pending {
    /// Creates the temporary file for `target` (mode 0644, like a new
    /// file under the usual umask).
    pub fn new(target: &std::path::Path) -> io::Result<Pending> {
        use std::os::unix::fs::PermissionsExt;
        if std::fs::metadata(target).is_ok_and(|m| !m.is_file()) {
            return Ok(Pending {
                out: PendingOut::Direct(File::create(target)?),
                target: target.to_owned(),
            });
        }
        let real = if std::fs::symlink_metadata(target).is_ok_and(|m| m.is_symlink()) {
            std::fs::canonicalize(target).unwrap_or_else(|_| target.to_owned())
        } else {
            target.to_owned()
        };
        let dir = match real.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => std::path::Path::new("."),
        };
        let name = real
            .file_name()
            .map_or_else(|| "out".into(), |n| n.to_string_lossy().into_owned());
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".tmp")
            .permissions(std::fs::Permissions::from_mode(0o644))
            .tempfile_in(dir)?;
        Ok(Pending {
            out: PendingOut::Temp(tmp, real),
            target: target.to_owned(),
        })
    }

    /// A second handle on the file being written, to write through.
    pub fn file(&self) -> io::Result<File> {
        match &self.out {
            PendingOut::Temp(tmp, _) => tmp.as_file().try_clone(),
            PendingOut::Direct(f) => f.try_clone(),
        }
    }

    /// The file the output becomes, as given.
    pub fn target(&self) -> &std::path::Path {
        &self.target
    }

    /// Renames the temporary file over the target.
    pub fn commit(self) -> io::Result<()> {
        match self.out {
            PendingOut::Temp(tmp, real) => tmp.persist(&real).map(drop).map_err(|e| e.error),
            PendingOut::Direct(_) => Ok(()),
        }
    }
}

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
    /// While the thread runs: full buffers out, written ones back.
    pipe: Option<Pipe>,
    /// After the thread is done.
    file: Option<File>,
}

/// A buffer on its way to the thread, and the bytes of it to write.
type Chunk = (Vec<u8>, Range<usize>);

struct Pipe {
    full: SyncSender<Chunk>,
    empty: Receiver<Vec<u8>>,
    thread: JoinHandle<io::Result<File>>,
}

impl BackgroundFile {
    /// Starts the writing thread for `file`.
    pub fn new(file: File) -> io::Result<Self> {
        let (full_tx, full_rx) = sync_channel::<Chunk>(BUFFERS);
        // Unbounded: buffers handed over by `write_owned` join the pool, and
        // the thread must never wait to give one back.
        let (empty_tx, empty_rx): (Sender<Vec<u8>>, _) = channel();
        for _ in 1..BUFFERS {
            // Cannot fail: the receiver is alive.
            let _ = empty_tx.send(Vec::with_capacity(CHUNK));
        }
        let thread = std::thread::Builder::new()
            .name("perf.data writer".into())
            .spawn(move || -> io::Result<File> {
                let mut file = file;
                for (b, range) in full_rx {
                    file.write_all(&b[range])?;
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

    /// Hands the filled buffer to the thread and takes a written one, emptied.
    fn hand_over(&mut self) -> io::Result<()> {
        let Some(pipe) = &self.pipe else {
            return Ok(());
        };
        let next = match pipe.empty.recv() {
            Ok(mut b) => {
                b.clear();
                b
            }
            // The thread stopped early: it failed. Collect its error.
            Err(_) => return self.join().map(|_| ()),
        };
        let full = std::mem::replace(&mut self.buf, next);
        let all = 0..full.len();
        if pipe.full.send((full, all)).is_err() {
            return self.join().map(|_| ());
        }
        Ok(())
    }

    /// Queues what is left, waits for the thread and returns the file.
    fn join(&mut self) -> io::Result<&mut File> {
        if let Some(pipe) = self.pipe.take() {
            let rest = std::mem::take(&mut self.buf);
            let all = 0..rest.len();
            let sent = rest.is_empty() || pipe.full.send((rest, all)).is_ok();
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

impl OwnedWrite for BackgroundFile {
    /// Queues what was written before, then `buf` itself: no copy.
    fn write_owned(&mut self, buf: Vec<u8>, range: Range<usize>) -> io::Result<Vec<u8>> {
        if self.pipe.is_none() {
            self.join()?.write_all(&buf[range])?;
            return Ok(buf);
        }
        if !self.buf.is_empty() {
            self.hand_over()?;
        }
        let Some(pipe) = &self.pipe else {
            return Err(io::Error::other(
                "the perf.data writer thread failed earlier",
            ));
        };
        if pipe.full.send((buf, range)).is_err() {
            self.join()?;
            return Err(io::Error::other(
                "the perf.data writer thread stopped before the end",
            ));
        }
        match pipe.empty.recv() {
            Ok(b) => Ok(b),
            Err(_) => {
                self.join()?;
                Err(io::Error::other(
                    "the perf.data writer thread stopped before the end",
                ))
            }
        }
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

/// An output that keeps nothing but its length, so that a writer that
/// seeks back (the perf.data header) works: a conversion whose perf.data is
/// not wanted (`perch convert --format pprof`) still runs the converter's
/// checks and counts.
#[derive(Debug, Default)]
pub struct Discard {
    pos: u64,
    len: u64,
}

impl Write for Discard {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.pos += data.len() as u64;
        self.len = self.len.max(self.pos);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Seek for Discard {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        let to = match pos {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = to.ok_or_else(|| io::Error::other("seek before the start"))?;
        Ok(self.pos)
    }
}

impl OwnedWrite for Discard {}

/// The perf.data output of a run: a file written in the background, or
/// nothing ([`Discard`]).
pub enum PerfOut {
    /// The file.
    File(BackgroundFile),
    /// No perf.data wanted.
    Discard(Discard),
}

impl PerfOut {
    /// Waits for everything to be written.
    pub fn finish(self) -> io::Result<()> {
        match self {
            PerfOut::File(f) => f.finish().map(drop),
            PerfOut::Discard(_) => Ok(()),
        }
    }
}

impl Write for PerfOut {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        match self {
            PerfOut::File(f) => f.write(data),
            PerfOut::Discard(d) => d.write(data),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            PerfOut::File(f) => f.flush(),
            PerfOut::Discard(d) => d.flush(),
        }
    }
}

impl Seek for PerfOut {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        match self {
            PerfOut::File(f) => f.seek(pos),
            PerfOut::Discard(d) => d.seek(pos),
        }
    }
}

impl OwnedWrite for PerfOut {
    fn write_owned(&mut self, buf: Vec<u8>, range: Range<usize>) -> io::Result<Vec<u8>> {
        match self {
            PerfOut::File(f) => f.write_owned(buf, range),
            PerfOut::Discard(d) => d.write_owned(buf, range),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// Discard keeps the length and position a file would have, through
    /// seeks back and rewrites.
    #[test]
    fn discard_tracks_what_a_file_would_hold() {
        let mut d = Discard::default();
        let mut c = Cursor::new(Vec::new());
        for w in [&mut d as &mut dyn OwnedWrite, &mut c] {
            w.write_all(&[1; 100]).unwrap();
            assert_eq!(w.seek(SeekFrom::Start(10)).unwrap(), 10);
            w.write_all(&[2; 5]).unwrap();
            assert_eq!(w.stream_position().unwrap(), 15);
            assert_eq!(w.seek(SeekFrom::End(0)).unwrap(), 100);
            w.write_owned(vec![3; 8], 2..6).unwrap();
            assert_eq!(w.seek(SeekFrom::End(0)).unwrap(), 104);
            assert!(w.seek(SeekFrom::Current(-200)).is_err());
        }
    }

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

    /// Buffers handed over by value land in order with copied writes
    /// around them, the given range of each, and come back for reuse with
    /// their length kept (copied writes never see their old bytes).
    #[test]
    fn owned_buffers_arrive_in_order_between_copied_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        let mut w = BackgroundFile::new(File::create(&path).unwrap()).unwrap();
        let mut expect = Vec::new();
        let mut spare = Vec::new();
        for i in 0..40usize {
            let small: Vec<u8> = (0..(i * 37) % 500).map(|k| (k + i) as u8).collect();
            w.write_all(&small).unwrap();
            expect.extend_from_slice(&small);
            // Whatever comes back is overwritten where it exists and
            // grown or cut to the new length.
            let mut big = std::mem::take(&mut spare);
            let len = (i * 65_537) % (3 * CHUNK);
            big.resize(len, 0);
            for (k, b) in big.iter_mut().enumerate() {
                *b = (k * 7 + i) as u8;
            }
            let from = ((i * 3) % 9).min(len);
            let to = len - (i % 5).min(len - from);
            expect.extend_from_slice(&big[from..to]);
            spare = w.write_owned(big, from..to).unwrap();
        }
        // Default implementation: a plain cursor copies the range and hands
        // the buffer back as it was.
        let mut c = Cursor::new(Vec::new());
        let back = c.write_owned(b"wxyz".to_vec(), 1..3).unwrap();
        assert_eq!(back, b"wxyz");
        assert_eq!(c.into_inner(), b"xy");
        drop(w.finish().unwrap());
        let mut got = Vec::new();
        File::open(&path).unwrap().read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), expect.len());
        assert!(got == expect, "contents differ");
    }

    /// A pending output replaces the target only when committed; dropped,
    /// it leaves the target as it was and no file behind.
    #[test]
    fn pending_output_replaces_the_target_only_on_commit() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("perf.data");
        std::fs::write(&target, b"old").unwrap();
        let p = Pending::new(&target).unwrap();
        p.file().unwrap().write_all(b"new").unwrap();
        drop(p);
        assert_eq!(std::fs::read(&target).unwrap(), b"old");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        let p = Pending::new(&target).unwrap();
        p.file().unwrap().write_all(b"new").unwrap();
        p.commit().unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        // Through a symlink: the file it names is replaced, the link kept.
        let link = dir.path().join("link.data");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let p = Pending::new(&link).unwrap();
        p.file().unwrap().write_all(b"linked").unwrap();
        p.commit().unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        assert_eq!(std::fs::read(&target).unwrap(), b"linked");
        // A device is written in place, never renamed over.
        let p = Pending::new(std::path::Path::new("/dev/null")).unwrap();
        p.file().unwrap().write_all(b"gone").unwrap();
        p.commit().unwrap();
        assert!(!std::fs::metadata("/dev/null").unwrap().is_file());
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
