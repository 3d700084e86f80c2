//! One lock file: the non-blocking `flock` attempt, the fence counter taken under it, and the
//! hold, kept by the shared session-lock task (`backend/session.rs`) as a SQL session lock is.

use std::fs::{File, OpenOptions};
use std::io::{Error as IoError, ErrorKind};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::backend::session::SessionConn;
use crate::error::{Error, Result};
use crate::lease::keeper::LostReason;
use crate::name::LockName;

use super::error::from_io;
use super::paths;

/// How many times one attempt opens the path again when the file it locked was replaced in
/// the meantime; past that the lock counts as busy this round.
const REOPENS: usize = 8;

/// Opens (creating with mode 0666 less the umask, as `flock(1)` does) the lock file at
/// `path`. Read-only: the lock needs no more, and the file's contents are never dlock's (Python's
/// `filelock` truncates it).
pub(super) fn open_lock(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_CREAT | nix::libc::O_CLOEXEC)
        .open(path)
}

/// Whether `file` is still the file at `path` (not removed, not replaced by another).
pub(super) fn is_at(file: &File, path: &Path) -> std::io::Result<bool> {
    let open = file.metadata()?;
    if open.nlink() == 0 {
        return Ok(false);
    }
    match std::fs::metadata(path) {
        Ok(named) => Ok(named.dev() == open.dev() && named.ino() == open.ino()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// One try for the lock at `path` without waiting. `opened` is the waiter's descriptor, kept
/// between tries so that a waiter's own opens and closes wake no one; it is taken when the
/// lock is, and dropped when the file at the path was replaced.
pub(super) fn try_lock(
    opened: &mut Option<File>,
    path: &Path,
) -> std::io::Result<Option<Flock<File>>> {
    for _ in 0..REOPENS {
        let file = match opened.take() {
            Some(file) => file,
            None => open_lock(path)?,
        };
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => {
                // Taken, but on a file removed or replaced since it was opened: a holder of the
                // file now at the path would not be excluded.
                if is_at(&lock, path)? {
                    return Ok(Some(lock));
                }
            }
            Err((file, Errno::EWOULDBLOCK)) => {
                if is_at(&file, path)? {
                    *opened = Some(file);
                    return Ok(None);
                }
            }
            Err((_, errno)) => return Err(errno.into()),
        }
    }
    Ok(None)
}

/// The record of a fence counter: the last fence, in decimal, padded so that every write is
/// the same 21 bytes at offset 0 (one sector: never torn).
fn record(fence: u64) -> String {
    format!("{fence:020}\n")
}

/// Takes the next fence of the lock whose file is `lock` (relative to `root`): reads the
/// counter file, writes it one higher and flushes it to disk before returning, so fences rise
/// across holders and crashes. Called while holding the lock; the counter's own `flock` keeps
/// two holders of one path out of each other's way even if the lock file was replaced under
/// one of them.
pub(super) fn next_fence(root: &Path, lock: &Path) -> std::io::Result<u64> {
    let rel = paths::fence_path(lock);
    paths::create_parents_durably(root, &rel)?;
    let path = root.join(&rel);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(&path)?;
    let counter =
        Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, errno)| IoError::from(errno))?;
    let mut buf = [0u8; 64];
    let read = counter.read_at(&mut buf, 0)?;
    let last = if read == 0 {
        0
    } else {
        std::str::from_utf8(&buf[..read])
            .ok()
            .and_then(|text| text.trim_end().parse::<u64>().ok())
            .ok_or_else(|| {
                IoError::new(
                    ErrorKind::InvalidData,
                    "the fence counter file holds no number: restore it with a value at or above \
                     the highest fence handed out",
                )
            })?
    };
    let next = last
        .checked_add(1)
        .filter(|next| i64::try_from(*next).is_ok())
        .ok_or_else(|| {
            IoError::new(
                ErrorKind::InvalidData,
                "the fence counter is at its maximum",
            )
        })?;
    counter.write_all_at(record(next).as_bytes(), 0)?;
    counter.sync_data()?;
    if read == 0
        && let Some(dir) = path.parent()
    {
        // A new counter file: its name must survive a crash too.
        File::open(dir)?.sync_all()?;
    }
    Ok(next)
}

/// A held lock file: the descriptor whose `flock` is the lock, until unlocked or closed.
#[derive(Debug)]
pub(super) struct Held {
    lock: Option<Flock<File>>,
    path: PathBuf,
    /// The store's folder, where the values are.
    root: PathBuf,
}

impl Held {
    pub(super) fn new(lock: Flock<File>, path: PathBuf, root: PathBuf) -> Held {
        Held {
            lock: Some(lock),
            path,
            root,
        }
    }

    /// Whether the hold is still the lock of the file at its path.
    fn still_at_path(&self) -> bool {
        self.lock
            .as_ref()
            .is_some_and(|lock| is_at(lock, &self.path).unwrap_or(false))
    }
}

#[async_trait]
impl SessionConn for Held {
    const BACKEND: &'static str = super::BACKEND;
    /// The file was removed or replaced: another process can lock the file now at the path.
    const CHECK_FAILED: LostReason = LostReason::Broken;

    async fn ping(&mut self) -> Result<()> {
        if self.still_at_path() {
            Ok(())
        } else {
            Err(Error::Backend {
                backend: super::BACKEND,
                source: format!("{} was removed or replaced", self.path.display()).into(),
            })
        }
    }

    async fn unlock(&mut self) -> Result<bool> {
        let owned = self.still_at_path();
        // The file is never removed: a waiter holding it open would lock a file that no
        // longer has the path, while a newcomer locks a new one (docs.md, "Caveats").
        drop(self.lock.take());
        Ok(owned)
    }

    /// Under the value file's lock, the hold is checked (still the lock of the file at its
    /// path: a break replaces that file) and the value written, so a break or a new holder's
    /// write comes before the check or after the write.
    async fn put_fenced(&mut self, value: &LockName, bytes: &[u8]) -> Result<Option<u64>> {
        let Some(lock) = &self.lock else {
            return Ok(None);
        };
        // Another descriptor of the same open file: the check needs only its inode.
        let held = lock.try_clone().map_err(|e| from_io(&self.path, e))?;
        let path = self.path.clone();
        let still_held = move || is_at(&held, &path);
        super::values::put_checked(&self.root, value, bytes, still_held).await
    }

    fn recycle(self) {}

    fn discard(self) {}
}
