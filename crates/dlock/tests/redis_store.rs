#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

//! What is specific to the Redis backend, on real `redis-server` processes started by the test
//! kit: server restarts and killed connections, foreign keys, credentials, TLS, the pub/sub
//! hand-off and the fair queue's handling of dead waiters. Everything every backend must do
//! is in the conformance suite.

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, ensure};
use dlock::{Error, Locks};
use dlock_testkit::cli::dlock_command;
use dlock_testkit::fault_proxy::{FaultProxy, NetFault};
use dlock_testkit::fixture::{Fixture, RedisFixture};
use dlock_testkit::server::{Redis, RedisTls, ServerProcess};
use dlock_testkit::tls::TestCertificates;
use tokio::time::{Instant, sleep, timeout};

/// A fresh server for one test. Never `None`: the build found redis-server (or these tests
/// are ignored), so a missing one is an error, not a skip (`dlock_testkit::require`).
fn start() -> anyhow::Result<Option<Arc<RedisFixture>>> {
    dlock_testkit::require::present("redis", RedisFixture::start()).map(Some)
}

macro_rules! redis_or_skip {
    () => {
        match start()? {
            Some(fixture) => fixture,
            None => return Ok(()),
        }
    };
}

/// A plain redis-rs connection for checking and disturbing the server from the outside.
fn admin(addr: SocketAddr) -> anyhow::Result<redis::Connection> {
    Ok(redis::Client::open(format!("redis://{addr}"))?.get_connection()?)
}

fn query<T: redis::FromRedisValue>(addr: SocketAddr, args: &[&str]) -> anyhow::Result<T> {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    Ok(cmd.query(&mut admin(addr)?)?)
}

/// Whether the lock's value says free, with no waiter flagged (`token` and `queued` fields).
fn locks_free(addr: SocketAddr, name: &str) -> anyhow::Result<bool> {
    let value: Vec<u8> = query(addr, &["GET", &format!("dlock:lock:{name}")])?;
    let fields: Vec<&[u8]> = value.split(|b| *b == 0).collect();
    Ok(fields.len() >= 6 && fields[1].is_empty() && fields[4] == b"0")
}

