#![allow(clippy::expect_used, clippy::unwrap_used)]

//! The safety suite: worker processes take one lock and write through the checker's fenced
//! resource while a fault strikes, on every backend (see RELIABILITY.md for what each fault
//! must and may do, and the figures of the last full run).
//!
//! - `cargo test -p dlock --all-features --test safety` runs the short CI version; the other
//!   trials are listed as ignored.
//! - `DLOCK_SAFETY=full cargo test -p dlock --all-features --test safety` runs every backend
//!   under every fault that applies (several minutes). With `DLOCK_SAFETY_REPORT=FILE` every
//!   run's figures are appended to FILE as well as printed.
//!
//! Trials run one at a time: faults restart and pause the shared servers, and the timings
//! mean more without other trials competing for the CPU.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use dlock_testkit::checker::scenario::{self, Fault, ScenarioReport, Workload};
use dlock_testkit::checker::worker;
use dlock_testkit::fault_proxy::{FaultProxy, NetFault};
use dlock_testkit::fixture::{
    EtcdClusterFixture, EtcdFixture, Fixture, MysqlFixture, PostgresFixture, RedisFixture,
    RedlockFixture, SqliteFixture, ZookeeperEnsembleFixture, ZookeeperFixture,
};
use dlock_testkit::server::{self, ServerProcess};
use libtest_mimic::{Arguments, Failed, Trial};

/// Something done to the servers of a stand.
type Action = Arc<dyn Fn() -> anyhow::Result<()> + Send + Sync>;

/// One backend under test, with what the faults need.
struct Stand {
    /// The URL of the store, without the proxy.
    url: String,
    /// The proxy every worker goes through, and the URL through it.
    proxy: Option<(FaultProxy, String)>,
    /// Kill the server (or all servers).
    kill: Option<Action>,
    /// Start it again (same port, same data).
    start_again: Option<Action>,
    /// Freeze and continue it.
    pause: Option<(Action, Action)>,
    /// Kill the cluster's leader (a minority of Redlock's nodes), and bring it back.
    leader_kill: Option<(Action, Action)>,
    workload: Workload,
    /// How long a holder is frozen: past its lease (and a ZooKeeper session).
    holder_pause: Duration,
    /// A frozen holder loses its lock (a lease); `false` for session locks, held while their
    /// connection lives.
    lease: bool,
    _keep: Box<dyn std::any::Any + Send + Sync>,
}

impl Stand {
    fn worker_url(&self) -> &str {
        self.proxy.as_ref().map_or(&self.url, |(_, url)| url)
    }

    fn proxy(&self) -> Result<&FaultProxy, Failed> {
        self.proxy
            .as_ref()
            .map(|(proxy, _)| proxy)
            .ok_or_else(|| "no proxy on this backend".into())
    }
}

/// A server a fixture shares with the stand's actions.
type SharedServer = Arc<Mutex<ServerProcess>>;

/// Runs a closure on a stand's server(s), however its fixture keeps them.
type WithServer = Arc<
    dyn Fn(&mut dyn FnMut(&mut ServerProcess) -> anyhow::Result<()>) -> anyhow::Result<()>
        + Send
        + Sync,
>;

