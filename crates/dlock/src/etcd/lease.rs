//! One hold of an etcd lock: extend (lease keep-alive) and release (revoke), checked by ownership
//! compares.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::{AcquireRequest, Lease, LeaseCore, LossSignal};
use crate::error::{Error, Result};
use crate::fence::FencingToken;

use super::error::{lease_gone, map};
use super::lease_secs;
use super::{Inner, connect_client};

/// One hold of an etcd lock: its key (create revision = fence) under its own lease.
#[derive(Debug)]
pub(super) struct EtcdLease {
    core: LeaseCore,
    inner: Arc<Inner>,
    name: String,
    key: Vec<u8>,
    fence: i64,
    /// The lease the key is attached to now, and its granted length in seconds; replaced
    /// when an extension needs a longer lease.
    lease: Arc<Mutex<(i64, i64)>>,
    /// Ends the task that revokes the lease on loss (see [`EtcdLease::new`]).
    _stop: tokio_util::sync::DropGuard,
}

impl EtcdLease {
    pub(super) fn new(
        inner: Arc<Inner>,
        req: &AcquireRequest,
        key: Vec<u8>,
        fence: i64,
        lease: (i64, i64),
        start: Instant,
    ) -> EtcdLease {
        let lease = Arc::new(Mutex::new(lease));
        let lost = LossSignal::new();
        let stop = CancellationToken::new();
        // etcd counts leases in whole seconds, so the store would keep a 100 ms lock for a
        // second or two. When the hold is lost (the keeper's local deadline, a refused renewal,
        // a release), the holder revokes its lease at once, so others get the lock at its TTL
        // and not at etcd's; etcd's own expiry remains the backstop for a holder that cannot.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (inner, lease, lost, stop) =
                (inner.clone(), lease.clone(), lost.clone(), stop.clone());
            runtime.spawn(async move {
                tokio::select! {
                    () = lost.token().cancelled() => {
                        let (id, _) = *lease.lock().unwrap_or_else(PoisonError::into_inner);
                        inner.revoke_later(vec![id]);
                    }
                    () = stop.cancelled() => {}
                }
            });
        }
        EtcdLease {
            inner,
            name: req.name.as_str().to_owned(),
            key,
            fence,
            lease,
            core: LeaseCore::with_signal(FencingToken::from_signed(fence), lost, start),
            _stop: stop.drop_guard(),
        }
    }

    fn current(&self) -> (i64, i64) {
        *self.lease.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Our key still exists, from our acquisition, under our lease.
    fn owned_when(&self, lease: i64) -> [Compare; 2] {
        [
            Compare::create_revision(self.key.clone(), CompareOp::Equal, self.fence),
            Compare::lease(self.key.clone(), CompareOp::Equal, lease),
        ]
    }

    async fn check_owned(&self, lease: i64) -> Result<()> {
        let key = &self.key;
        let reply = self
            .inner
            .resend(|mut c| async move { c.get(key.as_slice(), None).await })
            .await
            .map_err(map)?;
        match reply.kvs().first() {
            Some(kv) if kv.create_revision() == self.fence && kv.lease() == lease => Ok(()),
            _ => Err(Error::not_owned(&self.name)),
        }
    }
}

#[async_trait]
impl Lease for EtcdLease {
    fn core(&self) -> &LeaseCore {
        &self.core
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        crate::ttl::check_store_ttl(ttl)?;
        let (lease, granted) = self.current();
        if ttl.is_zero() {
            return self.check_owned(lease).await;
        }
        let secs = lease_secs(ttl);
        if secs <= granted {
            // A keep-alive restarts the lease at its granted length (never shorter than now).
            let (alive, owned) =
                tokio::join!(self.inner.keep_alive(lease), self.check_owned(lease));
            match alive {
                Err(error) if lease_gone(&error) => return Err(Error::not_owned(&self.name)),
                Err(error) => return Err(map(error)),
                Ok(()) => {}
            }
            return owned;
        }
        // A longer TTL needs a longer lease: move the key to a new one, if it is still ours.
        let (longer, longer_secs) = self.inner.grant(secs).await?;
        let moved = self
            .inner
            .txn(
                Txn::new()
                    .when(self.owned_when(lease))
                    .and_then([TxnOp::put(
                        self.key.clone(),
                        Vec::new(),
                        Some(PutOptions::new().with_lease(longer).with_ignore_value()),
                    )]),
            )
            .await;
        match moved {
            Ok(reply) if reply.succeeded() => {
                *self.lease.lock().unwrap_or_else(PoisonError::into_inner) = (longer, longer_secs);
                self.inner.revoke_later(vec![lease]);
                Ok(())
            }
            Ok(_) => {
                self.inner.revoke_later(vec![longer]);
                Err(Error::not_owned(&self.name))
            }
            Err(error) => {
                self.inner.revoke_later(vec![longer]);
                Err(error)
            }
        }
    }

    async fn release(&self) -> Result<()> {
        let (lease, _) = self.current();
        let reply = self
            .inner
            .txn(
                Txn::new()
                    .when(self.owned_when(lease))
                    .and_then([TxnOp::delete(self.key.clone(), None)]),
            )
            .await?;
        // The key is gone either way; the lease has nothing left to keep.
        self.inner.revoke_later(vec![lease]);
        if reply.succeeded() {
            Ok(())
        } else {
            Err(Error::not_owned(&self.name))
        }
    }

    async fn release_elsewhere(&self) -> Result<()> {
        // The client's channels are driven by its runtime, which is shutting down and may
        // never answer: a fresh client on this runtime.
        let config = self.inner.config.clone();
        let fresh = Inner {
            client: connect_client(&config).await?,
            config,
        };
        let (lease, _) = self.current();
        let reply = fresh
            .txn(
                Txn::new()
                    .when(self.owned_when(lease))
                    .and_then([TxnOp::delete(self.key.clone(), None)]),
            )
            .await?;
        // Revoked here and now: a task spawned on this short-lived runtime would never run.
        if let Err(error) = fresh.client.clone().lease_revoke(lease).await
            && !lease_gone(&error)
        {
            tracing::debug!(%error, lease, "revoking a lease failed; it expires instead");
        }
        if reply.succeeded() {
            Ok(())
        } else {
            Err(Error::not_owned(&self.name))
        }
    }
}
