//! [`Permit`]: what a semaphore acquisition holds, one permit or several taken at once.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::fence::FencingToken;
use crate::lease::Lost;
use crate::lease::keeper::LostReason;
use crate::mutex::MutexGuard;
use crate::name::LockName;
use crate::primitives::guard_set::{GuardSet, hold_methods};

/// Held permits of a semaphore; made by [`SemaphoreBuilder`](crate::SemaphoreBuilder): one by
/// default, or [`count`](crate::SemaphoreBuilder::count) of them taken at once. Dropping it
/// returns them in the background.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::connect("memory://permit-doc").await?;
/// let permit = locks.semaphore("uploads", 4).acquire().await?;
/// tokio::select! {
///     () = permit.lost() => { /* the lease is gone: stop */ }
///     () = async { /* work */ } => {}
/// }
/// permit.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[clippy::has_significant_drop]
#[must_use = "if unused the permit will immediately be returned"]
pub struct Permit {
    held: Held,
}

/// One permit's hold, or the holds of several taken together (lost together: the set's signal
/// fires when any of them is lost).
#[derive(Debug)]
enum Held {
    One(MutexGuard),
    Several(GuardSet),
}

impl Permit {
    pub(crate) fn one(guard: MutexGuard) -> Permit {
        Permit {
            held: Held::One(guard),
        }
    }

    pub(crate) fn several(guards: Vec<MutexGuard>) -> Permit {
        match <[MutexGuard; 1]>::try_from(guards) {
            Ok([guard]) => Permit::one(guard),
            Err(guards) => Permit {
                held: Held::Several(GuardSet::new(guards)),
            },
        }
    }

    /// What this permit holds in the store: the slot lock `<name>#p<i>of<permits>`, or the
    /// semaphore's own name where the store has native semaphores. For several permits, the
    /// first one's; see [`slots`](Self::slots).
    pub fn slot(&self) -> &LockName {
        match &self.held {
            Held::One(guard) => guard.name(),
            Held::Several(set) => set.guards()[0].name(),
        }
    }

    /// What each permit held holds in the store, with its fence, in the order they were
    /// taken.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://permit-slots-doc").await?;
    /// let two = locks.semaphore("uploads", 4).count(2).acquire().await?;
    /// assert_eq!(two.slots().len(), 2);
    /// assert_eq!(two.slots().iter().map(|(_, fence)| *fence).max(), Some(two.fence()));
    /// # Ok(()) }
    /// ```
    pub fn slots(&self) -> Vec<(&LockName, FencingToken)> {
        match &self.held {
            Held::One(guard) => vec![(guard.name(), guard.fence())],
            Held::Several(set) => set.fences().collect(),
        }
    }

    /// How many permits this holds.
    pub fn count(&self) -> u32 {
        match &self.held {
            Held::One(_) => 1,
            Held::Several(set) => u32::try_from(set.guards().len()).unwrap_or(u32::MAX),
        }
    }

    /// This hold's fence: greater than every earlier permit's of the semaphore (native
    /// semaphores) or of the same slot (composed ones); for several permits, the largest of
    /// theirs.
    pub fn fence(&self) -> FencingToken {
        match &self.held {
            Held::One(guard) => guard.fence(),
            Held::Several(set) => set
                .fences()
                .map(|(_, fence)| fence)
                .max()
                .unwrap_or(FencingToken::new(0)),
        }
    }

    hold_methods!(held);
}

/// The methods [`hold_methods`] delegates to, for either form.
impl Held {
    fn lost(&self) -> Lost<'_> {
        match self {
            Held::One(guard) => guard.lost(),
            Held::Several(set) => set.lost(),
        }
    }

    fn lost_token(&self) -> CancellationToken {
        match self {
            Held::One(guard) => guard.lost_token(),
            Held::Several(set) => set.lost_token(),
        }
    }

    fn is_lost(&self) -> bool {
        match self {
            Held::One(guard) => guard.is_lost(),
            Held::Several(set) => set.is_lost(),
        }
    }

    fn lost_reason(&self) -> Option<LostReason> {
        match self {
            Held::One(guard) => guard.lost_reason(),
            Held::Several(set) => set.lost_reason(),
        }
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        match self {
            Held::One(guard) => guard.extend(ttl).await,
            Held::Several(set) => set.extend(ttl).await,
        }
    }

    async fn is_owned(&self) -> Result<bool> {
        match self {
            Held::One(guard) => guard.is_owned().await,
            Held::Several(set) => set.is_owned().await,
        }
    }

    async fn release(self) -> Result<()> {
        match self {
            Held::One(guard) => guard.release().await,
            Held::Several(set) => set.release().await,
        }
    }
}
