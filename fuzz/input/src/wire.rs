//! Stream records built from fuzz input: every [`Record`] variant with the
//! invariants the encoder relies on (register values matching their mask,
//! branch flags that perf can pack, the Hello's magic and version), and
//! samples that often repeat their task's previous sample with a few fields
//! changed, so the decoder's delta paths (dense and sparse registers, chain
//! checks) are reached and not only keyframes.

use arbitrary::{Result, Unstructured};
use sampler::event::{EventConfig, EventKind, EventSource, PmuCaps, Sampling, UserRegsMode};
use sampler::regs::{Abi, RegsSample, VALID_MASK_WITH_XMM};
use sampler::sample::{
    BranchEntry, BranchFlags, BranchStack, CpuMode, MAX_BRANCHES, MAX_CALLCHAIN, MemInfo, Sample,
};
use sampler::wire::{
    CpuId, CpuPlace, CpuVendor, DELIMITER, Encoder, EncoderConfig, End, Hello, Log, LogLevel, Lost,
    LostReason, MAX_BUILD_ID, MAX_CPUS, MAX_EVENTS, MAX_FRAME, MAX_PROGRAM_SEGMENTS,
    MAX_TASK_RANGES, MAX_UNKNOWN_SYSCALLS, Origin, Program, Record, Segment, SelfTest, Task,
    TaskExit, TextRange, ThrottleEvent, UnknownSyscall,
};

/// Task ids samples are drawn from: few, so that tasks repeat and delta
/// frames follow keyframes.
pub const TIDS: u32 = 4;

/// At most this many records in one generated stream.
pub const MAX_RECORDS: usize = 48;

/// A bounded string from the input, cut at a character boundary.
pub fn string<const N: usize>(u: &mut Unstructured<'_>) -> Result<heapless::String<N>> {
    let s: &str = u.arbitrary()?;
    let mut end = s.len().min(N);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = heapless::String::new();
    // Cannot fail: `end <= N`.
    let _ = out.push_str(&s[..end]);
    Ok(out)
}

