//! pprof output: the gzipped profile.proto that Pyroscope, Parca, Grafana
//! and `go tool pprof` read, built from the same decoded stream as
//! perf.data (fed item by item beside the [`Converter`](crate::convert::Converter)).
//!
//! Sample types: `samples/count` first, then one per event: `cpu/nanoseconds`
//! for the NMI clock (its period is in ns), the event's own name in
//! `count` for a PMU event (`cycles/count`). Each location carries its
//! function, file, line and inlined frames ([`crate::symbolize`]); each
//! mapping the file's path and build-id (the runtime image, each program's
//! host file); each sample the labels `comm`, `pid`, `tid` and `cpu`
//! (threads of one process stay apart).

pub mod proto;

use std::collections::{BTreeMap, HashMap};
use std::io::Write;

use prost::Message;
use sampler::sample::CpuMode;
use sampler::wire::SampleParts;

use crate::convert::{ConvertOptions, RUNTIME_COMM, hex};
use crate::model::{EventKind, Hello, Item, TaskInfo};
use crate::symbolize::{ChainFrame, Region, Symbolizer, chain_frames};

/// What a finished profile holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PprofSummary {
    /// Samples taken in.
    pub samples: u64,
    /// Distinct stacks with labels (pprof samples).
    pub stacks: usize,
    /// Locations.
    pub locations: usize,
    /// Mappings.
    pub mappings: usize,
    /// Files that gave no symbols, and why.
    pub problems: Vec<String>,
}

/// Why no profile could be built.
#[derive(Debug, thiserror::Error)]
pub enum PprofError {
    /// The stream never said Hello.
    #[error("the stream has no Hello record: there is nothing to profile")]
    NoHello,
    /// Writing failed.
    #[error("writing the pprof profile: {0}")]
    Io(#[from] std::io::Error),
}

/// What keeps pprof samples apart: the stack's location ids, then the
/// `comm` label's string index, pid, tid and CPU.
type SampleKey = (Vec<u64>, i64, u32, u32, u32);

/// Builds a pprof profile from stream items.
pub struct PprofBuilder {
    options: ConvertOptions,
    time_nanos: i64,
    hello: Option<Hello>,
    /// Declared event ids, in Hello order.
    events: Vec<u32>,
    sym: Symbolizer,
    names: HashMap<(u32, u32), String>,
    strings: Vec<String>,
    string_ids: HashMap<String, i64>,
    mappings: Vec<proto::Mapping>,
    mapping_ids: HashMap<(usize, u64, u64, u64), u64>,
    functions: Vec<proto::Function>,
    function_ids: HashMap<(i64, i64), u64>,
    locations: Vec<proto::Location>,
    /// (mapping id or 0, address, leaf) to location id.
    location_ids: HashMap<(u64, u64, bool), u64>,
    /// (location ids leaf first, comm string, pid, cpu) to values.
    samples: HashMap<SampleKey, Vec<i64>>,
    raw: Vec<ChainFrame>,
    first_time: Option<u64>,
    last_time: u64,
    taken: u64,
}

impl PprofBuilder {
    /// A builder resolving with `options`' image and programs;
    /// `ended_nanos` is when the recording ended (ns since the epoch: now
    /// for a live run, the capture's modification time for a saved one),
    /// from which the profile's start time is reckoned back.
    pub fn new(options: &ConvertOptions, ended_nanos: i64) -> PprofBuilder {
        let sym = Symbolizer::new(options.image.as_ref());
        let mut b = PprofBuilder {
            options: options.clone(),
            time_nanos: ended_nanos,
            hello: None,
            events: Vec::new(),
            sym,
            names: HashMap::new(),
            strings: Vec::new(),
            string_ids: HashMap::new(),
            mappings: Vec::new(),
            mapping_ids: HashMap::new(),
            functions: Vec::new(),
            function_ids: HashMap::new(),
            locations: Vec::new(),
            location_ids: HashMap::new(),
            samples: HashMap::new(),
            raw: Vec::with_capacity(128),
            first_time: None,
            last_time: 0,
            taken: 0,
        };
        b.string("");
        b
    }

    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.string_ids.get(s) {
            return i;
        }
        let i = self.strings.len() as i64;
        self.strings.push(s.to_owned());
        self.string_ids.insert(s.to_owned(), i);
        i
    }

