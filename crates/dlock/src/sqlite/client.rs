//! One client's connections and how statements run on them: inline on the caller's thread
//! when that cannot block, on the worker thread otherwise; and its waiters' wake-ups.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use rusqlite::{Connection, ErrorCode, TransactionBehavior};
use tokio::sync::watch;

use super::config::SqliteConfig;
use super::error::Error;
use super::fork_gate;
use super::holders::{self, HolderFile};
use super::open::take_wal_needs_checkpoint;
use super::wake::{WakeFile, Wakers};
use super::worker::Worker;
use super::{clock, sql};
use crate::backend::gather::Gather;

/// How often a client sweeps while it is used: rows of ended leases and stale waiters stay
/// about this long past their end.
pub(super) const SWEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

#[derive(Debug)]
pub(super) struct Shared {
    /// Runs what may block: waits for other processes' write locks, checkpoints.
    pub(super) worker: Worker,
    /// Runs what cannot block, on the caller's thread; see [`open_inline`]. `None` only while
    /// it closes.
    pub(super) inline: Mutex<Option<Connection>>,
    pub(super) checkpoint_queued: Arc<AtomicBool>,
    /// When this client next sweeps ended leases and stale waiters (ms on the lease clock).
    pub(super) next_sweep_ms: AtomicI64,
    pub(super) config: SqliteConfig,
    /// Waiters of this process per name: woken at once by releases in this process, and by the
    /// wake file's watcher for releases in others.
    pub(super) wakers: Wakers,
    /// Rung on every release; `None` if it could not be created (waiters then poll).
    pub(super) wake_file: Option<Arc<WakeFile>>,
    /// Started with the first waiter; `Some(Err)` if notifications are unavailable here.
    pub(super) watcher: Mutex<Option<Result<notify::RecommendedWatcher, ()>>>,
    /// This client's holder file; `None` if it could not be made (a dead holder's locks then
    /// wait out their lease, as before).
    pub(super) holder: Option<Arc<HolderFile>>,
    /// Extensions gathered into one transaction ([`extend_gathered`](Shared::extend_gathered)).
    pub(super) renewals: Gather<Extension, bool>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Closing is a SQLite call too (see `fork_gate`).
        let inline = self
            .inline
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        fork_gate::inside(|| drop(inline.take()));
    }
}

/// One extension: the lock's name, token, fence and TTL in ms.
pub(super) type Extension = (String, String, i64, i64);

/// Checkpoints the whole WAL and lets the log start over (RESTART, not PASSIVE: with writes
/// going on, a passive checkpoint never lets the log start over, and the WAL grows without
/// bound). RESTART needs a moment with no writer and no reader of the old log; other
/// processes' inline writers take the write lock again within microseconds, so it tries every
/// 100 µs for up to `patience`, not with SQLite's busy handler, whose sleeps grow to 100 ms and
/// miss every such moment.
fn checkpoint(conn: &mut Connection, patience: std::time::Duration) -> rusqlite::Result<()> {
    let deadline = std::time::Instant::now() + patience;
    conn.busy_timeout(std::time::Duration::ZERO)?;
    let result = loop {
        // (busy, frames in the log, frames checkpointed); busy is 1 when it could not finish.
        let busy = conn.query_row("PRAGMA wal_checkpoint(RESTART)", [], |row| {
            row.get::<_, i64>(0)
        });
        let done = match &busy {
            Ok(busy) => *busy == 0,
            Err(error) => !is_busy(error),
        };
        if done || std::time::Instant::now() >= deadline {
            break busy.map(drop);
        }
        std::thread::sleep(std::time::Duration::from_micros(100));
    };
    conn.busy_timeout(patience)?;
    result
}

