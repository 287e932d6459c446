//! The on-target self-test (`selftest` on the command line). Each test
//! prints `selftest: NAME ... ok` or `... FAILED (why)`; the run ends with
//! `N passed, M failed` and QEMU exits with the pass or fail code.
// Failure reasons are formatted into a fixed-size buffer (there is no
// allocator), so the error type is large by design.
#![allow(clippy::result_large_err)]

pub mod programs;
pub mod recorder;
use crate::abi::perch as syscall;
use crate::proc::{self as task, Abi, TaskSpec, TaskState};
use crate::sample::nmi::{self, UserFrameState};
use crate::sample::profile;
use crate::selftest::programs::{self as user, pattern32, pattern64};
use crate::{kprintln, mm};
use arch_x86::cmdline::Config;
use arch_x86::exit::ExitCode;
use arch_x86::frame::{INT80_VECTOR, Mode, SYSCALL_VECTOR, TrapFrame};
use arch_x86::pmu::selftest::{Reason, Verdict};
use arch_x86::{cpu, gdt, paging as pg};
use core::fmt::Write;

type Why = heapless::String<200>;

macro_rules! fail {
    ($($arg:tt)*) => {{
        let mut why = Why::new();
        let _ = write!(why, $($arg)*);
        return Err(why);
    }};
}

macro_rules! ensure {
    ($cond:expr, $($arg:tt)*) => {
        if !$cond {
            fail!($($arg)*);
        }
    };
}

type TestResult = Result<(), Why>;

struct Runner {
    passed: u32,
    failed: u32,
}

impl Runner {
    fn check(&mut self, name: &str, f: impl FnOnce() -> TestResult) {
        task::clear();
        match f() {
            Ok(()) => {
                self.passed += 1;
                kprintln!("selftest: {name} ... ok");
            }
            Err(why) => {
                self.failed += 1;
                kprintln!("selftest: {name} ... FAILED ({why})");
            }
        }
    }
}

/// NMIs wanted per capture test.
const WANT_CAPTURES: u32 = 8;
/// Iteration budget of the user spin loops (ends them if NMIs never come).
const SPIN_BUDGET: u64 = 400_000_000;

/// Runs every test and exits QEMU.
pub fn run(cfg: &Config, archive: Option<arch_x86::bootinfo::Module>, protocol: &str) -> ! {
    kprintln!("selftest: starting (nmi clock at {} Hz)", cfg.freq_hz);
    nmi::set_observer(0, recorder::on_capture);
    let mut r = Runner {
        passed: 0,
        failed: 0,
    };
    r.check("boot_archive", || boot_archive(archive, protocol));
    r.check("descriptor_tables", descriptor_tables);
    r.check("frame_windows", frame_windows);
    r.check("paging_rights", paging_rights);
    r.check("syscall_abi_64", syscall_abi_64);
    r.check("int80_abi_compat", int80_abi_compat);
    for f in FAULTS {
        r.check(f.name, || user_fault(f));
    }
    r.check("runtime_survives_faults", || {
        syscall_abi_64()?;
        int80_abi_compat()
    });
    r.check("preemption", preemption);
    r.check("nmi_clock_ticks", nmi_clock_ticks);
    r.check("nmi_clock_throttle", || nmi_clock_throttle(cfg));
    r.check("pmu_detection_and_fallback", pmu_detection_and_fallback);
    r.check("pmu_sim_pmi_round_trip", pmu_sim_pmi_round_trip);
    r.check("pmu_startup_check_sim", pmu_startup_check_sim);
    r.check("pmu_event_description", pmu_event_description);
    r.check("pmu_hardware", pmu_hardware);
    r.check("nmi_in_user64_exact_regs", exact_regs_user64);
    r.check("nmi_in_compat_exact_regs", exact_regs_compat);
    r.check("nmi_in_syscall_user_frame", spin_in_syscall64);
    r.check("nmi_in_int80_user_frame", spin_in_int80);
    task::linux::set_system(kcore::sys::System::new(kcore::sys::Vfs::new()));
    r.check("loaded_address_spaces", loaded_address_spaces);
    r.check("loaded_nmi_in_user64_exact_regs", loaded_exact_regs64);
    r.check("loaded_nmi_in_compat_exact_regs", loaded_exact_regs32);
    r.check("loaded_nmi_in_syscall_user_frame", loaded_syscall_frame64);
    r.check("loaded_nmi_in_int80_user_frame", loaded_int80_frame32);
    kprintln!("{} passed, {} failed", r.passed, r.failed);
    crate::exit(if r.failed == 0 {
        ExitCode::Pass
    } else {
        ExitCode::Fail
    })
}

fn descriptor_tables() -> TestResult {
    let g = cpu::sgdt();
    let (gbase, glimit) = (g.base, g.limit);
    ensure!(
        gbase == crate::cpu::gdt_base(),
        "GDTR base {gbase:#x} is not the runtime GDT"
    );
    ensure!(
        usize::from(glimit) == gdt::GDT_ENTRIES * 8 - 1,
        "GDTR limit {glimit}"
    );
    let live = crate::cpu::gdt_copy();
    let tss_base = {
        let lo = live[6];
        ((lo >> 16) & 0xff_ffff) | (((lo >> 56) & 0xff) << 24) | (live[7] << 32)
    };
    let want = gdt::build(tss_base);
    // The TLS slots belong to whichever compat process last ran.
    for (i, (l, w)) in live
        .iter()
        .zip(want.iter())
        .enumerate()
        .take(gdt::TLS_FIRST)
    {
        // The CPU marks the TSS busy (type 9 -> 0xb) on `ltr` and sets the
        // accessed bit of segments it loads.
        let l = if i == 6 {
            l & !(2 << 40)
        } else {
            l & !(1 << 40)
        };
        ensure!(l == *w, "GDT slot {i}: {l:#018x}, built {w:#018x}");
    }
    ensure!(cpu::str() == gdt::TSS, "TR = {:#x}", cpu::str());
    ensure!(cpu::cs() == gdt::KERNEL_CODE, "CS = {:#x}", cpu::cs());
    let i = cpu::sidt();
    let (ibase, ilimit) = (i.base, i.limit);
    ensure!(
        ibase == crate::cpu::idt_base() && ilimit == 4095,
        "IDTR {ibase:#x}/{ilimit}"
    );
    let nmi = crate::cpu::idt_entry(2);
    ensure!(
        nmi.ist() == gdt::IST_NMI && nmi.handler() == crate::entry::nmi_entry(),
        "NMI gate"
    );
    ensure!(
        crate::cpu::idt_entry(8).ist() == gdt::IST_DOUBLE_FAULT,
        "#DF gate has no IST"
    );
    ensure!(
        crate::cpu::idt_entry(18).ist() == gdt::IST_MACHINE_CHECK,
        "#MC gate has no IST"
    );
    ensure!(
        crate::cpu::idt_entry(0x80).dpl() == 3,
        "int 0x80 gate not DPL 3"
    );
    ensure!(
        crate::cpu::idt_entry(13).dpl() == 0,
        "#GP gate reachable from ring 3"
    );
    for v in 0..=255u8 {
        ensure!(crate::cpu::idt_entry(v).present(), "vector {v} has no gate");
    }
    // SAFETY: reading the STAR/LSTAR MSRs has no side effects.
    let (star, lstar) = unsafe {
        (
            x86::msr::rdmsr(x86::msr::IA32_STAR),
            x86::msr::rdmsr(x86::msr::IA32_LSTAR),
        )
    };
    ensure!(star == gdt::star(), "STAR {star:#x}");
    ensure!(lstar == crate::entry::syscall_entry(), "LSTAR {lstar:#x}");
    Ok(())
}

