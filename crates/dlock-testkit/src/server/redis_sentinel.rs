//! Redis Sentinel for the real-server harness: a primary, a replica and three sentinels, all
//! `redis-server` processes, with failovers on demand (forced, or by killing the primary).

use std::io::{self, BufRead};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::redis::{bulk_body, exchange, expect_ok, remove_snapshot, replication_info};
use super::{Redis, ServerError, ServerKind, ServerProcess, redis_command};

/// The name the sentinels monitor the primary under.
pub const SENTINEL_MASTER: &str = "dlock";

/// How long a change of the set (a failover, a replica catching up) may take.
const SETTLE_DEADLINE: Duration = Duration::from_secs(40);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// One sentinel process watching the primary at `primary_port`: it declares the primary down
/// after 1 s without an answer, and two of three sentinels must agree.
#[derive(Debug, Clone)]
pub struct RedisSentinel {
    /// The port of the primary it monitors at start.
    pub primary_port: u16,
}

impl ServerKind for RedisSentinel {
    // Named as Redis: the same binary, found and required as `redis`.
    fn name(&self) -> &'static str {
        "redis"
    }

    fn binary(&self) -> &'static str {
        "redis-server"
    }

    fn prepare(&self, _bin: &Path, dir: &Path, port: u16) -> io::Result<()> {
        // Sentinel rewrites its config file, so it lives in the data dir.
        let master = SENTINEL_MASTER;
        let config = format!(
            "port {port}\n\
             bind 127.0.0.1\n\
             daemonize no\n\
             dir {dir}\n\
             logfile {log}\n\
             sentinel monitor {master} 127.0.0.1 {primary} 2\n\
             sentinel down-after-milliseconds {master} 1000\n\
             sentinel failover-timeout {master} 3000\n\
             sentinel parallel-syncs {master} 1\n",
            dir = dir.display(),
            log = self.log_path(dir).display(),
            primary = self.primary_port,
        );
        std::fs::write(dir.join("sentinel.conf"), config)
    }

    fn command(&self, bin: &Path, dir: &Path, _port: u16) -> Command {
        let mut cmd = Command::new(bin);
        cmd.arg(dir.join("sentinel.conf")).arg("--sentinel");
        cmd
    }

    fn probe(&self, addr: SocketAddr) -> io::Result<bool> {
        Ok(redis_command(addr, &["PING"])?.starts_with("+PONG"))
    }
}

/// A primary, a replica following it and three sentinels on loopback ports. Clients use
/// [`url`](RedisSentinelSet::url) and find the primary through the sentinels.
///
/// ```no_run
/// use dlock_testkit::server::RedisSentinelSet;
///
/// let mut set = RedisSentinelSet::start()?;
/// let url = set.url(); // redis+sentinel://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/dlock
/// set.fail_over()?;    // the replica is the primary now, the old primary its replica
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct RedisSentinelSet {
    primary: ServerProcess,
    replica: ServerProcess,
    sentinels: Vec<ServerProcess>,
}

