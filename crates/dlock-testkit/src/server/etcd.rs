//! etcd support for the real-server harness: one member, or a cluster of three on loopback.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::{ServerError, ServerKind, ServerProcess, free_port};

/// Connect/read timeout of the readiness probe and of [`etcd_is_leader`].
const PROBE_TIMEOUT: Duration = Duration::from_millis(300);

/// One etcd member: client port from the harness, peer port chosen when the kind is made
/// (kept across restarts, since the member's data dir records it).
///
/// The binary is `etcd` on `PATH`, or the one named by `DLOCK_TEST_ETCD_BIN`. Timing is
/// tuned for tests (heartbeat 50 ms, election timeout 500 ms), so a killed leader is
/// replaced in about a second and the smallest lease is 1 s.
///
/// ```no_run
/// use dlock_testkit::server::{Etcd, ServerProcess};
///
/// let server = ServerProcess::start(Etcd::single()?)?;
/// let url = format!("etcd://{}", server.addr());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Etcd {
    /// Member name (`n1`, `n2`, …).
    pub name: String,
    /// This member's peer port.
    pub peer_port: u16,
    /// `--initial-cluster`: `n1=http://127.0.0.1:P1,…`.
    pub initial_cluster: String,
    /// `--initial-cluster-token`, unique per cluster so that members of two test clusters
    /// never talk to each other.
    pub token: String,
}

impl Etcd {
    /// A single-member cluster.
    ///
    /// # Errors
    ///
    /// No free port for the peer listener.
    pub fn single() -> io::Result<Etcd> {
        let peer_port = free_port()?;
        Ok(Etcd {
            name: "n1".into(),
            peer_port,
            initial_cluster: format!("n1=http://127.0.0.1:{peer_port}"),
            token: unique_token(),
        })
    }
}

fn unique_token() -> String {
    format!("dlock-test-{}", uuid::Uuid::new_v4().simple())
}

impl ServerKind for Etcd {
    fn name(&self) -> &'static str {
        "etcd"
    }

    fn binary(&self) -> &'static str {
        "etcd"
    }

    fn command(&self, bin: &Path, dir: &Path, port: u16) -> Command {
        let client = format!("http://127.0.0.1:{port}");
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut cmd = Command::new(bin);
        cmd.arg("--name")
            .arg(&self.name)
            .arg("--data-dir")
            .arg(dir.join("data"))
            .arg("--listen-client-urls")
            .arg(&client)
            .arg("--advertise-client-urls")
            .arg(&client)
            .arg("--listen-peer-urls")
            .arg(&peer)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer)
            .arg("--initial-cluster")
            .arg(&self.initial_cluster)
            .args(["--initial-cluster-state", "new"])
            .arg("--initial-cluster-token")
            .arg(&self.token)
            .args(["--logger", "zap", "--log-level", "warn"])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"]);
        // The soak (scripts/soak.sh) asks for members that do not flush their log to disk:
        // it has no crash faults, and a flush per Raft entry measures this machine's disk.
        if std::env::var_os("DLOCK_TEST_ETCD_UNSAFE_NO_FSYNC").is_some_and(|v| v == "1") {
            cmd.arg("--unsafe-no-fsync");
        }
        cmd
    }

    fn probe(&self, addr: SocketAddr) -> io::Result<bool> {
        let body = http_get(addr, "/health")?;
        Ok(body.contains("\"health\":\"true\""))
    }
}

/// A plain HTTP/1.0 GET on the client port (etcd serves `/health` and `/metrics` there).
fn http_get(addr: SocketAddr, path: &str) -> io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT)?;
    stream.set_read_timeout(Some(PROBE_TIMEOUT))?;
    stream.set_write_timeout(Some(PROBE_TIMEOUT))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply)?;
    Ok(reply)
}

/// Whether the member on `addr` is the raft leader (its `etcd_server_is_leader` metric).
///
/// # Errors
///
/// The member cannot be reached.
pub fn etcd_is_leader(addr: SocketAddr) -> io::Result<bool> {
    let metrics = http_get(addr, "/metrics")?;
    Ok(metrics
        .lines()
        .any(|line| line.trim() == "etcd_server_is_leader 1"))
}

/// How many gRPC calls of `method` (`LeaseRevoke`, `LeaseGrant`, ...) the member on `addr` has
/// answered since it started, every result code counted (its `grpc_server_handled_total`);
/// for a stream method (`LeaseKeepAlive`) the messages it received on such streams
/// (`grpc_server_msg_received_total`).
///
/// ```no_run
/// use dlock_testkit::server::{Etcd, ServerProcess, etcd_grpc_calls};
///
/// let server = ServerProcess::start(Etcd::single()?)?;
/// assert_eq!(etcd_grpc_calls(server.addr(), "LeaseRevoke")?, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
///
/// The member cannot be reached.
pub fn etcd_grpc_calls(addr: SocketAddr, method: &str) -> io::Result<u64> {
    let metric = if method == "LeaseKeepAlive" || method == "Watch" {
        "grpc_server_msg_received_total{"
    } else {
        "grpc_server_handled_total{"
    };
    let label = format!("grpc_method=\"{method}\"");
    let metrics = http_get(addr, "/metrics")?;
    Ok(metrics
        .lines()
        .filter(|line| line.starts_with(metric) && line.contains(&label))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|count| count as u64)
        .sum())
}

/// Three etcd members on loopback forming one cluster, each a [`ServerProcess`] so faults can
/// be injected per member. All are stopped on drop.
///
/// ```no_run
/// use dlock_testkit::server::EtcdCluster;
///
/// let mut cluster = EtcdCluster::start(3)?;
/// let url = cluster.url();
/// let leader = cluster.leader().expect("a leader");
/// cluster.nodes[leader].kill()?;
/// # Ok::<(), dlock_testkit::server::ServerError>(())
/// ```
#[derive(Debug)]
pub struct EtcdCluster {
    /// The members, in `--initial-cluster` order.
    pub nodes: Vec<ServerProcess>,
}

impl EtcdCluster {
    /// Starts `n` members at once (a member is ready only once a quorum is up, so they cannot
    /// be started one after another).
    ///
    /// # Errors
    ///
    /// A member could not start (or `etcd` is missing: [`ServerError::is_not_found`]).
    pub fn start(n: usize) -> Result<EtcdCluster, ServerError> {
        let peer_ports = (0..n)
            .map(|_| free_port())
            .collect::<io::Result<Vec<u16>>>()
            .map_err(ServerError::io("etcd"))?;
        let initial_cluster = peer_ports
            .iter()
            .enumerate()
            .map(|(i, port)| format!("n{}=http://127.0.0.1:{port}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let token = unique_token();
        let kinds: Vec<Etcd> = peer_ports
            .iter()
            .enumerate()
            .map(|(i, port)| Etcd {
                name: format!("n{}", i + 1),
                peer_port: *port,
                initial_cluster: initial_cluster.clone(),
                token: token.clone(),
            })
            .collect();
        let nodes = ServerProcess::start_all(kinds, "etcd")?;
        Ok(EtcdCluster { nodes })
    }

    /// `etcd://a,b,c` with every member's client address.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.nodes.iter().map(|n| n.addr().to_string()).collect();
        format!("etcd://{}", hosts.join(","))
    }

    /// The index of the current leader among the running members, if one is known.
    pub fn leader(&mut self) -> Option<usize> {
        (0..self.nodes.len()).find(|&i| {
            self.nodes[i].is_running() && etcd_is_leader(self.nodes[i].addr()).unwrap_or(false)
        })
    }
}
