//! Multi-locks: all-or-nothing, canonical order (crossed multi-locks never deadlock), partial
//! acquisitions released, one lost signal.

use std::time::Duration;

use anyhow::ensure;
use dlock::Error;

use super::{Ctx, Needs, cases, expect_err};

cases!["multi_lock",
    Needs::Any =>
        multi_lock_holds_every_name,
        crossed_multi_locks_never_deadlock,
        partial_acquisition_is_released_on_failure,
        bad_multi_lock_input_is_rejected_before_the_store,
        a_multi_lock_that_waited_past_its_ttl_holds_every_lock;
    Needs::Monitor =>
        losing_any_lock_fires_the_one_lost_signal
];

const TTL: Duration = Duration::from_secs(30);

async fn multi_lock_holds_every_name(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let names = [cx.name("c"), cx.name("a"), cx.name("b")];
    let all = a.multi_lock(names.clone()).ttl(TTL).acquire().await?;
    for name in &names {
        ensure!(
            b.mutex(name).try_acquire().await?.is_none(),
            "{name} is free"
        );
        ensure!(all.fence(name).is_some(), "no fence for {name}");
    }
    let order: Vec<String> = all.fences().map(|(name, _)| name.to_string()).collect();
    let mut sorted = order.clone();
    sorted.sort();
    ensure!(order == sorted, "fences not in canonical order: {order:?}");
    all.release().await?;
    for name in &names {
        ensure!(
            b.mutex(name).try_acquire().await?.is_some(),
            "{name} still held"
        );
    }
    Ok(())
}

async fn crossed_multi_locks_never_deadlock(cx: Ctx) -> anyhow::Result<()> {
    let names = [cx.name("x"), cx.name("y"), cx.name("z")];
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..4 {
        let locks = cx.locks().await?;
        let mut mine = names.to_vec();
        if i % 2 == 1 {
            mine.reverse();
        }
        tasks.spawn(async move {
            for _ in 0..8 {
                let held = locks
                    .multi_lock(mine.clone())
                    .ttl(TTL)
                    .wait(Duration::from_secs(60))
                    .acquire()
                    .await?;
                tokio::time::sleep(Duration::from_millis(1)).await;
                held.release().await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(())
}

async fn partial_acquisition_is_released_on_failure(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let (first, second) = (cx.name("1-first"), cx.name("2-second"));
    let blocker = a.mutex(&second).ttl(TTL).acquire().await?;
    ensure!(
        b.multi_lock([&first, &second])
            .try_acquire()
            .await?
            .is_none(),
        "multi-lock granted with one name held elsewhere"
    );
    ensure!(
        b.mutex(&first).try_acquire().await?.is_some(),
        "the first name was kept"
    );
    expect_err!(
        b.multi_lock([&second, &first])
            .wait(Duration::from_millis(100))
            .acquire()
            .await,
        Error::Timeout { .. }
    );
    ensure!(
        b.mutex(&first).try_acquire().await?.is_some(),
        "the first name was kept after a timeout"
    );
    blocker.release().await?;
    Ok(())
}

async fn bad_multi_lock_input_is_rejected_before_the_store(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let good = cx.name("good");
    expect_err!(
        locks.multi_lock(Vec::<String>::new()).acquire().await,
        Error::InvalidArgument { .. }
    );
    expect_err!(
        locks.multi_lock([&good, &good]).acquire().await,
        Error::InvalidArgument { .. }
    );
    expect_err!(
        locks
            .multi_lock([good.clone(), String::new()])
            .acquire()
            .await,
        Error::InvalidName { .. }
    );
    expect_err!(
        locks
            .multi_lock([&good])
            .ttl(Duration::ZERO)
            .acquire()
            .await,
        Error::InvalidArgument { .. }
    );
    ensure!(
        locks.mutex(&good).try_acquire().await?.is_some(),
        "a rejected multi-lock left a lock held"
    );
    Ok(())
}

async fn losing_any_lock_fires_the_one_lost_signal(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let names = [cx.name("p"), cx.name("q")];
    let held = locks.multi_lock(names.clone()).ttl(TTL).acquire().await?;
    ensure!(locks.force_release(&names[1]).await?, "q was not held");
    ensure!(
        !held.is_owned().await?,
        "still owned after one lock was broken"
    );
    tokio::time::timeout(Duration::from_secs(10), held.lost())
        .await
        .map_err(|_| anyhow::anyhow!("the lost signal did not fire"))?;
    expect_err!(held.release().await, Error::NotOwned { .. });
    Ok(())
}

/// A multi-lock with a short TTL that waits longer than it for its last lock: the locks it took
/// before the wait must still be its own when it returns, each with its whole TTL.
async fn a_multi_lock_that_waited_past_its_ttl_holds_every_lock(cx: Ctx) -> anyhow::Result<()> {
    let (a, b, c) = (cx.locks().await?, cx.locks().await?, cx.locks().await?);
    let (first, last) = (cx.name("first"), cx.name("last"));
    let ttl = Duration::from_millis(400);
    let blocker = a.mutex(&last).ttl(TTL).acquire().await?;
    let waiter = tokio::spawn({
        let names = [first.clone(), last.clone()];
        async move {
            b.multi_lock(names)
                .ttl(ttl)
                .wait(Duration::from_secs(20))
                .acquire()
                .await
        }
    });
    // Well past the multi-lock's TTL, counted from when it took its first lock.
    tokio::time::sleep(ttl * 3).await;
    blocker.release().await?;
    let all = waiter.await??;
    let start = tokio::time::Instant::now();
    let intruder = c.mutex(&first).try_acquire().await?;
    ensure!(
        intruder.is_none() || start.elapsed() >= ttl,
        "{first} was taken beside the multi-lock just granted (the multi-lock told lost: {})",
        all.is_lost()
    );
    ensure!(
        !all.is_lost() || start.elapsed() >= ttl,
        "the new multi-lock was lost at once"
    );
    drop(intruder);
    all.release().await?;
    Ok(())
}
