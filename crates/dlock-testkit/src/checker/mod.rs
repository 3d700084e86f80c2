//! The safety checker: a fenced resource that records every hold and every write, rejects
//! writes whose fence is lower than the highest it has accepted, and proves afterwards that no
//! two holds overlapped unless the earlier holder was told it had lost its lock.
//!
//! [`FencedResource`] is the record, usable in-process (the conformance suite uses it from
//! tasks). [`service`] puts it behind a loopback TCP port so worker OS processes
//! ([`worker`], the `dlock-safety-worker` binary) can write through it, and [`scenario`]
//! runs a workload of such processes under one fault and reports what happened.

pub mod canary;
pub mod election;
pub mod scenario;
pub mod service;
pub mod worker;

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use dlock::FencingToken;

/// How late a lost signal may reach the checker after the moment it was due (a later
/// holder's `BEGIN`, a stale write, a lease's end) and still count as on time: the signal
/// travels from the guard to a watcher task and over a loopback connection shared with the
/// holder's writes, and the machine that runs the suite is shared. Stated in RELIABILITY.md.
pub const SIGNAL_TOLERANCE: Duration = Duration::from_millis(50);

/// What a hold excludes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HoldKind {
    /// A mutex, a writer, a multi-lock: nobody else at once.
    #[default]
    Exclusive,
    /// A reader: other readers may hold at once, writers may not.
    Read,
    /// A semaphore permit: at most [`FencedResource::with_permits`] at once.
    Permit,
}

impl HoldKind {
    /// The letter of the service's `BEGIN` line (`w`, `r`, `p`).
    pub fn letter(self) -> &'static str {
        match self {
            HoldKind::Exclusive => "w",
            HoldKind::Read => "r",
            HoldKind::Permit => "p",
        }
    }

    /// The inverse of [`letter`](Self::letter).
    pub fn from_letter(letter: &str) -> Option<HoldKind> {
        match letter {
            "w" => Some(HoldKind::Exclusive),
            "r" => Some(HoldKind::Read),
            "p" => Some(HoldKind::Permit),
            _ => None,
        }
    }

    /// Whether a hold of this kind and one of `other` may not be open at once.
    fn excludes(self, other: HoldKind) -> bool {
        !matches!(
            (self, other),
            (HoldKind::Read, HoldKind::Read) | (HoldKind::Permit, HoldKind::Permit)
        )
    }
}

/// A write refused because a later holder has already written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StaleWrite {
    /// The fence of the refused write.
    pub fence: FencingToken,
    /// The highest fence accepted so far.
    pub highest: FencingToken,
    /// When the resource received it.
    pub at: Instant,
}

/// One hold as the resource saw it: from the holder's first message after its acquire
/// returned to its last message before it released, so the recorded interval lies inside the
/// real hold and an overlap of two recorded holds is a real overlap. A multi-lock's hold is
/// one `Hold` per name (its `part`), all of one `group`, begun, told and ended together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hold {
    /// The hold's fence (on its name).
    pub fence: FencingToken,
    /// What it excludes.
    pub kind: HoldKind,
    /// Which of the lock's names it is on: 0, or a multi-lock's name's index. Holds on
    /// different names never overlap and their fences are not compared.
    pub part: usize,
    /// The holds begun together (a multi-lock's names) share this number; unique otherwise.
    pub group: u64,
    /// A composed semaphore's permit: the index of the slot lock it holds
    /// (`<name>#p<slot>of<permits>`), whose fences must grow hold after hold. `None` for
    /// every other hold, and for a native permit (ordered by
    /// [`FencedResource::with_ordered_permits`] instead).
    pub slot: Option<u32>,
    /// The worker that reported it, if it said.
    pub worker: Option<u32>,
    /// When the worker said it was about to acquire (its `ATTEMPT`), if it did: the grant came
    /// after this.
    pub attempted: Option<Instant>,
    /// Its `BEGIN`: just after the holder's acquire returned.
    pub start: Instant,
    /// Its `END`: just before the holder released (`None`: still open).
    pub end: Option<Instant>,
    /// When the holder's guard reported the lock lost, if it did before the hold ended.
    pub lost_at: Option<Instant>,
}

impl Hold {
    /// Whether the holder had been told of the loss by `at` (within [`SIGNAL_TOLERANCE`]).
    pub fn told_by(&self, at: Instant) -> bool {
        self.lost_at
            .is_some_and(|lost| lost <= at + SIGNAL_TOLERANCE)
    }
}

