//! The demo appliance (the default when `selftest` is not given): what a
//! profile of Perch shows. Three ring-3 tasks run round-robin until
//! `duration=MS` of NMI-clock time has passed:
//!
//! - `demo64`, 64-bit, splits its work 50/30/20 between three named hot
//!   functions (`demo_checksum_blocks`, `demo_parse_records`,
//!   `demo_update_stats`), built with frame pointers;
//! - `demo32`, a hand-written compat-mode loop (`perch_demo32_crc_loop`);
//! - `demosys`, which spends most of its time in the runtime inside the
//!   `spin` system call, with a little user work between calls;
//! - `demoregs`, which spins with known patterns in its registers
//!   (see `perch_demoregs_spin`).

use crate::abi::perch::{SYS_EXIT, SYS_SPIN, SYS_WRITE, SYS_YIELD};
use crate::kprintln;
use crate::proc::{self as task, Abi, TaskSpec};
use crate::sample::nmi;
use arch_x86::exit::ExitCode;
use core::sync::atomic::{AtomicU64, Ordering};
use kcore::cmdline::Config;

/// Default run length when `duration=` is not given.
pub const DEFAULT_DURATION_MS: u64 = 1000;

/// Work units per outer iteration of `demo64`; the three functions get
/// 50 %, 30 % and 20 % of them.
const UNITS: u64 = 100_000;

/// TSC cycles `demosys` spends in each `spin` system call.
const SYS_SPIN_CYCLES: u64 = 300_000;

#[unsafe(link_section = ".user.data.demo")]
static DEMO_SINK: AtomicU64 = AtomicU64::new(0);

#[unsafe(link_section = ".user.data.demo")]
static DEMO_HELLO: [u8; 30] = *b"demo64: appliance task ready\n\0";

/// Makes a system call from 64-bit user code.
#[inline(always)]
fn user_syscall(nr: u64, a0: u64, a1: u64) -> u64 {
    let ret: u64;
    // SAFETY: SYSCALL into the runtime, which saves and restores every
    // register but rcx/r11 (clobbered by the instruction) and rax (result).
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") nr => ret,
            in("rdi") a0,
            in("rsi") a1,
            out("rcx") _,
            out("r11") _,
            options(nostack),
        );
    }
    ret
}

/// One unit of "work": a few rounds of xorshift mixing.
#[inline(always)]
fn mix(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

/// 50 % of `demo64`'s work.
#[unsafe(link_section = ".user.text.demo")]
#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn demo_checksum_blocks(seed: u64, units: u64) -> u64 {
    let mut x = seed | 1;
    let mut i = 0;
    while i < units {
        x = mix(x).wrapping_add(i);
        i += 1;
    }
    x
}

/// 30 % of `demo64`'s work.
#[unsafe(link_section = ".user.text.demo")]
#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn demo_parse_records(seed: u64, units: u64) -> u64 {
    let mut x = seed | 3;
    let mut i = 0;
    while i < units {
        x = mix(x) ^ i;
        i += 1;
    }
    x
}

/// 20 % of `demo64`'s work.
#[unsafe(link_section = ".user.text.demo")]
#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn demo_update_stats(seed: u64, units: u64) -> u64 {
    let mut x = seed | 5;
    let mut i = 0;
    while i < units {
        x = mix(x).wrapping_sub(i);
        i += 1;
    }
    x
}

/// Entry of `demo64`.
#[unsafe(link_section = ".user.text.demo")]
#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn demo64_main() -> ! {
    user_syscall(SYS_WRITE, DEMO_HELLO.as_ptr() as u64, 29);
    let mut x = 0x1234_5678u64;
    loop {
        x = demo_checksum_blocks(x, UNITS * 5 / 10);
        x = demo_parse_records(x, UNITS * 3 / 10);
        x = demo_update_stats(x, UNITS * 2 / 10);
        DEMO_SINK.store(x, Ordering::Relaxed);
        user_syscall(SYS_YIELD, 0, 0);
    }
}

/// A little user work between the system calls of `demosys`.
#[unsafe(link_section = ".user.text.demo")]
#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn demosys_prepare_request(seed: u64) -> u64 {
    let mut x = seed | 7;
    let mut i = 0;
    while i < 500 {
        x = mix(x).rotate_left(7);
        i += 1;
    }
    x
}

