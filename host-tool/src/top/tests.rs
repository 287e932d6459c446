//! Tests of `perch top`'s model: symbolisation, ranking, rates, the plain
//! table and the view's refresh and keys.

use super::*;
use crate::model::{EventInfo, EventKind, EventSource, Hello, ProgramInfo, SampleView, TaskOrigin};

fn fixture_image() -> Image {
    Image::open(Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/appliance.elf"
    )))
    .expect("the fixture image opens")
}

fn sym(img: &Image, name: &str) -> u64 {
    img.symbols
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no {name} in the fixture"))
        .addr
}

fn task(pid: u32, name: &str, program: Option<ProgramInfo>) -> TaskInfo {
    TaskInfo {
        pid,
        tid: pid,
        name: name.into(),
        compat: false,
        time: 0,
        text: vec![],
        program,
        origin: TaskOrigin::Named,
    }
}

/// (command, dso, kernel, symbol, samples) of each row, in order.
fn table(rows: &[Row]) -> Vec<(String, String, bool, String, u64)> {
    rows.iter()
        .map(|r| {
            (
                r.command.clone(),
                r.dso.clone(),
                r.kernel,
                r.symbol.clone(),
                r.samples,
            )
        })
        .collect()
}

fn row(c: &str, d: &str, k: bool, s: &str, n: u64) -> (String, String, bool, String, u64) {
    (c.into(), d.into(), k, s.into(), n)
}

/// The fixture's three hot functions sampled 5/3/2 times by `app`, its
/// syscall path 4 times on its behalf, the NMI handler once as the runtime
/// itself, and one user address no symbol covers.
fn counted() -> Top {
    let img = fixture_image();
    let mut t = Top::new(Some(&img), BTreeMap::new());
    t.item(&Item::Task(task(1, "app", None)));
    for (name, n) in [("hot_beta", 3), ("hot_alpha", 5), ("hot_gamma", 2)] {
        for i in 0..n {
            t.sample(1, 1, sym(&img, name) + i, false, 1);
        }
    }
    for _ in 0..4 {
        t.sample(1, 1, sym(&img, "runtime_syscall") + 2, true, 1);
    }
    t.sample(0, 0, sym(&img, "runtime_nmi_handler"), true, 1);
    t.sample(1, 1, 0x7000_0000, false, 1);
    t
}

#[test]
fn samples_rank_by_self_share_with_runtime_code_apart() {
    let t = counted();
    assert_eq!(t.samples(), 16);
    let rows = t.rows(&Filter::All);
    assert_eq!(
        table(&rows),
        [
            row("app", "appliance.elf", false, "hot_alpha", 5),
            row("app", RUNTIME_DSO, true, "runtime_syscall", 4),
            row("app", "appliance.elf", false, "hot_beta", 3),
            row("app", "appliance.elf", false, "hot_gamma", 2),
            row("app", "appliance.elf", false, "0x70000000", 1),
            row(RUNTIME_COMM, RUNTIME_DSO, true, "runtime_nmi_handler", 1),
        ]
    );
    assert!((rows[0].share - 31.25).abs() < 1e-9, "{}", rows[0].share);
    let total: f64 = rows.iter().map(|r| r.share).sum();
    assert!((total - 100.0).abs() < 1e-9);
    let (commands, runtime) = t.commands();
    assert_eq!(commands.len(), 2);
    assert_eq!(commands[0].command, "app");
    assert!((commands[0].share - 93.75).abs() < 1e-9);
    assert!((commands[0].runtime_share - 25.0).abs() < 1e-9);
    assert_eq!(commands[1].command, RUNTIME_COMM);
    assert!((runtime - 31.25).abs() < 1e-9);
}

