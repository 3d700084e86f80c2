#![doc = include_str!("docs.md")]

pub(crate) mod driver;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::wait::{Attempt, STARVATION_THRESHOLD, acquire_loop};
use crate::backend::{
    AcquireRequest, Backend, BackendInfo, Capabilities, Expect, Lease, LeaseCore, ListPage,
    ListQuery, LockInfo, LossSignal, MonitorStore, StoreLease, ValueStore, Versioned,
};
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::lease::keeper::LostReason;
use crate::name::{LockName, Owner};

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
        list: true,
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
    slots: Mutex<Slots>,
    /// Versioned values: name → (version, bytes).
    values: Mutex<HashMap<String, (u64, Vec<u8>)>>,
}

/// One hold of a memory lock.
type MemoryLease = StoreLease<Store>;

/// A queued waiter whose attempts stopped for this long is gone (its future was forgotten, or
/// its task stalled): it no longer holds anyone back, and its place is removed. A waiting
/// acquire tries again at least once a second, which refreshes its place.
const WAITER_STALE: Duration = Duration::from_secs(3);

/// Every name's state, and what keeps it bounded: a slot exists only while its lock is held
/// or waited for, and fences come from one counter for the store, so a name's next fence is
/// higher than its last even after its slot was dropped.
#[derive(Debug, Default)]
struct Slots {
    map: HashMap<String, Slot>,
    /// The last fence given out, by any name.
    last_fence: u64,
    /// When to look at a slot again (its lease's end, its oldest waiter going stale), earliest
    /// first. An entry that no longer matches its slot's `check_at` was superseded.
    checks: BinaryHeap<Reverse<(Instant, String)>>,
}

impl Deref for Slots {
    type Target = HashMap<String, Slot>;

    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl DerefMut for Slots {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.map
    }
}

impl Slots {
    /// Ends the leases and waiter places that are over, and drops the slots left empty: run
    /// by every operation, so each check is paid for once.
    fn sweep(&mut self, now: Instant) {
        while let Some(Reverse((at, _))) = self.checks.peek()
            && *at <= now
        {
            let Some(Reverse((at, name))) = self.checks.pop() else {
                break;
            };
            let Some(slot) = self.map.get_mut(&name) else {
                continue;
            };
            if slot.check_at != Some(at) {
                continue;
            }
            slot.check_at = None;
            slot.expire(now);
            slot.drop_stale_waiters(now);
            self.settle(&name);
        }
    }

    /// Drops `name`'s slot if nothing is left in it, or else schedules its next check.
    fn settle(&mut self, name: &str) {
        let Some(slot) = self.map.get_mut(name) else {
            return;
        };
        if slot.holder.is_none() && slot.queue.is_empty() {
            // Waiters subscribed to it wake (their channel closed) and look again.
            self.map.remove(name);
            return;
        }
        let next = slot
            .holder
            .iter()
            .map(|h| h.expires_at)
            .chain(slot.queue.iter().map(|w| w.seen + WAITER_STALE))
            .min();
        if let Some(at) = next
            && slot.check_at.is_none_or(|c| at < c)
        {
            slot.check_at = Some(at);
            self.checks.push(Reverse((at, name.to_owned())));
        }
    }
}

/// One name's state while its lock is held or waited for.
#[derive(Debug)]
struct Slot {
    holder: Option<Holder>,
    /// Waiters by arrival: fair locks serve them in order, unfair ones once the head starves.
    queue: VecDeque<Waiter>,
    changed: watch::Sender<()>,
    /// The pending check of this slot in [`Slots::checks`], if any.
    check_at: Option<Instant>,
}

#[derive(Debug)]
struct Waiter {
    token: String,
    /// Arrival: the queue's order.
    since: Instant,
    /// The waiter's last attempt.
    seen: Instant,
}

#[derive(Debug)]
struct Holder {
    token: String,
    fence: u64,
    holds: u32,
    expires_at: Instant,
    acquired_at: SystemTime,
    owner: Owner,
    /// Parent of every lease's loss signal for this hold: fired on expiry or break.
    lost: LossSignal,
}

impl Holder {
    fn is_live(&self, now: Instant) -> bool {
        self.expires_at > now
    }
}

impl Slot {
    fn new() -> Slot {
        Slot {
            holder: None,
            queue: VecDeque::new(),
            changed: watch::Sender::new(()),
            check_at: None,
        }
    }

    /// Clears an expired holder, firing its lost signal.
    fn expire(&mut self, now: Instant) {
        if self.holder.as_ref().is_some_and(|h| !h.is_live(now))
            && let Some(holder) = self.holder.take()
        {
            holder.lost.fire(LostReason::Expired);
        }
    }

    /// Whether a queued waiter other than `token` comes first.
    fn waiter_first(&self, token: &str, fair: bool, now: Instant) -> bool {
        self.queue
            .front()
            .is_some_and(|w| w.token != token && (fair || now - w.since >= STARVATION_THRESHOLD))
    }

