//! A blocking facade with the same names as the async API, for code that is not async
//! (the way `reqwest::blocking` wraps `reqwest`).
//!
//! Each [`Locks`] owns a small tokio runtime (one worker thread) that runs the store client and
//! the lease keeper, so watchdog renewal and lost-lock detection keep working while your thread
//! does something else. A call itself runs on your thread: the runtime's worker only takes
//! part where the store's client needs it, and Redis sends a call's commands over blocking
//! connections of your thread, so a call costs its round trips and no thread hops. Calling
//! these methods from inside an async runtime returns
//! [`Error::InvalidArgument`] instead of deadlocking: use the async API there.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//!
//! let locks = dlock::blocking::Locks::connect("memory://blocking-doc")?;
//! let guard = locks.mutex("reports").ttl(Duration::from_secs(10)).acquire()?;
//! println!("fence {}", guard.fence());
//! guard.release()?;
//! # Ok::<(), dlock::Error>(())
//! ```

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;

use crate::backend::{BackendInfo, LockInfo};
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::name::{LockName, Owner};

mod coordination;
mod election;
mod held;
mod primitives;

pub use coordination::{Barrier, BarrierGuard, CountDownLatch, Counter, DoubleBarrier, Inside};
pub use election::{Election, Leadership, Observe};
pub use held::FencedHold;
use held::{Held, blocking_hold_methods};
pub use primitives::{
    MultiGuard, MultiLockBuilder, Permit, ReadGuard, RwLockBuilder, SemaphoreBuilder, WriteGuard,
};

/// The runtime behind a blocking client; shut down in the background when the last handle goes,
/// so dropping it never panics, even inside async code.
#[derive(Debug)]
struct Runtime(Option<tokio::runtime::Runtime>);

impl Runtime {
    fn new() -> Result<Runtime> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("dlock-blocking")
            .enable_all()
            .build()
            .map(|rt| Runtime(Some(rt)))
            .map_err(|e| Error::Backend {
                backend: "blocking",
                source: Box::new(e),
            })
    }

    fn block_on<F: Future>(&self, future: F) -> Result<F::Output> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(Error::invalid_argument(
                "call site",
                "dlock::blocking cannot run inside an async runtime (it would block one of the \
                 runtime's threads): use the async API (dlock::connect, dlock::Locks) there, or \
                 call the blocking one from tokio::task::spawn_blocking",
            ));
        }
        match &self.0 {
            // The future runs on this thread: a store may do its I/O here, blocking.
            Some(rt) => Ok(as_blocking_caller(|| rt.block_on(future))),
            None => Err(Error::invalid_argument(
                "call site",
                "this blocking client's runtime was already shut down",
            )),
        }
    }

    fn handle(&self) -> Option<&tokio::runtime::Handle> {
        self.0.as_ref().map(|rt| rt.handle())
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// Runs `f` with this thread marked as a blocking caller, for bindings that drive dlock's async
/// API from threads of their own with a runtime's `block_on` (as the Python package does):
/// futures that `f` polls on this thread may then do their store I/O here, blocking (Redis
/// sends their commands over blocking connections of this thread), instead of handing each
/// command to a runtime worker and back. [`Locks`] does this for its own calls.
///
/// Only for code that blocks this thread until the future is done anyway: never inside an
/// async task (it would block the runtime's thread).
///
/// # Examples
///
/// ```
/// let runtime = tokio::runtime::Runtime::new()?;
/// let locks = runtime.block_on(dlock::connect("memory://as-blocking-caller-doc"))?;
/// let fence = dlock::blocking::as_blocking_caller(|| {
///     runtime.block_on(async {
///         let guard = locks.mutex("jobs").acquire().await?;
///         let fence = guard.fence();
///         guard.release().await?;
///         Ok::<_, dlock::Error>(fence)
///     })
/// })?;
/// assert!(fence.get() > 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn as_blocking_caller<R>(f: impl FnOnce() -> R) -> R {
    let _mark = crate::backend::caller_thread::mark_blocking_caller();
    f()
}

