//! The boot archive's manifest: which programs to start, with which argv, envp and cwd.
//!
//! The format is fixed by the project's contracts (`.perch/manifest` in the archive):
//!
//! ```text
//! perch-manifest 1
//! process NAME
//! exe PATH
//! arg VALUE
//! env KEY=VALUE
//! cwd PATH
//! end
//! ```
//!
//! Line 1 is exactly `perch-manifest 1`. After it, blank lines (empty or only spaces and
//! tabs) and lines starting with `#` are ignored. Every other line is a key, one space and
//! a value that runs to the end of the line (`end` has no value). Values are escaped:
//! `\\`, `\n`, `\t`, `\r` and `\xHH`; [`render`](Manifest::render) escapes every byte below
//! 0x20, 0x7f, the backslash and every byte that is not part of valid UTF-8, so any byte
//! string survives a round trip. The parser refuses raw control bytes in a value (a CR left
//! by a CRLF editor would otherwise end up silently inside the last argument).
//!
//! [`Manifest::parse`] and [`Manifest::render`] are exact inverses on every manifest that
//! [`Manifest::render`] accepts: `parse(render(m)) == m`.

use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

/// The only manifest version this crate reads and writes.
pub const VERSION: u32 = 1;
/// The exact first line of a manifest.
pub const HEADER: &str = "perch-manifest 1";
/// At most this many processes in one manifest.
pub const MAX_PROCESSES: usize = 16;
/// The longest process name (Linux's `TASK_COMM_LEN` minus the NUL).
pub const MAX_NAME_LEN: usize = 15;

/// A parsed manifest: the processes to start, in manifest order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Manifest {
    /// The process blocks, in the order they appear.
    pub processes: Vec<ProcessSpec>,
}

/// One `process` block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessSpec {
    /// The comm shown in output and profiles: 1..=15 bytes of printable ASCII, no spaces,
    /// no `[` or `]`.
    pub name: String,
    /// The archive path of the ELF (as written; the archive normalises `./` and `/`).
    pub exe: String,
    /// argv, argv\[0\] included. Never empty after parsing: without `arg` lines it is `[exe]`.
    pub argv: Vec<Vec<u8>>,
    /// envp (`KEY=VALUE` byte strings), in order.
    pub envp: Vec<Vec<u8>>,
    /// The working directory; `/` when the block has no `cwd` line.
    pub cwd: String,
}

impl ProcessSpec {
    /// A process with the manifest's defaults: argv `[exe]`, no environment, cwd `/`.
    pub fn new(name: &str, exe: &str) -> ProcessSpec {
        ProcessSpec {
            name: name.to_string(),
            exe: exe.to_string(),
            argv: vec![exe.as_bytes().to_vec()],
            envp: Vec::new(),
            cwd: "/".to_string(),
        }
    }

    /// Checks the rules that do not depend on the text form: the name, non-empty exe and
    /// cwd, non-empty argv.
    pub fn check(&self) -> Result<(), SpecError> {
        check_name(&self.name)?;
        if self.exe.is_empty() {
            return Err(SpecError::EmptyExe);
        }
        if self.cwd.is_empty() {
            return Err(SpecError::EmptyCwd);
        }
        if self.argv.is_empty() {
            return Err(SpecError::EmptyArgv);
        }
        Ok(())
    }
}

/// Checks a process name: 1..=15 bytes, printable ASCII without space, `[` or `]`.
pub fn check_name(name: &str) -> Result<(), SpecError> {
    check_name_bytes(name.as_bytes())
}

fn check_name_bytes(name: &[u8]) -> Result<(), SpecError> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(SpecError::NameLength { len: name.len() });
    }
    if let Some(&byte) = name
        .iter()
        .find(|&&b| !(0x21..=0x7e).contains(&b) || b == b'[' || b == b']')
    {
        return Err(SpecError::NameByte { byte });
    }
    Ok(())
}

