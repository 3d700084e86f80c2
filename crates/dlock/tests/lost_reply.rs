#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]
//! A lost reply does not orphan a grant: the store runs the acquire, its answer is lost on
//! the way back (the fault proxy drops it and resets the connection), and the caller's
//! retry, with the same token, must take the grant it already has, instead of finding the
//! lock busy and waiting out its own lease (30 s) while every other contender waits too.
//!
//! On real servers started by the test kit, for every store whose grants are lease records
//! that a retry can find again: Redis (mutex, permit, writer, reader), Redlock, and the
//! PostgreSQL and MariaDB lease tables. (Session locks, etcd and ZooKeeper tie a grant to a
//! connection or session, which the lost reply ends along with the grant.)
//!
//! Outside the waiting path (`try_acquire`, `no_wait`, an acquire whose wait ran out while
//! the attempt was on its way, a multi-lock's one-step attempt) the call has no time left to
//! retry, and must still leave no grant behind: either it returns the grant its attempt made
//! (the caller holds it and knows it), or the lock is free for the next caller at once.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, ensure};
use dlock::Locks;
use dlock_testkit::fault_proxy::{FaultProxy, NetFault};

/// Shorter than the default lease (30 s): a retry that waited out its own grant times out.
const WAIT: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug)]
enum Hold {
    Mutex,
    Permit,
    Writer,
    Reader,
}

/// Takes `name` as `hold`; the guard, as something to release.
async fn take(locks: &Locks, hold: Hold, name: &str) -> anyhow::Result<Held> {
    Ok(match hold {
        Hold::Mutex => Held::Mutex(locks.mutex(name).wait(WAIT).acquire().await?),
        Hold::Permit => Held::Permit(locks.semaphore(name, 1).wait(WAIT).acquire().await?),
        Hold::Writer => Held::Write(locks.rwlock(name).wait(WAIT).write().await?),
        Hold::Reader => Held::Read(locks.rwlock(name).wait(WAIT).read().await?),
    })
}

enum Held {
    Mutex(dlock::MutexGuard),
    Permit(dlock::Permit),
    Write(dlock::WriteGuard),
    Read(dlock::ReadGuard),
    Multi(dlock::MultiGuard),
}

impl Held {
    async fn release(self) -> dlock::Result<()> {
        match self {
            Held::Mutex(g) => g.release().await,
            Held::Permit(g) => g.release().await,
            Held::Write(g) => g.release().await,
            Held::Read(g) => g.release().await,
            Held::Multi(g) => g.release().await,
        }
    }
}

/// Whether a writer (the most demanding hold) gets `name` at once.
async fn free(locks: &Locks, hold: Hold, name: &str) -> anyhow::Result<bool> {
    Ok(match hold {
        Hold::Mutex => locks.mutex(name).try_acquire().await?.is_some(),
        Hold::Permit => locks.semaphore(name, 1).try_acquire().await?.is_some(),
        Hold::Writer | Hold::Reader => locks.rwlock(name).try_write().await?.is_some(),
    })
}

/// A proxy in front of `addrs`, and `url` rewritten to go through it.
fn proxied(url: &str, addrs: &[SocketAddr]) -> anyhow::Result<(FaultProxy, String)> {
    let proxy = FaultProxy::start(addrs)?;
    let mut proxied = url.to_owned();
    for (addr, through) in addrs.iter().zip(proxy.addrs()) {
        proxied = proxied.replace(&addr.to_string(), &through.to_string());
    }
    Ok((proxy, proxied))
}

/// The store behind `url` (served at `addrs`), reached through a proxy that loses the reply
/// to the first request naming the lock once the client is warmed up.
async fn a_lost_reply_does_not_orphan_the_grant(
    url: &str,
    addrs: &[SocketAddr],
    hold: Hold,
) -> anyhow::Result<()> {
    let (proxy, proxied) = proxied(url, addrs)?;
    let locks = dlock::connect(&proxied).await?;
    let other = dlock::connect(url).await?;
    let name = format!("lost-reply/{hold:?}/{}", uuid::Uuid::new_v4().simple());
    // Warm up: connections open and tables made, so the next request naming the lock is the
    // acquire's.
    take(&locks, hold, &name).await?.release().await?;

    proxy.lose_reply_to(name.as_bytes());
    let held = take(&locks, hold, &name)
        .await
        .context("the retry after the lost reply did not get the lock")?;
    ensure!(proxy.replies_lost() == 1, "no reply was lost");
    ensure!(
        !free(&other, hold, &name).await?,
        "{hold:?}: the lock looked free while held"
    );
    held.release().await?;
    ensure!(
        free(&other, hold, &name).await?,
        "{hold:?}: still held after its one release: the lost reply's grant was orphaned"
    );
    Ok(())
}

