//! etcd failures, mapped onto dlock's semantic errors.

use etcd_client::Error as EtcdError;
use tonic::Code;

use crate::error::Error;

pub(super) const BACKEND: &str = "etcd";

/// Whether the store said the lease does not exist (expired or revoked): for a hold, that
/// means it is lost.
pub(super) fn lease_gone(error: &EtcdError) -> bool {
    match error {
        EtcdError::LeaseKeepAliveError(message) => message.contains("not found"),
        EtcdError::GRpcStatus(status) => {
            status.code() == Code::NotFound && status.message().contains("lease not found")
        }
        _ => false,
    }
}

/// Whether the request failed before reaching any member (connection refused or reset while
/// connecting), so sending it again cannot apply it twice.
pub(super) fn never_sent(error: &EtcdError) -> bool {
    match error {
        EtcdError::GRpcStatus(status) => {
            status.code() == Code::Unavailable && status.message().contains("connect error")
        }
        EtcdError::TransportError(_) => true,
        _ => false,
    }
}

/// Maps an etcd-client error to dlock's.
pub(super) fn map(error: EtcdError) -> Error {
    let boxed = |error: EtcdError| -> crate::error::BoxError { Box::new(error) };
    match &error {
        EtcdError::GRpcStatus(status) => {
            let message = status.message();
            // etcd reports a wrong password as InvalidArgument ("authentication failed,
            // invalid user ID or password") and an expired token by message.
            if status.code() == Code::Unauthenticated
                || message.contains("authentication failed")
                || message.contains("invalid auth token")
                || message.contains("user name is empty")
                || message.contains("user name not found")
            {
                return Error::Unauthenticated {
                    backend: BACKEND,
                    source: boxed(error),
                };
            }
            if status.code() == Code::PermissionDenied || message.contains("permission denied") {
                return Error::PermissionDenied {
                    backend: BACKEND,
                    source: boxed(error),
                };
            }
            match status.code() {
                Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Cancelled
                | Code::Aborted
                | Code::ResourceExhausted => Error::Unavailable {
                    backend: BACKEND,
                    source: boxed(error),
                },
                // Raft-level hiccups arrive as Unknown with these messages.
                Code::Unknown
                    if message.contains("leader")
                        || message.contains("timed out")
                        || message.contains("timeout")
                        || message.contains("stopped")
                        || message.contains("too many requests")
                        || message.contains("transport") =>
                {
                    Error::Unavailable {
                        backend: BACKEND,
                        source: boxed(error),
                    }
                }
                _ => Error::Backend {
                    backend: BACKEND,
                    source: boxed(error),
                },
            }
        }
        EtcdError::TransportError(_)
        | EtcdError::IoError(_)
        | EtcdError::WatchError(_)
        | EtcdError::LeaseKeepAliveError(_)
        | EtcdError::EndpointError(_) => Error::Unavailable {
            backend: BACKEND,
            source: boxed(error),
        },
        // A new client whose connection task ended before it took the endpoints: nothing was
        // sent, and another client may connect (seen from a client made for a release at a
        // program's end, in CI).
        EtcdError::Internal(message) if message.starts_with("failed to insert endpoint") => {
            Error::Unavailable {
                backend: BACKEND,
                source: boxed(error),
            }
        }
        _ => Error::Backend {
            backend: BACKEND,
            source: boxed(error),
        },
    }
}

/// A reply whose shape is not what etcd returns for our requests.
pub(super) fn bad_reply(what: &str) -> Error {
    Error::Backend {
        backend: BACKEND,
        source: format!("unexpected reply to {what}").into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_whose_connection_task_ended_at_once_is_retryable() {
        let ended =
            EtcdError::Internal("failed to insert endpoint into the balanced channel".into());
        assert!(map(ended).is_retryable());
        assert!(!map(EtcdError::Internal("something else".into())).is_retryable());
    }
}
