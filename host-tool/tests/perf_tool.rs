//! perf.data files from synthetic streams, read by the stock `perf` tool:
//! symbols, register dumps, ABIs, lost counts and a warning-free stderr.
//! Skipped (with the reason printed) where perf is not installed.
#![forbid(unsafe_code)]

mod common;

use common::{Demo, fixture, perf, regs32, regs64, sym, write_demo};
use host_tool::image::Image;
use host_tool::perf_abi::reg;

fn demo(d: Demo) -> (tempfile::TempDir, String, Image) {
    let image = Image::open(&fixture("appliance.elf")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("perf.data");
    write_demo(&image, d, &data);
    let data = data.to_str().unwrap().to_owned();
    (dir, data, image)
}

/// One `perf script -F comm,tid,ip,sym,uregs` sample.
#[derive(Debug)]
struct ScriptSample {
    comm: String,
    frames: Vec<String>,
    uregs: String,
}

fn parse_script(out: &str) -> Vec<ScriptSample> {
    let mut v: Vec<ScriptSample> = Vec::new();
    for line in out.lines() {
        if line.trim().is_empty() {
            continue;
        }
        if line.starts_with(' ') && line.trim_start().starts_with("ABI:") {
            v.last_mut().unwrap().uregs = line.trim().to_owned();
        } else if line.starts_with('\t') {
            let sym = line.split_whitespace().nth(1).unwrap_or("").to_owned();
            v.last_mut().unwrap().frames.push(sym);
        } else {
            let comm = line.split_whitespace().next().unwrap().to_owned();
            v.push(ScriptSample {
                comm,
                frames: vec![],
                uregs: String::new(),
            });
        }
    }
    v
}

fn uregs_text(abi: u32, values: &[u64]) -> String {
    let names = (0..24)
        .filter(|b| reg::GPR_MASK_64 & (1 << b) != 0)
        .map(|b| reg::NAMES[b]);
    let mut s = format!("ABI:{abi}");
    for (n, v) in names.zip(values) {
        s.push_str(&format!(" {n}:{v:#x}"));
    }
    s
}

fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn perf_script_resolves_symbols_and_exact_registers() {
    let (_dir, data, image) = demo(Demo::PLAIN);
    let vmlinux = format!("--vmlinux={}", image.path.display());
    let Some((out, err)) = perf(&[
        "script",
        "-i",
        &data,
        &vmlinux,
        "-F",
        "comm,tid,ip,sym,uregs",
    ]) else {
        return;
    };
    assert_eq!(err, "", "perf script printed warnings");
    let samples = parse_script(&out);
    assert_eq!(samples.len() as u64, Demo::PLAIN.samples());
    let count = |comm: &str, top: &str| {
        samples
            .iter()
            .filter(|s| s.comm == comm && s.frames.first().map(String::as_str) == Some(top))
            .count()
    };
    assert_eq!(count("app64", "hot_alpha"), 50);
    assert_eq!(count("app64", "hot_beta"), 30);
    assert_eq!(count("app64", "hot_gamma"), 20);
    assert_eq!(count("compat32", "compat_main"), 10);
    assert_eq!(count("app64", "runtime_syscall"), 10);
    for s in &samples {
        let top = s.frames[0].as_str();
        let ip = |off: u64| sym(&image, top) + off;
        match (s.comm.as_str(), top) {
            ("app64", "runtime_syscall") => {
                // Inside a syscall: the user frame saved at entry, and a
                // callchain through the runtime into the task.
                assert_eq!(
                    s.frames,
                    ["runtime_syscall", "runtime_entry", "hot_beta", "task_main"]
                );
                assert_eq!(
                    squash(&s.uregs),
                    uregs_text(2, &regs64(sym(&image, "hot_beta") + 16))
                );
            }
            ("app64", _) => {
                assert_eq!(s.frames[1], "task_main");
                let ip_reg = s
                    .uregs
                    .split_whitespace()
                    .find(|w| w.starts_with("IP:"))
                    .unwrap();
                let ipv = u64::from_str_radix(ip_reg.trim_start_matches("IP:0x"), 16).unwrap();
                assert!((ip(4)..ip(12)).contains(&ipv), "{ipv:#x} not in {top}");
                assert_eq!(squash(&s.uregs), uregs_text(2, &regs64(ipv)));
            }
            ("compat32", "compat_main") => {
                let ipv = u64::from_str_radix(
                    s.uregs
                        .split_whitespace()
                        .find(|w| w.starts_with("IP:"))
                        .unwrap()
                        .trim_start_matches("IP:0x"),
                    16,
                )
                .unwrap();
                assert_eq!(squash(&s.uregs), uregs_text(1, &regs32(ipv)));
                for r in ["R8", "R9", "R10", "R11", "R12", "R13", "R14", "R15"] {
                    assert!(
                        s.uregs.contains(&format!("{r}:0x0 "))
                            || s.uregs.ends_with(&format!("{r}:0x0")),
                        "{}",
                        s.uregs
                    );
                }
            }
            other => panic!("unexpected sample {other:?}"),
        }
    }
}

#[test]
fn perf_report_shares_match_and_stderr_is_clean() {
    let (_dir, data, image) = demo(Demo::PLAIN);
    let vmlinux = format!("--vmlinux={}", image.path.display());
    let Some((out, err)) = perf(&[
        "report",
        "--stdio",
        "-i",
        &data,
        &vmlinux,
        "--no-children",
        "--sort",
        "comm,sym",
        "-g",
        "none",
    ]) else {
        return;
    };
    assert_eq!(err, "", "perf report printed warnings");
    let share = |comm: &str, name: &str| -> f64 {
        let line = out
            .lines()
            .find(|l| l.contains(comm) && l.trim_end().ends_with(name) && !l.starts_with('#'))
            .unwrap_or_else(|| panic!("no {comm} {name} in\n{out}"));
        line.split_whitespace()
            .next()
            .unwrap()
            .trim_end_matches('%')
            .parse()
            .unwrap()
    };
    let total = Demo::PLAIN.samples() as f64;
    for (comm, name, n) in [
        ("app64", "hot_alpha", 50.0),
        ("app64", "hot_beta", 30.0),
        ("app64", "hot_gamma", 20.0),
        ("compat32", "compat_main", 10.0),
        ("app64", "runtime_syscall", 10.0),
    ] {
        let want = 100.0 * n / total;
        assert!(
            (share(comm, name) - want).abs() < 0.01,
            "{name}: {} vs {want}",
            share(comm, name)
        );
    }
    // Kernel samples are marked [k], user samples [.].
    assert!(
        out.lines().any(|l| l.contains("[k] runtime_syscall")),
        "{out}"
    );
    assert!(out.lines().any(|l| l.contains("[.] hot_alpha")), "{out}");
}

#[test]
fn perf_header_describes_the_appliance() {
    let (_dir, data, _image) = demo(Demo::PLAIN);
    let Some((out, err)) = perf(&["report", "--header-only", "-i", &data]) else {
        return;
    };
    assert_eq!(err, "");
    for want in [
        "# hostname : appliance",
        "# os release : perch-runtime (wire protocol 1)",
        "# arch : x86_64",
        "# cpudesc : QEMU TCG x86_64 [no PMU: NMI clock (cpu-clock)]",
        "# nrcpus online : 1",
        "# nrcpus avail : 1",
        "# cmdline : perch test [appliance: freq=1000 console=wire]",
        "# event : name = cpu-clock",
    ] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }
}

