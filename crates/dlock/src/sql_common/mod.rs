//! What the PostgreSQL and MySQL/MariaDB backends share: the mode and URL options, waiters'
//! in-process wake-ups and queue, the sweep of ended leases, the undo of a grant whose caller went away, and the task
//! that keeps a session lock's connection.

mod attempt;
mod backend;
mod error;
mod options;
mod queue;
mod schema;
mod session;
mod store;
mod sweep;

pub use options::Mode;

pub(crate) use attempt::{detached_attempt, fence, ms};
pub(crate) use backend::{SqlBackend, SqlParts, SqlValues};
pub(crate) use error::{ServerFailure, from_driver};
pub(crate) use options::{DLOCK_OPTIONS, Options, default_max_connections, split_url};
pub(crate) use queue::{
    LeaveQueue, QueueSpot, STARVATION_US, WAITER_STALE_MS, Wakers, queued_hint,
};
pub(crate) use schema::{Shape, check_shape, values_table, waiters_table};
pub(crate) use session::{SessionAlarm, SessionConn, SessionLease, SessionWatch, counter_missing};
pub(crate) use store::{ModeStore, SqlStore};
pub(crate) use sweep::{SWEEP_BATCH, Sweeper};
