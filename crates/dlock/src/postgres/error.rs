//! PostgreSQL's failures, mapped onto dlock's semantic errors.

use crate::error::Error as DlockError;

const BACKEND: &str = "postgres";

/// What can go wrong in the PostgreSQL backend.
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

/// Maps a driver error by SQLSTATE class.
pub(crate) fn from_sqlx(error: sqlx::Error) -> DlockError {
    let unavailable = |source: sqlx::Error| DlockError::Unavailable {
        backend: BACKEND,
        source: Box::new(source),
    };
    match &error {
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            match code.as_str() {
                // invalid_authorization_specification, invalid_password
                "28000" | "28P01" => DlockError::Unauthenticated {
                    backend: BACKEND,
                    source: Box::new(error),
                },
                // insufficient_privilege
                "42501" => DlockError::PermissionDenied {
                    backend: BACKEND,
                    source: Box::new(error),
                },
                // undefined column / table, wrong data type: a table that is not dlock's
                "42703" | "42P01" | "42804" | "42883" => DlockError::WrongType {
                    backend: BACKEND,
                    key: db.table().unwrap_or("the lock table").to_owned(),
                    detail: db.message().to_owned(),
                },
                // connection exceptions, shutdown / crash / starting up, too many
                // connections, out of resources, serialization failure and deadlock
                c if c.starts_with("08")
                    || c.starts_with("53")
                    || c.starts_with("57P")
                    || c == "40001"
                    || c == "40P01" =>
                {
                    unavailable(error)
                }
                _ => DlockError::Backend {
                    backend: BACKEND,
                    source: Box::new(error),
                },
            }
        }
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => unavailable(error),
        sqlx::Error::Configuration(_) => DlockError::InvalidArgument {
            what: "postgres connection options",
            reason: error.to_string(),
        },
        _ => DlockError::Backend {
            backend: BACKEND,
            source: Box::new(error),
        },
    }
}

/// The lock wait ran out (`lock_timeout`): busy, not an error.
pub(crate) fn is_lock_timeout(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db) if db.code().as_deref() == Some("55P03"))
}
