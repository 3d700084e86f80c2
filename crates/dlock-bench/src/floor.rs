//! The floor: plain store operations with no lock logic, through the same client library and
//! settings as the backend, so a lock's cost reads as a ratio to the physical limit. Besides
//! the floor a backend may have references, measured the same way (Redlock's one node, etcd's
//! floor with a lease granted per pair).

use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use futures::stream::FuturesUnordered;

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

/// The lease (TTL) every floor asks for: the bench's locks' (see `lock_pair`).
const TTL: Duration = Duration::from_secs(30);

/// The floor of a backend first, then its references; empty where there is none.
pub(crate) async fn floor_pairs(url: &str, backend: &str) -> anyhow::Result<Vec<FloorPair>> {
    Ok(match backend {
        "sqlite" => vec![sqlite_floor(url)?],
        "redis" => vec![redis_floor(url).await?],
        "redlock" => vec![redlock_floor(url).await?, one_node_of(url).await?],
        "zk" => vec![zookeeper_floor(url).await?],
        "etcd" => {
            let client = connect_etcd(url).await?;
            vec![
                etcd_floor(client.clone()).await?,
                etcd_floor_granting(client),
            ]
        }
        "postgres" => vec![postgres_floor(url).await?],
        "mysql" => vec![mysql_floor(url).await?],
        "nats" => vec![nats_floor(url).await?],
        "file" => vec![file_floor(url)?],
        _ => Vec::new(),
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
            Box::pin(async move { redis_floor_pair(&mut conn, &key).await })
        }),
    })
}

/// The Redis floor's two commands on `key`: `SET key token NX PX <TTL>`, then `DEL key`.
pub(crate) fn redis_floor_commands(key: &str) -> [redis::Cmd; 2] {
    let mut set = redis::cmd("SET");
    set.arg(key)
        .arg("token")
        .arg("NX")
        .arg("PX")
        .arg(TTL.as_millis() as u64);
    let mut del = redis::cmd("DEL");
    del.arg(key);
    [set, del]
}

/// One floor pair on `key`, each command a round trip of `conn`.
pub(crate) async fn redis_floor_pair(
    conn: &mut redis::aio::ConnectionManager,
    key: &str,
) -> anyhow::Result<()> {
    for command in redis_floor_commands(key) {
        let _: redis::Value = command.query_async(conn).await?;
    }
    Ok(())
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

/// The file store's floor: what a fenced grant and its release cost at least without lock
/// logic, through std: open the lock file and `flock` it, open the counter file, `flock` it,
/// read it, write it one higher and flush it to disk (`fdatasync`), then unlock both. On
/// files of their own beside the store's, so no lock is disturbed.
fn file_floor(url: &str) -> anyhow::Result<FloorPair> {
    use std::os::unix::fs::FileExt;
    let config = dlock::file::FileConfig::from_url(url)?;
    // One file name: the name's `/` would be folders.
    let prefix = unique_name("floor").replace('/', "-");
    let (lock, counter) = (
        config.dir.join(format!("{prefix}.lock")),
        config.dir.join(format!("{prefix}.fence")),
    );
    let open = |path: &std::path::Path| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
    };
    Ok(FloorPair {
        what: "std: open + flock the lock file, read + write + fdatasync a counter under its flock, unlock",
        pair: Box::new(move || {
            let done = (|| -> anyhow::Result<()> {
                let held = open(&lock)?;
                held.try_lock()?;
                let fence = open(&counter)?;
                fence.lock()?;
                let mut buf = [0_u8; 21];
                let read = fence.read_at(&mut buf, 0)?;
                let last: u64 = std::str::from_utf8(&buf[..read])?
                    .trim()
                    .parse()
                    .unwrap_or(0);
                fence.write_all_at(format!("{:020}\n", last + 1).as_bytes(), 0)?;
                fence.sync_data()?;
                fence.unlock()?;
                held.unlock()?;
                Ok(())
            })();
            Box::pin(async move { done })
        }),
    })
}

/// Sends `command` to every node at once and returns once a majority answered: the round a
/// Redlock client waits for at least. The slower nodes' answers are awaited in the background
/// (their commands are sent already), as a Redlock client does.
async fn on_majority(
    nodes: &[redis::aio::ConnectionManager],
    command: &redis::Cmd,
) -> anyhow::Result<()> {
    let majority = majority_of(nodes.len());
    let mut pending: FuturesUnordered<_> = nodes
        .iter()
        .map(|conn| {
            let (mut conn, command) = (conn.clone(), command.clone());
            async move { command.query_async::<redis::Value>(&mut conn).await }
        })
        .collect();
    let (mut answered, mut failed) = (0, Vec::new());
    while answered < majority {
        match pending.next().await {
            Some(Ok(_)) => answered += 1,
            Some(Err(e)) => failed.push(e),
            None => anyhow::bail!("no majority of {} nodes answered: {failed:?}", nodes.len()),
        }
    }
    tokio::spawn(async move { while pending.next().await.is_some() {} });
    Ok(())
}

