//! Where a CPU sits in the machine (package, die, core, thread), worked
//! out from its APIC ID and the topology CPUID describes.
//!
//! An APIC ID is a packed set of fields: the thread within its core in
//! the lowest bits, then the core, possibly module, tile and die levels,
//! and the package in the remaining high bits. CPUID gives the width of
//! each field as a right-shift count; every logical processor of a
//! machine reports the same widths, so the boot CPU's answers place every
//! CPU the MADT lists.
//!
//! The sources, in order of preference:
//! 1. Leaf 1FH (V2 extended topology), then leaf 0BH (extended topology;
//!    Intel SDM vol. 2A, CPUID): sub-leaf n gives a level type in
//!    ECX\[15:8\] (1 SMT, 2 core, 3 module, 4 tile, 5 die, 6 die group;
//!    0 ends the list) and in EAX\[4:0\] the shift that turns an x2APIC ID
//!    into the ID of the next level up. The last level's shift gives the
//!    package. A leaf whose sub-leaf 0 reports no logical processors
//!    (EBX\[15:0\] = 0) is not supported.
//! 2. Without either: leaf 1 EBX\[23:16\] (addressable logical processor
//!    IDs per package, when EDX.HTT is set), with the cores per package of
//!    leaf 4 EAX\[31:26\] on Intel or the APIC ID width of 8000_0008H
//!    ECX\[15:12\] (threads per core from 8000_001EH EBX\[15:8\]) on AMD.
//! 3. Nothing at all: each APIC ID is a core of its own, all in package 0
//!    (nothing tells packages apart).
//!
//! IDs follow Linux's: the package ID is the APIC ID shifted past every
//! level below the package; the core ID and the die ID are relative to
//! their package (the APIC ID's bits below the package, shifted past the
//! levels below the core, or below the die).

use crate::cpuid::Cpuid;

/// Which CPUID leaves described the topology.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Leaf 1FH.
    Leaf1F,
    /// Leaf 0BH.
    Leaf0B,
    /// Leaf 1 with leaf 4 (Intel).
    Leaf4,
    /// Leaf 8000_0008H (AMD).
    Amd,
    /// Leaf 1 alone: logical processors per package, not split into cores
    /// and threads.
    Leaf1,
    /// Nothing: every CPU a core of its own in package 0.
    None,
}

/// Level types of leaves 0BH and 1FH (ECX\[15:8\]).
const LEVEL_SMT: u32 = 1;
const LEVEL_DIE: u32 = 5;
/// The most sub-leaves read (the SDM defines six level types).
const MAX_LEVELS: u32 = 8;

/// The field widths of the APIC ID, as right-shift counts (0..=32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Topology {
    /// The bits of the thread within its core.
    pub smt_shift: u32,
    /// The bits below the die: the shift that gives a die's ID (equal to
    /// `pkg_shift` when no die level is described).
    pub die_shift: u32,
    /// The bits below the package.
    pub pkg_shift: u32,
    /// Where the widths came from.
    pub source: Source,
}

/// One CPU's place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// The package (socket).
    pub package: u32,
    /// The die within its package.
    pub die: u32,
    /// The core within its package.
    pub core: u32,
    /// The thread within its core.
    pub thread: u32,
}

/// `v >> s`, 0 once `s` covers every bit.
fn shr(v: u32, s: u32) -> u32 {
    v.checked_shr(s).unwrap_or(0)
}

/// The low `s` bits set.
fn low_bits(s: u32) -> u32 {
    if s >= 32 { u32::MAX } else { (1 << s) - 1 }
}

/// Bits needed to number `n` things (`n` rounded up to a power of two).
fn count_order(n: u32) -> u32 {
    32 - (n.max(1) - 1).leading_zeros()
}

impl Topology {
    /// Every CPU a core of its own, in package 0.
    pub const FLAT: Topology = Topology {
        smt_shift: 0,
        die_shift: 32,
        pkg_shift: 32,
        source: Source::None,
    };

    /// The topology this CPU's CPUID describes.
    pub fn detect(cpuid: &impl Cpuid) -> Topology {
        let max_leaf = cpuid.cpuid(0, 0).eax;
        for (leaf, source) in [(0x1F, Source::Leaf1F), (0xB, Source::Leaf0B)] {
            if max_leaf >= leaf
                && let Some(t) = extended(cpuid, leaf, source)
            {
                return t;
            }
        }
        legacy(cpuid, max_leaf)
    }

