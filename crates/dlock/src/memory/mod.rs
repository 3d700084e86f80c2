#![doc = include_str!("docs.md")]

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::{
    AcquireRequest, Backend, BackendInfo, Capabilities, Expect, Lease, ListPage, LockInfo,
    MonitorStore, ValueStore, Versioned,
};
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::name::{LockName, Owner};
use crate::wait::{Attempt, STARVATION_THRESHOLD, acquire_loop};

/// URL schemes served by this backend: `memory://` (the process-wide store) and
/// `memory://NAME` (a separate process-wide store per name).
pub const MEMORY_SCHEMES: &[&str] = &["memory"];

const INFO: BackendInfo = BackendInfo::new(
    "memory",
    Capabilities {
        reentrant: true,
        fair: true,
        native_wait: true,
        native_loss_signal: true,
        cross_process: false,
        monitor: true,
        values: true,
        permits: false,
        rwlock: false,
    },
);

/// Options of the memory backend.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
#[serde(default)]
pub struct MemoryConfig {
    /// Share the process-wide store of this name (what `memory://NAME` does); `None` makes a
    /// private store. Default: `None`.
    pub name: Option<String>,
}

/// Builds a [`MemoryBackend`].
///
/// # Examples
///
/// ```
/// use dlock::memory::MemoryBuilder;
/// let a = MemoryBuilder::new().name("tests").build();
/// let b = MemoryBuilder::new().name("tests").build();
/// // Same name, same store.
/// assert!(a.same_store(&b));
/// ```
#[derive(Clone, Debug, Default)]
pub struct MemoryBuilder {
    config: MemoryConfig,
}

impl MemoryBuilder {
    /// A builder with default options.
    pub fn new() -> MemoryBuilder {
        MemoryBuilder::default()
    }

    /// A builder from a config.
    pub fn from_config(config: MemoryConfig) -> MemoryBuilder {
        MemoryBuilder { config }
    }

    /// Use the process-wide store named `name`.
    pub fn name(mut self, name: impl Into<String>) -> MemoryBuilder {
        self.config.name = Some(name.into());
        self
    }

    /// The backend.
    pub fn build(self) -> MemoryBackend {
        match self.config.name {
            None => MemoryBackend::new(),
            Some(name) => {
                static NAMED: OnceLock<Mutex<HashMap<String, MemoryBackend>>> = OnceLock::new();
                let mut named = NAMED
                    .get_or_init(Default::default)
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                named.entry(name).or_default().clone()
            }
        }
    }
}

/// Locks kept in this process's memory: the reference backend, and the right choice when
/// every contender is a task of one process.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::Locks::new(dlock::memory::MemoryBackend::new());
/// let guard = locks.mutex("x").acquire().await?;
/// assert_eq!(guard.fence().get(), 1);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct MemoryBackend {
    store: Arc<Store>,
}

impl MemoryBackend {
    /// A new private store.
    pub fn new() -> MemoryBackend {
        MemoryBackend::default()
    }

    /// Whether two backends share one store.
    pub fn same_store(&self, other: &MemoryBackend) -> bool {
        Arc::ptr_eq(&self.store, &other.store)
    }

    pub(crate) fn from_url(url: &str) -> MemoryBackend {
        let name = url.strip_prefix("memory://").unwrap_or_default();
        MemoryBuilder::new().name(name).build()
    }
}

#[derive(Debug, Default)]
struct Store {
    slots: Mutex<HashMap<String, Slot>>,
    /// Versioned values: name → (version, bytes).
    values: Mutex<HashMap<String, (u64, Vec<u8>)>>,
}

/// One name's state. Slots are never removed, so the fence counter never goes backwards.
#[derive(Debug)]
struct Slot {
    fence: u64,
    holder: Option<Holder>,
    /// Waiters by arrival: fair locks serve them in order, unfair ones once the head starves.
    queue: VecDeque<(String, Instant)>,
    changed: watch::Sender<()>,
}

#[derive(Debug)]
struct Holder {
    token: String,
    fence: u64,
    holds: u32,
    expires_at: Instant,
    acquired_at: SystemTime,
    owner: Owner,
    /// Parent of every lease's lost token for this hold: cancelled on break or takeover.
    lost: CancellationToken,
}

impl Holder {
    fn is_live(&self, now: Instant) -> bool {
        self.expires_at > now
    }
}

impl Slot {
    fn new() -> Slot {
        Slot {
            fence: 0,
            holder: None,
            queue: VecDeque::new(),
            changed: watch::Sender::new(()),
        }
    }

