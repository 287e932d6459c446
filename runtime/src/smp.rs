//! Starting the other CPUs (application processors, APs): the ACPI MADT
//! lists them, and each is started with INIT and two start-up IPIs, as the
//! Intel SDM's MP initialization protocol describes (vol. 3, "MP
//! Initialization Protocol Algorithm for MP Systems").
//!
//! A start-up IPI starts a CPU in real mode at a page below 1 MiB. The
//! trampoline copied there takes it to protected mode, then to long mode
//! on page tables that map that page and the runtime's upper half, then
//! jumps into the runtime, which switches to the kernel's page tables and
//! runs [`ap_main`] on a stack of the CPU's own. Each CPU gets its own
//! GDT, TSS and IST stacks and its block ([`CpuLocal`]) at its GS base.
//!
//! A started CPU loads its tables, enables its local APIC with every local
//! interrupt masked, says it is up, and then does its work ([`set_work`]:
//! the tasks pinned to it, under its own tick) over and over, halting in
//! between until [`kick`] wakes it (an NMI ends the halt too, but sends it
//! looking for work only after a kick). Where threads run is `proc`'s
//! business (`sched=spread`, or the self-test's `proc::pin`).

use crate::cpu::{self, CpuLocal, CpuTables, IST_STACK_SIZE};
use alloc::boxed::Box;
use arch_x86::bootinfo::MemRegion;
use arch_x86::gdt;
use arch_x86::lapic::{self, ApicMode, LocalApic};
use arch_x86::madt::{self, MAX_CPUS, MadtError};
use arch_x86::paging::{self, phys_to_virt};
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicUsize, Ordering};

/// Where the trampoline goes: its code and data page, then the page
/// tables it runs on (a PML4, a PDPT and a PD). The start-up IPI names the
/// first page (`0x08`: the CPU starts at 0800:0000).
const TRAMPOLINE: u64 = 0x8000;
/// Bytes from [`TRAMPOLINE`] the four pages span.
const TRAMPOLINE_LEN: u64 = 4 * 4096;
/// Offset of the data the runtime fills in for each CPU it starts.
const DATA: u64 = 0xf00;
/// Offsets in the data: EFER bits to set, the stack top, the CPU's block,
/// the kernel's page-table root, the runtime entry, and the three IST tops.
const D_EFER: u64 = 0x00;
const D_STACK: u64 = 0x08;
const D_LOCAL: u64 = 0x10;
const D_ROOT: u64 = 0x18;
const D_ENTRY: u64 = 0x20;
const D_IST: u64 = 0x28;
/// Offsets in the data of the trampoline's GDT (null, 32-bit code at 0x08,
/// data at 0x10, 64-bit code at 0x18) and of the pointer `lgdt` loads.
const D_GDT: u64 = 0x40;
const D_GDTR: u64 = 0x60;
/// The trampoline's GDT.
const TRAMPOLINE_GDT: [u64; 4] = [0, gdt::code32(0), gdt::data(0), gdt::code64(0)];

/// Bytes of each started CPU's own runtime stack.
const AP_STACK_SIZE: usize = 64 * 1024;

core::arch::global_asm!(
    r#"
    .section .rodata.perch_ap, "a"
    .balign 16
    .global perch_ap_start
perch_ap_start:
    .code16
    cli
    cld
    xor ax, ax
    mov ds, ax
    lgdt [{tramp} + {data} + {d_gdtr}]
    mov eax, cr0
    or eax, 1
    mov cr0, eax
    .byte 0x66, 0xea
    .long {tramp} + perch_ap_32 - perch_ap_start
    .word 0x08

    .code32
perch_ap_32:
    mov ax, 0x10
    mov ds, ax
    mov es, ax
    mov ss, ax
    mov eax, cr4
    or eax, 0x20
    mov cr4, eax
    mov eax, {tramp} + 0x1000
    mov cr3, eax
    mov ecx, 0xc0000080
    rdmsr
    or eax, dword ptr [{tramp} + {data} + {d_efer}]
    wrmsr
    mov eax, cr0
    or eax, 0x80010000
    mov cr0, eax
    .byte 0xea
    .long {tramp} + perch_ap_64 - perch_ap_start
    .word 0x18

    .code64
perch_ap_64:
    mov ax, 0x10
    mov ds, ax
    mov es, ax
    mov ss, ax
    xor eax, eax
    mov fs, ax
    mov gs, ax
    mov eax, {tramp} + {data}
    mov rsp, [rax + {d_stack}]
    mov rdi, [rax + {d_local}]
    mov rdx, [rax + {d_root}]
    mov rcx, [rax + {d_entry}]
    jmp rcx
    .global perch_ap_end
perch_ap_end:

    .section .text.perch_ap, "ax"
    .global perch_ap_entry64
perch_ap_entry64:
    mov cr3, rdx
    xor ebp, ebp
    call {ap_main}
    ud2
    "#,
    tramp = const TRAMPOLINE,
    data = const DATA,
    d_efer = const D_EFER,
    d_stack = const D_STACK,
    d_local = const D_LOCAL,
    d_root = const D_ROOT,
    d_entry = const D_ENTRY,
    d_gdtr = const D_GDTR,
    ap_main = sym ap_main,
);

