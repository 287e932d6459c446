//! The perf.data / perf_event ABI in one place: record types, sample bits,
//! `perf_event_attr` layout and header feature ids, with the kernel's own
//! layout notes (`include/uapi/linux/perf_event.h`, perf's
//! `Documentation/perf.data-file-format.txt`, `tools/perf/util/header.h`).

/// "PERFILE2", little-endian magic at offset 0 of the file.
pub const MAGIC: &[u8; 8] = b"PERFILE2";
/// Size of `struct perf_file_header`: magic, size, attr_size, attrs, data,
/// event_types (three `perf_file_section`s) and the 256-bit feature bitmap.
pub const FILE_HEADER_SIZE: u64 = 104;
/// `perf_event_attr.size` we write (`PERF_ATTR_SIZE_VER5`). perf 6.1 refuses
/// 136-byte attrs from a file as an incompatible format.
pub const ATTR_SIZE: usize = 128;
/// One file attr: the attr followed by `struct perf_file_section ids`.
pub const FILE_ATTR_SIZE: usize = ATTR_SIZE + 16;

/// `perf_event_attr` field offsets (all little-endian).
pub mod attr_offset {
    /// `__u32 type`.
    pub const TYPE: usize = 0;
    /// `__u32 size`.
    pub const SIZE: usize = 4;
    /// `__u64 config`.
    pub const CONFIG: usize = 8;
    /// `union { sample_period, sample_freq }`.
    pub const SAMPLE_PERIOD: usize = 16;
    /// `__u64 sample_type`.
    pub const SAMPLE_TYPE: usize = 24;
    /// `__u64 read_format`.
    pub const READ_FORMAT: usize = 32;
    /// The flag bitfield (`disabled:1, inherit:1, ...`).
    pub const FLAGS: usize = 40;
    /// `union { wakeup_events, wakeup_watermark }`.
    pub const WAKEUP: usize = 48;
    /// `__u32 bp_type`.
    pub const BP_TYPE: usize = 52;
    /// `union { bp_addr, config1 }`.
    pub const CONFIG1: usize = 56;
    /// `union { bp_len, config2 }`.
    pub const CONFIG2: usize = 64;
    /// `__u64 branch_sample_type`.
    pub const BRANCH_SAMPLE_TYPE: usize = 72;
    /// `__u64 sample_regs_user`.
    pub const SAMPLE_REGS_USER: usize = 80;
    /// `__u32 sample_stack_user`.
    pub const SAMPLE_STACK_USER: usize = 88;
    /// `__s32 clockid`.
    pub const CLOCKID: usize = 92;
    /// `__u64 sample_regs_intr`.
    pub const SAMPLE_REGS_INTR: usize = 96;
    /// `__u32 aux_watermark`.
    pub const AUX_WATERMARK: usize = 104;
    /// `__u16 sample_max_stack`.
    pub const SAMPLE_MAX_STACK: usize = 108;
}

/// Bits of the `perf_event_attr` flag word (offset 40).
pub mod attr_flag {
    /// `disabled`.
    pub const DISABLED: u64 = 1 << 0;
    /// `exclude_user`.
    pub const EXCLUDE_USER: u64 = 1 << 4;
    /// `exclude_kernel`.
    pub const EXCLUDE_KERNEL: u64 = 1 << 5;
    /// `exclude_hv`.
    pub const EXCLUDE_HV: u64 = 1 << 6;
    /// `freq`: `sample_freq` instead of `sample_period`.
    pub const FREQ: u64 = 1 << 10;
    /// `sample_id_all`: TID/TIME/ID/CPU trailer on non-sample records.
    pub const SAMPLE_ID_ALL: u64 = 1 << 18;
    /// `exclude_guest`.
    pub const EXCLUDE_GUEST: u64 = 1 << 20;
    /// `use_clockid`.
    pub const USE_CLOCKID: u64 = 1 << 25;
    /// Shift of the two-bit `precise_ip` field.
    pub const PRECISE_IP_SHIFT: u32 = 15;
}

