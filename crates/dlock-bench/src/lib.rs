//! The benchmarks behind `dlock bench`: a program, not timed tests.
//!
//! Scenarios:
//! - `uncontended`: one task, one name, acquire + release in a loop: pairs/s and latency,
//!   measured in blocks alternating with the `floor`'s, so the result reads as a ratio to it.
//! - `floor`: the same kind of store operations with no lock logic, through the same client
//!   library: SQLite write transactions; Redis `SET NX PX` + `DEL`; Redlock, those sent to
//!   every node at once and answered on the first majority (beside it, the lock on one of
//!   its nodes); ZooKeeper, an ephemeral sequential create and delete; etcd, a put with a
//!   lease and a delete (beside it, with a lease granted per pair); PostgreSQL and MySQL, the
//!   lease table's two statements without the lock logic.
//! - `many`: C concurrent tasks (`--tasks 1,4,16,64`) on names of their own: throughput as the
//!   client's concurrency grows.
//! - `handoff`: P worker processes contend for one name for a fixed time, each holding it for
//!   H: acquisitions/s, the hand-off gap (one holder's release to the next holder's acquire,
//!   on this machine's clock), real hand-offs (to another worker) per second, fairness (Jain's
//!   index over per-worker counts), the worst wait and, on Redis, store commands per
//!   acquisition.
//! - `watchdog`: one process holds K locks (default 10 000) renewed by its lease keeper:
//!   renewals/s, CPU and memory.
//! - `blocking` (Redis): one thread of the blocking facade, acquire + release in a loop, in
//!   blocks alternating with the blocking floor (redis-rs's blocking `SET NX PX` + `DEL`).
//!
//! With `--peer COMMAND`, the uncontended and hand-off scenarios measure another lock library
//! instead, through a small protocol (see the `peer` module's source), on the same server and
//! with the same analysis. Every scenario is repeated (`--repeat`, default 3) and reported as
//! min / median / max; `--json` writes a [`Report`], and `--report DIR` turns a directory of
//! them into BENCHMARKS.md and its charts.

mod charts;
mod floor;
mod peer;
mod redis_stats;
mod report;
mod results;
mod scenarios;
mod stats;
mod system;

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::{Args, ValueEnum};
use serde::Serialize;

pub use results::{
    Environment, Floor, Handoff, ManyLocks, ManyPoint, Report, ServeScrape, Uncontended,
    WatchdogScale,
};
pub use stats::{QUANTILES, Spread};

use peer::Client;

