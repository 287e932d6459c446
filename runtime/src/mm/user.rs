//! Checked access to user memory: the one place that turns a user address
//! and length into bytes. Every page is looked up in the process's own page
//! tables (and faulted in through its memory areas when a `Pager` is given),
//! its rights checked, and copied through the direct map, so a bad pointer
//! is an error for the caller and never a fault in the runtime.

use super::space::AddressSpace;
use arch_x86::paging::{ADDR_MASK, COW, PAGE, PRESENT, USER, USER_END, WRITABLE, phys_to_virt};

/// Why a user access failed (the system call returns EFAULT).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadAddress(pub u64);

/// What an access needs of a page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Reading.
    Read,
    /// Writing by the program's rights.
    Write,
    /// Writing on the runtime's behalf whatever the page's rights (loading
    /// a program, building its stack).
    Fill,
}

/// Brings in a page that is not present yet: returns true when the page at
/// `page` is now mapped (demand paging through the process's memory areas).
pub trait Pager {
    /// Maps `page` for `access`, or says it cannot be.
    fn fault_in(&mut self, space: &mut AddressSpace, page: u64, access: Access) -> bool;
}

/// No demand paging: only present pages count.
pub struct PresentOnly;

impl Pager for PresentOnly {
    fn fault_in(&mut self, _: &mut AddressSpace, _: u64, _: Access) -> bool {
        false
    }
}

/// The frame behind the user page at `page` for `access`, faulting it in if allowed.
fn frame(
    space: &mut AddressSpace,
    pager: &mut impl Pager,
    page: u64,
    access: Access,
) -> Result<u64, BadAddress> {
    if page >= USER_END {
        return Err(BadAddress(page));
    }
    for attempt in 0..2 {
        let e = space.entry(page);
        // A copy-on-write page is written only once it is this space's
        // own (the pager breaks the sharing).
        let ok = e & (PRESENT | USER) == (PRESENT | USER)
            && match access {
                Access::Read => true,
                Access::Write => e & WRITABLE != 0 && e & COW == 0,
                Access::Fill => e & COW == 0,
            };
        if ok {
            return Ok(e & ADDR_MASK);
        }
        if attempt == 0 && !pager.fault_in(space, page, access) {
            break;
        }
    }
    Err(BadAddress(page))
}

/// Walks `[addr, addr + len)` page by page, calling `f(frame_va, offset, n)`.
fn each_chunk(
    space: &mut AddressSpace,
    pager: &mut impl Pager,
    addr: u64,
    len: usize,
    access: Access,
    mut f: impl FnMut(u64, usize, usize),
) -> Result<(), BadAddress> {
    let end = addr
        .checked_add(len as u64)
        .filter(|&e| e <= USER_END)
        .ok_or(BadAddress(addr))?;
    let mut va = addr;
    let mut done = 0usize;
    while va < end {
        let page = va & !(PAGE - 1);
        let frame = frame(space, pager, page, access)?;
        let off = (va - page) as usize;
        let n = ((PAGE as usize) - off).min((end - va) as usize);
        f(phys_to_virt(frame) + off as u64, done, n);
        done += n;
        va += n as u64;
    }
    Ok(())
}

/// Copies `buf.len()` bytes from user address `addr`.
pub fn read(
    space: &mut AddressSpace,
    pager: &mut impl Pager,
    addr: u64,
    buf: &mut [u8],
) -> Result<(), BadAddress> {
    let len = buf.len();
    each_chunk(space, pager, addr, len, Access::Read, |src, at, n| {
        // SAFETY: `src..src + n` lies inside one present user frame, reached
        // through the direct map; `at + n <= buf.len()`.
        let s = unsafe { core::slice::from_raw_parts(src as *const u8, n) };
        buf[at..at + n].copy_from_slice(s);
    })
}

/// Copies `data` to user address `addr` (`Access::Write` checks the
/// program's rights, `Access::Fill` does not).
pub fn write(
    space: &mut AddressSpace,
    pager: &mut impl Pager,
    addr: u64,
    data: &[u8],
    access: Access,
) -> Result<(), BadAddress> {
    each_chunk(space, pager, addr, data.len(), access, |dst, at, n| {
        // SAFETY: `dst..dst + n` lies inside one present user frame of this
        // process (checked writable unless filling), reached through the
        // direct map; nothing else holds a reference to it.
        let d = unsafe { core::slice::from_raw_parts_mut(dst as *mut u8, n) };
        d.copy_from_slice(&data[at..at + n]);
    })
}
