//! SQLite's failures, mapped onto dlock's semantic errors.

use std::path::{Path, PathBuf};

use rusqlite::ErrorCode;

use crate::error::Error as DlockError;

const BACKEND: &str = "sqlite";

/// What can go wrong in the SQLite backend.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("{0}: is a directory, not a database file")]
    IsDirectory(PathBuf),
    #[error("{0}: the directory does not exist (add ?create_dirs=true to create it)")]
    MissingDirectory(PathBuf),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {detail}")]
    NotDlock { path: PathBuf, detail: String },
    /// A file or directory someone else could write, where only the user's own is safe.
    #[error("{path}: {detail}")]
    Untrusted { path: PathBuf, detail: String },
    #[error("{path}: {source}")]
    Sqlite {
        path: PathBuf,
        source: rusqlite::Error,
    },
    /// A store other machines or clocks share (`one_machine`).
    #[error(
        "{path}: {detail}; a SQLite store is for the processes of one machine (use a server store, such as PostgreSQL or Redis, across machines)"
    )]
    NotOneMachine { path: PathBuf, detail: String },
    #[error("the SQLite worker thread stopped")]
    WorkerGone,
}

impl Error {
    /// SQLite said busy or locked: another connection holds a lock right now.
    pub(crate) fn is_busy(&self) -> bool {
        matches!(self, Error::Sqlite { source, .. }
            if matches!(source.sqlite_error_code(), Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)))
    }

    pub(crate) fn sqlite(path: &Path) -> impl FnOnce(rusqlite::Error) -> Error + '_ {
        move |source| Error::Sqlite {
            path: path.to_owned(),
            source,
        }
    }
}

impl From<Error> for DlockError {
    fn from(error: Error) -> DlockError {
        match error {
            Error::IsDirectory(_) | Error::MissingDirectory(_) | Error::NotOneMachine { .. } => {
                DlockError::InvalidArgument {
                    what: "sqlite path",
                    reason: error.to_string(),
                }
            }
            Error::NotDlock {
                ref path,
                ref detail,
            } => DlockError::WrongType {
                backend: BACKEND,
                key: path.display().to_string(),
                detail: detail.clone(),
            },
            Error::Untrusted { .. } => DlockError::PermissionDenied {
                backend: BACKEND,
                source: Box::new(error),
            },
            Error::Io { ref source, .. }
                if source.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                DlockError::PermissionDenied {
                    backend: BACKEND,
                    source: Box::new(error),
                }
            }
            Error::Io { .. } | Error::WorkerGone => DlockError::Unavailable {
                backend: BACKEND,
                source: Box::new(error),
            },
            Error::Sqlite {
                ref source,
                ref path,
            } => match source.sqlite_error_code() {
                Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
                    DlockError::Unavailable {
                        backend: BACKEND,
                        source: Box::new(error),
                    }
                }
                Some(ErrorCode::NotADatabase) => DlockError::WrongType {
                    backend: BACKEND,
                    key: path.display().to_string(),
                    detail: "not a SQLite database".into(),
                },
                Some(
                    ErrorCode::PermissionDenied
                    | ErrorCode::ReadOnly
                    | ErrorCode::AuthorizationForStatementDenied,
                ) => DlockError::PermissionDenied {
                    backend: BACKEND,
                    source: Box::new(error),
                },
                Some(ErrorCode::CannotOpen | ErrorCode::SystemIoFailure | ErrorCode::DiskFull) => {
                    DlockError::Unavailable {
                        backend: BACKEND,
                        source: Box::new(error),
                    }
                }
                _ => DlockError::Backend {
                    backend: BACKEND,
                    source: Box::new(error),
                },
            },
        }
    }
}
