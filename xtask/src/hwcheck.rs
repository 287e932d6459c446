//! `cargo xtask hwcheck`: the prepared real-hardware PMU check. When a KVM
//! with a virtual PMU is present it runs two checks with `-cpu host`:
//!
//! 1. the runtime's self-test, summarising its `pmu_hardware` test (the
//!    start-up check: counters advance, overflow NMIs near the programmed
//!    period; sampling; PEBS and LBR records decode when present);
//! 2. the demo appliance on [`SMP_CPUS`] CPUs with `pmu=auto`, where every
//!    CPU must program its own PMU and take PMIs: the runtime's per-CPU
//!    counter lines must show samples taken on each CPU ([`smp_verdict`]).
//!
//! Otherwise it says why not and how to run the same self-test on bare
//! metal, and exits 0.

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

/// The host's display model when it is an Intel family 6 CPU.
fn host_intel_model() -> Option<u8> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid_count;
        let v = __cpuid_count(0, 0);
        if v.ebx != 0x756E_6547 || v.eax < 1 {
            return None; // not "Genu"ineIntel
        }
        let a = __cpuid_count(1, 0).eax;
        let family = (a >> 8) & 0xF;
        let model = ((a >> 4) & 0xF) | ((a >> 12) & 0xF0);
        (family == 6).then_some(model as u8)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
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
     PEBS/LBR decoding results ('selftest: pmu_hardware: ...' lines) and a
     final 'N passed, M failed' line.";

/// Prefix of the `pmu_hardware` self-test's detail lines.
pub const DETAIL_PREFIX: &str = "selftest: pmu_hardware: ";

/// How the `pmu_hardware` self-test ended, from the runtime's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// `selftest: pmu_hardware ... ok` after real checks.
    Passed,
    /// The guest saw no PMU (`selftest: pmu_hardware: skipped (...)`).
    Skipped(String),
    /// `selftest: pmu_hardware ... FAILED (why)`.
    Failed(String),
    /// The test never reported (crash, timeout, an older runtime).
    Missing,
}

/// What the check found in the runtime's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The `pmu_hardware` outcome.
    pub outcome: Outcome,
    /// Its detail lines (PMU, counting, overflow, sampling, LBR, PEBS), without the prefix.
    pub details: Vec<String>,
    /// The runtime's boot lines about the PMU (`perch: ...PMU...`).
    pub boot: Vec<String>,
    /// The final `N passed, M failed` line.
    pub totals: Option<String>,
}

/// Reads the `pmu_hardware` result out of the self-test's output.
pub fn summarize(lines: &[String]) -> Summary {
    let mut s = Summary {
        outcome: Outcome::Missing,
        details: Vec::new(),
        boot: Vec::new(),
        totals: None,
    };
    for l in lines {
        let l = l.trim_end();
        if let Some(d) = l.strip_prefix(DETAIL_PREFIX) {
            if let Some(why) = d.strip_prefix("skipped (") {
                s.outcome = Outcome::Skipped(why.strip_suffix(')').unwrap_or(why).to_string());
            }
            s.details.push(d.to_string());
        } else if l == "selftest: pmu_hardware ... ok" {
            if s.outcome == Outcome::Missing {
                s.outcome = Outcome::Passed;
            }
        } else if let Some(why) = l.strip_prefix("selftest: pmu_hardware ... FAILED (") {
            s.outcome = Outcome::Failed(why.strip_suffix(')').unwrap_or(why).to_string());
        } else if l.starts_with("perch: ") && l.contains("PMU") {
            s.boot.push(l.to_string());
        } else if l.contains(" passed, ") && l.ends_with(" failed") {
            s.totals = Some(l.to_string());
        }
    }
    s
}

/// Exit code of the check: 0 only when the PMU was really exercised and
/// every self-test passed (QEMU status 33).
pub fn verdict(s: &Summary, qemu_status: Option<i32>) -> (i32, String) {
    match &s.outcome {
        Outcome::Passed if qemu_status == Some(33) => (
            0,
            "the PMU works: counters advance, overflow NMIs arrive near the period".into(),
        ),
        Outcome::Passed => (
            1,
            format!("pmu_hardware passed, but the self-test did not (QEMU status {qemu_status:?})"),
        ),
        Outcome::Skipped(why) => (
            1,
            format!(
                "the guest saw no PMU ({why}), although the host offers one: check `-cpu host` and kvm.enable_pmu"
            ),
        ),
        Outcome::Failed(why) => (1, format!("the PMU check failed: {why}")),
        Outcome::Missing => (
            1,
            format!("pmu_hardware never reported (QEMU status {qemu_status:?})"),
        ),
    }
}

/// CPUs of the appliance run.
pub const SMP_CPUS: u32 = 4;

