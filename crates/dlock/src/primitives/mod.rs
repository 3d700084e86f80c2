//! The primitives composed from the store's exclusive locks, written once for every backend:
//! read-write locks, counting semaphores and multi-locks. Each inherits the store's lock
//! semantics (leases, fences, lost signals, native wake-ups) because each hold is made of
//! ordinary lock holds.

mod composed_name;
pub(crate) mod guard_set;
pub(crate) mod multi_lock;
mod options;
mod permit;
pub(crate) mod rwlock;
pub(crate) mod semaphore;
mod slots;

pub use composed_name::ComposedPart;
pub use multi_lock::{MAX_MULTI_LOCK_NAMES, MultiGuard, MultiLockBuilder};
pub use permit::Permit;
pub use rwlock::{DEFAULT_MAX_READERS, ReadGuard, RwLockBuilder, WriteGuard};
pub use semaphore::SemaphoreBuilder;
pub use slots::MAX_SLOTS;
