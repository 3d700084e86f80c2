#![doc = include_str!("docs.md")]

mod config;
mod error;
mod schema;
mod sql;
mod wake;
mod worker;

pub use config::{MAX_POLL, SqliteConfig};

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, ErrorCode, OpenFlags};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::{
    AcquireRequest, Backend, BackendInfo, Capabilities, Lease, ListPage, LockInfo, MonitorStore,
};
use crate::error::Result;
use crate::fence::FencingToken;
use crate::name::LockName;
use crate::wait::{Attempt, Backoff, acquire_loop};

use error::Error;
use sql::{Request, Tried};
use wake::{WakeFile, Wakers};
use worker::Worker;

/// URL schemes served by this backend.
pub const SQLITE_SCHEMES: &[&str] = &["sqlite"];

const INFO: BackendInfo = BackendInfo::new(
    "sqlite",
    Capabilities {
        reentrant: true,
        fair: true,
        native_wait: true,
        native_loss_signal: false,
        cross_process: true,
        monitor: true,
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
        let config = self.config;
        let open_config = config.clone();
        let (conn, fast) = tokio::task::spawn_blocking(move || {
            // Processes opening a new file at once race to set WAL mode and create the schema,
            // and SQLite reports some of those races as busy without waiting: retry them.
            let deadline = std::time::Instant::now() + open_config.busy_timeout;
            loop {
                let opened =
                    open(&open_config).and_then(|conn| Ok((conn, open_inline(&open_config)?)));
                match opened {
                    Err(e) if e.is_busy() && std::time::Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    other => break other,
                }
            }
        })
        .await
        .map_err(|_| Error::WorkerGone)??;
        Ok(SqliteBackend {
            shared: Arc::new(Shared {
                worker: Worker::start(conn)?,
                inline: Mutex::new(fast),
                checkpoint_queued: Arc::new(AtomicBool::new(false)),
                wake_file: WakeFile::open(&config.path)
                    .map(Arc::new)
                    .inspect_err(|e| tracing::debug!(%e, "no wake file: waiters in other processes will poll"))
                    .ok(),
                watcher: Mutex::new(None),
                config,
                wakers: Wakers::default(),
            }),
        })
    }
}

