//! The drain side of the ring (never NMI context): what the NMI handler
//! queues ([`NmiRecord`]), and one drain step that turns ring losses into
//! Lost records and queued records into wire frames, expanding each
//! [`RawSample`] into the wire [`Sample`] on the way.

use crate::capture::RawSample;
use crate::event::EventConfig;
use crate::ring::{ConstDefault, Ring};
use crate::sample::Sample;
use crate::wire::{Encoder, Lost, LostReason, PutError, Record, ThrottleEvent};
use core::sync::atomic::{AtomicU64, Ordering};

/// What the NMI handler (and the tick, for Unthrottle) pushes into a ring,
/// so samples and throttle transitions reach the wire in order.
// Samples dominate the ring; boxing is impossible in NMI context.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NmiRecord {
    /// A sample, as the NMI handler captured it.
    Sample(RawSample),
    /// An event was throttled at this time.
    Throttle(ThrottleEvent),
    /// An event was unthrottled at this time.
    Unthrottle(ThrottleEvent),
}

/// An empty sample: what a never-used ring slot holds before
/// [`Ring::push_with`] fills it.
impl Default for NmiRecord {
    fn default() -> Self {
        Self::EMPTY
    }
}

impl ConstDefault for NmiRecord {
    const EMPTY: Self = NmiRecord::Sample(RawSample::EMPTY);
}

impl NmiRecord {
    /// The raw sample this record holds, turning it into an (empty) sample
    /// record first if it holds something else. With [`Ring::push_with`]
    /// the slot usually holds an older sample already, which is written
    /// over in place.
    #[inline]
    pub fn sample_mut(&mut self) -> &mut RawSample {
        if !matches!(self, NmiRecord::Sample(_)) {
            *self = NmiRecord::Sample(RawSample::EMPTY);
        }
        match self {
            NmiRecord::Sample(s) => s,
            // Set just above.
            NmiRecord::Throttle(_) | NmiRecord::Unthrottle(_) => unreachable!(),
        }
    }

    /// Writes the wire record for this queued record into `out`, expanding
    /// a sample for its event in `events` (by [`RawSample::event_index`];
    /// the first for an index out of range) in place (`out`'s sample, if
    /// it holds one, is reused).
    pub fn write_record(&self, events: &[EventConfig], out: &mut Record) {
        match self {
            NmiRecord::Sample(raw) => {
                if !matches!(out, Record::Sample(_)) {
                    *out = Record::Sample(Sample::default());
                }
                let event = events
                    .get(raw.event_index())
                    .or(events.first())
                    .unwrap_or(&NO_EVENT);
                if let Record::Sample(s) = out {
                    raw.expand_into(event, s);
                }
            }
            NmiRecord::Throttle(t) => *out = Record::Throttle(*t),
            NmiRecord::Unthrottle(t) => *out = Record::Unthrottle(*t),
        }
    }

    /// The wire record for this queued record, by value.
    pub fn to_record(&self, events: &[EventConfig]) -> Record {
        let mut r = Record::Sample(Sample::default());
        self.write_record(events, &mut r);
        r
    }
}

/// What a sample is expanded for when no event is configured.
const NO_EVENT: EventConfig = EventConfig::cpu_clock(0, 1);

/// The events a drain expands samples for, and how ring losses divide
/// among them: the ring counts every sample that found it full, and the
/// NMI side also counts, in `ring_lost[i]`, those of event `i >= 1`
/// (entry 0 is unused: what the others do not claim is the first
/// event's).
#[derive(Clone, Copy, Debug)]
pub struct DrainEvents<'a> {
    /// The events, by index (Hello's order).
    pub configs: &'a [EventConfig],
    /// Ring losses of events 1.. not yet reported.
    pub ring_lost: &'a [AtomicU64],
}

impl<'a> DrainEvents<'a> {
    /// One event, whose are all ring losses.
    pub fn one(config: &'a EventConfig) -> Self {
        DrainEvents {
            configs: core::slice::from_ref(config),
            ring_lost: &[],
        }
    }

