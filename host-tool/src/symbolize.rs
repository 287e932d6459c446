//! Host-side symbolisation of sampled addresses, shared by the pprof writer
//! and the flamegraphs: which file an address of a process (or of the
//! runtime) lies in, and its function, source file, line and inlined
//! frames from that file's symbol table and DWARF (the addr2line crate).
//!
//! The maps come from the stream's Task records (a capture) or from the
//! MMAP/MMAP2 records of a perf.data file; either way the runtime image is
//! the "kernel" of every process, and each loaded program is mapped per pid
//! (two programs may share one link address).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use object::Object;

use crate::convert::archive_key;
use crate::image::Image;
use crate::model::TaskInfo;
use crate::perf_abi::context;
use crate::symtab::{LoadMap, demangle};

/// One frame of a sample's stack before it is resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainFrame {
    /// The address.
    pub addr: u64,
    /// In the runtime (after a `PERF_CONTEXT_KERNEL` marker).
    pub kernel: bool,
    /// The innermost frame (the sampled IP); the others are return
    /// addresses.
    pub leaf: bool,
}

/// Appends the frames of `chain` (a callchain with context markers,
/// innermost first) to `out`; the sample's `ip` alone when the chain has
/// none. `user`: the sample interrupted ring 3.
pub fn chain_frames(
    out: &mut Vec<ChainFrame>,
    ip: u64,
    user: bool,
    chain: impl Iterator<Item = u64>,
) {
    let start = out.len();
    let mut kernel = !user;
    for a in chain {
        match a {
            context::KERNEL => kernel = true,
            context::USER => kernel = false,
            a if a >= (-4095i64) as u64 => {}
            a => out.push(ChainFrame {
                addr: a,
                kernel,
                leaf: out.len() == start,
            }),
        }
    }
    if out.len() == start {
        out.push(ChainFrame {
            addr: ip,
            kernel: !user,
            leaf: true,
        });
    }
}

/// One frame of a resolved address, innermost (inlined) first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The function's name, demangled without a Rust hash.
    pub function: String,
    /// The source file, when DWARF knows it.
    pub file: Option<String>,
    /// The source line (0 when unknown).
    pub line: u32,
}

/// One file addresses resolve in.
pub struct Dso {
    /// Its path (what perf and pprof are told).
    pub path: PathBuf,
    /// Its GNU build-id, if it has one.
    pub build_id: Option<Vec<u8>>,
    /// Symbol table and DWARF, `None` when the file cannot be read.
    loader: Option<addr2line::Loader>,
    /// PT_LOAD segments.
    loads: LoadMap,
    /// Resolved probes.
    cache: HashMap<u64, Rc<[Frame]>>,
    /// Why the file gives no symbols, when it does not.
    pub problem: Option<String>,
}

impl Dso {
    fn open(path: &Path) -> Dso {
        let mut dso = Dso {
            path: path.to_owned(),
            build_id: None,
            loader: None,
            loads: LoadMap::default(),
            cache: HashMap::new(),
            problem: None,
        };
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) => {
                dso.problem = Some(format!("cannot read {}: {e}", path.display()));
                return dso;
            }
        };
        match object::File::parse(&bytes[..]) {
            Ok(f) => {
                dso.build_id = f.build_id().ok().flatten().map(<[u8]>::to_vec);
                dso.loads = LoadMap::of_file(&f);
            }
            Err(e) => {
                dso.problem = Some(format!("{} is not an ELF file: {e}", path.display()));
                return dso;
            }
        }
        match addr2line::Loader::new(path) {
            Ok(l) => dso.loader = Some(l),
            Err(e) => dso.problem = Some(format!("reading {}'s symbols: {e}", path.display())),
        }
        dso
    }

    /// The link-time address of file offset `off`, through the PT_LOAD
    /// segments that hold it.
    pub fn vaddr_of_offset(&self, off: u64) -> Option<u64> {
        self.loads.vaddr_of_offset(off)
    }

    /// The file offset of link-time address `vaddr`.
    pub fn offset_of_vaddr(&self, vaddr: u64) -> Option<u64> {
        self.loads.offset_of_vaddr(vaddr)
    }

    /// Whether the file gave a symbol table or DWARF.
    pub fn has_symbols(&self) -> bool {
        self.loader.is_some()
    }

    /// The frames of link-time address `probe`, innermost first; empty when
    /// neither the symbol table nor DWARF knows it. The outermost frame is
    /// named from the symbol table (as perf names it) when it has one.
    pub fn frames(&mut self, probe: u64) -> Rc<[Frame]> {
        if let Some(f) = self.cache.get(&probe) {
            return Rc::clone(f);
        }
        let frames: Rc<[Frame]> = self.lookup(probe).into();
        self.cache.insert(probe, Rc::clone(&frames));
        frames
    }

    fn lookup(&self, probe: u64) -> Vec<Frame> {
        let Some(loader) = &self.loader else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if let Ok(mut it) = loader.find_frames(probe) {
            // A damaged DWARF entry ends the walk; what was read is kept.
            while let Ok(Some(f)) = it.next() {
                let function = f
                    .function
                    .as_ref()
                    .and_then(|n| n.demangle().ok())
                    .map(|n| n.into_owned());
                let (file, line) = match &f.location {
                    Some(l) => (l.file.map(str::to_owned), l.line.unwrap_or(0)),
                    None => (None, 0),
                };
                out.push(Frame {
                    function: function.unwrap_or_default(),
                    file,
                    line,
                });
            }
        }
        let symbol = loader.find_symbol(probe).map(demangle);
        match (out.last_mut(), symbol) {
            (Some(outer), Some(sym)) => outer.function = sym,
            (None, Some(sym)) => out.push(Frame {
                function: sym,
                file: None,
                line: 0,
            }),
            _ => {}
        }
        // Frames DWARF could not name are dropped, unless all are.
        if out.iter().any(|f| !f.function.is_empty()) {
            out.retain(|f| !f.function.is_empty());
        } else {
            out.clear();
        }
        out
    }
}