/// How many of `nodes` make a majority.
pub(crate) fn majority_of(nodes: usize) -> usize {
    nodes / 2 + 1
}

/// The Redlock floor: the Redis floor's `SET NX PX` and `DEL` sent to every node in parallel,
/// each answered on the first majority, through one redis-rs connection manager per node.
async fn redlock_floor(url: &str) -> anyhow::Result<FloorPair> {
    let config = dlock::redlock::RedlockConfig::from_url(url)?;
    let mut nodes = Vec::new();
    for node in &config.nodes {
        let client = redis::Client::open(node.server.clone())?;
        nodes.push(redis::aio::ConnectionManager::new(client).await?);
    }
    let nodes = std::sync::Arc::new(nodes);
    let key = unique_name("floor");
    let mut set = redis::cmd("SET");
    set.arg(&key)
        .arg("token")
        .arg("NX")
        .arg("PX")
        .arg(TTL.as_millis() as u64);
    let mut del = redis::cmd("DEL");
    del.arg(&key);
    Ok(FloorPair {
        what: "redis-rs SET NX PX + DEL, each sent to every node at once and answered on the first majority",
        pair: Box::new(move || {
            let (nodes, set, del) = (nodes.clone(), set.clone(), del.clone());
            Box::pin(async move {
                on_majority(&nodes, &set).await?;
                on_majority(&nodes, &del).await
            })
        }),
    })
}

/// The ZooKeeper floor: an ephemeral sequential node created and deleted under a persistent
/// node of the bench's own (left behind: a container would be reaped between pairs), through zookeeper-client with the backend's session timeout.
async fn zookeeper_floor(url: &str) -> anyhow::Result<FloorPair> {
    use zookeeper_client::{Acls, Client, CreateMode};
    let config = dlock::zookeeper::ZookeeperConfig::from_url(url)?;
    let mut connector = Client::connector().with_session_timeout(config.session_timeout);
    if let Some(digest) = &config.digest {
        connector = connector.with_auth("digest", digest.as_bytes());
    }
    let client = tokio::time::timeout(config.connect_timeout, connector.connect(&config.servers))
        .await
        .context("connecting to ZooKeeper timed out")??;
    let acls = if config.digest.is_some() {
        Acls::creator_all()
    } else {
        Acls::anyone_all()
    };
    let parent = format!(
        "/{}",
        unique_name("floor")
            .replace('/', "-")
            .trim_start_matches('-')
    );
    client
        .create(&parent, &[], &CreateMode::Persistent.with_acls(acls))
        .await
        .with_context(|| format!("create {parent}"))?;
    let prefix = std::sync::Arc::new(format!("{parent}/n-"));
    let client = std::sync::Arc::new(client);
    Ok(FloorPair {
        what: "zookeeper-client ephemeral sequential create + delete",
        pair: Box::new(move || {
            let (client, prefix) = (client.clone(), prefix.clone());
            Box::pin(async move {
                let options = CreateMode::EphemeralSequential.with_acls(acls);
                let (_, sequence) = client.create(&prefix, &[], &options).await?;
                client.delete(&format!("{prefix}{sequence}"), None).await?;
                Ok(())
            })
        }),
    })
}

/// An etcd client with the backend's connection settings.
async fn connect_etcd(url: &str) -> anyhow::Result<etcd_client::Client> {
    let config = dlock::etcd::EtcdConfig::from_url(url)?;
    anyhow::ensure!(!config.tls, "the etcd floor speaks plain HTTP only");
    let mut options = etcd_client::ConnectOptions::new()
        .with_timeout(config.timeout)
        .with_connect_timeout(config.connect_timeout)
        .with_require_leader(true)
        .with_keep_alive(Duration::from_secs(10), config.timeout);
    if let Some(user) = &config.user {
        options = options.with_user(user, config.password.clone().unwrap_or_default());
    }
    let endpoints: Vec<String> = config
        .endpoints
        .iter()
        .map(|e| format!("http://{e}"))
        .collect();
    Ok(etcd_client::Client::connect(endpoints, Some(options)).await?)
}

