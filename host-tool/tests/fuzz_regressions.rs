//! Inputs the fuzz targets of `fuzz/` found, each kept as the bytes that
//! broke the code (an image, a stream), so the defect stays fixed without
//! the fuzzing tool.

#![forbid(unsafe_code)]

mod common;

use std::io::Cursor;

use common::fixture;
use host_tool::convert::{ConvertError, ConvertOptions, Converter};
use host_tool::image::Image;
use host_tool::perf_data::WriteError;
use host_tool::wire::Adapter;
use sampler::event::{EventConfig, EventKind, EventSource, PmuCaps, Sampling, UserRegsMode};
use sampler::wire::{CpuId, CpuVendor, Hello, Record};

/// The `image` target: the test appliance with symbol 9's `st_size` set to
/// `u64::MAX` (and a section header byte changed). Looking up an address
/// past that symbol's start overflowed `addr + size`.
#[test]
fn a_symbol_reaching_past_the_address_space_looks_up() {
    let mut elf = std::fs::read(fixture("appliance.elf")).unwrap();
    let patch: [(usize, u8); 13] = [
        (12562, 0xff),
        (12563, 0xff),
        (12564, 0xff),
        (12565, 0xff),
        (12566, 0xff),
        (12567, 0xff),
        (12568, 0xff),
        (12569, 0xff),
        (12800, 0x00),
        (12801, 0x14),
        (12802, 0x91),
        (12803, 0x0a),
        (12804, 0x00),
    ];
    for (at, b) in patch {
        elf[at] = b;
    }
    let image = Image::parse(&elf, "/fuzz/image.elf".into()).expect("the image still parses");
    let huge = image
        .symbols
        .iter()
        .find(|s| s.size > u64::MAX / 2)
        .unwrap_or_else(|| panic!("no huge symbol in {:#x?}", image.symbols))
        .clone();
    // Its start is inside it (the lookup computed `addr + size` there).
    assert_eq!(image.symbolize(huge.addr), Some(huge.name.as_str()));
    let _ = image.symbolize(u64::MAX);
    for s in &image.symbols {
        assert!(image.symbolize(s.addr).is_some());
        let _ = image.is_user_ip(s.addr);
    }
}

fn hello_with(kind: EventKind, config: u64, sample_type: u64) -> Hello {
    let pmu = PmuCaps {
        source: EventSource::Simulated,
        version: 255,
        gp_counters: 16,
        gp_width: 0,
        fixed_counters: 0,
        fixed_width: 0,
        pebs_format: None,
        pebs_xmm: false,
        lbr_format: None,
        lbr_depth: 127,
        max_sample_rate: 71841539986292752,
    };
    let cpu = CpuId {
        vendor: CpuVendor::Intel,
        family: 0,
        model: 140,
        stepping: 127,
    };
    let mut h = Hello::new(cpu, pmu);
    h.simulated = false;
    h.ncpus = 4294967040;
    h.tsc_hz = 71841539986358271;
    h.events
        .push(EventConfig {
            id: 0,
            kind,
            config,
            sampling: Sampling::Frequency(0),
            sample_type,
            regs_user: 0,
            regs_intr: 0,
            branch_sample_type: 0,
            exclude_user: false,
            exclude_kernel: false,
            precise: 0,
            max_stack: 0,
            user_regs_mode: UserRegsMode::AtInterrupt,
        })
        .unwrap();
    h
}

fn convert(h: Hello) -> Result<Vec<u8>, ConvertError> {
    let mut conv = Converter::new(Cursor::new(Vec::new()), ConvertOptions::default());
    Adapter::new().with_item(&Record::Hello(h), |item| conv.push(item))?;
    Ok(conv.finish()?.0.into_inner())
}

