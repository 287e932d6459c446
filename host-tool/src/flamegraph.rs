//! Flamegraphs with inferno: samples folded into `comm;outer;...;inner`
//! stacks, runtime frames marked `_[k]`. The samples come from a capture
//! (stream items) or from a perf.data file (read with linux-perf-data), and
//! are symbolised the same way either way ([`crate::symbolize`]: the image,
//! and each program's host file named by its Task record or MMAP2), so a
//! perf.data and the capture it was converted from fold into the same
//! stacks. `--pid` and `--comm` keep the samples of some processes only.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use linux_perf_data::linux_perf_event_reader::{CpuMode, EventRecord};
use linux_perf_data::{PerfFileReader, PerfFileRecord};

use crate::convert::RUNTIME_COMM;
use crate::error::HostError;
use crate::image::Image;
use crate::model::Item;
use crate::symbolize::{ChainFrame, Symbolizer, chain_frames};

/// Which samples a flamegraph keeps: all, or those of the given pids and
/// comms (a sample must match both lists that are not empty).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    /// Process ids (`--pid`).
    pub pids: Vec<u32>,
    /// Process names (`--comm`).
    pub comms: Vec<String>,
}

impl Filter {
    fn keeps(&self, pid: u32, comm: &str) -> bool {
        (self.pids.is_empty() || self.pids.contains(&pid))
            && (self.comms.is_empty() || self.comms.iter().any(|c| c == comm))
    }
}

/// Folds samples into stacks.
pub struct Folder {
    image: Option<Image>,
    programs: BTreeMap<String, PathBuf>,
    filter: Filter,
    sym: Symbolizer,
    names: HashMap<(u32, u32), String>,
    stacks: HashMap<String, u64>,
    frames: Vec<ChainFrame>,
    line: String,
    /// Samples read (before filtering).
    pub samples: u64,
    /// Samples kept by the filter.
    pub kept: u64,
}

impl Folder {
    /// A folder symbolising with `image`, keeping every sample.
    pub fn new(image: Option<Image>) -> Self {
        Self::with(image, BTreeMap::new(), Filter::default())
    }

    /// A folder symbolising with `image` and the programs' host files
    /// (by archive path, for a capture's Task records), keeping what
    /// `filter` keeps.
    pub fn with(image: Option<Image>, programs: BTreeMap<String, PathBuf>, filter: Filter) -> Self {
        Folder {
            sym: Symbolizer::new(image.as_ref()),
            image,
            programs,
            filter,
            names: HashMap::new(),
            stacks: HashMap::new(),
            frames: Vec::with_capacity(128),
            line: String::new(),
            samples: 0,
            kept: 0,
        }
    }

    /// Takes one stream item of a capture (tasks name and map, samples are
    /// folded).
    pub fn push(&mut self, item: &Item<'_>) {
        match item {
            Item::Task(t) => {
                self.names.insert((t.pid, t.tid), t.name.clone());
                self.sym.map_task(t, self.image.as_ref(), &self.programs);
            }
            Item::Sample(s) => {
                let mut frames = std::mem::take(&mut self.frames);
                frames.clear();
                chain_frames(&mut frames, s.ip, s.user, s.callchain.iter().copied());
                self.fold(s.pid, s.tid, &frames, s.period);
                self.frames = frames;
            }
            _ => {}
        }
    }

    /// Reads a perf.data file: COMM records name the tasks (an exec COMM
    /// also unmaps its process's files), user MMAP and MMAP2 records map
    /// their files, samples are folded. Returns the number of samples
    /// read.
    pub fn read_perf_data(&mut self, input: impl Read + Seek) -> Result<u64, HostError> {
        let bad = |e: linux_perf_data::Error| {
            HostError::NotPerch(format!("not a readable perf.data file: {e}"))
        };
        let PerfFileReader {
            mut perf_file,
            mut record_iter,
        } = PerfFileReader::parse_file(input).map_err(bad)?;
        let before = self.samples;
        while let Some(r) = record_iter.next_record(&mut perf_file).map_err(bad)? {
            let PerfFileRecord::EventRecord { record, .. } = r else {
                continue;
            };
            let parsed = record.parse().map_err(|e| {
                HostError::NotPerch(format!("a damaged record in the perf.data file: {e}"))
            })?;
            match parsed {
                EventRecord::Comm(c) => {
                    let name = String::from_utf8_lossy(&c.name.as_slice()).into_owned();
                    self.names.insert((c.pid as u32, c.tid as u32), name);
                    // An exec: the old program's mappings are gone, the
                    // new one's MMAP2s follow.
                    if c.is_execve {
                        self.sym.clear(c.pid as u32);
                    }
                }
                EventRecord::Mmap(m) if m.pid >= 0 && m.cpu_mode == CpuMode::User => {
                    let path = String::from_utf8_lossy(&m.path.as_slice()).into_owned();
                    self.sym.map(
                        m.pid as u32,
                        m.address,
                        m.length,
                        m.page_offset,
                        Path::new(&path),
                    );
                }
                EventRecord::Mmap2(m) if m.pid >= 0 && m.cpu_mode == CpuMode::User => {
                    let path = String::from_utf8_lossy(&m.path.as_slice()).into_owned();
                    self.sym.map(
                        m.pid as u32,
                        m.address,
                        m.length,
                        m.page_offset,
                        Path::new(&path),
                    );
                }
                EventRecord::Sample(s) => {
                    let (Some(pid), Some(tid), Some(ip)) = (s.pid, s.tid, s.ip) else {
                        continue;
                    };
                    let user = s.cpu_mode == CpuMode::User;
                    let mut frames = std::mem::take(&mut self.frames);
                    frames.clear();
                    match &s.callchain {
                        Some(c) => chain_frames(
                            &mut frames,
                            ip,
                            user,
                            (0..c.len()).filter_map(|i| c.get(i)),
                        ),
                        None => chain_frames(&mut frames, ip, user, std::iter::empty()),
                    }
                    self.fold(pid as u32, tid as u32, &frames, s.period.unwrap_or(1));
                    self.frames = frames;
                }
                _ => {}
            }
        }
        Ok(self.samples - before)
    }