    /// Queues `token`, or refreshes its place.
    fn enqueue(&mut self, token: &str, now: Instant) {
        match self.queue.iter_mut().find(|w| w.token == token) {
            Some(waiter) => waiter.seen = now,
            None => self.queue.push_back(Waiter {
                token: token.to_owned(),
                since: now,
                seen: now,
            }),
        }
    }

    /// Removes waiters gone stale; whoever queued behind them may be next now.
    fn drop_stale_waiters(&mut self, now: Instant) {
        let before = self.queue.len();
        self.queue.retain(|w| now - w.seen < WAITER_STALE);
        if self.queue.len() != before {
            self.changed.send_replace(());
        }
    }

    fn leave_queue(&mut self, token: &str) {
        let before = self.queue.len();
        self.queue.retain(|w| w.token != token);
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
    /// The slots, with every lease and waiter place that is over cleared.
    fn slots(&self) -> MutexGuard<'_, Slots> {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        slots.sweep(Instant::now());
        slots
    }

    /// Wakes on the next change of `name`'s lock. A name without a slot is free: the receiver
    /// of a closed channel wakes at once, and the attempt it leads to takes the lock.
    fn subscribe(&self, name: &str) -> watch::Receiver<()> {
        match self.slots().get(name) {
            Some(slot) => slot.changed.subscribe(),
            None => watch::Sender::new(()).subscribe(),
        }
    }

    fn try_once(self: &Arc<Self>, req: &AcquireRequest) -> Result<Attempt> {
        let mut slots = self.slots();
        let attempt = Self::try_slot(self, &mut slots, req);
        slots.settle(req.name.as_str());
        attempt
    }

