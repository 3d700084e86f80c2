//! Inspecting, listing and breaking memory locks.

use async_trait::async_trait;
use tokio::time::Instant;

use super::MemoryBackend;
use super::store::{Slot, WAITER_STALE};
use crate::backend::{ListPage, ListQuery, LockInfo, MonitorStore};
use crate::error::Result;
use crate::fence::FencingToken;
use crate::lease::keeper::LostReason;
use crate::name::LockName;

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
