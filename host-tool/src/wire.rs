//! The adapter from `sampler::wire` records (what the target sends) to the
//! host model the converter, stats and flamegraph consume.

use sampler::event::{EventKind as WireKind, EventSource as WireSource, Sampling};
use sampler::sample::CpuMode;
use sampler::wire::{self, CpuVendor, LogPayload, Record};

use crate::model::{
    CpuPlace, EndCounters, EventInfo, EventKind, EventSource, Hello, Item, ProgramInfo, SampleView,
    SegmentInfo, TaskInfo, TaskOrigin,
};
use crate::perf_data::BranchEntry;

/// Converts records to items, reusing its buffers between samples.
#[derive(Default)]
pub struct Adapter {
    branches: Vec<BranchEntry>,
}

/// The host model of a wire Hello.
pub fn hello(h: &wire::Hello) -> Hello {
    let source = if h.simulated {
        EventSource::SimulatedPmu
    } else {
        match h.pmu.source {
            WireSource::CpuClock => EventSource::NmiClock,
            WireSource::Simulated => EventSource::SimulatedPmu,
            WireSource::IntelPmu | WireSource::AmdPmu => EventSource::Pmu,
        }
    };
    let vendor = match h.cpu.vendor {
        CpuVendor::Intel => "GenuineIntel".to_owned(),
        CpuVendor::Amd => "AuthenticAMD".to_owned(),
        CpuVendor::Other(v) => String::from_utf8_lossy(&v)
            .trim_end_matches('\0')
            .to_owned(),
    };
    let cpu_desc = format!(
        "{vendor} family {} model {} stepping {}",
        h.cpu.family, h.cpu.model, h.cpu.stepping
    );
    let events = h
        .events
        .iter()
        .map(|e| {
            let (period_or_freq, freq) = match e.sampling {
                Sampling::Period(p) => (p, false),
                Sampling::Frequency(f) => (f, true),
            };
            EventInfo {
                id: e.id,
                kind: match e.kind {
                    WireKind::Hardware => EventKind::Hardware,
                    WireKind::Raw => EventKind::Raw,
                    WireKind::CpuClock => EventKind::CpuClock,
                },
                config: e.config,
                period_or_freq,
                freq,
                sample_type: e.sample_type,
                regs_user: e.regs_user,
                regs_intr: e.regs_intr,
                branch_sample_type: e.branch_sample_type,
                exclude_user: e.exclude_user,
                exclude_kernel: e.exclude_kernel,
                precise: e.precise,
                max_stack: e.max_stack,
            }
        })
        .collect();
    Hello {
        protocol_version: u32::from(h.version),
        build_id: h.build_id.to_vec(),
        cpus: h.ncpus,
        places: h
            .cpus
            .iter()
            .map(|p| CpuPlace {
                apic_id: p.apic_id,
                package: p.package,
                die: p.die,
                core: p.core,
            })
            .collect(),
        source,
        cpu_desc,
        cmdline: h.cmdline.as_str().to_owned(),
        events,
        boot: h.boot,
        repeat: h.repeat,
        transport: h.transport.name().to_owned(),
    }
}

/// The host model of a wire Task.
pub fn task(t: &wire::Task) -> TaskInfo {
    TaskInfo {
        pid: t.pid,
        tid: t.tid,
        name: t.name.as_str().to_owned(),
        compat: t.abi == sampler::regs::Abi::Bits32,
        time: t.time,
        text: t
            .text
            .iter()
            .map(|r| (r.start, r.len, r.file_offset))
            .collect(),
        program: t.program.as_ref().map(|p| ProgramInfo {
            path: p.path.as_str().to_owned(),
            build_id: p.build_id.to_vec(),
            segments: p
                .segments
                .iter()
                .map(|s| SegmentInfo {
                    start: s.start,
                    len: s.len,
                    file_offset: s.file_offset,
                    read: s.prot & wire::Segment::READ != 0,
                    write: s.prot & wire::Segment::WRITE != 0,
                    exec: s.prot & wire::Segment::EXEC != 0,
                })
                .collect(),
        }),
        origin: match t.origin {
            wire::Origin::Named => TaskOrigin::Named,
            wire::Origin::Made { ppid, ptid } => TaskOrigin::Made { ppid, ptid },
            wire::Origin::Exec => TaskOrigin::Exec,
        },
    }
}

impl Adapter {
    /// A fresh adapter.
    pub fn new() -> Self {
        Self::default()
    }

