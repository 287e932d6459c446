//! Running the appliance from the boot archive: read the archive and its
//! manifest, build the file system, start every process the manifest names,
//! schedule them until all have ended or `duration=` elapses, and report
//! how each ended and which system calls were unknown.

use crate::abi::linux;
use crate::kprintln;
use crate::proc::{self as task, MAX_TASKS, TaskState};
use arch_x86::bootinfo::Module;
use arch_x86::exit::ExitCode;
use kcore::archive::Archive;
use kcore::cmdline::Config;
use kcore::sys::{System, Vfs};

/// Runs the archive's processes, then exits QEMU: pass when the run
/// completed (whatever the programs did), fail when the archive or its
/// manifest is unusable or the profile stream broke (a record not sent, or
/// taken != delivered + lost).
pub fn run(cfg: &Config, module: &Module) -> ! {
    // From here on this CPU runs the runtime under the kernel lock, as
    // every CPU does: the first processes' threads run on the other CPUs
    // (and enter the runtime there) while this one starts the rest. The
    // scheduler gives the lock up while a program runs here or the CPU
    // halts.
    crate::cpu::kernel_lock();
    let bytes = crate::fs::module_bytes(module);
    let archive = match Archive::parse(bytes) {
        Ok(a) => a,
        Err(e) => {
            kprintln!("perch: boot archive ({} bytes) refused: {e}", bytes.len());
            crate::exit(ExitCode::Fail);
        }
    };
    let manifest = match archive.manifest() {
        Ok(m) => m,
        Err(e) => {
            kprintln!("perch: boot archive: {e}");
            crate::exit(ExitCode::Fail);
        }
    };
    let fs = match Vfs::from_archive(archive.entries().map(|e| (e.path(), e.mode(), e.data()))) {
        Ok(fs) => fs,
        Err(e) => {
            kprintln!("perch: boot archive: cannot build its file system: {e:?}");
            crate::exit(ExitCode::Fail);
        }
    };
    let mut system = System::new(fs);
    let (frames, used) = crate::mm::frames::stats();
    system.ram_bytes = frames * arch_x86::paging::PAGE;
    system.free_ram_bytes = frames.saturating_sub(used) * arch_x86::paging::PAGE;
    system.net = kcore::sys::net::Net::new(arch_x86::cpu::rdtsc());
    crate::net::attach(&mut system);
    linux::set_system(system);
    kprintln!(
        "perch: boot archive: {} entries, {} process(es) in the manifest",
        archive.entries().len(),
        manifest.processes.len()
    );
    let wire = crate::console::sink() == crate::console::Sink::Wire;
    let mut started = 0usize;
    for spec in &manifest.processes {
        let Some(entry) = archive.get(spec.exe.as_bytes()) else {
            kprintln!(
                "perch: {}: cannot start {}: no such file in the boot archive",
                spec.name,
                spec.exe
            );
            continue;
        };
        match linux::start(spec, entry.data()) {
            Ok(s) => {
                started += 1;
                let t = task::get(s.id).map(|t| t.spec);
                let abi = t.map_or("?", |t| t.abi.name());
                kprintln!(
                    "perch: started {} (pid {}): {} ({abi}), entry {:#x}",
                    spec.name,
                    u32::from(s.id) + 1,
                    spec.exe,
                    t.map_or(0, |t| t.entry)
                );
            }
            Err(e) => kprintln!("perch: {}: cannot start {}: {e}", spec.name, spec.exe),
        }
    }
    let tsc_hz = crate::time::tsc_hz();
    let budget = cfg
        .duration_ms
        .map(|ms| (u128::from(ms) * u128::from(tsc_hz) / 1000) as u64);
    let t0 = arch_x86::cpu::rdtsc();
    if wire {
        crate::sample::profile::start();
    }
    let mut timed_out = false;
    if wire {
        announce_new_tasks(&crate::stream::drain::held_now());
    }
    if started > 0 {
        crate::dispatch::run_until(|| {
            if wire {
                // A task made in the last slice is named before its
                // first samples: the drain takes only what was queued
                // before this look.
                let held = crate::stream::drain::held_now();
                announce_new_tasks(&held);
                crate::stream::drain::drain(&held);
                // After the drain: a thread's end follows its samples.
                announce_ended_tasks(false);
            }
            let over = budget.is_some_and(|b| arch_x86::cpu::rdtsc().wrapping_sub(t0) >= b);
            timed_out |= over;
            over
        });
    }
    crate::sample::profile::stop();
    if wire {
        announce_new_tasks(&crate::stream::drain::held_now());
        crate::stream::drain::drain_now();
        announce_ended_tasks(true);
    }
    crate::sample::profile::report_end_of_run();
    crate::stream::drain::report_cost();
    let mut running = 0;
    let mut blocked = 0;
    for id in 0..MAX_TASKS as u8 {
        if let Some(t) = task::get(id) {
            if !t.linux || t.state.ended() {
                continue;
            }
            linux::flush(id);
            if t.state == TaskState::Blocked {
                blocked += 1;
            } else {
                running += 1;
            }
        }
    }
    if timed_out {
        kprintln!(
            "perch: run ended: duration reached ({} still running)",
            running + blocked
        );
    } else if blocked > 0 {
        kprintln!(
            "perch: run ended: {blocked} process(es) blocked forever (a wait nothing can end)"
        );
    } else {
        kprintln!("perch: run ended: all processes exited");
    }
    let unknown = linux::with_system(|s| s.unknown.summary()).unwrap_or_default();
    kprintln!(
        "perch: unknown system calls: {}",
        if unknown.is_empty() {
            "none"
        } else {
            unknown.as_str()
        }
    );
    linux::with_system(|s| {
        let refused = &s.execs;
        if refused.count > 0 {
            kprintln!(
                "perch: programs execve could not run: {} (ENOEXEC)",
                refused.count
            );
            for (path, reason) in &refused.first {
                kprintln!(
                    "perch:   {}: {reason}",
                    core::str::from_utf8(path).unwrap_or("?")
                );
            }
        }
    });
    #[cfg(target_os = "none")]
    if let Some(n) = crate::net::stats() {
        kprintln!(
            "perch: net: {} frames in, {} out, {} not sent (queue full), {} errors",
            n.rx_frames,
            n.tx_frames,
            n.tx_full,
            n.errors
        );
    }
    let (text_dropped, defmt_dropped) = crate::console::dropped();
    // The text console carries no defmt frames: those count only on the wire.
    if text_dropped > 0 || (wire && defmt_dropped > 0) {
        kprintln!("perch: console dropped {text_dropped} text bytes, {defmt_dropped} defmt frames");
    }
    if wire {
        let end = crate::stream::finish();
        let (enc_fail, write_fail) = crate::stream::wire::failures();
        if enc_fail + write_fail > 0 || end.taken != end.delivered + end.lost {
            // The profile is not what was sampled: a runtime fault, not the
            // programs'.
            kprintln!(
                "perch: stream broken: {enc_fail} records not encoded, {write_fail} writes failed, taken {} != delivered {} + lost {}",
                end.taken,
                end.delivered,
                end.lost
            );
            crate::exit(ExitCode::Fail);
        }
    }
    crate::exit(ExitCode::Pass)
}

