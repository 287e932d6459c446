//! The run's file system, shared by all processes: the boot archive's
//! files (read-only, served in place), files and directories programs
//! create (in memory, for the rest of the run), the devices `/dev/null`,
//! `/dev/zero`, `/dev/urandom`, `/dev/random`, `/proc/self/exe`, the
//! `/proc` files whose text an open makes ([`ProcFile`]), and the files of
//! `/etc` the archive does not bring ([`ETC_DEFAULTS`]).
//!
//! Nodes live in an arena and are never freed (an unlinked file that is
//! still open stays readable, as on Linux; its memory is kept for the run).
//! Directories are sorted vectors of `(name, node)` grown with
//! `try_reserve`, file contents are vectors grown with `try_reserve`, so a
//! program that fills memory gets `ENOMEM`.

use alloc::vec::Vec;

use super::errno::Errno;

/// Linux's `PATH_MAX`, the NUL included.
pub const PATH_MAX: usize = 4096;
/// Linux's `NAME_MAX`: the longest path component.
pub const NAME_MAX: usize = 255;
/// The default largest in-memory file ([`Vfs::max_file_size`]).
pub const MAX_FILE_SIZE: u64 = 1 << 32;

/// The host name `uname` gives (its `nodename`), which `/etc/hosts` and
/// `/etc/hostname` name too.
pub const HOSTNAME: &str = "perch";

/// The files [`Vfs::from_archive`] adds to `/etc` when the archive has
/// none of that name: the loopback names and the host's own (on the
/// loopback address, which the network stack answers), root's user
/// and group (home `/root`), the name services (files, then DNS), and the
/// common services and protocols (what `getaddrinfo` reads for a service
/// name such as `http`).
pub const ETC_DEFAULTS: [(&[u8], &[u8]); 7] = [
    (
        b"hosts",
        b"127.0.0.1\tlocalhost perch\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    ),
    (b"hostname", b"perch\n"),
    (
        b"passwd",
        b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
    ),
    (b"group", b"root:x:0:\nnogroup:x:65534:\n"),
    (
        b"nsswitch.conf",
        b"passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n",
    ),
    (
        b"services",
        b"ftp\t\t21/tcp\nssh\t\t22/tcp\ntelnet\t\t23/tcp\nsmtp\t\t25/tcp\ndomain\t\t53/tcp\ndomain\t\t53/udp\nhttp\t\t80/tcp\t\twww\nntp\t\t123/udp\nhttps\t\t443/tcp\nhttps\t\t443/udp\nredis\t\t6379/tcp\nhttp-alt\t8080/tcp\twebcache\n",
    ),
    (
        b"protocols",
        b"ip\t0\tIP\nicmp\t1\tICMP\ntcp\t6\tTCP\nudp\t17\tUDP\nipv6\t41\tIPv6\nipv6-icmp\t58\tIPv6-ICMP\n",
    ),
];

/// `S_IFMT` and the file-type bits of `st_mode`.
pub mod mode {
    /// File-type mask.
    pub const S_IFMT: u32 = 0o170000;
    /// Directory.
    pub const S_IFDIR: u32 = 0o040000;
    /// Regular file.
    pub const S_IFREG: u32 = 0o100000;
    /// Character device.
    pub const S_IFCHR: u32 = 0o020000;
    /// Symbolic link.
    pub const S_IFLNK: u32 = 0o120000;
}

/// Index of a node in the file system.
pub type NodeId = usize;

/// The root directory.
pub const ROOT: NodeId = 0;

/// A character device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// `/dev/null`: reads EOF, swallows writes.
    Null,
    /// `/dev/zero`: reads zeros, swallows writes.
    Zero,
    /// `/dev/urandom` and `/dev/random`: random bytes.
    Random,
}