/// Reads the appliance run on [`SMP_CPUS`] CPUs out of perch's stderr (the
/// target's log): the hardware PMU must be the overflow source, no CPU may
/// report its PMU unprogrammed, and each CPU's counter line
/// (`perch: CPU N: taken T = delivered D + lost L`) must show samples
/// taken. `Ok` names each CPU's count; `Err` says what is missing.
pub fn smp_verdict(lines: &[String]) -> Result<String, String> {
    let source = lines
        .iter()
        .find_map(|l| l.split("perch: overflow source: ").nth(1));
    match source {
        Some(s) if s.contains(" PMU (") => {}
        Some(s) => return Err(format!("the overflow source was not the PMU: {s}")),
        None => return Err("the runtime named no overflow source".into()),
    }
    if let Some(l) = lines.iter().find(|l| l.contains("PMU not programmed")) {
        return Err(format!("a CPU did not program its PMU: {}", l.trim()));
    }
    let mut taken = vec![None; SMP_CPUS as usize];
    for l in lines {
        let Some(rest) = l.split("perch: CPU ").nth(1) else {
            continue;
        };
        let Some((cpu, counts)) = rest.split_once(": taken ") else {
            continue;
        };
        let (Ok(cpu), Some(Ok(n))) = (
            cpu.parse::<usize>(),
            counts.split_whitespace().next().map(str::parse::<u64>),
        ) else {
            continue;
        };
        if let Some(t) = taken.get_mut(cpu) {
            *t = Some(n);
        }
    }
    let mut named = Vec::new();
    for (cpu, t) in taken.iter().enumerate() {
        match t {
            None => return Err(format!("no counter line for CPU {cpu}")),
            Some(0) => return Err(format!("CPU {cpu} took no PMU samples")),
            Some(n) => named.push(format!("CPU {cpu} {n}")),
        }
    }
    Ok(format!(
        "every CPU sampled with its own PMU: {}",
        named.join(", ")
    ))
}

