//! Options of the SQLite backend and how they are read from a URL.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use super::SQLITE_SCHEMES;
use crate::backend::url::StoreUrl;
use crate::error::{Error, Result};

/// The slowest polling allowed (see [`SqliteConfig::poll_max`]).
pub const MAX_POLL: Duration = Duration::from_millis(250);

/// Options of the SQLite backend; every field has a default.
///
/// # Examples
///
/// ```
/// use dlock::sqlite::SqliteConfig;
/// let config = SqliteConfig::from_url("sqlite:///var/lib/app/locks.db?busy_timeout=2s").unwrap();
/// assert_eq!(config.path, std::path::PathBuf::from("/var/lib/app/locks.db"));
/// assert_eq!(config.busy_timeout, std::time::Duration::from_secs(2));
/// ```
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
#[serde(default)]
pub struct SqliteConfig {
    /// The database file, shared by every process that locks through it. Default: `dlock.db`.
    pub path: PathBuf,
    /// How long a statement waits for another process's write transaction before failing with
    /// [`Error::Unavailable`] (URL `busy_timeout`). Default: 5 s.
    pub busy_timeout: Duration,
    /// First delay when polling for a lock held by another process (URL `poll_min`).
    /// Waiters in the same process are woken at once instead. Default: 2 ms.
    pub poll_min: Duration,
    /// Largest polling delay (URL `poll_max`); delays double from `poll_min` with jitter.
    /// At most 250 ms, so a queued waiter keeps its place. Default: 100 ms.
    pub poll_max: Duration,
    /// Create missing parent directories of `path` (URL `create_dirs=true`). Default: false.
    pub create_dirs: bool,
}

impl Default for SqliteConfig {
    fn default() -> Self {
        SqliteConfig {
            path: PathBuf::from("dlock.db"),
            busy_timeout: Duration::from_secs(5),
            poll_min: Duration::from_millis(2),
            poll_max: Duration::from_millis(100),
            create_dirs: false,
        }
    }
}

impl fmt::Debug for SqliteConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteConfig")
            .field("path", &self.path)
            .field("busy_timeout", &self.busy_timeout)
            .field("poll_min", &self.poll_min)
            .field("poll_max", &self.poll_max)
            .field("create_dirs", &self.create_dirs)
            .finish()
    }
}

impl SqliteConfig {
    /// Reads `sqlite://PATH[?option=value&…]`: `sqlite:///abs/locks.db` (three slashes for an
    /// absolute path) or `sqlite://relative/locks.db`. Options: `busy_timeout`, `poll_min`,
    /// `poll_max` (durations such as `250ms`, `5s`) and `create_dirs` (`true`/`false`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for another scheme, an empty path, an unknown option or a bad value.
    pub fn from_url(url: &str) -> Result<SqliteConfig> {
        let parsed = StoreUrl::parse_path(url, SQLITE_SCHEMES, "sqlite://PATH")?;
        let path = parsed.address;
        if path.is_empty() {
            return Err(parsed.invalid(
                "missing database path: use sqlite:///absolute/path.db or sqlite://relative.db",
            ));
        }
        let mut config = SqliteConfig {
            path: PathBuf::from(path),
            ..SqliteConfig::default()
        };
        for option in parsed.options() {
            match option.key {
                "busy_timeout" => config.busy_timeout = option.duration("250ms or 5s")?,
                "poll_min" => config.poll_min = option.duration("250ms or 5s")?,
                "poll_max" => config.poll_max = option.duration("250ms or 5s")?,
                "create_dirs" => config.create_dirs = option.flag()?,
                _ => return Err(option.unknown("busy_timeout, poll_min, poll_max, create_dirs")),
            }
        }
        parsed.validated(config, SqliteConfig::validate)
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.poll_min.is_zero() || self.poll_min > self.poll_max {
            return Err(Error::invalid_argument(
                "poll_min/poll_max",
                "need 0 < poll_min <= poll_max",
            ));
        }
        if self.poll_max > MAX_POLL {
            // A waiter refreshes its place in the queue when it polls; polling slower than this
            // would let its entry go stale and cost it its place.
            return Err(Error::invalid_argument("poll_max", "above 250ms"));
        }
        if self.busy_timeout > Duration::from_secs(3600) {
            return Err(Error::invalid_argument("busy_timeout", "above one hour"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::url::assert_each_url_refused;

    #[test]
    fn parses_paths_and_options() {
        let c = SqliteConfig::from_url("sqlite://rel/x.db?poll_min=1ms&poll_max=20ms&create_dirs")
            .unwrap();
        assert_eq!(c.path, PathBuf::from("rel/x.db"));
        assert_eq!(c.poll_min, Duration::from_millis(1));
        assert_eq!(c.poll_max, Duration::from_millis(20));
        assert!(c.create_dirs);
    }

    #[test]
    fn rejects_bad_urls() {
        assert_each_url_refused(
            SqliteConfig::from_url,
            &[
                "sqlite://",
                "sqlite://?busy_timeout=1s",
                "sqlite:///x.db?bogus=1",
                "sqlite:///x.db?busy_timeout=soon",
                "sqlite:///x.db?poll_min=1s&poll_max=1ms",
                "sqlite:///x.db?create_dirs=maybe",
                "mysql://x",
            ],
        );
    }
}
