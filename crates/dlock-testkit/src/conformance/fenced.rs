//! Fenced writes: a value written only while a hold is still its lock's current holder, the
//! store checking and writing in one step. A holder paused past its lease (simulated here by
//! a fixed TTL nobody renews, or a break) must find its write refused, with nothing written.
//!
//! Value names carry their lock's Redis Cluster hash tag (`{=lock}/state`, the tag of the
//! lock's keys), which keeps the value in the lock's slot there and is an ordinary name
//! everywhere else.

use std::time::Duration;

use anyhow::{Context, ensure};
use dlock::{Error, Locks, LostReason, VersionedValue};

use super::{Ctx, Needs, cases, expect_err};

cases!["fenced",
    Needs::FencedWrites =>
        a_fenced_write_by_the_current_holder_lands,
        a_fenced_write_after_the_lease_ran_out_is_refused_and_writes_nothing,
        a_fenced_write_after_another_took_the_expired_lock_is_refused_and_writes_nothing,
        bad_fenced_write_input_is_refused_before_any_store_call,
        a_fenced_write_with_a_shared_hold_is_unsupported,
        a_leadership_fences_a_write_with_its_term;
    Needs::FencedWritesMonitor =>
        a_fenced_write_after_a_break_is_refused_and_writes_nothing;
    Needs::FencedWritesCrossProcess =>
        a_blocking_fenced_write_lands_then_is_refused_once_the_lease_ran_out;
    Needs::NotFencedWrites =>
        fenced_writes_are_unsupported_error
];

/// A short fixed TTL: the hold runs out in the store while the test waits.
const SHORT_TTL: Duration = Duration::from_secs(1);

/// The value kept beside lock `lock`, in its Redis Cluster slot.
fn beside(lock: &str) -> String {
    format!("{{={lock}}}/state")
}

/// The value as it stands, failing if it was never written.
async fn read(value: &VersionedValue) -> anyhow::Result<dlock::Versioned> {
    value.get().await?.context("the value is gone")
}

/// Checks that a refused write left `value` at `before`.
async fn unchanged(value: &VersionedValue, before: &dlock::Versioned) -> anyhow::Result<()> {
    let now = read(value).await?;
    ensure!(
        &now == before,
        "a refused fenced write changed the value: {now:?}, was {before:?}"
    );
    Ok(())
}

async fn a_fenced_write_by_the_current_holder_lands(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let lock = cx.name("lands");
    let value = a.value(beside(&lock));
    let blind = value.set(b"before").await?;
    let guard = a
        .mutex(&lock)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?;
    let first = value.set_fenced(&guard, b"one").await?;
    ensure!(first > blind, "version {first} after {blind}");
    // Another client of the same store writes with the hold as well: the hold decides.
    let second = b.value(beside(&lock)).set_fenced(&guard, b"two").await?;
    ensure!(second > first, "version {second} after {first}");
    let now = read(&value).await?;
    ensure!(
        now.value == b"two" && now.version == second,
        "read {now:?}, expected two at {second}"
    );
    ensure!(guard.is_owned().await?, "a fenced write broke its own hold");
    guard.release().await?;
    Ok(())
}

/// The paused holder with nobody after it: its lease ran out in the store, so its write is
/// refused even though no one else holds the lock.
async fn a_fenced_write_after_the_lease_ran_out_is_refused_and_writes_nothing(
    cx: Ctx,
) -> anyhow::Result<()> {
    let a = cx.locks().await?;
    let lock = cx.name("ran-out");
    let value = a.value(beside(&lock));
    let guard = a.mutex(&lock).ttl(SHORT_TTL).acquire().await?;
    value.set_fenced(&guard, b"mine").await?;
    let before = read(&value).await?;
    // Generously past the lease, by any clock the store keeps.
    tokio::time::sleep(SHORT_TTL * 3).await;
    expect_err!(value.set_fenced(&guard, b"late").await, Error::Lost { .. });
    unchanged(&value, &before).await?;
    ensure!(
        guard.is_lost(),
        "a refused fenced write left the hold unsignalled"
    );
    Ok(())
}

/// The paused holder of the issue: its lease ran out and another holder took the lock; the
/// old holder's write is refused and the new holder's lands.
async fn a_fenced_write_after_another_took_the_expired_lock_is_refused_and_writes_nothing(
    cx: Ctx,
) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let lock = cx.name("taken");
    let value = a.value(beside(&lock));
    let old = a.mutex(&lock).ttl(SHORT_TTL).acquire().await?;
    value.set_fenced(&old, b"old").await?;
    let new = b
        .mutex(&lock)
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(60))
        .acquire()
        .await?;
    let landed = b.value(beside(&lock)).set_fenced(&new, b"new").await?;
    expect_err!(value.set_fenced(&old, b"stale").await, Error::Lost { .. });
    let now = read(&value).await?;
    ensure!(
        now.value == b"new" && now.version == landed,
        "the old holder's write got through: {now:?}"
    );
    ensure!(new.is_owned().await?, "the new holder lost its hold");
    new.release().await?;
    Ok(())
}

