#![doc = include_str!("docs.md")]

mod cluster;
mod config;
pub(crate) mod conn;
pub(crate) mod driver;
pub(crate) mod error;
pub(crate) mod monitor;
pub(crate) mod node;
mod renewals;
pub(crate) mod scripts;
mod sentinel;
mod shared_holds;
pub(crate) mod wake;

pub use config::{MAX_POLL, RedisConfig, SENTINEL_PORT, SentinelConfig, WAITER_TTL};

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use conn::Conn;
use tokio::time::Instant;

use crate::backend::wait::{Attempt, Backoff, acquire_loop};
use crate::backend::{
    AcquireRequest, Backend, BackendInfo, Capabilities, Expect, Lease, LeaseCore, MonitorStore,
    ValueStore, Versioned, Wait,
};
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::name::{LockName, Owner};

use error::{BACKEND, bad_reply, map_timed};
use node::Node;
use scripts::Keys;

/// URL schemes served by this backend for one server.
pub const REDIS_SCHEMES: &[&str] = &["redis", "rediss"];
/// URL schemes of a primary found through Redis Sentinel.
pub const SENTINEL_SCHEMES: &[&str] = &["redis+sentinel", "rediss+sentinel"];
/// URL schemes of a Redis Cluster.
pub const CLUSTER_SCHEMES: &[&str] = &["redis+cluster", "rediss+cluster"];

const INFO: BackendInfo = BackendInfo::new(
    BACKEND,
    Capabilities {
        permits: true,
        rwlock: true,
        ..Capabilities::SHARED_STORE
    },
);

/// Builds a [`RedisBackend`] from options.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// use std::time::Duration;
/// use dlock::redis::RedisBuilder;
/// let backend = RedisBuilder::new("redis://app:secret@cache:6379/0")?
///     .prefix("billing:")
///     .response_timeout(Duration::from_millis(500))
///     .build()
///     .await?;
/// let locks = dlock::Locks::new(backend);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct RedisBuilder {
    config: RedisConfig,
}

impl RedisBuilder {
    /// A builder for the server of a `redis://` or `rediss://` URL (options in the URL are
    /// read too; see [`RedisConfig::from_url`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] as for [`RedisConfig::from_url`].
    pub fn new(url: &str) -> Result<RedisBuilder> {
        Ok(RedisBuilder {
            config: RedisConfig::from_url(url)?,
        })
    }

    /// A builder from a full config.
    pub fn from_config(config: RedisConfig) -> RedisBuilder {
        RedisBuilder { config }
    }

    /// See [`RedisConfig::prefix`].
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.config.prefix = prefix.into();
        self
    }

    /// See [`RedisConfig::ca_file`].
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.config.ca_file = Some(path.into());
        self
    }

    /// See [`RedisConfig::response_timeout`].
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.config.response_timeout = timeout;
        self
    }

    /// See [`RedisConfig::connect_timeout`].
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = timeout;
        self
    }

    /// See [`RedisConfig::poll_min`] and [`RedisConfig::poll_max`].
    pub fn poll(mut self, min: Duration, max: Duration) -> Self {
        self.config.poll_min = min;
        self.config.poll_max = max;
        self
    }

    /// Connects (one multiplexed connection for commands; the pub/sub connection opens on
    /// the first wait) and checks the server answers.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`]: a bad option, or a CA file that cannot be read;
    /// - [`Error::Unauthenticated`]: wrong user or password;
    /// - [`Error::Unavailable`]: the server cannot be reached or the TLS handshake fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call only drops its connection.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let backend = dlock::redis::RedisBuilder::new("redis://127.0.0.1:6379")?.build().await?;
    /// # Ok(()) }
    /// ```
    pub async fn build(self) -> Result<RedisBackend> {
        let node = Node::connect(&self.config, true).await?;
        // Built now, on the connecting thread, not by the first acquire on some other thread: a
        // process forked while that thread builds them would find them half-built for good.
        scripts::Scripts::get(node.sharded());
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                node,
                config: self.config,
                renewals: renewals::Renewals::default(),
            }),
        })
    }
}

