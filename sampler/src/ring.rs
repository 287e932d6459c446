//! The per-CPU sample ring: bounded, lock-free, safe to push from NMI
//! context, with exact loss accounting (`taken = delivered + lost` once the
//! ring is drained).
//!
//! # Design
//! A bounded queue with one sequence stamp per slot (D. Vyukov's bounded
//! MPMC queue). Producers claim a position with a compare-and-swap on the
//! tail, write the slot, then publish it by advancing the slot's stamp; the
//! consumer does the mirror image on the head. This is what makes nesting
//! correct on one CPU:
//! - an NMI producer that interrupts a producer between claim and publish
//!   simply claims the next position and publishes it; it never waits;
//! - the consumer stops at the first unpublished slot (returns `None`) and
//!   picks up the rest on its next call, so it never waits either;
//! - a producer that finds its slot not yet freed drops the sample and
//!   counts it: the ring is full.
//!
//! # In-place production and consumption
//! [`Ring::push_with`] hands the producer the claimed slot as `&mut T` and
//! [`Ring::pop_with`] hands the consumer the published slot as `&mut T`, so
//! a large record (a sample of a few KiB) is written and read where it
//! lies instead of being moved by value through the NMI handler. Slots
//! therefore stay initialised after [`Ring::pop_with`]: each slot carries a
//! `live` flag, owned like the value by whoever holds the slot's position,
//! and a never-used (or moved-out) slot is first set to `T::default()`
//! (a ring made with [`Ring::new_filled`] starts with every slot live).
//! The value `push_with` sees is whatever the slot held last: the producer
//! overwrites what it publishes.
//!
//! No operation blocks, allocates, or loops waiting for another context: the
//! only retry loop is the tail CAS, which fails only when a nested producer
//! completed a claim in between, so it makes progress every iteration.
//!
//! `heapless::spsc::Queue` allows only one producer, and heapless'
//! `mpmc::Queue` is deprecated, needs a power-of-two size and cannot be
//! capped at boot; hence this small ring. Capacity is a const generic so
//! the ring can be a `static`; [`Ring::set_capacity`] lowers the usable
//! capacity at boot (`ring=N`).
#![allow(unsafe_code)]

use core::cell::UnsafeCell;
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

struct Slot<T> {
    /// `stamp + 2 * index` is the slot's sequence: `2p` when the slot is
    /// free for the producer of position `p`, `2p + 1` once that producer
    /// published it, and `2(p + cap)` once the consumer freed it. Doubling
    /// keeps "published" and "free for the next lap" distinct even with a
    /// capacity of 1; storing it relative to the index lets every slot
    /// start at 0 in a `const fn`.
    stamp: AtomicUsize,
    /// Whether `value` holds an initialised `T`. Read and written only by
    /// the context that owns the slot's current position (or by `Drop`),
    /// with the same hand-over as `value`.
    live: UnsafeCell<bool>,
    value: UnsafeCell<MaybeUninit<T>>,
}

impl<T> Slot<T> {
    const fn empty() -> Self {
        Slot {
            stamp: AtomicUsize::new(0),
            live: UnsafeCell::new(false),
            value: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }

    const fn filled() -> Self
    where
        T: ConstDefault,
    {
        Slot {
            stamp: AtomicUsize::new(0),
            live: UnsafeCell::new(true),
            value: UnsafeCell::new(MaybeUninit::new(T::EMPTY)),
        }
    }
}

/// A value known at compile time that a slot can start with, so a
/// [`Ring::new_filled`] ring never initialises a slot on the NMI path.
pub trait ConstDefault: Sized {
    /// The starting value.
    const EMPTY: Self;
}

/// A claimed producer position; publishes the slot when dropped, so a
/// panicking `push_with` closure cannot leave the consumer stuck.
struct Claim<'a, T> {
    slot: &'a Slot<T>,
    pos: usize,
    base: usize,
}

