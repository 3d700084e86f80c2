//! The optional ability to keep versioned values next to the locks: [`ValueStore`].

use async_trait::async_trait;

use crate::error::Result;
use crate::name::LockName;

/// The condition of a [`ValueStore::put`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Write whatever the current version (a blind write).
    Any,
    /// Write only if the value was never written.
    Absent,
    /// Write only if the current version is this one.
    Version(u64),
}

impl Expect {
    /// The condition for "the version I read", `None` meaning "never written".
    pub fn from_read(version: Option<u64>) -> Expect {
        version.map_or(Expect::Absent, Expect::Version)
    }

    /// Whether the condition holds for the `current` version.
    pub fn holds(self, current: Option<u64>) -> bool {
        match self {
            Expect::Any => true,
            Expect::Absent => current.is_none(),
            Expect::Version(version) => current == Some(version),
        }
    }
}

/// A value and the version that wrote it, as read by [`ValueStore::get`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Versioned {
    /// The bytes last written.
    pub value: Vec<u8>,
    /// Strictly greater than the version of every earlier write of the same name.
    pub version: u64,
}

impl Versioned {
    /// A value read from a store (for backends).
    pub fn new(value: Vec<u8>, version: u64) -> Versioned {
        Versioned { value, version }
    }
}

/// Optional ability: small named values with a version, changed only atomically.
///
/// Values live in their own namespace: a value named `x` and a lock named `x` are unrelated.
/// Versions strictly increase per name; a name that was never written has no version.
#[async_trait]
pub trait ValueStore: Send + Sync {
    /// The current value and version, or `None` when it was never written.
    ///
    /// # Errors
    ///
    /// Store failures; [`Error::WrongType`](crate::Error::WrongType) for a foreign entry.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn get(&self, name: &LockName) -> Result<Option<Versioned>>;

    /// Writes `value` if `expect` holds for the current version, in one atomic step of the
    /// store. Returns the new version, or `None` when `expect` did not hold (nothing written).
    ///
    /// # Errors
    ///
    /// Store failures; [`Error::WrongType`](crate::Error::WrongType) for a foreign entry.
    ///
    /// # Cancel safety
    ///
    /// A dropped call may or may not have written.
    async fn put(&self, name: &LockName, expect: Expect, value: &[u8]) -> Result<Option<u64>>;
}
