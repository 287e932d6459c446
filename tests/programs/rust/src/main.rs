//! appcheck-rs: the Rust `std` counterpart of `tests/programs/c/appcheck.c`.
//!
//! `appcheck-rs DIR FILE...` prints its argv and `PERCH_GREETING`, the size,
//! line count and FNV-1a checksum of each FILE, the sorted entries of DIR,
//! a checksum over 80 MiB of touched heap, yes/no for the clocks, and the
//! result of writing a new file and reading it back; one line goes to
//! stderr, and it exits with status 3. Every line is deterministic, so a
//! native run and a run under the runtime print the same bytes.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const HEAP_BYTES: usize = 80 << 20;

fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn check_file(path: &str) -> Result<String, String> {
    let bytes = fs::read(path).map_err(|e| format!("file {path}: read failed: {e}"))?;
    let meta = fs::metadata(path).map_err(|e| format!("file {path}: stat failed: {e}"))?;
    if meta.len() != bytes.len() as u64 {
        return Err(format!("file {path}: stat disagrees with read"));
    }
    let lines = bytes.iter().filter(|&&b| b == b'\n').count();
    Ok(format!(
        "file {path}: {} bytes, {lines} lines, fnv1a {:016x}",
        bytes.len(),
        fnv1a(0xcbf2_9ce4_8422_2325, &bytes)
    ))
}

fn list_dir(path: &str) -> Result<String, String> {
    let mut names = Vec::new();
    for entry in fs::read_dir(path).map_err(|e| format!("dir {path}: {e}"))? {
        let entry = entry.map_err(|e| format!("dir {path}: {e}"))?;
        let kind = match entry.file_type() {
            Ok(t) if t.is_dir() => "/",
            Ok(t) if t.is_file() => "",
            _ => "?",
        };
        names.push(format!("{}{kind}", entry.file_name().to_string_lossy()));
    }
    names.sort();
    Ok(format!(
        "dir {path}: {} entries: {}",
        names.len(),
        names.join(" ")
    ))
}

fn heap() -> String {
    let mut v: Vec<u64> = Vec::with_capacity(HEAP_BYTES / 8);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..HEAP_BYTES / 8 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(x);
    }
    let sum = v
        .iter()
        .step_by(64)
        .fold(0u64, |s, &w| s.wrapping_mul(31).wrapping_add(w));
    format!(
        "heap: touched {} MiB, checksum {sum:016x}",
        HEAP_BYTES >> 20
    )
}

fn clocks() -> String {
    let start = Instant::now();
    let mut spin = 0u64;
    let mut advanced = false;
    for _ in 0..1000 {
        for i in 0..100_000u64 {
            spin = std::hint::black_box(spin.wrapping_add(i));
        }
        if start.elapsed() > Duration::ZERO {
            advanced = true;
            break;
        }
    }
    // 2020-01-01T00:00:00Z
    let after_2020 = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .is_ok_and(|d| d.as_secs() > 1_577_836_800);
    let yn = |b: bool| if b { "yes" } else { "no" };
    format!(
        "clocks: monotonic advances {}, realtime after 2020 {}",
        yn(advanced),
        yn(after_2020)
    )
}

fn new_file(path: &str) -> Result<String, String> {
    let text: String = (0..)
        .map(|i| format!("line {i} of the new file\n"))
        .scan(0usize, |len, line| {
            *len += line.len();
            (*len < 3000).then_some(line)
        })
        .collect();
    let fail = |what: &str, e: std::io::Error| format!("new file {path}: {what} failed: {e}");
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| fail("create", e))?;
    f.write_all(text.as_bytes()).map_err(|e| fail("write", e))?;
    f.seek(SeekFrom::Start(0)).map_err(|e| fail("seek", e))?;
    let mut back = Vec::new();
    f.read_to_end(&mut back).map_err(|e| fail("read", e))?;
    drop(f);
    let again = fs::read(path).map_err(|e| fail("reopen", e))?;
    let same = back == text.as_bytes() && again == text.as_bytes();
    Ok(format!(
        "new file {path}: wrote {} bytes, read back {}",
        text.len(),
        if same { "identical" } else { "DIFFERENT" }
    ))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let shown: Vec<String> = args.iter().map(|a| format!("[{a}]")).collect();
    println!("appcheck-rs: {} args: {}", args.len(), shown.join(" "));
    let greeting = std::env::var("PERCH_GREETING").unwrap_or_else(|_| "(unset)".into());
    println!("env PERCH_GREETING={greeting}");
    if args.len() < 3 {
        eprintln!("usage: appcheck-rs DIR FILE...");
        std::process::exit(2);
    }
    let mut failures = 0;
    let mut report = |r: Result<String, String>| match r {
        Ok(line) => println!("{line}"),
        Err(line) => {
            println!("{line}");
            failures += 1;
        }
    };
    for path in &args[2..] {
        report(check_file(path));
    }
    report(list_dir(&args[1]));
    report(Ok(heap()));
    report(Ok(clocks()));
    report(new_file("appcheck-new.txt"));
    println!("appcheck-rs: {failures} failures");
    eprintln!("appcheck-rs: done, exiting with status 3");
    std::process::exit(if failures == 0 { 3 } else { 1 });
}
