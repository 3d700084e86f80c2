//! Taking a mutex (`acquire.lua`, waiting by pub/sub) or several at once
//! (`acquire_all.lua`), and cleaning up after a call that ends without the lock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use super::error::bad_reply;
use super::lease::RedisLease;
use super::scripts::{self, Keys};
use super::wake::{Heard, Waiter};
use super::{Inner, RedisBackend, ms, owner_field, woken};
use crate::backend::abandon::{Abandon, spawn_cleanup};
use crate::backend::wait::{Attempt, Backoff, acquire_loop};
use crate::backend::{AcquireRequest, Lease, LeaseCore, Wait};
use crate::error::Result;
use crate::fence::FencingToken;

/// What an acquire call leaves to clean up if it ends without the lock.
#[derive(Default)]
struct Leftovers {
    /// An attempt was sent and its reply not read (the call was dropped mid-flight).
    in_flight: AtomicBool,
    /// A busy attempt put this request in the lock's queue.
    queued: AtomicBool,
}

/// Cleans up after an acquire call that ended without the lock (timeout, error, dropped):
/// takes the request out of the queue, and gives back a grant whose reply was never read.
fn abandon_mutex(inner: &Inner, keys: &Keys, token: &str, reentrant: bool, leftovers: &Leftovers) {
    let in_flight = leftovers.in_flight.load(Ordering::Relaxed);
    if !(in_flight || leftovers.queued.load(Ordering::Relaxed)) {
        return;
    }
    // Without a runtime, the queue entry and any lease expire on their own.
    spawn_cleanup(|| {
        let mut conn = inner.conn();
        let keys = keys.clone();
        let token = token.to_owned();
        // A reentrant token is shared by the client's holds: never release by token alone.
        let release = if in_flight && !reentrant { "1" } else { "0" };
        let abandon = &inner.scripts().abandon;
        async move {
            let done: ::redis::RedisResult<i64> = abandon
                .key(&keys.lock)
                .key(keys.queue())
                .key(keys.qexp())
                .arg(&token)
                .arg(keys.channel())
                .arg(release)
                .invoke_async(&mut conn)
                .await;
            if let Err(error) = done {
                tracing::debug!(%error, lock = keys.lock, "clean-up after an abandoned acquire failed; it expires instead");
            }
        }
    });
}

/// Completes when the waiter registered by a busy attempt is woken; never before one is.
pub(super) async fn woken_lazily(waiter: &OnceLock<Waiter>) {
    woken(waiter.get()).await;
}

/// A busy reply (`free_in`: the holder's ms left, negative when it has no expiry): a call
/// that waits registers its waiter on `channel` now, once (see `Wakeups::waiter_after`).
pub(super) fn busy(
    inner: &Inner,
    waiter: Option<(&OnceLock<Waiter>, &str, &str, Heard)>,
    free_in: i64,
) -> Attempt {
    if let Some((waiter, channel, token, heard)) = waiter {
        waiter.get_or_init(|| inner.node.wakeups.waiter_after(channel, token, heard));
    }
    Attempt::Busy {
        free_in: u64::try_from(free_in).ok().map(Duration::from_millis),
    }
}

