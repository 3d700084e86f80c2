//! The options every SQL backend reads from its URL, and their checks.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::backend::url::StoreUrl;
use crate::error::{Error, Result, redact_url};

/// How a SQL backend holds a lock; chosen per client with the URL option `mode`.
///
/// # Examples
///
/// ```
/// # #[cfg(feature = "postgres")] {
/// use dlock::postgres::{Mode, PostgresConfig};
/// let config = PostgresConfig::from_url("postgres://app@db/locks?mode=session").unwrap();
/// assert_eq!(config.mode, Mode::Session);
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Mode {
    /// A row per lock in a lease table (`mode=lease`, the default): expiry by the database's
    /// clock, reentrant, works through transaction-mode connection poolers.
    #[default]
    Lease,
    /// A server-side session lock (`mode=session`): PostgreSQL advisory locks or MySQL
    /// `GET_LOCK`, held by a dedicated connection; freed by the server when that connection
    /// dies.
    Session,
}

/// Options every SQL backend reads from its URL, next to the driver's own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Options {
    pub(crate) mode: Mode,
    pub(crate) table: Option<String>,
    pub(crate) connect_timeout: Duration,
    pub(crate) max_connections: Option<u32>,
    pub(crate) check_interval: Duration,
    pub(crate) poll_min: Duration,
    pub(crate) poll_max: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mode: Mode::Lease,
            table: None,
            connect_timeout: Duration::from_secs(5),
            max_connections: None,
            check_interval: Duration::from_secs(1),
            poll_min: Duration::from_millis(5),
            poll_max: Duration::from_millis(250),
        }
    }
}

/// The options dlock reads (and removes from the URL before the driver sees it).
pub(crate) const DLOCK_OPTIONS: &[&str] = &[
    "mode",
    "table",
    "connect_timeout",
    "max_connections",
    "check_interval",
    "poll_min",
    "poll_max",
];

/// Splits `url` into dlock's options and the URL the driver gets: `scheme` replaces the URL's
/// scheme (`mariadb` → `mysql`), and only `driver_options` may remain in the query.
pub(crate) fn split_url(
    url: &str,
    schemes: &[&str],
    scheme: &str,
    dlock_options: &[&str],
    driver_options: &[&str],
) -> Result<(Options, String)> {
    let parsed = StoreUrl::parse(url, schemes, &format!("{scheme}://USER@HOST:PORT/DATABASE"))?;
    if parsed.fragment.is_some() {
        return Err(parsed.invalid("a fragment in the URL"));
    }
    if parsed.address.is_empty() {
        return Err(parsed.invalid("missing host"));
    }
    let mut options = Options::default();
    let mut kept = Vec::new();
    for option in parsed.options() {
        let key = option.key;
        if DLOCK_OPTIONS.contains(&key) && !dlock_options.contains(&key) {
            return Err(parsed.invalid(format!(
                "option {key:?} has no meaning for the {scheme} backend (its options: {})",
                dlock_options.join(", ")
            )));
        }
        match key {
            "mode" => {
                options.mode =
                    option.choice(&[("lease", Mode::Lease), ("session", Mode::Session)])?
            }
            "table" => {
                check_identifier(option.raw)
                    .map_err(|reason| parsed.invalid(format!("option table: {reason}")))?;
                options.table = Some(option.raw.to_owned());
            }
            "connect_timeout" => options.connect_timeout = option.duration("250ms or 5s")?,
            "check_interval" => options.check_interval = option.duration("250ms or 5s")?,
            "poll_min" => options.poll_min = option.duration("250ms or 5s")?,
            "poll_max" => options.poll_max = option.duration("250ms or 5s")?,
            "max_connections" => options.max_connections = Some(option.number()?),
            _ if driver_options.contains(&key) => kept.push(option.pair),
            _ => {
                return Err(option.unknown(&format!(
                    "dlock: {}; driver: {}",
                    dlock_options.join(", "),
                    driver_options.join(", ")
                )));
            }
        }
    }
    parsed.checked(options.validate())?;
    let mut driver_url = format!("{scheme}://{}", parsed.address);
    if !kept.is_empty() {
        driver_url.push('?');
        driver_url.push_str(&kept.join("&"));
    }
    Ok((options, driver_url))
}

impl Options {
    pub(crate) fn validate(&self) -> Result<()> {
        if self.poll_min.is_zero() || self.poll_min > self.poll_max {
            return Err(Error::invalid_argument(
                "poll_min/poll_max",
                "need 0 < poll_min <= poll_max",
            ));
        }
        if self.poll_max > Duration::from_secs(10) {
            return Err(Error::invalid_argument("poll_max", "above 10s"));
        }
        if self.connect_timeout.is_zero() || self.connect_timeout > Duration::from_secs(3600) {
            return Err(Error::invalid_argument(
                "connect_timeout",
                "must be between 1ms and 1h",
            ));
        }
        if self.check_interval < Duration::from_millis(10)
            || self.check_interval > Duration::from_secs(3600)
        {
            return Err(Error::invalid_argument(
                "check_interval",
                "must be between 10ms and 1h",
            ));
        }
        if self
            .max_connections
            .is_some_and(|max| max == 0 || max > 10_000)
        {
            return Err(Error::invalid_argument(
                "max_connections",
                "must be between 1 and 10000",
            ));
        }
        if let Some(table) = &self.table {
            check_identifier(table).map_err(|reason| Error::invalid_argument("table", reason))?;
        }
        Ok(())
    }
}

