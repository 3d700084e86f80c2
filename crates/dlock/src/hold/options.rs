//! The options every builder shares ([`HoldOptions`]), and what they become once checked
//! against the client and its store ([`Terms`]): the keeper's policy, one deadline (an
//! instant) for every hold the call takes, and the requests sent for them.

use std::time::Duration;

use crate::backend::{AcquireRequest, LockKind, Wait};
use crate::error::{Error, Result};
use crate::lease::keeper::KeepPolicy;
use crate::locks::Locks;
use crate::name::{LockName, Owner};
use crate::ttl::{WaitSpec, validate_max_hold, validate_ttl};

/// The lease and wait options of a builder, as set; `reentrant` and `fair` only a mutex sets.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct HoldOptions {
    pub(crate) ttl: Option<Duration>,
    pub(crate) wait: Option<WaitSpec>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) reentrant: bool,
    pub(crate) fair: bool,
}

impl HoldOptions {
    /// Checks every option before any store is contacted, so bad input leaves no state
    /// behind, and fixes the deadline (`default_wait` when none was set).
    pub(crate) fn validate(&self, locks: &Locks, default_wait: WaitSpec) -> Result<Terms> {
        let caps = locks.info().capabilities;
        let backend = locks.info().name;
        if self.fair && !caps.fair {
            return Err(Error::Unsupported {
                operation: "fair locks",
                backend,
            });
        }
        if self.reentrant && !caps.reentrant {
            return Err(Error::Unsupported {
                operation: "reentrant locks",
                backend,
            });
        }
        let (ttl, renew) = match self.ttl {
            Some(ttl) => (validate_ttl("ttl", ttl)?, false),
            None => (locks.watchdog_lease(), true),
        };
        validate_max_hold(self.max_hold)?;
        let deadline = self.wait.unwrap_or(default_wait).to_wait()?;
        Ok(Terms {
            policy: KeepPolicy {
                ttl,
                renew,
                max_hold: self.max_hold,
            },
            deadline,
            fair: self.fair,
            reentrant: self.reentrant,
            collecting: false,
            owner: locks.owner().clone(),
        })
    }

    /// The wait the caller asked for, for the timeout error.
    pub(crate) fn waited(&self, default_wait: WaitSpec) -> Duration {
        self.wait.unwrap_or(default_wait).duration()
    }
}

/// Validated [`HoldOptions`]: what every hold of one acquire call is asked with.
#[derive(Clone, Debug)]
pub(crate) struct Terms {
    /// How the keeper looks after each lease.
    pub(crate) policy: KeepPolicy,
    /// Until when the call may wait, shared by every hold it takes.
    pub(crate) deadline: Wait,
    /// FIFO waiting, for the mutex that asked for it.
    pub(crate) fair: bool,
    /// The guard may re-enter the hold ([`MutexGuard::reenter`](crate::MutexGuard::reenter)).
    pub(crate) reentrant: bool,
    /// Parts of a composed hold with a fixed TTL, kept renewed until the hold is whole
    /// ([`Terms::collecting`]).
    collecting: bool,
    owner: Owner,
}

impl Terms {
    /// These terms for the parts of a composed hold (a read-write lock's gate and places, a
    /// semaphore's gate and slots, a multi-lock's locks). A part with a fixed TTL is renewed
    /// by the keeper while the call still waits for the other parts, so a part taken early
    /// cannot run out (and be taken by someone else) before the hold is whole;
    /// `guard_set::settle` then gives it its whole TTL from there and stops renewing it. The
    /// store requests are unchanged: each part still asks for the fixed TTL.
    pub(crate) fn collecting(&self) -> Terms {
        Terms {
            collecting: !self.policy.renew,
            ..self.clone()
        }
    }

    /// The fixed TTL the parts taken on these terms settle to, when they are renewed only
    /// while collected.
    pub(crate) fn settled_ttl(&self) -> Option<Duration> {
        self.collecting.then_some(self.policy.ttl)
    }

    /// How the keeper looks after a hold taken on these terms.
    pub(crate) fn kept_policy(&self) -> KeepPolicy {
        KeepPolicy {
            renew: self.policy.renew || self.collecting,
            ..self.policy
        }
    }

    /// The request for one hold of `kind` on `name`, waiting until `deadline` (the call's, or
    /// an earlier one), with a token of its own. A deadline already passed is one try, as
    /// when no wait was asked for.
    pub(crate) fn request(&self, name: LockName, kind: LockKind, deadline: Wait) -> AcquireRequest {
        let wait = if deadline.passed() {
            Wait::No
        } else {
            deadline
        };
        // Unique per acquisition, reentrant or not: only the guard re-enters (with this token).
        let token = super::token::fresh();
        let mut request =
            AcquireRequest::new(name, token, self.owner.clone(), self.policy.ttl, wait);
        request.kind = kind;
        request.fair = self.fair;
        request.watchdog = self.policy.renew && self.policy.max_hold.is_none();
        // The first hold is a plain grant (a retry of it must not count a second hold); only
        // re-entries through the guard ask the store to count one more.
        request.reentrant = false;
        request
    }
}
