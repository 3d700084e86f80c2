//! Fixtures: how the conformance suite gets clients of one backend.

use std::sync::Arc;

use dlock::Locks;
use futures::future::BoxFuture;

/// One backend under test. Each call to [`connect`](Fixture::connect) must return a new,
/// independent client (its own connection, keeper and reentrancy identity) of the same store.
pub trait Fixture: Send + Sync + 'static {
    /// The backend's name, used as the first part of trial names (`sqlite::mutex::…`).
    fn backend(&self) -> &'static str;

    /// A new client of the shared store.
    fn connect(&self) -> BoxFuture<'_, anyhow::Result<Locks>>;

    /// A URL other processes can use to reach the same store, for the cross-process cases;
    /// `None` when the store is process-local.
    fn url(&self) -> Option<String>;
}

/// The in-memory backend: every client shares one process-wide named store.
#[derive(Debug)]
pub struct MemoryFixture {
    url: String,
}

impl MemoryFixture {
    /// A fixture on a fresh named store.
    pub fn new() -> Arc<MemoryFixture> {
        Arc::new(MemoryFixture {
            url: format!("memory://conformance-{}", uuid::Uuid::new_v4().simple()),
        })
    }
}

impl Fixture for MemoryFixture {
    fn backend(&self) -> &'static str {
        "memory"
    }

    fn connect(&self) -> BoxFuture<'_, anyhow::Result<Locks>> {
        Box::pin(async move { Ok(dlock::connect(&self.url).await?) })
    }

    fn url(&self) -> Option<String> {
        None
    }
}

/// The SQLite backend on a file in a temp dir, shared by every client and by CLI processes.
#[derive(Debug)]
pub struct SqliteFixture {
    _dir: tempfile::TempDir,
    url: String,
}

impl SqliteFixture {
    /// A fixture on a new database file.
    pub fn new() -> anyhow::Result<Arc<SqliteFixture>> {
        let dir = tempfile::Builder::new().prefix("dlock-sqlite-").tempdir()?;
        let url = format!("sqlite://{}", dir.path().join("locks.db").display());
        Ok(Arc::new(SqliteFixture { _dir: dir, url }))
    }
}

impl Fixture for SqliteFixture {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    fn connect(&self) -> BoxFuture<'_, anyhow::Result<Locks>> {
        Box::pin(async move { Ok(dlock::connect(&self.url).await?) })
    }

    fn url(&self) -> Option<String> {
        Some(self.url.clone())
    }
}

/// The memory backend with every optional capability masked out (no reentrancy, no fair
/// queue, no inspection), so the suite's "unsupported" cases run: the API must answer
/// [`dlock::Error::Unsupported`] where a store cannot serve a request.
#[derive(Debug)]
pub struct MinimalFixture {
    url: String,
}

impl MinimalFixture {
    /// A fixture on a fresh named memory store.
    pub fn new() -> Arc<MinimalFixture> {
        Arc::new(MinimalFixture {
            url: format!("memory://minimal-{}", uuid::Uuid::new_v4().simple()),
        })
    }
}

impl Fixture for MinimalFixture {
    fn backend(&self) -> &'static str {
        "minimal"
    }

    fn connect(&self) -> BoxFuture<'_, anyhow::Result<Locks>> {
        Box::pin(async move {
            let inner = dlock::connect(&self.url).await?;
            let mut capabilities = dlock::backend::Capabilities::none();
            capabilities.native_wait = true;
            Ok(Locks::new(Masked {
                inner: inner.backend().clone(),
                info: dlock::backend::BackendInfo::new("minimal", capabilities),
            }))
        })
    }

    fn url(&self) -> Option<String> {
        None
    }
}

/// A backend that forwards to another but claims fewer capabilities.
#[derive(Debug)]
struct Masked {
    inner: dlock::backend::DynBackend,
    info: dlock::backend::BackendInfo,
}

#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl dlock::backend::Backend for Masked {
    fn info(&self) -> &dlock::backend::BackendInfo {
        &self.info
    }

    async fn acquire(
        &self,
        req: &dlock::backend::AcquireRequest,
    ) -> dlock::Result<Option<Arc<dyn dlock::backend::Lease>>> {
        self.inner.acquire(req).await
    }

    fn monitor(&self) -> Option<&dyn dlock::backend::MonitorStore> {
        if self.info.capabilities.monitor {
            self.inner.monitor()
        } else {
            None
        }
    }

    async fn try_acquire_all(
        &self,
        reqs: &[dlock::backend::AcquireRequest],
    ) -> Option<dlock::Result<Option<Vec<Arc<dyn dlock::backend::Lease>>>>> {
        self.inner.try_acquire_all(reqs).await
    }

    fn values(&self) -> Option<&dyn dlock::backend::ValueStore> {
        if self.info.capabilities.values {
            self.inner.values()
        } else {
            None
        }
    }
}

