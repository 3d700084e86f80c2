//! Inspection: inspect, list by prefix (paged), force-release.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use anyhow::ensure;
use dlock::{Error, HoldKind, LockInfo, Owner};
use futures::TryStreamExt;

use super::{Ctx, Needs, cases, expect_err, spawn_waiter};

cases!["monitor",
    Needs::Monitor =>
        inspect_shows_the_holder,
        force_release_frees_the_lock;
    Needs::List =>
        list_finds_held_locks_by_prefix,
        list_pages_through_many_locks;
    Needs::MonitorWaiters =>
        inspect_and_list_count_waiters;
    Needs::MonitorNativeShared =>
        native_semaphores_and_rwlocks_are_listed_once_each;
    Needs::NotMonitor =>
        inspection_is_unsupported_error;
    Needs::MonitorWithoutList =>
        listing_is_unsupported_error
];

async fn inspect_shows_the_holder(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?.with_label("conformance-holder")?;
    let name = cx.name("inspected");
    ensure!(
        locks.inspect(&name).await?.is_none(),
        "free lock inspected as held"
    );
    let before = SystemTime::now() - Duration::from_secs(2);
    let guard = locks
        .mutex(&name)
        .ttl(Duration::from_secs(20))
        .acquire()
        .await?;
    let info = cx
        .locks()
        .await?
        .inspect(&name)
        .await?
        .ok_or_else(|| anyhow::anyhow!("held lock not found"))?;
    let me = Owner::current();
    ensure!(info.name == name);
    ensure!(info.fence == guard.fence());
    ensure!(
        info.owner.label.as_deref() == Some("conformance-holder"),
        "{:?}",
        info.owner
    );
    ensure!(
        info.owner.host == me.host && info.owner.pid == me.pid,
        "{:?}",
        info.owner
    );
    ensure!(info.holds == 1);
    ensure!(
        info.acquired_at >= before
            && info.acquired_at <= SystemTime::now() + Duration::from_secs(2)
    );
    match info.ttl_left {
        Some(left) => ensure!(
            left <= Duration::from_secs(20) && left > Duration::from_secs(10),
            "ttl_left {left:?}"
        ),
        // A session lock has no expiry in the server: its holder's client keeps the TTL.
        None => ensure!(!cx.traits().reports_ttl, "no TTL reported"),
    }
    guard.release().await?;
    ensure!(
        locks.inspect(&name).await?.is_none(),
        "released lock still inspected as held"
    );
    Ok(())
}

async fn list_finds_held_locks_by_prefix(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let a1 = locks.mutex(cx.name("orders/1")).acquire().await?;
    let _a2 = locks.mutex(cx.name("orders/2")).acquire().await?;
    let _b = locks.mutex(cx.name("users/1")).acquire().await?;
    let released = locks.mutex(cx.name("orders/3")).acquire().await?;
    released.release().await?;
    let expired = locks
        .mutex(cx.name("orders/4"))
        .ttl(Duration::from_millis(50))
        .acquire()
        .await?;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let orders: HashSet<String> = cx
        .locks()
        .await?
        .list(&cx.name("orders/"))
        .map_ok(|info| info.name)
        .try_collect()
        .await?;
    let expected: HashSet<String> = [cx.name("orders/1"), cx.name("orders/2")].into();
    ensure!(orders == expected, "{orders:?}");
    let all: Vec<_> = locks.list(cx.prefix()).try_collect().await?;
    ensure!(all.len() == 3, "{all:?}");
    let none: Vec<_> = locks.list(&cx.name("nothing-here/")).try_collect().await?;
    ensure!(none.is_empty(), "{none:?}");
    a1.release().await?;
    let orders: Vec<_> = locks.list(&cx.name("orders/")).try_collect().await?;
    ensure!(orders.len() == 1);
    drop(expired);
    Ok(())
}

async fn list_pages_through_many_locks(cx: Ctx) -> anyhow::Result<()> {
    const HELD: usize = 600;
    let locks = cx.locks().await?;
    let mut guards = Vec::with_capacity(HELD);
    for i in 0..HELD {
        guards.push(
            locks
                .mutex(cx.name(&format!("bulk/{i:04}")))
                .ttl(Duration::from_secs(60))
                .acquire()
                .await?,
        );
    }
    let names: Vec<String> = locks
        .list(&cx.name("bulk/"))
        .map_ok(|i| i.name)
        .try_collect()
        .await?;
    let unique: HashSet<&String> = names.iter().collect();
    ensure!(
        names.len() == HELD && unique.len() == HELD,
        "{} listed, {} unique",
        names.len(),
        unique.len()
    );
    Ok(())
}

/// How many waiters `inspect` and `list` report for `name` (which must be held).
async fn waiters_seen(locks: &dlock::Locks, name: &str) -> anyhow::Result<(u32, u32)> {
    let inspected = locks
        .inspect(name)
        .await?
        .ok_or_else(|| anyhow::anyhow!("held lock not inspected"))?;
    let listed: Vec<_> = locks.list(name).try_collect().await?;
    let [listed] = listed.as_slice() else {
        anyhow::bail!("{name} listed as {listed:?}");
    };
    let count = |info: &dlock::LockInfo| {
        info.waiters
            .ok_or_else(|| anyhow::anyhow!("no waiter count for {}", info.name))
    };
    Ok((count(&inspected)?, count(listed)?))
}

