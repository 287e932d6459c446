//! Tests of the user-register rules, sample building and the
//! return-to-user mode.

use super::*;
use crate::event::sample_type as st;
use crate::regs::{Abi, GPR_MASK, R8_R15_MASK, SEGMENT_MASK};

const USER_CS64: u64 = 0x2b;
const USER_CS32: u64 = 0x23;
const KERNEL_CS: u64 = 0x08;

/// A frame whose every register holds a distinct recognisable value.
fn frame(tag: u64, cs: u64, code: CodeMode) -> InterruptFrame {
    let mut regs = RegFile::default();
    for (i, v) in regs.0.iter_mut().enumerate() {
        *v = tag << 32 | i as u64;
    }
    regs.set(Reg::Cs, cs);
    InterruptFrame { regs, code }
}

fn event(mode: UserRegsMode) -> EventConfig {
    let mut e = EventConfig::cpu_clock(3, 4000);
    e.sample_type |= st::REGS_USER | st::REGS_INTR | st::CALLCHAIN;
    e.regs_user = GPR_MASK;
    e.regs_intr = GPR_MASK;
    e.user_regs_mode = mode;
    e
}

fn assert_regs_from(r: &RegsSample, f: &InterruptFrame, abi: Abi) {
    assert_eq!(r.abi, abi);
    assert_eq!(r.mask, GPR_MASK);
    assert_eq!(r.values.len(), 20, "never dropped from under the mask");
    for reg in crate::regs::ALL_REGS {
        if reg.bit() & SEGMENT_MASK != 0 {
            continue;
        }
        let expected = if abi == Abi::Bits32 && reg.bit() & R8_R15_MASK != 0 {
            0
        } else {
            f.regs.get(reg)
        };
        assert_eq!(r.get(reg), Some(expected), "{}", reg.name());
    }
}

#[test]
fn user_mode_interrupt_uses_the_interrupt_frame() {
    let e = event(UserRegsMode::AtInterrupt);
    let nmi = frame(1, USER_CS64, CodeMode::Long64);
    let saved = frame(2, USER_CS64, CodeMode::Long64);
    let s = build_sample(&SampleInput::new(
        &e,
        &nmi,
        UserFrame::Complete(&saved),
        10,
        1,
        7,
        100,
    ))
    .unwrap();
    assert_eq!(s.cpumode, CpuMode::User);
    assert_eq!(s.ip, nmi.regs.get(Reg::Ip));
    assert_eq!(
        (s.event, s.time, s.cpu, s.tid, s.pid, s.period),
        (3, 10, 1, 7, 7, 100)
    );
    assert_regs_from(s.regs_user.as_ref().unwrap(), &nmi, Abi::Bits64);
    assert_regs_from(s.regs_intr.as_ref().unwrap(), &nmi, Abi::Bits64);
}

#[test]
fn compat_task_gives_abi_32_and_zero_r8_to_r15() {
    let e = event(UserRegsMode::AtInterrupt);
    let nmi = frame(1, USER_CS32, CodeMode::Compat32);
    let s = build_sample(&SampleInput::new(&e, &nmi, UserFrame::NoTask, 0, 0, 1, 1)).unwrap();
    assert_regs_from(s.regs_user.as_ref().unwrap(), &nmi, Abi::Bits32);
    // From the saved frame too.
    let k = frame(9, KERNEL_CS, CodeMode::Long64);
    let s = build_sample(&SampleInput::new(
        &e,
        &k,
        UserFrame::Complete(&nmi),
        0,
        0,
        1,
        1,
    ))
    .unwrap();
    assert_regs_from(s.regs_user.as_ref().unwrap(), &nmi, Abi::Bits32);
}

#[test]
fn runtime_interrupt_uses_the_complete_saved_frame_exactly() {
    let e = event(UserRegsMode::AtInterrupt);
    let k = frame(9, KERNEL_CS, CodeMode::Long64);
    let saved = frame(2, USER_CS64, CodeMode::Long64);
    let s = build_sample(&SampleInput::new(
        &e,
        &k,
        UserFrame::Complete(&saved),
        0,
        0,
        1,
        1,
    ))
    .unwrap();
    assert_eq!(s.cpumode, CpuMode::Kernel);
    let u = s.regs_user.as_ref().unwrap();
    assert_regs_from(u, &saved, Abi::Bits64);
    // Linux reports these as -1 from an NMI; ours are exact.
    for reg in [Reg::Bx, Reg::R12, Reg::R13, Reg::R14, Reg::R15] {
        assert_eq!(u.get(reg), Some(saved.regs.get(reg)));
        assert_ne!(u.get(reg), Some(u64::MAX));
    }
    // REGS_INTR is the interrupted (runtime) frame.
    assert_regs_from(s.regs_intr.as_ref().unwrap(), &k, Abi::Bits64);
}

#[test]
fn incomplete_frames_give_abi_none_and_no_values() {
    let e = event(UserRegsMode::AtInterrupt);
    let k = frame(9, KERNEL_CS, CodeMode::Long64);
    let not_user = frame(3, KERNEL_CS, CodeMode::Long64);
    for uf in [
        UserFrame::InWindow,
        UserFrame::NoTask,
        UserFrame::Complete(&not_user),
    ] {
        let s = build_sample(&SampleInput::new(&e, &k, uf, 0, 0, 1, 1)).unwrap();
        let u = s.regs_user.unwrap();
        assert_eq!(u.abi, Abi::None, "{uf:?}");
        assert!(u.values.is_empty(), "{uf:?}");
        assert_eq!(u.mask, GPR_MASK);
    }
}

