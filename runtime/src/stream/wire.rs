//! The record stream on COM1 (`console=wire`): frames every record with the
//! sampler's [`Encoder`] and writes it to the UART through `embedded-io`.
//! Hello, Task, Log, Lost, Sample and End all pass through [`send`], one
//! frame at a time, under a critical section. Never called from NMI context.

use arch_x86::uart::{COM1, Uart16550};
use core::cell::RefCell;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use critical_section::Mutex;
use embedded_io::Write;
use sampler::wire::{DELIMITER, Encoder, EncoderConfig, MAX_FRAME, Record};

/// Encoder delta state for this many tasks at once (more only costs keyframes).
const TASK_SLOTS: usize = 16;

struct Stream {
    encoder: Option<Encoder<TASK_SLOTS>>,
    buf: [u8; MAX_FRAME],
}

static STREAM: Mutex<RefCell<Stream>> = Mutex::new(RefCell::new(Stream {
    encoder: None,
    buf: [0; MAX_FRAME],
}));
static STARTED: AtomicBool = AtomicBool::new(false);
static ENCODE_FAILURES: AtomicU64 = AtomicU64::new(0);
static WRITE_FAILURES: AtomicU64 = AtomicU64::new(0);

fn uart() -> Uart16550 {
    // SAFETY: COM1 is programmed once by `console::init`; in wire mode only
    // this module writes to it, inside the critical section.
    unsafe { Uart16550::new(COM1) }
}

/// Starts the stream: a leading delimiter so noise before it is not glued
/// to the first frame.
pub fn start() {
    critical_section::with(|cs| {
        STREAM.borrow_ref_mut(cs).encoder = Some(Encoder::new(EncoderConfig::default()));
        let mut u = uart();
        if u.write_all(&[DELIMITER]).is_err() {
            WRITE_FAILURES.fetch_add(1, Ordering::Relaxed);
        }
    });
    STARTED.store(true, Ordering::Release);
}

/// Whether [`start`] ran.
pub fn started() -> bool {
    STARTED.load(Ordering::Acquire)
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
    critical_section::with(|cs| {
        let mut s = STREAM.borrow_ref_mut(cs);
        let Stream { encoder, buf } = &mut *s;
        let encoder = encoder.get_or_insert_with(|| Encoder::new(EncoderConfig::default()));
        match encoder.encode(record, buf) {
            Ok(n) => {
                if uart().write_all(&buf[..n]).is_err() {
                    WRITE_FAILURES.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(_) => {
                ENCODE_FAILURES.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
}

/// Runs `f` with the encoder and the frame buffer (for the drain loop),
/// writing each frame it produces to the UART.
pub fn with_encoder<R>(
    f: impl FnOnce(&mut Encoder<TASK_SLOTS>, &mut [u8], &mut dyn FnMut(&[u8]) -> Result<(), ()>) -> R,
) -> R {
    critical_section::with(|cs| {
        let mut s = STREAM.borrow_ref_mut(cs);
        let Stream { encoder, buf } = &mut *s;
        let encoder = encoder.get_or_insert_with(|| Encoder::new(EncoderConfig::default()));
        let mut u = uart();
        let mut write = |frame: &[u8]| {
            u.write_all(frame).map_err(|_| {
                WRITE_FAILURES.fetch_add(1, Ordering::Relaxed);
            })
        };
        f(encoder, buf, &mut write)
    })
}

/// Frames written so far.
pub fn frames() -> u64 {
    critical_section::with(|cs| {
        STREAM
            .borrow_ref(cs)
            .encoder
            .as_ref()
            .map_or(0, Encoder::frames)
    })
}

/// `(records that could not be encoded, UART writes that failed)`.
pub fn failures() -> (u64, u64) {
    (
        ENCODE_FAILURES.load(Ordering::Relaxed),
        WRITE_FAILURES.load(Ordering::Relaxed),
    )
}
