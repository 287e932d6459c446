//! Entry and exit stubs: the 256 IDT stubs, the SYSCALL entry, the NMI entry,
//! and the switch between the scheduler and a ring-3 task.
//!
//! Every path saves all 15 GPRs plus the hardware frame into one
//! [`TrapFrame`] layout. Entries from ring 3 (SYSCALL, `int 0x80`,
//! exceptions) build that frame at the top of the current task's kernel
//! stack, so it is the task's saved user frame (like Linux's task_pt_regs).
//!
//! Symbols bracket the windows in which that frame is incomplete: from the
//! first instruction of any entry to the point where every GPR is saved
//! (`perch_entry_window_start..perch_entry_window_end`), and from the first
//! restore to the `iretq` (`perch_exit_window_start..perch_exit_window_end`).
//! The NMI handler checks the interrupted RIP against them.
//!
//! # GS
//! While the runtime runs, GS is the CPU's own block
//! ([`crate::cpu::CpuLocal`]); while a process runs, it is the process's.
//! Every entry from ring 3 begins with `swapgs` and every exit to ring 3
//! ends with one, both inside the windows; an entry from ring 0 finds the
//! runtime's GS already in place. The NMI stub never swaps and its handler
//! never uses GS, since an NMI may land between an entry and its `swapgs`.
//!
//! # The upcalls
//!
//! This is the bottom of the runtime: the stubs call up into the layers
//! above through one named interface, three symbols that the top of the
//! runtime defines (`main.rs` checks each against its type here), and no
//! Rust import of a higher layer:
//!
//! | symbol | type | called |
//! | --- | --- | --- |
//! | `perch_upcall_trap` | [`TrapUpcall`] | every IDT vector but the NMI, and SYSCALL, once the frame is saved; returns [`RESUME`] or [`LEAVE`] |
//! | `perch_upcall_return` | [`ReturnUpcall`] | before every return to the frame it is about to restore (samples of `uregs=return` take their user registers from it) |
//! | `perch_upcall_nmi` | [`NmiUpcall`] | for every NMI, with its frame |
//!
//! A symbol rather than a pointer read at run time: the NMI path pays no
//! load and no indirect call for the seam (the three functions are
//! `#[inline(always)]`, so each symbol's body is the function itself).

use arch_x86::frame::TrapFrame;
use arch_x86::gdt;

/// Returned by the trap upcall: resume the interrupted context.
pub const RESUME: u64 = 0;
/// Returned by the trap upcall: leave to the scheduler.
pub const LEAVE: u64 = 1;

/// `perch_upcall_trap`: the Rust side of every entry but the NMI.
pub type TrapUpcall = extern "C" fn(&mut TrapFrame) -> u64;
/// `perch_upcall_return`: sees each frame just before it is restored.
pub type ReturnUpcall = extern "C" fn(&TrapFrame);
/// `perch_upcall_nmi`: the NMI handler.
pub type NmiUpcall = extern "C" fn(&mut TrapFrame);

/// Defines the three upcall symbols of the entry stubs from three
/// functions of the expected types. Used once, at the top of the runtime.
#[macro_export]
macro_rules! entry_upcalls {
    (trap: $trap:path, on_return: $ret:path, nmi: $nmi:path $(,)?) => {
        // Each symbol is a function of the upcall's type that calls (with
        // the callee inlined, so it costs nothing) the named function.
        #[unsafe(no_mangle)]
        extern "C" fn perch_upcall_trap(frame: &mut arch_x86::frame::TrapFrame) -> u64 {
            const F: $crate::entry::TrapUpcall = $trap;
            F(frame)
        }
        #[unsafe(no_mangle)]
        extern "C" fn perch_upcall_return(frame: &arch_x86::frame::TrapFrame) {
            const F: $crate::entry::ReturnUpcall = $ret;
            F(frame)
        }
        #[unsafe(no_mangle)]
        extern "C" fn perch_upcall_nmi(frame: &mut arch_x86::frame::TrapFrame) {
            const F: $crate::entry::NmiUpcall = $nmi;
            F(frame)
        }
    };
}

/// Size of one IDT stub; stub `v` is at `perch_isr_table + v * ISR_STUB_SIZE`.
pub const ISR_STUB_SIZE: u64 = 16;

