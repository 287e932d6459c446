//! The NMI-path record and its expansion: the NMI handler queues a
//! [`RawSample`] (header words, walked IPs, register frames copied as they
//! are), and the drain expands it into the wire [`Sample`] with
//! [`RawSample::expand_into`], which applies the `perf_sample_regs_user`
//! rules below. Also the alternative mode that takes user registers at the
//! next return to user mode.
//!
//! # User-register rules ([`UserRegsMode::AtInterrupt`])
//! - The NMI interrupted user mode (CS RPL 3): the registers come from the
//!   interrupt frame, with the ABI of that CS's mode.
//! - It interrupted the runtime: they come from the task's saved user frame
//!   ([`UserFrame::Complete`], [`raw_flags::SAVED_USER`]). Our entry code
//!   always saves every GPR, so all of them are exact (Linux reports BX and
//!   R12-R15 as -1 in an NMI).
//! - The saved frame cannot be complete, because the NMI landed inside an
//!   entry or exit window ([`UserFrame::InWindow`]), or there is no task
//!   ([`UserFrame::NoTask`]): ABI_NONE and no values, never stale or partial
//!   ones.
//! - The mask is always the x86-64 layout; a compat task gives ABI_32 with
//!   R8-R15 reported as 0 ([`crate::regs::user_regs_value`]).
//!
//! REGS_INTR always comes from the interrupt frame (or the PEBS record's
//! GPRs, when a PEBS decoder supplies them).
//!
//! # Return-to-user mode ([`UserRegsMode::AtReturnToUser`])
//! When the NMI interrupted the runtime, the raw sample is parked in a
//! [`DeferredUserRegs`] store and completed with the frame that the task's
//! return path is about to restore, which is complete by construction
//! ([`raw_flags::RETURN_USER`]); a parked sample whose task never returns
//! (it blocked or exited) gets ABI_NONE. The return
//! path raises the *exit-window flag* before it drains the store and keeps
//! it up until the `iretq`; an NMI that lands while it is up gets ABI_NONE
//! at once instead of being parked, because parking it would attach the
//! registers of a later return to it (a bogus sample).
//!
//! # Division of work
//! NMI context only copies: the header words, the frames it needs (one
//! plain copy of the entry stub's frame each, no reordering, no masks) and
//! the return addresses it walks, into the ring slot it claimed with
//! [`Ring::push_with`]. Everything that decides what the sample says is in
//! [`RawSample::expand_into`], which the drain runs outside NMI context
//! ([`crate::drain::drain_step`]). [`capture`] fills a record from a
//! [`SampleInput`] the way the NMI handler does, for tests and cold paths.
//! ```
//! use sampler::capture::RawFrame;
//! use sampler::drain::NmiRecord;
//! use sampler::event::{EventConfig, sample_type};
//! use sampler::regs::{Abi, GPR_MASK, Reg};
//! use sampler::ring::{FilledRing, Ring};
//!
//! static RING: FilledRing<NmiRecord, 8> = Ring::new_filled();
//! let mut event = EventConfig::cpu_clock(0, 4000);
//! event.sample_type |= sample_type::REGS_USER;
//! event.regs_user = GPR_MASK;
//! // NMI side: a user-mode NMI; the frame is copied as the entry stub saved it.
//! let frame = RawFrame { rip: 0x40_1234, cs: 0x2b, rax: 7, ..RawFrame::ZERO };
//! RING.push_with(|rec| {
//!     let r = rec.sample_mut();
//!     r.time = 1_000;
//!     r.ip = frame.rip;
//!     (r.pid, r.tid, r.cpu, r.period) = (7, 7, 0, 250_000);
//!     r.user = frame;
//!     r.flags = 0; // user mode, 64-bit
//! });
//! // Drain side.
//! let s = RING.pop_with(|rec| match rec {
//!     NmiRecord::Sample(raw) => raw.expand(&event),
//!     _ => unreachable!(),
//! });
//! let regs = s.unwrap().regs_user.unwrap();
//! assert_eq!((regs.abi, regs.get(Reg::Ax), regs.get(Reg::Ip)), (Abi::Bits64, Some(7), Some(0x40_1234)));
//! ```

use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::drain::NmiRecord;
use crate::event::{EventConfig, UserRegsMode, sample_type as st};
use crate::regs::{
    CodeMode, GPR_MASK, NUM_GPR_SLOTS, R8_R15_MASK, Reg, RegFile, RegsSample, VALID_MASK_WITH_XMM,
};
use crate::ring::{ConstDefault, FilledRing, Ring};
use crate::sample::{
    BranchStack, CpuMode, MAX_CALLCHAIN, MemInfo, PERF_CONTEXT_KERNEL, PERF_CONTEXT_USER, Sample,
};

/// A register frame: all GPRs by perf index (IP, FLAGS, CS, SS and SP
/// included) and the mode of its CS (from the descriptor's L bit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InterruptFrame {
    /// The registers.
    pub regs: RegFile,
    /// 64-bit or compat code. For a runtime (ring 0) frame this is always
    /// [`CodeMode::Long64`].
    pub code: CodeMode,
}

impl InterruptFrame {
    /// Where the frame's code ran, from CS's RPL.
    pub fn cpumode(&self) -> CpuMode {
        CpuMode::from_cs(self.regs.get(Reg::Cs))
    }
}

