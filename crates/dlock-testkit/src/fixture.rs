//! Fixtures: how the conformance suite gets clients of one backend.

use std::sync::Arc;

use dlock::Locks;
use futures::future::BoxFuture;

use crate::server::{
    Etcd, EtcdCluster, Nats, NatsCluster, Redis, RedisCluster, RedisNodes, RedisReplicaSet,
    RedisSentinelSet, ServerProcess, Zookeeper, ZookeeperEnsemble,
};

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

    /// What the suites must know of the store beyond its
    /// [`Capabilities`](dlock::backend::Capabilities); most stores have the defaults.
    fn traits(&self) -> StoreTraits {
        StoreTraits::default()
    }
}

/// How a store behaves where its [`Capabilities`](dlock::backend::Capabilities) do not say:
/// the conformance suite registers cases by these, never by the backend's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreTraits {
    /// Inspection counts a lock's waiters. Not Redlock: it keeps no queue (a waiter only
    /// listens for releases).
    pub counts_waiters: bool,
    /// A repeated attempt with the same token finds its own grant. Not where each attempt
    /// holds its own server object (a session connection, an etcd key under the attempt's
    /// lease, a ZooKeeper sequential node): a lost reply leaves an object only its own
    /// connection or lease can end.
    pub retry_finds_its_grant: bool,
    /// Inspection reports the time left of a held lease. Not the SQL session locks: they have
    /// no expiry in the server (the holder's client keeps the TTL).
    pub reports_ttl: bool,
    /// A grant's fence is settled over the nodes that answer (Redlock), so a repeated attempt
    /// may see a node that granted late with a higher one.
    pub fence_by_quorum: bool,
}

impl Default for StoreTraits {
    fn default() -> StoreTraits {
        StoreTraits {
            counts_waiters: true,
            retry_finds_its_grant: true,
            reports_ttl: true,
            fence_by_quorum: false,
        }
    }
}

/// The traits of a store whose attempts each hold their own server object.
const OWN_OBJECT_PER_ATTEMPT: StoreTraits = StoreTraits {
    counts_waiters: true,
    retry_finds_its_grant: false,
    reports_ttl: true,
    fence_by_quorum: false,
};

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

/// The file backend on a temp dir: lock files that other processes, `flock(1)` and Python's
/// `filelock` see too. Its holds are kept by the client as the SQL session locks' are: no
/// expiry to report, and each attempt holds its own descriptor.
#[derive(Debug)]
pub struct FileFixture {
    dir: tempfile::TempDir,
    url: String,
}

impl FileFixture {
    /// A fixture on a new folder.
    pub fn new() -> anyhow::Result<Arc<FileFixture>> {
        let dir = tempfile::Builder::new().prefix("dlock-file-").tempdir()?;
        let url = format!("file://{}", dir.path().display());
        Ok(Arc::new(FileFixture { dir, url }))
    }

    /// The folder of the lock files.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Fixture for FileFixture {
    fn backend(&self) -> &'static str {
        "file"
    }

    fn connect(&self) -> BoxFuture<'_, anyhow::Result<Locks>> {
        Box::pin(async move { Ok(dlock::connect(&self.url).await?) })
    }

    fn url(&self) -> Option<String> {
        Some(self.url.clone())
    }

    fn traits(&self) -> StoreTraits {
        StoreTraits {
            reports_ttl: false,
            ..OWN_OBJECT_PER_ATTEMPT
        }
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

    fn traits(&self) -> StoreTraits {
        match self.mode {
            SqlMode::Lease => StoreTraits::default(),
            SqlMode::Session => StoreTraits {
                reports_ttl: false,
                ..OWN_OBJECT_PER_ATTEMPT
            },
        }
    }
}

