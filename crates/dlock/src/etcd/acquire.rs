//! Acquiring an etcd lock: a queue key under a fresh lease, the wait for the turn (watching the
//! predecessor), and the clean-up of an abandoned attempt.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, EventType, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse,
    WatchFilterType, WatchOptions,
};
use tokio::time::Instant;

use crate::backend::wait::Backoff;
use crate::backend::{AcquireRequest, Wait};
use crate::error::{Error, Result};

use super::config::WAITER_LEASE_SECS;
use super::encode_value;
use super::error::{BACKEND, bad_reply, lease_gone, map};
use super::first_by_create;
use super::lease::EtcdLease;
use super::lease_secs;
use super::queue_rules::{Wanted, key_base, queue_key};
use super::revision;
use super::{EtcdBackend, Inner, RETRY_MAX, RETRY_MIN};
use crate::backend::queue_rules::QueueKind;

/// Leases an acquire call has granted and not handed over yet; revoked (which deletes their
/// keys) if the call ends without the lock, including when its future is dropped (the call
/// keeps it in an [`Abandon`](crate::backend::abandon::Abandon) that revokes them all).
pub(super) struct Pending {
    pub(super) inner: Arc<Inner>,
    pub(super) leases: Mutex<Vec<i64>>,
}

impl Pending {
    fn leases(&self) -> std::sync::MutexGuard<'_, Vec<i64>> {
        self.leases.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn track(&self, id: i64) {
        self.leases().push(id);
    }

    /// The lease is handed to a hold: no longer ours to clean up.
    fn keep(&self, id: i64) {
        self.leases().retain(|l| *l != id);
    }

    fn revoke(&self, id: i64) {
        self.keep(id);
        self.inner.revoke_later(vec![id]);
    }

    pub(super) fn revoke_all(&self) {
        let ids = std::mem::take(&mut *self.leases());
        self.inner.revoke_later(ids);
    }

    /// Revokes every lease before returning, so the call's keys are gone when it reports:
    /// a refused call must not linger in the queue where the next caller would see it.
    pub(super) async fn revoke_now(&self) {
        let ids = std::mem::take(&mut *self.leases());
        for id in ids {
            let revoked = self
                .inner
                .resend(|mut c| async move { c.lease_revoke(id).await })
                .await;
            match revoked {
                Err(error) if !lease_gone(&error) => {
                    tracing::debug!(%error, lease = id, "revoking a lease failed; it expires instead");
                }
                _ => {}
            }
        }
    }
}

/// The waiter's place in the queue was lost (its lease ran out while it waited, for example
/// because the process was paused): retryable, the waiter queues again.
fn place_lost() -> Error {
    Error::Unavailable {
        backend: BACKEND,
        source: "the lease of this waiter's place in the queue ran out; queueing again".into(),
    }
}

/// The pause after each failure in a row while waiting, doubling from twice
/// [`RETRY_MIN`] to [`RETRY_MAX`].
pub(super) fn retry_backoff() -> Backoff {
    Backoff::steady(RETRY_MIN.saturating_mul(2), RETRY_MAX)
}

/// How the confirmation of a turn ended.
enum Confirmed {
    /// Our key is on the hold's lease: the lock is ours.
    Ours,
    /// Our key is still queued, but a key ahead of it is left: wait again.
    NotFirst,
}

/// Whether a lease of `secs` asked for at `since` has, at `now`, at least `margin` left in
/// etcd (which started it after `since`).
fn lasts(secs: i64, since: Instant, now: Instant, margin: Duration) -> bool {
    let granted = Duration::from_secs(u64::try_from(secs).unwrap_or(0));
    since + granted > now + margin
}

/// Watchers a waiter registers, one after the other on one watch stream, for the key it waits
/// on. etcd turns a watch without a start revision into one from its current revision + 1 and
/// only then registers it (v3rpc `recvLoop`, then `watchableStore.watch`, which takes the
/// store's lock); a write that commits in between (or holds the lock meanwhile) leaves the
/// watcher in the unsynced group, which etcd serves every 100 ms: the hand-off then waits up
/// to 100 ms. Measured with 4 processes contending for one name (`dlock bench --scenario
/// handoff`, etcd 3.4), about 2 % of wake-ups came that way (14 of 737), up to 95 ms late,
/// which set the hand-off gap's p99. With two watchers the wake-up is late only when both are
/// caught, and the second one's window opens after the first one's write is done: 1 late
/// wake-up in 3,000, the gap's p99 from 25-63 ms to 13-19 ms in the same period.
const WATCHERS: usize = 2;