/// A rule about one process that does not depend on the text form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecError {
    /// The name is empty or longer than [`MAX_NAME_LEN`].
    NameLength {
        /// Its length in bytes.
        len: usize,
    },
    /// The name has a byte that is not printable ASCII, or is a space or a bracket.
    NameByte {
        /// The offending byte.
        byte: u8,
    },
    /// `exe` is the empty string.
    EmptyExe,
    /// `cwd` is the empty string.
    EmptyCwd,
    /// argv is empty, which the manifest cannot express (no `arg` line means `[exe]`).
    EmptyArgv,
    /// `exe` or `cwd` is not UTF-8 after unescaping.
    PathNotUtf8 {
        /// `exe` or `cwd`.
        key: &'static str,
    },
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpecError::NameLength { len } => write!(
                f,
                "process name is {len} bytes long; it must be 1 to {MAX_NAME_LEN} bytes"
            ),
            SpecError::NameByte { byte } => write!(
                f,
                "process name contains byte 0x{byte:02x} ({:?}); names are printable ASCII without spaces or brackets",
                char::from(*byte)
            ),
            SpecError::EmptyExe => f.write_str("exe path is empty"),
            SpecError::EmptyCwd => f.write_str("cwd path is empty"),
            SpecError::EmptyArgv => f.write_str(
                "argv is empty, which a manifest cannot express (without `arg` lines argv is [exe])",
            ),
            SpecError::PathNotUtf8 { key } => write!(f, "{key} path is not UTF-8"),
        }
    }
}

/// Why a manifest did not parse, and on which line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong there.
    pub kind: ParseErrorKind,
}

/// What is wrong on a manifest line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseErrorKind {
    /// The line is not valid UTF-8 (write non-UTF-8 bytes as `\xHH`).
    NotUtf8,
    /// Line 1 is not `perch-manifest N`.
    BadHeader {
        /// What line 1 holds.
        found: String,
    },
    /// Line 1 is `perch-manifest N` with N other than 1.
    UnsupportedVersion {
        /// The version as written.
        version: String,
    },
    /// A key this format does not have.
    UnknownKey {
        /// The key as written.
        key: String,
    },
    /// A key that needs a value has no space after it.
    MissingValue {
        /// The key.
        key: &'static str,
    },
    /// `end` followed by something.
    UnexpectedValue,
    /// A backslash escape other than `\\ \n \t \r \xHH`.
    BadEscape {
        /// The escape as written (up to the offending character), e.g. `\q` or `\x4`.
        escape: String,
    },
    /// A raw control byte (below 0x20, or 0x7f) in a value.
    RawControl {
        /// The byte.
        byte: u8,
    },
    /// `exe`, `arg`, `env`, `cwd` or `end` outside a process block.
    OutsideBlock {
        /// The key.
        key: &'static str,
    },
    /// `process` while another block is still open.
    NestedProcess {
        /// The line of the open block's `process`.
        open_line: usize,
    },
    /// A once-only key (`exe`, `cwd`) given twice in a block.
    Duplicate {
        /// The key.
        key: &'static str,
        /// Where it was first given.
        first_line: usize,
    },
    /// `end` of a block without `exe`.
    MissingExe,
    /// A block still open at the end of the text (the line is its `process` line).
    UnclosedBlock,
    /// A seventeenth `process` block.
    TooManyProcesses,
    /// The block breaks a rule about processes (name, empty path, non-UTF-8 path).
    Spec(SpecError),
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "manifest line {}: ", self.line)?;
        match &self.kind {
            ParseErrorKind::NotUtf8 => {
                f.write_str("not valid UTF-8 (write non-UTF-8 bytes as \\xHH)")
            }
            ParseErrorKind::BadHeader { found } => write!(
                f,
                "not a perch manifest: line 1 must be `{HEADER}`, found {:?}",
                found
            ),
            ParseErrorKind::UnsupportedVersion { version } => write!(
                f,
                "manifest version {:?} is not supported (this runtime reads version {VERSION})",
                version
            ),
            ParseErrorKind::UnknownKey { key } => write!(
                f,
                "unknown key {key:?} (keys are process, exe, arg, env, cwd, end)"
            ),
            ParseErrorKind::MissingValue { key } => {
                write!(f, "`{key}` needs a space and a value")
            }
            ParseErrorKind::UnexpectedValue => f.write_str("`end` takes no value"),
            ParseErrorKind::BadEscape { escape } => write!(
                f,
                "bad escape {escape:?} (escapes are \\\\, \\n, \\t, \\r and \\xHH)"
            ),
            ParseErrorKind::RawControl { byte } => {
                write!(f, "raw control byte 0x{byte:02x} in a value; escape it")?;
                if *byte == b'\r' {
                    f.write_str(" as \\r (was the file saved with CRLF line ends?)")?;
                } else {
                    write!(f, " as \\x{byte:02x}")?;
                }
                Ok(())
            }
            ParseErrorKind::OutsideBlock { key } => {
                write!(f, "`{key}` outside a process block")
            }
            ParseErrorKind::NestedProcess { open_line } => write!(
                f,
                "`process` inside the block opened on line {open_line} (close it with `end`)"
            ),
            ParseErrorKind::Duplicate { key, first_line } => write!(
                f,
                "second `{key}` in this block (the first is on line {first_line})"
            ),
            ParseErrorKind::MissingExe => f.write_str("process block ends without an `exe` line"),
            ParseErrorKind::UnclosedBlock => {
                f.write_str("process block is not closed by `end` before the end of the manifest")
            }
            ParseErrorKind::TooManyProcesses => {
                write!(f, "more than {MAX_PROCESSES} processes")
            }
            ParseErrorKind::Spec(e) => e.fmt(f),
        }
    }
}

