//! Clocks, sleeping, futexes, randomness and CPU affinity.
//!
//! Monotonic clocks (MONOTONIC, MONOTONIC_RAW, the COARSE one, BOOTTIME)
//! all read [`Machine::monotonic_ns`]; REALTIME (and TAI, COARSE)
//! [`Machine::realtime_ns`]; the CPU-time clocks the process's
//! `cpu_time_ns`. Futexes are single-threaded: a wake finds nobody, a
//! wait on a matching value can only time out (or never return).

use super::super::Action;
use super::super::errno::{Errno, SysResult};
use super::super::machine::{CHUNK, Machine};
use super::super::uapi::{Timespec32, Timespec64, Timeval32, Timeval64};
use super::Ctx;

const NS: u64 = 1_000_000_000;

/// A clock's current value in ns, `EINVAL` for an unknown clock.
fn clock_now<M: Machine>(c: &mut Ctx<'_, M>, clock: i32) -> Result<u64, Errno> {
    match clock {
        0 | 5 | 8 | 11 => Ok(c.m.realtime_ns()),
        1 | 4 | 6 | 7 | 9 => Ok(c.m.monotonic_ns()),
        2 | 3 => Ok(c.p.cpu_time_ns),
        // Per-process/thread CPU clocks (`~pid << 3 | which`) of itself.
        n if n < 0 => {
            let pid = !(n >> 3);
            if (n & 7) == 7 || !(pid == 0 || pid == c.p.pid as i32) {
                Err(Errno::EINVAL)
            } else {
                Ok(c.p.cpu_time_ns)
            }
        }
        _ => Err(Errno::EINVAL),
    }
}

/// Writes a timespec of `ns` in the given width (`EOVERFLOW` if the
/// seconds do not fit 32 bits).
fn write_timespec<M: Machine>(
    c: &mut Ctx<'_, M>,
    addr: u64,
    ns: u64,
    wide: bool,
) -> Result<(), Errno> {
    let (s, n) = ((ns / NS) as i64, (ns % NS) as i64);
    if wide {
        c.write(
            addr,
            &Timespec64 {
                tv_sec: s,
                tv_nsec: n,
            }
            .to_bytes(),
        )
    } else {
        let s = i32::try_from(s).map_err(|_| Errno::EOVERFLOW)?;
        c.write(
            addr,
            &Timespec32 {
                tv_sec: s,
                tv_nsec: n as i32,
            }
            .to_bytes(),
        )
    }
}

/// Reads a timespec as ns (`EINVAL` for a negative or unnormalised one).
pub(crate) fn read_duration<M: Machine>(
    c: &mut Ctx<'_, M>,
    addr: u64,
    wide: bool,
) -> Result<u64, Errno> {
    let (s, n) = if wide {
        let t = Timespec64::from_bytes(&c.read_array(addr)?);
        (t.tv_sec, t.tv_nsec)
    } else {
        let t = Timespec32::from_bytes(&c.read_array(addr)?);
        (t.tv_sec.into(), t.tv_nsec.into())
    };
    if s < 0 || !(0..NS as i64).contains(&n) {
        return Err(Errno::EINVAL);
    }
    Ok((s as u64).saturating_mul(NS).saturating_add(n as u64))
}

/// `clock_gettime` (32-bit timespec for the i386 number 265, 64-bit for
/// x86_64 and `clock_gettime64`).
pub(crate) fn clock_gettime<M: Machine>(
    c: &mut Ctx<'_, M>,
    clock: i32,
    tp: u64,
    wide: bool,
) -> SysResult {
    let ns = clock_now(c, clock)?;
    write_timespec(c, tp, ns, wide)?;
    Ok(0)
}

