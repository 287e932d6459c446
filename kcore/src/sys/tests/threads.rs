//! Threads through the real handler paths: `clone`'s flag checks and the
//! new thread's state, `exit` of one thread of several, and futex waits
//! and wakes between threads (a test switches threads by swapping
//! `Env::t`, as the runtime's scheduler does).

use super::*;
use crate::sys::calls::task::clone_flags as f;
use crate::sys::{CloneArgs, new_thread};

fn both() -> [Env; 2] {
    [Env::new(Abi::X86_64), Env::new(Abi::I386)]
}

/// glibc's and musl's `pthread_create` flags.
const PTHREAD: u64 = f::THREAD_SET | f::SYSVSEM | f::SETTLS | f::PARENT_SETTID | f::CHILD_CLEARTID;

/// `clone` in the caller's argument order (i386 swaps `tls` and `child_tid`).
fn clone(e: &mut Env, flags: u64, stack: u64, ptid: u64, ctid: u64, tls: u64) -> Action {
    if e.abi == Abi::X86_64 {
        e.call("clone", &[flags, stack, ptid, ctid, tls])
    } else {
        e.call("clone", &[flags, stack, ptid, tls, ctid])
    }
}

#[test]
fn a_pthread_clone_is_handed_to_the_runtime_with_its_arguments() {
    for mut e in both() {
        let tls = if e.abi == Abi::X86_64 {
            SCRATCH + 0x800
        } else {
            SCRATCH + 0x900
        };
        match clone(&mut e, PTHREAD, SCRATCH + 0x4000, SCRATCH, SCRATCH + 8, tls) {
            Action::Clone(a) => assert_eq!(
                a,
                CloneArgs {
                    flags: PTHREAD,
                    stack: SCRATCH + 0x4000,
                    parent_tid: SCRATCH,
                    child_tid: SCRATCH + 8,
                    tls,
                }
            ),
            a => panic!("{a:?}"),
        }
        assert!(e.sys.unknown.list().is_empty());
    }
}

#[test]
fn forks_and_vforks_go_to_the_runtime_shared_tables_are_enosys_and_odd_threads_einval() {
    for mut e in both() {
        // fork as glibc asks for it: the runtime makes the copy.
        let sigchld = 17;
        let glibc = sigchld | f::CHILD_SETTID | f::CHILD_CLEARTID;
        assert_eq!(
            clone(&mut e, glibc, 0, 0, SCRATCH + 8, 0),
            Action::Fork(CloneArgs {
                flags: glibc,
                stack: 0,
                parent_tid: 0,
                child_tid: SCRATCH + 8,
                tls: 0,
            })
        );
        // A copy sharing the descriptor table is not there.
        assert_eq!(
            (clone(&mut e, sigchld | f::FILES, 0, 0, 0, 0)),
            Action::Return(Errno::ENOSYS.to_return())
        );
        // posix_spawn's CLONE_VM|CLONE_VFORK: a process in the caller's
        // memory, on the stack given.
        assert_eq!(
            clone(&mut e, f::VM | f::VFORK | sigchld, SCRATCH, 0, 0, 0),
            Action::Fork(CloneArgs {
                flags: f::VM | f::VFORK | sigchld,
                stack: SCRATCH,
                parent_tid: 0,
                child_tid: 0,
                tls: 0,
            })
        );
        // vfork itself is the same.
        assert_eq!(
            e.call("vfork", &[]),
            Action::Fork(CloneArgs {
                flags: f::VM | f::VFORK | sigchld,
                stack: 0,
                parent_tid: 0,
                child_tid: 0,
                tls: 0,
            })
        );
        // A thread in a new PID namespace.
        assert_eq!(
            (clone(&mut e, PTHREAD | 0x2000_0000, SCRATCH, 0, 0, 0)),
            Action::Return(Errno::EINVAL.to_return())
        );
        // Linux's own rules: THREAD needs SIGHAND, SIGHAND needs VM.
        assert_eq!(
            (clone(&mut e, f::THREAD | f::VM, SCRATCH, 0, 0, 0)),
            Action::Return(Errno::EINVAL.to_return())
        );
        assert_eq!(
            (clone(&mut e, f::SIGHAND, SCRATCH, 0, 0, 0)),
            Action::Return(Errno::EINVAL.to_return())
        );
        let list = e.sys.unknown.list();
        assert_eq!(list.len(), 1, "{list:?}");
        assert_eq!(
            list[0].3, 2,
            "the copy sharing descriptors and the namespace thread are named"
        );
    }
}

#[test]
fn too_many_threads_is_eagain() {
    let mut e = Env::new(Abi::X86_64);
    e.p.threads = crate::sys::calls::task::MAX_THREADS;
    assert_eq!(
        (clone(&mut e, PTHREAD, SCRATCH, 0, 0, 0)),
        Action::Return(Errno::EAGAIN.to_return())
    );
}