/// The state of the current task's saved user frame when the NMI
/// interrupted the runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UserFrame<'a> {
    /// Entry code saved every user register: use them.
    Complete(&'a InterruptFrame),
    /// The NMI landed while the frame was being saved or restored.
    InWindow,
    /// No user task (idle, boot).
    NoTask,
}

/// Everything known about one overflow, in the by-value form (tests and
/// cold paths): [`capture`] turns it into the [`RawSample`] the NMI handler
/// would have queued, and [`build_sample`] expands that.
#[derive(Clone, Copy, Debug)]
pub struct SampleInput<'a> {
    /// The overflowing event.
    pub event: &'a EventConfig,
    /// The frame the NMI interrupted.
    pub interrupted: &'a InterruptFrame,
    /// The current task's saved user frame.
    pub user_frame: UserFrame<'a>,
    /// Time (ns).
    pub time: u64,
    /// CPU.
    pub cpu: u32,
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// The period this sample stands for.
    pub period: u64,
    /// A precise IP (PEBS eventing IP / fixed-up IP) replacing the frame's.
    pub precise_ip: Option<u64>,
    /// GPRs from a PEBS record, used for REGS_INTR (and for REGS_USER when
    /// the record was taken in user mode).
    pub pebs_regs: Option<&'a RegFile>,
    /// Walked runtime IPs, innermost first (the sample IP, then return
    /// addresses), as [`RawSample::chain`] holds them: no context markers.
    pub chain_kernel: &'a [u64],
    /// Walked user IPs, innermost first, after the runtime's.
    pub chain_user: &'a [u64],
    /// The branch stack, if read.
    pub branches: Option<&'a BranchStack>,
    /// Memory fields from PEBS.
    pub mem: Option<MemInfo>,
}

impl<'a> SampleInput<'a> {
    /// The common case: no PEBS data, callchain or branch stack.
    pub fn new(
        event: &'a EventConfig,
        interrupted: &'a InterruptFrame,
        user_frame: UserFrame<'a>,
        time: u64,
        cpu: u32,
        tid: u32,
        period: u64,
    ) -> Self {
        SampleInput {
            event,
            interrupted,
            user_frame,
            time,
            cpu,
            pid: tid,
            tid,
            period,
            precise_ip: None,
            pebs_regs: None,
            chain_kernel: &[],
            chain_user: &[],
            branches: None,
            mem: None,
        }
    }
}

impl SampleInput<'_> {
    /// True when the event excludes the interrupted mode (exclude_user /
    /// exclude_kernel): no sample is taken.
    pub fn excluded(&self) -> bool {
        excludes(self.event, self.interrupted.cpumode())
    }
}

/// True when `event` takes no sample of an NMI that interrupted `mode`
/// (exclude_user / exclude_kernel). Checked before a ring slot is claimed
/// (the runtime keeps the two bits where its NMI handler reads them), and
/// what it skips is counted, not queued.
pub fn excludes(event: &EventConfig, mode: CpuMode) -> bool {
    match mode {
        CpuMode::User => event.exclude_user,
        CpuMode::Kernel => event.exclude_kernel,
    }
}

/// Writes the registers of `file` under `mask` into `out` in place, with
/// the same result as [`RegsSample::from_file`]: contiguous runs of the mask
/// are copied as slices, XMM bits read 0, and a compat task's R8-R15 read 0.
/// Only the values in use are written; nothing is zeroed first.
pub fn fill_regs(out: &mut RegsSample, file: &RegFile, mask: u64, mode: CodeMode) {
    let mask = mask & VALID_MASK_WITH_XMM;
    out.abi = mode.abi();
    out.mask = mask;
    out.values.clear();
    if mask == crate::regs::GPR_MASK {
        // The common set: two fixed runs, AX..SS and R8..R15.
        let _ = out.values.extend_from_slice(&file.0[..12]);
        if mode == CodeMode::Compat32 {
            let _ = out.values.extend_from_slice(&[0; 8]);
        } else {
            let _ = out.values.extend_from_slice(&file.0[16..]);
        }
        return;
    }
    let mut m = mask;
    while m != 0 {
        let start = m.trailing_zeros() as usize;
        // `m >> start` has bit 0 set, so the run is at least 1 long and
        // ends at or below bit 64.
        let end = start + (!(m >> start)).trailing_zeros() as usize;
        let in_file = end.min(NUM_GPR_SLOTS);
        if start < in_file {
            // Cannot fail: at most 56 bits of VALID_MASK_WITH_XMM are set.
            let _ = out.values.extend_from_slice(&file.0[start..in_file]);
        }
        for _ in start.max(in_file)..end {
            let _ = out.values.push(0);
        }
        m = if end >= 64 { 0 } else { m & (u64::MAX << end) };
    }
    if mode == CodeMode::Compat32 {
        let first = (mask & ((1 << Reg::R8.index()) - 1)).count_ones() as usize;
        let n = (mask & R8_R15_MASK).count_ones() as usize;
        out.values[first..first + n].fill(0);
    }
}

/// Sets `out` to ABI_NONE with `mask`, in place.
fn set_regs_none(out: &mut RegsSample, mask: u64) {
    out.abi = crate::regs::Abi::None;
    out.mask = mask;
    out.values.clear();
}

