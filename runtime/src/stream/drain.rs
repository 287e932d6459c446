//! The drain, outside NMI context: queued records leave the sample ring as
//! wire frames (Lost records first for what was lost), and the End counters
//! account for every overflow: `taken = delivered + lost` once the ring is
//! empty.

use crate::sample::profile::{self, DRAIN_BATCH, PEBS_LOST_TOTAL, RING_SLOTS, events};
use crate::stream::wire;
use core::sync::atomic::{AtomicU64, Ordering};
use sampler::drain::{DrainEvents, drain_step};
use sampler::wire::{End, Lost, LostReason, Record};

/// Outside NMI context: moves queued samples (and Lost records for ring
/// losses) onto the wire when a batch is due ([`BATCH_MIN`]), at most one
/// ring's worth per CPU per call so a slow line cannot keep the tasks from
/// running (what does not fit is lost and counted), and no more than
/// `held` ([`drain_counted`]). Returns the records written.
pub fn drain(held: &Held) -> usize {
    if batch_due() {
        drain_counted(held)
    } else {
        crate::stream::repeat_if_due();
        0
    }
}

/// [`drain`] whether a batch is due or not, of everything queued: at the
/// end of a run, once sampling stopped.
pub fn drain_now() -> usize {
    drain_counted(&[usize::MAX; arch_x86::madt::MAX_CPUS])
}

/// With sample groups, samples wait in the open group frame until it
/// fills; a quiet stream's wait no longer than [`GROUP_FRAME_AGE_NS`].
/// Called with every batch: a batch is due at least every
/// [`BATCH_AGE_NS`], well within that age, so the returns to a task with
/// no batch due need not look.
fn flush_old_group() {
    let t0 = arch_x86::cpu::rdtsc();
    wire::flush_group(GROUP_FRAME_AGE_NS);
    DRAIN_TSC.fetch_add(arch_x86::cpu::rdtsc().wrapping_sub(t0), Ordering::Relaxed);
}

/// The drain takes samples in batches: it waits while every ring holds
/// fewer than this many records (or a quarter of its capacity), no ring
/// loss waits to be reported (PEBS and throttle losses wait for the next
/// batch), and the previous batch was taken less than
/// [`BATCH_AGE_NS`] ago. Taking, coding and writing a sample costs the
/// same alone or in a batch, but each call has its fixed part (the
/// encoder's critical section, the clock, the scratch record), which a
/// drain at every return to a task paid for two or three samples.
const BATCH_MIN: usize = 32;
/// The longest a sample waits in its ring for a batch to fill.
const BATCH_AGE_NS: u64 = 10_000_000;
/// The TSC when the drain last took a batch.
static BATCH_TSC: AtomicU64 = AtomicU64::new(0);

/// Whether [`drain`] takes a batch now (see [`BATCH_MIN`]); when it does,
/// the batch's time starts.
fn batch_due() -> bool {
    let now = arch_x86::cpu::rdtsc();
    let age = crate::time::tsc_to_ns(now.wrapping_sub(BATCH_TSC.load(Ordering::Relaxed)));
    let due = age >= BATCH_AGE_NS
        || profile::every_cpu().any(|(_, s)| {
            let min = (s.ring.capacity() / 4).clamp(1, BATCH_MIN);
            s.ring.len() >= min || s.ring.lost_pending()
        });
    if due {
        BATCH_TSC.store(now, Ordering::Relaxed);
    }
    due
}

/// TSC ticks the drain spent taking samples from the rings, coding them
/// and writing the frames, and the samples it took: the end-of-run
/// "drain N TSC ticks per sample" line (instructions under icount).
static DRAIN_TSC: AtomicU64 = AtomicU64::new(0);
static DRAIN_SAMPLES: AtomicU64 = AtomicU64::new(0);

/// The end-of-run line of the drain's average cost per sample (`perch:
/// drain N TSC ticks per sample ...`; instructions under `-icount
/// shift=0`, which `cargo xtask bench` reads).
pub fn report_cost() {
    let (ticks, samples) = (
        DRAIN_TSC.load(Ordering::Relaxed),
        DRAIN_SAMPLES.load(Ordering::Relaxed),
    );
    if let Some(avg) = ticks.checked_div(samples) {
        crate::kprintln!(
            "perch: drain {avg} TSC ticks per sample on average over {samples} samples (taking, coding and writing them; instructions under -icount shift=0)"
        );
    }
}

/// How long samples may wait in an open group frame (`wire_group=`).
const GROUP_FRAME_AGE_NS: u64 = 100_000_000;
const _: () = assert!(BATCH_AGE_NS < GROUP_FRAME_AGE_NS);

/// How many records each CPU's ring holds now, by CPU: what a drain that
/// must not run ahead of the Task records may take ([`drain_counted`]).
pub type Held = [usize; arch_x86::madt::MAX_CPUS];

/// Counts the records in each CPU's ring (see [`drain_counted`]).
pub fn held_now() -> Held {
    let mut held = [0usize; arch_x86::madt::MAX_CPUS];
    for ((_, s), n) in profile::every_cpu().zip(held.iter_mut()) {
        *n = s.ring.len();
    }
    held
}

/// Drains at most `max_steps` batches of each CPU's ring, CPU by CPU (see
/// [`drain`]); returns the records written.
pub fn drain_up_to(max_steps: usize) -> usize {
    take_counted(max_steps, &[usize::MAX; arch_x86::madt::MAX_CPUS])
}