unsafe extern "C" {
    static perch_ap_start: u8;
    static perch_ap_end: u8;
    fn perch_ap_entry64();
}

/// The blocks of the CPUs that are up, by index (0: the boot CPU).
static CPUS: [AtomicPtr<CpuLocal>; MAX_CPUS] =
    [const { AtomicPtr::new(core::ptr::null_mut()) }; MAX_CPUS];
/// How many CPUs are up (the boot CPU included).
static ONLINE: AtomicU32 = AtomicU32::new(1);
/// How many CPUs `start` meant to have up: the MADT's, within `smp=`.
static WANTED: AtomicU32 = AtomicU32::new(1);
/// Whether the boot CPU's APIC is in x2APIC mode (the started CPUs follow).
static X2APIC: AtomicBool = AtomicBool::new(false);
/// The boot CPU's APIC ID, as its local APIC gave it to [`start`]
/// (`u32::MAX`, the broadcast ID, until then).
static BOOT_APIC_ID: AtomicU32 = AtomicU32::new(u32::MAX);

/// The vector of the IPI that wakes a CPU waiting for work.
pub const WAKE_VECTOR: u8 = 0xf0;

/// What a started CPU does once up, as a `fn()` (0: nothing yet).
static WORK: AtomicUsize = AtomicUsize::new(0);

/// Sets what every started CPU does, over and over, once up: `work` runs
/// with interrupts off and returns when it has nothing left; the CPU then
/// halts until [`kick`] (or an NMI) wakes it. Set before [`start`].
pub fn set_work(work: fn()) {
    WORK.store(work as usize, Ordering::Release);
}

/// What a started CPU runs for itself once on its own tables, before it
/// reports itself up, as a `fn(&'static CpuLocal)` (0: nothing).
static ON_START: AtomicUsize = AtomicUsize::new(0);

/// Sets what every started CPU runs for itself once, interrupts off, with
/// its local APIC enabled and its LVT entries masked, before it reports
/// itself up (the PMU layer programs the CPU's own counters there). Set
/// before [`start`].
pub fn set_on_start(f: fn(&'static CpuLocal)) {
    ON_START.store(f as usize, Ordering::Release);
}

/// Wakes CPU `index` (not this one) to look for work.
pub fn kick(index: u32) {
    let Some(c) = cpu(index).filter(|c| !core::ptr::eq(*c, crate::cpu::this())) else {
        return;
    };
    if let Some(k) = KICKED.get(index as usize) {
        k.store(true, Ordering::Release);
    }
    // SAFETY: ring 0; the direct map covers the APIC window, uncached.
    let apic = unsafe { LocalApic::from_msr() };
    apic.send_ipi(c.apic_id(), lapic::icr_fixed(WAKE_VECTOR));
}

/// Set by [`kick`] for the CPU it wakes, cleared by that CPU when it
/// looks for work.
static KICKED: [AtomicBool; MAX_CPUS] = [const { AtomicBool::new(false) }; MAX_CPUS];

/// Acknowledges a fixed IPI on this CPU (the wake or the TLB shootdown).
pub fn ack_ipi() {
    // SAFETY: ring 0; the direct map covers the APIC window, uncached.
    unsafe { LocalApic::from_msr() }.eoi();
}

/// How many CPUs are up.
pub fn online() -> u32 {
    ONLINE.load(Ordering::Acquire)
}

/// How many CPUs the MADT lists, within `smp=` (1 when it could not be read).
pub fn wanted() -> u32 {
    WANTED.load(Ordering::Relaxed)
}

/// The APIC ID of CPU `index`, if it is up: the boot CPU's as its local
/// APIC gave it (as CPUID gives it when [`start`] found no APIC), the
/// others' as the MADT listed them.
pub fn apic_id(index: u32) -> Option<u32> {
    if index != 0 {
        return cpu(index).map(|c| c.apic_id());
    }
    Some(match BOOT_APIC_ID.load(Ordering::Relaxed) {
        u32::MAX => arch_x86::topology::apic_id(&arch_x86::cpuid::CpuCpuid),
        id => id,
    })
}

/// The block of CPU `index`, if it is up.
pub fn cpu(index: u32) -> Option<&'static CpuLocal> {
    if index == 0 {
        return Some(cpu::boot_cpu());
    }
    let p = CPUS.get(index as usize)?.load(Ordering::Acquire);
    // SAFETY: a non-null entry is a leaked, never-freed block.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// Why no other CPU was started.
#[derive(Clone, Copy, Debug)]
pub enum SmpError {
    /// The MADT could not be read.
    Madt(MadtError),
    /// The trampoline's pages are not RAM the boot left free.
    NoLowMemory,
    /// The local APIC is disabled.
    NoApic,
    /// The trampoline's code runs into its data (a build error).
    TrampolineTooLong,
}

impl core::fmt::Display for SmpError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SmpError::Madt(e) => write!(f, "{e}"),
            SmpError::NoLowMemory => write!(
                f,
                "{TRAMPOLINE:#x}-{:#x} (the start-up code's pages) is not free RAM",
                TRAMPOLINE + TRAMPOLINE_LEN
            ),
            SmpError::NoApic => write!(f, "the local APIC is disabled"),
            SmpError::TrampolineTooLong => write!(f, "the start-up code runs into its data"),
        }
    }
}

