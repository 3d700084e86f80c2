//! What one `dlock bench` invocation measured: the JSON it writes with `--json`, and what
//! `dlock bench --report` reads back to write BENCHMARKS.md and the charts.

use serde::{Deserialize, Serialize};

use crate::stats::Spread;

/// Everything one `dlock bench` invocation measured.
#[derive(Debug, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Report {
    /// The client library measured: `dlock`, or the peer's label (`--library`).
    #[serde(default = "dlock_library")]
    pub library: String,
    /// The store's backend name (`redis`, `sqlite`, `zookeeper`…).
    pub backend: String,
    /// Where and how it ran.
    #[serde(default)]
    pub environment: Environment,
    /// Uncontended results, if run.
    pub uncontended: Option<Uncontended>,
    /// Hand-off results, if run.
    pub handoff: Option<Handoff>,
    /// The floor, if run (in reports of older versions, Redlock's was its one node).
    pub floor: Option<Floor>,
    /// Measured beside the floor, the same way: Redlock's one node, etcd's floor with a lease
    /// granted per pair.
    #[serde(default)]
    pub references: Vec<Floor>,
    /// Many distinct locks with concurrent tasks, if run.
    #[serde(default)]
    pub many: Option<ManyLocks>,
    /// The watchdog scale, if run.
    pub watchdog: Option<WatchdogScale>,
}

fn dlock_library() -> String {
    "dlock".to_owned()
}

/// Where and how a run happened: the CPU placement and how busy the machine was.
#[derive(Debug, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Environment {
    /// CPUs the bench process may run on (`Cpus_allowed_list`), e.g. `0` when pinned.
    pub client_cpus: String,
    /// CPUs of the store's server, as the caller placed it (`--server-cpus`), if known.
    pub server_cpus: Option<String>,
    /// Online CPUs of the machine.
    pub cpus: usize,
    /// Runtime threads of the bench (`--threads`).
    pub threads: usize,
    /// 1-minute load average when the run started.
    pub load_start: f64,
    /// 1-minute load average when the run ended.
    pub load_end: f64,
    /// Unix time (s) the run started.
    pub started_unix_s: u64,
    /// Runs per scenario.
    pub repeat: u32,
    /// Size of the program that ran the bench (the `dlock` binary), bytes. Absent in reports
    /// of older versions.
    #[serde(default)]
    pub binary_bytes: Option<u64>,
}

/// Results of the uncontended scenario.
#[derive(Debug, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Uncontended {
    /// Acquire+release pairs per run.
    #[serde(default)]
    pub pairs: u32,
    /// Acquire+release pairs per second.
    pub pairs_per_sec: Spread,
    /// Median pair latency, µs.
    pub p50_us: Spread,
    /// 99th percentile pair latency, µs.
    pub p99_us: Spread,
    /// Pairs per second as a fraction of the floor's, run by run (blocks of the two
    /// alternate, so both see the same machine).
    pub ratio_to_floor: Option<Spread>,
    /// CPU time per pair, µs, of the bench process and of the store's server. Absent in
    /// reports of older versions and for peers.
    #[serde(default)]
    pub cpu: Option<CpuPerPair>,
}

/// CPU time one pair costs, µs: of the process that runs it (every thread, so the lease
/// keeper and a SQLite worker count too) and of the store's server (when its processes were
/// given with `--server-pids`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CpuPerPair {
    /// The bench process.
    pub client_us: Spread,
    /// The store's server processes and their children.
    #[serde(default)]
    pub server_us: Option<Spread>,
}

/// Results of the hand-off scenario.
#[derive(Debug, Serialize, Deserialize)]
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
    /// The gaps where the lock changed hands (one worker's release to another worker's
    /// acquisition), µs: a polling library's re-acquisitions by the same worker are fast and
    /// would hide how long the others wait. Absent in reports of older versions.
    #[serde(default)]
    pub holder_gaps: Option<HolderGaps>,
    /// Jain's fairness index over per-worker acquisition counts (1 = perfectly even).
    pub fairness: Spread,
    /// Longest single wait for the lock, ms.
    pub worst_wait_ms: Spread,
    /// Commands sent to the store per acquisition, by every client together (Redis, from
    /// `INFO commandstats`, so the server must be the benchmark's alone; commands a script
    /// runs inside are not counted).
    pub store_commands_per_acquisition: Option<Spread>,
    /// The gap distribution over all runs together, µs, at [`crate::QUANTILES`].
    #[serde(default)]
    pub gap_quantiles_us: Vec<f64>,
}

