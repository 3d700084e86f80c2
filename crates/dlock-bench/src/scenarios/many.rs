//! Many distinct locks: C concurrent tasks of one process, each acquiring and releasing names
//! of its own, so nothing contends but the client, its connection and the store.

use std::time::Instant;

use futures::future::try_join_all;

use crate::results::{ManyLocks, ManyPoint};
use crate::scenarios::uncontended::lock_pair;
use crate::stats::{Spread, percentile};
use crate::{BenchArgs, unique_name};

/// Distinct names each task cycles through.
const NAMES_PER_TASK: usize = 8;

pub(crate) async fn many(locks: &dlock::Locks, args: &BenchArgs) -> anyhow::Result<ManyLocks> {
    let mut points = Vec::new();
    for &tasks in &args.tasks {
        let tasks = tasks.max(1);
        // Every task does its share of the pairs, so a run costs about the same at any C.
        let per_task = (args.pairs / tasks).max(10) as usize;
        let prefix = unique_name("many");
        let mut m: [Vec<f64>; 3] = Default::default();
        for run in 0..=args.repeat.max(1) {
            let start = Instant::now();
            let latencies = try_join_all((0..tasks).map(|task| {
                let prefix = &prefix;
                async move {
                    let mut latencies = Vec::with_capacity(per_task);
                    for i in 0..per_task {
                        let name = format!("{prefix}/{task}/{}", i % NAMES_PER_TASK);
                        let t = Instant::now();
                        lock_pair(locks, &name).await?;
                        latencies.push(t.elapsed().as_secs_f64() * 1e6);
                    }
                    anyhow::Ok(latencies)
                }
            }))
            .await?;
            let elapsed = start.elapsed().as_secs_f64();
            // Run 0 warms up the connections and the names.
            if run == 0 {
                continue;
            }
            let mut all: Vec<f64> = latencies.into_iter().flatten().collect();
            all.sort_by(f64::total_cmp);
            m[0].push(all.len() as f64 / elapsed);
            m[1].push(percentile(&all, 0.50));
            m[2].push(percentile(&all, 0.99));
        }
        let [rate, p50, p99] = m.map(Spread::of);
        points.push(ManyPoint {
            tasks,
            pairs_per_sec: rate,
            p50_us: p50,
            p99_us: p99,
        });
    }
    Ok(ManyLocks { points })
}
