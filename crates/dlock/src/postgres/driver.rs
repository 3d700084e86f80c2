//! The postgres backend's entry in the driver table (`registry.rs`): how `connect` finds it.
//!
//! Its lines of the crate docs, which the build script copies into `lib.rs`
//! (`build/drivers.rs`): rows of the URL table (`url:`) and of `connect`'s (`connect:`), its
//! item in the list of backends (`backend:`, when built) and of cargo features (`feature:`).
//!
//! url: | `postgres://[user[:pass]@]host[:port]/db` (or `postgresql://`) | PostgreSQL lease table (`postgres`) | `mode=lease` (default), `table`, `connect_timeout`, `max_connections`, `check_interval`, `sslmode`, `sslrootcert`, … |
//! url: | `postgres://…/db?mode=session` | PostgreSQL advisory (session) locks (`postgres`) | as above |
//! connect: | `postgres://user@host/db[?mode=session]`, `postgresql://…` | `postgres`: lease table or advisory locks |
//! backend: * [`postgres`]: PostgreSQL, as a lease table (LISTEN/NOTIFY wake-ups) or advisory locks.
//! feature: * `postgres`: the PostgreSQL backend (sqlx, rustls).

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
