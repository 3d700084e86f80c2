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
    let Some(len) = line.strip_prefix('$') else {
        return Err(if line.starts_with('-') {
            io::Error::other(line)
        } else {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unexpected reply to GET: {line:?}"),
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
fn exchange(
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