/// How a call with no time left to retry asks for the lock.
#[derive(Clone, Copy, Debug)]
enum Call {
    /// `try_acquire` (`try_write`, `try_read`).
    Try,
    /// `no_wait().acquire()` (`write`, `read`).
    NoWait,
    /// A waiting acquire whose wait ran out while its attempt was on the way: the proxy
    /// delays every request by [`SLOW`], longer than [`SHORT_WAIT`].
    WaitRanOut,
    /// A multi-lock's `try_acquire` over two names (one step where the store has one).
    Multi,
}

/// The wait of [`Call::WaitRanOut`].
const SHORT_WAIT: Duration = Duration::from_millis(50);
/// The proxy's delay of each chunk in [`Call::WaitRanOut`]: past the wait, and a round trip
/// (twice this) well inside the stores' response timeouts.
const SLOW: Duration = Duration::from_millis(200);

/// What `call` answered: the hold, nothing (busy), or the store's error.
async fn call(
    locks: &Locks,
    hold: Hold,
    call: Call,
    names: &[String],
) -> dlock::Result<Option<Held>> {
    let name = names[0].as_str();
    let (mutex, permit) = (locks.mutex(name), locks.semaphore(name, 1));
    let rwlock = locks.rwlock(name);
    Ok(match (call, hold) {
        (Call::Multi, _) => locks
            .multi_lock(names)
            .try_acquire()
            .await?
            .map(Held::Multi),
        (Call::Try, Hold::Mutex) => mutex.try_acquire().await?.map(Held::Mutex),
        (Call::Try, Hold::Permit) => permit.try_acquire().await?.map(Held::Permit),
        (Call::Try, Hold::Writer) => rwlock.try_write().await?.map(Held::Write),
        (Call::Try, Hold::Reader) => rwlock.try_read().await?.map(Held::Read),
        (Call::NoWait, Hold::Mutex) => Some(Held::Mutex(mutex.no_wait().acquire().await?)),
        (Call::NoWait, Hold::Permit) => Some(Held::Permit(permit.no_wait().acquire().await?)),
        (Call::NoWait, Hold::Writer) => Some(Held::Write(rwlock.no_wait().write().await?)),
        (Call::NoWait, Hold::Reader) => Some(Held::Read(rwlock.no_wait().read().await?)),
        (Call::WaitRanOut, Hold::Mutex) => {
            Some(Held::Mutex(mutex.wait(SHORT_WAIT).acquire().await?))
        }
        (Call::WaitRanOut, Hold::Permit) => {
            Some(Held::Permit(permit.wait(SHORT_WAIT).acquire().await?))
        }
        (Call::WaitRanOut, Hold::Writer) => {
            Some(Held::Write(rwlock.wait(SHORT_WAIT).write().await?))
        }
        (Call::WaitRanOut, Hold::Reader) => Some(Held::Read(rwlock.wait(SHORT_WAIT).read().await?)),
    })
}

