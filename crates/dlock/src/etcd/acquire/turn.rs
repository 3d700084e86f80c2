//! Waiting for the turn: watching what our key waits for, and confirming the turn in one
//! transaction.

use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, EventType, PutOptions, Txn, TxnOp, TxnOpResponse, WatchFilterType,
    WatchOptions,
};
use tokio::time::Instant;

use super::super::EtcdBackend;
use super::super::encode_value;
use super::super::error::{lease_gone, map};
use super::super::queue_rules::Wanted;
use super::{Granted, Place, lease_lost_is_retryable, place_lost, retry_backoff};
use crate::backend::{AcquireRequest, Wait};
use crate::error::Result;

/// How the confirmation of a turn ended.
pub(super) enum Confirmed {
    /// Our key is on the hold's lease: the lock is ours.
    Ours,
    /// Our key is still queued, but a key ahead of it is left: wait again.
    NotFirst,
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
pub(super) enum Turn {
    /// No key ahead is left, as read; or, where the first in line wins, the key we watched
    /// was deleted (the confirmation checks that no other is left ahead).
    First,
    /// The wait ran out.
    TimedOut,
}

impl EtcdBackend {
    /// Our turn (or, for the kinds where the first in line wins, the deletion of the key we
    /// watched, checked here). Confirms in one transaction that our key still exists with its
    /// create revision (and, where the first in line wins, that no key is left ahead of it)
    /// while putting it on the hold's lease `lease.0`, so that a lock is never granted on a
    /// lease that expired during the wait (etcd issue 11456); `keep_alive_first` says that
    /// the lease needs a keep-alive first (it was granted before the wait), which runs in
    /// parallel and starts its TTL afresh.
    pub(super) async fn confirm(
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
    pub(super) async fn wait_turn(
        &self,
        place: &Place,
        queue_lease: Granted,
        wait: Wait,
    ) -> Result<Turn> {
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
