//! Processes that fork and exec, from the wire to perf.data: a Task record
//! of a task another made becomes a PERF_RECORD_FORK before its COMM, an
//! exec's Task record an exec COMM (`PERF_RECORD_MISC_COMM_EXEC`) and the
//! new program's MMAP2s, and the target's periodic repetitions are written
//! once. The file is read back with linux-perf-data and, where it is
//! installed, with `perf script --show-task-events`; the flamegraphs of the
//! capture and of its perf.data, and `perch top`, count the samples after
//! the exec in the new program.
#![forbid(unsafe_code)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::fixture;
use host_tool::convert::{ConvertOptions, Converter};
use host_tool::flamegraph::Folder;
use host_tool::input::Pump;
use host_tool::top::{Filter, Top};
use linux_perf_data::linux_perf_event_reader::EventRecord;
use linux_perf_data::{PerfFileReader, PerfFileRecord};
use sampler::event::{EventConfig, PmuCaps};
use sampler::regs::Abi;
use sampler::sample::{CpuMode, Sample};
use sampler::wire::{
    self, CpuId, CpuVendor, Encoder, EncoderConfig, End, MAX_FRAME, Origin, Program, Record,
    Segment, TaskExit,
};

/// Where the first program (the fixture `appliance.elf`) is loaded: its
/// code segment at its link address.
const APP_TEXT: u64 = 0x10_0000;
/// Where the exec'd program (the fixture `other.elf`, the same layout) is
/// loaded: elsewhere, so that nothing of the first program's mapping is
/// left standing by the second's.
const WORK_TEXT: u64 = 0x20_0000;
/// `hot_beta` of `appliance.elf`, `other_task` of `other.elf` (at its link
/// address).
const HOT_BETA: u64 = 0x10_1142;
const OTHER_TASK: u64 = 0x10_1000;

/// The program at archive path `path` with build-id `id`, its code (file
/// offset 0x1000, two pages) loaded at `text`.
fn program(path: &str, id: &[u8], text: u64) -> Program {
    let mut p = Program::default();
    p.path.push_str(path).unwrap();
    p.build_id.extend_from_slice(id).unwrap();
    p.segments
        .push(Segment {
            start: text,
            len: 0x2000,
            file_offset: 0x1000,
            prot: Segment::READ | Segment::EXEC,
        })
        .unwrap();
    p
}

fn task(time: u64, pid: u32, name: &str, program: Program, origin: Origin) -> wire::Task {
    wire::Task {
        time,
        pid,
        tid: pid,
        name: heapless::String::try_from(name).unwrap(),
        abi: Abi::Bits64,
        text: heapless::Vec::new(),
        program: Some(program),
        origin,
    }
}

fn sample(time: u64, pid: u32, ip: u64) -> Sample {
    Sample {
        event: 0,
        cpumode: CpuMode::User,
        ip,
        pid,
        tid: pid,
        time,
        cpu: 0,
        period: 1_000_000,
        ..Sample::default()
    }
}

/// The host files of the two programs and their build-ids.
struct Programs {
    app: PathBuf,
    work: PathBuf,
    app_id: Vec<u8>,
    work_id: Vec<u8>,
}

impl Programs {
    fn new(dir: &Path) -> Programs {
        let app = dir.join("app");
        let work = dir.join("work");
        std::fs::copy(fixture("appliance.elf"), &app).unwrap();
        std::fs::copy(fixture("other.elf"), &work).unwrap();
        let id = |p: &Path| host_tool::manifest::build_id(&std::fs::read(p).unwrap()).unwrap();
        Programs {
            app_id: id(&app),
            work_id: id(&work),
            app: std::fs::canonicalize(app).unwrap(),
            work: std::fs::canonicalize(work).unwrap(),
        }
    }

    fn by_archive_path(&self) -> BTreeMap<String, PathBuf> {
        [
            ("bin/app".to_owned(), self.app.clone()),
            ("bin/work".to_owned(), self.work.clone()),
        ]
        .into()
    }
}

/// A stream being written, as the target writes it.
struct Stream {
    enc: Encoder,
    bytes: Vec<u8>,
    hello: wire::Hello,
    samples: u64,
}