    fn fold(&mut self, pid: u32, tid: u32, frames: &[ChainFrame], period: u64) {
        self.samples += 1;
        let comm = match self.names.get(&(pid, tid)) {
            Some(n) => n.clone(),
            None if pid == 0 => RUNTIME_COMM.to_owned(),
            None => format!("tid-{tid}"),
        };
        if !self.filter.keeps(pid, &comm) {
            return;
        }
        self.kept += 1;
        let mut line = std::mem::take(&mut self.line);
        line.clear();
        line.push_str(&comm);
        for f in frames.iter().rev() {
            line.push(';');
            let r = self.sym.resolve(pid, f.addr, f.kernel, f.leaf);
            match r.frames.last() {
                Some(fr) => line.push_str(&fr.function.replace(';', ":")),
                None => line.push_str(&format!("{:#x}", f.addr)),
            }
            if f.kernel {
                line.push_str("_[k]");
            }
        }
        *self.stacks.entry(line.clone()).or_default() += period.max(1);
        self.line = line;
    }

    /// The folded stacks, sorted, one `stack count` per line.
    pub fn folded(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .stacks
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        v.sort();
        v
    }

    /// Whether no sample was kept.
    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }

    /// Renders the SVG.
    pub fn render(&self, title: &str, out: impl Write) -> Result<(), HostError> {
        if self.stacks.is_empty() {
            return Err(HostError::Flamegraph("the stream holds no samples".into()));
        }
        let lines = self.folded();
        let mut opts = inferno::flamegraph::Options::default();
        opts.title = title.to_owned();
        opts.count_name = "period".to_owned();
        inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), out)
            .map_err(|e| HostError::Flamegraph(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SampleView;
    use crate::perf_abi::context;

    fn task(pid: u32, name: &str) -> Item<'static> {
        Item::Task(crate::model::TaskInfo {
            pid,
            tid: pid,
            name: name.into(),
            compat: false,
            time: 0,
            text: vec![],
            program: None,
            origin: crate::model::TaskOrigin::Named,
        })
    }

    #[test]
    fn stacks_run_outer_to_inner_with_runtime_frames_marked() {
        let mut f = Folder::new(None);
        f.push(&task(1, "app"));
        let chain = [context::KERNEL, 0x10, 0x20, context::USER, 0x30, 0x40];
        let s = SampleView {
            pid: 1,
            tid: 1,
            ip: 0x10,
            period: 3,
            callchain: &chain,
            ..Default::default()
        };
        f.push(&Item::Sample(s));
        f.push(&Item::Sample(s));
        let u = SampleView {
            pid: 9,
            tid: 9,
            ip: 0x50,
            user: true,
            period: 1,
            ..Default::default()
        };
        f.push(&Item::Sample(u));
        assert_eq!(
            f.folded(),
            ["app;0x40;0x30;0x20_[k];0x10_[k] 6", "tid-9;0x50 1"]
        );
    }

    #[test]
    fn the_filter_keeps_the_named_pids_and_comms() {
        let samples = |filter: Filter| {
            let mut f = Folder::with(None, BTreeMap::new(), filter);
            f.push(&task(1, "app"));
            f.push(&task(2, "other"));
            for pid in [1, 2, 2] {
                f.push(&Item::Sample(SampleView {
                    pid,
                    tid: pid,
                    ip: 0x50,
                    user: true,
                    period: 1,
                    ..Default::default()
                }));
            }
            (f.samples, f.kept, f.folded())
        };
        assert_eq!(samples(Filter::default()).1, 3);
        let (all, kept, lines) = samples(Filter {
            pids: vec![2],
            comms: vec![],
        });
        assert_eq!((all, kept), (3, 2));
        assert_eq!(lines, ["other;0x50 2"]);
        let (_, kept, lines) = samples(Filter {
            pids: vec![],
            comms: vec!["app".into()],
        });
        assert_eq!((kept, lines), (1, vec!["app;0x50 1".to_owned()]));
        // Both lists must match.
        assert_eq!(
            samples(Filter {
                pids: vec![2],
                comms: vec!["app".into()],
            })
            .1,
            0
        );
    }

    #[test]
    fn a_file_that_is_not_perf_data_is_an_error() {
        let mut f = Folder::new(None);
        let e = f
            .read_perf_data(std::io::Cursor::new(b"PERFILE2 but nothing else".to_vec()))
            .expect_err("garbage");
        assert!(matches!(e, HostError::NotPerch(_)), "{e}");
    }
}
