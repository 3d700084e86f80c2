//! The implementor side: what a store must provide. Users go through [`Locks`](crate::Locks).

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::fence::FencingToken;
use crate::name::{LockName, Owner};

// The toolkit modules that only stores beyond memory use are built with any of them, not
// gated per backend (a new backend then edits no gate here); each allows dead code in a build
// that leaves out some of its users, and the full build, which CI lints, uses all of it.
pub(crate) mod abandon;
pub(crate) mod caller_thread;
#[cfg(dlock_any_backend)]
pub(crate) mod gather;
mod lease_core;
#[cfg(dlock_any_backend)]
pub(crate) mod list_family;
#[cfg(any(feature = "sqlite", feature = "file"))]
pub(crate) mod local_fs;
mod monitor;
#[cfg(dlock_any_backend)]
pub(crate) mod queue_rules;
#[cfg(dlock_any_backend)]
pub(crate) mod session;
mod store_lease;
pub(crate) mod url;
mod values;
pub mod wait;
#[cfg(dlock_any_backend)]
mod wakers;

pub use lease_core::{LeaseCore, LossSignal};
pub use monitor::{HoldKind, ListPage, ListQuery, LockInfo, MonitorStore};
pub(crate) use store_lease::StoreLease;
pub use values::{Expect, ValueStore, Versioned};
#[cfg(dlock_any_backend)]
#[cfg_attr(not(dlock_all_backends), allow(unused_imports))]
pub(crate) use wakers::Wakers;

/// A lock store: Redis, SQLite, memory, …
///
/// Users never call it directly; they wrap it in [`Locks`](crate::Locks), which adds validation,
/// the lease keeper (watchdog renewal and lost-lock detection), guards and inspection.
///
/// # Contract
///
/// Every implementation guarantees:
/// - **Mutual exclusion**: while a lease returned by [`acquire`](Backend::acquire) has not
///   expired in the store, no other request with a different [`AcquireRequest::token`] gets the
///   same name.
/// - **Fences**: every successful acquisition that is not a reentrant re-entry returns a
///   [`FencingToken`] strictly greater than every earlier one for the same name, across
///   releases, expiries, takeovers and force-releases.
/// - **Idempotence by token**: a repeated acquire with the same token and `reentrant = false`
///   while the lease is held is never granted twice. Where a grant is a record kept by token
///   (memory, SQLite, Redis, Redlock, the SQL lease tables) the repeat takes the grant it
///   already has, with its fence, and renews it to a full lease from the repeat (the keeper
///   dates the lease from there); where each attempt holds its own server object (session
///   locks, etcd, ZooKeeper) it is busy.
/// - **Unknown outcomes**: an acquire that ends with a retryable error
///   ([`Error::is_retryable`](crate::Error::is_retryable)) may have been granted in the store,
///   its reply lost. [`Locks`](crate::Locks) gives such a grant back before it returns the
///   error (a re-entry excepted: its repeat would count a second hold): one repeated attempt
///   with the same token and [`Wait::No`] finds it, and it is released at once; a one-step
///   multi-lock ([`try_acquire_all`](Backend::try_acquire_all)) does so name by name. A
///   store's own clean-up of a failed call must therefore go by its token too. A caller of
///   this trait directly does the same, or the grant lasts its lease.
/// - **Ownership**: [`Lease::extend`] and [`Lease::release`] return
///   [`Error::NotOwned`](crate::Error::NotOwned) when the lease has expired or been taken over or
///   broken; they never silently succeed.
/// - **Waiting**: `acquire` honours [`AcquireRequest::wait`] using the store's native wake-up
///   where it has one, falling back to polling with jittered backoff
///   ([`wait::acquire_loop`]).
/// - **Cancellation**: dropping the future returned by `acquire` never leaves the lock held
///   beyond its TTL, and releases it at once where the store allows.
///
/// # Wrappers
///
/// A wrapper (a layer) must forward every method, including the provided ones.
#[async_trait]
pub trait Backend: Debug + Send + Sync + 'static {
    /// The backend's scheme name and what it can do.
    fn info(&self) -> &BackendInfo;

    /// Acquires `req.name`, waiting as `req.wait` says. `Ok(None)` means the lock was held
    /// elsewhere until the wait ran out (or at once for [`Wait::No`]).
    ///
    /// # Errors
    ///
    /// Store failures, mapped to [`Error`](crate::Error) variants; [`Error::Unsupported`](crate::Error::Unsupported)
    /// for a request the store cannot serve (e.g. `fair` without a queue);
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument), before any store call, for a
    /// `ttl` above [`MAX_TTL`](crate::limits::MAX_TTL).
    ///
    /// # Cancel safety
    ///
    /// Must be cancel safe: a dropped call leaves no queue entry behind and no lock held past
    /// its TTL (see the contract above).
    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Arc<dyn Lease>>>;

    /// Inspection and force-release, when the store supports listing its locks.
    fn monitor(&self) -> Option<&dyn MonitorStore> {
        None
    }

    /// Takes every lock of `reqs` in one atomic step of the store if all are free, and none
    /// otherwise, without waiting: `Some(Ok(None))` when any is held. `None` when the store has
    /// no such step; multi-locks then take the locks one at a time in canonical order.
    ///
    /// The requests are non-reentrant, unfair and [`Wait::No`]; their names are distinct and
    /// sorted.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Backend::acquire): a dropped call leaves no lock held past its TTL.
    async fn try_acquire_all(
        &self,
        reqs: &[AcquireRequest],
    ) -> Option<Result<Option<Vec<Arc<dyn Lease>>>>> {
        let _ = reqs;
        None
    }

    /// Versioned values with compare-and-set, when the store has an atomic write primitive.
    fn values(&self) -> Option<&dyn ValueStore> {
        None
    }
}

