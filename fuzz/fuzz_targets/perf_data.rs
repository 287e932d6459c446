//! The perf.data writer, driven by decoded record sequences through the
//! converter `perch record` uses: whenever it produces a file, that file
//! parses with the `linux-perf-data` crate, every record in it parses
//! against its attr, and it holds exactly the samples, losses and rounds
//! the writer counted. (linux-perf-event-reader 0.10 does not know
//! PERF_SAMPLE_WEIGHT_STRUCT: it reads a weight word only for WEIGHT, so
//! the samples of an attr with WEIGHT_STRUCT alone are counted by their
//! header here and read in full by perf in the corpus test.) (`perf script` reading these files is checked over
//! the saved corpus by `fuzz/input/tests/perf_script.rs`, not here.)

#![no_main]

use libfuzzer_sys::fuzz_target;
use linux_perf_data::linux_perf_event_reader::{EventRecord, SampleFormat};
use linux_perf_data::{PerfFileReader, PerfFileRecord, UserRecordType};
use perch_fuzz_input::perf::Case;

fuzz_target!(|data: &[u8]| {
    let Ok(case) = Case::from_bytes(data) else {
        return;
    };
    let Ok((bytes, summary)) = case.convert() else {
        return;
    };
    let PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = PerfFileReader::parse_file(std::io::Cursor::new(&bytes[..]))
        .unwrap_or_else(|e| panic!("the written perf.data does not parse: {e}"));
    let weight_struct: Vec<bool> = perf_file
        .event_attributes()
        .iter()
        .map(|a| {
            let f = a.attributes().sample_format;
            f.contains(SampleFormat::WEIGHT_STRUCT) && !f.contains(SampleFormat::WEIGHT)
        })
        .collect();
    let attrs = weight_struct.len();
    assert!(attrs >= 1);
    let (mut samples, mut lost, mut rounds) = (0u64, 0u64, 0u64);
    while let Some(rec) = record_iter
        .next_record(&mut perf_file)
        .unwrap_or_else(|e| panic!("a record of the written perf.data does not read: {e}"))
    {
        match rec {
            PerfFileRecord::EventRecord { attr_index, record } => {
                assert!(attr_index < attrs);
                // LOST_SAMPLES (13) is not parsed by the crate.
                if record.record_type.0 == 13 {
                    continue;
                }
                if record.record_type.0 == 9 && weight_struct[attr_index] {
                    samples += 1;
                    continue;
                }
                match record.parse().unwrap_or_else(|e| {
                    panic!("record {:?} does not parse: {e}", record.record_type)
                }) {
                    EventRecord::Sample(_) => samples += 1,
                    EventRecord::Lost(l) => lost = lost.saturating_add(l.count),
                    _ => {}
                }
            }
            PerfFileRecord::UserRecord(u) => {
                if u.record_type == UserRecordType::PERF_FINISHED_ROUND {
                    rounds += 1;
                }
            }
        }
    }
    assert_eq!(samples, summary.written.samples);
    assert_eq!(lost, summary.written.lost);
    assert_eq!(rounds, summary.written.rounds);
});
