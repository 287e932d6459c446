//! The PMI glue both overflow sources share: the driver's handler, then
//! every overflow as sample extras (each PEBS record its own sample, the
//! LBR stack as its branch stack).

use crate::sample::profile::Extra;
use arch_x86::pmu::driver::PmuDriver;
use arch_x86::pmu::ds::DsMemory;
use arch_x86::pmu::{PmiSummary, PmuHw};
use sampler::lbr::{self as slbr, LbrFormat};
use sampler::pebs::{self, DecodeConfig};
use sampler::regs::RegFile;

/// Most branch entries taken from one PEBS record.
pub(super) const MAX_BRANCHES: usize = 32;

/// How a driver's raw records are decoded into sample fields.
#[derive(Clone, Copy, Debug)]
pub struct Decoding {
    /// PEBS records, when the event is precise.
    pub pebs: Option<DecodeConfig>,
    /// LBR entries, when branch stacks are recorded.
    pub lbr: Option<LbrFormat>,
}

/// What one serviced PMI produced.
#[derive(Clone, Copy, Debug, Default)]
pub struct Serviced {
    /// The driver's account of the PMI.
    pub summary: PmiSummary,
    /// Samples handed to `emit`.
    pub samples: u32,
    /// Samples that carried a non-empty branch stack.
    pub with_branches: u32,
    /// PEBS records decoded into samples.
    pub pebs_decoded: u32,
    /// PEBS records the decoder refused (each a lost sample).
    pub pebs_bad: u32,
}

impl Serviced {
    /// PEBS samples lost in this PMI (collisions, unusable records, refused decodes).
    pub fn pebs_lost(&self) -> u32 {
        self.summary.pebs_lost + self.pebs_bad
    }
}

/// The glue both overflow sources share: run the driver's PMI handler on
/// `hw` and hand every overflow to `emit` as sample extras (a PEBS record's
/// IP, GPRs and memory fields; the LBR stack as the branch stack).
/// NMI-safe: no allocation, lock or log; bounded copies only.
pub fn service_pmi<H: PmuHw>(
    driver: &mut PmuDriver,
    hw: &mut H,
    mem: Option<&mut DsMemory<'_>>,
    tsc: u64,
    dec: &Decoding,
    emit: &mut dyn FnMut(&Extra<'_>),
) -> Serviced {
    let mut out = Serviced::default();
    out.summary = driver.handle_pmi(hw, mem, tsc, &mut |ov| {
        let mut raw: heapless::Vec<slbr::RawBranch, MAX_BRANCHES> = heapless::Vec::new();
        for b in ov.lbr {
            let b = slbr::RawBranch {
                from: b.from,
                to: b.to,
                info: b.info,
            };
            if raw.push(b).is_err() {
                break;
            }
        }
        let mut branches = match dec.lbr {
            Some(f) if !raw.is_empty() => Some(slbr::to_stack(f, &raw)),
            _ => None,
        };
        let decoded = match (ov.pebs, dec.pebs) {
            (None, _) => None,
            (Some(b), Some(cfg)) => Some(pebs::decode(b, &cfg).ok()),
            (Some(_), None) => Some(None),
        };
        match decoded {
            Some(Some(r)) => {
                if branches.is_none()
                    && r.lbr_len() > 0
                    && let Some(f) = dec.lbr
                {
                    raw.clear();
                    for b in r.lbr() {
                        if raw.push(b).is_err() {
                            break;
                        }
                    }
                    branches = Some(slbr::to_stack(f, &raw));
                }
                let regs: Option<RegFile> = r.regs;
                out.pebs_decoded += 1;
                count_sample(&mut out, branches.as_ref());
                emit(&Extra {
                    event: ov.event as u8,
                    period: ov.period,
                    precise_ip: Some(r.ip),
                    pebs_regs: regs.as_ref(),
                    branches: branches.as_ref(),
                    mem: r.mem,
                });
            }
            Some(None) => out.pebs_bad += 1,
            None => {
                count_sample(&mut out, branches.as_ref());
                emit(&Extra {
                    event: ov.event as u8,
                    period: ov.period,
                    precise_ip: None,
                    pebs_regs: None,
                    branches: branches.as_ref(),
                    mem: None,
                })
            }
        }
    });
    out
}

pub(super) fn count_sample(out: &mut Serviced, branches: Option<&sampler::sample::BranchStack>) {
    out.samples += 1;
    if branches.is_some_and(|b| !b.entries.is_empty()) {
        out.with_branches += 1;
    }
}
