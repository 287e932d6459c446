//! CPUID access behind a narrow trait, and PMU detection from CPUID alone.
//!
//! Detection never probes MSRs (QEMU TCG returns 0 for any of them without a
//! fault). The only MSRs read are IA32_PERF_CAPABILITIES, when CPUID.1:ECX.PDCM
//! says it exists, and IA32_MISC_ENABLE, which is architectural, when DS is
//! advertised.

use crate::msr::{Msr, addr};
pub use crate::pmu::models::CoreType;
use raw_cpuid::CpuId;
pub use raw_cpuid::CpuIdResult;

/// A source of CPUID results: the real instruction or a table.
pub trait Cpuid {
    /// Execute CPUID with `leaf` in EAX and `subleaf` in ECX.
    fn cpuid(&self, leaf: u32, subleaf: u32) -> CpuIdResult;
}

/// The processor's own CPUID instruction.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuCpuid;

impl Cpuid for CpuCpuid {
    fn cpuid(&self, leaf: u32, subleaf: u32) -> CpuIdResult {
        let r = core::arch::x86_64::__cpuid_count(leaf, subleaf);
        CpuIdResult {
            eax: r.eax,
            ebx: r.ebx,
            ecx: r.ecx,
            edx: r.edx,
        }
    }
}

/// A fixed CPUID table (tests and the simulator). Leaves not listed read as zero.
#[derive(Debug, Clone, Copy)]
pub struct CpuidTable<'a> {
    /// `(leaf, subleaf, result)` rows; a leaf's first matching row wins.
    pub rows: &'a [(u32, u32, CpuIdResult)],
}

impl Cpuid for CpuidTable<'_> {
    fn cpuid(&self, leaf: u32, subleaf: u32) -> CpuIdResult {
        self.rows
            .iter()
            .find(|(l, s, _)| *l == leaf && *s == subleaf)
            .map(|(_, _, r)| *r)
            .unwrap_or(CpuIdResult {
                eax: 0,
                ebx: 0,
                ecx: 0,
                edx: 0,
            })
    }
}

/// Build a [`CpuIdResult`] from its four registers.
pub const fn regs(eax: u32, ebx: u32, ecx: u32, edx: u32) -> CpuIdResult {
    CpuIdResult { eax, ebx, ecx, edx }
}

/// CPU vendor, as far as the PMU drivers care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vendor {
    /// GenuineIntel.
    Intel,
    /// AuthenticAMD or HygonGenuine.
    Amd,
    /// Anything else (including a hypervisor that hides the vendor).
    Other,
}

/// Which LBR facility the CPU has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LbrKind {
    /// No usable LBR.
    None,
    /// Model-specific LBR: format from PERF_CAPABILITIES\[5:0\], depth and MSR
    /// addresses from the model table.
    Legacy {
        /// LBR format (PERF_CAPABILITIES\[5:0\]).
        format: u8,
        /// Number of entries.
        depth: u8,
        /// Address of FROM_IP entry 0.
        from: u32,
        /// Address of TO_IP entry 0.
        to: u32,
        /// Address of LBR_INFO entry 0 (format 5 and 7), else 0.
        info: u32,
    },
    /// Architectural LBR (CPUID.7.0:EDX\[19\], leaf 0x1C).
    Arch {
        /// Largest supported depth.
        max_depth: u8,
        /// Bitmap of supported depths: bit n set means depth 8*(n+1).
        depth_mask: u8,
        /// CPL filtering supported.
        cpl_filter: bool,
        /// Branch-type filtering supported.
        branch_filter: bool,
        /// Call-stack mode supported.
        call_stack: bool,
        /// INFO carries the mispredict bit.
        mispredict: bool,
        /// INFO carries cycle counts.
        timed: bool,
        /// INFO carries the branch type.
        branch_type: bool,
    },
    /// AMD LbrExtV2 (CPUID 0x8000_0022 EAX\[1\]).
    AmdV2 {
        /// Number of entries (EBX\[9:4\]).
        depth: u8,
        /// LBR and counters freeze on PMI (EAX\[2\]).
        freeze: bool,
    },
}

