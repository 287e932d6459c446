//! Processes: their table, address spaces, kernel stacks, saved user
//! frames, and the preemptive round-robin scheduler that runs them.
//!
//! A process runs until it enters the runtime with a request that leaves to
//! the scheduler (yield, exit, sleep), faults, or uses up its time slice
//! (the [`tick`]). Its saved user frame sits at the top of its kernel
//! stack, written by the entry stubs on every entry. The runtime itself is
//! not preemptible: it runs with interrupts off, and the tick only lands in
//! ring 3 or in the idle `hlt`.

pub mod tick;

use crate::entry;
use crate::mm::space::AddressSpace;
use arch_x86::frame::{Mode, TrapFrame};
use arch_x86::gdt;
use core::cell::{Cell, RefCell, UnsafeCell};
use core::sync::atomic::{AtomicU8, Ordering};
use critical_section::Mutex;
use sampler::walk::WalkRange;

/// Most tasks at once.
pub const MAX_TASKS: usize = 20;
const KSTACK_SIZE: usize = 32 * 1024;
const USTACK_SIZE: usize = 16 * 1024;
/// Value of [`CURRENT_TASK`] when no task is current.
pub const NO_TASK: u8 = 0xff;

/// The task whose frame is at the top of [`entry::CURRENT_KSTACK_TOP`], or [`NO_TASK`].
pub static CURRENT_TASK: AtomicU8 = AtomicU8::new(NO_TASK);

/// Where the NMI's frame-pointer walk may read the running process's
/// stack, 64-bit and compat. Set while no process is current, so no NMI
/// walks with a half-updated range.
pub static USER_WALK: WalkRange = WalkRange::new();
/// The compat (4-byte word) twin of [`USER_WALK`].
pub static COMPAT_WALK: WalkRange = WalkRange::new();

/// Sets the walk ranges to `stack`, whose pages must all be present.
pub fn set_walk(stack: (u64, u64)) {
    USER_WALK.set(8, stack);
    COMPAT_WALK.set(4, stack);
}

/// Which user ABI a task runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Abi {
    /// 64-bit code, enters with SYSCALL.
    X64,
    /// 32-bit compatibility-mode code, enters with `int 0x80`.
    Compat32,
}

impl Abi {
    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            Abi::X64 => "x86_64",
            Abi::Compat32 => "i386",
        }
    }
}

/// How a task ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// Exception vector.
    pub vector: u64,
    /// Error code (0 if none).
    pub error_code: u64,
    /// Faulting RIP.
    pub rip: u64,
    /// CS at the fault.
    pub cs: u64,
    /// CR2 at the fault (page faults).
    pub cr2: u64,
}

/// The state of a task slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskState {
    /// Can run.
    Ready,
    /// Ended with `exit(code)`.
    Exited(i64),
    /// Ended by a fault.
    Faulted(Fault),
    /// Waiting until the TSC reaches the value.
    Sleeping(u64),
    /// Waiting for an event that cannot come (a single-threaded futex wait).
    Blocked,
    /// Ended by a signal it sent itself (abort, kill), with its number.
    Signaled(u8),
}

impl TaskState {
    /// True once the process has ended.
    pub fn ended(&self) -> bool {
        matches!(
            self,
            TaskState::Exited(_) | TaskState::Faulted(_) | TaskState::Signaled(_)
        )
    }
}

/// Why a task came back to the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// `yield`.
    Yield,
    /// `exit(code)`.
    Exit(i64),
    /// An exception in ring 3.
    Fault(Fault),
    /// The time slice ran out.
    Preempted,
    /// Sleeps until the TSC reaches the value.
    Sleep(u64),
    /// Waits for an event that cannot come.
    Block,
    /// Ends by a signal it sent itself.
    Signal(u8),
}

/// What to start.
#[derive(Clone, Copy, Debug)]
pub struct TaskSpec {
    /// Name shown in output and profiles.
    pub name: &'static str,
    /// ABI.
    pub abi: Abi,
    /// Entry point (in `.user.text`).
    pub entry: u64,
    /// Initial GPRs in `TrapFrame::gprs` order (`rsp` is the user stack).
    pub gprs: [u64; 15],
}

/// Bookkeeping for one task.
#[derive(Clone, Copy, Debug)]
pub struct Task {
    /// The spec it was started from.
    pub spec: TaskSpec,
    /// Current state.
    pub state: TaskState,
    /// Times it entered the runtime with `yield`.
    pub yields: u64,
    /// Bytes it wrote with `write`.
    pub bytes_written: u64,
    /// Times its slice ran out.
    pub preemptions: u64,
    /// A loaded Linux program (its ends are reported as signals and exit
    /// statuses), not a built-in one.
    pub linux: bool,
}

