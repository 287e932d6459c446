//! Decoding of Intel PEBS records (fixed formats 0-3 and adaptive format 4+)
//! into sample fields: IP, GPRs in perf order, TSC and memory fields, plus the
//! pre-Haswell IP fixup from LBR entry 0 and an instruction-length decoder.
//!
//! Layouts: Intel SDM vol. 3 "Processor Event Based Sampling" (the per-
//! microarchitecture PEBS record tables and "Adaptive PEBS").

use crate::lbr::RawBranch;
use crate::regs::{
    PEBS_ADAPTIVE_GPR_ORDER, PEBS_LEGACY_GPR_ORDER, Reg, RegFile, regfile_from_pebs,
};
pub use crate::sample::MemInfo;

/// The perf register mask a PEBS record can fill: AX..FLAGS and R8..R15
/// (no segment registers).
pub const PEBS_REGS_MASK: u64 = 0x00FF_03FF;

/// Format 0 ("core", Core 2 / Atom): 144 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RecordCore {
    /// RFLAGS, RIP, then RAX, RBX, RCX, RDX, RSI, RDI, RBP, RSP, R8..R15.
    pub gprs: [u64; 18],
}

/// Format 1 ("nhm", Nehalem .. Ivy Bridge): 176 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RecordNhm {
    /// As format 0.
    pub core: RecordCore,
    /// IA32_PERF_GLOBAL_STATUS at the time of the record (applicable counters).
    pub status: u64,
    /// Data linear address.
    pub dla: u64,
    /// Data source encoding.
    pub dse: u64,
    /// Load latency in cycles.
    pub lat: u64,
}

/// Format 2 ("hsw", Haswell, Broadwell): 192 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RecordHsw {
    /// As format 1.
    pub nhm: RecordNhm,
    /// Eventing IP of the instruction that caused the event.
    pub real_ip: u64,
    /// TSX abort information.
    pub tsx_tuning: u64,
}

/// Format 3 ("skl", Skylake .. Cascade Lake): 200 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RecordSkl {
    /// As format 2.
    pub hsw: RecordHsw,
    /// TSC when the record was written.
    pub tsc: u64,
}

/// Adaptive PEBS basic group (always present): 32 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AdaptiveBasic {
    /// \[31:0\] groups present (PEBS_DATA_CFG layout), \[47:32\] retire latency,
    /// \[63:48\] record size in bytes.
    pub format_size: u64,
    /// Eventing IP.
    pub ip: u64,
    /// Applicable counters (bit per counter, fixed at 32+).
    pub applicable_counters: u64,
    /// TSC.
    pub tsc: u64,
}

/// Adaptive PEBS memory-info group: 32 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AdaptiveMemInfo {
    /// Data linear address.
    pub address: u64,
    /// Data source (same encoding as the fixed formats' DSE).
    pub aux: u64,
    /// Load latency; from Alder Lake on \[15:0\] instruction latency and
    /// \[47:32\] cache latency.
    pub latency: u64,
    /// TSX tuning.
    pub tsx_tuning: u64,
}

/// Adaptive PEBS GPR group: 144 bytes (order in [`PEBS_ADAPTIVE_GPR_ORDER`]).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AdaptiveGprs {
    /// FLAGS, IP, AX, CX, DX, BX, SP, BP, SI, DI, R8..R15.
    pub gprs: [u64; 18],
}

/// Adaptive PEBS XMM group: 256 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AdaptiveXmm {
    /// XMM0..XMM15, two u64 each.
    pub xmm: [u64; 32],
}

/// Adaptive PEBS LBR entry: 24 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AdaptiveLbrEntry {
    /// FROM.
    pub from: u64,
    /// TO.
    pub to: u64,
    /// INFO, in the CPU's LBR layout: IA32_LBR_x_INFO with architectural
    /// LBR, MSR_LBR_INFO_x (legacy format 5) on Ice Lake / Tiger Lake.
    pub info: u64,
}

/// PEBS_DATA_CFG / basic-group format bits.
pub mod data_cfg {
    /// Memory-info group.
    pub const MEMINFO: u64 = 1 << 0;
    /// GPR group.
    pub const GPRS: u64 = 1 << 1;
    /// XMM group.
    pub const XMMS: u64 = 1 << 2;
    /// LBR group; the number of entries minus one is in bits 31:24.
    pub const LBRS: u64 = 1 << 3;
    /// Shift of the LBR entry count field.
    pub const LBR_SHIFT: u32 = 24;
}

/// A PEBS record format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PebsFormat {
    /// Format 0, 144 bytes.
    Core,
    /// Format 1, 176 bytes.
    Nhm,
    /// Format 2, 192 bytes.
    Hsw,
    /// Format 3, 200 bytes.
    Skl,
    /// Format 4 and later (the number is kept).
    Adaptive(u8),
}

/// Why a record could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PebsError {
    /// The format number is not one this decoder knows: PEBS must be disabled.
    UnknownFormat(u8),
    /// The record is shorter than its format requires.
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// An adaptive record whose size field does not match its group bits.
    SizeMismatch {
        /// Size computed from the group bits.
        expected: usize,
        /// Size in the record.
        found: usize,
    },
}

impl core::fmt::Display for PebsError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PebsError::UnknownFormat(n) => {
                write!(f, "unknown PEBS record format {n}; PEBS disabled")
            }
            PebsError::Truncated { need, have } => {
                write!(f, "PEBS record truncated: need {need} bytes, have {have}")
            }
            PebsError::SizeMismatch { expected, found } => {
                write!(
                    f,
                    "adaptive PEBS record size {found} does not match its groups ({expected})"
                )
            }
        }
    }
}

/// The last adaptive format this decoder was written against.
pub const MAX_KNOWN_ADAPTIVE_FORMAT: u8 = 6;

impl PebsFormat {
    /// Format from IA32_PERF_CAPABILITIES\[11:8\].
    pub fn from_number(n: u8) -> Result<Self, PebsError> {
        Ok(match n {
            0 => PebsFormat::Core,
            1 => PebsFormat::Nhm,
            2 => PebsFormat::Hsw,
            3 => PebsFormat::Skl,
            4..=MAX_KNOWN_ADAPTIVE_FORMAT => PebsFormat::Adaptive(n),
            _ => return Err(PebsError::UnknownFormat(n)),
        })
    }

    /// Size of a record in a fixed format; `None` for adaptive formats.
    pub fn fixed_size(self) -> Option<usize> {
        match self {
            PebsFormat::Core => Some(size_of::<RecordCore>()),
            PebsFormat::Nhm => Some(size_of::<RecordNhm>()),
            PebsFormat::Hsw => Some(size_of::<RecordHsw>()),
            PebsFormat::Skl => Some(size_of::<RecordSkl>()),
            PebsFormat::Adaptive(_) => None,
        }
    }
}

