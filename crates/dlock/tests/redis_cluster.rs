#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

//! What is specific to a Redis Cluster, on six real nodes started by the test kit (three
//! primaries, a replica each): hand-off on the lock's shard channel, a primary killed during a
//! hold and a wait, a slot moved to another primary during a hold and a wait, `min_replicas`
//! with one shard's replica lagging, and a cluster URL that names a plain server.
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
            // The build found redis-server (or these tests are ignored): missing now is an
            // error, not a skip (`dlock_testkit::require`).
            None => return Err(dlock_testkit::require::missing_now("redis")),
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

/// The shard channel of a mutex on a cluster with the default prefix.
fn wake_channel(name: &str) -> String {
    format!("dlock:wake:{{={name}}}")
}

/// Subscribers of `channel` on the node at `addr`: (classic, sharded).
fn subscribers(addr: std::net::SocketAddr, channel: &str) -> anyhow::Result<(i64, i64)> {
    let mut admin = redis::Client::open(format!("redis://{addr}"))?.get_connection()?;
    let count = |command: &str, admin: &mut redis::Connection| -> anyhow::Result<i64> {
        let reply: (String, i64) = redis::cmd("PUBSUB")
            .arg(command)
            .arg(channel)
            .query(admin)?;
        Ok(reply.1)
    };
    Ok((
        count("NUMSUB", &mut admin)?,
        count("SHARDNUMSUB", &mut admin)?,
    ))
}

