//! The benchmarks behind `dlock bench`: a program, not timed tests.
//!
//! Scenarios:
//! - `uncontended`: one task, one name, acquire + release in a loop: pairs/s and latency.
//! - `watchdog`: one process holds K locks (default 10 000) renewed by its lease keeper:
//!   renewals/s, CPU and memory.
//! - `handoff`: P worker processes (`dlock bench --worker`) contend for one name for a fixed
//!   time, each holding it for H: acquisitions/s, the hand-off gap (one holder's release to the
//!   next holder's acquire, on this machine's clock), real hand-offs (to another worker) per
//!   second, fairness (Jain's index over per-worker counts) and the worst wait.
//!
//! Every scenario is repeated (`--repeat`, default 3) and reported as min / median / max.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, BufReader};

/// Options of `dlock bench`.
#[derive(Debug, Args)]
#[non_exhaustive]
pub struct BenchArgs {
    /// Which scenario to run.
    #[arg(long, value_enum, default_value_t = Scenario::All)]
    pub scenario: Scenario,
    /// Acquire+release pairs per uncontended run.
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
    pub json: Option<std::path::PathBuf>,
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
    /// Internal: run as a hand-off worker on this lock name and print one line per hold.
    #[arg(long, hide = true)]
    pub worker: Option<String>,
}

/// A benchmark scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Scenario {
    /// Both scenarios.
    All,
    /// One task acquiring and releasing one name.
    Uncontended,
    /// Worker processes contending for one name.
    Handoff,
    /// The physical limit: the same kind of store operations with no lock logic (SQLite write
    /// transactions, or plain Redis `SET NX PX` + `DEL` round trips through redis-rs), so the
    /// uncontended result reads as a ratio to it.
    Floor,
    /// Many locks held at once by one process, renewed by its lease keeper: renewals/s, CPU
    /// and memory.
    Watchdog,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| e.to_string())
}

/// One number measured several times.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct Spread {
    /// Smallest run.
    pub min: f64,
    /// Median run.
    pub median: f64,
    /// Largest run.
    pub max: f64,
}

impl Spread {
    fn of(mut values: Vec<f64>) -> Spread {
        values.sort_by(f64::total_cmp);
        let pick = |i: usize| values.get(i).copied().unwrap_or(f64::NAN);
        Spread {
            min: pick(0),
            median: pick(values.len() / 2),
            max: pick(values.len().saturating_sub(1)),
        }
    }
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:>10.1} (min {:.1}, max {:.1})",
            self.median, self.min, self.max
        )
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Results of the uncontended scenario.
#[derive(Debug, Serialize)]
#[non_exhaustive]
pub struct Uncontended {
    /// Acquire+release pairs per second.
    pub pairs_per_sec: Spread,
    /// Median pair latency, µs.
    pub p50_us: Spread,
    /// 99th percentile pair latency, µs.
    pub p99_us: Spread,
    /// Pairs per second as a fraction of the floor's, run by run (blocks of the two
    /// alternate, so both see the same machine).
    pub ratio_to_floor: Option<Spread>,
}

/// Results of the hand-off scenario.
#[derive(Debug, Serialize)]
#[non_exhaustive]
pub struct Handoff {
    /// Worker processes.
    pub processes: u32,
    /// Hold time per acquisition, ms.
    pub hold_ms: f64,
    /// Acquisitions per second, all workers together.
    pub acquisitions_per_sec: Spread,
    /// Hand-offs to a different worker per second.
    pub handoffs_per_sec: Spread,
    /// Median gap from a release to the next acquisition, µs.
    pub gap_p50_us: Spread,
    /// 99th percentile gap, µs.
    pub gap_p99_us: Spread,
    /// Jain's fairness index over per-worker acquisition counts (1 = perfectly even).
    pub fairness: Spread,
    /// Longest single wait for the lock, ms.
    pub worst_wait_ms: Spread,
    /// Commands sent to the store per acquisition, by every client together (Redis: `EVALSHA`,
    /// `SUBSCRIBE`, connection set-up…, from `INFO commandstats`, so the server must be the
    /// benchmark's alone; the commands a script runs inside are not counted).
    pub store_commands_per_acquisition: Option<Spread>,
}

/// Everything one `dlock bench` run measured.
#[derive(Debug, Serialize)]
#[non_exhaustive]
pub struct Report {
    /// The backend's name.
    pub backend: String,
    /// Uncontended results, if run.
    pub uncontended: Option<Uncontended>,
    /// Hand-off results, if run.
    pub handoff: Option<Handoff>,
    /// The floor, if run.
    pub floor: Option<Floor>,
    /// The watchdog scale, if run.
    pub watchdog: Option<WatchdogScale>,
}