    /// Clears an expired holder, firing its lost signal.
    fn expire(&mut self, now: Instant) {
        if self.holder.as_ref().is_some_and(|h| !h.is_live(now))
            && let Some(holder) = self.holder.take()
        {
            holder.lost.cancel();
        }
    }

    /// Whether a queued waiter other than `token` comes first.
    fn waiter_first(&self, token: &str, fair: bool, now: Instant) -> bool {
        self.queue.front().is_some_and(|(head, since)| {
            head != token && (fair || now - *since >= STARVATION_THRESHOLD)
        })
    }

    fn enqueue(&mut self, token: &str, now: Instant) {
        if !self.queue.iter().any(|(t, _)| t == token) {
            self.queue.push_back((token.to_owned(), now));
        }
    }

    fn leave_queue(&mut self, token: &str) {
        let before = self.queue.len();
        self.queue.retain(|(t, _)| t != token);
        if self.queue.len() != before {
            // Whoever queued behind may be next now.
            self.changed.send_replace(());
        }
    }

    fn owned_by(&mut self, token: &str, fence: u64, now: Instant) -> Option<&mut Holder> {
        self.expire(now);
        self.holder
            .as_mut()
            .filter(|h| h.token == token && h.fence == fence)
    }
}

impl Store {
    fn slots(&self) -> MutexGuard<'_, HashMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn subscribe(&self, name: &str) -> watch::Receiver<()> {
        self.slots()
            .entry(name.to_owned())
            .or_insert_with(Slot::new)
            .changed
            .subscribe()
    }

    fn try_once(self: &Arc<Self>, req: &AcquireRequest) -> Result<Attempt> {
        let mut slots = self.slots();
        let slot = slots
            .entry(req.name.as_str().to_owned())
            .or_insert_with(Slot::new);
        let now = Instant::now();
        slot.expire(now);
        // Locks validates TTLs; a raw `Backend` caller may not have.
        let Some(expires_at) = now.checked_add(req.ttl) else {
            return Err(Error::invalid_argument("ttl", "overflows the clock"));
        };
        let waits = req.wait != crate::Wait::No;
        if slot.holder.is_none() && slot.waiter_first(&req.token, req.fair, now) {
            if waits {
                slot.enqueue(&req.token, now);
            }
            return Ok(Attempt::Busy { free_in: None });
        }
        let lost_parent = match &mut slot.holder {
            None => {
                slot.queue.retain(|(t, _)| *t != req.token);
                slot.fence += 1;
                let lost = CancellationToken::new();
                slot.holder = Some(Holder {
                    token: req.token.clone(),
                    fence: slot.fence,
                    holds: 1,
                    expires_at,
                    acquired_at: SystemTime::now(),
                    owner: req.owner.clone(),
                    lost: lost.clone(),
                });
                lost
            }
            // Our own token: a re-entry counts a hold; a repeated attempt takes its grant.
            Some(holder) if holder.token == req.token => {
                holder.holds += u32::from(req.reentrant);
                holder.expires_at = holder.expires_at.max(expires_at);
                holder.lost.clone()
            }
            Some(holder) => {
                let free_in = Some(holder.expires_at - now);
                if waits {
                    slot.enqueue(&req.token, now);
                }
                return Ok(Attempt::Busy { free_in });
            }
        };
        Ok(Attempt::Acquired(Arc::new(MemoryLease {
            store: self.clone(),
            name: req.name.as_str().to_owned(),
            token: req.token.clone(),
            fence: slot.fence,
            lost: lost_parent.child_token(),
            start: now,
        })))
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    fn info(&self) -> &BackendInfo {
        &INFO
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Arc<dyn Lease>>> {
        let store = &self.store;
        // However this call ends (timeout, or the future dropped), leave the queue.
        let mut leave = LeaveQueue {
            store,
            req,
            armed: req.wait != crate::Wait::No,
        };
        let acquired = acquire_loop(
            req.wait,
            None,
            || std::future::ready(store.try_once(req)),
            || {
                let mut changed = store.subscribe(req.name.as_str());
                async move {
                    // An error means the sender is gone, which cannot happen while the slot
                    // lives; either way, retrying the attempt is the right move.
                    let _ = changed.changed().await;
                }
            },
        )
        .await;
        // A grant already took it out of the queue; only a waiter that gave up must leave.
        leave.armed &= !matches!(acquired, Ok(Some(_)));
        acquired
    }

    fn monitor(&self) -> Option<&dyn MonitorStore> {
        Some(self)
    }

    fn values(&self) -> Option<&dyn ValueStore> {
        Some(self)
    }
}

#[async_trait]
impl ValueStore for MemoryBackend {
    async fn get(&self, name: &LockName) -> Result<Option<Versioned>> {
        let values = self
            .store
            .values
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(values
            .get(name.as_str())
            .map(|(version, value)| Versioned::new(value.clone(), *version)))
    }

    async fn put(&self, name: &LockName, expect: Expect, value: &[u8]) -> Result<Option<u64>> {
        let mut values = self
            .store
            .values
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let current = values.get(name.as_str()).map(|(version, _)| *version);
        if !expect.holds(current) {
            return Ok(None);
        }
        let version = current.unwrap_or(0) + 1;
        values.insert(name.as_str().to_owned(), (version, value.to_vec()));
        Ok(Some(version))
    }
}

struct LeaveQueue<'a> {
    store: &'a Arc<Store>,
    req: &'a AcquireRequest,
    armed: bool,
}

