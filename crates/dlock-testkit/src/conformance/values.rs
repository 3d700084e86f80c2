//! Versioned values: compare-and-set is atomic, stale versions fail, and concurrent updates
//! lose nothing (where a read, a client-side compare and a blind write do).

use std::time::Duration;

use anyhow::ensure;
use dlock::{Error, Locks};

use super::{Ctx, Needs, cases, expect_err};

cases!["values",
    Needs::Values =>
        unwritten_value_reads_as_none,
        compare_and_set_fails_on_a_stale_version,
        versions_grow_with_every_write,
        concurrent_updates_lose_nothing,
        eight_writers_never_give_up_under_the_default_attempts,
        update_that_declines_writes_nothing,
        read_compare_then_blind_write_loses_updates,
        update_gives_up_with_a_conflict_error,
        bad_value_input_is_rejected,
        values_and_locks_do_not_collide;
    Needs::NotValues =>
        values_are_unsupported_error
];

fn number(bytes: Option<&[u8]>) -> u64 {
    bytes
        .and_then(|b| std::str::from_utf8(b).ok())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

async fn unwritten_value_reads_as_none(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    ensure!(
        locks.value(cx.name("never")).get().await?.is_none(),
        "unwritten value has a version"
    );
    Ok(())
}

async fn compare_and_set_fails_on_a_stale_version(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("cas");
    let v1 = a
        .value(&name)
        .compare_and_set(None, b"one")
        .await?
        .ok_or_else(|| anyhow::anyhow!("first write refused"))?;
    ensure!(
        b.value(&name)
            .compare_and_set(None, b"again")
            .await?
            .is_none(),
        "create over a value"
    );
    let v2 = b
        .value(&name)
        .compare_and_set(Some(v1), b"two")
        .await?
        .ok_or_else(|| anyhow::anyhow!("write at the current version refused"))?;
    ensure!(
        a.value(&name)
            .compare_and_set(Some(v1), b"stale")
            .await?
            .is_none(),
        "write at a stale version accepted"
    );
    let now = a
        .value(&name)
        .get()
        .await?
        .ok_or_else(|| anyhow::anyhow!("value gone"))?;
    ensure!(
        now.value == b"two" && now.version == v2,
        "read {now:?}, expected two at {v2}"
    );
    Ok(())
}

async fn versions_grow_with_every_write(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let value = locks.value(cx.name("grow"));
    let mut last = 0;
    for i in 0..5 {
        let version = value.set(format!("{i}")).await?;
        ensure!(version > last, "version {version} after {last}");
        last = version;
    }
    let read = value
        .get()
        .await?
        .ok_or_else(|| anyhow::anyhow!("value gone"))?;
    ensure!(read.version == last && read.value == b"4", "read {read:?}");
    Ok(())
}

async fn concurrent_updates_lose_nothing(cx: Ctx) -> anyhow::Result<()> {
    const TASKS: u64 = 6;
    const ROUNDS: u64 = 8;
    let name = cx.name("counter");
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..TASKS {
        let locks = cx.locks().await?;
        let name = name.clone();
        tasks.spawn(async move {
            for _ in 0..ROUNDS {
                locks
                    .value(&name)
                    .max_attempts(10_000)
                    .update(|n| Some((number(n) + 1).to_string().into_bytes()))
                    .await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let total = number(
        cx.locks()
            .await?
            .value(&name)
            .get()
            .await?
            .map(|v| v.value)
            .as_deref(),
    );
    ensure!(
        total == TASKS * ROUNDS,
        "counter is {total}, expected {}",
        TASKS * ROUNDS
    );
    Ok(())
}

/// The contention of a flash sale on one counter, under the default attempts: 8 clients
/// × 50 increments, every one written and none given up with `Conflict` (the retry pause is
/// paced by the store's own round trip, so writers spread out on a network store too).
async fn eight_writers_never_give_up_under_the_default_attempts(cx: Ctx) -> anyhow::Result<()> {
    const TASKS: u64 = 8;
    const ROUNDS: u64 = 50;
    let name = cx.name("flash-sale");
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..TASKS {
        let locks = cx.locks().await?;
        let name = name.clone();
        tasks.spawn(async move {
            for _ in 0..ROUNDS {
                locks
                    .value(&name)
                    .update(|n| Some((number(n) + 1).to_string().into_bytes()))
                    .await?
                    .ok_or_else(|| anyhow::anyhow!("an increment was not written"))?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let total = number(
        cx.locks()
            .await?
            .value(&name)
            .get()
            .await?
            .map(|v| v.value)
            .as_deref(),
    );
    ensure!(
        total == TASKS * ROUNDS,
        "counter is {total}, expected {}",
        TASKS * ROUNDS
    );
    Ok(())
}

/// A change function that returns `None` leaves the value (and its version) as it is, and the
/// caller can tell nothing was written.
async fn update_that_declines_writes_nothing(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let stock = locks.value(cx.name("stock"));
    ensure!(
        stock.update(|_| None).await?.is_none(),
        "a declined update on an unwritten value reported a write"
    );
    ensure!(
        stock.get().await?.is_none(),
        "a declined update created the value"
    );
    let version = stock.set(b"0").await?;
    let take_one = |n: Option<&[u8]>| {
        let left = number(n);
        (left > 0).then(|| (left - 1).to_string().into_bytes())
    };
    ensure!(
        stock.update(take_one).await?.is_none(),
        "sold out, yet the update reported a write"
    );
    let now = stock
        .get()
        .await?
        .ok_or_else(|| anyhow::anyhow!("value gone"))?;
    ensure!(
        now.version == version && now.value == b"0",
        "a declined update wrote: {now:?} (was version {version})"
    );
    Ok(())
}

/// The seed article's approach: read the value and version, compare in the client, write. When
/// the writers interleave as they do under load (every read and check before any write), it
/// loses increments. A barrier makes that interleaving happen every round, so the loss is
/// certain rather than left to scheduling luck.
async fn read_compare_then_blind_write_loses_updates(cx: Ctx) -> anyhow::Result<()> {
    const TASKS: u64 = 6;
    const ROUNDS: u64 = 8;
    let name = cx.name("seed-counter");
    let checked = std::sync::Arc::new(tokio::sync::Barrier::new(TASKS as usize));
    let written = std::sync::Arc::new(tokio::sync::Barrier::new(TASKS as usize));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..TASKS {
        let locks: Locks = cx.locks().await?;
        let name = name.clone();
        let (checked, written) = (checked.clone(), written.clone());
        tasks.spawn(async move {
            for _ in 0..ROUNDS {
                let value = locks.value(&name);
                let read = value.get().await?;
                let seen = read.as_ref().map(|r| r.version);
                let again = value.get().await?.map(|r| r.version);
                // Every writer has read and compared before any of them writes.
                checked.wait().await;
                if again == seen {
                    value
                        .set((number(read.as_ref().map(|r| r.value.as_slice())) + 1).to_string())
                        .await?;
                }
                written.wait().await;
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let total = number(
        cx.locks()
            .await?
            .value(&name)
            .get()
            .await?
            .map(|v| v.value)
            .as_deref(),
    );
    ensure!(
        total == ROUNDS,
        "the read-compare-write approach should keep one increment per round ({ROUNDS}) \
         when every writer checks before any writes, got {total}"
    );
    Ok(())
}

async fn update_gives_up_with_a_conflict_error(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("conflict");
    a.value(&name).set(b"0").await?;
    let rival = b.value(&name);
    // Every attempt's write is beaten by a rival write made inside the change function.
    let handle = tokio::runtime::Handle::current();
    let result = tokio::task::spawn_blocking(move || {
        handle.block_on(a.value(&name).max_attempts(3).update(|n| {
            let rival = rival.clone();
            let _ = std::thread::spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map(|rt| rt.block_on(rival.set(b"rival")))
            })
            .join();
            Some((number(n) + 1).to_string().into_bytes())
        }))
    })
    .await?;
    expect_err!(result, Error::Conflict { attempts: 3, .. });
    Ok(())
}

async fn bad_value_input_is_rejected(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let name = cx.name("bad");
    expect_err!(
        locks
            .value(&name)
            .set(vec![0u8; dlock::limits::MAX_VALUE_LEN + 1])
            .await,
        Error::InvalidArgument { .. }
    );
    expect_err!(locks.value("").get().await, Error::InvalidName { .. });
    expect_err!(
        locks.value("a\0b").set(b"x").await,
        Error::InvalidName { .. }
    );
    expect_err!(
        locks
            .value(&name)
            .max_attempts(0)
            .update(|_| Some(Vec::new()))
            .await,
        Error::InvalidArgument { .. }
    );
    ensure!(
        locks.value(&name).get().await?.is_none(),
        "a rejected write left a value"
    );
    // Any bytes round-trip, including empty and non-UTF-8 ones.
    for bytes in [
        Vec::new(),
        vec![0, 255, 0, 1],
        vec![7u8; dlock::limits::MAX_VALUE_LEN],
    ] {
        locks.value(&name).set(&bytes).await?;
        let read = locks.value(&name).get().await?.map(|r| r.value);
        ensure!(
            read.as_deref() == Some(bytes.as_slice()),
            "{} bytes did not round-trip",
            bytes.len()
        );
    }
    Ok(())
}

async fn values_and_locks_do_not_collide(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let name = cx.name("both");
    let guard = locks
        .mutex(&name)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?;
    locks.value(&name).set(b"v").await?;
    ensure!(
        guard.is_owned().await?,
        "writing a value broke the lock of the same name"
    );
    guard.release().await?;
    ensure!(
        locks.value(&name).get().await?.is_some(),
        "releasing the lock removed the value"
    );
    Ok(())
}

async fn values_are_unsupported_error(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    expect_err!(
        locks.value(cx.name("v")).get().await,
        Error::Unsupported { .. }
    );
    expect_err!(
        locks.value(cx.name("v")).set(b"x").await,
        Error::Unsupported { .. }
    );
    Ok(())
}