/// Options of `dlock bench`.
#[derive(Debug, Args)]
#[non_exhaustive]
pub struct BenchArgs {
    /// Which scenarios to run (comma-separated); `all` is uncontended, floor and hand-off.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "all")]
    pub scenario: Vec<Scenario>,
    /// Acquire+release pairs per uncontended run (and per many-locks run, over all tasks).
    #[arg(long, default_value_t = 2000)]
    pub pairs: u32,
    /// Worker processes in the hand-off scenario.
    #[arg(long, default_value_t = 4)]
    pub processes: u32,
    /// How long each hand-off run lasts.
    #[arg(long, value_parser = parse_duration, default_value = "3s")]
    pub duration: Duration,
    /// How long each worker holds the lock.
    #[arg(long, value_parser = parse_duration, default_value = "1ms")]
    pub hold: Duration,
    /// Runs per scenario; the report gives min / median / max.
    #[arg(long, default_value_t = 3)]
    pub repeat: u32,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Concurrent tasks in the many-locks scenario, one point each (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    pub tasks: Vec<u32>,
    /// Locks held at once in the watchdog scenario.
    #[arg(long, default_value_t = 10_000)]
    pub held: u32,
    /// Watchdog lease in the watchdog scenario (renewed every third of it).
    #[arg(long, value_parser = parse_duration, default_value = "3s")]
    pub lease: Duration,
    /// Runtime threads of the bench and its workers: 1 (the default) runs everything on one
    /// thread, the lowest-latency setup for a single client.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Measure another lock library instead of dlock: a command speaking the bench's peer
    /// protocol (split on spaces), e.g. `python3 scripts/peers/redis_py.py sync 0.1`.
    #[arg(long)]
    pub peer: Option<String>,
    /// The library's name in the report (default: `dlock`, or the peer command).
    #[arg(long)]
    pub library: Option<String>,
    /// Redis commands the measured library sends itself besides scripts (e.g. `set` for
    /// redis-py), counted in store commands per acquisition (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub count_commands: Vec<String>,
    /// Where the store's server runs (e.g. `1` when pinned to CPU 1), recorded in the report.
    #[arg(long)]
    pub server_cpus: Option<String>,
    /// The store's server processes (comma-separated): the uncontended scenario then reports
    /// their CPU time per pair, children included, beside this process's.
    #[arg(long, value_delimiter = ',')]
    pub server_pids: Vec<u32>,
    /// Write BENCHMARKS.md (`--out`) and its charts from the JSON reports in this directory,
    /// instead of measuring.
    #[arg(long, value_name = "RESULTS_DIR")]
    pub report: Option<PathBuf>,
    /// The Markdown file `--report` writes; its charts go to a `charts` directory beside the
    /// results directory.
    #[arg(long, default_value = "BENCHMARKS.md")]
    pub out: PathBuf,
    /// Internal: run as a hand-off worker on this lock name and print one line per hold.
    #[arg(long, hide = true)]
    pub worker: Option<String>,
}

/// A benchmark scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Scenario {
    /// Uncontended (with the floor) and hand-off.
    All,
    /// One task acquiring and releasing one name.
    Uncontended,
    /// Worker processes contending for one name.
    Handoff,
    /// The physical limit: the same kind of store operations with no lock logic, through the
    /// backend's client library (e.g. plain Redis `SET NX PX` + `DEL` round trips through
    /// redis-rs), so the uncontended result reads as a ratio to it. Run with `uncontended`.
    Floor,
    /// Many distinct locks taken by concurrent tasks of one process.
    Many,
    /// Many locks held at once by one process, renewed by its lease keeper: renewals/s, CPU
    /// and memory.
    Watchdog,
    /// One thread of the blocking facade (`dlock::blocking`) acquiring and releasing one name,
    /// against the blocking floor: the same plain commands over a blocking redis-rs connection
    /// (Redis only). Its report takes the uncontended and floor places: run it with a
    /// `--library` label of its own.
    Blocking,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| e.to_string())
}

fn unique_name(what: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("dlock-bench/{what}/{}-{nanos}", std::process::id())
}

impl BenchArgs {
    fn wants(&self, scenario: Scenario) -> bool {
        self.scenario.contains(&scenario)
    }
}