/// The NATS floor: a KV `create` with a per-key TTL + a delete, through async-nats on the
/// backend's bucket (made by the backend first, so it has per-key TTLs). A new key per pair:
/// a create over a deleted key's marker costs a read more, which is the lock's to pay.
async fn nats_floor(url: &str) -> anyhow::Result<FloorPair> {
    let backend = dlock::nats::NatsBackend::connect_url(url).await?;
    let config = backend.config().clone();
    let servers: Vec<String> = config
        .servers
        .iter()
        .map(|s| format!("nats://{s}"))
        .collect();
    let client = async_nats::ConnectOptions::new()
        .request_timeout(Some(config.timeout))
        .connect(servers.join(","))
        .await?;
    let kv = async_nats::jetstream::new(client)
        .get_key_value(config.bucket.clone())
        .await?;
    let prefix = unique_name("floor");
    let mut n = 0_u64;
    Ok(FloorPair {
        what: "async-nats KV create with a per-key TTL + delete",
        pair: Box::new(move || {
            n += 1;
            let (kv, key) = (kv.clone(), format!("{prefix}-{n}"));
            Box::pin(async move {
                kv.create_with_ttl(key.as_str(), "token".into(), TTL)
                    .await?;
                kv.delete(key.as_str()).await?;
                Ok(())
            })
        }),
    })
}

/// The etcd floor: a put attached to a lease + a delete. The lease is granted once, outside
/// the pairs: the floor is the two round trips a lock's key costs at least.
async fn etcd_floor(mut client: etcd_client::Client) -> anyhow::Result<FloorPair> {
    let lease = client.lease_grant(TTL.as_secs() as i64, None).await?.id();
    // Kept alive by the pairs' own runs being far shorter than the lease.
    let key = unique_name("floor");
    Ok(FloorPair {
        what: "etcd-client put with a lease (granted once, not counted) + delete",
        pair: Box::new(move || {
            let (mut client, key) = (client.clone(), key.clone());
            Box::pin(async move {
                let put = etcd_client::PutOptions::new().with_lease(lease);
                client.put(key.as_str(), "token", Some(put)).await?;
                client.delete(key.as_str(), None).await?;
                Ok(())
            })
        }),
    })
}

/// A reference beside the etcd floor: a lease granted per pair (a lock's own TTL needs its
/// own lease), the put attached to it, the delete; the lease is left to expire, as nobody
/// waits for a lock's lease to be revoked either.
fn etcd_floor_granting(client: etcd_client::Client) -> FloorPair {
    let key = unique_name("floor-granting");
    FloorPair {
        what: "etcd-client lease grant + put with that lease + delete",
        pair: Box::new(move || {
            let (mut client, key) = (client.clone(), key.clone());
            Box::pin(async move {
                let lease = client.lease_grant(TTL.as_secs() as i64, None).await?.id();
                let put = etcd_client::PutOptions::new().with_lease(lease);
                client.put(key.as_str(), "token", Some(put)).await?;
                client.delete(key.as_str(), None).await?;
                Ok(())
            })
        }),
    }
}

/// The PostgreSQL floor: the two statements of a lease-table acquire + release (an upsert
/// that bumps the row's fence and sets its holder, an update that clears it) on a table of
/// the same shape, without the lock logic (no waiter queue, no advisory lock, no sequence, no
/// NOTIFY), through an sqlx pool with the backend's settings.
async fn postgres_floor(url: &str) -> anyhow::Result<FloorPair> {
    use std::str::FromStr;
    let config = dlock::postgres::PostgresConfig::from_url(url)?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(config.max_connections.unwrap_or(20))
        .acquire_timeout(config.connect_timeout)
        .idle_timeout(Duration::from_secs(60))
        .connect_with(sqlx::postgres::PgConnectOptions::from_str(&config.url)?)
        .await?;
    sqlx::query(
        r#"CREATE TABLE IF NOT EXISTS dlock_bench_floor (
            name text COLLATE "C" PRIMARY KEY, hold_fence bigint NOT NULL, token text,
            holds integer NOT NULL DEFAULT 0, expires_at timestamptz NOT NULL,
            acquired_at timestamptz NOT NULL, owner_label text, host text, pid bigint)"#,
    )
    .execute(&pool)
    .await?;
    let name = unique_name("floor");
    Ok(FloorPair {
        what: "sqlx: the lease table's upsert + update, without lock logic",
        pair: Box::new(move || {
            let (pool, name) = (pool.clone(), name.clone());
            Box::pin(async move {
                let _fence: i64 = sqlx::query_scalar(
                    "INSERT INTO dlock_bench_floor AS l
                         (name, hold_fence, token, holds, expires_at, acquired_at, owner_label, host, pid)
                     VALUES ($1, 1, $2, 1, now() + $3 * interval '1 millisecond', now(), NULL, 'host', 1)
                     ON CONFLICT (name) DO UPDATE SET hold_fence = l.hold_fence + 1,
                         token = EXCLUDED.token, holds = 1, expires_at = EXCLUDED.expires_at,
                         acquired_at = EXCLUDED.acquired_at
                     RETURNING hold_fence",
                )
                .bind(&name)
                .bind("token")
                .bind(TTL.as_millis() as i64)
                .fetch_one(&pool)
                .await?;
                sqlx::query(
                    "UPDATE dlock_bench_floor SET token = NULL, holds = 0, expires_at = now()
                     WHERE name = $1 AND token = $2",
                )
                .bind(&name)
                .bind("token")
                .execute(&pool)
                .await?;
                Ok(())
            })
        }),
    })
}

