//! NATS failures, mapped onto dlock's semantic errors.

use crate::error::Error;

pub(super) const BACKEND: &str = "nats";

/// What a failed request's message says about it: the server or JetStream could not be
/// reached or did not answer in time (retryable), or something else.
fn unreachable(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    [
        "timed out",
        "timeout",
        "no responders",
        "broken pipe",
        "disconnect",
        "connection",
        "io error",
        "no stream found",
        "jetstream not enabled",
        "jetstream system temporarily unavailable",
        "insufficient resources",
        "no suitable peers",
        "request",
    ]
    .iter()
    .any(|sign| message.contains(sign))
}

/// Maps an async-nats error (each request has its own error type) to dlock's: the store
/// out of reach is [`Error::Unavailable`], a refused login [`Error::Unauthenticated`], a
/// refused subject [`Error::PermissionDenied`].
pub(super) fn map<E>(error: E) -> Error
where
    E: std::error::Error + Send + Sync + 'static,
{
    let message = full_message(&error);
    let lower = message.to_ascii_lowercase();
    let source: crate::error::BoxError = Box::new(error);
    if lower.contains("authorization violation") || lower.contains("authentication") {
        return Error::Unauthenticated {
            backend: BACKEND,
            source,
        };
    }
    if lower.contains("permissions violation") || lower.contains("permission") {
        return Error::PermissionDenied {
            backend: BACKEND,
            source,
        };
    }
    if unreachable(&lower) {
        return Error::Unavailable {
            backend: BACKEND,
            source,
        };
    }
    Error::Backend {
        backend: BACKEND,
        source,
    }
}

/// The error and its causes, one line.
fn full_message(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        message.push_str(": ");
        message.push_str(&next.to_string());
        cause = next.source();
    }
    message
}

/// A reply that dlock did not write (a foreign value under a lock's key).
pub(super) fn bad_reply(what: &str) -> Error {
    Error::Backend {
        backend: BACKEND,
        source: format!("unexpected {what} in the bucket").into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreachable_server_is_retryable_and_a_refusal_is_not() {
        let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "request timed out");
        assert!(map(io).is_retryable());
        let denied = std::io::Error::other("Permissions Violation for Publish to x");
        assert!(matches!(map(denied), Error::PermissionDenied { .. }));
        let other = std::io::Error::other("invalid key");
        assert!(matches!(map(other), Error::Backend { .. }));
    }
}
