//! Inspection of etcd locks: reading holders' keys, listing by prefix, force-release.

use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, SortOrder, SortTarget, Txn, TxnOp};

use crate::backend::LockKind;
use crate::backend::list_family::ListFamily;
use crate::backend::queue_rules::{Ahead, shared_lock_info};
use crate::backend::{ListPage, ListQuery, LockInfo, MonitorStore};
use crate::error::Result;
use crate::fence::FencingToken;
use crate::name::{LockName, Owner};

use super::error::map;
use super::queue_rules::{ahead_of, key_base};
use super::{EtcdBackend, VALUE_TAG};

/// Reads a holder's key into a [`LockInfo`]; `None` for a value that is not dlock's.
fn lock_info(name: String, kv: &KeyValue, ttl_left: Option<Duration>) -> Option<LockInfo> {
    let value = std::str::from_utf8(kv.value()).ok()?;
    let mut parts = value.splitn(6, '\0');
    if parts.next()? != VALUE_TAG {
        return None;
    }
    let (_token, at, host, pid, label) = (
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next().unwrap_or_default(),
    );
    let owner = Owner::new(
        (!label.is_empty()).then(|| label.to_owned()),
        host,
        pid.parse().unwrap_or(0),
    );
    Some(LockInfo::new(
        name,
        FencingToken::new(u64::try_from(kv.create_revision()).unwrap_or(0)),
        owner,
        UNIX_EPOCH + Duration::from_millis(at.parse().unwrap_or(0)),
        ttl_left,
        1,
    ))
}

/// A queue kind of `family`, for its key layout.
fn queue_kind(family: ListFamily) -> LockKind {
    match family {
        ListFamily::Mutexes => LockKind::Exclusive,
        ListFamily::Semaphores => LockKind::Permit { permits: 0 },
        ListFamily::RwLocks => LockKind::Write,
    }
}

impl EtcdBackend {
    async fn ttl_left(&self, lease: i64) -> Result<Option<Duration>> {
        if lease == 0 {
            return Ok(None);
        }
        let reply = self
            .inner
            .resend(|mut c| async move { c.lease_time_to_live(lease, None).await })
            .await
            .map_err(map)?;
        Ok(u64::try_from(reply.ttl()).ok().map(Duration::from_secs))
    }

    /// The lock `name` of `family` as its queue shows it: the holder that came first, how
    /// many hold and how many wait behind them.
    async fn describe(&self, family: ListFamily, name: String) -> Result<Option<LockInfo>> {
        let base = key_base(queue_kind(family), &self.inner.config.prefix, &name);
        if family == ListFamily::Mutexes {
            let Some((kv, waiters)) = self.inner.queue_head(&base).await? else {
                return Ok(None);
            };
            let ttl_left = self.ttl_left(kv.lease()).await?;
            return Ok(lock_info(name, &kv, ttl_left).map(|info| info.with_waiters(waiters)));
        }
        let base = &base;
        let reply = self
            .inner
            .resend(|mut c| async move {
                let by_create = GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend);
                c.get(base.as_slice(), Some(by_create)).await
            })
            .await
            .map_err(map)?;
        let queue: Vec<Ahead> = reply
            .kvs()
            .iter()
            .map(|kv| ahead_of(&kv.key()[base.len()..]))
            .collect();
        let Some(head) = reply.kvs().first() else {
            return Ok(None);
        };
        let ttl_left = self.ttl_left(head.lease()).await?;
        let semaphore = family == ListFamily::Semaphores;
        Ok(lock_info(name, head, ttl_left)
            .and_then(|info| shared_lock_info(info, semaphore, &queue)))
    }

    /// The names of `family` that start with `prefix`, after `after`, at most `limit`; and
    /// whether more follow.
    async fn names(
        &self,
        family: ListFamily,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<String>, bool)> {
        // Every key of the family starts with `root`, then the name, then NUL.
        let mut root = key_base(queue_kind(family), &self.inner.config.prefix, "");
        root.pop();
        let mut scan_from = root.clone();
        scan_from.extend_from_slice(prefix.as_bytes());
        let scan_end = etcd_prefix_end(&scan_from);
        // Names are never empty, so nothing of this family starts with NUL after the root
        // (below the mutexes' root, the other families and the values do).
        let mut first_name = root.clone();
        first_name.push(1);
        scan_from = scan_from.max(first_name);
        if let Some(after) = after {
            // Strictly after every key of the lock named `after`: its keys continue with NUL,
            // any other name with a byte of at least 1.
            let mut from = root.clone();
            from.extend_from_slice(after.as_bytes());
            from.push(1);
            scan_from = scan_from.max(from);
        }
        let limit = i64::try_from(limit.clamp(1, 10_000)).unwrap_or(256);
        let (scan_from, scan_end) = (&scan_from, &scan_end);
        let reply = self
            .inner
            .resend(|mut c| async move {
                c.get(
                    scan_from.as_slice(),
                    Some(
                        GetOptions::new()
                            .with_range(scan_end.as_slice())
                            .with_limit(limit)
                            .with_keys_only(),
                    ),
                )
                .await
            })
            .await
            .map_err(map)?;
        // Names in key order (a lock's keys are adjacent).
        let mut names: Vec<String> = Vec::new();
        for kv in reply.kvs() {
            let Some(rest) = kv.key().strip_prefix(root.as_slice()) else {
                continue;
            };
            let Some(nul) = rest.iter().position(|b| *b == 0) else {
                continue; // not one of our keys
            };
            let Ok(name) = std::str::from_utf8(&rest[..nul]) else {
                continue;
            };
            if names.last().map(String::as_str) != Some(name) {
                names.push(name.to_owned());
            }
        }
        Ok((names, reply.more()))
    }
}

#[async_trait]
impl MonitorStore for EtcdBackend {
    /// The mutex `name` if it is held, else the semaphore, else the read-write lock.
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        for family in ListFamily::ALL {
            if let Some(info) = self.describe(family, name.as_str().to_owned()).await? {
                return Ok(Some(info));
            }
        }
        Ok(None)
    }

    async fn list_page(&self, query: ListQuery<'_>) -> Result<ListPage> {
        let (family, after) = ListFamily::parse(query.cursor);
        let after = (!after.is_empty()).then_some(after);
        let (names, more) = self.names(family, query.prefix, after, query.limit).await?;
        // Each lock's holder is read on its own, since a page may cut a lock's keys in two.
        let infos =
            futures::future::join_all(names.iter().map(|name| self.describe(family, name.clone())))
                .await;
        let mut locks = Vec::with_capacity(infos.len());
        for info in infos {
            if let Some(info) = info? {
                locks.push(info);
            }
        }
        let cursor = family.cursor(names.last().filter(|_| more).map(String::as_str));
        Ok(ListPage::new(locks, cursor))
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let prefix = self.inner.lock_prefix(name.as_str());
        let Some(holder) = self.inner.holder(&prefix).await? else {
            return Ok(false);
        };
        let reply = self
            .inner
            .txn(
                Txn::new()
                    .when([Compare::create_revision(
                        holder.key(),
                        CompareOp::Equal,
                        holder.create_revision(),
                    )])
                    .and_then([TxnOp::delete(holder.key(), None)]),
            )
            .await?;
        // The lease is not revoked: it may be the holder's session, which other holds ride
        // on. The holder learns from its watch on its key (a session hold) or at its next
        // renewal or check, which reads the key.
        Ok(reply.succeeded())
    }
}

/// The end of the range of keys starting with `prefix` (etcd's prefix rule).
fn etcd_prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // every key from `prefix` on
}