#[test]
fn losses_show_in_perf_report_and_script() {
    let d = Demo {
        lost: 5,
        ..Demo::PLAIN
    };
    let (_dir, data, image) = demo(d);
    let vmlinux = format!("--vmlinux={}", image.path.display());
    let Some((out, _err)) = perf(&["report", "--stdio", "-i", &data, &vmlinux]) else {
        return;
    };
    assert!(out.contains("# Total Lost Samples: 5"), "{out}");
    let (script, _) = perf(&[
        "script",
        "-i",
        &data,
        &vmlinux,
        "--show-lost-events",
        "-F",
        "comm,ip",
    ])
    .unwrap();
    let lost: Vec<_> = script.lines().filter(|l| l.contains("LOST")).collect();
    assert_eq!(lost.len(), 1, "{script}");
    assert!(lost[0].contains("PERF_RECORD_LOST lost 5"), "{}", lost[0]);
}

/// Two PMU events with different sample types, one with a branch stack,
/// weight, data source and address, plus throttling records.
fn pmu_recording(dir: &std::path::Path, image: &Image) -> String {
    use host_tool::convert::{ConvertOptions, Converter};
    use host_tool::model::{
        EndCounters, EventInfo, EventKind, EventSource, Item, SampleView, TaskInfo, TaskOrigin,
    };
    use host_tool::perf_abi::{context, sample};
    use host_tool::perf_data::BranchEntry;
    let mut h = common::hello(image);
    h.source = EventSource::SimulatedPmu;
    h.events = vec![
        EventInfo {
            id: 3,
            kind: EventKind::Hardware,
            config: 0,
            period_or_freq: 100_000,
            freq: false,
            sample_type: sample::IP
                | sample::TID
                | sample::TIME
                | sample::ADDR
                | sample::PERIOD
                | sample::CALLCHAIN
                | sample::BRANCH_STACK
                | sample::WEIGHT,
            regs_user: 0,
            regs_intr: 0,
            branch_sample_type: 1 | 8,
            exclude_user: false,
            exclude_kernel: false,
            precise: 0,
            max_stack: 64,
        },
        EventInfo {
            id: 4,
            kind: EventKind::Hardware,
            config: 1,
            period_or_freq: 50_000,
            freq: false,
            sample_type: sample::IP
                | sample::TID
                | sample::TIME
                | sample::ADDR
                | sample::PERIOD
                | sample::BRANCH_STACK
                | sample::WEIGHT
                | sample::DATA_SRC,
            regs_user: 0,
            regs_intr: 0,
            branch_sample_type: 1 | 8,
            exclude_user: false,
            exclude_kernel: true,
            precise: 2,
            max_stack: 0,
        },
    ];
    let path = dir.join("pmu.data");
    let mut conv = Converter::new(
        std::fs::File::create(&path).unwrap(),
        ConvertOptions {
            image: Some(image.clone()),
            cmdline: vec!["perch".into()],
            programs: Default::default(),
            kernel_file: None,
        },
    );
    conv.push(&Item::Hello(h)).unwrap();
    conv.push(&Item::Task(TaskInfo {
        pid: 1,
        tid: 1,
        name: "app64".into(),
        compat: false,
        time: 0,
        text: vec![],
        program: None,
        origin: TaskOrigin::Named,
    }))
    .unwrap();
    let alpha = sym(image, "hot_alpha");
    let beta = sym(image, "hot_beta");
    let gamma = sym(image, "hot_gamma");
    let branches = [
        BranchEntry {
            from: alpha + 8,
            to: beta,
            flags: 1 | (5 << 4),
        },
        BranchEntry {
            from: gamma + 2,
            to: alpha,
            flags: 2 | (7 << 4),
        },
    ];
    for i in 0..40u64 {
        let chain = [context::USER, alpha + 4, sym(image, "task_main") + 5];
        let (event, ip) = if i % 2 == 0 {
            (3, alpha + 4)
        } else {
            (4, beta + 4)
        };
        conv.push(&Item::Sample(SampleView {
            event,
            pid: 1,
            tid: 1,
            time: 1000 + i * 100,
            ip,
            user: true,
            period: 100_000,
            addr: 0xdead_b000 + i,
            callchain: &chain,
            branches: &branches,
            weight: 42,
            data_src: 0x6a10_0142, // load, L1 hit
            ..Default::default()
        }))
        .unwrap();
        if i == 10 {
            conv.push(&Item::Throttle {
                event: 4,
                cpu: 0,
                on: true,
                time: 1000 + i * 100 + 1,
            })
            .unwrap();
        }
        if i == 20 {
            conv.push(&Item::Throttle {
                event: 4,
                cpu: 0,
                on: false,
                time: 1000 + i * 100 + 1,
            })
            .unwrap();
        }
    }
    conv.push(&Item::End(EndCounters {
        taken: 40,
        delivered: 40,
        lost: 0,
        throttled: 1,
        unknown_syscalls: String::new(),
    }))
    .unwrap();
    conv.finish().unwrap();
    path.to_str().unwrap().to_owned()
}

