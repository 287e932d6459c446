//! Event configuration following perf_event semantics (`perf_event_attr`),
//! the PMU capabilities an event is checked against, and validation that
//! refuses what Linux refuses, with a precise reason.

use core::fmt;

use serde::{Deserialize, Serialize};

use crate::regs;

/// `PERF_SAMPLE_*` bits (`include/uapi/linux/perf_event.h`).
pub mod sample_type {
    /// The instruction pointer.
    pub const IP: u64 = 1 << 0;
    /// Process and thread id.
    pub const TID: u64 = 1 << 1;
    /// Timestamp.
    pub const TIME: u64 = 1 << 2;
    /// Data address.
    pub const ADDR: u64 = 1 << 3;
    /// Counter values (not supported by Perch).
    pub const READ: u64 = 1 << 4;
    /// Call chain.
    pub const CALLCHAIN: u64 = 1 << 5;
    /// Event id.
    pub const ID: u64 = 1 << 6;
    /// CPU number.
    pub const CPU: u64 = 1 << 7;
    /// Sample period.
    pub const PERIOD: u64 = 1 << 8;
    /// Stream id.
    pub const STREAM_ID: u64 = 1 << 9;
    /// Raw tracepoint data (not supported by Perch).
    pub const RAW: u64 = 1 << 10;
    /// Branch stack (LBR).
    pub const BRANCH_STACK: u64 = 1 << 11;
    /// User registers.
    pub const REGS_USER: u64 = 1 << 12;
    /// User stack dump (not supported by Perch).
    pub const STACK_USER: u64 = 1 << 13;
    /// Weight (u64).
    pub const WEIGHT: u64 = 1 << 14;
    /// Data source.
    pub const DATA_SRC: u64 = 1 << 15;
    /// Event id, first in the sample.
    pub const IDENTIFIER: u64 = 1 << 16;
    /// Transaction flags (not supported by Perch).
    pub const TRANSACTION: u64 = 1 << 17;
    /// Interrupt registers.
    pub const REGS_INTR: u64 = 1 << 18;
    /// Physical data address (not supported by Perch).
    pub const PHYS_ADDR: u64 = 1 << 19;
    /// Weight split into weight and instruction latency.
    pub const WEIGHT_STRUCT: u64 = 1 << 24;
    /// The bits Perch produces.
    pub const SUPPORTED: u64 = IP
        | TID
        | TIME
        | ADDR
        | CALLCHAIN
        | ID
        | CPU
        | PERIOD
        | STREAM_ID
        | BRANCH_STACK
        | REGS_USER
        | WEIGHT
        | DATA_SRC
        | IDENTIFIER
        | REGS_INTR
        | WEIGHT_STRUCT;
}

/// What an event counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventKind {
    /// `PERF_TYPE_HARDWARE` with a generic `PERF_COUNT_HW_*` config.
    Hardware,
    /// `PERF_TYPE_RAW`: a model-specific event select / umask encoding.
    Raw,
    /// `PERF_TYPE_SOFTWARE` / `PERF_COUNT_SW_CPU_CLOCK`: the NMI clock.
    CpuClock,
}

impl EventKind {
    /// `perf_event_attr.type`.
    pub const fn perf_type(self) -> u32 {
        match self {
            EventKind::Hardware => 0,
            EventKind::Raw => 4,
            EventKind::CpuClock => 1,
        }
    }
}

/// Generic hardware event configs (`PERF_COUNT_HW_*`).
pub mod hw {
    /// Core cycles.
    pub const CPU_CYCLES: u64 = 0;
    /// Retired instructions.
    pub const INSTRUCTIONS: u64 = 1;
    /// Last-level cache references.
    pub const CACHE_REFERENCES: u64 = 2;
    /// Last-level cache misses.
    pub const CACHE_MISSES: u64 = 3;
    /// Retired branches.
    pub const BRANCH_INSTRUCTIONS: u64 = 4;
    /// Mispredicted branches.
    pub const BRANCH_MISSES: u64 = 5;
    /// The highest generic config.
    pub const MAX: u64 = 9;
}