/// `clock_getres`: 1 ns for every clock (4 ms for the COARSE ones); `res`
/// may be NULL.
pub(crate) fn clock_getres<M: Machine>(
    c: &mut Ctx<'_, M>,
    clock: i32,
    res: u64,
    wide: bool,
) -> SysResult {
    clock_now(c, clock)?;
    if res != 0 {
        let r = if matches!(clock, 5 | 6) { 4_000_000 } else { 1 };
        write_timespec(c, res, r, wide)?;
    }
    Ok(0)
}

/// `gettimeofday(tv, tz)`: either may be NULL; the timezone is UTC.
pub(crate) fn gettimeofday<M: Machine>(c: &mut Ctx<'_, M>, tv: u64, tz: u64) -> SysResult {
    let ns = c.m.realtime_ns();
    let (s, us) = ((ns / NS) as i64, ((ns % NS) / 1000) as i64);
    if tv != 0 {
        if c.wide() {
            c.write(
                tv,
                &Timeval64 {
                    tv_sec: s,
                    tv_usec: us,
                }
                .to_bytes(),
            )?;
        } else {
            let v = Timeval32 {
                tv_sec: s as i32,
                tv_usec: us as i32,
            };
            c.write(tv, &v.to_bytes())?;
        }
    }
    if tz != 0 {
        c.write(tz, &[0u8; 8])?;
    }
    Ok(0)
}

/// `time(tloc)`.
pub(crate) fn time<M: Machine>(c: &mut Ctx<'_, M>, tloc: u64) -> SysResult {
    let s = c.m.realtime_ns() / NS;
    if tloc != 0 {
        c.write_word(tloc, s)?;
    }
    Ok(s)
}

/// `nanosleep(req, rem)`: sleeps the whole request (`rem` is untouched:
/// nothing interrupts a sleep).
pub(crate) fn nanosleep<M: Machine>(
    c: &mut Ctx<'_, M>,
    req: u64,
    wide: bool,
) -> Result<Action, Errno> {
    let d = read_duration(c, req, wide)?;
    let now = c.m.monotonic_ns();
    Ok(Action::Sleep {
        until_ns: now.saturating_add(d),
        then: 0,
    })
}

/// `clock_nanosleep(clock, flags, req, rem)`, relative or `TIMER_ABSTIME`.
pub(crate) fn clock_nanosleep<M: Machine>(
    c: &mut Ctx<'_, M>,
    clock: i32,
    flags: u32,
    req: u64,
    wide: bool,
) -> Result<Action, Errno> {
    const TIMER_ABSTIME: u32 = 1;
    if !matches!(clock, 0 | 1 | 2 | 7 | 8 | 9 | 11) {
        return Err(if clock == 3 {
            Errno::EINVAL
        } else {
            Errno::EOPNOTSUPP
        });
    }
    let t = read_duration(c, req, wide)?;
    let mono = c.m.monotonic_ns();
    let d = if flags & TIMER_ABSTIME != 0 {
        let now = clock_now(c, clock)?;
        t.saturating_sub(now)
    } else {
        t
    };
    Ok(Action::Sleep {
        until_ns: mono.saturating_add(d),
        then: 0,
    })
}

/// `getrandom(buf, len, flags)`.
pub(crate) fn getrandom<M: Machine>(
    c: &mut Ctx<'_, M>,
    buf: u64,
    len: u64,
    flags: u32,
) -> SysResult {
    const GRND_NONBLOCK: u32 = 1;
    const GRND_RANDOM: u32 = 2;
    const GRND_INSECURE: u32 = 4;
    if flags & !(GRND_NONBLOCK | GRND_RANDOM | GRND_INSECURE) != 0
        || flags & (GRND_RANDOM | GRND_INSECURE) == (GRND_RANDOM | GRND_INSECURE)
    {
        return Err(Errno::EINVAL);
    }
    let len = len.min(0x01ff_ffff);
    c.access_ok(buf, len)?;
    let mut chunk = [0u8; CHUNK];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(CHUNK as u64) as usize;
        c.m.random_bytes(&mut chunk[..n]);
        if let Err(e) = c.write(buf + done, &chunk[..n]) {
            return if done == 0 { Err(e) } else { Ok(done) };
        }
        done += n as u64;
    }
    Ok(done)
}