/// Results of the watchdog scenario.
#[non_exhaustive]
#[derive(Debug, Serialize)]
pub struct WatchdogScale {
    /// Locks held and renewed.
    pub held: u32,
    /// Watchdog lease, ms.
    pub lease_ms: f64,
    /// Renewals per second seen by the store (expected: held × 3 / lease).
    pub renewals_per_sec: Spread,
    /// Process CPU time while holding, in percent of one core.
    pub cpu_percent: Spread,
    /// Resident memory growth from before acquiring to while holding, MiB.
    pub rss_growth_mib: Spread,
    /// Locks lost while held (must be 0).
    pub lost: u64,
}

/// Results of the floor scenario: on SQLite, plain write-transaction pairs on a scratch
/// database beside the lock file, through the same library and settings (WAL,
/// synchronous=NORMAL); on Redis, plain `SET NX PX` + `DEL` pairs through redis-rs.
#[derive(Debug, Serialize)]
#[non_exhaustive]
pub struct Floor {
    /// What a pair is.
    pub what: &'static str,
    /// Pairs per second.
    pub pairs_per_sec: Spread,
    /// Median pair latency, µs.
    pub p50_us: Spread,
    /// 99th percentile pair latency, µs.
    pub p99_us: Spread,
}

/// Runs `dlock bench` (or one hand-off worker, with `--worker`).
///
/// # Errors
///
/// Connection failures, lock errors, or a worker process that failed.
///
/// # Cancel safety
///
/// Not meant to be cancelled: a dropped run leaves its worker processes to finish their
/// duration, and a partial floor database until the next run.
pub async fn run(url: &str, args: BenchArgs) -> anyhow::Result<()> {
    if let Some(name) = &args.worker {
        return worker(url, name, args.duration, args.hold).await;
    }
    let locks = dlock::connect(url).await?;
    let mut report = Report {
        backend: locks.info().name.to_owned(),
        uncontended: None,
        handoff: None,
        floor: None,
        watchdog: None,
    };
    println!(
        "dlock bench on {} ({} runs per scenario, median (min, max))",
        report.backend, args.repeat
    );
    if matches!(
        args.scenario,
        Scenario::All | Scenario::Floor | Scenario::Uncontended
    ) {
        let floor = floor_pair(url, &report.backend).await?;
        if let Some(floor) = &floor {
            println!(
                "floor: {} with no lock logic, measured in blocks alternating with the lock's",
                floor.what
            );
        }
        let (result, floor_result) = uncontended(&locks, floor, &args).await?;
        if let Some(floor) = &floor_result {
            println!("  pairs/s      {}", floor.pairs_per_sec);
            println!("  p50 µs       {}", floor.p50_us);
            println!("  p99 µs       {}", floor.p99_us);
        }
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
        report.uncontended = Some(result);
        report.floor = floor_result;
    }
    if matches!(args.scenario, Scenario::All | Scenario::Handoff) {
        if !locks.info().capabilities.cross_process {
            println!(
                "handoff: skipped, {} locks are local to one process",
                report.backend
            );
        } else {
            let result = handoff(url, &args).await?;
            println!(
                "contended hand-off, {} processes, hold {:?}, {:?} per run",
                args.processes, args.hold, args.duration
            );
            println!("  acquisitions/s   {}", result.acquisitions_per_sec);
            println!("  hand-offs/s      {}", result.handoffs_per_sec);
            println!("  gap p50 µs       {}", result.gap_p50_us);
            println!("  gap p99 µs       {}", result.gap_p99_us);
            println!("  fairness (Jain)  {}", result.fairness);
            println!("  worst wait ms    {}", result.worst_wait_ms);
            if let Some(commands) = &result.store_commands_per_acquisition {
                println!("  store cmds/acq   {commands}");
            }
            report.handoff = Some(result);
        }
    }
    if matches!(args.scenario, Scenario::Watchdog) {
        let result = watchdog(url, &args).await?;
        println!(
            "watchdog: {} locks held by one process, lease {:?}, {:?} per run",
            args.held, args.lease, args.duration
        );
        println!("  renewals/s   {}", result.renewals_per_sec);
        println!("  CPU % core   {}", result.cpu_percent);
        println!("  RSS +MiB     {}", result.rss_growth_mib);
        println!("  lost         {:>10}", result.lost);
        report.watchdog = Some(result);
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("write {}", path.display()))?;
    }
    Ok(())
}

