//! `dlock demo seckill`: a flash sale. Every purchase takes the item's lock, reads the stock
//! (a versioned value), and writes it back one lower with compare-and-set at the version read.
//! Under a working lock that write never conflicts; the oversold count must be 0.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use rand::Rng;
use serde::{Deserialize, Serialize};

use super::{percentile, run_prefix, run_workers};

#[derive(Debug, Args)]
pub(crate) struct SeckillArgs {
    /// Worker processes (tasks on memory://).
    #[arg(long, default_value_t = 16)]
    workers: u32,
    /// Units in stock, over all items.
    #[arg(long, default_value_t = 100)]
    stock: u64,
    /// Purchase attempts, spread over the workers.
    #[arg(long, default_value_t = 1000)]
    buyers: u64,
    /// Items the stock is split over, each with its own lock (the fine-grained variant; 1 is
    /// one lock for the whole stock).
    #[arg(long, default_value_t = 1)]
    items: u32,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Params {
    prefix: String,
    items: u32,
    buyers: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct Report {
    sold: u64,
    rejected: u64,
    /// Writes at a stale version while holding the lock: each one is a broken lock.
    conflicts: u64,
    /// Time to acquire the lock, per purchase, in microseconds.
    waits_us: Vec<u64>,
}

fn item_lock(prefix: &str, item: u32) -> String {
    format!("{prefix}/item-{item}")
}

fn item_stock(prefix: &str, item: u32) -> String {
    format!("{prefix}/item-{item}/stock")
}

fn decode(bytes: &[u8]) -> anyhow::Result<u64> {
    std::str::from_utf8(bytes)?
        .parse()
        .context("stock is not a number")
}

pub(super) async fn work(locks: &dlock::Locks, params: Params) -> anyhow::Result<Report> {
    let mut report = Report::default();
    for _ in 0..params.buyers {
        let item = rand::rng().random_range(0..params.items);
        let started = Instant::now();
        let guard = locks
            .mutex(item_lock(&params.prefix, item))
            .ttl(Duration::from_secs(10))
            .wait(Duration::from_secs(60))
            .acquire()
            .await?;
        report
            .waits_us
            .push(u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX));
        // One attempt, at the version read: under a working lock nobody else writes, so a
        // conflict here would mean the lock failed. A sold-out item declines to write.
        let stock = locks
            .value(item_stock(&params.prefix, item))
            .max_attempts(1);
        let mut unreadable = None;
        let outcome = stock
            .update(|current| {
                let left = match current.map(decode) {
                    Some(Ok(left)) => left,
                    Some(Err(error)) => {
                        unreadable = Some(error);
                        return None;
                    }
                    None => {
                        unreadable = Some(anyhow::anyhow!("stock was never set"));
                        return None;
                    }
                };
                (left > 0).then(|| (left - 1).to_string().into_bytes())
            })
            .await;
        if let Some(error) = unreadable {
            return Err(error);
        }
        match outcome {
            Ok(Some(_)) => report.sold += 1,
            Ok(None) => report.rejected += 1,
            Err(dlock::Error::Conflict { .. }) => report.conflicts += 1,
            Err(error) => return Err(error.into()),
        }
        guard.release().await?;
    }
    Ok(report)
}

pub(super) async fn run(url: &str, args: SeckillArgs) -> anyhow::Result<bool> {
    if args.workers == 0 || args.items == 0 || u64::from(args.items) > args.stock.max(1) {
        bail!("--workers and --items must be at least 1, and --items at most --stock");
    }
    let locks = dlock::connect(url).await?;
    let prefix = run_prefix("seckill");
    for item in 0..args.items {
        let share = args.stock / u64::from(args.items)
            + u64::from(u64::from(item) < args.stock % u64::from(args.items));
        locks
            .value(item_stock(&prefix, item))
            .set(share.to_string())
            .await?;
    }
    let params: Vec<Params> = (0..u64::from(args.workers))
        .map(|w| Params {
            prefix: prefix.clone(),
            items: args.items,
            buyers: args.buyers / u64::from(args.workers)
                + u64::from(w < args.buyers % u64::from(args.workers)),
        })
        .collect();
    println!(
        "seckill on {}: {} workers, {} buyers, stock {} over {} item(s)",
        locks.info().name,
        args.workers,
        args.buyers,
        args.stock,
        args.items
    );
    let started = Instant::now();
    let reports: Vec<Report> = run_workers(url, &locks, "seckill", params, |locks, p| async move {
        work(&locks, p).await
    })
    .await?;
    let elapsed = started.elapsed();
    let sold: u64 = reports.iter().map(|r| r.sold).sum();
    let rejected: u64 = reports.iter().map(|r| r.rejected).sum();
    let conflicts: u64 = reports.iter().map(|r| r.conflicts).sum();
    let mut remaining = 0;
    for item in 0..args.items {
        let value = locks.value(item_stock(&prefix, item)).get().await?;
        remaining += decode(&value.context("stock vanished")?.value)?;
    }
    let oversold = sold.saturating_sub(args.stock);
    let mut waits: Vec<Duration> = reports
        .iter()
        .flat_map(|r| r.waits_us.iter().map(|us| Duration::from_micros(*us)))
        .collect();
    waits.sort_unstable();
    println!("sold        {sold}");
    println!("rejected    {rejected}");
    println!("oversold    {oversold}");
    println!("left        {remaining}");
    println!("conflicts   {conflicts}  (stale writes under the lock; must be 0)");
    println!(
        "purchases/s {:.0}  ({} attempts in {:.2?})",
        args.buyers as f64 / elapsed.as_secs_f64(),
        args.buyers,
        elapsed
    );
    println!(
        "lock wait   p50 {:.2?}  p99 {:.2?}  max {:.2?}",
        percentile(&waits, 0.5),
        percentile(&waits, 0.99),
        percentile(&waits, 1.0)
    );
    let consistent = sold + remaining == args.stock && sold + rejected + conflicts == args.buyers;
    if !consistent {
        println!("INCONSISTENT: sold + left != stock, or attempts went missing");
    }
    Ok(oversold == 0 && conflicts == 0 && consistent)
}
