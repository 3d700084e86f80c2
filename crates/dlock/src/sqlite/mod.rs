#![doc = include_str!("docs.md")]

mod client;
mod clock;
mod config;
pub(crate) mod driver;
mod error;
mod fork_gate;
mod holders;
mod one_machine;
mod open;
mod schema;
mod sql;
mod values;
mod wake;
mod worker;

pub use config::{MAX_POLL, SqliteConfig};
pub(crate) use open::temp_store_dir;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::backend::abandon::Abandon;
use crate::backend::wait::{Attempt, Backoff, acquire_loop};
use crate::backend::{
    AcquireRequest, Backend, BackendInfo, Capabilities, Expect, Lease, LeaseCore, ListPage,
    ListQuery, LockInfo, MonitorStore, StoreLease, ValueStore, Versioned,
};
use crate::error::Result;
use crate::fence::FencingToken;
use crate::name::LockName;

use client::Shared;

/// One hold of a SQLite lock.
type SqliteLease = StoreLease<Shared>;
use error::Error;
use sql::{Request, Tried};
use wake::{WakeFile, Wakers};
use worker::Worker;

/// URL schemes served by this backend.
pub const SQLITE_SCHEMES: &[&str] = &["sqlite"];

const INFO: BackendInfo = BackendInfo::new(
    "sqlite",
    Capabilities {
        fenced_writes: true,
        ..Capabilities::SHARED_STORE
    },
);

/// Builds a [`SqliteBackend`] from options.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// use std::time::Duration;
/// use dlock::sqlite::SqliteBuilder;
/// let backend = SqliteBuilder::new("/var/lib/app/locks.db")
///     .busy_timeout(Duration::from_secs(2))
///     .build()
///     .await?;
/// let locks = dlock::Locks::new(backend);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct SqliteBuilder {
    config: SqliteConfig,
}

impl SqliteBuilder {
    /// A builder for the database at `path`, other options at their defaults.
    pub fn new(path: impl Into<PathBuf>) -> SqliteBuilder {
        SqliteBuilder {
            config: SqliteConfig {
                path: path.into(),
                ..SqliteConfig::default()
            },
        }
    }

    /// A builder from a full config.
    pub fn from_config(config: SqliteConfig) -> SqliteBuilder {
        SqliteBuilder { config }
    }

    /// See [`SqliteConfig::busy_timeout`].
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.config.busy_timeout = timeout;
        self
    }

    /// See [`SqliteConfig::poll_min`] and [`SqliteConfig::poll_max`].
    pub fn poll(mut self, min: Duration, max: Duration) -> Self {
        self.config.poll_min = min;
        self.config.poll_max = max;
        self
    }

    /// See [`SqliteConfig::create_dirs`].
    pub fn create_dirs(mut self, create: bool) -> Self {
        self.config.create_dirs = create;
        self
    }

    /// Opens (or creates) the database and checks that it is dlock's.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`](crate::Error::InvalidArgument): the path is a directory, or
    ///   its directory does not exist (without `create_dirs`);
    /// - [`Error::PermissionDenied`](crate::Error::PermissionDenied): the file cannot be read and written;
    /// - [`Error::WrongType`](crate::Error::WrongType): the file is not a SQLite database, or a
    ///   database of another application, or of another dlock schema version;
    /// - [`Error::Unavailable`](crate::Error::Unavailable): I/O errors, or locked past the busy timeout.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the file is opened on a blocking thread; a dropped future only wastes it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let backend = dlock::sqlite::SqliteBuilder::new("/var/lib/app/locks.db").create_dirs(true).build().await?;
    /// # Ok(()) }
    /// ```
    pub async fn build(self) -> Result<SqliteBackend> {
        self.config.validate()?;
        fork_gate::register();
        let config = self.config;
        let open_config = config.clone();
        // Opening and reaping are SQLite calls (see `fork_gate`).
        let (conn, fast, holder, reaped) = tokio::task::spawn_blocking(move || fork_gate::inside(|| {
            let (conn, fast) = open::open_both(&open_config)?;
            let mut holder = holders::HolderFile::create(&open_config.path)
                .inspect_err(|e| {
                    tracing::warn!(%e, "no holder file: a crashed holder's locks wait out their lease")
                })
                .ok();
            if let Some(own) = holder.take() {
                match one_machine::refuse_foreign_clients(&open_config.path, &own) {
                    Ok(()) => holder = Some(own),
                    Err(refused) => {
                        own.discard();
                        return Err(refused);
                    }
                }
            }
            let holder = holder.map(Arc::new);
            // Holders that died: free what they held, then delete their files.
            let mut reaped = 0;
            for dead in holder.iter().flat_map(|h| h.dead_holders()) {
                if let Ok(freed) = sql::reap(&conn, &dead) {
                    reaped += freed;
                    if let Some(holder) = &holder {
                        holder.remove(&dead);
                    }
                }
            }
            Ok::<_, Error>((conn, fast, holder, reaped))
        }))
        .await
        .map_err(|_| Error::WorkerGone)??;
        let shared = Arc::new(Shared {
            worker: Worker::start(conn)?,
            inline: Mutex::new(Some(fast)),
            checkpoint_queued: Arc::new(AtomicBool::new(false)),
            next_sweep_ms: std::sync::atomic::AtomicI64::new(0),
            wake_file: WakeFile::open(&config.path)
                .map(Arc::new)
                .inspect_err(
                    |e| tracing::warn!(%e, "no wake file: waiters in other processes will poll"),
                )
                .ok(),
            watcher: Mutex::new(None),
            config,
            wakers: Wakers::default(),
            holder,
            renewals: Default::default(),
        });
        if reaped > 0
            && let Some(wake_file) = &shared.wake_file
        {
            wake_file.ring();
        }
        Ok(SqliteBackend { shared })
    }
}

