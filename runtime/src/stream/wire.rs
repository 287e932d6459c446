//! The record stream (`console=wire`): frames every record with the
//! sampler's [`Encoder`] and writes it to the stream's [`Transport`] (COM1
//! or a virtio console) through `embedded-io`. Hello, Task, Log, Lost,
//! Sample and End all pass through [`send`] (or the drain's
//! [`with_encoder`]), one frame at a time, under a critical section. Never
//! called from NMI context.
//!
//! With `buffer=MiB` (the flight recorder) frames go into a RAM ring of
//! whole frames instead, and [`pump`] moves bytes from it to the transport
//! as fast as the device takes them, from the drain loop, the scheduler's
//! tick and the idle path. The drain takes samples from the sample ring
//! only while the buffer has room for a whole batch ([`room_for_batch`]),
//! so what a full buffer cannot take stays in the sample ring, whose
//! overflow is counted exactly (Lost records, End's `lost`).

use super::transport::{self, Probe, Transport};
use core::cell::RefCell;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use critical_section::Mutex;
use embedded_io::Write;
use sampler::bytering::ByteRing;
use sampler::wire::{
    DELIMITER, Encoder, EncoderConfig, MAX_FRAME, PutError, Record, TransportKind,
};

/// Encoder delta state for this many tasks at once (more only costs keyframes).
const TASK_SLOTS: usize = 16;

struct Stream {
    /// Built in place (it holds the group models, too large for the boot
    /// stack) and configured by [`start`].
    encoder: Encoder<TASK_SLOTS>,
    buf: [u8; MAX_FRAME],
    transport: Transport,
    /// The flight recorder's buffer (`buffer=MiB`).
    ring: Option<ByteRing<'static>>,
}

/// Moves buffered bytes to the transport while it takes them.
fn pump_ring(ring: &mut Option<ByteRing<'static>>, transport: &mut Transport) {
    if let Some(r) = ring {
        r.pump(|b| transport.try_write(b));
    }
}

/// Writes one frame: into the buffer, waiting for room only when it is
/// full (then the frame is Hello, Task, Log or End: the drain takes
/// samples only when a batch fits, see [`room_for_batch`]), or straight to
/// the transport.
fn emit(
    ring: &mut Option<ByteRing<'static>>,
    transport: &mut Transport,
    frame: &[u8],
) -> Result<(), ()> {
    let Some(r) = ring else {
        return transport.write_all(frame).map_err(|_| ());
    };
    if frame.len() > r.capacity() {
        return Err(());
    }
    loop {
        r.pump(|b| transport.try_write(b));
        if r.push(frame) {
            break;
        }
        core::hint::spin_loop();
    }
    r.pump(|b| transport.try_write(b));
    Ok(())
}

static STREAM: Mutex<RefCell<Stream>> = Mutex::new(RefCell::new(Stream {
    encoder: Encoder::new(EncoderConfig::DEFAULT),
    buf: [0; MAX_FRAME],
    transport: Transport::com1(),
    ring: None,
}));
static STARTED: AtomicBool = AtomicBool::new(false);
/// Whether the stream left COM1 for a virtio console (COM1 then only
/// carries the last words of a crash, as text).
static OFF_COM1: AtomicBool = AtomicBool::new(false);
static ENCODE_FAILURES: AtomicU64 = AtomicU64::new(0);
static WRITE_FAILURES: AtomicU64 = AtomicU64::new(0);

/// Starts the stream: a leading delimiter so noise before it is not glued
/// to the first frame. `group` is `wire_group=` (0: a frame per sample).
pub fn start(group: u32) {
    critical_section::with(|cs| {
        let mut s = STREAM.borrow_ref_mut(cs);
        s.encoder.configure(EncoderConfig {
            group,
            ..EncoderConfig::DEFAULT
        });
        // Group frames checked with the CPU's `crc32` instruction when it
        // has one (eight bytes an instruction, against about three
        // instructions a byte for the tables).
        if let Some(crc) = arch_x86::crc32c::hardware() {
            s.encoder.set_frame_crc(crc);
        }
        if s.transport.write_all(&[DELIMITER]).is_err() {
            WRITE_FAILURES.fetch_add(1, Ordering::Relaxed);
        }
    });
    STARTED.store(true, Ordering::Release);
    crate::console::set_wire(&ConsoleLog);
}

/// The console's way onto the stream.
struct ConsoleLog;

impl crate::console::WireLog for ConsoleLog {
    fn off_com1(&self) -> bool {
        off_com1()
    }

    fn send(&self, log: sampler::wire::Log) {
        send(&Record::Log(log));
    }
}

/// Whether [`start`] ran.
pub fn started() -> bool {
    STARTED.load(Ordering::Acquire)
}

/// Moves the stream to a virtio console if `choice` allows and one
/// answers (a leading delimiter on it first); before Hello, after the
/// frame allocator is up. Returns what the probe found.
pub fn select_transport(choice: kcore::cmdline::TransportChoice) -> Probe {
    let (t, probe) = transport::probe(choice);
    if let Some(mut t) = t {
        if t.write_all(&[DELIMITER]).is_err() {
            WRITE_FAILURES.fetch_add(1, Ordering::Relaxed);
        }
        critical_section::with(|cs| STREAM.borrow_ref_mut(cs).transport = t);
        OFF_COM1.store(true, Ordering::Release);
    }
    probe
}

