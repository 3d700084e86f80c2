//! MySQL's and MariaDB's failures, mapped onto dlock's semantic errors.

use sqlx::mysql::MySqlDatabaseError;

use crate::error::Error as DlockError;
use crate::sql_common::{ServerFailure, from_driver};

pub(super) const BACKEND: &str = "mysql";

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
    from_driver(BACKEND, "mysql connection options", error, |error| {
        Some(match number(error)? {
            // access denied for user (password or plugin)
            1045 | 1698 => ServerFailure::Unauthenticated,
            // database, table, column, command or privilege denied
            1044 | 1142 | 1143 | 1227 | 1370 => ServerFailure::PermissionDenied,
            // unknown column, wrong value type: a table that is not dlock's
            1054 | 1366 => ServerFailure::WrongType {
                key: "the lock table".into(),
                detail: error.to_string(),
            },
            // too many connections, lock wait timeout, deadlock, interrupted, killed,
            // shutting down, server gone, network errors, read-only
            1040 | 1053 | 1152..=1161 | 1203 | 1205 | 1213 | 1317 | 1836 | 1927 | 2006 | 2013 => {
                ServerFailure::Unavailable
            }
            _ => ServerFailure::Other,
        })
    })
}
