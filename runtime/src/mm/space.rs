//! Address spaces: one page-table root per process. The lower half is the
//! process's own; PML4 slots 256-511 (the direct map and the runtime image)
//! are the kernel's, copied from its root into every new one, and are
//! supervisor-only. Dropping a space frees its tables and every frame it owns.

use super::frames;
use alloc::sync::Arc;
use arch_x86::paging::{
    ADDR_MASK, BORROWED, COW, KERNEL_PML4_FIRST, MapError, Mapper, PAGE, PRESENT, PageTable,
    TableMemory, WRITABLE, phys_to_virt,
};
use core::sync::atomic::{AtomicUsize, Ordering};

/// Page tables reached through the direct map, table frames from [`frames`].
pub struct DirectTables;

impl TableMemory for DirectTables {
    fn table(&mut self, phys: u64) -> &mut PageTable {
        // SAFETY: every `phys` handed to the mapper is a page-table frame:
        // a root made by `AddressSpace::new` or the kernel's, or a frame
        // from `alloc_table`; the direct map covers it, and the runtime is
        // single-threaded outside NMI context (which never edits tables), so
        // no other reference to it is live.
        unsafe { &mut *(phys_to_virt(phys) as *mut PageTable) }
    }

    fn alloc_table(&mut self) -> Option<u64> {
        frames::alloc_zeroed()
    }

    fn free_table(&mut self, phys: u64) {
        frames::free(phys);
    }
}

/// One process's page tables.
pub struct AddressSpace {
    root: u64,
    /// How many processes hold these tables (`CLONE_VM` without
    /// `CLONE_THREAD`: vfork, posix_spawn), once a second one does: the
    /// last one to let go frees them.
    sharers: Option<Arc<AtomicUsize>>,
}

impl AddressSpace {
    /// A space with an empty lower half and the kernel's upper half, or
    /// `None` when memory is exhausted.
    pub fn new() -> Option<Self> {
        let root = frames::alloc_zeroed()?;
        let kernel = super::kernel_root();
        let mut t = DirectTables;
        let upper: [u64; 256] = {
            let k = t.table(kernel);
            let mut u = [0u64; 256];
            u.copy_from_slice(&k.0[KERNEL_PML4_FIRST..]);
            u
        };
        t.table(root).0[KERNEL_PML4_FIRST..].copy_from_slice(&upper);
        Some(AddressSpace {
            root,
            sharers: None,
        })
    }

    /// The same tables for another process (`clone` with `CLONE_VM` and
    /// without `CLONE_THREAD`): what either maps or unmaps, the other
    /// sees, and they are freed when the last holder drops them.
    pub fn share(&mut self) -> AddressSpace {
        let sharers = self
            .sharers
            .get_or_insert_with(|| Arc::new(AtomicUsize::new(1)));
        sharers.fetch_add(1, Ordering::AcqRel);
        AddressSpace {
            root: self.root,
            sharers: Some(sharers.clone()),
        }
    }

    /// Whether another process holds these tables too.
    fn shared(&self) -> bool {
        self.sharers
            .as_ref()
            .is_some_and(|c| c.load(Ordering::Acquire) > 1)
    }

    fn mapper(&self) -> Mapper {
        Mapper::new(self.root)
    }

    /// The leaf entry mapping `va` (0 if none).
    pub fn entry(&self, va: u64) -> u64 {
        self.mapper().entry(&mut DirectTables, va)
    }

    /// Maps a new zeroed frame at `va` with `flags`; returns the frame.
    /// A page already there is replaced (and freed if owned).
    pub fn map_zeroed(&mut self, va: u64, flags: u64) -> Result<u64, MapError> {
        let f = frames::alloc_zeroed().ok_or(MapError::NoMemory)?;
        match self.mapper().map(&mut DirectTables, va, f, flags) {
            Ok(old) => {
                self.release_replaced(old);
                Ok(f)
            }
            Err(e) => {
                frames::free(f);
                Err(e)
            }
        }
    }

