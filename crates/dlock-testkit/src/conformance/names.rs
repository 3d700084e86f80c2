//! Bad input gets a typed error and leaves no lock state; odd but valid names work.

use std::time::Duration;

use anyhow::ensure;
use dlock::Error;
use dlock::limits::{MAX_NAME_LEN, MAX_TTL};
use futures::TryStreamExt;

use super::{Ctx, Needs, cases, expect_err};

cases!["names",
    Needs::Any =>
        bad_names_are_rejected,
        bad_arguments_are_rejected_before_the_store,
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
