//! Memory handlers: brk, mmap (and i386's mmap2 and old mmap), munmap,
//! mprotect, madvise, mremap, msync.
//!
//! They edit the process's [`AreaSet`](super::super::vma::AreaSet) and
//! tell the runtime which present pages to drop or re-protect; pages are
//! faulted in lazily from the areas.
//!
//! Limits: shared file mappings that could be written (`MAP_SHARED` with
//! `PROT_WRITE` on a file) are `ENODEV` (read-only shared mappings behave
//! as private ones, which is the same while nobody writes the file). A
//! shared anonymous mapping is an [`AreaKind::Shared`] area, whose pages a
//! forked child shares with its parent.
//! `mremap` shrinks, grows in place, and moves (copying the bytes through
//! the checked user-copy path) readable and writable areas; it answers
//! `ENOMEM` otherwise, which glibc's and musl's realloc handle by copying.

use super::super::errno::{Errno, SysResult};
use super::super::machine::{CHUNK, Machine};
use super::super::vma::{
    Area, AreaKind, Backing, MMAP_MIN_ADDR, PAGE_SIZE, Prot, page_aligned, page_round_up,
};
use super::Ctx;
use super::file::{MapSource, mapping_source};

const MAP_SHARED: u64 = 0x01;
const MAP_PRIVATE: u64 = 0x02;
const MAP_SHARED_VALIDATE: u64 = 0x03;
const MAP_FIXED: u64 = 0x10;
const MAP_ANONYMOUS: u64 = 0x20;
const MAP_32BIT: u64 = 0x40;
const MAP_FIXED_NOREPLACE: u64 = 0x10_0000;
/// Flags accepted and ignored (GROWSDOWN, DENYWRITE, EXECUTABLE, LOCKED,
/// NORESERVE, POPULATE, NONBLOCK, STACK, HUGETLB and its size bits, SYNC,
/// UNINITIALIZED).
const MAP_IGNORED: u64 = 0x100
    | 0x800
    | 0x1000
    | 0x2000
    | 0x4000
    | 0x8000
    | 0x1_0000
    | 0x2_0000
    | 0x4_0000
    | 0x8_0000
    | 0x400_0000
    | (0x3f << 26);

/// `brk(addr)`: moves the program break; returns the new break, or the
/// old one when the request cannot be met (Linux's convention).
pub(crate) fn brk<M: Machine>(c: &mut Ctx<'_, M>, addr: u64) -> SysResult {
    let p = &mut *c.p;
    let cur = p.brk;
    if addr < p.brk_start || addr >= p.layout.user_top {
        return Ok(cur);
    }
    let (Some(cur_top), Some(new_top)) = (page_round_up(cur), page_round_up(addr)) else {
        return Ok(cur);
    };
    if new_top > cur_top {
        if !p.areas.is_free(cur_top, new_top) || new_top > p.layout.stack_bottom() {
            return Ok(cur);
        }
        let extend = cur_top > p.brk_start
            && p.areas
                .find(cur_top - 1)
                .is_some_and(|a| a.kind == AreaKind::Heap && a.end == cur_top);
        let r = if extend {
            p.areas.resize_end(cur_top, new_top)
        } else {
            p.areas
                .insert(Area::zeroed(cur_top, new_top, Prot::RW, AreaKind::Heap))
        };
        if r.is_err() {
            return Ok(cur);
        }
    } else if new_top < cur_top {
        if p.areas.remove(new_top, cur_top).is_err() {
            return Ok(cur);
        }
        c.m.discard_pages(new_top, cur_top);
    }
    c.p.brk = addr;
    Ok(addr)
}

/// Chooses where a non-fixed mapping of `len` bytes goes.
fn place<M: Machine>(c: &Ctx<'_, M>, hint: u64, len: u64, flags: u64) -> Result<u64, Errno> {
    let l = c.p.layout;
    let areas = &c.p.areas;
    if hint != 0 {
        let h = hint & !(PAGE_SIZE - 1);
        if h >= MMAP_MIN_ADDR
            && h.checked_add(len).is_some_and(|e| e <= l.user_top)
            && areas.is_free(h, h + len)
        {
            return Ok(h);
        }
    }
    if flags & MAP_32BIT != 0 && c.wide() {
        return areas
            .find_free_below(len, 0x8000_0000, 0x4000_0000)
            .ok_or(Errno::ENOMEM);
    }
    areas
        .find_free_below(len, l.mmap_base, MMAP_MIN_ADDR)
        .or_else(|| areas.find_free_below(len, l.stack_bottom(), l.mmap_base))
        .ok_or(Errno::ENOMEM)
}

