//! Test kit for dlock: the real-server harness, the fixtures, the conformance suite every
//! backend must pass, and helpers to drive the `dlock` CLI as a cross-process lock taker.
//!
//! NB: this crate is for dlock's own tests and for third-party backends that want to prove
//! themselves against the same suite. It is not a stable part of dlock's API: breaking changes
//! may come in any release.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod bounded;
pub mod checker;
pub mod cli;
pub mod conformance;
pub mod fault_proxy;
pub mod faults;
pub mod fixture;
pub mod read_after_write;
pub mod require;
pub mod server;
pub mod tls;

pub use fixture::{
    FileFixture, Fixture, MemoryFixture, MinimalFixture, MysqlFixture, PostgresFixture, SqlMode,
    SqliteFixture,
};

// The build script's readers, which it cannot test itself: of the `ServerKind` impls, checked
// against the fixture table, and of the driver table.
#[cfg(test)]
#[path = "../../dlock/build/drivers.rs"]
#[allow(dead_code)]
mod build_drivers;
#[cfg(test)]
#[path = "../../dlock/build/servers.rs"]
mod build_servers;

#[cfg(test)]
mod build_script_tests {
    /// The driver table's order is the `full` feature's, read from the manifest as the
    /// repository writes it (one line) and as `cargo package` does (one name a line), so the
    /// published crate lists its backends in the same order.
    #[test]
    fn the_full_feature_is_read_from_either_manifest_layout() {
        let one_line = "[features]\nfull = [\"sqlite\", \"redis\", \"etcd\"]\nx = []\n";
        let packaged = "[features]\nfull = [\n    \"sqlite\",\n    \"redis\",\n    \"etcd\",\n]\nx = [\n    \"y\",\n]\n";
        for manifest in [one_line, packaged] {
            assert_eq!(
                crate::build_drivers::full_features(manifest),
                ["sqlite", "redis", "etcd"],
                "{manifest}"
            );
        }
    }
}
