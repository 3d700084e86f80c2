//! Contended hand-off: P worker processes take one name again and again, each holding it H.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::peer::Client;
use crate::redis_stats::{redis_commands, redis_server};
use crate::results::{Handoff, HolderGaps};
use crate::stats::{Spread, jain, percentile, quantiles};
use crate::{BenchArgs, unique_name};

/// One hold as a worker reports it: `acquired_ns released_ns waited_ns`.
struct Hold {
    worker: usize,
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

/// One dlock hand-off worker (`dlock bench --worker NAME`): prints one line per hold.
pub(crate) async fn worker(
    url: &str,
    name: &str,
    duration: Duration,
    hold: Duration,
) -> anyhow::Result<()> {
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
        let released = now_ns();
        guard.release().await?;
        lines.push(format!("{acquired} {released} {}", acquired - asked));
    }
    println!("{}", lines.join("\n"));
    Ok(())
}

/// The gaps between consecutive holds, µs and sorted, split by whether the lock changed
/// hands: a worker re-taking the lock it just released is fast and would flatter a library
/// whose releasers win again, so hand-off figures come from `handoffs` alone.
#[derive(Debug, Default, PartialEq)]
struct GapSplit {
    /// One worker's release to another worker's acquisition.
    handoffs: Vec<f64>,
    /// One worker's release to its own next acquisition.
    retakes: Vec<f64>,
}

impl GapSplit {
    /// `holds` in acquisition order.
    fn of(holds: &[Hold]) -> GapSplit {
        let mut split = GapSplit::default();
        for w in holds.windows(2) {
            let gap = (w[1].acquired.saturating_sub(w[0].released)) as f64 / 1e3;
            if w[0].worker == w[1].worker {
                split.retakes.push(gap);
            } else {
                split.handoffs.push(gap);
            }
        }
        split.handoffs.sort_by(f64::total_cmp);
        split.retakes.sort_by(f64::total_cmp);
        split
    }

    /// The share of gaps that were re-takes (NaN without gaps).
    fn retake_share(&self) -> f64 {
        let all = self.handoffs.len() + self.retakes.len();
        if all == 0 {
            return f64::NAN;
        }
        self.retakes.len() as f64 / all as f64
    }

    /// Every gap, sorted.
    fn all(&self) -> Vec<f64> {
        let mut all: Vec<f64> = self.handoffs.iter().chain(&self.retakes).copied().collect();
        all.sort_by(f64::total_cmp);
        all
    }
}

/// Runs the hand-off `args.repeat` times with `client`'s workers.
pub(crate) async fn handoff(
    url: &str,
    client: &Client,
    args: &BenchArgs,
) -> anyhow::Result<Handoff> {
    let mut m: [Vec<f64>; 6] = Default::default();
    // Hand-off gaps between different holders: p50, p99, max, count; and the re-take share.
    let mut h: [Vec<f64>; 5] = Default::default();
    let mut commands_per_acquisition = Vec::new();
    let mut all_gaps = Vec::new();
    let redis = redis_server(url);
    for _ in 0..args.repeat.max(1) {
        let name = unique_name("handoff");
        let commands_before = match &redis {
            Some(server) => Some(redis_commands(server, &args.count_commands).await?),
            None => None,
        };
        let mut children = Vec::new();
        for _ in 0..args.processes {
            let child = client
                .worker(url, &name, args.duration, args.hold)?
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
                if let [acquired, released, waited] = fields[..] {
                    holds.push(Hold {
                        worker,
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
            let spent = redis_commands(server, &args.count_commands)
                .await?
                .saturating_sub(before + 1);
            commands_per_acquisition.push(spent as f64 / holds.len().max(1) as f64);
        }
        // Holds never overlap under a working lock, so acquisition order is time order.
        holds.sort_by_key(|h| h.acquired);
        if holds.len() < 2 {
            bail!("only {} acquisitions in a hand-off run", holds.len());
        }
        let span_s = (holds[holds.len() - 1].released - holds[0].acquired) as f64 / 1e9;
        let split = GapSplit::of(&holds);
        let gaps = split.all();
        let handoffs = split.handoffs.len();
        if let Some(&longest) = split.handoffs.last() {
            h[0].push(percentile(&split.handoffs, 0.50));
            h[1].push(percentile(&split.handoffs, 0.99));
            h[2].push(longest);
        }
        h[3].push(handoffs as f64);
        h[4].push(split.retake_share());
        let mut counts = vec![0f64; args.processes as usize];
        for h in &holds {
            counts[h.worker] += 1.0;
        }
        let worst = holds.iter().map(|h| h.waited).max().unwrap_or(0) as f64 / 1e6;
        m[0].push(holds.len() as f64 / span_s);
        m[1].push(handoffs as f64 / span_s);
        m[2].push(percentile(&gaps, 0.50));
        m[3].push(percentile(&gaps, 0.99));
        m[4].push(jain(&counts));
        m[5].push(worst);
        all_gaps.extend(gaps);
    }
    all_gaps.sort_by(f64::total_cmp);
    let [rate, handoffs, p50, p99, fairness, worst] = m;
    Ok(Handoff {
        processes: args.processes,
        hold_ms: args.hold.as_secs_f64() * 1e3,
        acquisitions_per_sec: Spread::of(rate),
        handoffs_per_sec: Spread::of(handoffs),
        gap_p50_us: Spread::of(p50),
        gap_p99_us: Spread::of(p99),
        holder_gaps: (!h[0].is_empty()).then(|| {
            let [p50, p99, max, count, retake_share] = h;
            HolderGaps {
                p50_us: Spread::of(p50),
                p99_us: Spread::of(p99),
                max_us: Spread::of(max),
                count: Some(Spread::of(count)),
                retake_share: Some(Spread::of(retake_share)),
            }
        }),
        fairness: Spread::of(fairness),
        worst_wait_ms: Spread::of(worst),
        store_commands_per_acquisition: (!commands_per_acquisition.is_empty())
            .then(|| Spread::of(commands_per_acquisition)),
        gap_quantiles_us: quantiles(&all_gaps),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(worker: usize, acquired_us: u128, released_us: u128) -> Hold {
        Hold {
            worker,
            acquired: acquired_us * 1000,
            released: released_us * 1000,
            waited: 0,
        }
    }

    /// A worker that takes the lock straight back is not a hand-off: only the gaps before a
    /// different worker's acquisition count as hand-offs, the others as re-takes.
    #[test]
    fn gaps_split_into_handoffs_and_retakes() {
        let holds = [
            hold(0, 0, 10),
            hold(0, 11, 20),     // the same worker again, 1 µs later: a re-take
            hold(1, 120, 130),   // 100 µs after worker 0's release
            hold(2, 135, 140),   // 5 µs
            hold(2, 141, 150),   // the same worker again
            hold(0, 1150, 1160), // 1000 µs
        ];
        let split = GapSplit::of(&holds);
        assert_eq!(split.handoffs, vec![5.0, 100.0, 1000.0]);
        assert_eq!(split.retakes, vec![1.0, 1.0]);
        assert_eq!(split.retake_share(), 0.4);
        assert_eq!(split.all(), vec![1.0, 1.0, 5.0, 100.0, 1000.0]);
        let one_worker = GapSplit::of(&holds[..2]);
        assert!(one_worker.handoffs.is_empty());
        assert_eq!(one_worker.retake_share(), 1.0);
        assert!(GapSplit::of(&holds[..1]).retake_share().is_nan());
    }
}