/// What a node is.
#[derive(Debug)]
pub enum Content {
    /// A directory: entries sorted by name.
    Dir(Vec<(Vec<u8>, NodeId)>),
    /// A file of the boot archive (read-only).
    Archive(&'static [u8]),
    /// A file a program created.
    Mem(Vec<u8>),
    /// A device.
    Device(Device),
    /// `/proc/self/exe`: a link to the calling process's executable.
    SelfExe,
    /// A file of `/proc` whose text is made when it is opened (see
    /// [`Vfs::snapshot`]).
    Proc(ProcFile),
    /// The text of a `/proc` file as one open saw it (read-only, never
    /// linked; reused once its last open file description closes).
    Snapshot(Vec<u8>),
}

/// The files of `/proc` that say what the calling process, or the
/// machine, is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcFile {
    /// `/proc/self/maps`: the process's mappings.
    Maps,
    /// `/proc/self/stat`: the process's status on one line.
    Stat,
    /// `/proc/self/status`: the same, a field a line.
    Status,
    /// `/proc/cpuinfo`: the CPUs.
    Cpuinfo,
    /// `/proc/meminfo`: the memory.
    Meminfo,
}

/// A file-system node.
#[derive(Debug)]
pub struct Node {
    /// What it holds.
    pub content: Content,
    /// Permission bits (`0o7777` part of `st_mode`).
    pub perm: u32,
    /// The directory holding it (the root's parent is the root).
    pub parent: NodeId,
    /// Its name in the parent.
    pub name: Vec<u8>,
    /// Last modification, ns since the epoch.
    pub mtime_ns: u64,
    /// Whether it is still linked in a directory.
    pub linked: bool,
}

impl Node {
    /// The full `st_mode`: file type and permissions.
    pub fn mode(&self) -> u32 {
        let t = match self.content {
            Content::Dir(_) => mode::S_IFDIR,
            Content::Archive(_) | Content::Mem(_) | Content::Proc(_) | Content::Snapshot(_) => {
                mode::S_IFREG
            }
            Content::Device(_) => mode::S_IFCHR,
            Content::SelfExe => mode::S_IFLNK,
        };
        t | (self.perm & 0o7777)
    }

    /// Whether it is a directory.
    pub fn is_dir(&self) -> bool {
        matches!(self.content, Content::Dir(_))
    }

    /// Size in bytes (for stat and lseek SEEK_END).
    pub fn size(&self) -> u64 {
        match &self.content {
            Content::Dir(e) => 4096.max(e.len() as u64 * 32),
            Content::Archive(d) => d.len() as u64,
            Content::Mem(d) | Content::Snapshot(d) => d.len() as u64,
            // As Linux's: the text is made when the file is opened.
            Content::Device(_) | Content::SelfExe | Content::Proc(_) => 0,
        }
    }

    /// `st_rdev` for devices (Linux's major/minor of mem devices).
    pub fn rdev(&self) -> u64 {
        match self.content {
            Content::Device(Device::Null) => (1 << 8) | 3,
            Content::Device(Device::Zero) => (1 << 8) | 5,
            Content::Device(Device::Random) => (1 << 8) | 9,
            _ => 0,
        }
    }
}

/// A path split into what resolution needs.
struct Walk<'a> {
    components: Vec<&'a [u8]>,
    trailing_slash: bool,
}

/// The file system.
#[derive(Debug)]
pub struct Vfs {
    nodes: Vec<Node>,
    /// Snapshot nodes no open file description refers to any more.
    free_snapshots: Vec<NodeId>,
    /// The largest in-memory file: writes and truncations past it are
    /// `EFBIG`. Files are not sparse (a write far past the end fills the
    /// gap with zeros), so this also bounds what one write can allocate.
    pub max_file_size: u64,
}

fn nomem<T>(_: T) -> Errno {
    Errno::ENOMEM
}

impl Vfs {
    /// A file system with only the built-in entries: `/`, `/tmp`, `/dev`
    /// with its devices, `/proc/self/exe` and the [`ProcFile`]s.
    pub fn new() -> Vfs {
        let mut fs = Vfs {
            nodes: Vec::with_capacity(16),
            free_snapshots: Vec::new(),
            max_file_size: MAX_FILE_SIZE,
        };
        fs.nodes.push(Node {
            content: Content::Dir(Vec::new()),
            perm: 0o755,
            parent: ROOT,
            name: Vec::new(),
            mtime_ns: 0,
            linked: true,
        });
        // The built-ins fit in what was just allocated; errors are
        // impossible on an empty tree with distinct names.
        let _ = fs.populate_builtins();
        fs
    }

