//! Hand-off on a Redis Cluster with sharded pub/sub (Redis 7): a release is published with
//! `SPUBLISH` on the lock's shard channel, which lives in the lock's slot, so only the node
//! that owns the slot (and its replicas) carries it, where a classic `PUBLISH` goes to every
//! node of the cluster. Waiters subscribe with `SSUBSCRIBE` through a RESP3 cluster connection
//! of their own: redis-rs sends each subscription to the node that owns the channel's slot,
//! reconnects a node that drops and subscribes again where a slot goes.
//!
//! What the server and redis-rs push decides what waiters do (the registry of waiters is the
//! one of [`super`]):
//! - `smessage`: a release; wakes the waiters it names.
//! - `ssubscribe` of a channel dlock did not ask for on this connection (redis-rs subscribing
//!   again after a reconnection or a slot move): the channel is live again, and its waiters
//!   try once, as a release may have come while it was not.
//! - `sunsubscribe` of a channel that still has waiters (the server drops the subscriptions of
//!   a slot that moved away): the channel is not live; its waiters try once and subscribe
//!   again, which reaches the slot's new owner.
//! - a disconnection: nothing is trusted to be live; every waiter tries once.

use std::sync::Weak;

use ::redis::cluster_async::ClusterConnection;
use ::redis::{PushInfo, PushKind, RedisResult, Value};
use tokio::sync::mpsc;

use super::{
    RECONNECT_MAX, RECONNECT_MIN, SUBSCRIBE_TIMEOUT, Shared, TaskSlot, Unsubscribe, connected,
    lost, sweep_idle,
};
use crate::backend::wait::Backoff;
use crate::redis::cluster;

/// The sharded pub/sub task: connects, subscribes what is asked, follows what is pushed. It
/// ends when the client is dropped.
pub(super) async fn run(mut slot: TaskSlot) {
    let shared = slot.shared.clone();
    let Some(task) = slot.task.as_mut() else {
        return;
    };
    let Some(config) = task.sharded.clone() else {
        return;
    };
    let mut backoff = Backoff::steady(RECONNECT_MIN, RECONNECT_MAX);
    loop {
        let (pushes_to, mut pushes) = mpsc::unbounded_channel();
        let connection = match cluster::pubsub_client(&config, pushes_to) {
            Ok(client) => tokio::time::timeout(SUBSCRIBE_TIMEOUT, client.get_async_connection())
                .await
                .map_err(|_| "timed out".to_owned())
                .and_then(|r| r.map_err(|e| e.to_string())),
            Err(error) => Err(error.to_string()),
        };
        let conn = match connection {
            Ok(conn) => conn,
            Err(error) => {
                tracing::debug!(
                    error,
                    "redis sharded pub/sub connect failed; waiters poll meanwhile"
                );
                if shared.strong_count() == 0 {
                    return;
                }
                tokio::time::sleep(backoff.next()).await;
                continue;
            }
        };
        backoff.reset();
        let Some(mut sweep) = connected(&shared, |channel| subscribe(&shared, &conn, channel))
        else {
            return;
        };
        loop {
            tokio::select! {
                push = pushes.recv() => {
                    // The connection's task ended: connect anew.
                    let Some(push) = push else { break };
                    let Some(shared) = shared.upgrade() else { return };
                    shared.follow(push);
                }
                request = task.requests.recv() => {
                    let Some(channel) = request else { return };
                    subscribe(&shared, &conn, channel);
                }
                _ = sweep.tick() => {
                    if !sweep_idle(&shared, &conn).await {
                        return;
                    }
                }
            }
        }
        if !lost(&shared) {
            return;
        }
    }
}

impl Unsubscribe for ClusterConnection {
    async fn unsubscribe_all(mut self, channels: Vec<String>) -> RedisResult<()> {
        self.sunsubscribe(channels).await
    }
}

/// Subscribes in the background, then marks the channel live. A subscription that fails (the
/// slot's node is down until its replica takes over) is tried again while the channel has
/// waiters: nothing else would ask again for a waiter that is waiting for it.
fn subscribe(shared: &Weak<Shared>, conn: &ClusterConnection, channel: String) {
    let mut conn = conn.clone();
    let shared = shared.clone();
    tokio::spawn(async move {
        let mut backoff = Backoff::steady(RECONNECT_MIN, RECONNECT_MAX);
        loop {
            let done = tokio::time::timeout(SUBSCRIBE_TIMEOUT, conn.ssubscribe(&channel)).await;
            let Some(shared) = shared.upgrade() else {
                return;
            };
            {
                let mut state = shared.lock();
                let Some(entry) = state.channels.get_mut(&channel) else {
                    return;
                };
                match done {
                    Ok(Ok(())) => {
                        entry.active.send_replace(true);
                        return;
                    }
                    failed if !entry.waiters.is_empty() => {
                        tracing::debug!(?failed, channel, "redis SSUBSCRIBE failed; trying again");
                    }
                    failed => {
                        tracing::debug!(?failed, channel, "redis SSUBSCRIBE failed");
                        // Asked again by the next waiter that finds the channel inactive.
                        entry.requested = false;
                        return;
                    }
                }
            }
            drop(shared);
            tokio::time::sleep(backoff.next()).await;
        }
    });
}

impl Shared {
    /// Acts on one push of the sharded connection (see the module's documentation).
    fn follow(&self, push: PushInfo) {
        match push.kind {
            PushKind::SMessage => {
                if let (Some(name), Some(Value::BulkString(payload))) =
                    (channel_of(&push.data), push.data.get(1))
                {
                    self.dispatch(name, payload);
                }
            }
            PushKind::SSubscribe => {
                let Some(name) = channel_of(&push.data) else {
                    return;
                };
                let mut state = self.lock();
                if let Some(entry) = state.channels.get_mut(name) {
                    let unasked = !entry.requested;
                    entry.requested = true;
                    entry.active.send_replace(true);
                    if unasked {
                        entry.wake_all(self.next_event());
                    }
                }
            }
            PushKind::SUnsubscribe => {
                let Some(name) = channel_of(&push.data) else {
                    return;
                };
                let mut state = self.lock();
                if let Some(entry) = state.channels.get_mut(name) {
                    entry.requested = false;
                    entry.active.send_replace(false);
                    entry.wake_all(self.next_event());
                }
            }
            PushKind::Disconnection => self.connection_lost(),
            _ => {}
        }
    }
}

/// The channel a push names (its first element), borrowed: no copy per message.
fn channel_of(data: &[Value]) -> Option<&str> {
    match data.first() {
        Some(Value::BulkString(name)) => std::str::from_utf8(name).ok(),
        _ => None,
    }
}
