//! One hold of an etcd lock: extend (a keep-alive of its own lease, or of the client's session
//! lease gathered with every other renewal of the pass) and release (delete the key, revoke an
//! own lease), checked by ownership compares.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::{AcquireRequest, Lease, LeaseCore, LossSignal};
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::name::LockName;

use super::error::{lease_gone, map};
use super::lease_secs;
use super::session::{Renewed, Session};
use super::{Inner, connect_client};

/// The etcd lease a hold's key is on.
#[derive(Clone, Debug)]
pub(super) enum Attached {
    /// A lease of its own (a fixed TTL, a maximum hold, or a watchdog hold extended past the
    /// session's length): its id and granted length in seconds.
    Own { id: i64, secs: i64 },
    /// The client's session lease, as hold number `seq` on it.
    Session { session: Arc<Session>, seq: u64 },
}

impl Attached {
    /// The etcd lease id.
    fn id(&self) -> i64 {
        match self {
            Attached::Own { id, .. } => *id,
            Attached::Session { session, .. } => session.id,
        }
    }
}

/// One hold of an etcd lock: its key (create revision = fence) on its own lease or on the
/// client's session lease.
#[derive(Debug)]
pub(super) struct EtcdLease {
    core: LeaseCore,
    inner: Arc<Inner>,
    name: String,
    key: Vec<u8>,
    fence: i64,
    /// The lease the key is on now; a hold moves to a lease of its own when an extension
    /// needs a longer one.
    attached: Arc<Mutex<Attached>>,
    /// Set by whichever of the release and the clean-up on loss deals with the store first,
    /// so the other does not do it again (one `LeaseRevoke` per hold, not two).
    cleaned: Arc<AtomicBool>,
    /// The own lease the hold began on (0 on the session): only that one may serve the next
    /// hold once released, for the hold's start says since when etcd keeps it.
    began_on: i64,
    /// Ends the task that cleans up on loss (see [`EtcdLease::new`]).
    _stop: tokio_util::sync::DropGuard,
}

