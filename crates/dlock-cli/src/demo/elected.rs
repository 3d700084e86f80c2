//! `dlock demo elected-scheduler`: the workers campaign in one election, and only the leader
//! runs the jobs, each once per period, under `run_while_held` (a deposed leader stops at
//! once). Each run is one compare-and-set on the job's log (`<prefix>/job-N/log`: the periods
//! run, each with the worker and the term that ran it), refused when a later term has already
//! written there: the run and its record are one write, fenced by the term. The parent kills
//! the leader in the middle of a period (`--kill-leader-at`); the next leader catches up on
//! what was not run. The check reads the logs: every period of every job exactly once, in
//! order, terms never going back.

use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use serde::{Deserialize, Serialize};

use super::run_prefix;
use super::scheduler::unix_ms;

#[derive(Debug, Args)]
pub(crate) struct ElectedArgs {
    /// Worker processes campaigning (tasks on memory://).
    #[arg(long, default_value_t = 3)]
    workers: u32,
    /// Jobs the leader runs once per period.
    #[arg(long, default_value_t = 5)]
    jobs: u32,
    /// Length of a period.
    #[arg(long, default_value = "1s", value_parser = crate::parse_duration)]
    period: Duration,
    /// How many periods to run.
    #[arg(long, default_value_t = 6)]
    periods: u32,
    /// The leader's lease (the watchdog's): a killed leader is replaced within it.
    #[arg(long, default_value = "1s", value_parser = crate::parse_duration)]
    lease: Duration,
    /// In the middle of this period the parent SIGKILLs the leader (not on memory://, whose
    /// workers are tasks).
    #[arg(long, default_value_t = 2)]
    kill_leader_at: u32,
    /// Kill nobody.
    #[arg(long)]
    no_kill: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Params {
    prefix: String,
    worker: u32,
    jobs: u32,
    periods: u32,
    period_ms: u64,
    lease_ms: u64,
    /// Unix ms when period 0 starts.
    start_ms: u64,
}

impl Params {
    fn end_ms(&self) -> u64 {
        self.start_ms + u64::from(self.periods) * self.period_ms
    }
}

/// What a worker reports: the terms it led.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct Report {
    terms: Vec<u64>,
}

/// One run in a job's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    period: u32,
    worker: u32,
    term: u64,
    /// When it ran (Unix ms).
    at_ms: u64,
}

fn log_name(prefix: &str, job: u32) -> String {
    format!("{prefix}/job-{job}/log")
}

fn election_name(prefix: &str) -> String {
    format!("{prefix}/leader")
}

async fn read_log(value: &dlock::VersionedValue) -> anyhow::Result<(Vec<Entry>, Option<u64>)> {
    Ok(match value.get().await? {
        Some(read) => (serde_json::from_slice(&read.value)?, Some(read.version)),
        None => (Vec::new(), None),
    })
}

/// Runs `job` for every period up to `due` not run yet, as the leader of `term`: each run is
/// the job's work, then one compare-and-set of its log, refused once a later term has written.
async fn run_due(
    locks: &dlock::Locks,
    p: &Params,
    job: u32,
    due: u32,
    term: u64,
) -> anyhow::Result<()> {
    let log = locks.value(log_name(&p.prefix, job));
    loop {
        let (mut entries, version) = read_log(&log).await?;
        let next = entries.last().map_or(0, |e| e.period + 1);
        if next > due {
            return Ok(());
        }
        if let Some(later) = entries.last().filter(|e| e.term > term) {
            bail!("term {term} deposed: term {} ran job {job}", later.term);
        }
        // The job's own work: together the jobs take half a period, so a kill early in a
        // period lands in the middle of the runs.
        tokio::time::sleep(Duration::from_millis(p.period_ms / u64::from(p.jobs * 2))).await;
        entries.push(Entry {
            period: next,
            worker: p.worker,
            term,
            at_ms: unix_ms(),
        });
        // A lost race only means the log moved: read it again.
        log.compare_and_set(version, serde_json::to_vec(&entries)?)
            .await?;
    }
}

/// The leader's loop: at each period, every job is brought up to it.
async fn lead(locks: &dlock::Locks, p: &Params, term: u64) -> anyhow::Result<()> {
    loop {
        let now = unix_ms();
        if now >= p.end_ms() {
            return Ok(());
        }
        let current = u32::try_from(now.saturating_sub(p.start_ms) / p.period_ms)?;
        for job in 0..p.jobs {
            run_due(locks, p, job, current, term).await?;
        }
        let next = p.start_ms + u64::from(current + 1) * p.period_ms;
        tokio::time::sleep(Duration::from_millis(next.saturating_sub(unix_ms()))).await;
    }
}

