//! The zookeeper backend's entry in the driver table (`registry.rs`): how `connect` finds it.

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