/// Locks in one SQLite file shared by the processes of a machine: the embedded default.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let dir = tempfile::tempdir().unwrap();
/// let url = format!("sqlite://{}", dir.path().join("locks.db").display());
/// let locks = dlock::connect(&url).await?;
/// let guard = locks.mutex("nightly-report").acquire().await?;
/// assert_eq!(guard.fence().get(), 1);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct SqliteBackend {
    shared: Arc<Shared>,
}

impl SqliteBackend {
    /// Opens the database named by a `sqlite://` URL; see [`SqliteConfig::from_url`].
    ///
    /// # Errors
    ///
    /// As [`SqliteConfig::from_url`] and [`SqliteBuilder::build`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let backend = dlock::sqlite::SqliteBackend::connect_url("sqlite:///var/lib/app/locks.db").await?;
    /// let locks = dlock::Locks::new(backend);
    /// # Ok(()) }
    /// ```
    pub async fn connect_url(url: &str) -> Result<SqliteBackend> {
        SqliteBuilder::from_config(SqliteConfig::from_url(url)?)
            .build()
            .await
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        self.shared.path()
    }
}

#[async_trait]
impl Backend for SqliteBackend {
    fn info(&self) -> &BackendInfo {
        &INFO
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Arc<dyn Lease>>> {
        crate::ttl::check_store_ttl(req.ttl)?;
        let shared = &self.shared;
        let request = Arc::new(Request::new(req, shared.holder.clone()));
        // Whatever ends this call (timeout, error, the future dropped), leave the queue.
        let queued = {
            let request = request.clone();
            Abandon::on_drop(move || leave_queue_on_drop(shared, &request))
        };
        let poll = Backoff::new(shared.config.poll_min, shared.config.poll_max);
        let acquired = acquire_loop(
            req.wait,
            Some(poll),
            || {
                let request = request.clone();
                let shared = shared.clone();
                async move {
                    let (start, start_std) = (Instant::now(), std::time::Instant::now());
                    let job = request.clone();
                    let undo_wake = shared.wake_handle();
                    let tried = shared
                        .exec_undoable(
                            move |conn| sql::try_acquire(conn, &job),
                            // The caller gave up while the worker was acquiring: let go at once.
                            move |conn, tried| {
                                if let Tried::Acquired { fence, .. } = tried
                                    && sql::release(conn, &request.name, &request.token, fence)
                                        .is_ok()
                                {
                                    undo_wake.wake_all();
                                }
                            },
                        )
                        .await?;
                    Ok(match tried {
                        Tried::Busy { free_in_ms } => Attempt::Busy {
                            free_in: free_in_ms
                                .map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
                        },
                        Tried::Acquired { fence, at } => {
                            Attempt::Acquired(Arc::new(SqliteLease::new(
                                shared.clone(),
                                req.name.as_str().to_owned(),
                                req.token.clone(),
                                LeaseCore::new(
                                    FencingToken::from_signed(fence),
                                    clock::lease_start(start, start_std, at),
                                ),
                            )))
                        }
                    })
                }
            },
            || {
                let mut changed = shared.subscribe(req.name.as_str());
                async move {
                    let _ = changed.changed().await;
                }
            },
        )
        .await;
        let got = matches!(acquired, Ok(Some(_)));
        if !got && request.waits && request.queued.load(std::sync::atomic::Ordering::Relaxed) {
            // Leave the queue before answering: the caller's next try must not find this
            // entry ahead of it (a waiter that waited past the starvation threshold goes
            // first). If this is cancelled, `queued` still leaves on drop.
            let leaving = request.clone();
            let left = shared
                .exec(move |conn| sql::leave_queue(conn, &leaving.name, &leaving.token))
                .await;
            if let Ok(true) = left {
                shared.wake_handle().wake_all();
            }
        }
        // The granting transaction already took it out of the queue.
        if got {
            queued.disarm();
        } else {
            queued.undo_now();
        }
        acquired
    }

    fn monitor(&self) -> Option<&dyn MonitorStore> {
        Some(self)
    }

    async fn try_acquire_all(
        &self,
        reqs: &[AcquireRequest],
    ) -> Option<Result<Option<Vec<Arc<dyn Lease>>>>> {
        let requests: Arc<Vec<Request>> = Arc::new(
            reqs.iter()
                .map(|req| Request::new(req, self.shared.holder.clone()))
                .collect(),
        );
        let (start, start_std) = (Instant::now(), std::time::Instant::now());
        let (job, undo_requests) = (requests.clone(), requests.clone());
        let undo_wake = self.shared.wake_handle();
        let tried = self
            .shared
            .exec_undoable(
                move |conn| sql::try_acquire_all(conn, &job),
                // The caller gave up while the worker was acquiring: let go at once.
                move |conn, granted| {
                    let fences = granted.map(|(_, fences)| fences).unwrap_or_default();
                    for (request, fence) in undo_requests.iter().zip(fences) {
                        let _ = sql::release(conn, &request.name, &request.token, fence);
                    }
                    undo_wake.wake_all();
                },
            )
            .await;
        Some(tried.map_err(Into::into).map(|granted| {
            granted.map(|(at, fences)| {
                let lease_start = clock::lease_start(start, start_std, at);
                requests
                    .iter()
                    .zip(fences)
                    .map(|(request, fence)| {
                        Arc::new(SqliteLease::new(
                            self.shared.clone(),
                            request.name.clone(),
                            request.token.clone(),
                            LeaseCore::new(FencingToken::from_signed(fence), lease_start),
                        )) as Arc<dyn Lease>
                    })
                    .collect()
            })
        }))
    }

    fn values(&self) -> Option<&dyn ValueStore> {
        Some(self)
    }
}

#[async_trait]
impl ValueStore for SqliteBackend {
    async fn get(&self, name: &LockName) -> Result<Option<Versioned>> {
        let name = name.as_str().to_owned();
        let read = self
            .shared
            .exec(move |conn| values::get(conn, &name))
            .await?;
        Ok(read.map(|(value, version)| Versioned::new(value, u64::try_from(version).unwrap_or(0))))
    }