/// An address range of one process (or of the runtime) backed by a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// First address.
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// File offset of `start`.
    pub pgoff: u64,
    /// The file ([`Symbolizer::dso`]).
    pub dso: usize,
    /// The link-time address of `start` in the file.
    pub probe_base: u64,
}

impl Region {
    /// The link-time address of `addr`, which must lie in the region.
    pub fn probe(&self, addr: u64) -> u64 {
        self.probe_base.wrapping_add(addr - self.start)
    }
}

/// Where an address resolved.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// The region it lies in (`None`: in no known mapping).
    pub region: Option<Region>,
    /// Its frames, innermost first (empty: not symbolised).
    pub frames: Rc<[Frame]>,
}

/// The address spaces of a run and the files behind them.
#[derive(Default)]
pub struct Symbolizer {
    dsos: Vec<Dso>,
    by_path: HashMap<PathBuf, usize>,
    kernel: Vec<Region>,
    /// The image's task text, for processes without mappings of their own
    /// (a task whose Task record was lost).
    task_text: Vec<Region>,
    procs: HashMap<u32, Vec<Region>>,
}

impl Symbolizer {
    /// A symbolizer with `image` as the runtime ("kernel") of every process.
    pub fn new(image: Option<&Image>) -> Symbolizer {
        let mut s = Symbolizer::default();
        if let Some(img) = image {
            let dso = s.dso_index(&img.path);
            s.kernel.push(Region {
                start: img.kernel_start,
                end: img.kernel_end,
                pgoff: s.dsos[dso].offset_of_vaddr(img.kernel_start).unwrap_or(0),
                dso,
                // The runtime runs at its link addresses.
                probe_base: img.kernel_start,
            });
            for u in &img.user_text {
                s.task_text.push(Region {
                    start: u.addr,
                    end: u.addr.saturating_add(u.size),
                    pgoff: u.file_offset,
                    dso,
                    probe_base: u.addr,
                });
            }
        }
        s
    }

    /// The index of the file at `path`, opened on first use.
    pub fn dso_index(&mut self, path: &Path) -> usize {
        if let Some(&i) = self.by_path.get(path) {
            return i;
        }
        let i = self.dsos.len();
        self.dsos.push(Dso::open(path));
        self.by_path.insert(path.to_owned(), i);
        i
    }

    /// File `i`.
    pub fn dso(&self, i: usize) -> &Dso {
        &self.dsos[i]
    }

    /// Every file opened so far.
    pub fn dsos(&self) -> &[Dso] {
        &self.dsos
    }

    /// The runtime's regions.
    pub fn kernel_regions(&self) -> &[Region] {
        &self.kernel
    }

    /// Maps `len` bytes at `start` of process `pid` to `path` at file
    /// offset `pgoff` (an MMAP2, or a segment of a Task record). A later
    /// mapping over the same addresses replaces the earlier one.
    pub fn map(&mut self, pid: u32, start: u64, len: u64, pgoff: u64, path: &Path) {
        let dso = self.dso_index(path);
        let probe_base = self.dsos[dso].vaddr_of_offset(pgoff).unwrap_or(start);
        let end = start.saturating_add(len);
        let regions = self.procs.entry(pid).or_default();
        regions.retain(|r| r.end <= start || r.start >= end);
        regions.push(Region {
            start,
            end,
            pgoff,
            dso,
            probe_base,
        });
    }

    /// Forgets the user mappings of `pid` (a new program replaced it).
    pub fn clear(&mut self, pid: u32) {
        self.procs.remove(&pid);
    }

