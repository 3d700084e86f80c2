//! Who runs the clients of a scenario: dlock itself, or a peer library through a small
//! command-line protocol, so every library is measured by the same code on the same server.
//!
//! A peer is a command (`--peer 'python3 redis_py.py sync 0.1'`) to which the bench appends:
//!
//! ```text
//! uncontended <pairs>                          prints one pair latency (µs) a line
//! worker <name> <duration_ms> <hold_us>        prints `acquired_ns released_ns waited_ns`
//!                                              a line, one line per hold
//! ```
//!
//! The store's URL is in the environment variable `DLOCK_PEER_URL`, never on the command line,
//! where `ps` would show its credentials to every user of the machine (dlock's own workers get
//! it in `DLOCK_URL` for the same reason).
//!
//! A pair is an acquire and a release of one name, after the peer's own warm-up; a worker
//! takes the name again and again until the duration is over, holding it `hold_us` with a busy
//! loop (sleeping would add timer slack), and times are on the machine's real-time clock.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::process::Command;

/// The client library a scenario measures.
#[derive(Debug, Clone)]
pub(crate) enum Client {
    /// dlock, in this process (uncontended) or as `dlock bench --worker` processes.
    Dlock {
        /// Runtime threads of the worker processes.
        threads: usize,
    },
    /// A peer command speaking the protocol above.
    Peer {
        /// The program and its first arguments.
        command: Vec<String>,
    },
}

impl Client {
    /// The command of one hand-off worker on lock `name`.
    pub(crate) fn worker(
        &self,
        url: &str,
        name: &str,
        duration: Duration,
        hold: Duration,
    ) -> anyhow::Result<Command> {
        let mut command;
        match self {
            Client::Dlock { threads } => {
                command = Command::new(std::env::current_exe().context("current_exe")?);
                command
                    .env("DLOCK_URL", url)
                    .args(["bench", "--worker", name, "--duration"])
                    .arg(format!("{}ms", duration.as_millis()))
                    .arg("--hold")
                    .arg(format!("{}us", hold.as_micros()))
                    .arg("--threads")
                    .arg(threads.to_string());
            }
            Client::Peer { command: peer } => {
                command = peer_command(peer, url)?;
                command
                    .args(["worker", name])
                    .arg(duration.as_millis().to_string())
                    .arg(hold.as_micros().to_string());
            }
        }
        command.stdout(Stdio::piped()).kill_on_drop(true);
        Ok(command)
    }
}

fn peer_command(peer: &[String], url: &str) -> anyhow::Result<Command> {
    let (program, args) = peer.split_first().context("an empty --peer command")?;
    let mut command = Command::new(program);
    command.args(args).env("DLOCK_PEER_URL", url);
    Ok(command)
}

/// One uncontended run of a peer: its pair latencies, µs.
pub(crate) async fn peer_pairs(peer: &[String], url: &str, pairs: u32) -> anyhow::Result<Vec<f64>> {
    let output = peer_command(peer, url)?
        .args(["uncontended"])
        .arg(pairs.to_string())
        .stderr(Stdio::inherit())
        .output()
        .await
        .with_context(|| format!("run peer {peer:?}"))?;
    if !output.status.success() {
        bail!("peer {peer:?} failed: {}", output.status);
    }
    let latencies = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| line.trim().parse::<f64>())
        .collect::<Result<Vec<_>, _>>()
        .context("a peer's pair latency")?;
    if latencies.is_empty() {
        bail!("peer {peer:?} reported no pairs");
    }
    Ok(latencies)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker's URL (and its password) goes through the environment, never the command line.
    #[test]
    fn worker_commands_keep_the_url_off_the_command_line() {
        let url = "redis://user:pw-secret@127.0.0.1:6379";
        let clients = [
            Client::Dlock { threads: 1 },
            Client::Peer {
                command: vec!["python3".into(), "peer.py".into()],
            },
        ];
        for client in clients {
            let command = client
                .worker(url, "lock", Duration::from_secs(1), Duration::ZERO)
                .unwrap();
            let command = command.as_std();
            for arg in command.get_args() {
                assert!(
                    !arg.to_string_lossy().contains("pw-secret"),
                    "{client:?}: {arg:?}"
                );
            }
            let in_env = command
                .get_envs()
                .any(|(_, value)| value.is_some_and(|v| v.to_string_lossy() == url));
            assert!(in_env, "{client:?} does not get the URL in its environment");
        }
    }
}
