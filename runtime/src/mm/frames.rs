//! The physical frame allocator: usable RAM from the boot memory map, less
//! what the boot left in it (low memory, the image, the boot archive).
//!
//! Frames are handed out from the free ranges front to back; freed frames go
//! on an intrusive free list (the link is stored in the free frame itself,
//! through the direct map), so allocation and freeing are O(1) and need no
//! metadata. Used outside NMI context only, with interrupts off.

use alloc::collections::BTreeMap;
use arch_x86::bootinfo::MemRegion;
use arch_x86::paging::{PAGE, phys_to_virt};
use core::cell::RefCell;
use critical_section::Mutex;

/// Most free ranges kept from the memory map.
const MAX_RANGES: usize = 32;
/// Memory below this is never handed out (real-mode structures, the BIOS).
pub const LOW_RESERVED: u64 = 1 << 20;
/// Highest physical address the direct map covers.
pub const DIRECT_MAP_LIMIT: u64 = 1 << 46;

/// Physical memory as ranges still to hand out plus a list of freed frames.
pub struct Frames {
    ranges: [(u64, u64); MAX_RANGES],
    count: usize,
    free_head: u64,
    free_frames: u64,
    /// Usable frames in the memory map (after the boot's reservations).
    pub total: u64,
    /// Frames handed out and not returned.
    pub used: u64,
}

impl Frames {
    const fn empty() -> Self {
        Frames {
            ranges: [(0, 0); MAX_RANGES],
            count: 0,
            free_head: 0,
            free_frames: 0,
            total: 0,
            used: 0,
        }
    }

    fn add(&mut self, start: u64, end: u64) {
        let start = start.next_multiple_of(PAGE);
        let end = end & !(PAGE - 1);
        if end <= start || self.count == MAX_RANGES {
            return;
        }
        self.ranges[self.count] = (start, end);
        self.count += 1;
        self.total += (end - start) / PAGE;
    }

    /// Removes `[start, end)` from every range (splitting where needed).
    fn reserve(&mut self, start: u64, end: u64) {
        let start = start & !(PAGE - 1);
        let end = end.next_multiple_of(PAGE);
        let mut i = 0;
        while i < self.count {
            let (a, b) = self.ranges[i];
            if end <= a || start >= b {
                i += 1;
                continue;
            }
            self.total -= (b.min(end) - a.max(start)) / PAGE;
            let (left, right) = ((a, start.max(a)), (end.min(b), b));
            self.ranges[i] = left;
            if right.0 < right.1 {
                if self.count < MAX_RANGES {
                    self.ranges[self.count] = right;
                    self.count += 1;
                } else {
                    self.total -= (right.1 - right.0) / PAGE;
                }
            }
            i += 1;
        }
    }

    /// Takes `bytes` (page multiple) of contiguous memory from the largest range.
    fn take_contiguous(&mut self, bytes: u64) -> Option<u64> {
        let (i, _) = self.ranges[..self.count]
            .iter()
            .enumerate()
            .filter(|(_, r)| r.1 - r.0 >= bytes)
            .max_by_key(|(_, r)| r.1 - r.0)?;
        let start = self.ranges[i].0;
        self.ranges[i].0 += bytes;
        self.used += bytes / PAGE;
        Some(start)
    }

    fn alloc(&mut self) -> Option<u64> {
        if self.free_head != 0 {
            let f = self.free_head;
            // SAFETY: `f` is a free frame below DIRECT_MAP_LIMIT; its first
            // word holds the next free frame (written by `free`), and nothing
            // else uses a free frame.
            self.free_head = unsafe { core::ptr::read(phys_to_virt(f) as *const u64) };
            self.free_frames -= 1;
            self.used += 1;
            return Some(f);
        }
        let r = self.ranges[..self.count].iter_mut().find(|r| r.0 < r.1)?;
        let f = r.0;
        r.0 += PAGE;
        self.used += 1;
        Some(f)
    }

    fn free(&mut self, f: u64) {
        // SAFETY: `f` was handed out by `alloc` and its owner gives it back,
        // so nothing else uses it; it is reachable through the direct map.
        unsafe { core::ptr::write(phys_to_virt(f) as *mut u64, self.free_head) };
        self.free_head = f;
        self.free_frames += 1;
        self.used -= 1;
    }
}

static FRAMES: Mutex<RefCell<Frames>> = Mutex::new(RefCell::new(Frames::empty()));

/// Builds the allocator from the memory map, less `reserved` ranges.
pub fn init(regions: &[MemRegion], reserved: &[(u64, u64)]) {
    critical_section::with(|cs| {
        let mut f = FRAMES.borrow_ref_mut(cs);
        for r in regions.iter().filter(|r| r.usable()) {
            let end = r.base.saturating_add(r.len).min(DIRECT_MAP_LIMIT);
            f.add(r.base.max(LOW_RESERVED), end);
        }
        for &(a, b) in reserved {
            f.reserve(a, b);
        }
    });
}

/// Takes `bytes` of contiguous memory at boot (the heap); `None` if no range is that large.
pub fn take_contiguous(bytes: u64) -> Option<u64> {
    critical_section::with(|cs| FRAMES.borrow_ref_mut(cs).take_contiguous(bytes))
}

/// A frame, or `None` when memory is exhausted. Its contents are undefined.
pub fn alloc() -> Option<u64> {
    critical_section::with(|cs| FRAMES.borrow_ref_mut(cs).alloc())
}

/// A zeroed frame, or `None` when memory is exhausted.
pub fn alloc_zeroed() -> Option<u64> {
    let f = alloc()?;
    // SAFETY: `f` was just handed out, so this code owns it; the direct map
    // covers it.
    unsafe { core::ptr::write_bytes(phys_to_virt(f) as *mut u8, 0, PAGE as usize) };
    Some(f)
}

/// Gives a frame from [`alloc`] back: one holder lets go of it, and it
/// returns to the free list with the last one (see [`share`]).
pub fn free(f: u64) {
    critical_section::with(|cs| {
        let mut shared = SHARED.borrow_ref_mut(cs);
        if let Some(n) = shared.get_mut(&f) {
            *n -= 1;
            if *n == 0 {
                shared.remove(&f);
            }
            return;
        }
        FRAMES.borrow_ref_mut(cs).free(f);
    });
}

/// Frames with more than one holder (address spaces that share them after
/// `fork`, copy-on-write), with how many holders besides the first.
static SHARED: Mutex<RefCell<BTreeMap<u64, u32>>> = Mutex::new(RefCell::new(BTreeMap::new()));

/// One more holder of frame `f` (a copy-on-write mapping): each holder
/// gives it back with [`free`].
pub fn share(f: u64) {
    critical_section::with(|cs| {
        *SHARED.borrow_ref_mut(cs).entry(f).or_insert(0) += 1;
    });
}

/// Whether frame `f` has more than one holder.
pub fn is_shared(f: u64) -> bool {
    critical_section::with(|cs| SHARED.borrow_ref(cs).contains_key(&f))
}

/// (usable frames, frames in use).
pub fn stats() -> (u64, u64) {
    critical_section::with(|cs| {
        let f = FRAMES.borrow_ref(cs);
        (f.total, f.used)
    })
}