/// Size of an adaptive record with the groups selected by `cfg` (PEBS_DATA_CFG
/// or the basic group's low 32 bits).
pub fn adaptive_record_size(cfg: u64) -> usize {
    let mut size = size_of::<AdaptiveBasic>();
    if cfg & data_cfg::MEMINFO != 0 {
        size += size_of::<AdaptiveMemInfo>();
    }
    if cfg & data_cfg::GPRS != 0 {
        size += size_of::<AdaptiveGprs>();
    }
    if cfg & data_cfg::XMMS != 0 {
        size += size_of::<AdaptiveXmm>();
    }
    if cfg & data_cfg::LBRS != 0 {
        size += adaptive_lbr_entries(cfg) * size_of::<AdaptiveLbrEntry>();
    }
    size
}

/// Number of LBR entries an adaptive record carries under `cfg`.
pub fn adaptive_lbr_entries(cfg: u64) -> usize {
    if cfg & data_cfg::LBRS == 0 {
        0
    } else {
        ((cfg >> data_cfg::LBR_SHIFT) & 0xFF) as usize + 1
    }
}

/// What kind of memory event the record belongs to, so DSE bits are read right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemKind {
    /// Not a memory event: no memory fields.
    None,
    /// Load (load-latency or data-LA load event).
    Load,
    /// Sandy Bridge's and Ivy Bridge's precise store (0x02CD with
    /// PS_ENABLE; Linux's `precise_store_data`): L1 hit or miss, STLB
    /// miss, lock.
    Store,
    /// A data-linear-address store event from Haswell to Ice Lake (0x82D0;
    /// Linux's `precise_datala_hsw`): L1 hit or miss, the rest not
    /// available.
    StoreDatala,
    /// Golden Cove's store latency (0x02CD; Linux's
    /// `store_latency_data`): the load data-source table, as a store.
    StoreLatency,
}

/// Decoder settings, fixed when PEBS is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeConfig {
    /// Record format.
    pub format: PebsFormat,
    /// Memory event kind of the counter that produced the record.
    pub mem: MemKind,
    /// The meminfo latency word is split into instruction and cache latency
    /// (Alder Lake / Sapphire Rapids and later).
    pub split_latency: bool,
    /// How the model's load data-source field reads (from the model table).
    pub data_source: DataSource,
    /// PEBS assists are trap-like (PERF_CAPABILITIES\[6\]): the IP of a
    /// format 0 or 1 record is the instruction after the eventing one.
    /// Without it they are fault-like and that IP is the eventing one.
    pub pebs_trap: bool,
}

/// A decoded PEBS record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PebsRecord<'a> {
    /// Sample IP: the eventing IP where the format has it, else the record's
    /// (trap-like, next-instruction) IP; see [`fixup_ip`].
    pub ip: u64,
    /// `ip` is the eventing IP: format 2+ (the eventing-IP field), or
    /// formats 0 and 1 with fault-like assists.
    pub precise: bool,
    /// `ip` is the trap-like next-instruction IP of a format 0 or 1 record:
    /// recover the eventing IP with [`fixup_ip`] (Linux
    /// `intel_pmu_pebs_fixup_ip`, which returns at once for fault-like
    /// assists).
    pub needs_fixup: bool,
    /// GPRs in perf order (valid under [`PEBS_REGS_MASK`]); `None` when the
    /// record has no GPRs (adaptive without the GPR group).
    pub regs: Option<RegFile>,
    /// TSC (format 3+).
    pub tsc: Option<u64>,
    /// Counters the record applies to (bit n = PMCn, 32+n = fixed n); 0 when
    /// the format does not say (format 0).
    pub applicable: u64,
    /// Memory fields for memory events.
    pub mem: Option<MemInfo>,
    /// Retire latency (adaptive basic group \[47:32\]; 0 if absent).
    pub retire_latency: u16,
    lbr: &'a [u8],
    xmm: &'a [u8],
}

impl PebsRecord<'_> {
    /// LBR entries carried in an adaptive record, newest first, encoded as
    /// the CPU's LBR (decode them with the driver's LBR format, not always
    /// as architectural LBR).
    pub fn lbr(&self) -> impl Iterator<Item = RawBranch> + '_ {
        self.lbr.chunks_exact(24).map(|c| RawBranch {
            from: rd(c, 0),
            to: rd(c, 8),
            info: rd(c, 16),
        })
    }

    /// XMM0..XMM15 from an adaptive record's XMM group (two words each, low
    /// then high), in perf's XMM register order; `None` without the group.
    pub fn xmm(&self) -> Option<[u64; 32]> {
        if self.xmm.len() < 256 {
            return None;
        }
        let mut w = [0u64; 32];
        for (i, v) in w.iter_mut().enumerate() {
            *v = rd(self.xmm, 8 * i);
        }
        Some(w)
    }

    /// Number of LBR entries in the record.
    pub fn lbr_len(&self) -> usize {
        self.lbr.len() / 24
    }
}

fn rd(b: &[u8], off: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(w)
}

fn need(bytes: &[u8], n: usize) -> Result<(), PebsError> {
    if bytes.len() < n {
        Err(PebsError::Truncated {
            need: n,
            have: bytes.len(),
        })
    } else {
        Ok(())
    }
}

fn gprs(bytes: &[u8], off: usize, order: &[Reg; 18]) -> RegFile {
    let mut words = [0u64; 18];
    for (i, w) in words.iter_mut().enumerate() {
        *w = rd(bytes, off + 8 * i);
    }
    regfile_from_pebs(RegFile::default(), order, &words)
}

/// Decode one record from `bytes` (which starts at the record).
pub fn decode<'a>(bytes: &'a [u8], cfg: &DecodeConfig) -> Result<PebsRecord<'a>, PebsError> {
    match cfg.format {
        PebsFormat::Adaptive(_) => decode_adaptive(bytes, cfg),
        fixed => {
            let size = fixed.fixed_size().unwrap_or(0);
            need(bytes, size)?;
            let regs = gprs(bytes, 0, &PEBS_LEGACY_GPR_ORDER);
            // Formats 0 and 1 have only the assist's IP: the next
            // instruction's for trap-like assists, the eventing one's for
            // fault-like ones (PERF_CAPABILITIES[6] clear).
            let mut rec = PebsRecord {
                ip: regs.get(Reg::Ip),
                precise: !cfg.pebs_trap,
                needs_fixup: cfg.pebs_trap,
                regs: Some(regs),
                tsc: None,
                applicable: 0,
                mem: None,
                retire_latency: 0,
                lbr: &[],
                xmm: &[],
            };
            if fixed != PebsFormat::Core {
                rec.applicable = rd(bytes, 144);
                if cfg.mem != MemKind::None {
                    let dse = rd(bytes, 160);
                    rec.mem = Some(MemInfo {
                        addr: rd(bytes, 152),
                        weight: rd(bytes, 168),
                        ins_lat: 0,
                        data_src: data_src(cfg.data_source, cfg.mem, dse),
                    });
                }
            }
            if matches!(fixed, PebsFormat::Hsw | PebsFormat::Skl) {
                // The eventing-IP field: no fix-up from format 2 on.
                rec.needs_fixup = false;
                let real_ip = rd(bytes, 176);
                if real_ip != 0 {
                    rec.ip = real_ip;
                    rec.precise = true;
                }
            }
            if fixed == PebsFormat::Skl {
                rec.tsc = Some(rd(bytes, 192));
            }
            Ok(rec)
        }
    }
}

