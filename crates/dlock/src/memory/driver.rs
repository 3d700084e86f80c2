//! The memory backend's entry in the driver table (`registry.rs`): how `connect` finds it.
//!
//! Its lines of the crate docs, which the build script copies into `lib.rs`
//! (`build/drivers.rs`): rows of the URL table (`url:`) and of `connect`'s (`connect:`), its
//! item in the list of backends (`backend:`, when built) and of cargo features (`feature:`).
//!
//! url: | `memory://` or `memory://NAME` | tasks of this process; `NAME` shares one store between clients | none |
//! connect: | `memory://` or `memory://NAME` | [`memory`]: one process |
//! backend: * [`memory`]: tasks of one process; the reference backend.

use std::sync::Arc;

use crate::error::{Error, redact_url};
use crate::registry::Driver;

pub(crate) const DRIVER: Driver = Driver {
    name: "memory",
    feature: None,
    schemes: super::MEMORY_SCHEMES,
    capabilities: Some(super::INFO.capabilities),
    connect: |url| {
        Box::pin(async move {
            // Every other scheme refuses options it does not know; memory has none, and a
            // `?…` would otherwise silently become part of the store's name.
            if url.contains('?') {
                return Err(Error::InvalidUrl {
                    url: redact_url(url),
                    reason:
                        "memory:// takes no options (memory://NAME names a store of this process)"
                            .into(),
                });
            }
            Ok(Arc::new(super::MemoryBackend::from_url(url)) as _)
        })
    },
};