/// Why [`Manifest::render`] refused a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenderError {
    /// More than [`MAX_PROCESSES`] processes.
    TooManyProcesses {
        /// How many there are.
        count: usize,
    },
    /// A process breaks a rule.
    Process {
        /// Its index in [`Manifest::processes`].
        index: usize,
        /// The rule.
        error: SpecError,
    },
}

impl fmt::Display for RenderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RenderError::TooManyProcesses { count } => write!(
                f,
                "manifest has {count} processes; at most {MAX_PROCESSES} are allowed"
            ),
            RenderError::Process { index, error } => write!(f, "process {index}: {error}"),
        }
    }
}

impl core::error::Error for ParseError {}
impl core::error::Error for RenderError {}
impl core::error::Error for SpecError {}

/// The block being parsed.
struct Open {
    line: usize,
    name: String,
    exe: Option<(String, usize)>,
    cwd: Option<(String, usize)>,
    argv: Vec<Vec<u8>>,
    envp: Vec<Vec<u8>>,
}

impl Manifest {
    /// Parses manifest text (the bytes of `.perch/manifest`).
    pub fn parse(text: &[u8]) -> Result<Manifest, ParseError> {
        let mut lines = text.split(|&b| b == b'\n').enumerate();
        let err = |line: usize, kind| ParseError { line, kind };

        let first = lines.next().map(|(_, l)| l).unwrap_or(&[]);
        let first = core::str::from_utf8(first).map_err(|_| err(1, ParseErrorKind::NotUtf8))?;
        if first != HEADER {
            return Err(err(
                1,
                match first.strip_prefix("perch-manifest ") {
                    Some(v)
                        if !v.is_empty()
                            && v.chars().all(|c| !c.is_whitespace() && !c.is_control()) =>
                    {
                        ParseErrorKind::UnsupportedVersion {
                            version: v.to_string(),
                        }
                    }
                    _ => ParseErrorKind::BadHeader {
                        found: first.to_string(),
                    },
                },
            ));
        }

        let mut processes = Vec::new();
        let mut open: Option<Open> = None;
        for (index, raw) in lines {
            let line = index + 1;
            let text = core::str::from_utf8(raw).map_err(|_| err(line, ParseErrorKind::NotUtf8))?;
            if text.bytes().all(|b| b == b' ' || b == b'\t') || text.starts_with('#') {
                continue;
            }
            let (key, value) = match text.split_once(' ') {
                Some((k, v)) => (k, Some(v)),
                None => (text, None),
            };
            let key: &'static str = match key {
                "process" => "process",
                "exe" => "exe",
                "arg" => "arg",
                "env" => "env",
                "cwd" => "cwd",
                "end" => "end",
                other => {
                    return Err(err(
                        line,
                        ParseErrorKind::UnknownKey {
                            key: other.to_string(),
                        },
                    ));
                }
            };
            if key == "end" {
                if value.is_some() {
                    return Err(err(line, ParseErrorKind::UnexpectedValue));
                }
                let block = open
                    .take()
                    .ok_or(err(line, ParseErrorKind::OutsideBlock { key }))?;
                processes.push(finish(block, line)?);
                continue;
            }
            let value = value.ok_or(err(line, ParseErrorKind::MissingValue { key }))?;
            let value = unescape(value).map_err(|kind| err(line, kind))?;
            if key == "process" {
                if let Some(block) = &open {
                    return Err(err(
                        line,
                        ParseErrorKind::NestedProcess {
                            open_line: block.line,
                        },
                    ));
                }
                if processes.len() == MAX_PROCESSES {
                    return Err(err(line, ParseErrorKind::TooManyProcesses));
                }
                check_name_bytes(&value).map_err(|e| err(line, ParseErrorKind::Spec(e)))?;
                // A valid name is printable ASCII, so this conversion cannot fail.
                let name = String::from_utf8(value).map_err(|_| {
                    err(
                        line,
                        ParseErrorKind::Spec(SpecError::NameByte { byte: 0x80 }),
                    )
                })?;
                open = Some(Open {
                    line,
                    name,
                    exe: None,
                    cwd: None,
                    argv: Vec::new(),
                    envp: Vec::new(),
                });
                continue;
            }
            let block = open
                .as_mut()
                .ok_or(err(line, ParseErrorKind::OutsideBlock { key }))?;
            match key {
                "arg" => block.argv.push(value),
                "env" => block.envp.push(value),
                _ => {
                    let slot = if key == "exe" {
                        &mut block.exe
                    } else {
                        &mut block.cwd
                    };
                    if let Some((_, first_line)) = slot {
                        return Err(err(
                            line,
                            ParseErrorKind::Duplicate {
                                key,
                                first_line: *first_line,
                            },
                        ));
                    }
                    let path = String::from_utf8(value).map_err(|_| {
                        err(line, ParseErrorKind::Spec(SpecError::PathNotUtf8 { key }))
                    })?;
                    if path.is_empty() {
                        let e = if key == "exe" {
                            SpecError::EmptyExe
                        } else {
                            SpecError::EmptyCwd
                        };
                        return Err(err(line, ParseErrorKind::Spec(e)));
                    }
                    *slot = Some((path, line));
                }
            }
        }
        if let Some(block) = open {
            return Err(err(block.line, ParseErrorKind::UnclosedBlock));
        }
        Ok(Manifest { processes })
    }

    /// Renders the manifest as text that [`Manifest::parse`] reads back as `self`.
    ///
    /// Every process gets its `exe`, one `arg` line per argv entry, its `env` lines and its
    /// `cwd`. Refuses what the format cannot carry or the parser would refuse.
    pub fn render(&self) -> Result<String, RenderError> {
        if self.processes.len() > MAX_PROCESSES {
            return Err(RenderError::TooManyProcesses {
                count: self.processes.len(),
            });
        }
        let mut out = String::new();
        out.push_str(HEADER);
        out.push('\n');
        for (index, p) in self.processes.iter().enumerate() {
            p.check()
                .map_err(|error| RenderError::Process { index, error })?;
            push_line(&mut out, "process", p.name.as_bytes());
            push_line(&mut out, "exe", p.exe.as_bytes());
            for arg in &p.argv {
                push_line(&mut out, "arg", arg);
            }
            for env in &p.envp {
                push_line(&mut out, "env", env);
            }
            push_line(&mut out, "cwd", p.cwd.as_bytes());
            out.push_str("end\n");
        }
        Ok(out)
    }
}