#[test]
fn exclusions_filter_by_interrupted_mode() {
    let mut e = event(UserRegsMode::AtInterrupt);
    let u = frame(1, USER_CS64, CodeMode::Long64);
    let k = frame(2, KERNEL_CS, CodeMode::Long64);
    e.exclude_kernel = true;
    assert!(build_sample(&SampleInput::new(&e, &k, UserFrame::NoTask, 0, 0, 1, 1)).is_none());
    assert!(build_sample(&SampleInput::new(&e, &u, UserFrame::NoTask, 0, 0, 1, 1)).is_some());
    e.exclude_kernel = false;
    e.exclude_user = true;
    assert!(build_sample(&SampleInput::new(&e, &u, UserFrame::NoTask, 0, 0, 1, 1)).is_none());
    assert!(build_sample(&SampleInput::new(&e, &k, UserFrame::NoTask, 0, 0, 1, 1)).is_some());
}

#[test]
fn only_requested_fields_are_filled() {
    let e = EventConfig::cpu_clock(0, 1000);
    let u = frame(1, USER_CS64, CodeMode::Long64);
    let chain = [1, 2, 3];
    let mut input = SampleInput::new(&e, &u, UserFrame::NoTask, 0, 0, 1, 1);
    input.chain_user = &chain;
    input.mem = Some(MemInfo {
        addr: 5,
        ..Default::default()
    });
    let s = build_sample(&input).unwrap();
    assert!(
        s.regs_user.is_none() && s.regs_intr.is_none() && s.branches.is_none() && s.mem.is_none()
    );
    assert!(s.callchain.is_empty());
}

#[test]
fn callchain_respects_max_stack_and_markers() {
    let e = event(UserRegsMode::AtInterrupt);
    let kernel = [0xffff_8000_0000_1000, 0xffff_8000_0000_2000];
    let user = [0x40_1000, 0x40_2000];
    let mut b = CallchainBuilder::new();
    b.push(CpuMode::Kernel, kernel[0]);
    b.push(CpuMode::Kernel, kernel[1]);
    b.push(CpuMode::User, user[0]);
    b.push(CpuMode::User, user[1]);
    assert_eq!(
        b.as_slice(),
        &[
            PERF_CONTEXT_KERNEL,
            kernel[0],
            kernel[1],
            PERF_CONTEXT_USER,
            user[0],
            user[1]
        ]
    );
    let k = frame(2, KERNEL_CS, CodeMode::Long64);
    let mut input = SampleInput::new(&e, &k, UserFrame::NoTask, 0, 0, 1, 1);
    input.chain_kernel = &kernel;
    input.chain_user = &user;
    // The expansion inserts the markers.
    let s = build_sample(&input).unwrap();
    assert_eq!(&s.callchain[..], b.as_slice());
    // Capped at max_stack, never ending in a marker.
    for (max, len) in [(3, 3), (4, 3), (5, 5), (0, 0), (1, 0)] {
        let mut capped = e;
        capped.max_stack = max;
        let mut input = input;
        input.event = &capped;
        let s = build_sample(&input).unwrap();
        assert_eq!(&s.callchain[..], &b.as_slice()[..len], "max_stack {max}");
    }
    // User IPs alone get one user marker.
    input.chain_kernel = &[];
    let s = build_sample(&input).unwrap();
    assert_eq!(&s.callchain[..], &[PERF_CONTEXT_USER, user[0], user[1]]);
    let mut full = CallchainBuilder::new();
    for i in 0..100 {
        full.push(CpuMode::User, i);
    }
    assert!(full.truncated());
    assert_eq!(full.as_slice().len(), MAX_CALLCHAIN);
}

#[test]
fn callchains_end_at_a_return_address_no_code_can_have() {
    let e = event(UserRegsMode::AtInterrupt);
    let k = frame(2, KERNEL_CS, CodeMode::Long64);
    let mut input = SampleInput::new(&e, &k, UserFrame::NoTask, 0, 0, 1, 1);
    // A compat program's start-up frame gave argc (3) as a return address.
    let kernel = [0xffff_ffff_8010_0000, 0xffff_ffff_8010_2000, 0x7fff_0000];
    let user = [0x40_1000, 0x40_2000, 3, 0x40_3000];
    input.chain_kernel = &kernel;
    input.chain_user = &user;
    let s = build_sample(&input).unwrap();
    assert_eq!(
        &s.callchain[..],
        &[
            PERF_CONTEXT_KERNEL,
            kernel[0],
            kernel[1],
            PERF_CONTEXT_USER,
            user[0],
            user[1]
        ]
    );
    // The edges: the lowest user code address and the last one are kept,
    // the first interrupted IP is kept whatever it is.
    for (ret, kept) in [
        (USER_CODE.start, true),
        (USER_CODE.start - 1, false),
        (USER_CODE.end - 1, true),
        (USER_CODE.end, false),
        (0, false),
        (KERNEL_CODE_START, false),
    ] {
        let user = [5, ret, 0x40_3000];
        let mut input = SampleInput::new(&e, &k, UserFrame::NoTask, 0, 0, 1, 1);
        input.chain_user = &user;
        let s = build_sample(&input).unwrap();
        let want: &[u64] = if kept {
            &[PERF_CONTEXT_USER, 5, ret, 0x40_3000]
        } else {
            &[PERF_CONTEXT_USER, 5]
        };
        assert_eq!(&s.callchain[..], want, "{ret:#x}");
    }
}