#[test]
fn the_new_thread_gets_its_tls_tids_and_the_parents_mask() {
    let mut e = Env::new(Abi::X86_64);
    e.t.sigmask = 0b1010;
    e.t.clear_child_tid = 0x1234;
    let args = CloneArgs {
        flags: PTHREAD | f::CHILD_SETTID,
        stack: SCRATCH + 0x4000,
        parent_tid: SCRATCH,
        child_tid: SCRATCH + 8,
        tls: 0x7000_0000,
    };
    let t = new_thread(&mut e.m, &mut e.p, &e.t, &args, 42).unwrap();
    assert_eq!(t.tid, 42);
    assert_eq!(t.fs_base, 0x7000_0000);
    assert_eq!(t.sigmask, 0b1010);
    assert_eq!(t.clear_child_tid, SCRATCH + 8);
    assert_eq!(e.peek(SCRATCH, 4), 42u32.to_le_bytes());
    assert_eq!(e.peek(SCRATCH + 8, 4), 42u32.to_le_bytes());
    assert_eq!(e.p.threads, 2);
    // A tid pointer that is not mapped: no thread, the count unchanged.
    let bad = CloneArgs {
        parent_tid: BAD,
        ..args
    };
    assert_eq!(
        new_thread(&mut e.m, &mut e.p, &e.t, &bad, 43).unwrap_err(),
        Errno::EFAULT
    );
    assert_eq!(e.p.threads, 2);
}

#[test]
fn an_i386_thread_gets_its_tls_slot_from_the_user_desc() {
    let mut e = Env::new(Abi::I386);
    // entry 12, base 0x5000_0000, limit 0xfffff pages, seg_32bit,
    // limit_in_pages, useable.
    let desc = [
        12u32.to_le_bytes(),
        0x5000_0000u32.to_le_bytes(),
        0xfffffu32.to_le_bytes(),
        (1u32 | 16 | 64).to_le_bytes(),
    ]
    .concat();
    e.poke(SCRATCH + 0x100, &desc);
    let args = CloneArgs {
        flags: PTHREAD,
        stack: SCRATCH + 0x4000,
        parent_tid: SCRATCH,
        child_tid: SCRATCH + 8,
        tls: SCRATCH + 0x100,
    };
    let t = new_thread(&mut e.m, &mut e.p, &e.t, &args, 9).unwrap();
    let slot = t.tls[0].expect("slot 12 set");
    assert_eq!((slot.base, slot.limit), (0x5000_0000, 0xfffff));
    // entry_number -1 is not allowed in clone (Linux: EINVAL).
    e.poke(SCRATCH + 0x100, &u32::MAX.to_le_bytes());
    assert_eq!(
        new_thread(&mut e.m, &mut e.p, &e.t, &args, 10).unwrap_err(),
        Errno::EINVAL
    );
}

#[test]
fn exit_of_one_thread_clears_and_wakes_its_tid_word_and_the_last_ends_the_process() {
    for mut e in both() {
        let main = e.t.clone();
        e.p.threads = 2;
        // The joiner (tid 7) waits on the worker's tid word, as pthread_join does.
        e.poke(SCRATCH + 8, &42u32.to_le_bytes());
        assert_eq!(
            e.call("futex", &[SCRATCH + 8, 0, 42, 0, 0, 0]),
            Action::Block
        );
        let mut worker = Thread::new(42);
        worker.clear_child_tid = SCRATCH + 8;
        e.t = worker;
        assert_eq!(e.call("exit", &[3]), Action::ExitThread(3));
        assert_eq!(e.peek(SCRATCH + 8, 4), [0; 4]);
        assert_eq!(e.m.woken, [7]);
        assert_eq!(e.p.threads, 1);
        e.t = main;
        assert_eq!(e.call("exit", &[4]), Action::Exit(4));
    }
}

#[test]
fn exit_group_ends_the_process_whatever_the_thread_count() {
    let mut e = Env::new(Abi::X86_64);
    e.p.threads = 3;
    assert_eq!(e.call("exit_group", &[9]), Action::Exit(9));
}

#[test]
fn a_dying_thread_releases_its_robust_futexes() {
    let mut e = Env::new(Abi::X86_64);
    e.p.threads = 2;
    // A robust list head at SCRATCH: next -> entry at +0x40, futex_offset
    // 8 (the word follows the list link), no pending op. The entry's next
    // points back at the head.
    let head = SCRATCH;
    let entry = SCRATCH + 0x40;
    e.poke(head, &entry.to_le_bytes());
    e.poke(head + 8, &8u64.to_le_bytes());
    e.poke(head + 16, &0u64.to_le_bytes());
    e.poke(entry, &head.to_le_bytes());
    // The mutex word: held by tid 42, with waiters.
    e.poke(entry + 8, &(42u32 | 0x8000_0000).to_le_bytes());
    // tid 7 waits on it.
    assert_eq!(
        e.call("futex", &[entry + 8, 128, 42 | 0x8000_0000, 0, 0, 0]),
        Action::Block
    );
    let mut worker = Thread::new(42);
    worker.robust_list = (head, 24);
    e.t = worker;
    assert_eq!(e.call("exit", &[0]), Action::ExitThread(0));
    let word = u32::from_le_bytes(e.peek(entry + 8, 4).try_into().unwrap());
    assert_eq!(word, 0x8000_0000 | 0x4000_0000, "owner died, waiters kept");
    assert_eq!(e.m.woken, [7]);
}

