//! Elections under the checker. The leaders are workers ([`Primitive::Election`]): each
//! term is a hold whose fence is the term, so the checker's own rules judge them (one leader
//! at a time unless the deposed one was told, terms strictly rising and never repeated, a
//! deposed leader told within one lease). What only an election has is judged here: an
//! [`Observer`] follows the election with [`Election::observe`](dlock::election::Election::observe)
//! from the test process, straight to the store (no fault strikes it), and
//! [`judge_observations`] checks each item it got against the record of the holds:
//!
//! - **stale-leader rule:** no item shows a term that had ended more than one lease (the
//!   store's: the TTL, or a session timeout) before the item came, outside the window of a
//!   fault that loses the store's data;
//! - **one-leader-per-term rule:** the value shown with a term is the one its leader (the
//!   worker that held that term) published.
//!
//! [`Canary::StaleReads`] is the observer's canary: a client whose reads come from a replica
//! [`STALE_READ_LAG`] behind.
//!
//! [`Primitive::Election`]: super::worker::Primitive::Election

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dlock::FencingToken;
use dlock::LockName;
use dlock::backend::{
    AcquireRequest, Backend, BackendInfo, DynBackend, Expect, Lease, ListPage, ListQuery, LockInfo,
    MonitorStore, ValueStore, Versioned,
};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::canary::Canary;
use super::{Hold, SIGNAL_TOLERANCE};

/// How far behind the store the reads of a [`Canary::StaleReads`] client are: six of the
/// suite's one-second leases, and twice ZooKeeper's three-second session (the longest lease a
/// term may keep in the store), so every term it shows has ended well past the bound.
pub const STALE_READ_LAG: Duration = Duration::from_secs(6);

/// One item of the observer's stream, as it came.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    /// The leader's term and value, or `None` when nobody led.
    pub leader: Option<(FencingToken, Vec<u8>)>,
    /// When the item came (the test process's monotonic clock, as every hold's times).
    pub at: Instant,
}

/// What an [`Observer`] got.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// The stream's items, in order.
    pub items: Vec<Observation>,
    /// Error items (a store fault: the stream goes on).
    pub errors: usize,
    /// The store cannot inspect (the stream ended at once): nothing to judge.
    pub unsupported: bool,
}

/// Follows an election from a thread of the test process until stopped.
#[derive(Debug)]
pub struct Observer {
    stop: CancellationToken,
    thread: std::thread::JoinHandle<anyhow::Result<Observed>>,
}

impl Observer {
    /// Observes the election `name` on the store at `url`, asking it every `every`; a
    /// [`Canary::StaleReads`] canary reads from a replica [`STALE_READ_LAG`] behind. Returns
    /// once the observer has its first answer (or after 30 s): a trial started before it may
    /// end before it has seen anything (CI: a 1 s SQLite trial on a loaded machine, "the
    /// observer never showed a leader" with no item at all).
    pub fn start(url: &str, name: &str, every: Duration, canary: Canary) -> Observer {
        let stop = CancellationToken::new();
        let (url, name, stopped) = (url.to_owned(), name.to_owned(), stop.clone());
        let (ready, first_answer) = std::sync::mpsc::sync_channel(1);
        let thread = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(observe(url, name, every, canary, stopped, ready))
        });
        // A failed observer drops its sender: no wait then.
        let _ = first_answer.recv_timeout(Duration::from_secs(30));
        Observer { stop, thread }
    }

    /// Stops observing and returns what came.
    ///
    /// # Errors
    ///
    /// The observer could not connect, or its thread panicked.
    pub fn stop(self) -> anyhow::Result<Observed> {
        self.stop.cancel();
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("the observer thread panicked"))?
    }
}

async fn observe(
    url: String,
    name: String,
    every: Duration,
    canary: Canary,
    stop: CancellationToken,
    ready: std::sync::mpsc::SyncSender<()>,
) -> anyhow::Result<Observed> {
    let mut locks = super::worker::connect_to(&url).await?;
    if canary == Canary::StaleReads {
        locks = dlock::Locks::from_backend(canary.wrap(locks.backend().clone()));
    }
    let mut stream = locks.election(name).observe_interval(every).observe();
    let mut observed = Observed::default();
    loop {
        let item = tokio::select! {
            () = stop.cancelled() => return Ok(observed),
            item = stream.next() => item,
        };
        let at = Instant::now();
        let _ = ready.try_send(());
        match item {
            None => return Ok(observed),
            Some(Ok(leader)) => observed.items.push(Observation {
                leader: leader.map(|l| (l.term, l.value)),
                at,
            }),
            Some(Err(dlock::Error::Unsupported { .. })) => observed.unsupported = true,
            Some(Err(_)) => observed.errors += 1,
        }
    }
}