/// What [`EtcdBackend::watch_ahead`] found.
#[expect(
    clippy::large_enum_variant,
    reason = "one per wait step, moved once: a box would only add an allocation"
)]
enum Watched {
    /// Nothing to wait for: our turn, as read.
    Nothing,
    /// What we wait for changed while the watch was being set up: look again.
    Changed,
    /// The watch on what we wait for is live.
    Live(etcd_client::WatchStream),
}

/// How the wait for the predecessor ended.
enum Turn {
    /// No key ahead is left, as read; or, where the first in line wins, the key we watched
    /// was deleted (the confirmation checks that no other is left ahead).
    First,
    /// The wait ran out.
    TimedOut,
}

/// A lease this call was granted: its id, its granted length in seconds, and an instant
/// before it was asked for (etcd keeps it at least until `since + secs` unless it is kept
/// alive).
#[derive(Clone, Copy, Debug)]
struct Granted {
    id: i64,
    secs: i64,
    since: Instant,
}

impl Granted {
    /// The id and length, as a hold keeps them.
    fn lease(self) -> (i64, i64) {
        (self.id, self.secs)
    }
}

/// Our key in the lock's queue (`prefix` is the lock's key base), created at revision `rev`.
struct Place {
    shape: QueueKind,
    prefix: Vec<u8>,
    key: Vec<u8>,
    rev: i64,
}

/// How queueing our key ended.
enum Queued {
    /// The lock was ours at once.
    Ours(EtcdLease),
    /// Busy, and the call does not wait: its key is gone again.
    Busy,
    /// Our key waits for its turn.
    Waiting(Place),
}

impl EtcdBackend {
    /// One pass: queue, wait for our turn, confirm. A retryable error means "start over".
    pub(super) async fn attempt(
        &self,
        req: &AcquireRequest,
        pending: &Pending,
    ) -> Result<Option<EtcdLease>> {
        let shape = QueueKind::of(req.kind);
        let prefix = key_base(shape, &self.inner.config.prefix, req.name.as_str());
        let secs = lease_secs(req.ttl);
        let hold = self.grant_tracked(secs, pending).await?;
        let key = queue_key(shape, &prefix, hold.id);
        if req.wait == Wait::No && matches!(shape, QueueKind::Exclusive) {
            return self.try_create(req, &prefix, key, hold, pending).await;
        }
        let place = match self.enqueue(req, shape, prefix, key, hold, pending).await? {
            Queued::Ours(lease) => return Ok(Some(lease)),
            Queued::Busy => return Ok(None),
            Queued::Waiting(place) => place,
        };
        let queue_lease = self.waiter_lease(&place, hold, pending).await?;
        self.take_turn(req, place, hold, queue_lease, pending).await
    }

    /// A lease of `secs` for this call, tracked by `pending` until a hold takes it.
    async fn grant_tracked(&self, secs: i64, pending: &Pending) -> Result<Granted> {
        let since = Instant::now();
        let (id, secs) = self.inner.grant(secs).await?;
        pending.track(id);
        Ok(Granted { id, secs, since })
    }

    /// A try of a mutex that does not wait: creates the key only if the lock has no key at
    /// all, so a busy try leaves nothing.
    async fn try_create(
        &self,
        req: &AcquireRequest,
        prefix: &[u8],
        key: Vec<u8>,
        hold: Granted,
        pending: &Pending,
    ) -> Result<Option<EtcdLease>> {
        let inner = &self.inner;
        let reply = inner
            .raw_txn(
                Txn::new()
                    .when([
                        Compare::create_revision(prefix.to_vec(), CompareOp::Equal, 0)
                            .with_prefix(),
                    ])
                    .and_then([TxnOp::put(
                        key.clone(),
                        encode_value(req),
                        Some(PutOptions::new().with_lease(hold.id)),
                    )]),
            )
            .await
            .map_err(|e| lease_lost_is_retryable(e, false))?;
        if !reply.succeeded() {
            pending.revoke(hold.id);
            return Ok(None);
        }
        let fence = revision(reply.header(), "acquire")?;
        pending.keep(hold.id);
        Ok(Some(EtcdLease::new(
            inner.clone(),
            req,
            key,
            fence,
            hold.lease(),
            hold.since,
        )))
    }

