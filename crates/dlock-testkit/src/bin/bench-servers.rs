//! `bench-servers`: starts the stores `scripts/bench.sh` measures, from the test kit, and keeps
//! them up until stdin closes.
//!
//! Prints one line per store, `NAME URL PID…` (the PIDs to pin with `taskset`), then `ready`.
//! Stores whose server is not installed are left out with a note on stderr.
//!
//! ```text
//! bench-servers redis redis-cluster redlock zookeeper postgres mysql etcd nats
//! ```

use std::io::Read;

use dlock_testkit::server::{
    Etcd, Mariadb, Nats, Postgres, Redis, RedisCluster, ServerProcess, Zookeeper,
};

/// Nodes of the Redlock store: the issue's "Redlock over 5 nodes".
const REDLOCK_NODES: usize = 5;

fn pids(servers: &[&ServerProcess]) -> String {
    servers
        .iter()
        .filter_map(|s| s.pid())
        .map(|pid| pid.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

fn main() -> anyhow::Result<()> {
    let mut running: Vec<ServerProcess> = Vec::new();
    for name in std::env::args().skip(1) {
        let started: Result<(String, Vec<ServerProcess>), dlock_testkit::server::ServerError> =
            match name.as_str() {
                "redis" => ServerProcess::start(Redis::default())
                    .map(|s| (format!("redis://{}", s.addr()), vec![s])),
                "redlock" => (0..REDLOCK_NODES)
                    .map(|_| ServerProcess::start(Redis::default()))
                    .collect::<Result<Vec<_>, _>>()
                    .map(|nodes| {
                        let addrs: Vec<String> =
                            nodes.iter().map(|n| n.addr().to_string()).collect();
                        (format!("redlock://{}", addrs.join(",")), nodes)
                    }),
                // Three primaries with a replica each.
                "redis-cluster" => {
                    RedisCluster::start().map(|cluster| (cluster.url(), cluster.nodes))
                }
                "zookeeper" => ServerProcess::start(Zookeeper::default())
                    .map(|s| (format!("zk://{}/bench", s.addr()), vec![s])),
                "postgres" => {
                    ServerProcess::start(Postgres::default()).map(|s| (Postgres::url(&s), vec![s]))
                }
                "mysql" => {
                    ServerProcess::start(Mariadb::default()).map(|s| (Mariadb::url(&s), vec![s]))
                }
                "etcd" => {
                    let kind = Etcd::single()?;
                    ServerProcess::start(kind).map(|s| (format!("etcd://{}", s.addr()), vec![s]))
                }
                "nats" => ServerProcess::start(Nats)
                    .map(|s| (format!("nats://{}/bench", s.addr()), vec![s])),
                other => anyhow::bail!("unknown store {other}"),
            };
        match started {
            Ok((url, servers)) => {
                println!("{name} {url} {}", pids(&servers.iter().collect::<Vec<_>>()));
                running.extend(servers);
            }
            Err(e) if e.is_not_found() => eprintln!("bench-servers: {name} skipped: {e}"),
            Err(e) => return Err(e.into()),
        }
    }
    println!("ready");
    // Serve until the script is done (stdin closes); dropping the servers stops them.
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    drop(running);
    Ok(())
}
