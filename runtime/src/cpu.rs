//! Taking ownership of the CPU: GDT with TSS and IST stacks, the IDT, the
//! SYSCALL MSRs, and the protection features (NX, SMEP, SMAP, WP).

use crate::entry;
use arch_x86::cpu::{self, Features};
use arch_x86::frame::TrapFrame;
use arch_x86::gdt::{self, GDT_ENTRIES, TaskStateSegment};
use arch_x86::idt::{Idt, IdtEntry};
use core::cell::UnsafeCell;
use core::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
use sampler::walk::WalkRange;

/// Bytes of each IST stack (NMI, double fault, machine check).
pub const IST_STACK_SIZE: usize = 32 * 1024;

#[repr(C, align(16))]
struct Stack<const N: usize>(UnsafeCell<[u8; N]>);

// SAFETY: the stacks are only used by the CPU through the TSS; Rust code
// never forms references to their contents.
unsafe impl<const N: usize> Sync for Stack<N> {}

impl<const N: usize> Stack<N> {
    const fn new() -> Self {
        Self(UnsafeCell::new([0; N]))
    }
    fn base(&self) -> u64 {
        self.0.get() as u64
    }
}

/// One CPU's descriptor tables: its TSS (kernel stack for entries from
/// ring 3, IST stacks) and its GDT (which names that TSS, and holds the TLS
/// slots of the process it runs). The IDT is the same for every CPU.
#[repr(C, align(16))]
pub struct CpuTables {
    tss: UnsafeCell<TaskStateSegment>,
    gdt: UnsafeCell<[u64; GDT_ENTRIES]>,
}

impl CpuTables {
    /// Tables whose TSS has these IST stack tops (NMI, double fault,
    /// machine check); the GDT is built when the CPU loads them.
    pub const fn new() -> Self {
        Self {
            tss: UnsafeCell::new(TaskStateSegment::new()),
            gdt: UnsafeCell::new([0; GDT_ENTRIES]),
        }
    }
}

// tests/tests/isolation.rs finds the boot CPU's GDT 104 bytes into its
// tables, right after the TSS.
const _: () = assert!(core::mem::offset_of!(CpuTables, gdt) == 104);

impl Default for CpuTables {
    fn default() -> Self {
        Self::new()
    }
}

/// What each CPU keeps for itself, reached through its GS base while the
/// runtime runs (the entry stubs swap GS on every entry from and exit to
/// ring 3). The entry stubs read and write the first fields by offset
/// ([`LOCAL_KSTACK_TOP`] and the others); never used from NMI context,
/// where GS may be the interrupted process's.
#[repr(C)]
pub struct CpuLocal {
    /// This block's own address (`gs:[0]`).
    this: AtomicPtr<CpuLocal>,
    /// Top of the running task's kernel stack: the SYSCALL entry's stack.
    kstack_top: AtomicU64,
    /// The scheduler's stack pointer while a task runs.
    resume_rsp: AtomicU64,
    /// The user RSP at SYSCALL, for the two instructions before it is pushed.
    scratch_rsp: AtomicU64,
    /// The CPU's number: 0 for the boot CPU, then in start-up order.
    pub index: u32,
    /// The CPU's APIC ID, where IPIs to it go: as the MADT listed it, and
    /// the boot CPU's as its local APIC gave it when the other CPUs were
    /// started (see [`CpuLocal::apic_id`]).
    apic_id: AtomicU32,
    /// Its tables.
    tables: &'static CpuTables,
    /// Set by the CPU once it runs on its own tables (for the starter).
    pub online: AtomicBool,
    /// The APIC ID the CPU read from its own local APIC once up.
    pub apic_id_seen: AtomicU32,
    /// What the CPU found of its loaded tables once up ([`loaded_checks`]).
    pub checks: AtomicU32,
    /// The task running on this CPU, whose saved user frame ends its
    /// kernel stack, or [`NO_TASK`].
    pub current_task: AtomicU8,
    /// Where the NMI's frame-pointer walk may read the stack of the
    /// process running here, 64-bit words. Set while no task is current
    /// here, so no NMI walks with a half-updated range.
    pub user_walk: WalkRange,
    /// The compat (4-byte word) twin of `user_walk`.
    pub compat_walk: WalkRange,
    /// The sampling layer's state of this CPU (its ring, its throttle),
    /// set before the CPU can take an NMI ([`set_prepare`]; the boot
    /// CPU's when sampling is configured, before the IDT is loaded).
    pub sampling: SetOnce<()>,
    /// The PMU layer's state of this CPU (its driver, PEBS buffer and DS
    /// area), set before the CPU starts when the PMU samples (the boot
    /// CPU's is a static).
    pub pmu: SetOnce<()>,
    /// The page-table root this CPU has in CR3 (0: not yet told).
    pub active_root: AtomicU64,
    /// A TLB shootdown asked of this CPU ([`FLUSH_RELOAD`],
    /// [`FLUSH_LEAVE`]; 0: none), cleared when done.
    pub flush_req: AtomicU64,
}

/// A pointer written once, before anything reads it (before the CPU it
/// belongs to starts or takes an NMI), and read as plain memory after, so
/// the NMI path may load it as often as it likes.
pub struct SetOnce<T>(UnsafeCell<*const T>);

