//! The lease keeper: one task per client that renews every watchdog lease it still owns and
//! fires the lost signal of every lease whose renewal failed or whose local deadline passed.
//!
//! A lease it does not renew (a fixed TTL, or past its maximum hold) is still checked every
//! third of its TTL with a zero-length extend, which only asks the store whether the hold is
//! still this one: a break or a store that lost its data is told within a third of the TTL,
//! not at the lease's end, and the lease is never made longer.
//!
//! One timer schedule (a `BTreeSet` ordered by due time) serves all held leases, so ten thousand
//! held locks cost one task and one sleep, not ten thousand. The task starts with the first
//! registration and ends when nothing is registered. It runs on the runtime of the
//! registration that started it; when that runtime shuts down while leases registered from
//! other runtimes are still kept, it starts again on one of theirs.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::runtime::{Handle, Id as RuntimeId};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::Lease;

use pass::{StopGuard, run};

mod pass;
#[cfg(test)]
mod tests;

/// Why a guard's lock was lost, as [`MutexGuard::lost_reason`](crate::MutexGuard::lost_reason)
/// tells it; also the `reason` label of the `dlock_lost_total` metric.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::connect("memory://lost-reason-doc").await?;
/// let guard = locks.mutex("jobs").acquire().await?;
/// assert_eq!(guard.lost_reason(), None);
/// locks.force_release("jobs").await?;
/// guard.lost().await;
/// assert!(guard.lost_reason().is_some());
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The lease ran out: a fixed TTL passed (or a maximum hold ended renewals) and the
    /// store was not asked to extend it.
    Expired,
    /// A renewal or ownership check was answered "not yours": the lease had expired in the
    /// store, or the lock was broken or taken over.
    RenewalRefused,
    /// The lease ran out while renewals failed: the store could not be reached (or answered
    /// too slowly) before the local deadline.
    StoreUnreachable,
    /// The store announced that the lock was broken or taken from this holder (ZooKeeper
    /// sees the holder's node deleted; the in-process store's `force_release`). Elsewhere a
    /// break shows at the next renewal, as [`RenewalRefused`](LostReason::RenewalRefused).
    Broken,
    /// The store session or connection the hold lived in ended (a ZooKeeper session expired,
    /// the connection of a SQL session-mode lock died).
    SessionEnded,
    /// The store reported the hold gone in another way: an explicit extend or ownership
    /// check was refused.
    StoreSignal,
}

impl LostReason {
    /// The lower-case name used as the metric label: `expired`, `renewal_refused`,
    /// `store_unreachable`, `broken`, `session_ended`, `store_signal`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(dlock::LostReason::StoreUnreachable.as_str(), "store_unreachable");
    /// ```
    pub const fn as_str(self) -> &'static str {
        match self {
            LostReason::Expired => "expired",
            LostReason::RenewalRefused => "renewal_refused",
            LostReason::StoreUnreachable => "store_unreachable",
            LostReason::Broken => "broken",
            LostReason::SessionEnded => "session_ended",
            LostReason::StoreSignal => "store_signal",
        }
    }
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a registered lease is kept.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeepPolicy {
    /// The lease length in the store.
    pub(crate) ttl: Duration,
    /// Renew at a third of the TTL while held (the watchdog); otherwise only check ownership
    /// at a third of the TTL, without extending, until the deadline.
    pub(crate) renew: bool,
    /// Stop renewing this long after the lease started (maximum hold time); it then runs out.
    pub(crate) max_hold: Option<Duration>,
}

/// How long before the store's expiry the keeper gives a lease up: the store's clock may
/// round down to a millisecond and timers fire late, so the lost signal must not wait for the
/// last instant.
fn trusted(ttl: Duration) -> Duration {
    ttl.saturating_sub(Duration::from_millis(2) + ttl / 100)
}

