//! Each CPU's PMU: its driver state (the simulator's or the hardware's),
//! its PEBS buffer and DS save area, and its counters. Counters, the DS
//! area's MSR and the LVT entry belong to a CPU, so every CPU programs its
//! own, from the one plan the boot CPU made ([`Plan`]).
//!
//! # Why the slots are sound
//!
//! A slot is only ever touched by its own CPU: filled by that CPU outside
//! NMI context (the boot CPU in `setup_sim` / `setup_hw`, another CPU in
//! [`start_this_cpu`] before it reports itself up), then published by
//! [`CpuPmuSlot::live`] (Release), then used by that CPU's NMI handler after
//! it sees the flag (Acquire), until `stop_hw` (on the boot CPU, for its
//! own slot) withdraws the flag and takes the state back. NMIs do not nest,
//! so at most one `&mut` to a slot's state exists at any time. Other CPUs
//! read only the slot's atomic counters.

use super::*;
use crate::cpu::CpuLocal;
use core::sync::atomic::{AtomicBool, AtomicU8};

/// One CPU's PMU while it samples (see the module docs).
pub struct CpuPmuSlot {
    sim: UnsafeCell<Option<SimState>>,
    hw: UnsafeCell<Option<HwState>>,
    buf: UnsafeCell<[u8; PEBS_BYTES]>,
    area: DsArea,
    /// The state above is complete and this CPU's PMU programmed.
    live: AtomicBool,
    /// PEBS samples lost here and not yet in a Lost record.
    pub(super) pebs_lost: AtomicU64,
    /// The hardware path's counters here ([`HwStats`]).
    pub(super) pmis: AtomicU64,
    pub(super) samples: AtomicU64,
    pub(super) with_branches: AtomicU64,
    pub(super) pebs_decoded: AtomicU64,
    pub(super) pebs_lost_total: AtomicU64,
    pub(super) unknown_nmis: AtomicU64,
    /// Why this CPU's PMU could not be programmed from the plan
    /// ([`PROGRAM_FAILED`] and the others), 0 when it was (or no plan).
    failure: AtomicU8,
}

// SAFETY: the module docs: each slot's non-atomic state is touched by its
// own CPU only, and its NMI handler only after `live` publishes it.
unsafe impl Sync for CpuPmuSlot {}

impl CpuPmuSlot {
    const fn new() -> Self {
        CpuPmuSlot {
            sim: UnsafeCell::new(None),
            hw: UnsafeCell::new(None),
            buf: UnsafeCell::new([0; PEBS_BYTES]),
            area: DsArea::new(),
            live: AtomicBool::new(false),
            pebs_lost: AtomicU64::new(0),
            pmis: AtomicU64::new(0),
            samples: AtomicU64::new(0),
            with_branches: AtomicU64::new(0),
            pebs_decoded: AtomicU64::new(0),
            pebs_lost_total: AtomicU64::new(0),
            unknown_nmis: AtomicU64::new(0),
            failure: AtomicU8::new(0),
        }
    }

    /// The counters [`HwStats`] sums.
    pub(super) fn counters(&self) -> [&AtomicU64; 6] {
        [
            &self.pmis,
            &self.samples,
            &self.with_branches,
            &self.pebs_decoded,
            &self.pebs_lost_total,
            &self.unknown_nmis,
        ]
    }

    /// True once the slot's state is published (NMI-safe).
    #[inline]
    pub(super) fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    /// Puts the simulator's `state` in the slot, starts it and publishes
    /// the slot.
    ///
    /// # Safety
    /// 1. The caller runs on the CPU the slot belongs to, outside NMI
    ///    context, and the slot is not live (no NMI handler uses it).
    pub(super) unsafe fn publish_sim(&self, state: SimState) {
        // SAFETY: obligation 1: no reference to the cell exists while the
        // slot is not live, and no other CPU ever touches it.
        let st = unsafe { &mut *self.sim.get() }.insert(state);
        st.driver.start(&mut st.clock.sim);
        self.live.store(true, Ordering::Release);
    }

    /// Puts the hardware `state` in the slot, starts the counters and
    /// publishes the slot. They start before it is published: the smallest
    /// period is `MIN_PERIOD` events, far more than the store takes.
    ///
    /// # Safety
    /// 1. As for [`Self::publish_sim`].
    pub(super) unsafe fn publish_hw(&self, state: HwState) {
        // SAFETY: obligation 1.
        let st = unsafe { &mut *self.hw.get() }.insert(state);
        st.driver.start(&mut st.hw);
        self.live.store(true, Ordering::Release);
    }

