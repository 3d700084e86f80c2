//! Several exclusive holds that live and die together: the guard of a multi-lock and of a
//! write lock.

use std::time::Duration;

use futures::future::join_all;
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::fence::FencingToken;
use crate::lease::Lost;
use crate::mutex::MutexGuard;
use crate::name::LockName;

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

/// Releases holds taken so far when a composed acquisition gives up; errors are only logged,
/// as the TTL frees the locks in any case.
pub(crate) async fn release_all(guards: Vec<MutexGuard>) {
    for result in join_all(guards.into_iter().map(MutexGuard::release)).await {
        if let Err(error) = result {
            tracing::debug!(%error, "releasing a partial acquisition failed");
        }
    }
}
