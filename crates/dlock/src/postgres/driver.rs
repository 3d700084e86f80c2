//! The postgres backend's entry in the driver table (`registry.rs`): how `connect` finds it.

use std::sync::Arc;

use crate::registry::Driver;

pub(crate) const DRIVER: Driver = Driver {
    name: "postgres",
    feature: Some("postgres"),
    schemes: &["postgres", "postgresql"],
    // The lease table's or the session locks', by `?mode`.
    capabilities: None,
    connect: |url| {
        Box::pin(async move { Ok(Arc::new(super::PostgresBackend::connect_url(url).await?) as _) })
    },
};