/// The register frame the runtime's entry stubs save, word for word, lowest
/// address first (the layout of the runtime's trap frame, which asserts it):
/// what the NMI handler copies into a [`RawSample`] with one plain word
/// copy. [`RawFrame::to_regfile`] puts it in perf order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct RawFrame {
    pub r15: u64,
    pub r14: u64,
    pub r13: u64,
    pub r12: u64,
    pub r11: u64,
    pub r10: u64,
    pub r9: u64,
    pub r8: u64,
    pub rbp: u64,
    pub rdi: u64,
    pub rsi: u64,
    pub rdx: u64,
    pub rcx: u64,
    pub rbx: u64,
    pub rax: u64,
    /// Vector number (not sampled).
    pub vector: u64,
    /// Error code (not sampled).
    pub error_code: u64,
    pub rip: u64,
    pub cs: u64,
    pub rflags: u64,
    pub rsp: u64,
    pub ss: u64,
}

impl RawFrame {
    /// All zero.
    pub const ZERO: RawFrame = RawFrame {
        r15: 0,
        r14: 0,
        r13: 0,
        r12: 0,
        r11: 0,
        r10: 0,
        r9: 0,
        r8: 0,
        rbp: 0,
        rdi: 0,
        rsi: 0,
        rdx: 0,
        rcx: 0,
        rbx: 0,
        rax: 0,
        vector: 0,
        error_code: 0,
        rip: 0,
        cs: 0,
        rflags: 0,
        rsp: 0,
        ss: 0,
    };

    /// [`fill_regs`] of [`to_regfile`](Self::to_regfile), with the
    /// common set (the GPRs without DS..GS) written straight from the
    /// frame.
    #[inline(always)]
    pub fn fill_regs(&self, out: &mut RegsSample, mask: u64, mode: CodeMode) {
        if mask & VALID_MASK_WITH_XMM != GPR_MASK {
            return fill_regs(out, &self.to_regfile(), mask, mode);
        }
        let high = if mode == CodeMode::Compat32 {
            [0; 8]
        } else {
            self.high()
        };
        out.abi = mode.abi();
        out.mask = GPR_MASK;
        out.values.clear();
        // Cannot fail: 20 values, within the capacity.
        let _ = out.values.extend_from_slice(&self.low());
        let _ = out.values.extend_from_slice(&high);
    }

    /// AX..SS in perf order (perf's registers 0 to 11).
    #[inline(always)]
    fn low(&self) -> [u64; 12] {
        [
            self.rax,
            self.rbx,
            self.rcx,
            self.rdx,
            self.rsi,
            self.rdi,
            self.rbp,
            self.rsp,
            self.rip,
            self.rflags,
            self.cs,
            self.ss,
        ]
    }

    /// R8..R15 (perf's registers 16 to 23).
    #[inline(always)]
    fn high(&self) -> [u64; 8] {
        [
            self.r8, self.r9, self.r10, self.r11, self.r12, self.r13, self.r14, self.r15,
        ]
    }

    /// The registers in perf order (DS..GS, never sampled on x86-64, read 0).
    pub fn to_regfile(&self) -> RegFile {
        let mut file = [0; 24];
        file[..12].copy_from_slice(&self.low());
        file[16..].copy_from_slice(&self.high());
        RegFile(file)
    }

    /// The frame holding `file`'s registers (DS..GS dropped, vector and
    /// error code 0).
    pub fn from_regfile(file: &RegFile) -> Self {
        let r = |reg: Reg| file.get(reg);
        RawFrame {
            r15: r(Reg::R15),
            r14: r(Reg::R14),
            r13: r(Reg::R13),
            r12: r(Reg::R12),
            r11: r(Reg::R11),
            r10: r(Reg::R10),
            r9: r(Reg::R9),
            r8: r(Reg::R8),
            rbp: r(Reg::Bp),
            rdi: r(Reg::Di),
            rsi: r(Reg::Si),
            rdx: r(Reg::Dx),
            rcx: r(Reg::Cx),
            rbx: r(Reg::Bx),
            rax: r(Reg::Ax),
            vector: 0,
            error_code: 0,
            rip: r(Reg::Ip),
            cs: r(Reg::Cs),
            rflags: r(Reg::Flags),
            rsp: r(Reg::Sp),
            ss: r(Reg::Ss),
        }
    }
}

/// Where a user return address can point. The frame-pointer walk keeps
/// every return address it reads, as Linux's does; the expansion ends the
/// user chain at the first one outside this range, which no code can
/// occupy: the runtime maps nothing below Linux's default `mmap_min_addr`
/// (64 KiB) and nothing of a process in the upper half. Such a value is
/// a frame record the walk misread (start-up code that left a stale frame
/// pointer, a function without frame pointers holding a stack address in
/// RBP), not a frame.
pub const USER_CODE: core::ops::Range<u64> = 0x1_0000..0x0000_8000_0000_0000;
/// The lowest address of the upper half, where the runtime's code is: a
/// runtime return address below it ends the runtime part of the chain.
pub const KERNEL_CODE_START: u64 = 0xffff_8000_0000_0000;

