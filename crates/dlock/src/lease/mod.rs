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
use crate::backend::wait::Backoff;
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
    /// The backend's scheme name: a fenced write checks the value's store is the hold's.
    backend: &'static str,
}

impl HeldLease {
    pub(crate) fn new(
        name: LockName,
        lease: Arc<dyn Lease>,
        registration: Registration,
        backend: &'static str,
    ) -> Self {
        HeldLease {
            name,
            lease,
            registration: Some(registration),
            runtime: tokio::runtime::Handle::try_current().ok(),
            backend,
        }
    }

    pub(crate) fn backend(&self) -> &'static str {
        self.backend
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

    pub(crate) fn held_for(&self) -> Duration {
        self.lease.lease_start().elapsed()
    }

    pub(crate) fn stop_renewing(&self) {
        if let Some(registration) = &self.registration {
            registration.stop_renewing();
        }
    }

    /// Why the hold was lost: the first reason its loss signal was fired with (by the keeper
    /// giving the lease up, or by the store); `None` while it is held.
    pub(crate) fn lost_reason(&self) -> Option<keeper::LostReason> {
        self.is_lost().then(|| {
            self.lease
                .core()
                .signal()
                .reason()
                .unwrap_or(keeper::LostReason::StoreSignal)
        })
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

    /// Writes the value `value` only while this hold is its lock's current holder, the store
    /// deciding both in one step; a refusal is a loss, signalled as an ownership check's is.
    pub(crate) async fn put_fenced(&self, value: &LockName, bytes: &[u8]) -> Result<u64> {
        // The store decides, not the local signal: the keeper may give a lease up before the
        // store ends it, and the store's check is the one a paused holder cannot fool.
        match self.lease.put_fenced(value, bytes).await? {
            Some(version) => Ok(version),
            None => {
                self.lease.lost().cancel();
                Err(Error::Lost {
                    reason: self
                        .lost_reason()
                        .unwrap_or(keeper::LostReason::StoreSignal),
                })
            }
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
        let release = DropRelease::new(self.lease.clone(), self.name.clone());
        // In the background: Drop must not block an async worker. If the runtime is shutting
        // down (`#[tokio::main]` returning, a runtime dropped), tokio drops the task instead of
        // running it, and `DropRelease`'s own Drop releases synchronously.
        runtime.spawn(release.run());
    }
}

/// The release of a dropped guard. Run as a task in the normal case; dropped unfinished when
/// its runtime shuts down, in which case it releases synchronously before the runtime (and
/// usually the process) is gone, so the next run of a program does not wait out the lease.
pub(crate) struct DropRelease {
    lease: Arc<dyn Lease>,
    name: LockName,
    done: bool,
}

impl DropRelease {
    pub(crate) fn new(lease: Arc<dyn Lease>, name: LockName) -> DropRelease {
        DropRelease {
            lease,
            name,
            done: false,
        }
    }

    pub(crate) async fn run(mut self) {
        let mut result = self.lease.release().await;
        // The store said "try again", or the connection failed: again on fresh connections,
        // for a bounded time, here in the task. A store that stays away leaves the lock to
        // its lease; blocking a runtime thread for it would stall every other task there. If
        // the runtime shuts down meanwhile, the task is dropped unfinished and `Drop`
        // releases synchronously.
        let give_up = tokio::time::Instant::now() + SHUTDOWN_RELEASE_BOUND;
        let mut backoff = Backoff::steady(Duration::from_millis(20), Duration::from_millis(500));
        while matches!(&result, Err(error) if error.is_retryable())
            && tokio::time::Instant::now() < give_up
        {
            // A fresh connection to a store that does not answer may wait for longer than
            // the bound: the bound ends the attempt too.
            match tokio::time::timeout_at(give_up, self.lease.release_elsewhere()).await {
                Ok(next) => result = next,
                Err(_) => break,
            }
            if matches!(&result, Err(error) if error.is_retryable()) {
                tokio::time::sleep(backoff.next()).await;
            }
        }
        if let Err(error) = result {
            tracing::debug!(name = %self.name, %error, "release on drop failed; the lease frees the lock");
        }
        self.lease.lost().cancel();
        self.done = true;
    }
}

impl Drop for DropRelease {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        release_blocking(&self.lease, &self.name);
    }
}

/// How long the releases at one shutdown may hold up the thread dropping the runtime, all
/// together; a store that does not answer by then is left to the leases.
pub(crate) const SHUTDOWN_RELEASE_BOUND: Duration = Duration::from_secs(3);

/// When the current burst of synchronous releases began, and when its last one did: the
/// releases of one shutdown (many guards dropped at once) share one
/// [`SHUTDOWN_RELEASE_BOUND`], so a thousand guards on an unreachable store cost seconds, not
/// hours.
static SHUTDOWN_BURST: std::sync::Mutex<Option<(std::time::Instant, std::time::Instant)>> =
    std::sync::Mutex::new(None);

/// What is left of the current burst's bound (a call more than the bound after the previous
/// one starts a new burst).
fn shutdown_budget() -> Duration {
    let now = std::time::Instant::now();
    let mut burst = SHUTDOWN_BURST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let start = match *burst {
        Some((start, last)) if now.duration_since(last) < SHUTDOWN_RELEASE_BOUND => start,
        _ => now,
    };
    *burst = Some((start, now));
    (start + SHUTDOWN_RELEASE_BOUND).saturating_duration_since(now)
}

/// Releases `lease` on a short-lived current-thread runtime in a thread of its own: the caller
/// may be inside a runtime (a task being dropped at shutdown), where `block_on` is not allowed.
/// Store errors that say "try again" are retried within [`SHUTDOWN_RELEASE_BOUND`]: a
/// connection whose driver task died with the old runtime reconnects on the new one.
pub(crate) fn release_blocking(lease: &Arc<dyn Lease>, name: &LockName) {
    let budget = shutdown_budget();
    if budget.is_zero() {
        tracing::debug!(%name, "no time left to release at shutdown; the lease frees it");
        lease.lost().cancel();
        return;
    }
    let release = async {
        loop {
            match lease.release_elsewhere().await {
                Ok(()) => return Ok(()),
                Err(error) if error.is_retryable() => {
                    tracing::debug!(%name, %error, "release at shutdown failed, retrying");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(error) => return Err(error),
            }
        }
    };
    let outcome = std::thread::scope(|scope| {
        let worker = std::thread::Builder::new()
            .name("dlock-release".into())
            .spawn_scoped(scope, || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                match runtime.block_on(async { tokio::time::timeout(budget, release).await }) {
                    Ok(result) => result.map_err(|e| e.to_string()),
                    Err(_) => Err(format!("no answer within {budget:?}; the lease frees it")),
                }
            })
            .map_err(|e| e.to_string())?;
        worker
            .join()
            .unwrap_or_else(|_| Err("the release thread panicked".into()))
    });
    if let Err(error) = outcome {
        tracing::debug!(%name, %error, "release at shutdown failed");
    }
    // The burst lasts while releases follow one another: one that waited out the bound ends
    // where the next begins, which must not start a burst (and a full bound) of its own.
    end_of_shutdown_release();
    lease.lost().cancel();
}

/// Marks now as the last moment of the current burst of synchronous releases.
fn end_of_shutdown_release() {
    let mut burst = SHUTDOWN_BURST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, last)) = burst.as_mut() {
        *last = std::time::Instant::now();
    }
}
