//! Counting semaphores: the count is never exceeded, waiters get released permits, and a
//! crashed holder's permit comes back when its lease ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::ensure;
use dlock::Error;

use super::{Ctx, Needs, cases, expect_err};

cases!["semaphore",
    Needs::Any =>
        permits_are_never_exceeded,
        all_permits_taken_means_busy,
        waiter_gets_a_returned_permit,
        crashed_holders_permit_returns_when_its_lease_ends,
        bad_semaphore_input_is_rejected_before_the_store,
        expired_permit_is_lost_when_a_waiter_takes_it_over,
        extending_an_expired_permit_is_not_owned,
        a_permit_lost_signal_does_not_fire_while_its_lease_is_valid,
        several_permits_are_taken_all_or_nothing,
        a_wait_for_several_permits_gets_them_as_they_free_up,
        a_wait_for_several_permits_that_runs_out_gives_back_what_it_took,
        a_wait_for_several_permits_past_their_ttl_keeps_every_one;
    Needs::SemaphoreSize =>
        another_size_than_the_holders_use_is_refused
];

const TTL: Duration = Duration::from_secs(30);

async fn permits_are_never_exceeded(cx: Ctx) -> anyhow::Result<()> {
    const PERMITS: u32 = 3;
    let name = cx.name("sem");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let locks = cx.locks().await?;
        let (name, inside, most) = (name.clone(), inside.clone(), most.clone());
        tasks.spawn(async move {
            for _ in 0..5 {
                let permit = locks
                    .semaphore(&name, PERMITS)
                    .ttl(TTL)
                    .wait(Duration::from_secs(60))
                    .acquire()
                    .await?;
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                // Until permits have been shared once, a holder stays (up to 10 s) so that a
                // working semaphore lets a second holder in however loaded the machine is;
                // one that serialises its permits leaves `most` at 1 and fails below.
                let stay_until = tokio::time::Instant::now() + Duration::from_secs(10);
                while most.load(Ordering::SeqCst) < 2 && tokio::time::Instant::now() < stay_until {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                tokio::time::sleep(Duration::from_millis(4)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                permit.release().await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let most = most.load(Ordering::SeqCst);
    ensure!(
        most <= PERMITS as usize,
        "{most} holders at once with {PERMITS} permits"
    );
    ensure!(
        most >= 2,
        "permits were never shared ({most} holder at most)"
    );
    Ok(())
}

async fn all_permits_taken_means_busy(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("busy");
    let p1 = a.semaphore(&name, 2).ttl(TTL).acquire().await?;
    let p2 = b.semaphore(&name, 2).ttl(TTL).acquire().await?;
    ensure!(
        (p1.slot(), p1.fence()) != (p2.slot(), p2.fence()),
        "two permits are the same hold"
    );
    ensure!(
        b.semaphore(&name, 2).try_acquire().await?.is_none(),
        "a third permit of two"
    );
    expect_err!(
        b.semaphore(&name, 2)
            .wait(Duration::from_millis(100))
            .acquire()
            .await,
        Error::Timeout { .. }
    );
    p1.release().await?;
    ensure!(
        b.semaphore(&name, 2)
            .ttl(TTL)
            .try_acquire()
            .await?
            .is_some(),
        "a returned permit was not free"
    );
    drop(p2);
    Ok(())
}

async fn waiter_gets_a_returned_permit(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("wait");
    let held = a.semaphore(&name, 1).ttl(TTL).acquire().await?;
    let waiter = {
        let name = name.clone();
        tokio::spawn(async move {
            b.semaphore(&name, 1)
                .ttl(TTL)
                .wait(Duration::from_secs(20))
                .acquire()
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    ensure!(!waiter.is_finished(), "the waiter got a taken permit");
    held.release().await?;
    let permit = waiter.await??;
    ensure!(!permit.is_lost(), "the handed-over permit is lost");
    Ok(())
}

async fn crashed_holders_permit_returns_when_its_lease_ends(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("crash");
    // A short lease, so the test is quick; a longer one when the machine was too slow to look
    // before the short one could have ended (the lease starts after `asked`, so a permit free
    // sooner than `lease` after it is free early whatever the load).
    for lease in [Duration::from_millis(600), Duration::from_secs(4)] {
        let asked = tokio::time::Instant::now();
        let crashed = a.semaphore(&name, 1).ttl(lease).acquire().await?;
        // A crash: the holder never releases (and never renews: the lease is fixed).
        std::mem::forget(crashed);
        if let Some(early) = b.semaphore(&name, 1).try_acquire().await? {
            ensure!(asked.elapsed() >= lease, "permit free at once");
            early.release().await?;
            continue;
        }
        let started = tokio::time::Instant::now();
        let permit = b
            .semaphore(&name, 1)
            .ttl(TTL)
            .wait(Duration::from_secs(20))
            .acquire()
            .await?;
        ensure!(
            started.elapsed() + Duration::from_millis(50) >= lease / 2,
            "the permit came back long before the lease ended"
        );
        permit.release().await?;
        return Ok(());
    }
    anyhow::bail!("too slow to look at the permit before its lease could end, twice")
}

async fn bad_semaphore_input_is_rejected_before_the_store(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let name = cx.name("bad");
    expect_err!(
        locks.semaphore(&name, 0).acquire().await,
        Error::InvalidArgument { .. }
    );
    expect_err!(
        locks.semaphore(&name, 100_000).acquire().await,
        Error::InvalidArgument { .. }
    );
    expect_err!(
        locks
            .semaphore(&name, 1)
            .ttl(Duration::from_millis(1))
            .acquire()
            .await,
        Error::InvalidArgument { .. }
    );
    expect_err!(
        locks.semaphore("a\0b", 1).acquire().await,
        Error::InvalidName { .. }
    );
    for count in [0, 2] {
        expect_err!(
            locks.semaphore(&name, 1).count(count).acquire().await,
            Error::InvalidArgument { .. }
        );
    }
    // Nothing was left behind: the single permit is free.
    ensure!(
        locks
            .semaphore(&name, 1)
            .ttl(TTL)
            .try_acquire()
            .await?
            .is_some(),
        "rejected requests left state behind"
    );
    Ok(())
}

async fn expired_permit_is_lost_when_a_waiter_takes_it_over(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("expiring");
    let stale = a
        .semaphore(&name, 1)
        .ttl(Duration::from_millis(300))
        .acquire()
        .await?;
    let fresh = b
        .semaphore(&name, 1)
        .ttl(TTL)
        .wait(Duration::from_secs(10))
        .acquire()
        .await?;
    // Told no later than the store let go: by the time the waiter has the permit.
    ensure!(
        stale.is_lost(),
        "the expired permit's holder was not told by the time a waiter took its place"
    );
    ensure!(
        fresh.fence() > stale.fence(),
        "fence {} after {}",
        fresh.fence(),
        stale.fence()
    );
    expect_err!(stale.extend(TTL).await, Error::NotOwned { .. });
    expect_err!(stale.release().await, Error::NotOwned { .. });
    ensure!(!fresh.is_lost(), "the new holder's permit is lost");
    fresh.release().await?;
    Ok(())
}

async fn extending_an_expired_permit_is_not_owned(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let permit = locks
        .semaphore(cx.name("sem"), 2)
        .ttl(Duration::from_millis(100))
        .acquire()
        .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(permit.is_lost(), "an expired permit is not lost");
    expect_err!(permit.extend(TTL).await, Error::NotOwned { .. });
    expect_err!(permit.release().await, Error::NotOwned { .. });
    Ok(())
}

async fn a_permit_lost_signal_does_not_fire_while_its_lease_is_valid(
    cx: Ctx,
) -> anyhow::Result<()> {
    // With the watchdog (a short lease renewed while held) the permit outlives many leases.
    let locks = cx
        .locks()
        .await?
        .with_watchdog_lease(Duration::from_millis(600))?;
    let permit = locks.semaphore(cx.name("kept"), 2).acquire().await?;
    ensure!(
        tokio::time::timeout(Duration::from_millis(1500), permit.lost())
            .await
            .is_err(),
        "a renewed permit was reported lost"
    );
    permit.extend(Duration::from_secs(5)).await?;
    permit.release().await?;
    Ok(())
}

/// Every client must give a semaphore the same size: asking with another while permits are
/// held is a typed error naming both sizes, whichever is larger, and leaves no permit behind.
async fn another_size_than_the_holders_use_is_refused(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("sized");
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(a.semaphore(&name, 3).ttl(TTL).acquire().await?);
    }
    for asked in [5, 2] {
        match b.semaphore(&name, asked).ttl(TTL).try_acquire().await {
            Err(Error::SizeMismatch {
                asked: got_asked,
                held_with: 3,
                ..
            }) if got_asked == asked => {}
            other => anyhow::bail!("{asked} permits of a semaphore of 3: {other:?}"),
        }
    }
    let message = b
        .semaphore(&name, 5)
        .ttl(TTL)
        .try_acquire()
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    ensure!(
        message.contains('5') && message.contains('3'),
        "the message names both sizes: {message}"
    );
    // The refused calls hold nothing: the semaphore is still full at its own size.
    ensure!(b.semaphore(&name, 3).try_acquire().await?.is_none());
    for permit in held {
        permit.release().await?;
    }
    // With no holder left, any size may start it again.
    let resized = b.semaphore(&name, 5).ttl(TTL).acquire().await?;
    resized.release().await?;
    Ok(())
}

/// Whether one more single permit of the semaphore `name` (of `permits`) can be had now; a
/// permit taken to find out is given back.
async fn one_more_is_free(locks: &dlock::Locks, name: &str, permits: u32) -> anyhow::Result<bool> {
    match locks
        .semaphore(name, permits)
        .ttl(TTL)
        .try_acquire()
        .await?
    {
        Some(permit) => {
            permit.release().await?;
            Ok(true)
        }
        None => Ok(false),
    }
}

async fn several_permits_are_taken_all_or_nothing(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("several");
    let two = a.semaphore(&name, 3).count(2).ttl(TTL).acquire().await?;
    ensure!(
        two.count() == 2,
        "took {} permits, asked for 2",
        two.count()
    );
    let slots = two.slots();
    ensure!(slots.len() == 2, "{} slots for 2 permits", slots.len());
    ensure!(
        slots.iter().map(|(_, fence)| *fence).max() == Some(two.fence()),
        "the hold's fence is not the largest of its permits'"
    );
    // One permit is left: two at once cannot be had, and the refused attempt keeps none.
    ensure!(
        b.semaphore(&name, 3)
            .count(2)
            .ttl(TTL)
            .try_acquire()
            .await?
            .is_none(),
        "two permits taken where one was free"
    );
    ensure!(
        one_more_is_free(&b, &name, 3).await?,
        "a refused attempt for two permits kept the free one"
    );
    let third = b.semaphore(&name, 3).ttl(TTL).acquire().await?;
    ensure!(
        !one_more_is_free(&b, &name, 3).await?,
        "a fourth permit of three"
    );
    // Released together: both come back at once.
    two.release().await?;
    let again = b
        .semaphore(&name, 3)
        .count(2)
        .ttl(TTL)
        .try_acquire()
        .await?;
    ensure!(
        again.is_some(),
        "the two released permits did not both come back"
    );
    third.release().await?;
    Ok(())
}

async fn a_wait_for_several_permits_gets_them_as_they_free_up(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("several-wait");
    let first = a.semaphore(&name, 3).ttl(TTL).acquire().await?;
    let second = a.semaphore(&name, 3).ttl(TTL).acquire().await?;
    let waiter = {
        let name = name.clone();
        tokio::spawn(async move {
            b.semaphore(&name, 3)
                .count(2)
                .ttl(TTL)
                .wait(Duration::from_secs(20))
                .acquire()
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    ensure!(
        !waiter.is_finished(),
        "two permits taken where one was free"
    );
    first.release().await?;
    let both = tokio::time::timeout(Duration::from_secs(20), waiter).await???;
    ensure!(both.count() == 2, "got {} permits", both.count());
    ensure!(
        !one_more_is_free(&a, &name, 3).await?,
        "a fourth permit of three beside a hold of two"
    );
    second.release().await?;
    both.release().await?;
    Ok(())
}

async fn a_wait_for_several_permits_that_runs_out_gives_back_what_it_took(
    cx: Ctx,
) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("several-timeout");
    let held = a.semaphore(&name, 3).count(2).ttl(TTL).acquire().await?;
    expect_err!(
        b.semaphore(&name, 3)
            .count(2)
            .ttl(TTL)
            .wait(Duration::from_millis(300))
            .acquire()
            .await,
        Error::Timeout { .. }
    );
    ensure!(
        one_more_is_free(&a, &name, 3).await?,
        "a wait for two permits that ran out kept the one it took"
    );
    held.release().await?;
    Ok(())
}

/// Several permits with a short TTL, waited for longer than it: the permits taken before the
/// wait must still be the caller's when it returns, each with its whole TTL.
async fn a_wait_for_several_permits_past_their_ttl_keeps_every_one(cx: Ctx) -> anyhow::Result<()> {
    let (a, b, c) = (cx.locks().await?, cx.locks().await?, cx.locks().await?);
    let name = cx.name("slow-several");
    let ttl = Duration::from_millis(400);
    let blocker = a.semaphore(&name, 2).ttl(TTL).acquire().await?;
    let waiter = tokio::spawn({
        let name = name.clone();
        async move {
            b.semaphore(&name, 2)
                .count(2)
                .ttl(ttl)
                .wait(Duration::from_secs(20))
                .acquire()
                .await
        }
    });
    // Well past the permits' TTL, counted from when the first was taken.
    tokio::time::sleep(ttl * 3).await;
    blocker.release().await?;
    let both = waiter.await??;
    let start = tokio::time::Instant::now();
    let intruder = c.semaphore(&name, 2).ttl(TTL).try_acquire().await?;
    ensure!(
        intruder.is_none() || start.elapsed() >= ttl,
        "a third permit was taken beside the two just granted (they were told lost: {})",
        both.is_lost()
    );
    ensure!(
        !both.is_lost() || start.elapsed() >= ttl,
        "the new permits were lost at once"
    );
    drop(intruder);
    both.release().await?;
    Ok(())
}