/// Everything the drivers need to know about the PMU, from CPUID (and
/// IA32_PERF_CAPABILITIES when CPUID says it exists).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PmuInfo {
    /// CPU vendor.
    pub vendor: Vendor,
    /// Display family.
    pub family: u8,
    /// Display model.
    pub model: u8,
    /// Stepping (CPUID.1:EAX\[3:0\]).
    pub stepping: u8,
    /// A CPU of a hybrid part (Intel CPUID.07H.0:EDX\[15\]).
    pub hybrid: bool,
    /// The core type of this CPU of a hybrid part (CPUID leaf 1AH);
    /// `None` when not hybrid or the type is unknown.
    pub core_type: Option<CoreType>,
    /// Intel architectural perfmon version (CPUID.0xA:EAX\[7:0\]); 0 when none.
    /// On AMD: 1 for the legacy counters, 2 with PerfMonV2.
    pub version: u8,
    /// Number of general-purpose counters.
    pub gp_counters: u8,
    /// Width of the general-purpose counters in bits.
    pub gp_width: u8,
    /// Bitmap of the fixed counters present (Intel only).
    pub fixed_mask: u8,
    /// Width of the fixed counters in bits.
    pub fixed_width: u8,
    /// CPUID.0xA:EBX: architectural events NOT available (bit set = missing).
    pub events_unavailable: u32,
    /// IA32_PERF_CAPABILITIES, 0 when PDCM is clear.
    pub perf_capabilities: u64,
    /// PEBS record format when PEBS is usable (DS, DTES64, PDCM, not disabled
    /// in IA32_MISC_ENABLE), else `None`.
    pub pebs_format: Option<u8>,
    /// Adaptive PEBS (PERF_CAPABILITIES\[14\], "PEBS baseline").
    pub pebs_baseline: bool,
    /// LBR facility.
    pub lbr: LbrKind,
    /// AMD: the six-counter extended set at 0xC001_0200 (PerfCtrExtCore).
    pub amd_ext: bool,
    /// AMD: PerfMonV2 global control and status.
    pub amd_v2: bool,
}

impl PmuInfo {
    /// True when there are counters to program.
    pub fn has_pmu(&self) -> bool {
        self.gp_counters > 0 || self.fixed_mask != 0
    }

    /// Counters can be written with their full width (IA32_A_PMCx).
    pub fn full_width_write(&self) -> bool {
        self.perf_capabilities & (1 << 13) != 0
    }

    /// Number of fixed counters present.
    pub fn fixed_counters(&self) -> u8 {
        self.fixed_mask.count_ones() as u8
    }

    /// LBR format for the stream's capabilities: PERF_CAPABILITIES\[5:0\] for
    /// legacy LBR, 0x3F for architectural LBR, `None` without (or on AMD,
    /// whose LbrExtV2 has no format number).
    pub fn lbr_format(&self) -> Option<u8> {
        match self.lbr {
            LbrKind::Legacy { format, .. } => Some(format),
            LbrKind::Arch { .. } => Some(0x3F),
            LbrKind::AmdV2 { .. } | LbrKind::None => None,
        }
    }