/// A bounded vector of `T` from the input.
pub fn vec<T, const N: usize>(
    u: &mut Unstructured<'_>,
    mut item: impl FnMut(&mut Unstructured<'_>) -> Result<T>,
) -> Result<heapless::Vec<T, N>> {
    let n = u.int_in_range(0..=N)?;
    let mut out = heapless::Vec::new();
    for _ in 0..n {
        if u.is_empty() {
            break;
        }
        // Cannot fail: at most N items.
        let _ = out.push(item(u)?);
    }
    Ok(out)
}

/// A register sample whose values match its mask (none for ABI_NONE).
pub fn regs(u: &mut Unstructured<'_>) -> Result<RegsSample> {
    let abi = *u.choose(&[Abi::None, Abi::Bits32, Abi::Bits64])?;
    let mask = u.arbitrary::<u64>()? & VALID_MASK_WITH_XMM;
    let mut values = heapless::Vec::new();
    if abi != Abi::None {
        for _ in 0..mask.count_ones() {
            // Cannot fail: at most 56 mask bits are valid.
            let _ = values.push(u.arbitrary()?);
        }
    }
    Ok(RegsSample { abi, mask, values })
}

/// A branch stack with flags perf can pack.
pub fn branches(u: &mut Unstructured<'_>) -> Result<BranchStack> {
    Ok(BranchStack {
        hw_idx: u.arbitrary()?,
        entries: vec::<_, MAX_BRANCHES>(u, |u| {
            Ok(BranchEntry {
                from: u.arbitrary()?,
                to: u.arbitrary()?,
                flags: BranchFlags::from_perf(u.arbitrary()?),
            })
        })?,
    })
}

/// A sample with every field drawn from the input.
pub fn fresh_sample(u: &mut Unstructured<'_>) -> Result<Sample> {
    let tid = u.int_in_range(0..=TIDS - 1)?;
    Ok(Sample {
        event: u.int_in_range(0..=3)?,
        cpumode: if u.arbitrary()? {
            CpuMode::Kernel
        } else {
            CpuMode::User
        },
        ip: u.arbitrary()?,
        pid: if u.arbitrary()? { tid } else { u.arbitrary()? },
        tid,
        time: u.arbitrary()?,
        cpu: u.int_in_range(0..=3)?,
        period: u.arbitrary()?,
        callchain: vec::<_, MAX_CALLCHAIN>(u, |u| u.arbitrary())?,
        branches: if u.arbitrary()? {
            Some(branches(u)?)
        } else {
            None
        },
        regs_user: if u.arbitrary()? { Some(regs(u)?) } else { None },
        regs_intr: if u.arbitrary()? { Some(regs(u)?) } else { None },
        mem: if u.arbitrary()? {
            Some(MemInfo {
                addr: u.arbitrary()?,
                weight: u.arbitrary()?,
                ins_lat: u.arbitrary()?,
                data_src: u.arbitrary()?,
            })
        } else {
            None
        },
    })
}

/// `prev` with a few fields changed by small amounts, the way a task's
/// consecutive samples differ.
pub fn next_sample(u: &mut Unstructured<'_>, prev: &Sample) -> Result<Sample> {
    let mut s = prev.clone();
    let step = |u: &mut Unstructured<'_>, v: u64| -> Result<u64> {
        Ok(v.wrapping_add(i64::from(u.arbitrary::<i16>()?) as u64))
    };
    s.time = step(u, s.time)?;
    if u.arbitrary()? {
        s.ip = step(u, s.ip)?;
    }
    if u.arbitrary()? {
        s.period = step(u, s.period)?;
    }
    for regs in [&mut s.regs_user, &mut s.regs_intr].into_iter().flatten() {
        let n = regs.values.len();
        if n > 0 {
            for _ in 0..u.int_in_range(0..=3)? {
                let i = u.int_in_range(0..=n - 1)?;
                regs.values[i] = step(u, regs.values[i])?;
            }
        }
    }
    if u.arbitrary()? {
        s.callchain = vec::<_, MAX_CALLCHAIN>(u, |u| u.arbitrary())?;
    }
    if u.ratio(1, 8)? {
        s.regs_user = if u.arbitrary()? { Some(regs(u)?) } else { None };
    }
    if u.ratio(1, 8)? {
        s.cpu = u.int_in_range(0..=3)?;
    }
    Ok(s)
}

/// An event configuration.
pub fn event(u: &mut Unstructured<'_>) -> Result<EventConfig> {
    Ok(EventConfig {
        id: u.int_in_range(0..=3)?,
        kind: *u.choose(&[EventKind::Hardware, EventKind::Raw, EventKind::CpuClock])?,
        config: u.arbitrary()?,
        sampling: if u.arbitrary()? {
            Sampling::Period(u.arbitrary()?)
        } else {
            Sampling::Frequency(u.arbitrary()?)
        },
        sample_type: u.arbitrary()?,
        regs_user: u.arbitrary()?,
        regs_intr: u.arbitrary()?,
        branch_sample_type: u.arbitrary()?,
        exclude_user: u.arbitrary()?,
        exclude_kernel: u.arbitrary()?,
        precise: u.arbitrary()?,
        max_stack: u.arbitrary()?,
        user_regs_mode: *u.choose(&[UserRegsMode::AtInterrupt, UserRegsMode::AtReturnToUser])?,
    })
}