#[test]
fn pebs_fields_override_the_interrupt_frame() {
    let mut e = event(UserRegsMode::AtInterrupt);
    e.sample_type |= st::WEIGHT_STRUCT | st::ADDR;
    let u = frame(1, USER_CS64, CodeMode::Long64);
    let pebs = frame(5, USER_CS64, CodeMode::Long64).regs;
    let mut input = SampleInput::new(&e, &u, UserFrame::NoTask, 0, 0, 1, 1);
    input.pebs_regs = Some(&pebs);
    input.precise_ip = Some(0x1234);
    input.mem = Some(MemInfo {
        addr: 0xdead,
        weight: 40,
        ins_lat: 3,
        data_src: 0x42,
    });
    let s = build_sample(&input).unwrap();
    assert_eq!(s.ip, 0x1234);
    assert_eq!(
        s.regs_intr.as_ref().unwrap().get(Reg::Ax),
        Some(pebs.get(Reg::Ax))
    );
    assert_eq!(
        s.regs_user.as_ref().unwrap().get(Reg::R15),
        Some(pebs.get(Reg::R15))
    );
    assert_eq!(s.mem.unwrap().addr, 0xdead);
}

/// A raw record of an NMI that interrupted the runtime, for task `tid`,
/// written the way the NMI handler writes it in return-to-user mode (no
/// user frame).
fn kernel_record(tid: u32, k: &InterruptFrame) -> impl FnMut(&mut RawSample) + '_ {
    move |r: &mut RawSample| {
        r.time = 5;
        r.ip = k.regs.get(Reg::Ip);
        (r.pid, r.tid, r.cpu, r.period) = (tid, tid, 0, 1);
        r.flags = raw_flags::KERNEL;
        r.intr = RawFrame::from_regfile(&k.regs);
        r.kernel_len = 0;
        r.user_len = 0;
    }
}

fn pop_samples<const N: usize, const F: bool>(
    ring: &Ring<NmiRecord, N, F>,
    e: &EventConfig,
) -> std::vec::Vec<Sample> {
    let mut out = std::vec::Vec::new();
    while let Some(s) = ring.pop_with(|rec| match rec {
        NmiRecord::Sample(raw) => raw.expand(e),
        other => panic!("{other:?}"),
    }) {
        out.push(s);
    }
    out
}