    /// The model-table row the drivers follow for this CPU: on a hybrid
    /// part the row of its core type
    /// ([`crate::pmu::models::UNKNOWN_MODEL`] outside the table).
    pub fn row(&self) -> &'static crate::pmu::models::IntelModel {
        crate::pmu::models::row_for_core(
            self.vendor == Vendor::Intel,
            self.family,
            self.model,
            self.hybrid,
            self.core_type,
        )
    }

    /// How the decoder reads the load data-source field of this CPU's PEBS
    /// records (the row's table).
    pub fn pebs_data_source(&self) -> sampler::pebs::DataSource {
        self.row().data_source
    }

    /// PEBS assists are trap-like (PERF_CAPABILITIES\[6\]): the IP field of
    /// a record is the instruction after the eventing one.
    pub fn pebs_trap(&self) -> bool {
        self.perf_capabilities & (1 << 6) != 0
    }

    /// PEBS records need the IP fix-up of `sampler::pebs::fixup_ip`: trap-
    /// like assists on formats 0 and 1, which have no eventing-IP field
    /// (Haswell's format 2 added it). Linux `intel_pmu_pebs_fixup_ip`
    /// returns at once when PERF_CAPABILITIES\[6\] is clear.
    pub fn pebs_ip_needs_fixup(&self) -> bool {
        self.pebs_trap() && self.pebs_format.is_some_and(|f| f < 2)
    }

    /// LBR depth, 0 without LBR.
    pub fn lbr_depth(&self) -> u8 {
        match self.lbr {
            LbrKind::Legacy { depth, .. } | LbrKind::AmdV2 { depth, .. } => depth,
            LbrKind::Arch { max_depth, .. } => max_depth,
            LbrKind::None => 0,
        }
    }

    /// A short human-readable reason when there is no PMU, for the fallback message.
    pub fn missing_reason(&self) -> Option<&'static str> {
        if self.has_pmu() {
            return None;
        }
        Some(match self.vendor {
            Vendor::Intel => {
                "no PMU: CPUID leaf 0xA reports no usable architectural perfmon (none, or an event vector shorter than the seven architectural events: an emulator or hypervisor without a full virtual PMU)"
            }
            Vendor::Amd => "no PMU: AMD CPU without performance counters in CPUID",
            Vendor::Other => "no PMU: unknown CPU vendor, CPUID advertises no counters",
        })
    }
}

fn bits(v: u32, lo: u32, hi: u32) -> u32 {
    (v >> lo) & ((1u32 << (hi - lo + 1)) - 1)
}

