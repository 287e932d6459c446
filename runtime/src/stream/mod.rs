//! The stream: COM1 in wire mode, and the records the runtime sends on it
//! (Hello, Task, the drained samples, End).

pub mod drain;
pub mod transport;
pub mod wire;

use crate::sample::profile::{self, Source};
use core::cell::RefCell;
use critical_section::Mutex;
use sampler::event::PmuCaps;
use sampler::wire::{
    CpuId, CpuPlace, CpuVendor, End, Hello, Origin, Program, Record, Task, TaskExit,
};

/// Hello and the Task records are sent again this often (TSC time), so a
/// host that joins late, or lost the start to noise, decodes the stream
/// from the next repetition.
pub const REPEAT_NS: u64 = 2_000_000_000;
/// Tasks whose records are repeated (the process table's size, and then
/// some).
const MAX_ANNOUNCED: usize = 32;

/// What was announced, for the periodic repetition.
struct Announced {
    hello: Option<Hello>,
    tasks: heapless::Vec<Task, MAX_ANNOUNCED>,
    next_ns: u64,
}

static ANNOUNCED: Mutex<RefCell<Announced>> = Mutex::new(RefCell::new(Announced {
    hello: None,
    tasks: heapless::Vec::new(),
    next_ns: 0,
}));

/// Sends the Task record `t` and keeps it for the repetition, which says
/// [`Origin::Named`]: the task was made, or its program replaced, once.
fn announce_task(mut t: Task) {
    wire::send(&Record::Task(t.clone()));
    t.origin = Origin::Named;
    critical_section::with(|cs| {
        let mut a = ANNOUNCED.borrow_ref_mut(cs);
        if let Some(old) = a.tasks.iter_mut().find(|o| o.tid == t.tid) {
            *old = t;
        } else {
            // A table full of tasks keeps the first ones repeated.
            let _ = a.tasks.push(t);
        }
    });
}

/// Sends the TaskExit record of task `tid` of process `pid`, and stops
/// repeating its Task record.
pub fn send_task_exit(time: u64, pid: u32, tid: u32) {
    wire::send(&Record::TaskExit(TaskExit { time, pid, tid }));
    critical_section::with(|cs| {
        let mut a = ANNOUNCED.borrow_ref_mut(cs);
        if let Some(i) = a.tasks.iter().position(|t| t.tid == tid) {
            a.tasks.swap_remove(i);
        }
    });
}

/// From the drain loop: once [`REPEAT_NS`] passed since the last time,
/// sends Hello again (same boot, the next repeat number) and every task's
/// Task record, unchanged.
pub fn repeat_if_due() {
    let now = crate::time::now_ns();
    let hello = critical_section::with(|cs| {
        let mut a = ANNOUNCED.borrow_ref_mut(cs);
        if now < a.next_ns {
            return None;
        }
        a.next_ns = now + REPEAT_NS;
        let h = a.hello.as_mut()?;
        h.repeat += 1;
        Some(h.clone())
    });
    let Some(hello) = hello else { return };
    wire::send(&Record::Hello(hello));
    for i in 0..MAX_ANNOUNCED {
        let t = critical_section::with(|cs| ANNOUNCED.borrow_ref(cs).tasks.get(i).cloned());
        match t {
            Some(t) => wire::send(&Record::Task(t)),
            None => break,
        }
    }
}

fn cpu_id() -> CpuId {
    use arch_x86::cpuid::{CpuCpuid, Cpuid};
    let c = CpuCpuid;
    let l0 = c.cpuid(0, 0);
    let mut v = [0u8; 12];
    v[0..4].copy_from_slice(&l0.ebx.to_le_bytes());
    v[4..8].copy_from_slice(&l0.edx.to_le_bytes());
    v[8..12].copy_from_slice(&l0.ecx.to_le_bytes());
    let vendor = match &v {
        b"GenuineIntel" => CpuVendor::Intel,
        b"AuthenticAMD" => CpuVendor::Amd,
        _ => CpuVendor::Other(v),
    };
    let eax = c.cpuid(1, 0).eax;
    let base_family = ((eax >> 8) & 0xf) as u16;
    let base_model = ((eax >> 4) & 0xf) as u16;
    let family = if base_family == 0xf {
        base_family + ((eax >> 20) & 0xff) as u16
    } else {
        base_family
    };
    let model = if base_family == 0x6 || base_family == 0xf {
        base_model | ((((eax >> 16) & 0xf) as u16) << 4)
    } else {
        base_model
    };
    CpuId {
        vendor,
        family,
        model,
        stepping: (eax & 0xf) as u8,
    }
}

unsafe extern "C" {
    static __build_id_note_start: u8;
    static __build_id_note_end: u8;
}

/// The runtime ELF's GNU build-id, from the note the linker script brackets.
pub fn build_id() -> &'static [u8] {
    let start = (&raw const __build_id_note_start) as usize;
    let end = (&raw const __build_id_note_end) as usize;
    let len = end.saturating_sub(start);
    // SAFETY: the linker script places the two symbols around the
    // `.note.gnu.build-id` section inside the read-only data segment, so the
    // bytes between them are mapped and never written.
    let note = unsafe { core::slice::from_raw_parts(start as *const u8, len) };
    // Note: namesz, descsz, type (u32 each), name "GNU\0", then desc.
    if note.len() < 16 {
        return &[];
    }
    let word = |i: usize| u32::from_le_bytes([note[i], note[i + 1], note[i + 2], note[i + 3]]);
    let (namesz, descsz, kind) = (word(0) as usize, word(4) as usize, word(8));
    if kind != 3 || namesz != 4 || &note[12..16] != b"GNU\0" {
        return &[];
    }
    note.get(16..16 + descsz).unwrap_or(&[])
}

