//! The one path for every byte the runtime emits on COM1.
//!
//! Exception reports, panics, self-test lines and task output all go through
//! [`print`] (via `kprintln!`). The sink depends on the console mode: in text
//! mode the text goes to the UART as is; in wire mode (`console=wire`) the
//! record stream owns COM1 and text is gathered into lines, each sent as a
//! text Log record through the [`WireLog`] the stream registers (the
//! console sits below every other layer and imports none of them).
//!
//! defmt frames take the same route: text mode drops and counts them, wire
//! mode carries each as a defmt Log record. Nothing here may be called from
//! NMI context.

use arch_x86::uart::{COM1, Uart16550};
use core::cell::Cell;
use core::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use critical_section::Mutex;
use sampler::wire::{Log, LogLevel, MAX_LOG};

/// The record stream as the console sees it: registered by the stream when
/// it starts ([`set_wire`]).
pub trait WireLog: Sync {
    /// True when the stream left COM1 for another device (COM1 then only
    /// carries the last words of a crash, as text).
    fn off_com1(&self) -> bool;
    /// Sends one Log record.
    fn send(&self, log: Log);
}

static WIRE: Mutex<Cell<Option<&'static dyn WireLog>>> = Mutex::new(Cell::new(None));

/// Registers the started stream: wire-mode text and defmt frames go to it.
pub fn set_wire(w: &'static dyn WireLog) {
    critical_section::with(|cs| WIRE.borrow(cs).set(Some(w)));
}

/// The started stream, if any.
fn wire() -> Option<&'static dyn WireLog> {
    critical_section::with(|cs| WIRE.borrow(cs).get())
}