fn decode_adaptive<'a>(bytes: &'a [u8], cfg: &DecodeConfig) -> Result<PebsRecord<'a>, PebsError> {
    need(bytes, size_of::<AdaptiveBasic>())?;
    let header = rd(bytes, 0);
    let groups = header & 0xFFFF_FFFF;
    let found = (header >> 48) as usize;
    let expected = adaptive_record_size(groups);
    if found != expected {
        return Err(PebsError::SizeMismatch { expected, found });
    }
    need(bytes, found)?;
    let mut rec = PebsRecord {
        ip: rd(bytes, 8),
        precise: true,
        needs_fixup: false,
        regs: None,
        tsc: Some(rd(bytes, 24)),
        applicable: rd(bytes, 16),
        mem: None,
        retire_latency: (header >> 32) as u16,
        lbr: &[],
        xmm: &[],
    };
    let mut off = size_of::<AdaptiveBasic>();
    if groups & data_cfg::MEMINFO != 0 {
        if cfg.mem != MemKind::None {
            let lat = rd(bytes, off + 16);
            let (weight, ins_lat) = if cfg.split_latency {
                ((lat >> 32) & 0xFFFF, lat & 0xFFFF)
            } else {
                (lat, 0)
            };
            rec.mem = Some(MemInfo {
                addr: rd(bytes, off),
                weight,
                ins_lat: ins_lat as u16,
                data_src: data_src(cfg.data_source, cfg.mem, rd(bytes, off + 8)),
            });
        }
        off += size_of::<AdaptiveMemInfo>();
    }
    if groups & data_cfg::GPRS != 0 {
        let mut regs = gprs(bytes, off, &PEBS_ADAPTIVE_GPR_ORDER);
        // The basic group's IP is the eventing IP; the GPR group's is where
        // execution resumed. Report the eventing one as perf's IP register.
        regs.set(Reg::Ip, rec.ip);
        rec.regs = Some(regs);
        off += size_of::<AdaptiveGprs>();
    }
    if groups & data_cfg::XMMS != 0 {
        rec.xmm = &bytes[off..off + size_of::<AdaptiveXmm>()];
        off += size_of::<AdaptiveXmm>();
    }
    if groups & data_cfg::LBRS != 0 {
        let n = adaptive_lbr_entries(groups) * size_of::<AdaptiveLbrEntry>();
        rec.lbr = &bytes[off..off + n];
    }
    Ok(rec)
}

/// perf_mem_data_src field values (include/uapi/linux/perf_event.h).
pub mod mem {
    /// mem_op shift and values.
    pub const OP_SHIFT: u32 = 0;
    /// Load.
    pub const OP_LOAD: u64 = 0x02;
    /// Store.
    pub const OP_STORE: u64 = 0x04;
    /// mem_lvl shift.
    pub const LVL_SHIFT: u32 = 5;
    /// Not available.
    pub const LVL_NA: u64 = 0x01;
    /// Hit.
    pub const LVL_HIT: u64 = 0x02;
    /// Miss.
    pub const LVL_MISS: u64 = 0x04;
    /// L1.
    pub const LVL_L1: u64 = 0x08;
    /// Line fill buffer.
    pub const LVL_LFB: u64 = 0x10;
    /// L2.
    pub const LVL_L2: u64 = 0x20;
    /// L3.
    pub const LVL_L3: u64 = 0x40;
    /// Local DRAM.
    pub const LVL_LOC_RAM: u64 = 0x80;
    /// Remote DRAM, one hop.
    pub const LVL_REM_RAM1: u64 = 0x100;
    /// Remote cache, one hop.
    pub const LVL_REM_CCE1: u64 = 0x400;
    /// I/O memory.
    pub const LVL_IO: u64 = 0x1000;
    /// Uncached.
    pub const LVL_UNC: u64 = 0x2000;
    /// mem_snoop shift.
    pub const SNOOP_SHIFT: u32 = 19;
    /// Not available.
    pub const SNOOP_NA: u64 = 0x01;
    /// No snoop.
    pub const SNOOP_NONE: u64 = 0x02;
    /// Snoop hit.
    pub const SNOOP_HIT: u64 = 0x04;
    /// Snoop miss.
    pub const SNOOP_MISS: u64 = 0x08;
    /// Snoop hit modified.
    pub const SNOOP_HITM: u64 = 0x10;
    /// mem_lock shift.
    pub const LOCK_SHIFT: u32 = 24;
    /// Locked.
    pub const LOCK_LOCKED: u64 = 0x02;
    /// mem_dtlb shift.
    pub const TLB_SHIFT: u32 = 26;
    /// TLB hit.
    pub const TLB_HIT: u64 = 0x02;
    /// TLB miss.
    pub const TLB_MISS: u64 = 0x04;
    /// L1 (first-level TLB).
    pub const TLB_L1: u64 = 0x08;
    /// L2 (second-level TLB).
    pub const TLB_L2: u64 = 0x10;
    /// TLB not available.
    pub const TLB_NA: u64 = 0x01;
    /// Lock not available.
    pub const LOCK_NA: u64 = 0x01;
    /// mem_lvl_num shift.
    pub const LVLNUM_SHIFT: u32 = 33;
    /// L1.
    pub const LVLNUM_L1: u64 = 0x01;
    /// L2.
    pub const LVLNUM_L2: u64 = 0x02;
    /// L3.
    pub const LVLNUM_L3: u64 = 0x03;
    /// L4.
    pub const LVLNUM_L4: u64 = 0x04;
    /// Any cache.
    pub const LVLNUM_ANY_CACHE: u64 = 0x0B;
    /// Line fill buffer.
    pub const LVLNUM_LFB: u64 = 0x0C;
    /// RAM.
    pub const LVLNUM_RAM: u64 = 0x0D;
    /// Persistent memory.
    pub const LVLNUM_PMEM: u64 = 0x0E;
    /// Not available.
    pub const LVLNUM_NA: u64 = 0x0F;
    /// mem_remote shift.
    pub const REMOTE_SHIFT: u32 = 37;
    /// mem_blk shift.
    pub const BLK_SHIFT: u32 = 40;
    /// Block not available.
    pub const BLK_NA: u64 = 0x01;
    /// mem_snoopx shift.
    pub const SNOOPX_SHIFT: u32 = 38;
    /// Forwarded from another core's cache.
    pub const SNOOPX_FWD: u64 = 0x01;
}

