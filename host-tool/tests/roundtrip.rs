//! perf.data written from a synthetic stream, read back with the
//! linux-perf-data crate: every field it exposes must match what went in.
#![forbid(unsafe_code)]

mod common;

use common::{DEMO_SAMPLE_TYPE, Demo, damage, demo_items, fixture, write_demo, xorshift};
use host_tool::image::Image;
use host_tool::model::Item;
use host_tool::perf_abi::{reg, sample};
use linux_perf_data::linux_perf_event_reader::{CpuMode, EventRecord};
use linux_perf_data::{DsoKey, PerfFileReader, PerfFileRecord};

#[test]
fn every_field_reads_back() {
    let image = Image::open(&fixture("appliance.elf")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("perf.data");
    let d = Demo {
        lost: 3,
        ..Demo::PLAIN
    };
    let summary = write_demo(&image, d, &path);
    assert_eq!(summary.written.samples, d.samples());
    assert_eq!(summary.written.lost, 3);
    assert_eq!(summary.wire_lost, 0);

    // What went in, in order.
    let mut want_samples = Vec::new();
    demo_items(&image, d, |item| {
        if let Item::Sample(s) = item {
            want_samples.push((
                s.ip,
                s.pid,
                s.time,
                s.user,
                s.callchain.to_vec(),
                s.regs_user_abi,
                s.regs_user.to_vec(),
                s.regs_intr.to_vec(),
            ));
        }
    });

    let reader = std::io::BufReader::new(std::fs::File::open(&path).unwrap());
    let PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = PerfFileReader::parse_file(reader).unwrap();

    let attrs = perf_file.event_attributes();
    assert_eq!(attrs.len(), 1);
    assert_eq!(attrs[0].name(), Some("cpu-clock"));
    assert_eq!(attrs[0].ids(), &[1]);
    let a = attrs[0].attributes();
    assert_eq!(
        a.sample_format.bits(),
        DEMO_SAMPLE_TYPE | sample::IDENTIFIER
    );
    assert_eq!(a.sample_regs_user, reg::GPR_MASK_64);
    assert_eq!(a.sample_regs_intr, reg::GPR_MASK_64);

    assert_eq!(perf_file.arch().unwrap(), Some("x86_64"));
    assert_eq!(perf_file.hostname().unwrap(), Some("appliance"));
    assert_eq!(
        perf_file.os_release().unwrap(),
        Some("perch-runtime (wire protocol 1)")
    );
    assert_eq!(
        perf_file.cpu_desc().unwrap(),
        Some("QEMU TCG x86_64 [no PMU: NMI clock (cpu-clock)]")
    );
    let nr = perf_file.nr_cpus().unwrap().unwrap();
    assert_eq!((nr.nr_cpus_available, nr.nr_cpus_online), (1, 1));
    // The one CPU's place: package "0", core "0", CPU 0 is core 0 of
    // socket 0, die "0", die 0.
    let topo = perf_file
        .feature_section_data(linux_perf_data::Feature::CPU_TOPOLOGY)
        .expect("a CPU_TOPOLOGY section");
    let list = |s: &str| {
        let mut v = 64u32.to_le_bytes().to_vec();
        v.extend_from_slice(s.as_bytes());
        v.resize(68, 0);
        v
    };
    let mut want = 1u32.to_le_bytes().to_vec();
    want.extend(list("0"));
    want.extend(1u32.to_le_bytes());
    want.extend(list("0"));
    want.extend([0u8; 8]);
    want.extend(1u32.to_le_bytes());
    want.extend(list("0"));
    want.extend([0u8; 4]);
    assert_eq!(topo, want);
    assert_eq!(
        perf_file.cmdline().unwrap().unwrap(),
        ["perch", "test", "[appliance: freq=1000 console=wire]"]
    );
    let range = perf_file.sample_time_range().unwrap().unwrap();
    assert_eq!(range.first_sample_time, want_samples[0].2);
    assert_eq!(range.last_sample_time, want_samples.last().unwrap().2);

    let ids = perf_file.build_ids().unwrap();
    let want_id = image.build_id.clone().unwrap();
    let kernel = ids.get(&DsoKey::Kernel).expect("kernel build-id");
    assert_eq!(kernel.build_id, want_id);
    let user = ids
        .values()
        .find(|i| i.path == image.path.to_str().unwrap().as_bytes())
        .expect("user build-id");
    assert_eq!(user.build_id, want_id);

    let mut comms = Vec::new();
    let mut mmaps = Vec::new();
    let mut samples = Vec::new();
    let mut lost = Vec::new();
    let mut exits = Vec::new();
    let mut reads = Vec::new();
    let mut lost_samples = 0;
    while let Some(rec) = record_iter.next_record(&mut perf_file).unwrap() {
        match rec {
            PerfFileRecord::EventRecord { attr_index, record } => {
                assert_eq!(attr_index, 0);
                if record.record_type.0 == 13 {
                    lost_samples += 1;
                    continue;
                }
                if record.record_type.0 == 8 {
                    // PERF_RECORD_READ: pid, tid, value (read_format 0).
                    let d = record.data.as_slice();
                    let u32_at = |o: usize| u32::from_le_bytes(d[o..o + 4].try_into().unwrap());
                    let value = u64::from_le_bytes(d[8..16].try_into().unwrap());
                    reads.push((u32_at(0), u32_at(4), value, exits.len()));
                    continue;
                }
                match record.parse().unwrap() {
                    EventRecord::Comm(c) => comms.push((
                        c.pid,
                        c.tid,
                        String::from_utf8_lossy(&c.name.as_slice()).into_owned(),
                    )),
                    EventRecord::Mmap(m) => mmaps.push((
                        m.pid,
                        m.address,
                        m.length,
                        m.page_offset,
                        m.cpu_mode,
                        String::from_utf8_lossy(&m.path.as_slice()).into_owned(),
                    )),
                    EventRecord::Sample(s) => {
                        let chain = s.callchain.unwrap();
                        let ur = s.user_regs.unwrap();
                        let ir = s.intr_regs.unwrap();
                        let bits: Vec<u64> = (0..24)
                            .filter(|b| reg::GPR_MASK_64 & (1 << b) != 0)
                            .collect();
                        samples.push((
                            s.ip.unwrap(),
                            s.pid.unwrap() as u32,
                            s.timestamp.unwrap(),
                            s.cpu_mode == CpuMode::User,
                            (0..chain.len())
                                .map(|i| chain.get(i).unwrap())
                                .collect::<Vec<_>>(),
                            bits.iter().map(|&b| ur.get(b).unwrap()).collect::<Vec<_>>(),
                            bits.iter().map(|&b| ir.get(b).unwrap()).collect::<Vec<_>>(),
                            s.tid.unwrap() as u32,
                            s.cpu.unwrap(),
                            s.period.unwrap(),
                        ));
                    }
                    EventRecord::Lost(l) => lost.push((l.id, l.count)),
                    EventRecord::Exit(e) => {
                        exits.push((e.pid, e.ppid, e.tid, e.ptid, e.timestamp, samples.len()))
                    }
                    other => panic!("unexpected record {other:?}"),
                }
            }
            PerfFileRecord::UserRecord(u) => assert_eq!(
                u.record_type,
                linux_perf_data::UserRecordType::PERF_FINISHED_ROUND
            ),
        }
    }
    assert_eq!(
        comms,
        [
            (0, 0, "perch-runtime".to_owned()),
            (1, 1, "app64".to_owned()),
            (2, 2, "compat32".to_owned())
        ]
    );
    let kernel_map = &mmaps[0];
    assert_eq!(kernel_map.0, -1);
    assert_eq!(kernel_map.1, image.kernel_start);
    assert_eq!(kernel_map.2, image.kernel_end - image.kernel_start);
    assert_eq!(kernel_map.3, image.ref_symbol.1);
    assert_eq!(kernel_map.4, CpuMode::Kernel);
    assert_eq!(kernel_map.5, "[kernel.kallsyms]_text");
    let ut = &image.user_text[0];
    let base = image.load_base.expect("the image has PT_LOAD segments");
    // Each task: the image's first page at file offset 0 (what hotspot's
    // parser maps the whole image from), then its task text.
    for (i, pid) in [(1, 1), (3, 2)] {
        let m = &mmaps[i];
        assert_eq!(
            (m.0, m.1, m.2, m.3, m.4),
            (pid, base, 0x1000, 0, CpuMode::User)
        );
        assert_eq!(m.5, image.path.to_str().unwrap());
        let m = &mmaps[i + 1];
        assert_eq!(
            (m.0, m.1, m.2, m.3, m.4),
            (pid, ut.addr, ut.size, ut.file_offset, CpuMode::User)
        );
        assert_eq!(m.5, image.path.to_str().unwrap());
    }
    assert_eq!(mmaps.len(), 5);
    assert_eq!(lost, [(1, 3)]);
    assert_eq!(lost_samples, 1);
    // Each task's count (the periods of its samples) just before its EXIT,
    // for `perf report -T`.
    assert_eq!(
        reads,
        [
            (2, 2, d.compat * 1_000_000, 0),
            (
                1,
                1,
                (d.alpha + d.beta + d.gamma + d.syscall) * 1_000_000,
                1
            )
        ]
    );
    // One EXIT a task (the repeated end is not written again), after all
    // the samples, its parent the runtime.
    let last = want_samples.last().unwrap().2;
    assert_eq!(
        exits,
        [
            (2, 0, 2, 0, last + 1_000_000, want_samples.len()),
            (1, 0, 1, 0, last + 2_000_000, want_samples.len())
        ]
    );
    assert_eq!(samples.len(), want_samples.len());
    for (got, want) in samples.iter().zip(&want_samples) {
        assert_eq!(got.0, want.0, "ip");
        assert_eq!(got.1, want.1, "pid");
        assert_eq!(got.7, want.1, "tid");
        assert_eq!(got.2, want.2, "time");
        assert_eq!(got.3, want.3, "cpumode");
        assert_eq!(got.4, want.4, "callchain");
        assert_eq!(got.5, want.6, "user regs");
        assert_eq!(got.6, want.7, "intr regs");
        assert_eq!((got.8, got.9), (0, 1_000_000), "cpu, period");
    }
}

#[test]
fn wrong_image_for_the_stream_is_refused() {
    use host_tool::convert::{ConvertError, ConvertOptions, Converter};
    let image = Image::open(&fixture("appliance.elf")).unwrap();
    let other = Image::open(&fixture("other.elf")).unwrap();
    assert_ne!(image.build_id, other.build_id);
    let mut conv = Converter::new(
        std::io::Cursor::new(Vec::new()),
        ConvertOptions {
            image: Some(other),
            cmdline: vec![],
            programs: Default::default(),
            kernel_file: None,
        },
    );
    let err = conv.push(&Item::Hello(common::hello(&image))).unwrap_err();
    assert!(matches!(err, ConvertError::WrongImage { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&image.build_id_hex().unwrap()) && msg.contains("other.elf"),
        "{msg}"
    );
}

#[test]
fn unreported_losses_are_written_so_the_file_adds_up() {
    use host_tool::convert::{ConvertOptions, Converter};
    let image = Image::open(&fixture("appliance.elf")).unwrap();
    let mut conv = Converter::new(
        std::io::Cursor::new(Vec::new()),
        ConvertOptions {
            image: Some(image.clone()),
            cmdline: vec![],
            programs: Default::default(),
            kernel_file: None,
        },
    );
    // Drop every third sample as if its frame was damaged on the wire, and
    // the Lost record too; End still says what the target did.
    let mut n = 0;
    demo_items(
        &image,
        Demo {
            lost: 4,
            ..Demo::PLAIN
        },
        |item| match item {
            Item::Sample(_) => {
                n += 1;
                if n % 3 != 0 {
                    conv.push(item).unwrap();
                }
            }
            Item::Lost { .. } => {}
            other => conv.push(other).unwrap(),
        },
    );
    let (_, s) = conv.finish().unwrap();
    let end = s.end.unwrap();
    assert_eq!(end.taken, Demo::PLAIN.samples() + 4);
    assert_eq!(s.wire_lost, Demo::PLAIN.samples() / 3);
    assert_eq!(s.written.samples + s.written.lost_samples, end.taken);
    // The target's own losses are LOST (and LOST_SAMPLES); wire losses
    // LOST_SAMPLES only, so perf does not call them an overload.
    assert_eq!(s.written.lost, 4);
    assert_eq!(s.written.lost_samples, 4 + s.wire_lost);
}

#[test]
fn mutated_streams_never_panic_and_still_add_up() {
    use host_tool::convert::{ConvertOptions, Converter};
    use host_tool::input::Pump;
    use host_tool::synth::{SynthConfig, write_capture};
    let image = Image::open(&fixture("appliance.elf")).unwrap();
    let mut clean = Vec::new();
    let cfg = SynthConfig {
        samples: 3000,
        lost: 5,
        ..Default::default()
    };
    write_capture(Some(&image), &cfg, &mut clean).unwrap();
    let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
    for round in 0..20 {
        let mut bytes = clean.clone();
        // Flip, drop or insert bytes after the Hello (the first 300 bytes).
        damage(&mut bytes, 300, 1 + round * 3, &mut next);
        let mut conv = Converter::new(
            std::io::Cursor::new(Vec::new()),
            ConvertOptions {
                image: Some(image.clone()),
                cmdline: vec![],
                programs: Default::default(),
                kernel_file: None,
            },
        );
        let mut pump = Pump::new();
        // Feed in odd-sized chunks to exercise frame reassembly.
        for chunk in bytes.chunks(997) {
            pump.feed(chunk, &mut |item| conv.push(item).map_err(Into::into))
                .unwrap();
        }
        let bad = pump.stats.decoder.bad_frames;
        assert!(bad >= 1, "round {round}: mutations went unnoticed");
        let (_, s) = conv.finish().unwrap();
        if let Some(end) = s.end {
            // Whatever was damaged, the file accounts for every sample taken.
            assert_eq!(
                s.written.samples + s.written.lost_samples,
                end.taken,
                "round {round}"
            );
        }
    }
}