fn frame_windows() -> TestResult {
    let (a, b) = crate::entry::entry_window();
    let (c, d) = crate::entry::exit_window();
    ensure!(
        a < b && c < d && b <= c,
        "windows out of order: {a:#x}..{b:#x}, {c:#x}..{d:#x}"
    );
    ensure!(
        crate::entry::in_frame_window(crate::entry::syscall_entry()),
        "SYSCALL entry outside the entry window"
    );
    ensure!(
        crate::entry::in_frame_window(crate::entry::isr_stub(0x80)),
        "int 0x80 stub outside the entry window"
    );
    ensure!(
        !crate::entry::in_frame_window(crate::entry::nmi_entry()),
        "NMI entry inside a frame window"
    );
    ensure!(
        !crate::entry::in_frame_window(syscall::sys_spin as *const () as u64),
        "sys_spin inside a frame window"
    );
    Ok(())
}

fn paging_rights() -> TestResult {
    let f = cpu::features();
    ensure!(cpu::cr0() & cpu::CR0_WP != 0, "CR0.WP off");
    ensure!(
        (cpu::cr4() & cpu::CR4_SMEP != 0) == f.smep,
        "CR4.SMEP does not match CPUID ({})",
        f.smep
    );
    ensure!(
        (cpu::cr4() & cpu::CR4_SMAP != 0) == f.smap,
        "CR4.SMAP does not match CPUID ({})",
        f.smap
    );
    let nx = if f.nx { pg::NO_EXECUTE } else { 0 };
    let kernel_text = crate::perch_kmain as *const () as u64;
    let kernel_data = crate::cpu::gdt_base();
    let user_text = user::addr(user::perch_st_hello64);
    let user_data = user::addr(user::perch_st_data_code);
    let cases = [
        ("page 0", 0, 0, pg::PRESENT),
        (
            "runtime text",
            kernel_text,
            pg::PRESENT,
            pg::USER | pg::WRITABLE | pg::NO_EXECUTE,
        ),
        (
            "runtime data",
            kernel_data,
            pg::PRESENT | pg::WRITABLE | nx,
            pg::USER,
        ),
        (
            "appliance text",
            user_text,
            pg::PRESENT | pg::USER,
            pg::WRITABLE | pg::NO_EXECUTE,
        ),
        (
            "appliance data",
            user_data,
            pg::PRESENT | pg::USER | pg::WRITABLE | nx,
            0,
        ),
    ];
    let Some(space) = task::builtin_space() else {
        fail!("no memory for an address space");
    };
    for (what, addr, must, must_not) in cases {
        let e = space.entry(addr);
        ensure!(
            e & must == must && e & must_not == 0,
            "{what} at {addr:#x} mapped {e:#x}"
        );
    }
    // The kernel's own root maps no user page; a process's root maps the
    // runtime exactly as the kernel's does.
    ensure!(
        mm::kernel_entry(user_text) == 0 && mm::kernel_entry(user_data) == 0,
        "the kernel's root maps ring-3 pages"
    );
    for addr in [kernel_text, kernel_data] {
        ensure!(
            space.entry(addr) == mm::kernel_entry(addr),
            "{addr:#x} differs between the process's and the kernel's root"
        );
    }
    Ok(())
}

fn spec(name: &'static str, abi: Abi, entry: unsafe extern "C" fn()) -> TaskSpec {
    TaskSpec {
        name,
        abi,
        entry: user::addr(entry),
        text: (
            user::addr(user::perch_st_hello64),
            user::addr(user::perch_st_end),
        ),
        gprs: [0; 15],
    }
}

fn run_to_end(s: TaskSpec) -> Result<task::Task, Why> {
    let id = match task::spawn(s) {
        Ok(id) => id,
        Err(e) => fail!("spawn {}: {e:?}", s.name),
    };
    task::run_all(|| false);
    match task::get(id) {
        Some(t) => Ok(t),
        None => fail!("task {} vanished", s.name),
    }
}

/// A process that never enters the runtime is preempted by the tick: two
/// such spinners share the CPU with a process that makes system calls,
/// which runs to its end while they spin; the run ends when asked.
fn preemption() -> TestResult {
    let mut ids = [0u8; 3];
    for (i, (name, entry)) in [
        (
            "spin_a",
            user::perch_st_spin_forever as unsafe extern "C" fn(),
        ),
        ("spin_b", user::perch_st_spin_forever),
        ("hello64", user::perch_st_hello64),
    ]
    .into_iter()
    .enumerate()
    {
        ids[i] = match task::spawn(spec(name, Abi::X64, entry)) {
            Ok(id) => id,
            Err(e) => fail!("spawn {name}: {e:?}"),
        };
    }
    let slice = u64::from(task::tick::slice_ticks());
    let t0 = task::tick::ticks();
    // Ten slices of each spinner.
    let want = 20 * slice;
    task::run_all(|| task::tick::ticks() - t0 >= want);
    let ticks = task::tick::ticks() - t0;
    let (a, b, h) = match (task::get(ids[0]), task::get(ids[1]), task::get(ids[2])) {
        (Some(a), Some(b), Some(h)) => (a, b, h),
        _ => fail!("a task vanished"),
    };
    task::clear();
    ensure!(
        ticks >= want,
        "the run stopped after {ticks} ticks, before {want}"
    );
    ensure!(
        h.state == TaskState::Exited(user::HELLO64_EXIT),
        "hello64 did not finish beside the spinners: {:?}",
        h.state
    );
    for t in [a, b] {
        ensure!(
            t.state == TaskState::Ready,
            "{} ended: {:?}",
            t.spec.name,
            t.state
        );
        ensure!(
            t.preemptions >= 5,
            "{} preempted {} times in {ticks} ticks ({slice}-tick slices)",
            t.spec.name,
            t.preemptions
        );
    }
    Ok(())
}

fn syscall_abi_64() -> TestResult {
    let t = run_to_end(spec("hello64", Abi::X64, user::perch_st_hello64))?;
    ensure!(
        t.state == TaskState::Exited(user::HELLO64_EXIT),
        "state {:?}",
        t.state
    );
    ensure!(t.bytes_written == 32, "wrote {} bytes", t.bytes_written);
    ensure!(t.yields == 1, "yielded {} times", t.yields);
    Ok(())
}

fn int80_abi_compat() -> TestResult {
    let t = run_to_end(spec("hello32", Abi::Compat32, user::perch_st_hello32))?;
    ensure!(
        t.state == TaskState::Exited(user::HELLO32_EXIT),
        "state {:?}",
        t.state
    );
    ensure!(t.bytes_written == 37, "wrote {} bytes", t.bytes_written);
    ensure!(t.yields == 1, "yielded {} times", t.yields);
    Ok(())
}

struct FaultCase {
    name: &'static str,
    abi: Abi,
    entry: unsafe extern "C" fn(),
    vector: u64,
    /// Required page-fault error code bits (present, write, user, fetch).
    error_code: Option<u64>,
    /// Required CR2 (page faults).
    cr2: Option<fn() -> u64>,
}

