//! Leases of released fixed-TTL holds, kept for the next fixed-TTL hold of the same length:
//! reusing one costs a keep-alive (served by the leader, no Raft write) instead of a
//! `LeaseGrant` now and a `LeaseRevoke` at release (two Raft writes of the four a pair cost).
//!
//! Safe because a lease goes here only once its key is deleted (the release's delete answered
//! yes), so nothing rides on it; and a reused lease is kept alive before its key is put, so it
//! lasts its whole length from the new hold's start, as a fresh grant would. A spare nobody
//! takes expires in etcd by itself.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// At most this many spare leases per client.
const KEPT: usize = 16;

/// A released lease: its id, its granted length in seconds, and an instant before it was last
/// granted or kept alive (etcd keeps it at least `secs` from then).
#[derive(Clone, Copy, Debug)]
struct Spare {
    id: i64,
    secs: i64,
    since: Instant,
}

/// The client's spare leases.
#[derive(Debug, Default)]
pub(super) struct SpareLeases {
    spares: Mutex<Vec<Spare>>,
}

impl SpareLeases {
    /// Keeps the lease `id` of `secs`, alive since `since`, whose key is deleted; `false` when
    /// there is no room (the caller revokes it).
    pub(super) fn put(&self, id: i64, secs: i64, since: Instant) -> bool {
        let mut spares = self.spares.lock().unwrap_or_else(PoisonError::into_inner);
        if spares.len() >= KEPT {
            return false;
        }
        spares.push(Spare { id, secs, since });
        true
    }

    /// A spare lease of `secs` that etcd still keeps for `margin` at least (time for the
    /// keep-alive that restarts it); the ones too close to their end are dropped.
    pub(super) fn take(&self, secs: i64, margin: Duration) -> Option<i64> {
        let now = Instant::now();
        let mut spares = self.spares.lock().unwrap_or_else(PoisonError::into_inner);
        spares.retain(|s| s.since + length(s.secs) > now + margin);
        let at = spares.iter().rposition(|s| s.secs == secs)?;
        Some(spares.swap_remove(at).id)
    }
}

fn length(secs: i64) -> Duration {
    Duration::from_secs(u64::try_from(secs).unwrap_or(0))
}
