//! Options of the MySQL/MariaDB backend and how they are read from a URL.

use std::fmt;
use std::time::Duration;

use sqlx::mysql::MySqlConnectOptions;

use crate::error::Result;
use crate::sql_common::{self, Mode};

/// URL schemes served by this backend.
pub const MYSQL_SCHEMES: &[&str] = &["mysql", "mariadb"];

/// The driver's (sqlx's) URL options that are passed through.
const DRIVER_OPTIONS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslca",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "charset",
    "collation",
    "statement-cache-capacity",
    "socket",
];

/// Options of the MySQL/MariaDB backend; every field but the URL has a default.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use dlock::mysql::{Mode, MysqlConfig};
/// let config = MysqlConfig::from_url("mariadb://app:secret@db:3306/app?poll_max=50ms").unwrap();
/// assert_eq!(config.mode, Mode::Lease);
/// assert_eq!(config.poll_max, Duration::from_millis(50));
/// assert_eq!(config.url, "mysql://app:secret@db:3306/app");
/// assert!(!format!("{config:?}").contains("secret"));
/// ```
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
#[serde(default)]
pub struct MysqlConfig {
    /// The connection URL as the driver reads it (`mysql://user:password@host:port/db` with
    /// driver options such as `ssl-mode`), without dlock's options. Shown redacted.
    pub url: String,
    /// Lease table or session locks (URL `mode=lease|session`). Default: lease table.
    pub mode: Mode,
    /// The table (URL `table`): the lease table in lease mode (default `dlock_locks`), the
    /// fence counters in session mode (default `dlock_fences`). Created on first use in the
    /// URL's database.
    pub table: Option<String>,
    /// How long to wait for a connection (URL `connect_timeout`). Default: 5 s.
    pub connect_timeout: Duration,
    /// Most connections of the client's pool (URL `max_connections`). In session mode every
    /// held lock keeps one connection. Default: 20 in lease mode, 100 in session mode.
    pub max_connections: Option<u32>,
    /// Session mode: how often a held lock's connection is checked (at most a third of the
    /// lease). Default: 1 s.
    pub check_interval: Duration,
    /// Lease mode: first delay when polling a lock held by another client (URL `poll_min`);
    /// waiters in the same client are woken at once. Default: 5 ms.
    pub poll_min: Duration,
    /// Lease mode: largest polling delay (URL `poll_max`), at most 10 s. Default: 250 ms.
    pub poll_max: Duration,
}

impl Default for MysqlConfig {
    fn default() -> Self {
        MysqlConfig::with_options(
            "mysql://localhost/dlock".into(),
            sql_common::Options::default(),
        )
    }
}

impl fmt::Debug for MysqlConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.options()
            .debug_config(f, "MysqlConfig", &self.url, true)
    }
}

impl MysqlConfig {
    /// Reads `mysql://[user[:password]@]host[:port]/database[?option=value&…]` (also
    /// `mariadb://`). dlock's options: `mode` (`lease` or `session`), `table`,
    /// `connect_timeout`, `max_connections`, `check_interval`, `poll_min`, `poll_max`; the
    /// driver's: `ssl-mode`, `ssl-ca`, `ssl-cert`, `ssl-key`, `charset`, `collation`,
    /// `statement-cache-capacity`, `socket`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`](crate::Error::InvalidUrl) for another scheme, an unknown option, a
    /// bad value, or a URL the driver cannot read.
    pub fn from_url(url: &str) -> Result<MysqlConfig> {
        let (options, driver_url) = sql_common::split_url(
            url,
            MYSQL_SCHEMES,
            "mysql",
            sql_common::DLOCK_OPTIONS,
            DRIVER_OPTIONS,
        )?;
        let config = MysqlConfig::with_options(driver_url, options);
        sql_common::check_driver_read(url, config.connect_options())?;
        Ok(config)
    }

    pub(super) fn validate(&self) -> Result<()> {
        self.options().validate()
    }

    /// The config of the driver URL `url` with `options`.
    fn with_options(url: String, options: sql_common::Options) -> MysqlConfig {
        MysqlConfig {
            url,
            mode: options.mode,
            table: options.table,
            connect_timeout: options.connect_timeout,
            max_connections: options.max_connections,
            check_interval: options.check_interval,
            poll_min: options.poll_min,
            poll_max: options.poll_max,
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
            poll_min: self.poll_min,
            poll_max: self.poll_max,
        }
    }

    pub(super) fn connect_options(&self) -> Result<MySqlConnectOptions> {
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
        let c = MysqlConfig::from_url("mysql://u@h/db?mode=session&check_interval=200ms").unwrap();
        assert_eq!(c.mode, Mode::Session);
        assert_eq!(c.check_interval, Duration::from_millis(200));
        assert_eq!(c.table_name(), "dlock_fences");
    }

    #[test]
    fn rejects_bad_urls() {
        assert_each_url_refused(
            MysqlConfig::from_url,
            &[
                "mysql://u@h/db?sslmode=sometimes",
                "mysql://u@h/db?nope=1",
                "mysql://u@h/db?mode=",
                "mysql://u@h:99999/db",
                "postgres://u@h/db",
            ],
        );
    }
}
