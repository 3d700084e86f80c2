//! The sqlite backend's entry in the driver table (`registry.rs`): how `connect` finds it.
//!
//! Its lines of the crate docs, which the build script copies into `lib.rs`
//! (`build/drivers.rs`): rows of the URL table (`url:`) and of `connect`'s (`connect:`), its
//! item in the list of backends (`backend:`, when built) and of cargo features (`feature:`).
//!
//! url: | `sqlite:///abs/locks.db`, `sqlite://rel/locks.db` | one file shared by the processes of a machine (`sqlite`, default) | `busy_timeout`, `poll_min`, `poll_max`, `create_dirs` |
//! connect: | `sqlite:///abs/path.db`, `sqlite://rel/path.db` | `sqlite`: processes of one machine |
//! backend: * [`sqlite`]: the embedded default, one file shared by the processes of a machine.
//! feature: * `sqlite` (default): the SQLite backend (bundled SQLite, no system library).

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
