//! Driver failures mapped onto dlock's errors. What a server's error codes mean is each
//! backend's part; the driver's own failures (I/O, TLS, the pool) read the same everywhere.

use crate::error::Error;

/// What a server's error code says, in dlock's terms.
pub(crate) enum ServerFailure {
    /// The server refused the credentials.
    Unauthenticated,
    /// The user may not do this.
    PermissionDenied,
    /// A table of dlock's name is not dlock's: `key` names it, `detail` says how.
    WrongType { key: String, detail: String },
    /// Worth retrying: the connection, the server or a transaction's luck failed.
    Unavailable,
    /// Anything else: a backend error.
    Other,
}

/// Maps a driver error: `classify` reads the server's code of a database error (`None` when
/// it has none); `connection_options` names the options a configuration error is about.
pub(crate) fn from_driver(
    backend: &'static str,
    connection_options: &'static str,
    error: sqlx::Error,
    classify: impl FnOnce(&sqlx::Error) -> Option<ServerFailure>,
) -> Error {
    let failure = classify(&error).unwrap_or(match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => ServerFailure::Unavailable,
        _ => ServerFailure::Other,
    });
    // Bad connection options are the caller's mistake, not the server's.
    if matches!(error, sqlx::Error::Configuration(_)) {
        return Error::InvalidArgument {
            what: connection_options,
            reason: error.to_string(),
        };
    }
    let source = Box::new(error);
    match failure {
        ServerFailure::Unauthenticated => Error::Unauthenticated { backend, source },
        ServerFailure::PermissionDenied => Error::PermissionDenied { backend, source },
        ServerFailure::WrongType { key, detail } => Error::WrongType {
            backend,
            key,
            detail,
        },
        ServerFailure::Unavailable => Error::Unavailable { backend, source },
        ServerFailure::Other => Error::Backend { backend, source },
    }
}

/// The longest a session-mode grant waits for its fence: each grant holds the counter row for
/// one statement, so only a transaction elsewhere holds it longer, and without a bound it
/// would hold the grant (and its caller) for as long as it lasts.
pub(crate) const SESSION_FENCE_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Session mode's fence statement got no answer within [`SESSION_FENCE_LIMIT`].
pub(crate) fn fence_timed_out(backend: &'static str, table: &str) -> Error {
    Error::Unavailable {
        backend,
        source: format!(
            "no fence within {} (is a transaction holding the counter row of {table}?)",
            humantime::format_duration(SESSION_FENCE_LIMIT)
        )
        .into(),
    }
}

/// Session mode's fence counter row is gone (deleted by hand): refusing is the only safe
/// answer, as starting it again could hand out a fence already given.
pub(crate) fn counter_missing(backend: &'static str, table: &str) -> Error {
    Error::Backend {
        backend,
        source: format!(
            "the fence counter row (name '') of {table} is missing: restore it with a value at \
             or above the highest fence handed out"
        )
        .into(),
    }
}
