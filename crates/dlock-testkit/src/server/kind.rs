//! What a kind of server is (the `ServerKind` trait), how its binary is found, and the errors of
//! starting one.

use std::fmt;
use std::fs;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::process::{CONSOLE_LOG, DEFAULT_START_TIMEOUT};

/// A kind of server the harness can run: Redis, PostgreSQL, MariaDB, etcd, ZooKeeper.
pub trait ServerKind: Send + Sync + fmt::Debug + 'static {
    /// Short name, e.g. `"redis"`; also used for the env override
    /// `DLOCK_TEST_<NAME>_BIN` (uppercased).
    fn name(&self) -> &'static str;

    /// Binary looked up on `PATH` when no env override is set, e.g. `"redis-server"`.
    fn binary(&self) -> &'static str;

    /// One-shot preparation in the (empty) data dir before the first start
    /// (initdb, config files...). Default: nothing.
    fn prepare(&self, _bin: &Path, _dir: &Path, _port: u16) -> io::Result<()> {
        Ok(())
    }

    /// The command that runs the server in the foreground on
    /// `127.0.0.1:port` with its data in `dir`.
    ///
    /// The harness sets stdin, stdout, stderr and the process group itself.
    fn command(&self, bin: &Path, dir: &Path, port: u16) -> Command;

    /// Protocol-level readiness probe (e.g. `PING` -> `+PONG`).
    /// `Ok(true)` = ready; `Ok(false)` or an error = not ready yet.
    fn probe(&self, addr: SocketAddr) -> io::Result<bool>;

    /// Where the server writes its log (default: `dir/server.log`, which the
    /// harness also uses for stdout+stderr).
    fn log_path(&self, dir: &Path) -> PathBuf {
        dir.join(CONSOLE_LOG)
    }

    /// Directories searched for [`binary`](Self::binary) after `PATH` and the sbin
    /// directories (e.g. `/usr/lib/postgresql/15/bin`, which Debian keeps off `PATH`).
    fn search_dirs(&self) -> Vec<PathBuf> {
        Vec::new()
    }

    /// Whether pause, resume and kill must reach every descendant one by one, because the
    /// server's children leave its process group (PostgreSQL backends call `setsid()`).
    fn signals_descendants(&self) -> bool {
        false
    }

    /// The signal for a clean stop when the server is dropped (`SIGINT` for PostgreSQL's fast
    /// shutdown); `None` kills it at once. The harness falls back to SIGKILL after 5 s.
    fn stop_signal(&self) -> Option<libc::c_int> {
        None
    }
}

/// Why a server could not be started or controlled.
#[derive(Debug)]
#[non_exhaustive]
pub enum ServerError {
    /// The server binary is neither set via `DLOCK_TEST_<NAME>_BIN` nor on `PATH`.
    /// Tests usually skip on this (see [`ServerError::is_not_found`] and [`required`]).
    NotFound {
        /// [`ServerKind::name`].
        kind: &'static str,
        /// What was looked for: the env override's value, or [`ServerKind::binary`].
        binary: String,
    },
    /// The server was spawned but exited or did not become ready in time.
    StartFailed {
        /// [`ServerKind::name`].
        kind: &'static str,
        /// What went wrong, e.g. `exited during startup with exit status: 1`.
        reason: String,
        /// The last lines of the server log.
        log_tail: String,
    },
    /// An I/O error in the harness itself (temp dir, spawn, signals...).
    Io {
        /// [`ServerKind::name`].
        kind: &'static str,
        /// The underlying error.
        source: io::Error,
    },
}

impl ServerError {
    /// True for [`ServerError::NotFound`]: the server is not installed.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }

