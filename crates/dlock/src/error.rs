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
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The lock was not acquired before the wait ran out (`waited` is zero for `no_wait`).
    Timeout {
        /// The lock's name.
        name: String,
        /// How long the caller waited.
        waited: Duration,
    },
    /// Release or extend of a lock this holder no longer owns (expired, taken over,
    /// force-released, or already released).
    NotOwned {
        /// The lock's name.
        name: String,
    },
    /// The lock name is empty, too long, or contains a NUL byte.
    InvalidName {
        /// The rejected name (cut to 80 characters).
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// An argument is out of range (zero or absurd TTL, a wait that overflows the clock, …).
    InvalidArgument {
        /// Which argument.
        what: &'static str,
        /// Why it was rejected.
        reason: String,
    },
    /// A connection URL that cannot be used (unknown scheme, bad syntax, bad option).
    /// Passwords are redacted from `url`.
    InvalidUrl {
        /// The URL with any password replaced by `***`.
        url: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The backend cannot do this (for example fair locks on a store with no queue).
    Unsupported {
        /// The operation that was asked for.
        operation: &'static str,
        /// The backend's scheme name.
        backend: &'static str,
    },
    /// [`VersionedValue::update`](crate::VersionedValue::update) lost to other writers on
    /// every attempt.
    Conflict {
        /// The value's name.
        name: String,
        /// Attempts made.
        attempts: u32,
    },
    /// A semaphore was asked for with another number of permits than its current holders
    /// use; every client of a semaphore must give the same size.
    SizeMismatch {
        /// The semaphore's name.
        name: String,
        /// The number of permits this call asked for.
        asked: u32,
        /// The number of permits the current holders use.
        held_with: u32,
    },
    /// The store rejected the credentials.
    Unauthenticated {
        /// The backend's scheme name.
        backend: &'static str,
        /// The store's own error.
        source: BoxError,
    },
    /// The store (or the file system) refused access.
    PermissionDenied {
        /// The backend's scheme name.
        backend: &'static str,
        /// The store's own error.
        source: BoxError,
    },
    /// A key, table or file exists but holds something that is not dlock's.
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
    Unavailable {
        /// The backend's scheme name.
        backend: &'static str,
        /// The store's own error.
        source: BoxError,
    },
    /// The hold was lost: the hold a task ran under, before the task finished
    /// ([`run_while_held`](crate::run_while_held); the task was dropped), or the hold a
    /// fenced write was made with, which the store found no longer current
    /// ([`VersionedValue::set_fenced`](crate::VersionedValue::set_fenced); nothing was
    /// written).
    Lost {
        /// Why the hold was lost.
        reason: crate::LostReason,
    },
    /// Any other store error.
    Backend {
        /// The backend's scheme name.
        backend: &'static str,
        /// The store's own error.
        source: BoxError,
    },
}

/// Each cause once: `Display` writes the store's error and its own causes (a cause whose text
/// an earlier one already holds is left out), and [`source`](std::error::Error::source) is
/// `None`, so a chain-walking reporter (`anyhow`'s `{:#}`) does not print them again.
impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Timeout { name, waited } => {
                write!(f, "lock {name:?} was not acquired within {waited:?}")
            }
            Error::NotOwned { name } => write!(
                f,
                "lock {name:?} is not owned by this holder (expired, broken or already released)"
            ),
            Error::InvalidName { name, reason } => {
                write!(f, "invalid lock name {name:?}: {reason}")
            }
            Error::InvalidArgument { what, reason } => write!(f, "invalid {what}: {reason}"),
            Error::Lost { reason } => {
                write!(f, "the hold was lost ({reason})")
            }
            Error::InvalidUrl { url, reason } => write!(f, "invalid URL {url:?}: {reason}"),
            Error::Unsupported { operation, backend } => {
                write!(f, "{operation} is not supported by the {backend} backend")
            }
            Error::Conflict { name, attempts } => write!(
                f,
                "value {name:?} changed under every one of {attempts} update attempts"
            ),
            Error::SizeMismatch {
                name,
                asked,
                held_with,
            } => write!(
                f,
                "semaphore {name:?} was asked with {asked} permits but its holders use \
                 {held_with}: every client must use the same size"
            ),
            Error::WrongType {
                backend,
                key,
                detail,
            } => write!(f, "{backend}: {key} is not a dlock lock store ({detail})"),
            Error::Unauthenticated { backend, source }
            | Error::PermissionDenied { backend, source }
            | Error::Unavailable { backend, source }
            | Error::Backend { backend, source } => {
                let what = match self {
                    Error::Unauthenticated { .. } => "authentication failed: ",
                    Error::PermissionDenied { .. } => "permission denied: ",
                    Error::Unavailable { .. } => "store unavailable: ",
                    _ => "",
                };
                write!(f, "{backend}: {what}")?;
                write_causes(f, source.as_ref())
            }
        }
    }
}