    /// Maps the code of a task as the converter's MMAP/MMAP2 records do: a
    /// loaded process's executable segments to its program's host file
    /// (`programs`, by archive path; `/PATH` when unknown), a built-in task's
    /// text to the image (at the image's own file offsets).
    pub fn map_task(
        &mut self,
        t: &TaskInfo,
        image: Option<&Image>,
        programs: &std::collections::BTreeMap<String, PathBuf>,
    ) {
        if t.pid == 0 {
            return;
        }
        if let Some(p) = &t.program {
            let key = archive_key(&p.path);
            let file = match programs.get(key) {
                Some(host) => std::fs::canonicalize(host).unwrap_or_else(|_| host.clone()),
                None => PathBuf::from(format!("/{key}")),
            };
            self.clear(t.pid);
            for s in p.segments.iter().filter(|s| s.exec) {
                self.map(t.pid, s.start, s.len, s.file_offset, &file);
            }
            return;
        }
        let Some(img) = image else { return };
        if t.text.is_empty() {
            for u in &img.user_text {
                self.map(t.pid, u.addr, u.size, u.file_offset, &img.path);
            }
        } else {
            for &(start, len, off) in &t.text {
                let pgoff = img.user_text_offset(start).unwrap_or(off);
                self.map(t.pid, start, len, pgoff, &img.path);
            }
        }
    }

    /// The region of `addr` in process `pid` (`kernel`: in the runtime).
    /// A process that has no mappings at all (its Task record was lost)
    /// gets the image's task text, as the converter gives it.
    pub fn region(&self, pid: u32, addr: u64, kernel: bool) -> Option<Region> {
        let hit = |rs: &[Region]| rs.iter().find(|r| addr >= r.start && addr < r.end).copied();
        if kernel {
            return hit(&self.kernel);
        }
        match self.procs.get(&pid) {
            Some(rs) => hit(rs),
            None => hit(&self.task_text),
        }
    }

    /// Resolves `addr` of process `pid`. `leaf` is false for a return
    /// address of a callchain, which is looked up one byte back (inside the
    /// call) so that the call's own line is found.
    pub fn resolve(&mut self, pid: u32, addr: u64, kernel: bool, leaf: bool) -> Resolved {
        let Some(region) = self.region(pid, addr, kernel) else {
            return Resolved {
                region: None,
                frames: Rc::from(Vec::new()),
            };
        };
        let mut probe = region.probe(addr);
        if !leaf && addr > region.start {
            probe -= 1;
        }
        let frames = self.dsos[region.dso].frames(probe);
        Resolved {
            region: Some(region),
            frames,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test binary itself: an ELF with symbols and DWARF.
    fn me() -> PathBuf {
        std::env::current_exe().expect("the test binary")
    }

    #[inline(never)]
    fn marker_function_for_symbolize() -> u64 {
        std::hint::black_box(7)
    }

    #[test]
    fn a_function_of_this_binary_resolves_with_its_file_and_line() {
        let mut s = Symbolizer::default();
        let i = s.dso_index(&me());
        assert!(s.dso(i).has_symbols(), "{:?}", s.dso(i).problem);
        assert_eq!(marker_function_for_symbolize(), 7);
        // The test binary is PIE: its link address of the function is the
        // runtime address minus the load bias, found through /proc/self/maps
        // by looking the symbol up by name instead.
        let data = std::fs::read(me()).expect("reading the test binary");
        let file = object::File::parse(&data[..]).expect("an ELF");
        let addr = object::Object::symbols(&file)
            .find(|sym| {
                object::ObjectSymbol::name(sym)
                    .is_ok_and(|n| n.contains("marker_function_for_symbolize"))
            })
            .map(|sym| object::ObjectSymbol::address(&sym))
            .expect("the marker symbol");
        let frames = s.dsos[i].frames(addr);
        let outer = frames.last().expect("a frame");
        assert!(
            outer.function.ends_with("marker_function_for_symbolize"),
            "{frames:?}"
        );
        assert!(
            outer
                .file
                .as_deref()
                .is_some_and(|f| f.ends_with("symbolize.rs")),
            "{frames:?}"
        );
        assert!(outer.line > 0);
        // Mapped at another address with the file offset of the function,
        // the same frames come back.
        let off = s.dso(i).offset_of_vaddr(addr).expect("an offset");
        s.map(5, 0x7000_0000, 0x1000, off, &me());
        let r = s.resolve(5, 0x7000_0000, false, true);
        assert_eq!(r.frames, frames);
        // Another pid has no such mapping.
        assert!(s.resolve(6, 0x7000_0000, false, true).region.is_none());
    }

    #[test]
    fn an_unreadable_file_gives_no_frames_and_says_why() {
        let mut s = Symbolizer::default();
        s.map(1, 0x1000, 0x1000, 0, Path::new("/nonexistent/prog"));
        let r = s.resolve(1, 0x1800, false, true);
        assert!(r.region.is_some());
        assert!(r.frames.is_empty());
        assert!(
            s.dsos()[0]
                .problem
                .as_deref()
                .is_some_and(|p| p.contains("cannot read"))
        );
    }

    #[test]
    fn a_later_mapping_replaces_an_overlapping_one() {
        let mut s = Symbolizer::default();
        s.map(1, 0x1000, 0x2000, 0, Path::new("/nonexistent/a"));
        s.map(1, 0x2000, 0x1000, 0, Path::new("/nonexistent/b"));
        assert!(s.region(1, 0x1800, false).is_none());
        let r = s.region(1, 0x2800, false).expect("b's region");
        assert_eq!(s.dso(r.dso).path, Path::new("/nonexistent/b"));
    }
}