/// The bits of [`RawSample::flags`].
pub mod raw_flags {
    /// The NMI interrupted the runtime (ring 0); otherwise user mode.
    pub const KERNEL: u32 = 1 << 0;
    /// With [`KERNEL`]: [`super::RawSample::user`] holds the current task's
    /// saved user frame, complete (outside any entry/exit window).
    pub const SAVED_USER: u32 = 1 << 1;
    /// The frame in [`super::RawSample::user`] is compat (32-bit) code.
    pub const USER_COMPAT: u32 = 1 << 2;
    /// The frame in [`super::RawSample::intr`] is compat (32-bit) code.
    pub const INTR_COMPAT: u32 = 1 << 3;
    /// [`super::PmuFields::pebs_regs`] holds a PEBS record's GPRs.
    pub const PEBS_REGS: u32 = 1 << 4;
    /// [`super::PmuFields::branches`] holds a branch stack.
    pub const BRANCHES: u32 = 1 << 5;
    /// [`super::PmuFields::mem`] holds PEBS memory fields.
    pub const MEM: u32 = 1 << 6;
    /// With [`KERNEL`], in return-to-user mode: [`super::RawSample::user`]
    /// holds the frame the task's next return to user mode restored
    /// (complete by construction), written by
    /// [`super::DeferredUserRegs::complete`].
    pub const RETURN_USER: u32 = 1 << 7;
    /// The shift of the sample's event index (its position in Hello's
    /// events: the counter that overflowed) in the flags; 0 for the only
    /// or first event, so the NMI clock's constant flags need no work.
    pub const EVENT_SHIFT: u32 = 24;
    /// The event index's bits (up to `wire::MAX_EVENTS` events).
    pub const EVENT_MASK: u32 = 0xFF << EVENT_SHIFT;
}

/// PMU data of a sample (PEBS GPRs, LBR stack, memory fields), valid as
/// [`RawSample::flags`] says. Only a PMU overflow writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PmuFields {
    /// GPRs from a PEBS record, perf order.
    pub pebs_regs: RegFile,
    /// The branch stack.
    pub branches: BranchStack,
    /// Memory fields.
    pub mem: MemInfo,
}

impl PmuFields {
    /// Empty.
    pub const EMPTY: PmuFields = PmuFields {
        pebs_regs: RegFile([0; NUM_GPR_SLOTS]),
        branches: BranchStack {
            hw_idx: 0,
            entries: heapless::Vec::new(),
        },
        mem: MemInfo {
            addr: 0,
            weight: 0,
            ins_lat: 0,
            data_src: 0,
        },
    };
}

/// What the NMI handler queues for one sample: header words, the walked
/// IPs and the raw register frames, copied as they are. The drain expands
/// it into the wire [`Sample`] with [`RawSample::expand_into`], which applies
/// every rule (module docs): register source, ABI, compat R8-R15, masks,
/// perf order, callchain markers and depth.
///
/// The producer writes the header words and `flags` always, and the rest
/// only as the event needs it:
/// - `user`: with REGS_USER or REGS_INTR, the interrupted frame when the NMI
///   hit user mode; with REGS_USER, the complete saved user frame when it
///   hit the runtime (and sets [`raw_flags::SAVED_USER`]);
/// - `intr`: with REGS_INTR, the interrupted frame when it hit the runtime;
/// - `chain`, `kernel_len`, `user_len`: with CALLCHAIN;
/// - `pmu`: as its flags say.
///
/// What it does not write keeps an older sample's values, which the
/// expansion never reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawSample {
    /// Time (ns).
    pub time: u64,
    /// The sample IP (the interrupted RIP, or a precise IP).
    pub ip: u64,
    /// The period this sample stands for.
    pub period: u64,
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// CPU.
    pub cpu: u32,
    /// [`raw_flags`].
    pub flags: u32,
    /// `chain[..kernel_len]` are runtime IPs, innermost first (the
    /// interrupted RIP, then return addresses).
    pub kernel_len: u8,
    /// `chain[kernel_len..kernel_len + user_len]` are user IPs, innermost
    /// first (the user RIP, then return addresses).
    pub user_len: u8,
    /// Walked IPs, without context markers.
    pub chain: [u64; MAX_CALLCHAIN],
    /// The user frame (see the type docs).
    pub user: RawFrame,
    /// The interrupted runtime frame (see the type docs).
    pub intr: RawFrame,
    /// PMU data.
    pub pmu: PmuFields,
}

impl Default for RawSample {
    fn default() -> Self {
        Self::EMPTY
    }
}

impl ConstDefault for RawSample {
    const EMPTY: Self = RawSample {
        time: 0,
        ip: 0,
        period: 0,
        pid: 0,
        tid: 0,
        cpu: 0,
        flags: 0,
        kernel_len: 0,
        user_len: 0,
        chain: [0; MAX_CALLCHAIN],
        user: RawFrame::ZERO,
        intr: RawFrame::ZERO,
        pmu: PmuFields::EMPTY,
    };
}

impl RawSample {
    /// The index of the sample's event (see [`raw_flags::EVENT_SHIFT`]).
    pub fn event_index(&self) -> usize {
        ((self.flags & raw_flags::EVENT_MASK) >> raw_flags::EVENT_SHIFT) as usize
    }