/// Drains what is queued, whether a batch is due or not, but no more than
/// `held` ([`held_now`]) from each ring: before a record that must follow
/// every sample counted (a task's end, an exec). A sample goes out only
/// after its task's Task record: the caller
/// counts the rings, then sends the Task records of tasks made since its
/// last look, then drains what it counted. A task is made (under the
/// kernel lock) before it can run, and its samples are in a ring before
/// they are counted, so every sample counted is of a task that the look
/// after the count found.
pub fn drain_counted(held: &Held) -> usize {
    crate::stream::repeat_if_due();
    let written = take_counted(RING_SLOTS.div_ceil(DRAIN_BATCH), held);
    flush_old_group();
    written
}

/// [`drain_up_to`] once the records to take were counted (`held`, by CPU).
fn take_counted(max_steps: usize, held: &[usize]) -> usize {
    let mut written = 0;
    let evs = events();
    for ((cpu, s), &held) in profile::every_cpu().zip(held.iter()) {
        let pebs_lost = crate::smp::cpu(cpu).map_or(0, crate::sample::pmu::take_pebs_lost);
        if pebs_lost > 0 {
            PEBS_LOST_TOTAL.fetch_add(pebs_lost, Ordering::Relaxed);
            wire::send(&Record::Lost(Lost {
                time: crate::time::now_ns(),
                cpu,
                event: crate::sample::pmu::pebs_event(),
                count: pebs_lost,
                reason: LostReason::Pebs,
            }));
            written += 1;
        }
        // Event 0's, then each other event's (its id is its index).
        let others = s.event_throttled_pending.iter().enumerate().skip(1);
        let pending = core::iter::once((0, &s.throttled_pending)).chain(others);
        for (event, counter) in pending {
            let throttled = counter.swap(0, Ordering::Relaxed);
            if throttled > 0 {
                wire::send(&Record::Lost(Lost {
                    time: crate::time::now_ns(),
                    cpu,
                    event: event as u32,
                    count: throttled,
                    reason: LostReason::Throttled,
                }));
                written += 1;
            }
        }
        let ev = DrainEvents {
            configs: &evs,
            ring_lost: &s.event_ring_lost,
        };
        let mut left = held;
        for _ in 0..max_steps {
            // Nothing queued and no loss to report: no step (the drain
            // runs at every return to a task, most of them with nothing
            // to do).
            if (left == 0 || s.ring.is_empty()) && !s.ring.lost_pending() {
                break;
            }
            // A full flight-recorder buffer leaves the samples in the ring
            // (whose overflow is counted) rather than dropping encoded frames.
            if !wire::room_for_batch(DRAIN_BATCH) {
                wire::pump();
                return written;
            }
            let t0 = arch_x86::cpu::rdtsc();
            let step = wire::with_encoder(|enc, buf, write| {
                drain_step(
                    &s.ring,
                    ev,
                    cpu,
                    crate::time::now_ns(),
                    enc,
                    buf,
                    DRAIN_BATCH.min(left),
                    |f: &[u8]| write(f),
                )
            });
            DRAIN_TSC.fetch_add(arch_x86::cpu::rdtsc().wrapping_sub(t0), Ordering::Relaxed);
            match step {
                Ok(st) => {
                    DRAIN_SAMPLES.fetch_add(st.samples as u64, Ordering::Relaxed);
                    written += st.frames;
                    left -= st.records.min(left);
                    if st.records < DRAIN_BATCH {
                        break;
                    }
                }
                // Counted by the wire module; the ring's counters stay exact.
                Err(_) => break,
            }
        }
    }
    written
}

/// The End counters now (time and frames 0), samples only, summed over the
/// CPUs: `taken` counts every overflow (ring pushes, PEBS records lost,
/// overflows suppressed while throttled), `delivered` the samples the drain
/// took from the rings, `lost` the rings' losses plus the PEBS and
/// throttled ones (each sent in Lost records, with their CPU), so `taken =
/// delivered + lost` once the rings are empty, on each CPU and in all, with
/// the throttled part also in `lost`. Throttle and Unthrottle records pass
/// through the rings but are not samples, so they are taken out;
/// `throttled` is the number of times an event was throttled.
pub fn end_counters() -> End {
    let pebs = PEBS_LOST_TOTAL.load(Ordering::Relaxed);
    let mut end = End {
        time: 0,
        taken: pebs,
        delivered: 0,
        lost: pebs,
        throttled: 0,
        frames: 0,
        unknown_syscalls: heapless::Vec::new(),
    };
    for (_, c) in cpu_counters() {
        end.taken += c.taken;
        end.delivered += c.delivered;
        end.lost += c.lost;
        end.throttled += c.throttles;
    }
    end
}

/// One CPU's share of the End counters (PEBS losses, which the boot
/// CPU's PMU has, apart).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuCounters {
    /// Overflows: ring pushes of samples and overflows suppressed while
    /// throttled.
    pub taken: u64,
    /// Samples the drain took from the CPU's ring.
    pub delivered: u64,
    /// Samples lost: a full ring, or suppressed while throttled.
    pub lost: u64,
    /// Times the CPU's throttle engaged.
    pub throttles: u64,
}

/// Every CPU's counters, by CPU index: `taken = delivered + lost` holds
/// for each once its ring is drained.
pub fn cpu_counters() -> impl Iterator<Item = (u32, CpuCounters)> {
    profile::every_cpu().map(|(cpu, s)| {
        let r = s.ring.stats();
        let records = s.throttle_records.load(Ordering::Relaxed);
        let suppressed = s.throttled_total.load(Ordering::Relaxed);
        (
            cpu,
            CpuCounters {
                taken: r.taken - records + suppressed,
                delivered: r.delivered.saturating_sub(records),
                lost: r.lost + suppressed,
                throttles: s.throttle().0.throttle_count(),
            },
        )
    })
}
