//! Coordination primitives built once on the lock layer and the versioned values, for every
//! store: [`Counter`] (`counter.rs`), [`CountDownLatch`] (`latch.rs`), [`Barrier`]
//! (`barrier.rs`) and [`DoubleBarrier`] (`double_barrier.rs`, its shared state in
//! `members.rs`). `gate.rs` is how their waiters wait: on a lock, handed on by the store's
//! wake-ups, with one of them (the gate's holder) reading the state at a bounded interval.
//!
//! # Examples
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> dlock::Result<()> {
//! use std::time::Duration;
//! let locks = dlock::connect("memory://coordination-doc").await?;
//! let started = locks.latch("workers-started");
//! assert!(started.try_set_count(1).await?);
//! started.count_down().await?;
//! started.wait(Duration::from_secs(1)).await?;
//! assert_eq!(locks.counter("jobs-done").add(1).await?, 1);
//! # Ok(()) }
//! ```

mod barrier;
mod counter;
mod double_barrier;
mod gate;
mod latch;
mod members;

use std::time::Duration;

use tokio::time::Instant;

use crate::backend::ValueStore;
use crate::error::{Error, Result};
use crate::locks::Locks;

pub use barrier::{Barrier, BarrierGuard};
pub use counter::Counter;
pub use double_barrier::{DoubleBarrier, Inside, MAX_PARTICIPANTS};
pub use latch::CountDownLatch;

/// How often the one waiter holding a latch's or a double barrier's gate reads the state,
/// unless set otherwise (`poll_interval`); the other waiters wait on the gate's lock.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(50);

/// The store's versioned values, or [`Error::Unsupported`] naming `what` needs them.
fn values<'a>(locks: &'a Locks, what: &'static str) -> Result<&'a dyn ValueStore> {
    let caps = locks.info().capabilities;
    caps.values
        .then(|| locks.backend().values())
        .flatten()
        .ok_or(Error::Unsupported {
            operation: what,
            backend: locks.info().name,
        })
}

/// The instant `timeout` from now, refused when it overflows the clock.
fn deadline(timeout: Duration) -> Result<Instant> {
    Instant::now().checked_add(timeout).ok_or_else(|| {
        Error::invalid_argument(
            "timeout",
            format!("{timeout:?} overflows the clock; pass a shorter timeout"),
        )
    })
}

/// Refuses a zero poll interval (a busy loop) before any store call.
fn check_poll(poll: Duration) -> Result<Duration> {
    if poll.is_zero() {
        return Err(Error::invalid_argument(
            "poll_interval",
            "must be greater than zero",
        ));
    }
    Ok(poll)
}

/// The timeout error of a coordination wait on `name`.
fn timed_out(name: &str, waited: Duration) -> Error {
    Error::Timeout {
        name: name.to_owned(),
        waited,
    }
}
