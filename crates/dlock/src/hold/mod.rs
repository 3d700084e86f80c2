//! What every kind of hold shares: the public [`Hold`] trait every guard implements, and the
//! one engine every hold is acquired through (`options.rs`: the validated options of every
//! builder; `acquire.rs`: the observed store call).

pub(crate) mod acquire;
mod metric_labels;
pub(crate) mod options;
mod run;
pub(crate) mod token;

pub use run::run_while_held;

use std::time::Duration;

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::fence::FencingToken;
use crate::lease::Lost;
use crate::lease::keeper::LostReason;

/// What every guard can do, whatever it holds: a mutex ([`MutexGuard`](crate::MutexGuard)), a
/// read or write hold ([`ReadGuard`](crate::ReadGuard), [`WriteGuard`](crate::WriteGuard)), a
/// semaphore permit ([`Permit`](crate::Permit)) or a multi-lock
/// ([`MultiGuard`](crate::MultiGuard)); for code that takes any of them, or keeps several
/// kinds in one collection (`Box<dyn Hold>` is a `Hold` too).
///
/// Each guard also has these methods of its own (they are what method-call syntax finds);
/// the trait's `extend`, `is_owned` and `release` return boxed futures so that it stays
/// usable as `dyn Hold`. Sealed: only dlock's guards implement it.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// use dlock::Hold;
/// let locks = dlock::connect("memory://hold-doc").await?;
/// let holds: Vec<Box<dyn Hold>> = vec![
///     Box::new(locks.mutex("jobs/1").acquire().await?),
///     Box::new(locks.semaphore("workers", 4).acquire().await?),
///     Box::new(locks.rwlock("config").read().await?),
/// ];
/// for hold in &holds {
///     assert!(!hold.is_lost());
///     assert_eq!(hold.lost_reason(), None);
///     assert!(Hold::is_owned(hold).await?);
/// }
/// for hold in holds {
///     Hold::release(hold).await?;
/// }
/// # Ok(()) }
/// ```
pub trait Hold: sealed::Sealed + std::fmt::Debug + Send + Sync + std::any::Any {
    /// The hold's fencing token; for a multi-lock, the largest of its locks' fences.
    fn fence(&self) -> FencingToken;

    /// Completes when the hold is lost (for a hold made of several store locks, any of
    /// them), or at once if it already was.
    fn lost(&self) -> Lost<'_>;

    /// An owned token cancelled when the hold is lost. Cancelling it yourself does not affect
    /// the hold.
    fn lost_token(&self) -> CancellationToken;

    /// Whether the hold is known to be lost (no store call).
    fn is_lost(&self) -> bool;

    /// Why the hold was lost, once it is; `None` while it is held. See [`LostReason`].
    fn lost_reason(&self) -> Option<LostReason>;

    /// Makes the lease last at least `ttl` from now, if the hold is still this guard's; see
    /// [`MutexGuard::extend`](crate::MutexGuard::extend).
    ///
    /// # Errors
    ///
    /// As [`MutexGuard::extend`](crate::MutexGuard::extend).
    fn extend(&self, ttl: Duration) -> BoxFuture<'_, Result<()>>;

    /// Asks the store whether the hold is still this guard's; see
    /// [`MutexGuard::is_owned`](crate::MutexGuard::is_owned).
    ///
    /// # Errors
    ///
    /// Store errors (the answer is then unknown).
    fn is_owned(&self) -> BoxFuture<'_, Result<bool>>;

    /// Releases the hold; see [`MutexGuard::release`](crate::MutexGuard::release).
    ///
    /// # Errors
    ///
    /// As [`MutexGuard::release`](crate::MutexGuard::release).
    fn release(self) -> BoxFuture<'static, Result<()>>
    where
        Self: Sized;
}

pub(crate) mod sealed {
    use futures::future::BoxFuture;

    use crate::error::Result;

    /// Keeps [`Hold`](super::Hold) to dlock's guards, and releases one behind a `Box<dyn Hold>`
    /// (`Hold::release` takes `self`, which a trait object cannot give up).
    pub trait Sealed {
        fn release_boxed(self: Box<Self>) -> BoxFuture<'static, Result<()>>;

