//! Profiling on the target: the NMI-context sampler glue (capture ->
//! `sampler::capture::build_sample_into`, straight into the claimed slot of
//! the per-CPU ring) and, outside NMI
//! context, the stream that carries the samples: Hello, Task records, the
//! drain loop (ring -> `Lost`/`Sample` frames -> UART) and the final End
//! with counters such that `taken = delivered + lost` exactly.
//!
//! The overflow source has one seam, [`Source`]: the NMI clock
//! (`cpu-clock`), where every NMI is one overflow; the hardware PMU, whose
//! PMIs are the NMIs; or the simulated PMU driven by the NMI clock.

use crate::clock;
use crate::nmi::{NmiContext, UserFrameState};
use crate::wire;
use arch_x86::frame::{Mode, TrapFrame};
use arch_x86::gdt;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use sampler::capture::{
    CallchainWriter, InterruptFrame, SampleInput, UserFrame, build_sample_into,
};
use sampler::drain::{NmiRecord, drain_step};
use sampler::event::{EventConfig, PmuCaps, sample_type as st};
use sampler::regs::{CodeMode, GPR_MASK, Reg, RegFile};
use sampler::ring::Ring;
use sampler::sample::CpuMode;
use sampler::wire::{CpuId, CpuVendor, End, Hello, Lost, LostReason, Record, Task, TextRange};

/// Ring slots (the usable capacity can be lowered with `ring=N`).
pub const RING_SLOTS: usize = 256;
/// Most runtime frames walked per sample.
const MAX_KERNEL_FRAMES: usize = 16;
/// Most user frames walked per sample.
const MAX_USER_FRAMES: usize = 32;
/// Records written per drain step, so a drain never runs unbounded.
const DRAIN_BATCH: usize = 64;

/// What drives the overflows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The periodic NMI clock: the `cpu-clock` event.
    NmiClock,
    /// `pmu=sim`: the simulated PMU driven by the NMI clock (see `crate::pmu`).
    Simulated(PmuCaps),
    /// `pmu=auto` with a usable PMU: its overflow NMIs (see `crate::pmu`).
    Pmu(PmuCaps),
}

/// PMU data for one sample (see `crate::pmu`); [`Extra::NONE`] for the NMI clock.
pub struct Extra<'a> {
    /// The period this sample stands for (0: the NMI clock's).
    pub period: u64,
    /// PEBS IP.
    pub precise_ip: Option<u64>,
    /// PEBS GPRs.
    pub pebs_regs: Option<&'a RegFile>,
    /// LBR stack.
    pub branches: Option<&'a sampler::sample::BranchStack>,
    /// PEBS memory fields.
    pub mem: Option<sampler::sample::MemInfo>,
}

impl Extra<'_> {
    /// No PMU data.
    pub const NONE: Extra<'static> = Extra {
        period: 0,
        precise_ip: None,
        pebs_regs: None,
        branches: None,
        mem: None,
    };
}

/// Which fields a sample carries (`sample=` on the command line).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleSet {
    /// IP, TID, TIME, CPU, PERIOD, REGS_USER (20 GPRs) and CALLCHAIN.
    Default,
    /// The default plus REGS_INTR (20 GPRs).
    Full,
    /// IP, TID, TIME, CPU and PERIOD only.
    Minimal,
}

impl SampleSet {
    /// Parses a `sample=` value.
    pub fn parse(v: &str) -> Option<Self> {
        match v {
            "default" => Some(Self::Default),
            "full" => Some(Self::Full),
            "minimal" => Some(Self::Minimal),
            _ => None,
        }
    }
}

static RING: Ring<NmiRecord, RING_SLOTS> = Ring::new();
static ON: AtomicBool = AtomicBool::new(false);
static SAMPLE_TYPE: AtomicU64 = AtomicU64::new(0);
static REGS_USER: AtomicU64 = AtomicU64::new(0);
static REGS_INTR: AtomicU64 = AtomicU64::new(0);
static FREQ_HZ: AtomicU64 = AtomicU64::new(1);
static PERIOD_NS: AtomicU64 = AtomicU64::new(0);
static NOT_SAMPLED: AtomicU64 = AtomicU64::new(0);
static NMI_COST_TSC: AtomicU64 = AtomicU64::new(0);
static NMI_COST_COUNT: AtomicU64 = AtomicU64::new(0);
static CHAIN_TRUNCATED: AtomicU32 = AtomicU32::new(0);
static SIMULATED: AtomicBool = AtomicBool::new(false);
static PEBS_LOST_TOTAL: AtomicU64 = AtomicU64::new(0);
static HW_EVENT: HwEventCell = HwEventCell(UnsafeCell::new(None));
static HW_EVENT_SET: AtomicBool = AtomicBool::new(false);

