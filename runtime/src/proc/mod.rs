//! Threads and processes: the task table (one task per thread), what each
//! thread owns ([`Thread`]: segments, FPU state, its stack window) and what
//! the threads of a process share ([`Process`]: the address space and the
//! Linux personality), kernel stacks, saved user frames, and the
//! preemptive round-robin scheduler that runs them.
//!
//! A thread runs until it enters the runtime with a request that leaves to
//! the scheduler (yield, exit, sleep, a futex wait), faults, or uses up its
//! time slice (the [`tick`]). A blocked or sleeping thread becomes ready
//! again through [`wake`] (a futex wake) or when its deadline passes. Its saved user frame sits at the top of its kernel
//! stack, written by the entry stubs on every entry. The runtime itself is
//! not preemptible: it runs with interrupts off, and the tick only lands in
//! ring 3 or in the idle `hlt`.

pub mod tick;

use crate::entry;
use crate::mm::space::AddressSpace;
use alloc::boxed::Box;
use arch_x86::frame::{Mode, TrapFrame};
use arch_x86::gdt;
use arch_x86::madt::MAX_CPUS;
use arch_x86::paging::{PAGE, PRESENT};
use core::cell::{Cell, RefCell, UnsafeCell};
use core::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use critical_section::Mutex;

/// Most tasks (threads of every process) in one run.
pub const MAX_TASKS: usize = 64;
const KSTACK_SIZE: usize = 32 * 1024;
const USTACK_SIZE: usize = 16 * 1024;
/// The task number no task has ([`crate::cpu::CpuLocal::current_task`]
/// when none runs on a CPU).
pub const NO_TASK: u8 = crate::cpu::NO_TASK;
/// The process id of each thread, by tid (the task number + 1; tid 0, no
/// task, has pid 0): what a sample says as its pid. A function of the tid
/// the NMI already has, so no update of "the current pid" can ever be
/// seen half done.
pub static PID_OF_TID: [AtomicU32; 256] = [const { AtomicU32::new(0) }; 256];

/// Notes that task `slot` is a thread of the process whose first thread
/// is task `proc`.
fn set_pid(slot: usize, proc: u8) {
    if let Some(p) = PID_OF_TID.get(slot + 1) {
        p.store(u32::from(proc) + 1, Ordering::Relaxed);
    }
}

/// Signals other threads sent to each task (bit n-1 = signal n), not yet
/// moved into its Linux thread state: a thread's state is borrowed while
/// its own system call runs, so a sender posts here.
static POSTED: [AtomicU64; MAX_TASKS] = [const { AtomicU64::new(0) }; MAX_TASKS];
/// Each task's blocked signals as of its last system call or delivery
/// (for senders, which cannot borrow its state).
static BLOCKED: [AtomicU64; MAX_TASKS] = [const { AtomicU64::new(0) }; MAX_TASKS];

/// Posts signal bit `bits` to task `id`; returns whether it waited and
/// the signal is not blocked (it is then woken with `rax`, an `-EINTR`).
pub fn post_signal(id: u8, bits: u64, rax: u64) -> bool {
    let Some(slot) = POSTED.get(id as usize) else {
        return false;
    };
    slot.fetch_or(bits, Ordering::Relaxed);
    // A vfork parent takes it once its child let go of its memory.
    bits & !BLOCKED[id as usize].load(Ordering::Relaxed) != 0
        && VFORK_CHILD[id as usize].load(Ordering::Relaxed) == 0
        && wake(id, rax)
}

/// For each task: the process slot + 1 of the vfork child it waits for
/// (0: none).
static VFORK_CHILD: [AtomicU8; MAX_TASKS] = [const { AtomicU8::new(0) }; MAX_TASKS];

/// Thread `parent`, which made process slot `child` with `CLONE_VFORK`,
/// waits (blocked, the caller's outcome) until the child execs or ends:
/// [`vfork_done`] wakes it, and signals do not.
pub fn vfork_wait(parent: u8, child: u8) {
    if let Some(w) = VFORK_CHILD.get(usize::from(parent)) {
        w.store(child + 1, Ordering::Relaxed);
    }
}

/// Process slot `child` execs or ends: the thread that made it with
/// `CLONE_VFORK` goes on, with the child's pid as its call's result.
pub fn vfork_done(child: u8) {
    for (i, w) in VFORK_CHILD.iter().enumerate() {
        if w.compare_exchange(child + 1, 0, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            wake(i as u8, u64::from(child) + 1);
        }
    }
}

/// Takes the signals posted to task `id`.
pub fn take_posted(id: u8) -> u64 {
    POSTED
        .get(id as usize)
        .map_or(0, |p| p.swap(0, Ordering::Relaxed))
}

/// True when signals were posted to task `id` and not taken yet.
pub fn has_posted(id: u8) -> bool {
    POSTED
        .get(id as usize)
        .is_some_and(|p| p.load(Ordering::Relaxed) != 0)
}

/// Whether task `id` blocked signal bits `bits` as of its last system call.
pub fn blocks(id: u8, bits: u64) -> bool {
    BLOCKED
        .get(id as usize)
        .is_some_and(|b| b.load(Ordering::Relaxed) & bits == bits)
}

/// Notes task `id`'s blocked signals for senders.
pub fn set_blocked(id: u8, mask: u64) {
    if let Some(b) = BLOCKED.get(id as usize) {
        b.store(mask, Ordering::Relaxed);
    }
}

/// How far below a thread's stack top the window scan looks for present
/// pages (see [`Thread::stack_top`]).
const WINDOW_SCAN_PAGES: u64 = 64;

