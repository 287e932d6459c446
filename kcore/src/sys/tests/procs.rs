//! `wait4`, `waitpid`, `waitid`, process groups and sessions, through the
//! real handlers in both ABIs, with children put in the run's process table
//! as the runtime puts them there.

use super::*;
use crate::sys::procs::Status;

fn both() -> [Env; 2] {
    [Env::new(Abi::X86_64), Env::new(Abi::I386)]
}

const WNOHANG: u64 = 1;
const WEXITED: u64 = 4;
const WNOWAIT: u64 = 0x0100_0000;
const P_ALL: u64 = 0;
const P_PID: u64 = 1;
const P_PGID: u64 = 2;
const INIT: u32 = 1;

/// Children 50 and 51 of the test process, in its group.
fn with_children(e: &mut Env) {
    let me = e.p.pid;
    let pgid = e.sys.procs.get(me).unwrap().pgid;
    e.sys.procs.add(50, me, pgid, me).unwrap();
    e.sys.procs.add(51, me, pgid, me).unwrap();
}

#[test]
fn wait4_takes_an_ended_child_once_and_says_echild_after() {
    for mut e in both() {
        assert_eq!(e.err("wait4", &[u64::MAX, 0, 0, 0]), Errno::ECHILD);
        with_children(&mut e);
        // Both live: WNOHANG says 0, a plain wait waits.
        assert_eq!(e.ret("wait4", &[u64::MAX, SCRATCH, WNOHANG, 0]), 0);
        assert_eq!(
            e.call("wait4", &[u64::MAX, SCRATCH, 0, 0]),
            Action::Wait { until_ns: None }
        );
        // 51 exits with 3: its parent's waiting thread is woken.
        let mut woken = Vec::new();
        let parent = e.sys.procs.ended(51, Status::Exited(3));
        assert_eq!(parent, Some(e.p.pid));
        e.sys.waits.wake_with(e.p.pid, &mut |t| woken.push(t));
        assert_eq!(woken, [e.t.tid]);
        assert_eq!(e.resume(), Some(Action::Return(51)));
        assert_eq!(e.u32_at(SCRATCH), 3 << 8);
        assert_eq!(e.err("wait4", &[51, 0, WNOHANG, 0]), Errno::ECHILD);
        // 50 killed by SIGSEGV, taken by pid with a rusage.
        e.sys.procs.ended(
            50,
            Status::Killed {
                signal: 11,
                core: false,
            },
        );
        e.poke(SCRATCH + 0x100, &[0xff; 144]);
        assert_eq!(e.ret("wait4", &[50, SCRATCH, 0, SCRATCH + 0x100]), 50);
        assert_eq!(e.u32_at(SCRATCH), 11);
        let len = if e.abi == Abi::X86_64 { 144 } else { 72 };
        assert!(e.peek(SCRATCH + 0x100, len).iter().all(|&b| b == 0));
        assert_eq!(e.err("wait4", &[u64::MAX, 0, 0, 0]), Errno::ECHILD);
        assert_eq!(e.err("wait4", &[0, 0, 0x10, 0]), Errno::EINVAL);
        // A bad status pointer leaves the zombie for the next wait.
        e.sys.procs.add(52, e.p.pid, e.p.pid, e.p.pid).unwrap();
        e.sys.procs.ended(52, Status::Exited(1));
        assert_eq!(e.err("wait4", &[52, BAD, 0, 0]), Errno::EFAULT);
        assert_eq!(e.ret("wait4", &[52, 0, 0, 0]), 52);
    }
}

#[test]
fn waitpid_and_groups_choose_the_child() {
    let mut e = Env::new(Abi::I386);
    with_children(&mut e);
    let me = e.p.pid;
    // 51 into a group of its own; wait for "my group" skips it.
    assert_eq!(e.ret("setpgid", &[51, 0]), 0);
    assert_eq!(e.ret("getpgid", &[51]), 51);
    e.sys.procs.ended(51, Status::Exited(9));
    assert_eq!(e.ret("waitpid", &[0, SCRATCH, WNOHANG]), 0);
    assert_eq!(e.ret("waitpid", &[(-51i64) as u64, SCRATCH, 0]), 51);
    assert_eq!(e.u32_at(SCRATCH), 9 << 8);
    assert_eq!(e.ret("getpgrp", &[]), i64::from(me));
    assert_eq!(e.ret("getsid", &[0]), i64::from(me));
    assert_eq!(e.err("getpgid", &[999]), Errno::ESRCH);
    // The test process leads its session: no new one.
    assert_eq!(e.err("setsid", &[]), Errno::EPERM);
}

