//! One acquisition attempt run to completion whatever the caller does, and the conversions
//! of values that cross into SQL.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::Lease;
use crate::backend::wait::Attempt;
use crate::error::{Error, Result};

/// Milliseconds, saturating, for SQL parameters.
pub(crate) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A granted lease on its way to the caller. If nobody takes it (the acquire future was
/// dropped while the store was granting), dropping it releases the lock at once instead of
/// leaving it held for its TTL.
struct Granted(Option<Arc<dyn Lease>>);

impl Granted {
    fn take(mut self) -> Option<Arc<dyn Lease>> {
        self.0.take()
    }
}

impl Drop for Granted {
    fn drop(&mut self) {
        if let Some(lease) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move {
                if let Err(error) = lease.release().await {
                    tracing::debug!(%error, "undoing an abandoned grant failed; the TTL frees it");
                }
                lease.lost().cancel();
            });
        }
    }
}

/// Runs one acquisition attempt in its own task, so the store call always completes: if the
/// caller drops the returned future after the store granted the lock, the grant is undone.
pub(crate) async fn detached_attempt<F>(attempt: F) -> Result<Attempt>
where
    F: Future<Output = Result<Attempt>> + Send + 'static,
{
    let task = tokio::spawn(async move {
        attempt.await.map(|attempt| match attempt {
            Attempt::Acquired(lease) => Ok(Granted(Some(lease))),
            other => Err(other),
        })
    });
    match task.await {
        Ok(Ok(Ok(granted))) => {
            granted
                .take()
                .map(Attempt::Acquired)
                .ok_or_else(|| Error::Backend {
                    backend: "sql",
                    source: "a granted lease went missing".into(),
                })
        }
        Ok(Ok(Err(busy))) => Ok(busy),
        Ok(Err(error)) => Err(error),
        Err(join) => Err(Error::Unavailable {
            backend: "sql",
            source: Box::new(join),
        }),
    }
}