    fn populate_builtins(&mut self) -> Result<(), Errno> {
        let tmp = self.mkdir_p(b"tmp")?;
        self.node_mut(tmp).perm = 0o1777;
        let dev = self.mkdir_p(b"dev")?;
        for (name, d) in [
            (&b"null"[..], Device::Null),
            (b"zero", Device::Zero),
            (b"urandom", Device::Random),
            (b"random", Device::Random),
        ] {
            self.link_new(dev, name, Content::Device(d), 0o666, 0)?;
        }
        let proc_self = self.mkdir_p(b"proc/self")?;
        self.link_new(proc_self, b"exe", Content::SelfExe, 0o777, 0)?;
        for (name, f) in [
            (&b"maps"[..], ProcFile::Maps),
            (b"stat", ProcFile::Stat),
            (b"status", ProcFile::Status),
        ] {
            self.link_new(proc_self, name, Content::Proc(f), 0o444, 0)?;
        }
        let proc = self.mkdir_p(b"proc")?;
        for (name, f) in [
            (&b"cpuinfo"[..], ProcFile::Cpuinfo),
            (b"meminfo", ProcFile::Meminfo),
        ] {
            self.link_new(proc, name, Content::Proc(f), 0o444, 0)?;
        }
        Ok(())
    }

    /// A node holding `text` that no path names (a `/proc` file as one
    /// open saw it), reusing one whose descriptions all closed
    /// ([`Vfs::release_snapshot`]).
    pub fn snapshot(&mut self, text: Vec<u8>) -> Result<NodeId, Errno> {
        if let Some(id) = self.free_snapshots.pop() {
            self.nodes[id].content = Content::Snapshot(text);
            return Ok(id);
        }
        self.nodes.try_reserve(1).map_err(nomem)?;
        self.nodes.push(Node {
            content: Content::Snapshot(text),
            perm: 0o444,
            parent: ROOT,
            name: Vec::new(),
            mtime_ns: 0,
            linked: false,
        });
        Ok(self.nodes.len() - 1)
    }

    /// Called when the last open file description of node `id` closed:
    /// a snapshot's node and memory can be used again.
    pub fn release_snapshot(&mut self, id: NodeId) {
        if let Some(n) = self.nodes.get_mut(id)
            && matches!(n.content, Content::Snapshot(_))
            && self.free_snapshots.try_reserve(1).is_ok()
        {
            n.content = Content::Snapshot(Vec::new());
            self.free_snapshots.push(id);
        }
    }

    /// Builds the file system from the boot archive's entries `(path,
    /// mode, data)`: paths are relative to `/` (a leading `./` or `/` is
    /// stripped), directories are implied by paths and may also come as
    /// entries of their own (mode with `S_IFDIR`). Entries that are
    /// neither directories nor regular files are skipped. `EEXIST` if a
    /// path is given twice as a file or is both a file and a directory,
    /// `ENAMETOOLONG`/`EINVAL` for bad paths.
    pub fn from_archive<'p, I>(entries: I) -> Result<Vfs, Errno>
    where
        I: IntoIterator<Item = (&'p [u8], u32, &'static [u8])>,
    {
        let mut fs = Vfs::new();
        for (path, m, data) in entries {
            let mut path = path;
            while let Some(rest) = path.strip_prefix(b"./").or(path.strip_prefix(b"/")) {
                path = rest;
            }
            if path.is_empty() || path == b"." {
                continue;
            }
            if path.len() >= PATH_MAX {
                return Err(Errno::ENAMETOOLONG);
            }
            match m & mode::S_IFMT {
                mode::S_IFDIR => {
                    let d = fs.mkdir_p(path)?;
                    fs.node_mut(d).perm = m & 0o7777;
                }
                mode::S_IFREG => {
                    let (dir, name) = match path.iter().rposition(|&b| b == b'/') {
                        Some(i) => (fs.mkdir_p(&path[..i])?, &path[i + 1..]),
                        None => (ROOT, path),
                    };
                    if name.is_empty() || name == b"." || name == b".." {
                        return Err(Errno::EINVAL);
                    }
                    if fs.child(dir, name)?.is_some() {
                        return Err(Errno::EEXIST);
                    }
                    fs.link_new(dir, name, Content::Archive(data), m & 0o7777, 0)?;
                }
                _ => {}
            }
        }
        fs.add_etc_defaults()?;
        Ok(fs)
    }

