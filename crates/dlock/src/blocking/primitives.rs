//! Blocking versions of the read-write lock, the semaphore and the multi-lock: the same
//! builders and options as the async API, guards released synchronously on drop.

use std::sync::Arc;

use super::Runtime;
use super::held::{Held, blocking_hold_methods};
use crate::error::Result;
use crate::fence::FencingToken;
use crate::name::LockName;

/// The hold options every composed primitive's builder has (see the async builders).
macro_rules! blocking_option_setters {
    ($async:literal) => {
        #[doc = concat!("See [`", $async, "::ttl`](crate::", $async, "::ttl).")]
        pub fn ttl(self, ttl: std::time::Duration) -> Self {
            Self {
                inner: self.inner.ttl(ttl),
                ..self
            }
        }

        #[doc = concat!("See [`", $async, "::wait`](crate::", $async, "::wait).")]
        pub fn wait(self, wait: std::time::Duration) -> Self {
            Self {
                inner: self.inner.wait(wait),
                ..self
            }
        }

        #[doc = concat!("See [`", $async, "::no_wait`](crate::", $async, "::no_wait).")]
        pub fn no_wait(self) -> Self {
            Self {
                inner: self.inner.no_wait(),
                ..self
            }
        }

        #[doc = concat!("See [`", $async, "::wait_forever`](crate::", $async, "::wait_forever).")]
        pub fn wait_forever(self) -> Self {
            Self {
                inner: self.inner.wait_forever(),
                ..self
            }
        }

        #[doc = concat!("See [`", $async, "::max_hold`](crate::", $async, "::max_hold).")]
        pub fn max_hold(self, max: std::time::Duration) -> Self {
            Self {
                inner: self.inner.max_hold(max),
                ..self
            }
        }
    };
}

impl super::Locks {
    /// See [`crate::Locks::rwlock`].
    ///
    /// # Examples
    ///
    /// ```
    /// let locks = dlock::blocking::Locks::connect("memory://blocking-rwlock-doc")?;
    /// let reading = locks.rwlock("catalog").read()?;
    /// assert!(locks.rwlock("catalog").try_write()?.is_none());
    /// drop(reading); // released when `drop` returns
    /// assert!(locks.rwlock("catalog").try_write()?.is_some());
    /// # Ok::<(), dlock::Error>(())
    /// ```
    pub fn rwlock(&self, name: impl Into<String>) -> RwLockBuilder {
        RwLockBuilder {
            inner: self.inner.rwlock(name),
            rt: self.rt.clone(),
        }
    }

    /// See [`crate::Locks::semaphore`].
    ///
    /// # Examples
    ///
    /// ```
    /// let locks = dlock::blocking::Locks::connect("memory://blocking-semaphore-doc")?;
    /// let first = locks.semaphore("uploads", 1).acquire()?;
    /// assert!(locks.semaphore("uploads", 1).try_acquire()?.is_none());
    /// first.release()?;
    /// assert!(locks.semaphore("uploads", 1).try_acquire()?.is_some());
    /// # Ok::<(), dlock::Error>(())
    /// ```
    pub fn semaphore(&self, name: impl Into<String>, permits: u32) -> SemaphoreBuilder {
        SemaphoreBuilder {
            inner: self.inner.semaphore(name, permits),
            rt: self.rt.clone(),
        }
    }

    /// See [`crate::Locks::multi_lock`].
    ///
    /// # Examples
    ///
    /// ```
    /// let locks = dlock::blocking::Locks::connect("memory://blocking-multi-doc")?;
    /// let both = locks.multi_lock(["seat/12A", "seat/12B"]).acquire()?;
    /// assert!(locks.mutex("seat/12B").try_acquire()?.is_none());
    /// assert!(both.is_owned()?);
    /// both.release()?;
    /// # Ok::<(), dlock::Error>(())
    /// ```
    pub fn multi_lock<I, S>(&self, names: I) -> MultiLockBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        MultiLockBuilder {
            inner: self.inner.multi_lock(names),
            rt: self.rt.clone(),
        }
    }
}

/// Blocking version of [`crate::RwLockBuilder`]; same options.
#[derive(Clone, Debug)]
#[must_use = "a lock builder does nothing until a read or write method is called"]
pub struct RwLockBuilder {
    inner: crate::RwLockBuilder,
    rt: Arc<Runtime>,
}

impl RwLockBuilder {
    /// See [`crate::RwLockBuilder::max_readers`].
    pub fn max_readers(self, max: u32) -> Self {
        RwLockBuilder {
            inner: self.inner.max_readers(max),
            ..self
        }
    }

