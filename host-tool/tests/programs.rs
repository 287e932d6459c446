//! The perf.data of loaded programs, read back with linux-perf-data: a
//! process's Task record with a program becomes its COMM, one MMAP2 per
//! executable segment (address, length, pgoff, prot, the program's host
//! path and build-id) and a BUILD_ID entry; a program without a build-id
//! gets an MMAP2 naming its file and no entry; an archive path perch has no
//! host file for is named as it is, with a warning.
#![forbid(unsafe_code)]

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use common::{fixture, hello};
use host_tool::convert::{ConvertOptions, Converter};
use host_tool::image::Image;
use host_tool::model::{Item, ProgramInfo, SampleView, SegmentInfo, TaskInfo, TaskOrigin};
use linux_perf_data::linux_perf_event_reader::{EventRecord, Mmap2FileId};
use linux_perf_data::{PerfFileReader, PerfFileRecord};

fn segment(start: u64, len: u64, off: u64, exec: bool) -> SegmentInfo {
    SegmentInfo {
        start,
        len,
        file_offset: off,
        read: true,
        write: !exec,
        exec,
    }
}

fn task(pid: u32, name: &str, path: &str, build_id: &[u8]) -> TaskInfo {
    TaskInfo {
        pid,
        tid: pid,
        name: name.into(),
        compat: false,
        time: 10,
        text: vec![],
        program: Some(ProgramInfo {
            path: path.into(),
            build_id: build_id.to_vec(),
            segments: vec![
                segment(0x40_0000, 0x1000, 0, false),
                segment(0x40_1000, 0x3000, 0x1000, true),
                segment(0x40_4000, 0x2000, 0x4000, false),
            ],
        }),
        origin: TaskOrigin::Named,
    }
}

/// (pid, address, length, pgoff, prot, build-id, path) of each MMAP2.
type Map = (i32, u64, u64, u64, u32, Option<Vec<u8>>, String);

#[test]
fn a_programs_task_becomes_comm_mmap2_and_build_id() {
    let image = Image::open(&fixture("appliance.elf")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let prog = dir.path().join("app");
    std::fs::write(&prog, b"stand-in").unwrap();
    let plain = dir.path().join("plain");
    std::fs::write(&plain, b"stand-in").unwrap();
    let mut programs: BTreeMap<String, PathBuf> = BTreeMap::new();
    programs.insert("bin/app".into(), prog.clone());
    programs.insert("bin/plain".into(), plain.clone());
    let out = dir.path().join("p.data");
    let mut conv = Converter::new(
        std::fs::File::create(&out).unwrap(),
        ConvertOptions {
            image: Some(image.clone()),
            cmdline: vec!["perch".into()],
            programs,
            kernel_file: None,
        },
    );
    conv.push(&Item::Hello(hello(&image))).unwrap();
    let id = [0x11u8; 20];
    // Two processes of one program at one address, one without a build-id,
    // one the host does not know.
    conv.push(&Item::Task(task(1, "one", "/bin/app", &id)))
        .unwrap();
    conv.push(&Item::Task(task(2, "two", "bin/app", &id)))
        .unwrap();
    conv.push(&Item::Task(task(3, "plain", "./bin/plain", &[])))
        .unwrap();
    conv.push(&Item::Task(task(4, "ghost", "bin/ghost", &[0x22; 20])))
        .unwrap();
    for pid in 1..=4 {
        conv.push(&Item::Sample(SampleView {
            pid,
            tid: pid,
            time: 100,
            ip: 0x40_1234,
            user: true,
            period: 1,
            ..Default::default()
        }))
        .unwrap();
    }
    let (_, summary) = conv.finish().unwrap();
    assert!(
        summary
            .warnings
            .iter()
            .any(|w| w.contains("ghost") && w.contains("bin/ghost")),
        "{:?}",
        summary.warnings
    );
    assert!(summary.tasks_without_record == 0);

    let reader = std::io::BufReader::new(std::fs::File::open(&out).unwrap());
    let PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = PerfFileReader::parse_file(reader).unwrap();
    let mut maps: Vec<Map> = Vec::new();
    let mut comms = Vec::new();
    while let Some(r) = record_iter.next_record(&mut perf_file).unwrap() {
        let PerfFileRecord::EventRecord { record, .. } = r else {
            continue;
        };
        match record.parse().unwrap() {
            EventRecord::Mmap2(m) => maps.push((
                m.pid,
                m.address,
                m.length,
                m.page_offset,
                m.protection,
                match m.file_id {
                    Mmap2FileId::BuildId(b) => Some(b),
                    Mmap2FileId::InodeAndVersion(_) => None,
                },
                String::from_utf8_lossy(&m.path.as_slice()).into_owned(),
            )),
            EventRecord::Comm(c) => comms.push((
                c.pid,
                String::from_utf8_lossy(&c.name.as_slice()).into_owned(),
            )),
            _ => {}
        }
    }
    let abs = |p: &std::path::Path| std::fs::canonicalize(p).unwrap().display().to_string();
    let want: Vec<Map> = vec![
        (
            1,
            0x40_1000,
            0x3000,
            0x1000,
            5,
            Some(id.to_vec()),
            abs(&prog),
        ),
        (
            2,
            0x40_1000,
            0x3000,
            0x1000,
            5,
            Some(id.to_vec()),
            abs(&prog),
        ),
        (3, 0x40_1000, 0x3000, 0x1000, 5, None, abs(&plain)),
        (
            4,
            0x40_1000,
            0x3000,
            0x1000,
            5,
            Some(vec![0x22; 20]),
            "/bin/ghost".into(),
        ),
    ];
    assert_eq!(maps, want);
    for (pid, name) in [(1, "one"), (2, "two"), (3, "plain"), (4, "ghost")] {
        assert!(comms.contains(&(pid, name.to_string())), "{comms:?}");
    }
    let ids = perf_file.build_ids().unwrap();
    let names: Vec<(String, Vec<u8>)> = ids
        .values()
        .map(|d| {
            (
                String::from_utf8_lossy(&d.path).into_owned(),
                d.build_id.clone(),
            )
        })
        .collect();
    assert!(
        names.contains(&(abs(&prog), id.to_vec())),
        "the program's BUILD_ID entry: {names:?}"
    );
    assert!(
        !names.iter().any(|(p, _)| *p == abs(&plain)),
        "an entry for a program without a build-id: {names:?}"
    );
    assert!(
        names.iter().any(|(p, _)| p == "[kernel.kallsyms]"),
        "{names:?}"
    );
}

#[test]
fn perch_stat_names_each_process_program() {
    let mut stats = host_tool::input::StreamStats::default();
    stats.observe(&Item::Task(task(2, "two", "bin/app", &[0xab, 0x01])));
    stats.observe(&Item::Task(task(3, "plain", "bin/plain", &[])));
    let text = stats.render();
    assert!(
        text.contains("\nprograms:\n     2 bin/app: build-id ab01, text 0x401000-0x404000\n     3 bin/plain: build-id (none), text 0x401000-0x404000\n"),
        "{text}"
    );
}