    pub(super) fn io(kind: &'static str) -> impl FnOnce(io::Error) -> Self {
        move |source| Self::Io { kind, source }
    }
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotFound { kind, binary } => write!(
                f,
                "{kind} server binary `{binary}` not found (set {} or put it on PATH)",
                bin_env_var(kind)
            ),
            Self::StartFailed {
                kind,
                reason,
                log_tail,
            } => {
                write!(f, "{kind} server failed to start: {reason}")?;
                if log_tail.trim().is_empty() {
                    write!(f, "\n(server log is empty)")
                } else {
                    write!(f, "\n--- last lines of the server log ---\n{log_tail}")
                }
            }
            Self::Io { kind, source } => write!(f, "{kind} server harness: {source}"),
        }
    }
}

impl std::error::Error for ServerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Env var that overrides the binary of a kind: `DLOCK_TEST_<NAME>_BIN`.
fn bin_env_var(kind_name: &str) -> String {
    format!(
        "DLOCK_TEST_{}_BIN",
        kind_name.to_ascii_uppercase().replace('-', "_")
    )
}

/// Finds the server binary: `DLOCK_TEST_<NAME>_BIN` first (a path, or a bare
/// name looked up on `PATH`), then [`ServerKind::binary`] on `PATH` and in
/// the sbin directories (some distros install servers there).
///
/// ```no_run
/// use dlock_testkit::server::{Redis, find_binary};
///
/// if find_binary(&Redis::default()).is_none() {
///     eprintln!("redis-server not installed, skipping");
/// }
/// ```
pub fn find_binary(kind: &dyn ServerKind) -> Option<PathBuf> {
    let var = bin_env_var(kind.name());
    if let Some(value) = std::env::var_os(&var).filter(|v| !v.is_empty()) {
        let path = PathBuf::from(&value);
        let found = if path.components().count() > 1 {
            is_executable(&path).then_some(path)
        } else {
            search_path(&value)
        };
        if found.is_none() {
            tracing::warn!(%var, value = %value.to_string_lossy(), "server binary override not found");
        }
        // An explicit override that is wrong must not silently fall back to PATH.
        return found;
    }
    search_path(kind.binary().as_ref()).or_else(|| {
        kind.search_dirs()
            .into_iter()
            .map(|dir| dir.join(kind.binary()))
            .find(|candidate| is_executable(candidate))
    })
}

/// What [`ServerError::NotFound`] reports as the binary looked for.
pub(super) fn binary_hint(kind: &dyn ServerKind) -> String {
    std::env::var_os(bin_env_var(kind.name()))
        .filter(|v| !v.is_empty())
        .map(|v| v.to_string_lossy().into_owned())
        .unwrap_or_else(|| kind.binary().to_owned())
}

fn search_path(name: &std::ffi::OsStr) -> Option<PathBuf> {
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path_var)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// True when env `DLOCK_TEST_REQUIRE` is `all` or a comma list containing
/// `kind_name` (case-insensitive): then a missing server must fail the test
/// instead of skipping it.
///
/// ```no_run
/// use dlock_testkit::server::{Redis, find_binary, required};
///
/// if find_binary(&Redis::default()).is_none() {
///     assert!(!required("redis"), "redis-server is required but not found");
///     return; // skip
/// }
/// ```
pub fn required(kind_name: &str) -> bool {
    std::env::var("DLOCK_TEST_REQUIRE").is_ok_and(|list| {
        list.split(',')
            .map(str::trim)
            .any(|item| item.eq_ignore_ascii_case("all") || item.eq_ignore_ascii_case(kind_name))
    })
}

/// Readiness deadline: `DLOCK_TEST_START_TIMEOUT` seconds, or 30 s.
pub(super) fn start_timeout_from_env() -> Duration {
    let Ok(value) = std::env::var("DLOCK_TEST_START_TIMEOUT") else {
        return DEFAULT_START_TIMEOUT;
    };
    match value.trim().parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs > 0.0 => Duration::from_secs_f64(secs),
        _ => {
            tracing::warn!(%value, "ignoring invalid DLOCK_TEST_START_TIMEOUT");
            DEFAULT_START_TIMEOUT
        }
    }
}
