//! The legacy 8259 pair: remapped away from the exception vectors and fully masked.

/// Remaps the PICs to vectors 0x20..0x30 and masks every line.
///
/// # Safety
/// Ports 0x20/0x21/0xa0/0xa1 must be the 8259 pair (or unused).
#[cfg(target_arch = "x86_64")]
pub unsafe fn disable() {
    use x86::io::outb;
    // SAFETY: forwarded from the caller.
    unsafe {
        outb(0x20, 0x11);
        outb(0xa0, 0x11);
        outb(0x21, 0x20);
        outb(0xa1, 0x28);
        outb(0x21, 0x04);
        outb(0xa1, 0x02);
        outb(0x21, 0x01);
        outb(0xa1, 0x01);
        outb(0x21, 0xff);
        outb(0xa1, 0xff);
    }
}