/// Entry of `demosys`.
#[unsafe(link_section = ".user.text.demo")]
#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn demosys_main() -> ! {
    let mut x = 7u64;
    loop {
        x = demosys_prepare_request(x);
        user_syscall(SYS_SPIN, SYS_SPIN_CYCLES, 0);
        DEMO_SINK.store(x, Ordering::Relaxed);
        user_syscall(SYS_YIELD, 0, 0);
    }
}

core::arch::global_asm!(
    r#"
    .section .user.text.demo32, "ax"
    .code32
    .balign 16
    .global perch_demo32_main
perch_demo32_main:
    mov esi, 0x9e3779b9
perch_demo32_outer:
    mov ecx, 20000
    .global perch_demo32_crc_loop
perch_demo32_crc_loop:
    mov eax, esi
    shr eax, 1
    jnc 2f
    xor eax, 0xedb88320
2:
    mov esi, eax
    dec ecx
    jnz perch_demo32_crc_loop
    mov eax, {yld}
    int 0x80
    jmp perch_demo32_outer
    .global perch_demo32_end
perch_demo32_end:
    mov eax, {exit}
    xor ebx, ebx
    int 0x80
    .code64
    "#,
    yld = const SYS_YIELD,
    exit = const SYS_EXIT,
);

// `demoregs` spins in `perch_demoregs_spin` with a known pattern in every
// GPR but RCX (the loop counter), RSP and RIP: AX 0x11.., BX 0x22..,
// DX 0x44.., SI 0x55.., DI 0x66.., BP 0x77.., R8 0x88.. through R14 0xee..
// (each byte repeated eight times), so `perf script -F uregs` can be checked
// exactly.
core::arch::global_asm!(
    r#"
    .section .user.text.demoregs, "ax"
    .code64
    .balign 16
    .global perch_demoregs_main
perch_demoregs_main:
    movabs rax, 0x1111111111111111
    movabs rbx, 0x2222222222222222
    movabs rdx, 0x4444444444444444
    movabs rsi, 0x5555555555555555
    movabs rdi, 0x6666666666666666
    movabs rbp, 0x7777777777777777
    movabs r8, 0x8888888888888888
    movabs r9, 0x9999999999999999
    movabs r10, 0xaaaaaaaaaaaaaaaa
    movabs r11, 0xbbbbbbbbbbbbbbbb
    movabs r12, 0xcccccccccccccccc
    movabs r13, 0xdddddddddddddddd
    movabs r14, 0xeeeeeeeeeeeeeeee
    mov ecx, 50000
    .global perch_demoregs_spin
perch_demoregs_spin:
    dec rcx
    jnz perch_demoregs_spin
    .global perch_demoregs_yield
perch_demoregs_yield:
    mov eax, {yld}
    syscall
    jmp perch_demoregs_main
    "#,
    yld = const SYS_YIELD,
);

unsafe extern "C" {
    fn perch_demoregs_main();
    fn perch_demoregs_spin();
    fn perch_demoregs_yield();
    fn perch_demo32_main();
    fn perch_demo32_crc_loop();
    fn perch_demo32_end();
}

/// The demo's named functions (for reports).
pub fn symbols() -> impl Iterator<Item = (u64, &'static str)> {
    [
        (demo64_main as *const () as u64, "demo64_main"),
        (
            demo_checksum_blocks as *const () as u64,
            "demo_checksum_blocks",
        ),
        (demo_parse_records as *const () as u64, "demo_parse_records"),
        (demo_update_stats as *const () as u64, "demo_update_stats"),
        (demosys_main as *const () as u64, "demosys_main"),
        (
            demosys_prepare_request as *const () as u64,
            "demosys_prepare_request",
        ),
        (perch_demo32_main as *const () as u64, "perch_demo32_main"),
        (
            perch_demo32_crc_loop as *const () as u64,
            "perch_demo32_crc_loop",
        ),
        (
            perch_demoregs_main as *const () as u64,
            "perch_demoregs_main",
        ),
        (
            perch_demoregs_spin as *const () as u64,
            "perch_demoregs_spin",
        ),
        (
            perch_demoregs_yield as *const () as u64,
            "perch_demoregs_yield",
        ),
    ]
    .into_iter()
}