    /// Queues: creates our key and reads the holder in the same transaction; the lock is ours
    /// at once if nobody is ahead by the rules of `shape`.
    async fn enqueue(
        &self,
        req: &AcquireRequest,
        shape: QueueKind,
        prefix: Vec<u8>,
        key: Vec<u8>,
        hold: Granted,
        pending: &Pending,
    ) -> Result<Queued> {
        let inner = &self.inner;
        let reply = inner
            .raw_txn(
                Txn::new()
                    .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                    .and_then([
                        TxnOp::put(
                            key.clone(),
                            encode_value(req),
                            Some(PutOptions::new().with_lease(hold.id)),
                        ),
                        TxnOp::get(prefix.clone(), Some(first_by_create())),
                    ]),
            )
            .await
            .map_err(|e| lease_lost_is_retryable(e, true))?;
        if !reply.succeeded() {
            return Err(bad_reply("queue (the key of a fresh lease exists)"));
        }
        let rev = revision(reply.header(), "queue")?;
        let holder_rev = reply
            .op_responses()
            .into_iter()
            .find_map(|op| match op {
                TxnOpResponse::Get(get) => get.kvs().first().map(KeyValue::create_revision),
                _ => None,
            })
            .ok_or_else(|| bad_reply("queue"))?;
        let ours = if shape.first_in_line_wins() {
            holder_rev == rev
        } else {
            matches!(inner.wanted(shape, &prefix, rev).await?.0, Wanted::Nothing)
        };
        if !ours && req.wait == Wait::No {
            // A busy try leaves nothing: the key goes now (it would count as a place ahead of
            // others until its lease's revocation lands), the lease in the background.
            let key = &key;
            inner
                .resend(|mut c| async move { c.delete(key.as_slice(), None).await })
                .await
                .map_err(map)?;
            pending.revoke_all();
            return Ok(Queued::Busy);
        }
        if ours {
            pending.keep(hold.id);
            return Ok(Queued::Ours(EtcdLease::new(
                inner.clone(),
                req,
                key,
                rev,
                hold.lease(),
                hold.since,
            )));
        }
        Ok(Queued::Waiting(Place {
            shape,
            prefix,
            key,
            rev,
        }))
    }

    /// The lease our key waits on. A short one, so a waiter that dies (or is paused) holds up
    /// the queue for seconds, not for its TTL. The hold's own lease stays granted, with no key
    /// on it, so that the turn needs no LeaseGrant (a Raft write) on the hand-off path: a
    /// keep-alive restarts it at its full length then. A waiter that dies leaves a lease with
    /// no key, which etcd expires.
    async fn waiter_lease(
        &self,
        place: &Place,
        hold: Granted,
        pending: &Pending,
    ) -> Result<Granted> {
        if hold.secs <= WAITER_LEASE_SECS {
            return Ok(hold);
        }
        let waiter = self.grant_tracked(WAITER_LEASE_SECS, pending).await?;
        let moved = self
            .inner
            .raw_txn(
                Txn::new()
                    .when([Compare::create_revision(
                        place.key.clone(),
                        CompareOp::Equal,
                        place.rev,
                    )])
                    .and_then([TxnOp::put(
                        place.key.clone(),
                        Vec::new(),
                        Some(PutOptions::new().with_lease(waiter.id).with_ignore_value()),
                    )]),
            )
            .await
            .map_err(|e| lease_lost_is_retryable(e, true))?;
        if !moved.succeeded() {
            return Err(place_lost());
        }
        Ok(waiter)
    }