/// Whether the stream is on a virtio console rather than COM1.
pub fn off_com1() -> bool {
    OFF_COM1.load(Ordering::Acquire)
}

/// The stream's transport, for Hello.
pub fn transport_kind() -> TransportKind {
    critical_section::with(|cs| STREAM.borrow_ref(cs).transport.kind())
}

/// Installs the flight recorder's buffer over `mem` (taken for good).
pub fn set_buffer(mem: &'static mut [u8]) {
    critical_section::with(|cs| STREAM.borrow_ref_mut(cs).ring = Some(ByteRing::new(mem)));
}

/// `(capacity, bytes waiting, high water)` of the buffer, if there is one.
pub fn buffer_stats() -> Option<(usize, usize, usize)> {
    critical_section::with(|cs| {
        STREAM
            .borrow_ref(cs)
            .ring
            .as_ref()
            .map(|r| (r.capacity(), r.len(), r.high_water()))
    })
}

/// Whether the drain may take `records` more records from the sample ring
/// now: always without a buffer (writes wait for the line), else when the
/// buffer has room for that many largest frames (and a Lost record).
pub fn room_for_batch(records: usize) -> bool {
    critical_section::with(|cs| {
        STREAM
            .borrow_ref(cs)
            .ring
            .as_ref()
            .is_none_or(|r| r.free() >= (records + 1) * MAX_FRAME)
    })
}

/// Moves buffered bytes to the transport as far as it takes them now
/// (never waits). Called from the drain loop, the scheduler's tick and the
/// idle path; does nothing while the stream is in use (the tick arrived
/// inside a write).
pub fn pump() {
    critical_section::with(|cs| {
        if let Ok(mut s) = STREAM.borrow(cs).try_borrow_mut() {
            let Stream {
                transport, ring, ..
            } = &mut *s;
            pump_ring(ring, transport);
        }
    });
}

/// Waits until every buffered byte has left and the transport is idle:
/// the end of a run, before the machine exits.
pub fn flush() {
    loop {
        let done = critical_section::with(|cs| {
            let Ok(mut s) = STREAM.borrow(cs).try_borrow_mut() else {
                return true;
            };
            let Stream {
                transport, ring, ..
            } = &mut *s;
            pump_ring(ring, transport);
            ring.as_ref().is_none_or(ByteRing::is_empty) && transport.idle()
        });
        if done {
            return;
        }
        core::hint::spin_loop();
    }
}

/// Encodes and writes one record. Records that cannot be encoded or written
/// are counted ([`failures`]), never dropped silently.
///
/// Never inlined: building the encoder takes a frame of about 16 KiB,
/// which inlined into a long-lived caller (the self-test's runner, the
/// exception report) stays on the 64 KiB boot stack for good and, with
/// the callers' own frames, overflows it.
#[inline(never)]
pub fn send(record: &Record) {
    with_encoder(|encoder, buf, write| {
        // Samples waiting in an open group frame go first. A failed write
        // is counted by `write`.
        if let Err(PutError::Encode(_)) = encoder.put(record, buf, write) {
            ENCODE_FAILURES.fetch_add(1, Ordering::Relaxed);
        }
    });
}

/// Writes the open group frame if its first sample waited `age_ns` or
/// longer (all of it with 0): the drain calls it when the rings are
/// empty, so a quiet stream's samples do not wait for the group to fill.
pub fn flush_group(age_ns: u64) {
    let now = crate::time::now_ns();
    with_encoder(|encoder, buf, write| {
        if let Err(PutError::Encode(_)) = encoder.flush_older(now, age_ns, buf, write) {
            ENCODE_FAILURES.fetch_add(1, Ordering::Relaxed);
        }
    });
}

/// Runs `f` with the encoder and the frame buffer (for the drain loop),
/// writing each frame it produces to the transport (or the buffer).
pub fn with_encoder<R>(
    f: impl FnOnce(&mut Encoder<TASK_SLOTS>, &mut [u8], &mut dyn FnMut(&[u8]) -> Result<(), ()>) -> R,
) -> R {
    critical_section::with(|cs| {
        let mut s = STREAM.borrow_ref_mut(cs);
        let Stream {
            encoder,
            buf,
            transport,
            ring,
        } = &mut *s;
        // With a buffer, room was checked before the step
        // (`room_for_batch`), so `emit` does not wait.
        let mut write = |frame: &[u8]| {
            emit(ring, transport, frame).map_err(|()| {
                WRITE_FAILURES.fetch_add(1, Ordering::Relaxed);
            })
        };
        f(encoder, buf, &mut write)
    })
}

/// Frames written so far.
pub fn frames() -> u64 {
    critical_section::with(|cs| STREAM.borrow_ref(cs).encoder.frames())
}

/// `(records that could not be encoded, transport writes that failed)`.
pub fn failures() -> (u64, u64) {
    (
        ENCODE_FAILURES.load(Ordering::Relaxed),
        WRITE_FAILURES.load(Ordering::Relaxed),
    )
}
