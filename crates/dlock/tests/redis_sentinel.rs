#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

//! What is specific to Redis behind Sentinel, on a real primary, replica and three sentinels
//! started by the test kit: failovers during holds and waits, a failover that loses a hold,
//! and bad sentinel URLs. Everything every backend must do is in the conformance suite, which
//! runs on this set as `redis-sentinel`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, ensure};
use dlock::Error;
use dlock_testkit::fixture::{Fixture, RedisSentinelFixture};
use tokio::time::{Instant, sleep, timeout};

macro_rules! sentinels_or_skip {
    () => {
        match RedisSentinelFixture::start()? {
            Some(fixture) => fixture,
            // The build found redis-server (or these tests are ignored): missing now is an
            // error, not a skip (`dlock_testkit::require`).
            None => return Err(dlock_testkit::require::missing_now("redis")),
        }
    };
}

fn query<T: redis::FromRedisValue>(addr: SocketAddr, args: &[&str]) -> anyhow::Result<T> {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    let mut conn = redis::Client::open(format!("redis://{addr}"))?.get_connection()?;
    Ok(cmd.query(&mut conn)?)
}

/// Runs a fault of the sentinel set (blocking) from an async test.
fn fault(
    fx: &Arc<RedisSentinelFixture>,
    what: impl FnOnce(
        &mut dlock_testkit::server::RedisSentinelSet,
    ) -> Result<(), dlock_testkit::server::ServerError>,
) -> anyhow::Result<()> {
    tokio::task::block_in_place(|| what(&mut fx.server()))?;
    Ok(())
}

/// A forced failover while one client holds a lock and another waits for it: the hold lives
/// on (it was replicated), the holder keeps renewing it on the new primary, the release there
/// reaches the waiter, and every later fence is greater.
#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_keeps_replicated_holds_and_hands_over_on_the_new_primary() -> anyhow::Result<()>
{
    let fx = sentinels_or_skip!();
    // Long enough for a failover on a loaded machine: until the sentinels name the promoted
    // server, the holder's renewals go to the demoted one and are refused.
    let lease = Duration::from_secs(10);
    let holder = fx.connect().await?.with_watchdog_lease(lease)?;
    let waiter = fx.connect().await?.with_watchdog_lease(lease)?;
    let guard = holder.mutex("sentinel/held").acquire().await?;
    let held_fence = guard.fence();
    let waiting = tokio::spawn(async move {
        let guard = waiter
            .mutex("sentinel/held")
            .wait(Duration::from_secs(60))
            .acquire()
            .await?;
        Ok::<_, Error>((guard.fence(), guard))
    });
    sleep(Duration::from_millis(200)).await;
    let old_primary = fx.server().primary().addr();
    fault(&fx, |set| set.fail_over())?;
    ensure!(
        fx.server().primary().addr() != old_primary,
        "no failover happened"
    );
    // A lease on (the last renewal before the failover is older): the holder must have
    // renewed on the new primary meanwhile, or its hold would have run out there.
    sleep(lease + Duration::from_secs(1)).await;
    ensure!(
        !guard.is_lost(),
        "a replicated hold was reported lost after the failover ({:?})",
        guard.lost_reason()
    );
    ensure!(
        !waiting.is_finished(),
        "the waiter got the lock while it was held"
    );
    guard.release().await?;
    let (waiter_fence, waiter_guard) = timeout(Duration::from_secs(10), waiting).await???;
    ensure!(
        waiter_fence > held_fence,
        "fence {waiter_fence} after the failover, {held_fence} before it"
    );
    waiter_guard.release().await?;
    // The lock's state is on the new primary, not left behind on the old one.
    let on_new: Option<Vec<u8>> = query(
        fx.server().primary().addr(),
        &["GET", "dlock:lock:sentinel/held"],
    )?;
    ensure!(on_new.is_some(), "the new primary has no state of the lock");
    Ok(())
}

