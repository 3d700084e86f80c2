//! Hand-off by notification: one pub/sub connection per client carries the subscriptions of
//! every lock its tasks wait for, and wakes exactly the waiters a release names.
//!
//! A waiter registers (a map insert) before its first attempt, or, for a mutex, only once an
//! attempt finds the lock busy ([`Wakeups::waiter_after`]: a waiter registered late tries once
//! more if anything was heard on its channel since that attempt was sent). The channel is
//! subscribed only when an attempt finds the lock busy. Until the server confirms that
//! subscription the waiter is not trusted to hear a release, so it tries once more right after
//! the confirmation: a release between a failed attempt and the subscription is never missed. The connection is
//! opened on the first wait and re-established when it drops; every waiter is then woken,
//! since messages may have been lost in between. Channels stay subscribed for a while after
//! their last waiter leaves, so a lock that is contended again costs no new round trip.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ::redis::RedisResult;
use futures::StreamExt;
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;

use super::config::RedisConfig;
use super::node::Primary;
use crate::backend::wait::Backoff;

mod sharded;

/// How long a channel stays subscribed with no waiter.
const LINGER: Duration = Duration::from_secs(10);
/// How long a SUBSCRIBE may take before the connection is considered broken.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause between reconnection attempts (doubled up to the max).
const RECONNECT_MIN: Duration = Duration::from_millis(20);
const RECONNECT_MAX: Duration = Duration::from_secs(1);

/// The pub/sub side of one client.
#[derive(Debug)]
pub(crate) struct Wakeups {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Counts what woke waiters (a message, a reconnection), for [`Wakeups::waiter_after`];
    /// read without the lock, raised under it.
    events: AtomicU64,
    /// Channels to subscribe; the task starts on the first one.
    requests: mpsc::UnboundedSender<String>,
    task: Mutex<Option<Task>>,
}

#[derive(Debug)]
struct Task {
    /// The server to subscribe on: the current primary (it moves after a Sentinel failover).
    primary: watch::Receiver<Arc<Primary>>,
    requests: mpsc::UnboundedReceiver<String>,
    /// A cluster with sharded pub/sub: subscribe with `SSUBSCRIBE` through a cluster
    /// connection made from this configuration ([`sharded`]).
    sharded: Option<RedisConfig>,
}

#[derive(Debug, Default)]
struct State {
    channels: HashMap<String, Channel>,
    next_id: u64,
}

#[derive(Debug)]
struct Channel {
    waiters: Vec<Waiting>,
    /// True while the server has confirmed the subscription on the live connection.
    active: watch::Sender<bool>,
    /// A SUBSCRIBE was asked for on the current connection.
    requested: bool,
    /// When the last waiter left.
    idle_since: Option<Instant>,
    /// The last of [`Shared::events`] that woke this channel's waiters (0: none).
    last_event: u64,
}

impl Channel {
    /// Wakes every waiter of the channel, as `event`.
    fn wake_all(&mut self, event: u64) {
        self.last_event = event;
        for waiting in &self.waiters {
            waiting.notify.notify_one();
        }
    }
}

/// Where a client's wake-ups stood when an attempt was sent ([`Wakeups::heard`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Heard(u64);

#[derive(Debug)]
struct Waiting {
    id: u64,
    token: String,
    notify: Arc<Notify>,
}

impl Wakeups {
    /// The pub/sub side of a client of `primary`'s server; connects on the first wait, and
    /// again whenever the primary moves.
    pub(crate) fn new(primary: watch::Receiver<Arc<Primary>>) -> Wakeups {
        Wakeups::with(primary, None)
    }

    /// The pub/sub side of a client of a cluster whose servers have sharded pub/sub: each
    /// lock's channel is a shard channel, subscribed on the node that owns its slot.
    pub(crate) fn sharded(primary: watch::Receiver<Arc<Primary>>, config: RedisConfig) -> Wakeups {
        Wakeups::with(primary, Some(config))
    }

