//! The file system's failures mapped onto dlock's errors.

use std::io::ErrorKind;
use std::path::Path;

use nix::errno::Errno;

use crate::error::Error;

use super::BACKEND;

/// Maps a failed file operation on `path`: the message names the path.
pub(super) fn from_io(path: &Path, error: std::io::Error) -> Error {
    let source = format!("{}: {error}", path.display()).into();
    let errno = error.raw_os_error().map(Errno::from_raw);
    match (error.kind(), errno) {
        (ErrorKind::PermissionDenied, _) | (_, Some(Errno::EROFS)) => Error::PermissionDenied {
            backend: BACKEND,
            source,
        },
        // A lock's file where a folder of other locks is (`a` and `a/b`), or the reverse.
        (_, Some(Errno::EISDIR | Errno::ENOTDIR)) => Error::WrongType {
            backend: BACKEND,
            key: path.display().to_string(),
            detail: "a lock's file and a folder of locks' files cannot have one path (names \
                     `a` and `a/b` cannot both be used)"
                .into(),
        },
        (ErrorKind::InvalidData, _) => Error::WrongType {
            backend: BACKEND,
            key: path.display().to_string(),
            detail: error.to_string(),
        },
        // Worth retrying: the disk or the process's limits may free up.
        (ErrorKind::Interrupted | ErrorKind::WouldBlock | ErrorKind::OutOfMemory, _)
        | (
            _,
            Some(
                Errno::EIO
                | Errno::ENOSPC
                | Errno::EDQUOT
                | Errno::EMFILE
                | Errno::ENFILE
                | Errno::ENOLCK,
            ),
        ) => Error::Unavailable {
            backend: BACKEND,
            source,
        },
        _ => Error::Backend {
            backend: BACKEND,
            source,
        },
    }
}

/// A store call's blocking thread that did not finish (the runtime is shutting down).
pub(super) fn thread_gone(error: tokio::task::JoinError) -> Error {
    Error::Unavailable {
        backend: BACKEND,
        source: format!("the file operation's thread did not finish: {error}").into(),
    }
}