#[test]
fn return_to_user_mode_completes_parked_samples() {
    let e = event(UserRegsMode::AtReturnToUser);
    let store: DeferredUserRegs<2> = DeferredUserRegs::new();
    let ring: Ring<NmiRecord, 8> = Ring::new();
    let k = frame(9, KERNEL_CS, CodeMode::Long64);
    assert!(needs_deferred_regs(&e, true));
    assert!(
        !needs_deferred_regs(&e, false),
        "user-mode NMIs are complete"
    );
    assert!(!needs_deferred_regs(
        &event(UserRegsMode::AtInterrupt),
        true
    ));

    // Two NMIs in the runtime while task 1 runs a system call are parked;
    // the store is full at the third, which the caller queues at once.
    assert!(store.park_with(&mut kernel_record(1, &k)));
    assert!(store.park_with(&mut kernel_record(1, &k)));
    assert!(
        !store.park_with(&mut kernel_record(1, &k)),
        "store of 2 is full"
    );
    assert_eq!(store.len(), 2);
    assert!(ring.is_empty(), "parked samples are not in the ring yet");

    // Task 1 returns with `ret`: both get exactly its registers.
    let ret = frame(4, USER_CS64, CodeMode::Long64);
    store.enter_exit_window();
    assert_eq!(
        store.complete(1, &RawFrame::from_regfile(&ret.regs), false, &ring),
        2
    );
    let out = pop_samples(&ring, &e);
    assert_eq!(out.len(), 2);
    for s in &out {
        assert_eq!(s.cpumode, CpuMode::Kernel);
        assert_regs_from(s.regs_user.as_ref().unwrap(), &ret, Abi::Bits64);
        assert_regs_from(s.regs_intr.as_ref().unwrap(), &k, Abi::Bits64);
    }

    // An NMI inside the exit window is not parked: the caller queues it
    // with ABI_NONE right away.
    assert!(!store.park_with(&mut |_| panic!("not called in the window")));
    assert_eq!(store.complete(1, &RawFrame::ZERO, false, &ring), 0);
    store.leave_exit_window();

    // A compat task's return gives ABI_32 with R8-R15 reading 0.
    let ret32 = frame(6, USER_CS32, CodeMode::Compat32);
    assert!(store.park_with(&mut kernel_record(2, &k)));
    store.enter_exit_window();
    store.complete(2, &RawFrame::from_regfile(&ret32.regs), true, &ring);
    store.leave_exit_window();
    let out = pop_samples(&ring, &e);
    assert_regs_from(out[0].regs_user.as_ref().unwrap(), &ret32, Abi::Bits32);

    // Another task's return never lends its registers: thread 1 blocked
    // in its system call while thread 3 ran and returned; thread 1's
    // samples wait for its own return, in order, with what was parked
    // after the switch.
    let mut k1 = kernel_record(1, &k);
    let mut k3 = kernel_record(3, &k);
    assert!(store.park_with(&mut k1));
    assert!(store.park_with(&mut k3));
    store.enter_exit_window();
    assert_eq!(
        store.complete(3, &RawFrame::from_regfile(&ret32.regs), true, &ring),
        1
    );
    store.leave_exit_window();
    assert_eq!(store.len(), 1, "thread 1's sample is still parked");
    let out = pop_samples(&ring, &e);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].tid, 3);
    assert!(store.park_with(&mut k1), "room again after the switch");
    store.enter_exit_window();
    assert_eq!(
        store.complete(1, &RawFrame::from_regfile(&ret.regs), false, &ring),
        2
    );
    store.leave_exit_window();
    let out = pop_samples(&ring, &e);
    assert_eq!(out.len(), 2);
    for s in &out {
        assert_eq!(s.tid, 1);
        assert_regs_from(s.regs_user.as_ref().unwrap(), &ret, Abi::Bits64);
    }

    // A thread that ended never returns: its samples go without registers,
    // the others stay.
    assert!(store.park_with(&mut kernel_record(5, &k)));
    assert!(store.park_with(&mut kernel_record(1, &k)));
    store.enter_exit_window();
    assert_eq!(store.release(5, &ring), 1);
    store.leave_exit_window();
    let out = pop_samples(&ring, &e);
    let u = out[0].regs_user.as_ref().unwrap();
    assert_eq!((out[0].tid, u.abi, u.values.len()), (5, Abi::None, 0));

    // At the end of the run parked samples go to the ring without registers.
    assert_eq!(store.abandon(&ring), 1);
    let out = pop_samples(&ring, &e);
    assert_eq!(out[0].regs_user.as_ref().unwrap().abi, Abi::None);
    assert!(store.is_empty());

    // A full ring counts the completed sample as lost: nothing vanishes.
    let tiny: Ring<NmiRecord, 1> = Ring::new();
    assert!(tiny.push(NmiRecord::default()));
    assert!(store.park_with(&mut kernel_record(1, &k)));
    assert_eq!(
        store.complete(1, &RawFrame::from_regfile(&ret.regs), false, &tiny),
        1
    );
    assert_eq!(tiny.take_lost(), 1);

    // In interrupt mode a RETURN_USER record is never taken for one.
    let mut raw = RawSample::EMPTY;
    kernel_record(1, &k)(&mut raw);
    raw.user = RawFrame::from_regfile(&ret.regs);
    raw.flags |= raw_flags::RETURN_USER;
    let s = raw.expand(&event(UserRegsMode::AtInterrupt));
    assert_eq!(s.regs_user.as_ref().unwrap().abi, Abi::None);
}

mod in_place {
    use super::*;
    use crate::regs::{VALID_MASK_WITH_XMM, XMM_MASK};
    use crate::sample::{BranchEntry, MemInfo};
    use proptest::prelude::*;

    /// A sample with every field set to something a new sample must not
    /// keep: what a reused ring slot holds.
    fn dirty() -> Sample {
        let mut regs = RegsSample::from_file(
            &frame(7, USER_CS64, CodeMode::Long64).regs,
            GPR_MASK | XMM_MASK,
            CodeMode::Long64,
        );
        regs.abi = Abi::Bits32;
        let mut branches = BranchStack {
            hw_idx: 99,
            ..Default::default()
        };
        for i in 0..32 {
            branches
                .entries
                .push(BranchEntry {
                    from: i,
                    to: i + 1,
                    ..Default::default()
                })
                .unwrap();
        }
        Sample {
            event: 77,
            cpumode: CpuMode::Kernel,
            ip: 1,
            pid: 2,
            tid: 3,
            time: 4,
            cpu: 5,
            period: 6,
            callchain: (0..MAX_CALLCHAIN as u64).collect(),
            branches: Some(branches),
            regs_user: Some(regs.clone()),
            regs_intr: Some(regs),
            mem: Some(MemInfo {
                addr: 1,
                weight: 2,
                ins_lat: 3,
                data_src: 4,
            }),
        }
    }

    fn any_file() -> impl Strategy<Value = RegFile> {
        proptest::array::uniform24(any::<u64>()).prop_map(RegFile)
    }

    fn any_code() -> impl Strategy<Value = CodeMode> {
        prop_oneof![Just(CodeMode::Long64), Just(CodeMode::Compat32)]
    }

    proptest! {
        /// The fast path for the default mask gives the same values.
        #[test]
        fn fill_regs_with_the_default_mask_matches_from_file(file in any_file(), code in any_code(), prior in any::<u64>()) {
            let mut out = RegsSample::from_file(&file, prior, CodeMode::Long64);
            fill_regs(&mut out, &file, GPR_MASK, code);
            prop_assert_eq!(&out, &RegsSample::from_file(&file, GPR_MASK, code));
        }
    }

