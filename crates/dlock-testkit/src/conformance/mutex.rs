//! Exclusive locks: exclusion, waiting, TTL expiry, extend and release.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::ensure;
use dlock::backend::{AcquireRequest, Wait};
use dlock::{Error, LockName, Owner};

use super::primitive::{COSTLY, EVERY, spawn_waiter};
use super::{Ctx, Needs, cases, expect_err};
use crate::checker::FencedResource;

cases!["mutex",
    Needs::Any, COSTLY =>
        mutual_exclusion_with_many_tasks,
        many_distinct_locks_do_not_interfere;
    Needs::Any, EVERY =>
        try_acquire_on_held_lock_returns_none,
        no_wait_acquire_on_held_lock_times_out_at_once,
        waiter_gets_the_lock_when_it_is_released,
        ttl_expiry_lets_another_take_over,
        release_after_expiry_is_not_owned,
        extend_after_expiry_is_not_owned,
        release_after_takeover_is_not_owned,
        dropping_a_guard_releases;
    Needs::Any, COSTLY =>
        wait_times_out_after_the_wait,
        extend_prolongs_a_fixed_ttl,
        watchdog_keeps_the_lock_through_several_ttls,
        watchdog_stops_after_release;
    // A lease asked of the backend directly, as a mutex: the `retry` area repeats the retry
    // for native permits and read-write holds.
    Needs::Any =>
        double_release_is_not_owned;
    Needs::RetryFindsItsGrant =>
        a_repeated_attempt_takes_its_own_grant
];