#[test]
fn shares_weigh_the_period_and_zero_forgets_the_counts_not_the_tasks() {
    let img = fixture_image();
    let mut t = Top::new(Some(&img), BTreeMap::new());
    t.item(&Item::Task(task(1, "app", None)));
    t.sample(1, 1, sym(&img, "hot_gamma"), false, 30);
    for _ in 0..2 {
        t.sample(1, 1, sym(&img, "hot_alpha"), false, 10);
    }
    let rows = t.rows(&Filter::All);
    assert_eq!(rows[0].symbol, "hot_gamma", "30 beats 2 x 10");
    assert!((rows[0].share - 60.0).abs() < 1e-9);
    // A period of 0 still counts once.
    t.sample(1, 1, sym(&img, "hot_beta"), false, 0);
    assert_eq!(t.rows(&Filter::All)[2].period, 1);
    t.zero();
    assert_eq!(t.samples(), 0);
    assert!(t.rows(&Filter::All).is_empty());
    t.sample(1, 1, sym(&img, "hot_beta"), false, 1);
    assert_eq!(t.rows(&Filter::All)[0].command, "app", "the task is kept");
}

#[test]
fn the_named_threads_of_one_process_have_rows_of_their_own() {
    let img = fixture_image();
    let mut t = Top::new(Some(&img), BTreeMap::new());
    t.item(&Item::Task(task(1, "app", None)));
    // Two threads of process 1: one keeps the program's name, the other
    // names itself after it ran a little under it.
    t.item(&Item::Task(TaskInfo {
        tid: 2,
        ..task(1, "app", None)
    }));
    t.sample(1, 2, sym(&img, "hot_beta"), false, 1);
    t.item(&Item::Task(TaskInfo {
        tid: 2,
        time: 10,
        ..task(1, "worker-0", None)
    }));
    for _ in 0..3 {
        t.sample(1, 2, sym(&img, "hot_alpha"), false, 1);
    }
    for _ in 0..2 {
        t.sample(1, 1, sym(&img, "hot_alpha"), false, 1);
    }
    t.item(&Item::TaskExit {
        pid: 1,
        tid: 2,
        time: 20,
    });
    assert_eq!(
        table(&t.rows(&Filter::All)),
        [
            row("worker-0", "appliance.elf", false, "hot_alpha", 3),
            row("app", "appliance.elf", false, "hot_alpha", 2),
            row("app", "appliance.elf", false, "hot_beta", 1),
        ]
    );
    let (commands, _) = t.commands();
    let names: Vec<&str> = commands.iter().map(|c| c.command.as_str()).collect();
    assert_eq!(names, ["app", "worker-0"]);
}

#[test]
fn unknown_tasks_and_no_image_give_fallback_names_and_addresses() {
    let mut t = Top::new(None, BTreeMap::new());
    t.sample(7, 8, 0x40_1000, false, 1);
    t.sample(0, 0, 0xffff_8000_0000_1000, true, 1);
    assert_eq!(
        table(&t.rows(&Filter::All)),
        [
            row("perch-runtime", RUNTIME_DSO, true, "0xffff800000001000", 1),
            row("tid-8", "[unknown]", false, "0x401000", 1),
        ]
    );
}

#[test]
fn filters_select_one_command_or_the_runtime_code() {
    let t = counted();
    assert_eq!(
        t.filters(),
        [
            Filter::All,
            Filter::Command("app".into()),
            Filter::Command(RUNTIME_COMM.into()),
            Filter::Runtime
        ]
    );
    let app = t.rows(&Filter::Command("app".into()));
    assert_eq!(app.len(), 5);
    assert!(app.iter().all(|r| r.command == "app"));
    let rt = t.rows(&Filter::Runtime);
    assert_eq!(
        rt.iter().map(|r| r.symbol.as_str()).collect::<Vec<_>>(),
        ["runtime_syscall", "runtime_nmi_handler"]
    );
    // Shares stay shares of everything.
    assert!((rt[0].share - 25.0).abs() < 1e-9);
}

/// A function of this test binary to find in its own symbol table.
#[inline(never)]
fn top_test_marker_function(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_mul(3)
}

/// This process's mapping of its own executable that holds `addr`, as a
/// Task record's segment: (start, len, file offset).
fn own_segment(addr: u64) -> SegmentInfo {
    let exe = std::fs::canonicalize(std::env::current_exe().expect("current exe")).expect("exe");
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    for l in maps.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 6 || Path::new(f[5]) != exe {
            continue;
        }
        let (a, b) = f[0].split_once('-').expect("range");
        let a = u64::from_str_radix(a, 16).expect("start");
        let b = u64::from_str_radix(b, 16).expect("end");
        if (a..b).contains(&addr) {
            return SegmentInfo {
                start: a,
                len: b - a,
                file_offset: u64::from_str_radix(f[2], 16).expect("offset"),
                read: true,
                write: false,
                exec: true,
            };
        }
    }
    panic!("no mapping of {} holds {addr:#x}", exe.display());
}