    /// Takes one stream item (the Hello, tasks and samples matter).
    pub fn push(&mut self, item: &Item<'_>) {
        match item {
            Item::Hello(h) if self.hello.is_none() => {
                self.events = h.events.iter().map(|e| e.id).collect();
                self.hello = Some(h.clone());
            }
            Item::Task(t) => self.on_task(t),
            Item::Sample(s) => {
                self.raw.clear();
                chain_frames(&mut self.raw, s.ip, s.user, s.callchain.iter().copied());
                self.on_sample(s.event, s.pid, s.tid, s.cpu, s.time, s.period);
            }
            _ => {}
        }
    }

    /// Takes one sample in the decoder's parts, as
    /// [`Converter::push_parts`](crate::convert::Converter::push_parts) does.
    pub fn push_parts(&mut self, s: &SampleParts<'_>) {
        self.raw.clear();
        chain_frames(
            &mut self.raw,
            s.ip(),
            s.cpumode() == CpuMode::User,
            s.callchain(),
        );
        self.on_sample(s.event(), s.pid(), s.tid(), s.cpu(), s.time(), s.period());
    }

    fn on_task(&mut self, t: &TaskInfo) {
        self.names.insert((t.pid, t.tid), t.name.clone());
        self.sym
            .map_task(t, self.options.image.as_ref(), &self.options.programs);
    }

    fn on_sample(&mut self, event: u32, pid: u32, tid: u32, cpu: u32, time: u64, period: u64) {
        let Some(ev) = self.events.iter().position(|&e| e == event) else {
            return;
        };
        self.taken += 1;
        self.first_time = Some(self.first_time.map_or(time, |t| t.min(time)));
        self.last_time = self.last_time.max(time);
        let comm = match self.names.get(&(pid, tid)) {
            Some(n) => n.clone(),
            None if pid == 0 => RUNTIME_COMM.to_owned(),
            None => format!("tid-{tid}"),
        };
        let comm = self.string(&comm);
        let raw = std::mem::take(&mut self.raw);
        let locs: Vec<u64> = raw.iter().map(|f| self.location(pid, *f)).collect();
        self.raw = raw;
        let n = self.events.len();
        let values = self
            .samples
            .entry((locs, comm, pid, tid, cpu))
            .or_insert_with(|| vec![0; 1 + n]);
        values[0] += 1;
        values[1 + ev] = values[1 + ev].saturating_add(i64::try_from(period).unwrap_or(i64::MAX));
    }

    fn mapping(&mut self, r: &Region) -> u64 {
        let key = (r.dso, r.start, r.end, r.pgoff);
        if let Some(&id) = self.mapping_ids.get(&key) {
            return id;
        }
        let dso = self.sym.dso(r.dso);
        let (path, build_id, symbols) = (
            dso.path.display().to_string(),
            dso.build_id.as_deref().map(hex).unwrap_or_default(),
            dso.has_symbols(),
        );
        let filename = self.string(&path);
        let build_id = self.string(&build_id);
        let id = self.mappings.len() as u64 + 1;
        self.mappings.push(proto::Mapping {
            id,
            memory_start: r.start,
            memory_limit: r.end,
            file_offset: r.pgoff,
            filename,
            build_id,
            has_functions: symbols,
            has_filenames: symbols,
            has_line_numbers: symbols,
            has_inline_frames: symbols,
        });
        self.mapping_ids.insert(key, id);
        id
    }

    fn function(&mut self, name: &str, file: &str) -> u64 {
        let (n, f) = (self.string(name), self.string(file));
        if let Some(&id) = self.function_ids.get(&(n, f)) {
            return id;
        }
        let id = self.functions.len() as u64 + 1;
        self.functions.push(proto::Function {
            id,
            name: n,
            system_name: n,
            filename: f,
            start_line: 0,
        });
        self.function_ids.insert((n, f), id);
        id
    }

