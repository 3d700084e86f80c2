//! [`VersionedValue`]: small named values changed only by atomic compare-and-set, for
//! optimistic concurrency without a lock.

use std::time::Duration;

use rand::Rng;

use crate::backend::{Expect, ValueStore, Versioned};
use crate::error::{Error, Result};
use crate::hold::Hold;
use crate::locks::Locks;
use crate::name::LockName;

/// The largest value accepted, in bytes (ZooKeeper's and etcd's request limits are about 1 MiB).
pub const MAX_VALUE_LEN: usize = 256 * 1024;

/// How many times [`VersionedValue::update`] tries when no limit is given. Generous on
/// purpose: a writer that lost backs off while a writer that just won starts its next update
/// at once, so under steady contention one writer can lose many times in a row (with 16, eight
/// busy writers gave up about once in 300 runs of 400 updates on a loaded machine). The pause
/// stops growing at 64 round trips, so giving up takes at most a few thousand round trips.
pub const DEFAULT_UPDATE_ATTEMPTS: u32 = 64;

/// A named value with a version; made by [`Locks::value`].
///
/// Every write goes through [`compare_and_set`](Self::compare_and_set): the store writes only
/// if the version is still the one the caller read, in one atomic step (a Lua script, a
/// conditional `UPDATE`, an etcd transaction, a ZooKeeper versioned `setData`). A read,
/// a comparison in the client and an unconditional write, as in the article this project grew
/// from, can lose updates; this cannot. Values live in their own namespace, beside the locks,
/// and have no TTL: they stay until removed by hand (versions must never go back).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::connect("memory://value-doc").await?;
/// let stock = locks.value("stock/sku-1");
/// let v1 = stock.compare_and_set(None, b"100").await?.expect("first write");
/// assert!(stock.compare_and_set(None, b"999").await?.is_none()); // stale: someone wrote
/// let after = stock
///     .update(|current| {
///         let n: u32 = std::str::from_utf8(current?).ok()?.parse().ok()?;
///         Some((n - 1).to_string().into_bytes())
///     })
///     .await?
///     .expect("written");
/// assert_eq!(after.value, b"99");
/// assert!(after.version > v1);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct VersionedValue {
    locks: Locks,
    name: String,
    max_attempts: u32,
}

impl VersionedValue {
    pub(crate) fn new(locks: Locks, name: String) -> VersionedValue {
        VersionedValue {
            locks,
            name,
            max_attempts: DEFAULT_UPDATE_ATTEMPTS,
        }
    }

