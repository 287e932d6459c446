//! The programs of a run, as the user names them: `perch record -- PROGRAM
//! [ARGS...]` with `--file HOST[:GUEST]`, or an appliance manifest
//! (`--appliance FILE.toml`, format in `docs/programs.md`). [`AppSpec`]
//! checks every program before anything boots (readable, a static x86-64
//! or i386 Linux ELF the runtime's loader accepts), packs the boot archive
//! ([`crate::archive::Appliance`]) and gives the converter the host file of
//! each archive path, so perf.data names each program's own ELF.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::archive::{Appliance, ProcessSpec};

/// Why the programs of a run are unusable (nothing was booted).
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// The manifest file cannot be read.
    #[error("appliance manifest {path}: {source}")]
    ManifestIo {
        /// The manifest.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The manifest is not valid TOML or has an unknown or missing key.
    #[error("appliance manifest {path}: {message}")]
    Manifest {
        /// The manifest.
        path: PathBuf,
        /// What is wrong (from the TOML parser: line, column, key).
        message: String,
    },
    /// A program cannot be read.
    #[error("program {path}: cannot read it: {source}")]
    ProgramIo {
        /// The host path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A program is not one the runtime can load.
    #[error("program {path}: {why}")]
    Program {
        /// The host path.
        path: PathBuf,
        /// Why the loader would refuse it.
        why: String,
    },
    /// A data file cannot be read.
    #[error("data file {path}: cannot read it: {source}")]
    FileIo {
        /// The host path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Anything else wrong with what was asked (names, paths, counts).
    #[error("{0}")]
    Invalid(String),
}

/// The most processes a manifest may hold (the runtime's limit).
pub const MAX_PROCESSES: usize = 16;

/// One process to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessPlan {
    /// Its comm (1..=15 printable ASCII bytes, no spaces or brackets).
    pub name: String,
    /// The program on the host.
    pub host: PathBuf,
    /// The program's path in the boot archive (`bin/app`).
    pub guest: String,
    /// argv, argv\[0\] included.
    pub argv: Vec<String>,
    /// envp.
    pub env: Vec<String>,
    /// Working directory (`/` by default).
    pub cwd: Option<String>,
}

/// A run's programs and data files, checked and ready to pack.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AppSpec {
    /// The processes, in start order.
    pub processes: Vec<ProcessPlan>,
    /// Data files: (host path, archive path).
    pub files: Vec<(PathBuf, String)>,
    /// The manifest's `[net]`, if it has one.
    pub net: Option<NetSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TomlManifest {
    #[serde(default)]
    process: Vec<TomlProcess>,
    #[serde(default)]
    file: Vec<TomlFile>,
    net: Option<TomlNet>,
}

/// `[net]`: the appliance's network.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TomlNet {
    /// `false`: no network (`net=off`); default `true`.
    enabled: Option<bool>,
    /// `dhcp` (the default) or `ADDR/PREFIX`.
    address: Option<String>,
    /// The default gateway of a static address.
    gateway: Option<String>,
    /// Host forwards, `tcp|udp:HOSTPORT:GUESTPORT` (QEMU only).
    #[serde(default)]
    forward: Vec<String>,
}

/// An appliance's network settings (`[net]` in its manifest).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetSpec {
    /// Whether the appliance has a network.
    pub enabled: bool,
    /// The runtime's `net=` value (`dhcp`, `off`, `ADDR/PREFIX[,gw=GW]`),
    /// checked as the runtime parses it.
    pub runtime: String,
    /// The host forwards of `perch record` (`tcp:8080:80`), checked.
    pub forwards: Vec<String>,
}

impl NetSpec {
    /// The runtime command-line key: `net=...`.
    pub fn boot_arg(&self) -> String {
        format!("net={}", self.runtime)
    }