impl Stream {
    /// A stream that said Hello: one cpu-clock event.
    fn new() -> Stream {
        let cpu = CpuId {
            vendor: CpuVendor::Intel,
            family: 6,
            model: 0x8f,
            stepping: 8,
        };
        let mut hello = wire::Hello::new(cpu, PmuCaps::cpu_clock());
        hello.events.push(EventConfig::cpu_clock(0, 1000)).unwrap();
        hello.boot = 7;
        let mut s = Stream {
            enc: Encoder::new(EncoderConfig::default()),
            bytes: vec![0],
            hello: hello.clone(),
            samples: 0,
        };
        s.put(Record::Hello(hello));
        s
    }

    fn put(&mut self, rec: Record) {
        let mut buf = [0u8; MAX_FRAME];
        let n = self.enc.encode(&rec, &mut buf).unwrap();
        self.bytes.extend_from_slice(&buf[..n]);
    }

    fn task(&mut self, t: wire::Task) {
        self.put(Record::Task(t));
    }

    fn sample(&mut self, time: u64, pid: u32, ip: u64) {
        self.samples += 1;
        self.put(Record::Sample(sample(time, pid, ip)));
    }

    /// The periodic repetition of the Hello.
    fn repeat_hello(&mut self) {
        self.hello.repeat += 1;
        self.put(Record::Hello(self.hello.clone()));
    }

    /// Ends the stream: every sample delivered.
    fn end(mut self, time: u64) -> Vec<u8> {
        let n = self.samples;
        self.put(Record::End(End {
            time,
            taken: n,
            delivered: n,
            ..End::default()
        }));
        self.bytes
    }
}

/// A run where process 1 (`app`) forks process 2, which runs `app` a while
/// and then execs `bin/work` twice (the second time exactly as the
/// first), with the target's periodic repetition of Hello and the Task
/// records in between, as the runtime repeats them (origin `Named`).
fn capture(p: &Programs) -> Vec<u8> {
    let app = || program("bin/app", &p.app_id, APP_TEXT);
    let work = || program("bin/work", &p.work_id, WORK_TEXT);
    let mut s = Stream::new();
    s.task(task(1_000, 1, "app", app(), Origin::Named));
    s.sample(2_000, 1, HOT_BETA);
    let made = Origin::Made { ppid: 1, ptid: 1 };
    s.task(task(3_000, 2, "app", app(), made));
    s.sample(4_000, 2, HOT_BETA);
    s.sample(4_500, 1, HOT_BETA);
    let exec = task(5_000, 2, "work", work(), Origin::Exec);
    s.task(exec.clone());
    s.sample(6_000, 2, OTHER_TASK - APP_TEXT + WORK_TEXT);
    // Where the first program's code was: nothing of process 2's now.
    s.sample(6_500, 2, HOT_BETA);
    // The same exec again, the record byte for byte.
    s.task(exec.clone());
    // The periodic repetition.
    s.repeat_hello();
    s.task(task(1_000, 1, "app", app(), Origin::Named));
    s.task(wire::Task {
        origin: Origin::Named,
        ..exec
    });
    s.sample(7_000, 2, OTHER_TASK - APP_TEXT + WORK_TEXT);
    s.end(8_000)
}

/// The perf.data of `bytes`, converted as `perch convert` does.
fn convert(bytes: &[u8], p: &Programs, out: &Path) -> Vec<String> {
    let mut conv = Converter::new(
        std::fs::File::create(out).unwrap(),
        ConvertOptions {
            image: None,
            cmdline: vec!["perch".into(), "convert".into()],
            programs: p.by_archive_path(),
            kernel_file: None,
        },
    );
    let mut pump = Pump::new();
    pump.feed_parts(bytes, &mut conv).unwrap();
    pump.check_recognised().unwrap();
    let (_, summary) = conv.finish().unwrap();
    summary.warnings
}

/// One task record of the file, in file order.
#[derive(Debug, PartialEq)]
enum TaskEvent {
    Fork {
        pid: i32,
        ppid: i32,
        tid: i32,
        ptid: i32,
    },
    Comm {
        pid: i32,
        tid: i32,
        name: String,
        exec: bool,
    },
    Mmap2 {
        pid: i32,
        start: u64,
        path: String,
    },
}

