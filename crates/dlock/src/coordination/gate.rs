//! How coordination waiters wait without each polling the store: they queue on one lock per
//! primitive, the gate. Its holder is the only waiter that reads the state, at a bounded
//! interval; when it sees the wait is over it releases the gate, and the store's own wake-up
//! (pub/sub, NOTIFY, a watch, inotify) hands the gate to the next waiter, which reads once,
//! sees the same and passes it on. A holder that crashes loses the gate with its lease, and
//! the next waiter takes its place, so no waiter depends on another staying alive.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::locks::Locks;
use crate::mutex::MutexGuard;

/// Waits until `done` reads true, queued on the lock `gate`; `Ok(false)` once `deadline`
/// passes. `done` is read before queueing, by every waiter given the gate, and by the gate's
/// holder every `poll`.
pub(super) async fn wait_at_gate<F, Fut>(
    locks: &Locks,
    gate: &str,
    deadline: Instant,
    poll: Duration,
    mut done: F,
) -> Result<bool>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    loop {
        if done().await? {
            return Ok(true);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        let mut queue = locks.mutex(gate).wait(left);
        if locks.info().capabilities.fair {
            queue = queue.fair();
        }
        let held = match queue.acquire().await {
            Ok(held) => held,
            // The loop reads once more, then reports the deadline.
            Err(Error::Timeout { .. }) => continue,
            Err(error) => return Err(error),
        };
        let outcome = keep_gate(&held, deadline, poll, &mut done).await;
        if let Err(error) = held.release().await {
            // The gate's lease frees it for the next waiter anyway.
            tracing::debug!(gate, %error, "releasing a coordination gate failed");
        }
        match outcome {
            Some(outcome) => return outcome,
            // The gate was lost (a long pause): queue again.
            None => continue,
        }
    }
}

/// The gate holder's reads: `None` when the gate was lost before the wait ended.
async fn keep_gate<F, Fut>(
    held: &MutexGuard,
    deadline: Instant,
    poll: Duration,
    done: &mut F,
) -> Option<Result<bool>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    loop {
        match done().await {
            Ok(true) => return Some(Ok(true)),
            Ok(false) => {}
            Err(error) => return Some(Err(error)),
        }
        let now = Instant::now();
        if now >= deadline {
            return Some(Ok(false));
        }
        tokio::select! {
            () = tokio::time::sleep_until(deadline.min(now + poll)) => {}
            () = held.lost() => return None,
        }
    }
}