/// A model's reading of the load data-source field (DSE) of PEBS records:
/// the table from DSE\[3:0\] to perf's memory-hierarchy fields, and where the
/// TLB and lock bits are. Linux keeps one base table (`pebs_data_source`,
/// arch/x86/events/intel/ds.c) and patches it per model in
/// `intel_pmu_init`; the model table of the CPU crate names the variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DataSource {
    /// Sandy Bridge to Broadwell, and any model without a table of its own:
    /// the base table (SDM vol. 3 "Data Source Encoding for Load Latency
    /// Record"), STLB miss in bit 4, lock in bit 5.
    #[default]
    Snb,
    /// Nehalem (`intel_pmu_pebs_data_source_nhm`): 0x05 is an L3 hit with a
    /// snoop hit, 0x06 and 0x07 snoop HITM; the record has no TLB or lock
    /// bits (Linux `pebs_no_tlb`): both read as not available.
    Nhm,
    /// Westmere: the Nehalem table, with TLB and lock bits.
    Wsm,
    /// Skylake and later big cores (`intel_pmu_pebs_data_source_skl`):
    /// 0x08/0x09 local/remote L4 (persistent memory on the server parts
    /// with `pmem`: Skylake-X, Ice Lake-X/D, Sapphire Rapids), 0x0B remote
    /// RAM, 0x0C remote cache forward, 0x0D remote cache HITM.
    Skl {
        /// 0x08/0x09 are persistent memory, not L4.
        pmem: bool,
    },
    /// Gracemont E-cores of Alder / Raptor Lake
    /// (`intel_pmu_pebs_data_source_grt`, `adl_latency_data_small`): 0x05 L3
    /// snoop hit, 0x06 L3 snoop HITM, 0x08 L3 forwarded; bit 4 is the lock
    /// bit and bit 5 the STLB miss (swapped against the big cores).
    Grt,
}

/// Translate an Intel data-source encoding `dse` read with the model's
/// `table` (SDM "Data Source Encoding for Load Latency Record"; see
/// [`DataSource`]) into perf's `perf_mem_data_src`.
pub fn data_src(table: DataSource, kind: MemKind, dse: u64) -> u64 {
    use mem::*;
    let (stlb_miss, locked) = match table {
        DataSource::Grt => (dse & (1 << 5) != 0, dse & (1 << 4) != 0),
        _ => (dse & (1 << 4) != 0, dse & (1 << 5) != 0),
    };
    // Stores tell only an L1 hit (bit 0) or miss.
    let l1 = if dse & 1 != 0 {
        LVL_L1 | LVL_HIT
    } else {
        LVL_L1 | LVL_MISS
    };
    let lock = if locked { LOCK_LOCKED << LOCK_SHIFT } else { 0 };
    let base = match kind {
        MemKind::None => return 0,
        MemKind::Store => {
            // An STLB miss, or a hit in the second-level TLB.
            let tlb = TLB_L2 | if stlb_miss { TLB_MISS } else { TLB_HIT };
            return OP_STORE << OP_SHIFT
                | l1 << LVL_SHIFT
                | SNOOP_NA << SNOOP_SHIFT
                | tlb << TLB_SHIFT
                | lock;
        }
        MemKind::StoreDatala => {
            return OP_STORE << OP_SHIFT
                | l1 << LVL_SHIFT
                | SNOOP_NA << SNOOP_SHIFT
                | LOCK_NA << LOCK_SHIFT
                | TLB_NA << TLB_SHIFT
                | LVLNUM_NA << LVLNUM_SHIFT;
        }
        MemKind::StoreLatency => {
            let src = load_source(table, (dse & 0xF) as u8);
            (src & !(0x1F << OP_SHIFT)) | OP_STORE << OP_SHIFT | BLK_NA << BLK_SHIFT
        }
        MemKind::Load => load_source(table, (dse & 0xF) as u8),
    };
    if table == DataSource::Nhm {
        return base | TLB_NA << TLB_SHIFT | LOCK_NA << LOCK_SHIFT;
    }
    // An STLB miss missed both levels; otherwise the access hit in the
    // L1 or L2 TLB, which the encoding does not tell apart (Linux reports
    // HIT | L1 | L2). The lock field is set only for a locked access.
    let tlb = if stlb_miss {
        TLB_L2 | TLB_MISS
    } else {
        TLB_HIT | TLB_L1 | TLB_L2
    };
    base | lock | tlb << TLB_SHIFT
}

/// One load entry of a data-source table: op, mem_lvl, mem_lvl_num,
/// mem_remote, mem_snoop and mem_snoopx, each in its field.
const fn src(lvl: u64, lvl_num: u64, remote: bool, snoop: u64, snoopx: u64) -> u64 {
    use mem::*;
    OP_LOAD << OP_SHIFT
        | lvl << LVL_SHIFT
        | lvl_num << LVLNUM_SHIFT
        | (remote as u64) << REMOTE_SHIFT
        | snoop << SNOOP_SHIFT
        | snoopx << SNOOPX_SHIFT
}