/// The appliance run: `perch record` of the demo appliance under KVM on
/// [`SMP_CPUS`] CPUs; the exit code and what [`smp_verdict`] said.
fn run_smp(elf: &Path) -> Result<(i32, String)> {
    let perch = crate::kernel::build_perch()?;
    let manifest = crate::kernel::demo_manifest()?;
    let out = crate::project_root().join("out");
    std::fs::create_dir_all(&out)?;
    let data = out.join("hwcheck-smp.data");
    let mut cmd = Command::new(&perch);
    cmd.arg("record")
        .arg("--image")
        .arg(elf)
        .args(["--cpus", &SMP_CPUS.to_string(), "--pmu", "auto"])
        .args(["--duration", "3", "--timeout", "120"])
        .args(["--qemu-arg", "-enable-kvm", "--qemu-arg", "-cpu"])
        .args(["--qemu-arg", "host", "-o"])
        .arg(&data)
        .arg("--appliance")
        .arg(&manifest)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    println!("hwcheck: {cmd:?}");
    let o = cmd.output().context("running perch record")?;
    let err = String::from_utf8_lossy(&o.stderr);
    for l in err.lines() {
        println!("  {l}");
    }
    if !o.status.success() {
        return Ok((1, format!("perch record failed ({})", o.status)));
    }
    let lines: Vec<String> = err.lines().map(str::to_string).collect();
    Ok(match smp_verdict(&lines) {
        Ok(what) => (0, what),
        Err(why) => (1, why),
    })
}

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
    match host_intel_model() {
        Some(m) => match arch_x86::pmu::models::intel_row(m) {
            Some(row) => println!("hwcheck: model {m:#04x} in the PMU model table: {row}"),
            None => println!(
                "hwcheck: model {m:#04x} is not in the PMU model table: {}",
                arch_x86::pmu::models::UNKNOWN_MODEL
            ),
        },
        None => println!("hwcheck: not an Intel family 6 CPU: no PMU model-table row"),
    }
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
    let summary = summarize(&lines);
    println!("hwcheck: summary");
    for l in &summary.boot {
        println!("  {l}");
    }
    for l in &summary.details {
        println!("  pmu_hardware: {l}");
    }
    if let Some(t) = &summary.totals {
        println!("  self-test: {t}");
    }
    if timed_out {
        println!("hwcheck: QEMU killed after {} s", TIMEOUT.as_secs());
        return Ok(1);
    }
    println!("hwcheck: QEMU exit status {status:?}");
    let (code, what) = verdict(&summary, status);
    println!("hwcheck: {what}");
    if code != 0 {
        return Ok(code);
    }
    let (code, what) = run_smp(&elf)?;
    println!("hwcheck: on {SMP_CPUS} CPUs: {what}");
    Ok(code)
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

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_string).collect()
    }

    #[test]
    fn a_real_pmu_run_is_summarised() {
        let out = lines(
            "perch: PMU found (Intel v5, 8 GP + 4 fixed counters); the self-test checks it in pmu_hardware; overflow source for the other tests: NMI clock
selftest: pmu_detection_and_fallback ... ok
selftest: pmu_hardware: PMU Intel v5, 8 GP x 48 bits, 4 fixed x 48 bits, PEBS format Some(5), LBR Some(63) x 32
selftest: pmu_hardware: counting: 10000012 instructions counted over a workload of 10000000
selftest: pmu_hardware: overflow: period 100000: 100 PMIs, expected about 100
selftest: pmu_hardware ... ok
28 passed, 0 failed",
        );
        let s = summarize(&out);
        assert_eq!(s.outcome, Outcome::Passed);
        assert_eq!(s.details.len(), 3);
        assert!(s.details[1].starts_with("counting: 10000012"));
        assert_eq!(s.boot.len(), 1);
        assert_eq!(s.totals.as_deref(), Some("28 passed, 0 failed"));
        assert_eq!(verdict(&s, Some(33)).0, 0);
        assert_eq!(verdict(&s, Some(35)).0, 1);
    }

    #[test]
    fn skipped_failed_and_missing_are_not_a_pass() {
        let s = summarize(&lines(
            "selftest: pmu_hardware: skipped (no PMU: CPUID leaf 0xA reports no architectural perfmon)
selftest: pmu_hardware ... ok
28 passed, 0 failed",
        ));
        assert_eq!(
            s.outcome,
            Outcome::Skipped("no PMU: CPUID leaf 0xA reports no architectural perfmon".into())
        );
        let (code, what) = verdict(&s, Some(33));
        assert_eq!(code, 1);
        assert!(what.contains("guest saw no PMU"), "{what}");
        let s = summarize(&lines(
            "selftest: pmu_hardware: overflow: period 100000: 0 PMIs, expected about 100
selftest: pmu_hardware ... FAILED (start-up check: PMU overflow NMIs do not arrive)
27 passed, 1 failed",
        ));
        assert_eq!(
            s.outcome,
            Outcome::Failed("start-up check: PMU overflow NMIs do not arrive".into())
        );
        assert_eq!(verdict(&s, Some(35)).0, 1);
        let s = summarize(&lines("perch: runtime booted via pvh"));
        assert_eq!(s.outcome, Outcome::Missing);
        assert_eq!(verdict(&s, None).0, 1);
    }

    /// The appliance run's lines, as the runtime and perch print them.
    fn smp_run(taken: [u64; 4]) -> Vec<String> {
        let mut out = lines(
            "target: INFO perch: PMU start-up check: 10000003 instructions counted over a workload of 10000000; overflow phase at period 100000: 100 PMIs (expected about 100)
target: INFO perch: overflow source: Intel PMU (v5, 8 GP x 48 bits + 4 fixed counters); event cycles; PEBS format 5; LBR branch stacks x 32; the NMI clock is not started",
        );
        for (cpu, t) in taken.iter().enumerate() {
            out.push(format!(
                "target: INFO perch: CPU {cpu}: taken {t} = delivered {t} + lost 0"
            ));
        }
        out.push("perch: target counters: taken 1 = delivered 1 + lost 0; the stream holds 1 samples + 0 lost".into());
        out
    }

    #[test]
    fn every_cpu_must_take_pmu_samples() {
        let ok = smp_verdict(&smp_run([4000, 3900, 4100, 3990])).expect("a pass");
        assert!(
            ok.contains("CPU 0 4000") && ok.contains("CPU 3 3990"),
            "{ok}"
        );
        let e = smp_verdict(&smp_run([4000, 0, 4100, 3990])).unwrap_err();
        assert!(e.contains("CPU 1 took no PMU samples"), "{e}");
        let mut three = smp_run([1, 2, 3, 4]);
        three.retain(|l| !l.contains("perch: CPU 2:"));
        let e = smp_verdict(&three).unwrap_err();
        assert!(e.contains("no counter line for CPU 2"), "{e}");
        let mut refused = smp_run([1, 2, 3, 4]);
        refused.push(
            "target: INFO perch: CPU 3: PMU not programmed: the PMU differs; no PMU samples from it"
                .into(),
        );
        let e = smp_verdict(&refused).unwrap_err();
        assert!(e.contains("CPU 3: PMU not programmed"), "{e}");
        let mut clock = smp_run([1, 2, 3, 4]);
        clock[1] = "target: INFO perch: overflow source: NMI clock (cpu-clock)".into();
        let e = smp_verdict(&clock).unwrap_err();
        assert!(e.contains("not the PMU"), "{e}");
        clock.remove(1);
        let e = smp_verdict(&clock).unwrap_err();
        assert!(e.contains("no overflow source"), "{e}");
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
