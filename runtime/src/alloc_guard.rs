//! The runtime never allocates: this global allocator refuses every
//! request (returns null), so any allocation becomes a reported
//! allocation failure instead of silent heap use. It exists only because a
//! dependency's `no_std` build links the `alloc` crate (`iced-x86`, used by
//! `sampler::pebs` for IP fix-up; its decoder does not allocate).

use core::alloc::{GlobalAlloc, Layout};

struct RefuseAll;

// SAFETY: `alloc` always returns null, which `GlobalAlloc` permits (it
// signals failure); `dealloc` is never given a pointer because none is ever
// handed out.
unsafe impl GlobalAlloc for RefuseAll {
    unsafe fn alloc(&self, _layout: Layout) -> *mut u8 {
        core::ptr::null_mut()
    }

    unsafe fn dealloc(&self, _ptr: *mut u8, _layout: Layout) {}
}

#[global_allocator]
static ALLOCATOR: RefuseAll = RefuseAll;