/// A Hello of this protocol version.
pub fn hello(u: &mut Unstructured<'_>) -> Result<Hello> {
    let vendor = match u.int_in_range(0..=2)? {
        0 => CpuVendor::Intel,
        1 => CpuVendor::Amd,
        _ => CpuVendor::Other(u.arbitrary()?),
    };
    let source = *u.choose(&[
        EventSource::CpuClock,
        EventSource::IntelPmu,
        EventSource::AmdPmu,
        EventSource::Simulated,
    ])?;
    let pmu = PmuCaps {
        source,
        version: u.arbitrary()?,
        gp_counters: u.arbitrary()?,
        gp_width: u.arbitrary()?,
        fixed_counters: u.arbitrary()?,
        fixed_width: u.arbitrary()?,
        pebs_format: u.arbitrary()?,
        pebs_xmm: u.arbitrary()?,
        lbr_format: u.arbitrary()?,
        lbr_depth: u.arbitrary()?,
        max_sample_rate: u.arbitrary()?,
    };
    let cpu = CpuId {
        vendor,
        family: u.arbitrary()?,
        model: u.arbitrary()?,
        stepping: u.arbitrary()?,
    };
    let mut h = Hello::new(cpu, pmu);
    h.simulated = u.arbitrary()?;
    h.ncpus = u.arbitrary()?;
    h.cpus = vec::<_, MAX_CPUS>(u, |u| {
        Ok(CpuPlace {
            apic_id: u.arbitrary()?,
            package: u.arbitrary()?,
            die: u.arbitrary()?,
            core: u.arbitrary()?,
        })
    })?;
    h.tsc_hz = u.arbitrary()?;
    h.build_id = vec::<_, MAX_BUILD_ID>(u, |u| u.arbitrary())?;
    h.cmdline = string(u)?;
    h.events = vec::<_, MAX_EVENTS>(u, event)?;
    h.boot = u.arbitrary()?;
    h.repeat = u.int_in_range(0..=3)?;
    Ok(h)
}

/// A loaded program as a Task record names it.
fn program(u: &mut Unstructured<'_>) -> Result<Program> {
    Ok(Program {
        path: string(u)?,
        build_id: vec::<_, MAX_BUILD_ID>(u, |u| u.arbitrary())?,
        segments: vec::<_, MAX_PROGRAM_SEGMENTS>(u, |u| {
            Ok(Segment {
                start: u.arbitrary()?,
                len: u.arbitrary()?,
                file_offset: u.arbitrary()?,
                prot: u.int_in_range(0..=7)?,
            })
        })?,
    })
}

/// Why a Task record was sent: named, made by one of the tasks (a thread
/// of its own process or a fork), or an exec.
fn origin(u: &mut Unstructured<'_>) -> Result<Origin> {
    Ok(match u.int_in_range(0..=2)? {
        0 => Origin::Named,
        1 => Origin::Made {
            ppid: u.arbitrary()?,
            ptid: u.int_in_range(0..=TIDS - 1)?,
        },
        _ => Origin::Exec,
    })
}

fn throttle(u: &mut Unstructured<'_>) -> Result<ThrottleEvent> {
    Ok(ThrottleEvent {
        time: u.arbitrary()?,
        cpu: u.arbitrary()?,
        event: u.int_in_range(0..=3)?,
    })
}

/// Any record but a sample and a Hello.
pub fn other_record(u: &mut Unstructured<'_>) -> Result<Record> {
    Ok(match u.int_in_range(0..=7)? {
        0 => Record::Lost(Lost {
            time: u.arbitrary()?,
            cpu: u.arbitrary()?,
            event: u.int_in_range(0..=3)?,
            count: u.arbitrary()?,
            reason: *u.choose(&[
                LostReason::RingFull,
                LostReason::PendingFull,
                LostReason::Pebs,
                LostReason::Throttled,
            ])?,
        }),
        1 => Record::Throttle(throttle(u)?),
        2 => Record::Unthrottle(throttle(u)?),
        3 => Record::Task(Task {
            time: u.arbitrary()?,
            pid: u.arbitrary()?,
            tid: u.int_in_range(0..=TIDS - 1)?,
            name: string(u)?,
            abi: *u.choose(&[Abi::None, Abi::Bits32, Abi::Bits64])?,
            text: vec::<_, MAX_TASK_RANGES>(u, |u| {
                Ok(TextRange {
                    start: u.arbitrary()?,
                    len: u.arbitrary()?,
                    file_offset: u.arbitrary()?,
                })
            })?,
            program: if u.arbitrary()? {
                Some(program(u)?)
            } else {
                None
            },
            origin: origin(u)?,
        }),
        4 => {
            let level = *u.choose(&[
                LogLevel::Error,
                LogLevel::Warn,
                LogLevel::Info,
                LogLevel::Debug,
                LogLevel::Trace,
            ])?;
            let time = u.arbitrary()?;
            if u.arbitrary()? {
                Record::Log(Log::text(time, level, u.arbitrary()?))
            } else {
                Record::Log(Log::defmt(time, level, u.arbitrary()?))
            }
        }
        5 => Record::SelfTest(SelfTest {
            name: string(u)?,
            passed: u.arbitrary()?,
            measured: u.arbitrary()?,
            expected: u.arbitrary()?,
            detail: string(u)?,
        }),
        6 => Record::TaskExit(TaskExit {
            time: u.arbitrary()?,
            pid: u.arbitrary()?,
            tid: u.int_in_range(0..=TIDS - 1)?,
        }),
        _ => Record::End(End {
            time: u.arbitrary()?,
            taken: u.arbitrary()?,
            delivered: u.arbitrary()?,
            lost: u.arbitrary()?,
            throttled: u.arbitrary()?,
            frames: u.arbitrary()?,
            unknown_syscalls: vec::<_, MAX_UNKNOWN_SYSCALLS>(u, |u| {
                Ok(UnknownSyscall {
                    abi: *u.choose(&[32, 64])?,
                    nr: u.arbitrary()?,
                    count: u.arbitrary()?,
                })
            })?,
        }),
    })
}

