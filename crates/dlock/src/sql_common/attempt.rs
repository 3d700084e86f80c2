//! One acquisition attempt run to completion whatever the caller does, and the conversions
//! of values that cross into SQL.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::Lease;
use crate::backend::abandon::{Abandon, spawn_cleanup};
use crate::backend::wait::Attempt;
use crate::error::{Error, Result};

/// Milliseconds, saturating, for SQL parameters.
pub(crate) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A granted lease on its way to the caller: if nobody takes it (the acquire future was
/// dropped while the store was granting), it is released at once instead of being left held
/// for its TTL.
fn undo_grant(lease: Arc<dyn Lease>) {
    spawn_cleanup(|| async move {
        if let Err(error) = lease.release().await {
            tracing::debug!(%error, "undoing an abandoned grant failed; the TTL frees it");
        }
        lease.lost().cancel();
    });
}

/// Runs one acquisition attempt in its own task, so the store call always completes: if the
/// caller drops the returned future after the store granted the lock, the grant is undone.
pub(crate) async fn detached_attempt<F>(attempt: F) -> Result<Attempt>
where
    F: Future<Output = Result<Attempt>> + Send + 'static,
{
    let task = tokio::spawn(async move {
        attempt.await.map(|attempt| match attempt {
            Attempt::Acquired(lease) => Ok(Abandon::new(lease, undo_grant as fn(_))),
            other => Err(other),
        })
    });
    match task.await {
        Ok(Ok(Ok(granted))) => Ok(Attempt::Acquired(granted.into_inner())),
        Ok(Ok(Err(busy))) => Ok(busy),
        Ok(Err(error)) => Err(error),
        Err(join) => Err(Error::Unavailable {
            backend: "sql",
            source: Box::new(join),
        }),
    }
}
