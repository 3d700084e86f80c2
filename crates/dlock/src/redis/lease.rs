//! A mutex hold's renewals (gathered into one script per keeper pass where it can) and
//! release.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::conn::Conn;
use super::node::Node;
use super::scripts::{self, Keys};
use super::{Inner, cluster, ms, renewals};
use crate::backend::{Lease, LeaseCore};
use crate::error::{Error, Result};
use crate::name::LockName;

/// One hold of a Redis lock.
#[derive(Debug)]
pub(super) struct RedisLease {
    pub(super) core: LeaseCore,
    pub(super) inner: Arc<Inner>,
    /// Shared with the acquire call that made it (no copy per grant).
    pub(super) keys: Arc<Keys>,
    pub(super) token: String,
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
    async fn put_fenced(&self, value: &LockName, bytes: &[u8]) -> Result<Option<u64>> {
        self.put_fenced_now(value, bytes).await
    }

    async fn release_elsewhere(&self) -> Result<()> {
        let node = Node::connect(&self.inner.config, true).await?;
        self.release_on(node.conn()).await
    }
}

impl RedisLease {
    /// `value_put_fenced.lua`: the hold's key checked and the value written in one script. In
    /// a Cluster both keys must be in one slot; a value in another is refused, not split.
    async fn put_fenced_now(&self, value: &LockName, bytes: &[u8]) -> Result<Option<u64>> {
        let value_key = scripts::value_key(&self.inner.config.prefix, value.as_str());
        if self.inner.is_cluster() && cluster::slot(&value_key) != cluster::slot(&self.keys.lock) {
            return Err(Error::Unsupported {
                operation: "fenced writes of a value outside its lock's Redis Cluster slot \
                            (name the value with the lock's hash tag, `{=LOCK}...`)",
                backend: "redis",
            });
        }
        let mut conn = self.inner.conn();
        self.inner
            .scripts()
            .value_put_fenced
            .key(&self.keys.lock)
            .key(&value_key)
            .arg(&self.token)
            .arg(self.core.fence().get())
            .arg(bytes)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.inner.fail(e, &value_key))
    }

    async fn release_on(&self, mut conn: Conn) -> Result<()> {
        let keys = &self.keys;
        let script = &self.inner.scripts().release;
        let mut release = scripts::evalsha(script, &[&keys.lock, &keys.queue(), &keys.qexp()]);
        release
            .arg(&self.token)
            .arg(self.core.fence().get())
            .arg(keys.channel());
        let left: i64 = scripts::run(script, &release, &mut conn)
            .await
            .map_err(|e| self.inner.fail(e, &keys.lock))?;
        if left < 0 {
            return Err(Error::not_owned(&self.name()));
        }
        Ok(())
    }
}