#[test]
fn waitid_reports_a_siginfo_and_wnowait_leaves_the_zombie() {
    for mut e in both() {
        with_children(&mut e);
        assert_eq!(e.err("waitid", &[P_ALL, 0, SCRATCH, 0, 0]), Errno::EINVAL);
        assert_eq!(e.err("waitid", &[3, 0, SCRATCH, WEXITED, 0]), Errno::EINVAL);
        e.poke(SCRATCH, &[0xff; 64]);
        assert_eq!(
            e.ret("waitid", &[P_ALL, 0, SCRATCH, WEXITED | WNOHANG, 0]),
            0
        );
        assert_eq!(e.u32_at(SCRATCH), 0, "si_signo zeroed");
        e.sys.procs.ended(
            50,
            Status::Killed {
                signal: 9,
                core: false,
            },
        );
        let union = if e.abi == Abi::X86_64 { 16 } else { 12 };
        for _ in 0..2 {
            assert_eq!(
                e.ret("waitid", &[P_PID, 50, SCRATCH, WEXITED | WNOWAIT, 0]),
                0
            );
            assert_eq!(e.u32_at(SCRATCH), 17, "SIGCHLD");
            assert_eq!(e.u32_at(SCRATCH + 8), 2, "CLD_KILLED");
            assert_eq!(e.u32_at(SCRATCH + union), 50);
            assert_eq!(e.u32_at(SCRATCH + union + 8), 9);
        }
        assert_eq!(e.ret("waitid", &[P_PGID, 0, SCRATCH, WEXITED, 0]), 0);
        assert_eq!(
            e.err("waitid", &[P_PID, 50, SCRATCH, WEXITED, 0]),
            Errno::ECHILD
        );
    }
}

#[test]
fn a_parent_that_ignores_sigchld_leaves_no_zombie_to_wait_for() {
    for mut e in both() {
        with_children(&mut e);
        // rt_sigaction(SIGCHLD, {SIG_IGN}).
        let act = SCRATCH + 0x200;
        e.poke(act, &[0; 32]);
        e.poke(act, &1u32.to_le_bytes());
        assert_eq!(e.ret("rt_sigaction", &[17, act, 0, 8]), 0);
        e.sys.procs.ended(50, Status::Exited(0));
        e.sys.procs.ended(51, Status::Exited(0));
        assert_eq!(e.err("wait4", &[u64::MAX, 0, 0, 0]), Errno::ECHILD);
    }
}

#[test]
fn kill_reaches_other_processes_and_groups() {
    for mut e in both() {
        let me = e.p.pid;
        with_children(&mut e);
        // 52 in a group of its own, 53 in another session's group.
        e.sys.procs.add(52, me, 52, me).unwrap();
        e.sys.procs.add(INIT, 0, INIT, INIT).unwrap();
        // One process, by pid; a probe with signal 0 sends nothing.
        assert_eq!(e.ret("kill", &[50, 15]), 0);
        assert_eq!(e.ret("kill", &[51, 0]), 0);
        assert_eq!(e.m.process_signals, [(50, 15)]);
        assert_eq!(e.err("kill", &[99, 15]), Errno::ESRCH);
        assert_eq!(e.err("kill", &[99, 0]), Errno::ESRCH);
        assert_eq!(e.err("kill", &[50, 65]), Errno::EINVAL);
        // The caller's group (0): its children there, and itself.
        e.m.process_signals.clear();
        assert_eq!(e.ret("kill", &[0, 10]), 0);
        let mut got = e.m.process_signals.clone();
        got.sort_unstable();
        assert_eq!(got, [(50, 10), (51, 10)]);
        assert_ne!(e.p.signals.pending & 1 << 9, 0, "the caller's own");
        // Another group by -pgid; an empty one is ESRCH.
        e.m.process_signals.clear();
        assert_eq!(e.ret("kill", &[(-52i64) as u64, 2]), 0);
        assert_eq!(e.m.process_signals, [(52, 2)]);
        assert_eq!(e.err("kill", &[(-77i64) as u64, 2]), Errno::ESRCH);
        // -1: everyone but init and the caller.
        e.m.process_signals.clear();
        assert_eq!(e.ret("kill", &[u64::MAX, 1]), 0);
        let mut got = e.m.process_signals.clone();
        got.sort_unstable();
        assert_eq!(got, [(50, 1), (51, 1), (52, 1)]);
        // A zombie takes the signal and nothing happens.
        e.sys.procs.ended(50, Status::Exited(0));
        e.m.process_signals.clear();
        assert_eq!(e.ret("kill", &[50, 9]), 0);
        assert!(e.m.process_signals.is_empty());
    }
}

