//! Cross-process wake-ups. A release writes a few bytes to `<db>-wake`; every process with a
//! waiter watches that file (inotify on Linux, kqueue / FSEvents elsewhere, through `notify`)
//! and retries at once. Polling stays as the fallback for file systems without notifications.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher};

/// Waiters of this process, by lock name, shared with the wake-file watcher.
pub(super) type Wakers = Arc<crate::backend::Wakers>;

/// The wake file of one database, kept open for cheap writes.
#[derive(Debug)]
pub(super) struct WakeFile {
    path: PathBuf,
    file: File,
    rings: AtomicU64,
}

impl WakeFile {
    /// Opens (or creates) `<db>-wake` beside the database. A symlink at that path is refused
    /// (`ELOOP`), never followed: whoever planted it would have every release write to the
    /// file it points at.
    pub(super) fn open(db: &Path) -> std::io::Result<WakeFile> {
        let mut name = db.as_os_str().to_owned();
        name.push("-wake");
        let path = PathBuf::from(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&path)?;
        Ok(WakeFile {
            path,
            file,
            rings: AtomicU64::new(0),
        })
    }

    /// Tells every watching process that a lock was freed.
    pub(super) fn ring(&self) {
        let n = self.rings.fetch_add(1, Ordering::Relaxed);
        // A failed write only costs the watchers their early wake-up: polling still runs.
        let _ = self.file.write_at(&n.to_le_bytes(), 0);
    }

    /// Starts watching: every change to the file wakes every waiter in `wakers`, and so does
    /// the last close of a holder file in `holders` (its holder let go of it, or died: the
    /// kernel closes a dead process's files), so a waiter probes a dead holder at once.
    pub(super) fn watch(
        &self,
        wakers: Wakers,
        holders: Option<PathBuf>,
    ) -> notify::Result<notify::RecommendedWatcher> {
        let holders_dir = holders.clone();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                let relevant = event.is_ok_and(|e| {
                    let of_holders = holders_dir
                        .as_ref()
                        .is_some_and(|dir| e.paths.iter().any(|p| p.starts_with(dir)));
                    if of_holders {
                        // Not opens, creations or probes (read-only closes): only a holder
                        // that wrote-opened its file and closed it.
                        matches!(
                            e.kind,
                            EventKind::Access(AccessKind::Close(AccessMode::Write))
                        )
                    } else {
                        matches!(
                            e.kind,
                            EventKind::Modify(_) | EventKind::Create(_) | EventKind::Any
                        )
                    }
                });
                if relevant {
                    wakers.wake_all();
                }
            })?;
        watcher.watch(&self.path, RecursiveMode::NonRecursive)?;
        if let Some(dir) = &holders
            && let Err(e) = watcher.watch(dir, RecursiveMode::NonRecursive)
        {
            // Waiters still probe on every poll; they only lose the instant wake-up.
            tracing::debug!(%e, "cannot watch the holder files");
        }
        Ok(watcher)
    }
}