    fn from_toml(n: TomlNet) -> Result<NetSpec, String> {
        let enabled = n.enabled.unwrap_or(true);
        let runtime = match (enabled, n.address.as_deref(), n.gateway.as_deref()) {
            (false, None, None) => "off".to_string(),
            (false, _, _) => {
                return Err("[net] enabled = false takes no address or gateway".into());
            }
            (true, None | Some("dhcp"), None) => "dhcp".to_string(),
            (true, None | Some("dhcp"), Some(_)) => {
                return Err(
                    "[net] gateway needs a static address (DHCP hands out the gateway)".into(),
                );
            }
            (true, Some(a), gw) => {
                if !a.contains('/') {
                    return Err(format!(
                        "[net] address {a:?}: dhcp or ADDR/PREFIX (e.g. 10.0.2.20/24)"
                    ));
                }
                match gw {
                    Some(g) => format!("{a},gw={g}"),
                    None => a.to_string(),
                }
            }
        };
        kcore::cmdline::NetConfig::parse(&runtime)
            .map_err(|e| format!("[net] net={runtime}: {e}"))?;
        if !enabled && !n.forward.is_empty() {
            return Err("[net] enabled = false takes no forward".into());
        }
        let mut seen = Vec::new();
        for f in &n.forward {
            let p = crate::record_opts::Forward::parse(f).map_err(|e| format!("[net] {e}"))?;
            if seen
                .iter()
                .any(|o: &crate::record_opts::Forward| o.proto == p.proto && o.host == p.host)
            {
                return Err(format!(
                    "[net] forward {f:?}: {} host port {} is forwarded twice",
                    p.proto.name(),
                    p.host
                ));
            }
            seen.push(p);
        }
        Ok(NetSpec {
            enabled,
            runtime,
            forwards: n.forward,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TomlProcess {
    program: PathBuf,
    name: Option<String>,
    path: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    argv0: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TomlFile {
    host: PathBuf,
    guest: Option<String>,
}

/// The comm for a program file: its file name, cut to 15 bytes, with
/// anything the manifest refuses in a name replaced by `_`.
fn default_name(host: &Path) -> String {
    let base = host
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "prog".into());
    let name: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() && !matches!(c, '[' | ']' | '(' | ')') {
                c
            } else {
                '_'
            }
        })
        .take(15)
        .collect();
    if name.is_empty() { "prog".into() } else { name }
}

/// `path` as a relative archive path (leading `/` and `./` stripped).
fn guest_path(path: &str) -> String {
    crate::convert::archive_key(path).to_owned()
}

/// The archive path a program gets when none is given: `bin/<file name>`.
fn default_guest(host: &Path) -> String {
    format!(
        "bin/{}",
        host.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "prog".into())
    )
}

impl AppSpec {
    /// The run of `perch record [--file HOST[:GUEST]...] -- PROGRAM ARGS...`:
    /// the program as `bin/<file name>` with argv\[0\] as typed, the data
    /// files at GUEST (default: their file name, in `/`, the working
    /// directory).
    pub fn from_command_line(command: &[String], files: &[String]) -> Result<AppSpec, SpecError> {
        let Some((program, args)) = command.split_first() else {
            return Err(SpecError::Invalid("no program given after --".into()));
        };
        let host = PathBuf::from(program);
        let mut argv = vec![program.clone()];
        argv.extend(args.iter().cloned());
        let mut spec = AppSpec {
            processes: vec![ProcessPlan {
                name: default_name(&host),
                guest: default_guest(&host),
                host,
                argv,
                env: Vec::new(),
                cwd: None,
            }],
            files: Vec::new(),
            net: None,
        };
        for f in files {
            let (host, guest) = match f.split_once(':') {
                Some((h, g)) if !g.is_empty() => (PathBuf::from(h), guest_path(g)),
                _ => {
                    let host = PathBuf::from(f.strip_suffix(':').unwrap_or(f));
                    let guest = host
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .ok_or_else(|| SpecError::Invalid(format!("--file {f}: names no file")))?;
                    (host, guest)
                }
            };
            spec.files.push((host, guest));
        }
        spec.check()?;
        Ok(spec)
    }