/// `futex(uaddr, op, val, timeout, uaddr2, val3)`: waits and wakes over
/// the run's [`FutexTable`](super::super::futex::FutexTable), keyed by
/// [`FutexKey::of`].
pub(crate) fn futex<M: Machine>(
    c: &mut Ctx<'_, M>,
    a: [u64; 6],
    wide: bool,
) -> Result<Action, Errno> {
    use super::super::futex::{BITSET_MATCH_ANY, FutexKey, WakeOp};
    const FUTEX_WAIT: u32 = 0;
    const FUTEX_WAKE: u32 = 1;
    const FUTEX_REQUEUE: u32 = 3;
    const FUTEX_CMP_REQUEUE: u32 = 4;
    const FUTEX_WAKE_OP: u32 = 5;
    const FUTEX_WAIT_BITSET: u32 = 9;
    const FUTEX_WAKE_BITSET: u32 = 10;
    const FUTEX_PRIVATE_FLAG: u32 = 128;
    const FUTEX_CLOCK_REALTIME: u32 = 256;
    let (uaddr, op, val) = (a[0], a[1] as u32, a[2] as u32);
    let cmd = op & !(FUTEX_PRIVATE_FLAG | FUTEX_CLOCK_REALTIME);
    if op & FUTEX_CLOCK_REALTIME != 0 && !matches!(cmd, FUTEX_WAIT | FUTEX_WAIT_BITSET) {
        return Err(Errno::ENOSYS);
    }
    if !uaddr.is_multiple_of(4) {
        return Err(Errno::EINVAL);
    }
    let key1 = FutexKey::of(c.p.pid, uaddr);
    let key2 = FutexKey::of(c.p.pid, a[4]);
    // The count arguments are C ints.
    let nr = |v: u64| v as u32 as i32;
    let read_word =
        |c: &mut Ctx<'_, M>, addr: u64| super::super::machine::read_u32(c.m, &c.p.areas, addr);
    match cmd {
        FUTEX_WAIT | FUTEX_WAIT_BITSET => {
            let bitset = if cmd == FUTEX_WAIT {
                BITSET_MATCH_ANY
            } else {
                a[5] as u32
            };
            if bitset == 0 {
                return Err(Errno::EINVAL);
            }
            let deadline = if a[3] != 0 {
                let t = read_duration(c, a[3], wide)?;
                let mono = c.m.monotonic_ns();
                Some(if cmd == FUTEX_WAIT {
                    mono.saturating_add(t)
                } else {
                    // Absolute, on CLOCK_MONOTONIC or CLOCK_REALTIME.
                    let clock = if op & FUTEX_CLOCK_REALTIME != 0 { 0 } else { 1 };
                    let now = clock_now(c, clock)?;
                    mono.saturating_add(t.saturating_sub(now))
                })
            } else {
                None
            };
            if read_word(c, uaddr)? != val {
                return Err(Errno::EAGAIN);
            }
            c.futex.wait(key1, bitset, c.t.tid)?;
            Ok(match deadline {
                Some(until_ns) => Action::Sleep {
                    until_ns,
                    then: Errno::ETIMEDOUT.to_return(),
                },
                None => Action::Block,
            })
        }
        FUTEX_WAKE | FUTEX_WAKE_BITSET => {
            let bitset = if cmd == FUTEX_WAKE {
                BITSET_MATCH_ANY
            } else {
                a[5] as u32
            };
            let m = &mut *c.m;
            let n = c.futex.wake(key1, nr(a[2]), bitset, |t| m.wake_thread(t))?;
            Ok(Action::Return(n.into()))
        }
        FUTEX_REQUEUE | FUTEX_CMP_REQUEUE => {
            if !a[4].is_multiple_of(4) {
                return Err(Errno::EINVAL);
            }
            if cmd == FUTEX_CMP_REQUEUE && read_word(c, uaddr)? != a[5] as u32 {
                return Err(Errno::EAGAIN);
            }
            let m = &mut *c.m;
            // `timeout` carries the requeue count.
            let n = c
                .futex
                .requeue(key1, key2, nr(a[2]), nr(a[3]), |t| m.wake_thread(t))?;
            Ok(Action::Return(n.into()))
        }
        FUTEX_WAKE_OP => {
            let uaddr2 = a[4];
            if !uaddr2.is_multiple_of(4) {
                return Err(Errno::EINVAL);
            }
            let op = WakeOp::decode(a[5] as u32)?;
            let old = read_word(c, uaddr2)?;
            c.write(uaddr2, &op.apply(old).to_le_bytes())?;
            let held = op.compare(old)?;
            let m = &mut *c.m;
            let n = c
                .futex
                .wake_op(key1, nr(a[2]), key2, nr(a[3]), held, |t| m.wake_thread(t));
            Ok(Action::Return(n.into()))
        }
        _ => Err(Errno::ENOSYS),
    }
}

