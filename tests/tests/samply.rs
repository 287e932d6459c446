//! samply opens what perch writes, with no flags: `samply import` of a
//! demo capture, then samply's own symbol server (the Mozilla
//! `symbolicate/v5` API the profiler front end calls) names every sampled
//! address of the runtime (`[kernel.kallsyms]` to samply) and of demo64,
//! among them the runtime's `random_bytes` and `memcpy` and demo64's hot
//! functions.
//!
//! The test skips, saying why, when QEMU or samply is missing (`.ci/run`
//! installs samply with `cargo install`).
#![forbid(unsafe_code)]

use e2e_tests::{Recording, have_tool, qemu_present, record_demo};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Runtime functions the demo spends time in (demosys's getrandom fills its
/// buffer in the runtime).
const RUNTIME_FUNCTIONS: [&str; 2] = ["random_bytes", "memcpy"];

/// demo64's hot functions.
const PROGRAM_FUNCTIONS: [&str; 3] = [
    "demo_checksum_blocks",
    "demo_parse_records",
    "demo_update_stats",
];

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

/// The profile's libraries and, per library index, the distinct
/// lib-relative addresses of the frames samples land in (the leaf of each
/// sample's stack), over every thread.
fn sampled_addresses(profile: &Value) -> (Vec<Value>, BTreeMap<usize, BTreeSet<u64>>) {
    let libs = profile["libs"].as_array().expect("libs").clone();
    let mut by_lib: BTreeMap<usize, BTreeSet<u64>> = BTreeMap::new();
    for t in profile["threads"].as_array().expect("threads") {
        let frames = &t["frameTable"];
        let stacks = &t["stackTable"];
        for stack in t["samples"]["stack"].as_array().expect("samples") {
            let Some(stack) = stack.as_u64() else {
                continue;
            };
            let frame = stacks["frame"][stack as usize].as_u64().expect("frame") as usize;
            let func = frames["func"][frame].as_u64().expect("func") as usize;
            let Some(resource) = t["funcTable"]["resource"][func].as_i64() else {
                continue;
            };
            if resource < 0 {
                continue;
            }
            let lib = t["resourceTable"]["lib"][resource as usize].as_u64();
            let address = frames["address"][frame].as_i64();
            if let (Some(lib), Some(address)) = (lib, address)
                && address >= 0
            {
                by_lib
                    .entry(lib as usize)
                    .or_default()
                    .insert(address as u64);
            }
        }
    }
    (libs, by_lib)
}

/// The names samply's server gives `addresses` of the profile's library
/// `lib` (`None` for an address it names nothing at).
fn symbolicate(server: &Server, lib: &Value, addresses: &[u64]) -> Vec<Option<String>> {
    let request = json!({
        "memoryMap": [[lib["debugName"], lib["breakpadId"]]],
        "stacks": [addresses.iter().map(|a| json!([0, a])).collect::<Vec<_>>()],
    });
    let answer = post(
        &format!("{}/symbolicate/v5", server.base),
        &request.to_string(),
    );
    let answer: Value = serde_json::from_str(&answer)
        .unwrap_or_else(|e| panic!("samply's answer is not JSON ({e}): {answer}"));
    let frames = answer["results"][0]["stacks"][0]
        .as_array()
        .unwrap_or_else(|| panic!("no stack in samply's answer: {answer}"));
    assert_eq!(frames.len(), addresses.len(), "{answer}");
    frames
        .iter()
        .map(|f| f["function"].as_str().map(str::to_owned))
        .collect()
}

/// The names of the sampled addresses of the library `name`, after
/// checking that samply names every one of them.
fn names_of(
    server: &Server,
    libs: &[Value],
    by_lib: &BTreeMap<usize, BTreeSet<u64>>,
    name: &str,
) -> BTreeSet<String> {
    let index = libs
        .iter()
        .position(|l| l["name"] == name)
        .unwrap_or_else(|| panic!("no library {name} in samply's profile"));
    let addresses: Vec<u64> = by_lib
        .get(&index)
        .unwrap_or_else(|| panic!("no sample in {name}"))
        .iter()
        .copied()
        .collect();
    let names = symbolicate(server, &libs[index], &addresses);
    let unnamed: Vec<String> = addresses
        .iter()
        .zip(&names)
        .filter(|(_, n)| n.is_none())
        .map(|(a, _)| format!("{a:#x}"))
        .collect();
    assert!(
        unnamed.is_empty(),
        "samply names no function at {} of the {} sampled addresses of {name}: {unnamed:?}",
        unnamed.len(),
        addresses.len()
    );
    names.into_iter().flatten().collect()
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
    let profile: Value =
        serde_json::from_slice(&std::fs::read(&profile_path).expect("samply's profile.json"))
            .expect("samply's profile.json is JSON");
    let (libs, by_lib) = sampled_addresses(&profile);

    // The runtime is `[kernel.kallsyms]` to samply.
    let runtime = names_of(&server, &libs, &by_lib, "[kernel.kallsyms]");
    for f in RUNTIME_FUNCTIONS {
        assert!(
            runtime
                .iter()
                .any(|n| n == f || n.ends_with(&format!("::{f}"))),
            "samply does not name the runtime's {f} among {runtime:?}"
        );
    }
    let demo64 = names_of(&server, &libs, &by_lib, "demo64");
    for f in PROGRAM_FUNCTIONS {
        assert!(
            demo64.contains(f),
            "samply does not name demo64's {f} among {demo64:?}"
        );
    }
}
