//! `perf script` reads every perf.data the `perf_data` fuzz target's saved
//! corpus (`fuzz/saved/perf_data`) makes the writer produce: each input is
//! turned into records and converted exactly as in the target, and perf
//! must print its samples without an error or a warning about the file.

use std::path::Path;
use std::process::Command;

use linux_perf_data::linux_perf_event_reader::SampleFormat;
use perch_fuzz_input::perf::Case;

#[test]
fn perf_script_reads_the_saved_corpus() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../saved/perf_data");
    let mut inputs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    inputs.sort();
    assert!(!inputs.is_empty(), "{} holds no inputs", dir.display());
    let perf = Command::new("perf").arg("--version").output();
    assert!(
        perf.is_ok_and(|o| o.status.success()),
        "perf is needed (Debian: apt-get install linux-perf)"
    );

    let tmp = std::env::temp_dir().join(format!("perch-fuzz-perf-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let (mut files, mut samples) = (0u64, 0u64);
    for input in &inputs {
        let data = std::fs::read(input).unwrap();
        let Ok(case) = Case::from_bytes(&data) else {
            continue;
        };
        let Ok((bytes, summary)) = case.convert() else {
            continue;
        };
        let file = tmp.join("perf.data");
        std::fs::write(&file, &bytes).unwrap();
        // perf script refuses to print fields an attr does not sample.
        let reader = linux_perf_data::PerfFileReader::parse_file(std::io::Cursor::new(&bytes[..]))
            .expect("the file parses");
        let all_have = |bit: SampleFormat| {
            reader
                .perf_file
                .event_attributes()
                .iter()
                .all(|a| a.attributes().sample_format.contains(bit))
        };
        let mut fields = String::from("comm,tid,time,event");
        if all_have(SampleFormat::IP) {
            fields.push_str(",ip,sym");
        }
        if all_have(SampleFormat::PERIOD) {
            fields.push_str(",period");
        }
        let out = Command::new("perf")
            .args(["script", "--force", "-F", &fields, "-i"])
            .arg(&file)
            .output()
            .expect("running perf script");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "perf script failed ({}) on the file from {}: {stderr}",
            out.status,
            input.display()
        );
        for bad in [
            "corrupt",
            "Error",
            "error",
            "not supported",
            "Can't",
            "invalid",
        ] {
            assert!(
                !stderr.contains(bad),
                "perf script complained about the file from {}: {stderr}",
                input.display()
            );
        }
        let lines = String::from_utf8_lossy(&out.stdout).lines().count() as u64;
        assert!(
            lines >= summary.written.samples,
            "perf script printed {lines} lines for {} samples (input {})",
            summary.written.samples,
            input.display()
        );
        files += 1;
        samples += summary.written.samples;
    }
    std::fs::remove_dir_all(&tmp).unwrap();
    println!("perf script read {files} files with {samples} samples");
    assert!(files > 0, "no saved input converted to a file");
    assert!(samples > 0, "no saved input produced a sample");
}