/// Period or frequency (`perf_event_attr.sample_period` / `sample_freq` with
/// the `freq` bit).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Sampling {
    /// A sample every `n` events.
    Period(u64),
    /// Adjust the period toward `hz` samples per second (`perf record -F`).
    Frequency(u64),
}

/// When user registers are taken (see [`crate::capture`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum UserRegsMode {
    /// In the NMI: from the interrupt frame, or the task's saved user frame.
    #[default]
    AtInterrupt,
    /// At the next return to user mode (complete by construction).
    AtReturnToUser,
}

/// `perf_event_attr.branch_sample_type` bits Perch understands.
pub mod branch_type {
    /// User branches.
    pub const USER: u64 = 1 << 0;
    /// Kernel branches.
    pub const KERNEL: u64 = 1 << 1;
    /// Any branch.
    pub const ANY: u64 = 1 << 3;
    /// Any call.
    pub const ANY_CALL: u64 = 1 << 4;
    /// Any return.
    pub const ANY_RETURN: u64 = 1 << 5;
    /// Call-stack mode.
    pub const CALL_STACK: u64 = 1 << 11;
    /// Record the hardware index (`hw_idx` before the entries).
    pub const HW_INDEX: u64 = 1 << 17;
}

/// One event's configuration: the subset of `perf_event_attr` Perch uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EventConfig {
    /// The event's id, carried by every sample (IDENTIFIER / ID).
    pub id: u32,
    /// What it counts.
    pub kind: EventKind,
    /// `perf_event_attr.config`.
    pub config: u64,
    /// Period or frequency.
    pub sampling: Sampling,
    /// `PERF_SAMPLE_*` bits.
    pub sample_type: u64,
    /// `sample_regs_user`.
    pub regs_user: u64,
    /// `sample_regs_intr`.
    pub regs_intr: u64,
    /// `branch_sample_type`.
    pub branch_sample_type: u64,
    /// Do not count in user mode.
    pub exclude_user: bool,
    /// Do not count in kernel (runtime) mode.
    pub exclude_kernel: bool,
    /// `precise_ip` (0..=3).
    pub precise: u8,
    /// Callchain depth limit (`sample_max_stack`), at most [`crate::sample::MAX_CALLCHAIN`].
    pub max_stack: u16,
    /// When user registers are taken.
    pub user_regs_mode: UserRegsMode,
}

impl EventConfig {
    /// Makes this the event `of` counts (its kind, config, sampling,
    /// excluded modes, precise level and branch types), keeping this
    /// config's id and the fields each sample carries.
    pub fn count_as(&mut self, of: &EventConfig) {
        self.kind = of.kind;
        self.config = of.config;
        self.sampling = of.sampling;
        self.exclude_user = of.exclude_user;
        self.exclude_kernel = of.exclude_kernel;
        self.precise = of.precise;
        self.branch_sample_type = of.branch_sample_type;
    }

    /// A cpu-clock event (the NMI clock) sampling at `hz` with IP, TID,
    /// TIME and PERIOD: the common default.
    pub const fn cpu_clock(id: u32, hz: u64) -> Self {
        EventConfig {
            id,
            kind: EventKind::CpuClock,
            config: 0,
            sampling: Sampling::Frequency(hz),
            sample_type: sample_type::IDENTIFIER
                | sample_type::IP
                | sample_type::TID
                | sample_type::TIME
                | sample_type::PERIOD,
            regs_user: 0,
            regs_intr: 0,
            branch_sample_type: 0,
            exclude_user: false,
            exclude_kernel: false,
            precise: 0,
            max_stack: crate::sample::MAX_CALLCHAIN as u16,
            user_regs_mode: UserRegsMode::AtInterrupt,
        }
    }

    /// A hardware event with a fixed period and the common fields.
    pub const fn hardware(id: u32, config: u64, period: u64) -> Self {
        let mut e = Self::cpu_clock(id, 0);
        e.kind = EventKind::Hardware;
        e.config = config;
        e.sampling = Sampling::Period(period);
        e
    }

    /// Whether every bit of `bits` is in the sample type.
    pub const fn has(&self, bits: u64) -> bool {
        self.sample_type & bits == bits
    }