    blocking_option_setters!("RwLockBuilder");

    /// See [`crate::RwLockBuilder::read`]; blocks the thread while waiting.
    ///
    /// # Errors
    ///
    /// As [`crate::RwLockBuilder::read`].
    pub fn read(self) -> Result<ReadGuard> {
        let guard = self.rt.block_on(self.inner.read())??;
        Ok(ReadGuard {
            held: Held::new(guard, self.rt),
        })
    }

    /// See [`crate::RwLockBuilder::try_read`].
    ///
    /// # Errors
    ///
    /// As [`crate::RwLockBuilder::try_read`].
    pub fn try_read(self) -> Result<Option<ReadGuard>> {
        let guard = self.rt.block_on(self.inner.try_read())??;
        Ok(guard.map(|guard| ReadGuard {
            held: Held::new(guard, self.rt),
        }))
    }

    /// See [`crate::RwLockBuilder::write`]; blocks the thread while waiting.
    ///
    /// # Errors
    ///
    /// As [`crate::RwLockBuilder::write`].
    pub fn write(self) -> Result<WriteGuard> {
        let guard = self.rt.block_on(self.inner.write())??;
        Ok(WriteGuard {
            held: Held::new(guard, self.rt),
        })
    }

    /// See [`crate::RwLockBuilder::try_write`].
    ///
    /// # Errors
    ///
    /// As [`crate::RwLockBuilder::try_write`].
    pub fn try_write(self) -> Result<Option<WriteGuard>> {
        let guard = self.rt.block_on(self.inner.try_write())??;
        Ok(guard.map(|guard| WriteGuard {
            held: Held::new(guard, self.rt),
        }))
    }
}

/// Blocking version of [`crate::ReadGuard`]. Dropping it releases the read hold before
/// returning.
///
/// # Examples
///
/// ```
/// let locks = dlock::blocking::Locks::connect("memory://blocking-read-guard-doc")?;
/// let reading = locks.rwlock("config").read()?;
/// assert!(reading.is_owned()?);
/// reading.release()?;
/// # Ok::<(), dlock::Error>(())
/// ```
#[derive(Debug)]
#[clippy::has_significant_drop]
#[must_use = "if unused the lock will immediately be released"]
pub struct ReadGuard {
    held: Held<crate::ReadGuard>,
}

impl ReadGuard {
    /// See [`crate::ReadGuard::fence`].
    pub fn fence(&self) -> FencingToken {
        self.held.get().fence()
    }

    blocking_hold_methods!("read hold");
}

/// Blocking version of [`crate::WriteGuard`]. Dropping it releases the write hold before
/// returning.
///
/// # Examples
///
/// ```
/// let locks = dlock::blocking::Locks::connect("memory://blocking-write-guard-doc")?;
/// let writing = locks.rwlock("config").write()?;
/// assert!(locks.rwlock("config").try_read()?.is_none());
/// drop(writing);
/// assert!(locks.rwlock("config").try_read()?.is_some());
/// # Ok::<(), dlock::Error>(())
/// ```
#[derive(Debug)]
#[clippy::has_significant_drop]
#[must_use = "if unused the lock will immediately be released"]
pub struct WriteGuard {
    held: Held<crate::WriteGuard>,
}

impl WriteGuard {
    /// See [`crate::WriteGuard::fence`].
    pub fn fence(&self) -> FencingToken {
        self.held.get().fence()
    }

    blocking_hold_methods!("write hold");
}

/// Blocking version of [`crate::SemaphoreBuilder`]; same options.
#[derive(Clone, Debug)]
#[must_use = "a lock builder does nothing until `acquire` or `try_acquire` is called"]
pub struct SemaphoreBuilder {
    inner: crate::SemaphoreBuilder,
    rt: Arc<Runtime>,
}

impl SemaphoreBuilder {
    blocking_option_setters!("SemaphoreBuilder");

    /// See [`crate::SemaphoreBuilder::count`]: this many permits at once, all or nothing.
    ///
    /// ```
    /// let locks = dlock::blocking::Locks::connect("memory://blocking-semaphore-count-doc")?;
    /// let both = locks.semaphore("uploads", 2).count(2).acquire()?;
    /// assert_eq!(both.count(), 2);
    /// assert!(locks.semaphore("uploads", 2).try_acquire()?.is_none());
    /// # Ok::<(), dlock::Error>(())
    /// ```
    pub fn count(mut self, count: u32) -> Self {
        self.inner = self.inner.count(count);
        self
    }