/// A call with no time left to retry, whose granting reply is lost: afterwards the lock is
/// either the caller's (and freed by its one release) or free for the next caller at once.
async fn a_lost_reply_without_time_to_retry_leaves_nothing_held(
    url: &str,
    addrs: &[SocketAddr],
    hold: Hold,
    how: Call,
) -> anyhow::Result<()> {
    let (proxy, proxied) = proxied(url, addrs)?;
    let locks = dlock::connect(&proxied).await?;
    let other = dlock::connect(url).await?;
    let base = format!(
        "lost-reply/{how:?}/{hold:?}/{}",
        uuid::Uuid::new_v4().simple()
    );
    let names = match how {
        Call::Multi => vec![format!("{base}/a"), format!("{base}/b")],
        _ => vec![base],
    };
    let names_are_free = async |what: &str| -> anyhow::Result<()> {
        for name in &names {
            ensure!(
                free(&other, hold, name).await?,
                "{how:?} {hold:?}: {name} still held {what}: the lost reply's grant was orphaned"
            );
        }
        Ok(())
    };
    // Warm up: connections open, tables made and scripts loaded (a one-step multi-lock has a
    // script of its own), so the next request naming the lock is the acquire's.
    match how {
        Call::Multi => {
            locks
                .multi_lock(&names)
                .try_acquire()
                .await?
                .context("the warm-up found the names busy")?
                .release()
                .await?
        }
        _ => take(&locks, hold, &names[0]).await?.release().await?,
    }

    proxy.lose_reply_to(names[0].as_bytes());
    if let Call::WaitRanOut = how {
        proxy.set(NetFault::Latency(SLOW));
    }
    let answered = call(&locks, hold, how, &names).await;
    proxy.set(NetFault::None);
    ensure!(proxy.replies_lost() == 1, "no reply was lost");
    match answered {
        Ok(Some(held)) => {
            for name in &names {
                ensure!(
                    !free(&other, hold, name).await?,
                    "{how:?} {hold:?}: {name} looked free while held"
                );
            }
            held.release().await?;
            names_are_free("after its one release").await
        }
        Ok(None) => names_are_free("after a call that found it busy").await,
        Err(error) => names_are_free(&format!("after the call failed ({error})")).await,
    }
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;
    use dlock_testkit::fixture::{Fixture, RedisFixture, RedlockFixture};

    #[cfg_attr(
        dlock_test_missing = "redis",
        ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
    )]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lost_reply_does_not_orphan_a_redis_grant() -> anyhow::Result<()> {
        let fx = dlock_testkit::require::present("redis", RedisFixture::start())?;
        for hold in [Hold::Mutex, Hold::Permit, Hold::Writer, Hold::Reader] {
            a_lost_reply_does_not_orphan_the_grant(&fx.url().unwrap(), &[fx.addr()], hold).await?;
        }
        Ok(())
    }

    #[cfg_attr(
        dlock_test_missing = "redis",
        ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
    )]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lost_reply_does_not_orphan_a_redlock_grant() -> anyhow::Result<()> {
        let fx = dlock_testkit::require::present("redis", RedlockFixture::start(3))?;
        let addrs = fx.server().addrs();
        a_lost_reply_does_not_orphan_the_grant(&fx.url().unwrap(), &addrs, Hold::Mutex).await
    }

    #[cfg_attr(
        dlock_test_missing = "redis",
        ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
    )]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lost_reply_without_time_to_retry_leaves_no_redis_grant_held() -> anyhow::Result<()> {
        let fx = dlock_testkit::require::present("redis", RedisFixture::start())?;
        let mut cases = vec![(Call::Multi, Hold::Mutex)];
        for how in [Call::Try, Call::NoWait, Call::WaitRanOut] {
            for hold in [Hold::Mutex, Hold::Permit, Hold::Writer, Hold::Reader] {
                cases.push((how, hold));
            }
        }
        every_case_leaves_nothing_held(&fx.url().unwrap(), fx.addr(), &cases).await
    }

    /// The reported case: `dlock run --no-wait` whose acquire reply is lost fails, and the
    /// next `--no-wait` right after must not be told "busy".
    #[cfg_attr(
        dlock_test_missing = "redis",
        ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
    )]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lost_reply_to_dlock_run_no_wait_leaves_the_lock_free() -> anyhow::Result<()> {
        let fx = dlock_testkit::require::present("redis", RedisFixture::start())?;
        let url = fx.url().unwrap();
        let (proxy, proxied) = proxied(&url, &[fx.addr()])?;
        let other = dlock::connect(&url).await?;
        let name = format!("lost-reply/cli/{}", uuid::Uuid::new_v4().simple());
        // Warm up: the server has the scripts loaded, so the command's first request naming
        // the lock is its acquire.
        take(&other, Hold::Mutex, &name).await?.release().await?;

        proxy.lose_reply_to(name.as_bytes());
        let run = {
            let name = name.clone();
            tokio::task::spawn_blocking(move || {
                dlock_testkit::cli::dlock_command(&proxied)?
                    .args(["run", "--no-wait", &name, "--", "true"])
                    .stdin(std::process::Stdio::null())
                    .output()
                    .context("running dlock")
            })
            .await??
        };
        ensure!(proxy.replies_lost() == 1, "no reply was lost");
        let said = String::from_utf8_lossy(&run.stderr);
        ensure!(
            free(&other, Hold::Mutex, &name).await?,
            "after `dlock run --no-wait` ended ({}: {}), the lock is still held",
            run.status,
            said.trim()
        );
        Ok(())
    }
}

