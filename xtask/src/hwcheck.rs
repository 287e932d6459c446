//! `cargo xtask hwcheck`: the prepared real-hardware PMU check. Boots the
//! runtime's PMU self-test under KVM with `-cpu host` when a KVM with a
//! virtual PMU is present; otherwise says why not and how to run the same
//! self-test on bare metal, and exits 0.

use anyhow::{Context, Result};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Hard limit for the KVM boot.
pub const TIMEOUT: Duration = Duration::from_secs(300);

/// Kernel command line of the check.
pub const CMDLINE: &str = "selftest pmu=auto";

/// What the host offers, gathered once so the decision is testable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostFacts {
    /// `/dev/kvm` exists.
    pub dev_kvm: bool,
    /// Opening `/dev/kvm` read-write failed with this message.
    pub open_error: Option<String>,
    /// Loaded KVM modules (`kvm_intel`, `kvm_amd`, `kvm_pvm`, ...).
    pub kvm_modules: Vec<String>,
    /// `kvm.enable_pmu` module parameter, when the kernel has it.
    pub enable_pmu: Option<bool>,
    /// The host kernel exposes a hardware PMU (`/sys/bus/event_source/devices/cpu*`).
    pub host_pmu_sysfs: bool,
    /// Host CPUID leaf 0xA version (Intel), or 1 when AMD's PerfCtrExtCore is set.
    pub host_cpuid_pmu: u8,
}

/// Decide whether a KVM guest with `-cpu host` gets a usable PMU; `Err` says why not.
pub fn assess(f: &HostFacts) -> Result<(), String> {
    if !f.dev_kvm {
        return Err("/dev/kvm does not exist (no KVM on this host)".into());
    }
    if let Some(e) = &f.open_error {
        return Err(format!("/dev/kvm cannot be opened: {e}"));
    }
    let has = |m: &str| f.kvm_modules.iter().any(|x| x == m);
    if has("kvm_pvm") && !has("kvm_intel") && !has("kvm_amd") {
        return Err("the KVM here is kvm_pvm, which cannot run this guest (sysretq raises #GP, compat mode raises #UD)".into());
    }
    if !has("kvm_intel") && !has("kvm_amd") {
        return Err("neither kvm_intel nor kvm_amd is loaded".into());
    }
    if f.enable_pmu == Some(false) {
        return Err("KVM's virtual PMU is disabled (kvm.enable_pmu=N)".into());
    }
    if f.host_cpuid_pmu == 0 {
        return Err(
            "the host CPU advertises no PMU in CPUID (it is itself a guest without a virtual PMU)"
                .into(),
        );
    }
    if !f.host_pmu_sysfs {
        return Err("the host kernel exposes no hardware PMU (/sys/bus/event_source/devices/cpu is missing)".into());
    }
    Ok(())
}

fn read_trim(p: &str) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

fn host_cpuid_pmu() -> u8 {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid_count;
        let v = __cpuid_count(0, 0);
        let amd = v.ebx == 0x6874_7541; // "Auth"
        if amd {
            let max = __cpuid_count(0x8000_0000, 0).eax;
            if max >= 0x8000_0001 && __cpuid_count(0x8000_0001, 0).ecx & (1 << 23) != 0 {
                return 1;
            }
            return 0;
        }
        if v.eax >= 0xA {
            return (__cpuid_count(0xA, 0).eax & 0xFF) as u8;
        }
        0
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}

/// Gather the facts from this host.
pub fn gather() -> HostFacts {
    let dev_kvm = Path::new("/dev/kvm").exists();
    let open_error = if dev_kvm {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .err()
            .map(|e| e.to_string())
    } else {
        None
    };
    let kvm_modules = ["kvm", "kvm_intel", "kvm_amd", "kvm_pvm"]
        .iter()
        .filter(|m| Path::new(&format!("/sys/module/{m}")).exists())
        .map(|m| m.to_string())
        .collect();
    let enable_pmu =
        read_trim("/sys/module/kvm/parameters/enable_pmu").map(|v| v == "Y" || v == "1");
    let host_pmu_sysfs = ["cpu", "cpu_core", "cpu_atom"]
        .iter()
        .any(|d| Path::new(&format!("/sys/bus/event_source/devices/{d}")).exists());
    HostFacts {
        dev_kvm,
        open_error,
        kvm_modules,
        enable_pmu,
        host_pmu_sysfs,
        host_cpuid_pmu: host_cpuid_pmu(),
    }
}