    async fn put(&self, name: &LockName, expect: Expect, value: &[u8]) -> Result<Option<u64>> {
        let (name, value) = (name.as_str().to_owned(), value.to_vec());
        let written = self
            .shared
            .exec(move |conn| values::put(conn, &name, expect, &value))
            .await?;
        Ok(written.map(|version| u64::try_from(version).unwrap_or(0)))
    }
}

#[async_trait]
impl MonitorStore for SqliteBackend {
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let name = name.as_str().to_owned();
        Ok(self
            .shared
            .exec({
                let holder = self.shared.holder.clone();
                move |conn| sql::inspect(conn, &name, holder.as_deref())
            })
            .await?)
    }

    async fn list_page(&self, query: ListQuery<'_>) -> Result<ListPage> {
        let (prefix, cursor, limit) = (query.prefix, query.cursor, query.limit);
        let prefix = prefix.to_owned();
        let cursor = cursor.unwrap_or_default().to_owned();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let holder = self.shared.holder.clone();
        let (locks, next) = self
            .shared
            .exec(move |conn| sql::list_page(conn, &prefix, &cursor, limit, holder.as_deref()))
            .await?;
        Ok(ListPage::new(locks, next))
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let job_name = name.as_str().to_owned();
        let broken = self
            .shared
            .exec(move |conn| sql::force_release(conn, &job_name))
            .await?;
        if broken {
            self.shared.wake(name.as_str());
        }
        Ok(broken)
    }
}