impl<T> Drop for Claim<'_, T> {
    #[inline]
    fn drop(&mut self) {
        let published = self.pos.wrapping_mul(2).wrapping_add(1);
        self.slot
            .stamp
            .store(published.wrapping_sub(self.base), Ordering::Release);
    }
}

/// A claimed consumer position; hands the slot back to producers when
/// dropped.
struct Consume<'a, T> {
    slot: &'a Slot<T>,
    pos: usize,
    base: usize,
    cap: usize,
}

impl<T> Drop for Consume<'_, T> {
    fn drop(&mut self) {
        let freed = self.pos.wrapping_add(self.cap).wrapping_mul(2);
        self.slot
            .stamp
            .store(freed.wrapping_sub(self.base), Ordering::Release);
    }
}

/// Why [`Ring::set_capacity`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapacityError {
    /// 0, more than the compile-time capacity, or not a power of two.
    OutOfRange {
        /// Requested.
        requested: usize,
        /// Compile-time capacity.
        max: usize,
    },
    /// The ring has already been used.
    InUse,
}

impl core::fmt::Display for CapacityError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CapacityError::OutOfRange { requested, max } => {
                write!(
                    f,
                    "ring capacity {requested} is not a power of two in 1..={max}"
                )
            }
            CapacityError::InUse => write!(f, "ring capacity can only be set before first use"),
        }
    }
}

/// Counters of one ring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingStats {
    /// Push attempts (samples the target took).
    pub taken: u64,
    /// Samples popped by the consumer.
    pub delivered: u64,
    /// Samples dropped because the ring was full.
    pub lost: u64,
}

/// A bounded lock-free ring of `T` with compile-time capacity `N`.
///
/// `FILLED` rings ([`FilledRing`], made by [`Ring::new_filled`] or
/// [`Ring::init_filled`]) hold a value in every slot from the start and
/// have no [`Ring::pop`], which would move one out: so a slot is never
/// empty, and [`Ring::push_with`] writes over it without looking (two
/// instructions fewer on the NMI path).
///
/// ```
/// use sampler::ring::Ring;
/// static RING: Ring<u32, 4> = Ring::new();
/// assert!(RING.push(1));
/// assert_eq!(RING.pop(), Some(1));
/// ```
pub struct Ring<T, const N: usize, const FILLED: bool = false> {
    slots: [Slot<T>; N],
    /// Usable capacity (`1..=N`), fixed before first use.
    cap: AtomicUsize,
    head: AtomicUsize,
    tail: AtomicUsize,
    taken: AtomicU64,
    delivered: AtomicU64,
    lost: AtomicU64,
    /// Part of `lost` already handed to the consumer by [`Ring::take_lost`].
    lost_reported: AtomicU64,
}

// SAFETY: slots are only accessed by the one producer that claimed a
// position (write) and the one consumer that claimed it (read), with the
// hand-over ordered by the slot stamp (release store / acquire load); a
// `T: Send` value thus moves between contexts but is never shared.
unsafe impl<T: Send, const N: usize, const F: bool> Sync for Ring<T, N, F> {}

/// A ring whose every slot always holds a value (see [`Ring`]).
pub type FilledRing<T, const N: usize> = Ring<T, N, true>;