fn on_server(with: &WithServer, f: fn(&mut ServerProcess) -> anyhow::Result<()>) -> Action {
    let with = with.clone();
    Arc::new(move || with(&mut |server| f(server)))
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

struct ServerStand {
    url: String,
    addrs: Vec<std::net::SocketAddr>,
    with: WithServer,
    workload: Workload,
    holder_pause: Duration,
    lease: bool,
}

impl ServerStand {
    fn build(self, keep: Box<dyn std::any::Any + Send + Sync>) -> anyhow::Result<Stand> {
        let proxy = FaultProxy::start(&self.addrs)?;
        let mut proxied = self.url.clone();
        for (addr, through) in self.addrs.iter().zip(proxy.addrs()) {
            proxied = proxied.replace(&addr.to_string(), &through.to_string());
        }
        Ok(Stand {
            url: self.url,
            proxy: Some((proxy, proxied)),
            kill: Some(on_server(&self.with, kill)),
            start_again: Some(on_server(&self.with, restart)),
            pause: Some((on_server(&self.with, pause), on_server(&self.with, resume))),
            leader_kill: None,
            workload: self.workload,
            holder_pause: self.holder_pause,
            lease: self.lease,
            _keep: keep,
        })
    }
}

const DEFAULT_PAUSE: Duration = Duration::from_secs(3);

fn start(backend: &str) -> anyhow::Result<Stand> {
    let workload = Workload::default();
    match backend {
        "memory" => Ok(Stand {
            url: format!("memory://safety-{}", uuid()),
            proxy: None,
            kill: None,
            start_again: None,
            pause: None,
            leader_kill: None,
            workload: Workload {
                in_process: true,
                ..workload
            },
            holder_pause: DEFAULT_PAUSE,
            lease: true,
            _keep: Box::new(()),
        }),
        "sqlite" => {
            let fixture = SqliteFixture::new()?;
            Ok(Stand {
                url: fixture.url().unwrap(),
                proxy: None,
                kill: None,
                start_again: None,
                pause: None,
                leader_kill: None,
                workload,
                holder_pause: DEFAULT_PAUSE,
                lease: true,
                _keep: Box::new(fixture),
            })
        }
        "redis" => {
            let fixture = RedisFixture::start()?.ok_or_else(missing)?;
            let fx = fixture.clone();
            ServerStand {
                url: fixture.url().unwrap(),
                addrs: vec![fixture.addr()],
                with: Arc::new(move |f| f(&mut fx.server())),
                workload,
                holder_pause: DEFAULT_PAUSE,
                lease: true,
            }
            .build(Box::new(fixture))
        }
        "redlock" => {
            let fixture = RedlockFixture::start(5)?.ok_or_else(missing)?;
            let fx = fixture.clone();
            let mut stand = ServerStand {
                url: fixture.url().unwrap(),
                addrs: fixture.nodes().addrs(),
                with: Arc::new(move |f| fx.nodes().nodes.iter_mut().try_for_each(f)),
                workload,
                holder_pause: DEFAULT_PAUSE,
                lease: true,
            }
            .build(Box::new(fixture.clone()))?;
            // Two of five nodes: a minority, so the quorum stands.
            let minority: WithServer = {
                let fx = fixture.clone();
                Arc::new(move |f| fx.nodes().nodes[..2].iter_mut().try_for_each(f))
            };
            stand.leader_kill = Some((on_server(&minority, kill), on_server(&minority, restart)));
            Ok(stand)
        }
        "postgres" | "postgres-session" | "mariadb" | "mariadb-session" => {
            let fixtures: Vec<(Arc<dyn Fixture>, SharedServer)> = if backend.starts_with("postgres")
            {
                PostgresFixture::start_both()?
                    .into_iter()
                    .map(|f| (f.clone() as Arc<dyn Fixture>, f.server().clone()))
                    .collect()
            } else {
                MysqlFixture::start_both()?
                    .into_iter()
                    .map(|f| (f.clone() as Arc<dyn Fixture>, f.server().clone()))
                    .collect()
            };
            let (fixture, server) = fixtures
                .into_iter()
                .find(|(f, _)| f.backend() == backend)
                .ok_or_else(missing)?;
            let addr = server.lock().unwrap().addr();
            ServerStand {
                url: fixture.url().unwrap(),
                addrs: vec![addr],
                with: Arc::new(move |f| f(&mut server.lock().unwrap())),
                workload,
                holder_pause: DEFAULT_PAUSE,
                lease: !backend.ends_with("session"),
            }
            .build(Box::new(fixture))
        }
        "etcd" => {
            let fixture = EtcdFixture::start()?.ok_or_else(missing)?;
            let fx = fixture.clone();
            let addr = fixture.server().addr();
            ServerStand {
                url: fixture.url().unwrap(),
                addrs: vec![addr],
                with: Arc::new(move |f| f(&mut fx.server())),
                workload,
                holder_pause: DEFAULT_PAUSE,
                lease: true,
            }
            .build(Box::new(fixture))
        }
        "zookeeper" => {
            let fixture = ZookeeperFixture::start()?.ok_or_else(missing)?;
            let fx = fixture.clone();
            let addr = fixture.server().addr();
            // A killed or frozen holder keeps its lock until its session (3 s) expires.
            ServerStand {
                url: fixture.url().to_owned(),
                addrs: vec![addr],
                with: Arc::new(move |f| f(&mut fx.server())),
                workload: Workload {
                    release_within: Duration::from_secs(15),
                    ..workload
                },
                holder_pause: Duration::from_secs(6),
                lease: true,
            }
            .build(Box::new(fixture))
        }
        "etcd-cluster" => {
            let fixture = EtcdClusterFixture::start()?.ok_or_else(missing)?;
            let url = fixture.url().unwrap();
            let killed = Arc::new(Mutex::new(None::<usize>));
            let (fx, k) = (fixture.clone(), killed.clone());
            let kill: Action = Arc::new(move || {
                let leader = wait_for(|| fx.cluster().leader())?;
                fx.cluster().nodes[leader].kill()?;
                *k.lock().unwrap() = Some(leader);
                Ok(())
            });
            let (fx, k) = (fixture.clone(), killed);
            let back: Action = Arc::new(move || {
                if let Some(node) = k.lock().unwrap().take() {
                    fx.cluster().nodes[node].restart()?;
                }
                Ok(())
            });
            Ok(cluster_stand(
                url,
                kill,
                back,
                workload,
                DEFAULT_PAUSE,
                Box::new(fixture),
            ))
        }
        "zookeeper-ensemble" => {
            let fixture = ZookeeperEnsembleFixture::start()?.ok_or_else(missing)?;
            let url = fixture.url().to_owned();
            let killed = Arc::new(Mutex::new(None::<usize>));
            let (fx, k) = (fixture.clone(), killed.clone());
            let kill: Action = Arc::new(move || {
                let leader = wait_for(|| fx.ensemble().leader())?;
                fx.ensemble().nodes[leader].kill()?;
                *k.lock().unwrap() = Some(leader);
                Ok(())
            });
            let (fx, k) = (fixture.clone(), killed);
            let back: Action = Arc::new(move || {
                if let Some(node) = k.lock().unwrap().take() {
                    fx.ensemble().nodes[node].restart()?;
                }
                Ok(())
            });
            Ok(cluster_stand(
                url,
                kill,
                back,
                Workload {
                    release_within: Duration::from_secs(15),
                    ..workload
                },
                Duration::from_secs(6),
                Box::new(fixture),
            ))
        }
        other => anyhow::bail!("unknown backend {other}"),
    }
}

fn cluster_stand(
    url: String,
    kill: Action,
    back: Action,
    workload: Workload,
    holder_pause: Duration,
    keep: Box<dyn std::any::Any + Send + Sync>,
) -> Stand {
    Stand {
        url,
        proxy: None,
        kill: None,
        start_again: None,
        pause: None,
        leader_kill: Some((kill, back)),
        workload,
        holder_pause,
        lease: true,
        _keep: keep,
    }
}

fn missing() -> anyhow::Error {
    anyhow::anyhow!("server not installed")
}

fn wait_for<T>(mut found: impl FnMut() -> Option<T>) -> anyhow::Result<T> {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(value) = found() {
            return Ok(value);
        }
        anyhow::ensure!(Instant::now() < until, "none found within 20 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn uuid() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// The faults of the suite.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FaultKind {
    Baseline,
    HolderKill,
    HolderPause,
    /// The same workload with an unfenced resource: it must show violations.
    HolderPauseCanary,
    ServerKill,
    ServerRestart,
    ServerPause,
    ProxyReset,
    ProxyLatency,
    ProxyBlackhole,
    LeaderKill,
}

impl FaultKind {
    const ALL: [FaultKind; 11] = [
        FaultKind::Baseline,
        FaultKind::HolderKill,
        FaultKind::HolderPause,
        FaultKind::HolderPauseCanary,
        FaultKind::ServerKill,
        FaultKind::ServerRestart,
        FaultKind::ServerPause,
        FaultKind::ProxyReset,
        FaultKind::ProxyLatency,
        FaultKind::ProxyBlackhole,
        FaultKind::LeaderKill,
    ];

    /// A fault of the store or the network rather than of a holder.
    fn strikes_the_store(self) -> bool {
        !matches!(
            self,
            FaultKind::Baseline
                | FaultKind::HolderKill
                | FaultKind::HolderPause
                | FaultKind::HolderPauseCanary
        )
    }

    fn slug(self) -> &'static str {
        match self {
            FaultKind::Baseline => "baseline",
            FaultKind::HolderKill => "holder_sigkill",
            FaultKind::HolderPause => "holder_sigstop_past_ttl",
            FaultKind::HolderPauseCanary => "canary_unfenced_holder_sigstop_shows_violations",
            FaultKind::ServerKill => "server_killed_then_started",
            FaultKind::ServerRestart => "server_restart",
            FaultKind::ServerPause => "server_sigstop",
            FaultKind::ProxyReset => "connections_reset",
            FaultKind::ProxyLatency => "latency_200ms",
            FaultKind::ProxyBlackhole => "blackhole",
            FaultKind::LeaderKill => "leader_kill",
        }
    }
}

/// Backends, whether their server is installed (or `None` for none needed), and which faults
/// apply.
fn applies(backend: &str, fault: FaultKind) -> bool {
    use FaultKind::*;
    match backend {
        // One process: no process to kill or freeze, no server.
        "memory" => fault == Baseline,
        // No server: the holder faults only.
        "sqlite" => matches!(
            fault,
            Baseline | HolderKill | HolderPause | HolderPauseCanary
        ),
        // Session locks are held while their connection lives: a frozen holder keeps its
        // lock, so there is nothing for the canary to show.
        "postgres-session" | "mariadb-session" => fault != HolderPauseCanary && fault != LeaderKill,
        "etcd-cluster" | "zookeeper-ensemble" => {
            matches!(
                fault,
                Baseline | HolderKill | HolderPause | HolderPauseCanary | LeaderKill
            )
        }
        // Redlock's "leader kill" is two of its five nodes.
        "redlock" => true,
        _ => fault != LeaderKill,
    }
}

/// The short CI version: the fence and its canary on the embedded store and on a server,
/// a killed holder, a restarted server and reset connections, and the two faults that found
/// bugs (Redlock fences after every node restarted empty; a ZooKeeper lock left held after a
/// paused server).
fn in_ci(backend: &str, fault: FaultKind) -> bool {
    use FaultKind::*;
    matches!(
        (backend, fault),
        ("memory", Baseline)
            | ("sqlite", HolderPause | HolderPauseCanary)
            | ("redis", HolderKill | ServerRestart | ProxyReset)
            | ("redlock", ServerRestart)
            | ("postgres", HolderPause)
            | ("zookeeper", ServerPause)
    )
}

const BACKENDS: [&str; 12] = [
    "memory",
    "sqlite",
    "redis",
    "redlock",
    "postgres",
    "postgres-session",
    "mariadb",
    "mariadb-session",
    "etcd",
    "etcd-cluster",
    "zookeeper",
    "zookeeper-ensemble",
];

/// Whether the backend's server is installed; a missing one is still tested (and fails)
/// when `DLOCK_TEST_REQUIRE` asks for it.
fn installed(backend: &str) -> bool {
    let (kind, found) = match backend {
        "memory" | "sqlite" => return true,
        "redis" | "redlock" => (
            "redis",
            server::find_binary(&server::Redis::default()).is_some(),
        ),
        b if b.starts_with("postgres") => (
            "postgres",
            server::find_binary(&server::Postgres::default()).is_some(),
        ),
        b if b.starts_with("mariadb") => (
            "mariadb",
            server::find_binary(&server::Mariadb::default()).is_some(),
        ),
        b if b.starts_with("etcd") => (
            "etcd",
            server::Etcd::single().is_ok_and(|etcd| server::find_binary(&etcd).is_some()),
        ),
        _ => ("zookeeper", server::zookeeper_installed()),
    };
    found || server::required(kind)
}

type Stands = Mutex<Vec<(&'static str, Arc<Stand>)>>;

fn stand(backend: &'static str) -> Result<Arc<Stand>, Failed> {
    static STANDS: OnceLock<Stands> = OnceLock::new();
    let stands = STANDS.get_or_init(Stands::default);
    if let Some((_, stand)) = stands.lock().unwrap().iter().find(|(b, _)| *b == backend) {
        return Ok(stand.clone());
    }
    let stand = Arc::new(start(backend).map_err(|e| format!("start {backend}: {e:#}"))?);
    stands.lock().unwrap().push((backend, stand.clone()));
    Ok(stand)
}

fn trial(backend: &'static str, fault: FaultKind) -> Result<(), Failed> {
    let stand = stand(backend)?;
    let fenced = fault != FaultKind::HolderPauseCanary;
    let mut workload = Workload {
        fenced,
        ..stand.workload.clone()
    };
    if full() {
        workload.holds_before *= 3;
        workload.holds_after *= 3;
    }
    if fault.strikes_the_store() {
        // Long holds renewed by the watchdog, so the fault strikes a lease that must be kept
        // (and whose loss must be signalled), not the gap between two short holds.
        workload.watchdog = true;
        workload.hold = Duration::from_millis(1200);
        workload.holds_before = 2;
        workload.holds_after = 2;
    }
    let ttl = workload.ttl;
    let injected = match fault {
        FaultKind::Baseline => Fault::None,
        FaultKind::HolderKill => Fault::HolderKill,
        FaultKind::HolderPause | FaultKind::HolderPauseCanary => {
            Fault::HolderPause(stand.holder_pause)
        }
        FaultKind::ServerKill => {
            let (kill, start_again) = (
                stand.kill.clone().unwrap(),
                stand.start_again.clone().unwrap(),
            );
            Fault::External(
                "server killed, started 2 s later",
                Box::new(move || {
                    kill()?;
                    std::thread::sleep(Duration::from_secs(2));
                    start_again()
                }),
            )
        }
        FaultKind::ServerRestart => {
            let start_again = stand.start_again.clone().unwrap();
            Fault::External("server restart", Box::new(move || start_again()))
        }
        FaultKind::ServerPause => {
            let (pause, resume) = stand.pause.clone().unwrap();
            Fault::External(
                "server SIGSTOP for 2.5 TTL",
                Box::new(move || {
                    pause()?;
                    std::thread::sleep(ttl * 5 / 2);
                    resume()
                }),
            )
        }
        FaultKind::ProxyReset => {
            let stand = stand.clone();
            Fault::External(
                "connections reset",
                Box::new(move || {
                    stand
                        .proxy()
                        .map_err(|e| anyhow::anyhow!("{e:?}"))?
                        .reset_connections();
                    Ok(())
                }),
            )
        }
        FaultKind::ProxyLatency => {
            let stand = stand.clone();
            Fault::External(
                "200 ms latency for 2 s",
                Box::new(move || {
                    let proxy = stand.proxy().map_err(|e| anyhow::anyhow!("{e:?}"))?;
                    proxy.set(NetFault::Latency(Duration::from_millis(200)));
                    std::thread::sleep(Duration::from_secs(2));
                    proxy.set(NetFault::None);
                    Ok(())
                }),
            )
        }
        FaultKind::ProxyBlackhole => {
            let stand = stand.clone();
            Fault::External(
                "blackhole for 2.5 TTL",
                Box::new(move || {
                    let proxy = stand.proxy().map_err(|e| anyhow::anyhow!("{e:?}"))?;
                    proxy.set(NetFault::Blackhole);
                    std::thread::sleep(ttl * 5 / 2);
                    proxy.set(NetFault::None);
                    Ok(())
                }),
            )
        }
        FaultKind::LeaderKill => {
            let (kill, _) = stand.leader_kill.clone().unwrap();
            Fault::External("leader killed", Box::new(move || kill()))
        }
    };
    let name = format!("safety/{}/{}", fault.slug(), uuid());
    let result = scenario::run(stand.worker_url(), &stand.url, &name, &workload, injected);
    if fault == FaultKind::LeaderKill {
        let (_, back) = stand.leader_kill.clone().unwrap();
        back().map_err(|e| format!("bring the killed member back: {e:#}"))?;
    }
    let report = result.map_err(|e| format!("{e:#}"))?;
    record(backend, &report);
    let mut violations = report.violations();
    match fault {
        FaultKind::HolderPause if stand.lease => {
            if report.check.rejected.is_empty() {
                violations.push(
                    "no write of the frozen holder was refused: the fault did not happen".into(),
                );
            }
            if !matches!(report.paused_holder_lost, Some(Some(_))) {
                violations.push("the frozen holder's guard never reported the loss".into());
            }
        }
        // A session lock outlives its holder's freeze: nobody else may get in.
        FaultKind::HolderPause if report.holds_during_pause > 0 => {
            violations.push(format!(
                "{} holds began while the session holder was frozen",
                report.holds_during_pause
            ));
        }
        FaultKind::HolderPauseCanary if report.check.unsafe_writes == 0 => {
            violations.push(
                "canary: without fencing no unsafe write was accepted, so the fault did not happen"
                    .into(),
            );
        }
        _ => {}
    }
    if violations.is_empty() {
        Ok(())
    } else {
        Err(format!("{}\n{}", violations.join("\n"), report.summary()).into())
    }
}

fn record(backend: &str, report: &ScenarioReport) {
    let line = format!("{backend}: {}", report.summary());
    eprintln!("{line}");
    if !report.errors.is_empty() {
        eprintln!("{backend}: first indeterminate errors: {:?}", report.errors);
    }
    if let Some(path) = std::env::var_os("DLOCK_SAFETY_REPORT") {
        use std::io::Write;
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(file, "{line}");
        }
    }
}

fn full() -> bool {
    std::env::var("DLOCK_SAFETY").is_ok_and(|v| v == "full")
}

fn main() {
    worker::run_if_worker();
    let mut args = Arguments::from_args();
    // One at a time: faults restart and pause shared servers.
    args.test_threads = Some(1);
    let full = full();
    let mut trials = Vec::new();
    for backend in BACKENDS {
        let installed = installed(backend);
        for fault in FaultKind::ALL.into_iter().filter(|&f| applies(backend, f)) {
            let name = format!("{backend}::{}", fault.slug());
            let run = full || in_ci(backend, fault);
            let trial = Trial::test(name, move || trial(backend, fault));
            trials.push(match (installed, run) {
                (true, true) => trial,
                (false, _) => trial.with_ignored_flag(true).with_kind("not-installed"),
                (true, false) => trial.with_ignored_flag(true).with_kind("full-only"),
            });
        }
    }
    libtest_mimic::run(&args, trials).exit();
}
