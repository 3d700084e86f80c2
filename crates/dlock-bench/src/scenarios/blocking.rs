//! Uncontended acquire + release through the blocking facade (`dlock::blocking`): one thread,
//! one name, against the blocking floor (the same plain commands over a blocking connection of
//! the store's client library), in alternating blocks. Redis only: the floor is redis-rs's
//! blocking `SET NX PX` + `DEL`.

use std::time::{Duration, Instant};

use anyhow::Context;

use crate::floor::redis_floor_commands;
use crate::redis_stats::redis_server;
use crate::results::{Floor, Uncontended};
use crate::scenarios::uncontended::Runs;
use crate::stats::Spread;
use crate::{BenchArgs, unique_name};

/// Pairs measured per block, as in the uncontended scenario.
const BLOCK: u32 = 100;

/// What the blocking floor's pair is.
pub(crate) const FLOOR: &str = "redis-rs blocking connection: SET NX PX + DEL round-trip pairs";

/// The blocking facade's uncontended pairs and the blocking floor's, measured on a thread of
/// their own (the facade refuses to run on a runtime's threads).
///
/// # Errors
///
/// Not a Redis URL, or a lock or floor command failed.
pub(crate) async fn blocking(url: &str, args: &BenchArgs) -> anyhow::Result<(Uncontended, Floor)> {
    let server = redis_server(url).context("the blocking floor is Redis's only")?;
    let url = url.to_owned();
    let (pairs, repeat) = (args.pairs, args.repeat.max(1));
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = done.send(measure(&url, &server, pairs, repeat));
    });
    result.await.context("the blocking bench thread panicked")?
}

fn measure(
    url: &str,
    server: &str,
    pairs: u32,
    repeat: u32,
) -> anyhow::Result<(Uncontended, Floor)> {
    let locks = dlock::blocking::Locks::connect(url)?;
    let name = unique_name("blocking");
    let mut lock_pair = || -> anyhow::Result<()> {
        locks
            .mutex(&name)
            .ttl(Duration::from_secs(30))
            .acquire()?
            .release()?;
        Ok(())
    };
    let mut conn = redis::Client::open(server)?.get_connection()?;
    let key = unique_name("blocking-floor");
    let mut floor_pair = || -> anyhow::Result<()> {
        for command in redis_floor_commands(&key) {
            let _: redis::Value = command.query(&mut conn)?;
        }
        Ok(())
    };
    // Warm-up: connections, scripts.
    for _ in 0..50 {
        lock_pair()?;
        floor_pair()?;
    }
    let (mut lock_runs, mut floor_runs) = (Runs::default(), Runs::default());
    let mut ratios = Vec::new();
    for _ in 0..repeat {
        let mut lock_latencies = Vec::with_capacity(pairs as usize);
        let mut floor_latencies = Vec::with_capacity(pairs as usize);
        while lock_latencies.len() < pairs as usize {
            for (pair, latencies) in [
                (
                    &mut lock_pair as &mut dyn FnMut() -> anyhow::Result<()>,
                    &mut lock_latencies,
                ),
                (&mut floor_pair, &mut floor_latencies),
            ] {
                for _ in 0..BLOCK.min(pairs) {
                    let t = Instant::now();
                    pair()?;
                    latencies.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
        }
        let rate = lock_runs.push(lock_latencies);
        ratios.push(rate / floor_runs.push(floor_latencies));
    }
    let [pairs_per_sec, p50_us, p99_us] = lock_runs.spreads();
    let ratio = Spread::of(ratios);
    let [floor_pairs, floor_p50, floor_p99] = floor_runs.spreads();
    Ok((
        Uncontended {
            pairs,
            pairs_per_sec,
            p50_us,
            p99_us,
            ratio_to_floor: Some(ratio.clone()),
            cpu: None,
        },
        Floor {
            what: FLOOR.to_owned(),
            pairs_per_sec: floor_pairs,
            p50_us: floor_p50,
            p99_us: floor_p99,
            lock_ratio: Some(ratio),
            cpu: None,
        },
    ))
}
