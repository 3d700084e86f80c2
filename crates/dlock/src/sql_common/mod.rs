//! What the PostgreSQL and MySQL/MariaDB backends share: the mode and URL options, waiters'
//! in-process wake-ups and queue, the sweep of ended leases, the undo of a grant whose caller went away; the task
//! that keeps a session lock's connection is `backend/session.rs`, shared with the file backend.

mod attempt;
mod backend;
mod error;
pub(crate) mod lease_table;
mod options;
mod queue;
mod schema;
mod store;
mod sweep;

pub use options::Mode;

pub(crate) use crate::backend::Wakers;

pub(crate) use crate::backend::session::{SessionAlarm, SessionConn, SessionLease, SessionWatch};
pub(crate) use attempt::{detached_attempt, ms};
pub(crate) use backend::{SqlBackend, SqlParts, SqlValues};
pub(crate) use error::{
    SESSION_FENCE_LIMIT, ServerFailure, counter_missing, fence_timed_out, from_driver,
};
#[cfg(feature = "mysql")]
pub(crate) use options::DLOCK_OPTIONS;
pub(crate) use options::{Options, check_driver_read, driver_options, split_url, table_or_default};
pub(crate) use queue::{LeaveQueue, QueueSpot, STARVATION_US, WAITER_STALE_MS, queued_hint};
pub(crate) use schema::{Shape, check_shape, values_table, waiters_table};
pub(crate) use store::{ModeStore, SqlStore};
pub(crate) use sweep::{SWEEP_BATCH, Sweeper};

/// The builder methods both SQL backends share (their configs have the same option fields):
/// `new`, `from_config`, `mode`, `table`, `max_connections`, `connect_timeout`,
/// `check_interval`.
macro_rules! sql_builder_setters {
    ($config:ident) => {
        /// A builder for the database at `url` (a driver URL: no dlock options), other options
        /// at their defaults.
        pub fn new(url: impl Into<String>) -> Self {
            Self {
                config: $config {
                    url: url.into(),
                    ..$config::default()
                },
            }
        }

        /// A builder from a full config.
        pub fn from_config(config: $config) -> Self {
            Self { config }
        }

        #[doc = concat!("See [`", stringify!($config), "::mode`].")]
        pub fn mode(mut self, mode: Mode) -> Self {
            self.config.mode = mode;
            self
        }

        #[doc = concat!("See [`", stringify!($config), "::table`].")]
        pub fn table(mut self, table: impl Into<String>) -> Self {
            self.config.table = Some(table.into());
            self
        }

        #[doc = concat!("See [`", stringify!($config), "::max_connections`].")]
        pub fn max_connections(mut self, max: u32) -> Self {
            self.config.max_connections = Some(max);
            self
        }

        #[doc = concat!("See [`", stringify!($config), "::connect_timeout`].")]
        pub fn connect_timeout(mut self, timeout: Duration) -> Self {
            self.config.connect_timeout = timeout;
            self
        }

        #[doc = concat!("See [`", stringify!($config), "::check_interval`].")]
        pub fn check_interval(mut self, interval: Duration) -> Self {
            self.config.check_interval = interval;
            self
        }
    };
}
pub(crate) use sql_builder_setters;