core::arch::global_asm!(
    r#"
    .section .text.entry, "ax"
    .code64

    .global perch_entry_window_start
perch_entry_window_start:

    .balign 16
    .global perch_isr_table
perch_isr_table:
    .set perch_vec, 0
    .rept 256
    .balign 16
    .if (perch_vec == 8) || (perch_vec == 10) || (perch_vec == 11) || (perch_vec == 12) || (perch_vec == 13) || (perch_vec == 14) || (perch_vec == 17) || (perch_vec == 21) || (perch_vec == 29) || (perch_vec == 30)
    .else
    push 0
    .endif
    push perch_vec
    jmp perch_trap_common
    .set perch_vec, perch_vec + 1
    .endr

    .balign 16
    .global perch_syscall_entry
perch_syscall_entry:
    swapgs
    mov gs:[{scratch}], rsp
    mov rsp, gs:[{kstack}]
    push {udata}
    push qword ptr gs:[{scratch}]
    push r11
    push {ucode64}
    push rcx
    push 0
    push {syscall_vec}
    jmp perch_trap_save

perch_trap_common:
    // The CS the CPU pushed: from ring 3, take the runtime's GS.
    test byte ptr [rsp + 24], 3
    jz perch_trap_save
    swapgs
perch_trap_save:
    push rax
    push rbx
    push rcx
    push rdx
    push rsi
    push rdi
    push rbp
    push r8
    push r9
    push r10
    push r11
    push r12
    push r13
    push r14
    push r15
    .global perch_entry_window_end
perch_entry_window_end:
    cld
    mov rdi, rsp
    call perch_upcall_trap
    test rax, rax
    jnz perch_leave_to_scheduler

perch_return:
    mov rdi, rsp
    call perch_upcall_return

    .global perch_exit_window_start
perch_exit_window_start:
    pop r15
    pop r14
    pop r13
    pop r12
    pop r11
    pop r10
    pop r9
    pop r8
    pop rbp
    pop rdi
    pop rsi
    pop rdx
    pop rcx
    pop rbx
    pop rax
    add rsp, 16
    // Back to ring 3: give the process its GS.
    test byte ptr [rsp + 8], 3
    jz 2f
    swapgs
2:
    iretq
    .global perch_exit_window_end
perch_exit_window_end:

perch_leave_to_scheduler:
    mov rsp, gs:[{resume}]
    pop r15
    pop r14
    pop r13
    pop r12
    pop rbx
    pop rbp
    ret

    .global perch_enter_user
perch_enter_user:
    push rbp
    push rbx
    push r12
    push r13
    push r14
    push r15
    mov gs:[{resume}], rsp
    mov rsp, rdi
    cld
    jmp perch_return

    .balign 16
    .global perch_nmi_entry
perch_nmi_entry:
    push 0
    push 2
    push rax
    push rbx
    push rcx
    push rdx
    push rsi
    push rdi
    push rbp
    push r8
    push r9
    push r10
    push r11
    push r12
    push r13
    push r14
    push r15
    cld
    mov rdi, rsp
    call perch_upcall_nmi
    pop r15
    pop r14
    pop r13
    pop r12
    pop r11
    pop r10
    pop r9
    pop r8
    pop rbp
    pop rdi
    pop rsi
    pop rdx
    pop rcx
    pop rbx
    pop rax
    add rsp, 16
    iretq
    "#,
    scratch = const crate::cpu::LOCAL_SCRATCH_RSP,
    kstack = const crate::cpu::LOCAL_KSTACK_TOP,
    resume = const crate::cpu::LOCAL_RESUME_RSP,
    udata = const gdt::USER_DATA as u64,
    ucode64 = const gdt::USER_CODE64 as u64,
    syscall_vec = const arch_x86::frame::SYSCALL_VECTOR,
);

unsafe extern "C" {
    static perch_entry_window_start: u8;
    static perch_entry_window_end: u8;
    static perch_exit_window_start: u8;
    static perch_exit_window_end: u8;
    static perch_isr_table: u8;
    fn perch_syscall_entry();
    fn perch_nmi_entry();
    fn perch_enter_user(frame: *mut TrapFrame);
}

/// Address of the IDT stub for `vector`.
pub fn isr_stub(vector: u8) -> u64 {
    (&raw const perch_isr_table) as u64 + u64::from(vector) * ISR_STUB_SIZE
}

/// Address of the SYSCALL entry (for IA32_LSTAR).
pub fn syscall_entry() -> u64 {
    perch_syscall_entry as *const () as u64
}

/// Address of the NMI entry stub.
pub fn nmi_entry() -> u64 {
    perch_nmi_entry as *const () as u64
}

/// The entry window (frame being built) as `[start, end)`.
pub fn entry_window() -> (u64, u64) {
    (
        (&raw const perch_entry_window_start) as u64,
        (&raw const perch_entry_window_end) as u64,
    )
}

/// The exit window (frame being restored) as `[start, end)`.
pub fn exit_window() -> (u64, u64) {
    (
        (&raw const perch_exit_window_start) as u64,
        (&raw const perch_exit_window_end) as u64,
    )
}

/// True when `rip` lies where a user frame is only partly saved or restored.
/// Both windows are in `.text.entry`, the entry window first, so one
/// compare rejects every RIP outside the span of the two (the NMI path's
/// common case) before the gap between them is looked at.
#[inline(always)]
pub fn in_frame_window(rip: u64) -> bool {
    let (a, b) = entry_window();
    let (c, d) = exit_window();
    rip.wrapping_sub(a) < d.wrapping_sub(a) && (rip < b || rip >= c)
}

/// Runs the task whose saved user frame is `frame` until it enters the
/// runtime with a request that leaves to the scheduler (yield, exit, fault).
///
/// # Safety
/// `frame` must be the [`TrapFrame`] at the very top of the task's kernel
/// stack, this CPU's kernel stack ([`crate::cpu::set_kernel_stack`]) must
/// end with that frame, the runtime's GS must be loaded,
/// and the frame must describe valid ring-3 state (user CS/SS, canonical RIP).
pub unsafe fn enter_user(frame: *mut TrapFrame) {
    // SAFETY: forwarded from the caller; the stub saves and restores every
    // callee-saved register and returns here when the task leaves.
    unsafe { perch_enter_user(frame) }
}