    /// Where the sampled IP ran.
    pub fn cpumode(&self) -> CpuMode {
        if self.flags & raw_flags::KERNEL != 0 {
            CpuMode::Kernel
        } else {
            CpuMode::User
        }
    }

    fn code(&self, bit: u32) -> CodeMode {
        if self.flags & bit != 0 {
            CodeMode::Compat32
        } else {
            CodeMode::Long64
        }
    }

    /// The expanded sample, by value (tests and cold paths).
    pub fn expand(&self, event: &EventConfig) -> Sample {
        let mut s = Sample::default();
        self.expand_into(event, &mut s);
        s
    }

    /// Expands the record into the wire sample for `event`, in place in `s`
    /// (a drain scratch sample holding an older one): every field is
    /// overwritten, only the parts in use are written. The rules:
    /// - REGS_USER, with the NMI in user mode: the interrupted frame (or the
    ///   PEBS GPRs) with that frame's ABI; in the runtime: the saved user
    ///   frame when it was complete and is a user frame, else ABI_NONE with
    ///   no values; in the runtime with [`UserRegsMode::AtReturnToUser`]:
    ///   the frame of the return to user mode once [`DeferredUserRegs`]
    ///   completed the record, else ABI_NONE;
    /// - REGS_INTR: the PEBS GPRs, else the interrupted frame;
    /// - both: the x86-64 mask layout always, compat code gives ABI_32 with
    ///   R8-R15 reading 0, XMM bits read 0 ([`fill_regs`]);
    /// - CALLCHAIN: the runtime IPs after `PERF_CONTEXT_KERNEL`, the user IPs
    ///   after `PERF_CONTEXT_USER`, capped at `max_stack` by
    ///   [`CallchainWriter`]'s rule (a prefix, never ending in a marker);
    /// - BRANCH_STACK and the memory fields: the PMU data, or empty.
    #[inline(always)]
    pub fn expand_into(&self, e: &EventConfig, s: &mut Sample) {
        let kernel = self.flags & raw_flags::KERNEL != 0;
        s.event = e.id;
        s.cpumode = self.cpumode();
        s.ip = self.ip;
        s.pid = self.pid;
        s.tid = self.tid;
        s.time = self.time;
        s.cpu = self.cpu;
        s.period = self.period;
        if e.has(st::CALLCHAIN) {
            let mut w = CallchainWriter::new(&mut s.callchain, e.max_stack);
            let k = usize::from(self.kernel_len).min(MAX_CALLCHAIN);
            let u = (k + usize::from(self.user_len)).min(MAX_CALLCHAIN);
            // The interrupted IP, then return addresses up to the first
            // that cannot be code of that half (see `USER_CODE`).
            let kernel = &self.chain[..k];
            w.extend(
                CpuMode::Kernel,
                &kernel[..code_run(kernel, |ip| ip >= KERNEL_CODE_START)],
            );
            let user = &self.chain[k..u];
            w.extend(
                CpuMode::User,
                &user[..code_run(user, |ip| USER_CODE.contains(&ip))],
            );
        } else {
            s.callchain.clear();
        }
        if e.has(st::BRANCH_STACK) {
            let b = s.branches.get_or_insert_with(BranchStack::default);
            b.entries.clear();
            if self.flags & raw_flags::BRANCHES != 0 {
                b.hw_idx = self.pmu.branches.hw_idx;
                // Cannot fail: same capacity.
                let _ = b.entries.extend_from_slice(&self.pmu.branches.entries);
            } else {
                b.hw_idx = 0;
            }
        } else {
            s.branches = None;
        }
        let pebs = (self.flags & raw_flags::PEBS_REGS != 0).then_some(&self.pmu.pebs_regs);
        // The interrupted frame and its code mode.
        let (intr, intr_code) = if kernel {
            (&self.intr, self.code(raw_flags::INTR_COMPAT))
        } else {
            (&self.user, self.code(raw_flags::USER_COMPAT))
        };
        if e.has(st::REGS_USER) {
            let r = s.regs_user.get_or_insert_with(RegsSample::default);
            let saved_ok = self.flags & raw_flags::SAVED_USER != 0
                && CpuMode::from_cs(self.user.cs) == CpuMode::User;
            if !kernel {
                match pebs {
                    Some(p) => fill_regs(r, p, e.regs_user, intr_code),
                    None => self.user.fill_regs(r, e.regs_user, intr_code),
                }
            } else if e.user_regs_mode == UserRegsMode::AtReturnToUser {
                // The registers of the return to user mode, once the store
                // completed the sample; ABI_NONE otherwise.
                let returned = self.flags & raw_flags::RETURN_USER != 0
                    && CpuMode::from_cs(self.user.cs) == CpuMode::User;
                if returned {
                    let code = self.code(raw_flags::USER_COMPAT);
                    self.user.fill_regs(r, e.regs_user, code);
                } else {
                    set_regs_none(r, e.regs_user);
                }
            } else if !saved_ok {
                // A "saved user frame" that is not a user frame is not
                // complete.
                set_regs_none(r, e.regs_user);
            } else {
                let code = self.code(raw_flags::USER_COMPAT);
                self.user.fill_regs(r, e.regs_user, code);
            }
        } else {
            s.regs_user = None;
        }
        if e.has(st::REGS_INTR) {
            let r = s.regs_intr.get_or_insert_with(RegsSample::default);
            match pebs {
                Some(p) => fill_regs(r, p, e.regs_intr, intr_code),
                None => intr.fill_regs(r, e.regs_intr, intr_code),
            }
        } else {
            s.regs_intr = None;
        }
        s.mem = if e.sample_type & (st::WEIGHT | st::WEIGHT_STRUCT | st::DATA_SRC | st::ADDR) != 0 {
            Some(if self.flags & raw_flags::MEM != 0 {
                self.pmu.mem
            } else {
                MemInfo::default()
            })
        } else {
            None
        };
    }
}