    /// Where the CPU with APIC ID `apic_id` sits.
    pub fn place(&self, apic_id: u32) -> Place {
        let in_package = apic_id & low_bits(self.pkg_shift);
        Place {
            package: shr(apic_id, self.pkg_shift),
            die: shr(in_package, self.die_shift),
            core: shr(in_package, self.smt_shift),
            thread: apic_id & low_bits(self.smt_shift),
        }
    }
}

/// The topology from leaf 0BH or 1FH, `None` when the leaf is not
/// supported (sub-leaf 0 reports no logical processor or no level).
fn extended(cpuid: &impl Cpuid, leaf: u32, source: Source) -> Option<Topology> {
    let mut smt = None;
    let mut die = None;
    let mut below = 0;
    let mut last = None;
    for sub in 0..MAX_LEVELS {
        let r = cpuid.cpuid(leaf, sub);
        let kind = (r.ecx >> 8) & 0xFF;
        if kind == 0 || (sub == 0 && r.ebx & 0xFFFF == 0) {
            break;
        }
        // A shift never goes down from one level to the next; a table
        // that says so is read as the level below's.
        let shift = (r.eax & 0x1F).max(below);
        match kind {
            LEVEL_SMT => smt = Some(shift),
            // Leaf 1FH's die level: its ID is the APIC ID past the levels
            // below it. Leaf 0BH only defines SMT and core.
            LEVEL_DIE if leaf == 0x1F => die = Some(below),
            _ => {}
        }
        below = shift;
        last = Some(shift);
    }
    let pkg_shift = last?;
    Some(Topology {
        smt_shift: smt.unwrap_or(0).min(pkg_shift),
        die_shift: die.unwrap_or(pkg_shift).min(pkg_shift),
        pkg_shift,
        source,
    })
}

/// The topology from leaf 1 and the vendor's core count leaf.
fn legacy(cpuid: &impl Cpuid, max_leaf: u32) -> Topology {
    let l0 = cpuid.cpuid(0, 0);
    let intel = (l0.ebx, l0.edx, l0.ecx) == (0x756E_6547, 0x4965_6E69, 0x6C65_746E);
    let amd = (l0.ebx, l0.edx, l0.ecx) == (0x6874_7541, 0x6974_6E65, 0x444D_4163)
        || (l0.ebx, l0.edx, l0.ecx) == (0x6F67_7948, 0x6E65_476E, 0x656E_6975);
    let l1 = if max_leaf >= 1 {
        cpuid.cpuid(1, 0)
    } else {
        crate::cpuid::regs(0, 0, 0, 0)
    };
    // Leaf 1 EBX[23:16] counts only when EDX.HTT says so.
    let per_package = (l1.edx & (1 << 28) != 0).then_some((l1.ebx >> 16) & 0xFF);
    let flat = |smt_shift: u32, pkg_shift: u32, source| Topology {
        smt_shift: smt_shift.min(pkg_shift),
        die_shift: pkg_shift,
        pkg_shift,
        source,
    };
    if amd {
        let max_ext = cpuid.cpuid(0x8000_0000, 0).eax;
        if max_ext >= 0x8000_0008 {
            let ecx = cpuid.cpuid(0x8000_0008, 0).ecx;
            let width = (ecx >> 12) & 0xF;
            let pkg_shift = if width != 0 {
                width
            } else {
                count_order((ecx & 0xFF) + 1)
            };
            // Threads per core: 8000_001EH, with TopologyExtensions
            // (8000_0001H ECX[22]).
            let topoext =
                max_ext >= 0x8000_0001 && cpuid.cpuid(0x8000_0001, 0).ecx & (1 << 22) != 0;
            let smt_shift = if topoext && max_ext >= 0x8000_001E {
                count_order(((cpuid.cpuid(0x8000_001E, 0).ebx >> 8) & 0xFF) + 1)
            } else {
                0
            };
            return flat(smt_shift, pkg_shift, Source::Amd);
        }
    }
    if intel && max_leaf >= 4 {
        let cores = (cpuid.cpuid(4, 0).eax >> 26) + 1;
        let core_bits = count_order(cores);
        let pkg_shift = per_package.map_or(core_bits, |n| count_order(n).max(core_bits));
        return flat(pkg_shift - core_bits, pkg_shift, Source::Leaf4);
    }
    match per_package {
        Some(n) => flat(0, count_order(n), Source::Leaf1),
        None => Topology::FLAT,
    }
}