impl Drop for LeaveQueue<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Some(slot) = self.store.slots().get_mut(self.req.name.as_str()) {
            slot.leave_queue(&self.req.token);
        }
    }
}

#[async_trait]
impl MonitorStore for MemoryBackend {
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let mut slots = self.store.slots();
        let now = Instant::now();
        Ok(slots.get_mut(name.as_str()).and_then(|slot| {
            slot.expire(now);
            slot.holder.as_ref().map(|h| info(name.as_str(), h, now))
        }))
    }

    async fn list_page(
        &self,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<ListPage> {
        let mut slots = self.store.slots();
        let now = Instant::now();
        let mut names: Vec<&String> = slots
            .iter()
            .filter(|(name, slot)| {
                name.starts_with(prefix)
                    && cursor.is_none_or(|c| name.as_str() > c)
                    && slot.holder.as_ref().is_some_and(|h| h.is_live(now))
            })
            .map(|(name, _)| name)
            .collect();
        names.sort();
        let more = names.len() > limit;
        names.truncate(limit);
        let names: Vec<String> = names.into_iter().cloned().collect();
        let locks = names
            .iter()
            .filter_map(|name| {
                let slot = slots.get_mut(name)?;
                slot.holder.as_ref().map(|h| info(name, h, now))
            })
            .collect();
        let cursor = if more { names.last().cloned() } else { None };
        Ok(ListPage::new(locks, cursor))
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let mut slots = self.store.slots();
        let Some(slot) = slots.get_mut(name.as_str()) else {
            return Ok(false);
        };
        slot.expire(Instant::now());
        match slot.holder.take() {
            Some(holder) => {
                holder.lost.cancel();
                slot.changed.send_replace(());
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

fn info(name: &str, holder: &Holder, now: Instant) -> LockInfo {
    LockInfo::new(
        name.to_owned(),
        FencingToken::new(holder.fence),
        holder.owner.clone(),
        holder.acquired_at,
        Some(holder.expires_at.saturating_duration_since(now)),
        holder.holds,
    )
}

/// One hold of a memory lock.
#[derive(Debug)]
struct MemoryLease {
    store: Arc<Store>,
    name: String,
    token: String,
    fence: u64,
    lost: CancellationToken,
    start: Instant,
}

#[async_trait]
impl Lease for MemoryLease {
    fn fence(&self) -> FencingToken {
        FencingToken::new(self.fence)
    }

    fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    fn lease_start(&self) -> Instant {
        self.start
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        let mut slots = self.store.slots();
        let now = Instant::now();
        let holder = slots
            .get_mut(&self.name)
            .and_then(|slot| slot.owned_by(&self.token, self.fence, now))
            .ok_or_else(|| Error::not_owned(&self.name))?;
        let extended = now
            .checked_add(ttl)
            .ok_or_else(|| Error::invalid_argument("ttl", "overflows the clock"))?;
        holder.expires_at = holder.expires_at.max(extended);
        Ok(())
    }

    async fn release(&self) -> Result<()> {
        let mut slots = self.store.slots();
        let now = Instant::now();
        let slot = slots
            .get_mut(&self.name)
            .ok_or_else(|| Error::not_owned(&self.name))?;
        let holder = slot
            .owned_by(&self.token, self.fence, now)
            .ok_or_else(|| Error::not_owned(&self.name))?;
        holder.holds -= 1;
        if holder.holds == 0 {
            slot.holder = None;
            slot.changed.send_replace(());
        }
        Ok(())
    }
}
