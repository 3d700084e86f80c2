#![doc = include_str!("docs.md")]

mod config;
pub(crate) mod driver;
mod error;
mod lease_table;
mod schema;
mod session;
mod values;

pub use crate::sql_common::Mode;
pub use config::{POSTGRES_SCHEMES, PostgresConfig};

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgPoolOptions;

use crate::backend::{BackendInfo, Capabilities};
use crate::error::Result;

use crate::sql_common::{SqlBackend, SqlParts, SqlStore};
use error::BACKEND;
use lease_table::LeaseStore;
use session::SessionStore;
use values::PgValues;

const LEASE_INFO: BackendInfo = BackendInfo::new(
    BACKEND,
    Capabilities {
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
        // The server keeps only a hash of each name.
        list: false,
        fenced_writes: true,
        ..Capabilities::SHARED_STORE
    },
);

/// Builds a [`PostgresBackend`] from options.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// use dlock::postgres::{Mode, PostgresBuilder};
/// let backend = PostgresBuilder::new("postgres://app@db.internal/app")
///     .mode(Mode::Session)
///     .max_connections(50)
///     .build()
///     .await?;
/// let locks = dlock::Locks::new(backend);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct PostgresBuilder {
    config: PostgresConfig,
}

impl PostgresBuilder {
    crate::sql_common::sql_builder_setters!(PostgresConfig);

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
    /// let backend = dlock::postgres::PostgresBuilder::new("postgres://app@db/app").build().await?;
    /// # Ok(()) }
    /// ```
    pub async fn build(self) -> Result<PostgresBackend> {
        let config = self.config;
        config.validate()?;
        let options = config.connect_options()?;
        let pool = PgPoolOptions::new()
            .max_connections(config.pool_size())
            .acquire_timeout(config.connect_timeout)
            .idle_timeout(Duration::from_secs(60))
            .connect_lazy_with(options);
        let table = config.table_name().to_owned();
        let values = PgValues::new(pool.clone(), &table);
        let store = match config.mode {
            Mode::Lease => {
                schema::ensure_lease(&pool, &table).await?;
                let waiters = schema::waiters_table(&table);
                schema::ensure(
                    &pool,
                    &waiters,
                    &schema::waiters_ddl(&waiters),
                    schema::WAITERS_SHAPE,
                )
                .await?;
                schema::ensure_index(&pool, &waiters, "seen").await?;
                SqlStore::Lease(LeaseStore::new(pool, &table, values.clone()))
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
        Ok(PostgresBackend {
            inner: Arc::new(SqlParts {
                config,
                store,
                values,
            }),
        })
    }
}

/// Locks in a PostgreSQL database: a lease table (default) or advisory locks
/// (`?mode=session`).
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::connect("postgres://app@db.internal:5432/app").await?;
/// let guard = locks.mutex("nightly-report").acquire().await?;
/// println!("fence {}", guard.fence());
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct PostgresBackend {
    inner: Arc<Parts>,
}

type Parts = SqlParts<PostgresConfig, LeaseStore, SessionStore, PgValues>;

impl PostgresBackend {
    /// Connects to the database named by a `postgres://` URL; see
    /// [`PostgresConfig::from_url`].
    ///
    /// # Errors
    ///
    /// As [`PostgresConfig::from_url`] and [`PostgresBuilder::build`].
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
    /// let backend = dlock::postgres::PostgresBackend::connect_url("postgres://app@db/app?mode=session").await?;
    /// let locks = dlock::Locks::new(backend);
    /// # Ok(()) }
    /// ```
    pub async fn connect_url(url: &str) -> Result<PostgresBackend> {
        PostgresBuilder::from_config(PostgresConfig::from_url(url)?)
            .build()
            .await
    }

    /// The configuration in use.
    pub fn config(&self) -> &PostgresConfig {
        &self.inner.config
    }
}

impl SqlBackend for PostgresBackend {
    type Config = PostgresConfig;
    type LeaseTable = LeaseStore;
    type SessionLocks = SessionStore;
    type Values = PgValues;

    const NAME: &'static str = BACKEND;

    fn infos() -> (&'static BackendInfo, &'static BackendInfo) {
        (&LEASE_INFO, &SESSION_INFO)
    }

    fn parts(&self) -> &Parts {
        &self.inner
    }
}