    fn with(primary: watch::Receiver<Arc<Primary>>, sharded: Option<RedisConfig>) -> Wakeups {
        let (requests, receiver) = mpsc::unbounded_channel();
        Wakeups {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                events: AtomicU64::new(0),
                requests,
                task: Mutex::new(Some(Task {
                    primary,
                    requests: receiver,
                    sharded,
                })),
            }),
        }
    }

    /// Registers a waiter for the lock whose channel is `channel`; it is woken by releases
    /// that name `token` or nobody in particular. Dropping the returned value unregisters.
    pub(crate) fn waiter(&self, channel: &str, token: &str) -> Waiter {
        self.register(channel, token, None)
    }

    /// Where the wake-ups stand, read before an attempt is sent: a waiter registered after
    /// its busy reply ([`waiter_after`](Wakeups::waiter_after)) then knows whether it may have
    /// missed a release.
    pub(crate) fn heard(&self) -> Heard {
        Heard(self.shared.events.load(Ordering::SeqCst))
    }

    /// A waiter registered after an attempt found the lock busy, `heard` read before that
    /// attempt was sent. A release published after the attempt reached the server cannot have
    /// been dispatched before `heard` was read; if anything woke the channel's waiters since,
    /// this waiter is woken at once and tries again, so no release is missed. Saves the
    /// registration on every call that never waits.
    pub(crate) fn waiter_after(&self, channel: &str, token: &str, heard: Heard) -> Waiter {
        self.register(channel, token, Some(heard))
    }

    fn register(&self, channel: &str, token: &str, heard: Option<Heard>) -> Waiter {
        let notify = Arc::new(Notify::new());
        let mut state = self.shared.lock();
        state.next_id += 1;
        let id = state.next_id;
        let entry = state
            .channels
            .entry(channel.to_owned())
            .or_insert_with(|| Channel {
                waiters: Vec::new(),
                active: watch::channel(false).0,
                requested: false,
                idle_since: None,
                last_event: 0,
            });
        entry.idle_since = None;
        // An inactive channel needs no wake-up: its first wait ends with the subscription
        // confirmed, and the caller tries again then anyway.
        if heard.is_some_and(|Heard(seen)| entry.last_event > seen) && *entry.active.borrow() {
            notify.notify_one();
        }
        entry.waiters.push(Waiting {
            id,
            token: token.to_owned(),
            notify: notify.clone(),
        });
        let active = entry.active.subscribe();
        Waiter {
            shared: self.shared.clone(),
            channel: channel.to_owned(),
            id,
            notify,
            active,
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new event ([`Shared::events`]); called with the state locked.
    fn next_event(&self) -> u64 {
        self.events.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Asks the task to subscribe `channel` if nobody has yet on this connection.
    fn request(self: &Arc<Self>, channel: &str) {
        {
            let mut state = self.lock();
            let Some(entry) = state.channels.get_mut(channel) else {
                return;
            };
            if entry.requested {
                return;
            }
            entry.requested = true;
        }
        let _ = self.requests.send(channel.to_owned());
        let task = self
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(task) = task {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    let sharded = task.sharded.is_some();
                    let slot = TaskSlot {
                        shared: Arc::downgrade(self),
                        task: Some(task),
                    };
                    if sharded {
                        runtime.spawn(sharded::run(slot));
                    } else {
                        runtime.spawn(run(slot));
                    }
                }
                Err(_) => self.put_back(task),
            }
        }
    }

    /// Wakes the waiters a message names: the one whose token it carries, or all of them.
    fn dispatch(&self, channel: &str, payload: &[u8]) {
        let mut state = self.lock();
        let Some(entry) = state.channels.get_mut(channel) else {
            return;
        };
        entry.last_event = self.next_event();
        for waiting in &entry.waiters {
            if payload.is_empty() || waiting.token.as_bytes() == payload {
                waiting.notify.notify_one();
            }
        }
    }

    /// After a reconnection: every waiter tries again, as releases may have been missed.
    fn wake_all(&self) {
        let mut state = self.lock();
        let event = self.next_event();
        for entry in state.channels.values_mut() {
            entry.wake_all(event);
        }
    }
}

/// The running task's state. If the task is dropped while the client lives (its runtime shut
/// down), the state goes back to the client, so the next waiter starts a new task.
struct TaskSlot {
    shared: std::sync::Weak<Shared>,
    task: Option<Task>,
}

impl Drop for TaskSlot {
    fn drop(&mut self) {
        if let (Some(shared), Some(task)) = (self.shared.upgrade(), self.task.take()) {
            shared.put_back(task);
        }
    }
}

impl Shared {
    /// The connection dropped: nothing is subscribed any more. Every waiter tries once (a
    /// release may have been missed), then polls until the subscriptions are back.
    fn connection_lost(&self) {
        tracing::debug!("redis pub/sub connection lost; reconnecting");
        self.forget_subscriptions();
        self.wake_all();
    }

