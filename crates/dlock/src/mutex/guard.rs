//! [`MutexGuard`]: one held exclusive lock, and the lease every other guard is made of.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backend::{AcquireRequest, Lease, Wait};
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::hold::acquire;
use crate::hold::options::Terms;
use crate::lease::keeper::KeepPolicy;
use crate::lease::{HeldLease, Lost};
use crate::locks::Locks;
use crate::name::LockName;

/// A held exclusive lock.
///
/// It carries the hold's [fencing token](Self::fence) and [lost signal](Self::lost). Release it
/// with [`release`](Self::release) to see errors; dropping it releases in the background on the
/// runtime it was acquired on (best effort: if that runtime is gone, the lease's TTL frees the
/// lock). Owned, `Send` and `'static`: move it into tasks freely.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::connect("memory://guard-doc").await?;
/// let guard = locks.mutex("orders/7").acquire().await?;
/// tokio::select! {
///     () = guard.lost() => { /* the lease is gone: stop touching the resource */ }
///     () = async { /* work, passing guard.fence() to every write */ } => {}
/// }
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[clippy::has_significant_drop]
#[must_use = "if unused the lock will immediately be released"]
pub struct MutexGuard {
    held: HeldLease,
    /// The backend's scheme name, for spans.
    backend: &'static str,
    /// Set for a reentrant hold: what [`MutexGuard::reenter`] asks the store again.
    reentry: Option<Arc<Reentry>>,
}

/// The request that re-enters a reentrant hold: the same token, no wait.
#[derive(Debug)]
struct Reentry {
    locks: Locks,
    request: AcquireRequest,
    policy: KeepPolicy,
}

impl MutexGuard {
    /// Wraps a lease the store granted for `request`: the keeper starts looking after it at
    /// once. With [`Terms::reentrant`], a first grant can be re-entered through the guard.
    pub(crate) fn granted(
        locks: &Locks,
        terms: &Terms,
        request: AcquireRequest,
        lease: Arc<dyn Lease>,
    ) -> MutexGuard {
        let reentry = (terms.reentrant && !request.reentrant).then(|| {
            let mut again = request.clone();
            again.wait = Wait::No;
            again.reentrant = true;
            Arc::new(Reentry {
                locks: locks.clone(),
                request: again,
                policy: terms.kept_policy(),
            })
        });
        let mut guard = MutexGuard::new(locks, request.name, terms.kept_policy(), lease);
        guard.reentry = reentry;
        guard
    }

    fn new(locks: &Locks, name: LockName, policy: KeepPolicy, lease: Arc<dyn Lease>) -> Self {
        let label = crate::lease::keeper::LeaseLabel {
            name: name.as_str().into(),
            backend: locks.info().name,
        };
        let registration =
            locks
                .keeper()
                .register(lease.clone(), label, policy, lease.lease_start());
        tracing::debug!(%name, fence = %lease.fence(), "acquired");
        MutexGuard {
            held: HeldLease::new(name, lease, registration, locks.info().name),
            backend: locks.info().name,
            reentry: None,
        }
    }

    /// The hold a fenced write is checked against.
    pub(crate) fn held(&self) -> &HeldLease {
        &self.held
    }

    /// How long ago the lease was granted (from just before the winning request was sent).
    pub(crate) fn held_for(&self) -> std::time::Duration {
        self.held.held_for()
    }

    /// The keeper stops renewing this hold: it runs out at its deadline unless extended.
    pub(crate) fn stop_renewing(&self) {
        self.held.stop_renewing();
    }