const FAULTS: &[FaultCase] = &[
    FaultCase {
        name: "user64_divide_error",
        abi: Abi::X64,
        entry: user::perch_st_fault_de,
        vector: 0,
        error_code: None,
        cr2: None,
    },
    FaultCase {
        name: "user64_invalid_opcode",
        abi: Abi::X64,
        entry: user::perch_st_fault_ud,
        vector: 6,
        error_code: None,
        cr2: None,
    },
    FaultCase {
        name: "user64_breakpoint",
        abi: Abi::X64,
        entry: user::perch_st_fault_bp,
        vector: 3,
        error_code: None,
        cr2: None,
    },
    FaultCase {
        name: "user64_rdmsr_privileged",
        abi: Abi::X64,
        entry: user::perch_st_fault_rdmsr,
        vector: 13,
        error_code: Some(0),
        cr2: None,
    },
    FaultCase {
        name: "user64_hlt_privileged",
        abi: Abi::X64,
        entry: user::perch_st_fault_hlt,
        vector: 13,
        error_code: Some(0),
        cr2: None,
    },
    FaultCase {
        name: "user64_noncanonical_gp",
        abi: Abi::X64,
        entry: user::perch_st_fault_noncanonical,
        vector: 13,
        error_code: Some(0),
        cr2: None,
    },
    FaultCase {
        name: "user64_null_page_fault",
        abi: Abi::X64,
        entry: user::perch_st_fault_null,
        vector: 14,
        error_code: Some(0x4),
        cr2: Some(|| 0),
    },
    FaultCase {
        name: "user64_reads_runtime",
        abi: Abi::X64,
        entry: user::perch_st_fault_kernel_read,
        vector: 14,
        error_code: Some(0x5),
        cr2: Some(|| crate::perch_kmain as *const () as u64),
    },
    FaultCase {
        name: "user64_writes_own_text",
        abi: Abi::X64,
        entry: user::perch_st_fault_text_write,
        vector: 14,
        error_code: Some(0x7),
        cr2: Some(|| user::addr(user::perch_st_fault_text_write)),
    },
    FaultCase {
        name: "user64_executes_data_nx",
        abi: Abi::X64,
        entry: user::perch_st_fault_nx,
        vector: 14,
        error_code: Some(0x15),
        cr2: Some(|| user::addr(user::perch_st_data_code)),
    },
    FaultCase {
        name: "compat_invalid_opcode",
        abi: Abi::Compat32,
        entry: user::perch_st_fault32_ud,
        vector: 6,
        error_code: None,
        cr2: None,
    },
    FaultCase {
        name: "compat_null_page_fault",
        abi: Abi::Compat32,
        entry: user::perch_st_fault32_pf,
        vector: 14,
        error_code: Some(0x4),
        cr2: Some(|| 0),
    },
    FaultCase {
        name: "compat_divide_error",
        abi: Abi::Compat32,
        entry: user::perch_st_fault32_de,
        vector: 0,
        error_code: None,
        cr2: None,
    },
];

fn user_fault(c: &FaultCase) -> TestResult {
    if c.name == "user64_executes_data_nx" && !cpu::features().nx {
        return Ok(());
    }
    let t = run_to_end(spec(c.name, c.abi, c.entry))?;
    let TaskState::Faulted(f) = t.state else {
        fail!("task was not ended by a fault: {:?}", t.state);
    };
    ensure!(
        f.vector == c.vector,
        "vector {} (want {})",
        f.vector,
        c.vector
    );
    let want_cs = match c.abi {
        Abi::X64 => gdt::USER_CODE64,
        Abi::Compat32 => gdt::USER_CODE32,
    };
    ensure!(f.cs == u64::from(want_cs), "cs {:#x}", f.cs);
    // An instruction fetch fault reports the target as RIP; others the faulting instruction.
    let fetch_fault = f.vector == 14 && f.error_code & 0x10 != 0;
    ensure!(
        (f.rip >= user::addr(c.entry) && f.rip < user::addr(c.entry) + 32)
            || (fetch_fault && f.rip == f.cr2),
        "rip {:#x} outside the task",
        f.rip
    );
    if let Some(e) = c.error_code {
        ensure!(
            f.error_code == e,
            "error code {:#x} (want {e:#x})",
            f.error_code
        );
    }
    if let Some(cr2) = c.cr2 {
        ensure!(f.cr2 == cr2(), "cr2 {:#x} (want {:#x})", f.cr2, cr2());
    }
    Ok(())
}

fn nmi_clock_ticks() -> TestResult {
    let start = nmi::nmi_count();
    let t0 = cpu::rdtsc();
    while nmi::nmi_count() - start < 20 {
        if cpu::rdtsc() - t0 > 4_000_000_000 {
            fail!("only {} NMIs arrived", nmi::nmi_count() - start);
        }
        cpu::halt();
    }
    Ok(())
}

/// The NMI clock faster than `max_rate` allows: with one sample per
/// 1 ms tick allowed (`max_rate=1000`) and the clock at `freq` >= 2 kHz,
/// each tick's second NMI samples and throttles (a Throttle record after
/// its sample), the tick's later NMIs are suppressed and counted, and the
/// next tick's first NMI unthrottles (an Unthrottle record) and samples.
/// Every clock NMI taken while sampling is either a queued sample or a
/// suppressed one, exactly, and the End counters add up.
fn nmi_clock_throttle(cfg: &Config) -> TestResult {
    use sampler::drain::NmiRecord;
    if cfg.freq_hz < 2000 || cpu_pmu_sampling() {
        kprintln!("selftest: nmi_clock_throttle: skipped (needs the NMI clock at 2 kHz or more)");
        return Ok(());
    }
    // Leftovers from earlier tests, if any, are not this test's.
    profile::take_queued(|_| {});
    profile::configure_throttle(1000, 0);
    let before = profile::throttle_stats();
    let end_before = profile::end_counters();
    // The handler counts the clock NMIs it takes while sampling is on.
    let n0 = profile::clock_overflows();
    profile::start();
    // 20 ms: about 20 ticks.
    let t0 = cpu::rdtsc();
    let budget = crate::sample::clock::tsc_hz() / 50;
    while cpu::rdtsc() - t0 < budget {
        cpu::halt();
    }
    profile::stop();
    let nmis = profile::clock_overflows() - n0;
    let (mut samples, mut throttles, mut unthrottles) = (0u64, 0u64, 0u64);
    let mut order_ok = true;
    let mut last_was_sample = false;
    let mut throttled = false;
    profile::take_queued(|r| match r {
        NmiRecord::Sample(_) => {
            samples += 1;
            order_ok &= !throttled;
            last_was_sample = true;
        }
        NmiRecord::Throttle(_) => {
            throttles += 1;
            order_ok &= last_was_sample && !throttled;
            throttled = true;
            last_was_sample = false;
        }
        NmiRecord::Unthrottle(_) => {
            unthrottles += 1;
            order_ok &= throttled;
            throttled = false;
            last_was_sample = false;
        }
    });
    let after = profile::throttle_stats();
    let end = profile::end_counters();
    profile::configure_throttle(cfg.max_rate, cfg.cpu_pct);
    let suppressed = after.suppressed - before.suppressed;
    ensure!(
        throttles > 0 && unthrottles > 0,
        "{nmis} NMIs at {} Hz: {throttles} Throttle and {unthrottles} Unthrottle records",
        cfg.freq_hz
    );
    ensure!(
        order_ok,
        "records out of order: a Throttle must follow a sample, samples only while unthrottled"
    );
    ensure!(
        after.throttles == throttles && throttles - unthrottles <= 1,
        "throttled {} times, {throttles} Throttle / {unthrottles} Unthrottle records",
        after.throttles
    );
    ensure!(
        after.records - before.records == throttles + unthrottles
            && after.records_dropped == before.records_dropped,
        "{} records counted, {} queued",
        after.records - before.records,
        throttles + unthrottles
    );
    ensure!(
        samples + suppressed == nmis && suppressed > 0,
        "{nmis} clock NMIs while sampling, but {samples} samples + {suppressed} suppressed"
    );
    // At most two samples per tick (the allowed one and the one that
    // throttles), so at least half the NMIs beyond that were suppressed.
    let ticks = budget / (crate::sample::clock::tsc_hz() / 1000).max(1) + 2;
    ensure!(
        samples <= 2 * ticks,
        "{samples} samples in about {ticks} ticks at max_rate=1000"
    );
    let taken = end.taken - end_before.taken;
    let delivered = end.delivered - end_before.delivered;
    let lost = end.lost - end_before.lost;
    ensure!(
        taken == nmis && delivered == samples && lost == suppressed && taken == delivered + lost,
        "End counters: taken {taken} = delivered {delivered} + lost {lost}; want {nmis} = {samples} + {suppressed}"
    );
    Ok(())
}

/// Whether a PMU (hardware or simulated) samples: the clock's NMIs are
/// then not the overflows.
fn cpu_pmu_sampling() -> bool {
    crate::sample::pmu::hw_active() || crate::sample::pmu::sim_active()
}