/// Locks in a Redis server: Lua scripts for every operation, pub/sub hand-off, reentrant
/// and fair locks, fences from a per-name counter.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::connect("redis://127.0.0.1:6379/0?prefix=app:").await?;
/// let guard = locks.mutex("nightly-report").acquire().await?;
/// println!("fence {}", guard.fence());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    node: Node,
    config: RedisConfig,
    /// Extensions gathered into one script ([`renewals`]).
    renewals: renewals::Renewals,
}

impl Inner {
    /// The command connection to the current primary (or the cluster).
    fn conn(&self) -> Conn {
        self.node.conn()
    }

    /// With `min_replicas`, waits until that many replicas have every write this client sent
    /// so far (`WAIT`, on the shared command connection); `what` names the write for the
    /// error, `key` is a key of the lock it wrote.
    ///
    /// On a cluster the `WAIT` goes to the primary of `key`'s slot only: redis-rs would send
    /// it to every primary and answer the smallest count, so one shard's lagging replica
    /// would refuse the grants of every shard.
    async fn replicated(&self, what: &str, key: &str) -> Result<()> {
        let wanted = self.config.min_replicas;
        if wanted == 0 {
            return Ok(());
        }
        let mut conn = self.conn();
        let mut wait = ::redis::cmd("WAIT");
        wait.arg(wanted).arg(ms(self.config.replica_timeout));
        let acked: ::redis::RedisResult<u32> = match conn.cluster() {
            Some(cluster) => cluster
                .route_command(wait, cluster::to_slot_primary(key))
                .await
                .and_then(|value| ::redis::from_redis_value(value).map_err(Into::into)),
            None => wait.query_async(&mut conn).await,
        };
        let acked = acked.map_err(|e| self.fail(e, key))?;
        if acked >= wanted {
            return Ok(());
        }
        Err(Error::Unavailable {
            backend: BACKEND,
            source: format!(
                "{what}: {acked} of the {wanted} replicas asked for (min_replicas) acknowledged it \
                 within {:?} (replica_timeout)",
                self.config.replica_timeout
            )
            .into(),
        })
    }

    /// A grant that must reach `min_replicas` replicas: when it does not, it is released
    /// again and the call fails, so no caller holds a lock the replicas do not know.
    /// `key` is a key of one of them (on a cluster they share one slot).
    async fn confirm_grants(
        &self,
        leases: Option<Vec<Arc<dyn Lease>>>,
        key: &str,
    ) -> Result<Option<Vec<Arc<dyn Lease>>>> {
        let Some(leases) = leases else {
            return Ok(None);
        };
        if let Err(error) = self.replicated("the grant", key).await {
            for lease in &leases {
                if let Err(release) = lease.release().await {
                    tracing::debug!(%release, "releasing a grant the replicas did not confirm failed; it expires instead");
                }
            }
            return Err(error);
        }
        Ok(Some(leases))
    }

    /// A failed request as dlock's error; a timeout says the configured response timeout.
    /// A server that cannot be reached (or answers as a replica) may have been replaced by a
    /// failover: behind Sentinel, the sentinels are asked at once.
    fn fail(&self, error: ::redis::RedisError, key: &str) -> Error {
        let error = map_timed(error, key, self.config.response_timeout);
        if matches!(error, Error::Unavailable { .. }) {
            self.node.suspect();
        }
        error
    }
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// Connects to the server of a `redis://` or `rediss://` URL; see [`RedisConfig::from_url`].
    ///
    /// # Errors
    ///
    /// As [`RedisConfig::from_url`] and [`RedisBuilder::build`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let backend = dlock::redis::RedisBackend::connect_url("redis://127.0.0.1:6379").await?;
    /// let locks = dlock::Locks::new(backend);
    /// # Ok(()) }
    /// ```
    pub async fn connect_url(url: &str) -> Result<RedisBackend> {
        RedisBuilder::new(url)?.build().await
    }