/// A started server, or `None` when its binary is missing and the run does not require the
/// backend (`DLOCK_TEST_REQUIRE`): the caller then reports the backend as not tested.
fn unless_missing<T>(
    backend: &str,
    started: Result<T, crate::server::ServerError>,
) -> anyhow::Result<Option<T>> {
    // `DLOCK_TEST_REQUIRE` names servers: the backend's line of `STARTERS` says which one
    // (`redis` covers Redlock, `etcd` the etcd cluster).
    let server = server_of(backend).unwrap_or(backend);
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

/// A store the test kit started as child processes: the processes (`H`: one server, or a
/// cluster), the URL its clients use, and the backend's name. `K` names the store, so the
/// fixtures of one kind of handle are distinct types. One generic fixture for every server
/// store; each gets its own `start`.
pub struct ServerFixture<K, H = ServerProcess> {
    backend: &'static str,
    traits: StoreTraits,
    servers: std::sync::Mutex<H>,
    url: String,
    store: std::marker::PhantomData<fn() -> K>,
}

impl<K, H: std::fmt::Debug> std::fmt::Debug for ServerFixture<K, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerFixture")
            .field("backend", &self.backend)
            .field("servers", &self.servers)
            .field("url", &self.url)
            .finish()
    }
}

impl<K, H> ServerFixture<K, H> {
    fn new(backend: &'static str, servers: H, url: String) -> Arc<Self> {
        Self::with_traits(backend, StoreTraits::default(), servers, url)
    }

    fn with_traits(
        backend: &'static str,
        traits: StoreTraits,
        servers: H,
        url: String,
    ) -> Arc<Self> {
        Arc::new(ServerFixture {
            backend,
            traits,
            servers: std::sync::Mutex::new(servers),
            url,
            store: std::marker::PhantomData,
        })
    }

    /// The processes, for fault injection (pause, kill, restart, fail over).
    pub fn server(&self) -> std::sync::MutexGuard<'_, H> {
        self.servers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl<K: 'static, H: Send + 'static> Fixture for ServerFixture<K, H> {
    fn backend(&self) -> &'static str {
        self.backend
    }

    fn connect(&self) -> BoxFuture<'_, anyhow::Result<Locks>> {
        Box::pin(async move { Ok(dlock::connect(&self.url).await?) })
    }

    fn url(&self) -> Option<String> {
        Some(self.url.clone())
    }

    fn traits(&self) -> StoreTraits {
        self.traits
    }
}

/// A real `redis-server` on a free loopback port.
pub type RedisFixture = ServerFixture<Redis>;
/// A real Redis primary with a real replica behind one stable address
/// ([`RedisReplicaSet`]): for faults that lose part of the data (a failover to a lagging
/// replica, a restart from an older snapshot).
pub type RedisReplicaFixture = ServerFixture<RedisReplicaSet, RedisReplicaSet>;
/// A real Redis primary, replica and three sentinels; clients find the primary through the
/// sentinels (`redis+sentinel://`).
pub type RedisSentinelFixture = ServerFixture<RedisSentinelSet, RedisSentinelSet>;
/// A real Redis Cluster: three primaries with a replica each (`redis+cluster://`).
pub type RedisClusterFixture = ServerFixture<RedisCluster, RedisCluster>;
/// Redlock over real `redis-server` processes.
pub type RedlockFixture = ServerFixture<RedisNodes, RedisNodes>;
/// A real single-member etcd on free loopback ports.
pub type EtcdFixture = ServerFixture<Etcd>;
/// A real 3-member etcd cluster on loopback; clients get every member's address.
pub type EtcdClusterFixture = ServerFixture<EtcdCluster, EtcdCluster>;
/// A standalone ZooKeeper server; locks under a chroot of their own.
pub type ZookeeperFixture = ServerFixture<Zookeeper>;
/// A 3-node ZooKeeper ensemble on loopback ports; clients get all three addresses.
pub type ZookeeperEnsembleFixture = ServerFixture<ZookeeperEnsemble, ZookeeperEnsemble>;

// Each `start` returns `Ok(None)` when the store's server is not installed and the run does not
// require it (`DLOCK_TEST_REQUIRE`), so the caller can say it skipped the backend; an error when
// a server could not start, or is required and missing.

