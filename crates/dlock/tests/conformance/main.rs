#![allow(clippy::expect_used, clippy::unwrap_used)]

//! The conformance suite on every backend this build enables.
//!
//! `cargo test -p dlock --test conformance -- sqlite::` runs one backend;
//! `-- --ignored` lists nothing useful: ignored trials are the unsupported ones.

use std::sync::Arc;

use dlock_testkit::conformance;
use dlock_testkit::fixture::{Fixture, MemoryFixture, MinimalFixture};

fn main() {
    // `minimal` is memory with every optional capability masked: it runs the cases that check
    // the API's `Unsupported` answers.
    let mut fixtures: Vec<Arc<dyn Fixture>> = vec![MemoryFixture::new(), MinimalFixture::new()];
    #[cfg(feature = "sqlite")]
    fixtures.push(dlock_testkit::fixture::SqliteFixture::new().expect("temp dir for SQLite"));
    #[cfg(feature = "redis")]
    if let Some(redis) = dlock_testkit::fixture::RedisFixture::start().expect("redis-server") {
        fixtures.push(redis);
    }
    #[cfg(feature = "redis")]
    if let Some(redlock) = dlock_testkit::fixture::RedlockFixture::start(5).expect("redis-server") {
        fixtures.push(redlock);
    }
    // One server per store, shared by the fixtures of both modes (lease table, session locks).
    #[cfg(feature = "postgres")]
    for fx in dlock_testkit::fixture::PostgresFixture::start_both().expect("PostgreSQL server") {
        fixtures.push(fx);
    }
    #[cfg(feature = "mysql")]
    for fx in dlock_testkit::fixture::MysqlFixture::start_both().expect("MariaDB server") {
        fixtures.push(fx);
    }
    #[cfg(feature = "etcd")]
    if let Some(etcd) = dlock_testkit::fixture::EtcdFixture::start().expect("etcd") {
        fixtures.push(etcd);
    }
    #[cfg(feature = "etcd")]
    if let Some(cluster) =
        dlock_testkit::fixture::EtcdClusterFixture::start().expect("etcd cluster")
    {
        fixtures.push(cluster);
    }
    #[cfg(feature = "zookeeper")]
    if let Some(zk) = dlock_testkit::fixture::ZookeeperFixture::start().expect("ZooKeeper server") {
        fixtures.push(zk);
    }
    #[cfg(feature = "zookeeper")]
    if let Some(zk) =
        dlock_testkit::fixture::ZookeeperEnsembleFixture::start().expect("ZooKeeper ensemble")
    {
        fixtures.push(zk);
    }
    conformance::main(fixtures)
}
