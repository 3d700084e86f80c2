//! The exclusive lock: [`MutexBuilder`] and its [`MutexGuard`] (`guard.rs`). Both take and
//! re-enter holds through the one engine every kind of hold shares (`crate::hold`).

mod guard;

use std::time::Duration;

use crate::backend::LockKind;
use crate::error::{Error, Result};
use crate::hold::acquire;
use crate::hold::options::HoldOptions;
use crate::locks::Locks;
use crate::name::LockName;
use crate::ttl::WaitSpec;

pub use guard::MutexGuard;

/// Options for one exclusive lock; made by [`Locks::mutex`].
///
/// Defaults: no TTL (a watchdog lease of [`Locks::watchdog_lease`], renewed while the guard
/// lives), wait forever for [`acquire`](Self::acquire) and not at all for
/// [`try_acquire`](Self::try_acquire), not reentrant, not fair.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// use std::time::Duration;
/// let locks = dlock::connect("memory://builder-doc").await?;
/// let guard = locks
///     .mutex("orders/42")
///     .ttl(Duration::from_secs(10))
///     .wait(Duration::from_secs(5))
///     .acquire()
///     .await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[must_use = "a lock builder does nothing until `acquire` or `try_acquire` is awaited"]
pub struct MutexBuilder {
    locks: Locks,
    name: String,
    options: HoldOptions,
}

impl MutexBuilder {
    pub(crate) fn new(locks: Locks, name: String) -> MutexBuilder {
        MutexBuilder {
            locks,
            name,
            options: HoldOptions::default(),
        }
    }

    /// A fixed lease: the lock expires `ttl` after it is taken unless
    /// [`MutexGuard::extend`] is called; the watchdog does not renew it, but asks the store
    /// every third of `ttl` whether the lock is still held (without extending it), so
    /// [`MutexGuard::lost`] fires within a third of `ttl` of a break or of a store that lost
    /// its data. Between [`MIN_TTL`](crate::limits::MIN_TTL) and [`MAX_TTL`](crate::limits::MAX_TTL).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.options.ttl = Some(ttl);
        self
    }

    /// Waits at most `wait` for the lock.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.options.wait = Some(WaitSpec::For(wait));
        self
    }

    /// Tries once and does not wait.
    pub fn no_wait(mut self) -> Self {
        self.options.wait = Some(WaitSpec::No);
        self
    }

    /// Waits as long as it takes (the default for `acquire`).
    pub fn wait_forever(mut self) -> Self {
        self.options.wait = Some(WaitSpec::Forever);
        self
    }

    /// Reentrant: the hold can be re-entered through its guard
    /// ([`MutexGuard::reenter`]), which succeeds at once with the same fence and adds one to a
    /// hold count kept in the store; the lock is free when every guard has been released. A
    /// crashed holder's count expires with its lease.
    ///
    /// Re-entry needs the guard as proof of holding: another acquisition through the builder,
    /// even from the same client, is a different holder and waits like any other, so two tasks
    /// can never both hold the lock.
    pub fn reentrant(mut self) -> Self {
        self.options.reentrant = true;
        self
    }

    /// Fair: waiters get the lock in arrival order. Backends without a queue return
    /// [`Error::Unsupported`].
    pub fn fair(mut self) -> Self {
        self.options.fair = true;
        self
    }

    /// With the watchdog: stop renewing `max` after the lock was acquired (not counting the
    /// wait), so a holder that forgot its guard loses the lock at most one watchdog lease later.
    /// Ignored with a fixed [`ttl`](Self::ttl).
    pub fn max_hold(mut self, max: Duration) -> Self {
        self.options.max_hold = Some(max);
        self
    }

    /// One exclusive hold through the engine, its options checked before any store call;
    /// `None` when busy or timed out.
    async fn run(self, default_wait: WaitSpec) -> Result<Option<MutexGuard>> {
        let name = LockName::new(self.name)?;
        let terms = self.options.validate(&self.locks, default_wait)?;
        let request = terms.request(name, LockKind::Exclusive, terms.deadline);
        acquire::take(&self.locks, &terms, request).await
    }

    /// Acquires the lock, waiting as configured (forever by default).
    ///
    /// # Errors
    ///
    /// - [`Error::Timeout`] when the wait runs out (at once with [`no_wait`](Self::no_wait));
    /// - [`Error::InvalidName`] / [`Error::InvalidArgument`] for bad input, before any store call;
    /// - [`Error::Unsupported`] for `fair` or `reentrant` on a store without them;
    /// - store errors ([`Error::Unavailable`], …). When one leaves the outcome unknown (a
    ///   reply lost after the store may have granted), one repeated attempt with the same
    ///   token finds the grant and releases it before the error is returned, so none is left
    ///   held.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future while it waits leaves no lock held; if it is dropped
    /// while the store is granting the lock, the lock is released at once where the backend
    /// can tell, and in any case expires within its TTL.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// use std::time::Duration;
    /// let locks = dlock::connect("memory://acquire-doc").await?;
    /// let held = locks.mutex("a").acquire().await?;
    /// let err = locks.mutex("a").wait(Duration::from_millis(20)).acquire().await.unwrap_err();
    /// assert!(matches!(err, dlock::Error::Timeout { .. }));
    /// # drop(held);
    /// # Ok(()) }
    /// ```
    pub async fn acquire(self) -> Result<MutexGuard> {
        let name = self.name.clone();
        let waited = self.options.waited(WaitSpec::Forever);
        self.run(WaitSpec::Forever)
            .await?
            .ok_or(Error::Timeout { name, waited })
    }

    /// Acquires the lock if it is free (or frees up within the configured wait, which defaults
    /// to none); `Ok(None)` when it is held elsewhere.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire), except that a busy lock is `Ok(None)`, not a timeout.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://try-doc").await?;
    /// let first = locks.mutex("b").try_acquire().await?;
    /// assert!(first.is_some());
    /// assert!(locks.mutex("b").try_acquire().await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire(self) -> Result<Option<MutexGuard>> {
        self.run(WaitSpec::No).await
    }
}
