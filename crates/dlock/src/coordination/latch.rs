//! [`CountDownLatch`]: Redisson's `RCountDownLatch` on every store with versioned values.

use std::time::Duration;

use super::counter::Counter;
use super::{DEFAULT_POLL_INTERVAL, check_poll, deadline, gate, timed_out};
use crate::error::{Error, Result};
use crate::locks::Locks;
use crate::name::LockName;

/// The suffix of the value that keeps a latch's count and of the lock its waiters queue on.
const SUFFIX: &str = "#latch";

/// A count-down latch named `name`; made by [`Locks::latch`]. Cheap to clone; nothing is
/// contacted until a method is awaited.
///
/// [`try_set_count`](Self::try_set_count) closes an open latch with a count,
/// [`count_down`](Self::count_down) (from any client) lowers it, and [`wait`](Self::wait)
/// returns once it reaches zero. The count is a [`Counter`] named `<name>#latch`, so no
/// update is lost between clients, and an open latch can be set again (unlike Java's, like
/// Redisson's).
///
/// **Waiting** is not a poll per waiter: waiters queue on the lock `<name>#latch`, and only
/// its holder reads the count, every [`poll_interval`](Self::poll_interval) (50 ms by
/// default; no store notifies a change of a value on every store). When it sees zero it
/// releases the lock, and the store's wake-up hands it to the next waiter, which reads once
/// and passes it on: a latch opens every waiter within one interval plus one hand-off each.
///
/// **Crashes.** The count lives in the store, not in any client: a client that crashes
/// before its [`count_down`](Self::count_down) leaves the latch closed (waiters end with
/// [`Error::Timeout`] at their deadline, as in Java and Redisson; a latch cannot tell a slow
/// worker from a dead one). A waiter that crashes while holding the waiters' lock loses it
/// with its lease and the next waiter reads in its place.
///
/// Needs versioned values: every store but Redlock, where each method returns
/// [`Error::Unsupported`].
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// use std::time::Duration;
/// let locks = dlock::connect("memory://latch-doc").await?;
/// let ready = locks.latch("shards-loaded");
/// assert!(ready.try_set_count(2).await?);
/// let waiter = tokio::spawn({
///     let ready = ready.clone();
///     async move { ready.wait(Duration::from_secs(10)).await }
/// });
/// assert_eq!(ready.count_down().await?, 1);
/// assert_eq!(ready.count_down().await?, 0);
/// waiter.await.unwrap()?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct CountDownLatch {
    locks: Locks,
    name: String,
    poll: Duration,
}

impl CountDownLatch {
    pub(crate) fn new(locks: Locks, name: String) -> CountDownLatch {
        CountDownLatch {
            locks,
            name,
            poll: DEFAULT_POLL_INTERVAL,
        }
    }

    /// The latch's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How often the waiter holding the waiters' lock reads the count (default 50 ms; more
    /// than zero). The other waiters do not read until it hands them the lock.
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll = every;
        self
    }

    /// The name of the count's value and of the waiters' lock, checked.
    fn key(&self) -> Result<LockName> {
        LockName::new(self.name.as_str())?;
        LockName::new(format!("{}{SUFFIX}", self.name))
    }

    fn counter(&self) -> Result<Counter> {
        let key = self.key()?;
        super::values(
            &self.locks,
            "count-down latches (they need versioned values)",
        )?;
        Ok(Counter::new(self.locks.clone(), key.as_str().to_owned()))
    }

    /// Closes the latch with `count`, only if it is open (count zero, or never set). Returns
    /// whether it was set.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a count of 0 (a latch of zero is open) or above
    /// `i64::MAX`; [`Error::InvalidName`]; [`Error::Unsupported`] on a store without
    /// values; [`Error::WrongType`] when the latch's value is not a count (or is negative);
    /// store errors.
    ///
    /// # Cancel safety
    ///
    /// A dropped call may or may not have set the count; read [`count`](Self::count).
    pub async fn try_set_count(&self, count: u64) -> Result<bool> {
        let count = i64::try_from(count)
            .ok()
            .filter(|count| *count > 0)
            .ok_or_else(|| {
                Error::invalid_argument("latch count", format!("{count}; must be 1..={}", i64::MAX))
            })?;
        let counter = self.counter()?;
        let (before, _) = counter
            .change(|current| match current {
                0 => Ok(Some(count)),
                n if n > 0 => Ok(None),
                _ => Err(self.negative()),
            })
            .await?;
        Ok(before == 0)
    }

    /// Lowers the count by one and returns what is left; an open latch stays at zero. The
    /// count-down that reaches zero opens the latch for every waiter, in every client.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`]; [`Error::Unsupported`] on a store without values;
    /// [`Error::WrongType`] when the latch's value is not a count (or is negative);
    /// [`Error::Conflict`] when every attempt lost to another writer; store errors.
    ///
    /// # Cancel safety
    ///
    /// A dropped call may or may not have counted down; read [`count`](Self::count).
    pub async fn count_down(&self) -> Result<u64> {
        let counter = self.counter()?;
        let (_, left) = counter
            .change(|current| match current {
                0 => Ok(None),
                n if n > 0 => Ok(Some(n - 1)),
                _ => Err(self.negative()),
            })
            .await?;
        u64::try_from(left).map_err(|_| self.negative())
    }

    /// The count now; 0 when the latch is open or was never set.
    ///
    /// # Errors
    ///
    /// As [`count_down`](Self::count_down).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn count(&self) -> Result<u64> {
        let count = self.counter()?.get().await?;
        u64::try_from(count).map_err(|_| self.negative())
    }

    /// Waits until the count is zero, at most `timeout`; returns at once if it is.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] (named after the latch) when the latch is still closed at the
    /// deadline; [`Error::InvalidArgument`] for a zero poll interval or a timeout that
    /// overflows the clock; as [`count`](Self::count) otherwise.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped wait leaves nothing queued (a waiters' lock it held is
    /// released as any dropped guard is).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// use std::time::Duration;
    /// let locks = dlock::connect("memory://latch-wait-doc").await?;
    /// let latch = locks.latch("never-opened");
    /// latch.try_set_count(1).await?;
    /// let waited = latch.wait(Duration::from_millis(20)).await;
    /// assert!(matches!(waited, Err(dlock::Error::Timeout { .. })));
    /// # Ok(()) }
    /// ```
    pub async fn wait(&self, timeout: Duration) -> Result<()> {
        let poll = check_poll(self.poll)?;
        let until = deadline(timeout)?;
        let key = self.key()?;
        self.counter()?;
        let open = || async { Ok(self.count().await? == 0) };
        if gate::wait_at_gate(&self.locks, key.as_str(), until, poll, open).await? {
            Ok(())
        } else {
            Err(timed_out(&self.name, timeout))
        }
    }

    fn negative(&self) -> Error {
        Error::WrongType {
            backend: self.locks.info().name,
            key: format!("{}{SUFFIX}", self.name),
            detail: "a negative latch count".to_owned(),
        }
    }
}