static TASKS: Mutex<RefCell<[Option<Task>; MAX_TASKS]>> =
    Mutex::new(RefCell::new([None; MAX_TASKS]));
/// What a process owns beside its bookkeeping: its address space, its
/// segment state and, for a loaded program, its Linux personality.
pub struct Inner {
    /// The process's page tables.
    pub space: AddressSpace,
    /// FS/GS selectors, TLS slots and FS base, switched with the process.
    pub segs: crate::cpu::UserSegments,
    /// The Linux system-call state of a loaded program (`None` for the
    /// runtime's built-in programs, which use its own small ABI).
    pub linux: Option<alloc::boxed::Box<kcore::sys::Process>>,
    /// Its x87/SSE registers while it does not run.
    pub fpu: alloc::boxed::Box<crate::cpu::FpuState>,
    /// The lowest present page of the stack area: every page from here to
    /// the stack top is present, so the NMI's frame-pointer walk may read
    /// them without faulting (the stack top when none is).
    pub stack_low: u64,
}

static INNER: Mutex<RefCell<[Option<alloc::boxed::Box<Inner>>; MAX_TASKS]>> =
    Mutex::new(RefCell::new([const { None }; MAX_TASKS]));
static OUTCOME: Mutex<Cell<Option<Outcome>>> = Mutex::new(Cell::new(None));

#[repr(C, align(16))]
struct Stacks<const N: usize>(UnsafeCell<[[u8; N]; MAX_TASKS]>);

// SAFETY: single core. Kernel stacks are used by the CPU and the entry
// stubs; Rust only touches the saved frame at the top through raw pointers
// while the task is not running. User stacks belong to their task.
unsafe impl<const N: usize> Sync for Stacks<N> {}

static KSTACKS: Stacks<KSTACK_SIZE> = Stacks(UnsafeCell::new([[0; KSTACK_SIZE]; MAX_TASKS]));
#[unsafe(link_section = ".user.bss.stacks")]
static USTACKS: Stacks<USTACK_SIZE> = Stacks(UnsafeCell::new([[0; USTACK_SIZE]; MAX_TASKS]));

fn kstack_top(slot: usize) -> u64 {
    KSTACKS.0.get() as u64 + ((slot + 1) * KSTACK_SIZE) as u64
}

fn ustack_top(slot: usize) -> u64 {
    USTACKS.0.get() as u64 + ((slot + 1) * USTACK_SIZE) as u64
}

fn frame_ptr(slot: usize) -> *mut TrapFrame {
    (kstack_top(slot) - core::mem::size_of::<TrapFrame>() as u64) as *mut TrapFrame
}

/// The saved user frame of the task owning the kernel stack that ends at `top`.
pub fn frame_at_kstack_top(top: u64) -> *const TrapFrame {
    (top - core::mem::size_of::<TrapFrame>() as u64) as *const TrapFrame
}

/// Why a task could not be started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpawnError {
    /// All slots are in use.
    NoFreeSlot,
    /// The entry point is not in the appliance's code.
    EntryNotUserCode,
    /// No memory for the task's address space.
    NoMemory,
}

/// A new address space with the built-in ring-3 image mapped in: its code
/// read-only and executable, its data writable and NX (the frames are the
/// image's own, shared by every task that runs built-in code).
pub fn builtin_space() -> Option<AddressSpace> {
    use arch_x86::paging::{PAGE, user_leaf_flags};
    let mut s = AddressSpace::new()?;
    let l = crate::mm::layout();
    let phys = crate::mm::user_image_phys();
    let nx = crate::mm::nx();
    let base = l.user_text.0;
    for (range, write, exec) in [(l.user_text, false, true), (l.user_data, true, false)] {
        let mut va = range.0;
        while va < range.1 {
            s.map_borrowed(va, phys + (va - base), user_leaf_flags(write, exec, nx))
                .ok()?;
            va += PAGE;
        }
    }
    Some(s)
}

/// True when `[addr, addr+len)` lies inside the built-in ring-3 image.
pub fn is_builtin_range(addr: u64, len: u64) -> bool {
    let l = crate::mm::layout();
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    (addr >= l.user_text.0 && end <= l.user_text.1)
        || (addr >= l.user_data.0 && end <= l.user_data.1)
}

/// Runs `f` on task `id`'s address space.
pub fn with_space<R>(id: u8, f: impl FnOnce(&mut AddressSpace) -> R) -> Option<R> {
    with_inner(id, |i| f(&mut i.space))
}

/// Runs `f` on what task `id` owns. `f` must not call back into this module's
/// table functions for the same table (`with_inner`, `spawn`, `clear`).
pub fn with_inner<R>(id: u8, f: impl FnOnce(&mut Inner) -> R) -> Option<R> {
    critical_section::with(|cs| {
        INNER
            .borrow_ref_mut(cs)
            .get_mut(id as usize)
            .and_then(Option::as_mut)
            .map(|b| f(b))
    })
}

