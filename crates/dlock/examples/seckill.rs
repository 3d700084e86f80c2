//! A flash sale: buyers race for a limited stock. Each purchase takes the item's lock, reads
//! the stock and writes it back lower with compare-and-set; nothing is ever oversold.
//! (`dlock demo seckill` runs the same over many OS processes and measures it.)
//!
//! `cargo run -p dlock-rs --example seckill [URL]` (default: a SQLite file in the temp dir)

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;

const STOCK: u64 = 50;
const BUYERS: u64 = 400;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::args().nth(1).unwrap_or_else(|| {
        let path = std::env::temp_dir().join("dlock-example.db");
        format!("sqlite://{}", path.display())
    });
    let locks = dlock::connect(&url).await?;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let (lock, stock) = (format!("seckill/{run}"), format!("seckill/{run}/stock"));
    locks.value(&stock).set(STOCK.to_string()).await?;

    let sold = Arc::new(AtomicU64::new(0));
    let mut buyers = tokio::task::JoinSet::new();
    for _ in 0..BUYERS {
        let (locks, lock, stock, sold) = (locks.clone(), lock.clone(), stock.clone(), sold.clone());
        buyers.spawn(async move {
            let guard = locks
                .mutex(&lock)
                .ttl(Duration::from_secs(10))
                .acquire()
                .await?;
            // One attempt at the version read: if the lock were ever broken, this write would
            // fail with `Conflict` instead of overselling. Sold out: nothing is written.
            let written = locks
                .value(&stock)
                .max_attempts(1)
                .update(|current| {
                    let left: u64 = std::str::from_utf8(current?).ok()?.parse().ok()?;
                    (left > 0).then(|| (left - 1).to_string().into_bytes())
                })
                .await?;
            if written.is_some() {
                sold.fetch_add(1, Ordering::Relaxed);
            }
            guard.release().await?;
            anyhow::Ok(())
        });
    }
    while let Some(buyer) = buyers.join_next().await {
        buyer??;
    }
    let left = locks
        .value(&stock)
        .get()
        .await?
        .context("stock was never set")?
        .value;
    let sold = sold.load(Ordering::Relaxed);
    println!(
        "sold {sold} of {STOCK}, {} left, oversold {}",
        String::from_utf8(left)?,
        sold.saturating_sub(STOCK)
    );
    Ok(())
}
