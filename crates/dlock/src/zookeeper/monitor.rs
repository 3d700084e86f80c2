//! Inspection of ZooKeeper locks: reading lock directories, listing, force-release.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use crate::backend::LockKind;
use crate::backend::queue_rules::{Ahead, shared_lock_info};
use crate::backend::{ListPage, ListQuery, LockInfo, MonitorStore};
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::name::{LockName, Owner};

use super::ZookeeperBackend;
use super::error::{BACKEND, map};
use super::queue_rules::decode_name;
use super::queue_rules::{Until, unix_ms};
use super::queue_rules::{ahead_of, dir_name, queue};
use super::session::Session;

/// Reads a lock directory: the holder (the first node in line) and its data, with how many
/// hold (several for a semaphore's permits or a read-write lock's readers) and how many wait.
/// `family` is the directory's kind of lock (`None` for a mutex, else `rw` or `sem`).
async fn inspect_dir(
    session: &Session,
    name: &str,
    family: Option<&str>,
    dir: &str,
) -> Result<Option<LockInfo>> {
    // The holder can leave between the listing and the read: look again.
    for _ in 0..5 {
        let children = match session.client.list_children(dir).await {
            Ok(children) => children,
            Err(zookeeper_client::Error::NoNode) => return Ok(None),
            Err(e) => return Err(map(e, dir)),
        };
        let queue = queue(children);
        let Some((_, head)) = queue.first() else {
            return Ok(None);
        };
        let path = format!("{dir}/{head}");
        let (data, stat) = match session.client.get_data(&path).await {
            Ok(found) => found,
            Err(zookeeper_client::Error::NoNode) => continue,
            Err(e) => return Err(map(e, &path)),
        };
        let info = lock_info(name, &data, stat.czxid, stat.ctime);
        let Some(family) = family else {
            // Everyone in line behind the holder waits for it.
            let waiters = u32::try_from(queue.len() - 1).unwrap_or(u32::MAX);
            return Ok(Some(info.with_waiters(waiters)));
        };
        let entries: Vec<Ahead> = queue.iter().map(|(_, child)| ahead_of(child)).collect();
        let semaphore = Some(family) == LockKind::Permit { permits: 0 }.family();
        return Ok(shared_lock_info(info, semaphore, &entries));
    }
    Err(Error::Unavailable {
        backend: BACKEND,
        source: format!("{dir} changed too often to be read").into(),
    })
}

fn lock_info(name: &str, data: &[u8], czxid: i64, ctime: i64) -> LockInfo {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(6, '\0');
    let version = parts.next();
    let number = |p: Option<&str>| p.and_then(|v| v.parse::<u64>().ok());
    let (at, until, pid, host, label) = if version == Some("dlock1") {
        (
            number(parts.next()),
            parts.next().and_then(Until::parse),
            number(parts.next()),
            parts.next(),
            parts.next(),
        )
    } else {
        (None, None, None, None, None)
    };
    let at = at.unwrap_or_else(|| u64::try_from(ctime).unwrap_or(0));
    let now = unix_ms(SystemTime::now());
    LockInfo::new(
        name.to_owned(),
        FencingToken::from_signed(czxid),
        Owner::new(
            label.filter(|l| !l.is_empty()).map(str::to_owned),
            host.unwrap_or_default(),
            pid.and_then(|p| u32::try_from(p).ok()).unwrap_or(0),
        ),
        UNIX_EPOCH + Duration::from_millis(at),
        // A session hold's TTL left is its session's timeout: how long the lock would outlast
        // its holder ending now (the server expires the session that long after it last
        // heard from it).
        until.map(|until| match until {
            Until::At(deadline) => Duration::from_millis(deadline.saturating_sub(now)),
            Until::Session(timeout) => Duration::from_millis(timeout),
        }),
        1,
    )
}