impl RedisFixture {
    /// Starts a server.
    ///
    /// # Errors
    ///
    /// See above.
    pub fn start() -> anyhow::Result<Option<Arc<RedisFixture>>> {
        let server = unless_missing("redis", ServerProcess::start(Redis::default()))?;
        Ok(server.map(|server| {
            let url = format!("redis://{}", server.addr());
            ServerFixture::new("redis", server, url)
        }))
    }

    /// Starts a server whose clients keep mutexes in redis-py's layout (`layout=redis-py`).
    ///
    /// # Errors
    ///
    /// See above.
    pub fn start_py_layout() -> anyhow::Result<Option<Arc<RedisFixture>>> {
        let server = unless_missing("redis-py-layout", ServerProcess::start(Redis::default()))?;
        Ok(server.map(|server| {
            let url = format!("redis://{}?layout=redis-py", server.addr());
            ServerFixture::new("redis-py-layout", server, url)
        }))
    }

    /// The server's address.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.server().addr()
    }
}

impl RedisReplicaFixture {
    /// Starts both servers and waits for the replica to sync.
    ///
    /// # Errors
    ///
    /// See above; also a replica that did not sync.
    pub fn start() -> anyhow::Result<Option<Arc<RedisReplicaFixture>>> {
        let set = unless_missing("redis", RedisReplicaSet::start())?;
        Ok(set.map(|set| {
            let url = format!("redis://{}", set.addr());
            ServerFixture::new("redis", set, url)
        }))
    }

    /// The stable address clients use.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.server().addr()
    }
}

impl RedisSentinelFixture {
    /// Starts the set and waits until the sentinels know it whole.
    ///
    /// # Errors
    ///
    /// See above; also a set that did not settle.
    pub fn start() -> anyhow::Result<Option<Arc<RedisSentinelFixture>>> {
        let set = unless_missing("redis-sentinel", RedisSentinelSet::start())?;
        Ok(set.map(|set| {
            let url = set.url();
            ServerFixture::new("redis-sentinel", set, url)
        }))
    }
}

impl RedisClusterFixture {
    /// Starts the cluster and waits until every node serves every slot.
    ///
    /// # Errors
    ///
    /// See above; also a cluster that did not settle.
    pub fn start() -> anyhow::Result<Option<Arc<RedisClusterFixture>>> {
        let cluster = unless_missing("redis-cluster", RedisCluster::start())?;
        Ok(cluster.map(|cluster| {
            let url = cluster.url();
            ServerFixture::new("redis-cluster", cluster, url)
        }))
    }
}

impl RedlockFixture {
    /// Starts `n` servers.
    ///
    /// # Errors
    ///
    /// See above.
    pub fn start(n: usize) -> anyhow::Result<Option<Arc<RedlockFixture>>> {
        let nodes = unless_missing("redlock", RedisNodes::start(n))?;
        Ok(nodes.map(|nodes| {
            let url = format!(
                "{}?node_timeout={}ms",
                redlock_url(&nodes.addrs()),
                REDLOCK_TEST_NODE_TIMEOUT.as_millis()
            );
            let traits = StoreTraits {
                counts_waiters: false,
                fence_by_quorum: true,
                ..StoreTraits::default()
            };
            ServerFixture::with_traits("redlock", traits, nodes, url)
        }))
    }
}

/// The per-node timeout of the Redlock fixture's URL. The default (50 ms) suits servers on a
/// quiet network; with the whole suite on 2 cores a node's answer can wait longer than that
/// for a CPU, and a round with three of five nodes late fails as unavailable. Still capped at a
/// third of each lock's TTL, so short-TTL cases keep their bound.
pub const REDLOCK_TEST_NODE_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(500);

/// `redlock://a,b,c` for these node addresses.
pub fn redlock_url(addrs: &[std::net::SocketAddr]) -> String {
    let nodes: Vec<String> = addrs.iter().map(ToString::to_string).collect();
    format!("redlock://{}", nodes.join(","))
}

impl EtcdFixture {
    /// Starts a member.
    ///
    /// # Errors
    ///
    /// See above.
    pub fn start() -> anyhow::Result<Option<Arc<EtcdFixture>>> {
        let server = unless_missing("etcd", ServerProcess::start(Etcd::single()?))?;
        Ok(server.map(|server| {
            let url = format!("etcd://{}", server.addr());
            ServerFixture::with_traits("etcd", OWN_OBJECT_PER_ATTEMPT, server, url)
        }))
    }
}