/// Waits (up to 20 s) until a node that carries `name`'s slot (its primary, or a replica of
/// that primary: both accept shard subscriptions and both carry the slot's `SPUBLISH`) has a
/// shard subscriber of its channel, and checks that no node has a classic one and no node
/// outside the slot's shard a shard one. A failure lists every node's subscribers.
async fn shard_subscribed_in_slots_shard(
    fx: &Arc<RedisClusterFixture>,
    name: &str,
) -> anyhow::Result<()> {
    let channel = wake_channel(name);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (shard, nodes) = {
            let cluster = fx.server();
            let shard = cluster.shard_of(&lock_key(name))?;
            let nodes: Vec<_> = cluster.nodes.iter().map(|n| n.addr()).collect();
            (shard, nodes)
        };
        let counts = nodes
            .iter()
            .map(|addr| subscribers(*addr, &channel).unwrap_or((-1, -1)))
            .collect::<Vec<_>>();
        if shard.iter().any(|&i| counts[i].1 > 0) {
            for (index, (classic, sharded)) in counts.iter().enumerate() {
                ensure!(
                    *classic == 0,
                    "node {index} has a classic subscriber of {channel}"
                );
                ensure!(
                    shard.contains(&index) || *sharded == 0,
                    "node {index} (outside the slot's shard {shard:?}) has a shard subscriber of \
                     {channel}"
                );
            }
            return Ok(());
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "no shard subscriber of {channel} in its slot's shard {shard:?} (primary first); \
             (classic, shard) subscribers per node: {counts:?}"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// One client holds, another waits, then `strike` disturbs the
/// lock's slot: the hold must live on (renewed through the change), the release must reach
/// the waiter, and its fence must be greater.
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
    // The waiter listens again, at the node that serves the slot now.
    shard_subscribed_in_slots_shard(fx, name).await?;
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
async fn a_release_is_published_on_the_locks_shard_channel_at_its_slots_node() -> anyhow::Result<()>
{
    let fx = cluster_or_skip!();
    let name = "cluster/sharded";
    let holder = fx.connect().await?;
    let waiter = fx.connect().await?;
    let guard = holder.mutex(name).acquire().await?;
    let wanted = name.to_owned();
    let waiting = tokio::spawn(async move {
        waiter
            .mutex(&wanted)
            .wait(Duration::from_secs(50))
            .acquire()
            .await
    });
    shard_subscribed_in_slots_shard(&fx, name).await?;
    // A listener of our own on the slot's node hears the release, naming the waiter's token.
    let owner = {
        let cluster = fx.server();
        cluster.nodes[cluster.primary_of(&lock_key(name))?].addr()
    };
    let channel = wake_channel(name);
    let mut listener = redis::Client::open(format!("redis://{owner}"))?.get_connection()?;
    let _: redis::Value = redis::cmd("SSUBSCRIBE")
        .arg(&channel)
        .query(&mut listener)?;
    listener.set_read_timeout(Some(Duration::from_secs(10)))?;
    guard.release().await?;
    let heard = listener.recv_response()?;
    let redis::Value::Array(parts) = heard else {
        anyhow::bail!("not a message: {heard:?}");
    };
    let text: Vec<String> = parts
        .iter()
        .map(|part| redis::from_redis_value_ref::<String>(part).unwrap_or_default())
        .collect();
    ensure!(
        text.len() == 3 && text[0] == "smessage" && text[1] == channel && !text[2].is_empty(),
        "heard {text:?}"
    );
    let next = timeout(Duration::from_secs(20), waiting).await???;
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

/// What a lost signal may take beyond its promised bound here: the client's reconnection to
/// the promoted node, and scheduling on a loaded 2-core test machine.
const SIGNAL_TOLERANCE: Duration = Duration::from_millis(500);

/// The primary of a held lock dies before any replica had the hold: once the replica is
/// promoted, the holder is told within a third of its lease (the promise), a hold the replica
/// had lives on, and the next holder of the lost lock gets a greater fence.
#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_the_promoted_replica_never_had_is_signalled_within_a_third_of_its_lease()
-> anyhow::Result<()> {
    let fx = cluster_or_skip!();
    let lease = Duration::from_secs(6);
    let (lost_name, kept_name) = ("cluster/unreplicated", "cluster/replicated");
    let lost_key = lock_key(lost_name);
    // The kept lock on the same shard, so the same failover strikes it.
    let primary = fault(&fx, |c| c.primary_of(&lost_key))?;
    let holder = fx.connect().await?.with_watchdog_lease(lease)?;
    let kept_name = (0..)
        .map(|i| format!("{kept_name}-{i}"))
        .find(|name| fault(&fx, |c| c.primary_of(&lock_key(name))).ok() == Some(primary))
        .expect("a name on the same shard");
    // The replica's copy of the kept hold expires one lease after it was written (renewals
    // after the cut never reach it), and a failover under load can take longer than the
    // 6 s lease: a long lease of its own keeps this hold's survival about what the replica had.
    let kept = fx
        .connect()
        .await?
        .with_watchdog_lease(Duration::from_secs(60))?
        .mutex(&kept_name)
        .acquire()
        .await?;
    // The replica must have the kept hold before it is cut off.
    let primary_addr = fx.server().nodes[primary].addr();
    let acked: i64 = tokio::task::block_in_place(|| {
        let mut conn = redis::Client::open(format!("redis://{primary_addr}"))?.get_connection()?;
        redis::cmd("WAIT").arg(1).arg(5000).query(&mut conn)
    })?;
    ensure!(acked == 1, "the replica did not acknowledge the kept hold");
    let replica = fault(&fx, |c| Ok(c.shard_of(&lost_key)?[1]))?;
    let replica_addr = fx.server().nodes[replica].addr();
    let cut = fault(&fx, |c| c.cut_off_replicas_of(&lost_key))?;
    let lost = holder.mutex(lost_name).acquire().await?;
    let lost_fence = lost.fence();
    let promoted = tokio::task::spawn_blocking(move || {
        dlock_testkit::server::became_primary(replica_addr, lease * 6)
    });
    let told = tokio::spawn(async move {
        let told = timeout(lease * 4, lost.lost())
            .await
            .map(|()| tokio::time::Instant::now());
        (told, lost)
    });
    fault(&fx, |c| c.kill_primary_of_cut_off(&lost_key, &cut))?;
    let promoted_at = promoted.await??;
    let (told_at, lost) = told.await?;
    let told_at = told_at
        .map_err(|_| anyhow::anyhow!("a hold the promoted replica never had was not told"))?;
    let lag = told_at.into_std().saturating_duration_since(promoted_at);
    ensure!(
        lag <= lease / 3 + SIGNAL_TOLERANCE,
        "told {lag:?} after the replica was promoted; the promise is a third of the {lease:?} \
         lease (+ {SIGNAL_TOLERANCE:?})"
    );
    ensure!(lost.is_lost());
    ensure!(
        !kept.is_lost(),
        "a hold the replica had was reported lost ({:?})",
        kept.lost_reason()
    );
    kept.extend(lease).await?;
    let next = fx
        .connect()
        .await?
        .mutex(lost_name)
        .wait(Duration::from_secs(5))
        .acquire()
        .await?;
    ensure!(
        next.fence() > lost_fence,
        "fence {} after the failover, {lost_fence} for the hold it lost",
        next.fence()
    );
    next.release().await?;
    kept.release().await?;
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

/// `min_replicas` waits for the replicas of the lock's own shard, not of every shard: with one
/// shard's replica paused, a lock whose slot another primary serves is still granted and
/// extended, and one on the paused shard is refused with a clear error and left free.
#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_waits_only_on_the_replicas_of_the_locks_shard() -> anyhow::Result<()> {
    let fx = cluster_or_skip!();
    let lagging = "acked/lagging";
    let lagging_primary = fault(&fx, |c| c.primary_of(&lock_key(lagging)))?;
    let mut elsewhere = None;
    for i in 0.. {
        let name = format!("acked/elsewhere-{i}");
        if fault(&fx, |c| c.primary_of(&lock_key(&name)))? != lagging_primary {
            elsewhere = Some(name);
            break;
        }
    }
    let elsewhere = elsewhere.expect("three primaries share the slots");
    // Long enough for an acknowledgement on a loaded CI machine; the refusal waits this long.
    let url = format!(
        "{}?min_replicas=1&timeout=5s&replica_timeout=2s",
        fx.url().unwrap()
    );
    let acked = dlock::connect(&url).await?;
    let plain = fx.connect().await?;
    // Every replica acknowledges: both shards grant.
    for name in [lagging, elsewhere.as_str()] {
        acked.mutex(name).acquire().await?.release().await?;
    }

    let paused = fault(&fx, |c| c.pause_replicas_of(&lock_key(lagging)))?;
    // The lagging shard first: its primary then has writes of this client no replica has.
    let refused = acked.mutex(lagging).acquire().await;
    let granted = acked.mutex(&elsewhere).acquire().await;
    let extended = match &granted {
        Ok(guard) => Some(guard.extend(Duration::from_secs(30)).await),
        Err(_) => None,
    };
    fault(&fx, |c| {
        paused
            .iter()
            .try_for_each(|&replica| c.nodes[replica].resume())
    })?;

    let granted = granted.map_err(|e| {
        anyhow::anyhow!("a lock on a shard whose replica keeps up was refused: {e}")
    })?;
    ensure!(
        matches!(extended, Some(Ok(()))),
        "its extension: {extended:?}"
    );
    match refused {
        Err(Error::Unavailable { source, .. }) if source.to_string().contains("min_replicas") => {}
        other => anyhow::bail!("a grant the lagging shard's replica never had: {other:?}"),
    }
    // Nothing of the refused grant is left held.
    let free = plain.mutex(lagging).try_acquire().await?;
    ensure!(
        free.is_some(),
        "a grant the replicas never confirmed is still held"
    );
    granted.release().await?;
    Ok(())
}

/// A fenced write checks the lock's key and writes the value's key in one script, which a
/// Cluster runs only when both keys are in one slot: a value in another slot is refused with
/// a typed error and nothing written (never checked on one node and written on another), and
/// the same value named with the lock's hash tag lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_write_of_a_value_outside_its_locks_slot_is_refused() -> anyhow::Result<()> {
    let fx = cluster_or_skip!();
    let locks = fx.connect().await?;
    let name = "cluster/fenced";
    let guard = locks.mutex(name).acquire().await?;
    // `dlock:value:cluster/fenced/state` hashes by its whole key, the lock by `=cluster/fenced`.
    let elsewhere = locks.value("cluster/fenced/state");
    match elsewhere.set_fenced(&guard, b"x").await {
        Err(Error::Unsupported { backend, .. }) => ensure!(backend == "redis"),
        other => anyhow::bail!("expected Unsupported, got {other:?}"),
    }
    ensure!(
        elsewhere.get().await?.is_none(),
        "a refused write left a value"
    );
    let beside = locks.value(format!("{{={name}}}/state"));
    let version = beside.set_fenced(&guard, b"x").await?;
    ensure!(beside.get().await?.map(|v| v.version) == Some(version));
    ensure!(guard.is_owned().await?, "the refused write cost the hold");
    guard.release().await?;
    Ok(())
}
