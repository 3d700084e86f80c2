//! Inspection of Redlock locks. A lock is held when a majority of the nodes keep the same
//! holder's value, so every answer is read from all nodes at once: the holder is the token a
//! quorum agrees on, its fence the highest those nodes keep, its TTL the time until fewer
//! than a quorum still have it. Redlock keeps no queue of waiters: `waiters` is `None`.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use ::redis::Value;
use async_trait::async_trait;
use futures::future::join_all;

use crate::backend::{ListPage, ListQuery, LockInfo, MonitorStore};
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::name::LockName;
use crate::redis::error::map;
use crate::redis::monitor::read_owner;
use crate::redis::scripts::scan_pattern;

use super::error::{no_quorum, on_node, unavailable};
use super::scripts::Keys;
use super::{Inner, RedlockBackend};

/// How long one node may take to answer an inspection: monitoring may wait longer than a
/// lock round, whose per-node timeout is kept far below the TTL.
fn read_timeout(inner: &Inner) -> Duration {
    inner.config.node_timeout.max(Duration::from_secs(1))
}

/// One node's copy of a lock: the holder's token, its fence and owner field, and the ms left.
struct Copy {
    token: String,
    fence: i64,
    owner: String,
    pttl: i64,
}

/// Reads a Redlock value (`dlockr1 NUL token NUL fence NUL owner`) and its TTL.
fn copy(value: Option<String>, pttl: i64) -> Option<Copy> {
    let value = value?;
    let mut parts = value.splitn(4, '\0');
    if parts.next()? != "dlockr1" {
        return None;
    }
    let (token, fence, owner) = (
        parts.next()?,
        parts.next()?,
        parts.next().unwrap_or_default(),
    );
    Some(Copy {
        token: token.to_owned(),
        fence: fence.parse().ok()?,
        owner: owner.to_owned(),
        pttl,
    })
}

/// The holder's fence among the copies that agree on it: the quorum-th highest. The holder
/// took the highest fence of the quorum that granted in time and brought those nodes to it, so
/// at least a quorum keep exactly that fence; only nodes that granted too late keep other ones,
/// and fewer than a quorum of those can be higher. With every node answering this is the
/// holder's fence; with nodes down it can be another granting node's.
fn holders_fence(copies: &[&Copy], quorum: usize) -> i64 {
    let mut fences: Vec<i64> = copies.iter().map(|copy| copy.fence).collect();
    fences.sort_unstable_by(|a, b| b.cmp(a));
    fences
        .get(quorum - 1)
        .or(fences.last())
        .copied()
        .unwrap_or(0)
}

/// The copies of the holder a quorum of nodes agree on, if any.
fn majority(copies: &[Copy], quorum: usize) -> Option<Vec<&Copy>> {
    let mut agreeing: HashMap<&str, Vec<&Copy>> = HashMap::new();
    for copy in copies {
        agreeing.entry(copy.token.as_str()).or_default().push(copy);
    }
    agreeing.into_values().find(|same| same.len() >= quorum)
}

impl Inner {
    /// Every node's copy of each of `names` (one pipeline per node, all nodes at once); a
    /// node that fails or does not answer in time has none. Fails when fewer than a quorum
    /// answered, since then no answer can be trusted.
    async fn copies(&self, names: &[String]) -> Result<Vec<Vec<Option<Copy>>>> {
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let timeout = read_timeout(self);
        let reads = self
            .nodes
            .iter()
            .enumerate()
            .map(|(index, node)| async move {
                let mut pipe = ::redis::pipe();
                for name in names {
                    let key = Keys::new(self.prefix(), name).lock;
                    pipe.cmd("GET").arg(&key).cmd("PTTL").arg(key);
                }
                let mut conn = node.conn();
                let reply =
                    tokio::time::timeout(timeout, pipe.query_async::<Vec<Value>>(&mut conn))
                        .await
                        .map_err(|_| unavailable(&format!("no answer within {timeout:?}")))
                        .and_then(|reply| reply.map_err(|e| map(e, "")))
                        .map_err(|e| on_node(&self.config.node_label(index), e))?;
                let mut copies = Vec::with_capacity(names.len());
                for pair in reply.chunks(2) {
                    let [value, pttl] = pair else {
                        break;
                    };
                    let value: Option<String> = ::redis::from_redis_value_ref(value).ok().flatten();
                    let pttl: i64 = ::redis::from_redis_value_ref(pttl).unwrap_or(-2);
                    copies.push(copy(value, pttl));
                }
                Ok::<_, Error>(copies)
            });
        let mut answered = Vec::new();
        let mut errors = Vec::new();
        for read in join_all(reads).await {
            match read {
                Ok(copies) => answered.push(copies),
                Err(error) => errors.push(error),
            }
        }
        if answered.len() < self.quorum() {
            return Err(no_quorum("inspection".to_owned(), &errors));
        }
        Ok(answered)
    }