/// The two ways the SQL backends hold a lock, as a fixture parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SqlMode {
    /// A row per lock in a lease table (the default, `?mode=lease`).
    Lease,
    /// A server-side session lock on a dedicated connection (`?mode=session`).
    Session,
}

impl SqlMode {
    fn query(self) -> &'static str {
        match self {
            SqlMode::Lease => "",
            SqlMode::Session => "?mode=session",
        }
    }
}

/// Starts a server of `kind` for fixtures, or says why not: `Ok(None)` when its binary is
/// missing and `DLOCK_TEST_REQUIRE` does not ask for it (the backend is skipped, loudly).
fn start_shared_server(
    kind: impl crate::server::ServerKind,
) -> anyhow::Result<Option<Arc<std::sync::Mutex<crate::server::ServerProcess>>>> {
    let name = kind.name();
    match crate::server::ServerProcess::start(kind) {
        Ok(server) => Ok(Some(Arc::new(std::sync::Mutex::new(server)))),
        Err(e) if e.is_not_found() && !crate::server::required(name) => {
            eprintln!("skipping the {name} backend: {e}");
            Ok(None)
        }
        Err(e) => Err(anyhow::anyhow!("{e}")),
    }
}

/// A server kind that a SQL backend runs on, with what its fixtures need to know about it.
pub trait SqlServer: crate::server::ServerKind + Default {
    /// The fixtures' backend names, in lease and in session mode.
    const BACKENDS: [&'static str; 2];
    /// The URL of a running server of this kind, without dlock's options.
    fn base_url(server: &crate::server::ServerProcess) -> String;
}

impl SqlServer for crate::server::Postgres {
    const BACKENDS: [&'static str; 2] = ["postgres", "postgres-session"];
    fn base_url(server: &crate::server::ServerProcess) -> String {
        crate::server::Postgres::url(server)
    }
}

impl SqlServer for crate::server::Mariadb {
    const BACKENDS: [&'static str; 2] = ["mariadb", "mariadb-session"];
    fn base_url(server: &crate::server::ServerProcess) -> String {
        crate::server::Mariadb::url(server)
    }
}

/// A SQL backend in one mode, on a server of kind `K` the test kit started (shared by the
/// fixtures of both modes, stopped when the last one is dropped).
#[derive(Debug)]
pub struct SqlFixture<K> {
    mode: SqlMode,
    url: String,
    server: Arc<std::sync::Mutex<crate::server::ServerProcess>>,
    kind: std::marker::PhantomData<fn() -> K>,
}

/// The PostgreSQL backend in one mode, on a server the test kit started.
pub type PostgresFixture = SqlFixture<crate::server::Postgres>;

/// The MySQL/MariaDB backend in one mode, on a MariaDB server the test kit started.
pub type MysqlFixture = SqlFixture<crate::server::Mariadb>;

impl<K: SqlServer> SqlFixture<K> {
    /// Starts one server and returns a fixture per mode; empty when the server is not
    /// installed and not required.
    ///
    /// # Errors
    ///
    /// The server could not be started, or is missing while `DLOCK_TEST_REQUIRE` requires it.
    pub fn start_both() -> anyhow::Result<Vec<Arc<SqlFixture<K>>>> {
        let Some(server) = start_shared_server(K::default())? else {
            return Ok(Vec::new());
        };
        let base = K::base_url(&server.lock().unwrap());
        Ok([SqlMode::Lease, SqlMode::Session]
            .into_iter()
            .map(|mode| {
                Arc::new(SqlFixture {
                    mode,
                    url: format!("{base}{}", mode.query()),
                    server: server.clone(),
                    kind: std::marker::PhantomData,
                })
            })
            .collect())
    }

    /// The server, for fault injection.
    pub fn server(&self) -> &Arc<std::sync::Mutex<crate::server::ServerProcess>> {
        &self.server
    }
}

impl<K: SqlServer> Fixture for SqlFixture<K> {
    fn backend(&self) -> &'static str {
        match self.mode {
            SqlMode::Lease => K::BACKENDS[0],
            SqlMode::Session => K::BACKENDS[1],
        }
    }

    fn connect(&self) -> BoxFuture<'_, anyhow::Result<Locks>> {
        Box::pin(async move { Ok(dlock::connect(&self.url).await?) })
    }

