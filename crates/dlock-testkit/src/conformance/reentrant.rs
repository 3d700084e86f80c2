//! Reentrant locks: hold counts kept in the store.

use std::time::Duration;

use anyhow::ensure;
use dlock::Error;

use super::{Ctx, Needs, cases, expect_err};

cases!["reentrant",
    Needs::Reentrant =>
        reentrant_hold_counts,
        reentrant_hold_count_expires_with_the_lease;
    Needs::NotReentrant =>
        reentrant_is_unsupported_error
];

async fn reentrant_hold_counts(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("nested");
    let outer = a.mutex(&name).reentrant().acquire().await?;
    let inner = a.mutex(&name).reentrant().no_wait().acquire().await?;
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
    let second = a
        .mutex(&name)
        .reentrant()
        .ttl(Duration::from_millis(200))
        .acquire()
        .await?;
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