    /// Checks this config against `caps` the way `perf_event_open` does.
    pub fn validate(&self, caps: &PmuCaps) -> Result<(), ConfigError> {
        let unsupported = self.sample_type & !sample_type::SUPPORTED;
        if unsupported != 0 {
            return Err(ConfigError::UnsupportedSampleType(unsupported));
        }
        if self.has(sample_type::WEIGHT) && self.has(sample_type::WEIGHT_STRUCT) {
            return Err(ConfigError::WeightAndWeightStruct);
        }
        match self.sampling {
            Sampling::Period(0) => return Err(ConfigError::ZeroPeriod),
            Sampling::Period(p) if p >> 63 != 0 => return Err(ConfigError::PeriodTooLarge(p)),
            Sampling::Frequency(0) => return Err(ConfigError::ZeroFrequency),
            Sampling::Frequency(f) if f > caps.max_sample_rate => {
                return Err(ConfigError::FrequencyTooHigh {
                    requested: f,
                    max: caps.max_sample_rate,
                });
            }
            _ => {}
        }
        if self.exclude_user && self.exclude_kernel {
            return Err(ConfigError::ExcludesEverything);
        }
        if self.precise > 3 {
            return Err(ConfigError::PreciseOutOfRange(self.precise));
        }
        match self.kind {
            EventKind::CpuClock => {
                if self.config != 0 {
                    return Err(ConfigError::UnknownConfig(self.config));
                }
                if self.precise > 0 {
                    return Err(ConfigError::PreciseNeedsPebs);
                }
            }
            EventKind::Hardware | EventKind::Raw => {
                if caps.source == EventSource::CpuClock {
                    return Err(ConfigError::NoPmu);
                }
                if self.kind == EventKind::Hardware && self.config > hw::MAX {
                    return Err(ConfigError::UnknownConfig(self.config));
                }
                if self.precise > 0 && caps.pebs_format.is_none() {
                    return Err(ConfigError::PreciseNeedsPebs);
                }
            }
        }
        if usize::from(self.max_stack) > crate::sample::MAX_CALLCHAIN {
            return Err(ConfigError::StackTooDeep(self.max_stack));
        }
        Self::validate_mask(
            self.regs_user,
            self.has(sample_type::REGS_USER),
            false,
            caps,
        )?;
        Self::validate_mask(
            self.regs_intr,
            self.has(sample_type::REGS_INTR),
            self.precise > 0,
            caps,
        )?;
        if self.has(sample_type::BRANCH_STACK) {
            if caps.lbr_depth == 0 {
                return Err(ConfigError::BranchStackWithoutLbr);
            }
            if self.branch_sample_type == 0 {
                return Err(ConfigError::EmptyBranchSampleType);
            }
        }
        if self.user_regs_mode == UserRegsMode::AtReturnToUser && !self.has(sample_type::REGS_USER)
        {
            return Err(ConfigError::DeferredWithoutRegsUser);
        }
        Ok(())
    }

    fn validate_mask(
        mask: u64,
        enabled: bool,
        pebs: bool,
        caps: &PmuCaps,
    ) -> Result<(), ConfigError> {
        if !enabled {
            return if mask != 0 {
                Err(ConfigError::MaskWithoutSampleType(mask))
            } else {
                Ok(())
            };
        }
        if mask == 0 {
            return Err(ConfigError::EmptyRegisterMask);
        }
        if mask & regs::RESERVED_MASK != 0 {
            return Err(ConfigError::UnknownRegisterBits(mask & regs::RESERVED_MASK));
        }
        if mask & regs::SEGMENT_MASK != 0 {
            return Err(ConfigError::SegmentRegister(mask & regs::SEGMENT_MASK));
        }
        if mask & regs::XMM_MASK != 0 && !(pebs && caps.pebs_xmm) {
            return Err(ConfigError::XmmWithoutPebs);
        }
        Ok(())
    }
}

/// Which overflow source feeds the sampler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventSource {
    /// The NMI clock ("cpu-clock"): no PMU.
    CpuClock,
    /// An Intel architectural PMU.
    IntelPmu,
    /// An AMD core PMU.
    AmdPmu,
    /// The simulated PMU (`pmu=sim`).
    Simulated,
}