/// Fills `raw` the way the NMI handler does for one overflow described by
/// `input` (the by-value form of the runtime's capture: it copies frames and
/// IPs and decides nothing the expansion decides). Returns false, leaving
/// `raw` untouched, when [`SampleInput::excluded`].
pub fn capture(input: &SampleInput<'_>, raw: &mut RawSample) -> bool {
    if input.excluded() {
        return false;
    }
    let e = input.event;
    let frame = input.interrupted;
    let kernel = frame.cpumode() == CpuMode::Kernel;
    let compat = |f: &InterruptFrame, bit| {
        if f.code == CodeMode::Compat32 { bit } else { 0 }
    };
    raw.time = input.time;
    raw.ip = input.precise_ip.unwrap_or(frame.regs.get(Reg::Ip));
    raw.period = input.period;
    raw.pid = input.pid;
    raw.tid = input.tid;
    raw.cpu = input.cpu;
    let mut flags = 0;
    if kernel {
        flags |= raw_flags::KERNEL;
        if e.has(st::REGS_USER)
            && let UserFrame::Complete(u) = input.user_frame
        {
            raw.user = RawFrame::from_regfile(&u.regs);
            flags |= raw_flags::SAVED_USER | compat(u, raw_flags::USER_COMPAT);
        }
        if e.has(st::REGS_INTR) {
            raw.intr = RawFrame::from_regfile(&frame.regs);
            flags |= compat(frame, raw_flags::INTR_COMPAT);
        }
    } else if e.sample_type & (st::REGS_USER | st::REGS_INTR) != 0 {
        raw.user = RawFrame::from_regfile(&frame.regs);
        flags |= compat(frame, raw_flags::USER_COMPAT);
    }
    if e.has(st::CALLCHAIN) {
        let k = input.chain_kernel.len().min(MAX_CALLCHAIN);
        let u = input.chain_user.len().min(MAX_CALLCHAIN - k);
        raw.chain[..k].copy_from_slice(&input.chain_kernel[..k]);
        raw.chain[k..k + u].copy_from_slice(&input.chain_user[..u]);
        // At most MAX_CALLCHAIN (64) each.
        raw.kernel_len = k as u8;
        raw.user_len = u as u8;
    }
    if let Some(p) = input.pebs_regs {
        raw.pmu.pebs_regs = *p;
        flags |= raw_flags::PEBS_REGS;
    }
    if let Some(b) = input.branches {
        raw.pmu.branches.clone_from(b);
        flags |= raw_flags::BRANCHES;
    }
    if let Some(m) = input.mem {
        raw.pmu.mem = m;
        flags |= raw_flags::MEM;
    }
    raw.flags = flags;
    true
}

/// Builds the sample for one overflow. Returns `None` when the event
/// excludes the interrupted mode (exclude_user / exclude_kernel).
///
/// With [`UserRegsMode::AtReturnToUser`] and an NMI that interrupted the
/// runtime, the sample's user registers are ABI_NONE with the event's mask:
/// the NMI handler parks such records in [`DeferredUserRegs`] instead.
///
/// [`capture`] then [`RawSample::expand`]: the same path as the NMI handler
/// and the drain.
pub fn build_sample(input: &SampleInput<'_>) -> Option<Sample> {
    let mut s = Sample::default();
    build_sample_into(input, &mut s).then_some(s)
}

/// [`build_sample`] in place in `s` (holding an older sample): every field
/// is overwritten. Returns false, leaving `s` untouched, when
/// [`SampleInput::excluded`].
pub fn build_sample_into(input: &SampleInput<'_>, s: &mut Sample) -> bool {
    let mut raw = RawSample::EMPTY;
    if !capture(input, &mut raw) {
        return false;
    }
    raw.expand_into(input.event, s);
    true
}

/// True when a sample of `event` whose NMI interrupted the runtime
/// (`kernel`) waits in [`DeferredUserRegs`] for its user registers
/// (return-to-user mode).
pub fn needs_deferred_regs(event: &EventConfig, kernel: bool) -> bool {
    event.user_regs_mode == UserRegsMode::AtReturnToUser && event.has(st::REGS_USER) && kernel
}

/// Builds a callchain with perf's context markers: a marker is inserted
/// whenever the mode changes, the first entry being the sample IP.
#[derive(Clone, Debug, Default)]
pub struct CallchainBuilder {
    chain: heapless::Vec<u64, MAX_CALLCHAIN>,
    mode: Option<CpuMode>,
    truncated: bool,
}

impl CallchainBuilder {
    /// An empty chain.
    pub const fn new() -> Self {
        CallchainBuilder {
            chain: heapless::Vec::new(),
            mode: None,
            truncated: false,
        }
    }

