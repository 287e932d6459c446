//! Synthetic recordings shared by the integration tests: a stream over the
//! fixture image with a 64-bit task (three hot functions in a 5:3:2 split),
//! a compat task and runtime samples taken inside a syscall.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use host_tool::convert::{ConvertOptions, ConvertSummary, Converter};
use host_tool::image::Image;
use host_tool::model::{
    CpuPlace, EndCounters, EventInfo, EventKind, EventSource, Hello, Item, SampleView, TaskInfo,
    TaskOrigin,
};
use host_tool::perf_abi::{context, reg, sample};

/// The fixture image.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Address of a symbol in the fixture image.
pub fn sym(image: &Image, name: &str) -> u64 {
    image
        .symbols
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no {name}"))
        .addr
}

/// Sample type of the demo event.
pub const DEMO_SAMPLE_TYPE: u64 = sample::IP
    | sample::TID
    | sample::TIME
    | sample::CPU
    | sample::PERIOD
    | sample::CALLCHAIN
    | sample::REGS_USER
    | sample::REGS_INTR;

/// The demo Hello: one cpu-clock event on the NMI clock.
pub fn hello(image: &Image) -> Hello {
    Hello {
        protocol_version: 1,
        build_id: image.build_id.clone().unwrap(),
        cpus: 1,
        places: vec![CpuPlace::default()],
        source: EventSource::NmiClock,
        cpu_desc: "QEMU TCG x86_64".into(),
        cmdline: "freq=1000 console=wire".into(),
        events: vec![EventInfo {
            id: 0,
            kind: EventKind::CpuClock,
            config: 0,
            period_or_freq: 1000,
            freq: true,
            sample_type: DEMO_SAMPLE_TYPE,
            regs_user: reg::GPR_MASK_64,
            regs_intr: reg::GPR_MASK_64,
            branch_sample_type: 0,
            exclude_user: false,
            exclude_kernel: false,
            precise: 0,
            max_stack: 64,
        }],
        boot: 0,
        repeat: 0,
        transport: "16550 UART".into(),
    }
}

/// The register pattern of the 64-bit task: register at mask bit `b` holds
/// `0x0101_0101_0101_0101 * (b + 1)`, except IP, FLAGS, CS and SS.
pub fn regs64(ip: u64) -> Vec<u64> {
    (0..24u64)
        .filter(|b| reg::GPR_MASK_64 & (1 << b) != 0)
        .map(|b| match b {
            8 => ip,
            9 => 0x202,
            10 => 0x23,
            11 => 0x1b,
            _ => 0x0101_0101_0101_0101 * (b + 1),
        })
        .collect()
}

/// The compat task's registers: 32-bit values, R8..R15 zero.
pub fn regs32(ip: u64) -> Vec<u64> {
    (0..24u64)
        .filter(|b| reg::GPR_MASK_64 & (1 << b) != 0)
        .map(|b| match b {
            8 => ip,
            9 => 0x202,
            10 => 0x33,
            11 => 0x2b,
            16..=23 => 0,
            _ => 0x1000_0000 + b,
        })
        .collect()
}

/// Counts in the demo recording.
#[derive(Clone, Copy, Debug)]
pub struct Demo {
    pub alpha: u64,
    pub beta: u64,
    pub gamma: u64,
    pub compat: u64,
    pub syscall: u64,
    pub lost: u64,
}

impl Demo {
    pub const PLAIN: Demo = Demo {
        alpha: 50,
        beta: 30,
        gamma: 20,
        compat: 10,
        syscall: 10,
        lost: 0,
    };
    pub fn samples(&self) -> u64 {
        self.alpha + self.beta + self.gamma + self.compat + self.syscall
    }
}

