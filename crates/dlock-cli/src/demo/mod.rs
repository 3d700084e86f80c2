//! `dlock demo`: the two scenarios this project grew from, run by many OS processes against any
//! store (tasks of one process on `memory://`), with the outcome checked and measured.
//!
//! The parent prepares the store, starts the workers (this same binary with a hidden
//! `demo worker` subcommand and the parameters as JSON), collects one JSON report per worker
//! from their stdout, and prints the totals. A violated invariant (an oversold item, a job run
//! twice or not at all in a period) makes the exit code non-zero.

mod elected;
mod scheduler;
mod seckill;

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::AsyncReadExt;

use crate::fail;

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    #[command(subcommand)]
    demo: Demo,
}

#[derive(Debug, Subcommand)]
enum Demo {
    /// Flash sale: buyers in many processes buy from a limited stock under a lock; prints sold,
    /// rejected and oversold (must be 0), purchases per second and wait-time percentiles.
    Seckill(seckill::SeckillArgs),
    /// Periodic jobs: processes race to run each job once per period; prints the run log and
    /// each worker's share, and checks that every job ran exactly once per period.
    Scheduler(scheduler::SchedulerArgs),
    /// Leader-elected jobs: processes campaign, the leader alone runs each job once per
    /// period; the leader is killed mid-period and replaced, and the run logs are checked to
    /// hold every job exactly once per period.
    ElectedScheduler(elected::ElectedArgs),
    /// One worker process of a demo (started by the demo itself).
    #[command(hide = true)]
    Worker {
        /// Which demo.
        kind: String,
        /// The worker's parameters as JSON.
        params: String,
    },
}

pub(crate) async fn demo(url: &str, args: DemoArgs) -> i32 {
    let outcome = match args.demo {
        Demo::Seckill(args) => seckill::run(url, args).await,
        Demo::Scheduler(args) => scheduler::run(url, args).await,
        Demo::ElectedScheduler(args) => elected::run(url, args).await,
        Demo::Worker { kind, params } => worker(url, &kind, &params).await.map(|()| true),
    };
    match outcome {
        Ok(true) => 0,
        Ok(false) => crate::exit::FAILED,
        Err(error) => fail(&error),
    }
}

async fn worker(url: &str, kind: &str, params: &str) -> anyhow::Result<()> {
    let locks = dlock::connect(url).await?;
    let report = match kind {
        "seckill" => {
            serde_json::to_string(&seckill::work(&locks, serde_json::from_str(params)?).await?)?
        }
        "scheduler" => {
            serde_json::to_string(&scheduler::work(&locks, serde_json::from_str(params)?).await?)?
        }
        "elected-scheduler" => {
            serde_json::to_string(&elected::work(&locks, serde_json::from_str(params)?).await?)?
        }
        other => bail!("unknown demo worker {other:?}"),
    };
    println!("{report}");
    Ok(())
}

/// The command of one worker process. The URL goes in the environment: on the command line
/// `ps` would show its password to every user of the machine.
fn worker_command(
    exe: &std::path::Path,
    url: &str,
    kind: &str,
    params: &str,
) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(exe);
    command
        .env("DLOCK_URL", url)
        .args(["demo", "worker", kind])
        .arg(params);
    command
}