/// Sets this CPU's walk ranges ([`crate::cpu::CpuLocal::user_walk`]) to
/// `stack`, whose pages must all be present.
pub fn set_walk(stack: (u64, u64)) {
    let cpu = crate::cpu::this();
    cpu.user_walk.set(8, stack);
    cpu.compat_walk.set(4, stack);
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
    /// Ended with `exit(code)` (this thread), or its process ended so.
    Exited(i64),
    /// Ended by a fault.
    Faulted(Fault),
    /// Waiting until the TSC reaches the value.
    Sleeping(u64),
    /// Waiting without a deadline (a futex wait) until [`wake`].
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
    /// `exit_group(code)`, or `exit` of the last thread: the process ends.
    Exit(i64),
    /// `exit(code)` of one thread of several: the others go on.
    ThreadExit(i64),
    /// An exception in ring 3.
    Fault(Fault),
    /// The time slice ran out.
    Preempted,
    /// Sleeps until the TSC reaches the value.
    Sleep(u64),
    /// Waits without a deadline until [`wake`].
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
    /// The process it is a thread of: the task number of its first
    /// thread (the pid is that + 1).
    pub proc: u8,
    /// Whether the stream was told of it (see [`take_unannounced`]).
    pub announced: bool,
    /// Whether its end was taken to be told (see [`take_unannounced_ends`]).
    pub end_announced: bool,
    /// Whether its end was told ([`end_told`]): only then may its slot,
    /// and its ids, go to a new task.
    pub end_told: bool,
    /// The thread's own name when it set one (NUL-padded; empty: the
    /// program's name).
    pub comm: [u8; 16],
    /// When it started or last took a name (ns): the time of its Task
    /// record, so the profile names its samples from then on.
    pub since_ns: u64,
    /// The CPU (its index) that runs it: 0, the boot CPU, unless it was
    /// pinned elsewhere ([`pin`]); a new thread inherits its creator's.
    pub cpu: u8,
    /// The CPUs it may run on (bit n: CPU n; [`EVERY_CPU`] unless
    /// `sched_setaffinity` narrowed it, [`set_affinity`]); a new thread
    /// inherits its creator's, as on Linux.
    pub affinity: u64,
    /// What its next Task record says of how it came to be (back to
    /// [`Origin::Named`] once told).
    pub origin: Origin,
    /// The first thread of a forked process, whose slot is freed once the
    /// process ended (see [`release_thread_slot`]).
    pub forked: bool,
}

/// How a task came to be, for the stream's Task record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Origin {
    /// Started with the run, or renamed itself.
    #[default]
    Named,
    /// Made by thread `ptid` of process `ppid` (`clone`, `fork`).
    Made {
        /// The maker's pid.
        ppid: u32,
        /// The maker's tid.
        ptid: u32,
    },
    /// Its process replaced its program (`execve`).
    Exec,
    /// Made by thread `ptid` of process `ppid`, and it replaced its program
    /// before the stream was told of it: both are told.
    MadeThenExec {
        /// The maker's pid.
        ppid: u32,
        /// The maker's tid.
        ptid: u32,
    },
}

/// The affinity of a thread no one narrowed.
pub const EVERY_CPU: u64 = u64::MAX;

/// Whether CPU `c` is one of `mask`'s.
fn allows(mask: u64, c: u8) -> bool {
    c < 64 && mask & (1 << c) != 0
}

impl Task {
    /// The thread's name: the one it set, else its program's.
    pub fn name(&self) -> &str {
        let n = self.comm.iter().position(|&b| b == 0).unwrap_or(16);
        match core::str::from_utf8(&self.comm[..n]) {
            Ok(s) if n > 0 => s,
            _ => self.spec.name,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        u32::from(self.proc) + 1
    }
}

static TASKS: Mutex<RefCell<[Option<Task>; MAX_TASKS]>> =
    Mutex::new(RefCell::new([None; MAX_TASKS]));

/// What one thread owns beside its bookkeeping and kernel stack.
pub struct Thread {
    /// FS/GS selectors, TLS slots and FS base, switched with the thread.
    pub segs: crate::cpu::UserSegments,
    /// Its x87/SSE registers while it does not run.
    pub fpu: Box<crate::cpu::FpuState>,
    /// The Linux state of a loaded program's thread (`None` for the
    /// runtime's built-in programs).
    pub linux: Option<Box<kcore::sys::Thread>>,
    /// For a thread other than its process's first: the top of the stack
    /// `clone` gave it. Its NMI walk window runs from there down over the
    /// pages present when it is switched in ([`WINDOW_SCAN_PAGES`] at
    /// most); the first thread's window is the process's main stack.
    pub stack_top: Option<u64>,
    /// The low end of that window (as scanned).
    pub stack_low: u64,
}

impl Thread {
    /// A first thread: initial segments and FPU state.
    pub fn first(linux: Option<Box<kcore::sys::Thread>>) -> Box<Thread> {
        Box::new(Thread {
            segs: crate::cpu::UserSegments::default(),
            fpu: Box::new(crate::cpu::FpuState::initial()),
            linux,
            stack_top: None,
            stack_low: 0,
        })
    }
}

/// What the threads of a process share: its address space and, for a
/// loaded program, its Linux personality.
pub struct Process {
    /// The process's page tables.
    pub space: AddressSpace,
    /// The Linux system-call state of a loaded program (`None` for the
    /// runtime's built-in programs, which use its own small ABI).
    pub linux: Option<Box<kcore::sys::Process>>,
    /// The lowest present page of the main stack area: every page from
    /// here to the stack top is present, so the NMI's frame-pointer walk
    /// may read them without faulting (the stack top when none is).
    pub stack_low: u64,
}

static THREADS: Mutex<RefCell<[Option<Box<Thread>>; MAX_TASKS]>> =
    Mutex::new(RefCell::new([const { None }; MAX_TASKS]));
/// Indexed by [`Task::proc`].
static PROCS: Mutex<RefCell<[Option<Box<Process>>; MAX_TASKS]>> =
    Mutex::new(RefCell::new([const { None }; MAX_TASKS]));
/// Why the task running on each CPU left to its scheduler, by CPU index.
static OUTCOME: [Mutex<Cell<Option<Outcome>>>; MAX_CPUS] =
    [const { Mutex::new(Cell::new(None)) }; MAX_CPUS];

/// This CPU's outcome cell.
fn outcome() -> &'static Mutex<Cell<Option<Outcome>>> {
    &OUTCOME[crate::cpu::this().index as usize % MAX_CPUS]
}

/// The CPU this code runs on, as a task's [`Task::cpu`] names it.
fn this_cpu() -> u8 {
    crate::cpu::this().index as u8
}

/// Whether new threads go to the CPU with the fewest (`sched=spread`).
static SPREAD: AtomicBool = AtomicBool::new(false);

/// `sched=spread` (true) or `sched=boot`.
pub fn set_spread(on: bool) {
    SPREAD.store(on, Ordering::Relaxed);
}

/// Whether threads are spread over the CPUs.
pub fn spread() -> bool {
    SPREAD.load(Ordering::Relaxed)
}