fn unique_name(what: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("dlock-bench/{what}/{}-{nanos}", std::process::id())
}

/// Pairs measured per block; lock and floor blocks alternate, so both see the same machine.
const BLOCK: u32 = 100;

async fn lock_pair(locks: &dlock::Locks, name: &str) -> anyhow::Result<()> {
    locks
        .mutex(name)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?
        .release()
        .await?;
    Ok(())
}

/// Latencies in µs → (pairs/s over the time spent, p50, p99).
fn summarize(mut latencies: Vec<f64>) -> (f64, f64, f64) {
    let spent_s: f64 = latencies.iter().sum::<f64>() / 1e6;
    latencies.sort_by(f64::total_cmp);
    (
        latencies.len() as f64 / spent_s,
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
    )
}

async fn uncontended(
    locks: &dlock::Locks,
    mut floor: Option<FloorPair>,
    args: &BenchArgs,
) -> anyhow::Result<(Uncontended, Option<Floor>)> {
    let name = unique_name("uncontended");
    // Warm-up: connection, scripts or prepared statements, page cache.
    for _ in 0..50 {
        lock_pair(locks, &name).await?;
        if let Some(floor) = &mut floor {
            (floor.pair)().await?;
        }
    }
    let mut lock_m: [Vec<f64>; 3] = Default::default();
    let mut floor_m: [Vec<f64>; 3] = Default::default();
    let mut ratios = Vec::new();
    for _ in 0..args.repeat.max(1) {
        let mut lock_latencies = Vec::with_capacity(args.pairs as usize);
        let mut floor_latencies = Vec::with_capacity(args.pairs as usize);
        while lock_latencies.len() < args.pairs as usize {
            for _ in 0..BLOCK.min(args.pairs) {
                let t = Instant::now();
                lock_pair(locks, &name).await?;
                lock_latencies.push(t.elapsed().as_secs_f64() * 1e6);
            }
            if let Some(floor) = &mut floor {
                for _ in 0..BLOCK.min(args.pairs) {
                    let t = Instant::now();
                    (floor.pair)().await?;
                    floor_latencies.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
        }
        let (rate, p50, p99) = summarize(lock_latencies);
        lock_m[0].push(rate);
        lock_m[1].push(p50);
        lock_m[2].push(p99);
        if floor.is_some() {
            let (floor_rate, floor_p50, floor_p99) = summarize(floor_latencies);
            floor_m[0].push(floor_rate);
            floor_m[1].push(floor_p50);
            floor_m[2].push(floor_p99);
            ratios.push(rate / floor_rate);
        }
    }
    let [rates, p50s, p99s] = lock_m;
    let [floor_rates, floor_p50s, floor_p99s] = floor_m;
    Ok((
        Uncontended {
            pairs_per_sec: Spread::of(rates),
            p50_us: Spread::of(p50s),
            p99_us: Spread::of(p99s),
            ratio_to_floor: (!ratios.is_empty()).then(|| Spread::of(ratios)),
        },
        floor.map(|floor| Floor {
            what: floor.what,
            pairs_per_sec: Spread::of(floor_rates),
            p50_us: Spread::of(floor_p50s),
            p99_us: Spread::of(floor_p99s),
        }),
    ))
}

/// One hold as a worker reports it: `fence acquired_ns released_ns waited_ns`.
struct Hold {
    worker: usize,
    fence: u64,
    acquired: u128,
    released: u128,
    waited: u128,
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

async fn worker(url: &str, name: &str, duration: Duration, hold: Duration) -> anyhow::Result<()> {
    let locks = dlock::connect(url).await?;
    let deadline = Instant::now() + duration;
    let mut lines = Vec::new();
    while Instant::now() < deadline {
        let asked = now_ns();
        let left = deadline.saturating_duration_since(Instant::now());
        let Some(guard) = locks
            .mutex(name)
            .ttl(Duration::from_secs(30))
            .wait(left)
            .try_acquire()
            .await?
        else {
            break;
        };
        let acquired = now_ns();
        if !hold.is_zero() {
            // A busy hold, like real work under the lock; sleeping would add timer slack.
            let until = Instant::now() + hold;
            while Instant::now() < until {
                std::hint::spin_loop();
            }
        }
        let fence = guard.fence();
        let released = now_ns();
        guard.release().await?;
        lines.push(format!(
            "{fence} {acquired} {released} {}",
            acquired - asked
        ));
    }
    println!("{}", lines.join("\n"));
    Ok(())
}

async fn handoff(url: &str, args: &BenchArgs) -> anyhow::Result<Handoff> {
    let exe = std::env::current_exe().context("current_exe")?;
    let mut m: [Vec<f64>; 6] = Default::default();
    let mut commands_per_acquisition = Vec::new();
    let redis = redis_server(url);
    for _ in 0..args.repeat.max(1) {
        let name = unique_name("handoff");
        let commands_before = match &redis {
            Some(server) => Some(redis_commands(server).await?),
            None => None,
        };
        let mut children = Vec::new();
        for _ in 0..args.processes {
            let child = tokio::process::Command::new(&exe)
                .arg("--url")
                .arg(url)
                .args(["bench", "--worker", &name, "--duration"])
                .arg(format!("{}ms", args.duration.as_millis()))
                .arg("--hold")
                .arg(format!("{}us", args.hold.as_micros()))
                .arg("--threads")
                .arg(args.threads.to_string())
                .stdout(Stdio::piped())
                .spawn()
                .context("spawn bench worker")?;
            children.push(child);
        }
        let mut holds = Vec::new();
        for (worker, mut child) in children.into_iter().enumerate() {
            let stdout = child.stdout.take().context("worker stdout")?;
            let mut lines = BufReader::new(stdout).lines();
            while let Some(line) = lines.next_line().await? {
                let fields: Vec<&str> = line.split_whitespace().collect();
                if let [fence, acquired, released, waited] = fields[..] {
                    holds.push(Hold {
                        worker,
                        fence: fence.parse()?,
                        acquired: acquired.parse()?,
                        released: released.parse()?,
                        waited: waited.parse()?,
                    });
                }
            }
            let status = child.wait().await?;
            if !status.success() {
                bail!("a bench worker failed: {status}");
            }
        }
        if let (Some(server), Some(before)) = (&redis, commands_before) {
            // Minus the one INFO that reads the counters.
            let spent = redis_commands(server).await?.saturating_sub(before + 1);
            commands_per_acquisition.push(spent as f64 / holds.len().max(1) as f64);
        }
        holds.sort_by_key(|h| h.fence);
        if holds.len() < 2 {
            bail!("only {} acquisitions in a hand-off run", holds.len());
        }
        let span_s = (holds[holds.len() - 1].released - holds[0].acquired) as f64 / 1e9;
        let mut gaps: Vec<f64> = holds
            .windows(2)
            .map(|w| (w[1].acquired.saturating_sub(w[0].released)) as f64 / 1e3)
            .collect();
        gaps.sort_by(f64::total_cmp);
        let handoffs = holds
            .windows(2)
            .filter(|w| w[0].worker != w[1].worker)
            .count();
        let mut counts = vec![0f64; args.processes as usize];
        for h in &holds {
            counts[h.worker] += 1.0;
        }
        let sum: f64 = counts.iter().sum();
        let squares: f64 = counts.iter().map(|c| c * c).sum();
        let worst = holds.iter().map(|h| h.waited).max().unwrap_or(0) as f64 / 1e6;
        m[0].push(holds.len() as f64 / span_s);
        m[1].push(handoffs as f64 / span_s);
        m[2].push(percentile(&gaps, 0.50));
        m[3].push(percentile(&gaps, 0.99));
        m[4].push(sum * sum / (counts.len() as f64 * squares));
        m[5].push(worst);
    }
    let [rate, handoffs, p50, p99, fairness, worst] = m;
    Ok(Handoff {
        processes: args.processes,
        hold_ms: args.hold.as_secs_f64() * 1e3,
        acquisitions_per_sec: Spread::of(rate),
        handoffs_per_sec: Spread::of(handoffs),
        gap_p50_us: Spread::of(p50),
        gap_p99_us: Spread::of(p99),
        fairness: Spread::of(fairness),
        worst_wait_ms: Spread::of(worst),
        store_commands_per_acquisition: (!commands_per_acquisition.is_empty())
            .then(|| Spread::of(commands_per_acquisition)),
    })
}

/// The redis-rs URL of a `redis://` lock URL (without dlock's options), if it is one.
fn redis_server(url: &str) -> Option<String> {
    dlock::redis::RedisConfig::from_url(url)
        .ok()
        .map(|config| config.server)
}

/// Commands clients have sent the Redis server so far: the sum of `INFO commandstats` over
/// the commands a client sends (commands run inside scripts are counted there too, but are not
/// round trips).
async fn redis_commands(server: &str) -> anyhow::Result<u64> {
    let mut conn = redis::Client::open(server)?
        .get_multiplexed_async_connection()
        .await?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await?;
    const CLIENT_COMMANDS: &[&str] = &[
        "evalsha",
        "eval",
        "script",
        "subscribe",
        "unsubscribe",
        "psubscribe",
        "punsubscribe",
        "ping",
        "hello",
        "client",
        "select",
        "auth",
        "info",
    ];
    Ok(info
        .lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let command = name.split('|').next()?;
            if !CLIENT_COMMANDS.contains(&command) {
                return None;
            }
            stats
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum())
}

/// One pair of plain store operations with no lock logic: what an acquire + release costs at
/// least on this store, through the same client library and settings.
struct FloorPair {
    what: &'static str,
    pair: Box<dyn FnMut() -> futures::future::BoxFuture<'static, anyhow::Result<()>> + Send>,
}

/// The floor of a backend, where there is one.
async fn floor_pair(url: &str, backend: &str) -> anyhow::Result<Option<FloorPair>> {
    Ok(match backend {
        "sqlite" => Some(sqlite_floor(url)?),
        "redis" => Some(redis_floor(url).await?),
        "redlock" => Some(one_node_of(url).await?),
        _ => None,
    })
}

/// The Redis floor: `SET NX PX` + `DEL`, the two plain round trips an acquire + release needs
/// at least, through a multiplexed redis-rs connection as the backend's.
async fn redis_floor(url: &str) -> anyhow::Result<FloorPair> {
    let server = redis_server(url).context("not a redis URL")?;
    let conn = redis::aio::ConnectionManager::new(redis::Client::open(server)?).await?;
    let key = unique_name("floor");
    Ok(FloorPair {
        what: "redis-rs SET NX PX + DEL round-trip pairs",
        pair: Box::new(move || {
            let (mut conn, key) = (conn.clone(), key.clone());
            Box::pin(async move {
                let _: Option<String> = redis::cmd("SET")
                    .arg(&key)
                    .arg("token")
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000)
                    .query_async(&mut conn)
                    .await?;
                let _: i64 = redis::cmd("DEL").arg(&key).query_async(&mut conn).await?;
                Ok(())
            })
        }),
    })
}

/// Redlock's reference: the same acquire + release on the first node alone, as `redis://`.
async fn one_node_of(url: &str) -> anyhow::Result<FloorPair> {
    let config = dlock::redlock::RedlockConfig::from_url(url)?;
    let node = config.nodes.first().context("no node")?;
    let locks = dlock::connect(&node.server).await?;
    let name = unique_name("one-node");
    Ok(FloorPair {
        what: "the same acquire+release on one of the nodes (redis://)",
        pair: Box::new(move || {
            let (locks, name) = (locks.clone(), name.clone());
            Box::pin(async move { lock_pair(&locks, &name).await })
        }),
    })
}

/// A scratch SQLite database beside the lock file, removed on drop.
struct Scratch {
    conn: rusqlite::Connection,
    path: std::path::PathBuf,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut path = self.path.clone().into_os_string();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The SQLite floor: two write transactions of the same shape as an acquire and a release, on
/// a scratch database with the backend's settings (WAL, synchronous=NORMAL).
fn sqlite_floor(url: &str) -> anyhow::Result<FloorPair> {
    let config = dlock::sqlite::SqliteConfig::from_url(url)?;
    let mut path = config.path.clone().into_os_string();
    path.push(format!(".floor-{}", std::process::id()));
    let path = std::path::PathBuf::from(path);
    let conn = rusqlite::Connection::open(&path)?;
    let scratch = Scratch { conn, path };
    let _: String = scratch
        .conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    scratch.conn.pragma_update(None, "synchronous", "NORMAL")?;
    scratch.conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS t (name TEXT PRIMARY KEY, fence INTEGER NOT NULL, token TEXT) WITHOUT ROWID",
    )?;
    let scratch = std::sync::Mutex::new(scratch);
    Ok(FloorPair {
        what: "SQLite write-transaction pairs",
        pair: Box::new(move || {
            let done = (|| -> anyhow::Result<()> {
                let scratch = scratch.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                scratch
                    .conn
                    .prepare_cached(
                        "INSERT INTO t VALUES ('x', 1, 'a') ON CONFLICT (name) DO UPDATE SET fence = fence + 1, token = 'a'",
                    )?
                    .execute([])?;
                scratch
                    .conn
                    .prepare_cached("UPDATE t SET token = NULL WHERE name = 'x'")?
                    .execute([])?;
                Ok(())
            })();
            Box::pin(async move { done })
        }),
    })
}

/// Counts the renewals that reach the store, by wrapping every lease.
#[derive(Debug)]
struct Counting {
    inner: dlock::DynBackend,
    extends: Arc<AtomicU64>,
}

#[derive(Debug)]
struct CountingLease {
    inner: Arc<dyn dlock::Lease>,
    extends: Arc<AtomicU64>,
}

#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl dlock::Backend for Counting {
    fn info(&self) -> &dlock::BackendInfo {
        self.inner.info()
    }

    async fn acquire(
        &self,
        req: &dlock::AcquireRequest,
    ) -> dlock::Result<Option<Arc<dyn dlock::Lease>>> {
        Ok(self.inner.acquire(req).await?.map(|inner| {
            Arc::new(CountingLease {
                inner,
                extends: self.extends.clone(),
            }) as Arc<dyn dlock::Lease>
        }))
    }

    fn monitor(&self) -> Option<&dyn dlock::MonitorStore> {
        self.inner.monitor()
    }

    async fn try_acquire_all(
        &self,
        _reqs: &[dlock::AcquireRequest],
    ) -> Option<dlock::Result<Option<Vec<Arc<dyn dlock::Lease>>>>> {
        None // counted one by one
    }

    fn values(&self) -> Option<&dyn dlock::ValueStore> {
        self.inner.values()
    }
}

#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl dlock::Lease for CountingLease {
    fn fence(&self) -> dlock::FencingToken {
        self.inner.fence()
    }

    fn lost(&self) -> &tokio_util::sync::CancellationToken {
        self.inner.lost()
    }

    fn lease_start(&self) -> tokio::time::Instant {
        self.inner.lease_start()
    }

    async fn extend(&self, ttl: Duration) -> dlock::Result<()> {
        self.extends.fetch_add(1, Ordering::Relaxed);
        self.inner.extend(ttl).await
    }

    async fn release(&self) -> dlock::Result<()> {
        self.inner.release().await
    }
}

