//! Inspection of Redis locks: mutexes (`lock:` strings), native semaphores (`permits:` zsets)
//! and native read-write locks (`rw:` hashes), each listed as one entry; force-release.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::conn::Conn;
use ::redis::Script;
use async_trait::async_trait;

use crate::backend::list_family::ListFamily;
use crate::backend::{HoldKind, ListPage, ListQuery, LockInfo, MonitorStore};
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::name::{LockName, Owner};

use super::error::{BACKEND, bad_reply, map_timed};
use super::scripts::{self, Scripts, SharedKeys};
use super::{Inner, RedisBackend};

/// The key of `name` that exists whenever a lock of `family` is held, and its Redis type.
fn key_prefix(family: ListFamily, prefix: &str) -> (String, &'static str) {
    match family {
        ListFamily::Mutexes => (scripts::lock_key(prefix, ""), "string"),
        ListFamily::Semaphores => (SharedKeys::permits(prefix, "").holders, "zset"),
        ListFamily::RwLocks => (SharedKeys::rwlock(prefix, "").state, "hash"),
    }
}

/// Reads an owner field as [`owner_field`](super::owner_field) wrote it (at, host, pid, label;
/// the label last, as it may hold anything): who holds, and since when. Redlock's values keep
/// the same field.
pub(crate) fn read_owner(field: &str) -> (Owner, SystemTime) {
    let number = |field: Option<&str>| field.and_then(|v| v.parse::<u64>().ok());
    let mut parts = field.splitn(4, '\0');
    let (at, host, pid, label) = (parts.next(), parts.next(), parts.next(), parts.next());
    let owner = Owner::new(
        label.filter(|l| !l.is_empty()).map(str::to_owned),
        host.unwrap_or_default(),
        number(pid).and_then(|p| u32::try_from(p).ok()).unwrap_or(0),
    );
    (
        owner,
        UNIX_EPOCH + Duration::from_millis(number(at).unwrap_or(0)),
    )
}

/// Reads a mutex's reply of `inspect.lua` (or `py_inspect.lua`, which answers the same).
pub(super) fn mutex_info(name: String, reply: &[Option<String>]) -> Result<Option<LockInfo>> {
    lock_info(name, HoldKind::Mutex, reply)
}

/// Reads a reply of `inspect.lua` (`kind` Mutex) or `inspect_shared.lua` (after its kind):
/// token, fence, holds, owner, ms left, waiters ('' when the store cannot count them).
fn lock_info(name: String, kind: HoldKind, reply: &[Option<String>]) -> Result<Option<LockInfo>> {
    if reply.is_empty() {
        return Ok(None);
    }
    let [_token, fence, holds, owner, pttl, waiters] = reply else {
        return Err(bad_reply("inspect"));
    };
    let number = |field: Option<&str>| field.and_then(|v| v.parse::<i64>().ok());
    let (owner, acquired_at) = read_owner(owner.as_deref().unwrap_or_default());
    let ttl_left = number(pttl.as_deref())
        .and_then(|p| u64::try_from(p).ok())
        .map(Duration::from_millis);
    let info = LockInfo::new(
        name,
        FencingToken::new(
            number(fence.as_deref())
                .and_then(|f| u64::try_from(f).ok())
                .unwrap_or(0),
        ),
        owner,
        acquired_at,
        ttl_left,
        number(holds.as_deref())
            .and_then(|h| u32::try_from(h).ok())
            .unwrap_or(1),
    )
    .with_kind(kind);
    Ok(Some(
        match number(waiters.as_deref()).and_then(|w| u32::try_from(w).ok()) {
            Some(waiters) => info.with_waiters(waiters),
            None => info,
        },
    ))
}

/// Reads a reply of `inspect_shared.lua`: its kind, then as [`lock_info`].
fn shared_info(name: String, reply: &[Option<String>]) -> Result<Option<LockInfo>> {
    let Some((kind, rest)) = reply.split_first() else {
        return Ok(None);
    };
    let kind = match kind.as_deref() {
        Some("permit") => HoldKind::Permit,
        Some("reader") => HoldKind::Reader,
        Some("writer") => HoldKind::Writer,
        _ => return Err(bad_reply("inspect_shared")),
    };
    lock_info(name, kind, rest)
}