/// What the election rules found in an observer's items.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObserveFindings {
    /// Items that showed a leader.
    pub leaders_shown: usize,
    /// Error items.
    pub errors: usize,
    /// Items showing a term more than one lease after it ended (stale-leader rule).
    pub stale: Vec<String>,
    /// Items showing a term with another value than its leader's (one-leader-per-term rule).
    pub wrong_leader: Vec<String>,
    /// The longest a term was still shown after it ended (outside a data-losing fault).
    pub shown_after_end_max: Option<Duration>,
    /// The store cannot inspect: nothing was observed.
    pub unsupported: bool,
}

impl ObserveFindings {
    /// The rules' violations, each starting with its rule's name.
    pub fn violations(&self) -> Vec<String> {
        let mut violations = Vec::new();
        if !self.stale.is_empty() {
            violations.push(format!(
                "stale-leader rule: {} items showed a term more than one lease + {} ms after it ended (first ones: {:?})",
                self.stale.len(),
                SIGNAL_TOLERANCE.as_millis(),
                &self.stale[..self.stale.len().min(5)]
            ));
        }
        if !self.wrong_leader.is_empty() {
            violations.push(format!(
                "one-leader-per-term rule: {} items showed a term with another leader's value (first ones: {:?})",
                self.wrong_leader.len(),
                &self.wrong_leader[..self.wrong_leader.len().min(5)]
            ));
        }
        if self.leaders_shown == 0 && !self.unsupported {
            violations.push("observer rule: the observer never showed a leader".into());
        }
        violations
    }

    /// The figures of the report RELIABILITY.md's tables are made from.
    pub fn figures(&self) -> serde_json::Value {
        serde_json::json!({
            "leaders_shown": self.leaders_shown,
            "errors": self.errors,
            "stale": self.stale.len(),
            "wrong_leader": self.wrong_leader.len(),
            "shown_after_end_max_ms": self.shown_after_end_max.map(|d| d.as_millis()),
            "unsupported": self.unsupported,
        })
    }

    /// The summary line's part.
    pub fn summary(&self) -> String {
        if self.unsupported {
            return "; observer: not supported by the store".into();
        }
        format!(
            "; observer: {} leaders shown, {} errors, {} stale, {} with another's value, a term shown at most {} ms after it ended",
            self.leaders_shown,
            self.errors,
            self.stale.len(),
            self.wrong_leader.len(),
            self.shown_after_end_max
                .map_or("-".into(), |d| d.as_millis().to_string())
        )
    }
}

/// When the term of `hold` had surely ended in the store: its end, its lost signal, or the
/// start of a later term, whichever came first.
fn term_ended(hold: &Hold, holds: &[Hold]) -> Option<Instant> {
    let later = holds
        .iter()
        .filter(|h| h.part == 0 && h.fence > hold.fence && h.start > hold.start)
        .map(|h| h.start)
        .min();
    [hold.end, hold.lost_at, later].into_iter().flatten().min()
}

/// Judges the observer's items against the holds (sorted by start): a term shown more than
/// `lease` (plus [`SIGNAL_TOLERANCE`]) after it ended, outside what `excused` says a
/// data-losing fault may bring back, is stale; a value other than its leader's is another
/// leader under the same term. Terms no recorded hold had (a run's own hold, a worker killed
/// before it reported its hold) are not judged.
pub fn judge_observations(
    observed: &Observed,
    holds: &[Hold],
    lease: Duration,
    excused: impl Fn(Instant) -> bool,
) -> ObserveFindings {
    let mut findings = ObserveFindings {
        errors: observed.errors,
        unsupported: observed.unsupported,
        ..ObserveFindings::default()
    };
    for item in &observed.items {
        let Some((term, value)) = &item.leader else {
            continue;
        };
        findings.leaders_shown += 1;
        // The term's hold: the newest with that fence begun by then (a repeated term is
        // judged against its latest holder).
        let Some(hold) = holds
            .iter()
            .rev()
            .find(|h| h.part == 0 && h.fence == *term && h.start <= item.at)
        else {
            continue;
        };
        let published = hold.worker.map(|id| id.to_string().into_bytes());
        if let Some(published) = published.filter(|_| !value.is_empty())
            && *value != published
        {
            findings.wrong_leader.push(format!(
                "term {term} shown with value {:?}, published by worker {:?}",
                String::from_utf8_lossy(value),
                hold.worker
            ));
        }
        let Some(ended) = term_ended(hold, holds).filter(|&ended| ended < item.at) else {
            continue;
        };
        if excused(item.at) {
            continue;
        }
        let after = item.at - ended;
        findings.shown_after_end_max = findings.shown_after_end_max.max(Some(after));
        if after > lease + SIGNAL_TOLERANCE {
            findings.stale.push(format!(
                "term {term} shown {} ms after it ended",
                after.as_millis()
            ));
        }
    }
    findings
}

/// A client reading from a replica [`STALE_READ_LAG`] behind: every inspection and value read
/// answers what the store said that long ago (or the first answer, until one is that old).
/// Grants and writes go to the store itself.
pub(super) fn lagging(inner: DynBackend) -> DynBackend {
    Arc::new(Lagging {
        inner,
        held: Mutex::default(),
        values: Mutex::default(),
    })
}

type History<T> = Mutex<HashMap<String, VecDeque<(Instant, T)>>>;

