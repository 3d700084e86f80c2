//! [`Locks`]: the client handle users hold, one per store connection.

use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, StreamExt, TryStreamExt};

use crate::backend::{Backend, BackendInfo, DynBackend, ListQuery, LockInfo, MonitorStore};
use crate::coordination::{Barrier, CountDownLatch, Counter, DoubleBarrier};
use crate::election::Election;
use crate::error::{Error, Result};
use crate::lease::keeper::Keeper;
use crate::mutex::MutexBuilder;
use crate::name::{LockName, MAX_NAME_LEN, Owner};
use crate::primitives::{MultiLockBuilder, RwLockBuilder, SemaphoreBuilder};
use crate::ttl::{DEFAULT_WATCHDOG_LEASE, validate_ttl};
use crate::value::VersionedValue;

/// How many locks [`Locks::list`] asks the store for per step.
const LIST_PAGE: usize = 256;

/// A client for one lock store: cheap to clone (an `Arc` inside), `Send + Sync`, and the entry
/// point to every primitive.
///
/// All clones share one connection (or pool) and one lease keeper task that renews every held
/// watchdog lease.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// use std::time::Duration;
///
/// let locks = dlock::connect("memory://locks-doc").await?;
/// let guard = locks.mutex("orders/42").ttl(Duration::from_secs(10)).acquire().await?;
/// assert!(locks.mutex("orders/42").try_acquire().await?.is_none());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Locks {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    backend: DynBackend,
    keeper: Keeper,
    owner: Owner,
    watchdog_lease: Duration,
}

impl Locks {
    /// Connects to the store named by `url`; see [`connect`](crate::connect).
    ///
    /// # Errors
    ///
    /// See [`connect`](crate::connect).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops the half-made connection.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::Locks::connect("memory://").await?;
    /// assert_eq!(locks.info().name, "memory");
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Locks> {
        crate::registry::connect(url).await.map(Locks::from_backend)
    }

    /// Wraps a backend built by hand (for example with a builder's options).
    ///
    /// # Examples
    ///
    /// ```
    /// let locks = dlock::Locks::new(dlock::memory::MemoryBackend::new());
    /// assert_eq!(locks.info().name, "memory");
    /// ```
    pub fn new(backend: impl Backend) -> Locks {
        Locks::from_backend(Arc::new(backend))
    }

    /// Wraps a shared backend.
    pub fn from_backend(backend: DynBackend) -> Locks {
        Locks {
            inner: Arc::new(Inner {
                backend,
                keeper: Keeper::default(),
                owner: Owner::current(),
                watchdog_lease: DEFAULT_WATCHDOG_LEASE,
            }),
        }
    }

    fn with_inner(&self, change: impl FnOnce(&mut Inner)) -> Locks {
        let mut inner = Inner {
            backend: self.inner.backend.clone(),
            keeper: self.inner.keeper.clone(),
            owner: self.inner.owner.clone(),
            watchdog_lease: self.inner.watchdog_lease,
        };
        change(&mut inner);
        Locks {
            inner: Arc::new(inner),
        }
    }

    /// The same client with an owner label stored with every lock it takes (shown by `dlock ls`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a label over 256 bytes or with a NUL byte.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://label-doc").await?.with_label("billing")?;
    /// let _guard = locks.mutex("invoices").acquire().await?;
    /// let info = locks.inspect("invoices").await?.unwrap();
    /// assert_eq!(info.owner.label.as_deref(), Some("billing"));
    /// # Ok(()) }
    /// ```
    pub fn with_label(&self, label: impl Into<String>) -> Result<Locks> {
        let owner = self.inner.owner.clone().with_label(label)?;
        Ok(self.with_inner(|inner| inner.owner = owner))
    }