/// Starts a task; returns its id.
pub fn spawn(spec: TaskSpec) -> Result<u8, SpawnError> {
    if !is_builtin_range(spec.entry, 1) {
        return Err(SpawnError::EntryNotUserCode);
    }
    let space = builtin_space().ok_or(SpawnError::NoMemory)?;
    let inner = alloc::boxed::Box::new(Inner {
        space,
        segs: crate::cpu::UserSegments::default(),
        linux: None,
        fpu: alloc::boxed::Box::new(crate::cpu::FpuState::initial()),
        stack_low: 0,
    });
    install(spec, inner, ustack_top_for)
}

fn ustack_top_for(slot: usize) -> u64 {
    ustack_top(slot) - 16
}

/// The first free process slot.
pub fn free_slot() -> Option<usize> {
    critical_section::with(|cs| TASKS.borrow_ref(cs).iter().position(Option::is_none))
}

/// Puts a new process in a free slot: its bookkeeping, what it owns, and
/// its initial user frame (`rsp` from `stack(slot)`).
pub fn install(
    spec: TaskSpec,
    inner: alloc::boxed::Box<Inner>,
    stack: impl FnOnce(usize) -> u64,
) -> Result<u8, SpawnError> {
    let linux = inner.linux.is_some();
    critical_section::with(|cs| {
        let mut tasks = TASKS.borrow_ref_mut(cs);
        let slot = tasks
            .iter()
            .position(Option::is_none)
            .ok_or(SpawnError::NoFreeSlot)?;
        let g = spec.gprs;
        let frame = TrapFrame {
            rax: g[0],
            rbx: g[1],
            rcx: g[2],
            rdx: g[3],
            rsi: g[4],
            rdi: g[5],
            rbp: g[6],
            r8: g[7],
            r9: g[8],
            r10: g[9],
            r11: g[10],
            r12: g[11],
            r13: g[12],
            r14: g[13],
            r15: g[14],
            vector: 0,
            error_code: 0,
            rip: spec.entry,
            cs: u64::from(match spec.abi {
                Abi::X64 => gdt::USER_CODE64,
                Abi::Compat32 => gdt::USER_CODE32,
            }),
            // IF set: the scheduler's tick preempts ring 3.
            rflags: 0x202,
            rsp: stack(slot),
            ss: u64::from(gdt::USER_DATA),
        };
        // SAFETY: the slot is free, so no task runs on this kernel stack.
        unsafe { frame_ptr(slot).write(frame) };
        INNER.borrow_ref_mut(cs)[slot] = Some(inner);
        tasks[slot] = Some(Task {
            spec,
            state: TaskState::Ready,
            yields: 0,
            bytes_written: 0,
            preemptions: 0,
            linux,
        });
        Ok(slot as u8)
    })
}

/// A copy of the task in `id`, if any.
pub fn get(id: u8) -> Option<Task> {
    critical_section::with(|cs| TASKS.borrow_ref(cs).get(id as usize).copied().flatten())
}

/// Updates the task in `id`.
pub fn update(id: u8, f: impl FnOnce(&mut Task)) {
    critical_section::with(|cs| {
        if let Some(Some(t)) = TASKS.borrow_ref_mut(cs).get_mut(id as usize) {
            f(t);
        }
    });
}

/// Frees every slot.
pub fn clear() {
    crate::mm::activate_kernel();
    critical_section::with(|cs| {
        *TASKS.borrow_ref_mut(cs) = [None; MAX_TASKS];
        *INNER.borrow_ref_mut(cs) = [const { None }; MAX_TASKS];
    });
}

/// The current task, if a task is current.
pub fn current() -> Option<u8> {
    match CURRENT_TASK.load(Ordering::Relaxed) {
        NO_TASK => None,
        id => Some(id),
    }
}

/// Records why the current task leaves; called by the trap handler.
pub fn set_outcome(o: Outcome) {
    critical_section::with(|cs| OUTCOME.borrow(cs).set(Some(o)));
}