        /// The one lease a fenced write is checked against, for the holds that are one
        /// exclusive lease (a mutex, a leadership); `None` for shared and composed holds.
        fn fencing(&self) -> Option<Fencing<'_>>;
    }

    /// A hold's one exclusive lease, as [`Sealed::fencing`] hands it out (unnameable outside
    /// the crate, like the trait).
    #[derive(Debug)]
    pub struct Fencing<'a>(pub(crate) &'a crate::lease::HeldLease);
}

/// `Hold` for a guard type whose own methods have the trait's names; `fence` is the
/// expression giving the hold's fence from `$guard`.
macro_rules! hold_impl {
    ($guard:ty, |$this:ident| $fence:expr) => {
        hold_impl!(
            $guard,
            |$this| $fence,
            fencing | _held | None::<&crate::lease::HeldLease>
        );
    };
    ($guard:ty, |$this:ident| $fence:expr, fencing |$held:ident| $fencing:expr) => {
        impl crate::hold::sealed::Sealed for $guard {
            fn release_boxed(
                self: Box<Self>,
            ) -> futures::future::BoxFuture<'static, crate::error::Result<()>> {
                Box::pin(<$guard>::release(*self))
            }

            fn fencing(&self) -> Option<crate::hold::sealed::Fencing<'_>> {
                let $held = self;
                $fencing.map(crate::hold::sealed::Fencing)
            }
        }

        impl crate::hold::Hold for $guard {
            fn fence(&self) -> crate::fence::FencingToken {
                let $this = self;
                $fence
            }
            fn lost(&self) -> crate::lease::Lost<'_> {
                <$guard>::lost(self)
            }
            fn lost_token(&self) -> tokio_util::sync::CancellationToken {
                <$guard>::lost_token(self)
            }
            fn is_lost(&self) -> bool {
                <$guard>::is_lost(self)
            }
            fn lost_reason(&self) -> Option<crate::lease::keeper::LostReason> {
                <$guard>::lost_reason(self)
            }
            fn extend(
                &self,
                ttl: std::time::Duration,
            ) -> futures::future::BoxFuture<'_, crate::error::Result<()>> {
                Box::pin(<$guard>::extend(self, ttl))
            }
            fn is_owned(&self) -> futures::future::BoxFuture<'_, crate::error::Result<bool>> {
                Box::pin(<$guard>::is_owned(self))
            }
            fn release(self) -> futures::future::BoxFuture<'static, crate::error::Result<()>> {
                Box::pin(<$guard>::release(self))
            }
        }
    };
}

hold_impl!(
    crate::MutexGuard,
    |guard| guard.fence(),
    fencing | guard | Some(guard.held())
);
hold_impl!(crate::Permit, |permit| permit.fence());
hold_impl!(crate::ReadGuard, |guard| guard.fence());
hold_impl!(crate::WriteGuard, |guard| guard.fence());
hold_impl!(
    crate::Leadership,
    |leading| leading.term(),
    fencing | leading | Some(leading.held())
);
hold_impl!(crate::MultiGuard, |guard| guard
    .fences()
    .map(|(_, fence)| fence)
    .max()
    .unwrap_or(crate::fence::FencingToken::new(0)));

impl sealed::Sealed for Box<dyn Hold> {
    fn release_boxed(self: Box<Self>) -> BoxFuture<'static, Result<()>> {
        (*self).release()
    }

    fn fencing(&self) -> Option<sealed::Fencing<'_>> {
        (**self).fencing()
    }
}

impl Hold for Box<dyn Hold> {
    fn fence(&self) -> FencingToken {
        (**self).fence()
    }
    fn lost(&self) -> Lost<'_> {
        (**self).lost()
    }
    fn lost_token(&self) -> CancellationToken {
        (**self).lost_token()
    }
    fn is_lost(&self) -> bool {
        (**self).is_lost()
    }
    fn lost_reason(&self) -> Option<LostReason> {
        (**self).lost_reason()
    }
    fn extend(&self, ttl: Duration) -> BoxFuture<'_, Result<()>> {
        (**self).extend(ttl)
    }
    fn is_owned(&self) -> BoxFuture<'_, Result<bool>> {
        (**self).is_owned()
    }
    fn release(self) -> BoxFuture<'static, Result<()>> {
        <dyn Hold as sealed::Sealed>::release_boxed(self)
    }
}