    /// The files of `/etc` that name this machine, its users and its
    /// services ([`ETC_DEFAULTS`]), where the archive brought none of its
    /// own: without `/etc/hosts`, resolving `localhost` waits for a DNS
    /// server that is not there; without `/etc/passwd`, `getpwuid(0)`
    /// finds no user. They are read-only, as the archive's files are.
    fn add_etc_defaults(&mut self) -> Result<(), Errno> {
        // An archive whose `/etc` is not a directory keeps it.
        if let Ok(etc) = self.mkdir_p(b"etc") {
            for (name, data) in ETC_DEFAULTS {
                if self.child(etc, name)?.is_none() {
                    self.link_new(etc, name, Content::Archive(data), 0o644, 0)?;
                }
            }
        }
        if self.resolve(ROOT, b"/root").is_err() {
            let home = self.mkdir_p(b"root")?;
            self.node_mut(home).perm = 0o700;
        }
        Ok(())
    }

    /// Creates the directories of `path` (relative to `/`) that are
    /// missing; `ENOTDIR` if one is a file.
    fn mkdir_p(&mut self, path: &[u8]) -> Result<NodeId, Errno> {
        let mut at = ROOT;
        for c in path.split(|&b| b == b'/') {
            if c.is_empty() || c == b"." {
                continue;
            }
            if c == b".." {
                return Err(Errno::EINVAL);
            }
            if c.len() > NAME_MAX {
                return Err(Errno::ENAMETOOLONG);
            }
            at = match self.child(at, c)? {
                Some(n) if self.node(n).is_dir() => n,
                Some(_) => return Err(Errno::ENOTDIR),
                None => self.link_new(at, c, Content::Dir(Vec::new()), 0o755, 0)?,
            };
        }
        Ok(at)
    }

