//! The zookeeper backend's entry in the driver table (`registry.rs`): how `connect` finds it.
//!
//! Its lines of the crate docs, which the build script copies into `lib.rs`
//! (`build/drivers.rs`): rows of the URL table (`url:`) and of `connect`'s (`connect:`), its
//! item in the list of backends (`backend:`, when built) and of cargo features (`feature:`).
//!
//! url: | `zk://[user:pass@]h1[:p1][,h2[:p2]…][/chroot]` (or `zookeeper://`) | ZooKeeper (`zookeeper`) | `session_timeout`, `connect_timeout`, `acl=open\|creator` |
//! connect: | `zk://h1[:p1][,h2[:p2]…][/chroot]`, `zookeeper://…` | `zookeeper`: ephemeral sequential nodes |
//! backend: * [`zookeeper`]: ZooKeeper, ephemeral sequential nodes with predecessor watches.
//! feature: * `zookeeper`: the ZooKeeper backend (zookeeper-client, pure Rust).

use std::sync::Arc;

use crate::registry::Driver;

pub(crate) const DRIVER: Driver = Driver {
    name: "zookeeper",
    feature: Some("zookeeper"),
    schemes: &["zk", "zookeeper"],
    capabilities: Some(super::INFO.capabilities),
    connect: |url| {
        Box::pin(async move { Ok(Arc::new(super::ZookeeperBackend::connect_url(url).await?) as _) })
    },
};
