//! The keeper task: each pass sends the renewals that are due together, gives up the leases
//! whose local deadline passed, and sleeps until the next is due; [`renewed`] takes each
//! answer.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{Entry, Keeper, LostReason, Shared, State, give_up, next_due, renew_allowed, trusted};
use crate::error::Error;

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
pub(super) struct StopGuard {
    pub(super) keeper: Keeper,
    pub(super) armed: bool,
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

pub(super) async fn run(shared: Arc<Shared>, mut stopped: StopGuard) {
    let keeper = Keeper { shared };
    let mut renewals: JoinSet<()> = JoinSet::new();
    loop {
        let next_wake = {
            let mut guard = keeper.lock();
            let state = &mut *guard;
            let now = Instant::now();
            // The renewals of this pass, sent together (see `renew_together`).
            let batch = due_renewals(state, now);
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

/// Takes the leases due by `now` (or a little later, see [`early`]) off the schedule: gives up
/// those whose deadline passed, and returns the renewals to send for the others.
fn due_renewals(
    state: &mut State,
    now: Instant,
) -> Vec<impl Future<Output = RenewalResult> + use<>> {
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
        if due > now && (entry.renewing || due >= entry.deadline || due - now > early(entry)) {
            not_yet.push((due, id));
            continue;
        }
        if now >= entry.deadline {
            lose(entry, now);
            state.entries.remove(&id);
            continue;
        }
        if !entry.renewing {
            batch.push(renewal(entry, id, now));
        }
        // Until the renewal answers, the deadline is the next thing to act on.
        entry.due = entry.deadline;
        state.schedule.insert((entry.due, id));
    }
    state.schedule.extend(not_yet);
    batch
}

/// Gives up a lease whose local deadline passed before a renewal was confirmed.
fn lose(entry: &Entry, now: Instant) {
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
}

/// Sends `entry`'s renewal (or, where it may not be renewed, its check) and marks it in
/// flight.
fn renewal(
    entry: &mut Entry,
    id: u64,
    now: Instant,
) -> impl Future<Output = RenewalResult> + use<> {
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
    tracing::Instrument::instrument(
        async move {
            let started = Instant::now();
            (id, started, ttl, lease.extend(ttl).await)
        },
        span,
    )
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