    /// See [`crate::SemaphoreBuilder::acquire`]; blocks the thread while waiting.
    ///
    /// # Errors
    ///
    /// As [`crate::SemaphoreBuilder::acquire`].
    pub fn acquire(self) -> Result<Permit> {
        let permit = self.rt.block_on(self.inner.acquire())??;
        Ok(Permit {
            held: Held::new(permit, self.rt),
        })
    }

    /// See [`crate::SemaphoreBuilder::try_acquire`].
    ///
    /// # Errors
    ///
    /// As [`crate::SemaphoreBuilder::try_acquire`].
    pub fn try_acquire(self) -> Result<Option<Permit>> {
        let permit = self.rt.block_on(self.inner.try_acquire())??;
        Ok(permit.map(|permit| Permit {
            held: Held::new(permit, self.rt),
        }))
    }
}

/// Blocking version of [`crate::Permit`]. Dropping it returns the permit before returning.
///
/// # Examples
///
/// ```
/// let locks = dlock::blocking::Locks::connect("memory://blocking-permit-doc")?;
/// let permit = locks.semaphore("uploads", 2).acquire()?;
/// assert!(permit.is_owned()?);
/// drop(permit);
/// # Ok::<(), dlock::Error>(())
/// ```
#[derive(Debug)]
#[clippy::has_significant_drop]
#[must_use = "if unused the permit will immediately be returned"]
pub struct Permit {
    held: Held<crate::Permit>,
}

impl Permit {
    /// See [`crate::Permit::slot`].
    pub fn slot(&self) -> &LockName {
        self.held.get().slot()
    }

    /// See [`crate::Permit::slots`].
    pub fn slots(&self) -> Vec<(&LockName, FencingToken)> {
        self.held.get().slots()
    }

    /// See [`crate::Permit::count`].
    pub fn count(&self) -> u32 {
        self.held.get().count()
    }

    /// See [`crate::Permit::fence`].
    pub fn fence(&self) -> FencingToken {
        self.held.get().fence()
    }

    blocking_hold_methods!("permit");
}

/// Blocking version of [`crate::MultiLockBuilder`]; same options.
#[derive(Clone, Debug)]
#[must_use = "a lock builder does nothing until `acquire` or `try_acquire` is called"]
pub struct MultiLockBuilder {
    inner: crate::MultiLockBuilder,
    rt: Arc<Runtime>,
}

impl MultiLockBuilder {
    blocking_option_setters!("MultiLockBuilder");

    /// See [`crate::MultiLockBuilder::acquire`]; blocks the thread while waiting.
    ///
    /// # Errors
    ///
    /// As [`crate::MultiLockBuilder::acquire`].
    pub fn acquire(self) -> Result<MultiGuard> {
        let guard = self.rt.block_on(self.inner.acquire())??;
        Ok(MultiGuard {
            held: Held::new(guard, self.rt),
        })
    }

    /// See [`crate::MultiLockBuilder::try_acquire`].
    ///
    /// # Errors
    ///
    /// As [`crate::MultiLockBuilder::try_acquire`].
    pub fn try_acquire(self) -> Result<Option<MultiGuard>> {
        let guard = self.rt.block_on(self.inner.try_acquire())??;
        Ok(guard.map(|guard| MultiGuard {
            held: Held::new(guard, self.rt),
        }))
    }
}

/// Blocking version of [`crate::MultiGuard`]. Dropping it releases every lock before
/// returning.
///
/// # Examples
///
/// ```
/// let locks = dlock::blocking::Locks::connect("memory://blocking-multi-guard-doc")?;
/// let both = locks.multi_lock(["a", "b"]).acquire()?;
/// assert_eq!(both.fences().count(), 2);
/// drop(both);
/// assert!(locks.mutex("a").try_acquire()?.is_some());
/// # Ok::<(), dlock::Error>(())
/// ```
#[derive(Debug)]
#[clippy::has_significant_drop]
#[must_use = "if unused the locks will immediately be released"]
pub struct MultiGuard {
    held: Held<crate::MultiGuard>,
}

impl MultiGuard {
    /// See [`crate::MultiGuard::fences`].
    pub fn fences(&self) -> impl Iterator<Item = (&LockName, FencingToken)> {
        self.held.get().fences()
    }

    /// See [`crate::MultiGuard::fence`].
    pub fn fence(&self, name: &str) -> Option<FencingToken> {
        self.held.get().fence(name)
    }

    blocking_hold_methods!("locks");
}
