//! The lost signal: fired when a hold is gone, whatever the cause.

use std::time::Duration;

use anyhow::{Context, ensure};
use dlock::Error;

use super::primitive::{COSTLY, EVERY};
use super::{Ctx, Needs, cases, expect_err};

cases!["lost",
    Needs::Any, EVERY =>
        lost_fires_when_the_lease_expires;
    Needs::Any, COSTLY =>
        lost_does_not_fire_while_the_lease_is_valid;
    // Breaking by name is a mutex's: `force_release` of a semaphore's or read-write lock's
    // name does not reach its permits or sides.
    Needs::Monitor =>
        lost_fires_when_the_lock_is_broken,
        a_fixed_ttl_lock_is_told_of_a_break_while_its_lease_has_time_left,
        a_break_signals_only_the_hold_broken_not_the_others_of_its_client
];

async fn lost_fires_when_the_lease_expires(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let guard = cx
        .lock(&locks, &cx.name("x"))
        .ttl(Duration::from_millis(200))
        .acquire()
        .await?;
    let token = guard.lost_token();
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .context("lost signal did not fire")?;
    ensure!(guard.is_lost() && token.is_cancelled());
    expect_err!(guard.release().await, Error::NotOwned { .. });
    Ok(())
}

async fn lost_does_not_fire_while_the_lease_is_valid(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let guard = cx
        .lock(&locks, &cx.name("x"))
        .ttl(Duration::from_secs(5))
        .acquire()
        .await?;
    ensure!(
        tokio::time::timeout(Duration::from_millis(500), guard.lost())
            .await
            .is_err(),
        "lost fired on a valid lease"
    );
    guard.release().await?;
    Ok(())
}

async fn lost_fires_when_the_lock_is_broken(cx: Ctx) -> anyhow::Result<()> {
    let a = cx
        .locks()
        .await?
        .with_watchdog_lease(Duration::from_millis(600))?;
    let b = cx.locks().await?;
    let name = cx.name("broken");
    let guard = cx.lock(&a, &name).acquire().await?;
    ensure!(b.force_release(&name).await?);
    // Within one lease: the next renewal is refused (or the store says so at once).
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .context("lost signal did not fire after the lock was broken")?;
    expect_err!(
        guard.extend(Duration::from_secs(1)).await,
        Error::NotOwned { .. }
    );
    expect_err!(guard.release().await, Error::NotOwned { .. });
    Ok(())
}

/// A lock with a fixed TTL is not renewed, but its keeper still asks the store whether it is
/// held (every third of the TTL): a break is told while the lease still has time left, not
/// only when it runs out.
async fn a_fixed_ttl_lock_is_told_of_a_break_while_its_lease_has_time_left(
    cx: Ctx,
) -> anyhow::Result<()> {
    const TTL: Duration = Duration::from_secs(6);
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("fixed-broken");
    let asked = tokio::time::Instant::now();
    let guard = cx.lock(&a, &name).ttl(TTL).acquire().await?;
    ensure!(b.force_release(&name).await?);
    // The first check comes a third of the TTL after the request: allow a sixth more for its
    // round trip on a loaded machine. A check only at half the TTL, or at its end, misses this.
    tokio::time::timeout_at(asked + TTL / 3 + TTL / 6, guard.lost())
        .await
        .context("a fixed-TTL lock was not told of its break within a third of its TTL")?;
    expect_err!(guard.release().await, Error::NotOwned { .. });
    Ok(())
}

/// Holds of one client may share what keeps them alive (a session, one lease): a break of one
/// of them is still told to that holder alone, and the others keep their locks.
async fn a_break_signals_only_the_hold_broken_not_the_others_of_its_client(
    cx: Ctx,
) -> anyhow::Result<()> {
    const LEASE: Duration = Duration::from_millis(600);
    let a = cx.locks().await?.with_watchdog_lease(LEASE)?;
    let b = cx.locks().await?;
    let (broken, kept) = (cx.name("broken"), cx.name("kept"));
    let fixed = cx.name("kept-fixed");
    let victim = a.mutex(&broken).acquire().await?;
    let watched = a.mutex(&kept).acquire().await?;
    let with_ttl = a
        .mutex(&fixed)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?;
    ensure!(b.force_release(&broken).await?);
    tokio::time::timeout(Duration::from_secs(5), victim.lost())
        .await
        .context("the broken hold was not told")?;
    // A few renewal passes later the others still hold, by their own account and the store's.
    tokio::time::sleep(LEASE * 2).await;
    for (name, guard) in [(&kept, &watched), (&fixed, &with_ttl)] {
        ensure!(
            !guard.is_lost(),
            "{name} was told it was lost ({:?}) when only {broken} was broken",
            guard.lost_reason()
        );
        ensure!(guard.is_owned().await?, "{name} is no longer held");
        let holder = b.inspect(name).await?.context("inspect found no holder")?;
        ensure!(
            holder.fence == guard.fence(),
            "{name} is held by someone else"
        );
    }
    expect_err!(victim.release().await, Error::NotOwned { .. });
    watched.release().await?;
    with_ttl.release().await?;
    Ok(())
}