/// The CPU a new thread that may run on the CPUs of `allowed` goes to:
/// with `sched=spread`, the CPU of those that are up with the fewest
/// threads that have not ended (the lowest index among equals); otherwise
/// `inherited` when allowed, else the allowed CPU with the fewest.
fn place(tasks: &[Option<Task>; MAX_TASKS], inherited: u8, allowed: u64) -> u8 {
    if !spread() && allows(allowed, inherited) {
        return inherited;
    }
    place_among(tasks, allowed)
}

/// Whether CPU `c` runs a thread right now.
fn cpu_busy(c: u8) -> bool {
    crate::smp::cpu(u32::from(c)).is_some_and(|b| b.current_task.load(Ordering::Relaxed) != NO_TASK)
}

/// Thread `id` just became ready: with `sched=spread`, when its CPU runs
/// another thread and one is idle, it moves there. The CPU it is now for.
fn ready_on(tasks: &mut [Option<Task>; MAX_TASKS], id: u8) -> Option<u8> {
    let t = tasks.get(usize::from(id))?.as_ref()?;
    let (cpu, allowed) = (t.cpu, t.affinity);
    let to = if cpu_busy(cpu) {
        idle_cpu(tasks, cpu, allowed)
    } else {
        None
    };
    if let (Some(c), Some(Some(t))) = (to, tasks.get_mut(usize::from(id))) {
        t.cpu = c;
    }
    Some(to.unwrap_or(cpu))
}

/// With `sched=spread`, a CPU of `allowed` other than `except` that is
/// idle: up, no thread on it now and none ready for it; the other CPUs
/// before the boot CPU (which also drains the stream).
fn idle_cpu(tasks: &[Option<Task>; MAX_TASKS], except: u8, allowed: u64) -> Option<u8> {
    if !spread() {
        return None;
    }
    let cpus = (crate::smp::online() as usize).clamp(1, MAX_CPUS) as u8;
    (1..cpus).chain(core::iter::once(0)).find(|&c| {
        c != except
            && allows(allowed, c)
            && !cpu_busy(c)
            && !tasks
                .iter()
                .flatten()
                .any(|t| t.cpu == c && t.state == TaskState::Ready)
    })
}

/// At the end of a slice on this CPU: each thread that waits here for
/// the CPU (ready, beyond the one to run next) moves to an idle CPU while
/// there is one, which is woken for it.
fn push_waiting() {
    if !spread() {
        return;
    }
    let me = this_cpu();
    let moved = critical_section::with(|cs| {
        let mut tasks = TASKS.borrow_ref_mut(cs);
        let mut moved = heapless::Vec::<u8, MAX_CPUS>::new();
        let mut first = true;
        for i in 0..MAX_TASKS {
            let waiting = tasks[i].is_some_and(|t| t.cpu == me && t.state == TaskState::Ready)
                && running_on(i as u8).is_none();
            if !waiting {
                continue;
            }
            if core::mem::take(&mut first) {
                continue;
            }
            let allowed = tasks[i].map_or(EVERY_CPU, |t| t.affinity);
            let Some(c) = idle_cpu(&tasks, me, allowed) else {
                continue;
            };
            if let Some(t) = tasks[i].as_mut() {
                t.cpu = c;
            }
            // Cannot fail: at most one thread per other CPU.
            let _ = moved.push(c);
        }
        moved
    });
    for c in moved {
        nudge(c);
    }
}

/// The CPU thread `id` is running on right now, if any.
fn running_on(id: u8) -> Option<u8> {
    (0..crate::smp::online()).find_map(|i| {
        crate::smp::cpu(i)
            // Acquire: a CPU that left the task (a release store) has
            // pushed the samples it took in it.
            .filter(|c| c.current_task.load(Ordering::Acquire) == id)
            .map(|_| i as u8)
    })
}

/// Makes CPU `cpu` look at its threads again (it may be halted) when it is
/// not this one.
fn nudge(cpu: u8) {
    if cpu != this_cpu() {
        crate::smp::kick(u32::from(cpu));
    }
}

/// Set for a thread another thread's end of their process ended (its
/// state says so too; this is the lock-free copy the tick reads).
static ENDED_BY_SIBLING: [AtomicBool; MAX_TASKS] = [const { AtomicBool::new(false) }; MAX_TASKS];

/// Whether the thread running on this CPU has ended meanwhile (another
/// CPU's thread ended its process): it is to leave for the scheduler
/// rather than go back to ring 3. Lock-free.
pub fn current_ended() -> bool {
    current().is_some_and(|id| ENDED_BY_SIBLING[usize::from(id)].load(Ordering::Acquire))
}

/// Set once the end of process `proc` (by slot) was handed to the driver.
static REAPED: [AtomicBool; MAX_TASKS] = [const { AtomicBool::new(false) }; MAX_TASKS];

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
    with_thread(id, |_, p| f(&mut p.space))
}

/// Runs `f` on what thread `id` owns and what its process shares. `f` must
/// not call back into this module's table functions (`with_thread`,
/// `install`, `clear`).
pub fn with_thread<R>(id: u8, f: impl FnOnce(&mut Thread, &mut Process) -> R) -> Option<R> {
    let proc = get(id)?.proc;
    critical_section::with(|cs| {
        let mut threads = THREADS.borrow_ref_mut(cs);
        let mut procs = PROCS.borrow_ref_mut(cs);
        let t = threads.get_mut(id as usize)?.as_mut()?;
        let p = procs.get_mut(proc as usize)?.as_mut()?;
        Some(f(t, p))
    })
}

/// The tasks (threads) of process `proc`, in task order.
pub fn threads_of(proc: u8) -> heapless::Vec<u8, MAX_TASKS> {
    critical_section::with(|cs| {
        TASKS
            .borrow_ref(cs)
            .iter()
            .enumerate()
            .filter(|(_, t)| t.is_some_and(|t| t.proc == proc))
            .map(|(i, _)| i as u8)
            .collect()
    })
}

/// Set once the stream tells of tasks ([`take_unannounced`]): from then
/// on a task's slot waits for its Task record and its end's before it is
/// freed, so that every process and thread is in the profile, however
/// short it lived.
static TOLD: AtomicBool = AtomicBool::new(false);