    /// Splits `lost` ring losses among the events, calling `f(event id,
    /// count)` for each non-zero share. A per-event count the ring's total
    /// does not cover yet (an NMI between the two reads) stays for the
    /// next call, so every share is exact once the ring is drained.
    pub fn split_lost<E>(
        &self,
        lost: u64,
        mut f: impl FnMut(u32, u64) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut rest = lost;
        for (i, c) in self.configs.iter().enumerate().skip(1) {
            let Some(counter) = self.ring_lost.get(i) else {
                break;
            };
            let n = counter.load(Ordering::Relaxed).min(rest);
            if n > 0 {
                counter.fetch_sub(n, Ordering::Relaxed);
                rest -= n;
                f(c.id, n)?;
            }
        }
        if rest > 0 {
            f(self.configs.first().map_or(0, |c| c.id), rest)?;
        }
        Ok(())
    }
}

/// What one drain step did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainStats {
    /// Frames written (Lost records included). With sample groups a
    /// sample may wait in the encoder's open frame, so this can be fewer
    /// than the records taken.
    pub frames: usize,
    /// Records taken from the ring.
    pub records: usize,
    /// Samples written.
    pub samples: usize,
    /// Losses reported in Lost records.
    pub lost: u64,
}

/// Why a drain step stopped: a record did not fit the frame buffer (it
/// is dropped), or the writer failed (what [`Encoder::put`] says).
pub type DrainError<E> = PutError<E>;

