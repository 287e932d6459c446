//! The CPUs' tables as built, the entry windows, and page rights.

use core::sync::atomic::Ordering;

use super::*;

pub(super) fn descriptor_tables() -> TestResult {
    let g = cpu::sgdt();
    let (gbase, glimit) = (g.base, g.limit);
    ensure!(
        gbase == crate::cpu::gdt_base(),
        "GDTR base {gbase:#x} is not the runtime GDT"
    );
    ensure!(
        usize::from(glimit) == gdt::GDT_ENTRIES * 8 - 1,
        "GDTR limit {glimit}"
    );
    let live = crate::cpu::gdt_copy();
    let tss_base = gdt::tss_base(&live);
    let want = gdt::build(tss_base);
    // The TLS slots belong to whichever compat process last ran.
    for (i, (l, w)) in live
        .iter()
        .zip(want.iter())
        .enumerate()
        .take(gdt::TLS_FIRST)
    {
        // The CPU marks the TSS busy (type 9 -> 0xb) on `ltr` and sets the
        // accessed bit of segments it loads.
        let l = if i == 6 {
            l & !(2 << 40)
        } else {
            l & !(1 << 40)
        };
        ensure!(l == *w, "GDT slot {i}: {l:#018x}, built {w:#018x}");
    }
    ensure!(cpu::str() == gdt::TSS, "TR = {:#x}", cpu::str());
    ensure!(cpu::cs() == gdt::KERNEL_CODE, "CS = {:#x}", cpu::cs());
    let i = cpu::sidt();
    let (ibase, ilimit) = (i.base, i.limit);
    ensure!(
        ibase == crate::cpu::idt_base() && ilimit == 4095,
        "IDTR {ibase:#x}/{ilimit}"
    );
    let nmi = crate::cpu::idt_entry(2);
    ensure!(
        nmi.ist() == gdt::IST_NMI && nmi.handler() == crate::entry::nmi_entry(),
        "NMI gate"
    );
    ensure!(
        crate::cpu::idt_entry(8).ist() == gdt::IST_DOUBLE_FAULT,
        "#DF gate has no IST"
    );
    ensure!(
        crate::cpu::idt_entry(18).ist() == gdt::IST_MACHINE_CHECK,
        "#MC gate has no IST"
    );
    ensure!(
        crate::cpu::idt_entry(0x80).dpl() == 3,
        "int 0x80 gate not DPL 3"
    );
    ensure!(
        crate::cpu::idt_entry(13).dpl() == 0,
        "#GP gate reachable from ring 3"
    );
    for v in 0..=255u8 {
        ensure!(crate::cpu::idt_entry(v).present(), "vector {v} has no gate");
    }
    // SAFETY: reading the STAR/LSTAR MSRs has no side effects.
    let (star, lstar) = unsafe {
        (
            x86::msr::rdmsr(x86::msr::IA32_STAR),
            x86::msr::rdmsr(x86::msr::IA32_LSTAR),
        )
    };
    ensure!(star == gdt::star(), "STAR {star:#x}");
    ensure!(lstar == crate::entry::syscall_entry(), "LSTAR {lstar:#x}");
    Ok(())
}

pub(super) fn frame_windows() -> TestResult {
    let (a, b) = crate::entry::entry_window();
    let (c, d) = crate::entry::exit_window();
    ensure!(
        a < b && c < d && b <= c,
        "windows out of order: {a:#x}..{b:#x}, {c:#x}..{d:#x}"
    );
    ensure!(
        crate::entry::in_frame_window(crate::entry::syscall_entry()),
        "SYSCALL entry outside the entry window"
    );
    ensure!(
        crate::entry::in_frame_window(crate::entry::isr_stub(0x80)),
        "int 0x80 stub outside the entry window"
    );
    ensure!(
        !crate::entry::in_frame_window(crate::entry::nmi_entry()),
        "NMI entry inside a frame window"
    );
    ensure!(
        !crate::entry::in_frame_window(syscall::sys_spin as *const () as u64),
        "sys_spin inside a frame window"
    );
    // Each edge: first byte in, end out, and the gap between the windows
    // (the dispatch call, where the frame is complete) out.
    for (rip, inside) in [
        (a - 1, false),
        (a, true),
        (b - 1, true),
        (b, false),
        (c - 1, b == c),
        (c, true),
        (d - 1, true),
        (d, false),
    ] {
        ensure!(
            crate::entry::in_frame_window(rip) == inside,
            "{rip:#x} {} the frame windows {a:#x}..{b:#x}, {c:#x}..{d:#x}",
            if inside { "outside" } else { "inside" }
        );
    }
    Ok(())
}