/// The load entry for DSE\[3:0\] = `code` in `table` (Linux
/// `pebs_data_source` and its per-model patches, arch/x86/events/intel/ds.c).
fn load_source(table: DataSource, code: u8) -> u64 {
    use mem::*;
    const HIT: u64 = LVL_HIT;
    match (table, code) {
        // Nehalem / Westmere (`intel_pmu_pebs_data_source_nhm`), Gracemont
        // (`intel_pmu_pebs_data_source_grt`) for 0x05 and 0x06.
        (DataSource::Nhm | DataSource::Wsm | DataSource::Grt, 0x5) => {
            src(LVL_L3 | HIT, LVLNUM_L3, false, SNOOP_HIT, 0)
        }
        (DataSource::Nhm | DataSource::Wsm | DataSource::Grt, 0x6)
        | (DataSource::Nhm | DataSource::Wsm, 0x7) => {
            src(LVL_L3 | HIT, LVLNUM_L3, false, SNOOP_HITM, 0)
        }
        (DataSource::Grt, 0x8) => src(LVL_L3 | HIT, LVLNUM_L3, false, 0, SNOOPX_FWD),
        // Skylake and later (`intel_pmu_pebs_data_source_skl`).
        (DataSource::Skl { pmem }, 0x8 | 0x9) => {
            let num = if pmem { LVLNUM_PMEM } else { LVLNUM_L4 };
            src(HIT, num, code == 0x9, SNOOP_HIT, 0)
        }
        (DataSource::Skl { .. }, 0xB) => src(HIT, LVLNUM_RAM, true, SNOOP_NONE, 0),
        (DataSource::Skl { .. }, 0xC) => src(HIT, LVLNUM_ANY_CACHE, true, 0, SNOOPX_FWD),
        (DataSource::Skl { .. }, 0xD) => src(HIT, LVLNUM_ANY_CACHE, true, SNOOP_HITM, 0),
        // The base table (Sandy Bridge and later; SDM "Data Source Encoding
        // for Load Latency Record").
        (_, 0x0) => src(LVL_MISS, LVLNUM_L3, false, SNOOP_NA, 0),
        (_, 0x1) => src(LVL_L1 | HIT, LVLNUM_L1, false, SNOOP_NONE, 0),
        (_, 0x2) => src(LVL_LFB | HIT, LVLNUM_LFB, false, SNOOP_NONE, 0),
        (_, 0x3) => src(LVL_L2 | HIT, LVLNUM_L2, false, SNOOP_NONE, 0),
        (_, 0x4) => src(LVL_L3 | HIT, LVLNUM_L3, false, SNOOP_NONE, 0),
        (_, 0x5) => src(LVL_L3 | HIT, LVLNUM_L3, false, SNOOP_MISS, 0),
        (_, 0x6) => src(LVL_L3 | HIT, LVLNUM_L3, false, SNOOP_HIT, 0),
        (_, 0x7) => src(LVL_L3 | HIT, LVLNUM_L3, false, SNOOP_HITM, 0),
        (_, 0x8) => src(LVL_REM_CCE1 | HIT, LVLNUM_L3, true, SNOOP_HIT, 0),
        (_, 0x9) => src(LVL_REM_CCE1 | HIT, LVLNUM_L3, true, SNOOP_HITM, 0),
        (_, 0xA) => src(LVL_LOC_RAM | HIT, LVLNUM_RAM, false, SNOOP_HIT, 0),
        (_, 0xB) => src(LVL_REM_RAM1 | HIT, LVLNUM_L3, true, SNOOP_HIT, 0),
        (_, 0xC) => src(
            LVL_LOC_RAM | HIT,
            LVLNUM_RAM,
            false,
            SNOOP_NONE | SNOOP_MISS,
            0,
        ),
        (_, 0xD) => src(
            LVL_REM_RAM1 | HIT,
            LVLNUM_RAM,
            true,
            SNOOP_NONE | SNOOP_MISS,
            0,
        ),
        (_, 0xE) => src(LVL_IO | HIT, LVLNUM_NA, false, SNOOP_NONE, 0),
        _ => src(LVL_UNC | HIT, LVLNUM_NA, false, SNOOP_NONE, 0),
    }
}

/// Why the pre-Haswell IP fixup gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FixupError {
    /// LBR entry 0 is empty.
    EmptyLbr,
    /// The basic block from LBR TO to the IP crosses user and kernel space.
    CrossesPrivilege,
    /// The IP is not within a page after the branch target.
    TooFar,
    /// Code bytes could not be read.
    Unreadable,
    /// Decoding did not land exactly on the IP.
    Misaligned,
}

/// Longest x86 instruction.
const MAX_INSN: usize = 15;

