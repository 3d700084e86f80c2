//! What every hold has, whatever its store: its fence, its loss signal and when its lease began.

use std::sync::{Arc, OnceLock};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::fence::FencingToken;
use crate::lease::keeper::LostReason;

/// A hold's loss signal: cancelled when the hold is known lost, with the first reason given.
/// Clones share both; a [`child`](LossSignal::child) is cancelled with its parent and reads
/// the parent's reason.
///
/// # Examples
///
/// ```
/// use dlock::LostReason;
/// use dlock::backend::LossSignal;
///
/// let signal = LossSignal::new();
/// let child = signal.child();
/// signal.fire(LostReason::SessionEnded);
/// signal.fire(LostReason::Broken); // the first reason stays
/// assert!(child.token().is_cancelled());
/// assert_eq!(child.reason(), Some(LostReason::SessionEnded));
/// ```
#[derive(Clone, Debug, Default)]
pub struct LossSignal {
    token: CancellationToken,
    reason: Arc<OnceLock<LostReason>>,
}

impl LossSignal {
    /// A signal not fired yet.
    pub fn new() -> LossSignal {
        LossSignal::default()
    }

    /// Marks the hold lost for `reason` (kept only if no reason was given before).
    pub fn fire(&self, reason: LostReason) {
        let _ = self.reason.set(reason);
        self.token.cancel();
    }

    /// The token cancelled when the hold is lost (or ended by a release).
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// The reason the signal was fired with, if one was given.
    pub fn reason(&self) -> Option<LostReason> {
        self.reason.get().copied()
    }

    /// A signal cancelled with this one, and on its own too, that reads this one's reason.
    #[must_use]
    pub fn child(&self) -> LossSignal {
        LossSignal {
            token: self.token.child_token(),
            reason: self.reason.clone(),
        }
    }
}

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
    lost: LossSignal,
    start: Instant,
}

impl LeaseCore {
    /// A hold granted with `fence`, whose lease was asked for at `start` (the instant just
    /// before the request was sent), not yet lost.
    pub fn new(fence: FencingToken, start: Instant) -> LeaseCore {
        LeaseCore::with_signal(fence, LossSignal::new(), start)
    }

    /// Like [`new`](LeaseCore::new), with a loss signal made beforehand (a session watcher
    /// that already holds it, for example).
    pub fn with_signal(fence: FencingToken, lost: LossSignal, start: Instant) -> LeaseCore {
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
        self.lost.token()
    }

    /// The loss signal, to fire with a reason ([`LossSignal::fire`]).
    pub fn signal(&self) -> &LossSignal {
        &self.lost
    }

    /// The instant (tokio's clock) just before the request that set this lease's TTL was sent.
    pub fn lease_start(&self) -> Instant {
        self.start
    }
}