/// Detect the PMU through CPUID. `msr` is used only for IA32_PERF_CAPABILITIES
/// (when PDCM is set) and IA32_MISC_ENABLE (when DS is set).
pub fn detect(cpuid: &impl Cpuid, msr: &mut impl Msr) -> PmuInfo {
    let reader = |a: u32, c: u32| cpuid.cpuid(a, c);
    let rc = CpuId::with_cpuid_reader(reader);
    let vendor = match rc.get_vendor_info().as_ref().map(|v| v.as_str()) {
        Some("GenuineIntel") => Vendor::Intel,
        Some("AuthenticAMD") | Some("HygonGenuine") => Vendor::Amd,
        _ => Vendor::Other,
    };
    let fi = rc.get_feature_info();
    let (family, model, stepping) = fi
        .as_ref()
        .map(|f| (f.family_id(), f.model_id(), f.stepping_id()))
        .unwrap_or((0, 0, 0));
    let mut info = PmuInfo {
        vendor,
        family,
        model,
        stepping,
        hybrid: false,
        core_type: None,
        version: 0,
        gp_counters: 0,
        gp_width: 0,
        fixed_mask: 0,
        fixed_width: 0,
        events_unavailable: 0,
        perf_capabilities: 0,
        pebs_format: None,
        pebs_baseline: false,
        lbr: LbrKind::None,
        amd_ext: false,
        amd_v2: false,
    };
    match vendor {
        Vendor::Amd => detect_amd(cpuid, &mut info),
        Vendor::Intel | Vendor::Other => {
            let max_leaf = cpuid.cpuid(0, 0).eax;
            // Hybrid parts: this CPU's core type picks the model row (SDM
            // vol. 2A CPUID leaves 07H EDX[15] and 1AH EAX[31:24]).
            if vendor == Vendor::Intel && max_leaf >= 7 {
                info.hybrid = cpuid.cpuid(7, 0).edx & (1 << 15) != 0;
                if info.hybrid && max_leaf >= 0x1A {
                    info.core_type = CoreType::from_leaf_1a(cpuid.cpuid(0x1A, 0).eax);
                }
            }
            if max_leaf < 0xA {
                return info;
            }
            // SDM vol. 2 CPUID leaf 0AH; SDM vol. 3 20.2 "Architectural Performance Monitoring".
            let a = cpuid.cpuid(0xA, 0);
            info.version = bits(a.eax, 0, 7) as u8;
            if info.version == 0 {
                return info;
            }
            let ebx_len = bits(a.eax, 24, 31);
            // Linux's intel_pmu_init refuses a leaf whose event vector is
            // shorter than the seven architectural events
            // (ARCH_PERFMON_EVENTS_COUNT): no PMU.
            if ebx_len < 7 {
                info.version = 0;
                return info;
            }
            info.gp_counters = bits(a.eax, 8, 15) as u8;
            info.gp_width = bits(a.eax, 16, 23) as u8;
            info.events_unavailable = a.ebx
                & if ebx_len >= 32 {
                    u32::MAX
                } else {
                    (1u32 << ebx_len) - 1
                };
            if info.version >= 2 {
                let mut nfixed = bits(a.edx, 0, 4);
                // Linux's quirk: perfmon v2 to v4 may not report the fixed
                // counters; on bare metal (CPUID.1:ECX[31] clear) at least
                // three are assumed.
                let hypervisor = cpuid.cpuid(1, 0).ecx & (1 << 31) != 0;
                if info.version < 5 && !hypervisor {
                    nfixed = nfixed.max(3);
                }
                info.fixed_width = bits(a.edx, 5, 12) as u8;
                // v5: ECX is a bitmap of supported fixed counters; a counter is
                // usable if its ECX bit is set or its index is below EDX[4:0].
                let mut mask = if nfixed >= 8 {
                    0xFF
                } else {
                    (1u32 << nfixed) - 1
                };
                if info.version >= 5 {
                    mask |= a.ecx;
                }
                info.fixed_mask = (mask & 0xF) as u8; // FIXED_CTR0..3 are the ones we program
            }
            let pdcm = fi.as_ref().is_some_and(|f| f.has_pdcm());
            if pdcm {
                info.perf_capabilities = msr.read(addr::IA32_PERF_CAPABILITIES);
            }
            let ds = fi.as_ref().is_some_and(|f| f.has_ds());
            let dtes64 = fi.as_ref().is_some_and(|f| f.has_ds_area());
            if ds && dtes64 && pdcm {
                let misc = msr.read(addr::IA32_MISC_ENABLE);
                // Models whose PEBS is unreliable get none (model table).
                let broken = info.row().pebs_quirks.broken;
                if misc & (1 << 12) == 0 && !broken {
                    info.pebs_format = Some(((info.perf_capabilities >> 8) & 0xF) as u8);
                    info.pebs_baseline = info.perf_capabilities & (1 << 14) != 0;
                }
            }
            info.lbr = detect_intel_lbr(cpuid, &info, max_leaf);
        }
    }
    info
}

fn detect_intel_lbr(cpuid: &impl Cpuid, info: &PmuInfo, max_leaf: u32) -> LbrKind {
    if max_leaf >= 0x1C && cpuid.cpuid(7, 0).edx & (1 << 19) != 0 {
        // SDM vol. 3 "Architectural Last Branch Records", CPUID leaf 1CH.
        let l = cpuid.cpuid(0x1C, 0);
        let depth_mask = (l.eax & 0xFF) as u8;
        if depth_mask != 0 {
            let max_depth = 8 * (8 - depth_mask.leading_zeros() as u8);
            return LbrKind::Arch {
                max_depth,
                depth_mask,
                cpl_filter: l.ebx & 1 != 0,
                branch_filter: l.ebx & 2 != 0,
                call_stack: l.ebx & 4 != 0,
                mispredict: l.ecx & 1 != 0,
                timed: l.ecx & 2 != 0,
                branch_type: l.ecx & 4 != 0,
            };
        }
    }
    if info.vendor != Vendor::Intel || info.family != 6 || info.perf_capabilities == 0 {
        return LbrKind::None;
    }
    let mut format = (info.perf_capabilities & 0x3F) as u8;
    let row = info.row();
    // Early steppings whose LBR cannot freeze on a PMI have none (model
    // table, `lbr_min_stepping`).
    if row.lbr_broken(info.model, info.stepping) {
        return LbrKind::None;
    }
    let Some(l) = row.legacy_lbr() else {
        return LbrKind::None;
    };
    // Knights Landing / Mill report LIP but keep the mispredict flag in
    // FROM[63] (model table, `lip_has_mispred`).
    if l.lip_has_mispred && format == 1 {
        format = 3;
    }
    let info_addr = if matches!(format, 5 | 7) {
        addr::MSR_LBR_INFO_0
    } else {
        0
    };
    LbrKind::Legacy {
        format,
        depth: l.depth,
        from: l.from,
        to: l.to,
        info: info_addr,
    }
}

