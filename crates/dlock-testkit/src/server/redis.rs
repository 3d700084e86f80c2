//! Redis support for the real-server harness.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::{ServerError, ServerKind, ServerProcess};

/// Connect/read timeout of the readiness probe: short, because the harness
/// polls it in a loop and a stopped server must not stall startup.
const PROBE_TIMEOUT: Duration = Duration::from_millis(200);

/// Default timeout of [`redis_command`] and [`redis_get`].
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// A throwaway `redis-server`: no persistence, bound to 127.0.0.1, data and
/// log in the harness temp dir.
///
/// The binary is `redis-server` on `PATH`, or the one named by
/// `DLOCK_TEST_REDIS_BIN`.
///
/// ```no_run
/// use dlock_testkit::server::{Redis, ServerProcess, redis_command};
///
/// let server = ServerProcess::start(Redis::default())?;
/// assert_eq!(redis_command(server.addr(), &["PING"])?, "+PONG");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct Redis {
    /// Extra command-line arguments appended after the harness defaults,
    /// e.g. `["--maxmemory", "10mb"]`.
    pub extra_args: Vec<String>,
}

impl ServerKind for Redis {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn binary(&self) -> &'static str {
        "redis-server"
    }

    fn command(&self, bin: &Path, dir: &Path, port: u16) -> Command {
        let mut cmd = Command::new(bin);
        cmd.arg("--port")
            .arg(port.to_string())
            .args(["--bind", "127.0.0.1"])
            // Empty `save` disables RDB snapshots: a killed server loses its data,
            // which is exactly the failure the lock tests want to provoke.
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .args(["--daemonize", "no"])
            .arg("--logfile")
            .arg(self.log_path(dir))
            .args(&self.extra_args);
        cmd
    }

    fn probe(&self, addr: SocketAddr) -> io::Result<bool> {
        let line = exchange(addr, &["PING"], PROBE_TIMEOUT)?.1;
        // `-NOAUTH` means the server is up and serving, just password-protected
        // (via `extra_args`); `-LOADING` and anything else means "not yet".
        Ok(line.starts_with("+PONG") || line.starts_with("-NOAUTH"))
    }
}

/// A `redis-server` that accepts TLS only, on the harness's port, with the certificate and
/// key given (for example from [`TestCertificates`](crate::tls::TestCertificates)). Clients
/// are not asked for certificates. Its readiness probe is a TCP connect.
///
/// ```no_run
/// use dlock_testkit::server::{RedisTls, ServerProcess};
/// use dlock_testkit::tls::TestCertificates;
///
/// let certs = TestCertificates::generate()?;
/// let server = ServerProcess::start(RedisTls::new(&certs))?;
/// let url = format!("rediss://127.0.0.1:{}?ca={}", server.port(), certs.ca().display());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct RedisTls {
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
}

impl RedisTls {
    /// A TLS server presenting `certs`' server certificate.
    pub fn new(certs: &crate::tls::TestCertificates) -> RedisTls {
        RedisTls {
            cert: certs.cert(),
            key: certs.key(),
        }
    }
}

impl ServerKind for RedisTls {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn binary(&self) -> &'static str {
        "redis-server"
    }

    fn command(&self, bin: &Path, dir: &Path, port: u16) -> Command {
        let mut cmd = Redis::default().command(bin, dir, 0);
        cmd.arg("--tls-port")
            .arg(port.to_string())
            .arg("--tls-cert-file")
            .arg(&self.cert)
            .arg("--tls-key-file")
            .arg(&self.key)
            .args(["--tls-auth-clients", "no"]);
        cmd
    }

    fn probe(&self, addr: SocketAddr) -> io::Result<bool> {
        Ok(TcpStream::connect_timeout(&addr, PROBE_TIMEOUT).is_ok())
    }
}

/// `n` independent Redis servers, e.g. for Redlock tests.
///
/// Each node is a separate [`ServerProcess`], so faults can be injected per
/// node (`nodes[1].pause()`, `nodes[2].kill()`, ...). All are stopped on drop.
///
/// ```no_run
/// use dlock_testkit::server::RedisNodes;
///
/// let mut cluster = RedisNodes::start(3)?;
/// let addrs = cluster.addrs();
/// cluster.nodes[0].kill()?;
/// # Ok::<(), dlock_testkit::server::ServerError>(())
/// ```
#[derive(Debug)]
pub struct RedisNodes {
    /// The running servers, in start order.
    pub nodes: Vec<ServerProcess>,
}