/// What [`start`] did.
#[derive(Debug, Default)]
pub struct Report {
    /// Enabled CPUs the MADT lists (the boot CPU included).
    pub listed: u32,
    /// CPUs up now (the boot CPU included).
    pub online: u32,
    /// CPUs left out by `smp=`.
    pub left_out: u32,
    /// Enabled CPUs past the most the runtime keeps.
    pub over: u32,
    /// APIC IDs of CPUs that did not come up.
    pub failed: heapless::Vec<u32, MAX_CPUS>,
    /// Whether the APICs are in x2APIC mode.
    pub x2apic: bool,
    /// Why nothing was started, when nothing was.
    pub error: Option<SmpError>,
}

/// Starts the CPUs the MADT lists, at most `limit` in all (`smp=`), one
/// at a time. `rsdp` is the RSDP's physical address when the loader gave
/// it; `regions` and `reserved` are the boot memory map and the ranges the
/// boot still uses, to check that the trampoline's pages are free.
pub fn start(
    limit: Option<u32>,
    rsdp: Option<u64>,
    regions: &[MemRegion],
    reserved: &[(u64, u64)],
) -> Report {
    let mut report = Report {
        listed: 1,
        online: 1,
        ..Report::default()
    };
    // SAFETY: ring 0; the direct map covers the APIC window, uncached.
    let apic = unsafe { LocalApic::from_msr() };
    // SAFETY: IA32_APIC_BASE exists on every x86-64 CPU.
    let base = unsafe { x86::msr::rdmsr(lapic::IA32_APIC_BASE) };
    if ApicMode::of_enabled(base).is_none() {
        report.error = Some(SmpError::NoApic);
        return report;
    }
    report.x2apic = apic.mode() == ApicMode::X2Apic;
    X2APIC.store(report.x2apic, Ordering::Relaxed);
    // SAFETY: the direct map covers the ACPI tables and the BIOS areas
    // (they are below 4 GiB), which nothing writes; `rsdp` is the loader's.
    let cpus = match unsafe { madt::cpus(rsdp, phys_to_virt) } {
        Ok(c) => c,
        Err(e) => {
            report.error = Some(SmpError::Madt(e));
            return report;
        }
    };
    let me = apic.id32();
    BOOT_APIC_ID.store(me, Ordering::Relaxed);
    cpu::boot_cpu().set_apic_id(me);
    report.listed = cpus.apic_ids().len().max(1) as u32;
    report.over = cpus.over;
    let others = cpus.apic_ids().iter().copied().filter(|&id| id != me);
    let room = limit.unwrap_or(MAX_CPUS as u32).saturating_sub(1) as usize;
    report.left_out = others.clone().count().saturating_sub(room) as u32;
    WANTED.store(
        1 + others.clone().take(room).count() as u32,
        Ordering::Relaxed,
    );
    if room == 0 || others.clone().next().is_none() {
        return report;
    }
    if !low_pages_free(regions, reserved) {
        report.error = Some(SmpError::NoLowMemory);
        return report;
    }
    if !install_trampoline() {
        report.error = Some(SmpError::TrampolineTooLong);
        return report;
    }
    apic.software_enable();
    for id in others.take(room) {
        let index = online();
        match start_one(&apic, id, index) {
            Some(local) => {
                CPUS[index as usize]
                    .store(local as *const CpuLocal as *mut CpuLocal, Ordering::Release);
                ONLINE.store(index + 1, Ordering::Release);
            }
            None => {
                let _ = report.failed.push(id);
            }
        }
    }
    report.online = online();
    report
}

