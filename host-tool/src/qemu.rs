//! Running the appliance under QEMU: PVH boot with `-kernel`, the wire
//! stream on a unix-socket chardev that waits for perch (so no byte is lost
//! before the reader attaches), stdin closed, a hard timeout, and a guard
//! that kills QEMU if perch stops first.
//!
//! The socket is a virtio console's (`virtio-serial-pci` + `virtconsole`,
//! the default: QEMU writes a page per host write) or COM1's
//! (`--transport uart`: one host write per byte, as a real 16550 sends).
//! With virtio, COM1 goes to a file ([`Qemu::com1_text`]): the runtime's
//! text before the stream moved to the console, and a crash's last words.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::HostError;
use crate::record_opts::Network;
pub use crate::record_opts::Transport;

/// isa-debug-exit status for a normal end of run.
pub const EXIT_PASS: i32 = 33;
/// isa-debug-exit status for a failure the runtime reported.
pub const EXIT_FAIL: i32 = 35;
/// isa-debug-exit status for a runtime crash.
pub const EXIT_CRASH: i32 = 37;

/// How to start the appliance.
#[derive(Clone, Debug)]
pub struct QemuConfig {
    /// The QEMU binary.
    pub qemu: PathBuf,
    /// The runtime ELF (PVH).
    pub image: PathBuf,
    /// The runtime command line (`-append`).
    pub append: String,
    /// Add `-icount shift=0,sleep=off`.
    pub icount: bool,
    /// The boot archive, passed as `-initrd` (the PVH module).
    pub initrd: Option<PathBuf>,
    /// Guest RAM (`-m`): 128M without programs, 1G for programs (they use
    /// more than 64 MiB of heap).
    pub memory: String,
    /// `--cpus`: the machine's CPUs (`-smp`); `None`: QEMU's default (one).
    pub cpus: Option<u32>,
    /// Extra QEMU arguments (`--qemu-arg`), last.
    pub extra: Vec<String>,
    /// The device the socket is attached to.
    pub transport: Transport,
    /// `--line-baud`: read the stream as slowly as a serial line at this
    /// baud (10 bits a byte) through a FIFO shrunk to one page, so the
    /// guest's device backs up as it would on that line.
    pub line_baud: Option<u32>,
    /// `--net`: QEMU's user networking on a virtio-net card (never the
    /// stream's device).
    pub net: Option<Network>,
}

/// The `-netdev` id of `--net`'s user network.
const NET_ID: &str = "perch-net";

impl QemuConfig {
    /// The full argument list, with the wire chardev at `socket` (and,
    /// with virtio, COM1 written to `com1`).
    pub fn args(&self, socket: &Path, com1: &Path) -> Vec<String> {
        let mut a: Vec<String> = [
            "-nodefaults",
            "-no-reboot",
            "-display",
            "none",
            "-machine",
            "pc",
            "-device",
            "isa-debug-exit,iobase=0xf4,iosize=0x04",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        a.push("-m".into());
        a.push(self.memory.clone());
        if let Some(n) = self.cpus {
            a.push("-smp".into());
            a.push(n.to_string());
        }
        a.push("-chardev".into());
        if self.line_baud.is_some() {
            // `socket` names the FIFOs `socket.in` and `socket.out`.
            a.push(format!("pipe,id=wire,path={}", socket.display()));
        } else {
            a.push(format!(
                "socket,id=wire,path={},server=on,wait=on",
                socket.display()
            ));
        }
        match self.transport {
            Transport::Virtio => {
                a.extend(
                    [
                        "-device",
                        "virtio-serial-pci,id=perch-vser",
                        "-device",
                        "virtconsole,chardev=wire,bus=perch-vser.0",
                        "-serial",
                    ]
                    .map(String::from),
                );
                a.push(format!("file:{}", com1.display()));
            }
            Transport::Uart => {
                a.push("-serial".into());
                a.push("chardev:wire".into());
            }
        }
        a.push("-kernel".into());
        a.push(self.image.display().to_string());
        a.push("-append".into());
        a.push(self.append.clone());
        if let Some(i) = &self.initrd {
            a.push("-initrd".into());
            a.push(i.display().to_string());
        }
        if let Some(net) = &self.net {
            a.push("-netdev".into());
            a.push(net.netdev(NET_ID));
            // `microvm` (through --qemu-arg) has virtio-mmio, not PCI.
            let microvm = self.extra.iter().any(|e| e.contains("microvm"));
            let card = if microvm {
                "virtio-net-device"
            } else {
                "virtio-net-pci"
            };
            a.push("-device".into());
            a.push(format!("{card},netdev={NET_ID}"));
        }
        if self.icount {
            a.push("-icount".into());
            a.push("shift=0,sleep=off".into());
        }
        a.extend(self.extra.iter().cloned());
        a
    }
}

/// A running QEMU; killed when dropped.
pub struct Qemu {
    child: Child,
    stderr: Option<JoinHandle<String>>,
    _dir: tempfile::TempDir,
}

/// Checks that `qemu` can be run.
pub fn check_qemu(qemu: &Path) -> Result<(), HostError> {
    match Command::new(qemu)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
    {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(HostError::BadTool(format!(
            "{} is not a working QEMU: `{} --version` exited with {}{}; pass the \
             qemu-system-x86_64 binary with --qemu (apt-get install qemu-system-x86)",
            qemu.display(),
            qemu.display(),
            o.status,
            match String::from_utf8_lossy(&o.stderr).trim() {
                "" => String::new(),
                err => format!(" ({err})"),
            }
        ))),
        Err(e) => Err(match unusable(qemu, &e) {
            Some(what) => HostError::BadTool(format!(
                "--qemu {}: {what}, so it cannot be run as QEMU; pass the \
                 qemu-system-x86_64 binary with --qemu (apt-get install qemu-system-x86)",
                qemu.display()
            )),
            None => HostError::MissingTool {
                tool: qemu.display().to_string(),
                reason: e.to_string(),
                install: "apt-get install qemu-system-x86".into(),
            },
        }),
    }
}

/// What `path` is when it exists but could not be started (`err`): a
/// directory, a file without execute permission, or one the kernel does
/// not run. `None` when it is simply not there.
fn unusable(path: &Path, err: &std::io::Error) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    // A bare name is looked up in PATH, not here.
    if err.kind() == std::io::ErrorKind::NotFound || path.components().count() < 2 {
        return None;
    }
    let meta = std::fs::metadata(path).ok()?;
    Some(if meta.is_dir() {
        "is a directory, not a program".into()
    } else if !meta.is_file() {
        "is not a regular file".into()
    } else if meta.permissions().mode() & 0o111 == 0 {
        format!(
            "is a file without execute permission (mode {:o})",
            meta.permissions().mode() & 0o7777
        )
    } else {
        format!("is a file the system cannot run ({err})")
    })
}

