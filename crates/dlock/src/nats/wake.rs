//! The waiters' wake-up: one watch per client of every lock key of the bucket (a JetStream
//! ordered consumer that delivers changes from its start), its deletes and purges (a release,
//! or the marker the server writes when a key's TTL ends) handed to this client's waiters of
//! that key. One consumer per client, not per waiter: the server caps consumers per stream.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use futures::StreamExt;
use tokio::sync::{OnceCell, watch};
use tokio::task::AbortHandle;

use crate::backend::Wakers;
use crate::error::Result;

use super::error::map;

/// Every lock key of the bucket (see `keys.rs`).
const LOCK_KEYS: &str = "lock.>";

/// Pause before the watch is made again after it failed (a server restarting).
const REWATCH_PAUSE: Duration = Duration::from_millis(200);

/// The client's watch, made at its first wait, and its waiters by key.
#[derive(Debug, Default)]
pub(super) struct Bell {
    wakers: Arc<Wakers>,
    task: OnceCell<AbortHandle>,
}

impl Bell {
    /// Makes the client's watch, at its first wait: in place before the waiter's first
    /// attempt, so no change after that attempt is missed.
    pub(super) async fn start(&self, kv: &kv::Store) -> Result<()> {
        self.task
            .get_or_try_init(|| async {
                let first = kv.watch(LOCK_KEYS).await.map_err(map)?;
                let task = tokio::spawn(ring(kv.clone(), first, self.wakers.clone()));
                Ok::<_, crate::Error>(task.abort_handle())
            })
            .await?;
        Ok(())
    }

    /// A subscription to `key`'s next release or expiry (taken before each attempt).
    pub(super) fn subscribe(&self, key: &str) -> watch::Receiver<()> {
        self.wakers.subscribe(key)
    }
}

impl Drop for Bell {
    fn drop(&mut self) {
        if let Some(task) = self.task.get() {
            task.abort();
        }
    }
}

/// Wakes the waiters of each key deleted or purged; when the watch fails, makes it again and
/// wakes every waiter (a change in the gap would be missed).
async fn ring(kv: kv::Store, mut watch: kv::Watch, wakers: Arc<Wakers>) {
    loop {
        while let Some(entry) = watch.next().await {
            match entry {
                Ok(entry) if entry.operation != kv::Operation::Put => wakers.wake(&entry.key),
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(%error, "the NATS lock watch failed");
                    break;
                }
            }
        }
        loop {
            tokio::time::sleep(REWATCH_PAUSE).await;
            match kv.watch(LOCK_KEYS).await {
                Ok(again) => {
                    watch = again;
                    wakers.wake_all();
                    break;
                }
                Err(error) => {
                    tracing::debug!(%error, "the NATS lock watch could not be made again")
                }
            }
        }
    }
}
