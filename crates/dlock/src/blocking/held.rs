//! What every blocking guard shares: an async guard run on the client's runtime, released
//! synchronously when dropped.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Runtime;
use crate::error::{Error, Result};
use crate::hold::Hold;
use crate::lease::keeper::LostReason;

/// An async guard and the runtime that keeps it; dropping it releases the hold and returns
/// once the store has answered (in the background only when dropped inside async code, which
/// must not block).
#[derive(Debug)]
pub(crate) struct Held<G: Hold> {
    inner: Option<G>,
    pub(crate) rt: Arc<Runtime>,
}

impl<G: Hold> Held<G> {
    pub(crate) fn new(guard: G, rt: Arc<Runtime>) -> Held<G> {
        Held {
            inner: Some(guard),
            rt,
        }
    }

    pub(crate) fn get(&self) -> &G {
        // Only `release` and `Drop` take the guard out, and both consume the holder.
        match &self.inner {
            Some(guard) => guard,
            None => unreachable!("guard used after release"),
        }
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.get().is_lost()
    }

    pub(crate) fn lost_token(&self) -> CancellationToken {
        self.get().lost_token()
    }

    pub(crate) fn lost_reason(&self) -> Option<crate::LostReason> {
        self.get().lost_reason()
    }

    /// The blocking [`run_while_held`](crate::run_while_held): a closure cannot be stopped
    /// from outside, so it is given a token cancelled at the loss and must stop when it
    /// sees it; its output counts only if the hold lasted until it returned.
    pub(crate) fn run_while_held<T>(
        &self,
        task: impl FnOnce(&CancellationToken) -> T,
    ) -> Result<T> {
        let lost = self.lost_token();
        let lost_error = || Error::Lost {
            // As the async function: a hold given up by its own guard has no reason.
            reason: self.lost_reason().unwrap_or(LostReason::StoreSignal),
        };
        if lost.is_cancelled() {
            return Err(lost_error());
        }
        // A child: the task cancelling its token does not touch the hold's.
        let output = task(&lost.child_token());
        if lost.is_cancelled() {
            return Err(lost_error());
        }
        Ok(output)
    }

    pub(crate) fn wait_lost(&self, timeout: Duration) -> Result<bool> {
        let token = self.lost_token();
        self.rt.block_on(async {
            tokio::time::timeout(timeout, token.cancelled())
                .await
                .is_ok()
        })
    }

    pub(crate) fn extend(&self, ttl: Duration) -> Result<()> {
        self.rt.block_on(self.get().extend(ttl))?
    }

    pub(crate) fn is_owned(&self) -> Result<bool> {
        self.rt.block_on(self.get().is_owned())?
    }

    pub(crate) fn release(mut self) -> Result<()> {
        match self.inner.take() {
            Some(guard) => self.rt.block_on(guard.release())?,
            None => Ok(()),
        }
    }
}

impl<G: Hold> Drop for Held<G> {
    fn drop(&mut self) {
        let Some(guard) = self.inner.take() else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            // Inside async code we must not block: the async guard releases in the background.
            drop(guard);
            return;
        }
        match self.rt.handle() {
            Some(handle) => {
                if let Err(error) = super::as_blocking_caller(|| handle.block_on(guard.release())) {
                    tracing::debug!(%error, "release on drop failed");
                }
            }
            None => drop(guard),
        }
    }
}