    /// The same client with another watchdog lease (default 30 s): the TTL set in the store for
    /// locks taken without [`ttl`](MutexBuilder::ttl), renewed every third of it while held.
    /// A shorter lease detects a dead holder sooner and costs more renewals.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] outside [`MIN_TTL`](crate::limits::MIN_TTL)..=[`MAX_TTL`](crate::limits::MAX_TTL).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// use std::time::Duration;
    /// let locks = dlock::connect("memory://").await?.with_watchdog_lease(Duration::from_secs(5))?;
    /// assert_eq!(locks.watchdog_lease(), Duration::from_secs(5));
    /// # Ok(()) }
    /// ```
    pub fn with_watchdog_lease(&self, lease: Duration) -> Result<Locks> {
        let lease = validate_ttl("watchdog lease", lease)?;
        Ok(self.with_inner(|inner| inner.watchdog_lease = lease))
    }

    /// The watchdog lease of this client.
    pub fn watchdog_lease(&self) -> Duration {
        self.inner.watchdog_lease
    }

    /// Which backend this is and what it supports.
    pub fn info(&self) -> &BackendInfo {
        self.inner.backend.info()
    }

    /// How many held locks this client's lease keeper is looking after (every live guard whose
    /// lease is not yet known lost). A count that keeps growing means guards are being kept
    /// alive somewhere.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://kept-doc").await?;
    /// let guard = locks.mutex("a").acquire().await?;
    /// assert_eq!(locks.kept_leases(), 1);
    /// guard.release().await?;
    /// assert_eq!(locks.kept_leases(), 0);
    /// # Ok(()) }
    /// ```
    pub fn kept_leases(&self) -> usize {
        self.inner.keeper.len()
    }

    /// Releases every lock this client (and every clone of it) holds, and stops renewing
    /// them: for a program that ends with [`std::process::exit`], which runs no destructors, or
    /// that wants its locks free before it goes on shutting down. Guards still alive afterwards
    /// are lost (their [`lost`](crate::MutexGuard::lost) signal has fired; their `release`
    /// answers [`Error::NotOwned`]). The client stays usable for new locks.
    ///
    /// Returns how many holds were released. A guard dropped without `close` is released too,
    /// even when its runtime is shutting down (`#[tokio::main]` returning, a runtime dropped);
    /// only a process killed outright (SIGKILL, `process::exit` without `close`) leaves its
    /// locks to their lease.
    ///
    /// # Errors
    ///
    /// The first store error, after every hold was tried; the holds it concerns are freed by
    /// their lease.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: the holds are no longer renewed from the first poll, and a release
    /// dropped mid-call may or may not have reached the store (the lease frees it).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://close-doc").await?;
    /// let job = locks.mutex("nightly").acquire().await?;
    /// assert_eq!(locks.close().await?, 1);
    /// assert!(job.is_lost());
    /// assert!(locks.inspect("nightly").await?.is_none());
    /// // std::process::exit(0) here leaves nothing behind.
    /// # Ok(()) }
    /// ```
    pub async fn close(&self) -> Result<usize> {
        let held = self.inner.keeper.take_all();
        let count = held.len();
        let results =
            futures::future::join_all(held.into_iter().map(|(lease, label)| async move {
                let result = lease.release().await;
                lease.lost().cancel();
                result.map_err(|error| {
                    tracing::debug!(lock = %label.name, %error, "release at close failed");
                    error
                })
            }))
            .await;
        results.into_iter().collect::<Result<Vec<()>>>()?;
        Ok(count)
    }

    /// The owner stored with every lock this client takes.
    pub fn owner(&self) -> &Owner {
        &self.inner.owner
    }

    /// A builder for an exclusive lock named `name`; nothing is contacted until
    /// [`acquire`](MutexBuilder::acquire) or [`try_acquire`](MutexBuilder::try_acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://mutex-doc").await?;
    /// let guard = locks.mutex("reports").no_wait().acquire().await?;
    /// # drop(guard);
    /// # Ok(()) }
    /// ```
    pub fn mutex(&self, name: impl Into<String>) -> MutexBuilder {
        MutexBuilder::new(self.clone(), name.into())
    }

    /// A builder for the read-write lock `name`: many readers or one writer, and a waiting
    /// writer is not starved by new readers. See [`RwLockBuilder`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://rwlock-method-doc").await?;
    /// let reading = locks.rwlock("prices").read().await?;
    /// assert!(locks.rwlock("prices").try_read().await?.is_some());
    /// assert!(locks.rwlock("prices").try_write().await?.is_none());
    /// # drop(reading);
    /// # Ok(()) }
    /// ```
    pub fn rwlock(&self, name: impl Into<String>) -> RwLockBuilder {
        RwLockBuilder::new(self.clone(), name.into())
    }

