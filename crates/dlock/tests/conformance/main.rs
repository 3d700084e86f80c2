#![allow(clippy::expect_used, clippy::unwrap_used)]

//! The conformance suite on every backend this build enables.
//!
//! `cargo test -p dlock-rs --test conformance -- sqlite::` runs one backend;
//! `-- --ignored` lists nothing useful: ignored trials are the unsupported ones.

use std::sync::Arc;

use dlock_testkit::conformance;
use dlock_testkit::fixture::{Fixture, MemoryFixture, MinimalFixture};

fn main() {
    // `minimal` is memory with every optional capability masked: it runs the cases that check
    // the API's `Unsupported` answers.
    let mut fixtures: Vec<Arc<dyn Fixture>> = vec![MemoryFixture::new(), MinimalFixture::new()];
    // Backends whose server is not installed (and not required): reported as ignored.
    #[allow(unused_mut)]
    let mut missing: Vec<(String, String)> = Vec::new();
    #[allow(unused_macros)]
    macro_rules! or_missing {
        ($started:expr, $backend:expr, $what:expr) => {
            match $started {
                Some(fx) => fixtures.push(fx),
                None => missing.push(($backend.to_owned(), format!("{} not installed", $what))),
            }
        };
    }
    #[cfg(feature = "sqlite")]
    fixtures.push(dlock_testkit::fixture::SqliteFixture::new().expect("temp dir for SQLite"));
    #[cfg(feature = "redis")]
    or_missing!(
        dlock_testkit::fixture::RedisFixture::start().expect("redis-server"),
        "redis",
        "redis-server"
    );
    #[cfg(feature = "redis")]
    or_missing!(
        dlock_testkit::fixture::RedisSentinelFixture::start().expect("redis-server (sentinel)"),
        "redis-sentinel",
        "redis-server"
    );
    #[cfg(feature = "redis")]
    or_missing!(
        dlock_testkit::fixture::RedisClusterFixture::start().expect("redis-server (cluster)"),
        "redis-cluster",
        "redis-server"
    );
    #[cfg(feature = "redis")]
    or_missing!(
        dlock_testkit::fixture::RedlockFixture::start(5).expect("redis-server"),
        "redlock",
        "redis-server"
    );
    // One server per store, shared by the fixtures of both modes (lease table, session locks).
    #[cfg(feature = "postgres")]
    {
        let both =
            dlock_testkit::fixture::PostgresFixture::start_both().expect("PostgreSQL server");
        if both.is_empty() {
            missing.push(("postgres".into(), "PostgreSQL not installed".into()));
        }
        fixtures.extend(both.into_iter().map(|fx| fx as Arc<dyn Fixture>));
    }
    #[cfg(feature = "mysql")]
    {
        let both = dlock_testkit::fixture::MysqlFixture::start_both().expect("MariaDB server");
        if both.is_empty() {
            missing.push(("mariadb".into(), "MariaDB not installed".into()));
        }
        fixtures.extend(both.into_iter().map(|fx| fx as Arc<dyn Fixture>));
    }
    #[cfg(feature = "etcd")]
    or_missing!(
        dlock_testkit::fixture::EtcdFixture::start().expect("etcd"),
        "etcd",
        "etcd"
    );
    #[cfg(feature = "etcd")]
    or_missing!(
        dlock_testkit::fixture::EtcdClusterFixture::start().expect("etcd cluster"),
        "etcd-cluster",
        "etcd"
    );
    #[cfg(feature = "zookeeper")]
    or_missing!(
        dlock_testkit::fixture::ZookeeperFixture::start().expect("ZooKeeper server"),
        "zookeeper",
        "ZooKeeper"
    );
    #[cfg(feature = "zookeeper")]
    or_missing!(
        dlock_testkit::fixture::ZookeeperEnsembleFixture::start().expect("ZooKeeper ensemble"),
        "zookeeper-ensemble",
        "ZooKeeper"
    );
    conformance::main_with_missing(fixtures, missing)
}
