//! Options of the PostgreSQL backend and how they are read from a URL.

use std::fmt;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;

use crate::error::Result;
use crate::sql_common::{self, Mode};

/// URL schemes served by this backend.
pub const POSTGRES_SCHEMES: &[&str] = &["postgres", "postgresql"];

/// dlock's own URL options for PostgreSQL (the rest go to the driver).
const DLOCK_OPTIONS: &[&str] = &[
    "mode",
    "table",
    "connect_timeout",
    "max_connections",
    "check_interval",
];

/// The driver's (sqlx's) URL options that are passed through.
const DRIVER_OPTIONS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// Options of the PostgreSQL backend; every field but the URL has a default.
///
/// # Examples
///
/// ```
/// use dlock::postgres::{Mode, PostgresConfig};
/// let config = PostgresConfig::from_url(
///     "postgres://app:secret@db.internal:5432/app?mode=session&sslmode=require",
/// )
/// .unwrap();
/// assert_eq!(config.mode, Mode::Session);
/// assert_eq!(config.url, "postgres://app:secret@db.internal:5432/app?sslmode=require");
/// assert!(!format!("{config:?}").contains("secret"));
/// ```
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
#[serde(default)]
pub struct PostgresConfig {
    /// The connection URL as the driver reads it (`postgres://user:password@host:port/db`
    /// with driver options such as `sslmode`), without dlock's options. Shown redacted.
    pub url: String,
    /// Lease table or session locks (URL `mode=lease|session`). Default: lease table.
    pub mode: Mode,
    /// The table (URL `table`): the lease table in lease mode (default `dlock_locks`), the
    /// fence counters in session mode (default `dlock_fences`). Created on first use, in the
    /// connection's current schema.
    pub table: Option<String>,
    /// How long to wait for a connection (URL `connect_timeout`). Default: 5 s.
    pub connect_timeout: Duration,
    /// Most connections of the client's pool (URL `max_connections`). In session mode every
    /// held lock keeps one connection, so this is also the most locks one client can hold
    /// (and the server's `max_connections` bounds all clients together). Default: 20 in
    /// lease mode, 100 in session mode.
    pub max_connections: Option<u32>,
    /// Session mode: how often a held lock's connection is checked, so the lost signal fires
    /// when it dies (at most a third of the lease). Default: 1 s.
    pub check_interval: Duration,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig::with_options(
            "postgres://localhost/postgres".into(),
            sql_common::Options::default(),
        )
    }
}

impl fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.options()
            .debug_config(f, "PostgresConfig", &self.url, false)
    }
}

impl PostgresConfig {
    /// Reads `postgres://[user[:password]@]host[:port]/database[?option=value&…]`
    /// (also `postgresql://`). dlock's options: `mode` (`lease` or `session`), `table`,
    /// `connect_timeout`, `max_connections`, `check_interval`; the driver's: `sslmode`,
    /// `sslrootcert`, `sslcert`, `sslkey`, `application_name`, `options`,
    /// `statement-cache-capacity`, `host`, `port`, `dbname`, `user`, `password`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`](crate::Error::InvalidUrl) for another scheme, an unknown option, a
    /// bad value, or a URL the driver cannot read.
    pub fn from_url(url: &str) -> Result<PostgresConfig> {
        let (options, driver_url) = sql_common::split_url(
            url,
            POSTGRES_SCHEMES,
            "postgres",
            DLOCK_OPTIONS,
            DRIVER_OPTIONS,
        )?;
        let config = PostgresConfig::with_options(driver_url, options);
        sql_common::check_driver_read(url, config.connect_options())?;
        Ok(config)
    }

    pub(super) fn validate(&self) -> Result<()> {
        self.options().validate()
    }

    /// The config of the driver URL `url` with `options`.
    fn with_options(url: String, options: sql_common::Options) -> PostgresConfig {
        PostgresConfig {
            url,
            mode: options.mode,
            table: options.table,
            connect_timeout: options.connect_timeout,
            max_connections: options.max_connections,
            check_interval: options.check_interval,
        }
    }

    /// The options every SQL backend has, as this config sets them.
    fn options(&self) -> sql_common::Options {
        sql_common::Options {
            mode: self.mode,
            table: self.table.clone(),
            connect_timeout: self.connect_timeout,
            max_connections: self.max_connections,
            check_interval: self.check_interval,
            ..sql_common::Options::default()
        }
    }

    pub(super) fn connect_options(&self) -> Result<PgConnectOptions> {
        sql_common::driver_options(&self.url)
    }

    pub(super) fn pool_size(&self) -> u32 {
        self.options().pool_size()
    }

    pub(super) fn table_name(&self) -> &str {
        sql_common::table_or_default(self.table.as_deref(), self.mode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::url::assert_each_url_refused;

    #[test]
    fn parses_modes_and_options() {
        let c = PostgresConfig::from_url("postgresql://u@h/db?table=t1&max_connections=3").unwrap();
        assert_eq!(c.mode, Mode::Lease);
        assert_eq!(c.table_name(), "t1");
        assert_eq!(c.max_connections, Some(3));
        assert_eq!(c.url, "postgres://u@h/db");
        let s = PostgresConfig::from_url("postgres://u@h/db?mode=session").unwrap();
        assert_eq!(s.table_name(), "dlock_fences");
    }

    #[test]
    fn rejects_bad_urls() {
        assert_each_url_refused(
            PostgresConfig::from_url,
            &[
                "postgres://u@h/db?poll_max=1s",
                "postgres://u@h/db?sslmode=sometimes",
                "postgres://u@h/db?nope",
                "postgres://u@h:99999/db",
                "mysql://u@h/db",
            ],
        );
    }
}
