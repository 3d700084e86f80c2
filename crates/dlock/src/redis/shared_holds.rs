//! Holds that several clients share: native semaphores and read-write locks. Each kind keeps
//! its holders in a sorted set scored by lease end and their fences in a hash; every acquire,
//! extend and release is one script, and releases are published on the lock's channel, so
//! waiters are woken instead of polling (Redisson's `RPermitExpirableSemaphore` and
//! `RReadWriteLock` have the same shape).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ::redis::Script;
use async_trait::async_trait;
use tokio::time::Instant;

use crate::backend::abandon::{Abandon, spawn_cleanup};
use crate::backend::wait::{Attempt, Backoff, acquire_loop};
use crate::backend::{AcquireRequest, Lease, LeaseCore, LockKind, Wait};
use crate::error::{Error, Result};
use crate::fence::FencingToken;

use super::error::bad_reply;
use super::scripts::{Scripts, SharedKeys};
use super::{Inner, ms};

/// The kind of shared hold, with what it takes in the store.
#[derive(Clone, Copy, Debug)]
enum Shape {
    Permit { permits: u32 },
    Read { max_readers: u32 },
    Write,
}

impl Shape {
    fn of(kind: LockKind) -> Option<Shape> {
        match kind {
            LockKind::Permit { permits } => Some(Shape::Permit { permits }),
            LockKind::Read { max_readers } => Some(Shape::Read { max_readers }),
            LockKind::Write => Some(Shape::Write),
            _ => None,
        }
    }

    /// What this kind runs in the store, chosen here once.
    fn script_set(self, scripts: &'static Scripts) -> ScriptSet {
        match self {
            Shape::Permit { .. } => ScriptSet {
                keys: SharedKeys::permits,
                acquire: &scripts.permit_acquire,
                release: &scripts.permit_release,
                extend: &scripts.permit_extend,
            },
            Shape::Read { .. } | Shape::Write => ScriptSet {
                keys: SharedKeys::rwlock,
                acquire: &scripts.rw_acquire,
                release: &scripts.rw_release,
                extend: &scripts.rw_extend,
            },
        }
    }

    /// The acquire script's arguments after token and TTL.
    fn acquire_args(
        self,
        invocation: &mut ::redis::ScriptInvocation<'_>,
        waits: bool,
        owner: &str,
    ) {
        match self {
            Shape::Permit { permits } => invocation.arg(permits),
            Shape::Read { max_readers } => {
                invocation.arg("r").arg(max_readers).arg(u8::from(waits))
            }
            Shape::Write => invocation.arg("w").arg(0).arg(u8::from(waits)),
        };
        invocation.arg(owner);
    }
}

/// The key layout and the scripts of one kind of shared hold: semaphores have theirs, read
/// and write holds share the read-write lock's.
#[derive(Clone, Copy)]
struct ScriptSet {
    /// The keys of a name under a prefix.
    keys: fn(&str, &str) -> SharedKeys,
    acquire: &'static Script,
    release: &'static Script,
    extend: &'static Script,
}

impl std::fmt::Debug for ScriptSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The scripts' text says nothing a reader of a hold needs; the key layout does.
        f.debug_struct("ScriptSet")
            .field("keys", &(self.keys)("", ""))
            .finish_non_exhaustive()
    }
}

