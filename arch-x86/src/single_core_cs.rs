//! A `critical-section` implementation for one x86-64 core: save IF, `cli`, restore.
//!
//! This masks maskable interrupts only. NMIs still arrive, so NMI handlers
//! must never use a critical section.

/// Register with `critical_section::set_impl!(arch_x86::single_core_cs::SingleCoreCriticalSection);`.
#[derive(Debug)]
pub struct SingleCoreCriticalSection;

#[cfg(target_arch = "x86_64")]
// SAFETY: on a single core, clearing IF excludes every other maskable-interrupt
// context until `release` restores the previous state.
unsafe impl critical_section::Impl for SingleCoreCriticalSection {
    unsafe fn acquire() -> critical_section::RawRestoreState {
        let flags: u64;
        // SAFETY: reading RFLAGS and clearing IF have no memory effects.
        unsafe { core::arch::asm!("pushfq", "pop {}", "cli", out(reg) flags) };
        flags & (1 << 9) != 0
    }

    unsafe fn release(was_enabled: critical_section::RawRestoreState) {
        if was_enabled {
            // SAFETY: IF was set when the matching `acquire` ran.
            unsafe { core::arch::asm!("sti", options(nomem, nostack)) };
        }
    }
}
