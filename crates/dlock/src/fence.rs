//! Fencing tokens: the number that lets a resource reject a holder whose lease ran out.

use std::fmt;

/// A fencing token: strictly greater than the token of every earlier holder of the same lock
/// name, across releases, expiries and takeovers.
///
/// Pass it with every write to the protected resource and have the resource reject any write
/// whose token is lower than the highest it has seen. That is what makes a lease safe when a
/// holder is paused past its TTL (Kleppmann, "How to do distributed locking").
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::connect("memory://fence-doc").await?;
/// let first = locks.mutex("job").acquire().await?;
/// let t1 = first.fence();
/// first.release().await?;
/// let second = locks.mutex("job").acquire().await?;
/// assert!(second.fence() > t1);
/// # Ok(()) }
/// ```
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token (for backends and for resources that store tokens).
    pub const fn new(value: u64) -> FencingToken {
        FencingToken(value)
    }

    /// The token as a number.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// A token the store keeps as a signed 64-bit integer (a SQL `BIGINT`, a Redis integer,
    /// an etcd revision); stores never hand out one below 1, so a negative value reads as 0.
    #[cfg(dlock_any_backend)]
    pub(crate) fn from_signed(value: i64) -> FencingToken {
        FencingToken(u64::try_from(value).unwrap_or(0))
    }

    /// The token as a SQL store keeps it (`BIGINT`): the value [`from_signed`] read, for
    /// every token a store hands out.
    ///
    /// [`from_signed`]: FencingToken::from_signed
    #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
    pub(crate) fn signed(self) -> i64 {
        i64::try_from(self.0).unwrap_or(i64::MAX)
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> u64 {
        token.0
    }
}