/// What the keeper's log lines name: the lock and its store, never the lease's internals
/// (connections, files, watchers).
#[derive(Clone, Debug)]
pub(crate) struct LeaseLabel {
    /// The lock's name.
    pub(crate) name: Arc<str>,
    /// The backend's scheme name.
    pub(crate) backend: &'static str,
}

#[derive(Debug)]
struct Entry {
    lease: Arc<dyn Lease>,
    label: LeaseLabel,
    policy: KeepPolicy,
    /// Renewal stops here (from `max_hold`).
    renew_until: Option<Instant>,
    /// When the lease expires by our monotonic clock, counted from before the request that set it.
    deadline: Instant,
    /// The next renewal (watchdog) or ownership check, or the deadline itself.
    due: Instant,
    /// A renewal or an ownership check is in flight.
    renewing: bool,
    /// The last renewal failed with a store error (not a refusal): a deadline passing now
    /// means the store could not be reached.
    failing: bool,
    /// The runtime the lease was registered from: where the keeper can run if its own
    /// runtime shuts down.
    home: Handle,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<u64, Entry>,
    schedule: BTreeSet<(Instant, u64)>,
    next_id: u64,
    running: bool,
    /// The runtime the keeper task runs on, while it runs.
    runtime: Option<RuntimeId>,
    /// Runtimes that shut down under the keeper task, while leases registered from them are
    /// still kept: the keeper is not started there again.
    dead_runtimes: Vec<RuntimeId>,
    /// When the keeper task will next wake by itself (`None`: only when notified). A new
    /// entry due later needs no notification, which saves a task wake-up per acquisition.
    wake_at: Option<Instant>,
}

impl State {
    fn needs_wake(&self, due: Instant) -> bool {
        self.wake_at.is_none_or(|at| due < at)
    }
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    changed: Notify,
}

/// The per-client keeper; clones share one schedule.
#[derive(Clone, Debug, Default)]
pub(crate) struct Keeper {
    shared: Arc<Shared>,
}

/// A lease's place in the keeper; dropping it stops renewal.
#[derive(Debug)]
pub(crate) struct Registration {
    keeper: Keeper,
    id: u64,
    backend: &'static str,
    /// When the hold was registered, for the hold time recorded when it ends.
    since: Instant,
}

impl Registration {
    /// Renewals stop: the lease runs out at its deadline unless extended (a composed hold's
    /// fixed-TTL part, renewed only while the hold was collected).
    pub(crate) fn stop_renewing(&self) {
        if let Some(entry) = self.keeper.lock().entries.get_mut(&self.id) {
            entry.policy.renew = false;
        }
    }

    /// Records a successful extension: the lease now lasts `ttl` from `started`.
    pub(crate) fn extended(&self, started: Instant, ttl: Duration) {
        let mut guard = self.keeper.lock();
        let state = &mut *guard;
        if let Some(entry) = state.entries.get_mut(&self.id) {
            let old_due = entry.due;
            entry.deadline = entry.deadline.max(started + trusted(ttl));
            entry.policy.ttl = entry.policy.ttl.max(ttl);
            entry.due = next_due(entry, started);
            let (due, id) = (entry.due, self.id);
            state.schedule.remove(&(old_due, id));
            state.schedule.insert((due, id));
            if !state.needs_wake(due) {
                return;
            }
        }
        drop(guard);
        self.keeper.shared.changed.notify_one();
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut state = self.keeper.lock();
        if let Some(entry) = state.entries.remove(&self.id) {
            state.schedule.remove(&(entry.due, self.id));
            held_gauge(self.backend).decrement(1.0);
        }
        drop(state);
        metrics::histogram!("dlock_hold_seconds", "backend" => self.backend)
            .record(self.since.elapsed().as_secs_f64());
    }
}

/// Leases being kept (held and not known lost), per backend.
fn held_gauge(backend: &'static str) -> metrics::Gauge {
    metrics::gauge!("dlock_held", "backend" => backend)
}

