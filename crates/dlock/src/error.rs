//! The one error type of dlock, with semantic variants every backend maps into.

use std::time::Duration;

/// A boxed error from a store's client library, kept as the `source` of an [`Error`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `Result` with dlock's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong with a lock, by meaning rather than by store.
///
/// Each backend keeps its own private error type and maps it into one of these variants, so
/// code written against one store handles the errors of every other the same way.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let locks = dlock::connect("memory://errors-doc").await.unwrap();
/// match locks.mutex("").acquire().await {
///     Err(dlock::Error::InvalidName { reason, .. }) => assert_eq!(reason, "name is empty"),
///     other => panic!("unexpected: {other:?}"),
/// }
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock was not acquired before the wait ran out (`waited` is zero for `no_wait`).
    #[error("lock {name:?} was not acquired within {waited:?}")]
    Timeout {
        /// The lock's name.
        name: String,
        /// How long the caller waited.
        waited: Duration,
    },
    /// Release or extend of a lock this holder no longer owns (expired, taken over,
    /// force-released, or already released).
    #[error("lock {name:?} is not owned by this holder (expired, broken or already released)")]
    NotOwned {
        /// The lock's name.
        name: String,
    },
    /// The lock name is empty, too long, or contains a NUL byte.
    #[error("invalid lock name {name:?}: {reason}")]
    InvalidName {
        /// The rejected name (cut to 80 characters).
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// An argument is out of range (zero or absurd TTL, a wait that overflows the clock, …).
    #[error("invalid {what}: {reason}")]
    InvalidArgument {
        /// Which argument.
        what: &'static str,
        /// Why it was rejected.
        reason: String,
    },
    /// A connection URL that cannot be used (unknown scheme, bad syntax, bad option).
    /// Passwords are redacted from `url`.
    #[error("invalid URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL with any password replaced by `***`.
        url: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The backend cannot do this (for example fair locks on a store with no queue).
    #[error("{operation} is not supported by the {backend} backend")]
    Unsupported {
        /// The operation that was asked for.
        operation: &'static str,
        /// The backend's scheme name.
        backend: &'static str,
    },
    /// [`VersionedValue::update`](crate::VersionedValue::update) lost to other writers on
    /// every attempt.
    #[error("value {name:?} changed under every one of {attempts} update attempts")]
    Conflict {
        /// The value's name.
        name: String,
        /// Attempts made.
        attempts: u32,
    },
    /// The store rejected the credentials.
    #[error("{backend}: authentication failed: {source}")]
    Unauthenticated {
        /// The backend's scheme name.
        backend: &'static str,
        /// The store's own error.
        source: BoxError,
    },
    /// The store (or the file system) refused access.
    #[error("{backend}: permission denied: {source}")]
    PermissionDenied {
        /// The backend's scheme name.
        backend: &'static str,
        /// The store's own error.
        source: BoxError,
    },
    /// A key, table or file exists but holds something that is not dlock's.
    #[error("{backend}: {key} is not a dlock lock store ({detail})")]
    WrongType {
        /// The backend's scheme name.
        backend: &'static str,
        /// The key, table or path that holds a foreign value.
        key: String,
        /// What was found instead.
        detail: String,
    },
    /// The store cannot be reached right now (connection refused, I/O error, busy, session
    /// lost). Retrying may succeed.
    #[error("{backend}: store unavailable: {source}")]
    Unavailable {
        /// The backend's scheme name.
        backend: &'static str,
        /// The store's own error.
        source: BoxError,
    },
    /// Any other store error.
    #[error("{backend}: {source}")]
    Backend {
        /// The backend's scheme name.
        backend: &'static str,
        /// The store's own error.
        source: BoxError,
    },
}

impl Error {
    /// Whether retrying the same call may succeed: true for [`Error::Unavailable`] and
    /// [`Error::Timeout`] and [`Error::Conflict`], false for everything that needs a different
    /// input or state.
    ///
    /// # Examples
    ///
    /// ```
    /// let e = dlock::Error::NotOwned { name: "a".into() };
    /// assert!(!e.is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Unavailable { .. } | Error::Timeout { .. } | Error::Conflict { .. }
        )
    }

    /// The scheme name of the backend that raised the error, when it came from a store.
    ///
    /// # Examples
    ///
    /// ```
    /// let e = dlock::Error::Unsupported { operation: "fair locks", backend: "sqlite" };
    /// assert_eq!(e.backend(), Some("sqlite"));
    /// ```
    pub fn backend(&self) -> Option<&'static str> {
        match self {
            Error::Unsupported { backend, .. }
            | Error::Unauthenticated { backend, .. }
            | Error::PermissionDenied { backend, .. }
            | Error::WrongType { backend, .. }
            | Error::Unavailable { backend, .. }
            | Error::Backend { backend, .. } => Some(backend),
            _ => None,
        }
    }

    pub(crate) fn invalid_argument(what: &'static str, reason: impl Into<String>) -> Error {
        Error::InvalidArgument {
            what,
            reason: reason.into(),
        }
    }

    pub(crate) fn not_owned(name: &str) -> Error {
        Error::NotOwned {
            name: name.to_owned(),
        }
    }
}

/// Replaces the password of a URL (`scheme://user:password@host`) with `***` so it can be shown.
pub(crate) fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_url_hides_password_only() {
        assert_eq!(
            redact_url("redis://user:secret@h:1/0?x=1"),
            "redis://user:***@h:1/0?x=1"
        );
        assert_eq!(redact_url("redis://h:1"), "redis://h:1");
        assert_eq!(redact_url("sqlite:///tmp/a.db"), "sqlite:///tmp/a.db");
        assert_eq!(redact_url("no scheme"), "no scheme");
    }

    #[test]
    fn retryable_classification() {
        assert!(
            Error::Unavailable {
                backend: "x",
                source: "io".into()
            }
            .is_retryable()
        );
        assert!(!Error::invalid_argument("ttl", "zero").is_retryable());
    }
}