    /// Marks every channel unsubscribed.
    fn forget_subscriptions(&self) {
        let mut state = self.lock();
        for entry in state.channels.values_mut() {
            entry.requested = false;
            entry.active.send_replace(false);
        }
    }

    /// On a new connection: every channel with waiters (or still lingering), marked as asked
    /// for, to subscribe again.
    fn request_all(&self) -> Vec<String> {
        let mut state = self.lock();
        state
            .channels
            .iter_mut()
            .map(|(name, entry)| {
                entry.requested = true;
                name.clone()
            })
            .collect()
    }

    /// Makes the pub/sub task startable again, with nothing subscribed.
    fn put_back(&self, task: Task) {
        self.forget_subscriptions();
        *self.task.lock().unwrap_or_else(PoisonError::into_inner) = Some(task);
        self.wake_all();
    }
}

/// The pub/sub task: connects, subscribes what is asked, dispatches messages, reconnects.
/// It ends when the client is dropped.
async fn run(mut slot: TaskSlot) {
    let shared = slot.shared.clone();
    let Some(task) = slot.task.as_mut() else {
        return;
    };
    let mut backoff = Backoff::steady(RECONNECT_MIN, RECONNECT_MAX);
    // False once the primary can no longer move (its sender is gone with the client).
    let mut may_move = true;
    // Which of the primary's servers to subscribe on (only a cluster has more than one).
    let mut pick = 0usize;
    loop {
        // A cluster passes every message to all its nodes: when one does not answer, the
        // next seed node will do.
        let client = {
            let primary = task.primary.borrow_and_update();
            let choices = 1 + primary.others.len();
            match pick % choices {
                0 => primary.client.clone(),
                other => primary.others[other - 1].clone(),
            }
        };
        let pubsub = match tokio::time::timeout(SUBSCRIBE_TIMEOUT, client.get_async_pubsub()).await
        {
            Ok(Ok(pubsub)) => pubsub,
            failed => {
                let error = failed.map(|r| r.err());
                tracing::debug!(
                    ?error,
                    "redis pub/sub connect failed; waiters poll meanwhile"
                );
                if shared.strong_count() == 0 {
                    return;
                }
                pick = pick.wrapping_add(1);
                tokio::time::sleep(backoff.next()).await;
                continue;
            }
        };
        backoff.reset();
        let (sink, mut stream) = pubsub.split();
        // Everything with waiters (or still lingering) is subscribed again on this connection.
        let Some(mut sweep) = connected(&shared, |channel| subscribe(&shared, &sink, channel))
        else {
            return;
        };
        loop {
            tokio::select! {
                message = stream.next() => {
                    let Some(message) = message else { break };
                    let Some(shared) = shared.upgrade() else { return };
                    shared.dispatch(message.get_channel_name(), message.get_payload_bytes());
                }
                request = task.requests.recv() => {
                    let Some(channel) = request else { return };
                    subscribe(&shared, &sink, channel);
                }
                moved = task.primary.changed(), if may_move => {
                    if moved.is_ok() {
                        // Releases are published on the new primary: subscribe there.
                        break;
                    }
                    may_move = false;
                }
                _ = sweep.tick() => {
                    if !sweep_idle(&shared, &sink).await {
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

/// After the connection dropped (see [`Shared::connection_lost`]). False once the client is
/// gone.
fn lost(shared: &std::sync::Weak<Shared>) -> bool {
    shared
        .upgrade()
        .map(|shared| shared.connection_lost())
        .is_some()
}

/// On a new connection: subscribes again every channel with waiters (or still lingering), and
/// wakes every waiter (a release may have come while nothing listened). Returns the timer of
/// the sweeps of idle channels ([`sweep_idle`]), or `None` once the client is gone.
fn connected(
    shared: &std::sync::Weak<Shared>,
    mut subscribe: impl FnMut(String),
) -> Option<tokio::time::Interval> {
    let again = shared.upgrade()?.request_all();
    again.into_iter().for_each(&mut subscribe);
    shared.upgrade()?.wake_all();
    Some(tokio::time::interval_at(Instant::now() + LINGER, LINGER))
}

/// A pub/sub connection that can drop subscriptions: classic (`UNSUBSCRIBE`) or sharded
/// (`SUNSUBSCRIBE`, [`sharded`]).
trait Unsubscribe: Clone {
    fn unsubscribe_all(self, channels: Vec<String>) -> impl Future<Output = RedisResult<()>>;
}

impl Unsubscribe for ::redis::aio::PubSubSink {
    async fn unsubscribe_all(mut self, channels: Vec<String>) -> RedisResult<()> {
        self.unsubscribe(channels).await
    }
}

/// Unsubscribes the channels idle for [`LINGER`] on `connection`, awaited, so a later
/// subscription of the same channel goes after it. False once the client is gone.
async fn sweep_idle(shared: &std::sync::Weak<Shared>, connection: &impl Unsubscribe) -> bool {
    let Some(idle) = shared.upgrade().map(|shared| shared.take_idle()) else {
        return false;
    };
    if !idle.is_empty() {
        let unsubscribed = connection.clone().unsubscribe_all(idle);
        let _ = tokio::time::timeout(SUBSCRIBE_TIMEOUT, unsubscribed).await;
    }
    true
}

/// Subscribes in the background (the sink pipelines requests), then marks the channel live.
fn subscribe(shared: &std::sync::Weak<Shared>, sink: &::redis::aio::PubSubSink, channel: String) {
    let mut sink = sink.clone();
    let shared = shared.clone();
    tokio::spawn(async move {
        let done = tokio::time::timeout(SUBSCRIBE_TIMEOUT, sink.subscribe(&channel)).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let mut state = shared.lock();
        if let Some(entry) = state.channels.get_mut(&channel) {
            match done {
                Ok(Ok(())) => {
                    entry.active.send_replace(true);
                }
                failed => {
                    tracing::debug!(?failed, channel, "redis SUBSCRIBE failed");
                    // Asked again by the next waiter that finds the channel inactive.
                    entry.requested = false;
                }
            }
        }
    });
}

impl Shared {
    /// Forgets channels whose last waiter left more than [`LINGER`] ago.
    fn take_idle(&self) -> Vec<String> {
        let mut state = self.lock();
        let now = Instant::now();
        let idle: Vec<String> = state
            .channels
            .iter()
            .filter(|(_, entry)| {
                entry
                    .idle_since
                    .is_some_and(|since| now.duration_since(since) >= LINGER)
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in &idle {
            state.channels.remove(name);
        }
        idle
    }
}

/// One waiting acquire call's registration.
#[derive(Debug)]
pub(crate) struct Waiter {
    shared: Arc<Shared>,
    channel: String,
    id: u64,
    notify: Arc<Notify>,
    active: watch::Receiver<bool>,
}

impl Waiter {
    /// Completes when the lock may have become free. The first call on a channel that is not
    /// yet subscribed completes once the subscription is confirmed, so the caller tries again
    /// and cannot miss a release that came before it.
    pub(crate) async fn woken(&self) {
        let mut active = self.active.clone();
        if !*active.borrow_and_update() {
            self.shared.request(&self.channel);
            // The caller's own sleep bounds this wait if the server never confirms.
            let _ = active.wait_for(|live| *live).await;
            return;
        }
        self.notify.notified().await;
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        if let Some(entry) = state.channels.get_mut(&self.channel) {
            entry.waiters.retain(|w| w.id != self.id);
            if entry.waiters.is_empty() {
                if entry.requested {
                    entry.idle_since = Some(Instant::now());
                } else {
                    state.channels.remove(&self.channel);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    /// The client side alone: no connection, no task (nothing is subscribed for real).
    fn wakeups() -> Wakeups {
        let (requests, _) = mpsc::unbounded_channel();
        Wakeups {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                events: AtomicU64::new(0),
                requests,
                task: Mutex::new(None),
            }),
        }
    }

    /// A release that reached this client after the busy attempt was sent and before its
    /// waiter registered: the waiter must try again at once rather than sleep until a poll.
    #[tokio::test]
    async fn a_waiter_registered_after_its_release_arrived_tries_again_at_once() {
        let wakeups = wakeups();
        // Another waiter keeps the channel subscribed (and live) meanwhile.
        let _other = wakeups.waiter("wake:x", "other");
        if let Some(channel) = wakeups.shared.lock().channels.get_mut("wake:x") {
            channel.active.send_replace(true);
        }
        let heard = wakeups.heard();
        wakeups.shared.dispatch("wake:x", b"late");
        let late = wakeups.waiter_after("wake:x", "late", heard);
        assert!(
            late.woken().now_or_never().is_some(),
            "a waiter registered after its release was heard slept instead of trying again"
        );
        // Nothing heard since the attempt: the waiter waits for the next release.
        let quiet = wakeups.waiter_after("wake:x", "quiet", wakeups.heard());
        assert!(quiet.woken().now_or_never().is_none());
    }
}
