#![doc = include_str!("docs.md")]

mod bell;
mod config;
pub(crate) mod driver;
mod error;
mod lease_table;
mod schema;
mod session;
mod values;

pub use crate::sql_common::Mode;
pub use config::{MYSQL_SCHEMES, MysqlConfig};

use std::sync::Arc;
use std::time::Duration;

use sqlx::mysql::MySqlPoolOptions;

use crate::backend::wait::Backoff;
use crate::backend::{BackendInfo, Capabilities};
use crate::error::Result;

use crate::sql_common::{SqlBackend, SqlParts, SqlStore};
use error::BACKEND;
use lease_table::LeaseStore;
use session::SessionStore;
use values::MysqlValues;

const LEASE_INFO: BackendInfo = BackendInfo::new(
    BACKEND,
    Capabilities {
        // Other clients' waiters are rung by the releaser (the doorbell, `bell.rs`).
        fenced_writes: true,
        ..Capabilities::SHARED_STORE
    },
);

const SESSION_INFO: BackendInfo = BackendInfo::new(
    BACKEND,
    Capabilities {
        reentrant: false,
        fair: false,
        native_loss_signal: true,
        // Not inspected; the server keeps only a hash of each name.
        monitor: false,
        list: false,
        fenced_writes: true,
        ..Capabilities::SHARED_STORE
    },
);

/// Builds a [`MysqlBackend`] from options.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// use dlock::mysql::{Mode, MysqlBuilder};
/// let backend = MysqlBuilder::new("mysql://app@db.internal/app")
///     .mode(Mode::Session)
///     .max_connections(50)
///     .build()
///     .await?;
/// let locks = dlock::Locks::new(backend);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct MysqlBuilder {
    config: MysqlConfig,
}

impl MysqlBuilder {
    crate::sql_common::sql_builder_setters!(MysqlConfig);

    /// See [`MysqlConfig::poll_min`] and [`MysqlConfig::poll_max`].
    pub fn poll(mut self, min: Duration, max: Duration) -> Self {
        self.config.poll_min = min;
        self.config.poll_max = max;
        self
    }

    /// Connects, and creates the table if it is missing (or checks that it is dlock's).
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidUrl`](crate::Error::InvalidUrl) /
    ///   [`Error::InvalidArgument`](crate::Error::InvalidArgument): bad options;
    /// - [`Error::Unauthenticated`](crate::Error::Unauthenticated): the server refused the
    ///   credentials;
    /// - [`Error::PermissionDenied`](crate::Error::PermissionDenied): the user may not create
    ///   or use the table;
    /// - [`Error::WrongType`](crate::Error::WrongType): a table of that name exists with
    ///   another shape;
    /// - [`Error::Unavailable`](crate::Error::Unavailable): the server cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped build leaves at most an empty table behind.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let backend = dlock::mysql::MysqlBuilder::new("mysql://app@db/app").build().await?;
    /// # Ok(()) }
    /// ```
    pub async fn build(self) -> Result<MysqlBackend> {
        let config = self.config;
        config.validate()?;
        let options = config.connect_options()?;
        let pool = MySqlPoolOptions::new()
            .max_connections(config.pool_size())
            .acquire_timeout(config.connect_timeout)
            .idle_timeout(Duration::from_secs(60))
            .connect_lazy_with(options);
        let table = config.table_name().to_owned();
        let values = MysqlValues::new(pool.clone(), &table);
        let store = match config.mode {
            Mode::Lease => {
                schema::ensure_lease(&pool, &table).await?;
                schema::ensure_waiters(&pool, &schema::waiters_table(&table)).await?;
                SqlStore::Lease(LeaseStore::new(
                    pool,
                    &table,
                    Backoff::new(config.poll_min, config.poll_max),
                    values.clone(),
                ))
            }
            Mode::Session => {
                schema::ensure_session(&pool, &table).await?;
                SqlStore::Session(SessionStore::new(
                    pool,
                    &table,
                    config.check_interval,
                    values.clone(),
                ))
            }
        };
        Ok(MysqlBackend {
            inner: Arc::new(SqlParts {
                config,
                store,
                values,
            }),
        })
    }
}

/// Locks in a MySQL or MariaDB database: a lease table (default) or `GET_LOCK` session locks
/// (`?mode=session`).
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::connect("mysql://app@db.internal:3306/app").await?;
/// let guard = locks.mutex("nightly-report").acquire().await?;
/// println!("fence {}", guard.fence());
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct MysqlBackend {
    inner: Arc<Parts>,
}

type Parts = SqlParts<MysqlConfig, LeaseStore, SessionStore, MysqlValues>;

impl MysqlBackend {
    /// Connects to the database named by a `mysql://` or `mariadb://` URL; see
    /// [`MysqlConfig::from_url`].
    ///
    /// # Errors
    ///
    /// As [`MysqlConfig::from_url`] and [`MysqlBuilder::build`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let backend = dlock::mysql::MysqlBackend::connect_url("mysql://app@db/app?mode=session").await?;
    /// let locks = dlock::Locks::new(backend);
    /// # Ok(()) }
    /// ```
    pub async fn connect_url(url: &str) -> Result<MysqlBackend> {
        MysqlBuilder::from_config(MysqlConfig::from_url(url)?)
            .build()
            .await
    }

    /// The configuration in use.
    pub fn config(&self) -> &MysqlConfig {
        &self.inner.config
    }
}

impl SqlBackend for MysqlBackend {
    type Config = MysqlConfig;
    type LeaseTable = LeaseStore;
    type SessionLocks = SessionStore;
    type Values = MysqlValues;

    const NAME: &'static str = BACKEND;

    fn infos() -> (&'static BackendInfo, &'static BackendInfo) {
        (&LEASE_INFO, &SESSION_INFO)
    }

    fn parts(&self) -> &Parts {
        &self.inner
    }
}
