//! [`run_while_held`]: a task that lives only as long as a hold, the `select!` on the lost
//! signal every holder would otherwise write by hand.

use std::future::Future;

use crate::error::{Error, Result};
use crate::hold::Hold;
use crate::lease::keeper::LostReason;

/// Runs `task` while `hold` lasts: its output when it finishes first, or
/// [`Error::Lost`] with the [`LostReason`] as soon as the hold is lost, the task then dropped
/// (cancelled at its current `.await`) before this returns. Works for every guard: a mutex, a
/// read or write hold, a permit, a multi-lock, leadership, `Box<dyn Hold>`.
///
/// The task is polled on the caller's task, so it may borrow. Losing is checked first at
/// every wake-up: a task that completes at the same instant as a loss reports the loss, and a
/// hold already lost never starts the task. A resource written by the task should still get
/// the hold's [`fence`](Hold::fence): the lost signal comes within one lease of a loss, not
/// at the instant of it.
///
/// # Errors
///
/// [`Error::Lost`] when the hold is lost before the task completes.
///
/// # Cancel safety
///
/// Dropping the returned future drops the task; the hold is untouched.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// use std::time::Duration;
/// let locks = dlock::connect("memory://run-while-held-doc").await?;
/// let guard = locks.mutex("reports").acquire().await?;
/// assert_eq!(dlock::run_while_held(&guard, async { 40 + 2 }).await?, 42);
///
/// locks.force_release("reports").await?; // lost: the task is dropped
/// let endless = std::future::pending::<()>();
/// match dlock::run_while_held(&guard, endless).await {
///     Err(dlock::Error::Lost { reason }) => assert_eq!(reason, dlock::LostReason::Broken),
///     other => panic!("{other:?}"),
/// }
/// # Ok(()) }
/// ```
pub async fn run_while_held<H, F>(hold: &H, task: F) -> Result<F::Output>
where
    H: Hold + ?Sized,
    F: Future,
{
    tokio::select! {
        biased;
        () = hold.lost() => Err(Error::Lost {
            // The signal is fired with its reason set first; a hold given up by its own guard
            // (a release) has none, and counts as the store's word.
            reason: hold.lost_reason().unwrap_or(LostReason::StoreSignal),
        }),
        output = task => Ok(output),
    }
}