/// Detection through CPUID: on QEMU TCG no PMU is found, with a reason, and
/// the overflow source in use is the NMI clock (its NMIs arrive).
fn pmu_detection_and_fallback() -> TestResult {
    // SAFETY: CPL 0; `detect` reads only MSRs CPUID advertises and writes none.
    let mut msr = unsafe { arch_x86::msr::CpuMsr::new() };
    let info = arch_x86::cpuid::detect(&arch_x86::cpuid::CpuCpuid, &mut msr);
    if info.has_pmu() {
        kprintln!(
            "selftest: a PMU is present (v{}, {} GP counters); fallback not exercised",
            info.version,
            info.gp_counters
        );
    } else {
        ensure!(
            info.missing_reason().is_some(),
            "no PMU and no reason given"
        );
        ensure!(
            arch_x86::pmu::selftest::check_detected(&info).is_err(),
            "the start-up check accepts a missing PMU"
        );
        ensure!(info.pebs_format.is_none(), "PEBS without a PMU");
        ensure!(info.lbr_depth() == 0, "LBR without a PMU");
        // The runtime's start-up check stops at detection (touching no
        // MSR) and says why the NMI clock is used.
        let r = crate::sample::pmu::startup_check(&info);
        let Verdict::Fallback(reason @ Reason::NotDetected(_)) = r.verdict else {
            fail!("start-up check without a PMU: {:?}", r.verdict);
        };
        let mut msg = Why::new();
        let _ = write!(msg, "{reason}");
        ensure!(
            msg.ends_with("falling back to the NMI clock"),
            "fallback message: {msg}"
        );
        kprintln!("selftest: start-up check: {msg}");
    }
    ensure!(
        !crate::sample::pmu::sim_active(),
        "simulated PMU active without pmu=sim"
    );
    ensure!(
        !crate::sample::pmu::hw_active(),
        "hardware PMU sampling during the self-test"
    );
    nmi_clock_ticks()
}

/// The start-up check (the same generic function the runtime runs on the
/// real PMU) against simulated PMUs: a healthy one is usable (every
/// instruction counted, one PMI per period); one whose counters read 0 and
/// drop writes (an emulator's) falls back with `CountersDead`; one whose
/// PMIs are never delivered (LVT stays masked) falls back with
/// `OverflowOff`.
fn pmu_startup_check_sim() -> TestResult {
    use arch_x86::pmu::driver::startup_check;
    use arch_x86::pmu::sim::{DeadCounters, NoPmiDelivery, SimCpu, SimPmu, run_workload};
    use core::cell::Cell;
    const WORK: u64 = 200_000;
    const PERIOD: u64 = 2000;
    const STEP: u64 = 100;
    for (name, cpu) in [
        ("Sapphire Rapids", SimCpu::sapphire_rapids()),
        ("Zen 4", SimCpu::zen4()),
    ] {
        let info =
            arch_x86::cpuid::detect(&crate::sample::pmu::SimCpuid(cpu), &mut SimPmu::new(cpu));
        let pmis = Cell::new(0);
        let mut sim = SimPmu::new(cpu);
        let r = startup_check(
            &info,
            &mut sim,
            PERIOD,
            &mut |h, d| run_workload(h, d, WORK, STEP, &pmis),
            &|| pmis.get(),
        );
        ensure!(
            r.verdict == Verdict::Usable && r.counted == WORK && r.pmis == WORK / PERIOD,
            "{name}, healthy: {r:?}"
        );
        ensure!(
            sim.lvt() == arch_x86::pmu::LVT_MASKED,
            "{name}: LVT entry left armed"
        );
        let pmis = Cell::new(0);
        let mut dead = DeadCounters(SimPmu::new(cpu));
        let r = startup_check(
            &info,
            &mut dead,
            PERIOD,
            &mut |h, d| run_workload(h, d, WORK, STEP, &pmis),
            &|| pmis.get(),
        );
        match r.verdict {
            Verdict::Fallback(reason @ Reason::CountersDead { counted: 0 }) => {
                kprintln!("selftest: simulated {name}, counters dead: {reason}")
            }
            v => fail!("{name}, dead counters: {v:?}"),
        }
        let pmis = Cell::new(0);
        let mut masked = NoPmiDelivery(SimPmu::new(cpu));
        let r = startup_check(
            &info,
            &mut masked,
            PERIOD,
            &mut |h, d| run_workload(h, d, WORK, STEP, &pmis),
            &|| pmis.get(),
        );
        match r.verdict {
            Verdict::Fallback(
                reason @ Reason::OverflowOff {
                    expected: 100,
                    observed: 0,
                },
            ) if r.counted == WORK => {
                kprintln!("selftest: simulated {name}, PMIs never delivered: {reason}")
            }
            v => fail!("{name}, PMIs masked: {v:?} after counting {}", r.counted),
        }
    }
    Ok(())
}

/// How a hardware event is named, sampled and described to perf (Hello,
/// perf.data): names round-trip through the event table; generic events
/// are PERF_TYPE_HARDWARE with perf's config, memory and raw events
/// PERF_TYPE_RAW with their encoding; the sample fields follow PEBS and
/// LBR; periods follow `freq=`; and every description passes the same
/// validation `perf_event_open` would do, against the capabilities of a
/// PMU with PEBS and LBR (the simulated Sapphire Rapids' CPUID).
fn pmu_event_description() -> TestResult {
    use crate::sample::pmu::{EventName, MAX_PERIOD, perf_event, sample_mode};
    use arch_x86::cpuid::Vendor;
    use arch_x86::pmu::events;
    use arch_x86::pmu::sim::{SimCpu, SimPmu};
    use arch_x86::pmu::{EventKind, SampleMode};
    use sampler::event::{EventKind as Perf, EventSource, Sampling, sample_type as st};
    use sampler::pebs::MemKind;
    for spec in [
        "cycles",
        "instructions:u",
        "ref-cycles:k",
        "branches",
        "branch-misses:p",
        "cache-references",
        "cache-misses",
        "mem-loads:pp",
        "mem-stores:p",
        "r1c2",
        "r4f2e:upp",
    ] {
        let Ok(e) = events::parse(spec) else {
            fail!("{spec} does not parse");
        };
        let mut name = Why::new();
        let _ = write!(name, "{}", EventName(e));
        ensure!(
            events::parse(&name) == Ok(e),
            "{spec} is named {name}, which parses differently"
        );
    }
    let cpu = SimCpu::sapphire_rapids();
    let info = arch_x86::cpuid::detect(&crate::sample::pmu::SimCpuid(cpu), &mut SimPmu::new(cpu));
    let caps = crate::sample::pmu::caps_of(&info, EventSource::IntelPmu);
    let parse = |s: &str| events::parse(s).unwrap_or(crate::sample::pmu::DEFAULT_EVENT);
    let cases = [
        ("cycles", false, MemKind::None, Perf::Hardware, 0, 0),
        ("instructions:u", false, MemKind::None, Perf::Hardware, 1, 0),
        ("ref-cycles", false, MemKind::None, Perf::Hardware, 9, 0),
        ("branch-misses", false, MemKind::None, Perf::Hardware, 5, 0),
        ("r1c2:p", true, MemKind::None, Perf::Raw, 0x1c2, 1),
        ("mem-loads:pp", true, MemKind::Load, Perf::Raw, 0x1cd, 2),
        ("mem-stores", true, MemKind::Store, Perf::Raw, 0x82d0, 1),
    ];
    for (spec, pebs, mem, kind, config, precise) in cases {
        let ev = parse(spec);
        ensure!(
            crate::sample::pmu::uses_pebs(&ev, Vendor::Intel) == pebs,
            "{spec}: PEBS use"
        );
        let mode = sample_mode(&ev, pebs, 2_800_000_000, 4000);
        let (p, extra) = perf_event(&ev, mode, Vendor::Intel, pebs, mem, true);
        ensure!(
            p.kind == kind && p.config == config && p.precise == precise,
            "{spec}: {:?} {:#x} precise {}",
            p.kind,
            p.config,
            p.precise
        );
        ensure!(
            p.exclude_kernel != ev.kernel && p.exclude_user != ev.user,
            "{spec}: modes"
        );
        let mut want = st::BRANCH_STACK;
        if pebs {
            want |= st::REGS_INTR;
        }
        if mem != MemKind::None {
            want |= st::ADDR | st::WEIGHT | st::DATA_SRC;
        }
        ensure!(
            extra == want,
            "{spec}: sample bits {extra:#x}, want {want:#x}"
        );
        // What the stream's Hello carries for it.
        let mut e = sampler::event::EventConfig::cpu_clock(0, 4000);
        e.sample_type |= st::REGS_USER | st::CALLCHAIN | st::CPU | extra;
        e.regs_user = sampler::regs::GPR_MASK;
        if extra & st::REGS_INTR != 0 {
            e.regs_intr = sampler::regs::GPR_MASK;
        }
        e.count_as(&p);
        if let Err(err) = e.validate(&caps) {
            fail!("{spec}: the description is refused: {err}");
        }
    }
    let cyc = parse("cycles");
    ensure!(
        sample_mode(&cyc, false, 2_800_000_000, 4000) == SampleMode::Period(700_000),
        "cycles period at 4 kHz"
    );
    ensure!(
        sample_mode(&cyc, false, 2_800_000_000, 1) == SampleMode::Period(MAX_PERIOD),
        "cycles period at 1 Hz is not capped"
    );
    ensure!(
        sample_mode(&cyc, false, 0, 4000) == SampleMode::Period(250_000),
        "cycles period without a calibrated TSC"
    );
    ensure!(
        sample_mode(&parse("mem-loads:pp"), true, 2_800_000_000, 4000)
            == SampleMode::Period(175_000),
        "PEBS period"
    );
    let br = parse("branches");
    ensure!(
        br.kind == EventKind::Branches
            && matches!(
                sample_mode(&br, false, 2_800_000_000, 4000),
                SampleMode::Frequency { hz: 4000, .. }
            ),
        "branches are not in frequency mode"
    );
    let (p, _) = perf_event(
        &br,
        sample_mode(&br, false, 1, 4000),
        Vendor::Intel,
        false,
        MemKind::None,
        false,
    );
    ensure!(
        p.sampling == Sampling::Frequency(4000) && p.branch_sample_type == 0,
        "branches: {:?}",
        p.sampling
    );
    Ok(())
}

