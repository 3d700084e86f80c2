//! ZooKeeper failures, mapped onto dlock's semantic errors.

use zookeeper_client::Error as ZkError;

use crate::error::Error;

pub(super) const BACKEND: &str = "zk";

/// Maps a client error to dlock's; `path` names the node for type errors.
pub(super) fn map(error: ZkError, path: &str) -> Error {
    match error {
        // The connection or the session is gone (or the server sheds load): the state of the
        // request is unknown and a retry, possibly on a new session, may succeed.
        ZkError::ConnectionLoss
        | ZkError::Timeout
        | ZkError::NoHosts
        | ZkError::Throttled
        | ZkError::SessionExpired
        | ZkError::SessionMoved
        | ZkError::NotReadOnly
        | ZkError::ClientClosed
        // The client's own connection failures ("no response from connection in …", I/O).
        | ZkError::Custom(_) => Error::Unavailable {
            backend: BACKEND,
            source: Box::new(error),
        },
        // The client's session task ended before its state said so ("expect error state, got
        // SyncConnected"): the request may not have been sent, as with a lost connection (seen
        // from a client made for a release at a program's end, in CI).
        ZkError::UnexpectedError(ref message) if message.starts_with("expect error state") => {
            Error::Unavailable {
                backend: BACKEND,
                source: Box::new(error),
            }
        }
        ZkError::AuthFailed => Error::Unauthenticated {
            backend: BACKEND,
            source: Box::new(error),
        },
        ZkError::NoAuth | ZkError::InvalidAcl => Error::PermissionDenied {
            backend: BACKEND,
            source: Box::new(error),
        },
        // An ephemeral node where dlock needs a directory: not dlock's.
        ZkError::NoChildrenForEphemerals => Error::WrongType {
            backend: BACKEND,
            key: path.to_owned(),
            detail: "an ephemeral node is in the way of a lock directory".into(),
        },
        other => Error::Backend {
            backend: BACKEND,
            source: Box::new(other),
        },
    }
}

/// The session ended (expired, closed, or suspended past the point where the server may have
/// expired it): whatever this client held in it is gone.
pub(super) fn session_lost() -> Error {
    Error::Unavailable {
        backend: BACKEND,
        source: "the ZooKeeper session was lost".into(),
    }
}

/// The connection is suspended: a held lock may or may not still be held.
pub(super) fn suspended() -> Error {
    Error::Unavailable {
        backend: BACKEND,
        source: "the connection to ZooKeeper is suspended; the lock's state is uncertain until it reconnects"
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_task_gone_before_its_state_said_so_is_retryable() {
        let gone = ZkError::UnexpectedError("expect error state, got SyncConnected".into());
        assert!(map(gone, "/x").is_retryable());
        let other = ZkError::UnexpectedError("a reply of the wrong shape".into());
        assert!(!map(other, "/x").is_retryable());
    }
}