    /// Appends a frame's return address (or the sample IP first).
    pub fn push(&mut self, mode: CpuMode, ip: u64) {
        if self.mode != Some(mode) {
            let marker = match mode {
                CpuMode::Kernel => PERF_CONTEXT_KERNEL,
                CpuMode::User => PERF_CONTEXT_USER,
            };
            if self.chain.len() + 2 > MAX_CALLCHAIN {
                self.truncated = true;
                return;
            }
            // Cannot fail: room checked above.
            let _ = self.chain.push(marker);
            self.mode = Some(mode);
        }
        if self.chain.push(ip).is_err() {
            self.truncated = true;
        }
    }

    /// True when frames did not fit.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// The entries.
    pub fn as_slice(&self) -> &[u64] {
        &self.chain
    }
}

/// How many of `ips` a callchain keeps: the first (the interrupted IP),
/// then return addresses up to the first that `code` refuses.
fn code_run(ips: &[u64], code: impl Fn(u64) -> bool) -> usize {
    match ips.split_first() {
        None => 0,
        Some((_, rest)) => 1 + rest.iter().position(|&ip| !code(ip)).unwrap_or(rest.len()),
    }
}

/// [`CallchainBuilder`]'s rules applied straight to a sample's callchain,
/// as [`RawSample::expand_into`] turns the walked IPs into the wire chain
/// (in place in the drain's scratch sample).
///
/// The chain is capped at `max_stack` (the event's `sample_max_stack`, at
/// most [`MAX_CALLCHAIN`]) while it is built: a context marker is only added
/// with room for an IP after it.
#[derive(Debug)]
pub struct CallchainWriter<'a> {
    chain: &'a mut heapless::Vec<u64, MAX_CALLCHAIN>,
    limit: usize,
    mode: Option<CpuMode>,
    truncated: bool,
}

impl<'a> CallchainWriter<'a> {
    /// Empties `chain` and writes into it, at most `max_stack` entries.
    pub fn new(chain: &'a mut heapless::Vec<u64, MAX_CALLCHAIN>, max_stack: u16) -> Self {
        chain.clear();
        CallchainWriter {
            chain,
            limit: usize::from(max_stack).min(MAX_CALLCHAIN),
            mode: None,
            truncated: false,
        }
    }

    /// Appends a frame's return address (or the sample IP first), with a
    /// context marker whenever the mode changes. Once a frame did not fit,
    /// later ones are dropped too: the chain stays a prefix of the stack.
    pub fn push(&mut self, mode: CpuMode, ip: u64) {
        self.extend(mode, core::slice::from_ref(&ip));
    }

    /// Appends frames of one mode, as [`push`](Self::push) of each in
    /// turn would, in one copy: a context marker first when the mode
    /// changes, and once a frame does not fit, no more.
    pub fn extend(&mut self, mode: CpuMode, ips: &[u64]) {
        if ips.is_empty() || self.truncated {
            return;
        }
        let marker = self.mode != Some(mode);
        let room = self
            .limit
            .saturating_sub(self.chain.len() + usize::from(marker));
        if room == 0 {
            self.truncated = true;
            return;
        }
        if marker {
            let marker = match mode {
                CpuMode::Kernel => PERF_CONTEXT_KERNEL,
                CpuMode::User => PERF_CONTEXT_USER,
            };
            // Cannot fail: `limit <= MAX_CALLCHAIN` and room checked above.
            let _ = self.chain.push(marker);
            self.mode = Some(mode);
        }
        let take = ips.len().min(room);
        // Cannot fail: `take <= room`.
        let _ = self.chain.extend_from_slice(&ips[..take]);
        self.truncated = take < ips.len();
    }

    /// True when frames did not fit.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// The entries so far.
    pub fn as_slice(&self) -> &[u64] {
        self.chain
    }
}

/// Per-CPU store of samples waiting for the user registers of the next
/// return to user mode, with the exit-window flag. It holds the NMI
/// handler's raw records ([`NmiRecord`]) and completes them into the
/// sample ring, so a parked sample costs the NMI path no more than a
/// queued one.
///
/// The NMI handler, for a sample that [`needs_deferred_regs`], calls
/// [`park_with`](Self::park_with) and, when it declines, queues the sample
/// in the ring as usual without a saved user frame (ABI_NONE).
///
/// The runtime's return-to-user path does, in order:
/// 1. [`enter_exit_window`](Self::enter_exit_window);
/// 2. [`complete`](Self::complete) with the task and the frame it will
///    restore;
/// 3. restore registers and `iretq`.
///
/// and its entry path calls [`leave_exit_window`](Self::leave_exit_window)
/// once the user frame is saved. Before the End counters are taken,
/// [`abandon`](Self::abandon) moves what is still parked into the ring, so
/// every parked sample is delivered or counted as lost by the ring.
#[derive(Debug)]
pub struct DeferredUserRegs<const P: usize> {
    /// Two stores: NMIs park into the active one; [`complete`](Self::complete)
    /// moves what it keeps into the other (always empty between calls) and
    /// makes that one active.
    stores: [FilledRing<NmiRecord, P>; 2],
    active: AtomicUsize,
    exit_window: AtomicBool,
}

