//! `dlock demo scheduler`: every worker wakes at each period and tries every job. A job's lock
//! keeps the others from starting it at the same time; the job's "last run period" value,
//! written with compare-and-set, makes each run happen exactly once per period, even if a lock
//! is lost mid-run.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::Args;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

use super::{run_prefix, run_workers};

#[derive(Debug, Args)]
pub(crate) struct SchedulerArgs {
    /// Worker processes (tasks on memory://).
    #[arg(long, default_value_t = 8)]
    workers: u32,
    /// Jobs to run once per period.
    #[arg(long, default_value_t = 20)]
    jobs: u32,
    /// Length of a period.
    #[arg(long, default_value = "1s", value_parser = crate::parse_duration)]
    period: Duration,
    /// How many periods to run.
    #[arg(long, default_value_t = 5)]
    periods: u32,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Params {
    prefix: String,
    worker: u32,
    jobs: u32,
    periods: u32,
    period_ms: u64,
    /// Unix ms when period 0 starts (the same clock for every worker of one machine).
    start_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Run {
    job: u32,
    period: u32,
    worker: u32,
    fence: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct Report {
    runs: Vec<Run>,
}

pub(super) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn last_run(prefix: &str, job: u32) -> String {
    format!("{prefix}/job-{job}/last-period")
}

pub(super) async fn work(locks: &dlock::Locks, params: Params) -> anyhow::Result<Report> {
    let mut report = Report::default();
    let period = Duration::from_millis(params.period_ms);
    for p in 0..params.periods {
        let starts = params.start_ms + u64::from(p) * params.period_ms;
        tokio::time::sleep(Duration::from_millis(starts.saturating_sub(unix_ms()))).await;
        let mut jobs: Vec<u32> = (0..params.jobs).collect();
        jobs.shuffle(&mut rand::rng());
        for job in jobs {
            // The lease lasts at most the period: a crashed runner frees the job for the next.
            let Some(guard) = locks
                .mutex(format!("{}/job-{job}", params.prefix))
                .ttl(period.max(dlock::limits::MIN_TTL))
                .try_acquire()
                .await?
            else {
                continue;
            };
            let last = locks.value(last_run(&params.prefix, job));
            let seen = last.get().await?;
            let done = match &seen {
                Some(v) => std::str::from_utf8(&v.value)?.parse::<i64>()? >= i64::from(p),
                None => false,
            };
            if !done {
                // The job itself would run here, passing guard.fence() to what it writes.
                if last
                    .compare_and_set(seen.map(|v| v.version), p.to_string())
                    .await?
                    .is_some()
                {
                    report.runs.push(Run {
                        job,
                        period: p,
                        worker: params.worker,
                        fence: guard.fence().get(),
                    });
                }
            }
            guard.release().await?;
        }
    }
    Ok(report)
}

pub(super) async fn run(url: &str, args: SchedulerArgs) -> anyhow::Result<bool> {
    if args.workers == 0
        || args.jobs == 0
        || args.periods == 0
        || args.period < dlock::limits::MIN_TTL
    {
        bail!("--workers, --jobs and --periods must be at least 1 and --period at least 10ms");
    }
    let locks = dlock::connect(url).await?;
    let prefix = run_prefix("scheduler");
    let period_ms = u64::try_from(args.period.as_millis()).context("--period is too long")?;
    // Workers need a moment to start; period 0 begins after it.
    let start_ms = unix_ms() + 500;
    let params: Vec<Params> = (0..args.workers)
        .map(|worker| Params {
            prefix: prefix.clone(),
            worker,
            jobs: args.jobs,
            periods: args.periods,
            period_ms,
            start_ms,
        })
        .collect();
    println!(
        "scheduler on {}: {} workers, {} jobs, {} periods of {:?}",
        locks.info().name,
        args.workers,
        args.jobs,
        args.periods,
        args.period
    );
    let reports: Vec<Report> =
        run_workers(url, &locks, "scheduler", params, |locks, p| async move {
            work(&locks, p).await
        })
        .await?;
    let mut runs: Vec<Run> = reports.into_iter().flat_map(|r| r.runs).collect();
    runs.sort_by_key(|r| (r.period, r.job));
    println!("run log (period job worker fence):");
    for run in &runs {
        println!(
            "  {:>3} {:>4} {:>6} {:>12}",
            run.period, run.job, run.worker, run.fence
        );
    }
    let mut per_slot: BTreeMap<(u32, u32), u32> = BTreeMap::new();
    let mut per_worker: BTreeMap<u32, u32> = (0..args.workers).map(|w| (w, 0)).collect();
    for run in &runs {
        *per_slot.entry((run.period, run.job)).or_default() += 1;
        *per_worker.entry(run.worker).or_default() += 1;
    }
    println!("per-worker share:");
    for (worker, count) in &per_worker {
        println!(
            "  worker {worker:>3}: {count:>4} runs ({:.1} %)",
            100.0 * f64::from(*count) / runs.len().max(1) as f64
        );
    }
    let mut ok = true;
    for period in 0..args.periods {
        for job in 0..args.jobs {
            let count = per_slot.get(&(period, job)).copied().unwrap_or(0);
            if count != 1 {
                println!("VIOLATION: job {job} ran {count} times in period {period}");
                ok = false;
            }
        }
    }
    println!(
        "{} runs for {} jobs × {} periods: {}",
        runs.len(),
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