    fn url(&self) -> Option<String> {
        Some(self.url.clone())
    }
}

/// A real `redis-server` started by the test kit on a free loopback port.
#[derive(Debug)]
pub struct RedisFixture {
    server: std::sync::Mutex<crate::server::ServerProcess>,
    url: String,
}

impl RedisFixture {
    /// Starts a server; `Ok(None)` when `redis-server` is not installed and not required
    /// (`DLOCK_TEST_REQUIRE`), so the caller can say it skipped the backend.
    ///
    /// # Errors
    ///
    /// The server could not start, or is required and missing.
    pub fn start() -> anyhow::Result<Option<Arc<RedisFixture>>> {
        use crate::server::{Redis, ServerProcess};
        Ok(
            unless_missing("redis", ServerProcess::start(Redis::default()))?.map(|server| {
                let url = format!("redis://{}", server.addr());
                Arc::new(RedisFixture {
                    server: std::sync::Mutex::new(server),
                    url,
                })
            }),
        )
    }

    /// The server's address.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.server().addr()
    }

    /// The server process, for fault injection (pause, kill, restart).
    pub fn server(&self) -> std::sync::MutexGuard<'_, crate::server::ServerProcess> {
        self.server
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Fixture for RedisFixture {
    fn backend(&self) -> &'static str {
        "redis"
    }

    fn connect(&self) -> BoxFuture<'_, anyhow::Result<Locks>> {
        Box::pin(async move { Ok(dlock::connect(&self.url).await?) })
    }

    fn url(&self) -> Option<String> {
        Some(self.url.clone())
    }
}

/// A real Redis primary with a real replica behind one stable address (the test kit's
/// [`RedisReplicaSet`](crate::server::RedisReplicaSet)): the Redis fixture for faults that
/// lose only part of the data, a failover to a lagging replica and a restart from an older
/// snapshot.
#[derive(Debug)]
pub struct RedisReplicaFixture {
    set: std::sync::Mutex<crate::server::RedisReplicaSet>,
    url: String,
}

impl RedisReplicaFixture {
    /// Starts both servers; `Ok(None)` when `redis-server` is not installed and not required.
    ///
    /// # Errors
    ///
    /// A server could not start, the replica did not sync, or Redis is required and missing.
    pub fn start() -> anyhow::Result<Option<Arc<RedisReplicaFixture>>> {
        let set = unless_missing("redis", crate::server::RedisReplicaSet::start())?;
        Ok(set.map(|set| {
            let url = format!("redis://{}", set.addr());
            Arc::new(RedisReplicaFixture {
                set: std::sync::Mutex::new(set),
                url,
            })
        }))
    }

    /// The stable address clients use.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.set().addr()
    }

    /// The servers, for faults.
    pub fn set(&self) -> std::sync::MutexGuard<'_, crate::server::RedisReplicaSet> {
        self.set
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Fixture for RedisReplicaFixture {
    fn backend(&self) -> &'static str {
        "redis"
    }

    fn connect(&self) -> BoxFuture<'_, anyhow::Result<Locks>> {
        Box::pin(async move { Ok(dlock::connect(&self.url).await?) })
    }

    fn url(&self) -> Option<String> {
        Some(self.url.clone())
    }
}

/// A started server, or `None` when its binary is missing and the run does not require the
/// backend (`DLOCK_TEST_REQUIRE`): the caller then reports the backend as not tested.
fn unless_missing<T>(
    backend: &str,
    started: Result<T, crate::server::ServerError>,
) -> anyhow::Result<Option<T>> {
    // `DLOCK_TEST_REQUIRE` names servers: `redis` covers Redlock, `etcd` the etcd cluster.
    let server = match backend {
        "redlock" => "redis",
        "etcd-cluster" => "etcd",
        other => other,
    };
    match started {
        Ok(server) => Ok(Some(server)),
        Err(error) if error.is_not_found() && !crate::server::required(server) => {
            eprintln!(
                "{backend}: not tested ({error}); set DLOCK_TEST_REQUIRE={server} to fail instead"
            );
            Ok(None)
        }
        Err(error) => Err(error.into()),
    }
}

/// Redlock over five real `redis-server` processes started by the test kit.
#[derive(Debug)]
pub struct RedlockFixture {
    nodes: std::sync::Mutex<crate::server::RedisNodes>,
    url: String,
}