    /// The options this client runs with.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }
}

impl Inner {
    /// The scripts, publishing releases as this store's waiters listen.
    fn scripts(&self) -> &'static scripts::Scripts {
        scripts::Scripts::get(self.node.sharded())
    }

    fn keys(&self, name: &str) -> Keys {
        Keys::new(&self.config.prefix, &self.in_key(name))
    }

    /// Whether the store is a Redis Cluster.
    fn is_cluster(&self) -> bool {
        !self.config.cluster.is_empty()
    }

    /// The name as the lock's keys hold it: inside a hash tag on a cluster, so every key of
    /// the lock lives in one slot ([`cluster::tagged`]).
    fn in_key<'a>(&self, name: &'a str) -> std::borrow::Cow<'a, str> {
        if self.is_cluster() {
            std::borrow::Cow::Owned(cluster::tagged(name))
        } else {
            std::borrow::Cow::Borrowed(name)
        }
    }

    /// The lock name a key's name part holds ([`in_key`](Inner::in_key) reversed).
    fn name_in<'a>(&self, in_key: &'a str) -> std::borrow::Cow<'a, str> {
        if self.is_cluster() {
            cluster::untagged(in_key)
        } else {
            std::borrow::Cow::Borrowed(in_key)
        }
    }
}

/// Completes when `waiter` is woken; never without one (a call that does not wait).
pub(crate) async fn woken(waiter: Option<&wake::Waiter>) {
    match waiter {
        Some(waiter) => waiter.woken().await,
        None => std::future::pending().await,
    }
}

/// The owner part of a lock value, as the scripts store it and `lock_info` reads it back:
/// this machine's clock in ms (when the hold began), host, pid and label, joined by NUL (the
/// label last, as it may hold anything). Redlock stores the same.
pub(crate) fn owner_field(owner: &Owner) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, ms);
    format!(
        "{now}\0{}\0{}\0{}",
        owner.host,
        owner.pid,
        owner.label.as_deref().unwrap_or_default()
    )
}

pub(crate) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What an acquire call leaves to clean up if it ends without the lock.
#[derive(Default)]
struct Leftovers {
    /// An attempt was sent and its reply not read (the call was dropped mid-flight).
    in_flight: AtomicBool,
    /// A busy attempt put this request in the lock's queue.
    queued: AtomicBool,
}

/// Cleans up after an acquire call that ended without the lock (timeout, error, dropped).
struct Abandon<'a> {
    inner: &'a Arc<Inner>,
    keys: &'a Keys,
    token: &'a str,
    reentrant: bool,
    leftovers: &'a Leftovers,
    armed: bool,
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        let in_flight = self.leftovers.in_flight.load(Ordering::Relaxed);
        if !self.armed || !(in_flight || self.leftovers.queued.load(Ordering::Relaxed)) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // the queue entry and any lease expire on their own
        };
        let mut conn = self.inner.conn();
        let keys = self.keys.clone();
        let token = self.token.to_owned();
        // A reentrant token is shared by the client's holds: never release by token alone.
        let release = if in_flight && !self.reentrant {
            "1"
        } else {
            "0"
        };
        let abandon = &self.inner.scripts().abandon;
        runtime.spawn(async move {
            let done: ::redis::RedisResult<i64> = abandon
                .key(&keys.lock)
                .key(&keys.queue)
                .key(&keys.qexp)
                .arg(&token)
                .arg(&keys.channel)
                .arg(release)
                .invoke_async(&mut conn)
                .await;
            if let Err(error) = done {
                tracing::debug!(%error, lock = keys.lock, "clean-up after an abandoned acquire failed; it expires instead");
            }
        });
    }
}