    /// The node `id`. Ids come from this file system, so they are valid.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id]
    }

    /// The node `id`, mutable.
    pub fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.nodes[id]
    }

    /// Looks `name` up in directory `dir`: `ENOTDIR` if `dir` is not one.
    pub fn child(&self, dir: NodeId, name: &[u8]) -> Result<Option<NodeId>, Errno> {
        match &self.node(dir).content {
            Content::Dir(entries) => Ok(entries
                .binary_search_by(|(n, _)| n.as_slice().cmp(name))
                .ok()
                .map(|i| entries[i].1)),
            _ => Err(Errno::ENOTDIR),
        }
    }

    /// The entries of directory `dir`, sorted by name.
    pub fn entries(&self, dir: NodeId) -> Result<&[(Vec<u8>, NodeId)], Errno> {
        match &self.node(dir).content {
            Content::Dir(e) => Ok(e),
            _ => Err(Errno::ENOTDIR),
        }
    }

    /// Creates a node and links it into `dir` as `name` (which must not
    /// exist there).
    pub fn link_new(
        &mut self,
        dir: NodeId,
        name: &[u8],
        content: Content,
        perm: u32,
        now_ns: u64,
    ) -> Result<NodeId, Errno> {
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let mut owned = Vec::new();
        owned.try_reserve_exact(name.len()).map_err(nomem)?;
        owned.extend_from_slice(name);
        self.nodes.try_reserve(1).map_err(nomem)?;
        let id = self.nodes.len();
        self.insert_entry(dir, owned.clone(), id)?;
        self.nodes.push(Node {
            content,
            perm,
            parent: dir,
            name: owned,
            mtime_ns: now_ns,
            linked: true,
        });
        Ok(id)
    }

    fn insert_entry(&mut self, dir: NodeId, name: Vec<u8>, id: NodeId) -> Result<(), Errno> {
        let Content::Dir(entries) = &mut self.nodes[dir].content else {
            return Err(Errno::ENOTDIR);
        };
        match entries.binary_search_by(|(n, _)| n.as_slice().cmp(&name)) {
            Ok(_) => Err(Errno::EEXIST),
            Err(i) => {
                entries.try_reserve(1).map_err(nomem)?;
                entries.insert(i, (name, id));
                Ok(())
            }
        }
    }

    fn remove_entry(&mut self, dir: NodeId, name: &[u8]) {
        if let Content::Dir(entries) = &mut self.nodes[dir].content
            && let Ok(i) = entries.binary_search_by(|(n, _)| n.as_slice().cmp(name))
        {
            entries.remove(i);
        }
    }

    fn split(path: &[u8]) -> Result<Walk<'_>, Errno> {
        if path.is_empty() {
            return Err(Errno::ENOENT);
        }
        if path.len() >= PATH_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let mut components = Vec::new();
        for c in path.split(|&b| b == b'/') {
            if c.is_empty() {
                continue;
            }
            if c.len() > NAME_MAX {
                return Err(Errno::ENAMETOOLONG);
            }
            components.try_reserve(1).map_err(nomem)?;
            components.push(c);
        }
        Ok(Walk {
            components,
            trailing_slash: path.ends_with(b"/"),
        })
    }

    fn start(&self, base: NodeId, path: &[u8]) -> NodeId {
        if path.starts_with(b"/") { ROOT } else { base }
    }

    fn step(&self, at: NodeId, c: &[u8]) -> Result<NodeId, Errno> {
        if !self.node(at).is_dir() {
            return Err(Errno::ENOTDIR);
        }
        match c {
            b"." => Ok(at),
            b".." => Ok(self.node(at).parent),
            _ => self.child(at, c)?.ok_or(Errno::ENOENT),
        }
    }

    /// Resolves `path` relative to directory `base`. A trailing slash
    /// requires a directory (`ENOTDIR`).
    pub fn resolve(&self, base: NodeId, path: &[u8]) -> Result<NodeId, Errno> {
        let walk = Self::split(path)?;
        let mut at = self.start(base, path);
        for c in &walk.components {
            at = self.step(at, c)?;
        }
        if walk.trailing_slash && !self.node(at).is_dir() {
            return Err(Errno::ENOTDIR);
        }
        Ok(at)
    }

    /// Resolves all but the last component of `path`: the directory and
    /// the last name (`None` when the path ends in `.`/`..` or is `/`).
    pub fn resolve_parent<'p>(
        &self,
        base: NodeId,
        path: &'p [u8],
    ) -> Result<(NodeId, Option<&'p [u8]>, bool), Errno> {
        let walk = Self::split(path)?;
        let mut at = self.start(base, path);
        let Some((last, dirs)) = walk.components.split_last() else {
            return Ok((at, None, true));
        };
        for c in dirs {
            at = self.step(at, c)?;
        }
        if !self.node(at).is_dir() {
            return Err(Errno::ENOTDIR);
        }
        if *last == b"." || *last == b".." {
            return Ok((self.step(at, last)?, None, true));
        }
        Ok((at, Some(last), walk.trailing_slash))
    }

    /// The absolute path of node `id` (for `getcwd`).
    pub fn path_of(&self, id: NodeId) -> Result<Vec<u8>, Errno> {
        let mut parts: Vec<&[u8]> = Vec::new();
        let mut at = id;
        while at != ROOT {
            parts.try_reserve(1).map_err(nomem)?;
            parts.push(&self.node(at).name);
            at = self.node(at).parent;
        }
        let mut out = Vec::new();
        if parts.is_empty() {
            out.push(b'/');
        }
        for p in parts.iter().rev() {
            out.try_reserve(p.len() + 1).map_err(nomem)?;
            out.push(b'/');
            out.extend_from_slice(p);
        }
        Ok(out)
    }

    /// Whether `node` is `ancestor` or below it.
    fn is_within(&self, mut node: NodeId, ancestor: NodeId) -> bool {
        loop {
            if node == ancestor {
                return true;
            }
            if node == ROOT {
                return false;
            }
            node = self.node(node).parent;
        }
    }

    /// Creates a directory `name` in `dir`.
    pub fn mkdir(&mut self, dir: NodeId, name: &[u8], perm: u32, now: u64) -> Result<(), Errno> {
        if self.child(dir, name)?.is_some() {
            return Err(Errno::EEXIST);
        }
        self.link_new(dir, name, Content::Dir(Vec::new()), perm & 0o7777, now)?;
        Ok(())
    }

    /// Unlinks `name` from `dir`: a file (`EISDIR` for a directory unless
    /// `dir_wanted`), or an empty directory when `dir_wanted`
    /// (`ENOTDIR`, `ENOTEMPTY`). Archive files and built-ins are `EROFS`.
    pub fn unlink(&mut self, dir: NodeId, name: &[u8], dir_wanted: bool) -> Result<(), Errno> {
        let id = self.child(dir, name)?.ok_or(Errno::ENOENT)?;
        let node = self.node(id);
        match (&node.content, dir_wanted) {
            (Content::Dir(e), true) => {
                if !e.is_empty() {
                    return Err(Errno::ENOTEMPTY);
                }
                if id == ROOT {
                    return Err(Errno::EBUSY);
                }
            }
            (Content::Dir(_), false) => return Err(Errno::EISDIR),
            (_, true) => return Err(Errno::ENOTDIR),
            (Content::Mem(_), false) => {}
            _ => return Err(Errno::EROFS),
        }
        self.remove_entry(dir, name);
        self.node_mut(id).linked = false;
        Ok(())
    }

    /// Renames `from_dir/from` to `to_dir/to`, replacing a file there (or
    /// an empty directory, when moving a directory), as `rename(2)`.
    pub fn rename(
        &mut self,
        from_dir: NodeId,
        from: &[u8],
        to_dir: NodeId,
        to: &[u8],
    ) -> Result<(), Errno> {
        let id = self.child(from_dir, from)?.ok_or(Errno::ENOENT)?;
        if !matches!(self.node(id).content, Content::Mem(_) | Content::Dir(_)) {
            return Err(Errno::EROFS);
        }
        if !self.node(to_dir).is_dir() {
            return Err(Errno::ENOTDIR);
        }
        let moving_dir = self.node(id).is_dir();
        if moving_dir && self.is_within(to_dir, id) {
            return Err(Errno::EINVAL);
        }
        if let Some(old) = self.child(to_dir, to)? {
            if old == id {
                return Ok(());
            }
            match (&self.node(old).content, moving_dir) {
                (Content::Dir(e), true) if e.is_empty() => {}
                (Content::Dir(_), true) => return Err(Errno::ENOTEMPTY),
                (Content::Dir(_), false) => return Err(Errno::EISDIR),
                (_, true) => return Err(Errno::ENOTDIR),
                (Content::Mem(_), false) => {}
                _ => return Err(Errno::EROFS),
            }
            self.remove_entry(to_dir, to);
            self.node_mut(old).linked = false;
        }
        let mut owned = Vec::new();
        owned.try_reserve_exact(to.len()).map_err(nomem)?;
        owned.extend_from_slice(to);
        self.insert_entry(to_dir, owned.clone(), id)?;
        self.remove_entry(from_dir, from);
        let n = self.node_mut(id);
        n.parent = to_dir;
        n.name = owned;
        Ok(())
    }

    /// Reads from a regular file at `offset`; returns the bytes read.
    pub fn read_at(&self, id: NodeId, offset: u64, buf: &mut [u8]) -> Result<usize, Errno> {
        let data: &[u8] = match &self.node(id).content {
            Content::Archive(d) => d,
            Content::Mem(d) | Content::Snapshot(d) => d,
            Content::Dir(_) => return Err(Errno::EISDIR),
            // Only its snapshot is read (`openat` opens that).
            Content::Device(Device::Null) | Content::Proc(_) => return Ok(0),
            Content::Device(_) => {
                // Zero (and random, which the caller fills) devices.
                buf.fill(0);
                return Ok(buf.len());
            }
            Content::SelfExe => return Err(Errno::EINVAL),
        };
        let Ok(off) = usize::try_from(offset) else {
            return Ok(0);
        };
        if off >= data.len() {
            return Ok(0);
        }
        let n = buf.len().min(data.len() - off);
        buf[..n].copy_from_slice(&data[off..off + n]);
        Ok(n)
    }

    /// Writes to an in-memory file at `offset`, growing it (a hole reads
    /// as zeros). Devices swallow writes. Archive files are `EROFS`.
    pub fn write_at(
        &mut self,
        id: NodeId,
        offset: u64,
        buf: &[u8],
        now: u64,
    ) -> Result<usize, Errno> {
        let max = self.max_file_size;
        let node = self.node_mut(id);
        let data = match &mut node.content {
            Content::Mem(d) => d,
            Content::Device(_) => return Ok(buf.len()),
            Content::Dir(_) => return Err(Errno::EISDIR),
            Content::Archive(_) | Content::SelfExe => return Err(Errno::EROFS),
            Content::Proc(_) | Content::Snapshot(_) => return Err(Errno::EACCES),
        };
        let end = offset.checked_add(buf.len() as u64).ok_or(Errno::EFBIG)?;
        if end > max {
            return Err(Errno::EFBIG);
        }
        let (off, end) = (offset as usize, end as usize);
        if end > data.len() {
            data.try_reserve(end - data.len()).map_err(nomem)?;
            data.resize(end, 0);
        }
        data[off..end].copy_from_slice(buf);
        node.mtime_ns = now;
        Ok(buf.len())
    }

    /// Sets the size of an in-memory file (`ftruncate`, `O_TRUNC`).
    pub fn truncate(&mut self, id: NodeId, len: u64, now: u64) -> Result<(), Errno> {
        let max = self.max_file_size;
        let node = self.node_mut(id);
        let data = match &mut node.content {
            Content::Mem(d) => d,
            Content::Dir(_) => return Err(Errno::EISDIR),
            Content::Device(_) => return Ok(()),
            Content::Archive(_) | Content::SelfExe => return Err(Errno::EROFS),
            Content::Proc(_) | Content::Snapshot(_) => return Err(Errno::EACCES),
        };
        if len > max {
            return Err(Errno::EFBIG);
        }
        let len = len as usize;
        if len > data.len() {
            data.try_reserve(len - data.len()).map_err(nomem)?;
        }
        data.resize(len, 0);
        data.shrink_to(len.max(64));
        node.mtime_ns = now;
        Ok(())
    }
}