/// The MySQL/MariaDB floor: the two statements of a lease-table acquire + release (an update
/// that bumps the row's fence, returned through `LAST_INSERT_ID`, and sets its holder; an
/// update that clears it) on a table of the same shape with its row already there, without
/// the lock logic (no waiter queue, no sequence), through an sqlx pool with the backend's
/// settings.
async fn mysql_floor(url: &str) -> anyhow::Result<FloorPair> {
    use std::str::FromStr;
    let config = dlock::mysql::MysqlConfig::from_url(url)?;
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(config.max_connections.unwrap_or(20))
        .acquire_timeout(config.connect_timeout)
        .idle_timeout(Duration::from_secs(60))
        .connect_with(sqlx::mysql::MySqlConnectOptions::from_str(&config.url)?)
        .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS dlock_bench_floor (
            name VARBINARY(512) NOT NULL PRIMARY KEY, hold_fence BIGINT NOT NULL,
            token VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NULL,
            holds INT NOT NULL DEFAULT 0, expires_at BIGINT NOT NULL DEFAULT 0,
            acquired_at BIGINT NOT NULL DEFAULT 0,
            owner_label VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
            host VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, pid BIGINT NULL,
            KEY dlock_bench_floor_expires_at (expires_at)
        ) ENGINE=InnoDB",
    )
    .execute(&pool)
    .await?;
    let name = unique_name("floor");
    sqlx::query("INSERT INTO dlock_bench_floor (name, hold_fence) VALUES (?, 0)")
        .bind(&name)
        .execute(&pool)
        .await?;
    // The database's clock in µs, as the backend keeps it.
    const NOW: &str = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))";
    let take: std::sync::Arc<str> = format!(
        "UPDATE dlock_bench_floor SET hold_fence = LAST_INSERT_ID(hold_fence + 1), holds = 1,
             acquired_at = {NOW}, owner_label = ?, host = ?, pid = ?, expires_at = {NOW} + ?,
             token = ?
         WHERE name = ?"
    )
    .into();
    let release: std::sync::Arc<str> = format!(
        "UPDATE dlock_bench_floor SET token = NULL, expires_at = {NOW},
             holds = LAST_INSERT_ID(holds - 1)
         WHERE name = ? AND token = ?"
    )
    .into();
    Ok(FloorPair {
        what: "sqlx: the lease table's two updates, without lock logic",
        pair: Box::new(move || {
            let (pool, name) = (pool.clone(), name.clone());
            let (take, release) = (take.clone(), release.clone());
            Box::pin(async move {
                let taken = sqlx::query(sqlx::AssertSqlSafe(take))
                    .bind(None::<&str>)
                    .bind("host")
                    .bind(1_i64)
                    .bind(TTL.as_micros() as i64)
                    .bind("token")
                    .bind(&name)
                    .execute(&pool)
                    .await?;
                anyhow::ensure!(taken.rows_affected() == 1, "the floor's row is gone");
                sqlx::query(sqlx::AssertSqlSafe(release))
                    .bind(&name)
                    .bind("token")
                    .execute(&pool)
                    .await?;
                Ok(())
            })
        }),
    })
}

/// The floors against real servers from the test kit: each pair leaves the store as it found
/// it (nothing held), and the SQL floors write what an acquire and a release would.
#[cfg(test)]
mod tests {
    use super::*;
    use dlock_testkit::server::{Etcd, Mariadb, Postgres, Redis, ServerProcess, Zookeeper};

    const PAIRS: i64 = 5;

    async fn run_pairs(floors: &mut [FloorPair]) -> anyhow::Result<()> {
        for floor in floors {
            for _ in 0..PAIRS {
                (floor.pair)().await?;
            }
        }
        Ok(())
    }