impl RedisNodes {
    /// Starts `n` independent Redis servers with default settings.
    ///
    /// On error, the servers already started are stopped (dropped).
    pub fn start(n: usize) -> Result<Self, ServerError> {
        let nodes = (0..n)
            .map(|_| ServerProcess::start(Redis::default()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { nodes })
    }

    /// Addresses of all nodes, in the same order as [`RedisNodes::nodes`].
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(ServerProcess::addr).collect()
    }
}

/// The file `SAVE` writes in a server's data dir, and the one a starting server loads.
const SNAPSHOT_FILE: &str = "dump.rdb";

/// Writes the server's data to its RDB snapshot now (`SAVE`, Redis's default persistence),
/// for [`restore_snapshot`] to bring back later.
///
/// ```no_run
/// use dlock_testkit::server::{Redis, ServerProcess, redis_command, restore_snapshot, save_snapshot};
///
/// let mut server = ServerProcess::start(Redis::default())?;
/// redis_command(server.addr(), &["SET", "k", "old"])?;
/// save_snapshot(&server)?;
/// redis_command(server.addr(), &["SET", "k", "new"])?;
/// restore_snapshot(&mut server)?; // `k` is "old" again
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
///
/// The server did not answer `+OK`.
pub fn save_snapshot(server: &ServerProcess) -> io::Result<()> {
    expect_ok(server.addr(), &["SAVE"])
}

/// Crashes the server (SIGKILL) and starts it again from its last [`save_snapshot`]: it
/// comes back with the older data, as after a restart from a stale RDB file. The file is
/// then removed, so a later restart starts empty again (the harness default).
///
/// # Errors
///
/// The server could not be restarted, or the file not removed.
pub fn restore_snapshot(server: &mut ServerProcess) -> Result<(), ServerError> {
    server.restart()?;
    remove_snapshot(server)
}

pub(super) fn remove_snapshot(server: &ServerProcess) -> Result<(), ServerError> {
    match std::fs::remove_file(server.dir().join(SNAPSHOT_FILE)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(ServerError::Io {
            kind: "redis",
            source: e,
        }),
        _ => Ok(()),
    }
}

/// How long a replica may take to connect and catch up before the harness gives up.
const REPLICATION_DEADLINE: Duration = Duration::from_secs(20);

/// A primary and a replica that follows it (real Redis replication), behind one stable
/// address: a proxy, as a virtual IP or a Sentinel-aware endpoint looks to clients.
///
/// [`detach_replica`](Self::detach_replica) cuts the replica off once it has caught up, so it
/// lags from then on; [`fail_over`](Self::fail_over) kills the primary and moves the address
/// to the replica, so clients reach a store that missed the last writes. The killed server
/// comes back as the new primary's replica, so the set can fail over again.
///
/// ```no_run
/// use dlock_testkit::server::{RedisReplicaSet, redis_command};
///
/// let mut set = RedisReplicaSet::start()?;
/// redis_command(set.addr(), &["SET", "k", "1"])?;
/// set.detach_replica()?;
/// redis_command(set.addr(), &["SET", "k", "2"])?; // the replica misses this
/// set.fail_over()?;                                 // `k` is "1" at the same address
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct RedisReplicaSet {
    front: crate::fault_proxy::FaultProxy,
    primary: ServerProcess,
    replica: ServerProcess,
}

impl RedisReplicaSet {
    /// Starts a primary and a replica following it, and waits until the replica has synced.
    ///
    /// # Errors
    ///
    /// A server could not start, or the replica did not sync in time.
    pub fn start() -> Result<RedisReplicaSet, ServerError> {
        let primary = ServerProcess::start(Redis::default())?;
        let replica = ServerProcess::start(Redis::default())?;
        let front = crate::fault_proxy::FaultProxy::start(&[primary.addr()]).map_err(|source| {
            ServerError::Io {
                kind: "redis",
                source,
            }
        })?;
        let set = RedisReplicaSet {
            front,
            primary,
            replica,
        };
        set.follow_primary()?;
        Ok(set)
    }