/// The `perf_data` target: a Hello declaring a hardware event with config
/// 255, which is no generic hardware event. The file written for it had an
/// attr perf_event_open would refuse, and linux-perf-data could not read
/// it ("Could not read PerfEventAttr"). Such events are now refused.
#[test]
fn an_event_perf_cannot_describe_is_refused() {
    for (kind, config, sample_type) in [
        (EventKind::Hardware, 255, 0),
        (EventKind::Hardware, 0x100, 0),
        (EventKind::CpuClock, 12, 0),
        // PERF_SAMPLE_READ, RAW: fields the writer does not lay out.
        (EventKind::Hardware, 0, 1 << 4),
        (EventKind::Raw, 0x1c2, 1 << 10),
    ] {
        match convert(hello_with(kind, config, sample_type)) {
            Err(ConvertError::Write(WriteError::BadEvent { id: 1, .. })) => {}
            other => panic!(
                "{kind:?} {config:#x} {sample_type:#x}: {:?}",
                other.map(|b| b.len())
            ),
        }
    }
    // The same event with a generic config is written, and reads back.
    for (kind, config) in [(EventKind::Hardware, 9), (EventKind::CpuClock, 0)] {
        let bytes = convert(hello_with(kind, config, 0)).expect("a valid event converts");
        let file = linux_perf_data::PerfFileReader::parse_file(Cursor::new(&bytes[..]))
            .expect("the file parses");
        assert_eq!(file.perf_file.event_attributes().len(), 1);
    }
}

/// The `perf_data` target: Lost records whose counts add up past
/// `u64::MAX` (the target's counts are not trusted) overflowed the
/// writer's loss counters; an End whose `delivered + lost` does the same
/// overflowed the converter's check of the target's counters. Both now
/// saturate, and the file still reads.
#[test]
fn loss_counts_past_u64_max_saturate() {
    use sampler::wire::{End, Lost, LostReason};
    let lost = |count, event| {
        Record::Lost(Lost {
            time: 8893104128,
            cpu: 0,
            event,
            count,
            reason: LostReason::RingFull,
        })
    };
    let records = [
        Record::Hello(hello_with(EventKind::Hardware, 0, 0)),
        lost(10146556976927081472, 2),
        lost(18409026431111467727, 3),
        Record::End(End {
            taken: 1,
            delivered: u64::MAX,
            lost: 2,
            ..End::default()
        }),
    ];
    let mut conv = Converter::new(Cursor::new(Vec::new()), ConvertOptions::default());
    let mut adapter = Adapter::new();
    for r in &records {
        adapter
            .with_item(r, |item| conv.push(item))
            .expect("the record converts");
    }
    let (out, summary) = conv.finish().expect("the stream converts");
    assert_eq!(summary.written.lost, u64::MAX);
    assert_eq!(summary.written.lost_samples, u64::MAX);
    assert!(
        summary
            .warnings
            .iter()
            .any(|w| w.contains("counters disagree"))
    );
    let bytes = out.into_inner();
    let reader = linux_perf_data::PerfFileReader::parse_file(Cursor::new(&bytes[..]))
        .expect("the file parses");
    assert_eq!(reader.perf_file.event_attributes().len(), 1);
}

