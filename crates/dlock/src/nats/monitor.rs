//! Inspection, listing and breaking: a lock's entry read and decoded, the bucket's lock keys
//! listed, a holder's key purged. The server keeps no waiters, so none are counted.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::kv;
use async_trait::async_trait;
use futures::TryStreamExt;

use crate::backend::{ListPage, ListQuery, LockInfo, MonitorStore};
use crate::error::Result;
use crate::fence::FencingToken;
use crate::name::{LockName, Owner};

use super::error::map;
use super::keys::{Holder, lock_key, lock_name};
use super::write::{Head, Written};
use super::{NatsBackend, ROUNDS};

impl NatsBackend {
    /// The holder of `name`'s key, with the entry's revision.
    async fn holder(&self, name: &str) -> Result<Option<(Holder, u64, SystemTime)>> {
        let entry = self.inner.entry(&lock_key(name)).await?;
        Ok(entry
            .filter(|e| e.operation == kv::Operation::Put)
            .and_then(|e| {
                let written = SystemTime::from(e.created);
                Holder::decode(&e.value, e.revision).map(|h| (h, e.revision, written))
            }))
    }

    async fn describe(&self, name: String) -> Result<Option<LockInfo>> {
        let Some((holder, _, written)) = self.holder(&name).await? else {
            return Ok(None);
        };
        let ends = written + Duration::from_millis(holder.ttl_ms);
        let ttl_left = ends.duration_since(SystemTime::now()).unwrap_or_default();
        Ok(Some(LockInfo::new(
            name,
            FencingToken::new(holder.fence),
            Owner::new(holder.label, holder.host, holder.pid),
            UNIX_EPOCH + Duration::from_millis(holder.since_ms),
            Some(ttl_left),
            1,
        )))
    }
}

#[async_trait]
impl MonitorStore for NatsBackend {
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        self.describe(name.as_str().to_owned()).await
    }

    /// Every lock key of the bucket read, its names sorted: a page is the names after the
    /// cursor (a full listing reads the bucket's keys once per page).
    async fn list_page(&self, query: ListQuery<'_>) -> Result<ListPage> {
        let keys: Vec<String> = match self.inner.kv.keys().await {
            Ok(keys) => keys.try_collect().await.map_err(map)?,
            Err(error) => return Err(map(error)),
        };
        let mut names: Vec<String> = keys
            .iter()
            .filter_map(|key| lock_name(key))
            .filter(|name| name.starts_with(query.prefix))
            .filter(|name| query.cursor.is_none_or(|after| name.as_str() > after))
            .collect();
        names.sort();
        let more = names.len() > query.limit;
        names.truncate(query.limit);
        let infos =
            futures::future::join_all(names.iter().cloned().map(|n| self.describe(n))).await;
        let mut locks = Vec::with_capacity(infos.len());
        for info in infos {
            locks.extend(info?);
        }
        let cursor = names.last().filter(|_| more).cloned();
        Ok(ListPage::new(locks, cursor))
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let key = lock_key(name.as_str());
        for _ in 0..ROUNDS {
            let Some((_, revision, _)) = self.holder(name.as_str()).await? else {
                return Ok(false);
            };
            let purged = self
                .inner
                .write(&key, Head::Purge, revision, bytes::Bytes::new())
                .await?;
            if let Written::At(marker) = purged {
                self.inner.remember_marker(&key, marker);
                return Ok(true);
            }
        }
        Ok(false)
    }
}