/// The hardware event (kind, config, sampling, modes, precise, branch
/// types), written once by [`configure_hw`] before sampling starts and only
/// read afterwards.
struct HwEventCell(UnsafeCell<Option<EventConfig>>);
// SAFETY: written once, before HW_EVENT_SET is published (Release); read
// only after seeing it (Acquire), never written again.
unsafe impl Sync for HwEventCell {}

fn hw_event() -> Option<EventConfig> {
    if !HW_EVENT_SET.load(Ordering::Acquire) {
        return None;
    }
    // SAFETY: see `HwEventCell`.
    unsafe { *HW_EVENT.0.get() }
}

/// The event in force, rebuilt from atomics (NMI-safe).
pub fn event() -> EventConfig {
    let mut e = EventConfig::cpu_clock(0, FREQ_HZ.load(Ordering::Relaxed));
    e.sample_type = SAMPLE_TYPE.load(Ordering::Relaxed);
    e.regs_user = REGS_USER.load(Ordering::Relaxed);
    e.regs_intr = REGS_INTR.load(Ordering::Relaxed);
    if SIMULATED.load(Ordering::Relaxed) {
        e.kind = sampler::event::EventKind::Raw;
        e.config = crate::pmu::SIM_RAW_CONFIG;
        e.sampling = sampler::event::Sampling::Period(crate::pmu::SIM_PERIOD);
        e.precise = 2;
        e.branch_sample_type = sampler::event::branch_type::ANY
            | sampler::event::branch_type::USER
            | sampler::event::branch_type::KERNEL;
    }
    if let Some(h) = hw_event() {
        e.kind = h.kind;
        e.config = h.config;
        e.sampling = h.sampling;
        e.exclude_user = h.exclude_user;
        e.exclude_kernel = h.exclude_kernel;
        e.precise = h.precise;
        e.branch_sample_type = h.branch_sample_type;
    }
    e
}

/// `pmu=auto` with a usable PMU: samples describe `ev` (its kind, config,
/// sampling, modes, precise and branch types) and carry the fields in
/// `sample_type` the PMU adds (BRANCH_STACK with LBR; REGS_INTR, and ADDR /
/// WEIGHT / DATA_SRC for memory events, with PEBS). Once, before [`start`].
pub fn configure_hw(ev: &EventConfig, sample_type: u64) {
    if HW_EVENT_SET.load(Ordering::Acquire) {
        return;
    }
    // SAFETY: not yet published, and called once at boot before sampling
    // starts: nothing reads the cell yet.
    unsafe { *HW_EVENT.0.get() = Some(*ev) };
    HW_EVENT_SET.store(true, Ordering::Release);
    SAMPLE_TYPE.fetch_or(sample_type, Ordering::Relaxed);
    if sample_type & st::REGS_INTR != 0 {
        REGS_INTR.store(GPR_MASK, Ordering::Relaxed);
    }
}

/// `pmu=sim`: samples carry the PMU fields (BRANCH_STACK, ADDR, WEIGHT,
/// DATA_SRC, REGS_INTR) of the simulated precise `mem-loads` event.
pub fn configure_sim() {
    let extra = st::REGS_INTR | st::BRANCH_STACK | st::ADDR | st::WEIGHT | st::DATA_SRC;
    SAMPLE_TYPE.fetch_or(extra, Ordering::Relaxed);
    REGS_INTR.store(GPR_MASK, Ordering::Relaxed);
    SIMULATED.store(true, Ordering::Relaxed);
}

