//! Leader election on the lock layer, on every store: leadership is the hold of the election's
//! mutex (fair where the store queues fairly, handed off by the store's wake-ups as every lock
//! is), the term is that hold's fence, and the leader's value is a versioned value kept beside
//! the lock (`record.rs`). [`Leadership`] (`leadership.rs`) is the leader's guard; `observe.rs`
//! follows the leader.

mod leadership;
mod observe;
mod record;

use std::future::Future;
use std::time::{Duration, SystemTime};

use crate::backend::{MonitorStore, ValueStore};
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::locks::Locks;
use crate::mutex::MutexBuilder;
use crate::name::{LockName, Owner};

pub use leadership::Leadership;
pub use observe::LeaderStream;
pub use record::MAX_ELECTION_VALUE_LEN;

/// An election among the clients that campaign under one name; made by
/// [`Locks::election`]. Cheap to clone; nothing is contacted until a method is awaited.
///
/// Modelled on etcd's `concurrency.Election` and Curator's `LeaderLatch`, built on the lock
/// layer so it works on every store:
///
/// - **Leadership** is the hold of the mutex named like the election: one leader at a time
///   while its lease lasts, waiters queued fairly where the store has fair queues, woken by
///   the store when the leader goes.
/// - **The term** is that hold's fence ([`Leadership::term`]): strictly greater for every
///   later leader, so a resource can refuse a deposed leader's writes.
/// - **The value** each leader publishes ([`campaign`](Self::campaign),
///   [`Leadership::proclaim`]) is a versioned value named `<election>#leader`, written by
///   compare-and-set with the term inside: a record is trusted only while its term is the
///   current holder's fence, so [`leader`](Self::leader) never reports a value of a leader
///   that already lost.
///
/// # What each store supports
///
/// Campaigning works on every store. Publishing a non-empty value needs versioned values
/// (not Redlock): elsewhere [`campaign`](Self::campaign) with a value, and
/// [`proclaim`](Leadership::proclaim), return [`Error::Unsupported`]. [`leader`](Self::leader)
/// and [`observe`](Self::observe) need inspection (not the MySQL/MariaDB session mode) and
/// return [`Error::Unsupported`] without it.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::connect("memory://election-doc").await?;
/// let election = locks.election("scheduler");
/// let leading = election.campaign(b"node-a:8080").await?;
/// let now = election.leader().await?.expect("a leader");
/// assert_eq!(now.value, b"node-a:8080");
/// assert_eq!(now.term, leading.term());
/// leading.resign().await?;
/// assert!(election.leader().await?.is_none());
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Election {
    locks: Locks,
    name: String,
    ttl: Option<Duration>,
    wait: Option<Duration>,
    poll: Option<Duration>,
}

/// Who leads an election now, as [`Election::leader`] and [`Election::observe`] report it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leader's term: its hold's fence, strictly greater than every earlier leader's.
    pub term: FencingToken,
    /// The value the leader published last (empty on stores without versioned values).
    pub value: Vec<u8>,
    /// Who leads (host, pid, label).
    pub owner: Owner,
    /// When the leader's term began (the holder's or the store's clock).
    pub since: SystemTime,
    /// The leader's lease time left, as the store sees it; `None` for a session.
    pub ttl_left: Option<Duration>,
}

impl Election {
    pub(crate) fn new(locks: Locks, name: String) -> Election {
        Election {
            locks,
            name,
            ttl: None,
            wait: None,
            poll: None,
        }
    }

    /// The election's name (also the name of the lock a leader holds).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Leaders hold with a fixed lease of `ttl` (see [`MutexBuilder::ttl`]) instead of the
    /// client's watchdog lease; the term then ends when it runs out unless extended.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// [`campaign`](Self::campaign) waits at most `wait` (default: until elected), then
    /// returns [`Error::Timeout`].
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// How often [`observe`](Self::observe) asks the store (default: a third of the client's
    /// watchdog lease, at most one second). A change is seen within this interval.
    pub fn observe_interval(mut self, every: Duration) -> Self {
        self.poll = Some(every);
        self
    }

    fn lock_name(&self) -> Result<LockName> {
        LockName::new(self.name.as_str())
    }

    fn values(&self) -> Option<&dyn ValueStore> {
        let caps = self.locks.info().capabilities;
        caps.values.then(|| self.locks.backend().values()).flatten()
    }

    fn monitor(&self) -> Result<&dyn MonitorStore> {
        let caps = self.locks.info().capabilities;
        caps.monitor
            .then(|| self.locks.backend().monitor())
            .flatten()
            .ok_or(Error::Unsupported {
                operation: "election leader and observe (they need inspection)",
                backend: self.locks.info().name,
            })
    }

    fn mutex(&self) -> MutexBuilder {
        let mut builder = self.locks.mutex(self.name.as_str());
        if self.locks.info().capabilities.fair {
            builder = builder.fair();
        }
        if let Some(ttl) = self.ttl {
            builder = builder.ttl(ttl);
        }
        match self.wait {
            Some(wait) => builder.wait(wait),
            None => builder.wait_forever(),
        }
    }