/// One held lease, as returned by [`Backend::acquire`].
#[async_trait]
pub trait Lease: Debug + Send + Sync {
    /// The fence, loss signal and start every hold has ([`LeaseCore`]).
    fn core(&self) -> &LeaseCore;

    /// The fencing token of this hold.
    fn fence(&self) -> FencingToken {
        self.core().fence()
    }

    /// Cancelled when the hold is known to be lost. The backend cancels it on a native loss
    /// signal (session expired, force-released by this process); the lease keeper cancels it
    /// when a renewal fails or the local deadline passes.
    fn lost(&self) -> &CancellationToken {
        self.core().lost()
    }

    /// The instant (tokio's clock) just before the request that set this lease's TTL was sent.
    /// The keeper counts the local deadline from here, so it never trusts a lease longer than
    /// the store does.
    fn lease_start(&self) -> Instant {
        self.core().lease_start()
    }

    /// Makes the lease last at least `ttl` from now (compare-and-extend: only if still owned).
    /// It never shortens a lease, so reentrant holds with different TTLs stay safe; a `ttl` of
    /// zero changes nothing and only checks ownership.
    ///
    /// # Errors
    ///
    /// [`Error::NotOwned`](crate::Error::NotOwned) when the hold is gone; store failures;
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument), before any store call and
    /// with the lease left as it was, for a `ttl` above [`MAX_TTL`](crate::limits::MAX_TTL).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the lease is either extended or not.
    async fn extend(&self, ttl: Duration) -> Result<()>;

    /// Releases this hold (one hold count for reentrant locks).
    ///
    /// # Errors
    ///
    /// [`Error::NotOwned`](crate::Error::NotOwned) when the hold is gone or was already
    /// released; store failures.
    ///
    /// # Cancel safety
    ///
    /// A dropped call may or may not have released; the TTL frees the lock in any case.
    async fn release(&self) -> Result<()>;

    /// Releases from a runtime other than the one the client was made on: a guard dropped
    /// while its runtime shuts down is released on a short-lived runtime of its own, where a
    /// connection driven by the old runtime may never answer. Stores whose connections are
    /// tied to their runtime open a fresh one here; the default is [`release`](Self::release).
    ///
    /// # Errors
    ///
    /// As [`release`](Self::release).
    async fn release_elsewhere(&self) -> Result<()> {
        self.release().await
    }

    /// Writes `bytes` as the versioned value `value` (the namespace of
    /// [`ValueStore`]) only while this hold is still the current holder of its lock: the
    /// check (same token and fence, lease not over by the store's clock, or the hold's own
    /// session or key still there) and the write in one atomic step of the store. Returns the
    /// new version, or `None` when the hold is no longer current (nothing written).
    ///
    /// The default is [`Error::Unsupported`](crate::Error::Unsupported) (its `backend` is
    /// filled in by [`VersionedValue::set_fenced`](crate::VersionedValue::set_fenced)).
    ///
    /// # Errors
    ///
    /// Store failures; [`Error::WrongType`](crate::Error::WrongType) for a foreign entry;
    /// [`Error::Unsupported`](crate::Error::Unsupported) where the store cannot decide it
    /// in one step.
    ///
    /// # Cancel safety
    ///
    /// A dropped call may or may not have written.
    async fn put_fenced(&self, value: &LockName, bytes: &[u8]) -> Result<Option<u64>> {
        let _ = (value, bytes);
        Err(crate::Error::Unsupported {
            operation: FENCED_WRITES,
            backend: "this",
        })
    }
}

