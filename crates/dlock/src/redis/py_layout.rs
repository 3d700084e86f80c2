//! Mutexes in redis-py's layout ([`RedisLayout::RedisPy`]): the lock is the key `NAME`
//! holding the holder's token with a `PX` expiry, exactly as redis-py's `Lock` keeps it, so a
//! redis-py holder and a dlock holder of one name exclude each other both ways. The fence and
//! the owner, which redis-py never reads, live in a side key (`scripts/py_acquire.lua`).
//!
//! redis-py's releases publish nothing, so a dlock waiter behind a redis-py holder is woken by
//! its fallback polling (at most `poll_max` apart) or when the holder's expiry passes; behind a
//! dlock holder it is woken by the release's message, as in dlock's own layout.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::acquire::{busy, woken_lazily};
use super::conn::Conn;
use super::error::bad_reply;
use super::node::Node;
use super::scripts::{self, channel};
use super::{Inner, RedisBackend, RedisLayout, ms, owner_field};
use crate::backend::abandon::{Abandon, spawn_cleanup};
use crate::backend::wait::{Attempt, Backoff, acquire_loop};
use crate::backend::{AcquireRequest, Lease, LeaseCore, LockInfo, Wait};
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::name::LockName;

/// The keys and channel of one lock in redis-py's layout.
#[derive(Debug)]
pub(super) struct PyKeys {
    /// The name itself: redis-py's key.
    lock: String,
    /// `{prefix}pylock:{name}`: token, fence and owner of a dlock holder.
    side: String,
    channel: String,
}

impl PyKeys {
    fn new(prefix: &str, name: &str) -> PyKeys {
        PyKeys {
            lock: name.to_owned(),
            side: format!("{prefix}pylock:{name}"),
            channel: channel(prefix, name),
        }
    }
}

impl Inner {
    pub(super) fn py_layout(&self) -> bool {
        self.config.layout == RedisLayout::RedisPy
    }

    fn py_keys(&self, name: &str) -> PyKeys {
        PyKeys::new(&self.config.prefix, name)
    }
}

