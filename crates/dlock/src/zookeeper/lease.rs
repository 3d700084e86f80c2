//! One fixed-TTL hold of a ZooKeeper lock (a `ttl` or a maximum hold): its ephemeral node, the
//! task that keeps its client-kept deadline and watches the session and the node, extend and
//! release. Watchdog holds ride the session instead (`session_lease.rs`).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;
use zookeeper_client::{EventType, WatchedEvent};

use crate::backend::{AcquireRequest, Lease, LeaseCore};
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::lease::keeper::LostReason;
use crate::name::LockName;
use crate::name::Owner;

use super::acquire::Node;
use super::acquire::delete_until_done;
use super::acquire::watch_fired;
use super::error::map;
use super::queue_rules::node_data;
use super::queue_rules::{Until, unix_ms};
use super::session::{Session, connect_client};
use super::session_holds::OWN_NODE_WATCH_DELAY;
use super::session_lease::SessionLease;

/// Deadline and release state of one hold, shared with its keeper task.
struct HoldState {
    /// When this client deletes the node if it is not extended (the TTL, kept by the client:
    /// ZooKeeper has no expiring ephemeral nodes).
    deadline: Instant,
    /// Released, expired or lost: no further extend or release.
    over: bool,
}

struct LeaseShared {
    core: LeaseCore,
    name: String,
    session: Arc<Session>,
    path: String,
    owner: Owner,
    acquired_ms: u64,
    state: StdMutex<HoldState>,
    changed: Notify,
}

/// One fixed-TTL hold of a ZooKeeper lock.
pub(super) struct ZkLease {
    shared: Arc<LeaseShared>,
}

impl std::fmt::Debug for ZkLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkLease")
            .field("path", &self.shared.path)
            .field("fence", &self.shared.core.fence())
            .finish_non_exhaustive()
    }
}

impl LeaseShared {
    fn state(&self) -> std::sync::MutexGuard<'_, HoldState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Someone else deleted our node (a force-release): lost, unless the hold is over anyway.
    fn broken(&self) {
        if !self.state().over {
            self.core.signal().fire(LostReason::Broken);
        }
    }

    /// Whether the TTL has run out, marking the hold over and firing its lost signal if it
    /// has (the caller then deletes the node).
    fn expire_if_due(&self) -> bool {
        let expired = {
            let mut state = self.state();
            let expired = !state.over && state.deadline <= Instant::now();
            if expired {
                state.over = true;
            }
            expired
        };
        if expired {
            self.core.signal().fire(LostReason::Expired);
        }
        expired
    }
}

impl ZkLease {
    /// The hold of a granted node: on the session for a watchdog hold, else with a deadline
    /// of its own.
    pub(super) fn start(node: Node, req: &AcquireRequest, start: Instant) -> Arc<dyn Lease> {
        if req.watchdog {
            return Arc::new(SessionLease::start(node, start, req.ttl));
        }
        let shared = Arc::new(LeaseShared {
            name: req.name.as_str().to_owned(),
            session: node.session,
            path: node.path,
            owner: req.owner.clone(),
            acquired_ms: unix_ms(SystemTime::now()),
            // czxid: the zxid that created the node, greater than that of every node created
            // before it, in this directory or any earlier incarnation of it.
            core: LeaseCore::new(FencingToken::from_signed(node.czxid), start),
            state: StdMutex::new(HoldState {
                deadline: start + req.ttl,
                over: false,
            }),
            changed: Notify::new(),
        });
        tokio::spawn(keep(shared.clone()));
        Arc::new(ZkLease { shared })
    }
}

type EventFuture = Pin<Box<dyn Future<Output = Option<WatchedEvent>> + Send>>;

/// Watches one hold: deletes the node when its TTL runs out, and fires the lost signal when
/// the node is deleted by someone else (a force-release) or the session ends.
async fn keep(shared: Arc<LeaseShared>) {
    let session = shared.session.clone();
    let mut watch: Option<EventFuture> = None;
    let mut armed = false;
    // Most holds are short: arm the watch on our own node only once the hold has lasted a
    // moment, so a quick acquire + release costs the server two requests, not three. Until
    // then a force-release is noticed by the next extend; the TTL and session still apply.
    let arm_at = shared.core.lease_start() + OWN_NODE_WATCH_DELAY;
    loop {
        let (over, deadline) = {
            let state = shared.state();
            (state.over, state.deadline)
        };
        if over {
            break;
        }
        if !armed && Instant::now() < arm_at && deadline > arm_at {
            tokio::select! {
                () = tokio::time::sleep_until(arm_at) => {}
                () = shared.changed.notified() => {}
                () = session.gone.cancelled() => {}
            }
            if !session.gone.is_cancelled() {
                continue;
            }
        }
        if !armed {
            armed = true;
            match session.client.check_and_watch_stat(&shared.path).await {
                Ok((Some(_), watcher)) => watch = Some(Box::pin(watch_fired(watcher))),
                Ok((None, _)) => {
                    shared.broken();
                    break;
                }
                // Connection trouble: the session's state decides, below.
                Err(_) => watch = None,
            }
        }
        let deadline = {
            let state = shared.state();
            if state.over {
                break;
            }
            state.deadline
        };
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => {
                if shared.expire_if_due() {
                    delete_until_done(&session.client, &shared.path).await;
                    break;
                }
            }
            () = shared.changed.notified() => {}
            event = async { match watch.as_mut() { Some(w) => w.await, None => std::future::pending().await } } => {
                watch = None;
                match event.map(|event| event.event_type) {
                    Some(EventType::NodeDeleted) => {
                        shared.broken();
                        break;
                    }
                    // Our own data write (an extension), a session event, or a watch that can no
                    // longer fire: watch again (a session that is over shows on `gone`).
                    _ => armed = false,
                }
            }
            () = session.gone.cancelled() => {
                shared.core.signal().fire(session.end_reason());
                let was_over = std::mem::replace(&mut shared.state().over, true);
                if !was_over {
                    delete_until_done(&session.client, &shared.path).await;
                }
                break;
            }
        }
    }
}

