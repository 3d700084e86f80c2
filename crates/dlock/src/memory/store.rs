//! The store: every name's slot (holder and queue) under one mutex, swept of leases and
//! queue places that are over by every operation.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::LossSignal;
use crate::backend::wait::STARVATION_THRESHOLD;
use crate::lease::keeper::LostReason;
use crate::name::Owner;

#[derive(Debug, Default)]
pub(super) struct Store {
    pub(super) slots: Mutex<Slots>,
    /// Versioned values: name → (version, bytes).
    pub(super) values: Mutex<HashMap<String, (u64, Vec<u8>)>>,
}

/// A queued waiter whose attempts stopped for this long is gone (its future was forgotten, or
/// its task stalled): it no longer holds anyone back, and its place is removed. A waiting
/// acquire tries again at least once a second, which refreshes its place.
pub(super) const WAITER_STALE: Duration = Duration::from_secs(3);

/// Every name's state, and what keeps it bounded: a slot exists only while its lock is held
/// or waited for, and fences come from one counter for the store, so a name's next fence is
/// higher than its last even after its slot was dropped.
#[derive(Debug, Default)]
pub(super) struct Slots {
    pub(super) map: HashMap<String, Slot>,
    /// The last fence given out, by any name.
    pub(super) last_fence: u64,
    /// When to look at a slot again (its lease's end, its oldest waiter going stale), earliest
    /// first. An entry that no longer matches its slot's `check_at` was superseded.
    pub(super) checks: BinaryHeap<Reverse<(Instant, String)>>,
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
    pub(super) fn sweep(&mut self, now: Instant) {
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
    pub(super) fn settle(&mut self, name: &str) {
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
pub(super) struct Slot {
    pub(super) holder: Option<Holder>,
    /// Waiters by arrival: fair locks serve them in order, unfair ones once the head starves.
    pub(super) queue: VecDeque<Waiter>,
    pub(super) changed: watch::Sender<()>,
    /// The pending check of this slot in [`Slots::checks`], if any.
    pub(super) check_at: Option<Instant>,
}

#[derive(Debug)]
pub(super) struct Waiter {
    pub(super) token: String,
    /// Arrival: the queue's order.
    pub(super) since: Instant,
    /// The waiter's last attempt.
    pub(super) seen: Instant,
}

#[derive(Debug)]
pub(super) struct Holder {
    pub(super) token: String,
    pub(super) fence: u64,
    pub(super) holds: u32,
    pub(super) expires_at: Instant,
    pub(super) acquired_at: SystemTime,
    pub(super) owner: Owner,
    /// Parent of every lease's loss signal for this hold: fired on expiry or break.
    pub(super) lost: LossSignal,
}

impl Holder {
    pub(super) fn is_live(&self, now: Instant) -> bool {
        self.expires_at > now
    }
}

impl Slot {
    pub(super) fn new() -> Slot {
        Slot {
            holder: None,
            queue: VecDeque::new(),
            changed: watch::Sender::new(()),
            check_at: None,
        }
    }

    /// Clears an expired holder, firing its lost signal.
    pub(super) fn expire(&mut self, now: Instant) {
        if self.holder.as_ref().is_some_and(|h| !h.is_live(now))
            && let Some(holder) = self.holder.take()
        {
            holder.lost.fire(LostReason::Expired);
        }
    }

    /// Whether a queued waiter other than `token` comes first.
    pub(super) fn waiter_first(&self, token: &str, fair: bool, now: Instant) -> bool {
        self.queue
            .front()
            .is_some_and(|w| w.token != token && (fair || now - w.since >= STARVATION_THRESHOLD))
    }

    /// Queues `token`, or refreshes its place.
    pub(super) fn enqueue(&mut self, token: &str, now: Instant) {
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
    pub(super) fn drop_stale_waiters(&mut self, now: Instant) {
        let before = self.queue.len();
        self.queue.retain(|w| now - w.seen < WAITER_STALE);
        if self.queue.len() != before {
            self.changed.send_replace(());
        }
    }

    pub(super) fn leave_queue(&mut self, token: &str) {
        let before = self.queue.len();
        self.queue.retain(|w| w.token != token);
        if self.queue.len() != before {
            // Whoever queued behind may be next now.
            self.changed.send_replace(());
        }
    }

    pub(super) fn owned_by(
        &mut self,
        token: &str,
        fence: u64,
        now: Instant,
    ) -> Option<&mut Holder> {
        self.expire(now);
        self.holder
            .as_mut()
            .filter(|h| h.token == token && h.fence == fence)
    }
}

impl Store {
    /// The slots, with every lease and waiter place that is over cleared.
    pub(super) fn slots(&self) -> MutexGuard<'_, Slots> {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        slots.sweep(Instant::now());
        slots
    }

    /// Wakes on the next change of `name`'s lock. A name without a slot is free: the receiver
    /// of a closed channel wakes at once, and the attempt it leads to takes the lock.
    pub(super) fn subscribe(&self, name: &str) -> watch::Receiver<()> {
        match self.slots().get(name) {
            Some(slot) => slot.changed.subscribe(),
            None => watch::Sender::new(()).subscribe(),
        }
    }
}