/// Calls `f` for each task the stream has not been told of yet, and marks
/// it told.
pub fn take_unannounced(f: impl FnMut(u8, &Task)) {
    take_unannounced_if(|_| true, f);
}

/// [`take_unannounced`] for the tasks `which` picks.
pub fn take_unannounced_if(which: impl Fn(&Task) -> bool, mut f: impl FnMut(u8, &Task)) {
    TOLD.store(true, Ordering::Relaxed);
    // Filled in place: a list of tasks returned by value is copied whole
    // (all its capacity), and this runs at every turn of the dispatch loop.
    let mut new: heapless::Vec<(u8, Task), MAX_TASKS> = heapless::Vec::new();
    critical_section::with(|cs| {
        let mut tasks = TASKS.borrow_ref_mut(cs);
        for (id, t) in tasks.iter_mut().enumerate() {
            if let Some(t) = t.as_mut().filter(|t| !t.announced && which(t)) {
                t.announced = true;
                // Cannot fail: one entry a task.
                let _ = new.push((id as u8, *t));
                t.origin = Origin::Named;
            }
        }
    });
    for (id, t) in &new {
        f(*id, t);
    }
}

/// Calls `f` for each task that ended since the stream was told of it,
/// and marks its end taken; the caller tells each end, then calls
/// [`end_told`]. Unless `settled` (sampling has stopped), a task still
/// current on a CPU waits for a later call: that CPU is on its way out of
/// the task, and a sample taken there until it leaves is the task's, which
/// goes before its end.
pub fn take_unannounced_ends(settled: bool, mut f: impl FnMut(u8, &Task)) {
    // Filled in place, as in `take_unannounced_if`.
    let mut ended: heapless::Vec<(u8, Task), MAX_TASKS> = heapless::Vec::new();
    critical_section::with(|cs| {
        let mut tasks = TASKS.borrow_ref_mut(cs);
        for (id, t) in tasks.iter_mut().enumerate() {
            let ends = |t: &&mut Task| {
                t.announced
                    && !t.end_announced
                    && t.state.ended()
                    && (settled || running_on(id as u8).is_none())
            };
            if let Some(t) = t.as_mut().filter(ends) {
                t.end_announced = true;
                // Cannot fail: one entry a task.
                let _ = ended.push((id as u8, *t));
            }
        }
    });
    for (id, t) in &ended {
        f(*id, t);
    }
}

/// The stream was told of task `id`'s end: its slot is freed if it was a
/// thread (see [`release_thread_slot`]). Not before: a thread made in the
/// slot takes the same ids, and its Task record must follow the end.
pub fn end_told(id: u8) {
    update(id, |t| t.end_told = true);
    release_thread_slot(id);
}

/// Starts a task; returns its id.
pub fn spawn(spec: TaskSpec) -> Result<u8, SpawnError> {
    if !is_builtin_range(spec.entry, 1) {
        return Err(SpawnError::EntryNotUserCode);
    }
    let space = builtin_space().ok_or(SpawnError::NoMemory)?;
    let proc = Box::new(Process {
        space,
        linux: None,
        stack_low: 0,
    });
    install(spec, proc, Thread::first(None), ustack_top_for)
}

fn ustack_top_for(slot: usize) -> u64 {
    ustack_top(slot) - 16
}

/// The first free process slot.
pub fn free_slot() -> Option<usize> {
    free_slot_but(0)
}

/// [`free_slot`], skipping the slots of `held` (bit n: slot n, whose id
/// n + 1 a process that ended still holds until its parent waits).
pub fn free_slot_but(held: u64) -> Option<usize> {
    critical_section::with(|cs| {
        TASKS
            .borrow_ref(cs)
            .iter()
            .enumerate()
            .position(|(i, t)| t.is_none() && held >> (i % 64) & 1 == 0)
    })
}

/// The first frame of a task: `spec`'s registers, entry and ABI, on
/// stack `rsp`, interrupts on (the scheduler's tick preempts ring 3).
pub fn first_frame(spec: &TaskSpec, rsp: u64) -> TrapFrame {
    let g = spec.gprs;
    TrapFrame {
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
        rflags: 0x202,
        rsp,
        ss: u64::from(gdt::USER_DATA),
    }
}

/// Puts a new process in a free slot: its bookkeeping, what it and its
/// first thread own, and the thread's initial user frame (`rsp` from
/// `stack(slot)`).
pub fn install(
    spec: TaskSpec,
    proc: Box<Process>,
    thread: Box<Thread>,
    stack: impl FnOnce(usize) -> u64,
) -> Result<u8, SpawnError> {
    let linux = proc.linux.is_some();
    critical_section::with(|cs| {
        let mut tasks = TASKS.borrow_ref_mut(cs);
        let slot = tasks
            .iter()
            .position(Option::is_none)
            .ok_or(SpawnError::NoFreeSlot)?;
        let frame = first_frame(&spec, stack(slot));
        // SAFETY: the slot is free, so no task runs on this kernel stack.
        unsafe { frame_ptr(slot).write(frame) };
        THREADS.borrow_ref_mut(cs)[slot] = Some(thread);
        PROCS.borrow_ref_mut(cs)[slot] = Some(proc);
        set_pid(slot, slot as u8);
        REAPED[slot].store(false, Ordering::Relaxed);
        ENDED_BY_SIBLING[slot].store(false, Ordering::Relaxed);
        VFORK_CHILD[slot].store(0, Ordering::Relaxed);
        let cpu = place(&tasks, 0, EVERY_CPU);
        tasks[slot] = Some(Task {
            spec,
            state: TaskState::Ready,
            yields: 0,
            bytes_written: 0,
            preemptions: 0,
            linux,
            proc: slot as u8,
            announced: false,
            end_announced: false,
            end_told: false,
            comm: [0; 16],
            since_ns: crate::time::now_ns(),
            cpu,
            affinity: EVERY_CPU,
            origin: Origin::Named,
            forked: false,
        });
        Ok((slot as u8, cpu))
    })
    .map(|(slot, cpu)| {
        nudge(cpu);
        slot
    })
}

/// Puts the first thread of a copy of task `parent`'s process (`fork`) in
/// free slot `slot` (the caller chose it and gave its pid away already):
/// `proc` and `thread` are what the copy owns, `frame` its first user
/// frame. It runs the parent's program under the parent's name, on the
/// CPUs the parent may use.
pub fn install_forked(
    parent: u8,
    slot: u8,
    proc: Box<Process>,
    thread: Box<Thread>,
    frame: &TrapFrame,
) -> Result<(), SpawnError> {
    install_made(parent, slot, Some(proc), thread, frame)
}