impl<T> SetOnce<T> {
    const fn new() -> Self {
        Self(UnsafeCell::new(core::ptr::null()))
    }

    /// The pointer.
    #[inline(always)]
    pub fn get(&self) -> *const T {
        // SAFETY: written only by `set`, before any reader (its contract).
        unsafe { *self.0.get() }
    }

    /// Sets the pointer.
    ///
    /// # Safety
    /// 1. Nothing reads it yet: the CPU this block is for has not started
    ///    and takes no NMI, or (the boot CPU) its IDT is not loaded.
    pub unsafe fn set(&self, p: *const T) {
        // SAFETY: obligation 1: no reader overlaps this write.
        unsafe { *self.0.get() = p };
    }
}

impl core::fmt::Debug for CpuLocal {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CpuLocal")
            .field("index", &self.index)
            .field("apic_id", &self.apic_id())
            .finish_non_exhaustive()
    }
}

/// [`CpuLocal::current_task`] when no task runs on the CPU.
pub const NO_TASK: u8 = 0xff;

/// Bytes reserved at the top of each CPU's NMI stack for its block's
/// address ([`nmi_cpu`]); 16 keeps the stack top 16-byte aligned.
const NMI_STACK_TAG: u64 = 16;

/// Offset of [`CpuLocal`]'s kernel-stack top (the entry stubs' `gs:` operand).
pub const LOCAL_KSTACK_TOP: usize = core::mem::offset_of!(CpuLocal, kstack_top);
/// Offset of [`CpuLocal`]'s scheduler stack pointer.
pub const LOCAL_RESUME_RSP: usize = core::mem::offset_of!(CpuLocal, resume_rsp);
/// Offset of [`CpuLocal`]'s SYSCALL scratch slot.
pub const LOCAL_SCRATCH_RSP: usize = core::mem::offset_of!(CpuLocal, scratch_rsp);

impl CpuLocal {
    /// The block of CPU `index` with APIC ID `apic_id`, using `tables`.
    pub const fn new(index: u32, apic_id: u32, tables: &'static CpuTables) -> Self {
        Self {
            this: AtomicPtr::new(core::ptr::null_mut()),
            kstack_top: AtomicU64::new(0),
            resume_rsp: AtomicU64::new(0),
            scratch_rsp: AtomicU64::new(0),
            index,
            apic_id: AtomicU32::new(apic_id),
            tables,
            online: AtomicBool::new(false),
            apic_id_seen: AtomicU32::new(u32::MAX),
            checks: AtomicU32::new(0),
            current_task: AtomicU8::new(NO_TASK),
            user_walk: WalkRange::new(),
            compat_walk: WalkRange::new(),
            sampling: SetOnce::new(),
            pmu: SetOnce::new(),
            active_root: AtomicU64::new(0),
            flush_req: AtomicU64::new(0),
        }
    }

    /// The CPU's APIC ID. The boot CPU's block is a static made before
    /// anything was read: its ID is 0 until [`CpuLocal::set_apic_id`] gives
    /// it the one its local APIC reports (an IPI to ID 0 would reach
    /// another CPU, or none, where the boot CPU's is not 0).
    pub fn apic_id(&self) -> u32 {
        self.apic_id.load(Ordering::Relaxed)
    }

    /// Records the CPU's APIC ID (the boot CPU's, once read).
    pub fn set_apic_id(&self, id: u32) {
        self.apic_id.store(id, Ordering::Relaxed);
    }

    /// The TSS's base (for the self-test).
    pub fn tss_base(&self) -> u64 {
        self.tables.tss.get() as u64
    }

    /// The GDT's base (for the self-test).
    pub fn gdt_base(&self) -> u64 {
        self.tables.gdt.get() as u64
    }

    /// Top of the kernel stack of the task running here (its saved user
    /// frame ends there).
    #[inline(always)]
    pub fn kstack_top(&self) -> u64 {
        self.kstack_top.load(Ordering::Relaxed)
    }

    /// A copy of the TSS's IST stack tops (for the self-test).
    pub fn ist_tops(&self) -> [u64; 7] {
        // SAFETY: the IST slots are written before the CPU loads its
        // tables and never after.
        unsafe { core::ptr::read_volatile(&raw const (*self.tables.tss.get()).ist) }
    }
}

// SAFETY: the plain fields are written before the block is published (to
// the CPU through GS, to others through the starter); the rest are atomics,
// and the tables are written only by their own CPU (see `CpuTables`).
unsafe impl Sync for CpuLocal {}
// SAFETY: as for `CpuLocal`: each CPU writes only its own tables, with
// interrupts off, and never from NMI context.
unsafe impl Sync for CpuTables {}

/// The IDT, shared by every CPU, written only during `init`.
#[repr(C, align(16))]
struct SharedIdt(UnsafeCell<Idt>);

// SAFETY: written once in `init`, before any CPU loads it; read-only after.
unsafe impl Sync for SharedIdt {}

static NMI_STACK: Stack<IST_STACK_SIZE> = Stack::new();
static DF_STACK: Stack<IST_STACK_SIZE> = Stack::new();
static MC_STACK: Stack<IST_STACK_SIZE> = Stack::new();

