//! Uncontended acquire + release: one task, one name, in a loop.

use std::time::{Duration, Instant};

use crate::floor::FloorPair;
use crate::peer::peer_pairs;
use crate::results::{Floor, Uncontended};
use crate::stats::{Spread, summarize};
use crate::{BenchArgs, unique_name};

/// Pairs measured per block; lock and floor blocks alternate, so both see the same machine.
const BLOCK: u32 = 100;

/// One acquire + release of `name`.
pub(crate) async fn lock_pair(locks: &dlock::Locks, name: &str) -> anyhow::Result<()> {
    locks
        .mutex(name)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?
        .release()
        .await?;
    Ok(())
}

/// Pairs/s, p50 and p99 of each run, as three lists.
#[derive(Default)]
pub(crate) struct Runs([Vec<f64>; 3]);

impl Runs {
    pub(crate) fn push(&mut self, latencies: Vec<f64>) -> f64 {
        let (rate, p50, p99) = summarize(latencies);
        self.0[0].push(rate);
        self.0[1].push(p50);
        self.0[2].push(p99);
        rate
    }

    pub(crate) fn spreads(self) -> [Spread; 3] {
        self.0.map(Spread::of)
    }
}

/// dlock's uncontended pairs, with each floor's (the floor first, then the references)
/// measured in blocks alternating with the lock's.
pub(crate) async fn uncontended(
    locks: &dlock::Locks,
    mut floors: Vec<FloorPair>,
    args: &BenchArgs,
) -> anyhow::Result<(Uncontended, Vec<Floor>)> {
    let name = unique_name("uncontended");
    // Warm-up: connection, scripts or prepared statements, page cache.
    for _ in 0..50 {
        lock_pair(locks, &name).await?;
        for floor in &mut floors {
            (floor.pair)().await?;
        }
    }
    let mut lock_runs = Runs::default();
    let mut floor_runs: Vec<Runs> = floors.iter().map(|_| Runs::default()).collect();
    // Per floor, the lock's rate over the floor's, run by run.
    let mut ratios: Vec<Vec<f64>> = floors.iter().map(|_| Vec::new()).collect();
    for _ in 0..args.repeat.max(1) {
        let mut lock_latencies = Vec::with_capacity(args.pairs as usize);
        let mut floor_latencies: Vec<Vec<f64>> = floors
            .iter()
            .map(|_| Vec::with_capacity(args.pairs as usize))
            .collect();
        while lock_latencies.len() < args.pairs as usize {
            for _ in 0..BLOCK.min(args.pairs) {
                let t = Instant::now();
                lock_pair(locks, &name).await?;
                lock_latencies.push(t.elapsed().as_secs_f64() * 1e6);
            }
            for (floor, latencies) in floors.iter_mut().zip(&mut floor_latencies) {
                for _ in 0..BLOCK.min(args.pairs) {
                    let t = Instant::now();
                    (floor.pair)().await?;
                    latencies.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
        }
        let rate = lock_runs.push(lock_latencies);
        for ((runs, latencies), ratios) in
            floor_runs.iter_mut().zip(floor_latencies).zip(&mut ratios)
        {
            ratios.push(rate / runs.push(latencies));
        }
    }
    let [pairs_per_sec, p50_us, p99_us] = lock_runs.spreads();
    let floors: Vec<Floor> = floors
        .iter()
        .zip(floor_runs)
        .zip(ratios)
        .map(|((floor, runs), ratios)| {
            let [pairs_per_sec, p50_us, p99_us] = runs.spreads();
            Floor {
                what: floor.what.to_owned(),
                pairs_per_sec,
                p50_us,
                p99_us,
                lock_ratio: Some(Spread::of(ratios)),
            }
        })
        .collect();
    Ok((
        Uncontended {
            pairs: args.pairs,
            pairs_per_sec,
            p50_us,
            p99_us,
            ratio_to_floor: floors.first().and_then(|f| f.lock_ratio.clone()),
        },
        floors,
    ))
}

/// A peer's uncontended pairs: one peer process per run.
pub(crate) async fn peer_uncontended(
    peer: &[String],
    url: &str,
    args: &BenchArgs,
) -> anyhow::Result<Uncontended> {
    let mut runs = Runs::default();
    for _ in 0..args.repeat.max(1) {
        runs.push(peer_pairs(peer, url, args.pairs).await?);
    }
    let [pairs_per_sec, p50_us, p99_us] = runs.spreads();
    Ok(Uncontended {
        pairs: args.pairs,
        pairs_per_sec,
        p50_us,
        p99_us,
        ratio_to_floor: None,
    })
}