/// A coarse NMI-context tally of where the demo's time goes, printed at the
/// end of a run so the designed split is visible before any profile is
/// recorded. Atomics only.
pub mod hits {
    use crate::sample::nmi::NmiCapture;
    use arch_x86::frame::Mode;
    use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    /// The three hot functions of `demo64`, in [`super::HOT`] order.
    static RANGES: [[AtomicU64; 2]; 3] = [const { [const { AtomicU64::new(0) }; 2] }; 3];
    static HOT_HITS: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];
    static USER64: AtomicU64 = AtomicU64::new(0);
    static COMPAT: AtomicU64 = AtomicU64::new(0);
    static IN_SYSCALL: AtomicU64 = AtomicU64::new(0);
    static OTHER: AtomicU64 = AtomicU64::new(0);
    static ON: AtomicBool = AtomicBool::new(false);

    /// Starts counting with the given `[start, end)` ranges of the hot functions.
    pub fn start(ranges: [(u64, u64); 3]) {
        for (r, (a, b)) in RANGES.iter().zip(ranges) {
            r[0].store(a, Ordering::Relaxed);
            r[1].store(b, Ordering::Relaxed);
        }
        ON.store(true, Ordering::Release);
    }

    /// Stops counting.
    pub fn stop() {
        ON.store(false, Ordering::Release);
    }

    /// NMI context: count where the NMI landed.
    pub fn on_capture(cap: &NmiCapture) {
        if !ON.load(Ordering::Acquire) {
            return;
        }
        match cap.mode {
            Mode::User64 => {
                USER64.fetch_add(1, Ordering::Relaxed);
                let rip = cap.interrupted.rip;
                for (r, h) in RANGES.iter().zip(&HOT_HITS) {
                    if rip >= r[0].load(Ordering::Relaxed) && rip < r[1].load(Ordering::Relaxed) {
                        h.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            Mode::UserCompat => {
                COMPAT.fetch_add(1, Ordering::Relaxed);
            }
            Mode::Kernel if cap.task.is_some() => {
                IN_SYSCALL.fetch_add(1, Ordering::Relaxed);
            }
            Mode::Kernel => {
                OTHER.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// `(hot function hits, user64, compat, runtime with a task, runtime without)`.
    pub fn totals() -> ([u64; 3], u64, u64, u64, u64) {
        (
            core::array::from_fn(|i| HOT_HITS[i].load(Ordering::Relaxed)),
            USER64.load(Ordering::Relaxed),
            COMPAT.load(Ordering::Relaxed),
            IN_SYSCALL.load(Ordering::Relaxed),
            OTHER.load(Ordering::Relaxed),
        )
    }
}

/// The hot functions of `demo64` and their designed share of its work (%).
const HOT: [(&str, u64); 3] = [
    ("demo_checksum_blocks", 50),
    ("demo_parse_records", 30),
    ("demo_update_stats", 20),
];

/// `[start, end)` of the named appliance function: up to the next known
/// appliance symbol or the end of the appliance's code.
fn function_range(name: &str) -> (u64, u64) {
    let text_end = crate::mm::layout().user_text.1;
    let start = crate::selftest::programs::symbols()
        .find(|&(_, n)| n == name)
        .map_or(0, |(a, _)| a);
    let end = crate::selftest::programs::symbols()
        .map(|(a, _)| a)
        .filter(|&a| a > start)
        .min()
        .unwrap_or(text_end);
    (start, end)
}

fn percent(part: u64, whole: u64) -> u64 {
    (part * 100).checked_div(whole).unwrap_or(0)
}

/// Runs the demo appliance for the configured duration, then exits QEMU.
/// In wire mode (`console=wire`) the run is profiled: a Task record per
/// task, samples drained between task slices, and End with the counters.
pub fn run(cfg: &Config) -> ! {
    let ms = cfg.duration_ms.unwrap_or(DEFAULT_DURATION_MS);
    let wire = crate::console::sink() == crate::console::Sink::Wire;
    let tsc_hz = crate::sample::clock::tsc_hz();
    // TSC time when calibrated (not lost with host timing), else NMI ticks.
    let tsc_budget = (u128::from(ms) * u128::from(tsc_hz) / 1000) as u64;
    let ticks = (ms * u64::from(cfg.freq_hz)).div_ceil(1000).max(1);
    let text = crate::mm::layout().user_text;
    let specs = [
        TaskSpec {
            name: "demo64",
            abi: Abi::X64,
            entry: demo64_main as *const () as u64,
            text,
            gprs: [0; 15],
        },
        TaskSpec {
            name: "demo32",
            abi: Abi::Compat32,
            entry: perch_demo32_main as *const () as u64,
            text: (
                perch_demo32_main as *const () as u64,
                perch_demo32_end as *const () as u64,
            ),
            gprs: [0; 15],
        },
        TaskSpec {
            name: "demosys",
            abi: Abi::X64,
            entry: demosys_main as *const () as u64,
            text,
            gprs: [0; 15],
        },
        TaskSpec {
            name: "demoregs",
            abi: Abi::X64,
            entry: perch_demoregs_main as *const () as u64,
            text,
            gprs: [0; 15],
        },
    ];
    for s in specs {
        match task::spawn(s) {
            Ok(id) => {
                kprintln!(
                    "demo: task {id} {} ({}) text {:#x}..{:#x}",
                    s.name,
                    s.abi.name(),
                    s.text.0,
                    s.text.1
                );
                if wire {
                    // perf maps whole pages: announce the page-aligned user text.
                    crate::stream::send_task(id, s.name, s.abi == Abi::Compat32, text);
                }
            }
            Err(e) => kprintln!("demo: cannot start {}: {e:?}", s.name),
        }
    }
    if tsc_hz > 0 {
        kprintln!("demo: running for {ms} ms of TSC time ({tsc_budget} TSC ticks)");
    } else {
        kprintln!("demo: TSC not calibrated; running for {ms} ms ({ticks} NMI clock ticks)");
    }
    hits::start(HOT.map(|(name, _)| function_range(name)));
    nmi::set_observer(1, hits::on_capture);
    let start = nmi::nmi_count();
    let start_tsc = arch_x86::cpu::rdtsc();
    if wire {
        crate::sample::profile::start();
    }
    task::run_all(|| {
        if wire {
            crate::stream::drain::drain();
        }
        if tsc_hz > 0 {
            arch_x86::cpu::rdtsc().wrapping_sub(start_tsc) >= tsc_budget
        } else {
            nmi::nmi_count() - start >= ticks
        }
    });
    crate::sample::profile::stop();
    hits::stop();
    let mut ok = true;
    for id in 0..task::MAX_TASKS as u8 {
        if let Some(t) = task::get(id) {
            kprintln!(
                "demo: task {} {:?}, {} yields",
                t.spec.name,
                t.state,
                t.yields
            );
            ok &= t.state == task::TaskState::Ready;
        }
    }
    let (hot, user64, compat, in_runtime, idle) = hits::totals();
    kprintln!(
        "demo: NMIs in 64-bit user code {user64}, demo32 (compat) {compat}, runtime for a task {in_runtime}, runtime otherwise {idle}"
    );
    let hot_total: u64 = hot.iter().sum();
    for ((name, designed), n) in HOT.iter().zip(hot) {
        kprintln!(
            "demo: {name}: {n} NMIs, {}% of the hot functions (designed {designed}%)",
            percent(n, hot_total)
        );
    }
    let (cost, measured) = crate::sample::profile::nmi_cost();
    if let Some(avg) = cost.checked_div(measured) {
        kprintln!(
            "demo: NMI path {avg} TSC ticks per sample on average over {measured} samples (instructions under -icount shift=0)"
        );
    }
    report_throttle();
    let (text_dropped, defmt_dropped) = crate::console::dropped();
    kprintln!(
        "demo: done after {} NMIs; console dropped {text_dropped} text bytes, {defmt_dropped} defmt frames",
        nmi::nmi_count() - start
    );
    if wire {
        let end = crate::stream::finish();
        let (enc_fail, write_fail) = crate::stream::wire::failures();
        if enc_fail + write_fail > 0 || end.taken != end.delivered + end.lost {
            ok = false;
        }
    }
    crate::exit(if ok { ExitCode::Pass } else { ExitCode::Fail })
}

/// Says what the throttle did (outside NMI context, after sampling
/// stopped): perf's "interrupt took too long" report when the CPU-time
/// budget lowered the rate, and the throttled overflows.
fn report_throttle() {
    let t = crate::sample::profile::throttle_stats();
    if t.max_rate != u64::MAX
        && t.max_rate < u64::from(crate::sample::profile::max_rate_configured())
    {
        kprintln!(
            "perch: interrupt took too long ({} ns on average), lowered max_rate to {}",
            t.average_ns,
            t.max_rate
        );
    }
    kprintln!(
        "demo: throttled {} times, {} overflows suppressed while throttled, {} throttle records ({} dropped: ring full)",
        t.throttles,
        t.suppressed,
        t.records,
        t.records_dropped
    );
}