static BSP_TABLES: CpuTables = CpuTables::new();
static BSP_LOCAL: CpuLocal = CpuLocal {
    // The boot CPU's block names itself from the start: `early_gs` points
    // GS at it before anything else runs.
    this: AtomicPtr::new((&raw const BSP_LOCAL).cast_mut()),
    ..CpuLocal::new(0, 0, &BSP_TABLES)
};
static IDT: SharedIdt = SharedIdt(UnsafeCell::new(Idt::new()));

static SMAP_ON: AtomicBool = AtomicBool::new(false);

/// This CPU's block.
///
/// Only in the runtime's own context after [`init`] (or [`init_ap`]): not
/// in NMI context, where GS may still be the interrupted process's.
#[inline(always)]
pub fn this() -> &'static CpuLocal {
    let p: *const CpuLocal;
    // SAFETY: after `init`/`init_ap` the GS base is this CPU's block
    // whenever the runtime runs outside the entry windows (the stubs swap
    // it on every ring change), and `gs:[0]` holds the block's address.
    unsafe {
        core::arch::asm!("mov {}, gs:[0]", out(reg) p, options(nostack, readonly, preserves_flags));
        &*p
    }
}

/// The block of the CPU that took the NMI whose frame is `frame`: each
/// CPU's NMI stack ends with its block's address, right above the frame
/// the CPU and the NMI stub push there (NMIs do not nest). For NMI
/// context, where GS may be the interrupted process's.
///
/// `frame` must be the frame the NMI stub passed to the NMI upcall.
#[inline(always)]
pub fn nmi_cpu(frame: &TrapFrame) -> &'static CpuLocal {
    // SAFETY: the NMI frame lies at the top of this CPU's NMI IST stack,
    // just below the word `init_ap` wrote with the block's address
    // (the callers pass the NMI upcall's frame); blocks live forever.
    unsafe { &**(core::ptr::from_ref(frame).add(1) as *const *const CpuLocal) }
}

/// What runs for a CPU's block before the CPU starts, as a
/// `fn(&'static CpuLocal) -> bool` (0: nothing).
static PREPARE: AtomicUsize = AtomicUsize::new(0);

/// Sets what runs for each CPU's block before the CPU starts (the sampling
/// layer gives it its state); false keeps that CPU from starting.
pub fn set_prepare(f: fn(&'static CpuLocal) -> bool) {
    PREPARE.store(f as usize, Ordering::Release);
}

/// Runs the [`set_prepare`] function for `local`; true when there is none.
pub fn prepare(local: &'static CpuLocal) -> bool {
    match PREPARE.load(Ordering::Acquire) {
        0 => true,
        f => {
            // SAFETY: a non-zero PREPARE holds the fn pointer `set_prepare` stored.
            let f: fn(&'static CpuLocal) -> bool = unsafe { core::mem::transmute(f) };
            f(local)
        }
    }
}

/// The boot CPU's block.
pub fn boot_cpu() -> &'static CpuLocal {
    &BSP_LOCAL
}

/// Points the boot CPU's GS at its block: the first thing the runtime
/// does, so that [`this`] (and the critical sections, which use it) work
/// from the first line of Rust on.
pub fn early_gs() {
    // SAFETY: IA32_GS_BASE exists on every x86-64 CPU; the block is a
    // static whose first field holds its own address.
    unsafe { x86::msr::wrmsr(x86::msr::IA32_GS_BASE, &raw const BSP_LOCAL as u64) };
}

/// The `critical-section` implementation for several CPUs: interrupts
/// off on this CPU, then one lock shared by all, which a CPU that already
/// holds it takes again (nested sections) without waiting.
///
/// NMI handlers never use a critical section: an NMI on the CPU that holds
/// the lock would enter it, and one elsewhere would wait in NMI context.
pub struct SmpCriticalSection;

/// The CPU holding the critical-section lock, as its index + 1; 0: free.
static CS_OWNER: AtomicU32 = AtomicU32::new(0);
/// How deep the holder is in nested sections (only the holder writes it).
static CS_DEPTH: AtomicU32 = AtomicU32::new(0);

// SAFETY: `acquire` returns only once this CPU holds the lock with
// interrupts off, so no other CPU and no interrupt handler of this CPU is
// inside a section until `release` gives the lock back (at the outermost
// level) and restores IF.
unsafe impl critical_section::Impl for SmpCriticalSection {
    unsafe fn acquire() -> critical_section::RawRestoreState {
        let flags: u64;
        // SAFETY: reading RFLAGS and clearing IF have no memory effects.
        unsafe { core::arch::asm!("pushfq", "pop {}", "cli", out(reg) flags) };
        enter(&CS_OWNER, &CS_DEPTH);
        flags & (1 << 9) != 0
    }

    unsafe fn release(was_enabled: critical_section::RawRestoreState) {
        if CS_DEPTH.fetch_sub(1, Ordering::Relaxed) == 1 {
            CS_OWNER.store(0, Ordering::Release);
        }
        if was_enabled {
            // SAFETY: IF was set when the matching `acquire` ran.
            unsafe { core::arch::asm!("sti", options(nomem, nostack)) };
        }
    }
}

/// The kernel lock, held by a CPU for as long as it runs the runtime's
/// code on behalf of anything (a trap, the scheduler), so that the runtime
/// above this layer runs on one CPU at a time while the programs run on
/// all of them. It is given up to run a program ([`kernel_release`] before
/// entering ring 3, taken again by the trap that comes back), to halt, and
/// around work that needs only critical sections (the stream's drain).
/// NMI handlers never take it. It is not the critical-section lock: a
/// critical section is short and may be entered without it (never the
/// other way round: no one waits for the kernel lock inside a section).
///
/// The CPU holding it, as its index + 1 (0: free), and how deep.
static KL_OWNER: AtomicU32 = AtomicU32::new(0);
static KL_DEPTH: AtomicU32 = AtomicU32::new(0);

/// Takes the kernel lock, with interrupts off (a trap gate clears IF; the
/// scheduler runs with it clear), or enters it once more when this CPU
/// holds it. While it waits, it keeps answering TLB shootdowns, which the
/// holder may be waiting for.
pub fn kernel_lock() {
    enter(&KL_OWNER, &KL_DEPTH);
}

/// Takes the lock `owner` (a CPU index + 1, 0: free) one level deeper
/// (`depth`) when this CPU holds it, else waits for it with interrupts off,
/// answering TLB shootdowns meanwhile (the holder may be waiting for one).
fn enter(owner: &AtomicU32, depth: &AtomicU32) {
    let me = this().index + 1;
    if owner.load(Ordering::Relaxed) == me {
        depth.fetch_add(1, Ordering::Relaxed);
        return;
    }
    while owner
        .compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        answer_shootdown();
        core::hint::spin_loop();
    }
    depth.store(1, Ordering::Relaxed);
}