/// `perf_event_attr.type`.
pub mod attr_type {
    /// `PERF_TYPE_HARDWARE`.
    pub const HARDWARE: u32 = 0;
    /// `PERF_TYPE_SOFTWARE`.
    pub const SOFTWARE: u32 = 1;
    /// `PERF_TYPE_RAW`.
    pub const RAW: u32 = 4;
}

/// `PERF_COUNT_SW_CPU_CLOCK`: the config of a cpu-clock software event.
pub const SW_CPU_CLOCK: u64 = 0;

/// `PERF_SAMPLE_*` bits: the sampler's table, shared with the target. On
/// disk each present field follows the previous in bit order: `IDENTIFIER`
/// (u64 id), `IP`, `TID` (u32 pid, tid), `TIME`, `ADDR`, `ID`, `CPU` (u32
/// cpu, res), `PERIOD`, `CALLCHAIN` (u64 nr, ips), `BRANCH_STACK` (u64 nr,
/// [u64 hw_idx], {from, to, flags} x nr), `REGS_USER` (u64 abi, regs),
/// `WEIGHT` / `WEIGHT_STRUCT`, `DATA_SRC`, `REGS_INTR` (u64 abi, regs).
pub use sampler::event::sample_type as sample;

/// `branch_sample_type` bits the writer needs to know.
pub mod branch {
    /// `PERF_SAMPLE_BRANCH_HW_INDEX`: `hw_idx` precedes the entries.
    pub const HW_INDEX: u64 = 1 << 17;
    /// `PERF_SAMPLE_BRANCH_USER | KERNEL | HV`: the privilege levels.
    pub const PLM_ALL: u64 = 0b111;
    /// `PERF_SAMPLE_BRANCH_MAX` of perf 6.1: the defined bits are below it
    /// (PRIV_SAVE, bit 18, is the last).
    pub const MAX: u64 = 1 << 19;
}

/// `perf_event_header.type`.
pub mod record {
    /// `PERF_RECORD_MMAP`: pid, tid, addr, len, pgoff, filename.
    pub const MMAP: u32 = 1;
    /// `PERF_RECORD_LOST`: id, lost.
    pub const LOST: u32 = 2;
    /// `PERF_RECORD_COMM`: pid, tid, comm.
    pub const COMM: u32 = 3;
    /// `PERF_RECORD_EXIT`: pid, ppid, tid, ptid, time.
    pub const EXIT: u32 = 4;
    /// `PERF_RECORD_FORK`: pid, ppid, tid, ptid, time (as EXIT).
    pub const FORK: u32 = 7;
    /// `PERF_RECORD_READ`: pid, tid, the counter's value (read_format 0).
    pub const READ: u32 = 8;
    /// `PERF_RECORD_THROTTLE`: time, id, stream_id.
    pub const THROTTLE: u32 = 5;
    /// `PERF_RECORD_UNTHROTTLE`: time, id, stream_id.
    pub const UNTHROTTLE: u32 = 6;
    /// `PERF_RECORD_SAMPLE`.
    pub const SAMPLE: u32 = 9;
    /// `PERF_RECORD_MMAP2`: pid, tid, addr, len, pgoff, build-id (or
    /// device and inode), prot, flags, filename.
    pub const MMAP2: u32 = 10;
    /// `PERF_RECORD_LOST_SAMPLES`: lost.
    pub const LOST_SAMPLES: u32 = 13;
    /// `PERF_RECORD_FINISHED_ROUND` (user record, header only).
    pub const FINISHED_ROUND: u32 = 68;
}

/// `perf_event_header.misc`.
pub mod misc {
    /// `PERF_RECORD_MISC_KERNEL`.
    pub const KERNEL: u16 = 1;
    /// `PERF_RECORD_MISC_USER`.
    pub const USER: u16 = 2;
    /// `PERF_RECORD_MISC_COMM_EXEC` in a COMM: the task's process replaced
    /// its program (`execve`).
    pub const COMM_EXEC: u16 = 1 << 13;
    /// `PERF_RECORD_MISC_BUILD_ID_SIZE` in a build-id entry: the size byte is valid.
    pub const BUILD_ID_SIZE: u16 = 1 << 15;
    /// `PERF_RECORD_MISC_MMAP_BUILD_ID` in an MMAP2: it carries a build-id
    /// instead of device and inode numbers.
    pub const MMAP_BUILD_ID: u16 = 1 << 14;
}

