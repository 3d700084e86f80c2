//! The native semaphore: every permit of a semaphore in one sorted set, each acquire, extend
//! and release one script, and releases published on the semaphore's channel, so waiters are
//! woken instead of polling (Redisson's `RPermitExpirableSemaphore` has the same shape).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::{AcquireRequest, Lease, Wait};
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::wait::{Attempt, Backoff, acquire_loop};

use super::error::{bad_reply, map};
use super::scripts::{self, PermitKeys};
use super::{Inner, ms};

/// Takes one of `permits` permits of the semaphore `req.name`, waiting as `req.wait` says.
pub(super) async fn acquire(
    inner: &Arc<Inner>,
    req: &AcquireRequest,
    permits: u32,
) -> Result<Option<Arc<dyn Lease>>> {
    let keys = PermitKeys::new(&inner.config.prefix, req.name.as_str());
    let waiter = (req.wait != Wait::No).then(|| inner.wakeups.waiter(&keys.channel, &req.token));
    let in_flight = AtomicBool::new(false);
    let mut abandon = Abandon {
        inner,
        keys: &keys,
        token: &req.token,
        in_flight: &in_flight,
        armed: true,
    };
    let poll = Backoff::new(inner.config.poll_min, inner.config.poll_max);
    let acquired = acquire_loop(
        req.wait,
        Some(poll),
        || async {
            let mut conn = inner.conn.clone();
            let start = Instant::now();
            in_flight.store(true, Ordering::Relaxed);
            let reply: Result<Vec<i64>> = scripts::PERMIT_ACQUIRE
                .key(&keys.holders)
                .key(&keys.fences)
                .arg(&req.token)
                .arg(ms(req.ttl))
                .arg(permits)
                .invoke_async(&mut conn)
                .await
                .map_err(|e| map(e, &keys.holders));
            in_flight.store(false, Ordering::Relaxed);
            match reply?.as_slice() {
                [1, fence] => Ok(Attempt::Acquired(Arc::new(RedisPermit {
                    inner: inner.clone(),
                    keys: keys.clone(),
                    name: req.name.as_str().to_owned(),
                    token: req.token.clone(),
                    fence: u64::try_from(*fence).unwrap_or(0),
                    lost: CancellationToken::new(),
                    start,
                }))),
                [0, free_in] => Ok(Attempt::Busy {
                    free_in: u64::try_from(*free_in).ok().map(Duration::from_millis),
                }),
                _ => Err(bad_reply("permit acquire")),
            }
        },
        || async {
            match &waiter {
                Some(waiter) => waiter.woken().await,
                None => std::future::pending().await,
            }
        },
    )
    .await;
    abandon.armed = !matches!(acquired, Ok(Some(_)));
    acquired
}

/// Gives back a permit that an acquire call dropped mid-flight may have been granted.
struct Abandon<'a> {
    inner: &'a Arc<Inner>,
    keys: &'a PermitKeys,
    token: &'a str,
    in_flight: &'a AtomicBool,
    armed: bool,
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if !self.armed || !self.in_flight.load(Ordering::Relaxed) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // the permit's lease expires on its own
        };
        let mut conn = self.inner.conn.clone();
        let keys = self.keys.clone();
        let token = self.token.to_owned();
        runtime.spawn(async move {
            let done: ::redis::RedisResult<i64> = scripts::PERMIT_RELEASE
                .key(&keys.holders)
                .key(&keys.fences)
                .arg(&token)
                .arg("*")
                .arg(&keys.channel)
                .invoke_async(&mut conn)
                .await;
            if let Err(error) = done {
                tracing::debug!(%error, semaphore = keys.holders, "returning an abandoned permit failed; it expires instead");
            }
        });
    }
}

/// One held permit of a native semaphore.
#[derive(Debug)]
struct RedisPermit {
    inner: Arc<Inner>,
    keys: PermitKeys,
    name: String,
    token: String,
    fence: u64,
    lost: CancellationToken,
    start: Instant,
}

#[async_trait]
impl Lease for RedisPermit {
    fn fence(&self) -> FencingToken {
        FencingToken::new(self.fence)
    }

    fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    fn lease_start(&self) -> Instant {
        self.start
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        let mut conn = self.inner.conn.clone();
        let owned: i64 = scripts::PERMIT_EXTEND
            .key(&self.keys.holders)
            .key(&self.keys.fences)
            .arg(&self.token)
            .arg(self.fence)
            .arg(ms(ttl))
            .invoke_async(&mut conn)
            .await
            .map_err(|e| map(e, &self.keys.holders))?;
        if owned == 1 {
            Ok(())
        } else {
            Err(Error::not_owned(&self.name))
        }
    }

    async fn release(&self) -> Result<()> {
        let mut conn = self.inner.conn.clone();
        let released: i64 = scripts::PERMIT_RELEASE
            .key(&self.keys.holders)
            .key(&self.keys.fences)
            .arg(&self.token)
            .arg(self.fence)
            .arg(&self.keys.channel)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| map(e, &self.keys.holders))?;
        if released == 1 {
            Ok(())
        } else {
            Err(Error::not_owned(&self.name))
        }
    }
}
