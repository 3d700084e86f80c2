//! [`Election::observe`]: the leader's changes, read from the store at a bounded interval.
//! Inspection has no change feed common to every store, so this asks the store (one inspect
//! and one value read) every interval: a change is seen within it, and since every read is
//! fresh, a leader that lost is never reported after the read that found it gone.

use std::time::Duration;

use futures::stream::{self, BoxStream, StreamExt};

use super::{Election, Leader};
use crate::error::{Error, Result};

/// The stream returned by [`Election::observe`]: the current leader first (`None` when
/// nobody leads), then an item each time the leader, its term or its value changes. A store
/// error is an item too and the stream goes on (the next read may succeed); a request the
/// store cannot serve ([`Error::Unsupported`]) or a bad name ends it after its error.
///
/// Every item comes from a fresh read of the store, so the stream never reports a leader
/// that had already lost when it was read, and sees each change within one
/// [`observe_interval`](Election::observe_interval) (a third of the watchdog lease, at most
/// a second, by default). A term that begins and ends between two reads is not reported.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// use futures::StreamExt;
/// let locks = dlock::connect("memory://stream-observe-doc").await?;
/// let election = locks.election("ingest");
/// let _leading = election.campaign(b"a").await?;
/// let changes: dlock::election::LeaderStream = election.observe();
/// let first: Vec<_> = changes.take(1).collect().await;
/// assert_eq!(first[0].as_ref().unwrap().as_ref().unwrap().value, b"a");
/// # Ok(()) }
/// ```
pub type LeaderStream = BoxStream<'static, Result<Option<Leader>>>;

/// The shortest pause between two reads, so a leader whose lease shows no time left is not
/// read in a busy loop.
const MIN_PAUSE: Duration = Duration::from_millis(10);

struct State {
    election: Election,
    every: Duration,
    /// What the last item said: term and value, or `None`; `None` before the first item.
    last: Option<Option<(crate::FencingToken, Vec<u8>)>>,
    /// The time the last leader read had left: its term may end sooner than the interval.
    left: Option<Duration>,
    /// Whether an item was given: every read after the first waits its pause.
    started: bool,
    done: bool,
}

pub(super) fn observe(election: Election) -> LeaderStream {
    let every = election.observe_every().max(MIN_PAUSE);
    let start = State {
        election,
        every,
        last: None,
        left: None,
        started: false,
        done: false,
    };
    stream::unfold(start, |mut state| async move {
        if state.done {
            return None;
        }
        loop {
            if state.started {
                let pause = state.left.map_or(state.every, |left| left.min(state.every));
                tokio::time::sleep(pause.max(MIN_PAUSE)).await;
            }
            match state.election.leader().await {
                Ok(now) => {
                    state.left = now.as_ref().and_then(|leader| leader.ttl_left);
                    let seen = now.as_ref().map(|l| (l.term, l.value.clone()));
                    if state.last.as_ref() != Some(&seen) {
                        state.last = Some(seen);
                        state.started = true;
                        return Some((Ok(now), state));
                    }
                }
                Err(error) => {
                    state.done =
                        matches!(error, Error::Unsupported { .. } | Error::InvalidName { .. });
                    state.started = true;
                    return Some((Err(error), state));
                }
            }
        }
    })
    .boxed()
}
