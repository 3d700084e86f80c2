//! Fair locks (FIFO waiters) and the starvation guard of unfair ones.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use tokio::sync::Mutex;

use super::{Ctx, Needs, cases, spawn_waiter};

cases!["fair",
    Needs::Fair =>
        fair_waiters_get_the_lock_in_arrival_order,
        fair_newcomer_does_not_pass_a_queued_waiter,
        cancelled_fair_waiter_does_not_stall_the_queue,
        unfair_waiter_is_not_starved_by_a_holder_in_a_loop;
    Needs::FairCrossProcess =>
        crashed_waiter_process_does_not_stall_the_queue
];

/// Long enough for a spawned waiter to have made its first attempt and queued.
const SETTLE: Duration = Duration::from_millis(300);

async fn fair_waiters_get_the_lock_in_arrival_order(cx: Ctx) -> anyhow::Result<()> {
    let name = cx.name("fifo");
    let holder = cx.locks().await?.mutex(&name).acquire().await?;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..4 {
        let (locks, name, order) = (cx.locks().await?, name.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let guard = locks
                .mutex(&name)
                .fair()
                .wait(Duration::from_secs(30))
                .acquire()
                .await?;
            order.lock().await.push(i);
            tokio::time::sleep(Duration::from_millis(20)).await;
            guard.release().await?;
            anyhow::Ok(())
        }));
        tokio::time::sleep(SETTLE).await;
    }
    holder.release().await?;
    for waiter in waiters {
        waiter.await??;
    }
    let order = order.lock().await;
    ensure!(
        *order == [0, 1, 2, 3],
        "served out of arrival order: {order:?}"
    );
    Ok(())
}

async fn fair_newcomer_does_not_pass_a_queued_waiter(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("no-barging");
    let holder = a.mutex(&name).acquire().await?;
    let waiter = spawn_waiter(&b, &name, |m| m.fair().wait(Duration::from_secs(30)));
    tokio::time::sleep(SETTLE).await;
    holder.release().await?;
    // Whether or not the waiter has woken yet, the lock is the waiter's, not the newcomer's.
    ensure!(
        a.mutex(&name).fair().try_acquire().await?.is_none(),
        "a newcomer passed a queued waiter"
    );
    let served = waiter.await??;
    served.release().await?;
    Ok(())
}

async fn cancelled_fair_waiter_does_not_stall_the_queue(cx: Ctx) -> anyhow::Result<()> {
    // A cancelled waiter that stayed queued would stall the next one until its entry went
    // stale (1 s on SQLite, refreshed every 250 ms): at least 750 ms after the cancel, every
    // time. A served waiter within 700 ms is proof it left at once. A loaded machine can be
    // slow by chance, so a round may be repeated; a waiter that never leaves fails them all.
    const ROUNDS: usize = 3;
    let (a, b, c) = (cx.locks().await?, cx.locks().await?, cx.locks().await?);
    for round in 1..=ROUNDS {
        let name = cx.name(&format!("cancelled-{round}"));
        let holder = a.mutex(&name).acquire().await?;
        let first = spawn_waiter(&b, &name, |m| m.fair());
        tokio::time::sleep(SETTLE).await;
        let mut second = spawn_waiter(&c, &name, |m| m.fair().wait(Duration::from_secs(30)));
        tokio::time::sleep(SETTLE).await;
        // `abort` only asks: a task in the middle of a poll finishes it, and if the release
        // landed before that poll's attempt, the waiter would end with the lock and keep it
        // in its JoinHandle. Wait until it has ended; the lock is held, so it ends cancelled.
        first.abort();
        ensure!(
            first.await.is_err_and(|e| e.is_cancelled()),
            "the fair waiter finished instead of being cancelled"
        );
        holder.release().await?;
        let (served, in_time) =
            match tokio::time::timeout(Duration::from_millis(700), &mut second).await {
                Ok(served) => (served??, true),
                Err(_) => (second.await??, false),
            };
        served.release().await?;
        if in_time {
            return Ok(());
        }
    }
    anyhow::bail!("the queue stalled behind a cancelled waiter in each of {ROUNDS} rounds")
}

async fn unfair_waiter_is_not_starved_by_a_holder_in_a_loop(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("starved");
    let stop = Instant::now() + Duration::from_secs(3);
    let greedy = tokio::spawn({
        let name = name.clone();
        async move {
            // Release and re-acquire at once, over and over: the pattern that starves waiters
            // of a naive lock.
            while Instant::now() < stop {
                let guard = a
                    .mutex(&name)
                    .ttl(Duration::from_secs(30))
                    .acquire()
                    .await?;
                tokio::time::sleep(Duration::from_millis(2)).await;
                guard.release().await?;
            }
            anyhow::Ok(())
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let waited = Instant::now();
    let guard = b
        .mutex(&name)
        .wait(Duration::from_secs(2))
        .acquire()
        .await
        .context("waiter starved")?;
    ensure!(waited.elapsed() < Duration::from_secs(2));
    guard.release().await?;
    greedy.await??;
    Ok(())
}

async fn crashed_waiter_process_does_not_stall_the_queue(cx: Ctx) -> anyhow::Result<()> {
    let url = cx.url()?;
    let name = cx.name("crashed-waiter");
    let locks = cx.locks().await?;
    let holder = locks.mutex(&name).acquire().await?;
    let mut crashed = crate::cli::dlock_command(&url)?
        .args(["hold", "--fair", &name])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    crashed.kill()?;
    crashed.wait()?;
    let next = cx.locks().await?;
    let waiter = spawn_waiter(&next, &name, |m| m.fair().wait(Duration::from_secs(30)));
    tokio::time::sleep(SETTLE).await;
    holder.release().await?;
    let served = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .context("the queue stalled behind a killed waiter")???;
    served.release().await?;
    Ok(())
}