/// Blocking version of [`crate::Locks`].
#[derive(Clone, Debug)]
pub struct Locks {
    inner: crate::Locks,
    rt: Arc<Runtime>,
}

impl Locks {
    /// Connects to the store named by `url`; see [`crate::connect`].
    ///
    /// # Errors
    ///
    /// As [`crate::connect`], plus [`Error::InvalidArgument`] when called inside an async runtime.
    ///
    /// # Examples
    ///
    /// ```
    /// let locks = dlock::blocking::Locks::connect("memory://")?;
    /// # Ok::<(), dlock::Error>(())
    /// ```
    pub fn connect(url: &str) -> Result<Locks> {
        let rt = Arc::new(Runtime::new()?);
        let inner = rt.block_on(crate::connect(url))??;
        Ok(Locks { inner, rt })
    }

    /// The async client behind this one.
    pub fn as_async(&self) -> &crate::Locks {
        &self.inner
    }

    /// Runs any future of the async API on this client's runtime and blocks until it is done.
    /// Guards obtained this way are async guards: dropping one releases it in the background;
    /// prefer the blocking builders ([`mutex`](Self::mutex), [`rwlock`](Self::rwlock),
    /// [`semaphore`](Self::semaphore), [`multi_lock`](Self::multi_lock)), whose guards release
    /// before `drop` returns.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when called inside an async runtime.
    ///
    /// # Examples
    ///
    /// ```
    /// let locks = dlock::blocking::Locks::connect("memory://blocking-block-on-doc")?;
    /// let permit = locks.block_on(locks.as_async().semaphore("jobs", 2).acquire())??;
    /// locks.block_on(permit.release())??;
    /// # Ok::<(), dlock::Error>(())
    /// ```
    pub fn block_on<F: Future>(&self, future: F) -> Result<F::Output> {
        self.rt.block_on(future)
    }

    /// Blocking version of [`crate::Locks::value`].
    ///
    /// # Examples
    ///
    /// ```
    /// let locks = dlock::blocking::Locks::connect("memory://blocking-value-doc")?;
    /// let v1 = locks.value("config").set(b"on")?;
    /// assert_eq!(locks.value("config").compare_and_set(Some(v1), b"off")?, Some(v1 + 1));
    /// # Ok::<(), dlock::Error>(())
    /// ```
    pub fn value(&self, name: impl Into<String>) -> VersionedValue {
        VersionedValue {
            inner: self.inner.value(name),
            rt: self.rt.clone(),
        }
    }

    /// See [`crate::Locks::with_label`].
    ///
    /// # Errors
    ///
    /// As [`crate::Locks::with_label`].
    pub fn with_label(&self, label: impl Into<String>) -> Result<Locks> {
        Ok(Locks {
            inner: self.inner.with_label(label)?,
            rt: self.rt.clone(),
        })
    }

    /// See [`crate::Locks::with_watchdog_lease`].
    ///
    /// # Errors
    ///
    /// As [`crate::Locks::with_watchdog_lease`].
    pub fn with_watchdog_lease(&self, lease: Duration) -> Result<Locks> {
        Ok(Locks {
            inner: self.inner.with_watchdog_lease(lease)?,
            rt: self.rt.clone(),
        })
    }

    /// See [`crate::Locks::info`].
    pub fn info(&self) -> &BackendInfo {
        self.inner.info()
    }

    /// See [`crate::Locks::owner`].
    pub fn owner(&self) -> &Owner {
        self.inner.owner()
    }

    /// See [`crate::Locks::mutex`].
    pub fn mutex(&self, name: impl Into<String>) -> MutexBuilder {
        MutexBuilder {
            inner: self.inner.mutex(name),
            rt: self.rt.clone(),
        }
    }