/// Runs every case (each on its own lock), then reports all that failed.
async fn every_case_leaves_nothing_held(
    url: &str,
    addr: SocketAddr,
    cases: &[(Call, Hold)],
) -> anyhow::Result<()> {
    let mut failed = Vec::new();
    for &(how, hold) in cases {
        if let Err(error) =
            a_lost_reply_without_time_to_retry_leaves_nothing_held(url, &[addr], hold, how).await
        {
            failed.push(format!("{error:#}"));
        }
    }
    ensure!(
        failed.is_empty(),
        "{} of {} cases failed:\n{}",
        failed.len(),
        cases.len(),
        failed.join("\n")
    );
    Ok(())
}

/// Every call without time to retry ([`Call`]) on a store's mutexes.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn no_call_without_time_to_retry_leaves_a_mutex_held(
    url: &str,
    addr: SocketAddr,
) -> anyhow::Result<()> {
    let cases =
        [Call::Try, Call::NoWait, Call::WaitRanOut, Call::Multi].map(|how| (how, Hold::Mutex));
    every_case_leaves_nothing_held(url, addr, &cases).await
}

#[cfg(feature = "postgres")]
#[cfg_attr(
    dlock_test_missing = "postgres",
    ignore = "PostgreSQL not found: install postgresql (scripts/test.sh does) or set DLOCK_TEST_POSTGRES_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_does_not_orphan_a_postgres_lease() -> anyhow::Result<()> {
    use dlock_testkit::fixture::{Fixture, PostgresFixture};
    for fx in PostgresFixture::start_both()? {
        if fx.backend() == "postgres" {
            let addr = fx.server().lock().unwrap().addr();
            a_lost_reply_does_not_orphan_the_grant(&fx.url().unwrap(), &[addr], Hold::Mutex)
                .await?;
        }
    }
    Ok(())
}

#[cfg(feature = "mysql")]
#[cfg_attr(
    dlock_test_missing = "mariadb",
    ignore = "MariaDB not found: install mariadb-server (scripts/test.sh does) or set DLOCK_TEST_MARIADB_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_does_not_orphan_a_mariadb_lease() -> anyhow::Result<()> {
    use dlock_testkit::fixture::{Fixture, MysqlFixture};
    for fx in MysqlFixture::start_both()? {
        if fx.backend() == "mariadb" {
            let addr = fx.server().lock().unwrap().addr();
            a_lost_reply_does_not_orphan_the_grant(&fx.url().unwrap(), &[addr], Hold::Mutex)
                .await?;
        }
    }
    Ok(())
}

#[cfg(feature = "postgres")]
#[cfg_attr(
    dlock_test_missing = "postgres",
    ignore = "PostgreSQL not found: install postgresql (scripts/test.sh does) or set DLOCK_TEST_POSTGRES_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_without_time_to_retry_leaves_no_postgres_lease_held() -> anyhow::Result<()> {
    use dlock_testkit::fixture::{Fixture, PostgresFixture};
    for fx in PostgresFixture::start_both()? {
        if fx.backend() == "postgres" {
            let addr = fx.server().lock().unwrap().addr();
            no_call_without_time_to_retry_leaves_a_mutex_held(&fx.url().unwrap(), addr).await?;
        }
    }
    Ok(())
}

#[cfg(feature = "mysql")]
#[cfg_attr(
    dlock_test_missing = "mariadb",
    ignore = "MariaDB not found: install mariadb-server (scripts/test.sh does) or set DLOCK_TEST_MARIADB_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_without_time_to_retry_leaves_no_mariadb_lease_held() -> anyhow::Result<()> {
    use dlock_testkit::fixture::{Fixture, MysqlFixture};
    for fx in MysqlFixture::start_both()? {
        if fx.backend() == "mariadb" {
            let addr = fx.server().lock().unwrap().addr();
            no_call_without_time_to_retry_leaves_a_mutex_held(&fx.url().unwrap(), addr).await?;
        }
    }
    Ok(())
}