impl RedisBackend {
    /// A mutex hold in redis-py's layout: `py_acquire.lua`, waiting by pub/sub (releases by
    /// dlock) and by polling (releases by redis-py).
    pub(super) async fn acquire_py(&self, req: &AcquireRequest) -> Result<Option<Arc<dyn Lease>>> {
        let inner = &self.inner;
        let keys = Arc::new(inner.py_keys(req.name.as_str()));
        let in_flight = AtomicBool::new(false);
        // A grant whose reply was never read (the call dropped mid-flight) is given back.
        let abandon = Abandon::on_drop(|| {
            if in_flight.load(Ordering::Relaxed) {
                give_back(inner, &keys, &req.token);
            }
        });
        let waiter = OnceLock::new();
        let ttl_ms = ms(req.ttl);
        let owner = owner_field(&req.owner);
        let poll = Backoff::new(inner.config.poll_min, inner.config.poll_max);
        let acquired = acquire_loop(
            req.wait,
            Some(poll),
            || async {
                let script = &inner.scripts().py.acquire;
                let mut invocation = scripts::evalsha(script, &[&keys.lock, &keys.side]);
                invocation.arg(&req.token).arg(ttl_ms).arg(&owner);
                let heard = inner.node.wakeups.heard();
                let start = Instant::now();
                in_flight.store(true, Ordering::Relaxed);
                let reply: Result<Vec<i64>> = scripts::run(script, &invocation, &mut inner.conn())
                    .await
                    .map_err(|e| inner.fail(e, &keys.lock));
                in_flight.store(false, Ordering::Relaxed);
                match reply?.as_slice() {
                    [1, fence] => Ok(Attempt::Acquired(Arc::new(PyLease {
                        inner: inner.clone(),
                        keys: keys.clone(),
                        token: req.token.clone(),
                        core: LeaseCore::new(FencingToken::from_signed(*fence), start),
                    }))),
                    [0, free_in] => {
                        let waits = req.wait != Wait::No;
                        let waiting =
                            waits.then_some((&waiter, &*keys.channel, &*req.token, heard));
                        Ok(busy(inner, waiting, *free_in))
                    }
                    _ => Err(bad_reply("acquire")),
                }
            },
            // Looked up when polled, after the attempt: a busy one registers the waiter.
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

    /// The holder of `name` in redis-py's layout, or `None` when it is free: a redis-py
    /// holder has fence 0 and no owner.
    pub(super) async fn inspect_py(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let keys = self.inner.py_keys(name.as_str());
        let reply: Vec<Option<String>> = self
            .inner
            .scripts()
            .py
            .inspect
            .key(&keys.lock)
            .key(&keys.side)
            .invoke_async(&mut self.inner.conn())
            .await
            .map_err(|e| self.inner.fail(e, &keys.lock))?;
        super::monitor::mutex_info(name.as_str().to_owned(), &reply)
    }

    /// Breaks `name` in redis-py's layout, whoever holds it.
    pub(super) async fn force_release_py(&self, name: &LockName) -> Result<bool> {
        let keys = self.inner.py_keys(name.as_str());
        let broken: i64 = self
            .inner
            .scripts()
            .py
            .force_release
            .key(&keys.lock)
            .arg(&keys.channel)
            .invoke_async(&mut self.inner.conn())
            .await
            .map_err(|e| self.inner.fail(e, &keys.lock))?;
        Ok(broken == 1)
    }
}

/// Releases by token a grant whose reply was never read; without a runtime it expires.
fn give_back(inner: &Arc<Inner>, keys: &Arc<PyKeys>, token: &str) {
    spawn_cleanup(|| {
        let (inner, keys, token) = (inner.clone(), keys.clone(), token.to_owned());
        async move {
            if let Err(error) = release(&inner, &keys, &token, inner.conn()).await {
                tracing::debug!(%error, lock = keys.lock, "giving back an abandoned grant failed; it expires instead");
            }
        }
    });
}

/// `py_release.lua`: whether the token held the lock (and no longer does).
async fn release(inner: &Inner, keys: &PyKeys, token: &str, mut conn: Conn) -> Result<bool> {
    let script = &inner.scripts().py.release;
    let mut release = scripts::evalsha(script, &[&keys.lock]);
    release.arg(token).arg(&keys.channel);
    let left: i64 = scripts::run(script, &release, &mut conn)
        .await
        .map_err(|e| inner.fail(e, &keys.lock))?;
    Ok(left >= 0)
}

/// One hold of a lock in redis-py's layout.
#[derive(Debug)]
struct PyLease {
    core: LeaseCore,
    inner: Arc<Inner>,
    keys: Arc<PyKeys>,
    token: String,
}

impl PyLease {
    async fn release_on(&self, conn: Conn) -> Result<()> {
        if release(&self.inner, &self.keys, &self.token, conn).await? {
            Ok(())
        } else {
            Err(Error::not_owned(&self.keys.lock))
        }
    }
}

#[async_trait]
impl Lease for PyLease {
    fn core(&self) -> &LeaseCore {
        &self.core
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        crate::ttl::check_store_ttl(ttl)?;
        let owned: i64 = self
            .inner
            .scripts()
            .py
            .extend
            .key(&self.keys.lock)
            .key(&self.keys.side)
            .arg(&self.token)
            .arg(ms(ttl))
            .invoke_async(&mut self.inner.conn())
            .await
            .map_err(|e| self.inner.fail(e, &self.keys.lock))?;
        if owned != 1 {
            return Err(Error::not_owned(&self.keys.lock));
        }
        self.inner
            .replicated("the extension", &self.keys.lock)
            .await
    }

    async fn release(&self) -> Result<()> {
        self.release_on(self.inner.conn()).await
    }

    /// `py_put_fenced.lua`: the lock's key checked for this token and the value written in
    /// one script (never on a cluster: this layout is refused there).
    async fn put_fenced(&self, value: &LockName, bytes: &[u8]) -> Result<Option<u64>> {
        let value_key = scripts::value_key(&self.inner.config.prefix, value.as_str());
        self.inner
            .scripts()
            .py
            .put_fenced
            .key(&self.keys.lock)
            .key(&value_key)
            .arg(&self.token)
            .arg(bytes)
            .invoke_async(&mut self.inner.conn())
            .await
            .map_err(|e| self.inner.fail(e, &value_key))
    }

    /// On a connection of the runtime this runs on (see the dlock layout's lease).
    async fn release_elsewhere(&self) -> Result<()> {
        let node = Node::connect(&self.inner.config, true).await?;
        self.release_on(node.conn()).await
    }
}
