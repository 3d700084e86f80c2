//! The safety checker: a fenced resource that records every hold and every write, rejects
//! writes whose fence is lower than the highest it has accepted, and proves afterwards that no
//! two holds overlapped.
//!
//! In-process for now (tasks with their own clients); the cross-process service and the fault
//! runs build on the same record.

use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use dlock::FencingToken;

/// A write refused because a later holder has already written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StaleWrite {
    /// The fence of the refused write.
    pub fence: FencingToken,
    /// The highest fence accepted so far.
    pub highest: FencingToken,
}

#[derive(Debug, Default)]
struct Record {
    highest: Option<FencingToken>,
    accepted: usize,
    rejected: Vec<StaleWrite>,
    holds: Vec<(FencingToken, Instant, Option<Instant>)>,
}

/// A resource protected by fencing tokens, as the Kleppmann argument asks of one.
#[derive(Debug, Default)]
pub struct FencedResource {
    record: Mutex<Record>,
}

/// What the checker found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckReport {
    /// Holds recorded.
    pub holds: usize,
    /// Pairs of holds whose intervals intersect (must be 0 when no lease was lost).
    pub overlaps: Vec<(FencingToken, FencingToken)>,
    /// Writes accepted.
    pub accepted: usize,
    /// Writes refused as stale.
    pub rejected: Vec<StaleWrite>,
}

impl FencedResource {
    /// A fresh resource.
    pub fn new() -> FencedResource {
        FencedResource::default()
    }

    fn record(&self) -> std::sync::MutexGuard<'_, Record> {
        self.record.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes with `fence`: accepted unless a higher fence has already written.
    pub fn write(&self, fence: FencingToken) -> Result<(), StaleWrite> {
        let mut record = self.record();
        match record.highest {
            Some(highest) if fence < highest => {
                let stale = StaleWrite { fence, highest };
                record.rejected.push(stale);
                Err(stale)
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
        self.record().holds.push((fence, Instant::now(), None));
    }

    /// Marks the end of the hold started with `fence`.
    pub fn end_hold(&self, fence: FencingToken) {
        let mut record = self.record();
        if let Some(hold) = record
            .holds
            .iter_mut()
            .rev()
            .find(|(f, _, end)| *f == fence && end.is_none())
        {
            hold.2 = Some(Instant::now());
        }
    }

    /// Checks every recorded hold against every other: intervals must not intersect.
    pub fn report(&self) -> CheckReport {
        let record = self.record();
        let mut holds: Vec<(FencingToken, Instant, Instant)> = record
            .holds
            .iter()
            .map(|&(fence, start, end)| (fence, start, end.unwrap_or_else(Instant::now)))
            .collect();
        holds.sort_by_key(|&(_, start, _)| start);
        let mut overlaps = Vec::new();
        let mut latest: Option<(FencingToken, Instant)> = None;
        for &(fence, start, end) in &holds {
            if let Some((other, other_end)) = latest
                && start < other_end
            {
                overlaps.push((other, fence));
            }
            if latest.is_none_or(|(_, e)| end > e) {
                latest = Some((fence, end));
            }
        }
        CheckReport {
            holds: holds.len(),
            overlaps,
            accepted: record.accepted,
            rejected: record.rejected.clone(),
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
}
