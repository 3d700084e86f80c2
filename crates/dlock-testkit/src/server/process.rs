//! One server as a child process: start on a free loopback port, readiness, logs, pause, resume,
//! kill, restart, and the clean-up when the test process dies.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use super::kind::ServerError;
use super::kind::ServerKind;
use super::kind::binary_hint;
use super::kind::find_binary;
use super::kind::start_timeout_from_env;
use super::port::free_port;

/// Default readiness deadline; `DLOCK_TEST_START_TIMEOUT` (seconds) overrides it.
pub(super) const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the readiness probe is polled.
const PROBE_INTERVAL: Duration = Duration::from_millis(10);
/// Re-spawns on a fresh port when the first choice turned out to be taken.
const PORT_RETRIES: usize = 3;
/// How long [`ServerProcess::restart`] keeps retrying a port still in use.
const RESTART_BIND_WINDOW: Duration = Duration::from_secs(5);
/// Lines of log included in [`ServerError::StartFailed`].
const ERROR_LOG_LINES: usize = 50;
/// File (in the data dir) that receives the child's stdout and stderr.
pub(super) const CONSOLE_LOG: &str = "server.log";

/// A running (or deliberately stopped) test server owned by the test.
///
/// The child runs in its own process group, so signals reach the server's
/// own children too; on Linux it also dies when the test process dies.
/// Dropping it kills the server and deletes the data dir.
#[derive(Debug)]
pub struct ServerProcess {
    kind: Box<dyn ServerKind>,
    bin: PathBuf,
    port: u16,
    start_timeout: Duration,
    /// `None` once the server has been killed and reaped.
    child: Option<Child>,
    // Declared last so the dir is removed only after the child is gone.
    dir: tempfile::TempDir,
}

impl ServerProcess {
    /// Starts a server of `kind` on a free port in a fresh temp dir and waits
    /// until its probe says it is ready.
    ///
    /// The deadline is 30 s, or `DLOCK_TEST_START_TIMEOUT` seconds. If the
    /// port was grabbed by someone else meanwhile, it retries on a new port
    /// (up to 3 times).
    ///
    /// ```no_run
    /// use dlock_testkit::server::{Redis, ServerProcess};
    ///
    /// let server = match ServerProcess::start(Redis::default()) {
    ///     Ok(server) => server,
    ///     Err(e) if e.is_not_found() => return, // not installed: skip
    ///     Err(e) => panic!("{e}"),
    /// };
    /// println!("redis at {}", server.addr());
    /// ```
    pub fn start(kind: impl ServerKind) -> Result<Self, ServerError> {
        Self::start_with_timeout(kind, start_timeout_from_env())
    }

    /// Starts the members of a cluster side by side (each waits for its peers' ports to
    /// answer, so one at a time would not come up); `name` names the server in errors.
    ///
    /// # Errors
    ///
    /// The first member's error, as [`ServerProcess::start`] gives it.
    pub fn start_all<K: ServerKind>(
        kinds: impl IntoIterator<Item = K>,
        name: &'static str,
    ) -> Result<Vec<Self>, ServerError> {
        thread::scope(|scope| {
            let handles: Vec<_> = kinds
                .into_iter()
                .map(|kind| scope.spawn(move || Self::start(kind)))
                .collect();
            handles
                .into_iter()
                .map(|handle| {
                    handle.join().unwrap_or_else(|_| {
                        Err(ServerError::io(name)(io::Error::other(format!(
                            "{name} start thread panicked"
                        ))))
                    })
                })
                .collect()
        })
    }