async fn inspect_and_list_count_waiters(cx: Ctx) -> anyhow::Result<()> {
    let (a, b, observer) = (cx.locks().await?, cx.locks().await?, cx.locks().await?);
    let name = cx.name("waited");
    let holder = a
        .mutex(&name)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?;
    ensure!(
        waiters_seen(&observer, &name).await? == (0, 0),
        "a waiter counted before any came"
    );
    let waiter = spawn_waiter(&b, &name, |m| m.wait(Duration::from_secs(30)));
    // The waiter queues after its first attempt; give it until well past any first poll.
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut seen = waiters_seen(&observer, &name).await?;
    while seen != (1, 1) && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
        seen = waiters_seen(&observer, &name).await?;
    }
    ensure!(
        seen == (1, 1),
        "one waiter, counted by inspect and list as {seen:?}"
    );
    holder.release().await?;
    let served = waiter.await??;
    // The waiter holds the lock now and nobody waits.
    ensure!(
        waiters_seen(&observer, &name).await? == (0, 0),
        "the served waiter still counted"
    );
    served.release().await?;
    Ok(())
}

async fn native_semaphores_and_rwlocks_are_listed_once_each(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?.with_label("shared-holder")?;
    let (sem, read, write) = (
        cx.name("shared/sem"),
        cx.name("shared/read"),
        cx.name("shared/write"),
    );
    let ttl = Duration::from_secs(30);
    let p1 = locks.semaphore(&sem, 3).ttl(ttl).acquire().await?;
    let p2 = locks.semaphore(&sem, 3).ttl(ttl).acquire().await?;
    let r1 = locks.rwlock(&read).ttl(ttl).read().await?;
    let r2 = locks.rwlock(&read).ttl(ttl).read().await?;
    let w = locks.rwlock(&write).ttl(ttl).write().await?;
    let observer = cx.locks().await?;
    // A writer waits behind the two readers: it is counted as waiting, not as holding.
    let waiting_writer = tokio::spawn({
        let (locks, read) = (cx.locks().await?, read.clone());
        async move { locks.rwlock(&read).wait(ttl).write().await }
    });
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while observer.inspect(&read).await?.and_then(|i| i.waiters) != Some(1)
        && tokio::time::Instant::now() < until
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut listed: Vec<LockInfo> = observer.list(&cx.name("shared/")).try_collect().await?;
    listed.sort_by(|a, b| a.name.cmp(&b.name));
    let shown: Vec<(&str, HoldKind, u32)> = listed
        .iter()
        .map(|i| (i.name.as_str(), i.kind, i.holds))
        .collect();
    ensure!(
        shown
            == [
                (read.as_str(), HoldKind::Reader, 2),
                (sem.as_str(), HoldKind::Permit, 2),
                (write.as_str(), HoldKind::Writer, 1),
            ],
        "listed as {shown:?}"
    );
    let by = |name: &str| listed.iter().find(|i| i.name == name);
    // Each entry shows the holder that has held longest: the lowest fence.
    for (name, fence) in [
        (&sem, p1.fence().min(p2.fence())),
        (&read, r1.fence().min(r2.fence())),
        (&write, w.fence()),
    ] {
        let info = by(name).ok_or_else(|| anyhow::anyhow!("{name} not listed"))?;
        ensure!(
            info.fence == fence,
            "{name}: fence {} for {fence}",
            info.fence
        );
        ensure!(
            info.owner.label.as_deref() == Some("shared-holder"),
            "{name}: {:?}",
            info.owner
        );
        ensure!(
            info.ttl_left.is_some_and(|left| left <= ttl),
            "{name}: ttl_left {:?}",
            info.ttl_left
        );
        let inspected = observer
            .inspect(name)
            .await?
            .ok_or_else(|| anyhow::anyhow!("{name} not inspected"))?;
        ensure!(
            (inspected.kind, inspected.holds, inspected.fence)
                == (info.kind, info.holds, info.fence),
            "{name}: inspected as {inspected:?}"
        );
    }
    for permit in [p1, p2] {
        permit.release().await?;
    }
    let read_waiters = by(&read).and_then(|i| i.waiters);
    ensure!(
        read_waiters == Some(1),
        "the waiting writer counted as {read_waiters:?}"
    );
    for hold in [r1, r2] {
        hold.release().await?;
    }
    waiting_writer.await??.release().await?;
    w.release().await?;
    let left: Vec<LockInfo> = observer.list(&cx.name("shared/")).try_collect().await?;
    ensure!(left.is_empty(), "listed after every release: {left:?}");
    for name in [&sem, &read, &write] {
        ensure!(
            observer.inspect(name).await?.is_none(),
            "{name} inspected after its release"
        );
    }
    Ok(())
}

async fn force_release_frees_the_lock(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("stuck");
    ensure!(
        !b.force_release(&name).await?,
        "force_release of a free lock reported true"
    );
    let stuck = a
        .mutex(&name)
        .ttl(Duration::from_secs(600))
        .acquire()
        .await?;
    ensure!(b.force_release(&name).await?);
    ensure!(b.inspect(&name).await?.is_none());
    let next = b.mutex(&name).no_wait().acquire().await?;
    ensure!(next.fence() > stuck.fence());
    expect_err!(stuck.release().await, Error::NotOwned { .. });
    ensure!(
        a.mutex(&name).try_acquire().await?.is_none(),
        "stale release freed the new holder"
    );
    next.release().await?;
    Ok(())
}

/// A store that inspects but cannot list (it keeps only a hash of each name) says so.
async fn listing_is_unsupported_error(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let listed: Result<Vec<_>, _> = locks.list("").try_collect().await;
    expect_err!(listed, Error::Unsupported { .. });
    Ok(())
}

async fn inspection_is_unsupported_error(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    expect_err!(
        locks.inspect(&cx.name("x")).await,
        Error::Unsupported { .. }
    );
    expect_err!(
        locks.force_release(&cx.name("x")).await,
        Error::Unsupported { .. }
    );
    let listed: Result<Vec<_>, _> = locks.list("").try_collect().await;
    expect_err!(listed, Error::Unsupported { .. });
    Ok(())
}