const PRIO_PROCESS: u64 = 0;
const PRIO_PGRP: u64 = 1;
const PRIO_USER: u64 = 2;
const IOPRIO_WHO_PROCESS: u64 = 1;
const IOPRIO_WHO_PGRP: u64 = 2;

#[test]
fn priorities_are_kept_by_process_group_and_user_and_inherited() {
    for mut e in both() {
        let me = e.p.pid;
        // The system call returns 20 - nice.
        assert_eq!(e.ret("getpriority", &[PRIO_PROCESS, 0]), 20);
        assert_eq!(e.ret("setpriority", &[PRIO_PROCESS, 0, 5]), 0);
        assert_eq!(e.ret("getpriority", &[PRIO_PROCESS, u64::from(me)]), 15);
        // Kept within -20 to 19; root may lower it.
        assert_eq!(e.ret("setpriority", &[PRIO_PROCESS, 0, 100]), 0);
        assert_eq!(e.ret("getpriority", &[PRIO_PROCESS, 0]), 1);
        assert_eq!(e.ret("setpriority", &[PRIO_PROCESS, 0, (-3i64) as u64]), 0);
        assert_eq!(e.ret("getpriority", &[PRIO_PROCESS, 0]), 23);
        // A child inherits it; another process is named by its pid.
        with_children(&mut e);
        assert_eq!(e.ret("getpriority", &[PRIO_PROCESS, 50]), 23);
        assert_eq!(e.ret("setpriority", &[PRIO_PROCESS, 50, 10]), 0);
        assert_eq!(e.ret("getpriority", &[PRIO_PROCESS, 50]), 10);
        assert_eq!(e.ret("getpriority", &[PRIO_PROCESS, 0]), 23);
        // The group: the highest priority of its members, then all of
        // them set; user 0 is everyone.
        assert_eq!(e.ret("getpriority", &[PRIO_PGRP, 0]), 23);
        assert_eq!(e.ret("setpriority", &[PRIO_PGRP, 0, 7]), 0);
        assert_eq!(e.ret("getpriority", &[PRIO_PROCESS, 51]), 13);
        assert_eq!(e.ret("setpriority", &[PRIO_USER, 0, 2]), 0);
        assert_eq!(e.ret("getpriority", &[PRIO_PROCESS, 50]), 18);
        // Nobody else: ESRCH; a bad `which`: EINVAL. A zombie has none.
        assert_eq!(e.err("getpriority", &[PRIO_USER, 1000]), Errno::ESRCH);
        assert_eq!(e.err("setpriority", &[PRIO_PROCESS, 4242, 0]), Errno::ESRCH);
        assert_eq!(e.err("getpriority", &[9, 0]), Errno::EINVAL);
        e.sys.procs.ended(51, Status::Exited(0));
        assert_eq!(e.err("getpriority", &[PRIO_PROCESS, 51]), Errno::ESRCH);
        // I/O priorities: none until set, then the class and level set.
        assert_eq!(e.ret("ioprio_get", &[IOPRIO_WHO_PROCESS, 0]), 0);
        let be3 = (2 << 13) | 3;
        assert_eq!(e.ret("ioprio_set", &[IOPRIO_WHO_PROCESS, 0, be3]), 0);
        assert_eq!(
            e.ret("ioprio_get", &[IOPRIO_WHO_PROCESS, u64::from(me)]),
            be3 as i64
        );
        assert_eq!(e.ret("ioprio_get", &[IOPRIO_WHO_PGRP, 0]), be3 as i64);
        assert_eq!(
            e.err("ioprio_set", &[IOPRIO_WHO_PROCESS, 0, (2 << 13) | 8]),
            Errno::EINVAL
        );
        assert_eq!(
            e.err("ioprio_set", &[IOPRIO_WHO_PROCESS, 0, 5 << 13]),
            Errno::EINVAL
        );
        assert_eq!(e.err("ioprio_get", &[0, 0]), Errno::EINVAL);
    }
}