#[async_trait]
impl Backend for RedisBackend {
    fn info(&self) -> &BackendInfo {
        &INFO
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Arc<dyn Lease>>> {
        crate::ttl::check_store_ttl(req.ttl)?;
        let granted = match shared_holds::acquire(&self.inner, req).await {
            Some(shared) => shared?,
            None => self.acquire_mutex(req).await?,
        };
        let key = self.inner.keys(req.name.as_str()).lock;
        let confirmed = self
            .inner
            .confirm_grants(granted.map(|lease| vec![lease]), &key)
            .await?;
        Ok(confirmed.and_then(|mut leases| leases.pop()))
    }

    fn monitor(&self) -> Option<&dyn MonitorStore> {
        Some(self)
    }

    async fn try_acquire_all(
        &self,
        reqs: &[AcquireRequest],
    ) -> Option<Result<Option<Vec<Arc<dyn Lease>>>>> {
        // One script reaches one cluster node: names in different slots are taken one at a
        // time (by the caller, in canonical order, all or nothing).
        if self.inner.is_cluster() {
            let mut slots = reqs
                .iter()
                .map(|req| cluster::slot(&self.inner.keys(req.name.as_str()).lock));
            let first = slots.next();
            if slots.any(|slot| Some(slot) != first) {
                return None;
            }
        }
        let granted = match self.acquire_all(reqs).await {
            Ok(granted) => granted,
            Err(error) => return Some(Err(error)),
        };
        let key = reqs
            .first()
            .map(|req| self.inner.keys(req.name.as_str()).lock)
            .unwrap_or_default();
        Some(self.inner.confirm_grants(granted, &key).await)
    }

    fn values(&self) -> Option<&dyn ValueStore> {
        Some(self)
    }
}

impl RedisBackend {
    /// A mutex hold: `acquire.lua`, waiting by pub/sub.
    async fn acquire_mutex(&self, req: &AcquireRequest) -> Result<Option<Arc<dyn Lease>>> {
        let inner = &self.inner;
        let keys = inner.keys(req.name.as_str());
        let waits = req.wait != Wait::No;
        let leftovers = Leftovers::default();
        let mut abandon = Abandon {
            inner,
            keys: &keys,
            token: &req.token,
            reentrant: req.reentrant,
            leftovers: &leftovers,
            armed: true,
        };
        let waiter = waits.then(|| inner.node.wakeups.waiter(&keys.channel, &req.token));
        let ttl_ms = ms(req.ttl);
        let owner = owner_field(&req.owner);
        let poll = Backoff::new(inner.config.poll_min, inner.config.poll_max);
        let acquired = acquire_loop(
            req.wait,
            Some(poll),
            || async {
                let mut conn = inner.conn();
                let mut invocation = inner.scripts().acquire.key(&keys.lock);
                invocation
                    .key(&keys.queue)
                    .key(&keys.qexp)
                    .arg(&req.token)
                    .arg(ttl_ms)
                    .arg(u8::from(req.reentrant))
                    .arg(u8::from(req.fair))
                    .arg(u8::from(waits))
                    .arg(u8::from(leftovers.queued.load(Ordering::Relaxed)))
                    .arg(&owner);
                let start = Instant::now();
                leftovers.in_flight.store(true, Ordering::Relaxed);
                let reply: Result<Vec<i64>> = invocation
                    .invoke_async(&mut conn)
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
                        if waits {
                            leftovers.queued.store(true, Ordering::Relaxed);
                        }
                        Ok(Attempt::Busy {
                            free_in: u64::try_from(*free_in).ok().map(Duration::from_millis),
                        })
                    }
                    _ => Err(bad_reply("acquire")),
                }
            },
            || woken(waiter.as_ref()),
        )
        .await;
        abandon.armed = !matches!(acquired, Ok(Some(_)));
        drop(abandon);
        acquired
    }

    /// `acquire_all.lua`: every lock or none, in one script (one node holds them all).
    async fn acquire_all(&self, reqs: &[AcquireRequest]) -> Result<Option<Vec<Arc<dyn Lease>>>> {
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
            invocation.key(&keys.lock).key(&keys.queue).key(&keys.qexp);
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
                            keys,
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

/// One hold of a Redis lock.
#[derive(Debug)]
struct RedisLease {
    core: LeaseCore,
    inner: Arc<Inner>,
    keys: Keys,
    token: String,
}

impl RedisLease {
    fn name(&self) -> std::borrow::Cow<'_, str> {
        let in_key = self
            .keys
            .lock
            .strip_prefix(&scripts::lock_key(&self.inner.config.prefix, ""))
            .unwrap_or(&self.keys.lock);
        self.inner.name_in(in_key)
    }
}

