//! The appliance system call ABI.
//!
//! 64-bit tasks use SYSCALL with the number in `rax` and arguments in `rdi`,
//! `rsi`, `rdx`; compat tasks use `int 0x80` with the number in `eax` and
//! arguments in `ebx`, `ecx`, `edx`. The result comes back in `rax`.

use crate::abi::{LEAVE, RESUME};
use crate::proc::{self as task, Abi, Outcome};
use arch_x86::frame::TrapFrame;
use core::sync::atomic::{AtomicBool, Ordering};

/// `exit(code)`: ends the task.
pub const SYS_EXIT: u64 = 0;
/// `write(ptr, len)`: prints the task's bytes; returns the count.
pub const SYS_WRITE: u64 = 1;
/// `yield()`: lets the other tasks run.
pub const SYS_YIELD: u64 = 2;
/// `clock()`: the TSC.
pub const SYS_CLOCK: u64 = 3;
/// `spin(cycles)`: busy-waits in the runtime for `cycles` TSC cycles.
pub const SYS_SPIN: u64 = 4;

/// `-EFAULT`.
pub const EFAULT: u64 = (-14i64) as u64;
/// `-ENOSYS`.
pub const ENOSYS: u64 = (-38i64) as u64;

/// Most bytes one `write` copies.
pub const WRITE_MAX: usize = 256;

/// Set (from NMI context) to end every `spin` early.
pub static SPIN_ABORT: AtomicBool = AtomicBool::new(false);

/// Handles a system call from the current task.
pub fn handle(frame: &mut TrapFrame, abi: Abi) -> u64 {
    let (nr, a0, a1) = match abi {
        Abi::X64 => (frame.rax, frame.rdi, frame.rsi),
        Abi::Compat32 => (
            frame.rax & 0xffff_ffff,
            frame.rbx & 0xffff_ffff,
            frame.rcx & 0xffff_ffff,
        ),
    };
    let Some(id) = task::current() else {
        return ENOSYS;
    };
    match nr {
        SYS_EXIT => {
            let code = match abi {
                Abi::X64 => a0 as i64,
                Abi::Compat32 => i64::from(a0 as u32 as i32),
            };
            task::set_outcome(Outcome::Exit(code));
            LEAVE
        }
        SYS_WRITE => {
            frame.rax = sys_write(id, a0, a1);
            RESUME
        }
        SYS_YIELD => {
            frame.rax = 0;
            task::set_outcome(Outcome::Yield);
            LEAVE
        }
        SYS_CLOCK => {
            frame.rax = arch_x86::cpu::rdtsc();
            RESUME
        }
        SYS_SPIN => {
            frame.rax = sys_spin(a0);
            RESUME
        }
        _ => {
            frame.rax = ENOSYS;
            RESUME
        }
    }
}

fn sys_write(id: u8, ptr: u64, len: u64) -> u64 {
    let n = (len as usize).min(WRITE_MAX);
    let mut buf = [0u8; WRITE_MAX];
    let copied = task::with_space(id, |s| {
        crate::mm::user::read(s, &mut crate::mm::user::PresentOnly, ptr, &mut buf[..n])
    });
    if !matches!(copied, Some(Ok(()))) {
        return EFAULT;
    }
    let name = task::get(id).map_or("?", |t| t.spec.name);
    crate::kprint!("[{name}] ");
    crate::console::write_bytes(&buf[..n]);
    task::update(id, |t| t.bytes_written += n as u64);
    n as u64
}

/// Most TSC cycles one `spin` may take.
pub const SPIN_MAX_CYCLES: u64 = 4_000_000_000;

/// Spins in the runtime for `cycles` TSC cycles (at most
/// [`SPIN_MAX_CYCLES`]) or until [`SPIN_ABORT`]. Counting TSC cycles rather
/// than clock ticks keeps callers from running in lock-step with the NMI
/// clock. Returns the cycles spent.
#[inline(never)]
pub fn sys_spin(cycles: u64) -> u64 {
    let cycles = cycles.min(SPIN_MAX_CYCLES);
    let start = arch_x86::cpu::rdtsc();
    IN_SPIN.store(true, Ordering::Relaxed);
    let spent = loop {
        let spent = arch_x86::cpu::rdtsc().wrapping_sub(start);
        if spent >= cycles || SPIN_ABORT.load(Ordering::Relaxed) {
            break spent;
        }
        core::hint::spin_loop();
    };
    IN_SPIN.store(false, Ordering::Relaxed);
    spent
}

/// Set while [`sys_spin`] runs: an NMI that sees it interrupted the body of
/// a system call, where the task's saved user frame is the one its entry
/// saved. The self-test uses it to tell those NMIs from ones that hit the
/// runtime elsewhere while the task was current (its first dispatch, where
/// the saved frame is still the task's initial register set).
pub static IN_SPIN: AtomicBool = AtomicBool::new(false);