/// `mmap(addr, len, prot, flags, fd, offset)` (offset in bytes).
pub(crate) fn mmap<M: Machine>(
    c: &mut Ctx<'_, M>,
    addr: u64,
    len: u64,
    prot: u64,
    flags: u64,
    fd: u64,
    offset: u64,
) -> SysResult {
    if len == 0 {
        return Err(Errno::EINVAL);
    }
    let len = page_round_up(len).ok_or(Errno::ENOMEM)?;
    if len > c.p.layout.user_top {
        return Err(Errno::ENOMEM);
    }
    if !page_aligned(offset) {
        return Err(Errno::EINVAL);
    }
    let prot = Prot::from_linux(prot).ok_or(Errno::EINVAL)?;
    let kind = flags & 3;
    if kind == 0 {
        return Err(Errno::EINVAL);
    }
    if kind == MAP_SHARED_VALIDATE
        && flags & !(3 | MAP_FIXED | MAP_ANONYMOUS | MAP_32BIT | MAP_FIXED_NOREPLACE | MAP_IGNORED)
            != 0
    {
        return Err(Errno::EOPNOTSUPP);
    }
    let anon = flags & MAP_ANONYMOUS != 0;
    if !anon && offset.checked_add(len).is_none() {
        return Err(Errno::EOVERFLOW);
    }
    let backing = if anon {
        Backing::Zero
    } else {
        match mapping_source(c, fd, offset, len)? {
            MapSource::Zero => Backing::Zero,
            MapSource::File {
                data,
                offset,
                len: flen,
                writable,
            } => {
                if kind != MAP_PRIVATE && prot.writable() {
                    // A writable shared file mapping would have to write
                    // back to the file.
                    return Err(if writable {
                        Errno::ENODEV
                    } else {
                        Errno::EACCES
                    });
                }
                Backing::File {
                    data,
                    offset,
                    len: flen,
                }
            }
        }
    };
    let fixed = flags & (MAP_FIXED | MAP_FIXED_NOREPLACE) != 0;
    let start = if fixed {
        if !page_aligned(addr) {
            return Err(Errno::EINVAL);
        }
        let end = addr.checked_add(len).ok_or(Errno::ENOMEM)?;
        if end > c.p.layout.user_top {
            return Err(Errno::ENOMEM);
        }
        if addr < MMAP_MIN_ADDR {
            return Err(Errno::EPERM);
        }
        if flags & MAP_FIXED_NOREPLACE != 0 && !c.p.areas.is_free(addr, end) {
            return Err(Errno::EEXIST);
        }
        addr
    } else {
        place(c, addr, len, flags)?
    };
    let end = start + len;
    let replaced = !c.p.areas.is_free(start, end);
    let area_kind = if !(anon || matches!(backing, Backing::Zero)) {
        AreaKind::File
    } else if kind == MAP_SHARED || kind == MAP_SHARED_VALIDATE {
        AreaKind::Shared
    } else {
        AreaKind::Anon
    };
    c.p.areas.insert(Area {
        start,
        end,
        prot,
        kind: area_kind,
        backing,
    })?;
    if replaced {
        c.m.discard_pages(start, end);
    }
    Ok(start)
}

/// Checks an (addr, len) range argument: `addr` page-aligned, the rounded
/// range inside user space. Returns the end.
fn range<M: Machine>(c: &Ctx<'_, M>, addr: u64, len: u64) -> Result<u64, Errno> {
    if !page_aligned(addr) {
        return Err(Errno::EINVAL);
    }
    let len = page_round_up(len).ok_or(Errno::EINVAL)?;
    let end = addr.checked_add(len).ok_or(Errno::EINVAL)?;
    if end > c.p.layout.user_top {
        return Err(Errno::EINVAL);
    }
    Ok(end)
}

/// `munmap(addr, len)`.
pub(crate) fn munmap<M: Machine>(c: &mut Ctx<'_, M>, addr: u64, len: u64) -> SysResult {
    if len == 0 {
        return Err(Errno::EINVAL);
    }
    let end = range(c, addr, len)?;
    c.p.areas.remove(addr, end)?;
    c.m.discard_pages(addr, end);
    Ok(0)
}

/// `mprotect(addr, len, prot)`.
pub(crate) fn mprotect<M: Machine>(
    c: &mut Ctx<'_, M>,
    addr: u64,
    len: u64,
    prot: u64,
) -> SysResult {
    const PROT_GROWSDOWN: u64 = 0x0100_0000;
    const PROT_GROWSUP: u64 = 0x0200_0000;
    let prot = Prot::from_linux(prot & !(PROT_GROWSDOWN | PROT_GROWSUP)).ok_or(Errno::EINVAL)?;
    let end = range(c, addr, len)?;
    if end == addr {
        return Ok(0);
    }
    c.p.areas.protect(addr, end, prot)?;
    c.m.protect_pages(addr, end, prot);
    Ok(0)
}