impl Default for Vfs {
    fn default() -> Self {
        Vfs::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fs() -> Vfs {
        Vfs::from_archive([
            (&b"bin/prog"[..], 0o100755, &b"\x7fELF"[..]),
            (b"./data/input.txt", 0o100644, b"hello\n"),
            (b"empty", 0o040755, b""),
        ])
        .unwrap()
    }

    #[test]
    fn archive_paths_imply_directories() {
        let fs = fs();
        let prog = fs.resolve(ROOT, b"/bin/prog").unwrap();
        assert_eq!(fs.node(prog).mode(), 0o100755);
        let data = fs.resolve(ROOT, b"data").unwrap();
        assert!(fs.node(data).is_dir());
        let input = fs.resolve(data, b"../data/./input.txt").unwrap();
        let mut b = [0u8; 16];
        assert_eq!(fs.read_at(input, 0, &mut b).unwrap(), 6);
        assert_eq!(&b[..6], b"hello\n");
        assert!(fs.node(fs.resolve(ROOT, b"/empty/").unwrap()).is_dir());
        assert_eq!(fs.resolve(ROOT, b"/bin/prog/"), Err(Errno::ENOTDIR));
        assert_eq!(fs.resolve(ROOT, b"/bin/prog/x"), Err(Errno::ENOTDIR));
        assert_eq!(fs.resolve(ROOT, b"/nope"), Err(Errno::ENOENT));
        assert_eq!(fs.resolve(ROOT, b""), Err(Errno::ENOENT));
        assert_eq!(fs.resolve(ROOT, b"/.."), Ok(ROOT));
        assert_eq!(fs.path_of(input).unwrap(), b"/data/input.txt");
    }

    /// The whole content of the file at `path`.
    fn read_all(fs: &Vfs, path: &[u8]) -> Vec<u8> {
        let id = fs.resolve(ROOT, path).unwrap();
        let mut b = alloc::vec![0u8; 4096];
        let n = fs.read_at(id, 0, &mut b).unwrap();
        b.truncate(n);
        b
    }

    #[test]
    fn etc_has_its_defaults_unless_the_archive_brings_its_own() {
        let fs = fs();
        let hosts = read_all(&fs, b"/etc/hosts");
        let text = core::str::from_utf8(&hosts).unwrap();
        assert!(text.lines().any(|l| l.split_whitespace().eq([
            "127.0.0.1",
            "localhost",
            HOSTNAME
        ])));
        assert_eq!(
            read_all(&fs, b"/etc/hostname"),
            [HOSTNAME.as_bytes(), b"\n"].concat()
        );
        assert!(read_all(&fs, b"/etc/passwd").starts_with(b"root:x:0:0:root:/root:"));
        assert!(fs.node(fs.resolve(ROOT, b"/root").unwrap()).is_dir());
        // Read-only, as the archive's files.
        let mut fs = fs;
        let passwd = fs.resolve(ROOT, b"/etc/passwd").unwrap();
        assert_eq!(fs.write_at(passwd, 0, b"x", 0), Err(Errno::EROFS));
        // The archive's own file wins; the others are still added.
        let fs = Vfs::from_archive([(&b"etc/hosts"[..], 0o100644, &b"10.0.0.1 db\n"[..])]).unwrap();
        assert_eq!(read_all(&fs, b"/etc/hosts"), b"10.0.0.1 db\n");
        assert!(!read_all(&fs, b"/etc/services").is_empty());
        // An `/etc` that is a file stays one.
        let fs = Vfs::from_archive([(&b"etc"[..], 0o100644, &b"odd"[..])]).unwrap();
        assert_eq!(read_all(&fs, b"/etc"), b"odd");
    }

    #[test]
    fn duplicate_archive_files_are_refused() {
        let r = Vfs::from_archive([(&b"a"[..], 0o100644, &b""[..]), (b"/a", 0o100644, b"")]);
        assert_eq!(r.err(), Some(Errno::EEXIST));
        let r = Vfs::from_archive([(&b"a"[..], 0o100644, &b""[..]), (b"a/b", 0o100644, b"")]);
        assert_eq!(r.err(), Some(Errno::ENOTDIR));
    }

    #[test]
    fn archive_files_are_read_only_and_memory_files_grow() {
        let mut fs = fs();
        let prog = fs.resolve(ROOT, b"bin/prog").unwrap();
        assert_eq!(fs.write_at(prog, 0, b"x", 0), Err(Errno::EROFS));
        let bin = fs.resolve(ROOT, b"bin").unwrap();
        assert_eq!(fs.unlink(bin, b"prog", false), Err(Errno::EROFS));
        let f = fs
            .link_new(bin, b"new", Content::Mem(Vec::new()), 0o644, 1)
            .unwrap();
        assert_eq!(fs.write_at(f, 3, b"ab", 2), Ok(2));
        let mut b = [9u8; 8];
        assert_eq!(fs.read_at(f, 0, &mut b), Ok(5));
        assert_eq!(&b[..5], b"\0\0\0ab");
        assert_eq!(fs.write_at(f, MAX_FILE_SIZE, b"x", 0), Err(Errno::EFBIG));
        assert_eq!(fs.write_at(f, u64::MAX, b"x", 0), Err(Errno::EFBIG));
    }

    #[test]
    fn rename_and_unlink_follow_linux_rules() {
        let mut fs = fs();
        let tmp = fs.resolve(ROOT, b"/tmp").unwrap();
        fs.mkdir(tmp, b"d", 0o755, 0).unwrap();
        assert_eq!(fs.mkdir(tmp, b"d", 0o755, 0), Err(Errno::EEXIST));
        let d = fs.resolve(tmp, b"d").unwrap();
        let f = fs
            .link_new(d, b"f", Content::Mem(Vec::new()), 0o644, 0)
            .unwrap();
        assert_eq!(fs.rename(tmp, b"d", d, b"inside"), Err(Errno::EINVAL));
        assert_eq!(fs.unlink(tmp, b"d", true), Err(Errno::ENOTEMPTY));
        assert_eq!(fs.unlink(tmp, b"d", false), Err(Errno::EISDIR));
        fs.rename(d, b"f", tmp, b"g").unwrap();
        assert_eq!(fs.resolve(ROOT, b"/tmp/g"), Ok(f));
        assert_eq!(fs.path_of(f).unwrap(), b"/tmp/g");
        assert_eq!(fs.unlink(tmp, b"g", true), Err(Errno::ENOTDIR));
        fs.unlink(tmp, b"g", false).unwrap();
        fs.unlink(tmp, b"d", true).unwrap();
        assert_eq!(fs.resolve(ROOT, b"/tmp/d"), Err(Errno::ENOENT));
    }

    #[test]
    fn long_names_are_enametoolong() {
        let fs = fs();
        let long = [b'a'; 256];
        assert_eq!(fs.resolve(ROOT, &long), Err(Errno::ENAMETOOLONG));
        let path = [b'/'; PATH_MAX];
        assert_eq!(fs.resolve(ROOT, &path), Err(Errno::ENAMETOOLONG));
    }
}
