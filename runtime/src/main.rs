//! The Perch appliance runtime: boots, takes over the CPU, and either runs
//! the on-target self-test (`selftest`) or the programs of the boot
//! archive in ring 3 under a periodic NMI. Without either there is nothing
//! to run: it says so and exits with the failure code.
#![no_std]
#![no_main]

extern crate alloc;

// The layers, bottom to top (runtime/README.md draws them): no module
// imports one from a layer above its own, and the entry stubs reach the
// top through the upcalls below.
// 1. base services
mod boot;
mod console;
mod symbols;
mod time;
// 2. the CPU: entry stubs, descriptor tables, segments, FPU state
mod cpu;
mod entry;
// 3. memory, the boot archive and the network
mod fs;
mod mm;
mod net;
// 4. the other CPUs
mod smp;
// 5. processes and the scheduler
mod proc;
// 6. the system-call ABIs
mod abi;
// 7. sampling
mod sample;
// 8. the profile stream
mod stream;
// 9. where the layers meet
mod appliance;
mod dispatch;
mod selftest;

use arch_x86::exit::ExitCode;
use kcore::cmdline::{self, ConsoleMode};
use sample::{clock, pmu, profile};

entry_upcalls! {
    trap: dispatch::trap,
    on_return: sample::profile::on_return,
    nmi: sample::nmi::nmi_dispatch,
}

critical_section::set_impl!(cpu::SmpCriticalSection);