const BARE_METAL: &str = "\
To run the same check on bare metal:
  1. cargo xtask image --cmdline \"selftest pmu=auto\"   (writes out/perch.iso)
  2. write it to a USB stick: dd if=out/perch.iso of=/dev/sdX bs=4M conv=fsync
  3. boot it (BIOS or UEFI) with a serial console on COM1 at 115200 8N1
  4. the self-test prints the PMU detection, the counter and overflow checks,
     PEBS/LBR decoding results and a final 'N passed, M failed' line.";

/// Run the check. Always returns exit code 0 unless the KVM run itself fails.
pub fn run() -> Result<i32> {
    let facts = gather();
    println!(
        "hwcheck: /dev/kvm: {}",
        if facts.dev_kvm { "present" } else { "absent" }
    );
    println!(
        "hwcheck: KVM modules: {}",
        if facts.kvm_modules.is_empty() {
            "none".into()
        } else {
            facts.kvm_modules.join(", ")
        }
    );
    println!("hwcheck: host CPUID PMU version: {}", facts.host_cpuid_pmu);
    if let Err(why) = assess(&facts) {
        println!("hwcheck: no usable KVM with a virtual PMU: {why}");
        println!("{BARE_METAL}");
        return Ok(0);
    }
    let elf = crate::kernel::build()?;
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args([
        "-enable-kvm",
        "-cpu",
        "host",
        "-machine",
        "pc",
        "-m",
        "256M",
        "-nodefaults",
        "-no-reboot",
    ])
    .args(["-display", "none", "-serial", "stdio"])
    .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=0x04"])
    .arg("-kernel")
    .arg(&elf)
    .args(["-append", CMDLINE])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    println!(
        "hwcheck: booting {} under KVM (-cpu host), timeout {} s",
        elf.display(),
        TIMEOUT.as_secs()
    );
    let mut child = cmd.spawn().context("starting qemu-system-x86_64")?;
    let stdout = child.stdout.take().context("QEMU stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let start = Instant::now();
    let mut lines = Vec::new();
    let mut timed_out = false;
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(l) => {
                println!("{l}");
                lines.push(l);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if start.elapsed() > TIMEOUT {
            timed_out = true;
            let _ = child.kill();
            break;
        }
    }
    let status = child.wait().ok().and_then(|s| s.code());
    println!("hwcheck: summary");
    for l in lines
        .iter()
        .filter(|l| l.to_ascii_lowercase().contains("pmu") || l.contains(" passed, "))
    {
        println!("  {l}");
    }
    if timed_out {
        println!("hwcheck: QEMU killed after {} s", TIMEOUT.as_secs());
        return Ok(1);
    }
    println!("hwcheck: QEMU exit status {status:?}");
    Ok(if status == Some(33) { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usable() -> HostFacts {
        HostFacts {
            dev_kvm: true,
            open_error: None,
            kvm_modules: vec!["kvm".into(), "kvm_intel".into()],
            enable_pmu: Some(true),
            host_pmu_sysfs: true,
            host_cpuid_pmu: 5,
        }
    }

    #[test]
    fn a_full_kvm_with_pmu_is_usable() {
        assert_eq!(assess(&usable()), Ok(()));
    }

    #[test]
    fn each_missing_piece_is_named() {
        type Change = fn(&mut HostFacts);
        let cases: [(Change, &str); 6] = [
            (|f| f.dev_kvm = false, "/dev/kvm does not exist"),
            (
                |f| f.open_error = Some("Permission denied".into()),
                "Permission denied",
            ),
            (
                |f| f.kvm_modules = vec!["kvm".into(), "kvm_pvm".into()],
                "kvm_pvm",
            ),
            (|f| f.enable_pmu = Some(false), "enable_pmu=N"),
            (|f| f.host_cpuid_pmu = 0, "advertises no PMU"),
            (|f| f.host_pmu_sysfs = false, "devices/cpu is missing"),
        ];
        for (change, needle) in cases {
            let mut f = usable();
            change(&mut f);
            let e = assess(&f).unwrap_err();
            assert!(e.contains(needle), "{e}");
        }
    }
}
