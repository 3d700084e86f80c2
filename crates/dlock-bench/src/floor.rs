//! The floor: plain store operations with no lock logic, through the same client library and
//! settings as the backend, so a lock's cost reads as a ratio to the physical limit.

use anyhow::Context;

use crate::redis_stats::redis_server;
use crate::scenarios::uncontended::lock_pair;
use crate::unique_name;

/// One pair of plain store operations with no lock logic: what an acquire + release costs at
/// least on this store, through the same client library and settings.
pub(crate) struct FloorPair {
    pub(crate) what: &'static str,
    pub(crate) pair:
        Box<dyn FnMut() -> futures::future::BoxFuture<'static, anyhow::Result<()>> + Send>,
}

/// The floor of a backend, where there is one.
pub(crate) async fn floor_pair(url: &str, backend: &str) -> anyhow::Result<Option<FloorPair>> {
    Ok(match backend {
        "sqlite" => Some(sqlite_floor(url)?),
        "redis" => Some(redis_floor(url).await?),
        "redlock" => Some(one_node_of(url).await?),
        _ => None,
    })
}

/// The Redis floor: `SET NX PX` + `DEL`, the two plain round trips an acquire + release needs
/// at least, through a multiplexed redis-rs connection as the backend's.
async fn redis_floor(url: &str) -> anyhow::Result<FloorPair> {
    let server = redis_server(url).context("not a redis URL")?;
    let conn = redis::aio::ConnectionManager::new(redis::Client::open(server)?).await?;
    let key = unique_name("floor");
    Ok(FloorPair {
        what: "redis-rs SET NX PX + DEL round-trip pairs",
        pair: Box::new(move || {
            let (mut conn, key) = (conn.clone(), key.clone());
            Box::pin(async move {
                let _: Option<String> = redis::cmd("SET")
                    .arg(&key)
                    .arg("token")
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000)
                    .query_async(&mut conn)
                    .await?;
                let _: i64 = redis::cmd("DEL").arg(&key).query_async(&mut conn).await?;
                Ok(())
            })
        }),
    })
}

/// Redlock's reference: the same acquire + release on the first node alone, as `redis://`.
async fn one_node_of(url: &str) -> anyhow::Result<FloorPair> {
    let config = dlock::redlock::RedlockConfig::from_url(url)?;
    let node = config.nodes.first().context("no node")?;
    let locks = dlock::connect(&node.server).await?;
    let name = unique_name("one-node");
    Ok(FloorPair {
        what: "the same acquire+release on one of the nodes (redis://)",
        pair: Box::new(move || {
            let (locks, name) = (locks.clone(), name.clone());
            Box::pin(async move { lock_pair(&locks, &name).await })
        }),
    })
}

/// A scratch SQLite database beside the lock file, removed on drop.
struct Scratch {
    conn: rusqlite::Connection,
    path: std::path::PathBuf,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut path = self.path.clone().into_os_string();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The SQLite floor: two write transactions of the same shape as an acquire and a release, on
/// a scratch database with the backend's settings (WAL, synchronous=NORMAL).
fn sqlite_floor(url: &str) -> anyhow::Result<FloorPair> {
    let config = dlock::sqlite::SqliteConfig::from_url(url)?;
    let mut path = config.path.clone().into_os_string();
    path.push(format!(".floor-{}", std::process::id()));
    let path = std::path::PathBuf::from(path);
    let conn = rusqlite::Connection::open(&path)?;
    let scratch = Scratch { conn, path };
    let _: String = scratch
        .conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    scratch.conn.pragma_update(None, "synchronous", "NORMAL")?;
    scratch.conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS t (name TEXT PRIMARY KEY, fence INTEGER NOT NULL, token TEXT) WITHOUT ROWID",
    )?;
    let scratch = std::sync::Mutex::new(scratch);
    Ok(FloorPair {
        what: "SQLite write-transaction pairs",
        pair: Box::new(move || {
            let done = (|| -> anyhow::Result<()> {
                let scratch = scratch.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                scratch
                    .conn
                    .prepare_cached(
                        "INSERT INTO t VALUES ('x', 1, 'a') ON CONFLICT (name) DO UPDATE SET fence = fence + 1, token = 'a'",
                    )?
                    .execute([])?;
                scratch
                    .conn
                    .prepare_cached("UPDATE t SET token = NULL WHERE name = 'x'")?
                    .execute([])?;
                Ok(())
            })();
            Box::pin(async move { done })
        }),
    })
}