    /// Waits for our turn and confirms it, until the lock is ours or the wait runs out.
    async fn take_turn(
        &self,
        req: &AcquireRequest,
        place: Place,
        mut hold: Granted,
        queue_lease: Granted,
        pending: &Pending,
    ) -> Result<Option<EtcdLease>> {
        let inner = &self.inner;
        loop {
            match self.wait_turn(&place, queue_lease, req.wait).await? {
                Turn::TimedOut => {
                    pending.revoke_all();
                    return Ok(None);
                }
                Turn::First => {}
            }
            let start = Instant::now();
            let fresh = hold.id != queue_lease.id
                && !lasts(hold.secs, hold.since, start, inner.config.timeout);
            if fresh {
                // Waited about as long as the hold's lease: a keep-alive could land on a lease
                // that has just expired (and etcd would then delete our key with it). A fresh
                // one instead.
                let (id, secs) = inner.grant(lease_secs(req.ttl)).await?;
                pending.track(id);
                pending.revoke(hold.id);
                hold = Granted {
                    id,
                    secs,
                    since: start,
                };
            }
            match self.confirm(&place, req, hold.id, !fresh).await? {
                Confirmed::Ours => {}
                // A key ahead is still there (the one we watched was a waiter that left):
                // wait again.
                Confirmed::NotFirst => continue,
            }
            if queue_lease.id != hold.id {
                pending.revoke(queue_lease.id);
            }
            pending.keep(hold.id);
            return Ok(Some(EtcdLease::new(
                inner.clone(),
                req,
                place.key,
                place.rev,
                hold.lease(),
                start,
            )));
        }
    }

