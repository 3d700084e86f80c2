#![allow(clippy::expect_used, clippy::unwrap_used)]
//! URLs, and the blocking facade: bad input is a typed error, never a panic.

use std::time::Duration;

use dlock::Error;

#[tokio::test]
async fn unknown_and_malformed_urls_are_invalid() {
    for url in ["", "locks.db", "carrier-pigeon://coop", "://x", "sqlite:"] {
        let err = dlock::connect(url).await.unwrap_err();
        assert!(matches!(err, Error::InvalidUrl { .. }), "{url}: {err:?}");
    }
}

#[tokio::test]
async fn an_unknown_scheme_lists_the_enabled_ones() {
    let err = dlock::connect("carrier-pigeon://coop").await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("unknown scheme \"carrier-pigeon\"") && text.contains("sqlite"),
        "{text}"
    );
    for scheme in dlock::enabled_schemes() {
        assert!(text.contains(scheme), "{scheme} missing from {text}");
    }
}

#[tokio::test]
async fn passwords_never_appear_in_errors() {
    let err = dlock::connect("etcd://user:hunter2@127.0.0.1:1")
        .await
        .unwrap_err();
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
}

#[tokio::test]
async fn memory_urls_share_stores_by_name() {
    let a = dlock::connect("memory://shared-by-name").await.unwrap();
    let b = dlock::connect("memory://shared-by-name").await.unwrap();
    let c = dlock::connect("memory://another-name").await.unwrap();
    let _held = a.mutex("x").acquire().await.unwrap();
    assert!(b.mutex("x").try_acquire().await.unwrap().is_none());
    assert!(c.mutex("x").try_acquire().await.unwrap().is_some());
}

#[cfg(feature = "blocking")]
mod blocking {
    use super::*;

    #[test]
    fn the_blocking_facade_locks_and_releases() {
        let locks = dlock::blocking::Locks::connect("memory://blocking-test").unwrap();
        let guard = locks
            .mutex("job")
            .ttl(Duration::from_secs(10))
            .acquire()
            .unwrap();
        assert!(locks.mutex("job").try_acquire().unwrap().is_none());
        let info = locks.inspect("job").unwrap().unwrap();
        assert_eq!(info.fence, guard.fence());
        let fence = guard.fence();
        guard.release().unwrap();
        let again = locks.mutex("job").acquire().unwrap();
        assert!(again.fence() > fence);
        drop(again);
        // Dropping a blocking guard releases before returning.
        assert!(locks.inspect("job").unwrap().is_none());
    }

    #[test]
    fn the_blocking_watchdog_renews_while_the_thread_sleeps() {
        let locks = dlock::blocking::Locks::connect("memory://blocking-watchdog")
            .unwrap()
            .with_watchdog_lease(Duration::from_millis(200))
            .unwrap();
        let guard = locks.mutex("job").acquire().unwrap();
        std::thread::sleep(Duration::from_millis(800));
        assert!(!guard.is_lost());
        assert!(!guard.wait_lost(Duration::from_millis(100)).unwrap());
        guard.release().unwrap();
    }

    #[test]
    fn the_blocking_lost_signal_fires() {
        let locks = dlock::blocking::Locks::connect("memory://blocking-lost").unwrap();
        let guard = locks
            .mutex("job")
            .ttl(Duration::from_millis(100))
            .acquire()
            .unwrap();
        assert!(guard.wait_lost(Duration::from_secs(5)).unwrap());
        assert!(matches!(guard.release(), Err(Error::NotOwned { .. })));
    }

    #[tokio::test]
    async fn the_blocking_facade_refuses_to_run_inside_async_code() {
        let err = dlock::blocking::Locks::connect("memory://").unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidArgument {
                    what: "call site",
                    ..
                }
            ),
            "{err:?}"
        );
    }
}

/// Guards and clients move freely between tasks and threads.
#[test]
fn handles_and_guards_are_send_sync_and_static() {
    fn movable<T: Send + Sync + 'static>() {}
    movable::<dlock::Locks>();
    movable::<dlock::MutexGuard>();
    movable::<dlock::MutexBuilder>();
    movable::<dlock::Error>();
    movable::<dlock::LockInfo>();
    #[cfg(feature = "blocking")]
    {
        movable::<dlock::blocking::Locks>();
        movable::<dlock::blocking::MutexGuard>();
    }
    #[cfg(feature = "sqlite")]
    movable::<dlock::sqlite::SqliteBackend>();
    #[cfg(feature = "redis")]
    movable::<dlock::redis::RedisBackend>();
    #[cfg(feature = "etcd")]
    movable::<dlock::etcd::EtcdBackend>();
    movable::<dlock::memory::MemoryBackend>();
}

