//! Uncontended acquire + release: one task, one name, in a loop.

use std::time::{Duration, Instant};

use crate::floor::FloorPair;
use crate::peer::peer_pairs;
use crate::results::{CpuPerPair, Floor, Uncontended};
use crate::stats::{Spread, summarize};
use crate::system::CpuMeter;
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

/// The CPU time of the pairs of one kind (the lock's, or one floor's) over a run.
#[derive(Default)]
struct CpuTally {
    client_ns: u64,
    server_ns: u64,
    /// Per run: client µs and server µs per pair.
    runs: [Vec<f64>; 2],
}

impl CpuTally {
    fn add(&mut self, client_ns: u64, server_ns: u64) {
        self.client_ns += client_ns;
        self.server_ns += server_ns;
    }

    /// Ends a run of `pairs` pairs.
    fn end_run(&mut self, pairs: usize) {
        let per_pair = |ns: u64| ns as f64 / 1e3 / pairs.max(1) as f64;
        self.runs[0].push(per_pair(std::mem::take(&mut self.client_ns)));
        self.runs[1].push(per_pair(std::mem::take(&mut self.server_ns)));
    }

    fn result(self, with_server: bool) -> CpuPerPair {
        let [client, server] = self.runs;
        CpuPerPair {
            client_us: Spread::of(client),
            server_us: with_server.then(|| Spread::of(server)),
        }
    }
}

/// Times `pairs` calls of `pair`, and the CPU they cost this process and the server.
async fn block<F: std::future::Future<Output = anyhow::Result<()>>>(
    pairs: u32,
    meters: &(CpuMeter, Option<CpuMeter>),
    latencies: &mut Vec<f64>,
    cpu: &mut CpuTally,
    mut pair: impl FnMut() -> F,
) -> anyhow::Result<()> {
    let read = |meters: &(CpuMeter, Option<CpuMeter>)| {
        (
            meters.0.read_ns(),
            meters.1.as_ref().map_or(0, CpuMeter::read_ns),
        )
    };
    let (client0, server0) = read(meters);
    for _ in 0..pairs {
        let t = Instant::now();
        pair().await?;
        latencies.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let (client1, server1) = read(meters);
    cpu.add(
        client1.saturating_sub(client0),
        server1.saturating_sub(server0),
    );
    Ok(())
}

/// dlock's uncontended pairs, with each floor's (the floor first, then the references)
/// measured in blocks alternating with the lock's; with each, the CPU time per pair of this
/// process and of the server processes `server_pids` (if any).
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
    // After the warm-up, so the server's children for these connections exist.
    let with_server = !args.server_pids.is_empty();
    let meters = (
        CpuMeter::this_process(),
        with_server.then(|| CpuMeter::processes(&args.server_pids)),
    );
    let mut lock_runs = Runs::default();
    let mut lock_cpu = CpuTally::default();
    let mut floor_runs: Vec<Runs> = floors.iter().map(|_| Runs::default()).collect();
    let mut floor_cpu: Vec<CpuTally> = floors.iter().map(|_| CpuTally::default()).collect();
    // Per floor, the lock's rate over the floor's, run by run.
    let mut ratios: Vec<Vec<f64>> = floors.iter().map(|_| Vec::new()).collect();
    for _ in 0..args.repeat.max(1) {
        let mut lock_latencies = Vec::with_capacity(args.pairs as usize);
        let mut floor_latencies: Vec<Vec<f64>> = floors
            .iter()
            .map(|_| Vec::with_capacity(args.pairs as usize))
            .collect();
        let size = BLOCK.min(args.pairs);
        while lock_latencies.len() < args.pairs as usize {
            block(size, &meters, &mut lock_latencies, &mut lock_cpu, || {
                lock_pair(locks, &name)
            })
            .await?;
            for ((floor, latencies), cpu) in floors
                .iter_mut()
                .zip(&mut floor_latencies)
                .zip(&mut floor_cpu)
            {
                block(size, &meters, latencies, cpu, &mut floor.pair).await?;
            }
        }
        lock_cpu.end_run(lock_latencies.len());
        let rate = lock_runs.push(lock_latencies);
        for (((runs, latencies), ratios), cpu) in floor_runs
            .iter_mut()
            .zip(floor_latencies)
            .zip(&mut ratios)
            .zip(&mut floor_cpu)
        {
            cpu.end_run(latencies.len());
            ratios.push(rate / runs.push(latencies));
        }
    }
    let [pairs_per_sec, p50_us, p99_us] = lock_runs.spreads();
    let floors: Vec<Floor> = floors
        .iter()
        .zip(floor_runs)
        .zip(ratios)
        .zip(floor_cpu)
        .map(|(((floor, runs), ratios), cpu)| {
            let [pairs_per_sec, p50_us, p99_us] = runs.spreads();
            Floor {
                what: floor.what.to_owned(),
                pairs_per_sec,
                p50_us,
                p99_us,
                lock_ratio: Some(Spread::of(ratios)),
                cpu: Some(cpu.result(with_server)),
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
            cpu: Some(lock_cpu.result(with_server)),
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
        cpu: None,
    })
}
