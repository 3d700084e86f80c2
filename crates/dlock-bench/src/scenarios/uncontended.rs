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
struct Runs([Vec<f64>; 3]);

impl Runs {
    fn push(&mut self, latencies: Vec<f64>) -> f64 {
        let (rate, p50, p99) = summarize(latencies);
        self.0[0].push(rate);
        self.0[1].push(p50);
        self.0[2].push(p99);
        rate
    }

    fn spreads(self) -> [Spread; 3] {
        self.0.map(Spread::of)
    }
}

/// dlock's uncontended pairs, with the floor's (if any) measured in alternating blocks.
pub(crate) async fn uncontended(
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
    let (mut lock_runs, mut floor_runs) = (Runs::default(), Runs::default());
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
        let rate = lock_runs.push(lock_latencies);
        if floor.is_some() {
            ratios.push(rate / floor_runs.push(floor_latencies));
        }
    }
    let [pairs_per_sec, p50_us, p99_us] = lock_runs.spreads();
    Ok((
        Uncontended {
            pairs: args.pairs,
            pairs_per_sec,
            p50_us,
            p99_us,
            ratio_to_floor: (!ratios.is_empty()).then(|| Spread::of(ratios)),
        },
        floor.map(|floor| {
            let [pairs_per_sec, p50_us, p99_us] = floor_runs.spreads();
            Floor {
                what: floor.what.to_owned(),
                pairs_per_sec,
                p50_us,
                p99_us,
            }
        }),
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
