//! The system-call ABIs: a loaded program's calls go to its Linux
//! personality ([`linux`], over `kcore::sys`), a built-in program's to the
//! runtime's own small ABI ([`perch`]); and what a fault in ring 3 does to
//! the process that took it.

pub mod linux;
pub mod perch;
use crate::entry::{LEAVE, RESUME};
use crate::proc::{self as task, Abi, Fault, Outcome};
use arch_x86::frame::TrapFrame;

/// An exception in ring 3 ends only the current process, with its reason.
pub fn user_fault(frame: &TrapFrame) -> u64 {
    task::set_outcome(Outcome::Fault(Fault {
        vector: frame.vector,
        error_code: frame.error_code,
        rip: frame.rip,
        cs: frame.cs,
        cr2: arch_x86::cpu::cr2(),
    }));
    LEAVE
}

/// True when the current process is a loaded Linux program.
pub fn current_is_linux() -> bool {
    task::current().is_some_and(|id| task::get(id).is_some_and(|t| t.linux))
}

/// A system call: a loaded program's goes to its Linux personality, a
/// built-in program's to the runtime's own small ABI.
pub fn syscall(frame: &mut TrapFrame, abi: Abi) -> u64 {
    let r = match task::current() {
        Some(id) if current_is_linux() => linux::syscall(frame, id, abi),
        _ => perch::handle(frame, abi),
    };
    // A compat process may have loaded SS from one of its TLS slots and
    // then deleted that slot (set_thread_area): the `iretq` back would fault
    // in ring 0. As Linux's failed IRET does, that ends the process (SIGSEGV,
    // #GP with the selector as its error code), never the runtime.
    let ss = frame.ss as u16;
    if r == RESUME && !crate::cpu::user_ss_loadable(ss) {
        task::set_outcome(Outcome::Fault(Fault {
            vector: 13,
            error_code: u64::from(ss & !3),
            rip: frame.rip,
            cs: frame.cs,
            cr2: arch_x86::cpu::cr2(),
        }));
        return LEAVE;
    }
    r
}
