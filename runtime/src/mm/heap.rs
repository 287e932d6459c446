//! The runtime's heap: one contiguous run of frames taken at boot, reached
//! through the direct map, managed by `linked_list_allocator`.
//!
//! It holds the kernel's own dynamic state (processes, the in-memory files
//! programs create, memory-area lists). Allocation happens outside NMI
//! context only, with interrupts off (system calls and the scheduler), so a
//! critical section is the only lock. A request the heap cannot meet returns
//! null: callers that size allocations from user input use `try_reserve`
//! and turn that into ENOMEM.

use core::alloc::{GlobalAlloc, Layout};
use core::cell::RefCell;
use core::ptr::NonNull;
use critical_section::Mutex;
use linked_list_allocator::Heap;

struct KernelHeap(Mutex<RefCell<Heap>>);

#[global_allocator]
static HEAP: KernelHeap = KernelHeap(Mutex::new(RefCell::new(Heap::empty())));

// SAFETY: `alloc` hands out blocks of the heap's region that no other
// allocation overlaps (the allocator's contract), sized and aligned as
// `layout` asks; `dealloc` returns exactly such a block. The region is
// owned by the heap alone (see `init`).
unsafe impl GlobalAlloc for KernelHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        critical_section::with(|cs| {
            self.0
                .borrow_ref_mut(cs)
                .allocate_first_fit(layout)
                .map_or(core::ptr::null_mut(), NonNull::as_ptr)
        })
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if let Some(p) = NonNull::new(ptr) {
            // SAFETY: `ptr` came from `alloc` with this `layout` (GlobalAlloc's
            // contract on the caller).
            critical_section::with(|cs| unsafe { self.0.borrow_ref_mut(cs).deallocate(p, layout) });
        }
    }
}

/// Hands the heap its region.
///
/// # Safety
/// 1. `[start, start + size)` is mapped, writable memory that nothing else
///    uses for the rest of the run.
/// 2. Called once, before the first allocation.
pub unsafe fn init(start: u64, size: u64) {
    critical_section::with(|cs| {
        // SAFETY: obligations 1 and 2 of this function.
        unsafe {
            HEAP.0
                .borrow_ref_mut(cs)
                .init(start as *mut u8, size as usize)
        }
    });
}