fn task_events(file: &Path) -> (Vec<TaskEvent>, Vec<(String, Vec<u8>)>) {
    let reader = std::io::BufReader::new(std::fs::File::open(file).unwrap());
    let PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = PerfFileReader::parse_file(reader).unwrap();
    let mut events = Vec::new();
    while let Some(r) = record_iter.next_record(&mut perf_file).unwrap() {
        let PerfFileRecord::EventRecord { record, .. } = r else {
            continue;
        };
        match record.parse().unwrap() {
            EventRecord::Fork(f) => events.push(TaskEvent::Fork {
                pid: f.pid,
                ppid: f.ppid,
                tid: f.tid,
                ptid: f.ptid,
            }),
            EventRecord::Comm(c) if c.pid != 0 => events.push(TaskEvent::Comm {
                pid: c.pid,
                tid: c.tid,
                name: String::from_utf8_lossy(&c.name.as_slice()).into_owned(),
                exec: c.is_execve,
            }),
            EventRecord::Mmap2(m) => events.push(TaskEvent::Mmap2 {
                pid: m.pid,
                start: m.address,
                path: String::from_utf8_lossy(&m.path.as_slice()).into_owned(),
            }),
            _ => {}
        }
    }
    let ids = perf_file
        .build_ids()
        .unwrap()
        .values()
        .map(|d| {
            (
                String::from_utf8_lossy(&d.path).into_owned(),
                d.build_id.clone(),
            )
        })
        .collect();
    (events, ids)
}

#[test]
fn a_fork_and_an_exec_become_fork_exec_comm_and_the_new_programs_maps() {
    let dir = tempfile::tempdir().unwrap();
    let p = Programs::new(dir.path());
    let bytes = capture(&p);
    let data = dir.path().join("perf.data");
    let warnings = convert(&bytes, &p, &data);
    assert!(warnings.is_empty(), "{warnings:?}");

    let (events, ids) = task_events(&data);
    let app = p.app.display().to_string();
    let work = p.work.display().to_string();
    let comm = |pid, name: &str, exec| TaskEvent::Comm {
        pid,
        tid: pid,
        name: name.into(),
        exec,
    };
    let mmap2 = |pid, start, path: &str| TaskEvent::Mmap2 {
        pid,
        start,
        path: path.into(),
    };
    assert_eq!(
        events,
        [
            comm(1, "app", false),
            mmap2(1, APP_TEXT, &app),
            // Made by task 1 of process 1: its FORK, then its own COMM and
            // maps.
            TaskEvent::Fork {
                pid: 2,
                ppid: 1,
                tid: 2,
                ptid: 1,
            },
            comm(2, "app", false),
            mmap2(2, APP_TEXT, &app),
            // Each exec, even of the program the process runs.
            comm(2, "work", true),
            mmap2(2, WORK_TEXT, &work),
            comm(2, "work", true),
            mmap2(2, WORK_TEXT, &work),
            // The repetitions: nothing.
        ]
    );
    // Both programs of process 2 have their BUILD_ID entries.
    assert!(ids.contains(&(app.clone(), p.app_id.clone())), "{ids:?}");
    assert!(ids.contains(&(work.clone(), p.work_id.clone())), "{ids:?}");

    // The flamegraph of the perf.data and of the capture: after the exec,
    // process 2's samples are in the new program, and the old program's
    // addresses are no longer its.
    let mut from_file = Folder::new(None);
    from_file
        .read_perf_data(std::fs::File::open(&data).unwrap())
        .unwrap();
    let mut from_capture = Folder::with(None, p.by_archive_path(), Default::default());
    let mut top = Top::new(None, p.by_archive_path());
    Pump::new()
        .feed(&bytes, &mut |item| {
            from_capture.push(item);
            top.item(item);
            Ok(())
        })
        .unwrap();
    let want = [
        "app;hot_beta 3000000",
        "work;0x101142 1000000",
        "work;other_task 2000000",
    ];
    assert_eq!(from_file.folded(), want);
    assert_eq!(from_capture.folded(), want);
    // `perch top` names the new program's file for them (its symbol table
    // has no sized symbol for `other_task`, which `perch top` shows as the
    // address).
    let rows: Vec<(String, String, String, u64)> = top
        .rows(&Filter::All)
        .into_iter()
        .map(|r| (r.command, r.dso, r.symbol, r.samples))
        .collect();
    let row = |comm: &str, dso: &str, sym: &str, n| (comm.into(), dso.into(), sym.into(), n);
    assert_eq!(
        rows,
        [
            row("app", "app", "hot_beta", 3),
            row("work", "work", "0x201000", 2),
            row("work", "work", "0x101142", 1),
        ]
    );

    // perf itself, where it is installed.
    let Some((out, _)) =
        common::perf(&["script", "--show-task-events", "-i", data.to_str().unwrap()])
    else {
        return;
    };
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.contains("PERF_RECORD_FORK(2:2):(1:1)"))
            .count(),
        1,
        "{out}"
    );
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.contains("PERF_RECORD_COMM exec: work:2/2"))
            .count(),
        2,
        "{out}"
    );
    assert!(
        !lines.iter().any(|l| l.contains("exec: app")),
        "an exec COMM for a task that did not exec: {out}"
    );
    // perf too finds the samples after the exec in the new program.
    let in_work: Vec<&&str> = lines
        .iter()
        .filter(|l| l.contains(&format!("other_task+0x0 ({work})")))
        .collect();
    assert_eq!(in_work.len(), 2, "{out}");
    assert!(in_work.iter().all(|l| l.trim_start().starts_with("work ")));
}

