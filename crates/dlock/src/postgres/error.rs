//! PostgreSQL's failures, mapped onto dlock's semantic errors.

use crate::error::Error as DlockError;
use crate::sql_common::{ServerFailure, from_driver};

pub(super) const BACKEND: &str = "postgres";

/// Maps a driver error by SQLSTATE class.
pub(crate) fn from_sqlx(error: sqlx::Error) -> DlockError {
    from_driver(BACKEND, "postgres connection options", error, |error| {
        let sqlx::Error::Database(db) = error else {
            return None;
        };
        let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
        Some(match code.as_str() {
            // invalid_authorization_specification, invalid_password
            "28000" | "28P01" => ServerFailure::Unauthenticated,
            // insufficient_privilege
            "42501" => ServerFailure::PermissionDenied,
            // undefined column / table, wrong data type: a table that is not dlock's
            "42703" | "42P01" | "42804" | "42883" => ServerFailure::WrongType {
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
                ServerFailure::Unavailable
            }
            _ => ServerFailure::Other,
        })
    })
}

/// The lock wait ran out (`lock_timeout`): busy, not an error.
pub(crate) fn is_lock_timeout(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db) if db.code().as_deref() == Some("55P03"))
}