    /// What a quorum of nodes says of each of `names`: held (with its holder) or not.
    async fn describe(&self, names: &[String]) -> Result<Vec<Option<LockInfo>>> {
        let mut by_node = self.copies(names).await?;
        let quorum = self.quorum();
        let mut infos = Vec::with_capacity(names.len());
        for (at, name) in names.iter().enumerate() {
            let copies: Vec<Copy> = by_node
                .iter_mut()
                .filter_map(|node| node.get_mut(at).and_then(Option::take))
                .collect();
            infos.push(majority(&copies, quorum).map(|mut same| {
                // Held for as long as a quorum still has it: the quorum-th longest TTL.
                same.sort_by_key(|copy| std::cmp::Reverse(copy.pttl));
                let ttl_left = u64::try_from(same[quorum - 1].pttl)
                    .ok()
                    .map(Duration::from_millis);
                let fence = holders_fence(&same, quorum);
                let (owner, acquired_at) = read_owner(&same[0].owner);
                LockInfo::new(
                    name.clone(),
                    FencingToken::from_signed(fence),
                    owner,
                    acquired_at,
                    ttl_left,
                    1,
                )
            }));
        }
        Ok(infos)
    }

    /// The lock names on any node that start with `prefix`, sorted (every node is scanned:
    /// a held lock is on a majority, not on each node).
    async fn names(&self, prefix: &str) -> Result<BTreeSet<String>> {
        let key_prefix = Keys::new(self.prefix(), "").lock;
        let pattern = scan_pattern(&key_prefix, prefix);
        let timeout = read_timeout(self);
        let scans = self.nodes.iter().enumerate().map(|(index, node)| {
            let (pattern, key_prefix) = (&pattern, &key_prefix);
            async move {
                let mut conn = node.conn();
                let mut names = Vec::new();
                let mut cursor = 0_u64;
                loop {
                    let mut scan = ::redis::cmd("SCAN");
                    scan.arg(cursor)
                        .arg("MATCH")
                        .arg(pattern)
                        .arg("COUNT")
                        .arg(1000);
                    let page = scan.query_async::<(u64, Vec<String>)>(&mut conn);
                    let (next, keys) = tokio::time::timeout(timeout, page)
                        .await
                        .map_err(|_| unavailable(&format!("no answer within {timeout:?}")))
                        .and_then(|reply| reply.map_err(|e| map(e, pattern)))
                        .map_err(|e| on_node(&self.config.node_label(index), e))?;
                    names.extend(
                        keys.iter()
                            .filter_map(|key| key.strip_prefix(key_prefix.as_str()))
                            .map(str::to_owned),
                    );
                    if next == 0 {
                        return Ok::<_, Error>(names);
                    }
                    cursor = next;
                }
            }
        });
        let mut names = BTreeSet::new();
        let (mut answered, mut errors) = (0, Vec::new());
        for scan in join_all(scans).await {
            match scan {
                Ok(found) => {
                    answered += 1;
                    names.extend(found);
                }
                Err(error) => errors.push(error),
            }
        }
        if answered < self.quorum() {
            return Err(no_quorum("listing".to_owned(), &errors));
        }
        Ok(names)
    }
}

#[async_trait]
impl MonitorStore for RedlockBackend {
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let infos = self.inner.describe(&[name.as_str().to_owned()]).await?;
        Ok(infos.into_iter().next().flatten())
    }

    async fn list_page(&self, query: ListQuery<'_>) -> Result<ListPage> {
        let limit = query.limit.max(1);
        let mut names: Vec<String> = self
            .inner
            .names(query.prefix)
            .await?
            .into_iter()
            .filter(|name| query.cursor.is_none_or(|after| name.as_str() > after))
            .take(limit + 1)
            .collect();
        let more = names.len() > limit;
        names.truncate(limit);
        let locks = self
            .inner
            .describe(&names)
            .await?
            .into_iter()
            .flatten()
            .collect();
        let cursor = if more { names.last().cloned() } else { None };
        Ok(ListPage::new(locks, cursor))
    }

    /// Deletes the holder's value on every node that has it; the holder learns at its next
    /// renewal, which a quorum now refuses.
    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let keys = Keys::new(self.inner.prefix(), name.as_str());
        let names = [name.as_str().to_owned()];
        let mut by_node = self.inner.copies(&names).await?;
        let copies: Vec<Copy> = by_node
            .iter_mut()
            .filter_map(|node| node[0].take())
            .collect();
        let Some(held) = majority(&copies, self.inner.quorum()) else {
            return Ok(false);
        };
        let token = held[0].token.as_str();
        let (released, _, errors) = self
            .inner
            .release_on(&self.inner.all(), &keys, token, read_timeout(&self.inner))
            .await;
        if released == 0 && !errors.is_empty() {
            return Err(no_quorum(format!("breaking {name}"), &errors));
        }
        Ok(released > 0)
    }
}