    /// The slot's PEBS memory for setting up its driver.
    ///
    /// # Safety
    /// 1. As for [`Self::publish_sim`]: on the slot's CPU, not live.
    pub(super) unsafe fn setup_memory(&self) -> DsMemory<'_> {
        // SAFETY: obligation 1: nothing else refers to the buffer.
        let buf = unsafe { &mut *self.buf.get() };
        buf.fill(0);
        DsMemory::new(&self.area, buf)
    }

    /// The simulator's state and the PEBS memory, in this CPU's NMI
    /// handler.
    ///
    /// # Safety
    /// 1. The caller is the NMI handler of the slot's CPU, and saw
    ///    [`Self::is_live`].
    #[inline]
    #[allow(clippy::mut_from_ref)] // the cell's; obligation 1 makes it unique
    pub(super) unsafe fn sim_in_nmi(&self) -> Option<(&mut SimState, DsMemory<'_>)> {
        // SAFETY: obligation 1 and the module docs: the only reference
        // while the handler runs (NMIs do not nest).
        let st = unsafe { &mut *self.sim.get() }.as_mut()?;
        // SAFETY: as above, for the buffer.
        let buf = unsafe { &mut *self.buf.get() };
        Some((st, DsMemory::new(&self.area, buf)))
    }

    /// The hardware state and (when it uses PEBS) the PEBS memory, in this
    /// CPU's NMI handler.
    ///
    /// # Safety
    /// 1. As for [`Self::sim_in_nmi`].
    #[inline]
    #[allow(clippy::mut_from_ref)] // as for `sim_in_nmi`
    pub(super) unsafe fn hw_in_nmi(&self) -> Option<(&mut HwState, DsMemory<'_>)> {
        // SAFETY: obligation 1 and the module docs.
        let st = unsafe { &mut *self.hw.get() }.as_mut()?;
        // SAFETY: as above, for the buffer.
        let buf = unsafe { &mut *self.buf.get() };
        Some((st, DsMemory::new(&self.area, buf)))
    }

    /// Withdraws the slot and hands back its hardware state.
    ///
    /// # Safety
    /// 1. The caller runs on the slot's CPU, and nothing else uses the
    ///    state: either outside NMI context once that CPU's NMI handler no
    ///    longer does (`HW_STATE` is not `HW_ON`), or from that NMI handler
    ///    itself after seeing [`Self::is_live`].
    pub(super) unsafe fn take_hw(&self) -> Option<HwState> {
        self.live.store(false, Ordering::Release);
        // SAFETY: obligation 1.
        unsafe { &mut *self.hw.get() }.take()
    }
}

/// The boot CPU's slot (a static, as its PEBS buffer always was).
static BOOT_SLOT: CpuPmuSlot = CpuPmuSlot::new();

/// The boot CPU's slot.
pub(super) fn boot_slot() -> &'static CpuPmuSlot {
    &BOOT_SLOT
}

/// `cpu`'s slot, if it has one (NMI-safe).
#[inline]
pub(super) fn slot_of(cpu: &CpuLocal) -> Option<&'static CpuPmuSlot> {
    if cpu.index == 0 {
        return Some(&BOOT_SLOT);
    }
    let p = cpu.pmu.get().cast::<CpuPmuSlot>();
    // SAFETY: a non-null pointer is the never-freed slot `prepare_cpu`
    // made for this CPU before it started.
    unsafe { p.as_ref() }
}

/// Every CPU's slot that is up.
pub(super) fn every_slot() -> impl Iterator<Item = (u32, &'static CpuPmuSlot)> {
    (0..crate::smp::online()).filter_map(|i| crate::smp::cpu(i).and_then(slot_of).map(|s| (i, s)))
}

/// What the boot CPU programmed, for the others to program the same.
#[derive(Clone, Copy)]
pub(super) struct Plan {
    /// The simulated CPU (`pmu=sim`), or `None` for the hardware PMU.
    pub(super) sim: Option<SimCpu>,
    /// The events, one counter each.
    pub(super) configs: [EventConfig; profile::MAX_EVENTS],
    pub(super) n: usize,
    /// perf's `branch_sample_type` for the LBR.
    pub(super) branches: u64,
}

struct PlanCell(UnsafeCell<Option<Plan>>);

// SAFETY: written once by `set_plan` before PLAN_READY publishes it
// (Release), read only after seeing it (Acquire), never written again.
unsafe impl Sync for PlanCell {}

static PLAN: PlanCell = PlanCell(UnsafeCell::new(None));
const PLAN_EMPTY: u8 = 0;
const PLAN_WRITING: u8 = 1;
const PLAN_READY: u8 = 2;
static PLAN_STATE: AtomicU8 = AtomicU8::new(PLAN_EMPTY);