    /// Maps frame `pa`, which this space does not own (a page of the
    /// runtime image's built-in programs), at `va`.
    pub fn map_borrowed(&mut self, va: u64, pa: u64, flags: u64) -> Result<(), MapError> {
        let old = self
            .mapper()
            .map(&mut DirectTables, va, pa, flags | BORROWED)?;
        self.release_replaced(old);
        Ok(())
    }

    /// Lets go of the leaf `old` that a new mapping replaced: when it was
    /// present, every CPU forgets it before its frame is freed.
    fn release_replaced(&self, old: u64) {
        if old & PRESENT != 0 {
            flush_all(self.root);
            release(old);
        }
    }

    /// Unmaps every page in `[start, end)`, freeing the frames it owns.
    pub fn unmap_range(&mut self, start: u64, end: u64) {
        self.each_present(start, end, |m, p| m.unmap(&mut DirectTables, p));
    }

    /// Calls `f` for every present page of `[start, end)`, in batches (the
    /// walk borrows the tables, `f` edits them); `f` returns the leaf it
    /// removed (0: none). Each batch ends with every CPU's TLB flushed and
    /// only then frees the removed leaves' frames: until the flush, a
    /// thread of the process on another CPU can still write to them.
    fn each_present(&mut self, start: u64, end: u64, mut f: impl FnMut(Mapper, u64) -> u64) {
        let m = self.mapper();
        let mut pages = heapless::Vec::<u64, 256>::new();
        let mut next = Some(start);
        loop {
            pages.clear();
            if let Some(from) = next {
                next = m.for_each_leaf(&mut DirectTables, from, end, |p, _| {
                    let _ = pages.push(p);
                    !pages.is_full()
                });
            }
            // The same slots now hold the removed leaves.
            for p in pages.iter_mut() {
                *p = f(m, *p);
            }
            flush_all(self.root);
            for &old in &pages {
                release(old);
            }
            if next.is_none() {
                return;
            }
        }
    }

    /// A new space whose lower half below `end` is a copy-on-write copy of
    /// this one's, for a new process (`fork`), but for the pages at which
    /// `shared` is true (shared memory), which both map to the same frame
    /// as they are: every other present page is
    /// mapped in both to the same frame, read-only and marked [`COW`]
    /// (the frame counted once more, see [`frames::share`]); the first
    /// write to it in either space gets that space a frame of its own
    /// ([`AddressSpace::break_cow`]). A borrowed page (the runtime image's
    /// built-in programs) stays borrowed. Pages not present yet are not
    /// mapped: they fault in from the areas. `None` when memory runs out
    /// (what was shared goes with the copy).
    pub fn cow_copy(&mut self, end: u64, shared: impl Fn(u64) -> bool) -> Option<AddressSpace> {
        let mut child = AddressSpace::new()?;
        let m = self.mapper();
        let mut pages = heapless::Vec::<(u64, u64), 64>::new();
        let mut next = Some(0);
        let mut ok = true;
        while let Some(from) = next {
            pages.clear();
            next = m.for_each_leaf(&mut DirectTables, from, end, |va, e| {
                let _ = pages.push((va, e));
                !pages.is_full()
            });
            for &(va, e) in &pages {
                let pa = e & ADDR_MASK;
                let flags = e & !ADDR_MASK;
                if e & BORROWED != 0 {
                    ok = child.map_borrowed(va, pa, flags & !BORROWED).is_ok();
                } else if shared(va) {
                    // Shared memory: the same frame, as writable as it is.
                    frames::share(pa);
                    ok = child.mapper().map(&mut DirectTables, va, pa, flags).is_ok();
                    if !ok {
                        frames::free(pa);
                    }
                } else {
                    let cow = (flags & !WRITABLE) | COW;
                    frames::share(pa);
                    ok = child.mapper().map(&mut DirectTables, va, pa, cow).is_ok();
                    if ok {
                        m.update(&mut DirectTables, va, |old| (old & !WRITABLE) | COW);
                    } else {
                        frames::free(pa);
                    }
                }
                if !ok {
                    break;
                }
            }
            if !ok {
                break;
            }
        }
        // The parent's pages are read-only from now on, on every CPU.
        flush_all(self.root);
        ok.then_some(child)
    }