    /// Calls `f` with the item for `rec`.
    pub fn with_item<R>(&mut self, rec: &Record, f: impl FnOnce(&Item<'_>) -> R) -> R {
        match rec {
            Record::Hello(h) => f(&Item::Hello(hello(h))),
            Record::Task(t) => f(&Item::Task(task(t))),
            Record::TaskExit(e) => f(&Item::TaskExit {
                pid: e.pid,
                tid: e.tid,
                time: e.time,
            }),
            Record::Sample(s) => {
                self.branches.clear();
                let mut hw_idx = 0;
                if let Some(b) = &s.branches {
                    hw_idx = b.hw_idx;
                    self.branches.extend(b.entries.iter().map(|e| BranchEntry {
                        from: e.from,
                        to: e.to,
                        flags: e.flags.to_perf(),
                    }));
                }
                let (ua, ur) = s
                    .regs_user
                    .as_ref()
                    .map_or((0, &[][..]), |r| (r.abi.perf_value(), &r.values[..]));
                let (ia, ir) = s
                    .regs_intr
                    .as_ref()
                    .map_or((0, &[][..]), |r| (r.abi.perf_value(), &r.values[..]));
                let mem = s.mem.unwrap_or_default();
                f(&Item::Sample(SampleView {
                    event: s.event,
                    cpu: s.cpu,
                    pid: s.pid,
                    tid: s.tid,
                    time: s.time,
                    ip: s.ip,
                    user: s.cpumode == CpuMode::User,
                    period: s.period,
                    addr: mem.addr,
                    callchain: &s.callchain,
                    regs_user_abi: ua,
                    regs_user: ur,
                    regs_intr_abi: ia,
                    regs_intr: ir,
                    branches: &self.branches,
                    branch_hw_idx: hw_idx,
                    weight: if mem.ins_lat != 0 {
                        mem.weight_struct()
                    } else {
                        mem.weight
                    },
                    data_src: mem.data_src,
                }))
            }
            Record::Lost(l) => f(&Item::Lost {
                event: l.event,
                cpu: l.cpu,
                count: l.count,
                time: l.time,
                throttled: l.reason == wire::LostReason::Throttled,
            }),
            Record::Throttle(t) => f(&Item::Throttle {
                event: t.event,
                cpu: t.cpu,
                on: true,
                time: t.time,
            }),
            Record::Unthrottle(t) => f(&Item::Throttle {
                event: t.event,
                cpu: t.cpu,
                on: false,
                time: t.time,
            }),
            Record::Log(l) => match &l.payload {
                LogPayload::Text(t) => {
                    let cut = if l.truncated { " [truncated]" } else { "" };
                    f(&Item::Log(
                        format!("{:?} {}{cut}", l.level, t.as_str()).to_uppercase_level(),
                    ))
                }
                LogPayload::Defmt(b) => f(&Item::Defmt(b)),
            },
            Record::SelfTest(t) => f(&Item::Log(format!(
                "SELFTEST {} {}: measured {} expected {} {}",
                t.name.as_str(),
                if t.passed { "PASS" } else { "FAIL" },
                t.measured,
                t.expected,
                t.detail.as_str()
            ))),
            Record::End(e) => f(&Item::End(EndCounters {
                taken: e.taken,
                delivered: e.delivered,
                lost: e.lost,
                throttled: e.throttled,
                unknown_syscalls: unknown_syscalls(&e.unknown_syscalls),
            })),
        }
    }
}

/// End's unknown system calls as `x86_64 41 (socket) x2, i386 102 (socketcall) x1`.
pub fn unknown_syscalls(list: &[wire::UnknownSyscall]) -> String {
    list.iter()
        .map(|u| {
            let abi = if u.abi == 32 {
                kcore::sys::Abi::I386
            } else {
                kcore::sys::Abi::X86_64
            };
            let name = kcore::sys::table::name(abi, u64::from(u.nr))
                .filter(|n| !n.is_empty())
                .unwrap_or("unassigned");
            format!("{} {} ({name}) x{}", abi.name(), u.nr, u.count)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

trait UpperLevel {
    fn to_uppercase_level(self) -> String;
}

impl UpperLevel for String {
    /// Upper-cases the leading level word ("Info text" -> "INFO text").
    fn to_uppercase_level(mut self) -> String {
        let end = self.find(' ').unwrap_or(self.len());
        self[..end].make_ascii_uppercase();
        self
    }
}

#[cfg(test)]
mod unknown_tests {
    use super::*;

    #[test]
    fn unknown_syscalls_are_named_per_abi() {
        let l = [
            wire::UnknownSyscall {
                abi: 64,
                nr: 41,
                count: 2,
            },
            wire::UnknownSyscall {
                abi: 32,
                nr: 102,
                count: 1,
            },
            wire::UnknownSyscall {
                abi: 64,
                nr: 100_000,
                count: 3,
            },
        ];
        assert_eq!(
            unknown_syscalls(&l),
            "x86_64 41 (socket) x2, i386 102 (socketcall) x1, x86_64 100000 (unassigned) x3"
        );
    }
}