/// Takes a waiter out of the queue when its acquire call ends without the lock.
fn leave_queue_on_drop(shared: &Shared, request: &Arc<Request>) {
    // Even if no attempt has queued yet: one may still be waiting in the worker's queue, and
    // this job runs after it.
    if request.waits {
        // Now, inline, when the connection is free: the caller's next try (of this client)
        // must not find its own abandoned entry ahead of it, and a waiter that waited past
        // the starvation threshold goes first.
        let (name, token) = (&request.name, &request.token);
        if let Some(Ok(true)) = shared
            .try_inline(&|conn: &mut rusqlite::Connection| sql::leave_queue(conn, name, token))
        {
            shared.wake_handle().wake_all();
        }
        let request = request.clone();
        let wake = shared.wake_handle();
        // Queued, not awaited: Drop cannot wait. If it never runs, the entry goes stale.
        shared.worker.submit(move |conn| {
            if sql::leave_queue(conn, &request.name, &request.token).unwrap_or(false) {
                // Whoever queued behind this waiter may be next now.
                wake.wake_all();
            }
        });
    }
}

#[async_trait]
impl Lease for SqliteLease {
    fn core(&self) -> &LeaseCore {
        self.lease_core()
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        crate::ttl::check_store_ttl(ttl)?;
        let (name, token, fence, ttl_ms) = (
            self.name().to_owned(),
            self.token().to_owned(),
            self.fence().signed(),
            sql::ms(ttl),
        );
        let gathered = self
            .store()
            .extend_gathered((name.clone(), token.clone(), fence, ttl_ms))
            .await;
        let owned = match gathered {
            Some(owned) => owned,
            None => {
                self.store()
                    .exec(move |conn| sql::extend(conn, &name, &token, fence, ttl_ms))
                    .await?
            }
        };
        if !owned {
            return Err(crate::Error::not_owned(self.name()));
        }
        Ok(())
    }

    async fn put_fenced(&self, value: &LockName, bytes: &[u8]) -> Result<Option<u64>> {
        let (lock, token, fence) = (
            self.name().to_owned(),
            self.token().to_owned(),
            self.fence().signed(),
        );
        let (name, bytes) = (value.as_str().to_owned(), bytes.to_vec());
        let written = self
            .store()
            .exec(move |conn| values::put_fenced(conn, (&lock, &token, fence), &name, &bytes))
            .await?;
        Ok(written.map(|version| u64::try_from(version).unwrap_or(0)))
    }

    async fn release(&self) -> Result<()> {
        let (name, token, fence) = (
            self.name().to_owned(),
            self.token().to_owned(),
            self.fence().signed(),
        );
        let left = self
            .store()
            .exec(move |conn| sql::release(conn, &name, &token, fence))
            .await?;
        match left {
            None => Err(crate::Error::not_owned(self.name())),
            Some(left) => {
                if left == 0 {
                    self.store().wake(self.name());
                }
                Ok(())
            }
        }
    }
}