pub(super) async fn work(locks: &dlock::Locks, p: Params) -> anyhow::Result<Report> {
    let locks = locks.with_watchdog_lease(Duration::from_millis(p.lease_ms))?;
    let mut report = Report::default();
    loop {
        let left = Duration::from_millis(p.end_ms().saturating_sub(unix_ms()));
        if left.is_zero() {
            return Ok(report);
        }
        let election = locks.election(election_name(&p.prefix)).wait(left);
        let leading = match election.campaign(p.worker.to_string()).await {
            Ok(leading) => leading,
            Err(dlock::Error::Timeout { .. }) => return Ok(report),
            Err(error) => return Err(error.into()),
        };
        let term = leading.term().get();
        report.terms.push(term);
        match dlock::run_while_held(&leading, lead(&locks, &p, term)).await {
            Ok(led) => {
                led?;
                let _ = leading.resign().await;
                return Ok(report);
            }
            // Deposed: the task was dropped; campaign again.
            Err(dlock::Error::Lost { .. }) => continue,
            Err(error) => return Err(error.into()),
        }
    }
}

pub(super) async fn run(url: &str, args: ElectedArgs) -> anyhow::Result<bool> {
    if args.workers == 0 || args.jobs == 0 || args.periods == 0 {
        bail!("--workers, --jobs and --periods must be at least 1");
    }
    if args.period < Duration::from_millis(100) || args.lease < dlock::limits::MIN_TTL {
        bail!("--period must be at least 100ms and --lease at least 10ms");
    }
    let locks = dlock::connect(url).await?;
    let prefix = run_prefix("elected-scheduler");
    let period_ms = u64::try_from(args.period.as_millis()).context("--period is too long")?;
    let lease_ms = u64::try_from(args.lease.as_millis()).context("--lease is too long")?;
    let start_ms = unix_ms() + 500;
    let params: Vec<Params> = (0..args.workers)
        .map(|worker| Params {
            prefix: prefix.clone(),
            worker,
            jobs: args.jobs,
            periods: args.periods,
            period_ms,
            lease_ms,
            start_ms,
        })
        .collect();
    let kill = (!args.no_kill
        && args.kill_leader_at < args.periods
        && locks.info().capabilities.cross_process)
        .then(|| start_ms + u64::from(args.kill_leader_at) * period_ms + period_ms / 4);
    println!(
        "elected scheduler on {}: {} workers, {} jobs, {} periods of {:?}, lease {:?}",
        locks.info().name,
        args.workers,
        args.jobs,
        args.periods,
        args.period,
        args.lease
    );
    let killed = super::run_workers_killing_leader(
        url,
        &locks,
        params,
        kill.map(|at| (at, election_name(&prefix))),
    )
    .await?;
    check(&locks, &prefix, &args, killed).await
}

/// Reads every job's log and checks it: each period exactly once, in order, terms never
/// going back, and after a kill a later term took over.
async fn check(
    locks: &dlock::Locks,
    prefix: &str,
    args: &ElectedArgs,
    killed: Option<(u64, u64)>,
) -> anyhow::Result<bool> {
    let mut ok = true;
    let mut terms = std::collections::BTreeSet::new();
    let mut all = Vec::new();
    println!("run log (job: period/worker/term …):");
    for job in 0..args.jobs {
        let (entries, _) = read_log(&locks.value(log_name(prefix, job))).await?;
        let line: Vec<String> = entries
            .iter()
            .map(|e| format!("{}/{}/{}", e.period, e.worker, e.term))
            .collect();
        println!("  job {job:>3}: {}", line.join(" "));
        let periods: Vec<u32> = entries.iter().map(|e| e.period).collect();
        if periods != (0..args.periods).collect::<Vec<_>>() {
            println!(
                "VIOLATION: job {job} ran in periods {periods:?}, not once in each of 0..{}",
                args.periods
            );
            ok = false;
        }
        if entries.windows(2).any(|w| w[1].term < w[0].term) {
            println!("VIOLATION: job {job} was run by a deposed leader after its successor");
            ok = false;
        }
        terms.extend(entries.iter().map(|e| e.term));
        all.extend(entries);
    }
    println!("leaders' terms that ran jobs: {terms:?}");
    if let Some((term, killed_ms)) = killed {
        let first_after = all.iter().filter(|e| e.term > term).map(|e| e.at_ms).min();
        let before_kill = all
            .iter()
            .filter(|e| e.period == args.kill_leader_at && e.term <= term)
            .count();
        if let Some(first) = first_after {
            println!(
                "killed leader of term {term} mid-period {}: it had run {before_kill} of that \
                 period's {} jobs; the next leader ran its first job {} ms after the kill",
                args.kill_leader_at,
                args.jobs,
                first.saturating_sub(killed_ms)
            );
        } else {
            println!("VIOLATION: the killed leader of term {term} was never replaced");
            ok = false;
        }
    }
    println!(
        "{} jobs × {} periods: {}",
        args.jobs,
        args.periods,
        if ok {
            "every job ran exactly once per period"
        } else {
            "NOT exactly once"
        }
    );
    Ok(ok)
}
