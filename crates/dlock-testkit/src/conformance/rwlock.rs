//! Read-write locks: readers share, a writer excludes everyone, a waiting writer is not starved.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::ensure;
use dlock::Error;

use super::{Ctx, Needs, cases, expect_err};

cases!["rwlock",
    Needs::Any =>
        readers_share_the_lock,
        writer_excludes_readers_and_writers,
        writers_are_exclusive_under_contention,
        waiting_writer_is_not_starved_by_new_readers,
        fences_grow_across_readers_and_writers,
        reader_places_are_never_exceeded,
        bad_rwlock_input_is_rejected_before_the_store;
    Needs::ComposedRwLock =>
        breaking_a_writers_place_fires_its_lost_signal
];

const TTL: Duration = Duration::from_secs(30);

async fn readers_share_the_lock(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("shared");
    let r1 = a.rwlock(&name).ttl(TTL).read().await?;
    let r2 = b.rwlock(&name).ttl(TTL).no_wait().read().await?;
    ensure!(
        b.rwlock(&name).try_write().await?.is_none(),
        "a writer got in beside two readers"
    );
    r1.release().await?;
    ensure!(
        b.rwlock(&name).try_write().await?.is_none(),
        "a writer got in beside one reader"
    );
    r2.release().await?;
    let w = b.rwlock(&name).ttl(TTL).try_write().await?;
    ensure!(w.is_some(), "the writer could not get a free lock");
    Ok(())
}

async fn writer_excludes_readers_and_writers(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("excl");
    let w = a.rwlock(&name).ttl(TTL).write().await?;
    ensure!(
        b.rwlock(&name).try_read().await?.is_none(),
        "reader beside a writer"
    );
    ensure!(b.rwlock(&name).try_write().await?.is_none(), "two writers");
    expect_err!(
        b.rwlock(&name)
            .wait(Duration::from_millis(100))
            .read()
            .await,
        Error::Timeout { .. }
    );
    w.release().await?;
    ensure!(
        b.rwlock(&name).ttl(TTL).try_read().await?.is_some(),
        "the reader could not get the lock after the writer left"
    );
    Ok(())
}

async fn writers_are_exclusive_under_contention(cx: Ctx) -> anyhow::Result<()> {
    let name = cx.name("contended");
    let inside = Arc::new(AtomicUsize::new(0));
    let readers_inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..6 {
        let locks = cx.locks().await?;
        let (name, inside, readers_inside) = (name.clone(), inside.clone(), readers_inside.clone());
        tasks.spawn(async move {
            for _ in 0..4 {
                if i % 3 == 0 {
                    let w = locks.rwlock(&name).ttl(TTL).write().await?;
                    ensure!(
                        inside.fetch_add(1, Ordering::SeqCst) == 0,
                        "writer beside a holder"
                    );
                    ensure!(
                        readers_inside.load(Ordering::SeqCst) == 0,
                        "writer beside a reader"
                    );
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    w.release().await?;
                } else {
                    let r = locks.rwlock(&name).ttl(TTL).read().await?;
                    readers_inside.fetch_add(1, Ordering::SeqCst);
                    ensure!(inside.load(Ordering::SeqCst) == 0, "reader beside a writer");
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    readers_inside.fetch_sub(1, Ordering::SeqCst);
                    r.release().await?;
                }
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(())
}

async fn waiting_writer_is_not_starved_by_new_readers(cx: Ctx) -> anyhow::Result<()> {
    let (a, b, c) = (cx.locks().await?, cx.locks().await?, cx.locks().await?);
    let name = cx.name("starve");
    let first_reader = a.rwlock(&name).ttl(TTL).read().await?;
    let writer = {
        let name = name.clone();
        tokio::spawn(async move {
            b.rwlock(&name)
                .ttl(TTL)
                .wait(Duration::from_secs(30))
                .write()
                .await
        })
    };
    // Once the writer waits, a new reader must not get in ahead of it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match c.rwlock(&name).ttl(TTL).try_read().await? {
            None => break,
            Some(reader) => {
                ensure!(
                    tokio::time::Instant::now() < deadline,
                    "readers kept getting in while a writer waited"
                );
                reader.release().await?;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
    ensure!(!writer.is_finished(), "the writer got in beside a reader");
    first_reader.release().await?;
    let w = writer.await??;
    ensure!(
        c.rwlock(&name).try_read().await?.is_none(),
        "a reader got in beside the writer"
    );
    w.release().await?;
    Ok(())
}

async fn fences_grow_across_readers_and_writers(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let name = cx.name("fences");
    let r1 = locks.rwlock(&name).ttl(TTL).read().await?;
    let f1 = r1.fence();
    r1.release().await?;
    let w = locks.rwlock(&name).ttl(TTL).write().await?;
    let f2 = w.fence();
    w.release().await?;
    let r2 = locks.rwlock(&name).ttl(TTL).read().await?;
    let f3 = r2.fence();
    ensure!(f1 < f2 && f2 < f3, "fences {f1} {f2} {f3} do not grow");
    Ok(())
}

async fn reader_places_are_never_exceeded(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let name = cx.name("places");
    let r1 = locks.rwlock(&name).max_readers(2).ttl(TTL).read().await?;
    let r2 = locks.rwlock(&name).max_readers(2).ttl(TTL).read().await?;
    ensure!(
        locks
            .rwlock(&name)
            .max_readers(2)
            .try_read()
            .await?
            .is_none(),
        "a third reader got one of two places"
    );
    let waiting = {
        let (locks, name) = (locks.clone(), name.clone());
        tokio::spawn(async move {
            locks
                .rwlock(&name)
                .max_readers(2)
                .ttl(TTL)
                .wait(Duration::from_secs(20))
                .read()
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    r1.release().await?;
    let third = waiting.await??;
    drop((r2, third));
    Ok(())
}

async fn bad_rwlock_input_is_rejected_before_the_store(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let name = cx.name("bad");
    expect_err!(
        locks.rwlock(&name).max_readers(0).read().await,
        Error::InvalidArgument { .. }
    );
    expect_err!(
        locks.rwlock(&name).max_readers(5000).write().await,
        Error::InvalidArgument { .. }
    );
    expect_err!(
        locks.rwlock(&name).ttl(Duration::ZERO).write().await,
        Error::InvalidArgument { .. }
    );
    expect_err!(locks.rwlock("").read().await, Error::InvalidName { .. });
    expect_err!(
        locks.rwlock("x".repeat(500)).read().await,
        Error::InvalidName { .. }
    );
    // Nothing was left behind: a writer gets the lock at once.
    ensure!(
        locks.rwlock(&name).ttl(TTL).try_write().await?.is_some(),
        "rejected requests left state behind"
    );
    Ok(())
}

async fn breaking_a_writers_place_fires_its_lost_signal(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let name = cx.name("broken");
    let w = locks.rwlock(&name).max_readers(3).ttl(TTL).write().await?;
    ensure!(
        locks.force_release(&format!("{name}#r1")).await?,
        "place r1 was not held"
    );
    // Renewal is not due for a while, so ask the store; the loss then reaches the one signal.
    let _ = w.extend(TTL).await;
    tokio::time::timeout(Duration::from_secs(10), w.lost())
        .await
        .map_err(|_| anyhow::anyhow!("the write guard's lost signal did not fire"))?;
    ensure!(w.is_lost(), "is_lost is false after the loss");
    Ok(())
}