/// Called by the boot code in 64-bit mode on the boot stack.
#[unsafe(no_mangle)]
pub extern "C" fn perch_kmain(magic: u32, info: u32) -> ! {
    cpu::early_gs();
    console::init();
    symbols::register(runtime_symbols);
    let boot = boot::read_boot_info(magic, info);
    let tsc_hz = crate::time::calibrate_tsc();
    // One parse; its issues are reported once the console carries what
    // `console=` says.
    let mut issues: heapless::Vec<cmdline::Issue<'_>, 16> = heapless::Vec::new();
    let cfg = cmdline::parse(boot.cmdline(), |i| {
        let _ = issues.push(i);
    });
    let wire_mode = cfg.console_mode() == ConsoleMode::Wire;
    if wire_mode {
        console::set_sink(console::Sink::Wire);
        stream::wire::start(cfg.wire_group);
    }
    let early = &cfg;
    // The PIT's rate until the clock starts (`profile::set_clock_rate` then
    // gives the rate of the device that ticks). `period=NS` sets the NMI
    // clock's rate in place of `freq=`.
    let sample_hz = early.clock_hz();
    let actual_mhz = match arch_x86::pit::rate_for(sample_hz) {
        Ok(r) => r.actual_mhz,
        Err(arch_x86::pit::PitError::TooFast) => u64::from(sample_hz) * 1000,
        Err(_) => 0,
    };
    profile::configure(
        sample_hz,
        actual_mhz,
        match cfg.sample {
            cmdline::SampleFields::Default => profile::SampleSet::Default,
            cmdline::SampleFields::Full => profile::SampleSet::Full,
            cmdline::SampleFields::Minimal => profile::SampleSet::Minimal,
        },
    );
    profile::set_user_regs_at_return(cfg.uregs == cmdline::UserRegsAt::Return);
    // The CPU's tables first: the PMU start-up check takes NMIs. What they
    // report is printed below, after Hello.
    cpu::init();
    let features = cpu::enable_protection();
    let mut reserved = [(0u64, 0u64); boot::MAX_MODULES];
    for (r, m) in reserved.iter_mut().zip(boot.modules()) {
        *r = (m.base, m.base.saturating_add(m.len));
    }
    let mem = match mm::init(features, boot.regions(), &reserved[..boot.modules().len()]) {
        Ok(m) => m,
        Err(mm::MemError::ImageTooLarge(end)) => {
            kprintln!("perch: image ends at {end:#x}, past the 4 KiB-mapped window");
            exit(ExitCode::Crash);
        }
        Err(mm::MemError::NoMemory) => {
            kprintln!(
                "perch: no usable memory in the boot memory map ({} entries)",
                boot.regions().len()
            );
            exit(ExitCode::Crash);
        }
    };
    // The stream's device and the flight recorder's buffer, before Hello
    // (which names the device). Until here frames went to COM1.
    let transport = wire_mode.then(|| stream::wire::select_transport(cfg.transport));
    let buffer = match cfg.buffer_mib {
        Some(mib) if wire_mode => Some((mib, stream::setup_buffer(mib))),
        _ => None,
    };
    // SAFETY: the runtime runs at CPL 0, and `detect` reads only the MSRs
    // CPUID advertises (IA32_PERF_CAPABILITIES with PDCM, IA32_MISC_ENABLE
    // with DS); it writes none.
    let mut msr = unsafe { arch_x86::msr::CpuMsr::new() };
    let pmu_info = arch_x86::cpuid::detect(&arch_x86::cpuid::CpuCpuid, &mut msr);
    // Only `pmu=sim` ever selects the simulator; `pmu=auto` uses the PMU
    // after its start-up check, else the NMI clock.
    // `sim=spr|icl|skl`: which CPU `pmu=sim` simulates.
    let sim_cpu = pmu::sim_cpu(cfg.sim);
    let pmu_boot = pmu::boot(early, &pmu_info, tsc_hz, sim_cpu);
    match &pmu_boot {
        pmu::Boot::Sim(Ok(s)) => profile::configure_sim(s.perf_events()),
        pmu::Boot::Hardware { setup, .. } => profile::configure_hw(setup.perf_events()),
        _ => {}
    }
    profile::configure_fields(
        cfg.period,
        cfg.callchain,
        cfg.uregs_mask,
        cfg.iregs_mask,
        cfg.branch,
    );
    // The other CPUs before Hello, which lists every CPU that is up (the
    // host keeps the first Hello of a boot); what came of it is printed
    // below with the rest.
    smp::set_work(dispatch::cpu_work);
    // Each CPU's sampling and PMU state before it starts; its own PMU
    // programmed by itself once up.
    cpu::set_prepare(|local| profile::prepare_cpu(local) && pmu::prepare_cpu(local));
    smp::set_on_start(pmu::start_this_cpu);
    let cpus = smp::start(
        cfg.smp,
        boot.rsdp(),
        boot.regions(),
        &reserved[..boot.modules().len()],
    );
    if wire_mode {
        stream::send_hello(boot.cmdline(), pmu_boot.source());
    }
    kprintln!("perch: runtime booted via {}", boot.protocol.name());
    kprintln!(
        "perch: TSC {}.{:03} MHz (calibrated against the PIT)",
        tsc_hz / 1_000_000,
        tsc_hz / 1000 % 1000
    );
    kprintln!("perch: command line \"{}\"", boot.cmdline());
    if let Some(probe) = transport {
        report_transport(probe);
    }
    match buffer {
        Some((mib, Some(_))) => {
            kprintln!("perch: flight recorder: {mib} MiB buffer; frames wait there for the line")
        }
        Some((mib, None)) => kprintln!(
            "perch: flight recorder: no free range of {mib} MiB (give the machine more memory); \
             frames go straight to the line"
        ),
        None => {}
    }
    kprintln!(
        "perch: memory: {} MiB usable, {} MiB heap, direct map to {} GiB; {} boot module(s)",
        mem.usable >> 20,
        mem.heap >> 20,
        mem.direct_top >> 30,
        boot.modules().len()
    );
    if boot.cmdline_truncated {
        kprintln!(
            "perch: command line longer than {} bytes, cut",
            boot::CMDLINE_MAX
        );
    }
    crate::time::init_realtime();
    let timer = proc::tick::calibrate(tsc_hz);
    if timer == 0 {
        kprintln!("perch: local APIC timer does not run: no preemption");
    }
    if let Some(ms) = cfg.slice_ms {
        proc::tick::set_slice_ms(ms);
    }
    kprintln!(
        "perch: scheduler: {} ms slices, {} Hz tick (local APIC timer, {timer} counts per tick)",
        u64::from(proc::tick::slice_ticks()) * 1000 / proc::tick::TICK_HZ,
        proc::tick::TICK_HZ
    );
    for issue in &issues {
        kprintln!("perch: {issue}");
    }
    if let Some(n) = cfg.ring_slots {
        match profile::set_ring_slots(n) {
            Ok(c) => kprintln!("perch: ring capped at {c} slots"),
            Err(e) => kprintln!("perch: ring={n} refused: {e}"),
        }
    }
    kprintln!(
        "perch: cpu tables loaded; nx={} smep={} smap={}",
        features.nx,
        features.smep,
        features.smap
    );
    profile::configure_throttle(cfg.max_rate, cfg.cpu_pct);
    match (cfg.max_rate, cfg.cpu_pct) {
        (0, _) => kprintln!("perch: throttle: no sample-rate limit (max_rate=0)"),
        (rate, 0) => kprintln!(
            "perch: throttle: max_rate={rate}/s ({} per {} Hz tick), no CPU-time budget (cpu_pct=0)",
            u64::from(rate).div_ceil(profile::TICK_HZ),
            profile::TICK_HZ
        ),
        (rate, pct) => kprintln!(
            "perch: throttle: max_rate={rate}/s ({} per {} Hz tick), cpu_pct={pct}% (average handler time up to {} ns)",
            u64::from(rate).div_ceil(profile::TICK_HZ),
            profile::TICK_HZ,
            1_000_000_000 / u64::from(rate) * u64::from(pct) / 100
        ),
    }
    defmt::info!("runtime up, selftest={=bool}", cfg.selftest);
    pmu::report_boot(&pmu_boot, &cfg.events);
    // With the hardware PMU its overflow NMIs sample and the clock runs at
    // the throttle's tick rate only (to restart throttled counters).
    let clock_hz = if pmu_boot.hardware() {
        profile::TICK_HZ as u32
    } else {
        sample_hz
    };
    match clock::start(clock_hz, pmu_boot.hardware(), cfg.clock) {
        Ok(c) => {
            if !pmu_boot.hardware() {
                profile::set_clock_rate(c.actual_mhz);
            }
            kprintln!(
                "perch: nmi clock: {} at {} Hz (divisor {}, {}.{:03} Hz){}{}",
                c.source,
                clock_hz,
                c.divisor,
                c.actual_mhz / 1000,
                c.actual_mhz % 1000,
                if c.hpet_found {
                    "; HPET legacy routing off"
                } else {
                    ""
                },
                if pmu_boot.hardware() {
                    "; the throttle's tick only: the PMU's overflow NMIs sample"
                } else {
                    ""
                }
            )
        }
        Err(clock::ClockError::Rate(e)) => {
            kprintln!("perch: nmi clock not started: {clock_hz} Hz: {e:?}")
        }
        Err(clock::ClockError::Hpet(e)) => {
            kprintln!("perch: nmi clock not started: {clock_hz} Hz needs the HPET: {e:?}")
        }
    }
    // The self-test places its tasks itself.
    if cfg.sched == cmdline::Sched::Spread && !cfg.selftest && smp::online() > 1 {
        // Threads run on every CPU: the clock's NMIs reach them all, by
        // the I/O APIC's broadcast, or (`fanout=ipi`, when the clock
        // samples) forwarded by the boot CPU.
        proc::set_spread(true);
        if cfg.fanout == cmdline::ClockFanout::Ipi && !pmu_boot.hardware() {
            profile::route_clock_through_the_boot_cpu();
            kprintln!(
                "perch: nmi clock: the boot CPU forwards each tick to the other CPUs (fanout=ipi)"
            );
        } else {
            clock::deliver_to_every_cpu(true);
        }
    }
    report_cpus(&cpus);
    pmu::report_cpus();
    // A virtio-net card, when the machine has one (`perch record --net`).
    net::init(cfg.net);
    if let Some(kind) = cfg.crash {
        provoke_crash(kind);
    }
    if cfg.selftest {
        selftest::run(&cfg, boot.modules().first().copied(), boot.protocol.name())
    } else if let Some(archive) = boot.modules().first() {
        appliance::run(&cfg, archive)
    } else {
        kprintln!(
            "perch: nothing to run: no boot archive (give one as the PVH module, \
             `qemu -initrd app.cpio`, or a multiboot2 module; `perch record -- PROGRAM` \
             packs one) and no `selftest` on the command line"
        );
        exit(ExitCode::Fail)
    }
}