/// What a backend is and can do.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct BackendInfo {
    /// Scheme name: `memory`, `sqlite`, `redis`, …
    pub name: &'static str,
    /// What the backend supports.
    pub capabilities: Capabilities,
}

impl BackendInfo {
    /// A description of a backend.
    pub const fn new(name: &'static str, capabilities: Capabilities) -> BackendInfo {
        BackendInfo { name, capabilities }
    }
}

/// What a backend supports; the conformance suite registers its cases from this.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::connect("memory://caps-doc").await?;
/// assert!(locks.info().capabilities.reentrant);
/// assert!(!locks.info().capabilities.cross_process);
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Reentrant locks (hold count kept in the store).
    pub reentrant: bool,
    /// Fair (FIFO) waiting.
    pub fair: bool,
    /// Waiters are woken by the store (or by this process) instead of polling alone.
    pub native_wait: bool,
    /// The store signals loss by itself (session expiry, break), not only via the keeper.
    pub native_loss_signal: bool,
    /// Locks are visible to other processes (false only for `memory`).
    pub cross_process: bool,
    /// `inspect` and `force_release` are available ([`Backend::monitor`]).
    pub monitor: bool,
    /// `list` is available too: the store can find its locks by name prefix. False where it
    /// keeps only a hash of each name (PostgreSQL's session locks).
    pub list: bool,
    /// Versioned values with atomic compare-and-set ([`Backend::values`]).
    pub values: bool,
    /// Fenced writes: a value written only while a given hold is still its lock's current
    /// holder, decided in one atomic step of the store ([`Lease::put_fenced`],
    /// [`VersionedValue::set_fenced`](crate::VersionedValue::set_fenced)).
    pub fenced_writes: bool,
    /// Native semaphores: [`LockKind::Permit`] requests (reentrant and fair are never asked).
    pub permits: bool,
    /// Native read-write locks: [`LockKind::Read`] and [`LockKind::Write`] requests.
    pub rwlock: bool,
}

impl Capabilities {
    /// No capabilities; set the public fields of the returned value.
    pub const fn none() -> Capabilities {
        Capabilities {
            reentrant: false,
            fair: false,
            native_wait: false,
            native_loss_signal: false,
            cross_process: false,
            monitor: false,
            list: false,
            values: false,
            fenced_writes: false,
            permits: false,
            rwlock: false,
        }
    }

    /// What a store shared by many processes offers at most, short of native semaphores and
    /// read-write locks: reentrant and fair locks, waiters woken by the store, inspection,
    /// listing and values (SQLite, Redis, etcd, ZooKeeper, the SQL lease tables). A store
    /// names only where it differs. Fenced writes are off here: a store claims them only once
    /// its lease implements [`Lease::put_fenced`].
    #[cfg(dlock_any_backend)]
    pub(crate) const SHARED_STORE: Capabilities = Capabilities {
        reentrant: true,
        fair: true,
        native_wait: true,
        native_loss_signal: false,
        cross_process: true,
        monitor: true,
        list: true,
        values: true,
        fenced_writes: false,
        permits: false,
        rwlock: false,
    };
}

/// The kind of hold asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockKind {
    /// One holder at a time.
    Exclusive,
    /// One of `permits` permits of a native semaphore named by the request. Only sent to
    /// backends with [`Capabilities::permits`]; every other backend's semaphores are composed
    /// from exclusive locks.
    Permit {
        /// How many holders the semaphore admits at once.
        permits: u32,
    },
    /// A read hold of a native read-write lock named by the request (only sent to backends
    /// with [`Capabilities::rwlock`]).
    Read {
        /// How many readers may hold it at once.
        max_readers: u32,
    },
    /// The write hold of a native read-write lock (only sent to backends with
    /// [`Capabilities::rwlock`]); a writer waiting for readers to leave keeps new readers out.
    Write,
}

