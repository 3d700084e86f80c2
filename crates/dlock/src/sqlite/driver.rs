//! The sqlite backend's entry in the driver table (`registry.rs`): how `connect` finds it.

use std::sync::Arc;

use crate::registry::Driver;

pub(crate) const DRIVER: Driver = Driver {
    name: "sqlite",
    feature: Some("sqlite"),
    schemes: &["sqlite"],
    capabilities: Some(super::INFO.capabilities),
    connect: |url| {
        Box::pin(async move { Ok(Arc::new(super::SqliteBackend::connect_url(url).await?) as _) })
    },
};