/// Sends `log` on the stream; adds `n` to `dropped` when the stream has not
/// started.
fn send_log(log: Log, dropped: &AtomicU64, n: u64) {
    match wire() {
        Some(w) => w.send(log),
        None => {
            dropped.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// Where console output goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Sink {
    /// Plain text on COM1.
    Text = 0,
    /// The framed record stream on COM1.
    Wire = 1,
}

static SINK: AtomicU8 = AtomicU8::new(Sink::Text as u8);
static DROPPED_TEXT_BYTES: AtomicU64 = AtomicU64::new(0);
static DROPPED_DEFMT_FRAMES: AtomicU64 = AtomicU64::new(0);

fn uart() -> Uart16550 {
    // SAFETY: COM1 is the PC's first serial port; only this module programs it.
    unsafe { Uart16550::new(COM1) }
}

/// Programs the UART; call once at boot.
pub fn init() {
    uart().init();
}

/// Selects the sink.
pub fn set_sink(sink: Sink) {
    SINK.store(sink as u8, Ordering::Relaxed);
}

/// The sink in force.
pub fn sink() -> Sink {
    if SINK.load(Ordering::Relaxed) == Sink::Wire as u8 {
        Sink::Wire
    } else {
        Sink::Text
    }
}

/// Text bytes and defmt frames that no sink carried.
pub fn dropped() -> (u64, u64) {
    (
        DROPPED_TEXT_BYTES.load(Ordering::Relaxed),
        DROPPED_DEFMT_FRAMES.load(Ordering::Relaxed),
    )
}

/// Writes raw bytes to the current sink.
pub fn write_bytes(bytes: &[u8]) {
    match sink() {
        Sink::Text => uart().write_bytes(bytes),
        Sink::Wire => critical_section::with(|cs| {
            let mut line = LINE.borrow_ref_mut(cs);
            for &b in bytes {
                if b == b'\n' {
                    flush_line(&mut line);
                } else if line.push(b).is_err() {
                    flush_line(&mut line);
                    // Cannot fail: the line was just emptied.
                    let _ = line.push(b);
                }
            }
        }),
    }
}

/// The text line being gathered in wire mode.
static LINE: critical_section::Mutex<core::cell::RefCell<heapless::Vec<u8, MAX_LOG>>> =
    critical_section::Mutex::new(core::cell::RefCell::new(heapless::Vec::new()));

/// Sends the gathered line as one text Log record.
fn flush_line(line: &mut heapless::Vec<u8, MAX_LOG>) {
    let text = core::str::from_utf8(line).unwrap_or("(invalid UTF-8 in a log line)");
    let level = if text.contains("RUNTIME PANIC") || text.contains("EXCEPTION") {
        LogLevel::Error
    } else {
        LogLevel::Info
    };
    send_log(
        Log::text(crate::time::now_ns(), level, text),
        &DROPPED_TEXT_BYTES,
        line.len() as u64,
    );
    line.clear();
}

struct ConsoleWriter;

impl core::fmt::Write for ConsoleWriter {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        write_bytes(s.as_bytes());
        Ok(())
    }
}

/// Formats to the console.
pub fn print(args: core::fmt::Arguments<'_>) {
    let _ = core::fmt::Write::write_fmt(&mut ConsoleWriter, args);
}

/// Writes straight to the UART, bypassing the sink: only for the last words
/// of a crash, when nothing else can be trusted.
pub fn emergency_print(args: core::fmt::Arguments<'_>) {
    if let (Sink::Wire, Some(w)) = (sink(), wire()) {
        // Keep the stream parseable: the words go out as one Log record.
        let mut text: heapless::String<MAX_LOG> = heapless::String::new();
        let _ = core::fmt::Write::write_fmt(&mut text, args);
        // On virtio, COM1 gets the words too, as text: a crash of the
        // virtio path itself still reaches the host (`perch record` shows
        // COM1's text when a run fails).
        if w.off_com1() {
            let _ = core::fmt::Write::write_str(&mut uart(), &text);
        }
        w.send(Log::text(
            crate::time::now_ns(),
            LogLevel::Error,
            text.trim(),
        ));
        return;
    }
    let mut u = uart();
    let _ = core::fmt::Write::write_fmt(&mut u, args);
}

/// Prints a line to the console.
#[macro_export]
macro_rules! kprintln {
    () => { $crate::console::print(format_args!("\n")) };
    ($($arg:tt)*) => {{
        $crate::console::print(format_args!($($arg)*));
        $crate::console::print(format_args!("\n"));
    }};
}

/// Prints to the console without a newline.
#[macro_export]
macro_rules! kprint {
    ($($arg:tt)*) => { $crate::console::print(format_args!($($arg)*)) };
}

// ---- defmt global logger ----

static DEFMT_TAKEN: AtomicBool = AtomicBool::new(false);
static DEFMT_RESTORE: AtomicBool = AtomicBool::new(false);
static DEFMT_ENCODER: critical_section::Mutex<core::cell::RefCell<defmt::Encoder>> =
    critical_section::Mutex::new(core::cell::RefCell::new(defmt::Encoder::new()));

/// The defmt frame being built (wire mode).
static DEFMT_FRAME: critical_section::Mutex<core::cell::RefCell<heapless::Vec<u8, MAX_LOG>>> =
    critical_section::Mutex::new(core::cell::RefCell::new(heapless::Vec::new()));
static DEFMT_FRAME_CUT: AtomicBool = AtomicBool::new(false);

fn defmt_sink(bytes: &[u8]) {
    // Text mode: raw defmt bytes would garble the text console, so they are
    // dropped and counted per frame in `release`. Wire mode: gather the
    // frame; `release` sends it as one defmt Log record.
    if sink() == Sink::Wire {
        critical_section::with(|cs| {
            if DEFMT_FRAME
                .borrow_ref_mut(cs)
                .extend_from_slice(bytes)
                .is_err()
            {
                DEFMT_FRAME_CUT.store(true, Ordering::Relaxed);
            }
        });
    }
}

#[defmt::global_logger]
struct DefmtLogger;

// SAFETY: acquire/release bracket each frame; re-entry is refused by the
// `DEFMT_TAKEN` flag and interrupts are masked in between, and the runtime
// never logs from NMI context.
unsafe impl defmt::Logger for DefmtLogger {
    fn acquire() {
        let restore = arch_x86::cpu::disable_interrupts();
        if DEFMT_TAKEN.swap(true, Ordering::Acquire) {
            // A nested log (e.g. from a fault inside a log call): refuse it.
            // SAFETY: undoes the disable above.
            unsafe { arch_x86::cpu::restore_interrupts(restore) };
            panic!("defmt logger re-entered");
        }
        DEFMT_RESTORE.store(restore, Ordering::Relaxed);
        critical_section::with(|cs| DEFMT_ENCODER.borrow_ref_mut(cs).start_frame(defmt_sink));
    }

    unsafe fn flush() {}

    unsafe fn release() {
        critical_section::with(|cs| DEFMT_ENCODER.borrow_ref_mut(cs).end_frame(defmt_sink));
        if sink() == Sink::Wire && !DEFMT_FRAME_CUT.swap(false, Ordering::Relaxed) {
            critical_section::with(|cs| {
                let mut frame = DEFMT_FRAME.borrow_ref_mut(cs);
                let log = Log::defmt(crate::time::now_ns(), LogLevel::Info, &frame);
                frame.clear();
                send_log(log, &DROPPED_DEFMT_FRAMES, 1);
            });
        } else {
            critical_section::with(|cs| DEFMT_FRAME.borrow_ref_mut(cs).clear());
            DROPPED_DEFMT_FRAMES.fetch_add(1, Ordering::Relaxed);
        }
        DEFMT_TAKEN.store(false, Ordering::Release);
        let restore = DEFMT_RESTORE.load(Ordering::Relaxed);
        // SAFETY: matches the disable in `acquire`.
        unsafe { arch_x86::cpu::restore_interrupts(restore) };
    }

    unsafe fn write(bytes: &[u8]) {
        critical_section::with(|cs| DEFMT_ENCODER.borrow_ref_mut(cs).write(bytes, defmt_sink));
    }
}
