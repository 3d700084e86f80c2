//! A lease table's waiter queue as one acquire call sees it.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::abandon::{Abandon, spawn_cleanup};

/// A waiter whose queue entry has not been refreshed for this long is gone (crashed, paused,
/// cut off) and no longer holds anyone back: the same rule as the SQLite backend's queue.
pub(crate) const WAITER_STALE: Duration = Duration::from_secs(1);

/// How often a queued waiter refreshes its entry: its attempts never sleep longer than this,
/// well inside [`WAITER_STALE`] even with a slow round trip.
pub(crate) const WAITER_REFRESH: Duration = Duration::from_millis(300);

/// [`WAITER_STALE`] in milliseconds, for SQL text.
pub(crate) const WAITER_STALE_MS: u128 = WAITER_STALE.as_millis();

/// [`STARVATION_THRESHOLD`](crate::backend::wait::STARVATION_THRESHOLD) in microseconds, for SQL text.
pub(crate) const STARVATION_US: u128 = crate::backend::wait::STARVATION_THRESHOLD.as_micros();

/// One acquire call's place in a lease table's waiter queue.
#[derive(Debug, Default)]
pub(crate) struct QueueSpot {
    /// Whether an attempt left an entry in the queue (cleared when a grant or a leave
    /// removes it).
    pub(crate) queued: AtomicBool,
    /// Held by the attempt in flight, so leaving waits for it: an attempt that queues after
    /// the leave would leave an entry behind until it went stale.
    pub(crate) gate: tokio::sync::Mutex<()>,
    /// When this waiter last wrote its entry (the MySQL backend refreshes only now and then),
    /// and the doorbell it wrote there (MySQL's `bell`).
    pub(crate) refreshed: Mutex<Option<(Instant, Option<i64>)>>,
}

impl QueueSpot {
    pub(crate) fn is_queued(&self) -> bool {
        self.queued.load(Ordering::SeqCst)
    }

    pub(crate) fn set_queued(&self, queued: bool) {
        self.queued.store(queued, Ordering::SeqCst);
        if !queued {
            *self
                .refreshed
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = None;
        }
    }

    /// Whether the entry is due for a refresh (`every` has passed, or its doorbell is no
    /// longer `bell`), and if so, counts it as refreshed now with `bell`.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) fn refresh_due(&self, every: Duration, bell: Option<i64>) -> bool {
        let mut last = self
            .refreshed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let fresh =
            last.is_some_and(|(at, rung_on)| now.duration_since(at) < every && rung_on == bell);
        if fresh && self.is_queued() {
            return false;
        }
        *last = Some((now, bell));
        true
    }
}

/// Takes a waiter out of the queue when its acquire call ends without the lock (timed out,
/// failed, or its future dropped). The leave runs in its own task, after any attempt in
/// flight; if it never runs, the entry goes stale after [`WAITER_STALE`].
pub(crate) struct LeaveQueue(Abandon<Leave, fn(Leave)>);

/// The leave itself: the store call, behind the spot's gate.
type Leave = Pin<Box<dyn Future<Output = ()> + Send>>;

impl LeaveQueue {
    /// `leave` removes the entry (and wakes whoever may be next); it runs only if an attempt
    /// queued.
    pub(crate) fn new<F>(spot: Arc<QueueSpot>, leave: F) -> LeaveQueue
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let leave: Leave = Box::pin(async move {
            let _gate = spot.gate.lock().await;
            if spot.queued.swap(false, Ordering::SeqCst) {
                leave.await;
            }
        });
        // Dropped unanswered: the leave runs in a task of its own.
        LeaveQueue(Abandon::new(leave, |leave| spawn_cleanup(|| leave)))
    }

    /// The call got the lock: the granting attempt already left the queue.
    pub(crate) fn disarm(self) {
        self.0.disarm();
    }

    /// The call ended without the lock and its caller is still here: leave before answering,
    /// so the caller's next try does not find its own entry ahead of it (a waiter past the
    /// starvation threshold goes first). Spawned and awaited, so a caller dropped meanwhile
    /// still leaves.
    pub(crate) async fn leave_now(self) {
        let leave = self.0.into_inner();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let _ = runtime.spawn(leave).await;
        }
    }

    /// Disarms on a grant, leaves at once otherwise.
    pub(crate) async fn after(self, acquired: bool) {
        if acquired {
            self.disarm();
        } else {
            self.leave_now().await;
        }
    }
}

/// The sleep hint for a queued waiter: never past its next refresh, and sooner while it is
/// at the head of the queue (`head_poll`) where waking is by polling.
pub(crate) fn queued_hint(free_in: Option<Duration>, head_poll: Option<Duration>) -> Duration {
    let cap = head_poll.map_or(WAITER_REFRESH, |p| p.min(WAITER_REFRESH));
    free_in.map_or(cap, |f| f.min(cap))
}
