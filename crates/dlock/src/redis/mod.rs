#![doc = include_str!("docs.md")]

mod acquire;
mod builder;
mod client;
mod cluster;
mod config;
pub(crate) mod conn;
pub(crate) mod driver;
pub(crate) mod error;
mod layout;
mod lease;
pub(crate) mod monitor;
pub(crate) mod node;
mod py_layout;
mod renewals;
pub(crate) mod scripts;
mod sentinel;
mod shared_holds;
mod values;
pub(crate) mod wake;

pub use builder::RedisBuilder;
pub use config::{MAX_POLL, RedisConfig, SENTINEL_PORT, SentinelConfig, WAITER_TTL};
pub use layout::RedisLayout;

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;

use crate::backend::{
    AcquireRequest, Backend, BackendInfo, Capabilities, Lease, MonitorStore, ValueStore,
};
use crate::error::Result;
use crate::name::Owner;

use client::Inner;
use error::BACKEND;

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
        fenced_writes: true,
        ..Capabilities::SHARED_STORE
    },
);

/// In redis-py's layout ([`RedisLayout::RedisPy`]): no reentrant or fair locks (the value is
/// the token alone) and no listing (the locks' keys have no common prefix).
const INFO_PY: BackendInfo = BackendInfo::new(
    BACKEND,
    Capabilities {
        reentrant: false,
        fair: false,
        list: false,
        ..INFO.capabilities
    },
);

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

#[async_trait]
impl Backend for RedisBackend {
    fn info(&self) -> &BackendInfo {
        if self.inner.py_layout() {
            &INFO_PY
        } else {
            &INFO
        }
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Arc<dyn Lease>>> {
        crate::ttl::check_store_ttl(req.ttl)?;
        let granted = match shared_holds::acquire(&self.inner, req).await {
            Some(shared) => shared?,
            None if self.inner.py_layout() => self.acquire_py(req).await?,
            None => self.acquire_mutex(req).await?,
        };
        let key = || self.inner.keys(req.name.as_str()).lock;
        let confirmed = self
            .inner
            .confirm_grants(granted.map(|lease| vec![lease]), key)
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
        // redis-py's layout has no script for several locks: the caller takes them one at a
        // time (in canonical order, all or nothing).
        if self.inner.py_layout() {
            return None;
        }
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
        let key = || {
            reqs.first()
                .map(|req| self.inner.keys(req.name.as_str()).lock)
                .unwrap_or_default()
        };
        Some(self.inner.confirm_grants(granted, key).await)
    }

    fn values(&self) -> Option<&dyn ValueStore> {
        Some(self)
    }
}