/// True when the trampoline's pages are usable RAM in the boot memory map
/// and no boot range (a module) overlaps them.
fn low_pages_free(regions: &[MemRegion], reserved: &[(u64, u64)]) -> bool {
    let (a, b) = (TRAMPOLINE, TRAMPOLINE + TRAMPOLINE_LEN);
    let ram = regions
        .iter()
        .any(|r| r.usable() && r.base <= a && r.base.saturating_add(r.len) >= b);
    ram && reserved.iter().all(|&(s, e)| e <= a || s >= b)
}

/// Copies the trampoline and builds the page tables it switches to: the
/// first 2 MiB identity-mapped (its own code), and the kernel's upper half.
/// False (and nothing written) if the code would run into its data.
fn install_trampoline() -> bool {
    let code_start = (&raw const perch_ap_start) as u64;
    let len = (&raw const perch_ap_end) as u64 - code_start;
    if len > DATA {
        return false;
    }
    let page = |i: u64| phys_to_virt(TRAMPOLINE + i * 4096) as *mut u64;
    // SAFETY: the four pages below 1 MiB are free RAM (`low_pages_free`),
    // which the frame allocator never hands out (`LOW_RESERVED`), reached
    // writable through the direct map; the code is `len` bytes of the
    // image, and `len` is below `DATA` (checked above).
    unsafe {
        core::ptr::copy_nonoverlapping(code_start as *const u8, page(0) as *mut u8, len as usize);
        let (pml4, pdpt, pd) = (page(1), page(2), page(3));
        core::ptr::write_bytes(pml4, 0, 3 * 512);
        let kernel = phys_to_virt(crate::mm::kernel_root()) as *const u64;
        for i in 256..512 {
            *pml4.add(i) = *kernel.add(i);
        }
        let table = paging::PRESENT | paging::WRITABLE;
        *pml4 = (TRAMPOLINE + 2 * 4096) | table;
        *pdpt = (TRAMPOLINE + 3 * 4096) | table;
        *pd = table | paging::HUGE;
    }
    true
}

/// A block of `size` bytes for good (stacks, tables), zeroed; `None`
/// when the heap has no room.
fn leak_zeroed(size: usize) -> Option<u64> {
    let layout = core::alloc::Layout::from_size_align(size, 4096).ok()?;
    // SAFETY: the layout's size is not zero.
    let p = unsafe { alloc::alloc::alloc_zeroed(layout) };
    (!p.is_null()).then_some(p as u64)
}

/// Starts the CPU with APIC ID `id` as CPU `index`; its block once it is
/// up, `None` when it did not come up within a second (it is then sent
/// INIT again, which holds it in wait-for-SIPI, so it never runs on data
/// the next CPU's start writes over) or there was no memory for its
/// stacks.
fn start_one(apic: &LocalApic, id: u32, index: u32) -> Option<&'static CpuLocal> {
    let stack = leak_zeroed(AP_STACK_SIZE)?;
    let ist = leak_zeroed(3 * IST_STACK_SIZE)?;
    let tables: &'static CpuTables = Box::leak(Box::new(CpuTables::new()));
    let local: &'static CpuLocal = Box::leak(Box::new(CpuLocal::new(index, id, tables)));
    if !cpu::prepare(local) {
        return None;
    }
    let ist_tops = [1u64, 2, 3].map(|i| ist + i * IST_STACK_SIZE as u64);
    let efer = arch_x86::cpu::EFER_LME
        | if crate::mm::nx() {
            arch_x86::cpu::EFER_NXE
        } else {
            0
        };
    let data = phys_to_virt(TRAMPOLINE + DATA) as *mut u64;
    // SAFETY: the data lies in the trampoline's first page (free RAM,
    // `install_trampoline`); no other CPU reads it until the IPIs below,
    // and the previous CPU finished with it (it was up, or timed out and
    // was sent INIT, which stops it before it can read it again).
    unsafe {
        let put = |off: u64, v: u64| data.add((off / 8) as usize).write_volatile(v);
        put(D_EFER, efer);
        put(D_STACK, stack + AP_STACK_SIZE as u64);
        put(D_LOCAL, local as *const CpuLocal as u64);
        put(D_ROOT, crate::mm::kernel_root());
        put(D_ENTRY, perch_ap_entry64 as *const () as u64);
        for (i, top) in ist_tops.iter().enumerate() {
            put(D_IST + 8 * i as u64, *top);
        }
        for (i, d) in TRAMPOLINE_GDT.iter().enumerate() {
            put(D_GDT + 8 * i as u64, *d);
        }
        // The pointer: a 16-bit limit, then the 32-bit base.
        put(
            D_GDTR,
            (TRAMPOLINE + DATA + D_GDT) << 16 | (8 * TRAMPOLINE_GDT.len() as u64 - 1),
        );
    }
    let page = (TRAMPOLINE >> 12) as u8;
    apic.send_ipi(id, lapic::icr_init());
    wait_us(10_000, || false);
    for _ in 0..2 {
        apic.send_ipi(id, lapic::icr_startup(page));
        if wait_us(200, || local.online.load(Ordering::Acquire)) {
            break;
        }
    }
    if wait_us(1_000_000, || local.online.load(Ordering::Acquire)) {
        return Some(local);
    }
    apic.send_ipi(id, lapic::icr_init());
    None
}