/// Puts a new thread of task `parent`'s process in free slot `slot` (the
/// caller chose it with [`free_slot`] and gave its tid away already):
/// `thread` is what it owns, `frame` its first user frame.
pub fn install_thread(
    parent: u8,
    slot: u8,
    thread: Box<Thread>,
    frame: &TrapFrame,
) -> Result<(), SpawnError> {
    install_made(parent, slot, None, thread, frame)
}

/// Puts a task made from task `parent` in free slot `slot`: the first
/// thread of a new process when `proc` is given (its pid is the slot's),
/// else a thread of `parent`'s process.
fn install_made(
    parent: u8,
    slot: u8,
    proc: Option<Box<Process>>,
    thread: Box<Thread>,
    frame: &TrapFrame,
) -> Result<(), SpawnError> {
    let maker = parent;
    let parent = get(parent).ok_or(SpawnError::NoFreeSlot)?;
    critical_section::with(|cs| {
        let mut tasks = TASKS.borrow_ref_mut(cs);
        let s = slot as usize;
        if !matches!(tasks.get(s), Some(None)) {
            return Err(SpawnError::NoFreeSlot);
        }
        // SAFETY: the slot is free, so no task runs on this kernel stack.
        unsafe { frame_ptr(s).write(*frame) };
        THREADS.borrow_ref_mut(cs)[s] = Some(thread);
        let owner = match proc {
            Some(proc) => {
                PROCS.borrow_ref_mut(cs)[s] = Some(proc);
                REAPED[s].store(false, Ordering::Relaxed);
                slot
            }
            None => parent.proc,
        };
        set_pid(s, owner);
        ENDED_BY_SIBLING[s].store(false, Ordering::Relaxed);
        VFORK_CHILD[s].store(0, Ordering::Relaxed);
        let cpu = place(&tasks, parent.cpu, parent.affinity);
        tasks[s] = Some(Task {
            spec: parent.spec,
            state: TaskState::Ready,
            yields: 0,
            bytes_written: 0,
            preemptions: 0,
            linux: parent.linux,
            proc: owner,
            announced: false,
            end_announced: false,
            end_told: false,
            comm: parent.comm,
            since_ns: crate::time::now_ns(),
            cpu,
            affinity: parent.affinity,
            origin: Origin::Made {
                ppid: u32::from(parent.proc) + 1,
                ptid: u32::from(maker) + 1,
            },
            forked: owner == slot,
        });
        Ok(cpu)
    })
    .map(nudge)
}

/// Makes CPU `cpu` (an index of a CPU that is up) the one that runs task
/// `id`, from its next slice on.
pub fn pin(id: u8, cpu: u8) {
    update(id, |t| t.cpu = cpu);
}

/// Lets thread `id` run only on the CPUs of `mask` (`sched_setaffinity`;
/// the caller checked that it names a CPU that is up). A thread whose CPU
/// is not one of them moves to the allowed CPU with the fewest threads,
/// which is kicked; one running now leaves its old CPU at its next return
/// to the scheduler. Returns whether it moved (`None`: no such thread).
pub fn set_affinity(id: u8, mask: u64) -> Option<bool> {
    let moved = critical_section::with(|cs| {
        let mut tasks = TASKS.borrow_ref_mut(cs);
        let t = tasks.get(usize::from(id))?.as_ref()?;
        if allows(mask, t.cpu) {
            let t = tasks[usize::from(id)].as_mut()?;
            t.affinity = mask;
            return Some(None);
        }
        let to = place_among(&tasks, mask);
        let t = tasks[usize::from(id)].as_mut()?;
        t.affinity = mask;
        t.cpu = to;
        Some(Some(to))
    })?;
    if let Some(c) = moved {
        nudge(c);
    }
    Some(moved.is_some())
}

/// Of the CPUs of `mask` that are up, the one with the fewest threads
/// that have not ended (the lowest index among equals; 0 when none is up).
fn place_among(tasks: &[Option<Task>; MAX_TASKS], mask: u64) -> u8 {
    let cpus = (crate::smp::online() as usize).clamp(1, MAX_CPUS);
    let mut load = [0u32; MAX_CPUS];
    for t in tasks.iter().flatten().filter(|t| !t.state.ended()) {
        if let Some(l) = load.get_mut(usize::from(t.cpu)) {
            *l += 1;
        }
    }
    (0..cpus)
        .filter(|&c| allows(mask, c as u8))
        .min_by_key(|&c| (load[c], c))
        .unwrap_or(0) as u8
}

/// Thread `id` set its name: the stream is told again.
pub fn rename(id: u8, comm: [u8; 16]) {
    update(id, |t| {
        t.comm = comm;
        t.announced = false;
        t.since_ns = crate::time::now_ns();
    });
}

/// Makes thread `id` ready again if it waits (blocked, or sleeping to a
/// deadline), with `rax` as its system call's result. Returns whether it
/// waited.
pub fn wake(id: u8, rax: u64) -> bool {
    let woken = critical_section::with(|cs| {
        let mut tasks = TASKS.borrow_ref_mut(cs);
        let Some(Some(t)) = tasks.get_mut(id as usize) else {
            return None;
        };
        if !matches!(t.state, TaskState::Blocked | TaskState::Sleeping(_)) {
            return None;
        }
        t.state = TaskState::Ready;
        // SAFETY: the thread waits, so it does not run: the frame at the
        // top of its kernel stack is its saved user frame, and nothing
        // else refers to it now.
        unsafe { (*frame_ptr(id as usize)).rax = rax };
        ready_on(&mut tasks, id)
    });
    woken.map(nudge).is_some()
}

/// Ends every other thread of `id`'s process with `state` (a fatal
/// signal, a fault or `exit_group` ends the whole thread group).
fn end_siblings(id: u8, state: TaskState) {
    let Some(task) = get(id) else {
        return;
    };
    let mut ended = heapless::Vec::<u8, MAX_TASKS>::new();
    critical_section::with(|cs| {
        for (i, t) in TASKS.borrow_ref_mut(cs).iter_mut().enumerate() {
            if let Some(t) = t
                && i != id as usize
                && t.proc == task.proc
                && !t.state.ended()
            {
                t.state = state;
                ENDED_BY_SIBLING[i].store(true, Ordering::Release);
                // Cannot fail: one entry per task.
                let _ = ended.push(i as u8);
            }
        }
    });
    // One running elsewhere leaves ring 3 at its CPU's next trap: now.
    for i in ended {
        if let Some(cpu) = running_on(i) {
            nudge(cpu);
        }
    }
}