/// Depth and FROM/TO base addresses of the model-specific LBR stack of an
/// Intel family 6 model, from the model table ([`crate::pmu::models`]).
pub fn legacy_lbr_model(model: u8) -> Option<(u8, u32, u32)> {
    crate::pmu::models::intel_row(model)
        .and_then(|r| r.legacy_lbr())
        .map(|l| (l.depth, l.from, l.to))
}

fn detect_amd(cpuid: &impl Cpuid, info: &mut PmuInfo) {
    // AMD APM vol. 3 CPUID Fn8000_0001_ECX[23] PerfCtrExtCore, Fn8000_0022.
    // The four legacy counters have no CPUID bit of their own. They are
    // trusted only on bare metal (CPUID.1:ECX[31] clear) before family 15h;
    // under a hypervisor (QEMU TCG's default CPU is an AMD model) the
    // PerfCtrExtCore or PerfMonV2 bit must advertise them.
    let hypervisor = cpuid.cpuid(1, 0).ecx & (1 << 31) != 0;
    let max_ext = cpuid.cpuid(0x8000_0000, 0).eax;
    if max_ext >= 0x8000_0001 {
        info.amd_ext = cpuid.cpuid(0x8000_0001, 0).ecx & (1 << 23) != 0;
    }
    let mut advertised_v2 = false;
    if max_ext >= 0x8000_0022 {
        let l = cpuid.cpuid(0x8000_0022, 0);
        advertised_v2 = l.eax & 1 != 0;
        // Linux (amd_core_pmu_init) sets PerfMonV2 up only with
        // PerfCtrExtCore: its global registers and counter count belong
        // to the extended layout.
        if advertised_v2 && info.amd_ext {
            info.amd_v2 = true;
            info.gp_counters = bits(l.ebx, 0, 3) as u8;
        }
        // LbrExtV2 is driven through the PerfMonV2 global registers (its
        // freeze and status bits live there): without PerfMonV2 it is unused.
        if l.eax & 2 != 0 && info.amd_v2 {
            let depth = bits(l.ebx, 4, 9) as u8;
            if depth > 0 {
                info.lbr = LbrKind::AmdV2 {
                    depth,
                    freeze: l.eax & 4 != 0,
                };
            }
        }
    }
    let legacy_bare_metal = !hypervisor && (6..0x15).contains(&info.family);
    if !(info.amd_ext || advertised_v2 || legacy_bare_metal) {
        info.lbr = LbrKind::None;
        return;
    }
    info.gp_width = 48;
    info.version = if info.amd_v2 { 2 } else { 1 };
    if info.gp_counters == 0 {
        info.gp_counters = if info.amd_ext { 6 } else { 4 };
    }
    if !info.amd_ext && !info.amd_v2 {
        info.gp_counters = info.gp_counters.min(4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoMsr;
    impl Msr for NoMsr {
        fn read(&mut self, addr: u32) -> u64 {
            panic!("detection read MSR {addr:#x} without CPUID saying it exists")
        }
        fn write(&mut self, addr: u32, _: u64) {
            panic!("detection wrote MSR {addr:#x}")
        }
    }

    // "AuthenticAMD" / "GenuineIntel" in EBX, EDX, ECX.
    const AMD: CpuIdResult = regs(0xD, 0x6874_7541, 0x444D_4163, 0x6974_6E65);
    const INTEL: CpuIdResult = regs(0xD, 0x756E_6547, 0x6C65_746E, 0x4965_6E69);

    #[test]
    fn qemu_tcg_default_cpu_has_no_pmu_and_no_msr_is_touched() {
        // qemu64: AMD family 15 model 107, hypervisor bit, no PerfCtrExtCore.
        let rows = [
            (0, 0, AMD),
            (1, 0, regs(0x0006_0FB1, 0, 0x8000_2209, 0x078B_FBFD)),
            (0x8000_0000, 0, regs(0x8000_000A, 0, 0, 0)),
            (0x8000_0001, 0, regs(0, 0, 0x0000_0021, 0x2191_3800)),
        ];
        let info = detect(&CpuidTable { rows: &rows }, &mut NoMsr);
        assert_eq!(
            (info.vendor, info.family, info.model),
            (Vendor::Amd, 0xF, 0x6B)
        );
        assert!(!info.has_pmu());
        assert_eq!(info.lbr, LbrKind::None);
        assert!(info.missing_reason().is_some());
    }

    #[test]
    fn intel_model_with_leaf_0xa_zeroed_has_no_pmu() {
        // QEMU TCG with an Intel model (e.g. Skylake-Server): leaf 0xA all zeros, PDCM clear.
        let rows = [
            (0, 0, INTEL),
            (1, 0, regs(0x0005_0654, 0, 0x8000_0001, 0x0780_0000)),
        ];
        let info = detect(&CpuidTable { rows: &rows }, &mut NoMsr);
        assert_eq!(info.vendor, Vendor::Intel);
        assert!(!info.has_pmu());
        assert!(info.missing_reason().unwrap().contains("leaf 0xA"));
        assert_eq!(info.perf_capabilities, 0);
    }

    #[test]
    fn leaf_0xa_sanity_checks_as_linux() {
        // An event vector shorter than the seven architectural events: no
        // PMU (Linux's intel_pmu_init returns -ENODEV).
        let short = [
            (0, 0, INTEL),
            (0xA, 0, regs(0x0630_0402, 0, 0, 3 | 48 << 5)),
        ];
        let info = detect(&CpuidTable { rows: &short }, &mut NoMsr);
        assert!(!info.has_pmu());
        assert!(info.missing_reason().unwrap().contains("seven"));
        // v2 that reports no fixed counters: three on bare metal, none
        // under a hypervisor (CPUID.1:ECX[31]).
        for (ecx1, want) in [(0, 0b111), (1 << 31, 0)] {
            let rows = [
                (0, 0, INTEL),
                (1, 0, regs(0x0001_06A5, 0, ecx1, 0)),
                (0xA, 0, regs(0x0730_0402, 0, 0, 0)),
            ];
            let info = detect(&CpuidTable { rows: &rows }, &mut NoMsr);
            assert!(info.has_pmu());
            assert_eq!(info.fixed_mask, want, "CPUID.1:ECX {ecx1:#x}");
        }
    }

    #[test]
    fn leaf_0xa_v5_fixed_bitmap() {
        // v5, 8 GP x 48, 3 fixed by count plus FIXED_CTR3 only in the ECX bitmap.
        let rows = [
            (0, 0, INTEL),
            (0xA, 0, regs(0x0730_0805, 0, 0b1000, 3 | 48 << 5)),
        ];
        let info = detect(&CpuidTable { rows: &rows }, &mut NoMsr);
        assert_eq!((info.version, info.gp_counters, info.gp_width), (5, 8, 48));
        assert_eq!((info.fixed_mask, info.fixed_width), (0b1111, 48));
        assert_eq!(info.fixed_counters(), 4);
    }

    #[test]
    fn legacy_lbr_model_table() {
        assert_eq!(
            legacy_lbr_model(0x17),
            Some((4, addr::MSR_LBR_CORE_FROM, addr::MSR_LBR_CORE_TO))
        );
        assert_eq!(
            legacy_lbr_model(0x3C),
            Some((16, addr::MSR_LBR_NHM_FROM, addr::MSR_LBR_NHM_TO))
        );
        assert_eq!(
            legacy_lbr_model(0x5E),
            Some((32, addr::MSR_LBR_NHM_FROM, addr::MSR_LBR_NHM_TO))
        );
        assert_eq!(legacy_lbr_model(0x01), None);
    }
}
