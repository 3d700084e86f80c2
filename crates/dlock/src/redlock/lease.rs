//! One hold of a Redlock lock: extend and release on every node, a majority needed for an extension
//! to count.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::backend::{Lease, LeaseCore};
use crate::error::{Error, Result};
use crate::redis::ms;

use super::Inner;
use super::builder::connect_nodes;
use super::error::no_quorum;
use super::quorum::Answer;
use super::scripts::{EXTEND, Keys};

/// One hold of a Redlock lock.
#[derive(Debug)]
pub(super) struct RedlockLease {
    pub(super) core: LeaseCore,
    pub(super) inner: Arc<Inner>,
    pub(super) keys: Keys,
    pub(super) token: String,
    pub(super) owner: String,
    pub(super) fence: i64,
}

impl RedlockLease {
    fn name(&self) -> &str {
        self.keys
            .lock
            .split_once("rlock:")
            .map_or(self.keys.lock.as_str(), |(_, name)| name)
    }
}

impl RedlockLease {
    /// Releases the hold through `inner`'s connections to the nodes.
    async fn release_via(&self, inner: &Inner) -> Result<()> {
        let timeout = inner.node_timeout(Duration::from_secs(1));
        let (released, refused, errors) = inner
            .release_on(&inner.all(), &self.keys, &self.token, timeout)
            .await;
        if released > 0 && refused <= inner.nodes.len() - inner.quorum() {
            return Ok(());
        }
        if refused > inner.nodes.len() - inner.quorum() || errors.is_empty() {
            return Err(Error::not_owned(self.name()));
        }
        Err(no_quorum(
            format!(
                "only {released} of {} nodes released the lock",
                inner.nodes.len()
            ),
            &errors,
        ))
    }
}

#[async_trait]
impl Lease for RedlockLease {
    fn core(&self) -> &LeaseCore {
        &self.core
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        crate::ttl::check_store_ttl(ttl)?;
        let inner = &self.inner;
        // An ownership check (a zero extension) fits in no lease: it gets the release's full
        // node timeout, where a third of a short TTL would fail it on a busy node.
        let timeout = if ttl.is_zero() {
            inner.node_timeout(Duration::from_secs(1))
        } else {
            inner.node_timeout(ttl.max(Duration::from_millis(30)))
        };
        let invocation = |heal: bool| {
            let mut invocation = EXTEND.key(&self.keys.lock);
            invocation
                .key(&self.keys.fence)
                .arg(&self.token)
                .arg(ms(ttl))
                .arg(u8::from(heal))
                .arg(self.fence)
                .arg(&self.owner);
            invocation
        };
        let (mut confirmed, mut refused, mut free, mut errors) = (0, 0, Vec::new(), Vec::new());
        for (index, answer) in inner
            .on_nodes::<i64>(&inner.all(), timeout, &self.keys.lock, || invocation(false))
            .await
            .into_iter()
            .enumerate()
        {
            let Some(answer) = answer else { continue };
            match answer {
                Answer::Reply(1) => confirmed += 1,
                Answer::Reply(0) => free.push(index),
                Answer::Reply(_) => refused += 1,
                Answer::Failed(error) => errors.push(error),
            }
        }
        if confirmed >= inner.quorum() {
            if !ttl.is_zero() && !free.is_empty() {
                // Nodes that lost the lock (restarted, missed the acquire) take it back: safe
                // while the quorum holds it, and they are not counted towards it.
                inner
                    .on_nodes::<i64>(&free, timeout, &self.keys.lock, || invocation(true))
                    .await;
            }
            return Ok(());
        }
        if refused + free.len() > inner.nodes.len() - inner.quorum() {
            return Err(Error::not_owned(self.name()));
        }
        Err(no_quorum(
            format!(
                "only {confirmed} of {} nodes confirmed the lock, {} needed",
                inner.nodes.len(),
                inner.quorum()
            ),
            &errors,
        ))
    }

    async fn release(&self) -> Result<()> {
        self.release_via(&self.inner).await
    }

    /// On fresh connections of the runtime this runs on: the client's belong to the runtime
    /// that made them, which may be shutting down.
    async fn release_elsewhere(&self) -> Result<()> {
        let config = self.inner.config.clone();
        let fresh = Inner {
            nodes: connect_nodes(&config).await?,
            config,
        };
        self.release_via(&fresh).await
    }
}