    /// Our turn (or, for the kinds where the first in line wins, the deletion of the key we
    /// watched, checked here). Confirms in one transaction that our key still exists with its
    /// create revision (and, where the first in line wins, that no key is left ahead of it)
    /// while putting it on the hold's lease `lease.0`, so that a lock is never granted on a
    /// lease that expired during the wait (etcd issue 11456); `keep_alive_first` says that
    /// the lease needs a keep-alive first (it was granted before the wait), which runs in
    /// parallel and starts its TTL afresh.
    async fn confirm(
        &self,
        place: &Place,
        req: &AcquireRequest,
        lease: i64,
        keep_alive_first: bool,
    ) -> Result<Confirmed> {
        let inner = &self.inner;
        let (shape, prefix, key, my_rev) = (place.shape, &place.prefix, &place.key, place.rev);
        let mut when = vec![Compare::create_revision(
            key.to_vec(),
            CompareOp::Equal,
            my_rev,
        )];
        if shape.first_in_line_wins() {
            // Every key of the lock was created at or after ours: none is left ahead.
            when.push(
                Compare::create_revision(prefix.to_vec(), CompareOp::Greater, my_rev - 1)
                    .with_prefix(),
            );
        }
        let txn = Txn::new()
            .when(when)
            .and_then([TxnOp::put(
                key.to_vec(),
                encode_value(req),
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(key.to_vec(), None)]);
        let (alive, confirmed) = if keep_alive_first {
            tokio::join!(inner.keep_alive(lease), inner.raw_txn(txn))
        } else {
            (Ok(()), inner.raw_txn(txn).await)
        };
        match alive {
            Err(error) if lease_gone(&error) => return Err(place_lost()),
            Err(error) => return Err(map(error)),
            Ok(()) => {}
        }
        let reply = confirmed.map_err(|e| lease_lost_is_retryable(e, true))?;
        if reply.succeeded() {
            return Ok(Confirmed::Ours);
        }
        let still_queued = reply.op_responses().into_iter().any(|op| match op {
            TxnOpResponse::Get(get) => get
                .kvs()
                .first()
                .is_some_and(|kv| kv.create_revision() == my_rev),
            _ => false,
        });
        if still_queued && shape.first_in_line_wins() {
            Ok(Confirmed::NotFirst)
        } else {
            Err(place_lost())
        }
    }

    /// Watches what our key waits for (the key just ahead, or any deletion), once the
    /// watchers are live and the queue read again shows the same.
    async fn watch_ahead(&self, place: &Place) -> Result<Watched> {
        let inner = &self.inner;
        let (shape, prefix, my_rev) = (place.shape, place.prefix.as_slice(), place.rev);
        let (wanted, _) = inner.wanted(shape, prefix, my_rev).await?;
        let (watched, whole_base) = match &wanted {
            Wanted::Nothing => return Ok(Watched::Nothing),
            Wanted::Key(key) => (key.clone(), false),
            Wanted::AnyDeletion => (prefix.to_vec(), true),
        };
        // A watch from the current revision, not from the one we read at: etcd serves
        // a watch that starts in the past from its unsynced group, caught up only every
        // 100 ms, so a hand-off could wait that long. A deletion between the read and
        // the watch is caught by reading again once the watch is live.
        let watched = &watched;
        let options = || {
            let options = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
            if whole_base {
                options.with_prefix()
            } else {
                options
            }
        };
        let mut stream = inner
            .resend(|mut c| async move { c.watch(watched.as_slice(), Some(options())).await })
            .await
            .map_err(map)?;
        // The same watch again on the same stream (see `WATCHERS`): whichever of them
        // etcd registered in its synced group reports the deletion at once.
        for _ in 1..WATCHERS {
            stream
                .watch(watched.clone(), Some(options()))
                .await
                .map_err(map)?;
        }
        let mut created = 0;
        while created < WATCHERS {
            match stream.message().await.map_err(map)? {
                Some(reply) if reply.created() && !reply.canceled() => created += 1,
                // Not created, or an event before every watcher is live (what we wait
                // for may have happened already): look at the queue again.
                _ => return Ok(Watched::Changed),
            }
        }
        let (now_wanted, _) = inner.wanted(shape, prefix, my_rev).await?;
        Ok(if now_wanted == Wanted::Nothing {
            Watched::Nothing
        } else if now_wanted == wanted {
            Watched::Live(stream)
        } else {
            Watched::Changed
        })
    }

    /// Waits until our key has its turn by the rules of its kind (`queue_rules`), watching
    /// only the key that must go where there is one (no herd), and keeping our queue lease
    /// alive meanwhile.
    async fn wait_turn(&self, place: &Place, queue_lease: Granted, wait: Wait) -> Result<Turn> {
        let inner = &self.inner;
        let every = Duration::from_secs(u64::try_from(queue_lease.secs).unwrap_or(1)) / 4;
        let mut keep_alive = tokio::time::interval_at(Instant::now() + every, every);
        keep_alive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut backoff = retry_backoff();
        loop {
            let found = tokio::select! {
                found = self.watch_ahead(place) => found,
                () = wait.ended() => return Ok(Turn::TimedOut),
            };
            let mut stream = match found {
                Ok(Watched::Nothing) => return Ok(Turn::First),
                // What we wait for changed while the watch was being set up: start over.
                Ok(Watched::Changed) => continue,
                Ok(Watched::Live(stream)) => stream,
                Err(error) if error.is_retryable() => {
                    tracing::debug!(%error, "etcd wait step failed; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(backoff.next()) => continue,
                        () = wait.ended() => return Ok(Turn::TimedOut),
                    }
                }
                Err(error) => return Err(error),
            };
            backoff.reset();
            loop {
                tokio::select! {
                    message = stream.message() => match message {
                        Ok(Some(reply)) if reply.canceled() => break,
                        Ok(Some(reply)) => {
                            if reply.events().iter().any(|e| e.event_type() == EventType::Delete) {
                                // The key just before ours went: no read before the
                                // confirmation, which checks that no key is left ahead (a
                                // round trip less in every hand-off).
                                if place.shape.first_in_line_wins() {
                                    return Ok(Turn::First);
                                }
                                break;
                            }
                        }
                        // The stream ended or broke: look at the queue again.
                        Ok(None) | Err(_) => break,
                    },
                    _ = keep_alive.tick() => match inner.keep_alive(queue_lease.id).await {
                        Ok(()) => {}
                        Err(error) if lease_gone(&error) => return Err(place_lost()),
                        // Unreachable for now: the lease has seconds left; try at the next tick.
                        Err(error) => tracing::debug!(%error, "keep-alive of a waiter failed"),
                    },
                    () = wait.ended() => return Ok(Turn::TimedOut),
                }
            }
        }
    }
}

/// A put that names a lease which no longer exists fails with "lease not found": for a
/// waiter, its place is gone (retry); elsewhere a plain store error.
fn lease_lost_is_retryable(error: etcd_client::Error, waiting: bool) -> Error {
    if waiting && lease_gone(&error) {
        place_lost()
    } else {
        map(error)
    }
}