#[test]
fn program_samples_resolve_in_the_program_file_wherever_it_was_loaded() {
    // The program is this test binary, "loaded" where the host loaded it
    // (a PIE: not at its link address), as a Task record describes it.
    let ip = top_test_marker_function as *const () as u64 + 1;
    assert_eq!(top_test_marker_function(2), 6);
    let seg = own_segment(ip);
    let exe = std::env::current_exe().expect("current exe");
    let build_id = kcore::elf::build_id(&std::fs::read(&exe).expect("exe")).map(<[u8]>::to_vec);
    let mut programs = BTreeMap::new();
    programs.insert("bin/app".to_owned(), exe.clone());
    let mut t = Top::new(None, programs);
    let info = |id: Vec<u8>| ProgramInfo {
        path: "/bin/app".into(),
        build_id: id,
        segments: vec![seg],
    };
    t.item(&Item::Task(task(
        3,
        "app",
        Some(info(build_id.clone().unwrap_or_default())),
    )));
    t.sample(3, 3, ip, false, 1);
    // Outside every executable segment: an address.
    t.sample(3, 3, 0x10, false, 1);
    let rows = t.rows(&Filter::All);
    let dso = exe.file_name().unwrap().to_string_lossy().into_owned();
    assert!(rows.iter().all(|r| r.dso == dso), "{rows:?}");
    assert!(
        rows.iter()
            .any(|r| r.symbol == "host_tool::top::tests::top_test_marker_function"),
        "{rows:?}"
    );
    assert!(rows.iter().any(|r| r.symbol == "0x10"), "{rows:?}");
    assert!(t.notes().is_empty(), "{:?}", t.notes());

    // Another build of the program (its build-id differs): addresses, and
    // a note that says why.
    let mut programs = BTreeMap::new();
    programs.insert("bin/app".to_owned(), exe);
    let mut t = Top::new(None, programs);
    t.item(&Item::Task(task(3, "app", Some(info(vec![0xab; 20])))));
    t.sample(3, 3, ip, false, 1);
    assert_eq!(t.rows(&Filter::All)[0].symbol, format!("{ip:#x}"));
    assert!(t.notes()[0].contains("abababab"), "{:?}", t.notes());

    // A program whose host file perch does not know.
    let mut t = Top::new(None, BTreeMap::new());
    t.item(&Item::Task(task(3, "app", Some(info(vec![])))));
    t.sample(3, 3, ip, false, 1);
    assert_eq!(t.rows(&Filter::All)[0].dso, "app");
    assert!(t.notes()[0].contains("does not know"), "{:?}", t.notes());
}

#[test]
fn rates_are_per_second_over_the_interval() {
    let a = Counters {
        samples: 100,
        lost: 2,
        throttles: 1,
        bytes: 4096,
        bad_frames: 0,
    };
    let b = Counters {
        samples: 1100,
        lost: 6,
        throttles: 2,
        bytes: 4096 + 2 * 40_000,
        bad_frames: 1,
    };
    let r = Rates::between(&a, &b, 2.0);
    assert_eq!(
        r,
        Rates {
            samples: 500.0,
            lost: 2.0,
            throttles: 0.5,
            bytes: 40_000.0
        }
    );
    assert_eq!(Rates::between(&a, &b, 0.0), Rates::default());
    assert_eq!(human_bytes(40_000.0), "39.1 KiB");
    assert_eq!(human_bytes(3.0 * 1024.0 * 1024.0), "3.0 MiB");
    assert_eq!(human_bytes(12.0), "12 B");
}

fn hello() -> Hello {
    Hello::for_test(
        EventSource::NmiClock,
        EventInfo::for_test(EventKind::CpuClock),
    )
}