/// Leaves one level of [`kernel_lock`]; the outermost gives the lock up.
pub fn kernel_unlock() {
    let me = this().index + 1;
    if KL_OWNER.load(Ordering::Relaxed) == me && KL_DEPTH.fetch_sub(1, Ordering::Relaxed) == 1 {
        KL_OWNER.store(0, Ordering::Release);
    }
}

/// Gives the kernel lock up entirely (before this CPU enters ring 3 or
/// halts); returns how deep it was held (0: not held), for
/// [`kernel_restore`].
pub fn kernel_release() -> u32 {
    let me = this().index + 1;
    if KL_OWNER.load(Ordering::Relaxed) != me {
        return 0;
    }
    let depth = KL_DEPTH.swap(0, Ordering::Relaxed);
    KL_OWNER.store(0, Ordering::Release);
    depth
}

/// After [`kernel_release`]: holds the lock again `depth` deep (0: not at
/// all), whether or not a trap on the way back took it meanwhile (the
/// trap that returns to the scheduler keeps the lock it took).
pub fn kernel_restore(depth: u32) {
    let me = this().index + 1;
    if depth == 0 {
        if KL_OWNER.load(Ordering::Relaxed) == me {
            KL_DEPTH.store(0, Ordering::Relaxed);
            KL_OWNER.store(0, Ordering::Release);
        }
        return;
    }
    if KL_OWNER.load(Ordering::Relaxed) != me {
        kernel_lock();
    }
    KL_DEPTH.store(depth, Ordering::Relaxed);
}

/// Every CPU's block once it loaded its tables, by index.
static BLOCKS: [AtomicPtr<CpuLocal>; arch_x86::madt::MAX_CPUS] =
    [const { AtomicPtr::new(core::ptr::null_mut()) }; arch_x86::madt::MAX_CPUS];

/// The IPI vector of a TLB shootdown.
pub const SHOOTDOWN_VECTOR: u8 = 0xf1;
/// [`CpuLocal::flush_req`]: reload CR3 (its page tables changed).
pub const FLUSH_RELOAD: u64 = 1;
/// [`CpuLocal::flush_req`]: move to the runtime's own root (the one in CR3
/// is about to be freed).
pub const FLUSH_LEAVE: u64 = 2;

/// Records that this CPU now has `root` in CR3 (the memory layer calls it
/// on every switch), so a shootdown for `root` reaches it.
pub fn set_active_root(root: u64) {
    this().active_root.store(root, Ordering::Release);
}

/// The runtime's own page-table root, where [`FLUSH_LEAVE`] moves a CPU.
static KERNEL_ROOT: AtomicU64 = AtomicU64::new(0);

/// Tells this layer the runtime's own root (for [`FLUSH_LEAVE`]).
pub fn set_kernel_root(root: u64) {
    KERNEL_ROOT.store(root, Ordering::Relaxed);
}

/// On this CPU, outside NMI context with interrupts off: does the TLB
/// shootdown asked of it, if one is (from the shootdown IPI, and from
/// every wait for a lock, where the IPI cannot come in).
pub fn answer_shootdown() {
    let me = this();
    let req = me.flush_req.load(Ordering::Acquire);
    if req == 0 {
        return;
    }
    let root = if req == FLUSH_LEAVE {
        KERNEL_ROOT.load(Ordering::Relaxed)
    } else {
        arch_x86::cpu::cr3()
    };
    // SAFETY: the runtime's root maps the kernel half as every process's
    // does, and reloading the current root changes no mapping, so the
    // code and data in use stay mapped.
    unsafe { arch_x86::cpu::write_cr3(root) };
    me.active_root.store(root, Ordering::Relaxed);
    me.flush_req.store(0, Ordering::Release);
}