    proptest! {
        /// In-place register filling gives exactly `RegsSample::from_file`,
        /// for any mask (reserved bits and all), mode and prior content.
        #[test]
        fn fill_regs_matches_from_file(file in any_file(), mask in any::<u64>(), code in any_code(), prior in any::<u64>()) {
            let mut out = RegsSample::from_file(&file, prior, CodeMode::Long64);
            fill_regs(&mut out, &file, mask, code);
            prop_assert_eq!(&out, &RegsSample::from_file(&file, mask, code));
            prop_assert_eq!(out.values.len(), (mask & VALID_MASK_WITH_XMM).count_ones() as usize);
        }

        /// Filling straight from a frame gives what filling from its
        /// register file gives, for the common set and any other mask.
        #[test]
        fn frame_fill_regs_matches_the_register_file(
            file in any_file(),
            mask in prop_oneof![Just(GPR_MASK), Just(GPR_MASK | 0xf000), any::<u64>()],
            code in any_code(),
            prior in any::<u64>(),
        ) {
            let frame = RawFrame::from_regfile(&file);
            let mut out = RegsSample::from_file(&file, prior, CodeMode::Long64);
            frame.fill_regs(&mut out, mask, code);
            let mut want = RegsSample::default();
            fill_regs(&mut want, &frame.to_regfile(), mask, code);
            prop_assert_eq!(out, want);
        }

        /// Building into a slot that holds an older, fully populated sample
        /// gives the same sample as building from scratch, for every
        /// sample_type combination, mode, user-frame state and exclusion.
        #[test]
        fn building_in_place_over_an_old_sample_equals_building_fresh(
            bits in any::<u8>(),
            at_return in any::<bool>(),
            cs in prop_oneof![Just(USER_CS64), Just(USER_CS32), Just(KERNEL_CS)],
            saved_state in 0u8..3,
            chain_len in 0usize..=MAX_CALLCHAIN,
            split in 0usize..=MAX_CALLCHAIN,
            max_stack in 0u16..80,
            with_inputs in any::<bool>(),
            mask in any::<u64>(),
        ) {
            let mut e = EventConfig::cpu_clock(9, 4000);
            for (i, bit) in [st::CALLCHAIN, st::BRANCH_STACK, st::REGS_USER, st::REGS_INTR, st::WEIGHT, st::ADDR].into_iter().enumerate() {
                if bits & (1 << i) != 0 {
                    e.sample_type |= bit;
                }
            }
            e.exclude_user = bits & 0x40 != 0;
            e.exclude_kernel = bits & 0x80 != 0;
            e.regs_user = mask;
            e.regs_intr = mask.rotate_left(7);
            e.max_stack = max_stack;
            if at_return {
                e.user_regs_mode = UserRegsMode::AtReturnToUser;
            }
            let code = if cs == USER_CS32 { CodeMode::Compat32 } else { CodeMode::Long64 };
            let nmi = frame(1, cs, code);
            let saved = frame(2, USER_CS64, CodeMode::Long64);
            let user_frame = match saved_state {
                0 => UserFrame::Complete(&saved),
                1 => UserFrame::InWindow,
                _ => UserFrame::NoTask,
            };
            let chain: std::vec::Vec<u64> = (100..100 + chain_len as u64).collect();
            let pebs = frame(3, cs, code).regs;
            let mut branches = BranchStack { hw_idx: 5, ..Default::default() };
            branches.entries.push(BranchEntry { from: 10, to: 20, ..Default::default() }).unwrap();
            let mut input = SampleInput::new(&e, &nmi, user_frame, 11, 2, 8, 300);
            let split = split.min(chain_len);
            input.chain_kernel = &chain[..split];
            input.chain_user = &chain[split..];
            if with_inputs {
                input.pebs_regs = Some(&pebs);
                input.branches = Some(&branches);
                input.precise_ip = Some(0xabc);
                input.mem = Some(MemInfo { addr: 8, weight: 9, ins_lat: 1, data_src: 2 });
            }
            let fresh = build_sample(&input);
            let mut slot = dirty();
            let built = build_sample_into(&input, &mut slot);
            prop_assert_eq!(built, !input.excluded());
            match fresh {
                Some(f) => prop_assert_eq!(slot, f),
                None => prop_assert_eq!(slot, dirty(), "an excluded sample leaves the slot alone"),
            }
        }
    }

    #[test]
    fn the_default_sample_goes_through_a_ring_slot_raw() {
        use crate::drain::NmiRecord;
        use crate::wire::ThrottleEvent;
        let mut e = EventConfig::cpu_clock(0, 4000);
        e.sample_type |= st::REGS_USER | st::CALLCHAIN;
        e.regs_user = GPR_MASK;
        let ring: FilledRing<NmiRecord, 2> = Ring::new_filled();
        // A slot that last held a throttle record becomes a sample.
        ring.push(NmiRecord::Throttle(ThrottleEvent {
            time: 1,
            cpu: 0,
            event: 0,
        }));
        assert!(ring.pop_with(|_| ()).is_some());
        for round in 0..4u64 {
            let nmi = frame(round, USER_CS64, CodeMode::Long64);
            let chain = [0x40_0000 + round];
            let mut input = SampleInput::new(&e, &nmi, UserFrame::NoTask, round, 0, 1, 250);
            input.chain_user = &chain;
            assert!(ring.push_with(|rec| {
                assert!(capture(&input, rec.sample_mut()));
            }));
            let got = ring
                .pop_with(|rec| match rec {
                    NmiRecord::Sample(raw) => raw.expand(&e),
                    other => panic!("{other:?}"),
                })
                .unwrap();
            assert_eq!(got, build_sample(&input).unwrap(), "round {round}");
            assert_eq!(&got.callchain[..], &[PERF_CONTEXT_USER, 0x40_0000 + round]);
        }
    }
}