/// One drain step: first Lost records for the losses counted since the
/// previous step (if any; one per event, [`DrainEvents::split_lost`]),
/// then up to `max` queued records, each expanded for its event
/// ([`RawSample::expand_into`]) and written with `write` through
/// [`Encoder::put`] (one frame each, or into the open group frame). The ring's `delivered` count includes records
/// popped here even when writing fails afterwards, so a failing writer
/// should be reported (it is the caller's link, not the ring, that lost
/// them).
#[allow(clippy::too_many_arguments)]
pub fn drain_step<const R: usize, const F: bool, const T: usize, E>(
    ring: &Ring<NmiRecord, R, F>,
    events: DrainEvents<'_>,
    cpu: u32,
    now: u64,
    encoder: &mut Encoder<T>,
    buf: &mut [u8],
    max: usize,
    mut write: impl FnMut(&[u8]) -> Result<(), E>,
) -> Result<DrainStats, DrainError<E>> {
    let mut stats = DrainStats::default();
    let lost = ring.take_lost();
    if lost > 0 {
        events.split_lost(lost, |event, count| {
            let rec = Record::Lost(Lost {
                time: now,
                cpu,
                event,
                count,
                reason: LostReason::RingFull,
            });
            stats.frames += encoder.put(&rec, buf, &mut write)?;
            Ok::<(), DrainError<E>>(())
        })?;
        stats.lost = lost;
    }
    // One scratch record, expanded into in place for every sample.
    let mut rec = Record::Sample(Sample::default());
    for _ in 0..max {
        // Consumed in place: the slot keeps its record for the next
        // `push_with`, so the NMI handler does not re-initialise it.
        if ring
            .pop_with(|item| item.write_record(events.configs, &mut rec))
            .is_none()
        {
            break;
        }
        let is_sample = matches!(rec, Record::Sample(_));
        stats.frames += encoder.put(&rec, buf, &mut write)?;
        stats.records += 1;
        stats.samples += usize::from(is_sample);
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Decoder, EncodeError, EncoderConfig, MAX_FRAME};

    #[test]
    fn losses_become_lost_records_and_everything_is_accounted() {
        let event = EventConfig::cpu_clock(0, 1000);
        let ring: Ring<NmiRecord, 4> = Ring::new();
        let mut enc: Encoder<4> = Encoder::new(EncoderConfig::default());
        let mut buf = [0u8; MAX_FRAME];
        let mut wire = std::vec::Vec::new();
        let mut sent = 0u64;
        for round in 0..10u64 {
            for i in 0..(round % 7) {
                let s = RawSample {
                    tid: 1,
                    time: round * 100 + i,
                    ..RawSample::EMPTY
                };
                ring.push(NmiRecord::Sample(s));
                sent += 1;
            }
            if round == 3 {
                ring.push(NmiRecord::Throttle(ThrottleEvent {
                    time: 1,
                    cpu: 0,
                    event: 0,
                }));
            }
            drain_step(
                &ring,
                DrainEvents::one(&event),
                0,
                round,
                &mut enc,
                &mut buf,
                2,
                |f| {
                    wire.extend_from_slice(f);
                    Ok::<(), ()>(())
                },
            )
            .unwrap();
        }
        // Drain the rest.
        loop {
            let st = drain_step(
                &ring,
                DrainEvents::one(&event),
                0,
                99,
                &mut enc,
                &mut buf,
                100,
                |f| {
                    wire.extend_from_slice(f);
                    Ok::<(), ()>(())
                },
            )
            .unwrap();
            if st.frames == 0 {
                break;
            }
        }
        let mut dec = Decoder::new();
        let (mut samples, mut lost, mut throttles) = (0u64, 0u64, 0);
        dec.push(&wire, |r| match r.unwrap() {
            Record::Sample(_) => samples += 1,
            Record::Lost(l) => lost += l.count,
            Record::Throttle(_) => throttles += 1,
            other => panic!("{other:?}"),
        });
        assert!(lost > 0, "the small ring overflowed");
        assert_eq!(throttles, 1);
        assert_eq!(
            samples + lost,
            sent + 1 - throttles,
            "taken = delivered + lost"
        );
        let st = ring.stats();
        assert_eq!(st.taken, st.delivered + st.lost);
    }

    #[test]
    fn writer_errors_stop_the_step() {
        let event = EventConfig::cpu_clock(0, 1000);
        let ring: Ring<NmiRecord, 4> = Ring::new();
        ring.push(NmiRecord::EMPTY);
        let mut enc: Encoder<4> = Encoder::new(EncoderConfig::default());
        let mut buf = [0u8; MAX_FRAME];
        let r = drain_step(
            &ring,
            DrainEvents::one(&event),
            0,
            0,
            &mut enc,
            &mut buf,
            4,
            |_| Err("link down"),
        );
        assert_eq!(r, Err(DrainError::Write("link down")));
        let mut tiny = [0u8; 4];
        ring.push(NmiRecord::EMPTY);
        let r = drain_step(
            &ring,
            DrainEvents::one(&event),
            0,
            0,
            &mut enc,
            &mut tiny,
            4,
            |_| Ok::<(), ()>(()),
        );
        assert_eq!(r, Err(DrainError::Encode(EncodeError::BufferFull)));
    }

    #[test]
    fn samples_reach_the_wire_expanded_for_the_event() {
        use crate::capture::{RawFrame, raw_flags};
        use crate::event::sample_type as st;
        use crate::regs::{Abi, GPR_MASK, Reg};
        let mut event = EventConfig::cpu_clock(4, 1000);
        event.sample_type |= st::REGS_USER | st::CALLCHAIN;
        event.regs_user = GPR_MASK;
        let ring: crate::ring::FilledRing<NmiRecord, 4> = Ring::new_filled();
        let mut raws = std::vec::Vec::new();
        for i in 0..3u64 {
            let mut raw = RawSample {
                time: 10 + i,
                ip: 0x40_0000 + i,
                tid: 2,
                pid: 2,
                period: 250,
                user_len: 2,
                user: RawFrame {
                    cs: 0x23,
                    rax: i,
                    r8: 5,
                    ..RawFrame::ZERO
                },
                flags: raw_flags::USER_COMPAT,
                ..RawSample::EMPTY
            };
            raw.chain[..2].copy_from_slice(&[0x40_0000 + i, 0x40_1000]);
            assert!(ring.push_with(|r| *r.sample_mut() = raw.clone()));
            raws.push(raw);
        }
        // A throttle record between samples: the scratch sample is rebuilt.
        ring.push(NmiRecord::Throttle(ThrottleEvent {
            time: 20,
            cpu: 0,
            event: 4,
        }));
        let mut enc: Encoder<4> = Encoder::new(EncoderConfig::default());
        let mut buf = [0u8; MAX_FRAME];
        let mut wire = std::vec::Vec::new();
        let st = drain_step(
            &ring,
            DrainEvents::one(&event),
            0,
            0,
            &mut enc,
            &mut buf,
            8,
            |f| {
                wire.extend_from_slice(f);
                Ok::<(), ()>(())
            },
        )
        .unwrap();
        assert_eq!((st.frames, st.samples), (4, 3));
        let mut got = std::vec::Vec::new();
        Decoder::new().push(&wire, |r| got.push(r.unwrap()));
        for (raw, rec) in raws.iter().zip(&got) {
            let Record::Sample(s) = rec else {
                panic!("{rec:?}")
            };
            assert_eq!(s, &raw.expand(&event));
            let u = s.regs_user.as_ref().unwrap();
            assert_eq!(
                (u.abi, u.get(Reg::Ax), u.get(Reg::R8)),
                (Abi::Bits32, Some(raw.user.rax), Some(0))
            );
            assert_eq!(s.event, 4);
            assert_eq!(s.callchain.len(), 3, "marker + 2 IPs");
        }
        assert!(matches!(got[3], Record::Throttle(_)));
    }

    #[test]
    fn samples_of_several_events_are_expanded_for_each_and_losses_split() {
        use crate::capture::raw_flags;
        let mut cycles = EventConfig::hardware(0, 0, 1000);
        cycles.sample_type |= crate::event::sample_type::ADDR;
        let instructions = EventConfig::hardware(1, 1, 2000);
        let configs = [cycles, instructions];
        let ring_lost = [AtomicU64::new(0), AtomicU64::new(0)];
        let events = DrainEvents {
            configs: &configs,
            ring_lost: &ring_lost,
        };
        let ring: crate::ring::FilledRing<NmiRecord, 4> = Ring::new_filled();
        // Two of event 0, two of event 1, then two of event 1 and one of
        // event 0 that find the ring full.
        for (i, ev) in [0u32, 1, 1, 0].into_iter().enumerate() {
            let raw = RawSample {
                time: i as u64,
                ip: 0x40_0000,
                tid: 1,
                flags: ev << raw_flags::EVENT_SHIFT,
                ..RawSample::EMPTY
            };
            assert_eq!(raw.event_index(), ev as usize);
            assert!(ring.push_with(|r| *r.sample_mut() = raw.clone()));
        }
        for ev in [1u32, 1, 0] {
            assert!(!ring.push_with(|r| r.sample_mut().flags = ev << raw_flags::EVENT_SHIFT));
            if ev != 0 {
                ring_lost[ev as usize].fetch_add(1, Ordering::Relaxed);
            }
        }
        let mut enc: Encoder<4> = Encoder::new(EncoderConfig::default());
        let mut buf = [0u8; MAX_FRAME];
        let mut wire = std::vec::Vec::new();
        let st = drain_step(&ring, events, 0, 9, &mut enc, &mut buf, 8, |f| {
            wire.extend_from_slice(f);
            Ok::<(), ()>(())
        })
        .unwrap();
        assert_eq!((st.frames, st.samples, st.lost), (6, 4, 3));
        let mut got = std::vec::Vec::new();
        Decoder::new().push(&wire, |r| got.push(r.unwrap()));
        let lost: std::vec::Vec<(u32, u64)> = got
            .iter()
            .filter_map(|r| match r {
                Record::Lost(l) => Some((l.event, l.count)),
                _ => None,
            })
            .collect();
        assert_eq!(lost, [(1, 2), (0, 1)], "each event's ring losses");
        assert_eq!(ring_lost[1].load(Ordering::Relaxed), 0);
        let samples: std::vec::Vec<(u32, u64)> = got
            .iter()
            .filter_map(|r| match r {
                Record::Sample(s) => Some((s.event, s.period)),
                _ => None,
            })
            .collect();
        assert_eq!(
            samples.iter().map(|s| s.0).collect::<std::vec::Vec<_>>(),
            [0, 1, 1, 0]
        );
        // A count the ring's total does not cover yet waits for it.
        ring_lost[1].store(2, Ordering::Relaxed);
        let mut shares = std::vec::Vec::new();
        events
            .split_lost(1, |e, n| {
                shares.push((e, n));
                Ok::<(), ()>(())
            })
            .unwrap();
        assert_eq!(shares, [(1, 1)]);
        assert_eq!(ring_lost[1].load(Ordering::Relaxed), 1);
    }
}
