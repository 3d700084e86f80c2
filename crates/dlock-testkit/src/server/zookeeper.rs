//! ZooKeeper support for the real-server harness: a standalone server and a 3-node ensemble,
//! from Debian's `zookeeper` package (the JVM runs `zookeeper.jar` from `/usr/share/java`).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use super::{ServerError, ServerKind, ServerProcess, free_port};

/// Connect/read timeout of the readiness probe and of [`four_letter`].
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// Where Debian puts the server's jar; its manifest `Class-Path` names every dependency by
/// absolute path, so it cannot be copied elsewhere. `DLOCK_TEST_ZOOKEEPER_JAR` overrides it.
const DEFAULT_JAR: &str = "/usr/share/java/zookeeper.jar";
/// An slf4j binding, so the server logs to stderr (without one it logs nothing).
const SLF4J_SIMPLE: &str = "/usr/share/java/slf4j-simple.jar";

/// The server jar in use.
pub fn zookeeper_jar() -> PathBuf {
    std::env::var_os("DLOCK_TEST_ZOOKEEPER_JAR")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_JAR), PathBuf::from)
}

/// Whether the server jar is installed (the JVM is looked up as the kind's binary).
pub fn zookeeper_installed() -> bool {
    zookeeper_jar().is_file()
}

/// A standalone ZooKeeper server: tick 500 ms (sessions of 1 to 10 s), no admin server, every
/// four-letter word allowed, container nodes checked every 100 ms (so empty lock directories
/// vanish quickly in tests).
///
/// ```no_run
/// use dlock_testkit::server::{ServerProcess, Zookeeper, four_letter};
///
/// let server = ServerProcess::start(Zookeeper::default())?;
/// assert!(four_letter(server.addr(), "srvr")?.contains("Mode: standalone"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct Zookeeper {
    /// Ensemble membership: `None` for a standalone server.
    member: Option<Member>,
}

#[derive(Debug, Clone)]
struct Member {
    myid: usize,
    /// `(peer, election)` ports of every member, by myid − 1.
    peers: Arc<Vec<(u16, u16)>>,
}

impl ServerKind for Zookeeper {
    fn name(&self) -> &'static str {
        "zookeeper"
    }

    fn binary(&self) -> &'static str {
        "java"
    }

    fn prepare(&self, _bin: &Path, dir: &Path, port: u16) -> io::Result<()> {
        if !zookeeper_installed() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{} not found (apt-get install zookeeper)",
                    zookeeper_jar().display()
                ),
            ));
        }
        let data = dir.join("data");
        std::fs::create_dir_all(&data)?;
        let mut cfg = format!(
            "tickTime=500\ninitLimit=10\nsyncLimit=5\ndataDir={}\nclientPort={port}\n\
             clientPortAddress=127.0.0.1\nadmin.enableServer=false\n4lw.commands.whitelist=*\n\
             maxClientCnxns=0\n",
            data.display()
        );
        if let Some(member) = &self.member {
            std::fs::write(data.join("myid"), format!("{}\n", member.myid))?;
            for (i, (peer, election)) in member.peers.iter().enumerate() {
                cfg.push_str(&format!("server.{}=127.0.0.1:{peer}:{election}\n", i + 1));
            }
        }
        std::fs::write(dir.join("zoo.cfg"), cfg)
    }

    fn command(&self, bin: &Path, dir: &Path, _port: u16) -> Command {
        let mut cmd = Command::new(bin);
        cmd.args(["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"])
            .arg("-Dznode.container.checkIntervalMs=100")
            .arg("-Dznode.container.maxPerMinute=100000")
            .arg("-cp")
            .arg(format!("{}:{SLF4J_SIMPLE}", zookeeper_jar().display()))
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(dir.join("zoo.cfg"));
        cmd
    }

    /// `srvr` answers `Mode: …` only once the server serves requests (`ruok` says `imok`
    /// earlier, while it still refuses them).
    fn probe(&self, addr: SocketAddr) -> io::Result<bool> {
        Ok(four_letter(addr, "srvr")?.contains("Mode: "))
    }

    fn search_dirs(&self) -> Vec<PathBuf> {
        vec![PathBuf::from("/usr/lib/jvm/default-java/bin")]
    }

    fn stop_signal(&self) -> Option<libc::c_int> {
        // The JVM exits 143 on SIGTERM: a clean stop.
        Some(libc::SIGTERM)
    }
}

/// Sends a four-letter word (`srvr`, `mntr`, `cons`, …) and returns the whole reply.
///
/// ```no_run
/// # fn demo(addr: std::net::SocketAddr) -> std::io::Result<()> {
/// let mode = dlock_testkit::server::four_letter(addr, "srvr")?;
/// # Ok(()) }
/// ```
pub fn four_letter(addr: SocketAddr, word: &str) -> io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT)?;
    stream.set_read_timeout(Some(PROBE_TIMEOUT))?;
    stream.set_write_timeout(Some(PROBE_TIMEOUT))?;
    stream.write_all(word.as_bytes())?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply)?;
    Ok(reply)
}

/// Three ZooKeeper servers forming one ensemble on loopback ports, each its own
/// [`ServerProcess`] (so one can be killed, paused or restarted).
///
/// ```no_run
/// use dlock_testkit::server::ZookeeperEnsemble;
///
/// let mut ensemble = ZookeeperEnsemble::start()?;
/// let connect = ensemble.connect_string();
/// let leader = ensemble.leader().expect("a leader");
/// ensemble.nodes[leader].kill()?;
/// # Ok::<(), dlock_testkit::server::ServerError>(())
/// ```
#[derive(Debug)]
pub struct ZookeeperEnsemble {
    /// The members, by myid − 1.
    pub nodes: Vec<ServerProcess>,
}

impl ZookeeperEnsemble {
    /// Starts three members at once (each is ready only when a quorum has formed) and waits
    /// until all serve.
    pub fn start() -> Result<ZookeeperEnsemble, ServerError> {
        let io = |e: io::Error| ServerError::Io {
            kind: "zookeeper",
            source: e,
        };
        let mut peers = Vec::new();
        for _ in 0..3 {
            peers.push((free_port().map_err(io)?, free_port().map_err(io)?));
        }
        let peers = Arc::new(peers);
        let starting: Vec<_> = (1..=3)
            .map(|myid| {
                let kind = Zookeeper {
                    member: Some(Member {
                        myid,
                        peers: peers.clone(),
                    }),
                };
                std::thread::spawn(move || ServerProcess::start(kind))
            })
            .collect();
        let mut nodes = Vec::new();
        let mut failure = None;
        for handle in starting {
            match handle.join() {
                Ok(Ok(node)) => nodes.push(node),
                Ok(Err(e)) => failure = failure.or(Some(e)),
                Err(_) => {
                    failure = failure.or(Some(io(io::Error::other("start thread panicked"))));
                }
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(ZookeeperEnsemble { nodes }),
        }
    }

    /// `127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3`.
    pub fn connect_string(&self) -> String {
        self.nodes
            .iter()
            .map(|n| n.addr().to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The index (myid − 1) of the member that is leader now, by `srvr`.
    pub fn leader(&self) -> Option<usize> {
        self.nodes.iter().position(|n| {
            four_letter(n.addr(), "srvr").is_ok_and(|reply| reply.contains("Mode: leader"))
        })
    }
}
