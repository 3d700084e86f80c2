//! One attempt at a memory lock, and leaving the queue when a waiting call gives up.

use std::sync::Arc;
use std::time::SystemTime;

use tokio::time::Instant;

use super::MemoryLease;
use super::store::{Holder, Slot, Slots, Store};
use crate::backend::wait::Attempt;
use crate::backend::{AcquireRequest, LeaseCore, LossSignal};
use crate::error::{Error, Result};
use crate::fence::FencingToken;

impl Store {
    /// Takes `req`'s waiter out of the queue: its acquire call gave up. Whoever queued behind
    /// it may be next now.
    pub(super) fn leave_queue(&self, req: &AcquireRequest) {
        let mut slots = self.slots();
        if let Some(slot) = slots.get_mut(req.name.as_str()) {
            slot.leave_queue(&req.token);
            slots.settle(req.name.as_str());
        }
    }

    pub(super) fn try_once(self: &Arc<Self>, req: &AcquireRequest) -> Result<Attempt> {
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
