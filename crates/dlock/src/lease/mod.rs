//! What every guard shares: the held lease, its keeper registration, the lost signal, and
//! release on drop.

pub(crate) mod detached;
pub(crate) mod keeper;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::backend::Lease;
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::name::LockName;
use crate::ttl::validate_ttl;

use keeper::Registration;

/// Completes when the lock is lost: its lease expired, a renewal was refused, or the store
/// reported the hold gone. Returned by `MutexGuard::lost`.
///
/// Equivalent to `async fn lost(&self)`; it completes at once if the loss already happened.
#[must_use = "futures do nothing unless polled"]
pub struct Lost<'a> {
    inner: Pin<Box<WaitForCancellationFuture<'a>>>,
}

impl fmt::Debug for Lost<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lost").finish_non_exhaustive()
    }
}

impl<'a> Lost<'a> {
    pub(crate) fn from_token(token: &'a CancellationToken) -> Lost<'a> {
        Lost {
            inner: Box::pin(token.cancelled()),
        }
    }
}

impl Future for Lost<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.inner.as_mut().poll(cx)
    }
}

/// A held lease plus everything needed to keep it and let it go.
#[derive(Debug)]
pub(crate) struct HeldLease {
    name: LockName,
    lease: Arc<dyn Lease>,
    registration: Option<Registration>,
    runtime: Option<tokio::runtime::Handle>,
}

impl HeldLease {
    pub(crate) fn new(name: LockName, lease: Arc<dyn Lease>, registration: Registration) -> Self {
        HeldLease {
            name,
            lease,
            registration: Some(registration),
            runtime: tokio::runtime::Handle::try_current().ok(),
        }
    }

    pub(crate) fn name(&self) -> &LockName {
        &self.name
    }

    pub(crate) fn fence(&self) -> FencingToken {
        self.lease.fence()
    }

    pub(crate) fn lost(&self) -> Lost<'_> {
        Lost::from_token(self.lease.lost())
    }

    pub(crate) fn lost_token(&self) -> CancellationToken {
        self.lease.lost().child_token()
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lease.lost().is_cancelled()
    }

    pub(crate) async fn extend(&self, ttl: Duration) -> Result<()> {
        validate_ttl("ttl", ttl)?;
        if self.is_lost() {
            return Err(Error::not_owned(self.name.as_str()));
        }
        let started = Instant::now();
        match self.lease.extend(ttl).await {
            Ok(()) => {
                if let Some(registration) = &self.registration {
                    registration.extended(started, ttl);
                }
                Ok(())
            }
            Err(error) => {
                if matches!(error, Error::NotOwned { .. }) {
                    self.lease.lost().cancel();
                }
                Err(error)
            }
        }
    }

    pub(crate) async fn is_owned(&self) -> Result<bool> {
        if self.is_lost() {
            return Ok(false);
        }
        // A zero extension never shortens the lease: a pure ownership check.
        match self.lease.extend(Duration::ZERO).await {
            Ok(()) => Ok(true),
            Err(Error::NotOwned { .. }) => {
                self.lease.lost().cancel();
                Ok(false)
            }
            Err(error) => Err(error),
        }
    }

    pub(crate) async fn release(mut self) -> Result<()> {
        // Stop renewing before letting go, so the keeper never extends a released lease.
        self.registration = None;
        let was_lost = self.is_lost();
        let lease = self.lease.clone();
        self.runtime = None; // nothing left for Drop to do
        let result = lease.release().await;
        lease.lost().cancel();
        match result {
            Ok(()) if was_lost => Err(Error::not_owned(self.name.as_str())),
            other => other,
        }
    }
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        self.registration = None;
        let lease = self.lease.clone();
        let name = self.name.clone();
        // Best effort, in the background: Drop must not block the runtime. The store's TTL is the
        // backstop if the runtime is shutting down and the task never runs.
        runtime.spawn(async move {
            if let Err(error) = lease.release().await {
                tracing::debug!(%name, %error, "release on drop failed");
            }
            lease.lost().cancel();
        });
    }
}