mod writer {
    use super::*;
    use crate::sample::MAX_CALLCHAIN;
    use proptest::prelude::*;

    proptest! {
        /// Writing in place gives the builder's chain when it fits, and
        /// otherwise the longest prefix of the unbounded chain that fits
        /// `max_stack` without ending in a context marker.
        #[test]
        fn writer_keeps_the_longest_prefix_that_fits(
            frames in proptest::collection::vec((any::<bool>(), any::<u64>()), 0..90),
            max_stack in 0u16..80,
            stale in 0usize..=MAX_CALLCHAIN,
        ) {
            // The unbounded chain, by the marker rule.
            let mut model = std::vec::Vec::new();
            let mut mode = None;
            let mut b = CallchainBuilder::new();
            let mut chain: heapless::Vec<u64, MAX_CALLCHAIN> = (0..stale as u64).collect();
            let mut w = CallchainWriter::new(&mut chain, max_stack);
            for &(user, ip) in &frames {
                let m = if user { CpuMode::User } else { CpuMode::Kernel };
                if mode != Some(m) {
                    model.push(if user { PERF_CONTEXT_USER } else { PERF_CONTEXT_KERNEL });
                    mode = Some(m);
                }
                model.push(ip);
                b.push(m, ip);
                w.push(m, ip);
            }
            let limit = usize::from(max_stack).min(MAX_CALLCHAIN);
            let mut expected = &model[..model.len().min(limit)];
            if expected.len() < model.len()
                && matches!(expected.last(), Some(&(PERF_CONTEXT_USER | PERF_CONTEXT_KERNEL)))
            {
                expected = &expected[..expected.len() - 1];
            }
            prop_assert_eq!(w.as_slice(), expected);
            prop_assert_eq!(w.truncated(), model.len() > limit);
            if model.len() <= limit {
                prop_assert_eq!(w.as_slice(), b.as_slice(), "same as the builder when it fits");
            }
            prop_assert_eq!(&chain[..], expected, "written in place");
            // A run of one mode at a time: the same as frame by frame.
            let mut runs: heapless::Vec<u64, MAX_CALLCHAIN> = (0..stale as u64).collect();
            let mut w = CallchainWriter::new(&mut runs, max_stack);
            for run in frames.chunk_by(|a, b| a.0 == b.0) {
                let m = if run[0].0 { CpuMode::User } else { CpuMode::Kernel };
                let ips: std::vec::Vec<u64> = run.iter().map(|f| f.1).collect();
                w.extend(m, &ips);
            }
            prop_assert_eq!(w.truncated(), model.len() > limit);
            prop_assert_eq!(&runs[..], expected, "written a run at a time");
        }
    }
}

/// The expansion's rules on records filled the way the runtime's NMI
/// handler fills them (raw frames in entry-stub order, flags).
mod raw {
    use super::*;
    use crate::sample::BranchEntry;
    use proptest::prelude::*;

    fn raw_of(f: &InterruptFrame) -> RawFrame {
        RawFrame::from_regfile(&f.regs)
    }

    /// A record as the NMI handler leaves it: header words plus whatever
    /// `flags` and the frames say.
    fn record(flags: u32, user: &InterruptFrame, intr: &InterruptFrame) -> RawSample {
        RawSample {
            time: 5,
            ip: 0x40_0000,
            period: 250,
            pid: 3,
            tid: 3,
            cpu: 0,
            flags,
            user: raw_of(user),
            intr: raw_of(intr),
            ..RawSample::EMPTY
        }
    }

    #[test]
    fn entry_stub_words_land_in_their_perf_slots() {
        let f = RawFrame {
            r15: 15,
            r14: 14,
            r13: 13,
            r12: 12,
            r11: 11,
            r10: 10,
            r9: 9,
            r8: 8,
            rbp: 106,
            rdi: 105,
            rsi: 104,
            rdx: 103,
            rcx: 102,
            rbx: 101,
            rax: 100,
            vector: 2,
            error_code: 77,
            rip: 108,
            cs: 110,
            rflags: 109,
            rsp: 107,
            ss: 111,
        };
        let file = f.to_regfile();
        for (reg, v) in [
            (Reg::Ax, 100),
            (Reg::Bx, 101),
            (Reg::Cx, 102),
            (Reg::Dx, 103),
            (Reg::Si, 104),
            (Reg::Di, 105),
            (Reg::Bp, 106),
            (Reg::Sp, 107),
            (Reg::Ip, 108),
            (Reg::Flags, 109),
            (Reg::Cs, 110),
            (Reg::Ss, 111),
            (Reg::Ds, 0),
            (Reg::Es, 0),
            (Reg::Fs, 0),
            (Reg::Gs, 0),
            (Reg::R8, 8),
            (Reg::R9, 9),
            (Reg::R10, 10),
            (Reg::R11, 11),
            (Reg::R12, 12),
            (Reg::R13, 13),
            (Reg::R14, 14),
            (Reg::R15, 15),
        ] {
            assert_eq!(file.get(reg), v, "{}", reg.name());
        }
        let back = RawFrame::from_regfile(&file);
        assert_eq!(
            back,
            RawFrame {
                vector: 0,
                error_code: 0,
                ..f
            }
        );
        assert_eq!(core::mem::size_of::<RawFrame>(), 22 * 8);
    }

