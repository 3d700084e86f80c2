//! Redis Cluster for the real-server harness: three primaries and a replica of each, all
//! `redis-server` processes with cluster support, joined by `redis-cli --cluster create`; with a
//! primary killed (its replica promoted) or a slot moved to another primary on demand.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use super::redis::{bulk_body, exchange, expect_ok, remove_snapshot};
use super::{Redis, ServerError, ServerProcess, find_binary, redis_command};

/// How long a change of the cluster (creation, a failover, a slot move) may take.
const SETTLE_DEADLINE: Duration = Duration::from_secs(60);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a node may not answer before the others fail it over.
const NODE_TIMEOUT_MS: &str = "2000";

/// Three primaries with a replica each, on loopback ports. Clients use
/// [`url`](RedisCluster::url).
///
/// ```no_run
/// use dlock_testkit::server::RedisCluster;
///
/// let mut cluster = RedisCluster::start()?;
/// let url = cluster.url(); // redis+cluster://127.0.0.1:P1,127.0.0.1:P2,…
/// cluster.kill_primary_of("dlock:lock:{=jobs}")?; // its replica takes over
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct RedisCluster {
    /// Every node, in start order (the first three were created as primaries).
    pub nodes: Vec<ServerProcess>,
}

impl RedisCluster {
    /// Starts six nodes, joins them (three primaries, one replica each) and waits until every
    /// node serves all slots.
    ///
    /// # Errors
    ///
    /// A server could not start, `redis-cli` is missing or failed, or the cluster did not
    /// settle in time.
    pub fn start() -> Result<RedisCluster, ServerError> {
        let nodes = (0..6)
            .map(|_| {
                ServerProcess::start(Redis {
                    extra_args: [
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        NODE_TIMEOUT_MS,
                    ]
                    .map(String::from)
                    .to_vec(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let cli = find_binary(&RedisCli).ok_or_else(|| ServerError::NotFound {
            kind: "redis",
            binary: "redis-cli (apt-get install redis-tools)".into(),
        })?;
        let output = Command::new(cli)
            .arg("--cluster")
            .arg("create")
            .args(nodes.iter().map(|n| n.addr().to_string()))
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .map_err(|source| ServerError::Io {
                kind: "redis",
                source,
            })?;
        if !output.status.success() {
            return Err(ServerError::StartFailed {
                kind: "redis",
                reason: format!(
                    "redis-cli --cluster create failed: {}",
                    String::from_utf8_lossy(&output.stdout)
                ),
                log_tail: nodes[0].log_tail(20),
            });
        }
        let cluster = RedisCluster { nodes };
        cluster.settle()?;
        Ok(cluster)
    }

    /// `redis+cluster://…` naming every node.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self.nodes.iter().map(|n| n.addr().to_string()).collect();
        format!("redis+cluster://{}", nodes.join(","))
    }

    /// The index in [`nodes`](RedisCluster::nodes) of the primary that serves `key` now.
    ///
    /// # Errors
    ///
    /// No node answered, or none owns the key's slot.
    pub fn primary_of(&self, key: &str) -> Result<usize, ServerError> {
        let slot = self.slot_of(key)?;
        self.owner_of(slot)
    }

    /// The indexes of the nodes that carry `key`'s slot now: its primary first, then the
    /// primary's replicas (a sharded pub/sub message published on the primary reaches its
    /// replicas too, and they accept shard subscriptions).
    ///
    /// # Errors
    ///
    /// No node answered, or none owns the key's slot.
    pub fn shard_of(&self, key: &str) -> Result<Vec<usize>, ServerError> {
        let owner = self.primary_of(key)?;
        let master_port = format!("master_port:{}\r\n", self.nodes[owner].port());
        let replicas = (0..self.nodes.len()).filter(|&i| {
            i != owner
                && info(self.nodes[i].addr(), "INFO", "replication")
                    .is_ok_and(|text| text.contains("role:slave") && text.contains(&master_port))
        });
        Ok(std::iter::once(owner).chain(replicas).collect())
    }

    /// Pauses (SIGSTOP) every replica of the primary that serves `key`, so that shard's
    /// replicas stop acknowledging writes (`WAIT`) while the other shards' go on. Returns
    /// their indexes in [`nodes`](RedisCluster::nodes), for
    /// [`ServerProcess::resume`]; resume them within the node timeout (2 s) or the cluster
    /// marks them failed until they answer again.
    ///
    /// # Errors
    ///
    /// No node answered, the shard has no replica, or one could not be paused.
    pub fn pause_replicas_of(&mut self, key: &str) -> Result<Vec<usize>, ServerError> {
        let replicas = self.shard_of(key)?.split_off(1);
        if replicas.is_empty() {
            return Err(self.failed(&format!("the shard of {key} has no replica")));
        }
        for &replica in &replicas {
            self.nodes[replica].pause()?;
        }
        Ok(replicas)
    }

    /// Kills the primary that serves `key` (SIGKILL): the other nodes notice after the node
    /// timeout and promote its replica, with what it had. The killed node then starts again
    /// empty and rejoins as the new primary's replica. Returns when every node serves every
    /// slot again.
    ///
    /// # Errors
    ///
    /// A node could not be killed or restarted, or the cluster did not settle in time.
    pub fn kill_primary_of(&mut self, key: &str) -> Result<(), ServerError> {
        self.kill_primary_of_cut_off(key, &[])
    }

    /// Cuts the replicas of the primary that serves `key` off from it: pauses them (SIGSTOP)
    /// and has the primary close their replication links, so what it writes from now on
    /// reaches no replica. Returns their indexes, for
    /// [`kill_primary_of_cut_off`](RedisCluster::kill_primary_of_cut_off); call it within the
    /// node timeout (2 s) or the cluster marks the replicas failed.
    ///
    /// # Errors
    ///
    /// No node answered, the shard has no replica, or one could not be paused.
    pub fn cut_off_replicas_of(&mut self, key: &str) -> Result<Vec<usize>, ServerError> {
        let primary = self.nodes[self.primary_of(key)?].addr();
        let replicas = self.pause_replicas_of(key)?;
        let (_, reply) = exchange(
            primary,
            &["CLIENT", "KILL", "TYPE", "replica"],
            COMMAND_TIMEOUT,
        )
        .map_err(io_error)?;
        if !reply.starts_with(':') {
            return Err(self.failed(&format!("CLIENT KILL TYPE replica: {reply}")));
        }
        Ok(replicas)
    }

    /// Kills the primary that serves `key`, then resumes the replicas `cut_off` (from
    /// [`cut_off_replicas_of`](RedisCluster::cut_off_replicas_of)), so one is promoted without
    /// the writes made since it was cut off: a failover that loses them. Otherwise as
    /// [`kill_primary_of`](RedisCluster::kill_primary_of).
    ///
    /// # Errors
    ///
    /// A node could not be killed, resumed or restarted, or the cluster did not settle in time.
    pub fn kill_primary_of_cut_off(
        &mut self,
        key: &str,
        cut_off: &[usize],
    ) -> Result<(), ServerError> {
        let index = self.primary_of(key)?;
        let slot = self.slot_of(key)?;
        self.nodes[index].kill()?;
        for &replica in cut_off {
            self.nodes[replica].resume()?;
        }
        self.wait_until("a replica took over the killed primary's slots", |c| {
            c.owner_of(slot).is_ok_and(|owner| owner != index) && c.all_ok_but(Some(index))
        })?;
        remove_snapshot(&self.nodes[index])?;
        self.nodes[index].restart()?;
        self.settle()
    }

    /// A key matching `pattern` (a `SCAN` pattern) on any primary, if one exists now: for a
    /// fault that must strike the node holding a lock whose name it does not know exactly.
    ///
    /// # Errors
    ///
    /// A primary did not answer.
    pub fn find_key(&self, pattern: &str) -> Result<Option<String>, ServerError> {
        for primary in self.primaries() {
            let addr = self.nodes[primary].addr();
            let mut cursor = "0".to_owned();
            loop {
                let (mut reader, line) = exchange(
                    addr,
                    &["SCAN", &cursor, "MATCH", pattern, "COUNT", "1000"],
                    COMMAND_TIMEOUT,
                )
                .map_err(io_error)?;
                if line != "*2" {
                    return Err(self.failed(&format!("SCAN: {line}")));
                }
                let mut head = String::new();
                std::io::BufRead::read_line(&mut reader, &mut head).map_err(io_error)?;
                cursor = bulk_body(&mut reader, head.trim_end())
                    .map_err(io_error)?
                    .unwrap_or_else(|| "0".into());
                head.clear();
                std::io::BufRead::read_line(&mut reader, &mut head).map_err(io_error)?;
                let count: usize = head.trim_end().trim_start_matches('*').parse().unwrap_or(0);
                for _ in 0..count {
                    head.clear();
                    std::io::BufRead::read_line(&mut reader, &mut head).map_err(io_error)?;
                    if let Some(key) = bulk_body(&mut reader, head.trim_end()).map_err(io_error)? {
                        return Ok(Some(key));
                    }
                }
                if cursor == "0" {
                    break;
                }
            }
        }
        Ok(None)
    }

    /// Moves the slot of `key` (with its keys) to another primary, as a resharding does:
    /// importing and migrating states, `MIGRATE` of each key, then the new owner announced to
    /// every primary. Returns the index of the new owner.
    ///
    /// # Errors
    ///
    /// A command failed, or the cluster did not settle in time.
    pub fn move_slot_of(&self, key: &str) -> Result<usize, ServerError> {
        let slot = self.slot_of(key)?;
        let from = self.owner_of(slot)?;
        let primaries = self.primaries();
        let to = *primaries
            .iter()
            .find(|&&p| p != from)
            .ok_or_else(|| self.failed("no other primary to move a slot to"))?;
        let (from_addr, to_addr) = (self.nodes[from].addr(), self.nodes[to].addr());
        let (from_id, to_id) = (self.node_id(from_addr)?, self.node_id(to_addr)?);
        let slot_text = slot.to_string();
        command(
            to_addr,
            &["CLUSTER", "SETSLOT", &slot_text, "IMPORTING", &from_id],
        )?;
        command(
            from_addr,
            &["CLUSTER", "SETSLOT", &slot_text, "MIGRATING", &to_id],
        )?;
        loop {
            let keys = self.keys_in_slot(from_addr, slot)?;
            if keys.is_empty() {
                break;
            }
            let port = to_addr.port().to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(keys.iter().map(String::as_str));
            let reply = redis_command(from_addr, &args).map_err(io_error)?;
            if !(reply.starts_with("+OK") || reply.starts_with("+NOKEY")) {
                return Err(self.failed(&format!("MIGRATE: {reply}")));
            }
        }
        for primary in self.primaries() {
            command(
                self.nodes[primary].addr(),
                &["CLUSTER", "SETSLOT", &slot_text, "NODE", &to_id],
            )?;
        }
        self.wait_until("every node knows the slot's new owner", |c| {
            c.owner_of(slot).is_ok_and(|owner| owner == to) && c.all_ok_but(None)
        })?;
        Ok(to)
    }

    /// Waits until every node has the cluster state `ok`, knows all six nodes and sees every
    /// slot served, and every replica is in sync.
    fn settle(&self) -> Result<(), ServerError> {
        self.wait_until("the cluster settled", |c| c.all_ok_but(None))
    }

    fn all_ok_but(&self, skip: Option<usize>) -> bool {
        self.nodes.iter().enumerate().all(|(i, node)| {
            Some(i) == skip
                || info(node.addr(), "CLUSTER", "INFO").is_ok_and(|text| {
                    text.contains("cluster_state:ok")
                        && text.contains("cluster_slots_ok:16384")
                        && (skip.is_some() || text.contains("cluster_known_nodes:6"))
                })
        }) && (skip.is_some() || self.replicas_in_sync())
    }

    /// Every node a replica with its link up or one of exactly three primaries. A node
    /// restarted from its `nodes.conf` answers as the primary of its old slots (with none of
    /// their keys) until the others' newer epoch reaches it, so a fourth `role:master` is not
    /// settled: a client whose slot map came from it would write to the empty node.
    fn replicas_in_sync(&self) -> bool {
        let mut masters = 0;
        for node in &self.nodes {
            let Ok(text) = info(node.addr(), "INFO", "replication") else {
                return false;
            };
            if text.contains("role:master") {
                masters += 1;
            } else if !text.contains("master_link_status:up") {
                return false;
            }
        }
        masters == 3 && self.primaries().len() == 3
    }

    /// The indexes of the nodes that are primaries now (serving slots).
    fn primaries(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| {
                info(self.nodes[i].addr(), "INFO", "replication")
                    .is_ok_and(|text| text.contains("role:master"))
                    && self.slots_of(i) > 0
            })
            .collect()
    }

    fn slots_of(&self, index: usize) -> usize {
        let Ok(id) = self.node_id(self.nodes[index].addr()) else {
            return 0;
        };
        self.any_answer("CLUSTER", "NODES")
            .ok()
            .and_then(|nodes| {
                nodes
                    .lines()
                    .find(|line| line.starts_with(&id))
                    .map(|line| line.split(' ').skip(8).count())
            })
            .unwrap_or(0)
    }

    fn slot_of(&self, key: &str) -> Result<u16, ServerError> {
        for node in &self.nodes {
            if let Ok(reply) = redis_command(node.addr(), &["CLUSTER", "KEYSLOT", key])
                && let Some(slot) = reply.strip_prefix(':').and_then(|n| n.parse().ok())
            {
                return Ok(slot);
            }
        }
        Err(self.failed("no node answered CLUSTER KEYSLOT"))
    }

    /// The index of the node that serves `slot`, as the cluster's live nodes agree.
    fn owner_of(&self, slot: u16) -> Result<usize, ServerError> {
        let nodes = self.any_answer("CLUSTER", "NODES")?;
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            if fields.len() < 9 || !fields[2].contains("master") || fields[2].contains("fail") {
                continue;
            }
            let serves = fields[8..].iter().any(|range| {
                let (low, high) = range.split_once('-').unwrap_or((range, range));
                matches!((low.parse::<u16>(), high.parse::<u16>()), (Ok(l), Ok(h)) if l <= slot && slot <= h)
            });
            if serves {
                let port: u16 = fields[1]
                    .split('@')
                    .next()
                    .and_then(|a| a.rsplit_once(':'))
                    .and_then(|(_, p)| p.parse().ok())
                    .unwrap_or(0);
                if let Some(index) = self.nodes.iter().position(|n| n.port() == port) {
                    return Ok(index);
                }
            }
        }
        Err(self.failed(&format!("no live primary serves slot {slot}")))
    }

    fn node_id(&self, addr: SocketAddr) -> Result<String, ServerError> {
        let (mut reader, line) =
            exchange(addr, &["CLUSTER", "MYID"], COMMAND_TIMEOUT).map_err(io_error)?;
        bulk_body(&mut reader, &line)
            .map_err(io_error)?
            .ok_or_else(|| self.failed("CLUSTER MYID: nil"))
    }

    fn keys_in_slot(&self, addr: SocketAddr, slot: u16) -> Result<Vec<String>, ServerError> {
        let slot = slot.to_string();
        let (mut reader, line) = exchange(
            addr,
            &["CLUSTER", "GETKEYSINSLOT", &slot, "100"],
            COMMAND_TIMEOUT,
        )
        .map_err(io_error)?;
        let count: usize = line
            .strip_prefix('*')
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| self.failed(&format!("GETKEYSINSLOT: {line}")))?;
        let mut keys = Vec::with_capacity(count);
        for _ in 0..count {
            let mut head = String::new();
            std::io::BufRead::read_line(&mut reader, &mut head).map_err(io_error)?;
            if let Some(key) = bulk_body(&mut reader, head.trim_end()).map_err(io_error)? {
                keys.push(key);
            }
        }
        Ok(keys)
    }

    /// The text reply of a command from the first node that answers it.
    fn any_answer(&self, a: &str, b: &str) -> Result<String, ServerError> {
        self.nodes
            .iter()
            .find_map(|node| info(node.addr(), a, b).ok())
            .ok_or_else(|| self.failed(&format!("no node answered {a} {b}")))
    }

    fn wait_until(
        &self,
        what: &str,
        done: impl Fn(&RedisCluster) -> bool,
    ) -> Result<(), ServerError> {
        super::redis::wait_until(what, SETTLE_DEADLINE, &self.nodes[0], || done(self))
    }

    fn failed(&self, reason: &str) -> ServerError {
        ServerError::StartFailed {
            kind: "redis",
            reason: reason.to_owned(),
            log_tail: self.nodes[0].log_tail(20),
        }
    }
}

/// `redis-cli`, found like the servers (`DLOCK_TEST_REDIS_CLI_BIN` or `PATH`).
#[derive(Debug)]
struct RedisCli;

impl super::ServerKind for RedisCli {
    fn name(&self) -> &'static str {
        "redis_cli"
    }

    fn binary(&self) -> &'static str {
        "redis-cli"
    }

    fn command(&self, bin: &std::path::Path, _dir: &std::path::Path, _port: u16) -> Command {
        Command::new(bin)
    }

    fn probe(&self, _addr: SocketAddr) -> std::io::Result<bool> {
        Ok(false)
    }
}

/// A bulk-string reply (`CLUSTER INFO`, `CLUSTER NODES`, `INFO replication`).
fn info(addr: SocketAddr, a: &str, b: &str) -> std::io::Result<String> {
    let (mut reader, line) = exchange(addr, &[a, b], COMMAND_TIMEOUT)?;
    bulk_body(&mut reader, &line)?.ok_or_else(|| std::io::Error::other("nil"))
}

fn command(addr: SocketAddr, args: &[&str]) -> Result<(), ServerError> {
    expect_ok(addr, args).map_err(io_error)
}

fn io_error(source: std::io::Error) -> ServerError {
    ServerError::Io {
        kind: "redis",
        source,
    }
}
