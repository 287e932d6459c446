//! Nearest-symbol lookup for reports, over a table of the runtime's and the
//! appliance's named entry points (the full symbol table stays in the ELF
//! for the host).

use core::fmt;

/// Formats as `name+0xoff`, or `?` when no known symbol is close.
pub struct Nearest(pub u64);

const MAX_DISTANCE: u64 = 64 * 1024;

fn table() -> [(u64, &'static str); 16] {
    [
        (crate::provoke_crash as *const () as u64, "provoke_crash"),
        (crate::perch_kmain as *const () as u64, "perch_kmain"),
        (
            crate::abi::trap_dispatch as *const () as u64,
            "trap_dispatch",
        ),
        (
            crate::abi::runtime_exception as *const () as u64,
            "runtime_exception",
        ),
        (
            crate::sample::nmi::nmi_dispatch as *const () as u64,
            "nmi_dispatch",
        ),
        (
            crate::abi::perch::handle as *const () as u64,
            "syscall::handle",
        ),
        (crate::abi::perch::sys_spin as *const () as u64, "sys_spin"),
        (crate::proc::run_once as *const () as u64, "task::run_once"),
        (crate::entry::syscall_entry(), "perch_syscall_entry"),
        (crate::entry::nmi_entry(), "perch_nmi_entry"),
        (crate::entry::isr_stub(0), "perch_isr_table"),
        (crate::entry::exit_window().0, "perch_exit_window_start"),
        (crate::entry::exit_window().1, "perch_leave_to_scheduler"),
        (crate::selftest::run as *const () as u64, "selftest::run"),
        (crate::mm::layout().user_text.0, "appliance .user.text"),
        (crate::mm::layout().text.0, ".text"),
    ]
}

impl fmt::Display for Nearest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut best: Option<(u64, &str)> = None;
        for (addr, name) in table()
            .into_iter()
            .chain(crate::selftest::programs::symbols())
        {
            if addr <= self.0 && self.0 - addr < MAX_DISTANCE && best.is_none_or(|(b, _)| addr > b)
            {
                best = Some((addr, name));
            }
        }
        match best {
            Some((addr, name)) => write!(f, "{name}+{:#x}", self.0 - addr),
            None => f.write_str("?"),
        }
    }
}