    /// Waits to lead, then publishes `value` with the new term and returns the leader's guard.
    /// Dropping the guard (or [`resign`](Leadership::resign)) hands leadership to the next
    /// campaigner.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidName`] / [`Error::InvalidArgument`] (a value over
    ///   [`MAX_ELECTION_VALUE_LEN`], a bad TTL or wait) before any store call;
    /// - [`Error::Unsupported`] for a non-empty value on a store without versioned values;
    /// - [`Error::Timeout`] when [`wait`](Self::wait) runs out;
    /// - [`Error::NotOwned`] when the new term was lost before its value was written (the
    ///   hold is released); store errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a campaign dropped while it waits leaves nothing queued, and one dropped
    /// once elected releases the hold (as a dropped guard does). The future owns what it
    /// needs (`'static`), so it can be spawned.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// use std::time::Duration;
    /// let locks = dlock::connect("memory://campaign-doc").await?;
    /// let first = locks.election("jobs").campaign(b"a").await?;
    /// let first_term = first.term();
    /// let late = locks.election("jobs").wait(Duration::from_millis(50)).campaign(b"b").await;
    /// assert!(matches!(late, Err(dlock::Error::Timeout { .. })));
    /// first.resign().await?;
    /// let second = locks.election("jobs").campaign(b"b").await?;
    /// assert!(second.term() > first_term);
    /// # Ok(()) }
    /// ```
    pub fn campaign(
        &self,
        value: impl AsRef<[u8]>,
    ) -> impl Future<Output = Result<Leadership>> + Send + 'static {
        // Owned, as every acquire future is: a campaign can be spawned.
        let election = self.clone();
        let value = value.as_ref().to_vec();
        async move { election.elect(&value).await }
    }

    async fn elect(&self, value: &[u8]) -> Result<Leadership> {
        let name = self.lock_name()?;
        let key = record::record_name(&name)?;
        record::check_value(value)?;
        let values = self.values();
        if values.is_none() && !value.is_empty() {
            return Err(Error::Unsupported {
                operation: "publishing an election value (it needs versioned values)",
                backend: self.locks.info().name,
            });
        }
        let guard = self.mutex().acquire().await?;
        if let Some(values) = values {
            let backend = self.locks.info().name;
            let publish = record::publish(values, &key, backend, guard.fence(), value, || {
                std::future::ready(Ok(!guard.is_lost()))
            });
            // A failed publish drops the guard, which gives the term back at once.
            publish.await?;
        }
        Ok(Leadership::new(self.clone(), guard, key, value.to_vec()))
    }

    /// Who leads now: the holder of the election's lock, with the value it published in its
    /// term; `None` when nobody leads (or the new leader has not yet published, an instant
    /// inside its [`campaign`](Self::campaign)).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`]; [`Error::Unsupported`] on a store without inspection; store
    /// errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://leader-doc").await?;
    /// let election = locks.election("db-primary");
    /// assert!(election.leader().await?.is_none());
    /// let leading = election.campaign(b"10.0.0.7").await?;
    /// leading.proclaim(b"10.0.0.8").await?;
    /// assert_eq!(election.leader().await?.unwrap().value, b"10.0.0.8");
    /// # Ok(()) }
    /// ```
    pub async fn leader(&self) -> Result<Option<Leader>> {
        let name = self.lock_name()?;
        let key = record::record_name(&name)?;
        let monitor = self.monitor()?;
        let Some(values) = self.values() else {
            return Ok(monitor
                .inspect(&name)
                .await?
                .map(|info| Leader::of(info, Vec::new())));
        };
        let backend = self.locks.info().name;
        // The record first, then the holder: a leader reported was holding at the last read.
        let before = record::read(values, &key, backend).await?;
        let Some(info) = monitor.inspect(&name).await? else {
            return Ok(None);
        };
        let record = match before {
            Some(record) if record.term == info.fence => Some(record),
            // A new leader may have published between the two reads: read once more.
            _ => record::read(values, &key, backend)
                .await?
                .filter(|record| record.term == info.fence),
        };
        Ok(record.map(|record| Leader::of(info, record.value)))
    }

    /// The leader's changes as a stream: the current leader first (`None` when there is
    /// none), then each change of leader, term or value. See [`LeaderStream`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// use futures::StreamExt;
    /// let locks = dlock::connect("memory://observe-doc").await?;
    /// let election = locks.election("shard-7");
    /// let mut changes = election.observe();
    /// assert!(changes.next().await.unwrap()?.is_none());
    /// let leading = election.campaign(b"a").await?;
    /// let seen = changes.next().await.unwrap()?.expect("a leader");
    /// assert_eq!((seen.term, seen.value.as_slice()), (leading.term(), &b"a"[..]));
    /// # Ok(()) }
    /// ```
    pub fn observe(&self) -> LeaderStream {
        observe::observe(self.clone())
    }

    fn observe_every(&self) -> Duration {
        self.poll
            .unwrap_or_else(|| (self.locks.watchdog_lease() / 3).min(Duration::from_secs(1)))
    }
}

impl Leader {
    fn of(info: crate::LockInfo, value: Vec<u8>) -> Leader {
        Leader {
            term: info.fence,
            value,
            owner: info.owner,
            since: info.acquired_at,
            ttl_left: info.ttl_left,
        }
    }
}
