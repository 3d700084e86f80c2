//! What a test can do to a fixture's servers, declared by each fixture: crash them and start
//! them again, freeze them, kill a cluster's leader, bring the store back from an older
//! snapshot, fail over to a replica that missed the last writes. The safety suite reads these
//! declarations instead of knowing how each backend keeps its servers.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use crate::fixture::{
    EtcdClusterFixture, EtcdFixture, FileFixture, Fixture, MemoryFixture, NatsClusterFixture,
    NatsFixture, RedisClusterFixture, RedisFixture, RedisReplicaFixture, RedisSentinelFixture,
    RedlockFixture, SqlFixture, SqlServer, SqliteFixture, ZookeeperEnsembleFixture,
    ZookeeperFixture,
};
use crate::server::{self, ServerProcess};

/// Something done to a fixture's servers; it blocks until done.
pub type Action = Arc<dyn Fn() -> anyhow::Result<()> + Send + Sync>;

/// The kinds of fault a fixture offers, known before it starts (so a suite can list its
/// trials without starting servers). [`Faults::offers`] must agree once it has started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offers {
    /// Holders run in processes of their own, which can be killed or frozen.
    pub holder_processes: bool,
    /// Clients reach the store over TCP, so a fault proxy can reset, delay or cut them off.
    pub proxy: bool,
    /// Every server can be killed and started again on its data.
    pub crash: bool,
    /// Every server can be frozen (SIGSTOP) and thawed.
    pub pause: bool,
    /// A cluster's leader (a minority of Redlock's nodes) can be killed and brought back.
    pub leader_kill: bool,
    /// A cluster's leader can be frozen (SIGSTOP) alone and thawed, the other nodes running.
    pub leader_pause: bool,
    /// A snapshot can be saved, and the store brought back from it after later writes.
    pub snapshot: bool,
    /// A replica can be cut off, and the store failed over to it after later writes.
    pub fail_over: bool,
    /// The slot of a held lock can be migrated to another node (a Redis Cluster's resharding).
    pub slot_move: bool,
    /// Holds live in client sessions of this timeout (ZooKeeper): a client cut off for longer
    /// loses them all when the server expires its session.
    pub sessions: Option<std::time::Duration>,
    /// The server can end its idle client sessions one by one, as an administrator would.
    pub session_kill: bool,
}

/// The faults of a started fixture.
///
/// # Examples
///
/// ```
/// use dlock_testkit::faults::{Faults, Strikable};
/// use dlock_testkit::fixture::SqliteFixture;
///
/// let fixture = SqliteFixture::new()?;
/// let faults = fixture.faults();
/// assert_eq!(faults.offers(), SqliteFixture::OFFERS);
/// assert!(faults.crash.is_none()); // no server to crash
/// # Ok::<(), anyhow::Error>(())
/// ```
#[derive(Clone, Default)]
pub struct Faults {
    /// The addresses clients dial: a fault proxy goes in front of them. Empty where the
    /// store has no server, or where clients must reach every member themselves.
    pub addrs: Vec<SocketAddr>,
    /// Kill every server (SIGKILL).
    pub crash: Option<Action>,
    /// Start every server again, on the same ports and data.
    pub start_again: Option<Action>,
    /// Freeze and thaw every server.
    pub pause: Option<(Action, Action)>,
    /// Kill the leader (or a minority of nodes), and bring it back.
    pub leader_kill: Option<(Action, Action)>,
    /// Freeze the leader alone, and thaw it.
    pub leader_pause: Option<(Action, Action)>,
    /// Save a snapshot; crash and start again from it.
    pub snapshot: Option<(Action, Action)>,
    /// Cut the replica off once it has caught up; kill the primary and fail over to it.
    pub fail_over: Option<(Action, Action)>,
    /// Migrate the slot of a held lock to another node.
    pub slot_move: Option<Action>,
    /// End every idle client session on the server (`pg_terminate_backend`, `KILL`): the
    /// holders' connections between two checks, not a session running a query (a session
    /// lock's watcher, or a waiter waiting inside the server).
    pub session_kill: Option<Action>,
    /// Holders run in processes of their own.
    pub holder_processes: bool,
    /// The session timeout, where holds live in client sessions.
    pub sessions: Option<std::time::Duration>,
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faults")
            .field("addrs", &self.addrs)
            .field("offers", &self.offers())
            .finish()
    }
}