    /// See [`crate::Locks::inspect`].
    ///
    /// # Errors
    ///
    /// As [`crate::Locks::inspect`].
    pub fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        self.rt.block_on(self.inner.inspect(name))?
    }

    /// See [`crate::Locks::list`]: an iterator that reads the store page by page.
    ///
    /// # Examples
    ///
    /// ```
    /// let locks = dlock::blocking::Locks::connect("memory://blocking-list-doc")?;
    /// let _g = locks.mutex("jobs/a").acquire()?;
    /// let names: Vec<String> = locks.list("jobs/").map(|l| l.map(|l| l.name)).collect::<Result<_, _>>()?;
    /// assert_eq!(names, ["jobs/a"]);
    /// # Ok::<(), dlock::Error>(())
    /// ```
    pub fn list(&self, prefix: &str) -> List {
        List {
            stream: self.inner.list(prefix),
            rt: self.rt.clone(),
        }
    }

    /// See [`crate::Locks::force_release`].
    ///
    /// # Errors
    ///
    /// As [`crate::Locks::force_release`].
    pub fn force_release(&self, name: &str) -> Result<bool> {
        self.rt.block_on(self.inner.force_release(name))?
    }
}

/// Iterator over held locks; see [`Locks::list`].
pub struct List {
    stream: BoxStream<'static, Result<LockInfo>>,
    rt: Arc<Runtime>,
}

impl std::fmt::Debug for List {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("List").finish_non_exhaustive()
    }
}

impl Iterator for List {
    type Item = Result<LockInfo>;

    fn next(&mut self) -> Option<Result<LockInfo>> {
        match self.rt.block_on(self.stream.next()) {
            Ok(item) => item,
            Err(e) => Some(Err(e)),
        }
    }
}

/// Blocking version of [`crate::VersionedValue`].
#[derive(Clone, Debug)]
pub struct VersionedValue {
    inner: crate::VersionedValue,
    rt: Arc<Runtime>,
}

impl VersionedValue {
    /// See [`crate::VersionedValue::max_attempts`].
    pub fn max_attempts(self, attempts: u32) -> Self {
        VersionedValue {
            inner: self.inner.max_attempts(attempts),
            ..self
        }
    }

    /// See [`crate::VersionedValue::get`].
    ///
    /// # Errors
    ///
    /// As [`crate::VersionedValue::get`].
    pub fn get(&self) -> Result<Option<crate::Versioned>> {
        self.rt.block_on(self.inner.get())?
    }

    /// See [`crate::VersionedValue::compare_and_set`].
    ///
    /// # Errors
    ///
    /// As [`crate::VersionedValue::compare_and_set`].
    pub fn compare_and_set(
        &self,
        expected: Option<u64>,
        value: impl AsRef<[u8]>,
    ) -> Result<Option<u64>> {
        self.rt
            .block_on(self.inner.compare_and_set(expected, value))?
    }

    /// See [`crate::VersionedValue::set`].
    ///
    /// # Errors
    ///
    /// As [`crate::VersionedValue::set`].
    pub fn set(&self, value: impl AsRef<[u8]>) -> Result<u64> {
        self.rt.block_on(self.inner.set(value))?
    }

    /// See [`crate::VersionedValue::set_fenced`]: written only while `hold` (a
    /// [`MutexGuard`] or a [`Leadership`]) is still its lock's current holder, the store
    /// deciding in one step.
    ///
    /// # Errors
    ///
    /// As [`crate::VersionedValue::set_fenced`].
    ///
    /// # Examples
    ///
    /// ```
    /// # fn main() -> dlock::Result<()> {
    /// let locks = dlock::blocking::Locks::connect("memory://blocking-fenced-doc")?;
    /// let guard = locks.mutex("orders/42").acquire()?;
    /// let version = locks.value("orders/42/state").set_fenced(&guard, b"shipped")?;
    /// assert!(version > 0);
    /// # Ok(()) }
    /// ```
    pub fn set_fenced(&self, hold: &impl FencedHold, value: impl AsRef<[u8]>) -> Result<u64> {
        self.rt
            .block_on(self.inner.set_fenced(hold.async_hold(), value))?
    }

    /// See [`crate::VersionedValue::update`].
    ///
    /// # Errors
    ///
    /// As [`crate::VersionedValue::update`].
    pub fn update(
        &self,
        change: impl FnMut(Option<&[u8]>) -> Option<Vec<u8>>,
    ) -> Result<Option<crate::Versioned>> {
        self.rt.block_on(self.inner.update(change))?
    }
}