/// Records what the boot CPU programmed, so that every CPU started later
/// programs the same. Only the boot's own set-up counts: a set-up made
/// once other CPUs are up (the self-test's) stays the boot CPU's.
pub(super) fn set_plan(plan: Plan) {
    if crate::smp::online() > 1
        || PLAN_STATE
            .compare_exchange(
                PLAN_EMPTY,
                PLAN_WRITING,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
    {
        return;
    }
    // SAFETY: PLAN_WRITING is ours: no reader until PLAN_READY.
    unsafe { *PLAN.0.get() = Some(plan) };
    PLAN_STATE.store(PLAN_READY, Ordering::Release);
}

fn plan() -> Option<&'static Plan> {
    if PLAN_STATE.load(Ordering::Acquire) != PLAN_READY {
        return None;
    }
    // SAFETY: PLAN_READY was seen: written once, never again.
    unsafe { (*PLAN.0.get()).as_ref() }
}

/// Gives CPU `local` (not yet started) a PMU slot when the boot CPU's PMU
/// samples: false when the heap has no room (the CPU is then not started).
pub fn prepare_cpu(local: &'static CpuLocal) -> bool {
    if plan().is_none() {
        return true;
    }
    let layout = core::alloc::Layout::new::<CpuPmuSlot>();
    // SAFETY: the layout is not zero-sized.
    let p = unsafe { alloc::alloc::alloc_zeroed(layout) } as *mut CpuPmuSlot;
    if p.is_null() {
        return false;
    }
    // SAFETY: `p` is a fresh block for a slot, which no one else sees yet;
    // every field is written whole before the block is used as a slot; it
    // is never freed.
    unsafe { p.write(CpuPmuSlot::new()) };
    // SAFETY: the CPU has not started: nothing reads its block yet.
    unsafe { local.pmu.set(p.cast_const().cast()) };
    true
}

/// The failure codes of [`CpuPmuSlot::failure`].
const PROGRAM_FAILED: u8 = 1;
const APIC_OFF: u8 = 2;
const NO_COUNTERS: u8 = 3;

/// On a CPU just started (its own code, before it reports itself up,
/// interrupts off): programs its PMU as the boot CPU's plan says and
/// starts it, so its overflows are NMIs here. The hardware PMU is
/// detected again on this CPU (a hybrid part's cores differ); a CPU
/// whose PMU cannot take the plan is left unprogrammed and counted
/// ([`report_cpus`]).
pub fn start_this_cpu(local: &'static CpuLocal) {
    let (Some(plan), Some(slot)) = (plan(), slot_of(local)) else {
        return;
    };
    if local.index == 0 {
        return;
    }
    let cfgs = &plan.configs[..plan.n];
    // SAFETY: on the slot's own CPU, before anything publishes it.
    let mut mem = unsafe { slot.setup_memory() };
    let done = match plan.sim {
        Some(cpu) => build_sim_events(cpu, cfgs, plan.branches, &mut mem)
            .map(|(s, _)| {
                // SAFETY: on the slot's own CPU, outside NMI context, not
                // live.
                unsafe { slot.publish_sim(s) };
            })
            .map_err(|_| PROGRAM_FAILED),
        None => {
            // SAFETY: as in `main`: ring 0, CPUID-advertised MSRs only,
            // read-only.
            let mut msr = unsafe { arch_x86::msr::CpuMsr::new() };
            let info = arch_x86::cpuid::detect(&arch_x86::cpuid::CpuCpuid, &mut msr);
            if !info.has_pmu() {
                Err(NO_COUNTERS)
            } else {
                match program_hw(&info, cfgs, plan.branches, &mut mem) {
                    Ok(h) => {
                        // SAFETY: as above.
                        unsafe { slot.publish_hw(h) };
                        Ok(())
                    }
                    Err(HwError::ApicOff) => Err(APIC_OFF),
                    Err(_) => Err(PROGRAM_FAILED),
                }
            }
        }
    };
    if let Err(code) = done {
        slot.failure.store(code, Ordering::Relaxed);
    }
}

/// Says which CPUs could not program their PMU as the boot CPU did (after
/// the CPUs are up).
pub fn report_cpus() {
    for (i, slot) in every_slot() {
        let why = match slot.failure.load(Ordering::Relaxed) {
            0 => continue,
            APIC_OFF => "its local APIC is disabled",
            NO_COUNTERS => "CPUID advertises no PMU there",
            _ => "its PMU refused the boot CPU's events",
        };
        crate::kprintln!("perch: CPU {i}: PMU not programmed: {why}; no PMU samples from it");
    }
}
