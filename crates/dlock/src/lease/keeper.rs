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
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::backend::Lease;
use crate::error::Error;

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

/// A renewal's entry id, start, the TTL it asked for, and the store's answer.
type RenewalResult = (u64, Instant, Duration, Result<(), Error>);

/// How much earlier than due a renewal may go, to travel with others of the same pass: at most
/// this, and at most [`early`] of its lease.
const EARLY_MAX: Duration = Duration::from_millis(50);

/// How much earlier than due `entry`'s renewal may go: a twelfth of its TTL (its renewals
/// then come at least every quarter of the TTL instead of every third), at most [`EARLY_MAX`].
fn early(entry: &Entry) -> Duration {
    (entry.policy.ttl / 12).min(EARLY_MAX)
}

/// The renewals of one pass, polled together in one task: they start in the same poll, so a
/// store that gathers the renewals arriving together (Redis, SQLite) sends them in one round
/// trip, and ten thousand renewals cost one task, not ten thousand. Each answer is taken as
/// it comes: a slow renewal (a dead connection) does not hold back the others'.
async fn renew_together(
    keeper: Keeper,
    batch: Vec<impl std::future::Future<Output = RenewalResult>>,
) {
    let mut pending: futures::stream::FuturesUnordered<_> = batch.into_iter().collect();
    while let Some((id, started, ttl, result)) = futures::StreamExt::next(&mut pending).await {
        renewed(&keeper, id, started, ttl, result);
    }
}

/// Marks the keeper stopped however its task ends, including when the runtime it runs on shuts
/// down and drops it mid-sleep. Leases registered from other runtimes would then be left
/// without renewals or lost signals until the next registration, so the task starts again on
/// the runtime of one of them that is not known to have shut down.
struct StopGuard {
    keeper: Keeper,
    armed: bool,
}

impl Drop for StopGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut guard = self.keeper.lock();
        let state = &mut *guard;
        state.running = false;
        state.wake_at = None;
        if let Some(dead) = state.runtime.take() {
            state.dead_runtimes.push(dead);
        }
        let dead = &state.dead_runtimes;
        let next = state
            .entries
            .values()
            .find(|entry| !dead.contains(&entry.home.id()))
            .map(|entry| entry.home.clone());
        // Only runtimes some lease came from can be asked about again.
        let entries = &state.entries;
        state
            .dead_runtimes
            .retain(|id| entries.values().any(|entry| entry.home.id() == *id));
        let Some(next) = next else {
            return;
        };
        // Renewals in flight ran on the runtime that is gone: none will answer, so those
        // leases are due again now, not at their deadline.
        let now = Instant::now();
        for (&id, entry) in &mut state.entries {
            if entry.renewing {
                entry.renewing = false;
                state.schedule.remove(&(entry.due, id));
                entry.due = now;
                state.schedule.insert((now, id));
            }
        }
        state.running = true;
        state.runtime = Some(next.id());
        drop(guard);
        self.keeper.start_on(&next);
    }
}