/// User + system CPU time of this process.
fn cpu_time() -> Duration {
    let ticks = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| {
            let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
            // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after ')'.
            Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
        })
        .unwrap_or(0);
    // The kernel's USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

/// Resident memory of this process, MiB.
fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|statm| statm.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map_or(0.0, |pages| pages * 4096.0 / (1024.0 * 1024.0))
}

async fn watchdog(url: &str, args: &BenchArgs) -> anyhow::Result<WatchdogScale> {
    let base = dlock::connect(url).await?;
    let extends = Arc::new(AtomicU64::new(0));
    let locks = dlock::Locks::new(Counting {
        inner: base.backend().clone(),
        extends: extends.clone(),
    })
    .with_watchdog_lease(args.lease)?;
    let (mut rates, mut cpus, mut rss) = (Vec::new(), Vec::new(), Vec::new());
    let mut lost = 0;
    for _ in 0..args.repeat.max(1) {
        let prefix = unique_name("watchdog");
        let rss_before = rss_mib();
        let mut guards = Vec::with_capacity(args.held as usize);
        for i in 0..args.held {
            guards.push(locks.mutex(format!("{prefix}/{i}")).acquire().await?);
        }
        // Let the first renewals spread out, then measure a steady stretch.
        tokio::time::sleep(args.lease / 3).await;
        let (count0, cpu0, t0) = (extends.load(Ordering::Relaxed), cpu_time(), Instant::now());
        tokio::time::sleep(args.duration).await;
        let elapsed = t0.elapsed().as_secs_f64();
        rates.push((extends.load(Ordering::Relaxed) - count0) as f64 / elapsed);
        cpus.push(100.0 * (cpu_time() - cpu0).as_secs_f64() / elapsed);
        rss.push(rss_mib() - rss_before);
        lost += guards.iter().filter(|g| g.is_lost()).count() as u64;
        for guard in guards {
            guard.release().await?;
        }
    }
    Ok(WatchdogScale {
        held: args.held,
        lease_ms: args.lease.as_secs_f64() * 1e3,
        renewals_per_sec: Spread::of(rates),
        cpu_percent: Spread::of(cpus),
        rss_growth_mib: Spread::of(rss),
        lost,
    })
}
