//! [`Barrier`]: Curator's `DistributedBarrier` as a lock: the barrier stands while the lock
//! `<name>#barrier` is held, and waiting on it is waiting for that lock.

use std::time::Duration;

use super::timed_out;
use crate::error::{Error, Result};
use crate::lease::Lost;
use crate::locks::Locks;
use crate::mutex::{MutexBuilder, MutexGuard};
use crate::name::LockName;

/// A barrier named `name`; made by [`Locks::barrier`]. Cheap to clone; nothing is contacted
/// until a method is awaited.
///
/// [`set`](Self::set) raises it and returns its [`BarrierGuard`]; while the guard stands,
/// [`wait_on`](Self::wait_on) blocks; [`BarrierGuard::remove`] (or dropping the guard, or
/// [`remove`](Self::remove) from any client) lets every waiter through. The barrier is the
/// hold of the lock `<name>#barrier`: a waiter queues for it and lets go of it at once, so
/// waiters are woken by the store's own hand-off, with no polling, on every store (Redlock
/// too).
///
/// **Crashes.** A setter that crashes removes the barrier when its lease ends (the client's
/// watchdog lease, or the fixed [`ttl`](Self::ttl)): waiters go on then, never wedged by a
/// dead setter. A waiter that crashes in the instant it holds the lock delays the next
/// waiters by its lease at most.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// use std::time::Duration;
/// let locks = dlock::connect("memory://barrier-doc").await?;
/// let barrier = locks.barrier("deploy");
/// let raised = barrier.set(Duration::from_secs(1)).await?;
/// let waiter = tokio::spawn({
///     let barrier = barrier.clone();
///     async move { barrier.wait_on(Duration::from_secs(10)).await }
/// });
/// raised.remove().await?;
/// waiter.await.unwrap()?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Barrier {
    locks: Locks,
    name: String,
    ttl: Option<Duration>,
}

/// A raised [`Barrier`], from [`Barrier::set`]: it stands until [`remove`](Self::remove),
/// until this guard is dropped, or until its lease is lost.
#[derive(Debug)]
#[must_use = "if unused, the barrier is removed at once"]
pub struct BarrierGuard {
    held: MutexGuard,
}

impl Barrier {
    pub(crate) fn new(locks: Locks, name: String) -> Barrier {
        Barrier {
            locks,
            name,
            ttl: None,
        }
    }

    /// The barrier's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A barrier set from here stands for a fixed lease of `ttl` (see
    /// [`MutexBuilder::ttl`]) instead of the client's renewed watchdog lease.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    fn lock_name(&self) -> Result<LockName> {
        LockName::new(self.name.as_str())?;
        LockName::new(format!("{}#barrier", self.name))
    }

    fn lock(&self, wait: Duration) -> Result<MutexBuilder> {
        let mut builder = self.locks.mutex(self.lock_name()?.as_str()).wait(wait);
        if self.locks.info().capabilities.fair {
            builder = builder.fair();
        }
        Ok(builder)
    }

    /// Raises the barrier, waiting at most `timeout` while it stands elsewhere (waiters
    /// passing an unraised barrier hold it an instant each).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] (named after the barrier) when it still stands elsewhere at the
    /// deadline; [`Error::InvalidName`] / [`Error::InvalidArgument`] (a bad TTL or timeout)
    /// before any store call; store errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call leaves nothing queued, and a barrier it raised is
    /// removed (as a dropped guard is).
    pub async fn set(&self, timeout: Duration) -> Result<BarrierGuard> {
        let mut lock = self.lock(timeout)?;
        if let Some(ttl) = self.ttl {
            lock = lock.ttl(ttl);
        }
        match lock.acquire().await {
            Ok(held) => Ok(BarrierGuard { held }),
            Err(Error::Timeout { .. }) => Err(timed_out(&self.name, timeout)),
            Err(error) => Err(error),
        }
    }

    /// Waits until the barrier is not standing, at most `timeout`; returns at once when it
    /// was never raised.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] (named after the barrier) when it still stands at the deadline;
    /// [`Error::InvalidName`] / [`Error::InvalidArgument`] before any store call; store
    /// errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped wait leaves nothing queued.
    pub async fn wait_on(&self, timeout: Duration) -> Result<()> {
        // Queued as the setter's successor; a waiter that gets the lock lets it go to the next.
        match self.lock(timeout)?.acquire().await {
            Ok(passed) => passed.release().await.or_else(|error| match error {
                // Lost in the instant it was held: the barrier was down all the same.
                Error::NotOwned { .. } => Ok(()),
                error => Err(error),
            }),
            Err(Error::Timeout { .. }) => Err(timed_out(&self.name, timeout)),
            Err(error) => Err(error),
        }
    }

    /// Removes the barrier whoever raised it (their guard's lost signal fires). Returns
    /// whether it stood.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`]; [`Error::Unsupported`] on a store without inspection (the
    /// file backend, the MySQL/MariaDB session mode): remove it with its [`BarrierGuard`]
    /// there; store errors.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a dropped call may or may not have removed it.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// use std::time::Duration;
    /// let locks = dlock::connect("memory://barrier-remove-doc").await?;
    /// let raised = locks.barrier("maintenance").set(Duration::from_secs(1)).await?;
    /// assert!(locks.barrier("maintenance").remove().await?);
    /// assert!(raised.is_lost());
    /// # Ok(()) }
    /// ```
    pub async fn remove(&self) -> Result<bool> {
        let name = self.lock_name()?;
        self.locks.force_release(name.as_str()).await
    }
}

impl BarrierGuard {
    /// Removes the barrier: every waiter goes on.
    ///
    /// # Errors
    ///
    /// [`Error::NotOwned`] when it was already removed (its lease lost, or
    /// [`Barrier::remove`]); store errors (the lease then removes it).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call removes it as a dropped guard does.
    pub async fn remove(self) -> Result<()> {
        self.held.release().await
    }

    /// Whether the barrier came down without [`remove`](Self::remove): its lease was lost
    /// or another client removed it.
    pub fn is_lost(&self) -> bool {
        self.held.is_lost()
    }

    /// Completes when [`is_lost`](Self::is_lost) becomes true.
    pub fn lost(&self) -> Lost<'_> {
        self.held.lost()
    }

    /// The hold behind the barrier, for the blocking facade's guard.
    #[cfg(feature = "blocking")]
    pub(crate) fn into_hold(self) -> MutexGuard {
        self.held
    }
}
