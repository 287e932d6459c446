//! The on-target self-test (`selftest` on the command line). Each test
//! prints `selftest: NAME ... ok` or `... FAILED (why)`; the run ends with
//! `N passed, M failed` and QEMU exits with the pass or fail code.
//!
//! The tests live by concern: `archive` (the boot archive), `tables` (CPU
//! tables, entry windows, page rights), `tasks` (both built-in ABIs, user
//! faults, preemption), `clocks` (NMI clock, throttling), `pmu_checks`,
//! `capture` (exact registers and saved frames under NMIs), `loaded`
//! (programs started through the ELF loader); `programs` holds their
//! ring-3 code and `recorder` the NMI capture log. The frame CRC's CPU
//! instruction is checked here, before them.
// Failure reasons are formatted into a fixed-size buffer (usable from any
// context, NMI-adjacent code included), so the error type is large by design.
#![allow(clippy::result_large_err)]

pub mod programs;
pub mod recorder;
use crate::abi::perch as syscall;
use crate::proc::{self as task, Abi, TaskSpec, TaskState};
use crate::sample::nmi::{self, UserFrameState};
use crate::sample::profile;
use crate::selftest::programs::{self as user, pattern32, pattern64};
use crate::{kprintln, mm};
use arch_x86::exit::ExitCode;
use arch_x86::frame::{INT80_VECTOR, Mode, SYSCALL_VECTOR, TrapFrame};
use arch_x86::pmu::selftest::{Reason, Verdict};
use arch_x86::{cpu, gdt, paging as pg};
use core::fmt::Write;
use kcore::cmdline::Config;

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

mod archive;
mod capture;
mod clocks;
mod loaded;
mod pmu_checks;
mod tables;
mod tasks;
use {archive::*, capture::*, clocks::*, loaded::*, pmu_checks::*, tables::*, tasks::*};

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

/// The CPU's `crc32` instruction, which checks the wire's group frames
/// where the CPU has SSE4.2, computes CRC-32C as its definition says (bit
/// by bit here), at every length and alignment a frame can have. Without
/// SSE4.2 the frames use the wire's own tables (tested on the host).
fn frame_crc_instruction() -> TestResult {
    let Some(crc) = arch_x86::crc32c::hardware() else {
        kprintln!("selftest: no SSE4.2, group frames use the CRC tables");
        return Ok(());
    };
    let bitwise = |data: &[u8]| arch_x86::crc32c::bitwise(0, data);
    let mut data = [0u8; 300];
    for (i, b) in data.iter_mut().enumerate() {
        *b = (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[2];
    }
    ensure!(
        crc(0, b"123456789") == 0xe306_9283,
        "check value {:#x}",
        crc(0, b"123456789")
    );
    for start in 0..8 {
        for len in 0..data.len() - start {
            let d = &data[start..start + len];
            let (x, y) = d.split_at(len / 2);
            ensure!(
                crc(0, d) == bitwise(d) && crc(crc(0, x), y) == bitwise(d),
                "{len} bytes at {start}: {:#x}, want {:#x}",
                crc(0, d),
                bitwise(d)
            );
        }
    }
    Ok(())
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
    r.check("frame_crc_instruction", frame_crc_instruction);
    r.check("other_cpus_on_their_own_tables", other_cpus);
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
    r.check("preemption_on_other_cpus", preemption_on_other_cpus);
    r.check("nmi_clock_ticks", nmi_clock_ticks);
    r.check("nmi_clock_throttle", || nmi_clock_throttle(cfg));
    r.check(
        "nmi_clock_survives_a_lost_expiry",
        nmi_clock_survives_a_lost_expiry,
    );
    r.check("pmu_detection_and_fallback", pmu_detection_and_fallback);
    r.check("pmu_sim_pmi_round_trip", pmu_sim_pmi_round_trip);
    r.check("pmu_sim_two_counters", pmu_sim_two_counters);
    r.check("pmu_startup_check_sim", pmu_startup_check_sim);
    r.check("pmu_hardware", pmu_hardware);
    r.check("nmi_in_user64_exact_regs", exact_regs_user64);
    r.check("nmi_in_compat_exact_regs", exact_regs_compat);
    r.check("nmi_on_every_cpu_exact_regs", exact_regs_per_cpu);
    r.check("nmi_in_syscall_user_frame", spin_in_syscall64);
    r.check("nmi_in_int80_user_frame", spin_in_int80);
    crate::abi::linux::set_system(kcore::sys::System::new(kcore::sys::Vfs::new()));
    r.check("loaded_address_spaces", loaded_address_spaces);
    r.check("loaded_nmi_in_user64_exact_regs", loaded_exact_regs64);
    r.check("loaded_threads_exact_regs_per_thread", loaded_thread_regs64);
    r.check("loaded_nmi_in_compat_exact_regs", loaded_exact_regs32);
    r.check("loaded_nmi_in_syscall_user_frame", loaded_syscall_frame64);
    r.check("loaded_nmi_in_int80_user_frame", loaded_int80_frame32);
    r.check("loaded_return_to_user_regs", loaded_return_to_user_regs);
    kprintln!("{} passed, {} failed", r.passed, r.failed);
    crate::exit(if r.failed == 0 {
        ExitCode::Pass
    } else {
        ExitCode::Fail
    })
}