impl<T, const N: usize, const F: bool> core::fmt::Debug for Ring<T, N, F> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Ring")
            .field("capacity", &self.capacity())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl<T, const N: usize> Default for Ring<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T, const N: usize> Ring<T, N> {
    /// An empty ring with usable capacity `N`.
    pub const fn new() -> Self {
        Self::with_slots([const { Slot::empty() }; N])
    }

    /// Makes the zeroed memory at `this` an empty ring with usable capacity
    /// `N`, so that a ring too large for a stack is built where it lives
    /// (allocated zeroed, then this). All zeroes is an empty ring but for
    /// its capacity: every slot free for its first lap (the stamps are
    /// relative to the index) and holding no value.
    ///
    /// # Safety
    /// 1. `this` is valid for writes of a `Self`, aligned for it, and every
    ///    byte of it is zero.
    /// 2. Nothing else reads or writes it until this returns.
    pub unsafe fn init_zeroed(this: *mut Self) {
        // SAFETY: obligations 1 and 2.
        unsafe { Self::init_capacity(this) };
    }

    /// Pops the oldest published value. Returns `None` when empty or when
    /// the oldest slot is claimed but not yet published (its producer was
    /// interrupted); call again later.
    pub fn pop(&self) -> Option<T> {
        let c = self.consume()?;
        // SAFETY: the consumer claim says the producer of this position
        // published a value and makes this context its only reader; `live`
        // is true for every published slot. The value is moved out, so the
        // slot is marked not live before the claim hands it back.
        let value = unsafe {
            *c.slot.live.get() = false;
            (*c.slot.value.get()).assume_init_read()
        };
        drop(c);
        self.delivered.fetch_add(1, Ordering::Relaxed);
        Some(value)
    }
}

impl<T: ConstDefault, const N: usize> Ring<T, N, true> {
    /// An empty ring with usable capacity `N` whose every slot already holds
    /// `T::EMPTY`, so [`Ring::push_with`] on a slot writes over it like any
    /// later one instead of initialising it first (a static ring of large
    /// records is filled at compile time).
    pub const fn new_filled() -> Self {
        Self::with_slots([const { Slot::filled() }; N])
    }

    /// Makes the zeroed memory at `this` an empty filled ring with usable
    /// capacity `N` (as [`Ring::new_filled`] makes one), so that a ring too
    /// large for a stack is built where it lives: allocated zeroed, then
    /// this, which writes `T::EMPTY` into every slot.
    ///
    /// # Safety
    /// 1. `this` is valid for writes of a `Self`, aligned for it, and every
    ///    byte of it is zero.
    /// 2. Nothing else reads or writes it until this returns.
    pub unsafe fn init_filled(this: *mut Self) {
        // SAFETY: obligations 1 and 2 (the capacity as in `init_zeroed`).
        unsafe { Ring::<T, N, true>::init_capacity(this) };
        for i in 0..N {
            // SAFETY: obligations 1 and 2: the slot is in bounds and ours;
            // its value is uninitialised memory, written whole, and its
            // flag (plain memory) overwritten.
            unsafe {
                let slot = (&raw mut (*this).slots).cast::<Slot<T>>().add(i);
                UnsafeCell::raw_get(&raw const (*slot).value)
                    .cast::<T>()
                    .write(T::EMPTY);
                (&raw mut (*slot).live).write(UnsafeCell::new(true));
            }
        }
    }
}

impl<T, const N: usize, const F: bool> Ring<T, N, F> {
    /// Writes the usable capacity `N` into the zeroed ring at `this`.
    ///
    /// # Safety
    /// As for [`Ring::init_zeroed`].
    unsafe fn init_capacity(this: *mut Self) {
        // SAFETY: the caller's obligations; the field is plain memory (a
        // zero `AtomicUsize`), overwritten whole.
        unsafe { (&raw mut (*this).cap).write(AtomicUsize::new(N)) };
    }

    /// An empty ring over `slots`, with usable capacity `N`.
    const fn with_slots(slots: [Slot<T>; N]) -> Self {
        // A power of two, so a position's slot is `pos & (cap - 1)`: one
        // instruction on the NMI path instead of a division.
        assert!(N.is_power_of_two(), "a ring's slots are a power of two");
        Ring {
            slots,
            cap: AtomicUsize::new(N),
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
            taken: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            lost_reported: AtomicU64::new(0),
        }
    }

    /// Limits the usable capacity to `cap`, a power of two in `1..=N`. Only
    /// before the first push: call it at boot (e.g. for `ring=N`).
    pub fn set_capacity(&self, cap: usize) -> Result<(), CapacityError> {
        if !cap.is_power_of_two() || cap > N {
            return Err(CapacityError::OutOfRange {
                requested: cap,
                max: N,
            });
        }
        if self.taken.load(Ordering::Acquire) != 0 || self.tail.load(Ordering::Acquire) != 0 {
            return Err(CapacityError::InUse);
        }
        self.cap.store(cap, Ordering::Release);
        Ok(())
    }

