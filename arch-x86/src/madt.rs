//! The machine's CPUs, as the ACPI MADT lists them, read through the
//! `acpi` crate: the RSDP the loader gave (PVH's `rsdp_paddr`, a multiboot2
//! ACPI tag) or the one the BIOS areas hold, then the RSDT or XSDT, then the
//! MADT's Processor Local APIC and Processor Local x2APIC entries.
//!
//! Only enabled processors count. One that is only "online capable" (ACPI
//! 6.3: firmware may hot-add it) is not started, as Linux does not start
//! it at boot either.

use acpi::madt::{Madt, MadtEntry};
use acpi::{AcpiError, AcpiHandler, AcpiTables, PhysicalMapping};
use core::ptr::NonNull;

/// The most CPUs Perch keeps (the others the MADT lists are counted in
/// [`Cpus::over`], never started).
pub const MAX_CPUS: usize = 64;
// The stream's Hello lists every CPU that is up.
const _: () = assert!(MAX_CPUS == sampler::wire::MAX_CPUS);

/// MADT processor flags, bit 0: the processor is enabled.
const ENABLED: u32 = 1 << 0;

/// The enabled processors of the MADT, in its order (the boot CPU is
/// usually first, but nothing depends on that).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cpus {
    ids: [u32; MAX_CPUS],
    n: usize,
    /// Enabled processors past [`MAX_CPUS`].
    pub over: u32,
    /// Processors the MADT lists but not as enabled.
    pub disabled: u32,
    /// The physical address of the local APICs (the MADT's, or its
    /// override entry's).
    pub lapic_base: u64,
}

impl Cpus {
    /// The APIC IDs of the enabled processors, each once.
    pub fn apic_ids(&self) -> &[u32] {
        &self.ids[..self.n]
    }

    fn push(&mut self, apic_id: u32, flags: u32) {
        if flags & ENABLED == 0 {
            self.disabled += 1;
        } else if self.apic_ids().contains(&apic_id) {
            // The same processor through both entry kinds.
        } else if self.n == MAX_CPUS {
            self.over += 1;
        } else {
            self.ids[self.n] = apic_id;
            self.n += 1;
        }
    }
}

/// Why the CPUs could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MadtError {
    /// No RSDP: none from the loader, none in the BIOS areas.
    NoRsdp,
    /// The RSDP or the RSDT/XSDT it names is not valid.
    Tables,
    /// No MADT among the tables, or only one whose checksum is wrong.
    NoMadt,
}

impl core::fmt::Display for MadtError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            MadtError::NoRsdp => "no ACPI RSDP (none from the loader, none in the BIOS areas)",
            MadtError::Tables => "the ACPI RSDP or its RSDT/XSDT is not valid",
            MadtError::NoMadt => "no valid MADT among the ACPI tables",
        })
    }
}

/// Physical memory as the `acpi` crate asks for it: through a fixed
/// translation (the runtime's direct map), never mapping anything new.
#[derive(Clone, Copy)]
struct Translate(fn(u64) -> u64);

impl AcpiHandler for Translate {
    unsafe fn map_physical_region<T>(&self, pa: usize, size: usize) -> PhysicalMapping<Self, T> {
        let va = (self.0)(pa as u64) as *mut T;
        // SAFETY: the translation of a physical address the caller of
        // `cpus` vouches for is readable for `size` bytes (its obligation 1).
        unsafe {
            PhysicalMapping::new(
                pa,
                NonNull::new(va).unwrap_or(NonNull::dangling()),
                size,
                size,
                *self,
            )
        }
    }
    fn unmap_physical_region<T>(_region: &PhysicalMapping<Self, T>) {}
}