/// glibc links a PI mutex into the list with bit 0 of the pointer set:
/// the walk goes on through it to the next entry, and both are released.
#[test]
fn a_pi_entry_marked_in_bit_0_is_released_and_the_walk_goes_on() {
    let mut e = Env::new(Abi::X86_64);
    e.p.threads = 2;
    let head = SCRATCH;
    let pi = SCRATCH + 0x40;
    let plain = SCRATCH + 0x80;
    e.poke(head, &(pi | 1).to_le_bytes());
    e.poke(head + 8, &8u64.to_le_bytes());
    e.poke(head + 16, &0u64.to_le_bytes());
    e.poke(pi, &plain.to_le_bytes());
    e.poke(plain, &head.to_le_bytes());
    e.poke(pi + 8, &42u32.to_le_bytes());
    e.poke(plain + 8, &42u32.to_le_bytes());
    let mut worker = Thread::new(42);
    worker.robust_list = (head, 24);
    e.t = worker;
    assert_eq!(e.call("exit", &[0]), Action::ExitThread(0));
    for (what, entry) in [("PI", pi), ("plain", plain)] {
        let word = u32::from_le_bytes(e.peek(entry + 8, 4).try_into().unwrap());
        assert_eq!(word, 0x4000_0000, "{what} entry: owner died");
    }
}

/// A thread that dies between storing 0 to a robust mutex it unlocks (the
/// entry still pending) and waking its waiter: the waiter is woken for it.
#[test]
fn a_death_after_the_unlock_store_wakes_the_pending_futexs_waiter() {
    let mut e = Env::new(Abi::X86_64);
    e.p.threads = 2;
    let head = SCRATCH;
    let entry = SCRATCH + 0x40;
    e.poke(head, &head.to_le_bytes());
    e.poke(head + 8, &8u64.to_le_bytes());
    e.poke(head + 16, &entry.to_le_bytes());
    e.poke(entry + 8, &0x8000_0000u32.to_le_bytes());
    assert_eq!(
        e.call("futex", &[entry + 8, 128, 0x8000_0000, 0, 0, 0]),
        Action::Block
    );
    e.poke(entry + 8, &0u32.to_le_bytes());
    let mut worker = Thread::new(42);
    worker.robust_list = (head, 24);
    e.t = worker;
    assert_eq!(e.call("exit", &[0]), Action::ExitThread(0));
    assert_eq!(e.m.woken, [7]);
    assert_eq!(e.peek(entry + 8, 4), [0; 4], "the word stays 0");
}

#[test]
fn a_looping_robust_list_ends_the_walk() {
    let mut e = Env::new(Abi::X86_64);
    e.p.threads = 2;
    let head = SCRATCH;
    let a = SCRATCH + 0x40;
    let b = SCRATCH + 0x80;
    e.poke(head, &a.to_le_bytes());
    e.poke(head + 8, &8u64.to_le_bytes());
    e.poke(a, &b.to_le_bytes());
    e.poke(b, &a.to_le_bytes());
    let mut worker = Thread::new(42);
    worker.robust_list = (head, 24);
    e.t = worker;
    assert_eq!(e.call("exit", &[0]), Action::ExitThread(0));
}

