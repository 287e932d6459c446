//! A process's memory areas: what each user address range is, with what
//! rights, and where its bytes come from.
//!
//! The set is the single truth about a process's address space. The system
//! calls (`mmap`, `munmap`, `mprotect`, `brk`, `mremap`) edit it; the
//! runtime's page-fault handler asks [`AreaSet::page_content`] what a page
//! holds when it is first touched, and its user-copy code asks
//! [`AreaSet::find`] whether an access is allowed. Pages are faulted in
//! lazily: nothing here allocates frames.
//!
//! Areas are kept in a vector sorted by start address, grown with
//! `try_reserve`, and capped at [`MAX_AREAS`] (Linux's default
//! `vm.max_map_count`): a program that maps too much gets `ENOMEM`, never a
//! runtime abort.

use alloc::sync::Arc;
use alloc::vec::Vec;

use super::Abi;
use super::errno::Errno;

/// The page size of both ABIs.
pub const PAGE_SIZE: u64 = 4096;

/// Linux's default `vm.mmap_min_addr`: nothing is mapped below 64 KiB, so
/// a null pointer plus a small offset always faults.
pub const MMAP_MIN_ADDR: u64 = 0x1_0000;

/// Linux's default `vm.max_map_count`.
pub const MAX_AREAS: usize = 65_530;

/// The default stack size (and `RLIMIT_STACK`): the stack area is this
/// large from the start and faulted in lazily.
pub const STACK_SIZE: u64 = 8 << 20;

/// Where things go in a process's address space, per ABI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// One past the highest user address (Linux's `TASK_SIZE`).
    pub user_top: u64,
    /// One past the highest byte of the initial stack area.
    pub stack_top: u64,
    /// Size of the stack area ([`STACK_SIZE`]).
    pub stack_size: u64,
    /// mmap without a hint allocates top-down below this address.
    pub mmap_base: u64,
}

impl Layout {
    /// The layout of a 64-bit process: user space is the lower half's
    /// 47 bits minus the guard page; the stack sits at the top; mmaps grow
    /// down from 128 MiB below the stack area (Linux's minimum gap).
    pub const X86_64: Layout = Layout {
        user_top: 0x7fff_ffff_f000,
        stack_top: 0x7fff_ffff_f000,
        stack_size: STACK_SIZE,
        mmap_base: 0x7fff_ffff_f000 - STACK_SIZE - (128 << 20),
    };

    /// The layout of an i386 process: everything stays below 4 GiB
    /// (Linux's compat `TASK_SIZE` is `0xffffe000`).
    pub const I386: Layout = Layout {
        user_top: 0xffff_e000,
        stack_top: 0xffff_e000,
        stack_size: STACK_SIZE,
        mmap_base: 0xffff_e000 - STACK_SIZE - (128 << 20),
    };

    /// The layout for `abi`.
    pub const fn for_abi(abi: Abi) -> Layout {
        match abi {
            Abi::X86_64 => Layout::X86_64,
            Abi::I386 => Layout::I386,
        }
    }

    /// The lowest address of the initial stack area.
    pub const fn stack_bottom(&self) -> u64 {
        self.stack_top - self.stack_size
    }
}

/// Access rights of an area, with the bit values of Linux's `PROT_*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Prot(u8);

impl Prot {
    /// No access (`PROT_NONE`).
    pub const NONE: Prot = Prot(0);
    /// `PROT_READ`.
    pub const READ: Prot = Prot(1);
    /// `PROT_WRITE`.
    pub const WRITE: Prot = Prot(2);
    /// `PROT_EXEC`.
    pub const EXEC: Prot = Prot(4);
    /// Read and write.
    pub const RW: Prot = Prot(3);
    /// Read and execute.
    pub const RX: Prot = Prot(5);

    /// Decodes a `prot` argument; `None` if it has bits other than
    /// read/write/exec (`PROT_GROWSDOWN`/`PROT_GROWSUP` are refused too).
    pub const fn from_linux(bits: u64) -> Option<Prot> {
        if bits & !7 != 0 {
            None
        } else {
            Some(Prot(bits as u8))
        }
    }

    /// The `PROT_*` bits.
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// Whether the area can be read (on x86 write and exec imply read).
    pub const fn readable(self) -> bool {
        self.0 != 0
    }

    /// Whether the area can be written.
    pub const fn writable(self) -> bool {
        self.0 & 2 != 0
    }