/// Makes every other CPU that has `root` in CR3 flush its TLB (`req`
/// [`FLUSH_RELOAD`]) or leave the root for the runtime's own
/// ([`FLUSH_LEAVE`]), and waits until each has: after a change that
/// removes or narrows mappings of `root`, before the frames it freed can
/// be used again. A CPU answers from its shootdown IPI (in ring 3 or
/// halted) or from its wait for a lock (the caller holds the kernel lock).
pub fn shootdown(root: u64, req: u64) {
    let me = this().index;
    let mut asked = 0u64;
    // SAFETY: ring 0; the direct map covers the APIC window, uncached.
    let apic = unsafe { arch_x86::lapic::LocalApic::from_msr() };
    for (i, b) in BLOCKS.iter().enumerate() {
        let p = b.load(Ordering::Acquire);
        if p.is_null() || i as u32 == me {
            continue;
        }
        // SAFETY: blocks are registered once set up and live forever.
        let c = unsafe { &*p };
        if c.active_root.load(Ordering::Acquire) != root || !c.online.load(Ordering::Acquire) {
            continue;
        }
        c.flush_req.store(req, Ordering::Release);
        apic.send_ipi(c.apic_id(), arch_x86::lapic::icr_fixed(SHOOTDOWN_VECTOR));
        asked |= 1 << i;
    }
    for (i, b) in BLOCKS.iter().enumerate() {
        if asked & (1 << i) == 0 {
            continue;
        }
        // SAFETY: as above.
        let c = unsafe { &*b.load(Ordering::Acquire) };
        while c.flush_req.load(Ordering::Acquire) != 0 {
            core::hint::spin_loop();
        }
    }
}

/// The GDT this CPU runs on (for the self-test).
pub fn gdt_base() -> u64 {
    this().gdt_base()
}

/// The IDT as built (for the self-test).
pub fn idt_base() -> u64 {
    IDT.0.get() as u64
}

/// A copy of the IDT entry for `vector` (for the self-test).
pub fn idt_entry(vector: u8) -> IdtEntry {
    // SAFETY: the IDT is only written during `init`, before anyone reads it.
    unsafe { (*IDT.0.get()).entries[vector as usize] }
}

/// A copy of this CPU's GDT (for the self-test).
pub fn gdt_copy() -> [u64; GDT_ENTRIES] {
    // SAFETY: read of a table written once in `init_ap` (the CPU may
    // set the TSS busy bit; `set_tls_slot` writes TLS slots on this CPU
    // only, never concurrently with this read).
    unsafe { core::ptr::read_volatile(this().tables.gdt.get()) }
}

/// [`loaded_checks`]: GS reaches the CPU's own block.
pub const CHECK_GS: u32 = 1 << 0;
/// [`loaded_checks`]: GDTR is the CPU's own GDT.
pub const CHECK_GDT: u32 = 1 << 1;
/// [`loaded_checks`]: TR names a TSS descriptor whose base is the CPU's own TSS.
pub const CHECK_TSS: u32 = 1 << 2;
/// [`loaded_checks`]: IDTR is the shared IDT.
pub const CHECK_IDT: u32 = 1 << 3;
/// Every [`loaded_checks`] bit.
pub const CHECK_ALL: u32 = CHECK_GS | CHECK_GDT | CHECK_TSS | CHECK_IDT;

/// Which of the `CHECK_*` facts hold on this CPU for `local`, read from
/// the CPU itself (GS, GDTR, TR, IDTR).
pub fn loaded_checks(local: &CpuLocal) -> u32 {
    let mut c = 0;
    if core::ptr::eq(this(), local) {
        c |= CHECK_GS;
    }
    let g = cpu::sgdt();
    if { g.base } == local.gdt_base() {
        c |= CHECK_GDT;
    }
    if cpu::str() == gdt::TSS && gdt::tss_base(&gdt_copy()) == local.tss_base() {
        c |= CHECK_TSS;
    }
    let i = cpu::sidt();
    if { i.base } == idt_base() {
        c |= CHECK_IDT;
    }
    c
}

/// Builds the IDT, then loads the boot CPU's GDT/TSS and the IDT and
/// programs SYSCALL. Call once, early, on the boot CPU.
pub fn init() {
    // SAFETY: boot code, interrupts off, one CPU running. The IDT is a
    // static that lives forever, built completely before it is loaded.
    unsafe {
        let idt = &mut *IDT.0.get();
        for v in 0..=255u8 {
            let (ist, dpl) = match v {
                2 => (gdt::IST_NMI, 0),
                8 => (gdt::IST_DOUBLE_FAULT, 0),
                18 => (gdt::IST_MACHINE_CHECK, 0),
                3 | 4 | 0x80 => (0, 3),
                _ => (0, 0),
            };
            let handler = if v == 2 {
                entry::nmi_entry()
            } else {
                entry::isr_stub(v)
            };
            idt.entries[v as usize] = IdtEntry::interrupt_gate(handler, ist, dpl);
        }
    }
    let ist = [NMI_STACK.base(), DF_STACK.base(), MC_STACK.base()];
    // SAFETY: boot code with interrupts off, on the boot CPU, whose block,
    // tables and IST stacks are statics nothing loaded yet; the IDT is
    // built just above.
    unsafe { init_ap(&BSP_LOCAL, ist.map(|b| b + IST_STACK_SIZE as u64)) };
    // The boot CPU runs programs like the others: TLB shootdowns must
    // reach it (they skip a CPU that is not online yet).
    BSP_LOCAL.online.store(true, Ordering::Release);
}