    /// The usable capacity.
    pub fn capacity(&self) -> usize {
        self.cap.load(Ordering::Relaxed)
    }

    /// Pushes `value`; NMI-safe. Returns false (and counts the loss) when
    /// the ring is full; the value is dropped.
    pub fn push(&self, value: T) -> bool {
        let Some(claim) = self.claim() else {
            return false;
        };
        // SAFETY: the claim gives this context exclusive ownership of the
        // slot (value and live flag) until it is dropped below; `live` says
        // whether the old value must be dropped before the write.
        unsafe {
            let live = &mut *claim.slot.live.get();
            let cell = &mut *claim.slot.value.get();
            if *live {
                cell.assume_init_drop();
            }
            cell.write(value);
            *live = true;
        }
        drop(claim);
        true
    }

    /// Pushes a value written in place; NMI-safe. `fill` gets the claimed
    /// slot as `&mut T`, holding the value the slot last held (left there by
    /// [`Ring::pop_with`]) or `T::default()` for a slot never used or moved
    /// out by [`Ring::pop`]; it must overwrite every part of the value it
    /// means to publish. Returns false (and counts the loss) when the ring
    /// is full; `fill` is then not called. The slot is published when
    /// `fill` returns, or unwinds.
    // Always inlined: it is the NMI path's one store into the ring, and
    // its cost is measured per instruction.
    #[inline(always)]
    pub fn push_with(&self, fill: impl FnOnce(&mut T)) -> bool
    where
        T: Default,
    {
        let Some(claim) = self.claim() else {
            return false;
        };
        // SAFETY: the claim gives this context exclusive ownership of the
        // slot until it is dropped (after `fill`); a slot that is not live
        // is initialised first, so the reference points to a valid `T`.
        let value = unsafe {
            let cell = &mut *claim.slot.value.get();
            // A filled ring's slots are always live: no test.
            if !F {
                let live = &mut *claim.slot.live.get();
                if !*live {
                    cell.write(T::default());
                    *live = true;
                }
            }
            cell.assume_init_mut()
        };
        fill(value);
        drop(claim);
        true
    }

    /// Claims the next producer position: counts the attempt, and the loss
    /// when the ring is full.
    #[inline]
    fn claim(&self) -> Option<Claim<'_, T>> {
        self.taken.fetch_add(1, Ordering::Relaxed);
        let cap = self.cap.load(Ordering::Relaxed);
        // SAFETY: `cap` is always a power of two in `1..=N`: `new` sets N
        // and `set_capacity` stores only values it checked.
        unsafe { core::hint::assert_unchecked(cap.is_power_of_two() && cap <= N) };
        let mut pos = self.tail.load(Ordering::Relaxed);
        loop {
            let index = pos & (cap - 1);
            // SAFETY: `index < cap <= N`.
            let slot = unsafe { self.slots.get_unchecked(index) };
            let base = index.wrapping_mul(2);
            let seq = slot.stamp.load(Ordering::Acquire).wrapping_add(base);
            let diff = seq.wrapping_sub(pos.wrapping_mul(2)) as isize;
            if diff == 0 {
                match self.tail.compare_exchange_weak(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    // The successful CAS gave this context exclusive
                    // ownership of position `pos`, whose slot the consumer
                    // has freed (stamp == pos); nobody else touches the
                    // slot until the claim's release store publishes it.
                    Ok(_) => return Some(Claim { slot, pos, base }),
                    Err(now) => pos = now,
                }
            } else if diff < 0 {
                // The slot still holds an unconsumed value: full.
                self.lost.fetch_add(1, Ordering::Relaxed);
                return None;
            } else {
                // Another producer claimed `pos` meanwhile: move on. The
                // tail has necessarily advanced; if it has not, the state
                // is inconsistent and the sample is dropped rather than
                // looping.
                let now = self.tail.load(Ordering::Relaxed);
                if now == pos {
                    self.lost.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
                pos = now;
            }
        }
    }