/// The CPUs that are up, by number, and where each sits (its APIC ID
/// placed by the topology the boot CPU's CPUID describes).
fn cpu_places() -> heapless::Vec<CpuPlace, { sampler::wire::MAX_CPUS }> {
    let topology = arch_x86::topology::Topology::detect(&arch_x86::cpuid::CpuCpuid);
    let mut places = heapless::Vec::new();
    for index in 0..crate::smp::online() {
        let Some(apic_id) = crate::smp::apic_id(index) else {
            break;
        };
        let p = topology.place(apic_id);
        let place = CpuPlace {
            apic_id,
            package: p.package,
            die: p.die,
            core: p.core,
        };
        if places.push(place).is_err() {
            break;
        }
    }
    places
}

/// Sends Hello: who we are, on which CPUs, and what we sample. Sent once
/// the other CPUs are up ([`crate::smp::start`]): the host takes the
/// first Hello of a boot, and its repetitions carry the same CPUs.
pub fn send_hello(cmdline: &str, source: Source) {
    let caps = match source {
        Source::NmiClock => PmuCaps::cpu_clock(),
        Source::Simulated(c) | Source::Pmu(c) => c,
    };
    let mut h = Hello::new(cpu_id(), caps);
    h.cpus = cpu_places();
    h.ncpus = crate::smp::online();
    h.tsc_hz = crate::time::tsc_hz();
    h.transport = wire::transport_kind();
    let id = build_id();
    let _ = h
        .build_id
        .extend_from_slice(&id[..id.len().min(h.build_id.capacity())]);
    let mut end = cmdline.len().min(h.cmdline.capacity());
    while !cmdline.is_char_boundary(end) {
        end -= 1;
    }
    let _ = h.cmdline.push_str(&cmdline[..end]);
    for e in profile::events() {
        let _ = h.events.push(e);
    }
    let mut boot = [0u8; 8];
    crate::time::random_bytes(&mut boot);
    h.boot = u64::from_le_bytes(boot) | 1;
    wire::send(&Record::Hello(h.clone()));
    critical_section::with(|cs| {
        let mut a = ANNOUNCED.borrow_ref_mut(cs);
        a.hello = Some(h);
        a.next_ns = crate::time::now_ns() + REPEAT_NS;
    });
}

/// Sends the Task record of thread `tid` of loaded process `pid` running
/// `program` (its archive path, build-id and loaded segments), named
/// `name` since `time`; `origin` says why (a task started with the run or
/// renamed, one made by another task, an exec).
pub fn send_program_task(
    time: u64,
    pid: u32,
    tid: u32,
    name: &str,
    compat: bool,
    program: Program,
    origin: Origin,
) {
    let mut t = Task {
        time,
        pid,
        tid,
        name: heapless::String::new(),
        abi: if compat {
            sampler::regs::Abi::Bits32
        } else {
            sampler::regs::Abi::Bits64
        },
        text: heapless::Vec::new(),
        program: Some(program),
        origin,
    };
    let mut end = name.len().min(t.name.capacity());
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    let _ = t.name.push_str(&name[..end]);
    announce_task(t);
}

/// Stops sampling, drains everything and sends End with the final counters.
pub fn finish() -> End {
    profile::stop();
    // Sampling is off, so the ring only empties: this ends.
    while crate::stream::drain::drain_up_to(usize::MAX) > 0 {}
    // Sampling is off but a full flight-recorder buffer may have left
    // records in the ring: wait for room until it is empty.
    while !crate::sample::profile::rings_empty() {
        wire::flush();
        crate::stream::drain::drain_up_to(usize::MAX);
    }
    if let Some((cap, _, high)) = wire::buffer_stats() {
        crate::kprintln!(
            "perch: flight recorder: {} MiB buffer, at most {} KiB of frames waited in it",
            cap >> 20,
            high >> 10
        );
    }
    if crate::smp::online() > 1 {
        for (cpu, c) in crate::stream::drain::cpu_counters() {
            crate::kprintln!(
                "perch: CPU {cpu}: taken {} = delivered {} + lost {}",
                c.taken,
                c.delivered,
                c.lost
            );
        }
    }
    let end = crate::stream::drain::end_counters();
    let end = End {
        time: crate::time::now_ns(),
        frames: wire::frames(),
        unknown_syscalls: crate::abi::linux::unknown_for_end(),
        ..end
    };
    wire::send(&Record::End(end.clone()));
    // Whatever still waits in the buffer or the device leaves before the
    // machine exits.
    wire::flush();
    end
}

/// Takes `mib` MiB of free memory for the flight recorder's buffer
/// (`buffer=MiB`); the size taken, or `None` when no free range is that
/// large.
pub fn setup_buffer(mib: u32) -> Option<usize> {
    let bytes = u64::from(mib) << 20;
    let pa = crate::mm::frames::take_contiguous(bytes)?;
    let va = arch_x86::paging::phys_to_virt(pa) as *mut u8;
    // SAFETY: the frames were just taken from the allocator for good, so
    // nothing else uses them, and the direct map covers every frame the
    // allocator hands out.
    let mem = unsafe { core::slice::from_raw_parts_mut(va, bytes as usize) };
    wire::set_buffer(mem);
    Some(bytes as usize)
}
