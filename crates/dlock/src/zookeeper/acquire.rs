//! Acquiring a ZooKeeper lock: an ephemeral sequential node, the wait for the turn (a watch
//! on the predecessor), and the clean-up of an abandoned attempt.

use std::sync::Arc;
use std::time::SystemTime;

use tokio::time::Instant;
use zookeeper_client::{Client, CreateMode, SessionState, WatchedEvent};

use crate::backend::abandon::spawn_cleanup;
use crate::backend::wait::Backoff;
use crate::backend::{AcquireRequest, Lease, Wait};
use crate::error::{Error, Result};
use crate::lease::keeper::LostReason;

use super::error::{BACKEND, map, session_lost};
use super::lease::ZkLease;
use super::queue_rules::decide;
use super::queue_rules::node_data;
use super::queue_rules::queue;
use super::queue_rules::sequence;
use super::queue_rules::{Until, duration_ms, unix_ms};
use super::session::Session;
use super::{Inner, NODE_INFIX, NODE_PREFIX, RETRY_MAX, RETRY_MIN};
use crate::backend::LockKind;
use crate::backend::queue_rules::Decision;

/// Deletes a node, retrying through a suspended connection until the server has ended the
/// session. A session this client gave up on (suspended past the safe window) may come back
/// alive with the node: it is deleted then, so a lock reported lost is never left held.
pub(super) async fn delete_until_done(client: &Client, path: &str) {
    let mut backoff = Backoff::steady(RETRY_MIN, RETRY_MAX);
    let give_up = Instant::now() + client.session_timeout() * 4;
    loop {
        let over = matches!(
            client.state(),
            SessionState::Expired | SessionState::Closed | SessionState::AuthFailed
        );
        match client.delete(path, None).await {
            Ok(()) | Err(zookeeper_client::Error::NoNode) => return,
            Err(error)
                if map(error.clone(), path).is_retryable() && !over && Instant::now() < give_up =>
            {
                tracing::debug!(%error, path, "deleting a lock node failed; retrying");
                tokio::time::sleep(backoff.next()).await;
            }
            Err(error) => {
                tracing::debug!(%error, path, "deleting a lock node failed; the session's end removes it");
                return;
            }
        }
    }
}

/// Our node in a lock's queue.
pub(super) struct Node {
    pub(super) session: Arc<Session>,
    pub(super) path: String,
    seq: i64,
    pub(super) czxid: i64,
}

/// What an acquire call has put in the store; removed if the call ends without the lock
/// (timeout, error or the future dropped).
pub(super) struct Waiter {
    pub(super) inner: Arc<Inner>,
    pub(super) dir: String,
    /// Unique per acquire call; its first letter says the kind of hold (see [`LockKind`]).
    pub(super) tag: String,
    pub(super) turn: LockKind,
    pub(super) node: Option<Node>,
    /// A create was sent in this session and its reply not read: the node may exist.
    pub(super) uncertain: Option<Arc<Session>>,
}

impl Waiter {
    fn prefix(&self) -> String {
        format!("{}/{NODE_PREFIX}{}{NODE_INFIX}", self.dir, self.tag)
    }

    /// Protected mode: finds a node of this call's tag whose create reply was lost.
    async fn find_tagged(&self, session: &Arc<Session>) -> Result<Option<Node>> {
        let children = match session.client.list_children(&self.dir).await {
            Ok(children) => children,
            Err(zookeeper_client::Error::NoNode) => return Ok(None),
            Err(e) => return Err(map(e, &self.dir)),
        };
        let mine = format!("{NODE_PREFIX}{}{NODE_INFIX}", self.tag);
        for child in children {
            if let (true, Some(seq)) = (child.starts_with(&mine), sequence(&child)) {
                let path = format!("{}/{child}", self.dir);
                match session.client.check_stat(&path).await {
                    Ok(Some(stat)) if stat.ephemeral_owner == session.id => {
                        return Ok(Some(Node {
                            session: session.clone(),
                            path,
                            seq,
                            czxid: stat.czxid,
                        }));
                    }
                    Ok(_) => {}
                    Err(e) => return Err(map(e, &path)),
                }
            }
        }
        Ok(None)
    }

    /// Removes our node now (a timed-out wait), leaving any failure to `Drop`.
    async fn leave(&mut self) {
        if let Some(node) = &self.node {
            match node.session.client.delete(&node.path, None).await {
                Ok(()) | Err(zookeeper_client::Error::NoNode) => self.node = None,
                Err(error) => {
                    tracing::debug!(%error, path = node.path, "leaving the queue failed; retrying in the background");
                }
            }
        }
    }
}