/// Samples `ev` with `mode` on the real PMU while `work` runs; returns what
/// was programmed and the hardware path's counters for the run.
fn sample_hw(
    info: &arch_x86::cpuid::PmuInfo,
    ev: arch_x86::pmu::Event,
    mode: arch_x86::pmu::SampleMode,
    work: impl FnOnce(),
) -> Result<(crate::sample::pmu::HwSetup, crate::sample::pmu::HwStats), crate::sample::pmu::HwError>
{
    crate::sample::pmu::reset_hw_stats();
    let setup = crate::sample::pmu::setup_hw(info, ev, mode)?;
    work();
    crate::sample::pmu::stop_hw();
    Ok((setup, crate::sample::pmu::hw_stats()))
}

/// The real PMU, on a CPU that has one (skipped, and says so, without):
/// the runtime's start-up check (counters advance over a workload of known
/// size; overflow NMIs arrive near the programmed period), then sampling
/// through the same path as a profile: instructions at a period (PMIs near
/// it; LBR branch stacks when present), cycles for 20 ms of TSC time, and
/// precise instructions whose PEBS records must decode when PEBS is
/// present. `cargo xtask hwcheck` prints these lines.
fn pmu_hardware() -> TestResult {
    use crate::sample::pmu::{CHECK_INSTRUCTIONS, EventName, HwError};
    use arch_x86::pmu::{Event, EventKind, PmuError, SampleMode};
    // SAFETY: CPL 0; `detect` reads only MSRs CPUID advertises and writes none.
    let mut msr = unsafe { arch_x86::msr::CpuMsr::new() };
    let info = arch_x86::cpuid::detect(&arch_x86::cpuid::CpuCpuid, &mut msr);
    if let Some(why) = info.missing_reason() {
        kprintln!("selftest: pmu_hardware: skipped ({why})");
        return Ok(());
    }
    kprintln!(
        "selftest: pmu_hardware: PMU {:?} v{}, {} GP x {} bits, {} fixed x {} bits, PEBS format {:?}, LBR {:?} x {}",
        info.vendor,
        info.version,
        info.gp_counters,
        info.gp_width,
        info.fixed_counters(),
        info.fixed_width,
        info.pebs_format,
        info.lbr_format(),
        info.lbr_depth()
    );
    let r = crate::sample::pmu::startup_check(&info);
    kprintln!(
        "selftest: pmu_hardware: counting: {} instructions counted over a workload of {}",
        r.counted,
        CHECK_INSTRUCTIONS
    );
    kprintln!(
        "selftest: pmu_hardware: overflow: period {}: {} PMIs, expected about {}",
        r.period,
        r.pmis,
        r.expected_pmis()
    );
    if let Verdict::Fallback(reason) = r.verdict {
        fail!("start-up check: {reason}");
    }
    ensure!(
        r.counted >= CHECK_INSTRUCTIONS && r.counted <= 2 * CHECK_INSTRUCTIONS,
        "{} instructions counted for a workload of {CHECK_INSTRUCTIONS}",
        r.counted
    );
    let workload = || arch_x86::pmu::hw::workload(crate::sample::pmu::CHECK_ITERATIONS);
    // Instructions at a period, through the sampling path.
    let period = CHECK_INSTRUCTIONS / 64;
    let ins = Event::new(EventKind::Instructions);
    let (setup, s) = match sample_hw(&info, ins, SampleMode::Period(period), workload) {
        Ok(x) => x,
        Err(e) => fail!("sampling instructions: {e}"),
    };
    kprintln!(
        "selftest: pmu_hardware: sampling instructions at period {period}: {} samples in {} PMIs, expected about {}; {} unknown NMIs",
        s.samples,
        s.pmis,
        r.counted / period,
        s.unknown_nmis
    );
    if let Err(reason) = arch_x86::pmu::selftest::check_overflow(r.counted, period, s.samples) {
        fail!("sampling instructions: {reason}");
    }
    if info.lbr_depth() > 0 {
        kprintln!(
            "selftest: pmu_hardware: LBR: {} of {} samples carry a branch stack",
            s.with_branches,
            s.samples
        );
        ensure!(setup.lbr, "the CPU has LBR but sampling did not enable it");
        ensure!(s.with_branches > 0, "no sample carried a branch stack");
    } else {
        kprintln!("selftest: pmu_hardware: LBR: absent, not checked");
    }
    // Cycles for 20 ms of TSC time: about 20 PMIs at a period of a
    // millisecond of TSC ticks when the core runs near the TSC rate.
    let tsc_hz = crate::sample::clock::tsc_hz();
    if tsc_hz > 0 {
        let spin = || {
            let t0 = cpu::rdtsc();
            while cpu::rdtsc().wrapping_sub(t0) < tsc_hz / 50 {
                core::hint::spin_loop();
            }
        };
        let cyc = Event::new(EventKind::Cycles);
        let (_, s) = match sample_hw(&info, cyc, SampleMode::Period(tsc_hz / 1000), spin) {
            Ok(x) => x,
            Err(e) => fail!("sampling cycles: {e}"),
        };
        kprintln!(
            "selftest: pmu_hardware: sampling cycles at period {} (1 ms of TSC) for 20 ms: {} samples (about 20 when cycles run at the TSC rate)",
            tsc_hz / 1000,
            s.samples
        );
        ensure!(
            (4..=100).contains(&s.samples),
            "{} cycle samples in 20 ms at 1 kHz of TSC",
            s.samples
        );
    }
    // PEBS records decode.
    if info.pebs_format.is_some() {
        let pins = Event {
            precise: 1,
            ..Event::new(EventKind::Instructions)
        };
        match sample_hw(&info, pins, SampleMode::Period(period), workload) {
            Err(HwError::Pmu(PmuError::PebsUnknownFormat(f))) => {
                kprintln!(
                    "selftest: pmu_hardware: PEBS: format {f} unknown to the decoder, PEBS disabled"
                )
            }
            Err(e) => fail!("sampling {}: {e}", EventName(pins)),
            Ok((_, s)) => {
                kprintln!(
                    "selftest: pmu_hardware: PEBS: {} records decoded, {} lost, {} samples, expected about {}",
                    s.pebs_decoded,
                    s.pebs_lost,
                    s.samples,
                    r.counted / period
                );
                ensure!(
                    s.pebs_decoded >= r.counted / period / 2,
                    "only {} PEBS records decoded",
                    s.pebs_decoded
                );
                ensure!(
                    s.pebs_lost <= s.pebs_decoded / 10,
                    "{} PEBS records lost",
                    s.pebs_lost
                );
            }
        }
    } else {
        kprintln!("selftest: pmu_hardware: PEBS: absent, not checked");
    }
    ensure!(!crate::sample::pmu::hw_active(), "the PMU still samples");
    Ok(())
}