/// Every backend module exports the same vocabulary: `<Store>Backend`, `<Store>Builder`,
/// `<Store>Config` (with `Default`) and `<STORE>_SCHEMES`.
#[test]
fn every_backend_exports_the_fixed_set() {
    fn config<T: Default + std::fmt::Debug + Clone>() {}
    let _: &[&str] = dlock::memory::MEMORY_SCHEMES;
    let _ = dlock::memory::MemoryBuilder::new().build();
    config::<dlock::memory::MemoryConfig>();
    let _: fn() -> dlock::memory::MemoryBackend = dlock::memory::MemoryBackend::new;
    #[cfg(feature = "sqlite")]
    {
        let _: &[&str] = dlock::sqlite::SQLITE_SCHEMES;
        let _ = dlock::sqlite::SqliteBuilder::new("x.db");
        config::<dlock::sqlite::SqliteConfig>();
        let _: fn(&dlock::sqlite::SqliteBackend) -> &std::path::Path =
            dlock::sqlite::SqliteBackend::path;
    }
    #[cfg(feature = "redis")]
    {
        let _: &[&str] = dlock::redis::REDIS_SCHEMES;
        let _ = dlock::redis::RedisBuilder::new("redis://h:6379/0");
        config::<dlock::redis::RedisConfig>();
        let _: fn(&dlock::redis::RedisBackend) -> &dlock::redis::RedisConfig =
            dlock::redis::RedisBackend::config;
    }
    #[cfg(feature = "redis")]
    {
        let _: &[&str] = dlock::redlock::REDLOCK_SCHEMES;
        let _ = dlock::redlock::RedlockBuilder::new("redlock://a:1,b:2,c:3");
        config::<dlock::redlock::RedlockConfig>();
        let _: fn(&dlock::redlock::RedlockBackend) -> &dlock::redlock::RedlockConfig =
            dlock::redlock::RedlockBackend::config;
    }
    #[cfg(feature = "postgres")]
    {
        let _: &[&str] = dlock::postgres::POSTGRES_SCHEMES;
        let _ = dlock::postgres::PostgresBuilder::new("postgres://h/db");
        config::<dlock::postgres::PostgresConfig>();
        let _: fn(&dlock::postgres::PostgresBackend) -> &dlock::postgres::PostgresConfig =
            dlock::postgres::PostgresBackend::config;
    }
    #[cfg(feature = "mysql")]
    {
        let _: &[&str] = dlock::mysql::MYSQL_SCHEMES;
        let _ = dlock::mysql::MysqlBuilder::new("mysql://h/db");
        config::<dlock::mysql::MysqlConfig>();
        let _: fn(&dlock::mysql::MysqlBackend) -> &dlock::mysql::MysqlConfig =
            dlock::mysql::MysqlBackend::config;
    }
    #[cfg(feature = "etcd")]
    {
        let _: &[&str] = dlock::etcd::ETCD_SCHEMES;
        let _ = dlock::etcd::EtcdBuilder::new("etcd://h:2379");
        config::<dlock::etcd::EtcdConfig>();
        let _: fn(&dlock::etcd::EtcdBackend) -> &dlock::etcd::EtcdConfig =
            dlock::etcd::EtcdBackend::config;
    }
    #[cfg(feature = "zookeeper")]
    {
        let _: &[&str] = dlock::zookeeper::ZOOKEEPER_SCHEMES;
        let _ = dlock::zookeeper::ZookeeperBuilder::new("zk://h:2181/app");
        config::<dlock::zookeeper::ZookeeperConfig>();
        let _: fn(&dlock::zookeeper::ZookeeperBackend) -> &dlock::zookeeper::ZookeeperConfig =
            dlock::zookeeper::ZookeeperBackend::config;
    }
    #[cfg(feature = "file")]
    {
        let _: &[&str] = dlock::file::FILE_SCHEMES;
        let _ = dlock::file::FileBuilder::new("/var/lock/app");
        config::<dlock::file::FileConfig>();
        let _: fn(&dlock::file::FileBackend) -> &dlock::file::FileConfig =
            dlock::file::FileBackend::config;
    }
    #[cfg(feature = "nats")]
    {
        let _: &[&str] = dlock::nats::NATS_SCHEMES;
        let _ = dlock::nats::NatsBuilder::new("nats://h:4222/locks");
        config::<dlock::nats::NatsConfig>();
        let _: fn(&dlock::nats::NatsBackend) -> &dlock::nats::NatsConfig =
            dlock::nats::NatsBackend::config;
    }
    for scheme in dlock::enabled_schemes() {
        assert!(!scheme.is_empty());
    }
}