pub(super) fn paging_rights() -> TestResult {
    let f = cpu::features();
    ensure!(cpu::cr0() & cpu::CR0_WP != 0, "CR0.WP off");
    ensure!(
        (cpu::cr4() & cpu::CR4_SMEP != 0) == f.smep,
        "CR4.SMEP does not match CPUID ({})",
        f.smep
    );
    ensure!(
        (cpu::cr4() & cpu::CR4_SMAP != 0) == f.smap,
        "CR4.SMAP does not match CPUID ({})",
        f.smap
    );
    let nx = if f.nx { pg::NO_EXECUTE } else { 0 };
    let kernel_text = crate::perch_kmain as *const () as u64;
    let kernel_data = crate::cpu::gdt_base();
    let user_text = user::addr(user::perch_st_hello64);
    let user_data = user::addr(user::perch_st_data_code);
    let cases = [
        ("page 0", 0, 0, pg::PRESENT),
        (
            "runtime text",
            kernel_text,
            pg::PRESENT,
            pg::USER | pg::WRITABLE | pg::NO_EXECUTE,
        ),
        (
            "runtime data",
            kernel_data,
            pg::PRESENT | pg::WRITABLE | nx,
            pg::USER,
        ),
        (
            "appliance text",
            user_text,
            pg::PRESENT | pg::USER,
            pg::WRITABLE | pg::NO_EXECUTE,
        ),
        (
            "appliance data",
            user_data,
            pg::PRESENT | pg::USER | pg::WRITABLE | nx,
            0,
        ),
    ];
    let Some(space) = task::builtin_space() else {
        fail!("no memory for an address space");
    };
    for (what, addr, must, must_not) in cases {
        let e = space.entry(addr);
        ensure!(
            e & must == must && e & must_not == 0,
            "{what} at {addr:#x} mapped {e:#x}"
        );
    }
    // The kernel's own root maps no user page; a process's root maps the
    // runtime exactly as the kernel's does.
    ensure!(
        mm::kernel_entry(user_text) == 0 && mm::kernel_entry(user_data) == 0,
        "the kernel's root maps ring-3 pages"
    );
    for addr in [kernel_text, kernel_data] {
        ensure!(
            space.entry(addr) == mm::kernel_entry(addr),
            "{addr:#x} differs between the process's and the kernel's root"
        );
    }
    Ok(())
}

/// Every CPU the MADT lists (within `smp=`) came up on tables of its own:
/// it read its own APIC ID, found its block through GS, and its GDTR, TR
/// and IDTR hold what was built for it; no two CPUs share a GDT, TSS or
/// IST stack.
pub(super) fn other_cpus() -> TestResult {
    let n = crate::smp::online();
    ensure!(
        n == crate::smp::wanted(),
        "{n} CPUs up, {} wanted",
        crate::smp::wanted()
    );
    // (what, address): GDTs, TSSs and each IST slot's stack top.
    let mut seen: heapless::Vec<(usize, u64), 512> = heapless::Vec::new();
    for i in 0..n {
        let Some(c) = crate::smp::cpu(i) else {
            fail!("CPU {i} has no block");
        };
        ensure!(c.index == i, "CPU {i}: block of CPU {}", c.index);
        if i > 0 {
            let id = c.apic_id_seen.load(Ordering::Relaxed);
            ensure!(
                id == c.apic_id(),
                "CPU {i}: APIC ID {id}, the MADT says {}",
                c.apic_id()
            );
            let checks = c.checks.load(Ordering::Relaxed);
            ensure!(
                checks == crate::cpu::CHECK_ALL,
                "CPU {i}: loaded-table checks {checks:#06b}, want {:#06b}",
                crate::cpu::CHECK_ALL
            );
        }
        let ist = c.ist_tops();
        // SAFETY: the NMI IST slot's top is the word `init_ap` wrote
        // (the block's address), inside the CPU's live NMI stack.
        let tag = unsafe { (ist[0] as *const u64).read_volatile() };
        ensure!(
            tag == c as *const _ as u64,
            "CPU {i}: its NMI stack names {tag:#x}, not its block"
        );
        let mine = [c.gdt_base(), c.tss_base(), ist[0], ist[1], ist[2]];
        for (what, addr) in mine.into_iter().enumerate() {
            ensure!(addr != 0, "CPU {i}: a table or IST stack at 0");
            ensure!(
                !seen.contains(&(what, addr)),
                "CPU {i}: {addr:#x} is another CPU's too"
            );
            let _ = seen.push((what, addr));
        }
    }
    Ok(())
}
