//! Files: the boot archive, read in place from the boot module's memory.
//! The file system programs see (the archive's files read-only, files they
//! create in memory, devices) is `kcore::sys::fs`, built from it.

use arch_x86::bootinfo::Module;

/// The boot archive's bytes, in place in the module's memory.
pub fn module_bytes(m: &Module) -> &'static [u8] {
    // SAFETY: the module's physical range was reserved from the frame
    // allocator at boot (so nothing reuses it) and lies inside the direct
    // map; it is never written.
    unsafe {
        core::slice::from_raw_parts(
            arch_x86::paging::phys_to_virt(m.base) as *const u8,
            m.len as usize,
        )
    }
}
