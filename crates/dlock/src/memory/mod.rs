#![doc = include_str!("docs.md")]

mod acquire;
mod builder;
mod config;
pub(crate) mod driver;
mod lease;
mod monitor;
mod store;
mod values;

pub use builder::MemoryBuilder;
pub use config::MemoryConfig;

use std::sync::Arc;

use async_trait::async_trait;

use crate::backend::abandon::Abandon;
use crate::backend::wait::acquire_loop;
use crate::backend::{
    AcquireRequest, Backend, BackendInfo, Capabilities, Lease, MonitorStore, StoreLease,
    ValueStore, Wait,
};
use crate::error::Result;

use store::Store;

/// URL schemes served by this backend: `memory://` (the process-wide store) and
/// `memory://NAME` (a separate process-wide store per name).
pub const MEMORY_SCHEMES: &[&str] = &["memory"];

const INFO: BackendInfo = BackendInfo::new(
    "memory",
    Capabilities {
        reentrant: true,
        fair: true,
        native_wait: true,
        native_loss_signal: true,
        cross_process: false,
        monitor: true,
        list: true,
        values: true,
        fenced_writes: true,
        permits: false,
        rwlock: false,
    },
);

/// Locks kept in this process's memory: the reference backend, and the right choice when
/// every contender is a task of one process.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::Locks::new(dlock::memory::MemoryBackend::new());
/// let guard = locks.mutex("x").acquire().await?;
/// assert_eq!(guard.fence().get(), 1);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct MemoryBackend {
    store: Arc<Store>,
}

impl MemoryBackend {
    /// A new private store.
    pub fn new() -> MemoryBackend {
        MemoryBackend::default()
    }

    /// Whether two backends share one store.
    pub fn same_store(&self, other: &MemoryBackend) -> bool {
        Arc::ptr_eq(&self.store, &other.store)
    }

    pub(crate) fn from_url(url: &str) -> MemoryBackend {
        let name = url.strip_prefix("memory://").unwrap_or_default();
        MemoryBuilder::new().name(name).build()
    }
}

/// One hold of a memory lock.
type MemoryLease = StoreLease<Store>;

#[async_trait]
impl Backend for MemoryBackend {
    fn info(&self) -> &BackendInfo {
        &INFO
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Arc<dyn Lease>>> {
        crate::ttl::check_store_ttl(req.ttl)?;
        let store = &self.store;
        let waits = req.wait != Wait::No;
        // However this call ends (timeout, or the future dropped), leave the queue.
        let leave = Abandon::on_drop(|| {
            if waits {
                store.leave_queue(req);
            }
        });
        let acquired = acquire_loop(
            req.wait,
            None,
            || std::future::ready(store.try_once(req)),
            || {
                let mut changed = store.subscribe(req.name.as_str());
                async move {
                    // An error means the sender is gone, which cannot happen while the slot
                    // lives; either way, retrying the attempt is the right move.
                    let _ = changed.changed().await;
                }
            },
        )
        .await;
        // A grant already took it out of the queue; only a waiter that gave up must leave.
        if matches!(acquired, Ok(Some(_))) {
            leave.disarm();
        } else {
            leave.undo_now();
        }
        acquired
    }

    fn monitor(&self) -> Option<&dyn MonitorStore> {
        Some(self)
    }

    fn values(&self) -> Option<&dyn ValueStore> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;

    use super::*;

    /// How many distinct names the bounded-state test uses (the issue's figure).
    const NAMES: usize = 100_000;

    /// Takes `name`, which must be free.
    async fn take(locks: &crate::Locks, name: &str) -> crate::MutexGuard {
        let guard = locks.mutex(name).try_acquire().await.unwrap();
        guard.unwrap_or_else(|| panic!("{name} was busy"))
    }

    /// Per-name state is bounded: 100,000 names, each taken and released, or taken by a
    /// holder that vanished without releasing, or waited for by a fair waiter that vanished
    /// while queued (its future forgotten, so no clean-up ran), leave no slot once the leases
    /// and the waiters' places have ended. Tokio's clock is paused, so the leases end without
    /// the test sleeping in real time.
    #[tokio::test(start_paused = true)]
    async fn nothing_per_name_is_left_once_leases_and_waiters_end() {
        let backend = MemoryBackend::new();
        let (holders, waiters) = (
            crate::Locks::new(backend.clone()),
            crate::Locks::new(backend.clone()),
        );
        let ttl = Duration::from_secs(2);
        let done = futures::stream::iter(0..NAMES)
            .map(|i| {
                let (holders, waiters, store) =
                    (holders.clone(), waiters.clone(), backend.store.clone());
                async move {
                    let name = format!("bounded/{i}");
                    let guard = holders.mutex(&name).ttl(ttl).try_acquire().await.unwrap();
                    let guard = guard.unwrap_or_else(|| panic!("{name} was busy"));
                    match i % 3 {
                        0 => guard.release().await.unwrap(),
                        // The holder vanishes: its lease runs out.
                        1 => std::mem::forget(guard),
                        // A fair waiter queues behind the holder, then vanishes.
                        _ => {
                            let mut waiting = Box::pin(
                                waiters
                                    .mutex(&name)
                                    .fair()
                                    .wait(Duration::from_secs(60))
                                    .acquire(),
                            );
                            loop {
                                let polled =
                                    tokio::time::timeout(Duration::from_millis(1), &mut waiting)
                                        .await;
                                assert!(polled.is_err(), "{name}: the waiter got in");
                                let queued = store
                                    .slots()
                                    .get(&name)
                                    .is_some_and(|slot| !slot.queue.is_empty());
                                if queued {
                                    break;
                                }
                            }
                            std::mem::forget(waiting);
                            guard.release().await.unwrap();
                        }
                    }
                }
            })
            .buffer_unordered(64)
            .collect::<Vec<()>>()
            .await;
        assert_eq!(done.len(), NAMES);
        assert!(
            !backend.store.slots().is_empty(),
            "the workload left no state at all to clean up"
        );
        // Every lease and waiter place has ended; the next operation on the store, on any
        // name, cleans up.
        tokio::time::sleep(ttl + Duration::from_secs(5)).await;
        let guard = take(&holders, "another").await;
        guard.release().await.unwrap();
        let left = backend.store.slots().len();
        assert!(left <= 1, "{left} slots left for {NAMES} names");
        // Fences still rise per name across the forgotten slots.
        let again = take(&holders, "bounded/1").await;
        assert!(again.fence().get() > u64::try_from(NAMES).unwrap());
        again.release().await.unwrap();
    }
}
