//! The 64-bit DS save area and the PEBS buffer it points at (SDM vol. 3
//! "Debug Store (DS) Mechanism", figure "64-bit DS Save Area").
//!
//! The hardware reads and writes the area while counters run, so its fields
//! are atomics (same layout as `u64`). The PEBS buffer is plain memory; the
//! driver reads records only after the PMI, once the writes are complete.

use core::sync::atomic::{AtomicU64, Ordering};

/// Number of PEBS counter-reset slots: 32 general-purpose then 16 fixed
/// (fixed counter n at slot 32 + n from format 5 on).
pub const RESET_SLOTS: usize = 48;
/// Slot index of fixed counter 0's reset value from PEBS format 5 on.
pub const RESET_FIXED_BASE: usize = 32;
/// Slot index of fixed counter 0's reset value on PEBS format 4, which has
/// 8 general-purpose slots (Linux `MAX_PEBS_EVENTS_FMT4`).
pub const RESET_FIXED_BASE_FMT4: usize = 8;

/// The 64-bit DS save area.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct DsArea {
    /// BTS buffer base (unused by Perch, kept 0).
    pub bts_base: AtomicU64,
    /// BTS index.
    pub bts_index: AtomicU64,
    /// BTS absolute maximum.
    pub bts_max: AtomicU64,
    /// BTS interrupt threshold.
    pub bts_threshold: AtomicU64,
    /// Linear address of the first byte of the PEBS buffer.
    pub pebs_base: AtomicU64,
    /// Linear address where the next record is written.
    pub pebs_index: AtomicU64,
    /// One past the last byte a record may use.
    pub pebs_max: AtomicU64,
    /// When the index reaches this address, a PMI is raised.
    pub pebs_threshold: AtomicU64,
    /// Value loaded into each counter after its record is written.
    pub pebs_reset: [AtomicU64; RESET_SLOTS],
}

impl DsArea {
    /// A zeroed area.
    pub const fn new() -> Self {
        #[allow(clippy::declare_interior_mutable_const)]
        const Z: AtomicU64 = AtomicU64::new(0);
        DsArea {
            bts_base: Z,
            bts_index: Z,
            bts_max: Z,
            bts_threshold: Z,
            pebs_base: Z,
            pebs_index: Z,
            pebs_max: Z,
            pebs_threshold: Z,
            pebs_reset: [Z; RESET_SLOTS],
        }
    }

    /// Reset slot of a counter under PEBS record format `format`: GP
    /// counter n at slot n; fixed counter n at 8 + n on format 4 and at
    /// 32 + n from format 5 on (fixed counters take PEBS only from format 4).
    pub fn reset_slot(&self, counter: super::Counter, format: u8) -> &AtomicU64 {
        let base = if format == 4 {
            RESET_FIXED_BASE_FMT4
        } else {
            RESET_FIXED_BASE
        };
        match counter {
            super::Counter::Gp(n) => &self.pebs_reset[usize::from(n) % RESET_SLOTS],
            super::Counter::Fixed(n) => &self.pebs_reset[(base + usize::from(n)) % RESET_SLOTS],
        }
    }

    /// Read a field.
    pub fn get(field: &AtomicU64) -> u64 {
        field.load(Ordering::Acquire)
    }
}

impl Default for DsArea {
    fn default() -> Self {
        Self::new()
    }
}

/// The memory the PMU writes: the DS area and the PEBS buffer. On the target
/// both are per-CPU statics; in tests and under `pmu=sim` the simulator writes
/// records into the same buffer through this type.
#[derive(Debug)]
pub struct DsMemory<'a> {
    /// The DS save area.
    pub area: &'a DsArea,
    /// The PEBS buffer.
    pub pebs: &'a mut [u8],
}

impl<'a> DsMemory<'a> {
    /// Pair an area with a buffer.
    pub fn new(area: &'a DsArea, pebs: &'a mut [u8]) -> Self {
        DsMemory { area, pebs }
    }

    /// Linear address of the DS area (for IA32_DS_AREA).
    pub fn area_addr(&self) -> u64 {
        core::ptr::from_ref(self.area) as u64
    }

    /// Linear address of the PEBS buffer.
    pub fn pebs_addr(&self) -> u64 {
        self.pebs.as_ptr() as u64
    }

    /// Bytes of records written since the buffer was last reset.
    pub fn pebs_filled(&self) -> usize {
        let idx = DsArea::get(&self.area.pebs_index);
        idx.saturating_sub(self.pebs_addr())
            .min(self.pebs.len() as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn ds_area_layout_matches_the_sdm() {
        assert_eq!(offset_of!(DsArea, bts_base), 0x00);
        assert_eq!(offset_of!(DsArea, bts_index), 0x08);
        assert_eq!(offset_of!(DsArea, bts_max), 0x10);
        assert_eq!(offset_of!(DsArea, bts_threshold), 0x18);
        assert_eq!(offset_of!(DsArea, pebs_base), 0x20);
        assert_eq!(offset_of!(DsArea, pebs_index), 0x28);
        assert_eq!(offset_of!(DsArea, pebs_max), 0x30);
        assert_eq!(offset_of!(DsArea, pebs_threshold), 0x38);
        assert_eq!(offset_of!(DsArea, pebs_reset), 0x40);
        // Fixed counter 0's reset value at 0x40 + 32 * 8.
        assert_eq!(offset_of!(DsArea, pebs_reset) + 8 * RESET_FIXED_BASE, 0x140);
        assert_eq!(size_of::<DsArea>(), 0x1C0);
        assert_eq!(size_of::<AtomicU64>(), 8);
    }
}