/// Runs task `id` until it leaves to the scheduler, and applies the outcome.
pub fn run_once(id: u8) -> Option<Outcome> {
    let task = get(id)?;
    if task.state != TaskState::Ready {
        return None;
    }
    let slot = id as usize;
    let top = kstack_top(slot);
    critical_section::with(|cs| OUTCOME.borrow(cs).set(None));
    entry::CURRENT_KSTACK_TOP.store(top, Ordering::Relaxed);
    crate::cpu::set_rsp0(top);
    with_inner(id, |i| {
        i.space.activate();
        crate::cpu::load_user_segments(&i.segs);
        i.fpu.restore();
        set_walk(match &i.linux {
            Some(p) => (i.stack_low, p.layout.stack_top),
            None => crate::mm::layout().user_data,
        });
    });
    CURRENT_TASK.store(id, Ordering::Relaxed);
    // SAFETY: the frame at the top of this task's kernel stack was written by
    // `spawn` or by the entry stubs when the task last entered the runtime;
    // CURRENT_KSTACK_TOP and rsp0 point at the end of that frame.
    unsafe { entry::enter_user(frame_ptr(slot)) };
    CURRENT_TASK.store(NO_TASK, Ordering::Relaxed);
    let (fs, gs) = crate::cpu::saved_selectors();
    with_inner(id, |i| {
        i.segs.fs = fs;
        i.segs.gs = gs;
        i.fpu.save();
    });
    let outcome = critical_section::with(|cs| OUTCOME.borrow(cs).take());
    update(id, |t| match outcome {
        Some(Outcome::Yield) => t.yields += 1,
        Some(Outcome::Exit(code)) => t.state = TaskState::Exited(code),
        Some(Outcome::Fault(f)) => t.state = TaskState::Faulted(f),
        Some(Outcome::Sleep(until)) => t.state = TaskState::Sleeping(until),
        Some(Outcome::Preempted) => t.preemptions += 1,
        Some(Outcome::Block) => t.state = TaskState::Blocked,
        Some(Outcome::Signal(sig)) => t.state = TaskState::Signaled(sig),
        None => {}
    });
    outcome
}

/// Prints why a task was ended.
pub fn report_fault(name: &str, f: &Fault) {
    let mode = match Mode::from_cs(f.cs) {
        Mode::UserCompat => "compat",
        _ => "64-bit",
    };
    crate::kprint!(
        "task {name} ({mode}) ended: {} (vector {}) error={:#x} rip={:#x} <{}>",
        arch_x86::frame::exception_name(f.vector),
        f.vector,
        f.error_code,
        f.rip,
        crate::symbols::Nearest(f.rip),
    );
    if f.vector == 14 {
        crate::kprint!(" cr2={:#x}", f.cr2);
    }
    crate::kprintln!();
}

/// Wakes sleepers whose time has come; returns the earliest remaining
/// wake-up time, if any process still sleeps.
fn wake_sleepers(now: u64) -> Option<u64> {
    let mut next: Option<u64> = None;
    critical_section::with(|cs| {
        for t in TASKS.borrow_ref_mut(cs).iter_mut().flatten() {
            if let TaskState::Sleeping(until) = t.state {
                if now >= until {
                    t.state = TaskState::Ready;
                } else {
                    next = Some(next.map_or(until, |n: u64| n.min(until)));
                }
            }
        }
    });
    next
}

/// What the caller of [`run_all`] decides: when to stop, what to do while
/// nothing is ready, and what a process that ended leaves behind (the
/// layers above know its personality).
pub trait Driver {
    /// True to end the run now (asked before each slice).
    fn stop(&mut self) -> bool;
    /// Called before the CPU halts for want of a ready process.
    fn idle(&mut self);
    /// Called once when process `id` has ended with `outcome`; `task` is
    /// its bookkeeping from before the slice that ended it.
    fn ended(&mut self, id: u8, task: &Task, outcome: Outcome);
}

/// Runs every ready process round-robin, preempting each after its slice,
/// until none is ready or sleeping, or the driver stops it. With only
/// sleepers left the CPU idles in `hlt` (the tick wakes it).
pub fn run_all(driver: &mut impl Driver) {
    let ticking = tick::start();
    let mut next = 0usize;
    loop {
        if driver.stop() {
            break;
        }
        let sleeper = wake_sleepers(arch_x86::cpu::rdtsc());
        let ready = (0..MAX_TASKS)
            .map(|i| (next + i) % MAX_TASKS)
            .find(|&i| get(i as u8).is_some_and(|t| t.state == TaskState::Ready));
        match ready {
            Some(i) => {
                tick::new_slice();
                let task = get(i as u8);
                let outcome = run_once(i as u8);
                if let (Some(task), Some(o)) = (task, outcome)
                    && matches!(o, Outcome::Exit(_) | Outcome::Fault(_) | Outcome::Signal(_))
                {
                    driver.ended(i as u8, &task, o);
                }
                next = i + 1;
            }
            None if sleeper.is_some() && ticking => {
                driver.idle();
                idle();
            }
            None => break,
        }
    }
    tick::stop();
}

/// Halts until the next interrupt (the tick), then returns with interrupts off.
fn idle() {
    // SAFETY: `sti; hlt` enables interrupts only for the halt: the tick (or
    // an NMI) ends it, and the trap handler acknowledges the tick from
    // kernel mode without switching anything. `cli` follows at once.
    unsafe { core::arch::asm!("sti", "hlt", "cli", options(nomem, nostack)) };
}