fn finish(block: Open, end_line: usize) -> Result<ProcessSpec, ParseError> {
    let (exe, _) = block.exe.ok_or(ParseError {
        line: end_line,
        kind: ParseErrorKind::MissingExe,
    })?;
    let argv = if block.argv.is_empty() {
        vec![exe.as_bytes().to_vec()]
    } else {
        block.argv
    };
    Ok(ProcessSpec {
        name: block.name,
        exe,
        argv,
        envp: block.envp,
        cwd: block.cwd.map_or_else(|| "/".to_string(), |(c, _)| c),
    })
}

fn push_line(out: &mut String, key: &str, value: &[u8]) {
    out.push_str(key);
    out.push(' ');
    escape_into(out, value);
    out.push('\n');
}

/// Appends `value` escaped: control bytes, 0x7f, backslash and non-UTF-8 bytes become
/// escapes; valid UTF-8 otherwise passes through.
fn escape_into(out: &mut String, value: &[u8]) {
    for chunk in value.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\r' => out.push_str("\\r"),
                c if (c as u32) < 0x20 || c as u32 == 0x7f => push_hex(out, c as u8),
                c => out.push(c),
            }
        }
        for &b in chunk.invalid() {
            push_hex(out, b);
        }
    }
}

fn push_hex(out: &mut String, b: u8) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push_str("\\x");
    out.push(char::from(HEX[usize::from(b >> 4)]));
    out.push(char::from(HEX[usize::from(b & 0xf)]));
}