/// The primary dies with a hold the replica never had (removed from the replica only, as a
/// replica that missed the grant): after the sentinels promote the replica, that holder is
/// told its lock is lost within a third of its lease, a hold the replica had lives on, and the
/// next holder of the lost lock gets a greater fence.
#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_is_replaced_and_a_hold_it_alone_had_is_signalled_lost()
-> anyhow::Result<()> {
    let fx = sentinels_or_skip!();
    let lease = Duration::from_secs(6);
    let holder = fx.connect().await?.with_watchdog_lease(lease)?;
    // The replica's copy of the kept hold expires one lease after it was written (renewals
    // after the kill never reach it), and a failover under load can take longer than the
    // 6 s lease: a long lease of its own keeps this hold's survival about what the replica had.
    let kept = fx
        .connect()
        .await?
        .with_watchdog_lease(Duration::from_secs(60))?
        .mutex("sentinel/kept")
        .acquire()
        .await?;
    let lost = holder.mutex("sentinel/lost").acquire().await?;
    let lost_fence = lost.fence();
    let replica = fx.server().replica().addr();
    let primary = fx.server().primary().addr();
    // Wait until the replica has both, then take one away from it alone.
    let deadline = Instant::now() + Duration::from_secs(10);
    while query::<i64>(primary, &["WAIT", "1", "100"])? < 1 {
        ensure!(Instant::now() < deadline, "the replica never caught up");
    }
    let _: String = query(replica, &["CONFIG", "SET", "replica-read-only", "no"])?;
    let removed: i64 = query(replica, &["DEL", "dlock:lock:sentinel/lost"])?;
    ensure!(removed == 1, "the replica did not have the hold");
    let killed_at = Instant::now();
    // When the replica first answers as a primary: from then on the lost hold's renewal is
    // refused, and the promise is a lost signal within a third of the lease.
    let promoted = tokio::task::spawn_blocking(move || {
        dlock_testkit::server::became_primary(replica, lease * 4)
    });
    let told = tokio::spawn(async move {
        let told = timeout(lease * 2, lost.lost())
            .await
            .map(|()| Instant::now());
        (told, lost)
    });
    fault(&fx, |set| set.kill_primary())?;
    let promoted_at = promoted.await??;
    let (told_at, lost) = told.await?;
    let told_at = told_at.map_err(|_| {
        anyhow::anyhow!(
            "the holder of a lock the new primary does not have was not told within two \
             leases ({:?} after the kill)",
            killed_at.elapsed()
        )
    })?;
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
    let other = fx.connect().await?;
    let next = other
        .mutex("sentinel/lost")
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

/// What a lost signal may take beyond its promised bound here: the client's sentinel query
/// and reconnection to the new primary, and scheduling on a loaded 2-core test machine.
const SIGNAL_TOLERANCE: Duration = Duration::from_millis(500);

/// Bad sentinel URLs fail with a typed error that names the problem, and print no secret.
#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_sentinel_urls_are_typed_errors_without_secrets() -> anyhow::Result<()> {
    let fx = sentinels_or_skip!();
    let sentinels: Vec<String> = fx
        .server()
        .sentinel_addrs()
        .iter()
        .map(ToString::to_string)
        .collect();
    let sentinels = sentinels.join(",");

    let no_master = format!("redis+sentinel://{sentinels}");
    match dlock::connect(&no_master).await {
        Err(Error::InvalidUrl { reason, .. }) if reason.contains("master name") => {}
        other => anyhow::bail!("{no_master}: {other:?}"),
    }

    let unknown = format!("redis+sentinel://app:hunter2@{sentinels}/nosuch");
    match dlock::connect(&unknown).await {
        Err(error @ Error::InvalidArgument { .. }) => {
            let message = error.to_string();
            ensure!(message.contains("\"nosuch\""), "{message}");
            ensure!(!message.contains("hunter2"), "{message}");
        }
        other => anyhow::bail!("{unknown}: {other:?}"),
    }

    let free: Vec<String> = (0..2)
        .map(|_| Ok(format!("127.0.0.1:{}", dlock_testkit::server::free_port()?)))
        .collect::<anyhow::Result<_>>()?;
    let unreachable = format!(
        "redis+sentinel://app:hunter2@{}/dlock?sentinel_password=sesame&connect_timeout=200ms",
        free.join(",")
    );
    match dlock::connect(&unreachable).await {
        Err(error @ Error::Unavailable { .. }) => {
            let message = format!("{error} {error:?}");
            ensure!(message.contains("no sentinel answered"), "{message}");
            ensure!(
                !message.contains("hunter2") && !message.contains("sesame"),
                "{message}"
            );
        }
        other => anyhow::bail!("{unreachable}: {other:?}"),
    }

    // Wrong sentinel credentials: the sentinels here have no password, so a password for them
    // is refused by the server, and that is what the error says.
    let refused = format!("redis+sentinel://{sentinels}/dlock?sentinel_password=sesame");
    match dlock::connect(&refused).await {
        Err(error @ Error::Unauthenticated { .. }) => {
            let message = format!("{error} {error:?}");
            ensure!(!message.contains("sesame"), "{message}");
        }
        Err(other) => anyhow::bail!("{refused}: not an authentication error: {other:?}"),
        Ok(_) => anyhow::bail!("{refused}: a password the sentinels do not have was accepted"),
    }
    Ok(())
}