    /// The stable address clients use: the primary's, whichever server that is now.
    pub fn addr(&self) -> SocketAddr {
        self.front.addrs()[0]
    }

    /// The server that is primary now (for faults such as a pause or a restart).
    pub fn primary(&mut self) -> &mut ServerProcess {
        &mut self.primary
    }

    /// Waits until the replica has every write the primary acknowledged so far, then makes it
    /// a primary of its own that nobody writes to: from now on it lags.
    ///
    /// # Errors
    ///
    /// The replica did not catch up in time, or a command failed.
    pub fn detach_replica(&self) -> Result<(), ServerError> {
        self.follow_primary()?;
        self.command(self.replica.addr(), &["REPLICAOF", "NO", "ONE"])
    }

    /// Kills the primary and moves the stable address to the replica (promoted first if it
    /// still follows): clients' open connections are reset and new ones reach the replica,
    /// with the data it had. The killed server starts again empty as the new primary's
    /// replica.
    ///
    /// # Errors
    ///
    /// A server could not be killed, promoted or restarted.
    pub fn fail_over(&mut self) -> Result<(), ServerError> {
        self.primary.kill()?;
        self.command(self.replica.addr(), &["REPLICAOF", "NO", "ONE"])?;
        self.front.redirect(0, self.replica.addr());
        self.front.reset_connections();
        std::mem::swap(&mut self.primary, &mut self.replica);
        // A synced replica keeps its copy in an RDB file: start the old primary empty.
        remove_snapshot(&self.replica)?;
        self.replica.restart()?;
        self.follow_primary()
    }