/// Callchain context markers (`enum perf_callchain_context`): the
/// sampler's, which the target writes.
pub mod context {
    /// `PERF_CONTEXT_KERNEL`: the following ips are kernel ips.
    pub const KERNEL: u64 = sampler::sample::PERF_CONTEXT_KERNEL;
    /// `PERF_CONTEXT_USER`: the following ips are user ips.
    pub const USER: u64 = sampler::sample::PERF_CONTEXT_USER;
}

/// `enum perf_sample_regs_abi`: the sampler's [`sampler::regs::Abi`].
pub mod regs_abi {
    use sampler::regs::Abi;
    /// No registers follow.
    pub const NONE: u64 = Abi::None as u64;
    /// A 32-bit (compat) task.
    pub const ABI_32: u64 = Abi::Bits32 as u64;
    /// A 64-bit task.
    pub const ABI_64: u64 = Abi::Bits64 as u64;
}

/// `enum perf_event_x86_regs` indices (bit positions in a register mask):
/// the sampler's [`sampler::regs::Reg`].
pub mod reg {
    use sampler::regs::{ALL_REGS, NUM_GPR_SLOTS};
    /// Register names in mask-bit order 0..=23.
    pub const NAMES: [&str; NUM_GPR_SLOTS] = {
        let mut names = [""; NUM_GPR_SLOTS];
        let mut i = 0;
        while i < NUM_GPR_SLOTS {
            names[ALL_REGS[i] as usize] = ALL_REGS[i].name();
            i += 1;
        }
        names
    };
    /// The general-purpose registers the x86-64 kernel accepts (no DS/ES/FS/GS).
    pub const GPR_MASK_64: u64 = sampler::regs::GPR_MASK;
}

#[cfg(test)]
mod abi_tests {
    use super::*;

    /// perf's own numbers, from `include/uapi/linux/perf_event.h` and
    /// `arch/x86/include/uapi/asm/perf_regs.h`.
    #[test]
    fn the_sampler_constants_are_perfs() {
        assert_eq!(context::KERNEL, -128i64 as u64);
        assert_eq!(context::USER, -512i64 as u64);
        assert_eq!(
            (regs_abi::NONE, regs_abi::ABI_32, regs_abi::ABI_64),
            (0, 1, 2)
        );
        assert_eq!(
            reg::NAMES,
            [
                "AX", "BX", "CX", "DX", "SI", "DI", "BP", "SP", "IP", "FLAGS", "CS", "SS", "DS",
                "ES", "FS", "GS", "R8", "R9", "R10", "R11", "R12", "R13", "R14", "R15",
            ]
        );
        assert_eq!(reg::GPR_MASK_64, 0xff_0fff);
    }
}

/// Header feature bits (`enum HEADER_*` in perf's `util/header.h`).
pub mod feature {
    /// `HEADER_BUILD_ID`.
    pub const BUILD_ID: u32 = 2;
    /// `HEADER_HOSTNAME`.
    pub const HOSTNAME: u32 = 3;
    /// `HEADER_OSRELEASE`.
    pub const OSRELEASE: u32 = 4;
    /// `HEADER_VERSION`.
    pub const VERSION: u32 = 5;
    /// `HEADER_ARCH`.
    pub const ARCH: u32 = 6;
    /// `HEADER_NRCPUS`: u32 nr_cpus_avail, u32 nr_cpus_online.
    pub const NRCPUS: u32 = 7;
    /// `HEADER_CPUDESC`.
    pub const CPUDESC: u32 = 8;
    /// `HEADER_EVENT_DESC`.
    pub const EVENT_DESC: u32 = 12;
    /// `HEADER_CPU_TOPOLOGY`: the sibling lists of packages and cores,
    /// each CPU's core and socket, then the dies' lists and each CPU's die.
    pub const CPU_TOPOLOGY: u32 = 13;
    /// `HEADER_CMDLINE`.
    pub const CMDLINE: u32 = 11;
    /// `HEADER_BRANCH_STACK`: an empty flag.
    pub const BRANCH_STACK: u32 = 15;
    /// `HEADER_CLOCKID`: u64 clock resolution in ns.
    pub const CLOCKID: u32 = 23;
    /// `HEADER_SAMPLE_TIME`: u64 first, u64 last.
    pub const SAMPLE_TIME: u32 = 21;
}