async fn a_fenced_write_after_a_break_is_refused_and_writes_nothing(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let lock = cx.name("broken");
    let value = a.value(beside(&lock));
    let guard = a
        .mutex(&lock)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?;
    value.set_fenced(&guard, b"mine").await?;
    let before = read(&value).await?;
    ensure!(b.force_release(&lock).await?, "nothing to break");
    match value.set_fenced(&guard, b"after the break").await {
        Err(Error::Lost { reason }) => ensure!(
            matches!(
                reason,
                LostReason::Broken | LostReason::StoreSignal | LostReason::RenewalRefused
            ),
            "reason {reason:?}"
        ),
        other => anyhow::bail!("expected Error::Lost, got {other:?}"),
    }
    unchanged(&value, &before).await?;
    Ok(())
}

async fn bad_fenced_write_input_is_refused_before_any_store_call(cx: Ctx) -> anyhow::Result<()> {
    let a = cx.locks().await?;
    let lock = cx.name("bad");
    let guard = a
        .mutex(&lock)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?;
    let value = a.value(beside(&lock));
    expect_err!(
        value
            .set_fenced(&guard, vec![0u8; dlock::limits::MAX_VALUE_LEN + 1])
            .await,
        Error::InvalidArgument { .. }
    );
    expect_err!(
        a.value("").set_fenced(&guard, b"x").await,
        Error::InvalidName { .. }
    );
    expect_err!(
        a.value("a\0b").set_fenced(&guard, b"x").await,
        Error::InvalidName { .. }
    );
    ensure!(value.get().await?.is_none(), "a refused write left a value");
    ensure!(
        !guard.is_lost() && guard.is_owned().await?,
        "bad input cost the hold"
    );
    guard.release().await?;
    Ok(())
}

/// A permit or a read hold is not the one current holder of anything: no fence to write by.
async fn a_fenced_write_with_a_shared_hold_is_unsupported(cx: Ctx) -> anyhow::Result<()> {
    let a = cx.locks().await?;
    let name = cx.name("shared");
    let value = a.value(beside(&name));
    let permit = a
        .semaphore(&name, 2)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?;
    expect_err!(
        value.set_fenced(&permit, b"x").await,
        Error::Unsupported { .. }
    );
    permit.release().await?;
    ensure!(value.get().await?.is_none(), "a refused write left a value");
    Ok(())
}

/// A leader's writes are fenced by its term's hold: they land while it leads, and the next
/// leader's land after it resigns.
async fn a_leadership_fences_a_write_with_its_term(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("elected");
    let value = a.value(beside(&name));
    let leading = a.election(&name).campaign(b"a").await?;
    let version = value.set_fenced(&leading, b"by a").await?;
    ensure!(
        read(&value).await?.version == version,
        "the leader's write is missing"
    );
    let rival = b.election(&name).campaign(b"b");
    leading.resign().await?;
    let rival = tokio::time::timeout(Duration::from_secs(60), rival)
        .await
        .context("the rival never led")??;
    let landed = b.value(beside(&name)).set_fenced(&rival, b"by b").await?;
    ensure!(landed > version, "version {landed} after {version}");
    rival.resign().await?;
    Ok(())
}

/// The blocking facade's twin, on the caller's own thread (where Redis sends its commands
/// over a blocking connection).
async fn a_blocking_fenced_write_lands_then_is_refused_once_the_lease_ran_out(
    cx: Ctx,
) -> anyhow::Result<()> {
    let (url, lock) = (cx.url()?, cx.name("blocking"));
    super::blocking::on_plain_thread(move || {
        let locks = dlock::blocking::Locks::connect(&url)?;
        let value = locks.value(beside(&lock));
        let guard = locks.mutex(&lock).ttl(SHORT_TTL).acquire()?;
        let version = value.set_fenced(&guard, b"mine")?;
        std::thread::sleep(SHORT_TTL * 3);
        expect_err!(value.set_fenced(&guard, b"late"), Error::Lost { .. });
        let now = value.get()?.context("the value is gone")?;
        ensure!(
            now.version == version && now.value == b"mine",
            "a refused blocking write changed the value: {now:?}"
        );
        Ok(())
    })
    .await
}

async fn fenced_writes_are_unsupported_error(cx: Ctx) -> anyhow::Result<()> {
    let locks: Locks = cx.locks().await?;
    let lock = cx.name("unsupported");
    let guard = locks
        .mutex(&lock)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?;
    expect_err!(
        locks.value(beside(&lock)).set_fenced(&guard, b"x").await,
        Error::Unsupported { .. }
    );
    guard.release().await?;
    Ok(())
}