/// Ends every other thread of `id`'s process (its `execve`): returns
/// whether one still runs on another CPU, which leaves ring 3 at that
/// CPU's next trap (made now); the caller tries again once none does.
pub fn end_other_threads(id: u8) -> bool {
    end_siblings(id, TaskState::Exited(0));
    let Some(task) = get(id) else {
        return false;
    };
    threads_of(task.proc)
        .iter()
        .any(|&i| i != id && running_on(i).is_some())
}

/// Thread `id`, the only one left of its process, runs a new program
/// (`execve`): `space` replaces the process's address space (made current
/// on this CPU, the NMI's stack window moved to the new main stack whose
/// lowest present page is `stack_low`), the thread is named `comm` and
/// runs `abi`'s code from `entry`, and the next Task record of it says it
/// exec'd. Returns the old space, for the caller to drop once no lock is
/// held.
pub fn exec_replace(
    id: u8,
    space: AddressSpace,
    stack_low: u64,
    abi: Abi,
    entry: u64,
    comm: [u8; 16],
) -> Option<AddressSpace> {
    let old = with_thread(id, |t, p| {
        // The NMI walks no user stack while the space changes under it.
        set_walk((0, 0));
        let old = core::mem::replace(&mut p.space, space);
        p.space.activate();
        p.stack_low = stack_low;
        t.stack_top = None;
        t.segs = crate::cpu::UserSegments::default();
        set_walk(walk_window(t, p));
        old
    })?;
    update(id, |t| {
        t.spec.abi = abi;
        t.spec.entry = entry;
        t.comm = comm;
        t.origin = match t.origin {
            Origin::Made { ppid, ptid } | Origin::MadeThenExec { ppid, ptid } if !t.announced => {
                Origin::MadeThenExec { ppid, ptid }
            }
            _ => Origin::Exec,
        };
        t.announced = false;
        t.since_ns = crate::time::now_ns();
    });
    Some(old)
}

/// Frees the slot of thread `id`, which ended, so that a later thread can
/// have it: a program that makes and joins threads one after another must
/// never run out of slots. While the stream tells of tasks, a thread keeps
/// it until the stream was told of the thread and of its end (see
/// [`end_told`]), so that every thread is in the profile and
/// its tid ends before a new thread takes it. A process's first
/// thread keeps its slot (the process is indexed by it) until the run
/// ends, but for a forked process's: that goes, with the process's
/// memory, once the driver heard of the process's end and no other thread
/// of it holds a slot, so that a shell running command after command never
/// runs out (its pid, while a zombie, is given to no one: see
/// [`free_slot_but`]).
fn release_thread_slot(id: u8) {
    let gone = critical_section::with(|cs| {
        let mut tasks = TASKS.borrow_ref_mut(cs);
        let t = (*tasks.get(id as usize)?)?;
        if !t.state.ended() || (TOLD.load(Ordering::Relaxed) && !t.end_told) {
            return None;
        }
        let first = t.proc == id;
        if first
            && (!t.forked
                || !REAPED[id as usize].load(Ordering::Relaxed)
                || tasks
                    .iter()
                    .enumerate()
                    .any(|(i, o)| i != id as usize && o.is_some_and(|o| o.proc == id)))
        {
            return None;
        }
        tasks[id as usize] = None;
        THREADS.borrow_ref_mut(cs)[id as usize] = None;
        POSTED[id as usize].store(0, Ordering::Relaxed);
        BLOCKED[id as usize].store(0, Ordering::Relaxed);
        // Its process goes with the last thread; dropped below, with no
        // lock held (its memory may be in use on another CPU's TLB).
        let proc = if first {
            PROCS.borrow_ref_mut(cs)[id as usize].take()
        } else {
            None
        };
        Some((t.proc, proc))
    });
    let Some((proc, gone)) = gone else {
        return;
    };
    drop(gone);
    // A process whose last other thread went may go too.
    if proc != id {
        release_thread_slot(proc);
    }
}

/// True when every thread of process `proc` has ended and none still
/// runs on a CPU (one ended by another CPU leaves ring 3 at its next trap).
fn all_ended(proc: u8) -> bool {
    let threads = critical_section::with(|cs| {
        let tasks = TASKS.borrow_ref(cs);
        let mut of = heapless::Vec::<u8, MAX_TASKS>::new();
        for (i, t) in tasks.iter().enumerate() {
            match t {
                Some(t) if t.proc == proc && !t.state.ended() => return None,
                // Cannot fail: one entry per task.
                Some(t) if t.proc == proc => drop(of.push(i as u8)),
                _ => {}
            }
        }
        Some(of)
    });
    threads.is_some_and(|of| of.iter().all(|&i| running_on(i).is_none()))
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
        for (p, b) in POSTED.iter().zip(&BLOCKED) {
            p.store(0, Ordering::Relaxed);
            b.store(0, Ordering::Relaxed);
        }
        for p in &PID_OF_TID {
            p.store(0, Ordering::Relaxed);
        }
        *THREADS.borrow_ref_mut(cs) = [const { None }; MAX_TASKS];
        *PROCS.borrow_ref_mut(cs) = [const { None }; MAX_TASKS];
    });
}

/// The current task, if a task is current.
pub fn current() -> Option<u8> {
    match crate::cpu::this().current_task.load(Ordering::Relaxed) {
        NO_TASK => None,
        id => Some(id),
    }
}

/// Records why the current task leaves; called by the trap handler.
pub fn set_outcome(o: Outcome) {
    critical_section::with(|cs| outcome().borrow(cs).set(Some(o)));
}

