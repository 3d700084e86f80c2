//! The NATS backend's entry in the driver table (`registry.rs`): how `connect` finds it.
//!
//! Its lines of the crate docs, which the build script copies into `lib.rs`
//! (`build/drivers.rs`): rows of the URL table (`url:`) and of `connect`'s (`connect:`), its
//! item in the list of backends (`backend:`, when built) and of cargo features (`feature:`).
//!
//! url: | `nats://[user:pass@]h1[:p1][,h2[:p2]…][/BUCKET]` | a NATS JetStream key-value bucket (`nats`) | `timeout`, `replicas` |
//! connect: | `nats://host:port[,host:port…]/BUCKET` | `nats`: a JetStream key-value bucket, per-key TTLs |
//! backend: * [`nats`]: a NATS JetStream key-value bucket, per-key TTLs, revision fences, key watches.
//! feature: * `nats`: the NATS JetStream key-value backend (async-nats, rustls with ring; nats-server 2.11 or later).

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
