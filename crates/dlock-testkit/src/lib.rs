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
pub mod require;
pub mod server;
pub mod tls;

// The build script's reader of the `ServerKind` impls, checked against the fixture table.
#[cfg(test)]
#[path = "../../dlock/build/servers.rs"]
mod build_servers;

pub use fixture::{
    FileFixture, Fixture, MemoryFixture, MinimalFixture, MysqlFixture, PostgresFixture, SqlMode,
    SqliteFixture,
};