impl Faults {
    /// What these faults offer.
    pub fn offers(&self) -> Offers {
        Offers {
            holder_processes: self.holder_processes,
            proxy: !self.addrs.is_empty(),
            crash: self.crash.is_some() && self.start_again.is_some(),
            pause: self.pause.is_some(),
            leader_kill: self.leader_kill.is_some(),
            leader_pause: self.leader_pause.is_some(),
            snapshot: self.snapshot.is_some(),
            fail_over: self.fail_over.is_some(),
            slot_move: self.slot_move.is_some(),
            sessions: self.sessions,
            session_kill: self.session_kill.is_some(),
        }
    }
}

/// A fixture that declares its faults.
pub trait Strikable: Fixture {
    /// What [`faults`](Strikable::faults) offers once started.
    const OFFERS: Offers;

    /// The fixture's faults, each holding the fixture alive.
    fn faults(self: &Arc<Self>) -> Faults;
}

/// Runs a closure on each server a fault strikes, however the fixture keeps them.
type OnServers = Arc<
    dyn Fn(&mut dyn FnMut(&mut ServerProcess) -> anyhow::Result<()>) -> anyhow::Result<()>
        + Send
        + Sync,
>;

fn on(servers: &OnServers, f: fn(&mut ServerProcess) -> anyhow::Result<()>) -> Action {
    let servers = servers.clone();
    Arc::new(move || servers(&mut |server| f(server)))
}

fn kill(server: &mut ServerProcess) -> anyhow::Result<()> {
    Ok(server.kill()?)
}

fn restart(server: &mut ServerProcess) -> anyhow::Result<()> {
    Ok(server.restart()?)
}

fn pause(server: &mut ServerProcess) -> anyhow::Result<()> {
    Ok(server.pause()?)
}

fn resume(server: &mut ServerProcess) -> anyhow::Result<()> {
    Ok(server.resume()?)
}

fn save_snapshot(server: &mut ServerProcess) -> anyhow::Result<()> {
    Ok(server::save_snapshot(server)?)
}

fn restore_snapshot(server: &mut ServerProcess) -> anyhow::Result<()> {
    Ok(server::restore_snapshot(server)?)
}

/// A store on servers it can crash, restart and freeze, behind `addrs`.
const SERVERS: Offers = Offers {
    holder_processes: true,
    proxy: true,
    crash: true,
    pause: true,
    leader_kill: false,
    leader_pause: false,
    snapshot: false,
    fail_over: false,
    slot_move: false,
    sessions: None,
    session_kill: false,
};

/// A cluster: only its leader is struck; clients dial every member, so no proxy.
const CLUSTER: Offers = Offers {
    holder_processes: true,
    leader_kill: true,
    ..Offers::NONE
};

impl Offers {
    /// Nothing to strike.
    pub const NONE: Offers = Offers {
        holder_processes: false,
        proxy: false,
        crash: false,
        pause: false,
        leader_kill: false,
        leader_pause: false,
        snapshot: false,
        fail_over: false,
        slot_move: false,
        sessions: None,
        session_kill: false,
    };
}

/// The crash, start and freeze of `servers`, behind `addrs`.
fn server_faults(servers: &OnServers, addrs: Vec<SocketAddr>) -> Faults {
    Faults {
        addrs,
        crash: Some(on(servers, kill)),
        start_again: Some(on(servers, restart)),
        pause: Some((on(servers, pause), on(servers, resume))),
        holder_processes: true,
        ..Faults::default()
    }
}

/// Kills the leader a cluster names, and starts that node again.
fn leader_kill(
    leader: impl Fn() -> Option<usize> + Send + Sync + 'static,
    node: impl Fn(usize, fn(&mut ServerProcess) -> anyhow::Result<()>) -> anyhow::Result<()>
    + Send
    + Sync
    + 'static,
) -> (Action, Action) {
    strike_leader(leader, node, kill, restart)
}