    /// Whether code in the area can run.
    pub const fn executable(self) -> bool {
        self.0 & 4 != 0
    }

    /// The union of two sets of rights.
    pub const fn union(self, other: Prot) -> Prot {
        Prot(self.0 | other.0)
    }
}

/// What an area is for (the flags the runtime and `/proc`-like reports need).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AreaKind {
    /// A private anonymous mapping (mmap, mremap).
    Anon,
    /// The initial stack.
    Stack,
    /// The `brk` heap.
    Heap,
    /// A private file mapping (ELF segments, mmap of a file).
    File,
    /// A shared anonymous mapping (`MAP_SHARED | MAP_ANONYMOUS`, or of
    /// `/dev/zero`): a process forked from this one sees the same pages.
    Shared,
}

/// File content an area is backed by.
#[derive(Clone)]
pub enum FileData {
    /// A file of the boot archive, read in place.
    Static(&'static [u8]),
    /// A snapshot of an in-memory file taken when it was mapped (private
    /// mappings do not see later writes to the file, which matches Linux
    /// for pages the program has written, and is the documented
    /// simplification for the others).
    Shared(Arc<[u8]>),
}

impl FileData {
    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            FileData::Static(b) => b,
            FileData::Shared(b) => b,
        }
    }
}

/// Two are equal when they are the same bytes in memory (the same archive
/// file, or the same snapshot).
impl PartialEq for FileData {
    fn eq(&self, other: &FileData) -> bool {
        core::ptr::eq(self.bytes(), other.bytes())
    }
}

impl Eq for FileData {}

impl core::fmt::Debug for FileData {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            FileData::Static(b) => write!(f, "Static({} bytes)", b.len()),
            FileData::Shared(b) => write!(f, "Shared({} bytes)", b.len()),
        }
    }
}

/// Where an area's bytes come from when a page is first touched.
#[derive(Debug, Clone)]
pub enum Backing {
    /// Zero-filled pages.
    Zero,
    /// File content: the area's first byte is `data[offset]`; the first
    /// `len` bytes of the area come from the file (clipped to the data),
    /// everything past them reads as zero (an ELF segment's `.bss`).
    File {
        /// The file's bytes.
        data: FileData,
        /// Offset in `data` of the area's first byte.
        offset: u64,
        /// Bytes of file content from the area's start.
        len: u64,
    },
}

impl Backing {
    /// The same backing seen from `delta` bytes further into the area.
    fn advanced(&self, delta: u64) -> Backing {
        match self {
            Backing::Zero => Backing::Zero,
            Backing::File { data, offset, len } => Backing::File {
                data: data.clone(),
                offset: offset.saturating_add(delta),
                len: len.saturating_sub(delta),
            },
        }
    }
}

/// One memory area `[start, end)`, page-aligned.
#[derive(Debug, Clone)]
pub struct Area {
    /// First address (page-aligned).
    pub start: u64,
    /// One past the last address (page-aligned, `> start`).
    pub end: u64,
    /// Access rights.
    pub prot: Prot,
    /// What the area is.
    pub kind: AreaKind,
    /// Where its bytes come from.
    pub backing: Backing,
}

impl Area {
    /// A zero-filled area.
    pub fn zeroed(start: u64, end: u64, prot: Prot, kind: AreaKind) -> Area {
        Area {
            start,
            end,
            prot,
            kind,
            backing: Backing::Zero,
        }
    }

    /// Whether `addr` is inside the area.
    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }

    /// The part of the area inside `[start, end)` (which must overlap it).
    fn clipped(&self, start: u64, end: u64) -> Area {
        let s = self.start.max(start);
        let e = self.end.min(end);
        Area {
            start: s,
            end: e,
            prot: self.prot,
            kind: self.kind,
            backing: self.backing.advanced(s - self.start),
        }
    }

    /// Fills `page` with the content of the page at `page_addr` (which must
    /// be page-aligned and inside the area).
    pub fn fill_page(&self, page_addr: u64, page: &mut [u8; PAGE_SIZE as usize]) {
        page.fill(0);
        if let Backing::File { data, offset, len } = &self.backing {
            let delta = page_addr.saturating_sub(self.start);
            if delta >= *len {
                return;
            }
            let bytes = data.bytes();
            let want = (*len - delta).min(PAGE_SIZE) as usize;
            let from = offset.saturating_add(delta);
            let Ok(from) = usize::try_from(from) else {
                return;
            };
            if from >= bytes.len() {
                return;
            }
            let n = want.min(bytes.len() - from);
            page[..n].copy_from_slice(&bytes[from..from + n]);
        }
    }
}