/// Pads `n` up to the next multiple of 8.
pub const fn align8(n: usize) -> usize {
    (n + 7) & !7
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_layout_matches_the_kernel_uapi() {
        // PERF_ATTR_SIZE_VER5 is 112, VER6 120, VER7 128; fields are packed.
        assert_eq!(attr_offset::SAMPLE_MAX_STACK + 2 + 2 + 4, 116);
        assert_eq!(ATTR_SIZE, 128);
        assert_eq!(FILE_ATTR_SIZE, 144);
        assert_eq!(attr_offset::CLOCKID, attr_offset::SAMPLE_STACK_USER + 4);
        assert_eq!(attr_offset::SAMPLE_REGS_INTR, attr_offset::CLOCKID + 4);
    }

    #[test]
    fn context_markers_are_the_kernel_values() {
        assert_eq!(context::KERNEL, 0xffff_ffff_ffff_ff80);
        assert_eq!(context::USER, 0xffff_ffff_ffff_fe00);
    }

    #[test]
    fn gpr_mask_covers_everything_but_segment_data_registers() {
        let names: Vec<_> = (0..24)
            .filter(|b| reg::GPR_MASK_64 & (1 << b) != 0)
            .map(|b| reg::NAMES[b])
            .collect();
        assert_eq!(names.len(), 20);
        assert!(!names.contains(&"DS") && !names.contains(&"GS"));
        assert!(names.contains(&"R15") && names.contains(&"SS"));
    }

    #[test]
    fn feature_ids_match_an_independent_reader() {
        use linux_perf_data::Feature;
        for (ours, theirs) in [
            (feature::BUILD_ID, Feature::BUILD_ID),
            (feature::HOSTNAME, Feature::HOSTNAME),
            (feature::OSRELEASE, Feature::OSRELEASE),
            (feature::VERSION, Feature::VERSION),
            (feature::ARCH, Feature::ARCH),
            (feature::NRCPUS, Feature::NRCPUS),
            (feature::CPUDESC, Feature::CPUDESC),
            (feature::CMDLINE, Feature::CMDLINE),
            (feature::EVENT_DESC, Feature::EVENT_DESC),
            (feature::BRANCH_STACK, Feature::BRANCH_STACK),
            (feature::CLOCKID, Feature::CLOCKID),
            (feature::SAMPLE_TIME, Feature::SAMPLE_TIME),
        ] {
            assert_eq!(ours, theirs.0, "{theirs:?}");
        }
    }

    #[test]
    fn record_ids_match_an_independent_reader() {
        use linux_perf_data::linux_perf_event_reader::RecordType;
        assert_eq!(record::MMAP, RecordType::MMAP.0);
        assert_eq!(record::LOST, RecordType::LOST.0);
        assert_eq!(record::COMM, RecordType::COMM.0);
        assert_eq!(record::THROTTLE, RecordType::THROTTLE.0);
        assert_eq!(record::UNTHROTTLE, RecordType::UNTHROTTLE.0);
        assert_eq!(record::SAMPLE, RecordType::SAMPLE.0);
        assert_eq!(record::LOST_SAMPLES, RecordType::LOST_SAMPLES.0);
    }

    #[test]
    fn align8_pads_up() {
        assert_eq!(align8(0), 0);
        assert_eq!(align8(1), 8);
        assert_eq!(align8(8), 8);
        assert_eq!(align8(17), 24);
    }
}