    /// Consumes the oldest published value in place: `read` gets it as
    /// `&mut T` and the slot keeps it (a later [`Ring::push_with`] reuses
    /// it). Returns `None`, without calling `read`, in the cases
    /// [`Ring::pop`] does.
    pub fn pop_with<R>(&self, read: impl FnOnce(&mut T) -> R) -> Option<R> {
        let c = self.consume()?;
        // SAFETY: as in `pop`: the published slot is live and owned by this
        // context until the claim is dropped, after `read`.
        let value = unsafe { (*c.slot.value.get()).assume_init_mut() };
        // Counted before `read` runs, so an unwinding `read` (which still
        // frees the slot) keeps `taken = delivered + lost` exact.
        self.delivered.fetch_add(1, Ordering::Relaxed);
        let r = read(value);
        drop(c);
        Some(r)
    }

    /// Claims the oldest published position for the consumer.
    fn consume(&self) -> Option<Consume<'_, T>> {
        let cap = self.cap.load(Ordering::Relaxed);
        let mut pos = self.head.load(Ordering::Relaxed);
        loop {
            let index = pos & (cap - 1);
            let slot = &self.slots[index];
            let base = index.wrapping_mul(2);
            let seq = slot.stamp.load(Ordering::Acquire).wrapping_add(base);
            let diff = seq.wrapping_sub(pos.wrapping_mul(2).wrapping_add(1)) as isize;
            if diff == 0 {
                match self.head.compare_exchange_weak(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    // The stamp (acquire) says the producer of `pos`
                    // published an initialised value, and the CAS made this
                    // context its only reader until the claim's release
                    // store hands the slot back.
                    Ok(_) => {
                        return Some(Consume {
                            slot,
                            pos,
                            base,
                            cap,
                        });
                    }
                    Err(now) => pos = now,
                }
            } else if diff < 0 {
                return None;
            } else {
                // Another consumer took `pos`; as above, never loop on an
                // unchanged head.
                let now = self.head.load(Ordering::Relaxed);
                if now == pos {
                    return None;
                }
                pos = now;
            }
        }
    }

    /// Losses not yet reported: returns the count since the previous call
    /// (the consumer turns it into a Lost record). Exact: every increment is
    /// reported exactly once.
    pub fn take_lost(&self) -> u64 {
        let total = self.lost.load(Ordering::Acquire);
        let reported = self.lost_reported.swap(total, Ordering::AcqRel);
        total.wrapping_sub(reported)
    }

    /// Whether losses wait to be reported ([`take_lost`](Self::take_lost)
    /// would return more than 0).
    pub fn lost_pending(&self) -> bool {
        self.lost.load(Ordering::Acquire) != self.lost_reported.load(Ordering::Acquire)
    }

    /// The counters. `taken == delivered + lost + len()` whenever no push
    /// or pop is in progress.
    pub fn stats(&self) -> RingStats {
        RingStats {
            taken: self.taken.load(Ordering::Acquire),
            delivered: self.delivered.load(Ordering::Acquire),
            lost: self.lost.load(Ordering::Acquire),
        }
    }

    /// Values currently claimed or published and not yet popped.
    pub fn len(&self) -> usize {
        let tail = self.tail.load(Ordering::Acquire);
        let head = self.head.load(Ordering::Acquire);
        tail.wrapping_sub(head)
    }

    /// True when no value is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T, const N: usize, const F: bool> Drop for Ring<T, N, F> {
    fn drop(&mut self) {
        // `&mut self`: no push or pop is in progress, so every slot is
        // either live (published, or consumed in place) or empty.
        for slot in &mut self.slots {
            if *slot.live.get_mut() {
                // SAFETY: a live slot holds an initialised value that
                // nothing else owns; it is dropped exactly once here.
                unsafe { slot.value.get_mut().assume_init_drop() };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zeroed_ring_made_in_place_works_like_a_new_one() {
        type R = Ring<u64, 8>;
        let layout = std::alloc::Layout::new::<R>();
        // SAFETY: the layout is not zero-sized.
        let p = unsafe { std::alloc::alloc_zeroed(layout) } as *mut R;
        assert!(!p.is_null());
        // SAFETY: `p` is zeroed, aligned memory for an `R`, used only here.
        unsafe { R::init_zeroed(p) };
        // SAFETY: initialised just above; freed below, after the last use.
        let r = unsafe { &*p };
        assert_eq!(r.capacity(), 8);
        for v in 0..8 {
            assert!(r.push(v));
        }
        assert!(!r.push(8));
        assert_eq!(
            (0..8).map(|_| r.pop().unwrap()).collect::<Vec<_>>(),
            (0..8).collect::<Vec<_>>()
        );
        assert_eq!(
            r.stats(),
            RingStats {
                taken: 9,
                delivered: 8,
                lost: 1
            }
        );
        // SAFETY: the ring is empty, so dropping it in place frees nothing
        // it holds; then the memory goes back with its layout.
        unsafe {
            core::ptr::drop_in_place(p);
            std::alloc::dealloc(p as *mut u8, layout);
        }
    }
    use proptest::prelude::*;
    use std::collections::VecDeque;

    #[test]
    fn fifo_and_full() {
        let r: Ring<u32, 4> = Ring::new();
        for i in 0..4 {
            assert!(r.push(i));
        }
        assert!(!r.lost_pending());
        assert!(!r.push(99), "full");
        assert!(r.lost_pending());
        assert_eq!(r.take_lost(), 1);
        assert!(!r.lost_pending());
        assert_eq!(r.take_lost(), 0, "reported once");
        for i in 0..4 {
            assert_eq!(r.pop(), Some(i));
        }
        assert_eq!(r.pop(), None);
        assert_eq!(
            r.stats(),
            RingStats {
                taken: 5,
                delivered: 4,
                lost: 1
            }
        );
    }

    #[test]
    fn runtime_capacity() {
        let r: Ring<u8, 8> = Ring::new();
        assert_eq!(
            r.set_capacity(9),
            Err(CapacityError::OutOfRange {
                requested: 9,
                max: 8
            })
        );
        assert!(r.set_capacity(0).is_err());
        for not_a_power_of_two in [3, 5, 6, 7] {
            assert_eq!(
                r.set_capacity(not_a_power_of_two),
                Err(CapacityError::OutOfRange {
                    requested: not_a_power_of_two,
                    max: 8
                })
            );
        }
        r.set_capacity(4).unwrap();
        assert_eq!(r.capacity(), 4);
        for round in 0..5u8 {
            for _ in 0..4 {
                assert!(r.push(round));
            }
            assert!(!r.push(round), "capped at 4");
            for _ in 0..4 {
                assert_eq!(r.pop(), Some(round));
            }
        }
        assert_eq!(r.set_capacity(8), Err(CapacityError::InUse));
    }

    #[test]
    fn an_unpublished_slot_stops_the_consumer_but_not_producers() {
        // Simulate "producer interrupted between claim and publish" by
        // claiming a position by hand.
        let r: Ring<u32, 4> = Ring::new();
        r.tail.store(1, Ordering::SeqCst); // position 0 claimed, unpublished
        r.taken.fetch_add(1, Ordering::SeqCst);
        assert!(r.push(7), "a nested producer takes the next slot");
        assert_eq!(r.pop(), None, "the consumer waits for position 0");
        // The interrupted producer publishes.
        // SAFETY: position 0 was claimed above by this test, and nothing
        // else reads slot 0 until its stamp is advanced.
        unsafe {
            (*r.slots[0].value.get()).write(6);
            *r.slots[0].live.get() = true;
        }
        r.slots[0].stamp.store(1, Ordering::Release); // 2 * 0 + 1: published
        assert_eq!(r.pop(), Some(6));
        assert_eq!(r.pop(), Some(7));
    }

    #[test]
    fn drops_remaining_values() {
        use std::rc::Rc;
        let counted = Rc::new(());
        {
            let r: Ring<Rc<()>, 4> = Ring::new();
            r.push(counted.clone());
            r.push(counted.clone());
            assert_eq!(Rc::strong_count(&counted), 3);
        }
        assert_eq!(Rc::strong_count(&counted), 1);
    }

    #[test]
    fn in_place_push_and_pop_reuse_the_slot_value() {
        let r: Ring<[u32; 4], 2> = Ring::new();
        assert!(r.push_with(|v| {
            assert_eq!(*v, [0; 4], "a never-used slot starts at Default");
            v[0] = 1;
        }));
        assert!(r.push_with(|v| v[1] = 2));
        assert!(!r.push_with(|_| panic!("not called when full")));
        assert_eq!(r.pop_with(|v| *v), Some([1, 0, 0, 0]));
        // Slot 0 kept its value: the producer sees it and overwrites.
        assert!(r.push_with(|v| {
            assert_eq!(*v, [1, 0, 0, 0]);
            *v = [7, 7, 7, 7];
        }));
        assert_eq!(r.pop(), Some([0, 2, 0, 0]));
        // Slot 1 was moved out: back to Default.
        assert!(r.push_with(|v| assert_eq!(*v, [0; 4])));
        assert_eq!(r.pop_with(|v| v[0]), Some(7));
        assert_eq!(r.pop_with(|v| v[0]), Some(0));
        assert_eq!(r.pop_with(|_| ()), None);
        assert_eq!(
            r.stats(),
            RingStats {
                taken: 5,
                delivered: 4,
                lost: 1
            }
        );
    }

    #[test]
    fn a_filled_ring_made_in_place_holds_the_const_value_in_every_slot() {
        #[derive(Debug, Default, PartialEq)]
        struct V(u64);
        impl ConstDefault for V {
            const EMPTY: Self = V(5);
        }
        type R = FilledRing<V, 8>;
        let layout = std::alloc::Layout::new::<R>();
        // SAFETY: the layout is not zero-sized.
        let p = unsafe { std::alloc::alloc_zeroed(layout) } as *mut R;
        assert!(!p.is_null());
        // SAFETY: `p` is zeroed, aligned memory for an `R`, used only here.
        unsafe { R::init_filled(p) };
        // SAFETY: initialised just above; freed below.
        let r = unsafe { &*p };
        assert_eq!(r.capacity(), 8);
        for i in 0..8 {
            assert!(r.push_with(|v| {
                assert_eq!(*v, V(5), "slot {i} holds the const value");
                v.0 = i;
            }));
        }
        assert!(!r.push_with(|_| ()), "full");
        assert_eq!(r.pop_with(|v| v.0), Some(0));
        // SAFETY: `p` came from `alloc_zeroed` with this layout; the ring is
        // dropped in place first.
        unsafe {
            core::ptr::drop_in_place(p);
            std::alloc::dealloc(p.cast(), layout);
        }
    }

    #[test]
    fn a_filled_ring_starts_every_slot_at_the_const_value() {
        use std::rc::Rc;
        #[derive(Debug, PartialEq)]
        struct Held(u32, Option<Rc<()>>);
        impl ConstDefault for Held {
            const EMPTY: Self = Held(7, None);
        }
        impl Default for Held {
            fn default() -> Self {
                Held(99, None)
            }
        }
        let counted = Rc::new(());
        {
            let r: FilledRing<Held, 4> = Ring::new_filled();
            for _ in 0..4 {
                assert!(r.push_with(|h| {
                    assert_eq!(h.0, 7, "the const value, not Default");
                    h.1 = Some(counted.clone());
                }));
            }
            assert_eq!(r.pop_with(|h| h.0), Some(7));
            assert_eq!(r.pop_with(|h| h.0), Some(7));
            // Consumed in place: the next push sees the slot's last value,
            // never Default.
            assert!(r.push_with(|h| assert!(h.0 == 7 && h.1.is_some())));
            assert_eq!(Rc::strong_count(&counted), 5);
        }
        assert_eq!(Rc::strong_count(&counted), 1, "live slots dropped once");
    }

    #[test]
    fn values_consumed_in_place_are_dropped_once() {
        use std::rc::Rc;
        #[derive(Default)]
        struct Held(Option<Rc<()>>);
        let counted = Rc::new(());
        {
            let r: Ring<Held, 4> = Ring::new();
            r.push_with(|h| h.0 = Some(counted.clone()));
            r.push(Held(Some(counted.clone())));
            r.push(Held(Some(counted.clone())));
            assert_eq!(Rc::strong_count(&counted), 4);
            r.pop_with(|_| ()); // stays in its slot
            assert!(r.pop().is_some()); // moved out and dropped
            assert_eq!(Rc::strong_count(&counted), 3);
            // `push` over a slot consumed in place drops the old value.
            for _ in 0..3 {
                r.pop_with(|_| ());
                r.push(Held(None));
            }
            assert_eq!(Rc::strong_count(&counted), 2);
        }
        assert_eq!(
            Rc::strong_count(&counted),
            1,
            "the rest dropped with the ring"
        );
    }

    #[test]
    fn a_panicking_fill_or_read_still_publishes_and_frees() {
        let r: Ring<u32, 2> = Ring::new();
        let p = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            r.push_with(|v| {
                *v = 5;
                panic!("fill failed");
            })
        }));
        assert!(p.is_err());
        assert_eq!(r.pop_with(|v| *v), Some(5), "published, not stuck");
        assert!(r.push(6));
        let p = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            r.pop_with(|_| panic!("read failed"))
        }));
        assert!(p.is_err());
        assert!(r.push(7) && r.push(8), "the slot was handed back");
        let s = r.stats();
        assert_eq!(s.taken, s.delivered + s.lost + r.len() as u64);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Push(u16),
        PushWith(u16),
        Pop,
        PopWith,
        Lost,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            any::<u16>().prop_map(Op::Push),
            any::<u16>().prop_map(Op::PushWith),
            Just(Op::Pop),
            Just(Op::PopWith),
            Just(Op::Lost)
        ]
    }

    proptest! {
        /// The ring behaves like a bounded FIFO that drops when full, with
        /// exact counters, for any capacity and operation sequence
        /// (positions wrap the slot array many times).
        #[test]
        fn matches_a_bounded_fifo(cap_log2 in 0u32..=3, ops in proptest::collection::vec(op(), 0..400)) {
            let cap = 1usize << cap_log2;
            let r: Ring<u16, 8> = Ring::new();
            r.set_capacity(cap).unwrap();
            let mut model = VecDeque::new();
            let (mut taken, mut lost, mut unreported) = (0u64, 0u64, 0u64);
            for op in ops {
                match op {
                    Op::Push(v) => {
                        taken += 1;
                        let fits = model.len() < cap;
                        prop_assert_eq!(r.push(v), fits);
                        if fits { model.push_back(v) } else { lost += 1; unreported += 1; }
                    }
                    Op::PushWith(v) => {
                        taken += 1;
                        let fits = model.len() < cap;
                        prop_assert_eq!(r.push_with(|slot| *slot = v), fits);
                        if fits { model.push_back(v) } else { lost += 1; unreported += 1; }
                    }
                    Op::Pop => prop_assert_eq!(r.pop(), model.pop_front()),
                    Op::PopWith => prop_assert_eq!(r.pop_with(|v| *v), model.pop_front()),
                    Op::Lost => { prop_assert_eq!(r.take_lost(), unreported); unreported = 0; }
                }
                prop_assert_eq!(r.len(), model.len());
                let s = r.stats();
                prop_assert_eq!(s.taken, taken);
                prop_assert_eq!(s.lost, lost);
                prop_assert_eq!(s.taken, s.delivered + s.lost + model.len() as u64);
            }
        }
    }
}