/// Does `strike` to the leader a cluster names (waiting up to 30 s for one), and `back` to
/// the same node.
fn strike_leader(
    leader: impl Fn() -> Option<usize> + Send + Sync + 'static,
    node: impl Fn(usize, fn(&mut ServerProcess) -> anyhow::Result<()>) -> anyhow::Result<()>
    + Send
    + Sync
    + 'static,
    strike_node: fn(&mut ServerProcess) -> anyhow::Result<()>,
    back_node: fn(&mut ServerProcess) -> anyhow::Result<()>,
) -> (Action, Action) {
    let killed = Arc::new(Mutex::new(None::<usize>));
    let node = Arc::new(node);
    let (kill_node, k) = (node.clone(), killed.clone());
    let strike: Action = Arc::new(move || {
        let at = std::time::Instant::now();
        let leader = loop {
            if let Some(leader) = leader() {
                break leader;
            }
            anyhow::ensure!(at.elapsed().as_secs() < 30, "no leader after 30 s");
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        kill_node(leader, strike_node)?;
        *k.lock().unwrap_or_else(PoisonError::into_inner) = Some(leader);
        Ok(())
    });
    let back: Action = Arc::new(move || {
        let node_to_start = killed.lock().unwrap_or_else(PoisonError::into_inner).take();
        match node_to_start {
            Some(at) => node(at, back_node),
            None => Ok(()),
        }
    });
    (strike, back)
}

impl Strikable for MemoryFixture {
    const OFFERS: Offers = Offers::NONE;
    fn faults(self: &Arc<Self>) -> Faults {
        Faults::default()
    }
}

impl Strikable for SqliteFixture {
    const OFFERS: Offers = Offers {
        holder_processes: true,
        ..Offers::NONE
    };
    fn faults(self: &Arc<Self>) -> Faults {
        Faults {
            holder_processes: true,
            ..Faults::default()
        }
    }
}

impl Strikable for FileFixture {
    const OFFERS: Offers = Offers {
        holder_processes: true,
        ..Offers::NONE
    };
    fn faults(self: &Arc<Self>) -> Faults {
        Faults {
            holder_processes: true,
            ..Faults::default()
        }
    }
}

/// The one server of a fixture, by its handle.
macro_rules! single_server_faults {
    ($($fixture:ty),*) => {$(
        impl Strikable for $fixture {
            const OFFERS: Offers = SERVERS;
            fn faults(self: &Arc<Self>) -> Faults {
                let fx = self.clone();
                let servers: OnServers = Arc::new(move |f| f(&mut fx.server()));
                server_faults(&servers, vec![self.server().addr()])
            }
        }
    )*};
}

single_server_faults!(EtcdFixture, NatsFixture);

impl Strikable for ZookeeperFixture {
    const OFFERS: Offers = Offers {
        sessions: Some(crate::fixture::ZOOKEEPER_TEST_SESSION),
        ..SERVERS
    };
    fn faults(self: &Arc<Self>) -> Faults {
        let fx = self.clone();
        let servers: OnServers = Arc::new(move |f| f(&mut fx.server()));
        Faults {
            sessions: Some(crate::fixture::ZOOKEEPER_TEST_SESSION),
            ..server_faults(&servers, vec![self.server().addr()])
        }
    }
}

impl Strikable for RedisFixture {
    const OFFERS: Offers = Offers {
        snapshot: true,
        ..SERVERS
    };
    fn faults(self: &Arc<Self>) -> Faults {
        let fx = self.clone();
        let servers: OnServers = Arc::new(move |f| f(&mut fx.server()));
        Faults {
            snapshot: Some((on(&servers, save_snapshot), on(&servers, restore_snapshot))),
            ..server_faults(&servers, vec![self.addr()])
        }
    }
}

impl Strikable for RedisReplicaFixture {
    const OFFERS: Offers = Offers {
        snapshot: true,
        fail_over: true,
        ..SERVERS
    };
    fn faults(self: &Arc<Self>) -> Faults {
        let fx = self.clone();
        let primary: OnServers = Arc::new(move |f| f(fx.server().primary()));
        let (a, b) = (self.clone(), self.clone());
        let detach: Action = Arc::new(move || Ok(a.server().detach_replica()?));
        let fail_over: Action = Arc::new(move || Ok(b.server().fail_over()?));
        Faults {
            snapshot: Some((on(&primary, save_snapshot), on(&primary, restore_snapshot))),
            fail_over: Some((detach, fail_over)),
            ..server_faults(&primary, vec![self.addr()])
        }
    }
}

/// Behind Sentinel the "leader" is the primary: killing it makes the sentinels promote the
/// replica (with what it had); the killed server comes back as the new primary's replica
/// within the same action, so bringing it back does nothing more.
impl Strikable for RedisSentinelFixture {
    const OFFERS: Offers = CLUSTER;
    fn faults(self: &Arc<Self>) -> Faults {
        let fx = self.clone();
        let kill: Action = Arc::new(move || Ok(fx.server().kill_primary()?));
        let back: Action = Arc::new(|| Ok(()));
        Faults {
            leader_kill: Some((kill, back)),
            holder_processes: true,
            ..Faults::default()
        }
    }
}

/// A cluster's "leader" for a lock is the primary of its slot. The fault does not know the
/// lock's name, so it kills the primary holding a key of the safety suite's leader-kill run
/// (`*safety/leader_kill/*`), or the first primary when none is held at that moment; its
/// replica takes over, and the killed node rejoins as a replica within the same action. The
/// slot move migrates the slot of a key of the slot-move run (`*safety/slot_migrated/*`) to
/// another primary, keys and all (`MIGRATE`), as a resharding does.
impl Strikable for RedisClusterFixture {
    const OFFERS: Offers = Offers {
        slot_move: true,
        ..CLUSTER
    };
    fn faults(self: &Arc<Self>) -> Faults {
        let fx = self.clone();
        let kill: Action = Arc::new(move || {
            let mut cluster = fx.server();
            let key = cluster
                .find_key("*safety/leader_kill/*")?
                .unwrap_or_else(|| "any".to_owned());
            Ok(cluster.kill_primary_of(&key)?)
        });
        let back: Action = Arc::new(|| Ok(()));
        let fx = self.clone();
        let slot_move: Action = Arc::new(move || {
            let cluster = fx.server();
            let key = cluster
                .find_key("*safety/slot_migrated/*")?
                .ok_or_else(|| anyhow::anyhow!("no key of the slot-move run to move"))?;
            cluster.move_slot_of(&key)?;
            Ok(())
        });
        Faults {
            leader_kill: Some((kill, back)),
            slot_move: Some(slot_move),
            holder_processes: true,
            ..Faults::default()
        }
    }
}

impl Strikable for RedlockFixture {
    const OFFERS: Offers = Offers {
        snapshot: true,
        leader_kill: true,
        ..SERVERS
    };
    fn faults(self: &Arc<Self>) -> Faults {
        let fx = self.clone();
        let nodes: OnServers = Arc::new(move |f| fx.server().nodes.iter_mut().try_for_each(f));
        // Two of five nodes: a minority, so the quorum stands.
        let fx = self.clone();
        let minority: OnServers =
            Arc::new(move |f| fx.server().nodes[..2].iter_mut().try_for_each(f));
        Faults {
            snapshot: Some((on(&nodes, save_snapshot), on(&nodes, restore_snapshot))),
            leader_kill: Some((on(&minority, kill), on(&minority, restart))),
            ..server_faults(&nodes, self.server().addrs())
        }
    }
}

impl<K: SqlServer + EndsSessions> Strikable for SqlFixture<K> {
    const OFFERS: Offers = Offers {
        session_kill: true,
        ..SERVERS
    };
    fn faults(self: &Arc<Self>) -> Faults {
        let server = self.server().clone();
        let (addr, base) = {
            let server = server.lock().unwrap_or_else(PoisonError::into_inner);
            (server.addr(), K::base_url(&server))
        };
        let servers: OnServers =
            Arc::new(move |f| f(&mut server.lock().unwrap_or_else(PoisonError::into_inner)));
        let kill: Action = Arc::new(move || {
            let ended = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(K::end_idle_sessions(&base))?;
            anyhow::ensure!(ended > 0, "no idle session to end");
            Ok(())
        });
        Faults {
            session_kill: Some(kill),
            ..server_faults(&servers, vec![addr])
        }
    }
}

/// How a SQL server ends its idle client sessions from an admin connection of its own.
pub trait EndsSessions {
    /// Ends every idle client session but the admin's; returns how many.
    fn end_idle_sessions(base_url: &str) -> futures::future::BoxFuture<'_, anyhow::Result<usize>>;
}

impl EndsSessions for server::Postgres {
    fn end_idle_sessions(base_url: &str) -> futures::future::BoxFuture<'_, anyhow::Result<usize>> {
        Box::pin(async move {
            use sqlx::Connection;
            let mut admin = sqlx::PgConnection::connect(base_url).await?;
            let ended: Vec<bool> = sqlx::query_scalar(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE backend_type = 'client backend' AND state = 'idle'
                   AND pid <> pg_backend_pid()",
            )
            .fetch_all(&mut admin)
            .await?;
            Ok(ended.into_iter().filter(|ended| *ended).count())
        })
    }
}