    #[test]
    fn user_mode_takes_the_interrupted_frame_for_both_sets() {
        let e = event(UserRegsMode::AtInterrupt);
        let u = frame(1, USER_CS64, CodeMode::Long64);
        let junk = frame(8, KERNEL_CS, CodeMode::Long64);
        let s = record(0, &u, &junk).expand(&e);
        assert_eq!(s.cpumode, CpuMode::User);
        assert_eq!(
            (s.ip, s.time, s.period, s.tid, s.event),
            (0x40_0000, 5, 250, 3, 3)
        );
        assert_regs_from(s.regs_user.as_ref().unwrap(), &u, Abi::Bits64);
        assert_regs_from(s.regs_intr.as_ref().unwrap(), &u, Abi::Bits64);
    }

    #[test]
    fn compat_code_gives_abi_32_with_zero_r8_to_r15() {
        let e = event(UserRegsMode::AtInterrupt);
        let c = frame(1, USER_CS32, CodeMode::Compat32);
        let k = frame(9, KERNEL_CS, CodeMode::Long64);
        let s = record(raw_flags::USER_COMPAT, &c, &k).expand(&e);
        assert_regs_from(s.regs_user.as_ref().unwrap(), &c, Abi::Bits32);
        assert_regs_from(s.regs_intr.as_ref().unwrap(), &c, Abi::Bits32);
        // A compat task's saved frame, NMI in the runtime.
        let flags = raw_flags::KERNEL | raw_flags::SAVED_USER | raw_flags::USER_COMPAT;
        let s = record(flags, &c, &k).expand(&e);
        assert_regs_from(s.regs_user.as_ref().unwrap(), &c, Abi::Bits32);
        assert_regs_from(s.regs_intr.as_ref().unwrap(), &k, Abi::Bits64);
    }

    #[test]
    fn runtime_mode_takes_the_saved_frame_only_when_complete() {
        let e = event(UserRegsMode::AtInterrupt);
        let saved = frame(2, USER_CS64, CodeMode::Long64);
        let k = frame(9, KERNEL_CS, CodeMode::Long64);
        let s = record(raw_flags::KERNEL | raw_flags::SAVED_USER, &saved, &k).expand(&e);
        assert_eq!(s.cpumode, CpuMode::Kernel);
        assert_regs_from(s.regs_user.as_ref().unwrap(), &saved, Abi::Bits64);
        assert_regs_from(s.regs_intr.as_ref().unwrap(), &k, Abi::Bits64);
        // In a window or without a task the handler sets no SAVED_USER: the
        // stale words in `user` are never reported.
        let s = record(raw_flags::KERNEL, &saved, &k).expand(&e);
        let u = s.regs_user.as_ref().unwrap();
        assert_eq!((u.abi, u.mask, u.values.len()), (Abi::None, GPR_MASK, 0));
        assert_regs_from(s.regs_intr.as_ref().unwrap(), &k, Abi::Bits64);
        // A "saved user frame" with a runtime CS is not complete.
        let not_user = frame(3, KERNEL_CS, CodeMode::Long64);
        let s = record(raw_flags::KERNEL | raw_flags::SAVED_USER, &not_user, &k).expand(&e);
        assert_eq!(s.regs_user.as_ref().unwrap().abi, Abi::None);
        // Return-to-user mode: a placeholder for DeferredUserRegs.
        let d = event(UserRegsMode::AtReturnToUser);
        let s = record(raw_flags::KERNEL | raw_flags::SAVED_USER, &saved, &k).expand(&d);
        assert_eq!(s.regs_user.as_ref().unwrap().abi, Abi::None);
        assert!(needs_deferred_regs(&d, true));
    }

    #[test]
    fn masks_pick_values_in_perf_order() {
        let mut e = event(UserRegsMode::AtInterrupt);
        e.regs_user = Reg::Ip.bit() | Reg::Sp.bit() | Reg::R9.bit();
        e.regs_intr = Reg::Ax.bit() | Reg::Cs.bit();
        let u = frame(1, USER_CS64, CodeMode::Long64);
        let s = record(0, &u, &u).expand(&e);
        let r = s.regs_user.as_ref().unwrap();
        assert_eq!(r.mask, e.regs_user);
        assert_eq!(
            &r.values[..],
            &[
                u.regs.get(Reg::Sp),
                u.regs.get(Reg::Ip),
                u.regs.get(Reg::R9)
            ]
        );
        let i = s.regs_intr.as_ref().unwrap();
        assert_eq!(&i.values[..], &[u.regs.get(Reg::Ax), USER_CS64]);
    }