fn is_busy(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

impl Shared {
    /// Extends a lease with the others that arrive in the same poll (the lease keeper's
    /// renewals of one pass), all in one IMMEDIATE transaction: one commit for all of them.
    /// `None` when the batch could not answer (it failed, or the call that ran it was
    /// dropped): the caller then extends alone, which reports its own error.
    pub(super) async fn extend_gathered(&self, extension: Extension) -> Option<bool> {
        self.renewals
            .request(extension, |batch| async move {
                self.exec(move |conn| {
                    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                    let owned = batch
                        .iter()
                        .map(|(name, token, fence, ttl_ms)| {
                            sql::extend(&tx, name, token, *fence, *ttl_ms)
                        })
                        .collect::<rusqlite::Result<Vec<bool>>>()?;
                    tx.commit()?;
                    Ok(owned)
                })
                .await
                .ok()
            })
            .await
    }

    pub(super) fn path(&self) -> &Path {
        &self.config.path
    }

    /// Runs `op` inline when the inline connection is free, no checkpoint is queued, and the
    /// file is not write-locked by another process; `None` means "use the worker".
    pub(super) fn try_inline<T>(
        &self,
        op: &impl Fn(&mut Connection) -> rusqlite::Result<T>,
    ) -> Option<rusqlite::Result<T>> {
        // While a checkpoint waits on the worker, this client's statements queue behind it
        // there: inline commits back to back kept the writer lock taken nearly all the time,
        // and the checkpoint, sleeping ever longer between tries, let the WAL grow by tens of
        // MiB (CI: the_wal_stays_bounded_under_sustained_locking).
        if self.checkpoint_queued.load(Ordering::Acquire) {
            return None;
        }
        let mut guard = self.inline.try_lock().ok()?;
        let conn = guard.as_mut()?;
        // A mark left by an earlier commit on this thread is that one's, not this client's.
        take_wal_needs_checkpoint();
        let result = fork_gate::inside(|| op(conn));
        let needs_checkpoint = take_wal_needs_checkpoint();
        drop(guard);
        if result.as_ref().is_err_and(is_busy) {
            return None;
        }
        if needs_checkpoint && !self.checkpoint_queued.swap(true, Ordering::AcqRel) {
            let queued = self.checkpoint_queued.clone();
            let patience = self.config.busy_timeout;
            self.worker.submit(move |conn| {
                // A failure only delays the next one.
                let _ = checkpoint(conn, patience);
                queued.store(false, Ordering::Release);
            });
        }
        Some(result)
    }

    /// Runs `op` inline if it can, else on the worker.
    pub(super) async fn exec<T, F>(&self, op: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: Fn(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        self.exec_undoable(op, |_, _| {}).await
    }

    /// As [`exec`](Self::exec); if the caller gives up while the worker runs `op`, `undo` runs
    /// on its result. The inline path needs no undo: it has no await to be cancelled at.
    pub(super) async fn exec_undoable<T, F, U>(&self, op: F, undo: U) -> Result<T, Error>
    where
        T: Send + 'static,
        F: Fn(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
        U: FnOnce(&mut Connection, T) + Send + 'static,
    {
        self.sweep_now_and_then();
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

    /// Queues a sweep on the worker (see [`sql::sweep`]) when the last one is
    /// [`SWEEP_INTERVAL`] old: rows of names nobody takes again go while the client is used.
    /// A full batch is followed by another at once.
    fn sweep_now_and_then(&self) {
        let now = clock::now_ms();
        let due = self.next_sweep_ms.load(Ordering::Relaxed);
        let next =
            now.saturating_add(i64::try_from(SWEEP_INTERVAL.as_millis()).unwrap_or(i64::MAX));
        if now < due
            || self
                .next_sweep_ms
                .compare_exchange(due, next, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        self.worker.submit(|conn| {
            loop {
                match sql::sweep(conn) {
                    Ok(deleted)
                        if i64::try_from(deleted).unwrap_or(i64::MAX) >= sql::SWEEP_BATCH => {}
                    Ok(_) => break,
                    Err(error) => {
                        tracing::debug!(%error, "sweeping ended leases failed; next time");
                        break;
                    }
                }
            }
        });
    }

    pub(super) fn subscribe(&self, name: &str) -> watch::Receiver<()> {
        self.watch_other_processes();
        self.wakers.subscribe(name)
    }

    /// What a worker job needs to wake waiters after it freed a lock.
    pub(super) fn wake_handle(&self) -> WakeHandle {
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
            let holders = self.holder.as_ref().map(|_| holders::dir_of(self.path()));
            let started = wake_file.watch(self.wakers.clone(), holders).map_err(|e| {
                tracing::debug!(%e, "cannot watch the wake file: waiters will poll");
            });
            *watcher = Some(started);
        }
    }

    /// A lock was freed: wake its waiters here, and ring the other processes.
    pub(super) fn wake(&self, name: &str) {
        self.wakers.wake(name);
        if let Some(wake_file) = &self.wake_file {
            wake_file.ring();
        }
    }
}

/// Wakes every waiter, here and in other processes, from a worker job.
pub(super) struct WakeHandle {
    wakers: Wakers,
    wake_file: Option<Arc<WakeFile>>,
}

impl WakeHandle {
    pub(super) fn wake_all(&self) {
        // Each waiter retries its own lock: one cheap read.
        self.wakers.wake_all();
        if let Some(wake_file) = &self.wake_file {
            wake_file.ring();
        }
    }
}
