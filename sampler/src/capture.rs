//! The NMI-path API: turns an interrupted context (plus the optional
//! callchain, branch stack and PEBS fields) into a [`Sample`] following the
//! `perf_sample_regs_user` rules, and implements the alternative mode that
//! takes user registers at the next return to user mode.
//!
//! # User-register rules ([`UserRegsMode::AtInterrupt`])
//! - The NMI interrupted user mode (CS RPL 3): the registers come from the
//!   interrupt frame, with the ABI of that CS's mode.
//! - It interrupted the runtime: they come from the task's saved user frame
//!   ([`UserFrame::Complete`]). Our entry code always saves every GPR, so
//!   all of them are exact (Linux reports BX and R12-R15 as -1 in an NMI).
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
//! When the NMI interrupted the runtime, the sample is parked in a
//! [`DeferredUserRegs`] store and completed with the frame that the return
//! path is about to restore, which is complete by construction. The return
//! path raises the *exit-window flag* before it drains the store and keeps
//! it up until the `iretq`; an NMI that lands while it is up gets ABI_NONE
//! at once instead of being parked, because parking it would attach the
//! registers of a later return to it (a bogus sample).
//!
//! # Use from the NMI handler
//! The sample is built in place in its ring slot ([`Ring::push_with`] and
//! [`build_sample_into`]): a `Sample` is a few KiB, and moving it by value
//! costs more than everything else the handler does.
//! ```
//! use sampler::capture::{build_sample_into, InterruptFrame, SampleInput, UserFrame};
//! use sampler::drain::NmiRecord;
//! use sampler::event::{EventConfig, sample_type};
//! use sampler::regs::{CodeMode, GPR_MASK, Reg, RegFile};
//! use sampler::ring::Ring;
//!
//! static RING: Ring<NmiRecord, 8> = Ring::new();
//! let mut event = EventConfig::cpu_clock(0, 4000);
//! event.sample_type |= sample_type::REGS_USER;
//! event.regs_user = GPR_MASK;
//! let frame = InterruptFrame {
//!     regs: RegFile::default().with(Reg::Ip, 0x40_1234).with(Reg::Cs, 0x2b),
//!     code: CodeMode::Long64,
//! };
//! let input = SampleInput::new(&event, &frame, UserFrame::NoTask, 1_000, 0, 7, 250_000);
//! if !input.excluded() {
//!     // Drops and counts when full.
//!     RING.push_with(|rec| {
//!         build_sample_into(&input, rec.sample_mut());
//!     });
//! }
//! let ip = RING.pop_with(|rec| match rec {
//!     NmiRecord::Sample(s) => s.ip,
//!     _ => 0,
//! });
//! assert_eq!(ip, Some(0x40_1234));
//! ```

use core::sync::atomic::{AtomicBool, Ordering};

use crate::event::{EventConfig, UserRegsMode, sample_type as st};
use crate::regs::{
    CodeMode, NUM_GPR_SLOTS, R8_R15_MASK, Reg, RegFile, RegsSample, VALID_MASK_WITH_XMM,
};
use crate::ring::Ring;
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

/// Everything the NMI handler knows about one overflow.
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
    /// A walked callchain (built with [`CallchainBuilder`]).
    pub callchain: &'a [u64],
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
            callchain: &[],
            branches: None,
            mem: None,
        }
    }
}