/// The simulated PMU (no command line needed) through the real driver:
/// counters advance, the overflow comes at the programmed period, the PMI
/// re-arms the LVT entry, the PEBS record decodes to the fed context and
/// the LBR stack holds the branch between the last two ticks.
fn pmu_sim_pmi_round_trip() -> TestResult {
    use arch_x86::pmu::sim::{SimCpu, SimRegs};
    const PERIOD: u64 = 5;
    let ip = |t: u64| 0x40_1000 + 0x10 * t;
    let out = crate::sample::pmu::with_check_memory(|mem| -> TestResult {
        let (mut st, info) =
            match crate::sample::pmu::build_sim(SimCpu::sapphire_rapids(), PERIOD, mem) {
                Ok(x) => x,
                Err(e) => fail!("driver on the simulator: {e}"),
            };
        ensure!(
            info.pebs_format == Some(5) && info.lbr_depth() == 32,
            "detected {:?}",
            info
        );
        st.driver.start(&mut st.clock.sim);
        let mut got: Option<(u64, u64, u64, usize, u64)> = None;
        let mut pmis = 0;
        for t in 1..=PERIOD {
            let mut gprs = [0u64; 16];
            gprs[0] = 0xA0 + t;
            gprs[7] = 0x7FFF_0000 - 8 * t;
            let regs = SimRegs { flags: 0x202, gprs };
            let lost = crate::sample::pmu::tick(&mut st, mem, ip(t), true, regs, &mut |x| {
                got = Some((
                    x.precise_ip.unwrap_or(0),
                    x.pebs_regs.map_or(0, |r| r.get(sampler::regs::Reg::Ax)),
                    x.mem.map_or(0, |m| m.addr),
                    x.branches.map_or(0, |b| b.entries.len()),
                    x.branches
                        .and_then(|b| b.entries.first())
                        .map_or(0, |e| e.to),
                ));
            });
            if t < PERIOD {
                ensure!(lost.is_none(), "PMI after {t} of {PERIOD} events");
                let n = st.driver.events_since_reload(&mut st.clock.sim, 0);
                ensure!(n == Some(t), "counter at {n:?} after {t} events");
            } else if let Some(l) = lost {
                pmis += 1;
                ensure!(l == 0, "{l} PEBS records lost");
            }
        }
        ensure!(pmis == 1, "no PMI at the programmed period");
        ensure!(
            st.clock.sim.lvt() == arch_x86::pmu::LVT_PMI_NMI,
            "LVT entry not re-armed: {:#x}",
            st.clock.sim.lvt()
        );
        let Some((pip, ax, addr, nbr, to)) = got else {
            fail!("the PMI produced no sample");
        };
        ensure!(pip == ip(PERIOD), "PEBS IP {pip:#x}");
        ensure!(ax == 0xA0 + PERIOD, "PEBS AX {ax:#x}");
        ensure!(addr == 0x7FFF_0000 - 8 * PERIOD, "PEBS address {addr:#x}");
        ensure!(nbr > 0, "no LBR entries");
        ensure!(to == ip(PERIOD - 1), "newest branch ends at {to:#x}");
        Ok(())
    });
    match out {
        Some(r) => r,
        None => fail!("check memory busy"),
    }
}

/// Runs `s` while recording NMIs in `mode`; returns the task id and the captures.
fn run_recorded(
    s: TaskSpec,
    mode: Mode,
) -> Result<(u8, heapless::Vec<nmi::NmiCapture, { recorder::SLOTS }>), Why> {
    let id = match task::spawn(s) {
        Ok(id) => id,
        Err(e) => fail!("spawn: {e:?}"),
    };
    record_until_exit(id, s.name, mode)
}

/// Runs every process while recording NMIs in `mode`; process `id` must
/// exit with status 0. Returns the captures.
fn record_until_exit(
    id: u8,
    name: &str,
    mode: Mode,
) -> Result<(u8, heapless::Vec<nmi::NmiCapture, { recorder::SLOTS }>), Why> {
    recorder::start(mode, WANT_CAPTURES, SPIN_BUDGET);
    task::run_all(|| false);
    let (n, overflow) = recorder::stop();
    let t = task::get(id).map(|t| t.state);
    ensure!(t == Some(TaskState::Exited(0)), "{name}: state {t:?}");
    let mut caps = heapless::Vec::new();
    for i in 0..n {
        if let Some(c) = recorder::get(i) {
            let _ = caps.push(c);
        }
    }
    ensure!(
        caps.len() >= WANT_CAPTURES as usize || overflow > 0,
        "only {} NMIs landed in {mode:?} (budget ran out)",
        caps.len()
    );
    Ok((id, caps))
}

fn compare(what: &str, regs: &TrapFrame, want: &[(usize, u64)], mask: u64) -> TestResult {
    let got = regs.gprs();
    for &(i, w) in want {
        ensure!(
            got[i] & mask == w & mask,
            "{what}: {} = {:#x}, want {w:#x}",
            arch_x86::frame::GPR_NAMES[i],
            got[i]
        );
    }
    Ok(())
}

fn exact_regs_user64() -> TestResult {
    let s = spec("regs64", Abi::X64, user::perch_st_regs64);
    let (id, caps) = run_recorded(s, Mode::User64)?;
    let loop_range =
        user::addr(user::perch_st_regs64_loop)..user::addr(user::perch_st_regs64_loop_end);
    let want: [(usize, u64); 15] = core::array::from_fn(|i| (i, pattern64(i)));
    let mut exact = 0;
    for c in &caps {
        let r = &c.interrupted;
        ensure!(c.task == Some(id), "capture without the task");
        ensure!(r.cs == u64::from(gdt::USER_CODE64), "cs {:#x}", r.cs);
        ensure!(
            c.user_state == UserFrameState::Complete,
            "user frame {:?}",
            c.user_state
        );
        if loop_range.contains(&r.rip) {
            compare("user64", r, &want, u64::MAX)?;
            ensure!(r.rsp == user::PATTERN_RSP64, "rsp {:#x}", r.rsp);
            ensure!(r.ss == u64::from(gdt::USER_DATA), "ss {:#x}", r.ss);
            ensure!(
                c.user_regs == *r,
                "user_regs differ from the interrupted frame"
            );
            exact += 1;
        }
    }
    ensure!(
        exact > 0,
        "no NMI landed in the spin loop ({} captures)",
        caps.len()
    );
    Ok(())
}

fn compat_r8_r15() -> [u64; 15] {
    core::array::from_fn(|i| if i >= 7 { pattern64(i) } else { 0 })
}

fn exact_regs_compat() -> TestResult {
    let mut s = spec("regs32", Abi::Compat32, user::perch_st_regs32);
    s.gprs = compat_r8_r15();
    let (id, caps) = run_recorded(s, Mode::UserCompat)?;
    let loop_range =
        user::addr(user::perch_st_regs32_loop)..user::addr(user::perch_st_regs32_loop_end);
    let low: [(usize, u64); 7] = core::array::from_fn(|i| (i, pattern32(i)));
    let high: [(usize, u64); 8] = core::array::from_fn(|i| (i + 7, pattern64(i + 7)));
    let mut exact = 0;
    for c in &caps {
        let r = &c.interrupted;
        ensure!(c.task == Some(id), "capture without the task");
        ensure!(r.cs == u64::from(gdt::USER_CODE32), "cs {:#x}", r.cs);
        if loop_range.contains(&r.rip) {
            compare("compat", r, &low, 0xffff_ffff)?;
            compare("compat r8-r15", r, &high, u64::MAX)?;
            ensure!(r.rsp as u32 == user::PATTERN_ESP32, "esp {:#x}", r.rsp);
            exact += 1;
        }
    }
    ensure!(
        exact > 0,
        "no NMI landed in the spin loop ({} captures)",
        caps.len()
    );
    Ok(())
}

