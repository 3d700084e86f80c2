//! Validated lock names, holder identity and the limits dlock enforces on both.

use std::fmt;

use crate::error::{Error, Result};

/// The longest lock name accepted, in bytes (UTF-8).
pub const MAX_NAME_LEN: usize = 512;

/// The longest owner label accepted, in bytes (UTF-8).
pub const MAX_LABEL_LEN: usize = 256;

/// A lock name that passed validation: not empty, at most [`MAX_NAME_LEN`] bytes, no NUL.
///
/// Names are case-sensitive on every backend; `/` has no special meaning but is the
/// conventional separator for [`Locks::list`](crate::Locks::list) prefixes.
///
/// # Examples
///
/// ```
/// use dlock::LockName;
/// assert_eq!(LockName::new("orders/42").unwrap().as_str(), "orders/42");
/// assert!(LockName::new("").is_err());
/// assert!(LockName::new("a\0b").is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName(String);

impl LockName {
    /// Validates `name`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] when the name is empty, longer than [`MAX_NAME_LEN`] bytes, or
    /// contains a NUL byte.
    pub fn new(name: impl Into<String>) -> Result<LockName> {
        let name = name.into();
        let reason = if name.is_empty() {
            Some("name is empty")
        } else if name.len() > MAX_NAME_LEN {
            Some("name is longer than 512 bytes")
        } else if name.contains('\0') {
            Some("name contains a NUL byte")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(Error::InvalidName {
                name: name.chars().take(80).collect(),
                reason,
            }),
            None => Ok(LockName(name)),
        }
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for LockName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Who holds a lock: stored with the lock so `dlock ls` and [`Locks::inspect`](crate::Locks::inspect)
/// can say who to blame.
///
/// # Examples
///
/// ```
/// let me = dlock::Owner::current();
/// assert_eq!(me.pid, std::process::id());
/// let labelled = me.with_label("billing-worker").unwrap();
/// assert_eq!(labelled.label.as_deref(), Some("billing-worker"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Owner {
    /// Free-form label chosen by the application (service name, job id, …).
    pub label: Option<String>,
    /// Host name of the holder.
    pub host: String,
    /// Process id of the holder.
    pub pid: u32,
}

impl Owner {
    /// This process: its host name and pid, no label.
    pub fn current() -> Owner {
        Owner {
            label: None,
            host: gethostname::gethostname().to_string_lossy().into_owned(),
            pid: std::process::id(),
        }
    }

    /// Builds an owner from its parts, as read back from a store.
    pub fn new(label: Option<String>, host: impl Into<String>, pid: u32) -> Owner {
        Owner {
            label,
            host: host.into(),
            pid,
        }
    }

    /// An owner as a SQL table keeps it, in nullable columns: no host reads as empty, and no
    /// pid (or one out of range) as 0.
    #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
    pub(crate) fn from_columns(
        label: Option<String>,
        host: Option<String>,
        pid: Option<i64>,
    ) -> Owner {
        Owner::new(
            label,
            host.unwrap_or_default(),
            pid.and_then(|p| u32::try_from(p).ok()).unwrap_or(0),
        )
    }

    /// The same owner with a label.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when the label is longer than [`MAX_LABEL_LEN`] bytes or
    /// contains a NUL byte.
    pub fn with_label(mut self, label: impl Into<String>) -> Result<Owner> {
        let label = label.into();
        if label.len() > MAX_LABEL_LEN {
            return Err(Error::invalid_argument(
                "owner label",
                "longer than 256 bytes",
            ));
        }
        if label.contains('\0') {
            return Err(Error::invalid_argument(
                "owner label",
                "contains a NUL byte",
            ));
        }
        self.label = Some(label);
        Ok(self)
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.label {
            Some(label) => write!(f, "{label}@{} pid {}", self.host, self.pid),
            None => write!(f, "{} pid {}", self.host, self.pid),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_limits() {
        assert!(LockName::new("x".repeat(MAX_NAME_LEN)).is_ok());
        let err = LockName::new("x".repeat(MAX_NAME_LEN + 1)).unwrap_err();
        assert!(matches!(err, Error::InvalidName { ref name, .. } if name.len() == 80));
        assert!(LockName::new("Orders").unwrap() != LockName::new("orders").unwrap());
    }

    #[test]
    fn label_limits() {
        assert!(Owner::current().with_label("x".repeat(257)).is_err());
        assert!(Owner::current().with_label("a\0").is_err());
    }
}