/// Configures the event for `freq_hz` (the rate really programmed, in
/// mHz) and `set`; call before [`start`].
pub fn configure(freq_hz: u32, actual_mhz: u64, set: SampleSet) {
    let base = st::IDENTIFIER | st::IP | st::TID | st::TIME | st::CPU | st::PERIOD;
    let (stype, ru, ri) = match set {
        SampleSet::Minimal => (base, 0, 0),
        SampleSet::Default => (base | st::REGS_USER | st::CALLCHAIN, GPR_MASK, 0),
        SampleSet::Full => (
            base | st::REGS_USER | st::CALLCHAIN | st::REGS_INTR,
            GPR_MASK,
            GPR_MASK,
        ),
    };
    SAMPLE_TYPE.store(stype, Ordering::Relaxed);
    REGS_USER.store(ru, Ordering::Relaxed);
    REGS_INTR.store(ri, Ordering::Relaxed);
    FREQ_HZ.store(u64::from(freq_hz.max(1)), Ordering::Relaxed);
    let mhz = actual_mhz.max(1);
    PERIOD_NS.store(1_000_000_000_000 / mhz, Ordering::Relaxed);
}

/// Caps the usable ring slots (`ring=N`); returns the capacity in force.
pub fn set_ring_slots(n: u32) -> Result<usize, sampler::ring::CapacityError> {
    RING.set_capacity(n as usize)?;
    Ok(RING.capacity())
}

/// Starts sampling.
pub fn start() {
    ON.store(true, Ordering::Release);
}

/// Stops sampling (NMIs still arrive but take no samples).
pub fn stop() {
    ON.store(false, Ordering::Release);
}

fn code_mode(cs: u64) -> CodeMode {
    if cs as u16 == gdt::USER_CODE32 {
        CodeMode::Compat32
    } else {
        CodeMode::Long64
    }
}

/// The frame in perf register order (DS..GS, never sampled on x86-64,
/// read 0), written once with no zeroing pass. Without `all`, only what a
/// sample without register sets reads (IP and CS) is filled in.
fn interrupt_frame(f: &TrapFrame, all: bool) -> InterruptFrame {
    let regs = if all {
        RegFile([
            f.rax, f.rbx, f.rcx, f.rdx, f.rsi, f.rdi, f.rbp, f.rsp, f.rip, f.rflags, f.cs, f.ss, 0,
            0, 0, 0, f.r8, f.r9, f.r10, f.r11, f.r12, f.r13, f.r14, f.r15,
        ])
    } else {
        RegFile::default().with(Reg::Ip, f.rip).with(Reg::Cs, f.cs)
    };
    InterruptFrame {
        regs,
        code: code_mode(f.cs),
    }
}

fn inside(addr: u64, len: u64, range: (u64, u64)) -> bool {
    addr >= range.0 && addr.checked_add(len).is_some_and(|end| end <= range.1)
}

/// Reads a word the walk has bounds-checked.
fn read_checked(addr: u64, len: u64, range: (u64, u64)) -> Option<u64> {
    if !inside(addr, len, range) || !addr.is_multiple_of(len) {
        return None;
    }
    // SAFETY: `addr` is aligned and the whole word lies inside `range`, a
    // mapped region of the image (runtime data or appliance data, identity
    // mapped by `paging::init`), so the read cannot fault; user pages are
    // read inside `with_user_access` by the caller.
    Some(unsafe {
        if len == 4 {
            u64::from(core::ptr::read_volatile(addr as *const u32))
        } else {
            core::ptr::read_volatile(addr as *const u64)
        }
    })
}

/// Frame-pointer walk: the saved frame pointer at `[fp]`, the return
/// address at `[fp + word]`, every read inside `stack`, every return
/// address inside `text`, frames strictly ascending.
fn walk_frames(
    cc: &mut CallchainWriter<'_>,
    mode: CpuMode,
    mut fp: u64,
    word: u64,
    stack: (u64, u64),
    text: (u64, u64),
    max: usize,
) {
    for _ in 0..max {
        let Some(next) = read_checked(fp, word, stack) else {
            return;
        };
        let Some(ret) = fp
            .checked_add(word)
            .and_then(|a| read_checked(a, word, stack))
        else {
            return;
        };
        if ret < text.0 || ret >= text.1 {
            return;
        }
        cc.push(mode, ret);
        if next <= fp {
            return;
        }
        fp = next;
    }
}