#[async_trait]
impl MonitorStore for RedisBackend {
    /// The mutex `name` if it is held, else the semaphore, else the read-write lock (all three
    /// read in one round trip).
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        if self.inner.py_layout()
            && let Some(info) = self.inspect_py(name).await?
        {
            return Ok(Some(info));
        }
        let mut conn = self.inner.conn();
        let locks = ListFamily::ALL.map(|family| (family, name.as_str().to_owned()));
        let infos = inspect_many(&self.inner, &mut conn, &locks).await?;
        Ok(infos.into_iter().flatten().next())
    }

    /// A page of one server's `SCAN`; on a cluster, of each primary's in turn (the cursor
    /// names the primary by its place in the sorted list of primaries).
    async fn list_page(&self, query: ListQuery<'_>) -> Result<ListPage> {
        if self.inner.py_layout() {
            return Err(Error::Unsupported {
                operation: "listing locks in redis-py's layout (they share no key prefix)",
                backend: BACKEND,
            });
        }
        let mut conn = self.inner.conn();
        if conn.cluster().is_none() {
            let (locks, cursor) = self
                .scan_page(&mut conn, None, query.prefix, query.cursor, query.limit)
                .await?;
            return Ok(ListPage::new(locks, cursor));
        }
        let (node_index, within) = match query.cursor.and_then(|c| c.split_once('|')) {
            Some((node, within)) => (node.parse::<usize>().unwrap_or(0), Some(within)),
            None => (0, None),
        };
        let primaries = match conn.cluster() {
            Some(cluster) => super::cluster::primaries(cluster)
                .await
                .map_err(|e| self.inner.fail(e, ""))?,
            None => Vec::new(),
        };
        let Some(node) = primaries.get(node_index) else {
            return Ok(ListPage::new(Vec::new(), None));
        };
        let (locks, cursor) = self
            .scan_page(&mut conn, Some(node), query.prefix, within, query.limit)
            .await?;
        let cursor = match cursor {
            Some(within) => Some(format!("{node_index}|{within}")),
            None if node_index + 1 < primaries.len() => Some(format!("{}|", node_index + 1)),
            None => None,
        };
        Ok(ListPage::new(locks, cursor))
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        if self.inner.py_layout() {
            return self.force_release_py(name).await;
        }
        let keys = self.inner.keys(name.as_str());
        let mut conn = self.inner.conn();
        let broken: i64 = self
            .inner
            .scripts()
            .force_release
            .key(&keys.lock)
            .key(keys.queue())
            .key(keys.qexp())
            .arg(keys.channel())
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.inner.fail(e, &keys.lock))?;
        Ok(broken == 1)
    }
}

impl RedisBackend {
    /// One `SCAN` step over the family the cursor is in (on `node` of a cluster), and the
    /// locks it found, read in one round trip; the cursor of the page after.
    async fn scan_page(
        &self,
        conn: &mut Conn,
        node: Option<&String>,
        name_prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<LockInfo>, Option<String>)> {
        let (family, position) = ListFamily::parse(cursor.filter(|c| !c.is_empty()));
        let cursor: u64 = position.parse().unwrap_or(0);
        let prefix = &self.inner.config.prefix;
        let (key_prefix, key_type) = key_prefix(family, prefix);
        // On a cluster a key's name part starts inside its hash tag.
        let in_key = self.inner.in_key(name_prefix);
        let in_key = in_key.strip_suffix('}').unwrap_or(&in_key);
        let pattern = scripts::scan_pattern(&key_prefix, in_key);
        let mut scan = ::redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(limit.max(10))
            .arg("TYPE")
            .arg(key_type);
        let scanned: ::redis::RedisResult<(u64, Vec<String>)> = match (node, conn.cluster()) {
            (Some(node), Some(cluster)) => {
                let routing =
                    super::cluster::to_node(node).ok_or_else(|| bad_reply("CLUSTER NODES"))?;
                match cluster.route_command(scan, routing).await {
                    Ok(value) => {
                        ::redis::from_redis_value(value).map_err(::redis::RedisError::from)
                    }
                    Err(e) => Err(e),
                }
            }
            _ => scan.query_async(conn).await,
        };
        let (next, keys) = scanned.map_err(|e| self.inner.fail(e, &pattern))?;
        let locks: Vec<(ListFamily, String)> = keys
            .iter()
            .map(|key| {
                let in_key = key.strip_prefix(&key_prefix).unwrap_or(key);
                (family, self.inner.name_in(in_key).into_owned())
            })
            .collect();
        let infos = inspect_many(&self.inner, conn, &locks).await?;
        // Expired or released between SCAN and the read: not held any more.
        let locks = infos.into_iter().flatten().collect();
        let cursor = family.cursor((next != 0).then(|| next.to_string()).as_deref());
        Ok((locks, cursor))
    }
}