/// Polls `check` until it holds, for up to 5 s (background clean-ups are asynchronous).
async fn eventually(mut check: impl FnMut() -> anyhow::Result<bool>) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !check()? {
        ensure!(Instant::now() < deadline, "condition not met within 5 s");
        sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_key_at_a_lock_name_is_a_type_error_at_once() -> anyhow::Result<()> {
    let fx = redis_or_skip!();
    let addr = fx.addr();
    let locks = fx.connect().await?;
    query::<()>(addr, &["HSET", "dlock:lock:app-hash", "field", "1"])?;
    // Even a string with NULs in it, as long as it is not a lock of this layout.
    query::<()>(
        addr,
        &["SET", "dlock:lock:app-string", "v\0a\0b\0c\0d\0e\0f\0g\0h"],
    )?;
    for name in ["app-string", "app-hash"] {
        // An hour's wait: only an immediate error lets this test finish.
        let result = locks
            .mutex(name)
            .wait(Duration::from_secs(3600))
            .acquire()
            .await;
        match result {
            Err(Error::WrongType { backend, key, .. }) => {
                ensure!(backend == "redis");
                ensure!(key.contains(name), "{key}");
            }
            other => anyhow::bail!("{name}: expected WrongType, got {other:?}"),
        }
    }
    // A foreign key where a waiter would queue: found when it first waits.
    let holder = fx.connect().await?;
    let guard = holder.mutex("app-list").acquire().await?;
    query::<()>(addr, &["LPUSH", "dlock:queue:app-list", "x"])?;
    let result = locks
        .mutex("app-list")
        .wait(Duration::from_secs(3600))
        .acquire()
        .await;
    ensure!(matches!(result, Err(Error::WrongType { .. })), "{result:?}");
    guard.release().await?;
    // The foreign values are untouched and no lock state was left behind.
    ensure!(
        query::<String>(addr, &["GET", "dlock:lock:app-string"])? == "v\0a\0b\0c\0d\0e\0f\0g\0h"
    );
    ensure!(query::<Vec<String>>(addr, &["HKEYS", "dlock:lock:app-hash"])? == ["field"]);
    ensure!(query::<Vec<String>>(addr, &["LRANGE", "dlock:queue:app-list", "0", "-1"])? == ["x"]);
    ensure!(
        query::<i64>(
            addr,
            &[
                "EXISTS",
                "dlock:qexp:app-list",
                "dlock:qexp:app-string",
                "dlock:qexp:app-hash"
            ]
        )? == 0
    );
    Ok(())
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restarted_empty_fires_lost_on_every_guard_and_fences_keep_growing()
-> anyhow::Result<()> {
    let fx = redis_or_skip!();
    let lease = Duration::from_millis(900);
    let locks = fx.connect().await?.with_watchdog_lease(lease)?;
    let renewed = locks.mutex("renewed").acquire().await?;
    let fixed = locks.mutex("fixed").ttl(lease).acquire().await?;
    let reentrant = locks.mutex("reentrant").reentrant().acquire().await?;
    let before = [renewed.fence(), fixed.fence(), reentrant.fence()];
    fx.server().restart()?;
    let restarted = Instant::now();
    for guard in [&renewed, &fixed, &reentrant] {
        timeout(lease + Duration::from_millis(500), guard.lost())
            .await
            .with_context(|| format!("{} not reported lost within its lease", guard.name()))?;
    }
    let took = restarted.elapsed();
    // The data is gone, so another client gets the locks, with greater fences than before.
    let other = fx.connect().await?;
    for (name, old) in ["renewed", "fixed", "reentrant"].into_iter().zip(before) {
        let guard = other.mutex(name).no_wait().acquire().await?;
        ensure!(guard.fence() > old, "{name}: {} after {old}", guard.fence());
    }
    ensure!(
        renewed
            .release()
            .await
            .is_err_and(|e| matches!(e, Error::NotOwned { .. }))
    );
    eprintln!("lost signals {took:?} after the restart");
    Ok(())
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_ttl_lock_is_told_of_a_restart_within_a_third_of_its_ttl() -> anyhow::Result<()> {
    const TTL: Duration = Duration::from_secs(6);
    let fx = redis_or_skip!();
    let locks = fx.connect().await?;
    let asked = Instant::now();
    let fixed = locks.mutex("fixed-restart").ttl(TTL).acquire().await?;
    fx.server().restart()?;
    // The keeper's first ownership check is a third of the TTL after the request; a sixth
    // more covers its round trip (and the reconnect) on a loaded machine.
    tokio::time::timeout_at(asked + TTL / 3 + TTL / 6, fixed.lost())
        .await
        .context("a fixed-TTL lock was not told of the restart within a third of its TTL")?;
    ensure!(
        fixed
            .release()
            .await
            .is_err_and(|e| matches!(e, Error::NotOwned { .. }))
    );
    Ok(())
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connections_are_reestablished_during_holds_and_waits() -> anyhow::Result<()> {
    let fx = redis_or_skip!();
    let addr = fx.addr();
    let holder = fx
        .connect()
        .await?
        .with_watchdog_lease(Duration::from_millis(900))?;
    let waiter = fx.connect().await?;
    let guard = holder.mutex("survivor").acquire().await?;
    let waiting = tokio::spawn(async move {
        let got = waiter
            .mutex("survivor")
            .wait(Duration::from_secs(20))
            .acquire()
            .await;
        (got, Instant::now())
    });
    // The waiter has subscribed to the lock's channel.
    eventually(|| {
        let (_, subscribers): (String, i64) =
            query(addr, &["PUBSUB", "NUMSUB", "dlock:wake:survivor"])
                .map(|r: Vec<(String, i64)>| r[0].clone())?;
        Ok(subscribers == 1)
    })
    .await?;
    let killed: i64 = query(addr, &["CLIENT", "KILL", "TYPE", "normal"])?;
    let killed_pubsub: i64 = query(addr, &["CLIENT", "KILL", "TYPE", "pubsub"])?;
    ensure!(
        killed >= 2 && killed_pubsub == 1,
        "{killed} {killed_pubsub}"
    );
    // Longer than the lease: renewals must have gone through a new connection.
    sleep(Duration::from_millis(1500)).await;
    ensure!(
        !guard.is_lost(),
        "the hold was lost over a dropped connection"
    );
    ensure!(guard.is_owned().await?);
    // The waiter resubscribed, so the release reaches it.
    eventually(|| {
        let reply: Vec<(String, i64)> = query(addr, &["PUBSUB", "NUMSUB", "dlock:wake:survivor"])?;
        Ok(reply[0].1 == 1)
    })
    .await?;
    let fence = guard.fence();
    guard.release().await?;
    let (got, _) = waiting.await?;
    let next = got?;
    ensure!(next.fence() > fence);
    Ok(())
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_the_waiter_without_polling() -> anyhow::Result<()> {
    let fx = redis_or_skip!();
    let addr = fx.addr();
    let url = fx.url().context("url")?;
    let holder = fx.connect().await?;
    // Polling as slow as allowed: a waiter that relied on it would take 125-375 ms.
    let waiter = dlock::connect(&format!("{url}?poll_min=250ms&poll_max=250ms")).await?;
    let mut gaps = Vec::new();
    for _ in 0..9 {
        let guard = holder.mutex("handoff").acquire().await?;
        let waiting = {
            let waiter = waiter.clone();
            tokio::spawn(async move {
                let got = waiter
                    .mutex("handoff")
                    .wait(Duration::from_secs(10))
                    .acquire()
                    .await;
                (got, Instant::now())
            })
        };
        eventually(|| Ok(query::<i64>(addr, &["ZCARD", "dlock:queue:handoff"])? == 1)).await?;
        sleep(Duration::from_millis(20)).await;
        let released = Instant::now();
        guard.release().await?;
        let (got, acquired) = waiting.await?;
        got?.release().await?;
        gaps.push(acquired - released);
    }
    gaps.sort();
    let median = gaps[gaps.len() / 2];
    ensure!(
        median < Duration::from_millis(50),
        "hand-offs took {gaps:?}: waiters are polling, not notified"
    );
    Ok(())
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_fair_waiter_does_not_stall_the_queue() -> anyhow::Result<()> {
    let fx = redis_or_skip!();
    let addr = fx.addr();
    let url = fx.url().context("url")?;
    let holder = fx.connect().await?;
    let guard = holder.mutex("queue").fair().acquire().await?;
    // A waiter in another process takes the first place in the queue, then dies.
    let mut first = dlock_command(&url)?
        .args(["hold", "queue", "--fair", "--wait", "60s"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()?;
    eventually(|| Ok(query::<i64>(addr, &["ZCARD", "dlock:queue:queue"])? == 1)).await?;
    let second = fx.connect().await?;
    let waiting = tokio::spawn(async move {
        second
            .mutex("queue")
            .fair()
            .wait(Duration::from_secs(20))
            .acquire()
            .await
    });
    eventually(|| Ok(query::<i64>(addr, &["ZCARD", "dlock:queue:queue"])? == 2)).await?;
    first.kill()?;
    first.wait()?;
    let released = Instant::now();
    guard.release().await?;
    let next = waiting.await??;
    let stalled = released.elapsed();
    // The dead waiter's place expired, so the live one got the lock.
    ensure!(
        stalled < dlock::redis::WAITER_TTL * 3,
        "the queue stalled for {stalled:?}"
    );
    ensure!(query::<i64>(addr, &["ZCARD", "dlock:queue:queue"])? == 0);
    next.release().await?;
    Ok(())
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_waits_leave_no_queue_entry_behind() -> anyhow::Result<()> {
    let fx = redis_or_skip!();
    let addr = fx.addr();
    let holder = fx.connect().await?;
    let guard = holder.mutex("abandoned").acquire().await?;
    let waiter = fx.connect().await?;
    // Timed out.
    let timed_out = waiter
        .mutex("abandoned")
        .fair()
        .wait(Duration::from_millis(200))
        .acquire()
        .await;
    ensure!(
        matches!(timed_out, Err(Error::Timeout { .. })),
        "{timed_out:?}"
    );
    eventually(|| Ok(query::<i64>(addr, &["EXISTS", "dlock:queue:abandoned"])? == 0)).await?;
    // Cancelled (the future dropped mid-wait).
    let cancelled = timeout(
        Duration::from_millis(200),
        waiter
            .mutex("abandoned")
            .wait(Duration::from_secs(60))
            .acquire(),
    )
    .await;
    ensure!(cancelled.is_err());
    eventually(|| {
        Ok(query::<i64>(
            addr,
            &["EXISTS", "dlock:queue:abandoned", "dlock:qexp:abandoned"],
        )? == 0)
    })
    .await?;
    guard.release().await?;
    // Only the free lock's value remains: it keeps the last fence until the lease runs out.
    let keys: Vec<String> = query(addr, &["KEYS", "dlock:*"])?;
    ensure!(keys == ["dlock:lock:abandoned"], "{keys:?}");
    ensure!(locks_free(addr, "abandoned")?);
    Ok(())
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_checked_when_connecting() -> anyhow::Result<()> {
    let server = match ServerProcess::start(Redis {
        extra_args: [
            "--requirepass",
            "default-secret",
            "--user",
            "app",
            "on",
            ">app-secret",
            "~*",
            "&*",
            "+@all",
            "--user",
            "confined",
            "on",
            ">confined-secret",
            "~other:*",
            "&*",
            "+@all",
        ]
        .map(String::from)
        .to_vec(),
    }) {
        Ok(server) => server,
        Err(e) if e.is_not_found() && !dlock_testkit::server::required("redis") => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let addr = server.addr();
    for url in [
        format!("redis://{addr}"),
        format!("redis://:wrong@{addr}"),
        format!("redis://app:wrong@{addr}"),
        format!("redis://nobody:app-secret@{addr}"),
    ] {
        let result = dlock::connect(&url).await;
        ensure!(
            matches!(result, Err(Error::Unauthenticated { .. })),
            "{url}: {result:?}"
        );
        // The password never shows in the message.
        if let Err(error) = result {
            ensure!(!error.to_string().contains("wrong"), "{error}");
        }
    }
    let app = dlock::connect(&format!("redis://app:app-secret@{addr}")).await?;
    app.mutex("allowed").acquire().await?.release().await?;
    let default = dlock::connect(&format!("redis://:default-secret@{addr}/1")).await?;
    default.mutex("allowed").acquire().await?.release().await?;
    let confined = dlock::connect(&format!("redis://confined:confined-secret@{addr}")).await?;
    let denied = confined.mutex("forbidden").acquire().await;
    ensure!(
        matches!(denied, Err(Error::PermissionDenied { .. })),
        "{denied:?}"
    );
    // With a prefix inside its key space the same user can lock.
    let inside = dlock::connect(&format!(
        "redis://confined:confined-secret@{addr}?prefix=other:"
    ))
    .await?;
    inside.mutex("allowed").acquire().await?.release().await?;
    Ok(())
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_private_ca() -> anyhow::Result<()> {
    let certs = TestCertificates::generate()?;
    let server = match ServerProcess::start(RedisTls::new(&certs)) {
        Ok(server) => server,
        Err(e) if e.is_not_found() && !dlock_testkit::server::required("redis") => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let port = server.port();
    let ca = certs.ca();
    for url in [
        format!("rediss://127.0.0.1:{port}?ca={}", ca.display()),
        format!("rediss://localhost:{port}/2?ca={}", ca.display()),
        format!("rediss://127.0.0.1:{port}#insecure"),
    ] {
        let locks = dlock::connect(&url).await.with_context(|| url.clone())?;
        let guard = locks.mutex("secure").acquire().await?;
        ensure!(locks.inspect("secure").await?.is_some());
        guard.release().await?;
    }
    // The system roots do not know the test CA; plain text gets no answer.
    for url in [
        format!("rediss://127.0.0.1:{port}"),
        format!("redis://127.0.0.1:{port}?timeout=300ms&connect_timeout=300ms"),
    ] {
        let result = dlock::connect(&url).await;
        ensure!(
            matches!(result, Err(Error::Unavailable { .. })),
            "{url}: {result:?}"
        );
    }
    let missing =
        dlock::connect(&format!("rediss://127.0.0.1:{port}?ca=/nonexistent/ca.pem")).await;
    ensure!(
        matches!(missing, Err(Error::InvalidArgument { .. })),
        "{missing:?}"
    );
    Ok(())
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_unavailable() -> anyhow::Result<()> {
    let port = dlock_testkit::server::free_port()?;
    let result = dlock::connect(&format!("redis://127.0.0.1:{port}")).await;
    ensure!(
        matches!(&result, Err(e @ Error::Unavailable { .. }) if e.is_retryable()),
        "{result:?}"
    );
    Ok(())
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_lists_inspects_and_breaks_redis_locks() -> anyhow::Result<()> {
    let fx = redis_or_skip!();
    let url = fx.url().context("url")?;
    let locks: Locks = fx.connect().await?.with_label("cli-test")?;
    let guard = locks.mutex("jobs/nightly").acquire().await?;
    let _other = locks.mutex("other/x").acquire().await?;
    let ls = dlock_command(&url)?.args(["ls", "jobs/"]).output()?;
    let out = String::from_utf8_lossy(&ls.stdout);
    ensure!(ls.status.success(), "{ls:?}");
    ensure!(
        out.contains("jobs/nightly") && !out.contains("other/x"),
        "{out}"
    );
    ensure!(out.contains(&guard.fence().to_string()), "{out}");
    let inspect = dlock_command(&url)?
        .args(["inspect", "jobs/nightly"])
        .output()?;
    ensure!(
        String::from_utf8_lossy(&inspect.stdout).contains("cli-test"),
        "{inspect:?}"
    );
    let broken = dlock_command(&url)?
        .args(["break", "--yes", "jobs/nightly"])
        .output()?;
    ensure!(broken.status.success(), "{broken:?}");
    ensure!(!guard.is_owned().await?);
    Ok(())
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[test]
fn a_client_keeps_its_wake_ups_when_the_runtime_that_started_them_is_gone() -> anyhow::Result<()> {
    let Some(fx) = start()? else {
        return Ok(());
    };
    let addr = fx.addr();
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
    };
    let first = runtime()?;
    let (holder, waiter) =
        first.block_on(async { anyhow::Ok((fx.connect().await?, fx.connect().await?)) })?;
    // A wait in the first runtime starts the waiter client's pub/sub task there.
    first.block_on(async {
        let guard = holder.mutex("runtimes").acquire().await?;
        let waited = waiter
            .mutex("runtimes")
            .wait(Duration::from_millis(300))
            .acquire()
            .await;
        ensure!(matches!(waited, Err(Error::Timeout { .. })), "{waited:?}");
        guard.release().await?;
        anyhow::Ok(())
    })?;
    drop(first);
    let second = runtime()?;
    second.block_on(async {
        let holder = fx.connect().await?;
        let guard = holder.mutex("runtimes").acquire().await?;
        let waiting = tokio::spawn({
            let waiter = waiter.clone();
            async move {
                waiter
                    .mutex("runtimes")
                    .wait(Duration::from_secs(10))
                    .acquire()
                    .await
            }
        });
        // The subscription is back, on a task of this runtime.
        eventually(|| {
            let reply: Vec<(String, i64)> =
                query(addr, &["PUBSUB", "NUMSUB", "dlock:wake:runtimes"])?;
            Ok(reply[0].1 == 1)
        })
        .await?;
        guard.release().await?;
        waiting.await??.release().await?;
        anyhow::Ok(())
    })
}

/// Calls of `command` since the last `CONFIG RESETSTAT`, from `INFO commandstats`.
fn command_calls(addr: SocketAddr, command: &str) -> anyhow::Result<u64> {
    let info: String = query(addr, &["INFO", "commandstats"])?;
    let prefix = format!("cmdstat_{command}:calls=");
    Ok(info
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(Ok(0), str::parse)?)
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_lock_takes_every_name_in_one_script_or_none() -> anyhow::Result<()> {
    let fx = redis_or_skip!();
    let addr = fx.addr();
    let locks = fx.connect().await?;
    let names = ["m/a", "m/b", "m/c", "m/d", "m/e"];
    // Load the script first, so the count below is not disturbed by a NOSCRIPT retry.
    locks
        .multi_lock(["warm/a", "warm/b"])
        .acquire()
        .await?
        .release()
        .await?;

    let _: () = query(addr, &["CONFIG", "RESETSTAT"])?;
    let all = locks.multi_lock(names).no_wait().acquire().await?;
    ensure!(
        command_calls(addr, "evalsha")? == 1,
        "five locks took more than one script call"
    );
    for name in names {
        ensure!(
            locks.mutex(name).try_acquire().await?.is_none(),
            "{name} is free"
        );
    }
    all.release().await?;

    let blocker = locks.mutex("m/d").acquire().await?;
    let _: () = query(addr, &["CONFIG", "RESETSTAT"])?;
    ensure!(
        locks.multi_lock(names).try_acquire().await?.is_none(),
        "granted with m/d held"
    );
    ensure!(
        command_calls(addr, "evalsha")? == 1,
        "a busy attempt took more than one call"
    );
    for name in ["m/a", "m/b", "m/c", "m/e"] {
        ensure!(
            locks_free(addr, name)?,
            "{name} was taken by a failed attempt"
        );
    }
    blocker.release().await?;
    Ok(())
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_semaphore_wakes_waiters_and_leaves_no_keys() -> anyhow::Result<()> {
    let fx = redis_or_skip!();
    let addr = fx.addr();
    let url = fx.url().context("url")?;
    let holder = fx.connect().await?;
    // Polling as slow as allowed: a waiter that relied on it would take 125-375 ms.
    let waiter = dlock::connect(&format!("{url}?poll_min=250ms&poll_max=250ms")).await?;
    let mut gaps = Vec::new();
    for _ in 0..7 {
        let a = holder.semaphore("pool", 2).acquire().await?;
        let b = holder.semaphore("pool", 2).acquire().await?;
        ensure!(
            a.slot().as_str() == "pool",
            "not the native semaphore: {}",
            a.slot()
        );
        ensure!(b.fence() > a.fence(), "fences do not grow across permits");
        let waiting = {
            let waiter = waiter.clone();
            tokio::spawn(async move {
                let got = waiter
                    .semaphore("pool", 2)
                    .wait(Duration::from_secs(10))
                    .acquire()
                    .await;
                (got, Instant::now())
            })
        };
        sleep(Duration::from_millis(50)).await;
        ensure!(!waiting.is_finished(), "a third permit of two was granted");
        let released = Instant::now();
        a.release().await?;
        let (got, acquired) = waiting.await?;
        got?.release().await?;
        b.release().await?;
        gaps.push(acquired - released);
    }
    gaps.sort();
    ensure!(
        gaps[gaps.len() / 2] < Duration::from_millis(50),
        "hand-offs took {gaps:?}: waiters are polling, not notified"
    );
    let left: i64 = query(addr, &["EXISTS", "dlock:permits:pool"])?;
    ensure!(left == 0, "an idle semaphore left its holder set behind");
    let ttl: i64 = query(addr, &["PTTL", "dlock:pfence:pool"])?;
    ensure!(ttl != -1, "the fence counter of a semaphore never expires");
    Ok(())
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_rwlock_hands_over_by_notification_and_signals_loss() -> anyhow::Result<()> {
    let fx = redis_or_skip!();
    let addr = fx.addr();
    let url = fx.url().context("url")?;
    let locks = fx.connect().await?;
    let waiter = dlock::connect(&format!("{url}?poll_min=250ms&poll_max=250ms")).await?;
    // A writer waiting for two readers gets the lock as the last one leaves, without polling.
    let r1 = locks.rwlock("doc").read().await?;
    let r2 = locks.rwlock("doc").read().await?;
    let writing = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            let got = waiter
                .rwlock("doc")
                .wait(Duration::from_secs(10))
                .write()
                .await;
            (got, Instant::now())
        })
    };
    eventually(|| Ok(query::<Option<String>>(addr, &["HGET", "dlock:rw:doc", "ww"])?.is_some()))
        .await?;
    ensure!(
        locks.rwlock("doc").try_read().await?.is_none(),
        "a reader got in while a writer waited"
    );
    r1.release().await?;
    sleep(Duration::from_millis(20)).await;
    ensure!(!writing.is_finished(), "the writer got in beside a reader");
    let released = Instant::now();
    r2.release().await?;
    let (got, acquired) = writing.await?;
    let w = got?;
    ensure!(
        acquired - released < Duration::from_millis(100),
        "the writer took {:?}: polling, not notified",
        acquired - released
    );
    ensure!(w.fence() > dlock::FencingToken::new(0), "fence is zero");
    // Deleting the lock's state breaks the hold: the next check says so and fires the signal.
    let _: () = query(addr, &["DEL", "dlock:rw:doc"])?;
    expect_not_owned(w.extend(Duration::from_secs(5)).await)?;
    timeout(Duration::from_secs(5), w.lost())
        .await
        .context("lost signal")?;
    Ok(())
}

fn expect_not_owned(result: dlock::Result<()>) -> anyhow::Result<()> {
    match result {
        Err(dlock::Error::NotOwned { .. }) => Ok(()),
        other => anyhow::bail!("expected NotOwned, got {other:?}"),
    }
}

/// The kinds of hold whose fences must keep rising across a partial data loss.
#[derive(Clone, Copy, Debug)]
enum HoldKind {
    Mutex,
    Permit,
    Writer,
    Reader,
}

const HOLD_KINDS: [HoldKind; 4] = [
    HoldKind::Mutex,
    HoldKind::Permit,
    HoldKind::Writer,
    HoldKind::Reader,
];

/// One hold of `kind` on `name`: its fence and the guard (boxed, dropped to let go).
async fn take(
    locks: &Locks,
    kind: HoldKind,
    name: &str,
) -> anyhow::Result<(dlock::FencingToken, Box<dyn std::any::Any + Send>)> {
    let wait = Duration::from_secs(5);
    Ok(match kind {
        HoldKind::Mutex => {
            let g = locks.mutex(name).wait(wait).acquire().await?;
            (g.fence(), Box::new(g))
        }
        HoldKind::Permit => {
            let g = locks.semaphore(name, 1).wait(wait).acquire().await?;
            (g.fence(), Box::new(g))
        }
        HoldKind::Writer => {
            let g = locks.rwlock(name).wait(wait).write().await?;
            (g.fence(), Box::new(g))
        }
        HoldKind::Reader => {
            let g = locks.rwlock(name).wait(wait).read().await?;
            (g.fence(), Box::new(g))
        }
    })
}

/// Takes `name` once, lets `checkpoint` save the store's state, takes it three more times,
/// then holds it (fence F) while `lose` brings back the saved state; the next hold, through
/// `after` (a client of the store as it is now), must get a fence above F.
async fn fences_rise_across_a_partial_loss(
    before: &Locks,
    kind: HoldKind,
    name: &str,
    checkpoint: impl AsyncFnOnce() -> anyhow::Result<()>,
    lose: impl AsyncFnOnce() -> anyhow::Result<Locks>,
) -> anyhow::Result<()> {
    let (_, first) = take(before, kind, name).await?;
    drop(first);
    // Let the background releases land before the checkpoint.
    sleep(Duration::from_millis(100)).await;
    checkpoint().await?;
    for _ in 0..3 {
        let (_, guard) = take(before, kind, name).await?;
        drop(guard);
        sleep(Duration::from_millis(50)).await;
    }
    let (held_fence, held) = take(before, kind, name).await?;
    let after = lose().await?;
    let (next_fence, next) = take(&after, kind, name).await?;
    drop(next);
    drop(held);
    ensure!(
        next_fence > held_fence,
        "{kind:?} {name}: fence {next_fence} given after the loss, while the holder before it has {held_fence}"
    );
    Ok(())
}

/// One hold of `kind` on `name`, released at once: its fence.
async fn fence_of_one_hold(locks: &Locks, kind: HoldKind, name: &str) -> anyhow::Result<u64> {
    let wait = Duration::from_secs(5);
    Ok(match kind {
        HoldKind::Mutex => {
            let g = locks.mutex(name).wait(wait).acquire().await?;
            let fence = g.fence().get();
            g.release().await?;
            fence
        }
        HoldKind::Permit => {
            let g = locks.semaphore(name, 1).wait(wait).acquire().await?;
            let fence = g.fence().get();
            g.release().await?;
            fence
        }
        HoldKind::Writer => {
            let g = locks.rwlock(name).wait(wait).write().await?;
            let fence = g.fence().get();
            g.release().await?;
            fence
        }
        HoldKind::Reader => {
            let g = locks.rwlock(name).wait(wait).read().await?;
            let fence = g.fence().get();
            g.release().await?;
            fence
        }
    })
}

/// Sets the last fence given out for `name` (a hold of `kind` on it was released just before,
/// so the store still has its counter) to `fence`.
fn set_last_fence(addr: SocketAddr, kind: HoldKind, name: &str, fence: u64) -> anyhow::Result<()> {
    let fence = fence.to_string();
    match kind {
        HoldKind::Mutex => {
            // The lock's value: layout, token, fence, holds, queued, owner (common.lua).
            let key = format!("dlock:lock:{name}");
            let value: Vec<u8> = query(addr, &["GET", &key])?;
            let mut fields: Vec<&[u8]> = value.split(|b| *b == 0).collect();
            ensure!(fields.len() >= 6, "{key}: not a lock value");
            fields[2] = fence.as_bytes();
            let mut cmd = redis::cmd("SET");
            cmd.arg(&key).arg(fields.join(&0u8)).arg("KEEPTTL");
            let () = cmd.query(&mut admin(addr)?)?;
        }
        HoldKind::Permit => query(
            addr,
            &["HSET", &format!("dlock:pfence:{name}"), "#", &fence],
        )?,
        HoldKind::Writer | HoldKind::Reader => {
            query(addr, &["HSET", &format!("dlock:rw:{name}"), "#", &fence])?
        }
    }
    Ok(())
}

/// Lua numbers are doubles, exact only up to 2^53: fences and value versions past it must
/// still rise by one each time (and the holds that get them still be released by them).
#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_keep_rising_past_two_to_the_53() -> anyhow::Result<()> {
    const NEAR: u64 = (1 << 53) - 2;
    let fx = redis_or_skip!();
    let locks = fx.connect().await?;
    let addr = fx.addr();
    let mut failures = Vec::new();
    for kind in HOLD_KINDS {
        let name = format!("big-fence/{kind:?}");
        fence_of_one_hold(&locks, kind, &name).await?;
        set_last_fence(addr, kind, &name, NEAR)?;
        let mut last = NEAR;
        for _ in 0..4 {
            let fence = fence_of_one_hold(&locks, kind, &name).await?;
            if fence <= last {
                failures.push(format!("{kind:?}: fence {fence} after {last}"));
                break;
            }
            last = fence;
        }
    }
    let value = locks.value("big-version");
    value.set(b"0").await?;
    query::<i64>(
        addr,
        &[
            "HSET",
            "dlock:value:big-version",
            "version",
            &NEAR.to_string(),
        ],
    )?;
    let mut last = NEAR;
    for i in 0..4 {
        let version = value.set(format!("{i}")).await?;
        if version <= last {
            failures.push(format!("value: version {version} after {last}"));
            break;
        }
        last = version;
    }
    ensure!(failures.is_empty(), "not rising past 2^53: {failures:?}");
    Ok(())
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_rise_after_a_restart_from_an_older_snapshot() -> anyhow::Result<()> {
    let fx = redis_or_skip!();
    for kind in HOLD_KINDS {
        let before = fx
            .connect()
            .await?
            .with_watchdog_lease(Duration::from_secs(30))?;
        let name = format!("snapshot/{kind:?}");
        let addr = fx.addr();
        fences_rise_across_a_partial_loss(
            &before,
            kind,
            &name,
            async || {
                let reply: String = query(addr, &["SAVE"])?;
                ensure!(reply == "OK", "SAVE: {reply}");
                Ok(())
            },
            async || {
                // A crash, then a start from the RDB file SAVE wrote.
                tokio::task::block_in_place(|| fx.server().restart())?;
                fx.connect().await
            },
        )
        .await?;
    }
    Ok(())
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn value_versions_rise_after_a_restart_from_an_older_snapshot() -> anyhow::Result<()> {
    let fx = redis_or_skip!();
    let value = fx.connect().await?.value("snapshot/stock");
    value.set("1").await?;
    let reply: String = query(fx.addr(), &["SAVE"])?;
    ensure!(reply == "OK", "SAVE: {reply}");
    let mut last = 0;
    for stock in ["2", "3", "4"] {
        last = value.set(stock).await?;
    }
    tokio::task::block_in_place(|| fx.server().restart())?;
    let value = fx.connect().await?.value("snapshot/stock");
    let restored = value.get().await?.context("the snapshot's value is gone")?;
    ensure!(restored.value == b"1", "restored {restored:?}");
    // A version handed out before the loss must never be handed out again for other bytes: a
    // writer that read it would take the new value for the one it read.
    let next = value.set("5").await?;
    ensure!(
        next > last,
        "version {next} after the restart, {last} before it"
    );
    Ok(())
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_rise_after_a_failover_to_a_lagging_replica() -> anyhow::Result<()> {
    for kind in HOLD_KINDS {
        let fx = redis_or_skip!();
        let primary = fx.addr();
        let replica = tokio::task::block_in_place(|| {
            ServerProcess::start(Redis {
                extra_args: vec![
                    "--replicaof".into(),
                    "127.0.0.1".into(),
                    primary.port().to_string(),
                ],
            })
        })?;
        let replica_addr = replica.addr();
        let replica = std::sync::Mutex::new(Some(replica));
        let before = fx
            .connect()
            .await?
            .with_watchdog_lease(Duration::from_secs(30))?;
        let name = format!("failover/{kind:?}");
        fences_rise_across_a_partial_loss(
            &before,
            kind,
            &name,
            async || {
                // Caught up, then cut off: the replica keeps what it has and misses the rest.
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    let info: String = query(replica_addr, &["INFO", "replication"])?;
                    let acked: i64 = query(primary, &["WAIT", "1", "100"])?;
                    if info.contains("master_link_status:up") && acked >= 1 {
                        break;
                    }
                    ensure!(
                        Instant::now() < deadline,
                        "the replica never caught up: {info}"
                    );
                    sleep(Duration::from_millis(50)).await;
                }
                let _: String = query(replica_addr, &["REPLICAOF", "NO", "ONE"])?;
                Ok(())
            },
            async || {
                // The primary dies; clients move to the promoted replica.
                tokio::task::block_in_place(|| fx.server().kill())?;
                Ok(dlock::connect(&format!("redis://{replica_addr}")).await?)
            },
        )
        .await?;
        drop(replica.lock().unwrap().take());
    }
    Ok(())
}

/// How many distinct names the bounded-state test uses (the figure).
const BOUNDED_NAMES: usize = 100_000;

/// Per-name state is bounded: 100,000 names taken and released, held by a client that
/// crashed, or waited for by a client that crashed while queued, leave no key once their
/// leases and the waiters' places have ended.
#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_per_name_is_left_once_leases_and_waiters_end() -> anyhow::Result<()> {
    let fx = redis_or_skip!();
    let addr = fx.addr();
    // No response timeout: the machine may be busy, and this connection only observes.
    let redis = redis::Client::open(format!("redis://{addr}"))?
        .get_multiplexed_async_connection_with_config(
            &redis::AsyncConnectionConfig::new().set_response_timeout(None),
        )
        .await?;
    // Thousands of calls in flight on one connection: a 1 s response timeout (the default)
    // failed this test on a loaded machine, and timeouts are not what it is about.
    dlock_testkit::bounded::nothing_per_name_is_left(dlock_testkit::bounded::BoundedStore {
        holders: dlock::connect(&format!("redis://{addr}?timeout=10s")).await?,
        upstream: addr,
        url_via: Box::new(|addr| format!("redis://{addr}?timeout=10s")),
        names: BOUNDED_NAMES,
        ttl: Duration::from_secs(2),
        queued: Box::new(move |name| {
            let mut redis = redis.clone();
            Box::pin(async move {
                Ok(redis::cmd("EXISTS")
                    .arg(format!("dlock:queue:{name}"))
                    .query_async(&mut redis)
                    .await?)
            })
        }),
        left: Box::new(move || {
            Box::pin(async move {
                let left = tokio::task::spawn_blocking(move || scan_all(addr)).await??;
                Ok((left.len(), left.into_iter().take(5).collect()))
            })
        }),
        // Expired keys are reclaimed lazily or by Redis's active expiry cycle, which SCAN
        // drives here.
        allowed: 2,
        settle: Duration::from_secs(60),
    })
    .await
}

fn scan_all(addr: std::net::SocketAddr) -> anyhow::Result<Vec<String>> {
    let mut keys = Vec::new();
    let mut cursor = "0".to_owned();
    loop {
        let (next, page): (String, Vec<String>) =
            query(addr, &["SCAN", &cursor, "COUNT", "10000"])?;
        keys.extend(page);
        if next == "0" {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// A server that stops answering is reported with what timed out and after how long.
#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test]
async fn a_hung_server_is_reported_with_the_response_timeout() -> anyhow::Result<()> {
    let fx = redis_or_skip!();
    let proxy = FaultProxy::start(&[fx.addr()])?;
    let locks = dlock::connect(&format!("redis://{}?timeout=300ms", proxy.addrs()[0])).await?;
    proxy.set(NetFault::Blackhole);
    let error = locks
        .mutex("hung")
        .try_acquire()
        .await
        .err()
        .context("a hung server granted a lock")?;
    let message = format!("{error}");
    ensure!(
        matches!(error, Error::Unavailable { .. })
            && message.contains("response timeout of 300ms")
            && message.contains("?timeout="),
        "{error:?}: {message}"
    );
    Ok(())
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_of_one_pass_go_in_one_script_and_each_lease_is_answered_alone()
-> anyhow::Result<()> {
    let fx = redis_or_skip!();
    let addr = fx.addr();
    let locks = fx
        .connect()
        .await?
        .with_watchdog_lease(Duration::from_millis(900))?;
    let mut guards = Vec::new();
    for i in 0..40 {
        guards.push(locks.mutex(format!("gathered/{i}")).acquire().await?);
    }
    // One lock taken from its holder: its renewal alone is refused.
    let _: () = query(addr, &["DEL", "dlock:lock:gathered/7"])?;
    let _: () = query(addr, &["CONFIG", "RESETSTAT"])?;
    sleep(Duration::from_millis(1500)).await;
    let scripts = command_calls(addr, "evalsha")?;
    // 40 leases renewed every 300 ms for 1.5 s: about 200 renewals, in a few scripts per pass.
    ensure!(
        scripts < 60,
        "{scripts} scripts for the renewals of 40 leases: not gathered"
    );
    timeout(Duration::from_secs(2), guards[7].lost())
        .await
        .context("the taken lock's guard was not told")?;
    for (i, guard) in guards.iter().enumerate() {
        ensure!(
            i == 7 || !guard.is_lost(),
            "lock {i} was lost with the taken one"
        );
    }
    Ok(())
}

/// The `CLIENT LIST` lines of the connections named `name`.
fn clients_named(addr: SocketAddr, name: &str) -> anyhow::Result<Vec<String>> {
    let list: String = query(addr, &["CLIENT", "LIST"])?;
    let field = format!(" name={name} ");
    Ok(list
        .lines()
        .filter(|line| line.contains(&field))
        .map(str::to_owned)
        .collect())
}

/// The blocking facade's calls run on the caller's thread, and there its Redis commands go
/// over a blocking connection of their own (named `dlock-blocking`) rather than through the
/// runtime; one the server closed while it idled is replaced without an error.
#[cfg(feature = "blocking")]
#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[test]
fn a_blocking_callers_commands_go_over_a_blocking_connection_on_its_thread() -> anyhow::Result<()> {
    let Some(fx) = start()? else {
        return Ok(());
    };
    let addr = fx.addr();
    let url = fx.url().context("a redis URL")?;
    let locks = dlock::blocking::Locks::connect(&url)?;
    let pair = || -> anyhow::Result<()> {
        let guard = locks
            .mutex("direct")
            .ttl(Duration::from_secs(30))
            .acquire()?;
        guard.release()?;
        Ok(())
    };
    pair()?;
    let named = clients_named(addr, "dlock-blocking")?;
    ensure!(
        named.len() == 1 && named[0].contains(" cmd=evalsha "),
        "no blocking connection sent the release: {named:?}"
    );
    // The server closes every client connection during a hold: the release (which, unlike
    // an acquire, is not tried again) reconnects by itself.
    let guard = locks
        .mutex("direct")
        .ttl(Duration::from_secs(30))
        .acquire()?;
    let _: i64 = query(addr, &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"])?;
    guard.release()?;
    pair()?;
    let named = clients_named(addr, "dlock-blocking")?;
    ensure!(named.len() == 1, "blocking connections: {named:?}");
    ensure!(locks_free(addr, "direct")?, "the lock was left held");
    Ok(())
}

/// In redis-py's layout the lock is redis-py's own key: a holder that speaks redis-py's
/// protocol (`SET NAME TOKEN NX PX`, a compare-and-delete release) and a dlock holder exclude
/// each other both ways, dlock's fences keep rising across a redis-py hold in between, and a
/// dlock waiter behind a redis-py holder gets the lock once redis-py lets it go.
#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_py_layout_excludes_redis_py_holders_both_ways() -> anyhow::Result<()> {
    let fx = redis_or_skip!();
    let addr = fx.addr();
    let locks = dlock::connect(&format!("redis://{addr}?layout=redis-py")).await?;
    // redis-py's acquire: SET NX with its timeout; its release: delete if the token is its own.
    let redis_py_acquire = |token: &str| -> anyhow::Result<bool> {
        let set: Option<String> = query(addr, &["SET", "jobs", token, "NX", "PX", "10000"])?;
        Ok(set.is_some())
    };
    let redis_py_release = |token: &str| -> anyhow::Result<i64> {
        let script = redis::Script::new(
            "if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end \
             redis.call('del', KEYS[1]) return 1",
        );
        Ok(script.key("jobs").arg(token).invoke(&mut admin(addr)?)?)
    };

    let first = locks
        .mutex("jobs")
        .ttl(Duration::from_secs(10))
        .acquire()
        .await?;
    let stored: String = query(addr, &["GET", "jobs"])?;
    ensure!(
        stored.len() == 32,
        "the key holds dlock's token as redis-py would: {stored:?}"
    );
    let pttl: i64 = query(addr, &["PTTL", "jobs"])?;
    ensure!(
        pttl > 9_000,
        "the key carries the lease as its expiry: {pttl} ms"
    );
    ensure!(
        !redis_py_acquire("py-1")?,
        "redis-py got in beside a dlock holder"
    );
    ensure!(
        redis_py_release("py-1")? == 0,
        "redis-py released dlock's hold"
    );
    let first_fence = first.fence();
    first.release().await?;
    let gone: Option<String> = query(addr, &["GET", "jobs"])?;
    ensure!(gone.is_none(), "dlock's release left the key: {gone:?}");

    ensure!(
        redis_py_acquire("py-2")?,
        "redis-py could not take the lock dlock released"
    );
    ensure!(
        locks.mutex("jobs").try_acquire().await?.is_none(),
        "dlock got in beside a redis-py holder"
    );
    let info = locks
        .inspect("jobs")
        .await?
        .context("a redis-py holder is shown")?;
    ensure!(
        info.ttl_left.is_some(),
        "inspect shows the redis-py holder's expiry"
    );
    // A dlock waiter behind the redis-py holder gets the lock once it is released.
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move {
            locks
                .mutex("jobs")
                .wait(Duration::from_secs(10))
                .acquire()
                .await
        })
    };
    sleep(Duration::from_millis(300)).await;
    ensure!(
        !waiter.is_finished(),
        "the waiter got in while redis-py held the lock"
    );
    ensure!(redis_py_release("py-2")? == 1, "redis-py's release failed");
    let second = timeout(Duration::from_secs(5), waiter).await???;
    ensure!(
        second.fence() > first_fence,
        "fences rise across a redis-py hold: {} after {first_fence}",
        second.fence()
    );
    // A break reaches the holder at its next renewal, within a third of the watchdog lease.
    ensure!(
        locks.force_release("jobs").await?,
        "the hold was not broken"
    );
    timeout(Duration::from_secs(40), second.lost()).await?;
    Ok(())
}
