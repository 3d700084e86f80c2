#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

//! What is specific to a Redis Cluster, on six real nodes started by the test kit (three
//! primaries, a replica each): a primary killed during a hold and a wait, a slot moved to
//! another primary during a hold and a wait, and a cluster URL that names a plain server.
//! Everything every backend must do is in the conformance suite, which runs on this cluster as
//! `redis-cluster`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::ensure;
use dlock::Error;
use dlock_testkit::fixture::{Fixture, RedisClusterFixture};
use dlock_testkit::server::{Redis, RedisCluster, ServerError, ServerProcess};
use tokio::time::{sleep, timeout};

macro_rules! cluster_or_skip {
    () => {
        match RedisClusterFixture::start()? {
            Some(fixture) => fixture,
            None => return Ok(()),
        }
    };
}

/// The key of a mutex's value on a cluster with the default prefix.
fn lock_key(name: &str) -> String {
    format!("dlock:lock:{{={name}}}")
}

fn fault<T>(
    fx: &Arc<RedisClusterFixture>,
    what: impl FnOnce(&mut RedisCluster) -> Result<T, ServerError>,
) -> anyhow::Result<T> {
    Ok(tokio::task::block_in_place(|| what(&mut fx.server()))?)
}

/// One client holds, another waits, then `strike` disturbs the lock's slot: the hold must
/// live on (renewed through the change), the release must reach the waiter, and its fence
/// must be greater.
async fn a_hold_and_a_wait_survive(
    fx: &Arc<RedisClusterFixture>,
    name: &str,
    strike: impl FnOnce(&mut RedisCluster) -> Result<(), ServerError>,
) -> anyhow::Result<()> {
    let lease = Duration::from_secs(10);
    let holder = fx.connect().await?.with_watchdog_lease(lease)?;
    let waiter = fx.connect().await?.with_watchdog_lease(lease)?;
    let guard = holder.mutex(name).acquire().await?;
    let held_fence = guard.fence();
    let wanted = name.to_owned();
    let waiting = tokio::spawn(async move {
        let guard = waiter
            .mutex(&wanted)
            .wait(Duration::from_secs(90))
            .acquire()
            .await?;
        Ok::<_, Error>((guard.fence(), guard))
    });
    sleep(Duration::from_millis(300)).await;
    tokio::task::block_in_place(|| strike(&mut fx.server()))?;
    // A renewal must have gone through since the strike.
    guard.extend(lease).await?;
    ensure!(!guard.is_lost(), "the hold was reported lost");
    ensure!(
        !waiting.is_finished(),
        "the waiter got the lock while it was held"
    );
    let inspected = holder.inspect(name).await?;
    ensure!(
        inspected.as_ref().map(|info| info.fence) == Some(held_fence),
        "inspected as {inspected:?}"
    );
    guard.release().await?;
    let (fence, next) = timeout(Duration::from_secs(20), waiting).await???;
    ensure!(
        fence > held_fence,
        "fence {fence} after, {held_fence} before"
    );
    next.release().await?;
    Ok(())
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_is_replaced_by_its_replica_during_a_hold_and_a_wait() -> anyhow::Result<()>
{
    let fx = cluster_or_skip!();
    let name = "cluster/failover";
    let before = fault(&fx, |c| c.primary_of(&lock_key(name)))?;
    a_hold_and_a_wait_survive(&fx, name, |c| c.kill_primary_of(&lock_key(name))).await?;
    let after = fault(&fx, |c| c.primary_of(&lock_key(name)))?;
    ensure!(before != after, "the lock's slot did not change hands");
    Ok(())
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_moved_to_another_primary_during_a_hold_and_a_wait_is_followed() -> anyhow::Result<()>
{
    let fx = cluster_or_skip!();
    let name = "cluster/resharded";
    let before = fault(&fx, |c| c.primary_of(&lock_key(name)))?;
    a_hold_and_a_wait_survive(&fx, name, |c| c.move_slot_of(&lock_key(name)).map(drop)).await?;
    let after = fault(&fx, |c| c.primary_of(&lock_key(name)))?;
    ensure!(before != after, "the lock's slot did not move");
    Ok(())
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_url_naming_a_plain_server_is_a_typed_error() -> anyhow::Result<()> {
    let server = match ServerProcess::start(Redis::default()) {
        Ok(server) => server,
        Err(e) if e.is_not_found() && !dlock_testkit::server::required("redis") => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let url = format!("redis+cluster://{}", server.addr());
    match dlock::connect(&url).await {
        Err(error @ Error::InvalidArgument { .. }) => {
            let message = format!("{error} {error:?}");
            ensure!(message.contains("not a Redis Cluster node"), "{message}");
        }
        other => anyhow::bail!("a plain server behind redis+cluster://: {other:?}"),
    }
    // The server has no password: one given is refused, and not shown.
    let refused = format!("redis+cluster://app:hunter2@{}", server.addr());
    match dlock::connect(&refused).await {
        Err(error @ Error::Unauthenticated { .. }) => {
            let message = format!("{error} {error:?}");
            ensure!(!message.contains("hunter2"), "{message}");
        }
        other => anyhow::bail!("a refused password: {other:?}"),
    }
    let unreachable = format!(
        "redis+cluster://127.0.0.1:{}?connect_timeout=200ms",
        dlock_testkit::server::free_port()?
    );
    ensure!(
        matches!(
            dlock::connect(&unreachable).await,
            Err(Error::Unavailable { .. })
        ),
        "an unreachable cluster"
    );
    Ok(())
}