/// Undoes [`escape_into`]; refuses unknown escapes and raw control bytes.
fn unescape(value: &str) -> Result<Vec<u8>, ParseErrorKind> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b < 0x20 || b == 0x7f {
            return Err(ParseErrorKind::RawControl { byte: b });
        }
        if b != b'\\' {
            out.push(b);
            i += 1;
            continue;
        }
        let bad = |len: usize| ParseErrorKind::BadEscape {
            escape: String::from_utf8_lossy(bytes.get(i..i + len).unwrap_or(&bytes[i..]))
                .into_owned(),
        };
        match bytes.get(i + 1) {
            Some(b'\\') => out.push(b'\\'),
            Some(b'n') => out.push(b'\n'),
            Some(b't') => out.push(b'\t'),
            Some(b'r') => out.push(b'\r'),
            Some(b'x') => {
                let hi = bytes.get(i + 2).and_then(|&d| hex_digit(d)).ok_or(bad(3))?;
                let lo = bytes.get(i + 3).and_then(|&d| hex_digit(d)).ok_or(bad(4))?;
                out.push(hi << 4 | lo);
                i += 4;
                continue;
            }
            _ => return Err(bad(2)),
        }
        i += 2;
    }
    Ok(out)
}

fn hex_digit(d: u8) -> Option<u8> {
    match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'a'..=b'f' => Some(d - b'a' + 10),
        b'A'..=b'F' => Some(d - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse_str(s: &str) -> Result<Manifest, ParseError> {
        Manifest::parse(s.as_bytes())
    }

    fn kind_at(s: &str) -> (usize, ParseErrorKind) {
        let e = parse_str(s).expect_err("manifest should be refused");
        (e.line, e.kind)
    }

    #[test]
    fn parses_the_contract_example_with_defaults() {
        let m = parse_str(
            "perch-manifest 1\n# comment\n\nprocess cat\nexe bin/cat\narg cat\narg data/in.txt\n\
             env PATH=/bin\ncwd /data\nend\n  \t\nprocess true\nexe /bin/true\nend",
        )
        .unwrap();
        assert_eq!(m.processes.len(), 2);
        let cat = &m.processes[0];
        assert_eq!(cat.name, "cat");
        assert_eq!(cat.exe, "bin/cat");
        assert_eq!(cat.argv, vec![b"cat".to_vec(), b"data/in.txt".to_vec()]);
        assert_eq!(cat.envp, vec![b"PATH=/bin".to_vec()]);
        assert_eq!(cat.cwd, "/data");
        let t = &m.processes[1];
        assert_eq!(t.argv, vec![b"/bin/true".to_vec()]);
        assert!(t.envp.is_empty());
        assert_eq!(t.cwd, "/");
        assert_eq!(*t, ProcessSpec::new("true", "/bin/true"));
    }

    #[test]
    fn empty_value_is_the_empty_string_and_spaces_are_kept() {
        let m =
            parse_str("perch-manifest 1\nprocess p\nexe x\narg \narg  two spaces \nend\n").unwrap();
        assert_eq!(
            m.processes[0].argv,
            vec![b"".to_vec(), b" two spaces ".to_vec()]
        );
    }

    #[test]
    fn escapes_decode() {
        let m = parse_str(
            "perch-manifest 1\nprocess p\nexe x\narg a\\\\b\\nc\\td\\re\\x00\\xfF\\x7f\nend\n",
        )
        .unwrap();
        assert_eq!(
            m.processes[0].argv[0],
            b"a\\b\nc\td\re\x00\xff\x7f".to_vec()
        );
    }

    #[test]
    fn round_trip_awkward_bytes() {
        let mut p = ProcessSpec::new("we[i]rd", "bin/p");
        p.name = "a\\b#c".to_string();
        p.exe = "bin/ sp ace ".to_string();
        p.argv = vec![
            b"".to_vec(),
            b"  lead and trail  ".to_vec(),
            b"line1\nline2\r\n".to_vec(),
            b"back\\slash\\".to_vec(),
            b"\\x41 not an escape".to_vec(),
            vec![0xff, 0xfe, b'a', 0xc3],
            "h\u{e9}llo \u{2028} \u{1f600}".as_bytes().to_vec(),
            vec![0, 1, 0x1f, 0x7f, b'\t'],
            b"# not a comment".to_vec(),
        ];
        p.envp = vec![
            b"K=".to_vec(),
            b"=".to_vec(),
            b"".to_vec(),
            b"X=a b\n".to_vec(),
        ];
        p.cwd = "/tmp/ x".to_string();
        let m = Manifest {
            processes: vec![p, ProcessSpec::new("second", "b")],
        };
        let text = m.render().unwrap();
        assert!(text.starts_with("perch-manifest 1\nprocess a\\\\b#c\nexe bin/ sp ace \n"));
        assert!(core::str::from_utf8(text.as_bytes()).is_ok());
        // Every rendered line is a single line: no raw newline inside a value.
        assert_eq!(
            text.split('\n').count(),
            1 + (2 + 9 + 4 + 2) + 5 + 1,
            "{text}"
        );
        assert_eq!(Manifest::parse(text.as_bytes()).unwrap(), m);
    }

    #[test]
    fn render_escapes_exactly() {
        let mut p = ProcessSpec::new("p", "e");
        p.argv = vec![vec![b'\\', b'\n', b'\t', b'\r', 0, 0x7f, 0xff, b' ']];
        let text = Manifest { processes: vec![p] }.render().unwrap();
        assert_eq!(
            text,
            "perch-manifest 1\nprocess p\nexe e\narg \\\\\\n\\t\\r\\x00\\x7f\\xff \ncwd /\nend\n"
        );
    }

    #[test]
    fn empty_manifest_round_trips() {
        let m = Manifest::default();
        assert_eq!(m.render().unwrap(), "perch-manifest 1\n");
        assert_eq!(Manifest::parse(b"perch-manifest 1\n").unwrap(), m);
        assert_eq!(Manifest::parse(b"perch-manifest 1").unwrap(), m);
    }

    #[test]
    fn header_and_version_checks() {
        assert_eq!(
            kind_at("perch-manifest 2\n"),
            (
                1,
                ParseErrorKind::UnsupportedVersion {
                    version: "2".to_string()
                }
            )
        );
        let e = parse_str("perch-manifest 12\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "manifest line 1: manifest version \"12\" is not supported (this runtime reads version 1)"
        );
        for bad in [
            "",
            "\n",
            "# c\nperch-manifest 1\n",
            "perch-manifest",
            "perch-manifest \n",
            "perch-manifest 1 \n",
            "perch-manifest 1\r\n",
            "PERCH-MANIFEST 1\n",
        ] {
            match kind_at(bad) {
                (1, ParseErrorKind::BadHeader { .. }) => {}
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        assert_eq!(
            kind_at("\u{0}\u{ff}"),
            (
                1,
                ParseErrorKind::BadHeader {
                    found: "\u{0}\u{ff}".to_string()
                }
            )
        );
        assert_eq!(
            Manifest::parse(b"perch-manifest \xff\n").unwrap_err(),
            ParseError {
                line: 1,
                kind: ParseErrorKind::NotUtf8
            }
        );
    }

    const H: &str = "perch-manifest 1\n";

    #[test]
    fn each_line_error_names_its_line() {
        use ParseErrorKind as K;
        let cases: Vec<(String, usize, ParseErrorKind)> = vec![
            (
                format!("{H}process p\nexe x\nfoo bar\nend\n"),
                4,
                K::UnknownKey { key: "foo".into() },
            ),
            (
                format!("{H}process p\nexe x\nArg y\nend\n"),
                4,
                K::UnknownKey { key: "Arg".into() },
            ),
            (
                format!("{H}process p\n exe x\nend\n"),
                3,
                K::UnknownKey { key: "".into() },
            ),
            (
                format!("{H}process p\nexe x\narg\nend\n"),
                4,
                K::MissingValue { key: "arg" },
            ),
            (
                format!("{H}process\n"),
                2,
                K::MissingValue { key: "process" },
            ),
            (
                format!("{H}process p\nexe x\nend \n"),
                4,
                K::UnexpectedValue,
            ),
            (
                format!("{H}process p\nexe x\narg \\q\nend\n"),
                4,
                K::BadEscape {
                    escape: "\\q".into(),
                },
            ),
            (
                format!("{H}process p\nexe x\narg a\\\nend\n"),
                4,
                K::BadEscape {
                    escape: "\\".into(),
                },
            ),
            (
                format!("{H}process p\nexe x\narg \\x4\nend\n"),
                4,
                K::BadEscape {
                    escape: "\\x4".into(),
                },
            ),
            (
                format!("{H}process p\nexe x\narg \\xg0\nend\n"),
                4,
                K::BadEscape {
                    escape: "\\xg".into(),
                },
            ),
            (
                format!("{H}process p\nexe x\narg a\tb\nend\n"),
                4,
                K::RawControl { byte: b'\t' },
            ),
            (
                format!("{H}process p\r\nexe x\nend\n"),
                2,
                K::RawControl { byte: b'\r' },
            ),
            (format!("{H}exe x\n"), 2, K::OutsideBlock { key: "exe" }),
            (format!("{H}arg x\n"), 2, K::OutsideBlock { key: "arg" }),
            (format!("{H}env x\n"), 2, K::OutsideBlock { key: "env" }),
            (format!("{H}cwd x\n"), 2, K::OutsideBlock { key: "cwd" }),
            (format!("{H}\nend\n"), 3, K::OutsideBlock { key: "end" }),
            (
                format!("{H}process p\nexe x\nend\nend\n"),
                5,
                K::OutsideBlock { key: "end" },
            ),
            (
                format!("{H}process p\nexe x\nprocess q\n"),
                4,
                K::NestedProcess { open_line: 2 },
            ),
            (
                format!("{H}process p\nexe x\n\nexe y\nend\n"),
                5,
                K::Duplicate {
                    key: "exe",
                    first_line: 3,
                },
            ),
            (
                format!("{H}process p\nexe x\ncwd /\ncwd /a\nend\n"),
                5,
                K::Duplicate {
                    key: "cwd",
                    first_line: 4,
                },
            ),
            (format!("{H}process p\narg x\nend\n"), 4, K::MissingExe),
            (format!("{H}# c\nprocess p\nexe x\n"), 3, K::UnclosedBlock),
            (
                format!("{H}process p\nexe \nend\n"),
                3,
                K::Spec(SpecError::EmptyExe),
            ),
            (
                format!("{H}process p\nexe x\ncwd \nend\n"),
                4,
                K::Spec(SpecError::EmptyCwd),
            ),
            (
                format!("{H}process p\nexe \\xff\nend\n"),
                3,
                K::Spec(SpecError::PathNotUtf8 { key: "exe" }),
            ),
            (
                format!("{H}process p\nexe x\ncwd \\xc3\nend\n"),
                4,
                K::Spec(SpecError::PathNotUtf8 { key: "cwd" }),
            ),
            (
                format!("{H}process \nexe x\nend\n"),
                2,
                K::Spec(SpecError::NameLength { len: 0 }),
            ),
            (
                format!("{H}process sixteen_bytes_xx\n"),
                2,
                K::Spec(SpecError::NameLength { len: 16 }),
            ),
            (
                format!("{H}process a b\n"),
                2,
                K::Spec(SpecError::NameByte { byte: b' ' }),
            ),
            (
                format!("{H}process [p]\n"),
                2,
                K::Spec(SpecError::NameByte { byte: b'[' }),
            ),
            (
                format!("{H}process p]\n"),
                2,
                K::Spec(SpecError::NameByte { byte: b']' }),
            ),
            (
                format!("{H}process p\\x01\n"),
                2,
                K::Spec(SpecError::NameByte { byte: 1 }),
            ),
        ];
        for (text, line, kind) in cases {
            let e = parse_str(&text).expect_err(&text);
            assert_eq!((e.line, &e.kind), (line, &kind), "{text:?}");
            assert!(
                e.to_string()
                    .starts_with(&format!("manifest line {line}: "))
            );
        }
        // A non-ASCII name of valid length is refused for its byte.
        assert_eq!(
            kind_at(&format!("{H}process \u{e9}x\n")),
            (2, K::Spec(SpecError::NameByte { byte: 0xc3 }))
        );
        assert_eq!(
            kind_at(&format!("{H}process p\nexe x\narg \u{1}\nend\n")),
            (4, K::RawControl { byte: 1 })
        );
        assert_eq!(
            Manifest::parse(b"perch-manifest 1\nprocess p\nexe \xff\nend\n").unwrap_err(),
            ParseError {
                line: 3,
                kind: K::NotUtf8
            }
        );
        assert_eq!(
            kind_at(&format!("{H}process p\\xff\n")),
            (2, K::Spec(SpecError::NameByte { byte: 0xff }))
        );
    }

    #[test]
    fn error_messages_are_precise() {
        let msg = |s: &str| parse_str(s).unwrap_err().to_string();
        assert_eq!(
            msg(&format!("{H}process p\nexe x\nexe y\nend\n")),
            "manifest line 4: second `exe` in this block (the first is on line 3)"
        );
        assert_eq!(
            msg(&format!("{H}process p\r\n")),
            "manifest line 2: raw control byte 0x0d in a value; escape it as \\r (was the file saved with CRLF line ends?)"
        );
        assert_eq!(
            msg(&format!("{H}process p\nexe x\nargs y\nend\n")),
            "manifest line 4: unknown key \"args\" (keys are process, exe, arg, env, cwd, end)"
        );
        assert_eq!(
            msg(&format!("{H}process p\narg x\nend\n")),
            "manifest line 4: process block ends without an `exe` line"
        );
        assert_eq!(
            msg(&format!("{H}process [x]\n")),
            "manifest line 2: process name contains byte 0x5b ('['); names are printable ASCII without spaces or brackets"
        );
    }

    #[test]
    fn at_most_sixteen_processes() {
        let mut text = String::from(H);
        for i in 0..16 {
            text.push_str(&format!("process p{i}\nexe bin/p\nend\n"));
        }
        assert_eq!(parse_str(&text).unwrap().processes.len(), 16);
        text.push_str("process p16\nexe bin/p\nend\n");
        assert_eq!(kind_at(&text), (50, ParseErrorKind::TooManyProcesses));

        let m = Manifest {
            processes: (0..17).map(|_| ProcessSpec::new("p", "e")).collect(),
        };
        assert_eq!(m.render(), Err(RenderError::TooManyProcesses { count: 17 }));
        let m = Manifest {
            processes: (0..16).map(|_| ProcessSpec::new("p", "e")).collect(),
        };
        assert_eq!(Manifest::parse(m.render().unwrap().as_bytes()).unwrap(), m);
    }

    #[test]
    fn render_refuses_what_parse_would() {
        let bad = |f: fn(&mut ProcessSpec), error: SpecError| {
            let mut p = ProcessSpec::new("ok", "e");
            f(&mut p);
            let m = Manifest {
                processes: vec![ProcessSpec::new("first", "e"), p],
            };
            assert_eq!(m.render(), Err(RenderError::Process { index: 1, error }));
        };
        bad(|p| p.name = String::new(), SpecError::NameLength { len: 0 });
        bad(
            |p| p.name = "a".repeat(16),
            SpecError::NameLength { len: 16 },
        );
        bad(
            |p| p.name = "a b".into(),
            SpecError::NameByte { byte: b' ' },
        );
        bad(
            |p| p.name = "a\nb".into(),
            SpecError::NameByte { byte: b'\n' },
        );
        bad(|p| p.exe = String::new(), SpecError::EmptyExe);
        bad(|p| p.cwd = String::new(), SpecError::EmptyCwd);
        bad(|p| p.argv.clear(), SpecError::EmptyArgv);
    }

    fn spec() -> impl Strategy<Value = ProcessSpec> {
        let bytes = || proptest::collection::vec(any::<u8>(), 0..24);
        (
            "[!-Z\\\\^-~]{1,15}",
            "\\PC{1,20}",
            proptest::collection::vec(bytes(), 1..5),
            proptest::collection::vec(bytes(), 0..5),
            ".{1,12}",
        )
            .prop_map(|(name, exe, argv, envp, cwd)| ProcessSpec {
                name,
                exe,
                argv,
                envp,
                cwd,
            })
    }

    proptest! {
        #[test]
        fn proptest_render_then_parse_is_identity(
            processes in proptest::collection::vec(spec(), 0..=MAX_PROCESSES)
        ) {
            let m = Manifest { processes };
            let text = m.render().unwrap();
            prop_assert_eq!(Manifest::parse(text.as_bytes()).unwrap(), m);
        }

        #[test]
        fn proptest_parse_never_panics(text in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut with_header = HEADER.as_bytes().to_vec();
            with_header.push(b'\n');
            with_header.extend_from_slice(&text);
            let _ = Manifest::parse(&with_header);
            let _ = Manifest::parse(&text);
        }
    }
}