/// The target reuses the ids of a task that ended: a process made on them
/// later is a new one, with its own FORK, COMM, EXIT and counts.
#[test]
fn a_task_made_on_the_ids_of_one_that_ended_is_a_new_task() {
    let dir = tempfile::tempdir().unwrap();
    let p = Programs::new(dir.path());
    let app = || program("bin/app", &p.app_id, APP_TEXT);
    let made = Origin::Made { ppid: 1, ptid: 1 };
    let mut s = Stream::new();
    s.task(task(1_000, 1, "app", app(), Origin::Named));
    for (life, start) in [(0, 2_000), (1, 10_000)] {
        s.task(task(start, 2, "app", app(), made));
        for i in 0..=life {
            s.sample(start + 100 * i, 2, HOT_BETA);
        }
        s.put(Record::TaskExit(TaskExit {
            time: start + 1_000,
            pid: 2,
            tid: 2,
        }));
    }
    let bytes = s.end(20_000);
    let data = dir.path().join("perf.data");
    let warnings = convert(&bytes, &p, &data);
    assert!(warnings.is_empty(), "{warnings:?}");

    let reader = std::io::BufReader::new(std::fs::File::open(&data).unwrap());
    let PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = PerfFileReader::parse_file(reader).unwrap();
    let mut seen = Vec::new();
    while let Some(r) = record_iter.next_record(&mut perf_file).unwrap() {
        let PerfFileRecord::EventRecord { record, .. } = r else {
            continue;
        };
        // PERF_RECORD_READ: pid, tid, the count.
        if record.record_type.0 == 8 {
            let b = record.data.as_slice();
            let word = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
            let value = u64::from_le_bytes(b[8..16].try_into().unwrap());
            seen.push(format!("read {}/{} {value}", word(0), word(4)));
            continue;
        }
        match record.parse().unwrap() {
            EventRecord::Fork(f) => seen.push(format!("fork {}/{}", f.pid, f.tid)),
            EventRecord::Exit(e) => seen.push(format!("exit {}/{}", e.pid, e.tid)),
            EventRecord::Comm(c) if c.pid == 2 => seen.push(format!("comm {}/{}", c.pid, c.tid)),
            _ => {}
        }
    }
    assert_eq!(
        seen,
        [
            "fork 2/2",
            "comm 2/2",
            "read 2/2 1000000",
            "exit 2/2",
            "fork 2/2",
            "comm 2/2",
            "read 2/2 2000000",
            "exit 2/2",
        ]
    );
}

/// A sample after its task's TaskExit is out of the target's order (a
/// task's samples come before its end): it is counted and named in a
/// warning, and one of a new task on the same ids is not.
#[test]
fn samples_after_their_tasks_end_are_counted_in_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let p = Programs::new(dir.path());
    let app = || program("bin/app", &p.app_id, APP_TEXT);
    let made = Origin::Made { ppid: 1, ptid: 1 };
    let mut s = Stream::new();
    s.task(task(1_000, 1, "app", app(), Origin::Named));
    s.task(task(2_000, 2, "app", app(), made));
    s.sample(2_100, 2, HOT_BETA);
    s.put(Record::TaskExit(TaskExit {
        time: 3_000,
        pid: 2,
        tid: 2,
    }));
    // Two of the ended task's, one of the process that is still running.
    s.sample(2_200, 2, HOT_BETA);
    s.sample(2_300, 1, HOT_BETA);
    s.sample(2_400, 2, HOT_BETA);
    // A new task on the ids: its samples are its own.
    s.task(task(5_000, 2, "app", app(), made));
    s.sample(5_100, 2, HOT_BETA);
    let bytes = s.end(20_000);
    let warnings = convert(&bytes, &p, &dir.path().join("perf.data"));
    assert_eq!(
        warnings,
        ["2 samples arrived after their task's end (TaskExit): the target sent them out of order"]
    );
}