impl EtcdClusterFixture {
    /// Starts three members.
    ///
    /// # Errors
    ///
    /// See above.
    pub fn start() -> anyhow::Result<Option<Arc<EtcdClusterFixture>>> {
        let cluster = unless_missing("etcd-cluster", EtcdCluster::start(3))?;
        Ok(cluster.map(|cluster| {
            let url = cluster.url();
            ServerFixture::with_traits("etcd-cluster", OWN_OBJECT_PER_ATTEMPT, cluster, url)
        }))
    }
}

/// The traits of a store that keeps nothing of its waiters (they watch the lock's key): none
/// to count.
const NO_WAITERS_IN_THE_STORE: StoreTraits = StoreTraits {
    counts_waiters: false,
    retry_finds_its_grant: true,
    reports_ttl: true,
    fence_by_quorum: false,
};

/// A real `nats-server` with JetStream on a free loopback port; locks in the bucket
/// `dlock_test`.
pub type NatsFixture = ServerFixture<Nats>;

impl NatsFixture {
    /// Starts a server.
    ///
    /// # Errors
    ///
    /// See above.
    pub fn start() -> anyhow::Result<Option<Arc<NatsFixture>>> {
        let server = unless_missing("nats", ServerProcess::start(Nats))?;
        Ok(server.map(|server| {
            let url = format!("nats://{}/dlock_test", server.addr());
            ServerFixture::with_traits("nats", NO_WAITERS_IN_THE_STORE, server, url)
        }))
    }
}

/// A real three-node NATS JetStream cluster on loopback; clients get every node's address, and
/// the bucket `dlock_test` has a replica on each node.
pub type NatsClusterFixture = ServerFixture<NatsCluster, NatsCluster>;

/// The stream of the NATS cluster fixture's bucket, whose leader the leader faults strike.
pub const NATS_TEST_STREAM: &str = "KV_dlock_test";

impl NatsClusterFixture {
    /// Starts three nodes and makes the bucket.
    ///
    /// # Errors
    ///
    /// See above; also a bucket the cluster would not make.
    pub fn start() -> anyhow::Result<Option<Arc<NatsClusterFixture>>> {
        let Some(cluster) = unless_missing("nats-cluster", NatsCluster::start(3))? else {
            return Ok(None);
        };
        let url = cluster.url("dlock_test");
        make_bucket(&url)?;
        cluster.wait_for_stream(NATS_TEST_STREAM, std::time::Duration::from_secs(30))?;
        Ok(Some(ServerFixture::with_traits(
            "nats-cluster",
            NO_WAITERS_IN_THE_STORE,
            cluster,
            url,
        )))
    }
}

/// Makes the bucket of a `nats://` URL by connecting once with a long timeout: a replicated
/// stream can take longer to make on a loaded machine than a client's request timeout, and
/// the first case would otherwise fail for it.
fn make_bucket(url: &str) -> anyhow::Result<()> {
    let url = format!("{url}&timeout=15s");
    // A thread of its own: a fixture may be started from inside a runtime.
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?
                    .block_on(async { dlock::connect(&url).await.map(drop) })
                    .map_err(anyhow::Error::from)
            })
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the bucket's thread panicked")))
    })
}

/// Session timeout of the ZooKeeper fixtures' URLs: short, so a killed holder process (whose
/// lock lasts until its session expires) is recovered within the suite's 5 s bound, but not
/// so short that a CPU-starved client (the whole suite on 2 cores) declares its connection
/// lost (after 2/5 of it) and reports watchdog locks uncertain, then lost.
pub const ZOOKEEPER_TEST_SESSION: std::time::Duration = std::time::Duration::from_secs(3);

/// The URL of a ZooKeeper fixture whose servers answer at `connect_string`.
fn zookeeper_url(connect_string: &str) -> String {
    format!(
        "zk://{connect_string}/dlock-test?session_timeout={}ms",
        ZOOKEEPER_TEST_SESSION.as_millis()
    )
}

