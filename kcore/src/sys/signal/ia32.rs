//! The signal frames of i386 processes, as a 64-bit Linux kernel builds
//! them for an ia32 program (`arch/x86/kernel/signal_32.c`):
//! `sigframe_ia32` for a handler without SA_SIGINFO (left through i386
//! `sigreturn`, 119) and `rt_sigframe_ia32` for one with it (left through
//! `rt_sigreturn`, 173). Both hold a `struct sigcontext_32`; the FPU state
//! below the frame is a `struct _fpstate_32`: the FNSAVE-format header
//! converted from the FXSAVE image (Linux's `convert_from_fxsr`), then the
//! image itself.

use super::{
    FIX_EFLAGS, FPU_SIZE, Info, MXCSR_RESERVED, Machine, Process, RAX, RBP, RBX, RCX, RDI, RDX,
    RSI, SIGINFO_SIZE, SIGKILL, SIGSTOP, Taking, Thread, UserRegs, bit, disarm, initial_fpu,
    restore_altstack, sa, sas_flags, siginfo, stack_top,
};
use arch_x86::gdt;

/// `struct sigcontext_32`: 22 words.
const SC_SIZE: usize = 88;
/// The FNSAVE-format header of `struct _fpstate_32` (with `status` and
/// `magic`), before the FXSAVE image.
const FSAVE_SIZE: u64 = 112;
/// `sigframe_ia32`: pretcode, sig, sc, fpstate_unused (a whole
/// `_fpstate_32`, 624 bytes), extramask[1], retcode[8].
const OLD_FRAME_SIZE: usize = 4 + 4 + SC_SIZE + 624 + 4 + 8;
const OLD_SC: usize = 8;
const OLD_EXTRAMASK: usize = OLD_SC + SC_SIZE + 624;
const OLD_RETCODE: usize = OLD_EXTRAMASK + 4;
/// `rt_sigframe_ia32`: pretcode, sig, pinfo, puc, compat siginfo,
/// `ucontext_ia32`, retcode[8].
const RT_INFO: usize = 16;
const RT_UC: usize = RT_INFO + SIGINFO_SIZE as usize;
/// uc_flags, uc_link, uc_stack (12), uc_mcontext, uc_sigmask (8).
const UC_SIZE: usize = 4 + 4 + 12 + SC_SIZE + 8;
const UC_MCONTEXT: usize = 20;
const UC_SIGMASK: usize = UC_MCONTEXT + SC_SIZE;
const RT_RETCODE: usize = RT_UC + UC_SIZE;
const RT_FRAME_SIZE: usize = RT_RETCODE + 8;
/// The i386 `sigreturn` and `rt_sigreturn` numbers, in the `retcode` a
/// frame keeps for debuggers.
const NR_SIGRETURN: u32 = 119;
const NR_RT_SIGRETURN: u32 = 173;