    #[test]
    fn pmu_fields_reach_the_sample() {
        let mut e = event(UserRegsMode::AtInterrupt);
        e.sample_type |= st::BRANCH_STACK | st::ADDR | st::WEIGHT;
        let u = frame(1, USER_CS64, CodeMode::Long64);
        let k = frame(9, KERNEL_CS, CodeMode::Long64);
        let pebs = frame(5, USER_CS64, CodeMode::Long64);
        let mut r = record(
            raw_flags::PEBS_REGS | raw_flags::BRANCHES | raw_flags::MEM,
            &u,
            &k,
        );
        r.pmu.pebs_regs = pebs.regs;
        r.pmu.branches.hw_idx = 4;
        r.pmu
            .branches
            .entries
            .push(BranchEntry {
                from: 1,
                to: 2,
                ..Default::default()
            })
            .unwrap();
        r.pmu.mem = MemInfo {
            addr: 0xdead,
            weight: 3,
            ins_lat: 1,
            data_src: 7,
        };
        let s = r.expand(&e);
        assert_regs_from(s.regs_user.as_ref().unwrap(), &pebs, Abi::Bits64);
        assert_regs_from(s.regs_intr.as_ref().unwrap(), &pebs, Abi::Bits64);
        assert_eq!(s.branches.as_ref().unwrap(), &r.pmu.branches);
        assert_eq!(s.mem.unwrap().addr, 0xdead);
        // In the runtime, PEBS GPRs are the interrupt registers only.
        r.flags |= raw_flags::KERNEL | raw_flags::SAVED_USER;
        let s = r.expand(&e);
        assert_regs_from(s.regs_user.as_ref().unwrap(), &u, Abi::Bits64);
        assert_regs_from(s.regs_intr.as_ref().unwrap(), &pebs, Abi::Bits64);
        // Without the flags, the stale PMU words are not reported.
        r.flags = 0;
        let s = r.expand(&e);
        assert!(s.branches.as_ref().unwrap().entries.is_empty());
        assert_eq!(s.mem, Some(MemInfo::default()));
        assert_regs_from(s.regs_intr.as_ref().unwrap(), &u, Abi::Bits64);
    }

    fn any_raw_frame() -> impl Strategy<Value = RawFrame> {
        proptest::array::uniform24(any::<u64>()).prop_map(|w| RawFrame::from_regfile(&RegFile(w)))
    }

    proptest! {
        /// A reused slot: whatever the producer does not write (frames,
        /// chain words, PMU data of an older sample) never reaches the
        /// expanded sample.
        #[test]
        fn stale_slot_contents_are_never_read(
            bits in any::<u8>(),
            cs in prop_oneof![Just(USER_CS64), Just(USER_CS32), Just(KERNEL_CS)],
            saved_state in 0u8..3,
            kernel_len in 0usize..20,
            user_len in 0usize..34,
            old_user in any_raw_frame(),
            old_intr in any_raw_frame(),
            old_chain in proptest::array::uniform32(any::<u64>()),
            old_lens in any::<(u8, u8, u32)>(),
        ) {
            let mut e = EventConfig::cpu_clock(9, 4000);
            for (i, bit) in [st::CALLCHAIN, st::BRANCH_STACK, st::REGS_USER, st::REGS_INTR, st::WEIGHT, st::ADDR].into_iter().enumerate() {
                if bits & (1 << i) != 0 {
                    e.sample_type |= bit;
                }
            }
            e.regs_user = GPR_MASK;
            e.regs_intr = GPR_MASK;
            let code = if cs == USER_CS32 { CodeMode::Compat32 } else { CodeMode::Long64 };
            let nmi = frame(1, cs, code);
            let saved = frame(2, USER_CS64, CodeMode::Long64);
            let user_frame = match saved_state {
                0 => UserFrame::Complete(&saved),
                1 => UserFrame::InWindow,
                _ => UserFrame::NoTask,
            };
            let chain: std::vec::Vec<u64> = (0..(kernel_len + user_len) as u64).map(|i| 0x1000 + i).collect();
            let mut input = SampleInput::new(&e, &nmi, user_frame, 1, 0, 2, 3);
            input.chain_kernel = &chain[..kernel_len];
            input.chain_user = &chain[kernel_len..];
            let mut clean = RawSample::EMPTY;
            prop_assert!(capture(&input, &mut clean));
            let mut dirty = RawSample {
                user: old_user,
                intr: old_intr,
                kernel_len: old_lens.0,
                user_len: old_lens.1,
                flags: old_lens.2,
                ..RawSample::EMPTY
            };
            dirty.chain[..32].copy_from_slice(&old_chain);
            dirty.chain[32..].copy_from_slice(&old_chain);
            dirty.pmu.pebs_regs = RegFile(old_chain[..24].try_into().unwrap());
            dirty.pmu.mem.addr = old_chain[0];
            dirty.pmu.branches.entries.push(BranchEntry { from: 1, to: 2, ..Default::default() }).unwrap();
            prop_assert!(capture(&input, &mut dirty));
            prop_assert_eq!(dirty.expand(&e), clean.expand(&e));
        }
    }
}