impl RedisBackend {
    /// A mutex hold: `acquire.lua`, waiting by pub/sub.
    pub(super) async fn acquire_mutex(
        &self,
        req: &AcquireRequest,
    ) -> Result<Option<Arc<dyn Lease>>> {
        let inner = &self.inner;
        let keys = Arc::new(inner.keys(req.name.as_str()));
        let (queue, qexp) = (keys.queue(), keys.qexp());
        let waits = req.wait != Wait::No;
        let leftovers = Leftovers::default();
        let abandon =
            Abandon::on_drop(|| abandon_mutex(inner, &keys, &req.token, req.reentrant, &leftovers));
        // Registered on the first busy reply: a call that gets the lock at once never waits.
        let waiter = OnceLock::new();
        let ttl_ms = ms(req.ttl);
        let owner = owner_field(&req.owner);
        let poll = Backoff::new(inner.config.poll_min, inner.config.poll_max);
        let acquired = acquire_loop(
            req.wait,
            Some(poll),
            || async {
                let mut conn = inner.conn();
                let script = &inner.scripts().acquire;
                let mut invocation = scripts::evalsha(script, &[&keys.lock, &queue, &qexp]);
                invocation
                    .arg(&req.token)
                    .arg(ttl_ms)
                    .arg(u8::from(req.reentrant))
                    .arg(u8::from(req.fair))
                    .arg(u8::from(waits))
                    .arg(u8::from(leftovers.queued.load(Ordering::Relaxed)))
                    .arg(&owner);
                let heard = inner.node.wakeups.heard();
                let start = Instant::now();
                leftovers.in_flight.store(true, Ordering::Relaxed);
                let reply: Result<Vec<i64>> = scripts::run(script, &invocation, &mut conn)
                    .await
                    .map_err(|e| inner.fail(e, &keys.lock));
                leftovers.in_flight.store(false, Ordering::Relaxed);
                match reply?.as_slice() {
                    [1, fence, _reentered] => Ok(Attempt::Acquired(Arc::new(RedisLease {
                        inner: inner.clone(),
                        keys: keys.clone(),
                        token: req.token.clone(),
                        core: LeaseCore::new(FencingToken::from_signed(*fence), start),
                    }))),
                    [0, free_in] => {
                        leftovers.queued.fetch_or(waits, Ordering::Relaxed);
                        // Made only here: a grant or a call that does not wait never needs it.
                        let channel = waits.then(|| keys.channel());
                        let waiting = channel
                            .as_deref()
                            .map(|channel| (&waiter, channel, &*req.token, heard));
                        Ok(busy(inner, waiting, *free_in))
                    }
                    _ => Err(bad_reply("acquire")),
                }
            },
            // Looked up when polled, after the attempt: the first one registers the waiter.
            || woken_lazily(&waiter),
        )
        .await;
        if matches!(acquired, Ok(Some(_))) {
            abandon.disarm();
        } else {
            abandon.undo_now();
        }
        acquired
    }

    /// `acquire_all.lua`: every lock or none, in one script (one node holds them all).
    pub(super) async fn acquire_all(
        &self,
        reqs: &[AcquireRequest],
    ) -> Result<Option<Vec<Arc<dyn Lease>>>> {
        for req in reqs {
            crate::ttl::check_store_ttl(req.ttl)?;
        }
        let (Some(first), Some(ttl)) = (reqs.first(), reqs.iter().map(|r| r.ttl).min()) else {
            return Ok(Some(Vec::new()));
        };
        let all_keys: Vec<Keys> = reqs
            .iter()
            .map(|req| self.inner.keys(req.name.as_str()))
            .collect();
        let mut invocation = self.inner.scripts().acquire_all.prepare_invoke();
        for keys in &all_keys {
            invocation
                .key(&keys.lock)
                .key(keys.queue())
                .key(keys.qexp());
        }
        invocation.arg(ms(ttl)).arg(owner_field(&first.owner));
        for req in reqs {
            invocation.arg(&req.token);
        }
        let mut conn = self.inner.conn();
        let start = Instant::now();
        let reply: Vec<i64> = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.inner.fail(e, &all_keys[0].lock))?;
        match reply.split_first() {
            Some((1, fences)) if fences.len() == reqs.len() => Ok(Some(
                reqs.iter()
                    .zip(all_keys)
                    .zip(fences)
                    .map(|((req, keys), fence)| {
                        Arc::new(RedisLease {
                            inner: self.inner.clone(),
                            keys: Arc::new(keys),
                            token: req.token.clone(),
                            core: LeaseCore::new(FencingToken::from_signed(*fence), start),
                        }) as Arc<dyn Lease>
                    })
                    .collect(),
            )),
            Some((0, _)) => Ok(None),
            _ => Err(bad_reply("acquire_all")),
        }
    }
}