/// Runs one worker per parameter set: OS processes when the store is shared between processes,
/// tasks of this process otherwise. Returns the workers' reports in order.
async fn run_workers<P, R, F, Fut>(
    url: &str,
    locks: &dlock::Locks,
    kind: &str,
    params: Vec<P>,
    in_process: F,
) -> anyhow::Result<Vec<R>>
where
    P: Serialize + Send + 'static,
    R: DeserializeOwned + Send + 'static,
    F: Fn(dlock::Locks, P) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<R>> + Send + 'static,
{
    if !locks.info().capabilities.cross_process {
        let tasks: Vec<_> = params
            .into_iter()
            .map(|p| tokio::spawn(in_process(locks.clone(), p)))
            .collect();
        let mut reports = Vec::with_capacity(tasks.len());
        for task in tasks {
            reports.push(task.await??);
        }
        return Ok(reports);
    }
    let exe = std::env::current_exe().context("cannot find the dlock binary to start workers")?;
    let mut children = Vec::with_capacity(params.len());
    for p in params {
        let child = worker_command(&exe, url, kind, &serde_json::to_string(&p)?)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("starting a worker process")?;
        children.push(child);
    }
    let mut reports = Vec::with_capacity(children.len());
    for (i, mut child) in children.into_iter().enumerate() {
        let mut out = String::new();
        if let Some(mut stdout) = child.stdout.take() {
            stdout.read_to_string(&mut out).await?;
        }
        let status = child.wait().await?;
        if !status.success() {
            bail!("worker {i} failed ({status})");
        }
        let line = out.lines().last().unwrap_or_default();
        reports.push(
            serde_json::from_str(line).with_context(|| format!("worker {i} reported {out:?}"))?,
        );
    }
    Ok(reports)
}

/// Runs the elected scheduler's workers (processes when the store is shared between processes,
/// tasks otherwise) and, at `kill` (Unix ms, the election's name), SIGKILLs the process that
/// leads then. Returns the killed leader's term and when it was killed (Unix ms).
async fn run_workers_killing_leader(
    url: &str,
    locks: &dlock::Locks,
    params: Vec<elected::Params>,
    kill: Option<(u64, String)>,
) -> anyhow::Result<Option<(u64, u64)>> {
    if !locks.info().capabilities.cross_process {
        let _: Vec<elected::Report> = run_workers(
            url,
            locks,
            "elected-scheduler",
            params,
            |locks, p| async move { elected::work(&locks, p).await },
        )
        .await?;
        return Ok(None);
    }
    let exe = std::env::current_exe().context("cannot find the dlock binary to start workers")?;
    let mut children = Vec::with_capacity(params.len());
    for p in &params {
        let child = worker_command(&exe, url, "elected-scheduler", &serde_json::to_string(p)?)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("starting a worker process")?;
        children.push(child);
    }
    let mut killed = None;
    if let Some((at, election)) = kill {
        tokio::time::sleep(Duration::from_millis(
            at.saturating_sub(scheduler::unix_ms()),
        ))
        .await;
        let leader = loop {
            if let Some(leader) = locks.election(election.as_str()).leader().await? {
                break leader;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let victim = children
            .iter_mut()
            .find(|child| child.id() == Some(leader.owner.pid))
            .context("the leader is none of the workers")?;
        victim.start_kill()?;
        println!(
            "killed the leader (pid {}, term {}) in the middle of a period",
            leader.owner.pid, leader.term
        );
        killed = Some((leader.term.get(), scheduler::unix_ms()));
    }
    for (i, mut child) in children.into_iter().enumerate() {
        let status = child.wait().await?;
        let was_killed = status.code().is_none() && killed.is_some();
        if !status.success() && !was_killed {
            bail!("worker {i} failed ({status})");
        }
    }
    Ok(killed)
}

/// A unique prefix for one demo run, so runs never see each other's state.
fn run_prefix(demo: &str) -> String {
    format!(
        "demo/{demo}/{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

/// The value at `q` (0..=1) of sorted `samples`.
fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (q * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_worker_gets_the_url_in_its_environment_not_its_arguments() {
        let url = "postgres://app:pw-secret@db/locks";
        let command = super::worker_command(std::path::Path::new("dlock"), url, "seckill", "{}");
        let command = command.as_std();
        assert!(
            command
                .get_args()
                .all(|arg| !arg.to_string_lossy().contains("pw-secret")),
            "{command:?}"
        );
        assert!(
            command.get_envs().any(|(key, value)| key == "DLOCK_URL"
                && value.is_some_and(|v| v.to_string_lossy() == url))
        );
    }
}
