//! Waiters woken by the kernel when a lock file may have been freed: one inotify instance per
//! process watches the folder of every lock file a waiter waits on, and a close of a lock file
//! (its last descriptor closed, which is when the kernel drops a `flock`, including a dead
//! holder's), or its removal or replacement, wakes that lock's waiters to try again.
//!
//! A thread of its own reads the events, so wake-ups do not depend on any runtime; a child
//! process after a fork starts its own. One instance per process, as the kernel allows a user
//! only a few (128 by default).

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use tokio::sync::watch;

use crate::backend::Wakers;

/// The process's watcher, with the process id it was made in (a forked child has no thread).
static WATCHER: Mutex<Option<(u32, Arc<Watcher>)>> = Mutex::new(None);

/// `mutex`, locked within about 50 ms, or `None`. Not `lock`: a process forked while another
/// of its threads held [`WATCHER`] (making the watcher, a moment) has it locked for good in
/// the child, whose first wait would then hang; there it gets no watcher instead.
fn lock_briefly<T>(mutex: &Mutex<T>) -> Option<std::sync::MutexGuard<'_, T>> {
    for _ in 0..50 {
        match mutex.try_lock() {
            Ok(guard) => return Some(guard),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => return Some(poisoned.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }
    None
}

/// The events that may mean a lock file is free, or is no longer the file at its path.
fn mask() -> AddWatchFlags {
    AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_CLOSE_NOWRITE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_CREATE
}

/// The process's inotify instance, the folders it watches and the waiters it wakes.
#[derive(Debug)]
pub(super) struct Watcher {
    inotify: Inotify,
    folders: Mutex<HashMap<WatchDescriptor, PathBuf>>,
    /// Waiters by their lock file's path.
    wakers: Wakers,
}

/// The key of a lock file's waiters.
fn key(path: &Path) -> String {
    String::from_utf8_lossy(path.as_os_str().as_bytes()).into_owned()
}

impl Watcher {
    /// The process's watcher, started on first use; `None` when inotify cannot be had (the
    /// instance limit reached): waiters then try again at the engine's idle slice.
    pub(super) fn get() -> Option<Arc<Watcher>> {
        let Some(mut slot) = lock_briefly(&WATCHER) else {
            tracing::debug!(
                "the file lock watcher stayed locked (a fork?); waiting at the idle slice"
            );
            return None;
        };
        let pid = std::process::id();
        if let Some((owner, watcher)) = slot.as_ref()
            && *owner == pid
        {
            return Some(watcher.clone());
        }
        let inotify = match Inotify::init(InitFlags::IN_CLOEXEC) {
            Ok(inotify) => inotify,
            Err(error) => {
                tracing::debug!(%error, "no inotify for file lock wake-ups");
                return None;
            }
        };
        let watcher = Arc::new(Watcher {
            inotify,
            folders: Mutex::default(),
            wakers: Wakers::default(),
        });
        let reader = watcher.clone();
        let started = std::thread::Builder::new()
            .name("dlock-file-wake".into())
            .spawn(move || reader.read_events());
        if let Err(error) = started {
            tracing::debug!(%error, "no thread for file lock wake-ups");
            return None;
        }
        *slot = Some((pid, watcher.clone()));
        Some(watcher)
    }

    /// A wake-up for the waiters of the lock file at `path`, its folder watched from now on
    /// (call before the attempt it is to follow). A folder that cannot be watched leaves the
    /// waiter to the engine's idle slice.
    pub(super) fn subscribe(&self, path: &Path) -> watch::Receiver<()> {
        let woken = self.wakers.subscribe(&key(path));
        if let Some(folder) = path.parent() {
            let mut folders = self.folders.lock().unwrap_or_else(PoisonError::into_inner);
            if !folders.values().any(|known| known == folder) {
                match self.inotify.add_watch(folder, mask()) {
                    Ok(wd) => {
                        folders.insert(wd, folder.to_path_buf());
                    }
                    Err(error) => {
                        tracing::debug!(%error, folder = %folder.display(), "cannot watch a lock folder");
                    }
                }
            }
        }
        woken
    }

    /// The thread: reads events for as long as the process lives.
    fn read_events(&self) {
        loop {
            let events = match self.inotify.read_events() {
                Ok(events) => events,
                Err(Errno::EINTR) => continue,
                Err(error) => {
                    tracing::warn!(%error, "file lock wake-ups stopped; waiters retry each second");
                    self.wakers.wake_all();
                    return;
                }
            };
            for event in events {
                if event.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    self.wakers.wake_all();
                    continue;
                }
                let mut folders = self.folders.lock().unwrap_or_else(PoisonError::into_inner);
                if event.mask.contains(AddWatchFlags::IN_IGNORED) {
                    // The folder was removed: watch it again when a waiter needs it.
                    folders.remove(&event.wd);
                    continue;
                }
                if let (Some(folder), Some(name)) = (folders.get(&event.wd), &event.name) {
                    self.wakers.wake(&key(&folder.join(name)));
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(unsafe_code)] // fork(2), waitpid(2) and _exit(2): the child's side of the test
mod tests {
    use super::{WATCHER, Watcher};

    /// A child forked while another thread holds the watcher's slot still gets an answer (no
    /// watcher: it waits at the idle slice) instead of hanging on the slot forever.
    #[test]
    fn a_child_forked_while_the_watcher_is_being_made_does_not_hang() {
        let (locked, release) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let _slot = WATCHER.lock().unwrap();
                locked.wait();
                release.wait();
            });
            locked.wait();
            // SAFETY: the child only asks for the watcher, then leaves with `_exit`.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                let code = i32::from(Watcher::get().is_some());
                unsafe { libc::_exit(code) };
            }
            release.wait();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            let mut status = 0;
            loop {
                // SAFETY: waits for our own child.
                if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
                    break;
                }
                if std::time::Instant::now() >= deadline {
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                        libc::waitpid(pid, &mut status, 0);
                    }
                    panic!("the forked child hung asking for the watcher");
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "the child got a watcher from a slot another thread held: {status}"
            );
        });
    }
}