/// The gaps from one holder's release to the next (different) holder's acquisition, µs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[non_exhaustive]
pub struct HolderGaps {
    /// Median gap.
    pub p50_us: Spread,
    /// 99th percentile gap.
    pub p99_us: Spread,
    /// Longest gap.
    pub max_us: Spread,
    /// How many times the lock changed hands in a run. Absent in reports of older versions.
    #[serde(default)]
    pub count: Option<Spread>,
    /// The share of acquisitions (after the first of a run) that went to the worker that had
    /// just released the lock: those gaps are left out above. Absent in reports of older
    /// versions.
    #[serde(default)]
    pub retake_share: Option<Spread>,
}

/// Results of the floor scenario: store operations of the same kind as an acquire + release,
/// with no lock logic, through the backend's client library and settings (see `what`), or a
/// reference measured the same way.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Floor {
    /// What a pair is.
    pub what: String,
    /// Pairs per second.
    pub pairs_per_sec: Spread,
    /// Median pair latency, µs.
    pub p50_us: Spread,
    /// 99th percentile pair latency, µs.
    pub p99_us: Spread,
    /// The lock's pairs/s over this one's, run by run (their blocks alternate). Absent in
    /// reports of older versions.
    #[serde(default)]
    pub lock_ratio: Option<Spread>,
    /// CPU time per pair, as the lock's ([`Uncontended::cpu`]).
    #[serde(default)]
    pub cpu: Option<CpuPerPair>,
}

/// Results of the many-locks scenario: C tasks of one process, each acquiring and releasing
/// names of its own, so nothing contends but the client and the store.
#[derive(Debug, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ManyLocks {
    /// One point per number of concurrent tasks.
    pub points: Vec<ManyPoint>,
}

/// Throughput and latency at one number of concurrent tasks.
#[derive(Debug, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ManyPoint {
    /// Concurrent tasks.
    pub tasks: u32,
    /// Acquire+release pairs per second, all tasks together.
    pub pairs_per_sec: Spread,
    /// Median pair latency, µs.
    pub p50_us: Spread,
    /// 99th percentile pair latency, µs.
    pub p99_us: Spread,
    /// The floor's pairs/s at the same concurrency (Redis: `SET NX PX` + `DEL` through one
    /// multiplexed redis-rs connection, as the backend's), if measured.
    #[serde(default)]
    pub floor_pairs_per_sec: Option<Spread>,
    /// The lock's pairs/s over the floor's, run by run (their runs alternate).
    #[serde(default)]
    pub ratio_to_floor: Option<Spread>,
    /// Redis server time per lock pair, µs (`INFO commandstats`: its scripts).
    #[serde(default)]
    pub server_us_per_pair: Option<Spread>,
    /// Redis server time per floor pair, µs (`SET` + `DEL`).
    #[serde(default)]
    pub floor_server_us_per_pair: Option<Spread>,
}

/// Results of the watchdog scenario.
#[non_exhaustive]
#[derive(Debug, Serialize, Deserialize)]
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
    /// Resident memory of the whole process while holding, MiB.
    #[serde(default)]
    pub rss_mib: Option<Spread>,
    /// `dlock serve` on the same store while these locks are held (when the bench runs as
    /// `dlock bench`, whose binary serves).
    #[serde(default)]
    pub serve: Option<ServeScrape>,
    /// Locks lost while held (must be 0).
    pub lost: u64,
}

/// `dlock serve` scraped while the watchdog scenario's locks are held: how long `/metrics` and
/// `/api/locks` take to answer with every lock in them, how big they are, and serve's memory.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ServeScrape {
    /// Time to answer `/metrics`, ms (the store's listing included).
    pub metrics_ms: Spread,
    /// Size of the `/metrics` answer, bytes (the last scrape).
    pub metrics_bytes: u64,
    /// Time to answer `/api/locks`, ms.
    pub api_ms: Spread,
    /// Size of the `/api/locks` answer, bytes (the last request).
    pub api_bytes: u64,
    /// Locks in the last `/api/locks` answer (the held ones, when nothing else holds).
    pub listed: u64,
    /// Resident memory of the `dlock serve` process after the scrapes, MiB.
    pub rss_mib: f64,
}