/// Sends a TaskExit record for every thread that ended since the last
/// call (the stream knows it: its Task record went first), and lets its
/// samples parked for `uregs=return` go. Until `settled` (sampling has
/// stopped), a thread whose CPU has not left it yet waits for a later call
/// (see `take_unannounced_ends`).
fn announce_ended_tasks(settled: bool) {
    let mut ended: heapless::Vec<(u8, u32), { task::MAX_TASKS }> = heapless::Vec::new();
    task::take_unannounced_ends(settled, |id, t| {
        crate::sample::profile::release_parked(u32::from(id) + 1);
        // Cannot fail: one entry a task.
        let _ = ended.push((id, t.pid()));
    });
    if ended.is_empty() {
        return;
    }
    // Its released samples go before its end (and the Task records of
    // tasks made meanwhile before their samples).
    let held = crate::stream::drain::held_now();
    announce_made_tasks();
    crate::stream::drain::drain_counted(&held);
    for (id, pid) in ended {
        crate::stream::send_task_exit(crate::time::now_ns(), pid, u32::from(id) + 1);
        // Only now may a new thread take its slot and ids.
        task::end_told(id);
    }
}

/// Sends a Task record for every thread the stream has not been told of:
/// its pid and tid, its name and its process's program. The execs go
/// last, after the samples queued so far: the drain takes samples in
/// batches, and those of the program a task ran before its exec belong
/// before the exec (a new task's records go first, before its samples).
/// Samples the task took in its new program before this look still go
/// before the exec record too: only a record sent at the exec itself
/// would split them exactly.
fn announce_new_tasks(held: &crate::stream::drain::Held) {
    use sampler::wire::Origin;
    let mut execs: heapless::Vec<(u8, task::Task), MAX_TASKS> = heapless::Vec::new();
    task::take_unannounced(|id, t| match t.origin {
        task::Origin::Named => send_task(id, t, Origin::Named),
        task::Origin::Made { ppid, ptid } => send_task(id, t, Origin::Made { ppid, ptid }),
        // Cannot fail: one entry a task.
        task::Origin::Exec => {
            let _ = execs.push((id, *t));
        }
        // Made and exec'd since the last look: the fork, then the exec
        // (the new program stands for the old one in between).
        task::Origin::MadeThenExec { ppid, ptid } => {
            send_task(id, t, Origin::Made { ppid, ptid });
            let _ = execs.push((id, *t));
        }
    });
    if execs.is_empty() {
        return;
    }
    crate::stream::drain::drain_counted(held);
    for (id, t) in &execs {
        send_task(*id, t, Origin::Exec);
    }
}

/// Sends the Task record of every thread or process made since the last
/// look (an exec's waits for [`announce_new_tasks`], which sends it after
/// the samples of the program it replaces): between counting the rings
/// and draining what was counted, so a task made on another CPU meanwhile
/// is named before its first sample.
fn announce_made_tasks() {
    use sampler::wire::Origin;
    task::take_unannounced_if(
        |t| matches!(t.origin, task::Origin::Made { .. }),
        |id, t| {
            if let task::Origin::Made { ppid, ptid } = t.origin {
                send_task(id, t, Origin::Made { ppid, ptid });
            }
        },
    );
}

/// Sends task `id`'s Task record (its process's program, its name and
/// where it came from), if its process runs a loaded program.
fn send_task(id: u8, t: &task::Task, origin: sampler::wire::Origin) {
    if let Some(program) = linux::program_of(t.proc) {
        crate::stream::send_program_task(
            t.since_ns,
            t.pid(),
            u32::from(id) + 1,
            t.name(),
            t.spec.abi == task::Abi::Compat32,
            program,
            origin,
        );
    }
}