    #[test]
    fn a_majority_is_more_than_half() {
        let majorities: Vec<usize> = (1..=6).map(majority_of).collect();
        assert_eq!(majorities, [1, 2, 2, 3, 3, 4]);
    }

    #[tokio::test]
    async fn redlock_floor_sets_and_deletes_on_every_node() -> anyhow::Result<()> {
        let nodes = (0..3)
            .map(|_| ServerProcess::start(Redis::default()))
            .collect::<Result<Vec<_>, _>>()?;
        let addrs: Vec<String> = nodes.iter().map(|n| n.addr().to_string()).collect();
        let url = format!("redlock://{}", addrs.join(","));
        let mut floors = floor_pairs(&url, "redlock").await?;
        assert_eq!(floors.len(), 2, "the floor and the one-node reference");
        run_pairs(&mut floors).await?;
        // The slower nodes' DEL may still be on its way: every node ends up empty.
        for node in &nodes {
            let mut conn = redis::Client::open(format!("redis://{}", node.addr()))?
                .get_multiplexed_async_connection()
                .await?;
            let mut keys: Vec<String> = Vec::new();
            for _ in 0..100 {
                keys = redis::cmd("KEYS")
                    .arg("dlock-bench/floor/*")
                    .query_async(&mut conn)
                    .await?;
                if keys.is_empty() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert!(keys.is_empty(), "left on {}: {keys:?}", node.addr());
        }
        Ok(())
    }

    #[tokio::test]
    async fn zookeeper_floor_leaves_no_node() -> anyhow::Result<()> {
        let server = ServerProcess::start(Zookeeper::default())?;
        let url = format!("zk://{}/bench", server.addr());
        let mut floors = floor_pairs(&url, "zk").await?;
        run_pairs(&mut floors).await?;
        let client = zookeeper_client::Client::connect(&server.addr().to_string()).await?;
        let parents: Vec<String> = client
            .list_children("/")
            .await?
            .into_iter()
            .filter(|c| c.starts_with("dlock-bench-floor"))
            .collect();
        assert_eq!(parents.len(), 1, "{parents:?}");
        let left = client.list_children(&format!("/{}", parents[0])).await?;
        assert!(left.is_empty(), "{left:?}");
        Ok(())
    }

    #[tokio::test]
    async fn etcd_floors_leave_no_key() -> anyhow::Result<()> {
        let server = ServerProcess::start(Etcd::single()?)?;
        let url = format!("etcd://{}", server.addr());
        let mut floors = floor_pairs(&url, "etcd").await?;
        assert_eq!(
            floors.len(),
            2,
            "the floor and the lease-granting reference"
        );
        run_pairs(&mut floors).await?;
        let mut client = connect_etcd(&url).await?;
        let options = etcd_client::GetOptions::new()
            .with_prefix()
            .with_count_only();
        let left = client.get("dlock-bench/", Some(options)).await?.count();
        assert_eq!(left, 0);
        // The reference granted a lease per pair, the floor one for all.
        let leases = client.leases().await?.leases().len() as i64;
        assert_eq!(leases, PAIRS + 1);
        Ok(())
    }

    #[tokio::test]
    async fn postgres_floor_takes_and_frees_its_row() -> anyhow::Result<()> {
        let server = ServerProcess::start(Postgres::default())?;
        let url = Postgres::url(&server);
        let mut floors = floor_pairs(&url, "postgres").await?;
        run_pairs(&mut floors).await?;
        let pool = sqlx::PgPool::connect(&url).await?;
        let (fence, held): (i64, i64) = sqlx::query_as(
            "SELECT max(hold_fence), count(token) + sum(holds) FROM dlock_bench_floor",
        )
        .fetch_one(&pool)
        .await?;
        assert_eq!((fence, held), (PAIRS, 0));
        Ok(())
    }

    #[tokio::test]
    async fn mysql_floor_takes_and_frees_its_row() -> anyhow::Result<()> {
        let server = ServerProcess::start(Mariadb::default())?;
        let url = Mariadb::url(&server);
        let mut floors = floor_pairs(&url, "mysql").await?;
        run_pairs(&mut floors).await?;
        let pool = sqlx::MySqlPool::connect(&url).await?;
        let (fence, tokens, holds): (i64, i64, i64) = sqlx::query_as(
            "SELECT CAST(MAX(hold_fence) AS SIGNED), CAST(COUNT(token) AS SIGNED),
                    CAST(SUM(holds) AS SIGNED)
             FROM dlock_bench_floor",
        )
        .fetch_one(&pool)
        .await?;
        assert_eq!((fence, tokens, holds), (PAIRS, 0, 0));
        Ok(())
    }
}