impl LockKind {
    /// The kind of hold a request of this kind takes, as listings and metric labels name it
    /// (the queue rules are in `queue_rules.rs`).
    pub(crate) fn hold_kind(self) -> HoldKind {
        match self {
            LockKind::Exclusive => HoldKind::Mutex,
            LockKind::Permit { .. } => HoldKind::Permit,
            LockKind::Read { .. } => HoldKind::Reader,
            LockKind::Write => HoldKind::Writer,
        }
    }
}

/// How long [`Backend::acquire`] may wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Wait {
    /// Try once.
    No,
    /// Wait until this instant (tokio's clock, so paused-time tests work).
    Until(Instant),
    /// Wait as long as it takes.
    Forever,
}

impl Wait {
    /// Time left (zero once passed), or `None` for no deadline.
    pub(crate) fn remaining(self) -> Option<Duration> {
        match self {
            Wait::No => Some(Duration::ZERO),
            Wait::Until(at) => Some(at.saturating_duration_since(Instant::now())),
            Wait::Forever => None,
        }
    }

    pub(crate) fn passed(self) -> bool {
        self.remaining().is_some_and(|left| left.is_zero())
    }

    /// The earlier of this wait's deadline and `at`.
    pub(crate) fn cap(self, at: Instant) -> Wait {
        match self {
            Wait::No => Wait::No,
            Wait::Until(own) => Wait::Until(own.min(at)),
            Wait::Forever => Wait::Until(at),
        }
    }

    /// The wait that ends at `deadline`, or never without one.
    #[cfg_attr(not(dlock_all_backends), allow(dead_code))]
    pub(crate) fn until(deadline: Option<Instant>) -> Wait {
        deadline.map_or(Wait::Forever, Wait::Until)
    }

    /// Sleeps for `d`, or until the deadline if that comes first.
    pub(crate) async fn sleep_at_most(self, d: Duration) {
        tokio::time::sleep(self.remaining().map_or(d, |left| left.min(d))).await;
    }

    /// Sleeps until the deadline passes; forever without one.
    #[cfg_attr(not(dlock_all_backends), allow(dead_code))]
    pub(crate) async fn ended(self) {
        match self.deadline() {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    }

    /// The deadline, if any (`No` is "now").
    pub fn deadline(self) -> Option<Instant> {
        match self {
            Wait::No => Some(Instant::now()),
            Wait::Until(at) => Some(at),
            Wait::Forever => None,
        }
    }
}

/// Everything a backend needs to take a lock; built and validated by the lock builders.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct AcquireRequest {
    /// The lock's name.
    pub name: LockName,
    /// Exclusive, shared, permit.
    pub kind: LockKind,
    /// The holder's identity in the store: unique per acquisition; a re-entry through a guard
    /// repeats its hold's token.
    pub token: String,
    /// Who holds it, stored for inspection.
    pub owner: Owner,
    /// The lease length to set in the store.
    pub ttl: Duration,
    /// How long to wait.
    pub wait: Wait,
    /// Re-entry by the same token increments a hold count instead of waiting.
    pub reentrant: bool,
    /// FIFO waiting.
    pub fair: bool,
    /// Renewed by the client's keeper for as long as it is held (no fixed TTL, no maximum
    /// hold): a store may keep it alive with a lease the client shares among such holds (its
    /// session) rather than with a lease of its own. `false` from [`AcquireRequest::new`].
    pub watchdog: bool,
}

impl AcquireRequest {
    /// A request for an exclusive, non-reentrant, unfair lock; adjust the public fields after.
    pub fn new(name: LockName, token: String, owner: Owner, ttl: Duration, wait: Wait) -> Self {
        AcquireRequest {
            name,
            kind: LockKind::Exclusive,
            token,
            owner,
            ttl,
            wait,
            reentrant: false,
            fair: false,
            watchdog: false,
        }
    }
}

/// The operation named by a fenced write's [`Error::Unsupported`](crate::Error::Unsupported).
pub(crate) const FENCED_WRITES: &str = "fenced writes";

/// Shared handle to a backend.
pub type DynBackend = Arc<dyn Backend>;