impl<const P: usize> Default for DeferredUserRegs<P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const P: usize> DeferredUserRegs<P> {
    /// An empty store.
    pub const fn new() -> Self {
        DeferredUserRegs {
            stores: [Ring::new_filled(), Ring::new_filled()],
            active: AtomicUsize::new(0),
            exit_window: AtomicBool::new(false),
        }
    }

    fn parked(&self) -> &FilledRing<NmiRecord, P> {
        &self.stores[self.active.load(Ordering::Acquire) & 1]
    }

    /// NMI path: parks the sample `fill` writes (header words, runtime
    /// frame, callchain, PMU data; not the user frame). Returns false, without
    /// calling `fill`, when the sample must be queued now with ABI_NONE user
    /// registers: inside the exit window (parking would attach the
    /// registers of a later return), or when the store is full.
    // Out of line: only `uregs=return` runs it, and the common NMI path
    // stays short.
    #[inline(never)]
    pub fn park_with(&self, fill: &mut impl FnMut(&mut RawSample)) -> bool {
        if self.exit_window.load(Ordering::Acquire) {
            return false;
        }
        let store = self.parked();
        if store.push_with(|rec| fill(rec.sample_mut())) {
            return true;
        }
        // Full: the caller queues the sample itself, so nothing is lost here.
        let _ = store.take_lost();
        false
    }

    /// Return path, step 1: from here until `iretq`, NMIs do not park.
    pub fn enter_exit_window(&self) {
        self.exit_window.store(true, Ordering::Release);
    }

    /// Entry path: the user frame is saved again; NMIs may park.
    pub fn leave_exit_window(&self) {
        self.exit_window.store(false, Ordering::Release);
    }

    /// Whether the exit-window flag is up.
    pub fn in_exit_window(&self) -> bool {
        self.exit_window.load(Ordering::Acquire)
    }

    /// Samples parked now.
    pub fn len(&self) -> usize {
        self.parked().len()
    }

    /// True when nothing is parked.
    pub fn is_empty(&self) -> bool {
        self.parked().is_empty()
    }

    /// Return path, step 2: task `tid` returns to user mode with `frame`
    /// (complete: it is what the `iretq` restores; `compat` when it is
    /// 32-bit code). Every parked sample of `tid` gets that frame as its
    /// user registers ([`raw_flags::RETURN_USER`]) and goes to `ring`,
    /// which counts it as lost when full. The samples of other tasks (a
    /// thread that blocked in a system call) stay parked for their own
    /// return. Returns how many samples left the store.
    pub fn complete<const R: usize, const F: bool>(
        &self,
        tid: u32,
        frame: &RawFrame,
        compat: bool,
        ring: &Ring<NmiRecord, R, F>,
    ) -> usize {
        self.sort(ring, |t| {
            if t == tid {
                Some(Some((frame, compat)))
            } else {
                None
            }
        })
    }

    /// Task `tid` will never return to user mode (it ended): its parked
    /// samples go to `ring` with ABI_NONE user registers. Called inside
    /// the exit window (NMIs do not park meanwhile). Returns how many.
    pub fn release<const R: usize, const F: bool>(
        &self,
        tid: u32,
        ring: &Ring<NmiRecord, R, F>,
    ) -> usize {
        self.sort(ring, |t| if t == tid { Some(None) } else { None })
    }

    /// No task will return to user mode (the run ends): moves every parked
    /// sample to `ring` with ABI_NONE user registers. Returns how many.
    pub fn abandon<const R: usize, const F: bool>(&self, ring: &Ring<NmiRecord, R, F>) -> usize {
        self.sort(ring, |_| Some(None))
    }

    /// Moves every parked sample for which `verdict(tid)` says
    /// `Some(regs)` to `ring` (with `regs` as its user registers, or
    /// ABI_NONE), and keeps the others parked, in order, in the other
    /// store, which becomes the active one. Only outside NMI parking (the
    /// exit window, or the end of the run).
    fn sort<'f, const R: usize, const F: bool>(
        &self,
        ring: &Ring<NmiRecord, R, F>,
        verdict: impl Fn(u32) -> Option<Option<(&'f RawFrame, bool)>>,
    ) -> usize {
        let from = self.active.load(Ordering::Acquire) & 1;
        let (src, keep) = (&self.stores[from], &self.stores[from ^ 1]);
        let mut n = 0;
        let mut kept = false;
        while src
            .pop_with(|parked| match verdict(parked.sample_mut().tid) {
                Some(regs) => {
                    n += 1;
                    ring.push_with(|slot| {
                        slot.clone_from(parked);
                        let r = slot.sample_mut();
                        r.flags &= !(raw_flags::SAVED_USER
                            | raw_flags::RETURN_USER
                            | raw_flags::USER_COMPAT);
                        if let Some((frame, compat)) = regs {
                            r.user = *frame;
                            r.flags |= raw_flags::RETURN_USER;
                            if compat {
                                r.flags |= raw_flags::USER_COMPAT;
                            }
                        }
                    });
                }
                None => {
                    kept = true;
                    // Cannot fail: `keep` is empty and as large as `src`.
                    let _ = keep.push_with(|slot| slot.clone_from(parked));
                }
            })
            .is_some()
        {}
        if kept {
            self.active.store(from ^ 1, Ordering::Release);
        }
        n
    }
}

#[cfg(test)]
mod tests;