/// Runs task `id` until it leaves to the scheduler, and applies the outcome.
pub fn run_once(id: u8) -> Option<Outcome> {
    let task = get(id)?;
    if task.state != TaskState::Ready {
        return None;
    }
    let slot = id as usize;
    let top = kstack_top(slot);
    critical_section::with(|cs| outcome().borrow(cs).set(None));
    crate::cpu::set_kernel_stack(top);
    with_thread(id, |t, p| {
        p.space.activate();
        crate::cpu::load_user_segments(&t.segs);
        t.fpu.restore();
        set_walk(walk_window(t, p));
    });
    let cpu = crate::cpu::this();
    cpu.current_task.store(id, Ordering::Relaxed);
    // The program runs without the kernel lock; the trap that brings it
    // back to the scheduler takes it again.
    let depth = crate::cpu::kernel_release();
    // SAFETY: the frame at the top of this task's kernel stack was written by
    // `install` or by the entry stubs when the task last entered the runtime;
    // this CPU's kernel stack ends with that frame.
    unsafe { entry::enter_user(frame_ptr(slot)) };
    crate::cpu::kernel_restore(depth);
    // Release: the samples this CPU took in the task are in its ring
    // before anyone sees it leave (see `take_unannounced_ends`).
    cpu.current_task.store(NO_TASK, Ordering::Release);
    let (fs, gs) = crate::cpu::saved_selectors();
    with_thread(id, |t, _| {
        t.segs.fs = fs;
        t.segs.gs = gs;
        t.fpu.save();
    });
    let outcome = critical_section::with(|cs| outcome().borrow(cs).take());
    apply(id, outcome);
    outcome
}

/// Records what `outcome` does to thread `id` and, for an end of its
/// process, to its other threads.
fn apply(id: u8, outcome: Option<Outcome>) {
    update(id, |t| match outcome {
        Some(Outcome::Yield) => t.yields += 1,
        Some(Outcome::Exit(code) | Outcome::ThreadExit(code)) => t.state = TaskState::Exited(code),
        Some(Outcome::Fault(f)) => t.state = TaskState::Faulted(f),
        Some(Outcome::Sleep(until)) => t.state = TaskState::Sleeping(until),
        Some(Outcome::Preempted) => t.preemptions += 1,
        Some(Outcome::Block) => t.state = TaskState::Blocked,
        Some(Outcome::Signal(sig)) => t.state = TaskState::Signaled(sig),
        None => {}
    });
    match outcome {
        // The thread group ends with it.
        Some(Outcome::Exit(code)) => end_siblings(id, TaskState::Exited(code)),
        Some(Outcome::Fault(f)) => end_siblings(id, TaskState::Faulted(f)),
        Some(Outcome::Signal(sig)) => end_siblings(id, TaskState::Signaled(sig)),
        _ => {}
    }
}

/// Runs `f` on the saved user frame of thread `id`, which does not run
/// (it is ready, blocked or sleeping).
pub fn with_saved_frame<R>(id: u8, f: impl FnOnce(&mut TrapFrame) -> R) -> Option<R> {
    let t = get(id)?;
    if t.state.ended() || running_on(id).is_some() {
        return None;
    }
    // SAFETY: the thread exists and is not the one running (the runtime is
    // not preemptible and runs one thread at a time), so the frame at the
    // top of its kernel stack is its saved user frame and nothing else
    // refers to it while `f` runs.
    Some(f(unsafe { &mut *frame_ptr(id as usize) }))
}

/// The range the NMI's frame-pointer walk may read while thread `t` of
/// `p` runs: the main stack's present pages for a first thread, the
/// present pages below the stack top `clone` gave another (scanned now,
/// and grown by [`grow_window`] as it faults pages in), the image's data
/// for a built-in program.
fn walk_window(t: &mut Thread, p: &Process) -> (u64, u64) {
    match (&p.linux, t.stack_top) {
        (Some(_), Some(top)) => {
            let mut low = top;
            let floor = top.saturating_sub(WINDOW_SCAN_PAGES * PAGE);
            while low > floor && p.space.entry(low - PAGE) & PRESENT != 0 {
                low -= PAGE;
            }
            t.stack_low = low;
            (low, top)
        }
        (Some(l), None) => (p.stack_low, l.layout.stack_top),
        (None, _) => crate::mm::layout().user_data,
    }
}

/// After thread `id` (the current one) brought in `page`: a page just
/// below its stack window joins it, and the walk sees it at once.
pub fn grow_window(id: u8, page: u64) {
    let window = with_thread(id, |t, _| {
        let top = t.stack_top?;
        (page + PAGE == t.stack_low && page >= top.saturating_sub(WINDOW_SCAN_PAGES * PAGE)).then(
            || {
                t.stack_low = page;
                (page, top)
            },
        )
    })
    .flatten();
    if let Some(w) = window {
        set_walk(w);
    }
}

/// Set while the walk was hidden by [`hide_window`].
static WINDOW_HIDDEN: AtomicBool = AtomicBool::new(false);

/// Before the current thread's system call drops pages (`munmap`,
/// `madvise`, a `brk` that shrinks), which may lie in a stack the NMI walks:
/// the walk reads no user stack until [`republish_window`].
pub fn hide_window() {
    set_walk((0, 0));
    WINDOW_HIDDEN.store(true, Ordering::Relaxed);
}