    fn location(&mut self, pid: u32, f: ChainFrame) -> u64 {
        let region = self.sym.region(pid, f.addr, f.kernel);
        let mapping_id = match &region {
            Some(r) => self.mapping(r),
            None => 0,
        };
        let key = (mapping_id, f.addr, f.leaf);
        if let Some(&id) = self.location_ids.get(&key) {
            return id;
        }
        let resolved = self.sym.resolve(pid, f.addr, f.kernel, f.leaf);
        let mut lines = Vec::with_capacity(resolved.frames.len().max(1));
        for fr in resolved.frames.iter() {
            let function_id = self.function(&fr.function, fr.file.as_deref().unwrap_or(""));
            lines.push(proto::Line {
                function_id,
                line: i64::from(fr.line),
                column: 0,
            });
        }
        if lines.is_empty() {
            // Unsymbolised: named by its address (and the runtime's marked,
            // as in the flamegraphs), so that the sample still counts.
            let name = if f.kernel {
                format!("{:#x}_[k]", f.addr)
            } else {
                format!("{:#x}", f.addr)
            };
            let function_id = self.function(&name, "");
            lines.push(proto::Line {
                function_id,
                line: 0,
                column: 0,
            });
        }
        let id = self.locations.len() as u64 + 1;
        self.locations.push(proto::Location {
            id,
            mapping_id,
            address: f.addr,
            line: lines,
            is_folded: false,
        });
        self.location_ids.insert(key, id);
        id
    }

