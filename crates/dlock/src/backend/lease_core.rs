//! What every hold has, whatever its store: its fence, its loss signal and when its lease began.

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::fence::FencingToken;

/// The part of a hold that every [`Lease`](super::Lease) shares. A lease keeps one and returns
/// it from [`Lease::core`](super::Lease::core); the trait's `fence`, `lost` and `lease_start`
/// read it, so no store writes those accessors again.
///
/// Cloning shares the loss signal: a wrapper lease that clones its inner lease's core (with
/// [`with_fence`](LeaseCore::with_fence) to change the fence) is told of the same loss.
///
/// # Examples
///
/// ```
/// use dlock::FencingToken;
/// use dlock::backend::LeaseCore;
///
/// let core = LeaseCore::new(FencingToken::new(7), tokio::time::Instant::now());
/// assert_eq!(core.fence().get(), 7);
/// assert!(!core.lost().is_cancelled());
/// let renamed = core.with_fence(FencingToken::new(8));
/// core.lost().cancel();
/// assert!(renamed.lost().is_cancelled());
/// ```
#[derive(Clone, Debug)]
pub struct LeaseCore {
    fence: FencingToken,
    lost: CancellationToken,
    start: Instant,
}

impl LeaseCore {
    /// A hold granted with `fence`, whose lease was asked for at `start` (the instant just
    /// before the request was sent), not yet lost.
    pub fn new(fence: FencingToken, start: Instant) -> LeaseCore {
        LeaseCore::with_lost(fence, CancellationToken::new(), start)
    }

    /// Like [`new`](LeaseCore::new), with a loss signal made beforehand (a session watcher
    /// that already holds it, for example).
    pub fn with_lost(fence: FencingToken, lost: CancellationToken, start: Instant) -> LeaseCore {
        LeaseCore { fence, lost, start }
    }

    /// The same hold under another fence, sharing the loss signal.
    #[must_use]
    pub fn with_fence(&self, fence: FencingToken) -> LeaseCore {
        LeaseCore {
            fence,
            ..self.clone()
        }
    }

    /// The fencing token of this hold.
    pub fn fence(&self) -> FencingToken {
        self.fence
    }

    /// Cancelled when the hold is known to be lost.
    pub fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    /// The instant (tokio's clock) just before the request that set this lease's TTL was sent.
    pub fn lease_start(&self) -> Instant {
        self.start
    }
}