#[derive(Debug, Default)]
struct Record {
    highest: Option<FencingToken>,
    accepted: usize,
    rejected: Vec<StaleWrite>,
    /// Writes an unfenced resource accepted although a later holder had already written.
    unsafe_writes: Vec<StaleWrite>,
    holds: Vec<Hold>,
    /// Each worker's last `ATTEMPT`.
    attempts: HashMap<u32, Instant>,
    next_group: u64,
}

/// A resource protected by fencing tokens, as the Kleppmann argument asks of one.
#[derive(Debug)]
pub struct FencedResource {
    fenced: bool,
    permits: u32,
    ordered_permits: bool,
    record: Mutex<Record>,
}

impl Default for FencedResource {
    fn default() -> FencedResource {
        FencedResource {
            fenced: true,
            permits: 1,
            ordered_permits: false,
            record: Mutex::default(),
        }
    }
}

/// Two holds whose recorded intervals intersect although their kinds exclude each other (or
/// a permit hold that began while every permit was held).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overlap {
    /// The fence of the hold that started first.
    pub earlier: FencingToken,
    /// Its worker, if it said.
    pub earlier_worker: Option<u32>,
    /// Its group ([`Hold::group`]).
    pub earlier_group: u64,
    /// The name both are on ([`Hold::part`]).
    pub part: usize,
    /// The fence of the hold that started while the earlier one was still open.
    pub later: FencingToken,
    /// When the later hold started.
    pub at: Instant,
    /// Whether the earlier holder had been told it lost the lock by then (within
    /// [`SIGNAL_TOLERANCE`]); a signal that came later does not count.
    pub signalled: bool,
}

/// What the checker found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckReport {
    /// Holds recorded.
    pub holds: usize,
    /// Pairs of holds whose intervals intersect although the earlier holder had not been told
    /// it had lost the lock when the later one began: violations of mutual exclusion (must be
    /// empty outside a fault that loses the store's data).
    pub overlaps: Vec<(FencingToken, FencingToken)>,
    /// Pairs of holds whose intervals intersect after the earlier holder's guard reported the
    /// lock lost (a paused or cut-off holder that kept going: the fence must protect these).
    pub lost_overlaps: Vec<(FencingToken, FencingToken)>,
    /// Writes accepted.
    pub accepted: usize,
    /// Writes refused as stale.
    pub rejected: Vec<StaleWrite>,
    /// Writes refused as stale whose holder had not been told of its loss when it wrote
    /// (within [`SIGNAL_TOLERANCE`]): the guard said "held" to a holder that no longer was.
    pub stale_unsignalled: Vec<StaleWrite>,
    /// Writes an unfenced resource ([`FencedResource::unfenced`]) accepted from a holder whose
    /// successor had already written: the lost updates fencing exists to prevent.
    pub unsafe_writes: usize,
    /// Holds whose guard reported the lock lost before the hold ended.
    pub lost_holds: usize,
    /// Holds whose fence was not greater than every fence of the holds that started before
    /// it and exclude it (must be 0: fences are monotonic per lock name).
    pub fence_regressions: Vec<(FencingToken, FencingToken)>,
    /// Every overlap, with when it began.
    pub overlap_details: Vec<Overlap>,
}

impl FencedResource {
    /// A fresh resource.
    pub fn new() -> FencedResource {
        FencedResource::default()
    }

    /// A resource that accepts every write, fence or not (the canary: the same workload
    /// without fencing), counting the writes a fenced one would have refused as
    /// [`CheckReport::unsafe_writes`].
    pub fn unfenced() -> FencedResource {
        FencedResource {
            fenced: false,
            ..FencedResource::default()
        }
    }

    /// The same resource admitting `permits` [`HoldKind::Permit`] holds at once (a
    /// semaphore's); fences of permits are compared only on one slot
    /// ([`begin_on_slot`](Self::begin_on_slot)), or in the order of their grants with
    /// [`with_ordered_permits`](Self::with_ordered_permits).
    pub fn with_permits(self, permits: u32) -> FencedResource {
        FencedResource {
            permits: permits.max(1),
            ..self
        }
    }