    /// Gives the copy-on-write page at `va` a frame of its own (a copy of
    /// the shared one, or the frame itself once no other space holds it),
    /// writable when `writable`; returns false when `va` is not such a
    /// page or memory ran out.
    pub fn break_cow(&mut self, va: u64, writable: bool) -> bool {
        let va = va & !(PAGE - 1);
        let e = self.entry(va);
        if e & PRESENT == 0 || e & COW == 0 {
            return false;
        }
        let pa = e & ADDR_MASK;
        let own = if frames::is_shared(pa) {
            let Some(f) = frames::alloc() else {
                return false;
            };
            // SAFETY: `pa` is a frame this space maps, `f` was just handed
            // out to this code; the direct map covers both, and they are
            // distinct frames of 4 KiB.
            unsafe {
                core::ptr::copy_nonoverlapping(
                    phys_to_virt(pa) as *const u8,
                    phys_to_virt(f) as *mut u8,
                    PAGE as usize,
                );
            }
            f
        } else {
            pa
        };
        let w = if writable { WRITABLE } else { 0 };
        self.mapper().update(&mut DirectTables, va, |old| {
            own | (old & !ADDR_MASK & !COW) | w
        });
        flush_all(self.root);
        if own != pa {
            // This space's hold on the shared frame goes, now that no CPU
            // reaches it through this space.
            frames::free(pa);
        }
        true
    }

    /// Unmaps the whole lower half, freeing every frame and table it owns
    /// (nothing while another process shares the tables).
    pub fn clear_user(&mut self) {
        if self.shared() {
            return;
        }
        self.leave_everywhere();
        self.mapper().free_lower_half(&mut DirectTables, release);
    }

    /// Moves this CPU and every other that has this space in CR3 to the
    /// runtime's own root, before the tables and frames go: no CPU then
    /// reaches them, through its TLB or a walk of the tables. No thread
    /// of the space may be running.
    fn leave_everywhere(&self) {
        if arch_x86::cpu::cr3() & ADDR_MASK == self.root {
            super::activate_kernel();
        }
        crate::cpu::shootdown(self.root, crate::cpu::FLUSH_LEAVE);
    }

    /// Applies `f` to the leaf flags of every present page in `[start, end)`
    /// (a copy-on-write page stays so, and read-only until written).
    pub fn update_range(&mut self, start: u64, end: u64, f: impl Fn(u64) -> u64) {
        self.each_present(start, end, |m, p| {
            m.update(&mut DirectTables, p, |e| {
                let new = (e & (ADDR_MASK | BORROWED | COW)) | f(e);
                if new & COW != 0 { new & !WRITABLE } else { new }
            });
            0
        });
    }

    /// Makes this space the current one.
    pub fn activate(&self) {
        // SAFETY: the root maps the kernel half exactly as the kernel's root
        // does (copied in `new`), so the code and data in use stay mapped.
        unsafe { arch_x86::cpu::write_cr3(self.root) };
        crate::cpu::set_active_root(self.root);
    }
}

/// Frees the frame behind a replaced or removed leaf when the space owns it.
fn release(old: u64) {
    if old & PRESENT != 0 && old & BORROWED == 0 {
        frames::free(old & ADDR_MASK);
    }
}

/// Flushes the TLB entries of the space with root `root`: here (a CR3
/// reload) when it is this CPU's, and on every other CPU that runs it (its
/// threads on several CPUs); returns once they all have.
fn flush_all(root: u64) {
    let cr3 = arch_x86::cpu::cr3();
    if cr3 & ADDR_MASK == root {
        // SAFETY: reloading the current root changes no mapping.
        unsafe { arch_x86::cpu::write_cr3(cr3) };
    }
    crate::cpu::shootdown(root, crate::cpu::FLUSH_RELOAD);
}

impl Drop for AddressSpace {
    fn drop(&mut self) {
        // Another process still holds them: they stay, and this CPU may
        // keep them in CR3 until it switches.
        if let Some(c) = &self.sharers
            && c.fetch_sub(1, Ordering::AcqRel) > 1
        {
            return;
        }
        // A CPU that last ran the space may still have it in CR3.
        self.leave_everywhere();
        self.mapper().free_lower_half(&mut DirectTables, release);
        frames::free(self.root);
    }
}
