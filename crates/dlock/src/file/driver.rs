//! The file backend's entry in the driver table (`registry.rs`): how `connect` finds it.

use std::sync::Arc;

use crate::registry::Driver;

pub(crate) const DRIVER: Driver = Driver {
    name: "file",
    feature: Some("file"),
    schemes: super::FILE_SCHEMES,
    capabilities: Some(super::INFO.capabilities),
    connect: |url| {
        Box::pin(async move {
            let config = super::FileConfig::from_url(url)?;
            Ok(Arc::new(super::FileBuilder::from_config(config).build()?) as _)
        })
    },
};