impl RedlockFixture {
    /// Starts `n` servers; `Ok(None)` when `redis-server` is not installed and not required.
    ///
    /// # Errors
    ///
    /// A server could not start, or is required and missing.
    pub fn start(n: usize) -> anyhow::Result<Option<Arc<RedlockFixture>>> {
        use crate::server::RedisNodes;
        let Some(nodes) = unless_missing("redlock", RedisNodes::start(n))? else {
            return Ok(None);
        };
        let url = redlock_url(&nodes.addrs());
        Ok(Some(Arc::new(RedlockFixture {
            nodes: std::sync::Mutex::new(nodes),
            url,
        })))
    }

    /// The servers, for fault injection (pause, kill, restart one node).
    pub fn nodes(&self) -> std::sync::MutexGuard<'_, crate::server::RedisNodes> {
        self.nodes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// `redlock://a,b,c` for these node addresses.
pub fn redlock_url(addrs: &[std::net::SocketAddr]) -> String {
    let nodes: Vec<String> = addrs.iter().map(ToString::to_string).collect();
    format!("redlock://{}", nodes.join(","))
}

impl Fixture for RedlockFixture {
    fn backend(&self) -> &'static str {
        "redlock"
    }

    fn connect(&self) -> BoxFuture<'_, anyhow::Result<Locks>> {
        Box::pin(async move { Ok(dlock::connect(&self.url).await?) })
    }

    fn url(&self) -> Option<String> {
        Some(self.url.clone())
    }
}

/// A real single-member etcd started by the test kit on free loopback ports.
#[derive(Debug)]
pub struct EtcdFixture {
    server: std::sync::Mutex<crate::server::ServerProcess>,
    url: String,
}

impl EtcdFixture {
    /// Starts a member; `Ok(None)` when `etcd` is not installed and not required
    /// (`DLOCK_TEST_REQUIRE`), so the caller can say it skipped the backend.
    ///
    /// # Errors
    ///
    /// The server could not start, or is required and missing.
    pub fn start() -> anyhow::Result<Option<Arc<EtcdFixture>>> {
        use crate::server::{Etcd, ServerProcess};
        let Some(server) = unless_missing("etcd", ServerProcess::start(Etcd::single()?))? else {
            return Ok(None);
        };
        let url = format!("etcd://{}", server.addr());
        Ok(Some(Arc::new(EtcdFixture {
            server: std::sync::Mutex::new(server),
            url,
        })))
    }

    /// The server process, for fault injection (pause, kill, restart).
    pub fn server(&self) -> std::sync::MutexGuard<'_, crate::server::ServerProcess> {
        self.server
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Fixture for EtcdFixture {
    fn backend(&self) -> &'static str {
        "etcd"
    }

    fn connect(&self) -> BoxFuture<'_, anyhow::Result<Locks>> {
        Box::pin(async move { Ok(dlock::connect(&self.url).await?) })
    }

    fn url(&self) -> Option<String> {
        Some(self.url.clone())
    }
}

/// A real 3-member etcd cluster on loopback; clients get every member's address.
#[derive(Debug)]
pub struct EtcdClusterFixture {
    cluster: std::sync::Mutex<crate::server::EtcdCluster>,
    url: String,
}

impl EtcdClusterFixture {
    /// Starts three members; `Ok(None)` when `etcd` is not installed and not required.
    ///
    /// # Errors
    ///
    /// A member could not start, or `etcd` is required and missing.
    pub fn start() -> anyhow::Result<Option<Arc<EtcdClusterFixture>>> {
        use crate::server::EtcdCluster;
        let Some(cluster) = unless_missing("etcd-cluster", EtcdCluster::start(3))? else {
            return Ok(None);
        };
        let url = cluster.url();
        Ok(Some(Arc::new(EtcdClusterFixture {
            cluster: std::sync::Mutex::new(cluster),
            url,
        })))
    }

    /// The members, for fault injection (kill the leader, pause one).
    pub fn cluster(&self) -> std::sync::MutexGuard<'_, crate::server::EtcdCluster> {
        self.cluster
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Fixture for EtcdClusterFixture {
    fn backend(&self) -> &'static str {
        "etcd-cluster"
    }

    fn connect(&self) -> BoxFuture<'_, anyhow::Result<Locks>> {
        Box::pin(async move { Ok(dlock::connect(&self.url).await?) })
    }

    fn url(&self) -> Option<String> {
        Some(self.url.clone())
    }
}

/// Session timeout of the ZooKeeper fixtures' URLs: short, so a killed holder process (whose
/// lock lasts until its session expires) is recovered within the suite's 5 s bound, but not
/// so short that a CPU-starved client (the whole suite on 2 cores) declares its connection
/// lost (after 2/5 of it) and reports watchdog locks uncertain, then lost.
pub const ZOOKEEPER_TEST_SESSION: &str = "3s";