fn callchain(cc: &mut CallchainWriter<'_>, ctx: &NmiContext<'_>) {
    let l = crate::paging::layout();
    let user = if ctx.mode == Mode::Kernel {
        cc.push(CpuMode::Kernel, ctx.interrupted.rip);
        walk_frames(
            cc,
            CpuMode::Kernel,
            ctx.interrupted.rbp,
            8,
            l.data,
            l.text,
            MAX_KERNEL_FRAMES,
        );
        ctx.user_regs.filter(|_| ctx.task.is_some())
    } else {
        Some(ctx.interrupted)
    };
    if let Some(u) = user {
        cc.push(CpuMode::User, u.rip);
        let word = if code_mode(u.cs) == CodeMode::Compat32 {
            4
        } else {
            8
        };
        let fp = if word == 4 {
            u.rbp & 0xffff_ffff
        } else {
            u.rbp
        };
        crate::cpu::with_user_access(|| {
            walk_frames(
                cc,
                CpuMode::User,
                fp,
                word,
                l.user_data,
                l.user_text,
                MAX_USER_FRAMES,
            )
        });
    }
}

/// NMI context: one overflow of the NMI clock. Builds the sample and
/// queues it; atomics and bounded copies only. `entry_tsc` is the TSC read
/// first thing in the handler (for the per-sample cost).
pub fn on_overflow(cap: &NmiContext<'_>, entry_tsc: u64) {
    let on = ON.load(Ordering::Acquire);
    // A PMI of the hardware PMU is serviced (and sampled when on) there.
    let pmi = crate::pmu::on_nmi(cap, entry_tsc, on);
    if !on {
        return;
    }
    if pmi {
    } else if crate::pmu::sim_active() {
        crate::pmu::on_tick(cap, entry_tsc);
    } else {
        push_sample(cap, entry_tsc, &Extra::NONE);
    }
    let cost = arch_x86::cpu::rdtsc().wrapping_sub(entry_tsc);
    NMI_COST_TSC.fetch_add(cost, Ordering::Relaxed);
    NMI_COST_COUNT.fetch_add(1, Ordering::Relaxed);
}