/// After a system call of thread `id`: if it hid the walk, its window is
/// scanned and published again ([`WalkRange::set`] never shows an NMI a
/// mix of two ranges).
pub fn republish_window(id: u8) {
    if !WINDOW_HIDDEN.swap(false, Ordering::Relaxed) {
        return;
    }
    if let Some(w) = with_thread(id, |t, p| walk_window(t, p)) {
        set_walk(w);
    }
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
fn wake_sleepers(now: u64, mut timed_out: impl FnMut(u8)) -> Option<u64> {
    let mut next: Option<u64> = None;
    let due: heapless::Vec<(u8, Option<u8>), MAX_TASKS> = critical_section::with(|cs| {
        let mut tasks = TASKS.borrow_ref_mut(cs);
        let mut due = heapless::Vec::<u8, MAX_TASKS>::new();
        for (id, t) in tasks.iter_mut().enumerate() {
            let Some(t) = t else { continue };
            let TaskState::Sleeping(until) = t.state else {
                continue;
            };
            if now >= until {
                t.state = TaskState::Ready;
                // Cannot fail: one entry per task.
                let _ = due.push(id as u8);
            } else {
                next = Some(next.map_or(until, |n: u64| n.min(until)));
            }
        }
        // Each on its CPU, or an idle one when that one is busy.
        due.into_iter()
            .map(|id| (id, ready_on(&mut tasks, id)))
            .collect()
    });
    for (id, cpu) in due {
        timed_out(id);
        if let Some(cpu) = cpu {
            nudge(cpu);
        }
    }
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
    /// Called once when the process of thread `id` has ended, because of
    /// that thread's `outcome`; `task` is the thread's bookkeeping from
    /// before the slice that ended it.
    fn ended(&mut self, id: u8, task: &Task, outcome: Outcome);
    /// Called when the deadline of sleeping thread `id` passed (a futex
    /// wait that timed out stops waiting).
    fn timed_out(&mut self, id: u8);
    /// Called before ready thread `id` runs (a signal that came while it
    /// did not run is taken now); an outcome ends it instead.
    fn before_run(&mut self, id: u8) -> Option<Outcome>;
    /// True while something the runtime keeps (an interval timer) will
    /// make a waiting thread ready: the run then idles rather than ends.
    fn timers_armed(&mut self) -> bool;
}

/// Runs every ready process round-robin, preempting each after its slice,
/// until none is ready or sleeping, or the driver stops it. With only
/// sleepers left the CPU idles in `hlt` (the tick wakes it).
pub fn run_all(driver: &mut impl Driver) {
    crate::cpu::kernel_lock();
    let ticking = tick::start();
    let mut next = 0usize;
    loop {
        if driver.stop() {
            break;
        }
        let sleeper = wake_sleepers(arch_x86::cpu::rdtsc(), |id| driver.timed_out(id));
        let ready = next_ready(next);
        match ready {
            Some(i) => {
                tick::new_slice();
                run_slice(i, driver);
                push_waiting();
                next = i + 1;
            }
            // Something will make a thread here ready: a deadline, a
            // timer, or a thread on another CPU.
            None if (sleeper.is_some() || driver.timers_armed() || others_busy()) && ticking => {
                driver.idle();
                idle();
            }
            None => break,
        }
    }
    tick::stop();
    crate::cpu::kernel_unlock();
}

/// Whether a thread that has not ended belongs to a CPU other than this one.
fn others_busy() -> bool {
    let me = this_cpu();
    critical_section::with(|cs| {
        TASKS
            .borrow_ref(cs)
            .iter()
            .flatten()
            .any(|t| t.cpu != me && !t.state.ended())
    })
}

/// The first ready task of this CPU at or after `from`, round-robin.
fn next_ready(from: usize) -> Option<usize> {
    let me = this_cpu();
    (0..MAX_TASKS)
        .map(|i| (from + i) % MAX_TASKS)
        .find(|&i| {
            get(i as u8).is_some_and(|t| t.state == TaskState::Ready && t.cpu == me)
                // Never one that another CPU still runs.
                && running_on(i as u8).is_none()
        })
        .or_else(steal)
}

/// With `sched=spread`, on a CPU with nothing to run: takes over a thread
/// that waits for another CPU, one busy running another thread, so that
/// no CPU idles while a thread waits for a turn elsewhere.
fn steal() -> Option<usize> {
    if !spread() {
        return None;
    }
    let me = this_cpu();
    critical_section::with(|cs| {
        let mut tasks = TASKS.borrow_ref_mut(cs);
        let i = (0..MAX_TASKS).find(|&i| {
            tasks[i].is_some_and(|t| {
                t.state == TaskState::Ready
                    && t.cpu != me
                    && allows(t.affinity, me)
                    && cpu_busy(t.cpu)
            }) && running_on(i as u8).is_none()
        })?;
        if let Some(t) = tasks[i].as_mut() {
            t.cpu = me;
        }
        Some(i)
    })
}

/// Runs ready task `i` for one slice (or applies what `before_run` says
/// instead), and tells the driver when that ended its process.
fn run_slice(i: usize, driver: &mut impl Driver) {
    let task = get(i as u8);
    let outcome = match driver.before_run(i as u8) {
        Some(o) => {
            apply(i as u8, Some(o));
            Some(o)
        }
        None => run_once(i as u8),
    };
    let Some(task) = task else {
        return;
    };
    // Ended by its own outcome, or meanwhile by another CPU's thread.
    let Some(state) = get(i as u8).map(|t| t.state).filter(|s| s.ended()) else {
        return;
    };
    let o = match (outcome, state) {
        (Some(o @ (Outcome::Exit(_) | Outcome::Fault(_) | Outcome::Signal(_))), _)
        | (Some(o @ Outcome::ThreadExit(_)), _) => o,
        (_, TaskState::Faulted(f)) => Outcome::Fault(f),
        (_, TaskState::Signaled(sig)) => Outcome::Signal(sig),
        (_, TaskState::Exited(code)) => Outcome::Exit(code),
        _ => return,
    };
    if all_ended(task.proc) {
        // Once, by whichever CPU stops the process's last running thread.
        if !REAPED[usize::from(task.proc)].swap(true, Ordering::Relaxed) {
            driver.ended(i as u8, &task, o);
            release_thread_slot(i as u8);
            release_thread_slot(task.proc);
        }
    } else if let Outcome::ThreadExit(_) = o {
        release_thread_slot(i as u8);
    }
}

/// On a CPU other than the boot CPU: runs the tasks pinned to it, one
/// slice each, round-robin, with this CPU's tick running, for as long as
/// one is ready; then stops the tick and returns whether any ran (the
/// caller waits for work: a kick).
pub fn run_pinned(driver: &mut impl Driver) -> bool {
    crate::cpu::kernel_lock();
    let mut next = 0;
    let mut ran = false;
    while let Some(i) = next_ready(next) {
        if !ran {
            tick::start();
        }
        tick::new_slice();
        run_slice(i, driver);
        push_waiting();
        next = i + 1;
        ran = true;
    }
    if ran {
        tick::stop();
    }
    crate::cpu::kernel_unlock();
    ran
}

/// Halts until the next interrupt (the tick), then returns with interrupts off.
pub(crate) fn idle() {
    let depth = crate::cpu::kernel_release();
    // SAFETY: `sti; hlt` enables interrupts only for the halt: the tick (or
    // an NMI) ends it, and the trap handler acknowledges the tick from
    // kernel mode without switching anything. `cli` follows at once.
    unsafe { core::arch::asm!("sti", "hlt", "cli", options(nomem, nostack)) };
    crate::cpu::kernel_restore(depth);
}