#[test]
fn the_plain_table_has_a_status_the_commands_and_aligned_rows() {
    let mut t = counted();
    t.item(&Item::Hello(hello()));
    let frame = Frame {
        elapsed: Duration::from_millis(2500),
        totals: Counters {
            samples: 16,
            lost: 3,
            throttles: 1,
            bytes: 2048,
            bad_frames: 0,
        },
        rates: Rates {
            samples: 6.4,
            lost: 1.2,
            throttles: 0.4,
            bytes: 819.2,
        },
        event: t.event().map(str::to_owned),
        state: RunState::Stopped,
        commands: t.commands(),
        filter: Filter::All,
        rows: t.rows(&Filter::All),
        counted: t.samples(),
        notes: vec![],
    };
    let text = frame.render_table(3);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            "perch top: 2.5 s, event cpu-clock, stopped: 16 samples (6/s), 3 lost (1/s), 1 throttles (0.4/s), 2.0 KiB on the line (819 B/s), 0 bad frames",
            "commands: app 93.8% (25.0% runtime)  perch-runtime 6.2% (6.2% runtime)  | runtime code 31.2%",
            "Overhead    Samples  Command  Shared Object  Symbol",
            "  31.25%          5  app      appliance.elf  [.] hot_alpha",
            "  25.00%          4  app      [runtime]      [k] runtime_syscall",
            "  18.75%          3  app      appliance.elf  [.] hot_beta",
        ]
    );
    let empty = Frame::default().render_table(10);
    assert!(empty.ends_with("(no samples yet)\n"), "{empty}");
}

/// A display that records its frames and replays scripted keys.
#[derive(Default)]
struct Script {
    keys: std::collections::VecDeque<Key>,
    frames: Vec<Frame>,
    finished: Option<Frame>,
}

impl Display for Script {
    fn draw(&mut self, frame: &Frame) -> Result<(), HostError> {
        self.frames.push(frame.clone());
        Ok(())
    }
    fn key(&mut self) -> Result<Option<Key>, HostError> {
        Ok(self.keys.pop_front())
    }
    fn log(&mut self, _line: &str) -> bool {
        true
    }
    fn finish(&mut self, frame: &Frame) -> Result<(), HostError> {
        self.finished = Some(frame.clone());
        Ok(())
    }
}

#[test]
fn the_view_redraws_every_delay_steps_through_commands_and_stops_on_quit() {
    let img = fixture_image();
    let mut w = Watch::new(
        Script::default(),
        WatchOptions {
            delay: Duration::from_secs(1),
            zero: false,
        },
    );
    w.begin(Some(&img), &BTreeMap::new());
    let t0 = w.last.0;
    w.item(&Item::Task(task(1, "app", None)));
    w.top
        .as_mut()
        .unwrap()
        .sample(1, 1, sym(&img, "hot_alpha"), false, 1);
    let mut stats = StreamStats::default();
    stats.samples = 1;
    stats.bytes = 1000;
    let at = |ms| t0 + Duration::from_millis(ms);
    // The first tick draws at once; the next ones wait for the delay.
    assert!(w.tick_at(at(100), &stats).is_continue());
    assert_eq!(w.display().frames.len(), 1);
    assert!(w.tick_at(at(500), &stats).is_continue());
    assert_eq!(w.display().frames.len(), 1, "not before the delay");
    stats.samples = 3;
    stats.bytes = 3000;
    assert!(w.tick_at(at(1000), &stats).is_continue());
    let f = &w.display().frames[1];
    assert_eq!(f.rates.samples, 3.0);
    assert_eq!(f.rates.bytes, 3000.0);
    assert_eq!(f.rows[0].symbol, "hot_alpha");
    // A key redraws at once, with the next filter.
    w.display.keys.push_back(Key::NextFilter);
    assert!(w.tick_at(at(1100), &stats).is_continue());
    assert_eq!(w.display().frames.len(), 3);
    assert_eq!(w.display().frames[2].filter, Filter::Command("app".into()));
    w.display.keys.push_back(Key::PrevFilter);
    w.display.keys.push_back(Key::PrevFilter);
    assert!(w.tick_at(at(1200), &stats).is_continue());
    assert_eq!(w.display().frames.last().unwrap().filter, Filter::Runtime);
    w.display.keys.push_back(Key::Quit);
    assert!(w.tick_at(at(1300), &stats).is_break());
    assert!(w.stopped() && w.user_stopped());
    w.finish(&stats);
    let last = w.display().finished.as_ref().expect("a last frame");
    assert_eq!(last.state, RunState::Stopped);
    assert_eq!(last.totals.samples, 3);
}

