//! Acquiring an etcd lock: a queue key under a fresh lease, the wait for the turn (watching the
//! predecessor), and the clean-up of an abandoned attempt.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, EventType, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse,
    WatchFilterType, WatchOptions,
};
use tokio::time::Instant;

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
/// keys) if the call ends without the lock, including when its future is dropped.
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

impl Drop for Pending {
    fn drop(&mut self) {
        self.revoke_all();
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

pub(super) fn pause_after(failures: u32) -> Duration {
    RETRY_MIN
        .saturating_mul(1 << failures.min(6))
        .min(RETRY_MAX)
}

/// Sleeps until `deadline`, or forever without one.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// How the wait for the predecessor ended.
enum Turn {
    /// No key with a lower create revision is left: the lock is ours.
    First,
    /// The wait ran out.
    TimedOut,
}

impl EtcdBackend {
    /// One pass: queue, wait for our turn, confirm. A retryable error means "start over".
    pub(super) async fn attempt(
        &self,
        req: &AcquireRequest,
        pending: &Pending,
    ) -> Result<Option<EtcdLease>> {
        let inner = &self.inner;
        let shape = QueueKind::of(req.kind);
        let prefix = key_base(shape, &inner.config.prefix, req.name.as_str());
        let secs = lease_secs(req.ttl);
        let start = Instant::now();
        let (hold, granted) = inner.grant(secs).await?;
        pending.track(hold);
        let key = queue_key(shape, &prefix, hold);
        let put = || PutOptions::new().with_lease(hold);

        if req.wait == Wait::No && matches!(shape, QueueKind::Exclusive) {
            // Create the key only if the lock has no key at all: a busy try leaves nothing.
            let reply = inner
                .raw_txn(
                    Txn::new()
                        .when([
                            Compare::create_revision(prefix.clone(), CompareOp::Equal, 0)
                                .with_prefix(),
                        ])
                        .and_then([TxnOp::put(key.clone(), encode_value(req), Some(put()))]),
                )
                .await
                .map_err(|e| lease_lost_is_retryable(e, false))?;
            if !reply.succeeded() {
                pending.revoke(hold);
                return Ok(None);
            }
            let fence = revision(reply.header(), "acquire")?;
            pending.keep(hold);
            return Ok(Some(EtcdLease::new(
                inner.clone(),
                req,
                key,
                fence,
                (hold, granted),
                start,
            )));
        }

        // Queue: create our key and read the holder in the same transaction.
        let reply = inner
            .raw_txn(
                Txn::new()
                    .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                    .and_then([
                        TxnOp::put(key.clone(), encode_value(req), Some(put())),
                        TxnOp::get(prefix.clone(), Some(first_by_create())),
                    ]),
            )
            .await
            .map_err(|e| lease_lost_is_retryable(e, true))?;
        if !reply.succeeded() {
            return Err(bad_reply("queue (the key of a fresh lease exists)"));
        }
        let my_rev = revision(reply.header(), "queue")?;
        let holder_rev = reply
            .op_responses()
            .into_iter()
            .find_map(|op| match op {
                TxnOpResponse::Get(get) => get.kvs().first().map(KeyValue::create_revision),
                _ => None,
            })
            .ok_or_else(|| bad_reply("queue"))?;
        let ours = if shape.first_in_line_wins() {
            holder_rev == my_rev
        } else {
            matches!(
                inner.wanted(shape, &prefix, my_rev).await?.0,
                Wanted::Nothing
            )
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
            return Ok(None);
        }
        if ours {
            pending.keep(hold);
            return Ok(Some(EtcdLease::new(
                inner.clone(),
                req,
                key,
                my_rev,
                (hold, granted),
                start,
            )));
        }

        // Wait with a short lease on the queue key, so a waiter that dies (or is paused) holds
        // up the queue for seconds, not for its TTL.
        let mut queue_lease = (hold, granted);
        if granted > WAITER_LEASE_SECS {
            let waiter = inner.grant(WAITER_LEASE_SECS).await?;
            pending.track(waiter.0);
            let moved = inner
                .raw_txn(
                    Txn::new()
                        .when([Compare::create_revision(
                            key.clone(),
                            CompareOp::Equal,
                            my_rev,
                        )])
                        .and_then([TxnOp::put(
                            key.clone(),
                            Vec::new(),
                            Some(PutOptions::new().with_lease(waiter.0).with_ignore_value()),
                        )]),
                )
                .await
                .map_err(|e| lease_lost_is_retryable(e, true))?;
            if !moved.succeeded() {
                return Err(place_lost());
            }
            pending.revoke(hold);
            queue_lease = waiter;
        }

        match self
            .wait_turn(
                shape,
                &prefix,
                my_rev,
                queue_lease.0,
                queue_lease.1,
                req.wait,
            )
            .await?
        {
            Turn::TimedOut => {
                pending.revoke_all();
                return Ok(None);
            }
            Turn::First => {}
        }

        // Our turn. Confirm that our key still exists under a live lease before returning
        // (etcd issue 11456: a lock granted on a lease that expired during the wait), and start
        // the hold's TTL afresh.
        let start = Instant::now();
        let confirm = |lease: i64| {
            Txn::new()
                .when([Compare::create_revision(
                    key.clone(),
                    CompareOp::Equal,
                    my_rev,
                )])
                .and_then([TxnOp::put(
                    key.clone(),
                    encode_value(req),
                    Some(PutOptions::new().with_lease(lease)),
                )])
        };
        let lease = if queue_lease.0 == hold {
            let (alive, confirmed) =
                tokio::join!(inner.keep_alive(hold), inner.raw_txn(confirm(hold)));
            match alive {
                Err(error) if lease_gone(&error) => return Err(place_lost()),
                Err(error) => return Err(map(error)),
                Ok(()) => {}
            }
            if !confirmed
                .map_err(|e| lease_lost_is_retryable(e, true))?
                .succeeded()
            {
                return Err(place_lost());
            }
            (hold, granted)
        } else {
            let lease = inner.grant(secs).await?;
            pending.track(lease.0);
            if !inner
                .raw_txn(confirm(lease.0))
                .await
                .map_err(|e| lease_lost_is_retryable(e, true))?
                .succeeded()
            {
                return Err(place_lost());
            }
            pending.revoke(queue_lease.0);
            lease
        };
        pending.keep(lease.0);
        Ok(Some(EtcdLease::new(
            inner.clone(),
            req,
            key,
            my_rev,
            lease,
            start,
        )))
    }

    /// Waits until the key created at `my_rev` has its turn by the rules of `shape`
    /// (`queue_rules`), watching only the key that must go where there is one (no herd), and
    /// keeping our queue lease alive meanwhile.
    async fn wait_turn(
        &self,
        shape: QueueKind,
        prefix: &[u8],
        my_rev: i64,
        queue_lease: i64,
        queue_secs: i64,
        wait: Wait,
    ) -> Result<Turn> {
        let inner = &self.inner;
        let deadline = wait.deadline();
        let every = Duration::from_secs(u64::try_from(queue_secs).unwrap_or(1)) / 4;
        let mut keep_alive = tokio::time::interval_at(Instant::now() + every, every);
        keep_alive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failures = 0u32;
        loop {
            let step = async {
                let (wanted, _) = inner.wanted(shape, prefix, my_rev).await?;
                let (watched, whole_base) = match &wanted {
                    Wanted::Nothing => return Ok(None),
                    Wanted::Key(key) => (key.clone(), false),
                    Wanted::AnyDeletion => (prefix.to_vec(), true),
                };
                // A watch from the current revision, not from the one we read at: etcd serves
                // a watch that starts in the past from its unsynced group, caught up only every
                // 100 ms, so a hand-off could wait that long. A deletion between the read and
                // the watch is caught by reading again once the watch is live.
                let watched = &watched;
                let mut stream = inner
                    .resend(|mut c| async move {
                        let mut options =
                            WatchOptions::new().with_filters([WatchFilterType::NoPut]);
                        if whole_base {
                            options = options.with_prefix();
                        }
                        c.watch(watched.as_slice(), Some(options)).await
                    })
                    .await
                    .map_err(map)?;
                match stream.message().await.map_err(map)? {
                    Some(reply) if reply.created() && !reply.canceled() => {}
                    // Not created: look at the queue again.
                    _ => return Ok(Some(None)),
                }
                let (now_wanted, _) = inner.wanted(shape, prefix, my_rev).await?;
                if now_wanted == Wanted::Nothing {
                    return Ok(None);
                }
                Ok(Some((now_wanted == wanted).then_some(stream)))
            };
            let found: Result<Option<Option<etcd_client::WatchStream>>> = tokio::select! {
                found = step => found,
                () = until(deadline) => return Ok(Turn::TimedOut),
            };
            let mut stream = match found {
                Ok(None) => return Ok(Turn::First),
                // What we wait for changed while the watch was being set up: start over.
                Ok(Some(None)) => continue,
                Ok(Some(Some(stream))) => stream,
                Err(error) if error.is_retryable() => {
                    failures = failures.saturating_add(1);
                    tracing::debug!(%error, failures, "etcd wait step failed; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(pause_after(failures)) => continue,
                        () = until(deadline) => return Ok(Turn::TimedOut),
                    }
                }
                Err(error) => return Err(error),
            };
            failures = 0;
            loop {
                tokio::select! {
                    message = stream.message() => match message {
                        Ok(Some(reply)) if reply.canceled() => break,
                        Ok(Some(reply)) => {
                            if reply.events().iter().any(|e| e.event_type() == EventType::Delete) {
                                break;
                            }
                        }
                        // The stream ended or broke: look at the queue again.
                        Ok(None) | Err(_) => break,
                    },
                    _ = keep_alive.tick() => match inner.keep_alive(queue_lease).await {
                        Ok(()) => {}
                        Err(error) if lease_gone(&error) => return Err(place_lost()),
                        // Unreachable for now: the lease has seconds left; try at the next tick.
                        Err(error) => tracing::debug!(%error, "keep-alive of a waiter failed"),
                    },
                    () = until(deadline) => return Ok(Turn::TimedOut),
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