/// Loads a CPU's tables (for the boot CPU, from [`init`]), its GS base and
/// the shared IDT, and programs its SYSCALL MSRs. `ist` are the tops of
/// its NMI, double-fault and machine-check stacks.
///
/// # Safety
/// 1. Runs on the CPU `local` describes, once, in ring 0 with interrupts
///    off, before it takes any interrupt or NMI.
/// 2. `local`'s tables are no other CPU's, and the `ist` stacks are this
///    CPU's alone, each [`IST_STACK_SIZE`] bytes below its top.
/// 3. [`init`] built the IDT (on the boot CPU, before this).
pub unsafe fn init_ap(local: &'static CpuLocal, ist: [u64; 3]) {
    // SAFETY: obligations 1 to 3: this CPU alone uses these tables,
    // interrupts are off, the tables live forever and the IDT is built.
    unsafe {
        local
            .this
            .store((local as *const CpuLocal).cast_mut(), Ordering::Relaxed);
        local.active_root.store(
            arch_x86::cpu::cr3() & arch_x86::paging::ADDR_MASK,
            Ordering::Relaxed,
        );
        if let Some(b) = BLOCKS.get(local.index as usize) {
            b.store((local as *const CpuLocal).cast_mut(), Ordering::Release);
        }
        let tss = &mut *local.tables.tss.get();
        // The NMI stack ends with the block's address (`nmi_cpu`).
        let nmi_top = ist[0] - NMI_STACK_TAG;
        (nmi_top as *mut u64).write(local as *const CpuLocal as u64);
        tss.ist[usize::from(gdt::IST_NMI) - 1] = nmi_top;
        tss.ist[usize::from(gdt::IST_DOUBLE_FAULT) - 1] = ist[1];
        tss.ist[usize::from(gdt::IST_MACHINE_CHECK) - 1] = ist[2];
        *local.tables.gdt.get() = gdt::build(local.tables.tss.get() as u64);
        gdt::load(local.tables.gdt.get());
        arch_x86::idt::load(IDT.0.get());

        use x86::msr::{
            IA32_EFER, IA32_FMASK, IA32_GS_BASE, IA32_KERNEL_GSBASE, IA32_LSTAR, IA32_STAR, rdmsr,
            wrmsr,
        };
        // After `gdt::load` (its null GS load may clear the base on AMD):
        // the runtime's GS is this block, the one the first exit to ring
        // 3 swaps in is empty.
        wrmsr(IA32_GS_BASE, local as *const CpuLocal as u64);
        wrmsr(IA32_KERNEL_GSBASE, 0);
        wrmsr(IA32_STAR, gdt::star());
        wrmsr(IA32_LSTAR, entry::syscall_entry());
        // Clear TF, IF, DF, NT and AC on SYSCALL.
        wrmsr(
            IA32_FMASK,
            (1 << 8) | (1 << 9) | (1 << 10) | (1 << 14) | (1 << 18),
        );
        wrmsr(IA32_EFER, rdmsr(IA32_EFER) | cpu::EFER_SCE);
    }
}

/// Turns on NX (EFER.NXE), SMEP and SMAP as CPUID allows; returns what is on.
/// Must run before page tables with NX bits are loaded.
pub fn enable_protection() -> Features {
    let f = cpu::features();
    // SAFETY: each bit is set only when CPUID reports the feature; the runtime
    // never executes user pages, and touches user memory only inside
    // `with_user_access`.
    unsafe {
        use x86::msr::{IA32_EFER, rdmsr, wrmsr};
        if f.nx {
            wrmsr(IA32_EFER, rdmsr(IA32_EFER) | cpu::EFER_NXE);
        }
        let mut cr4 = cpu::cr4();
        if f.smep {
            cr4 |= cpu::CR4_SMEP;
        }
        if f.smap {
            cr4 |= cpu::CR4_SMAP;
        }
        cpu::write_cr4(cr4);
    }
    SMAP_ON.store(f.smap, Ordering::Relaxed);
    enable_sse();
    f
}

/// True when SMAP is on.
pub fn smap_on() -> bool {
    SMAP_ON.load(Ordering::Relaxed)
}

/// Makes `top` the kernel stack of this CPU's entries from ring 3: the
/// TSS's rsp0 (interrupts, exceptions) and the SYSCALL entry's stack.
pub fn set_kernel_stack(top: u64) {
    let local = this();
    local.kstack_top.store(top, Ordering::Relaxed);
    // SAFETY: the TSS is this CPU's; the CPU reads rsp0 only on a
    // privilege change, which cannot happen while the runtime runs this
    // store.
    unsafe { core::ptr::write_volatile(&raw mut (*local.tables.tss.get()).rsp0, top) };
}