/// `madvise(addr, len, advice)`: `MADV_DONTNEED` drops the pages (they
/// fault back in as zeros, or as the file's bytes for a file mapping, as
/// on Linux); the other known advice is accepted and ignored.
pub(crate) fn madvise<M: Machine>(
    c: &mut Ctx<'_, M>,
    addr: u64,
    len: u64,
    advice: i32,
) -> SysResult {
    const MADV_DONTNEED: i32 = 4;
    let end = range(c, addr, len)?;
    let known = matches!(advice, 0..=4 | 8..=23 | 25 | 100 | 101);
    if !known {
        return Err(Errno::EINVAL);
    }
    if end == addr {
        return Ok(0);
    }
    if !c.p.areas.is_fully_mapped(addr, end) {
        return Err(Errno::ENOMEM);
    }
    if advice == MADV_DONTNEED {
        c.m.discard_pages(addr, end);
    }
    Ok(0)
}

/// `msync(addr, len, flags)`: nothing to write back.
pub(crate) fn msync<M: Machine>(c: &mut Ctx<'_, M>, addr: u64, len: u64, flags: u64) -> SysResult {
    // MS_ASYNC 1, MS_INVALIDATE 2, MS_SYNC 4; ASYNC and SYNC exclude each other.
    if flags & !7 != 0 || flags & 5 == 5 {
        return Err(Errno::EINVAL);
    }
    let end = range(c, addr, len)?;
    if end > addr && !c.p.areas.is_fully_mapped(addr, end) {
        return Err(Errno::ENOMEM);
    }
    Ok(0)
}

/// The largest area `mremap` moves: moving copies the bytes (touching
/// every page), so a larger one is refused with `ENOMEM` and libc copies
/// what it needs itself.
const MREMAP_MAX_COPY: u64 = 256 << 20;

/// `mremap(old, old_len, new_len, flags, new_addr)`.
pub(crate) fn mremap<M: Machine>(
    c: &mut Ctx<'_, M>,
    old: u64,
    old_len: u64,
    new_len: u64,
    flags: u64,
    _new_addr: u64,
) -> SysResult {
    const MREMAP_MAYMOVE: u64 = 1;
    const MREMAP_FIXED: u64 = 2;
    const MREMAP_DONTUNMAP: u64 = 4;
    if flags & !(MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP) != 0
        || (flags & MREMAP_FIXED != 0 && flags & MREMAP_MAYMOVE == 0)
    {
        return Err(Errno::EINVAL);
    }
    if flags & (MREMAP_FIXED | MREMAP_DONTUNMAP) != 0 {
        // Not needed by libc's realloc; refuse rather than half-do it.
        return Err(Errno::EINVAL);
    }
    if !page_aligned(old) {
        return Err(Errno::EINVAL);
    }
    let old_len = page_round_up(old_len).ok_or(Errno::EINVAL)?;
    let new_len = page_round_up(new_len).ok_or(Errno::EINVAL)?;
    if new_len == 0 || old_len == 0 {
        return Err(Errno::EINVAL);
    }
    let old_end = old.checked_add(old_len).ok_or(Errno::EFAULT)?;
    let area = c.p.areas.find(old).ok_or(Errno::EFAULT)?.clone();
    if area.end < old_end {
        return Err(Errno::EFAULT);
    }
    if new_len == old_len {
        return Ok(old);
    }
    if new_len < old_len {
        let cut = old + new_len;
        c.p.areas.remove(cut, old_end)?;
        c.m.discard_pages(cut, old_end);
        return Ok(old);
    }
    let new_end = old.checked_add(new_len).ok_or(Errno::ENOMEM)?;
    if area.end == old_end
        && new_end <= c.p.layout.user_top
        && c.p.areas.is_free(old_end, new_end)
        && matches!(area.backing, Backing::Zero)
    {
        c.p.areas.resize_end(old_end, new_end)?;
        return Ok(old);
    }
    if flags & MREMAP_MAYMOVE == 0
        || !(area.prot.readable() && area.prot.writable())
        || old_len > MREMAP_MAX_COPY
    {
        return Err(Errno::ENOMEM);
    }
    // Move: a new area with the same kind of content, the bytes copied
    // through the checked user-copy path, then the old range unmapped.
    let dest = place(c, 0, new_len, 0)?;
    let backing = match &area.backing {
        Backing::Zero => Backing::Zero,
        Backing::File { data, offset, len } => {
            let delta = old - area.start;
            Backing::File {
                data: data.clone(),
                offset: offset.saturating_add(delta),
                len: len.saturating_sub(delta),
            }
        }
    };
    c.p.areas.insert(Area {
        start: dest,
        end: dest + new_len,
        prot: area.prot,
        kind: area.kind,
        backing,
    })?;
    let mut buf = [0u8; CHUNK];
    let mut at = 0;
    while at < old_len {
        let r = c
            .read(old + at, &mut buf)
            .and_then(|_| c.write(dest + at, &buf));
        if let Err(e) = r {
            let _ = c.p.areas.remove(dest, dest + new_len);
            c.m.discard_pages(dest, dest + new_len);
            return Err(e);
        }
        at += CHUNK as u64;
    }
    c.p.areas.remove(old, old_end)?;
    c.m.discard_pages(old, old_end);
    Ok(dest)
}