/// What the PMU can do; events are validated against it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PmuCaps {
    /// The event source in use.
    pub source: EventSource,
    /// Architectural PMU version (CPUID 0xA EAX bits 7:0), 0 without one.
    pub version: u8,
    /// General-purpose counters.
    pub gp_counters: u8,
    /// Width of the general-purpose counters in bits.
    pub gp_width: u8,
    /// Fixed counters.
    pub fixed_counters: u8,
    /// Width of the fixed counters in bits.
    pub fixed_width: u8,
    /// PEBS record format (PERF_CAPABILITIES bits 11:8), if PEBS works.
    pub pebs_format: Option<u8>,
    /// PEBS can sample XMM registers (adaptive PEBS).
    pub pebs_xmm: bool,
    /// LBR format (PERF_CAPABILITIES bits 5:0), or `0x3f` for architectural LBR.
    pub lbr_format: Option<u8>,
    /// LBR depth, 0 without LBR.
    pub lbr_depth: u8,
    /// `perf_event_max_sample_rate`.
    pub max_sample_rate: u64,
}

impl PmuCaps {
    /// The NMI clock: no counters, no PEBS, no LBR.
    pub const fn cpu_clock() -> Self {
        PmuCaps {
            source: EventSource::CpuClock,
            version: 0,
            gp_counters: 0,
            gp_width: 0,
            fixed_counters: 0,
            fixed_width: 0,
            pebs_format: None,
            pebs_xmm: false,
            lbr_format: None,
            lbr_depth: 0,
            max_sample_rate: crate::throttle::DEFAULT_MAX_SAMPLE_RATE,
        }
    }
}

