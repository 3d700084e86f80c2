//! Several exclusive holds that live and die together: the guard of a multi-lock and of a
//! write lock.

use std::time::Duration;

use futures::future::join_all;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::hold::options::Terms;
use crate::lease::Lost;
use crate::mutex::MutexGuard;
use crate::name::LockName;

/// The lost-signal, extend, ownership and release methods of a composed primitive's guard, delegated to
/// its `$field` (a `MutexGuard` or a `GuardSet`, which have the same methods).
macro_rules! hold_methods {
    ($field:ident) => {
        /// Completes when the hold is lost (lease expired, renewal refused, broken; for a hold
        /// made of several store locks, any of them), or at once after release.
        pub fn lost(&self) -> crate::lease::Lost<'_> {
            self.$field.lost()
        }

        /// An owned token cancelled when the hold is lost. Cancelling it yourself does not
        /// affect the hold.
        pub fn lost_token(&self) -> tokio_util::sync::CancellationToken {
            self.$field.lost_token()
        }

        /// Whether the hold is known to be lost.
        pub fn is_lost(&self) -> bool {
            self.$field.is_lost()
        }

        /// Why the hold was lost, once it is (for a hold made of several store locks, the
        /// reason of the first lost one in canonical order); `None` while it is held. See
        /// [`LostReason`](crate::LostReason) and
        /// [`MutexGuard::lost_reason`](crate::MutexGuard::lost_reason).
        pub fn lost_reason(&self) -> Option<crate::LostReason> {
            self.$field.lost_reason()
        }

        /// Makes the lease last at least `ttl` from now, if the hold is still this guard's; see
        /// [`MutexGuard::extend`](crate::MutexGuard::extend).
        ///
        /// # Errors
        ///
        /// [`Error::NotOwned`](crate::Error::NotOwned) when the hold was lost (the lost signal
        /// then fires); [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a TTL out
        /// of range; store errors (the first, after every store lock was tried).
        ///
        /// # Cancel safety
        ///
        /// Cancel safe: each lease is either extended or not.
        pub async fn extend(&self, ttl: std::time::Duration) -> crate::error::Result<()> {
            self.$field.extend(ttl).await
        }

        /// Asks the store whether the hold is still this guard's (for a hold made of several
        /// store locks, all of them); it changes nothing. `false` also fires the lost signal.
        /// For a local answer with no round trip, use `is_lost`.
        ///
        /// # Errors
        ///
        /// Store errors (the answer is then unknown).
        ///
        /// # Cancel safety
        ///
        /// Cancel safe: it only reads.
        pub async fn is_owned(&self) -> crate::error::Result<bool> {
            self.$field.is_owned().await
        }

        /// Releases the hold.
        ///
        /// # Errors
        ///
        /// [`Error::NotOwned`](crate::Error::NotOwned) when the hold had already been lost;
        /// store errors otherwise (the first, after every store lock was released), the lease
        /// then expiring within its TTL.
        ///
        /// # Cancel safety
        ///
        /// A dropped release may or may not have reached the store; the TTL frees the hold at
        /// the latest.
        pub async fn release(self) -> crate::error::Result<()> {
            self.$field.release().await
        }
    };
}
pub(crate) use hold_methods;

/// Holds; one lost signal fired when any of them is lost.
#[derive(Debug)]
pub(crate) struct GuardSet {
    guards: Vec<MutexGuard>,
    lost: CancellationToken,
    watcher: tokio::task::AbortHandle,
}

impl GuardSet {
    /// Takes over `guards`; must be called on a tokio runtime (acquisitions are).
    pub(crate) fn new(guards: Vec<MutexGuard>) -> GuardSet {
        let lost = CancellationToken::new();
        let tokens: Vec<CancellationToken> = guards.iter().map(MutexGuard::lost_token).collect();
        let signal = lost.clone();
        let watcher = tokio::spawn(async move {
            let any_lost = tokens.iter().map(|token| Box::pin(token.cancelled()));
            if tokens.is_empty() {
                return;
            }
            futures::future::select_all(any_lost).await;
            signal.cancel();
        })
        .abort_handle();
        GuardSet {
            guards,
            lost,
            watcher,
        }
    }

