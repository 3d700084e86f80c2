//! The redlock backend's entry in the driver table (`registry.rs`): how `connect` finds it.

use std::sync::Arc;

use crate::registry::Driver;

pub(crate) const DRIVER: Driver = Driver {
    name: "redlock",
    feature: Some("redis"),
    schemes: &["redlock", "redlocks"],
    capabilities: Some(super::INFO.capabilities),
    connect: |url| {
        Box::pin(async move { Ok(Arc::new(super::RedlockBackend::connect_url(url).await?) as _) })
    },
};
