//! MySQL's and MariaDB's failures, mapped onto dlock's semantic errors.

use sqlx::mysql::MySqlDatabaseError;

use crate::error::Error as DlockError;

const BACKEND: &str = "mysql";

/// What can go wrong in the MySQL backend.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error(transparent)]
    Sql(#[from] sqlx::Error),
    /// A table of the configured name exists but is not dlock's.
    #[error("table {table}: {detail}")]
    Foreign { table: String, detail: String },
}

impl From<Error> for DlockError {
    fn from(error: Error) -> DlockError {
        match error {
            Error::Foreign { table, detail } => DlockError::WrongType {
                backend: BACKEND,
                key: table,
                detail,
            },
            Error::Sql(source) => from_sqlx(source),
        }
    }
}

/// The server's error number, if the error came from the server.
pub(crate) fn number(error: &sqlx::Error) -> Option<u16> {
    match error {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<MySqlDatabaseError>()
            .map(MySqlDatabaseError::number),
        _ => None,
    }
}

/// Maps a driver error by the server's error number.
pub(crate) fn from_sqlx(error: sqlx::Error) -> DlockError {
    let unavailable = |source: sqlx::Error| DlockError::Unavailable {
        backend: BACKEND,
        source: Box::new(source),
    };
    if let Some(code) = number(&error) {
        return match code {
            // access denied for user (password or plugin)
            1045 | 1698 => DlockError::Unauthenticated {
                backend: BACKEND,
                source: Box::new(error),
            },
            // database, table, column, command or privilege denied
            1044 | 1142 | 1143 | 1227 | 1370 => DlockError::PermissionDenied {
                backend: BACKEND,
                source: Box::new(error),
            },
            // unknown column, wrong value type: a table that is not dlock's
            1054 | 1366 => DlockError::WrongType {
                backend: BACKEND,
                key: "the lock table".into(),
                detail: error.to_string(),
            },
            // too many connections, lock wait timeout, deadlock, interrupted, killed,
            // shutting down, server gone, network errors, read-only
            1040 | 1053 | 1152..=1161 | 1203 | 1205 | 1213 | 1317 | 1836 | 1927 | 2006 | 2013 => {
                unavailable(error)
            }
            _ => DlockError::Backend {
                backend: BACKEND,
                source: Box::new(error),
            },
        };
    }
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => unavailable(error),
        sqlx::Error::Configuration(_) => DlockError::InvalidArgument {
            what: "mysql connection options",
            reason: error.to_string(),
        },
        _ => DlockError::Backend {
            backend: BACKEND,
            source: Box::new(error),
        },
    }
}