/// The lost-signal, extend, ownership and release methods of a blocking guard whose `held`
/// field is a [`Held`]; `$what` names the hold in the docs.
macro_rules! blocking_hold_methods {
    ($what:literal) => {
        #[doc = concat!("Whether the ", $what, " is known to be lost (no store call).")]
        pub fn is_lost(&self) -> bool {
            self.held.is_lost()
        }

        #[doc = concat!("A token cancelled when the ", $what, " is lost; poll `is_cancelled()` \
            from your own loop. Cancelling it yourself does not affect the hold.")]
        pub fn lost_token(&self) -> crate::CancellationToken {
            self.held.lost_token()
        }

        #[doc = concat!("Why the ", $what, " was lost, once it is; `None` while it is held. \
            See [`crate::MutexGuard::lost_reason`].")]
        pub fn lost_reason(&self) -> Option<crate::LostReason> {
            self.held.lost_reason()
        }

        #[doc = concat!("Runs `task` on this thread while the ", $what, " lasts: the blocking \
            twin of [`crate::run_while_held`]. A closure cannot be stopped from outside, so \
            `task` gets a token that is cancelled when the ", $what, " is lost, and must return \
            when it sees it (check `is_cancelled()` between steps). The output counts only if \
            the ", $what, " lasted until `task` returned; a ", $what, " already lost never \
            starts it. Cancelling the token given does not affect the hold.")]
        ///
        /// # Errors
        ///
        /// [`Error::Lost`](crate::Error::Lost) with its [`LostReason`](crate::LostReason)
        /// when the hold was lost before `task` returned (its output is dropped).
        ///
        /// # Examples
        ///
        /// ```
        /// use std::time::{Duration, Instant};
        /// let locks = dlock::blocking::Locks::connect("memory://blocking-run-while-held-doc")?;
        /// let guard = locks.mutex("reports").acquire()?;
        /// assert_eq!(guard.run_while_held(|_lost| 40 + 2)?, 42);
        ///
        /// let outcome = guard.run_while_held(|lost| {
        ///     locks.force_release("reports")?; // the hold is lost mid-task…
        ///     let deadline = Instant::now() + Duration::from_secs(10);
        ///     while !lost.is_cancelled() && Instant::now() < deadline {
        ///         std::thread::sleep(Duration::from_millis(5)); // …and the task stops
        ///     }
        ///     Ok::<_, dlock::Error>("never reported")
        /// });
        /// assert!(matches!(
        ///     outcome,
        ///     Err(dlock::Error::Lost { reason: dlock::LostReason::Broken })
        /// ));
        /// # Ok::<(), dlock::Error>(())
        /// ```
        pub fn run_while_held<T>(
            &self,
            task: impl FnOnce(&crate::CancellationToken) -> T,
        ) -> crate::Result<T> {
            self.held.run_while_held(task)
        }

        #[doc = concat!("Blocks until the ", $what, " is lost or `timeout` passes; returns \
            whether it was lost.")]
        ///
        /// # Errors
        ///
        /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when called inside an
        /// async runtime.
        pub fn wait_lost(&self, timeout: std::time::Duration) -> crate::Result<bool> {
            self.held.wait_lost(timeout)
        }

        #[doc = concat!("Makes the ", $what, "'s lease last at least `ttl` from now, if it is \
            still this guard's; see [`crate::MutexGuard::extend`].")]
        ///
        /// # Errors
        ///
        /// As [`crate::MutexGuard::extend`].
        pub fn extend(&self, ttl: std::time::Duration) -> crate::Result<()> {
            self.held.extend(ttl)
        }

        #[doc = concat!("Asks the store whether the ", $what, " is still this guard's; it \
            changes nothing (`false` also fires the lost signal). See \
            [`crate::MutexGuard::is_owned`].")]
        ///
        /// # Errors
        ///
        /// Store errors (the answer is then unknown); [`Error::InvalidArgument`](crate::Error::InvalidArgument)
        /// when called inside an async runtime.
        pub fn is_owned(&self) -> crate::Result<bool> {
            self.held.is_owned()
        }

        #[doc = concat!("Releases the ", $what, " and returns once the store has answered.")]
        ///
        /// # Errors
        ///
        /// As [`crate::MutexGuard::release`].
        pub fn release(self) -> crate::Result<()> {
            self.held.release()
        }
    };
}
pub(crate) use blocking_hold_methods;

/// A blocking guard that a fenced write can be made with
/// ([`VersionedValue::set_fenced`](super::VersionedValue::set_fenced)): a
/// [`MutexGuard`](super::MutexGuard) or a [`Leadership`](super::Leadership). Sealed.
///
/// # Examples
///
/// ```
/// # fn main() -> dlock::Result<()> {
/// use dlock::blocking::FencedHold;
/// fn record(value: &dlock::blocking::VersionedValue, hold: &impl FencedHold) -> dlock::Result<u64> {
///     value.set_fenced(hold, b"done")
/// }
/// let locks = dlock::blocking::Locks::connect("memory://fenced-hold-doc")?;
/// let guard = locks.mutex("jobs/1").acquire()?;
/// record(&locks.value("jobs/1/state"), &guard)?;
/// # Ok(()) }
/// ```
pub trait FencedHold: fenced::Sealed {}

pub(crate) mod fenced {
    /// Keeps [`FencedHold`](super::FencedHold) to the blocking guards of one exclusive lease.
    pub trait Sealed {
        /// The async guard the write is checked against.
        fn async_hold(&self) -> &dyn crate::Hold;
    }
}

impl<T: fenced::Sealed> FencedHold for T {}

impl fenced::Sealed for super::MutexGuard {
    fn async_hold(&self) -> &dyn crate::Hold {
        self.held.get()
    }
}