/// ZooKeeper needs its jar (and a JVM) besides a binary: a missing jar is "not installed" too.
fn unless_zookeeper_missing<T>(
    backend: &str,
    start: impl FnOnce() -> Result<T, crate::server::ServerError>,
) -> anyhow::Result<Option<T>> {
    if !crate::server::zookeeper_installed() {
        if crate::server::required("zookeeper") {
            anyhow::bail!("zookeeper is required but its jar is not installed");
        }
        eprintln!(
            "{backend}: not tested (its jar is not installed: apt-get install zookeeper); \
             set DLOCK_TEST_REQUIRE=zookeeper to fail instead"
        );
        return Ok(None);
    }
    unless_missing(backend, start())
}

impl ZookeeperFixture {
    /// Starts a server.
    ///
    /// # Errors
    ///
    /// See above.
    pub fn start() -> anyhow::Result<Option<Arc<ZookeeperFixture>>> {
        let server =
            unless_zookeeper_missing("zookeeper", || ServerProcess::start(Zookeeper::default()))?;
        Ok(server.map(|server| {
            let url = zookeeper_url(&server.addr().to_string());
            ServerFixture::with_traits("zookeeper", OWN_OBJECT_PER_ATTEMPT, server, url)
        }))
    }
}

impl ZookeeperEnsembleFixture {
    /// Starts the ensemble.
    ///
    /// # Errors
    ///
    /// See above.
    pub fn start() -> anyhow::Result<Option<Arc<ZookeeperEnsembleFixture>>> {
        let ensemble = unless_zookeeper_missing("zookeeper-ensemble", ZookeeperEnsemble::start)?;
        Ok(ensemble.map(|ensemble| {
            let url = zookeeper_url(&ensemble.connect_string());
            ServerFixture::with_traits("zookeeper-ensemble", OWN_OBJECT_PER_ATTEMPT, ensemble, url)
        }))
    }
}

/// One line of [`STARTERS`]: how the suites start the fixtures of one kind of store.
#[derive(Clone, Copy, Debug)]
pub struct Starter {
    /// The driver they test, as [`dlock::enabled_backends`] names it; a build without it
    /// starts nothing.
    pub driver: &'static str,
    /// The backend names ([`Fixture::backend`]) of the fixtures it starts, so a run
    /// filtered to other backends need not start its servers.
    pub backends: &'static [&'static str],
    /// The server whose absence leaves it empty, as `DLOCK_TEST_REQUIRE` and the build script
    /// name it; `None` for a store with no server.
    pub server: Option<&'static str>,
    /// It runs several servers (a Sentinel set, a cluster, an ensemble): the suites that
    /// test each backend once, on one server, leave it out.
    pub several_servers: bool,
    /// Its store claims fewer capabilities than it has (the `minimal` fixture), for the
    /// conformance cases that check the API's `Unsupported` answers; other suites leave it out.
    pub masked: bool,
    /// Starts them; empty when the server is not installed and not required.
    pub start: fn() -> anyhow::Result<Vec<Arc<dyn Fixture>>>,
}

/// Boxes one optional fixture for [`Starter::start`].
fn one<F: Fixture>(
    started: anyhow::Result<Option<Arc<F>>>,
) -> anyhow::Result<Vec<Arc<dyn Fixture>>> {
    Ok(started?
        .into_iter()
        .map(|fx| fx as Arc<dyn Fixture>)
        .collect())
}

/// Boxes a list of fixtures for [`Starter::start`].
fn each<F: Fixture>(started: anyhow::Result<Vec<Arc<F>>>) -> anyhow::Result<Vec<Arc<dyn Fixture>>> {
    Ok(started?
        .into_iter()
        .map(|fx| fx as Arc<dyn Fixture>)
        .collect())
}