#[async_trait]
impl Lease for ZkLease {
    fn core(&self) -> &LeaseCore {
        &self.shared.core
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        crate::ttl::check_store_ttl(ttl)?;
        let shared = &self.shared;
        let not_owned = || Error::not_owned(&shared.name);
        let now = Instant::now();
        let deadline = {
            let mut state = shared.state();
            if state.over || shared.core.lost().is_cancelled() || state.deadline <= now {
                return Err(not_owned());
            }
            // Moved before the write, so the keeper task cannot delete the node under it.
            state.deadline = state.deadline.max(now + ttl);
            state.deadline
        };
        shared.changed.notify_one();
        if shared.session.gone.is_cancelled() {
            shared.core.signal().fire(shared.session.end_reason());
            return Err(not_owned());
        }
        // Suspended: the lock may or may not still be ours.
        shared.session.check()?;
        let result = if ttl.is_zero() {
            shared
                .session
                .client
                .check_stat(&shared.path)
                .await
                .map(|stat| stat.is_some_and(|s| s.ephemeral_owner == shared.session.id))
        } else {
            let left = deadline.saturating_duration_since(now);
            let deadline_ms = unix_ms(SystemTime::now() + left);
            let data = node_data(&shared.owner, shared.acquired_ms, Until::At(deadline_ms));
            match shared
                .session
                .client
                .set_data(&shared.path, &data, None)
                .await
            {
                Ok(_) => Ok(true),
                Err(zookeeper_client::Error::NoNode) => Ok(false),
                Err(e) => Err(e),
            }
        };
        match result {
            Ok(true) => Ok(()),
            Ok(false) => {
                shared.core.signal().fire(LostReason::Broken);
                Err(not_owned())
            }
            Err(zookeeper_client::Error::SessionExpired) => {
                shared.core.signal().fire(LostReason::SessionEnded);
                Err(not_owned())
            }
            Err(e) => Err(map(e, &shared.path)),
        }
    }

    async fn release(&self) -> Result<()> {
        let shared = &self.shared;
        {
            let mut state = shared.state();
            if state.over {
                return Err(Error::not_owned(&shared.name));
            }
            state.over = true;
        }
        shared.changed.notify_one();
        // Lost: by the keeper's deadline (renewals failed while the connection was suspended)
        // or a session given up on, the node may still exist, and the session may come back
        // with it; the lock would then stay held by nobody. Delete it (a no-op if it is gone).
        if shared.core.lost().is_cancelled() || shared.session.gone.is_cancelled() {
            let shared = shared.clone();
            tokio::spawn(async move {
                delete_until_done(&shared.session.client, &shared.path).await;
            });
            return Err(Error::not_owned(&self.shared.name));
        }
        match shared.session.client.delete(&shared.path, None).await {
            Ok(()) => Ok(()),
            Err(zookeeper_client::Error::NoNode) => Err(Error::not_owned(&shared.name)),
            Err(zookeeper_client::Error::SessionExpired) => {
                shared.core.signal().fire(LostReason::SessionEnded);
                Err(Error::not_owned(&shared.name))
            }
            Err(error) => {
                // The node stays until it is deleted or the session ends: keep trying.
                let shared = shared.clone();
                tokio::spawn(async move {
                    delete_until_done(&shared.session.client, &shared.path).await;
                });
                Err(map(error, &self.shared.path))
            }
        }
    }

    async fn put_fenced(&self, value: &LockName, bytes: &[u8]) -> Result<Option<u64>> {
        let shared = &self.shared;
        // The TTL is kept by this client: a write after its end is refused here even when the
        // node's deletion (by the keeping task, on a loaded machine) has not landed yet.
        if shared.expire_if_due() {
            let shared = shared.clone();
            tokio::spawn(async move {
                delete_until_done(&shared.session.client, &shared.path).await;
            });
            return Ok(None);
        }
        super::values::put_while_held(&shared.session, &shared.path, value, bytes).await
    }

    async fn release_elsewhere(&self) -> Result<()> {
        let shared = &self.shared;
        // Not refused when already over: a release cut short by the runtime's shutdown set
        // that without deleting the node.
        shared.state().over = true;
        shared.changed.notify_one();
        // The session's connection is driven by the client's runtime, which is shutting down,
        // and its ephemeral node would outlive it until the session expires. The node's
        // sequential name is this hold's alone, so another session may delete it.
        let client = connect_client(&shared.session.config).await?;
        match client.delete(&shared.path, None).await {
            Ok(()) => Ok(()),
            Err(zookeeper_client::Error::NoNode) => Err(Error::not_owned(&shared.name)),
            Err(error) => Err(map(error, &shared.path)),
        }
    }
}
