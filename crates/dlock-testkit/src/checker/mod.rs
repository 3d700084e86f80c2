//! The safety checker: a fenced resource that records every hold and every write, rejects
//! writes whose fence is lower than the highest it has accepted, and proves afterwards that no
//! two holds overlapped unless the earlier holder was told it had lost its lock.
//!
//! [`FencedResource`] is the record, usable in-process (the conformance suite uses it from
//! tasks). [`service`] puts it behind a loopback TCP port so worker OS processes
//! ([`worker`], the `dlock-safety-worker` binary) can write through it, and [`scenario`]
//! runs a workload of such processes under one fault and reports what happened.

pub mod scenario;
pub mod service;
pub mod worker;

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use dlock::FencingToken;

/// A write refused because a later holder has already written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StaleWrite {
    /// The fence of the refused write.
    pub fence: FencingToken,
    /// The highest fence accepted so far.
    pub highest: FencingToken,
}

/// One hold as the resource saw it: from the holder's first message after its acquire
/// returned to its last message before it released, so the recorded interval lies inside the
/// real hold and an overlap of two recorded holds is a real overlap.
#[derive(Clone, Copy, Debug)]
struct Hold {
    fence: FencingToken,
    worker: Option<u32>,
    start: Instant,
    end: Option<Instant>,
    /// When the holder's guard reported the lock lost, if it did before the hold ended.
    lost_at: Option<Instant>,
}

#[derive(Debug, Default)]
struct Record {
    highest: Option<FencingToken>,
    accepted: usize,
    rejected: Vec<StaleWrite>,
    /// Writes an unfenced resource accepted although a later holder had already written.
    unsafe_writes: usize,
    holds: Vec<Hold>,
}

/// A resource protected by fencing tokens, as the Kleppmann argument asks of one.
#[derive(Debug)]
pub struct FencedResource {
    fenced: bool,
    record: Mutex<Record>,
}

impl Default for FencedResource {
    fn default() -> FencedResource {
        FencedResource {
            fenced: true,
            record: Mutex::default(),
        }
    }
}

/// Two holds whose recorded intervals intersect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overlap {
    /// The fence of the hold that started first.
    pub earlier: FencingToken,
    /// The fence of the hold that started while the earlier one was still open.
    pub later: FencingToken,
    /// When the later hold started.
    pub at: Instant,
    /// Whether the earlier holder had been told it lost the lock by then.
    pub signalled: bool,
}

