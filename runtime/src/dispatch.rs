//! The top of the runtime's core, where the layers meet: the Rust side of
//! every entry but the NMI (the entry stubs' trap upcall: the scheduler
//! tick, system calls, ring-3 faults, runtime exceptions) and the driver
//! that runs the scheduler for the appliance and the self-test.

use crate::abi;
use crate::entry::{LEAVE, RESUME};
use crate::proc::{self as task, Abi, Outcome, Task, tick};
use arch_x86::frame::{INT80_VECTOR, SYSCALL_VECTOR, TrapFrame, exception_name};

/// Called by the entry stubs with the saved frame. The runtime's work
/// runs under the kernel lock (see `cpu::kernel_lock`): taken here, given
/// up on the way back to ring 3 and kept on the way to the scheduler
/// (which gives it up when it next runs a program or halts). Without it:
/// a TLB shootdown; the tick and the wake IPI of a CPU other than the
/// boot CPU, unless its thread has a signal to take; and the report of
/// an exception in the runtime itself.
#[inline(always)]
pub extern "C" fn trap(frame: &mut TrapFrame) -> u64 {
    crate::cpu::clear_ac();
    // The user frame is saved: the entry window ends here, before anything
    // that may wait (the kernel lock).
    if frame.mode().is_user() {
        crate::sample::profile::on_entry_from_user();
    }
    let vector = frame.vector;
    if vector == u64::from(crate::cpu::SHOOTDOWN_VECTOR) {
        crate::cpu::answer_shootdown();
        crate::smp::ack_ipi();
        return RESUME;
    }
    if vector < 32 && !frame.mode().is_user() {
        runtime_exception(frame);
    }
    let r = if (vector == tick::TIMER_VECTOR || vector == u64::from(crate::smp::WAKE_VECTOR))
        && crate::cpu::this().index != 0
    {
        match tick_unlocked(frame) {
            Ok(r) => return r,
            Err(id) => {
                crate::cpu::kernel_lock();
                abi::linux::signals_on_return(id, frame)
            }
        }
    } else {
        crate::cpu::kernel_lock();
        trap_locked(frame)
    };
    if r != LEAVE {
        crate::cpu::kernel_unlock();
    }
    r
}

/// The tick or the wake IPI of a CPU other than the boot CPU, without the
/// kernel lock (it touches this CPU's slice and its thread's flags only):
/// every CPU's tick and every wake would otherwise take the lock, and the
/// threads on the other CPUs would wait for each other at every tick.
/// `Err(id)`: thread `id` has a signal to take on its way back to ring 3,
/// which needs the lock.
#[inline(always)]
fn tick_unlocked(frame: &mut TrapFrame) -> Result<u64, u8> {
    let user = frame.mode().is_user();
    let over = if frame.vector == tick::TIMER_VECTOR {
        tick::on_tick(user)
    } else {
        crate::smp::ack_ipi();
        false
    };
    let Some(id) = task::current().filter(|_| user) else {
        return Ok(RESUME);
    };
    if over || task::current_ended() {
        task::set_outcome(Outcome::Preempted);
        return Ok(LEAVE);
    }
    if abi::linux::signals_posted(id) {
        return Err(id);
    }
    Ok(RESUME)
}