/// NMI context: builds one sample of the interrupted context, with the PMU
/// data in `x`, in place in its ring slot (frames walked straight into the
/// slot's callchain); bounded copies only.
pub fn push_sample(ctx: &NmiContext<'_>, entry_tsc: u64, x: &Extra<'_>) {
    let ev = event();
    let all_regs = ev.sample_type & (st::REGS_USER | st::REGS_INTR) != 0;
    let interrupted = interrupt_frame(ctx.interrupted, all_regs);
    // The saved user frame matters only when the NMI interrupted the
    // runtime (from user mode the interrupted frame is the user frame), so
    // it is converted only then.
    let saved;
    let user_frame = match (ctx.user_state, ctx.user_regs) {
        (UserFrameState::Complete, Some(u)) if ctx.mode == Mode::Kernel => {
            saved = interrupt_frame(u, all_regs);
            UserFrame::Complete(&saved)
        }
        (UserFrameState::Complete, Some(_)) => UserFrame::Complete(&interrupted),
        (UserFrameState::InWindow, _) => UserFrame::InWindow,
        (UserFrameState::Complete | UserFrameState::NoTask, _) => UserFrame::NoTask,
    };
    let tid = ctx.task.map_or(0, |t| u32::from(t) + 1);
    let mut input = SampleInput::new(
        &ev,
        &interrupted,
        user_frame,
        clock::tsc_to_ns(entry_tsc),
        0,
        tid,
        if x.period == 0 {
            PERIOD_NS.load(Ordering::Relaxed)
        } else {
            x.period
        },
    );
    input.precise_ip = x.precise_ip;
    input.pebs_regs = x.pebs_regs;
    input.branches = x.branches;
    input.mem = x.mem;
    if input.excluded() {
        NOT_SAMPLED.fetch_add(1, Ordering::Relaxed);
        return;
    }
    // Drops and counts the sample when the ring is full.
    RING.push_with(|rec| {
        let s = rec.sample_mut();
        build_sample_into(&input, s);
        if ev.has(st::CALLCHAIN) {
            let mut cc = CallchainWriter::new(&mut s.callchain, ev.max_stack);
            callchain(&mut cc, ctx);
            if cc.truncated() {
                CHAIN_TRUNCATED.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
}

/// `(TSC ticks spent from NMI entry to the end of the push, samples measured)`;
/// under `-icount shift=0` the ticks are instructions.
pub fn nmi_cost() -> (u64, u64) {
    (
        NMI_COST_TSC.load(Ordering::Relaxed),
        NMI_COST_COUNT.load(Ordering::Relaxed),
    )
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

/// Sends Hello: who we are and what we sample.
pub fn send_hello(cmdline: &str, source: Source) {
    let caps = match source {
        Source::NmiClock => PmuCaps::cpu_clock(),
        Source::Simulated(c) | Source::Pmu(c) => c,
    };
    let mut h = Hello::new(cpu_id(), caps);
    h.tsc_hz = clock::tsc_hz();
    let id = build_id();
    let _ = h
        .build_id
        .extend_from_slice(&id[..id.len().min(h.build_id.capacity())]);
    let mut end = cmdline.len().min(h.cmdline.capacity());
    while !cmdline.is_char_boundary(end) {
        end -= 1;
    }
    let _ = h.cmdline.push_str(&cmdline[..end]);
    let _ = h.events.push(event());
    wire::send(&Record::Hello(h));
}

/// Sends a Task record for task `id`.
pub fn send_task(id: u8, name: &str, compat: bool, text: (u64, u64)) {
    let mut t = Task {
        time: clock::now_ns(),
        pid: u32::from(id) + 1,
        tid: u32::from(id) + 1,
        name: heapless::String::new(),
        abi: if compat {
            sampler::regs::Abi::Bits32
        } else {
            sampler::regs::Abi::Bits64
        },
        text: heapless::Vec::new(),
    };
    let _ = t.name.push_str(&name[..name.len().min(t.name.capacity())]);
    let _ = t.text.push(TextRange {
        start: text.0,
        len: text.1.saturating_sub(text.0),
        // The host takes the offset from the image's section headers.
        file_offset: 0,
    });
    wire::send(&Record::Task(t));
}

/// Outside NMI context: moves queued samples (and Lost records for ring
/// losses) onto the wire, at most one ring's worth per call so a slow line
/// cannot keep the tasks from running (what does not fit is lost and
/// counted). Returns the records written.
pub fn drain() -> usize {
    drain_up_to(RING_SLOTS.div_ceil(DRAIN_BATCH))
}

fn drain_up_to(max_steps: usize) -> usize {
    let mut written = 0;
    let pebs_lost = crate::pmu::take_pebs_lost();
    if pebs_lost > 0 {
        PEBS_LOST_TOTAL.fetch_add(pebs_lost, Ordering::Relaxed);
        wire::send(&Record::Lost(Lost {
            time: clock::now_ns(),
            cpu: 0,
            event: 0,
            count: pebs_lost,
            reason: LostReason::Pebs,
        }));
        written += 1;
    }
    for _ in 0..max_steps {
        let step = wire::with_encoder(|enc, buf, write| {
            drain_step(
                &RING,
                0,
                clock::now_ns(),
                enc,
                buf,
                DRAIN_BATCH,
                |f: &[u8]| write(f),
            )
        });
        match step {
            Ok(s) => {
                written += s.frames;
                if s.frames < DRAIN_BATCH {
                    break;
                }
            }
            // Counted by the wire module; the ring's counters stay exact.
            Err(_) => break,
        }
    }
    written
}

/// Stops sampling, drains everything and sends End with the final counters.
pub fn finish() -> End {
    stop();
    // Sampling is off, so the ring only empties: this ends.
    while drain_up_to(usize::MAX) > 0 {}
    let r = RING.stats();
    let end = End {
        time: clock::now_ns(),
        taken: r.taken + PEBS_LOST_TOTAL.load(Ordering::Relaxed),
        delivered: r.delivered,
        lost: r.lost + PEBS_LOST_TOTAL.load(Ordering::Relaxed),
        throttled: 0,
        frames: wire::frames(),
    };
    wire::send(&Record::End(end));
    end
}
