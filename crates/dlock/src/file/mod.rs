#![doc = include_str!("docs.md")]

mod builder;
mod config;
pub(crate) mod driver;
mod error;
mod lock_file;
mod paths;
mod values;
mod wake;

pub use builder::FileBuilder;
pub use config::FileConfig;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use tokio::time::Instant;

use crate::backend::session::{SessionAlarm, SessionLease};
use crate::backend::wait::{Attempt, acquire_loop};
use crate::backend::{
    AcquireRequest, Backend, BackendInfo, Capabilities, Lease, LockKind, ValueStore, Wait,
};
use crate::error::{Error, Result};

use error::{from_io, thread_gone};
use lock_file::{Held, next_fence, try_lock};
use wake::Watcher;

/// URL schemes served by this backend: `file:///ABSOLUTE/DIR`.
pub const FILE_SCHEMES: &[&str] = &["file"];

const BACKEND: &str = "file";

const INFO: BackendInfo = BackendInfo::new(
    BACKEND,
    Capabilities {
        // A `flock` has no owner to count re-entries by, and no queue.
        reentrant: false,
        fair: false,
        // Another process's `flock` can be neither inspected nor broken.
        monitor: false,
        list: false,
        fenced_writes: true,
        ..Capabilities::SHARED_STORE
    },
);

/// Locks that are the kernel's `flock` on files of one folder: the lock named `N` is the one
/// `flock(1)`, Python's `filelock` and `portalocker` take on `DIR/N`, so dlock and those
/// programs exclude each other.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// let locks = dlock::Locks::new(dlock::file::FileBuilder::new(dir.path()).build()?);
/// let guard = locks.mutex("reports/daily").acquire().await?; // flock on DIR/reports/daily
/// assert!(guard.fence().get() >= 1);
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct FileBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: FileConfig,
    /// The bell of the shared session-lock task; never rung here (a file's hold is checked at
    /// its cadence), but the task listens for one.
    alarm: SessionAlarm,
}

impl FileBackend {
    /// The folder of the lock files.
    pub fn dir(&self) -> &Path {
        &self.inner.config.dir
    }

    /// The options this backend was built with.
    pub fn config(&self) -> &FileConfig {
        &self.inner.config
    }

    /// The lock file of `req`, its folders made.
    fn prepare(&self, req: &AcquireRequest) -> Result<(PathBuf, PathBuf)> {
        crate::ttl::check_store_ttl(req.ttl)?;
        if req.kind != LockKind::Exclusive {
            return Err(Error::Unsupported {
                operation: "native semaphores and read-write locks",
                backend: BACKEND,
            });
        }
        if req.reentrant || req.fair {
            return Err(Error::Unsupported {
                operation: if req.fair {
                    "fair locks"
                } else {
                    "reentrant locks"
                },
                backend: BACKEND,
            });
        }
        let rel = paths::lock_path(req.name.as_str()).map_err(|reason| Error::InvalidName {
            name: req.name.as_str().chars().take(80).collect(),
            reason,
        })?;
        let path = self.dir().join(&rel);
        if let Some(folder) = path.parent() {
            std::fs::create_dir_all(folder).map_err(|e| from_io(folder, e))?;
        }
        Ok((rel, path))
    }

    /// One attempt: the `flock` without waiting, then the fence on a blocking thread. A call
    /// dropped while the fence is written drops the hold with the thread's result, which closes
    /// the file and so frees the lock.
    async fn attempt(
        &self,
        req: &AcquireRequest,
        opened: &Mutex<Option<File>>,
        (rel, path): (&Path, &Path),
    ) -> Result<Attempt> {
        let start = Instant::now();
        let locked = {
            let mut opened = opened.lock().unwrap_or_else(PoisonError::into_inner);
            try_lock(&mut opened, path).map_err(|e| from_io(path, e))?
        };
        let Some(lock) = locked else {
            return Ok(Attempt::Busy { free_in: None });
        };
        let (root, lock_rel) = (self.dir().to_path_buf(), rel.to_path_buf());
        let (fence, lock) =
            tokio::task::spawn_blocking(move || (next_fence(&root, &lock_rel), lock))
                .await
                .map_err(thread_gone)?;
        let fence = fence.map_err(|e| from_io(&self.dir().join(paths::fence_path(rel)), e))?;
        let lease = SessionLease::start(
            Held::new(lock, path.to_path_buf(), self.dir().to_path_buf()),
            req.name.as_str().to_owned(),
            i64::try_from(fence).unwrap_or(i64::MAX),
            start,
            req.ttl,
            self.inner.config.check_interval,
            self.inner.alarm.subscribe(),
        );
        Ok(Attempt::Acquired(Arc::new(lease)))
    }
}

#[async_trait]
impl Backend for FileBackend {
    fn info(&self) -> &BackendInfo {
        &INFO
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Arc<dyn Lease>>> {
        let (rel, path) = self.prepare(req)?;
        let watcher = (req.wait != Wait::No).then(Watcher::get).flatten();
        // The waiter's descriptor, kept between attempts (closed when the call ends).
        let opened = Mutex::new(None);
        acquire_loop(
            req.wait,
            None,
            || self.attempt(req, &opened, (&rel, &path)),
            || {
                let woken = watcher.as_ref().map(|w| w.subscribe(&path));
                async move {
                    match woken {
                        Some(mut woken) => {
                            let _ = woken.changed().await;
                        }
                        // No inotify: the engine's idle slice tries again.
                        None => std::future::pending().await,
                    }
                }
            },
        )
        .await
    }

    fn values(&self) -> Option<&dyn ValueStore> {
        Some(self)
    }
}
