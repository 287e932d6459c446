//! samply opens what perch writes, with no flags: `samply import` of a
//! demo capture, then samply's own symbol server (the Mozilla
//! `symbolicate/v5` API the profiler front end calls) names runtime
//! functions (the runtime is `[kernel.kallsyms]` to it) and the program's
//! own functions.
//!
//! The test skips, saying why, when QEMU or samply is missing (`.ci/run`
//! installs samply with `cargo install`).
#![forbid(unsafe_code)]

use e2e_tests::{Recording, have_tool, programs, qemu_present, record_demo, runtime_elf};
use host_tool::image::Image;
use object::{Object, ObjectSegment, ObjectSymbol};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Runtime functions the demo spends time in (demosys's getrandom fills its
/// buffer in the runtime).
const RUNTIME_FUNCTIONS: [&str; 2] = ["random_bytes", "memcpy"];

/// Functions of demo64.
const PROGRAM_FUNCTIONS: [&str; 2] = ["demo_checksum_blocks", "demo_update_stats"];

fn samply_present() -> bool {
    if have_tool("samply") {
        return true;
    }
    eprintln!("SKIPPED: samply is not installed (cargo install samply --locked; .ci/run does it)");
    false
}

/// A `samply import --no-open` serving one profile; killed when dropped.
struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT/TOKEN`, where `symbolicate/v5` lives.
    base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `%XX` decoded.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Imports `rec` into `profile` and serves it; the server's address comes
/// from the profiler URL samply prints on stdout with `--no-open`.
fn import(rec: &Recording, profile: &Path) -> Server {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut child = Command::new("samply")
        .arg("import")
        .arg(&rec.data)
        .arg("--no-open")
        .arg("-o")
        .arg(profile)
        .args(["-P", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("running samply import");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("samply's stdout"))
        .read_line(&mut line)
        .expect("reading samply's stdout");
    let mut server = Server {
        child,
        base: String::new(),
    };
    // https://profiler.firefox.com/from-url/<encoded .../TOKEN/profile.json>/...
    let encoded = line
        .trim()
        .split("/from-url/")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no profiler URL from samply import: {line:?}"));
    let url = percent_decode(encoded);
    server.base = url
        .strip_suffix("/profile.json")
        .unwrap_or_else(|| panic!("unexpected profile URL {url}"))
        .to_owned();
    server
}

/// POSTs `body` to `url` (plain http) and returns the response body.
fn post(url: &str, body: &str) -> String {
    let rest = url.strip_prefix("http://").expect("an http URL");
    let (host, path) = rest.split_at(rest.find('/').expect("a path"));
    let mut s = TcpStream::connect(host).expect("connecting to samply's server");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).expect("reading samply's response");
    let resp = String::from_utf8_lossy(&resp).into_owned();
    let (head, body) = resp.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "samply answered {head}");
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = String::new();
        let mut rest = body;
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 || tail.len() < n {
                break;
            }
            out.push_str(&tail[..n]);
            rest = tail[n..].trim_start_matches("\r\n");
        }
        return out;
    }
    body.to_owned()
}

/// The string value of `"key":"..."` in the first flat object of the
/// profile that has `"name":"<name>"` and that key (a `libs` entry).
fn lib_field(profile: &str, name: &str, key: &str) -> Option<String> {
    let needle = format!("\"name\":\"{name}\"");
    let k = format!("\"{key}\":\"");
    profile.match_indices(&needle).find_map(|(at, _)| {
        let start = profile[..at].rfind('{')?;
        let end = at + profile[at..].find('}')?;
        let obj = &profile[start..end];
        let v = &obj[obj.find(&k)? + k.len()..];
        Some(v[..v.find('"')?].to_owned())
    })
}

/// The function names samply's server gives `offsets` of the library
/// `name` (as the profile lists it).
fn symbolicate(server: &Server, profile: &str, name: &str, offsets: &[u64]) -> String {
    let id = lib_field(profile, name, "breakpadId")
        .unwrap_or_else(|| panic!("no library {name} in samply's profile"));
    let frames: Vec<String> = offsets.iter().map(|o| format!("[0,{o}]")).collect();
    let body = format!(
        "{{\"memoryMap\":[[\"{name}\",\"{id}\"]],\"stacks\":[[{}]]}}",
        frames.join(",")
    );
    post(&format!("{}/symbolicate/v5", server.base), &body)
}

#[test]
fn samply_names_runtime_and_program_frames_with_no_flags() {
    if !qemu_present() || !samply_present() {
        return;
    }
    let rec = record_demo(&["--freq", "4000", "--duration", "1"]);
    assert_eq!(rec.status, Some(0), "perch record failed:\n{}", rec.stderr);
    let dir = tempfile::tempdir().expect("temporary directory");
    let profile_path = dir.path().join("profile.json");
    let server = import(&rec, &profile_path);
    let profile = std::fs::read_to_string(&profile_path).expect("samply's profile.json");

    // The runtime: samply gives a `[kernel.kallsyms]` frame the low 32 bits
    // of its distance from the start of the kernel MMAP (the image's
    // `kernel_start`).
    let image = Image::open(&runtime_elf()).expect("the runtime image");
    let mut offsets = Vec::new();
    for f in RUNTIME_FUNCTIONS {
        let sym = image
            .symbols
            .iter()
            .filter(|s| s.addr >= image.kernel_start && s.addr < image.kernel_end)
            .find(|s| s.name == f || s.name.contains(&format!("::{f}::h")))
            .unwrap_or_else(|| panic!("no runtime function {f}"));
        offsets.push((sym.addr - image.kernel_start) & 0xffff_ffff);
    }
    let answer = symbolicate(&server, &profile, "[kernel.kallsyms]", &offsets);
    for f in RUNTIME_FUNCTIONS {
        assert!(
            answer.contains(&format!("{f}\"")),
            "samply does not name the runtime's {f}: {answer}"
        );
    }

    // The program: an ELF's addresses are relative to its first segment.
    let demo64 = programs::demo_programs()
        .into_iter()
        .find(|p| p.exe.ends_with("demo64"))
        .expect("demo64 among the demo programs");
    let bytes = std::fs::read(&demo64.exe).expect("reading demo64");
    let elf = object::File::parse(&*bytes).expect("demo64 is an ELF");
    let base = elf.segments().next().expect("a segment").address();
    let offsets: Vec<u64> = PROGRAM_FUNCTIONS
        .iter()
        .map(|f| {
            elf.symbols()
                .find(|s| s.name() == Ok(f))
                .unwrap_or_else(|| panic!("no {f} in demo64"))
                .address()
                - base
        })
        .collect();
    let answer = symbolicate(&server, &profile, "demo64", &offsets);
    for f in PROGRAM_FUNCTIONS {
        assert!(
            answer.contains(&format!("\"{f}\"")),
            "samply does not name demo64's {f}: {answer}"
        );
    }
}
