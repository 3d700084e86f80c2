//! Reentrant locks: hold counts kept in the store.

use std::time::Duration;

use anyhow::ensure;
use dlock::Error;

use super::{Ctx, Needs, cases, expect_err};

cases!["reentrant",
    Needs::Reentrant =>
        reentrant_hold_counts,
        reentrant_hold_count_expires_with_the_lease,
        two_tasks_of_one_client_never_both_hold_a_reentrant_lock,
        a_dropped_reentry_leaves_no_hold_count,
        reentry_after_a_loss_is_not_owned;
    Needs::Any =>
        reentry_needs_a_reentrant_hold;
    Needs::NotReentrant =>
        reentrant_is_unsupported_error
];

async fn reentrant_hold_counts(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("nested");
    let outer = a.mutex(&name).reentrant().acquire().await?;
    let inner = outer.reenter().await?;
    let held_fence = outer.fence();
    ensure!(
        held_fence == inner.fence(),
        "re-entry is the same hold, so the same fence"
    );
    if a.info().capabilities.monitor {
        let info = a
            .inspect(&name)
            .await?
            .ok_or_else(|| anyhow::anyhow!("not held"))?;
        ensure!(info.holds == 2, "holds = {}", info.holds);
    }
    ensure!(
        b.mutex(&name).reentrant().try_acquire().await?.is_none(),
        "another client re-entered"
    );
    ensure!(
        a.mutex(&name).reentrant().try_acquire().await?.is_none(),
        "a new acquisition by the same client re-entered without the guard"
    );
    ensure!(
        a.mutex(&name).try_acquire().await?.is_none(),
        "a non-reentrant acquire got a held lock"
    );
    inner.release().await?;
    ensure!(
        b.mutex(&name).try_acquire().await?.is_none(),
        "freed with one hold left"
    );
    outer.release().await?;
    let next = b
        .mutex(&name)
        .try_acquire()
        .await?
        .ok_or_else(|| anyhow::anyhow!("not freed"))?;
    ensure!(next.fence() > held_fence);
    Ok(())
}

async fn reentrant_hold_count_expires_with_the_lease(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("crashed");
    let first = a
        .mutex(&name)
        .reentrant()
        .ttl(Duration::from_millis(200))
        .acquire()
        .await?;
    let second = first.reenter().await?;
    // The holder "crashes" with two holds: nothing is released.
    std::mem::forget(first);
    std::mem::forget(second);
    let next = b
        .mutex(&name)
        .wait(Duration::from_secs(10))
        .acquire()
        .await?;
    next.release().await?;
    Ok(())
}

async fn reentrant_is_unsupported_error(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    expect_err!(
        locks.mutex(cx.name("r")).reentrant().acquire().await,
        Error::Unsupported { .. }
    );
    Ok(())
}

/// Re-entry needs proof of holding: two tasks of one client that both ask for a reentrant
/// lock are two holders, so only one holds it at a time (and fences differ).
async fn two_tasks_of_one_client_never_both_hold_a_reentrant_lock(cx: Ctx) -> anyhow::Result<()> {
    let a = cx.locks().await?;
    let name = cx.name("two-tasks");
    let inside = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let (a, name, inside) = (a.clone(), name.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            let mut fences = Vec::new();
            for _ in 0..5 {
                let guard = a
                    .mutex(&name)
                    .reentrant()
                    .wait(Duration::from_secs(20))
                    .acquire()
                    .await?;
                let now = inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                anyhow::ensure!(now == 0, "two tasks hold {name} at once");
                fences.push(guard.fence());
                tokio::time::sleep(Duration::from_millis(5)).await;
                inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                guard.release().await?;
            }
            anyhow::Ok(fences)
        }));
    }
    let mut fences = Vec::new();
    for task in tasks {
        fences.extend(task.await??);
    }
    fences.sort();
    fences.dedup();
    ensure!(fences.len() == 10, "fences repeated: {fences:?}");
    Ok(())
}

/// A re-entry dropped at any point (before, while or after the store counts it) leaves the
/// count as it was: once the outer hold is released the lock is free.
async fn a_dropped_reentry_leaves_no_hold_count(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("dropped-reentry");
    let (mut dropped, mut immediate) = (0, 0);
    // At least 30 rounds; on a loaded machine every in-flight re-entry may finish before its
    // drop by chance, so rounds go on (up to 120) until one is dropped in flight.
    let mut rounds = 0u64;
    while rounds < 30 || (dropped == 0 && immediate < rounds && rounds < 120) {
        let i = rounds;
        rounds += 1;
        let outer = a
            .mutex(&name)
            .reentrant()
            .ttl(Duration::from_secs(600))
            .acquire()
            .await?;
        let (polls, pause) = ((i % 5) as usize, Duration::from_micros(i / 5 * 300));
        let reentered = {
            let mut reentry = std::pin::pin!(outer.reenter());
            match futures::poll!(reentry.as_mut()) {
                // Done without an await point (SQLite's inline path): nothing to drop.
                std::task::Poll::Ready(inner) => {
                    immediate += 1;
                    Some(inner)
                }
                // In flight: dropped after some more polls, at the end of this block.
                std::task::Poll::Pending => super::drop_after_polls(reentry, polls, pause).await,
            }
        };
        match reentered {
            Some(inner) => inner?.release().await?,
            None => dropped += 1,
        }
        let outer_fence = outer.fence();
        outer.release().await?;
        let next = match b
            .mutex(&name)
            .ttl(Duration::from_secs(600))
            .wait(Duration::from_secs(10))
            .acquire()
            .await
        {
            Ok(next) => next,
            Err(e) => {
                // What the store kept (a hold count that missed a release shows here).
                let kept = b.inspect(&name).await;
                anyhow::bail!(
                    "round {i}: the lock stayed held: {e}; the outer hold had fence \
                     {outer_fence}; the store has {kept:?}"
                );
            }
        };
        next.release().await?;
    }
    // A store whose re-entry always completes at its first poll has no in-flight state a drop
    // could strand; otherwise some re-entry must have been dropped in flight.
    ensure!(
        dropped > 0 || immediate == rounds,
        "no re-entry was dropped in flight ({immediate} of {rounds} were done at once): the case tested nothing"
    );
    Ok(())
}

async fn reentry_after_a_loss_is_not_owned(cx: Ctx) -> anyhow::Result<()> {
    let a = cx.locks().await?;
    let name = cx.name("lost-reentry");
    let outer = a
        .mutex(&name)
        .reentrant()
        .ttl(Duration::from_millis(200))
        .acquire()
        .await?;
    tokio::time::timeout(Duration::from_secs(5), outer.lost()).await?;
    expect_err!(outer.reenter().await, Error::NotOwned { .. });
    Ok(())
}

async fn reentry_needs_a_reentrant_hold(cx: Ctx) -> anyhow::Result<()> {
    let a = cx.locks().await?;
    let guard = a.mutex(cx.name("plain")).acquire().await?;
    expect_err!(guard.reenter().await, Error::InvalidArgument { .. });
    guard.release().await?;
    Ok(())
}
