//! The drain, outside NMI context: queued records leave the sample ring as
//! wire frames (Lost records first for what was lost), and the End counters
//! account for every overflow: `taken = delivered + lost` once the ring is
//! empty.

use crate::sample::profile::{
    DRAIN_BATCH, EVENT_RING_LOST, EVENT_THROTTLED_PENDING, PEBS_LOST_TOTAL, RING, RING_SLOTS,
    THROTTLE_RECORDS, THROTTLED_PENDING, THROTTLED_TOTAL, events, throttle,
};
use crate::stream::wire;
use core::sync::atomic::Ordering;
use sampler::drain::{DrainEvents, drain_step};
use sampler::wire::{End, Lost, LostReason, Record};

/// Outside NMI context: moves queued samples (and Lost records for ring
/// losses) onto the wire, at most one ring's worth per call so a slow line
/// cannot keep the tasks from running (what does not fit is lost and
/// counted). Returns the records written.
pub fn drain() -> usize {
    crate::stream::repeat_if_due();
    drain_up_to(RING_SLOTS.div_ceil(DRAIN_BATCH))
}

/// Drains at most `max_steps` batches (see [`drain`]); returns the records written.
pub fn drain_up_to(max_steps: usize) -> usize {
    let mut written = 0;
    let pebs_lost = crate::sample::pmu::take_pebs_lost();
    if pebs_lost > 0 {
        PEBS_LOST_TOTAL.fetch_add(pebs_lost, Ordering::Relaxed);
        wire::send(&Record::Lost(Lost {
            time: crate::time::now_ns(),
            cpu: 0,
            event: crate::sample::pmu::pebs_event(),
            count: pebs_lost,
            reason: LostReason::Pebs,
        }));
        written += 1;
    }
    // Event 0's, then each other event's (its id is its index).
    let others = EVENT_THROTTLED_PENDING.iter().enumerate().skip(1);
    let pending = core::iter::once((0, &THROTTLED_PENDING)).chain(others);
    for (event, counter) in pending {
        let throttled = counter.swap(0, Ordering::Relaxed);
        if throttled > 0 {
            wire::send(&Record::Lost(Lost {
                time: crate::time::now_ns(),
                cpu: 0,
                event: event as u32,
                count: throttled,
                reason: LostReason::Throttled,
            }));
            written += 1;
        }
    }
    let evs = events();
    let ev = DrainEvents {
        configs: &evs,
        ring_lost: &EVENT_RING_LOST,
    };
    for _ in 0..max_steps {
        // A full flight-recorder buffer leaves the samples in the ring
        // (whose overflow is counted) rather than dropping encoded frames.
        if !wire::room_for_batch(DRAIN_BATCH) {
            wire::pump();
            break;
        }
        let step = wire::with_encoder(|enc, buf, write| {
            drain_step(
                &RING,
                ev,
                0,
                crate::time::now_ns(),
                enc,
                buf,
                DRAIN_BATCH,
                |f: &[u8]| write(f),
            )
        });
        match step {
            Ok(s) => {
                written += s.frames;
                if s.frames < DRAIN_BATCH {
                    break;
                }
            }
            // Counted by the wire module; the ring's counters stay exact.
            Err(_) => break,
        }
    }
    written
}

/// The End counters now (time and frames 0), samples only: `taken` counts
/// every overflow (ring pushes, PEBS records lost, overflows suppressed
/// while throttled), `delivered` the samples the drain took from the ring,
/// `lost` the ring's losses plus the PEBS and throttled ones (each sent in
/// Lost records), so `taken = delivered + lost` once the ring is empty,
/// with the throttled part also in `lost`. Throttle and Unthrottle records
/// pass through the ring but are not samples, so they are taken out;
/// `throttled` is the number of times the event was throttled.
pub fn end_counters() -> End {
    let r = RING.stats();
    let records = THROTTLE_RECORDS.load(Ordering::Relaxed);
    let pebs = PEBS_LOST_TOTAL.load(Ordering::Relaxed);
    let suppressed = THROTTLED_TOTAL.load(Ordering::Relaxed);
    End {
        time: 0,
        taken: r.taken - records + pebs + suppressed,
        delivered: r.delivered.saturating_sub(records),
        lost: r.lost + pebs + suppressed,
        throttled: throttle().0.throttle_count(),
        frames: 0,
        unknown_syscalls: heapless::Vec::new(),
    }
}
