//! Taking ownership of the CPU: GDT with TSS and IST stacks, the IDT, the
//! SYSCALL MSRs, and the protection features (NX, SMEP, SMAP, WP).

use crate::entry;
use arch_x86::cpu::{self, Features};
use arch_x86::gdt::{self, GDT_ENTRIES, TaskStateSegment};
use arch_x86::idt::{Idt, IdtEntry};
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, Ordering};

const IST_STACK_SIZE: usize = 32 * 1024;

#[repr(C, align(16))]
struct Stack<const N: usize>(UnsafeCell<[u8; N]>);

// SAFETY: the stacks are only used by the CPU through the TSS; Rust code
// never forms references to their contents.
unsafe impl<const N: usize> Sync for Stack<N> {}

impl<const N: usize> Stack<N> {
    const fn new() -> Self {
        Self(UnsafeCell::new([0; N]))
    }
    fn top(&self) -> u64 {
        self.0.get() as u64 + N as u64
    }
}

/// A value the CPU reads from memory (GDT, TSS, IDT), written only during setup
/// and, for the TSS, when switching tasks.
#[repr(C, align(16))]
struct CpuTable<T>(UnsafeCell<T>);

// SAFETY: single core; written only with interrupts off and never from NMI context.
unsafe impl<T> Sync for CpuTable<T> {}

static NMI_STACK: Stack<IST_STACK_SIZE> = Stack::new();
static DF_STACK: Stack<IST_STACK_SIZE> = Stack::new();
static MC_STACK: Stack<IST_STACK_SIZE> = Stack::new();

static TSS: CpuTable<TaskStateSegment> = CpuTable(UnsafeCell::new(TaskStateSegment::new()));
static GDT: CpuTable<[u64; GDT_ENTRIES]> = CpuTable(UnsafeCell::new([0; GDT_ENTRIES]));
static IDT: CpuTable<Idt> = CpuTable(UnsafeCell::new(Idt::new()));

static SMAP_ON: AtomicBool = AtomicBool::new(false);

/// The GDT as built (for the self-test).
pub fn gdt_base() -> u64 {
    GDT.0.get() as u64
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

/// A copy of the GDT (for the self-test).
pub fn gdt_copy() -> [u64; GDT_ENTRIES] {
    // SAFETY: read of a table written once in `init` (the CPU may set the TSS busy bit).
    unsafe { core::ptr::read_volatile(GDT.0.get()) }
}

/// Loads the GDT/TSS and IDT and programs SYSCALL. Call once, early.
pub fn init() {
    // SAFETY: boot code, interrupts off, single core. The tables are statics
    // that live forever, built completely before they are loaded.
    unsafe {
        let tss = &mut *TSS.0.get();
        tss.ist[usize::from(gdt::IST_NMI) - 1] = NMI_STACK.top();
        tss.ist[usize::from(gdt::IST_DOUBLE_FAULT) - 1] = DF_STACK.top();
        tss.ist[usize::from(gdt::IST_MACHINE_CHECK) - 1] = MC_STACK.top();
        *GDT.0.get() = gdt::build(TSS.0.get() as u64);
        gdt::load(GDT.0.get());

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
        arch_x86::idt::load(IDT.0.get());

        use x86::msr::{IA32_EFER, IA32_FMASK, IA32_LSTAR, IA32_STAR, rdmsr, wrmsr};
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
    f
}

/// True when SMAP is on.
pub fn smap_on() -> bool {
    SMAP_ON.load(Ordering::Relaxed)
}

/// Sets the stack the CPU loads on entry from ring 3.
pub fn set_rsp0(top: u64) {
    // SAFETY: single core; the CPU reads rsp0 only on a privilege change,
    // which cannot happen while the runtime runs this store.
    unsafe { core::ptr::write_volatile(&raw mut (*TSS.0.get()).rsp0, top) };
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
