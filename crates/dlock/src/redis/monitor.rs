//! Inspection of Redis locks: mutexes (`lock:` strings), native semaphores (`permits:` zsets)
//! and native read-write locks (`rw:` hashes), each listed as one entry; force-release.

use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ::redis::Script;
use ::redis::aio::ConnectionManager;
use async_trait::async_trait;

use crate::backend::list_family::ListFamily;
use crate::backend::{HoldKind, ListPage, ListQuery, LockInfo, MonitorStore};
use crate::error::Result;
use crate::fence::FencingToken;
use crate::name::{LockName, Owner};

use super::RedisBackend;
use super::error::{bad_reply, map_timed};
use super::scripts::{self, SharedKeys};

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
        let mut conn = self.inner.conn();
        let locks = ListFamily::ALL.map(|family| (family, name.as_str().to_owned()));
        let infos = inspect_many(
            &mut conn,
            &self.inner.config.prefix,
            &locks,
            self.inner.config.response_timeout,
        )
        .await?;
        Ok(infos.into_iter().flatten().next())
    }

    async fn list_page(&self, query: ListQuery<'_>) -> Result<ListPage> {
        let (family, position) = ListFamily::parse(query.cursor);
        let cursor: u64 = position.parse().unwrap_or(0);
        let mut conn = self.inner.conn();
        let prefix = &self.inner.config.prefix;
        let (key_prefix, key_type) = key_prefix(family, prefix);
        let pattern = scripts::scan_pattern(&key_prefix, query.prefix);
        let (next, keys): (u64, Vec<String>) = ::redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(query.limit.max(10))
            .arg("TYPE")
            .arg(key_type)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.inner.fail(e, &pattern))?;
        let names: Vec<String> = keys
            .iter()
            .map(|key| key.strip_prefix(&key_prefix).unwrap_or(key).to_owned())
            .collect();
        let locks: Vec<(ListFamily, String)> =
            names.into_iter().map(|name| (family, name)).collect();
        let infos = inspect_many(
            &mut conn,
            prefix,
            &locks,
            self.inner.config.response_timeout,
        )
        .await?;
        // Expired or released between SCAN and the read: not held any more.
        let locks = infos.into_iter().flatten().collect();
        let cursor = family.cursor((next != 0).then(|| next.to_string()).as_deref());
        Ok(ListPage::new(locks, cursor))
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let keys = self.inner.keys(name.as_str());
        let mut conn = self.inner.conn();
        let broken: i64 = scripts::FORCE_RELEASE
            .key(&keys.lock)
            .key(&keys.queue)
            .key(&keys.qexp)
            .arg(&keys.channel)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.inner.fail(e, &keys.lock))?;
        Ok(broken == 1)
    }
}

/// The inspection script of a family.
fn inspect_script(family: ListFamily) -> &'static LazyLock<Script> {
    match family {
        ListFamily::Mutexes => &scripts::INSPECT,
        ListFamily::Semaphores | ListFamily::RwLocks => &scripts::INSPECT_SHARED,
    }
}

/// Reads `locks` (each a family and a name) in one pipeline: one round trip per page.
async fn inspect_many(
    conn: &mut ConnectionManager,
    prefix: &str,
    locks: &[(ListFamily, String)],
    timeout: Duration,
) -> Result<Vec<Option<LockInfo>>> {
    let Some((_, first)) = locks.first() else {
        return Ok(Vec::new());
    };
    let mut pipe = ::redis::pipe();
    for (family, name) in locks {
        let (first_key, second_key, shape) = match family {
            ListFamily::Mutexes => {
                let keys = scripts::Keys::new(prefix, name);
                (keys.lock, keys.qexp, None)
            }
            ListFamily::Semaphores => {
                let keys = SharedKeys::permits(prefix, name);
                (keys.holders, keys.state, Some("permits"))
            }
            ListFamily::RwLocks => {
                let keys = SharedKeys::rwlock(prefix, name);
                (keys.holders, keys.state, Some("rwlock"))
            }
        };
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
            for script in [&scripts::INSPECT, &scripts::INSPECT_SHARED] {
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
        .map(|((family, name), reply)| match family {
            ListFamily::Mutexes => lock_info(name.clone(), HoldKind::Mutex, &reply),
            ListFamily::Semaphores | ListFamily::RwLocks => shared_info(name.clone(), &reply),
        })
        .collect()
}
