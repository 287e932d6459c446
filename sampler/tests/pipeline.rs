//! The whole path on the host, the way the runtime wires it: throttle ->
//! capture into a ring slot (NMI side), drain_step -> expansion -> frames
//! (drain side), Decoder (host side). Checks that every record the NMI side queued is
//! either decoded unchanged or counted in a Lost record, and that the End
//! counters add up (taken = delivered + lost).

mod common;

use common::Rng;
use sampler::capture::{InterruptFrame, SampleInput, UserFrame, build_sample, capture};
use sampler::drain::{DrainEvents, NmiRecord, drain_step};
use sampler::event::{EventConfig, sample_type as st};
use sampler::regs::{CodeMode, GPR_MASK, Reg, RegFile};
use sampler::ring::{FilledRing, Ring};
use sampler::throttle::{OverflowAction, Throttle, ThrottleConfig};
use sampler::wire::{Decoder, Encoder, EncoderConfig, End, MAX_FRAME, Record, ThrottleEvent};

#[test]
fn nmi_to_decoder_accounts_for_every_sample() {
    let mut event = EventConfig::cpu_clock(1, 4000);
    event.sample_type |= st::REGS_USER | st::REGS_INTR;
    event.regs_user = GPR_MASK;
    event.regs_intr = GPR_MASK;
    let ring: FilledRing<NmiRecord, 64> = Ring::new_filled();
    ring.set_capacity(16).unwrap(); // as `ring=16` would
    let throttle = Throttle::new(ThrottleConfig {
        max_sample_rate: 20_000,
        tick_hz: 1000,
        ..Default::default()
    });
    let ev_throttle = sampler::throttle::EventThrottle::new();
    let mut enc: Encoder<16> = Encoder::new(EncoderConfig::default());
    let mut buf = [0u8; MAX_FRAME];
    let mut wire = vec![0u8];
    let mut queued = Vec::new(); // what the NMI side managed to queue
    let mut rng = Rng(42);
    let mut time = 0u64;
    let mut user = [RegFile::default(); 3];
    for (t, f) in user.iter_mut().enumerate() {
        for (i, v) in f.0.iter_mut().enumerate() {
            *v = 0x7fff_0000_0000 + (t as u64) * 0x1000 + i as u64;
        }
        f.set(Reg::Cs, if t == 2 { 0x23 } else { 0x2b });
    }
    let mut drain =
        |ring: &FilledRing<NmiRecord, 64>, enc: &mut Encoder<16>, wire: &mut Vec<u8>, time, max| {
            drain_step(
                ring,
                DrainEvents::one(&event),
                0,
                time,
                enc,
                &mut buf,
                max,
                |f| {
                    wire.extend_from_slice(f);
                    Ok::<(), ()>(())
                },
            )
            .unwrap()
        };
    for n in 0..20_000u64 {
        time += 20_000 + rng.below(10_000); // ~35k overflows/s
        if n % 30 == 0 && throttle.on_tick(&ev_throttle) {
            let t = ThrottleEvent {
                time,
                cpu: 0,
                event: 1,
            };
            if ring.push(NmiRecord::Unthrottle(t)) {
                queued.push(Record::Unthrottle(t));
            }
        }
        let action = throttle.on_overflow(&ev_throttle);
        if action == OverflowAction::Suppressed {
            continue;
        }
        // The Throttle record first, then the overflow's sample (perf's order).
        if action == OverflowAction::SampleThenThrottle {
            let t = ThrottleEvent {
                time,
                cpu: 0,
                event: 1,
            };
            if ring.push(NmiRecord::Throttle(t)) {
                queued.push(Record::Throttle(t));
            }
        }
        let t = rng.below(3) as usize;
        let in_user = rng.below(4) != 0;
        let mut nmi = user[t];
        nmi.set(Reg::Ip, 0x40_1000 + rng.below(0x100));
        nmi.set(Reg::Ax, rng.next());
        if !in_user {
            nmi.set(Reg::Cs, 0x08);
            nmi.set(Reg::Ip, 0x20_0000 + rng.below(0x100));
        }
        let code = if t == 2 && in_user {
            CodeMode::Compat32
        } else {
            CodeMode::Long64
        };
        let frame = InterruptFrame { regs: nmi, code };
        let saved = InterruptFrame {
            regs: user[t],
            code: if t == 2 {
                CodeMode::Compat32
            } else {
                CodeMode::Long64
            },
        };
        let uf = if rng.below(10) == 0 {
            UserFrame::InWindow
        } else {
            UserFrame::Complete(&saved)
        };
        let input = SampleInput::new(&event, &frame, uf, time, 0, t as u32 + 1, 250_000);
        let sample = build_sample(&input).expect("nothing excluded");
        // In place, as the NMI handler does; the drain expands it.
        if ring.push_with(|rec| assert!(capture(&input, rec.sample_mut()))) {
            queued.push(Record::Sample(sample));
        }
        throttle.sample_took(|| 1_000);
        if n % 7 == 0 {
            drain(&ring, &mut enc, &mut wire, time, 1 + rng.below(12) as usize);
        }
    }
    while drain(&ring, &mut enc, &mut wire, time, 64).frames > 0 {}
    let stats = ring.stats();
    let end = End {
        time,
        taken: stats.taken,
        delivered: stats.delivered,
        lost: stats.lost,
        throttled: throttle.throttle_count(),
        frames: enc.frames(),
        unknown_syscalls: heapless::Vec::new(),
    };
    let n = enc.encode(&Record::End(end), &mut buf).unwrap();
    wire.extend_from_slice(&buf[..n]);

    let mut dec = Decoder::new();
    let mut got = Vec::new();
    let mut lost = 0;
    let mut got_end = None;
    dec.push(&wire, |r| match r.unwrap() {
        r @ (Record::Sample(_) | Record::Throttle(_) | Record::Unthrottle(_)) => got.push(r),
        Record::Lost(l) => lost += l.count,
        Record::End(e) => got_end = Some(e),
        other => panic!("{other:?}"),
    });
    let end = got_end.expect("End decoded");
    println!(
        "taken {} delivered {} lost {} throttled {} frames {} bytes {}",
        end.taken,
        end.delivered,
        end.lost,
        end.throttled,
        end.frames,
        wire.len()
    );
    assert!(
        got == queued,
        "everything queued arrives unchanged and in order"
    );
    assert_eq!(lost, end.lost, "Lost records carry every loss");
    assert_eq!(
        end.taken,
        end.delivered + end.lost,
        "taken = delivered + lost"
    );
    assert_eq!(end.delivered, queued.len() as u64);
    assert!(end.lost > 0, "the capped ring overflowed");
    assert!(end.throttled > 0, "the per-tick limit was hit");
    assert!(got.iter().any(|r| matches!(r, Record::Unthrottle(_))));
    assert_eq!(dec.stats().bad_frames, 0);
}