/// The `perf_data` target (`fuzz/saved/perf_data/209f4dc8…` and two
/// more): an event whose `branch_sample_type` had `CALL_STACK` without
/// `BRANCH_STACK` in its `sample_type`. perf takes CALL_STACK to mean that
/// callchains come from the branch stack, and perf script 6.1 then read
/// the branch stack the samples do not have: SIGSEGV. A field whose sample
/// bit is clear is now written as 0, as perf record leaves it.
#[test]
fn branch_types_and_masks_without_their_sample_bit_are_written_as_zero() {
    use host_tool::perf_abi::misc;
    use host_tool::perf_data::{AttrSpec, FileMeta, PerfDataWriter, SampleRecord};
    use sampler::event::{branch_type, sample_type as st};
    use sampler::sample::PERF_CONTEXT_USER;
    let mut a = AttrSpec::cpu_clock(1, "cpu-clock", 1000);
    a.sample_type |= st::CALLCHAIN;
    a.branch_sample_type = branch_type::CALL_STACK | branch_type::ANY | branch_type::USER;
    a.regs_user = 0xffff_ff00_00b1_00f0;
    a.regs_intr = 0xff_0fff;
    let mut w =
        PerfDataWriter::new(Cursor::new(Vec::new()), vec![a]).expect("the event is written");
    w.comm(1, 1, "task", 0).unwrap();
    let chain = [PERF_CONTEXT_USER, 0x40_1000, 0x40_2000, 0x40_3000];
    for t in 1..4 {
        w.sample(&SampleRecord {
            ip: 0x40_1000,
            pid: 1,
            tid: 1,
            time: t,
            period: 1,
            misc: misc::USER,
            callchain: &chain,
            ..Default::default()
        })
        .unwrap();
    }
    let (out, _) = w
        .finish(&FileMeta {
            arch: "x86_64".into(),
            ..Default::default()
        })
        .unwrap();
    let bytes = out.into_inner();
    let file = linux_perf_data::PerfFileReader::parse_file(Cursor::new(&bytes[..]))
        .expect("the file parses");
    let attr = file.perf_file.event_attributes()[0].attributes();
    assert!(
        attr.branch_sample_format.is_empty(),
        "{:?}",
        attr.branch_sample_format
    );
    assert_eq!((attr.sample_regs_user, attr.sample_regs_intr), (0, 0));

    let path = std::env::temp_dir().join(format!("perch-branch-{}.data", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let out = std::process::Command::new("perf")
        .args(["script", "--force", "-F", "comm,tid,time,ip,sym", "-i"])
        .arg(&path)
        .output()
        .expect("perf is needed (Debian: apt-get install linux-perf)");
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "perf script: {} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).matches("task").count(),
        3,
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The rules of perf_event_open (and x86's `perf_reg_validate`) for the
/// fields that are sampled: a register mask names registers, no segment
/// register, no reserved bit, XMM only for a precise event's interrupt
/// registers; a branch_sample_type names a branch type and only defined
/// bits. The fuzz inputs above carried all of these.
#[test]
fn register_masks_and_branch_types_perf_event_open_refuses_are_refused() {
    use host_tool::perf_data::{AttrSpec, PerfDataWriter};
    use sampler::event::{branch_type, sample_type as st};
    let attr = |f: &dyn Fn(&mut AttrSpec)| {
        let mut a = AttrSpec::cpu_clock(1, "cpu-clock", 1000);
        f(&mut a);
        PerfDataWriter::new(Cursor::new(Vec::new()), vec![a]).map(|_| ())
    };
    type Case<'a> = (&'a str, &'a dyn Fn(&mut AttrSpec));
    let refused: [Case; 8] = [
        ("empty user mask", &|a| a.sample_type |= st::REGS_USER),
        ("segment register", &|a| {
            a.sample_type |= st::REGS_USER;
            a.regs_user = 1 << 12;
        }),
        ("reserved bit", &|a| {
            a.sample_type |= st::REGS_INTR;
            a.regs_intr = 0xff_0fff | 1 << 24;
        }),
        ("user XMM", &|a| {
            a.sample_type |= st::REGS_USER;
            a.regs_user = 0xff_0fff | 1 << 32;
        }),
        ("XMM of an imprecise event", &|a| {
            a.sample_type |= st::REGS_INTR;
            a.regs_intr = 0xff_0fff | 1 << 32;
        }),
        ("undefined branch bit", &|a| {
            a.sample_type |= st::BRANCH_STACK;
            a.branch_sample_type = branch_type::ANY | 1 << 19;
        }),
        ("privilege levels only", &|a| {
            a.sample_type |= st::BRANCH_STACK;
            a.branch_sample_type = branch_type::USER | branch_type::KERNEL;
        }),
        ("empty branch type", &|a| a.sample_type |= st::BRANCH_STACK),
    ];
    for (what, f) in refused {
        assert!(
            matches!(attr(f), Err(WriteError::BadEvent { .. })),
            "{what} was written"
        );
    }
    let accepted: [Case; 3] = [
        ("the GPRs", &|a| {
            a.sample_type |= st::REGS_USER | st::REGS_INTR;
            a.regs_user = 0xff_0fff;
            a.regs_intr = 0xff_0fff;
        }),
        ("PEBS XMM", &|a| {
            a.sample_type |= st::REGS_INTR;
            a.regs_intr = 0xff_0fff | 0xffff_ffff << 32;
            a.precise_ip = 2;
        }),
        ("branches", &|a| {
            a.sample_type |= st::BRANCH_STACK;
            a.branch_sample_type = branch_type::ANY | branch_type::USER | branch_type::HW_INDEX;
        }),
    ];
    for (what, f) in accepted {
        assert!(attr(f).is_ok(), "{what} was refused: {:?}", attr(f).err());
    }
}