/// Recover the eventing IP for trap-like PEBS (formats 0 and 1): the record's
/// IP is the instruction after the one that caused the event. LBR entry 0
/// gives the last branch; if it targets `ip`, the branch itself was the
/// instruction; otherwise decode forward from the branch target to `ip` and
/// return the last instruction before it.
///
/// `read_code(addr, buf)` copies code bytes and returns false when unreadable;
/// `is_user(addr)` tells which side of the user/kernel split an address is on.
pub fn fixup_ip(
    ip: u64,
    lbr0: RawBranch,
    bitness: u32,
    mut read_code: impl FnMut(u64, &mut [u8]) -> bool,
    is_user: impl Fn(u64) -> bool,
) -> Result<u64, FixupError> {
    let (from, to) = (lbr0.from, lbr0.to);
    if from == 0 && to == 0 {
        return Err(FixupError::EmptyLbr);
    }
    if ip == to {
        return Ok(from);
    }
    if is_user(ip) != is_user(to) {
        return Err(FixupError::CrossesPrivilege);
    }
    if ip < to || ip - to > 4096 {
        return Err(FixupError::TooFar);
    }
    let mut cur = to;
    let mut prev = to;
    let mut buf = [0u8; MAX_INSN];
    while cur < ip {
        if !read_code(cur, &mut buf) {
            return Err(FixupError::Unreadable);
        }
        let mut dec =
            iced_x86::Decoder::with_ip(bitness, &buf, cur, iced_x86::DecoderOptions::NONE);
        let insn = dec.decode();
        if insn.is_invalid() {
            return Err(FixupError::Misaligned);
        }
        prev = cur;
        cur += insn.len() as u64;
    }
    if cur == ip {
        Ok(prev)
    } else {
        Err(FixupError::Misaligned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn fixed_record_layouts() {
        assert_eq!(size_of::<RecordCore>(), 144);
        assert_eq!(size_of::<RecordNhm>(), 176);
        assert_eq!(size_of::<RecordHsw>(), 192);
        assert_eq!(size_of::<RecordSkl>(), 200);
        assert_eq!(offset_of!(RecordNhm, status), 144);
        assert_eq!(offset_of!(RecordNhm, dla), 152);
        assert_eq!(offset_of!(RecordNhm, dse), 160);
        assert_eq!(offset_of!(RecordNhm, lat), 168);
        assert_eq!(offset_of!(RecordHsw, real_ip), 176);
        assert_eq!(offset_of!(RecordHsw, tsx_tuning), 184);
        assert_eq!(offset_of!(RecordSkl, tsc), 192);
    }

    #[test]
    fn adaptive_group_layouts() {
        assert_eq!(size_of::<AdaptiveBasic>(), 32);
        assert_eq!(offset_of!(AdaptiveBasic, applicable_counters), 16);
        assert_eq!(offset_of!(AdaptiveBasic, tsc), 24);
        assert_eq!(size_of::<AdaptiveMemInfo>(), 32);
        assert_eq!(offset_of!(AdaptiveMemInfo, latency), 16);
        assert_eq!(size_of::<AdaptiveGprs>(), 144);
        assert_eq!(size_of::<AdaptiveXmm>(), 256);
        assert_eq!(size_of::<AdaptiveLbrEntry>(), 24);
        assert_eq!(adaptive_record_size(0), 32);
        assert_eq!(
            adaptive_record_size(data_cfg::MEMINFO | data_cfg::GPRS),
            32 + 32 + 144
        );
        assert_eq!(
            adaptive_record_size(data_cfg::LBRS | (31 << 24)),
            32 + 32 * 24
        );
        assert_eq!(
            adaptive_record_size(0xF | (7 << 24)),
            32 + 32 + 144 + 256 + 8 * 24
        );
    }

    #[test]
    fn gpr_orders_cover_the_pebs_mask() {
        for order in [&PEBS_LEGACY_GPR_ORDER, &PEBS_ADAPTIVE_GPR_ORDER] {
            let mask = order.iter().fold(0u64, |m, r| m | r.bit());
            assert_eq!(mask, PEBS_REGS_MASK);
        }
    }

    fn put(buf: &mut [u8], off: usize, v: u64) {
        buf[off..off + 8].copy_from_slice(&v.to_le_bytes());
    }

    fn fixed_record(format: PebsFormat) -> [u8; 200] {
        let mut b = [0u8; 200];
        // FLAGS, IP, AX, BX, CX, DX, SI, DI, BP, SP, R8..R15 = 100 + index.
        for i in 0..18 {
            put(&mut b, 8 * i, 100 + i as u64);
        }
        if format != PebsFormat::Core {
            put(&mut b, 144, 0b10);
            put(&mut b, 152, 0xDEAD_0000);
            put(&mut b, 160, 0x3 | (1 << 4));
            put(&mut b, 168, 42);
        }
        if matches!(format, PebsFormat::Hsw | PebsFormat::Skl) {
            put(&mut b, 176, 0x40_1234);
        }
        if format == PebsFormat::Skl {
            put(&mut b, 192, 9_999);
        }
        b
    }

    #[test]
    fn each_fixed_format_decodes() {
        for format in [
            PebsFormat::Core,
            PebsFormat::Nhm,
            PebsFormat::Hsw,
            PebsFormat::Skl,
        ] {
            let bytes = fixed_record(format);
            let size = format.fixed_size().unwrap();
            let cfg = DecodeConfig {
                format,
                mem: MemKind::Load,
                split_latency: false,
                data_source: DataSource::Snb,
                pebs_trap: true,
            };
            let r = decode(&bytes[..size], &cfg).unwrap();
            let regs = r.regs.unwrap();
            assert_eq!(regs.get(Reg::Flags), 100);
            assert_eq!(regs.get(Reg::Ip), 101);
            assert_eq!(regs.get(Reg::Ax), 102);
            assert_eq!(regs.get(Reg::Bx), 103);
            assert_eq!(regs.get(Reg::Sp), 109);
            assert_eq!(regs.get(Reg::R15), 117);
            match format {
                PebsFormat::Core => {
                    assert_eq!((r.ip, r.precise, r.mem, r.tsc), (101, false, None, None));
                }
                PebsFormat::Nhm => {
                    assert_eq!((r.ip, r.precise, r.applicable), (101, false, 0b10));
                    let m = r.mem.unwrap();
                    assert_eq!((m.addr, m.weight), (0xDEAD_0000, 42));
                }
                PebsFormat::Hsw => assert_eq!((r.ip, r.precise, r.tsc), (0x40_1234, true, None)),
                PebsFormat::Skl => assert_eq!((r.ip, r.tsc), (0x40_1234, Some(9_999))),
                PebsFormat::Adaptive(_) => unreachable!(),
            }
            assert!(matches!(
                decode(&bytes[..size - 8], &cfg),
                Err(PebsError::Truncated { .. })
            ));
        }
    }

    #[test]
    fn trap_bit_decides_precise_and_fixup_of_fixed_formats() {
        for format in [PebsFormat::Core, PebsFormat::Nhm, PebsFormat::Hsw] {
            let bytes = fixed_record(format);
            let size = format.fixed_size().unwrap();
            for trap in [false, true] {
                let cfg = DecodeConfig {
                    format,
                    mem: MemKind::None,
                    split_latency: false,
                    data_source: DataSource::Snb,
                    pebs_trap: trap,
                };
                let r = decode(&bytes[..size], &cfg).unwrap();
                let old = matches!(format, PebsFormat::Core | PebsFormat::Nhm);
                assert_eq!(r.precise, !old || !trap, "{format:?} trap {trap}");
                assert_eq!(r.needs_fixup, old && trap, "{format:?} trap {trap}");
            }
        }
    }

    #[test]
    fn adaptive_groups_decode_in_order() {
        let cfg_bits =
            data_cfg::MEMINFO | data_cfg::GPRS | data_cfg::XMMS | data_cfg::LBRS | (1 << 24);
        let size = adaptive_record_size(cfg_bits);
        let mut b = [0u8; 1024];
        put(&mut b, 0, (size as u64) << 48 | 7 << 32 | cfg_bits);
        put(&mut b, 8, 0x40_2000);
        put(&mut b, 16, 1 << 33);
        put(&mut b, 24, 123_456);
        put(&mut b, 32, 0xBEEF_0000);
        put(&mut b, 40, 0x1);
        put(&mut b, 48, (300 << 32) | 12);
        for i in 0..18 {
            put(&mut b, 64 + 8 * i, 200 + i as u64);
        }
        for i in 0..32 {
            put(&mut b, 64 + 144 + 8 * i, 0x5000 + i as u64);
        }
        let lbr_off = 64 + 144 + 256;
        put(&mut b, lbr_off, 0x111);
        put(&mut b, lbr_off + 8, 0x222);
        put(&mut b, lbr_off + 24, 0x333);
        let cfg = DecodeConfig {
            format: PebsFormat::Adaptive(5),
            mem: MemKind::Load,
            split_latency: true,
            data_source: DataSource::Snb,
            pebs_trap: true,
        };
        let r = decode(&b[..size], &cfg).unwrap();
        assert_eq!(
            (r.ip, r.tsc, r.applicable, r.retire_latency),
            (0x40_2000, Some(123_456), 1 << 33, 7)
        );
        let m = r.mem.unwrap();
        assert_eq!((m.addr, m.weight, m.ins_lat), (0xBEEF_0000, 300, 12));
        assert_eq!(m.data_src & 0x1F, mem::OP_LOAD);
        let regs = r.regs.unwrap();
        assert_eq!(regs.get(Reg::Cx), 203);
        assert_eq!(regs.get(Reg::Bx), 205);
        assert_eq!(regs.get(Reg::Sp), 206);
        assert_eq!(regs.get(Reg::Ip), 0x40_2000);
        let xmm = r.xmm().unwrap();
        assert_eq!((xmm[0], xmm[1], xmm[31]), (0x5000, 0x5001, 0x501F));
        assert_eq!(r.lbr_len(), 2);
        let l: [RawBranch; 2] = [r.lbr().next().unwrap(), r.lbr().nth(1).unwrap()];
        assert_eq!((l[0].from, l[0].to, l[1].from), (0x111, 0x222, 0x333));
        // Unsplit latency is the whole word.
        let cfg2 = DecodeConfig {
            split_latency: false,
            ..cfg
        };
        assert_eq!(
            decode(&b[..size], &cfg2).unwrap().mem.unwrap().weight,
            (300 << 32) | 12
        );
    }

    #[test]
    fn adaptive_size_mismatch_and_unknown_format() {
        let mut b = [0u8; 64];
        put(&mut b, 0, 40u64 << 48);
        let cfg = DecodeConfig {
            format: PebsFormat::Adaptive(4),
            mem: MemKind::None,
            split_latency: false,
            data_source: DataSource::Snb,
            pebs_trap: true,
        };
        assert_eq!(
            decode(&b, &cfg).unwrap_err(),
            PebsError::SizeMismatch {
                expected: 32,
                found: 40
            }
        );
        assert_eq!(PebsFormat::from_number(7), Err(PebsError::UnknownFormat(7)));
        assert_eq!(
            PebsFormat::from_number(15),
            Err(PebsError::UnknownFormat(15))
        );
        assert_eq!(PebsFormat::from_number(3), Ok(PebsFormat::Skl));
    }

    #[test]
    fn data_source_encodings() {
        let snb = DataSource::Snb;
        let l1 = data_src(snb, MemKind::Load, 0x1);
        assert_eq!(l1 & 0x1F, mem::OP_LOAD);
        assert_eq!((l1 >> mem::LVL_SHIFT) & 0x3FFF, mem::LVL_L1 | mem::LVL_HIT);
        let ram = data_src(snb, MemKind::Load, 0xC | (1 << 4) | (1 << 5));
        assert_eq!(
            (ram >> mem::LVL_SHIFT) & 0x3FFF,
            mem::LVL_LOC_RAM | mem::LVL_HIT
        );
        assert_eq!((ram >> mem::TLB_SHIFT) & 0x7F, mem::TLB_MISS | mem::TLB_L2);
        assert_eq!(
            (l1 >> mem::TLB_SHIFT) & 0x7F,
            mem::TLB_HIT | mem::TLB_L1 | mem::TLB_L2,
            "a TLB hit is a hit in L1 or L2"
        );
        assert_eq!((ram >> mem::LOCK_SHIFT) & 0x3, mem::LOCK_LOCKED);
        let st = data_src(snb, MemKind::Store, 0);
        assert_eq!(st & 0x1F, mem::OP_STORE);
        assert_eq!((st >> mem::LVL_SHIFT) & 0x3FFF, mem::LVL_L1 | mem::LVL_MISS);
        assert_eq!(data_src(snb, MemKind::None, 0x1), 0);
    }

    fn lvl(v: u64) -> u64 {
        (v >> mem::LVL_SHIFT) & 0x3FFF
    }
    fn snoop(v: u64) -> u64 {
        (v >> mem::SNOOP_SHIFT) & 0x1F
    }
    fn lvl_num(v: u64) -> u64 {
        (v >> mem::LVLNUM_SHIFT) & 0xF
    }
    fn remote(v: u64) -> bool {
        (v >> mem::REMOTE_SHIFT) & 1 != 0
    }
    fn snoopx(v: u64) -> u64 {
        (v >> mem::SNOOPX_SHIFT) & 0x3
    }

    #[test]
    fn data_source_tables_differ_per_model() {
        use mem::*;
        let ld = |t: DataSource, dse: u64| data_src(t, MemKind::Load, dse);
        // Base table: 0x05-0x07 are L3 hits with snoop miss / hit / HITM;
        // 0x08 a remote-cache hit.
        assert_eq!(snoop(ld(DataSource::Snb, 0x5)), SNOOP_MISS);
        assert_eq!(snoop(ld(DataSource::Snb, 0x6)), SNOOP_HIT);
        assert_eq!(snoop(ld(DataSource::Snb, 0x7)), SNOOP_HITM);
        assert_eq!(lvl(ld(DataSource::Snb, 0x8)), LVL_REM_CCE1 | LVL_HIT);
        assert!(remote(ld(DataSource::Snb, 0x8)));
        assert_eq!(lvl_num(ld(DataSource::Snb, 0x8)), LVLNUM_L3);
        assert_eq!(lvl_num(ld(DataSource::Snb, 0x1)), LVLNUM_L1);
        assert_eq!(lvl_num(ld(DataSource::Snb, 0x2)), LVLNUM_LFB);
        assert_eq!(lvl_num(ld(DataSource::Snb, 0xA)), LVLNUM_RAM);
        assert_eq!(snoop(ld(DataSource::Snb, 0xC)), SNOOP_NONE | SNOOP_MISS);
        assert_eq!(lvl_num(ld(DataSource::Snb, 0xE)), LVLNUM_NA);
        // 0x00: unknown L3 miss.
        assert_eq!(lvl(ld(DataSource::Snb, 0x0)), LVL_MISS);
        assert_eq!(lvl_num(ld(DataSource::Snb, 0x0)), LVLNUM_L3);
        // Nehalem / Westmere: 0x05 snoop hit, 0x06 and 0x07 HITM.
        for t in [DataSource::Nhm, DataSource::Wsm] {
            assert_eq!(snoop(ld(t, 0x5)), SNOOP_HIT);
            assert_eq!(snoop(ld(t, 0x6)), SNOOP_HITM);
            assert_eq!(snoop(ld(t, 0x7)), SNOOP_HITM);
            assert_eq!(lvl(ld(t, 0x5)), LVL_L3 | LVL_HIT);
        }
        assert_eq!(ld(DataSource::Wsm, 0x8), ld(DataSource::Snb, 0x8));
        // Nehalem has no TLB or lock bits; Westmere has.
        let nhm = ld(DataSource::Nhm, 0x1 | 1 << 4 | 1 << 5);
        assert_eq!((nhm >> TLB_SHIFT) & 0x7F, TLB_NA);
        assert_eq!((nhm >> LOCK_SHIFT) & 0x3, LOCK_NA);
        let wsm = ld(DataSource::Wsm, 0x1 | 1 << 4 | 1 << 5);
        assert_eq!((wsm >> TLB_SHIFT) & 0x7F, TLB_MISS | TLB_L2);
        assert_eq!((wsm >> LOCK_SHIFT) & 0x3, LOCK_LOCKED);
        // Skylake and later: 0x08/0x09 L4 (or PMEM), local and remote, no
        // mem_lvl bit; 0x0B remote RAM; 0x0C/0x0D remote cache.
        let skl = DataSource::Skl { pmem: false };
        let skx = DataSource::Skl { pmem: true };
        assert_eq!(lvl(ld(skl, 0x8)), LVL_HIT);
        assert_eq!(lvl_num(ld(skl, 0x8)), LVLNUM_L4);
        assert_eq!(lvl_num(ld(skx, 0x8)), LVLNUM_PMEM);
        assert!(!remote(ld(skl, 0x8)) && remote(ld(skl, 0x9)));
        assert_eq!(snoop(ld(skl, 0x9)), SNOOP_HIT);
        assert_eq!(lvl_num(ld(skl, 0xB)), LVLNUM_RAM);
        assert!(remote(ld(skl, 0xB)));
        assert_eq!(snoop(ld(skl, 0xB)), SNOOP_NONE);
        assert_eq!(lvl_num(ld(skl, 0xC)), LVLNUM_ANY_CACHE);
        assert_eq!(snoopx(ld(skl, 0xC)), SNOOPX_FWD);
        assert_eq!(snoop(ld(skl, 0xD)), SNOOP_HITM);
        // The rest is the base table.
        for dse in [0x0, 0x1, 0x5, 0x7, 0xA, 0xE, 0xF] {
            assert_eq!(ld(skl, dse), ld(DataSource::Snb, dse), "{dse:#x}");
        }
        // Gracemont: 0x05 snoop hit, 0x06 HITM, 0x08 L3 forwarded; lock in
        // bit 4, STLB miss in bit 5.
        let grt = DataSource::Grt;
        assert_eq!(snoop(ld(grt, 0x5)), SNOOP_HIT);
        assert_eq!(snoop(ld(grt, 0x6)), SNOOP_HITM);
        assert_eq!(snoop(ld(grt, 0x7)), SNOOP_HITM);
        assert_eq!(lvl(ld(grt, 0x8)), LVL_L3 | LVL_HIT);
        assert_eq!(snoopx(ld(grt, 0x8)), SNOOPX_FWD);
        let locked = ld(grt, 0x1 | 1 << 4);
        assert_eq!((locked >> LOCK_SHIFT) & 0x3, LOCK_LOCKED);
        assert_eq!((locked >> TLB_SHIFT) & 0x7F, TLB_HIT | TLB_L1 | TLB_L2);
        let stlb = ld(grt, 0x1 | 1 << 5);
        assert_eq!((stlb >> TLB_SHIFT) & 0x7F, TLB_MISS | TLB_L2);
        // An unlocked access sets no lock bits (Linux's pebs_set_tlb_lock).
        assert_eq!((stlb >> LOCK_SHIFT) & 0x3, 0);
    }

    #[test]
    fn the_three_store_decodings_are_linuxs() {
        use mem::*;
        let f = |v: u64, shift: u32, mask: u64| (v >> shift) & mask;
        // Sandy Bridge precise store (precise_store_data): an L1 miss with
        // an STLB miss, locked; then an L1 hit in the second-level TLB.
        let st = data_src(DataSource::Snb, MemKind::Store, 1 << 4 | 1 << 5);
        assert_eq!(f(st, OP_SHIFT, 0x1F), OP_STORE);
        assert_eq!(f(st, LVL_SHIFT, 0x3FFF), LVL_L1 | LVL_MISS);
        assert_eq!(f(st, SNOOP_SHIFT, 0x1F), SNOOP_NA);
        assert_eq!(f(st, TLB_SHIFT, 0x7F), TLB_L2 | TLB_MISS);
        assert_eq!(f(st, LOCK_SHIFT, 0x3), LOCK_LOCKED);
        let st = data_src(DataSource::Snb, MemKind::Store, 1);
        assert_eq!(f(st, LVL_SHIFT, 0x3FFF), LVL_L1 | LVL_HIT);
        assert_eq!(f(st, TLB_SHIFT, 0x7F), TLB_L2 | TLB_HIT);
        assert_eq!(f(st, LOCK_SHIFT, 0x3), 0);
        // Haswell to Ice Lake (precise_datala_hsw): the L1 only, every
        // other field not available, whatever the other bits say.
        let dl = data_src(
            DataSource::Skl { pmem: false },
            MemKind::StoreDatala,
            1 | 1 << 4,
        );
        assert_eq!(f(dl, OP_SHIFT, 0x1F), OP_STORE);
        assert_eq!(f(dl, LVL_SHIFT, 0x3FFF), LVL_L1 | LVL_HIT);
        assert_eq!(f(dl, SNOOP_SHIFT, 0x1F), SNOOP_NA);
        assert_eq!(f(dl, TLB_SHIFT, 0x7F), TLB_NA);
        assert_eq!(f(dl, LOCK_SHIFT, 0x3), LOCK_NA);
        assert_eq!(f(dl, LVLNUM_SHIFT, 0xF), LVLNUM_NA);
        // Golden Cove store latency (store_latency_data): the load table's
        // level as a store, TLB and lock as for loads, block not available.
        let skl = DataSource::Skl { pmem: true };
        let sl = data_src(skl, MemKind::StoreLatency, 0x3 | 1 << 4);
        let ld = data_src(skl, MemKind::Load, 0x3 | 1 << 4);
        assert_eq!(f(sl, OP_SHIFT, 0x1F), OP_STORE);
        assert_eq!(f(sl, LVL_SHIFT, 0x3FFF), f(ld, LVL_SHIFT, 0x3FFF));
        assert_eq!(f(sl, LVLNUM_SHIFT, 0xF), f(ld, LVLNUM_SHIFT, 0xF));
        assert_eq!(f(sl, TLB_SHIFT, 0x7F), TLB_L2 | TLB_MISS);
        assert_eq!(f(sl, BLK_SHIFT, 0x7), BLK_NA);
    }

    // Code at 0x1000: mov eax,1 (5 bytes); add rax,rbx (3); nop (1); ret (1).
    const CODE: [u8; 10] = [0xB8, 1, 0, 0, 0, 0x48, 0x01, 0xD8, 0x90, 0xC3];

    fn read(addr: u64, buf: &mut [u8]) -> bool {
        let off = match addr.checked_sub(0x1000) {
            Some(o) if (o as usize) < CODE.len() => o as usize,
            _ => return false,
        };
        buf.fill(0x90);
        let n = (CODE.len() - off).min(buf.len());
        buf[..n].copy_from_slice(&CODE[off..off + n]);
        true
    }

    #[test]
    fn fixup_walks_from_branch_target() {
        let lbr = RawBranch {
            from: 0x900,
            to: 0x1000,
            info: 0,
        };
        let user = |a: u64| a < 0x8000_0000_0000;
        // Record IP after `nop` (0x1009): the eventing instruction is the nop at 0x1008.
        assert_eq!(fixup_ip(0x1009, lbr, 64, read, user), Ok(0x1008));
        assert_eq!(fixup_ip(0x1005, lbr, 64, read, user), Ok(0x1000));
        // IP equal to the branch target: the branch itself.
        assert_eq!(fixup_ip(0x1000, lbr, 64, read, user), Ok(0x900));
        // Not on an instruction boundary.
        assert_eq!(
            fixup_ip(0x1006, lbr, 64, read, user),
            Err(FixupError::Misaligned)
        );
        assert_eq!(
            fixup_ip(0x1009, RawBranch::default(), 64, read, user),
            Err(FixupError::EmptyLbr)
        );
        assert_eq!(
            fixup_ip(0x3000, lbr, 64, read, user),
            Err(FixupError::TooFar)
        );
        let kernel = |a: u64| a < 0x1005;
        assert_eq!(
            fixup_ip(0x1008, lbr, 64, read, kernel),
            Err(FixupError::CrossesPrivilege)
        );
    }
}
