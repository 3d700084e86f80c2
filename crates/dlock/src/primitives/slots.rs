//! Slots: a fixed set of exclusive locks of which a holder takes any free one. The permits of a
//! semaphore and the reader places of a read-write lock are slots.
//!
//! Taking a slot scans the slots once without waiting, starting at a random one so that
//! concurrent takers spread out. A taker that finds them all busy waits on the primitive's
//! gate lock first (FIFO where the store has fair locks), so only one taker at a time waits for
//! a slot: it waits natively on one slot at a time and rescans the others every
//! [`RESCAN_MAX`] at the latest.

use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

use crate::backend::Wait;
use crate::error::Result;
use crate::hold::acquire;
use crate::hold::options::Terms;
use crate::locks::Locks;
use crate::mutex::MutexGuard;
use crate::name::LockName;

/// The longest a gate holder waits on one slot before it rescans the others.
pub(crate) const RESCAN_MAX: Duration = Duration::from_millis(100);

/// The first wait on one slot; doubled up to [`RESCAN_MAX`] while all stay busy.
const RESCAN_MIN: Duration = Duration::from_millis(2);

/// The most slots a primitive may have (each is a lock in the store).
pub const MAX_SLOTS: u32 = 1024;

/// Tries every slot once, from a random start; the first free one is taken.
pub(crate) async fn try_any(
    locks: &Locks,
    terms: &Terms,
    slots: &[LockName],
) -> Result<Option<MutexGuard>> {
    let start = rand::rng().random_range(0..slots.len());
    for offset in 0..slots.len() {
        let slot = &slots[(start + offset) % slots.len()];
        if let Some(guard) = acquire::exclusive(locks, terms, slot, Wait::No).await? {
            return Ok(Some(guard));
        }
    }
    Ok(None)
}

/// Waits for any slot until `deadline`; the caller holds the gate, so it is the only waiter.
pub(crate) async fn wait_any(
    locks: &Locks,
    terms: &Terms,
    slots: &[LockName],
    deadline: Wait,
) -> Result<Option<MutexGuard>> {
    let mut pause = RESCAN_MIN;
    let mut next = rand::rng().random_range(0..slots.len());
    loop {
        if let Some(guard) = try_any(locks, terms, slots).await? {
            return Ok(Some(guard));
        }
        if deadline.passed() {
            return Ok(None);
        }
        let until = deadline.cap(Instant::now() + pause);
        if let Some(guard) = acquire::exclusive(locks, terms, &slots[next], until).await? {
            return Ok(Some(guard));
        }
        next = (next + 1) % slots.len();
        pause = (pause * 2).min(RESCAN_MAX);
    }
}