impl SampleInput<'_> {
    /// True when the event excludes the interrupted mode (exclude_user /
    /// exclude_kernel): no sample is taken. Check it before claiming a ring
    /// slot for [`build_sample_into`].
    pub fn excluded(&self) -> bool {
        let mode = self.interrupted.cpumode();
        (mode == CpuMode::User && self.event.exclude_user)
            || (mode == CpuMode::Kernel && self.event.exclude_kernel)
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

/// [`user_regs`] written into `out` in place.
pub fn user_regs_into(
    out: &mut RegsSample,
    mask: u64,
    interrupted: &InterruptFrame,
    pebs: Option<&RegFile>,
    user_frame: UserFrame<'_>,
) {
    if interrupted.cpumode() == CpuMode::User {
        let file = pebs.unwrap_or(&interrupted.regs);
        return fill_regs(out, file, mask, interrupted.code);
    }
    match user_frame {
        UserFrame::Complete(f) if f.cpumode() == CpuMode::User => {
            fill_regs(out, &f.regs, mask, f.code)
        }
        // A "saved user frame" that is not a user frame is not complete.
        UserFrame::Complete(_) | UserFrame::InWindow | UserFrame::NoTask => {
            set_regs_none(out, mask)
        }
    }
}

/// User registers per the rules in the module docs.
pub fn user_regs(
    mask: u64,
    interrupted: &InterruptFrame,
    pebs: Option<&RegFile>,
    user_frame: UserFrame<'_>,
) -> RegsSample {
    if interrupted.cpumode() == CpuMode::User {
        let file = pebs.unwrap_or(&interrupted.regs);
        return RegsSample::from_file(file, mask, interrupted.code);
    }
    match user_frame {
        UserFrame::Complete(f) if f.cpumode() == CpuMode::User => {
            RegsSample::from_file(&f.regs, mask, f.code)
        }
        // A "saved user frame" that is not a user frame is not complete.
        UserFrame::Complete(_) | UserFrame::InWindow | UserFrame::NoTask => RegsSample::none(mask),
    }
}

/// Builds the sample for one overflow. Returns `None` when the event
/// excludes the interrupted mode (exclude_user / exclude_kernel).
///
/// With [`UserRegsMode::AtReturnToUser`] and an NMI that interrupted the
/// runtime, the sample's user registers are a placeholder (ABI_NONE with the
/// event's mask); pass it to [`DeferredUserRegs::defer`].
///
/// A by-value wrapper around [`build_sample_into`]; the NMI handler should
/// build in place in its ring slot instead.
pub fn build_sample(input: &SampleInput<'_>) -> Option<Sample> {
    let mut s = Sample::default();
    build_sample_into(input, &mut s).then_some(s)
}

/// Builds the sample for one overflow in place in `s` (typically a ring
/// slot from [`Ring::push_with`], holding an older sample): every field is
/// overwritten, but only the parts in use are written (vector lengths set,
/// register values up to the mask's popcount, optional fields reused where
/// present), so nothing is zeroed or moved by value. Returns false, leaving
/// `s` untouched, when [`SampleInput::excluded`].
///
/// NMI-safe: bounded copies only.
pub fn build_sample_into(input: &SampleInput<'_>, s: &mut Sample) -> bool {
    if input.excluded() {
        return false;
    }
    let e = input.event;
    let frame = input.interrupted;
    let mode = frame.cpumode();
    s.event = e.id;
    s.cpumode = mode;
    s.ip = input.precise_ip.unwrap_or(frame.regs.get(Reg::Ip));
    s.pid = input.pid;
    s.tid = input.tid;
    s.time = input.time;
    s.cpu = input.cpu;
    s.period = input.period;
    s.callchain.clear();
    if e.has(st::CALLCHAIN) {
        let depth = usize::from(e.max_stack).min(MAX_CALLCHAIN);
        let chain = &input.callchain[..input.callchain.len().min(depth)];
        // Cannot fail: `depth <= MAX_CALLCHAIN`.
        let _ = s.callchain.extend_from_slice(chain);
    }
    if e.has(st::BRANCH_STACK) {
        let b = s.branches.get_or_insert_with(BranchStack::default);
        b.entries.clear();
        match input.branches {
            Some(src) => {
                b.hw_idx = src.hw_idx;
                // Cannot fail: same capacity.
                let _ = b.entries.extend_from_slice(&src.entries);
            }
            None => b.hw_idx = 0,
        }
    } else {
        s.branches = None;
    }
    if e.has(st::REGS_USER) {
        let r = s.regs_user.get_or_insert_with(RegsSample::default);
        if e.user_regs_mode == UserRegsMode::AtReturnToUser && mode == CpuMode::Kernel {
            set_regs_none(r, e.regs_user);
        } else {
            user_regs_into(r, e.regs_user, frame, input.pebs_regs, input.user_frame);
        }
    } else {
        s.regs_user = None;
    }
    if e.has(st::REGS_INTR) {
        let file = input.pebs_regs.unwrap_or(&frame.regs);
        let r = s.regs_intr.get_or_insert_with(RegsSample::default);
        fill_regs(r, file, e.regs_intr, frame.code);
    } else {
        s.regs_intr = None;
    }
    s.mem = if e.sample_type & (st::WEIGHT | st::WEIGHT_STRUCT | st::DATA_SRC | st::ADDR) != 0 {
        Some(input.mem.unwrap_or_default())
    } else {
        None
    };
    true
}

/// True when `s` must go through [`DeferredUserRegs`] (return-to-user mode
/// and the NMI interrupted the runtime).
pub fn needs_deferred_regs(event: &EventConfig, s: &Sample) -> bool {
    event.user_regs_mode == UserRegsMode::AtReturnToUser
        && event.has(st::REGS_USER)
        && s.cpumode == CpuMode::Kernel
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

/// [`CallchainBuilder`]'s rules applied straight to a sample's callchain
/// (a ring slot's, after [`build_sample_into`] with an empty
/// [`SampleInput::callchain`]), so the NMI handler walks frames into the
/// slot instead of into a stack buffer that is then copied.
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
        let need = if self.mode == Some(mode) { 1 } else { 2 };
        if self.truncated || self.chain.len() + need > self.limit {
            self.truncated = true;
            return;
        }
        if need == 2 {
            let marker = match mode {
                CpuMode::Kernel => PERF_CONTEXT_KERNEL,
                CpuMode::User => PERF_CONTEXT_USER,
            };
            // Cannot fail: `limit <= MAX_CALLCHAIN` and room checked above.
            let _ = self.chain.push(marker);
            self.mode = Some(mode);
        }
        let _ = self.chain.push(ip);
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

/// What [`DeferredUserRegs::defer`] did with a sample.
// The sample is large but is moved, never boxed, in NMI context.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, PartialEq, Eq)]
pub enum Deferred {
    /// Parked until the next return to user mode.
    Pending,
    /// The NMI landed in the exit window: here is the sample with ABI_NONE
    /// user registers, push it now.
    Ready(Sample),
    /// The pending store was full: dropped and counted
    /// ([`DeferredUserRegs::take_lost`]).
    Lost,
}

/// Per-CPU store of samples waiting for the user registers of the next
/// return to user mode, with the exit-window flag.
///
/// The runtime's return-to-user path does, in order:
/// 1. [`enter_exit_window`](Self::enter_exit_window);
/// 2. [`complete`](Self::complete) with the frame it will restore;
/// 3. restore registers and `iretq`.
///
/// and its entry path calls [`leave_exit_window`](Self::leave_exit_window)
/// once the user frame is saved.
#[derive(Debug)]
pub struct DeferredUserRegs<const P: usize> {
    pending: Ring<Sample, P>,
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
            pending: Ring::new(),
            exit_window: AtomicBool::new(false),
        }
    }

    /// NMI path: parks `sample` (see [`Deferred`]).
    pub fn defer(&self, mut sample: Sample) -> Deferred {
        if self.exit_window.load(Ordering::Acquire) {
            if let Some(r) = &mut sample.regs_user {
                *r = RegsSample::none(r.mask);
            }
            return Deferred::Ready(sample);
        }
        if self.pending.push(sample) {
            Deferred::Pending
        } else {
            Deferred::Lost
        }
    }

    /// Return path, step 1: from here until `iretq`, NMIs do not park.
    pub fn enter_exit_window(&self) {
        self.exit_window.store(true, Ordering::Release);
    }

    /// Entry path: the user frame is saved again; NMIs may park.
    pub fn leave_exit_window(&self) {
        self.exit_window.store(false, Ordering::Release);
    }

    /// Return path, step 2: gives every parked sample the registers of
    /// `frame` (the complete user frame about to be restored) and hands it
    /// to `out`. Returns how many were completed.
    pub fn complete(&self, frame: &InterruptFrame, mut out: impl FnMut(Sample)) -> usize {
        let mut n = 0;
        while let Some(mut s) = self.pending.pop() {
            if let Some(r) = &mut s.regs_user {
                *r = RegsSample::from_file(&frame.regs, r.mask, frame.code);
            }
            out(s);
            n += 1;
        }
        n
    }

    /// The task will not return to user mode (it exited): hands parked
    /// samples to `out` with ABI_NONE user registers.
    pub fn abandon(&self, mut out: impl FnMut(Sample)) -> usize {
        let mut n = 0;
        while let Some(mut s) = self.pending.pop() {
            if let Some(r) = &mut s.regs_user {
                *r = RegsSample::none(r.mask);
            }
            out(s);
            n += 1;
        }
        n
    }

    /// Samples dropped because the store was full, since the last call.
    pub fn take_lost(&self) -> u64 {
        self.pending.take_lost()
    }
}

#[cfg(test)]
mod tests;