/// Runs `f` with supervisor access to user pages allowed (SMAP `stac`/`clac`).
/// Safe to use from NMI context (it only toggles RFLAGS.AC, which iret restores).
#[inline(always)]
pub fn with_user_access<R>(f: impl FnOnce() -> R) -> R {
    let smap = smap_on();
    if smap {
        // SAFETY: SMAP is on, so stac exists; clac follows below.
        unsafe { cpu::stac() };
    }
    let r = f();
    if smap {
        // SAFETY: SMAP is on.
        unsafe { cpu::clac() };
    }
    r
}

/// Clears RFLAGS.AC on kernel entry (a ring-3 task may have set it).
pub fn clear_ac() {
    if smap_on() {
        // SAFETY: SMAP is on, so clac exists.
        unsafe { cpu::clac() };
    }
}

/// A process's user segment state the runtime switches: the FS and GS
/// selectors it loaded (compat processes point GS at a TLS slot), its TLS
/// descriptors, and its FS base (64-bit processes, `arch_prctl`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserSegments {
    /// FS selector.
    pub fs: u16,
    /// GS selector.
    pub gs: u16,
    /// The three TLS descriptors (0 = empty).
    pub tls: [u64; gdt::TLS_SLOTS],
    /// FS base (64-bit processes).
    pub fs_base: u64,
}

/// Reads the FS and GS selectors the running process left loaded.
pub fn saved_selectors() -> (u16, u16) {
    let (fs, gs): (u16, u16);
    // SAFETY: reading segment registers has no side effects.
    unsafe {
        core::arch::asm!("mov {0:x}, fs", "mov {1:x}, gs", out(reg) fs, out(reg) gs,
            options(nomem, nostack, preserves_flags))
    };
    (fs, gs)
}

/// Reads the DS and ES selectors the running process left loaded (the
/// runtime never loads them after boot, so they are the process's).
pub fn data_selectors() -> (u16, u16) {
    let (ds, es): (u16, u16);
    // SAFETY: reading segment registers has no side effects.
    unsafe {
        core::arch::asm!("mov {0:x}, ds", "mov {1:x}, es", out(reg) ds, out(reg) es,
            options(nomem, nostack, preserves_flags))
    };
    (ds, es)
}

/// Loads the process's DS, ES, FS and GS (in that order) where they differ
/// from what is loaded, as Linux's ia32 sigreturn reloads them: a selector
/// that names no usable descriptor (see [`loadable`]) becomes the null
/// one, as Linux's fixup of a faulting segment load makes it. Only for
/// compat processes: an FS load resets the FS base.
pub fn reload_user_selectors(sel: [u16; 4], tls: &[u64; gdt::TLS_SLOTS]) {
    let [ds, es, fs, gs] = sel.map(|s| if loadable(s, tls) { s } else { 0 });
    let (cur_ds, cur_es) = data_selectors();
    let (cur_fs, cur_gs) = saved_selectors();
    // SAFETY: every selector is null or names a present ring-3 data
    // descriptor (checked above), so the loads cannot fault; the runtime
    // itself never uses DS, ES or FS in 64-bit mode (GS is loaded apart).
    unsafe {
        if ds != cur_ds {
            core::arch::asm!("mov ds, {0:x}", in(reg) ds, options(nomem, nostack, preserves_flags));
        }
        if es != cur_es {
            core::arch::asm!("mov es, {0:x}", in(reg) es, options(nomem, nostack, preserves_flags));
        }
        if fs != cur_fs {
            core::arch::asm!("mov fs, {0:x}", in(reg) fs, options(nomem, nostack, preserves_flags));
        }
    }
    if gs != cur_gs {
        load_user_gs(gs);
    }
}

/// Loads the process's GS selector while the runtime runs on its own GS
/// base: between two `swapgs`, so the descriptor's base lands where the
/// process's base waits until the exit to ring 3 swaps it in
/// (IA32_KERNEL_GSBASE), with interrupts off meanwhile. A null selector
/// gets a zero base (Intel keeps the old base on a null load, which would
/// hand one process another's).
///
/// `sel` must be null or name a present ring-3 data descriptor of this
/// CPU's GDT ([`loadable`]).
fn load_user_gs(sel: u16) {
    // SAFETY: the selector is loadable (the callers check it with
    // `loadable`), so the load cannot fault; IF is off between the two
    // swapgs (NMIs never use GS), and popfq restores it; the MSR exists on
    // every x86-64 CPU.
    unsafe {
        core::arch::asm!("pushfq", "cli", "swapgs", "mov gs, {0:x}", "swapgs", "popfq",
            in(reg) sel, options(nomem));
        if sel & !3 == 0 {
            x86::msr::wrmsr(x86::msr::IA32_KERNEL_GSBASE, 0);
        }
    }
}

/// Writes TLS slot `i`'s descriptor.
pub fn set_tls_slot(i: usize, descriptor: u64) {
    if i < gdt::TLS_SLOTS {
        // SAFETY: this CPU's GDT, interrupts off; the slot is a ring-3 data
        // or code descriptor (or empty) that no selector in use by the
        // runtime names, and the CPU reads it only when a selector is loaded.
        unsafe {
            core::ptr::write_volatile(
                &raw mut (*this().tables.gdt.get())[gdt::TLS_FIRST + i],
                descriptor,
            )
        };
    }
}

