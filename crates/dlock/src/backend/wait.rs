//! Waiting for a held lock: the store's native wake-up first, jittered polling as the fallback.
//!
//! Backends call [`acquire_loop`] with two closures: one non-blocking attempt, and one that
//! subscribes to the store's "something changed" signal. The subscription is taken *before*
//! each attempt, so a release that lands between a failed attempt and the wait is never missed.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use rand::Rng;

use crate::backend::{Lease, Wait};
use crate::error::{Error, Result};

/// The result of one non-blocking acquisition attempt.
#[derive(Debug)]
#[non_exhaustive]
pub enum Attempt {
    /// The lock is ours.
    Acquired(Arc<dyn Lease>),
    /// Held elsewhere; `free_in` is the holder's remaining lease when the store knows it, so a
    /// waiter also wakes when the holder's TTL runs out.
    Busy {
        /// Time until the current lease expires, if known.
        free_in: Option<Duration>,
    },
}

/// Polling schedule for stores whose wake-up does not cover every case (for SQLite: other
/// processes). Delays double from `min` to `max`, each with ±50 % jitter so waiters spread out.
///
/// It is also the crate's one retry pause: `next` gives the next delay and doubles the one
/// after it, `reset` starts again at `min`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Backoff {
    /// First delay.
    pub min: Duration,
    /// Largest delay.
    pub max: Duration,
    /// The delay [`next`](Self::next) gives, before jitter.
    current: Duration,
    /// Whether delays are jittered: waiters of one lock spread out, while a task retrying its
    /// own connection has no crowd to spread and keeps its plain doubling.
    jitter: bool,
}

impl Backoff {
    /// A schedule from `min` to `max`.
    pub const fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max,
            current: min,
            jitter: true,
        }
    }

    /// The same schedule without jitter.
    pub(crate) const fn steady(min: Duration, max: Duration) -> Backoff {
        Backoff {
            jitter: false,
            ..Backoff::new(min, max)
        }
    }

    /// The next delay; the one after it is twice as long, up to `max`.
    pub(crate) fn next(&mut self) -> Duration {
        let delay = self.current;
        self.current = delay.saturating_mul(2).min(self.max);
        if self.jitter {
            Backoff::jittered(delay)
        } else {
            delay
        }
    }

    /// Starts the schedule again at `min` (the store answered, or a wake-up came).
    pub(crate) fn reset(&mut self) {
        self.current = self.min;
    }

    fn jittered(delay: Duration) -> Duration {
        let factor = rand::rng().random_range(0.5..1.5);
        delay.mul_f64(factor)
    }
}

/// The pause between retries of a call that waits: [`Retries::pause`] sleeps the backoff's
/// next delay, cut at the wait's deadline, or hands the error back when there is no time left.
#[derive(Debug)]
pub(crate) struct Retries {
    wait: Wait,
    backoff: Backoff,
    failures: u32,
}

impl Retries {
    pub(crate) fn new(wait: Wait, backoff: Backoff) -> Retries {
        Retries {
            wait,
            backoff,
            failures: 0,
        }
    }

    /// After a failed attempt: `Ok` once it slept before the next one, or the error back
    /// when it is not retryable, the wait is [`Wait::No`] or its deadline has passed (the
    /// store's error then says more than a plain timeout).
    pub(crate) async fn pause(&mut self, error: Error) -> Result<()> {
        if !error.is_retryable() || self.wait == Wait::No || self.wait.passed() {
            return Err(error);
        }
        self.failures = self.failures.saturating_add(1);
        tracing::debug!(%error, failures = self.failures, "attempt failed; retrying");
        self.wait.sleep_at_most(self.backoff.next()).await;
        Ok(())
    }

    /// The store answered: the next failure pauses from the start again.
    pub(crate) fn reset(&mut self) {
        self.failures = 0;
        self.backoff.reset();
    }
}

/// Runs `attempt` until it succeeds or fails for good: a retryable failure is retried after
/// `backoff`'s next pause while `wait` has time left (see [`Retries::pause`]).
#[cfg_attr(not(dlock_all_backends), allow(dead_code))]
pub(crate) async fn retry_until<T, F, Fut>(
    wait: Wait,
    backoff: Backoff,
    mut attempt: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut retries = Retries::new(wait, backoff);
    loop {
        match attempt().await {
            Ok(done) => return Ok(done),
            Err(error) => retries.pause(error).await?,
        }
    }
}

/// In the default (unfair) mode a newcomer may take a free lock ahead of queued waiters only
/// while the oldest of them has waited less than this: Go's `sync.Mutex` starvation mode, so a
/// holder that releases and re-acquires in a loop cannot starve the others. Fair locks never
/// let a newcomer pass a queued waiter. Backends with a waiter queue apply it.
pub const STARVATION_THRESHOLD: Duration = Duration::from_millis(5);

/// First and largest pause after a failed attempt (store unreachable or busy) while waiting.
const RETRY_MIN: Duration = Duration::from_millis(20);
const RETRY_MAX: Duration = Duration::from_secs(1);

/// Upper bound on one sleep when a store gives no other hint; long waits are cut into these
/// slices so a clock or lease change is noticed.
const IDLE_SLICE: Duration = Duration::from_secs(1);