/// The affinity mask's size in bytes as Linux sizes it (whole `long`s
/// for every CPU up), and `EINVAL` when `len` is not a multiple of a
/// `long` or too short for the CPUs.
fn mask_size<M: Machine>(c: &Ctx<'_, M>, len: u64) -> Result<(u64, u32), Errno> {
    let cpus = c.m.online_cpus().clamp(1, 64);
    let word: u64 = if c.wide() { 8 } else { 4 };
    if !len.is_multiple_of(word) || len.saturating_mul(8) < u64::from(cpus) {
        return Err(Errno::EINVAL);
    }
    Ok((u64::from(cpus).div_ceil(word * 8) * word, cpus))
}

/// The thread `pid` names for the affinity calls: 0 is the caller, else a
/// thread id (of any process, as root may).
fn affinity_target<M: Machine>(c: &Ctx<'_, M>, pid: u64) -> Result<u32, Errno> {
    match pid as u32 as i32 {
        0 => Ok(c.t.tid),
        p if p < 0 => Err(Errno::EINVAL),
        p => Ok(p as u32),
    }
}

/// `sched_getaffinity(pid, len, mask)`: the CPUs the thread may run on
/// (every CPU that is up unless `sched_setaffinity` narrowed them);
/// returns the mask size written.
pub(crate) fn sched_getaffinity<M: Machine>(
    c: &mut Ctx<'_, M>,
    pid: u64,
    len: u64,
    mask: u64,
) -> SysResult {
    let tid = affinity_target(c, pid)?;
    let (size, cpus) = mask_size(c, len)?;
    let bits = c.m.affinity(tid)? & (u64::MAX >> (64 - cpus));
    c.write(mask, &bits.to_le_bytes()[..size as usize])?;
    Ok(size)
}

/// `sched_setaffinity(pid, len, mask)`: the thread runs only on the CPUs
/// of the mask that are up (`EINVAL` when it names none), and leaves its
/// CPU at once when that is not one of them: the caller returns on an
/// allowed CPU (the call yields), another thread moves at the end of its
/// slice at the latest.
pub(crate) fn sched_setaffinity<M: Machine>(
    c: &mut Ctx<'_, M>,
    pid: u64,
    len: u64,
    mask: u64,
) -> Result<Action, Errno> {
    let tid = affinity_target(c, pid)?;
    if len == 0 {
        return Err(Errno::EINVAL);
    }
    let cpus = c.m.online_cpus().clamp(1, 64);
    let mut b = [0u8; 8];
    let n = len.min(8) as usize;
    c.read(mask, &mut b[..n])?;
    let allowed = u64::from_le_bytes(b) & (u64::MAX >> (64 - cpus));
    if allowed == 0 {
        return Err(Errno::EINVAL);
    }
    if c.m.set_affinity(tid, allowed)? {
        return Ok(Action::Yield);
    }
    Ok(Action::Return(0))
}