/// `cause` and its own sources, joined by `: `, each text once (client libraries often repeat
/// their source's text in their own message).
fn write_causes(
    f: &mut std::fmt::Formatter<'_>,
    cause: &(dyn std::error::Error + 'static),
) -> std::fmt::Result {
    let mut shown = String::new();
    let mut next = Some(cause);
    while let Some(error) = next {
        let text = error.to_string();
        if !text.is_empty() && !shown.contains(&text) {
            if !shown.is_empty() {
                shown.push_str(": ");
            }
            shown.push_str(&text);
        }
        next = error.source();
    }
    f.write_str(&shown)
}

impl std::error::Error for Error {}

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

    /// What went wrong without the backend's name and the variant's words: the store's error
    /// (and its causes) where there is one, else the whole message. For errors that gather
    /// several stores' errors (a Redlock round).
    #[cfg(feature = "redis")]
    pub(crate) fn cause_text(&self) -> String {
        struct Causes<'a>(&'a (dyn std::error::Error + 'static));
        impl std::fmt::Display for Causes<'_> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write_causes(f, self.0)
            }
        }
        match self {
            Error::Unauthenticated { source, .. }
            | Error::PermissionDenied { source, .. }
            | Error::Unavailable { source, .. }
            | Error::Backend { source, .. } => Causes(source.as_ref()).to_string(),
            other => other.to_string(),
        }
    }

    pub(crate) fn not_owned(name: &str) -> Error {
        Error::NotOwned {
            name: name.to_owned(),
        }
    }
}

/// Query options whose values are secrets, matched as substrings of the lowercased key
/// (`password`, `sentinel_password`, `sslpassword`, `auth_token`, …).
const SECRET_OPTION_WORDS: [&str; 7] = ["pass", "pwd", "secret", "token", "auth", "key", "cred"];

/// A URL safe to show: every credential replaced by `***`.
///
/// Covers the password of each `user:password@host` (every host of a multi-host URL), a
/// userinfo that is malformed (a raw `/`, `?` or `#` in a password makes the authority end
/// early, so everything before the last `@` of the part before the query is treated as
/// credentials), and the values of password-like query options. It errs on the side of hiding:
/// a URL that cannot be read is cut to its scheme.
///
/// # Examples
///
/// ```
/// assert_eq!(dlock::redact_url("redis://app:s3cret@cache:6379/0"), "redis://app:***@cache:6379/0");
/// assert_eq!(dlock::redact_url("sqlite:///var/lib/app/locks.db"), "sqlite:///var/lib/app/locks.db");
/// ```
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        // Not a URL at all: it may still carry a secret, so show only its length.
        return if url.contains('@') || url.contains('=') {
            format!("<{} characters, not a URL>", url.chars().count())
        } else {
            url.to_owned()
        };
    };
    let mut out = format!("{scheme}://");
    let bare_is_secret = bare_userinfo_is_a_token(scheme);
    // A URL with an authority: everything before the last `@` counts as credentials, even
    // past a `/`, `?` or `#` that a password may hold raw. A path right after `://` (a file
    // URL such as `sqlite:///tmp/x.db`) has no authority.
    let tail = match rest.rfind('@') {
        Some(last_at) if !rest.starts_with('/') => {
            let credentials = &rest[..last_at];
            let pieces: Vec<&str> = credentials.split(',').collect();
            let last = pieces.len() - 1;
            // Every piece but the last is `userinfo@host` of an earlier host; one without an `@`
            // means a password holds a comma: hide the whole credential part.
            if pieces[..last].iter().any(|piece| !piece.contains('@')) {
                out.push_str("***");
            } else {
                for (i, piece) in pieces.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    // The last piece is all userinfo (it ends at the URL's last `@`).
                    match piece.rsplit_once('@').filter(|_| i < last) {
                        Some((userinfo, host)) => {
                            out.push_str(&redact_userinfo(userinfo, bare_is_secret));
                            out.push('@');
                            out.push_str(host);
                        }
                        None => out.push_str(&redact_userinfo(piece, bare_is_secret)),
                    }
                }
            }
            &rest[last_at..]
        }
        _ => rest,
    };
    match tail.split_once('?') {
        Some((before, query)) => {
            out.push_str(before);
            out.push('?');
            out.push_str(&redact_query(query));
        }
        None => out.push_str(tail),
    }
    out
}