    pub(crate) fn guards(&self) -> &[MutexGuard] {
        &self.guards
    }

    pub(crate) fn fences(&self) -> impl Iterator<Item = (&LockName, FencingToken)> {
        self.guards
            .iter()
            .map(|guard| (guard.name(), guard.fence()))
    }

    pub(crate) fn lost(&self) -> Lost<'_> {
        Lost::from_token(&self.lost)
    }

    pub(crate) fn lost_token(&self) -> CancellationToken {
        self.lost.child_token()
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.is_cancelled() || self.guards.iter().any(MutexGuard::is_lost)
    }

    /// The reason of the first lost hold, in canonical order (the set's signal fires only
    /// when one of its holds is lost, so one says why).
    pub(crate) fn lost_reason(&self) -> Option<crate::LostReason> {
        if !self.is_lost() {
            return None;
        }
        let reason = self.guards.iter().find_map(MutexGuard::lost_reason);
        Some(reason.unwrap_or(crate::LostReason::StoreSignal))
    }

    /// Extends every hold; the first error, after all were tried.
    pub(crate) async fn extend(&self, ttl: Duration) -> Result<()> {
        let results = join_all(self.guards.iter().map(|guard| guard.extend(ttl))).await;
        results.into_iter().collect()
    }

    /// Asks the store about every hold: owned only if all are.
    pub(crate) async fn is_owned(&self) -> Result<bool> {
        let results = join_all(self.guards.iter().map(MutexGuard::is_owned)).await;
        let mut owned = true;
        for result in results {
            owned &= result?;
        }
        Ok(owned)
    }

    /// Releases every hold; the first error, after all were tried.
    pub(crate) async fn release(mut self) -> Result<()> {
        let guards = std::mem::take(&mut self.guards);
        let results = join_all(guards.into_iter().map(MutexGuard::release)).await;
        self.lost.cancel();
        results.into_iter().collect()
    }
}

impl Drop for GuardSet {
    fn drop(&mut self) {
        // The guards release themselves on drop; the watcher has nothing left to watch.
        self.watcher.abort();
    }
}

/// Releases one part of a composed hold on a task of its own, and waits for it. A composed
/// acquisition is cancel safe, but a dropped [`MutexGuard::release`] may never reach the
/// store, leaving the part held for its whole TTL (a semaphore's gate, with the 600 s TTL of
/// the conformance case `<backend>::semaphore1::cancel::dropping_an_acquire_at_any_point_…`):
/// the task finishes the release whether its caller stays or not.
pub(crate) async fn release_part(guard: MutexGuard) -> crate::error::Result<()> {
    tokio::spawn(guard.release()).await.unwrap_or_else(|join| {
        Err(crate::error::Error::Backend {
            backend: "dlock",
            source: format!("a release task failed: {join}").into(),
        })
    })
}

/// Releases holds taken so far when a composed acquisition gives up; errors are only logged,
/// as the TTL frees the locks in any case.
pub(crate) async fn release_all(guards: Vec<MutexGuard>) {
    for result in join_all(guards.into_iter().map(release_part)).await {
        if let Err(error) = result {
            tracing::debug!(%error, "releasing a partial acquisition failed");
        }
    }
}

/// Ends the collection of a composed hold's parts, taken on [`Terms::collecting`] terms: a
/// fixed-TTL part the keeper renewed while the call waited for the others gets its whole TTL
/// again from now (one extension, only for parts taken more than a tenth of the TTL ago) and
/// is no longer renewed. `Ok(false)` when a part was lost meanwhile: the hold is not whole,
/// and the caller lets every part go (and starts again, or gives up).
pub(crate) async fn settle(parts: &[MutexGuard], terms: &Terms) -> Result<bool> {
    if let Some(ttl) = terms.settled_ttl() {
        let stale = parts.iter().filter(|part| part.held_for() > ttl / 10);
        for result in join_all(stale.map(|part| part.extend(ttl))).await {
            match result {
                Ok(()) => {}
                Err(Error::NotOwned { .. }) => return Ok(false),
                Err(error) => return Err(error),
            }
        }
        for part in parts {
            part.stop_renewing();
        }
    }
    Ok(!parts.iter().any(MutexGuard::is_lost))
}