/// Says how many CPUs are up, and why any the MADT lists are not.
fn report_cpus(r: &smp::Report) {
    let mode = if r.x2apic { "x2APIC" } else { "xAPIC" };
    match r.error {
        Some(e) => kprintln!("perch: cpus: 1 up (the boot CPU): {e}"),
        None => kprintln!(
            "perch: cpus: {} of {} up ({mode}); {}",
            r.online,
            r.listed,
            if proc::spread() {
                "threads are spread over them"
            } else {
                "programs run on CPU 0"
            }
        ),
    }
    let t = arch_x86::topology::Topology::detect(&arch_x86::cpuid::CpuCpuid);
    kprintln!(
        "perch: cpus: topology from {}: {} APIC ID bits for the thread, {} for the core and die",
        match t.source {
            arch_x86::topology::Source::Leaf1F => "CPUID leaf 1FH",
            arch_x86::topology::Source::Leaf0B => "CPUID leaf 0BH",
            arch_x86::topology::Source::Leaf4 => "CPUID leaves 1 and 4",
            arch_x86::topology::Source::Amd => "CPUID leaf 8000_0008H",
            arch_x86::topology::Source::Leaf1 => "CPUID leaf 1",
            arch_x86::topology::Source::None => "no CPUID leaf (one package)",
        },
        t.smt_shift,
        t.pkg_shift.saturating_sub(t.smt_shift)
    );
    if r.left_out > 0 {
        kprintln!("perch: cpus: smp= leaves {} out", r.left_out);
    }
    if r.over > 0 {
        kprintln!(
            "perch: cpus: {} past the {} the runtime keeps are not started",
            r.over,
            arch_x86::madt::MAX_CPUS
        );
    }
    for id in &r.failed {
        kprintln!("perch: cpus: the CPU with APIC ID {id} did not come up");
    }
}