    /// Like [`ServerProcess::start`] with an explicit readiness deadline
    /// (ignores `DLOCK_TEST_START_TIMEOUT`).
    pub fn start_with_timeout(
        kind: impl ServerKind,
        start_timeout: Duration,
    ) -> Result<Self, ServerError> {
        let kind: Box<dyn ServerKind> = Box::new(kind);
        let name = kind.name();
        let bin = find_binary(kind.as_ref()).ok_or_else(|| ServerError::NotFound {
            kind: name,
            binary: binary_hint(kind.as_ref()),
        })?;

        let mut retries = 0;
        loop {
            // A fresh dir per attempt: `prepare` may have baked the port in.
            let dir = tempfile::Builder::new()
                .prefix(&format!("dlock-{name}-"))
                .tempdir()
                .map_err(ServerError::io(name))?;
            let port = free_port().map_err(ServerError::io(name))?;
            if let Err(e) = kind.prepare(&bin, dir.path(), port) {
                return Err(ServerError::StartFailed {
                    kind: name,
                    reason: format!("prepare failed: {e}"),
                    log_tail: log_tail_of(kind.as_ref(), dir.path(), ERROR_LOG_LINES),
                });
            }
            match launch(kind.as_ref(), &bin, dir.path(), port, start_timeout) {
                Ok(child) => {
                    tracing::info!(
                        kind = name,
                        port,
                        pid = child.id(),
                        dir = %dir.path().display(),
                        "test server started"
                    );
                    return Ok(Self {
                        kind,
                        bin,
                        port,
                        start_timeout,
                        child: Some(child),
                        dir,
                    });
                }
                Err(LaunchError::Io(source)) => return Err(ServerError::Io { kind: name, source }),
                Err(LaunchError::Failed {
                    addr_in_use: true, ..
                }) if retries < PORT_RETRIES => {
                    retries += 1;
                    tracing::warn!(
                        kind = name,
                        port,
                        retries,
                        "port taken, retrying on another"
                    );
                }
                Err(LaunchError::Failed { reason, .. }) => {
                    return Err(ServerError::StartFailed {
                        kind: name,
                        reason,
                        log_tail: log_tail_of(kind.as_ref(), dir.path(), ERROR_LOG_LINES),
                    });
                }
            }
        }
    }

    /// The TCP port the server listens on (stable across [`restart`](Self::restart)).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The server's data dir (removed on drop, kept across kill/restart).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The server binary in use.
    pub fn binary(&self) -> &Path {
        &self.bin
    }