/// The words of `struct sigcontext_32`.
mod sc {
    pub const GS: usize = 0;
    pub const FS: usize = 1;
    pub const ES: usize = 2;
    pub const DS: usize = 3;
    pub const DI: usize = 4;
    pub const SI: usize = 5;
    pub const BP: usize = 6;
    pub const SP: usize = 7;
    pub const BX: usize = 8;
    pub const DX: usize = 9;
    pub const CX: usize = 10;
    pub const AX: usize = 11;
    pub const TRAPNO: usize = 12;
    pub const ERR: usize = 13;
    pub const IP: usize = 14;
    pub const CS: usize = 15;
    pub const FLAGS: usize = 16;
    pub const SP_AT_SIGNAL: usize = 17;
    pub const SS: usize = 18;
    pub const FPSTATE: usize = 19;
    pub const OLDMASK: usize = 20;
    pub const CR2: usize = 21;
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn get32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn get16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// Builds the frame for `what` below the thread's stack (or on its
/// alternate stack) and sets `regs` to enter the handler as Linux's
/// `ia32_setup_frame`/`ia32_setup_rt_frame` do: eax = signal, and for an
/// rt frame edx = &info, ecx = &uc (0 otherwise); esp the frame, with
/// `(esp + 4)` 16-byte aligned; the process's user code and data
/// selectors in cs, ss, ds and es. `None` when the stack cannot hold it.
pub(super) fn setup_frame<M: Machine>(
    m: &mut M,
    p: &Process,
    t: &mut Thread,
    regs: &mut UserRegs,
    what: &Taking,
) -> Option<()> {
    let Taking {
        sig,
        ref action,
        info,
        old_mask,
    } = *what;
    let rt = action.flags & sa::SIGINFO != 0;
    let alt = t.altstack;
    let on_alt = sas_flags(&alt, regs.rsp);
    // No red zone on i386.
    let sp = stack_top(&alt, on_alt, regs.rsp, action)?;
    let buf_fx = sp.checked_sub(FPU_SIZE)? & !63;
    let fpstate = buf_fx.checked_sub(FSAVE_SIZE)?;
    let size = if rt { RT_FRAME_SIZE } else { OLD_FRAME_SIZE } as u64;
    let frame = ((fpstate.checked_sub(size)? + 4) & !15).checked_sub(4)?;
    if frame < super::super::vma::MMAP_MIN_ADDR || sp > 1 << 32 {
        return None;
    }
    let (trapno, err, cr2) = match info {
        Info::Fault(f) => (f.trapno, f.err, f.cr2),
        Info::Sent { .. } => (0, 0, 0),
    };
    let mut sc = [0u8; SC_SIZE];
    let g = &regs.gprs;
    let s = &regs.seg;
    for (i, v) in [
        (sc::GS, u32::from(s.gs)),
        (sc::FS, u32::from(s.fs)),
        (sc::ES, u32::from(s.es)),
        (sc::DS, u32::from(s.ds)),
        (sc::DI, g[RDI] as u32),
        (sc::SI, g[RSI] as u32),
        (sc::BP, g[RBP] as u32),
        (sc::SP, regs.rsp as u32),
        (sc::BX, g[RBX] as u32),
        (sc::DX, g[RDX] as u32),
        (sc::CX, g[RCX] as u32),
        (sc::AX, g[RAX] as u32),
        (sc::TRAPNO, trapno as u32),
        (sc::ERR, err as u32),
        (sc::IP, regs.rip as u32),
        (sc::CS, u32::from(s.cs)),
        (sc::FLAGS, regs.rflags as u32),
        (sc::SP_AT_SIGNAL, regs.rsp as u32),
        (sc::SS, u32::from(s.ss)),
        (sc::FPSTATE, fpstate as u32),
        (sc::OLDMASK, old_mask as u32),
        (sc::CR2, cr2 as u32),
    ] {
        put32(&mut sc, i * 4, v);
    }
    let mut fp = [0u8; (FSAVE_SIZE + FPU_SIZE) as usize];
    fp[..FSAVE_SIZE as usize].copy_from_slice(&fsave_header(&regs.fpu, s.cs, s.ds));
    fp[FSAVE_SIZE as usize..].copy_from_slice(&regs.fpu);
    // No XSAVE magic in the software-reserved bytes: a plain FXSAVE image.
    fp[FSAVE_SIZE as usize + 464..].fill(0);
    m.write_user(&p.areas, fpstate, &fp).ok()?;
    let restorer = action.restorer as u32;
    if rt {
        let mut f = [0u8; RT_FRAME_SIZE];
        put32(&mut f, 0, restorer);
        put32(&mut f, 4, u32::from(sig));
        put32(&mut f, 8, (frame as u32).wrapping_add(RT_INFO as u32));
        put32(&mut f, 12, (frame as u32).wrapping_add(RT_UC as u32));
        f[RT_INFO..RT_INFO + SIGINFO_SIZE as usize].copy_from_slice(&siginfo(
            crate::sys::Abi::I386,
            sig,
            info,
        ));
        // uc_flags 0 (no XSAVE state), uc_link 0, uc_stack, mcontext, sigmask.
        let uc = RT_UC;
        put32(&mut f, uc + 8, alt.sp as u32);
        put32(&mut f, uc + 12, on_alt);
        put32(&mut f, uc + 16, alt.size as u32);
        f[uc + UC_MCONTEXT..uc + UC_MCONTEXT + SC_SIZE].copy_from_slice(&sc);
        f[uc + UC_SIGMASK..uc + UC_SIGMASK + 8].copy_from_slice(&old_mask.to_le_bytes());
        // movl $173, %eax; int $0x80 (never run; debuggers look for it).
        f[RT_RETCODE] = 0xb8;
        put32(&mut f, RT_RETCODE + 1, NR_RT_SIGRETURN);
        f[RT_RETCODE + 5..RT_RETCODE + 7].copy_from_slice(&[0xcd, 0x80]);
        m.write_user(&p.areas, frame, &f).ok()?;
    } else {
        let mut f = [0u8; OLD_FRAME_SIZE];
        put32(&mut f, 0, restorer);
        put32(&mut f, 4, u32::from(sig));
        f[OLD_SC..OLD_SC + SC_SIZE].copy_from_slice(&sc);
        put32(&mut f, OLD_EXTRAMASK, (old_mask >> 32) as u32);
        // popl %eax; movl $119, %eax; int $0x80.
        f[OLD_RETCODE..OLD_RETCODE + 2].copy_from_slice(&[0x58, 0xb8]);
        put32(&mut f, OLD_RETCODE + 2, NR_SIGRETURN);
        f[OLD_RETCODE + 6..OLD_RETCODE + 8].copy_from_slice(&[0xcd, 0x80]);
        m.write_user(&p.areas, frame, &f).ok()?;
    }
    disarm(t, on_alt, action);
    regs.gprs[RAX] = u64::from(sig);
    (regs.gprs[RDX], regs.gprs[RCX]) = if rt {
        (frame + RT_INFO as u64, frame + RT_UC as u64)
    } else {
        (0, 0)
    };
    regs.rsp = frame;
    regs.rip = action.handler & 0xffff_ffff;
    regs.seg.cs = gdt::USER_CODE32;
    regs.seg.ss = gdt::USER_DATA;
    regs.seg.ds = gdt::USER_DATA;
    regs.seg.es = gdt::USER_DATA;
    Some(())
}

/// The FNSAVE-format header Linux's `convert_from_fxsr` writes for a
/// 64-bit kernel's ia32 frame: control, status and full tag words (upper
/// halves all ones), the last instruction and operand offsets, `cs` as the
/// instruction selector and `ds` as the operand selector, the eight
/// 10-byte registers; then `status` (the status word) and `magic` 0
/// (FXSR present).
fn fsave_header(fx: &[u8; 512], cs: u16, ds: u16) -> [u8; FSAVE_SIZE as usize] {
    let mut h = [0u8; FSAVE_SIZE as usize];
    let swd = get16(fx, 2);
    put32(&mut h, 0, u32::from(get16(fx, 0)) | 0xffff_0000);
    put32(&mut h, 4, u32::from(swd) | 0xffff_0000);
    put32(&mut h, 8, full_tag(fx));
    put32(&mut h, 12, get32(fx, 8));
    put32(&mut h, 16, u32::from(cs));
    put32(&mut h, 20, get32(fx, 16));
    put32(&mut h, 24, u32::from(ds) | 0xffff_0000);
    for i in 0..8 {
        h[28 + i * 10..38 + i * 10].copy_from_slice(&fx[32 + i * 16..42 + i * 16]);
    }
    h[108..110].copy_from_slice(&swd.to_le_bytes());
    h
}

/// The full x87 tag word from FXSAVE's abridged one: a valid register is
/// tagged by what it holds (0 valid, 1 zero, 2 special), an empty one 3.
fn full_tag(fx: &[u8; 512]) -> u32 {
    let tos = (get16(fx, 2) >> 11) & 7;
    let abridged = fx[4];
    let mut tag = 0xffff_0000u32;
    for i in 0..8u16 {
        let t = if abridged & (1 << i) == 0 {
            3
        } else {
            // Physical register i is st((i - top) mod 8).
            let st = usize::from(i.wrapping_sub(tos) & 7);
            let r = &fx[32 + st * 16..42 + st * 16];
            let exponent = get16(r, 8) & 0x7fff;
            let significand = u64::from_le_bytes(r[..8].try_into().unwrap_or([0; 8]));
            match exponent {
                0x7fff => 2,
                0 if significand == 0 => 1,
                0 => 2,
                _ if significand & (1 << 63) != 0 => 0,
                _ => 2,
            }
        };
        tag |= t << (2 * i);
    }
    tag
}

/// Folds an FNSAVE-format header into an FXSAVE image, as Linux's
/// `convert_to_fxsr` on a 64-bit kernel: the control, status and tag
/// words, the opcode from the instruction selector's upper half, the
/// instruction and operand offsets, the eight registers.
fn fold_header(fx: &mut [u8; 512], h: &[u8]) {
    fx[0..2].copy_from_slice(&h[0..2]);
    fx[2..4].copy_from_slice(&h[4..6]);
    fx[4..6].copy_from_slice(&u16::from(abridged_tag(get16(h, 8))).to_le_bytes());
    fx[6..8].copy_from_slice(&h[18..20]);
    fx[8..16].copy_from_slice(&u64::from(get32(h, 12)).to_le_bytes());
    fx[16..24].copy_from_slice(&u64::from(get32(h, 20)).to_le_bytes());
    for i in 0..8 {
        fx[32 + i * 16..42 + i * 16].copy_from_slice(&h[28 + i * 10..38 + i * 10]);
    }
}

/// FXSAVE's abridged tag byte from a full tag word: a register is valid
/// unless its tag is 3 (empty).
fn abridged_tag(twd: u16) -> u8 {
    (0..8).fold(0, |acc, i| {
        if (twd >> (2 * i)) & 3 == 3 {
            acc
        } else {
            acc | (1 << i)
        }
    })
}

/// Whether `sel` (with RPL 3) may be a data segment register of the
/// process after sigreturn: null, the user data selector, or a TLS slot.
fn data_selector(sel: u16) -> bool {
    let s = sel | 3;
    s == 3 || s == gdt::USER_DATA || tls_selector(s)
}

fn tls_selector(s: u16) -> bool {
    (0..gdt::TLS_SLOTS).any(|i| s == gdt::tls_selector(i))
}

/// i386 `sigreturn` (`rt` false: a `sigframe_ia32` 8 bytes below
/// `regs.rsp`) or `rt_sigreturn` (an `rt_sigframe_ia32` 4 bytes below it),
/// as Linux's `ia32_restore_sigcontext`: the eight 32-bit registers, eip,
/// eflags (the bits a handler may change), the selectors with RPL 3, the
/// FPU state, the mask, and for an rt frame the alternate stack. The
/// registers r8-r15 stay. A frame that would resume the thread outside
/// user space, with a code or stack selector other than the process's own
/// (or a data selector that names no user segment), or with reserved MXCSR
/// bits, ends the process with a reason.
pub(super) fn sigreturn<M: Machine>(
    m: &mut M,
    p: &mut Process,
    t: &mut Thread,
    regs: &mut UserRegs,
    rt: bool,
) -> Result<(), &'static str> {
    const NO_FRAME: &str = "sigreturn with no signal frame on the stack";
    let frame = regs
        .rsp
        .checked_sub(if rt { 4 } else { 8 })
        .ok_or(NO_FRAME)?;
    let mut f = [0u8; OLD_FRAME_SIZE];
    let len = if rt { RT_FRAME_SIZE } else { OLD_FRAME_SIZE };
    m.read_user(&p.areas, frame, &mut f[..len])
        .map_err(|_| NO_FRAME)?;
    let at = if rt { RT_UC + UC_MCONTEXT } else { OLD_SC };
    let sc = &f[at..at + SC_SIZE];
    let w = |i: usize| get32(sc, i * 4);
    let top = p.layout.user_top;
    if u64::from(w(sc::IP)) >= top {
        return Err("sigreturn to an address outside user space (a forged frame)");
    }
    if u64::from(w(sc::SP)) >= top {
        return Err("sigreturn to a stack outside user space (a forged frame)");
    }
    let sel = |i: usize| (w(i) as u16) | 3;
    let (cs, ss) = (sel(sc::CS), sel(sc::SS));
    if cs != gdt::USER_CODE32
        || !(ss == gdt::USER_DATA || tls_selector(ss))
        || ![sc::GS, sc::FS, sc::ES, sc::DS]
            .iter()
            .all(|&i| data_selector(w(i) as u16))
    {
        return Err("sigreturn with a segment selector not the process's own (a forged frame)");
    }
    let fpstate = u64::from(w(sc::FPSTATE));
    let fpu = if fpstate == 0 {
        initial_fpu()
    } else {
        let mut b = [0u8; (FSAVE_SIZE + FPU_SIZE) as usize];
        m.read_user(&p.areas, fpstate, &mut b)
            .map_err(|_| "sigreturn with an unreadable FPU state (a forged frame)")?;
        let mut fx = [0u8; 512];
        fx.copy_from_slice(&b[FSAVE_SIZE as usize..]);
        if get32(&fx, 24) & MXCSR_RESERVED != 0 {
            return Err("sigreturn with a bad FPU state (reserved MXCSR bits)");
        }
        fold_header(&mut fx, &b[..FSAVE_SIZE as usize]);
        fx
    };
    let g = &mut regs.gprs;
    for (r, i) in [
        (RDI, sc::DI),
        (RSI, sc::SI),
        (RBP, sc::BP),
        (RBX, sc::BX),
        (RDX, sc::DX),
        (RCX, sc::CX),
        (RAX, sc::AX),
    ] {
        g[r] = u64::from(w(i));
    }
    regs.rsp = u64::from(w(sc::SP));
    regs.rip = u64::from(w(sc::IP));
    regs.rflags = (regs.rflags & !FIX_EFLAGS) | (u64::from(w(sc::FLAGS)) & FIX_EFLAGS);
    regs.fpu = fpu;
    regs.seg.cs = cs;
    regs.seg.ss = ss;
    regs.seg.ds = sel(sc::DS);
    regs.seg.es = sel(sc::ES);
    regs.seg.fs = sel(sc::FS);
    regs.seg.gs = sel(sc::GS);
    let mask = if rt {
        u64::from_le_bytes(
            f[RT_UC + UC_SIGMASK..RT_UC + UC_SIGMASK + 8]
                .try_into()
                .unwrap_or([0; 8]),
        )
    } else {
        u64::from(w(sc::OLDMASK)) | u64::from(get32(&f, OLD_EXTRAMASK)) << 32
    };
    t.sigmask = mask & !(bit(SIGKILL) | bit(SIGSTOP));
    if rt {
        let uc = RT_UC;
        restore_altstack(
            t,
            regs.rsp,
            u64::from(get32(&f, uc + 8)),
            get32(&f, uc + 12),
            u64::from(get32(&f, uc + 16)),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An FXSAVE image with TOP = 5 and st(i) = `regs[i]` (significand,
    /// exponent), the abridged tag marking them valid.
    fn image(regs: &[(u64, u16)]) -> [u8; 512] {
        let mut fx = [0u8; 512];
        fx[2..4].copy_from_slice(&(5u16 << 11).to_le_bytes());
        for (st, &(significand, exponent)) in regs.iter().enumerate() {
            fx[32 + st * 16..40 + st * 16].copy_from_slice(&significand.to_le_bytes());
            fx[40 + st * 16..42 + st * 16].copy_from_slice(&exponent.to_le_bytes());
            fx[4] |= 1 << ((st + 5) % 8);
        }
        fx
    }

    #[test]
    fn the_full_tag_word_says_what_each_register_holds() {
        let fx = image(&[
            (1 << 63, 0x3fff),          // st0 = 1.0: valid
            (0, 0),                     // st1 = +0: zero
            (1, 0),                     // st2 denormal: special
            (1 << 63, 0x7fff),          // st3 infinity: special
            (0x4000_0000, 0x3fff),      // st4 unnormal: special
            (1 << 63, 0x8000 | 0x3fff), // st5 = -1.0: valid
        ]);
        // Physical register r holds st((r - 5) mod 8).
        let want = [
            (5, 0),
            (6, 1),
            (7, 2),
            (0, 2),
            (1, 2),
            (2, 0),
            (3, 3),
            (4, 3),
        ];
        let mut tag = 0xffff_0000;
        for (r, t) in want {
            tag |= t << (2 * r);
        }
        assert_eq!(full_tag(&fx), tag);
        assert_eq!(abridged_tag(tag as u16), fx[4]);
    }
}