/// Whether `x` is a multiple of the page size.
pub const fn page_aligned(x: u64) -> bool {
    x.is_multiple_of(PAGE_SIZE)
}

/// `x` rounded up to a page boundary, `None` on overflow.
pub const fn page_round_up(x: u64) -> Option<u64> {
    match x.checked_add(PAGE_SIZE - 1) {
        Some(v) => Some(v & !(PAGE_SIZE - 1)),
        None => None,
    }
}

/// `x` rounded down to a page boundary.
pub const fn page_round_down(x: u64) -> u64 {
    x & !(PAGE_SIZE - 1)
}

/// A sorted set of non-overlapping memory areas.
#[derive(Debug, Clone, Default)]
pub struct AreaSet {
    areas: Vec<Area>,
}

impl AreaSet {
    /// An empty address space.
    pub fn new() -> AreaSet {
        AreaSet { areas: Vec::new() }
    }

    /// The areas in address order.
    pub fn iter(&self) -> impl Iterator<Item = &Area> {
        self.areas.iter()
    }

    /// The number of areas.
    pub fn len(&self) -> usize {
        self.areas.len()
    }

    /// Whether there are no areas.
    pub fn is_empty(&self) -> bool {
        self.areas.is_empty()
    }

    /// Index of the first area whose end is above `addr`.
    fn first_ending_after(&self, addr: u64) -> usize {
        self.areas.partition_point(|a| a.end <= addr)
    }

    /// The area containing `addr`.
    pub fn find(&self, addr: u64) -> Option<&Area> {
        let i = self.first_ending_after(addr);
        self.areas.get(i).filter(|a| a.start <= addr)
    }

    /// Whether `[start, end)` is entirely covered by areas (no holes).
    pub fn is_fully_mapped(&self, start: u64, end: u64) -> bool {
        let mut at = start;
        let mut i = self.first_ending_after(start);
        while at < end {
            match self.areas.get(i) {
                Some(a) if a.start <= at => {
                    at = a.end;
                    i += 1;
                }
                _ => return false,
            }
        }
        true
    }

    /// Whether no area overlaps `[start, end)`.
    pub fn is_free(&self, start: u64, end: u64) -> bool {
        let i = self.first_ending_after(start);
        self.areas.get(i).is_none_or(|a| a.start >= end)
    }

    /// Checks that `[start, end)` is a valid, non-empty, page-aligned range.
    fn check_range(start: u64, end: u64) -> Result<(), Errno> {
        if start >= end || !page_aligned(start) || !page_aligned(end) {
            return Err(Errno::EINVAL);
        }
        Ok(())
    }

    /// Removes `[start, end)` from every area it overlaps, splitting an
    /// area that contains it. Fails only with `ENOMEM` (splitting needs
    /// one more slot and the allocation or the area cap says no); on
    /// failure nothing has changed.
    pub fn remove(&mut self, start: u64, end: u64) -> Result<(), Errno> {
        Self::check_range(start, end)?;
        let first = self.first_ending_after(start);
        let Some((a_start, a_end)) = self.areas.get(first).map(|a| (a.start, a.end)) else {
            return Ok(());
        };
        if a_start >= end {
            return Ok(());
        }
        if a_start < start && a_end > end {
            // One area strictly contains the range: split it in two.
            self.reserve(1)?;
            let right = self.areas[first].clipped(end, a_end);
            self.areas[first].end = start;
            self.areas.insert(first + 1, right);
            return Ok(());
        }
        let mut i = first;
        let mut remove_from = first;
        if self.areas[i].start < start {
            // Trim the area overlapping the range's start.
            self.areas[i].end = start;
            i += 1;
            remove_from = i;
        }
        while i < self.areas.len() && self.areas[i].end <= end {
            i += 1;
        }
        // Areas [remove_from, i) lie entirely inside the range.
        if let Some(a) = self.areas.get(i)
            && a.start < end
        {
            let trimmed = a.clipped(end, a.end);
            self.areas[i] = trimmed;
        }
        self.areas.drain(remove_from..i);
        Ok(())
    }