/// `min_replicas`: a grant or an extension returns only once a replica has it. With the
/// replica frozen, a grant fails as unavailable and leaves the lock free, and an extension
/// fails as unavailable (not as lost); with the replica back, both succeed again.
#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_holds_grants_and_extensions_until_a_replica_has_them() -> anyhow::Result<()> {
    let fx = sentinels_or_skip!();
    // Long enough for a replica's acknowledgement on a loaded CI machine (and for the resumed
    // replica to catch up): each refusal below waits this long.
    let url = format!(
        "{}?min_replicas=1&timeout=5s&replica_timeout=2s",
        fx.url().unwrap()
    );
    let acked = dlock::connect(&url).await?;
    let plain = fx.connect().await?;
    let held = acked.mutex("acked/held").acquire().await?;
    held.extend(Duration::from_secs(30)).await?;
    fault(&fx, |set| set.replica().pause())?;
    let refused = acked.mutex("acked/refused").acquire().await;
    let extended = held.extend(Duration::from_secs(30)).await;
    let permit = acked.semaphore("acked/permits", 2).acquire().await;
    fault(&fx, |set| set.replica().resume())?;
    match refused {
        Err(Error::Unavailable { source, .. }) if source.to_string().contains("min_replicas") => {}
        other => anyhow::bail!("a grant no replica had: {other:?}"),
    }
    ensure!(
        matches!(permit, Err(Error::Unavailable { .. })),
        "a permit no replica had: {permit:?}"
    );
    ensure!(
        matches!(extended, Err(Error::Unavailable { .. })),
        "an extension no replica had: {extended:?}"
    );
    // Nothing of the refused grants is left held.
    let free = plain.mutex("acked/refused").try_acquire().await?;
    ensure!(
        free.is_some(),
        "a grant the replicas never confirmed is still held"
    );
    let a = plain.semaphore("acked/permits", 2).try_acquire().await?;
    let b = plain.semaphore("acked/permits", 2).try_acquire().await?;
    ensure!(a.is_some() && b.is_some(), "a refused permit is still held");
    ensure!(
        !held.is_lost(),
        "an unconfirmed extension counted as a loss"
    );
    held.extend(Duration::from_secs(30)).await?;
    acked
        .mutex("acked/again")
        .acquire()
        .await?
        .release()
        .await?;
    held.release().await?;
    Ok(())
}

/// The blocking facade sends its commands over blocking connections of the caller's thread
/// (named `dlock-blocking`), but not with `min_replicas`: `WAIT` counts the writes of the
/// connection it is sent on, so a grant and its `WAIT` must both go over the one multiplexed
/// connection.
#[cfg(feature = "blocking")]
#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[test]
fn with_min_replicas_blocking_calls_keep_to_the_connection_their_wait_is_sent_on()
-> anyhow::Result<()> {
    let fx = dlock_testkit::require::present("redis", RedisSentinelFixture::start())?;
    let url = fx.url().context("a sentinel URL")?;
    let primary = fx.server().primary().addr();
    let blocking_connections = || -> anyhow::Result<usize> {
        let list: String = query(primary, &["CLIENT", "LIST"])?;
        Ok(list
            .lines()
            .filter(|line| line.contains(" name=dlock-blocking "))
            .count())
    };
    // A pair of calls; the client is kept, and its connections with it.
    let pair = |url: &str| -> anyhow::Result<dlock::blocking::Locks> {
        let locks = dlock::blocking::Locks::connect(url)?;
        locks
            .mutex("blocking/acked")
            .ttl(Duration::from_secs(30))
            .acquire()?
            .release()?;
        Ok(locks)
    };
    let acked = pair(&format!("{url}?min_replicas=1&replica_timeout=900ms"))?;
    ensure!(
        blocking_connections()? == 0,
        "a blocking connection was used with min_replicas"
    );
    let plain = pair(&url)?;
    ensure!(
        blocking_connections()? == 1,
        "no blocking connection without min_replicas"
    );
    drop((acked, plain));
    Ok(())
}
