//! Nearest-symbol lookup for reports, over a table of named entry points
//! (the full symbol table stays in the ELF for the host). The table comes
//! from the top of the runtime ([`register`]), so the reports of every
//! layer can name runtime functions without importing the layers that
//! define them.

use core::cell::Cell;
use core::fmt;
use critical_section::Mutex;

/// Formats as `name+0xoff`, or `?` when no known symbol is close.
pub struct Nearest(pub u64);

/// Calls its argument once per named address.
pub type Table = fn(&mut dyn FnMut(u64, &'static str));

const MAX_DISTANCE: u64 = 64 * 1024;

static TABLE: Mutex<Cell<Option<Table>>> = Mutex::new(Cell::new(None));

/// Sets the table the reports look names up in.
pub fn register(table: Table) {
    critical_section::with(|cs| TABLE.borrow(cs).set(Some(table)));
}

impl fmt::Display for Nearest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut best: Option<(u64, &str)> = None;
        if let Some(table) = critical_section::with(|cs| TABLE.borrow(cs).get()) {
            table(&mut |addr, name| {
                if addr <= self.0
                    && self.0 - addr < MAX_DISTANCE
                    && best.is_none_or(|(b, _)| addr > b)
                {
                    best = Some((addr, name));
                }
            });
        }
        match best {
            Some((addr, name)) => write!(f, "{name}+{:#x}", self.0 - addr),
            None => f.write_str("?"),
        }
    }
}
