//! Many distinct locks: C concurrent tasks of one process, each acquiring and releasing names
//! of its own, so nothing contends but the client, its connection and the store. On Redis the
//! floor runs the same way (`SET NX PX` + `DEL` per pair, C tasks on one multiplexed
//! connection), its runs alternating with the lock's.

use std::time::Instant;

use futures::future::{BoxFuture, try_join_all};

use crate::floor::redis_floor_pair;
use crate::redis_stats::{redis_server, redis_usec};
use crate::results::{ManyLocks, ManyPoint};
use crate::scenarios::uncontended::lock_pair;
use crate::stats::{Spread, percentile};
use crate::{BenchArgs, unique_name};

/// The commands of a lock pair on Redis (scripts; their own commands are inside their time).
const LOCK_COMMANDS: &[&str] = &["evalsha", "eval"];
/// The commands of a floor pair.
const FLOOR_COMMANDS: &[&str] = &["set", "del"];

/// Distinct names each task cycles through.
const NAMES_PER_TASK: usize = 8;

/// One pair on a name: the lock's, or the floor's.
type Pair<'a> = &'a (dyn Fn(String) -> BoxFuture<'a, anyhow::Result<()>> + Sync);

/// Pairs/s, p50 and p99 of one run of `tasks` tasks doing `per_task` pairs each.
async fn one_run(
    pair: Pair<'_>,
    prefix: &str,
    tasks: u32,
    per_task: usize,
) -> anyhow::Result<[f64; 3]> {
    let start = Instant::now();
    let latencies = try_join_all((0..tasks).map(|task| async move {
        let mut latencies = Vec::with_capacity(per_task);
        for i in 0..per_task {
            let name = format!("{prefix}/{task}/{}", i % NAMES_PER_TASK);
            let t = Instant::now();
            pair(name).await?;
            latencies.push(t.elapsed().as_secs_f64() * 1e6);
        }
        anyhow::Ok(latencies)
    }))
    .await?;
    let elapsed = start.elapsed().as_secs_f64();
    let mut all: Vec<f64> = latencies.into_iter().flatten().collect();
    all.sort_by(f64::total_cmp);
    Ok([
        all.len() as f64 / elapsed,
        percentile(&all, 0.50),
        percentile(&all, 0.99),
    ])
}

pub(crate) async fn many(
    locks: &dlock::Locks,
    url: &str,
    backend: &str,
    args: &BenchArgs,
) -> anyhow::Result<ManyLocks> {
    let floor_conn = match (backend, redis_server(url)) {
        ("redis", Some(server)) => {
            Some(redis::aio::ConnectionManager::new(redis::Client::open(server)?).await?)
        }
        _ => None,
    };
    let lock: Pair<'_> = &|name: String| Box::pin(async move { lock_pair(locks, &name).await });
    let floor_pair = floor_conn.clone().map(|conn| {
        move |name: String| -> BoxFuture<'_, anyhow::Result<()>> {
            let mut conn = conn.clone();
            Box::pin(async move { redis_floor_pair(&mut conn, &name).await })
        }
    });
    let floor: Option<Pair<'_>> = floor_pair.as_ref().map(|pair| pair as Pair<'_>);
    // The server time of each run, read between runs on a connection of its own.
    let mut stats_conn = floor_conn;
    let mut points = Vec::new();
    for &tasks in &args.tasks {
        let tasks = tasks.max(1);
        // Every task does its share of the pairs, so a run costs about the same at any C.
        let per_task = (args.pairs / tasks).max(10) as usize;
        let prefix = unique_name("many");
        let floor_prefix = unique_name("many-floor");
        let mut m: [Vec<f64>; 3] = Default::default();
        let (mut floor_rates, mut ratios) = (Vec::new(), Vec::new());
        let (mut server_us, mut floor_server_us) = (Vec::new(), Vec::new());
        let pairs = (per_task * tasks as usize) as f64;
        // Run 0 warms up the connections and the names.
        for run in 0..=args.repeat.max(1) {
            let lock_before = match &mut stats_conn {
                Some(conn) => redis_usec(conn, LOCK_COMMANDS).await?,
                None => 0,
            };
            let [rate, p50, p99] = one_run(lock, &prefix, tasks, per_task).await?;
            let mut floor_rate = None;
            if let (Some(floor), Some(conn)) = (floor, &mut stats_conn) {
                let lock_after = redis_usec(conn, LOCK_COMMANDS).await?;
                let floor_before = redis_usec(conn, FLOOR_COMMANDS).await?;
                floor_rate = Some(one_run(floor, &floor_prefix, tasks, per_task).await?[0]);
                let floor_after = redis_usec(conn, FLOOR_COMMANDS).await?;
                if run > 0 {
                    server_us.push(lock_after.saturating_sub(lock_before) as f64 / pairs);
                    floor_server_us.push(floor_after.saturating_sub(floor_before) as f64 / pairs);
                }
            }
            if run == 0 {
                continue;
            }
            m[0].push(rate);
            m[1].push(p50);
            m[2].push(p99);
            if let Some(floor_rate) = floor_rate {
                floor_rates.push(floor_rate);
                ratios.push(rate / floor_rate);
            }
        }
        let [rate, p50, p99] = m.map(Spread::of);
        points.push(ManyPoint {
            tasks,
            pairs_per_sec: rate,
            p50_us: p50,
            p99_us: p99,
            floor_pairs_per_sec: (!floor_rates.is_empty()).then(|| Spread::of(floor_rates)),
            ratio_to_floor: (!ratios.is_empty()).then(|| Spread::of(ratios)),
            server_us_per_pair: (!server_us.is_empty()).then(|| Spread::of(server_us)),
            floor_server_us_per_pair: (!floor_server_us.is_empty())
                .then(|| Spread::of(floor_server_us)),
        });
    }
    Ok(ManyLocks { points })
}
