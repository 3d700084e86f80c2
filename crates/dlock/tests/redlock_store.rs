#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

//! What is specific to Redlock, on five real `redis-server` processes: nodes killed, paused
//! and restarted empty. Everything every backend must do is in the conformance suite.

use std::time::Duration;

use anyhow::{Context, ensure};
use dlock::Error;
use dlock_testkit::fixture::redlock_url;
use dlock_testkit::server::{RedisNodes, required};
use tokio::time::{Instant, timeout};

/// Five fresh nodes; never `None`: a redis-server missing now is an error, not a skip.
fn nodes() -> anyhow::Result<Option<RedisNodes>> {
    match RedisNodes::start(5) {
        Ok(nodes) => Ok(Some(nodes)),
        // The build found redis-server (or these tests are ignored): missing now is an error,
        // not a skip (`dlock_testkit::require`).
        Err(e) if e.is_not_found() && !required("redis") => {
            Err(dlock_testkit::require::missing_now("redis"))
        }
        Err(e) => Err(e.into()),
    }
}

macro_rules! nodes_or_skip {
    () => {
        match nodes()? {
            Some(nodes) => nodes,
            None => return Ok(()),
        }
    };
}

fn url(nodes: &RedisNodes, options: &str) -> String {
    format!("{}{options}", redlock_url(&nodes.addrs()))
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_five_nodes_down_still_lock_extend_and_release() -> anyhow::Result<()> {
    let mut nodes = nodes_or_skip!();
    let url = url(
        &nodes,
        "?node_timeout=50ms&connect_timeout=200ms&timeout=200ms",
    );
    let a = dlock::connect(&url).await?;
    let before = a.mutex("job").acquire().await?;
    let first_fence = before.fence();
    before.release().await?;
    nodes.nodes[1].kill()?;
    nodes.nodes[3].kill()?;
    // A client that starts now connects too: a majority answers.
    let b = dlock::connect(&url).await?;
    let guard = b.mutex("job").ttl(Duration::from_secs(2)).acquire().await?;
    ensure!(
        guard.fence() > first_fence,
        "{} after {first_fence}",
        guard.fence()
    );
    guard.extend(Duration::from_secs(5)).await?;
    ensure!(guard.is_owned().await?);
    ensure!(a.mutex("job").try_acquire().await?.is_none(), "two holders");
    guard.release().await?;
    let again = a.mutex("job").no_wait().acquire().await?;
    ensure!(again.fence() > first_fence);
    again.release().await?;
    Ok(())
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_of_five_nodes_down_fail_acquires_and_lose_holds() -> anyhow::Result<()> {
    let mut nodes = nodes_or_skip!();
    let url = url(
        &nodes,
        "?node_timeout=50ms&connect_timeout=200ms&timeout=200ms",
    );
    let locks = dlock::connect(&url)
        .await?
        .with_watchdog_lease(Duration::from_millis(900))?;
    let renewed = locks.mutex("held").acquire().await?;
    let fixed = locks
        .mutex("fixed")
        .ttl(Duration::from_millis(900))
        .acquire()
        .await?;
    for index in [0, 2, 4] {
        nodes.nodes[index].kill()?;
    }
    let started = Instant::now();
    let wait = Duration::from_secs(1);
    let result = locks.mutex("other").wait(wait).acquire().await;
    ensure!(
        matches!(result, Err(Error::Unavailable { .. })),
        "{result:?}"
    );
    // It gave up at its deadline, not later.
    ensure!(
        started.elapsed() < wait + Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    for guard in [&renewed, &fixed] {
        timeout(Duration::from_millis(900 + 500), guard.lost())
            .await
            .with_context(|| format!("{} not reported lost within its lease", guard.name()))?;
    }
    Ok(())
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_costs_no_more_than_the_node_timeout() -> anyhow::Result<()> {
    let mut nodes = nodes_or_skip!();
    // Commands may wait 5 s for a reply; only the per-node timeout keeps a lock call short.
    let url = url(&nodes, "?node_timeout=50ms&timeout=5s");
    let locks = dlock::connect(&url).await?;
    locks.mutex("warm").acquire().await?.release().await?;
    nodes.nodes[2].pause()?;
    let started = Instant::now();
    let guard = locks.mutex("paused").acquire().await?;
    let took = started.elapsed();
    guard.release().await?;
    nodes.nodes[2].resume()?;
    ensure!(
        took < Duration::from_secs(1),
        "acquire took {took:?} with a paused node"
    );
    Ok(())
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_empty_does_not_let_a_second_client_in() -> anyhow::Result<()> {
    let mut nodes = nodes_or_skip!();
    // Timeouts a loaded machine's nodes meet (CI: 50 ms per node was missed by three of
    // five live nodes, and the extend below failed): nothing here waits on a timeout.
    let url = url(&nodes, "?node_timeout=1s&connect_timeout=1s&timeout=2s");
    let a = dlock::connect(&url).await?;
    let b = dlock::connect(&url).await?;
    let guard = a
        .mutex("kept")
        .ttl(Duration::from_secs(10))
        .acquire()
        .await?;
    nodes.nodes[0].restart()?;
    // Four of five nodes still hold it: the restarted one alone cannot make a quorum.
    ensure!(
        b.mutex("kept").try_acquire().await?.is_none(),
        "a second client got the lock"
    );
    // Extending brings the lock back on the restarted node, once the client has reconnected
    // to it (the first command after the restart finds the old connection dead).
    let addr = nodes.nodes[0].addr();
    let mut admin = redis::Client::open(format!("redis://{addr}"))?.get_connection()?;
    let mut healed = false;
    for _ in 0..20 {
        guard.extend(Duration::from_secs(10)).await?;
        let value: Option<Vec<u8>> = redis::cmd("GET")
            .arg("dlock:rlock:kept")
            .query(&mut admin)?;
        if value.is_some() {
            healed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ensure!(healed, "the restarted node was not healed");
    // Even with two nodes restarted, the three that hold it keep b out.
    nodes.nodes[1].restart()?;
    ensure!(
        b.mutex("kept").try_acquire().await?.is_none(),
        "a second client got the lock"
    );
    let fence = guard.fence();
    guard.release().await?;
    let next = b.mutex("kept").no_wait().acquire().await?;
    ensure!(next.fence() > fence, "{} after {fence}", next.fence());
    Ok(())
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_keep_growing_across_different_majorities() -> anyhow::Result<()> {
    let mut nodes = nodes_or_skip!();
    let url = url(
        &nodes,
        "?node_timeout=50ms&connect_timeout=200ms&timeout=200ms",
    );
    // One node is far ahead, as after it served acquisitions the others missed.
    let addr = nodes.nodes[4].addr();
    let mut admin = redis::Client::open(format!("redis://{addr}"))?.get_connection()?;
    redis::cmd("SET")
        .arg("dlock:rfence:counted")
        .arg(1000)
        .query::<()>(&mut admin)?;
    let locks = dlock::connect(&url).await?;
    let mut fences = Vec::new();
    let take = async |locks: &dlock::Locks| -> anyhow::Result<u64> {
        let guard = locks.mutex("counted").acquire().await?;
        let fence = guard.fence().get();
        guard.release().await?;
        Ok(fence)
    };
    fences.push(take(&locks).await?);
    // With nodes 0 and 1 down, every majority includes node 4: the fence passes 1000, and
    // nodes 2 and 3 are brought up to it.
    nodes.nodes[0].kill()?;
    nodes.nodes[1].kill()?;
    fences.push(take(&locks).await?);
    ensure!(fences[1] > 1000, "{fences:?}");
    // Now a majority without node 4 (0 and 1 restarted empty): node 2 remembers, so the
    // fences still grow.
    nodes.nodes[0].restart()?;
    nodes.nodes[1].restart()?;
    nodes.nodes[3].kill()?;
    nodes.nodes[4].kill()?;
    for _ in 0..20 {
        match take(&locks).await {
            Ok(fence) => {
                fences.push(fence);
                break;
            }
            // The client reconnects to the restarted nodes on the first failed command.
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    ensure!(
        fences.len() == 3,
        "no lock from nodes 0, 1 and 2: {fences:?}"
    );
    ensure!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    Ok(())
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_are_rejected() -> anyhow::Result<()> {
    for url in [
        "redlock://",
        "redlock://a:1,a:1",
        "redlock://a:1?node_timeout=0s",
        "redlock://a:1,b:2?nope=1",
    ] {
        let result = dlock::connect(url).await;
        ensure!(
            matches!(result, Err(Error::InvalidUrl { .. })),
            "{url}: {result:?}"
        );
    }
    Ok(())
}

/// Every node restarts from a snapshot taken three holds ago (a correlated restore): the
/// next holder still gets a fence above the last one given out.
#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_rise_after_every_node_restarts_from_an_older_snapshot() -> anyhow::Result<()> {
    let mut nodes = nodes_or_skip!();
    let url = url(&nodes, "?connect_timeout=200ms&timeout=200ms");
    let locks = dlock::connect(&url).await?;
    let take = async |locks: &dlock::Locks| -> anyhow::Result<u64> {
        let guard = locks.mutex("restored").acquire().await?;
        let fence = guard.fence().get();
        guard.release().await?;
        Ok(fence)
    };
    take(&locks).await?;
    for addr in nodes.addrs() {
        let mut admin = redis::Client::open(format!("redis://{addr}"))?.get_connection()?;
        redis::cmd("SAVE").query::<()>(&mut admin)?;
    }
    for _ in 0..3 {
        take(&locks).await?;
    }
    let held = locks.mutex("restored").acquire().await?;
    for node in &mut nodes.nodes {
        node.restart()?;
    }
    let other = dlock::connect(&url).await?;
    let mut next = None;
    for _ in 0..40 {
        match other
            .mutex("restored")
            .wait(Duration::from_secs(2))
            .acquire()
            .await
        {
            Ok(guard) => {
                next = Some(guard);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let next = next.context("no lock after the restore")?;
    ensure!(
        next.fence() > held.fence(),
        "fence {} after the restore, {} before it",
        next.fence(),
        held.fence()
    );
    Ok(())
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspection_reads_what_a_majority_keeps() -> anyhow::Result<()> {
    let mut nodes = nodes_or_skip!();
    let url = url(
        &nodes,
        "?node_timeout=50ms&connect_timeout=200ms&timeout=200ms",
    );
    let (a, b) = (
        dlock::connect(&url).await?.with_label("majority")?,
        dlock::connect(&url).await?,
    );
    let guard = a
        .mutex("watched")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?;
    // A value on a minority of nodes is no lock: write a foreign holder's copy on one node.
    let mut admin = redis::Client::open(format!("redis://{}", nodes.addrs()[0]))?
        .get_multiplexed_async_connection()
        .await?;
    let _: () = redis::cmd("SET")
        .arg("dlock:rlock:minority")
        .arg(["dlockr1", "someone", "7", "1", "host", "1", ""].join("\0"))
        .arg("PX")
        .arg(30_000)
        .query_async(&mut admin)
        .await?;
    ensure!(
        b.inspect("minority").await?.is_none(),
        "a minority copy inspected as held"
    );
    let listed: Vec<String> = futures::TryStreamExt::try_collect::<Vec<_>>(
        futures::TryStreamExt::map_ok(b.list(""), |info| info.name),
    )
    .await?;
    ensure!(listed == ["watched"], "listed {listed:?}");
    let info = b.inspect("watched").await?.context("not inspected")?;
    ensure!(
        info.fence == guard.fence(),
        "fence {} for {}",
        info.fence,
        guard.fence()
    );
    ensure!(
        info.waiters.is_none(),
        "Redlock counted waiters: {:?}",
        info.waiters
    );
    // Two of five nodes down: the other three still tell who holds it.
    nodes.nodes[1].kill()?;
    nodes.nodes[3].kill()?;
    let info = b.inspect("watched").await?.context("not inspected")?;
    ensure!(
        info.owner.label.as_deref() == Some("majority"),
        "{:?}",
        info.owner
    );
    // Three down: no majority answers, so no answer is given.
    nodes.nodes[4].kill()?;
    let refused = b.inspect("watched").await;
    ensure!(
        matches!(refused, Err(Error::Unavailable { .. })),
        "inspected without a majority: {refused:?}"
    );
    drop(guard);
    Ok(())
}

/// An ownership check (`is_owned`, a zero extension) gets the full node timeout: it fits in no
/// lease, so a third of a short one (10 ms here) must not bound it. Nodes 20 ms away (10 ms
/// each way through a fault proxy) answer within the 200 ms asked for.
#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ownership_check_has_the_full_node_timeout() -> anyhow::Result<()> {
    let nodes = nodes_or_skip!();
    let proxy = dlock_testkit::fault_proxy::FaultProxy::start(&nodes.addrs())?;
    let locks = dlock::connect(&format!(
        "{}?node_timeout=200ms",
        redlock_url(proxy.addrs())
    ))
    .await?;
    let guard = locks
        .mutex("checked")
        .ttl(Duration::from_millis(600))
        .acquire()
        .await?;
    proxy.set(dlock_testkit::fault_proxy::NetFault::Latency(
        Duration::from_millis(10),
    ));
    ensure!(guard.is_owned().await?, "the hold was not owned");
    proxy.set(dlock_testkit::fault_proxy::NetFault::None);
    guard.release().await?;
    Ok(())
}

/// Lua numbers are doubles, exact only up to 2^53: past it, each node's fence must still rise by
/// one per grant, and a node brought up to the quorum's fence must keep that fence exactly.
#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_keep_rising_past_two_to_the_53() -> anyhow::Result<()> {
    const NEAR: u64 = (1 << 53) - 2;
    let nodes = nodes_or_skip!();
    let locks = dlock::connect(&url(&nodes, "?connect_timeout=200ms&timeout=200ms")).await?;
    let admins = nodes
        .addrs()
        .iter()
        .map(|addr| Ok(redis::Client::open(format!("redis://{addr}"))?.get_connection()?))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut admins = admins;
    // Every node near 2^53; one of them 3 ahead, so a grant it is part of also brings the
    // others up (it may not be: a majority without it decides as well).
    for (i, admin) in admins.iter_mut().enumerate() {
        let last = if i == 4 { NEAR + 3 } else { NEAR };
        redis::cmd("SET")
            .arg("dlock:rfence:big")
            .arg(last.to_string())
            .query::<()>(admin)?;
    }
    let mut last = NEAR;
    for _ in 0..6 {
        let guard = locks.mutex("big").acquire().await?;
        let fence = guard.fence().get();
        ensure!(fence > last, "fence {fence} after {last}");
        guard.release().await?;
        last = fence;
    }
    // A majority granted the last hold (a node that answered after the quorum was decided may
    // not have): those keep its fence exactly, as text, and no node keeps a higher one.
    let kept = admins
        .iter_mut()
        .map(|admin| {
            redis::cmd("GET")
                .arg("dlock:rfence:big")
                .query::<u64>(admin)
        })
        .collect::<Result<Vec<_>, _>>()?;
    ensure!(
        kept.iter().filter(|&&k| k == last).count() >= 3 && kept.iter().all(|&k| k <= last),
        "last fence {last}; the nodes keep {kept:?}"
    );
    Ok(())
}