/// Checks the saved user frames seen by NMIs that hit the runtime during a system call.
fn check_in_syscall(
    caps: &[nmi::NmiCapture],
    id: u8,
    want: &[(usize, u64)],
    mask: u64,
    ret: u64,
    cs: u16,
    vector: u64,
) -> TestResult {
    let mut complete = 0;
    let mut in_window = 0;
    for c in caps {
        ensure!(
            c.mode == Mode::Kernel && c.task == Some(id),
            "capture {:?}/{:?}",
            c.mode,
            c.task
        );
        match c.user_state {
            UserFrameState::InWindow => in_window += 1,
            UserFrameState::NoTask => fail!("capture with no task"),
            UserFrameState::Complete => {
                let u = &c.user_regs;
                compare("saved frame", u, want, mask)?;
                ensure!(u.rip == ret, "saved rip {:#x}, want {ret:#x}", u.rip);
                ensure!(u.cs == u64::from(cs), "saved cs {:#x}", u.cs);
                ensure!(u.ss == u64::from(gdt::USER_DATA), "saved ss {:#x}", u.ss);
                ensure!(u.vector == vector, "saved vector {:#x}", u.vector);
                complete += 1;
            }
        }
    }
    ensure!(complete > 0, "no complete frame ({in_window} in a window)");
    Ok(())
}

fn spin_in_syscall64() -> TestResult {
    let s = spec("spin64", Abi::X64, user::perch_st_spin64);
    let (id, caps) = run_recorded(s, Mode::Kernel)?;
    let ret = user::addr(user::perch_st_spin64_ret);
    let mut want: heapless::Vec<(usize, u64), 15> = [1, 3, 4, 6, 7, 8, 9, 11, 12, 13, 14]
        .into_iter()
        .map(|i| (i, pattern64(i)))
        .collect();
    let _ = want.push((0, syscall::SYS_SPIN));
    let _ = want.push((5, user::SPIN_ARG));
    // SYSCALL puts the return RIP in rcx.
    let _ = want.push((2, ret));
    check_in_syscall(
        &caps,
        id,
        &want,
        u64::MAX,
        ret,
        gdt::USER_CODE64,
        SYSCALL_VECTOR,
    )?;
    for c in &caps {
        if c.user_state == UserFrameState::Complete {
            let u = &c.user_regs;
            ensure!(
                u.r11 == u.rflags,
                "r11 {:#x} != rflags {:#x}",
                u.r11,
                u.rflags
            );
            ensure!(u.rsp == user::PATTERN_RSP64, "saved rsp {:#x}", u.rsp);
        }
    }
    Ok(())
}

fn spin_in_int80() -> TestResult {
    let mut s = spec("spin32", Abi::Compat32, user::perch_st_spin32);
    s.gprs = compat_r8_r15();
    let (id, caps) = run_recorded(s, Mode::Kernel)?;
    let ret = user::addr(user::perch_st_spin32_ret);
    let mut want: heapless::Vec<(usize, u64), 15> = (2..=6).map(|i| (i, pattern32(i))).collect();
    let _ = want.push((0, syscall::SYS_SPIN));
    let _ = want.push((1, user::SPIN_ARG));
    check_in_syscall(
        &caps,
        id,
        &want,
        0xffff_ffff,
        ret,
        gdt::USER_CODE32,
        INT80_VECTOR,
    )?;
    let high: [(usize, u64); 8] = core::array::from_fn(|i| (i + 7, pattern64(i + 7)));
    for c in &caps {
        if c.user_state == UserFrameState::Complete {
            compare("saved frame r8-r15", &c.user_regs, &high, u64::MAX)?;
            ensure!(
                c.user_regs.rsp as u32 == user::PATTERN_ESP32,
                "saved esp {:#x}",
                c.user_regs.rsp
            );
        }
    }
    Ok(())
}

/// A minimal static ELF (ET_EXEC) for a loaded self-test program: its code
/// at `user::LOADED_CODE` (read, execute) and a data page at
/// `user::LOADED_DATA` (read, write; three pages) whose first word is `counter`.
fn tiny_elf(compat: bool, code: &[u8], counter: u64) -> alloc::vec::Vec<u8> {
    let code_off = (user::LOADED_CODE - 0x40_0000) as usize;
    let data_off = (user::LOADED_DATA - 0x40_0000) as usize;
    let mut f = alloc::vec![0u8; data_off + 16];
    let put = |f: &mut [u8], at: usize, v: u64, n: usize| {
        f[at..at + n].copy_from_slice(&v.to_le_bytes()[..n]);
    };
    f[..4].copy_from_slice(b"\x7fELF");
    f[4] = if compat { 1 } else { 2 };
    f[5] = 1; // little-endian
    f[6] = 1; // EV_CURRENT
    put(&mut f, 16, 2, 2); // ET_EXEC
    put(&mut f, 18, if compat { 3 } else { 62 }, 2); // EM_386 / EM_X86_64
    put(&mut f, 20, 1, 4);
    // Header and program-header sizes, offsets of the fields after e_entry.
    let (ehsize, phentsize, w) = if compat { (52, 32, 4) } else { (64, 56, 8) };
    put(&mut f, 24, user::LOADED_CODE, w);
    put(&mut f, 24 + w, ehsize as u64, w); // e_phoff
    let rest = 24 + 3 * w + 4; // after e_shoff and e_flags
    put(&mut f, rest, ehsize as u64, 2);
    put(&mut f, rest + 2, phentsize as u64, 2);
    put(&mut f, rest + 4, 2, 2); // e_phnum
    let segs = [
        (
            0u64,
            0x40_0000u64,
            (code_off + code.len()) as u64,
            (code_off + code.len()) as u64,
            5u64,
        ),
        (data_off as u64, user::LOADED_DATA, 16, 0x3000, 6),
    ];
    for (k, (off, va, filesz, memsz, flags)) in segs.into_iter().enumerate() {
        let p = ehsize + k * phentsize;
        put(&mut f, p, 1, 4); // PT_LOAD
        if compat {
            put(&mut f, p + 4, off, 4);
            put(&mut f, p + 8, va, 4);
            put(&mut f, p + 12, va, 4);
            put(&mut f, p + 16, filesz, 4);
            put(&mut f, p + 20, memsz, 4);
            put(&mut f, p + 24, flags, 4);
            put(&mut f, p + 28, 0x1000, 4);
        } else {
            put(&mut f, p + 4, flags, 4);
            put(&mut f, p + 8, off, 8);
            put(&mut f, p + 16, va, 8);
            put(&mut f, p + 24, va, 8);
            put(&mut f, p + 32, filesz, 8);
            put(&mut f, p + 40, memsz, 8);
            put(&mut f, p + 48, 0x1000, 8);
        }
    }
    f[code_off..code_off + code.len()].copy_from_slice(code);
    put(&mut f, data_off, counter, 8);
    f
}

/// Starts a loaded self-test program through the program loader.
fn start_loaded(name: &str, compat: bool, prog: user::LoadedCode, counter: u64) -> Result<u8, Why> {
    let elf: &'static [u8] =
        alloc::boxed::Box::leak(tiny_elf(compat, prog.code, counter).into_boxed_slice());
    let spec = kcore::manifest::ProcessSpec::new(name, "/selftest");
    match task::linux::start(&spec, elf) {
        Ok(s) => Ok(s.id),
        Err(e) => fail!("loader refused {name}: {e}"),
    }
}