/// The inspection script of a family.
fn inspect_script(family: ListFamily) -> &'static Script {
    // Inspection publishes nothing: either variant will do.
    let scripts = Scripts::get(false);
    match family {
        ListFamily::Mutexes => &scripts.inspect,
        ListFamily::Semaphores | ListFamily::RwLocks => &scripts.inspect_shared,
    }
}

/// The keys the inspection script of `family` reads for a lock whose keys hold `in_key`, and
/// the shape argument of the shared script.
fn inspected_keys(
    family: ListFamily,
    prefix: &str,
    in_key: &str,
) -> (String, String, Option<&'static str>) {
    match family {
        ListFamily::Mutexes => {
            let keys = scripts::Keys::new(prefix, in_key);
            let qexp = keys.qexp();
            (keys.lock, qexp, None)
        }
        ListFamily::Semaphores => {
            let keys = SharedKeys::permits(prefix, in_key);
            (keys.holders, keys.state, Some("permits"))
        }
        ListFamily::RwLocks => {
            let keys = SharedKeys::rwlock(prefix, in_key);
            (keys.holders, keys.state, Some("rwlock"))
        }
    }
}

/// Reads `locks` (each a family and a name): in one pipeline on one server (one round trip
/// per page); on a cluster one script per lock, all at once (a pipeline reaches one slot).
async fn inspect_many(
    inner: &Inner,
    conn: &mut Conn,
    locks: &[(ListFamily, String)],
) -> Result<Vec<Option<LockInfo>>> {
    let prefix = &inner.config.prefix;
    let timeout = inner.config.response_timeout;
    let Some((_, first)) = locks.first() else {
        return Ok(Vec::new());
    };
    if inner.is_cluster() {
        let reads = locks.iter().map(|(family, name)| {
            let mut conn = conn.clone();
            async move {
                let (first_key, second_key, shape) =
                    inspected_keys(*family, prefix, &inner.in_key(name));
                let mut invocation = inspect_script(*family).key(first_key);
                invocation.key(second_key).arg(shape);
                let reply: Vec<Option<String>> = invocation
                    .invoke_async(&mut conn)
                    .await
                    .map_err(|e| map_timed(e, name, timeout))?;
                read_reply(*family, name, &reply)
            }
        });
        return futures::future::try_join_all(reads).await;
    }
    let mut pipe = ::redis::pipe();
    for (family, name) in locks {
        let (first_key, second_key, shape) = inspected_keys(*family, prefix, name);
        pipe.cmd("EVALSHA")
            .arg(inspect_script(*family).get_hash())
            .arg(2)
            .arg(first_key)
            .arg(second_key)
            .arg(shape);
    }
    let failed = |e| map_timed(e, first, timeout);
    let replies: Vec<Vec<Option<String>>> = match pipe.query_async(conn).await {
        Ok(replies) => replies,
        Err(e) if e.kind() == ::redis::ErrorKind::Server(::redis::ServerErrorKind::NoScript) => {
            for script in [
                inspect_script(ListFamily::Mutexes),
                inspect_script(ListFamily::RwLocks),
            ] {
                script
                    .prepare_invoke()
                    .load_async(conn)
                    .await
                    .map_err(failed)?;
            }
            pipe.query_async(conn).await.map_err(failed)?
        }
        Err(e) => return Err(failed(e)),
    };
    locks
        .iter()
        .zip(replies)
        .map(|((family, name), reply)| read_reply(*family, name, &reply))
        .collect()
}

/// Reads the reply of `family`'s inspection script for the lock `name`.
fn read_reply(
    family: ListFamily,
    name: &str,
    reply: &[Option<String>],
) -> Result<Option<LockInfo>> {
    match family {
        ListFamily::Mutexes => lock_info(name.to_owned(), HoldKind::Mutex, reply),
        ListFamily::Semaphores | ListFamily::RwLocks => shared_info(name.to_owned(), reply),
    }
}