/// `text` with every secret that `url` holds (passwords of its userinfo, a whole malformed
/// credential part, values of password-like options) replaced by `***`.
pub(crate) fn scrub_secrets(url: &str, text: &str) -> String {
    let mut secrets: Vec<&str> = Vec::new();
    if let Some((scheme, rest)) = url.split_once("://") {
        if let Some(last_at) = rest.rfind('@').filter(|_| !rest.starts_with('/')) {
            for piece in rest[..last_at].split(',') {
                let userinfo = piece
                    .rsplit_once('@')
                    .map_or(piece, |(userinfo, _)| userinfo);
                // A user name alone is no secret (and scrubbing it would mangle messages), but
                // a NATS token is.
                match userinfo.split_once(':') {
                    Some((_, password)) => secrets.push(password),
                    None if bare_userinfo_is_a_token(scheme) => secrets.push(userinfo),
                    None => {}
                }
            }
        }
        if let Some((_, query)) = rest.split_once('?') {
            for pair in query.split('&') {
                if let Some((key, value)) = pair.split_once('=')
                    && is_secret_option(key)
                {
                    secrets.push(value);
                }
            }
        }
    }
    // Longest first, so a secret that contains another is replaced whole.
    secrets.retain(|secret| !secret.is_empty());
    secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
    let mut out = text.to_owned();
    for secret in secrets {
        out = out.replace(secret, "***");
    }
    out
}

/// Whether a userinfo without `:` is a secret token rather than a user name: NATS's URLs
/// (`nats://TOKEN@host`).
fn bare_userinfo_is_a_token(scheme: &str) -> bool {
    scheme.eq_ignore_ascii_case("nats")
}

/// `user:password` → `user:***`; a userinfo that is not plainly `user[:password]`, or a bare
/// one that is a token, → `***`.
fn redact_userinfo(userinfo: &str, bare_is_secret: bool) -> String {
    if userinfo.contains(['/', '?', '#', '[', ']', '@'])
        || (bare_is_secret && !userinfo.contains(':'))
    {
        return "***".to_owned();
    }
    match userinfo.split_once(':') {
        Some((user, _password)) => format!("{user}:***"),
        None => userinfo.to_owned(),
    }
}

fn redact_query(query: &str) -> String {
    query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _value)) if is_secret_option(key) => format!("{key}=***"),
            _ => pair.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// Whether a URL option's value is a secret (its key names a password, token or key).
pub(crate) fn is_secret_option(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    SECRET_OPTION_WORDS.iter().any(|word| key.contains(word))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nats_token_is_hidden_as_a_password_is() {
        assert_eq!(
            redact_url("nats://s3cr3t@h:1,h:2/b"),
            "nats://***@h:1,h:2/b"
        );
        assert_eq!(redact_url("nats://app:pw@h/b"), "nats://app:***@h/b");
        assert_eq!(
            scrub_secrets("nats://s3cr3t@h/b", "refused s3cr3t at h"),
            "refused *** at h"
        );
        assert_eq!(redact_url("redis://app@h"), "redis://app@h");
    }

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

    /// Every credential form a user can write, and none of the secrets may survive.
    #[test]
    fn redact_url_hides_every_credential_form() {
        let cases = [
            ("redis://:pw-secret@host:6379", "redis://:***@host:6379"),
            (
                "postgres://app@h/db?password=pw-secret&x=1",
                "postgres://app@h/db?password=***&x=1",
            ),
            (
                "postgres://h/db?sslpassword=pw-secret",
                "postgres://h/db?sslpassword=***",
            ),
            ("redis://u:pa/ss-secret@h", "redis://***@h"),
            ("redis://u:pa?ss-secret@h/0", "redis://***@h/0"),
            ("redis://u:pa#ss-secret@h", "redis://***@h"),
            (
                "redlock://u:s1-secret@a:1,u:s2-secret@b:2",
                "redlock://u:***@a:1,u:***@b:2",
            ),
            ("redis://u:pa,ss-secret@h", "redis://***@h"),
            ("redis://u:p@ss-secret@h", "redis://***@h"),
            (
                "zk://h:1/chroot?auth=digest:u:pw-secret",
                "zk://h:1/chroot?auth=***",
            ),
            (
                "redis+sentinel://h:1/m?sentinel_password=pw-secret",
                "redis+sentinel://h:1/m?sentinel_password=***",
            ),
            ("u:pw-secret@host", "<16 characters, not a URL>"),
        ];
        assert_eq!(
            scrub_secrets(
                "redis://app:pa/ss@h/0",
                "database \"ss@h\" in pa/ss@h for app"
            ),
            "database \"ss@h\" in ***@h for app"
        );
        assert_eq!(
            scrub_secrets(
                "postgres://h/db?password=hunter2",
                "bad option password=hunter2"
            ),
            "bad option password=***"
        );
        for (url, want) in cases {
            let shown = redact_url(url);
            assert_eq!(shown, want, "{url}");
            assert!(!shown.contains("secret"), "{url} leaks: {shown}");
        }
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