    /// Reads an appliance manifest. Host paths in it are relative to the
    /// manifest's directory.
    pub fn from_manifest(path: &Path) -> Result<AppSpec, SpecError> {
        let text = std::fs::read_to_string(path).map_err(|source| SpecError::ManifestIo {
            path: path.to_owned(),
            source,
        })?;
        let m: TomlManifest = toml::from_str(&text).map_err(|e| SpecError::Manifest {
            path: path.to_owned(),
            message: e.to_string().trim_end().replace('\n', "\n  "),
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        let resolve = |p: &Path| -> PathBuf {
            if p.is_absolute() {
                p.to_owned()
            } else {
                base.join(p)
            }
        };
        if m.process.is_empty() {
            return Err(SpecError::Manifest {
                path: path.to_owned(),
                message: "no [[process]]: nothing to run".into(),
            });
        }
        let mut spec = AppSpec {
            net: m
                .net
                .map(NetSpec::from_toml)
                .transpose()
                .map_err(|message| SpecError::Manifest {
                    path: path.to_owned(),
                    message,
                })?,
            ..AppSpec::default()
        };
        for p in m.process {
            let host = resolve(&p.program);
            let guest = p
                .path
                .as_deref()
                .map(guest_path)
                .unwrap_or_else(|| default_guest(&p.program));
            let mut argv = vec![p.argv0.unwrap_or_else(|| format!("/{guest}"))];
            argv.extend(p.args);
            spec.processes.push(ProcessPlan {
                name: p.name.unwrap_or_else(|| default_name(&p.program)),
                host,
                guest,
                argv,
                env: p.env.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
                cwd: p.cwd,
            });
        }
        for f in m.file {
            let guest = match &f.guest {
                Some(g) => guest_path(g),
                None => f
                    .host
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .ok_or_else(|| SpecError::Manifest {
                        path: path.to_owned(),
                        message: format!("[[file]] host {} names no file", f.host.display()),
                    })?,
            };
            spec.files.push((resolve(&f.host), guest));
        }
        spec.check()?;
        Ok(spec)
    }

    /// The `[net]` of the manifest at `path`, or `None` when it has none
    /// or cannot be read (reading it as an [`AppSpec`] then says why).
    pub fn net_of_manifest(path: &Path) -> Option<NetSpec> {
        let text = std::fs::read_to_string(path).ok()?;
        let m: TomlManifest = toml::from_str(&text).ok()?;
        NetSpec::from_toml(m.net?).ok()
    }

    /// Names, counts and archive paths (programs are checked by
    /// [`validate`](Self::validate)).
    fn check(&self) -> Result<(), SpecError> {
        if self.processes.len() > MAX_PROCESSES {
            return Err(SpecError::Invalid(format!(
                "{} processes: the runtime runs at most {MAX_PROCESSES}",
                self.processes.len()
            )));
        }
        let mut guests: BTreeMap<&str, &Path> = BTreeMap::new();
        for p in &self.processes {
            if p.name.is_empty()
                || p.name.len() > 15
                || !p
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_graphic() && !matches!(b, b'[' | b']'))
            {
                return Err(SpecError::Invalid(format!(
                    "process name {:?}: 1 to 15 printable ASCII characters, no spaces or brackets",
                    p.name
                )));
            }
            match guests.insert(&p.guest, &p.host) {
                Some(other) if other != p.host => {
                    return Err(SpecError::Invalid(format!(
                        "archive path {} is given to two programs ({} and {}): give one a `path`",
                        p.guest,
                        other.display(),
                        p.host.display()
                    )));
                }
                _ => {}
            }
        }
        for (host, guest) in &self.files {
            if guests.insert(guest, host).is_some() {
                return Err(SpecError::Invalid(format!(
                    "archive path {guest} is given twice (data file {})",
                    host.display()
                )));
            }
        }
        Ok(())
    }

    /// Checks every program (readable; an ELF the runtime's loader accepts:
    /// x86-64 or i386, static, loadable segments inside the file) and every
    /// data file (readable), before anything boots.
    pub fn validate(&self) -> Result<(), SpecError> {
        for p in &self.processes {
            let bytes = std::fs::read(&p.host).map_err(|source| SpecError::ProgramIo {
                path: p.host.clone(),
                source,
            })?;
            kcore::elf::plan(&bytes).map_err(|e| SpecError::Program {
                path: p.host.clone(),
                why: match e {
                    kcore::elf::ElfError::NotElf => {
                        "not an ELF file (perch runs static x86-64 and i386 Linux executables)"
                            .into()
                    }
                    e => e.to_string(),
                },
            })?;
        }
        for (host, _) in &self.files {
            std::fs::File::open(host)
                .and_then(|f| f.metadata())
                .and_then(|m| {
                    if m.is_file() {
                        Ok(())
                    } else {
                        Err(std::io::Error::other("not a regular file"))
                    }
                })
                .map_err(|source| SpecError::FileIo {
                    path: host.clone(),
                    source,
                })?;
        }
        Ok(())
    }

    /// The boot archive: every program and data file and the manifest.
    pub fn appliance(&self) -> Appliance {
        let mut app = Appliance::new();
        let mut packed = std::collections::BTreeSet::new();
        for p in &self.processes {
            if packed.insert(p.guest.clone()) {
                app = app.file(&p.guest, p.host.as_path());
            }
        }
        for (host, guest) in &self.files {
            app = app.file(guest, host.as_path());
        }
        for p in &self.processes {
            let mut s = ProcessSpec::new(&p.name, &p.guest);
            s.argv = p.argv.iter().map(|a| a.as_bytes().to_vec()).collect();
            s.envp = p.env.iter().map(|e| e.as_bytes().to_vec()).collect();
            if let Some(c) = &p.cwd {
                s.cwd = c.clone();
            }
            app = app.process(s);
        }
        app
    }

    /// The host file of each program, by archive path (for
    /// [`ConvertOptions::programs`](crate::convert::ConvertOptions::programs)):
    /// the processes' programs, and every data file that is an ELF, which a
    /// process may execve.
    pub fn program_files(&self) -> BTreeMap<String, PathBuf> {
        let elves = self
            .files
            .iter()
            .filter(|(host, _)| is_elf(host))
            .map(|(host, guest)| (host, guest));
        self.processes
            .iter()
            .map(|p| (&p.host, &p.guest))
            .chain(elves)
            .map(|(host, guest)| {
                let abs = std::fs::canonicalize(host).unwrap_or_else(|_| host.clone());
                (guest.clone(), abs)
            })
            .collect()
    }

    /// The process names, in start order.
    pub fn names(&self) -> Vec<String> {
        self.processes.iter().map(|p| p.name.clone()).collect()
    }
}

/// Whether the file at `host` starts with the ELF magic.
fn is_elf(host: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(host)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| magic == *b"\x7fELF")
}

/// The NT_GNU_BUILD_ID of an ELF (what the runtime's loader sends in the
/// Task record), `None` when it has none or is not an x86 ELF.
pub fn build_id(elf: &[u8]) -> Option<Vec<u8>> {
    kcore::elf::build_id(elf).map(<[u8]>::to_vec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn a_manifest_gives_processes_and_files_relative_to_itself() {
        let dir = tempfile::tempdir().unwrap();
        let m = write(
            dir.path(),
            "app.toml",
            r#"
[[process]]
program = "out/app"
args = ["-n", "3"]
env = { LANG = "C" }

[[process]]
name = "second"
program = "/abs/app2"
path = "/opt/app2"
argv0 = "app2"
cwd = "/data"

[[file]]
host = "input.txt"
guest = "data/input.txt"
"#,
        );
        let s = AppSpec::from_manifest(&m).unwrap();
        assert_eq!(s.processes.len(), 2);
        let a = &s.processes[0];
        assert_eq!(a.name, "app");
        assert_eq!(a.host, dir.path().join("out/app"));
        assert_eq!(a.guest, "bin/app");
        assert_eq!(a.argv, ["/bin/app", "-n", "3"]);
        assert_eq!(a.env, ["LANG=C"]);
        let b = &s.processes[1];
        assert_eq!((b.name.as_str(), b.guest.as_str()), ("second", "opt/app2"));
        assert_eq!(b.host, Path::new("/abs/app2"));
        assert_eq!(b.argv, ["app2"]);
        assert_eq!(b.cwd.as_deref(), Some("/data"));
        assert_eq!(
            s.files,
            [(dir.path().join("input.txt"), "data/input.txt".to_string())]
        );
        let files = s.program_files();
        assert_eq!(files.get("opt/app2"), Some(&PathBuf::from("/abs/app2")));
    }

    fn net_of(dir: &Path, net: &str) -> Result<Option<NetSpec>, String> {
        let m = write(
            dir,
            "net.toml",
            &format!("[[process]]\nprogram = \"app\"\n{net}"),
        );
        AppSpec::from_manifest(&m)
            .map(|s| s.net)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_manifest_has_the_network_settings() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert_eq!(net_of(d, "").unwrap(), None);
        let n = net_of(d, "[net]\n").unwrap().unwrap();
        assert_eq!((n.enabled, n.boot_arg().as_str()), (true, "net=dhcp"));
        assert!(n.forwards.is_empty());
        let n = net_of(
            d,
            "[net]\naddress = \"10.0.2.20/24\"\ngateway = \"10.0.2.2\"\nforward = [\"tcp:8080:80\", \"udp:5353:53\"]\n",
        )
        .unwrap()
        .unwrap();
        assert_eq!(n.boot_arg(), "net=10.0.2.20/24,gw=10.0.2.2");
        assert_eq!(n.forwards, ["tcp:8080:80", "udp:5353:53"]);
        assert_eq!(
            AppSpec::net_of_manifest(&d.join("net.toml")),
            Some(n.clone())
        );
        let n = net_of(
            d,
            "[net]\naddress = \"dhcp\"\nforward = [\"tcp:8080:80\"]\n",
        )
        .unwrap()
        .unwrap();
        assert_eq!(n.boot_arg(), "net=dhcp");
        let n = net_of(d, "[net]\nenabled = false\n").unwrap().unwrap();
        assert_eq!((n.enabled, n.boot_arg().as_str()), (false, "net=off"));
        for (bad, why) in [
            ("address = \"10.0.2.20\"", "ADDR/PREFIX"),
            ("address = \"10.0.2.20/33\"", "net=10.0.2.20/33"),
            ("gateway = \"10.0.2.2\"", "gateway needs a static address"),
            (
                "address = \"10.0.2.20/24\"\ngateway = \"10.0.2\"",
                "gw=10.0.2",
            ),
            (
                "enabled = false\naddress = \"10.0.2.20/24\"",
                "takes no address",
            ),
            (
                "enabled = false\nforward = [\"tcp:1:2\"]",
                "takes no forward",
            ),
            ("forward = [\"tcp:1\"]", "two ports are needed"),
            ("forward = [\"tcp:1:2\", \"tcp:1:3\"]", "forwarded twice"),
            ("dns = \"1.1.1.1\"", "unknown field"),
        ] {
            let e = net_of(d, &format!("[net]\n{bad}\n")).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
            assert_eq!(AppSpec::net_of_manifest(&d.join("net.toml")), None);
        }
    }

    #[test]
    fn unknown_keys_and_missing_programs_are_refused_with_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let m = write(
            dir.path(),
            "a.toml",
            "[[process]]\nprogram = \"x\"\nargz = [\"1\"]\n",
        );
        let e = AppSpec::from_manifest(&m).unwrap_err().to_string();
        assert!(e.contains("argz"), "{e}");
        let m = write(dir.path(), "b.toml", "[[process]]\nname = \"x\"\n");
        let e = AppSpec::from_manifest(&m).unwrap_err().to_string();
        assert!(e.contains("program"), "{e}");
        let m = write(dir.path(), "c.toml", "[[file]]\nhost = \"x\"\n");
        let e = AppSpec::from_manifest(&m).unwrap_err().to_string();
        assert!(e.contains("no [[process]]"), "{e}");
        let e = AppSpec::from_manifest(&dir.path().join("none.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("none.toml"), "{e}");
    }

    #[test]
    fn the_command_line_gives_one_process_and_its_files() {
        let cmd: Vec<String> = ["./build/my prog[1]", "a", "b"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let files = ["in.txt".to_string(), "/tmp/x.dat:data/x.dat".to_string()];
        let s = AppSpec::from_command_line(&cmd, &files).unwrap();
        let p = &s.processes[0];
        assert_eq!(p.name, "my_prog_1_");
        assert_eq!(p.guest, "bin/my prog[1]");
        assert_eq!(p.argv, ["./build/my prog[1]", "a", "b"]);
        assert_eq!(
            s.files,
            [
                (PathBuf::from("in.txt"), "in.txt".to_string()),
                (PathBuf::from("/tmp/x.dat"), "data/x.dat".to_string())
            ]
        );
        let clash = ["a/in.txt".to_string(), "b/in.txt".to_string()];
        assert!(AppSpec::from_command_line(&cmd, &clash).is_err());
        assert!(AppSpec::from_command_line(&[], &[]).is_err());
    }

    /// A file given with the program (`--file`, `[[file]]`) that is an ELF
    /// is a program the processes may execve: its host file is known by
    /// its archive path, as the processes' programs are; other files are
    /// not programs.
    #[test]
    fn elf_data_files_are_programs_too() {
        let dir = tempfile::tempdir().unwrap();
        let app = dir.path().join("app");
        std::fs::write(&app, b"\x7fELF\x02\x01\x01 app").unwrap();
        let worker = dir.path().join("worker");
        std::fs::write(&worker, b"\x7fELF\x02\x01\x01 worker").unwrap();
        write(dir.path(), "in.txt", "text\n");
        write(dir.path(), "run.sh", "#!/bin/sh\n");
        write(dir.path(), "short", "\x7fE");
        let cmd = [app.display().to_string()];
        let files = [
            format!("{}:bin/worker", worker.display()),
            format!("{}:data/in.txt", dir.path().join("in.txt").display()),
            format!("{}:bin/run.sh", dir.path().join("run.sh").display()),
            format!("{}:short", dir.path().join("short").display()),
            format!("{}:gone", dir.path().join("gone").display()),
        ];
        let s = AppSpec::from_command_line(&cmd, &files).unwrap();
        let canon = |p: &Path| std::fs::canonicalize(p).unwrap();
        let programs = s.program_files();
        assert_eq!(
            programs.into_iter().collect::<Vec<_>>(),
            [
                ("bin/app".to_string(), canon(&app)),
                ("bin/worker".to_string(), canon(&worker)),
            ]
        );
    }

    #[test]
    fn validate_names_what_the_loader_refuses() {
        let dir = tempfile::tempdir().unwrap();
        let text = write(dir.path(), "script.sh", "#!/bin/sh\necho hi\n");
        let spec = |p: &Path| AppSpec::from_command_line(&[p.display().to_string()], &[]).unwrap();
        let e = spec(&text).validate().unwrap_err().to_string();
        assert!(e.contains("not an ELF"), "{e}");
        let e = spec(&dir.path().join("missing"))
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot read"), "{e}");
    }
}
