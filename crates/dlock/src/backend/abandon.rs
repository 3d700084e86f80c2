//! The one clean-up after an acquire call that ends without its hold (timed out, failed, or its
//! future dropped mid-flight): [`Abandon`] runs its undo when dropped unless the call disarmed
//! it, and [`spawn_cleanup`] puts store calls that undo in a task of their own, since `Drop`
//! cannot await.

use std::future::Future;
use std::ops::{Deref, DerefMut};

/// What an acquire call has left in the store (`T`: a queue place, leases, a grant on its
/// way), and `undo`, which gives it back if the call ends without handing the hold over.
/// Dropping it undoes; [`disarm`](Self::disarm) and [`into_inner`](Self::into_inner) do not.
pub(crate) struct Abandon<T, F: FnOnce(T)> {
    left: Option<(T, F)>,
}

impl<G: FnOnce()> Abandon<G, fn(G)> {
    /// Nothing to keep but the undo itself, which reads at drop what there is to give back.
    pub(crate) fn on_drop(undo: G) -> Self {
        Abandon::new(undo, |undo| undo())
    }
}

impl<T, F: FnOnce(T)> Abandon<T, F> {
    pub(crate) fn new(left: T, undo: F) -> Self {
        Abandon {
            left: Some((left, undo)),
        }
    }

    /// The call got its hold, or gave back what it left itself: nothing to undo.
    pub(crate) fn disarm(self) {
        let _ = self.into_inner();
    }

    /// Hands what the call left over to whoever keeps it now, without undoing it.
    pub(crate) fn into_inner(mut self) -> T {
        let (left, _) = self.take();
        left
    }

    /// Undoes now rather than at the end of the scope.
    pub(crate) fn undo_now(mut self) {
        let (left, undo) = self.take();
        undo(left);
    }

    fn take(&mut self) -> (T, F) {
        match self.left.take() {
            Some(left) => left,
            // `left` is only emptied by a method that consumes `self`, or by `drop`.
            None => unreachable!("an abandon guard is used after it was disarmed"),
        }
    }

    fn left(&self) -> &(T, F) {
        match &self.left {
            Some(left) => left,
            None => unreachable!("an abandon guard is used after it was disarmed"),
        }
    }
}

impl<T, F: FnOnce(T)> Deref for Abandon<T, F> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.left().0
    }
}

impl<T, F: FnOnce(T)> DerefMut for Abandon<T, F> {
    fn deref_mut(&mut self) -> &mut T {
        match &mut self.left {
            Some((left, _)) => left,
            None => unreachable!("an abandon guard is used after it was disarmed"),
        }
    }
}

impl<T, F: FnOnce(T)> Drop for Abandon<T, F> {
    fn drop(&mut self) {
        if let Some((left, undo)) = self.left.take() {
            undo(left);
        }
    }
}

/// Runs the clean-up `make` builds in a task of its own on the current runtime. Without one
/// (the runtime is shutting down) nothing runs and `make` is not called: what it would give
/// back (a lease, a queue place, an ephemeral node) expires on its own.
#[cfg_attr(not(dlock_all_backends), allow(dead_code))]
pub(crate) fn spawn_cleanup<Fut>(make: impl FnOnce() -> Fut)
where
    Fut: Future<Output = ()> + Send + 'static,
{
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(make());
    }
}