impl Waiter {
    /// The acquire call ended (granted, timed out, failed or dropped): removes whatever of
    /// its own it left in the store. A grant has taken its node already.
    pub(super) fn abandon(self) {
        let Waiter {
            node,
            uncertain,
            dir,
            tag,
            ..
        } = self;
        if node.is_none() && uncertain.is_none() {
            return;
        }
        let mine = format!("{NODE_PREFIX}{tag}{NODE_INFIX}");
        // Without a runtime: ephemeral, the session's end removes the node.
        spawn_cleanup(move || async move {
            if let Some(node) = node {
                delete_until_done(&node.session.client, &node.path).await;
            }
            if let Some(session) = uncertain {
                // Requests of one session run in order: this listing sees the lost create.
                if let Ok(children) = session.client.list_children(&dir).await {
                    for child in children.iter().filter(|c| c.starts_with(&mine)) {
                        delete_until_done(&session.client, &format!("{dir}/{child}")).await;
                    }
                }
            }
        });
    }
}

/// Completes when a one-shot watch fires or can no longer fire. zookeeper-client 0.11 panics
/// inside `changed()` when its session ends before the watch fires (the event channel is
/// dropped); awaiting it in its own task turns that into an ordinary wake-up, after which the
/// callers check the session's state.
pub(super) async fn watch_fired(watcher: zookeeper_client::OneshotWatcher) -> Option<WatchedEvent> {
    tokio::spawn(watcher.changed()).await.ok()
}

/// Creates the lock's directory (a container node, which the server deletes once it is
/// empty) and the chroot above it (persistent) as needed.
async fn create_dir(inner: &Inner, session: &Session, dir: &str) -> Result<()> {
    let acls = inner.acls();
    for _ in 0..3 {
        match session
            .client
            .create(dir, &[], &CreateMode::Container.with_acls(acls))
            .await
        {
            Ok(_) | Err(zookeeper_client::Error::NodeExists) => return Ok(()),
            Err(zookeeper_client::Error::NoNode) => {
                match session
                    .client
                    .mkdir(
                        &inner.config.chroot,
                        &CreateMode::Persistent.with_acls(acls),
                    )
                    .await
                {
                    Ok(()) | Err(zookeeper_client::Error::NodeExists) => {}
                    Err(e) => return Err(map(e, &inner.config.chroot)),
                }
            }
            Err(e) => return Err(map(e, dir)),
        }
    }
    Err(Error::Unavailable {
        backend: BACKEND,
        source: format!("{dir} kept disappearing while being created").into(),
    })
}

/// Whether an error says the session is over (the server told us, before the session's
/// state watcher did).
pub(super) fn is_session_expired(error: &Error) -> bool {
    matches!(error, Error::Unavailable { source, .. }
        if source.downcast_ref::<zookeeper_client::Error>() == Some(&zookeeper_client::Error::SessionExpired))
}

/// One pass: queue (or find our earlier node), then wait for the predecessors to go.
pub(super) async fn attempt(
    waiter: &mut Waiter,
    req: &AcquireRequest,
    deadline: Option<Instant>,
) -> Result<Option<Arc<dyn Lease>>> {
    let session = waiter.inner.session().await?;
    let result = attempt_in(waiter, req, deadline, &session).await;
    if let Err(error) = &result
        && is_session_expired(error)
    {
        // The next attempt opens a new session instead of failing on this one again.
        session.end(LostReason::SessionEnded);
    }
    result
}

async fn attempt_in(
    waiter: &mut Waiter,
    req: &AcquireRequest,
    deadline: Option<Instant>,
    session: &Arc<Session>,
) -> Result<Option<Arc<dyn Lease>>> {
    forget_gone(waiter, session).await?;
    if waiter.node.is_none() {
        waiter.node = Some(create_node(waiter, req, session).await?);
    }
    take_turn(waiter, req, deadline, session).await
}

/// Drops what the waiter left in a session that is over (gone with it), and finds the node of
/// a create whose reply was lost in this one.
async fn forget_gone(waiter: &mut Waiter, session: &Arc<Session>) -> Result<()> {
    // A node of a session that is over is gone with it.
    if waiter
        .node
        .as_ref()
        .is_some_and(|n| n.session.gone.is_cancelled())
    {
        waiter.node = None;
    }
    if waiter
        .uncertain
        .as_ref()
        .is_some_and(|s| s.gone.is_cancelled())
    {
        waiter.uncertain = None;
    }
    if waiter.node.is_none() && waiter.uncertain.is_some() {
        waiter.node = waiter.find_tagged(session).await?;
        waiter.uncertain = None;
    }
    Ok(())
}

