//! The system-call ABIs and the Rust side of every non-NMI entry: system
//! calls (a loaded program's go to its Linux personality, a built-in
//! program's to [`perch`]), the scheduler tick, ring-3 faults (which end
//! only the process), and runtime exceptions (reported, then QEMU exits
//! with the crash code — never a silent hang or triple fault).

pub mod perch;
use crate::proc::{self as task, Abi, Fault, Outcome, tick};
use arch_x86::frame::{INT80_VECTOR, SYSCALL_VECTOR, TrapFrame, exception_name};

/// Returned to the entry stub: resume the interrupted context.
pub const RESUME: u64 = 0;
/// Returned to the entry stub: leave to the scheduler.
pub const LEAVE: u64 = 1;

/// Called by the entry stubs with the saved frame.
pub extern "C" fn trap_dispatch(frame: &mut TrapFrame) -> u64 {
    crate::cpu::clear_ac();
    let user = frame.mode().is_user();
    if user {
        crate::sample::profile::on_entry_from_user();
    }
    match frame.vector {
        tick::TIMER_VECTOR => {
            // The flight recorder's line keeps moving while tasks run.
            crate::stream::wire::pump();
            if tick::on_tick(user) && task::current().is_some() {
                task::set_outcome(Outcome::Preempted);
                LEAVE
            } else {
                RESUME
            }
        }
        tick::SPURIOUS_VECTOR => RESUME,
        SYSCALL_VECTOR if user => syscall_from(frame, Abi::X64),
        INT80_VECTOR if user => syscall_from(frame, Abi::Compat32),
        14 if user && current_is_linux() => {
            let id = task::current().unwrap_or(task::NO_TASK);
            match task::linux::page_fault(id, arch_x86::cpu::cr2(), frame.error_code) {
                task::linux::PageFault::Resolved => RESUME,
                task::linux::PageFault::OutOfMemory => {
                    task::linux::kill_out_of_memory(id);
                    LEAVE
                }
                task::linux::PageFault::Segv => user_fault(frame),
            }
        }
        _ if user && task::current().is_some() => user_fault(frame),
        _ => runtime_exception(frame),
    }
}

/// An exception in ring 3 ends only the current process, with its reason.
fn user_fault(frame: &TrapFrame) -> u64 {
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
fn current_is_linux() -> bool {
    task::current().is_some_and(|id| task::get(id).is_some_and(|t| t.linux))
}

/// A system call: a loaded program's goes to its Linux personality, a
/// built-in program's to the runtime's own small ABI.
fn syscall_from(frame: &mut TrapFrame, abi: Abi) -> u64 {
    let r = match task::current() {
        Some(id) if current_is_linux() => task::linux::syscall(frame, id, abi),
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

/// Reports an exception taken in the runtime itself and exits with the crash code.
pub fn runtime_exception(frame: &TrapFrame) -> ! {
    use crate::console::emergency_print as p;
    p(format_args!(
        "\nRUNTIME EXCEPTION: {} (vector {}) error={:#x}\n  rip={:#018x} <{}>\n  cs={:#x} rflags={:#x} rsp={:#018x} ss={:#x} cr2={:#018x}\n",
        exception_name(frame.vector),
        frame.vector,
        frame.error_code,
        frame.rip,
        crate::symbols::Nearest(frame.rip),
        frame.cs,
        frame.rflags,
        frame.rsp,
        frame.ss,
        arch_x86::cpu::cr2(),
    ));
    for (i, (name, v)) in arch_x86::frame::GPR_NAMES
        .iter()
        .zip(frame.gprs())
        .enumerate()
    {
        p(format_args!(
            "  {name:>3}={v:#018x}{}",
            if i % 4 == 3 { "\n" } else { "" }
        ));
    }
    p(format_args!("\n"));
    crate::exit(arch_x86::exit::ExitCode::Crash)
}