/// Takes the shared hold `req.kind` asks for (a permit, a read or a write hold), waiting as
/// `req.wait` says. `None` for an exclusive request, which is not a shared hold.
pub(super) async fn acquire(
    inner: &Arc<Inner>,
    req: &AcquireRequest,
) -> Option<Result<Option<Arc<dyn Lease>>>> {
    let shape = Shape::of(req.kind)?;
    let name = req.name.as_str();
    let waits = req.wait != Wait::No;
    let set = shape.script_set(inner.scripts());
    let keys = (set.keys)(&inner.config.prefix, &inner.in_key(name));
    let waiter = waits.then(|| inner.node.wakeups.waiter(&keys.channel, &req.token));
    let in_flight = AtomicBool::new(false);
    let may_claim = waits && matches!(shape, Shape::Write);
    let abandon = Abandon::on_drop(|| {
        give_back(inner, &keys, set.release, &req.token, &in_flight, may_claim)
    });
    let owner = super::owner_field(&req.owner);
    let poll = Backoff::new(inner.config.poll_min, inner.config.poll_max);
    let acquired = acquire_loop(
        req.wait,
        Some(poll),
        || async {
            let mut conn = inner.conn();
            let mut invocation = set.acquire.key(&keys.holders);
            invocation.key(&keys.state).arg(&req.token).arg(ms(req.ttl));
            shape.acquire_args(&mut invocation, waits, &owner);
            let start = Instant::now();
            in_flight.store(true, Ordering::Relaxed);
            let reply: Result<Vec<i64>> = invocation
                .invoke_async(&mut conn)
                .await
                .map_err(|e| inner.fail(e, &keys.holders));
            in_flight.store(false, Ordering::Relaxed);
            match reply?.as_slice() {
                [1, fence] => Ok(Attempt::Acquired(Arc::new(SharedHold {
                    inner: inner.clone(),
                    keys: keys.clone(),
                    set,
                    name: name.to_owned(),
                    token: req.token.clone(),
                    core: LeaseCore::new(FencingToken::from_signed(*fence), start),
                }))),
                [0, free_in] => Ok(Attempt::Busy {
                    free_in: u64::try_from(*free_in).ok().map(Duration::from_millis),
                }),
                [2, size] => match shape {
                    Shape::Permit { permits } => Err(Error::SizeMismatch {
                        name: name.to_owned(),
                        asked: permits,
                        held_with: u32::try_from(*size).unwrap_or(u32::MAX),
                    }),
                    _ => Err(bad_reply("shared acquire")),
                },
                _ => Err(bad_reply("shared acquire")),
            }
        },
        || super::woken(waiter.as_ref()),
    )
    .await;
    if matches!(acquired, Ok(Some(_))) {
        abandon.disarm();
    } else {
        abandon.undo_now();
    }
    Some(acquired)
}

/// Gives back what an acquire call that ended without the hold may have left: a grant whose
/// reply was never read, or a writer's claim to the next turn (`may_claim`).
fn give_back(
    inner: &Inner,
    keys: &SharedKeys,
    release: &'static Script,
    token: &str,
    in_flight: &AtomicBool,
    may_claim: bool,
) {
    // Only a grant whose reply was never read, or a writer's claim, is left to give back: a
    // reader or permit waiter that simply stops waiting leaves nothing (and its clean-up
    // would wake every waiter for nothing).
    if !(in_flight.load(Ordering::Relaxed) || may_claim) {
        return;
    }
    // Without a runtime, the lease or claim expires on its own.
    spawn_cleanup(|| {
        let mut conn = inner.conn();
        let keys = keys.clone();
        let token = token.to_owned();
        async move {
            let done: ::redis::RedisResult<i64> = release
                .key(&keys.holders)
                .key(&keys.state)
                .arg(&token)
                .arg("*")
                .arg(&keys.channel)
                .invoke_async(&mut conn)
                .await;
            if let Err(error) = done {
                tracing::debug!(%error, key = keys.holders, "clean-up after an abandoned acquire failed; it expires instead");
            }
        }
    });
}

/// One held permit, read hold or write hold.
#[derive(Debug)]
struct SharedHold {
    core: LeaseCore,
    inner: Arc<Inner>,
    keys: SharedKeys,
    set: ScriptSet,
    name: String,
    token: String,
}

#[async_trait]
impl Lease for SharedHold {
    fn core(&self) -> &LeaseCore {
        &self.core
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        crate::ttl::check_store_ttl(ttl)?;
        let mut conn = self.inner.conn();
        let owned = self.run_script(self.set.extend, ms(ttl), &mut conn).await?;
        if owned != 1 {
            return Err(Error::not_owned(&self.name));
        }
        self.inner
            .replicated("the extension", &self.keys.holders)
            .await
    }

    async fn release(&self) -> Result<()> {
        self.release_on(self.inner.conn()).await
    }

    /// On a fresh connection of the runtime this runs on (see `RedisLease`).
    async fn release_elsewhere(&self) -> Result<()> {
        let node = super::node::Node::connect(&self.inner.config, true).await?;
        self.release_on(node.conn()).await
    }
}

impl SharedHold {
    async fn release_on(&self, mut conn: super::conn::Conn) -> Result<()> {
        let released = self
            .run_script(self.set.release, &self.keys.channel, &mut conn)
            .await?;
        if released == 1 {
            Ok(())
        } else {
            Err(Error::not_owned(&self.name))
        }
    }

    /// Runs `script` on this hold: its keys, its token and fence, then `last` (the extend and
    /// release scripts differ only there).
    async fn run_script(
        &self,
        script: &Script,
        last: impl ::redis::ToRedisArgs,
        conn: &mut super::conn::Conn,
    ) -> Result<i64> {
        script
            .key(&self.keys.holders)
            .key(&self.keys.state)
            .arg(&self.token)
            .arg(self.core.fence().get())
            .arg(last)
            .invoke_async(conn)
            .await
            .map_err(|e| self.inner.fail(e, &self.keys.holders))
    }
}