impl RedisSentinelSet {
    /// Starts the servers and waits until every sentinel knows the primary, its replica and
    /// the other sentinels (so a failover can happen).
    ///
    /// # Errors
    ///
    /// A server could not start, or the set did not settle in time.
    pub fn start() -> Result<RedisSentinelSet, ServerError> {
        let primary = ServerProcess::start(Redis::default())?;
        let replica = ServerProcess::start(Redis::default())?;
        let port = primary.port().to_string();
        command(replica.addr(), &["REPLICAOF", "127.0.0.1", &port])?;
        let sentinels = (0..3)
            .map(|_| {
                ServerProcess::start(RedisSentinel {
                    primary_port: primary.port(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut set = RedisSentinelSet {
            primary,
            replica,
            sentinels,
        };
        set.settle(false)?;
        Ok(set)
    }

    /// `redis+sentinel://…/dlock` naming the three sentinels.
    pub fn url(&self) -> String {
        let sentinels: Vec<String> = self
            .sentinel_addrs()
            .iter()
            .map(ToString::to_string)
            .collect();
        format!("redis+sentinel://{}/{SENTINEL_MASTER}", sentinels.join(","))
    }

    /// The sentinels' addresses.
    pub fn sentinel_addrs(&self) -> Vec<SocketAddr> {
        self.sentinels.iter().map(ServerProcess::addr).collect()
    }

    /// The server that is primary now.
    pub fn primary(&mut self) -> &mut ServerProcess {
        &mut self.primary
    }

    /// The server that is the replica now.
    pub fn replica(&mut self) -> &mut ServerProcess {
        &mut self.replica
    }

    /// A forced failover (`SENTINEL FAILOVER`): the replica becomes the primary once it has
    /// every write, the old primary its replica. Returns when every sentinel names the new
    /// primary and the old one has caught up with it.
    ///
    /// # Errors
    ///
    /// The sentinels refused, or the set did not settle in time.
    pub fn fail_over(&mut self) -> Result<(), ServerError> {
        command(
            self.sentinels[0].addr(),
            &["SENTINEL", "FAILOVER", SENTINEL_MASTER],
        )?;
        std::mem::swap(&mut self.primary, &mut self.replica);
        self.settle(false)
    }

    /// Kills the primary (SIGKILL): the sentinels notice (after a second), agree and promote
    /// the replica, with whatever it had. The killed server then starts again empty and the
    /// sentinels make it the new primary's replica. Returns when the set has settled.
    ///
    /// # Errors
    ///
    /// A server could not be killed or restarted, or the set did not settle in time.
    pub fn kill_primary(&mut self) -> Result<(), ServerError> {
        self.primary.kill()?;
        std::mem::swap(&mut self.primary, &mut self.replica);
        self.wait_until("the sentinels promoted the replica", |set| {
            set.every_sentinel_names_the_primary() && set.is_primary(set.primary.addr())
        })?;
        // A synced replica keeps its copy in an RDB file: start the old primary empty.
        remove_snapshot(&self.replica)?;
        self.replica.restart()?;
        self.settle(true)
    }

    /// Waits until every sentinel names the primary, knows the replica and the other two
    /// sentinels, and the replica has every write of the primary. After a killed primary
    /// (`either_way`), the sentinels can fail over once more under load (the promoted server
    /// missed its pings for a moment) and promote the restarted one: the set then settles the
    /// other way round, and the roles follow it. Not after a forced failover, where the set
    /// as it was before the failover would pass for that.
    fn settle(&mut self, either_way: bool) -> Result<(), ServerError> {
        let swapped = std::cell::Cell::new(false);
        self.wait_until("the sentinel set settled", |set| {
            if set.settled(false) {
                swapped.set(false);
                true
            } else if either_way && set.settled(true) {
                swapped.set(true);
                true
            } else {
                false
            }
        })?;
        if swapped.get() {
            std::mem::swap(&mut self.primary, &mut self.replica);
        }
        Ok(())
    }

    /// Whether the set has settled with the roles as they are, or `swapped`.
    fn settled(&self, swapped: bool) -> bool {
        let (primary, replica) = if swapped {
            (&self.replica, &self.primary)
        } else {
            (&self.primary, &self.replica)
        };
        self.sentinels
            .iter()
            .all(|s| master_port(s.addr()).is_ok_and(|named| named == Some(primary.port())))
            && self.is_primary(primary.addr())
            && caught_up(primary, replica)
            && self.sentinels.iter().all(|s| {
                sentinel_field(s.addr(), "num-other-sentinels").as_deref() == Some("2")
                    && sentinel_field(s.addr(), "num-slaves").as_deref() == Some("1")
            })
    }

    fn every_sentinel_names_the_primary(&self) -> bool {
        let port = self.primary.port();
        self.sentinels
            .iter()
            .all(|s| master_port(s.addr()).is_ok_and(|named| named == Some(port)))
    }

    fn is_primary(&self, addr: SocketAddr) -> bool {
        replication_info(addr).is_ok_and(|info| info.contains("role:master"))
    }

    fn wait_until(
        &self,
        what: &str,
        done: impl Fn(&RedisSentinelSet) -> bool,
    ) -> Result<(), ServerError> {
        super::redis::wait_until(what, SETTLE_DEADLINE, &self.sentinels[0], || done(self))
    }
}

fn command(addr: SocketAddr, args: &[&str]) -> Result<(), ServerError> {
    expect_ok(addr, args).map_err(|source| ServerError::Io {
        kind: "redis",
        source,
    })
}

/// The primary's port as a sentinel names it (`SENTINEL get-master-addr-by-name`).
fn master_port(sentinel: SocketAddr) -> io::Result<Option<u16>> {
    let (mut reader, line) = exchange(
        sentinel,
        &["SENTINEL", "get-master-addr-by-name", SENTINEL_MASTER],
        COMMAND_TIMEOUT,
    )?;
    if line != "*2" {
        return Ok(None);
    }
    let _host = next_bulk(&mut reader)?;
    let port = next_bulk(&mut reader)?;
    Ok(port.and_then(|port| port.parse().ok()))
}

/// One field of `SENTINEL MASTER dlock` (a flat array of names and values).
fn sentinel_field(sentinel: SocketAddr, field: &str) -> Option<String> {
    let (mut reader, line) = exchange(
        sentinel,
        &["SENTINEL", "MASTER", SENTINEL_MASTER],
        COMMAND_TIMEOUT,
    )
    .ok()?;
    let count: usize = line.strip_prefix('*')?.parse().ok()?;
    let mut values = Vec::with_capacity(count);
    for _ in 0..count {
        values.push(next_bulk(&mut reader).ok()??);
    }
    values
        .chunks(2)
        .find(|pair| pair[0] == field)
        .and_then(|pair| pair.get(1).cloned())
}

fn next_bulk(reader: &mut io::BufReader<std::net::TcpStream>) -> io::Result<Option<String>> {
    let mut line = String::new();
    reader.read_line(&mut line)?;
    bulk_body(reader, line.trim_end())
}

/// Whether `replica` follows `primary` and has acknowledged every write so far.
fn caught_up(primary: &ServerProcess, replica: &ServerProcess) -> bool {
    let synced = replication_info(replica.addr()).is_ok_and(|info| {
        info.contains("master_link_status:up")
            && info.contains(&format!("master_port:{}", primary.port()))
    });
    // `WAIT 1` answers how many replicas acknowledged every write so far.
    synced
        && redis_command(primary.addr(), &["WAIT", "1", "100"])
            .is_ok_and(|reply| reply.strip_prefix(':').is_some_and(|n| n != "0"))
}