/// A stream of records: a Hello first, then mostly samples (each task's
/// next sample usually close to its previous one), with the other records
/// mixed in.
pub fn records(u: &mut Unstructured<'_>) -> Result<Vec<Record>> {
    let mut out = vec![Record::Hello(hello(u)?)];
    let mut last: [Option<Sample>; TIDS as usize] = Default::default();
    let n = u.int_in_range(0..=MAX_RECORDS)?;
    for _ in 0..n {
        if u.is_empty() {
            break;
        }
        let r = match u.int_in_range(0..=15)? {
            0..=11 => {
                let tid = u.int_in_range(0..=TIDS - 1)? as usize;
                let s = match &last[tid] {
                    Some(prev) if u.ratio(3, 4)? => next_sample(u, prev)?,
                    _ => {
                        let mut s = fresh_sample(u)?;
                        s.tid = tid as u32;
                        s
                    }
                };
                last[tid] = Some(s.clone());
                Record::Sample(s)
            }
            12 if u.ratio(1, 4)? => Record::Hello(hello(u)?),
            _ => other_record(u)?,
        };
        out.push(r);
    }
    Ok(out)
}

/// The encoder settings a stream is written with: keyframes every 1 to 8
/// samples of a task, and a frame per sample or groups of 1, 3 or 16.
pub fn encoder_config(u: &mut Unstructured<'_>) -> Result<EncoderConfig> {
    Ok(EncoderConfig {
        keyframe_interval: u.int_in_range(1..=8)?,
        group: [0, 0, 1, 3, 16][u.int_in_range(0..=4)?],
    })
}

/// The records encoded after a leading delimiter, and each frame's byte
/// range (delimiter included). Without groups every record is one frame;
/// with groups a frame may carry several samples. Every generated record
/// fits [`MAX_FRAME`].
pub fn encode(records: &[Record], config: EncoderConfig) -> (Vec<u8>, Vec<std::ops::Range<usize>>) {
    let mut enc: Box<Encoder<4>> = Box::new(Encoder::new(config));
    let mut buf = vec![0u8; MAX_FRAME];
    let mut out = vec![DELIMITER];
    let mut frames = Vec::with_capacity(records.len());
    let mut write = |f: &[u8]| {
        frames.push(out.len()..out.len() + f.len());
        out.extend_from_slice(f);
        Ok::<(), ()>(())
    };
    for r in records {
        enc.put(r, &mut buf, &mut write)
            .expect("every generated record fits MAX_FRAME");
    }
    enc.flush(&mut buf, &mut write)
        .expect("every generated record fits MAX_FRAME");
    (out, frames)
}

/// How many records each frame of an intact stream from [`encode`]
/// carries, found by decoding it frame by frame.
pub fn records_per_frame(bytes: &[u8], frames: &[std::ops::Range<usize>]) -> Vec<usize> {
    let mut dec = Box::new(sampler::wire::Decoder::new());
    let mut start = 0;
    frames
        .iter()
        .map(|f| {
            let mut n = 0;
            dec.push(&bytes[start..f.end], |_| n += 1);
            start = f.end;
            n
        })
        .collect()
}