/// Creates our node in the lock's queue (and the lock's directory, if it is gone).
async fn create_node(
    waiter: &mut Waiter,
    req: &AcquireRequest,
    session: &Arc<Session>,
) -> Result<Node> {
    let inner = waiter.inner.clone();
    let path = waiter.prefix();
    let now = unix_ms(SystemTime::now());
    // A watchdog hold rides the session: it lasts while the session does, and at most the
    // session's timeout past its holder's end.
    let until = if req.watchdog {
        Until::Session(duration_ms(session.client.session_timeout()))
    } else {
        Until::At(now.saturating_add(duration_ms(req.ttl)))
    };
    let data = node_data(&req.owner, now, until);
    let options = CreateMode::EphemeralSequential.with_acls(inner.acls());
    let mut created = None;
    for _ in 0..3 {
        waiter.uncertain = Some(session.clone());
        match session.client.create(&path, &data, &options).await {
            Ok(reply) => {
                created = Some(reply);
                break;
            }
            Err(zookeeper_client::Error::NoNode) => {
                waiter.uncertain = None;
                create_dir(&inner, session, &waiter.dir).await?;
            }
            Err(e) => {
                if !map(e.clone(), &path).is_retryable() {
                    waiter.uncertain = None;
                }
                return Err(map(e, &waiter.dir));
            }
        }
    }
    waiter.uncertain = None;
    let Some((stat, seq)) = created else {
        return Err(Error::Unavailable {
            backend: BACKEND,
            source: format!("{} kept disappearing", waiter.dir).into(),
        });
    };
    Ok(Node {
        session: session.clone(),
        path: format!("{path}{seq}"),
        seq: seq.into_i64(),
        czxid: stat.czxid,
    })
}

/// The lock's queue as the server lists it now (empty once its directory is gone).
async fn listed(session: &Session, dir: &str) -> Result<Vec<(i64, String)>> {
    match session.client.list_children(dir).await {
        Ok(children) => Ok(queue(children)),
        Err(zookeeper_client::Error::NoNode) => Ok(queue(Vec::new())),
        Err(e) => Err(map(e, dir)),
    }
}

/// Waits for our node's turn by the queue rule of its kind, watching only what must go.
async fn take_turn(
    waiter: &mut Waiter,
    req: &AcquireRequest,
    deadline: Option<Instant>,
    session: &Arc<Session>,
) -> Result<Option<Arc<dyn Lease>>> {
    loop {
        let Some(node) = &waiter.node else {
            return Err(session_lost());
        };
        let checked = Instant::now();
        let queue = listed(session, &waiter.dir).await?;
        let Some(position) = queue.iter().position(|(seq, _)| *seq == node.seq) else {
            // Our node is gone (the session ended, or someone deleted it): queue again.
            waiter.node = None;
            return Err(Error::Unavailable {
                backend: BACKEND,
                source: "the waiter's node disappeared".into(),
            });
        };
        let watched = match decide(waiter.turn, &queue, position) {
            Decision::SizeMismatch { asked, held_with } => {
                waiter.leave().await;
                return Err(Error::SizeMismatch {
                    name: req.name.to_string(),
                    asked,
                    held_with,
                });
            }
            Decision::Granted => {
                let Some(node) = waiter.node.take() else {
                    return Err(session_lost());
                };
                return Ok(Some(ZkLease::start(node, req, checked)));
            }
            Decision::WaitFor(_) | Decision::WaitForAnyLeave
                if deadline.is_some_and(|at| at <= Instant::now()) =>
            {
                waiter.leave().await;
                return Ok(None);
            }
            // Watch only the node that must go: its end wakes one waiter, not the herd. If
            // that node was a waiter that gave up, the next listing finds the next one.
            Decision::WaitFor(index) => {
                let ahead = format!("{}/{}", waiter.dir, queue[index].1);
                let (stat, watcher) = session
                    .client
                    .check_and_watch_stat(&ahead)
                    .await
                    .map_err(|e| map(e, &ahead))?;
                if stat.is_none() {
                    continue;
                }
                watcher
            }
            // Any node ahead leaving may be our turn (a permit or a reader place came free).
            Decision::WaitForAnyLeave => {
                let (children, watcher) = session
                    .client
                    .list_and_watch_children(&waiter.dir)
                    .await
                    .map_err(|e| map(e, &waiter.dir))?;
                if self::queue(children) != queue {
                    continue; // changed since the listing we decided on
                }
                watcher
            }
        };
        tokio::select! {
            _ = watch_fired(watched) => {}
            () = Wait::until(deadline).ended() => {
                waiter.leave().await;
                return Ok(None);
            }
            () = session.gone.cancelled() => return Err(session_lost()),
        }
    }
}