/// Says which device carries the stream, and why when it is not virtio.
fn report_transport(probe: stream::transport::Probe) {
    #[cfg(target_os = "none")]
    use arch_x86::virtio::{Bus, ProbeError};
    use stream::transport::Probe;
    let kind = stream::wire::transport_kind().name();
    match probe {
        Probe::NotAsked => kprintln!("perch: stream: {kind} (transport=uart)"),
        #[cfg(not(target_os = "none"))]
        Probe::Unavailable => kprintln!("perch: stream: {kind} (no virtio driver in this build)"),
        #[cfg(target_os = "none")]
        Probe::Found(Bus::Pci { device, function }) => {
            kprintln!("perch: stream: {kind} at PCI 00:{device:02x}.{function}")
        }
        #[cfg(target_os = "none")]
        Probe::Found(Bus::Mmio(pa)) => kprintln!("perch: stream: {kind} at {pa:#x}"),
        #[cfg(target_os = "none")]
        Probe::Failed(ProbeError::NotFound) => {
            kprintln!("perch: stream: {kind} (no virtio console device)")
        }
        #[cfg(target_os = "none")]
        Probe::Failed(ProbeError::Pci(_)) => kprintln!(
            "perch: stream: {kind} (the virtio console's PCI BARs are unassigned or above 4 GiB)"
        ),
        #[cfg(target_os = "none")]
        Probe::Failed(ProbeError::Setup(_, e)) => {
            kprintln!("perch: stream: {kind} (virtio console set-up failed: {e})")
        }
    }
}