/// Every fixture the conformance suite and the bad-input matrix run on, one line per kind of
/// store: a new backend adds its line here.
pub const STARTERS: &[Starter] = &[
    Starter {
        driver: "memory",
        backends: &["memory"],
        server: None,
        several_servers: false,
        masked: false,
        start: || Ok(vec![MemoryFixture::new()]),
    },
    // Memory with every optional capability masked.
    Starter {
        driver: "memory",
        backends: &["minimal"],
        server: None,
        several_servers: false,
        masked: true,
        start: || Ok(vec![MinimalFixture::new()]),
    },
    Starter {
        driver: "sqlite",
        backends: &["sqlite"],
        server: None,
        several_servers: false,
        masked: false,
        start: || Ok(vec![SqliteFixture::new()?]),
    },
    Starter {
        driver: "file",
        backends: &["file"],
        server: None,
        several_servers: false,
        masked: false,
        start: || Ok(vec![FileFixture::new()?]),
    },
    Starter {
        driver: "redis",
        backends: &["redis"],
        server: Some("redis"),
        several_servers: false,
        masked: false,
        start: || one(RedisFixture::start()),
    },
    // Mutexes in redis-py's layout (`?layout=redis-py`): the lock's key is redis-py's own.
    Starter {
        driver: "redis",
        backends: &["redis-py-layout"],
        server: Some("redis"),
        several_servers: false,
        masked: false,
        start: || one(RedisFixture::start_py_layout()),
    },
    Starter {
        driver: "redis",
        backends: &["redis-sentinel"],
        server: Some("redis"),
        several_servers: true,
        masked: false,
        start: || one(RedisSentinelFixture::start()),
    },
    Starter {
        driver: "redis",
        backends: &["redis-cluster"],
        server: Some("redis"),
        several_servers: true,
        masked: false,
        start: || one(RedisClusterFixture::start()),
    },
    // Redlock needs several servers by nature; five is the usual deployment.
    Starter {
        driver: "redlock",
        backends: &["redlock"],
        server: Some("redis"),
        several_servers: false,
        masked: false,
        start: || one(RedlockFixture::start(5)),
    },
    // One server per SQL store, shared by the fixtures of both modes (lease table, session
    // locks).
    Starter {
        driver: "postgres",
        backends: &crate::server::Postgres::BACKENDS,
        server: Some("postgres"),
        several_servers: false,
        masked: false,
        start: || each(PostgresFixture::start_both()),
    },
    Starter {
        driver: "mysql",
        backends: &crate::server::Mariadb::BACKENDS,
        server: Some("mariadb"),
        several_servers: false,
        masked: false,
        start: || each(MysqlFixture::start_both()),
    },
    Starter {
        driver: "etcd",
        backends: &["etcd"],
        server: Some("etcd"),
        several_servers: false,
        masked: false,
        start: || one(EtcdFixture::start()),
    },
    Starter {
        driver: "etcd",
        backends: &["etcd-cluster"],
        server: Some("etcd"),
        several_servers: true,
        masked: false,
        start: || one(EtcdClusterFixture::start()),
    },
    Starter {
        driver: "zookeeper",
        backends: &["zookeeper"],
        server: Some("zookeeper"),
        several_servers: false,
        masked: false,
        start: || one(ZookeeperFixture::start()),
    },
    Starter {
        driver: "zookeeper",
        backends: &["zookeeper-ensemble"],
        server: Some("zookeeper"),
        several_servers: true,
        masked: false,
        start: || one(ZookeeperEnsembleFixture::start()),
    },
    Starter {
        driver: "nats",
        backends: &["nats"],
        server: Some("nats"),
        several_servers: false,
        masked: false,
        start: || one(NatsFixture::start()),
    },
    Starter {
        driver: "nats",
        backends: &["nats-cluster"],
        server: Some("nats"),
        several_servers: true,
        masked: false,
        start: || one(NatsClusterFixture::start()),
    },
];

/// The server a backend's fixture runs, as its line of [`STARTERS`] names it.
fn server_of(backend: &str) -> Option<&'static str> {
    STARTERS
        .iter()
        .find(|starter| starter.backends.contains(&backend))
        .and_then(|starter| starter.server)
}