impl EndsSessions for server::Mariadb {
    fn end_idle_sessions(base_url: &str) -> futures::future::BoxFuture<'_, anyhow::Result<usize>> {
        Box::pin(async move {
            use sqlx::Connection;
            let mut admin = sqlx::MySqlConnection::connect(base_url).await?;
            let idle: Vec<i64> = sqlx::query_scalar(
                "SELECT CAST(ID AS SIGNED) FROM information_schema.PROCESSLIST
                 WHERE COMMAND = 'Sleep' AND ID <> CONNECTION_ID()",
            )
            .fetch_all(&mut admin)
            .await?;
            let mut ended = 0;
            for id in idle {
                // Gone meanwhile is fine: it was to end anyway.
                let killed = sqlx::query(sqlx::AssertSqlSafe(format!("KILL {id}")))
                    .execute(&mut admin)
                    .await;
                ended += usize::from(killed.is_ok());
            }
            Ok(ended)
        })
    }
}

/// A cluster's leader, named by its handle, killed and started again.
macro_rules! cluster_faults {
    ($($fixture:ty),*) => {$(
        impl Strikable for $fixture {
            const OFFERS: Offers = CLUSTER;
            fn faults(self: &Arc<Self>) -> Faults {
                let (a, b) = (self.clone(), self.clone());
                Faults {
                    leader_kill: Some(leader_kill(
                        move || a.server().leader(),
                        move |node, f| f(&mut b.server().nodes[node]),
                    )),
                    holder_processes: true,
                    ..Faults::default()
                }
            }
        }
    )*};
}

cluster_faults!(EtcdClusterFixture, ZookeeperEnsembleFixture);

/// A NATS cluster's leader for the locks is the leader of the bucket's stream (every key of
/// the bucket is one Raft group's): killed and started again, or frozen alone and thawed
/// while the two others elect another.
impl Strikable for NatsClusterFixture {
    const OFFERS: Offers = Offers {
        leader_pause: true,
        ..CLUSTER
    };
    fn faults(self: &Arc<Self>) -> Faults {
        let stream = crate::fixture::NATS_TEST_STREAM;
        let strike = |strike_node, back_node| {
            let (a, b) = (self.clone(), self.clone());
            strike_leader(
                move || a.server().stream_leader(stream),
                move |node, f| f(&mut b.server().nodes[node]),
                strike_node,
                back_node,
            )
        };
        Faults {
            leader_kill: Some(strike(kill, restart)),
            leader_pause: Some(strike(pause, resume)),
            holder_processes: true,
            ..Faults::default()
        }
    }
}