    /// The same resource checking that permits' fences follow the order of their grants, as
    /// a native semaphore promises ("greater than every earlier permit's of the semaphore"):
    /// a permit whose acquire began after another permit's hold had begun must carry a
    /// greater fence. (A composed semaphore's fences grow per slot only.)
    pub fn with_ordered_permits(self) -> FencedResource {
        FencedResource {
            ordered_permits: true,
            ..self
        }
    }

    /// Whether stale writes are refused.
    pub fn is_fenced(&self) -> bool {
        self.fenced
    }

    fn record(&self) -> std::sync::MutexGuard<'_, Record> {
        self.record.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes with `fence`: accepted unless a higher fence has already written (an unfenced
    /// resource accepts it anyway and counts it as unsafe).
    pub fn write(&self, fence: FencingToken) -> Result<(), StaleWrite> {
        let mut record = self.record();
        match record.highest {
            Some(highest) if fence < highest => {
                let stale = StaleWrite {
                    fence,
                    highest,
                    at: Instant::now(),
                };
                if self.fenced {
                    record.rejected.push(stale);
                    Err(stale)
                } else {
                    record.unsafe_writes.push(stale);
                    record.accepted += 1;
                    Ok(())
                }
            }
            _ => {
                record.highest = Some(fence);
                record.accepted += 1;
                Ok(())
            }
        }
    }

    /// Reads with `fence` (a reader's): refused like a write when a higher fence has already
    /// written, but it raises nothing, since readers share the lock.
    pub fn read(&self, fence: FencingToken) -> Result<(), StaleWrite> {
        let mut record = self.record();
        match record.highest {
            Some(highest) if fence < highest => {
                let stale = StaleWrite {
                    fence,
                    highest,
                    at: Instant::now(),
                };
                if self.fenced {
                    record.rejected.push(stale);
                    Err(stale)
                } else {
                    record.unsafe_writes.push(stale);
                    Ok(())
                }
            }
            _ => Ok(()),
        }
    }

    /// Marks the start of an exclusive hold; call [`end_hold`](Self::end_hold) with the same
    /// fence when it ends.
    pub fn begin_hold(&self, fence: FencingToken) {
        self.begin_hold_of(fence, None);
    }

    /// Marks the start of an exclusive hold by `worker` (a process or task id of the caller's
    /// choosing).
    pub fn begin_hold_of(&self, fence: FencingToken, worker: Option<u32>) {
        self.begin(fence, HoldKind::Exclusive, worker);
    }

    /// Records that `worker` is about to acquire: its next hold's grant comes after now.
    pub fn attempt(&self, worker: u32) {
        self.record().attempts.insert(worker, Instant::now());
    }

    /// Marks the start of a hold of `kind` by `worker`.
    pub fn begin(&self, fence: FencingToken, kind: HoldKind, worker: Option<u32>) {
        self.begin_parts(&[fence], kind, worker);
    }

    /// Marks the start of a hold of `kind` by `worker` on several names at once (a multi-lock:
    /// one fence per name, in the order of its names); its `LOST` and `END`, given the first
    /// name's fence, apply to every name.
    pub fn begin_parts(&self, fences: &[FencingToken], kind: HoldKind, worker: Option<u32>) {
        self.begin_on(fences, kind, None, worker);
    }

    /// Marks the start of a composed semaphore's permit by `worker` on its slot lock number
    /// `slot`: its fence must exceed every earlier permit's on that slot.
    pub fn begin_on_slot(&self, fence: FencingToken, slot: u32, worker: Option<u32>) {
        self.begin_on(&[fence], HoldKind::Permit, Some(slot), worker);
    }

    fn begin_on(
        &self,
        fences: &[FencingToken],
        kind: HoldKind,
        slot: Option<u32>,
        worker: Option<u32>,
    ) {
        let start = Instant::now();
        let mut record = self.record();
        let group = record.next_group;
        record.next_group += 1;
        let attempted = worker.and_then(|w| record.attempts.get(&w).copied());
        for (part, &fence) in fences.iter().enumerate() {
            record.holds.push(Hold {
                fence,
                kind,
                part,
                group,
                slot,
                worker,
                attempted,
                start,
                end: None,
                lost_at: None,
            });
        }
    }

    /// Every open hold of the group of the open hold with `fence` (of `worker`, when given: a
    /// composed semaphore's slots have fences of their own, so two permits may carry the same
    /// one).
    fn open_group(
        record: &mut Record,
        fence: FencingToken,
        worker: Option<u32>,
    ) -> impl Iterator<Item = &mut Hold> {
        let group = record
            .holds
            .iter()
            .rev()
            .find(|hold| {
                hold.fence == fence
                    && hold.end.is_none()
                    && worker.is_none_or(|w| hold.worker == Some(w))
            })
            .map(|hold| hold.group);
        record
            .holds
            .iter_mut()
            .filter(move |hold| Some(hold.group) == group && hold.end.is_none())
    }

    /// Marks the end of the hold started with `fence`.
    pub fn end_hold(&self, fence: FencingToken) {
        self.end_hold_of(fence, None);
    }

    /// Marks the end of the hold started with `fence` by `worker` (any worker if `None`).
    pub fn end_hold_of(&self, fence: FencingToken, worker: Option<u32>) {
        self.end_hold_of_at(fence, worker, Instant::now());
    }

    /// [`end_hold_of`](Self::end_hold_of), the hold ending `at` (a killed holder's: when the
    /// kill was sent, not when the test got round to recording it, by which time the next
    /// holder may already have begun).
    pub fn end_hold_of_at(&self, fence: FencingToken, worker: Option<u32>, at: Instant) {
        for hold in Self::open_group(&mut self.record(), fence, worker) {
            hold.end = Some(at);
        }
    }

    /// Records that the guard of the open hold with `fence` reported the lock lost (ignored
    /// when that hold has already ended: a guard's lost signal also completes on release).
    pub fn hold_lost(&self, fence: FencingToken) {
        self.hold_lost_of(fence, None);
    }

    /// [`hold_lost`](Self::hold_lost) for the hold of `worker` (any worker if `None`).
    pub fn hold_lost_of(&self, fence: FencingToken, worker: Option<u32>) {
        let now = Instant::now();
        for hold in Self::open_group(&mut self.record(), fence, worker) {
            hold.lost_at.get_or_insert(now);
        }
    }

    /// The worker of a hold that has not ended, if any.
    pub fn current_holder(&self) -> Option<(FencingToken, Option<u32>)> {
        self.record()
            .holds
            .iter()
            .rev()
            .find(|hold| hold.end.is_none() && hold.part == 0)
            .map(|hold| (hold.fence, hold.worker))
    }

    /// The newest hold that has not ended (a multi-lock's by its first name), if any.
    pub fn newest_open_hold(&self) -> Option<Hold> {
        self.record()
            .holds
            .iter()
            .filter(|hold| hold.end.is_none() && hold.part == 0)
            .max_by_key(|hold| hold.start)
            .copied()
    }

    /// The newest open hold (a multi-lock's by its first name) that began at least `age` ago,
    /// if any.
    pub fn open_hold_held_for(&self, age: Duration) -> Option<Hold> {
        self.record()
            .holds
            .iter()
            .filter(|hold| hold.end.is_none() && hold.part == 0 && hold.start.elapsed() >= age)
            .max_by_key(|hold| hold.start)
            .copied()
    }

    /// When the guard of the hold with `fence` (of `worker`, when given) that was held at `at`
    /// reported the lock lost, if it did: the latest such hold begun by then, since a composed
    /// semaphore's slots have fences of their own and one worker may carry the same fence on
    /// two slots, one after the other.
    pub fn lost_at(
        &self,
        fence: FencingToken,
        worker: Option<u32>,
        at: Instant,
    ) -> Option<Instant> {
        self.record()
            .holds
            .iter()
            .filter(|hold| {
                hold.part == 0
                    && hold.fence == fence
                    && hold.start <= at
                    && worker.is_none_or(|w| hold.worker == Some(w))
            })
            .max_by_key(|hold| hold.start)
            .and_then(|hold| hold.lost_at)
    }

    /// Every hold recorded so far, in the order they began.
    pub fn holds(&self) -> Vec<Hold> {
        let mut holds = self.record().holds.clone();
        holds.sort_by_key(|hold| hold.start);
        holds
    }

    /// The holds open at `at` (started before, not ended), with when each was reported lost
    /// (a multi-lock's once, by its first name's fence).
    pub fn holds_open_at(&self, at: Instant) -> Vec<(FencingToken, Option<Instant>)> {
        self.record()
            .holds
            .iter()
            .filter(|hold| {
                hold.part == 0 && hold.start <= at && hold.end.is_none_or(|end| end > at)
            })
            .map(|hold| (hold.fence, hold.lost_at))
            .collect()
    }

    /// Holds that started at or after `since` (a multi-lock's once).
    pub fn holds_since(&self, since: Instant) -> Vec<Instant> {
        self.record()
            .holds
            .iter()
            .filter(|hold| hold.part == 0 && hold.start >= since)
            .map(|hold| hold.start)
            .collect()
    }

    /// Checks every recorded hold against every other: holds that exclude each other must not
    /// be open at once unless the earlier holder had been told of its loss when the later one
    /// began; every stale write must come from a holder already told; fences must grow.
    pub fn report(&self) -> CheckReport {
        let record = self.record();
        let now = Instant::now();
        let mut holds: Vec<Hold> = record.holds.clone();
        holds.sort_by_key(|hold| hold.start);
        let (overlap_details, fence_regressions) =
            judge_holds(&holds, self.permits, self.ordered_permits, now);
        let (lost_overlaps, overlaps) = overlap_details
            .iter()
            .map(|o| (o.signalled, (o.earlier, o.later)))
            .partition::<Vec<_>, _>(|(signalled, _)| *signalled);
        // A stale write is the holder's own fault unless its guard had said "lost" before it.
        // Writes go through the first name's fence.
        let told_before = |stale: &StaleWrite| {
            holds
                .iter()
                .filter(|hold| {
                    hold.part == 0 && hold.fence == stale.fence && hold.start <= stale.at
                })
                .any(|hold| hold.told_by(stale.at))
        };
        let stale_unsignalled = record
            .rejected
            .iter()
            .filter(|stale| !told_before(stale))
            .copied()
            .collect();
        CheckReport {
            holds: holds.iter().filter(|hold| hold.part == 0).count(),
            overlaps: overlaps.into_iter().map(|(_, pair)| pair).collect(),
            lost_overlaps: lost_overlaps.into_iter().map(|(_, pair)| pair).collect(),
            accepted: record.accepted,
            rejected: record.rejected.clone(),
            stale_unsignalled,
            unsafe_writes: record.unsafe_writes.len(),
            lost_holds: holds
                .iter()
                .filter(|hold| hold.part == 0 && hold.lost_at.is_some())
                .count(),
            fence_regressions,
            overlap_details,
        }
    }
}

/// The overlaps and fence regressions among `holds` (sorted by start), name by name: a
/// multi-lock's hold is judged on each of its names against every other hold of that name.
/// `permits` holds of [`HoldKind::Permit`] may be open at once; with `ordered_permits` their
/// fences must follow the order of their grants.
fn judge_holds(
    holds: &[Hold],
    permits: u32,
    ordered_permits: bool,
    now: Instant,
) -> (Vec<Overlap>, Vec<(FencingToken, FencingToken)>) {
    let mut overlap_details = Vec::new();
    let mut fence_regressions = Vec::new();
    let parts = holds
        .iter()
        .map(|hold| hold.part)
        .max()
        .map_or(0, |max| max + 1);
    for part in 0..parts {
        let holds: Vec<&Hold> = holds.iter().filter(|hold| hold.part == part).collect();
        fence_regressions.extend(fence_regressions_of(&holds, ordered_permits));
        overlap_details.extend(overlaps_of(&holds, permits, now));
    }
    (overlap_details, fence_regressions)
}

/// The fence regressions among the holds of one name, sorted by start.
fn fence_regressions_of(
    holds: &[&Hold],
    ordered_permits: bool,
) -> Vec<(FencingToken, FencingToken)> {
    let mut regressions = Vec::new();
    // A hold's fence must exceed every fence of an earlier hold it excludes: readers may
    // begin in another order than their fences (two grants in flight at once), and a
    // composed semaphore's fences come from its slots.
    let (mut highest, mut highest_excluding_reads) = (None, None);
    // A composed semaphore's slot is a lock of its own: its permits' fences grow hold after
    // hold, as a mutex's do (RELIABILITY.md, promise 2); permits of different slots are not
    // compared.
    let mut highest_on_slot: HashMap<u32, FencingToken> = HashMap::new();
    for hold in holds {
        let bound = match (hold.kind, hold.slot) {
            (HoldKind::Exclusive, _) => highest,
            (HoldKind::Read, _) => highest_excluding_reads,
            (HoldKind::Permit, Some(slot)) => highest_on_slot.get(&slot).copied(),
            (HoldKind::Permit, None) => None,
        };
        if let Some(slot) = hold.slot {
            let high = highest_on_slot.entry(slot).or_insert(hold.fence);
            *high = (*high).max(hold.fence);
        }
        if let Some(high) = bound.filter(|high| hold.fence <= *high) {
            regressions.push((high, hold.fence));
        }
        if hold.kind != HoldKind::Permit {
            highest = highest.max(Some(hold.fence));
        }
        if hold.kind == HoldKind::Exclusive {
            highest_excluding_reads = highest_excluding_reads.max(Some(hold.fence));
        }
    }
    if ordered_permits {
        // Native permits: a permit whose acquire began (its `ATTEMPT`) after another permit's
        // hold began was granted after it, so its fence must be greater. Two acquires in
        // flight at once may be granted in either order, so nothing is said of those.
        let permits: Vec<&Hold> = holds
            .iter()
            .copied()
            .filter(|hold| hold.kind == HoldKind::Permit)
            .collect();
        // The highest fence of the permits begun so far, in start order.
        let highest_so_far: Vec<FencingToken> = permits
            .iter()
            .scan(None, |high: &mut Option<FencingToken>, hold| {
                *high = (*high).max(Some(hold.fence));
                *high
            })
            .collect();
        for later in &permits {
            let Some(attempted) = later.attempted else {
                continue;
            };
            let begun_before = permits.partition_point(|hold| hold.start < attempted);
            if let Some(&high) = begun_before
                .checked_sub(1)
                .and_then(|i| highest_so_far.get(i))
                .filter(|high| later.fence <= **high)
            {
                regressions.push((high, later.fence));
            }
        }
    }
    regressions
}

/// The overlaps among the holds of one name, sorted by start.
fn overlaps_of(holds: &[&Hold], permits: u32, now: Instant) -> Vec<Overlap> {
    let mut overlaps = Vec::new();
    let overlap = |earlier: &Hold, later: &Hold, signalled| Overlap {
        earlier: earlier.fence,
        earlier_worker: earlier.worker,
        earlier_group: earlier.group,
        part: earlier.part,
        later: later.fence,
        at: later.start,
        signalled,
    };
    for (i, earlier) in holds.iter().enumerate() {
        let earlier_end = earlier.end.unwrap_or(now);
        for later in holds[i + 1..]
            .iter()
            .take_while(|later| later.start < earlier_end)
            .filter(|later| earlier.kind.excludes(later.kind))
        {
            overlaps.push(overlap(earlier, later, earlier.told_by(later.start)));
        }
    }
    // Permits: a permit hold that began while every permit was already held overlaps the
    // earliest of them; it is signalled only if enough of them had been told.
    let permits = usize::try_from(permits).unwrap_or(usize::MAX);
    for (i, later) in holds.iter().enumerate() {
        if later.kind != HoldKind::Permit {
            continue;
        }
        let open: Vec<&Hold> = holds[..i]
            .iter()
            .copied()
            .filter(|h| h.kind == HoldKind::Permit && h.end.unwrap_or(now) > later.start)
            .collect();
        if open.len() < permits {
            continue;
        }
        let untold: Vec<&Hold> = open
            .iter()
            .copied()
            .filter(|h| !h.told_by(later.start))
            .collect();
        let first = untold.first().copied().unwrap_or(open[0]);
        overlaps.push(overlap(first, later, untold.len() < permits));
    }
    overlaps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_overlaps_and_rejects_stale_writes() {
        let resource = FencedResource::new();
        let (one, two) = (FencingToken::new(1), FencingToken::new(2));
        resource.begin_hold(one);
        resource.write(one).unwrap();
        resource.begin_hold(two);
        resource.write(two).unwrap();
        let stale = resource.write(one).unwrap_err();
        assert_eq!((stale.fence, stale.highest), (one, two));
        resource.end_hold(one);
        resource.end_hold(two);
        let report = resource.report();
        assert_eq!(report.overlaps, vec![(one, two)]);
        assert_eq!(
            (report.accepted, report.rejected.len(), report.holds),
            (2, 1, 2)
        );
    }

    #[test]
    fn the_loss_of_a_frozen_permit_is_found_when_its_fence_repeats_another_slots() {
        // A composed semaphore: the worker held slot 0 at fence 5, released it, and later
        // holds slot 1, whose own counter also stands at 5, when it is frozen and then told.
        let resource = FencedResource::new();
        let fence = FencingToken::new(5);
        resource.begin_on_slot(fence, 0, Some(2));
        resource.end_hold_of(fence, Some(2));
        std::thread::sleep(Duration::from_millis(2));
        resource.begin_on_slot(fence, 1, Some(2));
        let stopped = Instant::now();
        resource.hold_lost_of(fence, Some(2));
        assert!(resource.lost_at(fence, Some(2), stopped).is_some());
    }

    #[test]
    fn sequential_holds_do_not_overlap() {
        let resource = FencedResource::new();
        for i in 1..=3 {
            let fence = FencingToken::new(i);
            resource.begin_hold(fence);
            resource.write(fence).unwrap();
            resource.end_hold(fence);
        }
        assert!(resource.report().overlaps.is_empty());
    }

    #[test]
    fn an_overlap_after_a_reported_loss_is_not_a_violation() {
        let resource = FencedResource::new();
        let (one, two) = (FencingToken::new(1), FencingToken::new(2));
        resource.begin_hold(one);
        resource.hold_lost(one);
        resource.begin_hold(two);
        resource.end_hold(one);
        resource.end_hold(two);
        resource.hold_lost(two); // after its end: a release, not a loss
        let report = resource.report();
        assert!(report.overlaps.is_empty());
        assert_eq!(report.lost_overlaps, vec![(one, two)]);
        assert_eq!(report.lost_holds, 1);
    }

    #[test]
    fn a_signal_after_the_takeover_does_not_excuse_the_overlap() {
        let resource = FencedResource::new();
        let (one, two) = (FencingToken::new(1), FencingToken::new(2));
        resource.begin_hold(one);
        resource.begin_hold(two);
        std::thread::sleep(SIGNAL_TOLERANCE * 2);
        resource.hold_lost(one); // told, but long after the later holder began
        resource.end_hold(one);
        resource.end_hold(two);
        let report = resource.report();
        assert_eq!(report.overlaps, vec![(one, two)]);
        assert!(report.lost_overlaps.is_empty());
    }

    #[test]
    fn a_stale_write_before_the_signal_is_unsignalled() {
        let resource = FencedResource::new();
        let (one, two) = (FencingToken::new(1), FencingToken::new(2));
        resource.begin_hold(one);
        resource.write(one).unwrap();
        resource.begin_hold(two);
        resource.write(two).unwrap();
        resource.write(one).unwrap_err();
        std::thread::sleep(SIGNAL_TOLERANCE * 2);
        resource.hold_lost(one);
        resource.end_hold(one);
        resource.end_hold(two);
        let report = resource.report();
        assert_eq!(report.stale_unsignalled.len(), 1);
        assert_eq!(report.stale_unsignalled[0].fence, one);
    }

    #[test]
    fn readers_share_and_permits_count() {
        let resource = FencedResource::new().with_permits(2);
        let f = FencingToken::new;
        resource.begin(f(1), HoldKind::Read, None);
        resource.begin(f(2), HoldKind::Read, None);
        resource.end_hold(f(1));
        resource.end_hold(f(2));
        resource.begin(f(3), HoldKind::Permit, None);
        resource.begin(f(4), HoldKind::Permit, None);
        assert!(resource.report().overlaps.is_empty());
        resource.begin(f(5), HoldKind::Permit, None);
        assert_eq!(resource.report().overlaps, vec![(f(3), f(5))]);
        resource.begin(f(6), HoldKind::Exclusive, None);
        let report = resource.report();
        assert_eq!(report.overlaps.len(), 4, "{report:?}");
    }

    #[test]
    fn a_repeated_fence_is_a_regression() {
        let resource = FencedResource::new();
        for fence in [1, 2, 2, 3] {
            let fence = FencingToken::new(fence);
            resource.begin_hold(fence);
            resource.end_hold(fence);
        }
        let two = FencingToken::new(2);
        assert_eq!(resource.report().fence_regressions, vec![(two, two)]);
    }

    #[test]
    fn a_multi_lock_is_checked_on_every_name() {
        let resource = FencedResource::new();
        let f = FencingToken::new;
        // The first names' fences grow; the second names' repeat.
        resource.begin_parts(&[f(1), f(5)], HoldKind::Exclusive, Some(1));
        resource.end_hold_of(f(1), Some(1));
        resource.begin_parts(&[f(2), f(5)], HoldKind::Exclusive, Some(2));
        let report = resource.report();
        assert_eq!(report.fence_regressions, vec![(f(5), f(5))]);
        assert_eq!(report.holds, 2, "one hold per multi-lock, not per name");
        // A third holder while the second still holds: an overlap on each name.
        resource.begin_parts(&[f(3), f(6)], HoldKind::Exclusive, Some(3));
        let report = resource.report();
        let overlaps: Vec<_> = report
            .overlap_details
            .iter()
            .map(|o| (o.part, o.earlier, o.later))
            .collect();
        assert_eq!(overlaps, vec![(0, f(2), f(3)), (1, f(5), f(6))]);
    }

    #[test]
    fn a_multi_lock_is_told_and_ended_on_every_name_by_its_first_fence() {
        let resource = FencedResource::new();
        let f = FencingToken::new;
        resource.begin_parts(&[f(1), f(7)], HoldKind::Exclusive, Some(4));
        resource.hold_lost_of(f(1), Some(4));
        resource.end_hold_of(f(1), Some(4));
        let holds = resource.holds();
        assert_eq!(holds.len(), 2);
        assert!(
            holds
                .iter()
                .all(|hold| hold.lost_at.is_some() && hold.end.is_some()),
            "{holds:?}"
        );
        assert_eq!(holds[0].group, holds[1].group);
        assert_eq!(resource.report().lost_holds, 1);
    }

    #[test]
    fn a_native_permit_granted_after_another_has_a_greater_fence() {
        let resource = FencedResource::new().with_permits(2).with_ordered_permits();
        let f = FencingToken::new;
        resource.attempt(1);
        resource.begin(f(5), HoldKind::Permit, Some(1));
        // Worker 2 asks only after worker 1's permit began: its grant came later.
        resource.attempt(2);
        resource.begin(f(4), HoldKind::Permit, Some(2));
        assert_eq!(resource.report().fence_regressions, vec![(f(5), f(4))]);
        // The same record without the native promise (a composed semaphore's slots).
        let composed = FencedResource::new().with_permits(2);
        composed.attempt(1);
        composed.begin(f(5), HoldKind::Permit, Some(1));
        composed.attempt(2);
        composed.begin(f(4), HoldKind::Permit, Some(2));
        assert!(composed.report().fence_regressions.is_empty());
    }

    #[test]
    fn a_composed_permits_fence_must_grow_on_its_slot() {
        let resource = FencedResource::new().with_permits(2);
        let f = FencingToken::new;
        // Two slots, each with fences of its own: 7 on slot 1 after 9 on slot 0 is fine.
        resource.begin_on_slot(f(9), 0, Some(1));
        resource.begin_on_slot(f(7), 1, Some(2));
        resource.end_hold_of(f(9), Some(1));
        resource.end_hold_of(f(7), Some(2));
        resource.begin_on_slot(f(10), 0, Some(2));
        resource.end_hold_of(f(10), Some(2));
        assert!(resource.report().fence_regressions.is_empty());
        // Slot 1 hands out its last fence again: the store repeated a slot's fence.
        resource.begin_on_slot(f(7), 1, Some(1));
        assert_eq!(resource.report().fence_regressions, vec![(f(7), f(7))]);
        assert_eq!(resource.holds()[3].slot, Some(1));
    }

    #[test]
    fn native_permits_asked_for_at_once_may_be_granted_in_either_order() {
        let resource = FencedResource::new().with_permits(2).with_ordered_permits();
        let f = FencingToken::new;
        resource.attempt(1);
        resource.attempt(2);
        resource.begin(f(5), HoldKind::Permit, Some(1));
        resource.begin(f(4), HoldKind::Permit, Some(2));
        resource.end_hold_of(f(5), Some(1));
        resource.end_hold_of(f(4), Some(2));
        // Later grants must pass both.
        resource.attempt(1);
        resource.begin(f(6), HoldKind::Permit, Some(1));
        assert!(resource.report().fence_regressions.is_empty());
        resource.end_hold_of(f(6), Some(1));
        resource.attempt(2);
        resource.begin(f(6), HoldKind::Permit, Some(2));
        assert_eq!(resource.report().fence_regressions, vec![(f(6), f(6))]);
    }

    #[test]
    fn an_unfenced_resource_accepts_and_counts_stale_writes() {
        let resource = FencedResource::unfenced();
        resource.write(FencingToken::new(2)).unwrap();
        resource.write(FencingToken::new(1)).unwrap();
        let report = resource.report();
        assert_eq!((report.accepted, report.unsafe_writes), (2, 1));
        assert!(report.rejected.is_empty());
    }
}