    /// Inserts `area`, replacing whatever overlaps it (MAP_FIXED
    /// semantics). `EINVAL` for an unaligned or empty area, `ENOMEM` when
    /// the area cap or the allocation says no; on failure nothing changed.
    pub fn insert(&mut self, area: Area) -> Result<(), Errno> {
        Self::check_range(area.start, area.end)?;
        // The new area needs a slot, and one more if it lands strictly
        // inside an existing area, which becomes two pieces around it.
        let splits = self
            .find(area.start)
            .is_some_and(|a| a.start < area.start && a.end > area.end);
        let first = self.first_ending_after(area.start);
        let covered = self.areas[first..]
            .iter()
            .take_while(|a| a.start < area.end)
            .filter(|a| a.start >= area.start && a.end <= area.end)
            .count();
        self.reserve((1 + splits as usize).saturating_sub(covered))?;
        self.remove(area.start, area.end)?;
        let i = self.first_ending_after(area.start);
        self.areas.insert(i, area);
        Ok(())
    }

    /// Changes the rights of `[start, end)`, splitting areas at the ends.
    /// Linux's `mprotect` rules: `ENOMEM` if part of the range is not
    /// mapped (then nothing changes).
    pub fn protect(&mut self, start: u64, end: u64, prot: Prot) -> Result<(), Errno> {
        Self::check_range(start, end)?;
        if !self.is_fully_mapped(start, end) {
            return Err(Errno::ENOMEM);
        }
        self.reserve(2)?;
        self.split_at(start);
        self.split_at(end);
        let mut i = self.first_ending_after(start);
        while let Some(a) = self.areas.get_mut(i) {
            if a.start >= end {
                break;
            }
            a.prot = prot;
            i += 1;
        }
        Ok(())
    }

    /// Splits the area containing `addr` (if any, and if `addr` is not
    /// its start) into two. The caller has reserved the slot.
    fn split_at(&mut self, addr: u64) {
        let i = self.first_ending_after(addr);
        if let Some(a) = self.areas.get(i)
            && a.start < addr
        {
            let right = a.clipped(addr, a.end);
            self.areas[i].end = addr;
            self.areas.insert(i + 1, right);
        }
    }

    /// Makes room for `n` more areas, within [`MAX_AREAS`].
    fn reserve(&mut self, n: usize) -> Result<(), Errno> {
        if self.areas.len() + n > MAX_AREAS {
            return Err(Errno::ENOMEM);
        }
        self.areas.try_reserve(n).map_err(|_| Errno::ENOMEM)
    }

    /// Grows or shrinks the area that ends at `old_end` so that it ends at
    /// `new_end` (for `brk` and in-place `mremap`). Growing requires the
    /// space above to be free (`ENOMEM` otherwise).
    pub fn resize_end(&mut self, old_end: u64, new_end: u64) -> Result<(), Errno> {
        if !page_aligned(new_end) {
            return Err(Errno::EINVAL);
        }
        let i = self.areas.partition_point(|a| a.end < old_end);
        let Some(a) = self.areas.get(i) else {
            return Err(Errno::ENOMEM);
        };
        if a.end != old_end || new_end <= a.start {
            return Err(Errno::EINVAL);
        }
        if new_end > old_end
            && let Some(next) = self.areas.get(i + 1)
            && next.start < new_end
        {
            return Err(Errno::ENOMEM);
        }
        self.areas[i].end = new_end;
        Ok(())
    }

    /// Finds the highest free range of `len` bytes (page-aligned) that
    /// ends at or below `below` and starts at or above `min`: Linux's
    /// top-down mmap allocator.
    pub fn find_free_below(&self, len: u64, below: u64, min: u64) -> Option<u64> {
        if len == 0 || !page_aligned(len) {
            return None;
        }
        let below = page_round_down(below);
        let fits = |top: u64, floor: u64| top >= floor && top - floor >= len && top - len >= min;
        let mut top = below;
        let n = self.areas.partition_point(|a| a.start < below);
        for a in self.areas[..n].iter().rev() {
            if a.end <= top && fits(top, a.end) {
                return Some(top - len);
            }
            top = top.min(a.start);
            if top < min.saturating_add(len) {
                return None;
            }
        }
        fits(top, min).then(|| top - len)
    }