/// The runtime's named entry points, for reports ([`symbols::Nearest`]).
fn runtime_symbols(add: &mut dyn FnMut(u64, &'static str)) {
    let table = [
        (provoke_crash as *const () as u64, "provoke_crash"),
        (perch_kmain as *const () as u64, "perch_kmain"),
        (perch_upcall_trap as *const () as u64, "perch_upcall_trap"),
        (
            dispatch::runtime_exception as *const () as u64,
            "runtime_exception",
        ),
        (perch_upcall_nmi as *const () as u64, "perch_upcall_nmi"),
        (abi::perch::handle as *const () as u64, "syscall::handle"),
        (abi::perch::sys_spin as *const () as u64, "sys_spin"),
        (proc::run_once as *const () as u64, "task::run_once"),
        (entry::syscall_entry(), "perch_syscall_entry"),
        (entry::nmi_entry(), "perch_nmi_entry"),
        (entry::isr_stub(0), "perch_isr_table"),
        (entry::exit_window().0, "perch_exit_window_start"),
        (entry::exit_window().1, "perch_leave_to_scheduler"),
        (selftest::run as *const () as u64, "selftest::run"),
        (mm::layout().user_text.0, "appliance .user.text"),
        (mm::layout().text.0, ".text"),
    ];
    for (addr, name) in table.into_iter().chain(selftest::programs::symbols()) {
        add(addr, name);
    }
}

/// Provokes a fault in the runtime itself (`crash=`), to exercise crash reporting.
#[inline(never)]
pub fn provoke_crash(kind: cmdline::CrashKind) {
    kprintln!("perch: crash={kind:?} requested");
    match kind {
        // SAFETY: deliberately reads the unmapped page 0; the #PF handler
        // reports the fault and exits, it never returns here.
        cmdline::CrashKind::PageFault => unsafe {
            core::arch::asm!("mov rax, [0]", out("rax") _, options(nostack, readonly))
        },
        // SAFETY: deliberately raises #UD; the handler reports and exits.
        cmdline::CrashKind::InvalidOpcode => unsafe {
            core::arch::asm!("ud2", options(nostack, nomem))
        },
        // SAFETY: deliberately points RSP at an unmapped page and pushes: the
        // #PF cannot be delivered on that stack, so the CPU raises #DF on its
        // IST stack, whose handler reports and exits.
        cmdline::CrashKind::DoubleFault => unsafe {
            core::arch::asm!("xor esp, esp", "push rax", options(noreturn))
        },
        cmdline::CrashKind::Smap => {
            // A process's address space maps the ring-3 image; load one.
            let Some(space) = proc::builtin_space() else {
                kprintln!("perch: no memory for an address space");
                return;
            };
            space.activate();
            let addr = abs_addr!(selftest::recorder::perch_user_stop);
            // SAFETY: deliberately reads an appliance page without `stac`; with
            // SMAP on this raises #PF, whose handler reports and exits. Without
            // SMAP the read of the (mapped) flag is harmless.
            let v = unsafe { core::ptr::read_volatile(addr as *const u32) };
            kprintln!("perch: read appliance memory without stac: {v} (SMAP is off)");
            drop(space);
        }
        cmdline::CrashKind::Panic => panic!("crash=panic requested on the command line"),
    }
}

/// Stops the clock and the PMU, reports the PMU's counters (unknown NMIs
/// included) unless the runtime crashed, and leaves through the debug-exit
/// device.
pub fn exit(code: ExitCode) -> ! {
    clock::stop();
    if code == ExitCode::Crash {
        // The crash may have hit the PMU path itself: only silence the PMIs.
        pmu::mask_pmis();
    } else {
        pmu::stop_hw();
        pmu::report_end();
        // Nothing the stream holds is lost to the exit.
        if stream::wire::started() {
            stream::wire::flush();
        }
    }
    // SAFETY: port 0xf4 is QEMU's isa-debug-exit or unused on hardware.
    unsafe { arch_x86::exit::exit(code) }
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    console::emergency_print(format_args!("\nRUNTIME PANIC: {info}\n"));
    exit(ExitCode::Crash)
}
