//! Real-server test harness: runs throwaway database servers (Redis, PostgreSQL, MariaDB,
//! etcd, ZooKeeper, NATS) as child processes, each on a free 127.0.0.1 port with its data in a
//! temp dir, and offers fault hooks (pause, kill, restart) for lock tests.
//!
//! Everything here is synchronous std code, usable from sync tests and from
//! any async runtime (call it from a blocking context).
//!
//! Servers are found via `DLOCK_TEST_<NAME>_BIN` or on `PATH`. Tests that
//! need a server should skip when it is missing, unless
//! `DLOCK_TEST_REQUIRE` (`all` or a comma list such as `redis,etcd`) says
//! the server is required; see [`required`].
//!
//! ```no_run
//! use dlock_testkit::server::{Redis, ServerProcess, redis_command};
//!
//! let mut server = ServerProcess::start(Redis::default())?;
//! redis_command(server.addr(), &["SET", "k", "v"])?;
//! server.pause()?; // the server now hangs
//! server.resume()?;
//! server.restart()?; // same port, data lost (no persistence)
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod etcd;
mod kind;
pub mod mariadb;
pub mod nats;
pub mod port;
pub mod postgres;
mod process;
pub mod redis;
pub mod redis_cluster;
pub mod redis_sentinel;
mod template;
pub mod zookeeper;

pub use etcd::{Etcd, EtcdCluster, etcd_grpc_calls, etcd_is_leader};
pub use kind::{ServerError, ServerKind, find_binary, required};
pub use mariadb::Mariadb;
pub use nats::{Nats, NatsCluster, NatsNode, NatsSecure};
pub use port::free_port;
pub use postgres::Postgres;
pub use process::ServerProcess;
pub use redis::{
    Redis, RedisNodes, RedisReplicaSet, RedisTls, became_primary, redis_command,
    redis_command_with_timeout, redis_get, restore_snapshot, save_snapshot,
};
pub use redis_cluster::RedisCluster;
pub use redis_sentinel::{RedisSentinel, RedisSentinelSet, SENTINEL_MASTER};
pub use zookeeper::{Zookeeper, ZookeeperEnsemble, four_letter, zookeeper_installed};