#[test]
fn zero_counts_each_interval_afresh_and_end_marks_the_run_ended() {
    let img = fixture_image();
    let mut w = Watch::new(
        Script::default(),
        WatchOptions {
            delay: Duration::from_secs(1),
            zero: true,
        },
    );
    w.begin(Some(&img), &BTreeMap::new());
    let t0 = w.last.0;
    let stats = StreamStats::default();
    w.top
        .as_mut()
        .unwrap()
        .sample(0, 0, sym(&img, "runtime_entry"), true, 1);
    // The first frame, at once, does not zero: its interval is not over.
    assert!(w.tick_at(t0, &stats).is_continue());
    assert!(w.tick_at(t0 + Duration::from_secs(1), &stats).is_continue());
    assert_eq!(w.display().frames[0].counted, 1);
    assert_eq!(w.display().frames[1].counted, 1);
    w.top
        .as_mut()
        .unwrap()
        .sample(0, 0, sym(&img, "runtime_entry"), true, 1);
    w.item(&Item::End(Default::default()));
    assert!(w.tick_at(t0 + Duration::from_secs(2), &stats).is_continue());
    assert_eq!(
        w.display().frames[2].counted,
        1,
        "zeroed after the interval's frame"
    );
    assert_eq!(w.display().frames[2].state, RunState::Ended);
    assert!(!w.stopped());
}

#[test]
fn the_plain_display_writes_each_frame_as_a_table() {
    let mut p = Plain::new(Vec::new(), 2);
    let t = counted();
    let frame = Frame {
        commands: t.commands(),
        rows: t.rows(&Filter::All),
        ..Default::default()
    };
    p.draw(&frame).unwrap();
    p.finish(&frame).unwrap();
    assert!(p.log("a target line"), "the target's lines go to stderr");
    assert!(!p.immediate(), "no empty table at the start");
    let out = String::from_utf8(p.into_inner()).unwrap();
    assert_eq!(out.matches("perch top: ").count(), 2);
    assert_eq!(out.matches("[.] hot_alpha").count(), 2);
    assert!(!out.contains("hot_beta"), "two rows only:\n{out}");
}

#[test]
fn the_plain_view_prints_its_first_table_after_the_first_interval() {
    let img = fixture_image();
    let mut w = Watch::new(
        Plain::new(Vec::new(), 5),
        WatchOptions {
            delay: Duration::from_secs(1),
            zero: false,
        },
    );
    w.begin(Some(&img), &BTreeMap::new());
    let t0 = w.last.0;
    let stats = StreamStats::default();
    assert!(
        w.tick_at(t0 + Duration::from_millis(100), &stats)
            .is_continue()
    );
    assert!(w.display().out.is_empty(), "an empty table at the start");
    assert!(w.tick_at(t0 + Duration::from_secs(1), &stats).is_continue());
    let out = String::from_utf8(w.into_display().into_inner()).unwrap();
    assert_eq!(out.matches("perch top: ").count(), 1, "{out}");
}

#[test]
fn with_several_events_the_first_is_shown_and_named_with_the_others() {
    let img = fixture_image();
    let mut t = Top::new(Some(&img), BTreeMap::new());
    let mut h = Hello::for_test(EventSource::Pmu, EventInfo::for_test(EventKind::Hardware));
    let mut instructions = EventInfo::for_test(EventKind::Hardware);
    (instructions.id, instructions.config) = (1, 1);
    h.events.push(instructions);
    t.item(&Item::Hello(h));
    t.item(&Item::Task(task(1, "app", None)));
    let at = |name, event| SampleView {
        event,
        pid: 1,
        tid: 1,
        ip: sym(&img, name),
        user: true,
        period: 1,
        ..SampleView::default()
    };
    for _ in 0..3 {
        t.item(&Item::Sample(at("hot_alpha", 0)));
    }
    for _ in 0..5 {
        t.item(&Item::Sample(at("hot_beta", 1)));
    }
    assert_eq!(t.samples(), 3, "only the first event's samples count");
    assert_eq!(
        t.event(),
        Some("cycles (samples of the first of cycles, instructions)")
    );
    let rows = t.rows(&Filter::default());
    assert_eq!(rows.len(), 1, "{rows:?}");
}