/// Reads a `struct timeval` in the caller's layout as ns (`EINVAL` for a
/// negative value or microseconds past a second).
fn read_timeval<M: Machine>(c: &mut Ctx<'_, M>, addr: u64) -> Result<u64, Errno> {
    let (s, us) = if c.wide() {
        let v = Timeval64::from_bytes(&c.read_array(addr)?);
        (v.tv_sec, v.tv_usec)
    } else {
        let v = Timeval32::from_bytes(&c.read_array(addr)?);
        (i64::from(v.tv_sec), i64::from(v.tv_usec))
    };
    if s < 0 || !(0..1_000_000).contains(&us) {
        return Err(Errno::EINVAL);
    }
    Ok((s as u64)
        .saturating_mul(NS)
        .saturating_add(us as u64 * 1000))
}

/// Writes ns as a `struct timeval` in the caller's layout (microseconds
/// rounded up, so an armed timer never reads as disarmed).
fn write_timeval<M: Machine>(c: &mut Ctx<'_, M>, addr: u64, ns: u64) -> Result<(), Errno> {
    let us = ns.div_ceil(1000);
    let (s, us) = ((us / 1_000_000) as i64, (us % 1_000_000) as i64);
    if c.wide() {
        c.write(
            addr,
            &Timeval64 {
                tv_sec: s,
                tv_usec: us,
            }
            .to_bytes(),
        )
    } else {
        let v = Timeval32 {
            tv_sec: s as i32,
            tv_usec: us as i32,
        };
        c.write(addr, &v.to_bytes())
    }
}

/// `ITIMER_REAL`, the only interval timer the runtime keeps (it sends
/// SIGALRM); ITIMER_VIRTUAL and ITIMER_PROF are `EINVAL`.
const ITIMER_REAL: i32 = 0;

/// `setitimer(which, new, old)`: `struct itimerval` is the interval, then
/// the value.
pub(crate) fn setitimer<M: Machine>(
    c: &mut Ctx<'_, M>,
    which: i32,
    new: u64,
    old: u64,
) -> SysResult {
    if which != ITIMER_REAL {
        return Err(Errno::EINVAL);
    }
    let half = if c.wide() { 16 } else { 8 };
    let set = if new != 0 {
        let interval = read_timeval(c, new)?;
        let value = read_timeval(c, new + half)?;
        Some((value, interval))
    } else {
        None
    };
    let (left, interval) = c.m.itimer_real(set);
    if old != 0 {
        write_timeval(c, old, interval)?;
        write_timeval(c, old + half, left)?;
    }
    Ok(0)
}

/// `getitimer(which, cur)`.
pub(crate) fn getitimer<M: Machine>(c: &mut Ctx<'_, M>, which: i32, cur: u64) -> SysResult {
    if which != ITIMER_REAL {
        return Err(Errno::EINVAL);
    }
    let half = if c.wide() { 16 } else { 8 };
    let (left, interval) = c.m.itimer_real(None);
    write_timeval(c, cur, interval)?;
    write_timeval(c, cur + half, left)?;
    Ok(0)
}

/// `alarm(seconds)`: ITIMER_REAL once, after `seconds` (0 disarms);
/// returns the seconds that were left, rounded as Linux rounds them.
pub(crate) fn alarm<M: Machine>(c: &mut Ctx<'_, M>, seconds: u32) -> SysResult {
    let (left, _) = c.m.itimer_real(Some((u64::from(seconds) * NS, 0)));
    let (s, rest) = (left / NS, left % NS);
    Ok(if rest >= NS / 2 || (s == 0 && rest > 0) {
        s + 1
    } else {
        s
    })
}