/// Runs `dlock bench`, one hand-off worker (`--worker`), or the report writer (`--report`).
///
/// # Errors
///
/// Connection failures, lock errors, a worker or peer process that failed, or unreadable
/// results for `--report`.
///
/// # Cancel safety
///
/// Not meant to be cancelled: a dropped run leaves its worker processes to finish their
/// duration, and a partial floor database until the next run.
pub async fn run(url: &str, args: BenchArgs) -> anyhow::Result<()> {
    if let Some(name) = &args.worker {
        return scenarios::handoff::worker(url, name, args.duration, args.hold).await;
    }
    if let Some(results) = &args.report {
        return report::write(results, &args.out);
    }
    let locks = dlock::connect(url).await?;
    let peer: Option<Vec<String>> = args
        .peer
        .as_ref()
        .map(|command| command.split_whitespace().map(str::to_owned).collect());
    let client = match &peer {
        Some(command) => Client::Peer {
            command: command.clone(),
        },
        None => Client::Dlock {
            threads: args.threads,
        },
    };
    let mut report = Report {
        library: args
            .library
            .clone()
            .or_else(|| args.peer.clone())
            .unwrap_or_else(|| "dlock".to_owned()),
        backend: store_name(url, locks.info().name),
        environment: Environment {
            client_cpus: system::allowed_cpus(),
            server_cpus: args.server_cpus.clone(),
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            threads: args.threads,
            load_start: system::load_average(),
            load_end: f64::NAN,
            started_unix_s: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            repeat: args.repeat,
            binary_bytes: std::env::current_exe()
                .and_then(std::fs::metadata)
                .map(|m| m.len())
                .ok(),
        },
        uncontended: None,
        handoff: None,
        floor: None,
        references: Vec::new(),
        many: None,
        watchdog: None,
    };
    println!(
        "{} on {}, client CPUs {} ({} runs per scenario, median (min, max))",
        report.library, report.backend, report.environment.client_cpus, args.repeat
    );
    let all = args.wants(Scenario::All);
    if all || args.wants(Scenario::Floor) || args.wants(Scenario::Uncontended) {
        let result = match &peer {
            Some(command) => scenarios::uncontended::peer_uncontended(command, url, &args).await?,
            None => {
                let floors = floor::floor_pairs(url, &report.backend).await?;
                for (i, floor) in floors.iter().enumerate() {
                    println!(
                        "{}: {}, measured in blocks alternating with the lock's",
                        if i == 0 { "floor" } else { "reference" },
                        floor.what
                    );
                }
                let (result, mut floor_results) =
                    scenarios::uncontended::uncontended(&locks, floors, &args).await?;
                for floor in &floor_results {
                    println!("{}", floor.what);
                    println!("  pairs/s      {}", floor.pairs_per_sec);
                    println!("  p50 µs       {}", floor.p50_us);
                    println!("  p99 µs       {}", floor.p99_us);
                    if let Some(ratio) = &floor.lock_ratio {
                        println!("  dlock / this {ratio}");
                    }
                    print_cpu(floor.cpu.as_ref());
                }
                if !floor_results.is_empty() {
                    report.floor = Some(floor_results.remove(0));
                }
                report.references = floor_results;
                result
            }
        };
        println!(
            "uncontended acquire+release, 1 task, {} pairs per run",
            args.pairs
        );
        println!("  pairs/s      {}", result.pairs_per_sec);
        println!("  p50 µs       {}", result.p50_us);
        println!("  p99 µs       {}", result.p99_us);
        if let Some(ratio) = &result.ratio_to_floor {
            println!("  / floor      {ratio}");
        }
        print_cpu(result.cpu.as_ref());
        report.uncontended = Some(result);
    }
    if args.wants(Scenario::Blocking) && peer.is_none() {
        let (result, floor) = scenarios::blocking::blocking(url, &args).await?;
        println!("blocking facade, 1 thread, {} pairs per run", args.pairs);
        println!("  pairs/s      {}", result.pairs_per_sec);
        println!("  p50 µs       {}", result.p50_us);
        println!("  p99 µs       {}", result.p99_us);
        println!("{}", floor.what);
        println!("  pairs/s      {}", floor.pairs_per_sec);
        println!("  p50 µs       {}", floor.p50_us);
        if let Some(ratio) = &result.ratio_to_floor {
            println!("  / floor      {ratio}");
        }
        report.uncontended = Some(result);
        report.floor = Some(floor);
    }
    if args.wants(Scenario::Many) {
        if peer.is_some() {
            println!("many: skipped, measured for dlock only");
        } else {
            let result = scenarios::many::many(&locks, url, &report.backend, &args).await?;
            println!("many distinct locks, concurrent tasks of one process");
            for point in &result.points {
                println!(
                    "  {:>4} tasks: pairs/s {}  p99 µs {}",
                    point.tasks, point.pairs_per_sec, point.p99_us
                );
                if let (Some(floor), Some(ratio)) =
                    (&point.floor_pairs_per_sec, &point.ratio_to_floor)
                {
                    println!("        floor: pairs/s {floor}  / floor {ratio}");
                }
                if let (Some(lock), Some(floor)) =
                    (&point.server_us_per_pair, &point.floor_server_us_per_pair)
                {
                    println!("        server µs per pair: dlock {lock}  floor {floor}");
                }
            }
            report.many = Some(result);
        }
    }
    if all || args.wants(Scenario::Handoff) {
        if !locks.info().capabilities.cross_process {
            println!(
                "handoff: skipped, {} locks are local to one process",
                report.backend
            );
        } else {
            let result = scenarios::handoff::handoff(url, &client, &args).await?;
            println!(
                "contended hand-off, {} processes, hold {:?}, {:?} per run",
                args.processes, args.hold, args.duration
            );
            println!("  acquisitions/s   {}", result.acquisitions_per_sec);
            println!("  hand-offs/s      {}", result.handoffs_per_sec);
            println!("  gap p50 µs, all  {}", result.gap_p50_us);
            println!("  gap p99 µs, all  {}", result.gap_p99_us);
            if let Some(h) = &result.holder_gaps {
                println!("  hand-off gap µs, one holder's release to another's acquisition:");
                println!("    p50            {}", h.p50_us);
                println!("    p99            {}", h.p99_us);
                println!("    max            {}", h.max_us);
                if let Some(count) = &h.count {
                    println!("    count          {count}");
                }
                if let Some(share) = &h.retake_share {
                    println!("  re-takes by the releaser, share of acquisitions {share}");
                }
            }
            println!("  fairness (Jain)  {}", result.fairness);
            println!("  worst wait ms    {}", result.worst_wait_ms);
            if let Some(commands) = &result.store_commands_per_acquisition {
                println!("  store cmds/acq   {commands}");
            }
            report.handoff = Some(result);
        }
    }
    if args.wants(Scenario::Watchdog) {
        if peer.is_some() {
            println!("watchdog: skipped, measured for dlock only");
        } else {
            let result = scenarios::watchdog::watchdog(url, &args).await?;
            println!(
                "watchdog: {} locks held by one process, lease {:?}, {:?} per run",
                args.held, args.lease, args.duration
            );
            println!("  renewals/s   {}", result.renewals_per_sec);
            println!("  CPU % core   {}", result.cpu_percent);
            println!("  RSS +MiB     {}", result.rss_growth_mib);
            println!("  lost         {:>10}", result.lost);
            if let Some(serve) = &result.serve {
                println!(
                    "  dlock serve on the same store, {} locks listed:",
                    serve.listed
                );
                println!(
                    "    /metrics ms    {}  ({} bytes)",
                    serve.metrics_ms, serve.metrics_bytes
                );
                println!(
                    "    /api/locks ms  {}  ({} bytes)",
                    serve.api_ms, serve.api_bytes
                );
                println!("    serve RSS MiB  {:>10.1}", serve.rss_mib);
            }
            report.watchdog = Some(result);
        }
    }
    report.environment.load_end = system::load_average();
    if let Some(path) = &args.json {
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        }
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("write {}", path.display()))?;
    }
    Ok(())
}