/// Opens the file, refusing anything that is not (or cannot become) a dlock database.
fn open(config: &SqliteConfig) -> Result<Connection, Error> {
    let path = config.path.as_path();
    let io = |source| Error::Io {
        path: path.to_owned(),
        source,
    };
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => return Err(Error::IsDirectory(path.to_owned())),
        Ok(meta) => {
            // Open it ourselves first: clearer errors than SQLite's for permissions and garbage.
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .map_err(io)?;
            if meta.len() > 0 {
                let mut header = [0u8; 16];
                let read = file.read(&mut header).map_err(io)?;
                if read < 16 || &header != b"SQLite format 3\0" {
                    return Err(Error::NotDlock {
                        path: path.to_owned(),
                        detail: "not a SQLite database".into(),
                    });
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
            if let Some(parent) = parent
                && !parent.is_dir()
            {
                if config.create_dirs {
                    std::fs::create_dir_all(parent).map_err(io)?;
                } else {
                    return Err(Error::MissingDirectory(parent.to_owned()));
                }
            }
        }
        Err(e) => return Err(io(e)),
    }
    let sqlite = Error::sqlite;
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut conn = Connection::open_with_flags(path, flags).map_err(sqlite(path))?;
    conn.busy_timeout(config.busy_timeout)
        .map_err(sqlite(path))?;
    let _mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .map_err(sqlite(path))?;
    // NORMAL is durable across process crashes in WAL mode, which is what a lock file needs.
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(sqlite(path))?;
    schema::ensure(&mut conn, path)?;
    Ok(conn)
}

/// The second connection, for statements run inline on the caller's thread: it never waits
/// for another process's write lock (busy timeout 0: the worker retries those with the real
/// timeout) and never checkpoints (the worker does, in the background), so an inline call is a
/// few microseconds of page-cache work, like a syscall.
fn open_inline(config: &SqliteConfig) -> Result<Connection, Error> {
    let path = config.path.as_path();
    let sqlite = Error::sqlite;
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(sqlite(path))?;
    // Setting up may meet another process creating the file: wait for it like the worker does.
    conn.busy_timeout(config.busy_timeout)
        .map_err(sqlite(path))?;
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(sqlite(path))?;
    conn.pragma_update(None, "wal_autocheckpoint", 0)
        .map_err(sqlite(path))?;
    conn.busy_timeout(Duration::ZERO).map_err(sqlite(path))?;
    conn.wal_hook(Some(note_wal_size));
    Ok(conn)
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

/// WAL size (pages) past which the worker is asked to checkpoint, as SQLite's own
/// auto-checkpoint would (the inline connection has auto-checkpoint off).
const CHECKPOINT_PAGES: std::ffi::c_int = 1000;

/// Set by the inline connections' WAL hook when a commit leaves the WAL past
/// [`CHECKPOINT_PAGES`]; process-wide because the hook is a plain function.
static WAL_NEEDS_CHECKPOINT: AtomicBool = AtomicBool::new(false);

fn note_wal_size(_wal: &rusqlite::hooks::Wal, pages: std::ffi::c_int) -> rusqlite::Result<()> {
    if pages >= CHECKPOINT_PAGES {
        WAL_NEEDS_CHECKPOINT.store(true, Ordering::Relaxed);
    }
    Ok(())
}

#[derive(Debug)]
struct Shared {
    /// Runs what may block: waits for other processes' write locks, checkpoints.
    worker: Worker,
    /// Runs what cannot block, on the caller's thread; see [`open_inline`].
    inline: Mutex<Connection>,
    checkpoint_queued: Arc<AtomicBool>,
    config: SqliteConfig,
    /// Waiters of this process per name: woken at once by releases in this process, and by the
    /// wake file's watcher for releases in others.
    wakers: Wakers,
    /// Rung on every release; `None` if it could not be created (waiters then poll).
    wake_file: Option<Arc<WakeFile>>,
    /// Started with the first waiter; `Some(Err)` if notifications are unavailable here.
    watcher: Mutex<Option<Result<notify::RecommendedWatcher, ()>>>,
}

fn is_busy(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

impl Shared {
    fn path(&self) -> &Path {
        &self.config.path
    }

    /// Runs `op` inline when the inline connection is free and the file is not write-locked by
    /// another process; `None` means "use the worker".
    fn try_inline<T>(
        &self,
        op: &impl Fn(&mut Connection) -> rusqlite::Result<T>,
    ) -> Option<rusqlite::Result<T>> {
        let mut conn = self.inline.try_lock().ok()?;
        let result = op(&mut conn);
        drop(conn);
        if result.as_ref().is_err_and(is_busy) {
            return None;
        }
        if WAL_NEEDS_CHECKPOINT.swap(false, Ordering::Relaxed)
            && !self.checkpoint_queued.swap(true, Ordering::AcqRel)
        {
            let queued = self.checkpoint_queued.clone();
            self.worker.submit(move |conn| {
                // PASSIVE never blocks readers or writers; a failure only delays the next one.
                let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
                queued.store(false, Ordering::Release);
            });
        }
        Some(result)
    }

    /// Runs `op` inline if it can, else on the worker.
    async fn exec<T, F>(&self, op: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: Fn(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        if let Some(result) = self.try_inline(&op) {
            return result.map_err(Error::sqlite(self.path()));
        }
        self.worker
            .call(move |conn| op(conn))
            .await?
            .map_err(Error::sqlite(self.path()))
    }

    /// As [`exec`](Self::exec); if the caller gives up while the worker runs `op`, `undo` runs
    /// on its result. The inline path needs no undo: it has no await to be cancelled at.
    async fn exec_undoable<T, F, U>(&self, op: F, undo: U) -> Result<T, Error>
    where
        T: Send + 'static,
        F: Fn(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
        U: FnOnce(&mut Connection, T) + Send + 'static,
    {
        if let Some(result) = self.try_inline(&op) {
            return result.map_err(Error::sqlite(self.path()));
        }
        self.worker
            .call_undoable(
                move |conn| op(conn),
                move |conn, result| {
                    if let Ok(value) = result {
                        undo(conn, value);
                    }
                },
            )
            .await?
            .map_err(Error::sqlite(self.path()))
    }

    fn subscribe(&self, name: &str) -> watch::Receiver<()> {
        self.watch_other_processes();
        let mut wakers = self.wakers.lock().unwrap_or_else(PoisonError::into_inner);
        wakers
            .entry(name.to_owned())
            .or_insert_with(|| watch::Sender::new(()))
            .subscribe()
    }

    /// What a worker job needs to wake waiters after it freed a lock.
    fn wake_handle(&self) -> WakeHandle {
        WakeHandle {
            wakers: self.wakers.clone(),
            wake_file: self.wake_file.clone(),
        }
    }

    /// Starts the wake-file watcher once, when this process first waits.
    fn watch_other_processes(&self) {
        let Some(wake_file) = &self.wake_file else {
            return;
        };
        let mut watcher = self.watcher.lock().unwrap_or_else(PoisonError::into_inner);
        if watcher.is_none() {
            let started = wake_file.watch(self.wakers.clone()).map_err(|e| {
                tracing::debug!(%e, "cannot watch the wake file: waiters will poll");
            });
            *watcher = Some(started);
        }
    }

    /// A lock was freed: wake its waiters here, and ring the other processes.
    fn wake(&self, name: &str) {
        {
            let mut wakers = self.wakers.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(sender) = wakers.get(name) {
                sender.send_replace(());
                if sender.receiver_count() == 0 {
                    wakers.remove(name);
                }
            }
        }
        if let Some(wake_file) = &self.wake_file {
            wake_file.ring();
        }
    }
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
        let shared = &self.shared;
        let request = Arc::new(Request {
            name: req.name.as_str().to_owned(),
            token: req.token.clone(),
            owner: req.owner.clone(),
            ttl_ms: sql::ms(req.ttl),
            reentrant: req.reentrant,
            fair: req.fair,
            waits: req.wait != crate::Wait::No,
            attempts: AtomicU32::new(0),
            queued: AtomicBool::new(false),
        });
        // Whatever ends this call (timeout, error, the future dropped), leave the queue.
        let mut queued = LeaveQueue {
            shared,
            request: request.clone(),
            armed: true,
        };
        let poll = Backoff::new(shared.config.poll_min, shared.config.poll_max);
        let acquired = acquire_loop(
            req.wait,
            Some(poll),
            || {
                let request = request.clone();
                let shared = shared.clone();
                async move {
                    let start = Instant::now();
                    let job = request.clone();
                    let undo_wake = shared.wake_handle();
                    let tried = shared
                        .exec_undoable(
                            move |conn| sql::try_acquire(conn, &job),
                            // The caller gave up while the worker was acquiring: let go at once.
                            move |conn, tried| {
                                if let Tried::Acquired { fence } = tried
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
                        Tried::Acquired { fence } => Attempt::Acquired(Arc::new(SqliteLease {
                            shared: shared.clone(),
                            name: req.name.as_str().to_owned(),
                            token: req.token.clone(),
                            fence,
                            lost: CancellationToken::new(),
                            start,
                        })),
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
        // The granting transaction already took it out of the queue.
        queued.armed = !matches!(acquired, Ok(Some(_)));
        drop(queued);
        acquired
    }

    fn monitor(&self) -> Option<&dyn MonitorStore> {
        Some(self)
    }
}

#[async_trait]
impl MonitorStore for SqliteBackend {
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let name = name.as_str().to_owned();
        Ok(self
            .shared
            .exec(move |conn| sql::inspect(conn, &name))
            .await?)
    }

    async fn list_page(
        &self,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<ListPage> {
        let prefix = prefix.to_owned();
        let cursor = cursor.unwrap_or_default().to_owned();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let locks = self
            .shared
            .exec(move |conn| sql::list_page(conn, &prefix, &cursor, limit))
            .await?;
        let full = i64::try_from(locks.len()).unwrap_or(i64::MAX) >= limit;
        let next = if full {
            locks.last().map(|l| l.name.clone())
        } else {
            None
        };
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

/// Wakes every waiter, here and in other processes, from a worker job.
struct WakeHandle {
    wakers: Wakers,
    wake_file: Option<Arc<WakeFile>>,
}

impl WakeHandle {
    fn wake_all(&self) {
        wake::wake_all(&self.wakers);
        if let Some(wake_file) = &self.wake_file {
            wake_file.ring();
        }
    }
}

/// Takes a waiter out of the queue when its acquire call ends without the lock.
struct LeaveQueue<'a> {
    shared: &'a Shared,
    request: Arc<Request>,
    armed: bool,
}

impl Drop for LeaveQueue<'_> {
    fn drop(&mut self) {
        // Even if no attempt has queued yet: one may still be waiting in the worker's queue,
        // and this job runs after it.
        if self.armed && self.request.waits {
            let request = self.request.clone();
            let wake = self.shared.wake_handle();
            // Queued, not awaited: Drop cannot wait. If it never runs, the entry goes stale.
            self.shared.worker.submit(move |conn| {
                if sql::leave_queue(conn, &request.name, &request.token).unwrap_or(false) {
                    // Whoever queued behind this waiter may be next now.
                    wake.wake_all();
                }
            });
        }
    }
}

/// One hold of a SQLite lock.
#[derive(Debug)]
struct SqliteLease {
    shared: Arc<Shared>,
    name: String,
    token: String,
    fence: i64,
    lost: CancellationToken,
    start: Instant,
}

#[async_trait]
impl Lease for SqliteLease {
    fn fence(&self) -> FencingToken {
        FencingToken::new(u64::try_from(self.fence).unwrap_or(0))
    }

    fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    fn lease_start(&self) -> Instant {
        self.start
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        let (name, token, fence, ttl_ms) = (
            self.name.clone(),
            self.token.clone(),
            self.fence,
            sql::ms(ttl),
        );
        let owned = self
            .shared
            .exec(move |conn| sql::extend(conn, &name, &token, fence, ttl_ms))
            .await?;
        if !owned {
            return Err(crate::Error::not_owned(&self.name));
        }
        Ok(())
    }

    async fn release(&self) -> Result<()> {
        let (name, token, fence) = (self.name.clone(), self.token.clone(), self.fence);
        let left = self
            .shared
            .exec(move |conn| sql::release(conn, &name, &token, fence))
            .await?;
        match left {
            None => Err(crate::Error::not_owned(&self.name)),
            Some(left) => {
                if left == 0 {
                    self.shared.wake(&self.name);
                }
                Ok(())
            }
        }
    }
}
