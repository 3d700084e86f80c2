//! The etcd backend's entry in the driver table (`registry.rs`): how `connect` finds it.
//!
//! Its lines of the crate docs, which the build script copies into `lib.rs`
//! (`build/drivers.rs`): rows of the URL table (`url:`) and of `connect`'s (`connect:`), its
//! item in the list of backends (`backend:`, when built) and of cargo features (`feature:`).
//!
//! url: | `etcd://[user:pass@]h1:p1[,h2:p2…]` | etcd v3 (`etcd`) | `prefix`, `tls`, `ca`, `timeout`, `connect_timeout` |
//! connect: | `etcd://host:port[,host:port…]` | `etcd`: leases, revision-ordered hand-off |
//! backend: * [`etcd`]: etcd, one lease per hold, waiters watching their predecessor, revision fences.
//! feature: * `etcd`: the etcd backend (etcd-client, rustls). etcd-client's build runs `protoc`: this repository vendors one (`scripts/protoc`); elsewhere set `PROTOC` or install it.

use std::sync::Arc;

use crate::registry::Driver;

pub(crate) const DRIVER: Driver = Driver {
    name: "etcd",
    feature: Some("etcd"),
    schemes: &["etcd"],
    capabilities: Some(super::INFO.capabilities),
    connect: |url| {
        Box::pin(async move { Ok(Arc::new(super::EtcdBackend::connect_url(url).await?) as _) })
    },
};
