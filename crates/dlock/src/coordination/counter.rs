//! [`Counter`]: a signed 64-bit atomic counter kept as a versioned value (Redisson's
//! `RAtomicLong`, Curator's `SharedCount`), changed only by compare-and-set.

use crate::backend::{Expect, ValueStore};
use crate::error::{Error, Result};
use crate::locks::Locks;
use crate::name::LockName;
use crate::value::DEFAULT_UPDATE_ATTEMPTS;

/// An atomic counter named `name`; made by [`Locks::counter`]. Cheap to clone; nothing is
/// contacted until a method is awaited.
///
/// The count is the versioned value of the same name, in decimal ASCII (so
/// [`Locks::value`] reads it too), and every change is a compare-and-set on the version
/// just read: two clients adding at once never lose an update, one of them reads again and
/// retries. A counter that was never written reads 0. A sum beyond the range of `i64` is
/// refused with [`Error::InvalidArgument`] and writes nothing.
///
/// Needs versioned values: every store but Redlock, where each method returns
/// [`Error::Unsupported`].
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::connect("memory://counter-doc").await?;
/// let visits = locks.counter("visits");
/// assert_eq!(visits.get().await?, 0);
/// assert_eq!(visits.add(5).await?, 5);
/// assert_eq!(visits.add(-2).await?, 3);
/// assert!(visits.compare_and_set(3, 10).await?);
/// assert!(!visits.compare_and_set(3, 11).await?); // it is 10 now
/// assert!(matches!(visits.add(i64::MAX).await, Err(dlock::Error::InvalidArgument { .. })));
/// assert_eq!(visits.get().await?, 10);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Counter {
    locks: Locks,
    name: String,
    max_attempts: u32,
}

impl Counter {
    pub(crate) fn new(locks: Locks, name: String) -> Counter {
        Counter {
            locks,
            name,
            max_attempts: DEFAULT_UPDATE_ATTEMPTS,
        }
    }

    /// The counter's name (also the name of the versioned value that keeps it).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many times [`add`](Self::add) and [`compare_and_set`](Self::compare_and_set) try
    /// when other writers keep getting in first, before [`Error::Conflict`] (default
    /// [`DEFAULT_UPDATE_ATTEMPTS`](crate::limits::DEFAULT_UPDATE_ATTEMPTS); at least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// The current count; 0 for a counter never written.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`]; [`Error::Unsupported`] on a store without values;
    /// [`Error::WrongType`] when the value of that name is not a count; store errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn get(&self) -> Result<i64> {
        let (store, name) = self.store()?;
        Ok(read(store, &name, self.locks.info().name).await?.0)
    }

    /// Adds `delta` (negative to subtract) in one atomic step and returns the new count.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when the sum leaves the range of `i64` (nothing written);
    /// [`Error::Conflict`] when every attempt lost to another writer; as [`get`](Self::get).
    ///
    /// # Cancel safety
    ///
    /// A dropped call may or may not have added; read again to find out.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://counter-add-doc").await?;
    /// assert_eq!(locks.counter("stock").add(-1).await?, -1);
    /// # Ok(()) }
    /// ```
    pub async fn add(&self, delta: i64) -> Result<i64> {
        self.change(|current| {
            current.checked_add(delta).map(Some).ok_or_else(|| {
                Error::invalid_argument(
                    "counter delta",
                    format!("{current} + {delta} is outside the range of a 64-bit count"),
                )
            })
        })
        .await
        .map(|(_, new)| new)
    }

    /// Sets the count to `new` only if it is `expected` now (0 for a counter never written),
    /// in one atomic step. Returns whether it was set.
    ///
    /// # Errors
    ///
    /// As [`add`](Self::add), without the range error.
    ///
    /// # Cancel safety
    ///
    /// A dropped call may or may not have set the count.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://counter-cas-doc").await?;
    /// let epoch = locks.counter("epoch");
    /// assert!(epoch.compare_and_set(0, 1).await?);
    /// assert!(!epoch.compare_and_set(0, 2).await?);
    /// # Ok(()) }
    /// ```
    pub async fn compare_and_set(&self, expected: i64, new: i64) -> Result<bool> {
        let (old, _) = self
            .change(|current| Ok((current == expected).then_some(new)))
            .await?;
        Ok(old == expected)
    }

    /// Reads, lets `next` decide the new count (`Ok(None)`: leave it), and writes it by
    /// compare-and-set, again from a fresh read while another writer gets in first. Returns
    /// the count read last and the count after the call.
    pub(crate) async fn change(
        &self,
        mut next: impl FnMut(i64) -> Result<Option<i64>>,
    ) -> Result<(i64, i64)> {
        if self.max_attempts == 0 {
            return Err(Error::invalid_argument(
                "max_attempts",
                "must be at least 1",
            ));
        }
        let (store, name) = self.store()?;
        let backend = self.locks.info().name;
        for attempt in 1..=self.max_attempts {
            let started = tokio::time::Instant::now();
            let (current, version) = read(store, &name, backend).await?;
            let Some(new) = next(current)? else {
                return Ok((current, current));
            };
            let expect = Expect::from_read(version);
            if store
                .put(&name, expect, new.to_string().as_bytes())
                .await?
                .is_some()
            {
                return Ok((current, new));
            }
            // Another writer got in between: its write is the new base. The pause (as
            // `VersionedValue::update`'s) keeps colliding writers from colliding again.
            if attempt < self.max_attempts {
                let pause = crate::value::retry_pause(started.elapsed(), attempt);
                tokio::time::sleep(pause).await;
            }
        }
        Err(Error::Conflict {
            name: self.name.clone(),
            attempts: self.max_attempts,
        })
    }

    fn store(&self) -> Result<(&dyn ValueStore, LockName)> {
        let name = LockName::new(self.name.as_str())?;
        let store = super::values(&self.locks, "counters")?;
        Ok((store, name))
    }
}

/// The count of `name` and its version (`None`: never written, the count is 0).
async fn read(
    store: &dyn ValueStore,
    name: &LockName,
    backend: &'static str,
) -> Result<(i64, Option<u64>)> {
    let Some(read) = store.get(name).await? else {
        return Ok((0, None));
    };
    let count = std::str::from_utf8(&read.value)
        .ok()
        .and_then(|text| text.parse::<i64>().ok())
        .ok_or_else(|| Error::WrongType {
            backend,
            key: name.as_str().to_owned(),
            detail: "a value that is not a decimal count".to_owned(),
        })?;
    Ok((count, Some(read.version)))
}
