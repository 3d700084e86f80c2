//! Cancellation: a dropped acquire future never strands a lock.

use std::time::Duration;

use anyhow::ensure;
use rand::Rng;

use super::primitive::{EVERY, spawn_waiter};
use super::{Ctx, Needs, cases};

cases!["cancel",
    Needs::Any, EVERY =>
        dropping_a_waiting_acquire_leaves_nothing_held,
        dropping_an_acquire_at_any_point_leaves_nothing_held;
    Needs::Any =>
        dropping_a_multi_lock_acquire_at_any_point_leaves_nothing_held
];

async fn dropping_a_waiting_acquire_leaves_nothing_held(cx: Ctx) -> anyhow::Result<()> {
    let (a, b, c) = (cx.locks().await?, cx.locks().await?, cx.locks().await?);
    let name = cx.name("waited");
    let holder = cx.lock(&a, &name).acquire().await?;
    let waiter = spawn_waiter(&cx, &b, &name, |m| m.ttl(Duration::from_secs(600)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    waiter.abort();
    ensure!(
        waiter.await.is_err_and(|e| e.is_cancelled()),
        "waiter finished instead of being cancelled"
    );
    holder.release().await?;
    // If the cancelled waiter had taken the lock, it would hold it for 600 s.
    let next = cx
        .lock(&c, &name)
        .wait(Duration::from_secs(10))
        .acquire()
        .await;
    let next = match next {
        Ok(next) => next,
        Err(e) => anyhow::bail!("{e}; {}", holders(&cx, &c, &name).await),
    };
    next.release().await?;
    Ok(())
}

async fn dropping_an_acquire_at_any_point_leaves_nothing_held(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("raced");
    let (mut dropped, mut granted) = (0, 0);
    for _ in 0..cx.rounds(40, 15) {
        // b holds the lock and lets go at a random moment; a gives up at another random
        // moment, so a's acquire is dropped while waiting, while being woken, or while granted.
        let holder = cx
            .lock(&b, &name)
            .ttl(Duration::from_secs(600))
            .acquire()
            .await?;
        let release_after = Duration::from_micros(rand::rng().random_range(0..3000));
        let give_up_after = Duration::from_micros(rand::rng().random_range(0..4000));
        let releasing = tokio::spawn(async move {
            tokio::time::sleep(release_after).await;
            holder.release().await
        });
        let attempt = cx.lock(&a, &name).ttl(Duration::from_secs(600)).acquire();
        match tokio::time::timeout(give_up_after, attempt).await {
            Ok(guard) => {
                granted += 1;
                guard?.release().await?;
            }
            Err(_) => dropped += 1,
        }
        releasing.await??;
        // Whatever point the drop hit, the lock must be free again well inside its 600 s TTL.
        let check = cx
            .lock(&b, &name)
            .ttl(Duration::from_secs(600))
            .wait(Duration::from_secs(10))
            .acquire()
            .await;
        let check = match check {
            Ok(check) => check,
            Err(e) => anyhow::bail!(
                "{e} ({dropped} dropped, {granted} granted before); {}",
                holders(&cx, &b, &name).await
            ),
        };
        check.release().await?;
    }
    ensure!(
        dropped > 0,
        "no acquire was dropped: the case tested nothing ({granted} granted)"
    );
    Ok(())
}

/// A multi-lock acquire dropped at any point (before, during or after the store's one-step
/// grant of every lock) leaves none of its locks held.
async fn dropping_a_multi_lock_acquire_at_any_point_leaves_nothing_held(
    cx: Ctx,
) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let names = [cx.name("multi-x"), cx.name("multi-y"), cx.name("multi-z")];
    let mut dropped = 0;
    for i in 0..30u64 {
        let (polls, pause) = ((i % 5 + 1) as usize, Duration::from_micros(i / 5 * 300));
        let attempt = a
            .multi_lock(names.clone())
            .ttl(Duration::from_secs(600))
            .acquire();
        match super::drop_after_polls(attempt, polls, pause).await {
            Some(guard) => guard?.release().await?,
            None => dropped += 1,
        }
        for name in &names {
            let next = cx
                .lock(&b, name)
                .ttl(Duration::from_secs(600))
                .wait(Duration::from_secs(10))
                .acquire()
                .await
                .map_err(|e| anyhow::anyhow!("round {i}: {name} stayed held: {e}"))?;
            next.release().await?;
        }
    }
    ensure!(
        dropped > 0,
        "no multi-lock acquire was dropped: the case tested nothing"
    );
    Ok(())
}

/// Who holds `name` and the parts a composed primitive keeps under it (a semaphore's slot and
/// gate), as inspection sees them: what a failure reports, so that a lock left held says by
/// whom (a dlock holder with its fence, or a connection that is none).
async fn holders(cx: &Ctx, locks: &dlock::Locks, name: &str) -> String {
    let mut names = vec![name.to_owned()];
    if cx.primitive() == super::Primitive::Semaphore1 {
        names.extend([format!("{name}#p0of1"), format!("{name}#pgate")]);
    }
    let mut seen = Vec::new();
    for name in names {
        match locks.inspect(&name).await {
            Ok(Some(info)) => seen.push(format!("{name} held: {info:?}")),
            Ok(None) => seen.push(format!("{name} free")),
            Err(error) => seen.push(format!("{name} not inspected: {error}")),
        }
    }
    seen.join("; ")
}