    /// Re-enters this reentrant hold: a new guard for the same lock with the same fence, and
    /// one more count in the store's hold count. The lock is free once every guard of the hold
    /// has been released.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`] when the lock was not acquired with
    ///   [`reentrant`](crate::MutexBuilder::reentrant);
    /// - [`Error::NotOwned`] when the hold is lost (expired, broken, taken over);
    /// - store errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the store call runs on a task of its own, and a re-entry whose caller was
    /// dropped is released as soon as the store answers, so the hold count never stays raised.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://reenter-doc").await?;
    /// let outer = locks.mutex("ledger").reentrant().acquire().await?;
    /// let inner = outer.reenter().await?;
    /// assert_eq!(inner.fence(), outer.fence());
    /// // Another acquisition is another holder, even from this client.
    /// assert!(locks.mutex("ledger").reentrant().try_acquire().await?.is_none());
    /// inner.release().await?;
    /// outer.release().await?;
    /// assert!(locks.inspect("ledger").await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn reenter(&self) -> Result<MutexGuard> {
        let Some(reentry) = self.reentry.clone() else {
            return Err(Error::invalid_argument(
                "reenter",
                "the lock was not acquired with .reentrant()",
            ));
        };
        if self.is_lost() {
            return Err(Error::not_owned(self.name().as_str()));
        }
        // Through the engine like every hold: observed, and on a task of its own.
        let granted = acquire::one(&reentry.locks, &reentry.request).await?;
        let Some(lease) = granted else {
            return Err(Error::not_owned(self.name().as_str()));
        };
        let mut guard = MutexGuard::new(
            &reentry.locks,
            reentry.request.name.clone(),
            reentry.policy,
            lease,
        );
        guard.reentry = Some(reentry);
        Ok(guard)
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        self.held.name()
    }

    /// This hold's fencing token: strictly greater than every earlier holder's.
    pub fn fence(&self) -> FencingToken {
        self.held.fence()
    }

    /// Completes when the lock is lost (lease expired, renewal refused, lock broken, store
    /// session gone), or at once if it already was. It also completes after release.
    pub fn lost(&self) -> Lost<'_> {
        self.held.lost()
    }

    /// An owned token cancelled when the lock is lost, for tasks that outlive a borrow of the
    /// guard. Cancelling it yourself does not affect the lock.
    pub fn lost_token(&self) -> CancellationToken {
        self.held.lost_token()
    }

    /// Whether the lock is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.held.is_lost()
    }

    /// Why the lock was lost, once it is; `None` while it is held. See [`LostReason`](crate::LostReason).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// use std::time::Duration;
    /// let locks = dlock::connect("memory://lost-reason-guard-doc").await?;
    /// let guard = locks.mutex("report").ttl(Duration::from_millis(100)).acquire().await?;
    /// guard.lost().await; // a fixed TTL, not renewed
    /// assert_eq!(guard.lost_reason(), Some(dlock::LostReason::Expired));
    ///
    /// let broken = locks.mutex("import").acquire().await?;
    /// assert_eq!(broken.lost_reason(), None);
    /// locks.force_release("import").await?; // the in-process store announces breaks
    /// assert_eq!(broken.lost_reason(), Some(dlock::LostReason::Broken));
    /// # Ok(()) }
    /// ```
    pub fn lost_reason(&self) -> Option<crate::LostReason> {
        self.held.lost_reason()
    }

    /// Makes the lease last at least `ttl` from now, if the lock is still ours (it never
    /// shortens a lease).
    ///
    /// # Errors
    ///
    /// [`Error::NotOwned`] when the lock was lost (the lost signal then fires);
    /// [`Error::InvalidArgument`] for a TTL out of range; store errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if dropped, the lease is either extended or not, and the keeper's deadline
    /// stays the conservative one.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// use std::time::Duration;
    /// let locks = dlock::connect("memory://extend-doc").await?;
    /// let guard = locks.mutex("c").ttl(Duration::from_secs(1)).acquire().await?;
    /// guard.extend(Duration::from_secs(60)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        let span = self.span("dlock.extend");
        let result = self.held.extend(ttl).instrument(span.clone()).await;
        span.record("outcome", outcome_of(&result));
        result
    }

    /// A span for a call on this hold, its outcome recorded when the call ends.
    fn span(&self, name: &'static str) -> tracing::Span {
        let backend = self.backend;
        match name {
            "dlock.extend" => tracing::info_span!(
                "dlock.extend",
                lock = %self.name(),
                backend,
                fence = self.fence().get(),
                outcome = tracing::field::Empty,
            ),
            _ => tracing::info_span!(
                "dlock.release",
                lock = %self.name(),
                backend,
                fence = self.fence().get(),
                outcome = tracing::field::Empty,
            ),
        }
    }

    /// Asks the store whether this hold is still the lock's (redis-py's `owned()`); it changes
    /// nothing. `false` also fires the lost signal. For a local answer with no round trip, use
    /// [`is_lost`](Self::is_lost).
    ///
    /// # Errors
    ///
    /// Store errors (the answer is then unknown).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://owned-doc").await?;
    /// let guard = locks.mutex("e").acquire().await?;
    /// assert!(guard.is_owned().await?);
    /// locks.force_release("e").await?;
    /// assert!(!guard.is_owned().await?);
    /// assert!(guard.is_lost());
    /// # Ok(()) }
    /// ```
    pub async fn is_owned(&self) -> Result<bool> {
        self.held.is_owned().await
    }

    /// Releases the lock (one hold count for a reentrant lock).
    ///
    /// # Errors
    ///
    /// [`Error::NotOwned`] when the lock had already been lost (expired, broken, taken over):
    /// whatever was done under it since may have overlapped another holder. Store errors
    /// otherwise; the lease then expires within its TTL.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe in the sense that a dropped release may or may not have reached the
    /// store; the lock is then freed by its TTL at the latest.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://release-doc").await?;
    /// locks.mutex("d").acquire().await?.release().await?;
    /// assert!(locks.inspect("d").await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn release(self) -> Result<()> {
        let span = self.span("dlock.release");
        let result = self.held.release().instrument(span.clone()).await;
        span.record("outcome", outcome_of(&result));
        result
    }
}

/// The `outcome` field of an extend or release span.
fn outcome_of(result: &Result<()>) -> &'static str {
    match result {
        Ok(()) => "ok",
        Err(Error::NotOwned { .. }) => "not_owned",
        Err(_) => "error",
    }
}
