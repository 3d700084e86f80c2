//! The redis backend's entry in the driver table (`registry.rs`): how `connect` finds it.
//!
//! Its lines of the crate docs, which the build script copies into `lib.rs`
//! (`build/drivers.rs`): rows of the URL table (`url:`) and of `connect`'s (`connect:`), its
//! item in the list of backends (`backend:`, when built) and of cargo features (`feature:`).
//!
//! url: | `redis://[user[:pass]@]host[:port][/db]`, `rediss://…` (TLS) | one Redis server (`redis`) | `prefix`, `ca`, `timeout`, `connect_timeout`, `poll_min`, `poll_max`, `protocol` |
//! url: | `redis+sentinel://[user[:pass]@]s1[:p1][,s2[:p2]…]/MASTER[/db]`, `rediss+sentinel://…` (TLS) | the Redis primary the sentinels name, followed across failovers (`redis`) | those of `redis://`, `sentinel_user`, `sentinel_password`, … |
//! url: | `redis+cluster://[user[:pass]@]h1:p1[,h2:p2…]`, `rediss+cluster://…` (TLS) | a Redis Cluster (`redis`) | those of `redis://` |
//! connect: | `redis://host[:port][/db]`, `rediss://…` (TLS) | `redis`: one Redis server |
//! connect: | `redis+sentinel://s1[:p1][,s2[:p2]…]/MASTER`, `rediss+sentinel://…` | `redis`: the primary the sentinels name |
//! connect: | `redis+cluster://h1:p1[,h2:p2…]`, `rediss+cluster://…` | `redis`: a Redis Cluster |
//! backend: * [`redis`]: one Redis server, Lua scripts, pub/sub hand-off, reentrant and fair locks.
//! feature: * `redis`: the Redis and Redlock backends (redis-rs, rustls with ring).

use std::sync::Arc;

use crate::registry::Driver;

pub(crate) const DRIVER: Driver = Driver {
    name: "redis",
    feature: Some("redis"),
    schemes: &[
        "redis",
        "rediss",
        "redis+sentinel",
        "rediss+sentinel",
        "redis+cluster",
        "rediss+cluster",
    ],
    capabilities: Some(super::INFO.capabilities),
    connect: |url| {
        Box::pin(async move { Ok(Arc::new(super::RedisBackend::connect_url(url).await?) as _) })
    },
};
