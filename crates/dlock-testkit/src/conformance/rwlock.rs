//! Read-write locks: readers share, a writer excludes everyone, a waiting writer is not starved.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, ensure};
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
        bad_rwlock_input_is_rejected_before_the_store,
        expired_writer_is_lost_when_a_reader_takes_over,
        expired_reader_is_lost_when_a_writer_takes_over,
        extending_an_expired_read_or_write_hold_is_not_owned,
        read_and_write_holds_are_kept_while_renewed,
        a_writers_lost_hold_fires_its_one_lost_signal,
        a_writer_that_waited_past_its_ttl_holds_a_whole_lease
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

async fn a_writers_lost_hold_fires_its_one_lost_signal(cx: Ctx) -> anyhow::Result<()> {
    // Take away what the writer holds in the store: one of its places where the lock is
    // composed and the store can break a lock; otherwise (native locks, whose parts are not
    // locks of their own, and stores without inspection) let its lease run out unrenewed.
    let locks = cx.locks().await?;
    let name = cx.name("broken");
    let caps = locks.info().capabilities;
    let w = if !caps.rwlock && caps.monitor {
        let w = locks.rwlock(&name).max_readers(3).ttl(TTL).write().await?;
        ensure!(
            locks.force_release(&format!("{name}#r1")).await?,
            "place r1 was not held by the writer"
        );
        w
    } else {
        let w = locks
            .rwlock(&name)
            .max_readers(3)
            .ttl(Duration::from_millis(200))
            .write()
            .await?;
        tokio::time::sleep(Duration::from_millis(400)).await;
        w
    };
    // The store must say the hold is gone (renewal is not due, so ask it), and the loss then
    // reaches the guard's one signal.
    expect_err!(w.extend(TTL).await, Error::NotOwned { .. });
    ensure!(w.is_lost(), "is_lost is false after a refused extension");
    tokio::time::timeout(Duration::from_secs(10), w.lost())
        .await
        .map_err(|_| anyhow::anyhow!("the write guard's lost signal did not fire"))?;
    expect_err!(w.release().await, Error::NotOwned { .. });
    Ok(())
}

async fn expired_writer_is_lost_when_a_reader_takes_over(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("expiring-writer");
    let w = a
        .rwlock(&name)
        .ttl(Duration::from_millis(300))
        .write()
        .await?;
    let r = b
        .rwlock(&name)
        .ttl(TTL)
        .wait(Duration::from_secs(10))
        .read()
        .await?;
    ensure!(
        w.is_lost(),
        "the expired writer was not told by the time a reader got in"
    );
    ensure!(
        r.fence() > w.fence(),
        "fence {} after {}",
        r.fence(),
        w.fence()
    );
    expect_err!(w.extend(TTL).await, Error::NotOwned { .. });
    expect_err!(w.release().await, Error::NotOwned { .. });
    ensure!(!r.is_lost(), "the reader's hold is lost");
    r.release().await?;
    Ok(())
}

async fn expired_reader_is_lost_when_a_writer_takes_over(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("expiring-reader");
    let r = a
        .rwlock(&name)
        .ttl(Duration::from_millis(300))
        .read()
        .await?;
    let w = b
        .rwlock(&name)
        .ttl(TTL)
        .wait(Duration::from_secs(10))
        .write()
        .await?;
    ensure!(
        r.is_lost(),
        "the expired reader was not told by the time a writer got in"
    );
    ensure!(
        w.fence() > r.fence(),
        "fence {} after {}",
        w.fence(),
        r.fence()
    );
    expect_err!(r.extend(TTL).await, Error::NotOwned { .. });
    expect_err!(r.release().await, Error::NotOwned { .. });
    ensure!(!w.is_lost(), "the writer's hold is lost");
    w.release().await?;
    Ok(())
}

async fn extending_an_expired_read_or_write_hold_is_not_owned(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let short = Duration::from_millis(100);
    let r = locks.rwlock(cx.name("read")).ttl(short).read().await?;
    let w = locks.rwlock(cx.name("write")).ttl(short).write().await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(r.is_lost() && w.is_lost(), "expired holds are not lost");
    expect_err!(r.extend(TTL).await, Error::NotOwned { .. });
    expect_err!(w.extend(TTL).await, Error::NotOwned { .. });
    expect_err!(r.release().await, Error::NotOwned { .. });
    expect_err!(w.release().await, Error::NotOwned { .. });
    Ok(())
}

async fn read_and_write_holds_are_kept_while_renewed(cx: Ctx) -> anyhow::Result<()> {
    // Renewed every 400 ms: a loaded CI machine can stall a renewal of a shorter lease past
    // its end (a composed write side renews its gate and every reader place each pass).
    let lease = Duration::from_millis(1200);
    let locks = cx.locks().await?.with_watchdog_lease(lease)?;
    let r = locks.rwlock(cx.name("read")).read().await?;
    let w = locks.rwlock(cx.name("write")).write().await?;
    let outlived = tokio::time::timeout(lease * 5 / 2, async {
        tokio::select! {
            () = r.lost() => {}
            () = w.lost() => {}
        }
    })
    .await
    .is_err();
    ensure!(
        outlived,
        "a renewed hold was reported lost (read: {:?}, write: {:?})",
        r.lost_reason(),
        w.lost_reason()
    );
    r.release()
        .await
        .context("the read hold was not kept to its release")?;
    w.release()
        .await
        .context("the write hold was not kept to its release")?;
    Ok(())
}

/// A writer with a short TTL that waits longer than it for a reader to leave: what it took
/// before the wait (a composed lock's gate and free reader places) must not have run out by
/// the time it returns, so the write hold it gets is whole, with its whole TTL.
async fn a_writer_that_waited_past_its_ttl_holds_a_whole_lease(cx: Ctx) -> anyhow::Result<()> {
    let (a, b, c) = (cx.locks().await?, cx.locks().await?, cx.locks().await?);
    let name = cx.name("slow-writer");
    let ttl = Duration::from_millis(400);
    let reader = a.rwlock(&name).max_readers(2).ttl(TTL).read().await?;
    let writer = tokio::spawn({
        let (b, name) = (b.clone(), name.clone());
        async move {
            b.rwlock(&name)
                .max_readers(2)
                .ttl(ttl)
                .wait(Duration::from_secs(20))
                .write()
                .await
        }
    });
    // Well past the writer's TTL, counted from when it started waiting.
    tokio::time::sleep(ttl * 3).await;
    reader.release().await?;
    let writer = writer.await??;
    let start = tokio::time::Instant::now();
    let intruder = c.rwlock(&name).max_readers(2).ttl(TTL).try_read().await?;
    let writer_lost = writer.is_lost();
    ensure!(
        intruder.is_none() || start.elapsed() >= ttl,
        "a reader got in beside the writer that had just been granted (the writer told lost: \
         {writer_lost})"
    );
    ensure!(
        !writer_lost || start.elapsed() >= ttl,
        "the writer's new hold was lost at once"
    );
    drop(intruder);
    writer.release().await?;
    Ok(())
}