async fn run(shared: Arc<Shared>, mut stopped: StopGuard) {
    let keeper = Keeper { shared };
    let mut renewals: JoinSet<()> = JoinSet::new();
    loop {
        let next_wake = {
            let mut guard = keeper.lock();
            let state = &mut *guard;
            let now = Instant::now();
            // The renewals of this pass, sent together (see `renew_together`).
            let mut batch = Vec::new();
            // Leases due a little later that could not join this pass, to schedule again.
            let mut not_yet = Vec::new();
            while let Some(&(due, id)) = state.schedule.first() {
                if due > now + EARLY_MAX {
                    break;
                }
                state.schedule.pop_first();
                let Some(entry) = state.entries.get_mut(&id) else {
                    continue;
                };
                // Early only for a renewal or check that is not the lease's last moment.
                if due > now
                    && (entry.renewing || due >= entry.deadline || due - now > early(entry))
                {
                    not_yet.push((due, id));
                    continue;
                }
                if now >= entry.deadline {
                    let why = if entry.policy.renew {
                        "its lease ran out before a renewal was confirmed (store unreachable or slow)"
                    } else {
                        "its fixed lease ran out"
                    };
                    tracing::warn!(
                        lock = %entry.label.name,
                        backend = %entry.label.backend,
                        fence = entry.lease.fence().get(),
                        late_ms = u64::try_from(now.duration_since(entry.deadline).as_millis())
                            .unwrap_or(u64::MAX),
                        "lock lost: {why}"
                    );
                    give_up(
                        entry,
                        // Renewals were due all along: one failed, or one never answered.
                        if entry.failing || (entry.renewing && renew_allowed(entry, now)) {
                            LostReason::StoreUnreachable
                        } else {
                            LostReason::Expired
                        },
                    );
                    state.entries.remove(&id);
                    continue;
                }
                if !entry.renewing {
                    entry.renewing = true;
                    let lease = entry.lease.clone();
                    // A zero TTL only checks ownership: a fixed lease is never made longer.
                    let ttl = if renew_allowed(entry, now) {
                        entry.policy.ttl
                    } else {
                        Duration::ZERO
                    };
                    let span = tracing::debug_span!(
                        "dlock.renew",
                        lock = %entry.label.name,
                        backend = entry.label.backend,
                        fence = lease.fence().get(),
                        ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
                    );
                    batch.push(tracing::Instrument::instrument(
                        async move {
                            let started = Instant::now();
                            (id, started, ttl, lease.extend(ttl).await)
                        },
                        span,
                    ));
                }
                // Until the renewal answers, the deadline is the next thing to act on.
                entry.due = entry.deadline;
                state.schedule.insert((entry.due, id));
            }
            state.schedule.extend(not_yet);
            if !batch.is_empty() {
                renewals.spawn(renew_together(keeper.clone(), batch));
            }
            if state.entries.is_empty() && renewals.is_empty() {
                // Under the lock, so a concurrent `register` either sees a running keeper that
                // will serve it or starts a new one.
                state.running = false;
                state.runtime = None;
                state.wake_at = None;
                stopped.armed = false;
                return;
            }
            state.wake_at = state.schedule.first().map(|&(due, _)| due);
            state.wake_at
        };
        let sleep = async {
            match next_wake {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = sleep => {}
            () = keeper.shared.changed.notified() => {}
            Some(_) = renewals.join_next(), if !renewals.is_empty() => {}
        }
    }
}

fn renewed(keeper: &Keeper, id: u64, started: Instant, ttl: Duration, result: Result<(), Error>) {
    let mut guard = keeper.lock();
    let state = &mut *guard;
    let Some(entry) = state.entries.get_mut(&id) else {
        return;
    };
    entry.renewing = false;
    let old_due = entry.due;
    match result {
        Ok(()) => {
            entry.failing = false;
            if ttl > Duration::ZERO {
                metrics::counter!("dlock_renewals_total", "backend" => entry.label.backend)
                    .increment(1);
            }
            entry.deadline = entry.deadline.max(started + trusted(ttl));
            entry.due = next_due(entry, started);
        }
        Err(Error::NotOwned { .. }) => {
            tracing::warn!(
                lock = %entry.label.name,
                backend = %entry.label.backend,
                fence = entry.lease.fence().get(),
                lease_left_ms =
                    u64::try_from(entry.deadline.saturating_duration_since(Instant::now()).as_millis())
                        .unwrap_or(u64::MAX),
                "lock lost: the store no longer has this hold (expired, broken or taken over)"
            );
            give_up(entry, LostReason::RenewalRefused);
            state.schedule.remove(&(old_due, id));
            state.entries.remove(&id);
            return;
        }
        Err(error) => {
            // The store is unreachable or slow: try again soon, the deadline still protects us.
            tracing::debug!(%error, "renewal failed, retrying");
            entry.failing = true;
            metrics::counter!("dlock_renewal_errors_total", "backend" => entry.label.backend)
                .increment(1);
            let retry = (Instant::now() + entry.policy.ttl / 10).min(entry.deadline);
            entry.due = retry;
        }
    }
    let due = entry.due;
    state.schedule.remove(&(old_due, id));
    state.schedule.insert((due, id));
    // Answered outside the keeper's loop: wake it if this is now the first thing due.
    if state.needs_wake(due) {
        drop(guard);
        keeper.shared.changed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::LeaseCore;
    use crate::fence::FencingToken;
    use async_trait::async_trait;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    /// A scripted lease: counts renewals and refuses them once `owned` is false.
    #[derive(Debug)]
    struct ScriptedLease {
        core: LeaseCore,
        renewals: AtomicU32,
        checks: AtomicU32,
        disowned: AtomicBool,
        unreachable: AtomicBool,
    }

    impl Default for ScriptedLease {
        fn default() -> ScriptedLease {
            ScriptedLease {
                core: LeaseCore::new(FencingToken::new(1), Instant::now()),
                renewals: AtomicU32::default(),
                checks: AtomicU32::default(),
                disowned: AtomicBool::default(),
                unreachable: AtomicBool::default(),
            }
        }
    }

    #[async_trait]
    impl Lease for ScriptedLease {
        fn core(&self) -> &LeaseCore {
            &self.core
        }
        /// Always just renewed: the keeper's local deadline never ends these holds.
        fn lease_start(&self) -> Instant {
            Instant::now()
        }
        async fn extend(&self, ttl: Duration) -> crate::Result<()> {
            if self.unreachable.load(Ordering::SeqCst) {
                return Err(Error::Unavailable {
                    backend: "scripted",
                    source: "down".into(),
                });
            }
            if self.disowned.load(Ordering::SeqCst) {
                return Err(Error::not_owned("x"));
            }
            if ttl.is_zero() {
                self.checks.fetch_add(1, Ordering::SeqCst);
            } else {
                self.renewals.fetch_add(1, Ordering::SeqCst);
            }
            Ok(())
        }
        async fn release(&self) -> crate::Result<()> {
            Ok(())
        }
    }

    fn label() -> LeaseLabel {
        LeaseLabel {
            name: "keeper-test".into(),
            backend: "test",
        }
    }

    fn watchdog(ttl_ms: u64) -> KeepPolicy {
        KeepPolicy {
            ttl: Duration::from_millis(ttl_ms),
            renew: true,
            max_hold: None,
        }
    }

    /// A scripted lease that `keeper` keeps under `policy` from now: the lease, the instant it
    /// started and its registration.
    fn kept(keeper: &Keeper, policy: KeepPolicy) -> (Arc<ScriptedLease>, Instant, Registration) {
        let lease = Arc::new(ScriptedLease::default());
        let start = Instant::now();
        let reg = keeper.register(lease.clone(), label(), policy, start);
        (lease, start, reg)
    }

    /// A fixed TTL: the keeper checks the lease but never renews it.
    fn fixed(ttl_ms: u64) -> KeepPolicy {
        KeepPolicy {
            renew: false,
            ..watchdog(ttl_ms)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn watchdog_renews_through_many_ttls() {
        let keeper = Keeper::default();
        let (lease, _, reg) = kept(&keeper, watchdog(300));
        tokio::time::sleep(Duration::from_millis(3000)).await;
        assert!(!lease.lost().is_cancelled());
        let n = lease.renewals.load(Ordering::SeqCst);
        assert!((25..=31).contains(&n), "{n} renewals in 10 TTLs");
        drop(reg);
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert_eq!(
            lease.renewals.load(Ordering::SeqCst),
            n,
            "renewal continued after release"
        );
        assert_eq!(keeper.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn refused_renewal_fires_lost_at_once() {
        let keeper = Keeper::default();
        let (lease, _, _reg) = kept(&keeper, watchdog(300));
        lease.disowned.store(true, Ordering::SeqCst);
        let start = Instant::now();
        lease.lost().cancelled().await;
        assert!(start.elapsed() <= Duration::from_millis(101));
    }

    #[tokio::test(start_paused = true)]
    async fn unreachable_store_fires_lost_at_the_deadline() {
        let keeper = Keeper::default();
        let (lease, start, _reg) = kept(&keeper, watchdog(300));
        lease.unreachable.store(true, Ordering::SeqCst);
        lease.lost().cancelled().await;
        assert_eq!(start.elapsed(), trusted(Duration::from_millis(300)));
    }

    #[tokio::test(start_paused = true)]
    async fn fixed_ttl_is_not_renewed_and_fires_lost_at_expiry() {
        let keeper = Keeper::default();
        let (lease, start, reg) = kept(&keeper, fixed(500));
        tokio::time::sleep(Duration::from_millis(400)).await;
        reg.extended(Instant::now(), Duration::from_millis(500));
        lease.lost().cancelled().await;
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(400) + trusted(Duration::from_millis(500))
        );
        assert_eq!(lease.renewals.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn fixed_ttl_is_checked_every_third_and_a_break_fires_lost_at_the_next_check() {
        let keeper = Keeper::default();
        let (lease, start, _reg) = kept(&keeper, fixed(600));
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(
            lease.checks.load(Ordering::SeqCst),
            1,
            "one check at 200 ms"
        );
        lease.disowned.store(true, Ordering::SeqCst);
        lease.lost().cancelled().await;
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(400),
            "lost at the second check"
        );
        assert_eq!(
            lease.renewals.load(Ordering::SeqCst),
            0,
            "a fixed lease was extended"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_keeper_restarts_after_its_runtime_died() {
        let keeper = Keeper::default();
        let first = Arc::new(ScriptedLease::default());
        let stale = std::thread::spawn({
            let (keeper, first) = (keeper.clone(), first.clone());
            move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let registration = runtime.block_on(async {
                    keeper.register(first, label(), watchdog(300), Instant::now())
                });
                drop(runtime); // the keeper task dies mid-sleep
                registration
            }
        })
        .join()
        .unwrap();
        let second = Arc::new(ScriptedLease::default());
        let _reg = keeper.register(second.clone(), label(), watchdog(300), Instant::now());
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert!(
            second.renewals.load(Ordering::SeqCst) >= 5,
            "no keeper after the first runtime died"
        );
        drop(stale);
    }

    #[tokio::test(start_paused = true)]
    async fn max_hold_stops_renewal() {
        let keeper = Keeper::default();
        let policy = KeepPolicy {
            max_hold: Some(Duration::from_millis(1000)),
            ..watchdog(300)
        };
        let (lease, start, _reg) = kept(&keeper, policy);
        lease.lost().cancelled().await;
        let held = start.elapsed();
        assert!(
            held >= Duration::from_millis(1000) && held <= Duration::from_millis(1300),
            "{held:?}"
        );
    }
}