    /// A builder for one permit of the counting semaphore `name` with `permits` permits. See
    /// [`SemaphoreBuilder`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://semaphore-method-doc").await?;
    /// let permit = locks.semaphore("api-quota", 10).acquire().await?;
    /// # drop(permit);
    /// # Ok(()) }
    /// ```
    pub fn semaphore(&self, name: impl Into<String>, permits: u32) -> SemaphoreBuilder {
        SemaphoreBuilder::new(self.clone(), name.into(), permits)
    }

    /// A builder taking every lock in `names` all-or-nothing, in canonical order. See
    /// [`MultiLockBuilder`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://multi-method-doc").await?;
    /// let both = locks.multi_lock(["seat/12A", "seat/12B"]).acquire().await?;
    /// # drop(both);
    /// # Ok(()) }
    /// ```
    pub fn multi_lock<I, S>(&self, names: I) -> MultiLockBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        MultiLockBuilder::new(self.clone(), names.into_iter().map(Into::into).collect())
    }

    /// The versioned value `name`, changed only by atomic compare-and-set. See
    /// [`VersionedValue`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://value-method-doc").await?;
    /// let counter = locks.value("visits");
    /// let next = |n: Option<&[u8]>| n.map_or(1u64, |b| u64::from_le_bytes(b.try_into().unwrap()) + 1);
    /// counter.update(|n| Some(next(n).to_le_bytes().to_vec())).await?;
    /// assert_eq!(counter.get().await?.unwrap().version > 0, true);
    /// # Ok(()) }
    /// ```
    pub fn value(&self, name: impl Into<String>) -> VersionedValue {
        VersionedValue::new(self.clone(), name.into())
    }

    /// The leader election `name`: campaign to lead, publish a value, follow the leader. See
    /// [`Election`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://election-method-doc").await?;
    /// let leading = locks.election("scheduler").campaign(b"node-a").await?;
    /// assert_eq!(locks.election("scheduler").leader().await?.unwrap().term, leading.term());
    /// # Ok(()) }
    /// ```
    pub fn election(&self, name: impl Into<String>) -> Election {
        Election::new(self.clone(), name.into())
    }

    /// The atomic counter `name` on the versioned values: `get`, `add`, `compare_and_set`.
    /// See [`Counter`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://counter-method-doc").await?;
    /// assert_eq!(locks.counter("orders-seen").add(1).await?, 1);
    /// # Ok(()) }
    /// ```
    pub fn counter(&self, name: impl Into<String>) -> Counter {
        Counter::new(self.clone(), name.into())
    }

    /// The count-down latch `name`. See [`CountDownLatch`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://latch-method-doc").await?;
    /// let latch = locks.latch("imports");
    /// assert!(latch.try_set_count(3).await?);
    /// assert_eq!(latch.count().await?, 3);
    /// # Ok(()) }
    /// ```
    pub fn latch(&self, name: impl Into<String>) -> CountDownLatch {
        CountDownLatch::new(self.clone(), name.into())
    }

    /// The barrier `name`: `set`, `remove`, `wait_on`. See [`Barrier`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// use std::time::Duration;
    /// let locks = dlock::connect("memory://barrier-method-doc").await?;
    /// locks.barrier("never-raised").wait_on(Duration::from_secs(1)).await?;
    /// # Ok(()) }
    /// ```
    pub fn barrier(&self, name: impl Into<String>) -> Barrier {
        Barrier::new(self.clone(), name.into())
    }

    /// The double barrier `name` of `participants`: `enter`, then `leave`. See
    /// [`DoubleBarrier`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// use std::time::Duration;
    /// let locks = dlock::connect("memory://double-barrier-method-doc").await?;
    /// let inside = locks.double_barrier("solo-run", 1).enter(Duration::from_secs(1)).await?;
    /// inside.leave(Duration::from_secs(1)).await?;
    /// # Ok(()) }
    /// ```
    pub fn double_barrier(&self, name: impl Into<String>, participants: u32) -> DoubleBarrier {
        DoubleBarrier::new(self.clone(), name.into(), participants)
    }

    /// The backend behind this client: the implementor side, for layers and for tests of the
    /// [`Backend`] contract. Locks taken through it bypass validation and the lease keeper.
    pub fn backend(&self) -> &DynBackend {
        &self.inner.backend
    }

    pub(crate) fn keeper(&self) -> &Keeper {
        &self.inner.keeper
    }

    fn monitor(&self) -> Result<&dyn MonitorStore> {
        self.inner.backend.monitor().ok_or(Error::Unsupported {
            operation: "inspection (inspect, list, force_release)",
            backend: self.info().name,
        })
    }

    /// Who holds `name`, or `None` when it is free.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`]; [`Error::Unsupported`] on a store without inspection; store errors.
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
    /// let locks = dlock::connect("memory://inspect-doc").await?;
    /// assert!(locks.inspect("jobs/nightly").await?.is_none());
    /// let guard = locks.mutex("jobs/nightly").acquire().await?;
    /// let info = locks.inspect("jobs/nightly").await?.unwrap();
    /// assert_eq!(info.fence, guard.fence());
    /// assert_eq!(info.owner.pid, std::process::id());
    /// # Ok(()) }
    /// ```
    pub async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        let name = LockName::new(name)?;
        self.monitor()?.inspect(&name).await
    }

    /// Every held lock whose name starts with `prefix` (`""` for all), as a stream read from the
    /// store page by page (SCAN-style: never one huge reply), in no guaranteed order.
    ///
    /// Errors (bad prefix, unsupported store, store failures) arrive as stream items.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// use futures::TryStreamExt;
    /// let locks = dlock::connect("memory://list-doc").await?;
    /// let _a = locks.mutex("orders/1").acquire().await?;
    /// let _b = locks.mutex("orders/2").acquire().await?;
    /// let _c = locks.mutex("users/1").acquire().await?;
    /// let held: Vec<_> = locks.list("orders/").try_collect().await?;
    /// assert_eq!(held.len(), 2);
    /// # Ok(()) }
    /// ```
    pub fn list(&self, prefix: &str) -> crate::LockStream {
        if prefix.len() > MAX_NAME_LEN || prefix.contains('\0') {
            let error = Error::InvalidName {
                name: prefix.chars().take(80).collect(),
                reason: "prefix is longer than 512 bytes or contains a NUL byte",
            };
            return stream::once(async move { Err(error) }).boxed();
        }
        struct Cursor {
            locks: Locks,
            prefix: String,
            cursor: Option<String>,
            done: bool,
        }
        let start = Cursor {
            locks: self.clone(),
            prefix: prefix.to_owned(),
            cursor: None,
            done: false,
        };
        stream::try_unfold(start, |mut state| async move {
            if state.done {
                return Ok::<_, Error>(None);
            }
            let page = state
                .locks
                .monitor()?
                .list_page(ListQuery {
                    prefix: &state.prefix,
                    cursor: state.cursor.as_deref(),
                    limit: LIST_PAGE,
                })
                .await?;
            state.done = page.cursor.is_none();
            state.cursor = page.cursor;
            Ok(Some((
                stream::iter(page.locks.into_iter().map(Ok::<LockInfo, Error>)),
                state,
            )))
        })
        .try_flatten()
        .boxed()
    }

    /// Breaks the lock `name` whoever holds it. The holder's next renewal or release fails with
    /// [`Error::NotOwned`] and its lost signal fires; the next holder's fence is still greater.
    /// Returns whether the lock was held.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`]; [`Error::Unsupported`] on a store without inspection; store errors.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: if the future is dropped mid-call the lock may or may not be broken.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://break-doc").await?;
    /// let stuck = locks.mutex("import").acquire().await?;
    /// assert!(locks.force_release("import").await?);
    /// assert!(matches!(stuck.release().await, Err(dlock::Error::NotOwned { .. })));
    /// # Ok(()) }
    /// ```
    pub async fn force_release(&self, name: &str) -> Result<bool> {
        let name = LockName::new(name)?;
        self.monitor()?.force_release(&name).await
    }
}