async fn mutual_exclusion_with_many_tasks(cx: Ctx) -> anyhow::Result<()> {
    const TASKS: u64 = 8;
    let rounds: u64 = cx.rounds(15, 5);
    let name = cx.name("counter");
    let shared = cx.locks().await?;
    let resource = Arc::new(FencedResource::new());
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..TASKS {
        // Half the tasks share a client, half have their own connection.
        let locks = if i % 2 == 0 {
            shared.clone()
        } else {
            cx.locks().await?
        };
        let (name, resource, cx) = (name.clone(), resource.clone(), cx.clone());
        tasks.spawn(async move {
            for _ in 0..rounds {
                let guard = cx
                    .lock(&locks, &name)
                    .ttl(Duration::from_secs(30))
                    .acquire()
                    .await?;
                resource.begin_hold(guard.fence());
                resource
                    .write(guard.fence())
                    .map_err(|stale| anyhow::anyhow!("{stale:?}"))?;
                tokio::time::sleep(Duration::from_millis(1)).await;
                resource.end_hold(guard.fence());
                guard.release().await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let report = resource.report();
    ensure!(report.holds == (TASKS * rounds) as usize, "{report:?}");
    ensure!(
        report.overlaps.is_empty(),
        "overlapping holds: {:?}",
        report.overlaps
    );
    ensure!(
        report.rejected.is_empty(),
        "fences went backwards: {:?}",
        report.rejected
    );
    Ok(())
}

async fn many_distinct_locks_do_not_interfere(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let mut guards = Vec::new();
    // A composed write side is 33 locks of the store, and a SQL session lock keeps a
    // connection of the client's 100 each: two of them are all such a client can hold here.
    let count = match cx.primitive() {
        super::Primitive::Mutex => 50,
        super::Primitive::RwlockWrite => 2,
        super::Primitive::Semaphore1 | super::Primitive::Semaphore3 => 10,
    };
    for i in 0..count {
        let guard = cx
            .lock(&locks, &cx.name(&format!("lock-{i}")))
            .no_wait()
            .acquire()
            .await?;
        guards.push(guard);
    }
    let other = cx.locks().await?;
    ensure!(
        cx.lock(&other, &cx.name(&format!("lock-{count}")))
            .try_acquire()
            .await?
            .is_some()
    );
    // A composed write side is 33 locks of the store, and a SQL session lock keeps a
    // connection of the client's 100 each: two of them are all such a client can hold here.
    let count = match cx.primitive() {
        super::Primitive::Mutex => 50,
        super::Primitive::RwlockWrite => 2,
        super::Primitive::Semaphore1 | super::Primitive::Semaphore3 => 10,
    };
    for i in 0..count {
        ensure!(
            cx.lock(&other, &cx.name(&format!("lock-{i}")))
                .try_acquire()
                .await?
                .is_none()
        );
    }
    for guard in guards {
        guard.release().await?;
    }
    Ok(())
}

async fn try_acquire_on_held_lock_returns_none(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("held");
    let guard = cx.lock(&a, &name).acquire().await?;
    ensure!(
        cx.lock(&b, &name).try_acquire().await?.is_none(),
        "other client got a held lock"
    );
    ensure!(
        cx.lock(&a, &name).try_acquire().await?.is_none(),
        "same client got a held non-reentrant lock"
    );
    guard.release().await?;
    ensure!(
        cx.lock(&b, &name).try_acquire().await?.is_some(),
        "free lock not granted"
    );
    Ok(())
}

async fn no_wait_acquire_on_held_lock_times_out_at_once(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("held");
    let _guard = cx.lock(&a, &name).acquire().await?;
    match cx.lock(&b, &name).no_wait().acquire().await {
        Err(Error::Timeout { waited, name: n }) => {
            ensure!(waited == Duration::ZERO && n == name, "{waited:?} {n}");
        }
        other => anyhow::bail!("expected Timeout, got {other:?}"),
    }
    Ok(())
}

async fn wait_times_out_after_the_wait(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("held");
    let _guard = cx.lock(&a, &name).acquire().await?;
    let start = Instant::now();
    expect_err!(
        cx.lock(&b, &name)
            .wait(Duration::from_millis(300))
            .acquire()
            .await,
        Error::Timeout { .. }
    );
    ensure!(
        start.elapsed() >= Duration::from_millis(300),
        "gave up early: {:?}",
        start.elapsed()
    );
    let start = Instant::now();
    ensure!(
        cx.lock(&b, &name)
            .wait(Duration::from_millis(200))
            .try_acquire()
            .await?
            .is_none()
    );
    ensure!(start.elapsed() >= Duration::from_millis(200));
    Ok(())
}

async fn waiter_gets_the_lock_when_it_is_released(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("handoff");
    let first = cx.lock(&a, &name).acquire().await?;
    let first_fence = first.fence();
    let waiter = spawn_waiter(&cx, &b, &name, |m| m.wait(Duration::from_secs(30)));
    tokio::time::sleep(Duration::from_millis(200)).await;
    ensure!(!waiter.is_finished(), "waiter got a held lock");
    first.release().await?;
    let second = waiter.await??;
    ensure!(second.fence() > first_fence);
    Ok(())
}

async fn ttl_expiry_lets_another_take_over(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("expiring");
    let ttl = Duration::from_millis(300);
    // Timed from before the request is sent: a store starts the TTL no earlier than that, while
    // the acquire itself may take a while on a loaded machine (a file fence's `fdatasync`).
    let start = Instant::now();
    let stale = cx.lock(&a, &name).ttl(ttl).acquire().await?;
    let fresh = cx
        .lock(&b, &name)
        .wait(Duration::from_secs(10))
        .acquire()
        .await?;
    // Less a margin for the store's clock, which counts in milliseconds or coarser.
    ensure!(
        start.elapsed() >= ttl - Duration::from_millis(50),
        "taken over {:?} after the request, before the TTL of {ttl:?} ran out",
        start.elapsed()
    );
    ensure!(fresh.fence() > stale.fence());
    // Told no later than the store let go: by the time the next holder has the lock.
    ensure!(
        stale.is_lost(),
        "the expired holder was not told by the time another holder got the lock"
    );
    expect_err!(stale.release().await, Error::NotOwned { .. });
    fresh.release().await?;
    Ok(())
}

async fn release_after_expiry_is_not_owned(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let guard = cx
        .lock(&locks, &cx.name("x"))
        .ttl(Duration::from_millis(100))
        .acquire()
        .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    expect_err!(guard.release().await, Error::NotOwned { .. });
    Ok(())
}

async fn extend_after_expiry_is_not_owned(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let guard = cx
        .lock(&locks, &cx.name("x"))
        .ttl(Duration::from_millis(100))
        .acquire()
        .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    expect_err!(
        guard.extend(Duration::from_secs(5)).await,
        Error::NotOwned { .. }
    );
    ensure!(guard.is_lost());
    Ok(())
}

async fn extend_prolongs_a_fixed_ttl(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("extended");
    let guard = cx
        .lock(&a, &name)
        .ttl(Duration::from_millis(1000))
        .acquire()
        .await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    guard.extend(Duration::from_secs(10)).await?;
    tokio::time::sleep(Duration::from_millis(1300)).await;
    ensure!(
        cx.lock(&b, &name).try_acquire().await?.is_none(),
        "extended lock expired at its first TTL"
    );
    ensure!(!guard.is_lost(), "extended lock reported lost");
    guard.release().await?;
    Ok(())
}

async fn release_after_takeover_is_not_owned(cx: Ctx) -> anyhow::Result<()> {
    let (a, b, c) = (cx.locks().await?, cx.locks().await?, cx.locks().await?);
    let name = cx.name("taken");
    let stale = cx
        .lock(&a, &name)
        .ttl(Duration::from_millis(100))
        .acquire()
        .await?;
    let fresh = cx
        .lock(&b, &name)
        .wait(Duration::from_secs(10))
        .acquire()
        .await?;
    expect_err!(stale.release().await, Error::NotOwned { .. });
    ensure!(
        cx.lock(&c, &name).try_acquire().await?.is_none(),
        "stale release freed the new holder's lock"
    );
    fresh.release().await?;
    Ok(())
}

fn raw_request(name: &str, ttl: Duration) -> anyhow::Result<AcquireRequest> {
    Ok(AcquireRequest::new(
        LockName::new(name)?,
        uuid::Uuid::new_v4().simple().to_string(),
        Owner::current(),
        ttl,
        Wait::No,
    ))
}

async fn double_release_is_not_owned(cx: Ctx) -> anyhow::Result<()> {
    // Guards make a double release impossible (release consumes them); the backend contract
    // must hold anyway for layers and wrappers that hold leases directly.
    let locks = cx.locks().await?;
    let name = cx.name("twice");
    let request = raw_request(&name, Duration::from_secs(30))?;
    let lease = locks
        .backend()
        .acquire(&request)
        .await?
        .ok_or_else(|| anyhow::anyhow!("not acquired"))?;
    lease.release().await?;
    expect_err!(lease.release().await, Error::NotOwned { .. });
    expect_err!(
        lease.extend(Duration::from_secs(1)).await,
        Error::NotOwned { .. }
    );
    // And a second holder is not disturbed by the stale lease.
    let next = cx.lock(&locks, &name).no_wait().acquire().await?;
    expect_err!(lease.release().await, Error::NotOwned { .. });
    ensure!(
        cx.locks()
            .await?
            .mutex(&name)
            .try_acquire()
            .await?
            .is_none()
    );
    next.release().await?;
    Ok(())
}

/// An attempt repeated with the same token (an acquire loop's retry after the reply to a
/// granting attempt was lost) takes the grant it already has, with the same fence, instead
/// of waiting out its own lease; the one hold is then released once.
async fn a_repeated_attempt_takes_its_own_grant(cx: Ctx) -> anyhow::Result<()> {
    let (locks, other) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("idempotent");
    let request = raw_request(&name, Duration::from_secs(30))?;
    let first = locks
        .backend()
        .acquire(&request)
        .await?
        .ok_or_else(|| anyhow::anyhow!("not acquired"))?;
    let again = locks
        .backend()
        .acquire(&request)
        .await?
        .ok_or_else(|| anyhow::anyhow!("a retry found its own grant busy"))?;
    // A fence settled over the nodes that answer may come back higher on a retry that sees a
    // node that granted late; a fence below the grant's would be another grant.
    let same = if cx.traits().fence_by_quorum {
        again.fence() >= first.fence()
    } else {
        again.fence() == first.fence()
    };
    ensure!(
        same,
        "the retry got another grant: fence {} after {}",
        again.fence(),
        first.fence()
    );
    ensure!(
        cx.lock(&other, &name).try_acquire().await?.is_none(),
        "the lock looked free while granted"
    );
    again.release().await?;
    let next = cx
        .lock(&other, &name)
        .try_acquire()
        .await?
        .ok_or_else(|| anyhow::anyhow!("one release did not free the one hold"))?;
    ensure!(next.fence() > first.fence());
    next.release().await?;
    Ok(())
}

async fn watchdog_keeps_the_lock_through_several_ttls(cx: Ctx) -> anyhow::Result<()> {
    let a = cx
        .locks()
        .await?
        .with_watchdog_lease(Duration::from_millis(600))?;
    let b = cx.locks().await?;
    let name = cx.name("renewed");
    let guard = cx.lock(&a, &name).acquire().await?;
    // Four leases; two (six renewals) for the other primitives, whose renewal is the mutex's
    // keeper pass over another store call.
    tokio::time::sleep(Duration::from_millis(cx.rounds(2400, 1300))).await;
    ensure!(!guard.is_lost(), "watchdog lock lost");
    ensure!(
        cx.lock(&b, &name).try_acquire().await?.is_none(),
        "watchdog lock expired"
    );
    guard.release().await?;
    ensure!(cx.lock(&b, &name).try_acquire().await?.is_some());
    Ok(())
}

async fn watchdog_stops_after_release(cx: Ctx) -> anyhow::Result<()> {
    let a = cx
        .locks()
        .await?
        .with_watchdog_lease(Duration::from_millis(600))?;
    // A hold may keep more than one lease (a composed primitive's parts): count one first.
    let released = cx.lock(&a, &cx.name("released")).acquire().await?;
    let each = a.kept_leases();
    ensure!(
        each >= 1 && (each == 1 || cx.primitive() != super::Primitive::Mutex),
        "a hold keeps {each} leases"
    );
    let dropped = cx.lock(&a, &cx.name("dropped")).acquire().await?;
    ensure!(a.kept_leases() == 2 * each, "kept {}", a.kept_leases());
    released.release().await?;
    drop(dropped);
    ensure!(
        a.kept_leases() == 0,
        "released or dropped guards still kept: {}",
        a.kept_leases()
    );
    // Taken after the others, so that its short TTL cannot run out before the count above
    // (under load a release's round trip can outlast 100 ms).
    let expiring = cx
        .lock(&a, &cx.name("expiring"))
        // For another primitive, long enough to outlast the acquisition of a composed hold's
        // every part (a write side's gate and 32 reader places) on a slow store.
        .ttl(Duration::from_millis(cx.rounds(100, 1000)))
        .acquire()
        .await?;
    ensure!(
        a.kept_leases() == each || expiring.is_lost(),
        "kept {} for one hold",
        a.kept_leases()
    );
    tokio::time::timeout(Duration::from_secs(5), expiring.lost()).await?;
    // A composed hold is lost with its first part; its other parts, taken later, end with
    // their own fixed TTLs (a second at most), and are then no longer kept either.
    let settle = tokio::time::Instant::now()
        + if each == 1 {
            Duration::ZERO
        } else {
            Duration::from_secs(2)
        };
    while a.kept_leases() > 0 && tokio::time::Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ensure!(
        a.kept_leases() == 0,
        "a lost lease is still kept: {}",
        a.kept_leases()
    );
    Ok(())
}

async fn dropping_a_guard_releases(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("dropped");
    let guard = cx
        .lock(&a, &name)
        .ttl(Duration::from_secs(600))
        .acquire()
        .await?;
    drop(guard);
    // Well inside the 600 s TTL: only the release on drop can free it.
    let next = cx
        .lock(&b, &name)
        .wait(Duration::from_secs(10))
        .acquire()
        .await?;
    next.release().await?;
    Ok(())
}