/// Gives up a lease for `reason`: the reason for its guard, the loss counted, the signal fired.
fn give_up(entry: &Entry, reason: LostReason) {
    metrics::counter!(
        "dlock_lost_total",
        "backend" => entry.label.backend,
        "reason" => reason.as_str()
    )
    .increment(1);
    held_gauge(entry.label.backend).decrement(1.0);
    entry.lease.core().signal().fire(reason);
}

fn renew_allowed(entry: &Entry, at: Instant) -> bool {
    entry.policy.renew && entry.renew_until.is_none_or(|until| at < until)
}

/// The next renewal or, for a lease not renewed, the next ownership check: both every third
/// of the TTL, and never after the deadline.
fn next_due(entry: &Entry, from: Instant) -> Instant {
    (from + entry.policy.ttl / 3).min(entry.deadline)
}

impl Keeper {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the schedule half-updated in a way that
        // matters more than stopping renewals would, so keep going with the inner value.
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts keeping `lease`, whose store lease was set to `policy.ttl` by a request sent at
    /// `started`. Must be called inside a tokio runtime.
    pub(crate) fn register(
        &self,
        lease: Arc<dyn Lease>,
        label: LeaseLabel,
        policy: KeepPolicy,
        started: Instant,
    ) -> Registration {
        let backend = label.backend;
        held_gauge(backend).increment(1.0);
        let home = Handle::current();
        let mut state = self.lock();
        let id = state.next_id;
        state.next_id += 1;
        let mut entry = Entry {
            lease,
            label,
            policy,
            renew_until: policy.max_hold.and_then(|max| started.checked_add(max)),
            deadline: started + trusted(policy.ttl),
            due: started,
            renewing: false,
            failing: false,
            home: home.clone(),
        };
        entry.due = next_due(&entry, started);
        let wake = state.needs_wake(entry.due);
        state.schedule.insert((entry.due, id));
        state.entries.insert(id, entry);
        let start_on = (!state.running).then(|| {
            state.running = true;
            state.runtime = Some(home.id());
            home
        });
        drop(state);
        if let Some(runtime) = start_on {
            self.start_on(&runtime);
        }
        if wake {
            self.shared.changed.notify_one();
        }
        Registration {
            keeper: self.clone(),
            id,
            backend,
            since: Instant::now(),
        }
    }

    /// Spawns the keeper task on `runtime`; `running` is already set. Called without the
    /// state's lock: a runtime that has shut down drops the task at once, and its guard then
    /// takes the lock to start the task elsewhere.
    fn start_on(&self, runtime: &Handle) {
        // The guard is an argument, so it is dropped (clearing `running`, or starting the task
        // elsewhere) even if the task is dropped before it ever runs.
        let stopped = StopGuard {
            keeper: self.clone(),
            armed: true,
        };
        runtime.spawn(run(self.shared.clone(), stopped));
    }

    /// Stops keeping every lease and hands them over, so the caller can release them; the
    /// keeper task, left with nothing, ends. Guards of these leases stay valid objects: their
    /// registrations find nothing to remove.
    pub(crate) fn take_all(&self) -> Vec<(Arc<dyn Lease>, LeaseLabel)> {
        let mut state = self.lock();
        state.schedule.clear();
        let taken = state
            .entries
            .drain()
            .map(|(_, entry)| {
                held_gauge(entry.label.backend).decrement(1.0);
                (entry.lease, entry.label)
            })
            .collect();
        drop(state);
        self.shared.changed.notify_one();
        taken
    }

    /// Number of leases being kept and not yet known lost. A lease whose loss was signalled
    /// by its store (a session lock's own task) may wait a moment for the keeper to drop it;
    /// it no longer counts.
    pub(crate) fn len(&self) -> usize {
        self.lock()
            .entries
            .values()
            .filter(|entry| !entry.lease.lost().is_cancelled())
            .count()
    }
}
