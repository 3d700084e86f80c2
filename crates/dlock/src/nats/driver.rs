//! The NATS backend's entry in the driver table (`registry.rs`): how `connect` finds it.

use std::sync::Arc;

use crate::registry::Driver;

pub(crate) const DRIVER: Driver = Driver {
    name: "nats",
    feature: Some("nats"),
    schemes: super::NATS_SCHEMES,
    capabilities: Some(super::INFO.capabilities),
    connect: |url| {
        Box::pin(async move { Ok(Arc::new(super::NatsBackend::connect_url(url).await?) as _) })
    },
};