#[test]
fn several_events_branch_stacks_weights_and_throttling() {
    let image = Image::open(&fixture("appliance.elf")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = pmu_recording(dir.path(), &image);
    let vmlinux = format!("--vmlinux={}", image.path.display());
    let Some((out, err)) = perf(&[
        "report",
        "--stdio",
        "-i",
        &data,
        &vmlinux,
        "--no-branch-stack",
        "-g",
        "none",
    ]) else {
        return;
    };
    assert_eq!(err, "", "perf report printed warnings");
    assert!(out.contains("of event 'cycles-simulated'"), "{out}");
    // exclude_kernel: perf's `u` modifier before the precise level.
    assert!(
        out.contains("of event 'instructions-simulated:upp'"),
        "{out}"
    );
    let (script, err) = perf(&[
        "script",
        "-i",
        &data,
        &vmlinux,
        "-F",
        "event,ip,sym,addr,weight,brstacksym",
    ])
    .unwrap();
    assert_eq!(err, "", "perf script printed warnings");
    // Branch entries symbolised with their flags (M mispredicted, P
    // predicted) and cycles, on every sample of both events.
    let brstack = "hot_alpha+0x8/hot_beta+0x0/M/-/-/5/ hot_gamma+0x2/hot_alpha+0x0/P/-/-/7/";
    assert_eq!(script.matches(brstack).count(), 40, "{script}");
    let lines: Vec<&str> = script.lines().collect();
    let insn: Vec<&&str> = lines
        .iter()
        .filter(|l| l.contains("instructions-simulated:upp:"))
        .collect();
    assert_eq!(insn.len(), 20, "{script}");
    for l in &insn {
        assert!(l.contains("hot_beta"), "{l}");
        assert!(l.contains("deadb0"), "{l}");
        assert!(l.split_whitespace().nth(2) == Some("42"), "{l}");
    }
    // cycles samples carry a callchain: the next line is the sampled frame.
    let mut cycles = 0;
    for (i, l) in lines.iter().enumerate() {
        if l.contains("cycles-simulated:") {
            cycles += 1;
            assert!(l.trim_end().ends_with(" 42"), "{l}");
            assert!(
                lines[i + 1].trim_end().ends_with("hot_alpha"),
                "{}",
                lines[i + 1]
            );
            assert!(
                lines[i + 2].trim_end().ends_with("task_main"),
                "{}",
                lines[i + 2]
            );
        }
    }
    assert_eq!(cycles, 20, "{script}");
    let (dump, _) = perf(&["report", "-D", "-i", &data]).unwrap();
    assert_eq!(
        dump.lines()
            .filter(|l| l.contains("PERF_RECORD_THROTTLE"))
            .count(),
        1
    );
    assert_eq!(
        dump.lines()
            .filter(|l| l.contains("PERF_RECORD_UNTHROTTLE"))
            .count(),
        1
    );
}

#[test]
fn buildid_cache_lets_perf_resolve_without_flags() {
    let image = fixture("appliance.elf");
    let dir = tempfile::tempdir().unwrap();
    if perf(&["--version"]).is_none() {
        return;
    }
    let img = Image::open(&image).unwrap();
    let cap = dir.path().join("c.bin");
    let mut f = std::fs::File::create(&cap).unwrap();
    host_tool::synth::write_capture(Some(&img), &Default::default(), &mut f).unwrap();
    let data = dir.path().join("perf.data");
    // perf keeps its cache under $HOME/.debug: use a private one.
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_perch"))
        .args([
            "convert",
            cap.to_str().unwrap(),
            "--image",
            image.to_str().unwrap(),
            "-o",
        ])
        .arg(&data)
        .arg("--buildid-cache")
        .env("HOME", &home)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("added") && stderr.contains("build-id cache"),
        "{stderr}"
    );
    // For samply: the runtime's functions as Breakpad symbols in the cache,
    // named by the last kernel build-id entry (a reader keeping one entry
    // per DSO, as samply's linux-perf-data does, keeps that one).
    let id = img.build_id.clone().unwrap();
    let sym =
        host_tool::buildid_cache::kernel_symbols_path(&home.join(".debug"), &image, &id).unwrap();
    let text = std::fs::read_to_string(&sym).unwrap();
    assert!(
        text.starts_with(&format!(
            "MODULE Linux x86_64 {} appliance.elf\n",
            host_tool::breakpad::debug_id(&id)
        )),
        "{text}"
    );
    assert!(text.contains(" runtime_entry\n"), "{text}");
    let reader = std::io::BufReader::new(std::fs::File::open(&data).unwrap());
    let ids = linux_perf_data::PerfFileReader::parse_file(reader)
        .unwrap()
        .perf_file
        .build_ids()
        .unwrap();
    let kernel = &ids[&linux_perf_data::DsoKey::Kernel];
    assert_eq!(kernel.path, sym.to_str().unwrap().as_bytes());
    assert_eq!(kernel.build_id, id);
    // perf's side: each entry's pid (`struct build_id_event`: header, pid,
    // 24-byte build-id, path) says its machine: the runtime's
    // `[kernel.kallsyms]` is the host's (-1), the Breakpad file machine 0's.
    let reader = std::io::BufReader::new(std::fs::File::open(&data).unwrap());
    let file = linux_perf_data::PerfFileReader::parse_file(reader)
        .unwrap()
        .perf_file;
    let mut section = file
        .feature_section_data(linux_perf_data::Feature::BUILD_ID)
        .unwrap();
    let mut pids = std::collections::BTreeMap::new();
    while section.len() >= 36 {
        let size = u16::from_le_bytes([section[6], section[7]]) as usize;
        let pid = i32::from_le_bytes(section[8..12].try_into().unwrap());
        let path = &section[36..size];
        let path = &path[..path.iter().position(|&b| b == 0).unwrap_or(path.len())];
        pids.insert(String::from_utf8_lossy(path).into_owned(), pid);
        section = &section[size..];
    }
    assert_eq!(pids.get("[kernel.kallsyms]"), Some(&-1), "{pids:?}");
    assert_eq!(pids.get(sym.to_str().unwrap()), Some(&0), "{pids:?}");
    let o = std::process::Command::new("perf")
        .args([
            "report",
            "--stdio",
            "--no-children",
            "-g",
            "none",
            "--sort",
            "sym",
            "-i",
        ])
        .arg(&data)
        .env("HOME", &home)
        .env("PAGER", "cat")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(String::from_utf8_lossy(&o.stderr), "");
    assert!(out.contains("[k] runtime_entry"), "{out}");
    assert!(out.contains("[.] hot_alpha"), "{out}");
    // The Breakpad entry is a DSO of perf's machine 0, not of the host: the
    // runtime's samples stay under `[kernel.kallsyms]`.
    let o = std::process::Command::new("perf")
        .args(["report", "--stdio", "--no-children", "--sort", "dso", "-i"])
        .arg(&data)
        .env("HOME", &home)
        .env("PAGER", "cat")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(String::from_utf8_lossy(&o.stderr), "");
    assert!(out.contains("[kernel.kallsyms]"), "{out}");
    assert!(!out.contains("breakpad"), "{out}");
}
