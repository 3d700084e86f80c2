#![doc = include_str!("docs.md")]

mod acquire;
mod builder;
mod config;
pub(crate) mod driver;
mod error;
mod lease;
mod monitor;
mod quorum;
mod scripts;

pub use builder::RedlockBuilder;
pub use config::{MAX_NODES, RedlockConfig};

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::backend::abandon::{Abandon, spawn_cleanup};
use crate::backend::wait::{Backoff, acquire_loop};
use crate::backend::{
    AcquireRequest, Backend, BackendInfo, Capabilities, Lease, MonitorStore, Wait,
};
use crate::error::Result;
use crate::redis::node::Node;
use crate::redis::owner_field;
use crate::redis::wake::Waiter;
use scripts::Keys;

/// URL schemes served by this backend.
pub const REDLOCK_SCHEMES: &[&str] = &["redlock", "redlocks"];

const BACKEND: &str = "redlock";

const INFO: BackendInfo = BackendInfo::new(
    BACKEND,
    Capabilities {
        reentrant: false,
        fair: false,
        native_wait: true,
        native_loss_signal: false,
        cross_process: true,
        monitor: true,
        list: true,
        values: false,
        fenced_writes: false,
        permits: false,
        rwlock: false,
    },
);

/// One lock over N independent Redis nodes: the Redlock algorithm, with every node contacted
/// in parallel, a per-node timeout, clock-drift allowance, fences that stay monotonic while a
/// majority of nodes keep their data, and pub/sub hand-off.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::connect("redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379").await?;
/// let guard = locks.mutex("billing/run").acquire().await?;
/// println!("fence {}", guard.fence());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RedlockBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    nodes: Vec<Node>,
    config: RedlockConfig,
}

impl RedlockBackend {
    /// Connects to the nodes of a `redlock://` URL; see [`RedlockConfig::from_url`].
    ///
    /// # Errors
    ///
    /// As [`RedlockConfig::from_url`] and [`RedlockBuilder::build`].
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
    /// let backend = dlock::redlock::RedlockBackend::connect_url("redlock://a:6379,b:6379,c:6379").await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_url(url: &str) -> Result<RedlockBackend> {
        RedlockBuilder::new(url)?.build().await
    }

    /// The options this client runs with.
    pub fn config(&self) -> &RedlockConfig {
        &self.inner.config
    }
}

#[async_trait]
impl Backend for RedlockBackend {
    fn info(&self) -> &BackendInfo {
        &INFO
    }

    fn monitor(&self) -> Option<&dyn MonitorStore> {
        Some(self)
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Arc<dyn Lease>>> {
        crate::ttl::check_store_ttl(req.ttl)?;
        let inner = &self.inner;
        let keys = Keys::new(inner.prefix(), req.name.as_str());
        let owner = owner_field(&req.owner);
        // A release on any node wakes the waiter.
        let waiters: Vec<Waiter> = if req.wait == Wait::No {
            Vec::new()
        } else {
            inner
                .nodes
                .iter()
                .map(|node| node.wakeups.waiter(&keys.channel, &req.token))
                .collect()
        };
        let poll = inner.config.nodes.first().map_or(
            Backoff::new(Duration::from_millis(20), Duration::from_millis(250)),
            |n| Backoff::new(n.poll_min, n.poll_max),
        );
        // Dropped mid-attempt, some nodes may have granted: let go of them in the background
        // rather than at the end of the lease (the token is unique to this call).
        let abandon = {
            let (inner, keys, token) = (inner.clone(), keys.clone(), req.token.clone());
            // Without a runtime, the leases expire on their own.
            Abandon::on_drop(move || {
                spawn_cleanup(move || async move {
                    let timeout = inner.node_timeout(Duration::from_secs(1));
                    inner.release_on(&inner.all(), &keys, &token, timeout).await;
                });
            })
        };
        let acquired = acquire_loop(
            req.wait,
            Some(poll),
            || inner.attempt(&keys, req, &owner),
            || async {
                if waiters.is_empty() {
                    std::future::pending::<()>().await;
                } else {
                    futures::future::select_all(waiters.iter().map(|w| Box::pin(w.woken()))).await;
                }
            },
        )
        .await;
        // A finished round has already cleaned up after itself.
        abandon.disarm();
        acquired
    }
}
