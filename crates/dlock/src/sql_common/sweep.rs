//! The clean-up every lease-table client runs now and then: it deletes lock rows whose lease
//! is over and waiter rows gone stale, a bounded batch per statement, so names nobody touches
//! again do not stay in the tables.

use std::future::Future;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::error::Result;

/// How often a client sweeps: rows of ended leases and stale waiters live at most about this
/// long past their end while any client of the table runs.
pub(crate) const SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// The most rows one sweep statement deletes, so a sweep never holds locks on many rows.
pub(crate) const SWEEP_BATCH: i64 = 1000;

/// A client's sweeper task: started with its first acquire (which needs a runtime), again if
/// its runtime went away, and stopped with the client.
#[derive(Debug, Default)]
pub(crate) struct Sweeper {
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Sweeper {
    /// Starts the task unless it runs. `sweep` deletes at most [`SWEEP_BATCH`] rows and says
    /// how many it deleted; a full batch is followed by another at once.
    pub(crate) fn ensure<F, Fut>(&self, stop: &CancellationToken, sweep: F)
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = Result<u64>> + Send,
    {
        let mut slot = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.as_ref().is_some_and(|task| !task.is_finished()) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let stop = stop.clone();
        *slot = Some(runtime.spawn(async move {
            loop {
                // Jittered, so the clients of a table do not sweep in step.
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(jittered(SWEEP_INTERVAL)) => {}
                }
                loop {
                    match sweep().await {
                        Ok(deleted) if deleted >= SWEEP_BATCH.unsigned_abs() => {
                            if stop.is_cancelled() {
                                return;
                            }
                        }
                        Ok(_) => break,
                        Err(error) => {
                            tracing::debug!(%error, "sweeping ended leases failed; next time");
                            break;
                        }
                    }
                }
            }
        }));
    }
}

/// `every` ± 50 %.
fn jittered(every: Duration) -> Duration {
    use rand::Rng as _;
    every.mul_f64(rand::rng().random_range(0.5..1.5))
}