/// Why an event config was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// Sample type bits Perch does not produce.
    UnsupportedSampleType(u64),
    /// WEIGHT and WEIGHT_STRUCT together (Linux refuses this).
    WeightAndWeightStruct,
    /// A period of 0.
    ZeroPeriod,
    /// A period with bit 63 set (Linux refuses this).
    PeriodTooLarge(u64),
    /// A frequency of 0.
    ZeroFrequency,
    /// A frequency above `perf_event_max_sample_rate`.
    FrequencyTooHigh {
        /// The requested frequency.
        requested: u64,
        /// The limit.
        max: u64,
    },
    /// Both exclude_user and exclude_kernel: nothing would be counted.
    ExcludesEverything,
    /// precise_ip above 3.
    PreciseOutOfRange(u8),
    /// precise_ip > 0 needs PEBS.
    PreciseNeedsPebs,
    /// A hardware event without a PMU.
    NoPmu,
    /// An unknown generic config.
    UnknownConfig(u64),
    /// sample_max_stack beyond the supported depth.
    StackTooDeep(u16),
    /// A register mask without the matching sample type bit.
    MaskWithoutSampleType(u64),
    /// REGS_USER / REGS_INTR with an empty mask.
    EmptyRegisterMask,
    /// Mask bits naming no register (24..31).
    UnknownRegisterBits(u64),
    /// DS, ES, FS or GS, which x86-64 cannot sample.
    SegmentRegister(u64),
    /// XMM registers need adaptive PEBS (and only for REGS_INTR).
    XmmWithoutPebs,
    /// BRANCH_STACK without LBR support.
    BranchStackWithoutLbr,
    /// BRANCH_STACK with an empty branch_sample_type.
    EmptyBranchSampleType,
    /// Taking user registers at return to user needs REGS_USER.
    DeferredWithoutRegsUser,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ConfigError::UnsupportedSampleType(b) => {
                write!(f, "sample_type bits {b:#x} are not supported")
            }
            ConfigError::WeightAndWeightStruct => {
                write!(f, "WEIGHT and WEIGHT_STRUCT are mutually exclusive")
            }
            ConfigError::ZeroPeriod => write!(f, "sample period must not be 0"),
            ConfigError::PeriodTooLarge(p) => write!(f, "sample period {p:#x} has bit 63 set"),
            ConfigError::ZeroFrequency => write!(f, "sample frequency must not be 0"),
            ConfigError::FrequencyTooHigh { requested, max } => write!(
                f,
                "sample frequency {requested} Hz exceeds perf_event_max_sample_rate {max}"
            ),
            ConfigError::ExcludesEverything => {
                write!(
                    f,
                    "exclude_user and exclude_kernel together exclude everything"
                )
            }
            ConfigError::PreciseOutOfRange(p) => write!(f, "precise_ip {p} is above 3"),
            ConfigError::PreciseNeedsPebs => write!(f, "precise_ip > 0 needs PEBS"),
            ConfigError::NoPmu => {
                write!(f, "hardware events need a PMU; only cpu-clock is available")
            }
            ConfigError::UnknownConfig(c) => write!(f, "unknown event config {c:#x}"),
            ConfigError::StackTooDeep(d) => write!(
                f,
                "sample_max_stack {d} exceeds {}",
                crate::sample::MAX_CALLCHAIN
            ),
            ConfigError::MaskWithoutSampleType(m) => {
                write!(f, "register mask {m:#x} given without REGS_USER/REGS_INTR")
            }
            ConfigError::EmptyRegisterMask => write!(f, "register sampling needs a non-empty mask"),
            ConfigError::UnknownRegisterBits(m) => {
                write!(f, "register mask bits {m:#x} name no x86-64 register")
            }
            ConfigError::SegmentRegister(m) => {
                write!(
                    f,
                    "register mask bits {m:#x} (DS/ES/FS/GS) cannot be sampled in 64-bit mode"
                )
            }
            ConfigError::XmmWithoutPebs => {
                write!(
                    f,
                    "XMM registers can only be sampled in REGS_INTR with adaptive PEBS"
                )
            }
            ConfigError::BranchStackWithoutLbr => write!(f, "BRANCH_STACK needs LBR support"),
            ConfigError::EmptyBranchSampleType => {
                write!(f, "BRANCH_STACK needs a non-empty branch_sample_type")
            }
            ConfigError::DeferredWithoutRegsUser => {
                write!(f, "taking user registers at return to user needs REGS_USER")
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::sample_type as st;
    use super::*;

    fn pmu() -> PmuCaps {
        PmuCaps {
            source: EventSource::IntelPmu,
            version: 5,
            gp_counters: 8,
            gp_width: 48,
            fixed_counters: 4,
            fixed_width: 48,
            pebs_format: Some(4),
            pebs_xmm: true,
            lbr_format: Some(0x3f),
            lbr_depth: 32,
            max_sample_rate: 100_000,
        }
    }

    #[test]
    fn count_as_takes_the_event_and_keeps_the_sample_fields() {
        let mut hwe = EventConfig::hardware(7, hw::INSTRUCTIONS, 50_000);
        hwe.exclude_kernel = true;
        hwe.precise = 2;
        hwe.branch_sample_type = branch_type::ANY | branch_type::USER;
        let mut e = EventConfig::cpu_clock(0, 4000);
        e.sample_type |= st::REGS_USER;
        e.regs_user = crate::regs::GPR_MASK;
        let (id, stype, regs) = (e.id, e.sample_type, e.regs_user);
        e.count_as(&hwe);
        assert_eq!((e.kind, e.config), (hwe.kind, hwe.config));
        assert_eq!(e.sampling, hwe.sampling);
        assert!(e.exclude_kernel && !e.exclude_user);
        assert_eq!(e.precise, 2);
        assert_eq!(e.branch_sample_type, hwe.branch_sample_type);
        assert_eq!((e.id, e.sample_type, e.regs_user), (id, stype, regs));
    }

    fn with(f: impl FnOnce(&mut EventConfig)) -> EventConfig {
        let mut e = EventConfig::hardware(1, hw::CPU_CYCLES, 100_000);
        f(&mut e);
        e
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(
            EventConfig::cpu_clock(0, 4000).validate(&PmuCaps::cpu_clock()),
            Ok(())
        );
        assert_eq!(EventConfig::hardware(1, 0, 1000).validate(&pmu()), Ok(()));
        let full = with(|e| {
            e.sample_type |= st::REGS_USER | st::REGS_INTR | st::BRANCH_STACK | st::CALLCHAIN;
            e.sample_type |= st::WEIGHT_STRUCT | st::DATA_SRC | st::ADDR | st::CPU;
            e.regs_user = regs::GPR_MASK;
            e.regs_intr = regs::GPR_MASK | regs::XMM_MASK;
            e.branch_sample_type = branch_type::ANY | branch_type::USER;
            e.precise = 3;
        });
        assert_eq!(full.validate(&pmu()), Ok(()));
    }

    #[test]
    fn refusals() {
        let caps = pmu();
        let cases: [(EventConfig, ConfigError); 17] = [
            (
                with(|e| e.sample_type |= st::READ),
                ConfigError::UnsupportedSampleType(st::READ),
            ),
            (
                with(|e| e.sample_type |= st::WEIGHT | st::WEIGHT_STRUCT),
                ConfigError::WeightAndWeightStruct,
            ),
            (
                with(|e| e.sampling = Sampling::Period(0)),
                ConfigError::ZeroPeriod,
            ),
            (
                with(|e| e.sampling = Sampling::Period(1 << 63)),
                ConfigError::PeriodTooLarge(1 << 63),
            ),
            (
                with(|e| e.sampling = Sampling::Frequency(200_000)),
                ConfigError::FrequencyTooHigh {
                    requested: 200_000,
                    max: 100_000,
                },
            ),
            (
                with(|e| {
                    e.exclude_user = true;
                    e.exclude_kernel = true
                }),
                ConfigError::ExcludesEverything,
            ),
            (with(|e| e.precise = 4), ConfigError::PreciseOutOfRange(4)),
            (with(|e| e.config = 99), ConfigError::UnknownConfig(99)),
            (
                with(|e| {
                    e.sample_type |= st::REGS_USER;
                    e.regs_user = regs::GPR_MASK | regs::Reg::Fs.bit()
                }),
                ConfigError::SegmentRegister(regs::Reg::Fs.bit()),
            ),
            (
                with(|e| {
                    e.sample_type |= st::REGS_USER;
                    e.regs_user = 1 << 26
                }),
                ConfigError::UnknownRegisterBits(1 << 26),
            ),
            (
                with(|e| {
                    e.sample_type |= st::REGS_USER;
                    e.regs_user = 1 << 32
                }),
                ConfigError::XmmWithoutPebs,
            ),
            (
                with(|e| {
                    e.sample_type |= st::REGS_INTR;
                    e.regs_intr = 1 << 32 // XMM in REGS_INTR but not precise
                }),
                ConfigError::XmmWithoutPebs,
            ),
            (
                with(|e| e.sample_type |= st::REGS_USER),
                ConfigError::EmptyRegisterMask,
            ),
            (
                with(|e| e.regs_intr = 1),
                ConfigError::MaskWithoutSampleType(1),
            ),
            (
                with(|e| e.sample_type |= st::BRANCH_STACK),
                ConfigError::EmptyBranchSampleType,
            ),
            (with(|e| e.max_stack = 65), ConfigError::StackTooDeep(65)),
            (
                with(|e| e.user_regs_mode = UserRegsMode::AtReturnToUser),
                ConfigError::DeferredWithoutRegsUser,
            ),
        ];
        for (cfg, err) in cases {
            assert_eq!(cfg.validate(&caps), Err(err), "{cfg:?}");
        }
    }

    #[test]
    fn capability_refusals() {
        let mut caps = pmu();
        caps.lbr_depth = 0;
        let branch = with(|e| {
            e.sample_type |= st::BRANCH_STACK;
            e.branch_sample_type = branch_type::ANY;
        });
        assert_eq!(
            branch.validate(&caps),
            Err(ConfigError::BranchStackWithoutLbr)
        );
        caps.pebs_format = None;
        assert_eq!(
            with(|e| e.precise = 1).validate(&caps),
            Err(ConfigError::PreciseNeedsPebs)
        );
        let clock = PmuCaps::cpu_clock();
        assert_eq!(
            EventConfig::hardware(1, 0, 10).validate(&clock),
            Err(ConfigError::NoPmu)
        );
        let mut e = EventConfig::cpu_clock(0, 1000);
        e.precise = 1;
        assert_eq!(e.validate(&clock), Err(ConfigError::PreciseNeedsPebs));
    }

    #[test]
    fn errors_print_their_reason() {
        let mut s = heapless::String::<128>::new();
        fmt::write(
            &mut s,
            format_args!("{}", ConfigError::SegmentRegister(0xf000)),
        )
        .unwrap();
        assert!(s.contains("DS/ES/FS/GS"), "{s}");
    }
}