impl EtcdLease {
    pub(super) fn new(
        inner: Arc<Inner>,
        req: &AcquireRequest,
        key: Vec<u8>,
        fence: i64,
        attached: Attached,
        start: Instant,
    ) -> EtcdLease {
        let lost = LossSignal::new();
        if let Attached::Session { session, seq } = &attached {
            session.join(*seq, key.clone(), fence, lost.clone());
        }
        let began_on = match &attached {
            Attached::Own { id, .. } => *id,
            Attached::Session { .. } => 0,
        };
        let attached = Arc::new(Mutex::new(attached));
        let cleaned = Arc::new(AtomicBool::new(false));
        let stop = CancellationToken::new();
        // etcd counts leases in whole seconds, so the store would keep a 100 ms lock for a
        // second or two. When the hold is lost (the keeper's local deadline, a refused renewal,
        // a break), the holder revokes its own lease (or deletes its key from the session's)
        // at once, so others get the lock at its TTL and not at etcd's; etcd's own expiry
        // remains the backstop for a holder that cannot.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (inner, attached, lost, stop, cleaned) = (
                inner.clone(),
                attached.clone(),
                lost.clone(),
                stop.clone(),
                cleaned.clone(),
            );
            let key = key.clone();
            runtime.spawn(async move {
                tokio::select! {
                    () = lost.token().cancelled() => {
                        if !cleaned.swap(true, Ordering::SeqCst) {
                            let attached = lock(&attached).clone();
                            clean_up(&inner, attached, key, fence).await;
                        }
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
            attached,
            cleaned,
            began_on,
            core: LeaseCore::with_signal(FencingToken::from_signed(fence), lost, start),
            _stop: stop.drop_guard(),
        }
    }

    fn current(&self) -> Attached {
        lock(&self.attached).clone()
    }

    /// Our key still exists, from our acquisition, under our lease.
    fn owned_when(&self, lease: i64) -> [Compare; 2] {
        owned_when(&self.key, self.fence, lease)
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

    /// A renewal on the session: one keep-alive shared with every renewal of the pass; a
    /// break seen by the hold's watch is a refusal.
    async fn renew_on_session(&self, session: &Session) -> Result<()> {
        if self.core.signal().reason().is_some() {
            return Err(Error::not_owned(&self.name));
        }
        match session.renew(&self.inner.client).await {
            Renewed::Alive if self.core.signal().reason().is_none() => Ok(()),
            Renewed::Alive | Renewed::Gone => Err(Error::not_owned(&self.name)),
            Renewed::Failed => Err(Error::Unavailable {
                backend: super::error::BACKEND,
                source: "the keep-alive of the client's session lease failed".into(),
            }),
        }
    }

    /// A longer TTL needs a longer lease: moves the key to a new one, if it is still ours.
    async fn move_to_longer(&self, from: &Attached, secs: i64) -> Result<()> {
        let (longer, longer_secs) = self.inner.grant(secs).await?;
        let moved = self
            .inner
            .txn(
                Txn::new()
                    .when(self.owned_when(from.id()))
                    .and_then([TxnOp::put(
                        self.key.clone(),
                        Vec::new(),
                        Some(PutOptions::new().with_lease(longer).with_ignore_value()),
                    )]),
            )
            .await;
        match moved {
            Ok(reply) if reply.succeeded() => {
                *lock(&self.attached) = Attached::Own {
                    id: longer,
                    secs: longer_secs,
                };
                match from {
                    Attached::Own { id, .. } => self.inner.revoke_later(vec![*id]),
                    Attached::Session { session, seq } => session.leave(*seq),
                }
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
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `key` still exists, from the acquisition at `fence`, under `lease`.
fn owned_when(key: &[u8], fence: i64, lease: i64) -> [Compare; 2] {
    [
        Compare::create_revision(key.to_vec(), CompareOp::Equal, fence),
        Compare::lease(key.to_vec(), CompareOp::Equal, lease),
    ]
}

/// The clean-up of a hold lost without a release: its own lease revoked, or its key deleted
/// from the session's lease (which lives on for the other holds), retried a few times while
/// the session lives, since the key would otherwise stay as long as the session.
async fn clean_up(inner: &Arc<Inner>, attached: Attached, key: Vec<u8>, fence: i64) {
    let (session, seq) = match attached {
        Attached::Own { id, .. } => return inner.revoke_later(vec![id]),
        Attached::Session { session, seq } => (session, seq),
    };
    session.leave(seq);
    let delete = Txn::new()
        .when(owned_when(&key, fence, session.id))
        .and_then([TxnOp::delete(key, None)]);
    let mut backoff = super::acquire::retry_backoff();
    for _ in 0..20 {
        if session.has_ended() || inner.txn(delete.clone()).await.is_ok() {
            return;
        }
        tokio::time::sleep(backoff.next()).await;
    }
}

#[async_trait]
impl Lease for EtcdLease {
    fn core(&self) -> &LeaseCore {
        &self.core
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        crate::ttl::check_store_ttl(ttl)?;
        let attached = self.current();
        if ttl.is_zero() {
            return self.check_owned(attached.id()).await;
        }
        let secs = lease_secs(ttl);
        match &attached {
            Attached::Session { session, .. } if secs <= session.secs => {
                self.renew_on_session(session).await
            }
            Attached::Own { id, secs: granted } if secs <= *granted => {
                // A keep-alive restarts the lease at its granted length (never shorter than now).
                let (alive, owned) =
                    tokio::join!(self.inner.keep_alive(*id), self.check_owned(*id));
                match alive {
                    Err(error) if lease_gone(&error) => return Err(Error::not_owned(&self.name)),
                    Err(error) => return Err(map(error)),
                    Ok(()) => {}
                }
                owned
            }
            _ => self.move_to_longer(&attached, secs).await,
        }
    }

    async fn release(&self) -> Result<()> {
        let attached = self.current();
        if let Attached::Session { session, seq } = &attached {
            // Our own delete is no break.
            session.leave(*seq);
        }
        let deleted = self
            .inner
            .txn(
                Txn::new()
                    .when(self.owned_when(attached.id()))
                    .and_then([TxnOp::delete(self.key.clone(), None)]),
            )
            .await;
        match (&attached, &deleted) {
            // The key is gone either way; the lease has nothing left to keep.
            (Attached::Own { id, secs }, _) => {
                if !self.cleaned.swap(true, Ordering::SeqCst) {
                    // Our key is gone: nothing rides on the lease, the next hold may.
                    let deleted = matches!(&deleted, Ok(reply) if reply.succeeded());
                    let kept = deleted
                        && self.began_on == *id
                        && self.inner.spares.put(*id, *secs, self.core.lease_start());
                    if !kept {
                        self.inner.revoke_later(vec![*id]);
                    }
                }
            }
            // Answered: nothing left to clean. Not answered: the clean-up on loss (which the
            // release fires next) deletes the key, which the session would keep.
            (Attached::Session { .. }, Ok(_)) => self.cleaned.store(true, Ordering::SeqCst),
            (Attached::Session { .. }, Err(_)) => {}
        }
        if deleted?.succeeded() {
            Ok(())
        } else {
            Err(Error::not_owned(&self.name))
        }
    }

    async fn put_fenced(&self, value: &LockName, bytes: &[u8]) -> Result<Option<u64>> {
        let held = self.owned_when(self.current().id());
        super::values::put_when_held(&self.inner, held, value, bytes).await
    }

    async fn release_elsewhere(&self) -> Result<()> {
        // The client's channels are driven by its runtime, which is shutting down and may
        // never answer: a fresh client on this runtime.
        let config = self.inner.config.clone();
        let fresh = Inner {
            client: connect_client(&config).await?,
            config,
            sessions: Default::default(),
            spares: Default::default(),
        };
        let attached = self.current();
        let reply = fresh
            .txn(
                Txn::new()
                    .when(self.owned_when(attached.id()))
                    .and_then([TxnOp::delete(self.key.clone(), None)]),
            )
            .await?;
        self.cleaned.store(true, Ordering::SeqCst);
        match &attached {
            // Revoked here and now: a task spawned on this short-lived runtime would never run.
            Attached::Own { id, .. } => {
                if let Err(error) = fresh.client.clone().lease_revoke(*id).await
                    && !lease_gone(&error)
                {
                    tracing::debug!(%error, lease = id, "revoking a lease failed; it expires instead");
                }
            }
            Attached::Session { session, seq } => session.leave(*seq),
        }
        if reply.succeeded() {
            Ok(())
        } else {
            Err(Error::not_owned(&self.name))
        }
    }
}
