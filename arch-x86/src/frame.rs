//! The one trap frame layout every entry path (exceptions, `int 0x80`,
//! SYSCALL, NMI) saves, plus the user-mode selectors it is judged against.

use crate::gdt;

/// Pseudo vector recorded in frames built by the SYSCALL entry.
pub const SYSCALL_VECTOR: u64 = 0x100;
/// Vector of the compat-mode system call gate.
pub const INT80_VECTOR: u64 = 0x80;
/// Vector of the NMI.
pub const NMI_VECTOR: u64 = 2;

/// Every general-purpose register plus the hardware interrupt frame.
///
/// The entry asm pushes `rax` first and `r15` last, so `r15` sits at the
/// lowest address; the layout is asserted by tests and by the asm's use of
/// `size_of::<TrapFrame>()`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapFrame {
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
    /// Vector number (or [`SYSCALL_VECTOR`]).
    pub vector: u64,
    /// Hardware error code, 0 when the vector has none.
    pub error_code: u64,
    pub rip: u64,
    pub cs: u64,
    pub rflags: u64,
    pub rsp: u64,
    pub ss: u64,
}

/// The CPU mode a frame was taken in, judged from its CS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Ring 0.
    Kernel,
    /// Ring 3, 64-bit code segment.
    User64,
    /// Ring 3, 32-bit compatibility-mode code segment.
    UserCompat,
}

impl Mode {
    /// Classifies a code selector.
    pub fn from_cs(cs: u64) -> Self {
        if cs & 3 == 0 {
            Mode::Kernel
        } else if cs as u16 == gdt::USER_CODE32 {
            Mode::UserCompat
        } else {
            Mode::User64
        }
    }

    /// True for either user mode.
    pub fn is_user(self) -> bool {
        self != Mode::Kernel
    }
}

impl TrapFrame {
    /// The mode the CPU was in when this frame was saved.
    pub fn mode(&self) -> Mode {
        Mode::from_cs(self.cs)
    }

    /// The 15 GPRs other than `rsp`, in `rax, rbx, rcx, rdx, rsi, rdi, rbp, r8..r15` order.
    pub fn gprs(&self) -> [u64; 15] {
        [
            self.rax, self.rbx, self.rcx, self.rdx, self.rsi, self.rdi, self.rbp, self.r8, self.r9,
            self.r10, self.r11, self.r12, self.r13, self.r14, self.r15,
        ]
    }

    /// Sets the 15 GPRs other than `rsp` from [`TrapFrame::gprs`] order.
    pub fn set_gprs(&mut self, g: &[u64; 15]) {
        [
            self.rax, self.rbx, self.rcx, self.rdx, self.rsi, self.rdi, self.rbp, self.r8, self.r9,
            self.r10, self.r11, self.r12, self.r13, self.r14, self.r15,
        ] = *g;
    }
}

/// Names of the registers returned by [`TrapFrame::gprs`], for reports.
pub const GPR_NAMES: [&str; 15] = [
    "rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "r8", "r9", "r10", "r11", "r12", "r13", "r14",
    "r15",
];

/// True for the exception vectors where the CPU pushes an error code.
pub const fn has_error_code(vector: u8) -> bool {
    matches!(vector, 8 | 10..=14 | 17 | 21 | 29 | 30)
}

/// Mnemonic for an exception vector.
pub fn exception_name(vector: u64) -> &'static str {
    const NAMES: [&str; 32] = [
        "#DE divide error",
        "#DB debug",
        "NMI",
        "#BP breakpoint",
        "#OF overflow",
        "#BR bound range",
        "#UD invalid opcode",
        "#NM device not available",
        "#DF double fault",
        "coprocessor segment overrun",
        "#TS invalid TSS",
        "#NP segment not present",
        "#SS stack fault",
        "#GP general protection",
        "#PF page fault",
        "reserved 15",
        "#MF x87 error",
        "#AC alignment check",
        "#MC machine check",
        "#XM SIMD error",
        "#VE virtualization",
        "#CP control protection",
        "reserved 22",
        "reserved 23",
        "reserved 24",
        "reserved 25",
        "reserved 26",
        "reserved 27",
        "#HV hypervisor injection",
        "#VC VMM communication",
        "#SX security",
        "reserved 31",
    ];
    match vector {
        0..=31 => NAMES[vector as usize],
        INT80_VECTOR => "int 0x80",
        SYSCALL_VECTOR => "syscall",
        _ => "unexpected interrupt",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn layout_matches_push_order() {
        assert_eq!(size_of::<TrapFrame>(), 22 * 8);
        assert_eq!(size_of::<TrapFrame>() % 16, 0, "keeps rsp 16-aligned");
        assert_eq!(offset_of!(TrapFrame, r15), 0);
        assert_eq!(offset_of!(TrapFrame, r12), 3 * 8);
        assert_eq!(offset_of!(TrapFrame, rax), 14 * 8);
        assert_eq!(offset_of!(TrapFrame, vector), 15 * 8);
        assert_eq!(offset_of!(TrapFrame, error_code), 16 * 8);
        // Hardware part, as the CPU pushes it.
        assert_eq!(offset_of!(TrapFrame, rip), 17 * 8);
        assert_eq!(offset_of!(TrapFrame, cs), 18 * 8);
        assert_eq!(offset_of!(TrapFrame, rflags), 19 * 8);
        assert_eq!(offset_of!(TrapFrame, rsp), 20 * 8);
        assert_eq!(offset_of!(TrapFrame, ss), 21 * 8);
    }

    #[test]
    fn mode_from_selectors() {
        assert_eq!(Mode::from_cs(gdt::KERNEL_CODE.into()), Mode::Kernel);
        assert_eq!(Mode::from_cs(gdt::USER_CODE64.into()), Mode::User64);
        assert_eq!(Mode::from_cs(gdt::USER_CODE32.into()), Mode::UserCompat);
        assert!(Mode::UserCompat.is_user());
        assert!(!Mode::Kernel.is_user());
    }

    #[test]
    fn error_code_vectors() {
        let with: Vec<u8> = (0..32).filter(|&v| has_error_code(v)).collect();
        assert_eq!(with, [8, 10, 11, 12, 13, 14, 17, 21, 29, 30]);
        assert_eq!(exception_name(14), "#PF page fault");
        assert_eq!(exception_name(0x100), "syscall");
    }

    #[test]
    fn gprs_order() {
        let f = TrapFrame {
            rax: 1,
            r15: 15,
            rbp: 7,
            ..Default::default()
        };
        let g = f.gprs();
        assert_eq!(g[0], 1);
        assert_eq!(g[6], 7);
        assert_eq!(g[14], 15);
        assert_eq!(GPR_NAMES[11], "r12");
    }

    #[test]
    fn set_gprs_is_the_inverse_of_gprs() {
        let g: [u64; 15] = core::array::from_fn(|i| 100 + i as u64);
        let mut f = TrapFrame::default();
        f.set_gprs(&g);
        assert_eq!(f.gprs(), g);
        assert_eq!((f.rax, f.rbp, f.r8, f.r15), (100, 106, 107, 114));
    }
}