#[async_trait]
impl Lease for RedisLease {
    fn core(&self) -> &LeaseCore {
        &self.core
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        crate::ttl::check_store_ttl(ttl)?;
        let fence = self.core.fence().get();
        let gathered = if self.inner.is_cluster() {
            None
        } else {
            renewals::extend(&self.inner, &self.keys.lock, &self.token, fence, ms(ttl)).await
        };
        let owned: i64 = match gathered {
            Some(owned) => owned,
            None => {
                let mut conn = self.inner.conn();
                self.inner
                    .scripts()
                    .extend
                    .key(&self.keys.lock)
                    .arg(&self.token)
                    .arg(fence)
                    .arg(ms(ttl))
                    .invoke_async(&mut conn)
                    .await
            }
        }
        .map_err(|e| self.inner.fail(e, &self.keys.lock))?;
        if owned != 1 {
            return Err(Error::not_owned(&self.name()));
        }
        self.inner
            .replicated("the extension", &self.keys.lock)
            .await
    }

    async fn release(&self) -> Result<()> {
        self.release_on(self.inner.conn()).await
    }

    /// On a connection of the runtime this runs on: the client's belongs to the runtime that
    /// made it, which may be shutting down.
    async fn release_elsewhere(&self) -> Result<()> {
        let node = Node::connect(&self.inner.config, true).await?;
        self.release_on(node.conn()).await
    }
}

impl RedisLease {
    async fn release_on(&self, mut conn: Conn) -> Result<()> {
        let left: i64 = self
            .inner
            .scripts()
            .release
            .key(&self.keys.lock)
            .key(&self.keys.queue)
            .key(&self.keys.qexp)
            .arg(&self.token)
            .arg(self.core.fence().get())
            .arg(&self.keys.channel)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.inner.fail(e, &self.keys.lock))?;
        if left < 0 {
            return Err(Error::not_owned(&self.name()));
        }
        Ok(())
    }
}

#[async_trait]
impl ValueStore for RedisBackend {
    async fn get(&self, name: &LockName) -> Result<Option<Versioned>> {
        let key = scripts::value_key(&self.inner.config.prefix, name.as_str());
        let mut conn = self.inner.conn();
        let (version, value): (Option<u64>, Option<Vec<u8>>) = ::redis::cmd("HMGET")
            .arg(&key)
            .arg("version")
            .arg("value")
            .query_async(&mut conn)
            .await
            .map_err(|e| self.inner.fail(e, &key))?;
        match (version, value) {
            (Some(version), Some(value)) => Ok(Some(Versioned::new(value, version))),
            (None, None) => Ok(None),
            _ => Err(Error::WrongType {
                backend: "redis",
                key,
                detail: "a hash without dlock's version and value fields".into(),
            }),
        }
    }

    async fn put(&self, name: &LockName, expect: Expect, value: &[u8]) -> Result<Option<u64>> {
        let key = scripts::value_key(&self.inner.config.prefix, name.as_str());
        let (condition, expected) = match expect {
            Expect::Any => ("any", 0),
            Expect::Absent => ("absent", 0),
            Expect::Version(version) => ("version", version),
        };
        let mut conn = self.inner.conn();
        self.inner
            .scripts()
            .value_put
            .key(&key)
            .arg(condition)
            .arg(expected)
            .arg(value)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.inner.fail(e, &key))
    }
}
