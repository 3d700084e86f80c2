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

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, ensure};
use dlock::Locks;
use dlock_testkit::fault_proxy::FaultProxy;

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
}

impl Held {
    async fn release(self) -> dlock::Result<()> {
        match self {
            Held::Mutex(g) => g.release().await,
            Held::Permit(g) => g.release().await,
            Held::Write(g) => g.release().await,
            Held::Read(g) => g.release().await,
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

/// The store behind `url` (served at `addrs`), reached through a proxy that loses the reply
/// to the first request naming the lock once the client is warmed up.
async fn a_lost_reply_does_not_orphan_the_grant(
    url: &str,
    addrs: &[SocketAddr],
    hold: Hold,
) -> anyhow::Result<()> {
    let proxy = FaultProxy::start(addrs)?;
    let mut proxied = url.to_owned();
    for (addr, through) in addrs.iter().zip(proxy.addrs()) {
        proxied = proxied.replace(&addr.to_string(), &through.to_string());
    }
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
        let Some(fx) = RedisFixture::start()? else {
            return Ok(());
        };
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
        let Some(fx) = RedlockFixture::start(3)? else {
            return Ok(());
        };
        let addrs = fx.server().addrs();
        a_lost_reply_does_not_orphan_the_grant(&fx.url().unwrap(), &addrs, Hold::Mutex).await
    }
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
