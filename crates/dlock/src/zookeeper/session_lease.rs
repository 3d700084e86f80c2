//! A watchdog hold of a ZooKeeper lock: its ephemeral node, kept alive by the session's
//! heartbeat alone. Its renewal reads local state (is the session alive and answered
//! recently?) and sends nothing; the session tells it of a break or of the session's end
//! (`session_holds.rs`). Small on purpose: no timer, no task, no copy of the name.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::backend::{Lease, LeaseCore, LossSignal};
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::name::LockName;

use super::acquire::{Node, delete_until_done};
use super::error::map;
use super::queue_rules::decode_name;
use super::session::{Session, connect_client};

/// A watchdog hold riding its session.
pub(super) struct SessionLease {
    core: LeaseCore,
    session: Arc<Session>,
    /// The hold's number in its session's holds.
    id: u64,
    path: Arc<str>,
    /// Released (or its release begun): no further extend or release.
    over: AtomicBool,
}

impl std::fmt::Debug for SessionLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionLease")
            .field("path", &self.path)
            .field("fence", &self.core.fence())
            .finish_non_exhaustive()
    }
}

impl SessionLease {
    /// The hold of `node` with watchdog lease `lease`, granted by a listing sent at `start`,
    /// joined to its session.
    pub(super) fn start(node: Node, start: Instant, lease: Duration) -> SessionLease {
        let signal = LossSignal::new();
        let path: Arc<str> = node.path.into();
        let id = node
            .session
            .holds
            .join(path.clone(), signal.clone(), start, lease);
        SessionLease {
            // czxid: the zxid that created the node, greater than that of every node created
            // before it, in this directory or any earlier incarnation of it.
            core: LeaseCore::with_signal(FencingToken::from_signed(node.czxid), signal, start),
            session: node.session,
            id,
            path,
            over: AtomicBool::new(false),
        }
    }

    /// The lock's name, read back from the node's path (only errors need it).
    fn not_owned(&self) -> Error {
        let dir = self.path.rsplit('/').nth(1).unwrap_or_default();
        let name = decode_name(dir).unwrap_or_default();
        let name = name.split('\0').next().unwrap_or_default();
        Error::not_owned(name)
    }

    /// Whether the node is still this session's: a store call, for an explicit check.
    async fn check_owned(&self) -> Result<()> {
        // Suspended: the lock may or may not still be ours.
        self.session.check()?;
        match self.session.client.check_stat(&self.path).await {
            Ok(Some(stat)) if stat.ephemeral_owner == self.session.id => Ok(()),
            Ok(_) => {
                self.session.holds.leave(self.id);
                self.core.signal().fire(crate::LostReason::Broken);
                Err(self.not_owned())
            }
            Err(zookeeper_client::Error::SessionExpired) => {
                self.session.end(crate::LostReason::SessionEnded);
                Err(self.not_owned())
            }
            Err(e) => Err(map(e, &self.path)),
        }
    }
}

#[async_trait]
impl Lease for SessionLease {
    fn core(&self) -> &LeaseCore {
        &self.core
    }

    /// A renewal: the session's heartbeat keeps the node, so only local state is read. A zero
    /// `ttl` (an explicit ownership check) asks the server.
    async fn extend(&self, ttl: Duration) -> Result<()> {
        crate::ttl::check_store_ttl(ttl)?;
        if self.over.load(Ordering::Acquire) || self.core.lost().is_cancelled() {
            return Err(self.not_owned());
        }
        if let Some(reason) = self.session.over() {
            self.core.signal().fire(reason);
            return Err(self.not_owned());
        }
        if ttl.is_zero() {
            return self.check_owned().await;
        }
        Ok(())
    }

    async fn release(&self) -> Result<()> {
        if self.over.swap(true, Ordering::AcqRel) {
            return Err(self.not_owned());
        }
        // Our own delete is no break.
        self.session.holds.leave(self.id);
        // Lost (a break, or a session given up on): the node may still exist, and the session
        // may come back with it; the lock would then stay held by nobody. Delete it (a no-op
        // if it is gone).
        if self.core.lost().is_cancelled() || self.session.gone.is_cancelled() {
            let (session, path) = (self.session.clone(), self.path.clone());
            tokio::spawn(async move { delete_until_done(&session.client, &path).await });
            return Err(self.not_owned());
        }
        match self.session.client.delete(&self.path, None).await {
            Ok(()) => Ok(()),
            Err(zookeeper_client::Error::NoNode) => Err(self.not_owned()),
            Err(zookeeper_client::Error::SessionExpired) => {
                self.session.end(crate::LostReason::SessionEnded);
                Err(self.not_owned())
            }
            Err(error) => {
                // The node stays until it is deleted or the session ends: keep trying.
                let (session, path) = (self.session.clone(), self.path.clone());
                tokio::spawn(async move { delete_until_done(&session.client, &path).await });
                Err(map(error, &self.path))
            }
        }
    }

    async fn put_fenced(&self, value: &LockName, bytes: &[u8]) -> Result<Option<u64>> {
        super::values::put_while_held(&self.session, &self.path, value, bytes).await
    }

    async fn release_elsewhere(&self) -> Result<()> {
        // Not refused when already over: a release cut short by the runtime's shutdown set
        // that without deleting the node.
        self.over.store(true, Ordering::Release);
        self.session.holds.leave(self.id);
        // The session's connection is driven by the client's runtime, which is shutting down,
        // and its ephemeral node would outlive it until the session expires. The node's
        // sequential name is this hold's alone, so another session may delete it.
        let client = connect_client(&self.session.config).await?;
        match client.delete(&self.path, None).await {
            Ok(()) => Ok(()),
            Err(zookeeper_client::Error::NoNode) => Err(self.not_owned()),
            Err(error) => Err(map(error, &self.path)),
        }
    }
}

impl Drop for SessionLease {
    fn drop(&mut self) {
        // A hold dropped without a release (its guard released it through another lease
        // handle, or the client was closed): nothing of it stays in the session.
        self.session.holds.leave(self.id);
    }
}