    fn try_slot(self: &Arc<Self>, slots: &mut Slots, req: &AcquireRequest) -> Result<Attempt> {
        let now = Instant::now();
        let next_fence = slots.last_fence + 1;
        let slot = slots
            .map
            .entry(req.name.as_str().to_owned())
            .or_insert_with(Slot::new);
        slot.expire(now);
        slot.drop_stale_waiters(now);
        // Locks validates TTLs; a raw `Backend` caller may not have.
        let Some(expires_at) = now.checked_add(req.ttl) else {
            return Err(Error::invalid_argument("ttl", "overflows the clock"));
        };
        let waits = req.wait != crate::backend::Wait::No;
        if slot.holder.is_none() && slot.waiter_first(&req.token, req.fair, now) {
            if waits {
                slot.enqueue(&req.token, now);
            }
            return Ok(Attempt::Busy { free_in: None });
        }
        let lost_parent = match &mut slot.holder {
            None => {
                slot.queue.retain(|w| w.token != req.token);
                let lost = LossSignal::new();
                slot.holder = Some(Holder {
                    token: req.token.clone(),
                    fence: next_fence,
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
        let fence = slot.holder.as_ref().map_or(next_fence, |h| h.fence);
        slots.last_fence = slots.last_fence.max(fence);
        Ok(Attempt::Acquired(Arc::new(MemoryLease::new(
            self.clone(),
            req.name.as_str().to_owned(),
            req.token.clone(),
            LeaseCore::with_signal(FencingToken::new(fence), lost_parent.child(), now),
        ))))
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    fn info(&self) -> &BackendInfo {
        &INFO
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Arc<dyn Lease>>> {
        crate::ttl::check_store_ttl(req.ttl)?;
        let store = &self.store;
        // However this call ends (timeout, or the future dropped), leave the queue.
        let mut leave = LeaveQueue {
            store,
            req,
            armed: req.wait != crate::backend::Wait::No,
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
        let mut slots = self.store.slots();
        if let Some(slot) = slots.get_mut(self.req.name.as_str()) {
            slot.leave_queue(&self.req.token);
            slots.settle(self.req.name.as_str());
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
            info(name.as_str(), slot, now)
        }))
    }

    async fn list_page(&self, query: ListQuery<'_>) -> Result<ListPage> {
        let (prefix, cursor, limit) = (query.prefix, query.cursor, query.limit);
        let slots = self.store.slots();
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
            .filter_map(|name| info(name, slots.get(name)?, now))
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
        let broken = match slot.holder.take() {
            Some(holder) => {
                holder.lost.fire(LostReason::Broken);
                slot.changed.send_replace(());
                true
            }
            None => false,
        };
        slots.settle(name.as_str());
        Ok(broken)
    }
}

/// The slot's holder, if any, with the waiters whose place is still live.
fn info(name: &str, slot: &Slot, now: Instant) -> Option<LockInfo> {
    let holder = slot.holder.as_ref()?;
    let waiters = slot
        .queue
        .iter()
        .filter(|w| now - w.seen < WAITER_STALE)
        .count();
    Some(
        LockInfo::new(
            name.to_owned(),
            FencingToken::new(holder.fence),
            holder.owner.clone(),
            holder.acquired_at,
            Some(holder.expires_at.saturating_duration_since(now)),
            holder.holds,
        )
        .with_waiters(u32::try_from(waiters).unwrap_or(u32::MAX)),
    )
}

#[async_trait]
impl Lease for MemoryLease {
    fn core(&self) -> &LeaseCore {
        self.lease_core()
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        crate::ttl::check_store_ttl(ttl)?;
        let mut slots = self.store().slots();
        let now = Instant::now();
        let holder = slots
            .get_mut(self.name())
            .and_then(|slot| slot.owned_by(self.token(), self.fence().get(), now))
            .ok_or_else(|| Error::not_owned(self.name()))?;
        let extended = now
            .checked_add(ttl)
            .ok_or_else(|| Error::invalid_argument("ttl", "overflows the clock"))?;
        holder.expires_at = holder.expires_at.max(extended);
        Ok(())
    }

    async fn release(&self) -> Result<()> {
        let mut slots = self.store().slots();
        let now = Instant::now();
        let slot = slots
            .get_mut(self.name())
            .ok_or_else(|| Error::not_owned(self.name()))?;
        let holder = slot
            .owned_by(self.token(), self.fence().get(), now)
            .ok_or_else(|| Error::not_owned(self.name()))?;
        holder.holds -= 1;
        if holder.holds == 0 {
            slot.holder = None;
            slot.changed.send_replace(());
            slots.settle(self.name());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    /// How many distinct names the bounded-state test uses (the issue's figure).
    const NAMES: usize = 100_000;

    /// Takes `name`, which must be free.
    async fn take(locks: &crate::Locks, name: &str) -> crate::MutexGuard {
        let guard = locks.mutex(name).try_acquire().await.unwrap();
        guard.unwrap_or_else(|| panic!("{name} was busy"))
    }

    /// Per-name state is bounded: 100,000 names, each taken and released, or taken by a
    /// holder that vanished without releasing, or waited for by a fair waiter that vanished
    /// while queued (its future forgotten, so no clean-up ran), leave no slot once the leases
    /// and the waiters' places have ended. Tokio's clock is paused, so the leases end without
    /// the test sleeping in real time.
    #[tokio::test(start_paused = true)]
    async fn nothing_per_name_is_left_once_leases_and_waiters_end() {
        let backend = MemoryBackend::new();
        let (holders, waiters) = (
            crate::Locks::new(backend.clone()),
            crate::Locks::new(backend.clone()),
        );
        let ttl = Duration::from_secs(2);
        let done = futures::stream::iter(0..NAMES)
            .map(|i| {
                let (holders, waiters, store) =
                    (holders.clone(), waiters.clone(), backend.store.clone());
                async move {
                    let name = format!("bounded/{i}");
                    let guard = holders.mutex(&name).ttl(ttl).try_acquire().await.unwrap();
                    let guard = guard.unwrap_or_else(|| panic!("{name} was busy"));
                    match i % 3 {
                        0 => guard.release().await.unwrap(),
                        // The holder vanishes: its lease runs out.
                        1 => std::mem::forget(guard),
                        // A fair waiter queues behind the holder, then vanishes.
                        _ => {
                            let mut waiting = Box::pin(
                                waiters
                                    .mutex(&name)
                                    .fair()
                                    .wait(Duration::from_secs(60))
                                    .acquire(),
                            );
                            loop {
                                let polled =
                                    tokio::time::timeout(Duration::from_millis(1), &mut waiting)
                                        .await;
                                assert!(polled.is_err(), "{name}: the waiter got in");
                                let queued = store
                                    .slots()
                                    .get(&name)
                                    .is_some_and(|slot| !slot.queue.is_empty());
                                if queued {
                                    break;
                                }
                            }
                            std::mem::forget(waiting);
                            guard.release().await.unwrap();
                        }
                    }
                }
            })
            .buffer_unordered(64)
            .collect::<Vec<()>>()
            .await;
        assert_eq!(done.len(), NAMES);
        assert!(
            !backend.store.slots().is_empty(),
            "the workload left no state at all to clean up"
        );
        // Every lease and waiter place has ended; the next operation on the store, on any
        // name, cleans up.
        tokio::time::sleep(ttl + Duration::from_secs(5)).await;
        let guard = take(&holders, "another").await;
        guard.release().await.unwrap();
        let left = backend.store.slots().len();
        assert!(left <= 1, "{left} slots left for {NAMES} names");
        // Fences still rise per name across the forgotten slots.
        let again = take(&holders, "bounded/1").await;
        assert!(again.fence().get() > u64::try_from(NAMES).unwrap());
        again.release().await.unwrap();
    }
}