#[async_trait]
impl MonitorStore for ZookeeperBackend {
    /// The mutex `name` if it is held, else the semaphore, else the read-write lock.
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let session = self.inner.session().await?;
        session.catch_up().await?;
        let name = name.as_str();
        for kind in [
            LockKind::Exclusive,
            LockKind::Permit { permits: 0 },
            LockKind::Write,
        ] {
            let dir = self.inner.dir(&dir_name(kind, name));
            if let Some(info) = inspect_dir(&session, name, kind.family(), &dir).await? {
                return Ok(Some(info));
            }
        }
        Ok(None)
    }

    async fn list_page(&self, query: ListQuery<'_>) -> Result<ListPage> {
        let (prefix, cursor, limit) = (query.prefix, query.cursor, query.limit);
        let session = self.inner.session().await?;
        session.catch_up().await?;
        let root = &self.inner.config.chroot;
        // ZooKeeper lists a node's children in one reply; the page is cut from it here.
        let children = match session.client.list_children(root).await {
            Ok(children) => children,
            Err(zookeeper_client::Error::NoNode) => Vec::new(),
            Err(e) => return Err(map(e, root)),
        };
        // Directories by decoded name: a mutex's is its name, a read-write lock's or a
        // semaphore's `name NUL family`; the page's cursor is the last of these.
        let mut names: Vec<String> = children
            .iter()
            .filter(|c| c.as_str() != super::values::VALUES_DIR)
            .filter_map(|c| decode_name(c))
            .filter(|n| n.starts_with(prefix) && cursor.is_none_or(|c| n.as_str() > c))
            .collect();
        names.sort_unstable();
        let limit = limit.max(1);
        let more = names.len() > limit;
        names.truncate(limit);
        let reads = names.iter().map(|dir_name| {
            let session = session.clone();
            let dir = self.inner.dir(dir_name);
            async move {
                let (name, family) = match dir_name.split_once('\0') {
                    Some((name, family)) => (name, Some(family)),
                    None => (dir_name.as_str(), None),
                };
                inspect_dir(&session, name, family, &dir).await
            }
        });
        let mut locks = Vec::with_capacity(names.len());
        for info in futures::future::join_all(reads).await {
            if let Some(info) = info? {
                locks.push(info);
            }
        }
        let cursor = if more { names.last().cloned() } else { None };
        Ok(ListPage::new(locks, cursor))
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let session = self.inner.session().await?;
        session.catch_up().await?;
        let dir = self.inner.dir(name.as_str());
        loop {
            let children = match session.client.list_children(&dir).await {
                Ok(children) => children,
                Err(zookeeper_client::Error::NoNode) => return Ok(false),
                Err(e) => return Err(map(e, &dir)),
            };
            let Some((_, head)) = queue(children).into_iter().next() else {
                return Ok(false);
            };
            let path = format!("{dir}/{head}");
            match session.client.delete(&path, None).await {
                Ok(()) => return Ok(true),
                // Released meanwhile: the next in line (if any) now holds it.
                Err(zookeeper_client::Error::NoNode) => continue,
                Err(e) => return Err(map(e, &path)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::name::Owner;
    use crate::zookeeper::queue_rules::node_data;

    #[test]
    fn lock_info_reads_node_data() {
        let owner = Owner::new(Some("l\0x".into()), "h", 7);
        let data = node_data(&owner, 1000, Until::At(u64::MAX));
        let info = lock_info("n", &data, 42, 0);
        assert_eq!(info.fence.get(), 42);
        assert_eq!(info.owner.pid, 7);
        assert_eq!(info.owner.host, "h");
        assert_eq!(info.owner.label.as_deref(), Some("l\0x"));
        assert!(info.ttl_left.is_some());
    }

    #[test]
    fn a_session_hold_shows_its_session_timeout_as_ttl_left() {
        let owner = Owner::new(None, "h", 7);
        let data = node_data(&owner, 1000, Until::Session(6000));
        let info = lock_info("n", &data, 42, 0);
        assert_eq!(info.ttl_left, Some(Duration::from_millis(6000)));
        assert_eq!(info.owner.pid, 7);
    }
}