/// [`trap`] under the kernel lock.
#[inline(always)]
fn trap_locked(frame: &mut TrapFrame) -> u64 {
    let user = frame.mode().is_user();
    let r = match frame.vector {
        tick::TIMER_VECTOR => {
            // The boot CPU's tick keeps the flight recorder's line moving
            // while tasks run, fires the programs' timers and restarts an
            // NMI clock that stopped.
            if crate::cpu::this().index == 0 {
                crate::sample::clock::watchdog();
                crate::stream::wire::pump();
                abi::linux::fire_timers(crate::time::now_ns());
            }
            if tick::on_tick(user) && task::current().is_some() {
                task::set_outcome(Outcome::Preempted);
                LEAVE
            } else {
                RESUME
            }
        }
        tick::SPURIOUS_VECTOR => RESUME,
        v if v == u64::from(crate::smp::WAKE_VECTOR) => {
            crate::smp::ack_ipi();
            RESUME
        }
        // System calls deliver signals on their own way out.
        SYSCALL_VECTOR if user => return abi::syscall(frame, Abi::X64),
        INT80_VECTOR if user => return abi::syscall(frame, Abi::Compat32),
        14 if user && abi::current_is_linux() => {
            let id = task::current().unwrap_or(task::NO_TASK);
            let cr2 = arch_x86::cpu::cr2();
            match abi::linux::page_fault(id, cr2, frame.error_code) {
                abi::linux::PageFault::Resolved => RESUME,
                abi::linux::PageFault::OutOfMemory => {
                    abi::linux::kill_out_of_memory(id);
                    LEAVE
                }
                abi::linux::PageFault::Segv => {
                    let mapped = frame.error_code & 1 != 0;
                    abi::linux::fault_to_handler(id, frame, cr2, mapped)
                        .unwrap_or_else(|| abi::user_fault(frame))
                }
            }
        }
        _ if user && abi::current_is_linux() => {
            let id = task::current().unwrap_or(task::NO_TASK);
            let cr2 = arch_x86::cpu::cr2();
            abi::linux::fault_to_handler(id, frame, cr2, true)
                .unwrap_or_else(|| abi::user_fault(frame))
        }
        _ if user && task::current().is_some() => abi::user_fault(frame),
        _ => runtime_exception(frame),
    };
    // A thread whose process another CPU's thread ended leaves for the
    // scheduler instead of going back to user mode.
    if r == RESUME && user && task::current_ended() {
        task::set_outcome(Outcome::Preempted);
        return LEAVE;
    }
    // Signals other threads sent while this one ran are taken on its way
    // back to user mode.
    match task::current() {
        Some(id) if r == RESUME && user && abi::linux::signals_posted(id) => {
            abi::linux::signals_on_return(id, frame)
        }
        _ => r,
    }
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

/// The scheduler's driver: `stop` ends the run; while nothing is ready the
/// stream's line keeps moving; the network is polled between slices and
/// while idle; an ended process leaves its report.
struct Driver<F>(F);

impl<F: FnMut() -> bool> task::Driver for Driver<F> {
    fn stop(&mut self) -> bool {
        // Between slices: frames that came in while a thread ran.
        abi::linux::poll_net();
        // The caller's check (the stream's drain, its task records) needs
        // critical sections only: the other CPUs' threads may enter the
        // runtime meanwhile.
        let depth = crate::cpu::kernel_release();
        let stop = (self.0)();
        crate::cpu::kernel_restore(depth);
        stop
    }

    fn idle(&mut self) {
        crate::stream::wire::pump();
        abi::linux::poll_net();
    }

    fn timed_out(&mut self, id: u8) {
        abi::linux::timed_out(id);
    }

    fn before_run(&mut self, id: u8) -> Option<Outcome> {
        abi::linux::resume_wait(id).or_else(|| abi::linux::signals_before_run(id))
    }

    fn timers_armed(&mut self) -> bool {
        abi::linux::timers_armed()
    }

    fn ended(&mut self, id: u8, task: &Task, outcome: Outcome) {
        if task.linux {
            abi::linux::ended(id, task.spec.name);
        } else if let Outcome::Fault(f) = outcome {
            task::report_fault(task.spec.name, &f);
        }
    }
}

/// What a CPU other than the boot CPU does once up: the tasks pinned to it.
pub fn cpu_work() {
    task::run_pinned(&mut Driver(|| false));
}

/// Runs every process until none can run or `stop` says so.
pub fn run_until(stop: impl FnMut() -> bool) {
    task::run_all(&mut Driver(stop));
}
