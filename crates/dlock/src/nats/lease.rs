//! A hold of a NATS lock: its key, the revision of its last write (each renewal writes a new
//! one), and the clean-up of a hold lost without a release.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::{AcquireRequest, Lease, LeaseCore, LossSignal};
use crate::error::{Error, Result};
use crate::fence::FencingToken;

use super::Inner;
use super::builder::connect_client;
use super::keys::Holder;
use super::write::{Head, Written, ttl_secs, write};

/// The key's last write by this hold.
#[derive(Debug)]
struct LastWrite {
    revision: u64,
    /// When the server lets the key go, at the earliest (its TTL counts from the write).
    expires: Instant,
}

#[derive(Debug)]
pub(super) struct NatsLease {
    inner: Arc<Inner>,
    name: String,
    key: String,
    /// The holder every renewal records again (with the fence in it).
    holder: Holder,
    last: Arc<Mutex<LastWrite>>,
    /// Released, or cleaned up after a loss: nothing left to delete.
    done: Arc<AtomicBool>,
    core: LeaseCore,
    /// Ends the task that cleans up on loss (see [`NatsLease::new`]).
    _stop: tokio_util::sync::DropGuard,
}

impl NatsLease {
    pub(super) fn new(
        inner: Arc<Inner>,
        req: &AcquireRequest,
        key: String,
        (fence, revision): (u64, u64),
        start: Instant,
    ) -> NatsLease {
        let last = Arc::new(Mutex::new(LastWrite {
            revision,
            expires: start + Duration::from_secs(ttl_secs(req.ttl)),
        }));
        let done = Arc::new(AtomicBool::new(false));
        let lost = LossSignal::new();
        let stop = CancellationToken::new();
        // The server counts TTLs in whole seconds, so it would keep a 100 ms lock for a second
        // or two. When the hold is lost (the keeper's local deadline, a refused renewal), the
        // holder purges its own key at once, so others get the lock at its TTL and not at the
        // server's; the server's expiry remains the backstop for a holder that cannot.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (inner, key, last, done, lost, stop) = (
                inner.clone(),
                key.clone(),
                last.clone(),
                done.clone(),
                lost.clone(),
                stop.clone(),
            );
            runtime.spawn(async move {
                tokio::select! {
                    () = lost.token().cancelled() => clean_up(&inner, &key, &last, &done).await,
                    () = stop.cancelled() => {}
                }
            });
        }
        NatsLease {
            inner,
            name: req.name.as_str().to_owned(),
            key,
            holder: Holder::of(req, fence),
            last,
            done,
            core: LeaseCore::with_signal(FencingToken::new(fence), lost, start),
            _stop: stop.drop_guard(),
        }
    }

    /// Whether the key's last entry is still this hold's last write.
    async fn check_owned(&self, revision: u64) -> Result<()> {
        match self.inner.entry(self.key.as_str()).await? {
            Some(entry) if entry.revision == revision => Ok(()),
            _ => Err(Error::not_owned(&self.name)),
        }
    }
}

/// Purges the key of a hold lost without a release, if it is still the hold's.
async fn clean_up(inner: &Inner, key: &str, last: &Mutex<LastWrite>, done: &AtomicBool) {
    let last = last.lock().await;
    if done.swap(true, Ordering::SeqCst) {
        return;
    }
    let mut backoff = crate::backend::wait::Backoff::steady(
        Duration::from_millis(20),
        Duration::from_millis(500),
    );
    for _ in 0..10 {
        match inner
            .write(key, Head::Purge, last.revision, Bytes::new())
            .await
        {
            Ok(_) => return,
            Err(error) => tracing::debug!(%error, "purging a lost hold's key failed"),
        }
        tokio::time::sleep(backoff.next()).await;
    }
}

#[async_trait]
impl Lease for NatsLease {
    fn core(&self) -> &LeaseCore {
        &self.core
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        crate::ttl::check_store_ttl(ttl)?;
        let mut last = self.last.lock().await;
        // Lost (and perhaps purged by the clean-up), or released.
        if self.core.signal().reason().is_some() || self.done.load(Ordering::SeqCst) {
            return Err(Error::not_owned(&self.name));
        }
        if ttl.is_zero() {
            return self.check_owned(last.revision).await;
        }
        // Never shorter than the TTL the server already keeps.
        let start = Instant::now();
        let ttl = ttl.max(last.expires.saturating_duration_since(start));
        let head = Head::Put { ttl };
        let record = self.holder.encode(ttl);
        match self
            .inner
            .write(&self.key, head, last.revision, record)
            .await?
        {
            Written::At(revision) => {
                *last = LastWrite {
                    revision,
                    expires: start + Duration::from_secs(ttl_secs(ttl)),
                };
                Ok(())
            }
            Written::Refused => Err(Error::not_owned(&self.name)),
        }
    }

    async fn release(&self) -> Result<()> {
        let last = self.last.lock().await;
        if self.done.load(Ordering::SeqCst) {
            return Err(Error::not_owned(&self.name));
        }
        let purged = self
            .inner
            .write(&self.key, Head::Purge, last.revision, Bytes::new())
            .await?;
        self.done.store(true, Ordering::SeqCst);
        match purged {
            Written::At(marker) => {
                self.inner.remember_marker(&self.key, marker);
                Ok(())
            }
            Written::Refused => Err(Error::not_owned(&self.name)),
        }
    }

    async fn release_elsewhere(&self) -> Result<()> {
        // The client's connection is driven by its runtime, which is shutting down and may
        // never answer: a fresh client on this runtime.
        let config = &self.inner.config;
        let client = connect_client(config).await?;
        let mut js = async_nats::jetstream::new(client);
        js.set_timeout(config.timeout);
        let last = self.last.lock().await;
        if self.done.swap(true, Ordering::SeqCst) {
            return Err(Error::not_owned(&self.name));
        }
        let purged = write(
            &js,
            &config.bucket,
            &self.key,
            Head::Purge,
            last.revision,
            Bytes::new(),
        )
        .await?;
        match purged {
            Written::At(_) => Ok(()),
            Written::Refused => Err(Error::not_owned(&self.name)),
        }
    }
}