    /// Makes the replica follow the primary and waits until it has caught up.
    fn follow_primary(&self) -> Result<(), ServerError> {
        let port = self.primary.port().to_string();
        self.command(self.replica.addr(), &["REPLICAOF", "127.0.0.1", &port])?;
        let deadline = std::time::Instant::now() + REPLICATION_DEADLINE;
        loop {
            let synced = replication_info(self.replica.addr())
                .is_ok_and(|info| info.contains("master_link_status:up"));
            // `WAIT 1` answers how many replicas acknowledged every write so far.
            let acked = synced
                && redis_command(self.primary.addr(), &["WAIT", "1", "100"])
                    .is_ok_and(|reply| reply.strip_prefix(':').is_some_and(|n| n != "0"));
            if acked {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                return Err(ServerError::StartFailed {
                    kind: "redis",
                    reason: "the replica did not catch up with the primary".into(),
                    log_tail: self.replica.log_tail(20),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn command(&self, addr: SocketAddr, args: &[&str]) -> Result<(), ServerError> {
        expect_ok(addr, args).map_err(|source| ServerError::Io {
            kind: "redis",
            source,
        })
    }
}

/// Polls `done` until it holds, for up to `within`; then fails naming `what`, with the log tail
/// of `server` (the Redis sets' settling: a failover, a replica catching up, a slot moving).
pub(super) fn wait_until(
    what: &str,
    within: Duration,
    server: &ServerProcess,
    done: impl Fn() -> bool,
) -> Result<(), ServerError> {
    let deadline = std::time::Instant::now() + within;
    while !done() {
        if std::time::Instant::now() > deadline {
            return Err(ServerError::StartFailed {
                kind: "redis",
                reason: format!("timed out waiting until {what}"),
                log_tail: server.log_tail(30),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Polls the Redis server at `addr` until it answers as a primary (`role:master`), and returns
/// when it first did: the moment a failover's promotion took effect, as a client sees it.
///
/// # Errors
///
/// It did not answer as a primary within `within`.
pub fn became_primary(addr: SocketAddr, within: Duration) -> io::Result<std::time::Instant> {
    let deadline = std::time::Instant::now() + within;
    loop {
        if replication_info(addr).is_ok_and(|info| info.contains("role:master")) {
            return Ok(std::time::Instant::now());
        }
        if std::time::Instant::now() >= deadline {
            return Err(io::Error::other(format!(
                "{addr} was not promoted within {within:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `INFO replication`'s text.
pub(super) fn replication_info(addr: SocketAddr) -> io::Result<String> {
    let (mut reader, line) = exchange(addr, &["INFO", "replication"], COMMAND_TIMEOUT)?;
    bulk_body(&mut reader, &line)?.ok_or_else(|| io::Error::other("INFO: nil"))
}

/// Runs a command that must answer `+OK` (`REPLICAOF` may add why: "+OK Already connected…").
pub(super) fn expect_ok(addr: SocketAddr, args: &[&str]) -> io::Result<()> {
    match redis_command(addr, args)? {
        reply if reply.starts_with("+OK") => Ok(()),
        reply => Err(io::Error::other(format!("{}: {reply}", args.join(" ")))),
    }
}

/// Sends one command (as a RESP array) and returns the first reply line,
/// without the trailing CRLF: `+OK`, `:3`, `-ERR ...`, `$5`, `*2`...
///
/// Uses a 5 s connect/read timeout. For the value of a bulk-string reply
/// (e.g. `GET`), use [`redis_get`].
///
/// ```no_run
/// # fn demo(addr: std::net::SocketAddr) -> std::io::Result<()> {
/// use dlock_testkit::server::redis_command;
///
/// assert_eq!(redis_command(addr, &["SET", "k", "v"])?, "+OK");
/// assert_eq!(redis_command(addr, &["DBSIZE"])?, ":1");
/// # Ok(()) }
/// ```
pub fn redis_command(addr: SocketAddr, args: &[&str]) -> io::Result<String> {
    redis_command_with_timeout(addr, args, COMMAND_TIMEOUT)
}

/// Like [`redis_command`], with an explicit connect/read/write timeout.
///
/// A stopped (paused) server still accepts TCP connections (the kernel
/// completes the handshake) but never answers, so this fails with
/// [`io::ErrorKind::WouldBlock`] or [`io::ErrorKind::TimedOut`] once
/// `timeout` elapses.
pub fn redis_command_with_timeout(
    addr: SocketAddr,
    args: &[&str],
    timeout: Duration,
) -> io::Result<String> {
    Ok(exchange(addr, args, timeout)?.1)
}

/// Runs `GET key` and returns the value, `None` for a missing key.
///
/// An error reply (`-...`) becomes an [`io::ErrorKind::Other`] error.
pub fn redis_get(addr: SocketAddr, key: &str) -> io::Result<Option<String>> {
    let (mut reader, line) = exchange(addr, &["GET", key], COMMAND_TIMEOUT)?;
    bulk_body(&mut reader, &line)
}

/// The value of a bulk-string reply whose first line is `line`, `None` for nil.
pub(super) fn bulk_body(
    reader: &mut BufReader<TcpStream>,
    line: &str,
) -> io::Result<Option<String>> {
    let Some(len) = line.strip_prefix('$') else {
        return Err(if line.starts_with('-') {
            io::Error::other(line.to_owned())
        } else {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unexpected reply: {line:?}"),
            )
        });
    };
    let len: i64 = len.parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad bulk length: {line:?}"),
        )
    })?;
    let Ok(len) = usize::try_from(len) else {
        return Ok(None); // `$-1`: nil
    };
    let mut body = vec![0; len + 2]; // payload + CRLF
    reader.read_exact(&mut body)?;
    body.truncate(len);
    Ok(Some(String::from_utf8_lossy(&body).into_owned()))
}

/// Connects, sends `args` as a RESP array and reads the first reply line.
/// Returns the reader too, so callers can consume the rest of the reply.
pub(super) fn exchange(
    addr: SocketAddr,
    args: &[&str],
    timeout: Duration,
) -> io::Result<(BufReader<TcpStream>, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.set_nodelay(true)?;
    stream.write_all(&encode_command(args))?;

    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    reader.read_until(b'\n', &mut line)?;
    if !line.ends_with(b"\n") {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed before a full reply line",
        ));
    }
    let text = String::from_utf8_lossy(&line);
    let text = text.trim_end_matches(['\r', '\n']).to_owned();
    Ok((reader, text))
}

/// RESP encoding of a command: `*N\r\n` then `$len\r\narg\r\n` per argument.
fn encode_command(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::encode_command;

    #[test]
    fn encodes_resp_array() {
        assert_eq!(
            encode_command(&["SET", "k", ""]),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n".to_vec()
        );
    }
}
