//! Distributed locks for Rust, with a fencing token on every hold and a signal when a hold is
//! lost.
//!
//! ```toml
//! [dependencies]
//! dlock = { version = "0.1", features = ["redis"] }  # sqlite and blocking are on by default
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! ```
//!
//! The async API runs on tokio: any runtime with its time driver enabled will do (what
//! `#[tokio::main]` builds; `rt` alone is enough for `flavor = "current_thread"`). The
//! [`blocking`] facade brings its own runtime and needs no tokio in your code.
//!
//! # Connection URLs
//!
//! [`connect`] picks the store by the URL's scheme; passwords in URLs are never printed.
//!
//! | URL | store (cargo feature) | options (`?name=value&…`) |
//! |---|---|---|
#![doc = include_str!(concat!(env!("OUT_DIR"), "/docs_url.md"))]
//!
//! Durations are written like `250ms`, `2s`. Each backend's module documents its URL and
//! options in full; [`default_url`] names the embedded store the `dlock` command uses.
//!
//! # Highlights
//!
//! - One API over many stores, chosen by URL: [`connect`]`("sqlite:///var/lib/app/locks.db")`,
//!   `"memory://"`, `"redis://…"`, `"etcd://…"`, and every other scheme of the table above.
//! - Every acquisition returns a [`FencingToken`] that strictly increases per lock name, so the
//!   protected resource can reject a holder that was paused past its lease.
//! - Every guard carries a lost signal ([`MutexGuard::lost`]) fired when its lease is gone.
//! - Leases are either a fixed TTL or renewed by a watchdog while the guard lives; one keeper
//!   task per client renews them all.
//! - Waiting uses the store's own wake-up; polling with jittered backoff only where there is none.
//! - Beyond the mutex: read-write locks ([`Locks::rwlock`]), counting semaphores with leased
//!   permits ([`Locks::semaphore`]), all-or-nothing multi-locks ([`Locks::multi_lock`]) and
//!   versioned values with atomic compare-and-set ([`Locks::value`]).
//! - Leader election with fenced terms ([`Locks::election`]: campaign, proclaim, resign,
//!   leader, observe), and [`run_while_held`] to run a task only while a hold lasts.
//! - A blocking facade with the same names: [`blocking`].
//!
//! # Quick start
//!
//! ```
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> dlock::Result<()> {
//! let locks = dlock::connect("memory://").await?;
//! let guard = locks
//!     .mutex("orders/42")
//!     .ttl(Duration::from_secs(10))  // without it, a watchdog renews the lease while held
//!     .wait(Duration::from_secs(5))  // or .no_wait(); default: wait until acquired
//!     .acquire()
//!     .await?;
//! let token = guard.fence();         // send it with every write to the resource
//! tokio::select! {
//!     () = guard.lost() => { /* lease lost: stop touching the resource */ }
//!     () = async { let _ = token; /* the work */ } => {}
//! }
//! guard.release().await?;            // dropping the guard releases too
//! # Ok(()) }
//! ```
//!
//! # Leader election and run-under-a-hold
//!
//! [`Locks::election`] elects one leader among the clients that campaign under a name, on
//! every store: the term is the leader's fence, its value is published with the term, and
//! [`run_while_held`] runs a task only while a hold (leadership included) lasts.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> dlock::Result<()> {
//! let locks = dlock::connect("memory://crate-election-doc").await?;
//! let election = locks.election("scheduler");
//! let leading = election.campaign(b"node-a:8080").await?;
//! assert_eq!(election.leader().await?.unwrap().term, leading.term());
//! let served = dlock::run_while_held(&leading, async { "served one round as leader" }).await?;
//! assert_eq!(served, "served one round as leader");
//! leading.resign().await?; // the next campaigner is elected
//! # Ok(()) }
//! ```
//!
//! # Backends
//!
#![doc = include_str!(concat!(env!("OUT_DIR"), "/docs_backend.md"))]
//!
//! # Guarantees
//!
//! A lock is a **lease**: mutual exclusion holds while the lease is valid in the store. A
//! holder that stalls (GC pause, SIGSTOP, swap) can outlive its lease without knowing; that is
//! why every hold has a **fence** — pass it to the resource and let the resource reject lower
//! ones — and a **lost signal**, which fires within one TTL of the loss. Releasing or extending
//! a lock that is no longer owned is [`Error::NotOwned`], never a silent success. Dropping an
//! acquire future or a guard never leaves a lock held beyond its TTL.
//!
//! # Observability
//!
//! dlock logs through `tracing` (acquisitions at `debug`, losses at `warn`), opens spans for
//! acquire, extend and release (`dlock.acquire`, `dlock.extend`, `dlock.release`, with the
//! lock, backend, fence and outcome as fields), and records through the `metrics` facade, so
//! any exporter can pick them up: acquire latency by outcome (`dlock_acquire_seconds`), wait
//! and hold times, held and waiting gauges per backend, losses by reason (`dlock_lost_total`),
//! renewals and renewal errors. [`MutexGuard::lost_reason`] says why a lock was lost. Every
//! name, label and span is in one table: `OBSERVABILITY.md` in the repository.
//!
//! # Feature flags
//!
//! * `blocking` (default): [`blocking`], the synchronous facade.
#![doc = include_str!(concat!(env!("OUT_DIR"), "/docs_feature.md"))]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backend;
pub mod coordination;
pub mod election;
mod error;
mod fence;
mod hold;
mod lease;
pub mod limits;
mod locks;
mod mutex;
mod name;
mod primitives;
mod registry;
mod ttl;
mod value;

#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub mod etcd;
#[cfg(feature = "file")]
#[cfg_attr(docsrs, doc(cfg(feature = "file")))]
pub mod file;
pub mod memory;
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub mod mysql;
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub mod nats;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redlock;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod sql_common;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;
#[cfg(feature = "zookeeper")]
#[cfg_attr(docsrs, doc(cfg(feature = "zookeeper")))]
pub mod zookeeper;

#[cfg(feature = "blocking")]
#[cfg_attr(docsrs, doc(cfg(feature = "blocking")))]
pub mod blocking;

pub use backend::{HoldKind, LockInfo, Versioned};
pub use coordination::{Barrier, BarrierGuard, CountDownLatch, Counter, DoubleBarrier, Inside};
pub use election::{Election, Leader, Leadership};
pub use error::{BoxError, Error, Result, redact_url};
pub use fence::FencingToken;
pub use hold::{Hold, run_while_held};
pub use lease::Lost;
pub use lease::keeper::LostReason;
pub use locks::Locks;
pub use mutex::{MutexBuilder, MutexGuard};
pub use name::{LockName, Owner};
pub use primitives::{
    ComposedPart, MultiGuard, MultiLockBuilder, Permit, ReadGuard, RwLockBuilder, SemaphoreBuilder,
    WriteGuard,
};
pub use registry::{enabled_backends, enabled_schemes};
pub use value::VersionedValue;

/// The owned lost signal returned by `lost_token()` on every guard (tokio-util's
/// `CancellationToken`, re-exported so it can be named without depending on tokio-util).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::connect("memory://token-doc").await?;
/// let guard = locks.mutex("a").acquire().await?;
/// let lost: dlock::CancellationToken = guard.lost_token();
/// assert!(!lost.is_cancelled());
/// # Ok(()) }
/// ```
pub use tokio_util::sync::CancellationToken;

/// The stream of held locks returned by [`Locks::list`], nameable without depending on
/// `futures`.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// use futures::TryStreamExt;
/// let locks = dlock::connect("memory://stream-doc").await?;
/// let held: dlock::LockStream = locks.list("");
/// assert!(held.try_collect::<Vec<_>>().await?.is_empty());
/// # Ok(()) }
/// ```
pub type LockStream = futures::stream::BoxStream<'static, Result<LockInfo>>;

/// The embedded default store's URL, the one the `dlock` command uses without `--url` or
/// `DLOCK_URL`: a SQLite file `dlock/locks.db` in the user's state directory (the local data
/// directory where there is none), created with its directory on first use. Programs that
/// share locks with the command use the same file.
///
/// As a last resort (no home directory) it is `dlock-UID/locks.db` in the temp directory,
/// made private to the user; since anyone can create there, connecting refuses that
/// directory or file when another user owns it or others may write it.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let url = dlock::default_url();
/// assert!(url.starts_with("sqlite://"));
/// let locks = dlock::connect(&url).await?;
/// # drop(locks);
/// # Ok(()) }
/// ```
#[cfg(feature = "sqlite")]
pub fn default_url() -> String {
    let path = dirs::state_dir()
        .or_else(dirs::data_local_dir)
        .map_or_else(sqlite::temp_store_dir, |base| base.join("dlock"))
        .join("locks.db");
    format!("sqlite://{}?create_dirs=true", path.display())
}

/// Connects to the lock store named by `url` and returns a cheap-to-clone client.
///
/// | URL | backend |
/// |---|---|
#[doc = include_str!(concat!(env!("OUT_DIR"), "/docs_connect.md"))]
///
/// [`enabled_schemes`] lists the schemes of this build (each backend is behind its cargo
/// feature, in parentheses in the crate docs' table).
///
/// # Errors
///
/// [`Error::InvalidUrl`] for an unknown scheme, a scheme whose cargo feature is off, or bad
/// options; the backend's own errors for a store that cannot be opened (see each backend).
///
/// # Cancel safety
///
/// Cancel safe.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::connect("memory://").await?;
/// assert!(matches!(
///     dlock::connect("carrier-pigeon://coop").await,
///     Err(dlock::Error::InvalidUrl { .. })
/// ));
/// # Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<Locks> {
    Locks::connect(url).await
}