/// True when `sel` may be loaded into DS, ES, FS or GS for ring 3 without
/// faulting: the null selector, the user data selector, or a TLS slot whose
/// descriptor is a present data segment or readable code segment (an
/// execute-only code segment, which `set_thread_area` may install, would
/// fault the load in ring 0).
fn loadable(sel: u16, tls: &[u64; gdt::TLS_SLOTS]) -> bool {
    if sel & !3 == 0 {
        return true;
    }
    if sel == gdt::USER_DATA {
        return true;
    }
    (0..gdt::TLS_SLOTS).any(|i| {
        let d = tls[i];
        let present = d & (1 << 47) != 0;
        let segment = d & (1 << 44) != 0;
        let code = d & (1 << 43) != 0;
        let readable = d & (1 << 41) != 0;
        sel == gdt::tls_selector(i) && present && segment && (!code || readable)
    })
}

/// True when `sel`, a ring-3 SS the CPU accepted when it was loaded, may be
/// loaded again by `iretq`: any selector but a TLS slot's (the other GDT
/// entries never change), and a TLS slot's while its descriptor is a
/// present, writable data segment.
pub fn user_ss_loadable(sel: u16) -> bool {
    let Some(i) = (0..gdt::TLS_SLOTS).find(|&i| sel & !3 == gdt::tls_selector(i) & !3) else {
        return true;
    };
    // SAFETY: this CPU's GDT; the slot is read, not written, and only
    // `set_tls_slot` on this CPU writes it, never concurrently with this.
    let d = unsafe {
        core::ptr::read_volatile(&raw const (*this().tables.gdt.get())[gdt::TLS_FIRST + i])
    };
    let present = d & (1 << 47) != 0;
    let data = d & (1 << 44) != 0 && d & (1 << 43) == 0;
    let writable = d & (1 << 41) != 0;
    present && data && writable
}

/// Installs a process's segment state before it runs: its TLS slots, then
/// its FS/GS selectors (a selector that no longer names a usable
/// descriptor is replaced by the null one), then its FS base.
pub fn load_user_segments(s: &UserSegments) {
    for (i, &d) in s.tls.iter().enumerate() {
        set_tls_slot(i, d);
    }
    let fs = if loadable(s.fs, &s.tls) { s.fs } else { 0 };
    let gs = if loadable(s.gs, &s.tls) { s.gs } else { 0 };
    let fs_base = if s.fs_base < arch_x86::paging::USER_END {
        s.fs_base
    } else {
        0
    };
    load_user_gs(gs);
    // SAFETY: the selector is null or names a present ring-3 data
    // descriptor (checked above), so the load cannot fault; the runtime
    // itself never uses FS. The FS base is written after the FS load,
    // which would reset it; the MSR exists on every x86-64 CPU, and the
    // value is a canonical lower-half address (checked above).
    unsafe {
        core::arch::asm!("mov fs, {0:x}", in(reg) fs, options(nomem, nostack, preserves_flags));
        if fs_base != 0 || fs == 0 {
            x86::msr::wrmsr(x86::msr::IA32_FS_BASE, fs_base);
        }
    }
}

/// AT_HWCAP: CPUID.1:EDX, as Linux gives it on x86.
pub fn hwcap() -> u32 {
    core::arch::x86_64::__cpuid(1).edx
}

/// The x87/SSE register state of a process (the FXSAVE image). The runtime
/// itself never touches these registers (its target is soft-float), so
/// they are switched only between processes.
#[repr(C, align(16))]
pub struct FpuState(pub [u8; 512]);

impl FpuState {
    /// The state a new process starts with (as after FNINIT, MXCSR 0x1f80:
    /// all exceptions masked).
    pub fn initial() -> Self {
        let mut s = FpuState([0; 512]);
        s.0[0..2].copy_from_slice(&0x037fu16.to_le_bytes());
        s.0[24..28].copy_from_slice(&0x1f80u32.to_le_bytes());
        s
    }

    /// Saves the CPU's x87/SSE state here.
    pub fn save(&mut self) {
        // SAFETY: CR4.OSFXSR is set (`enable_sse`), the area is 512 bytes
        // and 16-byte aligned (the type's alignment).
        unsafe { core::arch::asm!("fxsave64 [{}]", in(reg) self.0.as_mut_ptr(), options(nostack)) };
    }

    /// Loads this state into the CPU.
    pub fn restore(&self) {
        // SAFETY: as in `save`; the image came from `initial` or `save`, so
        // its MXCSR has no reserved bit set.
        unsafe { core::arch::asm!("fxrstor64 [{}]", in(reg) self.0.as_ptr(), options(nostack)) };
    }
}

/// Lets ring 3 use x87 and SSE: CR0.MP set and EM clear, CR4.OSFXSR and
/// OSXMMEXCPT set (AVX stays off: CR4.OSXSAVE clear, so programs see no
/// OS support for it and do not use it).
pub fn enable_sse() {
    // SAFETY: every x86-64 CPU has SSE2; these bits only allow FXSAVE and
    // SSE instructions, and the runtime never executes any outside
    // `FpuState`.
    unsafe {
        let cr0 = cpu::cr0();
        core::arch::asm!("mov cr0, {}", in(reg) (cr0 & !(1u64 << 2)) | (1 << 1), options(nostack));
        cpu::write_cr4(cpu::cr4() | (1 << 9) | (1 << 10));
        core::arch::asm!("fninit", options(nostack, nomem));
    }
}