    /// Fills `page` with the content of the page containing `addr` and
    /// returns the area's rights, or `None` when `addr` is not mapped. The
    /// runtime's page-fault handler calls this for a page touched for the
    /// first time.
    pub fn page_content(&self, addr: u64, page: &mut [u8; PAGE_SIZE as usize]) -> Option<Prot> {
        let area = self.find(addr)?;
        area.fill_page(page_round_down(addr), page);
        Some(area.prot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::collections::BTreeMap;
    use proptest::prelude::*;

    const P: u64 = PAGE_SIZE;

    fn anon(s: u64, e: u64, prot: Prot) -> Area {
        Area::zeroed(s * P, e * P, prot, AreaKind::Anon)
    }

    #[test]
    fn layout_constants_are_page_aligned_and_ordered() {
        for l in [Layout::X86_64, Layout::I386] {
            assert!(page_aligned(l.user_top) && page_aligned(l.stack_top));
            assert!(page_aligned(l.mmap_base));
            assert!(l.mmap_base < l.stack_bottom());
            assert!(l.stack_top <= l.user_top);
        }
        const { assert!(Layout::I386.user_top <= 1 << 32) };
    }

    #[test]
    fn insert_splits_an_area_it_lands_inside() {
        let mut s = AreaSet::new();
        s.insert(anon(10, 20, Prot::RW)).unwrap();
        s.insert(anon(12, 14, Prot::READ)).unwrap();
        let v: Vec<_> = s.iter().map(|a| (a.start / P, a.end / P, a.prot)).collect();
        assert_eq!(
            v,
            [(10, 12, Prot::RW), (12, 14, Prot::READ), (14, 20, Prot::RW)]
        );
    }

    #[test]
    fn file_backing_follows_splits_and_zero_fills_past_its_length() {
        static DATA: [u8; 3 * 4096] = {
            let mut d = [0u8; 3 * 4096];
            let mut i = 0;
            while i < d.len() {
                d[i] = (i / 4096 + 1) as u8;
                i += 1;
            }
            d
        };
        let mut s = AreaSet::new();
        s.insert(Area {
            start: 0x10 * P,
            end: 0x14 * P,
            prot: Prot::RX,
            kind: AreaKind::File,
            backing: Backing::File {
                data: FileData::Static(&DATA),
                offset: 4096,
                len: 4096 + 100,
            },
        })
        .unwrap();
        s.protect(0x11 * P, 0x12 * P, Prot::READ).unwrap();
        let mut page = [0xffu8; 4096];
        assert_eq!(s.page_content(0x10 * P + 5, &mut page), Some(Prot::RX));
        assert!(page.iter().all(|&b| b == 2));
        assert_eq!(s.page_content(0x11 * P, &mut page), Some(Prot::READ));
        assert!(page[..100].iter().all(|&b| b == 3));
        assert!(page[100..].iter().all(|&b| b == 0));
        assert_eq!(s.page_content(0x13 * P, &mut page), Some(Prot::RX));
        assert!(page.iter().all(|&b| b == 0));
        assert_eq!(s.page_content(0x14 * P, &mut page), None);
    }

    #[test]
    fn find_free_below_goes_top_down_and_respects_bounds() {
        let mut s = AreaSet::new();
        assert_eq!(s.find_free_below(2 * P, 100 * P, 16 * P), Some(98 * P));
        s.insert(anon(90, 100, Prot::RW)).unwrap();
        s.insert(anon(80, 88, Prot::RW)).unwrap();
        assert_eq!(s.find_free_below(2 * P, 100 * P, 16 * P), Some(88 * P));
        assert_eq!(s.find_free_below(3 * P, 100 * P, 16 * P), Some(77 * P));
        assert_eq!(s.find_free_below(70 * P, 100 * P, 16 * P), None);
        assert_eq!(s.find_free_below(64 * P, 100 * P, 16 * P), Some(16 * P));
        // An area straddling the ceiling.
        assert_eq!(s.find_free_below(P, 95 * P, 16 * P), Some(89 * P));
    }

    #[test]
    fn protect_of_a_hole_is_enomem_and_changes_nothing() {
        let mut s = AreaSet::new();
        s.insert(anon(10, 12, Prot::RW)).unwrap();
        s.insert(anon(13, 15, Prot::RW)).unwrap();
        assert_eq!(s.protect(10 * P, 15 * P, Prot::READ), Err(Errno::ENOMEM));
        assert!(s.iter().all(|a| a.prot == Prot::RW));
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn the_area_cap_gives_enomem() {
        let mut s = AreaSet::new();
        for i in 0..MAX_AREAS as u64 {
            s.insert(anon(2 * i + 16, 2 * i + 17, Prot::RW)).unwrap();
        }
        assert_eq!(s.insert(anon(1, 2, Prot::RW)).err(), Some(Errno::ENOMEM));
        assert_eq!(s.len(), MAX_AREAS);
        // Replacing an area needs no new slot.
        s.insert(anon(16, 17, Prot::READ)).unwrap();
        s.remove(16 * P, 17 * P).unwrap();
        s.insert(anon(1, 2, Prot::RW)).unwrap();
    }

    /// The page-granular model: page number -> (prot, identity of the
    /// content: the (offset into the file) of the page, or None for zero).
    type Model = BTreeMap<u64, (Prot, Option<u64>)>;

    #[derive(Debug, Clone)]
    enum Op {
        InsertAnon(u64, u64, u8),
        InsertFile(u64, u64, u8, u64),
        Remove(u64, u64),
        Protect(u64, u64, u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        let range = (0u64..64, 1u64..16).prop_map(|(s, n)| (s, s + n));
        prop_oneof![
            (range.clone(), 0u8..8).prop_map(|((s, e), p)| Op::InsertAnon(s, e, p)),
            (range.clone(), 0u8..8, 0u64..8).prop_map(|((s, e), p, o)| Op::InsertFile(s, e, p, o)),
            range.clone().prop_map(|(s, e)| Op::Remove(s, e)),
            (range, 0u8..8).prop_map(|((s, e), p)| Op::Protect(s, e, p)),
        ]
    }

    static FILE: [u8; 32 * 4096] = {
        let mut d = [0u8; 32 * 4096];
        let mut i = 0;
        while i < d.len() {
            d[i] = (i / 4096) as u8 + 1;
            i += 1;
        }
        d
    };

    proptest! {
        #[test]
        fn area_set_matches_a_page_model(ops in proptest::collection::vec(op(), 1..40)) {
            let mut set = AreaSet::new();
            let mut model = Model::new();
            for op in ops {
                match op {
                    Op::InsertAnon(s, e, p) => {
                        set.insert(anon(s, e, Prot(p))).unwrap();
                        for pg in s..e { model.insert(pg, (Prot(p), None)); }
                    }
                    Op::InsertFile(s, e, p, o) => {
                        set.insert(Area {
                            start: s * P, end: e * P, prot: Prot(p), kind: AreaKind::File,
                            backing: Backing::File { data: FileData::Static(&FILE), offset: o * P, len: (e - s) * P },
                        }).unwrap();
                        for pg in s..e { model.insert(pg, (Prot(p), Some(o + pg - s))); }
                    }
                    Op::Remove(s, e) => {
                        set.remove(s * P, e * P).unwrap();
                        for pg in s..e { model.remove(&pg); }
                    }
                    Op::Protect(s, e, p) => {
                        let all = (s..e).all(|pg| model.contains_key(&pg));
                        let r = set.protect(s * P, e * P, Prot(p));
                        prop_assert_eq!(r.is_ok(), all);
                        if all { for pg in s..e { model.get_mut(&pg).unwrap().0 = Prot(p); } }
                    }
                }
                // Sorted, non-overlapping, non-empty.
                let v: Vec<_> = set.iter().collect();
                for w in v.windows(2) { prop_assert!(w[0].end <= w[1].start); }
                for a in &v { prop_assert!(a.start < a.end); }
                for pg in 0..90u64 {
                    let mut page = [0xaau8; 4096];
                    let got = set.page_content(pg * P + 7, &mut page);
                    match model.get(&pg) {
                        None => prop_assert!(got.is_none()),
                        Some((prot, content)) => {
                            prop_assert_eq!(got, Some(*prot));
                            let want = content.map_or(0, |o| o as u8 + 1);
                            prop_assert!(page.iter().all(|&b| b == want));
                        }
                    }
                }
                // A free range found is really free, and is the highest one.
                if let Some(at) = set.find_free_below(3 * P, 80 * P, 4 * P) {
                    let pg = at / P;
                    prop_assert!((pg..pg + 3).all(|p| !model.contains_key(&p)));
                    prop_assert!(pg + 3 <= 80 && pg >= 4);
                    for hi in pg + 1..=77 {
                        prop_assert!((hi..hi + 3).any(|p| model.contains_key(&p)));
                    }
                } else {
                    for lo in 4..=77u64 {
                        prop_assert!((lo..lo + 3).any(|p| model.contains_key(&p)));
                    }
                }
            }
        }
    }
}
