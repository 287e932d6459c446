//! The drain side of the ring (never NMI context): what the NMI handler
//! queues ([`NmiRecord`]), and one drain step that turns ring losses into
//! Lost records and queued records into wire frames.

use crate::ring::Ring;
use crate::sample::Sample;
use crate::wire::{EncodeError, Encoder, Lost, LostReason, Record, ThrottleEvent};

/// What the NMI handler (and the tick, for Unthrottle) pushes into a ring,
/// so samples and throttle transitions reach the wire in order.
// Samples dominate the ring; boxing is impossible in NMI context.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NmiRecord {
    /// A sample.
    Sample(Sample),
    /// An event was throttled at this time.
    Throttle(ThrottleEvent),
    /// An event was unthrottled at this time.
    Unthrottle(ThrottleEvent),
}

/// An empty sample: what a never-used ring slot holds before
/// [`Ring::push_with`] fills it.
impl Default for NmiRecord {
    fn default() -> Self {
        NmiRecord::Sample(Sample::default())
    }
}

impl NmiRecord {
    /// The sample this record holds, turning it into an (empty) sample
    /// record first if it holds something else. With [`Ring::push_with`]
    /// the slot usually holds an older sample already, which is reused in
    /// place: pass the result to [`crate::capture::build_sample_into`].
    pub fn sample_mut(&mut self) -> &mut Sample {
        if !matches!(self, NmiRecord::Sample(_)) {
            *self = NmiRecord::Sample(Sample::default());
        }
        match self {
            NmiRecord::Sample(s) => s,
            // Set just above.
            NmiRecord::Throttle(_) | NmiRecord::Unthrottle(_) => unreachable!(),
        }
    }

    /// The wire record for this queued record (the sample is copied, so
    /// the ring slot keeps it for reuse).
    pub fn to_record(&self) -> Record {
        match self {
            NmiRecord::Sample(s) => Record::Sample(s.clone()),
            NmiRecord::Throttle(t) => Record::Throttle(*t),
            NmiRecord::Unthrottle(t) => Record::Unthrottle(*t),
        }
    }
}

impl From<NmiRecord> for Record {
    fn from(r: NmiRecord) -> Record {
        match r {
            NmiRecord::Sample(s) => Record::Sample(s),
            NmiRecord::Throttle(t) => Record::Throttle(t),
            NmiRecord::Unthrottle(t) => Record::Unthrottle(t),
        }
    }
}

/// What one drain step did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainStats {
    /// Records written (Lost records included).
    pub frames: usize,
    /// Samples written.
    pub samples: usize,
    /// Losses reported in Lost records.
    pub lost: u64,
}

/// Why a drain step stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainError<E> {
    /// A record did not fit the frame buffer (it is dropped).
    Encode(EncodeError),
    /// The writer failed.
    Write(E),
}

/// One drain step: first a Lost record for the losses counted since the
/// previous step (if any), then up to `max` queued records, each written
/// with `write` as one frame. The ring's `delivered` count includes records
/// popped here even when writing fails afterwards, so a failing writer
/// should be reported (it is the caller's link, not the ring, that lost
/// them).
#[allow(clippy::too_many_arguments)]
pub fn drain_step<const R: usize, const T: usize, E>(
    ring: &Ring<NmiRecord, R>,
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
        let rec = Record::Lost(Lost {
            time: now,
            cpu,
            event: 0,
            count: lost,
            reason: LostReason::RingFull,
        });
        let n = encoder.encode(&rec, buf).map_err(DrainError::Encode)?;
        write(&buf[..n]).map_err(DrainError::Write)?;
        stats.frames += 1;
        stats.lost = lost;
    }
    for _ in 0..max {
        // Consumed in place: the slot keeps its sample for the next
        // `push_with`, so the NMI handler does not re-initialise it.
        let Some(rec) = ring.pop_with(|item| item.to_record()) else {
            break;
        };
        let is_sample = matches!(rec, Record::Sample(_));
        let n = encoder.encode(&rec, buf).map_err(DrainError::Encode)?;
        write(&buf[..n]).map_err(DrainError::Write)?;
        stats.frames += 1;
        stats.samples += usize::from(is_sample);
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Decoder, EncoderConfig, MAX_FRAME};

    #[test]
    fn losses_become_lost_records_and_everything_is_accounted() {
        let ring: Ring<NmiRecord, 4> = Ring::new();
        let mut enc: Encoder<4> = Encoder::new(EncoderConfig::default());
        let mut buf = [0u8; MAX_FRAME];
        let mut wire = std::vec::Vec::new();
        let mut sent = 0u64;
        for round in 0..10u64 {
            for i in 0..(round % 7) {
                let s = Sample {
                    tid: 1,
                    time: round * 100 + i,
                    ..Default::default()
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
            drain_step(&ring, 0, round, &mut enc, &mut buf, 2, |f| {
                wire.extend_from_slice(f);
                Ok::<(), ()>(())
            })
            .unwrap();
        }
        // Drain the rest.
        loop {
            let st = drain_step(&ring, 0, 99, &mut enc, &mut buf, 100, |f| {
                wire.extend_from_slice(f);
                Ok::<(), ()>(())
            })
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
        let ring: Ring<NmiRecord, 4> = Ring::new();
        ring.push(NmiRecord::Sample(Sample::default()));
        let mut enc: Encoder<4> = Encoder::new(EncoderConfig::default());
        let mut buf = [0u8; MAX_FRAME];
        let r = drain_step(&ring, 0, 0, &mut enc, &mut buf, 4, |_| Err("link down"));
        assert_eq!(r, Err(DrainError::Write("link down")));
        let mut tiny = [0u8; 4];
        ring.push(NmiRecord::Sample(Sample::default()));
        let r = drain_step(&ring, 0, 0, &mut enc, &mut tiny, 4, |_| Ok::<(), ()>(()));
        assert_eq!(r, Err(DrainError::Encode(EncodeError::BufferFull)));
    }
}