impl Qemu {
    /// Starts QEMU and connects to its wire socket, waiting at most
    /// `within` for QEMU to open it (the run's `--timeout`).
    pub fn spawn(
        cfg: &QemuConfig,
        within: Duration,
    ) -> Result<(Qemu, Box<dyn Read + Send>), HostError> {
        check_qemu(&cfg.qemu)?;
        let dir = tempfile::Builder::new()
            .prefix("perch-")
            .tempdir()
            .map_err(|e| HostError::io("creating a socket directory", e))?;
        let socket = dir.path().join("wire.sock");
        if cfg.line_baud.is_some() {
            for end in ["in", "out"] {
                nix::unistd::mkfifo(
                    &socket.with_extension(format!("sock.{end}")),
                    nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
                )
                .map_err(|e| HostError::io("creating the stream's FIFOs", e.into()))?;
            }
        }
        let com1 = dir.path().join("com1.txt");
        let mut child = Command::new(&cfg.qemu)
            .args(cfg.args(&socket, &com1))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| HostError::io(format!("starting {}", cfg.qemu.display()), e))?;
        let stderr = child.stderr.take().map(|mut s| {
            std::thread::spawn(move || {
                let mut text = String::new();
                let _ = s.read_to_string(&mut text);
                text
            })
        });
        let mut q = Qemu {
            child,
            stderr,
            _dir: dir,
        };
        if let Some(baud) = cfg.line_baud {
            // Opening the FIFO waits for QEMU to open its end.
            let out = std::fs::File::open(socket.with_extension("sock.out"))
                .map_err(|e| HostError::io("opening the stream's FIFO", e))?;
            // One page: what the line has not taken stays in the guest.
            let _ = nix::fcntl::fcntl(&out, nix::fcntl::FcntlArg::F_SETPIPE_SZ(4096));
            return Ok((q, Box::new(SlowLine::new(out, u64::from(baud) / 10))));
        }
        let start = Instant::now();
        loop {
            if let Ok(stream) = UnixStream::connect(&socket) {
                stream
                    .set_read_timeout(Some(Duration::from_millis(100)))
                    .map_err(|e| HostError::io("configuring the wire socket", e))?;
                return Ok((q, Box::new(stream)));
            }
            if let Ok(Some(status)) = q.child.try_wait() {
                let err = q.take_stderr();
                return Err(HostError::Appliance(format!(
                    "QEMU exited ({status}) before the wire socket opened: {}",
                    err.trim()
                )));
            }
            if start.elapsed() > within {
                return Err(HostError::Appliance(format!(
                    "QEMU did not open its wire socket within {} s (the time limit, --timeout)",
                    within.as_secs_f64()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// What the runtime wrote on COM1 as text while the stream was on the
    /// virtio console (its early boot, a crash's last words); empty with
    /// `--transport uart`.
    pub fn com1_text(&self) -> String {
        std::fs::read(self._dir.path().join("com1.txt"))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// QEMU's stderr so far (after it exited).
    pub fn take_stderr(&mut self) -> String {
        self.stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }

    /// Waits up to `timeout` for QEMU to exit; kills it after that.
    /// Returns the exit status, or None when it had to be killed.
    pub fn wait(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        loop {
            match self.child.try_wait() {
                Ok(Some(st)) => return Some(st),
                Ok(None) if start.elapsed() < timeout => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return None;
                }
            }
        }
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A reader that takes at most `rate` bytes a second from `inner`: a
/// serial line's pace (`--line-baud`).
pub struct SlowLine<R> {
    inner: R,
    rate: u64,
    start: Instant,
    taken: u64,
}

impl<R: Read> SlowLine<R> {
    /// `inner` read at `rate` bytes a second.
    pub fn new(inner: R, rate: u64) -> Self {
        SlowLine {
            inner,
            rate: rate.max(1),
            start: Instant::now(),
            taken: 0,
        }
    }
}

impl<R: Read> Read for SlowLine<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // Bytes the line could have carried by now, a few at least.
        let want = (buf.len() as u64).min(16.max(self.rate / 100));
        loop {
            let due = (self.start.elapsed().as_secs_f64() * self.rate as f64) as u64;
            if due >= self.taken + want {
                break;
            }
            let wait = (self.taken + want - due) as f64 / self.rate as f64;
            std::thread::sleep(Duration::from_secs_f64(wait.min(0.05)));
        }
        let n = self.inner.read(&mut buf[..want as usize])?;
        self.taken += n as u64;
        Ok(n)
    }
}

/// What an exit status means for a run.
pub fn describe_exit(status: Option<ExitStatus>) -> Result<&'static str, String> {
    match status.and_then(|s| s.code()) {
        Some(EXIT_PASS) => Ok("appliance ended normally"),
        Some(EXIT_FAIL) => Err("the appliance reported a failure (exit status 35)".into()),
        Some(EXIT_CRASH) => Err("the runtime crashed (exit status 37)".into()),
        Some(0) => Err("QEMU exited with status 0: a triple fault reset the appliance".into()),
        Some(c) => Err(format!("QEMU exited with unexpected status {c}")),
        None if status.is_some() => Err("QEMU was killed by a signal".into()),
        None => Ok("QEMU stopped by perch"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record_opts::{Forward, Proto};

    fn config(net: Option<Network>, extra: &[&str]) -> QemuConfig {
        QemuConfig {
            qemu: "qemu-system-x86_64".into(),
            image: "rt".into(),
            append: String::new(),
            icount: false,
            initrd: None,
            memory: "128M".into(),
            cpus: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            transport: Transport::Virtio,
            line_baud: None,
            net,
        }
    }

    #[test]
    fn net_adds_a_user_network_on_a_virtio_net_card() {
        let args = |c: &QemuConfig| c.args(Path::new("s"), Path::new("c")).join(" ");
        let plain = args(&config(None, &[]));
        assert!(!plain.contains("netdev"), "{plain}");
        let net = Network {
            forwards: vec![Forward {
                proto: Proto::Tcp,
                host: 8080,
                guest: 80,
            }],
            guest: None,
        };
        let pc = args(&config(Some(net.clone()), &[]));
        assert!(
            pc.contains(
                "-netdev user,id=perch-net,hostfwd=tcp:127.0.0.1:8080-:80 \
                 -device virtio-net-pci,netdev=perch-net"
            ),
            "{pc}"
        );
        // The stream keeps its own device.
        assert!(pc.contains("virtconsole,chardev=wire"), "{pc}");
        let micro = args(&config(Some(net), &["-machine", "microvm"]));
        assert!(
            micro.contains("-device virtio-net-device,netdev=perch-net"),
            "{micro}"
        );
    }

    #[test]
    fn cpus_gives_the_machine_that_many_cpus_beside_its_memory() {
        let args = |c: &QemuConfig| c.args(Path::new("s"), Path::new("c"));
        let plain = args(&config(None, &[]));
        assert!(!plain.iter().any(|a| a == "-smp"), "{plain:?}");
        let four = args(&QemuConfig {
            cpus: Some(4),
            ..config(None, &[])
        });
        let m = four.iter().position(|a| a == "-m").unwrap();
        assert_eq!(four[m..m + 4], ["-m", "128M", "-smp", "4"], "{four:?}");
        assert_eq!(four.iter().filter(|a| *a == "-smp").count(), 1, "{four:?}");
    }
}
