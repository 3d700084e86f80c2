//! The mysql backend's entry in the driver table (`registry.rs`): how `connect` finds it.
//!
//! Its lines of the crate docs, which the build script copies into `lib.rs`
//! (`build/drivers.rs`): rows of the URL table (`url:`) and of `connect`'s (`connect:`), its
//! item in the list of backends (`backend:`, when built) and of cargo features (`feature:`).
//!
//! url: | `mysql://[user[:pass]@]host[:port]/db` (or `mariadb://`) | MySQL / MariaDB lease table (`mysql`) | `mode=lease` (default), `table`, `connect_timeout`, `max_connections`, `check_interval`, `poll_min`, `poll_max`, `ssl-mode`, `ssl-ca`, … |
//! url: | `mysql://…/db?mode=session` | `GET_LOCK` session locks (`mysql`) | as above |
//! connect: | `mysql://user@host/db[?mode=session]`, `mariadb://…` | `mysql`: lease table or `GET_LOCK` |
//! backend: * [`mysql`]: MySQL and MariaDB, as a lease table or `GET_LOCK` session locks.
//! feature: * `mysql`: the MySQL/MariaDB backend (sqlx, rustls).

use std::sync::Arc;

use crate::registry::Driver;

pub(crate) const DRIVER: Driver = Driver {
    name: "mysql",
    feature: Some("mysql"),
    schemes: &["mysql", "mariadb"],
    // The lease table's or the session locks', by `?mode`.
    capabilities: None,
    connect: |url| {
        Box::pin(async move { Ok(Arc::new(super::MysqlBackend::connect_url(url).await?) as _) })
    },
};
