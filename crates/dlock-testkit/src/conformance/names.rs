//! Bad input gets a typed error and leaves no lock state; odd but valid names work.

use std::time::Duration;

use anyhow::ensure;
use dlock::backend::{AcquireRequest, Wait};
use dlock::limits::{MAX_NAME_LEN, MAX_TTL};
use dlock::{Error, LockName, Owner};
use futures::TryStreamExt;

use super::{Ctx, Needs, cases, expect_err};

cases!["names",
    Needs::Any =>
        bad_names_are_rejected,
        bad_arguments_are_rejected_before_the_store,
        durations_that_overflow_are_invalid_arguments_on_the_raw_api,
        names_differing_in_case_are_distinct,
        long_and_unicode_names_work;
    Needs::NotFair =>
        fair_is_unsupported_error
];

async fn bad_names_are_rejected(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let too_long = "n".repeat(MAX_NAME_LEN + 1);
    for bad in ["", too_long.as_str(), "a\0b"] {
        expect_err!(locks.mutex(bad).acquire().await, Error::InvalidName { .. });
        expect_err!(
            locks.mutex(bad).try_acquire().await,
            Error::InvalidName { .. }
        );
        if locks.info().capabilities.monitor {
            expect_err!(locks.inspect(bad).await, Error::InvalidName { .. });
            expect_err!(locks.force_release(bad).await, Error::InvalidName { .. });
        }
    }
    let prefix_with_nul: Result<Vec<_>, _> = locks.list("a\0").try_collect().await;
    expect_err!(prefix_with_nul, Error::InvalidName { .. });
    Ok(())
}

async fn bad_arguments_are_rejected_before_the_store(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let name = cx.name("args");
    expect_err!(
        locks.mutex(&name).ttl(Duration::ZERO).acquire().await,
        Error::InvalidArgument { .. }
    );
    expect_err!(
        locks
            .mutex(&name)
            .ttl(Duration::from_millis(1))
            .acquire()
            .await,
        Error::InvalidArgument { .. }
    );
    expect_err!(
        locks
            .mutex(&name)
            .ttl(MAX_TTL + Duration::from_secs(1))
            .acquire()
            .await,
        Error::InvalidArgument { .. }
    );
    expect_err!(
        locks.mutex(&name).wait(Duration::MAX).acquire().await,
        Error::InvalidArgument { .. }
    );
    expect_err!(
        locks.mutex(&name).max_hold(Duration::ZERO).acquire().await,
        Error::InvalidArgument { .. }
    );
    expect_err!(
        locks.with_watchdog_lease(Duration::ZERO),
        Error::InvalidArgument { .. }
    );
    expect_err!(
        locks.with_label("l".repeat(300)),
        Error::InvalidArgument { .. }
    );
    if locks.info().capabilities.monitor {
        ensure!(
            locks.inspect(&name).await?.is_none(),
            "a rejected request left a lock behind"
        );
    }
    // A held guard rejects a bad extend and stays held.
    let guard = locks
        .mutex(&name)
        .ttl(Duration::from_secs(10))
        .acquire()
        .await?;
    expect_err!(
        guard.extend(Duration::ZERO).await,
        Error::InvalidArgument { .. }
    );
    expect_err!(
        guard.extend(MAX_TTL * 2).await,
        Error::InvalidArgument { .. }
    );
    ensure!(!guard.is_lost());
    guard.release().await?;
    Ok(())
}

/// The raw `Backend`/`Lease` API is not behind the builders' checks: a lease or extension
/// too long for any clock (`Duration::MAX`) is an invalid argument there too, never a panic
/// or a store error, and leaves no lock (nor shortens a held one); a deadline far in the
/// future is only a long wait.
async fn durations_that_overflow_are_invalid_arguments_on_the_raw_api(
    cx: Ctx,
) -> anyhow::Result<()> {
    let (locks, other) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("raw-durations");
    let request = |ttl: Duration, wait: Wait| -> anyhow::Result<AcquireRequest> {
        Ok(AcquireRequest::new(
            LockName::new(&name)?,
            uuid::Uuid::new_v4().simple().to_string(),
            Owner::current(),
            ttl,
            wait,
        ))
    };
    expect_err!(
        locks
            .backend()
            .acquire(&request(Duration::MAX, Wait::No)?)
            .await,
        Error::InvalidArgument { .. }
    );
    other
        .mutex(&name)
        .try_acquire()
        .await?
        .ok_or_else(|| anyhow::anyhow!("a refused acquire left the lock held"))?
        .release()
        .await?;
    let lease = locks
        .backend()
        .acquire(&request(Duration::from_secs(30), Wait::No)?)
        .await?
        .ok_or_else(|| anyhow::anyhow!("not acquired"))?;
    expect_err!(
        lease.extend(Duration::MAX).await,
        Error::InvalidArgument { .. }
    );
    ensure!(
        !lease.lost().is_cancelled(),
        "a refused extend lost the lease"
    );
    lease.extend(Duration::from_secs(30)).await?;
    ensure!(
        other.mutex(&name).try_acquire().await?.is_none(),
        "a refused extend let the lock go"
    );
    // A waiter with a deadline a century away gets the lock once it is released.
    let far = Wait::Until(tokio::time::Instant::now() + Duration::from_secs(100 * 365 * 86_400));
    let waiting = tokio::spawn({
        let backend = other.backend().clone();
        let request = request(Duration::from_secs(30), far)?;
        async move { backend.acquire(&request).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    lease.release().await?;
    let granted = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .map_err(|_| anyhow::anyhow!("the far-deadline waiter was not granted the freed lock"))???
        .ok_or_else(|| anyhow::anyhow!("the far-deadline waiter gave up"))?;
    granted.release().await?;
    Ok(())
}

async fn names_differing_in_case_are_distinct(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let upper = locks.mutex(cx.name("Report")).acquire().await?;
    let lower = locks.mutex(cx.name("report")).try_acquire().await?;
    ensure!(lower.is_some(), "names differing in case collided");
    upper.release().await?;
    Ok(())
}

async fn long_and_unicode_names_work(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let base = cx.name("");
    let long = format!("{base}{}", "x".repeat(MAX_NAME_LEN - base.len()));
    let unicode = cx.name("заказы/ünïcødé/🔒 with spaces");
    for name in [long, unicode] {
        let guard = locks.mutex(&name).acquire().await?;
        ensure!(
            cx.locks()
                .await?
                .mutex(&name)
                .try_acquire()
                .await?
                .is_none()
        );
        if locks.info().capabilities.monitor {
            ensure!(locks.inspect(&name).await?.is_some_and(|i| i.name == name));
        }
        guard.release().await?;
    }
    Ok(())
}

async fn fair_is_unsupported_error(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    expect_err!(
        locks.mutex(cx.name("f")).fair().acquire().await,
        Error::Unsupported { .. }
    );
    Ok(())
}