#[derive(Debug)]
struct Lagging {
    inner: DynBackend,
    held: History<Option<LockInfo>>,
    values: History<Option<Versioned>>,
}

/// Records `fresh` and answers the newest answer at least [`STALE_READ_LAG`] old (the
/// oldest while none is), dropping the ones before it.
fn lagged<T: Clone>(history: &History<T>, name: &LockName, fresh: T) -> T {
    let mut history = history.lock().unwrap_or_else(PoisonError::into_inner);
    let answers = history.entry(name.as_str().to_owned()).or_default();
    let now = Instant::now();
    answers.push_back((now, fresh.clone()));
    while answers
        .get(1)
        .is_some_and(|(at, _)| now.duration_since(*at) >= STALE_READ_LAG)
    {
        answers.pop_front();
    }
    answers.front().map_or(fresh, |(_, answer)| answer.clone())
}

#[async_trait]
impl Backend for Lagging {
    fn info(&self) -> &BackendInfo {
        self.inner.info()
    }

    async fn acquire(&self, req: &AcquireRequest) -> dlock::Result<Option<Arc<dyn Lease>>> {
        self.inner.acquire(req).await
    }

    fn monitor(&self) -> Option<&dyn MonitorStore> {
        self.inner.monitor().map(|_| self as &dyn MonitorStore)
    }

    fn values(&self) -> Option<&dyn ValueStore> {
        self.inner.values().map(|_| self as &dyn ValueStore)
    }
}

#[async_trait]
impl MonitorStore for Lagging {
    async fn inspect(&self, name: &LockName) -> dlock::Result<Option<LockInfo>> {
        let monitor = self.inner.monitor().ok_or(dlock::Error::Unsupported {
            operation: "inspect",
            backend: self.inner.info().name,
        })?;
        let fresh = monitor.inspect(name).await?;
        Ok(lagged(&self.held, name, fresh))
    }

    async fn list_page(&self, query: ListQuery<'_>) -> dlock::Result<ListPage> {
        match self.inner.monitor() {
            Some(monitor) => monitor.list_page(query).await,
            None => Ok(ListPage::default()),
        }
    }

    async fn force_release(&self, name: &LockName) -> dlock::Result<bool> {
        match self.inner.monitor() {
            Some(monitor) => monitor.force_release(name).await,
            None => Ok(false),
        }
    }
}

#[async_trait]
impl ValueStore for Lagging {
    async fn get(&self, name: &LockName) -> dlock::Result<Option<Versioned>> {
        let values = self.inner.values().ok_or(dlock::Error::Unsupported {
            operation: "values",
            backend: self.inner.info().name,
        })?;
        let fresh = values.get(name).await?;
        Ok(lagged(&self.values, name, fresh))
    }

    async fn put(
        &self,
        name: &LockName,
        expect: Expect,
        value: &[u8],
    ) -> dlock::Result<Option<u64>> {
        match self.inner.values() {
            Some(values) => values.put(name, expect, value).await,
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::FencedResource;

    fn observed(items: Vec<(Option<(u64, &str)>, Instant)>) -> Observed {
        Observed {
            items: items
                .into_iter()
                .map(|(leader, at)| Observation {
                    leader: leader.map(|(t, v)| (FencingToken::new(t), v.as_bytes().to_vec())),
                    at,
                })
                .collect(),
            ..Observed::default()
        }
    }

    #[test]
    fn a_term_shown_past_a_lease_after_it_ended_is_stale() {
        let resource = FencedResource::new();
        let f = FencingToken::new;
        resource.begin_hold_of(f(1), Some(7));
        let during = Instant::now();
        resource.end_hold_of(f(1), Some(7));
        let ended = Instant::now();
        resource.begin_hold_of(f(2), Some(8));
        let lease = Duration::from_millis(100);
        let late = ended + lease * 3;
        let items = observed(vec![
            (Some((1, "7")), during),
            (Some((1, "7")), ended + lease / 2),
            (Some((1, "7")), late),
            (Some((2, "8")), late),
        ]);
        let findings = judge_observations(&items, &resource.holds(), lease, |_| false);
        assert_eq!(findings.leaders_shown, 4);
        assert_eq!(findings.stale.len(), 1, "{findings:?}");
        assert!(findings.wrong_leader.is_empty());
        // A data-losing fault's window excuses it.
        let excused = judge_observations(&items, &resource.holds(), lease, |at| at >= late);
        assert!(excused.stale.is_empty());
    }

    #[test]
    fn a_term_shown_with_another_leaders_value_is_flagged() {
        let resource = FencedResource::new();
        resource.begin_hold_of(FencingToken::new(3), Some(7));
        let items = observed(vec![
            (Some((3, "8")), Instant::now()),
            (None, Instant::now()),
        ]);
        let findings = judge_observations(&items, &resource.holds(), Duration::ZERO, |_| false);
        assert_eq!(findings.wrong_leader.len(), 1, "{findings:?}");
        assert!(findings.stale.is_empty());
    }
}