/// A backend [`start_enabled`] could not start: its server is not installed (and the run
/// does not require it).
#[derive(Clone, Debug)]
pub struct Missing {
    /// The backend's name, as its fixture would give it.
    pub backend: &'static str,
    /// The server that is missing, as the build script names it.
    pub server: &'static str,
}

/// The fixtures [`start_enabled`] started, and the backends whose server is missing.
#[derive(Default)]
pub struct Enabled {
    /// The started fixtures, in [`STARTERS`] order.
    pub fixtures: Vec<Arc<dyn Fixture>>,
    /// The backends not started for want of their server.
    pub missing: Vec<Missing>,
}

impl std::fmt::Debug for Enabled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let started: Vec<&str> = self.fixtures.iter().map(|fx| fx.backend()).collect();
        f.debug_struct("Enabled")
            .field("fixtures", &started)
            .field("missing", &self.missing)
            .finish()
    }
}

/// Starts the fixtures of every [`STARTERS`] line that this build's dlock has the driver of
/// and `keep` accepts.
///
/// # Errors
///
/// A server could not start, or is required (`DLOCK_TEST_REQUIRE`) and missing.
///
/// # Examples
///
/// ```no_run
/// // The bad-input matrix: each backend once, on one server.
/// let enabled =
///     dlock_testkit::fixture::start_enabled(|starter| !starter.several_servers && !starter.masked)?;
/// for missing in &enabled.missing {
///     eprintln!("{}: {} not installed", missing.backend, missing.server);
/// }
/// # anyhow::Ok(())
/// ```
pub fn start_enabled(keep: impl Fn(&Starter) -> bool) -> anyhow::Result<Enabled> {
    let built = dlock::enabled_backends();
    let mut enabled = Enabled::default();
    for starter in STARTERS
        .iter()
        .filter(|s| built.contains(&s.driver) && keep(s))
    {
        let started = (starter.start)()?;
        match starter.server {
            Some(server) if started.is_empty() => enabled.missing.extend(
                starter
                    .backends
                    .iter()
                    .map(|&backend| Missing { backend, server }),
            ),
            _ => enabled.fixtures.extend(started),
        }
    }
    Ok(enabled)
}

/// Every fixture of this build: [`start_enabled`] keeping every line.
///
/// # Errors
///
/// See [`start_enabled`].
pub fn all_enabled() -> anyhow::Result<Enabled> {
    start_enabled(|_| true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::ServerKind;

    /// `DLOCK_TEST_REQUIRE` names servers: a backend of several servers, or of another
    /// backend's server, is required by its server's name.
    #[test]
    fn a_backend_is_required_by_the_name_of_its_server() {
        assert_eq!(server_of("redlock"), Some("redis"));
        assert_eq!(server_of("etcd-cluster"), Some("etcd"));
        assert_eq!(server_of("zookeeper-ensemble"), Some("zookeeper"));
        assert_eq!(server_of("mariadb-session"), Some("mariadb"));
        assert_eq!(server_of("sqlite"), None);
    }

    /// dlock's build script cannot link the test kit, so it reads the servers from the
    /// `ServerKind` impls' text (`crates/dlock/build/servers.rs`, included here): it must find
    /// the server of every starter, with the binary its `ServerKind` looks for.
    #[test]
    fn the_build_script_finds_the_server_of_every_starter() {
        let folder = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/server");
        let rows = crate::build_servers::read(&folder);
        let binary_of = |name: &str| {
            rows.iter()
                .find(|row| row.name == name)
                .map(|row| row.binary.as_str())
        };
        for server in STARTERS.iter().filter_map(|s| s.server) {
            assert!(
                binary_of(server).is_some(),
                "build.rs finds no server {server}"
            );
        }
        // The parse read the binary the impl names: a sample of kinds (not a list a new server
        // joins; the check above covers every starter's server).
        let kinds: [&dyn ServerKind; 5] = [
            &Redis::default(),
            &Nats,
            &crate::server::Postgres::default(),
            &crate::server::Mariadb::default(),
            &Zookeeper::default(),
        ];
        for kind in kinds {
            assert_eq!(
                binary_of(kind.name()),
                Some(kind.binary()),
                "{}",
                kind.name()
            );
        }
    }
}
