//! [`MultiLockBuilder`]: several exclusive locks taken all-or-nothing, in a canonical order.

use std::collections::BTreeSet;

use crate::backend::{LockKind, Wait};
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::hold::acquire;
use crate::hold::options::HoldOptions;
use crate::locks::Locks;
use crate::name::LockName;
use crate::primitives::guard_set::{GuardSet, hold_methods, release_all, settle};
use crate::primitives::options::hold_option_setters;
use crate::ttl::WaitSpec;

/// The most names one multi-lock may take.
pub const MAX_MULTI_LOCK_NAMES: usize = 1024;

/// Options for taking several exclusive locks at once; made by [`Locks::multi_lock`].
///
/// Where the store can take several locks in one atomic step (Redis: one script; SQLite: one
/// transaction), the first
/// attempt does; otherwise, and while waiting, the names are taken one at a time in one
/// canonical order (sorted by bytes), so two multi-locks over
/// overlapping names never deadlock, whatever order their callers listed them in. One deadline
/// covers all of them; if it runs out or a store call fails, the locks taken so far are
/// released before the error is returned. The locks are the same as [`Locks::mutex`] locks of
/// the same names, so a multi-lock and a plain mutex exclude each other.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// use std::time::Duration;
/// let locks = dlock::connect("memory://multi-doc").await?;
/// let transfer = locks
///     .multi_lock(["accounts/bob", "accounts/alice"])
///     .wait(Duration::from_secs(5))
///     .acquire()
///     .await?;
/// assert!(locks.mutex("accounts/alice").try_acquire().await?.is_none());
/// assert_eq!(transfer.fences().count(), 2);
/// transfer.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[must_use = "a lock builder does nothing until `acquire` or `try_acquire` is awaited"]
pub struct MultiLockBuilder {
    locks: Locks,
    names: Vec<String>,
    options: HoldOptions,
}

impl MultiLockBuilder {
    pub(crate) fn new(locks: Locks, names: Vec<String>) -> MultiLockBuilder {
        MultiLockBuilder {
            locks,
            names,
            options: HoldOptions::default(),
        }
    }

    hold_option_setters!("all of the locks together");

    /// Validates the names (none invalid, no duplicates, at least one) in canonical order.
    fn sorted_names(&self) -> Result<Vec<LockName>> {
        if self.names.is_empty() {
            return Err(Error::invalid_argument(
                "names",
                "a multi-lock needs at least one name",
            ));
        }
        if self.names.len() > MAX_MULTI_LOCK_NAMES {
            return Err(Error::invalid_argument(
                "names",
                format!("{} names; at most {MAX_MULTI_LOCK_NAMES}", self.names.len()),
            ));
        }
        let mut sorted = BTreeSet::new();
        for name in &self.names {
            let name = LockName::new(name.clone())?;
            if let Some(duplicate) = sorted.replace(name) {
                return Err(Error::invalid_argument(
                    "names",
                    format!("{:?} is listed twice", duplicate.as_str()),
                ));
            }
        }
        Ok(sorted.into_iter().collect())
    }

    async fn run(self, default_wait: WaitSpec) -> Result<Option<MultiGuard>> {
        let names = self.sorted_names()?;
        let terms = self.options.validate(&self.locks, default_wait)?;
        // One atomic attempt at every lock, where the store has one (a Redis script, a SQLite
        // transaction).
        let all_at_once = names
            .iter()
            .map(|name| terms.request(name.clone(), LockKind::Exclusive, Wait::No))
            .collect();
        match acquire::take_all(&self.locks, &terms, all_at_once).await {
            // No atomic step in this store, or busy with time to wait: one lock at a time.
            None => {}
            Some(Ok(None)) if !terms.deadline.passed() => {}
            Some(outcome) => return outcome.map(|held| held.map(MultiGuard::new)),
        }
        let terms = terms.collecting();
        loop {
            let mut held = Vec::with_capacity(names.len());
            for name in &names {
                match acquire::exclusive(&self.locks, &terms, name, terms.deadline).await {
                    Ok(Some(guard)) => held.push(guard),
                    Ok(None) => {
                        release_all(held).await;
                        return Ok(None);
                    }
                    Err(error) => {
                        release_all(held).await;
                        return Err(error);
                    }
                }
            }
            match settle(&held, &terms).await {
                Ok(true) => return Ok(Some(MultiGuard::new(held))),
                // A lock taken early was lost while the later ones were awaited: start again.
                Ok(false) => release_all(held).await,
                Err(error) => {
                    release_all(held).await;
                    return Err(error);
                }
            }
        }
    }

    /// Acquires every lock, waiting as configured (forever by default).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] (naming the first of the sorted names) when the wait runs out;
    /// [`Error::InvalidName`] / [`Error::InvalidArgument`] for an empty list, a duplicate or an
    /// invalid name, before any store call; store errors. No lock stays held after an error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe as [`MutexBuilder::acquire`](crate::MutexBuilder::acquire): locks taken
    /// before the drop are released in the background.
    pub async fn acquire(self) -> Result<MultiGuard> {
        let first = self.names.iter().min().cloned().unwrap_or_default();
        let waited = self.options.waited(WaitSpec::Forever);
        self.run(WaitSpec::Forever).await?.ok_or(Error::Timeout {
            name: first,
            waited,
        })
    }

    /// Acquires every lock if all are free (or free up within the configured wait, which
    /// defaults to none); `Ok(None)` otherwise, with nothing held.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire), except that busy locks are `Ok(None)`.
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
    /// let locks = dlock::connect("memory://multi-try-doc").await?;
    /// let _b = locks.mutex("b").acquire().await?;
    /// assert!(locks.multi_lock(["a", "b"]).try_acquire().await?.is_none());
    /// // "a" was taken first and let go again.
    /// assert!(locks.inspect("a").await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire(self) -> Result<Option<MultiGuard>> {
        self.run(WaitSpec::No).await
    }
}

/// Several held exclusive locks with one lost signal; made by [`MultiLockBuilder`].
///
/// Dropping it releases every lock in the background, as [`MutexGuard`](crate::MutexGuard) does.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::connect("memory://multi-guard-doc").await?;
/// let both = locks.multi_lock(["x", "y"]).acquire().await?;
/// for (name, fence) in both.fences() {
///     println!("{name}: {fence}");
/// }
/// tokio::select! {
///     () = both.lost() => { /* one of them is gone: stop */ }
///     () = async { /* work */ } => {}
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[clippy::has_significant_drop]
#[must_use = "if unused the locks will immediately be released"]
pub struct MultiGuard {
    set: GuardSet,
}

impl MultiGuard {
    fn new(guards: Vec<crate::MutexGuard>) -> MultiGuard {
        MultiGuard {
            set: GuardSet::new(guards),
        }
    }

    /// Each lock's name and fence, in canonical (sorted) order.
    pub fn fences(&self) -> impl Iterator<Item = (&LockName, FencingToken)> {
        self.set.fences()
    }

    /// The fence of the lock `name`, if it is one of this guard's.
    pub fn fence(&self, name: &str) -> Option<FencingToken> {
        self.set
            .guards()
            .iter()
            .find(|guard| guard.name().as_str() == name)
            .map(crate::MutexGuard::fence)
    }

    hold_methods!(set);
}
