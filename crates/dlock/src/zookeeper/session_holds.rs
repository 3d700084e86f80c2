//! The watchdog holds that ride a ZooKeeper session: the session's heartbeat is their one
//! renewal, so a hold keeps no timer and no task of its own. The session keeps, per hold, its
//! node's path and loss signal; one task per session watches every hold's own node (an
//! `exists` watch, set once a hold has lasted [`OWN_NODE_WATCH_DELAY`]), so a break (the node
//! deleted by `force_release` or `dlock break`) is told to exactly that holder. When the
//! session ends, every hold on it is told, each with the session's reason.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use zookeeper_client::{Client, EventType, WatchedEvent};

use crate::backend::LossSignal;
use crate::lease::keeper::LostReason;

use super::RETRY_MAX;

/// How long a session hold lasts before its own node is watched: a quick acquire + release
/// then costs the server two requests, not three. A break before then is seen when the
/// watch is set (the node is already gone).
pub(super) const OWN_NODE_WATCH_DELAY: Duration = Duration::from_millis(50);

/// How many nodes of a given-up session are deleted at once.
const DELETES_AT_ONCE: usize = 64;

/// A hold on the session: its node and its loss signal.
struct Rider {
    path: Arc<str>,
    signal: LossSignal,
}

/// What says the session is alive: when the last request the server answered was sent, and
/// the shortest watchdog lease riding it (`Duration::MAX` before any), which the session's
/// safe window must not exceed (see `answer_budget`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Liveness {
    pub(super) answered: Instant,
    pub(super) lease: Duration,
}

/// The watchdog holds of one session.
pub(super) struct SessionHolds {
    riders: Mutex<HashMap<u64, Rider>>,
    next_id: AtomicU64,
    /// Why the session ended, once it has: the reason every hold on it is told.
    ended: OnceLock<LostReason>,
    /// Holds whose node the watch task is to watch, and from when.
    to_watch: mpsc::UnboundedSender<(Instant, u64)>,
    liveness: watch::Sender<Liveness>,
}

/// What [`watch_holds`] reads: the holds to watch.
pub(super) type WatchAsks = mpsc::UnboundedReceiver<(Instant, u64)>;

impl SessionHolds {
    pub(super) fn new() -> (Arc<SessionHolds>, WatchAsks) {
        let (to_watch, asks) = mpsc::unbounded_channel();
        let holds = SessionHolds {
            riders: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            ended: OnceLock::new(),
            to_watch,
            liveness: watch::Sender::new(Liveness {
                answered: Instant::now(),
                lease: Duration::MAX,
            }),
        };
        (Arc::new(holds), asks)
    }

    fn riders(&self) -> MutexGuard<'_, HashMap<u64, Rider>> {
        self.riders.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Follows the session's [`Liveness`].
    pub(super) fn liveness(&self) -> watch::Receiver<Liveness> {
        self.liveness.subscribe()
    }

    /// A request sent at `sent` was answered: the session was alive then.
    pub(super) fn answered(&self, sent: Instant) {
        self.liveness.send_if_modified(|live| {
            let later = sent > live.answered;
            live.answered = live.answered.max(sent);
            later
        });
    }

    /// Why the session ended, if it has.
    pub(super) fn ended(&self) -> Option<LostReason> {
        self.ended.get().copied()
    }

    /// Adds a hold on `path` with watchdog lease `lease`, granted by a request sent at
    /// `start` and answered; its node is watched from [`OWN_NODE_WATCH_DELAY`] after that. A
    /// session that has ended tells it at once.
    pub(super) fn join(
        &self,
        path: Arc<str>,
        signal: LossSignal,
        start: Instant,
        lease: Duration,
    ) -> u64 {
        // The grant's request was answered; a shorter lease narrows the session's window
        // from now on, counted from that answer.
        self.liveness.send_modify(|live| {
            live.answered = live.answered.max(start);
            live.lease = live.lease.min(lease);
        });
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.riders().insert(
            id,
            Rider {
                path,
                signal: signal.clone(),
            },
        );
        // Checked after the insert: an `end` racing this join either takes the rider or has
        // set its reason before this reads it.
        if let Some(reason) = self.ended() {
            self.leave(id);
            signal.fire(reason);
            return id;
        }
        let _ = self.to_watch.send((start + OWN_NODE_WATCH_DELAY, id));
        id
    }

    /// Removes a hold (released, or lost): its node's deletion is no longer a break.
    pub(super) fn leave(&self, id: u64) {
        self.riders().remove(&id);
    }