/// The demo stream's items, in order, handed to `f` one by one.
pub fn demo_items(image: &Image, d: Demo, mut f: impl FnMut(&Item<'_>)) {
    f(&Item::Hello(hello(image)));
    f(&Item::Task(TaskInfo {
        pid: 1,
        tid: 1,
        name: "app64".into(),
        compat: false,
        time: 0,
        text: vec![],
        program: None,
        origin: TaskOrigin::Named,
    }));
    f(&Item::Task(TaskInfo {
        pid: 2,
        tid: 2,
        name: "compat32".into(),
        compat: true,
        time: 0,
        text: vec![],
        program: None,
        origin: TaskOrigin::Named,
    }));
    let task_main = sym(image, "task_main");
    let runtime_entry = sym(image, "runtime_entry");
    let intr_kernel: Vec<u64> = regs64(0)
        .iter()
        .map(|v| v ^ 0xffff_0000_0000_0000)
        .collect();
    let mut time = 1_000_000u64;
    let mut n = 0u64;
    let plan = [
        ("hot_alpha", d.alpha, 1u32),
        ("hot_beta", d.beta, 1),
        ("hot_gamma", d.gamma, 1),
        ("compat_main", d.compat, 2),
        ("runtime_syscall", d.syscall, 1),
    ];
    for (name, count, pid) in plan {
        let base = sym(image, name);
        for i in 0..count {
            time += 1_000_000;
            n += 1;
            let ip = base + 4 + (i % 8);
            let user_ip = sym(image, "hot_beta") + 16;
            let kernel = name.starts_with("runtime");
            let (chain, ur, abi) = if kernel {
                (
                    vec![
                        context::KERNEL,
                        ip,
                        runtime_entry + 8,
                        context::USER,
                        user_ip,
                        task_main + 5,
                    ],
                    regs64(user_ip),
                    2,
                )
            } else if pid == 2 {
                (vec![context::USER, ip], regs32(ip), 1)
            } else {
                (vec![context::USER, ip, task_main + 5], regs64(ip), 2)
            };
            let ir = if kernel {
                intr_kernel.clone()
            } else {
                ur.clone()
            };
            f(&Item::Sample(SampleView {
                event: 0,
                cpu: 0,
                pid,
                tid: pid,
                time,
                ip,
                user: !kernel,
                period: 1_000_000,
                callchain: &chain,
                regs_user_abi: abi,
                regs_user: &ur,
                regs_intr_abi: 2,
                regs_intr: &ir,
                ..Default::default()
            }));
            if d.lost > 0 && n == 7 {
                f(&Item::Lost {
                    event: 0,
                    cpu: 0,
                    count: d.lost,
                    time,
                    throttled: false,
                });
            }
        }
    }
    // Each task ends after its samples; the target may repeat an end.
    for pid in [2, 1, 1] {
        time += 1_000_000;
        f(&Item::TaskExit {
            pid,
            tid: pid,
            time,
        });
    }
    f(&Item::End(EndCounters {
        taken: n + d.lost,
        delivered: n,
        lost: d.lost,
        throttled: 0,
        unknown_syscalls: String::new(),
    }));
}

/// Writes the demo recording to `out`.
pub fn write_demo(image: &Image, d: Demo, out: &Path) -> ConvertSummary {
    let file = std::fs::File::create(out).unwrap();
    let mut conv = Converter::new(
        file,
        ConvertOptions {
            image: Some(image.clone()),
            cmdline: vec!["perch".into(), "test".into()],
            programs: Default::default(),
            kernel_file: None,
        },
    );
    let mut err = None;
    demo_items(image, d, |item| {
        if let Err(e) = conv.push(item) {
            err.get_or_insert(e.to_string());
        }
    });
    assert_eq!(err, None);
    conv.finish().unwrap().1
}

/// Runs `perf` with `args`; None (with the reason printed) when perf is missing.
pub fn perf(args: &[&str]) -> Option<(String, String)> {
    let out = match std::process::Command::new("perf")
        .args(args)
        .env("PAGER", "cat")
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!(
                "skipping perf check: cannot run perf ({e}); install it with `apt-get install linux-perf`"
            );
            return None;
        }
    };
    assert!(
        out.status.success(),
        "perf {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some((
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// A xorshift64 generator: repeatable damage for the stream tests.
pub fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

/// Flips, drops or inserts `edits` bytes of `bytes` at places drawn from
/// `next`, all past the first `keep` bytes (the Hello).
pub fn damage(bytes: &mut Vec<u8>, keep: usize, edits: usize, next: &mut impl FnMut() -> u64) {
    for _ in 0..edits {
        let pos = keep + (next() as usize) % (bytes.len() - keep);
        match next() % 3 {
            0 => bytes[pos] ^= (next() as u8) | 1,
            1 => {
                bytes.remove(pos);
            }
            _ => bytes.insert(pos, next() as u8),
        }
    }
}