impl Options {
    /// The pool size: `max_connections`, or the mode's default.
    pub(crate) fn pool_size(&self) -> u32 {
        self.max_connections
            .unwrap_or_else(|| default_max_connections(self.mode))
    }

    /// The debug form of the config `name` these options are from: its driver URL redacted,
    /// then the options, `poll_min` and `poll_max` only where the backend has them.
    pub(crate) fn debug_config(
        &self,
        f: &mut fmt::Formatter<'_>,
        name: &str,
        url: &str,
        with_poll: bool,
    ) -> fmt::Result {
        let mut config = f.debug_struct(name);
        config
            .field("url", &redact_url(url))
            .field("mode", &self.mode)
            .field("table", &self.table)
            .field("connect_timeout", &self.connect_timeout)
            .field("max_connections", &self.max_connections)
            .field("check_interval", &self.check_interval);
        if with_poll {
            config
                .field("poll_min", &self.poll_min)
                .field("poll_max", &self.poll_max);
        }
        config.finish()
    }
}

/// The table a config names, or the mode's default: `dlock_locks` for the lease table,
/// `dlock_fences` for session mode's fence counter.
pub(crate) fn table_or_default(table: Option<&str>, mode: Mode) -> &str {
    table.unwrap_or(match mode {
        Mode::Lease => "dlock_locks",
        Mode::Session => "dlock_fences",
    })
}

/// The driver's connect options read from a driver URL (one without dlock's options).
///
/// # Errors
///
/// [`Error::InvalidUrl`], naming `driver_url` redacted, when the driver cannot read it.
pub(crate) fn driver_options<O>(driver_url: &str) -> Result<O>
where
    O: FromStr<Err: fmt::Display>,
{
    O::from_str(driver_url).map_err(|e| Error::InvalidUrl {
        url: redact_url(driver_url),
        reason: e.to_string(),
    })
}

/// A URL the user gave, whose driver URL the driver could not read (`read`): the error names
/// the URL as the user wrote it.
pub(crate) fn check_driver_read<O>(url: &str, read: Result<O>) -> Result<()> {
    read.map(drop).map_err(|e| Error::InvalidUrl {
        url: redact_url(url),
        reason: match e {
            Error::InvalidUrl { reason, .. } => reason,
            other => other.to_string(),
        },
    })
}

/// A table name is spliced into SQL unquoted, so only plain identifiers are accepted, and
/// only in lowercase: PostgreSQL folds unquoted names to lowercase while the shape checks look
/// them up as written, and MySQL keeps or folds their case by server setting.
pub(crate) fn check_identifier(name: &str) -> std::result::Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let rest_ok = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !first_ok || name.len() > 48 || !rest_ok {
        let capitals = if name.chars().any(|c| c.is_ascii_uppercase()) {
            " (capitals are refused: the servers fold or keep an unquoted name's case \
             differently; write it in lowercase)"
        } else {
            ""
        };
        return Err(format!(
            "{name:?} is not a plain lowercase identifier (a-z, digits and _, at most 48, not \
             starting with a digit){capitals}"
        ));
    }
    Ok(())
}

/// The pool size when none is given: a lease-table client needs a few connections; a
/// session-mode client keeps one per held lock.
fn default_max_connections(mode: Mode) -> u32 {
    match mode {
        Mode::Lease => 20,
        Mode::Session => 100,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_dlock_options_from_driver_options() {
        let (options, driver) = split_url(
            "mariadb://u:p@h:3306/db?mode=session&ssl-mode=disabled&table=my_locks&poll_max=1s",
            &["mysql", "mariadb"],
            "mysql",
            DLOCK_OPTIONS,
            &["ssl-mode"],
        )
        .unwrap();
        assert_eq!(options.mode, Mode::Session);
        assert_eq!(options.table.as_deref(), Some("my_locks"));
        assert_eq!(options.poll_max, Duration::from_secs(1));
        assert_eq!(driver, "mysql://u:p@h:3306/db?ssl-mode=disabled");
    }

    #[test]
    fn rejects_bad_options() {
        for url in [
            "postgres://h/db?mode=maybe",
            "postgres://h/db?bogus=1",
            "postgres://h/db?table=x;drop",
            "postgres://h/db?table=1abc",
            "postgres://h/db?table=MyLocks",
            "postgres://h/db?poll_min=1s&poll_max=1ms",
            "postgres://h/db?connect_timeout=soon",
            "postgres://h/db?max_connections=0",
            "postgres://",
            "redis://h",
        ] {
            let result = split_url(url, &["postgres"], "postgres", DLOCK_OPTIONS, &["sslmode"]);
            assert!(matches!(result, Err(Error::InvalidUrl { .. })), "{url}");
        }
    }
}