    /// The node of hold `id` is gone while held: that hold, and only it, is broken.
    fn broken(&self, id: u64) {
        let rider = self.riders().remove(&id);
        if let Some(rider) = rider {
            rider.signal.fire(LostReason::Broken);
        }
    }

    fn path(&self, id: u64) -> Option<Arc<str>> {
        self.riders().get(&id).map(|rider| rider.path.clone())
    }

    /// Ends the session for `reason` (the first reason stays): every hold on it is told, and
    /// the paths of their nodes are returned.
    pub(super) fn end(&self, reason: LostReason) -> Vec<Arc<str>> {
        let _ = self.ended.set(reason);
        let reason = self.ended().unwrap_or(reason);
        let riders = std::mem::take(&mut *self.riders());
        if !riders.is_empty() {
            tracing::warn!(holds = riders.len(), %reason, "ZooKeeper session ended: its locks are lost");
        }
        riders
            .into_values()
            .map(|rider| {
                rider.signal.fire(reason);
                rider.path
            })
            .collect()
    }
}

/// Deletes the nodes of a session this client gave up on while the server may still keep it
/// (see `delete_until_done`), a few at a time.
pub(super) async fn delete_all(client: Client, paths: Vec<Arc<str>>) {
    futures::stream::iter(paths)
        .for_each_concurrent(DELETES_AT_ONCE, |path| {
            let client = client.clone();
            async move { super::acquire::delete_until_done(&client, &path).await }
        })
        .await;
}

type Watching = BoxFuture<'static, (u64, Option<WatchedEvent>)>;
type Setting = BoxFuture<'static, (u64, Option<Option<Watching>>)>;

/// Sets the watch on hold `id`'s node: `Some(Some(watch))` if the node is there, `Some(None)`
/// if it is gone, `None` if the request failed.
fn set_watch(client: Client, id: u64, path: Arc<str>) -> Setting {
    Box::pin(async move {
        let set = match client.check_and_watch_stat(&path).await {
            Ok((Some(_), watcher)) => {
                // zookeeper-client panics in `changed()` if its session task ends before the
                // watch fires; this task keeps a handle to the client, so that should not
                // happen, and a panic would only end this one watch.
                let fired = async move {
                    let event = AssertUnwindSafe(watcher.changed()).catch_unwind().await;
                    (id, event.ok())
                };
                Some(Some(Box::pin(fired) as Watching))
            }
            Ok((None, _)) => Some(None),
            Err(_) => None,
        };
        (id, set)
    })
}

/// The session's one task for its holds' own nodes: sets each hold's watch when it is due,
/// tells a hold whose node is deleted, and ends every hold when the session ends.
pub(super) async fn watch_holds(
    client: Client,
    holds: Arc<SessionHolds>,
    mut asks: WatchAsks,
    gone: CancellationToken,
) {
    let mut due: BinaryHeap<Reverse<(Instant, u64)>> = BinaryHeap::new();
    let mut setting: FuturesUnordered<Setting> = FuturesUnordered::new();
    let mut watching: FuturesUnordered<Watching> = FuturesUnordered::new();
    loop {
        let next = due.peek().map(|Reverse((at, _))| *at);
        tokio::select! {
            () = gone.cancelled() => break,
            Some(ask) = asks.recv() => due.push(Reverse(ask)),
            () = sleep_until(next) => {
                let now = Instant::now();
                while let Some(&Reverse((at, id))) = due.peek() {
                    if at > now {
                        break;
                    }
                    due.pop();
                    if let Some(path) = holds.path(id) {
                        setting.push(set_watch(client.clone(), id, path));
                    }
                }
            }
            Some((id, set)) = setting.next() => match set {
                Some(Some(watch)) => watching.push(watch),
                Some(None) => holds.broken(id),
                // Connection trouble: try again later; the session's state decides meanwhile.
                None => due.push(Reverse((Instant::now() + RETRY_MAX, id))),
            },
            Some((id, event)) = watching.next() => match event.map(|e| e.event_type) {
                Some(EventType::NodeDeleted) => holds.broken(id),
                // A session event: its end shows on `gone`. A data change (not ours: session
                // holds write no data) or a watch that can no longer fire: watch again.
                Some(EventType::Session) => {}
                _ => due.push(Reverse((Instant::now(), id))),
            },
        }
    }
    // However the session ended, every hold still on it is told.
    holds.end(LostReason::SessionEnded);
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
