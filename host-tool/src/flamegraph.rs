//! Flamegraphs with inferno: samples folded into `comm;outer;...;inner`
//! stacks, symbolised from the image, runtime frames marked `_[k]`.

use std::collections::HashMap;
use std::io::Write;

use crate::error::HostError;
use crate::image::Image;
use crate::model::Item;
use crate::perf_abi::context;

/// Folds samples into stacks.
#[derive(Default)]
pub struct Folder {
    image: Option<Image>,
    names: HashMap<u32, String>,
    stacks: HashMap<String, u64>,
    line: String,
}

impl Folder {
    /// A folder symbolising with `image`.
    pub fn new(image: Option<Image>) -> Self {
        Folder {
            image,
            ..Default::default()
        }
    }

    fn frame(&self, ip: u64, kernel: bool, out: &mut String) {
        match self.image.as_ref().and_then(|i| i.symbolize(ip)) {
            Some(name) => out.push_str(&name.replace(';', ":")),
            None => out.push_str(&format!("{ip:#x}")),
        }
        if kernel {
            out.push_str("_[k]");
        }
    }

    /// Takes one stream item (tasks name the stacks, samples are folded).
    pub fn push(&mut self, item: &Item<'_>) {
        match item {
            Item::Task(t) => {
                self.names.insert(t.tid, t.name.clone());
            }
            Item::Sample(s) => {
                let mut line = std::mem::take(&mut self.line);
                line.clear();
                match self.names.get(&s.tid) {
                    Some(n) => line.push_str(n),
                    None if s.pid == 0 => line.push_str(crate::convert::RUNTIME_COMM),
                    None => line.push_str(&format!("tid-{}", s.tid)),
                }
                // Frames with their mode, innermost first.
                let mut frames: Vec<(u64, bool)> = Vec::with_capacity(s.callchain.len() + 1);
                let mut kernel = !s.user;
                for &ip in s.callchain {
                    match ip {
                        context::KERNEL => kernel = true,
                        context::USER => kernel = false,
                        ip if ip >= (-4095i64) as u64 => {}
                        ip => frames.push((ip, kernel)),
                    }
                }
                if frames.is_empty() {
                    frames.push((s.ip, !s.user));
                }
                for &(ip, k) in frames.iter().rev() {
                    line.push(';');
                    self.frame(ip, k, &mut line);
                }
                *self.stacks.entry(line.clone()).or_default() += s.period.max(1);
                self.line = line;
            }
            _ => {}
        }
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

    #[test]
    fn stacks_run_outer_to_inner_with_runtime_frames_marked() {
        let mut f = Folder::new(None);
        f.push(&Item::Task(crate::model::TaskInfo {
            pid: 1,
            tid: 1,
            name: "app".into(),
            compat: false,
            time: 0,
            text: vec![],
            program: None,
        }));
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
}