/// Blocking version of [`crate::MutexBuilder`]; same options.
#[derive(Clone, Debug)]
#[must_use = "a lock builder does nothing until `acquire` or `try_acquire` is called"]
pub struct MutexBuilder {
    inner: crate::MutexBuilder,
    rt: Arc<Runtime>,
}

impl MutexBuilder {
    /// See [`crate::MutexBuilder::ttl`].
    pub fn ttl(self, ttl: Duration) -> Self {
        MutexBuilder {
            inner: self.inner.ttl(ttl),
            ..self
        }
    }

    /// See [`crate::MutexBuilder::wait`].
    pub fn wait(self, wait: Duration) -> Self {
        MutexBuilder {
            inner: self.inner.wait(wait),
            ..self
        }
    }

    /// See [`crate::MutexBuilder::no_wait`].
    pub fn no_wait(self) -> Self {
        MutexBuilder {
            inner: self.inner.no_wait(),
            ..self
        }
    }

    /// See [`crate::MutexBuilder::wait_forever`].
    pub fn wait_forever(self) -> Self {
        MutexBuilder {
            inner: self.inner.wait_forever(),
            ..self
        }
    }

    /// See [`crate::MutexBuilder::reentrant`].
    pub fn reentrant(self) -> Self {
        MutexBuilder {
            inner: self.inner.reentrant(),
            ..self
        }
    }

    /// See [`crate::MutexBuilder::fair`].
    pub fn fair(self) -> Self {
        MutexBuilder {
            inner: self.inner.fair(),
            ..self
        }
    }

    /// See [`crate::MutexBuilder::max_hold`].
    pub fn max_hold(self, max: Duration) -> Self {
        MutexBuilder {
            inner: self.inner.max_hold(max),
            ..self
        }
    }

    /// See [`crate::MutexBuilder::acquire`]; blocks the thread while waiting.
    ///
    /// # Errors
    ///
    /// As [`crate::MutexBuilder::acquire`].
    pub fn acquire(self) -> Result<MutexGuard> {
        let guard = self.rt.block_on(self.inner.acquire())??;
        Ok(MutexGuard {
            held: Held::new(guard, self.rt),
        })
    }

    /// See [`crate::MutexBuilder::try_acquire`].
    ///
    /// # Errors
    ///
    /// As [`crate::MutexBuilder::try_acquire`].
    pub fn try_acquire(self) -> Result<Option<MutexGuard>> {
        let guard = self.rt.block_on(self.inner.try_acquire())??;
        Ok(guard.map(|guard| MutexGuard {
            held: Held::new(guard, self.rt),
        }))
    }
}

/// Blocking version of [`crate::MutexGuard`]. Dropping it releases the lock before returning.
///
/// # Examples
///
/// ```
/// let locks = dlock::blocking::Locks::connect("memory://blocking-guard-doc")?;
/// let guard = locks.mutex("reports").acquire()?;
/// assert!(guard.is_owned()?);
/// drop(guard); // released in the store when `drop` returns
/// assert!(locks.mutex("reports").try_acquire()?.is_some());
/// # Ok::<(), dlock::Error>(())
/// ```
#[derive(Debug)]
#[clippy::has_significant_drop]
#[must_use = "if unused the lock will immediately be released"]
pub struct MutexGuard {
    held: Held<crate::MutexGuard>,
}

impl MutexGuard {
    /// See [`crate::MutexGuard::name`].
    pub fn name(&self) -> &LockName {
        self.held.get().name()
    }

    /// See [`crate::MutexGuard::fence`].
    pub fn fence(&self) -> FencingToken {
        self.held.get().fence()
    }

    /// See [`crate::MutexGuard::reenter`]: a new guard for the same reentrant hold.
    ///
    /// # Errors
    ///
    /// As [`crate::MutexGuard::reenter`].
    pub fn reenter(&self) -> Result<MutexGuard> {
        let inner = self.held.rt.block_on(self.held.get().reenter())??;
        Ok(MutexGuard {
            held: Held::new(inner, self.held.rt.clone()),
        })
    }

    blocking_hold_methods!("lock");
}