/// The CPU time per pair lines of an uncontended result or floor, if measured.
fn print_cpu(cpu: Option<&results::CpuPerPair>) {
    if let Some(cpu) = cpu {
        println!("  client CPU µs per pair {}", cpu.client_us);
        if let Some(server) = &cpu.server_us {
            println!("  server CPU µs per pair {server}");
        }
    }
}

/// The name a report gives the store: the backend's, except that a Redis Cluster or a Redis
/// behind Sentinel is named apart from one Redis server (their figures are not one server's).
fn store_name(url: &str, backend: &str) -> String {
    let scheme = url.split("://").next().unwrap_or_default();
    match scheme.split_once('+') {
        Some((_, topology @ ("cluster" | "sentinel"))) => format!("{backend}-{topology}"),
        _ => backend.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::store_name;

    #[test]
    fn a_cluster_or_sentinel_url_names_its_topology() {
        assert_eq!(
            store_name("redis+cluster://a:1,b:2", "redis"),
            "redis-cluster"
        );
        assert_eq!(
            store_name("rediss+sentinel://s:1/m", "redis"),
            "redis-sentinel"
        );
        assert_eq!(store_name("redis://127.0.0.1:6379", "redis"), "redis");
        assert_eq!(store_name("sqlite:///tmp/x.db", "sqlite"), "sqlite");
    }
}
