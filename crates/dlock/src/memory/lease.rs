//! A memory hold's renewals and release.

use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::MemoryLease;
use crate::backend::{Lease, LeaseCore};
use crate::error::{Error, Result};
use crate::name::LockName;

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

    async fn put_fenced(&self, value: &LockName, bytes: &[u8]) -> Result<Option<u64>> {
        // The slots' lock is held across the write: no grant, expiry or break can come
        // between the check and the write.
        let mut slots = self.store().slots();
        let current = slots
            .get_mut(self.name())
            .and_then(|slot| slot.owned_by(self.token(), self.fence().get(), Instant::now()))
            .is_some();
        if !current {
            return Ok(None);
        }
        Ok(Some(super::values::write(self.store(), value, bytes)))
    }
}
