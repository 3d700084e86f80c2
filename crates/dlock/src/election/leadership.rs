//! [`Leadership`]: the guard of an elected leader, a mutex hold with the election's record.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Election, record};
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::lease::Lost;
use crate::mutex::MutexGuard;
use crate::name::LockName;

/// The guard of an elected leader, returned by [`Election::campaign`]. Leadership lasts
/// while the guard holds the election's lock; dropping it resigns (in the background), as
/// [`resign`](Self::resign) does (awaited).
///
/// It is a [`Hold`](crate::Hold): [`lost`](Self::lost) fires, with a
/// [`lost_reason`](Self::lost_reason), when the term ends other than by resigning, and
/// [`run_while_held`](crate::run_while_held) runs a task for as long as the term lasts.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::connect("memory://leadership-doc").await?;
/// let leading = locks.election("compactor").campaign(b"worker-3").await?;
/// let work = async { /* write with leading.term() as the fence */ 7 };
/// assert_eq!(dlock::run_while_held(&leading, work).await?, 7);
/// leading.resign().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[clippy::has_significant_drop]
#[must_use = "if unused, leadership is given up at once"]
pub struct Leadership {
    election: Election,
    guard: MutexGuard,
    key: LockName,
    value: std::sync::Mutex<Vec<u8>>,
}

impl Leadership {
    /// The term's hold, for fenced writes.
    pub(crate) fn held(&self) -> &crate::lease::HeldLease {
        self.guard.held()
    }

    pub(super) fn new(
        election: Election,
        guard: MutexGuard,
        key: LockName,
        value: Vec<u8>,
    ) -> Leadership {
        Leadership {
            election,
            guard,
            key,
            value: std::sync::Mutex::new(value),
        }
    }

    /// The election's name.
    pub fn name(&self) -> &LockName {
        self.guard.name()
    }

    /// This leader's term: the fence of its hold, strictly greater than every earlier
    /// leader's term. Send it with every write made as leader.
    pub fn term(&self) -> FencingToken {
        self.guard.fence()
    }

    /// The same as [`term`](Self::term), under the name every guard has.
    pub fn fence(&self) -> FencingToken {
        self.term()
    }

    /// The value this leader published last.
    pub fn value(&self) -> Vec<u8> {
        self.value.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Completes when leadership is lost (lease expired, renewal refused, lock broken, store
    /// session gone), or at once if it already was; also after resigning.
    pub fn lost(&self) -> Lost<'_> {
        self.guard.lost()
    }

    /// An owned token cancelled when leadership is lost.
    pub fn lost_token(&self) -> CancellationToken {
        self.guard.lost_token()
    }

    /// Whether leadership is known to be lost (no store call).
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Why leadership was lost, once it is; `None` while leading. See
    /// [`LostReason`](crate::LostReason).
    pub fn lost_reason(&self) -> Option<crate::LostReason> {
        self.guard.lost_reason()
    }

    /// Extends a fixed-TTL term; see [`MutexGuard::extend`].
    ///
    /// # Errors
    ///
    /// As [`MutexGuard::extend`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        self.guard.extend(ttl).await
    }

    /// Asks the store whether this leader still holds its term.
    ///
    /// # Errors
    ///
    /// Store errors (the answer is then unknown).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn is_owned(&self) -> Result<bool> {
        self.guard.is_owned().await
    }

    /// Publishes `value` in place of the current one without giving up the term. The write
    /// is a compare-and-set made only after the store confirmed the hold and no later term
    /// has published, so a leader that lost cannot overwrite its successor; readers trust a
    /// value only while its term is the current holder's.
    ///
    /// # Errors
    ///
    /// - [`Error::NotOwned`] once leadership is lost (known locally or told by the store);
    /// - [`Error::InvalidArgument`] for a value over
    ///   [`MAX_ELECTION_VALUE_LEN`](crate::election::MAX_ELECTION_VALUE_LEN), before any
    ///   store call;
    /// - [`Error::Unsupported`] on a store without versioned values; store errors.
    ///
    /// # Cancel safety
    ///
    /// A dropped call may or may not have published.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://proclaim-doc").await?;
    /// let leading = locks.election("primary").campaign(b"starting").await?;
    /// leading.proclaim(b"ready").await?;
    /// assert_eq!(leading.value(), b"ready");
    /// locks.force_release("primary").await?;
    /// assert!(matches!(leading.proclaim(b"late").await, Err(dlock::Error::NotOwned { .. })));
    /// # Ok(()) }
    /// ```
    pub async fn proclaim(&self, value: impl AsRef<[u8]>) -> Result<()> {
        let value = value.as_ref();
        record::check_value(value)?;
        let Some(values) = self.election.values() else {
            return Err(Error::Unsupported {
                operation: "proclaim (it needs versioned values)",
                backend: self.election.locks.info().name,
            });
        };
        if self.is_lost() {
            return Err(Error::not_owned(self.name().as_str()));
        }
        let backend = self.election.locks.info().name;
        record::publish(values, &self.key, backend, self.term(), value, || {
            self.guard.is_owned()
        })
        .await?;
        if let Ok(mut kept) = self.value.lock() {
            *kept = value.to_vec();
        }
        Ok(())
    }

    /// Gives up leadership: releases the hold, so the next campaigner is elected (woken by
    /// the store). The published record stays until the next leader's replaces it; it is
    /// never reported once its term has ended.
    ///
    /// # Errors
    ///
    /// [`Error::NotOwned`] when leadership was already lost; store errors.
    ///
    /// # Cancel safety
    ///
    /// A dropped call may or may not have released; the lease ends the term in any case.
    pub async fn resign(self) -> Result<()> {
        self.guard.release().await
    }

    /// The same as [`resign`](Self::resign), under the name every guard has.
    ///
    /// # Errors
    ///
    /// As [`resign`](Self::resign).
    ///
    /// # Cancel safety
    ///
    /// As [`resign`](Self::resign).
    pub async fn release(self) -> Result<()> {
        self.resign().await
    }
}
