//! The optional ability to look at locks: [`MonitorStore`] (inspect, list, break) and what
//! it answers.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;

#[allow(unused_imports, reason = "for the docs' links")]
use super::{Backend, Capabilities, Lease, LockKind};
use crate::error::Result;
use crate::fence::FencingToken;
use crate::name::{LockName, Owner};

/// What is known about one held lock.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct LockInfo {
    /// The lock's name.
    pub name: String,
    /// The current holder's fencing token.
    pub fence: FencingToken,
    /// Who holds it.
    pub owner: Owner,
    /// When the current holder acquired it (the holder's or the store's clock).
    pub acquired_at: SystemTime,
    /// Lease time left, as the store sees it; `None` when the lease has no TTL (a session).
    pub ttl_left: Option<Duration>,
    /// Hold count (above 1 only for reentrant locks).
    pub holds: u32,
    /// What kind of hold this is; [`HoldKind::Mutex`] unless the store says otherwise.
    pub kind: HoldKind,
    /// How many requests are waiting for this lock, when the store can tell (it keeps a
    /// queue of waiters); `None` when it cannot.
    pub waiters: Option<u32>,
}

impl LockInfo {
    /// Builds a description of a held lock (for backends).
    pub fn new(
        name: String,
        fence: FencingToken,
        owner: Owner,
        acquired_at: SystemTime,
        ttl_left: Option<Duration>,
        holds: u32,
    ) -> LockInfo {
        LockInfo {
            name,
            fence,
            owner,
            acquired_at,
            ttl_left,
            holds,
            kind: HoldKind::Mutex,
            waiters: None,
        }
    }

    /// The same description with another kind of hold (for backends).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use dlock::{FencingToken, HoldKind, LockInfo, Owner};
    ///
    /// let owner = Owner::new(None, "host-a", 42);
    /// let info = LockInfo::new("jobs".into(), FencingToken::new(7), owner, SystemTime::now(), None, 1)
    ///     .with_kind(HoldKind::Reader)
    ///     .with_waiters(3);
    /// assert_eq!(info.kind, HoldKind::Reader);
    /// assert_eq!(info.waiters, Some(3));
    /// ```
    #[must_use]
    pub fn with_kind(mut self, kind: HoldKind) -> LockInfo {
        self.kind = kind;
        self
    }

    /// The same description with the number of waiters the store counted (for backends that
    /// keep a queue); see [`with_kind`](Self::with_kind) for an example.
    #[must_use]
    pub fn with_waiters(mut self, waiters: u32) -> LockInfo {
        self.waiters = Some(waiters);
        self
    }
}

/// The kind of a held lock, as [`LockInfo::kind`] reports it.
///
/// # Examples
///
/// ```
/// assert_eq!(dlock::HoldKind::Writer.as_str(), "writer");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum HoldKind {
    /// An exclusive lock (a mutex, or one lock of a multi-lock).
    #[default]
    Mutex,
    /// Read holds of a read-write lock.
    Reader,
    /// The write hold of a read-write lock.
    Writer,
    /// Permits of a semaphore.
    Permit,
}

impl HoldKind {
    /// The lower-case name used in JSON and metric labels: `mutex`, `reader`, `writer`, `permit`.
    pub const fn as_str(self) -> &'static str {
        match self {
            HoldKind::Mutex => "mutex",
            HoldKind::Reader => "reader",
            HoldKind::Writer => "writer",
            HoldKind::Permit => "permit",
        }
    }
}

impl std::fmt::Display for HoldKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What [`MonitorStore::list_page`] is asked for: held locks whose names start with `prefix`,
/// after `cursor` (the previous page's [`ListPage::cursor`]), at most `limit` of them.
///
/// # Examples
///
/// ```
/// let query = dlock::backend::ListQuery { prefix: "jobs/", cursor: None, limit: 100 };
/// assert_eq!(query.limit, 100);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListQuery<'a> {
    /// Names starting with this.
    pub prefix: &'a str,
    /// Where the previous page ended; `None` for the first page.
    pub cursor: Option<&'a str>,
    /// The most entries this page may hold.
    pub limit: usize,
}

/// One page of [`MonitorStore::list_page`].
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct ListPage {
    /// Held locks on this page.
    pub locks: Vec<LockInfo>,
    /// Opaque cursor for the next page; `None` when this was the last.
    pub cursor: Option<String>,
}

impl ListPage {
    /// A page (for backends).
    pub fn new(locks: Vec<LockInfo>, cursor: Option<String>) -> ListPage {
        ListPage { locks, cursor }
    }
}

/// Optional ability: list, inspect and break locks.
#[async_trait]
pub trait MonitorStore: Send + Sync {
    /// The lock's holder, or `None` when it is free.
    ///
    /// # Errors
    ///
    /// Store failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>>;

    /// Held locks whose names start with `prefix`, at most about `limit` of them, after the
    /// position `cursor` (from the previous page). Iterates in steps (SCAN-style), never all at once.
    ///
    /// # Errors
    ///
    /// Store failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn list_page(&self, query: ListQuery<'_>) -> Result<ListPage>;

    /// Frees the lock whoever holds it; the fence counter is kept, so the next holder still
    /// gets a greater token. Returns whether it was held.
    ///
    /// # Errors
    ///
    /// Store failures.
    ///
    /// # Cancel safety
    ///
    /// A dropped call may or may not have broken the lock.
    async fn force_release(&self, name: &LockName) -> Result<bool>;
}