/// A standalone ZooKeeper server started by the test kit; locks under a chroot of their own.
#[derive(Debug)]
pub struct ZookeeperFixture {
    server: std::sync::Mutex<crate::server::ServerProcess>,
    url: String,
}

impl ZookeeperFixture {
    /// Starts a server; `Ok(None)` when ZooKeeper (or a JVM) is not installed and not required
    /// (`DLOCK_TEST_REQUIRE`), so the caller can say it skipped the backend.
    ///
    /// # Errors
    ///
    /// The server could not start, or is required and missing.
    pub fn start() -> anyhow::Result<Option<Arc<ZookeeperFixture>>> {
        use crate::server::{ServerProcess, Zookeeper, required, zookeeper_installed};
        let missing = |reason: String| -> anyhow::Result<Option<Arc<ZookeeperFixture>>> {
            if required("zookeeper") {
                anyhow::bail!("zookeeper is required but {reason}");
            }
            eprintln!(
                "zookeeper: not tested ({reason}); set DLOCK_TEST_REQUIRE=zookeeper to fail instead"
            );
            Ok(None)
        };
        if !zookeeper_installed() {
            return missing("its jar is not installed (apt-get install zookeeper)".into());
        }
        match ServerProcess::start(Zookeeper::default()) {
            Ok(server) => {
                let url = format!(
                    "zk://{}/dlock-test?session_timeout={ZOOKEEPER_TEST_SESSION}",
                    server.addr()
                );
                Ok(Some(Arc::new(ZookeeperFixture {
                    server: std::sync::Mutex::new(server),
                    url,
                })))
            }
            Err(error) if error.is_not_found() => missing(error.to_string()),
            Err(error) => Err(error.into()),
        }
    }

    /// The server process, for fault injection (pause, kill, restart).
    pub fn server(&self) -> std::sync::MutexGuard<'_, crate::server::ServerProcess> {
        self.server
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The fixture's URL.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Fixture for ZookeeperFixture {
    fn backend(&self) -> &'static str {
        "zookeeper"
    }

    fn connect(&self) -> BoxFuture<'_, anyhow::Result<Locks>> {
        Box::pin(async move { Ok(dlock::connect(&self.url).await?) })
    }

    fn url(&self) -> Option<String> {
        Some(self.url.clone())
    }
}

/// A 3-node ZooKeeper ensemble on loopback ports; clients get all three addresses.
#[derive(Debug)]
pub struct ZookeeperEnsembleFixture {
    ensemble: std::sync::Mutex<crate::server::ZookeeperEnsemble>,
    url: String,
}

impl ZookeeperEnsembleFixture {
    /// Starts the ensemble; `Ok(None)` when ZooKeeper is not installed and not required.
    ///
    /// # Errors
    ///
    /// The servers could not start, or are required and missing.
    pub fn start() -> anyhow::Result<Option<Arc<ZookeeperEnsembleFixture>>> {
        use crate::server::{ZookeeperEnsemble, required, zookeeper_installed};
        let missing = |reason: String| -> anyhow::Result<Option<Arc<ZookeeperEnsembleFixture>>> {
            if required("zookeeper") {
                anyhow::bail!("zookeeper is required but {reason}");
            }
            eprintln!("zookeeper-ensemble: not tested ({reason})");
            Ok(None)
        };
        if !zookeeper_installed() {
            return missing("its jar is not installed (apt-get install zookeeper)".into());
        }
        match ZookeeperEnsemble::start() {
            Ok(ensemble) => {
                let url = format!(
                    "zk://{}/dlock-test?session_timeout={ZOOKEEPER_TEST_SESSION}",
                    ensemble.connect_string()
                );
                Ok(Some(Arc::new(ZookeeperEnsembleFixture {
                    ensemble: std::sync::Mutex::new(ensemble),
                    url,
                })))
            }
            Err(error) if error.is_not_found() => missing(error.to_string()),
            Err(error) => Err(error.into()),
        }
    }

    /// The ensemble, for fault injection (kill the leader, pause a member).
    pub fn ensemble(&self) -> std::sync::MutexGuard<'_, crate::server::ZookeeperEnsemble> {
        self.ensemble
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The fixture's URL.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Fixture for ZookeeperEnsembleFixture {
    fn backend(&self) -> &'static str {
        "zookeeper-ensemble"
    }

    fn connect(&self) -> BoxFuture<'_, anyhow::Result<Locks>> {
        Box::pin(async move { Ok(dlock::connect(&self.url).await?) })
    }

    fn url(&self) -> Option<String> {
        Some(self.url.clone())
    }
}