/// Waits up to `us` microseconds of TSC time for `done`; whether it came.
fn wait_us(us: u64, done: impl Fn() -> bool) -> bool {
    let ticks = crate::time::tsc_hz() / 1_000_000 * us;
    let start = arch_x86::cpu::rdtsc();
    while arch_x86::cpu::rdtsc().wrapping_sub(start) < ticks {
        if done() {
            return true;
        }
        core::hint::spin_loop();
    }
    done()
}

/// A started CPU's first Rust code, on its own stack, on the kernel's
/// page tables, interrupts off.
extern "C" fn ap_main(local: &'static CpuLocal) -> ! {
    let data = phys_to_virt(TRAMPOLINE + DATA + D_IST) as *const u64;
    // SAFETY: the starter wrote the IST tops before the IPIs and waits for
    // this CPU before it writes the data again.
    let ist = [0, 1, 2].map(|i| unsafe { data.add(i).read_volatile() });
    // SAFETY: this CPU, once, interrupts off, before any interrupt or NMI
    // can reach it; the block, its tables and the IST stacks were made
    // for it alone; the boot CPU built the IDT long before.
    unsafe { cpu::init_ap(local, ist) };
    cpu::enable_protection();
    // The boot CPU's APIC mode is the machine's: x2APIC too, if it is.
    // SAFETY: IA32_APIC_BASE exists; setting EXTD on an enabled xAPIC is
    // the SDM's switch to x2APIC mode, done only when the boot CPU is in it.
    unsafe {
        use x86::msr::{rdmsr, wrmsr};
        let boot = rdmsr(lapic::IA32_APIC_BASE);
        if X2APIC.load(Ordering::Relaxed) && boot & lapic::APIC_BASE_EXTD == 0 {
            wrmsr(
                lapic::IA32_APIC_BASE,
                boot | lapic::APIC_BASE_ENABLE | lapic::APIC_BASE_EXTD,
            );
        }
    }
    // SAFETY: ring 0; the direct map covers the APIC window, uncached.
    let apic = unsafe { LocalApic::from_msr() };
    apic.enable_masked(false);
    local.apic_id_seen.store(apic.id32(), Ordering::Relaxed);
    local
        .checks
        .store(cpu::loaded_checks(local), Ordering::Relaxed);
    match ON_START.load(Ordering::Acquire) {
        0 => {}
        f => {
            // SAFETY: a non-zero ON_START holds the fn pointer `set_on_start` stored.
            let f: fn(&'static CpuLocal) = unsafe { core::mem::transmute(f) };
            f(local);
        }
    }
    local.online.store(true, Ordering::Release);
    let kicked = &KICKED[local.index as usize];
    loop {
        let work = WORK.load(Ordering::Acquire);
        // Only a kick brings work: the NMIs that end the halt (the clock's
        // reach every CPU) do not send it looking for any.
        if work != 0 && kicked.swap(false, Ordering::AcqRel) {
            // SAFETY: a non-zero WORK holds a `fn()` stored by `set_work`.
            let work: fn() = unsafe { core::mem::transmute::<usize, fn()>(work) };
            work();
        }
        // SAFETY: `sti; hlt` enables interrupts only for the halt (a kick
        // that came while `work` ran is pending and ends it at once); the
        // trap handler acknowledges the wake IPI and returns here; `cli`
        // follows at once.
        unsafe { core::arch::asm!("sti", "hlt", "cli", options(nomem, nostack)) };
    }
}