#[test]
fn futex_wakes_go_to_the_oldest_matching_waiters_across_threads() {
    for mut e in both() {
        e.poke(SCRATCH, &1u32.to_le_bytes());
        e.poke(SCRATCH + 4, &0u32.to_le_bytes());
        for (tid, op, bitset) in [(7u32, 128u64, 0u64), (8, 128 | 9, 0b10), (9, 128 | 9, 0b01)] {
            e.t = Thread::new(tid);
            assert_eq!(
                e.call("futex", &[SCRATCH, op, 1, 0, 0, bitset]),
                Action::Block
            );
        }
        e.t = Thread::new(10);
        // FUTEX_WAKE of one: the oldest.
        assert_eq!(e.ret("futex", &[SCRATCH, 128 | 1, 1, 0, 0, 0]), 1);
        assert_eq!(e.m.woken, [7]);
        // FUTEX_WAKE_BITSET: only the waiter whose bitset matches.
        assert_eq!(e.ret("futex", &[SCRATCH, 128 | 10, 5, 0, 0, 0b10]), 1);
        assert_eq!(e.m.woken, [7, 8]);
        // FUTEX_CMP_REQUEUE: the word changed, so EAGAIN; then it moves 9.
        assert_eq!(
            e.err("futex", &[SCRATCH, 128 | 4, 0, 1, SCRATCH + 4, 2]),
            Errno::EAGAIN
        );
        assert_eq!(e.ret("futex", &[SCRATCH, 128 | 4, 0, 1, SCRATCH + 4, 1]), 1);
        assert_eq!(e.m.woken, [7, 8], "requeued, not woken");
        assert_eq!(e.ret("futex", &[SCRATCH, 128 | 1, 1, 0, 0, 0]), 0);
        // FUTEX_WAKE_OP: set the second word to 1 and, as it was 0 (== 0),
        // wake its waiter too.
        // FUTEX_OP(SET, 1, EQ, 0).
        let op = 1u64 << 12;
        assert_eq!(
            e.ret("futex", &[SCRATCH, 128 | 5, 1, 1, SCRATCH + 4, op]),
            1
        );
        assert_eq!(e.m.woken, [7, 8, 9]);
        assert_eq!(e.peek(SCRATCH + 4, 4), 1u32.to_le_bytes());
        assert!(e.sys.futex.is_empty());
    }
}

#[test]
fn a_thread_names_itself_and_only_the_first_names_the_process() {
    let mut e = Env::new(Abi::X86_64);
    let name = e.cstr(SCRATCH, "worker-1");
    e.t = Thread::new(8);
    assert_eq!(e.ret("prctl", &[15, name]), 0);
    assert_eq!(&e.t.comm[..9], b"worker-1\0");
    assert!(e.t.renamed);
    assert_eq!(e.p.comm(), b"prog", "the process keeps its name");
    assert_eq!(e.ret("prctl", &[16, SCRATCH + 0x100]), 0);
    assert_eq!(e.peek(SCRATCH + 0x100, 9), b"worker-1\0");
    // A new thread starts with its creator's name.
    let args = CloneArgs {
        flags: PTHREAD,
        stack: SCRATCH + 0x4000,
        parent_tid: SCRATCH + 0x200,
        child_tid: SCRATCH + 0x208,
        tls: 0,
    };
    let t = new_thread(&mut e.m, &mut e.p, &e.t, &args, 9).unwrap();
    assert_eq!(t.comm, e.t.comm);
    assert!(!t.renamed);
}

#[test]
fn clone3_is_clone_with_its_arguments_in_a_struct() {
    for mut e in both() {
        // flags, pidfd, child_tid, parent_tid, exit_signal, stack,
        // stack_size, tls, set_tid, set_tid_size, cgroup.
        let words: [u64; 11] = [
            PTHREAD,
            0,
            SCRATCH + 8,
            SCRATCH,
            0,
            SCRATCH + 0x1000,
            0x3000,
            0x7000_0000,
            0,
            0,
            0,
        ];
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        e.poke(SCRATCH + 0x100, &bytes);
        match e.call("clone3", &[SCRATCH + 0x100, 88]) {
            Action::Clone(a) => assert_eq!(
                a,
                CloneArgs {
                    flags: PTHREAD,
                    stack: SCRATCH + 0x4000,
                    parent_tid: SCRATCH,
                    child_tid: SCRATCH + 8,
                    tls: 0x7000_0000,
                }
            ),
            a => panic!("{a:?}"),
        }
        // The first version (64 bytes) is enough; less is EINVAL.
        assert!(matches!(
            e.call("clone3", &[SCRATCH + 0x100, 64]),
            Action::Clone(_)
        ));
        assert_eq!(e.err("clone3", &[SCRATCH + 0x100, 63]), Errno::EINVAL);
        // Unknown non-zero bytes past the known struct: E2BIG.
        e.poke(SCRATCH + 0x100 + 88, &[1]);
        assert_eq!(e.err("clone3", &[SCRATCH + 0x100, 96]), Errno::E2BIG);
        // set_tid needs privileges: EINVAL; a stack without a size too.
        e.poke(SCRATCH + 0x100 + 8 * 8, &1u64.to_le_bytes());
        assert_eq!(e.err("clone3", &[SCRATCH + 0x100, 88]), Errno::EINVAL);
        e.poke(SCRATCH + 0x100 + 8 * 8, &0u64.to_le_bytes());
        e.poke(SCRATCH + 0x100 + 6 * 8, &0u64.to_le_bytes());
        assert_eq!(e.err("clone3", &[SCRATCH + 0x100, 88]), Errno::EINVAL);
        assert_eq!(e.err("clone3", &[BAD, 88]), Errno::EFAULT);
        assert!(e.sys.unknown.list().is_empty());
    }
}