    /// The profile (`PprofError::NoHello` without a Hello).
    pub fn finish(mut self) -> Result<(proto::Profile, PprofSummary), PprofError> {
        let h = self.hello.take().ok_or(PprofError::NoHello)?;
        let mut sample_type = vec![proto::ValueType {
            r#type: self.string("samples"),
            unit: self.string("count"),
        }];
        for e in &h.events {
            let (name, unit) = match e.kind {
                EventKind::CpuClock => ("cpu".to_owned(), "nanoseconds"),
                // Without perf's `:p` modifiers: Pyroscope and Parca take
                // `:` as the separator of a profile type's parts.
                _ => {
                    let name = e.perf_name(h.source);
                    let base = name.split(':').next().unwrap_or_default().to_owned();
                    (base, "count")
                }
            };
            sample_type.push(proto::ValueType {
                r#type: self.string(&name),
                unit: self.string(unit),
            });
        }
        let (period_type, period) = match h.events.first() {
            Some(e) => {
                let period = match (e.kind, e.freq) {
                    (EventKind::CpuClock, true) if e.period_or_freq > 0 => {
                        1_000_000_000 / e.period_or_freq
                    }
                    (_, false) => e.period_or_freq,
                    _ => 0,
                };
                (sample_type.get(1).cloned(), period)
            }
            None => (None, 0),
        };
        let default_sample_type = sample_type.get(1).map_or(0, |t| t.r#type);
        let mut comments = Vec::new();
        if !self.options.cmdline.is_empty() {
            let c = self.options.cmdline.join(" ");
            comments.push(self.string(&c));
        }
        if !h.cmdline.is_empty() {
            let c = format!("appliance: {}", h.cmdline);
            comments.push(self.string(&c));
        }
        let c = format!("cpu: {}", h.cpu_desc);
        comments.push(self.string(&c));
        // String labels, which every consumer takes as series labels (pprof
        // drops a numeric label of value 0, so pid 0 and CPU 0 would vanish).
        let keys = (
            self.string("comm"),
            self.string("pid"),
            self.string("tid"),
            self.string("cpu"),
        );
        // Stable output: samples in the order of their stacks and labels.
        let samples: BTreeMap<_, _> = std::mem::take(&mut self.samples).into_iter().collect();
        let mut sample = Vec::with_capacity(samples.len());
        for ((locs, comm, pid, tid, cpu), value) in samples {
            let label = |key, str| proto::Label {
                key,
                str,
                ..Default::default()
            };
            let (pid, tid, cpu) = (
                self.string(&pid.to_string()),
                self.string(&tid.to_string()),
                self.string(&cpu.to_string()),
            );
            sample.push(proto::Sample {
                location_id: locs,
                value,
                label: vec![
                    label(keys.0, comm),
                    label(keys.1, pid),
                    label(keys.2, tid),
                    label(keys.3, cpu),
                ],
            });
        }
        let summary = PprofSummary {
            samples: self.taken,
            stacks: sample.len(),
            locations: self.locations.len(),
            mappings: self.mappings.len(),
            problems: self
                .sym
                .dsos()
                .iter()
                .filter_map(|d| d.problem.clone())
                .collect(),
        };
        let duration = self
            .first_time
            .map_or(0, |f| self.last_time.saturating_sub(f));
        let profile = proto::Profile {
            sample_type,
            sample,
            mapping: self.mappings,
            location: self.locations,
            function: self.functions,
            string_table: self.strings,
            drop_frames: 0,
            keep_frames: 0,
            time_nanos: self
                .time_nanos
                .saturating_sub(i64::try_from(duration).unwrap_or(0)),
            duration_nanos: i64::try_from(duration).unwrap_or(i64::MAX),
            period_type,
            period: i64::try_from(period).unwrap_or(i64::MAX),
            comment: comments,
            default_sample_type,
        };
        Ok((profile, summary))
    }
}

/// Writes `profile` gzipped, as pprof files are.
pub fn write_gz(profile: &proto::Profile, out: impl Write) -> std::io::Result<()> {
    let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
    gz.write_all(&profile.encode_to_vec())?;
    gz.finish()?.flush()
}

/// Reads a profile written by [`write_gz`] (or any gzipped or plain
/// profile.proto).
pub fn read(bytes: &[u8]) -> Result<proto::Profile, String> {
    let raw = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(bytes), &mut v)
            .map_err(|e| format!("not a gzip stream: {e}"))?;
        v
    } else {
        bytes.to_vec()
    };
    proto::Profile::decode(&raw[..]).map_err(|e| format!("not a profile.proto: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{EventInfo, EventSource, SampleView};
    use crate::perf_abi::context;

    fn hello(kind: EventKind) -> Hello {
        Hello::for_test(EventSource::NmiClock, EventInfo::for_test(kind))
    }

    fn task(pid: u32, name: &str) -> TaskInfo {
        TaskInfo {
            pid,
            tid: pid,
            name: name.into(),
            compat: false,
            time: 0,
            text: vec![],
            program: None,
            origin: crate::model::TaskOrigin::Named,
        }
    }

    /// The string at index `i`.
    fn s(p: &proto::Profile, i: i64) -> &str {
        &p.string_table[i as usize]
    }

    #[test]
    fn samples_fold_into_stacks_with_labels_and_both_values() {
        let mut b = PprofBuilder::new(&ConvertOptions::default(), 25);
        b.push(&Item::Hello(hello(EventKind::CpuClock)));
        b.push(&Item::Task(task(1, "app")));
        let chain = [context::KERNEL, 0x10, context::USER, 0x30, 0x40];
        let smp = SampleView {
            pid: 1,
            tid: 1,
            cpu: 0,
            ip: 0x10,
            period: 1_000_000,
            time: 10,
            callchain: &chain,
            ..Default::default()
        };
        b.push(&Item::Sample(smp));
        b.push(&Item::Sample(SampleView { time: 30, ..smp }));
        b.push(&Item::Sample(SampleView {
            pid: 2,
            tid: 2,
            cpu: 1,
            ip: 0x50,
            user: true,
            period: 7,
            time: 20,
            ..Default::default()
        }));
        let (p, sum) = b.finish().expect("a profile");
        assert_eq!(sum.samples, 3);
        assert_eq!(p.string_table[0], "");
        let types: Vec<(&str, &str)> = p
            .sample_type
            .iter()
            .map(|t| (s(&p, t.r#type), s(&p, t.unit)))
            .collect();
        assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
        assert_eq!(s(&p, p.default_sample_type), "cpu");
        assert_eq!(p.period, 1_000_000);
        assert_eq!(p.duration_nanos, 20);
        assert_eq!(
            p.time_nanos, 5,
            "the end time minus the 20 ns the samples span"
        );
        assert_eq!(p.sample.len(), 2);
        let app = p
            .sample
            .iter()
            .find(|x| x.label.iter().any(|l| s(&p, l.str) == "app"))
            .expect("app's stack");
        assert_eq!(app.value, [2, 2_000_000]);
        // Leaf first: 0x10 (runtime), 0x30, 0x40; unsymbolised frames are
        // named by address, the runtime's marked.
        let names: Vec<&str> = app
            .location_id
            .iter()
            .map(|&id| {
                let l = &p.location[id as usize - 1];
                let f = &p.function[l.line[0].function_id as usize - 1];
                s(&p, f.name)
            })
            .collect();
        assert_eq!(names, ["0x10_[k]", "0x30", "0x40"]);
        let other = p.sample.iter().find(|x| x != &app).expect("tid-2's stack");
        assert_eq!(other.value, [1, 7]);
        let labels: Vec<(&str, &str)> = other
            .label
            .iter()
            .map(|l| (s(&p, l.key), s(&p, l.str)))
            .collect();
        assert_eq!(
            labels,
            [("comm", "tid-2"), ("pid", "2"), ("tid", "2"), ("cpu", "1")]
        );
    }

    #[test]
    fn threads_of_one_process_stay_apart_with_their_names() {
        let mut b = PprofBuilder::new(&ConvertOptions::default(), 25);
        b.push(&Item::Hello(hello(EventKind::CpuClock)));
        b.push(&Item::Task(task(1, "app")));
        b.push(&Item::Task(TaskInfo {
            tid: 2,
            ..task(1, "worker-0")
        }));
        let chain = [context::USER, 0x30, 0x40];
        let smp = SampleView {
            pid: 1,
            tid: 1,
            ip: 0x30,
            user: true,
            period: 1,
            time: 10,
            callchain: &chain,
            ..Default::default()
        };
        b.push(&Item::Sample(smp));
        b.push(&Item::Sample(SampleView { tid: 2, ..smp }));
        let (p, _) = b.finish().expect("a profile");
        let mut labels: Vec<Vec<(&str, &str)>> = p
            .sample
            .iter()
            .map(|x| {
                x.label
                    .iter()
                    .map(|l| (s(&p, l.key), s(&p, l.str)))
                    .collect()
            })
            .collect();
        labels.sort();
        assert_eq!(
            labels,
            [
                [("comm", "app"), ("pid", "1"), ("tid", "1"), ("cpu", "0")],
                [
                    ("comm", "worker-0"),
                    ("pid", "1"),
                    ("tid", "2"),
                    ("cpu", "0")
                ],
            ]
        );
    }

    #[test]
    fn a_pmu_event_is_named_in_counts_and_the_file_round_trips() {
        let mut b = PprofBuilder::new(&ConvertOptions::default(), 0);
        let mut h = hello(EventKind::Hardware);
        h.source = EventSource::Pmu;
        h.events[0].freq = false;
        h.events[0].period_or_freq = 100_000;
        h.events[0].precise = 2;
        b.push(&Item::Hello(h));
        b.push(&Item::Sample(SampleView {
            pid: 3,
            tid: 3,
            ip: 0x99,
            user: true,
            period: 100_000,
            ..Default::default()
        }));
        let (p, _) = b.finish().expect("a profile");
        let mut gz = Vec::new();
        write_gz(&p, &mut gz).expect("writing");
        assert_eq!(&gz[..2], &[0x1f, 0x8b]);
        let back = read(&gz).expect("reading back");
        assert_eq!(back, p);
        let t = &back.sample_type[1];
        assert_eq!((s(&back, t.r#type), s(&back, t.unit)), ("cycles", "count"));
        assert_eq!(back.period, 100_000);
    }

    #[test]
    fn without_a_hello_there_is_no_profile() {
        let b = PprofBuilder::new(&ConvertOptions::default(), 0);
        assert!(matches!(b.finish(), Err(PprofError::NoHello)));
        assert!(read(b"\x1f\x8bgarbage").is_err());
    }
}
