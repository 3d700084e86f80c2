//! The redlock backend's entry in the driver table (`registry.rs`): how `connect` finds it.
//!
//! Its lines of the crate docs, which the build script copies into `lib.rs`
//! (`build/drivers.rs`): rows of the URL table (`url:`) and of `connect`'s (`connect:`), its
//! item in the list of backends (`backend:`, when built) and of cargo features (`feature:`).
//!
//! url: | `redlock://[user[:pass]@]h1:p1,h2:p2,h3:p3[/db]`, `redlocks://…` (TLS) | Redlock over independent Redis servers (`redis`) | those of `redis://`, `node_timeout` |
//! connect: | `redlock://h1:p1,h2:p2,h3:p3`, `redlocks://…` (TLS) | `redlock`: a majority of independent Redis servers |
//! backend: * [`redlock`]: Redlock over N independent Redis servers, parallel quorum rounds.

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