/// This CPU's APIC ID as CPUID gives it: the x2APIC ID of leaf 0BH (or
/// 1FH) EDX when it is supported, else the initial APIC ID of leaf 1
/// EBX\[31:24\].
pub fn apic_id(cpuid: &impl Cpuid) -> u32 {
    let max_leaf = cpuid.cpuid(0, 0).eax;
    for leaf in [0x1F, 0xB] {
        if max_leaf >= leaf {
            let r = cpuid.cpuid(leaf, 0);
            if r.ebx & 0xFFFF != 0 {
                return r.edx;
            }
        }
    }
    cpuid.cpuid(1, 0).ebx >> 24
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpuid::{CpuIdResult, CpuidTable, regs};

    // "GenuineIntel" / "AuthenticAMD" in EBX, EDX, ECX, with the highest
    // basic leaf in EAX.
    const fn intel(max: u32) -> CpuIdResult {
        regs(max, 0x756E_6547, 0x6C65_746E, 0x4965_6E69)
    }
    const fn amd(max: u32) -> CpuIdResult {
        regs(max, 0x6874_7541, 0x444D_4163, 0x6974_6E65)
    }

    /// A sub-leaf of 0BH/1FH: `shift`, `n` logical processors, level
    /// number `sub` of type `kind`, x2APIC ID `apic`.
    const fn level(shift: u32, n: u32, sub: u32, kind: u32, apic: u32) -> CpuIdResult {
        regs(shift, n, kind << 8 | sub, apic)
    }

    fn places(t: &Topology, ids: &[u32]) -> Vec<(u32, u32, u32, u32)> {
        ids.iter()
            .map(|&a| {
                let p = t.place(a);
                (p.package, p.die, p.core, p.thread)
            })
            .collect()
    }

    #[test]
    fn alder_lake_hybrid_from_leaf_1f() {
        // i9-12900K (family 6 model 0x97) as read on P-core 0: eight
        // P-cores with two threads (APIC IDs 0, 1, 8, 9, ... 56, 57) and
        // eight E-cores (64, 66, ... 78); SMT shift 1, core shift 7, no
        // die level. Leaf 0BH says the same.
        let rows = [
            (0, 0, intel(0x20)),
            (
                1,
                0,
                regs(0x0009_0672, 0x0080_0800, 0x7FFA_FBFF, 0xBFEB_FBFF),
            ),
            (0xB, 0, level(1, 2, 0, 1, 0)),
            (0xB, 1, level(7, 24, 1, 2, 0)),
            (0xB, 2, level(0, 0, 2, 0, 0)),
            (0x1F, 0, level(1, 2, 0, 1, 0)),
            (0x1F, 1, level(7, 24, 1, 2, 0)),
            (0x1F, 2, level(0, 0, 2, 0, 0)),
        ];
        let t = Topology::detect(&CpuidTable { rows: &rows });
        assert_eq!(t.source, Source::Leaf1F);
        assert_eq!((t.smt_shift, t.die_shift, t.pkg_shift), (1, 7, 7));
        assert_eq!(
            places(&t, &[0, 1, 8, 57, 64, 66, 78]),
            [
                (0, 0, 0, 0),
                (0, 0, 0, 1),
                (0, 0, 4, 0),
                (0, 0, 28, 1),
                (0, 0, 32, 0),
                (0, 0, 33, 0),
                (0, 0, 39, 0),
            ]
        );
        assert_eq!(apic_id(&CpuidTable { rows: &rows }), 0);
    }

    #[test]
    fn two_socket_ice_lake_server_from_leaf_0b() {
        // Xeon Platinum 8380 (40 cores, two threads each), as read on a
        // CPU of the second socket: the highest basic leaf is 1BH, so no
        // 1FH; SMT shift 1, core shift 7, the second package's APIC IDs
        // from 0x80.
        let rows = [
            (0, 0, intel(0x1B)),
            (
                1,
                0,
                regs(0x0006_06A6, 0x8140_0800, 0x7FFE_FBFF, 0xBFEB_FBFF),
            ),
            (0xB, 0, level(1, 2, 0, 1, 0x81)),
            (0xB, 1, level(7, 80, 1, 2, 0x81)),
            // Leaf 1FH past the highest leaf would repeat 1BH's answer:
            // never read.
            (0x1F, 0, level(9, 9, 0, 1, 0x81)),
        ];
        let t = Topology::detect(&CpuidTable { rows: &rows });
        assert_eq!(t.source, Source::Leaf0B);
        assert_eq!((t.smt_shift, t.die_shift, t.pkg_shift), (1, 7, 7));
        assert_eq!(
            places(&t, &[0, 1, 0x4F, 0x80, 0x81, 0x9B]),
            [
                (0, 0, 0, 0),
                (0, 0, 0, 1),
                (0, 0, 39, 1),
                (1, 0, 0, 0),
                (1, 0, 0, 1),
                (1, 0, 13, 1),
            ]
        );
        assert_eq!(apic_id(&CpuidTable { rows: &rows }), 0x81);
    }

    #[test]
    fn leaf_1f_die_level_is_preferred_to_leaf_0b() {
        // Two dies of 32 cores per package (SMT 1, core 6, die 7 bits);
        // leaf 0BH folds the dies into the core level.
        let rows = [
            (0, 0, intel(0x1F)),
            (0xB, 0, level(1, 2, 0, 1, 0)),
            (0xB, 1, level(7, 128, 1, 2, 0)),
            (0x1F, 0, level(1, 2, 0, 1, 0)),
            (0x1F, 1, level(6, 64, 1, 2, 0)),
            (0x1F, 2, level(7, 128, 2, 5, 0)),
        ];
        let t = Topology::detect(&CpuidTable { rows: &rows });
        assert_eq!(t.source, Source::Leaf1F);
        assert_eq!((t.smt_shift, t.die_shift, t.pkg_shift), (1, 6, 7));
        assert_eq!(
            places(&t, &[0x3F, 0x40, 0x41, 0xC2]),
            [(0, 0, 31, 1), (0, 1, 32, 0), (0, 1, 32, 1), (1, 1, 33, 0)]
        );
    }

    #[test]
    fn leaf_0b_that_reports_nothing_falls_back() {
        // A hypervisor that lists leaf 0BH but leaves it zero: leaf 1 and
        // leaf 4 (four cores, no SMT) describe the package.
        let rows = [
            (0, 0, intel(0xD)),
            (1, 0, regs(0x0001_0676, 0x0004_0800, 0, 1 << 28)),
            (4, 0, regs(3 << 26 | 0x121, 0, 0, 0)),
        ];
        let t = Topology::detect(&CpuidTable { rows: &rows });
        assert_eq!(t.source, Source::Leaf4);
        assert_eq!((t.smt_shift, t.pkg_shift), (0, 2));
        assert_eq!(
            places(&t, &[0, 3, 4, 7]),
            [(0, 0, 0, 0), (0, 0, 3, 0), (1, 0, 0, 0), (1, 0, 3, 0)]
        );
    }

    #[test]
    fn amd_zen_epyc_from_leaf_8000_0008() {
        // EPYC 7601 (family 17h, 32 cores with two threads, no leaf 0BH):
        // 8000_0008H ECX gives 6 APIC ID bits per package (NC = 63),
        // 8000_001EH EBX two threads per core.
        let rows = [
            (0, 0, amd(0xD)),
            (
                1,
                0,
                regs(0x0080_0F12, 0x4040_0800, 0x7ED8_320B, 0x178B_FBFF),
            ),
            (0x8000_0000, 0, regs(0x8000_001F, 0, 0, 0)),
            (
                0x8000_0001,
                0,
                regs(0x0080_0F12, 0, 0x35C2_33FF, 0x2FD3_FBFF),
            ),
            (0x8000_0008, 0, regs(0x0000_3030, 0, 0x0000_603F, 0)),
            (0x8000_001E, 0, regs(0x40, 0x0000_0100, 0x0000_0300, 0)),
        ];
        let t = Topology::detect(&CpuidTable { rows: &rows });
        assert_eq!(t.source, Source::Amd);
        assert_eq!((t.smt_shift, t.die_shift, t.pkg_shift), (1, 6, 6));
        assert_eq!(
            places(&t, &[0, 1, 0x3F, 0x40, 0x45]),
            [
                (0, 0, 0, 0),
                (0, 0, 0, 1),
                (0, 0, 31, 1),
                (1, 0, 0, 0),
                (1, 0, 2, 1)
            ]
        );
        assert_eq!(apic_id(&CpuidTable { rows: &rows }), 0x40);
    }

    #[test]
    fn amd_without_topology_extensions_counts_no_threads() {
        // QEMU's default CPU (qemu64, AMD family 15) with `-smp 4` as four
        // sockets: 8000_0008H ECX is 0, one logical processor per package.
        let rows = [
            (0, 0, amd(0xD)),
            (
                1,
                0,
                regs(0x0006_0FB1, 0x0000_0800, 0x8000_2209, 0x078B_FBFD),
            ),
            (0x8000_0000, 0, regs(0x8000_000A, 0, 0, 0)),
            (0x8000_0001, 0, regs(0, 0, 0x0000_0021, 0x2191_3800)),
            (0x8000_0008, 0, regs(0x0000_3028, 0, 0, 0)),
        ];
        let t = Topology::detect(&CpuidTable { rows: &rows });
        assert_eq!(t.source, Source::Amd);
        assert_eq!((t.smt_shift, t.pkg_shift), (0, 0));
        assert_eq!(
            places(&t, &[0, 1, 3]),
            [(0, 0, 0, 0), (1, 0, 0, 0), (3, 0, 0, 0)]
        );
    }

    #[test]
    fn no_topology_leaf_makes_every_cpu_a_core_of_package_0() {
        // An unknown vendor, no leaf 0BH/1FH, HTT clear.
        let rows = [
            (0, 0, regs(0xD, 0x2020_2020, 0x2020_2020, 0x2020_2020)),
            (1, 0, regs(0x0006_0FB1, 0x0300_0800, 0, 0)),
        ];
        let t = Topology::detect(&CpuidTable { rows: &rows });
        assert_eq!(t, Topology::FLAT);
        assert_eq!(
            places(&t, &[0, 1, 7, u32::MAX]),
            [
                (0, 0, 0, 0),
                (0, 0, 1, 0),
                (0, 0, 7, 0),
                (0, 0, u32::MAX, 0)
            ]
        );
        assert_eq!(apic_id(&CpuidTable { rows: &rows }), 3);
        // Nothing at all (every leaf zero) is the same.
        assert_eq!(Topology::detect(&CpuidTable { rows: &[] }), Topology::FLAT);
    }

    #[test]
    fn leaf_1_alone_gives_the_package_width() {
        // HTT set with 8 logical processors per package, unknown vendor.
        let rows = [
            (0, 0, regs(0x5, 0x2020_2020, 0x2020_2020, 0x2020_2020)),
            (1, 0, regs(0, 0x0008_0000, 0, 1 << 28)),
        ];
        let t = Topology::detect(&CpuidTable { rows: &rows });
        assert_eq!(t.source, Source::Leaf1);
        assert_eq!((t.smt_shift, t.pkg_shift), (0, 3));
        assert_eq!(places(&t, &[9]), [(1, 0, 1, 0)]);
    }

    #[test]
    fn hostile_tables_never_panic() {
        // Shifts past 31, decreasing shifts, levels that never end.
        let rows = [
            (0, 0, intel(0x1F)),
            (0x1F, 0, level(31, 1, 0, 1, 5)),
            (0x1F, 1, level(3, 1, 1, 5, 5)),
            (0x1F, 2, level(0x1F, 1, 2, 9, 5)),
            (0x1F, 3, level(0x1F, 1, 3, 2, 5)),
            (0x1F, 4, level(0x1F, 1, 4, 2, 5)),
            (0x1F, 5, level(0x1F, 1, 5, 2, 5)),
            (0x1F, 6, level(0x1F, 1, 6, 2, 5)),
            (0x1F, 7, level(0x1F, 1, 7, 2, 5)),
            (0x1F, 8, level(0x1F, 1, 8, 2, 5)),
        ];
        let t = Topology::detect(&CpuidTable { rows: &rows });
        for a in [0, 1, 0x8000_0000, u32::MAX] {
            let _ = t.place(a);
        }
        for leaf4 in [0, u32::MAX] {
            let rows = [
                (0, 0, intel(4)),
                (1, 0, regs(0, u32::MAX, 0, u32::MAX)),
                (4, 0, regs(leaf4, 0, 0, 0)),
            ];
            let t = Topology::detect(&CpuidTable { rows: &rows });
            assert!(t.smt_shift <= t.pkg_shift && t.pkg_shift <= 32);
            let _ = t.place(u32::MAX);
        }
    }
}