/// Reads the enabled processors from the MADT. `rsdp` is the RSDP's
/// physical address when the loader gave one; without it the BIOS areas
/// (the EBDA's first KiB, 0xE0000-0xFFFFF) are searched.
///
/// # Safety
/// 1. `to_virt` turns every physical address of the ACPI tables, and of the
///    BIOS areas when `rsdp` is `None`, into an address where they can be
///    read, and nothing writes them meanwhile.
/// 2. `rsdp`, when given, is the physical address of readable memory of at
///    least 36 bytes (an ACPI 2.0 RSDP's size).
pub unsafe fn cpus(rsdp: Option<u64>, to_virt: fn(u64) -> u64) -> Result<Cpus, MadtError> {
    let h = Translate(to_virt);
    let tables = match rsdp {
        // SAFETY: obligations 1 and 2: the RSDP and the tables it leads to
        // are readable through `to_virt`.
        Some(pa) => unsafe { AcpiTables::from_rsdp(h, pa as usize) },
        // SAFETY: obligation 1 covers the BIOS areas this reads.
        None => unsafe { AcpiTables::search_for_rsdp_bios(h) },
    }
    .map_err(|e| match e {
        AcpiError::NoValidRsdp | AcpiError::RsdpIncorrectSignature => MadtError::NoRsdp,
        _ => MadtError::Tables,
    })?;
    // `find_table` checks the table's signature and checksum.
    let madt = tables.find_table::<Madt>().map_err(|_| MadtError::NoMadt)?;
    let mut out = Cpus {
        ids: [0; MAX_CPUS],
        n: 0,
        over: 0,
        disabled: 0,
        lapic_base: u64::from(madt.get().local_apic_address),
    };
    for e in madt.get().entries() {
        match e {
            MadtEntry::LocalApic(a) => out.push(u32::from(a.apic_id), a.flags),
            MadtEntry::LocalX2Apic(a) => out.push(a.x2apic_id, a.flags),
            MadtEntry::LocalApicAddressOverride(o) => out.lapic_base = o.local_apic_address,
            _ => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checksum(b: &mut [u8], at: usize) {
        b[at] = 0;
        let sum = b.iter().fold(0u8, |s, &x| s.wrapping_add(x));
        b[at] = 0u8.wrapping_sub(sum);
    }

    fn sdt(sig: &[u8; 4], body: &[u8]) -> Vec<u8> {
        let mut t = Vec::new();
        t.extend_from_slice(sig);
        t.extend_from_slice(&((36 + body.len()) as u32).to_le_bytes());
        t.push(1); // revision
        t.push(0); // checksum
        t.extend_from_slice(b"PERCH ");
        t.extend_from_slice(b"PERCHTST");
        t.extend_from_slice(&1u32.to_le_bytes());
        t.extend_from_slice(b"PRCH");
        t.extend_from_slice(&1u32.to_le_bytes());
        t.extend_from_slice(body);
        checksum(&mut t, 9);
        t
    }

    /// Tables in host memory whose "physical" addresses are their own
    /// (the translation is the identity), kept alive by the returned boxes.
    struct Machine {
        rsdp: Box<[u8]>,
        _xsdt: Box<[u8]>,
        _madt: Box<[u8]>,
    }

    fn machine(entries: &[Vec<u8>], corrupt_madt: bool) -> Machine {
        let mut body = Vec::new();
        body.extend_from_slice(&0xfee0_0000u32.to_le_bytes());
        body.extend_from_slice(&1u32.to_le_bytes()); // PCAT_COMPAT
        for e in entries {
            body.extend_from_slice(e);
        }
        let mut madt = sdt(b"APIC", &body).into_boxed_slice();
        if corrupt_madt {
            madt[40] ^= 1;
        }
        let xsdt = sdt(b"XSDT", &(madt.as_ptr() as u64).to_le_bytes()).into_boxed_slice();
        let mut rsdp = Vec::new();
        rsdp.extend_from_slice(b"RSD PTR ");
        rsdp.push(0);
        rsdp.extend_from_slice(b"PERCH ");
        rsdp.push(2);
        rsdp.extend_from_slice(&0u32.to_le_bytes());
        rsdp.extend_from_slice(&36u32.to_le_bytes());
        rsdp.extend_from_slice(&(xsdt.as_ptr() as u64).to_le_bytes());
        rsdp.extend_from_slice(&[0; 4]);
        checksum(&mut rsdp[..20], 8);
        checksum(&mut rsdp, 32);
        Machine {
            rsdp: rsdp.into_boxed_slice(),
            _xsdt: xsdt,
            _madt: madt,
        }
    }

    fn lapic(uid: u8, id: u8, flags: u32) -> Vec<u8> {
        let mut e = vec![0, 8, uid, id];
        e.extend_from_slice(&flags.to_le_bytes());
        e
    }

    fn x2apic(id: u32, flags: u32) -> Vec<u8> {
        let mut e = vec![9, 16, 0, 0];
        e.extend_from_slice(&id.to_le_bytes());
        e.extend_from_slice(&flags.to_le_bytes());
        e.extend_from_slice(&id.to_le_bytes());
        e
    }

    fn read(m: &Machine) -> Result<Cpus, MadtError> {
        // SAFETY: the tables live in `m`, at the addresses they name.
        unsafe { cpus(Some(m.rsdp.as_ptr() as u64), |pa| pa) }
    }

    #[test]
    fn enabled_processors_of_both_entry_kinds_each_once() {
        let ioapic = {
            let mut e = vec![1, 12, 0, 0];
            e.extend_from_slice(&0xfec0_0000u32.to_le_bytes());
            e.extend_from_slice(&0u32.to_le_bytes());
            e
        };
        let m = machine(
            &[
                lapic(0, 0, 1),
                ioapic,
                lapic(1, 2, 1),
                lapic(2, 4, 0),      // disabled
                lapic(3, 6, 1 << 1), // online capable only
                x2apic(2, 1),        // the processor with APIC ID 2 again
                x2apic(300, 1),
            ],
            false,
        );
        let c = read(&m).unwrap();
        assert_eq!(c.apic_ids(), &[0, 2, 300]);
        assert_eq!((c.disabled, c.over), (2, 0));
        assert_eq!(c.lapic_base, 0xfee0_0000);
    }

    #[test]
    fn more_than_max_cpus_are_counted_not_kept() {
        let entries: Vec<_> = (0..70u32).map(|i| x2apic(i, 1)).collect();
        let c = read(&machine(&entries, false)).unwrap();
        assert_eq!(c.apic_ids().len(), MAX_CPUS);
        assert_eq!(c.apic_ids()[63], 63);
        assert_eq!(c.over, 6);
    }

    #[test]
    fn broken_tables_are_errors() {
        let m = machine(&[lapic(0, 0, 1)], true);
        assert_eq!(read(&m), Err(MadtError::NoMadt));
        let mut m = machine(&[lapic(0, 0, 1)], false);
        m.rsdp[0] = b'X';
        assert_eq!(read(&m), Err(MadtError::NoRsdp));
    }
}
