//! Redis failures, mapped onto dlock's semantic errors.

use ::redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::error::Error;

pub(super) const BACKEND: &str = "redis";

/// Maps a redis-rs error to dlock's; `key` names the lock key for type errors.
pub(crate) fn map(error: RedisError, key: &str) -> Error {
    let code = error.code().unwrap_or_default();
    match code {
        // Our scripts' own error for a key that is not dlock's; the detail names the key.
        "DLOCKTYPE" => {
            let detail = error.detail().unwrap_or_default();
            let (key, detail) = detail.split_once(' ').unwrap_or((key, detail));
            return Error::WrongType {
                backend: BACKEND,
                key: key.to_owned(),
                detail: detail.trim().to_owned(),
            };
        }
        "WRONGTYPE" => {
            return Error::WrongType {
                backend: BACKEND,
                key: key.to_owned(),
                detail: "a key of another type is in the way".into(),
            };
        }
        "WRONGPASS" | "NOAUTH" => {
            return Error::Unauthenticated {
                backend: BACKEND,
                source: Box::new(error),
            };
        }
        _ => {}
    }
    match error.kind() {
        ErrorKind::AuthenticationFailed => Error::Unauthenticated {
            backend: BACKEND,
            source: Box::new(error),
        },
        ErrorKind::Server(ServerErrorKind::NoPerm) => Error::PermissionDenied {
            backend: BACKEND,
            source: Box::new(error),
        },
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::ClusterDown,
        )
        | ErrorKind::Io => Error::Unavailable {
            backend: BACKEND,
            source: Box::new(error),
        },
        _ if error.is_io_error()
            || error.is_timeout()
            || error.is_connection_dropped()
            || error.is_connection_refusal()
            || code == "BUSY" =>
        {
            Error::Unavailable {
                backend: BACKEND,
                source: Box::new(error),
            }
        }
        _ => Error::Backend {
            backend: BACKEND,
            source: Box::new(error),
        },
    }
}

/// As [`map`], but a request that timed out says after how long, and how to change it.
pub(crate) fn map_timed(error: RedisError, key: &str, timeout: std::time::Duration) -> Error {
    if error.is_timeout() {
        return Error::Unavailable {
            backend: BACKEND,
            source: format!(
                "no reply within the response timeout of {timeout:?} (set it with ?timeout= in the URL)"
            )
            .into(),
        };
    }
    map(error, key)
}

/// A reply whose shape is not what the script returns: a server speaking another dialect.
pub(crate) fn bad_reply(what: &str) -> Error {
    Error::Backend {
        backend: BACKEND,
        source: format!("unexpected reply to {what}").into(),
    }
}