/// Runs a loaded program while recording NMIs in `mode`.
fn run_loaded_recorded(
    name: &str,
    compat: bool,
    prog: user::LoadedCode,
    counter: u64,
    mode: Mode,
) -> Result<(u8, heapless::Vec<nmi::NmiCapture, { recorder::SLOTS }>), Why> {
    let id = start_loaded(name, compat, prog, counter)?;
    record_until_exit(id, name, mode)
}

/// Two loaded programs linked at the same address run side by side, each
/// in its own address space: each keeps the value its own data page
/// started with across yields, a system call handed a runtime pointer
/// returns EFAULT to it, and their pages are freed when they end.
fn loaded_address_spaces() -> TestResult {
    let a = start_loaded("space_a", false, user::loaded_space64(), 7)?;
    let b = start_loaded("space_b", false, user::loaded_space64(), 9)?;
    task::run_all(|| false);
    let (sa, sb) = (task::get(a).map(|t| t.state), task::get(b).map(|t| t.state));
    ensure!(
        sa == Some(TaskState::Exited(7)) && sb == Some(TaskState::Exited(9)),
        "exit states {sa:?} and {sb:?} (want 7 and 9; +100 means no EFAULT)"
    );
    // An ended process's pages are freed at once.
    for (id, name) in [(a, "space_a"), (b, "space_b")] {
        let e = task::with_space(id, |s| s.entry(user::LOADED_DATA)).unwrap_or(0);
        ensure!(
            e & pg::PRESENT == 0,
            "{name} ended but its data page is still mapped ({e:#x})"
        );
    }
    Ok(())
}

fn loaded_exact_regs64() -> TestResult {
    let prog = user::loaded_regs64();
    let (id, caps) = run_loaded_recorded("ld_regs64", false, prog, 20_000_000, Mode::User64)?;
    let lo = user::LOADED_CODE + prog.marks.0;
    let hi = user::LOADED_CODE + prog.marks.1;
    let want: [(usize, u64); 15] = core::array::from_fn(|i| (i, pattern64(i)));
    let mut exact = 0;
    for c in &caps {
        let r = &c.interrupted;
        ensure!(c.task == Some(id), "capture without the process");
        ensure!(r.cs == u64::from(gdt::USER_CODE64), "cs {:#x}", r.cs);
        if (lo..hi).contains(&r.rip) {
            compare("loaded user64", r, &want, u64::MAX)?;
            ensure!(r.rsp == user::PATTERN_RSP64, "rsp {:#x}", r.rsp);
            ensure!(
                c.user_regs == *r,
                "user_regs differ from the interrupted frame"
            );
            exact += 1;
        }
    }
    ensure!(
        exact > 0,
        "no NMI landed in the spin loop ({} captures)",
        caps.len()
    );
    Ok(())
}

fn loaded_exact_regs32() -> TestResult {
    let prog = user::loaded_regs32();
    let (id, caps) = run_loaded_recorded("ld_regs32", true, prog, 20_000_000, Mode::UserCompat)?;
    let lo = user::LOADED_CODE + prog.marks.0;
    let hi = user::LOADED_CODE + prog.marks.1;
    let low: [(usize, u64); 7] = core::array::from_fn(|i| (i, pattern32(i)));
    let high: [(usize, u64); 8] = core::array::from_fn(|i| (i + 7, 0));
    let mut exact = 0;
    for c in &caps {
        let r = &c.interrupted;
        ensure!(c.task == Some(id), "capture without the process");
        ensure!(r.cs == u64::from(gdt::USER_CODE32), "cs {:#x}", r.cs);
        if (lo..hi).contains(&r.rip) {
            compare("loaded compat", r, &low, 0xffff_ffff)?;
            compare("loaded compat r8-r15", r, &high, u64::MAX)?;
            ensure!(r.rsp as u32 == user::PATTERN_ESP32, "esp {:#x}", r.rsp);
            exact += 1;
        }
    }
    ensure!(
        exact > 0,
        "no NMI landed in the spin loop ({} captures)",
        caps.len()
    );
    Ok(())
}

fn loaded_syscall_frame64() -> TestResult {
    let prog = user::loaded_sys64();
    let (id, caps) = run_loaded_recorded("ld_sys64", false, prog, 20_000, Mode::Kernel)?;
    let ret = user::LOADED_CODE + prog.marks.0;
    let mut want: heapless::Vec<(usize, u64), 15> = [1, 6, 7, 8, 9, 11, 12, 13, 14]
        .into_iter()
        .map(|i| (i, pattern64(i)))
        .collect();
    // SYSCALL puts the return RIP in rcx; rax is the number (getrandom),
    // rdi, rsi, rdx its arguments.
    let _ = want.push((2, ret));
    let _ = want.push((0, 318));
    let _ = want.push((5, user::LOADED_DATA + 0x1000));
    let _ = want.push((4, 4096));
    let _ = want.push((3, 0));
    check_in_syscall(
        &caps,
        id,
        &want,
        u64::MAX,
        ret,
        gdt::USER_CODE64,
        SYSCALL_VECTOR,
    )?;
    for c in caps
        .iter()
        .filter(|c| c.user_state == UserFrameState::Complete)
    {
        let u = &c.user_regs;
        ensure!(
            u.r11 == u.rflags,
            "r11 {:#x} != rflags {:#x}",
            u.r11,
            u.rflags
        );
        ensure!(u.rsp == user::PATTERN_RSP64, "saved rsp {:#x}", u.rsp);
    }
    Ok(())
}

fn loaded_int80_frame32() -> TestResult {
    let prog = user::loaded_sys32();
    let (id, caps) = run_loaded_recorded("ld_sys32", true, prog, 20_000, Mode::Kernel)?;
    let ret = user::LOADED_CODE + prog.marks.0;
    let mut want: heapless::Vec<(usize, u64), 15> = (4..=6).map(|i| (i, pattern32(i))).collect();
    // eax is the number (getrandom), ebx, ecx, edx its arguments.
    let _ = want.push((0, 355));
    let _ = want.push((1, user::LOADED_DATA + 0x1000));
    let _ = want.push((2, 4096));
    let _ = want.push((3, 0));
    check_in_syscall(
        &caps,
        id,
        &want,
        0xffff_ffff,
        ret,
        gdt::USER_CODE32,
        INT80_VECTOR,
    )?;
    for c in caps
        .iter()
        .filter(|c| c.user_state == UserFrameState::Complete)
    {
        ensure!(
            c.user_regs.rsp as u32 == user::PATTERN_ESP32,
            "saved esp {:#x}",
            c.user_regs.rsp
        );
    }
    Ok(())
}

/// The probe file `cargo xtask selftest` puts in the boot archive it boots
/// the self-test with (xtask's `image::SELFTEST_PROBE`).
const ARCHIVE_PROBE: &[u8] = b"perch self-test boot archive\n";

/// The boot archive arrived through the boot protocol's module list (PVH
/// or multiboot2) intact: it parses, its manifest names the one process
/// xtask wrote, and its probe file holds the expected bytes. Skipped (and
/// said so) when the runtime was booted without an archive.
fn boot_archive(archive: Option<arch_x86::bootinfo::Module>, protocol: &str) -> TestResult {
    let Some(m) = archive else {
        kprintln!("selftest: boot_archive: skipped (booted without a boot archive)");
        return Ok(());
    };
    let bytes = crate::fs::module_bytes(&m);
    let a = match kcore::archive::Archive::parse(bytes) {
        Ok(a) => a,
        Err(e) => fail!("archive at {:#x} ({} bytes): {e}", m.base, m.len),
    };
    let man = match a.manifest() {
        Ok(man) => man,
        Err(e) => fail!("{e}"),
    };
    ensure!(
        man.processes.len() == 1 && man.processes[0].name == "st_archive",
        "manifest has {} processes",
        man.processes.len()
    );
    let probe = a.get(b"data/selftest.txt").map(|e| e.data());
    ensure!(probe == Some(ARCHIVE_PROBE), "probe file {probe:?}");
    kprintln!(
        "selftest: boot archive via {protocol}: {} bytes at {:#x}, {} entries",
        m.len,
        m.base,
        a.entries().len()
    );
    Ok(())
}