    /// PID of the server (also its process group id), `None` once killed.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// [`ServerKind::name`] of this server, e.g. `"redis"`.
    pub fn kind_name(&self) -> &'static str {
        self.kind.name()
    }

    /// The last `lines` lines of the server log (lossy UTF-8).
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail_of(self.kind.as_ref(), self.dir.path(), lines)
    }

    /// Whether the server process is alive (a paused server counts as running).
    pub fn is_running(&mut self) -> bool {
        let Some(child) = self.child.as_mut() else {
            return false;
        };
        match child.try_wait() {
            Ok(None) => true,
            Ok(Some(status)) => {
                tracing::warn!(kind = self.kind.name(), %status, "test server exited by itself");
                // The leader is reaped; sweep leftover group members right away.
                let _ = signal_group(child.id(), libc::SIGKILL);
                self.child = None;
                false
            }
            Err(e) => {
                tracing::warn!(kind = self.kind.name(), error = %e, "try_wait failed");
                true
            }
        }
    }

    /// Freezes the server (SIGSTOP to its process group): connections hang,
    /// as with a GC pause or a network partition. Undo with [`resume`](Self::resume).
    ///
    /// Returns once every thread of the server has stopped: a stop signal reaches a
    /// multi-threaded process through one of its threads, and on a busy machine the others
    /// can go on answering for a while after `kill` returns (a MariaDB release was answered
    /// "paused" in CI).
    pub fn pause(&mut self) -> Result<(), ServerError> {
        self.signal(libc::SIGSTOP)?;
        let mut pids = vec![self.pid().unwrap_or_default()];
        if self.kind.signals_descendants() {
            pids.extend(descendants(pids[0]));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !pids.iter().all(|&pid| all_threads_stopped(pid)) {
            if Instant::now() >= deadline {
                return Err(ServerError::Io {
                    kind: self.kind.name(),
                    source: io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the server's threads did not all stop within 10s of SIGSTOP",
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Continues a paused server (SIGCONT to its process group).
    pub fn resume(&mut self) -> Result<(), ServerError> {
        self.signal(libc::SIGCONT)
    }

    /// Kills the server (SIGKILL to its process group) and waits for it.
    /// The data dir is kept. Does nothing if it is already stopped.
    pub fn kill(&mut self) -> Result<(), ServerError> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let stragglers = if self.kind.signals_descendants() {
            descendants(child.id())
        } else {
            Vec::new()
        };
        kill_and_reap(&mut child).map_err(ServerError::io(self.kind.name()))?;
        // Children that left the group (PostgreSQL backends) would otherwise outlive the
        // server and keep its shared memory, so a restart could not start.
        for pid in stragglers {
            signal_pid(pid, libc::SIGKILL);
        }
        tracing::info!(
            kind = self.kind.name(),
            port = self.port,
            "test server killed"
        );
        Ok(())
    }

    /// Kills the server if it is running, then starts it again on the same
    /// port and data dir and waits for readiness.
    ///
    /// Retries for a few seconds while the port is still in use. Without
    /// persistence (the Redis default) the data is lost, like after a crash.
    pub fn restart(&mut self) -> Result<(), ServerError> {
        self.kill()?;
        let name = self.kind.name();
        let bind_deadline = Instant::now() + RESTART_BIND_WINDOW;
        loop {
            match launch(
                self.kind.as_ref(),
                &self.bin,
                self.dir.path(),
                self.port,
                self.start_timeout,
            ) {
                Ok(child) => {
                    tracing::info!(
                        kind = name,
                        port = self.port,
                        pid = child.id(),
                        "test server restarted"
                    );
                    self.child = Some(child);
                    return Ok(());
                }
                Err(LaunchError::Io(source)) => return Err(ServerError::Io { kind: name, source }),
                Err(LaunchError::Failed {
                    addr_in_use: true, ..
                }) if Instant::now() < bind_deadline => {
                    tracing::debug!(
                        kind = name,
                        port = self.port,
                        "port still in use, retrying restart"
                    );
                    thread::sleep(Duration::from_millis(100));
                }
                Err(LaunchError::Failed { reason, .. }) => {
                    return Err(ServerError::StartFailed {
                        kind: name,
                        reason: format!("restart on port {}: {reason}", self.port),
                        log_tail: self.log_tail(ERROR_LOG_LINES),
                    });
                }
            }
        }
    }

    fn signal(&mut self, sig: libc::c_int) -> Result<(), ServerError> {
        let name = self.kind.name();
        if !self.is_running() {
            return Err(ServerError::Io {
                kind: name,
                source: io::Error::new(io::ErrorKind::NotConnected, "server is not running"),
            });
        }
        let pid = self.pid().unwrap_or_default();
        // Descendants first when pausing, so none is still answering when the leader stops.
        if self.kind.signals_descendants() {
            for child in descendants(pid) {
                signal_pid(child, sig);
            }
        }
        signal_group(pid, sig).map_err(ServerError::io(name))
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let (Some(sig), Some(child)) = (self.kind.stop_signal(), self.child.as_mut()) {
            // A paused server cannot act on the stop signal.
            if self.kind.signals_descendants() {
                for pid in descendants(child.id()) {
                    signal_pid(pid, libc::SIGCONT);
                }
            }
            let _ = signal_group(child.id(), libc::SIGCONT);
            signal_pid(child.id(), sig);
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                match child.try_wait() {
                    Ok(Some(_)) | Err(_) => {
                        self.child = None;
                        break;
                    }
                    Ok(None) => thread::sleep(Duration::from_millis(10)),
                }
            }
        }
        if let Some(mut child) = self.child.take()
            && let Err(e) = kill_and_reap(&mut child)
        {
            tracing::warn!(kind = self.kind.name(), error = %e, "failed to stop test server");
        }
        // `self.dir` (TempDir) removes the data dir after this.
    }
}

/// Why one spawn-and-wait attempt failed.
enum LaunchError {
    /// The harness itself failed (log file, spawn...).
    Io(io::Error),
    /// The server exited or never became ready; the child is already reaped.
    Failed { reason: String, addr_in_use: bool },
}

impl From<io::Error> for LaunchError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

/// Spawns the server once on `port` and polls its probe until ready.
/// On failure the child (and its group) is killed and reaped.
fn launch(
    kind: &dyn ServerKind,
    bin: &Path,
    dir: &Path,
    port: u16,
    timeout: Duration,
) -> Result<Child, LaunchError> {
    let console = dir.join(CONSOLE_LOG);
    let logs = log_files(kind, dir);
    // Only log lines written by this attempt count for "address in use":
    // after a restart the log still holds the previous runs.
    let offsets: Vec<u64> = logs.iter().map(|p| file_len(p)).collect();

    let out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&console)?;
    let err = out.try_clone()?;
    let mut cmd = kind.command(bin, dir, port);
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        // Own group, so killpg reaches the server's children and the test
        // process's group is never hit.
        .process_group(0);
    die_with_parent(&mut cmd);
    let mut child = spawn_from_long_lived_thread(cmd)
        .map_err(|e| io::Error::new(e.kind(), format!("spawning {}: {e}", bin.display())))?;
    tracing::debug!(
        kind = kind.name(),
        port,
        pid = child.id(),
        "spawned test server"
    );

    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let deadline = Instant::now() + timeout;
    let mut last_probe = String::from("not probed");
    let reason = loop {
        if let Some(status) = child.try_wait()? {
            // Sweep any children the leader left behind.
            let _ = signal_group(child.id(), libc::SIGKILL);
            break format!("exited during startup with {status} (last probe: {last_probe})");
        }
        match kind.probe(addr) {
            // A probe may be answered by a stranger that grabbed the port;
            // make sure our server is still alive before declaring it ready.
            Ok(true) if child.try_wait()?.is_none() => return Ok(child),
            Ok(true) => continue,
            Ok(false) => last_probe = "server not ready".to_owned(),
            Err(e) => last_probe = e.to_string(),
        }
        if Instant::now() >= deadline {
            kill_and_reap(&mut child)?;
            break format!("not ready after {timeout:?} (last probe: {last_probe})");
        }
        thread::sleep(PROBE_INTERVAL);
    };
    let addr_in_use = logs
        .iter()
        .zip(offsets)
        .any(|(path, offset)| mentions_addr_in_use(&read_from(path, offset)));
    Err(LaunchError::Failed {
        reason,
        addr_in_use,
    })
}

/// The killed instance still holds what the new one needs: its port, or (PostgreSQL) the
/// shared memory its backends keep until they notice the postmaster is gone, which takes
/// longer on a loaded machine. Either passes within the restart window.
fn mentions_addr_in_use(log: &str) -> bool {
    let log = log.to_ascii_lowercase();
    [
        "address already in use",
        "address in use",
        "eaddrinuse",
        "pre-existing shared memory block",
    ]
    .iter()
    .any(|needle| log.contains(needle))
}

/// SIGKILLs the child's group and reaps the child.
fn kill_and_reap(child: &mut Child) -> io::Result<()> {
    if child.try_wait()?.is_none() {
        match signal_group(child.id(), libc::SIGKILL) {
            Ok(()) => {}
            // Raced with the server exiting on its own.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            Err(e) => return Err(e),
        }
    }
    child.wait().map(drop)
}

/// The log files of a server: the kind's own log, plus the console log when
/// that is a different file.
fn log_files(kind: &dyn ServerKind, dir: &Path) -> Vec<PathBuf> {
    let own = kind.log_path(dir);
    let console = dir.join(CONSOLE_LOG);
    if own == console {
        vec![own]
    } else {
        vec![own, console]
    }
}

fn log_tail_of(kind: &dyn ServerKind, dir: &Path, lines: usize) -> String {
    let files = log_files(kind, dir);
    let multiple = files.len() > 1;
    let mut out = String::new();
    for path in files {
        let text = read_from(&path, 0);
        if text.is_empty() {
            continue;
        }
        if multiple {
            out.push_str(&format!("==> {} <==\n", path.display()));
        }
        out.push_str(&last_lines(&text, lines));
    }
    out
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(n);
    let mut out = lines[start..].join("\n");
    if !out.is_empty() {
        out.push('\n');
    }
    out
}

fn file_len(path: &Path) -> u64 {
    fs::metadata(path).map_or(0, |m| m.len())
}

/// The file's content from `offset` on (lossy UTF-8; empty if unreadable).
fn read_from(path: &Path, offset: u64) -> String {
    let mut bytes = Vec::new();
    let read = File::open(path).and_then(|mut f| {
        f.seek(SeekFrom::Start(offset))?;
        f.read_to_end(&mut bytes)
    });
    match read {
        Ok(_) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(_) => String::new(),
    }
}

/// Spawns `cmd` from one long-lived helper thread.
///
/// Linux delivers `PR_SET_PDEATHSIG` when the parent *thread* exits, not the
/// process. Spawning from the caller's thread would kill the server as soon
/// as that thread ends (a test thread handing a server to a shared fixture,
/// a runtime's blocking-pool thread going idle...). The helper thread lives
/// as long as the process, so servers die with the process, as intended.
fn spawn_from_long_lived_thread(mut cmd: Command) -> io::Result<Child> {
    type Job = (Command, mpsc::Sender<io::Result<Child>>);
    static SPAWNER: OnceLock<Option<mpsc::Sender<Job>>> = OnceLock::new();

    let spawner = SPAWNER.get_or_init(|| {
        let (jobs, queue) = mpsc::channel::<Job>();
        let started = thread::Builder::new()
            .name("dlock-server-spawner".to_owned())
            .spawn(move || {
                for (mut cmd, reply) in queue {
                    let _ = reply.send(cmd.spawn());
                }
            });
        match started {
            Ok(_) => Some(jobs),
            Err(e) => {
                tracing::warn!(error = %e, "no spawner thread; spawning from the caller's thread");
                None
            }
        }
    });
    let Some(jobs) = spawner else {
        return cmd.spawn();
    };
    let (reply, result) = mpsc::channel();
    jobs.send((cmd, reply))
        .map_err(|_| io::Error::other("server spawner thread is gone"))?;
    result
        .recv()
        .map_err(|_| io::Error::other("server spawner thread is gone"))?
}

/// Makes the server die with the test process (Linux `PR_SET_PDEATHSIG`).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn die_with_parent(cmd: &mut Command) {
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec, where only
    // async-signal-safe calls are allowed: it calls prctl and getppid and
    // builds io::Errors from raw OS codes, which does not allocate.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl; then no signal would ever come.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// No parent-death signal outside Linux: Drop is the only cleanup there.
#[cfg(not(target_os = "linux"))]
fn die_with_parent(_cmd: &mut Command) {}

/// Every live descendant of `pid` (children, their children, …), read from `/proc`.
fn descendants(pid: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut parent_of = Vec::new();
    for entry in entries.flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`: comm may contain spaces, so parse after the last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            parent_of.push((child, ppid));
        }
    }
    let mut found = Vec::new();
    let mut frontier = vec![pid];
    while let Some(parent) = frontier.pop() {
        for &(child, ppid) in &parent_of {
            if ppid == parent && !found.contains(&child) {
                found.push(child);
                frontier.push(child);
            }
        }
    }
    found
}

/// Whether every thread of `pid` is stopped (or gone): `/proc/PID/task/TID/stat` state `T`
/// (stopped), `t` (traced), `Z` or `X` (exited).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().all(|task| {
        let Ok(stat) = fs::read_to_string(task.path().join("stat")) else {
            return true;
        };
        // `tid (comm) state …`: comm may contain spaces, so read after the last ')'.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        matches!(state, None | Some("T" | "t" | "Z" | "X"))
    })
}

/// Sends `sig` to one process, ignoring errors (it may have exited already).
#[allow(unsafe_code)]
fn signal_pid(pid: u32, sig: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    if pid > 1 {
        // SAFETY: kill takes plain integers; the pid is a descendant of our child that was
        // alive when /proc was read (at worst the signal misses).
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// Sends `sig` to the process group `pgid` (our children are group leaders,
/// so their pid is the pgid).
#[allow(unsafe_code)]
fn signal_group(pgid: u32, sig: libc::c_int) -> io::Result<()> {
    let pgid = libc::pid_t::try_from(pgid)
        .ok()
        // 0 would mean our own group and 1 init: never valid for a child.
        .filter(|&pgid| pgid > 1)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "invalid process group id"))?;
    // SAFETY: killpg takes plain integers and has no memory-safety
    // preconditions; pgid is a child we have not reaped yet, so the id
    // cannot have been reused by an unrelated process group.
    let rc = unsafe { libc::killpg(pgid, sig) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    // Real-server tests (no mocks). The ones that need redis-server skip
    // when it is missing, unless DLOCK_TEST_REQUIRE asks for it.
    use super::*;
    use crate::server::*;
    use std::net::{SocketAddr, TcpStream};
    use std::path::Path;
    use std::process::Command;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    fn redis_available() -> bool {
        if find_binary(&Redis::default()).is_some() {
            return true;
        }
        assert!(
            !required("redis"),
            "redis-server not found, but DLOCK_TEST_REQUIRE requires redis"
        );
        eprintln!("skipping: redis-server not found (set DLOCK_TEST_REDIS_BIN or add it to PATH)");
        false
    }

    fn start_redis() -> ServerProcess {
        ServerProcess::start(Redis::default()).unwrap_or_else(|e| panic!("{e}"))
    }

    fn refuses_connections(addr: SocketAddr) -> bool {
        TcpStream::connect_timeout(&addr, Duration::from_millis(500))
            .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
    }

    /// Runs `sh -c SCRIPT`; never becomes ready (probe always false).
    #[derive(Debug)]
    struct Shell {
        name: &'static str,
        script: &'static str,
    }

    impl ServerKind for Shell {
        fn name(&self) -> &'static str {
            self.name
        }
        fn binary(&self) -> &'static str {
            "sh"
        }
        fn command(&self, bin: &Path, _dir: &Path, _port: u16) -> Command {
            let mut cmd = Command::new(bin);
            cmd.args(["-c", self.script]);
            cmd
        }
        fn probe(&self, _addr: SocketAddr) -> std::io::Result<bool> {
            Ok(false)
        }
    }

    #[test]
    fn redis_starts_and_answers_ping() {
        if !redis_available() {
            return;
        }
        let server = start_redis();
        assert_eq!(server.kind_name(), "redis");
        assert!(Redis::default().probe(server.addr()).unwrap());
        assert_eq!(redis_command(server.addr(), &["PING"]).unwrap(), "+PONG");
        assert_eq!(
            redis_command(server.addr(), &["SET", "k", "v"]).unwrap(),
            "+OK"
        );
        assert_eq!(redis_get(server.addr(), "k").unwrap().as_deref(), Some("v"));
        assert_eq!(redis_get(server.addr(), "missing").unwrap(), None);
        assert_eq!(redis_command(server.addr(), &["DBSIZE"]).unwrap(), ":1");
        assert!(server.log_tail(50).contains("Ready to accept connections"));
    }

    #[test]
    fn two_servers_get_different_ports() {
        if !redis_available() {
            return;
        }
        let nodes = RedisNodes::start(2).unwrap();
        let addrs = nodes.addrs();
        assert_eq!(addrs.len(), 2);
        assert_ne!(addrs[0].port(), addrs[1].port());
        assert_ne!(nodes.nodes[0].dir(), nodes.nodes[1].dir());
        for addr in addrs {
            assert_eq!(redis_command(addr, &["PING"]).unwrap(), "+PONG");
        }
    }

    #[test]
    fn pause_hangs_and_resume_answers_again() {
        if !redis_available() {
            return;
        }
        let mut server = start_redis();
        server.pause().unwrap();
        let pid = server.pid().unwrap();
        assert!(
            all_threads_stopped(pid),
            "pause() returned while a thread of the server still ran"
        );
        let err = redis_command_with_timeout(server.addr(), &["PING"], Duration::from_millis(300))
            .unwrap_err();
        assert!(
            matches!(
                err.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "{err:?}"
        );
        assert!(server.is_running(), "a paused server is still running");
        server.resume().unwrap();
        let reply =
            redis_command_with_timeout(server.addr(), &["PING"], Duration::from_secs(5)).unwrap();
        assert_eq!(reply, "+PONG");
    }

    #[test]
    fn kill_stops_the_server_and_frees_the_port() {
        if !redis_available() {
            return;
        }
        let mut server = start_redis();
        server.kill().unwrap();
        assert!(!server.is_running());
        assert_eq!(server.pid(), None);
        assert!(refuses_connections(server.addr()));
        assert!(server.dir().exists(), "kill keeps the data dir");
        server.kill().unwrap(); // idempotent
        assert!(server.pause().is_err(), "cannot pause a killed server");
    }

    #[test]
    fn restart_comes_back_on_the_same_port() {
        if !redis_available() {
            return;
        }
        let mut server = start_redis();
        let port = server.port();
        let old_pid = server.pid();
        redis_command(server.addr(), &["SET", "k", "v"]).unwrap();

        server.restart().unwrap();
        assert_eq!(server.port(), port);
        assert!(server.is_running());
        assert_ne!(server.pid(), old_pid);
        assert_eq!(redis_command(server.addr(), &["PING"]).unwrap(), "+PONG");
        // No persistence: a restart loses the data, like a crash.
        assert_eq!(redis_command(server.addr(), &["DBSIZE"]).unwrap(), ":0");

        // Restart of a killed server works too.
        server.kill().unwrap();
        server.restart().unwrap();
        assert_eq!(server.port(), port);
        assert_eq!(redis_command(server.addr(), &["PING"]).unwrap(), "+PONG");
    }

    #[test]
    fn drop_kills_the_server_and_removes_the_dir() {
        if !redis_available() {
            return;
        }
        let server = start_redis();
        let pid = server.pid().unwrap();
        let dir = server.dir().to_path_buf();
        let addr = server.addr();
        assert!(Path::new(&format!("/proc/{pid}")).exists());
        drop(server);
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
        assert!(!dir.exists());
        assert!(refuses_connections(addr));
    }

    #[test]
    fn paused_server_is_killed_on_drop() {
        if !redis_available() {
            return;
        }
        let mut server = start_redis();
        let pid = server.pid().unwrap();
        server.pause().unwrap();
        drop(server);
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
    }

    #[test]
    fn server_survives_the_thread_that_started_it() {
        // PR_SET_PDEATHSIG fires when the parent *thread* exits; the harness
        // spawns from a long-lived thread so this must not kill the server.
        if !redis_available() {
            return;
        }
        let server = std::thread::spawn(start_redis).join().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(redis_command(server.addr(), &["PING"]).unwrap(), "+PONG");
    }

    #[test]
    fn missing_binary_is_not_found() {
        #[derive(Debug)]
        struct Missing;
        impl ServerKind for Missing {
            fn name(&self) -> &'static str {
                "dlock-missing"
            }
            fn binary(&self) -> &'static str {
                "dlock-no-such-server-binary"
            }
            fn command(&self, bin: &Path, _dir: &Path, _port: u16) -> Command {
                Command::new(bin)
            }
            fn probe(&self, _addr: SocketAddr) -> std::io::Result<bool> {
                Ok(false)
            }
        }
        let err = ServerProcess::start(Missing).unwrap_err();
        assert!(err.is_not_found(), "{err:?}");
        assert!(matches!(
            &err,
            ServerError::NotFound { kind: "dlock-missing", binary } if binary == "dlock-no-such-server-binary"
        ));
        assert!(
            err.to_string().contains("DLOCK_TEST_DLOCK_MISSING_BIN"),
            "{err}"
        );
    }

    #[test]
    fn early_exit_is_start_failed_with_log_tail() {
        let kind = Shell {
            name: "boom",
            script: "echo boom >&2; exit 3",
        };
        let err = ServerProcess::start(kind).unwrap_err();
        let ServerError::StartFailed {
            kind,
            reason,
            log_tail,
        } = &err
        else {
            panic!("expected StartFailed, got {err:?}");
        };
        assert_eq!(*kind, "boom");
        assert!(reason.contains("exit status: 3"), "{reason}");
        assert!(log_tail.contains("boom"), "{log_tail}");
        assert!(err.to_string().trim_end().ends_with("boom"), "{err}");
        assert!(!err.is_not_found());
    }

    #[test]
    fn never_ready_times_out_and_kills_the_server() {
        let kind = Shell {
            name: "sleeper",
            script: "echo started; exec sleep 30",
        };
        let started = std::time::Instant::now();
        let err = ServerProcess::start_with_timeout(kind, Duration::from_millis(300)).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(10));
        let ServerError::StartFailed {
            reason, log_tail, ..
        } = &err
        else {
            panic!("expected StartFailed, got {err:?}");
        };
        assert!(reason.contains("not ready"), "{reason}");
        assert!(log_tail.contains("started"), "{log_tail}");
    }

    /// Claims "address already in use" on the first spawns, then runs.
    #[derive(Debug)]
    struct FlakyPort {
        spawns: Arc<AtomicUsize>,
        fail_first: usize,
    }

    impl ServerKind for FlakyPort {
        fn name(&self) -> &'static str {
            "flaky-port"
        }
        fn binary(&self) -> &'static str {
            "sh"
        }
        fn command(&self, bin: &Path, _dir: &Path, _port: u16) -> Command {
            let n = self.spawns.fetch_add(1, Ordering::SeqCst);
            let script = if n < self.fail_first {
                "echo 'bind: Address already in use' >&2; exit 1"
            } else {
                "exec sleep 30"
            };
            let mut cmd = Command::new(bin);
            cmd.args(["-c", script]);
            cmd
        }
        fn probe(&self, _addr: SocketAddr) -> std::io::Result<bool> {
            Ok(self.spawns.load(Ordering::SeqCst) > self.fail_first)
        }
    }

    #[test]
    fn address_in_use_retries_on_a_new_port() {
        let spawns = Arc::new(AtomicUsize::new(0));
        let kind = FlakyPort {
            spawns: Arc::clone(&spawns),
            fail_first: 2,
        };
        let mut server = ServerProcess::start(kind).unwrap();
        assert!(server.is_running());
        assert_eq!(spawns.load(Ordering::SeqCst), 3);

        // Give up after 3 re-spawns.
        let spawns = Arc::new(AtomicUsize::new(0));
        let kind = FlakyPort {
            spawns: Arc::clone(&spawns),
            fail_first: 100,
        };
        let err = ServerProcess::start(kind).unwrap_err();
        assert!(matches!(err, ServerError::StartFailed { .. }), "{err:?}");
        assert_eq!(spawns.load(Ordering::SeqCst), 4);
    }

    #[test]
    fn require_env_parsing() {
        // Only reads the env: the tests never set DLOCK_TEST_REQUIRE themselves.
        match std::env::var("DLOCK_TEST_REQUIRE") {
            Err(_) => assert!(!required("redis")),
            Ok(v) if v.trim() == "all" => assert!(required("redis") && required("etcd")),
            Ok(_) => {}
        }
    }
}