    /// How many times [`update`](Self::update) reads and tries to write before it gives up with
    /// [`Error::Conflict`] (default [`DEFAULT_UPDATE_ATTEMPTS`], 64; at least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    fn store(&self) -> Result<(&dyn ValueStore, LockName)> {
        let name = LockName::new(self.name.clone())?;
        let store = self.locks.backend().values().ok_or(Error::Unsupported {
            operation: "versioned values",
            backend: self.locks.info().name,
        })?;
        Ok((store, name))
    }

    /// The current value and its version; `None` if it was never written.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`]; [`Error::Unsupported`] on a store without values; store errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn get(&self) -> Result<Option<Versioned>> {
        let (store, name) = self.store()?;
        store.get(&name).await
    }

    /// Writes `value` only if the current version is `expected` (`None`: only if the value was
    /// never written). Returns the new version, or `None` if the version had moved on, in which
    /// case nothing was written.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`]; [`Error::InvalidArgument`] for a value over [`MAX_VALUE_LEN`];
    /// [`Error::Unsupported`] on a store without values; store errors.
    ///
    /// # Cancel safety
    ///
    /// A dropped call may or may not have written; read again to find out.
    pub async fn compare_and_set(
        &self,
        expected: Option<u64>,
        value: impl AsRef<[u8]>,
    ) -> Result<Option<u64>> {
        let value = value.as_ref();
        check_len(value)?;
        let (store, name) = self.store()?;
        store.put(&name, Expect::from_read(expected), value).await
    }

    /// Writes `value` whatever the current version (a blind write, for initialising or
    /// resetting), and returns the new version. Read-modify-write cycles must use
    /// [`compare_and_set`](Self::compare_and_set) or [`update`](Self::update) instead.
    ///
    /// # Errors
    ///
    /// As [`compare_and_set`](Self::compare_and_set).
    ///
    /// # Cancel safety
    ///
    /// A dropped call may or may not have written.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://set-doc").await?;
    /// let v1 = locks.value("config").set(b"on").await?;
    /// let v2 = locks.value("config").set(b"off").await?;
    /// assert!(v2 > v1);
    /// # Ok(()) }
    /// ```
    pub async fn set(&self, value: impl AsRef<[u8]>) -> Result<u64> {
        let value = value.as_ref();
        check_len(value)?;
        let (store, name) = self.store()?;
        store
            .put(&name, Expect::Any, value)
            .await?
            .ok_or_else(|| Error::Backend {
                backend: self.locks.info().name,
                source: "an unconditional write was refused".into(),
            })
    }

    /// Writes `value` only while `hold` is still the current holder of its lock, the store
    /// checking the hold and writing in one atomic step (a Lua script, one transaction, an
    /// etcd `If`, a ZooKeeper `multi`; each backend's `docs.md` names its form). Returns the
    /// new version.
    ///
    /// This is what keeps data beside a lock safe from a holder that was paused past its
    /// lease (a GC pause, `SIGSTOP`, a slow disk): once another holder has taken the lock, or
    /// the lease ran out or was broken, the paused holder's write is refused, whatever its
    /// own clock or lost signal says. The store decides, not the local lost signal. The write
    /// is made in the store that holds `hold` (a guard from another client of the same store
    /// is fine). `hold` is a [`MutexGuard`](crate::MutexGuard) or a
    /// [`Leadership`](crate::Leadership) (whose term is its fence).
    ///
    /// # Errors
    ///
    /// - [`Error::Lost`] when the store found `hold` no longer current (released, expired,
    ///   taken by another, broken): nothing was written, and the hold's lost signal fires
    ///   (`reason` is the one it fired with, [`LostReason::StoreSignal`](crate::LostReason)
    ///   when the store told first);
    /// - [`Error::InvalidName`]; [`Error::InvalidArgument`] for a value over
    ///   [`MAX_VALUE_LEN`] or a hold of another backend, before any store call;
    /// - [`Error::Unsupported`] for a shared or composed hold (a permit, a read or write
    ///   guard, a multi-lock), or on a store without fenced writes (Redlock); a Redis
    ///   Cluster refuses a value whose key is in another slot than the lock's (give the
    ///   value its lock's hash tag: `{=orders/42}state` beside the lock `orders/42`);
    /// - store errors.
    ///
    /// # Cancel safety
    ///
    /// A dropped call may or may not have written; read again to find out.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://fenced-doc").await?;
    /// let guard = locks.mutex("orders/42").acquire().await?;
    /// let state = locks.value("orders/42/state");
    /// let version = state.set_fenced(&guard, b"shipped").await?;
    /// assert_eq!(state.get().await?.unwrap().version, version);
    ///
    /// // Broken by an operator: the old holder's write is refused, nothing written.
    /// locks.force_release("orders/42").await?;
    /// let refused = state.set_fenced(&guard, b"paid").await;
    /// assert!(matches!(refused, Err(dlock::Error::Lost { .. })));
    /// assert_eq!(state.get().await?.unwrap().value, b"shipped");
    /// # Ok(()) }
    /// ```
    pub async fn set_fenced(
        &self,
        hold: &(impl Hold + ?Sized),
        value: impl AsRef<[u8]>,
    ) -> Result<u64> {
        let value = value.as_ref();
        check_len(value)?;
        let (_, name) = self.store()?;
        let backend = self.locks.info().name;
        let held = hold
            .fencing()
            .ok_or(Error::Unsupported {
                operation: "fenced writes with a shared or composed hold",
                backend,
            })?
            .0;
        if held.backend() != backend {
            return Err(Error::invalid_argument(
                "hold",
                format!("a {} hold cannot fence a {backend} value", held.backend()),
            ));
        }
        match held.put_fenced(&name, value).await {
            Err(Error::Unsupported { operation, .. }) => {
                Err(Error::Unsupported { operation, backend })
            }
            other => other,
        }
    }

    /// Reads, computes the new value with `change` and writes it with compare-and-set, again
    /// from the read while another writer got in between, at most
    /// [`max_attempts`](Self::max_attempts) times. `change` gets `None` when the value was never
    /// written, and may be called more than once; it returns `None` to leave the value as it
    /// is (stock already at zero, nothing to do), and `update` then returns `Ok(None)` without
    /// writing. `Ok(Some(_))` is the value written and its new version.
    ///
    /// A writer that lost waits before it reads again, a random time in a window counted in
    /// its own measured read-and-write cycle that doubles with each loss (up to 64 cycles):
    /// colliding writers spread out at the pace of the store they use, a few microseconds on an
    /// embedded store, a network round trip on a server.
    ///
    /// # Errors
    ///
    /// [`Error::Conflict`] when every attempt lost to another writer; as
    /// [`compare_and_set`](Self::compare_and_set) otherwise.
    ///
    /// # Cancel safety
    ///
    /// As [`compare_and_set`](Self::compare_and_set).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://update-doc").await?;
    /// let stock = locks.value("stock/sku-2");
    /// stock.set(b"1").await?;
    /// let take_one = |current: Option<&[u8]>| {
    ///     let n: u32 = std::str::from_utf8(current?).ok()?.parse().ok()?;
    ///     // Sold out: write nothing.
    ///     (n > 0).then(|| (n - 1).to_string().into_bytes())
    /// };
    /// assert_eq!(stock.update(take_one).await?.unwrap().value, b"0");
    /// assert!(stock.update(take_one).await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn update(
        &self,
        mut change: impl FnMut(Option<&[u8]>) -> Option<Vec<u8>>,
    ) -> Result<Option<Versioned>> {
        if self.max_attempts == 0 {
            return Err(Error::invalid_argument(
                "max_attempts",
                "must be at least 1",
            ));
        }
        let (store, name) = self.store()?;
        for attempt in 1..=self.max_attempts {
            let started = tokio::time::Instant::now();
            let current = store.get(&name).await?;
            let Some(value) = change(current.as_ref().map(|c| c.value.as_slice())) else {
                return Ok(None);
            };
            check_len(&value)?;
            let expected = current.map(|c| c.version);
            if let Some(version) = store
                .put(&name, Expect::from_read(expected), &value)
                .await?
            {
                return Ok(Some(Versioned::new(value, version)));
            }
            if attempt < self.max_attempts {
                tokio::time::sleep(retry_pause(started.elapsed(), attempt)).await;
            }
        }
        Err(Error::Conflict {
            name: self.name.clone(),
            attempts: self.max_attempts,
        })
    }
}

/// The pause after the `attempt`-th lost write: full jitter over `cycle` (the losing read and
/// write, so the store's own round trip) × 2^(attempt − 1), at most 64 cycles. A fixed
/// microsecond window is shorter than one network round trip, so colliding writers on a
/// server would collide again and again.
pub(crate) fn retry_pause(cycle: Duration, attempt: u32) -> Duration {
    let window = cycle
        .max(Duration::from_micros(50))
        .saturating_mul(1 << attempt.saturating_sub(1).min(6));
    let nanos = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rand::rng().random_range(0..=nanos))
}

fn check_len(value: &[u8]) -> Result<()> {
    if value.len() > MAX_VALUE_LEN {
        return Err(Error::invalid_argument(
            "value",
            format!("{} bytes; at most {MAX_VALUE_LEN}", value.len()),
        ));
    }
    Ok(())
}