/// Runs `attempt` until it acquires or the wait runs out. `subscribe` returns a future that
/// completes when the lock may have become free (a release by a waiter's neighbour, a pub/sub
/// message, a watch); `poll` is `Some` when that signal can miss releases and polling must
/// back it up.
///
/// # Errors
///
/// An attempt's error: at once if it is not retryable or `wait` is [`Wait::No`], otherwise
/// the last one when the deadline passes.
///
/// Returns `Ok(None)` when the wait ran out. While waiting, attempts that fail with a
/// retryable error ([`Error::is_retryable`](crate::Error::is_retryable)) are retried with
/// backoff until the deadline, and the last such error is returned if it is reached. Such an
/// attempt may have been granted with its reply lost: a retry takes that grant (the same
/// token), and when none is left (no wait, or past the deadline) the caller gives that grant
/// back by one repeated attempt (see the backend contract's unknown outcomes).
///
/// # Cancel safety
///
/// Cancel safe if `attempt` is: dropping the loop between attempts holds nothing.
pub async fn acquire_loop<A, AF, S, SF>(
    wait: Wait,
    poll: Option<Backoff>,
    mut attempt: A,
    mut subscribe: S,
) -> Result<Option<Arc<dyn Lease>>>
where
    A: FnMut() -> AF,
    AF: Future<Output = Result<Attempt>>,
    S: FnMut() -> SF,
    SF: Future<Output = ()>,
{
    let deadline = wait.deadline();
    let mut poll = poll.map(|mut p| {
        p.reset();
        p
    });
    let mut retries = Retries::new(wait, Backoff::new(RETRY_MIN, RETRY_MAX));
    loop {
        let woken = subscribe();
        let free_in = match attempt().await {
            Ok(Attempt::Acquired(lease)) => return Ok(Some(lease)),
            Ok(Attempt::Busy { free_in }) => {
                retries.reset();
                free_in
            }
            // A waiter rides out a store that is briefly unreachable or busy, until its
            // deadline; then it reports the store's error rather than a plain timeout.
            Err(error) => {
                retries.pause(error).await?;
                continue;
            }
        };
        let now = Instant::now();
        let remaining = match deadline {
            Some(at) if at <= now => return Ok(None),
            Some(at) => Some(at - now),
            None => None,
        };
        // Sleep no longer than: the poll delay, the holder's lease (+1 ms so it has expired),
        // the caller's deadline, and an idle slice.
        let mut sleep = IDLE_SLICE;
        if let Some(p) = &mut poll {
            // Doubles for the next round; a wake-up below starts it again.
            sleep = sleep.min(p.next());
        }
        if let Some(f) = free_in {
            sleep = sleep.min(f + Duration::from_millis(1));
        }
        if let Some(r) = remaining {
            sleep = sleep.min(r);
        }
        tokio::select! {
            () = woken => {
                if let Some(p) = &mut poll {
                    p.reset();
                }
            }
            () = tokio::time::sleep(sleep) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// An attempt that finds the lock held, counting the attempts in `calls`.
    async fn busy(calls: &AtomicU32) -> Result<Attempt> {
        calls.fetch_add(1, Ordering::SeqCst);
        Ok(Attempt::Busy { free_in: None })
    }

    #[tokio::test(start_paused = true)]
    async fn no_wait_tries_once() {
        let calls = AtomicU32::new(0);
        let got = acquire_loop(Wait::No, None, || busy(&calls), std::future::pending::<()>)
            .await
            .unwrap();
        assert!(got.is_none());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_rides_out_a_briefly_unavailable_store() {
        let calls = AtomicU32::new(0);
        let result = acquire_loop(
            Wait::Until(Instant::now() + Duration::from_secs(5)),
            None,
            || async {
                if calls.fetch_add(1, Ordering::SeqCst) < 3 {
                    Err(crate::Error::Unavailable {
                        backend: "scripted",
                        source: "down".into(),
                    })
                } else {
                    Ok(Attempt::Busy { free_in: None })
                }
            },
            std::future::pending::<()>,
        )
        .await;
        assert!(matches!(result, Ok(None)), "{result:?}");
        assert!(calls.load(Ordering::SeqCst) > 3);
        let gave_up = acquire_loop(
            Wait::Until(Instant::now() + Duration::from_secs(1)),
            None,
            || async {
                Err(crate::Error::Unavailable {
                    backend: "scripted",
                    source: "down".into(),
                })
            },
            std::future::pending::<()>,
        )
        .await;
        assert!(matches!(gave_up, Err(crate::Error::Unavailable { .. })));
        let once = acquire_loop(
            Wait::No,
            None,
            || async { Err(crate::Error::not_owned("x")) },
            std::future::pending::<()>,
        )
        .await;
        assert!(matches!(once, Err(crate::Error::NotOwned { .. })));
    }

    #[tokio::test(start_paused = true)]
    async fn polls_with_backoff_until_deadline() {
        let calls = AtomicU32::new(0);
        let start = Instant::now();
        let got = acquire_loop(
            Wait::Until(Instant::now() + Duration::from_secs(2)),
            Some(Backoff::new(
                Duration::from_millis(10),
                Duration::from_millis(200),
            )),
            || busy(&calls),
            std::future::pending::<()>,
        )
        .await
        .unwrap();
        assert!(got.is_none());
        let n = calls.load(Ordering::SeqCst);
        // Doubling from 10 ms to 200 ms over 2 s: far fewer attempts than fixed 10 ms polling.
        assert!(n > 5 && n < 60, "{n} attempts");
        assert!(start.elapsed() >= Duration::from_secs(2));
    }
}
