#![doc = include_str!("docs.md")]

mod config;
mod error;
mod schema;
mod worker;

pub use config::SqliteConfig;

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::{
    AcquireRequest, Backend, BackendInfo, Capabilities, Lease, ListPage, LockInfo, MonitorStore,
};
use crate::error::Result;
use crate::fence::FencingToken;
use crate::name::{LockName, Owner};
use crate::wait::{Attempt, Backoff, acquire_loop};

use error::Error;
use worker::Worker;

/// URL schemes served by this backend.
pub const SQLITE_SCHEMES: &[&str] = &["sqlite"];

const INFO: BackendInfo = BackendInfo::new(
    "sqlite",
    Capabilities {
        reentrant: true,
        fair: false,
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
    pub async fn build(self) -> Result<SqliteBackend> {
        self.config.validate()?;
        let config = self.config;
        let open_config = config.clone();
        let conn = tokio::task::spawn_blocking(move || open(&open_config))
            .await
            .map_err(|_| Error::WorkerGone)??;
        Ok(SqliteBackend {
            shared: Arc::new(Shared {
                worker: Worker::start(conn)?,
                config,
                wakers: Mutex::default(),
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

#[derive(Debug)]
struct Shared {
    worker: Worker,
    config: SqliteConfig,
    /// In-process waiters per name, woken at once by releases from this process.
    wakers: Mutex<HashMap<String, watch::Sender<()>>>,
}

impl Shared {
    fn path(&self) -> &Path {
        &self.config.path
    }

    fn subscribe(&self, name: &str) -> watch::Receiver<()> {
        let mut wakers = self.wakers.lock().unwrap_or_else(PoisonError::into_inner);
        wakers
            .entry(name.to_owned())
            .or_insert_with(|| watch::Sender::new(()))
            .subscribe()
    }

    fn wake(&self, name: &str) {
        let mut wakers = self.wakers.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = wakers.get(name) {
            sender.send_replace(());
            if sender.receiver_count() == 0 {
                wakers.remove(name);
            }
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

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn from_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// The outcome of one attempt, computed on the worker thread.
enum Tried {
    Acquired { fence: i64 },
    Busy { free_in_ms: i64 },
}

/// One acquisition attempt: a plain read first, so polling a held lock never takes the write
/// lock, then an IMMEDIATE transaction that re-checks and writes.
fn try_once(conn: &mut Connection, req: &Request) -> rusqlite::Result<Tried> {
    let held = "SELECT token, expires_at FROM dlock_locks WHERE name = ?1";
    let blocks = |row: Option<(Option<String>, i64)>, now: i64| -> Option<i64> {
        match row {
            Some((Some(token), expires_at))
                if expires_at > now && !(req.reentrant && token == req.token) =>
            {
                Some(expires_at - now)
            }
            _ => None,
        }
    };
    let row = conn
        .query_row(held, [&req.name], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    if let Some(free_in_ms) = blocks(row, now_ms()) {
        return Ok(Tried::Busy { free_in_ms });
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now = now_ms();
    let row: Option<(Option<String>, i64)> = tx
        .query_row(held, [&req.name], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    if let Some(free_in_ms) = blocks(row.clone(), now) {
        return Ok(Tried::Busy { free_in_ms });
    }
    let expires_at = now.saturating_add(req.ttl_ms);
    let fence: i64 = match row {
        Some((Some(token), live_until)) if live_until > now && token == req.token => tx.query_row(
            "UPDATE dlock_locks SET holds = holds + 1, expires_at = MAX(expires_at, ?2)
             WHERE name = ?1 RETURNING fence",
            params![req.name, expires_at],
            |r| r.get(0),
        )?,
        _ => tx.query_row(
            "INSERT INTO dlock_locks (name, fence, token, holds, expires_at, acquired_at, owner_label, host, pid)
             VALUES (?1, 1, ?2, 1, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (name) DO UPDATE SET
                 fence = fence + 1, token = excluded.token, holds = 1, expires_at = excluded.expires_at,
                 acquired_at = excluded.acquired_at, owner_label = excluded.owner_label,
                 host = excluded.host, pid = excluded.pid
             RETURNING fence",
            params![req.name, req.token, expires_at, now, req.owner.label, req.owner.host, req.owner.pid],
            |r| r.get(0),
        )?,
    };
    tx.commit()?;
    Ok(Tried::Acquired { fence })
}

/// Decrements the hold count; frees the row at zero. `Ok(None)` = not owned.
fn release(
    conn: &Connection,
    name: &str,
    token: &str,
    fence: i64,
) -> rusqlite::Result<Option<i64>> {
    conn.query_row(
        "UPDATE dlock_locks SET holds = holds - 1,
             token = CASE WHEN holds > 1 THEN token ELSE NULL END,
             expires_at = CASE WHEN holds > 1 THEN expires_at ELSE 0 END
         WHERE name = ?1 AND token = ?2 AND fence = ?3 AND expires_at > ?4
         RETURNING holds",
        params![name, token, fence, now_ms()],
        |r| r.get(0),
    )
    .optional()
}

/// What the worker needs of an [`AcquireRequest`], owned so it can cross to the thread.
#[derive(Clone, Debug)]
struct Request {
    name: String,
    token: String,
    owner: Owner,
    ttl_ms: i64,
    reentrant: bool,
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
            ttl_ms: ms(req.ttl),
            reentrant: req.reentrant,
        });
        let poll = Backoff::new(shared.config.poll_min, shared.config.poll_max);
        acquire_loop(
            req.wait,
            Some(poll),
            || {
                let request = request.clone();
                let shared = shared.clone();
                async move {
                    let start = Instant::now();
                    let job_request = request.clone();
                    let path = shared.path().to_owned();
                    let tried = shared
                        .worker
                        .call_undoable(
                            move |conn| try_once(conn, &job_request),
                            // The caller gave up while we were acquiring: let go at once.
                            move |conn, tried| {
                                if let Ok(Tried::Acquired { fence }) = tried {
                                    let _ = release(conn, &request.name, &request.token, fence);
                                }
                            },
                        )
                        .await?
                        .map_err(Error::sqlite(&path))?;
                    Ok(match tried {
                        Tried::Busy { free_in_ms } => Attempt::Busy {
                            free_in: Some(Duration::from_millis(
                                u64::try_from(free_in_ms).unwrap_or(0),
                            )),
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
        .await
    }

    fn monitor(&self) -> Option<&dyn MonitorStore> {
        Some(self)
    }
}

type InfoRow = (
    String,
    i64,
    i64,
    i64,
    i64,
    Option<String>,
    Option<String>,
    Option<i64>,
);

const INFO_COLUMNS: &str = "name, fence, holds, expires_at, acquired_at, owner_label, host, pid";

fn info_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<InfoRow> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
    ))
}

fn to_info(row: InfoRow, now: i64) -> LockInfo {
    let (name, fence, holds, expires_at, acquired_at, label, host, pid) = row;
    LockInfo::new(
        name,
        FencingToken::new(u64::try_from(fence).unwrap_or(0)),
        Owner::new(
            label,
            host.unwrap_or_default(),
            pid.and_then(|p| u32::try_from(p).ok()).unwrap_or(0),
        ),
        from_ms(acquired_at),
        Some(Duration::from_millis(
            u64::try_from(expires_at - now).unwrap_or(0),
        )),
        u32::try_from(holds).unwrap_or(0),
    )
}

#[async_trait]
impl MonitorStore for SqliteBackend {
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let name = name.as_str().to_owned();
        let path = self.path().to_owned();
        let row = self
            .shared
            .worker
            .call(move |conn| {
                let now = now_ms();
                conn.query_row(
                    &format!(
                        "SELECT {INFO_COLUMNS} FROM dlock_locks
                             WHERE name = ?1 AND token IS NOT NULL AND expires_at > ?2"
                    ),
                    params![name, now],
                    info_row,
                )
                .optional()
                .map(|row| row.map(|row| to_info(row, now)))
            })
            .await?
            .map_err(Error::sqlite(&path))?;
        Ok(row)
    }

    async fn list_page(
        &self,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<ListPage> {
        let prefix = prefix.to_owned();
        let cursor = cursor.unwrap_or_default().to_owned();
        let path = self.path().to_owned();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let locks = self
            .shared
            .worker
            .call(move |conn| -> rusqlite::Result<Vec<LockInfo>> {
                let now = now_ms();
                // The primary key orders by name, so each page is a range scan from the cursor.
                let mut stmt = conn.prepare_cached(&format!(
                    "SELECT {INFO_COLUMNS} FROM dlock_locks
                         WHERE name >= ?1 AND name > ?2 AND substr(name, 1, length(?1)) = ?1
                           AND token IS NOT NULL AND expires_at > ?3
                         ORDER BY name LIMIT ?4"
                ))?;
                let rows = stmt.query_map(params![prefix, cursor, now, limit], info_row)?;
                rows.map(|row| row.map(|row| to_info(row, now))).collect()
            })
            .await?
            .map_err(Error::sqlite(&path))?;
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
        let path = self.path().to_owned();
        let changed = self
            .shared
            .worker
            .call(move |conn| {
                conn.execute(
                    "UPDATE dlock_locks SET token = NULL, holds = 0, expires_at = 0
                         WHERE name = ?1 AND token IS NOT NULL AND expires_at > ?2",
                    params![job_name, now_ms()],
                )
            })
            .await?
            .map_err(Error::sqlite(&path))?;
        if changed > 0 {
            self.shared.wake(name.as_str());
        }
        Ok(changed > 0)
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
        let (name, token, fence) = (self.name.clone(), self.token.clone(), self.fence);
        let ttl_ms = ms(ttl);
        let changed = self
            .shared
            .worker
            .call(move |conn| {
                let now = now_ms();
                conn.execute(
                    "UPDATE dlock_locks SET expires_at = MAX(expires_at, ?4 + ?5)
                         WHERE name = ?1 AND token = ?2 AND fence = ?3 AND expires_at > ?4",
                    params![name, token, fence, now, ttl_ms],
                )
            })
            .await?
            .map_err(Error::sqlite(self.shared.path()))?;
        if changed == 0 {
            return Err(crate::Error::not_owned(&self.name));
        }
        Ok(())
    }

    async fn release(&self) -> Result<()> {
        let (name, token, fence) = (self.name.clone(), self.token.clone(), self.fence);
        let left = self
            .shared
            .worker
            .call(move |conn| release(conn, &name, &token, fence))
            .await?
            .map_err(Error::sqlite(self.shared.path()))?;
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