/// What the checker found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckReport {
    /// Holds recorded.
    pub holds: usize,
    /// Pairs of holds whose intervals intersect although the earlier holder was never told
    /// it had lost the lock: violations of mutual exclusion (must be empty).
    pub overlaps: Vec<(FencingToken, FencingToken)>,
    /// Pairs of holds whose intervals intersect after the earlier holder's guard reported the
    /// lock lost (a paused or cut-off holder that kept going: the fence must protect these).
    pub lost_overlaps: Vec<(FencingToken, FencingToken)>,
    /// Writes accepted.
    pub accepted: usize,
    /// Writes refused as stale.
    pub rejected: Vec<StaleWrite>,
    /// Writes an unfenced resource ([`FencedResource::unfenced`]) accepted from a holder whose
    /// successor had already written: the lost updates fencing exists to prevent.
    pub unsafe_writes: usize,
    /// Holds whose guard reported the lock lost before the hold ended.
    pub lost_holds: usize,
    /// Holds whose fence was not greater than every fence of the holds that started before
    /// it (must be 0: fences are monotonic per lock name).
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
            record: Mutex::default(),
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
                if self.fenced {
                    let stale = StaleWrite { fence, highest };
                    record.rejected.push(stale);
                    Err(stale)
                } else {
                    record.unsafe_writes += 1;
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

    /// Marks the start of a hold; call [`end_hold`](Self::end_hold) with the same fence when it ends.
    pub fn begin_hold(&self, fence: FencingToken) {
        self.begin_hold_of(fence, None);
    }

    /// Marks the start of a hold by `worker` (a process or task id of the caller's choosing).
    pub fn begin_hold_of(&self, fence: FencingToken, worker: Option<u32>) {
        self.record().holds.push(Hold {
            fence,
            worker,
            start: Instant::now(),
            end: None,
            lost_at: None,
        });
    }

    fn open_hold(record: &mut Record, fence: FencingToken) -> Option<&mut Hold> {
        record
            .holds
            .iter_mut()
            .rev()
            .find(|hold| hold.fence == fence && hold.end.is_none())
    }

    /// Marks the end of the hold started with `fence`.
    pub fn end_hold(&self, fence: FencingToken) {
        if let Some(hold) = Self::open_hold(&mut self.record(), fence) {
            hold.end = Some(Instant::now());
        }
    }

    /// Records that the guard of the open hold with `fence` reported the lock lost (ignored
    /// when that hold has already ended: a guard's lost signal also completes on release).
    pub fn hold_lost(&self, fence: FencingToken) {
        if let Some(hold) = Self::open_hold(&mut self.record(), fence) {
            hold.lost_at.get_or_insert_with(Instant::now);
        }
    }

    /// The worker of a hold that has not ended, if any.
    pub fn current_holder(&self) -> Option<(FencingToken, Option<u32>)> {
        self.record()
            .holds
            .iter()
            .rev()
            .find(|hold| hold.end.is_none())
            .map(|hold| (hold.fence, hold.worker))
    }

    /// When the guard of the hold with `fence` reported the lock lost, if it did.
    pub fn lost_at(&self, fence: FencingToken) -> Option<Instant> {
        self.record()
            .holds
            .iter()
            .find(|hold| hold.fence == fence)
            .and_then(|hold| hold.lost_at)
    }

    /// The holds open at `at` (started before, not ended), with when each was reported lost.
    pub fn holds_open_at(&self, at: Instant) -> Vec<(FencingToken, Option<Instant>)> {
        self.record()
            .holds
            .iter()
            .filter(|hold| hold.start <= at && hold.end.is_none_or(|end| end > at))
            .map(|hold| (hold.fence, hold.lost_at))
            .collect()
    }

    /// Holds that started at or after `since`.
    pub fn holds_since(&self, since: Instant) -> Vec<Instant> {
        self.record()
            .holds
            .iter()
            .filter(|hold| hold.start >= since)
            .map(|hold| hold.start)
            .collect()
    }

    /// For every hold that reported its lock lost, how long after the real loss the signal
    /// came: the real loss is the earlier of the lease's end (`ttl` after the hold started, an
    /// upper bound since the lease started before the acquire returned) and the start of a
    /// later hold that overlapped it. `None` for a signal that came before that moment.
    pub fn lost_lags(&self, ttl: Duration) -> Vec<(FencingToken, Option<Duration>)> {
        let record = self.record();
        record
            .holds
            .iter()
            .filter_map(|hold| {
                let lost_at = hold.lost_at?;
                let end = hold.end.unwrap_or_else(Instant::now);
                let takeover = record
                    .holds
                    .iter()
                    .filter(|other| other.start > hold.start && other.start < end)
                    .map(|other| other.start)
                    .min();
                let expiry = hold.start + ttl;
                let real_loss = takeover.map_or(expiry, |t| t.min(expiry));
                Some((hold.fence, lost_at.checked_duration_since(real_loss)))
            })
            .collect()
    }

    /// Checks every recorded hold against every other: intervals must not intersect unless
    /// the earlier one had been reported lost.
    pub fn report(&self) -> CheckReport {
        let record = self.record();
        let now = Instant::now();
        let mut holds: Vec<Hold> = record.holds.clone();
        holds.sort_by_key(|hold| hold.start);
        let mut overlaps = Vec::new();
        let mut lost_overlaps = Vec::new();
        let mut overlap_details = Vec::new();
        let mut fence_regressions = Vec::new();
        let mut highest: Option<FencingToken> = None;
        for hold in &holds {
            match highest {
                Some(high) if hold.fence <= high => fence_regressions.push((high, hold.fence)),
                _ => highest = Some(hold.fence),
            }
        }
        for (i, earlier) in holds.iter().enumerate() {
            let earlier_end = earlier.end.unwrap_or(now);
            for later in holds[i + 1..]
                .iter()
                .take_while(|later| later.start < earlier_end)
            {
                overlap_details.push(Overlap {
                    earlier: earlier.fence,
                    later: later.fence,
                    at: later.start,
                    signalled: earlier.lost_at.is_some(),
                });
                // Lost before the hold ended: the holder was told, and its writes are the
                // fence's to refuse.
                if earlier.lost_at.is_some() {
                    lost_overlaps.push((earlier.fence, later.fence));
                } else {
                    overlaps.push((earlier.fence, later.fence));
                }
            }
        }
        CheckReport {
            holds: holds.len(),
            overlaps,
            lost_overlaps,
            accepted: record.accepted,
            rejected: record.rejected.clone(),
            unsafe_writes: record.unsafe_writes,
            lost_holds: holds.iter().filter(|hold| hold.lost_at.is_some()).count(),
            fence_regressions,
            overlap_details,
        }
    }
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
        assert_eq!(
            resource.write(one),
            Err(StaleWrite {
                fence: one,
                highest: two
            })
        );
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
    fn an_unfenced_resource_accepts_and_counts_stale_writes() {
        let resource = FencedResource::unfenced();
        resource.write(FencingToken::new(2)).unwrap();
        resource.write(FencingToken::new(1)).unwrap();
        let report = resource.report();
        assert_eq!((report.accepted, report.unsafe_writes), (2, 1));
        assert!(report.rejected.is_empty());
    }
}
