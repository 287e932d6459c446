//! Memory for virtio devices (the stream's console, the network card):
//! [`FrameHal`], the `virtio-drivers` crate's `Hal` over the frame
//! allocator and the direct map. Built for the runtime's target only.

use crate::mm::frames;
use arch_x86::paging::{DIRECT_MAP, KERNEL_VMA, PAGE, phys_to_virt};
use core::ptr::NonNull;
use virtio_drivers::{BufferDirection, Hal, PhysAddr};

/// The virtio driver's memory: frames from the allocator (contiguous runs
/// for multi-page requests, kept for good), reached through the direct map.
pub struct FrameHal;

/// Physical address of a runtime address: the image (linked at
/// `KERNEL_VMA` over its physical load address) or the direct map.
fn virt_to_phys(va: u64) -> u64 {
    if va >= KERNEL_VMA {
        va - KERNEL_VMA
    } else {
        va - DIRECT_MAP
    }
}

// SAFETY: `dma_alloc` returns zeroed, page-aligned, physically contiguous
// frames that nothing else owns (the allocator handed them out) and their
// direct-map address; `mmio_phys_to_virt` maps below 4 GiB, where the
// direct map is uncached in the device window (the only callers are the
// probes, which check that BARs lie there); `share` translates addresses
// of the image or the direct map, both physically contiguous, and the
// runtime runs with DMA coherent (no bounce buffers needed).
unsafe impl Hal for FrameHal {
    fn dma_alloc(pages: usize, _direction: BufferDirection) -> (PhysAddr, NonNull<u8>) {
        let bytes = pages as u64 * PAGE;
        let pa = if pages == 1 {
            frames::alloc()
        } else {
            frames::take_contiguous(bytes)
        };
        match pa {
            Some(pa) => {
                let va = phys_to_virt(pa) as *mut u8;
                // SAFETY: the frames were just handed out to this caller and
                // the direct map covers them.
                unsafe { core::ptr::write_bytes(va, 0, bytes as usize) };
                (pa, NonNull::new(va).unwrap_or(NonNull::dangling()))
            }
            None => (0, NonNull::dangling()),
        }
    }

    unsafe fn dma_dealloc(paddr: PhysAddr, _vaddr: NonNull<u8>, pages: usize) -> i32 {
        // Multi-page runs came from `take_contiguous` and stay taken.
        if pages == 1 {
            frames::free(paddr);
        }
        0
    }

    unsafe fn mmio_phys_to_virt(paddr: PhysAddr, _size: usize) -> NonNull<u8> {
        NonNull::new(phys_to_virt(paddr) as *mut u8).unwrap_or(NonNull::dangling())
    }

    unsafe fn share(buffer: NonNull<[u8]>, _direction: BufferDirection) -> PhysAddr {
        virt_to_phys(buffer.as_ptr().cast::<u8>() as u64)
    }

    unsafe fn unshare(_paddr: PhysAddr, _buffer: NonNull<[u8]>, _direction: BufferDirection) {}
}
